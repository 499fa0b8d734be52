"""Federated feature scaling: per-site statistics -> one global transform, applied at the sites.

``scale = "standard"`` equals scikit-learn's ``StandardScaler`` fitted on the pooled data
(population variance; a feature that is constant up to rounding gets factor 1), and
``scale = "minmax"`` equals ``MinMaxScaler`` (range [0, 1]; a zero range gets factor 1).
Both are written as one transform ``(X - shift) / factor`` per feature.

The statistics round (task ``stats``): every site sends, for each feature, aggregates over
all its rows and never a row: its mean m, sum (x - m) and sum (x - m)^2 (``standard``) or
its minimum and maximum (``minmax``); the row count travels as the reply's
``num_examples``. The server merges them about a common reference (the parallel-variance
idea of Chan, Golub and LeVeque), which has none of the cancellation of
sum x^2 - (sum x)^2 / n when the data sit far from 0.

Every later task carries the transform (exact JSON: Python writes a float64 as its
shortest round-tripping repr); a site applies it once and keeps the scaled rows for the rest
of the run (:func:`scaled_rows`).
"""

from __future__ import annotations

import json
import weakref
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from fedcluster.common import kernels

SCALES = ("none", "standard", "minmax")
# Scaled copies kept per process (in-process harness: one per simulated site).
_CACHE_SIZE = 32


@dataclass(frozen=True)
class FeatureTransform:
    """``(X - shift) / factor`` per feature, after filling missing cells: the global
    transform of a run.

    Attributes
    ----------
    kind : str
        ``"standard"``, ``"minmax"``, or ``"none"`` (shift 0, factor 1: imputation only).
    shift, factor : np.ndarray
        float64 (d,); ``factor`` > 0.
    fill : np.ndarray or None
        float64 (d,): the value of a missing (NaN) cell of each feature, the pooled mean
        or median (``imputation.py``); NaN for a feature that is not imputed.
    """

    kind: str
    shift: np.ndarray
    factor: np.ndarray
    fill: np.ndarray | None = None

    @classmethod
    def fill_only(cls, fill: np.ndarray) -> "FeatureTransform":
        """Imputation without scaling (``scale = "none"``, or before the ``stats`` round)."""
        fill = np.asarray(fill, dtype=np.float64)
        return cls("none", np.zeros(fill.size), np.ones(fill.size), fill)

    def with_fill(self, fill: np.ndarray | None) -> "FeatureTransform":
        return FeatureTransform(self.kind, self.shift, self.factor, fill)

    @property
    def n_features(self) -> int:
        return int(self.shift.shape[0])

    def apply(self, X: np.ndarray) -> np.ndarray:
        """Raw rows -> the scaled space where the clustering happens (a missing cell
        filled first; one the transform does not fill stays NaN)."""
        X = np.asarray(X, dtype=np.float64)
        if self.fill is not None:
            missing = np.isnan(X)
            if missing.any():
                X = np.where(missing, self.fill, X)
        if self.kind == "none":
            return X
        return (X - self.shift) / self.factor

    def inverse(self, Z: np.ndarray) -> np.ndarray:
        """Scaled points (e.g. centroids) -> original units."""
        return np.asarray(Z, dtype=np.float64) * self.factor + self.shift

    def to_dict(self) -> dict:
        out = {"kind": self.kind, "shift": self.shift.tolist(), "factor": self.factor.tolist()}
        if self.fill is not None:  # JSON has no NaN: a feature not imputed is null
            out["fill"] = [None if np.isnan(v) else float(v) for v in self.fill]
        return out

    @classmethod
    def from_dict(cls, data: dict) -> "FeatureTransform":
        """Rebuild and check a transform (from model.json or a task parameter).

        Raises
        ------
        ValueError
            If the kind is unknown, the vectors differ in length, or a factor is not a
            finite positive number.
        """
        kind = data.get("kind")
        if kind not in ("standard", "minmax", "none"):
            raise ValueError(f"unknown scaling kind {kind!r}")
        shift = np.asarray(data.get("shift"), dtype=np.float64)
        factor = np.asarray(data.get("factor"), dtype=np.float64)
        if shift.ndim != 1 or shift.shape != factor.shape or shift.size == 0:
            raise ValueError(f"scaling shift {shift.shape} and factor {factor.shape} do not match")
        if not (np.all(np.isfinite(shift)) and np.all(np.isfinite(factor)) and np.all(factor > 0)):
            raise ValueError("scaling shift and factor must be finite, factor > 0")
        fill = data.get("fill")
        if fill is not None:
            fill = np.asarray([np.nan if v is None else v for v in fill], dtype=np.float64)
            if fill.shape != shift.shape or np.isinf(fill).any():
                raise ValueError(f"imputation fill {fill.shape} does not match the "
                                 f"{shift.size} features, or is not finite")
        return cls(kind, shift, factor, fill)

    def encode(self) -> str:
        """Exact text form (task parameter); :meth:`decode` gives back the same bits."""
        return json.dumps(self.to_dict(), separators=(",", ":"))

    @classmethod
    def decode(cls, text: str) -> "FeatureTransform":
        try:
            data = json.loads(text)
        except (TypeError, ValueError):
            raise ValueError("the scaling transform is not valid JSON") from None
        if not isinstance(data, dict):
            raise ValueError("the scaling transform is not a JSON object")
        return cls.from_dict(data)


# ---------------------------------------------------------------- site side

def site_moments(X: np.ndarray, weights: np.ndarray | None = None,
                 within: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-feature (mean, deviation, M2) of a site's rows, in two chunked passes.

    ``mean`` is the computed (rounded) mean m; ``deviation`` = sum (x - m), which is 0 in
    exact arithmetic and carries m's rounding error; ``M2`` = sum (x - m)^2. Sent as is,
    they let the server pool exactly (:func:`combine_moments`) even when the features sit
    far from 0 with a small spread, where rounding m alone would cost digits.

    With ``weights`` and ``within``, row i of ``X`` is the mean of a group of
    ``weights[i]`` rows and ``within`` the groups' squared deviations from their own
    means, summed per feature: the same three figures of those rows, exactly (the
    parallel-axis identity: sum (x - m)^2 = within + sum_i w_i (x_i - m)^2).
    """
    n = X.shape[0] if weights is None else float(np.sum(weights))
    w = None if weights is None else np.asarray(weights, dtype=np.float64)
    total = np.zeros(X.shape[1])
    for start in range(0, X.shape[0], kernels.CHUNK_ROWS):
        block = X[start:start + kernels.CHUNK_ROWS]
        total += block.sum(axis=0) if w is None else (block * w[start:start + kernels.CHUNK_ROWS, None]).sum(axis=0)
    mean = total / n
    deviation = np.zeros(X.shape[1])
    m2 = np.zeros(X.shape[1]) if within is None else np.array(within, dtype=np.float64)
    for start in range(0, X.shape[0], kernels.CHUNK_ROWS):
        centred = X[start:start + kernels.CHUNK_ROWS] - mean
        if w is None:
            deviation += centred.sum(axis=0)
            m2 += np.einsum("ij,ij->j", centred, centred)
        else:
            weighted = centred * w[start:start + kernels.CHUNK_ROWS, None]
            deviation += weighted.sum(axis=0)
            m2 += np.einsum("ij,ij->j", weighted, centred)
    return mean, deviation, m2


def site_range(X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-feature minimum and maximum of a site's rows."""
    return np.min(X, axis=0).astype(np.float64), np.max(X, axis=0).astype(np.float64)


_SCALED: OrderedDict[tuple, tuple[weakref.ref, np.ndarray]] = OrderedDict()


def scaled_rows(X: np.ndarray, source: str, text: str) -> np.ndarray:
    """``X`` under the transform encoded in ``text``, computed once per (data, transform).

    The cache hits only for the very same array object (held by a weak reference), so a
    reloaded or edited site never gets stale rows, and an entry goes when its array does.
    (A deployment starts a new process per round, which then scales once per round: one
    vectorised pass, less than any task.)

    Raises
    ------
    ValueError
        If ``text`` is not a valid transform or does not fit ``X``'s width.
    """
    for stale in [key for key, (ref, _) in _SCALED.items() if ref() is None]:
        del _SCALED[stale]
    key = (source, X.shape, text)
    hit = _SCALED.get(key)
    if hit is not None and hit[0]() is X:
        _SCALED.move_to_end(key)
        return hit[1]
    transform = FeatureTransform.decode(text)
    if transform.n_features != X.shape[1]:
        raise ValueError(f"the scaling transform has {transform.n_features} features, "
                         f"the site's data {X.shape[1]}")
    scaled = np.ascontiguousarray(transform.apply(X))
    scaled.setflags(write=False)
    _SCALED[key] = (weakref.ref(X), scaled)
    while len(_SCALED) > _CACHE_SIZE:
        _SCALED.popitem(last=False)
    return scaled


# ---------------------------------------------------------------- server side

def combine_moments(counts, means, deviations, m2s) -> tuple[int, np.ndarray, np.ndarray]:
    """Pooled (n, mean, var) from the sites' (n_s, m_s, D_s, M2_s) of :func:`site_moments`.

    About a common reference r (the count-weighted mean of the m_s):
    sum (x - r)^2 = sum_s M2_s + 2 (m_s - r) D_s + n_s (m_s - r)^2 and
    sum (x - r) = sum_s D_s + n_s (m_s - r); m_s - r is exact for nearby floats, so no
    digits are lost to a large offset. Then, as scikit-learn's two-pass variance:
    var = (sum (x - r)^2 - (sum (x - r))^2 / n) / n and mean = r + sum (x - r) / n.
    """
    counts = np.asarray(counts, dtype=np.float64)
    means = np.asarray(means, dtype=np.float64)
    deviations = np.asarray(deviations, dtype=np.float64)
    m2s = np.asarray(m2s, dtype=np.float64)
    if counts.size == 0:
        raise ValueError("no site statistics to combine")
    n = counts.sum()
    reference = (counts[:, None] * means).sum(axis=0) / n
    offset = means - reference
    squares = (m2s + 2 * offset * deviations + counts[:, None] * offset**2).sum(axis=0)
    linear = (deviations + counts[:, None] * offset).sum(axis=0)
    var = np.maximum(squares - linear**2 / n, 0.0) / n
    return int(n), reference + linear / n, var


def constant_features(n: int, mean: np.ndarray, var: np.ndarray) -> np.ndarray:
    """Which features of ``n`` rows (their ``mean`` and population ``var``) are constant up
    to the rounding error of the two-pass variance: the test of
    ``sklearn.preprocessing._data._is_constant_feature``. A constant column's computed
    variance is rounding noise, not 0 (about 1e-33 mean^2 on a z-scored pixel)."""
    eps = np.finfo(np.float64).eps
    return var <= n * eps * var + (n * mean * eps) ** 2


def standard_transform(counts, means, deviations, m2s) -> FeatureTransform:
    """``StandardScaler`` on the pooled data: shift = mean, factor = population std, 1 for a
    feature whose variance is within the rounding error of the two-pass algorithm
    (:func:`constant_features`)."""
    n, mean, var = combine_moments(counts, means, deviations, m2s)
    return FeatureTransform("standard", mean,
                            np.where(constant_features(n, mean, var), 1.0, np.sqrt(var)))


def minmax_transform(minima, maxima) -> FeatureTransform:
    """``MinMaxScaler`` to [0, 1] on the pooled data: shift = min, factor = max - min
    (1 for a range below 10 eps, as scikit-learn does)."""
    low = np.min(np.asarray(minima, dtype=np.float64), axis=0)
    high = np.max(np.asarray(maxima, dtype=np.float64), axis=0)
    spread = high - low
    return FeatureTransform("minmax", low, np.where(spread < 10 * np.finfo(np.float64).eps, 1.0, spread))

"""The checked wrappers of the fuzzy c-means kernels (Bezdek memberships, fuzzifier m),
as those of :mod:`fedcluster.common.kernels`: argument checks, the block size, serial or
parallel, NumPy below ``small_work``'s size."""

from __future__ import annotations

import numpy as np

from fedcluster.common import kernels
from fedcluster.common.kernels import small_work


def fcm_stats(X, C, m: float, weights=None, spread=0.0):
    """Sufficient statistics of one fuzzy c-means step (Bezdek memberships, fuzzifier m).

    Returns ``(sums, weights, hard_counts)``: sum_i u_ij^m x_i (k, d), W_j = sum_i
    u_ij^m (k,), and the sizes of the hard assignment (argmax membership, ties to the
    lowest index), which the privacy floor is applied to. A row that coincides with a
    centre has membership 1 there and 0 elsewhere. Deterministic for any thread count.
    With ``weights``, row i is the mean of a group of ``weights[i]`` rows, each given
    the group's memberships: it counts that many times. ``spread`` is added to every
    squared distance before the memberships: a group's rows lie on average that much
    farther (squared) from every centre than its mean does (E||x - c||^2 = ||mean - c||^2
    + the group's spread per row), so their memberships are softer than the mean's: one
    number for every row (a site's mean spread per row standing in for each group's own,
    0: rows) or one per row (each group's own).
    """
    X = kernels._check_X(X)
    C = kernels._check_centres(C, X)
    if not m > 1.0:
        raise ValueError(f"the fuzzifier m must be > 1, got {m}")
    w, _ = kernels._group_weights(X, weights, None)
    spread = _spreads(spread, X.shape[0])
    if small_work.small(X, C.shape[0]):
        return small_work.fcm_stats(X, C, float(m), w, spread)
    return kernels._blocked("_fcm_stats_impl", X, w, C, float(m), spread)


def fcm_memberships(X, C, m: float, spread: float = 0.0) -> np.ndarray:
    """Bezdek memberships (n, k) of every row (rows sum to 1; a row on a centre has 1
    there), ``spread`` added to every squared distance (as in :func:`fcm_stats`)."""
    X = kernels._check_X(X)
    C = kernels._check_centres(C, X)
    if not m > 1.0:
        raise ValueError(f"the fuzzifier m must be > 1, got {m}")
    spread = _spread(spread)
    if small_work.small(X, C.shape[0]):
        return small_work.fcm_memberships(X, C, float(m), spread)
    return kernels._blocked("_fcm_memberships_impl", X, C, float(m), spread)


def _spread(spread) -> float:
    spread = float(spread)
    if not (spread >= 0.0 and np.isfinite(spread)):
        raise ValueError(f"spread must be a finite number >= 0, got {spread}")
    return spread


def _spreads(spread, n: int) -> np.ndarray:
    """A spread per row, (n,) float64: one number for all, or one each, finite, >= 0."""
    if np.ndim(spread) == 0:
        return np.full(n, _spread(spread))
    out = np.ascontiguousarray(spread, dtype=np.float64)
    if out.shape != (n,) or not (np.all(np.isfinite(out)) and np.all(out >= 0.0)):
        raise ValueError(f"spread must be a finite number >= 0 or {n} of them, got shape {out.shape}")
    return out


def fcm_objective(X, C, m: float, weights=None, spread=0.0) -> float:
    """J_m of centres ``C`` at their optimal (Bezdek) memberships: sum_i w_i
    (sum_j d_ij^(-1/(m-1)))^-(m-1), d_ij = ||x_i - c_j||^2 + ``spread`` (as in
    :func:`fcm_stats`; a row on a centre adds 0). NumPy in chunks of
    ``kernels.CHUNK_ROWS`` rows, about the centres' mean (no cancellation far from 0)."""
    X = kernels._check_X(X)
    C = kernels._check_centres(C, X).astype(np.float64)
    w, _ = kernels._group_weights(X, weights, None)
    spread = _spreads(spread, X.shape[0])
    cbar = C.mean(axis=0)
    Cc = C - cbar
    c_sq = (Cc ** 2).sum(axis=1)
    total = 0.0
    for start in range(0, X.shape[0], kernels.CHUNK_ROWS):
        block = X[start:start + kernels.CHUNK_ROWS].astype(np.float64) - cbar
        D = np.maximum((block ** 2).sum(axis=1)[:, None] - 2.0 * block @ Cc.T + c_sq, 0.0) \
            + spread[start:start + kernels.CHUNK_ROWS, None]
        with np.errstate(divide="ignore", over="ignore"):  # a row on a centre: d = 0
            inv = D ** (-1.0 / (m - 1.0))
            per_row = np.where(np.isinf(inv).any(axis=1), 0.0, inv.sum(axis=1) ** -(m - 1.0))
        total += float((w[start:start + kernels.CHUNK_ROWS] * per_row).sum())
    return total

"""Differential privacy: clipping bounds, the Gaussian mechanism and its accounting.

Pure functions only (no Flower, no I/O); the site tasks that use them are in
``client_app/private_tasks.py``, the server's bookkeeping in ``strategies/base.py``.

Unit of privacy and neighbouring relation
-----------------------------------------
One ROW of one site's data, under *replace-one* (bounded) neighbouring: two data sets
are neighbours when they have the same number of rows and differ in one row. The
number of rows of a site is public in fedcluster (it is declared in the ``describe``
round and checked in every reply), which is why the bounded relation is the right one:
under add/remove the row count itself would have to be noised.

Sensitivity of one k-means step (sums and counts)
-------------------------------------------------
Rows are clipped at the site to the box ``[lo, hi]`` (``data-bounds``) and centred on
the box's centre ``m``; D = ||hi - lo||_2 is the box's L2 diameter, so
||x - m|| <= D / 2 for every clipped row. The site releases, per cluster j, the centred
sum S_j = sum_{x in j} (x - m) and the count n_j. Replacing row x (cluster a) by x'
(cluster b):

- a == b: S_a changes by x' - x, norm <= D; the counts do not change;
- a != b: S_a loses x - m and S_b gains x' - m (squared norm <= D^2/4 + D^2/4); n_a and
  n_b change by 1 each.

Releasing the vector (S, gamma * n) with gamma = D / 2 makes the a != b case
D^2/2 + 2 gamma^2 = D^2, the same as a == b: the joint L2 sensitivity is exactly D, and
the counts' noise costs nothing extra. One Gaussian mechanism of scale sigma on that
vector gives the sums noise sigma and the counts noise sigma / gamma = 2 sigma / D.

Accounting: zero-concentrated DP
--------------------------------
The Gaussian mechanism with L2 sensitivity Delta and noise sigma is rho-zCDP with
rho = Delta^2 / (2 sigma^2) (Bun & Steinke 2016, Prop. 1.6); zCDP composes by adding
rho (Lemma 1.7), and rho-zCDP implies (rho + 2 sqrt(rho ln(1/delta)), delta)-DP for
every delta > 0 (Prop. 1.3). The run's budget (``dp-epsilon``, ``dp-delta``) is
converted to a total rho by inverting that bound, and split EQUALLY over every round
that touches data; each round's sigma follows from its share. This holds for any
epsilon (the classic sigma = Delta sqrt(2 ln(1.25/delta)) / epsilon of Dwork & Roth,
Thm. A.1, is only valid for epsilon < 1 and composes badly).

References
----------
M. Bun, T. Steinke. Concentrated differential privacy: simplifications, extensions, and
lower bounds. TCC 2016 (arXiv:1605.02065).
C. Dwork, A. Roth. The algorithmic foundations of differential privacy. 2014.
P. Kairouz, Z. Liu, T. Steinke. The distributed discrete Gaussian mechanism for
federated learning with secure aggregation. ICML 2021 (distributed DP).
"""

from __future__ import annotations

import math

import numpy as np

from fedcluster.common import protocol


class PrivacyLeakWarning(UserWarning):
    """Single values of the data are disclosed (per-feature minima and maxima, each one
    person's value), outside the differential-privacy guarantee under DP (diffprivlib's
    warning of the same name: bounds computed from the data)."""


# ----------------------------------------------------------------------- bounds
def parse_data_bounds(text: str) -> tuple[np.ndarray, np.ndarray] | None:
    """Parse ``data-bounds``: ``""`` (none), ``"LO:HI"`` (every feature) or
    ``"LO:HI,LO:HI,..."`` (one range per feature, in column order).

    Returns
    -------
    (lo, hi) : 1-D float arrays of length 1 (every feature) or d, lo < hi; None for "".

    Raises
    ------
    ValueError
        When the text is not of that form or a range is empty (LO >= HI) or not finite.
    """
    text = str(text).strip()
    if text == "":
        return None
    lows, highs = [], []
    for part in text.split(","):
        lo_text, sep, hi_text = part.strip().partition(":")
        try:
            lo, hi = float(lo_text), float(hi_text)
        except ValueError:
            sep = ""
        if not sep:
            raise ValueError(f"{part.strip()!r} is not of the form 'LO:HI' with numbers, e.g. '0:16'")
        if not (math.isfinite(lo) and math.isfinite(hi)) or lo >= hi:
            raise ValueError(f"{part.strip()!r} needs finite LO < HI")
        lows.append(lo)
        highs.append(hi)
    return np.array(lows), np.array(highs)


def encode_bounds(lo: np.ndarray, hi: np.ndarray) -> str:
    """The ``data-bounds`` text of a box (exact: ``repr`` of the floats)."""
    return ",".join(f"{float(a)!r}:{float(b)!r}" for a, b in zip(lo, hi))


def bounds_for(bounds: tuple[np.ndarray, np.ndarray], n_features: int) -> tuple[np.ndarray, np.ndarray]:
    """The box for ``n_features`` columns: one range broadcast, or a per-feature list
    that must have exactly ``n_features`` entries (ValueError otherwise)."""
    lo, hi = (np.asarray(b, dtype=np.float64) for b in bounds)
    if lo.shape[0] == 1:
        return np.full(n_features, lo[0]), np.full(n_features, hi[0])
    if lo.shape[0] != n_features:
        raise ValueError(f"gives {lo.shape[0]} ranges but the data has {n_features} features")
    return lo, hi


def box_within(lo: np.ndarray, hi: np.ndarray, bound: float) -> bool:
    """Whether the box lies within [-bound, bound] in every feature. Under distributed
    DP it must: the secure sums' agreed scales come from ``secagg-data-bound``, and a
    site clips (rather than refuses) a term past its scale, which would bias the sum
    silently if the noiseless terms could reach past it."""
    return max(float(np.max(np.abs(lo))), float(np.max(np.abs(hi)))) <= bound


def clip_rows(X: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Each value clipped into its feature's range (a new float64 array)."""
    return np.clip(np.asarray(X, dtype=np.float64), lo, hi)


def l2_diameter(lo: np.ndarray, hi: np.ndarray) -> float:
    """||hi - lo||_2: the largest distance between two points of the box."""
    return float(np.linalg.norm(np.asarray(hi, dtype=np.float64) - np.asarray(lo, dtype=np.float64)))


# ------------------------------------------------------------------ accounting
def rho_from_epsilon(epsilon: float, delta: float) -> float:
    """The largest rho whose zCDP-to-DP bound rho + 2 sqrt(rho ln(1/delta)) equals
    ``epsilon`` (Bun & Steinke 2016, Prop. 1.3, inverted):
    rho = (sqrt(ln(1/delta) + epsilon) - sqrt(ln(1/delta)))^2."""
    if not epsilon > 0 or not 0 < delta < 1:
        raise ValueError(f"need epsilon > 0 and 0 < delta < 1, got {epsilon}, {delta}")
    log_term = math.log(1.0 / delta)
    return (math.sqrt(log_term + epsilon) - math.sqrt(log_term)) ** 2


def epsilon_from_rho(rho: float, delta: float) -> float:
    """(epsilon, delta)-DP implied by rho-zCDP: epsilon = rho + 2 sqrt(rho ln(1/delta))."""
    if rho < 0 or not 0 < delta < 1:
        raise ValueError(f"need rho >= 0 and 0 < delta < 1, got {rho}, {delta}")
    return rho + 2.0 * math.sqrt(rho * math.log(1.0 / delta))


def gaussian_sigma(sensitivity: float, rho: float) -> float:
    """The noise of the Gaussian mechanism that is ``rho``-zCDP for this L2
    ``sensitivity``: sigma = Delta / sqrt(2 rho)."""
    if not rho > 0 or not sensitivity > 0:
        raise ValueError(f"need sensitivity > 0 and rho > 0, got {sensitivity}, {rho}")
    return sensitivity / math.sqrt(2.0 * rho)


def gaussian_rho(sensitivity: float, sigma: float) -> float:
    """The zCDP cost rho = Delta^2 / (2 sigma^2) of one Gaussian release."""
    return sensitivity**2 / (2.0 * sigma**2)


def own_noise_rho(rho: float, noise_share: float) -> float:
    """The zCDP a site's OWN noise gives when it adds ``noise_share`` of the noise that
    ``rho`` calibrates (distributed DP; 1 for local DP): share x sigma with
    sigma = Delta / sqrt(2 rho) is, on its own, rho / share^2-zCDP (``gaussian_rho``).

    It is what a site charges to its ``dp-budget``. Under distributed DP the rest of the
    noise comes from the other summed sites, which the site cannot check: the server
    sends the share, and a coordinator that colludes with the other sites (or runs
    them) learns the site's terms with its share of the noise alone. Charging rho /
    share^2 makes the site's own noise follow its own budget: a tiny share costs so
    much that it is refused.

    Raises
    ------
    ValueError
        When ``rho`` is not > 0 or ``noise_share`` not in (0, 1].
    """
    if not rho > 0 or not 0 < noise_share <= 1:
        raise ValueError(f"need rho > 0 and a noise share in (0, 1], got {rho}, {noise_share}")
    return rho / noise_share / noise_share  # (inf, not an error, for a share ~1e-200)


def data_rounds(num_rounds: int, eval_every: int, n_init: int, start_rounds: int = 0) -> int:
    """The most rounds of a run that touch data under DP: per n-init repetition, the
    start's noised rounds (``start_rounds``: the divisive start's Lloyd rounds; a start
    drawn from the declared box touches no data), every training round, the interim
    evaluations (``eval-every``) and the final evaluation. (The Davies-Bouldin round is
    not run on data under DP.)"""
    interim = num_rounds // eval_every if eval_every else 0
    return n_init * (start_rounds + num_rounds + interim + 1)


def rho_per_round(epsilon: float, delta: float, rounds: int) -> float:
    """The run's budget (epsilon, delta) as rho-zCDP, split equally over ``rounds``."""
    if rounds < 1:
        raise ValueError(f"need at least one round, got {rounds}")
    return rho_from_epsilon(epsilon, delta) / rounds


def spent(rho_round: float, rounds_run: int, delta: float) -> dict[str, float]:
    """What a run spent after ``rounds_run`` data rounds of ``rho_round`` each (the
    bound for every site, whether or not it was sampled in each of them)."""
    rho = rho_round * rounds_run
    return {"dp-rho-spent": rho, "dp-epsilon-spent": epsilon_from_rho(rho, delta),
            "dp-rounds": rounds_run}


# ------------------------------------------------------------------ mechanisms
def sums_counts_sigma(lo: np.ndarray, hi: np.ndarray, rho: float) -> float:
    """sigma of the joint release of centred sums and (D/2)-scaled counts: the
    sensitivity is the box's diameter D (module docstring)."""
    return gaussian_sigma(l2_diameter(lo, hi), rho)


def sums_counts_sigmas(lo: np.ndarray, hi: np.ndarray, rho: float) -> tuple[float, float]:
    """(sigma on each sum entry, sigma on each count) of that joint release: the counts
    are released as (D/2) n, so their noise is sigma / (D/2)."""
    sigma = sums_counts_sigma(lo, hi, rho)
    return sigma, sigma * 2.0 / l2_diameter(lo, hi)


def noisy_sums_counts(
    sums: np.ndarray,
    counts: np.ndarray,
    lo: np.ndarray,
    hi: np.ndarray,
    sigma: float,
    rng: np.random.Generator,
    noise_share: float = 1.0,
) -> tuple[np.ndarray, np.ndarray]:
    """The Gaussian mechanism on one site's per-cluster sums and counts.

    Parameters
    ----------
    sums : (k, d) array
        Per-cluster sums of the site's CLIPPED rows (not centred).
    counts : (k,) array
        Per-cluster row counts.
    lo, hi : (d,) arrays
        The clipping box; its centre m and diameter D fix the calibration.
    sigma : float
        The noise the released SUM over sites must carry (``sums_counts_sigma``).
    rng : numpy Generator
        The noise source (seeded in simulation, OS entropy in deployment).
    noise_share : float in (0, 1]
        The share of sigma this site adds. 1 = local DP: every site's release is
        private on its own. With secure aggregation over n sites, each adding
        sigma / sqrt(n) (``noise_share = 1 / sqrt(n)``), the server sees only the sum,
        whose noise is N(0, sigma^2): distributed DP (Kairouz, Liu, Steinke 2021). The
        guarantee then holds only if at least n sites' shares reach the sum (a dropped
        site removes its share), and never against a server that sees single replies.

    Returns
    -------
    noisy_centred_sums : (k, d) array
        sum over the cluster of (x - m), plus N(0, (share sigma)^2) per entry.
    noisy_counts : (k,) array (float, may be negative)
        counts plus N(0, (share sigma / gamma)^2), gamma = D / 2.
    """
    if not 0 < noise_share <= 1:
        raise ValueError(f"noise_share must be in (0, 1], got {noise_share}")
    lo, hi = np.asarray(lo, dtype=np.float64), np.asarray(hi, dtype=np.float64)
    centre = (lo + hi) / 2.0
    gamma = l2_diameter(lo, hi) / 2.0
    counts = np.asarray(counts, dtype=np.float64)
    centred = np.asarray(sums, dtype=np.float64) - counts[:, None] * centre
    scale = noise_share * sigma
    noisy_sums = centred + rng.normal(0.0, scale, size=centred.shape)
    noisy_scaled_counts = gamma * counts + rng.normal(0.0, scale, size=counts.shape)
    return noisy_sums, noisy_scaled_counts / gamma


def release_counts(noisy_counts: np.ndarray, n_rows: int, floor: int) -> np.ndarray:
    """Post-process noisy counts into counts the server accepts (post-processing costs
    no privacy): rounded, at least 0, scaled down to total at most ``n_rows`` (public),
    and the privacy floor applied to the NOISY counts (under ``floor`` -> 0)."""
    counts = np.maximum(np.rint(np.asarray(noisy_counts, dtype=np.float64)), 0.0)
    total = counts.sum()
    if total > n_rows:
        counts = np.floor(counts * (n_rows / total))
    counts[counts < floor] = 0
    return counts.astype(np.int64)


def release_means(
    noisy_centred_sums: np.ndarray,
    counts: np.ndarray,
    lo: np.ndarray,
    hi: np.ndarray,
    fallback: np.ndarray,
) -> np.ndarray:
    """Per-cluster means from the noisy sums and the released counts, clipped into the
    box; a cluster with a released count of 0 takes its ``fallback`` row (what the server
    sent). Post-processing: n_j m + S~_j over n_j is the site's contribution to DWF's
    count-weighted mean, so the server's reduction is unchanged."""
    lo, hi = np.asarray(lo, dtype=np.float64), np.asarray(hi, dtype=np.float64)
    out = np.array(fallback, dtype=np.float64, copy=True)
    has = counts > 0
    centre = (lo + hi) / 2.0
    out[has] = np.clip(noisy_centred_sums[has] / counts[has, None] + centre, lo, hi)
    return out


def evaluation_reply(counts: np.ndarray, sse: float, n_features: int,
                     hidden: np.ndarray | None = None) -> tuple[protocol.Evaluation, dict]:
    """The (arrays, metrics) of a DP evaluation reply, in the layout of the plain one
    (``tasks.evaluate``): ``counts``, zero sums, squared norms and distances (not
    released under DP), the ``hidden`` flags (zeros when not given), ``sse``, a zero
    silhouette sum and a zero group scatter (DP answers from rows, each its own point).
    A local-DP site and the server's release of a distributed-DP sum both use it."""
    k = len(counts)
    flags = np.zeros(k, dtype=np.int64) if hidden is None else np.asarray(hidden, dtype=np.int64)
    return (protocol.Evaluation(counts, np.zeros((k, n_features)), np.zeros(k), flags,
                                np.zeros(k)),
            {"sse": float(sse), "silhouette-sum": 0.0, "group-scatter": 0.0})


def evaluation_sigmas(lo: np.ndarray, hi: np.ndarray, rho: float) -> tuple[float, float, float]:
    """Noise of the evaluation round's joint release of per-cluster counts and the SSE.

    Each row's SSE term is capped at cap = D^2 (a clipped row is at most D from any
    point of the box), so replacing one row moves the SSE by at most cap and two counts
    by 1. Releasing (n / 2, SSE / (sqrt 2 cap)) has L2 sensitivity
    sqrt(2 / 4 + 1 / 2) = 1; one Gaussian of scale s = 1 / sqrt(2 rho) on it gives the
    counts noise 2 s and the SSE noise sqrt(2) cap s.

    Returns
    -------
    (sigma_counts, sigma_sse, cap)
    """
    cap = l2_diameter(lo, hi) ** 2
    unit = gaussian_sigma(1.0, rho)
    return 2.0 * unit, math.sqrt(2.0) * cap * unit, cap

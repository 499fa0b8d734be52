"""Server-side reductions as pure numpy functions (no Flower types).

Inputs are stacked in the stable site order chosen by the strategy (sorted site keys),
so every reduction is deterministic whatever order the replies arrived in.
"""

from __future__ import annotations

import numpy as np

from fedcluster.common.kernels import frobenius


def site_weighted_mean(
    site_centroids: np.ndarray, site_weights: np.ndarray, dynamic: bool
) -> np.ndarray:
    """Per-cluster average of the sites' centroids (DWF / EWF, docs/explanation/algorithms.md sec. 1).

    Parameters
    ----------
    site_centroids : (S, k, d) array
        C_i for each of the S answering sites.
    site_weights : (S, k) array
        w_ij, the number of site i's points nearest to global centroid j.
    dynamic : bool
        True for DWF: lambda_ij = w_ij / sum_i w_ij (1/S where no site has a member);
        False for EWF: lambda_ij = 1/S.

    Returns
    -------
    (k, d) array D with D_j = sum_i lambda_ij C_ij.
    """
    n_sites = site_centroids.shape[0]
    weights = np.asarray(site_weights, dtype=np.float64)
    lam = np.full_like(weights, 1.0 / n_sites)
    if dynamic:
        totals = weights.sum(axis=0)
        has_members = totals > 0
        lam[:, has_members] = weights[:, has_members] / totals[has_members]
    return np.einsum("sk,skd->kd", lam, site_centroids)


def momentum_step(
    C: np.ndarray, D: np.ndarray, C_old: np.ndarray, eta: float, mu: float
) -> np.ndarray:
    """C_new = C + eta (D - C) + mu (C - C_old) (DWF paper, eq. for the server update)."""
    return C + eta * (D - C) + mu * (C - C_old)


def _require_distinct(points: np.ndarray, k: int) -> None:
    n_distinct = len(np.unique(points, axis=0))
    if n_distinct < k:
        raise ValueError(
            f"the sites reported {n_distinct} distinct local centroids, fewer than the "
            f"k = {k} clusters asked for"
        )


def kmeans_on_centroids(
    points: np.ndarray, k: int, seed: int, weights: np.ndarray | None = None, n_init: int = 10
) -> np.ndarray:
    """k-means (k-means++ seeding, ``n_init`` restarts) on centroids reported by sites.

    The server step of k-FED (Dennis et al. 2021): unweighted by default, or weighted by
    the sites' counts. Raises ValueError when fewer than k distinct points are given.
    """
    points = np.asarray(points, dtype=np.float64)
    _require_distinct(points, k)
    # Imported here: only a run that clusters the sites' centroids needs scikit-learn, and
    # every other run's ServerApp process would pay for importing it (~0.5 s).
    from sklearn.cluster import KMeans

    model = KMeans(n_clusters=k, init="k-means++", n_init=n_init, random_state=seed)
    model.fit(points, sample_weight=weights)
    return np.ascontiguousarray(model.cluster_centers_, dtype=np.float64)


def fuzzy_on_centroids(
    points: np.ndarray, k: int, seed: int, weights: np.ndarray, fuzzifier: float,
    n_init: int = 10, max_iter: int = 1000, tol: float = 1e-10,
) -> np.ndarray:
    """Weighted fuzzy c-means (fuzzifier m, k-means++ seeds, ``n_init`` restarts) on
    weighted points: the restart with the lowest J_m = sum_i w_i sum_j u_ij^m d_ij^2.

    FFCM's merge of the divisive start's summary (``divisive.py``). Fuzzy c-means has its
    own local optima, and the start that is best for k-means is not the best for J_m:
    merging the summary by k-means and then running FFCM from there ends in a worse J_m
    on ``tiny`` and ``outliers`` (BENCHMARKS.md ``quality-ffcm-start``). Raises
    ValueError when fewer than k distinct points are given.
    """
    points = np.asarray(points, dtype=np.float64)
    weights = np.asarray(weights, dtype=np.float64)
    _require_distinct(points, k)
    from sklearn.cluster import kmeans_plusplus  # see kmeans_on_centroids

    exponent = 1.0 / (fuzzifier - 1.0)

    def memberships(C):
        # Bezdek's u_ij as (d_min / d_ij)^(1/(m-1)) normalised: no overflow at a point that
        # sits on a centre (d^(-1/(m-1)) is inf there).
        d2 = np.maximum(((points[:, None, :] - C[None]) ** 2).sum(-1), 1e-300)
        nearest = d2.min(axis=1, keepdims=True)
        ratios = (nearest / d2) ** exponent
        return ratios / ratios.sum(axis=1, keepdims=True), nearest[:, 0], ratios.sum(axis=1)

    best, best_objective = None, np.inf
    for restart in range(n_init):
        C = kmeans_plusplus(points, k, sample_weight=weights, random_state=seed + restart)[0]
        for _ in range(max_iter):
            um = weights[:, None] * memberships(C)[0] ** fuzzifier
            new = (um.T @ points) / np.maximum(um.sum(axis=0), 1e-300)[:, None]
            moved = frobenius(new - C)
            C = new
            if moved <= tol:
                break
        # J_m at the memberships that minimise it for these centres (Bezdek's):
        # sum_i w_i (sum_j d_ij^(-1/(m-1)))^-(m-1) = sum_i w_i d_min (sum_j ratios)^-(m-1).
        _, nearest, ratio_sums = memberships(C)
        objective = float((weights * nearest * ratio_sums ** -(fuzzifier - 1.0)).sum())
        if objective < best_objective:
            best, best_objective = C, objective
    return np.ascontiguousarray(best, dtype=np.float64)


def bounding_box_init(mins: np.ndarray, maxs: np.ndarray, k: int, seed: int) -> np.ndarray:
    """k points uniform in the box [min over sites, max over sites] per feature."""
    lo = np.min(mins, axis=0)
    hi = np.max(maxs, axis=0)
    rng = np.random.default_rng(seed)
    return lo + rng.random((k, lo.shape[0])) * (hi - lo)


def weighted_lloyd(
    points: np.ndarray,
    weights: np.ndarray,
    C0: np.ndarray,
    max_iter: int = 300,
    tol: float = 0.0,
    empty: np.ndarray | None = None,
) -> np.ndarray:
    """Weighted Lloyd on centroids reported by sites, warm-started from ``C0``.

    FKM's server step from round 1 on (Garst & Reinders, eq. 1): starting from the
    previous global centroids keeps cluster indices stable and makes the rounds improve
    monotonically instead of jumping between optima. A global cluster that no reported
    point is nearest to keeps its centroid, or moves to its row of ``empty`` when given
    (the empty-cluster policy; FFCM's avg2 passes the avg1 centres, see ``fuzzy.py``).
    Runs until the assignment no longer changes (or ``max_iter``).
    """
    C = np.array(C0, dtype=np.float64, copy=True)
    if len(points) == 0:
        return C
    points = np.asarray(points, dtype=np.float64)
    weights = np.asarray(weights, dtype=np.float64)
    labels = None
    for _ in range(max_iter):
        d2 = ((points[:, None, :] - C[None, :, :]) ** 2).sum(-1)
        new_labels = d2.argmin(axis=1)
        if labels is not None and np.array_equal(new_labels, labels):
            break
        labels = new_labels
        mass = np.bincount(labels, weights=weights, minlength=len(C))
        sums = np.zeros_like(C)
        np.add.at(sums, labels, weights[:, None] * points)
        moved = mass > 0
        previous = C.copy()
        C[moved] = sums[moved] / mass[moved, None]
        if empty is not None:
            C[~moved] = empty[~moved]
        if frobenius(C - previous) <= tol:
            break
    return C


def count_weighted_mean(
    site_centroids: np.ndarray, site_counts: np.ndarray, fallback: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Gamma* = sum_i Lambda_i Gamma_i / Lambda_t per cluster (mini-batch k-means server).

    Returns (Gamma*, Lambda_t); a cluster with Lambda_t = 0 takes ``fallback`` (its
    current centroid).
    """
    counts = np.asarray(site_counts, dtype=np.float64)
    totals = counts.sum(axis=0)
    out = np.array(fallback, dtype=np.float64, copy=True)
    has = totals > 0
    weighted = np.einsum("sk,skd->kd", counts, site_centroids)
    out[has] = weighted[has] / totals[has, None]
    return out, totals


def reseed_small_clusters(
    C: np.ndarray, totals: np.ndarray, dead: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    """Move each ``dead`` cluster next to the currently largest one (splitting it).

    The server holds no data points, so instead of the paper's "randomly reassigned" it
    re-seeds a dead centroid at the largest cluster's centroid plus a small seeded
    perturbation (1e-2 of the distance from that centroid to its nearest live
    neighbour); the next rounds split that cluster's members between the two.
    """
    C = np.array(C, dtype=np.float64, copy=True)
    mass = np.array(totals, dtype=np.float64, copy=True)
    live = ~np.asarray(dead, dtype=bool)
    for j in np.flatnonzero(dead):
        big = int(np.argmax(np.where(live, mass, -np.inf)))
        gaps = np.linalg.norm(C[live] - C[big], axis=1)
        gaps = gaps[gaps > 0]
        scale = 1e-2 * (gaps.min() if len(gaps) else 1.0)
        direction = rng.normal(size=C.shape[1])
        C[j] = C[big] + scale * direction / max(np.linalg.norm(direction), 1e-300)
        live[j] = True
        mass[big] /= 2.0
        mass[j] = mass[big]
    return C


def reseed_at_far_rows(C: np.ndarray, dead: np.ndarray, far_means: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Move each ``dead`` cluster to a site's farthest rows' mean (``far_means``: one
    per site that reported one), farthest first: each dead cluster takes the candidate
    farthest from every live centroid (k-means++'s farthest-point rule, on means of at
    least p rows), which then counts as live. Returns the centroids and the clusters
    still dead (more dead clusters than candidates): those are re-seeded by
    :func:`reseed_small_clusters`."""
    C = np.array(C, dtype=np.float64, copy=True)
    live = ~np.asarray(dead, dtype=bool)
    left = [np.asarray(m, dtype=np.float64) for m in far_means]
    for j in np.flatnonzero(dead):
        if not left:
            break
        gaps = [np.min(np.sum((C[live] - m) ** 2, axis=1)) if live.any() else 0.0 for m in left]
        C[j] = left.pop(int(np.argmax(gaps)))
        live[j] = True
    return C, ~live


def gtv_distance(W_a: np.ndarray, W_b: np.ndarray) -> float:
    """GTV between two sites' centroid sets (Jung, eq. 4): sum over a's centroids of the
    squared distance to the nearest of b's, plus the same from b to a. 0 exactly when
    the two sets are equal as sets (any order)."""
    d2 = ((W_a[:, None, :] - W_b[None, :, :]) ** 2).sum(-1)
    return float(d2.min(axis=1).sum() + d2.min(axis=0).sum())


#: Rounds in a row whose relative score improvement must stay under ``score-tol``.
SCORE_PATIENCE = 2
#: GTV's and EWF's rounds in a row none of which may beat the best score before them by
#: ``score-tol`` (their ``score_best_patience``).
BEST_PATIENCE = 5


def score_stalled(scores: list[float], score_tol: float, patience: int = SCORE_PATIENCE,
                  best_patience: int | None = None) -> bool:
    """Whether the training score has stopped improving, relative, by ``score_tol``:

    - each of the last ``patience`` rounds improved on the round before it by less:
      (s_{t-1} - s_t) / s_{t-1} < score_tol (a worse score counts as no improvement); or,
      with ``best_patience``,
    - none of the last ``best_patience`` rounds improved on the best score before them by
      ``score_tol`` or more. GTV's and EWF's: GTV's local scores on split groups
      (p_site >= 3) alternate better and worse rounds 0.3 % apart for ever, and EWF's
      can go round three scores, so no two rounds in a row fail to improve and the
      first rule never fires (BENCHMARKS.md ``quality-site-floors``). Not the others':
      DWF's score on split groups rises for a
      few rounds and then falls on (its momentum, counts rounded to whole rows), and
      stopping there cost its 90th percentile at p_site 10 under label skew (1.098 ->
      1.107) and its worst (r15: 4.04 -> 5.15).

    Off when ``score_tol`` is 0; a rule never fires with a NaN among the scores it
    compares (a round whose score is unknown stops nothing; earlier unknown rounds are
    skipped in the best before)."""
    if score_tol <= 0.0:
        return False
    history = np.asarray(scores, dtype=np.float64)
    if len(history) >= patience + 1:
        recent = history[-(patience + 1):]
        if np.all(np.isfinite(recent)) and np.all(recent[:-1] > 0.0) \
                and np.all((recent[:-1] - recent[1:]) / recent[:-1] < score_tol):
            return True
    if best_patience and len(history) >= best_patience + 1:
        recent, before = history[-best_patience:], history[:-best_patience]
        best = np.nanmin(before) if np.any(np.isfinite(before)) else np.nan
        if np.all(np.isfinite(recent)) and np.isfinite(best) and best > 0.0 \
                and (best - recent.min()) / best < score_tol:
            return True
    return False

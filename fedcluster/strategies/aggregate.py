"""Server-side reductions as pure numpy functions (no Flower types).

Inputs are stacked in the stable site order chosen by the strategy (sorted site keys),
so every reduction is deterministic whatever order the replies arrived in.
"""

from __future__ import annotations

import numpy as np
from sklearn.cluster import KMeans


def site_weighted_mean(
    site_centroids: np.ndarray, site_weights: np.ndarray, dynamic: bool
) -> np.ndarray:
    """Per-cluster average of the sites' centroids (DWF / EWF, ALGORITHMS.md sec. 1).

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


def kmeans_on_centroids(
    points: np.ndarray, k: int, seed: int, weights: np.ndarray | None = None, n_init: int = 10
) -> np.ndarray:
    """k-means (k-means++ seeding, ``n_init`` restarts) on centroids reported by sites.

    The server step of k-FED (Dennis et al. 2021): unweighted by default, or weighted by
    the sites' counts. Raises ValueError when fewer than k distinct points are given.
    """
    points = np.asarray(points, dtype=np.float64)
    n_distinct = len(np.unique(points, axis=0))
    if n_distinct < k:
        raise ValueError(
            f"the sites reported {n_distinct} distinct local centroids, fewer than the "
            f"k = {k} clusters asked for"
        )
    model = KMeans(n_clusters=k, init="k-means++", n_init=n_init, random_state=seed)
    model.fit(points, sample_weight=weights)
    return np.ascontiguousarray(model.cluster_centers_, dtype=np.float64)


def bounding_box_init(mins: np.ndarray, maxs: np.ndarray, k: int, seed: int) -> np.ndarray:
    """k points uniform in the box [min over sites, max over sites] per feature."""
    lo = np.min(mins, axis=0)
    hi = np.max(maxs, axis=0)
    rng = np.random.default_rng(seed)
    return lo + rng.random((k, lo.shape[0])) * (hi - lo)

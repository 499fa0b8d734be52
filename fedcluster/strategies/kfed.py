"""k-FED (Dennis, Li, Smith 2021, "Heterogeneity for the win: one-shot federated
clustering"): every site runs k-means locally, the server clusters the union of the
local centroids. ALGORITHMS.md section 3.

This module holds the one implementation of the k-FED round, used as the
initialisation of DWF/EWF (``init = "kfed"``) and, later, as the one-shot algorithm.
"""

from __future__ import annotations

import numpy as np

from fedcluster.strategies.aggregate import kmeans_on_centroids
from fedcluster.strategies.base import ClusteringStrategy, FederationError, TaskPlan
from fedcluster.strategies.validation import Reply


def site_seed(seed: int, index: int) -> int:
    """A per-site seed that depends only on the run seed and the site's position."""
    return int(np.random.SeedSequence([seed, index]).generate_state(1)[0])


def kfed_plan(strategy: ClusteringStrategy, k_local: int) -> TaskPlan:
    """The site task: k-means++ and Lloyd to convergence with ``k_local`` clusters."""
    return TaskPlan(
        "local_kmeans",
        params={"k-local": k_local},
        per_site={
            site.key: {"seed": site_seed(strategy.seed, i)}
            for i, site in enumerate(strategy.ordered_sites())
        },
        max_rows=k_local,
    )


def kfed_reduce(replies: list[Reply], k: int, seed: int, weighted: bool) -> np.ndarray:
    """Server step: k-means on the union of the local centroids (weighted by counts or not)."""
    if not replies:
        raise FederationError("k-FED: no site returned local centroids")
    points = np.concatenate([r.arrays[0] for r in replies])
    counts = np.concatenate([r.arrays[1] for r in replies]).astype(np.float64)
    try:
        return kmeans_on_centroids(points, k, seed, weights=counts if weighted else None)
    except ValueError as err:
        raise FederationError(
            f"k-FED: {err} (after the privacy floor); use init = \"random\" or a smaller k"
        ) from None

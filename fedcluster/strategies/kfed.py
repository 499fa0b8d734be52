"""k-FED (Dennis, Li, Smith 2021, "Heterogeneity for the win: one-shot federated
clustering"): every site runs k-means locally, the server clusters the union of the
local centroids. docs/explanation/algorithms.md section 3.

This module holds the one implementation of the k-FED round, used as the
initialisation of DWF/EWF (``init = "kfed"``) and, later, as the one-shot algorithm.
"""

from __future__ import annotations

import numpy as np

from fedcluster.strategies import private
from fedcluster.strategies.aggregate import bounding_box_init, kmeans_on_centroids
from fedcluster.strategies.base import ClusteringStrategy, TaskPlan
from fedcluster.strategies.errors import FederationError
from fedcluster.strategies.validation import Reply


def kfed_plan(strategy: ClusteringStrategy, k_local: int) -> TaskPlan:
    """The site task: k-means++ and Lloyd to convergence with ``k_local`` clusters."""
    return TaskPlan(
        "local_kmeans",
        params={"k-local": k_local},
        seed_base=(strategy.seed,),
        max_rows=k_local,
    )


def kfed_reduce(replies: list[Reply], k: int, seed: int, weighted: bool) -> np.ndarray:
    """Server step: k-means on the union of the local centroids (weighted by counts or not)."""
    if not replies:
        raise FederationError("k-FED: no site returned local centroids")
    points = np.concatenate([r.arrays.centroids for r in replies])
    counts = np.concatenate([r.arrays.counts for r in replies]).astype(np.float64)
    try:
        return kmeans_on_centroids(points, k, seed, weights=counts if weighted else None)
    except ValueError as err:
        raise FederationError(
            f"k-FED: {err} (after the privacy floor); use init = \"random\" or a smaller k"
        ) from None


class KFedOrRandomInit:
    """The initialisation shared by DWF, EWF and mini-batch k-means (a strategy mixin):
    ``init = "kfed"`` runs the k-FED round; ``"random"`` draws k points uniformly in the
    federated bounding box (per-site minima and maxima)."""

    def init_without_round(self) -> np.ndarray | None:
        """``init = "random"`` with ``data-bounds``: k points uniform in the declared
        box, drawn by the server (no site round, nothing disclosed)."""
        if self.config.resolved_init == "random" and self.box is not None and not self.bounds_from_data:
            return bounding_box_init(self.box[0][None], self.box[1][None], self.k, self.seed)
        return None

    def init_task(self) -> TaskPlan:
        if self.config.resolved_init == "kfed":
            return kfed_plan(self, self.config.resolved_k_local)
        return TaskPlan("bounds")

    def reduce_init(self, plan: TaskPlan, replies: list[Reply]) -> np.ndarray:
        if plan.task == "local_kmeans":
            return kfed_reduce(replies, self.k, self.seed, self.config.resolved_weighted)
        mins = np.stack([r.arrays.minima for r in replies])
        maxs = np.stack([r.arrays.maxima for r in replies])
        if self.config.private and self.box is None:
            self.box, self.bounds_from_data = private.box_from_data(self.config, mins, maxs), True
        else:
            # k-FED's round sends aggregates only, but DP and SecAgg+ refuse it.
            kfed_allowed = not (self.config.private or self.config.secure_aggregation)
            private.warn_leak("init 'random' without data-bounds: the sites sent their "
                              "per-feature minima and maxima (each one person's value) for the "
                              "bounding box the start is drawn in; give data-bounds"
                              + (", or use init 'kfed' (aggregates only)" if kfed_allowed else ""))
        return bounding_box_init(mins, maxs, self.k, self.seed)


class KFed(KFedOrRandomInit, ClusteringStrategy):
    """One-shot k-FED: the k-FED round, then the evaluation round.

    ``k-local`` sets the sites' k (default k); ``weighted = true`` weights the server's
    k-means by the local cluster sizes (k-FED proper is unweighted).
    """

    has_training = False

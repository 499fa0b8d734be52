"""FKM: federated k-means with local pruning.

Garst & Reinders, "Federated K-means clustering" (2024); docs/explanation/algorithms.md section 4.
Round 0, the paper's: every site seeds k clusters with k-means++ (``init = "kmeans++"``)
or random rows (``init = "random"``) and returns the means and sizes of those clusters.
The default (``init = "kfed"``) is the k-FED round DWF starts from instead: every site
runs k-means to convergence with 2k clusters (``k-local``) and returns their means and
sizes (the paper's seeds alone left FKM at 1.01-1.03 x central k-means on four of
bench/quality.py's 21 sets, IID; from the k-FED round, at most 1.009 but on the
outliers set, 1.035 as with DWF). The server
runs k-means with k clusters on the concatenated local means, weighted by their sizes
(``weighted``), k-means++ seeded at round 0 and warm-started from the previous global
centroids afterwards (so rounds improve monotonically instead of jumping between
optima). Each later round, a site assigns its data to the global centroids, drops the
global clusters with no local member (``prune``), runs ``local-iters`` Lloyd iterations
from the rest and returns the means and sizes. A cluster with fewer than p members is
never reported (the paper's privacy filter, p = ``min-cluster-size``, default 2).
"""

from __future__ import annotations

import numpy as np

from fedcluster.common import protocol
from fedcluster.strategies.aggregate import kmeans_on_centroids, weighted_lloyd
from fedcluster.strategies.base import ClusteringStrategy, TaskPlan
from fedcluster.strategies.errors import FederationError
from fedcluster.strategies.kfed import kfed_plan


def _union(replies) -> tuple[np.ndarray, np.ndarray]:
    points = np.concatenate([r.arrays.centroids for r in replies])
    counts = np.concatenate([r.arrays.counts for r in replies]).astype(np.float64)
    return points, counts


class FederatedKMeansPruning(ClusteringStrategy):
    """FKM with the paper's ablation switches: prune, init, local-iters, weighted."""

    def init_task(self) -> TaskPlan:
        """Round 0: k-FED's local k-means, or each site's k-means++ seeds (``kmeanspp``)."""
        if self.config.resolved_init == "kfed":
            return kfed_plan(self.seed, self.config.resolved_k_local)
        return TaskPlan(
            "kmeanspp",
            params={"k-local": self.k, "init": self.config.resolved_init},
            seed_base=(self.seed,),
            max_rows=self.k,
        )

    def _weights(self, counts: np.ndarray) -> np.ndarray:
        return counts if self.config.resolved_weighted else np.ones_like(counts)

    def reduce_init(self, plan, replies) -> np.ndarray:
        """The union of the sites' centroids clustered into k (weighted k-means,
        weighted by counts where ``weighted``)."""
        points, counts = _union(replies)
        try:
            return kmeans_on_centroids(points, self.k, self.seed, weights=self._weights(counts))
        except ValueError as err:
            raise FederationError(f"FKM round 0: {err} (after the privacy floor)") from None

    def train_task(self) -> TaskPlan:
        """A training round: the sites' Lloyd iterations with pruning of small local
        clusters (``prune_lloyd``)."""
        return TaskPlan(
            "prune_lloyd",
            params={
                "local-iters": self.config.local_iters,
                "tol": self.config.tol,
                "prune": self.config.prune,
            },
            arrays=protocol.Centroids(self.centroids),
            sample=True,
            max_rows=self.k,
        )

    def reduce_train(self, plan, replies) -> np.ndarray:
        """One weighted Lloyd step on the union of the sites' centroids, from the
        current ones (``aggregate.weighted_lloyd``)."""
        points, counts = _union(replies)
        return weighted_lloyd(points, self._weights(counts), self.centroids)

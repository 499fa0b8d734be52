"""k-FED (Dennis, Li, Smith 2021, "Heterogeneity for the win: one-shot federated
clustering"): every site runs k-means locally, the server clusters the union of the
local centroids. docs/explanation/algorithms.md section 3.

This module holds the one implementation of the k-FED round, used as the
initialisation of DWF/EWF (``init = "kfed"``) and, later, as the one-shot algorithm.
"""

from __future__ import annotations

import numpy as np

from fedcluster.common import protocol
from fedcluster.strategies import divisive, private
from fedcluster.strategies.divisive import DivisiveStart
from fedcluster.strategies.aggregate import bounding_box_init, kmeans_on_centroids
from fedcluster.strategies.base import ClusteringStrategy, TaskPlan
from fedcluster.strategies.errors import FederationError
from fedcluster.strategies.reply import Reply


def kfed_plan(seed: int, k_local: int, min_groups: int = 1) -> TaskPlan:
    """The site task: k-means++ and Lloyd to convergence with ``k_local`` clusters (each
    of at least ``min_groups`` of the site's groups: :data:`protocol.MIN_GROUPS`), seeded
    per site from the repetition's ``seed``."""
    params = {"k-local": k_local}
    if min_groups > 1:
        params[protocol.MIN_GROUPS] = min_groups
    return TaskPlan(
        "local_kmeans",
        params=params,
        seed_base=(seed,),
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
    """The initialisation shared by DWF, EWF, mini-batch k-means and FFCM (a strategy
    mixin): ``init = "kfed"`` runs the k-FED round; ``"divisive"`` the sum-only start
    (``divisive.py``: a few Lloyd rounds that only report sums and counts, the default
    under secure aggregation and DP); ``"random"`` draws k points uniformly in the
    declared box (``data-bounds``) or, without it, the federated bounding box
    (per-site minima and maxima)."""

    #: The k-FED round's :data:`protocol.MIN_GROUPS`: as a start, every local cluster
    #: (the server's k-means weighs them by their rows).
    kfed_min_groups = 1

    def reset_repetition(self) -> None:
        """A repetition's state, and no divisive start yet."""
        super().reset_repetition()
        self.divisive_start: DivisiveStart | None = None

    def merge_summary(self, means: np.ndarray, k: int, seed: int, weights: np.ndarray) -> np.ndarray:
        """The divisive start's server step: its grown clusters merged to k (weighted
        k-means; a strategy with another objective overrides it)."""
        return kmeans_on_centroids(means, k, seed, weights=weights)

    def init_rounds(self) -> int:
        """One round (k-FED, the bounds round), or the divisive start's rounds (and a
        bounds round first under DP without ``data-bounds``)."""
        if self.config.resolved_init != "divisive":
            return 1
        declared = self.config.data_bounds or not self.config.private  # else a bounds round
        return divisive.start_rounds(self.k) + (0 if declared else 1)

    def init_without_round(self) -> np.ndarray | None:
        """``init = "random"`` with ``data-bounds``: k points uniform in the declared
        box, drawn by the server (no site round, nothing disclosed)."""
        if self.config.resolved_init == "random" and self.box is not None and not self.bounds_from_data:
            return bounding_box_init(self.box[0][None], self.box[1][None], self.k, self.seed)
        return None

    def init_task(self) -> TaskPlan:
        """The start's round: k-FED's local k-means, the divisive start's next Lloyd
        round, or the sites' bounds (``init = "random"`` without a declared box, and DP's
        clipping box)."""
        init = self.config.resolved_init
        if init == "kfed":
            return kfed_plan(self.seed, self.config.resolved_k_local, self.kfed_min_groups)
        if init == "divisive" and not (self.config.private and self.box is None):
            if self.divisive_start is None:
                self.divisive_start = DivisiveStart.new(self.k, self.n_features, self.seed)
            return self.divisive_start.plan()
        return TaskPlan("bounds")  # (DP without data-bounds: the clipping box first)

    def reduce_init(self, plan: TaskPlan, replies: list[Reply]) -> np.ndarray | None:
        """The initial centroids from the start's replies (None: the divisive start
        goes on), and under DP without ``data-bounds`` the clipping box from the bounds."""
        if plan.task == "local_kmeans":
            return kfed_reduce(replies, self.k, self.seed, self.config.resolved_weighted)
        if plan.task == "lloyd":
            return self.divisive_start.reduce(replies, self.box, merge=self.merge_summary)
        mins = np.stack([r.arrays.minima for r in replies])
        maxs = np.stack([r.arrays.maxima for r in replies])
        if self.config.private and self.box is None:
            self.box, self.bounds_from_data = private.box_from_data(self.config, mins, maxs), True
            if self.config.resolved_init == "divisive":
                return None  # the box is for clipping; the start is still to grow
        else:
            private.warn_extremes(self.ordered_sites(), "init 'random' without data-bounds")
        return bounding_box_init(mins, maxs, self.k, self.seed)


class KFed(KFedOrRandomInit, ClusteringStrategy):
    """One-shot k-FED: the k-FED round, then the evaluation round.

    ``k-local`` sets the sites' k (default k); ``weighted = true`` weights the server's
    k-means by the local cluster sizes (k-FED proper is unweighted).
    """

    has_training = False
    #: k-FED proper clusters the union of the local centroids unweighted: a local cluster
    #: of one group (at p_site >= 2 most often a lone row glued to its nearest neighbour)
    #: would count as much as a site's whole cluster, so the sites leave those out.
    kfed_min_groups = 2

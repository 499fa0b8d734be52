"""Federated mini-batch k-means.

Triebe & Rajagopal, "Federated k-means: clustering algorithm and proof of concept"
(2019); docs/explanation/algorithms.md section 2. Each round the sampled sites run ``epochs`` passes of
mini-batch k-means (batches of ``batch-size``, 0 = full, client learning rate ``beta``,
batch order from a per-site per-round seed) and return their centroids Gamma_i and
counts Lambda_i; the server forms Gamma* = sum_i Lambda_i Gamma_i / sum_i Lambda_i and
moves C <- C + alpha (Gamma* - C), alpha = ``learning-rate``.

Dead clusters: a cluster with no reported member at any site (or, with
``reassign-fraction`` > 0, a total count under that share of the round's total) for
``reassign-patience`` consecutive rounds is re-seeded where the data are: while a
cluster counts towards that, every round also asks each site for the mean of its groups
farthest from the centroids it received, the fewest that hold p rows
(``protocol.FAR_ROWS``; a cluster of whole groups like any other, under the floor), and
a dead cluster moves to the site mean farthest from every live centroid
(:func:`aggregate.reseed_at_far_rows`).
Where no site reported one (or under secure aggregation, whose sums cannot hold it), it
is re-seeded next to the largest cluster (:func:`aggregate.reseed_small_clusters`). By
default only empty clusters are dead: a real small cluster (a rare subgroup, a few
outliers) keeps its centroid.

With the full batch, one epoch, beta = 1, alpha = 1 and all sites, one round is exactly
one central Lloyd step (a test checks it).
"""

from __future__ import annotations

import logging

import numpy as np
from flwr.common.logger import log

from fedcluster.common import protocol
from fedcluster.strategies.aggregate import (
    count_weighted_mean, reseed_at_far_rows, reseed_small_clusters,
)
from fedcluster.strategies.base import ClusteringStrategy, TaskPlan
from fedcluster.strategies.kfed import KFedOrRandomInit


class MiniBatchKMeans(KFedOrRandomInit, ClusteringStrategy):
    """Federated mini-batch k-means with server learning rate and dead-cluster re-seeding."""

    def reset_repetition(self) -> None:
        """A repetition's state, and no cluster counting towards re-seeding."""
        super().reset_repetition()
        self.small_streak = np.zeros(self.k, dtype=np.int64)
        self.reseeded: list[int] = []

    def can_stop(self) -> bool:
        """Not while a cluster is counting towards its re-seeding."""
        return not np.any(self.small_streak > 0)

    def train_task(self) -> TaskPlan:
        """One training round: ``epochs`` passes of ``batch-size`` mini-batches at each
        sampled site (seeded per site and round); where a cluster is counting towards its
        re-seeding, the sites' farthest rows' means are asked for too (not under SecAgg+)."""
        cfg = self.config
        params = {"epochs": cfg.epochs, "batch-size": cfg.batch_size, "beta": cfg.beta}
        if np.any(self.small_streak > 0) and not cfg.secure_aggregation:
            params[protocol.FAR_ROWS] = cfg.min_cluster_size  # where to re-seed, if it dies
        return TaskPlan(
            "minibatch",
            params=params,
            arrays=protocol.Centroids(self.centroids),
            sample=True,
            seed_base=(self.seed, self.train_round),
        )

    def reduce_train(self, plan, replies) -> np.ndarray:
        """The count-weighted mean of the sites' centres, a step of ``learning-rate``
        towards it; a cluster below ``reassign-fraction`` of the rows for
        ``reassign-patience`` rounds is re-seeded at the sites' farthest rows (else next to
        the largest cluster)."""
        gammas = np.stack([r.arrays.centroids for r in replies])
        lambdas = np.stack([r.arrays.counts for r in replies])
        gamma_star, totals = count_weighted_mean(gammas, lambdas, self.centroids)
        new = self.centroids + self.config.learning_rate * (gamma_star - self.centroids)
        small = (totals <= 0) | (totals < self.config.reassign_fraction * totals.sum())
        self.small_streak = np.where(small, self.small_streak + 1, 0)
        dead = self.small_streak >= self.config.reassign_patience
        if np.any(dead):
            far = [r.arrays.far_means[0] for r in replies
                   if isinstance(r.arrays, protocol.ClusterMeansAndFar) and r.arrays.far_counts[0] > 0]
            new, still_dead = reseed_at_far_rows(new, dead, far)
            if np.any(still_dead):
                rng = np.random.default_rng([self.seed, self.train_round, 104729])
                new = reseed_small_clusters(new, totals, still_dead, rng)
            self.small_streak[dead] = 0
            self.reseeded.extend(int(j) for j in np.flatnonzero(dead))
            log(logging.INFO, "round %s: re-seeded clusters %s (%d at sites' farthest rows, "
                "the rest next to the largest cluster)", self.train_round,
                np.flatnonzero(dead).tolist(), int(dead.sum() - still_dead.sum()))
        return new

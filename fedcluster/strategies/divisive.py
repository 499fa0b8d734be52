"""The sum-only divisive start (``init = "divisive"``): k starting centroids from nothing
but per-cluster sums and counts, so it runs under secure aggregation and DP.

The start grows a summary of the pooled data, then clusters it at the server:

1. a ``lloyd`` round (one local iteration) against one centroid: the pooled mean;
2. each growth round splits clusters into :data:`BRANCH` children placed around the
   parent at a tiny radius in seeded random directions, and runs a ``lloyd`` round
   against all the children. Children equidistant from their parent meet at it, so a
   split cuts the parent's members by cones through its mean whatever the radius; the
   round then moves every child to the mean of the rows it won (one 2-means, i.e. one
   power-iteration, step: the cut turns towards the principal directions). Splitting
   goes on until there are :data:`OVERSPLIT` x k clusters (the largest by count split
   first when not all can be, the last into fewer children if that reaches it exactly);
3. the server runs weighted k-means (k-means++, 10 restarts) on the grown clusters'
   means, weighted by their counts: a weighted summary of the pooled data, as k-FED's
   server step clusters the union of the sites' local centroids. FFCM merges the summary
   by weighted fuzzy c-means instead (its own objective, 10 restarts:
   ``aggregate.fuzzy_on_centroids``).

For k = 10 that is 5 rounds (1 -> 4 -> 16 -> 64 -> 80 clusters). Every round is a plain
``lloyd`` round, so everything that holds for a training round holds here: its secure
terms (weighted sums and counts), its DP release (noised sums and counts, clipped to the
box) and the privacy floor. What it discloses: per grown cluster, its count and mean
(secure: only their sums over the sites). Clusters the floor or the noise empties are
dropped.

Why over-split and merge: a divisive start that stops at k (bisecting k-means, LBG) cannot
undo an early wrong cut; growing 8k clusters and merging them with k-means at the server
can. The choices (4 children, 8k) were measured, with the alternatives, in
docs/explanation/algorithms.md; bench/quality.py measures the start in full runs.

References: Linde, Buzo, Gray, "An algorithm for vector quantizer design" (1980) for the
splitting; Boley, "Principal direction divisive partitioning" (1998) for the divisive
idea; Dennis, Li, Smith (2021) for clustering a summary at the server.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np
from flwr.common.logger import log

from fedcluster.common import protocol
from fedcluster.strategies.aggregate import (bounding_box_init, kmeans_on_centroids,
                                             site_weighted_mean)
from fedcluster.strategies.errors import FederationError
from fedcluster.strategies.task_plan import TaskPlan

#: The grown summary has OVERSPLIT x k clusters before the server merges it to k.
OVERSPLIT = 8
#: Children per split cluster.
BRANCH = 4
#: The children's distance from their parent, relative to the nearest other mean.
RADIUS = 1e-3
#: Growth rounds allowed beyond the fewest (clusters the floor or the noise empties).
SPARE_ROUNDS = 1
#: Salts the split directions' generator (with the seed and the round).
SALT = 17


def start_rounds(k: int) -> int:
    """The most site rounds the start takes for k clusters (the DP budget plans them)."""
    growth = math.ceil(math.log(OVERSPLIT * k) / math.log(BRANCH) - 1e-12)
    return 1 + growth + SPARE_ROUNDS


def split(means: np.ndarray, counts: np.ndarray, target: int,
          rng: np.random.Generator) -> np.ndarray:
    """The next round's centroids: clusters with at least 2 members split, largest count
    first, into :data:`BRANCH` children (the last one split into fewer when that reaches
    ``target`` exactly), the others kept. The children sit around their parent at
    :data:`RADIUS` x the distance to the nearest other mean, in random directions."""
    m, d = means.shape
    budget = max(target - m, 0)
    children: dict[int, int] = {}
    for j in np.argsort(-counts, kind="stable"):
        if budget <= 0 or counts[j] < 2:
            break
        children[int(j)] = min(BRANCH, budget + 1)
        budget -= children[int(j)] - 1
    out = [means[j] for j in range(m) if j not in children]
    for j, n_children in children.items():
        gaps = np.linalg.norm(means - means[j], axis=1)
        gaps[j] = np.inf
        scale = gaps.min() if m > 1 else 1.0 + np.abs(means[j]).max()
        directions = rng.standard_normal((n_children, d))
        directions /= np.linalg.norm(directions, axis=1, keepdims=True)
        out.extend(means[j] + RADIUS * scale * directions)
    return np.array(out, dtype=np.float64)


@dataclass
class DivisiveStart:
    """The start's state, kept on the strategy (a checkpoint holds it: it is one of
    ``state.py``'s dataclasses): the grown clusters' means and counts and the rounds run.

    :meth:`plan` is pure (the split directions are drawn from the seed and the round),
    so planning a round twice, as a secure run does to learn whether it is a sum, sends
    the same centroids."""

    k: int
    seed: int
    means: np.ndarray
    counts: np.ndarray
    rounds: int = 0

    @classmethod
    def new(cls, k: int, n_features: int, seed: int) -> "DivisiveStart":
        """A start about to send its first round (one centroid: any point will do, every
        row is its member; the reply is the pooled mean)."""
        return cls(k, seed, np.zeros((1, n_features)), np.zeros(1))

    def plan(self) -> TaskPlan:
        """This round's task: a Lloyd step (one local iteration) against the centroids
        that grow the clusters (the first round: the single centroid)."""
        centroids = self.means if self.rounds == 0 else split(
            self.means, self.counts, OVERSPLIT * self.k,
            np.random.default_rng([self.seed, SALT, self.rounds]))
        return TaskPlan("lloyd", params={"local-iters": 1, "tol": 0.0},
                        arrays=protocol.Centroids(centroids))

    def reduce(self, replies: list, box=None, merge=kmeans_on_centroids) -> np.ndarray | None:
        """Take a round's (validated) replies; the k starting centroids once the clusters
        have grown (or can grow no further, or the rounds are spent), else None.

        ``merge(means, k, seed, weights=counts)`` clusters the grown summary to k
        (default: weighted k-means; FFCM passes weighted fuzzy c-means).

        Fewer than k distinct grown clusters (the privacy floor or DP noise withheld the
        rest: a small site under DP) are completed with points uniform in ``box`` (the
        declared or clipping box), logged; without a box that is an error."""
        if not replies:
            raise FederationError("the divisive start: no site answered its round")
        site_means = np.stack([r.arrays.centroids for r in replies])
        site_counts = np.stack([r.arrays.counts for r in replies]).astype(np.float64)
        means = site_weighted_mean(site_means, site_counts, dynamic=True)
        counts = site_counts.sum(axis=0)
        kept = counts > 0  # withheld under the floor, or won by no row
        self.means, self.counts = means[kept], counts[kept]
        self.rounds += 1
        if (len(self.means) < OVERSPLIT * self.k and np.any(self.counts >= 2)
                and self.rounds < start_rounds(self.k)):
            return None
        distinct = len(np.unique(self.means, axis=0))
        if distinct >= self.k:
            return merge(self.means, self.k, self.seed, weights=self.counts)
        if box is None:
            secure = any(r.n_sites > 1 for r in replies)  # a secure round's decoded sum
            raise FederationError(
                f"the divisive start grew {distinct} distinct clusters, fewer than the k = "
                f"{self.k} asked for (after the privacy floor); use a smaller k or "
                "min-cluster-size, or give data-bounds" + (
                    "; under secure aggregation, a secagg-data-bound far above the data's "
                    "range also quantises the sums to nothing: bound the data tightly"
                    if secure else ""))
        log(logging.WARNING, "the divisive start grew %s distinct clusters of the k = %s "
            "(the privacy floor or the noise withheld the rest); the other %s start "
            "uniform in the box", distinct, self.k, self.k - distinct)
        extra = bounding_box_init(np.asarray(box[0])[None], np.asarray(box[1])[None],
                                  self.k - distinct, self.seed)
        return np.concatenate([np.unique(self.means, axis=0), extra])

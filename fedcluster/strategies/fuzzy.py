"""FFCM: federated fuzzy c-means.

Stallmann & Wilbik, "Towards federated clustering: a federated fuzzy c-means algorithm
(FFCM)" (2022); docs/explanation/algorithms.md section 5. Each round every sampled site runs
``local-iters`` fuzzy c-means iterations (fuzzifier m = ``fuzzifier``, Bezdek's
memberships) from the global centres and returns its centres and fuzzy weights
W_j = sum_i u_ij^m. The server aggregates with ``aggregation``:

- ``avg1``: c_j = sum_l W_j^(l) c_j^(l) / sum_l W_j^(l), per index j;
- ``avg2``: k-means with k clusters on all sites' centres, initialised at the previous
  global centres so that indices stay stable (unweighted as in the paper;
  ``weighted = true`` weights by W). Empty-cluster policy (the paper has none): a global
  centre that no site centre is nearest to takes its avg1 value, the W-weighted mean of
  what the sites computed for that index. Keeping it in place instead freezes a centre
  that starts away from the data for ever (every site's centre for that index drifts
  towards the data and is claimed by a better-placed global centre): on the G2 sets
  (uniform split) that froze a centre in about half the runs.

A run stops when sum_j ||c_j,t - c_j,t-1|| <= ``tol`` (the paper's rule), or when the
fuzzy objective J_m of the centres the sites received (each site sends its own, a sum
over all its groups) improved by less than ``score-tol`` (0: :data:`OBJECTIVE_TOL`)
relative in each of the last two rounds. Fuzzy c-means converges only linearly, slower
the fuzzier the partition, and its centres need not settle at all where they are
ill-determined: on ``digits`` and ``mnist`` at m = 2 all k centres gather near the
data's mean (central fuzzy c-means too), a site's hard argmax among them is arbitrary, and
the privacy floor withholds a different index at each site every round, so the centres
move by about 0.1-1 every round for ever while J_m stays flat. Initial centres: the sum-only
divisive start (the default, ``divisive.py``; its summary merged by weighted fuzzy c-means,
not k-means), uniform in the (declared or federated) bounding box (``init = "random"``,
seeded), or the k-FED round.
"""

from __future__ import annotations

import numpy as np

from fedcluster.common import protocol
from fedcluster.strategies.aggregate import (count_weighted_mean, fuzzy_on_centroids,
                                             weighted_lloyd)
from fedcluster.strategies.base import ClusteringStrategy, TaskPlan
from fedcluster.strategies.kfed import KFedOrRandomInit

#: FFCM's default ``score-tol``: measured with bench/quality.py (section
#: ``quality-ffcm-groups`` of BENCHMARKS.md).
OBJECTIVE_TOL = 1e-5


class FederatedFuzzyCMeans(KFedOrRandomInit, ClusteringStrategy):
    """FFCM with both of the paper's aggregations."""

    score_metric, default_score_tol = "fuzzy-objective", OBJECTIVE_TOL

    def train_task(self) -> TaskPlan:
        """A training round: ``local-iters`` fuzzy c-means iterations at each sampled
        site, at the run's fuzzifier (``fcm``)."""
        return TaskPlan(
            "fcm",
            params={"fuzzifier": self.config.fuzzifier, "local-iters": self.config.local_iters},
            arrays=protocol.Centroids(self.centroids),
            sample=True,
        )

    def merge_summary(self, means: np.ndarray, k: int, seed: int, weights: np.ndarray) -> np.ndarray:
        """The divisive start's summary merged by weighted fuzzy c-means at this run's
        fuzzifier: FFCM then starts in the basin of the summary's best J_m, not of its
        best k-means objective."""
        return fuzzy_on_centroids(means, k, seed, weights, self.config.fuzzifier)

    def evaluation_params(self) -> dict:
        """The evaluation's fuzzy figures: at the run's fuzzifier."""
        return {"fuzzifier": self.config.fuzzifier}

    def movement(self, new: np.ndarray, old: np.ndarray) -> float:
        """The paper's stopping rule: the sum of the centres' movements."""
        return float(np.linalg.norm(new - old, axis=1).sum())

    def reduce_train(self, plan, replies) -> np.ndarray:
        """avg1: the sites' centres weighted by their fuzzy weights per cluster; avg2:
        weighted k-means on every site's centres, from the current ones (a cluster no site
        reports takes avg1's)."""
        centres = np.stack([r.arrays.centres for r in replies])
        weights = np.stack([r.arrays.weights for r in replies])
        avg1 = count_weighted_mean(centres, weights, self.centroids)[0]
        if self.config.aggregation == "avg1":
            return avg1
        reported = weights > 0  # a withheld centre is only the received one: leave it out
        points, w = centres[reported], weights[reported]
        return weighted_lloyd(points, w if self.config.resolved_weighted else np.ones_like(w),
                              self.centroids, empty=avg1)

"""DWF and EWF: dynamically / equally weighted federated k-means.

Holzer, Jacob, Kavane, "Dynamically weighted federated k-means" (2023); docs/explanation/algorithms.md
section 1. Each round the sampled sites count their points per received centroid
(w_ij), run ``local-iters`` Lloyd iterations and return their centroids C_i; the server
averages them per cluster with weights lambda_ij (DWF: w_ij / sum_i w_ij; EWF: 1/|I_t|)
into D and moves C <- C + eta (D - C) + mu (C - C_old).

With every site sampled, ``local-iters`` 1, eta 1 and mu 0, DWF is exactly central
Lloyd (a test checks it to 1e-10).
"""

from __future__ import annotations

import numpy as np

from fedcluster.common import protocol
from fedcluster.strategies.aggregate import momentum_step, site_weighted_mean
from fedcluster.strategies.base import ClusteringStrategy, TaskPlan
from fedcluster.strategies.kfed import KFedOrRandomInit


class WeightedFedKMeans(KFedOrRandomInit, ClusteringStrategy):
    """DWF (``dynamic=True``) or EWF (``dynamic=False``) federated k-means."""

    def __init__(self, config, initial_centroids=None, *, dynamic: bool) -> None:
        super().__init__(config, initial_centroids)
        self.dynamic = dynamic

    def train_task(self) -> TaskPlan:
        return TaskPlan(
            "lloyd",
            params={"local-iters": self.config.local_iters, "tol": self.config.tol},
            arrays=protocol.Centroids(self.centroids),
            sample=True,
        )

    def reduce_train(self, plan, replies) -> np.ndarray:
        site_centroids = np.stack([r.arrays.centroids for r in replies])
        site_weights = np.stack([r.arrays.counts for r in replies])
        D = site_weighted_mean(site_centroids, site_weights, dynamic=self.dynamic)
        return momentum_step(
            self.centroids, D, self.previous, self.config.learning_rate, self.config.momentum
        )

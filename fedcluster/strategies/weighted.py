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
from fedcluster.strategies import aggregate
from fedcluster.strategies.aggregate import momentum_step, site_weighted_mean
from fedcluster.strategies.base import ClusteringStrategy, TaskPlan
from fedcluster.strategies.kfed import KFedOrRandomInit
from fedcluster.strategies.phases import Phase


class WeightedFedKMeans(KFedOrRandomInit, ClusteringStrategy):
    """DWF (``dynamic=True``) or EWF (``dynamic=False``) federated k-means.

    A plain training round (no SecAgg+, no DP, ``local-iters`` 1) also asks every site
    for the evaluation of the centroids it received (``protocol.EVALUATE_TOO``). When
    the round moves nothing (the new centroids are bitwise the received ones) and every
    admitted site answered, those ARE the evaluation of the new centroids: the
    repetition ends without an evaluation round (:meth:`reduce_round`).
    """

    #: Ask training rounds for the evaluation too (False: always an evaluation round).
    evaluates_with_training = True

    def __init__(self, config, initial_centroids=None, *, dynamic: bool) -> None:
        super().__init__(config, initial_centroids)
        self.dynamic = dynamic

    @property
    def score_best_patience(self) -> int | None:
        """EWF's score can cycle (equal weights are no descent: on split groups a run went
        round three scores until the cap), so EWF also stops when 5 rounds beat no earlier
        best; DWF's rises for a few rounds and falls on (``aggregate.score_stalled``)."""
        return None if self.dynamic else aggregate.BEST_PATIENCE

    def train_task(self) -> TaskPlan:
        """One training round: every sampled site runs ``local-iters`` Lloyd iterations from
        the centroids (``lloyd``); EWF asks each local cluster to hold at least two groups
        (``protocol.MIN_GROUPS``), and a one-iteration round without SecAgg+ or DP has the
        sites evaluate the centroids they received too (``protocol.EVALUATE_TOO``)."""
        config = self.config
        params = {"local-iters": config.local_iters, "tol": config.tol}
        if not self.dynamic:
            # EWF weighs every site's centroid alike, whatever its count: a cluster of one
            # group (at p_site >= 2 most often a lone row glued to its nearest neighbour)
            # would move a centroid as much as a site's whole cluster (BENCHMARKS.md).
            params[protocol.MIN_GROUPS] = 2
        if (self.evaluates_with_training and config.local_iters == 1
                and not config.secure_aggregation and not config.private
                and not self.reports_model()):  # the model's figures: the report's groups
            params[protocol.EVALUATE_TOO] = True
        return TaskPlan("lloyd", params=params, arrays=protocol.Centroids(self.centroids),
                        sample=True)

    def reduce_round(self, server_round: int, plan: TaskPlan, replies: list) -> dict:
        """The round as the base reduces it; a training round in which nothing moved and
        every site evaluated the centroids it received ends the repetition at once: those
        evaluations are the evaluation round's (one round fewer)."""
        row = super().reduce_round(server_round, plan, replies)
        if (plan.task == "lloyd" and self.phase == Phase.EVALUATE and row.get("movement") == 0.0
                and replies and all(r.evaluation is not None for r in replies)
                and {r.site_key for r in replies} == set(self.sites)
                and not any(site.at_limit for site in self.sites.values())):
            # nothing moved: the sites' evaluations of the received centroids are those
            # of the new ones, and every site an evaluation round would ask has answered
            self.finish_repetition([r.evaluation for r in replies])
            row["evaluated"] = True
        return row

    def reduce_train(self, plan, replies) -> np.ndarray:
        """The new centroids: the sites' centroids weighted by their counts (DWF) or
        alike (EWF) per cluster (``aggregate.site_weighted_mean``), then the server's step
        with learning rate eta and momentum mu (``aggregate.momentum_step``)."""
        site_centroids = np.stack([r.arrays.centroids for r in replies])
        site_weights = np.stack([r.arrays.counts for r in replies])
        D = site_weighted_mean(site_centroids, site_weights, dynamic=self.dynamic)
        return momentum_step(
            self.centroids, D, self.previous, self.config.learning_rate, self.config.momentum
        )

"""GTVMin k-means over a graph of sites (decentralised federated k-means).

Jung, "Federated k-means via generalized total variation minimization" (2022);
docs/explanation/algorithms.md section 6. Every site keeps its OWN centroids W_i (there is no global model
during training); sites are the nodes of a connected graph (``topology``, see
``common/topology.py``). Round 0: each site runs local k-means++ and Lloyd. Every later
round the server relays to each site the current centroids of its neighbours only (a
different payload per site), the site runs ``local-iters`` GTVMin updates (task ``gtv``,
kernel ``gtv_update``) and the server stores what comes back: the server only relays.

Per round the history records the mean GTV per edge
d(i, i') = sum_c min_c' ||w(i,c) - w(i',c')||^2 + the same with i, i' swapped, and the
mean and max local score L_i / n_i; with ``eval-every`` the pooled score of each site's
centroids (an ``evaluate_sets`` round, which shows every site's centroids to every
site). A run ends when no site's centroids move by ``tol`` or more (Frobenius norm), when
the mean local score stalls (``score-tol``; also when no round in
``aggregate.BEST_PATIENCE`` beats the best before them: on split groups the local scores
cycle), or after ``num-rounds``. Then every site's centroids are scored on the pooled
data and the consensus model is chosen: ``consensus = "kmeans"`` (the default) runs k-means on all
sites' centroids weighted by their members, ``"best-site"`` takes the centroids of the
site with the lowest POOLED score (docs/explanation/algorithms.md says lowest local score;
a site with an easy local data set would win that while fitting the federation badly).
Then up to ``consensus-rounds`` federated Lloyd rounds (every site, one local iteration,
count-weighted: DWF's step) refine the consensus, until it moves less than ``tol``. Why:
on label-skewed sites no site has seen every cluster, and the best site's centroids fit
the federation 1.17 x central k-means in the median and 2.2 x at the 90th percentile
(bench/quality.py, 21 sets, Dirichlet 0.3); refined, 1.007 / 1.45; the weighted k-means
consensus refined, 1.0000 / 1.009. The consensus goes through the usual exact evaluation.
"""

from __future__ import annotations

import logging

import numpy as np
from flwr.common.logger import log

from fedcluster.common import protocol
from fedcluster.common.kernels import frobenius
from fedcluster.strategies.topology import TopologyError, build_topology, edges
from fedcluster.strategies import aggregate
from fedcluster.strategies.aggregate import gtv_distance, kmeans_on_centroids, site_weighted_mean
from fedcluster.strategies.base import ClusteringStrategy, TaskPlan
from fedcluster.strategies.errors import FederationError
from fedcluster.strategies.reply import Reply
from fedcluster.strategies.phases import Phase


class GTVKMeans(ClusteringStrategy):
    """Decentralised k-means: sites' own centroids coupled along the edges of a graph."""

    # its local scores cycle on split groups: also stop when 5 rounds beat no earlier best
    score_best_patience = aggregate.BEST_PATIENCE

    @property
    def extra_rounds_per_repetition(self) -> int:
        """The evaluate_sets round before the consensus, and its refining rounds."""
        return 1 + self.config.consensus_rounds
    # its first round (local k-means++ and the first GTV step) starts its training phase,
    # which needs the graph of the admitted sites: not carried by describe
    carries_first_task = False

    # ------------------------------------------------------------- state
    def reset_repetition(self) -> None:
        """A repetition's state: no site centroids, scores or refining yet."""
        super().reset_repetition()
        self.site_centroids: dict[str, np.ndarray] = {}
        self.site_counts: dict[str, np.ndarray] = {}  # members per site centroid
        self.local_scores: dict[str, float] = {}
        self.pooled_scores: dict[str, float] = {}
        self.scored_sets: list[str] = []
        self.sets_scored = False
        self.site_movement = float("nan")
        self.last_round: dict = {}
        self.refine_round = 0

    def continue_from(self, previous: ClusteringStrategy) -> None:
        """Choose-k's next k: the same sites, so the same graph."""
        super().continue_from(previous)
        self.neighbours = previous.neighbours

    def admit_sites(self, replies: list[Reply]) -> None:
        """Admit the sites (a site without a stable ``site-id`` is rejected: the graph's
        edges name sites by it) and build the graph over them (``topology``)."""
        named = []
        for r in replies:
            if r.metrics.get("site-id-given", True):
                named.append(r)
                continue
            self.rejected[r.site_key] = (
                "algorithm gtv needs a stable site id: set `site-id` in this site's node "
                "config (the graph's edges name sites by it)"
            )
            log(logging.ERROR, "site %s rejected: %s", r.site_key, self.rejected[r.site_key])
        super().admit_sites(named)
        try:
            self.neighbours = build_topology(
                self.config.topology, [s.key for s in self.ordered_sites()], self.config.seed
            )
        except TopologyError as err:
            raise FederationError(str(err)) from None
        log(logging.INFO, "gtv: %s graph, %s sites, %s edges", self.config.topology,
            len(self.neighbours), len(edges(self.neighbours)))

    # ------------------------------------------------------------- tasks
    def _params(self) -> dict:
        return {"alpha": self.config.alpha, "local-iters": self.config.local_iters,
                "tol": self.config.tol, "n-clusters": self.k}

    def init_task(self) -> TaskPlan:
        """Round 0: ``gtv`` without centroids: each site starts from k-means++ seeds on its
        own groups (seeded per site) and runs its local step."""
        return TaskPlan("gtv", params=self._params(), seed_base=(self.seed,))

    def train_task(self) -> TaskPlan:
        """A training round: each sampled site gets its own centroids and its
        neighbours' and runs the GTV step (``gtv``); a site without centroids starts locally."""
        empty = np.zeros((0, self.k, self.n_features))
        payloads = {}
        for site in self.ordered_sites():
            own = self.site_centroids.get(site.key)
            if own is None:  # no centroids yet (it failed round 0): it starts locally
                payloads[site.key] = protocol.SiteGraphState()
                continue
            near = [self.site_centroids[j] for j in self.neighbours[site.key]
                    if j in self.site_centroids]
            payloads[site.key] = protocol.SiteGraphState(own, np.stack(near) if near else empty)
        return TaskPlan("gtv", params=self._params(), sample=True,
                        seed_base=(self.seed, self.train_round + 1),
                        per_site_arrays=payloads)

    def plan_algorithm_round(self) -> TaskPlan:
        """GTV's own rounds: a refining Lloyd round from the consensus, and the
        scoring of every site's centroids on all sites (``evaluate_sets``); else the base's."""
        if self.phase == Phase.REFINE:  # a federated Lloyd step from the consensus
            return TaskPlan("lloyd", params={"local-iters": 1, "tol": 0.0},
                            arrays=protocol.Centroids(self.centroids))
        if self.phase == Phase.INTERIM or (self.phase == Phase.EVALUATE and not self.sets_scored):
            self.scored_sets = [s.key for s in self.ordered_sites() if s.key in self.site_centroids]
            sets = np.stack([self.site_centroids[key] for key in self.scored_sets])
            return TaskPlan("evaluate_sets", arrays=protocol.CentroidSets(sets), max_rows=len(self.scored_sets))
        return super().plan_algorithm_round()

    # ------------------------------------------------------------ reduce
    def _store(self, replies: list[Reply]) -> float:
        """Keep each site's new centroids; the largest move of any site's centroids."""
        moves = []
        for r in replies:
            old = self.site_centroids.get(r.site_key)
            self.site_centroids[r.site_key] = r.arrays.centroids
            self.site_counts[r.site_key] = np.asarray(r.arrays.counts, dtype=np.float64)
            self.local_scores[r.site_key] = r.metrics["sse"] / r.n_rows
            if old is not None:
                moves.append(frobenius(r.arrays.centroids - old))
        scores = list(self.local_scores.values())
        self.last_round = {
            "gtv-per-edge": self.gtv_per_edge(),
            "local-score-mean": float(np.mean(scores)) if scores else float("nan"),
            "local-score-max": float(np.max(scores)) if scores else float("nan"),
        }
        return max(moves) if moves else float("inf")

    def reduce_init(self, plan: TaskPlan, replies: list[Reply]) -> np.ndarray:
        """Keep each site's centroids; the consensus is the run's centroids."""
        if not replies:
            raise FederationError("gtv: no site returned its initial centroids")
        self._store(replies)
        return self.consensus()

    def reduce_train(self, plan: TaskPlan, replies: list[Reply]) -> np.ndarray:
        """Keep each site's new centroids; the consensus is the run's centroids."""
        self.site_movement = self._store(replies)
        return self.consensus()

    def movement(self, new: np.ndarray, old: np.ndarray) -> float:
        """The largest movement of any site's own centroids this round."""
        return self.site_movement

    def round_metrics(self) -> dict:
        """This round's GTV per edge and the sites' local scores."""
        return dict(self.last_round)

    def start_training(self, centroids: np.ndarray) -> None:
        """Given initial centroids: every site starts there."""
        if not self.site_centroids:  # given initial centroids: every site starts there
            self.site_centroids = {s.key: np.array(centroids, dtype=np.float64)
                                   for s in self.ordered_sites()}
        super().start_training(centroids)

    def reduce_round(self, server_round: int, plan: TaskPlan, replies: list[Reply]) -> dict:
        """GTV's own rounds (refining, scoring every site's centroids); else the
        base's reduction."""
        if plan.task == "lloyd":
            return self._refine(replies)
        if plan.task != "evaluate_sets":
            return super().reduce_round(server_round, plan, replies)
        self.require_answers(replies, plan.task)
        if not replies:
            raise FederationError("gtv: no site scored the sites' centroids")
        total = np.sum([r.arrays.sse for r in replies], axis=0)
        n_rows = sum(r.n_rows for r in replies)
        self.pooled_scores = {key: float(v) for key, v in zip(self.scored_sets, total / n_rows)}
        values = list(self.pooled_scores.values())
        if self.phase == Phase.INTERIM:
            self.phase = Phase.TRAIN
        else:
            self.sets_scored = True
            self.centroids = self.consensus()
            if self.config.consensus_rounds > 0:
                self.phase = Phase.REFINE
        return {"pooled-score-best": min(values), "pooled-score-mean": float(np.mean(values)),
                "pooled-score-worst": max(values)}

    def _refine(self, replies: list[Reply]) -> dict:
        """One refining round: the count-weighted mean of the sites' means per cluster (a
        cluster no site reports keeps its centroid), until it moves less than ``tol``."""
        self.require_answers(replies, "lloyd")
        self.refine_round += 1
        row = {"movement": float("nan"), "score": float("nan")}
        if replies:
            new = site_weighted_mean(np.stack([r.arrays.centroids for r in replies]),
                                     np.stack([r.arrays.counts for r in replies]), dynamic=True)
            row = {"movement": frobenius(new - self.centroids),
                   "score": sum(r.metrics["sse"] for r in replies) / sum(r.n_rows for r in replies)}
            self.centroids = new
        if row["movement"] < self.config.tol or self.refine_round >= self.config.consensus_rounds:
            self.phase = Phase.EVALUATE
        return row

    def finish_repetition(self, replies: list[Reply]) -> dict:
        """The base's, keeping the sites' own centroids, their pooled scores, the
        consensus site and GTV per edge in the repetition."""
        kept = {
            "site-centroids": dict(self.site_centroids),
            "site-scores": dict(self.pooled_scores),
            "consensus-site": self.consensus_site(),
            "gtv-per-edge": self.gtv_per_edge(),
        }
        row = super().finish_repetition(replies)  # may start the next repetition
        self.repetitions[-1].update(kept)
        return row

    # ------------------------------------------------------------ figures
    def gtv_per_edge(self) -> float:
        """Mean d(i, i') over the graph's edges whose two sites have centroids."""
        values = [gtv_distance(self.site_centroids[a], self.site_centroids[b])
                  for a, b in edges(self.neighbours)
                  if a in self.site_centroids and b in self.site_centroids]
        return float(np.mean(values)) if values else float("nan")

    def consensus_site(self) -> str:
        """The site whose centroids score best: pooled score once known, else local."""
        scores = self.pooled_scores or self.local_scores
        return min(scores, key=lambda key: (scores[key], key))

    def consensus(self) -> np.ndarray:
        """One (k, d) model from the sites' centroids (``consensus``)."""
        if self.config.consensus == "kmeans":
            keys = [s.key for s in self.ordered_sites() if s.key in self.site_centroids]
            points = np.concatenate([self.site_centroids[key] for key in keys])
            # weighted by members: a site's centroid of 3 rows is not one of 300
            weights = np.concatenate([self.site_counts.get(key, np.ones(self.k))
                                      for key in keys])
            try:
                return kmeans_on_centroids(points[weights > 0], self.k, self.seed,
                                           weights=weights[weights > 0])
            except ValueError:  # fewer than k distinct centroids: every site agrees
                pass
        return np.array(self.site_centroids[self.consensus_site()], dtype=np.float64)

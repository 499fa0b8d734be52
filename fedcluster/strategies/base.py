"""The strategy base shared by every algorithm: a Flower ``Strategy`` run as phases.

Every federated round is a Flower fit round carrying one task of ``common/protocol.py``
(the site runs it: ``client_app/tasks.py``). A run goes through these phases, each with
its task (:attr:`ClusteringStrategy.PHASE_TASKS`; ``phases.py`` defines them):

1. ``describe`` (once, every available site): size, width and feature names; the sites
   are admitted or rejected with a logged reason (``sites.py``). A schema that imputes
   adds an ``impute`` round (the pooled fill), ``scale`` a ``stats`` round; the global
   transform they give travels with every later task. The describe message carries the
   run's first task when it can (``preparation.py``).
2. ``init`` (per n-init repetition): the algorithm's initialisation task, one round or,
   for a start that grows (``divisive.py``), until :meth:`reduce_init` has centroids.
3. ``train`` (up to ``num-rounds`` rounds): sampled sites (fraction C, seeded) run the
   algorithm's site step; the subclass reduces the replies to new centroids, until the
   centroid movement ||C_t - C_{t-1}||_F < ``tol`` (or, with ``score-tol``, the score
   has stopped improving: ``sites.score_stalled``).
4. ``evaluate`` (one round, all sites): the EXACT pooled score sum SSE_i / sum n_i of the
   repetition's centroids; with ``n-init`` > 1 the lowest score wins. Then
   ``distances`` (Davies-Bouldin's second pass, to the pooled means) ends the run, unless
   the evaluation's own distances (to the centroids) already are those: when the pooled
   means are the centroids (:func:`metrics.means_are_centroids`, a converged run), or
   under DP (Davies-Bouldin is not released; the sites would answer zeros).
5. ``profile`` (one or two rounds, all sites): Table 1 by cluster (``profile.py``), unless
   the run is private, a k-range or sets ``profile = false``.

Subclasses provide the algorithm through public hooks, in the style of Flower's FedAvg:
:meth:`init_task` / :meth:`reduce_init` / :meth:`init_rounds`, :meth:`train_task` /
:meth:`reduce_train`, :meth:`movement`, :meth:`evaluation_params`, :meth:`round_metrics`, :meth:`can_stop`,
:meth:`admit_sites`, and (GTV) :meth:`plan_round`, :meth:`reduce_round`,
:meth:`start_training`, :meth:`reset_repetition`, :meth:`finish_repetition`. The maths
live in pure functions (``aggregate.py``); replies are validated before they are reduced
(``validation.py``), failures are logged and dropped, and replies are reduced in a stable
site order, so every engine gives the same numbers. With ``secure-aggregation`` the sum
rounds run under SecAgg+ and their decoded sum is ONE reply standing for the N sites
(``secure_sum.py``).
"""

from __future__ import annotations

import json
import logging

import numpy as np
from flwr.common import FitIns, Parameters, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.common.logger import log
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import Strategy

from fedcluster.common import protocol, scaling, secure_codec as secure
from fedcluster.common.config import RunConfig
from fedcluster.common.kernels import frobenius
from fedcluster.strategies import metrics, preparation, private, profile, reports, secure_sum, sites
from fedcluster.strategies.errors import FederationError
from fedcluster.strategies.phases import PROFILE_PHASES, Phase
from fedcluster.strategies.sites import Site, site_order
from fedcluster.strategies.task_plan import TaskPlan
from fedcluster.strategies.validation import Reply


class ClusteringStrategy(Strategy):
    """Phases, sampling, privacy floor, validation, convergence, history and n-init."""

    #: False for one-shot algorithms (k-FED): evaluate right after the init round.
    has_training = True
    #: Rounds a repetition adds to init + training + evaluate (GTV scores every site).
    extra_rounds_per_repetition = 0
    #: Davies-Bouldin from the evaluation when the means are the centroids (False: a second pass).
    fold_distances = True
    #: Send the run's first task with the describe handshake when it can (``preparation.py``).
    carries_first_task = True

    def __init__(self, config: RunConfig, initial_centroids: np.ndarray | None = None) -> None:
        super().__init__()
        self.config = config
        self.k = config.n_clusters
        self.initial_centroids = initial_centroids
        # Choose-k's warm start: the first repetition starts here, the others (n-init) cold.
        self.warm_start: np.ndarray | None = None
        self.transform: scaling.FeatureTransform | None = None
        self.sites: dict[str, Site] = {}
        self.rejected: dict[str, str] = {}
        # Per site key: every failed or dropped reply, "round N (task): reason".
        self.site_failures: dict[str, list[str]] = {}
        self.round_failures: list[str] = []  # this round's, named if too few sites answered
        self.history: list[dict] = []
        self.repetitions: list[dict] = []  # one per n-init seed: score, centroids
        self.phase = Phase.DESCRIBE
        self.repetition = 0
        self.finished = False
        self.final_metrics: dict = {}
        self._pending: tuple[TaskPlan, dict[int, str]] | None = None
        # Resuming from a checkpoint: the phase to go back to after the sites have
        # described themselves again, and the rounds run before (history numbering).
        self._resume_phase: str | None = None
        self.round_offset = 0
        # data-bounds / differential privacy (strategies/private.py): the clipping box,
        # whether it came from the sites' data, and the zCDP share of each data round.
        self.box: tuple[np.ndarray, np.ndarray] | None = None
        self.bounds_from_data = False
        self.dp_rho_round = private.rho_per_round(config)
        # Table 1 by cluster (profile.py): its rows, its bins' range, why it is missing.
        self.profile_table, self.profile_range, self.profile_note = None, None, ""
        self.reset_repetition()

    # ----------------------------------------------------------------- hooks
    def init_task(self) -> TaskPlan:
        """The initialisation round's task."""
        raise NotImplementedError

    def reduce_init(self, plan: TaskPlan, replies: list[Reply]) -> np.ndarray | None:
        """Initial (k, d) centroids from the init round's replies (None: another round)."""
        raise NotImplementedError

    def init_rounds(self) -> int:
        """The most rounds ``init_task`` takes (a multi-round start says more)."""
        return 1

    def init_without_round(self) -> np.ndarray | None:
        """Initial centroids that need no site round (None: run ``init_task``)."""
        return None

    def train_task(self) -> TaskPlan:
        """One training round's task, given ``self.centroids``."""
        raise NotImplementedError

    def reduce_train(self, plan: TaskPlan, replies: list[Reply]) -> np.ndarray:
        """New (k, d) centroids from one training round's replies."""
        raise NotImplementedError

    # A round's score: this training metric per row; when it stalls: sites.score_stalled.
    score_metric, default_score_tol, score_best_patience = "sse", None, None

    def movement(self, new: np.ndarray, old: np.ndarray) -> float:
        """How far the centroids moved this round (compared with ``tol``)."""
        return frobenius(new - old)

    def evaluation_params(self) -> dict:
        """Extra parameters of the ``evaluate`` task (FFCM asks for its fuzzy figures)."""
        return {}

    def round_metrics(self) -> dict:
        """Extra history columns of the training round just reduced (GTV: GTV per edge)."""
        return {}

    def can_stop(self) -> bool:
        """Whether a repetition may stop on small movement (a subclass may wait)."""
        return True

    def max_server_rounds(self) -> int:
        """The most server rounds a run can take (the loop's bound): describe, impute, stats, per
        repetition init + rounds + interims + evaluate (+ extras), Davies-Bouldin's, profile's 2."""
        c = self.config
        interim = c.num_rounds // c.eval_every if c.eval_every else 0
        return 6 + c.n_init * (c.num_rounds + interim + 1 + self.init_rounds()
                               + self.extra_rounds_per_repetition)

    def admit_sites(self, replies: list[Reply]) -> None:
        """Admit the sites of the describe round (``sites.admit``); GTV adds its graph."""
        sites.admit(self, replies)

    def begin_resume(self) -> None:
        """Resume: a describe round (node ids change, site ids do not), then the phase."""
        self._resume_phase = self.phase
        self.round_offset = max((row["round"] for row in self.history), default=0)
        self.phase = Phase.DESCRIBE

    # ------------------------------------------------------------ properties
    @property
    def seed(self) -> int:
        """The seed of the current n-init repetition."""
        return self.config.seeds[self.repetition]

    @property
    def n_features(self) -> int:
        return next(iter(self.sites.values())).n_features

    @property
    def feature_names(self) -> list[str]:
        names = [s.feature_names for s in self.sites.values() if s.feature_names]
        return names[0] if names else []

    def ordered_sites(self) -> list[Site]:
        return sorted(self.sites.values(), key=lambda s: site_order(s.key))

    def reset_repetition(self) -> None:
        self.centroids: np.ndarray | None = None
        self.previous: np.ndarray | None = None
        self.train_round = 0
        self.last_movement = float("nan")

    # ------------------------------------------------------ Flower interface
    def initialize_parameters(self, client_manager: ClientManager) -> Parameters | None:
        return ndarrays_to_parameters([])

    def configure_fit(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, FitIns]]:
        available = client_manager.all()
        if self.phase == Phase.DESCRIBE:
            plan = TaskPlan("describe", carries=preparation.carried_task(self))
            targets = {int(p.node_id): p for p in available.values()}
            keys = {node_id: "" for node_id in targets}
        else:
            plan = self.plan_round()
            usable = [s for s in self.ordered_sites()
                      if str(s.node_id) in available and not s.at_limit]
            if plan.sample:
                usable = sites.sample(self, usable)
            targets = {s.node_id: available[str(s.node_id)] for s in usable}
            keys = {s.node_id: s.key for s in usable}
        base = {"task": plan.task, "min-cluster-size": self.config.min_cluster_size,
                protocol.ROUND: server_round + self.round_offset, **plan.params}
        if plan.carries is not None:  # the run's first task, answered with describe
            base.update({**plan.carries.params, protocol.THEN: plan.carries.task})
        if seed_base := plan.seed_base or (plan.carries and plan.carries.seed_base):  # site-drawn
            base[protocol.SEED_BASE] = json.dumps([int(v) for v in seed_base])
        if secure_sum.is_secure_round(self):
            plan.secure = secure_sum.terms_and_scales(self, plan, [self.sites[k] for k in keys.values()])
            # clip: distributed DP's noise-margin case (secure.encode says why)
            base[secure.SECURE_PARAM] = json.dumps(
                {"terms": plan.secure[0], "scales": plan.secure[1], "clip": self.config.private})
        if self.transform is not None and plan.task not in ("describe", "impute_stats"):
            base["transform"] = self.transform.encode()
        base.update(private.task_params(self, plan.task, server_round, len(keys)))
        shared = ndarrays_to_parameters(protocol.to_arrays(plan.arrays))
        self._pending = (plan, keys)

        def parameters(key: str) -> Parameters:
            own = plan.per_site_arrays.get(key)
            return shared if own is None else ndarrays_to_parameters(protocol.to_arrays(own))

        return [
            (proxy, FitIns(parameters(keys[node_id]),
                           {**base, **plan.per_site.get(keys[node_id], {})}))
            for node_id, proxy in targets.items()
        ]

    def aggregate_fit(self, server_round, results, failures):
        plan, keys = self._pending
        replies, failed = [], []
        in_sum = []  # a secure round's sites in the sum
        if plan.secure is not None:  # SecAgg+'s failures carry no node id: see below
            replies = secure_sum.secure_replies(self, server_round, plan, keys, results, failures,
                                                failed)
            in_sum = [keys[int(proxy.node_id)] for proxy, _ in results] if replies else []
            results, failures = [], []
        failed += sites.record_failures(self, server_round, plan.task, keys, failures)
        received = []
        for proxy, res in results:
            node_id = int(proxy.node_id)
            metrics = dict(res.metrics)
            key = str(metrics.get(protocol.SITE_KEY, keys.get(node_id) or f"node-{node_id}"))
            arrays = parameters_to_ndarrays(res.parameters)
            if plan.carries is not None:
                plan.carries.received[node_id] = (arrays, metrics, res.num_examples)
            received.append((node_id, key, arrays, metrics, res.num_examples))
        checked, dropped = sites.check_replies(self, server_round, plan, keys, received)
        replies = sorted(replies + checked, key=lambda r: site_order(r.site_key))
        failed += dropped
        for reason in failed:
            log(logging.WARNING, "round %s (%s): dropped %s", server_round, plan.task, reason)
        self.round_failures = failed
        row = self.reduce_round(server_round, plan, replies)
        row.update({"round": server_round + self.round_offset, "repetition": self.repetition,
                    "task": plan.label, **sites.participation(keys, replies, failed, in_sum, self.sites)})
        self.history.append(row)
        row.update(private.round_accounting(self.config, self.history))
        out = [] if self.centroids is None else [self.centroids]
        return ndarrays_to_parameters(out), {}

    @property
    def round_plan(self) -> tuple[TaskPlan, dict[int, str]]:
        """The round :meth:`configure_fit` planned last: its plan, and the asked sites'
        keys by node id ("" before the describe round has named them)."""
        return self._pending

    def configure_evaluate(self, server_round, parameters, client_manager):
        return []  # evaluation is a fit-round task (see module docstring)

    def aggregate_evaluate(self, server_round, results, failures):
        return None, {}

    def evaluate(self, server_round, parameters):
        return None

    # --------------------------------------------------------------- phases
    #: Which task each phase sends: the hook that plans it (``describe`` is planned by
    #: ``configure_fit`` itself: it goes to every available site, not just the usable ones).
    PHASE_TASKS = {
        Phase.IMPUTE: "impute_task",
        Phase.STATS: "stats_task",
        Phase.INIT: "init_task",
        Phase.TRAIN: "train_task",
        Phase.EVALUATE: "evaluate_task",
        Phase.INTERIM: "evaluate_task",
        Phase.DISTANCES: "distances_task",
    }

    def plan_round(self) -> TaskPlan:
        """This round's task, by the phase -> task table (GTV adds its scoring round)."""
        if self.phase in PROFILE_PHASES:
            return profile.plan(self)
        if self.phase not in self.PHASE_TASKS:
            raise RuntimeError(f"no task in phase {self.phase}")
        return getattr(self, self.PHASE_TASKS[self.phase])()

    def stats_task(self) -> TaskPlan:
        return TaskPlan("stats", params={"scale": self.config.scale})

    def impute_task(self) -> TaskPlan:
        return preparation.impute_task(self)

    def evaluate_task(self) -> TaskPlan:
        return TaskPlan("evaluate", params=self.evaluation_params(),
                        arrays=protocol.Centroids(self.centroids))

    def distances_task(self) -> TaskPlan:
        best = self.best
        return TaskPlan("evaluate_distances",
                        arrays=protocol.CentroidsAndMeans(best["centroids"], best["stats"].means))

    def reduce_round(self, server_round: int, plan: TaskPlan, replies: list[Reply]) -> dict:
        if self.phase in PROFILE_PHASES:
            return profile.reduce(self, plan, replies)
        if plan.task == "describe" and self._resume_phase is not None:
            sites.readmit(self, replies)
            self.phase, self._resume_phase = self._resume_phase, None
            log(logging.INFO, "resumed from a checkpoint after round %s, phase %s",
                self.round_offset, self.phase)
            return {"sites-usable": len(self.sites)}
        if plan.task in preparation.TASKS:
            return preparation.reduce(self, server_round, plan, replies)
        sites.require_answers(self, replies, plan.task)
        if plan.task == "evaluate" and self.phase == Phase.INTERIM:
            # eval-every: the exact score of the current centroids over all sites
            self.phase = Phase.TRAIN
            stats = metrics.pool([reports.site_stats(r) for r in replies])
            return {"score": stats.sse / stats.n_rows}
        if plan.task == "evaluate":
            return self.finish_repetition(replies)
        if plan.task == "evaluate_distances":
            return self._finish_run(np.sum([r.arrays.distances for r in replies], axis=0)
                                    if replies else None)
        if self.phase == Phase.INIT:
            self.take_init(plan, replies)
            return {}
        # train
        self.train_round += 1
        if not replies:  # nobody answered: the centroids stay, the round still counts
            if self.train_round >= self.config.num_rounds:
                self.phase = Phase.EVALUATE
            return {"movement": float("nan"), "score": float("nan")}
        # The score of the centroids the sites received, where every site reported it.
        score = float("nan")
        if all(self.score_metric in r.metrics for r in replies):
            score = sum(r.metrics[self.score_metric] for r in replies) / sum(r.n_rows for r in replies)
        new = self.reduce_train(plan, replies)
        movement = self.movement(new, self.centroids)
        self.previous, self.centroids = self.centroids, new
        self.last_movement = movement
        scores = [h["score"] for h in self.history if "movement" in h and h["repetition"] == self.repetition]
        stalled = sites.score_stalled(self, [*scores, score])
        converged = (movement < self.config.tol or stalled) and self.can_stop()
        if converged or self.train_round >= self.config.num_rounds:
            self.phase = Phase.EVALUATE
        elif self.config.eval_every and self.train_round % self.config.eval_every == 0:
            self.phase = Phase.INTERIM
        return {"movement": movement, "score": score, **self.round_metrics()}

    def _begin_repetition(self) -> None:
        self.reset_repetition()
        if self.box is None:
            self.box = private.declared_box(self.config, self.n_features)
        start = self.initial_centroids
        if start is None and self.repetition == 0:
            start = self.warm_start
        if start is None:
            start = self.init_without_round()
        private.check_start(self.config, self.box, start)
        if start is not None:
            self.start_training(np.array(start, dtype=np.float64))
        else:
            self.phase = Phase.INIT

    def continue_from(self, previous: "ClusteringStrategy") -> None:
        """Skip ``describe`` and ``stats``: take the sites, rejections and transform of a
        finished run on the same federation (choose-k runs one strategy per k)."""
        self.sites = dict(previous.sites)
        self.rejected = dict(previous.rejected)
        self.transform = previous.transform
        self._begin_repetition()

    def take_init(self, plan: TaskPlan, replies: list[Reply]) -> None:
        """Reduce an init round; train from its centroids (None: the start goes on)."""
        if (start := self.reduce_init(plan, replies)) is not None:
            self.start_training(start)

    def start_training(self, centroids: np.ndarray) -> None:
        if centroids.shape != (self.k, self.n_features) or not np.isfinite(centroids).all():
            raise FederationError(f"initial centroids have shape {centroids.shape}, expected ({self.k}, "
                                  f"{self.n_features}) and all finite (a NaN or inf is not a start)")
        self.centroids = centroids
        self.previous = centroids.copy()
        self.phase = Phase.TRAIN if self.has_training else Phase.EVALUATE

    def finish_repetition(self, replies: list[Reply]) -> dict:
        stats = metrics.pool([reports.site_stats(r) for r in replies])
        # Under secure aggregation there is no site's own reply to report.
        per_site = {r.site_key: reports.site_report(r, self.config.min_cluster_size)
                    for r in replies if r.n_sites == 1 and not self.config.secure_aggregation}
        score = stats.sse / stats.n_rows
        self.repetitions.append(
            {
                "seed": self.seed,
                "score": score,
                "stats": stats,
                "per-site": per_site,
                "centroids": self.centroids,
                "rounds": self.train_round,
                "movement": self.last_movement,
                # summed distances to the centroids (Davies-Bouldin's, if the means are those)
                "distances": np.sum([r.arrays.distances for r in replies], axis=0),
            }
        )
        if self.repetition + 1 < self.config.n_init:
            self.repetition += 1
            self._begin_repetition()
        elif self.config.private:  # Davies-Bouldin is not released under DP: no second pass
            self._finish_run(np.zeros(self.k))
        elif self.fold_distances and metrics.means_are_centroids(self.best["stats"],
                                                                 self.best["centroids"]):
            self._finish_run(self.best["distances"])
        else:
            self.phase = Phase.DISTANCES
        return {"score": score}

    def _finish_run(self, distances: np.ndarray | None) -> dict:
        """Davies-Bouldin's distances known: the final metrics of the best repetition."""
        best = self.best
        self.final_metrics = metrics.compute_metrics(best["stats"], distances)
        self.phase = profile.first_phase(self) or Phase.DONE
        self.finished = self.phase == Phase.DONE
        return {"score": self.final_metrics["score"]}

    @property
    def best(self) -> dict:
        """The repetition with the lowest global score."""
        return min(self.repetitions, key=lambda r: r["score"])

"""The algorithm base: a repetition's phases on the run controller (``run.py``).

Per n-init repetition: ``init`` (the algorithm's initialisation task, one round or, for a
start that grows, ``divisive.py``, until :meth:`ClusteringStrategy.reduce_init` has
centroids), ``train`` (up to ``num-rounds`` rounds: sampled sites, fraction C, seeded, run
the algorithm's site step and the algorithm reduces their replies to new centroids, until
the movement ||C_t - C_{t-1}||_F < ``tol`` or, with ``score-tol``, the score has stopped
improving: ``stopping.py``), and ``evaluate`` (one round, all sites: the EXACT pooled
score sum SSE_i / sum n_i; with ``n-init`` > 1 the lowest score wins). Then
``distances`` (Davies-Bouldin's second pass, to the pooled means) ends the run, unless
the evaluation's own distances already are those: when the pooled means are the
centroids (:func:`metrics.means_are_centroids`, a converged run), or under DP.

An algorithm provides the hooks, in the style of Flower's FedAvg: :meth:`init_task` /
:meth:`reduce_init` / :meth:`init_rounds` / :meth:`init_without_round`,
:meth:`train_task` / :meth:`reduce_train`, :meth:`movement`, :meth:`evaluation_params`,
:meth:`round_metrics`, :meth:`can_stop`, and (GTV) :meth:`plan_algorithm_round`,
:meth:`reduce_algorithm_round`, :meth:`start_training`, :meth:`reset_repetition`,
:meth:`finish_repetition`, ``admit_sites``. The maths live in pure functions
(``aggregate.py``); replies are validated before they are reduced
(``round_replies.py``) and reduced in a stable site order, so every engine gives the
same numbers. With ``secure-aggregation`` the sum rounds run under SecAgg+ and their
decoded sum is ONE reply standing for the N sites (``secure_sum.py``).
"""

from __future__ import annotations

import numpy as np

from fedcluster.common import protocol
from fedcluster.common.kernels import frobenius
from fedcluster.strategies import metrics, private, profile, report_round, reports, state, stopping
from fedcluster.strategies.errors import FederationError
from fedcluster.strategies.phases import Phase
from fedcluster.strategies.run import Run
from fedcluster.strategies.run_result import RunResult
from fedcluster.strategies.task_plan import TaskPlan
from fedcluster.strategies.reply import Reply


class ClusteringStrategy(Run):
    """A clustering algorithm's repetitions: init, training, evaluation, n-init."""

    #: False for one-shot algorithms (k-FED): evaluate right after the init round.
    has_training = True
    #: Rounds a repetition adds to init + training + evaluate (GTV scores every site).
    extra_rounds_per_repetition = 0
    #: Davies-Bouldin from the evaluation when the means are the centroids (False: a second pass).
    fold_distances = True

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

    # A round's score: this training metric per row; when it stalls: stopping.score_stalled.
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
        repetition init + rounds + interims + evaluate (+ extras), the report's evaluation,
        Davies-Bouldin's, profile's 2."""
        c = self.config
        interim = c.num_rounds // c.eval_every if c.eval_every else 0
        return 7 + c.n_init * (c.num_rounds + interim + 1 + self.init_rounds()
                               + self.extra_rounds_per_repetition)

    def carried_start(self) -> TaskPlan | None:
        """The start's task as the describe round may carry it: none from given centroids
        (checked against the width first) or for a start that grows (its centroids have
        the width)."""
        if self.initial_centroids is not None or self.warm_start is not None:
            return None
        if self.init_rounds() > 1:
            return None
        return self.init_task()

    # --------------------------------------------------------------- phases
    #: Which task each of the algorithm's phases sends: the hook that plans it.
    PHASE_TASKS = {
        Phase.INIT: "init_task",
        Phase.TRAIN: "train_task",
        Phase.EVALUATE: "evaluate_task",
        Phase.INTERIM: "evaluate_task",
        Phase.DISTANCES: "distances_task",
    }

    def plan_algorithm_round(self) -> TaskPlan:
        """This round's task, by the phase -> task table (GTV adds its scoring round)."""
        if self.phase not in self.PHASE_TASKS:
            raise RuntimeError(f"no task in phase {self.phase}")
        return getattr(self, self.PHASE_TASKS[self.phase])()

    def evaluate_task(self) -> TaskPlan:
        """The evaluation round: the exact figures of the current centroids; of the final
        model's, over the report's groups (:meth:`reports_model`)."""
        params = self.evaluation_params()
        if self.phase == Phase.EVALUATE and self.reports_model():
            params = {**params, protocol.REPORT: True}
        return TaskPlan("evaluate", params=params, arrays=protocol.Centroids(self.centroids))

    def reports_model(self) -> bool:
        """Whether this evaluation is the final model's, from the report's groups
        (``protocol.REPORT``): the one repetition's, or the report round's."""
        return ((self.config.n_init == 1 or self.reporting)
                and report_round.report_wanted(self.config, self.sites))

    @property
    def reporting(self) -> bool:
        """An evaluation after every repetition's: the best's report round (report_round.py)."""
        return self.phase == Phase.EVALUATE and len(self.repetitions) >= self.config.n_init

    def report_params(self) -> dict:
        """Davies-Bouldin's round's: the report's groups where the evaluation used them."""
        best = self.best
        return {protocol.REPORT: True} if best is not None and best.get("report") else {}

    def distances_task(self) -> TaskPlan:
        """Davies-Bouldin's second pass: distances to the pooled means."""
        best = self.best
        return TaskPlan("evaluate_distances", params=self.report_params(),
                        arrays=protocol.CentroidsAndMeans(best["centroids"], best["stats"].means))

    def reduce_algorithm_round(self, server_round: int, plan: TaskPlan,
                               replies: list[Reply]) -> dict:
        """Reduce an init, training, evaluation or distances round (enough sites have
        answered: ``Run.reduce_round``); returns its history row."""
        if plan.task == "evaluate" and self.phase == Phase.INTERIM:
            # eval-every: the exact score of the current centroids over all sites
            self.phase = Phase.TRAIN
            stats = metrics.pool([reports.site_stats(r) for r in replies])
            return {"score": stats.sse / stats.n_rows}
        if plan.task == "evaluate":
            return self.finish_repetition(replies)
        if plan.task == "evaluate_distances":
            return self.finish_run(np.sum([r.arrays.distances for r in replies], axis=0)
                                   if replies else None)
        if self.phase == Phase.INIT:
            self.take_init(plan, replies)
            return {}
        return self._reduce_training(plan, replies)

    def _reduce_training(self, plan: TaskPlan, replies: list[Reply]) -> dict:
        """A training round: new centroids, their movement and score, and whether the
        repetition stops (movement under ``tol``, a stalled score, the round cap)."""
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
        stalled = stopping.score_stalled([*scores, score], self.config.score_tol,
                                         self.default_score_tol, self.sites,
                                         self.score_best_patience)
        converged = (movement < self.config.tol or stalled) and self.can_stop()
        if converged or self.train_round >= self.config.num_rounds:
            self.phase = Phase.EVALUATE
        elif self.config.eval_every and self.train_round % self.config.eval_every == 0:
            self.phase = Phase.INTERIM
        return {"movement": movement, "score": score, **self.round_metrics()}

    # ----------------------------------------------------------- repetitions
    def begin_repetition(self) -> None:
        """A repetition's start: given or warm centroids train at once, else ``init``."""
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
        self.begin_repetition()

    def take_init(self, plan: TaskPlan, replies: list[Reply]) -> None:
        """Reduce an init round; train from its centroids (None: the start goes on)."""
        if (start := self.reduce_init(plan, replies)) is not None:
            self.start_training(start)

    def start_training(self, centroids: np.ndarray) -> None:
        """Train from ``centroids`` (checked: k x the width, all finite)."""
        if centroids.shape != (self.k, self.n_features) or not np.isfinite(centroids).all():
            raise FederationError(f"initial centroids have shape {centroids.shape}, expected ({self.k}, "
                                  f"{self.n_features}) and all finite (a NaN or inf is not a start)")
        self.centroids = centroids
        self.previous = centroids.copy()
        self.phase = Phase.TRAIN if self.has_training else Phase.EVALUATE

    def finish_repetition(self, replies: list[Reply]) -> dict:
        """The evaluation's replies: the repetition's exact score and figures kept (the
        report round's: the best repetition's figures); the next repetition, the report
        round (``report_round.py``), Davies-Bouldin's pass, or the end of the run."""
        figures = report_round.evaluation_record(replies, self.config)
        score = figures["stats"].sse / figures["stats"].n_rows
        if self.reporting:  # its score chose the best repetition: that score stays
            self.best.update(figures, report=True)
        else:
            self.repetitions.append({"seed": self.seed, "score": score, "centroids": self.centroids,
                                     "rounds": self.train_round, "movement": self.last_movement,
                                     "report": self.reports_model(), **figures})
        if self.repetition + 1 < self.config.n_init:
            self.repetition += 1
            self.begin_repetition()
        elif self.config.private:  # Davies-Bouldin is not released under DP: no second pass
            self.finish_run(np.zeros(self.k))
        elif not self.best.get("report") and report_round.report_wanted(self.config, self.sites):
            self.centroids, self.phase = self.best["centroids"], Phase.EVALUATE  # reporting
        elif self.fold_distances and metrics.means_are_centroids(self.best["stats"],
                                                                 self.best["centroids"]):
            self.finish_run(self.best["distances"])
        else:
            self.phase = Phase.DISTANCES
        return {"score": score}

    # ------------------------------------------- the run as the server app reads it
    def snapshot(self) -> state.Snapshot:
        """The run's state as a checkpoint writes it (``state.py``)."""
        document, arrays = state.encode_state(type(self).__name__, vars(self))
        last_round = max((row["round"] for row in self.history), default=0)
        return state.Snapshot(document, arrays, self.config, last_round, self.finished)

    def restore(self, document, arrays) -> "ClusteringStrategy":
        """Set the state a checkpoint holds on this fresh run (built for the run config);
        returns it (``state.StateError`` for a document of another run)."""
        for name, value in state.decode_state(document, arrays, type(self).__name__,
                                              vars(self)).items():
            setattr(self, name, value)
        return self

    def result(self) -> RunResult:
        """The finished run's result (``run_result.py``)."""
        ordered = self.ordered_sites()
        return RunResult(
            best=self.best, final_metrics=self.final_metrics, k=self.k, sites=ordered,
            rejected=dict(self.rejected),
            site_failures={key: list(v) for key, v in self.site_failures.items()},
            history=self.history, transform=self.transform, feature_names=self.feature_names,
            box=self.box, bounds_from_data=self.bounds_from_data, profile_note=self.profile_note,
            table1=profile.table1_of(self.config, ordered, self.profile_table, self.profile_note,
                                     bool(self.best.get("report")) if self.repetitions else False),
            floor=profile.floor(self.config, ordered))

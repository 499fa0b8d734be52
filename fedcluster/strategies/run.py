"""The run controller: a run's state and every phase change (the algorithm base,
``base.py``, builds on it; Flower's side is ``flower_adapter.py``).

A round is :meth:`Run.plan_next` (the phase's task) then :meth:`Run.end_round` (the
validated outcome recorded and reduced, one history row). The phases (``phases.py``):

1. ``describe`` (once, every available site): size, width and feature names; the sites
   are admitted or rejected with a logged reason (``sites.py``). A schema that imputes
   adds an ``impute`` round (the pooled fill), ``scale`` a ``stats`` round; the global
   transform they give travels with every later task (``preparation.py``). The describe
   message carries the run's first task when it can.
2. ``init``, ``train``, ``evaluate`` (per n-init repetition), ``distances``: the
   algorithm's (``base.py``).
3. ``profile`` (one or two rounds, all sites): Table 1 by cluster (``profile.py``),
   unless the run is private, a k-range or sets ``profile = false``.

The state is every attribute of the instance (a checkpoint saves it: ``state.py``); the
phase machine's decisions are methods here and in ``base.py``, the maths and the plans
pure functions in the phase modules.
"""

from __future__ import annotations

import logging
import time

import numpy as np
from flwr.common.logger import log

from fedcluster.common import protocol, scaling
from fedcluster.common.config import RunConfig
from fedcluster.strategies import metrics, preparation, private, profile, round_replies, sites
from fedcluster.strategies.phases import PROFILE_PHASES, SECURE_PHASES, Phase
from fedcluster.strategies.round_facts import RoundFacts
from fedcluster.strategies.round_replies import RoundOutcome
from fedcluster.strategies.sites import Site, site_order
from fedcluster.strategies.task_plan import TaskPlan
from fedcluster.strategies.reply import Reply


class Run:
    """A run's state and phase changes: sites, preparation, rounds, history, profile."""

    #: Send the run's first task with the describe handshake when it can (``preparation.py``).
    carries_first_task = True

    def __init__(self, config: RunConfig, initial_centroids: np.ndarray | None = None) -> None:
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

    # ------------------------------------------------------------ properties
    @property
    def seed(self) -> int:
        """The seed of the current n-init repetition."""
        return self.config.seeds[self.repetition]

    @property
    def n_features(self) -> int:
        """The federation's width (its first site's; every admitted site has it)."""
        return next(iter(self.sites.values())).n_features

    @property
    def width(self) -> int:
        """The federation's width (0 before the describe round has admitted a site)."""
        return self.n_features if self.sites else 0

    @property
    def feature_names(self) -> list[str]:
        """The federation's column names (empty: the sites name none)."""
        names = [s.feature_names for s in self.sites.values() if s.feature_names]
        return names[0] if names else []

    def ordered_sites(self) -> list[Site]:
        """The admitted sites in site order."""
        return sorted(self.sites.values(), key=lambda s: site_order(s.key))

    @property
    def best(self) -> dict:
        """The repetition with the lowest global score."""
        return min(self.repetitions, key=lambda r: r["score"])

    def reset_repetition(self) -> None:
        """A repetition's own state: no centroids, no training round yet."""
        self.centroids: np.ndarray | None = None
        self.previous: np.ndarray | None = None
        self.train_round = 0
        self.last_movement = float("nan")

    def begin_resume(self) -> None:
        """Resume: a describe round (node ids change, site ids do not), then the phase."""
        self._resume_phase = self.phase
        self.round_offset = max((row["round"] for row in self.history), default=0)
        self.phase = Phase.DESCRIBE

    # ------------------------------------------------------------ one round
    def plan_next(self) -> TaskPlan:
        """The next round's task: ``describe`` (every available site: the adapter sends
        it to all), carrying the run's first task when it can, then the phase's."""
        if self.phase == Phase.DESCRIBE:
            carries = None
            if self.carries_first_task:
                carries = preparation.carried_task(self.config, self.width,
                                                   self._resume_phase is not None,
                                                   self.carried_start)
            return TaskPlan("describe", carries=carries)
        return self.plan_round()

    def carried_start(self) -> TaskPlan | None:
        """The start's task as the describe round may carry it (None: it cannot)."""
        raise NotImplementedError

    def is_secure_round(self) -> bool:
        """Whether the next round runs under SecAgg+: in a secure run, the rounds whose
        task is a sum (training, evaluation, and a start of sums: ``divisive``)."""
        return self.config.secure_aggregation and (self.phase in SECURE_PHASES or (
            self.phase == Phase.INIT and self.init_task().task in protocol.SECURE_TASKS))

    def round_facts(self) -> RoundFacts:
        """What the Flower adapter needs of the run to send the next round and check
        its replies (``round_facts.py``)."""
        secure = self.is_secure_round()
        value_box = None
        if secure and self.phase in PROFILE_PHASES:
            value_box = profile.value_box(self.config, self.feature_names, self.width, self.transform)
        return RoundFacts(
            config=self.config, k=self.k, sites=self.sites, round_offset=self.round_offset,
            n_features=self.n_features if self.sites else None, secure=secure,
            # EWF's plain mean of centroids is for training; a start's Lloyd rounds weight
            dynamic=getattr(self, "dynamic", True) or self.phase == Phase.INIT,
            box=self.box, dp_rho_round=self.dp_rho_round, transform=self.transform,
            value_box=value_box)

    def record(self, server_round: int, task: str, outcome: RoundOutcome) -> None:
        """Note a round's failures against their sites (``site_failures``), the sites a
        describe reply rejects, and count each answer towards its site's max-rounds."""
        for key, reason in outcome.notes:
            self.site_failures.setdefault(key, []).append(
                f"round {server_round + self.round_offset} ({task}): {reason}")
        self.rejected.update(outcome.rejected)
        for key, rounds_left in outcome.answered:
            sites.count_answer(self.sites.get(key), task, rounds_left)
        self.round_failures = outcome.failed

    def end_round(self, server_round: int, plan: TaskPlan, outcome: RoundOutcome) -> dict:
        """Take a round back (the adapter's validated outcome): record it, reduce its
        replies (the phase's change) and append its history row, which it returns."""
        self.record(server_round, plan.task, outcome)
        row = self.reduce_round(server_round, plan, outcome.replies)
        row.update({"round": server_round + self.round_offset, "repetition": self.repetition,
                    "task": plan.label, **round_replies.participation(outcome, self.sites)})
        self.history.append(row)
        row.update(private.round_accounting(self.config, self.history))
        if outcome.started is not None:
            row["seconds"] = time.perf_counter() - outcome.started
        return row

    def require_answers(self, replies: list[Reply], task: str) -> None:
        """Stop the run when fewer than min-sites valid replies came back, but in
        training (``sites.require_answers``)."""
        sites.require_answers(self.config, replies, task,
                              task == "lloyd" or self.phase == Phase.TRAIN,
                              len(self.sites), self.round_failures)

    # ------------------------------------------------------------ phases
    def plan_round(self) -> TaskPlan:
        """This round's task by the phase: preparation and profile here, the algorithm's
        phases in ``base.py``."""
        if self.phase == Phase.IMPUTE:
            return preparation.impute_task(self.config, self.width)
        if self.phase == Phase.STATS:
            return preparation.stats_task(self.config)
        if self.phase == Phase.PROFILE_RANGE:
            return TaskPlan("value_range")
        if self.phase == Phase.PROFILE:
            if self.profile_range is None:  # declared (secure: the box where not declared)
                self.profile_range = profile.unasked_range(self.config, self.feature_names,
                                                           self.width, self.transform)
            return profile.profile_task(self.best["centroids"], self.transform,
                                        *self.profile_range, bins=profile.bins(self.config),
                                        report=bool(self.best.get("report")))
        return self.plan_algorithm_round()

    def reduce_round(self, server_round: int, plan: TaskPlan, replies: list[Reply]) -> dict:
        """Reduce a round's validated replies by its phase; returns its history row."""
        if self.phase in PROFILE_PHASES:
            self._reduce_profile(plan, replies)
            return {}
        if plan.task == "describe" and self._resume_phase is not None:
            self.sites, self.rejected = sites.readmit(self.config, self.sites, replies, self.rejected)
            self.phase, self._resume_phase = self._resume_phase, None
            log(logging.INFO, "resumed from a checkpoint after round %s, phase %s",
                self.round_offset, self.phase)
            return {"sites-usable": len(self.sites)}
        if plan.task in preparation.TASKS:
            self._reduce_preparation(server_round, plan, replies)
            return {"sites-usable": len(self.sites)}
        self.require_answers(replies, plan.task)
        return self.reduce_algorithm_round(server_round, plan, replies)

    def _reduce_preparation(self, server_round: int, plan: TaskPlan, replies) -> None:
        """A preparation round (and a carried first task): admit, fill, scale; move on."""
        if plan.task == "describe":
            self.admit_sites(replies)
        else:
            what = ("the imputation round" if plan.task == "impute_stats"
                    else "the statistics round (scale)")
            self.sites, self.rejected = sites.keep_answering(
                self.config, self.sites, self.rejected, replies, self.round_failures, what)
            if plan.task == "impute_stats":
                self.transform = preparation.pooled_fill_transform(
                    self.config, self.width, self.feature_names, replies)
            else:
                fill = None if self.transform is None else self.transform.fill
                self.transform = preparation.scaling_transform(self.config, replies, fill,
                                                               self.ordered_sites())
        if (phase := preparation.next_phase(self.config, self.width, plan.task)) is not None:
            self.phase = phase
        else:
            self.begin_repetition()
        if plan.carries is not None:
            self._reduce_carried(server_round, plan.carries)

    def _reduce_carried(self, server_round: int, carried: TaskPlan) -> None:
        """Validate the admitted sites' replies to the carried task and reduce them as the
        phase the describe round left the run in (``impute``, ``stats`` or ``init``)."""
        keys = {site.node_id: site.key for site in self.sites.values()}
        outcome = RoundOutcome(keys)
        round_replies.check_replies(carried, self.round_facts(), outcome,
                                    preparation.carried_received(carried, keys))
        for reason in outcome.failed:
            log(logging.WARNING, "round %s (%s): dropped %s", server_round, carried.task, reason)
        self.record(server_round, carried.task, outcome)
        if self.phase in (Phase.IMPUTE, Phase.STATS):
            self._reduce_preparation(server_round, carried, outcome.replies)
        elif self.phase == Phase.INIT:
            self.require_answers(outcome.replies, carried.task)
            self.take_init(carried, outcome.replies)
        else:
            raise RuntimeError(f"a carried {carried.task} task in phase {self.phase}")

    def admit_sites(self, replies: list[Reply]) -> None:
        """Admit the sites of the describe round (``sites.admit``); GTV adds its graph."""
        self.sites, self.rejected = sites.admit(self.config, replies, self.rejected)

    def finish_run(self, distances: np.ndarray | None) -> dict:
        """Davies-Bouldin's distances known: the final metrics of the best repetition,
        then the profile (or the end)."""
        best = self.best
        self.final_metrics = metrics.compute_metrics(best["stats"], distances)
        phase, self.profile_note = profile.first_phase(self.config, self.feature_names, self.width)
        self.phase = phase or Phase.DONE
        self.finished = self.phase == Phase.DONE
        return {"score": self.final_metrics["score"]}

    def _reduce_profile(self, plan: TaskPlan, replies: list[Reply]) -> None:
        """The range round: the histograms' range, then the profile round; the profile
        round: Table 1's rows, and the run is done."""
        if self.phase == Phase.PROFILE_RANGE:
            declared = profile.declared_ranges(self.config, self.feature_names, self.width)
            self.profile_range = profile.range_from_sites(declared, replies)
            self.phase = Phase.PROFILE
            return
        self.phase, self.finished = Phase.DONE, True
        answered = profile.answered_by(self.config, self.sites, replies) if replies else None
        table, note = profile.table1_rows(
            plan, replies, profile.variables(self.config, self.feature_names, self.width,
                                             self.sites.values()),
            profile.floor(self.config, self.sites.values()), answered, len(self.sites))
        if table is not None:
            self.profile_table = table
        if note:
            self.profile_note = note

"""The strategy base shared by every algorithm: a Flower ``Strategy`` run as phases.

Every federated round is a Flower fit round carrying a *task* (see
``fedcluster.client_app.tasks``). A run goes through these phases:

1. ``describe`` (once, all available sites): each site declares its size, width and
   feature names. A site whose width differs from the majority, whose data cannot be
   loaded, or whose ``site-id`` duplicates another's is rejected with a logged reason
   and the run goes on with the rest (or stops with that reason if fewer than
   ``min-sites`` remain): ``sites.py``.
   With ``scale`` set, a ``stats`` round follows (all usable sites): per-feature
   aggregates give the global transform (``common/scaling.py``), which every later task
   carries so that the sites cluster scaled rows; a site that gives no valid statistics
   is dropped (the transform must cover every row that is clustered).
2. ``init`` (one round per n-init repetition): the algorithm's initialisation task.
3. ``train`` (up to ``num-rounds`` rounds): sampled sites (fraction C, seeded) run the
   algorithm's site step; the subclass reduces the replies to new centroids. The
   repetition stops early when the centroid movement ||C_t - C_{t-1}||_F < ``tol``.
4. ``evaluate`` (one round, all sites): SSE and sizes against the repetition's final
   centroids, giving the EXACT pooled score sum SSE_i / sum n_i. With ``n-init`` > 1 the
   repetition with the lowest score wins.

Subclasses provide the algorithm: :meth:`init_task` / :meth:`reduce_init` and
:meth:`train_task` / :meth:`reduce_train`, in the style of Flower's FedAvg: the maths
live in pure functions (``aggregate.py``), replies are validated before they are reduced
(``validation.py``), and failures are logged and dropped.

Replies are always reduced in a stable site order (sorted site keys), so the in-process
harness, Flower's simulation engine and a real deployment give the same numbers.

With ``secure-aggregation`` the train, evaluate and distances rounds run under SecAgg+
(``fedcluster/secure.py``): the server sends each task with the terms to sum and their
agreed scales, gets only the sum, validates it as a whole and reduces it as ONE reply
standing for the N sites that took part (``secure_sum.py``; :meth:`_secure_replies`).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field

import numpy as np
from flwr.common import FitIns, Parameters, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.common.logger import log
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import Strategy

from fedcluster.common import secure_codec as secure
from fedcluster.common import scaling
from fedcluster.strategies import metrics
from fedcluster.common.config import RunConfig
from fedcluster.common.kernels import frobenius
from fedcluster.strategies import private, secure_sum, sites
from fedcluster.strategies.errors import FederationError, SiteFailure
# Site stays importable from here: checkpoints written before sites.py name it so.
from fedcluster.strategies.sites import Site, site_order
from fedcluster.strategies.validation import Expect, Reply, ReplyError, validate


@dataclass
class TaskPlan:
    """One round's task: its name, scalar parameters, arrays, and which sites get it.

    ``per_site`` adds parameters that differ per site (e.g. a seed), keyed by site key.
    """

    task: str
    params: dict = field(default_factory=dict)
    arrays: list[np.ndarray] = field(default_factory=list)
    sample: bool = False  # True: the seeded fraction-C sample; False: every usable site
    per_site: dict[str, dict] = field(default_factory=dict)
    max_rows: int | None = None
    # Arrays that differ per site (GTV: each site's own and its neighbours' centroids),
    # keyed by site key; a site not in it gets ``arrays``.
    per_site_arrays: dict[str, list[np.ndarray]] = field(default_factory=dict)
    # Secure aggregation: the terms the sites encode and their agreed scales (set by
    # configure_fit for a secure round; None: a plain round).
    secure: tuple[list[str], list[float]] | None = None


class ClusteringStrategy(Strategy):
    """Phases, sampling, privacy floor, validation, convergence, history and n-init."""

    #: False for one-shot algorithms (k-FED): evaluate right after the init round.
    has_training = True
    #: Rounds a repetition adds to init + training + evaluate (GTV scores every site).
    extra_rounds_per_repetition = 0
    #: Class defaults of the data-bounds/DP state (set per instance in __init__), so that
    #: a checkpoint written before they existed still loads.
    box: tuple[np.ndarray, np.ndarray] | None = None
    bounds_from_data = False

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
        self.history: list[dict] = []
        self.repetitions: list[dict] = []  # one per n-init seed: score, centroids
        self.phase = "describe"
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
        self._reset_repetition()

    # ----------------------------------------------------------------- hooks
    def init_task(self) -> TaskPlan:
        """The initialisation round's task."""
        raise NotImplementedError

    def reduce_init(self, plan: TaskPlan, replies: list[Reply]) -> np.ndarray:
        """Initial (k, d) centroids from the init round's replies."""
        raise NotImplementedError

    def init_without_round(self) -> np.ndarray | None:
        """Initial centroids that need no site round (None: run ``init_task``)."""
        return None

    def train_task(self) -> TaskPlan:
        """One training round's task, given ``self.centroids``."""
        raise NotImplementedError

    def reduce_train(self, plan: TaskPlan, replies: list[Reply]) -> np.ndarray:
        """New (k, d) centroids from one training round's replies."""
        raise NotImplementedError

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
        """The most server rounds a run can take (the workflow's loop bound): describe and
        statistics (scale), then per repetition init + rounds + interim evaluations +
        evaluate (+ extras), then Davies-Bouldin's distances round."""
        config = self.config
        interim = config.num_rounds // config.eval_every if config.eval_every else 0
        per_repetition = config.num_rounds + interim + 2 + self.extra_rounds_per_repetition
        return 3 + config.n_init * per_repetition

    def admit_sites(self, replies: list[Reply]) -> None:
        """Admit the sites of the describe round (``sites.admit``); GTV adds its graph."""
        sites.admit(self, replies)

    def begin_resume(self) -> None:
        """Continue a checkpointed run: a describe round first (node ids change when
        sites reconnect; site ids do not), then the phase the run was in."""
        self._resume_phase = self.phase
        self.round_offset = max((row["round"] for row in self.history), default=0)
        self.phase = "describe"

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

    def per_site_seeds(self, *salt: int) -> dict[str, dict]:
        """``{"seed": ...}`` per site, from the repetition's seed, ``salt`` and the
        site's position in the stable order (so every engine draws the same)."""
        return {
            site.key: {"seed": int(np.random.SeedSequence([self.seed, *salt, i]).generate_state(1)[0])}
            for i, site in enumerate(self.ordered_sites())
        }

    def ordered_sites(self) -> list[Site]:
        return sorted(self.sites.values(), key=lambda s: site_order(s.key))

    def _reset_repetition(self) -> None:
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
        if self.phase == "describe":
            plan = TaskPlan("describe")
            targets = {int(p.node_id): p for p in available.values()}
            keys = {node_id: "" for node_id in targets}
        else:
            plan = self._plan_for_phase()
            usable = [s for s in self.ordered_sites()
                      if str(s.node_id) in available and not s.at_limit]
            if plan.sample:
                usable = self._sample(usable)
            targets = {s.node_id: available[str(s.node_id)] for s in usable}
            keys = {s.node_id: s.key for s in usable}
        base = {"task": plan.task, "min-cluster-size": self.config.min_cluster_size, **plan.params}
        if self.config.secure_aggregation and self.phase in secure.SECURE_PHASES:
            plan.secure = secure_sum.terms_and_scales(self, plan, [self.sites[k] for k in keys.values()])
            # clip: distributed DP's noise-margin case (secure.encode says why)
            base[secure.SECURE_PARAM] = json.dumps(
                {"terms": plan.secure[0], "scales": plan.secure[1], "clip": self.config.private})
        if self.transform is not None and plan.task not in ("describe", "stats"):
            base["transform"] = self.transform.encode()
        base.update(private.task_params(self, plan.task, server_round, len(keys)))
        shared = ndarrays_to_parameters(plan.arrays)
        self._pending = (plan, keys)

        def parameters(key: str) -> Parameters:
            own = plan.per_site_arrays.get(key)
            return shared if own is None else ndarrays_to_parameters(own)

        return [
            (proxy, FitIns(parameters(keys[node_id]),
                           {**base, **plan.per_site.get(keys[node_id], {})}))
            for node_id, proxy in targets.items()
        ]

    def aggregate_fit(self, server_round, results, failures):
        plan, keys = self._pending
        replies, failed = [], []
        if plan.secure is not None:  # SecAgg+'s failures carry no node id: see below
            replies = self._secure_replies(server_round, plan, keys, results, failures, failed)
            results, failures = [], []
        for failure in failures:
            key, reason = self._failure_reason(failure, keys)
            failed.append(f"site {key}: {reason}")
            self.site_failures.setdefault(key, []).append(
                f"round {server_round + self.round_offset} ({plan.task}): {reason}")
        for proxy, res in results:
            node_id = int(proxy.node_id)
            metrics = dict(res.metrics)
            key = str(metrics.get("site-key", keys.get(node_id) or f"node-{node_id}"))
            if "error" not in metrics and keys.get(node_id) == key:
                sites.count_answer(self.sites.get(key), plan.task, metrics.get("rounds-left"))
            arrays = parameters_to_ndarrays(res.parameters)
            try:
                reply = self._validate(plan, node_id, key, keys, arrays, metrics, res.num_examples)
            except ReplyError as err:
                failed.append(f"site {key}: {err}")
                self.site_failures.setdefault(key, []).append(
                    f"round {server_round + self.round_offset} ({plan.task}): reply dropped: {err}")
                if plan.task == "describe":
                    self.rejected[key] = str(err)
                continue
            replies.append(reply)
        for reason in failed:
            log(logging.WARNING, "round %s (%s): dropped %s", server_round, plan.task, reason)
        replies.sort(key=lambda r: site_order(r.site_key))
        row = self._reduce(server_round, plan, replies)
        row.update(
            {
                "round": server_round + self.round_offset,
                "repetition": self.repetition,
                "task": plan.task,
                "sites-asked": len(keys),
                "sites-answered": sum(r.n_sites for r in replies),
                "sites-failed": len(keys) - sum(r.n_sites for r in replies),
                "failures": "; ".join(failed),
            }
        )
        self.history.append(row)
        row.update(private.round_accounting(self.config, self.history))
        out = [] if self.centroids is None else [self.centroids]
        return ndarrays_to_parameters(out), {}

    # ---------------------------------------------------- secure aggregation
    def _secure_replies(self, server_round: int, plan: TaskPlan, keys: dict[int, str], results,
                        failures, failed) -> list[Reply]:
        """The decoded sum of a secure round as ONE reply standing for its N sites (the
        reductions then run unchanged), or none when the aggregate fails validation.

        SecAgg+ gives the server the sum only: a site's reply cannot be validated on its
        own, so the aggregate is (finite, shapes, counts within the rows of the sites that
        contributed, the row total equal to theirs); a site that sends bad values makes
        the whole round unusable, and cannot be named."""
        contributors = [keys[int(proxy.node_id)] for proxy, _ in results]
        for key in contributors:
            sites.count_answer(self.sites.get(key), plan.task)
        errors = "; ".join(self._failure_reason(f, keys)[1] for f in failures)
        if errors:
            log(logging.WARNING, "secure round (%s): SecAgg+ failures: %s", plan.task, errors)
        for key in sorted(set(keys.values()) - set(contributors), key=site_order):
            reason = "left out of the secure sum (no masked reply; see the site's log)"
            failed.append(f"site {key}: {reason}")
            self.site_failures.setdefault(key, []).append(
                f"round {server_round + self.round_offset} ({plan.task}): {reason}")
        if not results:
            return []
        names, scales = plan.secure
        n_sites = len(contributors)
        n_rows = sum(self.sites[key].n_rows for key in contributors)
        aggregate = parameters_to_ndarrays(results[0][1].parameters)
        try:
            sums = secure.decode(aggregate, names, scales, n_sites)
            reply = secure_sum.sum_reply(self, plan, sums, n_sites, n_rows)
        except ReplyError as err:
            reason = f"secure sum of sites {', '.join(sorted(contributors, key=site_order))}: {err}"
            failed.append(reason)
            log(logging.ERROR, "secure round (%s) unusable: %s", plan.task, reason)
            return []
        except ValueError as err:
            failed.append(f"secure sum: {err}")
            return []
        return [reply]

    def configure_evaluate(self, server_round, parameters, client_manager):
        return []  # evaluation is a fit-round task (see module docstring)

    def aggregate_evaluate(self, server_round, results, failures):
        return None, {}

    def evaluate(self, server_round, parameters):
        return None

    # --------------------------------------------------------------- phases
    def _plan_for_phase(self) -> TaskPlan:
        if self.phase == "stats":
            return TaskPlan("stats", params={"scale": self.config.scale})
        if self.phase == "init":
            return self.init_task()
        if self.phase == "train":
            return self.train_task()
        if self.phase in ("evaluate", "interim"):
            return TaskPlan("evaluate", params=self.evaluation_params(), arrays=[self.centroids])
        if self.phase == "distances":
            best = self.best
            return TaskPlan("evaluate_distances", arrays=[best["centroids"], best["stats"].means])
        raise RuntimeError(f"no task in phase {self.phase}")

    def _sample(self, usable: list[Site]) -> list[Site]:
        m = max(1, round(self.config.fraction * len(usable)))
        if m >= len(usable):
            return usable
        rng = np.random.default_rng([self.seed, self.train_round, 7919])
        chosen = np.sort(rng.choice(len(usable), size=m, replace=False))
        return [usable[i] for i in chosen]

    def _validate(self, plan, node_id, key, keys, arrays, metrics, n_rows) -> Reply:
        if plan.task != "describe" and keys.get(node_id) != key:
            raise ReplyError(f"answered as site {key!r} but node {node_id} joined as {keys.get(node_id)!r}")
        site = self.sites.get(key)
        expect = Expect(
            task=plan.task,
            n_features=self.n_features if self.sites else None,
            n_clusters=self.k,
            max_rows=plan.max_rows,
            floor=self.config.min_cluster_size,
            declared_rows=site.n_rows if site else None,
            scale=plan.params.get("scale"),
            private=self.config.private,
        )
        typed = validate(arrays, metrics, int(n_rows), expect)
        return Reply(key, node_id, int(n_rows), typed, metrics)

    @staticmethod
    def _failure_reason(failure, keys: dict[int, str]) -> tuple[str, str]:
        """(site key, reason) of a failed reply."""
        if isinstance(failure, SiteFailure):
            return keys.get(failure.node_id) or f"node-{failure.node_id}", failure.reason
        if isinstance(failure, BaseException):
            return "?", str(failure)
        proxy, res = failure
        return keys.get(int(proxy.node_id)) or f"node-{proxy.node_id}", res.status.message

    def _reduce(self, server_round: int, plan: TaskPlan, replies: list[Reply]) -> dict:
        if plan.task == "describe" and self._resume_phase is not None:
            sites.readmit(self, replies)
            self.phase, self._resume_phase = self._resume_phase, None
            log(logging.INFO, "resumed from a checkpoint after round %s, phase %s",
                self.round_offset, self.phase)
            return {"sites-usable": len(self.sites)}
        if plan.task == "describe":
            self.admit_sites(replies)
            if self.config.scale == "none":
                self._begin_repetition()
            else:
                self.phase = "stats"
            return {"sites-usable": len(self.sites)}
        if plan.task == "stats":
            self._fix_transform(replies)
            self._begin_repetition()
            return {"sites-usable": len(self.sites)}
        self._require_sites(replies, plan.task)
        if plan.task == "evaluate" and self.phase == "interim":
            # eval-every: the exact score of the current centroids over all sites
            self.phase = "train"
            stats = metrics.pool([_site_stats(r) for r in replies])
            return {"score": stats.sse / stats.n_rows}
        if plan.task == "evaluate":
            return self._finish_repetition(replies)
        if plan.task == "evaluate_distances":
            return self._finish_run(replies)
        if self.phase == "init":
            self._start_training(self.reduce_init(plan, replies))
            return {}
        # train
        self.train_round += 1
        if not replies:  # nobody answered: the centroids stay, the round still counts
            if self.train_round >= self.config.num_rounds:
                self.phase = "evaluate"
            return {"movement": float("nan"), "score": float("nan")}
        # The score of the centroids the sites received, where every site reported its SSE.
        score = float("nan")
        if all("sse" in r.metrics for r in replies):
            score = sum(r.metrics["sse"] for r in replies) / sum(r.n_rows for r in replies)
        new = self.reduce_train(plan, replies)
        movement = self.movement(new, self.centroids)
        self.previous, self.centroids = self.centroids, new
        self.last_movement = movement
        converged = movement < self.config.tol and self.can_stop()
        if converged or self.train_round >= self.config.num_rounds:
            self.phase = "evaluate"
        elif self.config.eval_every and self.train_round % self.config.eval_every == 0:
            self.phase = "interim"
        return {"movement": movement, "score": score, **self.round_metrics()}

    def _begin_repetition(self) -> None:
        self._reset_repetition()
        if self.box is None:
            self.box = private.declared_box(self.config, self.n_features)
        start = self.initial_centroids
        if start is None and self.repetition == 0:
            start = self.warm_start
        if start is None:
            start = self.init_without_round()
        if self.config.private and self.box is None and start is not None:
            raise FederationError(
                "dp-epsilon without data-bounds takes the clipping box from the init round "
                "(init 'random'), which a run from given centroids skips; set data-bounds")
        if start is not None:
            self._start_training(np.array(start, dtype=np.float64))
        else:
            self.phase = "init"

    def _fix_transform(self, replies: list[Reply]) -> None:
        """The global transform from the statistics round; sites without valid statistics
        leave the run (their rows would be clustered unscaled by the others' transform)."""
        answered = {r.site_key for r in replies}
        for key in [k for k in self.sites if k not in answered]:
            del self.sites[key]
            self.rejected[key] = "no valid reply to the statistics round (scale)"
            log(logging.ERROR, "site %s rejected: %s", key, self.rejected[key])
        if len(self.sites) < self.config.min_sites or not replies:
            raise FederationError(self._too_few(f"{len(self.sites)} site(s) sent statistics"))
        counts = [r.n_rows for r in replies]
        if self.config.scale == "standard":
            means, deviations, m2s = zip(*(r.arrays for r in replies))
            self.transform = scaling.standard_transform(counts, means, deviations, m2s)
        else:
            private.warn_leak("scale 'minmax': the sites sent their per-feature minima and "
                              "maxima (each one person's value); scale 'standard' sends sums "
                              "only")
            minima, maxima = zip(*(r.arrays for r in replies))
            self.transform = scaling.minmax_transform(minima, maxima)

    def continue_from(self, previous: "ClusteringStrategy") -> None:
        """Skip ``describe`` and ``stats``: take the sites, rejections and transform of a
        finished run on the same federation (choose-k runs one strategy per k)."""
        self.sites = dict(previous.sites)
        self.rejected = dict(previous.rejected)
        self.transform = previous.transform
        self._begin_repetition()

    def _start_training(self, centroids: np.ndarray) -> None:
        if centroids.shape != (self.k, self.n_features):
            raise FederationError(
                f"initial centroids have shape {centroids.shape}, expected "
                f"({self.k}, {self.n_features})"
            )
        self.centroids = centroids
        self.previous = centroids.copy()
        self.phase = "train" if self.has_training else "evaluate"

    def _too_few(self, what: str) -> str:
        reasons = "; ".join(f"site {k}: {v}" for k, v in self.rejected.items())
        return (
            f"{what}, but min-sites = {self.config.min_sites}"
            + (f". Rejected: {reasons}" if reasons else "")
        )

    def _require_sites(self, replies: list[Reply], task: str) -> None:
        if not replies:
            log(logging.WARNING, "task %s: no valid reply this round", task)
        answered = sum(r.n_sites for r in replies)
        if task != "lloyd" and answered < min(self.config.min_sites, len(self.sites)):
            raise FederationError(
                f"task {task}: only {answered} valid replies, min-sites = "
                f"{self.config.min_sites}"
            )

    def _finish_repetition(self, replies: list[Reply]) -> dict:
        stats = metrics.pool([_site_stats(r) for r in replies])
        # Under secure aggregation there is no site's own reply to report.
        per_site = {r.site_key: _site_report(r, self.config.min_cluster_size)
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
            }
        )
        if self.repetition + 1 < self.config.n_init:
            self.repetition += 1
            self._begin_repetition()
        else:
            self.phase = "distances"
        return {"score": score}

    def _finish_run(self, replies: list[Reply]) -> dict:
        """Davies-Bouldin's second pass done: the final metrics of the best repetition."""
        best = self.best
        distances = np.sum([r.arrays[0] for r in replies], axis=0) if replies else None
        self.final_metrics = metrics.compute_metrics(best["stats"], distances)
        self.phase = "done"
        self.finished = True
        return {"score": self.final_metrics["score"]}

    @property
    def best(self) -> dict:
        """The repetition with the lowest global score."""
        return min(self.repetitions, key=lambda r: r["score"])


def _site_stats(reply: Reply) -> dict:
    """A validated ``evaluate`` reply as the statistics ``metrics.pool`` sums."""
    counts, sums, sqnorms = reply.arrays[:3]
    stats = {
        "n_rows": reply.n_rows,
        "sse": reply.metrics["sse"],
        "silhouette_sum": reply.metrics["silhouette-sum"],
        "counts": counts,
        "sums": sums,
        "sqnorms": sqnorms,
    }
    if "all-sq-dist" in reply.metrics:
        stats["all_sq_dist"] = reply.metrics["all-sq-dist"]
        stats["partition_sum"] = reply.metrics["partition-sum"]
    if len(reply.arrays) == 5:
        names = json.loads(str(reply.metrics["label-names"]))
        stats["contingency"] = dict(zip(names, reply.arrays[4]))
    return stats


def _site_report(reply: Reply, floor: int) -> dict:
    """What the server shows of one site: its score and sizes, "<p" where it hid one (p
    the site's own floor when it is above the server's)."""
    counts, hidden = reply.arrays[0], reply.arrays[3]
    floor = max(floor, int(reply.metrics.get("floor", floor)))
    return {
        "n-rows": reply.n_rows,
        "score": reply.metrics["sse"] / reply.n_rows,
        "cluster-sizes": [f"<{floor}" if h else int(c) for c, h in zip(counts, hidden)],
    }

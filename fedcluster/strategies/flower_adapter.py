"""Flower's side of a run: the ``Strategy`` Flower drives, turning the run's task plans
into messages and the sites' answers into one validated :class:`RoundOutcome`.

Every federated round is a Flower fit round carrying one task of ``common/protocol.py``.
The adapter holds no state of the run: it asks the run (``base.ClusteringStrategy``)
for the round's plan and facts (``round_facts.py``), addresses the usable sites (every
available one at ``describe``; the seeded fraction-C sample where the plan says so),
adds the parameters every task carries (the round, the floor, the global transform,
the secure-sum terms and scales, the DP and clipping parameters), and, once the round
is back, names the failures, validates every reply (``round_replies.py``; under
SecAgg+ the decoded sum, ``secure_sum.py``) and gives the outcome to the run, which
records it and reduces it (``ClusteringStrategy.end_round``). Flower's evaluate hooks
are unused: evaluation is a fit-round task.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass

from flwr.common import FitIns, Parameters, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.common.logger import log
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import Strategy

from fedcluster.common import protocol, secure_codec as secure
from fedcluster.strategies import private, round_replies, secure_sum, sites
from fedcluster.strategies.round_facts import RoundFacts
from fedcluster.strategies.round_replies import RoundOutcome
from fedcluster.strategies.task_plan import TaskPlan


@dataclass
class RoundInFlight:
    """The round :meth:`FlowerAdapter.configure_fit` sent: its plan, the facts it was
    planned with, the asked sites' keys by node id ("" before the describe round has
    named them), and when it started (the history's ``seconds``)."""

    plan: TaskPlan
    facts: RoundFacts
    keys: dict[int, str]
    started: float


class FlowerAdapter(Strategy):
    """The Flower ``Strategy`` of one run (``run``: a ``ClusteringStrategy``)."""

    def __init__(self, run) -> None:
        super().__init__()
        self.run = run
        self.in_flight: RoundInFlight | None = None

    def initialize_parameters(self, client_manager: ClientManager) -> Parameters | None:
        return ndarrays_to_parameters([])

    def configure_fit(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, FitIns]]:
        """The round's messages: the run's next task, to every available site at
        ``describe``, else to the usable sites (connected, not at their own max-rounds;
        the seeded fraction-C sample of them where the plan samples), each with the
        parameters every task carries and its own where the plan has some."""
        started = time.perf_counter()
        run = self.run
        plan = run.plan_next()
        facts = run.round_facts()
        available = client_manager.all()
        if plan.task == "describe":
            targets = {int(p.node_id): p for p in available.values()}
            keys = {node_id: "" for node_id in targets}
        else:
            usable = [s for s in run.ordered_sites()
                      if str(s.node_id) in available and not s.at_limit]
            if plan.sample:
                usable = sites.sample(usable, facts.config.fraction, run.seed, run.train_round)
            targets = {s.node_id: available[str(s.node_id)] for s in usable}
            keys = {s.node_id: s.key for s in usable}
        base = self._common_params(server_round, plan, facts, keys)
        shared = ndarrays_to_parameters(protocol.to_arrays(plan.arrays))
        self.in_flight = RoundInFlight(plan, facts, keys, started)

        def parameters_of(key: str) -> Parameters:
            own = plan.per_site_arrays.get(key)
            return shared if own is None else ndarrays_to_parameters(protocol.to_arrays(own))

        return [
            (proxy, FitIns(parameters_of(keys[node_id]),
                           {**base, **plan.per_site.get(keys[node_id], {})}))
            for node_id, proxy in targets.items()
        ]

    @staticmethod
    def _common_params(server_round: int, plan: TaskPlan, facts: RoundFacts,
                       keys: dict[int, str]) -> dict:
        """The parameters every site of the round gets: the task and its parameters, the
        run's floor and round, a carried first task, a site-drawn seed, the secure-sum
        terms and scales (set on ``plan``), the global transform, the DP parameters."""
        config = facts.config
        base = {"task": plan.task, "min-cluster-size": config.min_cluster_size,
                protocol.ROUND: server_round + facts.round_offset, **plan.params}
        if plan.carries is not None:  # the run's first task, answered with describe
            base.update({**plan.carries.params, protocol.THEN: plan.carries.task})
        if seed_base := plan.seed_base or (plan.carries and plan.carries.seed_base):  # site-drawn
            base[protocol.SEED_BASE] = json.dumps([int(v) for v in seed_base])
        if facts.secure:
            plan.secure = secure_sum.terms_and_scales(facts, plan,
                                                      [facts.sites[k] for k in keys.values()])
            # clip: distributed DP's noise-margin case (secure.encode says why)
            base[secure.SECURE_PARAM] = json.dumps(
                {"terms": plan.secure[0], "scales": plan.secure[1], "clip": config.private})
        if facts.transform is not None and plan.task not in ("describe", "impute_stats"):
            base["transform"] = facts.transform.encode()
        base.update(private.task_params(facts, plan.task, server_round, len(keys)))
        return base

    def aggregate_fit(self, server_round, results, failures):
        """The round back: a secure round's decoded sum (one reply for its sites), the
        failures named (a simulated absence counted apart: ``errors.SiteAbsence``), every
        other reply validated (one that does not validate is dropped and logged, the
        round goes on); the run records and reduces the outcome. Returns the run's
        centroids (none before it has some)."""
        flight = self.in_flight
        plan, facts = flight.plan, flight.facts
        outcome = RoundOutcome(dict(flight.keys), started=flight.started)
        if plan.secure is not None:  # SecAgg+'s failures carry no node id: see secure_sum
            secure_sum.secure_replies(facts, plan, outcome, results, failures)
            results, failures = [], []
        round_replies.take_failures(outcome, failures)
        received = []
        for proxy, res in results:
            node_id = int(proxy.node_id)
            metrics = dict(res.metrics)
            key = str(metrics.get(protocol.SITE_KEY, flight.keys.get(node_id) or f"node-{node_id}"))
            arrays = parameters_to_ndarrays(res.parameters)
            if plan.carries is not None:
                plan.carries.received[node_id] = (arrays, metrics, res.num_examples)
            received.append((node_id, key, arrays, metrics, res.num_examples))
        round_replies.check_replies(plan, facts, outcome, received)
        for reason in outcome.failed:
            log(logging.WARNING, "round %s (%s): dropped %s", server_round, plan.task, reason)
        self.run.end_round(server_round, plan, outcome)
        centroids = self.run.centroids
        return ndarrays_to_parameters([] if centroids is None else [centroids]), {}

    def configure_evaluate(self, server_round, parameters, client_manager):
        return []  # evaluation is a fit-round task (see module docstring)

    def aggregate_evaluate(self, server_round, results, failures):
        return None, {}

    def evaluate(self, server_round, parameters):
        return None

"""The server's round loop: a run config's strategy driven round by round to its result.

The round loop lives here, in :class:`ClusteringWorkflow` (Flower's ``DefaultWorkflow``
runs a fixed number of rounds; clustering needs to stop on convergence, to run an
initialisation and an evaluation round, and to repeat for n-init). Each round is one
call of a Flower *fit workflow* (``fit_workflow(grid, context)``), by default
:func:`fit_round`, which adds a reply timeout and failure reasons to Flower's
``default_fit_workflow``; a SecAgg+ fit workflow can be switched in the same way.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import cast

from flwr.app import ArrayRecord, ConfigRecord, Message
from flwr.app.message_type import MessageType
from flwr.common import Code
from flwr.common.logger import log
from flwr.compat.common import recorddict_compat as compat
from flwr.server import LegacyContext
from flwr.server.compat.app_utils import start_update_client_manager_thread
from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD, Key
from flwr.serverapp import Grid

from fedcluster.server_app.checkpoint import save_checkpoint
from fedcluster.common import kernels
from fedcluster.common.config import RunConfig
from fedcluster.common.model import Model
from fedcluster.common.schema import run_schema
from fedcluster.server_app.outputs import progress_line
from fedcluster.server_app import availability
from fedcluster.server_app.polling import exchange
from fedcluster.strategies import FederationError, private, reports
from fedcluster.strategies.errors import SiteAbsence, SiteFailure
from fedcluster.strategies.flower_adapter import FlowerAdapter
from fedcluster.strategies.run_result import RunResult

# Keys of the ServerApp's Context state used by the in-process harness.
INITIAL_CENTROIDS = "fedcluster.initial-centroids"
RESULT = "fedcluster.result"

#: Callables told of each round as it ends: (its history row, the most rounds that may
#: still follow it); the in-process harness's progress bar (``simulation_progress.py``).
ROUND_LISTENERS: list = []


def fit_round(grid: Grid, context: LegacyContext) -> None:
    """One fit round: configure, send, wait (at most ``round-timeout``), aggregate."""
    cfg = context.state.config_records[MAIN_CONFIGS_RECORD]
    server_round = cast(int, cfg[Key.CURRENT_ROUND])
    timeout = cast(float, cfg["round-timeout"])
    adapter = cast(FlowerAdapter, context.strategy)
    params = compat.arrayrecord_to_parameters(
        context.state.array_records[MAIN_PARAMS_RECORD], keep_input=True
    )
    instructions = adapter.configure_fit(server_round, params, context.client_manager)
    flight = adapter.in_flight
    # Simulated devices (availability.py): an offline site gets no message, a late one's
    # reply is dropped below; neither is a failure (the adapter counts them apart).
    absent = (availability.draw(flight.facts.config, server_round + flight.facts.round_offset,
                                flight.keys)
              if flight.plan.sample else availability.NOBODY)
    proxies = {proxy.node_id: proxy for proxy, _ in instructions}
    messages = [
        Message(
            content=compat.fitins_to_recorddict(fitins, True),
            dst_node_id=proxy.node_id,
            message_type=MessageType.TRAIN,
            group_id=str(server_round),
        )
        for proxy, fitins in instructions
        if proxy.node_id not in absent.offline
    ]
    replies = exchange(grid, messages, timeout) if messages else []
    # Pushing gave each message its id. A reply is matched to its site through the id it
    # answers, not its sender: the SuperLink itself sends the error reply for a site it
    # considers gone (src_node_id = the SuperLink's).
    addressee = {m.metadata.message_id: m.metadata.dst_node_id for m in messages}
    results, failures = [], []
    answered = set()
    for msg in replies:
        node_id = addressee.get(msg.metadata.reply_to_message_id, msg.metadata.src_node_id)
        if node_id in absent.late:  # after the round's deadline: dropped unread
            continue
        answered.add(node_id)
        if msg.has_error():
            failures.append(SiteFailure(node_id, f"error reply: {msg.error.reason}"))
            continue
        fitres = compat.recorddict_to_fitres(msg.content, False)
        if fitres.status.code == Code.OK:
            results.append((proxies[node_id], fitres))
        else:
            failures.append((proxies[node_id], fitres))
    for node_id in set(proxies) - answered - absent.offline - absent.late:
        failures.append(SiteFailure(node_id, f"no reply within {timeout:g} s"))
    failures += [SiteAbsence(node_id, "offline") for node_id in absent.offline]
    failures += [SiteAbsence(node_id, "late") for node_id in absent.late]
    parameters, _ = adapter.aggregate_fit(server_round, results, failures)
    context.state.array_records[MAIN_PARAMS_RECORD] = compat.parameters_to_arrayrecord(
        parameters, True
    )


def wait_for_sites(client_manager, n_sites: int, timeout: float) -> bool:
    """Poll until ``n_sites`` are registered (``num_available`` refreshes the node list;
    Flower's ``wait_for`` would only see the refresh thread's 5-second ticks)."""
    deadline = time.monotonic() + timeout
    while client_manager.num_available() < n_sites:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


class ClusteringWorkflow:
    """Run the strategy's phases until it is finished; one fit workflow call per round."""

    def __init__(
        self,
        fit_workflow=fit_round,
        startup_timeout: float = 600.0,
        checkpoint_dir: Path | None = None,
    ) -> None:
        self.fit_workflow = fit_workflow
        self.startup_timeout = startup_timeout
        # Where the strategy's state is written after every round (None: nowhere).
        self.checkpoint_dir = checkpoint_dir

    def __call__(self, grid: Grid, context: LegacyContext) -> None:
        """Run the strategy of ``context.strategy`` (a ``FlowerAdapter``) to the end."""
        with self.federation(grid, context):
            self.run(grid, context, cast(FlowerAdapter, context.strategy))

    @contextmanager
    def federation(self, grid: Grid, context: LegacyContext) -> Iterator[None]:
        """The federation the rounds run on: the node-list refresh thread, started and
        stopped around the block, and ``min-sites`` connected before it starts (choose-k
        runs one strategy per k inside one federation, the round numbers running on)."""
        config = cast(FlowerAdapter, context.strategy).run.config
        thread, stop, registered = start_update_client_manager_thread(grid, context.client_manager)
        registered.wait()
        try:
            log(logging.INFO, "waiting for %s site(s) to connect", config.min_sites)
            if not wait_for_sites(context.client_manager, config.min_sites, self.startup_timeout):
                raise FederationError(
                    f"only {context.client_manager.num_available()} site(s) connected within "
                    f"{self.startup_timeout:g} s; min-sites = {config.min_sites}"
                )
            cfg = ConfigRecord({"round-timeout": config.round_timeout})
            context.state.config_records[MAIN_CONFIGS_RECORD] = cfg
            yield
        finally:
            stop.set()
            thread.join()

    def run(self, grid: Grid, context: LegacyContext, adapter: FlowerAdapter,
            last_round: int = 0, rounds_after: int = 0) -> int:
        """Run ``adapter``'s run round by round until it is finished, numbering its rounds
        from ``last_round + 1``; returns its last round's number. Call inside
        :meth:`federation`. ``rounds_after``: the most rounds of later runs of the same
        job (choose-k's next k), for the progress a round's log record carries."""
        context.strategy = adapter
        run = adapter.run
        cfg = context.state.config_records[MAIN_CONFIGS_RECORD]
        context.state.array_records[MAIN_PARAMS_RECORD] = ArrayRecord()
        bound = last_round + run.max_server_rounds()
        for server_round in range(last_round + 1, bound + 1):
            cfg[Key.CURRENT_ROUND] = server_round
            self.fit_workflow(grid, context)
            log(logging.INFO, "%s", progress_line(run.history[-1], run.config.num_rounds))
            for listener in ROUND_LISTENERS:
                listener(run.history[-1], bound - server_round + rounds_after)
            if self.checkpoint_dir is not None:
                save_checkpoint(run.snapshot(), self.checkpoint_dir)
            if run.finished:
                break
        return server_round


def central_baseline(result: RunResult, config: RunConfig) -> dict | None:
    """Central KMeans (n_init 10) on the pooled rows, and the run's own centroids scored
    on those rows (``central-score``, ``score-on-rows``), when the server can rebuild
    them. The run's reported score is that of its sites' groups' partition (each group
    in one cluster, whole); labelled row by row, as a site's ``predict`` does, the rows
    score at most that, and this is the score to compare with central k-means.

    Only in simulation: every site then says which built-in data set and partitioning it
    holds, and the server reloads the same data set. In a deployment there is no pooled
    data anywhere, and no baseline.
    """
    provenances = [s.provenance for s in result.sites]
    if not provenances or any("dataset" not in p for p in provenances):
        return None  # (before importing scikit-learn: a deployed ServerApp never needs it)
    from sklearn.cluster import KMeans

    from fedcluster.common.datasets import load_builtin

    first = provenances[0]
    if any(p != first for p in provenances) or len(provenances) != first["num-partitions"]:
        return None
    X, _ = load_builtin(str(first["dataset"]), config.seed)
    if result.transform is not None:  # the federated transform, as the sites applied it
        X = result.transform.apply(X)
    model = KMeans(result.k, n_init=10, random_state=config.seed).fit(X)
    on_rows = float(kernels.assign(X, result.best["centroids"])[1].mean())
    return {"central-score": float(model.inertia_ / len(X)), "score-on-rows": on_rows}


def build_model(result: RunResult, config: RunConfig, central: dict | None) -> Model:
    """The model file of a finished run (``Run.result``), its metrics and reports."""
    best = result.best
    metrics = {
        **private.private_metrics(config, result.final_metrics),
        "n-rows": best["stats"].n_rows,
        "n-sites": len(result.sites),
        "rounds": best["rounds"],
        "seed": best["seed"],
        "cluster-sizes": [int(c) for c in best["stats"].counts],
        # each site's sizes under Table 1's small-cell rule (DP: noisy counts, DP's own)
        "per-site": (best["per-site"] if config.private
                     else reports.protected_per_site(best["per-site"], result.floor)),
        "participation": participation(result.history, config),
        "rejected-sites": dict(result.rejected),
        "site-failures": {key: list(v) for key, v in result.site_failures.items()},
        # Sites that answered as many task rounds as their own policy allows.
        "sites-at-max-rounds": {site.key: site.max_rounds for site in result.sites
                                if site.at_limit},
        # Sites that opted out of groups (min-cluster-size = 1) and answered from rows.
        "sites-answering-from-rows": [site.key for site in result.sites
                                      if site.answers_from_rows],
        # the figures are the report's groups' (strategies/report_round.py)
        "report-groups": bool(best.get("report")),
        # every site's rows: answered from, waiting, held back (strategies/site_rows.py)
        "site-rows": {site.key: site.rows for site in result.sites if site.rows},
        **private.accounting(config, result.history, result.box, result.bounds_from_data),
    }
    if (schema := run_schema(config.schema_file)) is not None or config.missing != "error":
        metrics["table"] = reports.table_summary(result.sites,
                                                 schema[1] if schema else "")
    if central is not None:
        metrics.update(central)
    if result.profile_note:  # why Table 1 is missing or partial
        metrics["profile-note"] = result.profile_note
    if "site-centroids" in best:  # GTV: the sites' own models and how they fit the federation
        metrics.update({"site-scores": best["site-scores"], "consensus": config.consensus,
                        "consensus-site": best["consensus-site"],
                        "gtv-per-edge": best["gtv-per-edge"]})
    return Model(
        centroids=best["centroids"],
        algorithm=config.algorithm,
        config=config.model_dump(by_alias=True),
        feature_names=result.feature_names,
        metrics=metrics,
        history=result.history,
        fuzzifier=config.fuzzifier if config.algorithm == "ffcm" else None,
        site_centroids=best.get("site-centroids"),
        scaling=result.transform,
        # The run's schema (public: every site holds it), for predict on a raw table.
        schema=None if schema is None else schema[0].model_dump(mode="json", by_alias=True),
        table1=result.table1,
    )


def participation(history: list[dict], config: RunConfig) -> dict:
    """Who answered the run's training rounds, summed: rounds, sites asked, answered,
    failed, and (simulated devices) offline and late."""
    train = [row for row in history if "movement" in row]
    total = {name: sum(row.get(f"sites-{name}", 0) for row in train)
             for name in ("asked", "answered", "failed", "offline", "late")}
    out = {"rounds": len(train), **total}
    if config.simulates_devices:
        out["simulated"] = {"availability": config.simulated_availability,
                            "stragglers": config.simulated_stragglers}
    return out


def run_name(config: RunConfig) -> str:
    prefix = "choose-k-" if config.k_bounds else ""
    return config.run_name or f"{prefix}{config.algorithm}-{datetime.now():%Y%m%d-%H%M%S}"

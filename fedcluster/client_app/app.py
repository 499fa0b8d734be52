"""The ClientApp: one NumPyClient per site, dispatching on the ``task`` config key.

The site's data comes from its node config:

- in simulation (Flower's engine or the in-process harness): ``partition-id`` and
  ``num-partitions`` of the run's built-in ``dataset``, cut by ``partitioning``;
- in deployment: ``data-path`` (CSV with a header, or ``.npy``), parsed once into a
  memory-mapped cache keyed by path, size and mtime (deployment starts a fresh process
  per round, so nothing else may be re-parsed per round); ``columns``, ``id-column`` and
  ``label-column`` say which CSV columns are features, ignored, or labels; or
  ``data-url`` (a SQL database) and its query, read once per run; which of these is
  chosen once, in ``data_sources.py``.

The loaded rows become the site's groups (``group_table.py``: groups of at least its own
``min-cluster-size`` rows, made once per data version and kept beside the data cache),
and every task answers from them; only a differentially private task sees rows
(``private_rows.py``). ``min-cluster-size = 1`` is the explicit opt-out: the site then
answers from its rows, logs a warning, and says so in its describe reply.

A site whose data cannot be loaded does not crash the round: it answers every task with
an error reply naming the problem (file, row, column), logs it, and the server drops it.
The site's own policy (``allow-algorithms``, ``max-rounds``; see
``common/site_policy.py``) is refused the same way, before the data are touched.
"""

from __future__ import annotations

import contextlib
import json
import logging
import zlib
from pathlib import Path

import numpy as np
from flwr.client import Client, NumPyClient
from flwr.clientapp import ClientApp
from flwr.app import ConfigRecord
from flwr.common import Context
from flwr.common.logger import log

from fedcluster.client_app.secure_mod import secure_mod
from fedcluster.common import protocol
from fedcluster.common import secure_codec as secure
from fedcluster.client_app import row_account, site_policy
from fedcluster.common.config import run_config_defaults
from fedcluster.client_app.node_config import (
    ConfigError, NodeConfig, parse_node_config,
)
from fedcluster.client_app import private_tasks, privacy_budget
from fedcluster.client_app.release import gate, record
from fedcluster.client_app.release import ledger as disclosure_ledger
from fedcluster.client_app.data import group_table
from fedcluster.client_app.private_rows import PrivateRows
from fedcluster.client_app import data_sources, site_report
from fedcluster.client_app.data.site_data import SiteData, SiteDataError, default_cache_dir, in_history
from fedcluster.client_app.site_groups import SiteGroups
from fedcluster.client_app.task_io import TaskError, received_centroids, task_param
from fedcluster.client_app.task_runner import run_task

#: The node state's record of the last line the site logged about a report (``_say_once``).
SAID_RECORD = "fedcluster-report-said"


def site_key(node: NodeConfig, node_id: int) -> str:
    """A stable name for this site: ``site-id``, else ``partition-id``, else node id."""
    if node.site_id is not None:
        return node.site_id
    if node.partition_id is not None:
        return str(node.partition_id)
    return f"node-{node_id}"


class SiteClient(NumPyClient):
    """Runs the server's tasks on one site's data and returns aggregates only."""

    def __init__(self, context: Context) -> None:
        self.node_id = context.node_id
        self.run_id = context.run_id
        # Kept by the SuperNode between the per-message ClientApp processes of a run.
        self.state = context.state
        self.run_config = dict(context.run_config)
        self._site: SiteData | None = None
        self._groups: SiteGroups | None = None
        self._grouped: np.ndarray | None = None  # the rows in a group (None: all)
        self._provenance: dict = {}
        self._load_error: str | None = None
        try:
            self.node = parse_node_config(dict(context.node_config))
        except ConfigError as err:
            # The site still answers (with this error) under its own name, if it gave one.
            self.node = NodeConfig(site_id=context.node_config.get("site-id"))
            self._load_error = str(err)
        self.key = site_key(self.node, self.node_id)

    def _load(self) -> SiteGroups:
        """The site's groups (its rows loaded and grouped, or their kept table)."""
        if self._load_error is not None:
            raise SiteDataError(self._load_error)
        if self._groups is None:
            try:
                self._site, self._provenance = data_sources.load_site(
                    self.node, self.run_config, (self.state, self.run_id))
                self._site = in_history(self._site, self.node.history)
                cache = self._site_dir()
                self._groups, self._grouped = group_table.site_groups(
                    self._site, self.node.min_cluster_size, cache)
            except SiteDataError as err:
                self._load_error = str(err)
                raise
            if self._groups.min_size == 1:
                log(logging.WARNING, "site %s: min-cluster-size = 1: this site answers from its "
                    "rows, not from groups (an explicit opt-out of the site-groups promise: a "
                    "coordinator can isolate single rows)", self.key)
            if self._groups.waiting:  # (the coordinator is told too: describe's counts)
                log(logging.WARNING, "site %s: %s", self.key, row_account.waiting_text(self._groups))
        return self._groups

    def _noise_seed(self, config) -> list[int] | None:
        """The seed of this round's DP noise. In simulation (partitions of a built-in
        data set, or the in-process harness's arrays) it is derived from the run's seed,
        the site key, the round and how many DP tasks this site has answered in this run
        (so that runs are reproducible, and a server that sends one round number twice
        still gets fresh noise, not the same draw to subtract). A deployed site draws
        fresh OS entropy (None): a seed the server knows would let it subtract the noise."""
        if not data_sources.simulated(self.node) or "dp-rho" not in config:
            return None
        key = zlib.crc32(self.key.encode())
        draws = site_policy.next_draw(self.state, self.run_id)
        return [int(self.run_config.get("seed", 0)) % 2**32, key, int(config.get("dp-round", 0)),
                draws]

    def _site_dir(self) -> Path | None:
        """Where this site keeps its files across runs (its group table, the privacy
        budget): its cache for a data file; None in simulation (Context.state instead)."""
        if not data_sources.keeps_files(self.node):
            return None
        return Path(self.node.cache_dir or default_cache_dir())

    def _budget_key(self) -> str:
        """The key of this site's dp-budget: what its DP spend is counted against, across
        runs. Every use of the key goes through here. A deployed site's data lineage
        (``release/record/``: its versions, whatever they gained, lost or changed,
        and a file exported anew under another name); a site that opted out of groups
        (no history kept) its file and the way it is read; data held in memory (the
        ledger is then the run's own) the rows' fingerprint."""
        ref = self._groups.table_ref if self._groups is not None else None
        if ref is not None and ref.lineage is not None:
            return f"lineage-{ref.lineage}"
        if self._site.lineage is not None:
            return f"lineage-file-{self._site.lineage}"
        return self._site.rows_fingerprint()

    def _budget_ledger(self, config):
        """The site's dp-budget ledger (a file beside the data cache; Context.state in
        simulation, one per run), under :meth:`_budget_key`, for a task that carries DP
        parameters (None for a plain task: it spends nothing). Always on: a site that
        set no ``dp-budget`` has the default."""
        if protocol.DP_RHO not in config and protocol.DP_RHO_PLANNED not in config:
            return contextlib.nullcontext(None)
        key = self._budget_key()
        directory = self._site_dir()
        if directory is not None:
            return _refuse_on_os_error(privacy_budget.ledger_in_file(
                directory / "privacy-budget", key), "the privacy budget",
                directory / "privacy-budget")
        return privacy_budget.ledger_in_state(self.state, key)

    def _charge(self, ledger: dict | None, task: str, config) -> tuple[float | None, dict | None]:
        """Charge this task's noise to the site's budget (before its reply leaves): the
        zCDP of the site's OWN noise, ``dp-rho`` / ``dp-noise-share``^2
        (``privacy.own_noise_rho``), so that neither the coordinator's ``dp-rho`` nor its
        share sets the noise below what the remaining budget allows. Return the rho
        charged and the budget's state after it (None, None: nothing to charge). A DP
        run's ``describe`` is refused if the run's planned spend does not fit.

        Raises
        ------
        BudgetExhausted
            Naming ``dp-budget`` and what is left.
        TaskError
            A DP parameter out of range.
        """
        if ledger is None:  # a plain task
            return None, None
        budget = privacy_budget.Budget(*self.node.dp_budget)
        planned = _planned_rho(config)
        if task == "describe" and planned is not None:
            share = private_tasks.task_noise_share(config)
            privacy_budget.check_fits(budget, ledger, self.run_id, planned, share)
        if protocol.DP_RHO not in config or task not in private_tasks.SPENDING_TASKS:
            return None, None
        rho, share = private_tasks.task_rho(config)
        charged = privacy_budget.charge(budget, ledger, self.run_id, rho, planned, share)
        return charged, privacy_budget.status(budget, ledger)

    def _ledger_path(self) -> Path | None:
        """The disclosure ledger's file (None: this site keeps none)."""
        if self.node.ledger_path is not None:
            return None if self.node.ledger_path == disclosure_ledger.OFF else Path(self.node.ledger_path)
        directory = self._site_dir()
        return None if directory is None else directory / disclosure_ledger.DEFAULT_NAME

    def _disclose(self, task: str, config, **fields) -> None:
        """Append this reply (or refusal) to the disclosure ledger. A ledger that cannot
        be written stops the reply: nothing leaves the site unrecorded."""
        path = self._ledger_path()
        if path is None:
            return
        line = disclosure_ledger.entry(
            **{"run-id": str(self.run_id), "site": self.key, "round": config.get(protocol.ROUND),
               "task": task, "algorithm": self.run_config.get("algorithm")},
            **{key.replace("_", "-"): value for key, value in fields.items()})
        try:
            disclosure_ledger.append(path, line)
        except OSError as err:
            raise disclosure_ledger.LedgerUnwritable(
                f"the disclosure ledger {path} cannot be written ({err}): the site answers "
                f"no task until it can record what it sends") from None

    def get_parameters(self, config):
        return []

    def _check_policy(self, task: str, config) -> None:
        """Raise PolicyRefusal if the site's own policy refuses this task."""
        algorithm = str(self.run_config.get("algorithm", run_config_defaults()["algorithm"]))
        site_policy.check_algorithm(self.node, algorithm)
        site_policy.check_rounds(self.node, self.state, self.run_id, task)
        site_policy.check_private(self.node, task, config)

    def fit(self, parameters, config):
        config = dict(config)
        if protocol.SEED_BASE in config:  # this site's own seed (the same at the server)
            try:
                base = json.loads(str(config[protocol.SEED_BASE]))
                config["seed"] = protocol.site_seed(base, self.key)
            except (TypeError, ValueError):
                pass  # the task then refuses for want of a seed, naming the parameter
        if config.get("task") == "describe" and protocol.THEN in config:
            return self._describe_and_first_task(parameters, config)
        return self._fit_task(parameters, config)

    def _describe_and_first_task(self, parameters, config):
        """The describe handshake with the run's first task (``protocol.THEN``): both
        run as two tasks would (policies, ledger lines, counts), one reply carries both."""
        carried = {**config, "task": str(config.pop(protocol.THEN))}
        arrays, n_rows, metrics = self._fit_task(parameters, config)
        if protocol.ERROR in metrics:
            return arrays, n_rows, metrics
        carried_arrays, _, carried_metrics = self._fit_task(parameters, carried)
        if protocol.ERROR in carried_metrics:  # admitted, but without this task's reply
            return arrays, n_rows, {**metrics, protocol.THEN_ERROR: carried_metrics[protocol.ERROR]}
        return carried_arrays, n_rows, {**metrics, **carried_metrics}

    def _fit_task(self, parameters, config):
        task = str(config.get("task", "?"))
        groups_digest = None
        try:
            self._check_policy(task, config)
            groups = self._load()
            groups_digest = groups.digest[:16]
            site_policy.check_site_rows(self.node, groups.n_rows, groups.waiting,
                                        groups.held_back, groups.held_back_why)
            rows = PrivateRows(self._site.X, self._grouped, groups.source)
            arrays = [np.asarray(a) for a in parameters]
            report = bool(config.get(protocol.REPORT)) and task in protocol.REPORT_TASKS \
                and not config.get(protocol.DP_RHO)
            # a report's parts are judged and recorded under the record's one lock, held
            # until the reply's ledger line is written (``release/gate.py``, 0)
            held = record.Record.of(groups.table_ref) if report else None
            with contextlib.ExitStack() as stack:
                if held is not None:
                    store = stack.enter_context(_refuse_on_os_error(
                        held.held(), "the site's record", Path(held.name)))
                    groups = self._report_groups(groups, task, arrays, config, store)
                    groups_digest = groups.digest[:16]
                if not gate.in_record(groups):
                    raise TaskError(f"task {task}: the table it would answer from is not in "
                                    "the site's record (nothing leaves unjudged)")
                with self._budget_ledger(config) as budget_ledger:
                    rho, budget = self._charge(budget_ledger, task, config)
                    reply = run_task(groups, arrays, dict(config),
                                     self.node.min_cluster_size, noise_seed=self._noise_seed(config),
                                     private_rows=rows)
                from_rows = self._site.rows_fingerprint()[:16] if rho is not None else None

                def write(**fields):
                    self._disclose(task, config, groups=groups_digest, rows=from_rows, dp_rho=rho,
                                   budget=budget, **fields)
                answer = gate.leave(reply, task, config, groups.n_rows, self.key, write,
                                    self._policy_metrics(task, groups))
        except (site_policy.PolicyRefusal, disclosure_ledger.LedgerUnwritable, SiteDataError,
                TaskError, secure.SecureAggregationError) as err:
            log(logging.ERROR, "site %s: task %s refused: %s", self.key, task, err)
            if not isinstance(err, disclosure_ledger.LedgerUnwritable):
                with contextlib.suppress(disclosure_ledger.LedgerUnwritable):
                    self._disclose(task, config, refused=str(err), groups=groups_digest)
            if secure.SECURE_PARAM in config:
                # Under SecAgg+ an empty reply would be summed with the others: fail the
                # message instead (the protocol then drops this site from the sum).
                raise
            return [], 0, {protocol.SITE_KEY: self.key, protocol.ERROR: str(err)}
        site_policy.count_round(self.state, self.run_id, task)
        return answer

    def _report_groups(self, groups: SiteGroups, task: str, arrays: list, config,
                       store) -> SiteGroups:
        """The final model's report table at the centroids the task sent (``arrays``, as
        the task reads them): ``site_report.report_table``, judged with the site's record
        ``store`` (held under its lock)."""
        try:
            centroids = protocol.task_inputs(task, arrays).centroids
        except protocol.ProtocolError as err:
            raise TaskError(f"task {task}: {err}") from None
        if not self.node.report_parts:
            return groups  # the site answers every report from its groups whole
        group_of_row = group_table.row_groups(self._site, groups.min_size, self._site_dir())
        try:
            made, why = site_report.report_table(
                self._site, groups, group_of_row, received_centroids(centroids, groups),
                str(config["transform"]) if "transform" in config else None,
                private_tasks.site_bounds(dict(config), groups.n_features), store)
        except ValueError as err:
            raise TaskError(f"task {task}: the report's groups: {err}") from None
        if made.split:
            self._say_once(logging.INFO, (
                f"site {self.key}: the report splits {made.split} straddling group(s) "
                f"({made.moved} row(s) counted in the model's cluster; {made.carried} "
                "feature(s) carried at a stood-in mean)" + (f"; others kept whole ({why})"
                                                             if why else "")))
        elif why:
            self._say_once(logging.WARNING, f"site {self.key}: the report counts groups whole: {why}")
        return made.groups

    def _say_once(self, level: int, message: str) -> None:
        """Log ``message`` unless this site logged it already in this run: a run asks for
        the same report in three rounds (the evaluation, Davies-Bouldin's, the profile),
        and a site's log says what it did once per run (the node's state keeps the last
        line said, with the run's id)."""
        said = self.state.config_records.get(SAID_RECORD)
        if said is not None and said.get("run-id") == str(self.run_id) and said.get("line") == message:
            return
        log(level, "%s", message)
        self.state.config_records[SAID_RECORD] = ConfigRecord({"run-id": str(self.run_id),
                                                               "line": message})

    def _policy_metrics(self, task: str, site: SiteGroups) -> dict:
        """The site's own figures a plain reply carries besides its values (policies and
        provenance, not data)."""
        metrics = {}
        if self.node.max_rounds is not None and task != "describe":
            # The site's own count (a policy figure, not data), which the server follows
            # (under SecAgg+ the server counts the rounds itself); this reply is the next.
            metrics[protocol.ROUNDS_LEFT] = (self.node.max_rounds - 1
                                             - site_policy.rounds_answered(self.state, self.run_id))
        if task == "describe":
            metrics.update(self._provenance)
            # Whether the site key is stable (site-id or partition-id) or a node id.
            metrics["site-id-given"] = (
                self.node.site_id is not None or self.node.partition_id is not None)
            if self.node.max_rounds is not None:
                # A policy, not data: the server then stops asking once it is reached.
                metrics["max-rounds"] = self.node.max_rounds
            # The size of the groups the site answers from (a policy): 1 names a site that
            # opted out and answers from its rows, which the run's outputs say.
            metrics[protocol.GROUP_SIZE] = site.min_size
        return metrics


def _planned_rho(config) -> float | None:
    """The run's planned rho (``dp-rho-planned``; None when not sent), checked."""
    if protocol.DP_RHO_PLANNED not in config:
        return None
    planned = task_param(config, protocol.DP_RHO_PLANNED, float)
    if not planned > 0:
        raise TaskError(f"bad DP parameter: {protocol.DP_RHO_PLANNED} {planned}")
    return planned


@contextlib.contextmanager
def _refuse_on_os_error(kept, what: str, directory: Path):
    in_body = False  # only the record's own reading and writing is turned into a refusal
    try:
        with kept as record:
            in_body = True
            yield record
            in_body = False
    except (OSError, ValueError) as err:
        if in_body:
            raise
        raise site_policy.PolicyRefusal(
            f"{what} cannot keep this site's record in {directory} ({err}): the site "
            f"answers no task until its cache-dir is writable") from None


def client_fn(context: Context) -> Client:
    return SiteClient(context).to_client()


# secure_mod: Flower's secaggplus_mod for SecAgg+ messages; every other message passes
# through unchanged (plain rounds and plain runs).
app = ClientApp(client_fn=client_fn, mods=[secure_mod])

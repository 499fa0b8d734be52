"""The in-process harness: the real ServerApp and ClientApp, driven by a Grid that calls
the ClientApp directly (no Ray, no network). For tests and benchmarks, never a third
engine: it gives the same numbers as Flower's simulation engine for the same seed (a
test checks it), because the strategy reduces replies in a stable site order.

Python API::

    result = fedcluster.simulate([X0, X1, X2], n_clusters=5, algorithm="dwf")
    result.centroids, result.history, result.metrics["score"], result.model
    fedcluster.choose_k([X0, X1, X2], k_range=(2, 8))  # every k, one federation
    fedcluster.simulate([X0, X1], missing="impute-mean")    # arrays that hold NaN
    fedcluster.simulate([df0, df1], schema="schema.toml")    # DataFrames through a schema
"""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Iterable
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
from flwr.app import ArrayRecord, Context, Error, Message, RecordDict
from flwr.common import parameters_to_ndarrays
from flwr.common.constant import SUPERLINK_NODE_ID, ErrorCode
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS
from flwr.compat.common import recorddict_compat as compat
from flwr.proto.node_pb2 import NodeInfo  # pylint: disable=E0611
from flwr.serverapp import Grid
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity

from fedcluster import client_app as client_module
from fedcluster import server_app as server_module
from fedcluster.common import kernels, protocol
from fedcluster.common.config import kebab_keys, parse_run_config, run_config_defaults
from fedcluster.client_app.data.site_data import SiteData, check_site_array
from fedcluster.simulation_progress import shown
from fedcluster.simulation_tables import table_run
from fedcluster.strategies.metrics import knowledge_gap
from fedcluster.common.model import Model

def _new_run_id() -> int:
    """A fresh run id, random as Flower's (sites key what they keep across runs by it:
    the privacy budget, the disclosure ledger; a counter would repeat in a new process)."""
    return uuid.uuid4().int >> 65


class InProcessGrid(Grid):
    """A Grid whose nodes are ClientApp calls in this process, one Context per node."""

    def __init__(
        self, client_app, node_configs: list[dict], run_config: dict, recorder: list | None = None
    ) -> None:
        self._run = Run.create_empty(_new_run_id())
        self.client_app = client_app
        # When a list is given, every reply that leaves a site is appended to it, decoded
        # (for audits of what crosses the trust boundary).
        self.recorder = recorder
        # Node ids are deliberately not 0..M-1: nothing may depend on them.
        rng = np.random.default_rng(len(node_configs))
        ids = rng.choice(2**62, size=len(node_configs), replace=False) + 1
        self.contexts = {
            int(node_id): Context(
                run_id=self._run.run_id,
                node_id=int(node_id),
                node_config=dict(cfg),
                state=RecordDict(),
                run_config=dict(run_config),
            )
            for node_id, cfg in zip(ids, node_configs)
        }
        self._inbox: dict[str, Message] = {}

    def set_run(self, run: Run) -> None:
        self._run = run

    @property
    def run(self) -> Run:
        return self._run

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None) -> Message:
        return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

    def get_node_ids(self) -> Iterable[int]:
        return list(self.contexts)

    def get_nodes(self) -> Iterable[NodeInfo]:
        return [NodeInfo(node_id=node_id) for node_id in self.contexts]

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        ids = []
        for msg in messages:
            msg.metadata.__dict__["_message_id"] = uuid.uuid4().hex
            msg.metadata.__dict__["_run_id"] = self._run.run_id
            self._inbox[msg.metadata.message_id] = msg
            ids.append(msg.metadata.message_id)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        replies = []
        for message_id in message_ids:
            msg = self._inbox.pop(message_id, None)
            if msg is None:
                continue
            context = self.contexts[msg.metadata.dst_node_id]
            # A real transport serialises each message: the site gets its own copy (a
            # ServerApp may send one content object to several nodes, as SecAgg+ does,
            # and Flower's secaggplus_mod mutates what it receives).
            msg = copy.deepcopy(msg)
            try:
                reply = self.client_app(msg, context)
            except Exception as err:  # a site crash is a failed reply, as in Flower
                reply = Message(Error(ErrorCode.CLIENT_APP_RAISED_EXCEPTION, repr(err)), reply_to=msg)
            if self.recorder is not None and reply.has_content():
                self._record(msg, reply)
            replies.append(reply)
        return replies

    def _record(self, instruction: Message, reply: Message) -> None:
        # SecAgg+'s protocol messages (secure-aggregation): keys, shares, masked sums.
        secagg = reply.content.config_records.get(RECORD_KEY_CONFIGS)
        if "fitins.config" not in instruction.content.config_records:
            self.recorder.append(
                {"node-id": instruction.metadata.dst_node_id, "task": None, "params": {}, "sent": [],
                 "arrays": [], "metrics": {}, "num-examples": None, "secagg": dict(secagg or {})})
            return
        fitins = compat.recorddict_to_fitins(instruction.content, keep_input=True)
        fitres = compat.recorddict_to_fitres(reply.content, keep_input=True)
        self.recorder.append(
            {
                "node-id": instruction.metadata.dst_node_id,
                "task": fitins.config.get("task"),
                "params": dict(fitins.config),
                "sent": parameters_to_ndarrays(fitins.parameters),
                "arrays": parameters_to_ndarrays(fitres.parameters),
                "metrics": dict(fitres.metrics),
                "num-examples": fitres.num_examples,
                "secagg": dict(secagg or {}),
            }
        )

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None):
        return self.pull_messages(self.push_messages(messages))


@dataclass
class SimulationResult:
    """What :func:`simulate` returns."""

    model: Model

    @property
    def centroids(self) -> np.ndarray:
        return self.model.centroids

    @property
    def history(self) -> list[dict]:
        return self.model.history

    @property
    def metrics(self) -> dict:
        return self.model.metrics

    @property
    def profile(self):
        """Table 1 by cluster, a pandas DataFrame of the rows of ``table1.csv``
        (:attr:`Model.profile`); None when the run left no profile."""
        return self.model.profile


def serve_in_process(
    node_configs: list[dict],
    run_config: dict,
    initial_centroids: np.ndarray | None = None,
    record_replies: list | None = None,
):
    """Run the real ServerApp against in-process ClientApps; return its result record."""
    full_config = {**run_config_defaults(), **run_config}
    config = parse_run_config(full_config)  # a bad key fails here, before any site runs
    if len(node_configs) < config.min_sites:  # a deployment would wait; here none can come
        raise ValueError(f"{len(node_configs)} site(s) given, but min-sites = "
                         f"{config.min_sites}: give more sites or a smaller min-sites")
    grid = InProcessGrid(client_module.app, node_configs, full_config, record_replies)
    state = RecordDict()
    if initial_centroids is not None:
        state.array_records[server_module.INITIAL_CENTROIDS] = ArrayRecord(
            [np.ascontiguousarray(initial_centroids, dtype=np.float64)]
        )
    # What Flower's ServerApp runtime sets in its process before running the app.
    TaskIdentity.task_id = 1
    TaskIdentity.run_id = grid.run.run_id
    TaskIdentity.node_id = SUPERLINK_NODE_ID
    context = Context(
        run_id=grid.run.run_id, node_id=0, node_config={}, state=state, run_config=full_config
    )
    server_module.app(grid, context)
    return context.state.config_records[server_module.RESULT]


def record_parts(record: dict) -> list[tuple[str, list, dict]]:
    """A recorded reply as (task, arrays, metrics) per task whose statistics it carries:
    a describe that carried the run's first task (``protocol.THEN``) is that task's reply;
    a training reply with ``protocol.EVALUATE_TOO`` splits into its own and the evaluation."""
    if record.get("task") is None:
        return []
    params, arrays, metrics = record.get("params", {}), record["arrays"], record["metrics"]
    task = str(params.get(protocol.THEN, record["task"]))
    if params.get(protocol.EVALUATE_TOO) and protocol.ERROR not in metrics and arrays:
        own, own_metrics, evaluation, evaluation_metrics = protocol.split_evaluation(
            task, arrays, metrics)
        return [(task, own, own_metrics), ("evaluate", evaluation, evaluation_metrics)]
    return [(task, arrays, metrics)]


def record_tasks(record: dict) -> list[str]:
    """The tasks a recorded message answered: its ``task``, the first task a describe
    carried, and ``evaluate`` for a training reply that carried its evaluation."""
    if record.get("task") is None:
        return []
    carried = [record["task"]] if protocol.THEN in record.get("params", {}) else []
    return carried + [task for task, _, _ in record_parts(record)]


def run_in_process(
    node_configs: list[dict],
    run_config: dict,
    initial_centroids: np.ndarray | None = None,
    record_replies: list | None = None,
) -> SimulationResult:
    """Run the real ServerApp against in-process ClientApps with these node configs."""
    record = serve_in_process(node_configs, run_config, initial_centroids, record_replies)
    return SimulationResult(Model.from_json(str(record["model"])))


@contextmanager
def site_nodes(sites: list[np.ndarray] | None, labels: list[np.ndarray] | None = None,
               num_sites: int | None = None, site_config: dict | None = None):
    """Node configs for in-memory site arrays (registered for the run, removed after it)
    or, without arrays, for ``num_sites`` partitions of the run's built-in dataset;
    ``site_config`` adds node-config keys to every site. A site given as ``SiteData`` (a
    table encoded through a schema: ``simulation_tables``) is registered as it is."""
    extra = dict(site_config or {})
    if sites is None:
        if num_sites is None:
            raise ValueError("give either `sites` (arrays) or `num_sites` (built-in dataset)")
        yield [{"partition-id": i, "num-partitions": num_sites, **extra} for i in range(num_sites)]
        return
    token = uuid.uuid4().hex
    site_data = []
    if labels is not None and len(labels) != len(sites):
        raise ValueError(f"{len(labels)} label arrays for {len(sites)} sites")
    for i, X in enumerate(sites):
        if isinstance(X, SiteData):
            site_data.append(X)
            continue
        source = f"site {i}"
        X = check_site_array(np.asarray(X), source)
        y = None if labels is None else np.asarray(labels[i])
        if y is not None and y.shape != X.shape[:1]:
            raise ValueError(f"{source}: labels of shape {y.shape} for its {X.shape[0]} rows")
        site_data.append(SiteData(X, None, y, source))
    client_module.MEMORY_SITES[token] = site_data
    try:
        yield [{"data-path": f"{client_module.MEMORY_PREFIX}{token}/{i}", "site-id": str(i),
                **extra} for i in range(len(sites))]
    finally:
        client_module.MEMORY_SITES.pop(token, None)


def run_server(sites: list[np.ndarray] | None, *, run_config: dict, labels=None,
               num_sites: int | None = None, site_config: dict | None = None,
               record_replies: list | None = None):
    """The ServerApp's result record for a run on in-memory sites or built-in partitions."""
    with site_nodes(sites, labels, num_sites, site_config) as node_configs:
        return serve_in_process(node_configs, run_config, record_replies=record_replies)


def simulate(
    sites: list[np.ndarray] | None = None,
    *,
    labels: list[np.ndarray] | None = None,
    num_sites: int | None = None,
    init_centroids: np.ndarray | None = None,
    site_min_cluster_size: list[int] | None = None,
    site_config: dict | None = None,
    record_replies: list | None = None,
    true_centres: np.ndarray | None = None,
    missing: str | None = None,
    schema=None,
    units: dict | list[dict] | None = None,
    verbose: bool = False,
    **config,
) -> SimulationResult:
    """Run a federation in this process.

    Parameters
    ----------
    sites : list of 2-D arrays, or of DataFrames with ``schema``, optional
        One array per site (they stay in this process; each site's ClientApp sees only
        its own). Without ``sites``, the run config's built-in ``dataset`` is cut into
        ``num_sites`` partitions by ``partitioning``, exactly as Flower's simulation
        engine does with ``num-supernodes``. With ``schema``: one pandas DataFrame or
        ``(header, columns)`` pair (cells given column-wise) per site.
    labels : list of 1-D arrays, optional
        Per-site labels, kept at the sites (evaluation only). With a schema, the table's
        ``label`` column gives them instead.
    init_centroids : (k, d) array, optional
        Start from these centroids instead of the ``init`` round (in the scaled space
        when ``scale`` is set).
    site_min_cluster_size : list of int, optional
        Each site's own privacy floor (its node config ``min-cluster-size``, default 2):
        the size of the groups it answers from; 1 makes a site answer from its rows
        (exactly the row-level algorithm, and no site-groups promise).
    site_config : dict, optional
        Other node-config keys for every site, e.g. ``{"min-site-rows": 1}`` to let sites
        of fewer than 10 rows take part, ``{"min-cluster-size": 1}`` for sites that answer
        from their rows, ``{"ledger-path": path}`` for a disclosure ledger
        (docs/reference/node-config.md).
    record_replies : list, optional
        If given, every reply that leaves a site is appended to it as a dict (``task``,
        ``arrays``, ``metrics``, ``num-examples``, ``node-id``): what a site discloses;
        ``sent`` and ``params`` hold the arrays and the task parameters (the scaling
        ``transform`` included) the site received for that task.
    true_centres : (k, d) array, optional
        The centres the data were generated from. Adds FFCM's ``knowledge-gap`` (sum of
        distances under the optimal one-to-one matching) and ``ngap`` (gap / sqrt(d)) to
        ``result.metrics`` (computed here, from the final centroids; not in files).
    missing : {"error", "drop-row", "impute-mean"}, optional
        Arrays that hold NaN: drop a row with a missing cell, or fill the cell with the
        pooled mean of the column's present cells (one imputation round). ``"error"`` or
        None: a NaN is an error. ``"impute-median"`` needs each column's range: give a
        schema.
    schema : Schema, dict or path of a TOML/JSON file, optional
        The agreed table (docs/reference/schema.md): each site is encoded exactly as a
        deployed site encodes its file (categories, units, ranges, missing policies),
        and the run checks its hash and imputes as in deployment. A site that does not
        fit raises ``SiteDataError`` naming the site, row (1-based), column and value.
    units : dict or list of dict, optional
        With a schema: the unit a column is in (``{"glucose": "mmol/L"}``), for every site
        or one dict per site, as a site's node config ``units``.
    verbose : bool, default False
        Every log line (a line per round, the sites' notes, the summary), as
        ``fedcluster simulate`` prints them. By default a progress bar counts the rounds
        and only warnings and errors are shown; every record still reaches Python's
        logging (``fedcluster/simulation_progress.py``).
    **config
        Run-config keys with ``-`` written ``_`` (``n_clusters=5``, ``local_iters=1``).
        Files are written only if ``output_dir`` is given.

    Returns
    -------
    SimulationResult
        Its ``metrics`` are the run's (``score``: that of the sites' groups, each in one
        cluster whole) and, with ``sites`` given, ``score-on-rows``: the model's own
        score on the pooled rows, each labelled on its own (at most ``score``).
    """
    run_config = kebab_keys(config)
    run_config.setdefault("output-dir", "")
    if run_config.get("k-range"):
        raise ValueError("a k-range run gives one model per k: use fedcluster.choose_k")
    if true_centres is not None:
        true_centres = np.asarray(true_centres, dtype=np.float64)
        k = run_config.get("n-clusters", run_config_defaults()["n-clusters"])
        if true_centres.ndim != 2 or true_centres.shape[0] != k:
            raise ValueError(f"true_centres must be a ({k}, d) array, got {true_centres.shape}")
    with table_run(sites, labels, run_config, schema=schema, missing=missing,
                   units=units) as (sites, labels), \
            site_nodes(sites, labels, num_sites, site_config) as node_configs:
        if site_min_cluster_size is not None:
            for cfg, floor in zip(node_configs, site_min_cluster_size, strict=True):
                cfg["min-cluster-size"] = int(floor)
        with shown(verbose):
            result = run_in_process(node_configs, run_config, init_centroids, record_replies)
        if sites is not None:
            result.metrics["score-on-rows"] = score_on_rows(result.model, sites)
    if true_centres is not None:
        result.metrics.update(knowledge_gap(result.centroids, true_centres))
    return result


def score_on_rows(model: Model, sites: list) -> float:
    """The model's own score on the pooled rows of ``sites`` (mean squared distance of
    each row, in the run's space, to its nearest centroid), labelled row by row as a
    site's ``predict`` does. The run's reported ``score`` is that of the sites' groups'
    partition (each group in one cluster, whole), which is at least this."""
    X = np.vstack([np.asarray(s.X if isinstance(s, SiteData) else s, dtype=np.float64) for s in sites])
    if model.scaling is not None:
        X = model.scaling.apply(X)
    X = X[np.isfinite(X).all(axis=1)]
    return float(kernels.assign(X, model.centroids)[1].mean())


def choose_k(sites: list[np.ndarray] | None = None, *, k_range: tuple[int, int] | str,
             labels: list[np.ndarray] | None = None, num_sites: int | None = None,
             site_config: dict | None = None,
             record_replies: list | None = None, missing: str | None = None, schema=None,
             units: dict | list[dict] | None = None, verbose: bool = False,
             **config) -> dict:
    """Run the federation for every k in ``k_range`` (in this process) and choose k.

    Parameters
    ----------
    sites : list of 2-D arrays, optional
        One array per site, as for :func:`fedcluster.simulate`; without it, ``num_sites``
        partitions of the built-in ``dataset``.
    k_range : (lo, hi) or "lo:hi"
        Both ends included; 2 <= lo and hi >= lo + 2.
    labels : list of 1-D arrays, optional
        Per-site labels (evaluation only: adds ARI etc. to the per-k figures).
    site_config, record_replies, missing, schema, units, verbose
        As for :func:`fedcluster.simulate` (with ``schema``, DataFrames as sites; one
        progress bar over every k's rounds).
    **config
        Run-config keys with ``_`` for ``-`` (``algorithm``, ``scale``, ``n_init``,
        ``k_warm_start``, ``output_dir`` to also write choose-k.json/png, ...).

    Returns
    -------
    dict
        ``elbow``, ``simplified-silhouette``, ``davies-bouldin``, ``calinski-harabasz``:
        the k each criterion picks; ``per-k``: {k: figures} (``inertia``, ``score``, the
        three criteria, label metrics where labels are given, ``rounds``, ...);
        ``models``: {k: :class:`fedcluster.Model`}.
    """
    text = k_range if isinstance(k_range, str) else f"{k_range[0]}:{k_range[1]}"
    run_config = kebab_keys(config)
    run_config.setdefault("output-dir", "")
    run_config["k-range"] = text
    with table_run(sites, labels, run_config, schema=schema, missing=missing,
                   units=units) as (sites, labels), shown(verbose):
        record = run_server(sites, labels=labels, num_sites=num_sites, run_config=run_config,
                            site_config=site_config,
                            record_replies=record_replies)
    data = json.loads(str(record["choose-k"]))
    out: dict = dict(data["best"])
    out["per-k"] = {int(k): row for k, row in data["per-k"].items()}
    out["models"] = {int(k): Model.from_json(json.dumps(m)) for k, m in data["models"].items()}
    return out

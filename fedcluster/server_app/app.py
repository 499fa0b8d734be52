"""The ServerApp: run config -> strategy -> rounds (``workflow.py``) -> outputs.

``fedcluster.server_app:app`` is the ServerApp that ``flwr run`` and a SuperLink start;
a k-range run goes to ``choose_k.py``, a resumed run starts from ``checkpoint.py``, and
with ``secure-aggregation`` the sum rounds go through ``secure_fit.py``.
"""

from __future__ import annotations

import importlib
import logging
import threading

from flwr.app import ConfigRecord, Context
from flwr.common.logger import log
from flwr.server import LegacyContext, ServerConfig
from flwr.serverapp import Grid, ServerApp

from fedcluster.common.config import parse_run_config
from fedcluster.common.schema import SchemaError, run_schema
from fedcluster.server_app.checkpoint import load_checkpoint
from fedcluster.server_app.choose_k import run_k_range
from fedcluster.server_app.outputs import summary_table, write_outputs
from fedcluster.server_app.run_outcome import check_every_site, run_directory
from fedcluster.server_app.secure_fit import make_fit_workflow
from fedcluster.server_app.workflow import (
    INITIAL_CENTROIDS, RESULT, ClusteringWorkflow, build_model, central_baseline, fit_round, run_name,
)
from fedcluster.strategies import FederationError, make_strategy
from fedcluster.strategies.flower_adapter import FlowerAdapter

app = ServerApp()


def import_ahead(config) -> None:
    """Import in a background thread what this run's server needs only later (scikit-learn
    for clustering the sites' centroids, matplotlib for the plots), while it waits for the
    sites' first replies, instead of after them: ~1-2 s less wall time per run."""
    clusters = (config.resolved_init in ("kfed", "divisive")
                or config.algorithm in ("kfed", "fkm", "gtv"))
    plots = bool(config.output_dir)

    def imports() -> None:
        if clusters:
            importlib.import_module("sklearn.cluster")
        if plots:  # the backend the plots use (outputs.py), chosen before pyplot loads
            importlib.import_module("matplotlib").use("Agg")
            importlib.import_module("matplotlib.pyplot")

    if clusters or plots:
        threading.Thread(target=imports, name="fedcluster-import-ahead", daemon=True).start()


@app.main()
def main(grid: Grid, context: Context) -> None:
    config = parse_run_config(dict(context.run_config))
    try:  # the schema a run names is read before any round: a bad one stops it at once
        run_schema(config.schema_file)
    except SchemaError as err:
        raise FederationError(f"run config 'schema': {err}") from None
    import_ahead(config)
    initial = context.state.array_records.get(INITIAL_CENTROIDS)
    initial_centroids = initial.to_numpy_ndarrays()[0] if initial is not None else None
    if config.k_bounds is not None:
        if initial_centroids is not None:
            raise FederationError("k-range runs every k from its own start; give no initial centroids")
        result = run_k_range(grid, context, config)
        context.state.config_records[RESULT] = ConfigRecord({"choose-k": result})
        return
    if config.resume_from:
        strategy = load_checkpoint(config.resume_from, config)
    else:
        strategy = make_strategy(config, initial_centroids)
    directory = run_directory(config.output_dir, run_name(config), config.resume_from)
    legacy = LegacyContext(context=context, config=ServerConfig(),
                           strategy=FlowerAdapter(strategy))
    log(logging.INFO, "fedcluster: %s, k = %s, up to %s rounds", config.algorithm, config.n_clusters, config.num_rounds)
    fit_workflow = make_fit_workflow(config, fit_round)
    ClusteringWorkflow(fit_workflow, checkpoint_dir=directory)(grid, legacy)

    result = strategy.result()
    central = central_baseline(result, config) if config.central_baseline else None
    model = build_model(result, config, central)
    log(logging.INFO, "%s", summary_table(model.metrics))
    if directory is not None:
        write_outputs(directory, model)
        log(logging.INFO, "outputs written to %s", directory.resolve())
    # For the in-process harness: the result travels back in the Context's state.
    context.state.config_records[RESULT] = ConfigRecord({"model": model.to_json()})
    check_every_site(config.every_site, model.metrics, directory)

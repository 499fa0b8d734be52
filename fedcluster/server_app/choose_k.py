"""Choosing k in one federated run: ``k-range = "LO:HI"`` in the run config.

The ServerApp runs the configured algorithm for every k in LO..HI on the same federation:
the sites describe themselves (and send their scaling statistics) once; each k then has its
own initialisation, training, and the exact evaluation rounds, whose metrics are the
per-k figures (inertia, simplified silhouette, Davies-Bouldin, Calinski-Harabasz; every one
computed from the sites' sufficient statistics, none from rows). ``server_app/criteria.py``
turns them into the best k per criterion.

Warm start (``k-warm-start = true``, the default): k + 1 starts from k's centroids with
the cluster of largest SSE split in two; with n-init > 1 the other repetitions start cold
and the lowest score wins. Measured on SIPU s1 (BENCHMARKS.md "choose_k_s1", 5 sites,
k = 2..20, DWF): every start mode picks the same k by every criterion. Since the default
start of DWF/EWF/mini-batch became the weighted k-FED round, cold starts cost no more
rounds than warm ones (176 vs 179, IID split) and land closer to the best known inertia
per k (0.3 % above it on average, warm 2.1 %); warm + 2 cold starts (n-init 3) gives the
best figures (0.0 %). The default stays warm until more than one data set says otherwise.
One-shot k-FED has no training, so it always starts cold.

Outputs, in ``output-dir/<run-name>/``: ``choose-k.json`` (the best k per criterion and the
figures per k), ``choose-k.png``, and one ``model-k<k>.json`` per k.
Python API: :func:`fedcluster.choose_k` (in ``simulation.py``, beside ``simulate``); command line: ``fedcluster choose-k``.
"""

from __future__ import annotations

import json
import logging
import math

from flwr.app import Context
from flwr.common.logger import log
from flwr.server import LegacyContext, ServerConfig

from fedcluster.common.config import RunConfig
from fedcluster.server_app.criteria import CRITERIA, best_k, split_largest_cluster
from fedcluster.strategies.metrics import METRIC_NAMES
from fedcluster.common.model import Model, json_default
from fedcluster.server_app.outputs import write_choose_k
from fedcluster.server_app.run_outcome import run_directory
from fedcluster.server_app.workflow import ClusteringWorkflow, build_model, run_name
from fedcluster.strategies import make_strategy
from fedcluster.strategies.flower_adapter import FlowerAdapter

# What each k's row of the figures holds, besides the metrics.
_EXTRA = ("rounds", "seed", "cluster-sizes")


def figures(model: Model) -> dict:
    """One k's figures: its exact metrics, rounds, winning seed and cluster sizes."""
    return {key: model.metrics[key] for key in (*METRIC_NAMES, *_EXTRA) if key in model.metrics}


def run_k_range(grid, context: Context, config: RunConfig) -> str:
    """The ServerApp's k-range run; returns the choose-k result as JSON (see :func:`report`)."""
    lo, hi = config.k_bounds
    models: dict[int, Model] = {}
    workflow = ClusteringWorkflow()
    strategy = make_strategy(config.model_copy(update={"n_clusters": lo}))
    legacy = LegacyContext(context=context, config=ServerConfig(),
                           strategy=FlowerAdapter(strategy))
    last_round, previous = 0, None
    with workflow.federation(grid, legacy):
        for k in range(lo, hi + 1):
            config_k = config.model_copy(update={"n_clusters": k})
            if previous is not None:
                strategy = make_strategy(config_k)
                if config.k_warm_start and strategy.has_training:
                    best = previous.best
                    strategy.warm_start = split_largest_cluster(best["centroids"], best["stats"], config.seed + k)
                strategy.continue_from(previous)
            log(logging.INFO, "choose-k: k = %s (%s start)", k,
                "warm" if strategy.warm_start is not None else "cold")
            last_round = workflow.run(grid, legacy, FlowerAdapter(strategy), last_round,
                                      rounds_after=(hi - k) * strategy.max_server_rounds())
            models[k] = build_model(strategy.result(), config_k, None)
            previous = strategy
    result = report(config, models)
    log(logging.INFO, "%s", summary(result))
    if config.output_dir:
        directory = run_directory(config.output_dir, run_name(config))
        write_choose_k(directory, result, models)
        log(logging.INFO, "choose-k outputs written to %s", directory.resolve())
    return json.dumps({**result, "models": {str(k): m.to_dict() for k, m in models.items()}},
                      default=json_default)


def report(config: RunConfig, models: dict[int, Model]) -> dict:
    """The choose-k result: best k per criterion, the figures per k, and the setting."""
    per_k = {k: figures(models[k]) for k in sorted(models)}
    return {
        "best": best_k(per_k),
        "per-k": {str(k): row for k, row in per_k.items()},
        "k-range": config.k_range,
        "algorithm": config.algorithm,
        "scale": config.scale,
        "warm-start": config.k_warm_start,
        "n-init": config.n_init,
    }


def summary(result: dict) -> str:
    """The console table: one row per k, then the best k per criterion."""
    header = f"  {'k':>3} {'inertia':>14} {'simpl. silh.':>12} {'Davies-B.':>10} {'Calinski-H.':>12}"
    lines = ["", "  choose-k (every figure federated, exact)", header, "  " + "-" * (len(header) - 2)]
    for k, row in result["per-k"].items():
        values = [row.get(name, math.nan) for name in CRITERIA[1:]]
        lines.append(f"  {k:>3} {row['inertia']:>14.6g} {values[0]:>12.4f} {values[1]:>10.4f} {values[2]:>12.6g}")
    lines.append("  best k: " + ", ".join(f"{name} {k}" for name, k in result["best"].items()))
    return "\n".join(lines)

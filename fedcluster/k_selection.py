"""Choosing k in one federated run: ``k-range = "LO:HI"`` in the run config.

The ServerApp runs the configured algorithm for every k in LO..HI on the same federation:
the sites describe themselves (and send their scaling statistics) once; each k then has its
own initialisation, training, and the exact evaluation rounds, whose metrics are the
per-k figures (inertia, simplified silhouette, Davies-Bouldin, Calinski-Harabasz; every one
computed from the sites' sufficient statistics, none from rows). ``common/criteria.py``
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
Python API: :func:`choose_k`; command line: ``fedcluster choose-k``.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import numpy as np
from flwr.app import Context
from flwr.common.logger import log
from flwr.server import LegacyContext, ServerConfig

from fedcluster.common.config import RunConfig
from fedcluster.common.criteria import CRITERIA, best_k, split_largest_cluster
from fedcluster.common.metrics import METRIC_NAMES
from fedcluster.common.model import Model

# What each k's row of the figures holds, besides the metrics.
_EXTRA = ("rounds", "seed", "cluster-sizes")


def figures(model: Model) -> dict:
    """One k's figures: its exact metrics, rounds, winning seed and cluster sizes."""
    return {key: model.metrics[key] for key in (*METRIC_NAMES, *_EXTRA) if key in model.metrics}


def run_k_range(grid, context: Context, config: RunConfig) -> str:
    """The ServerApp's k-range run; returns the choose-k result as JSON (see :func:`report`)."""
    from fedcluster.common.outputs import write_choose_k
    from fedcluster.server_app import ClusteringWorkflow, build_model, run_name
    from fedcluster.strategies import make_strategy

    lo, hi = config.k_bounds
    models: dict[int, Model] = {}

    def strategies():
        previous = None
        for k in range(lo, hi + 1):
            config_k = config.model_copy(update={"n_clusters": k})
            strategy = make_strategy(config_k)
            if previous is not None:
                if config.k_warm_start and strategy.has_training:
                    best = previous.best
                    strategy.warm_start = split_largest_cluster(best["centroids"], best["stats"], config.seed + k)
                strategy.continue_from(previous)
            log(logging.INFO, "choose-k: k = %s (%s start)", k,
                "warm" if strategy.warm_start is not None else "cold")
            yield strategy
            models[k] = build_model(strategy, config_k, None)
            previous = strategy

    generator = strategies()
    first = next(generator)
    legacy = LegacyContext(context=context, config=ServerConfig(), strategy=first)
    ClusteringWorkflow()(grid, legacy, _chain(first, generator))
    result = report(config, models)
    log(logging.INFO, "%s", summary(result))
    if config.output_dir:
        directory = Path(config.output_dir) / run_name(config)
        write_choose_k(directory, result, models)
        log(logging.INFO, "choose-k outputs written to %s", directory.resolve())
    return json.dumps({**result, "models": {str(k): m.to_dict() for k, m in models.items()}},
                      default=_json_default)


def _chain(first, rest):
    yield first
    yield from rest


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


def _json_default(value):
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"cannot store {type(value).__name__} in choose-k.json")


def choose_k(sites: list[np.ndarray] | None = None, *, k_range: tuple[int, int] | str,
             labels: list[np.ndarray] | None = None, num_sites: int | None = None,
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
    from fedcluster.simulation import run_server

    text = k_range if isinstance(k_range, str) else f"{k_range[0]}:{k_range[1]}"
    run_config = {key.replace("_", "-"): value for key, value in config.items()}
    run_config.setdefault("output-dir", "")
    run_config["k-range"] = text
    record = run_server(sites, labels=labels, num_sites=num_sites, run_config=run_config)
    data = json.loads(str(record["choose-k"]))
    out: dict = dict(data["best"])
    out["per-k"] = {int(k): row for k, row in data["per-k"].items()}
    out["models"] = {int(k): Model.from_json(json.dumps(m)) for k, m in data["models"].items()}
    return out

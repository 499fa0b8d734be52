"""The site's task dispatch: the task a message names, run on the site's (scaled, clipped)
rows with the floor max(server's p, site's p), in its private version under DP."""

from __future__ import annotations

import dataclasses

import numpy as np

from fedcluster.client_app import private_tasks
from fedcluster.client_app.differencing_guard import OFF, DifferencingGuard
from fedcluster.client_app.site_data import SiteData
from fedcluster.client_app.task_io import TaskError, TaskReply, task_param
from fedcluster.client_app.tasks import TASKS
from fedcluster.common import privacy, protocol, scaling
from fedcluster.common.kernels import small_work


def run_task(site: SiteData, arrays: list[np.ndarray], params: dict, site_floor: int,
             noise_seed=None, guard: DifferencingGuard = OFF) -> TaskReply:
    """Run the task named by ``params['task']`` with floor max(server's p, site's p), on
    the rows scaled by ``params['transform']`` when the run has one and clipped to
    ``params['data-bounds']`` when given. The arrays sent are named here (``protocol.task_inputs``). Under DP (``dp-rho``) the task's private
    version runs (``common/private_tasks.py``), its noise drawn from
    ``np.random.default_rng(noise_seed)`` (None: fresh OS entropy). ``guard`` checks every
    reported cluster's member rows (``differencing_guard.py``; DP replies are noised
    instead and do not pass it)."""
    name = params.get("task")
    if name not in TASKS:
        raise TaskError(f"unknown task {name!r}; this site knows {sorted(TASKS)}")
    try:
        arrays = protocol.task_inputs(name, arrays)
    except protocol.ProtocolError as err:
        raise TaskError(f"task {name}: {err}") from None
    server_floor = task_param(params, "min-cluster-size", int, default=1)
    floor = max(server_floor, site_floor, 1)
    if "transform" in params:  # the run's global scaling: the task sees the scaled rows
        try:
            X = scaling.scaled_rows(site.X, site.source, str(params["transform"]))
        except ValueError as err:
            raise TaskError(f"task parameter 'transform': {err}") from None
        site = dataclasses.replace(site, X=X)
    if site.table is not None and site.table.has_missing and name not in RAW_TABLE_TASKS:
        missing = np.isnan(site.X).any(axis=0)  # the run's fill (in the transform) is due
        if missing.any():
            names = site.feature_names or ()
            which = ", ".join(names[j] if j < len(names) else str(j) for j in np.flatnonzero(missing))
            raise TaskError(f"{site.source}: task {name}: the table has missing cells in "
                            f"{which} and the run sent no value to impute them with")
    dp = private_tasks.task_privacy(params, site.n_features)
    box = private_tasks.site_bounds(params, site.n_features) if name != "describe" else None
    if box is not None:  # data-bounds: every task sees the clipped rows
        site = dataclasses.replace(site, X=privacy.clip_rows(site.X, *box))
    reply = None
    with small_work.few_passes(is_few_pass_task(name, params)):
        if dp is not None:
            rng = np.random.default_rng(noise_seed)
            reply = private_tasks.run_private(name, site, arrays, params, floor, dp, rng)
        if reply is None:
            reply = TASKS[name](site, arrays, params, floor, guard)
    reply.metrics.setdefault("n-rows", site.n_rows)
    return reply


#: Tasks that see the table as encoded, missing cells included.
RAW_TABLE_TASKS = frozenset({"describe", "impute_stats"})

#: Tasks that pass over the rows only a few times, at the centroids sent.
FEW_PASS_TASKS = frozenset({"evaluate", "evaluate_distances"})


def is_few_pass_task(name: str, params: dict) -> bool:
    """Whether task ``name`` makes only a few passes over the rows (the evaluation, its
    second pass, a Lloyd step of one local iteration): its passes then go to NumPy up to
    ``small_work.FEW_PASSES_MAX_WORK``, so the fresh process Flower starts for the message
    need not load Numba (~1 s) for a fraction of a second of arithmetic."""
    return name in FEW_PASS_TASKS or (name == "lloyd" and params.get("local-iters") == 1)

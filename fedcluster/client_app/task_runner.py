"""The site's task dispatch: the task a message names, run on the site's groups in the
run's space (its fill and scaling; ``data-bounds`` clips the groups' means) with the
floor max(server's p, site's p), or, under DP, its private version on the site's
clipped rows (``private_rows.py``); admitted and screened by the release step
(``release/gate.py``), which applies the floor's rules to what it sends."""

from __future__ import annotations

import numpy as np

from fedcluster.client_app import private_tasks
from fedcluster.client_app.release import gate
from fedcluster.client_app.site_groups import SiteGroups
from fedcluster.client_app.task_io import TaskError, TaskReply, in_run_space, task_param
from fedcluster.client_app.tasks import TASKS
from fedcluster.common import protocol
from fedcluster.common.kernels import small_work


def run_task(groups: SiteGroups, arrays: list[np.ndarray], params: dict, site_floor: int,
             noise_seed=None, private_rows=None) -> TaskReply:
    """Run the task named by ``params['task']`` on ``groups`` with floor max(server's p,
    site's p): in the run's space when the task carries its ``transform`` (the pooled
    fill and the scaling), each group's mean clipped to ``params['data-bounds']`` when
    given. The arrays sent are named here (``protocol.task_inputs``). Under DP
    (``dp-rho``) the task's private version runs (``private_tasks.py``) on
    ``private_rows`` (a ``private_rows.PrivateRows``), its noise drawn from
    ``np.random.default_rng(noise_seed)`` (None: fresh OS entropy)."""
    name = params.get("task")
    if name not in TASKS:
        raise TaskError(f"unknown task {name!r}; this site knows {sorted(TASKS)}")
    try:
        arrays = protocol.task_inputs(name, arrays)
    except protocol.ProtocolError as err:
        raise TaskError(f"task {name}: {err}") from None
    server_floor = task_param(params, "min-cluster-size", int, default=1)
    floor = max(server_floor, site_floor, 1)
    transform = str(params["transform"]) if "transform" in params else None
    if name not in RAW_TABLE_TASKS:  # the run's fill and scaling
        groups = in_run_space(groups, params)
        missing = groups.missing_features() if transform is not None else (
            np.flatnonzero((groups.present < groups.counts[:, None]).any(axis=0)).tolist()
            if groups.has_missing else [])
        if missing:
            names = groups.feature_names or ()
            which = ", ".join(names[j] if j < len(names) else str(j) for j in missing)
            raise TaskError(f"{groups.source}: task {name}: the table has missing cells in "
                            f"{which} and the run sent no value to impute them with")
    dp = private_tasks.task_privacy(params, groups.n_features)
    box = private_tasks.site_bounds(params, groups.n_features) if name != "describe" else None
    reply, private = None, False
    with small_work.few_passes(is_few_pass_task(name, params)):
        if dp is not None:
            rng = np.random.default_rng(noise_seed)
            rows = lambda: _clipped(private_rows, transform, box)  # noqa: E731
            reply = private_tasks.run_private(name, groups, rows, arrays, params, floor, dp, rng)
            private = reply is not None
        if reply is None:
            if box is not None and name not in RAW_TABLE_TASKS:  # data-bounds: clipped means
                groups = groups.clipped(*box)
            gate.admit(name, groups, floor)
            reply = TASKS[name](groups, arrays, params, floor)
    reply.metrics.setdefault("n-rows", groups.n_rows)
    return gate.screen(reply, name, floor, groups, private)


def _clipped(private_rows, transform: str | None, box):
    if private_rows is None:
        raise TaskError("this site holds no rows for a differentially private task")
    try:
        return private_rows.clipped(transform, box)
    except ValueError as err:
        raise TaskError(f"task parameter 'transform': {err}") from None


#: Tasks that see the table as encoded, missing cells included (``profile`` takes the
#: run's space itself, to assign its groups, and reports in the encoded units).
RAW_TABLE_TASKS = frozenset({"describe", "impute_stats", "profile", "value_range"})

#: Tasks that pass over the groups only a few times, at the centroids sent.
FEW_PASS_TASKS = frozenset({"evaluate", "evaluate_distances"})


def is_few_pass_task(name: str, params: dict) -> bool:
    """Whether task ``name`` makes only a few passes over the groups (the evaluation, its
    second pass, a Lloyd step of one local iteration): its passes then go to NumPy up to
    ``small_work.FEW_PASSES_MAX_WORK``, so the fresh process Flower starts for the message
    need not load Numba (~1 s) for a fraction of a second of arithmetic."""
    return name in FEW_PASS_TASKS or (name == "lloyd" and params.get("local-iters") == 1)

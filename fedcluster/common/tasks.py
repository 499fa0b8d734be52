"""Site tasks: what one federated round asks a site to do with its own data.

A task takes the site's data, the arrays the server sent and the task's scalar
parameters, runs the compiled kernels, and returns a :class:`TaskReply` of AGGREGATES
only (centroids or sums, counts, scalar metrics) -- never a row of the data.

The privacy floor p is applied here, in one place (:func:`apply_privacy_floor`): a
cluster with fewer than p local members is not reported (its count is sent as 0 and its
centroid row replaced by what the server sent, or dropped where rows are optional).

Tasks (the ``task`` config key):

``describe``
    Size, width and feature names, so the server can check that sites agree.
``bounds``
    Per-feature minimum and maximum (random initialisation in the federated box).
``local_kmeans``
    k-means++ then Lloyd to convergence on the local data (k-FED, Dennis et al. 2021).
``lloyd``
    DWF/EWF site step (Holzer, Jacob, Kavane): weights against the received centroids,
    then ``local-iters`` Lloyd iterations.
``evaluate``
    SSE and cluster sizes against the given centroids (the exact global score).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from fedcluster.common import kernels, local
from fedcluster.common.data import SiteData

Scalar = bool | int | float | str


@dataclass
class TaskReply:
    """What a site sends back: arrays (aggregates) and scalar metrics."""

    arrays: list[np.ndarray] = field(default_factory=list)
    metrics: dict[str, Scalar] = field(default_factory=dict)


class TaskError(ValueError):
    """The server asked for something this site cannot do (bad task or parameters)."""


def _param(params: dict, key: str, kind: type, default=None):
    if key not in params:
        if default is None:
            raise TaskError(f"task parameter '{key}' is missing")
        return default
    value = params[key]
    try:
        return kind(value)
    except (TypeError, ValueError):
        raise TaskError(f"task parameter '{key}' must be {kind.__name__}, got {value!r}") from None


def _centroids(arrays: list[np.ndarray], site: SiteData) -> np.ndarray:
    if len(arrays) < 1:
        raise TaskError("the task needs the global centroids as its first array")
    C = np.asarray(arrays[0], dtype=np.float64)
    if C.ndim != 2 or C.shape[1] != site.n_features or C.shape[0] < 1:
        raise TaskError(
            f"centroids of shape {C.shape} do not fit this site's {site.n_features} features"
        )
    if not np.all(np.isfinite(C)):
        raise TaskError("the centroids sent by the server are not all finite")
    return np.ascontiguousarray(C)


def apply_privacy_floor(
    counts: np.ndarray, centroids: np.ndarray, fallback: np.ndarray, floor: int
) -> tuple[np.ndarray, np.ndarray]:
    """Withhold every cluster with fewer than ``floor`` local members.

    Its count becomes 0 and its centroid row is replaced by ``fallback`` (what the server
    sent, which carries no information about the site). Clusters with 0 members are
    untouched apart from that replacement, so a withheld cluster is indistinguishable
    from an empty one.
    """
    counts = np.asarray(counts, dtype=np.int64).copy()
    centroids = np.array(centroids, dtype=np.float64, copy=True)
    hidden = counts < floor
    counts[hidden] = 0
    centroids[hidden] = fallback[hidden]
    return counts, centroids


def describe(site: SiteData, arrays, params, floor: int) -> TaskReply:
    if site.n_rows < floor:
        raise TaskError(
            f"{site.source}: has {site.n_rows} rows; at least {floor} are needed "
            "(the privacy floor min-cluster-size)"
        )
    names = list(site.feature_names) if site.feature_names is not None else []
    return TaskReply(metrics={"n-features": site.n_features, "feature-names": json.dumps(names)})


def bounds(site: SiteData, arrays, params, floor: int) -> TaskReply:
    if site.n_rows < floor:
        raise TaskError(f"the site has {site.n_rows} rows, fewer than the privacy floor {floor}")
    return TaskReply(arrays=[np.min(site.X, axis=0), np.max(site.X, axis=0)])


def local_kmeans_task(site: SiteData, arrays, params, floor: int) -> TaskReply:
    k_local = _param(params, "k-local", int)
    seed = _param(params, "seed", int)
    if k_local < 1:
        raise TaskError(f"task parameter 'k-local' must be >= 1, got {k_local}")
    centroids, counts = local.local_kmeans(site.X, k_local, seed)
    keep = counts >= floor
    return TaskReply(arrays=[centroids[keep], counts[keep].astype(np.int64)])


def lloyd_task(site: SiteData, arrays, params, floor: int) -> TaskReply:
    C = _centroids(arrays, site)
    local_iters = _param(params, "local-iters", int)
    tol = _param(params, "tol", float)
    if local_iters < 1:
        raise TaskError(f"task parameter 'local-iters' must be >= 1, got {local_iters}")
    # The weights are counted against the RECEIVED centroids (DWF paper, Fig. 1); the
    # first Lloyd pass needs exactly these statistics, so they are computed once.
    sums, weights, sse = kernels.lloyd_stats(site.X, C)
    local_C, last_counts = local.update_centroids(C, sums, weights), weights
    if local_iters > 1 and np.linalg.norm(local_C - C) >= tol:
        local_C, last_counts, _ = local.lloyd(site.X, local_C, local_iters - 1, tol)
    # A cluster is reported only if both its weight and the member set of its reported
    # mean reach the floor.
    last_counts = np.where(weights < floor, 0, last_counts)
    hidden_counts, local_C = apply_privacy_floor(last_counts, local_C, C, floor)
    weights = np.where(hidden_counts == 0, 0, weights).astype(np.int64)
    return TaskReply(arrays=[local_C, weights], metrics={"sse": float(sse)})


def evaluate(site: SiteData, arrays, params, floor: int) -> TaskReply:
    C = _centroids(arrays, site)
    _, counts, sse = kernels.lloyd_stats(site.X, C)
    counts = np.where(counts < floor, 0, counts).astype(np.int64)
    return TaskReply(arrays=[counts], metrics={"sse": float(sse)})


TaskFn = Callable[[SiteData, list, dict, int], TaskReply]

TASKS: dict[str, TaskFn] = {
    "describe": describe,
    "bounds": bounds,
    "local_kmeans": local_kmeans_task,
    "lloyd": lloyd_task,
    "evaluate": evaluate,
}


def run_task(site: SiteData, arrays: list[np.ndarray], params: dict, site_floor: int) -> TaskReply:
    """Run the task named by ``params['task']`` with floor max(server's p, site's p)."""
    name = params.get("task")
    if name not in TASKS:
        raise TaskError(f"unknown task {name!r}; this site knows {sorted(TASKS)}")
    server_floor = _param(params, "min-cluster-size", int, default=1)
    floor = max(server_floor, site_floor, 1)
    reply = TASKS[name](site, arrays, params, floor)
    reply.metrics.setdefault("n-rows", site.n_rows)
    return reply

"""Site tasks: what one federated round asks a site to do with its own data.

A task takes the site's GROUPS (``site_groups.SiteGroups``: each group at least p_site
rows, assigned whole to the centroid nearest its mean; never a row), the arrays the
server sent (named, as ``common/protocol.py`` reads them) and the task's scalar
parameters, runs the compiled kernels on the groups' means weighted by their rows, and
returns a :class:`TaskReply` of AGGREGATES only (centroids or sums, counts, scalar
metrics), each a function of the groups' statistics. With p_site = 1 every group is a
row and every task the row-level algorithm of its paper.

The privacy floor p is not applied here: a task says which of its figures rest on which
rows (``release/floor.py``'s rules) and the release step applies them (``release/gate.py``):
a cluster with fewer than p local members is not reported (its count is sent as 0 and its
centroid row replaced by what the server sent, or dropped where rows are optional).

Tasks (the ``task`` config key):

``describe``, ``impute_stats``, ``stats``, ``bounds``
    Aggregates over all the site's rows (``site_statistics.py``).
``local_kmeans``
    k-means++ then Lloyd to convergence on the local groups, weighted (k-FED, Dennis
    et al. 2021).
``lloyd``
    DWF/EWF site step (Holzer, Jacob, Kavane): weights against the received centroids,
    then ``local-iters`` Lloyd iterations.
``minibatch``
    Federated mini-batch k-means site step (Triebe & Rajagopal 2019): ``epochs`` passes
    in shuffled batches of groups (about ``batch-size`` rows each) with client learning
    rate ``beta``.
``kmeanspp``
    FKM round 0 (Garst & Reinders 2024): k-means++ (or random) seeds, the means and
    sizes of their clusters.
``prune_lloyd``
    FKM site step: drop the global clusters with no local member, ``local-iters`` Lloyd
    iterations from the rest.
``fcm``
    Federated fuzzy c-means site step (Stallmann & Wilbik): ``local-iters`` fuzzy
    c-means iterations with fuzzifier m (a group's rows take the memberships of its
    mean); local centres and fuzzy weights W_j.
``gtv``
    GTVMin k-means site step (Jung): ``local-iters`` updates of the site's own centroids
    towards its data and its neighbours' centroids (round 0, without arrays: local
    k-means++ then Lloyd).
``evaluate_sets``
    The local SSE of each of several centroid sets (GTV: every site's centroids).
``evaluate``
    SSE and cluster sizes against the given centroids (the exact global score); with a
    ``fuzzifier``, also FFCM's figures (Outside SSE, partition coefficient).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable

import numpy as np

from flwr.common.logger import log

from fedcluster.common import kernels, protocol
from fedcluster.common.kernels import fuzzy as fuzzy_kernels
from fedcluster.common.kernels.spread import spread_minibatch_epoch

from fedcluster.client_app import local_kmeans as local
from fedcluster.client_app.group_weights import (
    in_rows, kernel_weights, site_spread_per_row, split_weights, spread_per_row,
)
from fedcluster.client_app.site_groups import SiteGroups
from fedcluster.client_app.site_profile import profile_task
from fedcluster.client_app.site_statistics import (bounds, describe, impute_stats, stats,
                                                   value_range)
from fedcluster.client_app.release.floor import Labels, PerCluster
from fedcluster.client_app.task_io import TaskError, TaskReply, received_centroids, task_param


def _min_groups(params) -> int:
    """The task's :data:`protocol.MIN_GROUPS` (1 when absent), checked."""
    wanted = task_param(params, protocol.MIN_GROUPS, int, default=1)
    if wanted < 1:
        raise TaskError(f"task parameter '{protocol.MIN_GROUPS}' must be >= 1, got {wanted}")
    return wanted


def _too_few_groups(groups: SiteGroups, C: np.ndarray, counts: np.ndarray,
                    min_groups: int) -> np.ndarray:
    """Which clusters of ``C`` hold fewer than ``min_groups`` of the site's groups (their
    groups nearest to them; ``counts``: the rows those groups hold)."""
    if min_groups <= 1 or groups.n_groups == 0:
        return np.zeros(len(C), dtype=bool)
    # A cluster of more rows than min_groups - 1 of the largest groups can hold has enough
    # groups: only the others need the groups counted (one more pass, rarely).
    unsure = counts <= (min_groups - 1) * int(groups.counts.max())
    if not unsure.any():
        return unsure
    labels = kernels.assign(groups.means, C)[0]
    return np.bincount(labels, minlength=len(C)) < min_groups


def local_kmeans_task(groups: SiteGroups, arrays, params, floor: int) -> TaskReply:
    k_local = task_param(params, "k-local", int)
    seed = task_param(params, "seed", int)
    if k_local < 1:
        raise TaskError(f"task parameter 'k-local' must be >= 1, got {k_local}")
    min_groups = _min_groups(params)
    weights, scatter, variances = split_weights(groups)
    centroids, counts = local.local_kmeans(groups.means, k_local, seed, weights=weights,
                                           scatter=scatter, variances=variances)
    counts = in_rows(counts)
    too_few = _too_few_groups(groups, centroids, counts, min_groups)
    return TaskReply(arrays=protocol.ClusterMeans(centroids, counts),
                     rules=(PerCluster(counts, ("centroids", "counts"), "drop", also=too_few),))


def _continue_lloyd(groups: SiteGroups, C, sums, counts, local_iters: int, tol: float):
    """Finish ``local_iters`` Lloyd iterations whose first assignment statistics
    (``sums``, ``counts`` against ``C``) are already known; return the centroids and the
    sizes of the last assignment."""
    local_C = local.update_centroids(C, sums, counts)
    if local_iters > 1 and kernels.frobenius(local_C - C) >= tol:
        local_C, counts, _ = local.lloyd(groups.means, local_C, local_iters - 1, tol,
                                         *split_weights(groups))
    return local_C, in_rows(counts)


def lloyd_task(groups: SiteGroups, arrays, params, floor: int) -> TaskReply:
    C = received_centroids(arrays.centroids, groups)
    local_iters = task_param(params, "local-iters", int)
    tol = task_param(params, "tol", float)
    if local_iters < 1:
        raise TaskError(f"task parameter 'local-iters' must be >= 1, got {local_iters}")
    min_groups = _min_groups(params)
    # The weights are counted against the RECEIVED centroids (DWF paper, Fig. 1); the
    # first Lloyd pass needs exactly these statistics, so they are computed once.
    sums, weights, sse = kernels.lloyd_stats(groups.means, C, *split_weights(groups))
    local_C, last_counts = _continue_lloyd(groups, C, sums, weights, local_iters, tol)
    weights = in_rows(weights)
    # A cluster is reported only if both its weight and the member set of its reported
    # mean reach the floor (a withheld one shows the centroid the server sent).
    reply = TaskReply(arrays=protocol.ClusterMeans(local_C, weights), metrics={"sse": float(sse)},
                      rules=(PerCluster(np.minimum(weights, last_counts), ("centroids", "counts"),
                                        "fallback", {"centroids": C},
                                        _too_few_groups(groups, C, weights, min_groups)),))
    if params.get(protocol.EVALUATE_TOO):
        # the evaluation of the RECEIVED centroids, exactly as an evaluate round would send it
        reply.evaluation = evaluate(groups, protocol.Centroids(arrays.centroids), params, floor)
    return reply


def minibatch_task(groups: SiteGroups, arrays, params, floor: int) -> TaskReply:
    """Mini-batch epochs over the groups in a seeded order, in batches of about
    ``batch-size`` rows (``batch-size`` x groups / rows groups; each group whole)."""
    C = received_centroids(arrays.centroids, groups)
    epochs = task_param(params, "epochs", int)
    batch = task_param(params, "batch-size", int)
    beta = task_param(params, "beta", float)
    seed = task_param(params, "seed", int)
    if epochs < 1 or batch < 0 or not 0.0 < beta <= 1.0:
        raise TaskError(f"bad mini-batch parameters: epochs {epochs}, batch-size {batch}, beta {beta}")
    n_groups = groups.n_groups
    full = batch == 0 or batch >= groups.n_rows
    in_groups = n_groups if full else max(1, round(batch * n_groups / groups.n_rows))
    rng = np.random.default_rng(seed)  # per site and round: the server sends the seed
    weights, scatter, variances = split_weights(groups)
    metrics = {}
    if full:  # the score of the received centroids costs one more pass only with batches
        metrics["sse"] = kernels.lloyd_stats(groups.means, C, weights, scatter, variances)[2]
    gamma = C.copy()
    for _ in range(epochs):
        # A full batch's order does not change the result; skip the permutation.
        order = np.arange(n_groups) if full else rng.permutation(n_groups)
        if variances is None:
            lam = kernels.minibatch_epoch(groups.means, order, in_groups, gamma, beta, weights)
        else:
            lam = spread_minibatch_epoch(groups.means, order, in_groups, gamma, beta,
                                         weights, variances, scatter)
    lam = in_rows(lam)
    rules = (PerCluster(lam, ("centroids", "counts"), "fallback", {"centroids": C}),)
    if protocol.FAR_ROWS in params:  # where the server re-seeds a dead cluster
        far = farthest_groups(groups, C, task_param(params, protocol.FAR_ROWS, int), floor)
        rules += (PerCluster(far[1], ("far_means", "far_counts"), "zero"),)
        return TaskReply(arrays=protocol.ClusterMeansAndFar(gamma, lam, *far), metrics=metrics,
                         rules=rules)
    return TaskReply(arrays=protocol.ClusterMeans(gamma, lam), metrics=metrics, rules=rules)


def farthest_groups(groups: SiteGroups, C: np.ndarray, rows: int,
                    floor: int) -> tuple[np.ndarray, np.ndarray]:
    """The mean (1, d) and count (1,) of the site's groups farthest from their nearest
    centroid in ``C``, the fewest that hold at least ``rows`` rows (and the floor),
    where the server re-seeds a dead cluster: a cluster of whole groups like any other."""
    rows = max(int(rows), int(floor), 1)
    if groups.n_rows < rows:
        return np.zeros((1, groups.n_features)), np.zeros(1, dtype=np.int64)
    mask = groups.farthest(kernels.assign(groups.means, C)[1], rows)
    count = int(groups.counts[mask].sum())
    mean = (groups.means[mask] * groups.counts[mask, None]).sum(axis=0) / count
    return mean[None, :], np.array([count], dtype=np.int64)


def _means_of_kept(groups: SiteGroups, seeds: np.ndarray) -> TaskReply:
    """Means and sizes of the clusters of ``seeds`` (those under the floor, and empty
    ones, left out by the release step)."""
    sums, counts, _ = kernels.lloyd_stats(groups.means, seeds, *kernel_weights(groups))
    with np.errstate(invalid="ignore", divide="ignore"):
        means = sums / np.where(counts > 0, counts, 1)[:, None]
    counts = counts.astype(np.int64)
    return TaskReply(arrays=protocol.ClusterMeans(means, counts),
                     rules=(PerCluster(counts, ("centroids", "counts"), "drop", also=counts == 0),))


def kmeanspp_task(groups: SiteGroups, arrays, params, floor: int) -> TaskReply:
    k = task_param(params, "k-local", int)
    seed = task_param(params, "seed", int)
    method = str(params.get("init", "kmeans++"))
    if k < 1:
        raise TaskError(f"task parameter 'k-local' must be >= 1, got {k}")
    k = min(k, groups.n_groups)
    if method == "kmeans++":
        seeds = local.kmeans_plusplus(groups.means, k, seed, kernel_weights(groups)[0])
    elif method == "random":
        picked = np.random.default_rng(seed).choice(groups.n_groups, size=k, replace=False)
        seeds = np.asarray(groups.means[np.sort(picked)], dtype=np.float64)
    else:
        raise TaskError(f"unknown seeding {method!r}; use 'kmeans++' or 'random'")
    return _means_of_kept(groups, seeds)


def prune_lloyd_task(groups: SiteGroups, arrays, params, floor: int) -> TaskReply:
    C = received_centroids(arrays.centroids, groups)
    local_iters = task_param(params, "local-iters", int)
    tol = task_param(params, "tol", float)
    prune = bool(params.get("prune", True))
    if local_iters < 1:
        raise TaskError(f"task parameter 'local-iters' must be >= 1, got {local_iters}")
    sums, counts, sse = kernels.lloyd_stats(groups.means, C, *split_weights(groups))
    if prune:
        # Drop the global clusters with no local member (FKM, Algorithm 1 lines 14-16).
        # They had no member, so assigning to the rest gives the same statistics.
        kept = counts > 0
        C, sums, counts = C[kept], sums[kept], counts[kept]
    local_C, counts = _continue_lloyd(groups, C, sums, counts, local_iters, tol)
    return TaskReply(arrays=protocol.ClusterMeans(local_C, counts), metrics={"sse": float(sse)},
                     rules=(PerCluster(counts, ("centroids", "counts"), "drop"),))


def fcm_task(groups: SiteGroups, arrays, params, floor: int) -> TaskReply:
    """Local centres after ``local-iters`` fuzzy c-means iterations, and W_j = sum u^m
    against the last centres used (a group's rows take its mean's memberships, softened
    by the site's spread per row, at p_site >= 3 the group's own:
    :func:`group_weights.spread_per_row`). A centre
    whose hard (argmax) cluster has fewer than p rows is withheld like a small k-means
    cluster (W = 0, the received centre)."""
    C = received_centroids(arrays.centroids, groups)
    m = task_param(params, "fuzzifier", float)
    local_iters = task_param(params, "local-iters", int)
    if not m > 1.0 or local_iters < 1:
        raise TaskError(f"bad fuzzy c-means parameters: fuzzifier {m}, local-iters {local_iters}")
    centres, spread = C.copy(), spread_per_row(groups)
    for _ in range(local_iters):
        sums, weights, hard = fuzzy_kernels.fcm_stats(groups.means, centres, m, kernel_weights(groups)[0],
                                                      spread)
        centres = local.update_centroids(centres, sums, weights)
    # A centre whose hard cluster is under the floor shows the one the server sent.
    rules = (PerCluster(hard, ("centres", "weights"), "fallback", {"centres": C}),)
    # The site's J_m of the received centres, a sum over all its groups like lloyd's SSE:
    # the server stops when it stalls (FFCM's rounds converge only linearly).
    objective = fuzzy_kernels.fcm_objective(groups.means, C, m, kernel_weights(groups)[0], spread)
    return TaskReply(arrays=protocol.FuzzyCentres(centres, weights),
                     metrics={"fuzzy-objective": objective}, rules=rules)


def gtv_task(groups: SiteGroups, arrays, params, floor: int) -> TaskReply:
    """The site's centroids after up to ``local-iters`` GTVMin updates (E1-E3, M), stopped
    early when the local objective L_i(W) + alpha sum_i' d(i, i') falls by less than
    ``tol`` times its value. ``arrays`` = [W_i (k, d), neighbours' W (deg, k, d)]; empty
    in round 0, where W_i starts at k-means++ seeds on the local groups (alpha is moot
    without neighbours, so that round is local Lloyd).

    Privacy floor: a cluster with fewer than p local rows is updated from its
    neighbours only (kernel), and in round 0 a centroid that no p rows ever moved (still
    a k-means++ seed, one group's mean) is replaced by the mean of all local rows."""
    alpha = task_param(params, "alpha", float)
    local_iters = task_param(params, "local-iters", int)
    tol = task_param(params, "tol", float)
    if alpha < 0 or local_iters < 1 or tol < 0:
        raise TaskError(f"bad gtv parameters: alpha {alpha}, local-iters {local_iters}, tol {tol}")
    weights, scatter, variances = split_weights(groups)
    first_round = arrays.own is None
    if first_round:
        k = task_param(params, "n-clusters", int)
        if k > groups.n_groups:
            raise TaskError(f"k = {k} clusters but this site has only {groups.n_groups} groups "
                            f"({groups.n_rows} rows)")
        W = local.kmeans_plusplus(groups.means, k, task_param(params, "seed", int), weights)
        neighbours = np.zeros((0, k, groups.n_features))
    else:
        W = received_centroids(arrays.own, groups).astype(np.float64)
        neighbours = (np.asarray(arrays.neighbours) if arrays.neighbours is not None
                      else np.zeros((0, *W.shape)))
        if neighbours.ndim != 3 or neighbours.shape[1:] != W.shape:
            raise TaskError(f"neighbours' centroids of shape {neighbours.shape} do not fit "
                            f"this site's centroids {W.shape}")
        if not np.all(np.isfinite(neighbours)):
            raise TaskError("the neighbours' centroids sent by the server are not all finite")
    moved = np.zeros(W.shape[0], dtype=bool)  # round 0: updated from >= p rows at least once
    update = lambda W: kernels.gtv_update(groups.means, W, neighbours, alpha, floor,  # noqa: E731
                                          weights, scatter, variances)
    W_new, counts, sse, gtv = update(W)
    objective = sse + alpha * gtv
    for _ in range(local_iters):
        moved |= counts >= floor
        W = W_new
        W_new, counts, sse, gtv = update(W)
        previous, objective = objective, sse + alpha * gtv
        if previous - objective <= tol * previous:
            break
    if first_round and not moved.all():
        W[~moved] = (groups.means * groups.counts[:, None]).sum(axis=0) / groups.n_rows
        _, counts, sse, gtv = update(W)
    counts = in_rows(counts)
    return TaskReply(arrays=protocol.ClusterMeans(W, counts), metrics={"sse": float(sse), "gtv": float(gtv)},
                     rules=(PerCluster(counts, ("counts",), "zero"),))


def evaluate_sets_task(groups: SiteGroups, arrays, params, floor: int) -> TaskReply:
    """For each centroid set in ``arrays.sets`` (s, k, d), the local SSE against it (the
    pooled score of every site's centroids, summed over sites by the server)."""
    sets = np.asarray(arrays.sets)
    if sets.ndim != 3:
        raise TaskError("evaluate_sets needs one (sets, k, d) array")
    weights, scatter = kernel_weights(groups)
    sse = np.array([kernels.lloyd_stats(groups.means, received_centroids(W, groups),
                                        weights, scatter)[2] for W in sets])
    return TaskReply(arrays=protocol.SetScores(sse.astype(np.float64)))


def fuzzy_evaluation_sums(groups: SiteGroups, C: np.ndarray, m: float) -> tuple[float, float]:
    """FFCM's evaluation sums over a site's groups (Stallmann & Wilbik; docs/explanation/algorithms.md 5).

    Returns ``(all_sq_dist, partition_sum)``: sum over rows and ALL k centres of
    ||x - c_j||^2 (Outside SSE is this minus the SSE) and sum over rows of sum_j u_ij^2
    (the partition coefficient's numerator; a group's rows take its mean's memberships).
    The first uses sum_j ||x - c_j||^2 = k ||x - cbar||^2 + sum_j ||c_j - cbar||^2
    (cbar = mean of the centres), which has no cancellation when the data sit far from
    the origin; a group adds its scatter k times.
    """
    k = C.shape[0]
    cbar = C.mean(axis=0)
    spread = float(((C - cbar) ** 2).sum())
    all_sq_dist, partition_sum = k * float(groups.scatter.sum()), 0.0
    means, counts = groups.means, groups.counts.astype(np.float64)
    for start in range(0, groups.n_groups, kernels.CHUNK_ROWS):
        block = means[start:start + kernels.CHUNK_ROWS]
        weight = counts[start:start + kernels.CHUNK_ROWS]
        all_sq_dist += k * float((weight * ((block - cbar) ** 2).sum(axis=1)).sum()) + weight.sum() * spread
        # (the evaluation keeps the site-wide figure at every p_site: it splits nothing)
        U = fuzzy_kernels.fcm_memberships(block, C, m, site_spread_per_row(groups))
        partition_sum += float((weight * (U ** 2).sum(axis=1)).sum())
    return all_sq_dist, partition_sum


def evaluate(groups: SiteGroups, arrays, params, floor: int) -> TaskReply:
    """Pass 1 of the exact metrics (see ``common/metrics.py``), over the groups'
    partition (each group in its nearest cluster, whole); clusters under the floor
    (empty ones included) are left out (zeros) and flagged ``hidden``, contingency cells
    under it are left out, and labels with no cell at or above the floor are not named.
    Per cluster every figure is of the groups' means and rows (silhouette distances,
    squared norms, distances): a group's spread enters only the site's totals."""
    C = received_centroids(arrays.centroids, groups)
    weights, scatter = kernel_weights(groups)
    sums, counts, sqnorms, sse, silhouette = kernels.evaluation_stats(groups.means, C, weights, scatter)
    # The site's own figures, unfiltered, stay in the site's own log.
    log(logging.INFO, "site %s: score %.6g, cluster sizes %s", groups.source,
        sse / groups.n_rows, counts.tolist())
    # Every cluster under the floor is flagged, an empty one too: flagging only those of
    # 1..p-1 members would tell the server which clusters the site holds a few rows of.
    # The flag then says no more than the zero count (it exists so that the report can
    # say "<p" rather than 0).
    # Davies-Bouldin's distances, measured to C: the server uses them when the pooled
    # means are C (a converged run) and spares the second pass (strategies/base.py).
    distances, _ = kernels.distance_to_means(groups.means, C, C, weights)
    reply = TaskReply(
        arrays=protocol.Evaluation(counts, sums, sqnorms, np.zeros(counts.shape, dtype=np.int64),
                                   distances),
        # floor: the site's effective privacy floor (a policy, not data), so that the
        # server can say what a hidden size is under ("<p" with the site's own p).
        metrics={"sse": float(sse), "silhouette-sum": float(silhouette), "floor": int(floor),
                 # every group's spread about its own mean, summed over ALL the site's
                 # groups (whatever the centroids): Calinski-Harabasz's within-cluster
                 # dispersion needs it, and no per-cluster figure carries a group's
                 "group-scatter": float(groups.scatter.sum())},
        rules=(PerCluster(counts, ("counts", "sums", "sqnorms", "distances"), "zero",
                          from_two=True, flag="hidden"),),
    )
    if "fuzzifier" in params:
        m = task_param(params, "fuzzifier", float)
        if not m > 1.0:
            raise TaskError(f"bad fuzzifier {m} for the fuzzy evaluation")
        all_sq_dist, partition_sum = fuzzy_evaluation_sums(groups, C, m)
        reply.metrics["all-sq-dist"] = all_sq_dist
        reply.metrics["partition-sum"] = partition_sum
    if groups.labels is not None:
        table = groups.labels.contingency(kernels.assign(groups.means, C)[0], C.shape[0])
        reply.arrays = reply.arrays._replace(contingency=table)
        reply.metrics["label-names"] = json.dumps(list(groups.labels.names))
        reply.rules += (Labels("contingency", "label-names"),)
    return reply


def evaluate_distances(groups: SiteGroups, arrays, params, floor: int) -> TaskReply:
    """Pass 2 (Davies-Bouldin): per cluster of C, the summed distance to the pooled means
    (a group's rows at its mean's distance)."""
    C = received_centroids(arrays.centroids, groups)
    means = received_centroids(arrays.means, groups)
    distances, counts = kernels.distance_to_means(groups.means, C, means, kernel_weights(groups)[0])
    return TaskReply(arrays=protocol.Distances(distances),
                     rules=(PerCluster(counts, ("distances",), "zero"),))


TaskFn = Callable[[SiteGroups, list, dict, int], TaskReply]

TASKS: dict[str, TaskFn] = {
    "describe": describe,
    "impute_stats": impute_stats,
    "stats": stats,
    "bounds": bounds,
    "value_range": value_range,
    "local_kmeans": local_kmeans_task,
    "lloyd": lloyd_task,
    "minibatch": minibatch_task,
    "kmeanspp": kmeanspp_task,
    "prune_lloyd": prune_lloyd_task,
    "fcm": fcm_task,
    "gtv": gtv_task,
    "evaluate_sets": evaluate_sets_task,
    "evaluate": evaluate,
    "evaluate_distances": evaluate_distances,
    "profile": profile_task,
}

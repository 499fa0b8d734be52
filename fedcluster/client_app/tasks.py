"""Site tasks: what one federated round asks a site to do with its own data.

A task takes the site's data, the arrays the server sent (named, as ``common/protocol.py``
reads them) and the task's scalar parameters, runs the compiled kernels, and returns a :class:`TaskReply` of AGGREGATES
only (centroids or sums, counts, scalar metrics) -- never a row of the data.

The privacy floor p is applied in one place (``task_io.apply_privacy_floor``): a
cluster with fewer than p local members is not reported (its count is sent as 0 and its
centroid row replaced by what the server sent, or dropped where rows are optional).

Tasks (the ``task`` config key):

``describe``, ``impute_stats``, ``stats``, ``bounds``
    Aggregates over all the site's rows (``site_statistics.py``).
``local_kmeans``
    k-means++ then Lloyd to convergence on the local data (k-FED, Dennis et al. 2021).
``lloyd``
    DWF/EWF site step (Holzer, Jacob, Kavane): weights against the received centroids,
    then ``local-iters`` Lloyd iterations.
``minibatch``
    Federated mini-batch k-means site step (Triebe & Rajagopal 2019): ``epochs`` passes
    in shuffled batches of ``batch-size`` with client learning rate ``beta``.
``kmeanspp``
    FKM round 0 (Garst & Reinders 2024): k-means++ (or random) seeds, the means and
    sizes of their clusters.
``prune_lloyd``
    FKM site step: drop the global clusters with no local member, ``local-iters`` Lloyd
    iterations from the rest.
``fcm``
    Federated fuzzy c-means site step (Stallmann & Wilbik): ``local-iters`` fuzzy
    c-means iterations with fuzzifier m; local centres and fuzzy weights W_j.
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

from fedcluster.client_app import local_kmeans as local
from fedcluster.client_app.differencing_guard import OFF
from fedcluster.client_app.guarded_stats import (
    farthest_rows, guard_clusters, guarded_gtv_step, set_distance, set_mean, set_sqnorm, set_sum,
)
from fedcluster.client_app.site_data import SiteData
from fedcluster.client_app.site_statistics import bounds, describe, impute_stats, stats
from fedcluster.client_app.task_io import (
    TaskError, TaskReply, apply_privacy_floor, received_centroids, refuse_under_floor, task_param,
)


def local_kmeans_task(site: SiteData, arrays, params, floor: int, guard=OFF) -> TaskReply:
    k_local = task_param(params, "k-local", int)
    seed = task_param(params, "seed", int)
    if k_local < 1:
        raise TaskError(f"task parameter 'k-local' must be >= 1, got {k_local}")
    centroids, counts, *labels = local.local_kmeans(site.X, k_local, seed,
                                                    return_labels=guard.active)
    keep = counts >= floor
    if guard.active:
        verdict = guard_clusters(guard, labels[0], np.flatnonzero(keep), floor, counts, site.n_rows)
        keep[verdict.withheld] = False
        for j, mask in verdict.substituted.items():
            centroids[j], counts[j] = set_mean(site.X, mask), np.count_nonzero(mask)
    return TaskReply(arrays=protocol.ClusterMeans(centroids[keep], counts[keep].astype(np.int64)))


def _continue_lloyd(X, C, sums, counts, local_iters: int, tol: float, labels=None):
    """Finish ``local_iters`` Lloyd iterations whose first assignment statistics
    (``sums``, ``counts`` against ``C``) are already known; return the centroids, the
    sizes of the last assignment and, when the first assignment's ``labels`` are given
    (the differencing guard), the last assignment's labels (else None)."""
    local_C = local.update_centroids(C, sums, counts)
    if local_iters > 1 and kernels.frobenius(local_C - C) >= tol:
        local_C, counts, _, *last = local.lloyd(X, local_C, local_iters - 1, tol,
                                                return_labels=labels is not None)
        labels = last[0] if last else None
    return local_C, counts, labels


def lloyd_task(site: SiteData, arrays, params, floor: int, guard=OFF) -> TaskReply:
    C = received_centroids(arrays.centroids, site)
    local_iters = task_param(params, "local-iters", int)
    tol = task_param(params, "tol", float)
    if local_iters < 1:
        raise TaskError(f"task parameter 'local-iters' must be >= 1, got {local_iters}")
    # The weights are counted against the RECEIVED centroids (DWF paper, Fig. 1); the
    # first Lloyd pass needs exactly these statistics, so they are computed once.
    sums, weights, sse = kernels.lloyd_stats(site.X, C)
    first = kernels.assign(site.X, C)[0] if guard.active else None
    local_C, last_counts, last = _continue_lloyd(site.X, C, sums, weights, local_iters, tol, first)
    # A cluster is reported only if both its weight and the member set of its reported
    # mean reach the floor.
    sizes = last_counts
    last_counts = np.where(weights < floor, 0, last_counts)
    hidden_counts, local_C = apply_privacy_floor(last_counts, local_C, C, floor)
    weights = np.where(hidden_counts == 0, 0, weights).astype(np.int64)
    if guard.active:  # the guard checks the member sets of the reported means
        verdict = guard_clusters(guard, last, np.flatnonzero(weights > 0), floor, sizes,
                                 site.n_rows if last is first else None)
        weights[verdict.withheld] = 0
        local_C[verdict.withheld] = C[verdict.withheld]
        for j, mask in verdict.substituted.items():
            local_C[j] = set_mean(site.X, mask)
            if last is first:  # one local iteration: the weight is that set's size
                weights[j] = np.count_nonzero(mask)
    reply = TaskReply(arrays=protocol.ClusterMeans(local_C, weights), metrics={"sse": float(sse)})
    if params.get(protocol.EVALUATE_TOO):
        # the evaluation of the RECEIVED centroids, exactly as an evaluate round would
        # send it (the guard sees the same member sets, so it gives the same verdicts)
        reply.evaluation = evaluate(site, protocol.Centroids(arrays.centroids), params, floor,
                                    guard, labels=first)
    return reply


def minibatch_task(site: SiteData, arrays, params, floor: int, guard=OFF) -> TaskReply:
    C = received_centroids(arrays.centroids, site)
    epochs = task_param(params, "epochs", int)
    batch = task_param(params, "batch-size", int)
    beta = task_param(params, "beta", float)
    seed = task_param(params, "seed", int)
    if epochs < 1 or batch < 0 or not 0.0 < beta <= 1.0:
        raise TaskError(f"bad mini-batch parameters: epochs {epochs}, batch-size {batch}, beta {beta}")
    n = site.n_rows
    full = batch == 0 or batch >= n
    rng = np.random.default_rng(seed)  # per site and round: the server sends the seed
    metrics = {}
    if full:  # the score of the received centroids costs one more pass only with batches
        metrics["sse"] = kernels.lloyd_stats(site.X, C)[2]
    gamma = C.copy()
    touched = np.zeros((C.shape[0], n), dtype=bool) if guard.active else None
    labels = np.zeros(n, dtype=np.int64) if guard.active else None
    for _ in range(epochs):
        # A full batch's order does not change the result; skip the permutation.
        order = np.arange(n) if full else rng.permutation(n)
        lam = kernels.minibatch_epoch(site.X, order, n if full else batch, gamma, beta, labels)
        if guard.active:
            touched[labels, np.arange(n)] = True
    lam, gamma = apply_privacy_floor(lam, gamma, C, floor)
    if guard.active:  # the member sets: every row that moved the cluster's gamma
        one_set = full and epochs == 1  # else gamma is no statistic of one set
        verdict = guard_clusters(guard, touched, np.flatnonzero(lam > 0), floor,
                                 lam if one_set else None, n)
        for j, mask in verdict.substituted.items():
            if one_set:  # gamma = C + beta (mean - C), Lambda = |set|
                gamma[j] = C[j] + beta * (set_mean(site.X, mask) - C[j])
                lam[j] = np.count_nonzero(mask)
            else:
                verdict.withheld.append(j)
        lam[verdict.withheld] = 0
        gamma[verdict.withheld] = C[verdict.withheld]
    if protocol.FAR_ROWS in params:  # where the server re-seeds a dead cluster
        far = farthest_rows(site.X, C, task_param(params, protocol.FAR_ROWS, int), floor, guard)
        return TaskReply(arrays=protocol.ClusterMeansAndFar(gamma, lam, *far), metrics=metrics)
    return TaskReply(arrays=protocol.ClusterMeans(gamma, lam), metrics=metrics)


def _means_of_kept(X: np.ndarray, seeds: np.ndarray, floor: int, guard=OFF) -> TaskReply:
    """Means and sizes of the clusters of ``seeds`` that have at least ``floor`` members
    (and that the differencing guard lets through)."""
    sums, counts, _ = kernels.lloyd_stats(X, seeds)
    keep = (counts >= floor) & (counts > 0)
    if guard.active:
        verdict = guard_clusters(guard, kernels.assign(X, seeds)[0], np.flatnonzero(keep),
                                 floor, counts, X.shape[0])
        keep[verdict.withheld] = False
        for j, mask in verdict.substituted.items():
            sums[j], counts[j] = set_sum(X, mask), np.count_nonzero(mask)
    means = sums[keep] / counts[keep, None]
    return TaskReply(arrays=protocol.ClusterMeans(means, counts[keep].astype(np.int64)))


def kmeanspp_task(site: SiteData, arrays, params, floor: int, guard=OFF) -> TaskReply:
    k = task_param(params, "k-local", int)
    seed = task_param(params, "seed", int)
    method = str(params.get("init", "kmeans++"))
    if k < 1:
        raise TaskError(f"task parameter 'k-local' must be >= 1, got {k}")
    k = min(k, site.n_rows)
    if method == "kmeans++":
        seeds = local.kmeans_plusplus(site.X, k, seed)
    elif method == "random":
        rows = np.random.default_rng(seed).choice(site.n_rows, size=k, replace=False)
        seeds = np.asarray(site.X[np.sort(rows)], dtype=np.float64)
    else:
        raise TaskError(f"unknown seeding {method!r}; use 'kmeans++' or 'random'")
    return _means_of_kept(site.X, seeds, floor, guard)


def prune_lloyd_task(site: SiteData, arrays, params, floor: int, guard=OFF) -> TaskReply:
    C = received_centroids(arrays.centroids, site)
    local_iters = task_param(params, "local-iters", int)
    tol = task_param(params, "tol", float)
    prune = bool(params.get("prune", True))
    if local_iters < 1:
        raise TaskError(f"task parameter 'local-iters' must be >= 1, got {local_iters}")
    sums, counts, sse = kernels.lloyd_stats(site.X, C)
    if prune:
        # Drop the global clusters with no local member (FKM, Algorithm 1 lines 14-16).
        # They had no member, so assigning to the rest gives the same statistics.
        kept = counts > 0
        C, sums, counts = C[kept], sums[kept], counts[kept]
    first = kernels.assign(site.X, C)[0] if guard.active else None
    local_C, counts, last = _continue_lloyd(site.X, C, sums, counts, local_iters, tol, first)
    keep = counts >= floor
    if guard.active:
        verdict = guard_clusters(guard, last, np.flatnonzero(keep), floor, counts, site.n_rows)
        keep[verdict.withheld] = False
        for j, mask in verdict.substituted.items():
            local_C[j], counts[j] = set_mean(site.X, mask), np.count_nonzero(mask)
    return TaskReply(arrays=protocol.ClusterMeans(local_C[keep], counts[keep].astype(np.int64)),
                     metrics={"sse": float(sse)})


def fcm_task(site: SiteData, arrays, params, floor: int, guard=OFF) -> TaskReply:
    """Local centres after ``local-iters`` fuzzy c-means iterations, and W_j = sum u^m
    against the last centres used. A centre whose hard (argmax) cluster has fewer than
    p members is withheld like a small k-means cluster (W = 0, the received centre)."""
    C = received_centroids(arrays.centroids, site)
    m = task_param(params, "fuzzifier", float)
    local_iters = task_param(params, "local-iters", int)
    if not m > 1.0 or local_iters < 1:
        raise TaskError(f"bad fuzzy c-means parameters: fuzzifier {m}, local-iters {local_iters}")
    centres = C.copy()
    for _ in range(local_iters):
        sums, weights, hard = kernels.fcm_stats(site.X, centres, m)
        centres = local.update_centroids(centres, sums, weights)
    hidden = hard < floor
    weights[hidden] = 0.0
    centres[hidden] = C[hidden]
    return TaskReply(arrays=protocol.FuzzyCentres(centres, weights))


def gtv_task(site: SiteData, arrays, params, floor: int, guard=OFF) -> TaskReply:
    """The site's centroids after up to ``local-iters`` GTVMin updates (E1-E3, M), stopped
    early when the local objective L_i(W) + alpha sum_i' d(i, i') falls by less than
    ``tol`` times its value. ``arrays`` = [W_i (k, d), neighbours' W (deg, k, d)]; empty
    in round 0, where W_i starts at k-means++ seeds on the local data (alpha is moot
    without neighbours, so that round is local Lloyd).

    Privacy floor: a cluster with fewer than p local members is updated from its
    neighbours only (kernel), and in round 0 a centroid that no p rows ever moved (still
    a k-means++ seed, i.e. a data row) is replaced by the mean of all local rows."""
    alpha = task_param(params, "alpha", float)
    local_iters = task_param(params, "local-iters", int)
    tol = task_param(params, "tol", float)
    if alpha < 0 or local_iters < 1 or tol < 0:
        raise TaskError(f"bad gtv parameters: alpha {alpha}, local-iters {local_iters}, tol {tol}")
    refuse_under_floor(site, floor, "it keeps no centroids of its own")
    first_round = arrays.own is None
    if first_round:
        k = task_param(params, "n-clusters", int)
        if k > site.n_rows:
            raise TaskError(f"k = {k} clusters but this site has only {site.n_rows} rows")
        W = local.kmeans_plusplus(site.X, k, task_param(params, "seed", int)).astype(np.float64)
        neighbours = np.zeros((0, k, site.n_features))
    else:
        W = received_centroids(arrays.own, site).astype(np.float64)
        neighbours = (np.asarray(arrays.neighbours) if arrays.neighbours is not None
                      else np.zeros((0, *W.shape)))
        if neighbours.ndim != 3 or neighbours.shape[1:] != W.shape:
            raise TaskError(f"neighbours' centroids of shape {neighbours.shape} do not fit "
                            f"this site's centroids {W.shape}")
        if not np.all(np.isfinite(neighbours)):
            raise TaskError("the neighbours' centroids sent by the server are not all finite")
    moved = np.zeros(W.shape[0], dtype=bool)  # round 0: updated from >= p rows at least once
    W_new, counts, sse, gtv = kernels.gtv_update(site.X, W, neighbours, alpha, floor)
    objective = sse + alpha * gtv
    for _ in range(local_iters):
        moved |= counts >= floor
        W_before, W = W, W_new
        W_new, counts, sse, gtv = kernels.gtv_update(site.X, W, neighbours, alpha, floor)
        previous, objective = objective, sse + alpha * gtv
        if previous - objective <= tol * previous:
            break
    if guard.active:  # W's local part: the sums of the assignment to W_before
        W = guarded_gtv_step(site.X, W_before, neighbours, alpha, floor, guard)
    if first_round and not moved.all():
        W[~moved] = np.asarray(site.X, dtype=np.float64).mean(axis=0)
    if guard.active or (first_round and not moved.all()):
        _, counts, sse, gtv = kernels.gtv_update(site.X, W, neighbours, alpha, floor)
    counts = np.where(counts >= floor, counts, 0).astype(np.int64)
    return TaskReply(arrays=protocol.ClusterMeans(W, counts), metrics={"sse": float(sse), "gtv": float(gtv)})


def evaluate_sets_task(site: SiteData, arrays, params, floor: int, guard=OFF) -> TaskReply:
    """For each centroid set in ``arrays.sets`` (s, k, d), the local SSE against it (the
    pooled score of every site's centroids, summed over sites by the server)."""
    sets = np.asarray(arrays.sets)
    if sets.ndim != 3:
        raise TaskError("evaluate_sets needs one (sets, k, d) array")
    sse = np.array([kernels.assign(site.X, received_centroids(W, site))[1].sum() for W in sets])
    return TaskReply(arrays=protocol.SetScores(sse.astype(np.float64)))


def _label_names(site: SiteData) -> list[str]:
    codes = np.unique(site.labels)
    if site.label_names is not None:
        return [str(site.label_names[c]) for c in codes]
    return [str(int(c)) for c in codes]


def fuzzy_evaluation_sums(X: np.ndarray, C: np.ndarray, m: float) -> tuple[float, float]:
    """FFCM's evaluation sums over a site's rows (Stallmann & Wilbik; docs/explanation/algorithms.md 5).

    Returns ``(all_sq_dist, partition_sum)``: sum over rows and ALL k centres of
    ||x - c_j||^2 (Outside SSE is this minus the SSE) and sum over rows of sum_j u_ij^2
    (the partition coefficient's numerator). The first uses
    sum_j ||x - c_j||^2 = k ||x - cbar||^2 + sum_j ||c_j - cbar||^2 (cbar = mean of the
    centres), which has no cancellation when the data sit far from the origin.
    """
    k = C.shape[0]
    cbar = C.mean(axis=0)
    spread = float(((C - cbar) ** 2).sum())
    all_sq_dist, partition_sum = 0.0, 0.0
    for start in range(0, X.shape[0], kernels.CHUNK_ROWS):
        rows = X[start:start + kernels.CHUNK_ROWS]
        all_sq_dist += k * float(((rows - cbar) ** 2).sum()) + rows.shape[0] * spread
        partition_sum += float((kernels.fcm_memberships(rows, C, m) ** 2).sum())
    return all_sq_dist, partition_sum


def evaluate(site: SiteData, arrays, params, floor: int, guard=OFF, labels=None) -> TaskReply:
    """Pass 1 of the exact metrics (see ``common/metrics.py``); clusters under the floor
    (empty ones included) are left out (zeros) and flagged ``hidden``, contingency cells
    under it are left out, and labels with no cell at or above the floor are not named.
    ``labels``: the assignment to the centroids sent, when the caller has made it."""
    C = received_centroids(arrays.centroids, site)
    sums, counts, sqnorms, sse, silhouette = kernels.evaluation_stats(site.X, C)
    # The site's own figures, unfiltered, stay in the site's own log.
    log(logging.INFO, "site %s: score %.6g, cluster sizes %s", site.source,
        sse / site.n_rows, counts.tolist())
    # Every cluster under the floor is flagged, an empty one too: flagging only those of
    # 1..p-1 members would tell the server which clusters the site holds a few rows of.
    # The flag then says no more than the zero count (it exists so that the report can
    # say "<p" rather than 0).
    hidden = counts < floor if floor > 1 else np.zeros(counts.shape, dtype=bool)
    if labels is None and (guard.active or site.labels is not None):
        labels = kernels.assign(site.X, C)[0]
    verdict = guard_clusters(guard, labels, np.flatnonzero(~hidden & (counts > 0)), floor, counts,
                             site.n_rows)
    # Davies-Bouldin's distances, measured to C: the server uses them when the pooled
    # means are C (a converged run) and spares the second pass (strategies/base.py).
    distances, _ = kernels.distance_to_means(site.X, C, C)
    hidden[verdict.withheld] = True
    for j, mask in verdict.substituted.items():
        counts[j], sums[j] = np.count_nonzero(mask), set_sum(site.X, mask)
        sqnorms[j], distances[j] = set_sqnorm(site.X, mask), set_distance(site.X, mask, C[j])
    counts[hidden], sums[hidden], sqnorms[hidden], distances[hidden] = 0, 0.0, 0.0, 0.0
    reply = TaskReply(
        arrays=protocol.Evaluation(counts, sums, sqnorms, hidden.astype(np.int64), distances),
        # floor: the site's effective privacy floor (a policy, not data), so that the
        # server can say what a hidden size is under ("<p" with the site's own p).
        metrics={"sse": float(sse), "silhouette-sum": float(silhouette), "floor": int(floor)},
    )
    if "fuzzifier" in params:
        m = task_param(params, "fuzzifier", float)
        if not m > 1.0:
            raise TaskError(f"bad fuzzifier {m} for the fuzzy evaluation")
        all_sq_dist, partition_sum = fuzzy_evaluation_sums(site.X, C, m)
        reply.metrics["all-sq-dist"] = all_sq_dist
        reply.metrics["partition-sum"] = partition_sum
    if site.labels is not None:
        codes, truth = np.unique(site.labels, return_inverse=True)
        table = np.zeros((len(codes), C.shape[0]), dtype=np.int64)
        np.add.at(table, (truth, labels), 1)
        table[table < floor] = 0
        # A label with no cell at or above the floor is left out: its row would be zeros
        # (no metric changes), but its name would tell that the site holds rows of it.
        shown = table.any(axis=1)
        reply.arrays = reply.arrays._replace(contingency=table[shown])
        names = [name for name, keep in zip(_label_names(site), shown) if keep]
        reply.metrics["label-names"] = json.dumps(names)
    return reply


def evaluate_distances(site: SiteData, arrays, params, floor: int, guard=OFF) -> TaskReply:
    """Pass 2 (Davies-Bouldin): per cluster of C, the summed distance to the pooled means."""
    C = received_centroids(arrays.centroids, site)
    means = received_centroids(arrays.means, site)
    distances, counts = kernels.distance_to_means(site.X, C, means)
    if guard.active:  # the same member sets as the evaluation's: the same verdict
        verdict = guard_clusters(guard, kernels.assign(site.X, C)[0],
                                 np.flatnonzero(counts >= floor), floor, counts, site.n_rows)
        distances[verdict.withheld] = 0.0
        for j, mask in verdict.substituted.items():
            distances[j] = set_distance(site.X, mask, means[j])
    distances[counts < floor] = 0.0
    return TaskReply(arrays=protocol.Distances(distances))


TaskFn = Callable[[SiteData, list, dict, int], TaskReply]

TASKS: dict[str, TaskFn] = {
    "describe": describe,
    "impute_stats": impute_stats,
    "stats": stats,
    "bounds": bounds,
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
}

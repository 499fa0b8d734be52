"""Reply validation: every site reply is checked before it is reduced.

A reply that fails raises :class:`ReplyError` with a reason; the strategy logs it, drops
the reply and the round goes on (the Flower FedAvg pattern of "failures", made explicit).
Checks: the arrays the task promises with the right shapes, finite values, counts that
are non-negative integers bounded by the site's declared size, no reported cluster under
the privacy floor, and finite non-negative SSE.
"""

from __future__ import annotations

import numpy as np

from fedcluster.common import protocol
from fedcluster.strategies.reply import Expect, ReplyError


def _finite(name: str, a: np.ndarray) -> None:
    if not np.all(np.isfinite(a)):
        raise ReplyError(f"{name} has non-finite values")


def _shape(name: str, a: np.ndarray, shape: tuple) -> None:
    if a.shape != shape:
        raise ReplyError(f"{name} has shape {a.shape}, expected {shape}")


def _counts(name: str, counts: np.ndarray, expect: Expect, n_rows: int) -> np.ndarray:
    _finite(name, counts)
    if np.any(counts < 0):
        raise ReplyError(f"{name} has a negative count")
    if np.any(counts != np.round(counts)):
        raise ReplyError(f"{name} has a non-integer count")
    counts = counts.astype(np.int64)
    if np.any((counts > 0) & (counts < expect.floor)):
        raise ReplyError(
            f"{name} reports a cluster with fewer members than the privacy floor {expect.floor}"
        )
    if counts.sum() > n_rows:
        raise ReplyError(f"{name} sum to {counts.sum()}, more than the site's {n_rows} rows")
    return counts


def validate(
    arrays: list[np.ndarray], metrics: dict, n_rows: int, expect: Expect
) -> tuple:
    """Check one reply against what its task promises; return its arrays typed and named
    (the task's reply type in ``common/protocol.py``).

    Raises
    ------
    ReplyError
        With the reason, when anything does not hold.
    """
    if protocol.ERROR in metrics:
        raise ReplyError(f"the site refused: {metrics[protocol.ERROR]}")
    if n_rows < 1:
        raise ReplyError(f"declared {n_rows} rows")
    if expect.declared_rows is not None and n_rows != expect.declared_rows:
        raise ReplyError(
            f"declared {n_rows} rows now but {expect.declared_rows} when it joined"
        )
    d, k = expect.n_features, expect.n_clusters
    checks_own_sse = expect.task in ("evaluate", "stats")
    if not checks_own_sse and ("sse" in metrics or (expect.task == "lloyd" and not expect.private)):
        sse = metrics.get("sse")
        if not isinstance(sse, (int, float)) or not np.isfinite(sse) or sse < 0:
            raise ReplyError(f"sse {sse!r} is not a finite non-negative number")
    if "fuzzy-objective" in metrics:
        value = metrics["fuzzy-objective"]
        if not isinstance(value, (int, float)) or not np.isfinite(value) or value < 0:
            raise ReplyError(f"fuzzy-objective {value!r} is not a finite non-negative number")
    if expect.task == "describe":
        n_features = metrics.get("n-features")
        if not isinstance(n_features, int) or n_features < 1:
            raise ReplyError(f"n-features {n_features!r} is not a positive integer")
        max_rounds = metrics.get("max-rounds", 1)
        if not isinstance(max_rounds, int) or isinstance(max_rounds, bool) or max_rounds < 1:
            raise ReplyError(f"max-rounds {max_rounds!r} is not a positive integer")
        for key in (protocol.ROWS_WAITING, protocol.ROWS_HELD_BACK):
            count = metrics.get(key, 0)
            if not isinstance(count, int) or isinstance(count, bool) or count < 0:
                raise ReplyError(f"{key} {count!r} is not a non-negative integer")
        return protocol.NoArrays()
    if expect.task not in protocol.TASKS:
        raise ReplyError(f"no validation rule for task {expect.task!r}")
    if expect.task == "stats" and n_rows < expect.floor:
        # A site under the privacy floor refuses (an error reply), so this one lied.
        raise ReplyError(f"sent statistics of {n_rows} rows, under the privacy floor {expect.floor}")
    try:
        reply = protocol.reply_arrays(expect.task, arrays, expect.scale, expect.far)
    except protocol.ProtocolError as err:
        raise ReplyError(str(err)) from None
    if isinstance(reply, protocol.Evaluation):
        return _evaluation(reply, metrics, expect, n_rows)
    if isinstance(reply, protocol.ClusterProfile):
        return cluster_profile(reply, expect, n_rows)
    if isinstance(reply, (protocol.Moments, protocol.Range)):
        return _per_feature(reply, d)
    if isinstance(reply, protocol.MissingStats):
        return _missing_stats(reply, expect, n_rows)
    if isinstance(reply, protocol.Distances):
        values = reply.distances
        _shape("per-cluster values", values, (k,))
        _finite("per-cluster values", values)
        if np.any(values < 0):
            raise ReplyError("per-cluster values are negative")
        return protocol.Distances(values.astype(np.float64))
    if isinstance(reply, protocol.SetScores):
        _shape("per-set SSE", reply.sse, (expect.max_rows,))
        _finite("per-set SSE", reply.sse)
        if np.any(reply.sse < 0):
            raise ReplyError("per-set SSE is negative")
        return protocol.SetScores(reply.sse.astype(np.float64))
    if isinstance(reply, protocol.FuzzyCentres):
        centres, weights = reply.centres, reply.weights
        _shape("centres", centres, (k, d))
        _shape("fuzzy weights", weights, (k,))
        _finite("centres", centres)
        _finite("fuzzy weights", weights)
        # sum_j u_ij^m <= sum_j u_ij = 1 for every row
        if np.any(weights < 0) or weights.sum() > n_rows * (1 + 1e-9):
            raise ReplyError(f"fuzzy weights outside [0, {n_rows}] in total")
        return protocol.FuzzyCentres(centres.astype(np.float64), weights.astype(np.float64))
    far = _far_rows(reply, expect, n_rows) if isinstance(reply, protocol.ClusterMeansAndFar) else None
    centroids, counts = reply.centroids, reply.counts
    rows = protocol.TASKS[expect.task].rows
    if centroids.ndim != 2 or centroids.shape[1] != d:
        raise ReplyError(f"centroids have shape {centroids.shape}, expected (*, {d})")
    if rows == "per-cluster":
        _shape("centroids", centroids, (k, d))
    elif centroids.shape[0] > expect.max_rows:
        raise ReplyError(f"sent {centroids.shape[0]} centroids, at most {expect.max_rows} asked")
    _shape("counts", counts, (centroids.shape[0],))
    _finite("centroids", centroids)
    counts = _counts("counts", counts, expect, n_rows)
    if rows == "at-most" and np.any(counts == 0):
        raise ReplyError("sent a local centroid with no members")
    if far is not None:
        return protocol.ClusterMeansAndFar(centroids.astype(np.float64), counts, *far)
    return protocol.ClusterMeans(centroids.astype(np.float64), counts)


def _far_rows(reply, expect: Expect, n_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """A minibatch reply's farthest rows: one mean of d finite values and its count, 0
    or at least the floor and at most the site's rows."""
    _shape("far-rows mean", reply.far_means, (1, expect.n_features))
    _finite("far-rows mean", reply.far_means)
    _shape("far-rows count", reply.far_counts, (1,))
    count = float(np.asarray(reply.far_counts)[0])
    if not (count == 0 or expect.floor <= count <= n_rows) or count != round(count):
        raise ReplyError(f"far-rows count {count} is not 0 or a whole number in "
                         f"[{expect.floor}, {n_rows}]")
    return reply.far_means.astype(np.float64), np.asarray(reply.far_counts, dtype=np.int64)


def _per_feature(reply, d: int):
    """Statistics and bounds: one finite value per feature in every array; M2 >= 0 and
    minima <= maxima."""
    for name, a in zip(reply._fields, reply):
        _shape(name.replace("_", " "), a, (d,))
        _finite(name.replace("_", " "), a)
    reply = type(reply)(*[a.astype(np.float64) for a in reply])
    if isinstance(reply, protocol.Moments) and np.any(reply.m2 < 0):
        raise ReplyError("M2 has a negative entry")
    if isinstance(reply, protocol.Range) and np.any(reply.minima > reply.maxima):
        raise ReplyError("minima exceed maxima")
    return reply


def _missing_stats(reply: protocol.MissingStats, expect: Expect, n_rows: int):
    """Imputation statistics: per feature a finite sum and a count of present cells (0,
    or at least the floor, at most the rows); histograms of ``max_rows`` bins (the
    schema's median-bins), each bin 0 or at least the floor, summing to at most the
    feature's count."""
    d = expect.n_features
    _shape("present-cell sums", reply.sums, (d,))
    _finite("present-cell sums", reply.sums)
    _shape("present-cell counts", reply.counts, (d,))
    counts = np.asarray(reply.counts)
    _finite("present-cell counts", counts)
    if np.any(counts < 0) or np.any(counts != np.round(counts)) or np.any(counts > n_rows) \
            or np.any((counts > 0) & (counts < expect.floor)):
        raise ReplyError(f"a present-cell count is negative, not whole, over the site's {n_rows} "
                         f"rows or under the privacy floor {expect.floor}")
    _shape("histograms", reply.histograms, (d, expect.max_rows))
    bins = np.asarray(reply.histograms)
    _finite("histograms", bins)
    if np.any(bins < 0) or np.any(bins != np.round(bins)) or np.any((bins > 0) & (bins < expect.floor)):
        raise ReplyError("histograms hold a bin that is negative, not whole, or under the "
                         f"privacy floor {expect.floor}")
    if np.any(bins.sum(axis=1) > counts):
        raise ReplyError("a histogram holds more values than its feature's present cells")
    return protocol.MissingStats(reply.sums.astype(np.float64), counts, bins.astype(np.int64))


def cluster_profile(reply: protocol.ClusterProfile, expect: Expect, n_rows: int,
                    n_sites: int = 1) -> protocol.ClusterProfile:
    """A cluster profile (``client_app/site_profile.py``), or the secure sum of
    ``n_sites`` sites' profiles: shapes (k clusters, d features, ``max_rows`` bins),
    finite values, whole non-negative counts within the rows (a cluster 0 or at least the
    floor, its rows counted 0 or all of them; a level, missing or bin count may be small:
    each is a function of the site's groups), non-negative squared deviations, at most one
    hidden flag per site and cell."""
    k, d, bins = expect.n_clusters, expect.n_features, expect.max_rows
    shapes = {"counts": (k,), "rows": (k, d), "present": (k, d), "sums": (k, d),
              "squares": (k, d), "histograms": (k, d, bins), "hidden": (k, d),
              "withheld": (k, d)}
    values = {}
    for name, shape in shapes.items():
        a = np.asarray(getattr(reply, name))
        _shape(f"profile {name}", a, shape)
        _finite(f"profile {name}", a)
        if name not in ("sums", "squares") and (np.any(a < 0) or np.any(a != np.round(a))):
            raise ReplyError(f"profile {name} has a negative or non-whole count")
        values[name] = a.astype(np.float64 if name in ("sums", "squares") else np.int64)
    counts = _counts("profile cluster sizes", values["counts"], expect, n_rows)
    rows, present, hist = values["rows"], values["present"], values["histograms"]
    if np.any(rows > counts[:, None]) or np.any(present + values["withheld"] > rows) \
            or np.any(hist.sum(axis=2) > present):
        raise ReplyError("profile counts do not nest (cluster >= rows counted >= present "
                         "+ withheld, present >= histogram)")
    if n_sites == 1 and np.any((rows != 0) & (rows != counts[:, None])):
        raise ReplyError("profile rows counted are neither 0 nor the cluster's rows")
    if np.any(values["squares"] < 0) or np.any(values["hidden"] > n_sites):
        raise ReplyError("profile has negative squared deviations or a hidden flag over "
                         "one per site")
    return protocol.ClusterProfile(**values)


def _fuzzy_sums(metrics: dict, n_rows: int, k: int) -> None:
    """FFCM's evaluation sums: all-sq-dist >= sse (the nearest centre is one of all k)
    and sum_j u_ij^2 in [1/k, 1] for every row."""
    all_sq_dist, partition_sum = metrics["all-sq-dist"], metrics["partition-sum"]
    for key, value in (("all-sq-dist", all_sq_dist), ("partition-sum", partition_sum)):
        if not isinstance(value, (int, float)) or not np.isfinite(value):
            raise ReplyError(f"{key} {value!r} is not a finite number")
    if all_sq_dist < metrics["sse"] * (1 - 1e-9):
        raise ReplyError(f"all-sq-dist {all_sq_dist} is below the sse {metrics['sse']}")
    if not n_rows / k * (1 - 1e-9) <= partition_sum <= n_rows * (1 + 1e-9):
        raise ReplyError(f"partition-sum {partition_sum} outside [{n_rows}/{k}, {n_rows}]")


def _evaluation(reply: protocol.Evaluation, metrics, expect: Expect, n_rows: int) -> protocol.Evaluation:
    """Pass-1 evaluation statistics (see ``strategies/metrics.py``)."""
    import json

    d, k = expect.n_features, expect.n_clusters
    for key in ("sse", "silhouette-sum"):
        value = metrics.get(key)
        if not isinstance(value, (int, float)) or not np.isfinite(value):
            raise ReplyError(f"{key} {value!r} is not a finite number")
    if metrics["sse"] < 0 or abs(metrics["silhouette-sum"]) > n_rows:
        raise ReplyError("sse or silhouette-sum out of range")
    scatter = metrics.get("group-scatter", 0.0)
    if not isinstance(scatter, (int, float)) or not 0 <= scatter <= metrics["sse"] * (1 + 1e-9) + 1e-12:
        raise ReplyError(f"group-scatter {scatter!r} is not a number in [0, sse]")
    floor = metrics.get("floor", expect.floor)
    if not isinstance(floor, int) or isinstance(floor, bool) or floor < expect.floor:
        raise ReplyError(f"floor {floor!r} is not an integer at or above the run's {expect.floor}")
    if ("all-sq-dist" in metrics) != ("partition-sum" in metrics):
        raise ReplyError("sent only one of all-sq-dist and partition-sum")
    if "all-sq-dist" in metrics:
        _fuzzy_sums(metrics, n_rows, k)
    with_labels = "label-names" in metrics
    if with_labels != (reply.contingency is not None):
        raise ReplyError(f"sent {len(protocol.to_arrays(reply))} arrays, expected {6 if with_labels else 5}")
    _shape("cluster sizes", reply.counts, (k,))
    _shape("cluster sums", reply.sums, (k, d))
    _shape("squared norms", reply.sqnorms, (k,))
    _shape("hidden flags", reply.hidden, (k,))
    _shape("distance sums", reply.distances, (k,))
    for name, a in (("cluster sums", reply.sums), ("squared norms", reply.sqnorms),
                    ("distance sums", reply.distances)):
        _finite(name, a)
    counts = _counts("cluster sizes", reply.counts, expect, n_rows)
    if np.any(reply.sqnorms < 0) or np.any(reply.distances < 0):
        raise ReplyError("negative squared norms or distance sums")
    if not np.all(np.isin(reply.hidden, (0, 1))):
        raise ReplyError("hidden flags other than 0/1")
    contingency = None
    if with_labels:
        try:
            names = json.loads(str(metrics["label-names"]))
        except ValueError:
            raise ReplyError("label-names is not a JSON list") from None
        if not isinstance(names, list) or reply.contingency.shape != (len(names), k):
            raise ReplyError(f"contingency table of shape {reply.contingency.shape} does not fit its labels")
        contingency = _counts("contingency table", reply.contingency, expect, n_rows)
    return protocol.Evaluation(counts, reply.sums.astype(np.float64), reply.sqnorms.astype(np.float64),
                               reply.hidden.astype(bool), reply.distances.astype(np.float64),
                               contingency)

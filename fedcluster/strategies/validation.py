"""Reply validation: every site reply is checked before it is reduced.

A reply that fails raises :class:`ReplyError` with a reason; the strategy logs it, drops
the reply and the round goes on (the Flower FedAvg pattern of "failures", made explicit).
Checks: the arrays the task promises with the right shapes, finite values, counts that
are non-negative integers bounded by the site's declared size, no reported cluster under
the privacy floor, and finite non-negative SSE.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


# The shape of each task's reply: "per-cluster" = [(k, d) centroids, (k,) counts];
# "list" = [(m, d) centroids, (m,) counts], m <= the rows asked for (clusters under the
# privacy floor are left out, so m may be 0); "sizes" = [(k,) counts]; "bounds" =
# [(d,) minima, (d,) maxima]; "per-set" = [(s,) one SSE per centroid set sent, s given as
# ``max_rows``]; "stats" = per-feature aggregates, by ``scale`` (see ``_statistics``);
# None = no arrays.
LAYOUT = {
    "describe": None,
    "stats": "stats",
    "bounds": "bounds",
    "lloyd": "per-cluster",
    "minibatch": "per-cluster",
    "local_kmeans": "list",
    "kmeanspp": "list",
    "prune_lloyd": "list",
    "fcm": "per-cluster-weights",
    "gtv": "per-cluster",
    "evaluate_sets": "per-set",
    "evaluate": "evaluation",
    "evaluate_distances": "sizes",
}


class ReplyError(ValueError):
    """A site's reply does not validate; the message says why."""


@dataclass
class Reply:
    """One validated site reply, in the server's terms."""

    site_key: str
    node_id: int
    n_rows: int
    arrays: list[np.ndarray]
    metrics: dict = field(default_factory=dict)
    # How many sites this reply stands for: 1, or N for the decoded sum of a secure round.
    n_sites: int = 1


@dataclass(frozen=True)
class Expect:
    """What a task's reply must look like."""

    task: str
    n_features: int | None = None
    n_clusters: int | None = None  # rows of the centroid array (exact)
    max_rows: int | None = None  # rows of the centroid array (at most), for local_kmeans
    floor: int = 1
    declared_rows: int | None = None  # the size the site declared in its first reply
    scale: str | None = None  # the statistics round's kind: "standard" or "minmax"
    private: bool = False  # a DP run: a lloyd reply carries no SSE (it would not be private)


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
) -> list[np.ndarray]:
    """Check one reply against what its task promises; return the arrays, typed.

    Raises
    ------
    ReplyError
        With the reason, when anything does not hold.
    """
    if "error" in metrics:
        raise ReplyError(f"the site refused: {metrics['error']}")
    if n_rows < 1:
        raise ReplyError(f"declared {n_rows} rows")
    if expect.declared_rows is not None and n_rows != expect.declared_rows:
        raise ReplyError(
            f"declared {n_rows} rows now but {expect.declared_rows} when it joined"
        )
    arrays = [np.asarray(a) for a in arrays]
    d, k = expect.n_features, expect.n_clusters
    if expect.task == "evaluate":
        return _evaluation(arrays, metrics, expect, n_rows)
    if expect.task == "stats":
        return _statistics(arrays, expect, n_rows)
    if "sse" in metrics or (expect.task == "lloyd" and not expect.private):
        sse = metrics.get("sse")
        if not isinstance(sse, (int, float)) or not np.isfinite(sse) or sse < 0:
            raise ReplyError(f"sse {sse!r} is not a finite non-negative number")

    if expect.task == "describe":
        n_features = metrics.get("n-features")
        if not isinstance(n_features, int) or n_features < 1:
            raise ReplyError(f"n-features {n_features!r} is not a positive integer")
        max_rounds = metrics.get("max-rounds", 1)
        if not isinstance(max_rounds, int) or isinstance(max_rounds, bool) or max_rounds < 1:
            raise ReplyError(f"max-rounds {max_rounds!r} is not a positive integer")
        return arrays

    if expect.task not in LAYOUT:
        raise ReplyError(f"no validation rule for task {expect.task!r}")
    layout = LAYOUT[expect.task]
    n_expected = 1 if layout in ("sizes", "per-set") else 2
    if len(arrays) != n_expected:
        raise ReplyError(f"sent {len(arrays)} arrays, expected {n_expected}")

    if layout == "bounds":
        for name, a in zip(("minima", "maxima"), arrays):
            _shape(name, a, (d,))
            _finite(name, a)
        if np.any(arrays[0] > arrays[1]):
            raise ReplyError("minima exceed maxima")
        return [a.astype(np.float64) for a in arrays]

    if layout == "sizes":
        _shape("per-cluster values", arrays[0], (k,))
        _finite("per-cluster values", arrays[0])
        if np.any(arrays[0] < 0):
            raise ReplyError("per-cluster values are negative")
        return [arrays[0].astype(np.float64)]

    if layout == "per-set":
        _shape("per-set SSE", arrays[0], (expect.max_rows,))
        _finite("per-set SSE", arrays[0])
        if np.any(arrays[0] < 0):
            raise ReplyError("per-set SSE is negative")
        return [arrays[0].astype(np.float64)]

    if layout == "per-cluster-weights":
        centres, weights = arrays
        _shape("centres", centres, (k, d))
        _shape("fuzzy weights", weights, (k,))
        _finite("centres", centres)
        _finite("fuzzy weights", weights)
        # sum_j u_ij^m <= sum_j u_ij = 1 for every row
        if np.any(weights < 0) or weights.sum() > n_rows * (1 + 1e-9):
            raise ReplyError(f"fuzzy weights outside [0, {n_rows}] in total")
        return [centres.astype(np.float64), weights.astype(np.float64)]
    centroids, counts = arrays
    if centroids.ndim != 2 or centroids.shape[1] != d:
        raise ReplyError(f"centroids have shape {centroids.shape}, expected (*, {d})")
    if layout == "per-cluster":
        _shape("centroids", centroids, (k, d))
    elif centroids.shape[0] > expect.max_rows:
        raise ReplyError(f"sent {centroids.shape[0]} centroids, at most {expect.max_rows} asked")
    _shape("counts", counts, (centroids.shape[0],))
    _finite("centroids", centroids)
    counts = _counts("counts", counts, expect, n_rows)
    if layout == "list" and np.any(counts == 0):
        raise ReplyError("sent a local centroid with no members")
    return [centroids.astype(np.float64), counts]


def _statistics(arrays, expect: Expect, n_rows: int) -> list[np.ndarray]:
    """The statistics round: ``standard`` = [(d,) means, (d,) deviation sums, (d,) M2 >= 0];
    ``minmax`` = [(d,) minima, (d,) maxima], minima <= maxima. A site under the privacy
    floor refuses (an ``error`` reply), so a reply here is from a site with enough rows."""
    names = {"standard": ("means", "deviation sums", "M2"), "minmax": ("minima", "maxima")}
    if expect.scale not in names:
        raise ReplyError(f"no statistics layout for scale {expect.scale!r}")
    if n_rows < expect.floor:
        raise ReplyError(f"sent statistics of {n_rows} rows, under the privacy floor {expect.floor}")
    wanted = names[expect.scale]
    if len(arrays) != len(wanted):
        raise ReplyError(f"sent {len(arrays)} arrays, expected {len(wanted)}")
    for name, a in zip(wanted, arrays):
        _shape(name, a, (expect.n_features,))
        _finite(name, a)
    arrays = [a.astype(np.float64) for a in arrays]
    if expect.scale == "standard" and np.any(arrays[2] < 0):
        raise ReplyError("M2 has a negative entry")
    if expect.scale == "minmax" and np.any(arrays[0] > arrays[1]):
        raise ReplyError("minima exceed maxima")
    return arrays


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


def _evaluation(arrays, metrics, expect: Expect, n_rows: int) -> list[np.ndarray]:
    """Pass-1 evaluation statistics (see ``common/metrics.py``)."""
    import json

    d, k = expect.n_features, expect.n_clusters
    for key in ("sse", "silhouette-sum"):
        value = metrics.get(key)
        if not isinstance(value, (int, float)) or not np.isfinite(value):
            raise ReplyError(f"{key} {value!r} is not a finite number")
    if metrics["sse"] < 0 or abs(metrics["silhouette-sum"]) > n_rows:
        raise ReplyError("sse or silhouette-sum out of range")
    floor = metrics.get("floor", expect.floor)
    if not isinstance(floor, int) or isinstance(floor, bool) or floor < expect.floor:
        raise ReplyError(f"floor {floor!r} is not an integer at or above the run's {expect.floor}")
    if ("all-sq-dist" in metrics) != ("partition-sum" in metrics):
        raise ReplyError("sent only one of all-sq-dist and partition-sum")
    if "all-sq-dist" in metrics:
        _fuzzy_sums(metrics, n_rows, k)
    with_labels = "label-names" in metrics
    if len(arrays) != (5 if with_labels else 4):
        raise ReplyError(f"sent {len(arrays)} arrays, expected {5 if with_labels else 4}")
    counts, sums, sqnorms, hidden = arrays[:4]
    _shape("cluster sizes", counts, (k,))
    _shape("cluster sums", sums, (k, d))
    _shape("squared norms", sqnorms, (k,))
    _shape("hidden flags", hidden, (k,))
    for name, a in (("cluster sums", sums), ("squared norms", sqnorms)):
        _finite(name, a)
    counts = _counts("cluster sizes", counts, expect, n_rows)
    if np.any(sqnorms < 0) or not np.all(np.isin(hidden, (0, 1))):
        raise ReplyError("negative squared norms or hidden flags other than 0/1")
    out = [counts, sums.astype(np.float64), sqnorms.astype(np.float64), hidden.astype(bool)]
    if with_labels:
        try:
            names = json.loads(str(metrics["label-names"]))
        except ValueError:
            raise ReplyError("label-names is not a JSON list") from None
        table = arrays[4]
        if not isinstance(names, list) or table.shape != (len(names), k):
            raise ReplyError(f"contingency table of shape {table.shape} does not fit its labels")
        out.append(_counts("contingency table", table, expect, n_rows))
    return out

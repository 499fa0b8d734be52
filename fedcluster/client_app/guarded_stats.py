"""Per-cluster statistics under the differencing guard (``differencing_guard.py``).

A task computes its reply as before; with the guard on it also knows each reported
cluster's member rows (its labels), asks the guard which row set may be reported for
each, and replaces the statistics of a cluster the guard snapped to an earlier set by
that set's, or withholds it. The tasks' fast statistics stay those of the kernels; the
member sets are checked to be the ones those statistics came from.
"""

from __future__ import annotations

import numpy as np

from fedcluster.client_app.differencing_guard import DifferencingGuard
from fedcluster.common import kernels
from fedcluster.client_app.task_io import TaskError


class GuardedClusters:
    """The guard's verdict on one reply's clusters.

    ``withheld``: cluster indices to report as under the floor; ``substituted``: cluster
    index -> the earlier row set (boolean mask) whose statistics to report instead.
    """

    def __init__(self) -> None:
        self.withheld: list[int] = []
        self.substituted: dict[int, np.ndarray] = {}


def guard_clusters(guard: DifferencingGuard, labels: np.ndarray, clusters, floor: int,
                   counts: np.ndarray | None = None, n_rows: int | None = None) -> GuardedClusters:
    """Ask ``guard`` about each cluster j in ``clusters`` (members: ``labels == j``, or
    ``labels[j]`` when ``labels`` is a (k, n) boolean membership matrix).

    ``counts``, when given, are the sizes the task's statistics came from: they must
    equal the member sets' (otherwise the guard would check other rows than those
    reported, and the task refuses rather than report them). With ``n_rows`` the
    reported sizes are kept to at most the site's rows (see :func:`_fit_total`).
    """
    verdict = GuardedClusters()
    if not guard.active:
        return verdict
    labels = np.asarray(labels)
    for j in clusters:
        j = int(j)
        mask = labels[j] if labels.ndim == 2 else labels == j
        if counts is not None and int(np.count_nonzero(mask)) != int(counts[j]):
            raise TaskError(f"internal: cluster {j}'s member set ({int(np.count_nonzero(mask))} "
                            f"rows) is not the one of its statistics ({int(counts[j])} rows); "
                            "nothing is reported")
        reported = guard.admit(mask, floor)
        if reported is None:
            verdict.withheld.append(j)
        elif reported is not mask:
            verdict.substituted[j] = reported
    if counts is not None and n_rows is not None:
        _fit_total(verdict, clusters, counts, n_rows)
    return verdict


def _fit_total(verdict: GuardedClusters, clusters, counts, n_rows: int) -> None:
    """Earlier sets overlap, so snapped sizes may sum past the site's rows (which the
    server rightly rejects): withhold the snapped clusters that grew most until they fit."""
    size = {int(j): int(counts[j]) for j in clusters if int(j) not in verdict.withheld}
    size.update({j: int(np.count_nonzero(mask)) for j, mask in verdict.substituted.items()})
    total = sum(size.values())
    while total > n_rows:
        grown = max(verdict.substituted, key=lambda j: size[j] - int(counts[j]))
        del verdict.substituted[grown]
        verdict.withheld.append(grown)
        total -= size.pop(grown)


def set_sum(X: np.ndarray, mask: np.ndarray) -> np.ndarray:
    return np.asarray(X[mask], dtype=np.float64).sum(axis=0)


def set_mean(X: np.ndarray, mask: np.ndarray) -> np.ndarray:
    return set_sum(X, mask) / int(np.count_nonzero(mask))


def set_sqnorm(X: np.ndarray, mask: np.ndarray) -> float:
    rows = np.asarray(X[mask], dtype=np.float64)
    return float((rows * rows).sum())


def set_distance(X: np.ndarray, mask: np.ndarray, centre: np.ndarray) -> float:
    rows = np.asarray(X[mask], dtype=np.float64)
    return float(np.sqrt(((rows - centre) ** 2).sum(axis=1)).sum())


def guarded_gtv_step(X, W_before, neighbours, alpha: float, floor: int, guard) -> np.ndarray:
    """The last GTVMin update again, from the member sets the differencing guard lets
    through: a withheld cluster is updated from its neighbours only (as under the floor),
    a snapped one from the earlier set's sums."""
    sums, counts, sse = kernels.lloyd_stats(X, W_before)
    labels = kernels.assign(X, W_before)[0]
    verdict = guard_clusters(guard, labels, np.flatnonzero(counts >= floor), floor, counts,
                             X.shape[0])
    counts[verdict.withheld] = 0
    for j, mask in verdict.substituted.items():
        sums[j], counts[j] = set_sum(X, mask), np.count_nonzero(mask)
    return kernels.gtv_update(X, W_before, neighbours, alpha, floor, stats=(sums, counts, sse))[0]


def farthest_rows(X: np.ndarray, C: np.ndarray, m: int, floor: int,
                  guard: DifferencingGuard) -> tuple[np.ndarray, np.ndarray]:
    """The mean (1, d) and count (1,) of the ``m`` rows farthest from their nearest
    centroid in ``C`` (ties to the lower row), where a dead cluster is re-seeded: a
    cluster of rows like any other, so it is reported only with at least ``floor``
    rows and through the guard (an earlier set's mean instead, or withheld: count 0)."""
    n = X.shape[0]
    m = max(int(m), int(floor), 1)
    if n < m:
        return np.zeros((1, X.shape[1])), np.zeros(1, dtype=np.int64)
    far = np.argsort(-kernels.assign(X, C)[1], kind="stable")[:m]
    mask = np.zeros(n, dtype=bool)
    mask[far] = True
    verdict = guard_clusters(guard, mask[None, :], [0], floor, np.array([m]), n)
    if verdict.withheld:
        return np.zeros((1, X.shape[1])), np.zeros(1, dtype=np.int64)
    mask = verdict.substituted.get(0, mask)
    return set_mean(X, mask)[None, :], np.array([np.count_nonzero(mask)], dtype=np.int64)

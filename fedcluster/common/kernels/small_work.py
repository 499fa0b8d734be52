"""NumPy versions of the distance kernels, for inputs too small to be worth loading Numba.

Why: a deployed site answers every message in a fresh ``flwr-clientapp`` process.
Importing Numba and bringing up its CPU target to load a cached kernel costs that process
about 1 s of CPU (measured: 0.41 s import, 0.6 s first cached call), which is ~25% of
the process's whole life, while the arithmetic of a site's Lloyd step on a few thousand
rows takes well under a millisecond. Below :data:`NUMPY_MAX_WORK` multiply-adds
(``rows x centroids x features``) the wrappers in the package's ``__init__`` call these
instead, and such a process never imports Numba. A small table's row-order passes
(``client_app/data/group_stats``: the groups' sums, m2 and extremes, a report's parts
among them) are here too (:func:`add_in_row_order`, :func:`group_extremes_at`), with
the compiled ones' bits: a site's report on a few thousand rows loads no Numba either.

The choice depends on the input's shape and the task alone (never on what a process has
loaded), so a site computes the same numbers in a deployment, on the simulation engine
and in process: a pass of at most :data:`NUMPY_MAX_WORK`, or of at most
:data:`FEW_PASSES_MAX_WORK` in a task of only a few passes (:func:`few_passes`), where
loading Numba would cost more than the whole task's arithmetic in NumPy.
The semantics are the compiled kernels' (``_compiled.py``): distances in float64 in the
difference form (exactly 0 for a row against itself), ties to the lowest centroid index,
a NaN row labelled 0 with distance NaN, per-cluster sums and counts, no relocation of
empty clusters. The last bits differ from the compiled kernels' (those let LLVM
reassociate; here NumPy sums pairwise), which is why the choice must not depend on
anything but the shape. No BLAS call anywhere: OpenBLAS's thread count would change bits.
"""

from __future__ import annotations

import contextlib
import contextvars

import numpy as np

#: Up to this many multiply-adds per distance pass (n x k x d) the wrappers use NumPy.
#: At this size a Lloyd pass takes ~7 ms here (the compiled kernel ~0.4 ms), against
#: ~1 s of CPU for a fresh process to load the compiled kernel (bench/deployment.py
#: times a fresh ClientApp's start on both paths).
NUMPY_MAX_WORK = 1 << 20
#: Distances are computed for blocks of rows with at most this many (row, centroid,
#: feature) terms, bounding the temporary arrays to ~2 MB whatever n is.
BLOCK_TERMS = 1 << 18


#: Up to this many multiply-adds per pass, the tasks that make only a handful of passes
#: at the centroids sent (:func:`few_passes`) use NumPy: a pass takes ~0.13 s here at
#: this size, so even the four passes of a Lloyd step that carries the evaluation cost
#: less than loading the compiled kernels.
FEW_PASSES_MAX_WORK = 1 << 25
_few_passes = contextvars.ContextVar("few_passes", default=False)


#: Up to this many values (rows x features) a table's row-order passes
#: (``client_app/data/group_stats``) are NumPy's (:func:`add_in_row_order`,
#: :func:`group_extremes_at`): the same bits, ~20 x slower a value than compiled (1M values
#: ~10 ms), against ~1 s of CPU for a fresh process to load the compiled kernels.
ROW_ORDER_MAX_VALUES = 1 << 20


@contextlib.contextmanager
def few_passes(active: bool = True):
    """Within this block (a site task of a few passes, ``task_runner.is_few_pass_task``), a
    pass goes to NumPy up to :data:`FEW_PASSES_MAX_WORK`. The choice then depends on
    the task and the shape, the same in a deployment, on the simulation engine and in
    process."""
    token = _few_passes.set(active)
    try:
        yield
    finally:
        _few_passes.reset(token)


def small(X: np.ndarray, k: int) -> bool:
    """Whether a pass of ``X`` against ``k`` centres goes to NumPy."""
    limit = NUMPY_MAX_WORK
    if _few_passes.get() and NUMPY_MAX_WORK >= 0:  # (< 0: a test forces the compiled path)
        limit = max(limit, FEW_PASSES_MAX_WORK)
    return X.shape[0] * k * X.shape[1] <= limit


def _blocks(X: np.ndarray, k: int):
    """(start, stop, rows as float64) for consecutive blocks of ``X``."""
    step = max(1, BLOCK_TERMS // max(1, k * X.shape[1]))
    for start in range(0, X.shape[0], step):
        stop = min(X.shape[0], start + step)
        yield start, stop, X[start:stop].astype(np.float64)


def _sq_dists(rows: np.ndarray, C: np.ndarray) -> np.ndarray:
    """(m, k) squared distances, difference form, float64."""
    diff = rows[:, None, :] - C[None, :, :]
    return np.einsum("mkd,mkd->mk", diff, diff)


def _nearest(D: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The compiled ``_nearest_in`` for every row: start from centroid 0, replace only
    on a strictly smaller distance (ties to the lowest index, a NaN row stays (0, NaN))."""
    best = D[:, 0].copy()
    labels = np.zeros(D.shape[0], dtype=np.int64)
    for c in range(1, D.shape[1]):
        closer = D[:, c] < best
        best[closer] = D[closer, c]
        labels[closer] = c
    return labels, best


def _cluster_sums(rows: np.ndarray, labels: np.ndarray, k: int) -> np.ndarray:
    sums = np.zeros((k, rows.shape[1]))
    for c in range(k):
        members = labels == c
        if members.any():
            sums[c] = rows[members].sum(axis=0)
    return sums


def _weighted(rows: np.ndarray, w: np.ndarray, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
    """The block's weights as floats, and its rows times them (a group of w rows at its
    mean adds w times the mean; times 1.0 a row is itself, bit for bit)."""
    weight = w[start:stop].astype(np.float64)
    return weight, rows * weight[:, None]


def assign(X: np.ndarray, C: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    C = C.astype(np.float64)
    labels = np.empty(X.shape[0], dtype=np.int64)
    dists = np.empty(X.shape[0])
    for start, stop, rows in _blocks(X, C.shape[0]):
        labels[start:stop], dists[start:stop] = _nearest(_sq_dists(rows, C))
    return labels, dists


def lloyd_stats(X: np.ndarray, C: np.ndarray, w: np.ndarray,
                s: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    k = C.shape[0]
    C = C.astype(np.float64)
    sums, counts, sse = np.zeros((k, X.shape[1])), np.zeros(k, dtype=np.int64), 0.0
    for start, stop, rows in _blocks(X, k):
        labels, best = _nearest(_sq_dists(rows, C))
        weight, weighted = _weighted(rows, w, start, stop)
        sums += _cluster_sums(weighted, labels, k)
        counts += np.bincount(labels, weights=w[start:stop], minlength=k).astype(np.int64)
        sse += float((s[start:stop] + weight * best).sum())
    return sums, counts, sse


def min_sq_dist_update(X: np.ndarray, centres: np.ndarray, current: np.ndarray) -> np.ndarray:
    centres = centres.astype(np.float64)
    out = np.empty((centres.shape[0], X.shape[0]))
    for start, stop, rows in _blocks(X, centres.shape[0]):
        out[:, start:stop] = np.minimum(current[start:stop], _sq_dists(rows, centres).T)
    return out


def evaluation_stats(X: np.ndarray, C: np.ndarray, w: np.ndarray, s: np.ndarray):
    k = C.shape[0]
    C = C.astype(np.float64)
    sums, counts = np.zeros((k, X.shape[1])), np.zeros(k, dtype=np.int64)
    sqnorms, sse, sil = np.zeros(k), 0.0, 0.0
    for start, stop, rows in _blocks(X, k):
        D = _sq_dists(rows, C)
        # nearest and second nearest, as the compiled scan finds them
        best = np.full(D.shape[0], np.inf)
        second = np.full(D.shape[0], np.inf)
        labels = np.zeros(D.shape[0], dtype=np.int64)
        for c in range(k):
            dist = D[:, c]
            closer = dist < best
            runner_up = ~closer & (dist < second)
            second = np.where(closer, best, np.where(runner_up, dist, second))
            best = np.where(closer, dist, best)
            labels[closer] = c
        weight, weighted = _weighted(rows, w, start, stop)
        scatter = s[start:stop]
        sums += _cluster_sums(weighted, labels, k)
        counts += np.bincount(labels, weights=w[start:stop], minlength=k).astype(np.int64)
        sqnorms += np.bincount(labels, weights=weight * np.einsum("md,md->m", rows, rows),
                               minlength=k)
        sse += float((scatter + weight * best).sum())
        if k > 1:
            a, b = np.sqrt(best), np.sqrt(second)
            top = np.maximum(a, b)
            positive = top > 0.0
            sil += float(np.sum(weight[positive] * ((b[positive] - a[positive]) / top[positive])))
    return sums, counts, sqnorms, sse, sil


def distance_to_means(X: np.ndarray, C: np.ndarray, means: np.ndarray, w: np.ndarray):
    k = C.shape[0]
    C, means = C.astype(np.float64), means.astype(np.float64)
    out, counts = np.zeros(k), np.zeros(k, dtype=np.int64)
    for start, stop, rows in _blocks(X, k):
        labels, _ = _nearest(_sq_dists(rows, C))
        diff = rows - means[labels]
        weight = w[start:stop].astype(np.float64)
        out += np.bincount(labels, weights=weight * np.sqrt(np.einsum("md,md->m", diff, diff)),
                           minlength=k)
        counts += np.bincount(labels, weights=w[start:stop], minlength=k).astype(np.int64)
    return out, counts


def _memberships(D: np.ndarray, m: float) -> np.ndarray:
    """Bezdek memberships (rows, k) from squared distances, as the compiled
    ``_memberships``: d_j^(-1/(m-1)) normalised; a row on a centre belongs to the first
    such centre alone."""
    on_centre = D == 0.0
    hit = on_centre.any(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        U = 1.0 / D if m == 2.0 else D ** (-1.0 / (m - 1.0))
        U /= U.sum(axis=1, keepdims=True)
    if hit.any():
        U[hit] = 0.0
        U[hit, np.argmax(on_centre[hit], axis=1)] = 1.0
    return U


def fcm_stats(X: np.ndarray, C: np.ndarray, m: float, w: np.ndarray, off: np.ndarray):
    """``off``: (n,) added to each row's squared distances (the compiled kernel's)."""
    k = C.shape[0]
    C = C.astype(np.float64)
    sums, weights, hard = np.zeros((k, X.shape[1])), np.zeros(k), np.zeros(k, dtype=np.int64)
    for start, stop, rows in _blocks(X, k):
        D = _sq_dists(rows, C)
        U = _memberships(D + off[start:stop, None], m)
        hard += np.bincount(np.argmax(U, axis=1), weights=w[start:stop],  # ties: the lowest index
                            minlength=k).astype(np.int64)
        Um = w[start:stop, None].astype(np.float64) * (U * U if m == 2.0 else U ** m)
        weights += Um.sum(axis=0)
        sums += np.einsum("mk,md->kd", Um, rows)  # einsum's own loop, no BLAS
    return sums, weights, hard


def fcm_memberships(X: np.ndarray, C: np.ndarray, m: float, off: float = 0.0) -> np.ndarray:
    C = C.astype(np.float64)
    out = np.empty((X.shape[0], C.shape[0]))
    for start, stop, rows in _blocks(X, C.shape[0]):
        D = _sq_dists(rows, C)
        out[start:stop] = _memberships(D + off if off != 0.0 else D, m)
    return out


#: A mini-batch epoch in NumPy loops over its batches in Python: at most this many.
MAX_BATCHES = 4096


def minibatch_small(X: np.ndarray, k: int, batch: int) -> bool:
    """Whether a mini-batch epoch goes to NumPy: a small pass in few enough batches."""
    return small(X, k) and -(-X.shape[0] // batch) <= MAX_BATCHES


def minibatch_epoch(X, w, order, batch: int, gamma: np.ndarray, beta: float,
                    lam: np.ndarray) -> None:
    """The compiled ``_minibatch_epoch_impl``: ``gamma`` and ``lam`` updated in place;
    row i counts ``w[i]`` times (a site's group at its mean)."""
    k = gamma.shape[0]
    for start in range(0, order.shape[0], batch):
        picked = order[start:start + batch]
        rows = X[picked].astype(np.float64)
        labels, _ = _nearest(_sq_dists(rows, gamma))
        counts = np.bincount(labels, weights=w[picked], minlength=k).astype(np.int64)
        sums = _cluster_sums(rows * w[picked, None].astype(np.float64), labels, k)
        for c in np.flatnonzero(counts):
            lam[c] += counts[c]
            step = beta * counts[c] / lam[c]
            gamma[c] += step * (sums[c] / counts[c] - gamma[c])


def gtv_m_step(W: np.ndarray, N: np.ndarray, sums: np.ndarray, counts: np.ndarray,
               alpha: float, floor: int):
    """The compiled ``_gtv_m_step_impl`` (GTVMin's E2, E3 and M for one site)."""
    k, d = W.shape
    nb_sums, nb_counts, gtv = np.zeros((k, d)), np.zeros(k), 0.0
    for neighbour in N:
        D = _sq_dists(neighbour, W)  # (k', k)
        nearest_local, best = _nearest(D)  # E2: each neighbour centroid's nearest local one
        gtv += float(best.sum())
        nb_counts += np.bincount(nearest_local, minlength=k)
        nb_sums += _cluster_sums(neighbour, nearest_local, k)
        nearest_theirs, best = _nearest(np.ascontiguousarray(D.T))  # E3
        gtv += float(best.sum())
        nb_counts += 1.0
        nb_sums += neighbour[nearest_theirs]
    kept = counts >= floor  # M: clusters under the floor leave their local rows out
    local_counts = np.where(kept, counts, 0)
    local_sums = np.where(kept[:, None], sums, 0.0)
    den = local_counts + alpha * nb_counts
    W_new = W.copy()
    moving = den > 0.0
    W_new[moving] = (local_sums[moving] + alpha * nb_sums[moving]) / den[moving][:, None]
    return W_new, gtv


def add_in_row_order(places: np.ndarray, groups: np.ndarray, values: np.ndarray,
                     into: np.ndarray, offset: int = 0) -> None:
    """The compiled ``add_in_row_order`` to the bit: each row's values into its group's
    slot (``into[group - offset]``), the group's first row (place 0) setting it (a -0.0
    stays -0.0), each later row added in row order: ``ufunc.at`` adds a repeated
    index's values one after another in index order, ((x0 + x1) + x2) ... as the
    compiled loop does (place -1: no group)."""
    first = places == 0
    into[groups[first] - offset] = values[first]
    later = places > 0
    np.add.at(into, groups[later] - offset, values[later])


def group_extremes_at(high: np.ndarray, low: np.ndarray, groups: np.ndarray,
                      deviation: np.ndarray) -> None:
    """The compiled ``group_extremes_at``: per group, its slot in ``high`` raised to a
    larger deviation, in ``low`` lowered to a smaller one, the same bits where the slots
    start at 0 as ``group_m2``'s do (a deviation equal to the slot leaves it, so a -0.0
    never replaces the slot's 0.0: NumPy's maximum of equal values is the second)."""
    top = np.full_like(high, -np.inf)
    np.maximum.at(top, groups, deviation)
    np.copyto(high, top, where=top > high)
    bottom = np.full_like(low, np.inf)
    np.minimum.at(bottom, groups, deviation)
    np.copyto(low, bottom, where=bottom < low)

"""The compiled code of :mod:`fedcluster.common.kernels`: every ``@njit`` function.

Every compiled function, the constants they read (:data:`FASTMATH`, the tile sizes)
and the serial twins live in this ONE module, and this is the only module of
fedcluster that imports numba.  The reason is Numba's on-disk cache (all kernels use
``cache=True``): it keys a kernel's cache entry on the kernel's own source file and
notices an edit only there, not in a helper it calls that is defined in another file
(tests/test_kernels.py fails if a compiled kernel here calls a dispatcher from another
module).  The checked Python wrappers, which callers use, are in the package's
``__init__``.

Reproducibility contract
------------------------
Every result is bit-identical whatever ``numba.set_num_threads(...)`` is, so
a federated run gives the same numbers on the simulation engine and on the
deployment engine even when they give a site a different number of threads.
That is obtained by construction, not by luck:

* rows are cut into fixed-size blocks whose size depends only on the number
  of rows (:func:`fedcluster.common.kernels.block_rows`, passed to the kernels
  as ``block``), never on the thread count;
* a ``prange`` over blocks writes each block's partial sums / counts / SSE
  into its own slot of a slab (``n_blocks x k x d`` ...); threads only decide
  *who* computes a block, not *what* is added to what;
* the slab is then reduced serially, in block order;
* distances are computed in register tiles of 8 rows x 2 centroids
  (:func:`_tile_sq_dists`); the rows of a tile are consecutive rows of one
  block (past the block's end the last row is repeated and its results are
  ignored) and k is padded to even by repeating the last centroid, so every
  (row, centroid) distance goes through the same compiled loop and comes out
  the same wherever the row sits.

Speed: the tiles load each centroid element once per 8 rows and each row
element once per 2 centroids, so a Lloyd iteration is bound by the FMA
units, not by streaming the centroids from L2 for every row; with this it
runs faster than scikit-learn's GEMM-based Lloyd iteration in float64
(``bench/kernels.py``; figures in BENCHMARKS.md).

Kernels that produce one value per row (``_assign_impl``,
``_min_sq_dist_update_impl``) have no reduction at all, so a plain ``prange``
over rows is already deterministic.

The guarantee is per machine: ``fastmath`` "reassoc"/"contract" (see
:data:`FASTMATH`) let LLVM pick the SIMD width and FMA use for the host CPU,
so two CPUs with different vector units may differ in the last bits.

Non-finite input: there is deliberately no ``nnan``/``ninf`` fast-math flag (see
:data:`FASTMATH`), so NaN propagates as IEEE says (the package doc says how).
"""

from __future__ import annotations

import hashlib
import math
import os
import types

import numpy as np

from numba import njit, prange, set_parallel_chunksize
from numba.core import config as numba_config
from numba.core.caching import UserProvidedCacheLocator


# The locator serves this file only, so its digest is read once, not once per kernel.
with open(__file__, "rb") as _source:
    _SOURCE_DIGEST = hashlib.sha256(_source.read()).hexdigest()[:32]


class SourceKeyedCacheLocator(UserProvidedCacheLocator):
    """Numba's ``NUMBA_CACHE_DIR`` locator, with this file's cache folder named by its
    CONTENT instead of by the folder it sits in.

    A site installs each app version into a new folder (Flower's
    ``FLWR_HOME/apps/<name>.<version>.<hash>``), and Numba's own locator keys the cache
    on that folder, so every new copy of unchanged kernels is compiled again (about a
    minute of CPU, in a site's first round). Numba already checks a cache entry against
    a hash of the source (the entry's stamp), so a folder named by that hash is safe:
    copies of the same file share entries, an edited file gets a folder of its own.
    Used only when ``NUMBA_CACHE_DIR`` is set and ``NUMBA_CACHE_LOCATOR_CLASSES`` is not
    (see :data:`LOCATORS`); other files' functions go to Numba's own locators."""

    def __init__(self, py_func, py_file):
        super().__init__(py_func, py_file)
        self._cache_path = os.path.join(numba_config.CACHE_DIR, f"fedcluster-kernels-{_SOURCE_DIGEST}")

    @classmethod
    def from_function(cls, py_func, py_file):
        if os.path.abspath(py_file) != os.path.abspath(__file__):
            return None
        return super().from_function(py_func, py_file)


# Numba reads its locator list (a public setting, NUMBA_CACHE_LOCATOR_CLASSES) when a
# function is decorated with cache=True, so this must come before the first kernel.
LOCATORS = (f"{__name__}.SourceKeyedCacheLocator,UserProvidedCacheLocator,InTreeCacheLocator,"
            "UserWideCacheLocator,IPythonCacheLocator,ZipCacheLocator")
if numba_config.CACHE_DIR and not numba_config.CACHE_LOCATOR_CLASSES:
    numba_config.CACHE_LOCATOR_CLASSES = LOCATORS

# Fast-math flags, defined once and used by every kernel.
#
# * "reassoc" is what makes the kernels fast: without it LLVM must add the d
#   squared differences of a distance strictly left to right and cannot
#   vectorise that reduction.  Measured (lloyd_stats, 1 thread, best of 15):
#   n=20k d=784 k=10: 17-19 ms with it, 165-170 ms without (85-110 ms with no
#   fast-math at all); n=50k d=64 k=10: 2-4 ms vs 17-23 ms.  (d=2 is memory
#   bound: no difference.)  The order LLVM picks depends only on the compiled
#   code and on d, never on the thread count, so the thread-invariance
#   contract (module doc) still holds.
# * "contract" lets LLVM fuse (x - c) * (x - c) + acc into one FMA (one
#   rounding instead of two).  With "reassoc" it gains 5-10 % at d=784 and
#   nothing measurable at d=64 (alone it would be slower: a serial chain of
#   FMAs has a longer latency than of adds).  Like "reassoc", it makes the
#   last bits depend on the CPU (FMA or not), not on the thread count.
# * "nsz" (ignore the sign of zero) is harmless here: no result depends on
#   whether a zero is +0 or -0, and it lets LLVM fold the `0.0 + ...`
#   accumulator starts.
# * "arcp" (reciprocal instead of division) is left out because it buys
#   nothing: the kernels never divide (the caller does, see the package doc).
# * "nnan"/"ninf" are forbidden: data validation relies on NaN comparing
#   false and propagating through sums; with them LLVM may assume NaN never
#   occurs and fold the checks away.
# (A plain set: Numba rejects a frozenset.  Do not mutate it.)
FASTMATH = {"nsz", "contract", "reassoc"}

# Every assignment computes distances in register tiles of TILE_ROWS rows x
# TILE_CENTROIDS centroids (see _tile_sq_dists, which is unrolled by hand for
# exactly these sizes: change both together).  8 x 2 was the fastest of
# 4x2, 4x3, 4x4, 6x2, 8x2, 8x4 on the shapes of bench/kernels.py.
TILE_ROWS = 8
TILE_CENTROIDS = 2


# --------------------------------------------------------------------------
# Compiled implementations.  All use cache=True: the deployment starts a new
# Python process for every federated round, and compiling the parallel
# kernels costs seconds per process; the on-disk cache brings that down to
# a file load.  They take only arrays and scalars (no function arguments),
# which is what keeps them cacheable.  Helpers live in this same file so
# that editing any of them invalidates the callers' cache entries (Numba
# keys the cache on the caller's source file, not on its callees').
# --------------------------------------------------------------------------


@njit(cache=True, fastmath=FASTMATH, nogil=True)
def _sq_dist(X, i, C, c):
    """Squared Euclidean distance between row `i` of `X` and row `c` of `C`.

    Computed as a plain sum of squared differences in float64, even for
    float32 input: each float32 element is widened before subtracting.
    The difference form (not ||x||^2 - 2 x.c + ||c||^2) avoids cancellation
    and gives exactly 0 for a row against itself, which k-means++ relies on.
    Used where one distance at a time is wanted (k-means++ potentials,
    distances to other centres); assignments use :func:`_tile_sq_dists`.
    """
    acc = 0.0
    for j in range(X.shape[1]):
        t = np.float64(X[i, j]) - np.float64(C[c, j])
        acc += t * t
    return acc


@njit(cache=True, nogil=True)
def _pad_centroids(C):
    """``C`` with its last row repeated up to a multiple of TILE_CENTROIDS rows, so
    every centroid goes through the same tile code (the padding rows are never
    chosen: argmins only look at the first k columns)."""
    k, d = C.shape
    padded = ((k + TILE_CENTROIDS - 1) // TILE_CENTROIDS) * TILE_CENTROIDS
    P = np.empty((padded, d), dtype=C.dtype)
    P[:k] = C
    for c in range(k, padded):
        P[c] = C[k - 1]
    return P


@njit(cache=True, nogil=True, inline="always")
def _contiguous_rows(rows, start, stop):
    """Fill the tile's row indices with ``start, start + 1, ...``; positions past
    ``stop`` repeat row ``stop - 1`` (computed, then ignored)."""
    for r in range(TILE_ROWS):
        rows[r] = min(start + r, stop - 1)


@njit(cache=True, fastmath=FASTMATH, nogil=True, inline="always")
def _tile_sq_dists(X, rows, P, c, D):
    """Register tile: squared distances of the 8 rows ``X[rows]`` to centroids
    ``P[c]`` and ``P[c + 1]``, into ``D[0:8, c:c + 2]``.

    Why a tile: a row-by-row scan streams every centroid from L2 once per row
    (at d = 784, k = 20 that is 125 kB per row and the kernel is bound by L2
    bandwidth); here each centroid element is loaded once per 8 rows and each
    row element once per 2 centroids, and the 16 independent accumulators keep
    both FMA pipes busy.  The loop over features is what LLVM vectorises (with
    "reassoc"); every accumulator goes through the same compiled loop, so the
    distance of a (row, centroid) pair does not depend on its place in the tile,
    on the block, or on the thread count.  Arithmetic in float64 whatever X's
    dtype: labels agree with a float64 reference, and the chosen distance is the
    SSE term (no second pass); a row equal to a centroid gets exactly 0.
    Hand-unrolled because Numba keeps scalars, not small arrays, in registers.
    """
    i0 = rows[0]; i1 = rows[1]; i2 = rows[2]; i3 = rows[3]  # noqa: E702
    i4 = rows[4]; i5 = rows[5]; i6 = rows[6]; i7 = rows[7]  # noqa: E702
    a00 = 0.0; a01 = 0.0  # noqa: E702
    a10 = 0.0; a11 = 0.0  # noqa: E702
    a20 = 0.0; a21 = 0.0  # noqa: E702
    a30 = 0.0; a31 = 0.0  # noqa: E702
    a40 = 0.0; a41 = 0.0  # noqa: E702
    a50 = 0.0; a51 = 0.0  # noqa: E702
    a60 = 0.0; a61 = 0.0  # noqa: E702
    a70 = 0.0; a71 = 0.0  # noqa: E702
    for j in range(X.shape[1]):
        y0 = np.float64(P[c, j])
        y1 = np.float64(P[c + 1, j])
        x = np.float64(X[i0, j]); t = x - y0; a00 += t * t; t = x - y1; a01 += t * t  # noqa: E702
        x = np.float64(X[i1, j]); t = x - y0; a10 += t * t; t = x - y1; a11 += t * t  # noqa: E702
        x = np.float64(X[i2, j]); t = x - y0; a20 += t * t; t = x - y1; a21 += t * t  # noqa: E702
        x = np.float64(X[i3, j]); t = x - y0; a30 += t * t; t = x - y1; a31 += t * t  # noqa: E702
        x = np.float64(X[i4, j]); t = x - y0; a40 += t * t; t = x - y1; a41 += t * t  # noqa: E702
        x = np.float64(X[i5, j]); t = x - y0; a50 += t * t; t = x - y1; a51 += t * t  # noqa: E702
        x = np.float64(X[i6, j]); t = x - y0; a60 += t * t; t = x - y1; a61 += t * t  # noqa: E702
        x = np.float64(X[i7, j]); t = x - y0; a70 += t * t; t = x - y1; a71 += t * t  # noqa: E702
    D[0, c] = a00; D[0, c + 1] = a01  # noqa: E702
    D[1, c] = a10; D[1, c + 1] = a11  # noqa: E702
    D[2, c] = a20; D[2, c + 1] = a21  # noqa: E702
    D[3, c] = a30; D[3, c + 1] = a31  # noqa: E702
    D[4, c] = a40; D[4, c + 1] = a41  # noqa: E702
    D[5, c] = a50; D[5, c + 1] = a51  # noqa: E702
    D[6, c] = a60; D[6, c + 1] = a61  # noqa: E702
    D[7, c] = a70; D[7, c + 1] = a71  # noqa: E702


@njit(cache=True, fastmath=FASTMATH, nogil=True, inline="always")
def _tile_distances(X, rows, P, D):
    """``D[r, c]`` = squared distance of row ``rows[r]`` to ``P[c]``, all c."""
    for c in range(0, P.shape[0], TILE_CENTROIDS):
        _tile_sq_dists(X, rows, P, c, D)


@njit(cache=True, nogil=True, inline="always")
def _nearest_in(D, r, k):
    """Index of and distance to the nearest of the first `k` centroids in row `r`
    of a distance tile.

    Ties go to the lowest centroid index: the scan starts from centroid 0
    and only a strictly smaller distance replaces the incumbent.  Starting
    from centroid 0's distance (rather than +inf) makes a NaN row come out
    as (0, NaN), so the NaN reaches the SSE instead of being hidden.
    """
    best = D[r, 0]
    label = 0
    for c in range(1, k):
        if D[r, c] < best:
            best = D[r, c]
            label = c
    return label, best


@njit(cache=True, fastmath=FASTMATH, parallel=True)
def _assign_impl(X, C, block):
    n = X.shape[0]
    k = C.shape[0]
    P = _pad_centroids(C)
    n_blocks = (n + block - 1) // block
    labels = np.empty(n, dtype=np.int64)
    dists = np.empty(n, dtype=np.float64)
    # One independent result per row: no reduction, so any schedule gives
    # the same bits.
    for b in prange(n_blocks):
        stop = min(n, (b + 1) * block)
        rows = np.empty(TILE_ROWS, dtype=np.int64)
        D = np.empty((TILE_ROWS, P.shape[0]), dtype=np.float64)
        for start in range(b * block, stop, TILE_ROWS):
            _contiguous_rows(rows, start, stop)
            _tile_distances(X, rows, P, D)
            for r in range(min(TILE_ROWS, stop - start)):
                label, dist = _nearest_in(D, r, k)
                labels[start + r] = label
                dists[start + r] = dist
    return labels, dists


@njit(cache=True, fastmath=FASTMATH, parallel=True)
def _lloyd_stats_impl(X, w, s, C, block):
    """Weighted Lloyd statistics: row ``i`` of ``X`` is the mean of ``w[i]`` rows whose
    squared deviations from it add up to ``s[i]`` (a site's group; a row is a group of
    one with ``s`` 0). Per cluster: sums of ``w x``, counts of ``w``; the SSE is
    ``sum s + w ||x - c||^2``, the groups' exact SSE. With ``w`` 1 and ``s`` 0 every
    product and sum is the unweighted one, bit for bit."""
    n, d = X.shape
    k = C.shape[0]
    P = _pad_centroids(C)
    n_blocks = (n + block - 1) // block
    # Per-block partial results: one slot per block, written by exactly one
    # prange iteration.
    sums_slab = np.zeros((n_blocks, k, d), dtype=np.float64)
    counts_slab = np.zeros((n_blocks, k), dtype=np.int64)
    sse_slab = np.zeros(n_blocks, dtype=np.float64)
    for b in prange(n_blocks):
        stop = min(n, (b + 1) * block)
        rows = np.empty(TILE_ROWS, dtype=np.int64)
        D = np.empty((TILE_ROWS, P.shape[0]), dtype=np.float64)
        sse = 0.0
        for start in range(b * block, stop, TILE_ROWS):
            _contiguous_rows(rows, start, stop)
            _tile_distances(X, rows, P, D)
            for r in range(min(TILE_ROWS, stop - start)):
                i = start + r
                label, dist = _nearest_in(D, r, k)
                weight = np.float64(w[i])
                counts_slab[b, label] += w[i]
                sse += s[i] + weight * dist
                for j in range(d):
                    sums_slab[b, label, j] += weight * np.float64(X[i, j])
        sse_slab[b] = sse
    # Serial reduction in block order: the order of the additions is fixed
    # by n alone, hence bit-identical for any thread count.
    sums = np.zeros((k, d), dtype=np.float64)
    counts = np.zeros(k, dtype=np.int64)
    sse = 0.0
    for b in range(n_blocks):
        sse += sse_slab[b]
        for c in range(k):
            counts[c] += counts_slab[b, c]
            for j in range(d):
                sums[c, j] += sums_slab[b, c, j]
    return sums, counts, sse


@njit(cache=True, fastmath=FASTMATH, parallel=True)
def _min_sq_dist_update_impl(X, centres, current):
    n = X.shape[0]
    m = centres.shape[0]
    out = np.empty((m, n), dtype=np.float64)
    # Per-row results only: deterministic under any schedule.  m is small
    # (2 + log k candidates) and k-means++ needs the exact 0 of a row against
    # itself, so this stays a plain difference-form scan.
    for i in prange(n):
        cur = current[i]
        for t in range(m):
            dist = _sq_dist(X, i, centres, t)
            # np.minimum semantics: a NaN on either side propagates.
            if dist < cur or dist != dist:
                out[t, i] = dist
            else:
                out[t, i] = cur
    return out


@njit(cache=True, fastmath=FASTMATH, nogil=True)
def _minibatch_epoch_impl(X, w, order, batch, gamma, beta, lam):
    # Batches depend on each other (each is assigned against the centroids the
    # previous one moved), so this kernel is serial; it is one pass over X.
    # Row i stands for w[i] rows (a site's group): it counts w[i] times.
    n = order.shape[0]
    k, d = gamma.shape
    sums = np.zeros((k, d), dtype=np.float64)
    counts = np.zeros(k, dtype=np.int64)
    P = _pad_centroids(gamma)
    rows = np.empty(TILE_ROWS, dtype=np.int64)
    D = np.empty((TILE_ROWS, P.shape[0]), dtype=np.float64)
    for start in range(0, n, batch):
        stop = min(n, start + batch)
        sums[:] = 0.0
        counts[:] = 0
        P[:k] = gamma
        for c in range(k, P.shape[0]):
            P[c] = gamma[k - 1]
        for t0 in range(start, stop, TILE_ROWS):
            for r in range(TILE_ROWS):
                rows[r] = order[min(t0 + r, stop - 1)]
            _tile_distances(X, rows, P, D)
            for r in range(min(TILE_ROWS, stop - t0)):
                i = rows[r]
                label, _ = _nearest_in(D, r, k)
                counts[label] += w[i]
                weight = np.float64(w[i])
                for j in range(d):
                    sums[label, j] += weight * np.float64(X[i, j])
        for c in range(k):
            if counts[c] > 0:
                lam[c] += counts[c]
                # Gamma += beta * (Lambda_b / Lambda) * (batch mean - Gamma)
                step = beta * counts[c] / lam[c]
                for j in range(d):
                    gamma[c, j] += step * (sums[c, j] / counts[c] - gamma[c, j])


@njit(cache=True, fastmath=FASTMATH, parallel=True)
def _evaluation_stats_impl(X, w, s, C, block):
    """The evaluation's statistics, weighted as :func:`_lloyd_stats_impl`: per cluster
    from each group's mean and rows (its silhouette distances those of its mean, its
    squared norms w ||x||^2); a group's spread ``s`` enters the total SSE only, a sum
    over all the groups whatever the centroids (no per-cluster figure carries it)."""
    n, d = X.shape
    k = C.shape[0]
    P = _pad_centroids(C)
    n_blocks = (n + block - 1) // block
    sums_slab = np.zeros((n_blocks, k, d), dtype=np.float64)
    counts_slab = np.zeros((n_blocks, k), dtype=np.int64)
    sqnorm_slab = np.zeros((n_blocks, k), dtype=np.float64)
    sse_slab = np.zeros(n_blocks, dtype=np.float64)
    sil_slab = np.zeros(n_blocks, dtype=np.float64)
    for b in prange(n_blocks):
        stop = min(n, (b + 1) * block)
        rows = np.empty(TILE_ROWS, dtype=np.int64)
        D = np.empty((TILE_ROWS, P.shape[0]), dtype=np.float64)
        sse = 0.0
        sil = 0.0
        for start in range(b * block, stop, TILE_ROWS):
            _contiguous_rows(rows, start, stop)
            _tile_distances(X, rows, P, D)
            for r in range(min(TILE_ROWS, stop - start)):
                i = start + r
                # nearest and second nearest centroid (simplified silhouette)
                best = np.inf
                second = np.inf
                label = 0
                for c in range(k):
                    dist = D[r, c]
                    if dist < best:
                        second = best
                        best = dist
                        label = c
                    elif dist < second:
                        second = dist
                weight = np.float64(w[i])
                counts_slab[b, label] += w[i]
                sse += s[i] + weight * best
                a = np.sqrt(best)
                if k > 1:
                    bb = np.sqrt(second)
                    top = max(a, bb)
                    if top > 0.0:
                        sil += weight * ((bb - a) / top)
                norm = 0.0
                for j in range(d):
                    x = np.float64(X[i, j])
                    sums_slab[b, label, j] += weight * x
                    norm += x * x
                sqnorm_slab[b, label] += weight * norm
        sse_slab[b] = sse
        sil_slab[b] = sil
    sums = np.zeros((k, d), dtype=np.float64)
    counts = np.zeros(k, dtype=np.int64)
    sqnorms = np.zeros(k, dtype=np.float64)
    sse = 0.0
    sil = 0.0
    for b in range(n_blocks):
        sse += sse_slab[b]
        sil += sil_slab[b]
        for c in range(k):
            counts[c] += counts_slab[b, c]
            sqnorms[c] += sqnorm_slab[b, c]
            for j in range(d):
                sums[c, j] += sums_slab[b, c, j]
    return sums, counts, sqnorms, sse, sil


@njit(cache=True, fastmath=FASTMATH, parallel=True)
def _distance_to_means_impl(X, w, C, means, block):
    """Per cluster, the summed distances to ``means``: a group's w rows count at the
    distance of their mean (a group's spread is in no per-cluster figure)."""
    n = X.shape[0]
    k = C.shape[0]
    P = _pad_centroids(C)
    n_blocks = (n + block - 1) // block
    slab = np.zeros((n_blocks, k), dtype=np.float64)
    counts_slab = np.zeros((n_blocks, k), dtype=np.int64)
    for b in prange(n_blocks):
        stop = min(n, (b + 1) * block)
        rows = np.empty(TILE_ROWS, dtype=np.int64)
        D = np.empty((TILE_ROWS, P.shape[0]), dtype=np.float64)
        for start in range(b * block, stop, TILE_ROWS):
            _contiguous_rows(rows, start, stop)
            _tile_distances(X, rows, P, D)
            for r in range(min(TILE_ROWS, stop - start)):
                i = start + r
                label, _ = _nearest_in(D, r, k)
                slab[b, label] += np.float64(w[i]) * np.sqrt(_sq_dist(X, i, means, label))
                counts_slab[b, label] += w[i]
    out = np.zeros(k, dtype=np.float64)
    counts = np.zeros(k, dtype=np.int64)
    for b in range(n_blocks):
        for c in range(k):
            out[c] += slab[b, c]
            counts[c] += counts_slab[b, c]
    return out, counts


@njit(cache=True, fastmath=FASTMATH, nogil=True)
def _memberships(D, r, k, m, u):
    """Bezdek memberships of tile row r into u (k,): u_j = 1 / sum_l (d_j / d_l)^(1/(m-1))
    with d the squared distances, computed as d_j^(-1/(m-1)) normalised; a row on a
    centre belongs to it alone (the first such centre). For m = 2 (the default) the
    powers are a reciprocal, which is several times cheaper than pow()."""
    hit = -1
    for c in range(k):
        if D[r, c] == 0.0:
            hit = c
            break
    if hit >= 0:
        for c in range(k):
            u[c] = 0.0
        u[hit] = 1.0
        return
    total = 0.0
    if m == 2.0:
        for c in range(k):
            u[c] = 1.0 / D[r, c]
            total += u[c]
    else:
        exponent = -1.0 / (m - 1.0)
        for c in range(k):
            u[c] = D[r, c] ** exponent
            total += u[c]
    for c in range(k):
        u[c] /= total


@njit(cache=True, fastmath=FASTMATH, parallel=True)
def _fcm_stats_impl(X, w, C, m, off, block):
    """Fuzzy c-means statistics; row i stands for w[i] rows (a site's group), all with
    the memberships of the row (the group's mean), ``off[i]`` added to its every squared
    distance (0 for rows: see the wrapper)."""
    n, d = X.shape
    k = C.shape[0]
    P = _pad_centroids(C)
    n_blocks = (n + block - 1) // block
    sums_slab = np.zeros((n_blocks, k, d), dtype=np.float64)
    weights_slab = np.zeros((n_blocks, k), dtype=np.float64)
    hard_slab = np.zeros((n_blocks, k), dtype=np.int64)
    for b in prange(n_blocks):
        stop = min(n, (b + 1) * block)
        rows = np.empty(TILE_ROWS, dtype=np.int64)
        D = np.empty((TILE_ROWS, P.shape[0]), dtype=np.float64)
        # u^m of the tile's rows (0 for the padding rows past `stop`)
        W = np.zeros((TILE_ROWS, k), dtype=np.float64)
        for start in range(b * block, stop, TILE_ROWS):
            _contiguous_rows(rows, start, stop)
            _tile_distances(X, rows, P, D)
            valid = min(TILE_ROWS, stop - start)
            for r in range(valid):
                shift = off[start + r]
                if shift != 0.0:
                    for c in range(k):
                        D[r, c] += shift
                _memberships(D, r, k, m, W[r])
                best = 0
                u_best = W[r, 0]
                weight = np.float64(w[start + r])
                for c in range(k):
                    u = W[r, c]
                    if u > u_best:
                        best = c
                        u_best = u
                    um = weight * (u * u if m == 2.0 else u ** m)
                    W[r, c] = um
                    weights_slab[b, c] += um
                hard_slab[b, best] += w[start + r]
            for r in range(valid, TILE_ROWS):
                W[r, :] = 0.0
            # sum_r w_rc x_r for the 8 rows at once: one pass over each cluster's
            # row of the slab per tile instead of one per row.
            i0 = rows[0]; i1 = rows[1]; i2 = rows[2]; i3 = rows[3]  # noqa: E702
            i4 = rows[4]; i5 = rows[5]; i6 = rows[6]; i7 = rows[7]  # noqa: E702
            for c in range(k):
                w0 = W[0, c]; w1 = W[1, c]; w2 = W[2, c]; w3 = W[3, c]  # noqa: E702
                w4 = W[4, c]; w5 = W[5, c]; w6 = W[6, c]; w7 = W[7, c]  # noqa: E702
                for j in range(d):
                    sums_slab[b, c, j] += (
                        w0 * np.float64(X[i0, j]) + w1 * np.float64(X[i1, j])
                        + w2 * np.float64(X[i2, j]) + w3 * np.float64(X[i3, j])
                        + w4 * np.float64(X[i4, j]) + w5 * np.float64(X[i5, j])
                        + w6 * np.float64(X[i6, j]) + w7 * np.float64(X[i7, j])
                    )
    sums = np.zeros((k, d), dtype=np.float64)
    weights = np.zeros(k, dtype=np.float64)
    hard = np.zeros(k, dtype=np.int64)
    for b in range(n_blocks):
        for c in range(k):
            weights[c] += weights_slab[b, c]
            hard[c] += hard_slab[b, c]
            for j in range(d):
                sums[c, j] += sums_slab[b, c, j]
    return sums, weights, hard


@njit(cache=True, fastmath=FASTMATH, parallel=True)
def _fcm_memberships_impl(X, C, m, off, block):
    n = X.shape[0]
    k = C.shape[0]
    P = _pad_centroids(C)
    n_blocks = (n + block - 1) // block
    out = np.empty((n, k), dtype=np.float64)
    for b in prange(n_blocks):  # one row each: no reduction
        stop = min(n, (b + 1) * block)
        rows = np.empty(TILE_ROWS, dtype=np.int64)
        D = np.empty((TILE_ROWS, P.shape[0]), dtype=np.float64)
        for start in range(b * block, stop, TILE_ROWS):
            _contiguous_rows(rows, start, stop)
            _tile_distances(X, rows, P, D)
            for r in range(min(TILE_ROWS, stop - start)):
                if off != 0.0:
                    for c in range(k):
                        D[r, c] += off
                _memberships(D, r, k, m, out[start + r])
    return out


@njit(cache=True, fastmath=FASTMATH, nogil=True)
def _gtv_m_step_impl(W, N, sums, counts, alpha, floor):
    """GTVMin steps E2, E3 and M (Jung; docs/explanation/algorithms.md section 6) for one site, given E1's
    per-cluster ``sums`` and ``counts`` against ``W``. ``N`` is (deg, k, d): the
    neighbours' centroids. Small (deg * k * k distances): serial."""
    deg, k_n, d = N.shape
    k = W.shape[0]
    nb_sums = np.zeros((k, d), dtype=np.float64)
    nb_counts = np.zeros(k, dtype=np.float64)
    gtv = 0.0
    for j in range(deg):
        # E2: each neighbour centroid w(j, c') pulls the local centroid nearest to it.
        for cp in range(k_n):
            a = 0
            best = _sq_dist(N[j], cp, W, 0)
            for c in range(1, k):
                dist = _sq_dist(N[j], cp, W, c)
                if dist < best:
                    best = dist
                    a = c
            gtv += best
            nb_counts[a] += 1.0
            for f in range(d):
                nb_sums[a, f] += N[j, cp, f]
        # E3: each local centroid is pulled by the neighbour's centroid nearest to it.
        for c in range(k):
            b = 0
            best = _sq_dist(W, c, N[j], 0)
            for cp in range(1, k_n):
                dist = _sq_dist(W, c, N[j], cp)
                if dist < best:
                    best = dist
                    b = cp
            gtv += best
            nb_counts[c] += 1.0
            for f in range(d):
                nb_sums[c, f] += N[j, b, f]
    # M: the local points of a cluster under the privacy floor are left out, so no
    # returned centroid is the mean of fewer than `floor` rows.
    W_new = W.copy()
    for c in range(k):
        local_count = counts[c] if counts[c] >= floor else 0
        den = local_count + alpha * nb_counts[c]
        if den > 0.0:
            for f in range(d):
                local_sum = sums[c, f] if counts[c] >= floor else 0.0
                W_new[c, f] = (local_sum + alpha * nb_sums[c, f]) / den
    return W_new, gtv


# --------------------------------------------------------------------------
# Site groups (microaggregation, :mod:`fedcluster.client_app.data.grouping`): a site's rows
# cut into groups of at least g rows, once per data version.
#
# What is computed
# ----------------
# A site's rows are ordered by a permutation ``perm`` and cut into segments (ranges of
# positions), each split at its median along its principal axis until blocks are small;
# then each block is grouped on its own.
#
# 1. Coarse splits of a large site (the caller reads it in file order only):
#    :func:`_group_directions` (each segment's axis, from a sample the caller gathered),
#    :func:`_group_project_rows` (projections, rows in file order),
#    :func:`_group_select_level` (median split of each segment by quickselect).
# 2. In memory, on a copy of a chunk of coarse segments: :func:`_group_split_level` (one
#    level of median splits: axis from a sample, projections, quickselect) down to blocks,
#    then :func:`_group_blocks`: inside each block local k-means (k-means++ seeding,
#    capped Lloyd), clusters under ``g`` rows merged into the nearest cluster, clusters of
#    ``2 g`` rows or more cut along their principal axis into runs of ``g`` or ``g + 1``.
# 3. :func:`_group_finish`: block-local group ids to global ids, numbered by first
#    appearance in row order.
#
# Reproducibility contract (as in ``_compiled``)
# ----------------------------------------------
# The labels are bit-identical for any ``numba.set_num_threads(...)``: every ``prange``
# runs over units whose bounds depend on the data's shape alone (segments, fixed chunks of
# a segment, blocks), each unit writes only its own slots, and every sum is taken inside
# one unit in a fixed order.  Pseudo-random choices (k-means++ draws, quickselect pivots)
# come from :func:`_group_splitmix`, seeded from the unit's global position in ``perm``
# (so neither the thread count nor the caller's chunking changes a draw), never from
# numba's per-thread ``np.random``.  No BLAS call decides anything.  As in ``_compiled``,
# fast-math "reassoc"/"contract" make the last bits depend on the CPU, not on the threads.
# --------------------------------------------------------------------------

# Positions per projection task of a split level: fixed, so the tasks of a segment (and
# the order of everything inside one) do not depend on the thread count.
_GROUP_CHUNK = 4096

# Blocks (or segments, tasks) handed to a thread at a time (:func:`_group_run`).  Numba's
# default splits a prange evenly between the threads up front; on a shared machine one
# descheduled thread then holds up the whole call.  Handing out a few at a time balances
# the load and changes nothing in the result (threads only decide who computes a unit).
_GROUP_DYNAMIC = 4

# splitmix64 constants (Steele, Lea and Flood 2014).
_GROUP_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_GROUP_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_GROUP_MIX2 = np.uint64(0x94D049BB133111EB)


@njit(cache=True, nogil=True)
def _group_splitmix(state):
    """One splitmix64 step: ``(new state, 64 random bits)``.  A generator of our own:
    its stream depends on the seed alone, whichever thread draws from it."""
    state = state + _GROUP_GAMMA
    z = state
    z = (z ^ (z >> np.uint64(30))) * _GROUP_MIX1
    z = (z ^ (z >> np.uint64(27))) * _GROUP_MIX2
    return state, z ^ (z >> np.uint64(31))


@njit(cache=True, nogil=True)
def _group_uniform(state):
    """``(new state, u)`` with u uniform in [0, 1): the top 53 bits of a splitmix64 draw."""
    state, z = _group_splitmix(state)
    return state, np.float64(z >> np.uint64(11)) * (1.0 / 9007199254740992.0)


@njit(cache=True, nogil=True)
def _group_seed(index, salt):
    """A generator state for unit ``index`` (a block, a segment's start): mixed once so
    that neighbouring indices start far apart in the stream."""
    _, z = _group_splitmix(np.uint64(index) * np.uint64(2) + np.uint64(salt))
    return z


@njit(cache=True, fastmath=FASTMATH, nogil=True)
def _group_sq_dist(A, i, B, j):
    """Squared Euclidean distance of row ``i`` of ``A`` and row ``j`` of ``B``, as a sum
    of squared differences (exactly 0 for equal rows, which k-means++ relies on)."""
    acc = 0.0
    for t in range(A.shape[1]):
        u = A[i, t] - B[j, t]
        acc += u * u
    return acc


@njit(cache=True, fastmath=FASTMATH, nogil=True)
def _group_principal_axis(A, idx, n_iter, v):
    """Unit vector ``v`` (d,) along the principal axis of the rows ``A[idx]``.

    Power iteration on the centred rows (no d x d covariance, no BLAS): each step costs
    2 s d flops.  It starts from the row farthest from the mean (ties: the first), which
    already points along the widest spread, so a few steps suffice for a split direction.
    Rows all equal: ``v`` is the first coordinate axis (every projection then ties, and
    the callers break ties by index).
    """
    s = idx.shape[0]
    d = A.shape[1]
    mu = np.zeros(d)
    for r in range(s):
        for t in range(d):
            mu[t] += A[idx[r], t]
    for t in range(d):
        mu[t] /= s
    far = idx[0]
    best = -1.0
    for r in range(s):
        acc = 0.0
        for t in range(d):
            u = A[idx[r], t] - mu[t]
            acc += u * u
        if acc > best:
            best = acc
            far = idx[r]
    norm = 0.0
    for t in range(d):
        v[t] = A[far, t] - mu[t]
        norm += v[t] * v[t]
    if not norm > 0.0:
        v[:] = 0.0
        v[0] = 1.0
        return
    norm = math.sqrt(norm)
    for t in range(d):
        v[t] /= norm
    w = np.empty(d)
    for _ in range(n_iter):
        w[:] = 0.0
        for r in range(s):
            p = 0.0
            for t in range(d):
                p += (A[idx[r], t] - mu[t]) * v[t]
            for t in range(d):
                w[t] += p * (A[idx[r], t] - mu[t])
        norm = 0.0
        for t in range(d):
            norm += w[t] * w[t]
        if not norm > 0.0:
            return  # v spans nothing of the spread: keep it
        norm = math.sqrt(norm)
        for t in range(d):
            v[t] = w[t] / norm


@njit(cache=True, nogil=True)
def _group_select(proj, perm, lo, hi, k, state):
    """Quickselect on positions ``lo..hi-1`` of ``(proj, perm)``, ordered by projection
    and then by row index (so ties are broken by the rows, not by their current places):
    afterwards position ``k`` holds its rank's entry, smaller keys before, larger after.
    Pivots are drawn from ``state`` (expected linear time on any input)."""
    left = lo
    right = hi - 1
    while right > left:
        state, z = _group_splitmix(state)
        piv = left + np.int64(z % np.uint64(right - left + 1))
        proj[piv], proj[right] = proj[right], proj[piv]
        perm[piv], perm[right] = perm[right], perm[piv]
        pp = proj[right]
        pq = perm[right]
        store = left
        for i in range(left, right):
            if proj[i] < pp or (proj[i] == pp and perm[i] < pq):
                proj[i], proj[store] = proj[store], proj[i]
                perm[i], perm[store] = perm[store], perm[i]
                store += 1
        proj[store], proj[right] = proj[right], proj[store]
        perm[store], perm[right] = perm[right], perm[store]
        if store == k:
            return
        if k < store:
            right = store - 1
        else:
            left = store + 1


@njit(cache=True, fastmath=FASTMATH, parallel=True)
def _group_split_level(X, perm, proj, lo, hi, sample, n_iter, offset):
    """Split each segment ``perm[lo[s]:hi[s]]`` at its median along its principal axis:
    afterwards its first ``(hi - lo) // 2`` positions hold the rows of lowest projection
    (ties: lowest row index).  ``proj`` (n,) is scratch.  The axis is estimated on at
    most ``sample`` rows of the segment taken at evenly spaced positions: a median split
    needs a good direction, not the best one, and this keeps a level at one full pass
    over the rows (the projections) instead of ``n_iter`` passes."""
    n_seg = lo.shape[0]
    d = X.shape[1]
    V = np.empty((n_seg, d))
    for s in prange(n_seg):
        m = hi[s] - lo[s]
        take = min(m, sample)
        idx = np.empty(take, dtype=np.int64)
        for t in range(take):
            idx[t] = perm[lo[s] + (t * m) // take]
        _group_principal_axis(X, idx, n_iter, V[s])
    # Projection tasks: fixed chunks of each segment (no reduction across rows, but fixed
    # bounds keep any vectorised remainder loop on the same rows whatever the threads).
    n_tasks = 0
    for s in range(n_seg):
        n_tasks += (hi[s] - lo[s] + _GROUP_CHUNK - 1) // _GROUP_CHUNK
    task_seg = np.empty(n_tasks, dtype=np.int64)
    task_start = np.empty(n_tasks, dtype=np.int64)
    t = 0
    for s in range(n_seg):
        for a in range(lo[s], hi[s], _GROUP_CHUNK):
            task_seg[t] = s
            task_start[t] = a
            t += 1
    for t in prange(n_tasks):
        s = task_seg[t]
        for i in range(task_start[t], min(task_start[t] + _GROUP_CHUNK, hi[s])):
            r = perm[i]
            acc = 0.0
            for j in range(d):
                acc += X[r, j] * V[s, j]
            proj[i] = acc
    for s in prange(n_seg):
        _group_select(proj, perm, lo[s], hi[s], lo[s] + (hi[s] - lo[s]) // 2,
                      _group_seed(offset + lo[s], 1))


@njit(cache=True, fastmath=FASTMATH, parallel=True)
def _group_directions(A, idx, starts, n_iter):
    """(n_seg, d): row s is the principal axis of the rows ``A[idx[starts[s]:starts[s+1]]]``
    (a coarse split's sample, gathered by the caller in file order)."""
    n_seg = starts.shape[0] - 1
    V = np.empty((n_seg, A.shape[1]))
    for s in prange(n_seg):
        _group_principal_axis(A, idx[starts[s]:starts[s + 1]], n_iter, V[s])
    return V


@njit(cache=True, fastmath=FASTMATH, parallel=True)
def _group_project_rows(X, r0, r1, seg_of_row, V, proj_row):
    """``proj_row[r] = X[r] . V[seg_of_row[r]]`` for the rows r0..r1-1 in FILE order (a
    coarse split reads a memory-mapped site sequentially, so the caller can drop each
    range's pages afterwards); rows with ``seg_of_row`` -1 are skipped.  Tasks are fixed
    chunks of rows from ``r0``: a row's dot product goes through the same loop whatever
    the thread count."""
    d = X.shape[1]
    n_tasks = (r1 - r0 + _GROUP_CHUNK - 1) // _GROUP_CHUNK
    for t in prange(n_tasks):
        for r in range(r0 + t * _GROUP_CHUNK, min(r1, r0 + (t + 1) * _GROUP_CHUNK)):
            s = seg_of_row[r]
            if s < 0:
                continue
            acc = 0.0
            for j in range(d):
                acc += X[r, j] * V[s, j]
            proj_row[r] = acc


@njit(cache=True, nogil=True, parallel=True)
def _group_select_level(proj_row, perm, proj, lo, hi):
    """Median split of every segment ``perm[lo[s]:hi[s]]`` by the projections of its rows
    (``proj_row``, per row): as :func:`_group_split_level`'s last step."""
    for s in prange(lo.shape[0]):
        for p in range(lo[s], hi[s]):
            proj[p] = proj_row[perm[p]]
        _group_select(proj, perm, lo[s], hi[s], lo[s] + (hi[s] - lo[s]) // 2,
                      _group_seed(lo[s], 1))


@njit(cache=True, fastmath=FASTMATH, nogil=True)
def _group_kmeanspp(Y, k, state, C):
    """k-means++ seeding of ``k`` centres from the rows of ``Y`` into ``C``; returns the
    number of centres placed (fewer than ``k`` when ``Y`` has fewer distinct rows)."""
    m = Y.shape[0]
    state, u = _group_uniform(state)
    first = min(m - 1, np.int64(u * m))
    C[0] = Y[first]
    D2 = np.empty(m)
    for r in range(m):
        D2[r] = _group_sq_dist(Y, r, C, 0)
    for c in range(1, k):
        total = 0.0
        for r in range(m):
            total += D2[r]
        if not total > 0.0:
            return c  # every row sits on a centre already
        state, u = _group_uniform(state)
        target = u * total
        pick = -1
        cum = 0.0
        for r in range(m):
            if D2[r] > 0.0:
                pick = r  # rounding can leave target above the last sum: take the last
                cum += D2[r]
                if cum > target:
                    break
        C[c] = Y[pick]
        for r in range(m):
            dist = _group_sq_dist(Y, r, C, c)
            if dist < D2[r]:
                D2[r] = dist
    return k


@njit(cache=True, fastmath=FASTMATH, nogil=True)
def _group_lloyd(Y, C, k, max_iter, assign):
    """At most ``max_iter`` Lloyd steps with the first ``k`` centres of ``C``; ``assign``
    gets the last assignment (nearest centre, ties to the lowest index).  An empty
    cluster keeps its centre.  Stops early when no row changes cluster."""
    m, d = Y.shape
    assign[:] = -1
    sums = np.empty((k, d))
    counts = np.empty(k, dtype=np.int64)
    for _ in range(max_iter):
        changed = 0
        for r in range(m):
            best = _group_sq_dist(Y, r, C, 0)
            label = 0
            for c in range(1, k):
                dist = _group_sq_dist(Y, r, C, c)
                if dist < best:
                    best = dist
                    label = c
            if label != assign[r]:
                assign[r] = label
                changed += 1
        if changed == 0:
            return
        sums[:] = 0.0
        counts[:] = 0
        for r in range(m):
            counts[assign[r]] += 1
            for j in range(d):
                sums[assign[r], j] += Y[r, j]
        for c in range(k):
            if counts[c] > 0:
                for j in range(d):
                    C[c, j] = sums[c, j] / counts[c]


@njit(cache=True, fastmath=FASTMATH, nogil=True)
def _group_one_block(Y, g, max_iter, axis_iter, state, out):
    """Group the rows of one block ``Y`` (m >= g rows) into groups of ``g..2g-1`` rows;
    ``out`` (m,) gets block-local group ids 0..G-1; returns G.

    Local k-means with about m / (1.5 g) centres follows the data's fine structure; a
    cluster under g rows is merged into the cluster of nearest mean (smallest first, so
    a merge never hides a smaller one), and one of 2g rows or more is cut along its
    principal axis into consecutive runs (by projection, ties by row) of g or g+1 rows.
    """
    m, d = Y.shape
    if m < 2 * g:
        out[:] = 0
        return 1
    k = max(1, (4 * m + 3 * g) // (6 * g))  # round(m / (1.5 g))
    C = np.empty((k, d))
    k = _group_kmeanspp(Y, k, state, C)
    assign = np.empty(m, dtype=np.int64)
    _group_lloyd(Y, C, k, max_iter, assign)
    # Cluster means and counts of the final assignment.
    S = np.zeros((k, d))
    cnt = np.zeros(k, dtype=np.int64)
    for r in range(m):
        cnt[assign[r]] += 1
        for j in range(d):
            S[assign[r], j] += Y[r, j]
    M = np.zeros((k, d))
    for c in range(k):
        if cnt[c] > 0:
            for j in range(d):
                M[c, j] = S[c, j] / cnt[c]
    # Merge clusters under g rows, smallest first (ties: lowest index).
    while True:
        small = -1
        for c in range(k):
            if 0 < cnt[c] < g and (small < 0 or cnt[c] < cnt[small]):
                small = c
        if small < 0:
            break
        near = -1
        best = np.inf
        for c in range(k):
            if c != small and cnt[c] > 0:
                dist = _group_sq_dist(M, small, M, c)
                if near < 0 or dist < best:
                    best = dist
                    near = c
        if near < 0:
            break  # one cluster left (cannot happen for m >= g)
        for r in range(m):
            if assign[r] == small:
                assign[r] = near
        cnt[near] += cnt[small]
        cnt[small] = 0
        for j in range(d):
            S[near, j] += S[small, j]
            M[near, j] = S[near, j] / cnt[near]
    # Number the groups: clusters in index order, a large one cut into runs.
    members = np.empty(m, dtype=np.int64)
    proj = np.empty(m)
    v = np.empty(d)
    gid = 0
    for c in range(k):
        s = cnt[c]
        if s == 0:
            continue
        if s < 2 * g:
            for r in range(m):
                if assign[r] == c:
                    out[r] = gid
            gid += 1
            continue
        t = 0
        for r in range(m):
            if assign[r] == c:
                members[t] = r
                t += 1
        idx = members[:s]
        _group_principal_axis(Y, idx, axis_iter, v)
        for t in range(s):
            acc = 0.0
            for j in range(d):
                acc += Y[idx[t], j] * v[j]
            proj[t] = acc
        # mergesort is stable: equal projections keep the rows' order
        order = np.argsort(proj[:s], kind="mergesort")
        runs = s // g  # runs of floor or ceil s / runs rows: g or g + 1
        for q in range(runs):
            for t in range((q * s) // runs, ((q + 1) * s) // runs):
                out[idx[order[t]]] = gid + q
        gid += runs
    return gid


@njit(cache=True, fastmath=FASTMATH, parallel=True)
def _group_blocks(X, perm, lo, hi, g, max_iter, axis_iter, offset, local, n_groups, bad):
    """Group every block ``perm[lo[b]:hi[b]]`` on its own (:func:`_group_one_block`):
    ``local`` (positions of ``perm``) gets block-local group ids, ``n_groups[b]`` the
    block's number of groups, ``bad[b]`` 1 if the block holds a non-finite value.

    The block's rows are gathered into a small contiguous buffer (the block's working
    set then stays in L2 whatever the row order of ``X``, and a memory-mapped ``X`` is
    only read); its generator is seeded from the block's index."""
    d = X.shape[1]
    for b in prange(lo.shape[0]):
        m = hi[b] - lo[b]
        Y = np.empty((m, d))
        finite = True
        for r in range(m):
            i = perm[lo[b] + r]
            for j in range(d):
                x = X[i, j]
                Y[r, j] = x
                if not math.isfinite(x):
                    finite = False
        bad[b] = 0 if finite else 1
        if not finite:
            n_groups[b] = 0
            continue
        n_groups[b] = _group_one_block(Y, g, max_iter, axis_iter, _group_seed(offset + lo[b], 2),
                                       local[lo[b]:hi[b]])


@njit(cache=True, nogil=True)
def _group_finish(perm, lo, hi, local, offsets, labels):
    """``labels[row]`` = global group id, groups numbered by their first row in row
    order (so the numbering does not show the block order).  Serial: integer work over
    n rows, a few milliseconds at a million."""
    n = perm.shape[0]
    for b in range(lo.shape[0]):
        for p in range(lo[b], hi[b]):
            labels[perm[p]] = offsets[b] + local[p]
    renumber = np.full(offsets[-1], -1, dtype=np.int64)
    nxt = 0
    for i in range(n):
        lab = labels[i]
        if renumber[lab] < 0:
            renumber[lab] = nxt
            nxt += 1
        labels[i] = renumber[lab]


def _group_run(kernel, *args):
    """``kernel(*args)`` with its prange units handed out :data:`_GROUP_DYNAMIC` at a
    time.  Plain Python: ``set_parallel_chunksize`` inside compiled code would make the
    kernel uncacheable (Numba implements it with a ctypes pointer)."""
    previous = set_parallel_chunksize(_GROUP_DYNAMIC)
    try:
        return kernel(*args)
    finally:
        set_parallel_chunksize(previous)


# --------------------------------------------------------------------------
# The spread rule's passes over a group table (client_app/data/group_spreads.py).
# Exact ports of NumPy's elementwise expressions (release/spreads.py's pair_shares and
# pair_reveals, np.maximum.at / np.minimum.at): no fastmath, every value the same
# IEEE operation in the same order, so a table is the same to the last bit.
# --------------------------------------------------------------------------


@njit(cache=True, nogil=True)
def spread_pair_rule(m2, mate_m2, cells, mate_cells, tiny, equal_within, spread_min):
    """(share, reveals), (n, d) each: ``pair_shares(m2, mate_m2, cells, mate_cells)`` and
    ``pair_reveals(...)`` of ``release/spreads.py`` in one pass (``mate_*`` 0 where a
    group has no partner)."""
    n, d = m2.shape
    share = np.empty((n, d))
    reveals = np.empty((n, d), dtype=np.bool_)
    for i in range(n):
        for j in range(d):
            a, b = m2[i, j], mate_m2[i, j]
            ca, cb = cells[i, j], mate_cells[i, j]
            dof_a = max(np.float64(ca) - 1.0, 0.0)
            dof_b = max(np.float64(cb) - 1.0, 0.0)
            dof_total = dof_a + dof_b
            total = a + b
            held = dof_total if dof_total > 0 else 1.0
            mine = total * (dof_a / held) if dof_b > 0 else a
            theirs = total * (dof_b / held) if dof_a > 0 else b
            share[i, j] = mine
            all_cells = ca + cb
            few = all_cells < spread_min
            zero = total <= tiny[j] * np.float64(all_cells)
            mine_small = ca > 0 and ca < spread_min
            theirs_small = cb > 0 and cb < spread_min
            carries = (mine_small and b <= equal_within * total) or \
                (theirs_small and a <= equal_within * total)
            own = (mine_small and a > 0 and abs(mine - a) <= equal_within * a) or \
                (theirs_small and b > 0 and abs(theirs - b) <= equal_within * b)
            reveals[i, j] = (few or zero or carries or own) and all_cells > 0
    return share, reveals


@njit(cache=True, nogil=True)
def _pairwise_sum(v, n):
    """``v[:n].sum()`` in NumPy's order for a contiguous float64 reduction (its pairwise
    summation below its block of 128: 8 running sums, added as a tree, then the rest)."""
    if n < 8:
        res = 0.0
        for i in range(n):
            res += v[i]
        return res
    r = np.empty(8)
    for j in range(8):
        r[j] = v[j]
    i = 8
    while i < n - (n % 8):
        for j in range(8):
            r[j] += v[i + j]
        i += 8
    res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]))
    while i < n:
        res += v[i]
        i += 1
    return res


@njit(cache=True, nogil=True)
def spread_pair_leaves(points, ids, starts, small, taken, partner):
    """The spread pairing inside every leaf (leaf b: ``ids[starts[b]:starts[b+1]]``;
    ``release/spreads.spread_partners``): each small group without a partner, in the
    leaf's order, takes the nearest group still free (squared distances summed as NumPy
    sums a row of at most 128 coordinates; the first of equal distances), a small one or
    a large one no small group took yet. tests/test_spread_passes.py holds it to the
    NumPy code it replaced."""
    w = points.shape[1]
    v = np.empty(w)
    for b in range(starts.shape[0] - 1):
        lo, hi = starts[b], starts[b + 1]
        m = hi - lo
        d2 = np.empty((m, m))
        for a in range(m):
            for c in range(m):
                if a == c:
                    d2[a, c] = np.inf
                    continue
                for k in range(w):
                    t = points[ids[lo + a], k] - points[ids[lo + c], k]
                    v[k] = t * t
                d2[a, c] = _pairwise_sum(v, w)
        askers = np.empty(m, dtype=np.int64)
        n_askers = 0
        for a in range(m):
            if small[ids[lo + a]] and partner[ids[lo + a]] < 0:
                askers[n_askers] = a
                n_askers += 1
        for q in range(n_askers):
            a = askers[q]
            if partner[ids[lo + a]] >= 0:
                continue
            best, best_d = -1, np.inf
            for c in range(m):
                g = ids[lo + c]
                if c == a or partner[g] >= 0 or taken[g]:
                    continue
                if best < 0 or d2[a, c] < best_d:
                    best, best_d = c, d2[a, c]
            if best < 0:
                break
            ga, gb = ids[lo + a], ids[lo + best]
            partner[ga], partner[gb] = gb, ga
            taken[ga] = True
            taken[gb] = True


@njit(cache=True, nogil=True)
def _select_by_value_then_id(points, axis, part, k):
    """Reorder ``part`` (distinct ids, finite values) so that its first ``k`` are its ``k``
    first by (value on ``axis``, id): a selection (Hoare's partition, median-of-three
    pivots) over the values gathered once, in place. False, the order left as it may be,
    where it takes more rounds than a few times log2 of the size (then a sort decides)."""
    values = np.empty(part.shape[0])
    for i in range(part.shape[0]):
        values[i] = points[part[i], axis]
    lo, hi = 0, part.shape[0] - 1
    rounds = 0
    limit = 4 * (int(np.log2(part.shape[0])) + 1)
    while hi > lo:
        rounds += 1
        if rounds > limit:
            return False
        mid = (lo + hi) // 2
        # the median of three (value, id) pairs
        a, b, c = lo, mid, hi
        if values[b] < values[a] or (values[b] == values[a] and part[b] < part[a]):
            a, b = b, a
        if values[c] < values[b] or (values[c] == values[b] and part[c] < part[b]):
            b = c if (values[a] < values[c] or (values[a] == values[c] and part[a] < part[c])) else a
        pv, pid = values[b], part[b]
        i, j = lo, hi
        while i <= j:
            while values[i] < pv or (values[i] == pv and part[i] < pid):
                i += 1
            while pv < values[j] or (pv == values[j] and pid < part[j]):
                j -= 1
            if i <= j:
                values[i], values[j] = values[j], values[i]
                part[i], part[j] = part[j], part[i]
                i += 1
                j -= 1
        if k <= j:
            hi = j
        elif k >= i:
            lo = i
        else:
            break
    return True


@njit(cache=True, nogil=True)
def spread_leaves(points, ids, size):
    """``release/spreads._leaves`` (compiled): ``ids`` cut by median splits (each part along its
    widest coordinate, ties by id) into leaves of at most ``size``, depth first, the first
    half first. Returns (the ids leaf after leaf, each leaf's start; one more at the end)."""
    n = ids.shape[0]
    out = np.empty(n, dtype=np.int64)
    starts = np.empty(n + 1, dtype=np.int64)
    n_leaves, written = 0, 0
    stack = [ids.copy()]
    while len(stack) > 0:
        part = stack.pop()
        if part.shape[0] <= size:
            starts[n_leaves] = written
            n_leaves += 1
            out[written:written + part.shape[0]] = part
            written += part.shape[0]
            continue
        w = points.shape[1]
        top, bottom = points[part[0]].copy(), points[part[0]].copy()
        finite = True
        for i in range(1, part.shape[0]):  # (row by row: each point read once)
            for k in range(w):
                x = points[part[i], k]
                if x > top[k]:
                    top[k] = x
                if x < bottom[k]:
                    bottom[k] = x
                if x != x:
                    finite = False
        axis, widest = 0, -np.inf
        for k in range(w):
            if top[k] - bottom[k] > widest:
                axis, widest = k, top[k] - bottom[k]
        half = part.shape[0] // 2
        # a half that is a leaf keeps the order of (value, id); a larger one is cut again
        # whatever its order, so its SET alone matters: found by selection, not a sort
        if half > size and finite and _select_by_value_then_id(points, axis, part, half):
            stack.append(part[half:].copy())
            stack.append(part[:half].copy())
            continue
        by_id = part[np.argsort(part)]
        values = np.empty(by_id.shape[0])
        for i in range(by_id.shape[0]):
            values[i] = points[by_id[i], axis]
        ordered = by_id[np.argsort(values, kind="mergesort")]
        stack.append(ordered[half:].copy())
        stack.append(ordered[:half].copy())
    starts[n_leaves] = written
    return out, starts[:n_leaves + 1]


@njit(cache=True, nogil=True)
def spread_units_rule(m2, cells, starts, sizes, tiny, equal_within, spread_min):
    """(total (U, d), dof (U, d), reveals (U, d)) of many units (unit u: rows ``starts[u]:
    starts[u] + sizes[u]`` of ``m2`` and ``cells``): each unit's m2 summed, its degrees of
    freedom, and ``release/spreads.unit_reveals``; a member's share is the unit's total
    times its degrees of freedom over the unit's (``spreads.member_shares``), so a table
    keeps (d,) a unit, not (d,) a member. A unit's sums add its rows one after another, as
    NumPy sums a block along its first axis (the first row, then each next one)."""
    d = m2.shape[1]
    totals = np.empty((starts.shape[0], d))
    dofs = np.empty((starts.shape[0], d))
    reveals = np.empty((starts.shape[0], d), dtype=np.bool_)
    for u in range(starts.shape[0]):
        lo, hi = starts[u], starts[u] + sizes[u]
        for j in range(d):
            total = m2[lo, j]
            all_cells = cells[lo, j]
            dof_total = max(np.float64(cells[lo, j]) - 1.0, 0.0)
            for r in range(lo + 1, hi):
                total += m2[r, j]
                all_cells += cells[r, j]
                dof_total += max(np.float64(cells[r, j]) - 1.0, 0.0)
            totals[u, j], dofs[u, j] = total, dof_total
            held = dof_total if dof_total > 0 else 1.0
            flagged = False
            for r in range(lo, hi):
                dof = max(np.float64(cells[r, j]) - 1.0, 0.0)
                mine = total * (dof / held) if dof_total > 0 else 0.0
                small = cells[r, j] > 0 and cells[r, j] < spread_min
                if small and (total - m2[r, j]) <= equal_within * total:
                    flagged = True
                if small and m2[r, j] > 0 and abs(mine - m2[r, j]) <= equal_within * m2[r, j]:
                    flagged = True
            few = all_cells < spread_min
            zero = total <= tiny[j] * np.float64(all_cells)
            reveals[u, j] = (few or zero or flagged) and all_cells > 0
    return totals, dofs, reveals


@njit(cache=True, nogil=True)
def add_in_row_order(places, groups, values, into, offset):
    """Each row's values into its group's slot (``into[group - offset]``), rows in order:
    a row at place 0 of its group sets the slot, a later one adds to it (place -1: no
    group). Per group the additions are those of its rows in row order, the order
    ``group_stats._in_steps`` made them in one numpy step per place (a step per row of
    the largest group: a report's part of 100,000 rows made 100,000 passes)."""
    for r in range(groups.shape[0]):
        if places[r] < 0:
            continue
        g = groups[r] - offset
        if places[r] == 0:
            for j in range(values.shape[1]):
                into[g, j] = values[r, j]
        else:
            for j in range(values.shape[1]):
                into[g, j] += values[r, j]


@njit(cache=True, nogil=True)
def group_extremes_at(high, low, groups, deviation):
    """``np.maximum.at(high, groups, deviation)`` and ``np.minimum.at(low, ...)``, rows in
    order (the deviations are finite: a missing cell's is 0)."""
    for r in range(groups.shape[0]):
        g = groups[r]
        for j in range(deviation.shape[1]):
            v = deviation[r, j]
            if v > high[g, j]:
                high[g, j] = v
            if v < low[g, j]:
                low[g, j] = v


# --------------------------------------------------------------------------
# Exact linear algebra modulo a prime: the audit's null spaces
# (client_app/release/audit/draws.py).  Residues are below 2^31, so a product of
# two stays under 2^62 in int64; ``%`` is Python's (never negative) in Numba too.
# --------------------------------------------------------------------------

@njit(cache=True, nogil=True)
def _inverse_mod(a, prime):
    """a^(prime - 2) mod prime: a's inverse in GF(prime) (a != 0)."""
    result, base, e = 1, a % prime, prime - 2
    while e > 0:
        if e & 1:
            result = (result * base) % prime
        base = (base * base) % prime
        e >>= 1
    return result


@njit(cache=True, nogil=True)
def _rref_mod_in_place(A, prime, is_pivot, pivots):
    """Bring A ((m, n) residues) to its reduced row echelon form over GF(``prime``) in
    place (Gauss-Jordan, as ``audit.support.reduced_rows``); marks ``is_pivot`` and fills
    ``pivots`` with the pivot columns; their count. A pivot row is zero left of its pivot
    (each earlier column a pivot eliminated there, or zero in every row left), so a row
    operation runs over the pivot row's nonzero entries alone (a hubs' system, 16% dense,
    4 x faster), each entry one residue of a sum below 2^63 (prime < 2^31)."""
    m, n = A.shape
    n_pivots = 0
    row = 0
    nonzero = np.empty(n, np.int64)
    for col in range(n):
        if row == m:
            break
        at = -1
        for i in range(row, m):
            if A[i, col] != 0:
                at = i
                break
        if at < 0:
            continue
        if at != row:
            for j in range(col, n):
                A[row, j], A[at, j] = A[at, j], A[row, j]
        inverse = _inverse_mod(A[row, col], prime)
        count = 0
        for j in range(col, n):
            if A[row, j] != 0:
                A[row, j] = (A[row, j] * inverse) % prime
                nonzero[count] = j
                count += 1
        for i in range(m):
            factor = A[i, col]
            if i != row and factor != 0:
                negative = prime - factor
                for t in range(count):
                    j = nonzero[t]
                    A[i, j] = (A[i, j] + negative * A[row, j]) % prime
        is_pivot[col] = True
        pivots[n_pivots] = col
        n_pivots += 1
        row += 1
    return n_pivots


@njit(cache=True, nogil=True)
def reduced_rows_mod(matrix, prime):
    """``audit.support.reduced_rows`` compiled: the reduced row echelon form of
    ``matrix`` over GF(``prime``), its nonzero rows and their pivot columns."""
    A = matrix % prime
    is_pivot = np.zeros(A.shape[1], np.bool_)
    pivots = np.empty(min(A.shape[0], A.shape[1]), np.int64)
    n_pivots = _rref_mod_in_place(A, prime, is_pivot, pivots)
    return A[:n_pivots].copy(), pivots[:n_pivots].copy()



@njit(cache=True, nogil=True)
def _heap_push(heap, size, v):
    """Push ``v`` on the min-heap ``heap[:size]``; the new size."""
    i = size
    while i > 0:
        parent = (i - 1) >> 1
        if heap[parent] <= v:
            break
        heap[i] = heap[parent]
        i = parent
    heap[i] = v
    return size + 1


@njit(cache=True, nogil=True)
def _heap_pop(heap, size):
    """The least of the min-heap ``heap[:size]``, removed; and the new size."""
    top = heap[0]
    size -= 1
    last = heap[size]
    i = 0
    while True:
        child = 2 * i + 1
        if child >= size:
            break
        if child + 1 < size and heap[child + 1] < heap[child]:
            child += 1
        if heap[child] >= last:
            break
        heap[i] = heap[child]
        i = child
    if size > 0:
        heap[i] = last
    return top, size


@njit(cache=True, nogil=True)
def _add_scaled(acc, queued, heap, size, idx, coef, lo, hi, scale, prime):
    """acc += ``scale`` times the sparse row ``idx[lo:hi]`` / ``coef[lo:hi]`` (residues),
    each unknown it touches queued once on the min-heap; the heap's new size."""
    for t in range(lo, hi):
        j = idx[t]
        acc[j] = (acc[j] + (scale * coef[t]) % prime) % prime
        if not queued[j]:
            queued[j] = True
            size = _heap_push(heap, size, j)
    return size


@njit(cache=True, nogil=True)
def _grown(array, used, need):
    """``array`` (its first ``used`` entries kept), at least ``need`` long (doubling)."""
    if need <= array.size:
        return array
    cap = array.size
    while cap < need:
        cap *= 2
    grown = np.empty(cap, array.dtype)
    grown[:used] = array[:used]
    return grown


@njit(cache=True, nogil=True)
def sparse_echelon_mod(row_ptr, row_idx, row_coef, n, prime, max_entries):
    """A row echelon form over GF(``prime``) of the sparse rows (row r over unknowns
    ``row_idx[row_ptr[r]:row_ptr[r + 1]]`` (0..n-1, the elimination order) with
    residues ``row_coef``), kept sparse: each row in turn is reduced by the pivot rows
    of its least unknowns, least first, until its least unknown has none; it becomes
    that unknown's pivot row (scaled to a leading 1, which is not stored: its TAIL, the
    unknowns after it), or vanishes. The fill is what the order makes it (a chain's
    order keeps it to the chain's width: ``audit/draws.py``). Returns each unknown's
    pivot row (start in the pool, or -1; its length), the pool (unknowns, residues) and
    whether it stayed within ``max_entries`` (False: stopped there)."""
    pivot_start = np.full(n, -1, np.int64)
    pivot_len = np.zeros(n, np.int64)
    pool_idx = np.empty(max(16, 2 * row_idx.size), np.int64)
    pool_coef = np.empty(pool_idx.size, np.int64)
    used = 0
    acc = np.zeros(n, np.int64)
    queued = np.zeros(n, np.bool_)
    heap = np.empty(n, np.int64)
    for r in range(row_ptr.size - 1):
        size = _add_scaled(acc, queued, heap, 0, row_idx, row_coef, row_ptr[r], row_ptr[r + 1],
                           1, prime)
        while size > 0:
            v, size = _heap_pop(heap, size)
            queued[v] = False
            a = acc[v]
            acc[v] = 0
            if a == 0:
                continue
            start = pivot_start[v]
            if start >= 0:  # eliminate v: subtract a times its pivot row
                size = _add_scaled(acc, queued, heap, size, pool_idx, pool_coef, start,
                                   start + pivot_len[v], prime - a, prime)
                continue
            inverse = _inverse_mod(a, prime)  # v leads: the rest is its tail
            pool_idx = _grown(pool_idx, used, used + size)
            pool_coef = _grown(pool_coef, used, used + size)
            begin = used
            while size > 0:
                j, size = _heap_pop(heap, size)
                queued[j] = False
                c = acc[j]
                acc[j] = 0
                if c != 0:
                    pool_idx[used] = j
                    pool_coef[used] = (c * inverse) % prime
                    used += 1
            pivot_start[v] = begin
            pivot_len[v] = used - begin
            if used > max_entries:
                return pivot_start, pivot_len, pool_idx[:used], pool_coef[:used], False
    return pivot_start, pivot_len, pool_idx[:used], pool_coef[:used], True


@njit(cache=True, nogil=True)
def echelon_reduce_mod(pivot_start, pivot_len, pool_idx, pool_coef, row_ptr, row_idx, row_coef,
                       prime, max_entries):
    """Each row (row r over ``row_idx[row_ptr[r]:row_ptr[r + 1]]`` with residues
    ``row_coef``) reduced by every pivot row of :func:`sparse_echelon_mod`'s form that it
    reaches: what remains lies on unknowns without a pivot row (the free ones). Returns
    the remains as rows (pointers, unknowns in order, residues) and whether they stayed
    within ``max_entries`` (False: stopped there)."""
    n = pivot_start.size
    acc = np.zeros(n, np.int64)
    queued = np.zeros(n, np.bool_)
    heap = np.empty(n, np.int64)
    out_ptr = np.zeros(row_ptr.size, np.int64)
    out_idx = np.empty(max(16, row_idx.size), np.int64)
    out_coef = np.empty(out_idx.size, np.int64)
    count = 0
    for r in range(row_ptr.size - 1):
        size = _add_scaled(acc, queued, heap, 0, row_idx, row_coef, row_ptr[r], row_ptr[r + 1],
                           1, prime)
        while size > 0:
            v, size = _heap_pop(heap, size)
            queued[v] = False
            a = acc[v]
            acc[v] = 0
            if a == 0:
                continue
            start = pivot_start[v]
            if start < 0:  # a free unknown: it stays
                out_idx = _grown(out_idx, count, count + 1)
                out_coef = _grown(out_coef, count, count + 1)
                out_idx[count] = v
                out_coef[count] = a
                count += 1
                continue
            size = _add_scaled(acc, queued, heap, size, pool_idx, pool_coef, start,
                               start + pivot_len[v], prime - a, prime)
        out_ptr[r + 1] = count
        if count > max_entries:
            return out_ptr, out_idx[:count], out_coef[:count], False
    return out_ptr, out_idx[:count], out_coef[:count], True


@njit(cache=True, nogil=True)
def echelon_back_substitute_mod(pivot_start, pivot_len, pool_idx, pool_coef, free_values,
                                prime):
    """The z with every pivot row of :func:`sparse_echelon_mod`'s form summing to 0 and
    ``free_values`` at the unknowns without one: the last unknown first, each pivot
    unknown minus its tail's sum (its tail's unknowns come after it, so are known)."""
    n = pivot_start.size
    z = np.empty(n, np.int64)
    for v in range(n - 1, -1, -1):
        start = pivot_start[v]
        if start < 0:
            z[v] = free_values[v] % prime
            continue
        total = 0
        for t in range(start, start + pivot_len[v]):
            total = (total + (pool_coef[t] * z[pool_idx[t]]) % prime) % prime
        z[v] = (prime - total) % prime
    return z

@njit(cache=True, nogil=True, inline="always")
def _mix64(x):
    """splitmix64's finaliser (``release/record/instances.mix``, one value)."""
    x = (x ^ (x >> np.uint64(30))) * _GROUP_MIX1
    x = (x ^ (x >> np.uint64(27))) * _GROUP_MIX2
    return x ^ (x >> np.uint64(31))


@njit(cache=True, nogil=True, parallel=True)
def content_hashes(bits, out):
    """Each row's two 64-bit content hashes into ``out`` ((n, 2) uint64) from its cells'
    bits (``bits``: (n, d) uint64, a float64 chunk viewed as integers), feature after
    feature as ``data/versions/row_keys.content_keys`` makes them with NumPy (the same
    bits: integer steps that wrap alike; a row's hashes are its own, whatever the threads)."""
    n, d = bits.shape
    for i in prange(n):
        a = _GROUP_GAMMA
        b = np.uint64(0xD1B54A32D192ED03)
        for j in range(d):
            v = bits[i, j]
            a = _mix64(a ^ v)
            b = _mix64(b + _mix64(v ^ np.uint64(j + 1)))
        out[i, 0] = a
        out[i, 1] = b


# --------------------------------------------------------------------------
# Serial twins: the same kernels compiled without ``parallel``, for one block.
# --------------------------------------------------------------------------
#
# A parallel kernel starts Numba's thread pool at every call, and the call
# returns only when every worker has checked in.  With a single block (at
# most MIN_BLOCK_ROWS rows: most federated sites, every k-FED local k-means)
# there is nothing to share, and on a busy machine a worker that is not
# scheduled makes the call wait for a scheduler time slice: measured on 2
# busy cores, lloyd_stats on 101 x 2 rows took ~5 ms per call instead of
# 0.03 ms, which made a 100-site in-process round take seconds.  Below
# SERIAL_MAX_ROWS rows the wrappers therefore call the serial twin, compiled
# from the same Python function (prange runs as range): the same blocks in
# the same order, so the thread-invariance contract is unchanged (the choice
# depends on n alone).  SERIAL_MAX_ROWS and the choice are the wrappers' (the
# package's __init__); the twins are compiled code, so they live here.


def _serial_twin(kernel):
    """``kernel`` (a ``parallel=True`` dispatcher) compiled without ``parallel``, under
    its own name (``<name>_serial``) so the two never share an on-disk cache entry."""
    f = kernel.py_func
    twin = types.FunctionType(f.__code__, f.__globals__, f.__name__ + "_serial",
                              f.__defaults__, f.__closure__)
    twin.__qualname__ = f.__qualname__ + "_serial"
    twin.__module__ = f.__module__
    return njit(cache=True, fastmath=FASTMATH, nogil=True)(twin)


_SERIAL = {
    kernel: _serial_twin(kernel)
    for kernel in (_assign_impl, _lloyd_stats_impl, _min_sq_dist_update_impl,
                   _evaluation_stats_impl, _distance_to_means_impl, _fcm_stats_impl,
                   _fcm_memberships_impl, _group_directions, _group_project_rows,
                   _group_select_level, _group_split_level, _group_blocks)
}

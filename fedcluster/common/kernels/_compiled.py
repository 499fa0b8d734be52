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
import os
import types

import numpy as np

from numba import njit, prange
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
def _lloyd_stats_impl(X, C, block):
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
                label, dist = _nearest_in(D, r, k)
                counts_slab[b, label] += 1
                sse += dist
                for j in range(d):
                    sums_slab[b, label, j] += np.float64(X[start + r, j])
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
def _minibatch_epoch_impl(X, order, batch, gamma, beta, lam):
    # Batches depend on each other (each is assigned against the centroids the
    # previous one moved), so this kernel is serial; it is one pass over X.
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
                counts[label] += 1
                for j in range(d):
                    sums[label, j] += np.float64(X[i, j])
        for c in range(k):
            if counts[c] > 0:
                lam[c] += counts[c]
                # Gamma += beta * (Lambda_b / Lambda) * (batch mean - Gamma)
                step = beta * counts[c] / lam[c]
                for j in range(d):
                    gamma[c, j] += step * (sums[c, j] / counts[c] - gamma[c, j])


@njit(cache=True, fastmath=FASTMATH, parallel=True)
def _evaluation_stats_impl(X, C, block):
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
                counts_slab[b, label] += 1
                sse += best
                a = np.sqrt(best)
                if k > 1:
                    bb = np.sqrt(second)
                    top = max(a, bb)
                    if top > 0.0:
                        sil += (bb - a) / top
                norm = 0.0
                for j in range(d):
                    x = np.float64(X[i, j])
                    sums_slab[b, label, j] += x
                    norm += x * x
                sqnorm_slab[b, label] += norm
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
def _distance_to_means_impl(X, C, means, block):
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
                label, _ = _nearest_in(D, r, k)
                slab[b, label] += np.sqrt(_sq_dist(X, start + r, means, label))
                counts_slab[b, label] += 1
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
def _fcm_stats_impl(X, C, m, block):
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
                _memberships(D, r, k, m, W[r])
                best = 0
                u_best = W[r, 0]
                for c in range(k):
                    u = W[r, c]
                    if u > u_best:
                        best = c
                        u_best = u
                    w = u * u if m == 2.0 else u ** m
                    W[r, c] = w
                    weights_slab[b, c] += w
                hard_slab[b, best] += 1
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
def _fcm_memberships_impl(X, C, m, block):
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
                   _fcm_memberships_impl)
}

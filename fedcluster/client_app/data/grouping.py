"""Microaggregation: one site's rows partitioned into small fixed groups.

A site that answers every query from groups of at least ``p`` of its rows (``p``, its
privacy floor) instead of from single rows keeps, per group, the count, the per-feature
sums and sums of squares; every reply is then a function of group statistics.  The groups
must follow the data's fine structure, so that k-means on the count-weighted group means
is about as good as k-means on the rows.  :func:`group_rows` makes them:

1. recursive median splits (each segment cut at the median of its rows' projections on
   its principal axis, ties by row index) down to blocks of at most ``max(256, 8 g)``
   rows, which makes the method linear in n and the blocks independent (both cores work);
2. inside each block, local k-means with about ``n_b / (1.5 g)`` centres; a cluster under
   ``g`` rows is merged into the nearest cluster and one of ``2 g`` rows or more is cut
   along its principal axis into consecutive runs of ``g..2g-1`` rows.

The local k-means is what makes the groups good: grouping by median splits alone (down to
2-3 rows) was measured far worse (pooled k-means on its group means at 1.3 x central at
the 90th percentile, against 1.004 (g = 2) and 1.009 (g = 3) here on the 17 sets of
``bench/grouping.py --quality``).

Memory: a site may be a memory-mapped file larger than what a process should hold.  The
splits are done in two stages: coarse splits (segments of more than COARSE_BYTES of rows)
read the site in file order only (an axis from a gathered sample, then one sequential
pass for the projections); then chunks of whole coarse segments are copied into memory
(in file order) and finished there.  After every RELEASE_BYTES of a memory-mapped site
read its pages are dropped from the resident set, so the peak stays near the chunk's
copy plus a few n-vectors (1,000,000 x 64 at g = 2: about 60 MB over the process's
Numba baseline; figures in ``bench/grouping.py``).  :func:`grouping_scale`, the
per-feature weights a site groups with, is two chunked passes that drop pages alike.

Every rule of the result is decided by compiled code in
:mod:`fedcluster.common.kernels._compiled` (the reproducibility contract is in its doc,
the grouping's part in its site-groups section): the labels depend on the rows alone and
are bit-identical for any Numba thread count.
"""

from __future__ import annotations

import numbers

import numpy as np

from fedcluster.client_app.mapped_pages import release_pages
from fedcluster.common import kernels as common_kernels
from fedcluster.common import scaling

__all__ = ["group_rows", "grouping_scale"]

# Blocks of at most max(BLOCK_ROWS, BLOCK_PER_GROUP * g) rows: ~40-85 local centres at
# g = 2-3 (enough to follow fine structure), and a block's buffer (256 x d float64) stays
# in L2.  At large g the block must still hold several groups.
BLOCK_ROWS = 256
BLOCK_PER_GROUP = 8
# The principal axis of a segment is estimated on at most SPLIT_SAMPLE of its rows with
# SPLIT_ITERATIONS power steps: a median split needs a good direction, not the best one.
SPLIT_SAMPLE = 2048
SPLIT_ITERATIONS = 6
# Lloyd steps inside a block (most blocks converge well before) and power steps for
# cutting a large cluster (tens of rows: exact enough after a few).
LLOYD_ITERATIONS = 15
CUT_AXIS_ITERATIONS = 8
# Memory: the coarse splits cut the rows into segments of at most COARSE_BYTES of rows
# reading the site in file order only; then each chunk of whole segments (at most
# CHUNK_BYTES of rows) is copied into memory and finished there.  A memory-mapped site's
# pages are dropped after every RELEASE_BYTES of it read, so its resident part stays near
# RELEASE_BYTES + CHUNK_BYTES whatever its size (random row reads would map it whole:
# the kernel maps 64 kB around each page fault).  The coarse size depends on the shape
# alone (it decides the labels); the chunking does not change them.
COARSE_BYTES = 1 << 24
CHUNK_BYTES = 1 << 26
RELEASE_BYTES = 1 << 25
# Up to this many rows the serial twins run (no thread pool start per call); depends on
# n alone, so the labels still do not depend on the thread count.
SERIAL_MAX_ROWS = 4096


def _check(X, min_size) -> tuple[np.ndarray, int]:
    if isinstance(min_size, bool) or not isinstance(min_size, numbers.Integral):
        raise ValueError(f"min_size must be an integer >= 1, got {min_size!r}")
    if min_size < 1:
        raise ValueError(f"min_size must be an integer >= 1, got {min_size}")
    if not isinstance(X, np.ndarray):
        X = np.asarray(X)
    if X.ndim != 2:
        raise ValueError(f"X must be a 2-D array (rows x features), got shape {X.shape}")
    if X.shape[1] == 0:
        raise ValueError("X has no feature columns")
    if X.dtype.kind not in "iuf":
        raise ValueError(f"X must be numeric, got dtype {X.dtype}")
    if not (X.dtype == np.float64 and X.flags.c_contiguous):
        # Only for callers outside the site path: a site's X is float64 C-contiguous
        # already (site_data.check_site_array), so a memmap is never copied here.
        X = np.ascontiguousarray(X, dtype=np.float64)
    return X, int(min_size)


def group_rows(X: np.ndarray, min_size: int, scale: np.ndarray | None = None) -> np.ndarray:
    """Partition the rows of one site into groups of at least ``min_size`` rows.

    Parameters
    ----------
    X : np.ndarray of shape (n, d)
        The site's rows, float64, finite, C-contiguous (another numeric dtype or layout
        is converted, which copies).  May be a read-only ``np.memmap``: it is read in
        file order only (sequential passes, and copies of chunks of at most CHUNK_BYTES
        of rows; never copied whole), and its pages are dropped from the resident set
        after every RELEASE_BYTES read (:func:`~fedcluster.client_app.mapped_pages.release_pages`).
    min_size : int
        Smallest group size ``g >= 1`` (the site's privacy floor).
    scale : np.ndarray of shape (d,), optional
        Per-feature multipliers of the distances the grouping measures (``x * scale``);
        None: the rows as they are.

    Returns
    -------
    np.ndarray of shape (n,), int64
        Group id of every row, ``0..G-1``, numbered by first appearance in row order.
        When ``n >= min_size``, every group has ``min_size..2*min_size-1`` rows (always:
        a block holds at least ``min_size`` rows, a small cluster is merged until none is
        under ``min_size``, a large one is cut into runs of ``min_size`` or
        ``min_size + 1`` rows).  ``n < min_size``: every row is -1 (waiting: too few rows
        for any group).  ``min_size == 1``: ``np.arange(n)`` (each row its own group).
        The labels depend on the rows alone (fixed internal seeds) and are bit-identical
        for any number of Numba threads.

    Raises
    ------
    ValueError
        ``min_size`` is not an integer >= 1; ``X`` is not 2-D, has no columns, is not
        numeric, or holds a non-finite value.
    """
    X, g = _check(X, min_size)
    n = X.shape[0]
    if scale is not None:
        scale = np.ascontiguousarray(scale, dtype=np.float64)
        if scale.shape != (X.shape[1],) or not (np.all(np.isfinite(scale)) and np.all(scale > 0)):
            raise ValueError(f"scale must be {X.shape[1]} finite positive numbers, got {scale!r}")
    if g == 1:
        return np.arange(n, dtype=np.int64)
    if n < g:
        return np.full(n, -1, dtype=np.int64)
    K = common_kernels.compiled_kernels()
    if n <= SERIAL_MAX_ROWS:
        def kernel(f):
            return K._SERIAL[f]
    else:
        def kernel(f):  # the parallel kernel, its units handed out a few at a time
            return lambda *args: K._group_run(f, *args)
    block = max(BLOCK_ROWS, BLOCK_PER_GROUP * g)
    row_bytes = 8 * X.shape[1]
    coarse = max(2 * block, COARSE_BYTES // row_bytes)
    perm = np.arange(n, dtype=np.int64)
    lo, hi = _coarse_splits(X, perm, coarse, kernel, K, scale)
    # Finish chunks of whole coarse segments in memory; every block keeps its global
    # position range (lo, hi) in perm, and local[p] is position p's group within its block.
    budget = max(coarse, CHUNK_BYTES // row_bytes)
    local = np.empty(n, dtype=np.int64)
    block_lo, block_hi, block_groups = [], [], []
    first = 0
    while first < len(lo):
        last = first + 1
        while last < len(lo) and hi[last] - lo[first] <= budget:
            last += 1
        b_lo, b_hi, groups = _finish_chunk(X, perm, lo[first:last], hi[first:last], g, block,
                                           local, kernel, K, scale)
        block_lo.append(b_lo)
        block_hi.append(b_hi)
        block_groups.append(groups)
        first = last
    offsets = np.zeros(sum(len(b) for b in block_lo) + 1, dtype=np.int64)
    np.cumsum(np.concatenate(block_groups), out=offsets[1:])
    labels = np.empty(n, dtype=np.int64)
    K._group_finish(perm, np.concatenate(block_lo), np.concatenate(block_hi), local, offsets,
                    labels)
    return labels


def _gather(X: np.ndarray, rows: np.ndarray, scale: np.ndarray | None = None) -> np.ndarray:
    """``X[rows]`` (times ``scale``, per feature) as a new array, read in file order, a
    memory-mapped ``X``'s pages dropped after every RELEASE_BYTES of it (a copy, or one
    product per cell: the same bits whatever the chunking)."""
    order = np.argsort(rows, kind="stable")
    ordered = rows[order]
    out = np.empty((len(rows), X.shape[1]))
    span = max(1, RELEASE_BYTES // (8 * X.shape[1]))
    start = 0
    for top in range(span, X.shape[0] + span, span):
        stop = int(np.searchsorted(ordered, top))
        if stop > start:
            out[order[start:stop]] = X[ordered[start:stop]] if scale is None \
                else X[ordered[start:stop]] * scale
            release_pages(X)
        start = stop
    return out


def _coarse_splits(X, perm, coarse, kernel, K, scale=None) -> tuple[np.ndarray, np.ndarray]:
    """Median splits of ``perm`` (in place) until every segment has at most ``coarse``
    rows; returns the segments' (lo, hi) positions, in position order.  ``X`` is read in
    file order only: each segment's axis from a sample of its rows (gathered), then one
    pass over all rows for the projections."""
    n = X.shape[0]
    lo = np.zeros(1, dtype=np.int64)
    hi = np.full(1, n, dtype=np.int64)
    if n <= coarse:
        return lo, hi
    seg_of_row = np.empty(n, dtype=np.int64)
    proj_row = np.empty(n)
    proj = np.empty(n)
    span = max(K._GROUP_CHUNK, RELEASE_BYTES // (8 * X.shape[1]) // K._GROUP_CHUNK * K._GROUP_CHUNK)
    while True:
        cut = (hi - lo) > coarse
        if not cut.any():
            return lo, hi
        c_lo, c_hi = lo[cut], hi[cut]
        sizes = c_hi - c_lo
        take = np.minimum(sizes, SPLIT_SAMPLE)
        # evenly spaced positions of each segment (as _group_split_level samples)
        seg = np.repeat(np.arange(len(c_lo)), take)
        within = np.arange(take.sum()) - np.repeat(np.cumsum(take) - take, take)
        sample = perm[c_lo[seg] + within * sizes[seg] // take[seg]]
        ordered = np.sort(sample)
        starts = np.concatenate([[0], np.cumsum(take)]).astype(np.int64)
        V = kernel(K._group_directions)(_gather(X, ordered, scale), np.searchsorted(ordered, sample),
                                        starts, SPLIT_ITERATIONS)
        if scale is not None:  # (x * scale) . v = x . (scale * v): project the raw rows
            V = np.ascontiguousarray(V * scale)
        seg_of_row.fill(-1)
        seg_of_row[perm[np.concatenate([np.arange(a, b) for a, b in zip(c_lo, c_hi)])]] = \
            np.repeat(np.arange(len(c_lo)), sizes)
        for r0 in range(0, n, span):
            kernel(K._group_project_rows)(X, r0, min(n, r0 + span), seg_of_row, V, proj_row)
            release_pages(X)
        kernel(K._group_select_level)(proj_row, perm, proj, c_lo, c_hi)
        lo = np.sort(np.concatenate([lo, c_lo + sizes // 2]))
        hi = np.append(lo[1:], n)


def _finish_chunk(X, perm, lo, hi, g, block, local, kernel, K, scale=None):
    """Median splits down to blocks of at most ``block`` rows and the grouping inside each
    block, for the consecutive segments (lo, hi) of ``perm``, on an in-memory copy of their
    rows.  Fills ``perm`` and ``local`` over the chunk's positions; returns the blocks'
    global (lo, hi) and number of groups."""
    start, stop = int(lo[0]), int(hi[-1])
    for a, b in zip(lo, hi):
        perm[a:b].sort()  # a segment's rows in row order: its result depends on its rows alone
    rows = perm[start:stop].copy()
    buf = _gather(X, rows, scale)
    lperm = np.arange(stop - start, dtype=np.int64)
    s_lo, s_hi = lo - start, hi - start
    proj = np.empty(stop - start)
    while True:
        cut = (s_hi - s_lo) > block
        if not cut.any():
            break
        kernel(K._group_split_level)(buf, lperm, proj, s_lo[cut], s_hi[cut], SPLIT_SAMPLE,
                                     SPLIT_ITERATIONS, start)
        s_lo = np.sort(np.concatenate([s_lo, (s_lo + (s_hi - s_lo) // 2)[cut]]))
        s_hi = np.append(s_lo[1:], stop - start)
    # Every block has more than block / 2 >= 4 g rows, or is the whole of n >= g rows.
    groups = np.empty(len(s_lo), dtype=np.int64)
    bad = np.empty(len(s_lo), dtype=np.int64)
    kernel(K._group_blocks)(buf, lperm, s_lo, s_hi, g, LLOYD_ITERATIONS, CUT_AXIS_ITERATIONS,
                            start, local[start:stop], groups, bad)
    if bad.any():
        raise ValueError("X holds a non-finite value (NaN or inf); fill missing cells first")
    perm[start:stop] = rows[lperm]
    return s_lo + start, s_hi + start, groups


# ------------------------------------------------------------------ the grouping's weights
def _moments(X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per feature, the mean of ``X`` and its squared deviations from it, summed: the
    arithmetic of ``scaling.site_moments`` (same chunks, same bits), with a memory-mapped
    ``X``'s pages dropped after every chunk (else a pass leaves the whole file resident)."""
    n, d = X.shape
    step = common_kernels.CHUNK_ROWS  # as scaling.site_moments (a test holds them equal)
    total = np.zeros(d)
    for start in range(0, n, step):
        total += X[start:start + step].sum(axis=0)
        release_pages(X)
    mean = total / n
    m2 = np.zeros(d)
    for start in range(0, n, step):
        centred = X[start:start + step] - mean
        m2 += np.einsum("ij,ij->j", centred, centred)
        release_pages(X)
    return mean, m2


def grouping_scale(X: np.ndarray) -> np.ndarray | None:
    """Per-feature multipliers of the distances the grouping measures: every feature
    weighted half as the rows are (its share of the total spread) and half as if
    standardised (its own spread), w_j = 1 / sum_l var_l + 1 / (d var_j). A run may cluster
    the rows as they are or standardised (``scale``), which the site cannot know when it
    groups: groups whose rows are close in both spaces serve both (measured: on wine,
    grouping as the rows are cost a standardised run 7% of its score, grouping
    standardised cost an unscaled run 14%; this weighting, under 1% either way)."""
    n, d = X.shape
    mean, m2 = _moments(X)
    var = m2 / n
    # A column constant at this site has a variance of rounding noise, not 0, and
    # 1 / (d var) would weight that noise by 1e15 and more: the grouping then followed
    # noise (pooled k-means on digits' group means, label skew: 1.33 x central with
    # closest pairs). Constant as the run's standard scaling judges it.
    live = ~scaling.constant_features(n, mean, var)
    total = float(var[live].sum())
    if not total > 0:
        return None
    return np.sqrt(1.0 / total + np.where(live, 1.0 / (d * np.where(live, var, 1.0)), 0.0))

"""Uniform draws from the null space of a large sparse system: the audit's linear algebra
where a site's record is too large to hold its matrix dense.

Every exact test of the audit asks whether a direction lies in the row space of a matrix
M (a value or an atom isolated: e_v; two atoms parallel; a row's change: e_u - e_w), which
is whether every z with M z = 0 vanishes on it. On a large site M's rows are of two kinds:
LOCAL rows over a few unknowns (a group's sum, a spread unit's sum of squares) and a few
HUB rows over very many (a report's parts, each pooling the straddlers of a cluster), and
the hubs alone hold the unknowns in one component. Without the hubs M is block diagonal:
per block b a null-space basis K_b, small and exact. The hubs then ask C a = 0 of the
blocks' coefficients a (C: a row per hub, its columns the hub's sums of the K_b's
columns), a system of as many rows as hubs: its reduced form fixes the pivot coefficients
from uniformly random free ones, so a is uniform on C's null space and z = K a uniform on
M's (over GF(prime)). A direction whose functional does not vanish on that space is
nonzero at a uniform z but with chance 1 / prime: k draws that all vanish call it in the
row space wrongly with chance prime^-k (a refusal, never a pass); one that lies in the
row space vanishes at every draw.
"""

from __future__ import annotations

import numpy as np

from fedcluster.client_app.release.audit.support import product_mod

__all__ = ["BLOCK_SIZE", "HUB_MEMORY", "HUB_SIZE", "TooLarge", "block_bases", "blocks",
           "null_draws", "split"]

#: A row over more unknowns than this is a HUB (a report's part); the rest are local.
HUB_SIZE = 64
#: The largest block the local rows may make (each is held dense).
BLOCK_SIZE = 1000
#: The most memory a block's rows (held dense while its basis is made) or the hubs'
#: system (a row per hub, a column per basis vector of the blocks, int64) may take:
#: beyond it the audit refuses (:class:`TooLarge`).
HUB_MEMORY = 256 * 2**20


class TooLarge(Exception):
    """A block's rows or the hubs' system would not fit in :data:`HUB_MEMORY`: the
    audit cannot decide within the site's memory, and refuses (a report is answered with
    its groups whole, a version's changed rows wait). Where a record of many versions
    and reports chains its groups and spread units into blocks too large, :func:`split`
    makes hubs of many small rows, and their system grows with them (BENCHMARKS.md,
    record-audit-1000000); the spread units of many versions alone chain blocks of
    thousands of values, which no hub cuts. A refusal there is the audit's limit, not a
    finding, and the site's log says so."""


def split(rows: list[np.ndarray], n: int, hub_size: int | None = None,
          largest: int | None = None, fixed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Which ``rows`` stay LOCAL and which are HUBS, and each unknown's block under the
    local rows, so that no block holds more than ``largest`` unknowns (each is held
    dense): the rows over more than ``hub_size`` unknowns are hubs; where the local rows
    still hold a block too large, the rows of that block over more than 3/4 of the last
    size become hubs too, size by size, until every block fits. A record of many versions
    and reports needs it: a row's versions in successive tables' groups, their spread
    units and a report's smaller parts chained 46,000 values of a 100,000-row site's
    record (16 versions, 9 reports) into one block of 4,029, whose matrix held dense asked
    for 10 GB (the site was killed for its memory before; issue 71). A rule of the hubs'
    sizes only: which rows are hubs depends on no value.

    Returns
    -------
    local, hubs : int arrays
        The rows' indices (into ``rows``) of each kind, in their order.
    block : (n,) int
        Each unknown's block (0..B-1) under the local rows.
    """
    hub_size = HUB_SIZE if hub_size is None else hub_size
    largest = max(1, BLOCK_SIZE if largest is None else largest)
    sizes = np.fromiter((r.size for r in rows), dtype=np.int64, count=len(rows))
    sizes[len(rows) - fixed:] = 0  # (never a hub: ``fixed``)
    is_hub = sizes > hub_size
    limit = hub_size
    while True:
        local = np.flatnonzero(~is_hub)
        block = blocks([rows[i] for i in local.tolist()], n)
        too_large = np.bincount(block) > largest
        if not too_large.any() or limit <= 1:
            return local, np.flatnonzero(is_hub), block
        limit = max(1, (3 * limit) // 4)
        first = np.fromiter((rows[i][0] if rows[i].size else 0 for i in local.tolist()),
                            dtype=np.int64, count=local.size)
        inside = too_large[block[first]] & (sizes[local] > 0)  # (a local row lies in one block)
        is_hub[local[inside & (sizes[local] > limit)]] = True


def blocks(local: list[np.ndarray], n: int) -> np.ndarray:
    """Each unknown's block (0..B-1: the unknowns the ``local`` rows hold together;
    :func:`split` chooses the local rows so that every block stays within a size)."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    if not local:
        return np.arange(n)
    row = np.repeat(np.arange(len(local)), [r.size for r in local])
    unknowns = np.concatenate(local).astype(np.int64)
    graph = coo_matrix((np.ones(unknowns.size, dtype=np.int8), (unknowns, n + row)),
                       shape=(n + len(local), n + len(local)))
    block = connected_components(graph, directed=False)[1][:n]
    return np.unique(block, return_inverse=True)[1].ravel()


def block_bases(local: list[np.ndarray], coefficients: np.ndarray | None, n: int,
                block: np.ndarray, prime: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Each block's basis of {z : its ``local`` rows' sums of their coefficients times z
    = 0} over GF(``prime``) (``coefficients``: every row's entries' end to end, in the
    rows' order; None: ones) (``support.null_space_mod`` of the block's rows; the identity
    for a block without rows), side by side as the columns of one (n x width) matrix:
    (row, column, entry) of its nonzero entries and its width. Compiled, one pass over
    the blocks (``kernels._compiled.block_null_bases``): a large site's record makes
    tens of thousands of small blocks, each a Python call before."""
    from fedcluster.common.kernels import compiled_kernels

    order = np.argsort(block, kind="stable")
    n_blocks = int(block.max()) + 1 if n else 0
    starts = np.searchsorted(block[order], np.arange(n_blocks + 1))
    position = np.empty(n, dtype=np.int64)  # each unknown's place in its block
    position[order] = np.arange(n) - starts[block[order]]
    member_ptr = np.concatenate([[0], np.cumsum([r.size for r in local])]).astype(np.int64)
    member_idx = np.concatenate([np.asarray(r, dtype=np.int64) for r in local] or
                                [np.zeros(0, np.int64)])
    member_coef = np.ones(member_idx.size, dtype=np.int64) if coefficients is None \
        else np.asarray(coefficients, dtype=np.int64) % prime
    row_block = block[member_idx[member_ptr[:-1]]]  # a row's block: its first unknown's
    rows = np.argsort(row_block, kind="stable")
    row_starts = np.searchsorted(row_block[rows], np.arange(n_blocks + 1))
    at_row, at_col, entries, width = compiled_kernels().block_null_bases(
        starts.astype(np.int64), order.astype(np.int64), position, row_starts.astype(np.int64),
        rows.astype(np.int64), member_ptr, member_idx, member_coef, int(prime))
    return at_row, at_col, entries, int(width)


def _within_memory(what: str, need: int) -> None:
    if need > HUB_MEMORY:
        raise TooLarge(f"undecided within the audit's memory: {what} would take "
                       f"{need / 2**20:,.0f} MB, over its {HUB_MEMORY / 2**20:,.0f} MB")


def null_draws(local: list[np.ndarray], coefficients: np.ndarray | None, hubs: list[np.ndarray],
               n: int, block: np.ndarray, prime: int, rng: np.random.Generator,
               k: int = 2) -> np.ndarray:
    """``k`` uniform draws ((k, n) int64) from {z : every row's sum of its coefficients
    times z = 0} over GF(``prime``): the ``local`` rows (unknown indices, each with its
    ``coefficients`` as :func:`block_bases` takes them) held together in ``block``, and the
    ``hubs`` (unknown indices, coefficients one)."""
    from scipy.sparse import csr_matrix

    from fedcluster.common.kernels import compiled_kernels

    if n:  # (each block's rows held dense while its basis is made: the largest of them)
        sizes = np.bincount(block).astype(np.int64)
        firsts = np.fromiter((r[0] for r in local if r.size), dtype=np.int64)
        rows = np.bincount(block[firsts], minlength=sizes.size).astype(np.int64)
        _within_memory("a block's rows", 8 * int((rows * sizes).max()))
    at_row, at_col, entries, width = block_bases(local, coefficients, n, block, prime)
    _within_memory(f"the system of {len(hubs):,} hubs x {width:,}", 8 * len(hubs) * width)
    Z = csr_matrix((entries, (at_row, at_col)), shape=(n, width))
    if hubs:
        H = csr_matrix((np.ones(sum(h.size for h in hubs), dtype=np.int64),
                        (np.repeat(np.arange(len(hubs)), [h.size for h in hubs]), np.concatenate(hubs))),
                       shape=(len(hubs), n))
        C = (H @ Z).toarray() % prime  # (a hub's size x entries under 2**31: no overflow)
        R, pivots = compiled_kernels().reduced_rows_mod(C, int(prime))
    else:
        R, pivots = np.zeros((0, width), dtype=np.int64), np.zeros(0, dtype=np.int64)
    out = np.zeros((k, n), dtype=np.int64)
    for draw in range(k):
        a = rng.integers(0, prime, size=width, dtype=np.int64)
        a[pivots] = 0
        if pivots.size:
            a[pivots] = (-product_mod(R, a, prime)) % prime
        out[draw] = compiled_kernels().coo_product_mod(at_row, at_col, entries, a, n, int(prime))
    return out

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

__all__ = ["BLOCK_SIZE", "HUB_SIZE", "block_bases", "blocks", "null_draws"]

#: A row over more unknowns than this is a HUB (a report's part); the rest are local.
HUB_SIZE = 64
#: The largest block the local rows may make (each is held dense).
BLOCK_SIZE = 3000


def blocks(local: list[np.ndarray], n: int, largest: int = BLOCK_SIZE) -> np.ndarray | None:
    """Each unknown's block (0..B-1: the unknowns the ``local`` rows hold together), or
    None where a block would hold more than ``largest``."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    if not local:
        return np.arange(n)
    row = np.repeat(np.arange(len(local)), [r.size for r in local])
    unknowns = np.concatenate(local).astype(np.int64)
    graph = coo_matrix((np.ones(unknowns.size, dtype=np.int8), (unknowns, n + row)),
                       shape=(n + len(local), n + len(local)))
    block = connected_components(graph, directed=False)[1][:n]
    block = np.unique(block, return_inverse=True)[1].ravel()
    return None if np.bincount(block).max() > largest else block


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


def null_draws(local: list[np.ndarray], coefficients: np.ndarray | None, hubs: list[np.ndarray],
               n: int, block: np.ndarray, prime: int, rng: np.random.Generator,
               k: int = 2) -> np.ndarray:
    """``k`` uniform draws ((k, n) int64) from {z : every row's sum of its coefficients
    times z = 0} over GF(``prime``): the ``local`` rows (unknown indices, each with its
    ``coefficients`` as :func:`block_bases` takes them) held together in ``block``, and the
    ``hubs`` (unknown indices, coefficients one)."""
    from scipy.sparse import csr_matrix

    from fedcluster.common.kernels import compiled_kernels

    at_row, at_col, entries, width = block_bases(local, coefficients, n, block, prime)
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

"""Uniform draws from the null space of a large sparse system: the audit's linear algebra
where a site's record is too large to hold its matrix dense.

Every exact test of the audit asks whether a direction lies in the row space of a matrix
M (a value or an atom isolated: e_v; two atoms parallel; a row's change: e_u - e_w), which
is whether every z with M z = 0 vanishes on it. On a large site M's rows are of two kinds:
LOCAL rows over a few unknowns (a group's sum, a spread unit's sum of squares) and a few
HUB rows over very many (a report's parts, each pooling the straddlers of a cluster).

The local rows are brought to a row echelon form over GF(prime) kept sparse
(``kernels._compiled.sparse_echelon_mod``), in an order of the unknowns that follows their
chains (reverse Cuthill-McKee of the graph the local rows make: a record's successive
versions chain a row's groups and spread units into long, narrow paths, whose elimination
in this order fills little: tests/test_audit_draws.py, and BENCHMARKS.md, record-audit).
Each hub is then reduced by that form to a row over the FREE unknowns it reaches (those
without a pivot row), and the hubs' rows, a dense system of as many rows as hubs, are
brought to their reduced form. A draw takes the hubs'
system's free coordinates uniformly at random, its pivots from them, and every pivot
unknown of the local form from those after it (back substitution): z is uniform on M's
null space. A direction whose functional does not vanish on that space is nonzero at a
uniform z but with chance 1 / prime: k draws that all vanish call it in the row space
wrongly with chance prime^-k (a refusal, never a pass); one in the row space vanishes at
every draw.

No row is made a hub to keep the algebra small (what the dense blocks of at most 1,000
values needed, until their hubs' system outgrew the site's memory): the hubs are the rows
over :data:`HUB_SIZE` unknowns, and the only limit is :data:`HUB_MEMORY`, over the
echelon form's fill and the hubs' system, beyond which the audit refuses
(:class:`TooLarge`).
"""

from __future__ import annotations

import numpy as np

from fedcluster.client_app.release.audit.support import product_mod

__all__ = ["BLOCK_SIZE", "HUB_MEMORY", "HUB_SIZE", "TooLarge", "chain_order", "null_draws"]

#: A row over more unknowns than this is a HUB (a report's part, pooling thousands); the
#: rest are local, in the sparse echelon form. A large site's spread units hold hundreds
#: of values: as hubs (rows over 64), 1,288 of them made a 1,000,000-row record's hubs'
#: system 817 MB and the audit refused; local, its 88 hubs decide in 2.3 s.
HUB_SIZE = 1024
#: A component of more unknowns than this is decided by draws (its matrices are not
#: held dense: each costs the cube of its size).
BLOCK_SIZE = 1000
#: The most memory the local rows' echelon form (an unknown and a residue per entry) or
#: the hubs' system (a row per hub, a column per free unknown, int64) may take: beyond
#: it the audit refuses (:class:`TooLarge`).
HUB_MEMORY = 256 * 2**20


class TooLarge(Exception):
    """The echelon form's fill or the hubs' system would not fit in :data:`HUB_MEMORY`:
    the audit cannot decide within the site's memory, and refuses (a report is answered
    with its groups whole, a version's changed rows wait). A refusal there is the audit's
    limit, not a finding, and the site's log says so."""


def _within_memory(what: str, need: int) -> None:
    if need > HUB_MEMORY:
        raise TooLarge(f"undecided within the audit's memory: {what} would take "
                       f"{need / 2**20:,.0f} MB, over its {HUB_MEMORY / 2**20:,.0f} MB")


def chain_order(unknowns: np.ndarray, row: np.ndarray, n: int) -> np.ndarray:
    """Each unknown's place (0..n-1) in the elimination order: reverse Cuthill-McKee of
    the graph in which the local rows (entry t: ``unknowns[t]`` in row ``row[t]``) join
    their unknowns (a chain's unknowns come one after another, so a row's elimination
    reaches only the rows beside it). A rule of which unknowns share a row: it depends
    on no value."""
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import reverse_cuthill_mckee

    if not unknowns.size:
        return np.arange(n, dtype=np.int64)
    incidence = csr_matrix((np.ones(unknowns.size, dtype=np.int8), (row, unknowns)),
                           shape=(int(row.max()) + 1, n))
    sequence = reverse_cuthill_mckee((incidence.T @ incidence).tocsr(), symmetric_mode=True)
    place = np.empty(n, dtype=np.int64)
    place[sequence] = np.arange(n)
    return place


def _entries(ptr: np.ndarray, sizes: np.ndarray, which: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The rows ``which`` (of rows whose entries start at ``ptr``), end to end: their
    pointers and their entries' positions among all rows' entries."""
    pointers = np.r_[0, np.cumsum(sizes[which])].astype(np.int64)
    return pointers, (np.repeat(ptr[which] - pointers[:-1], sizes[which])
                      + np.arange(pointers[-1], dtype=np.int64))


def null_draws(rows: list[np.ndarray], coefficients: np.ndarray | None, n: int, prime: int,
               rng: np.random.Generator, k: int = 2,
               hub_size: int | None = None) -> np.ndarray:
    """``k`` uniform draws ((k, n) int64) from {z : every row's sum of its coefficients
    times z = 0} over GF(``prime``) (module docstring): ``rows`` as unknown indices 0..n-1
    (repeats add), ``coefficients`` every row's entries' end to end in the rows' order
    (None: ones); rows over more than ``hub_size`` unknowns are hubs."""
    from fedcluster.common.kernels import compiled_kernels

    kernels = compiled_kernels()
    hub_size = HUB_SIZE if hub_size is None else hub_size
    sizes = np.fromiter((r.size for r in rows), dtype=np.int64, count=len(rows))
    ptr = np.r_[0, np.cumsum(sizes)].astype(np.int64)
    empty = np.zeros(0, dtype=np.int64)
    flat = np.concatenate(rows).astype(np.int64) if rows else empty
    coefficient = (np.ones(flat.size, dtype=np.int64) if coefficients is None
                   else np.asarray(coefficients, dtype=np.int64) % prime)
    row_of = np.repeat(np.arange(len(rows)), sizes)
    is_local = sizes <= hub_size
    at_local = is_local[row_of]
    place = chain_order(flat[at_local], row_of[at_local], n)
    placed = place[flat]
    # (each local row in the order of its first unknown: a chain eliminated along itself)
    lead = np.full(len(rows), n, dtype=np.int64)
    filled = np.flatnonzero(sizes)
    lead[filled] = np.minimum.reduceat(placed, ptr[filled]) if filled.size else empty
    local = np.flatnonzero(is_local)
    local = local[np.argsort(lead[local], kind="stable")]
    local_ptr, entries = _entries(ptr, sizes, local)
    local_idx, local_coef = placed[entries], coefficient[entries]
    hubs = np.flatnonzero(~is_local)
    start, length, pool_idx, pool_coef, fits = kernels.sparse_echelon_mod(
        local_ptr, local_idx, local_coef, n, int(prime), HUB_MEMORY // 16)
    if not fits:
        _within_memory("the local rows' echelon form", 16 * (HUB_MEMORY // 16 + 1))
    free = start < 0
    hub_ptr, entries = _entries(ptr, sizes, hubs)
    # (the system holds at least the reduced hubs' entries: bounded as they are made)
    reduced_ptr, reduced_idx, reduced_coef, fits = kernels.echelon_reduce_mod(
        start, length, pool_idx, pool_coef, hub_ptr, placed[entries], coefficient[entries],
        int(prime), HUB_MEMORY // 8)
    if not fits:
        _within_memory(f"the system of {hubs.size:,} hubs", 8 * (HUB_MEMORY // 8 + 1))
    # (the hubs' system over the free unknowns some hub reaches: the rest stay free)
    touched = np.unique(reduced_idx)
    _within_memory(f"the system of {hubs.size:,} hubs x {touched.size:,}",
                   8 * hubs.size * touched.size)
    system = np.zeros((hubs.size, touched.size), dtype=np.int64)
    system[np.repeat(np.arange(hubs.size), np.diff(reduced_ptr)),
           np.searchsorted(touched, reduced_idx)] = reduced_coef
    if hubs.size:
        reduced, pivots = kernels.reduced_rows_mod(system, int(prime))
    else:
        reduced, pivots = np.zeros((0, 0), dtype=np.int64), empty
    out = np.zeros((k, n), dtype=np.int64)
    for draw in range(k):
        free_values = np.where(free, rng.integers(0, prime, size=n, dtype=np.int64), 0)
        if pivots.size:  # (the hubs' pivots from their free coordinates)
            a = free_values[touched]
            a[pivots] = 0
            free_values[touched[pivots]] = (-product_mod(reduced, a, prime)) % prime
        z = kernels.echelon_back_substitute_mod(start, length, pool_idx, pool_coef,
                                                free_values, int(prime))
        out[draw] = z[place]
    return out

"""The versions audit over VALUES, first and second moments together.

A cell's value is what the promise protects. Across versions a corrected row's
unchanged cells are the same values, and a group's sum and its spread unit's sum of
squares pin a set of two values; the instance audit (``span.py``: every row
version its own unknown, first moments) sees neither (issue 54: one correction and one
appended row gave the appended row to an honest coordinator comparing two versions'
totals). This audit takes, per feature:

- **the unknowns**: the cells' values; a new instance linked to an earlier one
  (``data/versions/links.py``: the same id, or the row that left sharing most cells)
  whose cell keeps its bits holds the same value (one unknown);
- **what a coordinator may know**: every group's sum of its present cells (every group
  of every table the site ever made: ``local_kmeans`` gives them all), and every spread
  unit's sum of squares (``spreads.py``: a unit's m2 with its groups' sums; a withheld or
  merged spread releases less, so taking every unit is conservative). Every total a site
  sends (``describe``, ``stats``, an SSE) is a sum of these, over any version.

and checks, exactly where it is exact:

1. **first moments**: no combination of the groups isolates fewer than p values, nor
   the change of one row's cell (``span.component_finding`` over the values);
2. **second moments**: no combination of the units' sums of squares covers fewer than
   max(3, p) values (the same routine over the units);
3. **both together**: no value, and no row's change, is determined by the sums and the
   sums of squares jointly. The released statistics map the values x to (A x, B x^2); a
   value is determined (up to finitely many choices, a pair's order included: a sum
   and a sum of squares pin two values) exactly when its direction lies in the row space
   of the Jacobian [A; 2 B diag(x)] (at a generic x: the implicit function theorem), so
   the audit computes that row space at random x modulo a prime (a point where it is
   smaller than the generic one, which could hide a determined value, has a chance under
   (rank + 1) / PRIME). The decision depends on which cells are in which group and unit,
   never on their values, so it tells a coordinator nothing.

How 3 stays small: values in exactly the same groups and units (an atom of the first and
second moments together) enter the Jacobian only through their sum s and their weighted
sum q = sum x_i z_i (the null vectors' z), a map onto (s, q) for an atom of two values or
more: the atom is two columns (one where it lies in no unit), and a value is determined
exactly when its own functional of them (z_i itself for a one-value atom, (x_j s - q) /
(x_j - x_i) for a pair; never for three values or more, which keep a direction of their
own) lies in the compressed row space. Every component is decided, whatever its size.

Where it is conservative: a unit whose spread was merged or withheld counts as released;
two cells whose 16-bit hashes collide count as one value. Where it is not exact: at
non-generic values (cells that tie), where a sum of squares can pin what the generic
analysis leaves free: ``spreads.py`` merges the units where that shows (a spread of 0, a
2-cell group carrying its unit's).
"""

from __future__ import annotations

import numpy as np

from fedcluster.client_app.release.audit import span, support
from fedcluster.client_app.release.audit.support import null_space_mod

__all__ = ["PRIME", "Component", "component_finding", "determined"]

#: The field the Jacobian's row space is computed in.
PRIME = support.PRIMES[0]


def _inverse(value: int) -> int:
    return pow(int(value) % PRIME, PRIME - 2, PRIME)


def _compressed(first: list[np.ndarray], second: list[np.ndarray], n: int, x: np.ndarray):
    """The Jacobian compressed by atoms (module docstring, "How 3 stays small"): the
    matrix (rows: first, then second), and per value its functional of the columns
    ({column: coefficient} mod PRIME), None for a value with a direction of its own."""
    rows_of: list[list[int]] = [[] for _ in range(n)]
    for r, members in enumerate(list(first) + list(second)):
        for i in np.asarray(members).tolist():
            rows_of[i].append(r)
    atoms: dict[tuple[int, ...], list[int]] = {}
    for i in range(n):
        atoms.setdefault(tuple(rows_of[i]), []).append(i)
    columns: list[dict[int, int]] = []
    functional: list[dict[int, int] | None] = [None] * n
    for rows, values in atoms.items():
        sums = [r for r in rows if r < len(first)]
        squares = [r for r in rows if r >= len(first)]
        if len(values) == 1:
            i = values[0]
            columns.append({**dict.fromkeys(sums, 1), **dict.fromkeys(squares, 2 * int(x[i]) % PRIME)})
            functional[i] = {len(columns) - 1: 1}
            continue
        columns.append(dict.fromkeys(sums, 1))
        s = len(columns) - 1
        if not squares:
            continue  # a direction of its own: sum 0 within the atom
        columns.append(dict.fromkeys(squares, 1))
        q = len(columns) - 1
        if len(values) == 2:  # z_i + z_j = s, x_i z_i + x_j z_j = q
            i, j = values
            for a, b in ((i, j), (j, i)):
                scale = _inverse(int(x[b]) - int(x[a]))
                functional[a] = {s: int(x[b]) * scale % PRIME, q: (-scale) % PRIME}
    J = np.zeros((len(first) + len(second), len(columns)), dtype=np.int64)
    for c, entries in enumerate(columns):
        J[list(entries), c] = list(entries.values())
    return J, functional


def determined(first: list[np.ndarray], second: list[np.ndarray], n: int,
               changes: list[tuple[int, int]], trials: int = 1) -> str | None:
    """Whether the sums over ``first`` (index arrays into n values) and the sums of
    squares over ``second`` determine a value or the difference of a pair in ``changes``
    (module docstring, 3); why, or None. At a random point the row space can only be
    smaller than the generic one, which finds more determined (never fewer) unless the
    point falls where a maximal minor vanishes: at most (rank + 1) / PRIME, under 1e-6
    here; ``trials`` more points make it that to the power ``trials``."""
    if not second:
        return None  # sums alone: 1 above (no value isolated) says all
    blocks = _blocks(first, second, n) if n > BLOCK_VALUES else None
    if blocks is not None:
        return _determined_by_blocks(first, second, n, changes, blocks)
    rng = np.random.default_rng(0x51A7)  # fixed: the decision depends on no value
    for _ in range(trials):
        x = rng.integers(1, PRIME, size=n, dtype=np.int64)
        J, functional = _compressed(first, second, n, x)
        null = support.null_space_mod(J, PRIME)

        def pinned(f: dict | None) -> bool:
            if f is None:
                return False
            if null.size == 0:
                return True
            total = np.zeros(null.shape[0], dtype=np.int64)
            for column, coefficient in f.items():
                total = (total + null[:, column] * coefficient) % PRIME
            return not total.any()
        count = sum(pinned(f) for f in functional)
        if count:
            return f"the groups' sums and sums of squares determine {count} value(s)"
        for u, w in changes:
            if functional[u] is None or functional[w] is None:
                continue
            difference = dict(functional[u])
            for column, coefficient in functional[w].items():
                difference[column] = (difference.get(column, 0) - coefficient) % PRIME
            if pinned(difference):
                return "the groups' sums and sums of squares determine a row's change"
    return None


# ------------------------------------------------------------------ a large component
#: A sum over more values than this is a HUB (a report's part, pooling the straddlers of
#: a cluster); the rest are LOCAL (groups, spread units).
HUB_SIZE = 64
#: Components of more values than this, which their hubs hold together, are decided
#: block by block (:func:`_determined_by_blocks`); the largest block must be no larger.
BLOCK_VALUES = 3000


def _blocks(first: list[np.ndarray], second: list[np.ndarray], n: int, hub_size: int = HUB_SIZE,
            largest: int = BLOCK_VALUES) -> np.ndarray | None:
    """Each value's block (the values the local sums, of ``hub_size`` values or fewer, and
    the sums of squares hold together), where there are hubs and no block is larger than
    ``largest``; else None."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    if not any(r.size > hub_size for r in first):
        return None
    local = [r for r in first if r.size <= hub_size] + list(second)
    if not local:
        return np.arange(n)
    row = np.repeat(np.arange(len(local)), [r.size for r in local])
    values = np.concatenate(local).astype(np.int64)
    graph = coo_matrix((np.ones(values.size, dtype=np.int8), (values, n + row)),
                       shape=(n + len(local), n + len(local)))
    block = connected_components(graph, directed=False)[1][:n]
    if np.bincount(block).max() > largest:
        return None
    return np.unique(block, return_inverse=True)[1].ravel()


def _determined_by_blocks(first, second, n: int, changes, block: np.ndarray,
                          hub_size: int = HUB_SIZE) -> str | None:
    """:func:`determined` of a large component, by its null space.

    A value v is determined exactly when z_v = 0 for every z with J z = 0. Without the
    hubs, J is block diagonal: per block b a null-space basis K_b (small, exact). The
    hubs' rows then ask C a = 0 of the coefficients a (C: a row per hub, the hub's
    columns of the K_b), a system of few rows: its reduced form gives a uniformly random
    a of its null space, and z = K a a uniformly random z of J's. Where v is not
    determined z_v is uniform on the field, so it is 0 with chance 1 / PRIME: two draws
    call a value determined that is not (a refusal, never a pass) with chance 1 / PRIME^2.
    At a random point, as :func:`determined` (its chance of a smaller row space)."""
    from scipy.sparse import csr_matrix

    rng = np.random.default_rng(0x51A7)  # fixed: the decision depends on no value
    x = rng.integers(1, PRIME, size=n, dtype=np.int64)
    local = [(r, None) for r in first if r.size <= hub_size] + [(r, True) for r in second]
    hubs = [r for r in first if r.size > hub_size]
    order = np.argsort(block, kind="stable")
    starts = np.searchsorted(block[order], np.arange(block.max() + 2))
    position = np.empty(n, dtype=np.int64)  # each value's place in its block
    position[order] = np.arange(n) - starts[block[order]]
    rows_of: list[list[int]] = [[] for _ in range(int(block.max()) + 1)]
    for r, (members, _) in enumerate(local):
        rows_of[int(block[members[0]])].append(r)
    entries_row, entries_col, entries = [], [], []
    width = 0
    for b, rows in enumerate(rows_of):
        values = order[starts[b]:starts[b + 1]]
        L = np.zeros((len(rows), values.size), dtype=np.int64)
        for at, r in enumerate(rows):
            members, squares = local[r]
            L[at, position[members]] = 2 * x[members] % PRIME if squares else 1
        K = null_space_mod(L, PRIME) if rows else np.eye(values.size, dtype=np.int64)
        k, i = np.nonzero(K)
        entries_row.append(values[i])
        entries_col.append(width + k)
        entries.append(K[k, i])
        width += K.shape[0]
    Z = csr_matrix((np.concatenate(entries), (np.concatenate(entries_row), np.concatenate(entries_col))),
                   shape=(n, width))
    hub = csr_matrix((np.ones(sum(h.size for h in hubs), dtype=np.int64),
                      (np.repeat(np.arange(len(hubs)), [h.size for h in hubs]), np.concatenate(hubs))),
                     shape=(len(hubs), n))
    C = (hub @ Z).toarray() % PRIME  # (hub sizes x entries under 2**31: no overflow)
    R, pivots = support.reduced_rows(C, PRIME)
    free = np.ones(width, dtype=bool)
    free[pivots] = False
    draws = []
    for _ in range(2):
        a = rng.integers(0, PRIME, size=width, dtype=np.int64)
        a[pivots] = 0
        if pivots:
            a[pivots] = (-support.product_mod(R, a, PRIME)) % PRIME
        draws.append(support.product_mod(Z, a, PRIME))
    zero = np.all([z == 0 for z in draws], axis=0)
    if zero.any():
        return f"the groups' sums and sums of squares determine {int(zero.sum())} value(s)"
    if changes:
        u, w = np.array(changes, dtype=np.int64).T
        if np.all([(z[u] - z[w]) % PRIME == 0 for z in draws], axis=0).any():
            return "the groups' sums and sums of squares determine a row's change"
    return None


# ------------------------------------------------------------------ one component
class Component:
    """One connected part of everything a site answered from, for one feature: its
    groups' and units' cells as value indices 0..n-1.

    Attributes
    ----------
    groups : list of int arrays
        Each reporting group's present values.
    units : list of int arrays
        Each spread unit's present values (its reporting groups').
    n : int
        The values.
    chain : (n,) int
        Each value's row (values of one row's versions share it: their differences are
        a row's changes).
    """

    def __init__(self, groups, units, n, chain) -> None:
        self.groups, self.units, self.n, self.chain = groups, units, n, np.asarray(chain)

    def changes(self) -> list[tuple[int, int]]:
        out = []
        order = np.argsort(self.chain, kind="stable")
        for lo, hi in _runs(self.chain[order]):
            members = order[lo:hi].tolist()
            out.extend((a, b) for i, a in enumerate(members) for b in members[i + 1:])
        return out


def _runs(sorted_values: np.ndarray):
    if sorted_values.size == 0:
        return []
    edges = np.flatnonzero(np.diff(sorted_values)) + 1
    starts = np.concatenate([[0], edges])
    stops = np.concatenate([edges, [sorted_values.size]])
    return [(int(a), int(b)) for a, b in zip(starts, stops) if b - a > 1]


def component_finding(part: Component, p: int, sums: bool = True) -> str | None:
    """Why a component breaks the promise over values (module docstring, 1-3), or None
    (``sums`` False: its values are its row versions, whose sums the instances' audit has
    judged already; 2 and 3 only)."""
    changes = part.changes()
    chain = part.chain

    def same_row(u, w):
        return bool(chain[u] == chain[w])

    groups = [g for g in part.groups if g.size]
    reason = span.component_finding(groups, p, same_row) \
        if sums and len(groups) > 1 else None
    if reason is not None:
        return span.Reason(f"values: {reason}", getattr(reason, "instances", ()))
    units = [u for u in part.units if u.size]
    if len(units) > 1 or (units and units[0].size < max(3, p)):
        reason = span.component_finding(units, max(3, p), lambda u, w: False, chains=False) \
            if len(units) > 1 else f"a unit's sum of squares covers {units[0].size} value(s)"
        if reason is not None:
            return span.Reason(f"squares: {reason}", getattr(reason, "instances", ()))
    return determined(groups, units, part.n, changes)

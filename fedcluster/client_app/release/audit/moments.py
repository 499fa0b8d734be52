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

from fedcluster.client_app.release.audit import draws, span, support

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
    if n > draws.BLOCK_SIZE:  # (held together by a report's parts: by draws)
        return _determined_by_draws(first, second, n, changes)
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
def _determined_by_draws(first, second, n: int, changes, hub_size: int | None = None) -> str | None:
    """:func:`determined` of a component too large to hold its Jacobian dense: a value (or
    a row's change) is determined exactly when every z of the Jacobian's null space
    vanishes on it, decided by two uniform draws of z (``draws.null_draws``: a refusal,
    never a pass, where they vanish by chance)."""
    rng = np.random.default_rng(0x51A7)  # fixed: the decision depends on no value
    x = rng.integers(1, PRIME, size=n, dtype=np.int64)
    squares = np.concatenate(second) if second else np.zeros(0, dtype=np.int64)
    coefficients = np.r_[np.ones(sum(r.size for r in first), dtype=np.int64),
                         2 * x[squares] % PRIME]  # (a sum's ones, then each square's 2x)
    try:
        z = draws.null_draws(list(first) + list(second), coefficients, n, PRIME, rng,
                             hub_size=hub_size)
    except draws.TooLarge as error:  # (no decision: refused, never passed)
        return f"refused, {error}"
    zero = (z == 0).all(axis=0)
    if zero.any():
        return f"the groups' sums and sums of squares determine {int(zero.sum())} value(s)"
    if changes:
        u, w = np.array(changes, dtype=np.int64).T
        if ((z[:, u] - z[:, w]) % PRIME == 0).all(axis=0).any():
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
    longer = stops - starts > 1  # (only runs of two or more: a row's versions)
    return list(zip(starts[longer].tolist(), stops[longer].tolist()))


def component_finding(part: Component, p: int, sums: bool = True,
                      passed: span.Passed | None = None) -> str | None:
    """Why a component breaks the promise over values (module docstring, 1-3), or None
    (``sums`` False: its values are its row versions, whose sums the instances' audit has
    judged already; 2 and 3 only; ``passed``: parts judged for another feature, named)."""
    changes = part.changes()
    chain = part.chain

    def same_row(u, w):
        return bool(chain[u] == chain[w])

    groups = [g for g in part.groups if g.size]
    reason = span.component_finding(groups, p, same_row,
                                    passed=None if passed is None else passed.of("values")) \
        if sums and len(groups) > 1 else None
    if reason is not None:
        return span.Reason(f"values: {reason}", getattr(reason, "instances", ()))
    units = [u for u in part.units if u.size]
    if len(units) > 1 or (units and units[0].size < max(3, p)):
        reason = span.component_finding(units, max(3, p), lambda u, w: False, chains=False,
                                        passed=None if passed is None else passed.of("squares")) \
            if len(units) > 1 else f"a unit's sum of squares covers {units[0].size} value(s)"
        if reason is not None:
            return span.Reason(f"squares: {reason}", getattr(reason, "instances", ()))
    return determined(groups, units, part.n, changes)

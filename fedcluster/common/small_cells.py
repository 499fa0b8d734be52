"""Table 1's small-cell rule on the POOLED counts: primary and complementary (secondary)
suppression of a two-way table with published margins, audited by linear programming
(issue 44).

A table here is one of Table 1's variables against the clusters (rows: the clusters, then
"all"; columns: a category's levels and its missing cells, or a numeric variable's
present and missing cells), or the per-site composition (columns: the sites; its "all"
row is each site's row count, which the run's per-site report publishes). What a reader
has besides the cells shown are the relations between them: each cluster's row sums to
the cluster's size (Table 1's size row, ``model.json``'s ``cluster-sizes``), "all" to
all rows, and each column's clusters sum to its "all" cell. A cell a site withheld (in
the composition: a cluster under that site's floor) is in its column's sum (the site's
rows) but not in its row's (a cluster size counts the rows the sites showed).

The rule, p the table's floor:

1. primary: a count of 1 to p-1 is withheld and shown as ``<p``;
2. complementary: further cells are withheld, shown as ``suppressed``, until
3. the audit passes. For each withheld cell, its least and greatest value over all tables
   of non-negative counts that agree with every shown cell and every relation, each by
   linear programming (``scipy.optimize.linprog``, HiGHS), twice:

   - from the figures alone (a withheld cell any count from 0): no withheld cell may be
     one value, or lie inside 1..p-1 (the figures would tell a reader how many, or that
     it is a small group);
   - with what the markers say too (a ``<p`` cell holds 1 to p-1, as zeros are shown as
     0; a cell withheld at a site, 0 to that site's floor - 1): no withheld cell may be
     one value (at p = 2, ``<2`` says 1 by itself), and none but a ``<p`` cell may lie
     inside 1..p-1. The complementary cells are chosen so that a ``<p`` can still hold
     anything from 1 to p-1 where a rectangle allows it; where none does (a column of a
     few rows), a reader can narrow it within 1..p-1, never to one value.

   The relations' matrix is totally unimodular (every cell is in one row relation and
   one column relation; negate the "all" row's), so every bound found is a whole number
   and whole-number tables reach it: the audit is exact, not a relaxation. It does not
   reason with what is not linear: that a ``suppressed`` cell is not 1 to p-1 (it was
   not withheld by the rule) can narrow a cell further.

The complementary cells are chosen as the hypercube method of sdcTable and tau-ARGUS
chooses them in two dimensions: for a failing cell, the cheapest rectangle of it and
three other cells (one in its row, one in its column, and the one where those two
cross), its cost the counts it withholds (an "all" cell counts four times, a numeric
variable's present cells, which carry its mean, three times); the cheapest rectangles
around which the cell can move to 0 and to p-1 are tried first, and the first that makes
the cell pass the LP audit is taken. Withholding a cell only widens the others'
intervals, so each withheld cell is audited once, and again after cells are withheld for
it. An empty cluster's cells, 0 whatever is withheld, are never withheld. Where
withholding every cell still leaves one that fails, the published margins alone give it
away (as ``n-rows`` less the cluster sizes gives the rows sites withheld): it is named in
``Protected.exposed``.

Why this module and not a package: sdcTable (R) and tau-ARGUS (Java; on PyPI as
``pytauargus`` 0.6, a beta of a month, EUPL, a native engine of its own that reads
microdata or batch files and rejects the hypercube method) solve large hierarchical
tables, and ACRO (PyPI) checks research outputs made from microdata, with primary
suppression only. The server has no microdata, only pooled counts, and Table 1's tables
are at most (k + 1) x (levels + 1): a few dozen small LPs give the exact audit, with
scipy, which scikit-learn brings.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: A cell's status: shown, withheld by the rule (``<p``), withheld to protect those
#: (``suppressed``), or withheld at a site (its cluster under that site's floor).
SHOWN, PRIMARY, SECONDARY, AT_SITE = 0, 1, 2, 3
#: What withholding a cell costs per count it holds, in the "all" row (times the column's).
ALL_ROW_COST = 4.0
#: Rectangles checked by LP per failing cell, cheapest first.
CANDIDATES = 8


@dataclass
class CountTable:
    """A two-way table of whole counts: the last row is "all" (the column sums).

    ``values`` (R, C): the counts (a cell withheld at a site: 0, not known);
    ``row_totals`` (R,): each row's published sum; ``at_site`` (R, C): cells a site
    withheld (in their column's relation only), with ``site_upper`` their most;
    ``fixed_all_row``: the "all" row is a published margin (the sites' rows), never
    withheld; ``column_cost`` (C,): what withholding a count of each column costs.
    """

    values: np.ndarray
    row_totals: np.ndarray
    at_site: np.ndarray | None = None
    site_upper: np.ndarray | None = None
    fixed_all_row: bool = False
    column_cost: np.ndarray | None = None

    def __post_init__(self):
        self.values = np.asarray(self.values, dtype=np.int64)
        self.row_totals = np.asarray(self.row_totals, dtype=np.int64)
        shape = self.values.shape
        self.at_site = (np.zeros(shape, dtype=bool) if self.at_site is None
                        else np.asarray(self.at_site, dtype=bool))
        self.site_upper = (np.zeros(shape, dtype=np.int64) if self.site_upper is None
                           else np.asarray(self.site_upper, dtype=np.int64))
        self.column_cost = (np.ones(shape[1]) if self.column_cost is None
                            else np.asarray(self.column_cost, dtype=np.float64))


@dataclass
class Protected:
    """A table after the rule: each cell's status; ``exposed``: withheld cells that fail
    the audit whatever else is withheld (the margins alone give them away)."""

    table: CountTable
    status: np.ndarray
    floor: int
    exposed: list

    def bounds(self, cells) -> tuple[np.ndarray, np.ndarray]:
        """The published bounds of these withheld cells (with what the markers say)."""
        return intervals(self.table, self.status, self.floor, cells)


def protect(table: CountTable, floor: int) -> Protected:
    """Apply the rule (module docstring) to ``table`` at floor p = ``floor``.

    Withholding a cell only widens the others' intervals (every table that fitted still
    fits), so a cell that passes the audit keeps passing: each is audited once, and
    again only after the cells withheld for it."""
    R, C = table.values.shape
    status = np.where(table.at_site, AT_SITE, SHOWN)
    primary = (status == SHOWN) & (table.values >= 1) & (table.values < floor)
    if table.fixed_all_row:
        primary[-1] = False
    status[primary] = PRIMARY
    at_site = list(zip(*np.nonzero(status == AT_SITE)))
    # A cell withheld at a site that the figures fix at 0 is empty: no small group to
    # protect. It is shown as 0 at the end if the figures still fix it then.
    most = intervals(table, status, floor, at_site, sides=(-1.0,))[1]
    empty = [c for c in at_site if most[c] < 0.5]
    empty_cells = set(empty)
    pending = sorted((c for c in zip(*np.nonzero(status != SHOWN)) if c not in empty_cells),
                     key=lambda rc: status[rc] != PRIMARY)
    exposed: list = []
    narrow: list = []  # <p cells no rectangle lets span all of 1..p-1 (they pass the audit)
    while pending:
        cell = pending.pop(0)
        if cell in exposed:
            continue
        passes = _passes(table, status, cell, floor)
        if passes and (status[cell] != PRIMARY or cell in narrow
                       or _spans(table, status, cell, floor)):
            continue
        before = status.copy()
        if not _complement(table, status, cell, floor, strict=passes) and not passes:
            exposed.append(cell)
            continue
        if passes and (status == before).all():
            narrow.append(cell)
        # the cell again, then the cells withheld for it
        pending[:0] = [cell, *zip(*np.nonzero(status != before))]
    if empty:
        still = intervals(table, status, floor, empty, sides=(-1.0,))[1]
        for cell in empty:
            if still[cell] < 0.5:
                status[cell] = SHOWN
    return Protected(table, status, floor, exposed)


def fails(table: CountTable, status: np.ndarray, floor: int, cells=None) -> np.ndarray:
    """(R, C) the withheld cells (of ``cells``, or all) that the audit (module
    docstring) narrows more than the rule allows."""
    out = np.zeros(status.shape, dtype=bool)
    cells = list(zip(*np.nonzero(status != SHOWN))) if cells is None else list(cells)
    if not cells:
        return out
    low, high = intervals(table, status, floor, cells)
    for cell in cells:
        lo, hi = low[cell], high[cell]
        if status[cell] != PRIMARY:
            # (the figures alone allow at least as much: they pass if these do)
            out[cell] = hi - lo < 0.5 or (lo > 0.5 and hi < floor - 0.5)
            continue
        out[cell] = floor > 2 and hi - lo < 0.5  # (at p = 2, "<2" itself says 1)
        if not out[cell]:  # from the figures alone: 0, or p or more, must fit
            bare = intervals(table, status, floor, [cell], markers=False, sides=(1.0,))
            if bare[0][cell] > 0.5:
                bare = intervals(table, status, floor, [cell], markers=False, sides=(-1.0,))
                out[cell] = bare[1][cell] < floor - 0.5
    return out


def intervals(table: CountTable, status: np.ndarray, floor: int, cells=None,
              markers: bool = True, sides=(1.0, -1.0)) -> tuple[np.ndarray, np.ndarray]:
    """Each withheld cell's least and greatest value (module docstring), by LP, with
    what the markers say (``markers``) or from the figures alone; NaN where shown or not
    asked. ``cells``: only these (an iterable of (r, c)); ``sides``: 1 the least, -1
    the greatest.

    The relations fall apart into independent parts (a cell withheld at a site is in
    its column's relation only, so a column whose withheld cells are all such is a part
    of its own): each cell's bounds come from its part alone, by a closed form for a
    part of one relation and by LP (a sparse matrix) for the others. The per-site
    composition of 10,000 sites has thousands of withheld cells, nearly all in such
    columns: one LP over all of them per cell would cost sites squared.

    Raises
    ------
    ValueError
        The shown cells and the relations contradict each other (no table fits them).
    """
    R, C = table.values.shape
    lower, upper = np.full((R, C), np.nan), np.full((R, C), np.nan)
    withheld = status != SHOWN
    if not withheld.any():
        return lower, upper
    shown = np.where(withheld, 0, table.values)
    in_row = withheld & ~table.at_site  # the cells in their row's relation
    row_rhs = table.row_totals - np.where(table.at_site, 0, shown).sum(axis=1)
    column_rhs = shown[R - 1] - shown[:R - 1].sum(axis=0)
    for rhs, members in ((row_rhs, in_row.any(axis=1)), (column_rhs, withheld.any(axis=0))):
        if (off := rhs[~members & (rhs != 0)]).size:
            raise ValueError(f"the shown cells contradict a relation (off by {off[0]})")
    low_bound = np.zeros((R, C))
    high_bound = np.full((R, C), np.inf)
    if markers:
        low_bound[status == PRIMARY] = 1.0
        high_bound[status == PRIMARY] = float(floor - 1)
        high_bound[status == AT_SITE] = table.site_upper[status == AT_SITE]
    part_of_column = _parts(in_row)
    asked = list(zip(*np.nonzero(withheld))) if cells is None else [tuple(c) for c in cells]
    by_part: dict[int, list] = {}
    for cell in asked:
        by_part.setdefault(int(part_of_column[cell[1]]), []).append(cell)
    for part, part_cells in by_part.items():
        columns = np.flatnonzero(part_of_column == part)
        rows = np.flatnonzero(in_row[:, columns].any(axis=1))
        if rows.size == 0 and not withheld[R - 1, columns[0]]:  # one column's relation
            _one_relation(withheld, low_bound, high_bound, column_rhs, columns[0],
                          part_cells, sides, lower, upper)
            continue
        _part_lp(withheld, in_row, low_bound, high_bound, row_rhs, column_rhs, rows, columns,
                 part_cells, sides, lower, upper)
    return lower, upper


def _parts(in_row: np.ndarray) -> np.ndarray:
    """Per column, the part of the relations it is in: columns joined by a row through
    cells in that row's relation are one part."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    R, C = in_row.shape
    r, c = np.nonzero(in_row)  # nodes: the columns, then the rows
    graph = coo_matrix((np.ones(len(r)), (c, C + r)), shape=(C + R, C + R))
    return connected_components(graph, directed=False)[1][:C]


def _one_relation(withheld, low_bound, high_bound, column_rhs, column, cells, sides,
                  lower, upper) -> None:
    """Bounds of cells whose part is one column's relation: its withheld cells (all in
    cluster rows, each from its least to its most) sum to ``column_rhs``."""
    rows = np.flatnonzero(withheld[:, column])
    lo, hi = low_bound[rows, column], high_bound[rows, column]
    total = column_rhs[column]
    if not lo.sum() <= total <= hi.sum():
        raise ValueError("no table of counts fits the shown cells (the cells withheld in "
                         f"column {column} cannot sum to {total})")
    for r, c in cells:
        i = int(np.flatnonzero(rows == r)[0])
        others_lo, others_hi = np.delete(lo, i).sum(), np.delete(hi, i).sum()
        if 1.0 in sides:
            lower[r, c] = max(lo[i], total - others_hi)
        if -1.0 in sides:
            upper[r, c] = min(hi[i], total - others_lo)


def _part_lp(withheld, in_row, low_bound, high_bound, row_rhs, column_rhs, rows, columns,
             cells, sides, lower, upper) -> None:
    """Bounds of cells in a part of several relations, by LP over the part's cells."""
    from scipy.optimize import linprog
    from scipy.sparse import coo_matrix

    R = withheld.shape[0]
    sub = withheld[:, columns]
    cell_rows, cell_cols = np.nonzero(sub)
    n = len(cell_rows)
    index = {(int(r), int(columns[c])): i for i, (r, c) in enumerate(zip(cell_rows, cell_cols))}
    row_eq = np.searchsorted(rows, cell_rows)  # row relations first, then the columns'
    in_rows = in_row[cell_rows, columns[cell_cols]]
    eq_r = np.concatenate([row_eq[in_rows], len(rows) + cell_cols])
    eq_v = np.concatenate([np.arange(n)[in_rows], np.arange(n)])
    coeff = np.concatenate([np.ones(in_rows.sum()),
                            np.where(cell_rows == R - 1, -1.0, 1.0)])
    A_eq = coo_matrix((coeff, (eq_r, eq_v)), shape=(len(rows) + len(columns), n)).tocsr()
    b_eq = np.concatenate([row_rhs[rows], column_rhs[columns]]).astype(np.float64)
    lo = low_bound[cell_rows, columns[cell_cols]]
    hi = high_bound[cell_rows, columns[cell_cols]]
    bounds = np.column_stack([lo, np.where(np.isinf(hi), np.nan, hi)])
    bounds = [(a, None if np.isnan(b) else b) for a, b in bounds]
    for cell in cells:
        i = index[(int(cell[0]), int(cell[1]))]
        for sign in sides:
            out = lower if sign > 0 else upper
            objective = np.zeros(n)
            objective[i] = sign
            result = linprog(objective, A_eq=A_eq, b_eq=b_eq, bounds=bounds, method="highs")
            if result.status != 0:
                raise ValueError(f"no table of counts fits the shown cells ({result.message})")
            out[cell] = round(sign * result.fun, 6)


def _passes(table, status, cell, floor) -> bool:
    return not fails(table, status, floor, [cell])[cell]


def _spans(table, status, cell, floor) -> bool:
    """Whether a ``<p`` cell can still hold 1 and p-1 (its cluster's size, if that is
    less) with what the markers say."""
    low, high = intervals(table, status, floor, [cell])
    return low[cell] < 1.5 and high[cell] > min(floor - 1, table.row_totals[cell[0]]) - 0.5


def _complement(table: CountTable, status: np.ndarray, cell, floor: int,
                strict: bool = False) -> bool:
    """Withhold the cheapest rectangle that lets ``cell`` pass (module docstring); if no
    rectangle does, the cheapest that withholds something, else the cell's whole row
    and column, else every cell. False: nothing more can be withheld. ``strict``: the
    cell passes already; withhold a rectangle only if it then spans all of 1..p-1."""
    R, C = status.shape
    r, c = cell
    fixed = np.zeros((R, C), dtype=bool)
    if table.fixed_all_row:
        fixed[-1] = True
    # an empty cluster's cells are 0 whatever is withheld: withholding them hides nothing
    fixed[table.row_totals == 0] = True
    candidates = []
    for r2 in range(R):
        for c2 in range(C):
            if r2 == r or c2 == c:
                continue
            corners = [(r, c2), (r2, c), (r2, c2)]
            if any(fixed[x] for x in corners):
                continue
            new = [x for x in corners if status[x] == SHOWN]
            # (nor does a cluster's cell in a column whose "all" cell is a shown 0)
            zero_column = [x for x in [cell, *corners] if x[0] < R - 1
                           and status[R - 1, x[1]] == SHOWN and table.values[R - 1, x[1]] == 0
                           and (R - 1, x[1]) not in corners]
            if not new or zero_column:
                continue
            cost = sum((table.values[x] + 1.0) * table.column_cost[x[1]]
                       * (ALL_ROW_COST if x[0] == R - 1 else 1.0) for x in new)
            candidates.append((not _moves_enough(table, status, cell, (r2, c2), floor), cost,
                               new))
    candidates.sort(key=lambda item: item[:2])
    for _, _, new in candidates[:CANDIDATES]:
        trial = status.copy()
        trial[tuple(np.array(new).T)] = SECONDARY
        if _passes(table, trial, cell, floor) and (
                not strict or _spans(table, trial, cell, floor)):
            status[tuple(np.array(new).T)] = SECONDARY
            return True
    if strict:
        return False
    if candidates:
        new = candidates[0][2]
        status[tuple(np.array(new).T)] = SECONDARY
        return True
    line = np.zeros((R, C), dtype=bool)
    line[r], line[:, c] = True, True
    for region in (line, np.ones((R, C), dtype=bool)):
        new = region & (status == SHOWN) & ~fixed
        if new.any():
            status[new] = SECONDARY
            return True
    return False


def _moves_enough(table: CountTable, status, cell, corner, floor) -> bool:
    """Whether ``cell`` can move to 0 and to p-1 around the rectangle with opposite
    corner ``corner``, its other corners kept within their bounds (known values only: a
    cell withheld at a site, whose value the server does not know, is assumed to allow
    it). A cheap test that ranks the rectangles; the LP audit decides."""
    (r, c), (r2, c2) = cell, corner
    last = status.shape[0] - 1
    v = int(table.values[cell])
    if status[cell] == AT_SITE or v == 0:
        return True
    # as the cell takes +t: its row partner -t; its column partner -t and the opposite
    # corner +t between two clusters, or +t and -t through the "all" row
    partners = ({(r, c2): -1, (r2, c): -1, (r2, c2): 1} if last not in (r, r2)
                else {(r, c2): -1, (r2, c): 1, (r2, c2): -1})
    for t in (-v, floor - 1 - v):
        for x, sign in partners.items():
            if status[x] == AT_SITE:
                continue
            value = table.values[x] + sign * t
            if value < (1 if status[x] == PRIMARY else 0) or (
                    status[x] == PRIMARY and value > floor - 1):
                return False
    return True



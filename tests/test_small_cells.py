"""Table 1's small-cell rule, its maths (issue 44, ``common/small_cells.py``): the LP
audit's bounds are those of the whole-number tables (checked by enumerating every table
that fits), the rule's tables pass the audit, and a cell the margins alone give away is
named."""

from __future__ import annotations

import itertools

import numpy as np

from fedcluster.common import profile
from fedcluster.common.small_cells import (PRIMARY, SECONDARY, SHOWN, CountTable, fails,
                                           intervals, protect)


def _fitting(table: CountTable, status, withheld, markers: bool, floor: int) -> np.ndarray:
    """Every whole-number assignment of the withheld cells (each from 0 to its row's
    total) under which the table fits its relations (and, with ``markers``, a <p cell
    is 1 to p-1): one row per fitting table."""
    ranges = [range(int(table.row_totals[r]) + 1) for r, _ in withheld]
    combos = np.array(list(itertools.product(*ranges)))
    x = np.broadcast_to(table.values, (len(combos), *table.values.shape)).copy()
    for i, cell in enumerate(withheld):
        x[(slice(None), *cell)] = combos[:, i]
    ok = (x.sum(axis=2) == table.row_totals).all(axis=1)
    ok &= (x[:, :-1].sum(axis=1) == x[:, -1]).all(axis=1)
    if markers:
        for i, cell in enumerate(withheld):
            if status[cell] == PRIMARY:
                ok &= (combos[:, i] >= 1) & (combos[:, i] <= floor - 1)
    return combos[ok]


def test_the_lp_bounds_are_those_of_the_whole_number_tables():
    """On 25 small tables with cells withheld at random, each withheld cell's least and
    greatest value by LP equal those over every whole-number table that fits (found by
    enumeration), with and without what the markers say: the audit is exact."""
    rng = np.random.default_rng(0)
    floor, checked = 4, 0
    for _ in range(25):
        cells = rng.integers(0, 4, size=(3, 3))
        values = np.vstack([cells, cells.sum(axis=0)])
        table = CountTable(values, values.sum(axis=1))
        status = np.full(values.shape, SHOWN)
        every = [tuple(c) for c in np.argwhere(np.ones(values.shape))]
        for i in rng.choice(len(every), size=4, replace=False):
            status[every[i]] = PRIMARY if 1 <= values[every[i]] < floor else SECONDARY
        withheld = [c for c in every if status[c] != SHOWN]
        for markers in (False, True):
            low, high = intervals(table, status, floor, markers=markers)
            fitting = _fitting(table, status, withheld, markers, floor)
            assert len(fitting)  # (the true table fits)
            for i, cell in enumerate(withheld):
                assert low[cell] == fitting[:, i].min(), (cell, markers)
                assert high[cell] == fitting[:, i].max(), (cell, markers)
                checked += 1
    assert checked > 150


def test_the_rule_leaves_no_cell_the_audit_can_narrow():
    """On 25 random tables (clusters of p rows or more, or none, x levels, a few small
    cells): every count of 1 to p-1 is withheld, and after the complementary cells no
    withheld cell fails the audit; an empty cluster's cells, 0 whatever is withheld, are
    never withheld."""
    rng = np.random.default_rng(1)
    floor, withheld = 5, 0
    for _ in range(25):
        cells = rng.integers(0, 40, size=(5, 4)) * (rng.random((5, 4)) < 0.8)
        cells[rng.random((5, 4)) < 0.2] = rng.integers(1, 5)
        cells[rng.integers(5)] = 0  # an empty cluster
        small = (cells.sum(axis=1) > 0) & (cells.sum(axis=1) < floor)
        cells[small, 0] += floor  # (a site's cluster is p_site rows or more)
        values = np.vstack([cells, cells.sum(axis=0)])
        table = CountTable(values, values.sum(axis=1))
        result = protect(table, floor)
        small = (values >= 1) & (values < floor)
        assert np.array_equal(result.status == PRIMARY, small)
        assert not fails(table, result.status, floor).any() and result.exposed == []
        assert not (result.status[table.row_totals == 0] != SHOWN).any()
        withheld += int((result.status != SHOWN).sum())
    assert withheld > 50


def test_a_cell_the_margins_alone_give_is_named():
    """One site with 42 rows shows cluster 0 (40 rows) and withholds cluster 1 (2 rows,
    under its floor 5). Its row count less the cluster's size gives the 2, whatever is
    withheld: the rule says so, in a note, rather than hide it and pretend."""
    counts = {"A": np.array([40, 0])}
    flagged = {"A": np.array([False, True])}
    values, notes = profile.protected_composition(counts, flagged, {"A": 42}, {"A": 5}, 5)
    assert values["A"][1] == "<5"
    assert any("site A in cluster 1" in note for note in notes), notes
    # a second site that also withheld cluster 1 (empty there, which only it knows):
    # withholding both sites' cluster 0 leaves A's anything from 0 to 2
    counts["B"], flagged["B"] = np.array([60, 0]), np.array([False, True])
    values, notes = profile.protected_composition(counts, flagged, {"A": 42, "B": 60},
                                                  {"A": 5, "B": 5}, 5)
    assert values == {"A": ["suppressed", "<5", 42], "B": ["suppressed", "<5", 60]}
    assert notes == []
    # (a site that withheld nothing but empty clusters: they read 0, the figures say so)
    values, _ = profile.protected_composition({"A": np.array([40, 0])}, {"A": flagged["A"]},
                                              {"A": 40}, {"A": 5}, 5)
    assert values == {"A": [40, 0, 40]}

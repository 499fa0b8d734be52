"""The span audit's components judged together (``release/audit/together.py``): what the
one graph passes, each component's own audit passes too, and where they all pass it
passes them all (a later version of a large site: thousands of small components)."""

from __future__ import annotations

import numpy as np
import pytest

from fedcluster.client_app.release.audit import span, support, together
from fedcluster.client_app.release.record.instances import SameRow


def _component(rng, start: int, kind: str) -> list[np.ndarray]:
    """A component's groups over instances ``start``.. : a table and its next version
    (chains), a table and a report partition of it (a graph), or sets overlapping in three
    ways (neither)."""
    n = int(rng.integers(4, 14))
    rows = np.arange(start, start + n)
    cut = np.sort(rng.choice(np.arange(1, n), size=min(n - 1, int(rng.integers(1, 3))), replace=False))
    table = [part for part in np.split(rows, cut) if part.size]
    if kind == "version":  # one group withdrawn, its rows joined to another, whole
        if len(table) < 2:
            return table + [rows[:1].copy()] if n > 1 else table
        return table + [np.sort(np.concatenate([table[0], table[1]]))]
    if kind == "report":  # the table cut again across its groups
        again = np.sort(rng.choice(np.arange(1, n), size=1, replace=False))
        return table + [part for part in np.split(rng.permutation(rows), again) if part.size]
    groups = [np.sort(rng.choice(rows, size=int(rng.integers(2, n)), replace=False))
              for _ in range(4)]
    return table + groups


def _families(seed: int, size: int, kinds=("version", "report", "overlap")):
    rng = np.random.default_rng(seed)
    start, components = 0, []
    while len(components) < size:  # (connected, as span.audit's components are)
        lists = [np.asarray(m, dtype=np.int64)
                 for m in _component(rng, start, str(rng.choice(kinds)))]
        if len(lists) > 1 and sum(part.size for part in span._connected(lists)) == len(lists) \
                and len(span._connected(lists)) == 1:
            components.append(lists)
            start += 20
    return components, start


def _same_row(rng, n: int, ids: bool) -> SameRow:
    if ids:
        return SameRow(rng.integers(0, n // 2, size=(n, 1)), None)
    first = rng.integers(0, 3, size=n)
    seen = np.stack([first, first + rng.integers(0, 2, size=n), rng.integers(0, 1, size=n) * 0,
                     (rng.random(n) < 0.95).astype(np.int64)], axis=1)
    return SameRow(None, seen)


@pytest.mark.parametrize("seed", range(12))
def test_what_the_one_graph_passes_each_components_own_audit_passes(seed):
    """Families of graphs alone (a table and its next version, or a report partition),
    and with sets overlapping in three ways; a few components each (so that all of a
    family pass together now and then) and many."""
    rng = np.random.default_rng(100 + seed)
    together_passed = 0
    for size, kinds in ((3, ("version", "report")), (30, ("version", "report")),
                        (30, ("version", "report", "overlap"))):
        components, n = _families(seed, size, kinds)
        together_passed += _judged_alike(components, n, rng)
    assert together_passed > 0  # (the one graph passed some: the test is not vacuous)


def _judged_alike(components, n, rng) -> int:
    passed = 0
    for p in (1, 2, 3, 5):
        for ids in (False, True):
            same_row = _same_row(rng, n, ids)
            own = [span.component_finding(lists, p, same_row) is None for lists in components]
            verdict = together.passing(components, p, same_row)
            assert not (verdict & ~np.array(own)).any(), (p, ids)
            passed += int(verdict.sum())
            # and it passes exactly each component that is a graph cutting p rows or more
            # (with no possible change at p <= 2), whatever fails beside it
            graphs = [support.graph_cut(support.atoms(c), p) for c in components]
            expected = [g is not None and g[0] >= p and (
                p > 2 or not span._change_candidates(support.atoms(c), same_row))
                for c, g in zip(components, graphs)]
            assert verdict.tolist() == expected, (p, ids)
    return passed


def test_a_possible_change_is_left_to_the_components_own_audit():
    """Two groups sharing one instance, each with one of its own: the graph's cut is 2,
    but their difference is e_u - e_w, a row's change when u and w may be one row."""
    lists = [np.array([0, 1]), np.array([1, 2])]
    other = [np.array([10, 11, 12]), np.array([12, 13, 14])]
    ids = np.array([[7], [8], [7], [0], [0], [0], [0], [0], [0], [0],
                    [1], [2], [3], [4], [5]])
    same_row = SameRow(ids, None)
    assert span.component_finding(lists, 2, same_row) is not None
    verdict = together.passing([lists, other], 2, same_row)
    assert verdict.tolist() == [False, True]
    assert span.component_finding(other, 2, same_row) is None
    # at p 3 no change is asked (support 2 is under p already): the cut decides, each
    # component's own (the first cuts 2 rows; the union is halved to find it)
    assert together.passing([lists, other], 3, same_row).tolist() == [False, True]
    assert span.component_finding(other, 3, same_row) is None
    assert span.component_finding(lists, 3, same_row) is not None


@pytest.mark.parametrize("ids", [False, True])
def test_pairs_in_parts_is_any_pair_of_each_part(ids):
    rng = np.random.default_rng(5 + ids)
    n = 200
    same_row = _same_row(rng, n, ids)
    instances = rng.integers(0, n, size=300)
    parts = rng.integers(0, 40, size=300)
    got = same_row.pairs_in_parts(instances, parts, 45)
    want = [same_row.any_pair(instances[parts == k]) for k in range(45)]
    assert got.tolist() == want and any(want) and not all(want)

"""A pass of the spread rule over a table is linear in its groups (issue 71): a chunk finds
its own merged units by bisection and computes each unit once, all its members at once
(``data/group_spreads.py``, ``release/spreads.units_rule``), with the values
the one-unit functions give to the last bit. Before, every chunk walked every merged unit
of the table and computed a unit again for each of its members: a unit of u groups cost
u^2, and ties in whole-number columns make large units."""

from __future__ import annotations

import numpy as np
import pytest

from fedcluster.client_app.data import group_spreads
from fedcluster.client_app.release import spreads


def _units(rng, sizes, width=6):
    m2 = [rng.random((k, width)) * rng.choice([1e-3, 1.0, 1e3]) for k in sizes]
    cells = [rng.integers(0, 6, (k, width)) for k in sizes]
    for block in m2:  # zeros and ties, as whole-number columns give
        block[rng.random(block.shape) < 0.2] = 0.0
    return m2, cells


@pytest.mark.parametrize("seed", range(5))
def test_many_units_at_once_equal_one_unit_at_a_time_to_the_last_bit(seed):
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 40, 30)
    m2, cells = _units(rng, sizes)
    tiny = np.full(6, 1e-6)
    starts = np.cumsum([0, *sizes[:-1]])
    total, dof, reveals = spreads.units_rule(np.concatenate(m2), np.concatenate(cells), starts, tiny)
    for u, (unit_m2, unit_cells) in enumerate(zip(m2, cells)):
        share = spreads.member_shares(total[u][None, :], dof[u][None, :], unit_cells)
        assert np.array_equal(share, spreads.shares(unit_m2, unit_cells))
        assert np.array_equal(reveals[u], spreads.unit_reveals(unit_m2, unit_cells, tiny))


def _record(rng, n_groups, unit_positions):
    width = 4
    order = rng.permutation(n_groups)
    counts = rng.integers(2, 6, n_groups)
    m2 = rng.random((n_groups, width))
    record = group_spreads.Spreads(order, counts, None, m2, 2, np.full(n_groups, -1, np.int64),
                                   np.full(width, 1e-9))
    for unit in unit_positions:
        record.merge(unit)
    record.typical = np.ones(width)
    return record


def test_one_pass_computes_each_unit_once(monkeypatch):
    """A table of 5 chunks with one merged unit of 2,000 groups across all of them and
    500 small ones: two passes, chunk after chunk, hand each unit's members to the rule
    once (a unit keeps its (d,) total and degrees of freedom for the table's passes): 2,000
    + 500 x 3 rows (computed again in every chunk it touches: 10,000 + ...; a unit per
    member, as before issue 71: 4 million for the large unit alone); and the released m2
    is the one-unit functions'."""
    rng = np.random.default_rng(0)
    n_groups = 5 * group_spreads.CHUNK_GROUPS
    positions = rng.permutation(n_groups)
    large = positions[:2000]
    small = [positions[2000 + 3 * i:2003 + 3 * i] for i in range(500)]
    record = _record(rng, n_groups, [large, *small])
    seen = []
    real = spreads.units_rule

    def counted(m2, cells, starts, tiny):
        seen.append(m2.shape[0])
        return real(m2, cells, starts, tiny)

    monkeypatch.setattr(spreads, "units_rule", counted)
    for _ in range(2):
        released = np.concatenate([record.take(lo, min(n_groups, lo + group_spreads.CHUNK_GROUPS))
                                   for lo in range(0, n_groups, group_spreads.CHUNK_GROUPS)])
    assert sum(seen) == 2000 + 500 * 3
    # the values: each merged position's share, or the pooled stand-in where its unit reveals
    for unit in [large, *small[:50]]:
        unit = np.sort(unit)
        ids = record.order[unit]
        cells = np.repeat(record.counts[ids, None], 4, axis=1)
        share = spreads.shares(record.m2[ids], cells)
        reveals = spreads.unit_reveals(record.m2[ids], cells, record.tiny)
        expected = np.where(reveals[None, :], np.maximum(cells - 1.0, 0.0), share)
        assert np.array_equal(released[unit], expected)


@pytest.mark.parametrize("seed", range(3))
def test_the_compiled_pair_pass_is_numpy_s_to_the_last_bit(seed):
    """``spread_pair_rule`` (the compiled kernels) against ``pair_shares`` and
    ``pair_reveals``: groups with and without a partner, cells 0 to 5, zero and tied
    spreads, tiny spreads on the threshold."""
    from fedcluster.common.kernels import _compiled

    rng = np.random.default_rng(seed)
    n, d = 3000, 7
    m2 = rng.random((n, d)) * rng.choice([1e-12, 1.0, 1e6], (n, d))
    mate_m2 = rng.random((n, d)) * rng.choice([1e-12, 1.0, 1e6], (n, d))
    m2[rng.random((n, d)) < 0.2] = 0.0
    mate_m2[rng.random((n, d)) < 0.2] = 0.0
    mate_m2[:500] = m2[:500]  # ties
    cells = rng.integers(0, 6, (n, d))
    mate_cells = rng.integers(0, 6, (n, d))
    alone = rng.random(n) < 0.3
    mate_m2[alone], mate_cells[alone] = 0.0, 0
    tiny = rng.random(d) * 1e-3
    share, reveals = _compiled.spread_pair_rule(m2, mate_m2, cells, mate_cells, tiny,
                                                spreads.EQUAL_WITHIN, spreads.SPREAD_MIN_ROWS)
    assert np.array_equal(share, spreads.pair_shares(m2, mate_m2, cells, mate_cells))
    assert np.array_equal(reveals, spreads.pair_reveals(m2, mate_m2, cells, mate_cells, tiny))


def test_the_compiled_extremes_are_numpy_s():
    from fedcluster.common.kernels import _compiled

    rng = np.random.default_rng(0)
    groups = rng.integers(0, 50, 4000)
    deviation = rng.standard_normal((4000, 5))
    deviation[rng.random((4000, 5)) < 0.1] = 0.0
    high, low = np.zeros((50, 5)), np.zeros((50, 5))
    _compiled.group_extremes_at(high, low, groups, deviation)
    expected_high, expected_low = np.zeros((50, 5)), np.zeros((50, 5))
    np.maximum.at(expected_high, groups, deviation)
    np.minimum.at(expected_low, groups, deviation)
    assert np.array_equal(high, expected_high) and np.array_equal(low, expected_low)


# The pairing as it was written in NumPy before it was compiled (issue 71): the reference.
def _leaves_numpy(points, ids, size):
    out, stack = [], [ids]
    while stack:
        part = stack.pop()
        if part.size <= size:
            out.append(part)
            continue
        block = points[part]
        axis = int(np.argmax(block.max(axis=0) - block.min(axis=0)))
        order = np.lexsort((part, block[:, axis]))
        half = part.size // 2
        stack.extend([part[order[half:]], part[order[:half]]])
    return out


def _pair_in_numpy(points, ids, small, taken, partner):
    block = points[ids]
    d2 = ((block[:, None, :] - block[None, :, :]) ** 2).sum(axis=2)
    np.fill_diagonal(d2, np.inf)
    for a in np.flatnonzero(small[ids] & (partner[ids] < 0)).tolist():
        if partner[ids[a]] >= 0:
            continue
        free = (partner[ids] < 0) & ~taken[ids]
        free[a] = False
        if not free.any():
            return
        b = int(np.flatnonzero(free)[np.argmin(d2[a, free])])
        partner[ids[a]], partner[ids[b]] = ids[b], ids[a]
        taken[ids[a]] = taken[ids[b]] = True


def _partners_numpy(points, counts):
    partner = np.full(counts.size, -1, dtype=np.int64)
    small = counts < spreads.SPREAD_MIN_ROWS
    if not small.any():
        return partner
    points = np.nan_to_num(np.asarray(points, dtype=np.float64))
    taken = np.zeros(counts.size, dtype=bool)
    candidates = np.arange(counts.size)
    for _ in range(2):
        for leaf in _leaves_numpy(points, candidates, spreads.LEAF_GROUPS):
            _pair_in_numpy(points, leaf, small, taken, partner)
        if not (small & (partner < 0)).any():
            break
        candidates = np.flatnonzero((small & (partner < 0)) | (~small & ~taken))
    return partner


@pytest.mark.parametrize("width", [1, 3, 8, 11, 16])
def test_the_compiled_pairing_is_the_numpy_one(width):
    """Groups' points with ties (whole numbers), duplicates and spread-out values; small
    and large groups: the same partners, and the same leaves, as the NumPy code made."""
    rng = np.random.default_rng(width)
    for trial in range(4):
        n = int(rng.integers(50, 3000))
        points = rng.standard_normal((n, width)) * rng.uniform(0.1, 10, width)
        if trial % 2:
            points = np.round(points)  # ties
        points[rng.integers(0, n, n // 10)] = points[0]  # duplicates
        counts = rng.integers(2, 5, n)
        assert np.array_equal(spreads.spread_partners(points, counts), _partners_numpy(points, counts))
        ids = rng.permutation(n)
        for mine, theirs in zip(spreads._leaves(points, ids, spreads.LEAF_GROUPS),
                                _leaves_numpy(points, ids, spreads.LEAF_GROUPS), strict=True):
            assert np.array_equal(mine, theirs)


def _mend_one_head_at_a_time(record, points):
    """The mend as written before issue 71 made it whole-array: each flagged unit's
    nearest group of another unit looked for alone (its leaf, else every group), merged
    member by member in a union-find, every unit's reveals by the one-unit function."""
    n = record.order.size
    leaves = spreads._leaves(points, np.arange(n), spreads.LEAF_GROUPS)
    leaf_of = np.empty(n, dtype=np.int64)
    for k, leaf in enumerate(leaves):
        leaf_of[leaf] = k
    parent = {}

    def root(p):
        while parent.get(p, p) != p:
            p = parent[p]
        return p

    flagged = record._revealing().tolist()
    for _ in range(group_spreads.MERGE_ROUNDS if flagged else 0):
        heads = sorted({int(record.unit_of(p)[0]) for p in flagged})
        nears = []
        for head in heads:
            excluded = np.zeros(n, dtype=bool)
            excluded[record.unit_of(head)] = True
            excluded[list(record.alone)] = True
            near = -1
            for among in (leaves[leaf_of[head]], np.arange(n)):
                d2 = ((points[among] - points[head]) ** 2).sum(axis=1)
                d2[excluded[among]] = np.inf
                if np.isfinite(d2).any():
                    near = int(among[np.argmin(d2)])
                    break
            nears.append(near)
        for head, near in zip(heads, nears):
            for member in record.unit_of(head).tolist() + ([] if near < 0 else record.unit_of(near).tolist()):
                parent.setdefault(member, member)
                a, b = root(member), root(head)
                if a != b:
                    parent[max(a, b)] = min(a, b)
        components = {}
        for member in parent:
            components.setdefault(root(member), set()).update(record.unit_of(member).tolist())
        for members in components.values():
            record.merge(sorted(members))
        reveals = {}
        for p in flagged:
            unit = record.unit_of(p)
            reveals[int(unit[0])] = spreads.unit_reveals(*record._unit(unit), record.tiny)
        flagged = [head for head, reveal in reveals.items() if reveal.any()]
        if not flagged:
            return
    for head in flagged:
        for member in record.unit_of(head).tolist():
            record.withheld[member] = sorted(set(record.withheld.get(member, []))
                                             | set(np.flatnonzero(reveals[head]).tolist()))


@pytest.mark.parametrize("seed", range(4))
def test_the_whole_array_mend_merges_as_one_head_at_a_time(seed, monkeypatch):
    """Tables of 2-4-row groups with ties (zero and equal spreads, whole-number means):
    the mend (every flagged unit's nearest at once, leaf by leaf; the merges as connected
    components; the units' rule a chunk at a time) makes the units and withholds the
    spreads that the one-head-at-a-time mend does, to the group."""
    monkeypatch.setattr(group_spreads, "CHUNK_GROUPS", 64)
    rng = np.random.default_rng(seed)
    n, width = 700, 3
    counts = rng.integers(2, 5, n)
    m2 = rng.integers(0, 3, (n, width)).astype(np.float64)  # ties and zeros
    points = rng.integers(0, 6, (n, 2)).astype(np.float64)
    order = rng.permutation(n)
    alone = rng.choice(n, 5, replace=False).tolist()
    records = []
    for _ in range(2):
        record = group_spreads.Spreads(order, counts, None, m2, 2, np.full(n, -1, np.int64),
                                       np.full(width, 1e-9))
        record.partner = spreads.spread_partners(points, counts[order])
        record.partner[np.isin(record.partner, alone)] = -1  # (the alone are in no unit)
        record.partner[alone] = -1
        record.alone.update(alone)
        records.append(record)
    records[0]._mend(lambda: points)
    _mend_one_head_at_a_time(records[1], points)
    assert np.array_equal(records[0].unit_heads(), records[1].unit_heads())
    assert records[0].withheld == records[1].withheld
    assert (records[0].unit_head >= 0).sum() > n // 4  # many merged: the test has teeth

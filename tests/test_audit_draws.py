"""The audit of a large component, block by block (``release/audit/draws.py``): a report's
parts pool the straddlers of whole clusters, so on a large site one component holds every
straddler, too large for its matrices held dense (a 1,000,000-row site's report asked for a
(236,107 x 334,980) Jacobian, its next version for a (207,612 x 103,491) incidence). Here
the block paths are forced on small random components, over values
(``moments._determined_by_blocks``) and over instances (``span._columns``), and their
verdicts are the dense paths'."""

from __future__ import annotations

import numpy as np
import pytest

from fedcluster.client_app.release.audit import draws, moments, span, support


def _component(rng, n_groups: int):
    """Groups of 2-5 values, spread units of 1-3 groups, 1-3 hubs over many groups' values
    (parts), and the changes of a few pairs."""
    sizes = rng.integers(2, 6, size=n_groups)
    bounds = np.r_[0, np.cumsum(sizes)]
    n = int(bounds[-1])
    groups = [np.arange(bounds[g], bounds[g + 1]) for g in range(n_groups)]
    units, g = [], 0
    while g < n_groups:
        take = int(rng.integers(1, 4))
        units.append(np.concatenate(groups[g:g + take]))
        g += take
    hubs = [np.sort(rng.choice(n, size=int(rng.integers(n // 4, n // 2)), replace=False))
            for _ in range(int(rng.integers(1, 4)))]
    # a hub less some groups: what a part less its straddlers gives (small supports)
    for h in range(len(hubs)):
        if rng.random() < 0.5:
            drop = np.concatenate([groups[int(i)] for i in rng.choice(n_groups, 2, replace=False)])
            hubs.append(np.setdiff1d(hubs[h], drop[: int(rng.integers(1, drop.size))]))
    changes = [tuple(sorted(map(int, rng.choice(n, 2, replace=False)))) for _ in range(3)]
    return groups + [h for h in hubs if h.size], units, n, changes


@pytest.mark.parametrize("seed", range(4))
def test_the_block_path_decides_as_the_dense_jacobian(seed):
    rng = np.random.default_rng(seed)
    verdicts = {True: 0, False: 0}
    for _ in range(40):
        first, second, n, changes = _component(rng, int(rng.integers(6, 30)))
        hub_size = max(5, max(r.size for r in first) // 4)  # (the hubs' sizes are n/4 and up)
        split = moments._split(first, second, n, hub_size, largest=n)
        assert split[1].size  # (hubs: the block path)
        dense = moments.determined(first, second, n, changes)  # (small: held dense)
        by_blocks = moments._determined_by_blocks(first, second, n, changes, split)
        assert (dense is None) == (by_blocks is None), (dense, by_blocks)
        assert dense is None or ("change" in dense) == ("change" in by_blocks), (dense, by_blocks)
        verdicts[dense is None] += 1
    assert min(verdicts.values()) >= 5, verdicts  # both verdicts exercised


@pytest.mark.parametrize("p", [2, 3])
def test_the_instances_audit_by_draws_decides_as_the_dense_null_space(monkeypatch, p):
    """Groups over instances, report parts (hubs) over many, a later table's groups
    across both (atoms in three sets: no graph, so the columns of the null space decide,
    at p 2 and 3): the verdict by draws is the dense one's."""
    rng = np.random.default_rng(20 + p)
    verdicts = {True: 0, False: 0}
    for _ in range(60):
        n = int(rng.integers(60, 150))
        bounds = np.cumsum(rng.integers(p, p + 3, size=n))
        lists = np.split(np.arange(n), bounds[bounds < n])
        lists = lists[:-1] + ([lists[-1]] if lists[-1].size >= p else [])
        base = len(lists)
        for _ in range(int(rng.integers(1, 4))):  # parts: whole groups, less a few rows or more
            whole = np.concatenate([lists[int(g)] for g in rng.choice(base, size=base // 3, replace=False)])
            less = rng.choice(whole, size=int(rng.choice([0, 0, 0, 1])), replace=False)
            extra = rng.choice(n, size=int(rng.choice([0, 0, 0, 1])), replace=False)
            lists.append(np.union1d(np.setdiff1d(whole, less), extra))
        for _ in range(int(rng.integers(1, 4))):  # a later version's groups: two whole ones
            lists.append(np.concatenate([lists[int(g)] for g in rng.choice(base, 2, replace=False)]))
        same = {(int(u), int(w)) for u, w in rng.integers(0, n, size=(3, 2)) if u < w}

        def same_row(u, w, same=same):
            return (min(u, w), max(u, w)) in same
        found = support.atoms(lists)
        if max(sum(g in sets for sets in found.sets) for g in range(found.n_sets)) <= 4:
            continue  # (no set of more than 4 atoms: no hub)
        dense = span._by_columns(found, p, same_row)
        with monkeypatch.context() as forced:
            forced.setattr(draws, "BLOCK_SIZE", 12)  # (the draws, and blocks made to fit)
            forced.setattr(draws, "HUB_SIZE", 4)  # (a group holds at most 4 atoms)
            called = []
            forced.setattr(draws, "null_draws", lambda *a, **k: called.append(1) or null_draws(*a, **k))
            by_draws = span._by_columns(found, p, same_row)
        assert called  # (the draws decided)
        assert (dense is None) == (by_draws is None), (lists, dense, by_draws)
        verdicts[dense is None] += 1
    assert min(verdicts.values()) >= 5 and sum(verdicts.values()) >= 40, verdicts


null_draws = draws.null_draws


@pytest.mark.parametrize("seed", range(3))
def test_the_compiled_block_bases_are_each_block_s_null_space_mod(seed):
    """``draws.block_bases`` (one compiled pass over the blocks) gives, block by block, the
    basis ``support.null_space_mod`` gives of the block's rows (the identity where a block
    has none), entry for entry: rows with coefficients and with ones, repeated unknowns,
    blocks of one unknown and blocks without rows."""
    rng = np.random.default_rng(seed)
    prime = support.PRIMES[seed % 2]
    n = 400
    local, coefficients = [], []
    for _ in range(260):
        lo = int(rng.integers(0, n - 6))
        members = rng.integers(lo, lo + 6, size=int(rng.integers(1, 5)))  # (repeats possible)
        local.append(members.astype(np.int64))
        coefficients.append(None if rng.random() < 0.5 else rng.integers(-5 * prime, 5 * prime, size=members.size))
    block = draws.blocks(local, n)
    flat = np.concatenate([np.ones(m.size, dtype=np.int64) if c is None else c
                           for m, c in zip(local, coefficients)])  # (every row's, end to end)
    at_row, at_col, entries, width = draws.block_bases(local, flat, n, block, prime)
    Z = np.zeros((n, width), dtype=np.int64)
    Z[at_row, at_col] = entries
    expected, column = np.zeros((n, 0), dtype=np.int64), 0
    for b in range(int(block.max()) + 1):
        unknowns = np.flatnonzero(block == b)  # (in order: as the stable sort puts them)
        where = {u: i for i, u in enumerate(unknowns)}
        rows = [r for r in range(len(local)) if block[local[r][0]] == b]
        if rows:
            L = np.zeros((len(rows), unknowns.size), dtype=np.int64)
            for at, r in enumerate(rows):
                for u, c in zip(local[r], np.ones(local[r].size, np.int64) if coefficients[r] is None
                                else np.asarray(coefficients[r]) % prime):
                    L[at, where[int(u)]] = c
            K = support.null_space_mod(L, prime)
        else:
            K = np.eye(unknowns.size, dtype=np.int64)
        part = np.zeros((n, K.shape[0]), dtype=np.int64)
        part[unknowns] = K.T
        expected = np.hstack([expected, part])
        column += K.shape[0]
    assert width == column and (Z == expected).all()
    assert (np.bincount(block) > 1).any() and (np.bincount(block) == 1).any()
    assert width > 0 and any(c is not None for c in coefficients)


def _by_columns_one_atom_at_a_time(found, p, same_row):
    """``span._by_columns`` as it was written before it judged every atom at once: an
    atom at a time, in the same order (the reference of the test below)."""
    import itertools

    weights = found.weights
    light = np.flatnonzero(weights < p)
    light = light[np.argsort(weights[light], kind="stable")]
    singles = np.flatnonzero(weights == 1)
    for prime in support.PRIMES:
        column = span._columns(found, prime)
        for a in light.tolist():
            if not column[a].any():
                return span._isolates(int(weights[a]), p, found.members[a])
        if p == 3:
            seen: dict[bytes, int] = {}
            for a in singles.tolist():
                first = np.flatnonzero(column[a])[0]
                direction = (column[a] * pow(int(column[a, first]), prime - 2, prime)) % prime
                if direction.tobytes() in seen:
                    return span._isolates(2, p, np.r_[found.members[seen[direction.tobytes()]],
                                                      found.members[a]])
                seen[direction.tobytes()] = a
        elif p <= 2:
            equal: dict[bytes, list[int]] = {}
            for a in singles.tolist():
                equal.setdefault(column[a].tobytes(), []).append(a)
            for atoms in equal.values():
                for a, b in itertools.combinations(atoms, 2):
                    if same_row(int(found.members[a][0]), int(found.members[b][0])):
                        return span.Reason("a combination of the groups gives the difference of "
                                           "two versions of a row",
                                           np.r_[found.members[a], found.members[b]])
    return None


@pytest.mark.parametrize("p", [2, 3, 4])
def test_the_columns_test_judges_all_atoms_at_once_as_one_at_a_time(p):
    """The columns' test (zero, parallel and equal columns) over every atom at once finds
    what the atom-at-a-time loop found, the same finding on the same instances."""
    rng = np.random.default_rng(40 + p)
    kinds = set()
    for _ in range(80):
        n = int(rng.integers(20, 60))
        lists = [np.sort(rng.choice(n, size=int(rng.integers(1, 6)), replace=False))
                 for _ in range(int(rng.integers(n // 4, n)))]
        found = support.atoms(lists)
        same = {(int(u), int(w)) for u, w in rng.integers(0, n, size=(6, 2)) if u < w}

        def same_row(u, w, same=same):
            return (min(u, w), max(u, w)) in same
        ours = span._by_columns(found, p, same_row)
        theirs = _by_columns_one_atom_at_a_time(found, p, same_row)
        assert (ours is None) == (theirs is None) and str(ours) == str(theirs), (ours, theirs)
        if ours is not None:
            assert np.array_equal(ours.instances, theirs.instances)
        kinds.add(str(ours)[:30])
    assert len(kinds) >= 2, kinds  # a finding and none, at least


def _reporting_one_group_at_a_time(instances, groups, offsets, members, units, group_p, value,
                                   present, carried):
    """``values._judge``'s lists of a feature as it made them before, a group at a time (the
    reference of the test below)."""
    local = {g: np.searchsorted(instances, members[offsets[g]:offsets[g + 1]]) for g in groups.tolist()}
    by_unit: dict[int, list[int]] = {}
    for g in groups.tolist():
        by_unit.setdefault(int(units[g]) if units[g] >= 0 else -1 - g, []).append(g)
    group_lists, unit_lists = [], []
    for unit, members_of in by_unit.items():
        unit_cells = []
        for g in members_of:
            here = local[g][present[local[g]]]
            if here.size >= group_p[g] and (carried is None or not carried[g]):
                group_lists.append(np.unique(value[here]))
                unit_cells.append(value[here])
        if unit_cells and unit >= 0:
            unit_lists.append(np.unique(np.concatenate(unit_cells)))
    return group_lists, unit_lists


@pytest.mark.parametrize("seed", range(3))
def test_a_component_s_lists_are_made_all_groups_at_once_as_one_at_a_time(seed):
    """The groups' and units' value lists of a feature (``values.Layout``: every group at
    once) are those the group-at-a-time loop made, in the same order: units in any
    order of their groups, groups in no unit, missing cells, carried features, floors 0-3,
    values shared by versions of a row."""
    from fedcluster.client_app.release.audit import values

    rng = np.random.default_rng(seed)
    for _ in range(30):
        n_groups = int(rng.integers(1, 40))
        sizes = rng.integers(1, 6, size=n_groups)
        offsets = np.r_[0, np.cumsum(sizes)]
        members = rng.permutation(int(offsets[-1]) + 20)[:offsets[-1]]
        instances = np.unique(members)
        units = np.where(rng.random(n_groups) < 0.7, rng.integers(0, 8, size=n_groups), -1)
        group_p = rng.integers(0, 4, size=n_groups)
        groups = np.sort(rng.choice(n_groups, size=int(rng.integers(1, n_groups + 1)), replace=False))
        value = rng.integers(0, instances.size, size=instances.size)  # (versions share values)
        present = rng.random(instances.size) < 0.8
        carried = None if rng.random() < 0.5 else rng.random(n_groups) < 0.2
        layout = values.Layout.of(instances, groups, offsets, members, units, group_p)
        ours = layout.reporting(value, present, carried)
        theirs = _reporting_one_group_at_a_time(instances, groups, offsets, members, units,
                                                group_p, value, present, carried)
        for mine, reference in zip(ours, theirs):
            assert len(mine) == len(reference)
            assert all(np.array_equal(a, b) for a, b in zip(mine, reference))


def _chained(rng, n: int):
    """Two tables' groups over one set of values (each a partition into runs of 3-7
    along its own random order: successive versions' groups, which chain every value into
    one block), half of the first table's groups in spread units (1-3 of its groups), a
    report's parts (hubs) and the changes of a few pairs."""
    tables = []
    for _ in range(2):
        order = rng.permutation(n)
        cuts = np.cumsum(rng.integers(3, 8, size=n))
        tables.append([np.sort(run) for run in np.split(order, cuts[cuts < n]) if run.size])
    units, g = [], 0
    while g < len(tables[0]):
        take = int(rng.integers(1, 4))
        if rng.random() < 0.5:
            units.append(np.concatenate(tables[0][g:g + take]))
        g += take
    parts = np.array_split(rng.permutation(n), int(rng.integers(2, 4)))
    hubs = [np.sort(part) for part in parts[:-1]]
    changes = [tuple(sorted(map(int, rng.choice(n, 2, replace=False)))) for _ in range(3)]
    return [r for table in tables for r in table] + hubs, units, n, changes


@pytest.mark.parametrize("seed", range(3))
def test_a_block_too_large_is_split_by_hubs_and_decides_as_held_whole(seed):
    """Where the local rows chain more values than a block may hold (a record of many
    versions and reports: one block of 4,029 values asked for a 10 GB matrix and the site
    was killed for its memory), ``draws.split`` makes the largest rows of that block hubs
    until every block fits, and the verdicts, over values (the Jacobian) and over
    instances (the null space's columns), are those of the component held whole."""
    rng = np.random.default_rng(90 + seed)
    verdicts, columns = {True: 0, False: 0}, {True: 0, False: 0}
    for _ in range(12):
        first, second, n, changes = _chained(rng, int(rng.integers(150, 300)))
        whole = draws.blocks([r for r in first if r.size <= 20] + second, n)
        assert np.bincount(whole).max() > 60  # (one block too large for the limit below)
        split = moments._split(first, second, n, hub_size=20, largest=60)
        local_first, hubs, block = split
        assert np.bincount(block).max() <= 60
        assert np.union1d(local_first, hubs).size == len(first)  # (each row one kind)
        assert np.intersect1d(local_first, hubs).size == 0
        local = [first[i] for i in local_first.tolist()] + second
        assert all(np.unique(block[r]).size == 1 for r in local)  # (a local row in one block)
        dense = moments.determined(first, second, n, changes)  # (small: held dense)
        by_blocks = moments._determined_by_blocks(first, second, n, changes, split)
        assert (dense is None) == (by_blocks is None), (dense, by_blocks)
        verdicts[dense is None] += 1
        for p in (2, 3):  # over instances: the groups' sums alone
            found = support.atoms(first)
            held_whole = span._by_columns(found, p, lambda u, w: False)
            with pytest.MonkeyPatch.context() as forced:
                forced.setattr(draws, "BLOCK_SIZE", 40)
                by_draws = span._by_columns(found, p, lambda u, w: False)
            assert (held_whole is None) == (by_draws is None), (held_whole, by_draws)
            columns[held_whole is None] += 1
    assert min(verdicts.values()) >= 2 and min(columns.values()) >= 2, (verdicts, columns)


def test_a_system_beyond_the_audit_s_memory_is_refused_never_passed(monkeypatch):
    """Where the hubs' system would not fit in ``draws.HUB_MEMORY`` the audit does not
    decide: over values and over instances it refuses, saying why (a component the
    audit passes with the memory it needs)."""
    rng = np.random.default_rng(7)
    for _ in range(20):
        first, second, n, changes = _chained(rng, 200)
        split = moments._split(first, second, n, hub_size=20, largest=60)
        if moments._determined_by_blocks(first, second, n, changes, split) is None:
            break
    else:
        raise AssertionError("no component the audit passes")
    found = support.atoms(first)
    with pytest.MonkeyPatch.context() as forced:
        forced.setattr(draws, "BLOCK_SIZE", 40)
        assert span._by_columns(found, 2, lambda u, w: False) is None
    monkeypatch.setattr(draws, "HUB_MEMORY", 8 * len(split[1]))  # (hubs x a width of 1)
    refused = moments._determined_by_blocks(first, second, n, changes, split)
    assert refused is not None and "refused, undecided within the audit's memory" in refused
    monkeypatch.setattr(draws, "BLOCK_SIZE", 40)
    reason = span._by_columns(found, 2, lambda u, w: False)
    assert reason is not None and "undecided within the audit's memory" in reason

"""The audit of a large component by draws (``release/audit/draws.py``: a sparse echelon
form of the local rows, the hubs reduced by it): a report's parts pool the straddlers of
whole clusters, so on a large site one component holds every straddler, too large for its
matrices held dense (a 1,000,000-row site's report asked for a (236,107 x 334,980)
Jacobian, its next version for a (207,612 x 103,491) incidence). Here the draws are
forced on small random components, over values (``moments._determined_by_draws``) and
over instances (``span._columns``), and their verdicts are the dense paths'."""

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
def test_the_draws_decide_as_the_dense_jacobian(seed):
    rng = np.random.default_rng(seed)
    verdicts, missed = {True: 0, False: 0}, 0
    for _ in range(40):
        first, second, n, changes = _component(rng, int(rng.integers(6, 30)))
        hub_size = max(5, max(r.size for r in first) // 4)  # (the hubs' sizes are n/4 and up)
        assert any(r.size > hub_size for r in first)  # (hubs, reduced by the local rows' form)
        dense = moments.determined(first, second, n, changes)  # (small: held dense)
        by_blocks = moments._determined_by_draws(first, second, n, changes, hub_size)
        assert (dense is None) == (by_blocks is None), (dense, by_blocks)
        assert dense is None or ("change" in dense) == ("change" in by_blocks), (dense, by_blocks)
        verdicts[dense is None] += 1
        if dense is not None:  # (the hubs left out: what they determined passes)
            local = [r for r in first if r.size <= hub_size]
            missed += moments._determined_by_draws(local, second, n, changes, hub_size) is None
    assert min(verdicts.values()) >= 5, verdicts  # both verdicts exercised
    assert missed >= 1  # (the hubs decide some verdicts)


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
            forced.setattr(draws, "BLOCK_SIZE", 12)  # (the draws)
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
def test_the_draws_are_uniform_on_the_null_space_mod(seed):
    """``draws.null_draws`` (the local rows' sparse echelon form, the hubs reduced by it,
    back substitution) gives vectors of the null space ``support.null_space_mod`` gives of
    the rows held dense, and as many draws as its dimension (and a few more) span it: rows
    with coefficients and with ones, repeated unknowns, unknowns in no row, rows that
    repeat others, and hubs."""
    rng = np.random.default_rng(seed)
    prime = support.PRIMES[seed % 2]
    kinds = set()
    for _ in range(30):
        n = int(rng.integers(20, 120))
        rows, coefficients = [], []
        for _ in range(int(rng.integers(n // 4, n))):
            lo = int(rng.integers(0, n - 6))
            members = rng.integers(lo, lo + 6, size=int(rng.integers(1, 5)))  # (repeats possible)
            rows.append(members.astype(np.int64))
            coefficients.append(rng.integers(-5 * prime, 5 * prime, size=members.size)
                                if rng.random() < 0.5 else np.ones(members.size, dtype=np.int64))
        for _ in range(int(rng.integers(0, 4))):  # hubs (rows over many unknowns)
            rows.append(np.sort(rng.choice(n, size=int(rng.integers(10, n)), replace=False)))
            coefficients.append(np.ones(rows[-1].size, dtype=np.int64))
        rows.append(rows[0].copy())  # (a row again: dependent)
        coefficients.append(coefficients[0].copy())
        M = np.zeros((len(rows), n), dtype=np.int64)
        for at, (r, c) in enumerate(zip(rows, coefficients)):
            np.add.at(M[at], r, np.asarray(c) % prime)
        null = support.null_space_mod(M % prime, prime)  # (dimension x n)
        z = draws.null_draws(rows, np.concatenate(coefficients), n, prime, rng,
                             k=null.shape[0] + 3, hub_size=8)
        assert all(not support.product_mod(M % prime, z[d], prime).any() for d in range(len(z)))
        spanned, _ = support.reduced_rows(z, prime)
        assert spanned.shape[0] == null.shape[0]  # (draws in the null space, spanning it)
        kinds.add((null.shape[0] > 0, any(r.size > 8 for r in rows)))
    assert kinds >= {(True, True), (True, False)}, kinds


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
def test_a_component_chained_whole_by_its_local_rows_decides_as_held_dense(seed):
    """Where the local rows chain every value into one block (a record of many versions
    and reports: dense blocks had to make hubs of its rows until each fit, and the hubs'
    system outgrew the site's memory), the sparse echelon form takes it whole, and the
    verdicts, over values (the Jacobian) and over instances (the null space's columns),
    are those of the component held dense."""
    rng = np.random.default_rng(90 + seed)
    verdicts, columns = {True: 0, False: 0}, {True: 0, False: 0}
    for _ in range(12):
        first, second, n, changes = _chained(rng, int(rng.integers(150, 300)))
        dense = moments.determined(first, second, n, changes)  # (small: held dense)
        by_draws = moments._determined_by_draws(first, second, n, changes, hub_size=20)
        assert (dense is None) == (by_draws is None), (dense, by_draws)
        verdicts[dense is None] += 1
        for p in (2, 3):  # over instances: the groups' sums alone
            found = support.atoms(first)
            held_dense = span._by_columns(found, p, lambda u, w: False)
            with pytest.MonkeyPatch.context() as forced:
                forced.setattr(draws, "BLOCK_SIZE", 40)
                forced.setattr(draws, "HUB_SIZE", 20)
                by_draws = span._by_columns(found, p, lambda u, w: False)
            assert (held_dense is None) == (by_draws is None), (held_dense, by_draws)
            columns[held_dense is None] += 1
    assert min(verdicts.values()) >= 2 and min(columns.values()) >= 2, (verdicts, columns)


def test_the_chain_order_keeps_a_mesh_s_echelon_form_near_its_rows():
    """A mesh of 10,000 values (each row joins a value to its neighbours right and below,
    in a shuffled labelling: versions chaining groups two ways): eliminated in
    ``draws.chain_order`` its echelon form holds about a tail of two per row; in the
    shuffled labelling itself it fills over ten times more (the order is what keeps a
    record's long chains within memory)."""
    from fedcluster.common.kernels import compiled_kernels

    rng = np.random.default_rng(5)
    side = 100
    n = side * side
    label = rng.permutation(n)
    rows = [label[[i * side + j, (i + 1) * side + j, i * side + j + 1]]
            for i in range(side - 1) for j in range(side - 1)]
    prime = support.PRIMES[0]

    def fill(place):
        placed = [place[r] for r in rows]
        order = np.argsort([r.min() for r in placed], kind="stable")
        ptr = np.arange(0, 3 * len(rows) + 1, 3, dtype=np.int64)
        idx = np.concatenate([placed[i] for i in order]).astype(np.int64)
        coef = rng.integers(1, prime, size=idx.size, dtype=np.int64)
        return compiled_kernels().sparse_echelon_mod(ptr, idx, coef, n, prime, 10**8)[2].size

    ordered = fill(draws.chain_order(np.concatenate(rows), np.repeat(np.arange(len(rows)), 3), n))
    assert ordered <= 3 * len(rows)
    assert fill(np.arange(n)) > 10 * ordered


def test_a_system_beyond_the_audit_s_memory_is_refused_never_passed(monkeypatch):
    """Where the echelon form's fill or the hubs' system would not fit in
    ``draws.HUB_MEMORY`` the audit does not decide: over values and over instances it
    refuses, saying why (a component the audit passes with the memory it needs)."""
    rng = np.random.default_rng(7)
    for _ in range(20):
        first, second, n, changes = _chained(rng, 200)
        if moments._determined_by_draws(first, second, n, changes, hub_size=20) is None:
            break
    else:
        raise AssertionError("no component the audit passes")
    found = support.atoms(first)
    monkeypatch.setattr(draws, "BLOCK_SIZE", 40)
    monkeypatch.setattr(draws, "HUB_SIZE", 20)
    assert span._by_columns(found, 2, lambda u, w: False) is None
    for memory in (16 * 50, 8 * 400):  # (the echelon form; then the hubs' system)
        monkeypatch.setattr(draws, "HUB_MEMORY", memory)
        refused = moments._determined_by_draws(first, second, n, changes, hub_size=20)
        assert refused is not None and "refused, undecided within the audit's memory" in refused
        reason = span._by_columns(found, 2, lambda u, w: False)
        assert reason is not None and "undecided within the audit's memory" in reason


def _gauss_jordan(matrix, prime):
    """The reduced row echelon form by the book: each pivot row scaled, then subtracted
    over its whole width from every other row (what both forms did before they skipped
    the pivot row's zeros)."""
    A = np.array(matrix, dtype=np.int64) % prime
    pivots, row = [], 0
    for col in range(A.shape[1]):
        rows = [i for i in range(row, A.shape[0]) if A[i, col]]
        if row == A.shape[0] or not rows:
            continue
        A[[row, rows[0]]] = A[[rows[0], row]]
        A[row] = A[row] * pow(int(A[row, col]), prime - 2, prime) % prime
        for i in range(A.shape[0]):
            if i != row:
                A[i] = (A[i] - A[i, col] * A[row] % prime) % prime
        pivots.append(col)
        row += 1
    return A[:row], pivots


@pytest.mark.parametrize("seed", range(6))
def test_both_reduced_forms_are_the_book_s(seed):
    """The compiled form (the hubs' system) and the NumPy one (a dense block), which run
    a row operation over the pivot row's nonzero entries from its pivot on: the same
    rows and pivots as Gauss-Jordan over whole rows, on sparse, low-rank, wide and tall
    matrices with zero columns, at both primes."""
    from fedcluster.common.kernels import compiled_kernels

    rng = np.random.default_rng(seed)
    m, n = int(rng.integers(1, 30)), int(rng.integers(1, 80))
    rank = int(rng.integers(1, min(m, n) + 1))
    basis = np.where(rng.random((rank, n)) < 0.2, rng.integers(1, 50, (rank, n)), 0)
    basis[:, rng.random(n) < 0.2] = 0
    matrix = rng.integers(-3, 4, (m, rank)) @ basis
    for prime in support.PRIMES:
        want, want_pivots = _gauss_jordan(matrix, prime)
        got, got_pivots = support.reduced_rows(matrix, prime)
        compiled, compiled_pivots = compiled_kernels().reduced_rows_mod(matrix % prime, prime)
        assert np.array_equal(got, want) and list(got_pivots) == want_pivots
        assert np.array_equal(compiled, want) and list(compiled_pivots) == want_pivots
        assert len(want_pivots) == np.linalg.matrix_rank(matrix.astype(float))  # (no prime divides a minor here)

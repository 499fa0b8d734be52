"""Random histories of 50 versions over values (issue 54, must-show 1).

``bench/versions.py``'s kind of edit (rows deleted, cells corrected, rows appended), 3
seeds at p 2, 3 and 5 here (10 a floor in ``bench/value_histories.py``), a site reading a
CSV through its cache (the real ClientApp): the honest coordinator's totals attack (``stats`` of every version) and a malicious
coordinator's per-group replies (every group's mean and count through ``kmeanspp``, its m2
through ``profile``) differenced across versions recover nothing, shown first to recover
values from a site answering from its rows; and an audit written here, over the site's
record of every release (the ledger names each reply's table; the site's store holds each
table's groups, as rows, and spread units) and this test's own knowledge of the values
(which cells a correction left as they were), finds no value and no row's change
determined by the groups' sums and the units' sums of squares together (floating-point
SVD of the Jacobian at the true values), and no unit's sum of squares over fewer than 3
values.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from scipy.linalg import null_space

from fedcluster.client_app.data.versions import Store
from fedcluster.client_app.release import ledger

from test_spread_attacks import every_group
from test_value_versions import CellTable, FileSite, blobs, moments, recovered, totals_attack


def _site(tmp_path, node, name) -> tuple[FileSite, Path]:
    path, cache = tmp_path / f"{name}.csv", tmp_path / f"cache-{name}"
    node = {**node, "ledger-path": str(tmp_path / f"{name}-ledger.jsonl")}
    site = FileSite(path, cache, node, False)
    site.node = node
    return site, path


def edit_at_random(rng, table: CellTable, version: int) -> None:
    """One version's edit, as ``bench/versions.py`` draws them: 1-5 rows deleted, 1-5
    cells corrected, or 5-30 rows appended."""
    change = rng.integers(3)
    if change == 0:
        table.delete(rng.choice(len(table.X), int(rng.integers(1, 6)), replace=False))
    elif change == 1:
        for _ in range(int(rng.integers(1, 6))):
            table.correct(int(rng.integers(len(table.X))), int(rng.integers(table.X.shape[1])),
                          float(rng.normal()))
    else:
        table.append(blobs(int(rng.integers(5, 31)), seed=1000 + version))


class Record:
    """What the site answered from, over the values as this test knows them: every group
    of every table (read from the site's store: each group's instances, matched to this
    test's rows through the kept tables' row-groups) and every spread unit (the store's)."""

    def __init__(self) -> None:
        self.groups: dict[int, frozenset] = {}  # store group -> its rows' (id, edits) instances
        self.tables: set[int] = set()
        self.values: dict[tuple, float] = {}
        self.instances: dict[tuple, tuple] = {}  # (id, row edits) -> per column its value key

    def add_version(self, site: FileSite, table: CellTable) -> None:
        groups = site.table_now()
        store = Store.open(Path(groups.table_ref.store))
        record = store.tables[groups.table_ref.number]
        self.tables.add(groups.table_ref.number)
        row_groups = np.asarray(np.load(site.cache / "groups" / f"{record['entry']}.row-groups.npy"))
        numbers = store.table_groups(groups.table_ref.number)
        for r, (row_id, edits, cell_edits) in enumerate(zip(table.ids, table.edits, table.cell_edits)):
            key = (int(row_id), int(edits))
            self.instances[key] = tuple((int(row_id), j, int(e)) for j, e in enumerate(cell_edits))
        members: dict[int, set] = {}
        for r, g in enumerate(row_groups.tolist()):
            if g >= 0:
                members.setdefault(int(numbers[g]), set()).add((int(table.ids[r]), int(table.edits[r])))
        for number, rows in members.items():
            assert self.groups.setdefault(number, frozenset(rows)) == frozenset(rows)
        self.values.update(table.values())
        self.unit = np.asarray(store.unit)


    def findings(self) -> tuple[list, list]:
        """(values determined, row changes determined): per feature and connected part,
        the Jacobian of the groups' sums and the units' sums of squares at the true
        values, its null space by SVD (a value is determined when its row of the null
        space is 0; a change when two versions' rows are equal)."""
        from scipy.sparse import coo_matrix
        from scipy.sparse.csgraph import connected_components

        numbers = sorted(self.groups)
        single, changes = [], []
        for j in range(max(k[1] for k in self.values) + 1):
            keys = sorted({self.instances[i][j] for g in numbers for i in self.groups[g]})
            index = {k: n for n, k in enumerate(keys)}
            sets = [sorted(index[self.instances[i][j]] for i in self.groups[g]) for g in numbers]
            units: dict[int, set] = {}
            for g, members in zip(numbers, sets):
                if self.unit[g] >= 0:  # (-1: its spread withheld, no sum of squares)
                    units.setdefault(int(self.unit[g]), set()).update(members)
            atoms = [(1, s) for s in sets] + [(2, sorted(u)) for u in units.values()]
            small = [u for u in units.values() if 0 < len(u) < 3]
            single += [("unit of", len(u)) for u in small]  # a sum of squares of < 3 values
            rows = np.repeat(np.arange(len(atoms)), [len(s) for _, s in atoms])
            cols = np.concatenate([s for _, s in atoms]) + len(atoms)
            size = len(atoms) + len(keys)
            _, label = connected_components(coo_matrix((np.ones(rows.size), (rows, cols)),
                                                       shape=(size, size)), directed=False)
            x = np.array([self.values[k] for k in keys])
            for c in np.unique(label[len(atoms):]):
                members = np.flatnonzero(label[len(atoms):] == c)
                where = {m: n for n, m in enumerate(members.tolist())}
                used = [a for a in np.flatnonzero(label[:len(atoms)] == c)]
                J = np.zeros((len(used), members.size))
                for r, a in enumerate(used):
                    order, s = atoms[a]
                    cols_ = [where[m] for m in s]
                    J[r, cols_] = 1.0 if order == 1 else 2.0 * x[members[cols_]] / (1.0 + np.abs(x[members]).max())
                N = null_space(J)
                for n, m in enumerate(members.tolist()):
                    if np.linalg.norm(N[n]) < 1e-8:
                        single.append(keys[m])
                by_row: dict[int, list] = {}
                for n, m in enumerate(members.tolist()):
                    by_row.setdefault(keys[m][0], []).append(n)
                changes += [(keys[members[a]], keys[members[b]]) for ns in by_row.values()
                            for i, a in enumerate(ns) for b in ns[i + 1:]
                            if np.linalg.norm(N[a] - N[b]) < 1e-8]
        return single, changes


def _pairs(d: np.ndarray, e: np.ndarray) -> list:
    """(feature, value) of the two values whose sum is ``d`` and sum of squares ``e``."""
    disc = 2 * e - d * d
    ok = disc >= 0
    root = np.sqrt(np.where(ok, disc, 0.0))
    j = np.broadcast_to(np.arange(d.shape[-1]), d.shape)
    return [np.column_stack([j[ok], ((d + root) / 2)[ok]]), np.column_stack([j[ok], ((d - root) / 2)[ok]])]


def group_attack(history: list) -> np.ndarray:
    """A malicious coordinator's (feature, value) candidates from every version's groups
    (``kmeanspp``: every group's mean and count; ``profile``: its m2): a group of one row
    (its mean) or two (the pair its sum and sum of squares give); and each group new in a
    version against every earlier group, where their counts differ by one (the
    difference of their sums) or by two (a pair, with their sums of squares)."""
    out = []
    seen_counts, seen_sums, seen_squares = np.zeros(0), np.zeros((0, 0)), np.zeros((0, 0))
    known: set = set()
    for means, counts, m2 in history:
        d = means.shape[1]
        sums = means * counts[:, None]
        squares = m2 + counts[:, None] * means * means
        j = np.broadcast_to(np.arange(d), means.shape)
        one, two = counts == 1, counts == 2
        out.append(np.column_stack([j[one].ravel(), means[one].ravel()]))
        out += _pairs(sums[two], squares[two])
        keys = [(int(n), tuple(np.round(s, 12))) for n, s in zip(counts, sums)]
        fresh = np.array([k not in known for k in keys])
        if seen_counts.size and fresh.any():
            step = counts[fresh][:, None] - seen_counts[None, :]
            D = sums[fresh][:, None, :] - seen_sums[None, :, :]
            E = squares[fresh][:, None, :] - seen_squares[None, :, :]
            for sign in (1.0, -1.0):
                single = np.abs(step) == 1
                jj = np.broadcast_to(np.arange(d), D[single].shape)
                out.append(np.column_stack([jj.ravel(), (sign * D[single]).ravel()]))
                double = np.abs(step) == 2
                out += _pairs(sign * D[double], sign * E[double])
        known.update(keys)
        if seen_sums.size == 0:
            seen_sums, seen_squares = np.zeros((0, d)), np.zeros((0, d))
        seen_counts = np.concatenate([seen_counts, counts[fresh]])
        seen_sums = np.vstack([seen_sums, sums[fresh]])
        seen_squares = np.vstack([seen_squares, squares[fresh]])
    return np.vstack([o.reshape(-1, 2) for o in out]) if out else np.zeros((0, 2))


def _random_history(tmp_path, node: dict, seed: int, versions: int = 50, rows: int = 300):
    """A history of ``versions`` edits, every version asked stats, kmeanspp and profile:
    (honest totals candidates, group candidates, the record of values and groups)."""
    rng = np.random.default_rng(seed)
    table = CellTable(blobs(rows, seed=seed), with_id=False)
    name = f"h{seed}-{node.get('min-cluster-size', 2)}"
    site, path = _site(tmp_path, node, name)
    site.server_floor = 1
    record, totals, groups, candidates = Record(), [], [], []
    for version in range(versions + 1):
        if version:
            edit_at_random(rng, table, version)
        table.write(path)
        totals.append(moments(site))
        if len(totals) > 1:
            candidates += totals_attack(totals[-2], totals[-1])
        groups.append(every_group(site, len(table.X)))
        if node.get("min-cluster-size", 2) > 1:
            record.add_version(site, table)
        else:
            record.values.update(table.values())
    if node.get("min-cluster-size", 2) > 1:  # the record is every table a reply left from
        released = {line["basis"]["table-number"]
                    for line in ledger.read(tmp_path / f"{name}-ledger.jsonl")}
        assert released == set(record.tables)
    return candidates, group_attack(groups), record


#: Seeds a floor runs here; ``bench/value_histories.py`` runs 10 a floor (BENCHMARKS.md).
SEEDS = 3


def history_findings(tmp_path, p: int, seed: int) -> tuple[set, set, tuple]:
    """One random history at floor ``p``: (values the honest coordinator's totals give,
    values the malicious one's groups give, this test's audit's findings)."""
    node = {} if p == 2 else {"min-cluster-size": p}
    honest, malicious, record = _random_history(tmp_path, node, seed)
    return recovered(honest, record.values), recovered(malicious, record.values), \
        record.findings()


@pytest.mark.parametrize("p", [2, 3, 5])
def test_random_histories_give_no_value_and_no_change(tmp_path, p):
    for seed in range(SEEDS):
        assert history_findings(tmp_path, p, seed) == (set(), set(), ([], [])), seed


def test_a_random_history_gives_values_from_a_site_answering_from_rows(tmp_path):
    honest, malicious, record = _random_history(tmp_path, {"min-cluster-size": 1}, 0)
    assert len(recovered(honest, record.values)) > 10
    assert len(recovered(malicious, record.values)) > 0.9 * len(record.values)


def test_the_independent_audit_finds_what_it_must():
    """The test's own audit is not blind: it finds a value two groups differ by, a pair a
    2-value unit gives with its sum, a row's change, and passes a pair of 2-row groups
    sharing a unit of 4 values."""
    def audit(groups: dict, unit: dict):
        """Groups of (row id, version) instances, one column; its cell a value per
        instance (a row's versions differ)."""
        record = Record()
        record.groups = {g: frozenset(rows) for g, rows in groups.items()}
        instances = {i for rows in groups.values() for i in rows}
        record.instances = {i: ((i[0], 0, i[1]),) for i in instances}
        record.values = {(i[0], 0, i[1]): 1.0 + 0.37 * i[0] ** 2 + 0.11 * i[1] for i in instances}
        record.unit = np.array([unit.get(g, g) for g in range(max(groups) + 1)])
        return record.findings()

    row = lambda *ids: [(i, 0) for i in ids]  # noqa: E731
    single, _ = audit({0: row(0, 1), 1: row(0, 1, 2)}, {1: 1})  # they differ by row 2's value
    assert (2, 0, 0) in single
    single, _ = audit({0: row(0, 1)}, {})  # its own unit: its sum and sum of squares
    assert {(0, 0, 0), (1, 0, 0)} <= set(single)
    _, changes = audit({0: row(0, 1, 2), 1: [(0, 1)] + row(1, 2)}, {})  # row 0 corrected
    assert changes == [((0, 0, 0), (0, 0, 1))]
    assert audit({0: row(0, 1), 1: row(2, 3)}, {1: 0}) == ([], [])  # a unit of 4 values


@pytest.mark.parametrize("with_id", [False, True])
def test_rows_corrected_in_the_same_feature_regroup_and_give_nothing(tmp_path, with_id):
    """Corrections in one feature of six rows of six groups, no new row: the six
    withdrawn groups, each whole with its corrected row, make groups of three
    (``joining.py``: a sum of three or more changes; every other feature a sum of sums
    released before), answered from at once; nothing a coordinator reads from the
    totals, the groups or their spreads gives a value or a change (this test's own
    audit). Then one row corrected in feature 1 and one in feature 2: each group's
    change alone, they wait."""
    table = CellTable(blobs(300, seed=7), with_id=with_id)
    site, path = _site(tmp_path, {}, f"same-{with_id}")
    site.server_floor = 1
    record, totals, groups = Record(), [], []

    def version() -> None:
        table.write(path)
        totals.append(moments(site))
        groups.append(every_group(site, len(table.X)))
        record.add_version(site, table)

    version()
    first = site.table_now()
    assert first.waiting == 0
    for row in (0, 50, 100, 150, 200, 250):
        table.correct(row, 0, 0.5)
    version()
    regrouped = site.table_now()
    assert regrouped.waiting == 0 and regrouped.n_rows == 300
    assert regrouped.n_groups < first.n_groups  # six withdrawn groups became two or three
    table.correct(10, 1, 0.5)
    table.correct(60, 2, -0.5)
    version()
    assert 4 <= site.table_now().waiting <= 18  # two whole former groups (of 2 to 9 rows)
    candidates = totals_attack(totals[0], totals[1]) + totals_attack(totals[1], totals[2])
    assert recovered(candidates, record.values) == set()
    assert recovered(group_attack(groups), record.values) == set()
    assert record.findings() == ([], [])

"""Versions of a site's data that only ever disclose groups (issue 43, must-show 2).

A deployed site reads a real file through its cache directory; the file changes between
runs: (a) a row deleted, (b) a cell corrected, with and without an id column, (c) rows
appended, (d) a random history of 50 versions mixing the three on a 2,000-row table. An
HONEST coordinator asks every version the same tasks (describe, stats, bounds, a
``local_kmeans`` with one local cluster per group, a ``lloyd`` and an ``evaluate``) and
compares versions.

- The control, a site answering from its rows (``min-cluster-size = 1``), gives the
  deleted row and the correction exactly, from ``describe`` and ``stats`` alone (its
  totals: mean x rows).
- A site at its defaults gives neither; and an audit re-run here, independently of the
  site's own (a floating-point SVD of the incidence of every group the site answered
  from, over the rows as this test knows them, versus the site's exact rational
  arithmetic over its own record), finds no row and no one-row change in the span of
  everything the site answered. What the site answered from is read from its kept group
  tables (each row's group) and checked against its replies: every group's count and
  mean from ``local_kmeans`` equal those of the rows the table puts in it.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from scipy.linalg import null_space

from fedcluster import client_app as client_module
from fedcluster.client_app.data import group_table
from fedcluster.client_app.data.site_data import load_site_file
from fedcluster.client_app.data.versions import Store
from fedcluster.client_app.release.audit import span as span_audit
from fedcluster.client_app.release.audit import support
from fedcluster.common.config import run_config_defaults
from fedcluster.simulation import InProcessGrid

from test_attacks import Coordinator

CONTROL = {"min-cluster-size": 1}  # answers from its rows
DEFAULT: dict = {}  # groups of at least 2 rows


# ------------------------------------------------------------------ a site reading a file
class Table:
    """A table the test edits version by version, each row with an id (kept in the file
    or not) and a content version: a row instance is (id, content version)."""

    def __init__(self, X: np.ndarray, with_id: bool) -> None:
        self.X = np.array(X, dtype=np.float64)
        self.ids = np.arange(len(X))
        self.edits = np.zeros(len(X), dtype=np.int64)
        self.next_id, self.with_id, self.version = len(X), with_id, 0

    def delete(self, rows) -> None:
        self.X, self.ids, self.edits = (np.delete(a, rows, axis=0) for a in (self.X, self.ids, self.edits))

    def correct(self, row: int, column: int, by: float) -> None:
        self.X[row, column] += by
        self.edits[row] += 1

    def append(self, rows: np.ndarray) -> None:
        self.X = np.vstack([self.X, rows])
        self.ids = np.r_[self.ids, self.next_id + np.arange(len(rows))]
        self.edits = np.r_[self.edits, np.zeros(len(rows), dtype=np.int64)]
        self.next_id += len(rows)

    def instances(self) -> list[tuple[int, int]]:
        return list(zip(self.ids.tolist(), self.edits.tolist()))

    def write(self, path: Path) -> None:
        """The file of this version (its mtime moved on: a new version to the site)."""
        head = ["id"] * self.with_id + ["a", "b", "c"][:self.X.shape[1]]
        lines = [",".join(([str(i)] if self.with_id else []) + [repr(float(v)) for v in row])
                 for i, row in zip(self.ids, self.X)]
        path.write_text(",".join(head) + "\n" + "\n".join(lines) + "\n")
        self.version += 1
        os.utime(path, ns=(self.version * 10**9, self.version * 10**9))


class FileSite(Coordinator):
    """The real ClientApp of one site reading ``path`` through ``cache`` (its Context kept
    between messages, as a SuperNode keeps it)."""

    def __init__(self, path: Path, cache: Path, node: dict, with_id: bool) -> None:
        config = {"data-path": str(path), "cache-dir": str(cache), "site-id": "target",
                  "ledger-path": "off", **({"id-column": "id"} if with_id else {}), **node}
        self.grid = InProcessGrid(client_module.app, [config], run_config_defaults())
        self.node_id = next(iter(self.grid.contexts))
        self.messages, self.server_floor = 0, 2
        self.path, self.cache, self.node, self.with_id = path, cache, node, with_id

    def close(self) -> None:
        pass

    def totals(self) -> tuple[int, np.ndarray]:
        """What an honest coordinator reads from describe + stats: the rows and, per
        feature, their sum (mean x rows)."""
        (mean, _, _), _ = self.ask("stats", [], scale="standard")
        self.ask("describe", [])
        rows = self.table_now().n_rows  # (describe's row count: Flower's num_examples)
        return rows, mean * rows

    def every_task(self, group_means: np.ndarray) -> dict:
        """The tasks of an honest run, once each (k-FED's local k-means, a DWF round, the
        evaluation, the bounds), and an evaluation against ``group_means`` (one centroid
        on each group's mean: its reply, a DWF round's, is every group's mean and count)."""
        C = group_means[:3]
        return {"bounds": self.ask("bounds", [])[0],
                "local_kmeans": self.ask("local_kmeans", [], **{"k-local": 3, "seed": 0})[0],
                "lloyd": self.ask("lloyd", [C], **{"local-iters": 1, "tol": 0.0})[0],
                "evaluate": self.ask("evaluate", [C])[0],
                "every group": self.ask("lloyd", [group_means], **{"local-iters": 1, "tol": 0.0})[0]}

    def table_now(self):
        """The group table this version answers from (as the site keeps it)."""
        site = load_site_file(self.path, cache_dir=self.cache,
                              id_column="id" if self.with_id else None)
        return group_table.site_groups(site, self.node.get("min-cluster-size", 2), self.cache)[0]


# ------------------------------------------------------------------ the independent audit
class Answered:
    """Every group a site answered from, over the row instances as this test knows them:
    read from the site's kept tables (each row's group) and checked against its replies."""

    def __init__(self) -> None:
        self.groups: set[frozenset] = set()
        self.index: dict[tuple[int, int], int] = {}

    def add_version(self, site: FileSite, table: Table) -> None:
        """Ask this version every task; record its groups (from the site's kept table),
        checked against what the site sent."""
        groups = site.table_now()
        row_groups = np.asarray(np.load(f"{_entry_of_groups(site.cache, groups)}.row-groups.npy"))
        instances = table.instances()
        order = np.argsort(row_groups, kind="stable")
        members = np.split(order, np.searchsorted(row_groups[order], np.arange(1, groups.n_groups)))
        members[0] = members[0][row_groups[members[0]] == 0]  # (rows waiting sort first)
        means = np.array([table.X[m].mean(0) for m in members])
        replies = site.every_task(means)
        # the record is what was answered: one centroid on each group's mean, the site's
        # per-cluster means and counts are those of the rows its table puts in each group
        got_means, counts = replies["every group"]
        np.testing.assert_array_equal(counts, [m.size for m in members])
        np.testing.assert_allclose(got_means, means, rtol=1e-12, atol=1e-9)
        self.groups.update(frozenset(self.index.setdefault(instances[r], len(self.index))
                                     for r in m) for m in members)

    def span_findings(self) -> tuple[list, list]:
        """(instances in the span, one-row changes in the span), by an SVD of the
        incidence, per connected component: an instance is in the span when its row of
        the null space is zero, two versions of a row when their rows are equal."""
        from scipy.sparse import coo_matrix
        from scipy.sparse.csgraph import connected_components

        order = sorted(self.groups, key=sorted)
        rows = np.repeat(np.arange(len(order)), [len(m) for m in order])
        cols = np.concatenate([sorted(m) for m in order]) + len(order)
        size = len(order) + len(self.index)
        _, label = connected_components(coo_matrix((np.ones(rows.size), (rows, cols)),
                                                   shape=(size, size)), directed=False)
        null_rows = {}
        for c in np.unique(label[:len(order)]):
            groups = np.flatnonzero(label[:len(order)] == c)
            instances = np.flatnonzero(label[len(order):] == c)
            A = np.zeros((groups.size, instances.size))
            for i, g in enumerate(groups):
                A[i, np.searchsorted(instances, sorted(order[g]))] = 1.0
            N = null_space(A)
            null_rows.update({j: N[k] for k, j in enumerate(instances)})
        single = [key for key, j in self.index.items() if np.linalg.norm(null_rows[j]) < 1e-9]
        by_id: dict[int, list[int]] = {}
        for (row_id, _), j in self.index.items():
            by_id.setdefault(row_id, []).append(j)
        changes = [(row_id, u, w) for row_id, js in by_id.items() for k, u in enumerate(js)
                   for w in js[k + 1:] if label[len(order) + u] == label[len(order) + w]
                   and np.linalg.norm(null_rows[u] - null_rows[w]) < 1e-9]
        return single, changes


def blobs(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = rng.normal(scale=5.0, size=(5, 3))
    return centres[rng.integers(5, size=n)] + rng.normal(size=(n, 3))


# ------------------------------------------------------------------ (a), (b), (c)
def _two_versions(tmp_path, node, with_id, edit, rows=300):
    """The totals an honest coordinator reads before and after ``edit``, and the site."""
    table = Table(blobs(rows), with_id)
    path, cache = tmp_path / "site.csv", tmp_path / f"cache-{node.get('min-cluster-size', 2)}"
    site = FileSite(path, cache, node, with_id)
    answered = Answered()
    totals = []
    for step in range(2):
        if step:
            edit(table)
        table.write(path)
        totals.append(site.totals())
        if node is DEFAULT:
            answered.add_version(site, table)
    return totals[0], totals[1], answered, table


EDITS = {
    "row deleted": (lambda t: t.delete([17]), lambda X, before, after: X[17]),
    "cell corrected": (lambda t: t.correct(17, 1, 0.75), lambda X, before, after: np.array([0, 0.75, 0])),
}


@pytest.mark.parametrize("with_id", [False, True], ids=["no id", "id column"])
@pytest.mark.parametrize("name", list(EDITS))
def test_a_deleted_row_or_a_correction_leaves_only_a_site_that_answers_from_rows(
        tmp_path, name, with_id):
    edit, leaked = EDITS[name]
    X = blobs(300)
    (n0, s0), (n1, s1), _, _ = _two_versions(tmp_path, CONTROL, with_id, edit)
    difference = s0 - s1 if name == "row deleted" else s1 - s0
    np.testing.assert_allclose(difference, leaked(X, s0, s1), atol=1e-9)  # exactly, to rounding
    (n0, s0), (n1, s1), answered, _ = _two_versions(tmp_path, DEFAULT, with_id, edit)
    difference = s0 - s1 if name == "row deleted" else s1 - s0
    assert np.abs(difference - leaked(X, s0, s1)).max() > 0.1
    single, changes = answered.span_findings()
    assert single == [] and changes == []


def test_appended_rows_keep_every_earlier_group_and_leave_no_row(tmp_path):
    before, after, answered, table = _two_versions(
        tmp_path, DEFAULT, False, lambda t: t.append(blobs(41, seed=3)))
    assert after[0] > before[0]
    assert answered.span_findings() == ([], [])


# ------------------------------------------------------------------ (d) a history
def test_a_random_history_of_50_versions_gives_no_row_and_no_change(tmp_path):
    rng = np.random.default_rng(7)
    table = Table(blobs(2000, seed=1), with_id=False)
    path, cache = tmp_path / "site.csv", tmp_path / "cache"
    site = FileSite(path, cache, DEFAULT, False)
    answered = Answered()
    for version in range(51):
        if version:
            change = rng.integers(3)
            if change == 0:
                table.delete(rng.choice(len(table.X), rng.integers(1, 6), replace=False))
            elif change == 1:
                for _ in range(rng.integers(1, 6)):
                    table.correct(int(rng.integers(len(table.X))), int(rng.integers(3)), rng.normal())
            else:
                table.append(blobs(int(rng.integers(5, 31)), seed=100 + version))
        table.write(path)
        site.totals()
        answered.add_version(site, table)
    single, changes = answered.span_findings()
    assert single == [] and changes == []
    records = Store.read_tables(Path(site.table_now().table_ref.store))
    assert len(records) == 51 and sum(r.get("withdrawn-groups", 0) for r in records) > 20


def test_the_previous_release_grouping_each_version_afresh_gave_rows_away(tmp_path, monkeypatch):
    """Without the versions rule (each version grouped afresh, as the release before it
    did: here, a new history per version), the same deletion puts rows in the span."""
    from fedcluster.client_app.data import versions

    path_for, data = versions.Store.path_for, tmp_path / "site.csv"
    monkeypatch.setattr(versions.Store, "path_for", classmethod(  # a history per version
        lambda cls, cache, reading: path_for(cache, f"{os.stat(data).st_mtime_ns}{reading}")))
    _, _, answered, _ = _two_versions(tmp_path, DEFAULT, False, EDITS["row deleted"][0])
    single, _ = answered.span_findings()
    assert len(single) > 10


# ------------------------------------------------------------------ the audit itself
def _svd_verdict(member_lists: list[list[int]], p: int, pairs) -> str | None:
    """An independent verdict on one component: the smallest support below p found by
    trying every set of fewer than p instances (is its complement's rank lower?), and
    the ``pairs`` whose difference lies in the row space, by floating-point SVD."""
    import itertools

    instances = sorted({i for m in member_lists for i in m})
    A = np.zeros((len(member_lists), len(instances)))
    for g, m in enumerate(member_lists):
        A[g, [instances.index(i) for i in m]] = 1.0
    rank = np.linalg.matrix_rank(A)
    for size in range(1, p):
        for chosen in itertools.combinations(range(len(instances)), size):
            rest = np.delete(A, chosen, axis=1)
            if np.linalg.matrix_rank(rest) < rank:
                return "small"
    if p <= 2:
        N = null_space(A)
        for u, w in pairs:
            if np.linalg.norm(N[instances.index(u)] - N[instances.index(w)]) < 1e-9:
                return "change"
    return None


@pytest.mark.parametrize("p", [2, 3, 4])
def test_the_audit_agrees_with_an_svd_on_random_components(p):
    """Random components (old groups, and new groups of their rows and fresh ones): the
    site's audit never passes what an independent floating-point check finds (sound);
    at p 2 and 3, and on the components that make chains or a bipartite graph at every
    p, it gives the same verdict (exact); at p 4 on the others its linear-programming
    bound refuses some components the check passes, fewer than a third of them."""

    rng = np.random.default_rng(p)
    verdicts = {None: 0, "small": 0, "change": 0}
    bounded = refused = 0
    for _ in range(120):
        n_old, lists, next_instance = int(rng.integers(1, 4)), [], 0
        for _ in range(n_old):
            size = int(rng.integers(p, 2 * p))
            lists.append(list(range(next_instance, next_instance + size)))
            next_instance += size
        for _ in range(int(rng.integers(1, 4))):  # new groups: some old rows, a few fresh
            take = min(next_instance, int(rng.integers(1, 2 * p)))
            old = [int(i) for i in rng.choice(next_instance, take, replace=False)]
            fresh = list(range(next_instance, next_instance + int(rng.integers(0, 3))))
            next_instance += len(fresh)
            if len(set(old + fresh)) >= p:
                lists.append(sorted(set(old + fresh)))
        same = {(u, w) for u in range(next_instance) for w in range(u + 1, next_instance)
                if rng.random() < 0.2}
        same_row = lambda u, w, same=same: (min(u, w), max(u, w)) in same  # noqa: E731
        arrays = [np.array(m) for m in lists]
        mine = span_audit.component_finding(arrays, p, same_row)
        theirs = _svd_verdict(lists, p, sorted(same))
        expected = {None: None, "small": "isolates", "change": "two versions"}[theirs]
        if theirs is not None:  # sound: what the check finds, the audit refuses
            assert mine is not None and expected in mine, (lists, mine, theirs)
        exact = p <= 3 or span_audit._smallest_cut(arrays) is not None or \
            support.graph_cut(support.atoms(arrays)) is not None
        if exact:
            assert (mine is None) == (theirs is None), (lists, mine, theirs)
        elif theirs is None:
            bounded += 1
            refused += mine is not None
        verdicts[theirs] += 1
    assert verdicts[None] > 10 and verdicts["small"] > 10  # both verdicts were exercised
    if p == 2:
        assert verdicts["change"] > 3
    assert refused <= bounded / 3, (refused, bounded)


# ------------------------------------------------------------------ the DP budget follows
def test_the_dp_budget_follows_the_data_across_versions_and_keeps_what_was_spent(tmp_path):
    """The budget is kept per data lineage: a corrected row (a new version) does not
    start a fresh one; and a ledger an earlier release kept under the rows' fingerprint
    is carried into it."""
    import json as json_

    from fedcluster.common import privacy

    cache = tmp_path / "cache"
    (cache / "privacy-budget").mkdir(parents=True)
    rho = privacy.rho_from_epsilon(2.0, 1e-5)
    legacy = {"data": "f" * 64, "runs": {"7": {"planned-rho": None, "spent-rho": 0.1 * rho, "tasks": 2}}}
    (cache / "privacy-budget" / f"budget-{'f' * 40}.json").write_text(json_.dumps(legacy))
    table = Table(blobs(300), with_id=False)
    path = tmp_path / "site.csv"
    site = FileSite(path, cache, {"dp-budget": "2"}, False)
    dp = {"dp-rho": 0.4 * rho, "data-bounds": "-20:20"}
    C = np.array([[-1.0, 0, 0], [1.0, 0, 0]])
    table.write(path)
    site.lloyd(C, **dp)
    table.correct(5, 0, 1.0)
    table.write(path)
    site.lloyd(C, **dp)  # the same lineage: 0.1 + 0.8 of its rho spent, too little left
    refusal = site.refusal(C, **dp)
    assert "dp-budget=2" in refusal
    ledgers = [json_.loads(p.read_text()) for p in (cache / "privacy-budget").glob("budget-*.json")]
    (lineage,) = [lg for lg in ledgers if str(lg["data"]).startswith("lineage-")]
    assert lineage["runs"]["carried"]["spent-rho"] == pytest.approx(0.1 * rho)
    assert sum(r["spent-rho"] for r in lineage["runs"].values()) == pytest.approx(0.9 * rho)


# ------------------------------------------------------------------ describe's figures
SCHEMA = """
[[columns]]
name = "a"
missing = "impute-mean"

[[columns]]
name = "b"
missing = "drop-row"

[[columns]]
name = "c"
"""


def test_describes_counts_move_only_by_whole_groups(tmp_path):
    """``describe``'s rows dropped and missing cells come from the groups: one dropped row
    deleted, or one missing cell filled in, does not move them by one."""
    import json as json_

    rng = np.random.default_rng(4)
    X = blobs(300)
    X[rng.choice(300, 30, replace=False), 0] = np.nan  # a: 30 cells missing (imputed)
    dropped = rng.choice(300, 7, replace=False)
    X[dropped, 1] = np.nan  # b: 7 rows dropped
    path, schema = tmp_path / "site.csv", tmp_path / "schema.toml"
    schema.write_text(SCHEMA)
    node = {"data-path": str(path), "cache-dir": str(tmp_path / "cache"), "site-id": "s",
            "schema-path": str(schema), "ledger-path": "off"}
    site = FileSite.__new__(FileSite)
    site.grid = InProcessGrid(client_module.app, [node], run_config_defaults())
    site.node_id, site.messages, site.server_floor = next(iter(site.grid.contexts)), 0, 2

    def describe(rows: np.ndarray, version: int):
        text = "\n".join(",".join("" if np.isnan(v) else repr(float(v)) for v in r) for r in rows)
        path.write_text("a,b,c\n" + text + "\n")
        os.utime(path, ns=(version * 10**9, version * 10**9))
        metrics = site.ask("describe", [])[1]
        return json_.loads(metrics["rows-dropped"]), json_.loads(metrics["cells-missing"])["a"]

    dropped_1, missing_1 = describe(X, 1)
    assert dropped_1 == 7  # the file's own at the first version (groups of 2 and 3)
    dropped_2, _ = describe(np.delete(X, dropped[0], axis=0), 2)
    assert dropped_1 - dropped_2 >= 2  # a whole group went, not one row
    Y = np.delete(X, dropped[0], axis=0)
    Y[np.flatnonzero(np.isnan(Y[:, 0]) & ~np.isnan(Y[:, 1]))[0], 0] = 1.5  # a cell filled in
    _, missing_3 = describe(Y, 3)
    # the groups' own count: their rows less their present cells (whole groups only;
    # rows waiting, and cells counted missing by the lone-cell rule, as the groups keep them)
    from fedcluster.client_app.data.schema_table import load_schema_table
    from fedcluster.common.schema import load_schema

    table = load_schema_table(path, load_schema(schema), cache_dir=tmp_path / "cache")
    groups = group_table.site_groups(table, 2, tmp_path / "cache")[0]
    assert missing_3 == int(np.asarray(groups.counts).sum() - np.asarray(groups.present)[:, 0].sum())
    assert groups.waiting > 0  # the corrected row's group was withdrawn: its rows wait


def test_site_check_shows_the_versions_and_what_the_audit_held_back(tmp_path):
    from fedcluster.client_app.site_check import check
    from fedcluster.common.schema import load_schema

    schema = tmp_path / "schema.toml"
    schema.write_text(SCHEMA.replace('missing = "impute-mean"', "").replace('missing = "drop-row"', ""))
    table, path, cache = Table(blobs(200), with_id=False), tmp_path / "site.csv", tmp_path / "cache"
    table.write(path)
    check(path, load_schema(schema), cache_dir=cache, record=True)  # as the site answering
    table.delete([3, 4, 5])
    table.write(path)
    report = check(path, load_schema(schema), cache_dir=cache)
    lines = report.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("Versions of this data"))
    first, second = lines[at + 2].split(" | "), lines[at + 3].split(" | ")
    assert first[0] == "1" and second[0] == "2 (this one)" and second[3] == "197"
    assert first[1] == second[1] == str(path)  # the file each version was read from
    withdrawn = int(second[5].split()[0])
    assert 1 <= withdrawn <= 3 and int(second[4].split()[0]) < 197  # kept: untouched groups' rows


def test_a_raised_min_cluster_size_merges_earlier_groups_whole(tmp_path):
    """The same data at a larger p_site (the same cache): the groups under the new size are
    withdrawn, and the new groups are unions of them (each answered from already, so the
    union discloses nothing new), not a fresh partition of the rows."""
    table, path, cache = Table(blobs(300), with_id=False), tmp_path / "site.csv", tmp_path / "cache"
    table.write(path)
    site = load_site_file(path, cache_dir=cache)
    before = group_table.site_groups(site, 2, cache)[0]
    before_rows = np.asarray(np.load(f"{_entry_of_groups(cache, before)}.row-groups.npy"))
    after = group_table.site_groups(site, 4, cache)[0]
    after_rows = np.asarray(np.load(f"{_entry_of_groups(cache, after)}.row-groups.npy"))
    assert after.min_size == 4 and np.asarray(after.counts).min() >= 4
    for g in range(after.n_groups):  # each new group: whole earlier groups
        earlier = np.unique(before_rows[after_rows == g])
        assert np.isin(before_rows, earlier).sum() == (after_rows == g).sum()
    assert after.waiting <= 3  # at most one earlier group left alone


def _entry_of_groups(cache: Path, groups) -> Path:
    """The kept entry of a site's group table (its files' common prefix)."""
    tables = Store.read_tables(Path(groups.table_ref.store))
    return cache / "groups" / tables[groups.table_ref.number]["entry"]


def _chains(rng, p: int) -> list[list[int]]:
    """A component as the versions rule makes them: groups withdrawn (some rows gone),
    their other rows moved whole, as units, into new groups with fresh rows or with other
    units; so an instance's groups form a chain and a group has at most one child."""
    groups, alive, next_instance = [], [], 0
    for _ in range(int(rng.integers(2, 4))):
        size = int(rng.integers(p, 2 * p))
        groups.append(list(range(next_instance, next_instance + size)))
        alive.append(True)
        next_instance += size
    for _ in range(int(rng.integers(1, 4))):
        open_groups = [g for g, a in enumerate(alive) if a]
        withdrawn = [int(g) for g in rng.choice(open_groups, min(len(open_groups), int(rng.integers(1, 3))),
                                                replace=False)]
        units = []
        for g in withdrawn:
            alive[g] = False
            survivors = [i for i in groups[g] if rng.random() > 0.3]
            units += survivors
        fresh = list(range(next_instance, next_instance + int(rng.integers(0, p + 1))))
        next_instance += len(fresh)
        if len(units) + len(fresh) >= p:
            groups.append(sorted(units + fresh))
            alive.append(True)
    return groups


@pytest.mark.parametrize("p", [3, 4, 5])
def test_the_audits_cut_on_chains_agrees_with_a_brute_force_check(p):
    """Components of chains (as the versions rule builds them) are audited by a minimum
    cut: its verdict equals the brute-force one (every set of fewer than p instances)."""
    rng = np.random.default_rng(10 + p)
    verdicts = {None: 0, "small": 0}
    for _ in range(60 if p < 5 else 25):
        lists = _chains(rng, p)
        arrays = [np.array(m) for m in lists]
        assert span_audit._smallest_cut(arrays) is not None  # they are chains
        mine = span_audit.component_finding(arrays, p, lambda u, w: False)
        theirs = _svd_verdict(lists, p, [])
        assert (mine is None) == (theirs is None), (lists, mine, theirs)
        verdicts[theirs] += 1
    assert verdicts[None] >= 5 and verdicts["small"] >= 2, verdicts  # both exercised


def test_a_table_an_earlier_release_kept_joins_the_history(tmp_path):
    """A site upgraded from the release before versions: its kept table (and the pointer
    that named it) is taken into the history as answered from, and kept bit for bit."""
    import json as json_

    from fedcluster.client_app.data import group_entries

    table, path, cache = Table(blobs(200), with_id=False), tmp_path / "site.csv", tmp_path / "cache"
    table.write(path)
    site = load_site_file(path, cache_dir=cache)
    first = group_table.site_groups(site, 2, cache)[0]
    entry = _entry_of_groups(cache, first)
    # as the earlier release left it: no history, the entry without its place in one,
    # and the pointer naming the file's latest entry
    shutil.rmtree(first.table_ref.store)
    meta = json_.loads(Path(f"{entry}.json").read_text())
    Path(f"{entry}.json").write_text(json_.dumps({k: v for k, v in meta.items()
                                                  if k not in ("table", "lineage", "rows-dropped")}))
    pointer = group_entries.lineage_path(cache / "groups", site, 2)
    pointer.write_text(json_.dumps({"entry": entry.name}))
    again = group_table.site_groups(load_site_file(path, cache_dir=cache), 2, cache)[0]
    np.testing.assert_array_equal(np.asarray(again.sums), np.asarray(first.sums))
    tables = Store.read_tables(Path(again.table_ref.store))
    assert tables[0].get("imported") and len(tables) == 2 and tables[1]["kept-rows"] == 200


def test_the_cut_below_p_merges_heavy_edges_and_agrees_with_the_full_cut():
    """``support.minimum_cut(..., below=p)`` merges the ends of every edge of p or more
    first (a site's groups are nearly all such edges): on random graphs its verdict (a cut
    under p or none) is the full cut's, and the edges it says it cuts weigh what it says."""
    rng = np.random.default_rng(5)
    verdicts = {True: 0, False: 0}
    for _ in range(200):
        n = int(rng.integers(3, 12))
        ends = rng.integers(0, n, size=(int(rng.integers(2, 25)), 2))
        ends = ends[ends[:, 0] != ends[:, 1]]
        if not ends.size:
            continue
        capacity = rng.choice([1, 1, 2, 3, 5, 8], size=ends.shape[0])
        p = int(rng.integers(2, 6))
        full, full_cut = support.minimum_cut(ends, capacity, n)
        fast, fast_cut = support.minimum_cut(ends, capacity, n, below=p)
        assert (full < p) == (fast < p), (ends.tolist(), capacity.tolist(), p, full, fast)
        assert capacity[full_cut].sum() == full
        if fast < p:
            assert capacity[fast_cut].sum() == fast and fast_cut.any()
        verdicts[full < p] += 1
    assert min(verdicts.values()) > 20, verdicts


def test_same_row_over_many_instances_agrees_with_every_pair():
    """``SameRow.any_pair`` (one pass over a report's one-row atoms, which number in the
    hundreds of thousands on a large site) says what the pairwise test says, with ids and
    without (tables seen, lineages, instances never seen in a table)."""
    import itertools

    from fedcluster.client_app.release.record.instances import SameRow

    rng = np.random.default_rng(3)
    answers = set()
    for trial in range(300):
        n = int(rng.integers(2, 9))
        first = rng.integers(0, 5, size=n)
        seen = np.c_[first, first + rng.integers(0, 3, size=n), rng.integers(0, 2, size=n) * (trial % 3 == 0),
                     rng.random(n) > 0.05]
        ids = rng.integers(0, 6, size=(n, 1)) if trial % 2 else None
        same = SameRow(ids, seen)
        pick = rng.choice(n, size=int(rng.integers(2, n + 1)), replace=False)
        pairwise = any(same(int(u), int(w)) for u, w in itertools.combinations(pick.tolist(), 2))
        assert same.any_pair(pick) == pairwise, (seen[pick].tolist(), None if ids is None else ids[pick].tolist())
        answers.add(pairwise)
    assert answers == {True, False}


@pytest.mark.parametrize("first_words_collide", [False, True])
def test_occurrence_ranks_rows_alike_in_file_order(first_words_collide):
    """The k-th row of a key in file order is its k-th instance: each row's rank among
    the rows with its whole key, counted here by hand. Where two keys share their first
    word (a 64-bit collision, made on purpose) they are still counted apart."""
    from fedcluster.client_app.release.record.instances import _occurrence

    rng = np.random.default_rng(11)
    distinct = rng.integers(0, 2**63, size=(300, 2), dtype=np.int64).astype(np.uint64)
    if first_words_collide:
        distinct[1::3, 0] = distinct[0::3, 0][: len(distinct[1::3])]
    keys = distinct[rng.integers(0, len(distinct), size=5000)]
    seen: dict[tuple[int, int], int] = {}
    expected = []
    for k0, k1 in keys.tolist():
        expected.append(seen.get((k0, k1), 0))
        seen[(k0, k1)] = expected[-1] + 1
    np.testing.assert_array_equal(_occurrence(keys), expected)
    assert _occurrence(keys[:0]).shape == (0,)

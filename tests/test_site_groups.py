"""A site's groups (issue 35): the statistics a group keeps, the run's space, where the
table is kept, data that grow (must-show 5), the deployed build (memory-mapped rows, the
table written chunk by chunk in canonical order: the same table as in memory, for any
thread count), and the boundary: site tasks receive the group table, never rows."""

from __future__ import annotations

import ast
import inspect
import logging
import os
import typing
from pathlib import Path

import numpy as np
import pytest

from fedcluster.client_app import private_tasks, tasks
from fedcluster.client_app.data import group_stats, group_table, grouped_rows, grouping
from fedcluster.client_app.private_rows import ClippedRows
from fedcluster.client_app.data.site_data import SiteData, load_site_file
from fedcluster.client_app.site_groups import SiteGroups, TableFacts
from fedcluster.common.scaling import FeatureTransform
from reference import num_threads


def _site(X, labels=None, source="site") -> SiteData:
    return SiteData(np.ascontiguousarray(X, dtype=np.float64), None, labels, source)


def as_the_groups_keep_them(X: np.ndarray, group_of_row: np.ndarray, p_site: int,
                            shown: np.ndarray | None = None) -> np.ndarray:
    """The rows with the cells the groups count as missing set NaN: per group, a
    feature's present cells where they number 1 to p_site - 1 (computed here from the
    rows, not by the site's code), but where the table shows them all (``shown``: its
    present cells; a report's part shows the few cells of a feature it carries at a
    stood-in mean, ``report_table.py``)."""
    grouped = group_of_row >= 0
    n_groups = int(group_of_row.max()) + 1
    present = np.stack([np.bincount(group_of_row[grouped], weights=~np.isnan(X[grouped, j]),
                                    minlength=n_groups) for j in range(X.shape[1])], axis=1)
    lone = (present > 0) & (present < p_site)
    if shown is not None:
        lone &= np.asarray(shown) != present
    return np.where(grouped[:, None] & lone[np.maximum(group_of_row, 0)], np.nan, X)


def with_kept_means(X: np.ndarray, group_of_row: np.ndarray, groups) -> np.ndarray:
    """Rows whose groups have the means the site keeps (``groups``: its SiteGroups): where
    the p% rule on means stood the site's mean in for a group's sum (release/dominance.py),
    the group's present cells shifted to that mean; elsewhere the rows as they are."""
    out = np.array(X, dtype=np.float64, copy=True)
    sums = np.asarray(groups.sums)
    cells = np.asarray(groups.present) if groups.present is not None else \
        np.repeat(np.asarray(groups.counts)[:, None], X.shape[1], axis=1)
    order = np.argsort(group_of_row, kind="stable")
    starts = np.searchsorted(group_of_row[order], np.arange(len(cells) + 1))
    for g in range(len(cells)):
        rows = order[starts[g]:starts[g + 1]]
        for j in np.flatnonzero(cells[g] > 0):
            present = rows[~np.isnan(X[rows, j])]
            if present.size != cells[g, j]:  # (the lone-cell rule's: counted missing)
                continue
            kept = sums[g, j] / cells[g, j]
            if not np.isclose(X[present, j].mean(), kept, rtol=1e-12, atol=1e-12):
                out[present, j] += kept - X[present, j].mean()
    return out


def with_kept_spreads(X: np.ndarray, group_of_row: np.ndarray, kept_m2: np.ndarray) -> np.ndarray:
    """Rows whose groups have the spreads the site keeps (``kept_m2``: (G, d), its table's
    m2, a unit's share or a withheld spread's stand-in: release/spreads.py): each group's
    present cells moved about their mean so that their squared deviations add up to the
    kept m2 (scaled; equal cells spread as +-sqrt(m2 / 2) on two of them). Pooled
    statistics of these rows are those of the groups as the site keeps them."""
    out = np.array(X, dtype=np.float64, copy=True)
    for g in range(int(group_of_row.max()) + 1):
        rows = np.flatnonzero(group_of_row == g)
        for j in range(X.shape[1]):
            cells = rows[~np.isnan(X[rows, j])]
            if cells.size == 0:
                continue
            mean = X[cells, j].mean()
            deviation = X[cells, j] - mean
            own = float((deviation ** 2).sum())
            if own > 0:
                out[cells, j] = mean + deviation * np.sqrt(kept_m2[g, j] / own)
            elif kept_m2[g, j] > 0:
                step = np.zeros(cells.size)
                step[:2] = [1.0, -1.0]
                out[cells, j] = mean + step * np.sqrt(kept_m2[g, j] / 2.0)
    return out


@pytest.fixture
def blobs():
    rng = np.random.default_rng(3)
    return rng.normal(size=(500, 4)) * [1.0, 10.0, 0.1, 1e3] + [0.0, 5.0, -3.0, 1e6]


# ------------------------------------------------------------------ the statistics
def test_a_group_keeps_its_count_sums_and_squares_exactly(blobs):
    labels = np.random.default_rng(1).integers(3, size=len(blobs))
    groups, group_of_row = group_table.build(_site(blobs, labels), 3)
    assert groups.counts.min() >= 3 and groups.n_rows == len(blobs) and groups.waiting == 0
    for g in (0, 7, groups.n_groups - 1):
        rows = blobs[group_of_row == g]
        assert groups.counts[g] == len(rows)
        np.testing.assert_allclose(groups.sums[g], rows.sum(0), rtol=1e-13)
        np.testing.assert_allclose(groups.m2[g], ((rows - rows.mean(0)) ** 2).sum(0),
                                   rtol=1e-9, atol=1e-9)
    table = groups.labels.contingency(np.zeros(groups.n_groups, dtype=int), 1)
    np.testing.assert_array_equal(table[:, 0], np.bincount(labels))


@pytest.mark.parametrize("p", [2, 3])
def test_in_the_runs_space_sums_and_squares_are_those_of_the_filled_scaled_rows(blobs, p):
    X = blobs.copy()
    X[np.random.default_rng(2).random(X.shape) < 0.1] = np.nan
    # the last feature present in p - 1 rows only: no merge of groups mends them
    # (present_groups.py), so the rule withholds them and the run fills them
    X[:p - 1, 3], X[p - 1:, 3] = blobs[:p - 1, 3], np.nan
    site = SiteData(X, None, None, "site", table=TableFacts(None, "", 0, {"a": 1}))
    groups, group_of_row = group_table.build(site, p)
    assert groups.present is not None
    transform = FeatureTransform("standard", np.array([0.5, 5.0, -3.0, 1e6]),
                                 np.array([2.0, 10.0, 0.1, 1e3]), np.array([0.1, 4.0, -3.1, 1e6 + 5]))
    view = groups.in_run_space(transform)
    kept = as_the_groups_keep_them(X, group_of_row, p)
    # (p - 1 present cells of the last feature: each in a group with fewer than p of it)
    assert groups.cells_withheld == int(np.isnan(kept).sum() - np.isnan(X).sum()) > 0
    Z = transform.apply(kept)
    # a group keeps its own m2 where it is a spread unit of its own (p >= 3) and no rule
    # withholds it (release/spreads.py): there the filled, scaled m2 is the rows'
    own = np.array([np.nansum((kept[group_of_row == g] - np.nanmean(kept[group_of_row == g], 0)) ** 2, 0)
                    for g in range(groups.n_groups)])
    its_own = np.isclose(np.asarray(groups.m2), own, rtol=1e-9, atol=1e-12)
    if p >= 3:
        assert its_own.mean() > 0.95
    for g in range(0, groups.n_groups, 37 if p == 2 else 7):
        rows = Z[group_of_row == g]
        np.testing.assert_allclose(view.sums[g], rows.sum(0), rtol=1e-11, atol=1e-9)
        if p >= 3 and its_own[g].all():
            np.testing.assert_allclose(view.m2[g], ((rows - rows.mean(0)) ** 2).sum(0), rtol=1e-8,
                                       atol=1e-8)
    assert view.missing_features() == []
    # a feature the run does not fill stays missing: a task then refuses, naming it
    unfilled = transform.with_fill(np.array([0.1, np.nan, -3.1, 1e6 + 5]))
    assert groups.in_run_space(unfilled).missing_features() == [1]


def test_a_clipping_box_moves_each_group_whole(blobs):
    groups, _ = group_table.build(_site(blobs), 2)
    lo, hi = np.array([-1.0, 0.0, -3.05, 1e6]), np.array([1.0, 10.0, -2.95, 1e6 + 100])
    clipped = groups.clipped(lo, hi)
    np.testing.assert_allclose(clipped.means, np.clip(groups.means, lo, hi), rtol=1e-15)
    np.testing.assert_array_equal(clipped.m2, groups.m2)  # its spread kept


def test_groups_of_one_row_are_the_rows(blobs):
    groups, grouped = group_table.site_groups(_site(blobs), 1)
    assert groups.singletons and grouped is None and groups.min_size == 1
    assert groups.means is groups.sums and np.shares_memory(groups.sums, blobs) or \
        np.array_equal(groups.sums, blobs)
    assert groups.scatter.sum() == 0.0


def test_fewer_rows_than_p_make_no_group():
    groups, grouped = group_table.site_groups(_site(np.arange(6.0).reshape(3, 2)), 4)
    assert groups.n_groups == 0 and groups.waiting == 3 and not grouped.any()


# ------------------------------------------------------------------ kept, and grown
def _write_csv(path: Path, X: np.ndarray) -> None:
    lines = ["a,b,c"] + [",".join(repr(float(v)) for v in row) for row in X]
    path.write_text("\n".join(lines) + "\n")


def _load(path: Path, cache: Path, p: int = 2):
    site = load_site_file(path, cache_dir=cache)
    return site, *group_table.site_groups(site, p, cache)


def _grown(path: Path, cache: Path, write, first: np.ndarray, grown: np.ndarray):
    """The groups of ``first`` written to ``path``, then ``_load``'s answer once the file
    holds ``grown`` (rows appended, its mtime moved on: a new version of the file), after
    checking that the earlier groups are kept bit for bit."""
    write(path, first)
    _, before, _ = _load(path, cache)
    write(path, grown)
    os.utime(path, ns=(os.stat(path).st_atime_ns, os.stat(path).st_mtime_ns + 10**9))
    loaded = _load(path, cache)
    after = loaded[1]
    for name in ("counts", "sums", "m2"):
        np.testing.assert_array_equal(np.asarray(getattr(after, name))[:before.n_groups],
                                      np.asarray(getattr(before, name)))
    return before, loaded


def test_a_file_keeps_its_table_in_its_cache_and_reads_it_back(tmp_path, blobs, monkeypatch):
    path = tmp_path / "site.csv"
    _write_csv(path, blobs[:200, :3])
    _, first, _ = _load(path, tmp_path / "cache")
    assert list((tmp_path / "cache" / "groups").glob("*.json"))
    # a fresh process reads the table back: the grouping is not run again
    monkeypatch.setattr(grouped_rows, "group_rows", lambda *a: pytest.fail("grouped again"))
    group_table._MEMORY.clear()
    _, again, _ = _load(path, tmp_path / "cache")
    assert again.digest == first.digest
    np.testing.assert_array_equal(again.sums, first.sums)


def test_a_file_that_grows_keeps_its_earlier_groups_bit_for_bit(tmp_path, blobs, caplog):
    path, cache = tmp_path / "site.csv", tmp_path / "cache"
    X = blobs[:, :3]
    before, (site, after, grouped) = _grown(path, cache, _write_csv, X[:300], X[:420])
    G = before.n_groups
    assert after.n_groups > G and after.n_rows == 420 and after.waiting == 0 and grouped is None
    # the new groups are the new rows' own: their sums add up to the rows appended
    np.testing.assert_allclose(np.asarray(after.sums)[G:].sum(0), X[300:420].sum(0), rtol=1e-12)
    # one more row: fewer than p new rows wait, in no group, used by no task
    _write_csv(path, X[:421])
    os.utime(path, ns=(os.stat(path).st_atime_ns, os.stat(path).st_mtime_ns + 2 * 10**9))
    _, waiting, grouped = _load(path, cache)
    assert waiting.waiting == 1 and waiting.n_rows == 420 and grouped.sum() == 420
    np.testing.assert_array_equal(np.asarray(waiting.sums), np.asarray(after.sums))
    # a second new row: the two form a group of their own
    _write_csv(path, X[:422])
    os.utime(path, ns=(os.stat(path).st_atime_ns, os.stat(path).st_mtime_ns + 3 * 10**9))
    _, grown, _ = _load(path, cache)
    assert grown.waiting == 0 and grown.n_groups == after.n_groups + 1
    np.testing.assert_array_equal(np.asarray(grown.sums)[-1], X[420:422].sum(0))
    # a row removed: its group is withdrawn whole (its other rows wait: no new row to
    # join), every other group kept bit for bit (tests/test_versions.py: the audit)
    _write_csv(path, X[1:422])
    os.utime(path, ns=(os.stat(path).st_atime_ns, os.stat(path).st_mtime_ns + 4 * 10**9))
    with caplog.at_level(logging.INFO):
        _, shrunk, _ = _load(path, cache)
    assert "1 withdrawn" in caplog.text
    assert shrunk.n_groups == grown.n_groups - 1 and shrunk.n_rows + shrunk.waiting == 421
    kept = {tuple(row) for row in np.asarray(grown.sums)}
    assert sum(tuple(row) in kept for row in np.asarray(shrunk.sums)) == shrunk.n_groups


def test_rows_are_matched_by_content_wherever_they_sit(tmp_path):
    """A row of a new version is the instance of an earlier one with the same content
    (the k-th alike row in file order the k-th such instance), wherever it sits."""
    from fedcluster.client_app.data.versions import Store

    store = Store.open(tmp_path)
    earlier = np.array([[1, 10], [2, 20], [1, 10], [3, 30]], dtype=np.uint64)
    first, new = store.match(earlier, None)
    assert first.tolist() == [0, 1, 2, 3] and new.all()
    now = np.array([[3, 30], [1, 10], [9, 90], [1, 10], [2, 20], [1, 10]], dtype=np.uint64)
    matched, new = store.match(now, None)
    assert matched.tolist() == [3, 0, 4, 2, 1, 5] and new.tolist() == [0, 0, 1, 0, 0, 1]
    np.testing.assert_array_equal(store.keys[matched], now)
    changed, new = store.match(np.array([[2, 21]], dtype=np.uint64), None)  # one bit of a key
    assert new.tolist() == [1] and changed.tolist() == [6]


# ------------------------------------------------------------------ the boundary
#: The modules that hold a site's rows: every module of the site's data layer
#: (``client_app/data/``: its sources, the cache, where rows become groups, the versions),
#: and ``site_check`` (which shows the site's data officer the site's own table).
DATA_PACKAGE = "fedcluster.client_app.data"
ROW_MODULES = {DATA_PACKAGE, "fedcluster.client_app.site_check"}
TASK_MODULES = ["tasks", "site_statistics", "site_profile", "task_runner", "task_io",
                "local_kmeans", "private_tasks"]
#: Where values leave a site (the release step and its rules): no module of it holds rows.
RELEASE_MODULES = ["release.gate", "release.floor", "release.spreads", "release.dominance",
                   "release.lone_cells", "release.ledger", "release.record",
                   "release.record.store", "release.record.instances", "release.audit",
                   "release.audit.span", "release.audit.support", "release.audit.values",
                   "release.audit.moments"]


def _holds_rows(module: str) -> bool:
    return module in ROW_MODULES or module.startswith(DATA_PACKAGE + ".")


def _reach(module: str) -> set[str]:
    """Every fedcluster module ``module`` imports, directly or through others."""
    from test_layers import import_graph

    graph = import_graph()
    seen, todo = set(), [module]
    while todo:
        for target in graph[todo.pop()] - seen:
            seen.add(target)
            todo.append(target)
    return seen


def _imports(module: str) -> set[str]:
    path = Path(tasks.__file__).parent / f"{module}.py"
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module.rsplit(".", 1)[-1])
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name.rsplit(".", 1)[-1] for alias in node.names)
    return found


def test_the_data_layer_is_one_package_and_holds_the_row_modules():
    import fedcluster.client_app.data as data

    package = Path(data.__file__).parent
    held = {p.relative_to(package).with_suffix("").as_posix() for p in package.rglob("*.py")}
    # the sources, the cache, where rows become groups, and the versions
    assert {"site_data", "tables", "table_files", "schema_table", "grouping", "group_stats",
            "group_table", "group_entries", "version_table", "versions/__init__",
            "versions/next_version", "report_table"} <= held
    # nothing that reads rows is left beside the tasks
    beside = {p.stem for p in package.parent.glob("*.py")}
    assert not beside & {"site_data", "tables", "table_files", "schema_table", "grouping",
                         "group_stats", "group_table", "group_entries"}


@pytest.mark.parametrize("module", TASK_MODULES)
def test_no_task_module_reaches_the_modules_that_hold_rows(module):
    reached = _reach(f"fedcluster.client_app.{module}")
    assert not {m for m in reached if _holds_rows(m)}, module
    assert "SiteData" not in _imports(module), module


@pytest.mark.parametrize("module", RELEASE_MODULES)
def test_no_module_of_the_release_package_reaches_the_modules_that_hold_rows(module):
    reached = _reach(f"fedcluster.client_app.{module}")
    assert not {m for m in reached if _holds_rows(m)}, module


def test_the_boundary_check_sees_an_import_of_the_data_layer():
    """The check can fail: the ClientApp itself reaches the data layer."""
    assert any(_holds_rows(m) for m in _reach("fedcluster.client_app.app"))


def test_every_site_task_takes_the_groups_and_only_dp_takes_clipped_rows():
    for name, fn in tasks.TASKS.items():
        hints = typing.get_type_hints(fn)
        first = next(iter(inspect.signature(fn).parameters))
        assert hints[first] is SiteGroups, name
        assert ClippedRows not in hints.values(), name
    for name, fn in private_tasks.PRIVATE_TASKS.items():
        hints = typing.get_type_hints(fn)
        site, rows = list(inspect.signature(fn).parameters)[:2]
        assert hints[site] is SiteGroups and hints[rows] is ClippedRows, name
    # the one module a task reaches rows through is handed to DP alone
    users = [m for m in TASK_MODULES if "private_rows" in _imports(m) or "ClippedRows" in _imports(m)]
    assert users == ["private_tasks"]


# ------------------------------------------------------------------ the deployed build
def _write_npy(path: Path, X: np.ndarray) -> Path:
    np.save(path, X)
    return path


@pytest.fixture
def small_windows(monkeypatch):
    """The squared deviations made 50 groups at a time (spilled to a temporary file),
    the rows and the groups read a few hundred at a time."""
    monkeypatch.setattr(group_stats, "M2_WINDOW_BYTES", 50 * 8 * 4)
    monkeypatch.setattr(group_stats, "STATS_ROWS", 300)
    monkeypatch.setattr(group_stats, "CHUNK_GROUPS", 64)
    monkeypatch.setattr(grouped_rows, "CHUNK_ROWS", 256)


@pytest.mark.parametrize("threads", [1, 2])
def test_a_kept_table_is_the_one_built_in_memory_bit_for_bit(tmp_path, blobs, small_windows,
                                                             threads):
    """A deployed site (a memory-mapped .npy, its table written chunk by chunk in
    canonical order, m2 in windows) holds the table ``build`` makes of the same rows in
    memory, for 1 and 2 Numba threads."""
    with num_threads(threads):
        site, kept, grouped = _load(_write_npy(tmp_path / "site.npy", blobs), tmp_path / "cache")
    assert isinstance(kept.sums, np.memmap) and grouped is None
    held, _ = group_table.build(_site(blobs), 2)
    assert kept.digest == held.digest
    for name in ("counts", "sums", "m2"):
        np.testing.assert_array_equal(np.asarray(getattr(kept, name)), getattr(held, name))
    assert kept.present is None and held.present is None


def test_a_kept_table_with_missing_cells_is_the_one_built_in_memory(tmp_path, blobs,
                                                                    small_windows):
    X = blobs.copy()
    X[np.random.default_rng(4).random(X.shape) < 0.05] = np.nan
    path = _write_npy(tmp_path / "site.npy", X)
    facts = TableFacts(None, "", 0, {"a": 1})
    mapped = np.load(path, mmap_mode="r")
    site = SiteData(mapped, None, None, "site", table=facts, version="v1", lineage="l",
                    reading="r")
    kept, _ = group_table.site_groups(site, 2, tmp_path / "cache")
    held, _ = group_table.build(SiteData(X, None, None, "site", table=facts), 2)
    assert isinstance(kept.sums, np.memmap)  # kept in the cache, not made in memory
    assert kept.digest == held.digest and kept.present is not None
    for name in ("counts", "sums", "m2", "present"):
        np.testing.assert_array_equal(np.asarray(getattr(kept, name)), getattr(held, name))
    # the grouping saw the same filled rows (spilled to a file, or in memory)
    with grouped_rows.grouping_rows(site, scratch=tmp_path) as spilled:
        with grouped_rows.grouping_rows(SiteData(X, None, None, "s", table=facts)) as inside:
            assert isinstance(spilled, np.memmap) and np.array_equal(spilled, inside)


@pytest.mark.parametrize("missing", [False, True])
def test_a_kept_table_whose_sums_are_spilled_in_windows_is_the_one_built_in_memory(
        tmp_path, small_windows, missing):
    """A large table's sums are made a window of groups at a time and spilled (a window
    here: 50 groups); the site's per-feature totals carried from window to window, and
    the p% rule's stand-ins written into the spilled sums, give the table made in memory
    from the same rows bit for bit, at p 3 with rows far out (stand-ins made)."""
    rng = np.random.default_rng(11)
    X = rng.normal(size=(900, 4)) * [1.0, 10.0, 0.1, 1e3] + [0.0, 5.0, -3.0, 1e6]
    X[rng.choice(900, 12, replace=False), rng.integers(0, 4, size=12)] += 40.0 * np.array(
        [1.0, 10.0, 0.1, 1e3])[rng.integers(0, 4, size=12)]  # rows that stand out of a group
    facts = None
    if missing:
        X[rng.random(X.shape) < 0.05] = np.nan
        facts = TableFacts(None, "", 0, {"a": 1})
    path = _write_npy(tmp_path / "site.npy", X)
    site = SiteData(np.load(path, mmap_mode="r"), None, None, "site", table=facts,
                    version="v1", lineage="l", reading="r")
    kept, _ = group_table.site_groups(site, 3, tmp_path / "cache")
    held, _ = group_table.build(SiteData(X, None, None, "site", table=facts), 3)
    assert isinstance(kept.sums, np.memmap) and kept.n_groups > 3 * 50  # kept; windows
    assert held.spread_rule["dominated-means"] > 0  # stand-ins written into the spill
    assert kept.digest == held.digest
    for name in ("counts", "sums", "m2") + (("present",) if missing else ()):
        np.testing.assert_array_equal(np.asarray(getattr(kept, name)), getattr(held, name))


def test_the_canonical_order_depends_on_the_statistics_alone():
    """Groups whose rows sit elsewhere in the file (integer rows: every sum exact) give
    the same table; groups whose 64-bit keys collide are ordered by their statistics."""
    rng = np.random.default_rng(8)
    labels = np.repeat(np.arange(200), rng.choice([2, 4], size=200))  # means of 2 or 4: exact
    X = rng.integers(-50, 50, size=(labels.size, 3)).astype(np.float64)
    moved, renamed = rng.permutation(labels.size), rng.permutation(200)
    tables = []
    for rows, group_of_row in ((X, labels), (X[moved], renamed[labels[moved]])):
        columns, order, _ = group_stats.ordered(rows, group_of_row, 200, None)
        tables.append(group_stats.Table(columns, 3, None, 0).held())
        counts, sums, m2, _ = group_stats.group_statistics(rows, group_of_row, 200)

        def bits_of(ids, c=counts, s=sums, m=m2):
            return np.stack(group_stats._stats_bits(c[ids], s[ids], m[ids], None), axis=1)

        collided = group_stats.canonical_order(np.zeros(200, dtype=np.uint64), bits_of)
        tables.append([a[collided] for a in (counts, sums, m2)])
    for a, b in zip(tables[0], tables[2]):
        assert a is None and b is None or np.array_equal(a, b)
    for a, b in zip(tables[1], tables[3]):
        assert np.array_equal(a, b)
    assert np.all(np.diff(tables[1][0]) >= 0)  # a collision: by count, then sums, ...
    assert not np.array_equal(tables[0][1], tables[1][1])


def test_the_grouping_scale_reads_a_memmap_as_scaling_does(tmp_path, blobs, monkeypatch):
    from fedcluster.common import kernels, scaling

    monkeypatch.setattr(kernels, "CHUNK_ROWS", 64)
    mapped = np.load(_write_npy(tmp_path / "rows.npy", blobs), mmap_mode="r")
    assert np.array_equal(grouping._moments(mapped)[1], scaling.site_moments(blobs)[2])
    assert np.array_equal(grouping.grouping_scale(mapped), grouping.grouping_scale(blobs))


def test_row_hashes_are_those_of_earlier_entries(blobs):
    """The hashes a grown file is matched by: unchanged, so earlier entries still match."""
    bits = blobs.view(np.uint64)
    a = np.full(len(blobs), 0x9E3779B97F4A7C15, dtype=np.uint64)
    b = np.full(len(blobs), 0xD1B54A32D192ED03, dtype=np.uint64)
    for j in range(blobs.shape[1]):
        a = group_stats.mix(a ^ bits[:, j])
        b = group_stats.mix(b + group_stats.mix(bits[:, j] ^ np.uint64(j + 1)))
    np.testing.assert_array_equal(group_table.row_hashes(_site(blobs)), np.stack([a, b], 1))


def test_a_file_that_grows_keeps_its_groups_with_small_windows(tmp_path, blobs, small_windows):
    path, cache = tmp_path / "site.npy", tmp_path / "cache"
    before, (_, after, _) = _grown(path, cache, _write_npy, blobs[:300], blobs)
    G = before.n_groups
    np.testing.assert_allclose(np.asarray(after.sums)[G:].sum(0), blobs[300:].sum(0), rtol=1e-9)


def test_a_site_that_opts_out_is_named_in_the_summary_and_the_model(tmp_path, caplog):
    """min-cluster-size = 1 is an explicit opt-out: the site warns, says so in its
    describe reply (group-size 1), and the run's summary and model.json name it."""
    import json

    import fedcluster
    from fedcluster.server_app.outputs import summary_table

    rng = np.random.default_rng(0)
    sites = [rng.normal(size=(60, 2)) for _ in range(3)]
    with caplog.at_level(logging.WARNING):
        result = fedcluster.simulate(sites, n_clusters=2, site_min_cluster_size=[2, 1, 2],
                                     output_dir=str(tmp_path), run_name="opt-out")
    assert "site 1: min-cluster-size = 1: this site answers from its rows" in caplog.text
    assert result.metrics["sites-answering-from-rows"] == ["1"]
    saved = json.loads((tmp_path / "opt-out" / "model.json").read_text())
    assert saved["metrics"]["sites-answering-from-rows"] == ["1"]
    summary = summary_table(result.metrics)
    assert "site 1 answered from its rows (its min-cluster-size = 1" in summary
    assert "the sites' groups, each in one cluster whole" in summary
    assert result.metrics["report-groups"] == ("re-cut within them" in summary)


def test_a_column_constant_at_the_site_is_not_weighted_by_its_rounding_noise(blobs):
    """A column constant at this site (as a z-scored pixel often is under label skew) has
    a computed variance of rounding noise; weighted by 1 / (d var) it would outweigh every
    real column and the groups would follow the noise."""
    constant = np.full((len(blobs), 1), 0.7)
    X = np.ascontiguousarray(np.hstack([blobs, constant]))
    mean, m2 = grouping._moments(X)
    assert m2[-1] > 0  # the noise is there: without the guard this column's weight explodes
    scale = grouping.grouping_scale(X)
    d = X.shape[1]
    total = float((m2[:-1] / len(X)).sum())
    assert scale[-1] == pytest.approx(np.sqrt(1.0 / total))
    np.testing.assert_allclose(scale[:-1], np.sqrt(1.0 / total + 1.0 / (d * m2[:-1] / len(X))))
    assert np.array_equal(grouping.group_rows(X, 2, scale),
                          grouping.group_rows(np.ascontiguousarray(blobs), 2, scale[:-1]))


def test_arrays_derived_from_a_kept_table_in_blocks_equal_one_pass(monkeypatch, tmp_path):
    """A group table kept on disk is mapped read-only; the means, scatter, variances and
    run-space copies derived from it are computed a block of groups at a time (its pages
    dropped after each: bench/scale.py part 3 measures the memory), bit for bit what one
    pass over the whole arrays gives."""
    from fedcluster.client_app import site_groups

    rng = np.random.default_rng(3)
    n_groups, d = 1001, 7
    counts = rng.integers(2, 5, n_groups)
    sums = rng.normal(3.0, 2.0, size=(n_groups, d)) * counts[:, None]
    m2 = rng.random((n_groups, d)) * counts[:, None]
    np.save(tmp_path / "sums.npy", sums)
    np.save(tmp_path / "m2.npy", m2)
    kept = SiteGroups(counts, np.load(tmp_path / "sums.npy", mmap_mode="r"),
                      np.load(tmp_path / "m2.npy", mmap_mode="r"), None, "kept", 2, "digest")
    monkeypatch.setattr(site_groups, "BLOCK_BYTES", 8 * d * 64)  # 64 groups a block: 16 blocks
    assert np.array_equal(kept.means, sums / counts[:, None])
    assert np.array_equal(kept.scatter, m2.sum(axis=1))
    assert np.array_equal(kept.variances, m2 / counts[:, None])
    shift, factor = rng.normal(size=d), rng.random(d) + 0.5
    view = kept.in_run_space(FeatureTransform("standard", shift, factor))
    n = counts.astype(np.float64)[:, None]
    assert np.array_equal(view.sums, (sums - n * shift) / factor)
    assert np.array_equal(view.m2, m2 / (factor * factor))
    assert not isinstance(view.sums, np.memmap) and view.sums.flags.c_contiguous


def test_scattered_rows_of_a_mapped_site_are_read_a_span_at_a_time(monkeypatch, tmp_path):
    """The rows a new version groups (a few, scattered over a large file) are copied a
    span of the file at a time, its pages dropped after each (bench/versions.py measures
    the memory): the same rows, in the same order, as ``X[rows]``."""
    rng = np.random.default_rng(5)
    X = rng.normal(size=(5000, 3))
    np.save(tmp_path / "site.npy", X)
    mapped = np.load(tmp_path / "site.npy", mmap_mode="r")
    from fedcluster.client_app import mapped_pages

    released = []
    real = mapped_pages.release_pages
    monkeypatch.setattr(mapped_pages, "release_pages", lambda A: released.append(1) or real(A))
    rows = np.sort(rng.choice(5000, 700, replace=False))
    assert np.array_equal(mapped_pages.rows_in_spans(mapped, rows, 64), X[rows])  # about 80 spans
    assert len(released) >= 50  # a span at a time, each dropped
    assert np.array_equal(mapped_pages.rows_in_spans(mapped, rows[::-1], 64), X[rows[::-1]])  # any order
    assert mapped_pages.rows_in_spans(mapped, rows[:0], 64).shape == (0, 3)


def test_groups_in_any_order_of_a_mapped_table_are_read_in_file_order(monkeypatch, tmp_path):
    """A chunk of groups in canonical order lies all over the table's file: ``rows_at``
    reads them sorted, a span at a time, pages dropped after each, and gives ``X[ids]``
    in the order asked, duplicates included, for 2-d and 1-d arrays, mapped or not."""
    from fedcluster.client_app import mapped_pages

    rng = np.random.default_rng(6)
    X, counts = rng.normal(size=(5000, 4)), rng.integers(2, 9, size=5000)
    np.save(tmp_path / "m2.npy", X)
    np.save(tmp_path / "counts.npy", counts)
    mapped = np.load(tmp_path / "m2.npy", mmap_mode="r")
    mapped_counts = np.load(tmp_path / "counts.npy", mmap_mode="r")
    released = []
    real = mapped_pages.release_pages
    monkeypatch.setattr(mapped_pages, "release_pages", lambda A: released.append(1) or real(A))
    ids = rng.integers(0, 5000, size=900)  # any order, some twice
    got = mapped_pages.rows_at(mapped, ids, 64)
    assert type(got) is np.ndarray and np.array_equal(got, X[ids])
    assert len(released) >= 50  # about 80 spans, each dropped
    assert np.array_equal(mapped_pages.rows_at(mapped_counts, ids, 64), counts[ids])
    assert np.array_equal(mapped_pages.rows_at(X, ids), X[ids])  # in memory: as indexed
    assert mapped_pages.rows_at(mapped, ids[:0]).shape == (0, 4)


def test_cell_hashes_are_written_at_once_and_count_only_once_saved(tmp_path):
    """A kept record writes a version's cell hashes to its file when they are made (not
    held through the build); they are the record's only once ``save`` names them: a
    store opened before then (another process, or after a crash) has none of them, and
    the next hashes written cut that tail first."""
    from fedcluster.client_app.data.versions import Store

    rng = np.random.default_rng(7)
    store = Store.open(tmp_path)
    store.match(rng.integers(0, 2**63, size=(6, 2), dtype=np.uint64), None)
    first = rng.integers(0, 2**16, size=(6, 3), dtype=np.uint16)
    store.add_cell_hashes(first)
    assert (tmp_path / "cells.u16").stat().st_size == first.nbytes  # written, not held
    np.testing.assert_array_equal(store.cell_hashes(np.arange(6)), first)
    assert Store.open(tmp_path).n_cell_records == 0  # not the record's until saved
    store.save()
    again = Store.open(tmp_path)
    assert again.n_cell_records == 6
    np.testing.assert_array_equal(again.cell_hashes(np.arange(6)[::-1]), first[::-1])
    # hashes written and never saved (a crash), then another version's: the tail is cut
    again.match(rng.integers(0, 2**63, size=(2, 2), dtype=np.uint64), None)
    again.add_cell_hashes(np.full((2, 3), 7, dtype=np.uint16))
    later = Store.open(tmp_path)
    later.match(rng.integers(0, 2**63, size=(4, 2), dtype=np.uint64), None)
    fresh = rng.integers(0, 2**16, size=(4, 3), dtype=np.uint16)
    later.add_cell_hashes(fresh)
    later.save()
    final = Store.open(tmp_path)
    assert final.n_cell_records == 10 and (tmp_path / "cells.u16").stat().st_size == 10 * 3 * 2
    np.testing.assert_array_equal(final.cell_hashes(np.arange(10)), np.concatenate([first, fresh]))


def test_a_table_is_built_without_numpys_huge_page_advice_and_it_is_restored(tmp_path, monkeypatch):
    """A kept table is built with NumPy's transparent-huge-page advice off (faster here:
    bench/large_site.py), and the process's setting is back as it was after the build,
    a failed build included."""
    from fedcluster.client_app import mapped_pages
    from fedcluster.client_app.data import version_table

    advise = mapped_pages._huge_page_advice()
    assert advise is not None  # this NumPy has the switch
    seen = []
    real = version_table.new_version

    def watched(*args, **kwargs):
        seen.append(advise(False))  # the setting during the build (set back as it was)
        return real(*args, **kwargs)

    monkeypatch.setattr(version_table, "new_version", watched)
    before = advise(True)
    try:
        rng = np.random.default_rng(8)
        np.save(tmp_path / "site.npy", rng.normal(size=(300, 3)))
        site = load_site_file(str(tmp_path / "site.npy"), cache_dir=str(tmp_path / "cache"))
        group_table.site_groups(site, 2, str(tmp_path / "cache"))
        assert seen == [False] and advise(True) is True
        monkeypatch.setattr(version_table, "new_version", lambda *a, **k: 1 / 0)
        np.save(tmp_path / "other.npy", rng.normal(size=(300, 3)))
        other = load_site_file(str(tmp_path / "other.npy"), cache_dir=str(tmp_path / "cache"))
        with pytest.raises(ZeroDivisionError):
            group_table.site_groups(other, 2, str(tmp_path / "cache"))
        assert advise(True) is True
    finally:
        advise(before)


def test_files_are_written_in_pieces_the_same_bytes(tmp_path, monkeypatch):
    """A site's files go to the kernel in pieces of at most ``WRITE_PIECE`` bytes (a large
    write asks for large page-cache folios: bench/large_site.py's reading), every byte
    through them: a spill (``write_pieces``), and the cache's and the record's rewritten
    files (``site_data.write_atomic``, ``site_files.replace_atomically``), whose ``np.save``
    would otherwise hand a real file the whole array at once."""
    import io

    from fedcluster.client_app import site_files
    from fedcluster.client_app.data import site_data

    monkeypatch.setattr(site_files, "WRITE_PIECE", 4096)
    rng = np.random.default_rng(3)
    big, small = rng.normal(size=(1000, 7)), np.arange(10, dtype=np.uint16).reshape(2, 5)
    sizes = []

    class Recorded(io.BufferedWriter):
        def write(self, data):
            sizes.append(memoryview(data).nbytes)
            return super().write(data)

    out = Recorded(io.FileIO(tmp_path / "spill", "wb"))
    for array in (big, np.zeros((0, 7)), small):
        site_files.write_pieces(out, array)
    out.close()
    assert max(sizes) == 4096 and sum(sizes) == big.nbytes + small.nbytes
    assert (tmp_path / "spill").read_bytes() == big.tobytes() + small.tobytes()

    def recorded_open(path, mode="r", *args, **kwargs):
        return Recorded(io.FileIO(path, mode.replace("b", "")))

    for name, write in (("cache.npy", lambda t, w: site_data.write_atomic(t, w)),
                        ("record.npy", lambda t, w: site_files.replace_atomically(t, w))):
        sizes.clear()
        with monkeypatch.context() as patch:
            patch.setattr(os, "fdopen", lambda fd, mode: Recorded(io.FileIO(fd, "wb")))
            patch.setattr(site_files, "open", recorded_open, raising=False)
            write(tmp_path / name, lambda f: np.save(f, big))
        assert sizes and max(sizes) <= 4096, name
        assert sum(sizes) == (tmp_path / name).stat().st_size, name  # every byte in pieces
        np.testing.assert_array_equal(np.load(tmp_path / name), big)


def test_a_large_sites_content_keys_compiled_are_numpys_bits(monkeypatch):
    """From ``COMPILED_FROM_ROWS`` rows the content hashes are compiled: the same keys as
    NumPy's, bit for bit, whatever the cells (NaN payloads, -0.0 and 0.0, infinities), the
    labels, the width and the array (a memory map, a float32 copy, a strided view)."""
    from fedcluster.client_app.data.versions import row_keys

    rng = np.random.default_rng(21)
    X = rng.normal(size=(3000, 6))
    X[::7, 3] = np.nan
    X[1, 2] = np.float64(np.frombuffer(np.uint64(0x7FF8000000000123).tobytes(), np.float64)[0])
    X[5, 1], X[6, 1], X[9, 0], X[10, 0] = -0.0, 0.0, np.inf, -np.inf
    codes, names = rng.integers(0, 3, size=X.shape[0]), ("a", "b", "c")
    for data, labels in ((X, (codes, names)), (X, (None, None)), (X[:, :1], (None, None)),
                         (X[::2, ::2], (codes[::2], names)), (X.astype(np.float32), (None, None))):
        monkeypatch.setattr(row_keys, "COMPILED_FROM_ROWS", 1)
        compiled = row_keys.content_keys(data, *labels)
        monkeypatch.setattr(row_keys, "COMPILED_FROM_ROWS", 10**12)
        np.testing.assert_array_equal(compiled, row_keys.content_keys(data, *labels))
    assert np.unique(compiled, axis=0).shape[0] == compiled.shape[0]  # (keys that tell rows apart)
    assert row_keys.content_keys(X[:0]).shape == (0, 2)

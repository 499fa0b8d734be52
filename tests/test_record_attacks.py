"""One record, one audit (issue 69, must-show 1): coordinators against a site's real
ClientApp that each try a NEW way of building a table, shown first to recover a row (or
spend a second DP budget) from the code without the defence, then nothing.

- **The report's parts against a p% stand-in.** A group whose row stands far out in a
  feature (every other row near the site's mean) has its sum replaced by a stand-in in
  every reply (the p% rule on means, p_site 3 and 5). A boundary laid between that row
  and its group-mates makes the report split the group: built from the rows, its parts
  would hold the row's true value, and the report's total less the total every other
  task gives is the withheld sum less its stand-in (the row, to a fraction of a percent).
  The record's judgement (``release/audit``: a FLAGGED group's cells protected from every
  later sum) and the report's builder (a straddler whose released sum is a stand-in stays
  whole) leave the two totals equal to the last bit.
- **The reading is the site's** (``test_reading_is_the_sites``): a run's ``missing``
  no longer gives a plain CSV or SQLite site a second reading, history and DP budget.
"""

from __future__ import annotations

import numpy as np
import pytest

from fedcluster.client_app.data import report_cuts, report_table
from fedcluster.client_app.release import audit
from fedcluster.common import protocol

from record_check import RunSite, race
from test_versions import FileSite

SEEDS = range(10)


def _quiet_neighbours(seed: int) -> tuple[np.ndarray, int]:
    """300 rows of 3 features; feature 1 near 0 everywhere (a rare lab value's column)
    but one row far out: its group's mean would place it (the p% rule stands in)."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(300, 3))
    X[:, 1] = rng.normal(scale=0.001, size=300)
    row = int(rng.integers(300))
    X[row, 1] = 1.0
    return X, row


def _site(tmp_path, X: np.ndarray, p: int, name: str) -> FileSite:
    path, cache = tmp_path / f"{name}.csv", tmp_path / f"cache-{name}"
    path.write_text("f0,f1,f2\n" + "".join(",".join(repr(float(v)) for v in row) + "\n" for row in X))
    site = FileSite(path, cache, {"min-cluster-size": p}, with_id=False)
    site.server_floor = 1
    return site


def _boundary(site: FileSite, X: np.ndarray, row: int) -> np.ndarray:
    """Two centroids mirrored about a plane (in features 0 and 2) between the far row and
    its group-mates: the coordinator's guess, here made with the rows (it may try every
    plane through the group's mean until the totals differ)."""
    groups = site.table_now()
    entry = next(site.cache.joinpath("groups").glob("*.row-groups.npy"))
    of_row = np.asarray(np.load(entry))
    mates = np.flatnonzero((of_row == of_row[row]) & (np.arange(len(X)) != row))
    assert groups.n_groups > 0 and mates.size >= 2
    plane = [0, 2]
    direction = X[row, plane] - X[mates][:, plane].mean(axis=0)
    direction /= np.linalg.norm(direction)
    nearest = (X[mates][:, plane] @ direction).max()
    middle = (X[row, plane] @ direction + nearest) / 2
    centre = np.zeros(3)
    centre[plane] = middle * direction
    step = np.zeros(3)
    step[plane] = direction
    return np.array([centre - step, centre + step])


def _withheld_sum_attack(site: FileSite, X: np.ndarray, row: int) -> float:
    """The report's total of feature 1 less the plain evaluation's, plus the stand-in the
    site released for the far row's group (its count times its released mean): the
    group's true sum, the far row plus near-zero neighbours, where the parts hold it."""
    C = _boundary(site, X, row)
    reported, _ = site.ask("evaluate", [C], report=True)
    plain, _ = site.ask("evaluate", [C])
    total = protocol.reply_arrays("evaluate", reported).sums.sum(axis=0)[1]
    standing = protocol.reply_arrays("evaluate", plain).sums.sum(axis=0)[1]
    return float(total - standing + site.table_now().sums[_flagged_group(site, row), 1])


def _builder_unguarded(patch) -> None:
    """The report's builder without its two pre-filters against this attack: it splits a
    straddler whose sum stood in, and no part's own p% flag carries the feature."""
    patch.setattr(report_table, "_stood_in", lambda site, groups, *rest: np.zeros(
        (groups.n_groups, site.n_features), dtype=bool))
    patch.setattr(report_cuts, "_flagged_parts", lambda site, rows, part, k, *rest: np.zeros(
        (k, site.n_features), dtype=bool))


def _flagged_group(site: FileSite, row: int) -> int:
    entry = next(site.cache.joinpath("groups").glob("*.row-groups.npy"))
    return int(np.asarray(np.load(entry))[row])


@pytest.mark.parametrize("p", [3, 5])
def test_the_reports_parts_do_not_give_back_a_sum_the_p_rule_withheld(tmp_path, monkeypatch, p):
    """Without the defence (the builder splits a stood-in straddler and carries nothing,
    the record protects no cell) the attack puts the far row within 1 % in most seeds;
    with the record's judgement alone (the builder still unguarded: the release step
    refuses the parts and answers from the groups whole), and with the site as it is, the
    report's total is the plain one to the last bit in every seed, and the estimate is
    the stand-in (far off)."""
    close = 0
    with monkeypatch.context() as bare:
        _builder_unguarded(bare)
        bare.setattr(audit, "_protected", lambda *args: [])
        for seed in SEEDS:
            X, row = _quiet_neighbours(seed)
            site = _site(tmp_path, X, p, f"bare-{p}-{seed}")
            assert site.table_now().spread_rule["dominated-means"] >= 1  # the sum stood in
            close += abs(_withheld_sum_attack(site, X, row) - X[row, 1]) < 0.01 * X[row, 1]
    assert close >= 5, close  # the attack works without the defence
    for guarded in ("the record alone", "the site as it is"):
        with monkeypatch.context() as patch:
            if guarded == "the record alone":
                _builder_unguarded(patch)
            for seed in SEEDS:
                X, row = _quiet_neighbours(seed)
                site = _site(tmp_path, X, p, f"{guarded[4:10]}-{p}-{seed}")
                estimate = _withheld_sum_attack(site, X, row)
                standing = site.table_now().sums[_flagged_group(site, row), 1]
                assert estimate == pytest.approx(standing, abs=1e-12), guarded  # no more
                assert abs(estimate - X[row, 1]) > 0.5 * X[row, 1]


# ------------------------------------------------------------------ two processes at once
def _pairs_across() -> tuple[np.ndarray, int]:
    """Pairs of rows far apart (each a group at p_site 2): twelve across x = 0 (rows at
    x -0.01 and +0.01), twenty whole on either side, and one pair T whose row r0 lies at
    x = 0.001 and its partner at -0.02. A boundary at x = 0 splits T (r0 right), one at
    x = 0.002 does not (r0 left): the two partitions of the report differ by r0 alone."""
    rows = []
    for y in range(12):
        rows += [(-0.01, 10.0 * y), (0.01, 10.0 * y)]
    for y in range(10):
        rows += [(-5.0, 10.0 * y), (-5.0, 10.0 * y + 0.02), (5.0, 10.0 * y), (5.0, 10.0 * y + 0.02)]
    rows += [(-0.02, 200.0), (0.001, 200.0)]
    X = np.array(rows) + np.random.default_rng(5).normal(0, 1e-5, (len(rows), 2))
    return X, len(rows) - 1


def _race(tmp_path, X: np.ndarray, bare: bool, name: str) -> list[dict]:
    """Two processes on one cache, started together, each asking the report's evaluation
    with a boundary of its own (x = 0 and x = 0.002)."""
    work = tmp_path / name
    work.mkdir()
    path = work / "site.csv"
    path.write_text("x,y\n" + "".join(f"{a!r},{b!r}\n" for a, b in X.tolist()))
    return race(path, work / "cache", {"min-cluster-size": 2}, "error", None,
                [[[-1.0 + shift, 100.0], [1.0 + shift, 100.0]] for shift in (0.0, 0.002)], bare)


def _one_row(replies: list[dict], X: np.ndarray) -> list[np.ndarray]:
    """The attacker's certificate: two replies whose clusters' counts differ by exactly
    one (+1 in one cluster, -1 in another) with equal and opposite sums: that row."""
    from test_attacks import is_row

    a, b = replies
    counts = np.subtract(b["counts"], a["counts"])
    sums = np.subtract(b["sums"], a["sums"])
    if sorted(counts.tolist()) != sorted([-1, 1] + [0] * (len(counts) - 2)):
        return []
    gained = int(np.argmax(counts))
    return [sums[gained]] if is_row(sums[gained], X) else []


def test_two_report_tasks_at_once_on_one_cache_give_no_row(tmp_path):
    """Two processes sharing one cache, started together, each asking the report at
    centroids whose partitions differ by one row. Without the lock (each judges the record
    as it read it, before the other wrote), both partitions leave and their difference is
    that row, exactly; with it, the second is judged with the first, the release step
    refuses it (the two would isolate the row) and its reply counts the groups whole: no
    two clusters' counts differ by one row."""
    X, r0 = _pairs_across()
    bare = _race(tmp_path, X, True, "bare")
    found = _one_row(bare, X)
    assert found and np.allclose(found[0], X[r0], atol=1e-12), bare  # the row, without the defence
    for attempt in range(3):
        replies = _race(tmp_path, X, False, f"locked-{attempt}")
        assert _one_row(replies, X) == [], replies


# ------------------------------------------------------------------ the reading is the site's
def _readings_per_run(patch) -> None:
    """The code without the defence: a run's ``missing`` picks the reading (a key of its
    own: another record and DP budget) and ``drop-row`` drops the rows holding a missing
    cell, as the release before did."""
    import dataclasses

    from fedcluster.client_app import data_sources
    from fedcluster.client_app.data import site_data

    def old_policy(data, missing):
        data = dataclasses.replace(data, reading=site_data.reading_key(data.reading, missing),
                                   version=site_data.reading_key(data.version, missing))
        if missing == "drop-row":
            keep = ~np.isnan(np.asarray(data.X)).any(axis=1)
            data = dataclasses.replace(
                data, X=np.ascontiguousarray(np.asarray(data.X)[keep]), table=None, fingerprint=None,
                labels=None if data.labels is None else data.labels[keep],
                row_ids=None if data.row_ids is None else data.row_ids[keep])
        return data
    plain = data_sources.load_plain_table
    patch.setattr(data_sources, "missing_policy", old_policy)
    patch.setattr(data_sources, "load_plain_table", lambda path, missing="error", **keys:
                  old_policy(plain(path, missing="impute-mean", **keys), missing))


def _with_gaps(seed: int, gaps: bool = True) -> np.ndarray:
    """300 rows, 3 features; feature 2 missing in 4 % of the rows (``gaps``)."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(300, 3)) + rng.integers(0, 3, size=(300, 1)) * 3.0
    if gaps:
        X[rng.random(300) < 0.04, 2] = np.nan
    return X


def _sources(tmp_path, X: np.ndarray, name: str) -> dict:
    """The same rows as a CSV data-path and as a SQLite table (node configs)."""
    import sqlite3

    csv_path = tmp_path / f"{name}.csv"
    csv_path.write_text("a,b,c\n" + "".join(",".join("" if np.isnan(v) else repr(float(v))
                                                      for v in row) + "\n" for row in X))
    db = tmp_path / f"{name}.sqlite"
    with sqlite3.connect(db) as connection:
        connection.execute("CREATE TABLE rows (a REAL, b REAL, c REAL)")
        connection.executemany("INSERT INTO rows VALUES (?, ?, ?)",
                               [[None if np.isnan(v) else float(v) for v in row] for row in X])
    return {"csv": {"data-path": str(csv_path)},
            "sqlite": {"data-url": f"sqlite:///{db}", "data-table": "rows"}}


def _every_group(site: RunSite, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Every group's sums of the complete features (a, b) and its count: ``kmeanspp``
    with a seed on every group (its means and counts)."""
    from fedcluster.common import scaling

    fill = scaling.FeatureTransform.fill_only(np.zeros(3)).encode()  # the coordinator's
    (means, counts), _ = site.ask("kmeanspp", [], **{"k-local": n, "seed": 0, "transform": fill})
    return means[:, :2] * counts[:, None], counts


def _differenced_rows(a: tuple, b: tuple, X: np.ndarray) -> int:
    """Rows of ``X`` (in the complete features) that a group of one reading less a group
    of the other, one row apart, gives exactly."""
    from test_attacks import is_row

    found = set()
    for (sums_1, counts_1), (sums_2, counts_2) in ((a, b), (b, a)):
        for i in np.flatnonzero(counts_1 > 1):
            for j in np.flatnonzero(counts_2 == counts_1[i] - 1):
                candidate = sums_1[i] - sums_2[j]
                if is_row(candidate, X[:, :2], tol=1e-9):
                    found.add(tuple(np.round(candidate, 9)))
    return len(found)


@pytest.mark.parametrize("source", ["csv", "sqlite"])
def test_a_runs_missing_does_not_give_a_site_a_second_reading(tmp_path, monkeypatch, source):
    """A coordinator that runs a site under ``missing = drop-row`` then ``impute-mean``
    and differences the two readings' groups (every group's sums and count of each): the
    code without the defence (a reading, record and budget per ``missing``) gives rows
    exactly on some seeds; with it, ``drop-row`` is refused naming the key (the site reads
    its file one way), and the two runs it answers read the same groups."""
    found = 0
    with monkeypatch.context() as bare:
        _readings_per_run(bare)
        for seed in range(5):
            X = _with_gaps(seed)
            node = _sources(tmp_path, X, f"bare-{seed}")[source]
            cache = tmp_path / f"cache-bare-{source}-{seed}"
            filled = _every_group(RunSite(node, cache, "impute-mean"), len(X))
            dropped = _every_group(RunSite(node, cache, "drop-row"), len(X))
            found += _differenced_rows(filled, dropped, X)
    assert found >= 1  # rows, exactly, without the defence
    for seed in range(5):
        X = _with_gaps(seed)
        node = _sources(tmp_path, X, f"one-{seed}")[source]
        cache = tmp_path / f"cache-one-{source}-{seed}"
        filled = _every_group(RunSite(node, cache, "impute-mean"), len(X))
        with pytest.raises(AssertionError, match=r"'missing' = \"drop-row\" would read"):
            RunSite(node, cache, "drop-row").ask("describe", [])
        with pytest.raises(AssertionError, match=r"the cell is (empty|missing)"):
            RunSite(node, cache, "error").ask("describe", [])
        again = _every_group(RunSite(node, cache, "impute-mean"), len(X))
        assert np.array_equal(filled[0], again[0]) and np.array_equal(filled[1], again[1])


@pytest.mark.parametrize("source", ["csv", "sqlite"])
def test_a_runs_missing_does_not_give_a_site_a_second_dp_budget(tmp_path, monkeypatch, source):
    """Three runs on the same rows, one per ``missing``, each a DP task that spends the
    site's whole default budget: the code without the defence answers all three (a budget
    per reading); with it, the first is answered and the others are refused naming
    ``dp-budget``: one reading, one budget."""
    from test_dp_budget_attacks import DEFAULT_RHO

    C = np.zeros((2, 3))
    C[1] += 3.0
    dp = {"local-iters": 1, "tol": 0.0, "dp-rho": DEFAULT_RHO, "data-bounds": "-20:20"}
    X = _with_gaps(7, gaps=False)
    with monkeypatch.context() as bare:
        _readings_per_run(bare)
        node = _sources(tmp_path, X, "bare")[source]
        for missing in ("error", "drop-row", "impute-mean"):
            RunSite(node, tmp_path / f"cache-bare-{source}", missing).ask("lloyd", [C], **dp)
    node = _sources(tmp_path, X, "one")[source]
    cache = tmp_path / f"cache-one-{source}"
    RunSite(node, cache, "error").ask("lloyd", [C], **dp)
    for missing in ("drop-row", "impute-mean"):
        with pytest.raises(AssertionError, match="dp-budget"):
            RunSite(node, cache, missing).ask("lloyd", [C], **dp)

"""A randomized adversary against one site's record (issue 69, must-show 2).

Sequences of random tasks of the protocol with crafted parameters, against the real
ClientApp of a site reading a CSV (with missing cells, and a row far out in a quiet
feature, so that the p% rule stands in at p_site 3 and 5) through its cache: every
group's mean and count (``kmeanspp`` with a seed on every group), centroids on group
means, lines of centroids, k above the groups, a fuzzifier near 1, the report's
evaluation and Table 1's profile at any of those, versions of the file (rows deleted,
cells corrected, rows appended), runs asking another ``missing`` (refused: the site
reads its file one way) and two processes asking the report at once on one cache.
After each sequence, ``record_check.py`` (this suite's own audit, apart from the site's)
checks every entry of the record against the rows and that nothing in the record's span
determines a cell, a sum the p% rule withheld, or a sum of fewer than p values.

Seeds and sizes here are short (one sequence per floor); ``bench/record_adversary.py``
sweeps more.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fedcluster.common import scaling
from record_check import RecordCheck, RunSite, Version, race
from test_value_versions import CellTable

ROWS, STEPS = 72, 14


def quiet_blobs(n: int, seed: int) -> np.ndarray:
    """``n`` rows of 3 features in 3 blobs, feature 1 near 0 (a rare lab value's column)
    but for one row far out, and 6 % of feature 2 missing."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 3)) + rng.integers(0, 3, size=(n, 1)) * 4.0
    X[:, 1] = rng.normal(scale=0.01, size=n)
    X[int(rng.integers(n)), 1] = 3.0
    X[rng.random(n) < 0.06, 2] = np.nan
    return X


class GapTable(CellTable):
    """A CellTable whose file leaves a missing cell empty."""

    def write(self, path: Path) -> None:
        import os

        lines = [",".join("" if np.isnan(v) else repr(float(v)) for v in row) for row in self.X]
        path.write_text("a,b,c\n" + "\n".join(lines) + "\n")
        self.version += 1
        os.utime(path, ns=(self.version * 10**9, self.version * 10**9))

    def version_now(self) -> Version:
        return Version(self.X.copy(), self.ids.copy(), self.cell_edits.copy())


class Adversary:
    """One random sequence against one site (``seed``, p_site ``p``)."""

    def __init__(self, tmp_path: Path, seed: int, p: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.p, self.work = p, tmp_path / f"s{seed}-p{p}"
        self.work.mkdir()
        self.path, self.cache = self.work / "site.csv", self.work / "cache"
        self.table = GapTable(quiet_blobs(ROWS, seed), with_id=False)
        self.node = {"data-path": str(self.path), "min-cluster-size": p}
        self.versions: list[Version] = []
        self.means = np.zeros((0, 3))
        self.refused = 0
        self._write()

    def _write(self) -> None:
        self.table.write(self.path)
        self.versions.append(self.table.version_now())
        self.site = RunSite(self.node, self.cache, "impute-mean")
        self.ask("describe", [])  # (the version made)

    @property
    def fill(self) -> str:
        return scaling.FeatureTransform.fill_only(np.nanmean(self.table.X, axis=0)).encode()

    def ask(self, task: str, arrays: list, **params):
        return self.site.ask(task, arrays, transform=self.fill, **params)

    def centroids(self) -> np.ndarray:
        """Crafted centroids: on group means, a line through the data, or more than the
        site's groups."""
        kind = self.rng.integers(3)
        lo, hi = np.nanmin(self.table.X, axis=0), np.nanmax(self.table.X, axis=0)
        if kind == 0 and len(self.means) >= 2:
            k = int(self.rng.integers(2, len(self.means) + 1))
            return self.means[self.rng.choice(len(self.means), k, replace=False)]
        if kind == 1:
            t = np.linspace(0, 1, int(self.rng.integers(3, 13)))[:, None]
            return lo + t * (hi - lo) + self.rng.normal(0, 0.01, (t.size, 3))
        return lo + self.rng.random((int(self.rng.integers(2, 2 * ROWS)), 3)) * (hi - lo)

    #: Every sequence holds each of these at least once (then draws the rest at random).
    KINDS = ("groups", "local", "lloyd", "report", "report", "profile", "fcm", "version",
             "version", "missing", "race", "race")

    def kinds(self, steps: int) -> list[str]:
        """The sequence: every kind of :data:`KINDS`, the rest drawn at random, shuffled
        after a first ``groups`` (the crafted centroids sit on group means)."""
        rest = self.rng.choice(sorted(set(self.KINDS)), max(0, steps - len(self.KINDS) - 1))
        order = list(self.KINDS) + rest.tolist()
        self.rng.shuffle(order)
        return ["groups"] + order

    def step(self, kind: str) -> None:
        if kind == "groups":
            (means, _), _ = self.ask("kmeanspp", [], **{"k-local": len(self.table.X), "seed": 0})
            self.means = means
        elif kind == "local":
            self.ask("local_kmeans", [], **{"k-local": 3, "seed": 1})
        elif kind == "lloyd":
            self.ask("lloyd", [self.centroids()], **{"local-iters": 1, "tol": 0.0})
        elif kind == "report":
            arrays, metrics = self.ask("evaluate", [self.centroids()], report=True)
            assert int(np.sum(arrays[0])) + metrics.get("withheld-rows", 0) >= 0
        elif kind == "profile":
            C = self.centroids()
            self.ask("profile", [C, C, np.full(3, -1e3), np.full(3, 1e3)], report=True, bins=2)
        elif kind == "fcm":
            self.ask("fcm", [self.centroids()], **{"fuzzifier": 1.01, "local-iters": 1})
        elif kind == "version":
            self._edit()
            self._write()
        elif kind == "missing":
            other = RunSite(self.node, self.cache, str(self.rng.choice(["drop-row", "error"])))
            with pytest.raises(AssertionError, match="missing|the cell is empty"):
                other.ask("describe", [])
            self.refused += 1
        else:
            C = self.centroids()
            race(self.path, self.cache, {"min-cluster-size": self.p}, "impute-mean", self.fill,
                 [C.tolist(), (C + self.rng.normal(0, 0.05, C.shape)).tolist()])

    def _edit(self) -> None:
        change = self.rng.integers(3)
        n = len(self.table.X)
        if change == 0 and n > 3 * self.p + 10:
            self.table.delete(self.rng.choice(n, int(self.rng.integers(1, 4)), replace=False))
        elif change == 1:
            for _ in range(int(self.rng.integers(1, 4))):
                self.table.correct(int(self.rng.integers(n)), int(self.rng.choice([0, 2])),
                                   float(self.rng.normal()))
        else:
            rows = quiet_blobs(int(self.rng.integers(5, 16)), int(self.rng.integers(1 << 20)))
            rows[:, 1] = self.rng.normal(scale=0.01, size=len(rows))
            self.table.append(rows)

    def check(self) -> tuple[list[str], list[str]]:
        """What the suite's own audit finds: (entries that are not their rows' functions,
        span findings)."""
        (store,) = list((self.cache / "groups").glob("store-*"))
        record = RecordCheck(store)
        for version in self.versions:
            record.add_version(version)
        return record.entry_findings(self.cache), record.span_findings(3, self.p)


def run_sequence(tmp_path: Path, seed: int, p: int, steps: int = STEPS) -> Adversary:
    adversary = Adversary(tmp_path, seed, p)
    for kind in adversary.kinds(steps):
        adversary.step(kind)
    return adversary


def unguarded(patch) -> None:
    """The site without its report's defences: the release step judges nothing, the
    builder keeps no straddler whole (not for a cut, not for a stand-in)."""
    from fedcluster.client_app.data import report_cuts, report_table
    from fedcluster.client_app.release import audit

    patch.setattr(audit, "judge", lambda *args, **kwargs: [])
    patch.setattr(report_cuts, "exposed", lambda site, rows, g, *rest: (
        np.zeros(int(g.max()) + 1, dtype=bool), np.zeros(site.n_features, dtype=bool)))
    patch.setattr(report_table, "_stood_in", lambda site, groups, *rest: np.zeros(
        (groups.n_groups, site.n_features), dtype=bool))


def test_the_adversary_finds_values_where_the_site_judges_nothing(tmp_path, monkeypatch):
    """Shown first: the same adversary against a site whose release step judges nothing
    (and whose report builder keeps nothing whole) leaves cells in the record's span."""
    unguarded(monkeypatch)
    _, span = run_sequence(tmp_path, 1, 3).check()
    assert any("isolates 1 value" in finding for finding in span), span


@pytest.mark.parametrize("seed, p", [(0, 2), (1, 3), (2, 5)])
def test_a_random_adversary_leaves_nothing_in_the_records_span(tmp_path, seed, p):
    adversary = run_sequence(tmp_path, seed, p)
    entries, span = adversary.check()
    assert entries == [], entries
    assert span == [], span
    assert len(adversary.versions) >= 3 and adversary.refused >= 1  # versions, readings


def test_the_suites_audit_finds_a_partition_one_row_apart():
    """The suite's own audit is not blind: a table and two report partitions that differ
    by one row give that row (a combination of one value)."""
    from record_check import _smallest_support

    table = [[0, 1], [2, 3], [4, 5], [6, 7]]
    first, second = [0, 2, 4, 6], [0, 2, 4, 6, 1]
    A = np.zeros((len(table) + 2, 8))
    for r, rows in enumerate(table + [first, second]):
        A[r, rows] = 1.0
    assert _smallest_support(A) == 1
    assert _smallest_support(A[:-1]) >= 2

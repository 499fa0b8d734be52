"""Versions of a site's data, over VALUES (issue 54, must-show 1).

A site reads a real CSV through its cache (the real ClientApp, its Context kept, as a
SuperNode runs it); the file changes between versions. The unknowns a coordinator
works on are the cells' VALUES: a corrected row's unchanged cells are the same values in
every version, and a set's sum with its sum of squares pins two values.

- **A correction and an appended row** (honest coordinator, ``describe`` and ``stats``
  of each version): the difference of two versions' totals, and of their sums of
  squares, gives the changed rows' values: shown first against a site answering from
  its rows (every time), then against the site's defaults and p 3 and 5 (nothing). At p
  2 one correction and one appended row; at p 3 two corrections and one row; at p 5 five
  corrections and a row, then two more and a row (the attack also tries pairs, through
  the sums of squares); with and without an id column.
Random histories of 50 versions: ``test_value_histories.py`` (this module's tools).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from test_versions import FileSite, Table, blobs


class CellTable(Table):
    """A :class:`test_versions.Table` that also counts each cell's corrections: a cell's
    VALUE is (row id, column, its corrections so far)."""

    def __init__(self, X: np.ndarray, with_id: bool) -> None:
        super().__init__(X, with_id)
        self.cell_edits = np.zeros(self.X.shape, dtype=np.int64)

    def delete(self, rows) -> None:
        super().delete(rows)
        self.cell_edits = np.delete(self.cell_edits, rows, axis=0)

    def correct(self, row: int, column: int, by: float) -> None:
        super().correct(row, column, by)
        self.cell_edits[row, column] += 1

    def append(self, rows: np.ndarray) -> None:
        super().append(rows)
        self.cell_edits = np.vstack([self.cell_edits, np.zeros(rows.shape, dtype=np.int64)])

    def values(self) -> dict:
        """{(row id, column, corrections): value} of this version."""
        return {(int(i), j, int(e)): float(v) for i, row, edits in zip(self.ids, self.X, self.cell_edits)
                for j, (v, e) in enumerate(zip(row, edits))}


# ------------------------------------------------------------------ the honest attack
def moments(site: FileSite) -> tuple[int, np.ndarray, np.ndarray]:
    """What ``stats`` gives an honest coordinator (with ``describe``'s row count, which
    every reply carries): the rows, and per feature the sum and the sum of squares of
    the site's cells."""
    (mean, deviations, m2), metrics = site.ask("stats", [], scale="standard")
    n = int(metrics["n-rows"])
    return n, n * mean + deviations, m2 + 2 * mean * deviations + n * mean * mean


def totals_attack(before, after) -> list:
    """(feature, value) candidates from two versions' totals: the difference of the sums
    (one value came or went), and, with the sums of squares, a pair (two values)."""
    out = []
    D, E = after[1] - before[1], after[2] - before[2]
    for j in range(D.size):
        for sign in (1.0, -1.0):
            d, e = sign * D[j], sign * E[j]
            out.append((j, d))
            disc = 2 * e - d * d
            if disc >= 0:
                out += [(j, (d + np.sqrt(disc)) / 2), (j, (d - np.sqrt(disc)) / 2)]
    return out


def recovered(candidates, values: dict, tol: float = 1e-9) -> set:
    """The values (keys of ``values``) some candidate equals, in their column."""
    found = set()
    if len(candidates) == 0:
        return found
    candidates = np.asarray(candidates, dtype=np.float64).reshape(-1, 2)
    keys = list(values)
    columns = np.array([k[1] for k in keys])
    cells = np.array([values[k] for k in keys])
    for j in np.unique(columns):
        mine = np.flatnonzero(columns == j)
        guesses = np.sort(candidates[candidates[:, 0] == j, 1])
        guesses = guesses[np.isfinite(guesses)]
        if guesses.size == 0:
            continue
        at = np.clip(np.searchsorted(guesses, cells[mine]), 1, max(guesses.size - 1, 1))
        near = np.minimum(np.abs(guesses[at] - cells[mine]), np.abs(guesses[at - 1] - cells[mine]))
        hit = near <= tol * np.maximum(np.abs(cells[mine]), 1.0)
        found.update(keys[k] for k in mine[hit].tolist())
    return found


def _site(tmp_path, node, with_id, name) -> tuple[FileSite, Path]:
    path, cache = tmp_path / f"{name}.csv", tmp_path / f"cache-{name}"
    return FileSite(path, cache, node, with_id), path


CASES = {  # p: the edits of each version after the first (corrections, rows appended)
    2: [(1, 1)],
    3: [(2, 1)],
    5: [(5, 1), (2, 1)],
}


def _history(rng, table: CellTable, edits) -> None:
    corrections, appended = edits
    for row in rng.choice(len(table.X), corrections, replace=False).tolist():
        table.correct(row, 0, float(rng.normal()))  # column 0: the others keep their values
    if appended:
        table.append(rng.normal(size=(appended, table.X.shape[1])) * 3.0)


def _correction_attack(tmp_path, node, with_id, p, seed, name) -> int:
    """How many values the honest coordinator recovers over the case's versions."""
    rng = np.random.default_rng(seed)
    table = CellTable(blobs(120, seed=seed), with_id)
    site, path = _site(tmp_path, node, with_id, name)
    table.write(path)
    seen, found = [moments(site)], set()
    everything = dict(table.values())
    for edits in CASES[p]:
        _history(rng, table, edits)
        table.write(path)
        everything.update(table.values())
        seen.append(moments(site))
        for a in range(len(seen) - 1):
            found |= recovered(totals_attack(seen[a], seen[-1]), everything)
    return len(found)


@pytest.mark.parametrize("with_id", [False, True], ids=["no id", "id column"])
@pytest.mark.parametrize("p", sorted(CASES))
def test_a_correction_and_an_appended_row_give_values_only_from_rows(tmp_path, p, with_id):
    seeds = range(4)
    control = [_correction_attack(tmp_path, {"min-cluster-size": 1}, with_id, p, s, f"c{s}")
               for s in seeds]
    assert all(n >= 1 for n in control), control  # the attack works: it finds the values
    default = [_correction_attack(tmp_path, {} if p == 2 else {"min-cluster-size": p}, with_id,
                                  p, s, f"d{s}") for s in seeds]
    assert default == [0] * len(seeds)

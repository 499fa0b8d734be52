"""What one report partition of the coordinator's drawing discloses (issue 69, its fourth
finding), with the report's parts (node config ``report-parts = true``, the default) and
with every group whole (``false``), measured against a site's real ClientApp.

The coordinator lays 12 centroids on a line along one feature, the others at the site's
mean, so that each cluster is a slab of that feature between two midpoints, and asks
the report's evaluation (``report = true``): per slab its rows and their sum. On a
whole-number column (ages in years) with slabs one year wide, an inner slab of the
report's parts holds the rows of one age: a frequency table, at least p_site rows a cell.
Counted here, from the site's rows (what the coordinator could tell for sure is at most
this): ``one-value cells``, the rows that lie in a slab all of whose rows hold one value
of the feature; on a continuous column with slabs 0.1 SD wide, ``pinned``, the rows of a
slab whose rows all lie within 0.05 SD of its mean. Each at p_site 2, 3 and 5, on a site
of 600 rows (seeded): an age in whole years (mean 50, SD 12) and three continuous
features, one of them the continuous column.

Usage::

    python bench/report_slabs.py [--out BENCHMARKS.md]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import report  # noqa: E402


def _rows(seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(600, 4))
    X[:, 0] = np.round(rng.normal(50, 12, 600))
    return X


def slabs(p: int, parts: bool, column: int, work: Path) -> tuple[int, int]:
    """(rows disclosed, rows) for one slab attack: 12 centroids one year (``column`` 0)
    or 0.1 SD apart along ``column``, the report's evaluation, and the rows of each slab
    judged from the site's own rows (one value, or within 0.05 SD of the slab's mean)."""
    from fedcluster.client_app.data import group_table, report_table
    from fedcluster.client_app.data.site_data import load_site_file
    from record_check import RunSite

    X = _rows()
    path, cache = work / "site.csv", work / "cache"
    work.mkdir(parents=True, exist_ok=True)
    path.write_text("age,a,b,c\n" + "".join(",".join(repr(float(v)) for v in row) + "\n" for row in X))
    site = RunSite({"data-path": str(path), "min-cluster-size": p, "report-parts": parts}, cache,
                   "error")
    sd = float(X[:, column].std())
    step = 1.0 if column == 0 else 0.1 * sd
    C = np.repeat(X.mean(axis=0)[None, :], 12, axis=0)
    C[:, column] = np.median(X[:, column]) + step * (np.arange(12) - 5.5)
    site.ask("evaluate", [C], report=True)  # (the partition the site answers)
    data = load_site_file(path, cache_dir=cache)
    if parts:
        groups, of_row = report_table.as_answered(data, p, cache, C, None)
    else:
        groups, _ = group_table.site_groups(data, p, cache)
        of_row = group_table.row_groups(data, p, cache)
    slab = np.full(len(X), -1)
    grouped = of_row >= 0
    slab[grouped] = ((np.asarray(groups.means)[:, None, :] - C[None]) ** 2).sum(-1).argmin(1)[
        of_row[grouped]]
    disclosed = 0
    for s in np.unique(slab[slab >= 0]):
        values = X[slab == s, column]
        one = np.unique(values).size == 1 if column == 0 else \
            np.abs(values - values.mean()).max() <= 0.05 * sd
        disclosed += int(one) * values.size
    return disclosed, int(grouped.sum())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    report.quiet_flower()
    lines = ["| p_site | report | age: one-value cells (rows) | a continuous feature: rows pinned "
             "within 0.05 SD |",
             "|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as tmp:
        for p in (2, 3, 5):
            for parts in (True, False):
                work = Path(tmp) / f"p{p}-{parts}"
                age, rows = slabs(p, parts, 0, work / "age")
                pinned, _ = slabs(p, parts, 1, work / "continuous")
                lines.append(f"| {p} | {'parts' if parts else 'groups whole'} | {age} of {rows} | "
                             f"{pinned} of {rows} |")
                print(lines[-1], flush=True)
    text = (report.header("One report partition of the coordinator's drawing (slabs)") + "\n"
            + __doc__.split("Usage::")[0].split("\n\n", 1)[1].strip() + "\n\n" + "\n".join(lines) + "\n")
    report.write_section("report-slabs", text, args.out)


if __name__ == "__main__":
    main()

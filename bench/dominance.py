"""The dominance rules (``client_app/release/dominance.py``): what they flag.

A unit's spread (``release/spreads.py``) is withheld in a feature when one of its rows
stands at least ``DOMINANT_SD`` of the feature's standard deviations from its group's
mean and the unit's spread puts that row within ``ESTIMATE_WITHIN`` of its distance
from the mean (the rule on spreads); from p_site ``MEANS_FROM_P`` a group's sum of a
feature is withheld (the site's mean stands in) when one of its rows stands at least
``DOMINANT_SD`` SDs from the site's mean and n x mean - (n - 1) x the site's mean puts
it within ``ESTIMATE_WITHIN`` of that distance (the p% rule on means). Two measurements,
on the quality bench's data sets (z-scored, 5 sites, IID, ``bench/quality.py``), at
p_site 2, 3 and 5:

1. **False flags**: on the sets as they are, the share of each site's rows whose mean or
   spread is withheld in some feature (their group or unit flagged), and of the (row,
   feature) cells;
2. **Outliers caught**: one row per site moved ``--sd`` standard deviations out in one
   feature (a row drawn at random, the feature too, seeded), the share of those rows
   whose group's mean or unit's spread is withheld in that feature, and the
   coordinator's best estimate of the moved value (the spread's: mean + sqrt(m2 (n - 1)
   / n) with what the site keeps; the mean's: n x mean - (n - 1) x the site's mean; the
   site's mean where the group's mean is withheld), off by how much of the value
   (smallest over the sites), with the rules and without them.

Usage::

    python bench/dominance.py --out BENCHMARKS.md
    python bench/dominance.py --sets iris wine --p 3
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
import quality  # noqa: E402
import report  # noqa: E402

from fedcluster.client_app.data import group_table  # noqa: E402
from fedcluster.client_app.data.site_data import SiteData  # noqa: E402
from fedcluster.client_app.release import dominance  # noqa: E402

SETS = ("iris", "wine", "cancer", "digits", "a1", "s1", "s2", "s3", "s4", "unbalance", "d31",
        "r15", "aggregation", "compound", "flame", "jain", "pathbased", "g2", "mnist",
        "outliers", "tiny")


def _table(X: np.ndarray, p: int):
    table, group_of_row = group_table._fresh(SiteData(X, None, None, "site"), p)
    counts, sums, m2, present = table.held()
    if present is None:
        present = np.repeat(counts[:, None], X.shape[1], axis=1)
    return table.spreads, group_of_row, counts, sums, m2, present


def _flags(spreads, group_of_row: np.ndarray, present: np.ndarray,
           dominance_only: bool = True) -> np.ndarray:
    """(n, d) bool: each row's cells whose group's sum the rule on means withheld or
    whose unit's spread the dominance rule withheld (or, ``dominance_only`` False, whose
    unit's spread is not released at all: a unit that gives cells back and could not be
    mended counts too)."""
    flagged = np.zeros((group_of_row.size, present.shape[1]), dtype=bool)
    if spreads is None:
        return flagged
    grouped = group_of_row >= 0
    for position, features in spreads.replaced.items():
        flagged[np.ix_(group_of_row == position, features)] = True
    if dominance_only:
        for position, features in spreads.withheld.items():
            rows = group_of_row == position
            flagged[np.ix_(rows, features)] = True
        return flagged
    released = np.concatenate([spreads._block(lo, min(lo + 4096, spreads.order.size))[3]
                               for lo in range(0, spreads.order.size, 4096)])
    flagged[grouped] |= ~released[group_of_row[grouped]]
    return flagged


def false_flags(X: np.ndarray, p: int) -> tuple[float, float]:
    """(share of rows, share of cells) whose spread the rule withholds."""
    spreads, group_of_row, *_, present = _table(X, p)
    flags = _flags(spreads, group_of_row, present)
    return float(flags.any(axis=1).mean()), float(flags.mean())


def planted(X: np.ndarray, p: int, sd: float, seed: int) -> tuple[bool, float]:
    """One row moved ``sd`` SDs out in one feature: (caught, the best estimate's error
    over the value's distance from the site's mean)."""
    rng = np.random.default_rng(seed)
    X = np.array(X, copy=True)
    row, j = int(rng.integers(len(X))), int(rng.integers(X.shape[1]))
    mean, spread = X[:, j].mean(), X[:, j].std()
    X[row, j] = mean + sd * (spread if spread > 0 else 1.0)
    spreads, group_of_row, counts, sums, m2, present = _table(X, p)
    flags = _flags(spreads, group_of_row, present, dominance_only=False)
    g = group_of_row[row]
    n, v = present[g, j], m2[g, j]
    site_mean = X[:, j].mean()  # (describe gives it; the bench takes the rows')
    truth = X[row, j]
    estimates = [site_mean]  # (nothing released of the row's group in the feature)
    replaced = spreads is not None and j in spreads.replaced.get(int(g), [])
    if n > 0 and not replaced:
        m = sums[g, j] / n
        estimates += [n * m - (n - 1) * site_mean]
        if not flags[row, j]:  # a spread released for the group in the feature
            estimates += [m + np.sqrt(max(v, 0.0) * (n - 1) / n)]
    error = min(abs(e - truth) for e in estimates) / abs(truth - site_mean)
    return bool(flags[row, j]), float(error)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", nargs="+", default=list(SETS))
    parser.add_argument("--p", type=int, nargs="+", default=[2, 3, 5])
    parser.add_argument("--sd", type=float, nargs="+", default=[10.0, 5.0])
    parser.add_argument("--data", type=Path, default=report.SHARED_DATA)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    started = time.time()
    rows = []
    for name in args.sets:
        X, y = quality.load(name, args.data)
        sites = quality.split_sites(X, y, "iid", 0)
        for p in args.p:
            shares = [false_flags(S, p) for S in sites]
            row = {"set": name, "p": p, "rows": float(np.mean([s[0] for s in shares])),
                   "cells": float(np.mean([s[1] for s in shares]))}
            for sd in args.sd:
                caught, errors, bare = [], [], []
                for s, S in enumerate(sites):
                    hit, error = planted(S, p, sd, 100 * s + p)
                    caught.append(hit)
                    errors.append(error)
                    original = dominance.dominated, dominance.dominated_means
                    dominance.dominated = lambda peak, unit_m2, cells: np.zeros(np.shape(peak), bool)
                    dominance.dominated_means = lambda means, *_: np.zeros(np.shape(means), bool)
                    try:
                        bare.append(planted(S, p, sd, 100 * s + p)[1])
                    finally:
                        dominance.dominated, dominance.dominated_means = original
                row[sd] = (float(np.mean(caught)), errors, bare)
            rows.append(row)
            print(name, p, {k: v for k, v in row.items() if k not in args.sd},
                  {sd: (row[sd][0], round(min(row[sd][1]), 3)) for sd in args.sd}, flush=True)
    lines = ["## The dominance rules on spreads and means: false flags and outliers caught "
             "(dominance)", "",
             f"Made by `python bench/dominance.py {' '.join(sys.argv[1:])}` on "
             f"{time.strftime('%Y-%m-%d')}; {report.machine()}.", "",
             f"{len(args.sets)} data sets (z-scored), 5 sites IID (seed 0); the rules: "
             f"on spreads, a row at least {dominance.DOMINANT_SD:g} SD from its group's mean "
             f"whose unit's spread puts it within {dominance.ESTIMATE_WITHIN:.0%} of that "
             f"distance; on means (from p_site {dominance.MEANS_FROM_P}), a row at least "
             f"{dominance.DOMINANT_SD:g} SD from the site's mean that its group's mean puts "
             f"within {dominance.ESTIMATE_WITHIN:.0%}, the other rows taken at the site's "
             "mean. False flags: the mean over the sites of the share of rows (cells) whose "
             "group's mean or unit's spread is withheld. Planted: one row per site moved out "
             "in one feature; caught: the share of the five whose mean or spread is "
             "withheld there; error: the best of the coordinator's estimates (spread, mean, "
             "the site's mean), off by this share of the row's distance from the site's "
             "mean (smallest of the five), with the rules and without them.", ""]
    for p in args.p:
        head = "| set | rows flagged | cells flagged | " + " | ".join(
            f"{sd:g} SD: caught / error (rule) / error (no rule)" for sd in args.sd) + " |"
        lines += [f"p_site {p}:", "", head, "|" + "---|" * (3 + len(args.sd))]
        for row in (r for r in rows if r["p"] == p):
            cells = [f"{row[sd][0]:.0%} / {min(row[sd][1]):.3f} / {min(row[sd][2]):.4f}"
                     for sd in args.sd]
            lines.append(f"| {row['set']} | {row['rows']:.2%} | {row['cells']:.3%} | "
                         + " | ".join(cells) + " |")
        mine = [r for r in rows if r["p"] == p]
        lines.append(f"| all | {np.mean([r['rows'] for r in mine]):.2%} | "
                     f"{np.mean([r['cells'] for r in mine]):.3%} | "
                     + " | ".join(f"{np.mean([r[sd][0] for r in mine]):.0%} / "
                                  f"{min(min(r[sd][1]) for r in mine):.3f} / "
                                  f"{min(min(r[sd][2]) for r in mine):.4f}" for sd in args.sd)
                     + " |")
        lines.append("")
    lines.append(f"Total time {time.time() - started:.0f} s.")
    report.write_section("dominance", "\n".join(lines), args.out)


if __name__ == "__main__":
    main()

"""How often the differencing guard steps in on HONEST runs: why it snaps or withholds
rather than refusing (node config ``guard-refuse``; docs/explanation/privacy-model.md).

Every algorithm at its defaults on bench/quality.py's data sets (z-scored, k = their
classes, 5 sites, IID and Dirichlet 0.3 label skew, seed 0) at the privacy floor p = 2
(with p = 1 the guard checks nothing). For each run, from the sites' own log lines
(``client_app/app.py``: "the differencing guard ... reported N cluster(s) as an earlier
row set and withheld M"): whether the guard stepped in at any site, whether it withheld
a cluster, and the most rounds of one site's run it stepped in. A site with
``guard-refuse = true`` would have refused each of those rounds.

Usage::

    python bench/guard_interventions.py [--algorithms dwf ...] [--sets iris ...] [--out BENCHMARKS.md]
"""

from __future__ import annotations

import argparse
import collections
import logging
import re
import sys
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import quality  # noqa: E402
import report  # noqa: E402

import fedcluster  # noqa: E402

LINE = re.compile(r"site (\S+): task \S+: the differencing guard .* withheld (\d+)")


class GuardLines(logging.Handler):
    """Counts, per site, the rounds the guard stepped in and those it withheld in."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.stepped: collections.Counter = collections.Counter()
        self.withheld: collections.Counter = collections.Counter()

    def emit(self, record: logging.LogRecord) -> None:
        match = LINE.search(record.getMessage())
        if match:
            self.stepped[match.group(1)] += 1
            self.withheld[match.group(1)] += int(match.group(2)) > 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algorithms", nargs="+",
                        default=["dwf", "ewf", "minibatch", "fkm", "kfed", "ffcm", "gtv"])
    parser.add_argument("--sets", nargs="+", default=["iris", "wine", "cancer", "digits",
                                                      *quality.SIPU, "g2", "mnist", "outliers",
                                                      "tiny"])
    parser.add_argument("--data", type=Path, default=report.SHARED_DATA)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    from flwr.common.logger import FLOWER_LOGGER

    lines = GuardLines()
    handlers, level = FLOWER_LOGGER.handlers, FLOWER_LOGGER.level
    FLOWER_LOGGER.handlers = [lines]  # only the guard's lines, counted, not printed
    FLOWER_LOGGER.setLevel(logging.INFO)
    try:
        runs = sweep(args, lines)
    finally:
        FLOWER_LOGGER.handlers = handlers
        FLOWER_LOGGER.setLevel(level)
    write(args, runs)


def sweep(args, lines: GuardLines) -> dict[str, list]:
    """Every run; per algorithm (the most rounds of a site the guard stepped in, whether it
    withheld a cluster, the run's rounds)."""
    runs = collections.defaultdict(list)
    for name, split, _, k, sites in quality.federations(args.sets, args.data):
        for algorithm in args.algorithms:
            lines.stepped.clear()
            lines.withheld.clear()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                try:
                    result = fedcluster.simulate(sites, algorithm=algorithm, n_clusters=k,
                                                 min_cluster_size=2, seed=0,
                                                 central_baseline=False)
                except Exception as err:  # a refused run is a line, not a crash
                    print(f"{name} {split} {algorithm}: {err}", flush=True)
                    continue
            most = max(lines.stepped.values(), default=0)
            runs[algorithm].append((most, sum(lines.withheld.values()) > 0,
                                    len(result.history)))
            print(f"{name:11s} {split:4s} {algorithm:9s} {len(result.history):3d} rounds; "
                  f"the guard stepped in on up to {most} rounds of a site, withheld in "
                  f"{sum(lines.withheld.values())} site-rounds", flush=True)
    return runs


def write(args, runs: dict[str, list]) -> None:
    table = ["| algorithm | runs | guard stepped in (runs) | withheld a cluster (runs) | "
             "rounds of one site it stepped in: median / most | rounds per run (median) |",
             "|---|---|---|---|---|---|"]
    for algorithm, got in runs.items():
        most = np.array([g[0] for g in got])
        table.append(f"| {algorithm} | {len(got)} | {int((most > 0).sum())} | "
                     f"{sum(g[1] for g in got)} | {int(np.median(most))} / {most.max()} | "
                     f"{int(np.median([g[2] for g in got]))} |")
    total = sum(len(g) for g in runs.values())
    stepped = sum(int(g[0] > 0) for got in runs.values() for g in got)
    text = "\n".join([
        report.header("The differencing guard on honest runs (guard-interventions)"), "",
        f"{len(args.sets)} data sets ({', '.join(args.sets)}), z-scored, k = their classes, "
        f"{quality.SITES} sites (IID and Dirichlet 0.3 label skew), seed 0, every algorithm at "
        f"its defaults with the privacy floor p = 2. Counted from the sites' log lines. The "
        f"guard stepped in on {stepped} of {total} honest runs: a site with `guard-refuse = "
        "true` would have refused a task in each of them, which is why the default snaps or "
        "withholds instead.", "", *table]) + "\n"
    print(text)
    if args.out:
        report.write_section("guard-interventions", text, args.out)


if __name__ == "__main__":
    main()

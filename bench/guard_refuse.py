"""Honest runs whose every site refuses what its differencing guard would alter (node
config ``guard-refuse = true``), against the default that answers with earlier statistics:
what refusing costs, with the server's stand-ins (strategies/stand_ins.py) in place.

Every algorithm at its defaults on bench/quality.py's data sets (z-scored, k = their
classes, 5 sites, IID and Dirichlet 0.3 label skew, seed 0) at the privacy floor p = 2,
each run twice (snapping, refusing). Per algorithm: the runs that stopped (too few valid
replies), the finished runs whose evaluation left a refusing site out (the reported score
is then that of fewer rows), the training rounds a site's earlier reply stood in for, and
the pooled SSE of the final centroids over every row (computed here, where the rows are
pooled) as a ratio to the snapping run's.

Usage::

    python bench/guard_refuse.py [--algorithms dwf ...] [--sets iris ...] [--out BENCHMARKS.md]
"""

from __future__ import annotations

import argparse
import collections
import logging
import sys
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import quality  # noqa: E402
import report  # noqa: E402

import fedcluster  # noqa: E402


def pooled_sse(X: np.ndarray, centroids: np.ndarray) -> float:
    """Sum over every row of its squared distance to the nearest centroid."""
    sse = 0.0
    for start in range(0, len(X), 4096):  # in slabs: mnist's rows x k x d would not fit
        block = X[start:start + 4096]
        sse += float(((block[:, None, :] - centroids[None]) ** 2).sum(-1).min(1).sum())
    return sse


def one(sites, X, k, algorithm) -> tuple:
    """(stopped, evaluation left a site out, stand-ins, SSE ratio refuse / snap)."""
    run = dict(algorithm=algorithm, n_clusters=k, min_cluster_size=2, seed=0,
               central_baseline=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        snapping = fedcluster.simulate(sites, **run)
        try:
            refusing = fedcluster.simulate(sites, site_config={"guard-refuse": True}, **run)
        except Exception:  # the run stopped: too few valid replies in a round that needs them
            return True, False, 0, float("nan")
    notes = [n for got in refusing.metrics["site-failures"].values() for n in got]
    stand_ins = sum("stands in" in n for n in notes)
    left_out = refusing.metrics["n-rows"] < len(X)
    return False, left_out, stand_ins, pooled_sse(X, refusing.centroids) / pooled_sse(
        X, snapping.centroids)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algorithms", nargs="+",
                        default=["dwf", "ewf", "minibatch", "fkm", "kfed", "ffcm", "gtv"])
    parser.add_argument("--sets", nargs="+", default=["iris", "wine", "cancer", "digits",
                                                      *quality.SIPU, "g2", "outliers", "tiny"])
    parser.add_argument("--data", type=Path, default=report.SHARED_DATA)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    from flwr.common.logger import FLOWER_LOGGER

    handlers = FLOWER_LOGGER.handlers
    # thousands of refusal lines: counted from the run's metrics instead
    FLOWER_LOGGER.handlers = [logging.NullHandler()]
    try:
        runs = collections.defaultdict(list)
        for name, split, X, k, sites in quality.federations(args.sets, args.data):
            for algorithm in args.algorithms:
                got = one(sites, X, k, algorithm)
                runs[algorithm].append(got)
                print(f"{name:11s} {split:4s} {algorithm:9s} stopped={got[0]} "
                      f"left-out={got[1]} stand-ins={got[2]} sse-ratio={got[3]:.4f}", flush=True)
    finally:
        FLOWER_LOGGER.handlers = handlers
    write(args, runs)


def write(args, runs: dict[str, list]) -> None:
    table = ["| algorithm | runs | stopped | finished, evaluation left a site out | training "
             "rounds stood in for (sum) | pooled SSE refusing / snapping: median / 90th pct / "
             "most (finished runs) |", "|---|---|---|---|---|---|"]
    for algorithm, got in runs.items():
        ratios = np.array([g[3] for g in got if not g[0]])
        spread = (f"{np.median(ratios):.4f} / {np.percentile(ratios, 90):.4f} / "
                  f"{ratios.max():.4f}" if ratios.size else "-")
        table.append(f"| {algorithm} | {len(got)} | {sum(g[0] for g in got)} | "
                     f"{sum(g[1] for g in got)} | {sum(g[2] for g in got)} | {spread} |")
    text = "\n".join([
        report.header("Every site refusing what its guard would alter (guard-refuse)"), "",
        f"{len(args.sets)} data sets ({', '.join(args.sets)}), z-scored, k = their classes, "
        f"{quality.SITES} sites (IID and Dirichlet 0.3 label skew), seed 0, every algorithm "
        "at its defaults with the privacy floor p = 2, each run with every site at "
        "`guard-refuse = true` and at the default. A refused training task is answered by "
        "the site's earlier reply when it has one in the repetition (the server's stand-in); "
        "a refused evaluation has none. `stopped`: the refusing run ended with too few valid "
        "replies; the SSE is over every pooled row, of the final centroids.", "",
        *table]) + "\n"
    print(text)
    if args.out:
        report.write_section("guard-refuse", text, args.out)


if __name__ == "__main__":
    main()

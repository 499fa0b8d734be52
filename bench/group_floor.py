"""What the groups' statistics allow (issue 45): central k-means on the pooled groups of
the quality bench's federations, against central k-means on the rows.

For every data set and split of ``bench/quality.py`` (5 sites, seed 0) and every p_site,
each site's groups are made as a site makes them (``group_table.build``), pooled, and
fitted centrally, with nothing federated:

- ``best``: weighted k-means on the pooled groups' means (k-means++, 10 restarts), then,
  at p_site >= 3, Lloyd with every group split by its spread (``kernels/spread.py``, what
  the sites' training tasks compute) to convergence: the best fit a federation of these
  groups can hope for from a good start;
- ``at optimum``: the same split Lloyd (whole groups at p_site 2) started from central
  k-means' own centroids on the rows: where the groups move the optimum itself, whatever
  the start (the groups' bias);
- ``sigma``: the issue's probe, each group replaced by 2d points that keep its mean and
  per-feature variance (mean +- sqrt(d var_j) along feature j, weight w / 2d), then
  weighted k-means (10 restarts).

Each figure: the k-means objective of the fit's centroids on the pooled rows over that
of scikit-learn's KMeans (n_init 10) on the rows.

Beside the fits, ``under p``: the share of the rows whose piece of central's optimum (the
rows a site holds of one of its clusters) is smaller than p_site. A site's sum over such a
piece is a value of fewer than p of its rows, which no reply may carry: where the optimum
is made of such pieces (r15 at p_site 10, 8 rows a cluster a site; ``outliers``, whose
optimum gives clusters of 2 and 3 far rows), a run that kept the promise cannot be
expected to reach it, whatever its method.

``--partitions`` also measures other ways a site could cut its rows into groups of at
least p (the issue's "V-MDAV and its relatives"), made here from the rows (bench only):
``mdav`` (Domingo-Ferrer & Torra 2005: groups of exactly p, the farthest row from the
centroid of those left and its p - 1 nearest, then the farthest from that row and its
nearest, and so on) and ``vmdav`` (Solanas & Martinez-Balleste 2006: each such group
grows by up to p - 1 more rows, the unassigned row nearest the group joining while it is
nearer the group than gamma = 0.2 x its distance to the nearest other unassigned row). A federated run's figure
(``bench/quality.py --site-floors``) cannot be expected below ``at optimum`` in general:
the groups' moments are all any run sees.

Usage::

    python bench/group_floor.py [--site-floors 2 3 5 10] [--sets iris ...] [--out BENCHMARKS.md]
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import quality  # noqa: E402
import report  # noqa: E402

from fedcluster.client_app import local_kmeans as local  # noqa: E402
from fedcluster.client_app.data import group_table  # noqa: E402
from fedcluster.client_app.data.group_cost import as_site  # noqa: E402
from fedcluster.common.kernels.spread import SPREAD_MIN_SIZE  # noqa: E402

FITS = ("best", "at optimum", "sigma")


#: The sigma probe's points (2d per group, d features each) at most this big: not on
#: MNIST (784 features: 2,500 groups at p 2 would take 24 GB).
SIGMA_MAX_BYTES = 2 << 30
#: V-MDAV's gamma (the authors' recommendation for scattered data).
VMDAV_GAMMA = 0.2


def _sq(A: np.ndarray, b: np.ndarray) -> np.ndarray:
    return ((A - b) ** 2).sum(axis=1)


def mdav_labels(X: np.ndarray, p: int, gamma: float | None = None) -> np.ndarray:
    """Each row's group by MDAV (``gamma`` None) or V-MDAV (module docstring)."""
    n = len(X)
    labels = np.full(n, -1, dtype=np.int64)
    left = np.arange(n)
    group = 0

    def take(anchor: int) -> None:
        nonlocal left, group
        d = _sq(X[left], X[anchor])
        members = left[np.argsort(d, kind="stable")[:p]]
        labels[members] = group
        left = left[labels[left] < 0]
        if gamma is not None:  # V-MDAV: grow by up to p - 1 more rows
            for _ in range(p - 1):
                if len(left) < 2:
                    break
                inside = labels == group
                d_in = np.min([_sq(X[left], x) for x in X[inside]], axis=0)
                u = int(np.argmin(d_in))
                d_out = _sq(X[left], X[left[u]])
                d_out[u] = np.inf
                if np.sqrt(d_in[u]) >= gamma * np.sqrt(d_out.min()):
                    break
                labels[left[u]] = group
                left = np.delete(left, u)
        group += 1

    while len(left) >= 3 * p:
        r = left[np.argmax(_sq(X[left], X[left].mean(axis=0)))]
        take(r)
        if len(left) >= p:
            take(left[np.argmax(_sq(X[left], X[r]))])
    if len(left) >= 2 * p:
        take(left[np.argmax(_sq(X[left], X[left].mean(axis=0)))])
    if len(left):
        labels[left] = group
    return labels


def _moments(X: np.ndarray, labels: np.ndarray):
    counts = np.bincount(labels).astype(np.float64)
    means = np.zeros((len(counts), X.shape[1]))
    np.add.at(means, labels, X)
    means /= counts[:, None]
    variances = np.zeros_like(means)
    np.add.at(variances, labels, (X - means[labels]) ** 2)
    return means, counts, variances / counts[:, None]


def pooled_groups(sites, p: int, partition: str = "product"):
    """The sites' groups at p_site = p, pooled: means, rows, per-feature variances.
    ``partition``: ``product`` (as a site makes them), ``mdav`` or ``vmdav``."""
    means, counts, variances = [], [], []
    for rows in sites:
        if partition == "product":
            groups = group_table.build(as_site(rows), p)[0]
            n = np.asarray(groups.counts, dtype=np.float64)
            found = np.asarray(groups.sums) / n[:, None], n, groups.variances
        else:
            found = _moments(rows, mdav_labels(rows, p, VMDAV_GAMMA if partition == "vmdav"
                                                 else None))
        for into, value in zip((means, counts, variances), found):
            into.append(value)
    return np.concatenate(means), np.concatenate(counts), np.concatenate(variances)


def split_lloyd(means, counts, variances, C, p: int) -> np.ndarray:
    """Lloyd on the groups to convergence: split by their spread at p >= 3, else whole."""
    spread = variances if p >= SPREAD_MIN_SIZE else None
    return local.lloyd(means, C, 500, 1e-10, counts.astype(np.int64), None, spread)[0]


def fits(X, k, sites, p: int, optimum: np.ndarray, partition: str = "product") -> dict[str, np.ndarray]:
    from sklearn.cluster import KMeans

    means, counts, variances = pooled_groups(sites, p, partition)
    best = KMeans(k, n_init=10, random_state=0).fit(means, sample_weight=counts).cluster_centers_
    found = {"best": split_lloyd(means, counts, variances, best, p),
             "at optimum": split_lloyd(means, counts, variances, optimum, p), "sigma": None}
    d = X.shape[1]
    if 2 * d * len(means) * d * 8 <= SIGMA_MAX_BYTES:
        offsets = np.sqrt(d * variances)
        points = np.concatenate([means + sign * offsets * np.eye(d)[j]
                                 for sign in (1.0, -1.0) for j in range(d)])
        found["sigma"] = KMeans(k, n_init=10, random_state=0).fit(
            points, sample_weight=np.tile(counts / (2 * d), 2 * d)).cluster_centers_
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--site-floors", nargs="+", type=int, default=[2, 3, 5, 10])
    parser.add_argument("--sets", nargs="+", default=["iris", "wine", "cancer", "digits",
                                                      *quality.SIPU, "g2", "mnist",
                                                      "outliers", "tiny"])
    parser.add_argument("--partitions", nargs="+", default=["product"],
                        choices=["product", "mdav", "vmdav"])
    parser.add_argument("--data", type=Path, default=report.SHARED_DATA)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--section", default="quality-group-floor")
    args = parser.parse_args()
    from sklearn.cluster import KMeans

    began = time.monotonic()
    rows = []
    for name in args.sets:
        X, y = quality.load(name, args.data)
        k = len(np.unique(y))
        reference = KMeans(k, n_init=10, random_state=0).fit(X)
        for split in quality.SPLITS:
            parts = quality.site_rows(y, split)
            sites = [X[rows] for rows in parts]
            for p, partition in [(p, q) for p in args.site_floors for q in args.partitions]:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    found = fits(X, k, sites, p, reference.cluster_centers_, partition)
                row = {"set": name, "split": split, "p": p, "partition": partition,
                       **{fit: np.nan if C is None else quality.sse(X, C) / reference.inertia_
                          for fit, C in found.items()},
                       "under p": quality.under_p(reference.labels_, parts, p)}
                rows.append(row)
                print(f"{name:11s} {split:4s} p_site {p:2d} {partition:7s}: "
                      + "  ".join(f"{fit} {row[fit]:.4f}" for fit in FITS)
                      + f"  under p {row['under p']:.1%}", flush=True)
    lines = [report.header(f"What the groups allow ({args.section})"), "",
             f"{len(args.sets)} data sets ({', '.join(args.sets)}), z-scored, k = their classes, "
             f"{quality.SITES} sites (IID, and Dirichlet 0.3 label skew), seed 0: the "
             "federations of `quality-site-floors`. Each site's groups made as a site makes "
             "them, pooled and fitted centrally (nothing federated): `best`, weighted k-means "
             "on the groups' means (10 restarts) then, at p_site >= 3, Lloyd with every group "
             "split by its spread to convergence; `at optimum`, the same Lloyd from central "
             "k-means' own centroids (the optimum's shift under the groups, whatever the "
             "start); `sigma`, the issue's probe (2d points per group keeping its mean and "
             "per-feature variance, weighted k-means, 10 restarts). Each figure: the k-means "
             "objective of the fit on the pooled rows over that of scikit-learn's KMeans "
             "(n_init 10) on the rows; median / 90th percentile / worst (set). `sigma` leaves out "
             "the sets whose 2d points per group would exceed "
             f"{SIGMA_MAX_BYTES >> 30} GB (MNIST). `under p`: the share of the rows whose "
             "site holds fewer than p_site rows of their cluster in central's optimum "
             "(values no reply may carry), median / worst (set).", "",
             "| p_site | split | partition | " + " | ".join(FITS) + " | under p |",
             "|---|---|---|" + "---|" * (len(FITS) + 1)]
    for p, split, partition in [(p, s, q) for p in args.site_floors for s in quality.SPLITS
                                for q in args.partitions]:
        sel = [r for r in rows if (r["p"], r["split"], r["partition"]) == (p, split, partition)]
        cells = []
        for fit in FITS:
            values = np.array([r[fit] for r in sel])
            if np.all(np.isnan(values)):
                cells.append("-")
                continue
            worst = sel[int(np.nanargmax(values))]["set"]
            cells.append(f"{np.nanmedian(values):.4f} / {np.nanpercentile(values, 90):.4f} / "
                         f"{np.nanmax(values):.4f} ({worst})")
        shares = np.array([r["under p"] for r in sel])
        cells.append(f"{np.median(shares):.1%} / {shares.max():.1%} "
                     f"({sel[int(np.argmax(shares))]['set']})")
        lines.append(f"| {p} | {split} | {partition} | " + " | ".join(cells) + " |")
    lines += ["", f"Total time {time.monotonic() - began:.0f} s."]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        report.write_section(args.section, text, args.out)


if __name__ == "__main__":
    main()

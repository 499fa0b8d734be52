"""Quality at defaults (issue 21): each algorithm at its defaults on every data set the
project can use, as a ratio to central k-means measured in the same run.

Data sets (each z-scored; k = the reference number of classes): scikit-learn's bundled
iris, wine, breast cancer and digits; the SIPU sets in ``../shared/data/sipu`` (a1, s1-s4,
unbalance, d31, r15, aggregation, compound, flame, jain, pathbased); G2 (D = 2, S = 50);
5,000 MNIST test images; and seeded synthetic sets (``outliers``: eight groups, two of 8
rows, and 10 far outliers; ``tiny``: six groups of 400 and three of 12). Each is split over
5 sites IID and by label skew (Dirichlet 0.3, ``common/datasets.partition``).

Runs: ``fedcluster.simulate`` (the real ServerApp and ClientApps in process), one per data
set, split, floor (the run's ``min-cluster-size``), the sites' own floor p_site (their node
config ``min-cluster-size``: the size of the groups they answer from, default 2; 1: the
sites answer from their rows) and mode:

- ``plain``: the algorithm at its defaults;
- ``secure``: ``secure-aggregation`` at its defaults (the sum-only ``divisive`` start),
  ``secagg-data-bound`` = the data's largest |value|;
- ``dp10``: DP at epsilon 10 (delta 1e-5) with ``data-bounds`` = the pooled data's
  per-feature range (the best a data officer can declare), ``num-rounds`` 10;
- ``dp10-box``: the same from the start ``divisive`` replaced (``init = "random"``: k
  points uniform in the ``data-bounds`` box, no round);
- ``dp10-oracle``: the same from central k-means' own centroids (``init_centroids``, no
  start round): what the noise alone costs, whatever the start.

Score: the k-means objective of the run's final centroids on the pooled data, computed
here (a DP run's own score is noisy), over that of scikit-learn's KMeans (n_init 10) on
the same data; for ``secure`` and ``dp10`` also over the plain run of the same data set
and split (the issue's "<= 1.02 x the plain k-FED-started run"). For FFCM the score is
the fuzzy objective J_m (fuzzifier 2, memberships optimal for the centres: J_m =
sum_i (sum_j d_ij^(-1/(m-1)))^-(m-1), d the squared distances) over that of central fuzzy
c-means, the best of 10 k-means++-seeded runs to convergence.

Usage::

    python bench/quality.py [--algorithms dwf ...] [--modes plain secure dp10]
                            [--floors 1 2] [--site-floors 1 2] [--sets iris ...]
                            [--out BENCHMARKS.md]
"""

from __future__ import annotations

import argparse
import gzip
import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import report  # noqa: E402

import fedcluster  # noqa: E402
from fedcluster.common.config import run_config_defaults
from fedcluster.common.datasets import partition  # noqa: E402

SITES = 5
SIPU = ("a1", "s1", "s2", "s3", "s4", "unbalance", "d31", "r15", "aggregation", "compound",
        "flame", "jain", "pathbased")
SPLITS = {"iid": "iid", "skew": "dirichlet:0.3"}


def site_rows(y: np.ndarray, split: str, seed: int = 0) -> list[np.ndarray]:
    """Each of the bench's SITES sites' row indices under ``split`` (a SPLITS key)."""
    return partition(y, SITES, SPLITS[split], seed=seed)


def split_sites(X: np.ndarray, y: np.ndarray, split: str, seed: int = 0) -> list[np.ndarray]:
    """The bench's SITES sites of a data set under ``split`` (a SPLITS key)."""
    return [X[idx] for idx in site_rows(y, split, seed)]


def under_p(labels: np.ndarray, parts: list[np.ndarray], p: int) -> float:
    """The share of the rows whose site holds fewer than ``p`` rows of their cluster
    (``labels``: central's optimum; ``parts``: each site's row indices): the rows in the
    optimum's pieces whose sums no reply may carry at p_site ``p``."""
    pieces = np.array([np.bincount(labels[rows], minlength=labels.max() + 1) for rows in parts])
    return float(pieces[(pieces > 0) & (pieces < p)].sum() / len(labels))


def federations(sets, data: Path):
    """(name, split, X, k, sites) for every data set and split: the federations the
    guard benches run (z-scored rows, k = the set's classes)."""
    for name in sets:
        X, y = load(name, data)
        for split in SPLITS:
            yield name, split, X, len(np.unique(y)), split_sites(X, y, split)


def zscore(X: np.ndarray) -> np.ndarray:
    X = np.asarray(X, dtype=np.float64)
    sd = X.std(axis=0)
    return (X - X.mean(axis=0)) / np.where(sd > 0, sd, 1.0)


def synthetic(name: str) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(21)
    if name == "outliers":
        centres, sizes = rng.normal(0, 5, (8, 6)), [500] * 6 + [8, 8]
    else:  # tiny
        centres, sizes = rng.normal(0, 6, (9, 4)), [400] * 6 + [12] * 3
    X = np.concatenate([rng.normal(c, 1.0, (s, centres.shape[1])) for c, s in zip(centres, sizes)])
    y = np.repeat(np.arange(len(sizes)), sizes)
    if name == "outliers":
        X = np.concatenate([X, rng.normal(0, 30, (10, 6))])
        y = np.concatenate([y, np.full(10, 7)])  # the outliers join a tiny group's label
    return X, y


def load(name: str, data: Path) -> tuple[np.ndarray, np.ndarray]:
    """(X z-scored, y) of data set ``name``."""
    from sklearn import datasets

    bundled = {"iris": datasets.load_iris, "wine": datasets.load_wine,
               "cancer": datasets.load_breast_cancer, "digits": datasets.load_digits}
    if name in bundled:
        d = bundled[name]()
        X, y = d.data, d.target
    elif name in SIPU:
        X = np.loadtxt(gzip.open(data / "sipu" / f"{name}.data.gz"))
        y = np.loadtxt(gzip.open(data / "sipu" / f"{name}.labels0.gz")).astype(int)
    elif name == "g2":
        X = np.loadtxt(data / "g2" / "g2-2-50.txt")
        y = (np.arange(len(X)) >= 1024).astype(int)
    elif name == "mnist":
        m = np.load(data / "mnist_uint8.npz")
        X, y = m["x_test"][:5000] / 255.0, m["y_test"][:5000]
    else:
        X, y = synthetic(name)
    return zscore(X), np.asarray(y, dtype=np.int64)


def _blocks(X: np.ndarray, C: np.ndarray):
    for start in range(0, len(X), 4096):
        block = X[start:start + 4096]
        yield block, np.maximum(((block[:, None, :] - C[None]) ** 2).sum(-1), 1e-300)


def fuzzy_objective(X: np.ndarray, C: np.ndarray, m: float = 2.0) -> float:
    """J_m of centres C with the memberships that minimise it (Bezdek's)."""
    return float(sum((d ** (-1.0 / (m - 1))).sum(1).__pow__(-(m - 1)).sum()
                     for _, d in _blocks(X, C)))


def central_fcm(X: np.ndarray, k: int, m: float = 2.0, starts: int = 10) -> float:
    """The lowest J_m of ``starts`` central fuzzy c-means runs from k-means++ seeds."""
    from sklearn.cluster import kmeans_plusplus

    best = np.inf
    for seed in range(starts):
        C = kmeans_plusplus(X, k, random_state=seed)[0]
        for _ in range(500):
            num, den = np.zeros_like(C), np.zeros(k)
            for block, d in _blocks(X, C):
                u = d ** (-1.0 / (m - 1))
                um = (u / u.sum(1, keepdims=True)) ** m
                num += um.T @ block
                den += um.sum(0)
            new = num / den[:, None]
            moved = float(np.linalg.norm(new - C, axis=1).sum())
            C = new
            if moved < 1e-9:
                break
        best = min(best, fuzzy_objective(X, C, m))
    return best


def sse(X: np.ndarray, C: np.ndarray) -> float:
    total = 0.0
    for start in range(0, len(X), 4096):
        block = X[start:start + 4096]
        total += float(((block[:, None, :] - C[None]) ** 2).sum(-1).min(1).sum())
    return total


def run(sites, k, algorithm, mode, floor, X, central, extra: dict,
        site_floor: int = 2, seed: int = 0) -> tuple[float, int, bool]:
    """(score, all the run's rounds, whether its best repetition used every one of its
    ``num-rounds`` update rounds: it stopped at the cap, not on ``tol``)."""
    config = {"algorithm": algorithm, "n_clusters": k, "min_cluster_size": floor, "seed": seed,
              "central_baseline": False, "site_config": {"min-cluster-size": site_floor},
              **extra}
    if mode == "secure":
        config.update(secure_aggregation=True,
                      secagg_data_bound=float(np.ceil(np.abs(X).max() + 1e-9)))
    elif mode in ("dp10", "dp10-box", "dp10-oracle"):
        lo, hi = X.min(axis=0), X.max(axis=0)
        config.update(dp_epsilon=10.0, num_rounds=10, data_bounds=",".join(
            f"{a:.6g}:{max(b, a + 1e-6):.6g}" for a, b in zip(np.floor(lo * 1e4) / 1e4,
                                                               np.ceil(hi * 1e4) / 1e4)))
        if mode == "dp10-box":  # the start the sum-only one replaced: uniform in the box
            config["init"] = "random"
        if mode == "dp10-oracle":  # the noise's own cost: start at the central optimum
            config["init_centroids"] = central
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = fedcluster.simulate(sites, **config)
    score = fuzzy_objective(X, result.centroids) if algorithm == "ffcm" else sse(X, result.centroids)
    cap = int(config.get("num_rounds", run_config_defaults()["num-rounds"]))
    return score, len(result.history), result.metrics["rounds"] >= cap


def table(rows: list[dict], key: str, groups: list[tuple]) -> list[str]:
    out = ["| algorithm | mode | floor | p_site | split | median | 90th pct | worst (set) | "
           "rounds (median) |", "|---|---|---|---|---|---|---|---|---|"]
    for algorithm, mode, floor, site_floor, split in groups:
        sel = [r for r in rows if (r["algorithm"], r["mode"], r["floor"], r["site_floor"],
                                   r["split"]) == (algorithm, mode, floor, site_floor, split)
               and key in r]
        if not sel:
            continue
        values = np.array([r[key] for r in sel])
        worst = sel[int(np.argmax(values))]
        many = len({r["seed"] for r in sel}) > 1
        out.append(f"| {algorithm} | {mode} | {floor} | {site_floor} | {split} | "
                   f"{np.median(values):.4f} | {np.percentile(values, 90):.4f} | "
                   f"{values.max():.4f} ({worst['set']}" + (f", seed {worst['seed']}" if many else "")
                   + ") | "
                   f"{int(np.median([r['rounds'] for r in sel]))} |")
    return out


def at_cap_line(rows: list[dict], groups: list[tuple]) -> str:
    """How many runs stopped at their round cap (every ``num-rounds`` update round used,
    not stopped on ``tol``), per table row that has any."""
    parts = []
    for group in groups:
        sel = [r for r in rows if (r["algorithm"], r["mode"], r["floor"], r["site_floor"],
                                   r["split"]) == group]
        capped = [r for r in sel if r["at_cap"]]
        if capped:
            parts.append(f"{' '.join(map(str, group))}: {len(capped)} of {len(sel)} ("
                         + ", ".join(f"{r['set']} s{r['seed']}" for r in capped) + ")")
    return ("Runs at their round cap (all `num-rounds` update rounds used): "
            + ("; ".join(parts) if parts else f"none of {len(rows)}") + ".")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algorithms", nargs="+", default=["dwf"])
    parser.add_argument("--modes", nargs="+",
                        default=["plain", "secure", "dp10", "dp10-box", "dp10-oracle"])
    parser.add_argument("--floors", nargs="+", type=int, default=[2],
                        help="the run's min-cluster-size (default 2, the run's default)")
    parser.add_argument("--site-floors", nargs="+", type=int, default=[2],
                        help="the sites' own min-cluster-size: their groups' size (default 2; "
                             "1: the sites answer from their rows)")
    parser.add_argument("--splits", nargs="+", default=list(SPLITS))
    parser.add_argument("--seeds", type=int, default=1,
                        help="seeds 0..N-1: each redraws the split and the run's own seeds "
                             "(a figure is then over sets x seeds)")
    parser.add_argument("--sets", nargs="+", default=["iris", "wine", "cancer", "digits", *SIPU,
                                                      "g2", "mnist", "outliers", "tiny"])
    parser.add_argument("--data", type=Path, default=report.SHARED_DATA)
    parser.add_argument("--config", nargs="*", default=[], metavar="KEY=VALUE",
                        help="run-config keys for every run (e.g. aggregation=avg2)")
    parser.add_argument("--out", type=Path, default=None, help="write the tables into this file")
    parser.add_argument("--section", default="quality",
                        help="the BENCHMARKS.md section to write (one per sweep)")
    args = parser.parse_args()
    report.quiet_flower()
    from sklearn.cluster import KMeans

    extra = {}
    for item in args.config:
        key, _, value = item.partition("=")
        extra[key.replace("-", "_")] = value

    rows = []
    began = time.monotonic()
    for name in args.sets:
        X, y = load(name, args.data)
        k = len(np.unique(y))
        reference = KMeans(k, n_init=10, random_state=0).fit(X)
        central_fuzzy = central_fcm(X, k) if "ffcm" in args.algorithms else None
        for split, seed in [(s, e) for s in args.splits for e in range(args.seeds)]:
            parts = site_rows(y, split, seed)
            sites = [X[rows] for rows in parts]
            # whether central's optimum needs no value under each site floor (the second table)
            clear = {sf: under_p(reference.labels_, parts, sf) == 0 for sf in args.site_floors}
            for algorithm in args.algorithms:
                for floor, site_floor in [(f, s) for f in args.floors for s in args.site_floors]:
                    plain = None
                    for mode in args.modes:
                        started = time.monotonic()
                        try:
                            score, rounds, at_cap = run(sites, k, algorithm, mode, floor, X,
                                                reference.cluster_centers_, extra, site_floor,
                                                seed)
                        except Exception as err:  # a refused mode is a row, not a crash
                            print(f"{name} {split} {algorithm} {mode} floor {floor} p_site "
                                  f"{site_floor}: {err}")
                            continue
                        central = central_fuzzy if algorithm == "ffcm" else reference.inertia_
                        row = {"set": name, "seed": seed, "split": split,
                               "algorithm": algorithm, "mode": mode,
                               "floor": floor, "site_floor": site_floor, "rounds": rounds,
                               "at_cap": at_cap,
                               "central": score / central}
                        if clear[site_floor]:
                            row["clear"] = row["central"]
                        if mode == "plain":
                            plain = score
                        elif plain is not None:
                            row["plain"] = score / plain
                        if mode == "dp10-oracle":  # the same noise from the best start
                            for earlier in rows:
                                if (earlier["set"], earlier["seed"], earlier["split"],
                                        earlier["algorithm"], earlier["floor"],
                                        earlier["site_floor"]) \
                                        == (name, seed, split, algorithm, floor, site_floor) \
                                        and earlier["mode"].startswith("dp10"):
                                    earlier["oracle"] = earlier["score"] / score
                        row["score"] = score
                        rows.append(row)
                        print(f"{name:11s} {split:4s} s{seed} {algorithm:9s} {mode:6s} floor {floor} "
                              f"p_site {site_floor}: "
                              f"{score / central:.4f} x central"
                              + (f", {row['plain']:.4f} x plain" if "plain" in row else "")
                              + f", {rounds} rounds" + (" (at the cap)" if at_cap else "")
                              + f", {time.monotonic() - started:.1f} s",
                              flush=True)
    groups = [(a, m, f, sf, s) for a in args.algorithms for m in args.modes for f in args.floors
              for sf in args.site_floors for s in args.splits]
    lines = [report.header(f"Quality at defaults ({args.section})"), "",
             f"{len(args.sets)} data sets ({', '.join(args.sets)}), z-scored, k = their classes, "
             f"{SITES} sites (IID, and Dirichlet 0.3 label skew), "
             + (f"seeds 0-{args.seeds - 1} (each redraws the split and the run's seeds; a "
                f"figure is over {len(args.sets)} sets x {args.seeds} seeds)" if args.seeds > 1
                else "seed 0") + "; floor = the run's "
             "min-cluster-size, p_site = the sites' own (the size of the groups they answer "
             "from; 1: from their rows). Each figure is the "
             "k-means objective of the run's final centroids on the pooled rows over that of "
             "scikit-learn's KMeans (n_init 10), both measured in this run (FFCM: the fuzzy "
             "objective J_2 over central fuzzy c-means' best of 10). Modes: `plain` (the "
             "defaults), `secure` (secure-aggregation at its defaults: the `divisive` start), "
             "`dp10` (dp-epsilon 10, data-bounds = the pooled range, num-rounds 10, the "
             "`divisive` start), `dp10-box` (the same from k points uniform in the box, the "
             "start `divisive` replaced), `dp10-oracle` (the same from central k-means' own "
             "centroids: what the noise costs whatever the start). Rounds: all of a run's rounds, "
             "from describe to Table 1's profile rounds (after the evaluation: two in a plain run, "
             "one under secure aggregation, none under DP)."
             + (f" Every run also had {', '.join(args.config)}." if args.config else ""), "",
             "Against central k-means:", "", *table(rows, "central", groups)]
    if any(sf > 2 for sf in args.site_floors):
        kept = [(r["site_floor"], r["split"], r["set"], r["seed"]) for r in rows if "clear" in r]
        counts = "; ".join(
            f"p_site {sf} {split}: {len({c[2:] for c in kept if c[:2] == (sf, split)})}"
            for sf in args.site_floors for split in args.splits)
        lines += ["", "Against central k-means, on the federations whose central k-means optimum "
                  "needs no value of fewer than p_site rows of a site (every site holds none or "
                  "at least p_site rows of each of its clusters: `group_floor.py`'s `under p` "
                  "is 0; "
                  f"federations: {counts}):", "", *table(rows, "clear", groups)]
    if any("plain" in r for r in rows):
        lines += ["", "The secure and DP runs against the plain run of the same data and split "
                  "(its k-FED start):", "", *table(rows, "plain", groups)]
    if any("oracle" in r for r in rows):
        lines += ["", "The DP runs against the `dp10-oracle` run of the same data and split (the "
                  "same budget, training rounds and noise model, from central k-means' own "
                  "centroids: what the start costs under DP, its rounds' share of the budget "
                  "included, the noise's own cost taken out):", "",
                  *table(rows, "oracle", [g for g in groups if g[1] in ("dp10", "dp10-box")])]
    lines += ["", at_cap_line(rows, groups), "", f"Total time {time.monotonic() - began:.0f} s."]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        report.write_section(args.section, text, args.out)


if __name__ == "__main__":
    main()

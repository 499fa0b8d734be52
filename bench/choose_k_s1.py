"""Choosing k on the SIPU s1 set (Franti & Virmajoki 2006): 5000 points in 2-D, 15
Gaussian clusters with some overlap, split over 5 sites.

For each start mode, ``fedcluster.choose_k`` runs DWF (k-FED initialisation) for every k
in the range and reports the k each criterion picks, the time, the rounds, and how far each
k's inertia is above the best found by any mode or by central scikit-learn KMeans (n_init
10) on the pooled data. Modes:

- ``warm``: k + 1 starts from k's centroids with the largest cluster split (the default);
- ``warm+2cold``: the same plus two cold starts per k (n-init 3), the best kept;
- ``cold``: every k from its own k-FED round (``k-warm-start = false``);
- ``cold-x3``: cold with n-init 3.

Also writes the choose-k how-to's plot (``--plot``): the default mode's choose-k.png.

Usage::

    python bench/choose_k_s1.py [--k-range 2:20] [--splits iid,by-label] [--plot docs/choose-k-s1.png]
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import report  # noqa: E402

import fedcluster  # noqa: E402
from fedcluster.server_app.criteria import CRITERIA  # noqa: E402

MODES = {
    "warm": {"k_warm_start": True, "n_init": 1},
    "warm+2cold": {"k_warm_start": True, "n_init": 3},
    "cold": {"k_warm_start": False, "n_init": 1},
    "cold-x3": {"k_warm_start": False, "n_init": 3},
}
N_SITES = 5


def load_s1(folder: Path) -> tuple[np.ndarray, np.ndarray]:
    X = np.loadtxt(folder / "s1.data.gz")
    y = np.loadtxt(folder / "s1.labels0.gz").astype(np.int64)
    return X, y


def split(X, y, kind: str) -> tuple[list, list]:
    """``iid``: a seeded shuffle cut in 5; ``by-label``: each site holds 3 whole clusters."""
    from fedcluster.common.datasets import partition

    parts = partition(y, N_SITES, kind, seed=0)
    return [X[p] for p in parts], [y[p] for p in parts]


def central_inertia(X, ks) -> dict[int, float]:
    from sklearn.cluster import KMeans

    return {k: float(KMeans(k, n_init=10, random_state=0).fit(X).inertia_) for k in ks}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=report.SHARED_DATA / "sipu")
    parser.add_argument("--k-range", default="2:20")
    parser.add_argument("--splits", default="iid,by-label")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--plot", type=Path, default=None, help="copy the default mode's choose-k.png here")
    parser.add_argument("--out", type=Path, default=None,
                        help="the file to write the section into (e.g. BENCHMARKS.md; "
                        "default: print it only)")
    args = parser.parse_args(argv)
    from flwr.common.logger import FLOWER_LOGGER

    FLOWER_LOGGER.setLevel(logging.WARNING)
    lo, hi = (int(v) for v in args.k_range.split(":"))
    ks = list(range(lo, hi + 1))
    X, y = load_s1(args.data)
    central = central_inertia(X, ks)
    fedcluster.choose_k([X[:100], X[100:200]], k_range=(2, 4))  # compile the kernels first

    text = [report.header("Choosing k on SIPU s1 (15 clusters, 5 sites)"), ""]
    text.append(
        f"`fedcluster.choose_k` with DWF (k-FED init), k = {lo}..{hi}, privacy floor 2. "
        "picks = the k chosen by elbow / simplified silhouette / Davies-Bouldin / "
        "Calinski-Harabasz; excess = mean over k of (inertia / lowest inertia found for that k "
        "by any mode or by central KMeans with n_init 10) - 1; worst = its largest value; "
        "rounds = federated rounds in the whole run; seconds = wall time.\n")
    text += ["| split | mode | picks | ARI at k = 15 | excess | worst excess | rounds | seconds |",
             "|---|---|---|---|---|---|---|---|"]
    for kind in args.splits.split(","):
        sites, labels = split(X, y, kind)
        runs = {}
        for mode in args.modes.split(","):
            started = time.perf_counter()
            with tempfile.TemporaryDirectory() as tmp:
                result = fedcluster.choose_k(sites, labels=labels, k_range=(lo, hi), min_sites=N_SITES,
                                             output_dir=tmp, run_name="s1", **MODES[mode])
                seconds = time.perf_counter() - started
                if args.plot is not None and kind == "iid" and mode == "warm":
                    args.plot.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy(Path(tmp) / "s1" / "choose-k.png", args.plot)
            rounds = sum(len(m.history) for m in result["models"].values())
            runs[mode] = (result, seconds, rounds)
            print(f"{kind} {mode}: {[result[c] for c in CRITERIA]} in {seconds:.1f} s", flush=True)
        lowest = {k: min([central[k]] + [r["per-k"][k]["inertia"] for r, _, _ in runs.values()]) for k in ks}
        for mode, (result, seconds, rounds) in runs.items():
            excess = [result["per-k"][k]["inertia"] / lowest[k] - 1 for k in ks]
            ari = result["per-k"][15]["ari"] if 15 in result["per-k"] else float("nan")
            picks = " / ".join(str(result[c]) for c in CRITERIA)
            text.append(f"| {kind} | {mode} | {picks} | {ari:.3f} | {100 * np.mean(excess):.1f}% | "
                        f"{100 * max(excess):.1f}% | {rounds} | {seconds:.1f} |")
        central_picks = "central KMeans inertia per k: " + ", ".join(f"{k}: {central[k]:.4g}" for k in ks)
    text += ["", central_picks, ""]
    if (path := report.write_section("choose_k_s1", "\n".join(text), args.out)) is not None:
        print(f"wrote {path}")


if __name__ == "__main__":
    main()

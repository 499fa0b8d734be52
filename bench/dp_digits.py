"""Differential privacy on digits, non-IID (issue 8, must-show 2).

scikit-learn's digits (1797 x 64, pixels 0..16) split over 5 simulated sites by
Dirichlet(0.3) label skew, DWF with k = 10, ``local-iters`` 1, through the in-process
harness (the real ServerApp and ClientApps). ``data-bounds = "0:16"`` is the pixels'
known range (domain knowledge, not read from the data), and the DP runs start from k
points drawn uniformly in that box (``init = random``, no site round; pinned here so the
table keeps comparing the noise against the same pipeline without it: DP's default start
is now the sum-only ``divisive`` one, measured in bench/quality.py).

Rows, each over the same seeds (a seed fixes the split, the initial centroids and, in
simulation, the noise):

- central KMeans (scikit-learn, n_init 10) on the pooled data;
- DWF non-private with its default k-FED initialisation;
- DWF non-private on the DP pipeline (clipping to the box, random init in the box):
  what the noise is compared against;
- DWF with local DP at epsilon = 10 and 1 (delta 1e-5) for the WHOLE run, the budget
  split over the training rounds and the evaluation round (docs/how-to/differential-privacy.md
  privacy"), with ``num-rounds`` 10 and 4 (fewer rounds, less noise per round).

Scores are computed by this script on the pooled data from each run's final centroids
(inertia / N, exact; the DP run's own reported score is noisy and shown beside it) and
ARI against the digit labels (from the pooled labels, here, outside the federation).

Usage::

    python bench/dp_digits.py [--seeds 5] [--out BENCHMARKS.md]
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import report  # noqa: E402

import fedcluster  # noqa: E402
from fedcluster.common.datasets import load_builtin  # noqa: E402

SITES = 5
K = 10
BOUNDS = "0:16"
PARTITIONING = "dirichlet:0.3"


def pooled_scores(X: np.ndarray, y: np.ndarray, C: np.ndarray) -> tuple[float, float]:
    from sklearn.metrics import adjusted_rand_score

    d2 = ((X[:, None, :] - C[None, :, :]) ** 2).sum(-1)
    return float(d2.min(axis=1).mean()), float(adjusted_rand_score(y, d2.argmin(axis=1)))


def run(seed: int, **config) -> dict:
    started = time.perf_counter()
    result = fedcluster.simulate(
        num_sites=SITES, dataset="digits", partitioning=PARTITIONING, algorithm="dwf",
        n_clusters=K, seed=seed, central_baseline=False, **config)
    return {"centroids": result.centroids, "reported": result.metrics["score"],
            "metrics": result.metrics, "seconds": time.perf_counter() - started}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    logging.getLogger("flwr").setLevel(logging.ERROR)
    X, y = load_builtin("digits")
    seeds = list(range(args.seeds))

    from sklearn.cluster import KMeans

    rows = []  # (label, rounds, epsilon, per-seed (score, ari, reported, spent))
    central = []
    for seed in seeds:
        model = KMeans(K, n_init=10, random_state=seed).fit(X)
        central.append(pooled_scores(X, y, model.cluster_centers_) + (float("nan"), None))
    rows.append(("central KMeans (n_init 10, pooled data)", "-", "-", central))

    settings = [
        ("DWF, k-FED init (default), non-private", 10, None, {"num_rounds": 10}),
        ("DWF, DP pipeline, non-private", 10, None,
         {"num_rounds": 10, "init": "random", "data_bounds": BOUNDS}),
        ("DWF, local DP", 10, 10.0, {"num_rounds": 10, "dp_epsilon": 10.0, "data_bounds": BOUNDS,
          "init": "random"}),
        ("DWF, local DP", 10, 1.0, {"num_rounds": 10, "dp_epsilon": 1.0, "data_bounds": BOUNDS,
          "init": "random"}),
        ("DWF, DP pipeline, non-private", 4, None,
         {"num_rounds": 4, "init": "random", "data_bounds": BOUNDS}),
        ("DWF, local DP", 4, 10.0, {"num_rounds": 4, "dp_epsilon": 10.0, "data_bounds": BOUNDS,
          "init": "random"}),
        ("DWF, local DP", 4, 1.0, {"num_rounds": 4, "dp_epsilon": 1.0, "data_bounds": BOUNDS,
          "init": "random"}),
    ]
    sigmas = {}
    for label, rounds, epsilon, config in settings:
        per_seed = []
        for seed in seeds:
            out = run(seed, tol=0.0, **config)
            score, ari = pooled_scores(X, y, out["centroids"])
            per_seed.append((score, ari, out["reported"], out["metrics"].get("dp-epsilon-spent")))
            if epsilon is not None:
                sigmas[(rounds, epsilon)] = (out["metrics"]["dp-sigma-sums"],
                                             out["metrics"]["dp-sigma-counts"])
            print(f"{label} rounds {rounds} eps {epsilon} seed {seed}: score {score:.1f} "
                  f"ari {ari:.3f} reported {out['reported']:.1f} ({out['seconds']:.1f} s)",
                  flush=True)
        rows.append((label, str(rounds), "-" if epsilon is None else f"{epsilon:g}", per_seed))

    central_score = float(np.mean([s[0] for s in central]))
    lines = [
        report.header("Differential privacy: DWF on digits, non-IID (dp_digits)"),
        f"digits (1797 x 64) over {SITES} sites, partitioning `{PARTITIONING}`, k = {K}, "
        f"local-iters 1, `data-bounds = \"{BOUNDS}\"` (the pixels' known range; L2 diameter "
        "128), delta 1e-5, seeds "
        f"{seeds[0]}..{seeds[-1]} (a seed fixes the split, the start and the simulated noise). "
        "Epsilon is for the WHOLE run (all its training rounds and its evaluation), local DP "
        "(every site's reply is private on its own). Score = inertia / N of the final "
        "centroids on the pooled data, computed by the benchmark (exact); `reported` is the "
        "run's own score from its noisy evaluation round. ARI against the digit labels. "
        "Mean +- standard deviation over the seeds.",
        "",
        "| run | rounds | epsilon | score | / central | ARI | reported score | epsilon spent |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for label, rounds, epsilon, per_seed in rows:
        scores = np.array([s[0] for s in per_seed])
        aris = np.array([s[1] for s in per_seed])
        reported = np.array([s[2] for s in per_seed])
        spent = [s[3] for s in per_seed if s[3] is not None]
        shown = "-" if np.all(np.isnan(reported)) else f"{np.nanmean(reported):.1f}"
        lines.append(
            f"| {label} | {rounds} | {epsilon} | {scores.mean():.1f} +- {scores.std():.1f} | "
            f"{scores.mean() / central_score:.2f} | {aris.mean():.3f} +- {aris.std():.3f} | "
            f"{shown} | {max(spent):.3g} |" if spent else
            f"| {label} | {rounds} | {epsilon} | {scores.mean():.1f} +- {scores.std():.1f} | "
            f"{scores.mean() / central_score:.2f} | {aris.mean():.3f} +- {aris.std():.3f} | "
            f"{shown} | - |")
    lines += [
        "",
        "Noise per round (standard deviation, per site, on each per-cluster sum entry / count): "
        + "; ".join(f"{r} rounds, epsilon {e:g}: {s:.0f} / {c:.1f}"
                    for (r, e), (s, c) in sorted(sigmas.items())) + ".",
        "",
        "Reading: the DP pipeline's start (k points uniform in the box; k-FED's start is not "
        "private) costs 20-25 % without any noise (its spread over seeds is wide). Local DP "
        "on a data set this small is expensive on top: a site holds ~360 rows, ~36 per "
        "cluster, while the noise on one "
        "per-cluster sum is in the hundreds (epsilon 10) or thousands (epsilon 1) of pixel "
        "units. At epsilon 1 the noisy means land anywhere in the box and every row ends up "
        "in one cluster (ARI 0); at epsilon 10 DWF finds part of the structure (ARI ~0.2). "
        "Fewer rounds give each round more budget (4 rounds beat 10). Distributed DP "
        "(`secure-aggregation = true`, each site adding sigma / sqrt(t), t the sites SecAgg+ "
        "needs to form the sum) cuts the noise in the sum from sigma sqrt(n) to sigma "
        "sqrt(n / t) at the same epsilon (not run here); larger sites shrink its effect on "
        "the means in proportion to their size.",
    ]
    text = "\n".join(lines)
    report.write_section("dp_digits", text, args.out)


if __name__ == "__main__":
    main()

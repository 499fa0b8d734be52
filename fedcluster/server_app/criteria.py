"""Choosing k from per-k figures, and the warm start from k to k + 1.

The figures are the exact federated metrics of each k's run (``common/metrics.py``); the
criteria are pure functions of them:

- ``elbow``: the knee of the inertia curve, kneedle-style (Satopaa et al. 2011): k and
  inertia normalised to [0, 1], the knee is the k whose point lies farthest below the
  chord from the first to the last point;
- ``simplified-silhouette``: the largest; ``davies-bouldin``: the smallest;
  ``calinski-harabasz``: the largest.
"""

from __future__ import annotations

import math

import numpy as np

from fedcluster.strategies.metrics import PooledStats

# criterion -> +1 where the largest value is best, -1 where the smallest is
BEST_IS = {"simplified-silhouette": +1, "davies-bouldin": -1, "calinski-harabasz": +1}
CRITERIA = ("elbow", *BEST_IS)


def kneedle(ks, inertia) -> int | None:
    """The knee of a decreasing curve: argmax of the normalised curve's distance below the
    chord from its first to its last point (None for fewer than 3 points or a flat curve)."""
    ks = np.asarray(ks, dtype=np.float64)
    y = np.asarray(inertia, dtype=np.float64)
    if len(ks) < 3 or not np.all(np.isfinite(y)) or y.max() == y.min():
        return None
    x = (ks - ks[0]) / (ks[-1] - ks[0])
    y = (y - y.min()) / (y.max() - y.min())
    chord = y[0] + (y[-1] - y[0]) * x
    # The perpendicular distance is the vertical one times a constant: same argmax.
    return int(ks[int(np.argmax(chord - y))])


def best_k(per_k: dict[int, dict]) -> dict[str, int | None]:
    """The k each criterion picks (None where no k has a finite value; ties: the smallest k)."""
    ks = sorted(per_k)
    out: dict[str, int | None] = {"elbow": kneedle(ks, [per_k[k]["inertia"] for k in ks])}
    for name, sign in BEST_IS.items():
        values = [(sign * per_k[k].get(name, math.nan), -k) for k in ks]
        finite = [v for v in values if math.isfinite(v[0])]
        out[name] = -max(finite)[1] if finite else None
    return out


def cluster_sse(centroids: np.ndarray, stats: PooledStats) -> np.ndarray:
    """Per-cluster sum of squared distances to its centroid, from the evaluation sums:
    sum ||x - c||^2 = sum ||x||^2 - 2 c . sum x + n ||c||^2."""
    return np.maximum(
        stats.sqnorms - 2 * np.einsum("kd,kd->k", centroids, stats.sums)
        + stats.counts * np.einsum("kd,kd->k", centroids, centroids),
        0.0,
    )


def split_largest_cluster(centroids: np.ndarray, stats: PooledStats, seed: int) -> np.ndarray:
    """k + 1 starting centroids: the cluster with the largest SSE replaced by two points
    c -/+ (R / 2) u, R its RMS radius sqrt(SSE / n) and u a seeded random unit direction
    (the server has no row to take a direction from); the other centroids keep their
    places and the new one comes last."""
    centroids = np.asarray(centroids, dtype=np.float64)
    sse = cluster_sse(centroids, stats)
    j = int(np.argmax(sse))
    radius = math.sqrt(sse[j] / max(int(stats.counts[j]), 1))
    direction = np.random.default_rng(seed).normal(size=centroids.shape[1])
    step = 0.5 * radius * direction / np.linalg.norm(direction)
    out = np.vstack([centroids, centroids[j] + step])
    out[j] = centroids[j] - step
    return out

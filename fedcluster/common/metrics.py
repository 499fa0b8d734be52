"""Exact federated metrics: site sufficient statistics, summed, turned into the pooled
values (ALGORITHMS.md, "Evaluation, all exact and federated").

Sites report, against the final centroids C (``tasks.evaluate``): n, SSE, per-cluster
counts, sums and sums of squared norms, the simplified-silhouette sum and, where they
hold labels, their contingency table (true label x cluster). A second pass
(``tasks.evaluate_distances``) sends the pooled cluster means back and gets the sums of
distances to them, which Davies-Bouldin needs as scikit-learn defines it. Summed over
sites these give exactly what scikit-learn computes on the pooled data; the only
difference is the privacy floor: a cluster (or contingency cell) with fewer than p
members at a site is left out by that site.

Metric names are the same everywhere (``result.metrics``, ``model.json``, the report).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

METRIC_NAMES = (
    "score",
    "inertia",
    "simplified-silhouette",
    "davies-bouldin",
    "calinski-harabasz",
    "ari",
    "nmi",
    "v-measure",
    "homogeneity",
    "completeness",
    "accuracy",
)


@dataclass
class PooledStats:
    """Site statistics summed over sites (pass 1)."""

    n_rows: int
    sse: float
    silhouette_sum: float
    counts: np.ndarray  # (k,)
    sums: np.ndarray  # (k, d)
    sqnorms: np.ndarray  # (k,)
    contingency: dict[str, np.ndarray]  # true label -> counts per cluster (k,)

    @property
    def means(self) -> np.ndarray:
        """Pooled cluster means (the centroid where a cluster is empty)."""
        out = np.zeros_like(self.sums)
        has = self.counts > 0
        out[has] = self.sums[has] / self.counts[has, None]
        return out


def pool(site_stats: list[dict]) -> PooledStats:
    """Sum the per-site statistics (each a dict with the keys of :class:`PooledStats`)."""
    contingency: dict[str, np.ndarray] = {}
    for stats in site_stats:
        for label, row in stats.get("contingency", {}).items():
            contingency[label] = contingency.get(label, 0) + np.asarray(row, dtype=np.int64)
    return PooledStats(
        n_rows=int(sum(s["n_rows"] for s in site_stats)),
        sse=float(sum(s["sse"] for s in site_stats)),
        silhouette_sum=float(sum(s["silhouette_sum"] for s in site_stats)),
        counts=np.sum([s["counts"] for s in site_stats], axis=0).astype(np.int64),
        sums=np.sum([s["sums"] for s in site_stats], axis=0),
        sqnorms=np.sum([s["sqnorms"] for s in site_stats], axis=0),
        contingency=contingency,
    )


def calinski_harabasz(stats: PooledStats) -> float:
    """As ``sklearn.metrics.calinski_harabasz_score``, over the non-empty clusters; the
    within-cluster dispersion by the parallel-axis identity
    sum ||x - m_k||^2 = sum ||x||^2 - ||sum x||^2 / n_k."""
    has = stats.counts > 0
    n_labels = int(has.sum())
    n = int(stats.counts.sum())
    if n_labels < 2 or n <= n_labels:
        return float("nan")
    counts = stats.counts[has].astype(np.float64)
    sums = stats.sums[has]
    means = sums / counts[:, None]
    grand = sums.sum(axis=0) / n
    extra = float(np.sum(counts * np.sum((means - grand) ** 2, axis=1)))
    intra = float(np.sum(stats.sqnorms[has] - np.sum(sums * sums, axis=1) / counts))
    if intra == 0.0:
        return 1.0
    return extra * (n - n_labels) / (intra * (n_labels - 1.0))


def davies_bouldin(stats: PooledStats, distance_sums: np.ndarray) -> float:
    """As ``sklearn.metrics.davies_bouldin_score``: S_k = mean distance of a cluster's
    rows to its mean, M_ij = distance between means, mean over k of max_j
    (S_k + S_j) / M_kj, over the non-empty clusters."""
    has = stats.counts > 0
    if int(has.sum()) < 2:
        return float("nan")
    means = stats.means[has]
    intra = np.asarray(distance_sums, dtype=np.float64)[has] / stats.counts[has]
    gaps = np.sqrt(((means[:, None, :] - means[None, :, :]) ** 2).sum(-1))
    if np.allclose(intra, 0) or np.allclose(gaps, 0):
        return 0.0
    gaps[gaps == 0] = np.inf
    return float(np.mean(np.max((intra[:, None] + intra[None, :]) / gaps, axis=1)))


def label_metrics(contingency: dict[str, np.ndarray]) -> dict[str, float]:
    """ARI, NMI, V-measure, homogeneity, completeness and best-matching accuracy from
    the summed contingency table (they depend on nothing else, so they are exact)."""
    from scipy.optimize import linear_sum_assignment
    from sklearn import metrics as skm

    if not contingency:
        return {}
    table = np.array([contingency[label] for label in sorted(contingency)], dtype=np.int64)
    # Any label arrays with this table give the same scores; rebuild the simplest ones.
    rows, cols = np.nonzero(table)
    reps = table[rows, cols]
    truth, found = np.repeat(rows, reps), np.repeat(cols, reps)
    h, c, v = skm.homogeneity_completeness_v_measure(truth, found)
    matched_rows, matched_cols = linear_sum_assignment(table, maximize=True)
    return {
        "ari": float(skm.adjusted_rand_score(truth, found)),
        "nmi": float(skm.normalized_mutual_info_score(truth, found)),
        "v-measure": float(v),
        "homogeneity": float(h),
        "completeness": float(c),
        "accuracy": float(table[matched_rows, matched_cols].sum() / table.sum()),
    }


def compute_metrics(stats: PooledStats, distance_sums: np.ndarray | None) -> dict[str, float]:
    """Every metric that the statistics allow, under the names of :data:`METRIC_NAMES`."""
    out = {
        "score": stats.sse / stats.n_rows,
        "inertia": stats.sse,
        "simplified-silhouette": stats.silhouette_sum / stats.n_rows,
        "calinski-harabasz": calinski_harabasz(stats),
    }
    if distance_sums is not None:
        out["davies-bouldin"] = davies_bouldin(stats, distance_sums)
    out.update(label_metrics(stats.contingency))
    return out

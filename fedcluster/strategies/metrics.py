"""Exact federated metrics: site sufficient statistics, summed, turned into the pooled
values (docs/explanation/algorithms.md, "Evaluation, all exact and federated").

Sites report, against the final centroids C (``tasks.evaluate``): n, SSE, per-cluster
counts, sums and sums of squared norms, the simplified-silhouette sum and, where they
hold labels, their contingency table (true label x cluster). A second pass
(``tasks.evaluate_distances``) sends the pooled cluster means back and gets the sums of
distances to them, which Davies-Bouldin needs as scikit-learn defines it; the first
pass's own distances (to the centroids) spare it when the means are the centroids
(:func:`means_are_centroids`). Summed over
sites these give exactly what scikit-learn computes on the pooled data; the only
difference is the privacy floor: a cluster (or contingency cell) with fewer than p
members at a site is left out by that site.

Metric names are the same everywhere (``result.metrics``, ``model.json``, the report).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: The metrics that need the sites' true labels (a ``label-column``): agreement with a
#: known grouping, which a hospital rarely has; the summary and report.html say so.
LABEL_METRICS = ("ari", "nmi", "v-measure", "homogeneity", "completeness", "accuracy")
LABEL_NOTE = ("they need the sites' label column (known classes), which a hospital rarely "
              "has, and measure agreement with that grouping, not the clustering's quality; "
              "the other metrics need no labels")

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
    # FFCM (Stallmann & Wilbik; fuzzy runs only): Within/Outside SSE, partition coefficient
    "within-sse",
    "outside-sse",
    "partition-coefficient",
    # against known true centres (simulation only)
    "knowledge-gap",
    "ngap",
)


@dataclass
class PooledStats:
    """Site statistics summed over sites (pass 1)."""

    n_rows: int
    sse: float
    silhouette_sum: float
    counts: np.ndarray  # (k,)
    sums: np.ndarray  # (k, d)
    sqnorms: np.ndarray  # (k,) of the groups' means, times their rows
    contingency: dict[str, np.ndarray]  # true label -> counts per cluster (k,)
    # The sites' groups' spreads about their own means, summed (no per-cluster figure
    # carries one): the part of the within-cluster dispersion the means do not show.
    group_scatter: float = 0.0
    # Fuzzy runs only: sum over rows of sum_j ||x - c_j||^2 and of sum_j u_ij^2.
    all_sq_dist: float | None = None
    partition_sum: float | None = None

    @property
    def means(self) -> np.ndarray:
        """Pooled cluster means (the centroid where a cluster is empty)."""
        out = np.zeros_like(self.sums)
        has = self.counts > 0
        out[has] = self.sums[has] / self.counts[has, None]
        return out


def pool(site_stats: list[dict]) -> PooledStats:
    """Sum the per-site statistics (each a dict with the keys of :class:`PooledStats`)."""
    contingency = completed(site_stats)
    return PooledStats(
        n_rows=int(sum(s["n_rows"] for s in site_stats)),
        sse=float(sum(s["sse"] for s in site_stats)),
        silhouette_sum=float(sum(s["silhouette_sum"] for s in site_stats)),
        counts=np.sum([s["counts"] for s in site_stats], axis=0).astype(np.int64),
        sums=np.sum([s["sums"] for s in site_stats], axis=0),
        sqnorms=np.sum([s["sqnorms"] for s in site_stats], axis=0),
        contingency=contingency,
        group_scatter=float(sum(s.get("group_scatter", 0.0) for s in site_stats)),
        all_sq_dist=_sum_if_all(site_stats, "all_sq_dist"),
        partition_sum=_sum_if_all(site_stats, "partition_sum"),
    )


def _sum_if_all(site_stats: list[dict], key: str) -> float | None:
    values = [s.get(key) for s in site_stats]
    return None if any(v is None for v in values) else float(sum(values))


#: How close (per coordinate, relative to max(1, max |C|)) every non-empty cluster's
#: pooled mean must be to its centroid for the evaluation's distances to stand for
#: Davies-Bouldin's second pass.
MEANS_TOL = 1e-12


def means_are_centroids(stats: PooledStats, centroids: np.ndarray) -> bool:
    """Whether the pooled cluster means are the centroids the evaluation measured its
    distances to, up to rounding (:data:`MEANS_TOL`).

    Davies-Bouldin's S_k is the mean distance of cluster k's rows to its pooled MEAN,
    which exists only once the evaluation's sums are pooled: in general a second pass.
    By the triangle inequality the mean distance to the centroid c_k differs from S_k by
    at most ||mean_k - c_k|| <= sqrt(d) x MEANS_TOL x max(1, max |C|), so when this holds
    (a converged run: the last round moved nothing, so the evaluation's clusters are
    the last training round's and their means the centroids) the evaluation's own
    distances give S_k to that bound and the second pass is spared."""
    has = stats.counts > 0
    centroids = np.asarray(centroids, dtype=np.float64)
    scale = max(1.0, float(np.max(np.abs(centroids)))) if centroids.size else 1.0
    return bool(np.all(np.abs(stats.means[has] - centroids[has]) <= MEANS_TOL * scale))


def calinski_harabasz(stats: PooledStats) -> float:
    """As ``sklearn.metrics.calinski_harabasz_score``, over the non-empty clusters; the
    within-cluster dispersion by the parallel-axis identity
    sum ||x - m_k||^2 = sum ||x||^2 - ||sum x||^2 / n_k, over the groups' means, plus the
    groups' own spreads (sites answering from groups: exact for the groups' partition
    when no cluster is withheld)."""
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
    intra = float(np.sum(stats.sqnorms[has] - np.sum(sums * sums, axis=1) / counts)) + stats.group_scatter
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


def completed(site_stats: list[dict]) -> dict[str, np.ndarray]:
    """The pooled contingency table (true label -> rows per cluster) with each site's
    withheld cells filled in: per cluster, the rows its size counts and no cell it sent
    does (cells of 1 to p - 1 rows, withheld by the floor), spread evenly over the labels
    whose cell there it sent as 0 (any label of the federation). Dropped instead, they
    would be the small cells, mostly rows outside their label's cluster, and the label
    metrics would read high (the adjusted Rand index by up to 0.035 at p 10 on the
    clinical demo); spread, the error is a few thousandths (``bench/clinical_report.py``).
    Exact where nothing is withheld."""
    labels = sorted({label for stats in site_stats for label in stats.get("contingency", {})})
    if not labels:
        return {}
    pooled = np.zeros((len(labels), np.size(site_stats[0]["counts"])))
    for stats in site_stats:
        table = stats.get("contingency")
        if not table:
            continue  # a site without labels
        T = np.array([np.asarray(table.get(label, 0.0), dtype=np.float64) * np.ones(pooled.shape[1])
                      for label in labels])
        unseen = np.maximum(np.asarray(stats["counts"], dtype=np.float64) - T.sum(axis=0), 0.0)
        zero = T == 0
        T += zero * np.where(zero.any(axis=0), unseen / np.maximum(zero.sum(axis=0), 1), 0.0)
        pooled += T
    return dict(zip(labels, pooled))


def _entropy(counts: np.ndarray) -> float:
    counts = counts[counts > 0]
    share = counts / counts.sum()
    return float(-(share * np.log(share)).sum())


def label_metrics(contingency: dict[str, np.ndarray]) -> dict[str, float]:
    """ARI, NMI, V-measure, homogeneity, completeness and best-matching accuracy of the
    pooled contingency table (:func:`completed`; their formulas over a table, as
    scikit-learn's over label arrays: equal where no cell is withheld)."""
    from scipy.optimize import linear_sum_assignment

    if not contingency:
        return {}
    table = np.array([contingency[label] for label in sorted(contingency)], dtype=np.float64)
    n, a, b = table.sum(), table.sum(axis=1), table.sum(axis=0)

    def pairs(x):
        return (x * (x - 1.0) / 2.0).sum()
    expected = pairs(a) * pairs(b) / (n * (n - 1.0) / 2.0)
    top = 0.5 * (pairs(a) + pairs(b)) - expected
    ari = 1.0 if top == 0 else float((pairs(table) - expected) / top)
    h_true, h_found = _entropy(a), _entropy(b)
    with np.errstate(divide="ignore", invalid="ignore"):
        mutual = float(np.nansum(table / n * np.log(table * n / np.outer(a, b))))
    homogeneity = 1.0 if h_true == 0 else mutual / h_true
    completeness = 1.0 if h_found == 0 else mutual / h_found
    v = 0.0 if homogeneity + completeness == 0 else \
        2 * homogeneity * completeness / (homogeneity + completeness)
    nmi = 1.0 if h_true == h_found == 0 else mutual / max((h_true + h_found) / 2, 1e-300)
    matched_rows, matched_cols = linear_sum_assignment(table, maximize=True)
    return {"ari": ari, "nmi": float(nmi), "v-measure": float(v),
            "homogeneity": float(homogeneity), "completeness": float(completeness),
            "accuracy": float(table[matched_rows, matched_cols].sum() / n)}


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
    if stats.all_sq_dist is not None:
        out.update(fuzzy_metrics(stats))
    out.update(label_metrics(stats.contingency))
    return out


def fuzzy_metrics(stats: PooledStats) -> dict[str, float]:
    """FFCM's figures (docs/explanation/algorithms.md section 5), hard labels = argmax membership =
    nearest centre: Within SSE = SSE / (N d), Outside SSE = sum over rows of the squared
    distances to the centres they are NOT assigned to / (N d), and the partition
    coefficient mean_i sum_j u_ij^2 (1 = crisp, 1/k = all memberships equal)."""
    n_d = stats.n_rows * stats.sums.shape[1]
    return {
        "within-sse": stats.sse / n_d,
        "outside-sse": (stats.all_sq_dist - stats.sse) / n_d,
        "partition-coefficient": stats.partition_sum / stats.n_rows,
    }


def knowledge_gap(centres: np.ndarray, true_centres: np.ndarray) -> dict[str, float]:
    """FFCM's knowledge gap (Stallmann & Wilbik): sum_k ||c~_k - c_k|| under the optimal
    one-to-one matching of found to true centres (Hungarian), and ngap = gap / sqrt(d).

    Raises
    ------
    ValueError
        If the two sets differ in shape.
    """
    from scipy.optimize import linear_sum_assignment

    centres = np.asarray(centres, dtype=np.float64)
    true_centres = np.asarray(true_centres, dtype=np.float64)
    if centres.shape != true_centres.shape:
        raise ValueError(
            f"true centres have shape {true_centres.shape}, the model's {centres.shape}"
        )
    distances = np.sqrt(((centres[:, None, :] - true_centres[None, :, :]) ** 2).sum(-1))
    rows, cols = linear_sum_assignment(distances)
    gap = float(distances[rows, cols].sum())
    return {"knowledge-gap": gap, "ngap": gap / np.sqrt(centres.shape[1])}

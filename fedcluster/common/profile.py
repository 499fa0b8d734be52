"""Table 1 by cluster from the sites' cluster profiles (issue 36): pooled sums, then
the tidy rows ``server_app/table1.py`` renders (``cluster``, ``variable``, ``level``,
``unit``, ``statistic``, ``value``).

Every figure comes from sums over the sites (``protocol.ClusterProfile``, made by
``client_app/site_profile.py``), so secure aggregation could carry them: per numeric
variable n, mean and SD (exact: SD from the squared deviations about the reference
points, corrected to the mean; for all rows, within plus between clusters), median and
quartiles from the pooled histogram (linear within a bin), missing n (%); per category
level n (%) of the rows with the variable present, and missing n (%); the cluster sizes;
per site (when the replies are seen one by one) the rows of each cluster. A cell that a
site withheld is left out of the totals; one that no site shows but one withheld shows
as ``<p``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedcluster.common.imputation import histogram_quantile
from fedcluster.common.protocol import ClusterProfile

#: The columns of a tidy Table 1 row (``table1.csv``, ``Model.profile``).
FIELDS = ("cluster", "variable", "level", "unit", "statistic", "value")
#: The quantiles Table 1 shows.
QUANTILES = (("q1", 0.25), ("median", 0.5), ("q3", 0.75))


@dataclass(frozen=True)
class Variable:
    """One row block of Table 1: a numeric column (one encoded feature) or a category
    (one encoded feature per level, ``weight`` its one-hot 1)."""

    name: str
    kind: str  # "numeric" or "categorical"
    columns: tuple[int, ...]
    unit: str = ""
    levels: tuple[str, ...] = ()
    weight: float = 1.0
    range: tuple[float, float] | None = None  # a numeric column's declared range


def variables_of(schema=None, feature_names=None) -> list[Variable]:
    """The variables of a run: its schema's feature columns (a missing-indicator column
    is left out: the missing counts say it), or every feature numeric."""
    if schema is None:
        return [Variable(str(name), "numeric", (j,)) for j, name in enumerate(feature_names)]
    out, j = [], 0
    for column in schema.features:
        if column.type == "numeric":
            out.append(Variable(column.name, "numeric", (j,), column.unit or "",
                                range=column.range))
            j += 1
        else:
            n = len(column.categories)
            out.append(Variable(column.name, "categorical", tuple(range(j, j + n)), "",
                                tuple(column.categories), column.category_weight))
            j += n
        j += 1 if column.missing_indicator else 0
    return out


def level_weights(variables: list[Variable], d: int) -> np.ndarray:
    """(d,) each encoded feature's one-hot weight (0: numeric), as a site needs it."""
    weights = np.zeros(d)
    for v in variables:
        if v.kind == "categorical":
            weights[list(v.columns)] = v.weight
    return weights


def pool(replies: list[ClusterProfile]) -> ClusterProfile:
    """The sum of the sites' profiles (what secure aggregation would give)."""
    return ClusterProfile(*(np.sum([np.asarray(r[i]) for r in replies], axis=0)
                            for i in range(len(ClusterProfile._fields))))


def cluster_moments(pooled: ClusterProfile, references: np.ndarray):
    """(k, d) per cluster and feature: its present cells, their mean (0 where none) and
    their squared deviations about that mean (from those about the reference point)."""
    present = np.asarray(pooled.present, dtype=np.float64)
    means = np.where(present > 0, pooled.sums / np.maximum(present, 1.0), 0.0)
    return present, means, pooled.squares - present * (means - references) ** 2


def _quantiles(hist: np.ndarray, lo: float, hi: float) -> dict[str, float]:
    if hist.sum() == 0:
        return {}
    return {name: histogram_quantile(hist, lo, hi, q) for name, q in QUANTILES}


def table1_rows(pooled: ClusterProfile, variables: list[Variable], references: np.ndarray,
                lower: np.ndarray, upper: np.ndarray, floor: int,
                sites: dict[str, ClusterProfile] | None = None) -> list[dict]:
    """The tidy Table 1 rows (module docstring) of a pooled profile; ``sites``: each
    site's own profile, for the per-site composition (None: not known, as under secure
    aggregation)."""
    k = len(pooled.counts)
    rows: list[dict] = []
    suppressed = f"<{floor}"

    def add(cluster, variable, level, unit, statistic, value):
        rows.append({"cluster": cluster, "variable": variable, "level": level, "unit": unit,
                     "statistic": statistic, "value": value})

    total = int(pooled.counts.sum())
    clusters = [(str(j), [j]) for j in range(k)] + [("all", list(range(k)))]
    for name, members in clusters:
        n = int(pooled.counts[members].sum())
        add(name, "size", "", "", "n", n if n or not pooled.hidden[members].any() else suppressed)
        add(name, "size", "", "", "%", 100.0 * n / total if total else "")
    moments = cluster_moments(pooled, references)
    for v in variables:
        for name, members in clusters:
            if v.kind == "numeric":
                _numeric(add, name, v, pooled, moments, members, lower, upper, suppressed)
            else:
                _categorical(add, name, v, pooled, members, suppressed)
    if sites:
        for name, members in clusters:
            n = int(pooled.counts[members].sum())
            for site, profile in sites.items():
                rows_here = int(np.asarray(profile.counts)[members].sum())
                withheld = bool(np.asarray(profile.hidden)[members].any())
                # a cluster the site withheld (or held none of): fewer than p, not 0
                shown = not (withheld and not rows_here)
                add(name, "site", site, "", "n", rows_here if shown else suppressed)
                add(name, "site", site, "", "%", 100.0 * rows_here / n if n and shown else "")
    return rows


def _numeric(add, cluster, v, pooled, moments, members, lower, upper, suppressed):
    j = v.columns[0]
    P, means, within = (m[members, j] for m in moments)
    Q = pooled.squares[members, j]
    n, counted = int(P.sum()), int(pooled.rows[members, j].sum())
    if n == 0:
        add(cluster, v.name, "", v.unit, "n", suppressed if pooled.hidden[members, j].any() else 0)
        return
    mean = pooled.sums[members, j].sum() / n
    # within each cluster about its own mean, then between the clusters' means
    spread = within.sum() + (P * (means - mean) ** 2).sum()
    add(cluster, v.name, "", v.unit, "n", n)
    add(cluster, v.name, "", v.unit, "mean", mean)
    add(cluster, v.name, "", v.unit, "sd", float(np.sqrt(max(spread, 0.0) / (n - 1))) if n > 1 else "")
    quantiles = _quantiles(pooled.histograms[members, j].sum(axis=0), lower[j], upper[j])
    if quantiles and spread <= 1e-12 * (float(np.abs(Q).sum()) + n * mean * mean):
        # every present value is the mean (to rounding): so are its quartiles, exactly,
        # where the histogram would spread them over the mean's bin
        quantiles = {stat: mean for stat in quantiles}
    for stat, value in quantiles.items():
        add(cluster, v.name, "", v.unit, stat, value)
    add(cluster, v.name, "", v.unit, "missing n", counted - n)
    add(cluster, v.name, "", v.unit, "missing %", 100.0 * (counted - n) / counted)


def _categorical(add, cluster, v, pooled, members, suppressed):
    for level, j in zip(v.levels, v.columns):
        n = int(round(pooled.sums[members, j].sum() / v.weight))
        if n == 0 and pooled.hidden[members, j].any():
            add(cluster, v.name, level, "", "n", suppressed)
            continue
        present = int(pooled.present[members, j].sum())  # over the sites that show the level
        add(cluster, v.name, level, "", "n", n)
        add(cluster, v.name, level, "", "%", 100.0 * n / present if present else "")
    # the missing cells over the level column that the most rows were counted for
    best = max(v.columns, key=lambda j: int(pooled.rows[members, j].sum()))
    present = int(pooled.present[members, best].sum())
    counted = int(pooled.rows[members, best].sum())
    add(cluster, v.name, "", "", "missing n", counted - present)
    add(cluster, v.name, "", "", "missing %", 100.0 * (counted - present) / counted if counted else "")

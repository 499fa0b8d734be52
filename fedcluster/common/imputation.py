"""Pooled imputation of missing cells: the plan a schema gives, a site's statistics, the
server's fill values.

A feature column whose missing-value policy is ``impute-mean`` or ``impute-median``
(``schema.py``) gets, in every missing cell, the POOLED mean or median of its present
cells over every site, as central imputation of the pooled table would. One statistics
round (task ``impute_stats``, before ``stats``) gives them:

- each site sends, per encoded feature column, the sum and the count of its present
  cells, and for an ``impute-median`` column a histogram of its present values over the
  schema's ``range`` in ``median-bins`` equal bins (the site's own schema fixes range and
  bins, not the server, so asking again gives the same answer);
- under the privacy floor p: a column with fewer than p present cells is withheld whole
  (sum, count and histogram 0), and so is every histogram bin with fewer than p values
  (the pooled median then comes from the bins reported);
- the server's mean is the sum of the sums over the sum of the counts (exact: the pooled
  mean of the present cells); its median is the point of the summed histogram where half
  the reported values lie below, linear within its bin (exact to one bin width,
  range / median-bins).

A categorical column is one-hot encoded (``table_encoding.py``); its ``impute-mean`` fills
each level's column with the pooled share of that level (times ``category-weight``).
The fill values travel in the run's transform (``scaling.FeatureTransform.fill``), which
every later task carries, so every task sees the same imputed rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ImputationPlan:
    """Per encoded feature column: ``"mean"``, ``"median"`` or None (not imputed), and
    for a median its range; ``bins``: the median's histogram bins."""

    policies: tuple[str | None, ...]
    ranges: tuple[tuple[float, float] | None, ...]
    bins: int
    # Every feature imputed whatever their number (run config missing = "impute-mean"):
    # needed before the describe round has told the width.
    all_features: bool = False

    @property
    def needed(self) -> bool:
        return self.all_features or any(p is not None for p in self.policies)

    @property
    def n_features(self) -> int:
        return len(self.policies)


def imputation_plan(schema) -> ImputationPlan:
    """The plan of a ``schema.Schema``: its encoded features in ``feature_names`` order
    (a one-hot block takes its column's policy; an indicator column is never missing)."""
    policies: list[str | None] = []
    ranges: list[tuple[float, float] | None] = []
    for column in schema.features:
        policy = schema.policy(column)
        kind = {"impute-mean": "mean", "impute-median": "median"}.get(policy)
        width = 1 if column.type == "numeric" else len(column.categories)
        policies += [kind] * width
        ranges += [tuple(column.range) if kind == "median" else None] * width
        if column.missing_indicator:
            policies.append(None)
            ranges.append(None)
    return ImputationPlan(tuple(policies), tuple(ranges), int(schema.median_bins))


def site_missing_stats(present: np.ndarray, present_sums: np.ndarray, plan: ImputationPlan,
                       floor: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A site's ``(sums, counts, histograms)`` for ``plan``, from its groups' present
    cells (``present``: per group and feature, how many; ``present_sums``: their sums):
    per imputed column the sum and count of its present cells (exact), and (median
    columns) the histogram of the groups' present means, each counting its present
    cells (a group of one row: its value, so the median is exact to one bin), each
    under the floor (module docstring); zeros for the columns not imputed.

    Raises
    ------
    ValueError
        The groups' width is not the plan's.
    """
    if present_sums.shape[1] != plan.n_features:
        raise ValueError(f"the imputation plan has {plan.n_features} features, the site's "
                         f"data {present_sums.shape[1]}")
    d = plan.n_features
    sums, counts = np.zeros(d), np.zeros(d, dtype=np.int64)
    histograms = np.zeros((d, plan.bins), dtype=np.int64)
    for j, policy in enumerate(plan.policies):
        if policy is None:
            continue
        cells = np.asarray(present[:, j], dtype=np.int64)
        if cells.sum() < floor:
            continue  # withheld whole: too few present cells to report
        sums[j], counts[j] = float(np.sum(present_sums[:, j])), int(cells.sum())
        if policy == "median":
            lo, hi = plan.ranges[j]
            has = cells > 0
            values = present_sums[has, j] / cells[has]
            hist = np.histogram(np.clip(values, lo, hi), bins=plan.bins, range=(lo, hi),
                                weights=cells[has])[0].astype(np.int64)
            hist[hist < floor] = 0
            histograms[j] = hist
    return sums, counts, histograms


def pooled_fill(plan: ImputationPlan, counts, sums, histograms, names=None) -> np.ndarray:
    """The fill value of every encoded feature (NaN: not imputed) from the sites'
    statistics (sequences of per-site arrays).

    Raises
    ------
    ValueError
        An imputed column of which no site reported a present value (every site had
        none, or fewer than the floor): named, as there is nothing to fill it with.
    """
    counts = np.sum(np.asarray(counts, dtype=np.float64), axis=0)
    sums = np.sum(np.asarray(sums, dtype=np.float64), axis=0)
    histograms = np.sum(np.asarray(histograms, dtype=np.float64), axis=0)
    fill = np.full(plan.n_features, np.nan)
    for j, policy in enumerate(plan.policies):
        if policy is None:
            continue
        name = names[j] if names is not None else f"feature {j}"
        if counts[j] <= 0:
            raise ValueError(f"{name}: no site reported a present value (each had none, or "
                             "fewer than the privacy floor), so there is nothing to impute it with")
        if policy == "mean":
            fill[j] = sums[j] / counts[j]
            continue
        hist = histograms[j]
        if hist.sum() <= 0:
            raise ValueError(f"{name}: every bin of the median's histogram is under the "
                             "privacy floor; use impute-mean or fewer median-bins")
        fill[j] = histogram_median(hist, *plan.ranges[j])
    return fill


def histogram_median(hist: np.ndarray, lo: float, hi: float) -> float:
    """The point of a histogram over [lo, hi] with half its mass below
    (:func:`histogram_quantile` at 0.5)."""
    return histogram_quantile(hist, lo, hi, 0.5)


def histogram_quantile(hist: np.ndarray, lo: float, hi: float, q: float) -> float:
    """The point of a histogram over [lo, hi] with a share ``q`` of its mass below,
    linear within the bin where the cumulative count reaches it."""
    hist = np.asarray(hist, dtype=np.float64)
    width = (hi - lo) / hist.size
    cumulative = np.cumsum(hist)
    target = cumulative[-1] * q
    b = int(np.searchsorted(cumulative, target))
    below = cumulative[b - 1] if b > 0 else 0.0
    return float(lo + width * (b + (target - below) / hist[b]))

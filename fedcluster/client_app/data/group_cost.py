"""What a site's groups cost its own k-means: the site check's cost table (issue 45).

A site answers every task from groups of at least p_site of its rows (``grouping.py``),
each assigned whole to the centroid nearest its mean, and that costs k-means quality,
more at a larger p. This module measures the cost from the site's own rows, alone,
sending nothing, so that a data officer chooses p (node config ``min-cluster-size``)
knowing it. For each p (the site's own, 2, 5 and 10) and each k (2..10 unless told):

- ``groups``: k-means fitted on the means of the site's groups at that p, each weighted
  by its rows: the groups ``group_table.build`` makes at p (``grouping.group_rows``, as
  the site makes them), their means as a run sees them (``SiteGroups.in_run_space``: a
  cell the lone-cell rule withholds, and every missing cell, at its column's fill), the
  best of ``N_STARTS`` k-means++ starts from ``SEED``; at the site's own p, the groups
  the site answers from (``site_groups``: with a cache-dir, its kept version's). At p >=
  3, where a run's training tasks split a group near a boundary by its per-feature
  spread (``common/kernels/spread.py``), that fit is then refined as they would: Lloyd
  with groups split, from it, to convergence (``SPREAD_ITERS``, ``SPREAD_TOL``);
- ``rows``: the best k-means fit of the site's rows found: the best of ``N_STARTS``
  k-means++ starts on the rows, and of Lloyd on the rows from each p's ``groups``
  centroids (so that no figure falls under 1 by k-means' luck alone);

both scored by the k-means objective ON THE ROWS (each row's squared distance to its
nearest centroid, summed). The figure is ``groups / rows``: 1.000 is no cost, 1.050 a
clustering 5% worse, in the rows' own terms. Each fit is scikit-learn's ``KMeans``
(Lloyd), in one thread (the same figures on any machine). Above the data's own number
of clusters k-means has many near-equal optima, and a figure there moves by a percent or
two with the seeds: read the trend across k and p, not one cell.

The space: a missing cell at its column's site mean (the fill: a run's is the pooled
mean), then the rows z-scored per feature with this site's own means and standard
deviations (``scale = "standard"``, as ``scaling.standard_transform`` would with this
site alone; a constant feature only centred), or, with ``scale="none"``, as encoded.

A site of more than ``max_rows`` rows (default ``MAX_ROWS``) is still grouped whole (its
groups are the site's), but fitted and scored on a seeded sample: ``max_rows`` of its
rows (``np.random.default_rng(SEED).choice(n, max_rows, replace=False)``, sorted), and at
each p, from the same generator, the same share of its groups (``round(G * max_rows /
n)`` of them, sorted, in the group table's order); the table says so.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass

import numpy as np

from fedcluster.client_app import local_kmeans as local
from fedcluster.client_app.group_weights import uses_spread
from fedcluster.client_app.data import group_table
from fedcluster.client_app.data.site_data import SiteData
from fedcluster.client_app.mapped_pages import release_pages
from fedcluster.client_app.site_groups import SiteGroups, TableFacts
from fedcluster.common import scaling

__all__ = ["DEFAULT_K_VALUES", "EXTRA_P_VALUES", "MAX_ROWS", "N_STARTS", "SEED", "GroupCostTable",
           "checked_k_values", "cost_p_values", "group_cost", "parse_k_values", "rows_needed"]

#: The k of the table unless told: a sensible range for a site's own clustering.
DEFAULT_K_VALUES = tuple(range(2, 11))
#: The p shown beside the site's own min-cluster-size.
EXTRA_P_VALUES = (2, 5, 10)
#: k-means++ starts per fit (the best on its own points is kept) and their seed.
N_STARTS = 8
SEED = 0
#: Above this many rows the fits and the objective use a seeded sample (module docstring).
MAX_ROWS = 10_000
#: Rows per chunk of a pass over the site's rows (group sums; a mapped file's pages
#: dropped after each) and of the objective (a chunk x k x d temporary).
CHUNK_ROWS = 1 << 14
SCORE_ROWS = 2048
SCALES = ("standard", "none")
#: The groups' fit at p >= SPREAD_MIN_SIZE: Lloyd with groups split by their spread, at
#: most this many iterations, until the centroids move less than this (Frobenius).
SPREAD_ITERS = 300
SPREAD_TOL = 1e-8


@dataclass(frozen=True)
class GroupCostTable:
    """The cost of the site's groups to its own k-means, per k and p.

    Attributes
    ----------
    k_values : tuple of int
        The table's rows: the numbers of clusters, ascending.
    p_values : tuple of int
        Its columns: group sizes p, ascending (the site's own among them).
    site_p : int
        The site's own min-cluster-size (p_site).
    ratios : np.ndarray of shape (len(k_values), len(p_values))
        The objective on the rows of the groups' fit over the rows' fit; NaN where the
        site has fewer groups at that p than k (or fewer rows than k).
    rows_objective : np.ndarray of shape (len(k_values),)
        The objective (a sum over the rows scored) of the best fit of the rows found;
        NaN where fewer rows than k.
    groups_objective : np.ndarray of shape (len(k_values), len(p_values))
        The same of the groups' fit.
    n_groups : tuple of int
        The site's groups at each p (all of them, sampled or not).
    n_rows : int
        The site's rows (every row: grouped, fitted and scored unless ``sampled_rows``).
    sampled_rows : int or None
        The rows fitted and scored on when a sample (module docstring), else None.
    scale : str
        ``"standard"`` (z-scored with this site's moments) or ``"none"``.
    """

    k_values: tuple[int, ...]
    p_values: tuple[int, ...]
    site_p: int
    ratios: np.ndarray
    rows_objective: np.ndarray
    groups_objective: np.ndarray
    n_groups: tuple[int, ...]
    n_rows: int
    sampled_rows: int | None
    scale: str

    def ratio(self, k: int, p: int) -> float:
        """The figure at ``k`` clusters and groups of ``p`` (NaN: not computed)."""
        return float(self.ratios[self.k_values.index(k), self.p_values.index(p)])

    def lines(self) -> list[str]:
        """The table as the site check prints it."""
        space = ("the rows z-scored per feature with this site's means and SDs"
                 if self.scale == "standard" else "the rows as encoded (no scaling)")
        sample = "" if self.sampled_rows is None else (
            f"; fitted and scored on a seeded sample of {self.sampled_rows:,} of the "
            f"{self.n_rows:,} rows and the same share of each p's groups")
        head = (f"Cost of the groups to this site's own k-means, computed here from its "
                f"{self.n_rows:,} rows (nothing is sent): the k-means objective on the rows of "
                "centroids fitted on the groups' means (each weighted by its rows; from p = 3 "
                "refined with each group split by its spread, as a run trains) over that of "
                "the best fit of the rows found; 1.000: no cost, 1.050: 5% worse")
        how = (f"({space}; a missing cell, and one a group withholds, at its column's site "
               f"mean; the best of {N_STARTS} seeded k-means++ starts per fit{sample})")
        out = [head, how,
               "k | " + " | ".join(f"p = {p}" + (" (this site's)" if p == self.site_p else "")
                                   for p in self.p_values)]
        for i, k in enumerate(self.k_values):
            out.append(f"{k} | " + " | ".join("-" if np.isnan(r) else f"{r:.3f}"
                                              for r in self.ratios[i]))
        out.append("groups | " + " | ".join(str(g) for g in self.n_groups))
        if np.isnan(self.ratios).any():
            out.append("-: fewer groups than k at that p")
        return out + [""]


# ------------------------------------------------------------------ what is measured
def parse_k_values(text: str) -> tuple[int, ...]:
    """``"2-10"`` (a range, both ends in), ``"3,5,8"`` or ``"4"``: the table's k, each >= 2.

    Raises
    ------
    ValueError
        Not of those forms, a k under 2, or a range whose end is below its start.
    """
    text = str(text).strip()
    if m := re.fullmatch(r"(\d+)\s*-\s*(\d+)", text):
        lo, hi = int(m[1]), int(m[2])
        if hi < lo:
            raise ValueError(f"the cost table's k range {text!r} ends below its start")
        values = tuple(range(lo, hi + 1))
    elif re.fullmatch(r"\d+(\s*,\s*\d+)*", text):
        values = tuple(int(v) for v in text.split(","))
    else:
        raise ValueError(f"the cost table's k must be a range LO-HI (2-10), a list (3,5,8) "
                         f"or one k, got {text!r}")
    return checked_k_values(values)


def rows_needed(k_values) -> int:
    """The fewest rows a cost table takes: two per cluster at the smallest k."""
    return 2 * min(k_values)


def checked_k_values(k_values) -> tuple[int, ...]:
    """``k_values`` ascending, each once (``ValueError``: empty, not integers, or under 2)."""
    values = tuple(k_values)
    if not values or not all(isinstance(k, (int, np.integer)) and not isinstance(k, bool)
                             for k in values):
        raise ValueError(f"the cost table's k must be integers >= 2, got {values!r}")
    if min(values) < 2:
        raise ValueError(f"the cost table's k must be >= 2 (k = 1 costs nothing), "
                         f"got {min(values)}")
    return tuple(sorted({int(k) for k in values}))


def cost_p_values(site_p: int, extra=EXTRA_P_VALUES) -> tuple[int, ...]:
    """The table's p: the site's own and ``extra``, ascending, each once."""
    if isinstance(site_p, bool) or not isinstance(site_p, (int, np.integer)) or site_p < 1:
        raise ValueError(f"the site's min-cluster-size must be an integer >= 1, got {site_p!r}")
    return tuple(sorted({int(site_p), *(int(p) for p in extra)}))


def _transform(X: np.ndarray, scale: str) -> scaling.FeatureTransform:
    """The space of the fits: a missing cell at its column's site mean (of its present
    cells; 0 where none is), then ``standard`` with the moments of the rows so filled (a
    filled cell adds nothing to a column's squared deviations), or nothing more. Two
    chunked passes in file order."""
    n, d = X.shape
    present, total = np.zeros(d, dtype=np.int64), np.zeros(d)
    for start in range(0, n, CHUNK_ROWS):
        block = np.asarray(X[start:start + CHUNK_ROWS])
        release_pages(X)
        absent = np.isnan(block)
        if np.isinf(block).any():
            raise ValueError("the cost table's rows hold an infinite value")
        present += (~absent).sum(axis=0)
        total += np.where(absent, 0.0, block).sum(axis=0)
    fill = total / np.maximum(present, 1)
    if scale == "none":
        return scaling.FeatureTransform.fill_only(fill)
    deviation, m2 = np.zeros(d), np.zeros(d)
    for start in range(0, n, CHUNK_ROWS):
        block = np.asarray(X[start:start + CHUNK_ROWS])
        release_pages(X)
        centred = np.where(np.isnan(block), 0.0, block - fill)
        deviation += centred.sum(axis=0)
        m2 += np.einsum("ij,ij->j", centred, centred)
    return scaling.standard_transform([n], [fill], [deviation], [m2]).with_fill(fill)


def rows_objective(Z: np.ndarray, centroids: np.ndarray) -> float:
    """The k-means objective of ``centroids`` on the rows ``Z``: each row's squared
    distance to its nearest centroid, summed (differences, not the expanded norm)."""
    total = 0.0
    for start in range(0, Z.shape[0], SCORE_ROWS):
        diff = Z[start:start + SCORE_ROWS, None, :] - centroids[None, :, :]
        total += float(np.einsum("ikd,ikd->ik", diff, diff).min(axis=1).sum())
    return total


def _fit(points: np.ndarray, k: int, weights: np.ndarray | None = None,
         start: np.ndarray | None = None) -> np.ndarray:
    """k-means centroids of ``points`` (weighted): the best of N_STARTS seeded k-means++
    starts, or Lloyd from ``start``."""
    from sklearn.cluster import KMeans
    from sklearn.exceptions import ConvergenceWarning

    with warnings.catch_warnings():  # fewer distinct points than k: a fit all the same
        warnings.simplefilter("ignore", ConvergenceWarning)
        model = KMeans(n_clusters=k, init="k-means++" if start is None else start,
                       n_init=N_STARTS if start is None else 1, random_state=SEED)
        return model.fit(points, sample_weight=weights).cluster_centers_


def _group_points(groups: SiteGroups, transform: scaling.FeatureTransform,
                  chosen: np.ndarray | None) -> tuple:
    """The means (in the fits' space, as a run sees them), rows, and, where a run's
    training uses them (``group_weights.uses_spread``), per-feature variances of the groups (``chosen``: of those, by
    their place in the table); variances None below."""
    seen = groups.in_run_space(transform)
    counts = np.asarray(seen.counts, dtype=np.float64)
    means = np.asarray(seen.sums) / counts[:, None]
    variances = seen.variances if uses_spread(seen) else None
    keep = slice(None) if chosen is None else chosen
    return means[keep], counts[keep], None if variances is None else variances[keep]


def _groups_fit(points, k: int) -> np.ndarray:
    """The groups' fit: weighted k-means on their means; at p >= ``SPREAD_MIN_SIZE`` then
    Lloyd with each group split by its spread (a run's training tasks,
    ``kernels/spread.py``) from there, to convergence."""
    means, counts, variances = points
    C = _fit(means, k, counts)
    if variances is None:
        return C
    # (no scatter: the fit needs the sums and counts alone, not the SSE)
    return local.lloyd(means, C, SPREAD_ITERS, SPREAD_TOL, counts.astype(np.int64), None,
                       variances)[0]


def _groups_at(site: SiteData, p_values, site_p: int, site_groups: SiteGroups | None,
               transform, rng, max_rows: int | None):
    """Per p, the site's groups (how many) and the points of the groups' fit, of all of
    them or (``max_rows``: a sample) the same share of them; None where p is 1 or above
    the rows."""
    n = site.n_rows
    counts, points = [], []
    for p in p_values:
        if p == 1 or n < p:
            counts.append(n if p == 1 else 0)
            points.append(None)
            continue
        groups = site_groups if p == site_p and site_groups is not None \
            else group_table.build(site, p)[0]
        count = groups.n_groups
        counts.append(count)
        chosen = None if max_rows is None else \
            np.sort(rng.choice(count, min(count, max(1, round(count * max_rows / n))), replace=False))
        points.append(_group_points(groups, transform, chosen))
    return tuple(counts), points


def as_site(rows) -> SiteData:
    """A ``SiteData`` of rows given as an array (a missing cell: NaN), as it is."""
    if isinstance(rows, SiteData):
        return rows
    X = np.ascontiguousarray(rows, dtype=np.float64)
    if X.ndim != 2 or X.shape[1] == 0:
        raise ValueError(f"the cost table needs rows x features numbers, got shape {X.shape}")
    missing = int(np.isnan(X).sum())
    return SiteData(X, None, None, "rows", table=TableFacts(None, "", 0, {"cells": missing}))


# ------------------------------------------------------------------ the table
def group_cost(site, site_p: int, k_values=DEFAULT_K_VALUES, p_values=None,
               scale: str = "standard", max_rows: int = MAX_ROWS,
               site_groups: SiteGroups | None = None) -> GroupCostTable:
    """The cost table of a site's rows (module docstring).

    Parameters
    ----------
    site : SiteData or np.ndarray of shape (n, d)
        The site's data (its encoded rows ``X``, a missing cell NaN; may be a read-only
        ``np.memmap``, read in file order a chunk at a time), or its rows as an array.
    site_p : int
        The site's own min-cluster-size p_site (a column of the table).
    k_values : iterable of int, optional
        The numbers of clusters, each >= 2; default 2..10.
    p_values : iterable of int, optional
        The group sizes beside ``site_p``; default 2, 5 and 10 (:func:`cost_p_values`).
    scale : {"standard", "none"}
        The space of the fits (module docstring).
    max_rows : int
        Above this many rows, fit and score on a seeded sample (module docstring).
    site_groups : SiteGroups, optional
        The groups the site answers from at ``site_p`` (``group_table.site_groups``);
        None: made here, as the site first makes them.

    Returns
    -------
    GroupCostTable

    Raises
    ------
    ValueError
        A k under 2, a p under 1, an unknown ``scale``, ``max_rows`` under 2 x the
        smallest k, rows that are not 2-D numbers (or hold an infinity), or fewer than
        2 x the smallest k rows (too few for groups of 2 to make k clusters).
    """
    k_values = checked_k_values(k_values)
    p_values = cost_p_values(site_p, EXTRA_P_VALUES if p_values is None else p_values)
    if scale not in SCALES:
        raise ValueError(f"the cost table's scale must be one of {SCALES}, got {scale!r}")
    site = as_site(site)
    n, need = site.n_rows, rows_needed(k_values)
    if n < need:
        raise ValueError(f"too few rows for a cost table: {n}, at least {need} needed (two "
                         f"per cluster at k = {k_values[0]})")
    if max_rows < need:
        raise ValueError(f"max_rows must be at least {need}, got {max_rows}")
    X = site.X
    transform = _transform(X, scale)
    rng = np.random.default_rng(SEED)
    sampled = n > max_rows
    scored = np.sort(rng.choice(n, max_rows, replace=False)) if sampled else slice(None)
    Z = np.ascontiguousarray(transform.apply(np.asarray(X[scored])))
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1):  # the same figures on any machine (and no busy threads)
        n_groups, group_points = _groups_at(site, p_values, int(site_p), site_groups,
                                            transform, rng, max_rows if sampled else None)
        rows_fit = np.full(len(k_values), np.nan)
        groups_fit = np.full((len(k_values), len(p_values)), np.nan)
        for i, k in enumerate(k_values):
            if k > Z.shape[0]:
                continue
            fitted = []  # each p's groups' centroids
            for j, points in enumerate(group_points):
                if points is not None and k <= points[0].shape[0]:
                    fitted.append(_groups_fit(points, k))
                    groups_fit[i, j] = rows_objective(Z, fitted[-1])
            # the rows' best: its own starts, and Lloyd on the rows from each groups' fit
            rows_fit[i] = min([rows_objective(Z, _fit(Z, k))] +
                              [rows_objective(Z, _fit(Z, k, start=c)) for c in fitted])
            groups_fit[i, [j for j, p in enumerate(p_values) if p == 1]] = rows_fit[i]
    ratios = groups_fit / rows_fit[:, None]
    return GroupCostTable(k_values, p_values, int(site_p), ratios, rows_fit, groups_fit,
                          n_groups, n, max_rows if sampled else None, scale)

"""What a site's groups cost its own k-means: the site check's cost table (issue 45).

A site answers every task from groups of at least p_site of its rows (``grouping.py``),
each assigned whole to the centroid nearest its mean, and that costs k-means quality,
more at a larger p. This module measures the cost from the site's own rows, alone,
sending nothing, so that a data officer chooses p (node config ``min-cluster-size``)
knowing it. For each p (the site's own, 2, 5 and 10) and each k (2..10 unless told):

- ``groups``: k-means fitted on the means of the site's groups at that p, each weighted
  by its rows (the groups ``grouping.group_rows`` makes at p, as the site makes them:
  a missing cell at its column's site mean, the distances weighted by ``grouping_scale``),
  the best of ``N_STARTS`` k-means++ starts from ``SEED``;
- ``rows``: the best k-means fit of the site's rows found: the best of ``N_STARTS``
  k-means++ starts on the rows, and of Lloyd on the rows from each p's ``groups``
  centroids (so that no figure falls under 1 by k-means' luck alone);

both scored by the k-means objective ON THE ROWS (each row's squared distance to its
nearest centroid, summed). The figure is ``groups / rows``: 1.000 is no cost, 1.050 a
clustering 5% worse, in the rows' own terms. Each fit is scikit-learn's ``KMeans``
(Lloyd), in one thread (the same figures on any machine).

The space: the rows z-scored per feature with this site's own means and standard
deviations (``scale = "standard"``, as ``scaling.standard_transform`` would with this
site alone; a constant feature only centred), a missing cell at its column's site mean;
or, with ``scale="none"``, the rows as encoded. A cell that the lone-cell rule counts as
missing in a run (``site_groups.withhold_lone_cells``) is at its value here: the table
measures the grouping, not the fill.

A site of more than ``max_rows`` rows (default ``MAX_ROWS``) is still grouped whole (its
groups are the site's), but fitted and scored on a seeded sample: ``max_rows`` of its
rows (``np.random.default_rng(SEED).choice(n, max_rows, replace=False)``, sorted), and at
each p, from the same generator, the same share of its groups (``round(G * max_rows /
n)`` of them, sorted); the table says so.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass

import numpy as np

from fedcluster.client_app.data.grouping import group_rows, grouping_scale
from fedcluster.client_app.mapped_pages import release_pages
from fedcluster.common import scaling

__all__ = ["DEFAULT_K_VALUES", "EXTRA_P_VALUES", "MAX_ROWS", "N_STARTS", "SEED", "GroupCostTable",
           "checked_k_values", "cost_p_values", "group_cost", "parse_k_values", "rows_needed",
           "site_group_cost"]

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
                "centroids fitted on the groups' means (each weighted by its rows) over that of "
                "the best fit of the rows found; 1.000: no cost, 1.050: 5% worse")
        how = (f"({space}, a missing cell at its column's site mean; the best of {N_STARTS} "
               f"seeded k-means++ starts per fit{sample})")
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
    """The space of the fits: ``standard`` with this site's own moments, or the rows."""
    d = X.shape[1]
    if scale == "none":
        return scaling.FeatureTransform("none", np.zeros(d), np.ones(d))
    mean, deviation, m2 = scaling.site_moments(X)
    return scaling.standard_transform([X.shape[0]], [mean], [deviation], [m2])


def _group_means(X: np.ndarray, group_of_row: np.ndarray, chosen: np.ndarray,
                 transform: scaling.FeatureTransform) -> tuple[np.ndarray, np.ndarray]:
    """The means (in the fits' space) and rows of the groups ``chosen`` (sorted ids), one
    chunked pass over ``X`` in file order."""
    n_groups = int(group_of_row.max()) + 1
    slot = np.full(n_groups, -1, dtype=np.int64)
    slot[chosen] = np.arange(chosen.size)
    d = X.shape[1]
    sums = np.zeros((chosen.size, d))
    counts = np.zeros(chosen.size)
    for start in range(0, X.shape[0], CHUNK_ROWS):
        block = np.asarray(X[start:start + CHUNK_ROWS])
        release_pages(X)
        groups = group_of_row[start:start + CHUNK_ROWS]
        where = slot[np.where(groups >= 0, groups, 0)]
        keep = (groups >= 0) & (where >= 0)
        where, block = where[keep], block[keep]
        counts += np.bincount(where, minlength=chosen.size)
        for j in range(d):
            sums[:, j] += np.bincount(where, weights=block[:, j], minlength=chosen.size)
    return transform.apply(sums / counts[:, None]), counts


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


def _groups_at(X, p_values, transform, rng, max_rows):
    """Per p, the site's groups (how many) and the points of the groups' fit: their means
    (in the fits' space) and rows, of all of them or (``max_rows``: a sample) the same
    share of them; None where p is 1 or above the rows."""
    n = X.shape[0]
    scale = grouping_scale(X) if p_values[-1] > 1 else None
    counts, points = [], []
    for p in p_values:
        if p == 1 or n < p:
            counts.append(n if p == 1 else 0)
            points.append(None)
            continue
        group_of_row = group_rows(X, p, scale)
        count = int(group_of_row.max()) + 1
        counts.append(count)
        chosen = np.arange(count) if max_rows is None else \
            np.sort(rng.choice(count, min(count, max(1, round(count * max_rows / n))), replace=False))
        points.append(_group_means(X, group_of_row, chosen, transform))
    return tuple(counts), points


# ------------------------------------------------------------------ the table
def group_cost(X: np.ndarray, site_p: int, k_values=DEFAULT_K_VALUES, p_values=None,
               scale: str = "standard", max_rows: int = MAX_ROWS) -> GroupCostTable:
    """The cost table of a site's rows (module docstring).

    Parameters
    ----------
    X : np.ndarray of shape (n, d)
        The site's rows as its grouping sees them: encoded, finite (a missing cell at
        its column's site mean: :func:`site_group_cost` does that), float64; may be a
        read-only ``np.memmap`` (read in file order, a chunk at a time).
    site_p : int
        The site's own min-cluster-size p_site (a column of the table).
    k_values : iterable of int, optional
        The numbers of clusters, each >= 2; default 2..10.
    p_values : iterable of int, optional
        The group sizes; default the site's own, 2, 5 and 10 (:func:`cost_p_values`).
    scale : {"standard", "none"}
        The space of the fits (module docstring).
    max_rows : int
        Above this many rows, fit and score on a seeded sample (module docstring).

    Returns
    -------
    GroupCostTable

    Raises
    ------
    ValueError
        A k under 2, a p under 1, an unknown ``scale``, ``max_rows`` under 2 x the
        smallest k, ``X`` not 2-D numeric and finite, or fewer than 2 x the smallest k
        rows (too few for groups of 2 to make k clusters).
    """
    k_values = checked_k_values(k_values)
    p_values = cost_p_values(site_p) if p_values is None else cost_p_values(site_p, p_values)
    if scale not in SCALES:
        raise ValueError(f"the cost table's scale must be one of {SCALES}, got {scale!r}")
    X = X if isinstance(X, np.ndarray) else np.asarray(X)
    if X.ndim != 2 or X.shape[1] == 0 or X.dtype.kind not in "iuf":
        raise ValueError(f"the cost table needs rows x features numbers, got {X.dtype} {X.shape}")
    n = X.shape[0]
    need = rows_needed(k_values)
    if n < need:
        raise ValueError(f"too few rows for a cost table: {n}, at least {need} needed (two "
                         f"per cluster at k = {k_values[0]})")
    if max_rows < need:
        raise ValueError(f"max_rows must be at least {need}, got {max_rows}")
    transform = _transform(X, scale)
    rng = np.random.default_rng(SEED)
    sampled = n > max_rows
    scored = np.sort(rng.choice(n, max_rows, replace=False)) if sampled else slice(None)
    Z = np.ascontiguousarray(transform.apply(np.asarray(X[scored])))
    if not np.isfinite(Z).all():
        raise ValueError("the cost table's rows hold a non-finite value (fill missing cells first)")
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1):  # the same figures on any machine (and no busy threads)
        n_groups, group_points = _groups_at(X, p_values, transform, rng, max_rows if sampled else None)
        rows_fit = np.full(len(k_values), np.nan)
        groups_fit = np.full((len(k_values), len(p_values)), np.nan)
        for i, k in enumerate(k_values):
            if k > Z.shape[0]:
                continue
            fitted = {}  # p -> the groups' centroids
            for j, p in enumerate(p_values):
                if p == 1:  # every group is one row: the rows' own fit, below
                    continue
                if group_points[j] is not None and k <= group_points[j][0].shape[0]:
                    means, rows_per_group = group_points[j]
                    fitted[p] = _fit(means, k, rows_per_group)
                    groups_fit[i, j] = rows_objective(Z, fitted[p])
            # the rows' best: its own starts, and Lloyd on the rows from each groups' fit
            rows_fit[i] = min([rows_objective(Z, _fit(Z, k))] +
                              [rows_objective(Z, _fit(Z, k, start=c)) for c in fitted.values()])
            groups_fit[i, [j for j, p in enumerate(p_values) if p == 1]] = rows_fit[i]
    ratios = groups_fit / rows_fit[:, None]
    return GroupCostTable(k_values, p_values, int(site_p), ratios, rows_fit, groups_fit,
                          tuple(n_groups), n, max_rows if sampled else None, scale)


def site_group_cost(site, site_p: int, k_values=DEFAULT_K_VALUES, scale: str = "standard",
                    max_rows: int = MAX_ROWS) -> GroupCostTable:
    """The cost table of a site's data (``site_data.SiteData``): its rows as its grouping
    sees them (``group_table``: a missing cell at its column's site mean), grouped at
    each p as the site groups them (:func:`group_cost`)."""
    from fedcluster.client_app.data import group_table

    with group_table._grouping_rows(site) as X:
        return group_cost(X, site_p, k_values, scale=scale, max_rows=max_rows)

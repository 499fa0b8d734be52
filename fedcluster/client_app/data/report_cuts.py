"""Which straddling groups a report may split, and which features its parts carry
(``report_table.py``, its module docstring's step 3; issue 56).

Training released every group's count and sums, so a part less the straddlers it came
from gives, per CUT of the clusters (a set T of them), each straddler's rows on one side
of the coordinator's boundaries: summed over the straddlers, the smaller side is that
combination's support. A site keeps a straddler whole where a cut isolates fewer than p
rows, where a part would hold fewer than p rows, or where the p% rule on means flags a
part; a numeric feature a cut isolates fewer than p present cells of (but not rows) is
carried at a stood-in mean. These are a pre-filter: the one audit, with everything the site
ever released (``release/gate.admit_report``), decides.
"""

from __future__ import annotations

import numpy as np

from fedcluster.client_app.data.group_table import judged_features
from fedcluster.client_app.data.site_data import SiteData
from fedcluster.client_app.release import dominance
from fedcluster.client_app.site_groups import SiteGroups

__all__ = ["MAX_CUT_CLUSTERS", "carriable", "exposed", "site_moments"]

#: Rows per block of a pass over a site's rows (a few MB of temporaries).
BLOCK_ROWS = 1 << 15


def site_moments(site: SiteData, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(d,) (d,): the mean and standard deviation of each feature over ``rows``' present
    cells (the p% rule's yardsticks), a block of rows at a time."""
    n, total, squares = (np.zeros(site.n_features) for _ in range(3))
    for start in range(0, rows.size, BLOCK_ROWS):
        X = np.asarray(site.X[rows[start:start + BLOCK_ROWS]], dtype=np.float64)
        here = ~np.isnan(X)
        filled = np.where(here, X, 0.0)
        n, total, squares = n + here.sum(axis=0), total + filled.sum(axis=0), \
            squares + (filled * filled).sum(axis=0)
    mean = total / np.maximum(n, 1)
    return mean, np.sqrt(np.maximum(squares / np.maximum(n, 1) - mean ** 2, 0.0))


def _flagged_parts(site: SiteData, rows: np.ndarray, part: np.ndarray, k: int, p: int,
                   moments, released: np.ndarray) -> np.ndarray:
    """(k, d) bool: per part, the features where the p% rule on means flags it
    (``release/dominance.py``: from p_site 3, in the judged features the parts release as
    their rows' own: ``released``; ``moments``: the yardsticks, :func:`site_moments`)."""
    flagged = np.zeros((k, site.n_features), dtype=bool)
    if p < dominance.MEANS_FROM_P or moments is None:
        return flagged
    site_mean, sd = moments
    judged = judged_features(site)
    judged = released if judged is None else judged & released
    for c in np.unique(part[part >= 0]).tolist():
        values = np.asarray(site.X[rows[part == c]], dtype=np.float64)
        cells = (~np.isnan(values)).sum(axis=0)
        filled = np.where(np.isnan(values), 0.0, values)
        mean = filled.sum(axis=0) / np.maximum(cells, 1)
        high = np.where(cells > 0, np.where(np.isnan(values), -np.inf, values).max(axis=0), 0.0) - mean
        low = np.where(cells > 0, np.where(np.isnan(values), np.inf, values).min(axis=0), 0.0) - mean
        hit = dominance.dominated_means(mean[None], high[None], low[None], cells[None],
                                        site_mean, sd)[0] & judged
        flagged[c] = hit
    return flagged


def exposed(site: SiteData, rows: np.ndarray, g: np.ndarray, cluster: np.ndarray,
            observed: tuple, split: np.ndarray, k: int, p: int, moments):
    """(G,) bool, (d,) bool: the split groups to keep whole, and the features the parts
    carry at a stood-in mean. ``observed``: the straddlers' rows, what a cut counts of
    them (1 a row, each feature's present cell) and the columns no cut may isolate under
    p of (the rows, and the features not :func:`carriable`). A carriable feature some cut
    isolates under p cells of, or in which the p% rule on means flags a part
    (:func:`_flagged_parts`), is carried; a split group is kept whole where a cut under p
    of another column rests on it (:func:`_short_cuts`), or where it feeds a part of fewer
    than p rows or one the p% rule flags in a feature that cannot be carried."""
    at, counted, fixed = observed
    touching, short = _short_cuts(g[at], cluster[at], counted, split, k, p, fixed)
    carried = short[1:] & ~fixed[1:]
    part = np.where(split[g], cluster, -1)
    sizes = np.bincount(part[part >= 0], minlength=k)
    # a part the p% rule flags in a feature stands in there (carried), as a group would;
    # where the feature cannot be carried, its straddlers stay whole
    flagged = _flagged_parts(site, rows, part, k, p, moments, ~carried)
    carried |= flagged.any(axis=0) & ~fixed[1:]
    bad = ((sizes > 0) & (sizes < p)) | (flagged & fixed[None, 1:]).any(axis=1)
    touching[g[(part >= 0) & bad[np.maximum(part, 0)]]] = True
    return touching & split, carried


#: The most clusters whose every cut :func:`_short_cuts` tries (2^k - 2 cuts); beyond,
#: the audit alone judges.
MAX_CUT_CLUSTERS = 12


def _short_cuts(g: np.ndarray, cluster: np.ndarray, observed: np.ndarray, split: np.ndarray,
                k: int, p: int, fixed: np.ndarray):
    """(G,) bool, (1 + d,) bool: the split groups a cut of the clusters isolating fewer
    than p rows or cells of a ``fixed`` column rests on (to keep whole), and the columns
    some cut isolates fewer than p of. For clusters T, the parts in T less the split
    groups' sums give each split group's rows on one side of T's boundary: summed over the
    groups the smaller side (``g``, ``cluster``: the straddlers' rows' groups and clusters;
    ``observed``: per such row, 1 and each feature's present cell), that combination's
    support. A cut under p (not 0) is short; the audit judges the rest. A pre-filter that
    spares the audit's refusal: the audit decides."""
    out = np.zeros(split.size, dtype=bool)
    short_columns = np.zeros(observed.shape[1], dtype=bool)
    if not split.any():
        return out, short_columns
    if k > MAX_CUT_CLUSTERS:  # the audit alone judges the fixed columns; carry the rest
        short_columns[~fixed] = True
        return out, short_columns
    mine = split[g]
    ids, local = np.unique(g[mine], return_inverse=True)  # the split groups alone
    per_cluster = np.zeros((ids.size, k, observed.shape[1]))
    np.add.at(per_cluster, (local, cluster[mine]), observed[mine])
    total = per_cluster.sum(axis=1)
    # every cut once (T and its complement are one cut: the last cluster stays outside),
    # in Gray-code order, so that each side is the last one with one cluster moved
    side = np.zeros_like(total)
    previous = 0
    for step in range(1, 1 << (k - 1)):
        mask = step ^ (step >> 1)
        moved = (mask ^ previous).bit_length() - 1
        side += per_cluster[:, moved] if mask & (1 << moved) else -per_cluster[:, moved]
        previous = mask
        smaller = np.minimum(side, total - side)  # (split groups, 1 + d)
        support = smaller.sum(axis=0)
        short = (support > 0) & (support < p)
        short_columns |= short
        if (short & fixed).any():
            out[ids[(smaller[:, short & fixed] > 0).any(axis=1)]] = True
    return out, short_columns


def carriable(site: SiteData, groups: SiteGroups, split: np.ndarray) -> np.ndarray:
    """(d,) bool: the features a part may carry at a stood-in mean (``report_table.py``, 3):
    a number (a schema's numeric column, or any column without a schema; a level's
    indicator sums to a count, which a stood-in mean would not be) that no straddler
    withholds cells of (their released sums then hold every cell the parts hold)."""
    numeric = judged_features(site)
    out = np.ones(site.n_features, dtype=bool) if numeric is None else numeric.copy()
    if groups.withheld is not None:
        out &= ~(groups.withheld[split] > 0).any(axis=0)
    return out

"""How a site's groups enter the k-means kernels: as weighted means (each group whole),
or, at p_site >= ``spread.SPREAD_MIN_SIZE``, with their per-feature spread too (a group
near a boundary split between its two nearest centroids, ``common/kernels/spread.py``);
and how the kernels' cluster sizes become the whole rows a reply carries."""

from __future__ import annotations

import numpy as np

from fedcluster.client_app.site_groups import SiteGroups
from fedcluster.common.kernels.spread import SPREAD_MIN_SIZE

__all__ = ["in_rows", "kernel_weights", "site_spread_per_row", "split_weights", "spread_per_row",
           "uses_spread"]


def kernel_weights(groups: SiteGroups) -> tuple[np.ndarray | None, np.ndarray | None]:
    """The kernels' (weights, scatter) of the groups; None for rows (p_site = 1), which
    keeps every kernel the row-level one, bit for bit."""
    return (None, None) if groups.singletons else (groups.counts, groups.scatter)


def split_weights(groups: SiteGroups) -> tuple:
    """The Lloyd kernels' (weights, scatter, variances) of the groups: at p_site >=
    ``spread.SPREAD_MIN_SIZE`` with each group's per-feature variance, so that a group
    near a boundary is split between its two nearest centroids as its spread says
    (``kernels/spread.py``); below, (weights, scatter, None): groups assigned whole (at
    p_site = 2 a group's per-feature spread would give its two rows' values back)."""
    weights, scatter = kernel_weights(groups)
    return weights, scatter, groups.variances if uses_spread(groups) else None


def uses_spread(groups: SiteGroups) -> bool:
    """Whether the site's training tasks use its groups' per-feature spread (p_site >=
    ``SPREAD_MIN_SIZE``, groups of more than one row)."""
    return groups.min_size >= SPREAD_MIN_SIZE and not groups.singletons


def in_rows(counts: np.ndarray) -> np.ndarray:
    """Cluster sizes as the replies carry them: whole rows. Expected counts (split
    groups) are rounded by largest remainder, so that they add up to the site's rows as
    whole groups' counts do (the server checks that no reply counts more rows than the
    site holds)."""
    counts = np.asarray(counts)
    if counts.dtype.kind in "iu":
        return counts.astype(np.int64)
    whole = np.floor(counts)
    short = round(float(counts.sum()) - float(whole.sum()))
    if short > 0:  # the largest fractions take a row each (ties: the lowest index)
        whole[np.argsort(-(counts - whole), kind="stable")[:short]] += 1
    return whole.astype(np.int64)


def spread_per_row(groups: SiteGroups):
    """Each row of a group lies on average its group's spread per row (its squared
    deviations from its mean over its rows) farther (squared) from a centre than the
    group's mean. At p_site >= ``SPREAD_MIN_SIZE``, each group's own, (G,): its replies
    may carry a group's spread (privacy model, "A group's spread"); below, the site's
    (summed over ALL its groups, over its rows), which stands in for each group's own
    (at p_site 2 a group's spread, with d + 1 crafted scalings, gives its two rows'
    values); 0: rows."""
    if uses_spread(groups):
        return groups.scatter / groups.counts
    return site_spread_per_row(groups)


def site_spread_per_row(groups: SiteGroups) -> float:
    """The site's groups' squared deviations from their own means, summed over ALL its
    groups, over its rows (0: rows)."""
    return 0.0 if groups.singletons else float(groups.scatter.sum()) / groups.n_rows

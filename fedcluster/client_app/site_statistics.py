"""Site tasks that report over ALL the site's groups, never per cluster: its description,
the imputation statistics, the scaling statistics and the bounding box. Each is refused
by a site with fewer rows than the privacy floor (``release/gate.admit``).

``describe``
    Size, width and feature names, so the server can check that sites agree; a table
    read through a schema adds the schema's hash and, as counts (``"<p"`` under the
    floor), the rows ``drop-row`` dropped and the missing cells per column.
``impute_stats``
    Per encoded feature, the sum and count of its present cells (exact, from the
    groups') and (``impute-median``) the histogram of the groups' present means, each
    counting its present cells, over the schema's range, under the floor
    (``common/imputation.py``).
``stats``
    Per-feature aggregates for the global scaling (``scale``): mean, sum of deviations
    and M2 (``standard``; exact, from the groups' sums and m2) or minimum and maximum of
    the groups' means (``minmax``); ``common/scaling.py``.
``bounds``
    Per-feature minimum and maximum of the groups' means (random initialisation in the
    federated box): each a mean of at least p_site rows, as every other reply.
"""

from __future__ import annotations

import json

import numpy as np

from fedcluster.client_app.release.floor import Counts, PerCluster, SmallCells
from fedcluster.client_app.site_groups import SiteGroups
from fedcluster.client_app.task_io import TaskError, TaskReply
from fedcluster.common import protocol, scaling
from fedcluster.common.imputation import imputation_plan, site_missing_stats


def describe(site: SiteGroups, arrays, params, floor: int) -> TaskReply:
    names = list(site.feature_names) if site.feature_names is not None else []
    metrics = {"n-features": site.n_features, "feature-names": json.dumps(names)}
    # every usable row accounted for (counts of rows, not of values): in groups
    # (num_examples), waiting, held back by the versions audit (and why); (a table asked
    # directly, not its groups, has none waiting)
    waiting, held = getattr(site, "waiting", 0), getattr(site, "held_back", 0)
    metrics[protocol.ROWS_WAITING] = waiting - held
    metrics[protocol.ROWS_HELD_BACK] = held
    if held:
        metrics[protocol.HELD_BACK_WHY] = site.held_back_why
    if site.table is not None:
        if site.table.schema_hash:  # (none: a table read without an agreed schema)
            metrics[protocol.SCHEMA_HASH] = site.table.schema_hash
        metrics[protocol.ROWS_DROPPED] = json.dumps(int(site.table.rows_dropped))
        metrics[protocol.CELLS_MISSING] = json.dumps(
            {name: int(n) for name, n in site.table.cells_missing.items()})
    return TaskReply(metrics=metrics, rules=(Counts((protocol.ROWS_DROPPED, protocol.CELLS_MISSING)),))


def impute_stats(site: SiteGroups, arrays, params, floor: int) -> TaskReply:
    """The imputation round: per encoded feature, sums, counts and histograms of the
    present cells (never a row), from the site's own schema: a feature of fewer present
    cells than the floor withheld whole, a bin under it read 0 (the release step)."""
    if site.table is None:
        raise TaskError(f"{site.source}: the run imputes missing cells, but this site's "
                        "table is not read through a schema (node-config 'schema-path')")
    plan = imputation_plan(site.table.schema)
    present = site.counts[:, None] if site.present is None else site.present
    present = np.broadcast_to(present, site.sums.shape)
    sums, counts, histograms = site_missing_stats(present, site.sums, plan, 1)
    return TaskReply(arrays=protocol.MissingStats(sums, counts, histograms),
                     rules=(PerCluster(counts, ("sums", "counts", "histograms"), "zero"),
                            SmallCells("histograms")))


def stats(site: SiteGroups, arrays, params, floor: int) -> TaskReply:
    """The statistics round: per-feature aggregates over ALL rows (never a row), refused
    by a site with fewer rows than the privacy floor."""
    kind = params.get("scale")
    if kind == "standard":
        if site.singletons:
            return TaskReply(arrays=protocol.Moments(*scaling.site_moments(site.means)))
        return TaskReply(arrays=protocol.Moments(*scaling.site_moments(
            site.means, site.counts, site.m2.sum(axis=0))))
    if kind == "minmax":
        return TaskReply(arrays=protocol.Range(*scaling.site_range(site.means)))
    raise TaskError(f"task parameter 'scale' must be 'standard' or 'minmax', got {kind!r}")


def bounds(site: SiteGroups, arrays, params, floor: int) -> TaskReply:
    return TaskReply(arrays=protocol.Range(*scaling.site_range(site.means)))


def value_range(site: SiteGroups, arrays, params, floor: int) -> TaskReply:
    """Per feature, in the table's units (no fill, no scaling: ``task_runner`` hands this
    task the table as it is), the least and the greatest of its groups' means of present
    cells: where the profile's histograms span a column the schema gives no range, so
    that no median or quartile Table 1 reads from them lies outside what the groups' own
    values span. A feature without a present cell at this site sends the run's fill
    twice (a pooled mean, inside the other sites' span), else 0."""
    means = site.means  # (NaN where a group has no present cell)
    seen = ~np.isnan(means)
    fill = None
    if "transform" in params:
        fill = scaling.FeatureTransform.decode(str(params["transform"])).fill
    stand_in = np.zeros(site.n_features) if fill is None else np.nan_to_num(fill, nan=0.0)
    some = seen.any(axis=0)
    low = np.where(some, np.where(seen, means, np.inf).min(axis=0), stand_in)
    high = np.where(some, np.where(seen, means, -np.inf).max(axis=0), stand_in)
    return TaskReply(arrays=protocol.Range(low.astype(np.float64), high.astype(np.float64)))

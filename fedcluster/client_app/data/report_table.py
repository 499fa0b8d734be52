"""The report's groups: a site's groups re-cut so that each lies within one cluster of
the final model (issue 56), for the figures a person reads (the final evaluation, Davies-
Bouldin's pass, Table 1's profile) and for nothing else.

Training assigns a site's groups whole, by their means; ``predict`` assigns rows. A group
whose rows the final centroids put in two clusters (a STRADDLER) made the report count a
few rows in their group's cluster, not the model's (6.7-8.3 % of the clinical demo's rows,
``bench/clinical_report.py``). Here, when a task carries ``protocol.REPORT``, the site:

1. assigns its grouped rows to the centroids sent, in the run's space (the task's
   ``transform``: its fill and scaling; ``data-bounds`` clipping), as ``predict`` does;
2. keeps every group whose rows lie in one cluster as it is (its statistics bit for bit),
   and pools the straddlers' rows of each cluster into one new group, a PART (at most k
   per site);
3. keeps a straddler whole where a part it feeds would hold fewer than p_site rows, or
   where the p% rule on means (``release/dominance.py``, from p_site 3) flags a part: its
   rows then count in their group's cluster, as before;
4. gives the parts a spread derived from released figures alone: the split groups'
   released spreads plus what re-cutting their rows changes in the squared deviations
   (from the split groups' and the parts' counts and sums), shared by the parts' degrees
   of freedom. The report's squared deviations then add up exactly as the table's did
   (the SSE is the rows' own where every straddler is split), and a part releases no
   second moment of its own. The lone-cell rule applies as to every table;
5. audits the parts' counts and sums with everything the site answered from
   (``report_history.py``: a deployed site's whole history; per feature, with the spread
   units' sums of squares): where a combination isolates fewer than p rows or values,
   one row's change, or the sums with the sums of squares determine a value, no group is
   split;
6. answers one partition per version of its data (``report_history.py``): the same
   partition asked again (the evaluation, then the profile) is the same table; another
   one is answered from the groups whole.

What it costs: rows of a straddler kept whole still count in their group's cluster (the
site's log says how many rows the split moved, and why it kept groups whole); a part's
spread per cluster is a share of the parts' total (Table 1's SDs per cluster blur a
little across the parts; the total is exact); and a deployed site's later versions are
audited with the parts too, so a version that regroups rows a part holds may have to
hold some of them back (``bench/clinical_report.py`` measures the rows moved and lost).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedcluster.client_app.data import group_stats
from fedcluster.client_app.data.group_table import judged_features, made_groups, _labels_of_groups
from fedcluster.client_app.data.report_history import ReportHistory, partition_digest
from fedcluster.client_app.data.site_data import SiteData
from fedcluster.client_app.release import dominance
from fedcluster.client_app.release.lone_cells import withhold_lone_cells
from fedcluster.client_app.site_groups import SiteGroups
from fedcluster.common import kernels, scaling

__all__ = ["Report", "ReportHistory", "report_groups", "rows_clusters"]


@dataclass(frozen=True)
class Report:
    """The table a report task answers from.

    Attributes
    ----------
    groups : SiteGroups
        The kept groups, then the parts.
    split : int
        The straddlers pooled into parts.
    moved : int
        Rows counted in another cluster than their group's mean's (what the report gains).
    why : str
        Why no group was split ("": none straddles, or the split stands).
    group_of_row : (n,) int or None
        Each row's group in ``groups`` (-1: waiting); None: the site's own table's.
    """

    groups: SiteGroups
    split: int
    moved: int
    why: str
    group_of_row: np.ndarray | None = None


# ------------------------------------------------------------------ the rows' clusters
def rows_clusters(site: SiteData, rows: np.ndarray, centroids: np.ndarray,
                  transform: str | None, box) -> np.ndarray:
    """The cluster of each of ``rows`` (file order) as ``predict`` assigns it: nearest
    centroid in the run's space (``transform``), clipped to ``box`` where given."""
    X = np.asarray(site.X[rows], dtype=np.float64)
    if transform is not None:
        X = scaling.FeatureTransform.decode(transform).apply(X)
    if box is not None:
        X = np.clip(X, *box)
    return kernels.assign(np.ascontiguousarray(X), np.ascontiguousarray(centroids))[0]


def _flagged_parts(site: SiteData, rows: np.ndarray, part: np.ndarray, k: int,
                   p: int) -> np.ndarray:
    """(k,) bool: the parts the p% rule on means flags (``release/dominance.py``: from
    p_site 3, in the judged features), yardsticks the site's grouped rows."""
    flagged = np.zeros(k, dtype=bool)
    if p < dominance.MEANS_FROM_P:
        return flagged
    X = np.asarray(site.X[rows], dtype=np.float64)
    n = np.maximum((~np.isnan(X)).sum(axis=0), 1)
    filled = np.where(np.isnan(X), 0.0, X)
    site_mean = filled.sum(axis=0) / n
    sd = np.sqrt(np.maximum((filled * filled).sum(axis=0) / n - site_mean ** 2, 0.0))
    judged = judged_features(site)
    for c in np.unique(part[part >= 0]).tolist():
        values = X[part == c]
        cells = (~np.isnan(values)).sum(axis=0)
        filled = np.where(np.isnan(values), 0.0, values)
        mean = filled.sum(axis=0) / np.maximum(cells, 1)
        high = np.where(cells > 0, np.where(np.isnan(values), -np.inf, values).max(axis=0), 0.0) - mean
        low = np.where(cells > 0, np.where(np.isnan(values), np.inf, values).min(axis=0), 0.0) - mean
        hit = dominance.dominated_means(mean[None], high[None], low[None], cells[None],
                                        site_mean, sd)[0]
        if judged is not None:
            hit &= judged
        flagged[c] = bool(hit.any())
    return flagged


# ------------------------------------------------------------------ the report's table
def report_groups(site: SiteData, groups: SiteGroups, group_of_row: np.ndarray,
                  centroids: np.ndarray, transform: str | None, box,
                  history: ReportHistory | None = None) -> Report:
    """The report's table (module docstring) of ``groups`` (as made, in the encoded
    units; ``group_of_row`` each row's group, -1 waiting) at the final ``centroids``.

    Parameters
    ----------
    site : SiteData
    groups : SiteGroups
    group_of_row : (n,) int
    centroids : (k, d) float
        The centroids sent, in the run's space.
    transform : str or None
        The run's transform (its exact text) the centroids live in.
    box : (lo, hi) or None
        The task's ``data-bounds`` clipping.
    history : ReportHistory, optional
        Where the site keeps the partition it answered (default: ``site``'s, run None).
    """
    p, k = groups.min_size, int(centroids.shape[0])
    whole = Report(groups, 0, 0, "")
    if p <= 1 or groups.n_groups == 0:
        return whole  # rows answer for themselves: every group is one row
    rows = np.flatnonzero(group_of_row >= 0)
    cluster = rows_clusters(site, rows, centroids, transform, box)
    g = group_of_row[rows]
    lo = np.full(groups.n_groups, k, dtype=np.int64)
    hi = np.full(groups.n_groups, -1, dtype=np.int64)
    np.minimum.at(lo, g, cluster)
    np.maximum.at(hi, g, cluster)
    split = lo != hi
    history = history or ReportHistory(site, groups)
    observed = np.concatenate([np.ones((rows.size, 1)), ~np.isnan(np.asarray(site.X[rows]))],
                              axis=1)  # what a cut counts: rows, and each feature's cells
    for _ in range(groups.n_groups + 1):  # keep whole what a part or a cut would expose
        short = _short_cuts(g, cluster, observed, split, k, p)
        part = np.where(split[g], cluster, -1)
        sizes = np.bincount(part[part >= 0], minlength=k)
        bad = ((sizes > 0) & (sizes < p)) | _flagged_parts(site, rows, part, k, p)
        if not bad.any() and not short.any():
            break
        touching = short.copy()
        touching[g[(part >= 0) & bad[np.maximum(part, 0)]]] = True
        split &= ~touching
    part = np.where(split[g], cluster, -1)
    if not split.any():
        return Report(groups, 0, 0, "" if (lo == hi).all() else
                      f"splitting its straddling groups would give sums of fewer than {p} "
                      "rows or cells (a part, or a part less its groups)")
    clusters = [c for c in range(k) if np.any(part == c)]
    instances = history.instances(rows)
    parts = [instances[np.flatnonzero(part == c)] for c in clusters]
    digest = partition_digest(parts, p)
    done = history.answered()
    if done is not None and done != digest:
        return Report(groups, 0, 0, "the site answered a report over another partition of this "
                      "version of its data; one per version (its groups count whole)")
    if done is None:
        finding = history.audit(parts, np.flatnonzero(split), group_of_row, p)
        if finding is not None:
            return Report(groups, 0, 0, f"the audit keeps the groups whole: {finding}")
        history.record(digest, parts, p)
    moved = _moved(g, cluster, split, groups.n_groups, k)
    table, report_of_row = _table(site, groups, rows, g, split, part, clusters)
    return Report(table, int(split.sum()), moved, "", report_of_row)


def _part_spreads(groups: SiteGroups, split: np.ndarray, cells: np.ndarray,
                  sums: np.ndarray) -> np.ndarray:
    """The parts' m2 (module docstring, 4): per feature, the split groups' released
    spreads plus what the re-cut changes in the squared deviations, sum_S n_S mean_S^2 -
    sum_P n_P mean_P^2 over the split groups S and the parts P (the same rows: the exact
    total of the report's groups' squared deviations, as the table's is), shared by the
    parts' degrees of freedom. Every term is a released figure (the split groups' spreads,
    counts and sums; the parts' counts and sums): the parts release no second moment."""
    present_s = (np.broadcast_to(groups.counts[:, None], groups.sums.shape) if groups.present is None
                 else groups.present)[split].astype(np.float64)
    sums_s = np.asarray(groups.sums[split], dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        before = np.where(present_s > 0, sums_s ** 2 / present_s, 0.0).sum(axis=0)
        after = np.where(cells > 0, sums ** 2 / cells, 0.0).sum(axis=0)
    total = np.maximum(np.asarray(groups.m2[split]).sum(axis=0) + before - after, 0.0)
    dof = np.maximum(cells - 1.0, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(dof.sum(axis=0) > 0, total * dof / dof.sum(axis=0), 0.0)


#: The most clusters whose every cut :func:`_short_cuts` tries (2^k - 2 cuts); beyond,
#: the audit alone judges.
MAX_CUT_CLUSTERS = 12


def _short_cuts(g: np.ndarray, cluster: np.ndarray, observed: np.ndarray, split: np.ndarray,
                k: int, p: int) -> np.ndarray:
    """(G,) bool: the split groups to keep whole so that no cut of the clusters isolates
    fewer than p rows or cells. For clusters T, the parts in T less the split groups'
    sums give each split group's rows on one side of T's boundary: summed over the groups
    the smaller side (``observed``: per row, 1 and each feature's present cell), that
    combination's support. A cut under p (not 0) keeps its groups whole; the audit judges
    the rest. A pre-filter that spares the audit's refusal: the audit decides."""
    out = np.zeros(split.size, dtype=bool)
    if k > MAX_CUT_CLUSTERS or not split.any():
        return out
    mine = split[g]
    G = split.size
    per_cluster = np.zeros((G, k, observed.shape[1]))
    np.add.at(per_cluster, (g[mine], cluster[mine]), observed[mine])
    total = per_cluster.sum(axis=1)
    for mask in range(1, (1 << k) - 1):
        inside = np.array([(mask >> c) & 1 for c in range(k)], dtype=bool)
        side = per_cluster[:, inside].sum(axis=1)
        smaller = np.minimum(side, total - side)  # (G, 1 + d)
        support = smaller.sum(axis=0)
        short = (support > 0) & (support < p)
        if short.any():
            out |= (smaller[:, short] > 0).any(axis=1)
    return out


def _moved(g: np.ndarray, cluster: np.ndarray, split: np.ndarray, n_groups: int, k: int) -> int:
    """Rows of the split groups outside their group's majority cluster (what the report
    now counts where the model does)."""
    counts = np.zeros((n_groups, k), dtype=np.int64)
    np.add.at(counts, (g, cluster), 1)
    return int((counts.sum(axis=1) - counts.max(axis=1))[split].sum())


def _table(site: SiteData, groups: SiteGroups, rows: np.ndarray, g: np.ndarray,
           split: np.ndarray, part: np.ndarray, clusters: list[int]):
    """The kept groups (as they are) then one group per part (its spread derived:
    :func:`_part_spreads`), as a SiteGroups, and each row's group in it."""
    keep = np.flatnonzero(~split)
    slot = np.full(int(part.max()) + 1, -1, dtype=np.int64)
    slot[clusters] = np.arange(len(clusters))
    part_of_row = np.full(site.n_rows, -1, dtype=np.int64)
    part_of_row[rows] = np.where(part >= 0, slot[np.maximum(part, 0)], -1)
    counts, sums, _, present = group_stats.group_statistics(site.X, part_of_row, len(clusters))
    width = site.n_features
    cells = np.repeat(counts[:, None], width, axis=1) if present is None else present
    shown_sums, _, shown, _ = withhold_lone_cells(sums, None, cells, groups.min_size)
    m2 = _part_spreads(groups, split, np.asarray(shown, dtype=np.float64), shown_sums)
    kept_present = None if groups.present is None else groups.present[keep] + (
        0 if groups.withheld is None else groups.withheld[keep])
    if present is None and kept_present is not None:
        present = cells
    if kept_present is None and present is not None:
        kept_present = np.repeat(groups.counts[keep][:, None], width, axis=1)
    report_of_row = np.full(site.n_rows, -1, dtype=np.int64)
    renumber = np.full(groups.n_groups, -1, dtype=np.int64)
    renumber[keep] = np.arange(keep.size)
    report_of_row[rows] = np.where(split[g], keep.size + part_of_row[rows], renumber[g])
    return made_groups(
        site, groups.min_size, np.concatenate([groups.counts[keep], counts]),
        np.concatenate([groups.sums[keep], sums]), np.concatenate([groups.m2[keep], m2]),
        None if present is None else np.concatenate([kept_present, present]).astype(np.int64),
        _labels_of_groups(site, report_of_row), groups.waiting, table_ref=None,
        rows_dropped=None if groups.table is None else groups.table.rows_dropped,
        held_back=(groups.held_back, groups.held_back_why)), report_of_row

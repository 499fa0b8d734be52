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

from fedcluster.client_app.data import group_stats, group_table
from fedcluster.client_app.data.group_table import judged_features, made_groups, _labels_of_groups
from fedcluster.client_app.data.report_history import ReportHistory, partition_digest
from fedcluster.client_app.data.site_data import SiteData
from fedcluster.client_app.release import dominance
from fedcluster.client_app.release.lone_cells import withhold_lone_cells
from fedcluster.client_app.site_groups import SiteGroups
from fedcluster.common import kernels, scaling

__all__ = ["Report", "ReportHistory", "as_answered", "report_groups", "rows_clusters"]


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
#: Rows per block of the report's passes over a site's rows (a few MB of temporaries).
BLOCK_ROWS = 1 << 15


def rows_clusters(site: SiteData, rows: np.ndarray, centroids: np.ndarray,
                  transform: str | None, box) -> np.ndarray:
    """The cluster of each of ``rows`` (file order) as ``predict`` assigns it: nearest
    centroid in the run's space (``transform``), clipped to ``box`` where given; a block
    of rows at a time."""
    decoded = None if transform is None else scaling.FeatureTransform.decode(transform)
    C = np.ascontiguousarray(centroids, dtype=np.float64)
    out = np.empty(rows.size, dtype=np.int64)
    for start in range(0, rows.size, BLOCK_ROWS):
        X = np.asarray(site.X[rows[start:start + BLOCK_ROWS]], dtype=np.float64)
        if decoded is not None:
            X = decoded.apply(X)
        if box is not None:
            X = np.clip(X, *box)
        out[start:start + BLOCK_ROWS] = kernels.assign(np.ascontiguousarray(X), C)[0]
    return out


def _site_moments(site: SiteData, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
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
                   moments) -> np.ndarray:
    """(k,) bool: the parts the p% rule on means flags (``release/dominance.py``: from
    p_site 3, in the judged features; ``moments``: the yardsticks, :func:`_site_moments`)."""
    flagged = np.zeros(k, dtype=bool)
    if p < dominance.MEANS_FROM_P or moments is None:
        return flagged
    site_mean, sd = moments
    judged = judged_features(site)
    for c in np.unique(part[part >= 0]).tolist():
        values = np.asarray(site.X[rows[part == c]], dtype=np.float64)
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
    # what a cut counts, of the straddlers' rows: each row, and each feature's cell
    straddling = np.flatnonzero(split[g])
    observed = np.concatenate([np.ones((straddling.size, 1)),
                               ~np.isnan(np.asarray(site.X[rows[straddling]]))], axis=1)
    moments = _site_moments(site, rows) if p >= dominance.MEANS_FROM_P else None
    for _ in range(groups.n_groups + 1):  # keep whole what a part or a cut would expose
        exposed = _exposed(site, rows, g, cluster, (straddling, observed), split, k, p, moments)
        if not exposed.any():
            break
        split &= ~exposed
    part = np.where(split[g], cluster, -1)
    if not split.any():
        return Report(groups, 0, 0, "" if (lo == hi).all() else
                      f"splitting its straddling groups would give sums of fewer than {p} "
                      "rows or cells (a part, or a part less its groups)")
    clusters = [c for c in range(k) if np.any(part == c)]
    members = [np.flatnonzero(part == c) for c in clusters]  # into ``rows``
    digest = partition_digest([rows[m] for m in members], p)
    done = history.answered()
    if done is not None and done != digest:
        return Report(groups, 0, 0, "the site answered a report over another partition of this "
                      "version of its data; one per version (its groups count whole)")
    if done is None:  # (the rows' instances only here: the same partition asked again is known)
        instances = history.instances(rows)
        parts = [instances[m] for m in members]
        finding = history.audit(parts, np.flatnonzero(split), group_of_row, p)
        if finding is not None:
            return Report(groups, 0, 0, f"the audit keeps the groups whole: {finding}")
        history.record(digest, parts, p)
    moved = _moved(g, cluster, split, groups.n_groups, k)
    table, report_of_row = _table(site, groups, rows, g, split, part, clusters)
    return Report(table, int(split.sum()), moved, "", report_of_row)


def as_answered(site: SiteData, min_size: int, cache_dir, centroids: np.ndarray,
                transform: str | None) -> tuple[SiteGroups, np.ndarray]:
    """The groups ``site`` answered the report at ``centroids`` from, and each row's group
    in them (-1: waiting): its table (kept in ``cache_dir``, else in memory) re-cut through
    its answered history, the partition it recorded or, for another, its groups whole.
    Where it recorded none, the same audit decides again (and records what it passes):
    for the tests and benchmarks that compare the report with the rows."""
    groups, _ = group_table.site_groups(site, min_size, cache_dir)
    group_of_row = group_table.row_groups(site, min_size, cache_dir)
    made = report_groups(site, groups, group_of_row, centroids, transform, None,
                         ReportHistory(site, groups))
    return made.groups, group_of_row if made.group_of_row is None else made.group_of_row


def _exposed(site: SiteData, rows: np.ndarray, g: np.ndarray, cluster: np.ndarray,
             observed: tuple, split: np.ndarray, k: int, p: int, moments) -> np.ndarray:
    """(G,) bool: the split groups to keep whole: those a cut under p rests on
    (:func:`_short_cuts`; ``observed``: the straddlers' rows and what a cut counts of
    them), and those feeding a part of fewer than p rows or one the p% rule on means
    flags (:func:`_flagged_parts`)."""
    at, counted = observed
    touching = _short_cuts(g[at], cluster[at], counted, split, k, p)
    part = np.where(split[g], cluster, -1)
    sizes = np.bincount(part[part >= 0], minlength=k)
    bad = ((sizes > 0) & (sizes < p)) | _flagged_parts(site, rows, part, k, p, moments)
    touching[g[(part >= 0) & bad[np.maximum(part, 0)]]] = True
    return touching & split


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
    the smaller side (``g``, ``cluster``: the straddlers' rows' groups and clusters;
    ``observed``: per such row, 1 and each feature's present cell), that combination's
    support. A cut under p (not 0) keeps its groups whole; the audit judges
    the rest. A pre-filter that spares the audit's refusal: the audit decides."""
    out = np.zeros(split.size, dtype=bool)
    if k > MAX_CUT_CLUSTERS or not split.any():
        return out
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
        if short.any():
            out[ids[(smaller[:, short] > 0).any(axis=1)]] = True
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

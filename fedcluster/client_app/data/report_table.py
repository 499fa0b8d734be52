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
4. gives every part the site's pooled spread per degree of freedom (a function of the
   released table, as a withheld spread is: ``release/spreads.py``), so a part releases
   first moments only; the lone-cell rule applies as to every table;
5. audits the parts with everything the site answered from (``release/span_audit.py``; a
   deployed site's whole history, the values' audit too: ``versions/audited.py``): if a
   combination isolates fewer than p rows, or one row's change, no group is split;
6. answers one such partition per version of its data (:class:`ReportHistory`): the
   coordinator chooses the centroids, so it chooses which side of its boundaries each
   straddler's rows count on; a second, different partition of the same rows would give
   counts on both sides of two boundaries it picked, which no linear audit judges. The
   same partition asked again (the evaluation, then the profile) is the same table.

What it costs: a part's spread is the site's pooled one, so SDs and the SSE count the
parts' rows at the typical spread (a few percent of the rows); a straddler kept whole
still counts in its group's cluster (the report says how many rows the sites moved).
"""

from __future__ import annotations

import hashlib
import json
import weakref
from dataclasses import dataclass

import numpy as np

from fedcluster.client_app.data import group_stats
from fedcluster.client_app.data.group_table import judged_features, made_groups, _labels_of_groups
from fedcluster.client_app.data.site_data import SiteData
from fedcluster.client_app.release import dominance, span_audit
from fedcluster.client_app.site_groups import SiteGroups
from fedcluster.common import kernels, scaling

__all__ = ["Report", "ReportHistory", "report_groups"]


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


# ------------------------------------------------------------------ one partition per version
class ReportHistory:
    """Which partition of a version's rows the site has answered a report from.

    In memory (data held by this process): per array object. A deployed site: in its
    answered history's store (``versions/lineage.py``), whose audits then count the parts
    as answered groups (``Store.add_report``)."""

    _MEMORY: dict[int, tuple[weakref.ref, str]] = {}

    def __init__(self, site: SiteData, groups: SiteGroups) -> None:
        self.site, self.groups = site, groups
        self.store = None
        ref = groups.table_ref
        if ref is not None:
            from fedcluster.client_app.data.versions.lineage import Store
            from pathlib import Path
            self.store = Store.open(Path(ref.store))
            self.number = int(ref.number)

    def answered(self) -> str | None:
        """The digest of the partition answered for this version (None: none yet)."""
        if self.store is not None:
            return self.store.meta.get("reports", {}).get(str(self.number))
        hit = self._MEMORY.get(id(self.site.X))
        return hit[1] if hit is not None and hit[0]() is self.site.X else None

    def instances(self, rows: np.ndarray) -> np.ndarray:
        """The audit's unknowns of ``rows``: the store's instances, else the rows."""
        if self.store is None:
            return rows
        from fedcluster.client_app.data import group_table
        from fedcluster.client_app.data.versions import row_keys
        keys = row_keys.instance_keys(group_table.row_hashes(self.site), self.site.row_ids)
        return self.store.match(keys, self.site.row_ids)[0][rows]

    def audit(self, parts: list[np.ndarray], straddlers: list[np.ndarray], p: int) -> str | None:
        """Why the parts (instances) may not be answered, with all the site answered
        from (None: they may)."""
        if self.store is not None:
            from fedcluster.client_app.data.versions import audited
            store = self.store
            present = None
            if store.present is not None:
                width = self.site.n_features
                present = lambda instances: store.present_cells(instances, width)  # noqa: E731
            failing = audited._failures(store, parts, np.full(len(parts), -1, dtype=np.int64),
                                        p, present)
            return failing[0][1] if failing else None
        groups = straddlers + parts
        sizes = np.array([g.size for g in groups], dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        members = np.concatenate(groups).astype(np.int64)
        X = self.site.X
        present = None
        if np.isnan(X[members]).any():
            present = lambda rows: ~np.isnan(X[rows])  # noqa: E731

            def reports(ids):
                return np.array([present(members[offsets[g]:offsets[g + 1]]).sum(axis=0) >= p
                                 for g in np.asarray(ids).tolist()])
        findings = span_audit.audit(offsets, members, X.shape[0],
                                    np.arange(len(straddlers), len(groups)),
                                    np.full(len(groups), p), p, lambda u, w: False, present,
                                    reports if present is not None else None)
        return findings[0].reason if findings else None

    def record(self, digest: str, parts: list[np.ndarray], p: int) -> None:
        """This version's partition is ``digest`` (its parts, as instances)."""
        if self.store is None:
            self._MEMORY[id(self.site.X)] = (weakref.ref(self.site.X), digest)
            return
        self.store.add_report(self.number, digest, parts, p)


def _digest(parts: list[np.ndarray], p: int) -> str:
    text = json.dumps([p, [np.sort(part).tolist() for part in parts]])
    return hashlib.sha256(text.encode()).hexdigest()


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
        Where the site keeps the partition it answered (default: made for ``site``).
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
    history = history or ReportHistory(site, groups)
    clusters = [c for c in range(k) if np.any(part == c)]
    local_parts = [np.flatnonzero(part == c) for c in clusters]
    instances = history.instances(rows)
    parts = [instances[members] for members in local_parts]
    digest = _digest(parts, p)
    done = history.answered()
    if done is not None and done != digest:
        return Report(groups, 0, 0, "the site answered a report over another partition of this "
                      "version of its data; one per version (its groups count whole)")
    if done is None:
        straddlers = [instances[np.flatnonzero(g == j)] for j in np.flatnonzero(split).tolist()]
        if (finding := history.audit(parts, straddlers, p)) is not None:
            return Report(groups, 0, 0, f"the audit keeps the groups whole: {finding}")
        history.record(digest, parts, p)
    moved = _moved(g, cluster, split, groups.n_groups, k)
    table, report_of_row = _table(site, groups, rows, g, split, part, clusters)
    return Report(table, int(split.sum()), moved, "", report_of_row)


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
    """The kept groups (as they are) then one group per part, as a SiteGroups, and each
    row's group in it."""
    keep = np.flatnonzero(~split)
    slot = np.full(int(part.max()) + 1, -1, dtype=np.int64)
    slot[clusters] = np.arange(len(clusters))
    part_of_row = np.full(site.n_rows, -1, dtype=np.int64)
    part_of_row[rows] = np.where(part >= 0, slot[np.maximum(part, 0)], -1)
    counts, sums, _, present = group_stats.group_statistics(site.X, part_of_row, len(clusters))
    width = site.n_features
    kept_present = None if groups.present is None else groups.present[keep] + (
        0 if groups.withheld is None else groups.withheld[keep])
    if present is None and kept_present is not None:
        present = np.repeat(counts[:, None], width, axis=1)
    if kept_present is None and present is not None:
        kept_present = np.repeat(groups.counts[keep][:, None], width, axis=1)
    # the parts' spread: the site's pooled one per degree of freedom (released already)
    cells = (np.broadcast_to(groups.counts[:, None], groups.sums.shape) if groups.present is None
             else groups.present)
    dof = np.maximum(cells - 1, 0).sum(axis=0)
    typical = np.where(dof > 0, groups.m2.sum(axis=0) / np.maximum(dof, 1), 0.0)
    part_cells = np.repeat(counts[:, None], width, axis=1) if present is None else present
    m2 = np.concatenate([groups.m2[keep], typical[None, :] * np.maximum(part_cells - 1, 0)])
    report_of_row = np.full(site.n_rows, -1, dtype=np.int64)
    renumber = np.full(groups.n_groups, -1, dtype=np.int64)
    renumber[keep] = np.arange(keep.size)
    report_of_row[rows] = np.where(split[g], keep.size + part_of_row[rows], renumber[g])
    return made_groups(
        site, groups.min_size, np.concatenate([groups.counts[keep], counts]),
        np.concatenate([groups.sums[keep], sums]), m2,
        None if present is None else np.concatenate([kept_present, present]).astype(np.int64),
        _labels_of_groups(site, report_of_row), groups.waiting, table_ref=None,
        rows_dropped=None if groups.table is None else groups.table.rows_dropped,
        held_back=(groups.held_back, groups.held_back_why)), report_of_row

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
3. keeps a straddler whole where a part it feeds would hold fewer than p_site rows, where
   a cut of the clusters (a part, or parts less the groups they came from: the
   straddlers' rows on one side of the coordinator's boundaries) would isolate fewer than
   p_site rows, or where the p% rule on means (``release/dominance.py``, from p_site 3)
   flags a part in a feature it releases: its rows then count in their group's cluster,
   as before. Where such a cut would isolate fewer than p_site present cells of a
   numeric feature but not of rows (a feature missing in some of the rows across it),
   the parts CARRY that feature: each part's cells of it stand at one STOOD-IN mean, the
   mean of the groups a task assigns to its cluster whole (their released sums over
   their released cells, as the coordinator can compute it), all shifted by one amount
   so that the parts' sums add up to the split groups' own. Made of released sums and
   the parts' cell counts, a carried sum says nothing those do not (not even how many of
   one straddler's cells lie in a part, which its own mean would); the site's total of
   the feature stays exact, its rows count where the model puts them, and only the
   feature's split between the clusters is blurred, as with the groups whole. A level's
   indicator is a count, not carried (a stood-in mean is no count), nor a feature a
   straddler withholds cells of; a part's mean that a carried feature moves nearer
   another centroid leaves the groups whole;
4. gives the parts a spread derived from released figures alone: the split groups'
   released spreads plus what re-cutting their rows changes in the squared deviations
   (from the split groups' and the parts' counts and sums), shared by the parts' degrees
   of freedom. The report's squared deviations then add up exactly as the table's did
   (the SSE is the rows' own where every straddler is split and nothing is carried), and
   a part releases no second moment of its own. The lone-cell rule applies as to every
   table, but to a carried feature (its few cells carry no value of theirs);
5. where a straddler's released sum of a feature is a stand-in (the p% rule's, or a
   protected cell's: its sum no sum of its rows, which a part would give back), the
   parts carry that feature (a level's indicator, or a feature a straddler withholds
   cells of, cannot be carried: the straddler stays whole);
6. hands the parts to the release step (``release/gate.admit_report``), which judges
   them with the site's whole record, every table and every report partition of the
   data's lineage, and records them, under the record's lock, before any value of them
   leaves; where the judgement refuses, the straddlers its finding rests on are kept
   whole (``keep_whole``) and the table is made again. The same partition asked again
   (the evaluation, then the profile) is the same table; another one is judged with it.

What it costs: rows of a straddler kept whole still count in their group's cluster (the
site's log says how many rows the split moved, how many features it carried, and why it
kept groups whole); a part's spread per cluster is a share of the parts' total (Table 1's
SDs per cluster blur a little across the parts; the total is exact); a carried feature's
mean per cluster holds the parts' cells at the stood-in mean; and a deployed site's later
versions are audited with the parts too, so a version that regroups rows a part holds
may have to hold some of them back (``bench/clinical_report.py`` measures the rows moved
and lost).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from fedcluster.client_app.data import group_stats, group_table, report_cuts
from fedcluster.client_app.data.group_table import labels_of_groups, made_groups
from fedcluster.client_app.data.report_cuts import BLOCK_ROWS
from fedcluster.client_app.data.site_data import SiteData
from fedcluster.client_app.data.versions import row_keys
from fedcluster.client_app.release import dominance
from fedcluster.client_app.release.lone_cells import withhold_lone_cells
from fedcluster.client_app.site_groups import SiteGroups
from fedcluster.common import kernels, scaling

__all__ = ["Report", "answered", "as_answered", "earlier_parts", "report_groups", "row_instances",
           "rows_clusters"]


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
    carried : int
        The features the parts carry at a stood-in mean (made of released sums), not at
        their rows' own (a cut of the clusters would isolate fewer than p of their cells).
    parts : list of int arrays
        Each part's rows (file order): what the release step judges and records.
    carried_features : (d,) bool or None
        Which features they carry.
    straddlers : (G,) bool or None
        The groups the parts re-cut.
    """

    groups: SiteGroups
    split: int
    moved: int
    why: str
    group_of_row: np.ndarray | None = None
    carried: int = 0
    parts: tuple = ()
    carried_features: np.ndarray | None = None
    straddlers: np.ndarray | None = None


# ------------------------------------------------------------------ the rows' clusters


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


# ------------------------------------------------------------------ the report's table
def report_groups(site: SiteData, groups: SiteGroups, group_of_row: np.ndarray,
                  centroids: np.ndarray, transform: str | None, box,
                  keep_whole: np.ndarray | None = None, earlier: np.ndarray | None = None,
                  snapped: np.ndarray | None = None) -> Report:
    """The report's table (module docstring) of ``groups`` (as made, in the encoded
    units; ``group_of_row`` each row's group, -1 waiting) at the final ``centroids``: a
    candidate for the release step, which judges and records its parts.

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
    keep_whole : (G,) bool, optional
        Groups the release step's judgement keeps whole (module docstring, 6).
    earlier : (n,) int, optional
        Each row's part in the partitions the site answered before (-1: none).
    snapped : (n,) bool, optional
        Rows that go with their earlier part, to the cluster that holds most of its rows
        now (module docstring, 6: the release step's judgement).
    """
    p, k = groups.min_size, int(centroids.shape[0])
    whole = Report(groups, 0, 0, "")
    if p <= 1 or groups.n_groups == 0:
        return whole  # rows answer for themselves: every group is one row
    rows = np.flatnonzero(group_of_row >= 0)
    cluster = _stable(rows_clusters(site, rows, centroids, transform, box),
                      None if earlier is None else earlier[rows],
                      None if snapped is None else snapped[rows], k)
    g = group_of_row[rows]
    lo = np.full(groups.n_groups, k, dtype=np.int64)
    hi = np.full(groups.n_groups, -1, dtype=np.int64)
    np.minimum.at(lo, g, cluster)
    np.maximum.at(hi, g, cluster)
    straddles = lo != hi
    # a straddler whose released sum of a feature stood in splits only where the parts
    # carry that feature (at a stood-in mean: no part then sums its rows' own values)
    stood = _stood_in(site, groups, rows, g, straddles)
    split = straddles & ~(stood & ~report_cuts.carriable(site, groups, straddles)).any(axis=1)
    if keep_whole is not None:
        split &= ~keep_whole
    # what a cut counts, of the straddlers' rows: each row, and each feature's cell
    straddling = np.flatnonzero(split[g])
    observed = np.concatenate([np.ones((straddling.size, 1)),
                               ~np.isnan(np.asarray(site.X[rows[straddling]]))], axis=1)
    fixed = np.concatenate([[True], ~report_cuts.carriable(site, groups, split)])
    moments = report_cuts.site_moments(site, rows) if p >= dominance.MEANS_FROM_P else None
    carried = np.zeros(site.n_features, dtype=bool)
    for _ in range(groups.n_groups + 1):  # keep whole what a part or a cut would expose
        exposed, carried = report_cuts.exposed(site, rows, g, cluster,
                                               (straddling, observed, fixed), split, k, p, moments)
        carried |= stood[split].any(axis=0)
        if not exposed.any():
            break
        split &= ~exposed
    part = np.where(split[g], cluster, -1)
    if not split.any():
        return Report(groups, 0, 0, "" if not straddles.any() else
                      f"splitting its straddling groups would give sums of fewer than {p} "
                      "rows (a part, or a part less its groups), or a sum the p% rule withheld")
    clusters = [c for c in range(k) if np.any(part == c)]
    members = [np.flatnonzero(part == c) for c in clusters]  # into ``rows``
    table, report_of_row = _table(site, groups, rows, g, split, part, clusters, carried,
                                  _assigned(groups, centroids, transform, box)
                                  if carried.any() else None)
    placed = _assigned(table, centroids, transform, box)[table.n_groups - len(clusters):]
    if (placed != clusters).any():  # (a carried feature can move a part's mean)
        return Report(groups, 0, 0, "a part's mean, its carried features at its cluster's "
                      "groups' mean, lies nearer another centroid (its groups count whole)")
    moved = _moved(g, cluster, split, groups.n_groups, k)
    return Report(table, int(split.sum()), moved, "", report_of_row, int(carried.sum()),
                  tuple(rows[m] for m in members), carried, split)


def _stable(cluster: np.ndarray, earlier: np.ndarray | None, snapped: np.ndarray | None,
            k: int) -> np.ndarray:
    """Each row's cluster for the report: the model's, but a ``snapped`` row goes with its
    earlier part (``earlier``), to the cluster that holds most of that part's rows now (a
    part of an earlier partition that this one would cut by a row gives the row away)."""
    if earlier is None or snapped is None or not (snapped & (earlier >= 0)).any():
        return cluster
    out = cluster.copy()
    labels, slot = np.unique(earlier[earlier >= 0], return_inverse=True)
    votes = np.zeros((labels.size, k), dtype=np.int64)
    np.add.at(votes, (slot, cluster[earlier >= 0]), 1)
    at = np.flatnonzero(earlier >= 0)
    moved = snapped[at]
    out[at[moved]] = votes.argmax(axis=1)[slot][moved]
    return out


def _stood_in(site: SiteData, groups: SiteGroups, rows: np.ndarray, g: np.ndarray,
              straddles: np.ndarray) -> np.ndarray:
    """(G, d) bool: per straddler, the features whose released sum is no sum of its rows'
    cells (a stand-in: the p% rule's, a protected cell's), found by summing its rows
    again: a part that summed them would give the withheld sum back (``release/audit``,
    1)."""
    out = np.zeros((groups.n_groups, site.n_features), dtype=bool)
    at = np.flatnonzero(straddles[g])
    if at.size == 0:
        return out
    ids, local = np.unique(g[at], return_inverse=True)
    values = np.asarray(site.X[rows[at]], dtype=np.float64)
    sums = np.zeros((ids.size, site.n_features))
    np.add.at(sums, local, np.where(np.isnan(values), 0.0, values))
    released = np.asarray(groups.sums[ids], dtype=np.float64)
    judged = np.ones_like(sums, dtype=bool) if groups.withheld is None \
        else np.asarray(groups.withheld[ids]) == 0  # (a lone cell withheld: no sum of it)
    differs = np.abs(sums - released) > 1e-9 * np.maximum(1.0, np.maximum(np.abs(sums), np.abs(released)))
    out[ids] = differs & judged
    return out


def row_instances(site: SiteData, store) -> np.ndarray:
    """(n,) the record's instance of each row (``store``: the record the table's groups
    are in, held under its lock): a deployed site's rows by their keys; data held in
    memory by their places."""
    if store.directory is None:
        return np.arange(site.n_rows, dtype=np.int64)
    keys = row_keys.instance_keys(group_table.row_hashes(site), site.row_ids)
    return store.match(keys, site.row_ids)[0]


def earlier_parts(store, instance: np.ndarray, before: int | None = None) -> np.ndarray | None:
    """(n,) each row's part in the report partitions the record holds (the latest a row
    is in; -1: none; ``instance``: each row's instance; ``before``: only the parts
    numbered below it), None: none holds a row."""
    parts = np.flatnonzero(store.report_group_mask())
    if before is not None:
        parts = parts[parts < before]
    if parts.size == 0:
        return None
    offsets, members = store.members_csr(parts)
    owner = np.repeat(parts, np.diff(offsets))
    part_of = np.full(store.n_instances, -1, dtype=np.int64)
    part_of[members] = owner  # (later parts after earlier ones: the latest wins)
    out = part_of[np.minimum(instance, part_of.size - 1)]
    return out if (out >= 0).any() else None


def answered(site: SiteData, groups: SiteGroups, group_of_row: np.ndarray,
             centroids: np.ndarray, transform: str | None, box, store,
             instance: np.ndarray) -> tuple[Report, str] | None:
    """The partition the record holds of ``groups``' table at ``centroids``, made again as
    the release step made it (the groups it kept whole, the rows it moved with an earlier
    part), and its digest; None where none is this one (``store`` held under its lock)."""
    from fedcluster.client_app.release import gate

    for known in store.reports_of(groups.table_ref.number):
        whole = np.asarray(known.get("whole", []), dtype=np.int64)
        if known.get("min-size", groups.min_size) != groups.min_size or (
                whole.size and whole.max() >= groups.n_groups):
            continue  # a partition of the table's groups at another floor (merged others)
        keep = np.zeros(groups.n_groups, dtype=bool)
        keep[whole] = True
        snapped = np.zeros(site.n_rows, dtype=bool)
        snapped[np.asarray(known.get("snapped", []), dtype=np.int64)] = True
        earlier = earlier_parts(store, instance, known.get("parts", [None])[0])
        made = report_groups(site, groups, group_of_row, centroids, transform, box, keep,
                             earlier, snapped)
        if made.split and gate.partition_digest([instance[part] for part in made.parts],
                                                groups.min_size) == known["digest"]:
            return made, known["digest"]
    return None


def as_answered(site: SiteData, min_size: int, cache_dir, centroids: np.ndarray,
                transform: str | None) -> tuple[SiteGroups, np.ndarray]:
    """The groups ``site`` answered the report at ``centroids`` from, and each row's group
    in them (-1: waiting): its table (kept in ``cache_dir``, else in memory) re-cut as a
    partition its record holds (:func:`answered`), else its groups whole. For the tests
    and benchmarks that compare the report with the rows; it records nothing."""
    from fedcluster.client_app.release import record

    groups, _ = group_table.site_groups(site, min_size, cache_dir)
    group_of_row = group_table.row_groups(site, min_size, cache_dir)
    with record.Record.of(groups.table_ref).held() as store:
        found = answered(site, groups, group_of_row, centroids, transform, None, store,
                         row_instances(site, store))
    return (groups, group_of_row) if found is None else (found[0].groups, found[0].group_of_row)


def _released_cells(groups: SiteGroups) -> np.ndarray:
    """(G, d) float: each group's present cells of each feature as it released them (its
    rows, where no cell is missing)."""
    return np.asarray(np.broadcast_to(groups.counts[:, None], groups.sums.shape)
                      if groups.present is None else groups.present, dtype=np.float64)


def _part_spreads(groups: SiteGroups, split: np.ndarray, cells: np.ndarray,
                  sums: np.ndarray) -> np.ndarray:
    """The parts' m2 (module docstring, 4): per feature, the split groups' released
    spreads plus what the re-cut changes in the squared deviations, sum_S n_S mean_S^2 -
    sum_P n_P mean_P^2 over the split groups S and the parts P (the same rows: the exact
    total of the report's groups' squared deviations, as the table's is), shared by the
    parts' degrees of freedom. Every term is a released figure (the split groups' spreads,
    counts and sums; the parts' counts and sums): the parts release no second moment."""
    present_s = _released_cells(groups)[split]
    sums_s = np.asarray(groups.sums[split], dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        before = np.where(present_s > 0, sums_s ** 2 / present_s, 0.0).sum(axis=0)
        after = np.where(cells > 0, sums ** 2 / cells, 0.0).sum(axis=0)
    total = np.maximum(np.asarray(groups.m2[split]).sum(axis=0) + before - after, 0.0)
    dof = np.maximum(cells - 1.0, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(dof.sum(axis=0) > 0, total * dof / dof.sum(axis=0), 0.0)


def _carried_sums(groups: SiteGroups, split: np.ndarray, home: np.ndarray,
                  clusters: list[int], cells: np.ndarray) -> np.ndarray:
    """(parts, d): per part and feature, its ``cells`` at a stood-in mean: the mean of the
    groups training assigns to its cluster whole (``home``: each group's cluster by its
    mean, as the coordinator can compute it; released sums over released cells; every
    group's where none of them holds a cell), all shifted by one amount so that the parts'
    sums add up to the split groups' (the site's total stays exact). Made of released sums
    and counts only, the parts' sums say nothing those do not: not even how many of one
    straddler's cells lie in a part (its own mean would)."""
    released = _released_cells(groups)
    sums = np.asarray(groups.sums, dtype=np.float64)
    overall = sums.sum(axis=0) / np.maximum(released.sum(axis=0), 1.0)
    at = np.empty(cells.shape)
    for slot, c in enumerate(clusters):
        total = released[home == c].sum(axis=0)
        at[slot] = np.where(total > 0, sums[home == c].sum(axis=0) / np.maximum(total, 1.0), overall)
    shift = (sums[split].sum(axis=0) - (cells * at).sum(axis=0)) / np.maximum(cells.sum(axis=0), 1)
    return cells * (at + shift[None, :])


def _assigned(groups: SiteGroups, centroids: np.ndarray, transform: str | None, box) -> np.ndarray:
    """(G,) each group's cluster as a task assigns it whole: its mean, in the run's space
    (``transform``; clipped to ``box`` where given), to the nearest centroid."""
    if transform is not None:
        groups = groups.in_run_space(scaling.FeatureTransform.decode(transform))
    if box is not None:
        groups = groups.clipped(*box)
    means = np.asarray(groups.means, dtype=np.float64)
    out = np.full(groups.n_groups, -1, dtype=np.int64)  # (-1: a mean the run leaves missing)
    known = np.isfinite(means).all(axis=1)
    if known.any():
        out[known] = kernels.assign(np.ascontiguousarray(means[known]),
                                    np.ascontiguousarray(centroids, dtype=np.float64))[0]
    return out


def _moved(g: np.ndarray, cluster: np.ndarray, split: np.ndarray, n_groups: int, k: int) -> int:
    """Rows of the split groups outside their group's majority cluster (what the report
    now counts where the model does)."""
    counts = np.zeros((n_groups, k), dtype=np.int64)
    np.add.at(counts, (g, cluster), 1)
    return int((counts.sum(axis=1) - counts.max(axis=1))[split].sum())


def _table(site: SiteData, groups: SiteGroups, rows: np.ndarray, g: np.ndarray,
           split: np.ndarray, part: np.ndarray, clusters: list[int], carried: np.ndarray,
           home: np.ndarray):
    """The kept groups (as they are) then one group per part (its spread derived:
    :func:`_part_spreads`; its ``carried`` features' sums: its cells at the stood-in
    means: :func:`_carried_sums`), as a SiteGroups, and each row's group in it."""
    keep = np.flatnonzero(~split)
    slot = np.full(int(part.max()) + 1, -1, dtype=np.int64)
    slot[clusters] = np.arange(len(clusters))
    part_of_row = np.full(site.n_rows, -1, dtype=np.int64)
    part_of_row[rows] = np.where(part >= 0, slot[np.maximum(part, 0)], -1)
    counts, sums, _, present = group_stats.group_statistics(site.X, part_of_row, len(clusters))
    width = site.n_features
    cells = np.repeat(counts[:, None], width, axis=1) if present is None else present
    if carried.any():
        sums[:, carried] = _carried_sums(groups, split, home, clusters, cells)[:, carried]
    shown_sums, _, shown, _ = withhold_lone_cells(sums, None, cells, groups.min_size)
    shown_sums[:, carried], shown[:, carried] = sums[:, carried], cells[:, carried]
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
    table = made_groups(
        site, groups.min_size, np.concatenate([groups.counts[keep], counts]),
        np.concatenate([groups.sums[keep], sums]), np.concatenate([groups.m2[keep], m2]),
        None if present is None else np.concatenate([kept_present, present]).astype(np.int64),
        labels_of_groups(site, report_of_row), groups.waiting, table_ref=None,
        rows_dropped=None if groups.table is None else groups.table.rows_dropped,
        held_back=(groups.held_back, groups.held_back_why))
    if carried.any() and table.withheld is not None and table.withheld[keep.size:].any():
        # a carried feature's few cells in a part stand at a stood-in mean, no value of theirs:
        # the lone-cell rule (which made_groups applies) has nothing to withhold there
        at = (slice(keep.size, None), carried)
        restored = {name: np.array(getattr(table, name)) for name in ("sums", "m2", "present", "withheld")}
        restored["sums"][at], restored["m2"][at] = sums[:, carried], m2[:, carried]
        restored["present"][at] = cells[:, carried]
        restored["withheld"][at] = 0
        table = replace(table, **restored)
    return table, report_of_row

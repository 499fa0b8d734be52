"""A new version of a deployed site's data made into a group table and kept
(``group_table.py`` finds or asks for it; ``versions/`` decides who is grouped with whom).

The last answered table's groups whose rows are all still there stay, their statistics
copied bit for bit from the entry they were kept in; a group that lost or changed a row
is withdrawn whole; the waiting rows are grouped among themselves and the withdrawn
groups' rows join them; the one audit (``release/audit``) holds back what would let all
the tables ever answered from isolate fewer than p_site rows, or give a value back. A
new group that holds a cell the p% rule withheld before stands in there (FORCED). The
table, its groups, spread units and stand-ins go into the site's record
(``release/record``), under the record's lock, before any value of it leaves.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np

from fedcluster.client_app.data import group_entries, group_spreads, group_stats, grouped_rows, versions
from fedcluster.client_app.data.grouped_rows import judged_features, labels_of_groups, row_hashes
from fedcluster.client_app.data.grouping import grouping_scale
from fedcluster.client_app.data.site_data import SiteData
from fedcluster.client_app.data.versions import joining, row_keys
from fedcluster.client_app.mapped_pages import release_pages
from fedcluster.client_app.release import record
from fedcluster.client_app.release.spreads import spread_partners

__all__ = ["new_version", "record_stand_ins"]

logger = logging.getLogger(__name__)


def record_stand_ins(store, spreads, numbers: np.ndarray) -> None:
    """The table's stand-ins in the record (``numbers``: the store's number of each
    canonical position): FLAGGED by the p% rule, FORCED by a protected cell."""
    if spreads is None:
        return
    positions, features, forced = spreads.stand_ins()
    for kind, pick in ((record.FLAGGED, ~forced), (record.FORCED, forced)):
        store.add_stand_ins(numbers[positions[pick]], features[pick], kind)


def new_version(site: SiteData, min_size: int, directory: Path, store, key: str) -> None:
    """Make and keep the group table of a new version of the site's data
    (``versions.next_version``), and record it in the store."""
    content = row_hashes(site)
    keys = row_keys.instance_keys(content, site.row_ids)
    has_missing = site.table is not None and site.table.has_missing
    if not store.tables and (earlier := _earlier_release(directory, site, min_size)) is not None:
        (meta, parts), entry = earlier
        versions.import_release_table(store, site.X, keys, content, site.row_ids,
                                      np.asarray(parts["row-hashes"]), np.asarray(parts["row-groups"]),
                                      int(meta["min-size"]), entry, has_missing)
    plan, _ = versions.plan_for(store, site.X, keys, site.row_ids, min_size,
                                lambda rows, size=min_size: grouped_rows.grouped(site, size, rows, directory),
                                lambda rows, unit, lost, fresh, labels, lost_units: _join_units(
                                    site, rows, unit, lost, fresh, labels, min_size, lost_units),
                                has_missing, versions.lineage_name(key),
                                lambda groups: pair_rows(site.X, groups),
                                lambda record: group_entries.read_arrays(
                                    directory / record["entry"]) is not None,
                                lambda groups: grouped_rows.mended(site, groups, min_size, directory))
    table, group_of_row, order = _version_table(site, plan, directory, min_size, store)
    lineage = plan.lineage
    number = len(store.tables)
    dropped = versions.dropped_groups(site.dropped_keys, None if plan.base is None else
                                      store.table_dropped(plan.base["n"]), min_size)
    rows_dropped = int(dropped.shape[0])
    spread_rule = None if table.spreads is None else table.spreads.summary()
    group_entries.write_entry(directory / key, table, min_size, group_of_row, content,
                              {"table": number, "lineage": lineage, "rows-dropped": rows_dropped,
                               "spreads": spread_rule, "held-back": plan.record["held-back"],
                               "held-back-why": plan.findings[0] if plan.record["held-back"] else ""})
    new = store.add_groups(plan.new_members.take(order), min_size)
    if table.spreads is not None:  # each new group's spread unit, named by one of its groups
        heads = table.spreads.unit_heads()
        store.set_units(new, np.where(heads >= 0, new[np.maximum(heads, 0)], -1))
    record_stand_ins(store, table.spreads, new)
    store.add_table(np.concatenate([plan.kept, new]), {"entry": key, "lineage": lineage, "p": min_size,
                                                       "file": str(site.source),
                                                  **plan.record, "rows-dropped": rows_dropped,
                                                  "findings": plan.findings[:8]}, dropped)
    store.save()
    record = plan.record
    if plan.base is not None:
        logger.info("%s: a new version of the data: %d groups kept, %d withdrawn, %d new; %d "
                    "rows waiting", site.source, record["kept-groups"], record["withdrawn-groups"],
                    record["new-groups"], record["waiting"])
    if record["reused-groups"]:
        logger.info("%s: %d group(s) of earlier tables reused whole (%d rows)", site.source,
                    record["reused-groups"], record["reused-rows"])
    if record["held-back"]:
        logger.warning("%s: the versions audit held back %d row(s) (%s); they wait for a later "
                       "version", site.source, record["held-back"], plan.findings[0])


def _join_units(site: SiteData, rows: np.ndarray, unit: np.ndarray, lost: np.ndarray,
                fresh: np.ndarray, labels: np.ndarray, min_size: int, lost_units: int) -> np.ndarray:
    """``versions.joining.join_units`` on the rows as the grouping measures them (a
    missing cell at its feature's site mean; ``grouping_scale``)."""
    together = np.concatenate([rows, fresh])
    order = np.argsort(together, kind="stable")
    with grouped_rows.grouping_rows(site, together[order]) as X:
        scale = grouping_scale(X)
        Z = np.empty((together.size, X.shape[1]))
        Z[order] = np.asarray(X) * (1.0 if scale is None else scale)
    return joining.join_units(Z[:rows.size], unit, lost, Z[rows.size:], labels, min_size,
                              lost_units)


def _earlier_release(directory: Path, site: SiteData, min_size: int):
    """The latest table an earlier release kept for this file (((meta, arrays), its
    entry key) or None)."""
    pointer = group_entries.lineage_path(directory, site, min_size)
    try:
        entry = json.loads(pointer.read_text())["entry"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    read = group_entries.read_arrays(directory / entry)
    return None if read is None else (read, entry)


def _forced(store, members, width: int) -> tuple[np.ndarray, np.ndarray] | None:
    """(groups, features) of the new groups (``members``: a GroupMembers of instances)
    that hold a cell the p% rule withheld before: they stand in there (FORCED), as the
    audit judged them (``release/audit.protected_features``)."""
    guarded = store.protected(width)
    if not guarded.any() or len(members) == 0:
        return None
    hits = guarded[members.members]
    owner = np.repeat(np.arange(len(members)), members.sizes)
    held = np.zeros((len(members), width), dtype=bool)
    np.logical_or.at(held, owner, hits)
    return np.nonzero(held)


def _version_table(site: SiteData, plan, directory: Path, min_size: int, store):
    """The version's table (the kept groups first, their statistics copied bit for bit
    from the base table's entry, then the new groups in canonical order), each row's
    group in it, and the new groups' canonical order."""
    group_of_row, n_kept = plan.group_of_row, int(plan.kept.size)
    new_of_row = np.where(group_of_row >= n_kept, group_of_row - n_kept, -1)
    kept, prior, base = None, None, None
    if n_kept:
        kept = _kept_columns(site, plan, directory, np.where(group_of_row < n_kept, group_of_row, -1),
                             min_size)
        prior, base = kept_summary(kept, site.n_features, min_size)
    columns, order, spreads = group_stats.ordered(site.X, new_of_row, len(plan.new_members),
                                                  directory, min_size, prior, plan.units, base,
                                                  judged_features(site),
                                                  _forced(store, plan.new_members, site.n_features))
    group_of_row = np.where(group_of_row >= n_kept, group_stats.relabel(new_of_row, order) + n_kept,
                            group_of_row)
    if n_kept:
        width = site.n_features
        if columns["present"] is not None or kept["present"] is not None:
            columns["present"] = (kept["present"] or [group_stats.spread(kept["counts"][0], width)]) + \
                (columns["present"] or [group_stats.spread(columns["counts"][0], width)])
        for name in ("counts", "sums", "m2"):
            columns[name] = kept[name] + columns[name]
    table = group_stats.Table(columns, site.n_features, labels_of_groups(site, group_of_row),
                              int(np.count_nonzero(group_of_row < 0)), spreads)
    return table, group_of_row, order


def _kept_columns(site: SiteData, plan, directory: Path, kept_of_row: np.ndarray,
                  min_size: int) -> dict:
    """The kept groups' columns, from the entries of the tables they were kept from (bit
    for bit); recomputed from their rows, with a warning, where such an entry is gone."""
    reads = [(group_entries.read_arrays(directory / table["entry"]), positions)
             for table, positions in plan.kept_from]
    gone = [table["entry"] for (read, _), (table, _) in zip(reads, plan.kept_from) if read is None]
    if not gone:
        width = site.n_features
        pieces = {name: [] for name in ("counts", "sums", "m2", "present")}
        for (_, parts), positions in reads:
            for name in ("counts", "sums", "m2"):
                pieces[name].append(group_stats.piece(parts[name], positions))
            pieces["present"].append(group_stats.piece(parts["present"], positions)
                                     if "present" in parts
                                     else group_stats.spread(pieces["counts"][-1], width))
        if all("present" not in parts for (_, parts), _ in reads):
            pieces["present"] = None
        return {name: None if column is None else [group_stats.joined(column)]
                for name, column in pieces.items()}
    logger.warning("%s: the entry %s of a table the kept groups come from is gone: their "
                   "statistics are computed again from their rows", site.source, gone[0])
    return group_stats.kept_again(site.X, kept_of_row, int(plan.kept.size), min_size,
                                  judged_features(site))


def kept_summary(kept: dict, width: int, min_size: int) -> tuple[tuple, tuple]:
    """A version's kept groups (``kept``: their columns as pieces, their m2 the released
    one), in one pass: (m2 sum, degrees of freedom) per feature, pooled into the new
    groups' ``typical``; and (cells, sums, squares) per feature, their share of the
    version's moments (``site_moments``' ``base``: the squares from the released m2 and
    the groups' means, close to the rows' own: a yardstick, not a release)."""
    total, dof = np.zeros(width), np.zeros(width)
    cells_total, sums_total, squares = np.zeros(width), np.zeros(width), np.zeros(width)
    (n, counts_of), = kept["counts"]
    present = kept.get("present")
    for lo in range(0, n, group_spreads.CHUNK_GROUPS):
        hi = min(n, lo + group_spreads.CHUNK_GROUPS)
        counts = np.asarray(counts_of(lo, hi))
        cells = np.repeat(counts[:, None], width, axis=1) if present is None \
            else np.asarray(present[0][1](lo, hi))
        sums = np.asarray(kept["sums"][0][1](lo, hi))
        m2 = np.asarray(kept["m2"][0][1](lo, hi))
        cells_total += cells.sum(axis=0)
        sums_total += sums.sum(axis=0)
        with np.errstate(invalid="ignore", divide="ignore"):
            squares += np.where(cells > 0, m2 + sums * sums / np.maximum(cells, 1), 0.0).sum(axis=0)
        cells = np.where(cells >= min_size, cells, 0)
        total += np.where(cells > 0, m2, 0.0).sum(axis=0)
        dof += np.maximum(cells - 1.0, 0.0).sum(axis=0)
    return (total, dof), (cells_total, sums_total, squares)


def pair_rows(X: np.ndarray, groups: list[np.ndarray]) -> np.ndarray:
    """The spread partners (``release/spreads.spread_partners``) of groups given by their
    rows (a new version's few), their means standardised as the rows' spread says."""
    if not groups:
        return np.zeros(0, dtype=np.int64)
    rows = np.concatenate(groups)
    order = np.argsort(rows, kind="stable")
    values = np.empty((rows.size, X.shape[1]))
    values[order] = np.asarray(X[rows[order]], dtype=np.float64)
    release_pages(X)
    with np.errstate(invalid="ignore"):
        sd = np.nan_to_num(np.nanstd(values, axis=0))
        scale = np.where(sd > 0, 1.0 / np.where(sd > 0, sd, 1.0), 0.0)
        means, at = [], 0
        for members in groups:
            means.append(np.nan_to_num(np.nanmean(values[at:at + members.size], axis=0)))
            at += members.size
    points = np.array(means) * scale
    if points.shape[1] > group_spreads.PAIRING_WIDTH:
        points = points @ np.random.default_rng(points.shape[1]).standard_normal(
            (points.shape[1], group_spreads.PAIRING_WIDTH))
    return spread_partners(points, np.array([m.size for m in groups]))

"""Where rows become groups: a site's group table, made once per data version, kept.

The site's data layer (``site_data.py``, ``schema_table.py``) reads rows; this module
cuts them into groups of at least p_site rows (``grouping.py``), computes each group's
statistics (``site_groups.SiteGroups``) and hands those to the tasks. Nothing after it
sees a row, but differential privacy, whose tasks answer from clipped rows with noise
(``private_rows.py``).

Kept where (p_site >= 2):

- a deployed site's file: beside its data cache (``<cache-dir>/groups``), keyed like the
  data cache entry (the file's path, size and mtime and the columns read) and p_site, so
  a fresh process per message maps the table instead of grouping again;
- in memory, per array object (simulation, the in-process harness).

Memory (``group_stats.py``): a deployed site's rows are read in file order only, a chunk
at a time, their pages dropped after each; of the table only the per-feature sums are
held whole while it is made (its squared deviations a window of groups at a time,
spilled to a temporary file beside the table), and every array is written in canonical
order chunk by chunk, never reordered in memory (``bench/grouping.py``: 1,000,000 x 64
at g = 2, the whole build in about 7 s and 1.2 x the data).

A new version of the file is grouped by the versions rule (``versions/``): the last
answered table's groups whose rows are all still there stay, their statistics copied bit
for bit; a group that lost or changed a row is withdrawn whole; the waiting rows are
grouped among themselves; the span audit holds back what would let all the tables ever
answered from isolate fewer than p_site rows. Each entry records its place in the
site's answered history (``versions/lineage.py``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import weakref
from pathlib import Path

import numpy as np

from fedcluster.client_app import site_files
from fedcluster.client_app.data import (group_entries, group_spreads, group_stats, grouped_rows,
                                         versions)
from fedcluster.client_app.data.group_stats import group_statistics
from fedcluster.client_app.data.grouping import grouping_scale
from fedcluster.client_app.data.site_data import SiteData, SiteDataError
from fedcluster.client_app.release.lone_cells import withhold_lone_cells
from fedcluster.client_app.site_groups import GroupLabels, SiteGroups
from fedcluster.client_app.data.versions import joining, row_keys

__all__ = ["build", "group_statistics", "grouping_scale", "judged_features", "labels_of_groups",
           "made_groups", "row_groups", "row_hashes", "rows_as_groups", "site_groups"]

logger = logging.getLogger(__name__)


# ------------------------------------------------------------------ labels and digest
def _label_codes(site: SiteData) -> tuple[np.ndarray, tuple[str, ...]] | None:
    """Each row's label as an index into the site's sorted distinct labels, and their text."""
    if site.labels is None:
        return None
    values, codes = np.unique(site.labels, return_inverse=True)
    names = tuple(str(site.label_names[v]) if site.label_names is not None else str(int(v))
                  for v in values)
    return codes.astype(np.int64), names


def labels_of_groups(site: SiteData, group_of_row: np.ndarray) -> GroupLabels | None:
    if (coded := _label_codes(site)) is None:
        return None
    codes, names = coded
    grouped = group_of_row >= 0
    key = group_of_row[grouped] * len(names) + codes[grouped]
    pairs, count = np.unique(key, return_counts=True)
    return GroupLabels(pairs // len(names), pairs % len(names), count.astype(np.int64), names)


def judged_features(site: SiteData) -> np.ndarray | None:
    """(d,) bool: the features the p% rule on means judges (``release/dominance.py``):
    a schema's numeric columns (a level's indicator sums to a count, which Table 1's
    small-cell rule protects; a stood-in mean would not be one), every column without a
    schema (None)."""
    schema = None if site.table is None else site.table.schema
    if schema is None:
        return None
    judged = []
    for column in schema.features:
        judged += [column.type == "numeric"] if column.type == "numeric" \
            else [False] * len(column.categories)
        judged += [False] if column.missing_indicator else []
    return np.array(judged, dtype=bool) if len(judged) == site.n_features else None


def made_groups(site: SiteData, min_size: int, counts, sums, m2, present, labels,
                waiting: int, digest: str | None = None, table_ref=None,
                rows_dropped: int | None = None, spread_rule: dict | None = None,
                held_back: tuple = (0, ""), units=None):
    """The SiteGroups of a group table as made or kept (and of the report's,
    ``report_table.py``): a feature's present cells fewer
    than p_site in a group are withheld (``release/lone_cells.py``; applied here, on
    every table handed to tasks, kept ones made before the rule included) and counted
    apart (``SiteGroups.withheld``); the table's facts (cells missing in the data, rows
    dropped) as the groups keep them."""
    digest = digest or group_entries.table_digest(counts, sums, m2, present, labels, min_size)
    facts = site.table
    if facts is not None:  # missing in the data: the cells the rule withholds are present
        facts = facts.of_groups(counts, present, facts.rows_dropped if rows_dropped is None
                                else rows_dropped)
    sums, m2, present, withheld = withhold_lone_cells(sums, m2, present, min_size)
    return SiteGroups(counts, sums, m2, present, site.source, min_size, digest,
                      site.feature_names, labels, facts, waiting, site.fingerprint,
                      withheld, table_ref, spread_rule, held_back=held_back[0],
                      held_back_why=held_back[1], units=units)


def rows_as_groups(site: SiteData) -> SiteGroups:
    """p_site = 1: every row is its own group (the site answers from its rows)."""
    X = site.X
    n = X.shape[0]
    present = None
    if site.table is not None and site.table.has_missing:
        missing = np.isnan(X)
        if missing.any():
            present, X = (~missing).astype(np.int64), np.where(missing, 0.0, X)
    labels = None
    if (coded := _label_codes(site)) is not None:
        labels = GroupLabels(np.arange(n), coded[0], np.ones(n, dtype=np.int64), coded[1])
    # The table is the rows themselves: its digest is theirs.
    digest = hashlib.sha256(f"{group_entries.GROUPS_FORMAT}\0rows\0{site.rows_fingerprint()}".encode()).hexdigest()
    return SiteGroups(np.ones(n, dtype=np.int64), X, None, present, site.source, 1, digest,
                      site.feature_names, labels, site.table, 0, site.fingerprint)


# ------------------------------------------------------------------ the table
def _fresh(site: SiteData, min_size: int, scratch: Path | None = None):
    """A table of the site's rows grouped afresh, and each row's group (-1: waiting)."""
    group_of_row = grouped_rows.grouped(site, min_size, scratch=scratch)
    n_groups = int(group_of_row.max()) + 1 if group_of_row.size else 0
    columns, order, spreads = group_stats.ordered(site.X, group_of_row, n_groups, scratch,
                                                  min_size, judged=judged_features(site))
    group_of_row = group_stats.relabel(group_of_row, order)
    return group_stats.Table(columns, site.n_features, labels_of_groups(site, group_of_row),
                             int(np.count_nonzero(group_of_row < 0)), spreads), group_of_row


def build(site: SiteData, min_size: int) -> tuple[SiteGroups, np.ndarray]:
    """The group table of ``site`` (the grouping's groups, in canonical order), in
    memory, and each row's group (-1: waiting)."""
    table, group_of_row = _fresh(site, min_size)
    rule = None if table.spreads is None else table.spreads.summary()
    units = None if table.spreads is None else table.spreads.unit_heads()
    return made_groups(site, min_size, *table.held(), table.labels, table.waiting,
                       spread_rule=rule, units=units), group_of_row


# ------------------------------------------------------------------ where tables are kept
def site_groups(site: SiteData, min_size: int,
                cache_dir: str | os.PathLike | None = None) -> tuple[SiteGroups, np.ndarray | None]:
    """The groups of ``site`` at p_site = ``min_size``, and which of its rows are in a
    group (None: every row). A file's table is kept in ``cache_dir``, made by the versions
    rule (module docstring); data held in memory keep theirs in this process, per array.

    Raises
    ------
    SiteDataError
        The site's answered history cannot be kept in ``cache_dir`` (the site then answers
        nothing: a version it cannot record could be combined with earlier ones).
    """
    if min_size <= 1:
        return rows_as_groups(site), None
    if site.version is None or site.reading is None or cache_dir is None:
        return _in_memory(site, min_size)
    directory = Path(cache_dir) / "groups"
    try:
        return _kept(site, min_size, directory)
    except OSError as error:
        raise SiteDataError(f"{site.source}: cannot keep the site's group tables and their "
                            f"history in {directory} ({error}); the site answers no task until "
                            "its cache-dir is writable") from None


_MEMORY: dict[tuple[int, int], tuple[weakref.ref, SiteGroups, np.ndarray | None, np.ndarray]] = {}


def _forget(key: tuple[int, int]) -> None:
    hit = _MEMORY.get(key)
    if hit is not None and hit[0]() is None:
        del _MEMORY[key]


def _in_memory(site: SiteData, min_size: int) -> tuple[SiteGroups, np.ndarray | None]:
    """The groups of data held in memory, made once per array object in this process
    (O(1) per call: an entry goes when its array does)."""
    key = (id(site.X), min_size)
    hit = _MEMORY.get(key)
    if hit is not None and hit[0]() is site.X and hit[1].source == site.source:
        return hit[1], hit[2]
    groups, group_of_row = build(site, min_size)
    grouped = None if groups.waiting == 0 else group_of_row >= 0
    _MEMORY[key] = (weakref.ref(site.X), groups, grouped, group_of_row)
    weakref.finalize(site.X, _forget, key)
    return groups, grouped


def _kept(site: SiteData, min_size: int, directory: Path):
    key = group_entries.entry_key(site, min_size)
    base = directory / key
    store_dir = versions.Store.path_for(directory.parent, site.reading)
    found = _read_entry(base, site, store_dir)  # complete once its sidecar is there
    if found is not None:
        return found
    with site_files.locked(store_dir, "store.json"):  # one process builds, the others read
        found = _read_entry(base, site, store_dir)
        if found is None:
            _new_version(site, min_size, directory, versions.Store.open(store_dir), key)
            found = _read_entry(base, site, store_dir)
    if found is None:
        raise OSError(f"the group table written to {base} cannot be read back")
    return found


def _read_entry(base: Path, site: SiteData, store_dir: Path):
    """The kept table of this version, with its place in the store (None: not made yet, or
    made by an earlier release, whose table the store must first import)."""
    read = group_entries.read_arrays(base)
    if read is None:
        return None
    meta, parts = read
    if parts["row-groups"].shape != (site.n_rows,) or parts["sums"].shape[1:] != (site.n_features,):
        return None
    tables = versions.Store.read_tables(store_dir)
    number = meta.get("table")
    if not isinstance(number, int) or number >= len(tables) or tables[number]["entry"] != base.name:
        return None
    labels = None
    if "labels" in parts:
        coo = np.asarray(parts["labels"])
        labels = GroupLabels(coo[:, 0], coo[:, 1], coo[:, 2], tuple(meta["label-names"]))
    ref = versions.TableRef(str(store_dir), number, str(meta["lineage"]))
    groups = made_groups(site, int(meta["min-size"]), parts["counts"], parts["sums"], parts["m2"],
                         parts.get("present"), labels, int(meta["waiting"]), str(meta["digest"]),
                         ref, int(meta.get("rows-dropped", 0)), meta.get("spreads"),
                         (int(meta.get("held-back", 0)), str(meta.get("held-back-why", ""))))
    grouped = None if groups.waiting == 0 else np.asarray(parts["row-groups"]) >= 0
    return groups, grouped


def row_groups(site: SiteData, min_size: int,
               cache_dir: str | os.PathLike | None = None) -> np.ndarray:
    """(n,) each row's group in the table :func:`site_groups` hands the tasks (-1: a row
    waiting), for the one step that needs it after the table is made: the report's groups
    within the final model's clusters (``report_table.py``). Call after ``site_groups``."""
    if min_size <= 1:
        return np.arange(site.n_rows, dtype=np.int64)
    if site.version is None or site.reading is None or cache_dir is None:
        _in_memory(site, min_size)
        return _MEMORY[(id(site.X), min_size)][3]
    read = group_entries.read_arrays(Path(cache_dir) / "groups" / group_entries.entry_key(site, min_size))
    if read is None:
        raise SiteDataError(f"{site.source}: the group table's entry is gone from {cache_dir}")
    return np.asarray(read[1]["row-groups"], dtype=np.int64)


# ------------------------------------------------------------------ a new version
def row_hashes(site: SiteData) -> np.ndarray:
    """(n, 2) uint64: each row's content, wherever it sits in the file (its cells' bits
    and its label's text: ``versions.row_keys.content_keys``)."""
    return row_keys.content_keys(site.X, *(_label_codes(site) or (None, None)))


def _new_version(site: SiteData, min_size: int, directory: Path, store, key: str) -> None:
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
                                lambda groups: group_spreads.pair_rows(site.X, groups),
                                lambda record: group_entries.read_arrays(
                                    directory / record["entry"]) is not None,
                                lambda groups: grouped_rows.mended(site, groups, min_size, directory))
    table, group_of_row, order = _version_table(site, plan, directory, min_size)
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


def _version_table(site: SiteData, plan, directory: Path, min_size: int):
    """The version's table (the kept groups first, their statistics copied bit for bit
    from the base table's entry, then the new groups in canonical order), each row's
    group in it, and the new groups' canonical order."""
    group_of_row, n_kept = plan.group_of_row, int(plan.kept.size)
    new_of_row = np.where(group_of_row >= n_kept, group_of_row - n_kept, -1)
    kept, prior, base = None, None, None
    if n_kept:
        kept = _kept_columns(site, plan, directory, np.where(group_of_row < n_kept, group_of_row, -1),
                             min_size)
        prior, base = group_spreads.kept_summary(kept, site.n_features, min_size)
    columns, order, spreads = group_stats.ordered(site.X, new_of_row, len(plan.new_members),
                                                  directory, min_size, prior, plan.units, base,
                                                  judged_features(site))
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

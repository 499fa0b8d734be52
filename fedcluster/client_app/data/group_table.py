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
at a time, their pages dropped after each; a large table's sums and squared
deviations are made a window of groups at a time, spilled to temporary files beside the
table and read back in file order (``mapped_pages.rows_at``), and every array is written in canonical order chunk by chunk,
never reordered in memory (``bench/grouping.py``, grouping-scale: the memory a version 0
of 1,000,000 x 64 adds to the process, part by part).

A new version of the file is grouped by the versions rule (``versions/``): the last
answered table's groups whose rows are all still there stay, their statistics copied bit
for bit; a group that lost or changed a row is withdrawn whole; the waiting rows are
grouped among themselves; the span audit holds back what would let all the tables ever
answered from isolate fewer than p_site rows. Each entry records its place in the
site's answered history (``release/record/``).
"""

from __future__ import annotations

import hashlib
import logging
import os
import weakref
from pathlib import Path

import numpy as np

from fedcluster.client_app import site_files
from fedcluster.client_app.mapped_pages import small_pages
from fedcluster.client_app.data import (group_entries, group_stats, grouped_rows, version_table,
                                         versions)
from fedcluster.client_app.data.group_stats import group_statistics
from fedcluster.client_app.data.grouped_rows import (judged_features, label_codes,
                                                      labels_of_groups, row_hashes)
from fedcluster.client_app.data.site_data import SiteData, SiteDataError
from fedcluster.client_app.release import record
from fedcluster.client_app.release.lone_cells import withhold_lone_cells
from fedcluster.client_app.site_groups import GroupLabels, SiteGroups

__all__ = ["build", "group_statistics", "judged_features", "labels_of_groups",
           "made_groups", "row_groups", "row_hashes", "rows_as_groups", "site_groups"]

logger = logging.getLogger(__name__)


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
    if (coded := label_codes(site)) is not None:
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
    (O(1) per call: an entry goes when its array does), with their record in memory
    (``release/record``: the table's groups, units, present cells and stand-ins, what a
    report's parts are judged with)."""
    key = (id(site.X), min_size)
    hit = _MEMORY.get(key)
    if hit is not None and hit[0]() is site.X and hit[1].source == site.source:
        return hit[1], hit[2]
    table, group_of_row = _fresh(site, min_size)
    rule = None if table.spreads is None else table.spreads.summary()
    units = None if table.spreads is None else table.spreads.unit_heads()
    name = record.in_memory(site.X, lambda store: _memory_record(store, site, table, group_of_row,
                                                                  units, min_size))
    groups = made_groups(site, min_size, *table.held(), table.labels, table.waiting,
                         spread_rule=rule, units=units,
                         table_ref=record.TableRef(name, 0, None))
    grouped = None if groups.waiting == 0 else group_of_row >= 0
    _MEMORY[key] = (weakref.ref(site.X), groups, grouped, group_of_row)
    weakref.finalize(site.X, _forget, key)
    return groups, grouped


def _memory_record(store, site: SiteData, table, group_of_row: np.ndarray, units, min_size: int):
    """Fill an empty record in memory with the table of data held in memory: its rows the
    instances (their places), its groups, spread units, the rows' present cells and the
    table's stand-ins."""
    n = site.n_rows
    store.match(np.stack([np.arange(n, dtype=np.uint64), np.zeros(n, dtype=np.uint64)], axis=1), None)
    store.cell_width = site.n_features
    if site.table is not None and site.table.has_missing:
        store.add_present(np.arange(n), versions.present_rows(site.X, np.arange(n)))
    n_groups = int(group_of_row.max()) + 1 if group_of_row.size else 0
    order = np.argsort(group_of_row, kind="stable")
    order = order[group_of_row[order] >= 0]
    sizes = np.bincount(group_of_row[order], minlength=n_groups)
    numbers = store.add_groups(versions.GroupMembers(np.concatenate([[0], np.cumsum(sizes)]), order),
                               min_size)
    if units is not None:
        store.set_units(numbers, np.where(units >= 0, numbers[np.maximum(units, 0)], -1))
    version_table.record_stand_ins(store, table.spreads, numbers)
    store.add_table(numbers, {"entry": "memory", "lineage": "memory", "p": min_size})


def _kept(site: SiteData, min_size: int, directory: Path):
    key = group_entries.entry_key(site, min_size)
    base = directory / key
    store_dir = versions.Store.path_for(directory.parent, site.reading)
    found = _read_entry(base, site, store_dir)  # complete once its sidecar is there
    if found is not None:
        return found
    with site_files.locked(store_dir, "store.json"), small_pages():  # one builds, the others read
        found = _read_entry(base, site, store_dir)
        if found is None:
            version_table.new_version(site, min_size, directory, versions.Store.open(store_dir), key)
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

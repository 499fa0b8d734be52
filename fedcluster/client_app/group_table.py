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

Data that grow keep their groups. Each deployed entry keeps a 128-bit hash of every row
(its cells and its label) and the row's group; the file's lineage (its path and the
columns read, not its version) names its latest entry. When a new version of the file
holds every row of that entry (as a multiset of row contents), the rows of the entry's
groups keep those groups, their statistics copied bit for bit, and the other rows (new
ones, and rows that waited) are grouped among themselves; fewer than p_site of them wait,
in no group, until there are enough. A version that lost or changed a row is grouped
afresh (the privacy model says what comparing runs on the two versions can give away).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import tempfile
import weakref
from pathlib import Path

import numpy as np

from fedcluster.client_app import group_stats, site_files
from fedcluster.client_app.group_stats import group_statistics, mix
from fedcluster.client_app.grouping import group_rows, grouping_scale
from fedcluster.client_app.site_data import SiteData, cache_sibling, release_pages, write_atomic
from fedcluster.client_app.site_groups import GroupLabels, SiteGroups, withhold_lone_cells

__all__ = ["build", "group_statistics", "grouping_scale", "match_rows",
           "row_hashes", "rows_as_groups", "site_groups", "table_digest"]

logger = logging.getLogger(__name__)
# v2: groups ordered by a hash of their statistics (v1: by their means), each sum taken
# in row order (group_stats.py): a v1 entry is grouped again.
GROUPS_FORMAT = "fedcluster-site-groups-v2"
#: Rows per chunk of a pass over the rows (row hashes, fill means): bounds the
#: temporaries to a few CHUNK_ROWS x d values.
CHUNK_ROWS = 1 << 14


# ------------------------------------------------------------------ labels and digest
def _label_codes(site: SiteData) -> tuple[np.ndarray, tuple[str, ...]] | None:
    """Each row's label as an index into the site's sorted distinct labels, and their text."""
    if site.labels is None:
        return None
    values, codes = np.unique(site.labels, return_inverse=True)
    names = tuple(str(site.label_names[v]) if site.label_names is not None else str(int(v))
                  for v in values)
    return codes.astype(np.int64), names


def _labels_of_groups(site: SiteData, group_of_row: np.ndarray) -> GroupLabels | None:
    if (coded := _label_codes(site)) is None:
        return None
    codes, names = coded
    grouped = group_of_row >= 0
    key = group_of_row[grouped] * len(names) + codes[grouped]
    pairs, count = np.unique(key, return_counts=True)
    return GroupLabels(pairs // len(names), pairs % len(names), count.astype(np.int64), names)


def _digest_start(min_size: int):
    return hashlib.sha256(f"{GROUPS_FORMAT}\0{min_size}\0".encode())


def _digest_labels(digest, labels: GroupLabels | None) -> str:
    if labels is not None:
        for part in (labels.group, labels.code, labels.count):
            digest.update(np.ascontiguousarray(part))
        digest.update(json.dumps(labels.names).encode())
    return digest.hexdigest()


def table_digest(counts, sums, m2, present, labels: GroupLabels | None, min_size: int) -> str:
    """sha256 of a group table: what the disclosure ledger names each reply by (each
    array's bytes, hashed in place: no copy of a large table)."""
    digest = _digest_start(min_size)
    for part in (counts, sums, m2, present):
        if part is not None:
            digest.update(np.ascontiguousarray(part))
    return _digest_labels(digest, labels)


def _groups(site: SiteData, min_size: int, counts, sums, m2, present, labels, waiting: int,
            digest: str | None = None):
    """The SiteGroups of a group table as made or kept: a feature's present cells fewer
    than p_site in a group count as missing (``site_groups.withhold_lone_cells``; applied
    here, on every table handed to tasks, kept ones made before the rule included)."""
    digest = digest or table_digest(counts, sums, m2, present, labels, min_size)
    sums, m2, present, withheld = withhold_lone_cells(sums, m2, present, min_size)
    return SiteGroups(counts, sums, m2, present, site.source, min_size, digest,
                      site.feature_names, labels, site.table, waiting, site.fingerprint,
                      withheld)


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
    digest = hashlib.sha256(f"{GROUPS_FORMAT}\0rows\0{site.rows_fingerprint()}".encode()).hexdigest()
    return SiteGroups(np.ones(n, dtype=np.int64), X, None, present, site.source, 1, digest,
                      site.feature_names, labels, site.table, 0, site.fingerprint)


# ------------------------------------------------------------------ what the grouping sees
@contextlib.contextmanager
def _grouping_rows(site: SiteData, rows: np.ndarray | None = None, scratch: Path | None = None):
    """The rows the grouping sees (``rows``: those rows of the site, ascending): a missing
    cell at its feature's site mean (the grouping only decides who is with whom; the
    statistics keep the cell missing). The site's own rows when it has all of them and
    no missing cell; else a copy, made a chunk at a time, in a temporary file in
    ``scratch`` when given (mapped read-only, so never all resident), else in memory."""
    X = site.X
    missing = site.table is not None and site.table.has_missing
    if rows is None and not missing:
        yield X
        return
    n, d = (X.shape[0] if rows is None else len(rows)), X.shape[1]

    def chunks():  # in file order, a memory-mapped site's pages dropped after each
        for start in range(0, n, CHUNK_ROWS):
            yield start, np.asarray(X[start:start + CHUNK_ROWS] if rows is None
                                    else X[rows[start:start + CHUNK_ROWS]])
            release_pages(X)

    means = None
    if missing:  # chunked, so a file and memory give the same bits
        present, total = np.zeros(d, dtype=np.int64), np.zeros(d)
        for _, block in chunks():
            absent = np.isnan(block)
            present += (~absent).sum(axis=0)
            total += np.where(absent, 0.0, block).sum(axis=0)
        means = total / np.maximum(present, 1)
    with contextlib.ExitStack() as stack:
        out = stack.enter_context(tempfile.TemporaryFile(dir=scratch)) if scratch else None
        copy = np.empty((n, d)) if out is None else None
        for start, block in chunks():
            if means is not None:
                block = np.where(np.isnan(block), means, block)
            if out is None:
                copy[start:start + len(block)] = block
            else:
                out.write(np.ascontiguousarray(block))
        if out is not None:
            out.flush()
            copy = np.memmap(out, dtype=np.float64, mode="r", shape=(n, d))
        yield copy


# ------------------------------------------------------------------ the table
def _grouped(site: SiteData, min_size: int, rows: np.ndarray | None = None,
             scratch: Path | None = None) -> np.ndarray:
    """Each row's group (``rows``: of those rows alone), numbered by first appearance."""
    with _grouping_rows(site, rows, scratch) as X:
        return group_rows(X, min_size, grouping_scale(X))


def _fresh(site: SiteData, min_size: int, scratch: Path | None = None):
    """A table of the site's rows grouped afresh, and each row's group (-1: waiting)."""
    group_of_row = _grouped(site, min_size, scratch=scratch)
    n_groups = int(group_of_row.max()) + 1 if group_of_row.size else 0
    columns, order = group_stats.ordered(site.X, group_of_row, n_groups, scratch)
    group_of_row = group_stats.relabel(group_of_row, order)
    return group_stats.Table(columns, site.n_features, _labels_of_groups(site, group_of_row),
                             int(np.count_nonzero(group_of_row < 0))), group_of_row


def build(site: SiteData, min_size: int) -> tuple[SiteGroups, np.ndarray]:
    """The group table of ``site`` (the grouping's groups, in canonical order), in
    memory, and each row's group (-1: waiting)."""
    table, group_of_row = _fresh(site, min_size)
    return _groups(site, min_size, *table.held(), table.labels, table.waiting), group_of_row


# ------------------------------------------------------------------ where tables are kept
def site_groups(site: SiteData, min_size: int,
                cache_dir: str | os.PathLike | None = None) -> tuple[SiteGroups, np.ndarray | None]:
    """The groups of ``site`` at p_site = ``min_size``, and which of its rows are in a
    group (None: every row). A file's table is kept in ``cache_dir`` (module docstring);
    data held in memory keep theirs in this process, per array object."""
    if min_size <= 1:
        return rows_as_groups(site), None
    if site.version is None or cache_dir is None:
        return _in_memory(site, min_size)
    directory = Path(cache_dir) / "groups"
    try:
        return _kept(site, min_size, directory)
    except OSError as error:
        logger.warning("%s: cannot keep the group table in %s (%s); grouping in memory",
                       site.source, directory, error)
        return _in_memory(site, min_size)


_MEMORY: dict[tuple[int, int], tuple[weakref.ref, SiteGroups, np.ndarray | None]] = {}


def _in_memory(site: SiteData, min_size: int) -> tuple[SiteGroups, np.ndarray | None]:
    for stale in [key for key, (ref, *_) in _MEMORY.items() if ref() is None]:
        del _MEMORY[stale]
    key = (id(site.X), min_size)
    hit = _MEMORY.get(key)
    if hit is not None and hit[0]() is site.X and hit[1].source == site.source:
        return hit[1], hit[2]
    groups, group_of_row = build(site, min_size)
    grouped = None if groups.waiting == 0 else group_of_row >= 0
    _MEMORY[key] = (weakref.ref(site.X), groups, grouped)
    return groups, grouped


# Arrays of an entry: name -> whether every entry has it.
_PARTS = {"counts": True, "sums": True, "m2": True, "present": False, "labels": False,
          "row-groups": True, "row-hashes": True}


def _entry_key(site: SiteData, min_size: int) -> str:
    return hashlib.sha256(f"{GROUPS_FORMAT}\0{site.version}\0{min_size}".encode()).hexdigest()


def _lineage_path(directory: Path, site: SiteData, min_size: int) -> Path:
    key = hashlib.sha256(f"{GROUPS_FORMAT}\0{site.lineage}\0{min_size}".encode()).hexdigest()
    return directory / f"lineage-{key[:40]}.json"


def _kept(site: SiteData, min_size: int, directory: Path):
    key = _entry_key(site, min_size)
    base = directory / key
    with site_files.locked(directory, key):  # one process groups, the others then read
        found = _read_entry(base, site)
        if found is None:
            table, group_of_row, hashes = _grow_or_group(site, min_size, directory)
            _write_entry(base, table, min_size, group_of_row, hashes)
            del table  # its columns went as they were written
            site_files.replace_atomically(_lineage_path(directory, site, min_size),
                                          lambda out: out.write(json.dumps({"entry": key}).encode()))
            found = _read_entry(base, site)
    if found is None:
        raise OSError(f"the group table written to {base} cannot be read back")
    return found


def _write_entry(base: Path, table: group_stats.Table, min_size: int, group_of_row: np.ndarray,
                 hashes: np.ndarray) -> None:
    """The entry's arrays, then its sidecar (last: with it, the entry is complete). A
    column is dropped from ``table`` once written, so its memory goes with it."""
    digest, has = _digest_start(min_size), []
    for name in ("counts", "sums", "m2", "present"):
        pieces = table.columns.pop(name)
        if pieces is not None:
            write_atomic(cache_sibling(base, f".{name}.npy"), lambda f: group_stats.write_column(
                f, name, pieces, table.width, digest))
            has.append(name)
        del pieces
    labels = table.labels
    parts = {"row-groups": group_of_row, "row-hashes": hashes,
             "labels": None if labels is None else np.stack([labels.group, labels.code, labels.count], 1)}
    for name, array in parts.items():
        if array is not None:
            write_atomic(cache_sibling(base, f".{name}.npy"),
                         lambda f, a=np.ascontiguousarray(array): np.save(f, a))
            has.append(name)
    meta = {"format": GROUPS_FORMAT, "min-size": min_size, "digest": _digest_labels(digest, labels),
            "waiting": table.waiting, "has": has,
            "label-names": None if labels is None else list(labels.names)}
    write_atomic(cache_sibling(base, ".json"), lambda f: f.write(json.dumps(meta).encode()))


def _read_arrays(base: Path) -> tuple[dict, dict] | None:
    """An entry's sidecar and its arrays, memory-mapped (None: missing or damaged)."""
    try:  # the sidecar is written last: with it, the entry is complete
        meta = json.loads(cache_sibling(base, ".json").read_text())
        if meta.get("format") != GROUPS_FORMAT:
            return None
        parts = {name: np.load(cache_sibling(base, f".{name}.npy"), mmap_mode="r")
                 for name in meta["has"]}
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if any(needed and name not in parts for name, needed in _PARTS.items()):
        return None
    return meta, parts


def _read_entry(base: Path, site: SiteData) -> tuple[SiteGroups, np.ndarray | None] | None:
    read = _read_arrays(base)
    if read is None:
        return None
    meta, parts = read
    if parts["row-groups"].shape != (site.n_rows,) or parts["sums"].shape[1:] != (site.n_features,):
        return None
    labels = None
    if "labels" in parts:
        coo = np.asarray(parts["labels"])
        labels = GroupLabels(coo[:, 0], coo[:, 1], coo[:, 2], tuple(meta["label-names"]))
    groups = _groups(site, int(meta["min-size"]), parts["counts"], parts["sums"], parts["m2"],
                     parts.get("present"), labels, int(meta["waiting"]), str(meta["digest"]))
    grouped = None if groups.waiting == 0 else np.asarray(parts["row-groups"]) >= 0
    return groups, grouped


# ------------------------------------------------------------------ growth
def row_hashes(site: SiteData) -> np.ndarray:
    """(n, 2) uint64: two independent 64-bit hashes of each row's cells (their bits) and
    label (its text): a row's content, wherever it sits in the file."""
    X = np.ascontiguousarray(site.X, dtype=np.float64)
    n, d = X.shape
    out = np.empty((n, 2), dtype=np.uint64)
    label_bits = None
    if (coded := _label_codes(site)) is not None:
        text = [int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little")
                for name in coded[1]]
        label_bits = np.asarray(text, dtype=np.uint64)[coded[0]]
    for start in range(0, n, CHUNK_ROWS):
        # features as contiguous columns: each step below reads one feature of the chunk
        bits = np.ascontiguousarray(X[start:start + CHUNK_ROWS].T).view(np.uint64)
        release_pages(site.X)
        a = np.full(bits.shape[1], 0x9E3779B97F4A7C15, dtype=np.uint64)
        b = np.full(bits.shape[1], 0xD1B54A32D192ED03, dtype=np.uint64)
        for j in range(d):
            a = mix(a ^ bits[j])
            b = mix(b + mix(bits[j] ^ np.uint64(j + 1)))
        if label_bits is not None:
            a = mix(a ^ label_bits[start:start + CHUNK_ROWS])
            b = mix(b + label_bits[start:start + CHUNK_ROWS])
        out[start:start + bits.shape[1], 0], out[start:start + bits.shape[1], 1] = a, b
    return out


def match_rows(earlier: np.ndarray, now: np.ndarray) -> np.ndarray | None:
    """For every row of an earlier version (its hashes), a distinct row of the current
    one with the same content (the first ones in file order when several are alike);
    None when some earlier row has none (a row was removed or changed)."""
    if earlier.shape[0] > now.shape[0]:
        return None
    order_then = np.argsort(earlier[:, 0], kind="stable")
    order_now = np.argsort(now[:, 0], kind="stable")
    then, later = earlier[order_then, 0], now[order_now, 0]

    def occurrence(keys: np.ndarray) -> np.ndarray:  # 0, 1, ... within a run of equal keys
        index = np.arange(keys.size)
        first = np.r_[True, keys[1:] != keys[:-1]] if keys.size else np.zeros(0, dtype=bool)
        return index - np.maximum.accumulate(np.where(first, index, 0))

    position = np.searchsorted(later, then, side="left") + occurrence(then)
    if np.any(position >= later.size) or np.any(later[np.minimum(position, later.size - 1)] != then):
        return None
    matched = np.empty(earlier.shape[0], dtype=np.int64)
    matched[order_then] = order_now[position]
    if np.any(now[matched, 1] != earlier[:, 1]):
        return None  # two contents with one first hash: take the safe way, regroup
    return matched


def _grow_or_group(site: SiteData, min_size: int, directory: Path):
    """(table, each row's group, row hashes) of a new version of the file: the earlier
    version's groups kept when every one of its rows is still there, else afresh."""
    hashes = row_hashes(site)
    earlier = None
    lineage = _lineage_path(directory, site, min_size)
    if site.lineage is not None and lineage.exists():
        try:
            earlier = _read_arrays(directory / json.loads(lineage.read_text())["entry"])
        except (OSError, ValueError, KeyError, TypeError):
            earlier = None
    matched = None if earlier is None else match_rows(np.asarray(earlier[1]["row-hashes"]), hashes)
    if matched is None:
        if earlier is not None:
            logger.warning("%s: rows were removed or changed since the site's last group "
                           "table: its rows are grouped afresh", site.source)
        table, group_of_row = _fresh(site, min_size, directory)
        return table, group_of_row, hashes
    meta, kept = earlier
    n_kept = int(kept["counts"].shape[0])
    group_of_row = np.full(site.n_rows, -1, dtype=np.int64)
    group_of_row[matched] = kept["row-groups"]
    others = np.flatnonzero(group_of_row < 0)  # new rows, and rows that waited
    if others.size >= min_size:
        new = _grouped(site, min_size, others, directory)
        group_of_row[others] = np.where(new >= 0, new + n_kept, -1)
    n_new = max(int(group_of_row.max()) + 1 - n_kept if group_of_row.size else 0, 0)
    new_of_row = np.where(group_of_row >= n_kept, group_of_row - n_kept, -1)
    columns, order = group_stats.ordered(site.X, new_of_row, n_new, directory)
    group_of_row = np.where(group_of_row >= n_kept,
                            group_stats.relabel(new_of_row, order) + n_kept, group_of_row)
    # the earlier groups first, bit for bit, then the new ones in canonical order
    width = site.n_features
    if columns["present"] is not None or "present" in kept:
        columns["present"] = [group_stats.piece(kept["present"]) if "present" in kept else
                              group_stats.spread(group_stats.piece(kept["counts"]), width)] + \
            (columns["present"] or [group_stats.spread(columns["counts"][0], width)])
    for name in ("counts", "sums", "m2"):
        columns[name] = [group_stats.piece(kept[name])] + columns[name]
    table = group_stats.Table(columns, width, _labels_of_groups(site, group_of_row),
                              int(np.count_nonzero(group_of_row < 0)))
    logger.info("%s: the file grew; its %d earlier groups kept, %d new, %d rows waiting",
                site.source, n_kept, n_new, table.waiting)
    return table, group_of_row, hashes

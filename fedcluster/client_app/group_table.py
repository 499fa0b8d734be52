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

import hashlib
import json
import logging
import os
import weakref
from pathlib import Path

import numpy as np

from fedcluster.client_app import site_files
from fedcluster.client_app.grouping import group_rows
from fedcluster.client_app.site_data import SiteData, cache_sibling, release_pages, write_atomic
from fedcluster.client_app.site_groups import GroupLabels, SiteGroups
from fedcluster.common import scaling

logger = logging.getLogger(__name__)
GROUPS_FORMAT = "fedcluster-site-groups-v1"
#: Rows per chunk of the statistics pass (bounds its temporaries to CHUNK x d values).
CHUNK_ROWS = 1 << 16


# ------------------------------------------------------------------ statistics
def _label_codes(site: SiteData) -> tuple[np.ndarray, tuple[str, ...]] | None:
    """Each row's label as an index into the site's sorted distinct labels, and their text."""
    if site.labels is None:
        return None
    values, codes = np.unique(site.labels, return_inverse=True)
    names = tuple(str(site.label_names[v]) if site.label_names is not None else str(int(v))
                  for v in values)
    return codes.astype(np.int64), names


def group_statistics(X: np.ndarray, group_of_row: np.ndarray, n_groups: int):
    """Per group: ``(counts, sums, m2, present)`` of ``X``'s rows (``group_of_row``: each
    row's group, -1 for none), over present (non-NaN) cells; ``present`` None when no
    cell is missing. In chunks of whole groups, in row order within a group (so the same
    rows give the same bits)."""
    d = X.shape[1]
    order = np.argsort(group_of_row, kind="stable")
    order = order[group_of_row[order] >= 0]
    counts = np.bincount(group_of_row[order], minlength=n_groups).astype(np.int64)
    ends = np.cumsum(counts)
    sums, m2 = np.zeros((n_groups, d)), np.zeros((n_groups, d))
    present = np.zeros((n_groups, d), dtype=np.int64)
    any_missing = False
    g = 0
    while g < n_groups:
        # whole groups, about CHUNK_ROWS rows
        last = max(g + 1, int(np.searchsorted(ends, ends[g] - counts[g] + CHUNK_ROWS, "right")))
        last = min(last, n_groups)
        start = ends[g] - counts[g]
        rows = np.asarray(X[order[start:ends[last - 1]]], dtype=np.float64)
        offsets = (ends[g:last] - counts[g:last]) - start
        missing = np.isnan(rows)
        if missing.any():
            any_missing = True
            rows = np.where(missing, 0.0, rows)
        n_present = np.add.reduceat(~missing, offsets, axis=0)
        block_sums = np.add.reduceat(rows, offsets, axis=0)
        with np.errstate(invalid="ignore", divide="ignore"):
            block_means = np.where(n_present > 0, block_sums / np.maximum(n_present, 1), 0.0)
        deviation = rows - np.repeat(block_means, counts[g:last], axis=0)
        deviation[missing] = 0.0
        sums[g:last], present[g:last] = block_sums, n_present
        m2[g:last] = np.add.reduceat(deviation * deviation, offsets, axis=0)
        release_pages(X)
        g = last
    return counts, sums, m2, present if any_missing else None


def _labels_of_groups(codes: np.ndarray, names: tuple[str, ...], group_of_row: np.ndarray) -> GroupLabels:
    grouped = group_of_row >= 0
    key = group_of_row[grouped] * len(names) + codes[grouped]
    pairs, count = np.unique(key, return_counts=True)
    return GroupLabels(pairs // len(names), pairs % len(names), count.astype(np.int64), names)


def table_digest(counts, sums, m2, present, labels: GroupLabels | None, min_size: int) -> str:
    """sha256 of a group table: what the disclosure ledger names each reply by."""
    digest = hashlib.sha256(f"{GROUPS_FORMAT}\0{min_size}\0".encode())
    for part in (counts, sums, m2, present, *(() if labels is None else
                                               (labels.group, labels.code, labels.count))):
        if part is not None:
            digest.update(np.ascontiguousarray(part).tobytes())
    if labels is not None:
        digest.update(json.dumps(labels.names).encode())
    return digest.hexdigest()


def _groups(site: SiteData, min_size: int, counts, sums, m2, present, labels, waiting: int):
    return SiteGroups(counts, sums, m2, present, site.source, min_size,
                      table_digest(counts, sums, m2, present, labels, min_size),
                      site.feature_names, labels, site.table, waiting, site.fingerprint)


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


def _grouping_rows(site: SiteData, rows: np.ndarray | None = None) -> np.ndarray:
    """The rows the grouping sees: a missing cell at its feature's site mean (the
    grouping only decides who is with whom; the statistics keep the cell missing)."""
    X = site.X if rows is None else site.X[rows]
    if site.table is None or not site.table.has_missing:
        return X
    X = np.array(X, dtype=np.float64)
    missing = np.isnan(X)
    if missing.any():
        present = (~missing).sum(axis=0)
        means = np.where(missing, 0.0, X).sum(axis=0) / np.maximum(present, 1)
        X[missing] = means[np.nonzero(missing)[1]]
    return X


def canonical_order(group_of_row: np.ndarray, stats: tuple) -> tuple[np.ndarray, tuple]:
    """The groups renumbered in the order of their statistics (means, then counts, then
    spreads): the table then depends on the groups' statistics alone, not on where their
    rows sit in the file, so two sites whose groups have equal statistics hold equal
    tables (and send equal replies)."""
    counts, sums, m2, present = stats
    if counts.size == 0:
        return group_of_row, stats
    with np.errstate(invalid="ignore", divide="ignore"):
        means = sums / (counts[:, None] if present is None else np.maximum(present, 1))
    keys = [m2.sum(axis=1), counts, *means.T[::-1]]  # np.lexsort: the last key first
    order = np.lexsort(keys)
    new_id = np.empty_like(order)
    new_id[order] = np.arange(order.size)
    relabelled = np.where(group_of_row >= 0, new_id[np.maximum(group_of_row, 0)], -1)
    return relabelled, tuple(None if a is None else a[order] for a in stats)


def grouping_scale(X: np.ndarray) -> np.ndarray | None:
    """Per-feature multipliers of the distances the grouping measures: every feature
    weighted half as the rows are (its share of the total spread) and half as if
    standardised (its own spread), w_j = 1 / sum_l var_l + 1 / (d var_j). A run may cluster
    the rows as they are or standardised (``scale``), which the site cannot know when it
    groups: groups whose rows are close in both spaces serve both (measured: on wine,
    grouping as the rows are cost a standardised run 7% of its score, grouping
    standardised cost an unscaled run 14%; this weighting, under 1% either way)."""
    n, d = X.shape
    _, _, m2 = scaling.site_moments(X)
    var = m2 / n
    total = float(var.sum())
    if not total > 0:
        return None
    return np.sqrt(1.0 / total + np.where(var > 0, 1.0 / (d * np.where(var > 0, var, 1.0)), 0.0))


def build(site: SiteData, min_size: int, group_of_row: np.ndarray | None = None):
    """The group table of ``site`` and each row's group (-1: waiting). ``group_of_row``
    given: those groups (a grown file's), else the grouping's, in canonical order."""
    if group_of_row is None:
        rows = _grouping_rows(site)
        group_of_row = group_rows(rows, min_size, grouping_scale(rows) if min_size > 1 else None)
    n_groups = int(group_of_row.max()) + 1 if group_of_row.size else 0
    group_of_row, (counts, sums, m2, present) = canonical_order(
        group_of_row, group_statistics(site.X, group_of_row, n_groups))
    coded = _label_codes(site)
    labels = None if coded is None else _labels_of_groups(*coded, group_of_row)
    waiting = int(np.count_nonzero(group_of_row < 0))
    return _groups(site, min_size, counts, sums, m2, present, labels, waiting), group_of_row


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
            groups, group_of_row, hashes = _grow_or_group(site, min_size, directory)
            _write_entry(base, groups, group_of_row, hashes)
            site_files.replace_atomically(_lineage_path(directory, site, min_size),
                                          lambda out: out.write(json.dumps({"entry": key}).encode()))
            found = _read_entry(base, site)
    if found is None:
        raise OSError(f"the group table written to {base} cannot be read back")
    return found


def _write_entry(base: Path, groups: SiteGroups, group_of_row: np.ndarray, hashes: np.ndarray) -> None:
    labels = groups.labels
    parts = {"counts": groups.counts, "sums": groups.sums, "m2": groups.m2,
             "present": groups.present, "row-groups": group_of_row, "row-hashes": hashes,
             "labels": None if labels is None else np.stack([labels.group, labels.code, labels.count], 1)}
    for name, array in parts.items():
        if array is not None:
            write_atomic(cache_sibling(base, f".{name}.npy"),
                         lambda f, a=np.ascontiguousarray(array): np.save(f, a))
    meta = {"format": GROUPS_FORMAT, "min-size": groups.min_size, "digest": groups.digest,
            "waiting": groups.waiting, "has": [n for n, a in parts.items() if a is not None],
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
    groups = SiteGroups(parts["counts"], parts["sums"], parts["m2"], parts.get("present"),
                        site.source, int(meta["min-size"]), str(meta["digest"]), site.feature_names,
                        labels, site.table, int(meta["waiting"]), site.fingerprint)
    grouped = None if groups.waiting == 0 else np.asarray(parts["row-groups"]) >= 0
    return groups, grouped


# ------------------------------------------------------------------ growth
def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser (a bijection of uint64 that spreads every bit)."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


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
        bits = X[start:start + CHUNK_ROWS].view(np.uint64)
        a = np.full(bits.shape[0], 0x9E3779B97F4A7C15, dtype=np.uint64)
        b = np.full(bits.shape[0], 0xD1B54A32D192ED03, dtype=np.uint64)
        for j in range(d):
            a = _mix(a ^ bits[:, j])
            b = _mix(b + _mix(bits[:, j] ^ np.uint64(j + 1)))
        if label_bits is not None:
            a = _mix(a ^ label_bits[start:start + CHUNK_ROWS])
            b = _mix(b + label_bits[start:start + CHUNK_ROWS])
        out[start:start + bits.shape[0], 0], out[start:start + bits.shape[0], 1] = a, b
        release_pages(site.X)
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
    """(groups, each row's group, row hashes) of a new version of the file: the earlier
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
        groups, group_of_row = build(site, min_size)
        return groups, group_of_row, hashes
    meta, kept = earlier
    n_kept = int(kept["counts"].shape[0])
    group_of_row = np.full(site.n_rows, -1, dtype=np.int64)
    group_of_row[matched] = kept["row-groups"]
    others = np.flatnonzero(group_of_row < 0)  # new rows, and rows that waited
    if others.size >= min_size:
        rows = _grouping_rows(site, others)
        new = group_rows(rows, min_size, grouping_scale(rows))
        group_of_row[others] = np.where(new >= 0, new + n_kept, -1)
    n_new = int(group_of_row.max()) + 1 - n_kept if group_of_row.size else 0
    new_of_row = np.where(group_of_row >= n_kept, group_of_row - n_kept, -1)
    new_of_row, (counts, sums, m2, present) = canonical_order(
        new_of_row, group_statistics(site.X, new_of_row, max(n_new, 0)))
    group_of_row = np.where(new_of_row >= 0, new_of_row + n_kept, group_of_row)
    old_present = kept.get("present")
    if present is not None or old_present is not None:  # one side has missing cells
        full = lambda c: np.repeat(c[:, None], site.n_features, axis=1)  # noqa: E731
        present = np.concatenate([np.asarray(old_present) if old_present is not None
                                  else full(np.asarray(kept["counts"])),
                                  present if present is not None else full(counts)])
    coded = _label_codes(site)
    labels = None if coded is None else _labels_of_groups(*coded, group_of_row)
    groups = _groups(site, min_size, np.concatenate([kept["counts"], counts]),
                     np.concatenate([kept["sums"], sums]), np.concatenate([kept["m2"], m2]),
                     present, labels, int(np.count_nonzero(group_of_row < 0)))
    logger.info("%s: the file grew; its %d earlier groups kept, %d new, %d rows waiting",
                site.source, n_kept, max(n_new, 0), groups.waiting)
    return groups, group_of_row, hashes

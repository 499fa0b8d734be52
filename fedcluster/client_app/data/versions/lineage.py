"""A site's answered history, kept beside its data cache: every row instance and every
group it has ever made, and the group tables (versions) made of them.

One store per way of reading the data (``SiteData.reading``: the columns, label, id,
schema and units, not the file's path), in ``<cache-dir>/groups/store-<key>/``. A row is
an INSTANCE: its content (the bits of its cells and its label, ``row_keys.content_keys``)
or, where the data name an id column, its id and its content, so that a corrected row is
a new instance of the same row (same id). Rows alike in everything are told apart by
their order among themselves (the k-th such row of a version is the k-th instance).

The store holds:

- ``keys.npy`` (I, 2) uint64: each instance's key; ``ids.npy`` (I, 2): its id (with an id
  column); ``present.npy`` (I, ceil(d / 8)) uint8: its present cells, packed (when a cell
  of the data is missing); ``seen.npy`` (I, 4) int64: the first and last table of its
  lineage it was in, that lineage, and whether it was in every table between (a row that
  went and came back, or is in two lineages, was not: it may be another row's version);
- ``offsets.npy``, ``members.npy``: every group ever made, as the instances it holds
  (CSR), ``group-p.npy`` the p it was made for, ``unit.npy`` its spread unit (the
  smallest group number of the unit whose m2 its own shares: ``release/spreads.py``);
- ``cells.u16``: per instance, a 16-bit hash of each cell's bits (appended as instances
  come), and ``link.npy``: per instance, the earlier instance it may be a version of
  (-1: none): the same id, or without an id column the row that left that shares most
  cells with it (``links.py``). A cell whose bits a linked instance keeps is one VALUE
  across versions: what the versions audit protects (``release/versions_audit.py``);
- ``table-<n>.npy``: the groups of table n, in the table's order; ``store.json``: the
  tables' records (the group table entry each is kept as, its lineage, what the version
  kept, withdrew and held back) and the arrays' lengths (written last: arrays only grow,
  so a reader takes the first lengths), and the report partitions answered (per table
  its digest; the parts, groups in no table, and the features they carry);
  ``table-<n>-dropped.npy``: the groups of the rows ``drop-row`` dropped.

Every table counts as answered once made (``site check`` makes the version it shows, too):
no reply's tables need recording, and the audit can only be stricter for it.

A LINEAGE is a series of tables each built on the one before (``next_version.py``): a
version continues the lineage whose newest table holds most of its rows (a file exported
under a new name, or corrected, continues its lineage), and starts a new one when it
shares no row with any. The site's DP budget is kept per lineage.

Every write happens under the store's lock (``site_files.locked``), by the one process
that builds a version; a reader maps the arrays.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from fedcluster.client_app import site_files

__all__ = ["STORE_FORMAT", "Store", "TableRef"]

STORE_FORMAT = "fedcluster-lineage-v1"


@dataclass(frozen=True)
class TableRef:
    """Which table of which store a group table is (what a task's site knows of it).

    Attributes
    ----------
    store : str
        The store's directory.
    number : int
        The table's number in the store.
    lineage : str
        The lineage it continues (the key of the site's DP budget).
    """

    store: str
    number: int
    lineage: str


def _load(path: Path, rows: int, shape=(), dtype=np.int64) -> np.ndarray:
    """The first ``rows`` entries of an array file (an empty array when there is none)."""
    if rows == 0 or not path.exists():
        return np.zeros((0, *shape), dtype=dtype)
    return np.load(path, mmap_mode="r")[:rows]


class Store:
    """A site's answered history for one way of reading its data (module docstring).

    Open it with :meth:`open` under its lock; arrays are read lazily, appended in memory
    by :meth:`add_instances` / :meth:`add_groups` / :meth:`add_table`, and written by
    :meth:`save`.
    """

    def __init__(self, directory: Path, meta: dict) -> None:
        self.directory = directory
        self.meta = meta
        n_i, n_g, n_m = meta["instances"], meta["groups"], meta["members"]
        self.keys = np.array(_load(directory / "keys.npy", n_i, (2,), np.uint64))
        self.ids = np.array(_load(directory / "ids.npy", n_i, (2,), np.uint64)) \
            if meta.get("has-ids") else None
        self.present = np.array(_load(directory / "present.npy", n_i, (meta.get("present-bytes", 0),),
                                      np.uint8)) if meta.get("present-bytes") else None
        self.offsets = np.array(_load(directory / "offsets.npy", n_g + 1)) if n_g else \
            np.zeros(1, dtype=np.int64)
        self.members = np.array(_load(directory / "members.npy", n_m))
        self.group_p = np.array(_load(directory / "group-p.npy", n_g, (), np.int64))
        self.seen = np.array(_load(directory / "seen.npy", n_i, (4,), np.int64))
        # a store made before units and links: each group its own unit, no instance linked
        self.unit = np.array(_load(directory / "unit.npy", meta.get("units", 0), (), np.int64))
        if self.unit.size < n_g:
            self.unit = np.concatenate([self.unit, np.arange(self.unit.size, n_g, dtype=np.int64)])
        self.link = np.array(_load(directory / "link.npy", meta.get("links", 0), (), np.int64))
        if self.link.size < n_i:
            self.link = np.concatenate([self.link, np.full(n_i - self.link.size, -1, np.int64)])
        self.cell_width = int(meta.get("cell-width", 0))
        self._cells_known = int(meta.get("cells", 0))  # instances whose cell hashes are on disk
        self._new_cells: list[np.ndarray] = []
        self._tables: dict[int, np.ndarray] = {}
        self._dropped: dict[int, np.ndarray] = {}

    # ---------------------------------------------------------------- opening
    @classmethod
    def path_for(cls, cache_dir: Path, reading: str) -> Path:
        return Path(cache_dir) / "groups" / f"store-{reading[:40]}"

    @classmethod
    def open(cls, directory: Path) -> "Store":
        """The store in ``directory`` (an empty one when it has none yet).

        Raises
        ------
        OSError
            The directory cannot be read, or its ``store.json`` is not a store's (never
            overwritten then: it is the record of what the site has answered).
        """
        path = directory / "store.json"
        meta = {"format": STORE_FORMAT, "instances": 0, "groups": 0, "members": 0, "tables": []}
        if path.exists():
            try:
                meta = json.loads(path.read_text())
                if meta.get("format") != STORE_FORMAT:
                    raise ValueError(meta.get("format"))
            except (ValueError, TypeError, AttributeError) as err:
                raise OSError(f"{path} is not a fedcluster lineage store ({err}); move it away "
                              "only if the site's answered history may be lost") from None
        return cls(directory, meta)

    @staticmethod
    def read_tables(directory: Path) -> list[dict]:
        """The tables' records, read without the lock ([] when there is no store)."""
        try:
            return list(json.loads((Path(directory) / "store.json").read_text())["tables"])
        except (OSError, ValueError, KeyError, TypeError):
            return []

    # ---------------------------------------------------------------- reading
    @property
    def n_instances(self) -> int:
        return int(self.keys.shape[0])

    @property
    def n_groups(self) -> int:
        return int(self.offsets.size - 1)

    @property
    def tables(self) -> list[dict]:
        return self.meta["tables"]

    def table_groups(self, number: int, keep: bool = True) -> np.ndarray:
        """The groups of table ``number``, in its order (``keep=False``: read mapped and
        not kept in memory, for a pass over every table)."""
        if number not in self._tables:
            path = self.directory / f"table-{number}.npy"
            if not keep:
                return np.load(path, mmap_mode="r")
            self._tables[number] = np.array(np.load(path))
        return self._tables[number]

    def table_dropped(self, number: int) -> np.ndarray | None:
        """The groups of the rows ``drop-row`` dropped in table ``number``
        (``dropped_rows.py``), None when it dropped none."""
        if number not in self._dropped:
            path = self.directory / f"table-{number}-dropped.npy"
            self._dropped[number] = np.array(np.load(path)) if path.exists() else None
        return self._dropped[number]

    def members_of(self, groups: np.ndarray) -> list[np.ndarray]:
        return [self.members[self.offsets[g]:self.offsets[g + 1]] for g in np.asarray(groups).tolist()]

    def members_csr(self, groups: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(offsets, members) of ``groups`` alone, in their order."""
        groups = np.asarray(groups, dtype=np.int64)
        sizes = self.offsets[groups + 1] - self.offsets[groups]
        offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        index = np.repeat(self.offsets[groups] - offsets[:-1], sizes) + np.arange(int(offsets[-1]))
        return offsets, self.members[index]

    def disclosed_groups(self) -> np.ndarray:
        """Every group the store holds (a table's or a report's): each was answered from."""
        return np.arange(self.n_groups, dtype=np.int64)

    def heads(self) -> dict[str, dict]:
        """Each lineage's newest table."""
        return {record["lineage"]: record for record in self.tables}

    def lineage_tables(self, lineage: str) -> list[dict]:
        return [t for t in self.tables if t["lineage"] == lineage]

    # ---------------------------------------------------------------- matching rows
    def match(self, keys: np.ndarray, ids: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """Each row's instance (``keys``: the rows' keys, in file order), and which rows
        are new instances (appended to the store in memory, in file order). The k-th row
        of a key in file order is the k-th instance of that key in the store."""
        keys = np.ascontiguousarray(keys, dtype=np.uint64)
        known, known_occ = self.keys, _occurrence(self.keys)
        row_occ = _occurrence(keys)
        known_hash, row_hash = _triple_hash(known, known_occ), _triple_hash(keys, row_occ)
        order = np.argsort(known_hash, kind="stable")
        at = np.minimum(np.searchsorted(known_hash[order], row_hash), max(known.shape[0] - 1, 0))
        candidate = order[at] if known.shape[0] else np.zeros(keys.shape[0], dtype=np.int64)
        found = np.zeros(keys.shape[0], dtype=bool)
        if known.shape[0]:
            found = (known_hash[candidate] == row_hash) & (known[candidate] == keys).all(axis=1) \
                & (known_occ[candidate] == row_occ)
        instance = np.where(found, candidate, -1)
        fresh = np.flatnonzero(~found)
        instance[fresh] = self.n_instances + np.arange(fresh.size)
        self.keys = np.concatenate([self.keys, keys[fresh]])
        self.link = np.concatenate([self.link, np.full(fresh.size, -1, dtype=np.int64)])
        self.seen = np.concatenate([self.seen, np.tile(np.array([-1, -1, -1, 1]), (fresh.size, 1))])
        if ids is not None:
            start = self.ids if self.ids is not None else np.zeros((self.n_instances - fresh.size, 2),
                                                                   dtype=np.uint64)
            self.ids = np.concatenate([start, np.asarray(ids, dtype=np.uint64)[fresh]])
        return instance.astype(np.int64), ~found

    def add_present(self, instances: np.ndarray, present: np.ndarray) -> None:
        """Record the present cells (``present``: (n, d) bool) of new ``instances``."""
        packed = np.packbits(np.asarray(present, dtype=bool), axis=1)
        if self.present is None:
            self.present = np.ones((self.n_instances, packed.shape[1]), dtype=np.uint8) * 255
        if self.present.shape[0] < self.n_instances:
            grow = np.full((self.n_instances - self.present.shape[0], packed.shape[1]), 255, np.uint8)
            self.present = np.concatenate([self.present, grow])
        self.present[instances] = packed

    def present_cells(self, instances: np.ndarray, width: int) -> np.ndarray:
        """(n, width) bool: the instances' present cells (all True without a record)."""
        if self.present is None:
            return np.ones((len(instances), width), dtype=bool)
        return np.unpackbits(self.present[instances], axis=1, count=width).astype(bool)

    # ---------------------------------------------------------------- cells and links
    def add_cell_hashes(self, hashes: np.ndarray) -> None:
        """Record the cell hashes ((n, d) uint16) of the instances appended last, in order
        (those without a record so far: every instance before them has one)."""
        hashes = np.asarray(hashes, dtype=np.uint16)
        if self.cell_width == 0:
            self.cell_width = int(hashes.shape[1])
        if hashes.shape[1] != self.cell_width:  # a table of another width (another lineage)
            fitted = np.zeros((hashes.shape[0], self.cell_width), dtype=np.uint16)
            width = min(self.cell_width, hashes.shape[1])
            fitted[:, :width] = hashes[:, :width]
            hashes = fitted
        self._new_cells.append(hashes)

    def _cells_on_disk(self) -> np.ndarray:
        path = self.directory / "cells.u16"
        if self._cells_known == 0 or not path.exists():
            return np.zeros((0, max(self.cell_width, 1)), dtype=np.uint16)
        return np.memmap(path, dtype=np.uint16, mode="r", shape=(self._cells_known, self.cell_width))

    @property
    def n_cell_records(self) -> int:
        return self._cells_known + sum(len(h) for h in self._new_cells)

    def cell_hashes(self, instances: np.ndarray) -> np.ndarray:
        """(n, d) uint16: the instances' cell hashes (0 for an instance without a record:
        one a store made before them knew, which then matches nothing but by chance)."""
        instances = np.asarray(instances, dtype=np.int64)
        out = np.zeros((instances.size, max(self.cell_width, 1)), dtype=np.uint16)
        disk = self._cells_on_disk()
        known = instances < self._cells_known
        if known.any():
            out[known] = disk[instances[known]]
        if self._new_cells:
            fresh = np.concatenate(self._new_cells)
            later = (instances >= self._cells_known) & (instances < self.n_cell_records)
            out[later] = fresh[instances[later] - self._cells_known]
        return out

    def set_links(self, instances: np.ndarray, earlier: np.ndarray) -> None:
        """``instances`` may be versions of ``earlier`` (each to one)."""
        if self.link.size < self.n_instances:
            self.link = np.concatenate([self.link, np.full(self.n_instances - self.link.size, -1,
                                                           np.int64)])
        self.link[np.asarray(instances, dtype=np.int64)] = np.asarray(earlier, dtype=np.int64)

    def set_units(self, groups: np.ndarray, units: np.ndarray) -> None:
        """The spread units of ``groups`` (store numbers; each group's unit named by a
        group of it)."""
        self.unit[np.asarray(groups, dtype=np.int64)] = np.asarray(units, dtype=np.int64)

    def lineage_code(self, name: str) -> int:
        """The number of lineage ``name`` in this store (a new one is added)."""
        names = self.meta.setdefault("lineages", [])
        if name not in names:
            names.append(name)
        return names.index(name)

    def see(self, instances: np.ndarray, table: int, lineage: int, base: int | None) -> None:
        """Record that ``instances`` (the rows of a version) are in table ``table`` of
        ``lineage``, built on table ``base`` (None: none). An instance stays continuous
        while it is in each table of its lineage; one absent from the base (it went and
        came back) or first seen in another lineage is continuous no more."""
        rows = self.seen[instances]
        new = rows[:, 0] < 0
        rows[new] = (table, table, lineage, 1)
        old = ~new
        if base is None:
            gap = old
        else:
            gap = old & ((rows[:, 2] != lineage) | (rows[:, 1] != base))
        rows[gap, 3] = 0
        rows[old, 1] = table
        self.seen[instances] = rows

    def same_row(self):
        """Whether two instances may be two versions of one row: the same id; with no id
        column, any two that were not both in one table (a row has one version at a
        time), as far as :meth:`see` can tell."""
        if self.ids is not None:
            ids = self.ids
            return lambda u, w: bool((ids[u] == ids[w]).all())
        seen = self.seen

        def same_row(u, w):
            a, b = seen[u], seen[w]
            coexisted = a[3] and b[3] and a[2] == b[2] and a[0] <= b[1] and b[0] <= a[1]
            return not coexisted
        return same_row

    # ---------------------------------------------------------------- growing
    def add_groups(self, groups, min_size: int) -> np.ndarray:
        """Append groups (``next_version.GroupMembers``: their instances); their numbers."""
        first = self.n_groups
        sizes = np.diff(groups.offsets)
        self.offsets = np.concatenate([self.offsets, self.offsets[-1] + np.cumsum(sizes)])
        if sizes.size:
            self.members = np.concatenate([self.members, groups.members]).astype(np.int64)
        self.group_p = np.concatenate([self.group_p, np.full(sizes.size, min_size, dtype=np.int64)])
        numbers = np.arange(first, self.n_groups, dtype=np.int64)
        self.unit = np.concatenate([self.unit, numbers])  # each its own until set_units
        return numbers

    def add_report(self, table: int, digest: str, parts: list[np.ndarray], min_size: int,
                   carried=()) -> None:
        """Record the report's parts of table ``table`` (its one partition, ``digest``) as
        answered groups (spreads derived: no unit; ``carried``: (d,) the features they
        carry, ``value_audit.recorded_carried``), and save: audits count them."""
        offsets = np.concatenate([[0], np.cumsum([part.size for part in parts])]).astype(np.int64)
        numbers = self.add_groups(SimpleNamespace(offsets=offsets, members=np.concatenate(parts)), min_size)
        self.set_units(numbers, np.full(numbers.size, -1))
        self.meta.setdefault("reports", {})[str(table)] = digest
        self.meta.setdefault("report-groups", []).append(
            [int(numbers[0]), int(numbers[-1]) + 1, np.flatnonzero(carried).tolist()])
        self.save()

    def report_group_mask(self) -> np.ndarray:
        """(groups,) bool: the groups reports added (in no table)."""
        mask = np.zeros(self.n_groups, dtype=bool)
        for first, stop, *_ in self.meta.get("report-groups", []):
            mask[first:stop] = True
        return mask

    def add_table(self, groups: np.ndarray, record: dict, dropped: np.ndarray | None = None) -> int:
        """Append a table (its groups in order, its dropped rows' groups) and its record;
        its number."""
        number = len(self.tables)
        self._tables[number] = np.asarray(groups, dtype=np.int64)
        self._dropped[number] = dropped if dropped is not None and len(dropped) else None
        self.tables.append({**record, "n": number, "made": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
        return number

    def save(self) -> None:
        """Write what changed: the arrays, then ``store.json`` (the lengths it names are
        the store; arrays only grow, so a crash in between leaves a valid store)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        files = {"keys.npy": self.keys, "offsets.npy": self.offsets, "members.npy": self.members,
                 "group-p.npy": self.group_p, "seen.npy": self.seen, "unit.npy": self.unit,
                 "link.npy": self.link}
        if self.ids is not None:
            files["ids.npy"] = self.ids
        if self.present is not None:
            files["present.npy"] = self.present
        for number, groups in self._tables.items():
            if not (self.directory / f"table-{number}.npy").exists():
                files[f"table-{number}.npy"] = groups
                if self._dropped.get(number) is not None:
                    files[f"table-{number}-dropped.npy"] = self._dropped[number]
        for name, array in files.items():
            site_files.replace_atomically(self.directory / name,
                                          lambda out, a=np.ascontiguousarray(array): np.save(out, a))
        if self._new_cells:  # appended past the recorded length (a crash's tail cut first)
            path = self.directory / "cells.u16"
            with open(path, "ab") as out:
                out.truncate(self._cells_known * self.cell_width * 2)
                for block in self._new_cells:
                    out.write(np.ascontiguousarray(block, dtype=np.uint16).tobytes())
                out.flush()
                os.fsync(out.fileno())
            self._cells_known, self._new_cells = self.n_cell_records, []
        self.meta.update({"instances": self.n_instances, "groups": self.n_groups,
                          "members": int(self.members.size), "has-ids": self.ids is not None,
                          "present-bytes": 0 if self.present is None else int(self.present.shape[1]),
                          "units": int(self.unit.size), "links": int(self.link.size),
                          "cells": self._cells_known, "cell-width": self.cell_width})
        self.write_meta()

    def write_meta(self) -> None:
        site_files.replace_atomically(self.directory / "store.json",
                                      lambda out: out.write(json.dumps(self.meta, indent=1).encode()))


def _occurrence(keys: np.ndarray) -> np.ndarray:
    """Each row's rank among the rows with its key, in order (0 for the first)."""
    n = keys.shape[0]
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    order = np.lexsort((keys[:, 1], keys[:, 0]))  # stable: ties stay in order
    ordered = keys[order]
    first = np.ones(n, dtype=bool)
    first[1:] = (ordered[1:] != ordered[:-1]).any(axis=1)
    index = np.arange(n)
    rank = np.empty(n, dtype=np.int64)
    rank[order] = index - np.maximum.accumulate(np.where(first, index, 0))
    return rank


def _triple_hash(keys: np.ndarray, occurrence: np.ndarray) -> np.ndarray:
    """One 64-bit hash of (key, occurrence) to sort and search by (a match is then checked
    on the key and the occurrence themselves)."""
    from fedcluster.client_app.data.group_stats import mix

    if keys.shape[0] == 0:
        return np.zeros(0, dtype=np.uint64)
    return mix(keys[:, 0] ^ mix(keys[:, 1] + mix(occurrence.astype(np.uint64) + np.uint64(1))))

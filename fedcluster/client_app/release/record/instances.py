"""The record's row instances (``store.py``'s mixin): which instance each row of a
version is, its present cells, its cells' 16-bit hashes, the links between versions of
one row, and in which tables of which lineage it was seen.

A row is an INSTANCE: its content (the bits of its cells and its label,
``data/versions/row_keys.content_keys``) or, where the data name an id column, its id and
its content, so that a corrected row is a new instance of the same row (same id). Rows
alike in everything are told apart by their order among themselves (the k-th such row of
a version is the k-th instance). The record keeps no cell's value: a key, a hash of 16
bits per cell (enough to tell which cells a later version keeps, not to read any), which
cells are present.
"""

from __future__ import annotations

import numpy as np

from fedcluster.client_app import site_files

__all__ = ["Instances", "SameRow", "mix"]


def mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser (a bijection of uint64 that spreads every bit)."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


class Instances:
    """The instance arrays of a :class:`~fedcluster.client_app.release.record.store.Store`
    (``keys``, ``ids``, ``present``, ``seen``, ``link``, the cell hashes) and what reads
    and grows them."""

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
        (those without a record so far: every instance before them has one). A store kept
        in a directory writes them at once past the length ``store.json`` names (a
        version's are 128 MB at 1,000,000 x 64, not held through its build); ``save``
        makes them part of the store (a crash's tail is cut before the next are written)."""
        hashes = np.asarray(hashes, dtype=np.uint16)
        if self.cell_width == 0:
            self.cell_width = int(hashes.shape[1])
        if hashes.shape[1] != self.cell_width:  # a table of another width (another lineage)
            fitted = np.zeros((hashes.shape[0], self.cell_width), dtype=np.uint16)
            width = min(self.cell_width, hashes.shape[1])
            fitted[:, :width] = hashes[:, :width]
            hashes = fitted
        if self.directory is None:
            self._new_cells.append(hashes)
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        with open(self.directory / "cells.u16", "ab") as out:
            out.truncate((self._cells_known + self._cells_pending) * self.cell_width * 2)
            site_files.write_pieces(out, np.ascontiguousarray(hashes))
        self._cells_pending += hashes.shape[0]

    def _cells_on_disk(self) -> np.ndarray:
        path = None if self.directory is None else self.directory / "cells.u16"
        rows = self._cells_known + self._cells_pending
        if rows == 0 or path is None or not path.exists():
            return np.zeros((0, max(self.cell_width, 1)), dtype=np.uint16)
        return np.memmap(path, dtype=np.uint16, mode="r", shape=(rows, self.cell_width))

    @property
    def n_cell_records(self) -> int:
        return self._cells_known + self._cells_pending + sum(len(h) for h in self._new_cells)

    def cell_hashes(self, instances: np.ndarray) -> np.ndarray:
        """(n, d) uint16: the instances' cell hashes (0 for an instance without a record:
        one a store made before them knew, which then matches nothing but by chance)."""
        instances = np.asarray(instances, dtype=np.int64)
        out = np.zeros((instances.size, max(self.cell_width, 1)), dtype=np.uint16)
        disk = self._cells_on_disk()
        known = instances < disk.shape[0]
        if known.any():
            out[known] = disk[instances[known]]
        if self._new_cells:
            fresh = np.concatenate(self._new_cells)
            later = (instances >= disk.shape[0]) & (instances < self.n_cell_records)
            out[later] = fresh[instances[later] - disk.shape[0]]
        return out

    def set_links(self, instances: np.ndarray, earlier: np.ndarray) -> None:
        """``instances`` may be versions of ``earlier`` (each to one)."""
        if self.link.size < self.n_instances:
            self.link = np.concatenate([self.link, np.full(self.n_instances - self.link.size, -1,
                                                           np.int64)])
        self.link[np.asarray(instances, dtype=np.int64)] = np.asarray(earlier, dtype=np.int64)

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

    def same_row(self) -> "SameRow":
        """Whether two instances may be two versions of one row: the same id; with no id
        column, any two that were not both in one table (a row has one version at a
        time), as far as :meth:`see` can tell."""
        return SameRow(self.ids, self.seen)


class SameRow:
    """``(u, w) -> bool``: whether two instances may be versions of one row
    (:meth:`Instances.same_row`), and :meth:`any_pair` over many at once."""

    def __init__(self, ids, seen) -> None:
        self.ids, self.seen = ids, seen

    def __call__(self, u: int, w: int) -> bool:
        if self.ids is not None:
            return bool((self.ids[u] == self.ids[w]).all())
        a, b = self.seen[u], self.seen[w]
        coexisted = a[3] and b[3] and a[2] == b[2] and a[0] <= b[1] and b[0] <= a[1]
        return not coexisted

    def any_pair(self, instances: np.ndarray) -> bool:
        """Whether some two of ``instances`` may be versions of one row, in one pass:
        two equal ids; else two not both seen in one lineage's table, which is two
        instances without such a record, two lineages, or two table intervals apart
        (intervals on a line all meet exactly where the latest first table is at most
        the earliest last one)."""
        instances = np.unique(np.asarray(instances, dtype=np.int64))
        if instances.size < 2:
            return False
        if self.ids is not None:
            ids = np.asarray(self.ids[instances])
            return bool(np.unique(ids.reshape(ids.shape[0], -1), axis=0).shape[0] < ids.shape[0])
        rows = np.asarray(self.seen[instances])
        if not rows[:, 3].all() or np.unique(rows[:, 2]).size > 1:
            return True
        return bool(rows[:, 0].max() > rows[:, 1].min())

    def pairs_in_parts(self, instances: np.ndarray, parts: np.ndarray, n_parts: int) -> np.ndarray:
        """(n_parts,) bool: :meth:`any_pair` of each part's instances (``parts``: each
        instance's, 0..n_parts-1), every part in one pass."""
        instances, parts = np.asarray(instances, dtype=np.int64), np.asarray(parts, dtype=np.int64)
        pair = np.zeros(n_parts, dtype=bool)
        if instances.size < 2:
            return pair
        order = np.lexsort((instances, parts))
        instances, parts = instances[order], parts[order]
        distinct = np.r_[True, (instances[1:] != instances[:-1]) | (parts[1:] != parts[:-1])]
        instances, parts = instances[distinct], parts[distinct]
        if self.ids is not None:  # two equal ids within a part
            ids = np.asarray(self.ids[instances]).reshape(instances.size, -1)
            order = np.lexsort((*ids.T[::-1], parts))
            ids, owner = ids[order], parts[order]
            same = (owner[1:] == owner[:-1]) & (ids[1:] == ids[:-1]).all(axis=1)
            pair[owner[1:][same]] = True
            return pair
        rows = np.asarray(self.seen[instances])
        starts = np.flatnonzero(np.r_[True, parts[1:] != parts[:-1]])
        owner = parts[starts]
        many = np.diff(np.r_[starts, parts.size]) >= 2
        unknown = np.add.reduceat((~rows[:, 3].astype(bool)).astype(np.int64), starts) > 0
        lineages = (np.minimum.reduceat(rows[:, 2], starts)
                    != np.maximum.reduceat(rows[:, 2], starts))
        apart = np.maximum.reduceat(rows[:, 0], starts) > np.minimum.reduceat(rows[:, 1], starts)
        pair[owner] = many & (unknown | lineages | apart)
        return pair


def _occurrence(keys: np.ndarray) -> np.ndarray:
    """Each row's rank among the rows with its key, in order (0 for the first)."""
    n = keys.shape[0]
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    # Stable on the first word alone: ties stay in order, and rows sharing a first word
    # share the second too (the same content) unless 64 bits collide, which the check
    # below catches and answers with the full two-word sort.
    order = np.argsort(keys[:, 0], kind="stable")
    ordered = keys[order]
    same_first = ordered[1:, 0] == ordered[:-1, 0]
    if (same_first & (ordered[1:, 1] != ordered[:-1, 1])).any():
        order = np.lexsort((keys[:, 1], keys[:, 0]))
        ordered = keys[order]
        same_first = (ordered[1:] == ordered[:-1]).all(axis=1)
    first = np.ones(n, dtype=bool)
    first[1:] = ~same_first
    index = np.arange(n)
    rank = np.empty(n, dtype=np.int64)
    rank[order] = index - np.maximum.accumulate(np.where(first, index, 0))
    return rank


def _triple_hash(keys: np.ndarray, occurrence: np.ndarray) -> np.ndarray:
    """One 64-bit hash of (key, occurrence) to sort and search by (a match is then checked
    on the key and the occurrence themselves)."""
    if keys.shape[0] == 0:
        return np.zeros(0, dtype=np.uint64)
    return mix(keys[:, 0] ^ mix(keys[:, 1] + mix(occurrence.astype(np.uint64) + np.uint64(1))))

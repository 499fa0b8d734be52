"""A site's RECORD: everything it has released values from, kept with its data's lineage
beside its data cache (``<cache-dir>/groups/store-<key>/``), or, for data held in memory,
in the process (:meth:`Store.in_memory`).

What a released value is a function of: every group of rows the site ever answered from
(a version's group table, a report partition's parts), as the row INSTANCES it holds
(``instances.py``: a row by its stable key, never its values), each group's spread unit
(whose sum of squares its m2 shares), and where its sum of a feature is not its rows' sum
but a STAND-IN (the p% rule's, a report's carried feature, a protected cell's). One store
per reading of the data (``SiteData.reading``: the columns, label, id, schema and units the
site's node config gives, never a run's parameter), whatever the file is called.

The store holds:

- ``keys.npy`` (I, 2) uint64: each instance's key; ``ids.npy`` (I, 2): its id (with an id
  column); ``present.npy`` (I, ceil(d / 8)) uint8: its present cells, packed (when a cell
  of the data is missing); ``seen.npy`` (I, 4) int64: the first and last table of its
  lineage it was in, that lineage, and whether it was in every table between;
  ``cells.u16``: per instance, a 16-bit hash of each cell's bits (a version's written
  when made, past the length ``store.json`` names until saved); ``link.npy``: per
  instance, the earlier instance it may be a version of (``instances.py``);
- ``offsets.npy``, ``members.npy``: every group ever made, as the instances it holds
  (CSR), ``group-p.npy`` the p it was made for, ``unit.npy`` its spread unit (the
  smallest group number of the unit whose m2 its own shares: ``release/spreads.py``; -1:
  none, a report's part, whose spread is derived from released figures);
- ``stand-ins.npy`` (S, 3): (group, feature, kind) where the group's released sum is a
  stand-in (:data:`FLAGGED`, :data:`CARRIED`, :data:`FORCED`): it reports no value of its
  rows there, and a FLAGGED group's cells are protected from every later sum;
- ``table-<n>.npy``: the groups of table n, in the table's order; ``store.json``: the
  tables' records (the group table entry each is kept as, its lineage, what the version
  kept, withdrew and held back) and the arrays' lengths (written last: arrays only grow,
  so a reader takes the first lengths), and the report partitions answered (per table
  the digests of its partitions; their parts are groups in no table);
  ``table-<n>-dropped.npy``: the groups of the rows ``drop-row`` dropped.

Every table counts as answered once made (``site check`` makes the version it shows, too),
and a report's parts once the release step admits them (``release/gate.py``): the record
only grows, and the audit (``release/audit``) judges every new group with all of it.

A LINEAGE is a series of tables each built on the one before (``data/versions``): a
version continues the lineage whose newest table holds most of its rows (a file exported
under a new name, or corrected, continues its lineage), and starts a new one when it
shares no row with any. The site's DP budget is kept per lineage.

Every write happens under the store's lock (``site_files.locked``: the version's builder,
the release step's admission of a report); a reader maps the arrays.
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
from fedcluster.client_app.release.record.instances import Instances

__all__ = ["CARRIED", "FLAGGED", "FORCED", "STORE_FORMAT", "Store", "TableRef"]

STORE_FORMAT = "fedcluster-lineage-v1"
#: The kinds of a recorded stand-in (``stand-ins.npy``: group, feature, kind): the p% rule
#: on means FLAGGED the group (its cells are protected: no later sum may hold one); a
#: report's part CARRIED the feature at a stood-in mean; the group holds a protected cell
#: and is FORCED to a stand-in there.
FLAGGED, CARRIED, FORCED = 0, 1, 2


@dataclass(frozen=True)
class TableRef:
    """Which table of which store a group table is (what a task's site knows of it).

    Attributes
    ----------
    store : str
        The store's directory.
    number : int
        The table's number in the store.
    lineage : str or None
        The lineage it continues (the key of the site's DP budget; None: data held in
        memory).
    partition : str or None
        A report's table: the digest of the partition of table ``number`` it answers from
        (its parts in the record).
    """

    store: str
    number: int
    lineage: str | None
    partition: str | None = None


def _load(path: Path | None, rows: int, shape=(), dtype=np.int64) -> np.ndarray:
    """The first ``rows`` entries of an array file (an empty array when there is none)."""
    if rows == 0 or path is None or not path.exists():
        return np.zeros((0, *shape), dtype=dtype)
    return np.load(path, mmap_mode="r")[:rows]


class Store(Instances):
    """A site's record for one reading of its data (module docstring).

    Open it with :meth:`open` under its lock; arrays are read lazily, appended in memory
    by :meth:`match` / :meth:`add_groups` / :meth:`add_table` / :meth:`add_report`, and
    written by :meth:`save` (a store :meth:`in_memory` writes nothing).
    """

    def __init__(self, directory: Path | None, meta: dict) -> None:
        self.directory = directory
        self.meta = meta

        def at(name):
            return None if directory is None else directory / name
        n_i, n_g, n_m = meta["instances"], meta["groups"], meta["members"]
        self.keys = np.array(_load(at("keys.npy"), n_i, (2,), np.uint64))
        self.ids = np.array(_load(at("ids.npy"), n_i, (2,), np.uint64)) \
            if meta.get("has-ids") else None
        self.present = np.array(_load(at("present.npy"), n_i, (meta.get("present-bytes", 0),),
                                      np.uint8)) if meta.get("present-bytes") else None
        self.offsets = np.array(_load(at("offsets.npy"), n_g + 1)) if n_g else \
            np.zeros(1, dtype=np.int64)
        self.members = np.array(_load(at("members.npy"), n_m))
        self.group_p = np.array(_load(at("group-p.npy"), n_g, (), np.int64))
        self.seen = np.array(_load(at("seen.npy"), n_i, (4,), np.int64))
        # a store made before units and links: each group its own unit, no instance linked
        self.unit = np.array(_load(at("unit.npy"), meta.get("units", 0), (), np.int64))
        if self.unit.size < n_g:
            self.unit = np.concatenate([self.unit, np.arange(self.unit.size, n_g, dtype=np.int64)])
        self.link = np.array(_load(at("link.npy"), meta.get("links", 0), (), np.int64))
        if self.link.size < n_i:
            self.link = np.concatenate([self.link, np.full(n_i - self.link.size, -1, np.int64)])
        self.stand_ins = np.array(_load(at("stand-ins.npy"), meta.get("stand-ins", 0), (3,),
                                        np.int64))
        if "stand-ins" not in meta:  # a store made before stand-ins: its reports' carried ones
            for first, stop, *carried in meta.get("report-groups", []):
                for feature in (carried[0] if carried else []):
                    rows = np.stack([np.arange(first, stop), np.full(stop - first, feature),
                                     np.full(stop - first, CARRIED)], axis=1)
                    self.stand_ins = np.concatenate([self.stand_ins, rows.astype(np.int64)])
        self.cell_width = int(meta.get("cell-width", 0))
        self._cells_known = int(meta.get("cells", 0))  # instances whose cell hashes are on disk
        self._cells_pending = 0  # written past them, recorded by the next save
        self._new_cells: list[np.ndarray] = []  # (a store in memory's)
        self._tables: dict[int, np.ndarray] = {}
        self._dropped: dict[int, np.ndarray] = {}

    # ---------------------------------------------------------------- opening
    @classmethod
    def path_for(cls, cache_dir: Path, reading: str) -> Path:
        return Path(cache_dir) / "groups" / f"store-{reading[:40]}"

    @classmethod
    def in_memory(cls) -> "Store":
        """An empty record kept in this process only (data held in memory)."""
        return cls(None, {"format": STORE_FORMAT, "instances": 0, "groups": 0, "members": 0,
                          "tables": []})

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
        return list(Store.read_meta(directory).get("tables", []))

    @staticmethod
    def read_meta(directory: Path) -> dict:
        """``store.json``, read without the lock ({} when there is no store)."""
        try:
            meta = json.loads((Path(directory) / "store.json").read_text())
            return meta if isinstance(meta, dict) else {}
        except (OSError, ValueError, TypeError):
            return {}

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

    def set_units(self, groups: np.ndarray, units: np.ndarray) -> None:
        """The spread units of ``groups`` (store numbers; each group's unit named by a
        group of it)."""
        self.unit[np.asarray(groups, dtype=np.int64)] = np.asarray(units, dtype=np.int64)

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
                   carried=(), whole=(), snapped=()) -> np.ndarray:
        """Record a report partition of table ``table`` (``digest``) as answered groups:
        its parts (instances; spreads derived: no unit; ``carried``: (d,) the features they
        carry at a stood-in mean, recorded as :data:`CARRIED` stand-ins; ``whole``: the
        table's groups the release step kept whole in it; ``snapped``: the rows it moved
        with an earlier part). A table may have any number of
        partitions: each is judged with all the others. Their numbers."""
        offsets = np.concatenate([[0], np.cumsum([part.size for part in parts])]).astype(np.int64)
        numbers = self.add_groups(SimpleNamespace(offsets=offsets, members=np.concatenate(parts)), min_size)
        self.set_units(numbers, np.full(numbers.size, -1))
        self.meta.setdefault("reports", {})[str(table)] = self.reports_of(table) + [
            {"digest": digest, "min-size": int(min_size),
             "whole": np.asarray(whole, dtype=np.int64).tolist(),
             "snapped": np.asarray(snapped, dtype=np.int64).tolist(),
             "parts": [int(numbers[0]), int(numbers[-1]) + 1]}]
        features = np.flatnonzero(np.asarray(carried, dtype=bool)).tolist()
        self.meta.setdefault("report-groups", []).append([int(numbers[0]), int(numbers[-1]) + 1, features])
        self.add_stand_ins(np.repeat(numbers, len(features)), np.tile(features, numbers.size), CARRIED)
        return numbers

    def reports_of(self, table: int) -> list[dict]:
        """The report partitions answered of table ``table``: each its ``digest`` and the
        groups kept ``whole`` in it (a store before several partitions: one, a digest)."""
        known = self.meta.get("reports", {}).get(str(table))
        known = [] if known is None else [known] if isinstance(known, str) else list(known)
        return [{"digest": k, "whole": []} if isinstance(k, str) else dict(k) for k in known]

    def beside(self, instances) -> np.ndarray:
        """The instances of every report part that holds one of ``instances`` (what a
        coarser partition keeps apart from them)."""
        parts = np.flatnonzero(self.report_group_mask())
        if parts.size == 0:
            return np.zeros(0, dtype=np.int64)
        offsets, members = self.members_csr(parts)
        owner = np.repeat(np.arange(parts.size), np.diff(offsets))
        holding = np.unique(owner[np.isin(members, instances)])
        return np.unique(members[np.isin(owner, holding)])

    def report_group_mask(self) -> np.ndarray:
        """(groups,) bool: the groups reports added (in no table)."""
        mask = np.zeros(self.n_groups, dtype=bool)
        for first, stop, *_ in self.meta.get("report-groups", []):
            mask[first:stop] = True
        return mask

    # ---------------------------------------------------------------- stand-ins
    def add_stand_ins(self, groups, features, kind: int) -> None:
        """Record that ``groups``' sums of ``features`` (pairwise) are no sums of their
        rows' cells but stand-ins (``kind``: :data:`FLAGGED`, :data:`CARRIED`,
        :data:`FORCED`)."""
        groups = np.asarray(groups, dtype=np.int64).ravel()
        if groups.size == 0:
            return
        rows = np.stack([groups, np.asarray(features, dtype=np.int64).ravel(),
                         np.full(groups.size, kind, dtype=np.int64)], axis=1)
        self.stand_ins = np.unique(np.concatenate([self.stand_ins, rows]), axis=0)

    def stood_in(self, width: int, kinds=(0, 1, 2)) -> np.ndarray:
        """(groups, width) bool: per group, the features whose released sum is a stand-in
        of one of ``kinds`` (it reports no value of its rows there)."""
        out = np.zeros((self.n_groups, width), dtype=bool)
        pick = np.isin(self.stand_ins[:, 2], kinds) & (self.stand_ins[:, 1] < width) \
            & (self.stand_ins[:, 0] < self.n_groups)
        out[self.stand_ins[pick, 0], self.stand_ins[pick, 1]] = True
        return out

    def protected(self, width: int) -> np.ndarray:
        """(instances, width) bool: the cells the p% rule withheld (every cell of a group
        it FLAGGED in that feature): no later sum may hold one (``release/audit``)."""
        out = np.zeros((self.n_instances, width), dtype=bool)
        flagged = self.stand_ins[(self.stand_ins[:, 2] == FLAGGED) & (self.stand_ins[:, 1] < width)]
        for group, feature in flagged[:, :2].tolist():
            out[self.members[self.offsets[group]:self.offsets[group + 1]], feature] = True
        return out

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
        the store; arrays only grow, so a crash in between leaves a valid store). A store
        in memory keeps its arrays where they are."""
        if self.directory is None:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        files = {"keys.npy": self.keys, "offsets.npy": self.offsets, "members.npy": self.members,
                 "group-p.npy": self.group_p, "seen.npy": self.seen, "unit.npy": self.unit,
                 "link.npy": self.link, "stand-ins.npy": self.stand_ins}
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
        if self._cells_pending:  # written past the recorded length (add_cell_hashes)
            with open(self.directory / "cells.u16", "ab") as out:
                os.fsync(out.fileno())
            self._cells_known, self._cells_pending = self._cells_known + self._cells_pending, 0
        self.meta.update({"instances": self.n_instances, "groups": self.n_groups,
                          "members": int(self.members.size), "has-ids": self.ids is not None,
                          "present-bytes": 0 if self.present is None else int(self.present.shape[1]),
                          "units": int(self.unit.size), "links": int(self.link.size),
                          "cells": self._cells_known, "cell-width": self.cell_width,
                          "stand-ins": int(self.stand_ins.shape[0])})
        self.write_meta()

    def write_meta(self) -> None:
        site_files.replace_atomically(self.directory / "store.json",
                                      lambda out: out.write(json.dumps(self.meta, indent=1).encode()))

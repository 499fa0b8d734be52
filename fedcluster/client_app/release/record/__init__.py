"""A site's one record of what it has released, and the one lock over it.

``store.py`` holds the record (every group of rows the site ever released values from,
by the rows' stable keys, its spread units and its stand-ins; ``instances.py`` its row
instances). One record per reading of the site's data, kept with the data's lineage:
beside the data cache for a file or a database (``<cache-dir>/groups/store-<key>/``),
whatever run, task, process or SuperNode reads it; in this process for data held in
memory (simulation, tests), per array.

:meth:`Record.held` is the lock every admission holds from reading the record, through
the audit, to writing what it admits (``release/gate.py``): two processes or SuperNodes
on one cache, or two threads of one, take turns, and each judges with what the other
recorded.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Iterator
from pathlib import Path

from fedcluster.client_app import site_files
from fedcluster.client_app.release.record.store import (
    CARRIED, FLAGGED, FORCED, STORE_FORMAT, Store, TableRef,
)

__all__ = ["CARRIED", "FLAGGED", "FORCED", "MEMORY_PREFIX", "STORE_FORMAT", "Record", "Store",
           "TableRef", "in_memory"]

#: How a table held in memory names its record (``TableRef.store``).
MEMORY_PREFIX = "memory:"

_MEMORY: dict[int, tuple[weakref.ref, Store, threading.RLock]] = {}
_MEMORY_LOCK = threading.Lock()


def _forget(key: int) -> None:
    with _MEMORY_LOCK:
        hit = _MEMORY.get(key)
        if hit is not None and hit[0]() is None:
            del _MEMORY[key]


def in_memory(owner, make) -> str:
    """The name of the record of data held in memory by ``owner`` (an array), made by
    ``make(store)`` (which fills an empty :meth:`Store.in_memory`) the first time: it
    lives as long as ``owner`` in this process."""
    key = id(owner)
    with _MEMORY_LOCK:
        hit = _MEMORY.get(key)
        if hit is None or hit[0]() is not owner:
            store = Store.in_memory()
            make(store)
            _MEMORY[key] = (weakref.ref(owner), store, threading.RLock())
            weakref.finalize(owner, _forget, key)
    return f"{MEMORY_PREFIX}{key}"


class Record:
    """The record a table belongs to (its ``TableRef.store``: a directory, or a record in
    memory), opened under its lock by :meth:`held`."""

    def __init__(self, name: str) -> None:
        self.name = str(name)

    @classmethod
    def of(cls, ref: TableRef | None) -> "Record | None":
        return None if ref is None else cls(ref.store)

    @property
    def in_memory(self) -> bool:
        return self.name.startswith(MEMORY_PREFIX)

    @contextlib.contextmanager
    def held(self) -> Iterator[Store]:
        """The record, read afresh under its one lock (what another process recorded is
        in it), for as long as the block runs; what the block adds is the caller's to
        :meth:`Store.save` before it leaves.

        Raises
        ------
        OSError
            The record cannot be read (or is no record: never overwritten then).
        """
        if self.in_memory:
            hit = _MEMORY.get(int(self.name[len(MEMORY_PREFIX):]))
            if hit is None or hit[0]() is None:
                raise OSError(f"the record {self.name} of data held in memory is gone")
            with hit[2]:
                yield hit[1]
            return
        directory = Path(self.name)
        with site_files.locked(directory, "store.json"):
            yield Store.open(directory)

"""Which new row may be a version of a row that left: the versions audit reasons about
VALUES, and a corrected row's unchanged cells are the same values in every version.

- **Cell hashes.** Each instance keeps a 16-bit hash of each cell's bits
  (:func:`cell_hashes`, in the store's ``cells.u16``): enough to tell which cells a later
  instance keeps, not to read any (65,536 values a cell; collisions only make the audit
  stricter: two cells taken for one value).
- **Links.** A new instance is linked to the earlier instance it may be a version of
  (:func:`link_new_rows`), among the rows of the lineage it continues that left: with an
  id column, the latest with its id; without one, the one sharing most cells with it, at
  least half of them, one to one
  (most cells first; cells shared by many rows that left, as a category's level is,
  count for nothing). A row corrected in one cell of four shares three.
- **Values.** Per feature, a linked pair whose cell hashes are equal holds one value
  (``release/audit/moments.py`` merges them); where they differ, the difference is a
  one-row change, which the audit keeps out of reach too.

What this does not catch: without an id column, a correction that changes half a row's
cells or more (what it leaves is then audited as new values), or one whose unchanged
cells are mostly as common as a category's levels.
"""

from __future__ import annotations

import numpy as np

from fedcluster.client_app.release.record.instances import mix
from fedcluster.client_app.data.versions import row_keys
from fedcluster.client_app.mapped_pages import rows_in_spans

__all__ = ["COMMON_CELL", "cell_hashes", "link_new_rows"]

#: A cell value shared by more rows that left than this says nothing of which row a new
#: one continues (a category's level, a count of 0): it does not count towards a link.
COMMON_CELL = 8


def cell_hashes(X: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """(len(rows), d) uint16: a hash of each cell's bits and its column (a missing cell: 0;
    ``rows`` ascending), read a chunk at a time."""
    rows = np.asarray(rows, dtype=np.int64)
    out = np.zeros((rows.size, X.shape[1]), dtype=np.uint16)
    salt = (np.arange(X.shape[1], dtype=np.uint64) + np.uint64(1)) * np.uint64(0x9E3779B97F4A7C15)
    for start in range(0, rows.size, row_keys.CHUNK_ROWS):
        block = np.ascontiguousarray(rows_in_spans(X, rows[start:start + row_keys.CHUNK_ROWS],
                                                   row_keys.CHUNK_ROWS), dtype=np.float64)
        bits = mix(block.view(np.uint64) ^ salt[None, :])
        hashed = (bits >> np.uint64(48)).astype(np.uint16)
        hashed[np.isnan(block)] = 0
        out[start:start + block.shape[0]] = hashed
    return out


def link_new_rows(store, new: np.ndarray, gone: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(new instances, the earlier instance each may be a version of), for the ``new``
    instances of a version.

    Parameters
    ----------
    store : lineage.Store
        The site's store (its instances' ids, cell hashes and links).
    new : int array
        The version's new instances.
    gone : int array
        The instances of the lineage the version continues that are no longer in the
        data (the rows that left; with an id column the store holds each one's id).
    """
    new = np.asarray(new, dtype=np.int64)
    gone = np.asarray(gone, dtype=np.int64)
    if new.size == 0 or gone.size == 0:
        return new[:0], new[:0]
    left = np.zeros(store.n_instances, dtype=bool)
    left[gone] = True
    if store.ids is not None:
        return _by_id(store, new, left)
    taken = np.zeros(store.n_instances, dtype=bool)
    taken[store.link[store.link >= 0]] = True
    candidates = np.flatnonzero(left & ~taken)
    if candidates.size == 0:
        return new[:0], new[:0]
    return _by_cells(store.cell_hashes(new), store.cell_hashes(candidates), new, candidates)


def _by_id(store, new: np.ndarray, gone: np.ndarray):
    """Each new instance to the latest instance with its id that is no longer in the data."""
    earlier = np.flatnonzero(gone)
    latest: dict[tuple, int] = {}
    for instance, key in zip(earlier.tolist(), map(tuple, store.ids[earlier].tolist())):
        latest[key] = max(instance, latest.get(key, -1))
    pairs = [(w, latest[key]) for w, key in zip(new.tolist(), map(tuple, store.ids[new].tolist()))
             if key in latest]
    if not pairs:
        return new[:0], new[:0]
    found = np.array(pairs, dtype=np.int64)
    return found[:, 0], found[:, 1]


def _by_cells(fresh_cells: np.ndarray, gone_cells: np.ndarray, fresh: np.ndarray,
              gone: np.ndarray):
    """One to one, most shared cells first, among pairs sharing a cell that few rows that
    left share (ties: the earlier instances first)."""
    shared: dict[tuple[int, int], int] = {}
    for j in range(fresh_cells.shape[1]):
        by_value: dict[int, list[int]] = {}
        for b, value in enumerate(gone_cells[:, j].tolist()):
            if value:
                by_value.setdefault(value, []).append(b)
        for a, value in enumerate(fresh_cells[:, j].tolist()):
            matches = by_value.get(value) if value else None
            if matches and len(matches) <= COMMON_CELL:
                for b in matches:
                    shared[a, b] = shared.get((a, b), 0) + 1
    enough = max(1, -(-fresh_cells.shape[1] // 2))  # half the cells (chance meets 1 in 65,536)
    shared = {ab: n for ab, n in shared.items() if n >= enough}
    if not shared:
        return fresh[:0], fresh[:0]
    order = sorted(shared, key=lambda ab: (-shared[ab], ab[1], ab[0]))
    used_a, used_b, pairs = set(), set(), []
    for a, b in order:
        if a not in used_a and b not in used_b:
            used_a.add(a), used_b.add(b)
            pairs.append((fresh[a], gone[b]))
    found = np.array(sorted(pairs), dtype=np.int64)
    return found[:, 0], found[:, 1]

"""Versions of a site's data that only ever disclose groups (the no-back-door issue).

A deployed site's file changes: rows are appended, corrected, deleted. Each version is
cut into groups again, and a coordinator that compares runs on two versions can combine
the groups of both. This package makes every version's group table safe together with
every table the site has answered from before:

- ``row_keys.py``: what makes a row the same row in two versions (its content, or its id);
- ``next_version.py``: the rule: groups of the last version whose rows are all there stay
  bit for bit, a group that lost or changed a row is withdrawn whole, new rows are
  grouped among themselves and the withdrawn groups' other rows join them
  (``joining.py``), and the audit decides;
- ``links.py``: which new row may be a version of a row that left (its cells' values);
- ``audited.py``: the new groups' spread units, and the one audit's judgement of them
  (``release/audit``: no combination of everything the site released isolates fewer
  than p rows or values, one row's change, or, with the spread units' sums of squares,
  determines a value; no sum holds a cell the p% rule withheld), holding back what fails;
- ``dropped_rows.py``: the rows a schema drops, counted by groups too.

The group table itself (its statistics, kept as files) is ``group_table.py``'s; this
package decides who is grouped with whom; the site's record of it all (every instance,
group and table) is ``release/record``'s.
"""

from __future__ import annotations

import numpy as np

from fedcluster.client_app.mapped_pages import rows_in_spans
from fedcluster.client_app.data.versions import links, next_version, row_keys
from fedcluster.client_app.data.versions.dropped_rows import dropped_groups
from fedcluster.client_app.release.record import Store, TableRef
from fedcluster.client_app.data.versions.next_version import GroupMembers, Plan, lineage_name

__all__ = ["GroupMembers", "Plan", "Store", "TableRef", "dropped_groups", "import_release_table",
           "lineage_name", "plan_for", "present_rows"]


def present_rows(X: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """(len(rows), d) bool: the rows' present cells, read a chunk at a time."""
    out = np.empty((rows.size, X.shape[1]), dtype=bool)
    for start in range(0, rows.size, row_keys.CHUNK_ROWS):
        out[start:start + row_keys.CHUNK_ROWS] = ~np.isnan(rows_in_spans(
            X, rows[start:start + row_keys.CHUNK_ROWS], row_keys.CHUNK_ROWS))
    return out


def instance_keys(X: np.ndarray, labels, row_ids) -> np.ndarray:
    """Each row's instance key (``labels``: (codes, names) or None)."""
    content = row_keys.content_keys(X, *(labels or (None, None)))
    return row_keys.instance_keys(content, row_ids)


def _record_cells(store: Store, X: np.ndarray, instances: np.ndarray, rows: np.ndarray) -> None:
    """The cell hashes of the store's new ``instances`` (appended in order), from ``rows``
    of ``X`` (-1: a row not at hand, its hashes 0)."""
    if instances.size == 0:
        return
    order = np.argsort(instances)
    instances, rows = instances[order], rows[order]
    have = np.flatnonzero(rows >= 0)
    at = np.argsort(rows[have], kind="stable")  # (the file's order: one pass over it)
    if have.size == rows.size and (at[1:] > at[:-1]).all():  # a first reading: as they are
        hashes = links.cell_hashes(X, rows)
    else:  # (one scatter: a (rows, d) copy costs a second of page faults at 1,000,000 rows)
        hashes = np.zeros((instances.size, X.shape[1]), dtype=np.uint16)
        hashes[have[at]] = links.cell_hashes(X, rows[have][at])
    missing = store.n_cell_records
    if instances[0] > missing:  # instances an earlier release made, without hashes
        store.add_cell_hashes(np.zeros((int(instances[0]) - missing, X.shape[1]), dtype=np.uint16))
    store.add_cell_hashes(hashes)


def plan_for(store: Store, X: np.ndarray, keys: np.ndarray, row_ids, min_size: int,
             group_waiting, attach, has_missing: bool, new_lineage: str,
             pair=None, readable=None, mend=None) -> tuple[Plan, np.ndarray]:
    """Match a version's rows to the store's instances and plan its groups
    (``next_version.plan_version``, which links its new rows to the rows they may be
    versions of: ``links.py``); (the plan, each row's instance)."""
    instance_of_row, new = store.match(keys, row_ids)
    _record_cells(store, X, instance_of_row[new], np.flatnonzero(new))
    present = None
    if has_missing or store.present is not None:
        rows = np.flatnonzero(new)
        store.add_present(instance_of_row[rows], present_rows(X, rows))
        width = X.shape[1]
        present = lambda instances: store.present_cells(instances, width)  # noqa: E731
    plan = next_version.plan_version(store, instance_of_row, min_size, group_waiting, attach,
                                     present, new_lineage, pair, instance_of_row[new], readable,
                                     mend)
    return plan, instance_of_row


def import_release_table(store: Store, X: np.ndarray, keys: np.ndarray, content: np.ndarray,
                         row_ids, earlier_hashes: np.ndarray, earlier_groups: np.ndarray,
                         min_size: int, entry: str, has_missing: bool) -> int:
    """Record a table an earlier release kept (without a store): its rows (their
    content hashes ``earlier_hashes``, each's group ``earlier_groups``) become instances,
    keyed as the current rows with the same content are (their ids too), so the audit sees
    what it disclosed. Returns its table number."""
    now_index = {}
    for i, key in enumerate(map(tuple, np.asarray(content).tolist())):
        now_index.setdefault(key, []).append(i)
    mapped = np.array(earlier_hashes, dtype=np.uint64, copy=True)
    mapped_ids = None if row_ids is None else np.zeros_like(mapped)
    now_row = np.full(mapped.shape[0], -1, dtype=np.int64)
    for r, key in enumerate(map(tuple, np.asarray(earlier_hashes).tolist())):
        rows = now_index.get(key)
        if rows:
            now_row[r] = rows.pop(0)
            mapped[r] = keys[now_row[r]]
            if mapped_ids is not None:
                mapped_ids[r] = row_ids[now_row[r]]
    instances, new = store.match(mapped, mapped_ids)
    _record_cells(store, X, instances[new], now_row[new])
    if has_missing:
        # the rows still there: their cells; the others: taken as present (not known here)
        cells = np.ones((instances.size, X.shape[1]), dtype=bool)
        there = np.flatnonzero(now_row >= 0)
        cells[there] = present_rows(X, now_row[there])
        store.add_present(instances[new], cells[new])
    groups = next_version._split(np.asarray(earlier_groups), instances)
    numbers = store.add_groups(groups, min_size)
    store.see(instances, len(store.tables), store.lineage_code(lineage_name(entry)), None)
    return store.add_table(numbers, {"entry": entry, "lineage": lineage_name(entry), "p": min_size,
                                     "rows": int(instances.size), "imported": True})

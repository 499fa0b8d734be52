"""Where the rows of a withdrawn group go in a new version (``next_version.py``).

A withdrawn group's other rows (a UNIT) move together, so that an instance's groups form
a chain (what keeps the audit a minimum cut, ``span_audit.py``): to the nearest group of
new rows with room for them, else into a group of whole units, else they wait. Pure
numpy on the rows as the grouping measures them (``group_table.py`` hands them in).
"""

from __future__ import annotations

import numpy as np

from fedcluster.client_app.data.grouping import group_rows

__all__ = ["NEAREST_GROUPS", "join_units", "nearest_groups"]


def join_units(Z: np.ndarray, unit: np.ndarray, lost: np.ndarray, fresh_Z: np.ndarray,
               labels: np.ndarray, min_size: int) -> np.ndarray:
    """For each row (``Z``: the rows as the grouping measures them), the group its unit
    (the rows of one ``unit`` label, together) joins: of the groups of the fresh rows
    (``fresh_Z``, their group ``labels``), among the unit's :data:`NEAREST_GROUPS`
    nearest, the nearest with room for it (a group takes at most 2 ``min_size`` such
    rows, or one unit larger than that alone; the large units choose first, then the
    nearest); else a group of whole units of at most 2 ``min_size`` rows each, made among
    those left (``group_rows`` on their means: ``min_size`` units where they ``lost``
    rows, else at least two and enough for ``min_size`` rows), numbered after the fresh
    groups; else -1 (a larger unit waits for a fresh group: among other units it would
    make ever larger groups)."""

    def means(labels_, values):
        n = int(labels_.max()) + 1 if labels_.size else 0
        total = np.zeros((n, values.shape[1]))
        np.add.at(total, labels_, values)
        return total / np.maximum(np.bincount(labels_, minlength=n), 1)[:, None]

    units, first, unit_of_row = np.unique(unit, return_index=True, return_inverse=True)
    unit_means, unit_rows = means(unit_of_row, Z), np.bincount(unit_of_row)
    unit_lost = lost[first]
    group_means = means(labels, fresh_Z)
    joined = np.full(units.size, -1, dtype=np.int64)
    room = np.full(group_means.shape[0], 2 * min_size)
    candidates, distance = nearest_groups(unit_means, group_means, NEAREST_GROUPS)
    large = unit_rows > 2 * min_size
    # the large units first (each takes a fresh group alone), then the nearest first
    for u in np.lexsort((distance[:, 0] if distance.size else np.zeros(units.size), ~large)).tolist():
        for g in candidates[u].tolist():
            if room[g] == 2 * min_size or (not large[u] and unit_rows[u] <= room[g]):
                joined[u] = g
                room[g] = max(room[g] - unit_rows[u], 0)
                break
    made = group_means.shape[0]
    # groups of whole units among those left (none large), each kind apart: units that
    # lost a row (p of them), units withdrawn for a raised p only, and units whose rows
    # are all there but in new versions (corrected) with those corrected in the same
    # features (p of them): in a feature none of its rows changed a corrected unit holds
    # its earlier group's values, so with a unit of another kind it would give that one's
    # alone, and with one corrected elsewhere a correction in a feature only it changed
    for kind in [LOST, WHOLE] + sorted(set(unit_lost[unit_lost >= CHANGED].tolist())):
        left = np.flatnonzero((joined < 0) & (unit_lost == kind) & (unit_rows <= 2 * min_size))
        per_group = max(min_size, 3) if kind != WHOLE else \
            max(2, -(-min_size // int(unit_rows[left].min()))) if left.size else 2
        if left.size >= max(per_group, 2):
            of_unit = group_rows(np.ascontiguousarray(unit_means[left]), per_group)
            joined[left] = np.where(of_unit >= 0, of_unit + made, -1)
            made += int(of_unit.max()) + 1 if (of_unit >= 0).any() else 0
    return joined[unit_of_row]


#: How many of the nearest new groups a withdrawn group's rows may join (the nearest
#: with room).
NEAREST_GROUPS = 16
#: What befell a unit's earlier group: all its rows are there (withdrawn for a raised p
#: only), some rows are gone, some rows are there only as new versions (corrected; with
#: the code of the features they changed added: ``next_version._changed_kinds``).
WHOLE, LOST, CHANGED = 0, 1, 2


def nearest_groups(points: np.ndarray, centres: np.ndarray, k: int):
    """For each point, its ``k`` nearest centres (indices, nearest first) and their
    squared distances, a slab of points at a time."""
    k = min(k, centres.shape[0])
    index = np.zeros((points.shape[0], k), dtype=np.int64)
    distance = np.zeros((points.shape[0], k))
    if k == 0:
        return index, distance
    norms = (centres * centres).sum(axis=1)
    for start in range(0, points.shape[0], 1024):
        block = points[start:start + 1024]
        d2 = (block * block).sum(axis=1)[:, None] - 2.0 * block @ centres.T + norms[None, :]
        part = np.argpartition(d2, k - 1, axis=1)[:, :k]
        near = np.take_along_axis(d2, part, axis=1)
        order = np.argsort(near, axis=1, kind="stable")
        index[start:start + len(block)] = np.take_along_axis(part, order, axis=1)
        distance[start:start + len(block)] = np.take_along_axis(near, order, axis=1)
    return index, distance

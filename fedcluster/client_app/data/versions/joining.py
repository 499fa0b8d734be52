"""Where the rows of a withdrawn group go in a new version (``next_version.py``).

A withdrawn group's other rows, with the new versions of its corrected rows (a UNIT),
move together: to the nearest group of at least max(p, 3) fresh rows with room for them
(:func:`join_units`, which says why that is safe), else they make groups of whole units
where that discloses nothing new (groups withdrawn for a raised p; groups corrected in
the same features), else they wait. Pure numpy on the rows as the grouping measures them
(``group_table.py`` hands them in).
"""

from __future__ import annotations

import numpy as np

from fedcluster.client_app.data.grouping import group_rows
from fedcluster.client_app.release.spreads import host_size

__all__ = ["NEAREST_GROUPS", "host_size", "join_units", "lost_group_units", "nearest_groups"]


def join_units(Z: np.ndarray, unit: np.ndarray, lost: np.ndarray, fresh_Z: np.ndarray,
               labels: np.ndarray, min_size: int, lost_units: int = 0) -> np.ndarray:
    """For each row (``Z``: the rows as the grouping measures them), the group its unit
    (the rows of one ``unit`` label, together: a former group's rows, the new versions of
    its corrected rows among them) joins.

    A HOST is a group of the fresh rows (``fresh_Z``, their group ``labels``) of at least
    :func:`host_size` rows. Each unit joins, among its :data:`NEAREST_GROUPS` nearest
    hosts, the nearest with room for it (a host takes at most :data:`HOST_ROOM` x
    ``min_size`` such rows, or one unit larger than that alone; the large units choose
    first, then the nearest).
    A unit that finds none waits (-1), but units of groups withdrawn only for a raised p
    (``lost`` :data:`WHOLE`: every row there as it was), which make groups of whole units
    among themselves (at least two, and enough for ``min_size`` rows: a union of groups
    already answered from), and CORRECTED units (:data:`CHANGED` + the code of the
    features changed), which make groups of max(p, 3) whole units of one code, and,
    with ``lost_units`` and no host at all, units that lost rows, which make groups of
    that many whole units (:func:`lost_group_units`: the audits judge them); numbered
    after the fresh groups.

    Why the host's fresh rows (release/audit/values.py): in every feature the new
    group's values are its units' (values answered from before: a corrected row's
    unchanged cells are its old ones) and at least max(p, 3) fresh values that are in no
    other group. Any combination of everything released that uses the new group's sum
    or sum of squares carries its fresh values' sum or sum of squares, which nothing else
    holds: it isolates at least max(p, 3) of them, and it determines no value (a sum and
    a sum of squares over 3 or more unknowns found nowhere else cancel from no
    combination). A unit moves whole, so that each earlier group reaches one new group
    only: the instances' audit (``release/audit/span.py``), which has no such shortcut,
    then meets small components."""

    def means(labels_, values):
        n = int(labels_.max()) + 1 if labels_.size else 0
        total = np.zeros((n, values.shape[1]))
        np.add.at(total, labels_, values)
        return total / np.maximum(np.bincount(labels_, minlength=n), 1)[:, None]

    units, first, unit_of_row = np.unique(unit, return_index=True, return_inverse=True)
    unit_means, unit_rows = means(unit_of_row, Z), np.bincount(unit_of_row)
    unit_kind = lost[first]
    group_means = means(labels, fresh_Z)
    joined = np.full(units.size, -1, dtype=np.int64)
    hosts = np.flatnonzero(np.bincount(labels, minlength=group_means.shape[0])
                           >= host_size(min_size)) if labels.size else np.zeros(0, np.int64)
    room = np.full(group_means.shape[0], HOST_ROOM * min_size)
    candidates, distance = nearest_groups(unit_means, group_means[hosts], NEAREST_GROUPS)
    candidates = hosts[candidates] if hosts.size else candidates
    large = unit_rows > HOST_ROOM * min_size
    nearest = distance[:, 0] if distance.size else np.zeros(units.size)

    def host(among: np.ndarray) -> None:
        """The large units first (each takes a host alone), then the nearest first."""
        for u in among[np.lexsort((nearest[among], ~large[among]))].tolist():
            for g in candidates[u].tolist():
                if room[g] == HOST_ROOM * min_size or (not large[u] and unit_rows[u] <= room[g]):
                    joined[u] = g
                    room[g] = max(room[g] - unit_rows[u], 0)
                    break

    # the units that lost a row first, to their nearest hosts, else the nearest host with
    # room wherever it is; then the corrected ones (which may make groups of their own)
    host(np.flatnonzero(unit_kind <= LOST))
    waiting = np.flatnonzero((joined < 0) & ~large & (unit_kind == LOST))
    if waiting.size and hosts.size:
        far, _ = nearest_groups(unit_means[waiting], group_means[hosts], hosts.size)
        for u, order in zip(waiting.tolist(), hosts[far].tolist()):
            for g in order:
                if unit_rows[u] <= room[g]:
                    joined[u] = g
                    room[g] -= unit_rows[u]
                    break
    host(np.flatnonzero(unit_kind >= CHANGED))
    made = group_means.shape[0]
    left = np.flatnonzero((joined < 0) & (unit_kind == WHOLE) & (unit_rows <= 2 * min_size))
    per_group = max(2, -(-min_size // int(unit_rows[left].min()))) if left.size else 2
    if left.size >= per_group:
        of_unit = group_rows(np.ascontiguousarray(unit_means[left]), per_group)
        joined[left] = np.where(of_unit >= 0, of_unit + made, -1)
        made += int(of_unit.max()) + 1 if (of_unit >= 0).any() else 0
    # corrected units that found no host: groups of max(p, 3) whole units corrected in the
    # same features (in the others their values are their former groups', so the new
    # group's sums are those groups'; in those features its sum is of 3 or more changes)
    # and, in a version with no host at all (its rows all answered from before: a file cut
    # anew from rows that earlier files held), units that lost rows: groups of
    # ``lost_units`` whole units, each unit's rows a part of its earlier group that was
    # never a sum alone; the audits judge them (release/audit/values.py), holding back
    # what they would give. (Where hosts come, the units wait for them: groups of parts
    # made version after version would join the history's components into ones the
    # audits can no longer judge: bench/versions.py, 2026-11-29.)
    lost_alone = [LOST] if lost_units and hosts.size == 0 else []
    for kind in lost_alone + sorted(set(unit_kind[unit_kind >= CHANGED].tolist())):
        left = np.flatnonzero((joined < 0) & (unit_kind == kind))
        size = lost_units if kind == LOST else host_size(min_size)
        if left.size >= size:
            of_unit = group_rows(np.ascontiguousarray(unit_means[left]), size)
            joined[left] = np.where(of_unit >= 0, of_unit + made, -1)
            made += int(of_unit.max()) + 1 if (of_unit >= 0).any() else 0
    return joined[unit_of_row]


def lost_group_units(min_size: int) -> tuple[int, ...]:
    """How many whole units a group of units that lost rows and found no host holds,
    tried in turn until the audits hold none back (``next_version.plan_version``): from
    :func:`host_size` to 8 times it. Such a group's units are parts of groups answered
    from before; the more of them a group holds, the more unknowns each combination of
    the history meets (a file cut anew from rows two earlier files held: at p 2, 3 units
    a group left a third of the rows held back, 16 none; bench/versions.py), the coarser
    its mean."""
    return tuple(host_size(min_size) * k for k in (1, 2, 4, 8))


#: How many of the nearest new groups a withdrawn group's rows may join (the nearest
#: with room).
NEAREST_GROUPS = 16
#: A host takes at most this many times p rows answered from before: enough to take in
#: the rows of the groups a version withdraws when it appends a third as many rows (the
#: fresh rows' values keep the host safe however many it takes; the limit keeps groups
#: small, for the quality of the means a run clusters).
HOST_ROOM = 3
#: What befell a unit's earlier group: all its rows are there as they were (withdrawn for
#: a raised p only), some rows are gone, or its rows are all there, some only as new
#: versions (corrected; the code of the features they changed added:
#: ``next_version._changed_kinds``).
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

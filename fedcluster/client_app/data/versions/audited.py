"""A version's new groups through the audits, with their spread units
(``next_version.py`` makes the groups; this module judges them and pairs them).

The new groups' spread units (``release/spreads.py``) are made here, before the audits,
so that the audits judge the units the table will keep: new groups holding rows of one
earlier unit share a unit, and a unit with a history adds at least 3 fresh values to its
sum of squares (:func:`spread_units`). Then the instances' audit (``release/span_audit``)
and the values' (``value_audit.py``, ``release/versions_audit``); in a failing component
each new group's rows with a history are held back and the rest audited again
(:func:`audited`).
"""

from __future__ import annotations

import numpy as np

from fedcluster.client_app.data.versions import value_audit
from fedcluster.client_app.data.versions.lineage import Store
from fedcluster.client_app.release import span_audit

__all__ = ["AUDIT_ROUNDS", "audited", "spread_units"]


def _csr(store: Store, groups: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, members) of ``groups`` alone, in their order."""
    groups = np.asarray(groups, dtype=np.int64)
    sizes = store.offsets[groups + 1] - store.offsets[groups]
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    index = np.repeat(store.offsets[groups] - offsets[:-1], sizes) + np.arange(int(offsets[-1]))
    return offsets, store.members[index]


#: Rounds of audit and hold-back before every new group with a history is held back.
AUDIT_ROUNDS = 4


def _last_units(store: Store) -> np.ndarray:
    """Each instance's spread unit in the last group it was in, or the one its earlier
    version was in (a corrected row's unchanged cells are there: ``links.py``); -1: none."""
    last = np.full(store.n_instances, -1, dtype=np.int64)
    if store.n_groups:
        np.maximum.at(last, store.members, np.repeat(np.arange(store.n_groups), np.diff(store.offsets)))
    unit = np.where(last >= 0, store.unit[np.maximum(last, 0)], -1)
    linked = np.flatnonzero((unit < 0) & (store.link >= 0))
    unit[linked] = unit[store.link[linked]]
    return unit


def spread_units(groups: list[np.ndarray], last_unit: np.ndarray, history: np.ndarray,
                  pair) -> np.ndarray:
    """The new groups' spread units (``release/spreads.py``), each labelled by its first
    group: new groups holding rows of one earlier unit share a unit (its m2 was released
    whole: a unit of them all says no more than it and the new rows); such a unit with
    fewer than 3 fresh rows (no history), and the groups left alone, are paired by
    ``pair`` (by the means of their fresh rows), a small one with a near one: a unit that
    holds an earlier unit's rows must add at least 3 fresh values to its sum of squares,
    or the two sums of squares would differ by 2 values' (which, with their sum, pin them)."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    from fedcluster.client_app.release.spreads import SPREAD_MIN_ROWS

    n = len(groups)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    owner = np.repeat(np.arange(n), [m.size for m in groups])
    members = np.concatenate(groups)
    old = last_unit[members]
    had = old >= 0
    # groups sharing an earlier unit: joined through a node per earlier unit
    units, slot = np.unique(old[had], return_inverse=True)
    graph = coo_matrix((np.ones(int(had.sum()), dtype=np.int8), (owner[had], n + slot)),
                       shape=(n + units.size, n + units.size))
    label = connected_components(graph, directed=False)[1][:n]
    first = np.full(int(label.max()) + 1, n, dtype=np.int64)
    np.minimum.at(first, label, np.arange(n))
    labels = first[label]
    fresh_rows = np.bincount(labels[owner], weights=~history[members], minlength=n)
    with_history = np.bincount(labels[owner], weights=history[members], minlength=n) > 0
    size = np.bincount(labels, minlength=n)
    heads = np.flatnonzero((size[np.arange(n)] > 0) & (labels == np.arange(n)))
    # the units to pair: groups alone without a history, and units with one but fewer
    # than 3 fresh rows (represented by their fresh rows, or all their rows if none)
    needy = heads[(~with_history[heads] & (size[heads] == 1))
                  | (with_history[heads] & (fresh_rows[heads] < SPREAD_MIN_ROWS))]
    if pair is not None and needy.size:
        rows = []
        for h in needy.tolist():
            mine = np.concatenate([groups[j] for j in np.flatnonzero(labels == h)])
            fresh = mine[~history[mine]]
            rows.append(fresh if (with_history[h] and fresh.size) else mine)
        partner = np.asarray(pair(rows), dtype=np.int64)
        mates = np.where(partner >= 0, needy[np.maximum(partner, 0)], needy)
        joined = np.minimum(needy, mates)
        relabel = np.arange(n)
        relabel[needy] = joined
        labels = relabel[labels]
    return labels


def audited(store: Store, candidates: list[np.ndarray], p: int, present, findings: list,
             pair=None):
    """The new groups that pass the audits, how many rows they held back, and the new
    groups' spread units (None: nothing of the history touched, the table makes them).

    Two audits: the instances' (``span_audit``: every row version an unknown) and the
    values' (``value_audit``: linked versions' unchanged cells one value, with the spread
    units' sums of squares). In a failing component, each new group's rows with a history
    (in a group before, or a version of a row that was) are held back, and its fresh rows
    stay a group if they are at least p; the audits run again on what is left (the spread
    units change with it), until they pass."""
    history = np.zeros(store.n_instances, dtype=bool)
    if store.n_groups:
        history[store.members] = True
    history[store.link >= 0] = True
    if not any(history[m].any() for m in candidates):
        return candidates, 0, None
    last_unit = _last_units(store)

    def pairing(groups):
        return spread_units(groups, last_unit, history, pair)

    def fresh_part(members):
        fresh = members[~history[members]]
        return fresh if fresh.size >= p else None

    held = 0
    for _ in range(AUDIT_ROUNDS):
        units = pairing(candidates)
        failing = _failures(store, candidates, units, p, present)
        if not failing:
            return candidates, held, units
        findings.extend(reason for _, reason in failing)
        out = set().union(*(set(local.tolist()) for local, _ in failing))
        kept = []
        for j, members in enumerate(candidates):
            part = fresh_part(members) if j in out else members
            if part is not None:
                kept.append(part)
            held += int(members.size - (0 if part is None else part.size))
        candidates = kept
    # still failing: only fresh rows stay (groups of them alone are their own components)
    final = []
    for members in candidates:
        part = fresh_part(members)
        if part is not None:
            final.append(part)
        held += int(members.size - (0 if part is None else part.size))
    return final, held, pairing(final)


def _failures(store: Store, new: list[np.ndarray], units: np.ndarray, p: int, present):
    """(indices into ``new``, reason) of the audits' failing components (every group the
    store holds, and the ``new`` ones): the instances' audit, then the values'."""
    if not new:
        return []
    answered = store.disclosed_groups()
    old_offsets, old_members = _csr(store, answered)
    sizes = np.array([m.size for m in new], dtype=np.int64)
    offsets = np.concatenate([old_offsets, old_offsets[-1] + np.cumsum(sizes)])
    members = np.concatenate([old_members, *new]).astype(np.int64)
    min_size = np.concatenate([store.group_p[answered], np.full(len(new), p)]).astype(np.int64)
    n_old = answered.size
    reports = None
    if present is not None:
        def reports(groups):
            return np.array([present(members[offsets[g]:offsets[g + 1]]).sum(axis=0) >= min_size[g]
                             for g in np.asarray(groups).tolist()])
    findings = span_audit.audit(offsets, members, store.n_instances,
                                np.arange(n_old, n_old + len(new)), min_size, p,
                                store.same_row(), present, reports)
    out = [(f.groups - n_old, f.reason) for f in findings]
    return out + value_audit.failures(store, new, units, p, present)



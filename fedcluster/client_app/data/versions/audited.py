"""A version's new groups through the audits, with their spread units
(``next_version.py`` makes the groups; this module judges them and pairs them).

The new groups' spread units (``release/spreads.py``) are made here, before the audits,
so that the audits judge the units the table will keep (:func:`spread_units`). Then the
one audit (``release/audit``: the record's protected cells, the instances', the values');
in a failing component each new group's rows with a history are held back and the rest
audited again (:func:`audited`). A new group holding a cell the p% rule withheld stands
in there (its FORCED stand-ins, ``audit.protected_features``, which the table applies).
"""

from __future__ import annotations

import numpy as np

from fedcluster.client_app.release import audit, spreads
from fedcluster.client_app.release.audit import values
from fedcluster.client_app.release.record import Store

__all__ = ["AUDIT_ROUNDS", "audited", "spread_units"]


#: Rounds of audit and hold-back before every new group with a history is held back.
AUDIT_ROUNDS = 4


def _last_units(store: Store) -> np.ndarray:
    """Each instance's spread unit in the last group it was in, or the one its earlier
    version was in (a corrected row's unchanged cells are there: ``links.py``); -1: none."""
    last = np.full(store.n_instances, -1, dtype=np.int64)
    if store.n_groups:  # a report's parts (no spread, in no table) are no one's last group
        number = np.repeat(np.arange(store.n_groups), np.diff(store.offsets))
        number[store.report_group_mask()[number]] = -1
        np.maximum.at(last, store.members, number)
    unit = np.where(last >= 0, store.unit[np.maximum(last, 0)], -1)
    while True:  # along a chain of versions
        linked = np.flatnonzero((unit < 0) & (store.link >= 0))
        linked = linked[unit[store.link[linked]] >= 0]
        if linked.size == 0:
            return unit
        unit[linked] = unit[store.link[linked]]


def _unit_sizes(last_unit: np.ndarray) -> dict:
    """Per earlier spread unit, how many instances it holds (their last unit: a row that
    went is counted too, as the unit it was last in)."""
    had = last_unit >= 0
    units, counts = np.unique(last_unit[had], return_counts=True)
    return dict(zip(units.tolist(), counts.tolist()))


def spread_units(groups: list[np.ndarray], last_unit: np.ndarray, history: np.ndarray,
                 pair) -> np.ndarray:
    """The new groups' spread units (``release/spreads.py``), each labelled by its first
    group:

    - a group of fresh rows only: paired with a near one of its kind by ``pair`` (their
      means), as a first version's groups are;
    - a group with rows answered from before and fresh rows (``joining.py`` gives it at
      least max(p, 3)): a unit of its own (its fresh values' sum of squares is in no
      other unit, so no combination of units gives its old values' alone);
    - a group of old rows only (whole former groups: after a raised p, or corrected ones):
      one unit with every other such group that holds rows of one earlier unit (that
      unit's m2 was released whole: a unit of them all says no more than it), where it
      holds every row of each earlier unit it touches and at least 3 rows; else -1, its
      spread withheld."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    n = len(groups)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    owner = np.repeat(np.arange(n), [m.size for m in groups])
    members = np.concatenate(groups)
    fresh = np.bincount(owner, weights=~history[members], minlength=n)
    labels = np.arange(n)
    old_only = np.flatnonzero(fresh == 0)
    if old_only.size:
        mine = np.isin(owner, old_only)
        old = last_unit[members[mine]]
        had = old >= 0
        units, slot = np.unique(old[had], return_inverse=True)
        graph = coo_matrix((np.ones(int(had.sum()), dtype=np.int8), (owner[mine][had], n + slot)),
                           shape=(n + units.size, n + units.size))
        label = connected_components(graph, directed=False)[1][:n]
        first = np.full(int(label.max()) + 1, n, dtype=np.int64)
        np.minimum.at(first, label[old_only], old_only)
        labels[old_only] = first[label[old_only]]
        # a unit of them must hold every row of each earlier unit it touches, else its sum
        # of squares less those units' would be of the rows it holds of one: withheld
        total = _unit_sizes(last_unit)
        counted: dict = {}
        for label, unit in zip(labels[owner[mine][had]].tolist(), old[had].tolist()):
            counted[label, unit] = counted.get((label, unit), 0) + 1
        short = {label for (label, unit), count in counted.items() if count < total.get(unit, 0)}
        # and hold the rows a sum of squares needs (``release/spreads.py``)
        rows = np.bincount(labels[old_only], weights=[groups[j].size for j in old_only.tolist()],
                           minlength=n)
        short |= set(np.flatnonzero((rows > 0) & (rows < spreads.SPREAD_MIN_ROWS)).tolist())
        labels[old_only[np.isin(labels[old_only], list(short))]] = -1
    fresh_only = np.flatnonzero(fresh == np.array([m.size for m in groups]))
    if pair is not None and fresh_only.size:
        partner = np.asarray(pair([groups[j] for j in fresh_only.tolist()]), dtype=np.int64)
        mates = np.where(partner >= 0, fresh_only[np.maximum(partner, 0)], fresh_only)
        labels[fresh_only] = np.minimum(fresh_only, mates)
    return labels


def audited(store: Store, candidates: list[np.ndarray], p: int, present, findings: list,
             pair=None):
    """The new groups that pass the audits, how many rows they held back, and the new
    groups' spread units (None: nothing of the history touched, the table makes them).

    The one audit (``release/audit.judge``): the protected cells, the instances' (every row
    version an unknown) and the values' (linked versions' unchanged cells one value, with
    the spread units' sums of squares). In a failing component, each new group's rows with a history
    (in a group before, or a version of a row that was) are held back, and its fresh rows
    stay a group if they are at least p; the audits run again on what is left (the spread
    units change with it), until they pass."""
    history = values.with_history(store)
    if not any(history[m].any() for m in candidates):
        return candidates, 0, None
    width = max(store.cell_width, 1)
    last_unit = _last_units(store)

    def pairing(groups):
        return spread_units(groups, last_unit, history, pair)

    def fresh_part(members):
        fresh = members[~history[members]]
        return fresh if fresh.size >= p else None

    held = 0
    for _ in range(AUDIT_ROUNDS):
        units = pairing(candidates)
        failing = audit.judge(store, candidates, units, p, present, width,
                              audit.protected_features(store, candidates, width))
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

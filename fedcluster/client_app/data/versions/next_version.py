"""A new version of a site's data becomes a group table that only ever discloses groups.

The rule (docs/explanation/privacy-model.md, "Versions"):

1. **Base.** The version continues the lineage whose newest table holds most of its
   rows (``lineage.Store.heads``); a version that shares no row with any starts a new
   lineage.
2. **Kept.** A group of the base whose rows are all still there (the same instances:
   ``row_keys.py``) stays, its statistics bit for bit. A group that lost or changed a
   row is WITHDRAWN whole (as is one under a raised p): its other rows wait.
3. **New.** The waiting rows that were never in a group (new rows) are grouped among
   themselves (``grouping.group_rows``); the other waiting rows (of a withdrawn group,
   or held back before) join them a former group at a time, each to the new group
   nearest to it that has room (at most 2p such rows a group, or one larger former
   group alone); the others make groups of whole former groups of at most 2p rows each
   (p of them where those lost rows; else at least two, and p rows); a unit that makes
   no group waits. A former group's rows always move together, so an instance's groups
   form a chain, which the audit checks by a minimum cut.
4. **Audit.** Before the version answers anything, the exact span audit
   (``span_audit.audit``) checks every table ever made (each counts as answered from),
   with the new groups: no combination isolates fewer than p rows, and no one-row
   change. In a component that fails, the new groups' rows that were in a group before
   wait (they are HELD BACK: a later version, with more new rows around them, tries
   again), and their fresh rows stay a group if they are at least p.

What this costs is counted per version (the table's record in the store, shown by
``fedcluster site check``): rows kept, withdrawn, waiting, held back.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

from fedcluster.client_app.release import span_audit
from fedcluster.client_app.data.versions import value_audit
from fedcluster.client_app.data.versions.lineage import Store

__all__ = ["GroupMembers", "Plan", "plan_version"]


class GroupMembers:
    """Groups' instances as one array and its offsets: group j is ``members[offsets[j]:
    offsets[j + 1]]``, a view made when asked, so that a first version's 460,000 new
    groups (1,000,000 rows at p_site 2) cost two arrays rather than 460,000 array objects
    (about 60 MB at the table's peak: bench/grouping.py)."""

    def __init__(self, offsets: np.ndarray, members: np.ndarray):
        self.offsets, self.members = offsets, members

    def __len__(self) -> int:
        return int(self.offsets.size) - 1

    def __getitem__(self, j: int) -> np.ndarray:
        if not -len(self) <= j < len(self):
            raise IndexError(j)
        j %= len(self)
        return self.members[self.offsets[j]:self.offsets[j + 1]]

    def __iter__(self):
        return (self[j] for j in range(len(self)))

    @property
    def sizes(self) -> np.ndarray:
        return np.diff(self.offsets)

    @classmethod
    def of(cls, groups) -> GroupMembers:
        """These groups (a GroupMembers, or a list of instance arrays) as one."""
        if isinstance(groups, cls):
            return groups
        sizes = np.array([m.size for m in groups], dtype=np.int64)
        members = np.concatenate([np.zeros(0, dtype=np.int64), *groups]).astype(np.int64)
        return cls(np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64), members)

    def take(self, order: np.ndarray) -> GroupMembers:
        """The groups ``order[0]``, ``order[1]``, ... in that order."""
        order = np.asarray(order, dtype=np.int64)
        sizes = self.sizes[order]
        offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        index = np.repeat(self.offsets[order] - offsets[:-1], sizes) + np.arange(int(offsets[-1]))
        return GroupMembers(offsets, self.members[index])


@dataclass
class Plan:
    """How the rows of a version are grouped.

    Attributes
    ----------
    group_of_row : (n,) int64
        Each row's group: 0..K-1 the kept groups (in the base table's order), K.. the new
        groups (numbered as ``new_members``), -1 waiting.
    kept : (K,) int64
        The kept groups' positions in the base table.
    new_members : GroupMembers
        Each new group's instances.
    base : dict or None
        The base table's record.
    lineage : str
        The lineage the version continues (or begins).
    record : dict
        What the version kept, withdrew and held back (for the store's table record).
    findings : list of str
        Why the audit merged or held back groups.
    units : (len(new_members),) int64 or None
        The new groups' spread units the audit judged, each labelled by its first group
        (None: nothing of the history touched: the table makes them).
    """

    group_of_row: np.ndarray
    kept: np.ndarray
    new_members: GroupMembers
    base: dict | None
    lineage: str | None
    record: dict = field(default_factory=dict)
    findings: list = field(default_factory=list)
    units: np.ndarray | None = None


def _base(store: Store, live: np.ndarray) -> dict | None:
    """The lineage head holding most of the live instances (None: none holds any)."""
    best, best_overlap = None, 0
    for record in store.heads().values():
        groups = store.table_groups(record["n"])
        overlap = int(np.count_nonzero(live[_csr(store, groups)[1]]))
        if overlap > best_overlap or (overlap == best_overlap and best is not None
                                      and overlap and record["n"] > best["n"]):
            best, best_overlap = record, overlap
    return best


def _all_live(store: Store, groups: np.ndarray, live: np.ndarray) -> np.ndarray:
    """Per group, whether every one of its instances is live."""
    if groups.size == 0:
        return np.zeros(0, dtype=bool)
    offsets, members = _csr(store, groups)
    dead = (~live[members]).astype(np.int64)
    return np.add.reduceat(dead, offsets[:-1]) == 0  # (every group has a member)


def plan_version(store: Store, instance_of_row: np.ndarray, p: int, group_waiting, attach,
                 present=None, new_lineage: str = "", pair=None) -> Plan:
    """Group a version's rows by the rule of the module docstring.

    Parameters
    ----------
    store : Store
        The site's store, its instances already matched (``Store.match``).
    instance_of_row : (n,) int64
        Each row's instance.
    p : int
        The site's ``min-cluster-size``.
    group_waiting : callable (rows or None) -> (m,) int64
        The grouping of those rows (ascending; None: every row), -1 for a row that waits.
    attach : callable (rows, their units, whether each one's unit lost a row, fresh rows,
            their groups) -> (m,) int64
        For each of ``rows``, the group its unit (the rows of one earlier group) joins: a
        group of the fresh rows (the nearest with room, 2p rows each), else a group of
        units (numbered after the fresh rows' groups), else -1.
    present : callable (instances) -> (m, d) bool, optional
        The instances' present cells (None: no cell is missing).
    new_lineage : str
        The name of the lineage the version begins if it continues none.
    pair : callable (list of row arrays) -> (m,) int64, optional
        The spread partners of groups of those rows (``release/spreads.py``): the
        new groups' units, which the audit judges with them, pair the groups alone.
    """
    n = instance_of_row.size
    live = np.zeros(store.n_instances, dtype=bool)
    live[instance_of_row] = True
    row_of = np.full(store.n_instances, -1, dtype=np.int64)
    row_of[instance_of_row] = np.arange(n)
    base = _base(store, live)
    lineage = new_lineage if base is None else base["lineage"]
    store.see(instance_of_row, len(store.tables), store.lineage_code(lineage),
              None if base is None else base["n"])
    group_of_row = np.full(n, -1, dtype=np.int64)
    kept = np.zeros(0, dtype=np.int64)
    record = {"rows": n, "base": None if base is None else base["n"]}
    if base is not None:
        base_groups = store.table_groups(base["n"])
        sizes = store.offsets[base_groups + 1] - store.offsets[base_groups]
        whole = _all_live(store, base_groups, live)
        kept = np.flatnonzero(whole & (sizes >= p))
        for position, g in enumerate(base_groups[kept].tolist()):
            group_of_row[row_of[store.members[store.offsets[g]:store.offsets[g + 1]]]] = position
        base_members = _csr(store, base_groups)[1]
        withdrawn = np.flatnonzero(~np.isin(np.arange(base_groups.size), kept))
        record.update({"kept-groups": int(kept.size), "kept-rows": int(np.count_nonzero(group_of_row >= 0)),
                       "withdrawn-groups": int(withdrawn.size),
                       "withdrawn-rows": int(sizes[withdrawn].sum()),
                       "gone-rows": int(np.count_nonzero(~live[base_members]))})
    new_members = _new_groups(store, instance_of_row, group_of_row, group_waiting, attach)
    findings: list[str] = []
    pair_rows = None if pair is None else (lambda groups: pair([row_of[m] for m in groups]))
    new_members, held, units = _audited(store, list(new_members), p, present, findings,
                                        pair_rows)
    new_members = GroupMembers.of(new_members)
    group_of_row[row_of[new_members.members]] = kept.size + np.repeat(
        np.arange(len(new_members), dtype=np.int64), new_members.sizes)
    record.update({"new-groups": len(new_members), "held-back": held,
                   "waiting": int(np.count_nonzero(group_of_row < 0))})
    return Plan(group_of_row, kept, new_members, base, lineage, record, findings, units)


def _new_groups(store: Store, instance_of_row: np.ndarray, group_of_row: np.ndarray,
                group_waiting, attach) -> list[np.ndarray]:
    """The waiting rows' groups, as instance lists: the FRESH rows (never in a group, and
    no version of a row that was) are grouped among themselves; the other waiting rows (of withdrawn groups, or held back)
    go in UNITS, the rows of one earlier group together, each unit to the fresh group
    nearest to it that has room (at most 2p such rows a group). A unit's sum, subtracted
    from its earlier group's, then leaves that group's rows that went together with fresh
    rows; and each earlier group reaches one new group only, which keeps the audit's
    components small. The units that find no room make groups of whole units among
    themselves, which the audit judges: units whose earlier group lost or changed a row
    at least p of them (a combination of such a group and the earlier ones leaves at
    least one gone row per unit); units of groups withdrawn only for a raised p at least
    two, and enough for p rows (a union of earlier groups discloses nothing new). Units
    that make no group wait."""
    waiting = np.flatnonzero(group_of_row < 0)
    if waiting.size == 0:
        return []
    disclosed = store.disclosed_groups()
    last_group = np.full(store.n_instances, -1, dtype=np.int64)
    if disclosed.size:
        offsets, members = _csr(store, disclosed)
        np.maximum.at(last_group, members, np.repeat(disclosed, np.diff(offsets)))
    # a new version of a row (``links.py``: its unchanged cells are the old one's values)
    # moves with the rows of the old one's group, as one of them
    linked = np.flatnonzero((last_group < 0) & (store.link >= 0))
    last_group[linked] = last_group[store.link[linked]]
    unit = last_group[instance_of_row[waiting]]
    old = unit >= 0
    if not old.any():
        labels = group_waiting(None if waiting.size == group_of_row.size else waiting)
        return _split(labels, instance_of_row[waiting])
    fresh, earlier, unit = waiting[~old], waiting[old], unit[old]
    labels = group_waiting(fresh) if fresh.size else np.zeros(0, dtype=np.int64)
    grouped = labels >= 0
    units = np.unique(unit)
    live = np.zeros(store.n_instances, dtype=bool)
    live[instance_of_row] = True
    lost = ~_all_live(store, units, live)  # the unit's earlier group lost or changed a row
    attached = attach(earlier, unit, lost[np.searchsorted(units, unit)], fresh[grouped],
                      labels[grouped])
    return _split(np.concatenate([labels, attached]), instance_of_row[np.concatenate([fresh, earlier])])


def _split(labels: np.ndarray, instances: np.ndarray) -> GroupMembers:
    """The instances of each label 0..max (a label's instances ascending)."""
    if labels.size == 0 or labels.max() < 0:
        return GroupMembers(np.zeros(1, dtype=np.int64), np.zeros(0, dtype=np.int64))
    keep = labels >= 0
    labels, instances = labels[keep], np.asarray(instances, dtype=np.int64)[keep]
    order = np.lexsort((instances, labels))
    sizes = np.bincount(labels, minlength=int(labels.max()) + 1)
    return GroupMembers(np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64), instances[order])


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


def _spread_units(groups: list[np.ndarray], last_unit: np.ndarray, pair) -> np.ndarray:
    """The new groups' spread units (``release/spreads.py``), each labelled by its first
    group: new groups holding rows of one earlier unit share a unit (its m2 was released
    whole: a unit of them all says no more than it and the new rows); the groups left
    alone are paired by ``pair`` (their rows' means), a small one with a near one."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    n = len(groups)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    owner = np.repeat(np.arange(n), [m.size for m in groups])
    old = last_unit[np.concatenate(groups)]
    had = old >= 0
    # groups sharing an earlier unit: joined through a node per earlier unit
    units, slot = np.unique(old[had], return_inverse=True)
    graph = coo_matrix((np.ones(int(had.sum()), dtype=np.int8), (owner[had], n + slot)),
                       shape=(n + units.size, n + units.size))
    label = connected_components(graph, directed=False)[1][:n]
    first = np.full(int(label.max()) + 1, n, dtype=np.int64)
    np.minimum.at(first, label, np.arange(n))
    labels = first[label]
    alone = np.flatnonzero(np.bincount(labels, minlength=n)[labels] == 1)
    if pair is not None and alone.size:
        partner = np.asarray(pair([groups[j] for j in alone.tolist()]), dtype=np.int64)
        mates = np.where(partner >= 0, alone[np.maximum(partner, 0)], alone)
        labels[alone] = np.minimum(alone, mates)
    return labels


def _audited(store: Store, candidates: list[np.ndarray], p: int, present, findings: list,
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
        return _spread_units(groups, last_unit, pair)

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


def _csr(store: Store, groups: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, members) of ``groups`` alone, in their order."""
    groups = np.asarray(groups, dtype=np.int64)
    sizes = store.offsets[groups + 1] - store.offsets[groups]
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    index = np.repeat(store.offsets[groups] - offsets[:-1], sizes) + np.arange(int(offsets[-1]))
    return offsets, store.members[index]


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


def lineage_name(digest: str) -> str:
    """The name of a lineage begun by a table of this digest."""
    return hashlib.sha256(f"lineage\0{digest}".encode()).hexdigest()[:32]

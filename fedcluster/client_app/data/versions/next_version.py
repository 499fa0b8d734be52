"""A new version of a site's data becomes a group table that only ever discloses groups.

The rule (docs/explanation/privacy-model.md, "Versions"):

1. **Base.** The version continues the lineage whose newest table holds most of its
   rows (``lineage.Store.heads``); a version that shares no row with any starts a new
   lineage.
2. **Kept.** A group of the base whose rows are all still there (the same instances:
   ``row_keys.py``) stays, its statistics bit for bit. A group that lost or changed a
   row is WITHDRAWN whole (as is one under a raised p): its other rows, with the new
   versions of its changed rows, wait as one unit. A group of ANY other table of the
   history whose rows are all there stays too (REUSED: answering from a group answered
   from before, bit for bit, adds nothing a coordinator could combine; two overlapping
   files read in turn by one history hold back no row an earlier group covers); where
   groups of two tables overlap, the table covering more of the version's rows keeps
   its groups (then the base, then the newest: ``_kept_groups``).
3. **New.** The waiting rows that were never in a group and are no new version of a
   row that was (``links.py``) are grouped among themselves (``grouping.group_rows``);
   the other waiting rows (of a withdrawn group, with the new versions of its rows, or
   held back before) join them a former group at a time, each to the nearest group of
   at least max(p, 3) fresh rows that has room (at most 3p such rows a group, or one
   larger former group alone: ``joining.py``, which says why this is safe); the others
   make groups of whole former groups (withdrawn for a raised p; corrected in the same
   features; in a version with no host at all, that lost rows: ``joining.lost_group_units``
   of them a group), which the audit judges, or wait. A former group's rows always move together.
4. **Audits.** Before the version answers anything, its new groups and their spread units
   go through the audits (``audited.py``): every table ever made (each counts as
   answered from), through the one audit (``release/audit``): over row versions and over
   the cells' values, sums and sums of squares together. In a component that fails, the new groups' rows with
   a history wait (they are HELD BACK: a later version, with more new rows around them,
   tries again), and their fresh rows stay a group if they are at least p.

What this costs is counted per version (the table's record in the store, shown by
``fedcluster site check``): rows kept, reused, withdrawn, waiting, held back.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

from fedcluster.client_app.data.versions import joining, links
from fedcluster.client_app.data.versions.audited import audited
from fedcluster.client_app.release.record import Store

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
        Each row's group: 0..K-1 the kept groups (as ``kept``), K.. the new groups
        (numbered as ``new_members``), -1 waiting.
    kept : (K,) int64
        The kept groups (the store's numbers), table by table as ``kept_from``.
    kept_from : list of (dict, (m,) int64)
        Where their statistics are: per table they are kept from (its record), their
        positions in it (``_kept_groups``).
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
    kept_from: list = field(default_factory=list)


def _base(store: Store, live: np.ndarray) -> dict | None:
    """The lineage head holding most of the live instances (None: none holds any)."""
    best, best_overlap = None, 0
    for record in store.heads().values():
        groups = store.table_groups(record["n"])
        overlap = int(np.count_nonzero(live[store.members_csr(groups)[1]]))
        if overlap > best_overlap or (overlap == best_overlap and best is not None
                                      and overlap and record["n"] > best["n"]):
            best, best_overlap = record, overlap
    return best


def _lineage_instances(store: Store, lineage: str) -> np.ndarray:
    """Every instance seen in a table of ``lineage`` (as ``Store.see`` keeps it)."""
    code = store.lineage_code(lineage)
    return np.flatnonzero((store.seen[:, 0] >= 0) & (store.seen[:, 2] == code))


def _all_live(store: Store, groups: np.ndarray, live: np.ndarray) -> np.ndarray:
    """Per group, whether every one of its instances is live."""
    if groups.size == 0:
        return np.zeros(0, dtype=bool)
    offsets, members = store.members_csr(groups)
    dead = (~live[members]).astype(np.int64)
    return np.add.reduceat(dead, offsets[:-1]) == 0  # (every group has a member)


#: Groups per chunk when a raised floor checks kept groups' present cells.
RAISED_CHUNK = 1 << 14


def _kept_groups(store: Store, live: np.ndarray, p: int, base: dict | None,
                 readable, present=None) -> list[tuple[dict, np.ndarray]]:
    """The groups a version keeps whole, per table: (its record, their positions in it).

    A group qualifies when its instances are all ``live`` and it has at least ``p`` (and,
    made at a lower floor than ``p``, holds no feature's present cells 1 to p - 1 of them:
    its rows are grouped anew, where a group that would hold them alone is merged with a
    near one, ``data/present_groups.py``; ``present``: the instances' present cells); the
    tables are taken in the order of the rows their qualifying groups cover (most first;
    on a tie the base, then the newest), each giving its groups that share no instance
    with a group taken before. A table other than the base gives none unless its
    statistics are ``readable`` (the base's are recomputed where they are gone; asked only
    of a table that would give groups). One pass over the store's groups (each group once,
    however many tables kept it), then each table's list of groups (a large history's read
    mapped, one table at a time)."""
    if store.n_groups == 0:
        return []
    sizes = np.diff(store.offsets)
    qualifies = (np.add.reduceat((~live[store.members]).astype(np.int64), store.offsets[:-1]) == 0) \
        & (sizes >= p)
    raised = np.flatnonzero(qualifies & (store.group_p < p))
    for start in range(0, raised.size if present is not None else 0, RAISED_CHUNK):
        part = raised[start:start + RAISED_CHUNK]  # (a chunk of groups: bounded temporaries)
        offsets, members = store.members_csr(part)
        cells = np.add.reduceat(np.asarray(present(members), dtype=np.int32), offsets[:-1], axis=0)
        qualifies[part[((cells > 0) & (cells < p)).any(axis=1)]] = False
    # (a small history's tables are kept in memory; a large one's read mapped, one at a time)
    keep = store.n_groups < KEEP_TABLES_BELOW
    order = []
    for record in store.tables:
        is_base = base is not None and record["n"] == base["n"]
        groups = store.table_groups(record["n"], keep=keep)
        covered = int(sizes[groups][qualifies[groups]].sum()) if groups.size else 0
        if covered:
            order.append(((-covered, not is_base, -record["n"]), record, is_base))
    taken = np.zeros(store.n_instances, dtype=bool)
    chosen = np.zeros(store.n_groups, dtype=bool)
    out = []
    for _, record, is_base in sorted(order, key=lambda item: item[0]):
        groups = store.table_groups(record["n"], keep=keep)
        candidates = np.flatnonzero(qualifies[groups] & ~chosen[groups])
        if candidates.size == 0:
            continue
        offsets, members = store.members_csr(np.asarray(groups[candidates]))
        free = np.add.reduceat(taken[members].astype(np.int64), offsets[:-1]) == 0
        if not free.any() or (not is_base and base is not None and readable is not None
                              and not readable(record)):
            continue
        taken[members[np.repeat(free, np.diff(offsets))]] = True
        chosen[groups[candidates[free]]] = True
        out.append((record, candidates[free]))
    return out


#: Below this many groups in the history, :func:`_kept_groups` keeps the tables it reads.
KEEP_TABLES_BELOW = 1 << 20


def plan_version(store: Store, instance_of_row: np.ndarray, p: int, group_waiting, attach,
                 present=None, new_lineage: str = "", pair=None, new_instances=None,
                 readable=None, mend=None) -> Plan:
    """Group a version's rows by the rule of the module docstring.

    Parameters
    ----------
    store : Store
        The site's store, its instances already matched (``Store.match``).
    instance_of_row : (n,) int64
        Each row's instance.
    p : int
        The site's ``min-cluster-size``.
    group_waiting : callable (rows or None, size=p) -> (m,) int64
        The grouping of those rows (ascending; None: every row) in groups of at least
        ``size`` rows, -1 for a row that waits.
    attach : callable (rows, their units, whether each one's unit lost a row, fresh rows,
            their groups) -> (m,) int64
        For each of ``rows``, the group its unit (the rows of one earlier group) joins: a
        group of the fresh rows (the nearest with room, 3p rows each), else a group of
        units (numbered after the fresh rows' groups), else -1.
    present : callable (instances) -> (m, d) bool, optional
        The instances' present cells (None: no cell is missing).
    new_lineage : str
        The name of the lineage the version begins if it continues none.
    pair : callable (list of row arrays) -> (m,) int64, optional
        The spread partners of groups of those rows (``release/spreads.py``): the
        new groups' units, which the audit judges with them, pair the groups alone.
    new_instances : int array, optional
        The version's instances new to the store, linked here to the rows of the
        lineage it continues that left (``links.py``).
    readable : callable (table record) -> bool, optional
        Whether a table's statistics can still be read (its entry is there): only such a
        table's groups are reused (None: every table's).
    mend : callable (list of row arrays) -> list of row arrays, optional
        The new groups with those that would hold a feature's present cells alone merged
        with near ones (``data/present_groups.py``), before the audit judges them (unions
        of new groups: every earlier group's rows still reach one new group).
    """
    n = instance_of_row.size
    live = np.zeros(store.n_instances, dtype=bool)
    live[instance_of_row] = True
    row_of = np.full(store.n_instances, -1, dtype=np.int64)
    row_of[instance_of_row] = np.arange(n)
    base = _base(store, live)
    lineage = new_lineage if base is None else base["lineage"]
    if base is not None and new_instances is not None:
        gone = _lineage_instances(store, lineage)
        gone = gone[~live[gone]]
        store.set_links(*links.link_new_rows(store, new_instances, gone))
    store.see(instance_of_row, len(store.tables), store.lineage_code(lineage),
              None if base is None else base["n"])
    group_of_row = np.full(n, -1, dtype=np.int64)
    record = {"rows": n, "base": None if base is None else base["n"]}
    kept_from = _kept_groups(store, live, p, base, readable, present)
    kept = np.concatenate([np.zeros(0, dtype=np.int64)] + [
        store.table_groups(table["n"])[positions] for table, positions in kept_from])
    offsets, members = store.members_csr(kept)
    group_of_row[row_of[members]] = np.repeat(np.arange(kept.size), np.diff(offsets))
    from_base = [pos for table, pos in kept_from if base is not None and table["n"] == base["n"]]
    base_rows = 0
    if base is not None:
        base_groups = store.table_groups(base["n"])
        sizes = store.offsets[base_groups + 1] - store.offsets[base_groups]
        whole = _all_live(store, base_groups, live)
        base_kept = from_base[0] if from_base else np.zeros(0, dtype=np.int64)
        base_rows = int(sizes[base_kept].sum())
        withdrawn = np.flatnonzero(~(whole & (sizes >= p)))
        record.update({"kept-groups": int(base_kept.size), "kept-rows": base_rows,
                       "withdrawn-groups": int(withdrawn.size),
                       "withdrawn-rows": int(sizes[withdrawn].sum()),
                       "gone-rows": int(np.count_nonzero(~live[store.members_csr(base_groups)[1]]))})
    record.update({"reused-groups": int(kept.size) - int(sum(pos.size for pos in from_base)),
                   "reused-rows": int(np.count_nonzero(group_of_row >= 0)) - base_rows})
    pair_rows = None if pair is None else (lambda groups: pair([row_of[m] for m in groups]))
    mend_rows = None if mend is None else (
        lambda groups: [instance_of_row[rows] for rows in mend([row_of[m] for m in groups])])
    best = None
    # units that lost rows and found no host make groups of whole units, the fewest units
    # a group first, more while the audits hold any back (``joining.lost_group_units``)
    for lost_units in joining.lost_group_units(p):
        candidates, lost_alone = _new_groups(store, instance_of_row, group_of_row,
                                             group_waiting, attach, p, lost_units)
        if mend_rows is not None and len(candidates) > 1:
            candidates = mend_rows(list(candidates))
        findings: list[str] = []
        passed, held, units = audited(store, list(candidates), p, present, findings, pair_rows)
        answered = sum(m.size for m in passed)
        if best is None or answered > best[0]:
            best = (answered, passed, held, units, findings)
        if held == 0 or not lost_alone:
            break
    _, new_members, held, units, findings = best
    new_members = GroupMembers.of(new_members)
    group_of_row[row_of[new_members.members]] = kept.size + np.repeat(
        np.arange(len(new_members), dtype=np.int64), new_members.sizes)
    record.update({"new-groups": len(new_members), "held-back": held,
                   "waiting": int(np.count_nonzero(group_of_row < 0))})
    return Plan(group_of_row, kept, new_members, base, lineage, record, findings, units, kept_from)


def _new_groups(store: Store, instance_of_row: np.ndarray, group_of_row: np.ndarray,
                group_waiting, attach, p: int = 2, lost_units: int = 0) -> tuple[list, bool]:
    """The waiting rows' groups, as instance lists: the FRESH rows (never in a group, and
    no version of a row that was) are grouped among themselves; the other waiting rows
    (of withdrawn groups, with the new versions of their rows, or held back) are in
    UNITS, the rows of one earlier group together, each unit to the nearest fresh group
    of at least max(p, 3) rows that has room (``joining.join_units``; each earlier group
    reaches one new group only, which keeps the instances' audit's components small);
    units withdrawn for a raised p, or corrected in the same features, or (``lost_units``
    of them a group) that lost rows, that find no room make groups of whole units among
    themselves; the others wait. Also returns whether units that lost rows made such a
    group."""
    waiting = np.flatnonzero(group_of_row < 0)
    if waiting.size == 0:
        return [], False
    disclosed = store.disclosed_groups()  # (a report's parts are no one's earlier group)
    disclosed = disclosed[~store.report_group_mask()[disclosed]]
    last_group = np.full(store.n_instances, -1, dtype=np.int64)
    if disclosed.size:
        offsets, members = store.members_csr(disclosed)
        np.maximum.at(last_group, members, np.repeat(disclosed, np.diff(offsets)))
    # a new version of a row (``links.py``: its unchanged cells are the old one's values)
    # moves with the rows of the old one's group, as one of them
    while True:  # (along a chain of versions: a row corrected twice)
        linked = np.flatnonzero((last_group < 0) & (store.link >= 0))
        linked = linked[last_group[store.link[linked]] >= 0]
        if linked.size == 0:
            break
        last_group[linked] = last_group[store.link[linked]]
    unit = last_group[instance_of_row[waiting]]
    old = unit >= 0
    if not old.any():
        labels = group_waiting(None if waiting.size == group_of_row.size else waiting)
        return _split(labels, instance_of_row[waiting]), False
    fresh, earlier, unit = waiting[~old], waiting[old], unit[old]
    # fresh rows that units wait for are grouped at a host's size (``joining.host_size``)
    labels = group_waiting(fresh, joining.host_size(p)) if fresh.size \
        else np.zeros(0, dtype=np.int64)
    grouped = labels >= 0
    units = np.unique(unit)
    live = np.zeros(store.n_instances, dtype=bool)
    live[instance_of_row] = True
    # what befell the unit's earlier group: every row there as it was, some only as new
    # versions (corrected: told apart by the features the corrections changed), or a row gone
    versioned = live.copy()
    versioned[store.link[live[:store.link.size] & (store.link >= 0)]] = True
    kind = np.where(_all_live(store, units, live), joining.WHOLE,
                    np.where(_all_live(store, units, versioned), joining.CHANGED, joining.LOST))
    kind = _changed_kinds(store, units, kind, live)
    kind_of_row = kind[np.searchsorted(units, unit)]
    attached = attach(earlier, unit, kind_of_row, fresh[grouped], labels[grouped], lost_units)
    hosts = int(labels.max()) + 1 if labels.size else 0
    lost_alone = bool(np.any((kind_of_row == joining.LOST) & (attached >= hosts)))
    return (_split(np.concatenate([labels, attached]), instance_of_row[np.concatenate([fresh, earlier])]),
            lost_alone)


def _changed_kinds(store: Store, units: np.ndarray, kind: np.ndarray, live: np.ndarray) -> np.ndarray:
    """A corrected unit's kind told apart by the features its corrections changed
    (``joining.CHANGED`` + a code of the set): units corrected in the same features may
    make a group of whole units (``joining.join_units``), others may not."""
    changed = np.flatnonzero(kind == joining.CHANGED)
    if changed.size == 0:
        return kind
    later = np.full(store.n_instances, -1, dtype=np.int64)
    linked = np.flatnonzero(live[:store.link.size] & (store.link >= 0))
    later[store.link[linked]] = linked
    offsets, members = store.members_csr(units[changed])
    gone = members[~live[members]]
    differs = store.cell_hashes(gone) != store.cell_hashes(later[gone])
    owner = np.repeat(np.arange(changed.size), np.diff(offsets))[~live[members]]
    masks: dict[int, set] = {}
    for u, row in zip(owner.tolist(), differs):
        masks.setdefault(u, set()).update(np.flatnonzero(row).tolist())
    codes: dict[tuple, int] = {}
    out = kind.copy()
    for u in range(changed.size):
        key = tuple(sorted(masks.get(u, set())))
        out[changed[u]] = joining.CHANGED + codes.setdefault(key, len(codes))
    return out


def _split(labels: np.ndarray, instances: np.ndarray) -> GroupMembers:
    """The instances of each label 0..max (a label's instances ascending)."""
    if labels.size == 0 or labels.max() < 0:
        return GroupMembers(np.zeros(1, dtype=np.int64), np.zeros(0, dtype=np.int64))
    keep = labels >= 0
    labels, instances = labels[keep], np.asarray(instances, dtype=np.int64)[keep]
    order = np.lexsort((instances, labels))
    sizes = np.bincount(labels, minlength=int(labels.max()) + 1)
    return GroupMembers(np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64), instances[order])


def lineage_name(digest: str) -> str:
    """The name of a lineage begun by a table of this digest."""
    return hashlib.sha256(f"lineage\0{digest}".encode()).hexdigest()[:32]

"""Everything a site has released, as the audit over VALUES sees it (``moments.py``
judges each component; this module reads the record, ``release/record``).

The parts: every group of every table (its instances), every spread unit (the groups
whose m2 one sum of squares gives), the new version's candidate groups and units, and
the links between instances (``links.py``). Connected through shared instances, links
and units, they fall into components; a component holding a new group is judged per
feature, its cells' values the unknowns (a linked pair of instances whose cell keeps its
bits: one value). A component of new groups only, none sharing an instance or linked,
is one version's own groups and units: a sum of at least p values each, a sum of squares
of at least 3 (``release/spreads.py``), judged when they were made.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from fedcluster.client_app.release.audit import moments, span, support
from fedcluster.client_app.release.audit.span import Reason
from fedcluster.client_app.release.spreads import host_size

__all__ = ["failures", "stood_of", "with_history"]


def _components(offsets, members, n_groups, n_instances, links, units) -> np.ndarray:
    """The connected component of each group (groups, instances, links, units)."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    group_of_edge = np.repeat(np.arange(n_groups), np.diff(offsets))
    linked = np.flatnonzero(links >= 0)
    in_unit = np.flatnonzero(units >= 0)  # (-1: a group whose spread was withheld)
    rows = np.concatenate([group_of_edge, n_groups + linked, in_unit])
    cols = np.concatenate([n_groups + members, n_groups + links[linked], units[in_unit]])
    size = n_groups + n_instances
    graph = coo_matrix((np.ones(rows.size, dtype=np.int8), (rows, cols)), shape=(size, size))
    return connected_components(graph, directed=False)[1][:n_groups]


def _values(instances: np.ndarray, links: np.ndarray, hashes: np.ndarray, present: np.ndarray):
    """Per feature (a function of the feature), each instance's value (the index of the
    earliest instance holding it: linked instances whose cell keeps its bits share one),
    each instance's row (linked instances share it), and whether any instance here is
    linked to another here."""
    n = instances.size
    where = np.full(int(instances.max()) + 1 if n else 0, -1, dtype=np.int64)
    where[instances] = np.arange(n)
    target = links[instances]
    inside = (target >= 0) & (target < where.size)
    inside[inside] = where[target[inside]] >= 0
    a = np.flatnonzero(inside)
    b = where[target[a]]

    def roots(keep: np.ndarray) -> np.ndarray:
        parent = np.arange(n)
        parent[a[keep]] = b[keep]  # a later version points at the earlier (chains)
        while True:
            up = parent[parent]
            if np.array_equal(up, parent):
                return parent
            parent = up

    chain = roots(np.ones(a.size, dtype=bool))
    if a.size == 0:
        return None, chain, False

    def per_feature(j: int) -> np.ndarray:  # (one feature's at a time: d arrays of n held none)
        return roots((hashes[a, j] == hashes[b, j]) & present[a, j] & present[b, j])
    return per_feature, chain, True


def stood_of(store, n_new: int, stood: np.ndarray | None, width: int) -> np.ndarray | None:
    """(store's groups + ``n_new``, width) bool or None: per group, the features whose
    released sum is a stand-in (the record's, ``Store.stood_in``, and the new groups'
    ``stood``), so that it reports no value of its rows there; None: none is."""
    old = store.stood_in(width)
    new = np.zeros((n_new, width), dtype=bool)
    if stood is not None:
        stood = np.asarray(stood, dtype=bool)
        new[:, :min(width, stood.shape[-1])] = stood.reshape(-1, stood.shape[-1])[:, :width] \
            if stood.ndim == 2 else stood[None, :width]
    out = np.concatenate([old, new])
    return out if out.any() else None


def failures(store, new: list[np.ndarray], units: np.ndarray, p: int, present,
             carried: np.ndarray | None = None) -> list:
    """(indices into ``new``, reason) of the components that fail the audit over values.

    Parameters
    ----------
    store : lineage.Store
        Every group, unit and link so far.
    new : list of int arrays
        The candidate groups' instances.
    units : (len(new),) int
        Each candidate's spread unit among them (labelled by one of its groups).
    p : int
        The site's p now.
    present : callable (instances) -> (n, d) bool, or None
        The instances' present cells (None: none missing).
    carried : (store's groups + len(new), d) bool, optional
        Per group, the features it reports no value of (:func:`stood_of`).
    """
    if not new:
        return []
    n_old = store.n_groups
    sizes = np.array([m.size for m in new], dtype=np.int64)
    offsets = np.concatenate([store.offsets, store.offsets[-1] + np.cumsum(sizes)])
    members = np.concatenate([store.members, *new]).astype(np.int64)
    units = np.asarray(units, dtype=np.int64)
    units = np.concatenate([store.unit[:n_old], np.where(units >= 0, n_old + units, -1)])
    group_p = np.concatenate([store.group_p, np.full(len(new), p)]).astype(np.int64)
    links = store.link
    component = _components(offsets, members, n_old + len(new), store.n_instances, links, units)
    owners = np.bincount(members, minlength=store.n_instances)
    linked = np.zeros(store.n_instances, dtype=bool)
    linked[links >= 0] = True
    linked[links[links >= 0]] = True
    out = []
    order = np.argsort(component, kind="stable")
    starts = np.searchsorted(component[order], np.unique(component[n_old:]))
    counts = np.bincount(component)
    shown = _hosted(store, new, np.where(units[n_old:] >= 0, units[n_old:] - n_old, -1), p, present,
                    carried)
    for c, start in zip(np.unique(component[n_old:]).tolist(), starts.tolist()):
        groups = order[start:start + int(counts[c])]
        instances = np.unique(np.concatenate([members[offsets[g]:offsets[g + 1]] for g in groups]))
        if groups.min() >= n_old and (owners[instances] == 1).all() and not linked[instances].any():
            continue  # one version's own groups and units
        if shown[groups[groups >= n_old] - n_old].all():
            continue  # every new group carries fresh values of its own (``_hosted``)
        reason = _judge(store, groups, instances, offsets, members, units, group_p, links,
                        min(p, int(group_p[groups].min())), present, carried)
        if reason is not None:
            out.append((groups[groups >= n_old] - n_old, reason))
    return out


def with_history(store) -> np.ndarray:
    """Per instance, whether any of its values was answered from: it was in a group, or
    it is a later version of one that was (following the links: a corrected waiting row
    whose first version was never grouped has no history)."""
    history = np.zeros(store.n_instances, dtype=bool)
    if store.n_groups:
        history[store.members] = True
    linked = np.flatnonzero(store.link >= 0)
    while linked.size:  # along each chain of versions, from the earliest
        gained = linked[history[store.link[linked]] & ~history[linked]]
        if gained.size == 0:
            break
        history[gained] = True
    return history


def _hosted(store, new: list[np.ndarray], units: np.ndarray, p: int, present,
            stood: np.ndarray | None = None) -> np.ndarray:
    """Per new group, whether it is safe whatever the rest (``data/versions/joining.join_units``):
    fresh rows only, in a unit of such groups; a unit of its own whose fresh rows (in no
    group before, no version of a row that was) hold at least max(p, 3) present cells of
    every feature; or old rows only that :func:`_rebuilds` finds safe. Its sum and sum
    of squares then carry, in each feature, fresh values that nothing else holds (a
    combination that uses either cannot cancel them: a sum and a sum of squares over 3 or
    more unknowns found nowhere else, so it isolates at least max(p, 3) of them and
    determines nothing), or sums the site released before; the family without it was
    judged before."""
    history = with_history(store)
    need = host_size(p)
    fresh_only = np.array([not history[m].any() for m in new])
    out = np.zeros(len(new), dtype=bool)
    former = None
    for j, members in enumerate(new):
        mates = np.flatnonzero(units == units[j]) if units[j] >= 0 else np.array([j])
        if fresh_only[j]:
            out[j] = fresh_only[mates].all()
            continue
        fresh = members[~history[members]]
        if fresh.size == 0:
            former = _former(store) if former is None else former
            own = None if stood is None else stood[store.n_groups + j]
            out[j] = _rebuilds(store, members, need, present, *former, stood, own)
            continue
        if mates.size != 1 or fresh.size < need:
            continue
        cells = np.ones((fresh.size, 1), dtype=bool) if present is None \
            else np.asarray(present(fresh), dtype=bool)
        out[j] = bool((cells.sum(axis=0) >= need).all())
    return out


def _former(store) -> tuple[np.ndarray, np.ndarray]:
    """Per instance, how many groups of tables hold it and the last of them (-1: none;
    a report's parts, in no table, are no one's former group: ``Store.add_report``)."""
    group_of = np.repeat(np.arange(store.n_groups), np.diff(store.offsets))
    mine = ~store.report_group_mask()[group_of]
    last = np.full(store.n_instances, -1, dtype=np.int64)
    np.maximum.at(last, store.members[mine], group_of[mine])
    return np.bincount(store.members[mine], minlength=store.n_instances), last


def _rebuilds(store, members: np.ndarray, need: int, present, owners, last, stood=None,
              own=None) -> bool:
    """Whether a group of old rows only (``joining.py``: whole former groups, after a
    raised p or corrected in the same features) is safe whatever the rest: its rows,
    each itself or a later version of a row of an earlier group (its ORIGIN), are every
    row of the earlier groups they come from; and in each feature either no row changed
    (bits or presence) and each of those groups reported the feature or had no present
    cell of it (the new sum is then the sum of sums released before), or at least
    ``need`` rows hold a new present value (found in no other group: the argument of
    the fresh rows). Its spread unit holds whole earlier units or is withheld
    (``audited.spread_units``). A stand-in (``stood``: per group of the record; ``own``:
    the new group's) is no sum released before: where an earlier group stood in and the
    new one reports the feature, the new sum would give back what was withheld."""
    link = store.link
    origin = members.astype(np.int64)
    for _ in range(members.size + 1):  # back along each chain of versions to a grouped one
        up = np.flatnonzero((owners[origin] == 0) & (origin < link.size))
        up = up[link[origin[up]] >= 0]
        if up.size == 0:
            break
        origin[up] = link[origin[up]]
    if (owners[origin] == 0).any() or np.unique(origin).size != origin.size:
        return False
    groups = np.unique(last[origin])
    held = store.members_of(groups)
    if sum(h.size for h in held) != origin.size or not np.isin(np.concatenate(held), origin).all():
        return False
    width = max(store.cell_width, 1)
    now, then = store.cell_hashes(members), store.cell_hashes(origin)
    cells_now = np.ones((members.size, width), dtype=bool) if present is None \
        else np.asarray(present(members), dtype=bool)
    cells_then = np.ones_like(cells_now) if present is None \
        else np.asarray(present(origin), dtype=bool)
    if now.shape[1] != width or cells_now.shape[1] != width:
        return False
    changed = (now != then) | (cells_now != cells_then)
    fresh_values = (changed & cells_now).sum(axis=0)
    moved = changed.any(axis=0)
    if (moved & (fresh_values < need)).any():
        return False
    if moved.all():
        return True
    reported = ~moved if own is None else ~moved & ~np.asarray(own, dtype=bool)[:moved.size]
    for g, rows in zip(groups.tolist(), held):  # unchanged features: sums released before
        if stood is not None and (stood[g, :moved.size] & reported).any():
            return False  # a stand-in is no sum released before: the new one's would be
        if present is None:
            continue
        count = np.asarray(present(rows), dtype=bool)[:, ~moved].sum(axis=0)
        if ((count > 0) & (count < store.group_p[g])).any():
            return False
    return True


@dataclasses.dataclass(frozen=True)
class Layout:
    """A component's groups in the order the audit lists them (unit by unit, each unit
    where its first group comes; a group in no unit a unit of its own), their members
    flat as the component's instance positions."""

    groups: np.ndarray  # (G,) the groups, in that order
    owner: np.ndarray  # (M,) each member's group (its position in ``groups``)
    flat: np.ndarray  # (M,) each member's instance position
    unit_rank: np.ndarray  # (G,) each group's unit's place in the order
    in_unit: np.ndarray  # (G,) bool: in a spread unit (else its spread is withheld)
    group_p: np.ndarray  # (G,) each group's floor

    @classmethod
    def of(cls, instances, groups, offsets, members, units, group_p) -> "Layout":
        groups = np.asarray(groups, dtype=np.int64)
        keys = np.where(units[groups] >= 0, units[groups], -1 - groups)
        _, first, which = np.unique(keys, return_index=True, return_inverse=True)
        rank = np.argsort(np.argsort(first, kind="stable"), kind="stable")[which.ravel()]
        ordered = groups[np.lexsort((np.arange(groups.size), rank))]
        starts, lens = offsets[ordered], offsets[ordered + 1] - offsets[ordered]
        shift = np.repeat(starts - np.r_[0, np.cumsum(lens)[:-1]], lens)
        flat = np.searchsorted(instances, members[shift + np.arange(int(lens.sum()))])
        return cls(ordered, np.repeat(np.arange(ordered.size), lens), flat,
                   np.sort(rank), units[ordered] >= 0, np.asarray(group_p)[ordered])

    def reporting(self, value: np.ndarray, present: np.ndarray, carried: np.ndarray | None,
                  flat: bool = False):
        """For one feature (each instance's ``value`` index and ``present`` cell; which
        groups carry it at a stood-in mean), the values of each group that reports it (p
        cells or more, not carried), and of each unit with such a group, sorted and
        distinct, in the layout's order: (group lists, unit lists); ``flat``: each as
        (the lists end to end, where each starts)."""
        here = present[self.flat]
        count = np.bincount(self.owner[here], minlength=self.groups.size)
        reports = count >= self.group_p
        if carried is not None:
            reports &= ~carried[self.groups]
        take = here & reports[self.owner]
        group_lists = _distinct_flat(self.owner[take], value[self.flat[take]],
                                     np.flatnonzero(reports))
        in_unit = take & self.in_unit[self.owner]
        units = np.unique(self.unit_rank[reports & self.in_unit])
        unit_lists = _distinct_flat(self.unit_rank[self.owner[in_unit]],
                                    value[self.flat[in_unit]], units)
        if flat:
            return group_lists, unit_lists
        return support.pieces(*group_lists), support.pieces(*unit_lists)


def _distinct_flat(owner: np.ndarray, value: np.ndarray, owners: np.ndarray):
    """Each of ``owners`` (sorted; every ``owner`` among them) its ``value``s, sorted and
    distinct, end to end, and where each list starts (a list may be empty)."""
    order = np.lexsort((value, owner))
    owner, value = owner[order], value[order]
    keep = np.r_[True, (owner[1:] != owner[:-1]) | (value[1:] != value[:-1])] if owner.size \
        else np.zeros(0, dtype=bool)
    owner, value = owner[keep], value[keep]
    return value, np.searchsorted(owner, owners)


def _judge(store, groups, instances, offsets, members, units, group_p, links, floor, present,
           carried=None):
    """Why one component fails, feature by feature (each distinct pattern once), or None.
    Without a link inside the component its values are its instances, whose sums the
    instances' audit (``span.py``) has judged: the sums of squares then."""
    width = max(store.cell_width, 1)
    cells = np.ones((instances.size, width), dtype=bool) if present is None \
        else np.asarray(present(instances), dtype=bool)
    width = cells.shape[1]
    hashes = store.cell_hashes(instances)
    if hashes.shape[1] != width:  # (a store first met another width: compare what it kept)
        fitted = np.zeros((instances.size, width), dtype=np.uint16)
        fitted[:, :min(width, hashes.shape[1])] = hashes[:, :min(width, hashes.shape[1])]
        hashes = fitted
    per_feature, chain, linked = _values(instances, links, hashes, cells)
    layout = Layout.of(instances, groups, offsets, members, units, group_p)
    seen, passed = set(), span.Passed()  # (parts that passed, each feature's values named)
    for j in range(width):
        value = chain if per_feature is None else per_feature(j)
        key = (value.tobytes(), cells[:, j].tobytes())
        if key in seen:
            continue
        seen.add(key)
        (in_groups, group_cuts), (in_units, unit_cuts) = layout.reporting(
            value, cells[:, j], None if carried is None or j >= carried.shape[1] else carried[:, j],
            flat=True)
        used = np.unique(in_groups)
        remap = np.full(value.size, -1, dtype=np.int64)
        remap[used] = np.arange(used.size)
        in_units = remap[in_units]
        kept = np.r_[0, np.cumsum(in_units >= 0)]  # (a unit keeps its values in a group)
        part = moments.Component(
            support.pieces(remap[in_groups], group_cuts),
            support.pieces(in_units[in_units >= 0], kept[unit_cuts]),
            used.size, chain[used] if used.size else used)
        reason = moments.component_finding(part, floor, sums=linked, passed=passed.named(used))
        if reason is not None:  # (its instances: the values' first instances here)
            witness = np.asarray(getattr(reason, "instances", ()), dtype=np.int64)
            return Reason(f"feature {j}: {reason}", instances[used[witness]] if witness.size else ())
    return None

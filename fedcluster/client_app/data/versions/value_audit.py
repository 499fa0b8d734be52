"""Everything a site has answered from, as the versions audit over values sees it
(``release/versions_audit.py`` judges; this module, in the data layer, reads the store).

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

import numpy as np

from fedcluster.client_app.release import versions_audit

__all__ = ["failures"]


def _components(offsets, members, n_groups, n_instances, links, units) -> np.ndarray:
    """The connected component of each group (groups, instances, links, units)."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    group_of_edge = np.repeat(np.arange(n_groups), np.diff(offsets))
    linked = np.flatnonzero(links >= 0)
    rows = np.concatenate([group_of_edge, n_groups + linked, np.arange(n_groups)])
    cols = np.concatenate([n_groups + members, n_groups + links[linked], units])
    size = n_groups + n_instances
    graph = coo_matrix((np.ones(rows.size, dtype=np.int8), (rows, cols)), shape=(size, size))
    return connected_components(graph, directed=False)[1][:n_groups]


def _values(instances: np.ndarray, links: np.ndarray, hashes: np.ndarray, present: np.ndarray):
    """Per feature, each instance's value (the index of the earliest instance holding it:
    linked instances whose cell keeps its bits share one), each instance's row (linked
    instances share it), and whether any instance here is linked to another here."""
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
    per_feature = [roots((hashes[a, j] == hashes[b, j]) & present[a, j] & present[b, j])
                   for j in range(hashes.shape[1])]
    return per_feature, chain, True


def failures(store, new: list[np.ndarray], units: np.ndarray, p: int, present) -> list:
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
    """
    if not new:
        return []
    n_old = store.n_groups
    sizes = np.array([m.size for m in new], dtype=np.int64)
    offsets = np.concatenate([store.offsets, store.offsets[-1] + np.cumsum(sizes)])
    members = np.concatenate([store.members, *new]).astype(np.int64)
    units = np.concatenate([store.unit[:n_old], n_old + np.asarray(units, dtype=np.int64)])
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
    for c, start in zip(np.unique(component[n_old:]).tolist(), starts.tolist()):
        groups = order[start:start + int(counts[c])]
        instances = np.unique(np.concatenate([members[offsets[g]:offsets[g + 1]] for g in groups]))
        if groups.min() >= n_old and (owners[instances] == 1).all() and not linked[instances].any():
            continue  # one version's own groups and units
        reason = _judge(store, groups, instances, offsets, members, units, group_p, links,
                        min(p, int(group_p[groups].min())), present)
        if reason is not None:
            out.append((groups[groups >= n_old] - n_old, reason))
    return out


def _judge(store, groups, instances, offsets, members, units, group_p, links, floor, present):
    """Why one component fails, feature by feature (each distinct pattern once), or None.
    Without a link inside the component its values are its instances, whose sums the
    instances' audit (``release/span_audit``) has judged: the sums of squares then."""
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
    local = {g: np.searchsorted(instances, members[offsets[g]:offsets[g + 1]]) for g in groups.tolist()}
    by_unit: dict[int, list[int]] = {}
    for g in groups.tolist():
        by_unit.setdefault(int(units[g]), []).append(g)
    seen = set()
    for j in range(width):
        value = chain if per_feature is None else per_feature[j]
        key = (value.tobytes(), cells[:, j].tobytes())
        if key in seen:
            continue
        seen.add(key)
        group_lists, unit_lists = [], []
        for members_of in by_unit.values():
            unit_cells = []
            for g in members_of:
                here = local[g][cells[local[g], j]]
                if here.size >= group_p[g]:  # a group reports a feature of p cells or more
                    group_lists.append(np.unique(value[here]))
                    unit_cells.append(value[here])
            if unit_cells:
                unit_lists.append(np.unique(np.concatenate(unit_cells)))
        used = np.unique(np.concatenate(group_lists)) if group_lists else np.zeros(0, np.int64)
        remap = np.full(value.size, -1, dtype=np.int64)
        remap[used] = np.arange(used.size)
        part = versions_audit.Component(
            [remap[g] for g in group_lists],
            [remap[u][remap[u] >= 0] for u in unit_lists],
            used.size, chain[used] if used.size else used)
        reason = versions_audit.component_finding(part, floor, sums=linked)
        if reason is not None:
            return f"feature {j}: {reason}"
    return None

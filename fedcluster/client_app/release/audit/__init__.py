"""The one audit: new groups judged with everything the site has ever released (its
record, ``release/record``), before a value of theirs leaves.

Whatever builds a table (a version of the data, ``data/versions``; a report's parts,
``data/report_table.py``; any later builder), its new groups are released only once
:func:`judge` passes them with the whole record: every group of every table and report
partition of the data's lineage, from every run, process and reading. Three judgements,
each a family of groups' statistics as a coordinator could hold them (every group's
count and sums: ``local_kmeans`` with a cluster per group gives them all; every spread
unit's sum of squares):

1. **What the p% rule withheld stays withheld** (:func:`_protected`): a group whose sum of
   a feature the p% rule on means replaced by a stand-in (``release/dominance.py``; the
   record's FLAGGED stand-ins) protects every cell of it: no new group may release a sum
   of that feature holding one of those cells (a report's part, a version's group: each
   stands in there, or keeps the group whole). So no combination of released sums gives
   back, or estimates, a withheld sum: none holds its cells.
2. **No fewer than p rows, no row's change** (``span.py``): over the row instances, and
   per feature over its present cells and the groups that report it (a stand-in reports
   none), no combination of the groups' sums isolates fewer than p rows or values, and
   (p = 2) none gives two versions of a row's difference.
3. **No value determined** (``values.py``, ``moments.py``): over the cells' values (a
   corrected row's unchanged cells one value), no combination of sums isolates fewer than
   p values, none of sums of squares fewer than max(3, p), and the sums and sums of
   squares together determine no value and no row's change.

Each is decided for every component, whatever its size (``support.py``: exact where the
groups make chains or a bipartite graph and at p <= 3; elsewhere a sound bound that
refuses what it cannot prove). What a judgement refuses, the caller does not release: a
version holds the rows back (``data/versions/audited.py``); a report is answered with
the groups its finding rests on kept whole, or with every group whole
(``release/gate.py``).
"""

from __future__ import annotations

import numpy as np

from fedcluster.client_app.release.audit import span, values
from fedcluster.client_app.release.audit.span import Reason

__all__ = ["Reason", "judge", "protected_features"]


def protected_features(store, groups: list[np.ndarray], width: int) -> np.ndarray:
    """(len(groups), width) bool: per group (its instances), the features where it holds a
    cell the p% rule withheld: a new group must stand in there (a version's FORCED
    stand-ins), or not be released."""
    guarded = store.protected(width)
    out = np.zeros((len(groups), width), dtype=bool)
    if guarded.any():
        for j, members in enumerate(groups):
            out[j] = guarded[members].any(axis=0)
    return out


def _protected(store, new: list[np.ndarray], stood: np.ndarray | None, width: int) -> list:
    """(index into ``new``, reason) of the new groups whose released sum of a feature would
    hold a cell the p% rule withheld (module docstring, 1)."""
    guarded = store.protected(width)
    if not guarded.any():
        return []
    out = []
    for j, members in enumerate(new):
        held = guarded[members]
        real = np.ones(width, dtype=bool) if stood is None else ~stood[store.n_groups + j, :width]
        hit = held.any(axis=0) & real
        if hit.any():
            feature = int(np.flatnonzero(hit)[0])
            out.append((np.array([j]), Reason(
                f"feature {feature}: a released sum would hold a value the p% rule withheld",
                members[held[:, feature]])))
    return out


def judge(store, new: list[np.ndarray], units: np.ndarray, p: int, present, width: int,
          stood: np.ndarray | None = None) -> list[tuple[np.ndarray, Reason]]:
    """The new groups' findings (module docstring), each (indices into ``new``, reason).

    Parameters
    ----------
    store : release.record.Store
        The record: every group the site has released values from.
    new : list of int arrays
        The new groups' instances.
    units : (len(new),) int
        Each new group's spread unit among them (labelled by one of its groups; -1: its
        spread derived from released figures, as a report's part's, or withheld).
    p : int
        The site's p now.
    present : callable (instances) -> (n, d) bool, or None
        The instances' present cells (None: none missing).
    width : int
        The features.
    stood : (len(new), d) or (d,) bool, optional
        Per new group, the features whose sum is a stand-in (it reports no value of its
        rows there): a report's carried features, a version's forced stand-ins.
    """
    if not new:
        return []
    stood_all = values.stood_of(store, len(new), stood, width)
    if present is None and stood_all is not None:  # a stand-in: judged per feature too
        def present(instances):
            return np.ones((len(instances), width), dtype=bool)
    protected = _protected(store, new, stood_all, width)
    if protected:
        return protected
    answered = store.disclosed_groups()
    old_offsets, old_members = store.members_csr(answered)
    sizes = np.array([m.size for m in new], dtype=np.int64)
    offsets = np.concatenate([old_offsets, old_offsets[-1] + np.cumsum(sizes)])
    members = np.concatenate([old_members, *new]).astype(np.int64)
    min_size = np.concatenate([store.group_p[answered], np.full(len(new), p)]).astype(np.int64)
    n_old = answered.size

    def reports(groups):  # (a group reports a feature of p cells or more, not a stand-in)
        groups = np.asarray(groups)
        shown = np.array([present(members[offsets[g]:offsets[g + 1]]).sum(axis=0) >= min_size[g]
                          for g in groups.tolist()])
        return shown if stood_all is None or not groups.size else shown & ~stood_all[groups]
    findings = span.audit(offsets, members, store.n_instances, np.arange(n_old, n_old + len(new)),
                          min_size, p, store.same_row(), present,
                          None if present is None else reports)
    out = [(f.groups - n_old, f.reason) for f in findings]
    return out + values.failures(store, new, units, p, present, stood_all)

"""The rows a schema's ``drop-row`` drops, counted by groups too.

A dropped row is in no group a task answers from, but ``describe`` tells how many there
are. Counted row by row, that figure would move by one when one such row comes or goes
between versions; counted by groups of at least p_site of them, it moves by whole groups,
as the row count does. The groups follow the versions rule of the data's own groups
(``next_version.py``), on the rows' text alone: a group of the last version whose rows are
all still dropped stays; the others are withdrawn, and the waiting dropped rows (new
ones, and those of withdrawn groups) are cut, in the order of their keys, into groups of
p_site to 2 p_site - 1, once at least p_site of them are new (the rows of a withdrawn
group regrouped among themselves would give back how many went); until then they wait,
uncounted. (A count has no value to isolate: what this hides is how many rows came or
went, to within a group.)
"""

from __future__ import annotations

import numpy as np

__all__ = ["dropped_groups"]


def _tagged(keys: np.ndarray) -> list[tuple[int, int, int]]:
    """Each key with its rank among equal keys (the k-th alike dropped row)."""
    seen: dict[tuple[int, int], int] = {}
    out = []
    for k0, k1 in np.asarray(keys, dtype=np.uint64).tolist():
        rank = seen.get((k0, k1), 0)
        seen[(k0, k1)] = rank + 1
        out.append((k0, k1, rank))
    return out


def dropped_groups(keys: np.ndarray | None, earlier: np.ndarray | None,
                   min_size: int) -> np.ndarray:
    """The dropped rows' groups of a version: (m, 4) uint64 rows (key, key, rank, group),
    the kept groups first (numbered as before), then the new ones.

    Parameters
    ----------
    keys : (n, 2) uint64 or None
        The version's dropped rows (a hash of their cells' text).
    earlier : (k, 4) uint64 or None
        The base version's groups, in this form.
    min_size : int
        p_site.
    """
    now = _tagged(keys) if keys is not None else []
    present = set(now)
    rows: list[tuple[int, int, int, int]] = []
    before = set()
    if earlier is not None and len(earlier):
        by_group: dict[int, list[tuple]] = {}
        for k0, k1, rank, group in np.asarray(earlier, dtype=np.uint64).tolist():
            by_group.setdefault(group, []).append((k0, k1, rank))
            before.add((k0, k1, rank))
        kept = 0
        for group in sorted(by_group):
            members = by_group[group]
            if len(members) >= min_size and all(m in present for m in members):
                rows += [(*m, kept) for m in members]
                kept += 1
    taken = {r[:3] for r in rows}
    waiting = sorted(m for m in now if m not in taken)
    first = len({r[3] for r in rows})
    n_new = len(waiting) // min_size if sum(m not in before for m in waiting) >= min_size else 0
    for i, member in enumerate(waiting[:n_new * min_size] if n_new else []):
        rows.append((*member, first + min(i // min_size, n_new - 1)))
    if n_new:  # the remainder (fewer than p) joins the last new group
        rows += [(*m, first + n_new - 1) for m in waiting[n_new * min_size:]]
    return np.array(rows, dtype=np.uint64).reshape(-1, 4)

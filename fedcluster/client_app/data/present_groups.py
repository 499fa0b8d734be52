"""Groups that keep present values: a group left holding a feature's present cell alone
(1 to p_site - 1 present cells of it) is merged with a near group that mends it.

The lone-cell rule (``release/lone_cells.py``) withholds such cells: without this step it
cost a third to a half of a table's present values beyond those truly missing (the
clinical demo, 13 labs each 5-30% empty and independently so: at p_site 2 a lone cell in
about one group in two, at p_site 10 in nearly every group, whose 10-11 rows all hold a
lab only 16% of the time). Grouping rows by their pattern of missing cells does not
help enough (patterns are nearly unique: 2^14 of them) and costs the groups' purity
(measured: pattern-weighted distances lost 0.19 of the rows' label purity at p_site 2
and still left 1.10-1.61 x the missing cells counted missing). Merging does not lose a
value: the union of two groups holds the present cells of both, and a feature then
alone in neither is kept.

The rule, on the groups' statistics in the grouping's space (their means, their present
cells per feature): in rounds, each group with a lone feature, in group order, merges
with the candidate among its :data:`NEIGHBOURS` nearest groups (by mean) that costs the
least within-group scatter (Ward's increase, c_a c_b / (c_a + c_b) |m_a - m_b|^2) per
lone feature mended; a group merged in a round waits for the next (both groups' figures
change). Rounds stop when no group has a lone feature or none of them can be mended by
a neighbour. A merged group is a group like any other (rows, sums, present cells): every
rule after it (the span and versions audits, the spread rule, the ledger) sees a table of
groups of at least p_site rows, some larger than 2 p_site - 1.

What it costs: larger groups. On the clinical demo (4 sites; data seeds 0, 7 and 11)
the groups hold 2.7 p_site rows on average at p_site 2 (2 to 18 rows, most of 4 to 6),
2.6 at p_site 3, 2.5 at p_site 5 and 2.4 at p_site 10 (at most 52), where the grouping makes p_site to
2 p_site - 1; so a group that loses or changes a row (``versions/``) sends more rows to
wait for new ones. Bounding a union to 3 p_site - 1 rows left 0.5-3% of the present
values withheld (a handful of groups larger than the bound are what the data need) and
barely smaller groups on average, and a single withheld cell makes the versions audit
hold back every row when the floor is later raised over a table answered from; so the
merging is not bounded. What it gives (``bench/clinical_report.py``): no present value
withheld where a site holds at least p_site of its feature (it was 0.5 to 1.4 x the
cells truly missing at p_site 2 to 10), and the model's adjusted Rand index higher at
every floor.

The labels depend on the rows alone (a k-d tree's exact nearest neighbours, ties by the
lower group number), so the table stays a function of the rows.
"""

from __future__ import annotations

import numpy as np

__all__ = ["MAX_ROUNDS", "NEIGHBOURS", "merge_lone_groups"]

#: Candidates a group with a lone feature looks at (its nearest groups by mean).
NEIGHBOURS = 16
#: Rounds of merging at most.
MAX_ROUNDS = 12


def _lone(present: np.ndarray, min_size: int) -> np.ndarray:
    return (present > 0) & (present < min_size)


def merge_lone_groups(labels: np.ndarray, counts: np.ndarray, sums: np.ndarray,
                      present: np.ndarray, min_size: int) -> np.ndarray:
    """Each row's group once groups with a lone feature are merged (module docstring).

    Parameters
    ----------
    labels : (n,) int64
        Each row's group, ``0..G-1`` (-1: waiting, left as it is).
    counts : (G,) int
        Rows per group.
    sums : (G, d) float
        Per group the sum of its rows in the grouping's space (a missing cell at its
        feature's site mean, times the grouping's scale).
    present : (G, d) int
        Per group and feature, its present cells.
    min_size : int
        p_site.

    Returns
    -------
    (n,) int64
        Each row's group after merging, numbered by first appearance in row order (as
        ``grouping.group_rows`` numbers them); ``labels`` itself where nothing merges.
    """
    from scipy.spatial import cKDTree

    counts = np.asarray(counts, dtype=np.float64).copy()
    sums = np.array(sums, dtype=np.float64)
    present = np.array(present, dtype=np.int64)
    n_groups = len(counts)
    if min_size <= 1 or n_groups < 2 or not _lone(present, min_size).any():
        return labels
    root = np.arange(n_groups)
    alive = np.ones(n_groups, dtype=bool)
    for _ in range(MAX_ROUNDS):
        lone = _lone(present, min_size) & alive[:, None]
        waiting = np.flatnonzero(lone.any(axis=1))
        if not len(waiting):
            break
        live = np.flatnonzero(alive)
        means = sums[live] / counts[live, None]
        tree = cKDTree(means)
        reach = min(NEIGHBOURS + 1, len(live))
        _, near = tree.query(sums[waiting] / counts[waiting, None], k=reach)
        near = live[np.asarray(near).reshape(len(waiting), reach)]
        busy = np.zeros(n_groups, dtype=bool)
        merged = 0
        for a, candidates in zip(waiting, near):
            if busy[a]:
                continue
            choice = candidates[(candidates != a) & ~busy[candidates]]
            together = present[a][None, :] + present[choice]
            mended = (lone[a][None, :] & ~_lone(together, min_size)).sum(axis=1)
            if not mended.any():
                continue
            gap = sums[choice] / counts[choice, None] - sums[a] / counts[a]
            ward = counts[a] * counts[choice] / (counts[a] + counts[choice]) * \
                np.einsum("ij,ij->i", gap, gap)
            cost = np.where(mended > 0, ward / np.maximum(mended, 1), np.inf)
            b = int(choice[np.argmin(cost)])  # argmin: the nearer of equal costs
            keep, gone = min(a, b), max(a, b)
            counts[keep] += counts[gone]
            sums[keep] += sums[gone]
            present[keep] += present[gone]
            alive[gone] = False
            root[gone] = keep
            busy[keep] = busy[gone] = True
            merged += 1
        if not merged:
            break
    while True:  # each group's final group (a merged group may have merged again)
        up = root[root]
        if np.array_equal(up, root):
            break
        root = up
    out = np.where(labels >= 0, root[np.maximum(labels, 0)], -1)
    grouped = out >= 0
    _, first, inverse = np.unique(out[grouped], return_index=True, return_inverse=True)
    number = np.empty(len(first), dtype=np.int64)  # groups by first appearance in row order
    number[np.argsort(first, kind="stable")] = np.arange(len(first))
    out[grouped] = number[inverse]
    return out.astype(np.int64)

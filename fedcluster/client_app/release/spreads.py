"""What a group's spread says when it leaves: second moments only of units of at least
:data:`SPREAD_MIN_ROWS` rows, and never one that gives cells back.

A group's squared deviations per feature (its m2) are its second moment. For a group of
two rows with mean m and m2 v, the rows' values are m +- sqrt(v / 2): its spread IS its
rows (issue 54: ``kmeanspp`` gives every group's mean, a ``profile`` with one cluster per
group every group's m2, and 488 cells of a 200-row table came out to 3e-12). So the m2
a site keeps for its tasks (``SiteGroups.m2``) is its SPREAD UNIT's, shared:

- **Units.** A group of at least :data:`SPREAD_MIN_ROWS` rows is a unit of its own
  (every group at p_site >= 3). A smaller one (p_site = 2: a group of 2 rows) is paired
  with a nearby group (:func:`spread_partners`). Each group of a unit keeps the unit's m2
  shared by degrees of freedom (cells - 1), so the sum over a site's groups is unchanged
  (the site's SSE, its M2, Calinski-Harabasz's group scatter stay exact) and any
  combination of kept m2's is one of units' m2's: per feature of at least
  :data:`SPREAD_MIN_ROWS` cells.
- **No unit that gives cells back** (:func:`unit_reveals`): where values tie or coincide
  (data recorded to a few digits), a unit's m2 with its groups' means can still pin
  cells: a spread of 0 (every cell at its group's mean); a 2-cell group carrying all of
  its unit's spread (the other cells tie: the unit's m2 is the group's own); a 2-cell
  group whose share equals its own m2 (equal spreads per degree of freedom). Such a unit
  is merged with its nearest unit (``data/group_spreads.py``), which keeps every sum.
- **Withheld.** A unit whose spread the dominance rule flags (``dominance.py``), or one
  that merging cannot mend, gives its groups the site's pooled spread of the feature,
  ``typical`` x (cells - 1): a function of the released units, so it says nothing of
  its own rows (the site's totals then count the stand-in).

At p_site 2 DWF, mini-batch, FKM and k-FED use the groups' means alone, so their
training is unchanged; what moves is a group's own spread where a figure is per cluster
(Table 1's SDs, the profile's squared deviations): it is the unit's, shared.

The data layer (``data/group_spreads.py``) applies the rule when a table is made and
keeps the released m2 as the table's m2 (a kept group keeps it bit for bit across
versions); the one audit (``audit/moments.py``) reasons about the units.
"""

from __future__ import annotations

import numpy as np

from fedcluster.common.kernels import compiled_kernels

__all__ = ["EQUAL_WITHIN", "LEAF_GROUPS", "SPREAD_MIN_ROWS", "ZERO_WITHIN", "host_size",
           "member_shares", "pair_reveals", "pair_shares", "shares", "spread_partners",
           "tiny_spread", "unit_reveals", "units_rule"]

#: No second moment of fewer than this many rows leaves a site (DataSHIELD's default
#: cell rule is 3): a unit holds at least this many cells of a feature.
SPREAD_MIN_ROWS = 3
#: The groups of one leaf of the pairing's median splits (paired by nearest, inside).
LEAF_GROUPS = 64
#: Spreads this close (relative) count as equal (:func:`unit_reveals`): ties of values
#: recorded to a few digits are exact to rounding (1e-16), while in continuous data a
#: closer coincidence is a chance of about 1 in 30,000 a feature, which a coordinator
#: cannot tell from the rest.
EQUAL_WITHIN = 1e-9
#: A spread per cell under (this x the feature's scale)^2 is 0 (equal values' rounding).
ZERO_WITHIN = 1e-12


def host_size(min_size: int) -> int:
    """The fewest fresh rows a group that takes rows answered from before must hold
    (``data/versions/joining.py``): p, and :data:`SPREAD_MIN_ROWS`, so that its sum and
    its sum of squares each carry values found in no other group."""
    return max(int(min_size), SPREAD_MIN_ROWS)


# ------------------------------------------------------------------ pairing
def _leaves(points: np.ndarray, ids: np.ndarray, size: int) -> list[np.ndarray]:
    """``ids`` cut by median splits (each segment along its widest coordinate, ties by id)
    into leaves of at most ``size``, in a fixed order (compiled: ``spread_leaves``)."""
    order, starts = compiled_kernels().spread_leaves(
        np.ascontiguousarray(points, dtype=np.float64), np.asarray(ids, dtype=np.int64), int(size))
    return np.split(order, starts[1:-1])


def spread_partners(points: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Each group's spread partner (-1: a unit of its own).

    Groups of fewer than :data:`SPREAD_MIN_ROWS` rows are paired, each with the nearest
    group free (another small one, or a large one that takes at most one), found inside
    leaves of median splits of ``points`` (ties by index), and the few left over in a
    second round among themselves and the untaken large groups.

    Parameters
    ----------
    points : (G, d) float
        Where the groups lie (their means, standardised).
    counts : (G,) int
        Their rows.

    Returns
    -------
    (G,) int64
        The partner's index, symmetric; -1 for a group that is its own unit (a small one
        left so then has too few cells for a spread: ``data/group_spreads.py`` merges it).
    """
    counts = np.asarray(counts)
    partner = np.full(counts.size, -1, dtype=np.int64)
    small = counts < SPREAD_MIN_ROWS
    if not small.any():
        return partner
    points = np.nan_to_num(np.asarray(points, dtype=np.float64))
    taken = np.zeros(counts.size, dtype=bool)
    candidates = np.arange(counts.size)
    for _ in range(2):  # the leftovers of the first round meet in a second
        # inside each leaf, each small group without a partner (in the leaf's order) takes
        # the nearest group still free: a small one, or a large one no small group has
        # taken yet (compiled: spread_pair_leaves)
        order, starts = compiled_kernels().spread_leaves(points, candidates.astype(np.int64),
                                                         LEAF_GROUPS)
        compiled_kernels().spread_pair_leaves(points, order, starts, small, taken, partner)
        if not (small & (partner < 0)).any():
            break
        candidates = np.flatnonzero((small & (partner < 0)) | (~small & ~taken))
    return partner


# ------------------------------------------------------------------ a unit's spread
def tiny_spread(mean: np.ndarray, sd: np.ndarray) -> np.ndarray:
    """(d,) the spread per cell that counts as 0 in a feature whose values sit around
    ``mean`` with standard deviation ``sd``: what rounding leaves of equal values."""
    return (ZERO_WITHIN * (np.abs(mean) + sd)) ** 2


def _dof(cells) -> np.ndarray:
    return np.maximum(np.asarray(cells, dtype=np.float64) - 1.0, 0.0)


def shares(m2: np.ndarray, cells: np.ndarray) -> np.ndarray:
    """(k, d): a unit's m2 (``m2``: its k groups' own) shared by degrees of freedom."""
    dof = _dof(cells)
    total = dof.sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total > 0, m2.sum(axis=0) * (dof / np.where(total > 0, total, 1.0)), 0.0)


def unit_reveals(m2: np.ndarray, cells: np.ndarray, tiny: np.ndarray) -> np.ndarray:
    """(d,) bool: in which features a unit (its k groups' own ``m2`` and ``cells``, (k, d))
    that holds cells of the feature may not release its spread: fewer than :data:`SPREAD_MIN_ROWS` cells, or the spread
    would give cells back with the groups' means (module docstring): its total is 0, a
    group of fewer than :data:`SPREAD_MIN_ROWS` cells carries all of it, or such a
    group's share equals its own m2."""
    m2 = np.asarray(m2, dtype=np.float64)
    cells = np.asarray(cells)
    total, all_cells = m2.sum(axis=0), cells.sum(axis=0)
    few = all_cells < SPREAD_MIN_ROWS
    zero = total <= tiny * all_cells
    small = (cells > 0) & (cells < SPREAD_MIN_ROWS)
    carries = small & ((total[None, :] - m2) <= EQUAL_WITHIN * total[None, :])
    own = small & (m2 > 0) & (np.abs(shares(m2, cells) - m2) <= EQUAL_WITHIN * m2)
    return (few | zero | carries.any(axis=0) | own.any(axis=0)) & (all_cells > 0)


def units_rule(m2: np.ndarray, cells: np.ndarray, starts: np.ndarray,
               tiny: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Many units at once: ``m2`` and ``cells`` (M, d) their groups' own, unit by unit,
    each unit's first row at ``starts`` (U,). Returns (U, d) each: the unit's m2 total, its
    degrees of freedom and :func:`unit_reveals` (compiled, ``spread_units_rule``: the same
    sums in the same order); :func:`member_shares` gives its members' :func:`shares`."""
    m2 = np.ascontiguousarray(m2, dtype=np.float64)
    starts = np.asarray(starts, dtype=np.int64)
    sizes = np.diff(np.append(starts, m2.shape[0]))
    return compiled_kernels().spread_units_rule(
        m2, np.ascontiguousarray(cells, dtype=np.int64), starts, sizes,
        np.asarray(tiny, dtype=np.float64), EQUAL_WITHIN, SPREAD_MIN_ROWS)


def member_shares(total: np.ndarray, dof_total: np.ndarray, cells: np.ndarray) -> np.ndarray:
    """(n, d): the :func:`shares` of groups with ``cells``, each of a unit with ``total``
    and ``dof_total`` (rows of :func:`units_rule`), to the last bit."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(dof_total > 0, total * (_dof(cells) / np.where(dof_total > 0, dof_total, 1.0)),
                        0.0)


def pair_reveals(m2, partner_m2, cells, partner_cells, tiny) -> np.ndarray:
    """:func:`unit_reveals` of many units of one or two groups at once, elementwise
    ((n, d) arrays; ``partner_*`` 0 where a group has no partner)."""
    m2, partner_m2 = np.asarray(m2, dtype=np.float64), np.asarray(partner_m2, dtype=np.float64)
    total = m2 + partner_m2
    all_cells = cells + partner_cells
    few = all_cells < SPREAD_MIN_ROWS
    zero = total <= tiny[None, :] * all_cells
    mine_small = (cells > 0) & (cells < SPREAD_MIN_ROWS)
    theirs_small = (partner_cells > 0) & (partner_cells < SPREAD_MIN_ROWS)
    carries = (mine_small & (partner_m2 <= EQUAL_WITHIN * total)) | \
        (theirs_small & (m2 <= EQUAL_WITHIN * total))
    mine = pair_shares(m2, partner_m2, cells, partner_cells)
    theirs = pair_shares(partner_m2, m2, partner_cells, cells)
    own = (mine_small & (m2 > 0) & (np.abs(mine - m2) <= EQUAL_WITHIN * m2)) | \
        (theirs_small & (partner_m2 > 0) & (np.abs(theirs - partner_m2) <= EQUAL_WITHIN * partner_m2))
    return (few | zero | carries | own) & (all_cells > 0)


def pair_shares(m2, partner_m2, cells, partner_cells) -> np.ndarray:
    """:func:`shares` of each group of many units of one or two groups, elementwise."""
    dof, partner_dof = _dof(cells), _dof(partner_cells)
    total = dof + partner_dof
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(partner_dof > 0,
                        (m2 + partner_m2) * (dof / np.where(total > 0, total, 1.0)), m2)

"""The span audit: before a new version of a site's group table answers anything, what
every group table the site has answered from, taken together, can isolate.

The model. Every statistic of a group table is, per group, a sum over the group's rows
of a per-row value: its count (1 a row), per feature its present cells, their sum and
their sum of squares, its label counts. Whatever a coordinator asks, in any number of
tasks and runs, it can learn at most every group's statistics (``local_kmeans`` with as
many clusters as groups gives them all), so what it can compute about the rows is, for
each per-row value, the ROW SPACE of the incidence matrix A (one row per group ever
answered, one column per row instance: a row as it was in one or more versions; a row
that changed is two instances). A combination y of groups gives the per-row values
weighted by y^T A, so it isolates the instances where y^T A is nonzero: its support.

The audit, exact (integer arithmetic, no tolerance), per connected component of the
groups-instances graph that holds a new group (the other components were audited when
their newest group was made, and nothing has joined them since):

1. **No fewer than p rows.** Every nonzero vector of the row space has a support of at
   least p instances (p the site's ``min-cluster-size``; the smallest p any table of the
   component was answered at, since rows answered at a smaller p were already exposed at
   that size). One row (support 1) is the first case.
2. **No one-row change.** At p = 2 also: no difference e_u - e_w of two versions u, w of
   one row lies in the row space (it would give the change of that row: a correction
   exactly). Two versions of a row share the id of an id column; without one, any two
   instances count as possibly one row. (At p >= 3 such a difference, of support 2, is
   already excluded by 1.)

And the same for each feature's values over the instances whose cell is present and
the groups that report the feature (a group's present cells of a feature number 0 or at
least its p, ``release/lone_cells.withhold_lone_cells``): a coordinator may know which cells are
missing, and a missing cell is then a known zero.

How it stays fast: instances in exactly the same groups (an ATOM) are indistinguishable
by any statistic, so every vector of the row space is constant on atoms, and only atoms
of fewer than p instances ("light") can make a small support. A vector over the atoms is
in the row space exactly when it is a linear dependency among the columns of Z, the left
null space of the atoms-by-groups matrix; so 1 asks whether some light atoms whose
weights add up to less than p have dependent Z-columns (a zero column, two parallel
ones, or, at p >= 4, a few more, tried by exact rank once the light columns are known to
be dependent at all), and 2 whether two one-instance atoms have equal columns. A
component is an old group and the new ones its rows joined, or a short chain of such:
its matrices are small.

A component whose check would try more than :data:`MAX_SUBSETS` sets of atoms is
treated as failing (the caller then holds its new groups back): the audit never passes
what it has not shown.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

__all__ = ["Finding", "MAX_SUBSETS", "audit", "component_finding"]

#: The most sets of atoms (or hyperplanes) one component's check tries before it fails
#: the component (only at p >= 4, where the light atoms' columns are dependent).
MAX_SUBSETS = 20_000


@dataclass(frozen=True)
class Finding:
    """A component whose new groups the audit refuses.

    Attributes
    ----------
    groups : (m,) int64
        The component's NEW groups (indices into the audited groups).
    reason : str
        What the row space would hold (for the site's log and ``site check``).
    """

    groups: np.ndarray
    reason: str


# ------------------------------------------------------------------ exact linear algebra
# Integers only (Python's, unbounded): fraction-free Gauss-Jordan, each row kept divided
# by the gcd of its entries, so the numbers stay as small as the matrices' minors allow.
def _reduced(row: list[int]) -> list[int]:
    common = math.gcd(*row)
    return row if common in (0, 1) else [v // common for v in row]


def _echelon(matrix: list[list[int]]) -> tuple[list[list[int]], list[int]]:
    """The reduced echelon form over the rationals, as integer rows (each pivot the only
    nonzero of its column, not scaled to 1), and the pivot columns."""
    rows = [list(row) for row in matrix if any(row)]
    width = len(matrix[0]) if matrix else 0
    pivots: list[int] = []
    top = 0
    for col in range(width):
        if top == len(rows):
            break
        pivot = next((i for i in range(top, len(rows)) if rows[i][col]), None)
        if pivot is None:
            continue
        rows[top], rows[pivot] = rows[pivot], rows[top]
        lead = rows[top]
        for i in range(len(rows)):
            factor = rows[i][col]
            if i != top and factor:
                rows[i] = _reduced([a * lead[col] - b * factor for a, b in zip(rows[i], lead)])
        pivots.append(col)
        top += 1
    return rows[:top], pivots


def _null_space(matrix: list[list[int]], width: int) -> list[list[int]]:
    """An integer basis of {x : matrix x = 0} (x of length ``width``)."""
    reduced, pivots = _echelon(matrix) if matrix else ([], [])
    basis = []
    pivot_set = set(pivots)
    for free in (c for c in range(width) if c not in pivot_set):
        scale = math.lcm(*(row[col] for row, col in zip(reduced, pivots) if row[free])) \
            if any(row[free] for row in reduced) else 1
        vector = [0] * width
        vector[free] = scale
        for row, col in zip(reduced, pivots):
            if row[free]:
                vector[col] = -row[free] * scale // row[col]
        basis.append(_reduced(vector))
    return basis


def _transpose(matrix: list[list]) -> list[list]:
    return [list(column) for column in zip(*matrix)]


def _rank(columns: list[tuple[int, ...]]) -> int:
    """The rank of a few integer columns (exact)."""
    return len(_echelon([list(c) for c in columns])[0]) if columns else 0


# ------------------------------------------------------------------ one component
def _atoms(member_lists: list[np.ndarray]) -> tuple[list[tuple[int, ...]], list[list[int]]]:
    """The atoms of groups' member lists: (each atom's groups, each atom's instances),
    in a fixed order."""
    groups_of: dict[int, list[int]] = {}
    for g, members in enumerate(member_lists):
        for instance in members.tolist():
            groups_of.setdefault(instance, []).append(g)
    atoms: dict[tuple[int, ...], list[int]] = {}
    for instance in sorted(groups_of):
        atoms.setdefault(tuple(groups_of[instance]), []).append(instance)
    keys = sorted(atoms)
    return keys, [atoms[k] for k in keys]


def _direction(column: tuple[int, ...]) -> tuple[int, ...]:
    """A nonzero integer column up to its scale and sign (parallel columns share it)."""
    ints = list(column)
    common = math.gcd(*ints)
    ints = [v // common for v in ints]
    first = next(v for v in ints if v)
    return tuple(-v for v in ints) if first < 0 else tuple(ints)


def _smallest_cut(member_lists: list[np.ndarray], reports=None, present=None) -> int | None:
    """The smallest number of instances a nonzero combination of the groups isolates,
    when the groups form CHAINS (None when they do not).

    The versions rule builds groups so that an instance's groups, in the order they were
    made, are each the CHILD of the one before (the group its withdrawn group's other
    rows joined, whole), and a group has at most one child. Then, with phi(g) the sum of
    a combination's coefficients from g along the children to the last group (phi 0
    beyond), an instance first in group a and last in group b has the coefficient
    phi(a) - phi(child of b): every instance is an edge between two nodes (the groups and
    "beyond"), and the smallest support is the smallest positive cut of those edges (phi
    one value on one side and another on the other; a combination with more values has
    such a cut within its support). Exact, by integer maximum flows. For one feature's values,
    a group that does not report it has a zero coefficient (its node joins its child's)
    and an instance without a present cell is no edge."""
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import connected_components, maximum_flow

    m = len(member_lists)
    groups_of: dict[int, list[int]] = {}
    for g, members in enumerate(member_lists):  # groups in the order they were made
        for instance in members.tolist():
            groups_of.setdefault(instance, []).append(g)
    child = [-1] * m
    for chain in groups_of.values():
        for earlier, later in zip(chain, chain[1:]):
            if child[earlier] not in (-1, later):
                return None  # a group with two children: not chains
            child[earlier] = later
    for chain in groups_of.values():
        if any(child[g] != later for g, later in zip(chain, chain[1:])):
            return None
    beyond = m
    node = list(range(m + 1))  # a group not reporting joins its child's node (zero coefficient)

    def root(g: int) -> int:
        while node[g] != g:
            g = node[g]
        return g

    if reports is not None:
        for g in range(m):
            if not reports[g]:
                node[root(g)] = root(beyond if child[g] < 0 else child[g])
    kept = None if present is None else set(np.asarray(present).tolist())
    edges: dict[tuple[int, int], int] = {}
    for instance, chain in groups_of.items():
        if kept is not None and instance not in kept:
            continue
        a, c = root(chain[0]), root(beyond if child[chain[-1]] < 0 else child[chain[-1]])
        if a != c:
            edges[min(a, c), max(a, c)] = edges.get((min(a, c), max(a, c)), 0) + 1
    if not edges:
        return 2**31  # nothing to isolate: every combination is zero
    ends = np.array(list(edges), dtype=np.int64)
    capacity = np.array(list(edges.values()), dtype=np.int32)
    graph = csr_matrix((np.r_[capacity, capacity], (np.r_[ends[:, 0], ends[:, 1]],
                                                     np.r_[ends[:, 1], ends[:, 0]])),
                       shape=(m + 1, m + 1))
    # phi is free but for "beyond" (0), and a shift of phi changes nothing that matters
    # here: the smallest support is the smallest positive cut, the global minimum cut
    # of each connected part of the edges (a fixed node against every other one)
    _, part = connected_components(graph, directed=False)
    smallest = 2**31
    for label in np.unique(part[np.unique(ends)]):
        nodes = np.flatnonzero(part == label)
        smallest = min([smallest] + [int(maximum_flow(graph, int(nodes[0]), int(t)).flow_value)
                                     for t in nodes[1:]])
    return smallest


def component_finding(member_lists: list[np.ndarray], p: int, same_row, reports=None,
                      present=None, chains: bool = True) -> str | None:
    """Why a component's row space breaks the promise (module docstring), or None.

    A vector c over the atoms lies in the row space exactly when it is a linear
    dependency among the columns of Z, the left null space of the atoms-by-groups matrix
    (Z c = 0). So a combination isolating fewer than p instances is a DEPENDENT set of
    light atoms' Z-columns of weight under p: one zero column (one atom), two parallel
    ones, or a few more (:func:`_small_dependency`). A one-row change (p = 2) is two
    one-instance atoms with EQUAL columns.

    Parameters
    ----------
    member_lists : list of int arrays
        Each group's instances.
    p : int
        The fewest instances a nonzero combination may isolate.
    same_row : callable (u, w) -> bool
        Whether two instances may be two versions of one row.
    reports, present : optional
        For one feature's values: which groups report it (a bool per list), and the
        instances with a present cell (an array); the others count as known.
    chains : bool
        Try the minimum cut first (the lists may form chains, as the versions rule makes
        groups); False: straight to the atoms (spread units, which do not).
    """
    if p >= 3 and chains:
        cut = _smallest_cut(member_lists, reports, present)
        if cut is not None:  # the groups form chains (module docstring): exact by a cut
            return None if cut >= p else \
                f"a combination of the groups isolates {cut} row(s), fewer than {p}"
    if reports is not None:
        member_lists = [np.intersect1d(m, present, assume_unique=True)
                        for m, report in zip(member_lists, reports) if report]
    member_lists = [m for m in member_lists if m.size]
    if len(member_lists) < 2:
        return None  # one group: its own sum, of at least p rows
    groups, atom_instances = _atoms(member_lists)
    incidence = [[int(g in atom) for g in range(len(member_lists))] for atom in map(set, groups)]
    weights = [len(instances) for instances in atom_instances]
    left_null = _null_space(_transpose(incidence), len(incidence))
    column = [tuple(z[a] for z in left_null) for a in range(len(incidence))]
    light = sorted((a for a, w in enumerate(weights) if w < p), key=lambda a: weights[a])
    for a in light:
        if not any(column[a]):
            return f"a combination of the groups isolates {weights[a]} row(s), fewer than {p}"
    if p <= 2:
        equal: dict[tuple, list[int]] = {}
        for a in (a for a, w in enumerate(weights) if w == 1):
            equal.setdefault(column[a], []).append(atom_instances[a][0])
        for instances in equal.values():
            if any(same_row(u, w) for u, w in itertools.combinations(instances, 2)):
                return "a combination of the groups gives the difference of two versions of a row"
        return None
    return _small_dependency(column, weights, light, p)


def _small_dependency(column: list[tuple], weights: list[int], light: list[int], p: int) -> str | None:
    """Whether some light atoms whose weights add up to less than p have dependent
    Z-columns (p >= 3; none is zero). The dependencies among the light columns are a
    space V (the row space's vectors on light atoms alone); only the atoms some vector of
    V touches can be in one. Its smallest support is found either over the sets of fewer
    than p of those atoms (exact rank) or over V's hyperplanes (rank(V) - 1 of its rows at
    a time), whichever is fewer; past :data:`MAX_SUBSETS` the component fails."""
    dependencies = _null_space(_transpose([list(column[a]) for a in light]) or [[0] * len(light)],
                               len(light)) if light else []
    if not dependencies:
        return None  # the light atoms' columns are independent: no small dependency
    touched = [i for i in range(len(light)) if any(x[i] for x in dependencies)]
    weight = {i: weights[light[i]] for i in touched}
    if sum(weight.values()) < p:
        return (f"a combination of the groups isolates at most {sum(weight.values())} "
                f"row(s), fewer than {p}")
    parallel: dict[tuple, int] = {}
    for i in touched:
        direction = _direction(column[light[i]])
        if direction in parallel and weight[parallel[direction]] + weight[i] < p:
            return (f"a combination of the groups isolates "
                    f"{weight[parallel[direction]] + weight[i]} row(s), fewer than {p}")
        parallel.setdefault(direction, i)
    rank = len(dependencies)
    by_sets = sum(math.comb(len(touched), size) for size in range(3, p))
    by_hyperplanes = math.comb(len(touched), rank - 1)
    if min(by_sets, by_hyperplanes) > MAX_SUBSETS:
        return f"too many combinations to audit ({MAX_SUBSETS}+)"
    if by_hyperplanes < by_sets:
        basis = _transpose(_echelon([[x[i] for i in touched] for x in dependencies])[0])
        for chosen in itertools.combinations(range(len(touched)), rank - 1):
            directions = _null_space([basis[r] for r in chosen], rank)
            if len(directions) != 1:
                continue  # dependent rows: not a hyperplane's basis
            mu = directions[0]
            support = sum(weight[touched[r]] for r, row in enumerate(basis)
                          if sum(a * b for a, b in zip(row, mu)))
            if support < p:
                return f"a combination of the groups isolates {support} row(s), fewer than {p}"
        return None
    for size in range(3, p):
        for chosen in itertools.combinations(touched, size):
            total = sum(weight[i] for i in chosen)
            if total < p and _rank([column[light[i]] for i in chosen]) < size:
                return (f"a combination of the groups isolates at most {total} row(s), "
                        f"fewer than {p}")
    return None


# ------------------------------------------------------------------ every component
def _components(offsets: np.ndarray, members: np.ndarray, n_instances: int) -> np.ndarray:
    """The connected component of each group in the groups-instances graph."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    n_groups = offsets.size - 1
    group_of_edge = np.repeat(np.arange(n_groups), np.diff(offsets))
    size = n_groups + n_instances
    graph = coo_matrix((np.ones(members.size, dtype=np.int8),
                        (group_of_edge, members + n_groups)), shape=(size, size))
    return connected_components(graph, directed=False)[1][:n_groups]


def audit(offsets: np.ndarray, members: np.ndarray, n_instances: int, new: np.ndarray,
          group_min_size: np.ndarray, p: int, same_row, present=None,
          group_reports=None) -> list[Finding]:
    """The components of new groups that break the promise (module docstring).

    Parameters
    ----------
    offsets, members : int64 arrays
        The audited groups (every group of every table answered from, and the new ones)
        as CSR: group g's instances are ``members[offsets[g]:offsets[g + 1]]``.
    n_instances : int
    new : (m,) int64
        The new groups (their rows are not answered yet).
    group_min_size : (G,) int
        Each group's p (the table's it was made for).
    p : int
        The site's p now.
    same_row : callable (u, w) -> bool
        Whether two instances may be two versions of one row.
    present : callable (instances) -> (n, d) bool, optional
        The instances' present cells (None: no cell of the data is missing).
    group_reports : callable (groups) -> (m, d) bool, optional
        Whether each group reports each feature (its present cells 0 or at least its p).
    """
    new = np.asarray(new, dtype=np.int64)
    if new.size == 0:
        return []
    component = _components(offsets, members, n_instances)
    wanted = np.unique(component[new])
    sizes = np.bincount(component, minlength=int(component.max()) + 1)
    wanted = wanted[sizes[wanted] > 1]  # a new group alone is its own sum, >= p rows
    if wanted.size == 0:
        return []
    is_new = np.zeros(offsets.size - 1, dtype=bool)
    is_new[new] = True
    order = np.argsort(component, kind="stable")
    starts = np.searchsorted(component[order], wanted)
    findings = []
    for c, start in zip(wanted.tolist(), starts.tolist()):
        groups = order[start:start + int(sizes[c])]
        lists = [members[offsets[g]:offsets[g + 1]] for g in groups.tolist()]
        floor = int(min(p, group_min_size[groups].min()))
        reason = component_finding(lists, floor, same_row)
        if reason is None and present is not None:
            reason = _feature_findings(groups, lists, floor, same_row, present, group_reports)
        if reason is not None:
            findings.append(Finding(groups[is_new[groups]], reason))
    return findings


def _feature_findings(groups: np.ndarray, lists: list[np.ndarray], floor: int, same_row,
                      present, group_reports) -> str | None:
    """The audit of each feature's values: instances with a present cell, groups that
    report the feature (each distinct pattern once)."""
    instances = np.unique(np.concatenate(lists))
    cells = np.asarray(present(instances), dtype=bool)  # (n, d)
    reports = np.asarray(group_reports(groups), dtype=bool)  # (m, d)
    if cells.all() and reports.all():
        return None
    seen = set()
    for j in range(cells.shape[1]):
        if cells[:, j].all() and reports[:, j].all():
            continue  # the same as the whole table's audit
        key = (cells[:, j].tobytes(), reports[:, j].tobytes())
        if key in seen:
            continue
        seen.add(key)
        reason = component_finding(lists, floor, same_row, reports[:, j], instances[cells[:, j]])
        if reason is not None:
            return f"feature {j}: {reason}"
    return None

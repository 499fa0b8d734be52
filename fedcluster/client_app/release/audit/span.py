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

How it decides (``support.py`` proves each step): instances in exactly the same groups
(an ATOM) are indistinguishable by any statistic, so every vector of the row space is
constant on atoms, and only atoms of fewer than p instances ("light") can make a small
support.

- Groups that form CHAINS (as the versions rule makes them) or a bipartite GRAPH (a table
  and one report partition of it, each row in its group and at most one part): the
  smallest support is a minimum cut, exact, by integer maximum flows.
- Otherwise, at p <= 3, exactly by linear algebra over the integers: a vector over the
  atoms is in the row space exactly when it is a linear dependency among the columns of
  Z, the left null space of the atoms-by-groups matrix; so 1 asks whether a light atom's
  Z-column is zero or (p = 3) two one-instance atoms' columns are parallel, and 2 whether
  two one-instance atoms have equal columns.
- Otherwise (p >= 4, groups overlapping in three ways or more, as report partitions of
  one version drawn at several k), a sound bound by linear programs, polynomial in the
  record: it passes only what it proves, and refuses the rest, naming the support it found
  (fewer than p rows: a finding; p or more: the bound could not exclude a smaller one).
  There is no budget after which the audit gives up: every component is decided.
"""

from __future__ import annotations

import hashlib
import itertools
from dataclasses import dataclass

import numpy as np

from fedcluster.client_app.release.audit import draws, support, together
from fedcluster.client_app.release.audit.bound import lp_bound

__all__ = ["Finding", "Passed", "Reason", "audit", "component_finding"]


class Reason(str):
    """Why a component breaks the promise (its text), with the instances its finding
    rests on (``instances``: the support found; empty where the finding names none), so
    that a coarser answer can leave them out."""

    instances: np.ndarray

    def __new__(cls, text: str, instances=()) -> "Reason":
        made = super().__new__(cls, text)
        made.instances = np.asarray(instances, dtype=np.int64).ravel()
        return made


@dataclass(frozen=True)
class Finding:
    """A component whose new groups the audit refuses.

    Attributes
    ----------
    groups : (m,) int64
        The component's NEW groups (indices into the audited groups).
    reason : Reason
        What the row space would hold (for the site's log and ``site check``), and the
        instances it rests on.
    """

    groups: np.ndarray
    reason: "Reason"


# ------------------------------------------------------------------ one component
def _smallest_cut(member_lists: list[np.ndarray], reports=None, present=None,
                  below: int | None = None) -> int | None:
    """The smallest number of instances a nonzero combination of the groups isolates,
    when the groups form CHAINS (None when they do not); ``below``: only whether it is
    under ``below`` (``support.minimum_cut``).

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
    # phi is free but for "beyond" (0), and a shift of phi changes nothing that matters
    # here: the smallest support is the smallest positive cut (``support.minimum_cut``)
    ends = np.array(list(edges), dtype=np.int64)
    return support.minimum_cut(ends, np.array(list(edges.values()), dtype=np.int64), m + 1, below)[0]


def _isolates(rows: int, p: int, instances=(), proved: bool = True) -> Reason:
    if proved:
        return Reason(f"a combination of the groups isolates {rows} row(s), fewer than {p}",
                      instances)
    return Reason(f"the audit's bound cannot exclude a combination of fewer than {p} rows "
                  f"(its best lies on {rows})", instances)


def component_finding(member_lists: list[np.ndarray], p: int, same_row, reports=None,
                      present=None, chains: bool = True, passed: "Passed | None" = None
                      ) -> Reason | None:
    """Why a component's row space breaks the promise (module docstring), or None.

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
        Try the minimum cut of chains first (the lists may form chains, as the versions
        rule makes groups); False: not (spread units, which do not).
    passed : Passed, optional
        Parts judged before (another feature's), to be passed without judging again.
    """
    if p >= 3 and chains:
        cut = _smallest_cut(member_lists, reports, present, p)
        if cut is not None:  # the groups form chains (module docstring): exact by a cut
            return None if cut >= p else _isolates(cut, p)
    if reports is not None:
        member_lists = [np.intersect1d(m, present, assume_unique=True)
                        for m, report in zip(member_lists, reports) if report]
    member_lists = [m for m in member_lists if m.size]
    for part in _connected(member_lists):  # (what shares no row with the rest: its own)
        lists = [member_lists[g] for g in part]
        key = None if passed is None else passed.key(lists, p)
        if key is not None and key in passed.seen:
            continue  # (judged already, for another feature: it passed)
        reason = _part_finding(lists, p, same_row)
        if reason is not None:
            return reason
        if key is not None:
            passed.seen.add(key)
    return None


class Passed:
    """The connected parts a component's audit found to pass, by content, so that another
    feature's identical part is not judged again (``values._judge``: a feature's values
    differ from another's only around the rows changed in it). A part's finding is a
    function of its lists, p and which of its values are one row's versions, and is the
    same however its values are numbered, if in the same order (atoms, sets and draws
    are indexed by the lists, never by a value's number); so the key names each value
    by ``names`` (a number that does not change from feature to feature: its first
    instance), and ``kind`` says which test (``same_row`` fixed per kind and component).
    A memo of passes only: a finding ends the component's audit."""

    def __init__(self, seen: set | None = None, names: np.ndarray | None = None,
                 kind: str = "") -> None:
        self.seen = set() if seen is None else seen
        self.names, self.kind = names, kind

    def named(self, names: np.ndarray) -> "Passed":
        return Passed(self.seen, np.asarray(names, dtype=np.int64), self.kind)

    def of(self, kind: str) -> "Passed":
        return Passed(self.seen, self.names, kind)

    def key(self, lists: list[np.ndarray], p: int) -> bytes:
        sizes = np.fromiter((m.size for m in lists), dtype=np.int64, count=len(lists))
        digest = hashlib.blake2b(f"{self.kind}:{p}:".encode(), digest_size=16)
        digest.update(sizes.tobytes())
        digest.update(self.names[np.concatenate(lists)].tobytes())
        return digest.digest()


def _connected(member_lists: list[np.ndarray]) -> list[np.ndarray]:
    """The lists in connected parts (two share a part where they share an instance),
    the parts of two lists or more."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    if len(member_lists) < 2:
        return []
    owner = np.repeat(np.arange(len(member_lists)), [m.size for m in member_lists])
    instances, where = np.unique(np.concatenate(member_lists), return_inverse=True)
    size = len(member_lists) + instances.size
    graph = coo_matrix((np.ones(owner.size, dtype=np.int8), (owner, len(member_lists) + where)),
                       shape=(size, size))
    label = connected_components(graph, directed=False)[1][:len(member_lists)]
    order = np.argsort(label, kind="stable")
    parts = support.pieces(order, np.r_[0, np.flatnonzero(np.diff(label[order])) + 1])
    return [part for part in parts if part.size > 1]


def _part_finding(member_lists: list[np.ndarray], p: int, same_row) -> Reason | None:
    """:func:`component_finding` of one connected part (module docstring)."""
    found = support.atoms(member_lists)
    light = found.weights < p
    if not light.any() and p > 2:
        return None  # every support holds an atom of p rows or more
    graph = support.graph_cut(found, p)
    if graph is not None:
        smallest, cut = graph
        if smallest < p:
            return _isolates(smallest, p, found.rows_of(cut))
        if p > 2 or not _change_candidates(found, same_row):
            return None
    if p <= 3:
        return _by_columns(found, p, same_row)
    bound = lp_bound(found, p)
    if bound.holds:
        return None
    if bound.witness is None:
        return Reason("the audit's linear programs did not solve: nothing is shown")
    return _isolates(bound.witness, p, found.rows_of(bound.atoms), bound.witness < p)


def _change_candidates(found: support.Atoms, same_row) -> bool:
    """Whether two one-instance atoms may be versions of one row (p <= 2: their
    difference must not lie in the row space)."""
    singles = found.member_idx[found.member_ptr[:-1][found.weights == 1]].tolist()
    if hasattr(same_row, "any_pair"):  # (a site's record: in one pass)
        return same_row.any_pair(np.array(singles, dtype=np.int64))
    return any(same_row(u, w) for u, w in itertools.combinations(singles, 2))


def _columns(found: support.Atoms, prime: int) -> np.ndarray:
    """(atoms, k) the atoms' columns of Z, the left null space of the atoms-by-groups
    incidence, modulo ``prime``; where a report's parts hold very many atoms together,
    three uniform draws of Z's rows (``draws.py``: zero, parallel and equal columns are so
    at every draw, and seem so by chance with odds under prime^-2)."""
    atom = found.entry_atoms()
    by_set = np.argsort(found.set_idx, kind="stable")  # (each set's atoms in order)
    bounds = np.searchsorted(found.set_idx[by_set], np.arange(found.n_sets + 1))
    bounds = np.unique(bounds)  # (the sets holding no atom left out)
    rows = support.pieces(atom[by_set], bounds[:-1]) if atom.size else []
    n = found.weights.size
    if n > draws.BLOCK_SIZE:  # (never held dense)
        return draws.null_draws(rows, None, n, prime, np.random.default_rng(0xA70B), k=3).T
    incidence = np.zeros((n, found.n_sets), dtype=np.int64)
    incidence[atom, found.set_idx] = 1
    return support.null_space_mod(incidence.T, prime).T


def _by_columns(found: support.Atoms, p: int, same_row) -> Reason | None:
    """The test of the module docstring at p <= 3, by the columns of Z: a light atom's
    zero column; at p = 3 two one-instance atoms' parallel columns; at p <= 2 two
    one-instance versions of a row with equal columns. Over the integers modulo each of
    ``support.PRIMES``, a finding under either refused (a rank modulo a prime falls short
    of the rational rank only where the prime divides every maximal nonzero minor)."""
    weights = found.weights
    light = np.flatnonzero(weights < p)
    light = light[np.argsort(weights[light], kind="stable")]
    singles = np.flatnonzero(weights == 1)
    for prime in support.PRIMES:
        try:
            column = _columns(found, prime)
        except draws.TooLarge as error:  # (no decision: refused, never passed)
            return Reason(f"refused, {error}")
        zero = ~column[light].any(axis=1)  # (the lightest first: light is in weight order)
        if zero.any():
            a = int(light[np.argmax(zero)])
            return _isolates(int(weights[a]), p, found.members_of(a))
        if singles.size == 0 or p > 3:
            continue
        keys = column[singles]
        if p == 3:  # each column scaled to its first nonzero entry 1: parallel = equal
            lead = keys[np.arange(singles.size), np.argmax(keys != 0, axis=1)]
            keys = (keys * support.inverse_mod(lead, prime)[:, None]) % prime
        first, key = support.equal_rows(keys)
        again = np.flatnonzero(first[key] != np.arange(singles.size))  # a key seen before
        if p == 3 and again.size:
            a, seen = int(singles[again[0]]), int(singles[first[key[again[0]]]])
            return _isolates(2, p, np.r_[found.members_of(seen), found.members_of(a)])
        if p <= 2:  # the keys held by several atoms, in the order they first come
            shared = np.unique(key[again])
            for k in shared[np.argsort(first[shared], kind="stable")]:
                atoms = singles[key == k].tolist()
                for a, b in itertools.combinations(atoms, 2):
                    if same_row(int(found.members_of(a)[0]), int(found.members_of(b)[0])):
                        return Reason("a combination of the groups gives the difference of two "
                                      "versions of a row",
                                      np.r_[found.members_of(a), found.members_of(b)])
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
    parts = [order[start:start + int(sizes[c])] for c, start in zip(wanted.tolist(), starts.tolist())]
    all_lists = [[members[offsets[g]:offsets[g + 1]] for g in groups.tolist()] for groups in parts]
    floors = np.array([min(p, int(group_min_size[groups].min())) for groups in parts])
    passes = np.zeros(len(parts), dtype=bool)  # (judged together where they all pass)
    for floor in np.unique(floors).tolist():
        at = np.flatnonzero(floors == floor)
        passes[at] = together.passing([all_lists[i] for i in at.tolist()], floor, same_row)
    findings = []
    for groups, lists, floor, passed in zip(parts, all_lists, floors.tolist(), passes.tolist()):
        reason = None if passed else component_finding(lists, floor, same_row)
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
            return Reason(f"feature {j}: {reason}", reason.instances)
    return None

"""The fewest rows (or values) a combination of released row sets can isolate: the
decision every audit of a site's record rests on.

A released sum over a row set S is the sum of a per-row value over S; a coordinator that
holds sums over the sets S_1 .. S_m holds sum_i y_i (sum over S_i) for every y, a sum
weighted by c = sum_i y_i 1_{S_i} over the rows: the combination ISOLATES the support of c.
The question is whether some nonzero c of that row space has a support of fewer than p
rows (a sparsest-vector question, NP-hard in general). What this module answers:

**Atoms.** Rows in exactly the same sets (an ATOM of the sets' common refinement) get one
coefficient in every c, so a support is a union of atoms; an atom of p rows or more
(heavy) makes any support that holds it p or more, so only combinations supported on
LIGHT atoms (fewer than p rows) matter: the space V of row-space vectors that vanish on
every heavy atom.

**Exact where the sets make a graph** (:func:`graph_cut`). Where every atom lies in at most
two of the sets and the sets' graph (a set a node, an atom in two sets an edge between
them, an atom in one set an edge to a node "beyond" held at 0) has no odd cycle, flipping
the sign of one side's coefficients makes every c a difference of node potentials: its
support is the cut between the nodes' levels, and the smallest support of a nonzero c is
the graph's minimum cut (integer maximum flows, exact). One table and one report
partition of it (each row in its group and at most one part), or one table and the next
version's groups, are such graphs.

**A sound bound everywhere else** (``bound.py``). For a nonzero c of V with support
weight W < p, scale c so that its largest coefficient in magnitude is 1 at atom a0: then
sum_a w_a |c_a| <= W, since |c_a| <= 1 on its support and 0 off it. So the linear program

    LP(a0) = min sum_a w_a t_a  subject to  c = A^T y,  c_a = 0 on heavy atoms,
             c_a0 = 1,  -t_a <= c_a <= t_a <= 1

is at most W <= p - 1 for that a0. Contrapositive: where LP(a0) > p - 1 for every light
atom a0, no combination isolates fewer than p rows (a proof by a polynomial number of
linear programs, with a margin for the solver's tolerance). Where some LP(a0) <= p - 1,
its optimal c names a support: fewer than p rows is a finding proved by example; more is
the bound's own refusal (a combination of fewer than p rows is not excluded). On graphs the
bound is exact (the cut LP has integral optima), so it refuses only where sets overlap in
three or more ways, as report partitions of one version drawn at several k do;
``tests/test_versions.py`` measures how often against a brute-force search.
"""

from __future__ import annotations

import numpy as np

__all__ = ["Atoms", "PRIMES", "atoms", "cut_at_least", "equal_rows", "graph_cut", "inverse_mod",
           "minimum_cut", "null_space_mod", "parts_graph", "pieces", "product_mod", "reduced_rows"]


class Atoms:
    """The common refinement of some row sets, as two flat lists (CSR).

    Attributes
    ----------
    set_ptr, set_idx : int64 arrays
        Atom a's sets (indices into the row sets, sorted) are
        ``set_idx[set_ptr[a]:set_ptr[a + 1]]``; atoms come in the order of those tuples.
    weights : (A,) int64
        Each atom's rows.
    member_ptr, member_idx : int64 arrays
        Atom a's rows (sorted) are ``member_idx[member_ptr[a]:member_ptr[a + 1]]``.
    n_sets : int
    """

    def __init__(self, set_ptr, set_idx, weights, member_ptr, member_idx, n_sets: int) -> None:
        self.set_ptr, self.set_idx, self.weights = set_ptr, set_idx, weights
        self.member_ptr, self.member_idx, self.n_sets = member_ptr, member_idx, int(n_sets)

    @property
    def set_sizes(self) -> np.ndarray:
        return np.diff(self.set_ptr)

    @property
    def sets(self) -> list[tuple[int, ...]]:
        """Each atom's sets as a tuple (for the small components' Python paths)."""
        flat = self.set_idx.tolist()
        bounds = self.set_ptr.tolist()
        return [tuple(flat[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]

    def members_of(self, atom: int) -> np.ndarray:
        return self.member_idx[self.member_ptr[atom]:self.member_ptr[atom + 1]]

    @property
    def members(self) -> list[np.ndarray]:
        return [self.members_of(a) for a in range(self.weights.size)]

    def rows_of(self, chosen: np.ndarray) -> np.ndarray:
        """The rows of the ``chosen`` atoms ((A,) bool), atom by atom."""
        return self.member_idx[np.repeat(np.asarray(chosen, dtype=bool), self.weights)]

    def entry_atoms(self) -> np.ndarray:
        """Each entry of ``set_idx``'s atom."""
        return np.repeat(np.arange(self.weights.size), self.set_sizes)


def atoms(member_lists: list[np.ndarray]) -> Atoms:
    """The atoms of ``member_lists`` (each a set's rows), in a fixed order: by their
    tuples of sets (a tuple before any it is a prefix of), each atom's rows sorted."""
    empty = np.zeros(0, dtype=np.int64)
    if not member_lists:
        return Atoms(np.zeros(1, dtype=np.int64), empty, empty, np.zeros(1, dtype=np.int64),
                     empty, 0)
    owner = np.repeat(np.arange(len(member_lists)), [m.size for m in member_lists])
    rows = np.concatenate(member_lists).astype(np.int64)
    order = np.lexsort((owner, rows))  # by row, then by set
    rows, owner = rows[order], owner[order]
    starts = np.flatnonzero(np.r_[True, rows[1:] != rows[:-1]])
    lens = np.diff(np.r_[starts, rows.size])
    # each row's sets, padded with -1 (so a tuple sorts before any it is a prefix of)
    key = np.full((starts.size, int(lens.max())), -1, dtype=np.int64)
    at = np.arange(rows.size) - np.repeat(starts, lens)  # (each entry's place in its row's)
    key[np.repeat(np.arange(starts.size), lens), at] = owner
    by_key = np.lexsort(key.T[::-1])  # first column first; rows ascending within a key
    key = key[by_key]
    first = np.r_[True, (key[1:] != key[:-1]).any(axis=1)]
    heads = np.flatnonzero(first)
    weights = np.diff(np.r_[heads, by_key.size]).astype(np.int64)
    sizes = lens[by_key[heads]]
    head_keys = key[heads]
    set_idx = head_keys[head_keys >= 0]  # (row-major: each atom's sets in order)
    return Atoms(np.r_[0, np.cumsum(sizes)].astype(np.int64), set_idx.astype(np.int64), weights,
                 np.r_[0, np.cumsum(weights)].astype(np.int64), rows[starts][by_key],
                 len(member_lists))


def pieces(flat: np.ndarray, starts) -> list[np.ndarray]:
    """``flat`` cut into pieces starting at ``starts`` (sorted; the first 0 unless there
    are none, the last running to the end), as views: ``np.split`` without its per-piece
    overhead (the audit cuts tens of thousands of pieces a feature)."""
    bounds = [*np.asarray(starts, dtype=np.int64).tolist(), flat.shape[0]]
    return [flat[a:b] for a, b in zip(bounds[:-1], bounds[1:])]


def equal_rows(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row's class of equal rows (``key``) and each class's first row (``first``),
    as ``np.unique(keys, axis=0, return_index=True, return_inverse=True)`` gives them up to
    the classes' numbering (by a stable sort of the rows, without its structured view)."""
    if keys.shape[0] == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    if keys.ndim > 1 and keys.shape[1] == 0:  # (rows of no entry are all equal)
        return np.zeros(1, dtype=np.int64), np.zeros(keys.shape[0], dtype=np.int64)
    order = np.lexsort(keys.T[::-1])
    ordered = keys[order]
    head = np.r_[True, (ordered[1:] != ordered[:-1]).any(axis=1)]
    key = np.empty(keys.shape[0], dtype=np.int64)
    key[order] = np.cumsum(head) - 1
    return order[head], key  # (stable: a class's first row in the order is its first)


#: The fields exact linear algebra is done in (integers modulo a prime, numpy's int64: a
#: product of two residues stays under 2^62). An integer matrix's rank modulo p is its
#: rank over the rationals unless p divides every maximal nonzero minor; the audit asks
#: both primes and refuses what either finds, so a finding is missed only where both
#: divide one such minor of a 0/1 matrix (for a minor of 1,000 bits, one prime near 2^31
#: in 10^7 does).
PRIMES = (2_147_483_647, 2_147_483_629)


def reduced_rows(matrix: np.ndarray, prime: int = PRIMES[0]) -> tuple[np.ndarray, list[int]]:
    """The reduced row echelon form of ``matrix`` over GF(``prime``): its nonzero rows
    ((r, n) int64) and their pivot columns (Gauss-Jordan, a pivot's column cleared in
    every other row at once)."""
    A = np.array(matrix, dtype=np.int64) % prime
    m, n = A.shape
    pivots, row = [], 0
    for col in range(n):
        if row == m:
            break
        nonzero = np.flatnonzero(A[row:, col])
        if nonzero.size == 0:
            continue
        at = row + int(nonzero[0])
        if at != row:
            A[[row, at]] = A[[at, row]]
        A[row, col:] = (A[row, col:] * pow(int(A[row, col]), prime - 2, prime)) % prime
        others = np.flatnonzero(A[:, col])
        others = others[others != row]
        if others.size:  # (left of its pivot the row is 0; each sum below 2^63)
            A[others, col:] = (A[others, col:] + (prime - A[others, col])[:, None]
                               * A[row, col:][None, :]) % prime
        pivots.append(col)
        row += 1
    return A[:len(pivots)], pivots


def null_space_mod(matrix: np.ndarray, prime: int = PRIMES[0]) -> np.ndarray:
    """A basis of {z : matrix z = 0} over GF(``prime``), as the rows of a (k, n) array."""
    A, pivots = reduced_rows(matrix, prime)
    n = A.shape[1]
    is_pivot = np.zeros(n, dtype=bool)
    is_pivot[pivots] = True
    free = np.flatnonzero(~is_pivot)
    basis = np.zeros((free.size, n), dtype=np.int64)
    basis[np.arange(free.size), free] = 1
    if pivots:
        basis[:, pivots] = (-A[:, free].T) % prime
    return basis


def inverse_mod(values: np.ndarray, prime: int = PRIMES[0]) -> np.ndarray:
    """Each of ``values`` (nonzero residues) inverted in GF(``prime``): values^(prime - 2),
    by squaring, all at once (residues below 2**31: products stay in int64)."""
    result = np.ones_like(values, dtype=np.int64)
    base, exponent = np.asarray(values, dtype=np.int64) % prime, prime - 2
    while exponent:
        if exponent & 1:
            result = (result * base) % prime
        base, exponent = (base * base) % prime, exponent >> 1
    return result


def product_mod(matrix, vector: np.ndarray, prime: int = PRIMES[0]) -> np.ndarray:
    """``matrix @ vector`` over GF(``prime``) without overflow (entries below 2**31, a
    dense or sparse matrix): the vector in 16-bit halves, the columns 16,384 at a time."""
    vector = np.asarray(vector, dtype=np.int64) % prime
    low, high = vector & 0xFFFF, vector >> 16
    out = np.zeros(matrix.shape[0], dtype=np.int64)
    for start in range(0, matrix.shape[1], 16384):
        part = matrix[:, start:start + 16384]
        for half, shift in ((low, 1), (high, 1 << 16)):
            piece = np.asarray(part @ half[start:start + 16384]).ravel().astype(np.int64) % prime
            out = (out + piece * shift) % prime
    return out


# ------------------------------------------------------------------ graphs: exact
def _odd_nodes(edges: np.ndarray, n: int) -> np.ndarray:
    """The nodes on or joined to an odd cycle of the graph of ``edges`` ((E, 2) nodes
    0..n-1): those that meet themselves on the other side in the graph's double cover
    (each edge u-v joins u's one side to v's other)."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    edges = np.asarray(edges, dtype=np.int64).reshape(-1, 2)
    if edges.shape[0] == 0:
        return np.zeros(0, dtype=np.int64)
    u, v = edges[:, 0], edges[:, 1]
    cover = coo_matrix((np.ones(2 * u.size, dtype=np.int8), (np.r_[u, u + n], np.r_[v + n, v])),
                       shape=(2 * n, 2 * n))
    label = connected_components(cover, directed=False)[1]
    return np.flatnonzero(label[:n] == label[n:])


def minimum_cut(ends: np.ndarray, capacity: np.ndarray, n_nodes: int,
                below: int | None = None) -> tuple[int, np.ndarray]:
    """The smallest positive cut of the graph of ``ends`` ((E, 2) nodes, E >= 1) with
    ``capacity`` (E,) on nodes 0..n_nodes-1, and which edges it cuts ((E,) bool): per
    connected part, a fixed node's maximum flow to every other node (exact, integers);
    the cut's side is what the flow's residual graph reaches from the source.

    ``below``: only whether a cut of less than ``below`` exists matters. No such cut
    crosses an edge of ``below`` or more, so those edges' ends are merged first (a site's
    groups are nearly all such edges: its maximum flows are then over the few light
    ones), and where none is left below it the value returned is 2**31; the first cut
    found below it is returned (a finding, not the smallest)."""
    ends = np.asarray(ends, dtype=np.int64)
    capacity = np.minimum(np.asarray(capacity, dtype=np.int64), 2**31 - 1)  # (so large: no finding)
    if below is None:
        smallest, side = _cut(ends, capacity, n_nodes, None)
        return smallest, side[ends[:, 0]] != side[ends[:, 1]]
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    heavy = capacity >= below
    merged = coo_matrix((np.ones(int(heavy.sum()), dtype=np.int8), (ends[heavy, 0], ends[heavy, 1])),
                        shape=(n_nodes, n_nodes))
    label = connected_components(merged, directed=False)[1]
    light = ~heavy & (label[ends[:, 0]] != label[ends[:, 1]])
    if not light.any():
        return 2**31, np.zeros(ends.shape[0], dtype=bool)
    nodes, compact = np.unique(label[ends[light]], return_inverse=True)
    smallest, on = _cut(compact.reshape(-1, 2), capacity[light], nodes.size, below)
    at = np.searchsorted(nodes, label).clip(max=nodes.size - 1)
    side = on[at] & (nodes[at] == label)  # (per merged node: which side of the cut)
    return smallest, side[ends[:, 0]] != side[ends[:, 1]]


def _cut(ends: np.ndarray, capacity: np.ndarray, n_nodes: int,
         below: int | None) -> tuple[int, np.ndarray]:
    """:func:`minimum_cut` of a graph, and its side ((n_nodes,) bool); ``below``: stop at
    a cut under it.

    Per connected part, an independent set I of its nodes (few neighbours first) and the
    rest H: a cut either separates two nodes of H, and then the maximum flow from one
    fixed node of H to some other is at most it, or has all of H on one side, and then
    the other side holds only nodes of I, each adjacent to H alone, and weighs at least
    the smallest of their degrees. So |H| - 1 flows and the degrees decide it (a report's
    straddlers are such an I, its parts H: a flow per part, not per group)."""
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import breadth_first_order, connected_components, maximum_flow

    both = (np.r_[ends[:, 0], ends[:, 1]], np.r_[ends[:, 1], ends[:, 0]])
    graph = csr_matrix((np.r_[capacity, capacity].astype(np.int64), both), shape=(n_nodes, n_nodes))
    graph.sum_duplicates()
    _, part = connected_components(graph, directed=False)
    # the independent set and the degrees of the whole graph are each part's own (no edge
    # joins two parts; the greedy takes a part's nodes in the same order): one pass, and
    # the part by part work only where a part has two hubs or more (a maximum flow)
    alone = _independent(graph)
    degree = np.asarray(graph.sum(axis=1)).ravel()
    labels = np.unique(part[np.unique(ends)])
    first_alone = {}  # part -> its alone node of least degree (the first such)
    candidates = np.flatnonzero(alone & np.isin(part, labels))
    if candidates.size:
        ranked = candidates[np.lexsort((candidates, degree[candidates], part[candidates]))]
        heads = np.r_[True, part[ranked][1:] != part[ranked][:-1]]
        first_alone = dict(zip(part[ranked[heads]].tolist(), ranked[heads].tolist()))
    by_part = np.argsort(part, kind="stable")
    starts = np.searchsorted(part[by_part], np.r_[labels, n_nodes])
    hub_count = np.bincount(part[~alone], minlength=n_nodes)
    smallest, best = 2**31, None
    for k, label in enumerate(labels.tolist()):
        v = first_alone.get(label)
        if v is not None and degree[v] < smallest:
            smallest, best = int(degree[v]), (v, None)
        if hub_count[label] >= 2 and not (below is not None and smallest < below):
            nodes = by_part[starts[k]:starts[k + 1]]  # (ascending: the stable order)
            sub = graph[nodes][:, nodes].astype(np.int32).tocsr()  # (a part's own nodes only)
            hubs = np.flatnonzero(~alone[nodes])
            for t in hubs[1:].tolist():
                if below is not None and smallest < below:
                    break
                flow = maximum_flow(sub, int(hubs[0]), t)
                if flow.flow_value < smallest:
                    smallest, best = int(flow.flow_value), (int(nodes[hubs[0]]), (nodes, sub, flow))
        if below is not None and smallest < below:
            break
    side = np.zeros(n_nodes, dtype=bool)
    if best is not None:
        source, found = best
        if found is None:
            side[source] = True
        else:
            nodes, sub, flow = found
            residual = (sub - flow.flow).tocsr()
            residual.data = np.where(residual.data > 0, 1, 0)
            residual.eliminate_zeros()
            start = int(np.searchsorted(nodes, source))
            side[nodes[breadth_first_order(residual, start, directed=True,
                                           return_predecessors=False)]] = True
    return smallest, side


def _independent(graph) -> np.ndarray:
    """An independent set of ``graph``'s nodes ((n,) bool), those of fewest neighbours
    first: no two chosen nodes are adjacent (self-loops aside)."""
    n = graph.shape[0]
    indptr, indices = graph.indptr, graph.indices
    order = np.argsort(np.diff(indptr), kind="stable")
    chosen = np.zeros(n, dtype=bool)
    blocked = np.zeros(n, dtype=bool)
    for v in order.tolist():
        if blocked[v]:
            continue
        chosen[v] = True
        neighbours = indices[indptr[v]:indptr[v + 1]]
        blocked[neighbours] = True
        blocked[v] = True
    return chosen


def _ends(found: Atoms, beyond: np.ndarray) -> np.ndarray:
    """(A, 2): each atom's first two sets, ``beyond`` for an atom in one."""
    sizes = found.set_sizes
    ptr = found.set_ptr[:-1]  # (every atom lies in a set at least)
    lead, second, two = found.set_idx[ptr], np.array(beyond, dtype=np.int64), sizes >= 2
    second[two] = found.set_idx[ptr[two] + 1]
    return np.stack([lead, second], axis=1).astype(np.int64)


def _edges(ends: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Parallel atoms (the same two sets) added up, one edge of their rows: (the edges,
    their capacities, each atom's edge)."""
    keys, slot = np.unique(ends, axis=0, return_inverse=True)
    slot = slot.ravel()
    capacity = np.bincount(slot, weights=weights, minlength=keys.shape[0])
    return keys, capacity.astype(np.int64), slot


def parts_graph(found: Atoms, part_of_set: np.ndarray, n_parts: int):
    """The sets of several parts (``part_of_set``: each set's part; no atom holds sets of
    two parts) as one graph, each part with its own node beyond (the disjoint union of
    the parts' graphs of :func:`graph_cut`): (each atom's edge (A, 2) over nodes
    0..n_sets + n_parts - 1, each atom's part, and (n_parts,) bool: the parts that are
    graphs, none of their atoms in three sets or more and no odd cycle)."""
    part_of_set = np.asarray(part_of_set, dtype=np.int64)
    atom_part = part_of_set[found.set_idx[found.set_ptr[:-1]]]
    ends = _ends(found, found.n_sets + atom_part)
    graph = np.ones(n_parts, dtype=bool)
    graph[atom_part[found.set_sizes > 2]] = False
    two = (found.set_sizes == 2) & graph[atom_part]
    odd = _odd_nodes(ends[two], found.n_sets)
    graph[part_of_set[odd]] = False
    return ends, atom_part, graph


def cut_at_least(ends: np.ndarray, weights: np.ndarray, below: int) -> bool:
    """Whether the graph of these atoms' ``ends`` (each part a graph: :func:`parts_graph`)
    has no positive cut under ``below``: every part's smallest support is ``below`` or
    more (a disjoint union's smallest positive cut is the least of its parts')."""
    if ends.shape[0] == 0:
        return True
    nodes, compact = np.unique(ends, return_inverse=True)
    keys, capacity, _ = _edges(compact.reshape(-1, 2), weights)
    return minimum_cut(keys, capacity, nodes.size, below)[0] >= below


def graph_cut(found: Atoms, below: int | None = None) -> tuple[int, np.ndarray] | None:
    """The smallest support of a nonzero combination, exactly, where the sets make a
    bipartite graph (module docstring), and the atoms of one such support ((A,) bool);
    None where they do not (an atom in three or more sets, or an odd cycle). ``below``:
    as :func:`minimum_cut`'s (a support under it, or 2**31 where there is none)."""
    if (found.set_sizes > 2).any():
        return None
    if found.weights.size == 0:
        return 2**31, np.zeros(0, dtype=bool)
    ends, _, graph = parts_graph(found, np.zeros(found.n_sets, dtype=np.int64), 1)
    if not graph[0]:
        return None
    keys, capacity, slot = _edges(ends, found.weights)
    smallest, cut = minimum_cut(keys, capacity, found.n_sets + 1, below)
    return smallest, cut[slot]

"""The span audit's components judged together where they all pass: one graph for all of
them instead of a graph per component (``span.audit``; a later version of a large site
has thousands, each a few groups, whose scipy set-up alone cost more than the maths).

A component passes :func:`span.component_finding` (at one floor p, no feature's values
asked) when its sets make a bipartite graph (``support.graph_cut``) whose smallest support
is p or more and, at p <= 2, no two of its one-instance atoms may be versions of one row.
The components share no instance, so their atoms are each one component's, and the graph
of all of them, each component with its own node "beyond", is the disjoint union of their
graphs: bipartite exactly where each is, its smallest positive cut the least of theirs.
So where the union's cut is p or more every component passes, and the decision is the
one made component by component (where the groups also form chains, the chains' cut is
the same smallest support: both are exact, ``support.py``). Anything else (an atom in
three sets, an odd cycle, a cut under p, a possible change) is left to the component's
own audit, which finds what it finds as before; where the union cuts under p, it is
halved until the components that do are found (a few failing among thousands cost a few
graphs each, not the rest their own).
"""

from __future__ import annotations

import numpy as np

from fedcluster.client_app.release.audit import support

__all__ = ["passing"]


def passing(component_lists: list[list[np.ndarray]], p: int, same_row) -> np.ndarray:
    """(len(component_lists),) bool: the components that pass ``span.component_finding``
    at ``p`` by the graph test (module docstring); False: judge it on its own.

    Parameters
    ----------
    component_lists : list of lists of int arrays
        Each component's groups' instances (components share no instance).
    p : int
    same_row : callable, with ``pairs_in_parts`` (a site's record) for p <= 2
    """
    n = len(component_lists)
    verdict = np.zeros(n, dtype=bool)
    if n == 0 or (p <= 2 and not hasattr(same_row, "pairs_in_parts")):
        return verdict
    lists = [m for lists in component_lists for m in lists]
    part_of_set = np.repeat(np.arange(n), [len(lists) for lists in component_lists])
    found = support.atoms(lists)
    ends, atom_part, graph = support.parts_graph(found, part_of_set, n)

    # The graphs' atoms in the order of their components: the components settle() takes,
    # a run of the graphs, own a run of these atoms (found once, not by a search each time).
    graphs = np.flatnonzero(graph)
    within = np.flatnonzero(graph[atom_part])
    within = within[np.argsort(atom_part[within], kind="stable")]
    first = np.searchsorted(atom_part[within], graphs)
    stop = np.searchsorted(atom_part[within], graphs, side="right")

    def settle(lo: int, hi: int) -> None:  # graphs[lo:hi], halved where some cut under p
        mine = within[first[lo]:stop[hi - 1]]
        if support.cut_at_least(ends[mine], found.weights[mine], p):
            verdict[graphs[lo:hi]] = True
        elif hi - lo > 1:
            settle(lo, (lo + hi) // 2)
            settle((lo + hi) // 2, hi)

    if graphs.size:
        settle(0, graphs.size)
    if p <= 2:  # no two one-instance atoms of one component may be one row's versions
        single = found.weights == 1
        singles = found.member_idx[found.member_ptr[:-1][single]]
        verdict &= ~same_row.pairs_in_parts(singles, atom_part[single], n)
    return verdict

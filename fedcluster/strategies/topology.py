"""Site graphs for the decentralised GTVMin k-means (Jung; docs/explanation/algorithms.md section 6).

A topology is an undirected graph over the site ids (``site-id`` in deployment,
``partition-id`` in simulation), named by the ``topology`` run-config key; its grammar
(``complete``, ``ring``, ``knn:K``, ``random:P``, ``edges:PATH``) and what each means are
in ``common/topology_spec.py``, which checks the value when the run config is read. Here
the graph is built over the admitted sites, seeded, and a graph that leaves a site
unconnected to the others is rejected with a message naming the parts it falls into:
GTVMin only agrees across a connected graph.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np

from fedcluster.common.topology_spec import TopologyError, parse_topology

__all__ = ["TopologyError", "build_topology", "edges", "parse_topology"]

#: Re-draws of ``random:P`` before giving up (P too small for the number of sites).
MAX_DRAWS = 1000


def build_topology(spec: str, site_ids: list[str], seed: int) -> dict[str, list[str]]:
    """The neighbours of every site, each list in the order of ``site_ids``.

    Parameters
    ----------
    spec : str
        The ``topology`` value.
    site_ids : list of str
        The federation's sites in their stable order.
    seed : int
        Seeds ``knn`` and ``random``.

    Raises
    ------
    TopologyError
        When ``spec`` is malformed, an edge list names an unknown site or has a self-loop,
        or the graph is not connected.
    """
    kind, arg = parse_topology(spec)
    n = len(site_ids)
    index = {key: i for i, key in enumerate(site_ids)}
    rng = np.random.default_rng([seed, 1009])
    adjacency = np.zeros((n, n), dtype=bool)
    if kind == "complete":
        adjacency[:] = True
    elif kind == "ring":
        for i in range(n):
            adjacency[i, (i + 1) % n] = True
    elif kind == "knn":
        order = rng.permutation(n)
        for step in range(1, min(math.ceil(int(arg) / 2), n - 1) + 1):
            for pos in range(n):
                adjacency[order[pos], order[(pos + step) % n]] = True
    elif kind == "random":
        p = float(arg)
        for _ in range(MAX_DRAWS):
            upper = np.triu(rng.random((n, n)) < p, 1)
            if n < 2 or _is_connected(upper | upper.T):
                adjacency = upper
                break
        else:
            raise TopologyError(
                f"topology {spec!r}: no connected graph in {MAX_DRAWS} draws for {n} sites; "
                "raise P"
            )
    else:
        adjacency = _read_edges(Path(arg), index)
    adjacency = adjacency | adjacency.T
    np.fill_diagonal(adjacency, False)
    if n > 1 and not _is_connected(adjacency):
        parts = _components(adjacency)
        names = "; ".join("{" + ", ".join(site_ids[i] for i in part) + "}" for part in parts)
        raise TopologyError(
            f"topology {spec!r} is not connected: its sites fall into {len(parts)} parts "
            f"({names}); GTVMin needs every site linked to the others through some path"
        )
    return {key: [site_ids[j] for j in np.flatnonzero(adjacency[i])] for key, i in index.items()}


def edges(neighbours: dict[str, list[str]]) -> list[tuple[str, str]]:
    """The undirected edges, each once, in a stable order."""
    keys = list(neighbours)
    position = {key: i for i, key in enumerate(keys)}
    return [(a, b) for a in keys for b in neighbours[a] if position[a] < position[b]]


def _read_edges(path: Path, index: dict[str, int]) -> np.ndarray:
    n = len(index)
    adjacency = np.zeros((n, n), dtype=bool)
    try:
        lines = path.read_text().splitlines()
    except OSError as err:
        raise TopologyError(f"edge list {path}: cannot be read ({err.strerror})") from None
    for number, line in enumerate(lines, start=1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        ends = [part for part in re.split(r"[,\s]+", line) if part]
        if len(ends) != 2:
            raise TopologyError(f"edge list {path}, line {number}: expected two site ids, got {line!r}")
        for end in ends:
            if end not in index:
                raise TopologyError(
                    f"edge list {path}, line {number}: unknown site {end!r} (sites: "
                    f"{', '.join(index)})"
                )
        if ends[0] == ends[1]:
            raise TopologyError(f"edge list {path}, line {number}: a site linked to itself")
        adjacency[index[ends[0]], index[ends[1]]] = True
    return adjacency


def _components(adjacency: np.ndarray) -> list[list[int]]:
    n = adjacency.shape[0]
    seen = np.zeros(n, dtype=bool)
    parts = []
    for start in range(n):
        if seen[start]:
            continue
        part, stack = [], [start]
        seen[start] = True
        while stack:
            i = stack.pop()
            part.append(i)
            for j in np.flatnonzero(adjacency[i] & ~seen):
                seen[j] = True
                stack.append(j)
        parts.append(sorted(part))
    return parts


def _is_connected(adjacency: np.ndarray) -> bool:
    return len(_components(adjacency)) == 1

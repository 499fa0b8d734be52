"""The ``topology`` run-config value: its grammar, checked when the run config is read
(the graph itself is built by ``strategies/topology.py``, for GTV; Jung, docs/explanation/algorithms.md section 6).

A topology is an undirected graph over the site ids (``site-id`` in deployment,
``partition-id`` in simulation). The ``topology`` run-config key names it:

``complete``
    every pair of sites linked.
``ring``
    sites in their stable order (the server's site order, sorted site ids), each
    linked to the next, the last to the first.
``knn:K``
    a seeded random K-regular-ish graph: the sites in a seeded random cyclic order, each
    linked to its ceil(K/2) successors (degree 2 ceil(K/2), at most n - 1). Connected by
    construction.
``random:P``
    Erdos-Renyi with edge probability P, re-drawn (seeded) until connected.
``edges:PATH``
    an explicit edge list: one edge per line, two site ids separated by whitespace or a
    comma; ``#`` starts a comment.

A graph that leaves a site unconnected to the others is rejected with a message naming
the parts it falls into: GTVMin only agrees across a connected graph.
"""

from __future__ import annotations

import re


class TopologyError(ValueError):
    """The topology is malformed, names unknown sites, or is not connected."""


def parse_topology(spec: str) -> tuple[str, str]:
    """Split and check a ``topology`` value: ``(kind, argument)``.

    Raises
    ------
    TopologyError
        Naming what is wrong with ``spec``.
    """
    kind, _, arg = str(spec).partition(":")
    if kind in ("complete", "ring"):
        if arg:
            raise TopologyError(f"topology {spec!r}: {kind!r} takes no argument")
        return kind, ""
    if kind == "knn":
        if not re.fullmatch(r"[1-9][0-9]*", arg):
            raise TopologyError(f"topology {spec!r}: knn:K needs a positive integer K")
        return kind, arg
    if kind == "random":
        try:
            p = float(arg)
        except ValueError:
            p = -1.0
        if not 0.0 < p <= 1.0:
            raise TopologyError(f"topology {spec!r}: random:P needs a probability 0 < P <= 1")
        return kind, arg
    if kind == "edges":
        if not arg:
            raise TopologyError(f"topology {spec!r}: edges:PATH needs a file path")
        return kind, arg
    raise TopologyError(
        f"unknown topology {spec!r}; use complete, ring, knn:K, random:P or edges:PATH"
    )

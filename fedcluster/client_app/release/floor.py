"""The group floor on what a reply reports: the rules a task declares and the gate applies.

p, the floor, is the larger of the run's ``min-cluster-size`` and the site's own. A task
computes its figures from the site's groups and says which of them rest on which rows;
the gate (``gate.py``) withholds, by these rules alone:

- :class:`PerCluster`: figures indexed by cluster, each a sum over its cluster's groups:
  a cluster of fewer than p rows is withheld (dropped, or shown as the server's own
  value and a count of 0, or zeros), an empty one alike, so that a withheld cluster
  cannot be told from an empty one;
- :class:`SmallCells`: counts by cell (a histogram's bins): a cell of 1 to p-1 reads 0;
- :class:`Labels`: the evaluation's contingency table: its cells under p read 0, and a
  label none of whose cells reaches p is not named;
- :class:`Counts`: counts a site reports as JSON (``describe``'s rows dropped, missing
  cells): 1 to p-1 reads ``"<p"``;
- :func:`refuse_under_floor`: a reply over ALL the site's rows (its size, statistics,
  bounds, GTV's own centroids, an SSE per centroid set) is refused by a site with fewer
  rows than p.

A figure a rule withholds is never sent; what the rule itself says (that a cluster is
under p, or empty) is in the privacy model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from fedcluster.client_app.task_io import TaskError

__all__ = ["Counts", "Labels", "PerCluster", "SmallCells", "WHOLE_SITE", "apply",
           "refuse_under_floor", "shown_count"]

#: The tasks that report over all the site's rows, and what a site under the floor then
#: does not send.
WHOLE_SITE = {
    "describe": "it cannot join",
    "impute_stats": "it sends no imputation statistics",
    "stats": "it sends no statistics",
    "bounds": "it sends no bounds",
    "value_range": "it sends no value range",
    "gtv": "it keeps no centroids of its own",
    "evaluate_sets": "it sends no scores",
}


@dataclass(frozen=True)
class PerCluster:
    """Figures indexed by cluster (the first axis of each of ``fields``).

    Attributes
    ----------
    rows : (k,) int
        The rows each cluster's figures rest on (the fewest, where a figure rests on two
        member sets: a Lloyd step's counts and its centroid's).
    fields : tuple of str
        The reply's fields indexed by cluster.
    withheld : str
        How a withheld cluster shows: ``"drop"`` (left out), ``"fallback"`` (each field
        in ``fallback`` shows the server's own value, the others 0), ``"zero"``.
    fallback : dict, optional
        Field -> what a withheld cluster shows (what the server sent).
    also : (k,) bool, optional
        Clusters withheld besides (a task's own rule: EWF's ``min-groups``).
    from_two : bool
        Withhold only at a floor of 2 or more (the evaluation at floor 1 shows an empty
        cluster as one).
    flag : str, optional
        A field that says, per cluster, whether it was withheld (1) (the evaluation's
        and the profile's ``hidden``, broadcast to the field's shape).
    """

    rows: np.ndarray
    fields: tuple
    withheld: str = "zero"
    fallback: dict | None = None
    also: np.ndarray | None = None
    from_two: bool = False
    flag: str | None = None


@dataclass(frozen=True)
class SmallCells:
    """A field of counts by cell (a histogram's bins): a cell of 1 to p-1 reads 0."""

    field: str


@dataclass(frozen=True)
class Labels:
    """The contingency table (labels x clusters, ``field``) and its label names (the
    metric ``names``): a cell under p reads 0, a label with no cell at p or more goes."""

    field: str
    names: str


@dataclass(frozen=True)
class Counts:
    """JSON counts among the reply's metrics (a number, or a dict of numbers): 1 to p-1
    read ``"<p"``."""

    metrics: tuple


def shown_count(value: int, floor: int) -> int | str:
    """A count as a site reports it: ``"<p"`` when it is 1..p-1."""
    return f"<{floor}" if 0 < value < floor else int(value)


def refuse_under_floor(n_rows: int, floor: int, source: str, what: str = "") -> None:
    """The one refusal of a reply over ALL the site's rows: a site with fewer rows than
    the floor sends nothing (``what`` says what it withholds)."""
    if n_rows < floor:
        raise TaskError(f"{source}: has {n_rows} rows, fewer than the privacy floor "
                        f"{floor}: at least {floor} are needed (min-cluster-size)"
                        + (f"; {what}" if what else ""))


def _per_cluster(arrays, rule: PerCluster, floor: int):
    rows = np.asarray(rule.rows)
    if rule.from_two and floor <= 1:
        hidden = np.zeros(rows.shape, dtype=bool)
    else:
        hidden = rows < floor
    if rule.also is not None:
        hidden = hidden | np.asarray(rule.also, dtype=bool)
    changes = {}
    for name in rule.fields:
        value = getattr(arrays, name)
        if value is None:
            continue
        value = np.array(value, copy=True)
        if rule.withheld == "drop":
            value = value[~hidden]
        elif rule.fallback is not None and name in rule.fallback:
            value[hidden] = np.asarray(rule.fallback[name])[hidden]
        else:
            value[hidden] = 0
        changes[name] = value
    if rule.flag is not None:
        shape = np.shape(getattr(arrays, rule.flag))
        changes[rule.flag] = np.broadcast_to(
            hidden.reshape(hidden.shape + (1,) * (len(shape) - 1)), shape).astype(np.int64)
    return arrays._replace(**changes)


def apply(reply, floor: int):
    """``reply`` (a ``TaskReply``) with its rules applied at ``floor``: its arrays and
    metrics as they may leave the site."""
    arrays, metrics = reply.arrays, dict(reply.metrics)
    for rule in reply.rules:
        if isinstance(rule, PerCluster):
            arrays = _per_cluster(arrays, rule, floor)
        elif isinstance(rule, SmallCells):
            cells = np.array(getattr(arrays, rule.field), copy=True)
            cells[cells < floor] = 0
            arrays = arrays._replace(**{rule.field: cells})
        elif isinstance(rule, Labels):
            table = np.array(getattr(arrays, rule.field), copy=True)
            table[table < floor] = 0
            # A label with no cell at or above the floor is left out: its row would be
            # zeros (no metric changes), but its name would tell that the site holds rows of it.
            shown = table.any(axis=1)
            arrays = arrays._replace(**{rule.field: table[shown]})
            names = json.loads(metrics[rule.names])
            metrics[rule.names] = json.dumps([n for n, keep in zip(names, shown) if keep])
        elif isinstance(rule, Counts):
            for name in rule.metrics:
                if name in metrics:
                    value = json.loads(metrics[name])
                    value = ({k: shown_count(v, floor) for k, v in value.items()}
                             if isinstance(value, dict) else shown_count(value, floor))
                    metrics[name] = json.dumps(value)
    return arrays, metrics

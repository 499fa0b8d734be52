"""The task protocol: every task's name, the arrays the server sends with it, the reply a
site sends back, and the secure-aggregation terms of that reply, each by NAME.

A round is one task (the ``task`` config key of Flower's FitIns). Flower carries arrays
as a list; this module is the only place that knows the order of that list. Everywhere
else a task's inputs and a reply's arrays are named tuples (``reply.centroids``,
``reply.counts``, ``inputs.means``): they still travel as Flower's list
(:func:`to_arrays`), and come back named (:func:`task_inputs` at the site,
:func:`reply_arrays` at the server). The scalar parameters and metrics are named keys of
Flower's config/metrics dicts (``PARAMS``/``METRICS`` below say which task uses which).

Adding a task = one :data:`TASKS` entry here (its inputs and reply types), one site
function (``client_app/tasks.py``, and ``private_tasks.py`` for its DP variant) and one
strategy hook that plans and reduces it (``strategies/``).

Tasks
-----
``describe``      -> metrics only (rows as num_examples, ``n-features``, ``feature-names``);
                     with ``then`` (:data:`THEN`) also the carried task's reply
``impute_stats``  -> :class:`MissingStats` (a schema's pooled imputation)
``stats``         -> :class:`Moments` (``scale`` standard) or :class:`Range` (minmax)
``bounds``        -> :class:`Range`
``local_kmeans``, ``kmeanspp``, ``prune_lloyd`` -> :class:`ClusterMeans` (at most the rows
                     asked for; clusters under the floor left out)
``lloyd``, ``minibatch``, ``gtv`` -> :class:`ClusterMeans` (one row per centroid sent: the k
                     global clusters, or the divisive start's grown clusters);
                     ``minibatch`` with :data:`FAR_ROWS`: :class:`ClusterMeansAndFar`
``fcm``           -> :class:`FuzzyCentres`
``evaluate_sets`` -> :class:`SetScores`
``evaluate``      -> :class:`Evaluation`
``evaluate_distances`` -> :class:`Distances`
``profile``       -> :class:`ClusterProfile` (Table 1 by cluster, after the final evaluation)
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np


class ProtocolError(ValueError):
    """Arrays that do not fit the task's layout (how many, and which)."""


# ------------------------------------------------------------------- inputs
class NoArrays(NamedTuple):
    """A task that takes no arrays."""


class Centroids(NamedTuple):
    """The global centroids (k, d) the site works against."""

    centroids: np.ndarray


class CentroidsAndMeans(NamedTuple):
    """Davies-Bouldin's second pass: the centroids and the pooled cluster means."""

    centroids: np.ndarray
    means: np.ndarray


class SiteGraphState(NamedTuple):
    """GTV: the site's own centroids (k, d) and its neighbours' (deg, k, d); the first
    round sends neither."""

    own: np.ndarray | None = None
    neighbours: np.ndarray | None = None


class ProfileInputs(NamedTuple):
    """``profile``: the final centroids (k, d) in the run's space (each group joins the
    cluster its mean is nearest to there), and per encoded feature, in the encoded units:
    the reference point of each cluster's squared deviations (k, d) and the histogram's
    range (d,) and (d,). The bins per feature are the task parameter :data:`BINS`. Which
    columns are category levels or missing indicators, and the levels' one-hot weights,
    the site takes from its own schema (the one whose hash the describe round checked):
    its floor of a level's count rests on them, so no coordinator chooses them."""

    centroids: np.ndarray
    references: np.ndarray
    lower: np.ndarray
    upper: np.ndarray


class CentroidSets(NamedTuple):
    """Several centroid sets (s, k, d), one local SSE wanted per set."""

    sets: np.ndarray


# ------------------------------------------------------------------- replies
class Moments(NamedTuple):
    """``stats`` with ``scale = standard``: per-feature means, sums of deviations, M2."""

    means: np.ndarray
    deviation_sums: np.ndarray
    m2: np.ndarray


class MissingStats(NamedTuple):
    """``impute_stats``: per encoded feature, the sum and count of its present cells and
    (impute-median) their histogram (d, bins), under the floor (``imputation.py``)."""

    sums: np.ndarray
    counts: np.ndarray
    histograms: np.ndarray


class Range(NamedTuple):
    """Per-feature minima and maxima (``bounds``; ``stats`` with ``scale = minmax``)."""

    minima: np.ndarray
    maxima: np.ndarray


class ClusterMeans(NamedTuple):
    """Per-cluster means and member counts (or DWF weights, mini-batch's lambda)."""

    centroids: np.ndarray
    counts: np.ndarray


class ClusterMeansAndFar(NamedTuple):
    """``minibatch`` asked for its farthest rows (:data:`FAR_ROWS`): its
    :class:`ClusterMeans`, and the mean (1, d) and count (1,) of its groups farthest from
    the centroids it received (count 0: withheld), where the server re-seeds a dead
    cluster."""

    centroids: np.ndarray
    counts: np.ndarray
    far_means: np.ndarray
    far_counts: np.ndarray


class FuzzyCentres(NamedTuple):
    """FFCM: local fuzzy centres and the fuzzy weights W_j = sum_i u_ij^m."""

    centres: np.ndarray
    weights: np.ndarray


class SetScores(NamedTuple):
    """One local SSE per centroid set sent."""

    sse: np.ndarray


class Evaluation(NamedTuple):
    """The exact evaluation's sufficient statistics: per-cluster sizes, coordinate sums,
    squared norms, hidden flags (1: withheld under the floor), the summed distances of
    each cluster's members to the centroid they were sent (Davies-Bouldin's distances
    when the pooled means turn out to be those centroids: ``strategies/base.py``) and,
    where the site has labels, the (labels x clusters) contingency table."""

    counts: np.ndarray
    sums: np.ndarray
    sqnorms: np.ndarray
    hidden: np.ndarray
    distances: np.ndarray
    contingency: np.ndarray | None = None


class ClusterProfile(NamedTuple):
    """A site's cluster profile (Table 1 by cluster; ``client_app/site_profile.py``), per
    cluster: its rows; per cluster and encoded feature, in the encoded units (not scaled):
    the rows counted (the cluster's rows, 0 where the cluster is withheld), the present
    cells, their sum, their squared deviations about the reference point sent, their
    histogram over the bins sent (numeric features only), whether the cell was withheld
    (``hidden``: every cell of a cluster under the floor, an empty one too) and the
    present cells the lone-cell rule withheld (``withheld``: present in the data, fewer
    than p_site of their feature in their group; not in ``present``, not missing)."""

    counts: np.ndarray
    rows: np.ndarray
    present: np.ndarray
    sums: np.ndarray
    squares: np.ndarray
    histograms: np.ndarray
    hidden: np.ndarray
    withheld: np.ndarray


class Distances(NamedTuple):
    """Per cluster, the sum of distances of its members to the pooled cluster mean."""

    distances: np.ndarray


@dataclass(frozen=True)
class Task:
    """One task of the protocol: what it takes and what it answers.

    ``rows``: "per-cluster" (one reply row per centroid sent), "at-most" (at most the
    rows asked for) or None. ``secure``: the task is a sum SecAgg+ can carry. ``private``:
    a DP variant exists (``client_app/private_tasks.py``); other tasks are refused under DP.
    """

    name: str
    inputs: type
    reply: type | None
    rows: str | None = None
    secure: bool = False
    private: bool = False
    #: What a site sends in reply, in a sentence (the privacy model's table, the run report).
    sends: str = ""


#: Where a training task's figures use each group's per-feature spread (a group near a
#: boundary split by it, FFCM's memberships softened by it: ``kernels/spread.py``).
_SPREAD = "; at p_site >= 3 from its groups' per-feature spreads too"

TASKS: dict[str, Task] = {task.name: task for task in (
    Task("describe", NoArrays, None, private=True,
         sends="its row count, width and column names, its policy (max-rounds, group-size); "
               "a table read through a schema: the schema's hash, rows dropped and missing "
               "cells per column (\"<p\" when 1 to p-1)"),
    Task("impute_stats", NoArrays, MissingStats,
         sends="per encoded feature: the sum and count of its present cells and, for "
               "impute-median, a histogram of its groups' present means (bins under p withheld)"),
    Task("stats", NoArrays, Moments,  # Range with scale = minmax (reply_type)
         sends="per feature: its mean, sum of deviations and sum of squared deviations "
               "(standard), or the minimum and maximum of its groups' means (minmax)"),
    Task("bounds", NoArrays, Range, private=True,
         sends="per feature: the minimum and maximum of its groups' means"),
    Task("value_range", NoArrays, Range,
         sends="per feature, in the table's units: the minimum and maximum of its groups' "
               "means of present cells (Table 1's histogram range, where the schema declares "
               "none)"),
    Task("local_kmeans", NoArrays, ClusterMeans, rows="at-most",
         sends="its local k-means centroids (of its groups' means) and their counts" + _SPREAD),
    Task("kmeanspp", NoArrays, ClusterMeans, rows="at-most",
         sends="the means and counts of its seeded clusters"),
    Task("prune_lloyd", Centroids, ClusterMeans, rows="at-most",
         sends="the means and counts of its kept clusters, its SSE" + _SPREAD),
    Task("lloyd", Centroids, ClusterMeans, rows="per-cluster", secure=True, private=True,
         sends="per cluster: its centroid after local Lloyd iterations and its count "
               "against the received centroids, its SSE (with evaluate-too, also the "
               "evaluation of the received centroids)" + _SPREAD),
    Task("minibatch", Centroids, ClusterMeans, rows="per-cluster", secure=True,
         sends="its mini-batch centroids and counts (asked, the mean and count of its "
               "groups farthest from the centroids)" + _SPREAD),
    Task("gtv", SiteGraphState, ClusterMeans, rows="per-cluster",
         sends="its own centroids and their counts, its GTV and SSE" + _SPREAD),
    Task("fcm", Centroids, FuzzyCentres, rows="per-cluster", secure=True,
         sends="its local fuzzy centres and fuzzy weights, its fuzzy objective J_m" + _SPREAD),
    Task("evaluate_sets", CentroidSets, SetScores,
         sends="its SSE against each centroid set sent"),
    Task("evaluate", Centroids, Evaluation, rows="per-cluster", secure=True, private=True,
         sends="per cluster: counts, sums, sums of squared norms and of distances to the "
               "centroids; SSE, silhouette sums, its groups' scatter; labels: the "
               "contingency table"),
    Task("evaluate_distances", CentroidsAndMeans, Distances, rows="per-cluster", secure=True,
         private=True, sends="per cluster: Davies-Bouldin's sums of distances to the pooled means"),
    Task("profile", ProfileInputs, ClusterProfile, rows="per-cluster", secure=True,
         sends="per cluster (of at least p rows, else withheld whole): its rows; per "
               "cluster and encoded feature: present cells, their sum, squared deviations "
               "about the point sent, a histogram of its groups' means and the present "
               "cells its groups withhold (a count), whole (the table's small-cell rule is "
               "the server's, on the pooled cells)"),
)}

#: The tasks a secure round may carry, and those a site runs under DP.
SECURE_TASKS = tuple(name for name, task in TASKS.items() if task.secure)
DP_TASKS = tuple(name for name, task in TASKS.items() if task.private)

#: The scalar metrics a reply may carry (besides ``num_examples``, the site's rows).
METRICS = {
    "describe": ("n-features", "feature-names", "max-rounds", "schema-hash", "rows-dropped",
                 "cells-missing", "group-size", "rows-waiting", "rows-held-back", "held-back-why"),
    "lloyd": ("sse",), "prune_lloyd": ("sse",), "minibatch": ("sse",), "gtv": ("sse", "gtv"),
    "fcm": ("fuzzy-objective",),
    "evaluate": ("sse", "silhouette-sum", "group-scatter", "all-sq-dist", "partition-sum", "floor",
                 "label-names"),
}
#: Every reply may carry these: the site's key, the rounds its policy still allows, a
#: refusal (an error reply: the reason, no arrays).
SITE_KEY, ROUNDS_LEFT, ERROR = "site-key", "rounds-left", "error"
#: A site's describe reply names the size of the groups it answers from (its own
#: ``min-cluster-size``, a policy): 1 is a site that opted out and answers from rows.
GROUP_SIZE = "group-size"
#: A table read through a schema describes itself with the schema's hash and, as JSON
#: counts ("<p" under the floor), the rows it dropped and its missing cells per column.
SCHEMA_HASH, ROWS_DROPPED, CELLS_MISSING = "schema-hash", "rows-dropped", "cells-missing"
#: A site's describe reply accounts for every usable row of its data (besides the rows
#: it answers from, ``num_examples``, and those a schema dropped, ``rows-dropped``): those
#: in no group yet (new rows fewer than its p, rows of a withdrawn group), those the
#: versions audit held back and the audit's reason. Counts of rows, never of values
#: (docs/explanation/privacy-model.md).
ROWS_WAITING, ROWS_HELD_BACK, HELD_BACK_WHY = "rows-waiting", "rows-held-back", "held-back-why"
#: Every task carries the server's round number; a DP task also the run's planned spend
#: (rho-zCDP, for the site's ``dp-budget``) besides its own ``dp-rho``.
ROUND, DP_RHO, DP_RHO_PLANNED = "round", "dp-rho", "dp-rho-planned"
#: The describe handshake may carry the run's first task (``stats``, or an initialisation
#: that needs nothing the handshake tells): ``then`` names it, its parameters ride along,
#: and the site answers both in one reply (describe's metrics, the task's arrays and
#: metrics), or, when it refuses the task alone, describe's metrics and ``then-error``.
THEN, THEN_ERROR = "then", "then-error"
#: A plain ``lloyd`` task may ask the site to evaluate the centroids it received as well
#: (``evaluate-too``): the reply then carries the ``evaluate`` reply after its own arrays,
#: its metrics under :data:`EVALUATION_PREFIX`. When the round moves nothing, that is the
#: evaluation of the new centroids, and no evaluation round is needed.
EVALUATE_TOO, EVALUATION_PREFIX = "evaluate-too", "evaluation-"
#: A ``minibatch`` task may ask for the mean of the site's groups farthest from the
#: centroids it received, the fewest that hold this many rows (at least the floor): a
#: dead cluster is re-seeded there.
FAR_ROWS = "far-rows"
#: ``local_kmeans`` and ``lloyd`` may ask the site to leave out every cluster that holds
#: fewer than this many of its groups (default 1: none left out on that count; the floor
#: in rows applies as ever): EWF and k-FED weigh a site's cluster by its presence, not its
#: size, and one group alone is most often a lone row glued to its nearest neighbour.
MIN_GROUPS = "min-groups"
#: ``profile``: the histogram's bins per feature.
BINS = "bins"
#: ``evaluate``, ``evaluate_distances`` and ``profile`` of the final model (true): the
#: site answers from its groups re-cut within the centroids' clusters
#: (``client_app/data/report_table.py``), each partition judged with everything the site
#: ever released, so that the figures a person reads count rows where ``predict`` puts them.
REPORT = "report"
REPORT_TASKS = ("evaluate", "evaluate_distances", "profile")
#: A seeded task's seed base (JSON list of ints); the site draws its own seed from it and
#: its key (:func:`site_seed`), so the server need not know which site is which yet.
SEED_BASE = "seed-base"


def site_seed(base: list[int], key: str) -> int:
    """The seed of site ``key`` for a task seeded by ``base`` (the repetition's seed and a
    salt): the same at the site and the server, in every engine."""
    digest = int.from_bytes(hashlib.sha256(key.encode()).digest()[:4], "little")
    return int(np.random.SeedSequence([*map(int, base), digest]).generate_state(1)[0])


def task(name: str) -> Task:
    """The protocol entry of task ``name`` (ProtocolError for an unknown task)."""
    if name not in TASKS:
        raise ProtocolError(f"unknown task {name!r}; the protocol knows {sorted(TASKS)}")
    return TASKS[name]


def reply_type(name: str, scale: str | None = None, far: bool = False) -> type | None:
    """The reply type of task ``name`` (``stats`` depends on the ``scale``, ``minibatch``
    on whether it was asked for its :data:`FAR_ROWS`)."""
    if name == "minibatch" and far:
        return ClusterMeansAndFar
    if name == "stats":
        if scale not in ("standard", "minmax"):
            raise ProtocolError(f"no statistics layout for scale {scale!r}")
        return Moments if scale == "standard" else Range
    return task(name).reply


def with_evaluation(arrays: list, metrics: dict, evaluation_arrays: list,
                    evaluation_metrics: dict) -> tuple[list, dict]:
    """A reply's arrays and metrics with an evaluation appended (:data:`EVALUATE_TOO`)."""
    return ([*arrays, *evaluation_arrays],
            {**metrics, **{EVALUATION_PREFIX + k: v for k, v in evaluation_metrics.items()}})


def split_evaluation(name: str, arrays: list, metrics: dict) -> tuple[list, dict, list, dict]:
    """At the server: a reply with an evaluation appended, split into the task's own
    (arrays, metrics) and the evaluation's (ProtocolError: no evaluation in it)."""
    kind = task(name).reply
    own = len(kind._fields) if kind is not None else 0
    if len(arrays) <= own:
        raise ProtocolError(f"sent {len(arrays)} arrays, expected {own} and an evaluation")
    plain = {k: v for k, v in metrics.items() if not k.startswith(EVALUATION_PREFIX)}
    evaluation = {k[len(EVALUATION_PREFIX):]: v for k, v in metrics.items()
                  if k.startswith(EVALUATION_PREFIX)}
    for key in (SITE_KEY, ROUNDS_LEFT):  # the reply's own keys, shared by both parts
        if key in metrics:
            evaluation[key] = metrics[key]
    return list(arrays[:own]), plain, list(arrays[own:]), evaluation


def to_arrays(named: tuple | None) -> list[np.ndarray]:
    """The Flower array list of a named tuple (an optional trailing field left out when None)."""
    if named is None:
        return []
    return [np.asarray(value) for value in named if value is not None]


def _named(kind: type, arrays: list) -> tuple:
    fields = kind._fields
    required = [f for f in fields if f not in kind._field_defaults]
    arrays = list(arrays)
    if not len(required) <= len(arrays) <= len(fields):
        wanted = (f"{len(required)}" if len(required) == len(fields)
                  else f"{len(required)} to {len(fields)}")
        raise ProtocolError(f"sent {len(arrays)} arrays, expected {wanted}")
    return kind(*[np.asarray(a) for a in arrays])


def task_inputs(name: str, arrays: list) -> tuple:
    """At the site: the arrays a task received, named. Arrays a task does not take are
    ignored and one it lacks is None (the task says what it needs)."""
    kind = task(name).inputs
    arrays = [np.asarray(a) for a in list(arrays)[: len(kind._fields)]]
    return kind(*arrays, *[None] * (len(kind._fields) - len(arrays)))


def reply_arrays(name: str, arrays: list, scale: str | None = None, far: bool = False) -> tuple:
    """At the server: a reply's arrays, named (ProtocolError: too many or too few)."""
    kind = reply_type(name, scale, far)
    if kind is None:
        return NoArrays()
    return _named(kind, arrays)


# ------------------------------------------------------- secure aggregation
def secure_terms(name: str, reply: tuple) -> dict[str, np.ndarray]:
    """The linear terms of a plain reply that SecAgg+ sums (besides ``n`` and the scalar
    metrics, which ``common/secure_codec.py`` adds): per-cluster weighted sums ``wc``,
    weights (``w-int`` integer counts, ``w`` fuzzy weights), centroids ``c`` (EWF's plain
    mean), the evaluation's statistics, the distance sums."""
    as_float = lambda a: np.asarray(a, dtype=np.float64)  # noqa: E731
    if isinstance(reply, ClusterMeans):
        centroids, weights = as_float(reply.centroids), as_float(reply.counts)
        return {"wc": weights[:, None] * centroids, "w-int": weights, "c": centroids}
    if isinstance(reply, FuzzyCentres):
        centres, weights = as_float(reply.centres), as_float(reply.weights)
        return {"wc": weights[:, None] * centres, "w": weights, "c": centres}
    if isinstance(reply, Evaluation):
        return {"counts": as_float(reply.counts), "sums": as_float(reply.sums),
                "sqnorms": as_float(reply.sqnorms), "hidden": as_float(reply.hidden),
                "distances": as_float(reply.distances)}
    if isinstance(reply, Distances):
        return {"distances": as_float(reply.distances)}
    if isinstance(reply, ClusterProfile):  # every field a sum over sites (hidden: of flags)
        return {PROFILE_TERM + name: as_float(value) for name, value in zip(reply._fields, reply)}
    return {}


#: The secure terms of a ``profile`` reply: ``profile-<field>`` of :class:`ClusterProfile`.
PROFILE_TERM = "profile-"

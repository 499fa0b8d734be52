"""A site's cluster profile: what Table 1 by cluster needs from one site (issues 36, 44).

Per cluster of whole groups (each group in the cluster its mean is nearest to in the
run's space, as the final evaluation assigns it) and per encoded feature, in the encoded
units (the schema's declared unit; the run's scaling undone, no fill): the rows counted,
the present cells (and, apart, the present cells the lone-cell rule withheld), their sum, their
squared deviations about a reference point the
server sends (exact: a group adds its m2 plus present x (its mean - reference)^2; sums
over sites then give exact pooled SDs, also under secure aggregation, which needs every
term to be a sum), and a histogram of the groups' present means, each counting its present
cells, over the bins the server sends (medians and quartiles: exact to one bin where a
site answers from rows). A category level's count is its one-hot column's sum over the
level's ``category-weight``.

The floor p at the site is the one every task applies: a cluster under p rows is withheld
whole (every term 0, ``hidden`` 1), an empty one too, so the flags do not say which
clusters the site holds a few rows of. A cluster the site shows is sent whole: its level
counts, missing cells, a missing indicator's 1s and its histogram bins, however small.
Each is a sum over the cluster's groups of its groups' own statistics (a level's count:
the groups' sums of its one-hot column; the missing cells: the groups' rows less their
present cells; a bin: the present cells of the groups whose mean falls in it), so each is
a function of the group table, as the promise allows and as a coordinator can read from
other tasks anyway (``local_kmeans`` with a local cluster per group gives every group's
mean and count, and two fills its present cells). Withholding them at the site protected
nothing from the coordinator, and it made Table 1 false: a pooled count of far more than
p read ``<p`` and percentages were of partial sums (issue 44). The table's small-cell rule
is applied by the server to the POOLED cells, with complementary suppression
(``common/small_cells.py``). Which columns are levels (no histogram) and which are
missing indicators (not in Table 1, no histogram), the site takes from its own schema:
the task carries neither.

The ``profile`` task (:func:`profile_task`, ``protocol.TASKS["profile"]``) is the round
after the final evaluation; its maths are tested against pandas on the pooled rows
(``tests/test_profile.py``).
"""

from __future__ import annotations

import numpy as np

from fedcluster.client_app.private_tasks import site_bounds
from fedcluster.client_app.release import floor as floor_rules
from fedcluster.client_app.site_groups import SiteGroups
from fedcluster.client_app.task_io import (TaskError, TaskReply, in_run_space, received_centroids,
                                           task_param)
from fedcluster.common import kernels, profile, protocol
from fedcluster.common.protocol import ClusterProfile
from fedcluster.common.schema import encoded_kinds

#: The most histogram bins a site computes per feature (k x d x bins counts).
MAX_BINS = 10_000
#: Groups per slab of the profile's pass (a few MB of temporaries per feature column).
SLAB_GROUPS = 1 << 14


def _per_cluster(labels: np.ndarray, values: np.ndarray, k: int) -> np.ndarray:
    """(k, d): per cluster, the sum of ``values``' rows (one bincount per column)."""
    return np.stack([np.bincount(labels, weights=values[:, j], minlength=k)
                     for j in range(values.shape[1])], axis=1)


def site_encoding(groups: SiteGroups, d: int) -> tuple[np.ndarray, np.ndarray]:
    """(level weights (d,), indicator mask (d,)) of the site's own schema: each category
    level's one-hot weight (0: not a level), and which columns are missing indicators.
    A table without a schema has neither."""
    schema = None if groups.table is None else groups.table.schema
    if schema is None:
        return np.zeros(d), np.zeros(d, dtype=bool)
    kinds = encoded_kinds(schema)
    if len(kinds) != d:
        raise TaskError(f"{groups.source}: task profile: the schema encodes {len(kinds)} "
                        f"features, the table has {d}")
    return (profile.level_weights(profile.variables_of(schema), d),
            np.array([kind == "indicator" for kind in kinds], dtype=bool))


def profile_task(groups: SiteGroups, arrays: protocol.ProfileInputs, params: dict,
                 floor: int) -> TaskReply:
    """The ``profile`` task: each group joins the cluster of the final centroids its mean
    is nearest to in the run's space (its ``transform``, its ``data-bounds`` clipping: the
    final evaluation's partition), and the clusters are profiled from the groups as they
    are in the encoded units (:func:`site_profile`).

    ``groups`` are the site's groups as encoded (no fill, no scaling: ``task_runner``
    hands this task the table as it is)."""
    C = received_centroids(arrays.centroids, groups)
    k, d = C.shape
    inputs = {"references": (k, d), "lower": (d,), "upper": (d,)}
    checked = {}
    for name, shape in inputs.items():
        value = getattr(arrays, name)
        value = None if value is None else np.asarray(value, dtype=np.float64)
        if value is None or value.shape != shape or not np.all(np.isfinite(value)):
            raise TaskError(f"task profile: {name} must be {shape} finite values")
        checked[name] = value
    if np.any(checked["lower"] >= checked["upper"]):
        raise TaskError("task profile: every lower bound must be below its upper bound")
    # Levels and indicators get no histogram: the site's own schema says which they are.
    weights, indicators = site_encoding(groups, d)
    bins = task_param(params, protocol.BINS, int)
    if not 1 <= bins <= MAX_BINS:
        raise TaskError(f"task profile: {protocol.BINS} = {bins}, expected 1 to {MAX_BINS}")
    run = in_run_space(groups, params)
    if missing := run.missing_features():
        raise TaskError(f"{groups.source}: task profile: the run sent no value to fill the "
                        f"missing cells of features {missing}, so no cluster can be assigned")
    if (box := site_bounds(params, d)) is not None:
        run = run.clipped(*box)
    cluster_of_group = kernels.assign(run.means, C)[0]
    raw = _profile_sums(groups, cluster_of_group, checked["references"], checked["lower"],
                        checked["upper"], bins, weights, indicators)
    return TaskReply(arrays=raw, rules=(_withheld_under_floor(raw),))


def _withheld_under_floor(raw: ClusterProfile) -> floor_rules.PerCluster:
    """The floor's rule of a profile: every cluster under p withheld and flagged whole,
    an empty one too (as the evaluation flags it): flagging only those of 1..p-1 rows
    would say which the site holds a few rows of. Nothing else is withheld (the module
    docstring)."""
    return floor_rules.PerCluster(raw.counts, ("counts", "rows", "present", "sums", "squares",
                                               "histograms", "withheld"), "zero", flag="hidden")


def site_profile(groups: SiteGroups, cluster_of_group: np.ndarray, references: np.ndarray,
                 lower: np.ndarray, upper: np.ndarray, bins: int, level_weights: np.ndarray,
                 floor: int, indicators: np.ndarray | None = None) -> ClusterProfile:
    """The profile of one site's clusters as it leaves the site: :func:`_profile_sums`
    with the floor's rule applied (what ``profile_task`` and the release step give).

    Parameters
    ----------
    groups : SiteGroups
        The site's groups in the encoded units (not in the run's space).
    cluster_of_group : (G,) int
        Each group's cluster, 0..k-1.
    references : (k, d)
        Per cluster, the point its squared deviations are taken about (the pooled
        centroid in encoded units: small, well-conditioned sums).
    lower, upper : (d,)
        The histogram's range per feature (values outside fall in the end bins).
    bins : int
        Bins per feature.
    level_weights : (d,)
        A category level's ``category-weight`` (its one-hot column's 1); 0 for a numeric
        feature.
    floor : int
        The privacy floor p: a cluster of fewer rows is withheld whole.
    indicators : (d,) bool, optional
        The missing-indicator columns (not in Table 1: no histogram). None: none.

    Returns
    -------
    ClusterProfile
    """
    raw = _profile_sums(groups, cluster_of_group, references, lower, upper, bins,
                        level_weights, indicators)
    return floor_rules.apply(TaskReply(arrays=raw, rules=(_withheld_under_floor(raw),)), floor)[0]


def _profile_sums(groups: SiteGroups, cluster_of_group: np.ndarray, references: np.ndarray,
                  lower: np.ndarray, upper: np.ndarray, bins: int, level_weights: np.ndarray,
                  indicators: np.ndarray | None = None) -> ClusterProfile:
    """Per cluster of whole groups: its rows, and per encoded feature its present cells,
    their sum, squared deviations about ``references`` and histogram (nothing withheld)."""
    k, d = references.shape
    labels = np.asarray(cluster_of_group, dtype=np.int64)
    counts = np.bincount(labels, weights=groups.counts, minlength=k).astype(np.int64)
    binned = np.asarray(level_weights) == 0
    if indicators is not None:
        binned &= ~np.asarray(indicators, dtype=bool)
    lower = np.asarray(lower, dtype=np.float64)
    width = (np.asarray(upper, dtype=np.float64) - lower) / bins
    present = np.zeros((k, d))
    sums = np.zeros((k, d))
    squares = np.zeros((k, d))
    withheld = np.zeros((k, d))  # present cells the lone-cell rule withheld
    histograms = np.zeros(k * d * bins)
    cell = np.arange(d)[None, :] * bins
    # A slab of groups at a time, so that the (groups x d) temporaries stay small on a
    # site of millions of rows; per-cluster sums by bincount (sequential: the same bits
    # for the same groups, whatever the machine's threads).
    for start in range(0, groups.n_groups, SLAB_GROUPS):
        part = slice(start, start + SLAB_GROUPS)
        lab = labels[part]
        here = (np.broadcast_to(groups.counts[part, None], groups.sums[part].shape)
                if groups.present is None else groups.present[part]).astype(np.float64)
        shown = here > 0
        total = np.where(shown, groups.sums[part], 0.0)
        with np.errstate(invalid="ignore", divide="ignore"):
            means = np.where(shown, total / np.maximum(here, 1.0), 0.0)
        spread = 0.0 if groups.m2 is None else np.where(shown, groups.m2[part], 0.0)
        gap = means - references[lab]
        present += _per_cluster(lab, here, k)
        sums += _per_cluster(lab, total, k)
        squares += _per_cluster(lab, spread + here * gap * gap, k)
        if groups.withheld is not None:
            withheld += _per_cluster(lab, groups.withheld[part].astype(np.float64), k)
        where = np.clip(np.floor((means - lower) / width), 0, bins - 1).astype(np.int64)
        histograms += np.bincount(((lab[:, None] * d * bins) + cell + where).ravel(),
                                  weights=(here * binned[None, :]).ravel(),
                                  minlength=k * d * bins)
    present = np.rint(present).astype(np.int64)
    histograms = np.rint(histograms).astype(np.int64).reshape(k, d, bins)
    rows = np.repeat(counts[:, None], d, axis=1)
    return ClusterProfile(counts, rows, present, sums, squares, histograms,
                          np.zeros((k, d), dtype=np.int64), np.rint(withheld).astype(np.int64))

"""The rounds that prepare a run before any clustering: ``describe`` (admission), then
``impute_stats`` when the run's schema imputes a column (the pooled fill:
``common/imputation.py``), then ``stats`` when it scales (``common/scaling.py``). The
transform they give (fill, then shift and factor) travels with every later task.

The run's first task is sent with the describe handshake (one round instead of two).
The describe round tells the server which sites take part; the round after it asks them
for the run's first task: the statistics of ``scale``, or the initialisation (k-FED's
local k-means, FKM's seeded clusters, the bounding box). When that task needs nothing the
handshake tells (no per-site arrays, no transform, no clipping box, no DP), the describe
message carries it (``protocol.THEN``) and every site answers both at once; the server
admits the sites as before and then validates and reduces the carried replies of the
admitted ones, exactly as it would have in the next round. A site that refuses the
carried task alone (``protocol.THEN_ERROR``) is admitted and its refusal counted as a
failed reply of that task, as before. Seeded tasks need no site key: each site draws
its seed from the round's seed base and its own key (``protocol.site_seed``).
"""

from __future__ import annotations

import numpy as np

from fedcluster.common import protocol, scaling
from fedcluster.common.imputation import ImputationPlan, imputation_plan, pooled_fill
from fedcluster.common.scaling import FeatureTransform
from fedcluster.common.schema import DEFAULT_MEDIAN_BINS, SchemaError, encoded_kinds, run_schema
from fedcluster.strategies import private
from fedcluster.strategies.errors import FederationError
from fedcluster.strategies.task_plan import TaskPlan
from fedcluster.strategies.phases import Phase

#: The preparation rounds' tasks, in their order.
TASKS = ("describe", "impute_stats", "stats")


def imputation(config, width: int) -> ImputationPlan | None:
    """The run's imputation plan (None: it imputes nothing): its schema's, or with
    ``missing = "impute-mean"`` (sites without a schema) every feature's mean over the
    federation's ``width`` (0 before the describe round: the plan has no columns).

    Raises
    ------
    FederationError
        The schema file cannot be read, or the run is private (the imputation round is
        not a DP release).
    """
    try:
        run = run_schema(config.schema_file)
    except SchemaError as err:
        raise FederationError(f"run config 'schema': {err}") from None
    if run is not None:
        plan = imputation_plan(run[0])
    elif config.missing == "impute-mean":
        plan = ImputationPlan(("mean",) * width, (None,) * width, DEFAULT_MEDIAN_BINS, True)
    else:
        return None
    if not plan.needed:
        return None
    if config.private:
        raise FederationError("the run imputes missing cells (impute-mean/impute-median), "
                              "whose statistics round is not private: under dp-epsilon use "
                              "missing = \"drop-row\"")
    return plan


def impute_task(config, width: int) -> TaskPlan:
    """The imputation round's task (its histograms' bins bound the reply)."""
    return TaskPlan("impute_stats", max_rows=imputation(config, width).bins)


def stats_task(config) -> TaskPlan:
    """The statistics round's task (``scale``'s statistics)."""
    return TaskPlan("stats", params={"scale": config.scale})


def next_phase(config, width: int, done: str) -> Phase | None:
    """The phase after preparation round ``done``: impute, stats, or None (the first
    repetition begins)."""
    order = [t for t in TASKS if t == "describe"
             or (t == "impute_stats" and imputation(config, width) is not None)
             or (t == "stats" and config.scale != "none")]
    later = order[order.index(done) + 1:]
    return {"impute_stats": Phase.IMPUTE, "stats": Phase.STATS}[later[0]] if later else None


def pooled_fill_transform(config, width: int, feature_names: list[str],
                          replies) -> FeatureTransform:
    """The fill of the imputation round's replies, pooled (the sites that gave none have
    left the run: ``sites.keep_answering``)."""
    stats = [r.arrays for r in replies]
    try:
        fill = pooled_fill(imputation(config, width), [s.counts for s in stats],
                           [s.sums for s in stats], [s.histograms for s in stats],
                           feature_names or None)
    except ValueError as err:
        raise FederationError(f"cannot impute: {err}") from None
    return FeatureTransform.fill_only(fill)


def scaling_transform(config, replies, fill, ordered_sites) -> FeatureTransform:
    """The global transform from the statistics round's replies (the sites that gave
    none have left the run), the imputation's ``fill`` kept."""
    counts = [r.n_rows for r in replies]
    if config.scale == "standard":
        means = [r.arrays.means for r in replies]
        deviations = [r.arrays.deviation_sums for r in replies]
        m2s = [r.arrays.m2 for r in replies]
        transform = scaling.standard_transform(counts, means, deviations, m2s)
    else:
        private.warn_extremes(ordered_sites, "scale 'minmax'")
        minima = [r.arrays.minima for r in replies]
        maxima = [r.arrays.maxima for r in replies]
        transform = scaling.minmax_transform(minima, maxima)
    return unscaled_levels(transform, config.schema_file).with_fill(fill)


def unscaled_levels(transform, schema_file: str):
    """A schema's category levels and missing-indicators keep their 0/1 (times the
    column's ``category-weight``) under ``scale``: standardising a 0/1 column would blow a
    rare level up to 1/sqrt(q(1 - q)) and let a many-level category outweigh a lab value,
    while weight 1 already puts two rows of different levels at the squared distance of
    two random rows of a standardised column (2)."""
    run = run_schema(schema_file)
    if run is None:
        return transform
    keep = np.asarray([kind != "numeric" for kind in encoded_kinds(run[0])])
    if keep.shape != transform.shift.shape or not keep.any():
        return transform
    shift, factor = transform.shift.copy(), transform.factor.copy()
    shift[keep], factor[keep] = 0.0, 1.0
    return scaling.FeatureTransform(transform.kind, shift, factor, transform.fill)


def carried_task(config, width: int, resuming: bool, init_plan) -> TaskPlan | None:
    """The task the describe round carries (None: a round of its own): none on a resume,
    under DP or data-bounds (the first task's parameters need the width); else the
    imputation's, the statistics', or the start's: ``init_plan()`` (None where the start
    cannot be carried: given centroids, checked against the width first, or a start that
    grows) where it needs nothing the handshake tells (no per-site arrays or
    parameters, no sample, no arrays)."""
    if resuming or config.private or config.data_bounds:
        return None
    if imputation(config, width) is not None:
        return impute_task(config, width)
    if config.scale != "none":
        return stats_task(config)
    plan = init_plan()
    if plan is None or plan.per_site or plan.per_site_arrays or plan.sample or protocol.to_arrays(plan.arrays):
        return None
    return plan


def carried_received(carried: TaskPlan, keys: dict[int, str]) -> list:
    """The admitted sites' (``keys``: node id -> site key) replies to the carried task,
    as ``round_replies.check_replies`` takes them; a site that refused the carried task
    alone (``protocol.THEN_ERROR``) gives an error reply of it. A site rejected at
    describe is not looked at."""
    received = []
    for node_id, (arrays, metrics, n_rows) in carried.received.items():
        if node_id not in keys:
            continue
        if protocol.THEN_ERROR in metrics:
            metrics = {protocol.ERROR: metrics[protocol.THEN_ERROR]}
        received.append((node_id, keys[node_id], arrays, metrics, n_rows))
    return received

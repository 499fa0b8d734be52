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

import logging

from flwr.common.logger import log

from fedcluster.common import protocol
from fedcluster.common.imputation import ImputationPlan, imputation_plan, pooled_fill
from fedcluster.common.scaling import FeatureTransform
from fedcluster.common.schema import DEFAULT_MEDIAN_BINS, SchemaError, run_schema
from fedcluster.strategies import sites
from fedcluster.strategies.errors import FederationError
from fedcluster.strategies.task_plan import TaskPlan
from fedcluster.strategies.phases import Phase

#: The preparation rounds' tasks, in their order.
TASKS = ("describe", "impute_stats", "stats")


def imputation(strategy) -> ImputationPlan | None:
    """The run's imputation plan (None: it imputes nothing): its schema's, or with
    ``missing = "impute-mean"`` (sites without a schema) every feature's mean, whose
    width the describe round tells (before it, the plan has no columns).

    Raises
    ------
    FederationError
        The schema file cannot be read, or the run is private (the imputation round is
        not a DP release).
    """
    try:
        run = run_schema(strategy.config.schema_file)
    except SchemaError as err:
        raise FederationError(f"run config 'schema': {err}") from None
    if run is not None:
        plan = imputation_plan(run[0])
    elif strategy.config.missing == "impute-mean":
        width = strategy.n_features if strategy.sites else 0
        plan = ImputationPlan(("mean",) * width, (None,) * width, DEFAULT_MEDIAN_BINS, True)
    else:
        return None
    if not plan.needed:
        return None
    if strategy.config.private:
        raise FederationError("the run imputes missing cells (impute-mean/impute-median), "
                              "whose statistics round is not private: under dp-epsilon use "
                              "missing = \"drop-row\"")
    return plan


def impute_task(strategy) -> TaskPlan:
    return TaskPlan("impute_stats", max_rows=imputation(strategy).bins)


def advance(strategy, done: str) -> None:
    """The phase after preparation round ``done``: impute, stats, or the first repetition."""
    order = [t for t in TASKS if t == "describe"
             or (t == "impute_stats" and imputation(strategy) is not None)
             or (t == "stats" and strategy.config.scale != "none")]
    later = order[order.index(done) + 1:]
    if later:
        strategy.phase = {"impute_stats": Phase.IMPUTE, "stats": Phase.STATS}[later[0]]
    else:
        strategy._begin_repetition()


def reduce(strategy, server_round: int, plan: TaskPlan, replies) -> dict:
    """Reduce a preparation round (and a carried first task) and move on."""
    if plan.task == "describe":
        strategy.admit_sites(replies)
        advance(strategy, "describe")
        if plan.carries is not None:
            reduce_carried(strategy, server_round, plan.carries)
    elif plan.task == "impute_stats":
        fix_imputation(strategy, replies)
        advance(strategy, "impute_stats")
    else:
        sites.fix_transform(strategy, replies)
        advance(strategy, "stats")
    return {"sites-usable": len(strategy.sites)}


def fix_imputation(strategy, replies) -> None:
    """The pooled fill from the imputation round; sites without valid statistics leave
    the run (their missing cells could not be filled as the others')."""
    sites.keep_answering(strategy, replies, "the imputation round")
    stats = [r.arrays for r in replies]
    try:
        fill = pooled_fill(imputation(strategy), [s.counts for s in stats], [s.sums for s in stats],
                           [s.histograms for s in stats], strategy.feature_names or None)
    except ValueError as err:
        raise FederationError(f"cannot impute: {err}") from None
    strategy.transform = FeatureTransform.fill_only(fill)


def carried_task(strategy) -> TaskPlan | None:
    """The task the describe round can carry for ``strategy`` (None: a round of its own)."""
    config = strategy.config
    if (not strategy.carries_first_task or strategy._resume_phase is not None
            or config.private or config.data_bounds):
        return None  # (DP and data-bounds: the first task's parameters need the width)
    if imputation(strategy) is not None:
        return impute_task(strategy)
    if config.scale != "none":
        return strategy.stats_task()
    if strategy.initial_centroids is not None or strategy.warm_start is not None:
        return None  # training starts at once, from centroids checked against the width
    if strategy.init_rounds() > 1:
        return None  # a start that grows (divisive) sends centroids of the width
    plan = strategy.init_task()
    if plan.per_site or plan.per_site_arrays or plan.sample or protocol.to_arrays(plan.arrays):
        return None
    return plan


def reduce_carried(strategy, server_round: int, carried: TaskPlan) -> None:
    """Validate the admitted sites' replies to the carried task and reduce them as the
    phase the describe round left the strategy in (``stats`` or ``init``) would."""
    keys = {site.node_id: site.key for site in strategy.sites.values()}
    received = []
    for node_id, (arrays, metrics, n_rows) in carried.received.items():
        if node_id not in keys:  # rejected at describe: its carried reply is not looked at
            continue
        if protocol.THEN_ERROR in metrics:  # the site refused the carried task alone
            metrics = {protocol.ERROR: metrics[protocol.THEN_ERROR]}
        received.append((node_id, keys[node_id], arrays, metrics, n_rows))
    replies, failed = sites.check_replies(strategy, server_round, carried, keys, received)
    for reason in failed:
        log(logging.WARNING, "round %s (%s): dropped %s", server_round, carried.task, reason)
    strategy.round_failures = failed
    if strategy.phase in (Phase.IMPUTE, Phase.STATS):
        reduce(strategy, server_round, carried, replies)
    elif strategy.phase == Phase.INIT:
        sites.require_answers(strategy, replies, carried.task)
        strategy.take_init(carried, replies)
    else:
        raise RuntimeError(f"a carried {carried.task} task in phase {strategy.phase}")

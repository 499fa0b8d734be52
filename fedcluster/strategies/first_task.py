"""The run's first task, sent with the describe handshake (one round instead of two).

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
from fedcluster.strategies import sites
from fedcluster.strategies.task_plan import TaskPlan


def carried_task(strategy) -> TaskPlan | None:
    """The task the describe round can carry for ``strategy`` (None: a round of its own)."""
    config = strategy.config
    if (not strategy.carries_first_task or strategy._resume_phase is not None
            or config.private or config.data_bounds):
        return None  # (DP and data-bounds: the first task's parameters need the width)
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
    if strategy.phase == "stats":
        sites.fix_transform(strategy, replies)
        strategy._begin_repetition()
    elif strategy.phase == "init":
        sites.require_answers(strategy, replies, carried.task)
        strategy.take_init(carried, replies)
    else:
        raise RuntimeError(f"a carried {carried.task} task in phase {strategy.phase}")

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
from fedcluster.strategies.sites import site_order
from fedcluster.strategies.task_plan import TaskPlan
from fedcluster.strategies.validation import ReplyError, check_reply


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
    plan = strategy.init_task()
    if plan.per_site or plan.per_site_arrays or plan.sample or protocol.to_arrays(plan.arrays):
        return None
    return plan


def reduce_carried(strategy, server_round: int, carried: TaskPlan) -> None:
    """Validate the admitted sites' replies to the carried task and reduce them as the
    phase the describe round left the strategy in (``stats`` or ``init``) would."""
    keys = {site.node_id: site.key for site in strategy.sites.values()}
    replies, failed = [], []
    for node_id, (arrays, metrics, n_rows) in carried.received.items():
        key = keys.get(node_id)
        if key is None:  # rejected at describe: its carried reply is not looked at
            continue
        try:
            if protocol.THEN_ERROR in metrics:
                raise ReplyError(f"the site refused: {metrics[protocol.THEN_ERROR]}")
            sites.count_answer(strategy.sites[key], carried.task, metrics.get(protocol.ROUNDS_LEFT))
            replies.append(check_reply(strategy, carried, node_id, key, keys, arrays, metrics,
                                       n_rows))
        except ReplyError as err:
            failed.append(f"site {key}: {err}")
            strategy.site_failures.setdefault(key, []).append(
                f"round {server_round + strategy.round_offset} ({carried.task}): reply dropped: {err}")
    for reason in failed:
        log(logging.WARNING, "round %s (%s): dropped %s", server_round, carried.task, reason)
    replies.sort(key=lambda r: site_order(r.site_key))
    strategy.round_failures = failed
    if strategy.phase == "stats":
        sites.fix_transform(strategy, replies)
        strategy._begin_repetition()
    elif strategy.phase == "init":
        sites.require_answers(strategy, replies, carried.task)
        strategy.start_training(strategy.reduce_init(carried, replies))
    else:
        raise RuntimeError(f"a carried {carried.task} task in phase {strategy.phase}")

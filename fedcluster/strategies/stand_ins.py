"""Stand-ins: a site's last training reply answers for it when its differencing guard
refuses a training task (node config ``guard-refuse = true``).

Why: a site that refuses every task its guard would alter (rather than answer with an
earlier cluster, the default) refuses a task in nearly every honest run, near
convergence, when a cluster gains or loses a row (docs/explanation/privacy-model.md).
Dropping it from those rounds moves the centroids away from its rows, and the next
round it is caught again. Its last reply to the same task in this repetition is the
honest answer the server already holds: standing in with it teaches the server nothing
and, for the one site, freezes its statistics where they were, as the guard's snapping
would for each caught cluster.

What has no stand-in: a task the site has not answered in this repetition (its start,
the first training round), the evaluation rounds (an earlier evaluation is of other
centroids, so the site is left out of the evaluation and the run's failures name it),
and secure rounds (a refusing site drops out of SecAgg+'s sum; the server never held its
own reply). A stand-in is noted in the site's failures, with the round it comes from.
The replies kept are not in a checkpoint: a resumed run keeps new ones.
"""

from __future__ import annotations

import dataclasses
import logging

from flwr.common.logger import log

from fedcluster.common import protocol
from fedcluster.strategies.validation import Reply

#: The training tasks whose last reply may stand in (their replies are statistics of the
#: site's rows against the centroids it received, which the next round replaces).
TRAINING_TASKS = ("lloyd", "minibatch", "prune_lloyd", "gtv")


def _slot(strategy, plan, key: str) -> tuple:
    return (strategy.repetition, key, plan.task, plan.n_clusters or strategy.k)


def _kept(strategy) -> dict:
    return strategy.__dict__.setdefault("_stand_ins", {})


def remember(strategy, server_round: int, plan, reply: Reply) -> None:
    """Keep ``reply`` (a valid one to a training task) as the site's latest."""
    if plan.task in TRAINING_TASKS and plan.secure is None:
        # Its evaluation was of the centroids it received then, not of later ones.
        kept = dataclasses.replace(reply, evaluation=None)
        _kept(strategy)[_slot(strategy, plan, reply.site_key)] = (
            server_round + strategy.round_offset, kept)


def stand_in(strategy, server_round: int, plan, key: str, metrics: dict) -> Reply | None:
    """The site's last reply to this task, when ``metrics`` is its guard's refusal and
    it has one in this repetition (noted in ``strategy.site_failures``); else None."""
    if metrics.get(protocol.REFUSED_BY) != protocol.GUARD_POLICY or plan.task not in TRAINING_TASKS:
        return None
    held = _kept(strategy).get(_slot(strategy, plan, key))
    if held is None:
        return None
    answered, reply = held
    now = server_round + strategy.round_offset
    note = (f"refused by its differencing guard (guard-refuse); its reply of round "
            f"{answered} stands in")
    log(logging.INFO, "round %s (%s): site %s %s", now, plan.task, key, note)
    strategy.site_failures.setdefault(key, []).append(f"round {now} ({plan.task}): {note}")
    return reply

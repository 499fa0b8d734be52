"""A round's replies as the server takes them (the Flower adapter gives them; the run
takes the outcome): failures named by site, every other reply validated
(``validation.py``) and put in site order, and the round's participation columns.

Nothing here changes the run: what a round did to it (a failure noted against a site,
a site rejected at describe, an answer counted towards a site's max-rounds) is handed
back as data, :class:`RoundOutcome`, which ``ClusteringStrategy.end_round`` records.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field

from fedcluster.common import protocol
from fedcluster.strategies import site_rows
from fedcluster.strategies.errors import SiteAbsence, SiteFailure
from fedcluster.strategies.round_facts import RoundFacts
from fedcluster.strategies.sites import site_order
from fedcluster.strategies.task_plan import TaskPlan
from fedcluster.strategies.reply import Expect, Reply, ReplyError
from fedcluster.strategies.validation import validate


@dataclass
class RoundOutcome:
    """What one round brought back, for the run to record and reduce.

    ``notes`` are (site key, reason) per failed or dropped reply, in the order they
    happened (the run prefixes the round: ``site_failures``); ``answered`` the
    (site key, rounds-left) of every answer that counts towards a site's max-rounds
    (rounds-left None: count one); ``rejected`` the sites a describe reply that did not
    validate rejects; ``in_sum`` the sites in a secure round's sum; ``offline`` and
    ``late`` the simulated absences (``server_app/availability.py``); ``started`` when
    the round was planned (the history's ``seconds``)."""

    keys: dict[int, str]
    replies: list[Reply] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    notes: list[tuple[str, str]] = field(default_factory=list)
    answered: list[tuple[str, object]] = field(default_factory=list)
    rejected: dict[str, str] = field(default_factory=dict)
    in_sum: list[str] = field(default_factory=list)
    offline: int = 0
    late: int = 0
    started: float | None = None  # perf_counter() when the round was planned


def failure_reason(failure, keys: dict[int, str]) -> tuple[str, str]:
    """(site key, reason) of a failed reply."""
    if isinstance(failure, SiteFailure):
        return keys.get(failure.node_id) or f"node-{failure.node_id}", failure.reason
    if isinstance(failure, BaseException):
        return "?", str(failure)
    proxy, res = failure
    return keys.get(int(proxy.node_id)) or f"node-{proxy.node_id}", res.status.message


def take_failures(outcome: RoundOutcome, failures) -> None:
    """Flower's failures of the round into ``outcome``: a simulated absence is counted
    (it is not a failure), any other failure named as "site K: reason"."""
    for failure in failures:
        if isinstance(failure, SiteAbsence):
            outcome.offline += failure.kind == "offline"
            outcome.late += failure.kind == "late"
            continue
        key, reason = failure_reason(failure, outcome.keys)
        outcome.failed.append(f"site {key}: {reason}")
        outcome.notes.append((key, reason))


def expectation(plan: TaskPlan, facts: RoundFacts) -> Expect:
    """What a reply to ``plan`` must look like (its site's declared rows apart)."""
    return Expect(
        task=plan.task,
        n_features=facts.n_features,
        n_clusters=plan.n_clusters or facts.k,
        max_rows=plan.max_rows,
        floor=facts.config.min_cluster_size,
        scale=plan.params.get("scale"),
        far=protocol.FAR_ROWS in plan.params,
        private=facts.config.private,
    )


def check_replies(plan: TaskPlan, facts: RoundFacts, outcome: RoundOutcome, received) -> None:
    """Validate a round's ``received`` replies, each (node id, site key, arrays,
    metrics, rows), into ``outcome``: the valid ones in site order; each answer of a
    joined site counted towards its max-rounds; a reply that does not validate dropped
    with a "site K: reason" line (at describe its site is rejected), the round going on
    with the others."""
    expect = expectation(plan, facts)
    for node_id, key, arrays, metrics, n_rows in received:
        if protocol.ERROR not in metrics and outcome.keys.get(node_id) == key:
            outcome.answered.append((key, metrics.get(protocol.ROUNDS_LEFT)))
        site = facts.sites.get(key)
        own = dataclasses.replace(expect, declared_rows=site.n_rows if site else None)
        try:
            outcome.replies.append(check_reply(own, plan, node_id, key, outcome.keys, arrays,
                                               metrics, n_rows))
        except ReplyError as err:
            outcome.failed.append(f"site {key}: {err}")
            outcome.notes.append((key, f"reply dropped: {err}"))
            if plan.task == "describe":
                outcome.rejected[key] = str(err)
    outcome.replies.sort(key=lambda r: site_order(r.site_key))


def participation(outcome: RoundOutcome, admitted: Mapping | None = None) -> dict:
    """A round's history columns on who was asked and who answered: counts (a simulated
    absence is not a failure), the reasons of the failures, and ``answered``, the keys of
    the sites whose valid replies the round used (those in a secure round's sum) as
    :func:`key_list` writes them; the rows those replies came from, and the usable rows
    of those sites they did not (``admitted``: the sites, their rows accounted for:
    ``site_rows.py``)."""
    replies = outcome.replies
    answered = sum(r.n_sites for r in replies)
    names = [r.site_key for r in replies if r.n_sites == 1] + list(outcome.in_sum)
    admitted = admitted or {}
    return {"sites-asked": len(outcome.keys), "sites-answered": answered,
            "sites-failed": len(outcome.keys) - answered - outcome.offline - outcome.late,
            "sites-offline": outcome.offline, "sites-late": outcome.late,
            "failures": "; ".join(outcome.failed), "answered": key_list(names),
            "rows-answered": sum(r.n_rows for r in replies),
            "rows-not-answered": sum(site_rows.not_answered(admitted[key].rows)
                                     for key in names if key in admitted)}


def key_list(keys) -> str:
    """Site keys in site order, a run of consecutive numbers written as its ends
    (``0-3,7,9-12,H1``): a round of 10,000 sites that all answered is ``0-9999``."""
    parts: list[str] = []
    run: list[int] = []  # the current run of consecutive numeric keys: [first, last]
    for key in sorted(keys, key=site_order):
        if key.isdigit() and run and int(key) == run[1] + 1 and str(int(key)) == key:
            run[1] += 1
            continue
        if run:
            parts.append(str(run[0]) if run[0] == run[1] else f"{run[0]}-{run[1]}")
            run = []
        if key.isdigit() and str(int(key)) == key:
            run = [int(key), int(key)]
        else:
            parts.append(key)
    if run:
        parts.append(str(run[0]) if run[0] == run[1] else f"{run[0]}-{run[1]}")
    return ",".join(parts)


def check_reply(expect: Expect, plan, node_id, key, keys, arrays, metrics, n_rows) -> Reply:
    """One site's reply to ``plan``, validated against ``expect`` (its site's declared
    rows in it: ``round_replies.check_replies``)."""
    if plan.task != "describe" and keys.get(node_id) != key:
        raise ReplyError(f"answered as site {key!r} but node {node_id} joined as {keys.get(node_id)!r}")
    evaluation = None
    if plan.params.get(protocol.EVALUATE_TOO) and protocol.ERROR not in metrics:
        try:
            arrays, metrics, eval_arrays, eval_metrics = protocol.split_evaluation(
                plan.task, arrays, metrics)
        except protocol.ProtocolError as err:
            raise ReplyError(str(err)) from None
        as_evaluation = dataclasses.replace(expect, task="evaluate", max_rows=None, scale=None)
        evaluation = Reply(key, node_id, int(n_rows),
                           validate(eval_arrays, eval_metrics, int(n_rows), as_evaluation),
                           eval_metrics)
    typed = validate(arrays, metrics, int(n_rows), expect)
    return Reply(key, node_id, int(n_rows), typed, metrics, evaluation=evaluation)

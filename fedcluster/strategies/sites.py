"""The federation's sites as the server knows them: what each declared in the
``describe`` round, who is admitted (and re-admitted after a resume), and how many task
rounds each has answered under its own ``max-rounds`` policy (``common/site_policy.py``).

Admission: the majority width is the federation's; a site of another width, a
duplicate site id, a schema other than the run's (both hashes named), or columns named
differently from the majority's is rejected with
the reason (``rejected-sites``), and the run stops when fewer than ``min-sites`` remain.
After a resume every site must be the checkpoint's site of the same id, size and width.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
from flwr.common.logger import log

from fedcluster.common import protocol, scaling
from fedcluster.common.kernels.spread import SPREAD_MIN_SIZE
from fedcluster.common.schema import encoded_kinds, run_schema

from fedcluster.strategies import aggregate, private, site_rows
from fedcluster.strategies.errors import FederationError, SiteFailure
from fedcluster.strategies.validation import Reply, ReplyError, check_reply
from fedcluster.strategies.phases import Phase


@dataclass
class Site:
    """What the server knows of a site: what it declared in the describe round."""

    key: str
    node_id: int
    n_rows: int
    n_features: int
    feature_names: list[str]
    provenance: dict
    # The site's own policy max-rounds (None: no limit), and the counted task rounds it
    # has answered in this run (every task but describe, as the site counts them:
    # common/site_policy.py). A site at its limit is not asked again.
    max_rounds: int | None = None
    rounds_answered: int = 0
    # A table read through the schema: the rows it dropped and its missing cells per
    # column, as it reported them (counts, "<p" under the floor).
    table: dict = field(default_factory=dict)
    # The size of the groups the site answers from (its own min-cluster-size; None: it
    # did not say). 1: the site opted out and answers from its rows.
    group_size: int | None = None
    # Its rows accounted for: answered from, waiting, held back (``site_rows.account``).
    rows: dict = field(default_factory=dict)

    @property
    def answers_from_rows(self) -> bool:
        return self.group_size == 1

    @property
    def at_limit(self) -> bool:
        return self.max_rounds is not None and self.rounds_answered >= self.max_rounds


def site_order(key: str) -> tuple:
    """Sort numeric site keys numerically, then the rest by name."""
    return (0, int(key), "") if key.isdigit() else (1, 0, key)


def declared_max_rounds(reply: Reply) -> int | None:
    """The policy max-rounds a site declared in its describe reply (None: no limit)."""
    value = reply.metrics.get("max-rounds")
    return None if value is None else int(value)


def declared_group_size(reply: Reply) -> int | None:
    """The size of the groups a site said it answers from (None: not said)."""
    value = reply.metrics.get(protocol.GROUP_SIZE)
    return None if value is None else int(value)


def admit(strategy, replies: list[Reply]) -> None:
    """Admit the sites of the describe round into ``strategy.sites`` (replies in site
    order); reject the others into ``strategy.rejected`` with the reason.

    Raises
    ------
    FederationError
        When fewer than ``min-sites`` sites are admitted.
    """
    widths = Counter(int(r.metrics["n-features"]) for r in replies)
    if not widths:
        raise FederationError(too_few(strategy, "no site described its data"))
    # The majority width is the federation's; replies are in site order and the
    # Counter keeps first-seen order, so a tie goes to the width of the first site.
    width = max(widths, key=widths.get)
    for r in replies:
        n_features = int(r.metrics["n-features"])
        if r.site_key in strategy.sites:
            strategy.rejected[r.site_key] = f"duplicate site id {r.site_key!r} (node {r.node_id})"
        elif (mismatch := schema_mismatch(strategy.config.schema_file, r)) is not None:
            strategy.rejected[r.site_key] = mismatch
        elif n_features != width:
            strategy.rejected[r.site_key] = (
                f"its data has {n_features} columns but the other sites have {width}"
            )
        else:
            strategy.sites[r.site_key] = Site(
                key=r.site_key,
                node_id=r.node_id,
                n_rows=r.n_rows,
                n_features=n_features,
                feature_names=json.loads(str(r.metrics.get("feature-names", "[]"))),
                provenance={
                    k: r.metrics[k]
                    for k in ("dataset", "partitioning", "num-partitions")
                    if k in r.metrics
                },
                max_rounds=declared_max_rounds(r),
                table=table_facts(r),
                group_size=declared_group_size(r),
                rows=site_rows.account(r),
            )
            site_rows.warn(r.site_key, strategy.sites[r.site_key].rows)
            continue
        log(logging.ERROR, "site %s rejected: %s", r.site_key, strategy.rejected[r.site_key])
    check_feature_names(strategy)
    if len(strategy.sites) < strategy.config.min_sites:
        raise FederationError(too_few(strategy, f"{len(strategy.sites)} usable site(s)"))


def schema_mismatch(schema_path: str, reply: Reply) -> str | None:
    """Why a site's table does not follow the run's schema (None: it does); both hashes
    are named."""
    run = run_schema(schema_path)
    expected = None if run is None else run[1]
    held = reply.metrics.get(protocol.SCHEMA_HASH)
    if expected == held:
        return None
    if expected is None:
        return (f"it reads its table through a schema (sha256 {held}), but the run names "
                "none (run config 'schema')")
    if held is None:
        return (f"the run's schema is sha256 {expected}, but this site reads its table "
                "without one (node-config 'schema-path')")
    return f"it holds another schema: sha256 {held}; the run's is sha256 {expected}"


def table_facts(reply: Reply) -> dict:
    """A site's reported rows dropped and missing cells (empty without a schema)."""
    facts = {}
    for key in (protocol.ROWS_DROPPED, protocol.CELLS_MISSING):
        if key in reply.metrics:
            try:
                facts[key] = json.loads(str(reply.metrics[key]))
            except ValueError:
                facts[key] = str(reply.metrics[key])
    return facts


def readmit(strategy, replies: list[Reply]) -> None:
    """After a resume: each site must be the checkpoint's site of the same id (same
    size and width); its node id is updated. Others are rejected with the reason.

    Raises
    ------
    FederationError
        When fewer than ``min-sites`` of the checkpoint's sites are back.
    """
    seen = set()
    for r in replies:
        site = strategy.sites.get(r.site_key)
        width = int(r.metrics["n-features"])
        if site is None:
            reason = "not a site of the checkpointed run"
        elif r.site_key in seen:
            reason = f"duplicate site id {r.site_key!r} (node {r.node_id})"
        elif (r.n_rows, width) != (site.n_rows, site.n_features):
            reason = (f"holds {r.n_rows} rows x {width} columns, but {site.n_rows} x "
                      f"{site.n_features} in the checkpointed run")
        else:
            site.node_id = r.node_id
            # A resumed run is a new run to the site: its count starts again.
            site.max_rounds, site.rounds_answered = declared_max_rounds(r), 0
            site.group_size = declared_group_size(r)
            site.rows = site_rows.account(r)
            site_rows.warn(r.site_key, site.rows)
            seen.add(r.site_key)
            continue
        strategy.rejected[r.site_key] = reason
        log(logging.ERROR, "site %s rejected on resume: %s", r.site_key, reason)
    for key in set(strategy.sites) - seen:
        strategy.sites[key].node_id = -1  # not connected now: never asked until it is
        log(logging.WARNING, "site %s of the checkpointed run is not connected", key)
    if len(seen) < strategy.config.min_sites:
        raise FederationError(too_few(strategy, f"{len(seen)} site(s) of the checkpointed run"))


def check_feature_names(strategy) -> None:
    """Sites that name their columns must name them alike (the majority wins)."""
    named = [s for s in strategy.ordered_sites() if s.feature_names]
    votes = Counter(tuple(s.feature_names) for s in named)
    if len(votes) < 2:
        return
    names = list(max(votes, key=votes.get))
    for site in named:
        if site.feature_names != names:
            del strategy.sites[site.key]
            strategy.rejected[site.key] = (
                f"its columns {site.feature_names} differ from the other sites' {names}"
            )
            log(logging.ERROR, "site %s rejected: %s", site.key, strategy.rejected[site.key])


def count_answer(site: Site | None, task: str, rounds_left=None) -> None:
    """Count a task round ``site`` answered (as the site counts it: by its own
    ``rounds-left`` when the reply carries a valid one, else one more); say so when that
    reaches the max-rounds of its own policy (it is not asked again)."""
    if site is None or task == "describe":
        return
    before = site.rounds_answered
    if (site.max_rounds is not None and isinstance(rounds_left, int)
            and 0 <= rounds_left < site.max_rounds):
        site.rounds_answered = site.max_rounds - rounds_left
    else:
        site.rounds_answered += 1
    if site.max_rounds is not None and before < site.max_rounds <= site.rounds_answered:
        log(logging.WARNING, "site %s answered its max-rounds=%d task rounds (its own "
            "policy); it is not asked again in this run", site.key, site.max_rounds)


def failure_reason(failure, keys: dict[int, str]) -> tuple[str, str]:
    """(site key, reason) of a failed reply."""
    if isinstance(failure, SiteFailure):
        return keys.get(failure.node_id) or f"node-{failure.node_id}", failure.reason
    if isinstance(failure, BaseException):
        return "?", str(failure)
    proxy, res = failure
    return keys.get(int(proxy.node_id)) or f"node-{proxy.node_id}", res.status.message


def record_failures(strategy, server_round: int, task: str, keys: dict[int, str],
                    failures) -> list[str]:
    """Note a round's failed replies in ``strategy.site_failures``; return them as
    "site K: reason" lines."""
    failed = []
    for failure in failures:
        key, reason = failure_reason(failure, keys)
        failed.append(f"site {key}: {reason}")
        strategy.site_failures.setdefault(key, []).append(
            f"round {server_round + strategy.round_offset} ({task}): {reason}")
    return failed


def check_replies(strategy, server_round: int, plan, keys: dict[int, str],
                  received) -> tuple[list[Reply], list[str]]:
    """A round's replies, validated: the valid ones in site order, and a "site K: reason"
    line per dropped one. ``received`` holds (node id, site key, arrays, metrics, rows) per
    reply. Each answer of a joined site counts towards its max-rounds; a reply that does
    not validate is dropped and noted in ``strategy.site_failures`` (at describe, the site
    is rejected), and the round goes on with the others."""
    replies, dropped = [], []
    for node_id, key, arrays, metrics, n_rows in received:
        if protocol.ERROR not in metrics and keys.get(node_id) == key:
            count_answer(strategy.sites.get(key), plan.task, metrics.get(protocol.ROUNDS_LEFT))
        try:
            replies.append(check_reply(strategy, plan, node_id, key, keys, arrays, metrics, n_rows))
        except ReplyError as err:
            dropped.append(f"site {key}: {err}")
            strategy.site_failures.setdefault(key, []).append(
                f"round {server_round + strategy.round_offset} ({plan.task}): reply dropped: {err}")
            if plan.task == "describe":
                strategy.rejected[key] = str(err)
    replies.sort(key=lambda r: site_order(r.site_key))
    return replies, dropped


def participation(keys: dict[int, str], replies: list[Reply], failed: list[str],
                  in_sum: list[str], admitted: dict | None = None) -> dict:
    """A round's history columns on who was asked and who answered: counts, the
    reasons of the failures, and ``answered``, the keys of the sites whose valid replies
    the round used (those in a secure round's sum, ``in_sum``) as :func:`key_list`
    writes them; the rows those replies came from, and the usable rows of those sites
    they did not (``admitted``: the sites, their rows accounted for: ``site_rows.py``).
    ``sites-offline`` and ``sites-late`` are the simulated absences
    (``server_app/availability.py`` sets them; 0 here)."""
    answered = sum(r.n_sites for r in replies)
    names = [r.site_key for r in replies if r.n_sites == 1] + list(in_sum)
    admitted = admitted or {}
    return {"sites-asked": len(keys), "sites-answered": answered,
            "sites-failed": len(keys) - answered, "sites-offline": 0, "sites-late": 0,
            "failures": "; ".join(failed), "answered": key_list(names),
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


def too_few(strategy, what: str) -> str:
    """Why the run cannot go on: ``what`` against min-sites, and every rejection."""
    reasons = "; ".join(f"site {k}: {v}" for k, v in strategy.rejected.items())
    return (
        f"{what}, but min-sites = {strategy.config.min_sites}"
        + (f". Rejected: {reasons}" if reasons else "")
    )


def require_answers(strategy, replies: list[Reply], task: str) -> None:
    """Stop the run (FederationError naming the round's dropped replies) when fewer than
    min-sites valid replies came back, except in a training round of any algorithm (its
    fraction-C sample may be smaller; with no reply the centroids stay, and the round
    still counts)."""
    if not replies:
        log(logging.WARNING, "task %s: no valid reply this round", task)
    answered = sum(r.n_sites for r in replies)
    training = task == "lloyd" or strategy.phase == Phase.TRAIN
    if not training and answered < min(strategy.config.min_sites, len(strategy.sites)):
        dropped = "; ".join(strategy.round_failures)
        raise FederationError(f"task {task}: only {answered} valid replies, min-sites = "
                              f"{strategy.config.min_sites}" + (f"; dropped: {dropped}" * bool(dropped)))


def sample(strategy, usable: list[Site]) -> list[Site]:
    """The round's seeded fraction-C sample of the usable sites (all when C covers them)."""
    m = max(1, round(strategy.config.fraction * len(usable)))
    if m >= len(usable):
        return usable
    rng = np.random.default_rng([strategy.seed, strategy.train_round, 7919])
    chosen = np.sort(rng.choice(len(usable), size=m, replace=False))
    return [usable[i] for i in chosen]


def keep_answering(strategy, replies: list[Reply], what: str) -> None:
    """Only the sites that answered round ``what`` stay in the run (the others are
    rejected with the reason their reply gave)."""
    answered = {r.site_key for r in replies}
    for key in [k for k in strategy.sites if k not in answered]:
        del strategy.sites[key]
        said = [f for f in strategy.round_failures if f.startswith(f"site {key}: ")]
        strategy.rejected[key] = (f"no valid reply to {what}"
                                  + (f": {said[0][len(f'site {key}: '):]}" if said else ""))
        log(logging.ERROR, "site %s rejected: %s", key, strategy.rejected[key])
    if len(strategy.sites) < strategy.config.min_sites or not replies:
        raise FederationError(too_few(strategy, f"{len(strategy.sites)} site(s) answered {what}"))


def fix_transform(strategy, replies: list[Reply]) -> None:
    """The global transform from the statistics round (after the imputation's fill, if
    any); sites without valid statistics leave the run (their rows would be clustered
    unscaled by the others' transform)."""
    keep_answering(strategy, replies, "the statistics round (scale)")
    fill = None if strategy.transform is None else strategy.transform.fill
    counts = [r.n_rows for r in replies]
    if strategy.config.scale == "standard":
        means = [r.arrays.means for r in replies]
        deviations = [r.arrays.deviation_sums for r in replies]
        m2s = [r.arrays.m2 for r in replies]
        strategy.transform = scaling.standard_transform(counts, means, deviations, m2s)
    else:
        private.warn_extremes(strategy, "scale 'minmax'")
        minima = [r.arrays.minima for r in replies]
        maxima = [r.arrays.maxima for r in replies]
        strategy.transform = scaling.minmax_transform(minima, maxima)
    strategy.transform = unscaled_levels(strategy.transform, strategy.config.schema_file).with_fill(fill)


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


#: The k-means strategies' default ``score-tol`` where a site splits its groups by their
#: spread (p_site >= SPREAD_MIN_SIZE): a split group's share moves a little every round,
#: so the centroids approach their fixed point only linearly (as FFCM's do) and the
#: movement rule alone ran MNIST to the round cap (bench/quality.py).
SPLIT_SCORE_TOL = 1e-6


def default_score_tol(strategy) -> float:
    """``score-tol`` 0's meaning: the strategy's ``default_score_tol`` (FFCM's), or for a
    k-means strategy (None) :data:`SPLIT_SCORE_TOL` where a site's groups are split by
    their spread, else 0 (the movement rule alone, as before)."""
    if strategy.default_score_tol is not None:
        return strategy.default_score_tol
    split = any((site.group_size or 1) >= SPREAD_MIN_SIZE for site in strategy.sites.values())
    return SPLIT_SCORE_TOL if split else 0.0


def score_stalled(strategy, scores: list[float]) -> bool:
    """Whether this repetition's training ``scores`` have stalled: ``score-tol`` (0: its
    :func:`default_score_tol`) and the strategy's ``score_best_patience`` (GTV's, EWF's) through
    ``aggregate.score_stalled``."""
    return aggregate.score_stalled(scores, strategy.config.score_tol or default_score_tol(strategy),
                                   best_patience=strategy.score_best_patience)

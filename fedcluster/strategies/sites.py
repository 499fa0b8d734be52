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

import dataclasses
import json
import logging
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
from flwr.common.logger import log

from fedcluster.common import protocol
from fedcluster.common.schema import run_schema

from fedcluster.strategies import site_rows
from fedcluster.strategies.errors import FederationError
from fedcluster.strategies.reply import Reply


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


def admit(config, replies: list[Reply], rejected: dict[str, str]) -> tuple[dict, dict]:
    """The sites of the describe round (replies in site order): ``(sites, rejected)``,
    the admitted ones by key and ``rejected`` with the others added, each with its reason.

    Raises
    ------
    FederationError
        When fewer than ``min-sites`` sites are admitted.
    """
    admitted: dict[str, Site] = {}
    rejected = dict(rejected)
    widths = Counter(int(r.metrics["n-features"]) for r in replies)
    if not widths:
        raise FederationError(too_few(config, rejected, "no site described its data"))
    # The majority width is the federation's; replies are in site order and the
    # Counter keeps first-seen order, so a tie goes to the width of the first site.
    width = max(widths, key=widths.get)
    for r in replies:
        n_features = int(r.metrics["n-features"])
        if r.site_key in admitted:
            rejected[r.site_key] = f"duplicate site id {r.site_key!r} (node {r.node_id})"
        elif (mismatch := schema_mismatch(config.schema_file, r)) is not None:
            rejected[r.site_key] = mismatch
        elif n_features != width:
            rejected[r.site_key] = (
                f"its data has {n_features} columns but the other sites have {width}"
            )
        else:
            admitted[r.site_key] = Site(
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
            site_rows.warn(r.site_key, admitted[r.site_key].rows)
            continue
        log(logging.ERROR, "site %s rejected: %s", r.site_key, rejected[r.site_key])
    admitted, rejected = alike_feature_names(admitted, rejected)
    if len(admitted) < config.min_sites:
        raise FederationError(too_few(config, rejected, f"{len(admitted)} usable site(s)"))
    return admitted, rejected


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


def readmit(config, known: dict[str, Site], replies: list[Reply],
            rejected: dict[str, str]) -> tuple[dict, dict]:
    """After a resume, ``(sites, rejected)``: each site must be the checkpoint's site of
    the same id (same size and width), taken with its new node id; others are rejected
    with the reason, and a checkpoint's site that is not back is kept unconnected.

    Raises
    ------
    FederationError
        When fewer than ``min-sites`` of the checkpoint's sites are back.
    """
    seen = set()
    back = dict(known)
    rejected = dict(rejected)
    for r in replies:
        site = known.get(r.site_key)
        width = int(r.metrics["n-features"])
        if site is None:
            reason = "not a site of the checkpointed run"
        elif r.site_key in seen:
            reason = f"duplicate site id {r.site_key!r} (node {r.node_id})"
        elif (r.n_rows, width) != (site.n_rows, site.n_features):
            reason = (f"holds {r.n_rows} rows x {width} columns, but {site.n_rows} x "
                      f"{site.n_features} in the checkpointed run")
        else:
            # A resumed run is a new run to the site: its count starts again.
            back[r.site_key] = dataclasses.replace(
                site, node_id=r.node_id, max_rounds=declared_max_rounds(r), rounds_answered=0,
                group_size=declared_group_size(r), rows=site_rows.account(r))
            site_rows.warn(r.site_key, back[r.site_key].rows)
            seen.add(r.site_key)
            continue
        rejected[r.site_key] = reason
        log(logging.ERROR, "site %s rejected on resume: %s", r.site_key, reason)
    for key in sorted(set(known) - seen, key=site_order):
        back[key] = dataclasses.replace(known[key], node_id=-1)  # never asked until it is back
        log(logging.WARNING, "site %s of the checkpointed run is not connected", key)
    if len(seen) < config.min_sites:
        raise FederationError(too_few(config, rejected, f"{len(seen)} site(s) of the checkpointed run"))
    return back, rejected


def alike_feature_names(admitted: dict[str, Site], rejected: dict[str, str]) -> tuple[dict, dict]:
    """Sites that name their columns must name them alike (the majority wins):
    ``(sites, rejected)`` with the others rejected."""
    named = [s for s in sorted(admitted.values(), key=lambda s: site_order(s.key)) if s.feature_names]
    votes = Counter(tuple(s.feature_names) for s in named)
    if len(votes) < 2:
        return admitted, rejected
    names = list(max(votes, key=votes.get))
    admitted, rejected = dict(admitted), dict(rejected)
    for site in named:
        if site.feature_names != names:
            del admitted[site.key]
            rejected[site.key] = (
                f"its columns {site.feature_names} differ from the other sites' {names}"
            )
            log(logging.ERROR, "site %s rejected: %s", site.key, rejected[site.key])
    return admitted, rejected


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


def too_few(config, rejected: dict[str, str], what: str) -> str:
    """Why the run cannot go on: ``what`` against min-sites, and every rejection."""
    reasons = "; ".join(f"site {k}: {v}" for k, v in rejected.items())
    return (
        f"{what}, but min-sites = {config.min_sites}"
        + (f". Rejected: {reasons}" if reasons else "")
    )


def require_answers(config, replies: list[Reply], task: str, training: bool, n_sites: int,
                    round_failures: list[str]) -> None:
    """Stop the run (FederationError naming the round's dropped replies,
    ``round_failures``) when fewer than min-sites valid replies came back (or fewer than
    the ``n_sites`` admitted), except in a ``training`` round of any algorithm (its
    fraction-C sample may be smaller; with no reply the centroids stay, and the round
    still counts)."""
    if not replies:
        log(logging.WARNING, "task %s: no valid reply this round", task)
    answered = sum(r.n_sites for r in replies)
    if not training and answered < min(config.min_sites, n_sites):
        dropped = "; ".join(round_failures)
        raise FederationError(f"task {task}: only {answered} valid replies, min-sites = "
                              f"{config.min_sites}" + (f"; dropped: {dropped}" * bool(dropped)))


def sample(usable: list[Site], fraction: float, seed: int, train_round: int) -> list[Site]:
    """A round's seeded fraction-C sample of the ``usable`` sites (all when C covers them),
    drawn from the repetition's ``seed`` and the training round."""
    m = max(1, round(fraction * len(usable)))
    if m >= len(usable):
        return usable
    rng = np.random.default_rng([seed, train_round, 7919])
    chosen = np.sort(rng.choice(len(usable), size=m, replace=False))
    return [usable[i] for i in chosen]


def keep_answering(config, admitted: dict[str, Site], rejected: dict[str, str],
                   replies: list[Reply], round_failures: list[str], what: str) -> tuple[dict, dict]:
    """Only the sites that answered round ``what`` stay in the run: ``(sites, rejected)``,
    the others rejected with the reason their reply gave (``round_failures``).

    Raises
    ------
    FederationError
        When fewer than ``min-sites`` stay, or none answered.
    """
    answered = {r.site_key for r in replies}
    admitted, rejected = dict(admitted), dict(rejected)
    for key in [k for k in admitted if k not in answered]:
        del admitted[key]
        said = [f for f in round_failures if f.startswith(f"site {key}: ")]
        rejected[key] = (f"no valid reply to {what}"
                         + (f": {said[0][len(f'site {key}: '):]}" if said else ""))
        log(logging.ERROR, "site %s rejected: %s", key, rejected[key])
    if len(admitted) < config.min_sites or not replies:
        raise FederationError(too_few(config, rejected, f"{len(admitted)} site(s) answered {what}"))
    return admitted, rejected

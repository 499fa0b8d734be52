"""The server's side of secure aggregation: what a secure round sums, and the decoded
sum made into one reply (docs/how-to/secure-aggregation.md; the encoding is in
``common/secure_codec.py``, the sites' side in ``client_app/secure_mod.py``).

A secure round sends each task with the terms to sum and their agreed scales
(:func:`terms_and_scales`). SecAgg+ hands the server the SUM only, so a site's reply
cannot be validated on its own: the aggregate is checked as a whole
(:func:`check_sum`: finite, shapes, the row total equal to what the contributing sites
declared) and becomes ONE reply standing for the N sites that took part
(:func:`sum_reply`; :func:`secure_replies` for the round), which the strategies then
reduce unchanged.
"""

from __future__ import annotations

import logging

import numpy as np
from flwr.common import parameters_to_ndarrays
from flwr.common.logger import log

from fedcluster.common import protocol
from fedcluster.common import secure_codec as secure
from fedcluster.strategies import private
from fedcluster.strategies.errors import FederationError
from fedcluster.strategies.round_facts import RoundFacts
from fedcluster.strategies.round_replies import RoundOutcome, failure_reason
from fedcluster.strategies.sites import site_order
from fedcluster.strategies.reply import Expect, Reply, ReplyError
from fedcluster.strategies.validation import cluster_profile


def terms_and_scales(facts: RoundFacts, plan, sites) -> tuple[list[str], list[float]]:
    """The terms a secure round of ``plan`` over ``sites`` sums, and their agreed scales
    (``secure.term_bounds``; under distributed DP widened by ``private.secure_scales``).

    Raises
    ------
    FederationError
        For a task that is not a sum, or a federation beyond the protocol's range
        (``secure.check_protocol_range``).
    """
    config = facts.config
    if plan.task not in protocol.SECURE_TASKS:
        raise FederationError(f"task {plan.task} is not a sum; it cannot run under "
                              "secure-aggregation")
    n_max = max((s.n_rows for s in sites), default=1)
    why = secure.check_protocol_range(len(sites), n_max, config.secagg_quantization_range)
    if why is not None:
        raise FederationError(f"secure aggregation: {why}")
    batch = config.batch_size
    names = secure.term_names(
        plan.task,
        # EWF's plain mean of centroids is for training; a start's Lloyd rounds weight
        dynamic=facts.dynamic,
        fuzzy_eval="fuzzifier" in plan.params,
        # under DP a training round sends no SSE (docs/how-to/differential-privacy.md)
        with_sse=(plan.task == "lloyd" and not config.private) or (
            plan.task == "minibatch" and (
                batch == 0 or batch >= min((s.n_rows for s in sites), default=0))),
    )
    # the centres a distance term is measured to: the pooled means, or (evaluate) the centroids
    means = {"evaluate_distances": getattr(plan.arrays, "means", None),
             "evaluate": getattr(plan.arrays, "centroids", None)}.get(plan.task)
    if plan.task == "profile":
        inputs = plan.arrays
        scales = secure.profile_term_bounds(names, *facts.value_box, inputs.references, n_max)
    else:
        scales = secure.term_bounds(names, np.asarray(plan.arrays.centroids),
                                    config.secagg_data_bound, n_max, means)
    return names, private.secure_scales(facts, plan.task, names, scales, len(sites))


def check_sum(sums: dict, n_rows: int, k: int, d: int) -> None:
    """A decoded sum's entries are finite, its terms of the expected shapes, and its
    row count that of the contributing sites (ReplyError otherwise)."""
    for name, value in sums.items():
        if not np.all(np.isfinite(value)):
            raise ReplyError(f"term {name} is not finite")
    if int(sums["n"][0]) != n_rows:
        raise ReplyError(f"the sites' rows sum to {int(sums['n'][0])}, but they declared {n_rows}")
    expect = {"wc": (k, d), "c": (k, d), "w": (k,), "w-int": (k,), "counts": (k,),
              "sums": (k, d), "sqnorms": (k,), "hidden": (k,), "distances": (k,)}
    for name, shape in expect.items():
        if name in sums and sums[name].shape != shape:
            raise ReplyError(f"term {name} has shape {sums[name].shape}, expected {shape}")


def sum_reply(facts: RoundFacts, plan, sums: dict, n_sites: int, n_rows: int) -> Reply:
    """The reply that stands for a secure round's decoded ``sums`` over ``n_sites``
    sites with ``n_rows`` rows, in the layout of one site's plain reply (ReplyError
    when the sum does not validate). Under distributed DP the noisy sum is
    post-processed here (``private.release_sum``)."""
    config, k = facts.config, plan.n_clusters or facts.k
    check_sum(sums, n_rows, k, facts.n_features)
    if config.private:
        arrays, metrics_out = private.release_sum(
            plan.task, sums, n_rows, config.min_cluster_size, facts.box,
            np.asarray(plan.arrays.centroids, dtype=np.float64))
        return Reply("secure-sum", -1, n_rows, arrays, metrics_out, n_sites=n_sites)
    for name in ("w-int", "counts", "hidden"):
        if name in sums and (np.any(sums[name] < 0) or np.any(sums[name] > n_rows)):
            raise ReplyError(f"term {name} is outside [0, {n_rows}]")
    metrics_out = {key: float(sums[key][0]) for key in
                   ("sse", "silhouette-sum", "group-scatter", "all-sq-dist", "partition-sum")
                   if key in sums}
    if plan.task in ("lloyd", "minibatch", "fcm"):
        C = np.asarray(plan.arrays.centroids, dtype=np.float64)
        if "c" in sums:  # EWF: the plain mean of the sites' centroids
            local, weights = sums["c"] / n_sites, np.zeros(k)
        else:
            weights = sums["w-int"] if "w-int" in sums else sums["w"]
            # A fuzzy weight within the quantisation error of 0 counts as 0.
            noise = 0.0 if "w-int" in sums else secure.quantisation_error(
                plan.secure[1][plan.secure[0].index("w")], n_sites,
                config.secagg_quantization_range)
            has = weights > noise
            local = C.copy()
            local[has] = sums["wc"][has] / weights[has, None]
            weights = np.where(has, weights, 0.0)
        kind = protocol.FuzzyCentres if plan.task == "fcm" else protocol.ClusterMeans
        arrays = kind(local, weights)
    elif plan.task == "profile":
        terms = {name: sums[protocol.PROFILE_TERM + name] for name in protocol.ClusterProfile._fields}
        terms["squares"] = np.maximum(terms["squares"], 0.0)  # quantisation about an exact 0
        expect = Expect("profile", facts.n_features, k, plan.max_rows, config.min_cluster_size)
        arrays = cluster_profile(protocol.ClusterProfile(**terms), expect, n_rows, n_sites)
    elif plan.task == "evaluate":
        arrays = protocol.Evaluation(sums["counts"].astype(np.int64), sums["sums"],
                                     sums["sqnorms"], sums["hidden"].astype(np.int64),
                                     sums["distances"])
    else:
        arrays = protocol.Distances(sums["distances"])
    return Reply("secure-sum", -1, n_rows, arrays, metrics_out, n_sites=n_sites)


def secure_replies(facts: RoundFacts, plan, outcome: RoundOutcome, results, failures) -> None:
    """The decoded sum of a secure round into ``outcome`` as ONE reply standing for its N
    sites (the reductions then run unchanged), or none when the aggregate fails
    validation; the sites left out of the sum named in it.

    SecAgg+ gives the server the sum only: a site's reply cannot be validated on its
    own, so the aggregate is (finite, shapes, counts within the rows of the sites that
    contributed, the row total equal to theirs); a site that sends bad values makes
    the whole round unusable, and cannot be named."""
    keys = outcome.keys
    contributors = [keys[int(proxy.node_id)] for proxy, _ in results]
    outcome.answered += [(key, None) for key in contributors]
    errors = "; ".join(failure_reason(f, keys)[1] for f in failures)
    if errors:
        log(logging.WARNING, "secure round (%s): SecAgg+ failures: %s", plan.task, errors)
    for key in sorted(set(keys.values()) - set(contributors), key=site_order):
        reason = "left out of the secure sum (no masked reply; see the site's log)"
        outcome.failed.append(f"site {key}: {reason}")
        outcome.notes.append((key, reason))
    if not results:
        return
    names, scales = plan.secure
    n_sites = len(contributors)
    n_rows = sum(facts.sites[key].n_rows for key in contributors)
    aggregate = parameters_to_ndarrays(results[0][1].parameters)
    try:
        sums = secure.decode(aggregate, names, scales, n_sites)
        reply = sum_reply(facts, plan, sums, n_sites, n_rows)
    except ReplyError as err:
        reason = f"secure sum of sites {', '.join(sorted(contributors, key=site_order))}: {err}"
        outcome.failed.append(reason)
        log(logging.ERROR, "secure round (%s) unusable: %s", plan.task, reason)
        return
    except ValueError as err:
        outcome.failed.append(f"secure sum: {err}")
        return
    outcome.replies.append(reply)
    outcome.in_sum = contributors

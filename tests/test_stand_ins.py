"""Stand-ins (strategies/stand_ins.py): when a site's differencing guard refuses a
training task (node config ``guard-refuse``), its last reply to that task answers for it,
so an honest run keeps every site in training; evaluations and starts have no stand-in."""

from __future__ import annotations

import types

import numpy as np
from sklearn import datasets

import fedcluster
from fedcluster.common import protocol
from fedcluster.common.datasets import partition
from fedcluster.strategies import stand_ins
from fedcluster.strategies.task_plan import TaskPlan
from fedcluster.strategies.validation import Reply

GUARD_REFUSAL = {protocol.ERROR: "site policy differencing-guard (guard-refuse): ...",
                 protocol.REFUSED_BY: protocol.GUARD_POLICY}


def _strategy():
    return types.SimpleNamespace(repetition=0, round_offset=0, k=2, site_failures={})


def _reply(key="a", evaluation=None):
    arrays = protocol.ClusterMeans(np.ones((2, 3)), np.array([5.0, 7.0]))
    return Reply(key, 1, 12, arrays, {"sse": 1.0}, evaluation=evaluation)


def test_the_last_training_reply_stands_in_for_a_guard_refusal_only():
    strategy, lloyd = _strategy(), TaskPlan("lloyd")
    earlier = _reply(evaluation=_reply())
    stand_ins.remember(strategy, 3, lloyd, earlier)
    held = stand_ins.stand_in(strategy, 4, lloyd, "a", GUARD_REFUSAL)
    assert held is not None and held.arrays is earlier.arrays
    assert held.evaluation is None  # of the centroids round 3 was sent, not of round 4's
    assert strategy.site_failures["a"] == [
        "round 4 (lloyd): refused by its differencing guard (guard-refuse); its reply of "
        "round 3 stands in"]
    # another refusal, another site, another repetition, an evaluation: no stand-in
    other = {protocol.ERROR: "site policy max-rounds: ..."}
    assert stand_ins.stand_in(strategy, 4, lloyd, "a", other) is None
    assert stand_ins.stand_in(strategy, 4, lloyd, "b", GUARD_REFUSAL) is None
    assert stand_ins.stand_in(strategy, 4, TaskPlan("evaluate"), "a", GUARD_REFUSAL) is None
    strategy.repetition = 1
    assert stand_ins.stand_in(strategy, 4, lloyd, "a", GUARD_REFUSAL) is None


def test_a_secure_round_or_a_start_keeps_no_stand_in():
    strategy = _strategy()
    secure = TaskPlan("lloyd")
    secure.secure = (["sums"], [1.0])
    stand_ins.remember(strategy, 1, secure, _reply())
    stand_ins.remember(strategy, 1, TaskPlan("local_kmeans"), _reply())
    assert stand_ins.stand_in(strategy, 2, TaskPlan("lloyd"), "a", GUARD_REFUSAL) is None
    assert stand_ins.stand_in(strategy, 2, TaskPlan("local_kmeans"), "a", GUARD_REFUSAL) is None


def _skewed_iris():
    X, y = datasets.load_iris(return_X_y=True)
    X = (X - X.mean(axis=0)) / X.std(axis=0)
    return X, [X[idx] for idx in partition(y, 5, "dirichlet:0.3", seed=0)]


def _pooled_inertia(X, centroids):
    return float(((X[:, None, :] - centroids[None]) ** 2).sum(-1).min(1).sum())


def test_refusing_sites_stay_in_the_training_rounds_they_answered_before(monkeypatch):
    """DWF on label-skewed iris, every site refusing what its guard would alter. The guard
    refuses training rounds, some from the first one on (a global cluster within a row
    of a site's k-FED cluster): a site that has answered a training round before is
    answered for by that reply, so more sites count in the training rounds than when a
    refusal drops the site, and the centroids are as good as the snapping default's."""
    X, sites = _skewed_iris()
    run = dict(algorithm="dwf", n_clusters=3, min_cluster_size=2, seed=0,
               central_baseline=False)

    def training_rounds(result):
        return [row["sites-answered"] for row in result.history if row["task"] == "lloyd"]

    snapping = fedcluster.simulate(sites, **run)
    refusing = fedcluster.simulate(sites, site_config={"guard-refuse": True}, **run)
    notes = [n for failures in refusing.metrics["site-failures"].values() for n in failures]
    assert any("stands in" in n for n in notes)
    assert _pooled_inertia(X, refusing.centroids) <= 1.01 * _pooled_inertia(X, snapping.centroids)
    with monkeypatch.context() as patch:
        patch.setattr(stand_ins, "stand_in", lambda *args: None)
        dropping = fedcluster.simulate(sites, site_config={"guard-refuse": True}, **run)
    with_stand_ins, without = training_rounds(refusing), training_rounds(dropping)
    assert with_stand_ins[0] == without[0] < 5  # the first round has nothing to stand in
    assert sum(with_stand_ins[1:]) > sum(without[1:])
    # a site once in stays in: the count never falls
    assert all(later >= earlier for earlier, later in zip(with_stand_ins, with_stand_ins[1:]))

"""The stopping rules: ``tol`` on the centroid movement and ``score-tol`` on the training
score (aggregate.score_stalled; off by default)."""

from __future__ import annotations

import numpy as np
import pytest

import fedcluster
from fedcluster.common.datasets import load_builtin, partition
from fedcluster.strategies.aggregate import score_stalled


def test_score_stalled_needs_every_recent_round_under_the_tolerance():
    assert not score_stalled([10.0, 9.0, 8.999, 8.998], 0.0)  # off
    assert score_stalled([10.0, 9.0, 8.999, 8.998], 1e-3)  # the last two: ~1e-4 each
    assert not score_stalled([10.0, 9.0, 8.999], 1e-4)  # 1e-4 is not under 1e-4
    assert not score_stalled([10.0, 9.0, 8.999], 1e-3, patience=3)  # too few rounds
    assert not score_stalled([9.0, 8.999, 8.0], 1e-3)  # the last round still improved
    assert score_stalled([9.0, 9.5, 9.6], 1e-3)  # worse counts as no improvement
    assert not score_stalled([9.0, float("nan"), 9.0], 1e-3)  # unknown: no decision
    assert not score_stalled([0.0, 0.0, 0.0], 1e-3)  # no relative change of 0


@pytest.fixture(scope="module")
def sites():
    X, y = load_builtin("digits")
    return [X[rows] for rows in partition(y, 3, "dirichlet:0.5", seed=1)]


def test_a_run_stops_when_its_score_stops_improving(sites):
    config = dict(algorithm="dwf", n_clusters=10, num_rounds=40, tol=0.0, seed=3,
                  init="random", data_bounds="0:16")
    full = fedcluster.simulate(sites, **config)
    stopped = fedcluster.simulate(sites, score_tol=1e-3, **config)
    train = lambda model: [h for h in model.history if "movement" in h]  # noqa: E731
    assert len(train(full)) == 40  # tol 0: every round
    rounds = len(train(stopped))
    assert 3 <= rounds < 40
    scores = [h["score"] for h in train(stopped)]
    gains = [(a - b) / a for a, b in zip(scores, scores[1:])]
    assert all(g < 1e-3 for g in gains[-2:]) and not all(g < 1e-3 for g in gains[-3:-1])
    # the same trajectory, cut where the rule says: equal to a run of that many rounds
    short = fedcluster.simulate(sites, **{**config, "num_rounds": rounds})
    np.testing.assert_array_equal(stopped.centroids, short.centroids)
    assert stopped.metrics["score"] == short.metrics["score"]

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
    # with best_patience (GTV's): a score that cycles, no round beating the best before it
    assert not score_stalled([10.0, 9.0, 9.5, 9.2], 1e-3, best_patience=3)  # falling again
    cycle = [1.2249, 1.2285, 1.2211, 1.2260, 1.2233, 1.2262, 1.2232, 1.2258, 1.2230]
    assert score_stalled(cycle, 1e-6, best_patience=5)  # best 1.2211, never beaten
    assert not score_stalled(cycle, 1e-6)  # round on round it never stalls
    assert not any(score_stalled(cycle[:n], 1e-6, best_patience=5) for n in range(1, 8))
    assert not score_stalled(cycle + [1.2200], 1e-6, best_patience=5)  # a new best
    assert not score_stalled(cycle[:-1] + [float("nan")], 1e-6, best_patience=5)  # unknown
    assert score_stalled([float("nan")] + cycle, 1e-6, best_patience=5)  # earlier: skipped
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


@pytest.fixture(scope="module")
def outliers_sites():
    """bench/quality.py's ``outliers`` set (8 clusters, two of 8 rows, 10 far outliers),
    z-scored, over 5 sites IID (seed 0)."""
    rng = np.random.default_rng(21)
    centres, sizes = rng.normal(0, 5, (8, 6)), [500] * 6 + [8, 8]
    X = np.concatenate([rng.normal(c, 1.0, (s, 6)) for c, s in zip(centres, sizes)]
                       + [rng.normal(0, 30, (10, 6))])
    X = (X - X.mean(0)) / X.std(0)
    y = np.concatenate([np.repeat(np.arange(8), sizes), np.full(10, 7)])
    return [X[rows] for rows in partition(y, 5, "iid", seed=0)]


@pytest.fixture
def own_spreads(monkeypatch):
    """The dominance rules off (release/dominance.py): the groups holding the far outliers
    then keep their means and split by their own spread, the federation that made these
    runs cycle (with the rules on, their means and spreads are the site's and these runs
    settle sooner)."""
    from fedcluster.client_app.release import dominance

    monkeypatch.setattr(dominance, "dominated",
                        lambda peak, unit_m2, cells: np.zeros(np.shape(peak), dtype=bool))
    monkeypatch.setattr(dominance, "dominated_means",
                        lambda means, *_: np.zeros(np.shape(means), dtype=bool))


def test_gtv_on_split_groups_stops_when_its_score_cycles(outliers_sites, own_spreads):
    """bench/quality.py's ``outliers`` (8 clusters, two of 8 rows, 10 far outliers), 5
    sites, groups of 3 split by their own spread: GTV's local scores alternate better and
    worse rounds and never stall round on round; the run used every ``num-rounds``
    round. It stops when no round in five beats the best before them."""
    from fedcluster.strategies.gtv import GTVKMeans

    sites = outliers_sites
    config = dict(algorithm="gtv", n_clusters=8, seed=0, num_rounds=50,
                  site_config={"min-cluster-size": 3})

    def train(model):
        return [h for h in model.history if "gtv-per-edge" in h]

    stopped = train(fedcluster.simulate(sites, **config))
    assert len(stopped) < 50
    scores = [h["score"] for h in stopped]
    assert any(b > a for a, b in zip(scores, scores[1:]))  # it does cycle
    with pytest.MonkeyPatch.context() as patch:  # round on round only, as DWF
        patch.setattr(GTVKMeans, "score_best_patience", None)
        assert len(train(fedcluster.simulate(sites, **config))) == 50


def test_ewf_on_split_groups_stops_when_its_score_cycles_and_dwf_does_not_ask(outliers_sites,
                                                                             own_spreads):
    """The same ``outliers`` federation, EWF: its equal weights go round three scores
    until the cap; with the best-score rule it stops. DWF keeps the round-on-round rule
    alone (its score rises for a few rounds and falls on)."""
    from fedcluster.strategies.weighted import WeightedFedKMeans

    sites = outliers_sites
    config = dict(algorithm="ewf", n_clusters=8, seed=0, num_rounds=50, central_baseline=False,
                  site_config={"min-cluster-size": 3})

    def train(model):
        return [h for h in model.history if "movement" in h and "evaluated" not in h]

    stopped = train(fedcluster.simulate(sites, **config))
    assert len(stopped) < 50
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(WeightedFedKMeans, "score_best_patience", property(lambda self: None))
        assert len(train(fedcluster.simulate(sites, **config))) == 50
    assert WeightedFedKMeans.score_best_patience.fget(type("DWF", (), {"dynamic": True})()) is None

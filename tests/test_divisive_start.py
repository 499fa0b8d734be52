"""The sum-only divisive start (issue 21, ``strategies/divisive.py``): the split maths,
its rounds, and full runs where it is the default (secure aggregation, DP).

The quality figures over many data sets are in bench/quality.py; here a seeded
synthetic set checks the start against the plain k-FED-started run it stands in for.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import fedcluster
from fedcluster.common.config import RunConfig
from fedcluster.common.privacy import PrivacyLeakWarning
from fedcluster.simulation import record_tasks
from fedcluster.strategies import divisive
from fedcluster.strategies.divisive import BRANCH, DivisiveStart, split
from fedcluster.strategies.errors import FederationError
from fedcluster.strategies.reply import Reply
from fedcluster.common import protocol

K = 6


def blobs(seed: int = 3, n_sites: int = 4, rows: int = 900) -> tuple[list[np.ndarray], np.ndarray]:
    """Six unequal, well-separated groups in 5-d, shuffled over ``n_sites`` sites."""
    rng = np.random.default_rng(seed)
    centres = rng.uniform(-4, 4, (K, 5))
    sizes = rng.multinomial(rows * n_sites - 60 * K, np.full(K, 1 / K)) + 60
    X = np.concatenate([rng.normal(c, 0.45, (s, 5)) for c, s in zip(centres, sizes)])
    X = X[rng.permutation(len(X))]
    return np.array_split(X, n_sites), X


def sse(X: np.ndarray, C: np.ndarray) -> float:
    return float(((X[:, None, :] - C[None]) ** 2).sum(-1).min(1).sum())


# ------------------------------------------------------------------- the maths
def test_split_cuts_the_largest_clusters_into_children_equidistant_from_them():
    rng = np.random.default_rng(0)
    means = np.array([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]])
    counts = np.array([5.0, 50.0, 1.0])  # the last cannot split (one member)
    out = split(means, counts, target=2 + BRANCH, rng=rng)
    # room for one split into BRANCH children: the largest (count 50) splits
    assert out.shape == (2 + BRANCH, 2)
    np.testing.assert_array_equal(out[:2], means[[0, 2]])
    gaps = np.linalg.norm(out[2:] - means[1], axis=1)
    # every child at the same distance from its parent, so the cut between any two is a
    # hyperplane through the parent's mean; tiny against the nearest other mean (10)
    np.testing.assert_allclose(gaps, divisive.RADIUS * 10.0, rtol=1e-12)
    # enough room: every cluster with at least 2 members splits, none beyond the target
    assert split(means, counts, target=100, rng=rng).shape == (1 + 2 * BRANCH, 2)
    assert split(means, np.ones(3), target=100, rng=rng).shape == (3, 2)
    # the last split into fewer children when that reaches the target exactly
    assert split(means, counts, target=BRANCH + 3, rng=rng).shape == (BRANCH + 3, 2)
    assert split(means, counts, target=4, rng=rng).shape == (4, 2)  # one split into 2


def test_start_rounds_cover_the_growth_to_oversplit_times_k():
    # 1 -> 4 -> 16 -> 64 -> 80 clusters for k = 10: the mean's round, four growth rounds,
    # a spare
    assert divisive.start_rounds(10) == 1 + 4 + divisive.SPARE_ROUNDS
    assert divisive.start_rounds(2) == 1 + 2 + divisive.SPARE_ROUNDS  # 1 -> 4 -> 16
    for k in range(1, 60):
        fewest = 1 + int(np.ceil(np.log(divisive.OVERSPLIT * k) / np.log(BRANCH) - 1e-12))
        assert divisive.start_rounds(k) == fewest + divisive.SPARE_ROUNDS


def _replies(plan, sites):
    """The plain Lloyd replies (one local iteration) of ``sites`` to ``plan``."""
    C = plan.arrays.centroids
    out = []
    for i, X in enumerate(sites):
        labels = ((X[:, None] - C[None]) ** 2).sum(-1).argmin(1)
        counts = np.bincount(labels, minlength=len(C))
        means = C.copy()
        for j in np.flatnonzero(counts):
            means[j] = X[labels == j].mean(0)
        out.append(Reply(str(i), i, len(X), protocol.ClusterMeans(means, counts), {}))
    return out


def test_the_start_pools_sums_and_counts_grows_to_8k_and_merges_to_k():
    sites, X = blobs()
    start = DivisiveStart.new(K, 5, seed=0)
    sent = []
    while True:
        plan = start.plan()
        assert plan.task == "lloyd" and plan.params["local-iters"] == 1
        # planning is pure: a second plan of the same round sends the same centroids
        np.testing.assert_array_equal(start.plan().arrays.centroids, plan.arrays.centroids)
        sent.append(len(plan.arrays.centroids))
        result = start.reduce(_replies(plan, sites))
        if start.rounds == 1:  # one centroid: the pooled mean of every row
            np.testing.assert_allclose(start.means[0], X.mean(0), rtol=1e-12, atol=1e-12)
            assert start.counts[0] == len(X)
        if result is not None:
            break
    assert sent[0] == 1 and sent[1] == BRANCH
    assert len(start.means) >= divisive.OVERSPLIT * K and start.rounds <= divisive.start_rounds(K)
    assert start.counts.sum() == len(X)
    assert result.shape == (K, 5)
    # from these starts, central Lloyd reaches the central optimum of this set
    from sklearn.cluster import KMeans

    best = KMeans(K, n_init=10, random_state=0).fit(X).inertia_
    polished = KMeans(K, init=result, n_init=1).fit(X).inertia_
    assert polished <= best * (1 + 1e-9)


def test_too_few_grown_clusters_are_completed_in_the_box_or_are_an_error():
    """A small site under DP or the floor may leave fewer than k clusters: the start
    completes them uniformly in the (declared or clipping) box; without a box it stops
    with an error naming the start."""
    empty = Reply("0", 0, 5, protocol.ClusterMeans(np.zeros((1, 2)), np.zeros(1, np.int64)), {})
    start = DivisiveStart.new(3, 2, seed=0)
    with pytest.raises(FederationError, match="divisive start grew 0 distinct clusters") as err:
        start.reduce([empty])
    assert "secagg-data-bound" not in str(err.value)
    # a secure round's sum (one reply for 3 sites): the bound's quantisation is named too
    summed = Reply("secure", 0, 15, protocol.ClusterMeans(np.zeros((1, 2)), np.zeros(1, np.int64)),
                   {}, n_sites=3)
    with pytest.raises(FederationError, match="a secagg-data-bound far above the data's range"):
        DivisiveStart.new(3, 2, seed=0).reduce([summed])
    one = Reply("0", 0, 5, protocol.ClusterMeans(np.array([[0.5, 0.5]]), np.array([5])), {})
    start = DivisiveStart.new(3, 2, seed=0)
    box = (np.array([-1.0, -1.0]), np.array([1.0, 2.0]))
    for _ in range(divisive.start_rounds(3) - 1):  # nothing grows past the one cluster
        assert start.reduce([one]) is None
    C = start.reduce([one], box)
    assert C.shape == (3, 2) and C[0].tolist() == [0.5, 0.5]
    assert np.all((C[1:] >= box[0]) & (C[1:] <= box[1]))


# -------------------------------------------------------------- the run config
@pytest.mark.parametrize("extra", [{"secure_aggregation": True, "secagg_data_bound": 10.0},
                                   {"dp_epsilon": 1.0, "data_bounds": "-6:6"}])
def test_divisive_is_the_default_start_under_secure_aggregation_and_dp(extra):
    config = RunConfig(**{"n_clusters": 4, **extra})
    assert config.resolved_init == "divisive"
    assert RunConfig(n_clusters=4).resolved_init == "kfed"  # plain runs keep k-FED's round


# ------------------------------------------------------------------ full runs
def test_a_secure_run_starts_from_sums_only_as_well_as_the_plain_kfed_start():
    sites, X = blobs()
    plain = fedcluster.simulate(sites, n_clusters=K, seed=1)
    records: list[dict] = []
    with warnings.catch_warnings():
        warnings.simplefilter("error", PrivacyLeakWarning)  # no minima or maxima sent
        secure = fedcluster.simulate(sites, n_clusters=K, seed=1, secure_aggregation=True,
                                     secagg_data_bound=10.0, record_replies=records)
    tasks = [h["task"] for h in secure.history]
    start = divisive.start_rounds(K)
    # describe, then the start's Lloyd rounds (each a SecAgg+ sum), then training
    assert tasks[0] == "describe" and "bounds" not in tasks
    assert {t for rec in records for t in record_tasks(rec)} <= {"describe", "lloyd", "evaluate",
                                                                   "evaluate_distances",
                                                                   "profile", ""}
    assert not secure.metrics["site-failures"]
    assert len([t for t in tasks if t == "lloyd"]) <= start + 50
    assert sse(X, secure.centroids) <= 1.02 * sse(X, plain.centroids)


def test_a_dp_run_plans_its_budget_over_the_start_rounds_too():
    sites, X = blobs(rows=3000)
    config = dict(n_clusters=K, seed=2, dp_epsilon=10.0, data_bounds="-6:6", num_rounds=8)
    result = fedcluster.simulate(sites, **config)
    planned = result.metrics["dp-rounds-planned"]
    assert planned == divisive.start_rounds(K) + 8 + 1
    assert result.metrics["dp-rounds"] <= planned
    assert result.metrics["dp-epsilon-spent"] <= 10.0 + 1e-9
    plain = fedcluster.simulate(sites, n_clusters=K, seed=2)
    assert sse(X, result.centroids) <= 1.05 * sse(X, plain.centroids)


def test_a_run_stopped_inside_the_start_resumes_to_the_same_result(tmp_path, monkeypatch):
    """The start's state (grown clusters, rounds, the directions' generator) is in the
    checkpoint: stopped after round 3 (describe and two of the start's rounds), resumed,
    the run ends exactly where the uninterrupted one does."""
    from fedcluster import simulation
    from test_checkpoint import ServerKilled, crashing_grid

    sites, _ = blobs()
    config = dict(n_clusters=K, seed=1, init="divisive", n_init=2, num_rounds=6, tol=0.0,
                  output_dir=str(tmp_path))
    whole = fedcluster.simulate(sites, run_name="whole", **config)
    monkeypatch.setattr(simulation, "InProcessGrid", crashing_grid(3))
    with pytest.raises(ServerKilled):
        fedcluster.simulate(sites, run_name="stopped", **config)
    monkeypatch.undo()
    resumed = fedcluster.simulate(sites, run_name="resumed",
                                  resume_from=str(tmp_path / "stopped"), **config)
    np.testing.assert_array_equal(resumed.centroids, whole.centroids)
    assert [h["task"] for h in resumed.history][4:] == [h["task"] for h in whole.history][3:]

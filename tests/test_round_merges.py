"""Fewer rounds, same results: the evaluation round's own distances stand for
Davies-Bouldin's second pass when the pooled means are the centroids (a converged run),
and the metrics equal those of the old separate second pass."""

from __future__ import annotations

import math

import numpy as np
import pytest

import fedcluster
from fedcluster.common.datasets import load_builtin, partition
from fedcluster.strategies import metrics
from fedcluster.strategies.base import ClusteringStrategy


def simulate(*args, **config):
    """``fedcluster.simulate`` without Table 1's profile rounds: these runs end with the
    rounds compared here (the profile round has its own tests: tests/test_table1.py)."""
    return fedcluster.simulate(*args, **{"profile": False, **config})


@pytest.fixture(scope="module")
def sites():
    X, y = load_builtin("digits")
    return [X[rows] for rows in partition(y, 3, "dirichlet:0.5", seed=1)]


def _both(monkeypatch, sites, **config):
    """The same run with the evaluation's distances folded in (today) and with the old
    separate second pass."""
    folded = simulate(sites, **config)
    monkeypatch.setattr(ClusteringStrategy, "fold_distances", False)
    separate = simulate(sites, **config)
    monkeypatch.undo()
    return folded, separate


def _assert_same_metrics(folded, separate, db_rtol: float) -> None:
    assert set(folded.metrics) == set(separate.metrics)
    for key, value in separate.metrics.items():
        if key == "davies-bouldin":
            assert folded.metrics[key] == pytest.approx(value, rel=db_rtol, abs=0)
        elif key == "rounds" or not isinstance(value, float):
            assert folded.metrics[key] == value, key
        else:
            assert folded.metrics[key] == value or (math.isnan(value) and math.isnan(folded.metrics[key])), key
    np.testing.assert_array_equal(folded.centroids, separate.centroids)


# (the shortcuts below apply to the evaluation of the groups as training counts them:
# the report's groups, the default, are asked in an evaluation round of their own, whose
# pooled means are not the centroids; tests/test_strategy.py shows those rounds)
WHOLE = {"report_groups": False}


@pytest.mark.parametrize("config", [
    {},  # DWF at its defaults (k-FED start, tol 1e-4)
    {"n_init": 2},  # the best of two repetitions
], ids=["defaults", "n-init"])
def test_a_converged_run_spares_the_second_pass_with_the_same_metrics(monkeypatch, sites, config):
    folded, separate = _both(monkeypatch, sites, n_clusters=10, num_rounds=60, seed=0, **WHOLE,
                             **config)
    tasks = [h["task"] for h in folded.history]
    old_tasks = [h["task"] for h in separate.history]
    # the run converged: its last training round moved nothing
    assert [h for h in folded.history if "movement" in h][-1]["movement"] == 0.0
    assert old_tasks[-1] == "evaluate_distances" and "evaluate_distances" not in tasks
    assert tasks == old_tasks[:-1]
    # S_k to the centroid and to the pooled mean differ by at most their distance, which
    # means_are_centroids bounds by 1e-12 of the data's scale: the index agrees far closer
    # than that to the second pass's
    _assert_same_metrics(folded, separate, db_rtol=1e-9)
    assert np.isfinite(folded.metrics["davies-bouldin"])


def test_a_run_stopped_before_convergence_still_runs_the_second_pass(monkeypatch, sites):
    """One training round from the k-FED start: the evaluation's clusters are not those
    the centroids are the means of, so Davies-Bouldin needs the pooled means' distances."""
    folded, separate = _both(monkeypatch, sites, n_clusters=10, num_rounds=1, tol=0.0, seed=3)
    assert [h["task"] for h in folded.history] == [h["task"] for h in separate.history]
    assert folded.history[-1]["task"] == "evaluate_distances"
    _assert_same_metrics(folded, separate, db_rtol=0.0)


def test_under_secure_aggregation_the_quantised_means_keep_the_second_pass(sites):
    """SecAgg+ sums quantised terms: the pooled means of the evaluation differ from the
    centroids by the quantisation error (~1e-5 here), far above means_are_centroids'
    bound, so the second pass runs as before (the evaluation's distances travel in the
    secure sum, unused)."""
    result = simulate(sites, n_clusters=10, num_rounds=60, seed=3,
                                 secure_aggregation=True, secagg_data_bound=16.0,
                                 data_bounds="0:16")
    assert [h["task"] for h in result.history][-2:] == ["evaluate", "evaluate_distances"]
    assert np.isfinite(result.metrics["davies-bouldin"])


def test_a_dp_run_sends_no_davies_bouldin_round():
    """Under DP the sites answer the distances round with zeros (Davies-Bouldin is not
    released): the run no longer asks for it, and still reports no Davies-Bouldin."""
    rng = np.random.default_rng(4)
    data = [np.clip(rng.normal(size=(120, 3)) + 4 * (i % 2), -8, 8) for i in range(3)]
    result = simulate(data, n_clusters=2, dp_epsilon=2.0, data_bounds="-8:8",
                                 num_rounds=3, min_sites=3)
    assert result.history[-1]["task"] == "evaluate"
    assert "evaluate_distances" not in {h["task"] for h in result.history}
    assert "davies-bouldin" not in result.metrics and result.metrics["dp-mode"] == "local"


def test_means_are_centroids_within_the_bound_only():
    stats = metrics.PooledStats(n_rows=6, sse=1.0, silhouette_sum=0.0,
                                counts=np.array([2, 4, 0]),
                                sums=np.array([[2.0, 4.0], [-4.0, 8.0], [0.0, 0.0]]),
                                sqnorms=np.zeros(3), contingency={})
    C = np.array([[1.0, 2.0], [-1.0, 2.0], [7.0, 7.0]])  # an empty cluster's row: any
    assert metrics.means_are_centroids(stats, C)
    C[1, 0] += 1e-13  # well within 1e-12 x max(1, max |C|) = 7e-12
    assert metrics.means_are_centroids(stats, C)
    C[1, 0] += 1e-10
    assert not metrics.means_are_centroids(stats, C)


# --------------------------------------------- the first task, carried by describe


@pytest.mark.parametrize("config", [
    {},  # DWF's k-FED start
    {"algorithm": "fkm", "init": "kmeans++"},  # FKM's seeded clusters (the paper's)
    {"algorithm": "kfed"},  # k-FED one-shot
    {"scale": "standard"},  # the statistics round
    {"init": "random"},  # the bounding box
], ids=["dwf", "fkm", "kfed", "scale", "random"])
def test_describe_carries_the_first_task_with_the_same_result(monkeypatch, sites, config):
    carried = simulate(sites, n_clusters=10, num_rounds=8, seed=0, **config)
    monkeypatch.setattr(ClusteringStrategy, "carries_first_task", False)
    separate = simulate(sites, n_clusters=10, num_rounds=8, seed=0, **config)
    first, *rest = [h["task"] for h in carried.history]
    old_first, old_second, *old_rest = [h["task"] for h in separate.history]
    assert old_first == "describe" and first == f"describe+{old_second}"
    assert rest == old_rest  # one round fewer, the same rounds after it
    np.testing.assert_array_equal(carried.centroids, separate.centroids)
    assert carried.metrics["score"] == separate.metrics["score"]


def test_a_site_refusing_the_carried_task_alone_is_admitted_without_its_reply(sites, monkeypatch):
    """Site 2 refuses the carried bounds task (here: its bounds task fails): it is
    admitted all the same (its describe stands) and trains with the others, as it did
    when bounds was a round of its own."""
    from fedcluster.simulation import run_in_process, site_nodes
    from site_rows import refuse_at

    refuse_at(monkeypatch, "bounds", "site 2", "no bounds here")
    with site_nodes(sites) as nodes:
        result = run_in_process(nodes, {"algorithm": "dwf", "n-clusters": 10, "init": "random",
                                        "num-rounds": 3, "min-sites": 2, "output-dir": ""})
    assert result.history[0]["task"] == "describe+bounds"
    assert result.metrics["rejected-sites"] == {} and result.metrics["n-sites"] == 3
    (failure,) = result.metrics["site-failures"]["2"]
    assert failure.startswith("round 1 (bounds): reply dropped: the site refused: no bounds here")
    assert result.history[1]["task"] == "lloyd" and result.history[1]["sites-answered"] == 3


def test_a_site_draws_the_seed_the_server_would_give_it():
    from fedcluster.common import protocol

    seeds = {key: protocol.site_seed([7, 2], key) for key in ("0", "1", "hospital-a")}
    assert len(set(seeds.values())) == 3  # one per site
    assert seeds == {key: protocol.site_seed((7, 2), key) for key in seeds}  # reproducible
    assert protocol.site_seed([8, 2], "0") != seeds["0"]  # another repetition, another seed


# ------------------------------------ the evaluation, carried by a converged training round


# EWF on rows: at p_site 2 one site's cluster of 3 rows is one group, which EWF's
# min-groups leaves out; a site that leaves a cluster out sends the centroid it received,
# which EWF averages in alike, so the run converges geometrically, never to a round that
# moves nothing (and then an evaluation round follows, as the next test shows).
@pytest.mark.parametrize("config", [{}, {"algorithm": "ewf", "site_config": {"min-cluster-size": 1}},
                                    {"n_init": 2}, {"site_labels": True}],
                         ids=["dwf", "ewf", "n-init", "labels"])
def test_a_converged_run_needs_no_evaluation_round_and_reports_the_same(monkeypatch, sites,
                                                                         config):
    from fedcluster.common.datasets import load_builtin as load
    from fedcluster.strategies.weighted import WeightedFedKMeans

    config = dict(config)
    if config.pop("site_labels", False):  # the contingency table rides along too
        _, y = load("digits")
        config["labels"] = [y[rows] for rows in partition(y, 3, "dirichlet:0.5", seed=1)]
    carried = simulate(sites, n_clusters=10, num_rounds=60, seed=0, **WHOLE, **config)
    monkeypatch.setattr(WeightedFedKMeans, "evaluates_with_training", False)
    separate = simulate(sites, n_clusters=10, num_rounds=60, seed=0, **WHOLE, **config)
    tasks, old_tasks = ([h["task"] for h in r.history] for r in (carried, separate))
    assert "evaluate" not in tasks and old_tasks.count("evaluate") == config.get("n_init", 1)
    assert tasks == [task for task in old_tasks if task != "evaluate"]
    assert any(h.get("evaluated") for h in carried.history)
    assert carried.metrics == separate.metrics  # every metric, exactly
    np.testing.assert_array_equal(carried.centroids, separate.centroids)


def test_an_unconverged_or_partial_round_still_sends_the_evaluation_round(sites):
    """The last round moved (num-rounds reached), or a fraction of the sites trained:
    the evaluation round runs as before."""
    moved = simulate(sites, n_clusters=10, num_rounds=2, tol=0.0, seed=0)
    assert moved.history[-2]["task"] == "evaluate" or moved.history[-1]["task"] == "evaluate"
    sampled = simulate(sites, n_clusters=10, num_rounds=60, seed=0, fraction=0.5)
    assert "evaluate" in [h["task"] for h in sampled.history]

"""Strategy-level behaviour through the in-process harness: sampling, n-init, history,
convergence, privacy floor end to end."""

import numpy as np
import pytest

import fedcluster


@pytest.fixture(scope="module")
def sites():
    rng = np.random.default_rng(5)
    centres = np.array([[0, 0], [5, 5], [0, 5], [5, 0]], dtype=float)
    return [rng.normal(centres[i % 4], 0.5, size=(80 + 10 * i, 2)) for i in range(8)]


def test_fraction_samples_seeded_subset(sites):
    a = fedcluster.simulate(sites, n_clusters=4, fraction=0.25, num_rounds=6, tol=0.0, seed=4)
    b = fedcluster.simulate(sites, n_clusters=4, fraction=0.25, num_rounds=6, tol=0.0, seed=4)
    train = [r for r in a.history if r["task"] == "lloyd"]
    assert len(train) == 6
    assert all(r["sites-asked"] == 2 for r in train)  # round(0.25 * 8)
    np.testing.assert_array_equal(a.centroids, b.centroids)
    c = fedcluster.simulate(sites, n_clusters=4, fraction=0.25, num_rounds=6, tol=0.0, seed=5)
    assert not np.array_equal(a.centroids, c.centroids)


@pytest.mark.parametrize("algorithm", ["ewf", "minibatch", "fkm", "ffcm", "gtv"])
def test_every_sampling_algorithm_trains_on_a_sample_smaller_than_min_sites(sites, algorithm):
    """fraction C draws 1 of 8 sites per training round, under min-sites = 2: the round
    reduces that one site's reply (as DWF's does) instead of stopping the run; the
    evaluation still asks every site."""
    r = fedcluster.simulate(sites, n_clusters=4, algorithm=algorithm, fraction=0.125,
                            num_rounds=4, seed=4)
    task = {"ewf": "lloyd", "minibatch": "minibatch", "fkm": "prune_lloyd", "ffcm": "fcm",
            "gtv": "gtv"}[algorithm]  # (GTV's later refining rounds ask every site)
    training = [row for row in r.history if row["task"] == task and "movement" in row]
    assert training and all(row["sites-asked"] == 1 == row["sites-answered"] for row in training)
    assert r.metrics["n-sites"] == 8 and np.isfinite(r.metrics["score"])


def test_stops_on_convergence_and_records_history(sites):
    # the k-FED start is carried by the describe round (one round for both) ...
    assert fedcluster.simulate(sites, n_clusters=4).history[0]["task"] == "describe+local_kmeans"
    # ... and lands at the optimum here: a random start takes rounds to converge
    r = fedcluster.simulate(sites, n_clusters=4, num_rounds=40, tol=1e-9, init="random",
                            data_bounds="-2:7", seed=2, report_groups=False)
    train = [h for h in r.history if h["task"] == "lloyd"]
    assert 2 < len(train) < 40 and train[-1]["movement"] < 1e-9
    # converged: the last round moved nothing, so it carried the evaluation, and the
    # pooled means are the centroids, so its distances give Davies-Bouldin (no more rounds)
    # (then Table 1's two rounds: the histograms' range, the profile)
    assert [h["task"] for h in r.history[-2:]] == ["value_range", "profile"]
    assert r.history[-3]["task"] == "lloyd" and r.history[-3]["evaluated"]
    assert np.isfinite(r.metrics["davies-bouldin"])
    assert r.metrics["rounds"] == len(train)
    # with the report's groups (the default) the model's evaluation is a round of its own,
    # asked over the groups re-cut within its clusters
    reported = fedcluster.simulate(sites, n_clusters=4, num_rounds=40, tol=1e-9, init="random",
                                   data_bounds="-2:7", seed=2)
    tasks = [h["task"] for h in reported.history]
    assert tasks[:len(train) + 1] == [h["task"] for h in r.history][:len(train) + 1]
    assert tasks[len(train) + 1] == "evaluate" and tasks[-2:] == ["value_range", "profile"]
    np.testing.assert_array_equal(reported.centroids, r.centroids)




def test_n_init_keeps_lowest_score(sites):
    # the repetitions are chosen by their scores over the groups as training counts them
    plain = dict(n_clusters=6, init="random", num_rounds=3, report_groups=False)
    runs = [fedcluster.simulate(sites, **plain, seed=s) for s in (10, 11, 12)]
    best = fedcluster.simulate(sites, **plain, seed=10, n_init=3)
    assert best.metrics["score"] == pytest.approx(min(r.metrics["score"] for r in runs), rel=1e-12)
    # with the report's groups (the default), one more evaluation round: the chosen
    # repetition's centroids over the report's groups, the figures of a one-repetition run
    # of its seed (whose evaluation is asked so)
    chosen = (10, 11, 12)[int(np.argmin([r.metrics["score"] for r in runs]))]
    reported = fedcluster.simulate(sites, **{**plain, "report_groups": True}, seed=10, n_init=3)
    alone = fedcluster.simulate(sites, **{**plain, "report_groups": True}, seed=chosen)
    np.testing.assert_array_equal(reported.centroids, alone.centroids)
    assert reported.metrics["score"] == alone.metrics["score"]
    assert reported.metrics["cluster-sizes"] == alone.metrics["cluster-sizes"]
    assert [h["task"] for h in reported.history].count("evaluate") == 4


def test_no_reported_cluster_under_floor_end_to_end(sites):
    r = fedcluster.simulate(sites, n_clusters=12, min_cluster_size=15, init="random", num_rounds=4)
    sizes = np.array(r.metrics["cluster-sizes"])
    # sizes are sums of per-site counts, each 0 or >= 15
    assert np.all((sizes == 0) | (sizes >= 15))


def test_init_centroids_shape_checked(sites):
    with pytest.raises(Exception, match="initial centroids have shape"):
        fedcluster.simulate(sites, n_clusters=4, init_centroids=np.zeros((3, 2)))
    # a NaN start is named at the server, not left for every site to refuse
    start = np.zeros((4, 2))
    start[1, 0] = np.nan
    with pytest.raises(Exception, match=r"expected \(4, 2\) and all finite"):
        fedcluster.simulate(sites, n_clusters=4, init_centroids=start)


def test_a_negative_seed_is_a_config_error_naming_it(sites):
    from fedcluster.common.config import ConfigError

    with pytest.raises(ConfigError, match="run-config key 'seed'"):
        fedcluster.simulate(sites, n_clusters=4, seed=-1)


def test_eval_every_adds_exact_evaluations(sites):
    r = fedcluster.simulate(sites, n_clusters=4, num_rounds=6, tol=0.0, eval_every=2,
                            report_groups=False)
    tasks = [h["task"] for h in r.history]
    # after rounds 2 and 4; the final one rode on round 6, which moved nothing
    assert tasks.count("evaluate") == 2 and r.history[-3].get("evaluated")
    interim = [i for i, t in enumerate(tasks) if t == "evaluate"]
    # an interim evaluation scores the centroids the next training round receives, over all
    # sites: with every site sampled the two agree
    for i in interim:
        assert r.history[i]["score"] == pytest.approx(r.history[i + 1]["score"], rel=1e-12)
    assert r.metrics["rounds"] == 6

"""Choosing k: one federated run over a k range, exact per-k figures, and the criteria."""

import json
from pathlib import Path

import numpy as np
import pytest
from sklearn import metrics as skm

import fedcluster
from fedcluster.cli import main
from fedcluster.common.config import ConfigError, parse_run_config
from fedcluster.server_app.criteria import best_k, cluster_sse, kneedle, split_largest_cluster
from fedcluster.strategies.metrics import pool
from reference import simplified_silhouette

SIPU = Path(__file__).resolve().parent / "data" / "sipu"  # a copy of ../shared/data/sipu/s1.*


def test_choose_k_finds_15_on_s1_and_its_figures_are_the_pooled_ones():
    """SIPU s1: 5000 points, 15 Gaussian clusters, split over 5 sites. Every per-k figure
    equals scikit-learn / numpy on the pooled data for the same centroids."""
    X = np.loadtxt(SIPU / "s1.data.gz")
    y = np.loadtxt(SIPU / "s1.labels0.gz").astype(np.int64)
    parts = np.array_split(np.random.default_rng(0).permutation(len(X)), 5)
    sites, labels = [X[p] for p in parts], [y[p] for p in parts]
    # privacy floor 1, sites answering from their rows: every cluster and contingency cell
    # is disclosed, so all is exact (from groups, the figures are their partition's:
    # test_metrics.py)
    result = fedcluster.choose_k(sites, labels=labels, k_range=(2, 20), min_sites=5, min_cluster_size=1,
                                 site_config={"min-cluster-size": 1})
    assert sorted(result["per-k"]) == list(range(2, 21))
    # Silhouette, Davies-Bouldin and Calinski-Harabasz all find the 15 clusters (the
    # issue asks for one criterion); the elbow of the inertia curve lies earlier.
    assert result["simplified-silhouette"] == 15
    assert result["davies-bouldin"] == 15
    assert result["calinski-harabasz"] == 15
    assert result["per-k"][15]["ari"] > 0.95
    pooled, truth = np.vstack(sites), np.concatenate(labels)
    for k, figures in result["per-k"].items():
        model = result["models"][k]
        assert model.n_clusters == k
        found = model.predict(pooled)
        inertia = ((pooled - model.centroids[found]) ** 2).sum()
        assert figures["inertia"] == pytest.approx(inertia, rel=1e-9), k
        assert figures["simplified-silhouette"] == pytest.approx(
            simplified_silhouette(pooled, model.centroids), rel=1e-9), k
        assert figures["davies-bouldin"] == pytest.approx(skm.davies_bouldin_score(pooled, found), rel=1e-9), k
        assert figures["calinski-harabasz"] == pytest.approx(
            skm.calinski_harabasz_score(pooled, found), rel=1e-9), k
        assert figures["ari"] == pytest.approx(skm.adjusted_rand_score(truth, found), rel=1e-9), k
    # and the criteria are those of these figures
    assert {name: result[name] for name in best_k(result["per-k"])} == best_k(result["per-k"])


def blobs(rng, centres, n=60, spread=0.4):
    return np.vstack([rng.normal(c, spread, (n, len(c))) for c in centres])


def test_describe_and_stats_run_once_and_later_k_start_warm_or_cold():
    rng = np.random.default_rng(0)
    X = blobs(rng, [(0, 0), (6, 0), (0, 6), (6, 6)]) * [1.0, 50.0]
    sites = [X[::2], X[1::2]]
    for warm in (True, False):
        result = fedcluster.choose_k(sites, k_range="2:5", scale="standard", k_warm_start=warm)
        tasks = {k: [row["task"] for row in m.history] for k, m in result["models"].items()}
        assert tasks[2][0] == "describe+stats" and "local_kmeans" in tasks[2]
        for k in (3, 4, 5):
            assert not any(task.startswith(("describe", "stats")) for task in tasks[k])
            # warm: straight to training from k-1's split centroids; cold: a k-FED init
            assert ("local_kmeans" in tasks[k]) is not warm
            assert result["models"][k].scaling.encode() == result["models"][2].scaling.encode()
        # round numbers run on through the k's: one run
        rounds = [row["round"] for k in sorted(tasks) for row in result["models"][k].history]
        assert rounds == list(range(1, len(rounds) + 1))
        assert result["calinski-harabasz"] == 4 and result["simplified-silhouette"] == 4


@pytest.mark.parametrize("algorithm", ["dwf", "ewf", "minibatch", "fkm", "kfed", "ffcm", "gtv"])
def test_choose_k_runs_every_algorithm(algorithm):
    """Every algorithm goes through a k range in one run (GTV's later k keep the first k's
    graph of sites: it has no describe round of its own), and finds the four blobs."""
    rng = np.random.default_rng(1)
    X = blobs(rng, [(0, 0), (6, 0), (0, 6), (6, 6)])
    sites = [X[i::3] for i in range(3)]
    result = fedcluster.choose_k(sites, algorithm=algorithm, k_range="2:5", seed=0,
                                 central_baseline=False)
    assert {k: m.n_clusters for k, m in result["models"].items()} == {k: k for k in range(2, 6)}
    assert result["simplified-silhouette"] == 4


def test_kneedle_finds_the_knee_of_a_normalised_curve():
    ks = list(range(1, 11))
    # normalised: y = (v - 4) / 96, x = (k - 1) / 9, chord 1 - x; the gaps below it are
    # 0.410 (k = 2), 0.611 (k = 3), 0.604 (k = 4), ...
    assert kneedle(ks, [100, 50, 20, 10, 9, 8, 7, 6, 5, 4]) == 3
    # scale-free: multiplying the inertia or shifting k does not move the knee
    assert kneedle([k + 5 for k in ks], [1e9 * v for v in [100, 50, 20, 10, 9, 8, 7, 6, 5, 4]]) == 8
    assert kneedle(ks, [100, 90, 80, 70, 60, 10, 9, 8, 7, 6]) == 6
    assert kneedle([2, 3], [5.0, 1.0]) is None and kneedle([2, 3, 4], [1.0, 1.0, 1.0]) is None


def test_best_k_per_criterion_skips_nan_and_takes_the_smallest_k_on_ties():
    per_k = {
        2: {"inertia": 100.0, "simplified-silhouette": 0.5, "davies-bouldin": 0.9, "calinski-harabasz": 10.0},
        3: {"inertia": 30.0, "simplified-silhouette": 0.7, "davies-bouldin": 0.4, "calinski-harabasz": float("nan")},
        4: {"inertia": 25.0, "simplified-silhouette": 0.7, "davies-bouldin": 0.6, "calinski-harabasz": 8.0},
    }
    assert best_k(per_k) == {"elbow": 3, "simplified-silhouette": 3, "davies-bouldin": 3,
                             "calinski-harabasz": 2}


def test_the_warm_start_splits_the_cluster_with_the_largest_sse():
    rng = np.random.default_rng(1)
    X = np.vstack([rng.normal((0, 0), 0.1, (50, 2)), rng.normal((10, 0), 3.0, (50, 2))])
    C = np.array([[0.0, 0.0], [10.0, 0.0]])
    labels = np.argmin(((X[:, None] - C[None]) ** 2).sum(-1), axis=1)
    stats = pool([{
        "n_rows": len(X), "sse": 0.0, "silhouette_sum": 0.0,
        "counts": np.bincount(labels, minlength=2),
        "sums": np.array([X[labels == j].sum(0) for j in range(2)]),
        "sqnorms": np.array([(X[labels == j] ** 2).sum() for j in range(2)]),
    }])
    sse = cluster_sse(C, stats)
    np.testing.assert_allclose(sse, [((X[labels == j] - C[j]) ** 2).sum() for j in range(2)], rtol=1e-10)
    start = split_largest_cluster(C, stats, seed=3)
    assert start.shape == (3, 2)
    np.testing.assert_array_equal(start[0], C[0])  # the tight cluster keeps its place
    np.testing.assert_allclose((start[1] + start[2]) / 2, C[1], atol=1e-12)  # split about c
    radius = np.sqrt(sse[1] / stats.counts[1])
    assert np.linalg.norm(start[2] - start[1]) == pytest.approx(radius, rel=1e-12)


@pytest.mark.parametrize("value, message", [
    ("5:2", "needs HI >= LO + 2"),
    ("1:4", "starts below 2"),
    ("2:3", "at least 3 values of k"),
    ("two:five", "not of the form 'LO:HI'"),
    ("7", "not of the form 'LO:HI'"),
])
def test_a_bad_k_range_is_rejected_naming_the_key(value, message):
    with pytest.raises(ConfigError) as info:
        parse_run_config({"k-range": value})
    assert "'k-range'" in str(info.value) and message in str(info.value)
    with pytest.raises(ConfigError, match="'scale'"):
        parse_run_config({"scale": "zscore"})


def test_a_plain_simulation_refuses_a_k_range():
    with pytest.raises(ValueError, match="use fedcluster.choose_k"):
        fedcluster.simulate([np.zeros((5, 2)), np.ones((5, 2))], k_range="2:4")


def test_choose_k_command_writes_its_outputs(tmp_path, capsys):
    """From hospital-style CSVs: an id column, a text column left out by `columns`."""
    rng = np.random.default_rng(2)
    X = blobs(rng, [(0, 0), (5, 5), (0, 9)], n=40)
    paths = []
    for i, rows in enumerate((X[::2], X[1::2])):
        path = tmp_path / f"ward{i}.csv"
        lines = ["patient,ward,bmi,age"] + [f"P{i}-{r},east,{a:.17g},{b:.17g}" for r, (a, b) in enumerate(rows)]
        path.write_text("\n".join(lines) + "\n")
        paths.append(str(path))
    code = main(["choose-k", "--data", *paths, "--id-column", "patient", "--columns", "bmi,age",
                 "--k-range", "2:6", "--output-dir", str(tmp_path / "out"), "--run-name", "ck",
                 "--min-cluster-size", "1"])
    assert code == 0
    printed = capsys.readouterr().out
    assert "best k: elbow" in printed and "calinski-harabasz 3" in printed
    out = tmp_path / "out" / "ck"
    saved = json.loads((out / "choose-k.json").read_text())
    assert saved["best"]["calinski-harabasz"] == 3 and list(saved["per-k"]) == ["2", "3", "4", "5", "6"]
    assert (out / "choose-k.png").stat().st_size > 10_000
    model = fedcluster.Model.load(out / "model-k3.json")
    assert model.feature_names == ["bmi", "age"] and model.n_clusters == 3
    assert main(["choose-k", "--data", *paths, "--columns", "bmi,age"]) == 2
    assert "choose-k needs --k-range" in capsys.readouterr().err

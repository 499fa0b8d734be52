"""Federated scaling: one statistics round gives exactly scikit-learn's scaler on the pooled
data, every later task clusters the scaled rows, and the model applies the transform."""

import json

import numpy as np
import pytest
from sklearn.cluster import KMeans
from sklearn.datasets import load_wine
from sklearn.preprocessing import MinMaxScaler, StandardScaler

import fedcluster
from fedcluster.common import scaling
from fedcluster.client_app.data.site_data import SiteData
from fedcluster.common.model import Model
from fedcluster.common.privacy import PrivacyLeakWarning
from fedcluster.simulation import record_tasks
from fedcluster.client_app.task_io import TaskError
from site_rows import run_on_rows
from fedcluster.strategies.validation import Expect, ReplyError, validate


def uneven_sites(X, rng):
    """A one-row site, a small one and two large ones (uneven sizes stress the pooling)."""
    order = rng.permutation(len(X))
    return [X[part] for part in np.split(order, [1, 8, len(X) // 2])]


def scaled_run(sites, scale, **config):
    # (the one-row and 7-row sites take part only with their min-site-rows lowered, and
    # the one-row site only answering from its rows: the statistics are then those of
    # the pooled rows, minima and maxima included)
    return fedcluster.simulate(sites, n_clusters=2, num_rounds=2, min_sites=1, min_cluster_size=1,
                               init="random", scale=scale,
                               site_config={"min-site-rows": 1, "min-cluster-size": 1},
                               **config)


@pytest.mark.parametrize("offset", [0.0, 1e6])
def test_standard_scaling_from_the_sites_groups_is_the_pooled_rows_scaler(offset):
    """From the sites' groups (their defaults) the statistics round is exact too: each
    group's sum and squared deviations give the pooled mean and variance of the rows."""
    rng = np.random.default_rng(1)
    X = rng.normal(size=(900, 4)) * [1e-3, 1.0, 1e4, 0.0] + [5e-3, -3.0, 2e4, 7.25] + offset
    sites = np.split(X, [300, 450])
    result = fedcluster.simulate(sites, n_clusters=2, num_rounds=2, scale="standard")
    reference = StandardScaler().fit(X)
    np.testing.assert_allclose(result.model.scaling.shift, reference.mean_, rtol=1e-12, atol=0)
    # (1e-8: a group's sum of rows 1e6 from 0 keeps its mean to ~1e-10, which the pooled
    # variance of the feature of spread 1e-3 sees; rows give 1e-12, the test above)
    np.testing.assert_allclose(result.model.scaling.factor, reference.scale_,
                               rtol=1e-10 if offset == 0 else 1e-8, atol=0)


@pytest.mark.parametrize("offset", [0.0, 1e6])
def test_standard_scaling_equals_standard_scaler_on_pooled_data(offset):
    """Features on scales from 1e-3 to 1e4, a constant one, and (second case) an offset of
    1e6 where sum x^2 - (sum x)^2 / n would lose every digit of the small feature."""
    rng = np.random.default_rng(1)
    X = rng.normal(size=(901, 4)) * [1e-3, 1.0, 1e4, 0.0] + [5e-3, -3.0, 2e4, 7.25] + offset
    sites = uneven_sites(X, rng)
    result = scaled_run(sites, "standard")
    pooled = np.vstack(sites)
    reference = StandardScaler().fit(pooled)
    transform = result.model.scaling
    assert transform.kind == "standard"
    np.testing.assert_allclose(transform.shift, reference.mean_, rtol=1e-12, atol=0)
    np.testing.assert_allclose(transform.factor, reference.scale_, rtol=1e-12, atol=0)
    assert transform.factor[3] == 1.0  # zero variance: factor 1, as StandardScaler
    if offset == 0.0:  # the transformed rows themselves (with an offset of 1e6 the mean
        # is only defined to 1e-10, which the feature of spread 1e-3 magnifies)
        np.testing.assert_allclose(transform.apply(pooled), reference.transform(pooled),
                                   rtol=0, atol=1e-12)


def test_minmax_scaling_equals_minmax_scaler_on_pooled_data():
    rng = np.random.default_rng(2)
    X = rng.uniform(-1, 1, size=(500, 3)) * [1e-2, 10.0, 0.0] + [0.0, 1e5, 3.0]
    sites = uneven_sites(X, rng)
    # sites answering from their rows send single values as minima and maxima: the run says so
    with pytest.warns(PrivacyLeakWarning, match="scale 'minmax'.*answer from their rows"):
        result = scaled_run(sites, "minmax")
    pooled = np.vstack(sites)
    reference = MinMaxScaler().fit(pooled)
    transform = result.model.scaling
    np.testing.assert_allclose(transform.shift, reference.data_min_, rtol=0, atol=0)
    np.testing.assert_allclose(transform.factor[:2], reference.data_range_[:2], rtol=0, atol=0)
    assert transform.factor[2] == 1.0  # zero range: factor 1
    np.testing.assert_allclose(transform.apply(pooled), reference.transform(pooled), rtol=0, atol=1e-12)


def test_every_task_after_the_statistics_round_clusters_scaled_rows():
    """DWF with every site, local-iters 1 and eta 1 is central Lloyd: here, Lloyd on the
    StandardScaler-transformed pooled data, so every training and evaluation task saw the
    scaled rows; describe and stats carry no transform, every later task does."""
    rng = np.random.default_rng(3)
    X = np.vstack([rng.normal([0, 0], [1, 100], (150, 2)), rng.normal([4, 0], [1, 100], (150, 2))])
    sites = [X[::3], X[1::3], X[2::3]]
    pooled = np.vstack(sites)
    Z = StandardScaler().fit_transform(pooled)
    C0 = Z[[0, 100]]
    recorded = []
    result = fedcluster.simulate(sites, n_clusters=2, init_centroids=C0, num_rounds=5, tol=0.0,
                                 scale="standard", min_cluster_size=1, record_replies=recorded,
                                 site_config={"min-cluster-size": 1})
    central = KMeans(2, init=C0, n_init=1, max_iter=5, tol=0.0, algorithm="lloyd").fit(Z)
    np.testing.assert_allclose(result.centroids, central.cluster_centers_, rtol=0, atol=1e-10)
    assert result.metrics["inertia"] == pytest.approx(central.inertia_, rel=1e-10)
    tasks = [record_tasks(r) for r in recorded]
    assert tasks[:3] == [["describe", "stats"]] * 3  # stats with describe
    assert any("lloyd" in answered for answered in tasks)


def test_the_statistics_reply_is_per_feature_aggregates_only():
    rng = np.random.default_rng(4)
    sites = [rng.normal(size=(40, 3)), rng.normal(size=(25, 3))]
    recorded = []
    scaled_run(sites, "standard", record_replies=recorded)
    stats = [r for r in recorded if record_tasks(r)[-1] == "stats"]
    assert len(stats) == 2
    for reply in stats:  # (the describe round asks the sites in node order: match by key)
        X = sites[int(reply["metrics"]["site-key"])]
        assert [a.shape for a in reply["arrays"]] == [(3,), (3,), (3,)]
        mean = X.mean(axis=0)
        np.testing.assert_allclose(reply["arrays"][0], mean, rtol=1e-14)
        np.testing.assert_allclose(reply["arrays"][2], ((X - mean) ** 2).sum(axis=0), rtol=1e-12)
        assert reply["num-examples"] == len(X)


def test_a_site_under_the_privacy_floor_sends_no_statistics():
    site = SiteData(np.ones((3, 2)), None, None, "tiny site")
    with pytest.raises(TaskError, match="3 rows, fewer than the privacy floor 5"):
        run_on_rows(site, [], {"task": "stats", "scale": "standard", "min-cluster-size": 5}, 1)
    reply = run_on_rows(site, [], {"task": "stats", "scale": "minmax", "min-cluster-size": 3}, 1)
    assert [a.tolist() for a in reply.arrays] == [[1.0, 1.0], [1.0, 1.0]]


@pytest.mark.parametrize("scale, arrays, message", [
    ("standard", [np.zeros(2), np.zeros(2)], "sent 2 arrays, expected 3"),
    ("standard", [np.zeros(2), np.zeros(2), -np.ones(2)], "M2 has a negative entry"),
    ("standard", [np.zeros(3), np.zeros(2), np.ones(2)], "means has shape (3,)"),
    ("minmax", [np.ones(2), np.zeros(2)], "minima exceed maxima"),
    ("minmax", [np.array([0.0, np.nan]), np.ones(2)], "minima has non-finite values"),
])
def test_bad_statistics_replies_are_rejected(scale, arrays, message):
    with pytest.raises(ReplyError, match=message.replace("(", r"\(").replace(")", r"\)")):
        validate(arrays, {}, 10, Expect(task="stats", n_features=2, scale=scale))


def test_the_transform_travels_bit_exactly():
    rng = np.random.default_rng(5)
    shift = np.concatenate([rng.normal(size=20) * 10.0 ** rng.integers(-300, 300, 20), [5e-324, -0.0]])
    factor = np.abs(rng.normal(size=22)) * 10.0 ** rng.integers(-300, 300, 22) + 5e-324
    transform = scaling.FeatureTransform("standard", shift, factor)
    back = scaling.FeatureTransform.decode(transform.encode())
    assert back.shift.tobytes() == shift.tobytes() and back.factor.tobytes() == factor.tobytes()
    with pytest.raises(ValueError, match="factor > 0"):
        scaling.FeatureTransform.from_dict({"kind": "standard", "shift": [0.0], "factor": [0.0]})


def test_a_site_scales_its_rows_once_per_transform():
    X = np.arange(12.0).reshape(6, 2)
    text = scaling.FeatureTransform("minmax", np.zeros(2), np.full(2, 2.0)).encode()
    first = scaling.scaled_rows(X, "s", text)
    assert scaling.scaled_rows(X, "s", text) is first  # cached: no copy per round
    np.testing.assert_array_equal(first, X / 2)
    assert not first.flags.writeable
    other = X.copy()  # another array (a reloaded site) is scaled afresh
    assert scaling.scaled_rows(other, "s", text) is not first
    with pytest.raises(ValueError, match="3 features, the site's data 2"):
        scaling.scaled_rows(X, "s", scaling.FeatureTransform("minmax", np.zeros(3), np.ones(3)).encode())


def test_the_model_applies_and_stores_its_transform(tmp_path):
    rng = np.random.default_rng(6)
    X = np.vstack([rng.normal([0, 1000], [1, 300], (80, 2)), rng.normal([5, 1000], [1, 300], (80, 2))])
    result = fedcluster.simulate([X[:80:2], X[1::2]], n_clusters=2, scale="standard", min_cluster_size=1)
    model = result.model
    Z = model.scaling.apply(X)
    nearest = np.argmin(((Z[:, None] - model.centroids[None]) ** 2).sum(-1), axis=1)
    np.testing.assert_array_equal(model.predict(X), nearest)
    np.testing.assert_allclose(model.transform(X) ** 2, ((Z[:, None] - model.centroids[None]) ** 2).sum(-1))
    assert model.score(X) == pytest.approx(np.min(model.transform(X) ** 2, axis=1).mean(), rel=1e-12)
    np.testing.assert_array_equal(model.to_sklearn().predict(X), model.predict(X))
    model.save(tmp_path / "model.json")
    text = json.loads((tmp_path / "model.json").read_text())
    assert text["scaling"]["kind"] == "standard"
    np.testing.assert_allclose(text["centroids-original"], model.centroids * model.scaling.factor
                               + model.scaling.shift, rtol=1e-15)
    # in original units the centroids sit near the two blobs' means on feature 0
    assert sorted(np.round(np.asarray(text["centroids-original"])[:, 0])) == pytest.approx([0, 5], abs=0.6)
    loaded = Model.load(tmp_path / "model.json")
    np.testing.assert_array_equal(loaded.scaling.factor, model.scaling.factor)
    np.testing.assert_array_equal(loaded.predict(X), model.predict(X))


def test_wine_clusters_far_better_with_standard_scaling():
    """scikit-learn's wine set: 13 features on very different scales (proline in the
    hundreds drowns the rest); 3 classes, split over 3 sites. ARI is federated and exact."""
    X, y = load_wine(return_X_y=True)
    parts = np.array_split(np.random.default_rng(0).permutation(len(X)), 3)
    sites, labels = [X[p] for p in parts], [y[p] for p in parts]
    ari = {scale: fedcluster.simulate(sites, labels=labels, n_clusters=3, n_init=3, min_sites=3,
                                      scale=scale).metrics["ari"]
           for scale in ("none", "standard")}
    assert ari["none"] < 0.45
    # (central KMeans on the standardised pooled rows: 0.90; from the sites' groups of 2-3
    # rows, 0.83, from their rows 0.95: 178 rows make ARI a coarse figure)
    assert ari["standard"] > 0.8


def test_predict_command_scales_a_sites_raw_rows(tmp_path):
    """Trained from CSVs with an id column and scale = standard; `fedcluster predict` on a
    site's raw file (same id column) gives the model's labels for the raw rows."""
    from fedcluster.cli import main

    rng = np.random.default_rng(7)
    X = np.vstack([rng.normal([0, 5e4], [1, 1e4], (60, 2)), rng.normal([6, 5e4], [1, 1e4], (60, 2))])
    paths = []
    for i, rows in enumerate((X[::2], X[1::2])):
        path = tmp_path / f"site{i}.csv"
        path.write_text("mrn,dose,income\n" + "".join(f"M{i}{r},{a:.17g},{b:.17g}\n" for r, (a, b) in enumerate(rows)))
        paths.append(str(path))
    assert main(["simulate", "--data", *paths, "--id-column", "mrn", "--n-clusters", "2", "--scale",
                 "standard", "--output-dir", str(tmp_path / "out"), "--run-name", "r"]) == 0
    model = Model.load(tmp_path / "out" / "r" / "model.json")
    assert model.scaling.kind == "standard" and model.feature_names == ["dose", "income"]
    assert main(["predict", "--model", str(tmp_path / "out" / "r" / "model.json"), "--data", paths[0],
                 "--id-column", "mrn", "--out", str(tmp_path / "labels.csv")]) == 0
    labels = np.loadtxt(tmp_path / "labels.csv", delimiter=",", skiprows=1, usecols=2, dtype=int)
    np.testing.assert_array_equal(labels, model.predict(X[::2]))
    # issue 70: the --id-column's values head each line, with the data row
    written = (tmp_path / "labels.csv").read_text().splitlines()
    assert written[0] == "mrn,row,cluster"
    assert written[1:3] == [f"M00,1,{labels[0]}", f"M01,2,{labels[1]}"]
    truth = np.repeat([0, 1], 60)[::2]
    assert max(np.mean(labels == truth), np.mean(labels != truth)) > 0.95  # dose decides, scaled


def test_the_scaled_copy_goes_when_the_sites_array_does():
    import gc

    text = scaling.FeatureTransform("minmax", np.zeros(2), np.ones(2)).encode()
    X = np.ones((4, 2))
    scaling.scaled_rows(X, "gone", text)
    assert any(key[0] == "gone" for key in scaling._SCALED)
    del X
    gc.collect()
    scaling.scaled_rows(np.ones((3, 2)), "other", text)  # any call drops dead entries
    assert not any(key[0] == "gone" for key in scaling._SCALED)


def test_a_site_without_valid_statistics_leaves_the_run(monkeypatch):
    """The transform must cover every row that is clustered: a site whose statistics fail
    is rejected with the reason, and the transform is that of the others' pooled rows."""
    from site_rows import refuse_at

    refuse_at(monkeypatch, "stats", "site 2", "statistics unavailable")
    rng = np.random.default_rng(8)
    sites = [rng.normal(i, 1 + i, size=(50, 2)) for i in range(3)]
    result = fedcluster.simulate(sites, n_clusters=2, scale="standard", min_sites=2, every_site=False)
    assert "statistics round" in result.metrics["rejected-sites"]["2"]
    assert result.metrics["n-sites"] == 2 and result.metrics["n-rows"] == 100
    reference = StandardScaler().fit(np.vstack(sites[:2]))
    np.testing.assert_allclose(result.model.scaling.factor, reference.scale_, rtol=1e-11)

"""Tables in the Python API (issue 20): ``fedcluster.simulate`` with arrays that hold NaN
(``missing=``) and with pandas DataFrames through a schema, encoded exactly as a deployed
site encodes its file, the run checking the schema's hash and imputing as in deployment."""

from __future__ import annotations

import tomllib

import numpy as np
import pytest

from fedcluster.client_app.data.site_data import SiteDataError
from fedcluster.common.clinical_demo import clinical_schema_toml, make_clinical, write_clinical
from fedcluster.common.schema import load_schema, parse_schema, schema_hash
from fedcluster.simulation import choose_k, run_in_process, simulate
from fedcluster.simulation_tables import encode_sites, table_run

pd = pytest.importorskip("pandas")

EXACT = {"site_config": {"min-cluster-size": 1}, "min_cluster_size": 1, "central_baseline": False,
         "tol": 0.0}


def _blobs(seed=0, holes=0.1):
    """Three sites of 4-feature blobs, ``holes`` of their cells NaN (no row all NaN)."""
    rng = np.random.default_rng(seed)
    centres = rng.uniform(-6, 6, size=(3, 4))
    sites, labels = [], []
    for n in (120, 150, 90):
        y = rng.integers(3, size=n)
        X = centres[y] + rng.normal(size=(n, 4))
        X[rng.random(X.shape) < holes] = np.nan
        X[np.isnan(X).all(axis=1), 0] = 0.5
        sites.append(X)
        labels.append(y)
    return sites, labels


def _tasks(result):
    return [h["task"] for h in result.history]


# --------------------------------------------------------------- (a) impute-mean
def test_impute_mean_equals_the_run_on_arrays_filled_with_the_pooled_means():
    sites, _ = _blobs()
    means = np.nanmean(np.vstack(sites), axis=0)  # the pooled means of the present cells
    filled = [np.where(np.isnan(X), means, X) for X in sites]
    C0 = np.array([[-3.0, 0, 0, 1], [0, 3, 0, 0], [3, 0, -2, 0]])
    common = {"n_clusters": 3, "init_centroids": C0, "num_rounds": 5, "scale": "none", **EXACT}
    result = simulate(sites, missing="impute-mean", **common)
    reference = simulate(filled, **common)
    assert _tasks(result)[0] == "describe+impute_stats"
    assert not any("impute_stats" in t for t in _tasks(reference))
    np.testing.assert_allclose(result.centroids, reference.centroids, rtol=0, atol=1e-9)
    np.testing.assert_allclose(result.model.scaling.fill, means, rtol=1e-12)
    assert result.metrics["inertia"] == pytest.approx(reference.metrics["inertia"], rel=1e-9)
    # arrays name no features, as before; the table's counts are summed in the summary
    assert result.model.feature_names == reference.model.feature_names == []
    missing = result.metrics["table"]["cells-missing"]
    assert [missing[f"x{j}"]["total"] for j in range(4)] == \
        np.isnan(np.vstack(sites)).sum(axis=0).tolist()


def test_impute_mean_with_standard_scaling_scales_the_filled_rows():
    sites, labels = _blobs(seed=1)
    means = np.nanmean(np.vstack(sites), axis=0)
    filled = [np.where(np.isnan(X), means, X) for X in sites]
    common = {"n_clusters": 3, "num_rounds": 4, "scale": "standard", "labels": labels,
              "seed": 3, **EXACT}
    result = simulate(sites, missing="impute-mean", **common)
    reference = simulate(filled, **common)
    assert _tasks(result)[:2] == ["describe+impute_stats", "stats"]
    np.testing.assert_allclose(result.centroids, reference.centroids, rtol=0, atol=1e-9)
    assert result.metrics["ari"] == pytest.approx(reference.metrics["ari"], abs=1e-12)


# ------------------------------------------------------------------ (b) drop-row
def test_drop_row_equals_the_run_on_arrays_without_those_rows():
    sites, labels = _blobs(seed=2, holes=0.05)
    keep = [~np.isnan(X).any(axis=1) for X in sites]
    C0 = np.array([[-3.0, 0, 0, 1], [0, 3, 0, 0], [3, 0, -2, 0]])
    common = {"n_clusters": 3, "init_centroids": C0, "num_rounds": 5, **EXACT}
    result = simulate(sites, labels=labels, missing="drop-row", **common)
    reference = simulate([X[k] for X, k in zip(sites, keep)],
                         labels=[y[k] for y, k in zip(labels, keep)], **common)
    assert not any("impute_stats" in t for t in _tasks(result))
    np.testing.assert_allclose(result.centroids, reference.centroids, rtol=0, atol=1e-9)
    assert result.metrics["n-rows"] == sum(int(k.sum()) for k in keep)
    # the labels were dropped with their rows: the evaluation is the same
    assert result.metrics["ari"] == pytest.approx(reference.metrics["ari"], abs=1e-12)
    assert result.metrics["table"]["rows-dropped"]["total"] == sum(int((~k).sum()) for k in keep)


def test_missing_error_or_none_keeps_a_nan_an_error():
    sites, _ = _blobs()
    for missing in (None, "error"):
        with pytest.raises(SiteDataError, match=r"site 0: row index \d+, column index \d+ .* "
                                                r"is nan; every value must be finite"):
            simulate(sites, missing=missing, n_clusters=3)
    assert encode_sites(sites, missing="error") is None  # the plain array path


# ------------------------------------------------- (c) DataFrames of the clinical demo
def _frames(n_sites=3, seed=0):
    """The demo's sites as DataFrames an analyst would hold: numbers as numbers (NaN
    missing), text as text, columns in another order than the files', the last site's
    unit-suffixed headers (glucose [mmol/L]) as they are."""
    rng = np.random.default_rng(7)
    frames = []
    for header, rows in make_clinical(n_sites, seed):
        frame = pd.DataFrame(rows, columns=header)
        for name in header:
            if name.split(" [")[0] not in ("patient_id", "phenotype", "sex", "ward", "smoking"):
                frame[name] = pd.to_numeric(frame[name].replace("", np.nan))
        frame["smoking"] = frame["smoking"].replace("", None)
        frames.append(frame[[header[j] for j in rng.permutation(len(header))]])
    return frames


def _schema():
    return parse_schema(tomllib.loads(clinical_schema_toml()))


def test_dataframes_through_the_schema_equal_the_deployed_sites_on_the_csv_files(tmp_path):
    paths = write_clinical(tmp_path / "demo", n_sites=3, seed=0)
    schema_path, files = paths[0], paths[1:]
    frames = _frames()
    assert any("[mmol/L]" in str(c) for c in frames[-1].columns)
    config = {"algorithm": "dwf", "n-clusters": 4, "scale": "standard", "num-rounds": 6,
              "tol": 0.0, "min-cluster-size": 1, "central-baseline": False, "seed": 5}
    nodes = [{"data-path": str(p), "schema-path": str(schema_path), "site-id": str(i),
              "cache-dir": str(tmp_path / "cache")} for i, p in enumerate(files)]
    deployed = run_in_process(nodes, {**config, "schema": str(schema_path), "output-dir": ""})
    result = simulate(frames, schema=_schema(), **{k.replace("-", "_"): v
                                                 for k, v in config.items()})
    assert _tasks(result)[:2] == _tasks(deployed)[:2] == ["describe+impute_stats", "stats"]
    np.testing.assert_allclose(result.centroids, deployed.centroids, rtol=0, atol=1e-9)
    np.testing.assert_allclose(result.model.scaling.fill, deployed.model.scaling.fill,
                               rtol=1e-12, equal_nan=True)
    assert result.model.feature_names == deployed.model.feature_names == \
        _schema().feature_names()
    assert result.metrics["table"] == deployed.metrics["table"]
    assert result.metrics["table"]["schema-hash"] == schema_hash(load_schema(schema_path))
    # the phenotype column gave the labels: the same evaluation as the deployed sites'
    assert result.metrics["ari"] == pytest.approx(deployed.metrics["ari"], abs=1e-12)


def test_the_schema_as_a_dict_or_a_file_and_units_declared_per_site(tmp_path):
    frames = _frames()
    # the last site's headers without their unit suffix, the units declared instead
    frames[-1] = frames[-1].rename(columns=lambda c: str(c).split(" [")[0])
    units = [None, None, {"glucose": "mmol/L", "creatinine": "umol/L"}]
    path = tmp_path / "schema.toml"
    path.write_text(clinical_schema_toml())
    schema = _schema()
    encoded = [encode_sites(frames, schema=s, units=units)[0]
               for s in (schema, schema.model_dump(mode="json", by_alias=True), path, str(path))]
    for sites in encoded[1:]:
        for a, b in zip(sites, encoded[0]):
            np.testing.assert_array_equal(a.X, b.X)
            assert a.table.schema_hash == b.table.schema_hash == schema_hash(schema)
    glucose = schema.feature_names().index("glucose")
    # with the units ignored the last site's glucose is off the scale (mmol/L read as mg/dL)
    with pytest.raises(SiteDataError, match=r"site 2: row \d+, column 'glucose': .* outside"):
        encode_sites(frames, schema=schema)
    assert np.nanmean(encoded[0][2].X[:, glucose]) > 50  # converted to mg/dL


def test_the_run_names_a_schema_file_that_holds_the_same_schema_and_removes_it():
    run_config: dict = {}
    with table_run(_frames(), None, run_config, schema=_schema()) as (sites, labels):
        path = run_config["schema"]
        assert schema_hash(load_schema(path)) == schema_hash(_schema())
        assert all(s.table.schema_hash == schema_hash(_schema()) for s in sites)
        assert labels is None and all(s.labels is not None for s in sites)
    assert "schema" not in run_config
    import os
    assert not os.path.exists(path)


def test_choose_k_takes_dataframes_too():
    out = choose_k(_frames(), schema=_schema(), k_range=(2, 4), scale="standard",
                   central_baseline=False, n_init=1)
    assert set(out["models"]) == {2, 3, 4}
    assert out["models"][3].feature_names == _schema().feature_names()


# ----------------------------------------------------------------------- (d) errors
def test_an_unknown_category_raises_naming_site_row_column_and_value():
    """As a NaN in a plain array does, a table that does not fit the schema raises from
    simulate, before any site runs (an analyst trying a schema sees why at once)."""
    frames = _frames()
    frame = frames[1].copy()
    frame.loc[frame.index[4], "sex"] = "unknown-sex"
    frames[1] = frame
    with pytest.raises(SiteDataError, match=r"^site 1: row 5, column 'sex': 'unknown-sex' is not "
                                            r"one of the schema's categories"):
        simulate(frames, schema=_schema(), n_clusters=4)


def test_impute_median_without_a_schema_says_to_pass_one_with_ranges():
    sites, _ = _blobs()
    with pytest.raises(ValueError, match="impute-median.*pass a schema with each column's range"):
        simulate(sites, missing="impute-median", n_clusters=3)


def test_a_dataframe_without_a_schema_is_refused():
    frames = [pd.DataFrame(np.random.default_rng(0).normal(size=(30, 2)), columns=["a", "b"])
              for _ in range(2)]
    with pytest.raises(ValueError, match="site 0 is a DataFrame: give schema="):
        simulate(frames, n_clusters=2)
    with pytest.raises(ValueError, match="site 0 is a DataFrame: give schema="):
        simulate(frames, missing="impute-mean", n_clusters=2)


def test_other_arguments_that_do_not_fit():
    sites, labels = _blobs()
    frames = _frames()
    with pytest.raises(ValueError, match="missing must be one of"):
        simulate(sites, missing="impute-zero")
    with pytest.raises(ValueError, match="leave missing= unset"):
        simulate(frames, schema=_schema(), missing="drop-row")
    with pytest.raises(ValueError, match="label column"):
        simulate(frames, schema=_schema(), labels=labels)
    with pytest.raises(ValueError, match="units= .* give schema="):
        simulate(sites, missing="impute-mean", units={"x0": "cm"})
    with pytest.raises(ValueError, match="site 0: with a schema, a site is a pandas DataFrame"):
        simulate(sites, schema=_schema())
    header, rows = make_clinical(1)[0]
    with pytest.raises(ValueError, match="rows given instead of columns"):
        simulate([(header, rows)], schema=_schema())
    with pytest.raises(ValueError, match="the same number of columns"):
        simulate([sites[0], sites[1][:, :3]], missing="impute-mean")
    with pytest.raises(ValueError, match="3 units dicts|2 dicts for 3 sites"):
        simulate(frames, schema=_schema(), units=[{}, {}])


def test_a_header_and_columns_pair_is_a_site_too():
    header, rows = make_clinical(1)[0]
    columns = [list(c) for c in zip(*rows)]
    (site,), schema = encode_sites([(header, columns)], schema=_schema())
    frame_site, = encode_sites([_frames(1)[0]], schema=_schema())[0]
    np.testing.assert_array_equal(site.X, frame_site.X)
    np.testing.assert_array_equal(site.labels, frame_site.labels)
    assert not site.X.flags.writeable

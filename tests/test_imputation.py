"""Tables read through the agreed schema, end to end in process (issue 20): the pooled
imputation round, the schema's hash checked at describe, a site whose file does not fit
failing its own start while the run goes on, and the result equal to central k-means on
the pooled table encoded and imputed the same way."""

from __future__ import annotations

import json

import numpy as np
import pytest
from sklearn.cluster import KMeans
from sklearn.preprocessing import StandardScaler

from fedcluster.client_app.data.schema_table import load_schema_table
from fedcluster.client_app.data.site_data import SiteDataError
from fedcluster.client_app.data.table_files import read_table
from fedcluster.common.clinical_demo import write_clinical
from fedcluster.common.imputation import (
    histogram_median, imputation_plan, pooled_fill, site_missing_stats,
)
from fedcluster.common.scaling import FeatureTransform
from fedcluster.common.schema import encoded_kinds, load_schema, parse_schema, schema_hash
from fedcluster.common.table_encoding import encode_table
import fedcluster
from fedcluster.simulation import run_in_process
from fedcluster.strategies.errors import FederationError


def _schema(**table):
    return parse_schema({**table, "columns": [
        {"name": "a"},
        {"name": "b", "range": [0, 100], "missing": "impute-median"},
        {"name": "c", "type": "categorical", "categories": ["x", "y"],
         "missing-indicator": True},
    ]})


# ------------------------------------------------------------------ the maths
def test_plan_follows_the_encoded_features():
    plan = imputation_plan(_schema(missing="impute-mean"))
    # a, b, c=x, c=y, "c missing"
    assert plan.policies == ("mean", "median", "mean", "mean", None)
    assert plan.ranges[1] == (0, 100) and plan.ranges[0] is None
    assert not imputation_plan(_schema(missing="drop-row")).policies[0]


def cells(X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The present cells of rows as groups of one row each: (present, present sums)."""
    return (~np.isnan(X)).astype(np.int64), np.nan_to_num(X)


def test_site_statistics_withhold_what_is_under_the_floor():
    plan = imputation_plan(_schema(missing="impute-mean"))
    X = np.array([[1.0, 10.0, 1, 0, 0], [np.nan, 10.2, 0, 1, 0], [3.0, 90.0, np.nan, np.nan, 1],
                  [np.nan, np.nan, 1, 0, 0]])
    sums, counts, hist = site_missing_stats(*cells(X), plan, floor=2)
    assert counts.tolist() == [2, 3, 3, 3, 0] and sums[0] == 4.0
    # b's histogram: two values in one bin (kept), 90 alone in its bin (withheld)
    assert hist[1].sum() == 2 and hist[1].max() == 2
    sums, counts, hist = site_missing_stats(*cells(X), plan, floor=3)
    assert counts[0] == 0 and sums[0] == 0.0  # a: 2 present cells < 3: withheld whole


def test_pooled_fill_is_the_pooled_mean_and_the_binned_median():
    rng = np.random.default_rng(0)
    plan = imputation_plan(_schema(missing="impute-mean"))
    sites = []
    for n in (300, 500):
        X = np.column_stack([rng.normal(5, 2, n), rng.uniform(0, 100, n),
                             *np.eye(2)[rng.integers(0, 2, n)].T, np.zeros(n)])
        X[rng.random(n) < 0.2, 0] = np.nan
        X[rng.random(n) < 0.2, 1] = np.nan
        sites.append(X)
    stats = [site_missing_stats(*cells(X), plan, floor=1) for X in sites]
    fill = pooled_fill(plan, [s[1] for s in stats], [s[0] for s in stats], [s[2] for s in stats])
    pooled = np.vstack(sites)
    assert fill[0] == pytest.approx(np.nanmean(pooled[:, 0]), rel=1e-12)
    assert abs(fill[1] - np.nanmedian(pooled[:, 1])) <= 100 / plan.bins
    assert fill[2] == pytest.approx(np.mean(pooled[:, 2]), rel=1e-12) and np.isnan(fill[4])
    with pytest.raises(ValueError, match="feature 0: no site reported a present value"):
        pooled_fill(plan, [np.zeros(5)], [np.zeros(5)], [np.zeros((5, plan.bins))])


def test_histogram_median_interpolates_in_its_bin():
    assert histogram_median(np.array([0, 2, 2, 0]), 0.0, 4.0) == pytest.approx(2.0)
    assert histogram_median(np.array([1, 0, 0, 1]), 0.0, 4.0) == pytest.approx(1.0)


def test_the_transform_carries_the_fill_exactly():
    fill = np.array([0.1 + 0.2, np.nan, 7.0])
    transform = FeatureTransform("standard", np.array([1.0, 2, 3]), np.array([2.0, 1, 4]), fill)
    again = FeatureTransform.decode(transform.encode())
    assert again.fill[0] == fill[0] and np.isnan(again.fill[1])
    X = np.array([[np.nan, np.nan, np.nan], [3.0, 4.0, 5.0]])
    out = again.apply(X)
    assert out[0, 0] == (fill[0] - 1) / 2 and np.isnan(out[0, 1]) and out[0, 2] == 1.0
    assert FeatureTransform.fill_only(fill).apply(X)[1].tolist() == [3.0, 4.0, 5.0]


# ---------------------------------------------------------- the clinical demo
@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    out = tmp_path_factory.mktemp("clinical")
    paths = write_clinical(out, n_sites=3, seed=0)
    return out, paths[0], paths[1:]


def _nodes(schema_path, paths, cache):
    return [{"data-path": str(p), "schema-path": str(schema_path), "site-id": str(i),
             "cache-dir": str(cache)} for i, p in enumerate(paths)]


def _pooled_reference(schema_path, paths):
    """The pooled table encoded as every site encodes it, imputed with the pooled means of
    its present cells (central imputation), then standardised."""
    schema = load_schema(schema_path)
    tables = []
    for p in paths:
        header, columns = read_table(p)
        tables.append(encode_table(header, columns, schema, str(p)))
    X = np.vstack([t.X for t in tables])
    means = np.nanmean(X, axis=0)
    X = np.where(np.isnan(X), means, X)
    # the numeric columns standardised; a category's 0/1 columns (and the missing
    # indicator) kept as they are (schema.md, category-weight)
    numeric = np.asarray([kind == "numeric" for kind in encoded_kinds(schema)])
    X[:, numeric] = StandardScaler().fit_transform(X[:, numeric])
    return X, means


def test_dwf_with_impute_mean_equals_central_kmeans_on_the_pooled_table(demo, tmp_path):
    out, schema_path, paths = demo
    Z, means = _pooled_reference(schema_path, paths)
    C0 = Z[np.random.default_rng(1).choice(len(Z), 4, replace=False)]
    rounds = 6
    # (the sites answer from their rows: exact Lloyd on the pooled rows)
    result = run_in_process(
        [{**node, "min-cluster-size": 1}
         for node in _nodes(schema_path, paths, tmp_path / "cache")],
        {"algorithm": "dwf", "n-clusters": 4, "schema": str(schema_path), "scale": "standard",
         "num-rounds": rounds, "tol": 0.0, "min-cluster-size": 1, "central-baseline": False,
         "output-dir": str(tmp_path / "out")},
        initial_centroids=C0)
    tasks = [h["task"] for h in result.history]
    assert tasks[:2] == ["describe+impute_stats", "stats"]
    # the fill is the pooled mean of the present cells (central imputation)
    fill = result.model.scaling.fill
    names = load_schema(schema_path).feature_names()
    assert [n for n, v in zip(names, fill) if np.isnan(v)] == ["smoking missing"]
    np.testing.assert_allclose(fill[~np.isnan(fill)], means[~np.isnan(fill)], rtol=1e-12)
    levels = np.asarray([kind != "numeric" for kind in encoded_kinds(load_schema(schema_path))])
    assert levels.sum() == 11  # sex 2, ward 5, smoking 3 and its indicator: not rescaled
    assert np.all(result.model.scaling.factor[levels] == 1.0)
    assert np.all(result.model.scaling.shift[levels] == 0.0)
    central = KMeans(4, init=C0, n_init=1, max_iter=rounds, tol=0.0, algorithm="lloyd").fit(Z)
    np.testing.assert_allclose(result.model.centroids, central.cluster_centers_, rtol=0, atol=1e-9)
    assert result.model.metrics["inertia"] == pytest.approx(central.inertia_, rel=1e-9)
    # the run summary sums the sites' counts of imputed cells (none under the floor here)
    table = result.metrics["table"]
    assert table["schema-hash"] == schema_hash(load_schema(schema_path))
    glucose = sum(sum(not c.strip() for c in read_table(p)[1][
        [h.split(" [")[0] for h in read_table(p)[0]].index("glucose")]) for p in paths)
    assert table["cells-missing"]["glucose"] == {"total": glucose, "sites-under-floor": 0}
    assert table["rows-dropped"]["total"] == 0


def test_a_site_with_another_schema_is_rejected_naming_both_hashes(demo, tmp_path):
    out, schema_path, paths = demo
    other = tmp_path / "other.toml"
    other.write_text(schema_path.read_text().replace('missing = "impute-mean"',
                                                     'missing = "impute-mean"\nmedian-bins = 50', 1))
    nodes = _nodes(schema_path, paths, tmp_path / "cache")
    nodes[2]["schema-path"] = str(other)
    result = run_in_process(nodes, {"n-clusters": 4, "schema": str(schema_path), "every-site": False,
                                    "central-baseline": False, "output-dir": str(tmp_path / "out")})
    reason = result.metrics["rejected-sites"]["2"]
    assert schema_hash(load_schema(other)) in reason and schema_hash(load_schema(schema_path)) in reason
    assert result.metrics["n-rows"] == sum(len(read_table(p)[1][0]) for p in paths[:2])


def _edit(header, columns, case):
    """Break a site's table as a real export might."""
    j = {name.split(" [")[0]: i for i, name in enumerate(header)}
    if case == "unknown category":
        columns[j["sex"]][4] = "unknown-sex"
    elif case == "out of range":
        columns[j["age"]][6] = "430"
    elif case == "missing column":
        k = j["hba1c"]
        header, columns = header[:k] + header[k + 1:], columns[:k] + columns[k + 1:]
    elif case == "every row dropped":  # age's policy drop-row, and age missing everywhere
        columns[j["age"]] = [""] * len(columns[j["age"]])
    return header, columns


BAD_CASES = {  # case -> what the rejection must name
    "unknown category": ("row 5, column 'sex'", "'unknown-sex' is not one of the schema's categories"),
    "out of range": ("row 7, column 'age'", "430 is outside the schema's range [0, 120]"),
    "missing column": ("'hba1c'", "not in the file"),
    "every row dropped": ("every one of its", "no row is left"),
}


@pytest.mark.parametrize("case", sorted(BAD_CASES))
def test_a_file_that_does_not_fit_fails_its_own_start_and_the_run_goes_on(demo, tmp_path, case):
    out, schema_path, paths = demo
    if case == "every row dropped":
        text = schema_path.read_text().replace('name = "age"', 'name = "age"\nmissing = "drop-row"', 1)
        schema_path = tmp_path / "schema-drop.toml"
        schema_path.write_text(text)
    header, columns = _edit(*read_table(paths[1]), case)
    broken = tmp_path / "broken.csv"
    broken.write_text("\n".join(",".join(row) for row in [header, *zip(*columns)]) + "\n")
    with pytest.raises(SiteDataError) as failure:  # the site's own start
        load_schema_table(broken, load_schema(schema_path), cache_dir=tmp_path / "c1")
    assert str(failure.value).startswith(str(broken))
    assert all(part in str(failure.value) for part in BAD_CASES[case]), str(failure.value)
    nodes = _nodes(schema_path, [paths[0], broken, paths[2]], tmp_path / "cache")
    result = run_in_process(nodes, {"n-clusters": 4, "schema": str(schema_path), "every-site": False,
                                    "central-baseline": False, "output-dir": str(tmp_path / "out")})
    assert list(result.metrics["rejected-sites"]) == ["1"]
    assert str(failure.value) in result.metrics["rejected-sites"]["1"]
    assert result.metrics["n-rows"] == sum(len(read_table(p)[1][0]) for p in (paths[0], paths[2]))


def test_describe_reports_counts_and_the_cache_keeps_them(demo, tmp_path):
    out, schema_path, paths = demo
    schema = load_schema(schema_path)
    first = load_schema_table(paths[0], schema, cache_dir=tmp_path / "c")
    again = load_schema_table(paths[0], schema, cache_dir=tmp_path / "c")
    assert isinstance(again.X, np.memmap)  # the second load maps the cache
    assert again.table.cells_missing == first.table.cells_missing
    assert first.table.cells_missing["glucose"] > 0 and first.table.has_missing
    np.testing.assert_array_equal(again.X, first.X)
    from fedcluster.client_app.site_statistics import describe
    metrics = describe(again, [], {}, floor=2).metrics
    assert metrics["schema-hash"] == schema_hash(schema)
    assert json.loads(metrics["cells-missing"])["glucose"] == first.table.cells_missing["glucose"]


# ------------------------------------------------------ the leakage audit (3)
AUDIT_FLOOR = 5


def _sparse_crp_site(schema_path, paths, tmp_path):
    """Site 1 with only 3 present crp cells (under the floor): its crp figures must be
    withheld; and a schema whose crp is imputed by the median (histograms sent)."""
    header, columns = read_table(paths[1])
    j = header.index("crp")
    present = [i for i, cell in enumerate(columns[j]) if cell.strip()]
    for i in present[3:]:
        columns[j][i] = ""
    sparse = tmp_path / "site-1-sparse.csv"
    sparse.write_text("\n".join(",".join(row) for row in [header, *zip(*columns)]) + "\n")
    text = schema_path.read_text()
    marker = 'name = "crp"'
    assert marker in text
    median = tmp_path / "schema-median.toml"
    median.write_text(text.replace(marker, marker + '\nmissing = "impute-median"', 1))
    return median, [paths[0], sparse, paths[2]]


def test_leakage_audit_of_the_imputation_round(demo, tmp_path):
    out, schema_path, paths = demo
    schema_path, paths = _sparse_crp_site(schema_path, paths, tmp_path)
    schema = load_schema(schema_path)
    from fedcluster.simulation import record_parts, serve_in_process
    from fedcluster.common import scaling
    records: list[dict] = []
    serve_in_process(_nodes(schema_path, paths, tmp_path / "cache"),
                     {"n-clusters": 4, "schema": str(schema_path), "scale": "standard",
                      "min-cluster-size": AUDIT_FLOOR, "central-baseline": False,
                      "output-dir": str(tmp_path / "out")}, record_replies=records)
    sites = [load_schema_table(p, schema, cache_dir=tmp_path / "cache") for p in paths]
    names = schema.feature_names()
    crp = names.index("crp")
    seen_impute = 0
    for rec in records:
        site = sites[int(rec["metrics"]["site-key"])]
        views = [np.asarray(site.X)]
        if "transform" in rec.get("params", {}):
            views.append(scaling.scaled_rows(site.X, "audit", str(rec["params"]["transform"])))
        for task, arrays, metrics in record_parts(rec):
            for a in map(np.asarray, arrays):
                assert site.n_rows not in a.shape, (task, a.shape)
                if a.dtype.kind == "f" and a.shape[-1:] == (len(names),):
                    rows = a.reshape(-1, len(names))
                    for view in views:  # no reported vector is one of the site's rows
                        close = np.abs(rows[:, None] - view[None]) <= 1e-9 * (1 + np.abs(view))
                        assert not close.all(axis=2).any(), (task, "holds a row")
            if task == "impute_stats":
                seen_impute += 1
                sums, counts, hist = map(np.asarray, arrays)
                assert not np.any((counts >= 1) & (counts < AUDIT_FLOOR))
                assert not np.any((hist >= 1) & (hist < AUDIT_FLOOR))
                assert hist[crp].sum() > 0 or rec["metrics"]["site-key"] == "1"
                if rec["metrics"]["site-key"] == "1":  # 3 present crp cells: withheld
                    assert counts[crp] == 0 and sums[crp] == 0 and hist[crp].sum() == 0
            if "cells-missing" in metrics:
                for value in json.loads(metrics["cells-missing"]).values():
                    assert value == f"<{AUDIT_FLOOR}" or value == 0 or value >= AUDIT_FLOOR
    assert seen_impute == 3


def test_a_parquet_site_gives_the_run_of_its_csv(demo, tmp_path):
    """Must-show 5: the same table as Parquet (numbers as numbers, nulls for missing
    cells, text as text) gives the same run as its CSV, bit for bit."""
    import pyarrow as pa  # the test extra installs it
    import pyarrow.parquet as pq

    out, schema_path, paths = demo
    header, columns = read_table(paths[1])
    arrays = {}
    for name, cells in zip(header, columns):
        try:
            arrays[name] = pa.array([None if not c.strip() else float(c) for c in cells],
                                    pa.float64())
        except ValueError:
            arrays[name] = pa.array([None if not c.strip() else c for c in cells], pa.string())
    parquet = tmp_path / "site-1.parquet"
    pq.write_table(pa.table(arrays), parquet)
    config = {"n-clusters": 4, "schema": str(schema_path), "scale": "standard",
              "central-baseline": False, "output-dir": str(tmp_path / "out")}
    from_csv = run_in_process(_nodes(schema_path, paths, tmp_path / "c1"), config)
    with_parquet = run_in_process(_nodes(schema_path, [paths[0], parquet, paths[2]],
                                         tmp_path / "c2"), config)
    np.testing.assert_array_equal(with_parquet.centroids, from_csv.centroids)
    assert with_parquet.metrics["table"] == from_csv.metrics["table"]
    assert with_parquet.metrics["score"] == from_csv.metrics["score"]


# ------------------------------------- run config missing: plain tables, no schema
def _plain_sites(tmp_path):
    """Three plain numeric CSV sites with empty cells (no schema), and their arrays."""
    rng = np.random.default_rng(11)
    arrays, paths = [], []
    for i, n in enumerate((120, 150, 90)):
        X = rng.normal(size=(n, 3)) + rng.integers(0, 3, size=(n, 1)) * 4.0
        X[rng.random((n, 3)) < 0.1] = np.nan
        X[0, 0] = X[1, 1] = np.nan  # every site has some
        path = tmp_path / f"plain-{i}.csv"
        path.write_text("a,b,c\n" + "".join(
            ",".join("" if np.isnan(v) else repr(float(v)) for v in row) + "\n" for row in X))
        arrays.append(X)
        paths.append(path)
    return arrays, paths


def test_run_config_missing_reads_plain_tables_with_empty_cells(tmp_path):
    """``missing = "impute-mean"`` fills a plain site's empty cells with the pooled mean
    (exact Lloyd on the filled rows); ``error`` (the default) rejects the files, naming the
    empty cell; ``drop-row`` is refused by every site that holds a missing cell, naming the
    key: dropping their rows would be another reading of its data (its own record and DP
    budget), which a site does not take at a run's asking (issue 69)."""
    arrays, paths = _plain_sites(tmp_path)
    pooled = np.vstack(arrays)
    fill = np.nanmean(pooled, axis=0)
    expected_sites = [np.where(np.isnan(X), fill, X) for X in arrays]
    C0 = np.vstack(expected_sites)[[0, 50, 200]]
    # (the sites answer from their rows: exact Lloyd on the pooled rows)
    nodes = [{"data-path": str(p), "site-id": str(i), "cache-dir": str(tmp_path / "cache"),
              "min-cluster-size": 1} for i, p in enumerate(paths)]
    config = {"n-clusters": 3, "missing": "impute-mean", "num-rounds": 4, "tol": 0.0,
              "central-baseline": False, "output-dir": str(tmp_path / "out")}
    result = run_in_process(nodes, config, initial_centroids=C0)
    central = KMeans(3, init=C0, n_init=1, max_iter=4, tol=0.0, algorithm="lloyd").fit(
        np.vstack(expected_sites))
    np.testing.assert_allclose(result.centroids, central.cluster_centers_, rtol=0, atol=1e-9)
    table = result.metrics["table"]
    assert table["schema-hash"] == ""
    assert result.history[0]["task"] == "describe+impute_stats"
    np.testing.assert_allclose(result.model.scaling.fill, fill, rtol=1e-12)
    assert table["cells-missing"]["a"]["total"] == int(np.isnan(pooled[:, 0]).sum())
    # under the default (error) the same files are rejected, naming the empty cell
    with pytest.raises(FederationError, match=r"plain-0.csv: data row 1 \(line 2\), column 'a': the cell is empty"):
        run_in_process(nodes, {**config, "missing": "error"}, initial_centroids=C0)
    with pytest.raises(FederationError) as refused:
        run_in_process(nodes, {**config, "missing": "drop-row"}, initial_centroids=C0)
    assert str(refused.value).count("run config 'missing' = \"drop-row\" would read this file") == 3


def test_run_config_missing_is_not_for_a_schema_run():
    from fedcluster.common.config import ConfigError, parse_run_config
    with pytest.raises(ConfigError, match="'missing' is for sites without a schema"):
        parse_run_config({"schema": "s.toml", "missing": "impute-mean"})


def test_a_bad_schema_file_names_itself(demo, tmp_path):
    """The run's schema unreadable: the run stops before any round, naming the file; a
    site's own copy broken: that site fails its start naming the file and the key, and
    the run goes on without it."""
    out, schema_path, paths = demo
    config = {"n-clusters": 4, "central-baseline": False, "every-site": False, "output-dir": str(tmp_path / "out")}
    with pytest.raises(FederationError, match=r"run config 'schema': .*nowhere.toml: cannot read"):
        run_in_process(_nodes(schema_path, paths, tmp_path / "c"),
                       {**config, "schema": str(tmp_path / "nowhere.toml")})
    broken = tmp_path / "broken-schema.toml"
    broken.write_text(schema_path.read_text().replace('type = "id"', 'type = "identifier"', 1))
    nodes = _nodes(schema_path, paths, tmp_path / "c")
    nodes[2]["schema-path"] = str(broken)
    result = run_in_process(nodes, {**config, "schema": str(schema_path)})
    reason = result.metrics["rejected-sites"]["2"]
    assert "schema-path" in reason and str(broken) in reason and "columns.0.type" in reason


def test_an_imputing_run_resumes_from_its_checkpoint(tmp_path, monkeypatch):
    """The fill is part of the checkpointed state, and the schema is checked by its
    content: simulate writes its schema file anew for the resumed run (another path, the
    same hash), which resumes; a schema of other content is refused, both hashes named."""
    from fedcluster import simulation
    from fedcluster.common.config import ConfigError
    from test_checkpoint import ServerKilled, crashing_grid

    arrays, _ = _plain_sites(tmp_path)
    config = {"n_clusters": 3, "num_rounds": 6, "tol": 0.0, "min_sites": 3, "seed": 2,
              "scale": "standard", "output_dir": str(tmp_path)}
    whole = fedcluster.simulate(arrays, missing="impute-mean", run_name="whole", **config)
    monkeypatch.setattr(simulation, "InProcessGrid", crashing_grid(3))
    with pytest.raises(ServerKilled):
        fedcluster.simulate(arrays, missing="impute-mean", run_name="stopped", **config)
    monkeypatch.undo()
    resumed = fedcluster.simulate(arrays, missing="impute-mean", run_name="resumed",
                                  resume_from=str(tmp_path / "stopped"), **config)
    np.testing.assert_array_equal(resumed.centroids, whole.centroids)
    np.testing.assert_array_equal(resumed.model.scaling.fill, whole.model.scaling.fill)
    assert [h["task"] for h in resumed.history][3] == "describe"
    with pytest.raises(ConfigError, match=r"the run's schema is sha256 [0-9a-f]{64}, the "
                                          r"checkpointed run's sha256 [0-9a-f]{64}"):
        fedcluster.simulate(arrays, missing="drop-row", run_name="other",
                            resume_from=str(tmp_path / "stopped"), **config)

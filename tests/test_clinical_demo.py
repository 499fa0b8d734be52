"""The seeded synthetic clinical demo (issue 20): its schema parses, every site's table
encodes against it (shuffled columns, an alias, an unlisted ward, other units), missing
cells where and as often as promised, determinism, and `fedcluster partition --dataset
clinical`."""

from __future__ import annotations

import csv
import re
import tomllib

import numpy as np
import pytest

from fedcluster.cli import main
from fedcluster.client_app.data.table_files import read_table
from fedcluster.common import clinical_demo
from fedcluster.common.clinical_demo import clinical_schema_toml, make_clinical, write_clinical
from fedcluster.common.schema import load_schema, parse_schema, split_unit
from fedcluster.common.table_encoding import encode_table

LABS = ["glucose", "creatinine", "hba1c", "cholesterol", "hdl", "ldl", "triglycerides", "crp",
        "haemoglobin", "sodium", "potassium", "systolic_bp", "bmi"]
COMPLETE = ["patient_id", "phenotype", "age", "sex", "ward"]
# The physical factors, written here independently of the module's constants.
OTHER = {"glucose": ("mmol/L", 18.016), "creatinine": ("umol/L", 0.011312)}


@pytest.fixture(scope="module")
def schema():
    return parse_schema(tomllib.loads(clinical_schema_toml()), "clinical")


def _columns(rows):
    return [list(col) for col in zip(*rows)]


def _by_name(header, rows, schema):
    """Schema column name -> its cells, through the header's names, aliases and units."""
    names = {}
    for column in schema.columns:
        for name in (column.name, *column.aliases):
            names[name.casefold()] = column.name
    cols = _columns(rows)
    return {names[split_unit(h)[0].casefold()]: cols[j] for j, h in enumerate(header)}


def test_the_schema_lists_the_agreed_columns(schema):
    by_name = {c.name: c for c in schema.columns}
    assert len(schema.columns) == 19
    assert by_name["patient_id"].type == "id" and by_name["phenotype"].type == "label"
    assert by_name["glucose"].unit == "mg/dL" and by_name["glucose"].units == {"mmol/L": 18.016}
    assert by_name["creatinine"].units == {"umol/L": 0.011312}
    assert by_name["ward"].other == "other" and "icu" not in by_name["ward"].categories
    assert schema.missing == "impute-mean" and schema.policy(by_name["smoking"]) == "impute-mean"
    assert all(by_name[lab].type == "numeric" and by_name[lab].unit and by_name[lab].range
               for lab in LABS)


@pytest.mark.parametrize("n_sites, seed", [(3, 0), (4, 1), (1, 7)])
def test_every_site_encodes_against_the_schema(schema, n_sites, seed):
    tables = make_clinical(n_sites, seed)
    assert len(tables) == n_sites
    for i, (header, rows) in enumerate(tables):
        # no declared units: the last site's header says which units it writes in
        table = encode_table(header, _columns(rows), schema, f"site-{i}")
        assert table.X.shape == (len(rows), len(schema.feature_names()))
        assert table.rows_dropped == 0
        assert set(table.labels) == set(clinical_demo.PHENOTYPES)  # every phenotype, every site
        cells = _by_name(header, rows, schema)
        for lab in LABS:  # missing cells stay NaN for the pooled imputation
            assert table.cells_missing[lab] == sum(c == "" for c in cells[lab])


def test_missing_cells_only_where_and_as_often_as_promised(schema):
    for header, rows in make_clinical(4, 3):
        cells = _by_name(header, rows, schema)
        for lab in LABS:
            assert 0.05 <= sum(c == "" for c in cells[lab]) / len(rows) <= 0.30, lab
        for name in COMPLETE:
            assert all(c.strip() for c in cells[name]), name
        assert 0 < sum(c == "" for c in cells["smoking"]) / len(rows) <= 0.20


def test_sites_differ_in_order_size_mix_alias_and_ward_names(schema):
    tables = make_clinical(3, 0)
    orders = [tuple(split_unit(h)[0] for h in header) for header, _ in tables]
    assert len(set(orders)) == 3
    sizes = [len(rows) for _, rows in tables]
    assert len(set(sizes)) == 3 and all(300 <= n <= 700 for n in sizes)
    headers = [set(header) for header, _ in tables]
    assert "hemoglobin" in headers[0] and "haemoglobin" not in headers[0]
    assert all("haemoglobin" in h for h in headers[1:])
    ids = [_by_name(h, rows, schema)["patient_id"] for h, rows in tables]
    for i, site_ids in enumerate(ids):
        assert len(set(site_ids)) == len(site_ids)
        assert all(re.fullmatch(rf"H{i + 1}-\d{{6}}", x) for x in site_ids)
    # site 1 names a ward the schema does not list; it encodes as `other`
    header, rows = tables[1]
    wards = _by_name(header, rows, schema)["ward"]
    assert "icu" in wards and "other" not in wards
    table = encode_table(header, _columns(rows), schema, "site-1")
    other = table.X[:, schema.feature_names().index("ward=other")]
    assert other.sum() == wards.count("icu") > 0


def test_phenotype_mixes_are_mildly_skewed(schema):
    shares = np.array([[sum(r == p for r in _by_name(h, rows, schema)["phenotype"]) / len(rows)
                        for p in clinical_demo.PHENOTYPES] for h, rows in make_clinical(6, 0)])
    spread = (shares.max(axis=0) - shares.min(axis=0)).max()
    # equal mixes would spread by sampling alone (about 0.07 here); a mild skew, not
    # disjoint populations, stays well short of one phenotype's whole share
    assert 0.12 < spread < 0.35
    assert shares.min() >= 0.04


@pytest.mark.parametrize("median", [1e9, 1e-9])
def test_values_at_a_range_bound_stay_inside_after_conversion(schema, monkeypatch, median):
    """Every generated value at the bound of its range (far-off medians, no spread) still
    encodes, in the last site's units too: the clip keeps the round trip inside the range."""
    labs = {name: (*spec[:3], (median,) * 4, 0.0) for name, spec in clinical_demo._LABS.items()}
    monkeypatch.setattr(clinical_demo, "_LABS", labs)
    for i, (header, rows) in enumerate(make_clinical(2, 0)):
        encode_table(header, _columns(rows), schema, f"site-{i}")


def test_the_last_site_writes_other_units_that_convert_back(schema):
    sites = clinical_demo._generate(3, 0)  # the values generated, in mg/dL
    tables = make_clinical(3, 0)
    (header, rows), truth = tables[-1], sites[-1].columns
    assert "glucose [mmol/L]" in header and "creatinine [umol/L]" in header
    assert [h for h in header if "[" in h] == [h for h in header if h.split()[0] in OTHER]
    encoded = encode_table(header, _columns(rows), schema, "site-2")
    for name, (unit, factor) in OTHER.items():
        cells = _columns(rows)[header.index(f"{name} [{unit}]")]
        written = np.array([float(c) if c else np.nan for c in cells])
        # the test's own factor: a module factor off by 10% fails here ...
        np.testing.assert_allclose(written * factor, truth[name], rtol=1e-8)
        # ... and a schema factor off by 10% here
        got = encoded.X[:, schema.feature_names().index(name)]
        np.testing.assert_allclose(got, truth[name], rtol=1e-8)
    # the other sites write mg/dL as generated
    header, rows = tables[0]
    glucose = [float(c) if c else np.nan for c in _columns(rows)[header.index("glucose")]]
    np.testing.assert_array_equal(glucose, sites[0].columns["glucose"])
    # plausible: the mmol/L site's reference-phenotype glucose is a normal fasting mg/dL
    ref = encoded.X[encoded.labels == "reference", schema.feature_names().index("glucose")]
    assert 85 < np.nanmedian(ref) < 100


def test_clusters_are_meaningful(schema):
    """The phenotypes are distinct lab profiles: k-means on the pooled, imputed, scaled table
    recovers them far better than chance."""
    from sklearn.cluster import KMeans
    from sklearn.metrics import adjusted_rand_score

    tables = [encode_table(h, _columns(r), schema, "s") for h, r in make_clinical(3, 0)]
    X = np.vstack([t.X for t in tables])
    y = np.concatenate([t.labels for t in tables])
    X = np.where(np.isnan(X), np.nanmean(X, axis=0), X)
    Z = (X - X.mean(axis=0)) / X.std(axis=0)
    assert adjusted_rand_score(y, KMeans(4, n_init=5, random_state=0).fit_predict(Z)) > 0.5


def test_written_files_are_deterministic_and_read_back(tmp_path, schema):
    a = write_clinical(tmp_path / "a", 3, 0)
    b = write_clinical(tmp_path / "b", n_sites=3, seed=0)
    c = write_clinical(tmp_path / "c", n_sites=3, seed=1)
    assert [p.name for p in a] == ["schema.toml", "site-0.csv", "site-1.csv", "site-2.csv"]
    assert [p.read_bytes() for p in a] == [p.read_bytes() for p in b]
    assert [p.read_bytes() for p in a[1:]] != [p.read_bytes() for p in c[1:]]
    assert all(p.read_bytes() != q.read_bytes() for p, q in zip(a[1:], c[1:]))
    assert load_schema(a[0]) == schema
    for path, (header, rows) in zip(a[1:], make_clinical(3, 0)):
        read_header, columns = read_table(path)  # the site's own reader
        assert read_header == header and columns == _columns(rows)
        encode_table(read_header, columns, schema, str(path))


@pytest.mark.parametrize("bad", [0, -1, 2.0, True])
def test_n_sites_must_be_a_positive_integer(tmp_path, bad):
    with pytest.raises(ValueError, match="n_sites >= 1"):
        make_clinical(bad)
    with pytest.raises(ValueError, match="n_sites >= 1"):
        write_clinical(tmp_path / "never", bad)
    assert not (tmp_path / "never").exists()


def test_cli_partition_writes_the_clinical_demo(tmp_path, capsys):
    out = tmp_path / "sites"
    assert main(["partition", "--dataset", "clinical", "--num-sites", "3", "--seed", "0",
                 "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["schema.toml", "site-0.csv", "site-1.csv",
                                                     "site-2.csv"]
    printed = capsys.readouterr().out
    for i, (_, rows) in enumerate(make_clinical(3, 0)):
        assert f"{out / f'site-{i}.csv'}: {len(rows)} rows" in printed
        with open(out / f"site-{i}.csv", encoding="utf-8", newline="") as f:
            assert sum(1 for _ in csv.reader(f)) == len(rows) + 1
    assert str(out / "schema.toml") in printed
    # the site's own check accepts each file against the written schema
    for i in range(3):
        assert main(["site", "check", str(out / f"site-{i}.csv"),
                     "--schema", str(out / "schema.toml")]) == 0


def test_cli_partition_clinical_rejects_a_partitioning(tmp_path, capsys):
    code = main(["partition", "--dataset", "clinical", "--partitioning", "dirichlet:0.5",
                 "--out", str(tmp_path / "never")])
    assert code == 2
    assert "--partitioning does not apply to --dataset clinical" in capsys.readouterr().err
    assert not (tmp_path / "never").exists()
    assert main(["partition", "--dataset", "clinical", "--num-sites", "0",
                 "--out", str(tmp_path / "never")]) == 2
    assert "n_sites >= 1" in capsys.readouterr().err

"""`Model.predict_table` and `fedcluster predict` on a raw hospital table (issue 20): the
model holds its run's schema and labels a table as the run encoded, imputed and scaled it;
rows dropped by drop-row are accounted for; a table that does not fit, a model without a
schema and a cell left unfilled are errors that say so."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from fedcluster.cli import main
from fedcluster.client_app.data.table_files import read_table
from fedcluster.common.clinical_demo import write_clinical
from fedcluster.common.datasets import SiteDataError
from fedcluster.common.model import Model, TablePrediction
from fedcluster.common.schema import load_schema, parse_schema, schema_hash
from fedcluster.common.table_encoding import encode_table
from fedcluster.simulation import run_in_process

GLUCOSE_MMOL = 18.016  # the demo schema's factor: mmol/L -> mg/dL


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A run on the clinical demo's 3 sites through its schema, standardised."""
    tmp = tmp_path_factory.mktemp("predict-table")
    schema_path, *paths = write_clinical(tmp / "demo", n_sites=3, seed=0)
    nodes = [{"data-path": str(p), "schema-path": str(schema_path), "site-id": str(i),
              "cache-dir": str(tmp / "cache")} for i, p in enumerate(paths)]
    result = run_in_process(nodes, {
        "n-clusters": 4, "schema": str(schema_path), "scale": "standard", "num-rounds": 3,
        "central-baseline": False, "output-dir": str(tmp / "out"), "run-name": "r"})
    model_path = tmp / "out" / "r" / "model.json"
    return tmp, schema_path, paths, result.model, model_path


def _by_hand(model: Model, schema, header, columns) -> np.ndarray:
    """encode_table, the run's transform (fill, then scale), nearest centroid by numpy."""
    Z = model.scaling.apply(encode_table(header, columns, schema, "by hand").X)
    assert not np.isnan(Z).any()
    d2 = ((Z[:, None, :] - model.centroids[None, :, :]) ** 2).sum(axis=2)
    return np.argmin(d2, axis=1)


def _write(path, header, columns):
    with open(path, "w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(zip(*columns))
    return path


def _in_mmol(header, columns, suffix=True):
    """The table with glucose written in mmol/L (ten significant digits) and its columns
    in another order."""
    j = [h.split(" [")[0] for h in header].index("glucose")
    assert header[j] == "glucose"  # (sites 0 and 1 write mg/dL)
    header, columns = list(header), [list(c) for c in columns]
    columns[j] = [format(float(c) / GLUCOSE_MMOL, ".10g") if c.strip() else c for c in columns[j]]
    header[j] = "glucose [mmol/L]" if suffix else "glucose"
    order = np.random.default_rng(7).permutation(len(header))
    return [header[i] for i in order], [columns[i] for i in order]


@pytest.mark.parametrize("site", [0, 1, 2])
def test_predict_table_equals_encoding_imputing_and_scaling_by_hand(trained, site):
    tmp, schema_path, paths, model, _ = trained
    assert model.schema == load_schema(schema_path).model_dump(mode="json", by_alias=True)
    header, columns = read_table(paths[site])  # site 0: an alias; site 2: other units
    result = model.predict_table(header, columns, source=str(paths[site]))
    assert isinstance(result, TablePrediction) and result.kept.all()
    assert result.dropped_rows.size == 0 and len(result.labels) == len(columns[0])
    expected = _by_hand(model, load_schema(schema_path), header, columns)
    np.testing.assert_array_equal(result.labels, expected)
    np.testing.assert_array_equal(result.by_row(), expected)
    assert len(np.unique(result.labels)) > 1


def test_column_order_and_units_do_not_change_the_labels(trained):
    tmp, schema_path, paths, model, _ = trained
    header, columns = read_table(paths[0])
    expected = model.predict_table(header, columns).labels
    moved = _in_mmol(header, columns)
    assert moved[0] != header and "glucose [mmol/L]" in moved[0]
    np.testing.assert_array_equal(model.predict_table(*moved).labels, expected)
    # the unit given as an argument instead of a header suffix
    bare = _in_mmol(header, columns, suffix=False)
    np.testing.assert_array_equal(
        model.predict_table(*bare, units={"glucose": "mmol/L"}).labels, expected)
    with pytest.raises(SiteDataError, match="column 'glucose': .* is outside the schema's range"):
        model.predict_table(*bare)  # mmol/L values read as mg/dL


def test_model_json_keeps_the_schema_and_old_files_still_load(trained, tmp_path):
    tmp, schema_path, paths, model, model_path = trained
    loaded = Model.load(model_path)
    data = json.loads(model_path.read_text())
    schema = load_schema(schema_path)
    assert data["schema"] == schema.model_dump(mode="json", by_alias=True) == loaded.schema
    assert schema_hash(parse_schema(loaded.schema)) == schema_hash(schema)
    assert schema_hash(schema) == loaded.metrics["table"]["schema-hash"]
    assert loaded.feature_names == schema.feature_names()
    header, columns = read_table(paths[1])
    np.testing.assert_array_equal(loaded.predict_table(header, columns).labels,
                                  model.predict_table(header, columns).labels)
    # a model.json from before the schema field: loads, and says why it cannot read a table
    del data["schema"]
    old = Model.from_json(json.dumps(data))
    assert old.schema is None
    with pytest.raises(ValueError, match="trained without a schema"):
        old.predict_table(header, columns)
    data["schema"] = {"columns": []}  # a broken schema is refused at load, naming the key
    with pytest.raises(ValueError, match="columns"):
        Model.from_json(json.dumps(data))


def test_a_model_without_a_schema_says_so(tmp_path, capsys):
    model = Model(centroids=np.zeros((2, 3)), algorithm="dwf")
    with pytest.raises(ValueError, match=r"this model was trained without a schema \(run config "
                                         r"`schema`\), so it cannot read a raw table"):
        model.predict_table(["a", "b", "c"], [["1"], ["2"], ["3"]])
    model.save(tmp_path / "model.json")
    (tmp_path / "rows.csv").write_text("a,b,c\n1,2,3\n")
    assert main(["predict", "--model", str(tmp_path / "model.json"), "--data",
                 str(tmp_path / "rows.csv"), "--units", "a=mg", "--out", str(tmp_path / "o")]) == 2
    assert "--units is for a model trained with a schema" in capsys.readouterr().err


def test_an_unknown_category_names_row_column_and_value(trained, tmp_path, capsys):
    tmp, schema_path, paths, model, model_path = trained
    header, columns = read_table(paths[1])
    j = header.index("sex")
    columns[j][4] = "unknown-sex"
    with pytest.raises(SiteDataError, match=r"^ward-1.csv: row 5, column 'sex': 'unknown-sex' "
                                            r"is not one of the schema's categories"):
        model.predict_table(header, columns, source="ward-1.csv")
    broken = _write(tmp_path / "broken.csv", header, columns)
    assert main(["predict", "--model", str(model_path), "--data", str(broken),
                 "--out", str(tmp_path / "labels.csv")]) == 2
    assert "broken.csv: row 5, column 'sex': 'unknown-sex' is not one of" in capsys.readouterr().err
    assert not (tmp_path / "labels.csv").exists()


def test_cli_predict_reads_a_raw_csv_through_the_schema(trained, tmp_path, capsys):
    tmp, schema_path, paths, model, model_path = trained
    header, columns = read_table(paths[2])
    expected = model.predict_table(header, columns).labels
    out = tmp_path / "labels.csv"
    assert main(["predict", "--model", str(model_path), "--data", str(paths[2]),
                 "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == f"{out}: {len(expected)} labels"
    # issue 70: the schema's id column heads each line, with the data row (1-based)
    written = list(csv.reader(out.read_text().splitlines()))
    id_name = next(h for h in header if h.casefold() == "patient_id")
    assert written[0] == [id_name, "row", "cluster"]
    ids = columns[header.index(id_name)]
    assert written[1:] == [[str(i), str(r + 1), str(c)] for r, (i, c) in enumerate(zip(ids, expected))]
    # --units for a file whose header does not say; columns in another order
    bare = _write(tmp_path / "bare.csv", *_in_mmol(*read_table(paths[0]), suffix=False))
    assert main(["predict", "--model", str(model_path), "--data", str(bare), "--units",
                 "glucose=mmol/L", "--out", str(out)]) == 0
    np.testing.assert_array_equal(np.loadtxt(out, delimiter=",", skiprows=1, usecols=2, dtype=int),
                                  model.predict_table(*read_table(paths[0])).labels)
    # the schema names the columns: the options of a model without one are refused
    assert main(["predict", "--model", str(model_path), "--data", str(paths[0]),
                 "--id-column", "patient_id", "--out", str(out)]) == 2
    assert "--id-column: the model's schema names the columns" in capsys.readouterr().err


def _variant(model_path, tmp_path, column: str, missing: str | None, fill) -> Model:
    """The trained model.json with one column's missing policy and fill value changed."""
    data = json.loads(model_path.read_text())
    for entry in data["schema"]["columns"]:
        if entry["name"] == column:
            entry["missing"] = missing
    data["scaling"]["fill"][data["feature_names"].index(column)] = fill
    path = tmp_path / f"model-{column}-{missing}.json"
    path.write_text(json.dumps(data))
    return Model.load(path)


def test_rows_dropped_by_drop_row_are_accounted_for(trained, tmp_path, capsys):
    tmp, schema_path, paths, model, model_path = trained
    dropping = _variant(model_path, tmp_path, "crp", "drop-row", None)  # as a run would give
    header, columns = read_table(paths[1])
    present = np.array([c.strip() != "" for c in columns[header.index("crp")]])
    assert 0 < (~present).sum() < len(present)
    result = dropping.predict_table(header, columns)
    np.testing.assert_array_equal(result.kept, present)
    np.testing.assert_array_equal(result.dropped_rows, np.flatnonzero(~present))
    schema = parse_schema(dropping.schema)
    encoded = encode_table(header, columns, schema, "by hand")  # the run's own dropping
    assert encoded.rows_dropped == (~present).sum() and len(encoded.X) == len(result.labels)
    np.testing.assert_array_equal(result.labels, _by_hand(dropping, schema, header, columns))
    np.testing.assert_array_equal(result.by_row()[present], result.labels)
    assert (result.by_row()[~present] == -1).all()
    # the CLI writes one line per data row, -1 for a dropped one, and names them
    out = tmp_path / "labels.csv"
    assert main(["predict", "--model", str(tmp_path / "model-crp-drop-row.json"),
                 "--data", str(paths[1]), "--out", str(out)]) == 0
    np.testing.assert_array_equal(np.loadtxt(out, delimiter=",", skiprows=1, usecols=2, dtype=int),
                                  result.by_row())
    first = int(np.flatnonzero(~present)[0]) + 1
    said = capsys.readouterr().out
    assert f"{present.sum()} labels; {(~present).sum()} row(s) dropped" in said
    assert f"written as -1 (data rows {first}, " in said
    # every row dropped: the error encode_table gives
    columns[header.index("crp")] = [""] * len(present)
    with pytest.raises(SiteDataError, match="every one of its .* rows has a missing cell"):
        dropping.predict_table(header, columns)


def test_no_row_is_assigned_with_a_cell_left_missing(trained, tmp_path):
    tmp, schema_path, paths, model, model_path = trained
    # a model.json whose run did not impute crp (no fill) but whose schema says impute:
    # the cell would stay NaN; it is named instead of assigned
    unfilled = _variant(model_path, tmp_path, "crp", "impute-mean", None)
    header, columns = read_table(paths[0])
    first = next(i for i, c in enumerate(columns[header.index("crp")]) if not c.strip()) + 1
    with pytest.raises(ValueError, match=rf"^site-0: row {first}: feature 'crp' is missing and "
                                         "the model has no value to fill it with"):
        unfilled.predict_table(header, columns, source="site-0")
    # missing = "error": encode_table names the first missing cell
    strict = _variant(model_path, tmp_path, "crp", "error", None)
    with pytest.raises(SiteDataError, match=rf"row {first}, column 'crp': the cell is missing"):
        strict.predict_table(header, columns)


def test_predict_takes_a_dataframe_and_arrays_with_missing_cells(trained):
    """Model.predict: a pandas DataFrame goes through the schema (as predict_table); an
    encoded array with NaN takes the run's fill; a NaN the fill does not cover is an
    error naming the row and feature, never a label."""
    import pandas as pd

    tmp, schema_path, paths, model, _ = trained
    header, columns = read_table(paths[1])
    frame = pd.DataFrame({name: cells for name, cells in zip(header, columns)})
    np.testing.assert_array_equal(model.predict(frame),
                                  model.predict_table(header, columns).by_row(dropped=-1))
    X = encode_table(header, columns, load_schema(schema_path), "t").X
    assert np.isnan(X).any()
    np.testing.assert_array_equal(model.predict(X), _by_hand(model, load_schema(schema_path),
                                                             header, columns))
    # to_sklearn fills as the model does (a first pipeline step), and survives pickling.
    import pickle

    pipeline = pickle.loads(pickle.dumps(model.to_sklearn()))
    assert [name for name, _ in pipeline.steps] == ["fill", "scale", "kmeans"]
    np.testing.assert_array_equal(pipeline.predict(X), model.predict(X))
    indicator = model.feature_names.index("smoking missing")  # not imputed: never missing
    X[4, indicator] = np.nan
    with pytest.raises(ValueError, match=r"data row 5, smoking missing: the cell is missing"):
        model.predict(X)
    with pytest.raises(ValueError, match="NaN"):  # the cell the run did not impute
        pipeline.predict(X)

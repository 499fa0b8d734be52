"""A site's table read through a schema (``client_app/data/table_files.py``, issue 20): the same
table as a CSV file and as a Parquet file encodes identically; a Parquet file's column
types, its errors (each naming the file, and the column where there is one), and pyarrow
imported only when a Parquet file is read (the ``parquet`` extra)."""

from __future__ import annotations

import ast
import csv
import re
import sys
from importlib.metadata import version
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fedcluster.cli import main
from fedcluster.client_app.data import table_files
from fedcluster.client_app.data.table_files import TABLE_SUFFIXES, read_table
from fedcluster.common.datasets import SiteDataError
from fedcluster.common.schema import parse_schema
from fedcluster.common.table_encoding import encode_table
from test_schema import SCHEMA_TOML

ROOT = Path(__file__).resolve().parents[1]

SCHEMA = parse_schema({
    "missing": "impute-mean",
    "columns": [
        {"name": "patient_id", "type": "id"},
        {"name": "glucose", "aliases": ["glu"], "unit": "mg/dL", "units": {"mmol/L": 18.016},
         "range": [10, 1000], "out-of-range": "clip"},
        {"name": "age", "range": [0, 120]},
        {"name": "visits", "missing": "drop-row"},
        {"name": "bmi", "missing-indicator": True},
        {"name": "smoking", "type": "categorical",
         "categories": ["never", "former", "current", "unknown"], "other": "unknown",
         "missing-indicator": True},
        {"name": "cohort", "type": "label"},
    ],
})


def synthetic(n: int = 300, seed: int = 7) -> dict[str, list]:
    """A hospital table with None where a cell is missing: floats (glucose in mmol/L with
    values past the range, bmi), integers (age without a missing cell, visits with some),
    a text category with unlisted levels, an integer label and a text id."""
    rng = np.random.default_rng(seed)

    def holes(values, share):
        return [None if rng.random() < share else v for v in values]

    return {
        "patient_id": [f"p{i:04d}" for i in range(n)],
        "Glu [mmol/L]": holes((rng.lognormal(1.7, 0.5, n) * rng.choice([1, 30], n, p=[.95, .05])).tolist(), 0.1),
        "AGE": rng.integers(0, 100, n).tolist(),
        "visits": holes(rng.integers(0, 20, n).tolist(), 0.05),
        "bmi": holes(rng.normal(27, 5, n).tolist(), 0.2),
        "smoking": holes(rng.choice(["never", "former", "current", "vaper"], n).tolist(), 0.15),
        "cohort": rng.integers(1, 4, n).tolist(),
    }


def write_csv(path: Path, table: dict[str, list], missing: str = "") -> Path:
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(table)
        for row in zip(*table.values()):
            writer.writerow([missing if v is None else repr(v) if isinstance(v, float) else v
                             for v in row])
    return path


def write_parquet(path: Path, table: dict[str, list], types: dict | None = None, **kwargs) -> Path:
    types = types or {}
    pq.write_table(pa.table({k: pa.array(v, types.get(k)) for k, v in table.items()}), path,
                   **kwargs)
    return path


@pytest.mark.parametrize("missing", ["", "NA"])
def test_the_same_table_as_csv_and_as_parquet_encodes_identically(tmp_path, missing):
    table = synthetic()
    types = {"AGE": pa.int16(), "visits": pa.int64(), "smoking": pa.dictionary(pa.int8(), pa.string())}
    csv_path = write_csv(tmp_path / "site.csv", table, missing)
    parquet_path = write_parquet(tmp_path / "site.parquet", table, types, row_group_size=64)
    header_c, columns_c = read_table(csv_path)
    header_p, columns_p = read_table(parquet_path)
    assert header_p == header_c == list(table)
    # numbers as numpy arrays (float64 with NaN; an integer column without a null keeps its
    # integers), text as str with "" for a null (a CSV's empty cell)
    glucose, age, visits, smoking, cohort = (columns_p[header_p.index(k)] for k in
                                             ("Glu [mmol/L]", "AGE", "visits", "smoking", "cohort"))
    assert glucose.dtype == np.float64 and np.isnan(glucose).sum() == table["Glu [mmol/L]"].count(None) > 0
    assert age.dtype == np.int16 and cohort.dtype == np.int64
    assert visits.dtype == np.float64 and np.isnan(visits).sum() == table["visits"].count(None) > 0
    assert smoking.count("") == table["smoking"].count(None) > 0 and None not in smoking

    out_c = encode_table(header_c, columns_c, SCHEMA, "site.csv")
    out_p = encode_table(header_p, columns_p, SCHEMA, "site.parquet")
    assert out_p.names == out_c.names == SCHEMA.feature_names()
    np.testing.assert_array_equal(out_p.X, out_c.X, strict=True)  # NaN equal to NaN
    assert np.isnan(out_p.X).any() and out_p.rows_dropped == out_c.rows_dropped > 0
    np.testing.assert_array_equal(out_p.labels, out_c.labels, strict=True)
    assert set(out_p.labels) == {"1", "2", "3"}  # the integer label reads as the CSV's text
    assert out_p.blocks == out_c.blocks and out_p.cells_missing == out_c.cells_missing


def test_a_parquet_file_is_read_batch_by_batch(tmp_path, monkeypatch):
    """Across batches: an integer column with a null in a later batch only is float64 with
    NaN throughout; one without keeps its integers."""
    monkeypatch.setattr(table_files, "PARQUET_BATCH_ROWS", 3)
    path = write_parquet(tmp_path / "t.parquet", {
        "a": [1, 2, 3, 4, 5, None, 7], "b": [10, 20, 30, 40, 50, 60, 2**60],
        "c": ["x", "y", None, "z", "x", "y", "z"]})
    header, (a, b, c) = read_table(path)
    assert header == ["a", "b", "c"]
    np.testing.assert_array_equal(a, [1, 2, 3, 4, 5, np.nan, 7], strict=False)
    assert a.dtype == np.float64 and b.dtype == np.int64 and b[-1] == 2**60
    assert c == ["x", "y", "", "z", "x", "y", "z"]


def test_parquet_column_types(tmp_path):
    from decimal import Decimal

    path = write_parquet(tmp_path / "t.parquet", {
        "half": [1.5, None, 2.0], "dec": [Decimal("1.25"), None, Decimal("3.5")],
        "big": ["a", None, "b"], "flag": [True, None, False], "nothing": [None, None, None],
        "u8": [1, 2, 255]},
        {"half": pa.float16(), "dec": pa.decimal128(5, 2), "big": pa.large_string(),
         "nothing": pa.null(), "u8": pa.uint8()})
    header, columns = read_table(path)
    got = dict(zip(header, columns))
    np.testing.assert_array_equal(got["half"], [1.5, np.nan, 2.0], strict=False)
    np.testing.assert_array_equal(got["dec"], [1.25, np.nan, 3.5], strict=False)
    assert got["half"].dtype == got["dec"].dtype == np.float64 and got["u8"].dtype == np.uint8
    assert got["big"] == ["a", "", "b"]
    assert got["flag"] == ["true", "", "false"]  # booleans: a categorical's levels
    assert got["nothing"] == ["", "", ""]  # a column of nulls only: all missing


def test_a_boolean_column_is_a_categorical_with_levels_true_and_false(tmp_path):
    path = write_parquet(tmp_path / "t.parquet", {"x": [1.0, 2.0, 3.0], "diabetic": [True, False, None]})
    header, columns = read_table(path)
    as_category = parse_schema({"missing": "impute-mean", "columns": [
        {"name": "x"}, {"name": "diabetic", "type": "categorical", "categories": ["true", "false"]}]})
    out = encode_table(header, columns, as_category, str(path))
    np.testing.assert_array_equal(out.X, [[1, 1, 0], [2, 0, 1], [3, np.nan, np.nan]])
    as_number = parse_schema({"columns": [{"name": "x"}, {"name": "diabetic"}]})
    with pytest.raises(SiteDataError, match=r"row 1, column 'diabetic': 'true' is not a number"):
        encode_table(header, columns, as_number, str(path))


def test_a_parquet_column_of_another_type_is_named_with_its_type(tmp_path):
    import datetime

    path = write_parquet(tmp_path / "t.parquet", {"x": [1.0], "admitted": [datetime.date(2024, 5, 1)]})
    with pytest.raises(SiteDataError) as err:
        read_table(path)
    assert str(err.value).startswith(f"{path}: column 'admitted' has the Parquet type date32[day]")
    path = write_parquet(tmp_path / "l.parquet", {"codes": [[1, 2]]})
    with pytest.raises(SiteDataError, match=r"column 'codes' has the Parquet type list<"):
        read_table(path)


@pytest.mark.parametrize("content, reason", [
    (b"patient_id,glucose\np1,5\n", "Parquet magic bytes not found"),
    (b"", "Parquet file size is 0 bytes"),
])
def test_a_corrupt_parquet_file_is_an_error_naming_it(tmp_path, content, reason):
    path = tmp_path / "site.parquet"
    path.write_bytes(content)
    with pytest.raises(SiteDataError) as err:
        read_table(path)
    assert str(err.value).startswith(f"{path}: cannot be read as Parquet (")
    assert reason in str(err.value)


def test_a_truncated_parquet_file_is_an_error_naming_it(tmp_path):
    good = write_parquet(tmp_path / "good.parquet", synthetic(50))
    data = good.read_bytes()
    path = tmp_path / "site.parquet"
    path.write_bytes(data[: len(data) // 2] + data[-8:])  # its footer's length and magic kept
    with pytest.raises(SiteDataError, match=rf"^{re.escape(str(path))}: cannot be read as Parquet \("):
        read_table(path)


def test_an_empty_or_absent_parquet_file(tmp_path):
    path = write_parquet(tmp_path / "empty.parquet", {"glucose": []}, {"glucose": pa.float64()})
    with pytest.raises(SiteDataError, match=rf"^{re.escape(str(path))}: has no data rows$"):
        read_table(path)
    path = tmp_path / "absent.parquet"
    with pytest.raises(SiteDataError, match=rf"^{re.escape(str(path))}: cannot be read \(No such file"):
        read_table(path)


def test_without_pyarrow_the_error_names_the_extra_and_csv_still_reads(tmp_path, monkeypatch):
    parquet_path = write_parquet(tmp_path / "site.parquet", {"glucose": [1.0]})
    csv_path = write_csv(tmp_path / "site.csv", {"glucose": [1.0]})
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(SiteDataError) as err:
        read_table(parquet_path)
    assert str(err.value) == (f"{parquet_path}: reading Parquet needs pyarrow: "
                              "pip install 'fedcluster[parquet]'")
    assert read_table(csv_path) == (["glucose"], [["1.0"]])


def test_pyarrow_is_imported_only_when_a_parquet_file_is_read():
    source = Path(table_files.__file__)
    tree = ast.parse(source.read_text())
    top = {alias.name.split(".")[0] for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))
           for alias in (node.names if isinstance(node, ast.Import) else [ast.alias(node.module or "")])}
    assert "pyarrow" not in top
    inside = [node for node in ast.walk(tree) if isinstance(node, ast.Import)
              and any(a.name.startswith("pyarrow") for a in node.names)]
    assert inside  # imported in the functions that read Parquet


def test_an_unsupported_suffix_lists_parquet(tmp_path):
    path = tmp_path / "site.xlsx"
    path.write_bytes(b"")
    with pytest.raises(SiteDataError) as err:
        read_table(path)
    assert str(err.value) == (f"{path}: unsupported file type '.xlsx' for a table read through a "
                              "schema; supported: .csv, .tsv, .parquet")
    assert TABLE_SUFFIXES == (".csv", ".tsv", ".parquet")


def test_site_check_reads_a_parquet_file_as_it_reads_the_csv(tmp_path, capsys):
    """The check's table of the site_check tests, as CSV and as Parquet: the same report."""
    schema_path = tmp_path / "schema.toml"
    schema_path.write_text(SCHEMA_TOML)
    table = {"outcome": ["a", "b", "a", "b"], "smoking": ["never", "vaper", None, "former"],
             "Glu [mmol/L]": [5.0, None, 6.5, 7.0], "age": [40, 130, 61, None],
             "patient_id": ["p1", "p2", "p3", "p4"]}
    reports = {}
    for suffix, write in ((".csv", write_csv), (".parquet", write_parquet)):
        path = write(tmp_path / f"site{suffix}", table)
        # (exit 1: a run would refuse a site of 3 rows, min-site-rows; the report is whole)
        assert main(["site", "check", str(path), "--schema", str(schema_path)]) == 1
        reports[suffix] = capsys.readouterr().out.replace(str(path), "SITE")
    assert reports[".parquet"] == reports[".csv"]
    assert "SITE: 4 rows, 3 usable (1 dropped by drop-row), 7 encoded features" in reports[".parquet"]
    assert "smoking: never 1, former 1, current 0, unknown 0; unlisted (mapped to 'unknown'): vaper 1" \
        in reports[".parquet"]
    corrupt = tmp_path / "corrupt.parquet"
    corrupt.write_bytes(b"PAR1 not really")
    assert main(["site", "check", str(corrupt), "--schema", str(schema_path)]) == 2
    assert f"{corrupt}: cannot be read as Parquet" in capsys.readouterr().err


def test_the_container_image_pins_the_pyarrow_installed_here():
    """docker/requirements.txt brings pyarrow (the parquet extra) into the superexec image,
    where a site's ClientApps read its table: pinned to the version the tests ran with."""
    pins = dict(line.split("#")[0].strip().split("==")
                for line in (ROOT / "docker" / "requirements.txt").read_text().splitlines()
                if line.split("#")[0].strip())
    assert pins["pyarrow"] == version("pyarrow")


def test_a_parquet_data_path_without_a_schema_reads_as_its_csv(tmp_path):
    """A site's Parquet file with no schema-path: numeric features chosen by the node
    config's column keys, as the CSV of the same table gives them."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from fedcluster.client_app.data_sources import load_site
    from fedcluster.client_app.node_config import parse_node_config

    rng = np.random.default_rng(3)
    X = rng.normal(size=(40, 3))
    ids = [f"p{i}" for i in range(40)]
    labels = rng.integers(0, 3, 40)
    csv_path = tmp_path / "site.csv"
    csv_path.write_text("id,b,a,c,label\n" + "".join(
        f"{ids[i]},{float(X[i, 1])!r},{float(X[i, 0])!r},{float(X[i, 2])!r},{labels[i]}\n"
        for i in range(40)))
    parquet = tmp_path / "site.parquet"
    pq.write_table(pa.table({"id": ids, "b": X[:, 1], "a": X[:, 0], "c": X[:, 2],
                             "label": labels}), parquet)
    keys = {"id-column": "id", "label-column": "label", "columns": "a,c",
            "cache-dir": str(tmp_path / "cache")}
    from_csv, _ = load_site(parse_node_config({"data-path": str(csv_path), **keys}), {})
    from_parquet, _ = load_site(parse_node_config({"data-path": str(parquet), **keys}), {})
    np.testing.assert_array_equal(from_parquet.X, from_csv.X)
    np.testing.assert_array_equal(from_parquet.X, X[:, [0, 2]])
    assert from_parquet.feature_names == from_csv.feature_names == ("a", "c")
    np.testing.assert_array_equal(from_parquet.labels, from_csv.labels)
    assert from_parquet.table is None  # no schema: the run checks no schema hash
    missing = tmp_path / "missing.parquet"
    pq.write_table(pa.table({"a": [1.0, None, 2.0]}), missing)
    with pytest.raises(SiteDataError, match=r"row 2, column 'a': the cell is missing"):
        load_site(parse_node_config({"data-path": str(missing)}), {})


def test_integer_codes_with_nulls_match_the_schemas_levels(tmp_path):
    """A Parquet column of integer codes with a null reads as floats (3.0); as a
    category or a label it must still be "3", as its CSV writes it."""
    codes = pa.array([1, 2, None, 3, 1], pa.int64())
    label = pa.array([7, None, 7, 8, 8], pa.int64())
    path = tmp_path / "codes.parquet"
    pq.write_table(pa.table({"x": [0.5, 1.5, 2.5, 3.5, 4.5], "ward": codes, "y": label}), path)
    schema = parse_schema({"missing": "impute-mean", "columns": [
        {"name": "x"}, {"name": "ward", "type": "categorical", "categories": ["1", "2", "3"]},
        {"name": "y", "type": "label"}]})
    header, columns = read_table(path)
    table = encode_table(header, columns, schema, str(path))
    np.testing.assert_array_equal(table.X[[0, 1, 3], 1:], [[1, 0, 0], [0, 1, 0], [0, 0, 1]])
    assert np.isnan(table.X[2, 1:]).all()  # the null: missing, imputed later
    assert table.labels.tolist() == ["7", "", "7", "8", "8"]


def test_a_cells_error_names_its_data_row_and_the_files_line(tmp_path):
    """A quoted cell over two lines and a blank line before the bad row: the error names
    the data row (as a run counts rows) and the line it starts on (as an editor does),
    from the site's load and from `fedcluster site check`; a Parquet file keeps the row."""
    from fedcluster.client_app.data.schema_table import load_schema_table
    from fedcluster.client_app.site_check import check

    path = tmp_path / "site.csv"
    path.write_text('patient_id,glucose,age,visits,bmi,smoking,cohort\n'
                    'p1,90,40,2,22.5,"never",a\n'
                    '\n'
                    'p2,95,41,3,23.0,"former\nsmoker",b\n'
                    'p3,5000x,42,1,24.0,never,a\n')
    assert table_files.data_row_line(path, 1) == 2
    assert table_files.data_row_line(path, 3) == 6 and table_files.data_row_line(path, 4) is None
    message = (r"row 3, column 'glucose': '5000x' .*\(data row 3 starts on line 6 of "
               r"site\.csv\)")
    with pytest.raises(SiteDataError, match=message):
        load_schema_table(path, SCHEMA, cache_dir=tmp_path / "cache")
    with pytest.raises(SiteDataError, match=message):
        check(path, SCHEMA, cost=False)
    parquet = tmp_path / "site.parquet"
    pq.write_table(pa.table({"glucose": ["90", "5000x"]}), parquet)
    error = table_files.with_file_line(SiteDataError("x: row 2, column 'glucose': bad"), parquet)
    assert str(error) == "x: row 2, column 'glucose': bad"

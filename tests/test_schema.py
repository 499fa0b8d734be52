"""The table schema (issue 20): the file's validation, its hash, and a raw table encoded
against it (columns by name or alias in any order, units, ranges, categories, missing
cells), every failure naming file, row, column and value."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fedcluster.common.datasets import SiteDataError
from fedcluster.common.schema import (
    SchemaError, load_schema, parse_schema, schema_hash, split_unit,
)
from fedcluster.common.table_encoding import encode_table, impute

SCHEMA_TOML = """
missing = "impute-mean"

[[columns]]
name = "patient_id"
type = "id"

[[columns]]
name = "glucose"
aliases = ["glu"]
unit = "mg/dL"
units = { "mmol/L" = 18.0 }
range = [10, 1000]

[[columns]]
name = "age"
range = [0, 120]
out-of-range = "clip"
missing = "drop-row"

[[columns]]
name = "smoking"
type = "categorical"
categories = ["never", "former", "current", "unknown"]
other = "unknown"
missing-indicator = true

[[columns]]
name = "outcome"
type = "label"
"""


@pytest.fixture()
def schema(tmp_path):
    path = tmp_path / "schema.toml"
    path.write_text(SCHEMA_TOML)
    return load_schema(path)


def table(*rows, header=("patient_id", "glucose", "age", "smoking", "outcome")):
    return list(header), [list(col) for col in zip(*rows)]


def test_a_table_in_another_order_and_unit_encodes_as_the_schema_says(schema):
    header = ["outcome", "smoking", "Glu [mmol/L]", "AGE", "patient_id"]
    columns = [["a", "b", "a"], ["never", "vaper", ""], ["5", "NA", "6.5"], ["40", "130", "61"],
               ["p1", "p2", "p3"]]
    out = encode_table(header, columns, schema, "site.csv")
    assert out.names == ["glucose", "age", "smoking=never", "smoking=former", "smoking=current",
                         "smoking=unknown", "smoking missing"]
    np.testing.assert_allclose(out.X[:, 0], [90.0, np.nan, 117.0])  # mmol/L x 18 = mg/dL
    np.testing.assert_allclose(out.X[:, 1], [40.0, 120.0, 61.0])  # 130 clipped to the range
    np.testing.assert_array_equal(out.X[0, 2:], [1, 0, 0, 0, 0])
    np.testing.assert_array_equal(out.X[1, 2:], [0, 0, 0, 1, 0])  # unlisted -> other
    assert np.isnan(out.X[2, 2:6]).all() and out.X[2, 6] == 1.0  # missing, indicated
    assert out.cells_missing == {"glucose": 1, "age": 0, "smoking": 1}
    assert list(out.labels) == ["a", "b", "a"] and out.rows_dropped == 0
    filled = impute(out, schema, {"glucose": [100.0], "age": [50.0],
                                  "smoking": [0.5, 0.2, 0.2, 0.1]})
    assert filled[1, 0] == 100.0
    np.testing.assert_allclose(filled[2, 2:], [0.5, 0.2, 0.2, 0.1, 1.0])
    assert not np.isnan(filled).any()


def test_drop_row_drops_and_counts(schema):
    header, columns = table(("p1", "90", "", "never", "x"), ("p2", "95", "33", "former", "y"))
    out = encode_table(header, columns, schema, "s.csv")
    assert out.rows_dropped == 1 and out.X.shape == (1, 7) and list(out.labels) == ["y"]
    with pytest.raises(SiteDataError, match=r"s\.csv: every one of its 1 rows"):
        encode_table(*table(("p1", "90", "NA", "never", "x")), schema, "s.csv")


@pytest.mark.parametrize("cells, message", [
    (("p1", "abc", "40", "never", "x"), r"s\.csv: row 2, column 'glucose': 'abc' is not a number"),
    (("p1", "5000", "40", "never", "x"), r"row 2, column 'glucose': 5000 is outside the schema's "
                                         r"range \[10, 1000\] mg/dL"),
    (("p1", "inf", "40", "never", "x"), r"row 2, column 'glucose': inf is not a finite number"),
    (("p1", "1_000", "40", "never", "x"), r"'1_000' is not a number"),
])
def test_bad_cells_name_file_row_column_and_value(schema, cells, message):
    with pytest.raises(SiteDataError, match=message):
        encode_table(*table(("p0", "90", "40", "never", "x"), cells), schema, "s.csv")


def test_an_unknown_category_without_other_and_a_missing_cell_under_error(schema):
    data = json.loads(json.dumps(schema.model_dump(by_alias=True)))
    data["columns"][3]["other"] = None
    data["missing"] = "error"
    strict = parse_schema(data)
    with pytest.raises(SiteDataError, match=r"row 2, column 'smoking': 'vaper' is not one of the "
                                            r"schema's categories \(never, former"):
        encode_table(*table(("p0", "90", "40", "never", "x"), ("p1", "90", "40", "vaper", "x")),
                     strict, "s.csv")
    with pytest.raises(SiteDataError, match=r"row 1, column 'glucose': the cell is missing .*"
                                            r"policy for it is 'error'"):
        encode_table(*table(("p0", "", "40", "never", "x")), strict, "s.csv")


def test_columns_the_file_lacks_or_holds_twice_or_in_an_unknown_unit(schema):
    with pytest.raises(SiteDataError, match=r"s\.csv: the schema's column\(s\) 'age' are not in "
                                            r"the file"):
        encode_table(["patient_id", "glucose", "smoking", "outcome"],
                     [["p"], ["9"], ["never"], ["x"]], schema, "s.csv")
    with pytest.raises(SiteDataError, match=r"'glucose' and 'glu' are both the schema's 'glucose'"):
        encode_table(["patient_id", "glucose", "glu", "age", "smoking", "outcome"],
                     [["p"], ["90"], ["90"], ["4"], ["never"], ["x"]], schema, "s.csv")
    with pytest.raises(SiteDataError, match=r"'glucose' is in 'g/L', which the schema does not "
                                            r"convert \(accepted units: mg/dL, mmol/L\)"):
        encode_table(*table(("p", "1", "4", "never", "x"),
                            header=("patient_id", "glucose (g/L)", "age", "smoking", "outcome")),
                     schema, "s.csv")
    # a site may declare a column's unit in its node config instead of the header
    out = encode_table(*table(("p", "5", "4", "never", "x")), schema, "s.csv",
                       declared_units={"glucose": "mmol/L"})
    assert out.X[0, 0] == 90.0


def test_numbers_from_an_array_and_the_header_unit_suffix():
    schema = parse_schema({"columns": [{"name": "x", "unit": "cm", "units": {"mm": 0.1}},
                                       {"name": "t", "unit": "C", "units": {"F": 5 / 9},
                                        "unit-offsets": {"F": -160 / 9}, "missing": "impute-mean"}]})
    out = encode_table(["x (mm)", "t [F]"], [np.array([10.0, 25.0]), np.array([212.0, np.nan])],
                       schema, "frame")
    np.testing.assert_allclose(out.X, [[1.0, 100.0], [2.5, np.nan]])
    assert split_unit("glucose [mmol/L]") == ("glucose", "mmol/L")
    assert split_unit("weight") == ("weight", None)


@pytest.mark.parametrize("data, message", [
    ({"columns": []}, r"columns: .*at least 1"),
    ({"columns": [{"name": "a", "type": "categorical"}]}, r"'a': a categorical column needs its list"),
    ({"columns": [{"name": "a", "type": "categorical", "categories": ["x"], "other": "y"}]},
     r"other 'y' is not one of its categories"),
    ({"columns": [{"name": "a", "type": "categorical", "categories": ["x"],
                   "missing": "impute-median"}]}, r"a category has no median"),
    ({"columns": [{"name": "a", "units": {"b": 2.0}}]}, r"units converts to unit, which is not given"),
    ({"columns": [{"name": "a"}], "missing": "impute-median"}, r"'a': impute-median needs the column's range"),
    ({"columns": [{"name": "a", "type": "categorical", "categories": ["x"]}], "missing": "impute-median"},
     r"'a': a category has no median"),
    ({"columns": [{"name": "a", "range": [3, 1]}]}, r"range must be \[low, high\]"),
    ({"columns": [{"name": "a"}, {"name": "b", "aliases": ["A"]}]}, r"'A' is used by columns 'a' and 'b'"),
    ({"columns": [{"name": "a", "colour": "red"}]}, r"columns\.0\.colour: Extra inputs"),
    ({"columns": [{"name": "a", "type": "id"}]}, r"no column is numeric or categorical"),
    ({"columns": [{"name": "a"}], "missing": "guess"}, r"missing: Input should be"),
])
def test_a_bad_schema_is_refused_naming_the_key(data, message):
    with pytest.raises(SchemaError, match=message):
        parse_schema(data, "s.toml")


def test_the_hash_is_of_the_content_not_the_layout(tmp_path, schema):
    as_json = tmp_path / "schema.json"
    as_json.write_text(json.dumps(schema.model_dump(mode="json", by_alias=True), indent=3))
    assert schema_hash(load_schema(as_json)) == schema_hash(schema)
    data = schema.model_dump(mode="json", by_alias=True)
    data["columns"][1]["range"] = [10, 999]
    assert schema_hash(parse_schema(data)) != schema_hash(schema)
    (tmp_path / "bad.toml").write_text("columns = [")
    with pytest.raises(SchemaError, match=r"bad\.toml: not valid TOML"):
        load_schema(tmp_path / "bad.toml")
    with pytest.raises(SchemaError, match=r"nowhere\.toml: cannot read the schema file"):
        load_schema(tmp_path / "nowhere.toml")
    # the data file given where the schema goes: said so, not parsed as TOML
    (tmp_path / "site.csv").write_text("age,dose\n1,2\n")
    with pytest.raises(SchemaError, match=r"site\.csv: a schema file is \.toml or \.json, not '\.csv'"):
        load_schema(tmp_path / "site.csv")


def test_the_schema_reference_lists_the_texts_that_count_as_missing():
    """docs/reference/schema.md names every text a reader takes for a missing cell, and
    one it does not (a numeric column then names the row, the column and the text)."""
    import re
    from pathlib import Path

    from fedcluster.common.schema import MISSING_TOKENS
    from fedcluster.common.table_encoding import SiteDataError, _parsed

    page = (Path(__file__).resolve().parents[1] / "docs" / "reference" / "schema.md").read_text()
    section = page.split("## Missing cells", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"`([^`]+)`", section.split("(case as written")[0]))
    assert named == set(MISSING_TOKENS) - {""} and "empty" in section
    assert np.isnan(_parsed([f" {t} " for t in MISSING_TOKENS], "f.csv", "x", 0)).all()
    with pytest.raises(SiteDataError, match=r"f.csv: row 1, column 'x': 'na' is not a number"):
        _parsed(["na"], "f.csv", "x", 0)


def test_a_schema_names_its_own_missing_texts_and_keeps_its_hash_without(schema):
    """``missing-tokens``: the cell texts a schema reads as missing instead of the default
    list (an empty cell always is); a schema without the key hashes as before it existed
    (its canonical JSON has no such key), one with it has another hash."""
    data = schema.model_dump(mode="json", by_alias=True)
    assert "missing-tokens" in data and data["missing-tokens"] is None
    own = parse_schema({**data, "missing-tokens": ["-", "?"]})
    assert schema_hash(own) != schema_hash(schema)
    canonical = {k: v for k, v in data.items() if k != "missing-tokens"}
    assert schema_hash(parse_schema(canonical)) == schema_hash(schema)
    header, columns = table(("p1", "-", "40", "?", "a"), ("p2", "", "50", "never", "b"),
                            ("p3", "90", "60", "former", "a"))
    encoded = encode_table(header, columns, own, "site.csv")
    glucose = encoded.X[:, encoded.names.index("glucose")]
    assert np.isnan(glucose[:2]).all() and glucose[2] == 90.0  # "-" and "" are missing
    assert np.isnan(encoded.X[0, encoded.names.index("smoking=never")])  # "?" too
    # "NA" is no longer missing under this schema: a numeric column names it
    header, columns = table(("p1", "NA", "40", "never", "a"), ("p2", "80", "50", "never", "b"))
    with pytest.raises(SiteDataError, match=r"site\.csv: row 1, column 'glucose': 'NA' is not a number"):
        encode_table(header, columns, own, "site.csv")


def test_a_column_whose_rows_name_their_units_is_converted_row_by_row(schema):
    """``unit-column`` (issue 55: an OMOP cohort's units): each row's value converted
    from the unit its row names; a present value in a unit the column does not convert,
    or with none, is an error naming the row, column, unit and the units accepted (never
    pooled as the schema's unit); a header unit beside it is a contradiction; a schema
    without the key hashes as before it existed."""
    import hashlib

    data = schema.model_dump(mode="json", by_alias=True)
    legacy = json.loads(json.dumps(data))
    legacy.pop("missing-tokens")
    for column in legacy["columns"]:
        assert column.pop("unit-column") is None
    canonical = json.dumps(legacy, sort_keys=True, separators=(",", ":"))
    assert schema_hash(schema) == hashlib.sha256(canonical.encode()).hexdigest()
    data["columns"][1]["unit-column"] = "glucose unit"
    mixed = parse_schema(data)
    assert schema_hash(mixed) != schema_hash(schema)
    header = ("patient_id", "glucose", "age", "smoking", "outcome", "glucose unit")
    header_, columns = table(("p1", "12", "40", "never", "a", "mmol/L"),
                             ("p2", "99", "50", "never", "b", "mg/dL"),
                             ("p3", "", "60", "former", "a", ""), header=header)
    encoded = encode_table(header_, columns, mixed, "site.csv")
    glucose = encoded.X[:, encoded.names.index("glucose")]
    assert glucose[0] == 12 * 18.0 and glucose[1] == 99.0 and np.isnan(glucose[2])
    # the same table under the schema without unit-column would pool 12 mmol/L as mg/dL
    plain = encode_table(header_, columns, schema, "site.csv")
    plain = plain.X[:, plain.names.index("glucose")]
    assert plain[0] == 12.0
    for unit, expect in (("mg/L", r"5\.5 is in 'mg/L' \(1 row\(s\) in that unit\), which the "
                                  r"schema does not convert for 'glucose' \(accepted units: "
                                  r"mg/dL, mmol/L"),
                         ("", r"5\.5 has no unit in column 'glucose unit'")):
        _, bad = table(("p1", "5.5", "40", "never", "a", unit),
                       ("p2", "99", "50", "never", "b", "mg/dL"), header=header)
        with pytest.raises(SiteDataError, match=r"site\.csv: row 1, column 'glucose': " + expect):
            encode_table(header_, bad, mixed, "site.csv")
    with pytest.raises(SiteDataError, match=r"'glucose unit', which is not in the file"):
        encode_table(*table(("p1", "5.5", "40", "never", "a")), mixed, "site.csv")
    with pytest.raises(SiteDataError, match=r"gives one unit \('mmol/L'\) for the schema's "
                                            r"'glucose', whose rows name their own"):
        encode_table(["patient_id", "glucose [mmol/L]", *header[2:]], columns, mixed, "site.csv")
    data["columns"][1]["unit-column"] = "age"
    with pytest.raises(SchemaError, match=r"unit-column 'age' is a column of the schema"):
        parse_schema(data, "schema.toml")

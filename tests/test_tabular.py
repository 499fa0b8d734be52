"""Hospital-style tables: `columns` selects and orders features by header name, `id-column`
is dropped unread, and text columns are rejected with a message naming every one."""

import numpy as np
import pytest

from fedcluster.client_app.node_config import ConfigError, parse_node_config
from fedcluster.client_app.data.site_data import SiteDataError, cache_key, load_site_file
from fedcluster.simulation import run_in_process
from test_docs import same_words, shown

TABLE = (
    "patient_id,sex,age,bmi,ward,outcome\n"
    "P-001,F,63,31.5,east,1\n"
    "P-002,M,48,24.0,west,0\n"
    "P-003,F,71,28.25,east,1\n"
)


@pytest.fixture()
def table(tmp_path):
    path = tmp_path / "ward7.csv"
    path.write_text(TABLE)
    return path


def test_columns_select_and_order_features_by_name(table, tmp_path):
    site = load_site_file(table, cache_dir=tmp_path / "c", columns=("bmi", "age"),
                          id_column="patient_id", label_column="outcome")
    assert site.feature_names == ("bmi", "age")
    np.testing.assert_array_equal(site.X, [[31.5, 63], [24.0, 48], [28.25, 71]])
    assert site.labels.tolist() == [1, 0, 1]
    again = load_site_file(table, cache_dir=tmp_path / "c", columns=("bmi", "age"),
                           id_column="patient_id", label_column="outcome")
    assert isinstance(again.X, np.memmap) and again.feature_names == ("bmi", "age")


def test_text_columns_are_named_each_with_its_first_cell(table, tmp_path):
    with pytest.raises(SiteDataError) as info:
        load_site_file(table, cache_dir=tmp_path / "c", id_column="patient_id")
    message = str(info.value)
    assert message.startswith(f"{table}: columns 'sex', 'ward' are not numeric")
    # as docs/reference/node-config.md shows it (the file named as the site names it)
    assert same_words(message.replace(str(table), table.name),
                      shown("docs/reference/node-config.md", "ward7.csv"))
    assert "data row 1 (line 2), column 'sex': 'F' is not a number" in message
    assert "column 'ward': 'east' is not a number" in message
    assert "node-config key 'columns'" in message
    assert "patient_id" not in message  # the id column is dropped before anything else


def test_a_single_text_cell_in_a_numeric_column_is_named_by_row(tmp_path):
    path = tmp_path / "s.csv"
    path.write_text("age,bmi\n63,31.5\n48,n/a\n71,28\n")
    with pytest.raises(SiteDataError, match=r"column 'bmi' is not numeric \(data row 2 \(line 3\), "
                                            r"column 'bmi': 'n/a' is not a number\)"):
        load_site_file(path, cache_dir=tmp_path / "c")


@pytest.mark.parametrize("keys, message", [
    ({"columns": ("age", "height")}, "columns entry 'height' is not in the header (columns: patient_id, sex"),
    ({"id_column": "mrn"}, "id-column 'mrn' is not in the header"),
    ({"columns": ("age", "outcome"), "label_column": "outcome"}, "'outcome' is the label-column; it cannot also be in columns"),
    ({"columns": ("age", "patient_id"), "id_column": "patient_id"}, "'patient_id' is the id-column"),
    ({"id_column": "outcome", "label_column": "outcome"}, "both the id-column and the label-column"),
])
def test_column_keys_that_do_not_fit_the_header_are_named(table, tmp_path, keys, message):
    with pytest.raises(SiteDataError) as info:
        load_site_file(table, cache_dir=tmp_path / "c", **keys)
    assert message in str(info.value)


def test_the_cache_key_depends_on_the_column_keys(table):
    plain = cache_key(table)
    assert cache_key(table, columns=("age",)) != plain
    assert cache_key(table, columns=("age",)) != cache_key(table, columns=("bmi",))
    assert cache_key(table, id_column="patient_id") != plain


def test_node_config_columns_is_a_comma_separated_list():
    node = parse_node_config({"columns": " age, bmi ", "id-column": "patient_id"})
    assert node.columns == ("age", "bmi") and node.id_column == "patient_id"
    assert parse_node_config({"columns": ""}).columns is None
    with pytest.raises(ConfigError, match="node-config key 'columns'.*names age more than once"):
        parse_node_config({"columns": "age,age"})
    with pytest.raises(ConfigError, match="node-config key 'columns'.*empty column name"):
        parse_node_config({"columns": "age,,bmi"})


def test_npy_rejects_column_keys(tmp_path):
    path = tmp_path / "s.npy"
    np.save(path, np.ones((3, 2)))
    for key in ("columns", "id_column"):
        with pytest.raises(SiteDataError, match=f"{key.replace('_', '-')} needs a CSV file"):
            load_site_file(path, cache_dir=tmp_path / "c", **{key: ("a",) if key == "columns" else "a"})


def test_sites_with_columns_in_another_order_agree_by_name(tmp_path):
    """Two hospitals export the same fields in different orders (and one has an extra text
    column); `columns` lines them up, so the run admits both with the same features."""
    rng = np.random.default_rng(0)
    X = np.vstack([rng.normal(0, 1, (30, 2)), rng.normal(8, 1, (30, 2))])
    first, second = tmp_path / "a.csv", tmp_path / "b.csv"
    first.write_text("id,age,bmi\n" + "".join(f"a{i},{a:.17g},{b:.17g}\n" for i, (a, b) in enumerate(X[::2])))
    second.write_text("bmi,note,id,age\n" + "".join(f"{b:.17g},ok,b{i},{a:.17g}\n" for i, (a, b) in enumerate(X[1::2])))
    nodes = [{"data-path": str(path), "site-id": str(i), "cache-dir": str(tmp_path / "c"),
              "columns": "age,bmi", "id-column": "id"} for i, path in enumerate((first, second))]
    result = run_in_process(nodes, {"n-clusters": 2, "min-cluster-size": 1, "output-dir": ""})
    assert result.model.feature_names == ["age", "bmi"]
    assert result.metrics["n-sites"] == 2 and not result.metrics["rejected-sites"]
    assert sorted(np.round(result.centroids[:, 0])) == pytest.approx([0, 8], abs=1)


def test_column_keys_on_a_site_without_a_csv_are_refused():
    from fedcluster.strategies import FederationError

    nodes = [{"partition-id": i, "num-partitions": 2, "columns": "a,b"} for i in range(2)]
    with pytest.raises(FederationError, match="node-config key 'columns' selects columns of a CSV"):
        run_in_process(nodes, {"n-clusters": 2, "dataset": "blobs", "output-dir": ""})

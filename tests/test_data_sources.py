"""One choice of a site's data source (``client_app/data_sources.py``, issue 57): which
source each node config names, which of them are simulated or keep files, and the
refusals the choice makes."""

from __future__ import annotations

import pytest

from fedcluster.client_app import data_sources as ds
from fedcluster.client_app.data.site_data import SiteDataError
from fedcluster.client_app.node_config import parse_node_config


@pytest.mark.parametrize("config, missing, source", [
    ({"data-url": "sqlite:///site.db", "data-table": "t"}, "error", ds.DATABASE),
    ({"data-path": "memory://token/0"}, "error", ds.MEMORY),
    ({"data-path": "site.csv", "schema-path": "schema.toml"}, "error", ds.SCHEMA),
    ({"data-path": "site.parquet"}, "error", ds.TABLE),
    ({"data-path": "site.csv"}, "impute-mean", ds.TABLE),
    ({"data-path": "site.csv"}, "error", ds.FILE),
    ({"data-path": "site.npy"}, "impute-mean", ds.FILE),
    ({"partition-id": 1, "num-partitions": 3}, "error", ds.PARTITION),
])
def test_each_node_config_names_one_source(config, missing, source):
    assert ds.source_of(parse_node_config(config), missing) == source


def test_simulated_and_keeping_files_follow_the_source():
    memory = parse_node_config({"data-path": "memory://token/0"})
    partition = parse_node_config({"partition-id": 0, "num-partitions": 2})
    file = parse_node_config({"data-path": "site.csv"})
    database = parse_node_config({"data-url": "sqlite:///site.db", "data-table": "t"})
    assert ds.simulated(memory) and ds.simulated(partition)
    assert not ds.simulated(file) and not ds.simulated(database)
    assert not ds.keeps_files(memory) and not ds.keeps_files(partition)
    assert ds.keeps_files(file) and ds.keeps_files(database)
    # a deployed site whose node config also carries a partition-id reads its file, and
    # so draws fresh DP noise (a simulated site's is seeded by the run)
    both = parse_node_config({"data-path": "site.csv", "partition-id": 0, "num-partitions": 2})
    assert ds.source_of(both) == ds.FILE and not ds.simulated(both) and ds.keeps_files(both)


def test_a_node_config_without_data_or_with_keys_that_do_not_apply_is_refused():
    with pytest.raises(SiteDataError, match="neither 'data-path'"):
        ds.source_of(parse_node_config({}))
    with pytest.raises(SiteDataError, match="'columns' selects columns of a CSV data-path"):
        ds.load_site(parse_node_config({"partition-id": 0, "num-partitions": 2, "columns": "a,b"}), {})


def test_a_command_line_location_is_a_database_url_or_a_file():
    """``fedcluster simulate --data`` and ``fedcluster site check`` ask the same question
    of what they are given: a database's URL (node config ``data-url``) or a file."""
    from argparse import Namespace

    from fedcluster.cli import _data_nodes

    assert ds.is_database_url("postgresql://site@localhost/ward")
    assert ds.is_database_url("sqlite:///site.db")
    assert not ds.is_database_url("sites/site-0.csv") and not ds.is_database_url("C:/data.csv")
    nodes = _data_nodes(Namespace(data=["sqlite:///site.db", "site.csv"], data_table="t"))
    assert nodes[0]["data-url"] == "sqlite:///site.db" and nodes[0]["data-table"] == "t"
    assert nodes[1] == {"data-path": "site.csv", "site-id": "1"}

"""Where a site's rows come from: one choice, made once from its node config (issue 57).

:func:`source_of` names the source; :data:`LOADERS` loads each; everything that asks
"is this site simulated?" or "does it keep files?" asks :func:`source_of` (it was a
``startswith("memory://")`` in five places of ``app.py``), and the command line's "is
this location a database?" asks :func:`is_database_url`:

============== ===================================================== ================
source         node config                                           rows from
============== ===================================================== ================
``database``   ``data-url`` (and its query)                          ``sql_table.py``
``memory``     ``data-path = "memory://<token>/<i>"``                :data:`MEMORY_SITES`
``schema``     ``data-path`` with ``schema-path`` (or ``units``)     ``schema_table.py``
``table``      ``data-path``: Parquet, or CSV/TSV under a ``missing`` ``schema_table.py``
               policy other than ``error`` (the same reading: missing
               cells kept, the run's policy applied over them)
``file``       ``data-path``: CSV or ``.npy`` of numbers             ``site_data.py``
``partition``  ``partition-id``/``num-partitions`` (Flower's engine) ``site_data.py``
============== ===================================================== ================

``memory`` and ``partition`` are simulated: they keep no files across runs (their group
tables and DP ledgers live in the process or the run's ``Context.state``) and draw their
DP noise from the run's seed.
"""

from __future__ import annotations

from pathlib import Path

from flwr.common import ConfigRecord

from fedcluster.client_app.data.schema_table import load_plain_table, load_schema_table, missing_policy
from fedcluster.client_app.data.site_data import (
    SiteData, SiteDataError, load_partition, load_site_file,
)
from fedcluster.client_app.data.sql_table import load_sql_table, sql_reading
from fedcluster.client_app.node_config import NodeConfig, reading_schema

__all__ = ["DATABASE", "FILE", "LOADERS", "MEMORY", "MEMORY_PREFIX", "MEMORY_SITES", "PARTITION",
           "SCHEMA", "SIMULATED", "SQL_VERSION_RECORD", "TABLE", "is_database_url", "keeps_files",
           "load_site", "simulated", "source_of"]

DATABASE, MEMORY, SCHEMA, TABLE, FILE, PARTITION = (
    "database", "memory", "schema", "table", "file", "partition")
#: The sources whose rows are simulated (no files kept, DP noise from the run's seed).
SIMULATED = frozenset({MEMORY, PARTITION})

# In-process harness only: ``data-path = "memory://<token>/<i>"`` names arrays that the
# test/benchmark process registered (see fedcluster.simulation). Never used by Flower.
MEMORY_SITES: dict[str, list[SiteData]] = {}
MEMORY_PREFIX = "memory://"

#: The ``Context.state`` record of the database version a site read in this run.
SQL_VERSION_RECORD = "fedcluster.sql-version"


def source_of(node: NodeConfig, missing: str = "error") -> str:
    """The source of the site's rows (module docstring), from its node config and the
    run's ``missing`` policy.

    Raises
    ------
    SiteDataError
        The node config names no data (neither ``data-path``/``data-url`` nor a
        partition of a built-in data set).
    """
    if node.data_url is not None:
        return DATABASE
    if node.schema_path is not None or node.units is not None:
        return SCHEMA  # (its loader refuses a data-path that is not a table)
    if node.data_path is not None and node.data_path.startswith(MEMORY_PREFIX):
        return MEMORY
    if node.data_path is not None:
        suffix = Path(node.data_path).suffix.lower()
        if suffix == ".parquet" or (missing != "error" and suffix in (".csv", ".tsv")):
            return TABLE
        return FILE
    if node.partition_id is None or node.num_partitions is None:
        raise SiteDataError(
            "node config has neither 'data-path' (deployment) nor "
            "'partition-id'/'num-partitions' (simulation): this site has no data"
        )
    return PARTITION


def is_database_url(location: str) -> bool:
    """Whether a site's data ``location`` given on a command line (``fedcluster simulate
    --data``, ``fedcluster site check``) is a database URL (node config ``data-url``,
    ``scheme://...``) rather than a file (``data-path``)."""
    return "://" in str(location)


def simulated(node: NodeConfig) -> bool:
    """Whether the site's rows are simulated (``memory`` or ``partition``): a site
    reading a file or a database is not, whatever else its node config says (a
    ``partition-id`` beside a ``data-path`` made it draw its DP noise from the run's seed
    before this choice was made in one place)."""
    try:
        return source_of(node) in SIMULATED
    except SiteDataError:
        return False


def keeps_files(node: NodeConfig) -> bool:
    """Whether the site keeps files across runs (its group tables, its DP ledger): a
    data file or a database, not simulated rows."""
    return node.data_url is not None or (
        node.data_path is not None and not node.data_path.startswith(MEMORY_PREFIX))


def _memory(node: NodeConfig, run_config: dict, context=None) -> tuple[SiteData, dict]:
    token, _, index = node.data_path[len(MEMORY_PREFIX):].partition("/")
    return MEMORY_SITES[token][int(index)], {}


def _schema(node: NodeConfig, run_config: dict, context=None) -> tuple[SiteData, dict]:
    """A table read through the agreed schema (``schema-path``): the schema names the id
    and label columns, so the CSV column keys do not apply."""
    schema = reading_schema(node)  # (with schema-path or units set)
    if node.data_path is None or node.data_path.startswith(MEMORY_PREFIX):
        raise SiteDataError("node-config key 'schema-path' needs a 'data-path' (the site's table)")
    return load_schema_table(node.data_path, schema, units=node.units, cache_dir=node.cache_dir), {}


def _table(node: NodeConfig, run_config: dict, context=None) -> tuple[SiteData, dict]:
    return load_plain_table(node.data_path, cache_dir=node.cache_dir,
                            label_column=node.label_column, columns=node.columns,
                            id_column=node.id_column,
                            missing=str(run_config.get("missing", "error"))), {}


def _file(node: NodeConfig, run_config: dict, context=None) -> tuple[SiteData, dict]:
    return load_site_file(node.data_path, cache_dir=node.cache_dir,
                          label_column=node.label_column, columns=node.columns,
                          id_column=node.id_column), {}


def _partition(node: NodeConfig, run_config: dict, context=None) -> tuple[SiteData, dict]:
    dataset = str(run_config.get("dataset", "digits"))
    partitioning = str(run_config.get("partitioning", "iid"))
    seed = int(run_config.get("seed", 0))
    site = load_partition(dataset, partitioning, node.partition_id, node.num_partitions, seed)
    # Lets the server rebuild the pooled set for the central baseline (simulation only).
    return site, {"dataset": dataset, "partitioning": partitioning,
                  "num-partitions": node.num_partitions}


def _database(node: NodeConfig, run_config: dict, context=None) -> tuple[SiteData, dict]:
    """A site reading a database (``data-url``): read once per run, the version it read
    kept in the run's ``Context.state`` (``context``: (state, run id); None: read afresh)
    and mapped from the cache for the run's later messages (a fresh ClientApp process
    each), so every task of a run answers from one version, and the database is not
    queried per message."""
    reading = sql_reading(node)
    policy = (lambda site: site) if reading.schema is not None else (  # noqa: E731
        lambda site: missing_policy(site, str(run_config.get("missing", "error"))))
    if context is None:
        return policy(load_sql_table(reading, cache_dir=node.cache_dir)), {}
    state, run_id = context
    record = state.config_records.get(SQL_VERSION_RECORD)
    pinned = None
    if record is not None and record.get("run-id") == str(run_id) \
            and record.get("reading") == reading.key:
        pinned = str(record["version"])
    site = load_sql_table(reading, cache_dir=node.cache_dir, version=pinned)
    state.config_records[SQL_VERSION_RECORD] = ConfigRecord(
        {"run-id": str(run_id), "reading": reading.key, "version": site.version})
    return policy(site), {}


#: Each source's loader: (node config, run config, (state, run id) or None) -> (rows,
#: what the site says about their provenance).
LOADERS = {DATABASE: _database, MEMORY: _memory, SCHEMA: _schema, TABLE: _table, FILE: _file,
           PARTITION: _partition}


def load_site(node: NodeConfig, run_config: dict, context=None) -> tuple[SiteData, dict]:
    """Load the site's rows from their source (:func:`source_of`); also return what the
    site says about their provenance. ``context``: the run's (``Context.state``, run id),
    where a database's version is pinned for the run."""
    source = source_of(node, str(run_config.get("missing", "error")))
    if source != DATABASE and (node.data_path is None or node.data_path.startswith(MEMORY_PREFIX)):
        for key, value in (("columns", node.columns), ("id-column", node.id_column)):
            if value is not None:
                raise SiteDataError(f"node-config key '{key}' selects columns of a CSV data-path; "
                                    "this site has none")
    return LOADERS[source](node, run_config, context)

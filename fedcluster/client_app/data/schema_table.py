"""A site's table read through the agreed schema (node config ``schema-path``).

The file (``table_files.read_table``: CSV, TSV) is encoded against the schema
(``common/table_encoding.py``: columns found by name or alias in any order, units
converted, ranges checked, categories one-hot, ``drop-row`` applied), and the result is
cached as a memory-mapped float64 ``.npy`` keyed by the file (path, size, mtime), the
schema's hash and the declared units, so a later round's fresh process only maps it, as
for a plain CSV (``site_data.load_site_file``). A cell whose policy is ``impute-mean``
or ``impute-median`` stays NaN in the cache: the run's pooled fill
(``common/imputation.py``) arrives with every task, in its transform.

A table held in memory (a DataFrame given to ``fedcluster.simulate`` with a schema) is
encoded by the same :func:`encode_site_columns` as a file's columns, without the cache.

Every problem is a ``SiteDataError`` naming the file, and where it applies the row,
column and value; a site with such a file fails its own start with that message.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
from pathlib import Path

import numpy as np

from fedcluster.client_app.data import site_data
from fedcluster.client_app.data.site_data import SiteData, SiteDataError
from fedcluster.client_app.site_groups import TableFacts
from fedcluster.client_app.data.table_files import read_table, with_file_line
from fedcluster.client_app.data.tables import encode_labels
from fedcluster.client_app.data.versions.row_keys import id_keys
from fedcluster.common import kernels
from fedcluster.common.schema import Schema, schema_hash
from fedcluster.common.table_encoding import encode_table

logger = logging.getLogger(__name__)
TABLE_CACHE_FORMAT = "fedcluster-schema-table-v1"


def table_cache_key(path: str | os.PathLike, digest: str, units: dict[str, str] | None) -> str:
    """The cache key: the file's own (``site_data.cache_key``), the schema's hash and
    the declared units."""
    text = "\0".join([TABLE_CACHE_FORMAT, site_data.cache_key(path), digest,
                      json.dumps(units or {}, sort_keys=True)])
    return hashlib.sha256(text.encode()).hexdigest()


def encode_site_table(path: Path, schema: Schema, units: dict[str, str] | None,
                      digest: str) -> tuple[SiteData, dict]:
    """Read and encode the file (no cache): the site's data and the facts to cache."""
    header, columns = read_table(path)
    try:
        return encode_site_columns(header, columns, schema, str(path), units, digest)
    except SiteDataError as err:
        raise with_file_line(err, path) from None


def encode_site_columns(header: list[str], columns: list, schema: Schema, source: str,
                        units: dict[str, str] | None = None,
                        digest: str | None = None) -> tuple[SiteData, dict]:
    """A site's table given column-wise (``columns[j]``: the cells of ``header[j]``, text
    or numbers) encoded against ``schema``: the site's data and the facts to cache. The
    one encoding of a site's table, for a file (:func:`encode_site_table`) and for a
    table held in memory (``fedcluster.simulate`` with a schema)."""
    digest = schema_hash(schema) if digest is None else digest
    table = encode_table(header, columns, schema, source, units)
    labels = label_names = None
    if table.labels is not None:
        code_of: dict[str, int] = {}
        codes = np.asarray([code_of.setdefault(v, len(code_of)) for v in table.labels.tolist()],
                           dtype=np.int64)
        labels, label_names = encode_labels(list(code_of), codes)
    facts = TableFacts(schema, digest, table.rows_dropped, dict(table.cells_missing))
    data = SiteData(X=table.X, feature_names=tuple(table.names), labels=labels,
                    source=source, label_names=label_names, table=facts,
                    row_ids=None if table.ids is None else id_keys(table.ids),
                    dropped_keys=id_keys(table.dropped) if table.dropped else None)
    return data, {"rows-dropped": table.rows_dropped, "cells-missing": table.cells_missing}


def load_schema_table(path: str | os.PathLike, schema: Schema, *,
                      units: dict[str, str] | None = None,
                      cache_dir: str | os.PathLike | None = None,
                      min_rows: int = 1) -> SiteData:
    """The site's rows encoded against ``schema`` (NaN where the run will impute),
    through the memory-mapped cache.

    Raises
    ------
    SiteDataError
        The file is missing or unreadable, does not fit the schema (the message names
        file, row, column, value), or keeps fewer than ``min_rows`` rows.
    """
    path = Path(path)
    if not path.exists():
        raise SiteDataError(f"data-path '{path}' does not exist")
    if path.is_dir():
        raise SiteDataError(f"data-path '{path}' is a directory, not a data file")
    digest = schema_hash(schema)
    key = table_cache_key(path, digest, units)
    units_text = json.dumps(units or {}, sort_keys=True)
    known = {"version": key, "lineage": site_data.lineage_key(path, TABLE_CACHE_FORMAT, digest, units_text),
             "reading": site_data.reading_key(TABLE_CACHE_FORMAT, digest, units_text)}
    base = Path(cache_dir if cache_dir is not None else site_data.default_cache_dir()) / key
    has_ids = any(column.type == "id" for column in schema.columns)
    entry = site_data.read_cache(base, str(path), ids=has_ids)
    if entry is not None:
        cached, meta = entry
        try:
            facts = TableFacts(schema, digest, int(meta["rows-dropped"]),
                               {str(k): int(v) for k, v in meta["cells-missing"].items()})
            if facts.rows_dropped and cached.dropped_keys is None:
                raise ValueError("written before dropped rows were kept")
        except (ValueError, KeyError, TypeError, AttributeError):
            pass  # a damaged or older sidecar: encode again
        else:
            kernels.check_rows(cached.X, str(path), min_rows, error=SiteDataError)
            return dataclasses.replace(cached, table=facts, **known)
    data, facts_meta = encode_site_table(path, schema, units, digest)
    data = dataclasses.replace(data, **known)
    kernels.check_rows(data.X, str(path), min_rows, error=SiteDataError)
    try:
        site_data.write_cache(base, data, os.path.realpath(path),
                               {"schema-hash": digest, "units": units or {}, **facts_meta})
    except OSError as error:
        logger.warning("%s: cannot write the data cache in %s (%s); encoding in memory "
                       "every round", path, base.parent, error)
        data.X.setflags(write=False)
        return data
    entry = site_data.read_cache(base, str(path))
    if entry is None:
        data.X.setflags(write=False)
        return data
    return dataclasses.replace(entry[0], table=data.table, **known)


def plain_schema(header: list[str], source: str, label_column: str | None = None,
                 columns: tuple[str, ...] | None = None, id_column: str | None = None,
                 missing: str = "error") -> Schema:
    """The schema of a plain numeric table read without one (a site with no
    ``schema-path``): the node config's id and label columns, its ``columns`` (default:
    every other column) numeric, a missing cell handled by the run config's ``missing``
    (``error`` by default, as a plain CSV)."""
    from fedcluster.client_app.data.tables import plan_columns
    from fedcluster.common.schema import parse_schema

    plan = plan_columns(source, header, label_column, columns, id_column)
    listed = [{"name": header[j], "type": "numeric"} for j in plan.features]  # in plan order
    if plan.label is not None:
        listed.append({"name": header[plan.label], "type": "label"})
    if id_column is not None:
        listed.append({"name": id_column, "type": "id"})
    return parse_schema({"columns": listed, "missing": missing}, source)


def load_plain_table(path: str | os.PathLike, *, cache_dir=None, label_column=None,
                     columns=None, id_column=None, missing: str = "error") -> SiteData:
    """A site file read without a schema (a Parquet file, or a CSV/TSV under a run config
    ``missing`` other than ``error``): numeric features through ``plain_schema`` and the
    same cache. The site reads it ONE way, whatever a run asks: its missing cells kept
    (NaN), so the rows, the site's record and its DP budget are those of every run on it
    (``reading`` is a plain file's: the columns chosen, never the run's ``missing``). The
    run's ``missing`` is applied over that reading (:func:`missing_policy`). Its facts
    carry no schema hash (no agreed schema to check), but the cells missing, which the
    imputation round fills.

    Raises
    ------
    SiteDataError
        The file does not fit, or the run's ``missing`` cannot be applied over the site's
        reading (the message names the run-config key).
    """
    from fedcluster.client_app.data.table_files import parquet_columns
    from fedcluster.client_app.data.tables import DELIMITERS, read_header

    path = Path(path)
    if not path.exists():
        raise SiteDataError(f"data-path '{path}' does not exist")
    suffix = path.suffix.lower()
    header = parquet_columns(path) if suffix == ".parquet" else read_header(path, DELIMITERS[suffix])
    schema = plain_schema(header, str(path), label_column, columns, id_column, KEPT)
    data = load_schema_table(path, schema, cache_dir=cache_dir)
    data = dataclasses.replace(
        data, lineage=site_data.lineage_key(path, label_column, columns, id_column),
        reading=site_data.reading_key("plain", label_column, columns, id_column))
    return missing_policy(data, missing)


#: How a plain table is read: its missing cells kept (the run's ``missing`` is applied
#: over them).
KEPT = "impute-mean"


def missing_policy(data: SiteData, missing: str) -> SiteData:
    """A plain table (its missing cells kept) under the run config's ``missing``: as read
    (``impute-mean``: the run fills them); refused where it holds a missing cell and the
    run says ``error`` (naming the cell) or ``drop-row`` (which would read it another
    way: other rows, another record); facts that say how many cells are missing.

    Raises
    ------
    SiteDataError
        Naming the run-config key ``missing``.
    """
    cells = dict(data.table.cells_missing) if data.table is not None else {}
    if any(cells.values()) and missing in ("error", "drop-row"):
        rows, columns = np.nonzero(np.isnan(np.asarray(data.X)))
        names = data.feature_names or tuple(f"x{j}" for j in range(data.n_features))
        cell = (f"data row {int(rows[0]) + 1}, column {names[int(columns[0])]!r}: the cell is "
                "missing" if rows.size else "a cell is missing")
        if missing == "error":
            raise SiteDataError(
                f"{data.source}: {cell} (run config 'missing' is \"error\"; \"impute-mean\" "
                "fills a missing cell with the pooled mean of its column)")
        raise SiteDataError(
            f"{data.source}: {sum(cells.values())} missing cell(s) ({cell}); run config "
            "'missing' = \"drop-row\" would read this file without their rows, which a site does "
            "not do at a run's asking (its rows, its record and its DP budget are those of its "
            "one reading: docs/explanation/privacy-model.md). Ask for \"impute-mean\", or the "
            "site reads its file through a schema whose columns say drop-row (node config "
            "'schema-path')")
    if missing == "error":
        return dataclasses.replace(data, table=None)
    schema = data.table.schema.model_copy(update={"missing": missing})
    return dataclasses.replace(data, table=TableFacts(schema, "", data.table.rows_dropped, cells))

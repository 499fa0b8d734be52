"""A database's query result read as a site's table: streamed through the schema into
the memory-mapped cache, the same road as a file (``schema_table.py``).

Each chunk of the result (``sql_source.query_result``) is encoded against the agreed
schema (``common/table_encoding.py``: names, aliases, units, categories, missing cells;
without ``schema-path``, the node config's ``columns``, ``label-column`` and
``id-column`` as for a plain file) and its features are appended to a ``.npy`` file in
the cache directory, so a 1,000,000-row cohort is never held in memory twice: the rows in
flight are one chunk's (``bench/sql_read.py`` measures the peak).

The data version is the result's rows as the group lineage sees them: a sha256 of the
encoded features' bits, the labels, the rows' ids and the rows ``drop-row`` dropped,
computed while streaming. The cache entry (and so the group table, ``group_table.py``)
is keyed by it and by the reading (the URL without its password, the query or table,
the schema's hash and the units), so an unchanged result maps the entry already made,
appended rows make a version that keeps the earlier groups, and deleted or changed rows
follow the versions rule (``versions/``). The database is read once per run: the
ClientApp keeps the version it read in the run's ``Context.state`` and maps that entry
for the run's later messages (``app.py``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import struct
import tempfile
from pathlib import Path

import numpy as np

from fedcluster.client_app.data import site_data
from fedcluster.client_app.data.schema_table import KEPT, plain_schema
from fedcluster.client_app import site_files
from fedcluster.client_app.data.site_data import SiteData, SiteDataError
from fedcluster.client_app.data.sql_source import SqlSource, chunk_columns, query_result
from fedcluster.client_app.data.tables import encode_labels
from fedcluster.client_app.data.versions.row_keys import id_keys
from fedcluster.client_app.site_groups import TableFacts
from fedcluster.common import kernels
from fedcluster.common.schema import Schema, schema_hash
from fedcluster.common.table_encoding import encode_table

logger = logging.getLogger(__name__)
SQL_CACHE_FORMAT = "fedcluster-sql-table-v1"
#: The bytes of a streamed ``.npy`` file's header: written as a placeholder first, then
#: with the final shape (a multiple of 64, as the format asks; room for any shape).
NPY_HEADER = 128


@dataclasses.dataclass(frozen=True)
class Reading:
    """How the site reads its database (node config), whatever the result holds."""

    source: SqlSource
    schema: Schema | None = None
    units: dict[str, str] | None = None
    label_column: str | None = None
    columns: tuple[str, ...] | None = None
    id_column: str | None = None

    @property
    def schema_digest(self) -> str | None:
        return None if self.schema is None else schema_hash(self.schema)

    @property
    def key(self) -> str:
        """``SiteData.reading``: the key of the site's answered history."""
        return site_data.reading_key(SQL_CACHE_FORMAT, *self.source.reading, self.schema_digest,
                                     json.dumps(self.units or {}, sort_keys=True),
                                     self.label_column, self.columns, self.id_column)


def _npy_header(n_rows: int, width: int) -> bytes:
    text = repr({"descr": "<f8", "fortran_order": False, "shape": (n_rows, width)})
    text = text.ljust(NPY_HEADER - 10 - 1) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text.encode("latin1")


class _Version:
    """The result's rows as the lineage sees them, hashed as they stream past (one hash
    per part, so the digest does not depend on the chunks' size)."""

    def __init__(self) -> None:
        self.parts = {name: hashlib.sha256() for name in ("rows", "labels", "ids", "dropped")}

    def add(self, X: np.ndarray, labels, ids: np.ndarray | None, dropped: np.ndarray | None):
        self.parts["rows"].update(np.ascontiguousarray(X))
        if labels is not None:
            self.parts["labels"].update("".join(f"{v}\0" for v in labels).encode())
        for name, keys in (("ids", ids), ("dropped", dropped)):
            if keys is not None:
                self.parts[name].update(np.ascontiguousarray(keys))

    def key(self, reading: str, shape: tuple[int, int]) -> str:
        text = "\0".join([SQL_CACHE_FORMAT, reading, repr(shape),
                          *(h.hexdigest() for h in self.parts.values())])
        return hashlib.sha256(text.encode()).hexdigest()


def _stream(reading: Reading, directory: Path):
    """Read the result into a ``.npy`` file in ``directory``; (the file, its shape, the
    version digest, labels (text) or None, ids, dropped keys, the facts to cache)."""
    source = reading.source
    fd, name = tempfile.mkstemp(dir=directory, prefix="sql-", suffix=".npy.tmp")
    path = Path(name)
    try:
        with os.fdopen(fd, "wb") as out, query_result(source) as (names, chunks):
            schema = reading.schema or plain_schema(
                names, source.source, reading.label_column, reading.columns, reading.id_column,
                KEPT)
            out.write(_npy_header(0, 0))
            version, read, kept = _Version(), 0, 0
            labels, ids, dropped, missing, width = [], [], [], {}, None
            for part in chunks:
                table = encode_table(names, chunk_columns(part, names, source.source), schema,
                                     source.source, reading.units, first_row=read, partial=True)
                read += len(part)
                width = table.X.shape[1]
                X = np.ascontiguousarray(table.X, dtype=np.float64)
                site_files.write_pieces(out, X)
                kept += X.shape[0]
                chunk_ids = None if table.ids is None else id_keys(table.ids)
                chunk_dropped = id_keys(table.dropped) if table.dropped else None
                version.add(X, table.labels, chunk_ids, chunk_dropped)
                if table.labels is not None:
                    labels.extend(table.labels.tolist())
                ids += [] if chunk_ids is None else [chunk_ids]
                dropped += [] if chunk_dropped is None else [chunk_dropped]
                for column, count in table.cells_missing.items():
                    missing[column] = missing.get(column, 0) + count
            if read == 0:
                raise SiteDataError(f"{source.source}: the query returned no rows")
            if kept == 0:
                raise SiteDataError(f"{source.source}: every one of its {read} rows has a missing "
                                    "cell in a column whose policy is drop-row: no row is left")
            out.seek(0)
            out.write(_npy_header(kept, width))
            out.flush()
            os.fsync(out.fileno())
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    facts = {"rows-dropped": read - kept, "cells-missing": missing}
    return (path, (kept, width), version.key(reading.key, (kept, width)), schema,
            labels if reading_has_labels(schema) else None,
            np.concatenate(ids) if ids else None,
            np.concatenate(dropped) if dropped else None, facts)


def reading_has_labels(schema: Schema) -> bool:
    return any(column.type == "label" for column in schema.columns)


def _facts(reading: Reading, schema: Schema, meta: dict) -> TableFacts | None:
    # (a plain table: its missing cells kept; the run's ``missing`` is applied over it by
    # ``schema_table.missing_policy``)
    return TableFacts(schema, reading.schema_digest or "", int(meta["rows-dropped"]),
                      {str(k): int(v) for k, v in meta["cells-missing"].items()})


def _cached(reading: Reading, base: Path, known: dict, min_rows: int) -> SiteData | None:
    has_ids = reading.id_column is not None or (
        reading.schema is not None and any(c.type == "id" for c in reading.schema.columns))
    entry = site_data.read_cache(base, reading.source.source, ids=has_ids)
    if entry is None:
        return None
    cached, meta = entry
    try:
        schema = reading.schema or Schema.model_validate(meta["schema"])
        facts = _facts(reading, schema, meta)
    except (ValueError, KeyError, TypeError, AttributeError):
        return None  # a damaged sidecar: read again
    kernels.check_rows(cached.X, reading.source.source, min_rows, error=SiteDataError)
    return dataclasses.replace(cached, table=facts, **known)


def load_sql_table(reading: Reading, *, cache_dir: str | os.PathLike | None = None,
                   version: str | None = None, min_rows: int = 1) -> SiteData:
    """The site's rows from its database, through the schema, in the memory-mapped cache.

    ``version``: a version this run already read (its cache key): mapped without
    connecting when its entry is there.

    Raises
    ------
    SiteDataError
        What ``sql_source.query_result`` raises; a result that does not fit the schema
        (named by row and column), has no row, or keeps fewer than ``min_rows``; a cache
        directory that cannot be written (``cache-dir``: the site keeps the result there).
    """
    directory = Path(cache_dir if cache_dir is not None else site_data.default_cache_dir())
    lineage = hashlib.sha256(f"{SQL_CACHE_FORMAT}\0lineage\0{reading.key}".encode()).hexdigest()
    if version is not None:
        found = _cached(reading, directory / version, {"version": version, "lineage": lineage,
                                                        "reading": reading.key}, min_rows)
        if found is not None:
            return found
    try:
        directory.mkdir(parents=True, exist_ok=True)
        streamed = _stream(reading, directory)
    except OSError as err:
        raise SiteDataError(f"cache-dir {directory}: cannot write the data cache ({err}); a "
                            "site that reads a database keeps the result there") from None
    path, shape, key, schema, label_text, ids, dropped, facts_meta = streamed
    known = {"version": key, "lineage": lineage, "reading": reading.key}
    base = directory / key
    found = _cached(reading, base, known, min_rows)
    if found is not None:  # the same result as a version read before: its entry stays
        path.unlink(missing_ok=True)
        return found
    labels = label_names = None
    if label_text is not None:
        code_of: dict[str, int] = {}
        codes = np.asarray([code_of.setdefault(v, len(code_of)) for v in label_text], dtype=np.int64)
        labels, label_names = encode_labels(list(code_of), codes)
    X = np.load(path, mmap_mode="r")
    data = SiteData(X=X, feature_names=tuple(schema.feature_names()), labels=labels,
                    source=reading.source.source, label_names=label_names, row_ids=ids,
                    dropped_keys=dropped, **known)
    kernels.check_rows(X, reading.source.source, min_rows, error=SiteDataError)
    try:
        site_data.write_cache(base, data, reading.source.source,
                              {"schema-hash": reading.schema_digest, "units": reading.units or {},
                               "schema": schema.model_dump(mode="json", by_alias=True),
                               **facts_meta}, rows_file=path)
    except OSError as err:
        path.unlink(missing_ok=True)
        raise SiteDataError(f"cache-dir {directory}: cannot write the data cache ({err}); a "
                            "site that reads a database keeps the result there") from None
    found = _cached(reading, base, known, min_rows)
    if found is None:
        raise SiteDataError(f"cache-dir {directory}: the data cache written to {base} cannot be "
                            "read back")
    return found


def read_sql_columns(source: SqlSource) -> tuple[list[str], list]:
    """The whole result as (header, columns of cells), as ``table_files.read_table``
    gives a file's (for ``fedcluster site check``, which surveys it in memory)."""
    with query_result(source) as (names, chunks):
        parts = [chunk_columns(part, names, source.source) for part in chunks]
    if not parts:
        raise SiteDataError(f"{source.source}: the query returned no rows")
    columns = []
    for j in range(len(names)):
        pieces = [part[j] for part in parts]
        if all(isinstance(p, np.ndarray) for p in pieces):
            kinds = {p.dtype.kind for p in pieces}
            columns.append(np.concatenate(pieces if kinds == {"i"} else
                                          [p.astype(np.float64) for p in pieces]))
        else:
            columns.append([cell for p in pieces for cell in (p.tolist() if isinstance(
                p, np.ndarray) else p)])
    return names, columns


def sql_reading(node) -> Reading:
    """The :class:`Reading` of a node config with ``data-url`` (``node_config.NodeConfig``:
    the site's own; a run's ``missing`` is applied over it, ``schema_table.missing_policy``),
    its keys checked together: ``schema-path`` with its ``units``, or else the plain keys ``columns``,
    ``label-column`` and ``id-column``.

    Raises
    ------
    SiteDataError
        Naming the keys that do not go together, or what ``sql_source.sql_source`` raises.
    """
    from fedcluster.client_app.data.sql_source import sql_source
    from fedcluster.client_app.node_config import reading_schema

    if node.data_path is not None:
        raise SiteDataError("node-config keys 'data-path' and 'data-url' both name the site's "
                            "data; keep one")
    source = sql_source(node.data_url, node.data_query, node.data_query_file, node.data_table,
                        node.data_password_file, node.data_timeout)
    schema = reading_schema(node)
    if schema is None:
        return Reading(source, label_column=node.label_column, columns=node.columns,
                       id_column=node.id_column)
    return Reading(source, schema, node.units)

"""Tables in the Python API (issue 20): ``fedcluster.simulate`` and ``choose_k`` with
sites that hold missing cells or are pandas DataFrames, encoded as a real site encodes
its file.

* ``schema=`` (a :class:`~fedcluster.common.schema.Schema`, a dict, or a TOML/JSON file):
  each site is a DataFrame (its column names are the header; a unit suffix such as
  ``glucose [mmol/L]`` works, and ``units=`` declares units as a site's node config does)
  or a ``(header, columns)`` pair, columns given column-wise. Each goes through
  ``schema_table.encode_site_columns``, the encoding of a deployed site's file: columns by
  name or alias in any order, units converted, ranges checked, categories one-hot,
  ``drop-row`` applied, cells left NaN for an ``impute-*`` policy; a ``label`` column
  gives the site's labels.
* ``missing=`` without a schema: sites are numeric arrays that may hold NaN; an implicit
  schema of numeric columns ``x0``, ``x1``, ... with that policy is encoded the same way
  (the sites keep no feature names, as arrays have none). ``missing="error"`` (or None)
  is the plain array path, where a NaN is an error.

The schema is written as JSON into a temporary directory for the run and named by the
run config's ``schema`` key, so the server checks every site's schema hash at describe
and runs the pooled imputation round exactly as in deployment; the directory is removed
after the run. A site whose table does not fit raises ``SiteDataError`` from ``simulate``
(naming the site, row, column and value), as a NaN in a plain array does.
"""

from __future__ import annotations

import json
import tempfile
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from fedcluster.client_app.data.schema_table import encode_site_columns, plain_schema
from fedcluster.client_app.data.site_data import SiteData, SiteDataError
from fedcluster.common import kernels
from fedcluster.common.schema import MISSING_POLICIES, Schema, load_schema, parse_schema
from fedcluster.common.table_encoding import frame_columns

#: The label column of an implicit schema (arrays given with ``labels=``).
LABEL_COLUMN = "label"


def is_dataframe(site) -> bool:
    """A pandas DataFrame (recognised without importing pandas)."""
    return hasattr(site, "columns") and hasattr(site, "to_numpy") and hasattr(site, "iloc")


def resolve_schema(schema) -> Schema:
    """A :class:`Schema` from a Schema, an already-parsed dict, or a TOML/JSON file."""
    if isinstance(schema, Schema):
        return schema
    if isinstance(schema, dict):
        return parse_schema(schema, "schema")
    if isinstance(schema, (str, Path)):
        return load_schema(schema)
    raise TypeError(f"schema must be a Schema, a dict or the path of a TOML/JSON file, "
                    f"not {type(schema).__name__}")


def pair_columns(site, source: str) -> tuple[list[str], list]:
    """A ``(header, columns)`` pair checked: one cell sequence per name, all as long."""
    header, columns = site
    header = [str(name) for name in header]
    columns = list(columns)
    if len(columns) != len(header):
        raise ValueError(f"{source}: (header, columns) needs one column (a sequence of cells) "
                         f"per header name: {len(header)} names, {len(columns)} columns (rows "
                         "given instead of columns? transpose them with list(zip(*rows)))")
    lengths = {len(c) for c in columns}
    if len(lengths) > 1:
        raise ValueError(f"{source}: its columns differ in length ({sorted(lengths)})")
    return header, columns


def array_columns(X, labels, source: str) -> tuple[list[str], list]:
    """A numeric array (NaN: missing) as the implicit schema's (header, columns)."""
    X = np.asarray(X)
    if X.dtype.kind not in "iuf":
        raise SiteDataError(f"{source}: dtype {X.dtype} is not numeric; an int or float array "
                            "is needed (a table of text needs a schema)")
    X = kernels.check_rows(X, source, 1, error=SiteDataError).astype(np.float64)
    header, columns = [f"x{j}" for j in range(X.shape[1])], list(X.T)
    if labels is not None:
        y = np.asarray(labels).ravel()
        if len(y) != len(X):
            raise ValueError(f"{source}: {len(y)} labels for {len(X)} rows")
        header.append(LABEL_COLUMN)
        columns.append([str(v) for v in y.tolist()])
    return header, columns


def _site_units(units, n_sites: int) -> list:
    if units is None or isinstance(units, dict):
        return [units] * n_sites
    units = list(units)
    if len(units) != n_sites:
        raise ValueError(f"units: {len(units)} dicts for {n_sites} sites (give one per site, "
                         "or one dict for all)")
    return units


def encode_sites(sites, *, labels=None, schema=None, missing=None,
                 units=None) -> tuple[list[SiteData], Schema] | None:
    """The sites encoded through the schema (given, or implicit for ``missing``), with
    the schema; None when neither is asked for (plain arrays, as before).

    Raises
    ------
    ValueError
        An argument that does not fit (a DataFrame without a schema, impute-median without
        a schema, labels with a schema, units without one, ...).
    SiteDataError
        A site's table does not fit the schema; the message names site, row, column, value.
    """
    if missing is not None and missing not in MISSING_POLICIES:
        raise ValueError(f"missing must be one of {', '.join(MISSING_POLICIES)}, not {missing!r}")
    frames = [i for i, site in enumerate(sites or ()) if is_dataframe(site)]
    if schema is None:
        if frames:
            raise ValueError(f"site {frames[0]} is a DataFrame: give schema= (the table's "
                             "columns: types, categories, units, ranges, missing policies), "
                             "or pass its numbers as an array (frame.to_numpy())")
        if units is not None:
            raise ValueError("units= declares the unit of a schema's column: give schema= too")
        if missing in (None, "error"):
            return None  # plain arrays: a NaN is an error, as before
        if missing == "impute-median":
            raise ValueError("missing='impute-median' needs each column's range (the pooled "
                             "median is read from histograms over it): pass a schema with each "
                             "column's range (schema=...) instead of missing=")
    elif missing is not None:
        raise ValueError("with a schema, the missing-value policies are the schema's (its "
                         "'missing' key and each column's): leave missing= unset")
    if sites is None or len(sites) == 0:
        raise ValueError("schema= and missing= apply to tables given as sites; give sites=")
    if labels is not None and len(labels) != len(sites):
        raise ValueError(f"labels: {len(labels)} arrays for {len(sites)} sites")
    if schema is None:
        tables = [array_columns(X, None if labels is None else labels[i], f"site {i}")
                  for i, X in enumerate(sites)]  # each checked: numeric, 2-D, a column
        widths = [len(header) for header, _ in tables]
        if len(set(widths)) > 1:
            raise ValueError(f"missing=: every site's array must have the same number of "
                             f"columns, got {[np.shape(X) for X in sites]}")
        run_schema = plain_schema(tables[0][0], "missing=",
                                  LABEL_COLUMN if labels is not None else None, missing=missing)
    else:
        if labels is not None:
            raise ValueError("with a schema, a site's labels are its table's label column "
                             "(type = \"label\"); leave labels= unset")
        run_schema = resolve_schema(schema)
        tables = []
        for i, site in enumerate(sites):
            if is_dataframe(site):
                tables.append(frame_columns(site))
            elif isinstance(site, (tuple, list)) and len(site) == 2:
                tables.append(pair_columns(site, f"site {i}"))
            else:
                raise ValueError(f"site {i}: with a schema, a site is a pandas DataFrame or a "
                                 f"(header, columns) pair, not {type(site).__name__}")
    encoded = []
    for i, ((header, columns), site_units) in enumerate(zip(tables, _site_units(units, len(tables)))):
        data, _ = encode_site_columns(header, columns, run_schema, f"site {i}", site_units)
        kernels.check_rows(data.X, data.source, 1, error=SiteDataError)
        data.X.setflags(write=False)  # read-only, like a deployed site's memory-mapped table
        if schema is None:  # arrays have no feature names: the run names none, as before
            data = SiteData(data.X, None, data.labels, data.source, data.label_names, data.table)
        encoded.append(data)
    return encoded, run_schema


@contextmanager
def table_run(sites, labels, run_config: dict, *, schema=None, missing=None, units=None):
    """``(sites, labels)`` for ``simulation.site_nodes``: the sites encoded through the
    schema (as SiteData, the labels inside them) with ``run_config["schema"]`` naming a
    temporary file that holds the schema (removed after the run); or, with neither
    ``schema`` nor an imputing/dropping ``missing``, the arguments unchanged."""
    encoded = encode_sites(sites, labels=labels, schema=schema, missing=missing, units=units)
    if encoded is None:
        yield sites, labels
        return
    site_data, run_schema = encoded
    with tempfile.TemporaryDirectory(prefix="fedcluster-schema-") as directory:
        path = Path(directory) / "schema.json"
        path.write_text(json.dumps(run_schema.model_dump(mode="json", by_alias=True), indent=1),
                        encoding="utf-8")
        run_config["schema"] = str(path)
        try:
            yield site_data, None
        finally:
            run_config.pop("schema", None)

"""``fedcluster predict``: a site labels its own rows with a trained model.json, at the
site (the labels never leave it), and writes them as labels.csv (:func:`write_labels`)."""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import numpy as np

from fedcluster.client_app.data.site_data import SiteDataError


def write_labels(out: str | Path, labels: np.ndarray, ids: list | None = None,
                 id_name: str | None = None) -> None:
    """labels.csv: one line per data row of the site's file, in its order. Columns: the
    record's id where the file has one (its header name: the schema's ``id`` column, or
    ``--id-column``), ``row`` (the data row, 1-based, the header not counted, as every
    error message counts rows; a CSV's line is row + 1) and ``cluster`` (-1: a row the
    schema's drop-row policy dropped)."""
    with open(out, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(([id_name] if ids is not None else []) + ["row", "cluster"])
        for i, label in enumerate(labels):
            writer.writerow(([ids[i]] if ids is not None else []) + [i + 1, int(label)])


def _id_cells(path: str | Path, header: list[str] | None, columns: list | None,
              names: tuple[str, ...]) -> tuple[str | None, list | None]:
    """(header name, cells) of the file's id column, matched by any of ``names`` as a
    schema matches headers (case and spaces ignored); (None, None) when the file has none
    or is not a table (an array file, a database)."""
    from fedcluster.client_app.data.table_files import TABLE_SUFFIXES, read_table
    from fedcluster.common.schema import normalise

    if not names:
        return None, None
    if header is None:
        if Path(path).suffix.lower() not in TABLE_SUFFIXES:
            return None, None
        header, columns = read_table(path)
    wanted = {normalise(name) for name in names}
    for name, cells in zip(header, columns):
        if normalise(name) in wanted:
            return name, ["" if cell is None else str(cell) for cell in cells]
    return None, None


def cmd_predict(args: argparse.Namespace) -> int:
    from fedcluster.client_app.data_sources import load_site
    from fedcluster.common.model import Model

    try:
        model = Model.load(args.model)  # a file that is not a model: ValueError naming it
    except OSError as err:
        raise ValueError(f"{args.model}: cannot read the model ({err.strerror})") from None
    if model.schema is not None:
        return _predict_through_schema(args, model)
    if args.units:
        raise ValueError("--units is for a model trained with a schema (run config `schema`); "
                         f"{args.model} has none")
    from fedcluster.client_app.node_config import parse_node_config

    # The file is read as a site reads its data-path (data_sources: one choice of reader).
    node = parse_node_config({"data-path": str(args.data), "columns": args.columns,
                              "id-column": args.id_column, "label-column": args.label_column})
    site, _ = load_site(node, {})
    if site.n_features != model.n_features:
        raise SiteDataError(
            f"{args.data}: has {site.n_features} feature columns, the model expects "
            f"{model.n_features}"
        )
    if model.feature_names and site.feature_names and list(site.feature_names) != model.feature_names:
        raise SiteDataError(
            f"{args.data}: header {list(site.feature_names)} differs from the model's "
            f"features {model.feature_names}"
        )
    labels = model.predict(site.X)
    id_name, ids = _id_cells(args.data, None, None, (args.id_column,) if args.id_column else ())
    write_labels(args.out, labels, ids if ids is not None and len(ids) == len(labels) else None,
                 id_name)
    print(f"{args.out}: {len(labels)} labels")
    return 0


def _predict_through_schema(args: argparse.Namespace, model) -> int:
    """``predict`` with a model that holds its run's schema: the raw table (.csv, .tsv,
    .parquet) read, encoded, imputed and scaled as in the run; one line per data row of
    the file, -1 for a row dropped by a drop-row column."""
    from fedcluster.client_app.data.table_files import read_table
    from fedcluster.common.schema import parse_units

    given = [f"--{name.replace('_', '-')}" for name in ("columns", "id_column", "label_column")
             if getattr(args, name) is not None]
    if given:
        raise ValueError(f"{', '.join(given)}: the model's schema names the columns; these "
                         "options are for a model trained without one")
    units = parse_units(args.units or [], "--units")
    header, columns = read_table(args.data)
    result = model.predict_table(header, columns, source=str(args.data), units=units or None)
    labels = result.by_row(dropped=-1)
    id_names = tuple(name for column in model.table_schema.columns if column.type == "id"
                     for name in (column.name, *column.aliases))
    id_name, ids = _id_cells(args.data, header, columns, id_names)
    write_labels(args.out, labels, ids, id_name)
    message = f"{args.out}: {len(result.labels)} labels"
    if len(dropped := result.dropped_rows):
        shown = ", ".join(str(i + 1) for i in dropped[:20]) + (", ..." if len(dropped) > 20 else "")
        message += (f"; {len(dropped)} row(s) dropped by the schema's drop-row policy, "
                    f"written as -1 (data rows {shown})")
    print(message)
    return 0

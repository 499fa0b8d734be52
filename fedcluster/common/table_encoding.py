"""Encoding a raw table against the agreed schema (``schema.py``): the features a site
clusters, and the same for ``Model.predict``.

Steps, column by column, each failure a ``SiteDataError`` naming file, row (1-based
data row), column and value:

1. **Columns** are found by name or alias (case- and space-insensitive), in any order; a
   header may carry its unit (``glucose [mmol/L]``). A feature, id or label column the
   schema lists and the file lacks is an error naming it; a file column the schema does
   not list is not read.
2. **Numeric**: parsed (a cell in :data:`schema.MISSING_TOKENS` is missing), converted
   from the file's unit to the schema's (``units``; with ``unit-column``, each row from
   the unit its row names, an unconvertible or absent one an error), checked against
   ``range`` (error, or clipped with ``out-of-range = "clip"``).
3. **Categorical**: one-hot against the schema's levels (``category-weight`` for the 1);
   an unlisted value is an error unless the column has an ``other`` level.
4. **Missing cells**: ``error`` names the first; ``drop-row`` drops the row; the
   ``impute-*`` policies leave NaN for :func:`impute`, which fills them with the POOLED
   values computed by the statistics round; ``missing-indicator`` adds a 0/1 column.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fedcluster.common.datasets import SiteDataError
from fedcluster.common.schema import MISSING_TOKENS, Column, Schema, normalise, split_unit

_MISSING = frozenset(MISSING_TOKENS)


@dataclass(frozen=True)
class RowUnits:
    """A column whose rows name their own units (schema ``unit-column``): the header
    index and name of the column that holds them (:func:`match_columns`)."""

    index: int
    header: str


def row_units(unit, columns: list) -> str | list[str] | None:
    """The unit(s) a column's values are in: ``unit`` as :func:`match_columns` found it,
    with a :class:`RowUnits` replaced by its cells' texts (one per row)."""
    if isinstance(unit, RowUnits):
        return [cell_text(c) for c in columns[unit.index]]
    return unit


@dataclass
class EncodedTable:
    """A table encoded against a schema.

    ``X``: (rows kept, features) float64, NaN where a cell waits for :func:`impute`;
    ``names``: the encoded feature names (``Schema.feature_names``); ``blocks``: per
    feature column of the schema, the slice of ``X`` it fills; ``labels``: the label
    column's cells (or None); ``kept``: per row of the table, whether ``drop-row`` kept
    it (``X`` holds the kept rows); ``cells_missing``: per feature column, the missing
    cells among the kept rows; ``ids``: per kept row, the text of its id column(s) (None:
    the schema lists no id column); ``dropped``: per row ``drop-row`` dropped, the text of
    its cells (what makes it the same dropped row in the next version of the file).
    """

    X: np.ndarray
    names: list[str]
    blocks: dict[str, slice]
    labels: np.ndarray | None = None
    kept: np.ndarray | None = None
    cells_missing: dict[str, int] = field(default_factory=dict)
    ids: list[str] | None = None
    dropped: list[str] = field(default_factory=list)

    @property
    def rows_dropped(self) -> int:
        """The rows ``drop-row`` dropped."""
        return 0 if self.kept is None else int(np.count_nonzero(~self.kept))


def cell_text(cell) -> str:
    """A category's or label's cell as text: a number as a CSV writes it, so a Parquet or
    DataFrame column of integer codes (read as floats when it has nulls) matches the
    schema's levels ("3", not "3.0"); None and NaN are missing ("")."""
    if cell is None:
        return ""
    if isinstance(cell, (float, np.floating)):
        if np.isnan(cell):
            return ""
        if float(cell).is_integer() and abs(cell) < 2**53:
            return str(int(cell))
    return str(cell).strip()


def match_columns(header: list[str], schema: Schema, source: str,
                  declared_units: dict[str, str] | None = None) -> dict[str, tuple[int, str | None]]:
    """Schema column name -> (its index in ``header``, the unit its values are in, None
    for the schema's own). ``declared_units`` (a site's node config) override a header's
    unit suffix."""
    found: dict[str, tuple[int, str | None]] = {}
    by_name = {}
    for column in schema.columns:
        for name in (column.name, *column.aliases):
            by_name[normalise(name)] = column
    for j, cell in enumerate(header):
        base, unit = split_unit(cell)
        column = by_name.get(normalise(cell)) or by_name.get(normalise(base))
        if column is None:
            continue
        if column.name in found:
            raise SiteDataError(f"{source}: columns {header[found[column.name][0]]!r} and "
                                f"{cell!r} are both the schema's {column.name!r}")
        if by_name.get(normalise(cell)) is column:
            unit = None  # the whole header is a name: no unit suffix
        found[column.name] = (j, unit)
    for name, unit in (declared_units or {}).items():
        if name not in found:
            raise SiteDataError(f"{source}: a unit is declared for {name!r}, which is not a "
                                "column of this file")
        found[name] = (found[name][0], unit)
    for column in schema.columns:
        if column.unit_column is None or column.name not in found:
            continue
        j, unit = found[column.name]
        if unit is not None:
            raise SiteDataError(f"{source}: column {header[j]!r} gives one unit ({unit!r}) for "
                                f"the schema's {column.name!r}, whose rows name their own in "
                                f"column {column.unit_column!r} (schema unit-column)")
        at = [k for k, cell in enumerate(header)
              if normalise(cell) == normalise(column.unit_column)]
        if not at:
            raise SiteDataError(f"{source}: the schema's {column.name!r} takes each row's unit "
                                f"from column {column.unit_column!r}, which is not in the file "
                                f"(its columns: {', '.join(header)})")
        found[column.name] = (j, RowUnits(at[0], header[at[0]]))
    lacking = [c.name for c in schema.columns if c.type != "ignore" and c.name not in found]
    if lacking:
        raise SiteDataError(f"{source}: the schema's column(s) {', '.join(map(repr, lacking))} "
                            f"are not in the file (its columns: {', '.join(header)})")
    return found


def _accepted(column: Column) -> str:
    return ", ".join([column.unit or "(none)", *column.units])


def _factor(column: Column, unit: str | None, source: str) -> tuple[float, float]:
    if unit is None or unit == column.unit:
        return 1.0, 0.0
    if unit not in column.units:
        raise SiteDataError(f"{source}: column {column.name!r} is in {unit!r}, which the schema "
                            f"does not convert (accepted units: {_accepted(column)})")
    return column.units[unit], column.unit_offsets.get(unit, 0.0)


def _row_factors(values: np.ndarray, units: list[str], column: Column, source: str,
                 header: str, first_row: int, missing: frozenset):
    """Per row, the factor and offset that take its value to the schema's unit (schema
    ``unit-column``); a present value whose unit is absent or not converted is an error
    naming its row, the unit and how many rows share the problem."""
    factor, offset = np.ones(values.size), np.zeros(values.size)
    present = ~np.isnan(values)
    texts = np.asarray(units, dtype=object)
    for unit in dict.fromkeys(texts[present].tolist()):  # by first row, so an error names it
        rows = present & (texts == unit)
        first = int(np.flatnonzero(rows)[0])
        where = f"{source}: row {first_row + first + 1}, column {header!r}: {values[first]:g}"
        if unit in missing:
            raise SiteDataError(f"{where} has no unit in column {column.unit_column!r} "
                                f"({int(rows.sum())} such row(s)); the schema converts from "
                                f"{_accepted(column)}")
        if unit != column.unit and unit not in column.units:
            raise SiteDataError(f"{where} is in {unit!r} ({int(rows.sum())} row(s) in that "
                                f"unit), which the schema does not convert for {column.name!r} "
                                f"(accepted units: {_accepted(column)}; add it to the column's "
                                "units with its factor, or leave such rows out of the query)")
        if unit != column.unit:
            factor[rows] = column.units[unit]
            offset[rows] = column.unit_offsets.get(unit, 0.0)
    return factor, offset


def numeric_values(cells, column: Column, unit, source: str, header: str,
                   first_row: int = 0, missing: frozenset = _MISSING) -> np.ndarray:
    """A numeric column's cells parsed and converted to the schema's unit (NaN: missing),
    before its range is applied. ``unit``: the file's unit for the column (None: the
    schema's), or per row (:func:`row_units`). A numpy array of numbers (a Parquet
    column, a database's) is taken whole, NaN missing; ``first_row``: the table's rows
    before these cells (a table read in chunks names its rows from 1 all the same;
    ``missing``: the cell texts read as missing, the schema's ``missing_cells``)."""
    if isinstance(cells, np.ndarray) and cells.dtype.kind in "iuf":
        values = cells.astype(np.float64)  # a copy: the conversion below is in place
    else:
        values = _parsed(cells, source, header, first_row, missing)
    infinite = np.isinf(values)
    if infinite.any():
        i = int(np.flatnonzero(infinite)[0])
        raise SiteDataError(f"{source}: row {first_row + i + 1}, column {header!r}: {cells[i]!s} "
                            "is not a finite number")
    if isinstance(unit, list):
        factor, offset = _row_factors(values, unit, column, source, header, first_row, missing)
    else:
        factor, offset = _factor(column, unit, source)
    return values * factor + offset


def _parsed(cells, source: str, header: str, first_row: int,
            missing: frozenset = _MISSING) -> np.ndarray:
    values = np.full(len(cells), np.nan)
    for i, cell in enumerate(cells):
        if isinstance(cell, (float, int, np.floating, np.integer)) and not isinstance(cell, bool):
            values[i] = float(cell)
            continue
        text = "" if cell is None else str(cell).strip()
        if text in missing:
            continue
        try:
            if "_" in text:  # float() takes '1_000'; a table's reader must not
                raise ValueError(text)
            values[i] = float(text)
        except ValueError:
            raise SiteDataError(
                f"{source}: row {first_row + i + 1}, column {header!r}: {text!r} is not a number "
                f"(if it marks a missing cell, list it in the schema's 'missing-tokens', now "
                f"{', '.join(repr(t) for t in sorted(missing))})") from None
    return values


def _numeric(cells, column: Column, unit, source: str, header: str, first_row: int,
             missing: frozenset = _MISSING) -> np.ndarray:
    values = numeric_values(cells, column, unit, source, header, first_row, missing)
    if column.range is not None:
        lo, hi = column.range
        outside = ~np.isnan(values) & ((values < lo) | (values > hi))
        if np.any(outside) and column.out_of_range == "error":
            i = int(np.flatnonzero(outside)[0])
            raise SiteDataError(
                f"{source}: row {first_row + i + 1}, column {header!r}: {cells[i]!s} is outside the "
                f"schema's range [{lo:g}, {hi:g}] {column.unit or ''}".rstrip()
                + f" ({int(outside.sum())} such cell(s) in the column)")
        values[outside] = np.clip(values[outside], lo, hi)
    return values


def _categorical(cells, column: Column, source: str, header: str, first_row: int,
                 missing: frozenset = _MISSING) -> np.ndarray:
    levels = {level: j for j, level in enumerate(column.categories)}
    onehot = np.zeros((len(cells), len(levels)))
    for i, cell in enumerate(cells):
        text = cell_text(cell)
        if text in missing:
            onehot[i] = np.nan
            continue
        j = levels.get(text)
        if j is None:
            if column.other is None:
                raise SiteDataError(
                    f"{source}: row {first_row + i + 1}, column {header!r}: {text!r} is not one of the "
                    f"schema's categories ({', '.join(column.categories)})")
            j = levels[column.other]
        onehot[i, j] = column.category_weight
    return onehot


def encode_table(header: list[str], columns: list, schema: Schema, source: str,
                 declared_units: dict[str, str] | None = None, *, first_row: int = 0,
                 partial: bool = False) -> EncodedTable:
    """Encode a table given column-wise (``columns[j]``: the cells of ``header[j]``: text
    from a CSV file, or numbers from a .npy/Parquet file, a DataFrame or a database).
    ``first_row`` and ``partial``: these are rows ``first_row + 1, ...`` of a table read in
    chunks (a database's result), so a message names the table's row, and a chunk whose
    rows ``drop-row`` all dropped is no error (the reader checks the whole table).

    Raises
    ------
    SiteDataError
        A missing column, an unconvertible unit, a cell that is not a number, outside the
        range, an unknown category, a missing cell under ``missing = "error"``, or no row
        left after ``drop-row``; the message names file, row, column and value.
    """
    where = match_columns(header, schema, source, declared_units)
    n = len(columns[0]) if columns else 0
    parts, blocks, names, start = [], {}, schema.feature_names(), 0
    missing_rows = np.zeros(n, dtype=bool)
    drop = np.zeros(n, dtype=bool)
    labels = None
    id_cells = []
    for column in schema.columns:
        if column.type == "label":
            labels = np.asarray([cell_text(c) for c in columns[where[column.name][0]]])
        if column.type == "id":
            id_cells.append([cell_text(c) for c in columns[where[column.name][0]]])
        if not column.is_feature:
            continue
        j, unit = where[column.name]
        unit, cells = row_units(unit, columns), columns[j]
        if column.type == "numeric":
            block = _numeric(cells, column, unit, source, header[j], first_row,
                             schema.missing_cells)[:, None]
        else:
            block = _categorical(cells, column, source, header[j], first_row, schema.missing_cells)
        missing = np.isnan(block).any(axis=1)
        policy = schema.policy(column)
        if policy == "error" and missing.any():
            i = int(np.flatnonzero(missing)[0])
            raise SiteDataError(
                f"{source}: row {first_row + i + 1}, column {header[j]!r}: the cell is missing "
                f"({int(missing.sum())} missing in the column); the schema's missing policy "
                "for it is 'error' (choose drop-row, impute-mean or impute-median)")
        if policy == "drop-row":
            drop |= missing
        missing_rows = missing_rows | missing
        if column.missing_indicator:
            block = np.column_stack([block, missing.astype(np.float64)])
        parts.append(block)
        blocks[column.name] = slice(start, start + block.shape[1])
        start += block.shape[1]
    X = np.column_stack(parts) if parts else np.zeros((n, 0))
    keep = ~drop
    if n and not partial and not keep.any():
        raise SiteDataError(f"{source}: every one of its {n} rows has a missing cell in a "
                            "column whose policy is drop-row: no row is left")
    kept = X[keep] if drop.any() else X  # once, not a copy per column
    cells_missing = {c.name: int(np.isnan(kept[:, blocks[c.name]]).any(axis=1).sum())
                     for c in schema.features}
    ids = None
    if id_cells:  # several id columns: one id of their texts together
        ids = ["\0".join(parts) for parts, kept in zip(zip(*id_cells), keep) if kept]
    dropped = ["\0".join(cell_text(columns[j][i]) for j in range(len(columns)))
               for i in np.flatnonzero(drop).tolist()]
    return EncodedTable(np.ascontiguousarray(kept), names, blocks,
                        None if labels is None else labels[keep], keep, cells_missing, ids,
                        dropped)


def impute(table: EncodedTable, schema: Schema, fill: dict[str, np.ndarray]) -> np.ndarray:
    """The features with every NaN filled from ``fill`` (per feature column, the pooled
    mean or median of its block: a numeric column's value, a category's share of each
    level), as the run's transform fills them (``scaling.FeatureTransform.fill``)."""
    from fedcluster.common.scaling import FeatureTransform

    vector = np.full(table.X.shape[1], np.nan)
    for column in schema.features:
        block = table.blocks[column.name]
        width = block.stop - block.start - (1 if column.missing_indicator else 0)
        values = np.asarray(fill.get(column.name, []), dtype=np.float64).ravel()
        if np.isnan(table.X[:, block]).any() and values.shape != (width,):
            raise ValueError(f"column {column.name!r}: {width} fill value(s) needed, "
                             f"{values.size} given")
        if values.size:
            vector[block.start:block.start + width] = values
    return np.array(FeatureTransform.fill_only(vector).apply(table.X))  # a copy


def frame_columns(frame) -> tuple[list[str], list]:
    """A pandas DataFrame as (header, columns): each column's cells, a missing one (NaN,
    None, ``pd.NA``, ``NaT``) as None, which the encoding reads as a missing cell."""
    import pandas as pd  # only when a table is a DataFrame: pandas is optional

    header = [str(name) for name in frame.columns]
    columns = []
    for j in range(frame.shape[1]):
        cells = frame.iloc[:, j].to_numpy(dtype=object, copy=True)
        cells[np.asarray(pd.isna(cells), dtype=bool)] = None
        columns.append(cells)
    return header, columns

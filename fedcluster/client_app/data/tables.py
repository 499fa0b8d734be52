"""CSV/TSV parsing for a site's data file, as hospitals keep tables.

A header row names the columns. The node config says which are used:

- ``id-column``: a record identifier, dropped before anything else (never parsed);
- ``label-column``: kept at the site as labels (evaluation only);
- ``columns``: the feature columns, selected and ordered by header name (default: every
  other column).

Only numeric features can be clustered: a selected column with text in it is rejected
with a message naming every such column and its first non-numeric cell, and suggesting
``columns``. (Categories are not one-hot encoded: agreeing on them would make every site
disclose the category values it holds.) Every other problem is named by file, data row,
line and column. Errors are ``SiteDataError`` (``common.datasets``).
"""

from __future__ import annotations

import csv
import itertools
import math
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedcluster.common.datasets import SiteDataError
from fedcluster.common.schema import MISSING_TOKENS

DELIMITERS = {".csv": ",", ".tsv": "\t"}


def _error(message: str):
    return SiteDataError(message)


def _strict_float(cell: str) -> float:
    # float() also takes '1_000'; loadtxt does not, and both parsers must agree.
    if "_" in cell:
        raise ValueError(cell)
    return float(cell)


def _is_number(text: str) -> bool:
    try:
        _strict_float(text)
        return True
    except ValueError:
        return False


def read_header(path: Path, delimiter: str) -> list[str]:
    """The column names of line 1, checked: present, named, unique, not data."""
    source = str(path)
    try:
        with open(path, encoding="utf-8-sig", newline="") as f:  # -sig: Excel writes a BOM
            header = next(csv.reader(f, delimiter=delimiter), None)
    except UnicodeDecodeError as error:
        raise _error(f"{source}: is not UTF-8 text ({error.reason}); save it as UTF-8") from None
    if header is None:
        raise _error(f"{source}: the file is empty")
    names = [name.strip() for name in header]
    if not any(names):
        raise _error(f"{source}: line 1 is empty; a header row with column names is required")
    if len(names) == 1:
        other = next((d for d in ";\t," if d != delimiter and d in names[0]), None)
        if other:
            raise _error(f"{source}: the header has one column {names[0]!r}; the file seems to "
                         f"be separated by {other!r}, but {delimiter!r} is expected")
    if all(_is_number(name) for name in names):
        raise _error(f"{source}: line 1 {header!r} looks like data; a header row with "
                     "column names is required")
    if "" in names:
        raise _error(f"{source}: column {names.index('') + 1} of the header has no name")
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise _error(f"{source}: duplicate column names in the header: {', '.join(duplicates)}")
    return names


@dataclass(frozen=True)
class ColumnPlan:
    """Which header columns are features (in output order) and which one is the label."""

    names: list[str]
    features: list[int]
    label: int | None


def plan_columns(source: str, names: list[str], label_column: str | None,
                 columns: tuple[str, ...] | None, id_column: str | None) -> ColumnPlan:
    """Resolve the node config's column keys against the header; a name that is not in
    the header, or a column given two roles, is an error naming it."""
    listing = ", ".join(names)

    def index_of(key: str, name: str) -> int:
        if name not in names:
            raise _error(f"{source}: {key} {name!r} is not in the header (columns: {listing})")
        return names.index(name)

    id_index = index_of("id-column", id_column) if id_column is not None else None
    label = index_of("label-column", label_column) if label_column is not None else None
    if id_index is not None and id_index == label:
        raise _error(f"{source}: {id_column!r} is both the id-column and the label-column")
    if columns is None:
        features = [j for j in range(len(names)) if j not in (id_index, label)]
    else:
        features = [index_of("columns entry", name) for name in columns]
        for j, role in ((id_index, "id-column"), (label, "label-column")):
            if j is not None and j in features:
                raise _error(f"{source}: {names[j]!r} is the {role}; it cannot also be in columns")
    if not features:
        raise _error(f"{source}: has no feature columns")
    return ColumnPlan(names, features, label)


#: What reads a missing cell of a plain file (the same tokens as a schema's default
#: ``missing-tokens``, ``schema.MISSING_TOKENS``).
MISSING_HINT = (" (run config 'missing' is \"error\": \"impute-mean\" fills a missing cell "
                "with the pooled mean of its column; a schema's columns can also drop its row)")


def _non_numeric_error(source: str, names: list[str], text_cells: dict[int, str]) -> Exception:
    columns = ", ".join(repr(names[j]) for j in text_cells)
    what = f"column {columns} is" if len(text_cells) == 1 else f"columns {columns} are"
    details = "; ".join(text_cells.values())
    return _error(f"{source}: {what} not numeric ({details}). Only numeric columns can be "
                  "clustered: choose the numeric ones with the node-config key 'columns' "
                  "(categories are not encoded); a text that marks a missing cell is read as "
                  "missing when the site reads its file through a schema that lists it in "
                  "'missing-tokens' (node config 'schema-path')")


def _scan_csv(path: Path, plan: ColumnPlan, delimiter: str,
              label_codes: dict[str, int]) -> tuple[np.ndarray, list[int]]:
    """Parse with the csv module and find what is wrong, by position.

    The scan goes on past a bad cell so that every non-numeric feature column is named at
    once (categorical columns); otherwise the first problem in file order is raised.
    """
    source, names, n_fields = str(path), plan.names, len(plan.names)
    rows: list[list[float]] = []
    codes: list[int] = []
    text_cells: dict[int, str] = {}  # feature column -> its first non-numeric cell, described
    first_problem: str | None = None
    label_codes.clear()
    n_data = 0
    with open(path, encoding="utf-8-sig", newline="") as f:
        reader = csv.reader(f, delimiter=delimiter)
        next(reader)
        try:
            for record in reader:
                if not record:  # blank line, skipped as np.loadtxt does
                    continue
                n_data += 1
                where = f"{source}: data row {n_data} (line {reader.line_num})"
                if len(record) != n_fields:
                    first_problem = first_problem or (
                        f"{where} has {len(record)} field{'s' * (len(record) != 1)}; "
                        f"the header has {n_fields}")
                    continue
                if plan.label is not None:
                    text = record[plan.label].strip()
                    if not text:
                        first_problem = first_problem or f"{where}, column {names[plan.label]!r}: the cell is empty"
                    codes.append(label_codes.setdefault(text, len(label_codes)))
                values = []
                for j in plan.features:
                    if j in text_cells:
                        continue
                    cell = record[j]
                    text = cell.strip()
                    if text in MISSING_TOKENS:  # the cells a schema reads as missing, here too
                        first_problem = first_problem or f"{where}, column {names[j]!r}: " + (
                            f"{cell!r} is a missing cell" if text else "the cell is empty") + MISSING_HINT
                        continue
                    try:
                        value = _strict_float(text)
                    except ValueError:
                        text_cells[j] = f"{where.removeprefix(source + ': ')}, column {names[j]!r}: " \
                                        f"{cell!r} is not a number"
                        continue
                    if not math.isfinite(value):
                        first_problem = first_problem or (
                            f"{where}, column {names[j]!r}: {cell!r} is not a finite number")
                    values.append(value)
                if first_problem is None and not text_cells:
                    rows.append(values)
        except UnicodeDecodeError as error:
            raise _error(f"{source}: after data row {n_data} (line {reader.line_num}): "
                         f"not UTF-8 text ({error.reason})") from None
    if text_cells:
        raise _non_numeric_error(source, names, dict(sorted(text_cells.items())))
    if first_problem is not None:
        raise _error(first_problem)
    return np.array(rows, dtype=np.float64).reshape(len(rows), len(plan.features)), codes


def encode_labels(first_seen: list[str], codes: np.ndarray) -> tuple[np.ndarray, tuple[str, ...] | None]:
    """Map labels (given as codes into `first_seen`) to int64: integers stay, others are coded
    0..m-1 in sorted order (numeric order when all are numbers) and their names returned."""
    numbers = [float(s) for s in first_seen] if all(map(_is_number, first_seen)) else None
    if numbers is not None and all(v.is_integer() and abs(v) < 2**53 for v in numbers):
        return np.asarray(numbers, dtype=np.int64)[codes], None
    order = sorted(range(len(first_seen)), key=(lambda i: numbers[i]) if numbers else (lambda i: first_seen[i]))
    final = np.empty(len(first_seen), dtype=np.int64)
    final[order] = np.arange(len(order))
    return final[codes], tuple(first_seen[i] for i in order)


def read_column(path: Path, name: str) -> list[str]:
    """The cells of column ``name`` of a delimited text file, as text (e.g. its ids, which
    are never parsed as numbers), one per data row in file order (blank lines skipped,
    as :func:`parse_csv` skips them)."""
    delimiter = DELIMITERS[Path(path).suffix.lower()]
    j = read_header(Path(path), delimiter).index(name)
    with open(path, encoding="utf-8-sig", newline="") as f:
        reader = csv.reader(f, delimiter=delimiter)
        next(reader)
        return [record[j] for record in reader if record]


#: Lines numpy's parser reads at a time (each chunk's whole row, every column, is a
#: temporary; the features go straight into the one array returned).
PARSE_CHUNK_LINES = 1 << 13


def _parse_fast(path: Path, delimiter: str, plan: ColumnPlan, converters: dict):
    """(features, label codes) by numpy's C parser, PARSE_CHUNK_LINES lines at a time into
    one array sized by the file's line count (grown if the count fell short), so a large
    file's peak is about its features once, not the whole table twice; None if a chunk
    does not parse or holds a non-finite feature (``_scan_csv`` then finds it)."""
    with open(path, "rb") as raw:  # an upper bound of the rows (less the header)
        lines = sum(block.count(b"\n") for block in iter(lambda: raw.read(1 << 24), b""))
    out = np.empty((max(lines, 1), len(plan.features)))
    codes, at = [], 0
    with open(path, encoding="utf-8-sig", newline=None) as text:
        next(text, None)  # the header
        while True:
            try:  # (a UnicodeDecodeError is a ValueError: _scan_csv names its row)
                chunk = list(itertools.islice(text, PARSE_CHUNK_LINES))
                if not chunk:
                    break
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # "input contained no data": said later
                    table = np.loadtxt(chunk, delimiter=delimiter, ndmin=2, dtype=np.float64,
                                       comments=None, quotechar='"',
                                       converters=converters or None)
            except ValueError:
                return None
            if not table.shape[0]:
                continue
            # loadtxt only checks that rows agree with each other, not with the header
            if table.shape[1] != len(plan.names) or not np.isfinite(table[:, plan.features]).all():
                return None
            if at + table.shape[0] > out.shape[0]:  # a line ending the count did not see
                out = np.concatenate([out[:at], np.empty((max(at, table.shape[0]), out.shape[1]))])
            out[at:at + table.shape[0]] = table[:, plan.features]
            if plan.label is not None:
                codes.append(table[:, plan.label].astype(np.int64))
            at += table.shape[0]
    return out[:at], (np.concatenate(codes) if codes else [])


def parse_csv(path: Path, label_column: str | None = None, columns: tuple[str, ...] | None = None,
              id_column: str | None = None):
    """Parse a delimited text file -> (X, feature_names, labels, label_names)."""
    source, delimiter = str(path), DELIMITERS[path.suffix.lower()]
    plan = plan_columns(source, read_header(path, delimiter), label_column, columns, id_column)
    seen: dict[str, int] = {}

    def label_code(cell: str) -> float:
        text = cell.strip()
        if not text:
            raise ValueError("empty label")
        return float(seen.setdefault(text, len(seen)))

    # Columns that are not used (the id, unselected ones) are read as 0 and never parsed,
    # so text there is no error; numpy still checks every row's field count.
    converters = {j: (lambda cell: 0.0) for j in range(len(plan.names))
                  if j not in plan.features and j != plan.label}
    if plan.label is not None:
        converters[plan.label] = label_code
    # fast path: numpy's C parser; any problem is re-found by _scan_csv with its position
    fast = _parse_fast(path, delimiter, plan, converters)
    table, codes = fast if fast is not None else _scan_csv(path, plan, delimiter, seen)
    if table.shape[0] == 0:
        raise _error(f"{source}: has a header row but no data rows")
    feature_names = tuple(plan.names[j] for j in plan.features)
    if plan.label is None:
        return table, feature_names, None, None
    labels, label_names = encode_labels(list(seen), np.asarray(codes, dtype=np.int64))
    return table, feature_names, labels, label_names

"""Reading a site's table as it is, column by column, for encoding against the agreed
schema (``common/table_encoding.py``): a header and, per column, its cells. Used by a site
that holds a schema (``schema-path``) and by ``fedcluster site check``.

A CSV/TSV file gives text cells. A Parquet file (the ``parquet`` extra: pyarrow, imported
only when a Parquet file is read) gives, per column by its Parquet type:

* **numbers** (integer, floating point, decimal): a numpy array; float64 with NaN for a
  null, except an integer column without a null, which keeps its integer dtype (so that a
  label or id column's values read as they would from a CSV file: ``3``, not ``3.0``);
* **text** (string, large string, string view; dictionary-encoded or pandas categorical
  too): a list of str, ``""`` for a null: the empty cell of a CSV file, which the
  encoding and the check read as missing;
* **booleans**: a list of the text ``"true"``/``"false"`` (``""`` for a null), to be
  listed in the schema as a categorical with those levels (as a number it is an error
  naming the cell);
* a column of nulls only: a list of ``""`` (all missing).

Any other type (dates, timestamps, durations, binary, lists, structs, ...) is an error
naming the column and its type.
"""

from __future__ import annotations

import csv
import os
import re
from pathlib import Path

import numpy as np

from fedcluster.client_app.data.tables import DELIMITERS
from fedcluster.common.datasets import SiteDataError

#: The file types a table read through a schema may have.
TABLE_SUFFIXES = (".csv", ".tsv", ".parquet")
#: Rows a Parquet file is converted by at a time (its Arrow data is held one batch at a time).
PARQUET_BATCH_ROWS = 65_536


def read_table(path: str | Path) -> tuple[list[str], list]:
    """(header, columns of cells) of a CSV/TSV file with a header row (cells as text) or
    of a Parquet file (cells as the module's docstring says).

    Raises
    ------
    SiteDataError
        Not a .csv/.tsv/.parquet file, unreadable, not UTF-8, no header or no data row, or a
        row whose number of fields differs from the header's (named by data row and line);
        for Parquet: pyarrow not installed, a file pyarrow cannot read (its reason), no data
        row, or a column of a type other than numbers, text or booleans (named).
    """
    path = Path(path)
    if path.suffix.lower() == ".parquet":
        return _read_parquet(path)
    delimiter = DELIMITERS.get(path.suffix.lower())
    if delimiter is None:
        raise SiteDataError(f"{path}: unsupported file type {path.suffix or '(none)'!r} for a "
                            f"table read through a schema; supported: {', '.join(TABLE_SUFFIXES)}")
    try:
        with open(path, encoding="utf-8-sig", newline="") as f:
            reader = csv.reader(f, delimiter=delimiter)
            header = next(reader, None)
            if not header:
                raise SiteDataError(f"{path}: the file is empty")
            rows = []
            for record in reader:
                if not record:
                    continue
                if len(record) != len(header):
                    raise SiteDataError(
                        f"{path}: data row {len(rows) + 1} (line {reader.line_num}) has "
                        f"{len(record)} fields; the header has {len(header)}")
                rows.append(record)
    except UnicodeDecodeError as err:
        raise SiteDataError(f"{path}: is not UTF-8 text ({err.reason}); save it as UTF-8") from None
    except OSError as err:
        raise SiteDataError(f"{path}: cannot be read ({err.strerror})") from None
    if not rows:
        raise SiteDataError(f"{path}: has a header row but no data rows")
    return [h.strip() for h in header], [list(col) for col in zip(*rows)]


def data_row_line(path: str | os.PathLike, data_row: int) -> int | None:
    """The line of a CSV/TSV file on which its data row ``data_row`` (1-based, blank lines
    not counted, as :func:`read_table` counts them) starts; None for another file, or a
    row the file does not have."""
    path = Path(path)
    delimiter = DELIMITERS.get(path.suffix.lower())
    if delimiter is None or data_row < 1:
        return None
    try:
        with open(path, encoding="utf-8-sig", newline="") as f:
            reader = csv.reader(f, delimiter=delimiter)
            next(reader, None)  # the header
            seen, before = 0, reader.line_num
            for record in reader:
                if record:
                    seen += 1
                    if seen == data_row:
                        return before + 1
                before = reader.line_num
    except (OSError, UnicodeDecodeError, csv.Error):
        return None
    return None


def with_file_line(error: SiteDataError, path: str | os.PathLike) -> SiteDataError:
    """``error`` (a cell's, naming its data row: "row N, column ...") with the line of
    the file that row starts on, for an operator who opens the file in an editor: a
    quoted cell over several lines or a blank line makes the two differ."""
    match = re.search(r"\brow (\d+), column ", str(error))
    line = None if match is None else data_row_line(path, int(match.group(1)))
    if line is None:
        return error
    return SiteDataError(f"{error} (data row {match.group(1)} starts on line {line} of "
                         f"{Path(path).name})")


def _kind(path: Path, name: str, arrow_type) -> str:
    """"number", "text", "bool" or "null": how a Parquet column is read."""
    import pyarrow as pa

    types = pa.types
    if types.is_dictionary(arrow_type):
        return _kind(path, name, arrow_type.value_type)
    if types.is_integer(arrow_type) or types.is_floating(arrow_type) or types.is_decimal(arrow_type):
        return "number"
    if types.is_string(arrow_type) or types.is_large_string(arrow_type) or types.is_string_view(arrow_type):
        return "text"
    if types.is_boolean(arrow_type):
        return "bool"
    if types.is_null(arrow_type):
        return "null"
    raise SiteDataError(f"{path}: column {name!r} has the Parquet type {arrow_type}, which a "
                        "table read through a schema cannot hold (numbers, text and booleans "
                        "can: write it as one of them)")


def _cells(array, kind: str):
    """One batch of a column: a numpy array (numbers) or a list of str."""
    import pyarrow as pa

    if pa.types.is_dictionary(array.type):
        array = array.dictionary_decode()
    if kind == "number":
        if pa.types.is_integer(array.type) and array.null_count == 0:
            return array.to_numpy()
        if not pa.types.is_floating(array.type) or pa.types.is_float16(array.type):
            array = array.cast(pa.float64())  # integers with nulls, decimals, half floats
        return array.to_numpy(zero_copy_only=False).astype(np.float64, copy=False)
    if kind == "null":
        return [""] * len(array)
    if kind == "bool":
        return ["" if v is None else ("true" if v else "false") for v in array.to_pylist()]
    return ["" if v is None else v for v in array.to_pylist()]


def _join(parts: list, kind: str):
    if kind != "number":
        return [cell for part in parts for cell in part]
    if all(part.dtype.kind in "iu" for part in parts):
        return np.concatenate(parts)
    return np.concatenate([part.astype(np.float64, copy=False) for part in parts])


def _read_parquet(path: Path) -> tuple[list[str], list]:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise SiteDataError(f"{path}: reading Parquet needs pyarrow: pip install "
                            "'fedcluster[parquet]'") from None
    try:
        with open(path, "rb"):  # the CSV reader's message for a file that cannot be opened
            pass
    except OSError as err:
        raise SiteDataError(f"{path}: cannot be read ({err.strerror})") from None
    try:
        parquet = pq.ParquetFile(path)
        fields = list(parquet.schema_arrow)
        if not fields:
            raise SiteDataError(f"{path}: the file has no columns")
        kinds = [_kind(path, f.name, f.type) for f in fields]
        if parquet.metadata.num_rows == 0:
            raise SiteDataError(f"{path}: has no data rows")
        parts: list[list] = [[] for _ in fields]
        for batch in parquet.iter_batches(batch_size=PARQUET_BATCH_ROWS):
            for j, kind in enumerate(kinds):
                parts[j].append(_cells(batch.column(j), kind))
    except (pa.ArrowException, OSError) as err:
        raise SiteDataError(f"{path}: cannot be read as Parquet ({err})") from None
    columns = [_join(p, kind) for p, kind in zip(parts, kinds)]
    if not len(columns[0]):
        raise SiteDataError(f"{path}: has no data rows")
    return [f.name.strip() for f in fields], columns


def parquet_columns(path: str | Path) -> list[str]:
    """The column names of a Parquet file, from its footer (the rows are not read)."""
    path = Path(path)
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise SiteDataError(f"{path}: reading Parquet needs pyarrow: pip install "
                            "'fedcluster[parquet]'") from None
    try:
        return [str(name) for name in pq.read_schema(path).names]
    except (OSError, ValueError) as err:  # pyarrow's ArrowInvalid is a ValueError
        raise SiteDataError(f"{path}: cannot be read as Parquet ({err})") from None

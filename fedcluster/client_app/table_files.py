"""Reading a site's table as it is, column by column, for encoding against the agreed
schema (``common/table_encoding.py``): a header and, per column, its cells (text from a
CSV/TSV file). Used by a site that holds a schema (``schema-path``) and by
``fedcluster site check``.
"""

from __future__ import annotations

import csv
from pathlib import Path

from fedcluster.client_app.tables import DELIMITERS
from fedcluster.common.datasets import SiteDataError

#: The file types a table read through a schema may have.
TABLE_SUFFIXES = (".csv", ".tsv")


def read_table(path: str | Path) -> tuple[list[str], list[list[str]]]:
    """(header, columns of cells as text) of a CSV/TSV file with a header row.

    Raises
    ------
    SiteDataError
        Not a .csv/.tsv file, unreadable, not UTF-8, no header or no data row, or a row
        whose number of fields differs from the header's (named by data row and line).
    """
    path = Path(path)
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

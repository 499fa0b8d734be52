"""A site's rows from a SQL database: the connection, the one read-only query, its cells.

The node config names the database by ``data-url``, a SQLAlchemy URL
(``sqlite:///site.db``, the embedded default; ``postgresql+psycopg://user@host:5432/db``
with the ``postgres`` extra), and what to read by ``data-query`` (one SELECT, or
``data-query-file``) or ``data-table``. SQLAlchemy (installed with Flower) is the one way
to a database; its dialects use the databases' own drivers (Python's ``sqlite3``,
psycopg 3).

The password never appears in the node config, a log, the ledger, the cache key or an
error: a ``data-url`` holding one is refused unshown (``node_config.py``). It comes from
the driver's standard environment (libpq's ``PGPASSWORD`` and ``PGPASSFILE``) or from
``data-password-file`` (its first line), and any message of the database's that could
hold it has it blanked.

The session only reads: PostgreSQL runs the query in a READ ONLY transaction at
REPEATABLE READ (one snapshot, whatever changes during the read) under a
``statement_timeout``; SQLite opens the file read-only (``mode=ro``: a missing file is
an error, not a new empty database), with ``query_only`` on, and is interrupted past the
timeout. The query's text must start with SELECT or WITH; the read-only session refuses
whatever writes all the same. The result streams in chunks from a server-side cursor
(``stream_results``), so a large result is never held whole.

Every problem is a ``SiteDataError`` that names the node-config key (``data-url``,
``data-query``, ...), with the database's own message where it gave one.
"""

from __future__ import annotations

import contextlib
import decimal
import itertools
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedcluster.common.datasets import SiteDataError

#: Cells per chunk of the result (its rows x columns): bounds the Python objects a chunk
#: makes (about 32 MB at 64 columns) whatever the result's size.
CHUNK_CELLS = 1 << 20
#: The first words a read-only query may start with.
QUERY_WORDS = ("select", "with")
_COMMENT = re.compile(r"\s+|--[^\n]*(\n|$)|/\*.*?\*/", re.S)


@dataclass(frozen=True)
class SqlSource:
    """What a site reads from a database (its node config's SQL keys, checked).

    Attributes
    ----------
    url : str
        ``data-url`` (a SQLAlchemy URL without a password).
    query : str or None
        The SELECT (``data-query``, or the text of ``data-query-file``).
    table : str or None
        ``data-table``: the table (``schema.table``) read whole.
    key : str
        Which key says what to read, as messages name it.
    password_file : str or None
        ``data-password-file``.
    timeout : float
        ``data-timeout``, seconds: the longest the query and the read may take.
    """

    url: str
    query: str | None
    table: str | None
    key: str
    password_file: str | None = None
    timeout: float = 600.0

    @property
    def shown_url(self) -> str:
        """The URL as messages show it (never a password)."""
        return _parse_url(self.url).render_as_string(hide_password=True)

    @property
    def source(self) -> str:
        """How the site's rows are named in its messages: the URL and the key."""
        return f"{self.shown_url} ({self.key})"

    @property
    def reading(self) -> tuple:
        """What is read, whatever the result holds: the URL (no password), the query's
        text or the table."""
        return ("sql", self.shown_url, self.query, self.table)


def _parse_url(url: str):
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        return make_url(url)
    except ArgumentError:
        # SQLAlchemy's message repeats the URL, which may hold a password: not shown.
        raise SiteDataError("data-url is not a SQLAlchemy URL (dialect+driver://user@host:port/"
                            "database, or sqlite:///path/to/site.db); it is not shown here, "
                            "as it may hold a password") from None


def url_has_password(url: str) -> bool:
    """Whether ``url`` carries a password (which a node config must never hold)."""
    return _parse_url(url).password is not None


def sql_source(url: str, query: str | None = None, query_file: str | None = None,
               table: str | None = None, password_file: str | None = None,
               timeout: float = 600.0) -> SqlSource:
    """The checked :class:`SqlSource` of a node config's keys.

    Raises
    ------
    SiteDataError
        Not exactly one of ``data-query``, ``data-query-file`` and ``data-table``; a query
        file that cannot be read; a query that is not one SELECT; a URL with a password or
        of a database no driver here reads.
    """
    given = [k for k, v in (("data-query", query), ("data-query-file", query_file),
                            ("data-table", table)) if v is not None]
    if len(given) != 1:
        raise SiteDataError(f"data-url needs exactly one of data-query, data-query-file and "
                            f"data-table (what to read); the node config has "
                            f"{', '.join(given) or 'none'}")
    key = given[0]
    if query_file is not None:
        try:
            query = Path(query_file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise SiteDataError(f"data-query-file {query_file}: cannot be read "
                                f"({getattr(err, 'strerror', None) or err})") from None
        key = f"data-query-file {query_file}"
    if query is not None:
        query = check_select(query, key)
    elif not re.fullmatch(r"[A-Za-z_][\w$]*(\.[A-Za-z_][\w$]*)?", table.strip()):
        raise SiteDataError(f"data-table {table!r} is not a table name (name or schema.name)")
    else:
        table = table.strip()
        key = f"data-table {table}"
    parsed = _parse_url(url)
    if parsed.password is not None:
        raise SiteDataError("data-url holds a password: give it in data-password-file or the "
                            "driver's environment (PGPASSWORD, PGPASSFILE) instead")
    if parsed.get_backend_name() == "sqlite" and password_file is not None:
        raise SiteDataError("data-password-file is for a database server; a SQLite file has "
                            "no password")
    return SqlSource(url, query, table, key, password_file, float(timeout))


def check_select(query: str, key: str = "data-query") -> str:
    """``query`` without a trailing ``;`` if it starts, past comments, with SELECT or
    WITH; else a ``SiteDataError`` naming ``key`` and the word it starts with."""
    text = query.strip().rstrip(";").strip()
    head = text
    while (match := _COMMENT.match(head)) and match.end():
        head = head[match.end():]
    word = re.match(r"\(*\s*([A-Za-z]*)", head).group(1)
    if word.lower() not in QUERY_WORDS:
        shown = word or head[:20] or "(nothing)"
        raise SiteDataError(f"{key}: must be one read-only SELECT (or WITH ... SELECT); it "
                            f"starts with {shown!r}")
    return text


# ------------------------------------------------------------------ the session
def _password(source: SqlSource) -> str | None:
    if source.password_file is None:
        return None
    try:
        lines = Path(source.password_file).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise SiteDataError(f"data-password-file {source.password_file}: cannot be read "
                            f"({getattr(err, 'strerror', None) or type(err).__name__})") from None
    if not lines or not lines[0]:
        raise SiteDataError(f"data-password-file {source.password_file}: the first line is "
                            "empty; it holds the password")
    return lines[0]


def _blanked(message: str, secrets: list[str | None]) -> str:
    for secret in secrets:
        if secret:
            message = message.replace(secret, "***")
    return message.strip()


def _engine(source: SqlSource, password: str | None):
    """The engine: a SQLite file opened read-only; a server with its connect timeout."""
    import sqlalchemy as sa

    url = _parse_url(source.url)
    if url.get_backend_name() == "sqlite":
        path = url.database or ""
        if path in ("", ":memory:") or path.startswith("file:"):
            raise SiteDataError(f"data-url {source.shown_url}: name the SQLite file "
                                "(sqlite:///path/to/site.db)")
        if not Path(path).is_file():
            raise SiteDataError(f"data-url {source.shown_url}: the SQLite file {path} does "
                                "not exist")
        uri = "file:" + Path(path).resolve().as_posix() + "?mode=ro"
        return sa.create_engine(url.set(database=uri, query={"uri": "true"}),
                                poolclass=sa.pool.NullPool)
    args = {"connect_timeout": max(1, int(min(source.timeout, 30)))}
    if password is not None:
        args["password"] = password
    try:
        engine = sa.create_engine(url, connect_args=args, poolclass=sa.pool.NullPool)
    except (ImportError, sa.exc.NoSuchModuleError) as err:
        raise SiteDataError(f"data-url {source.shown_url}: no driver for it here ({err}); "
                            "for PostgreSQL: pip install 'fedcluster[postgres]'") from None
    if engine.dialect.driver == "psycopg":
        sa.event.listen(engine, "connect", _binary_results)
    return engine


def _binary_results(connection, _record) -> None:
    """psycopg's server-side cursors fetch in the binary format: a double precision cell
    arrives as its 8 bytes, not as text to parse (3 x faster here, the same bits)."""
    from psycopg import ServerCursor, pq

    class BinaryServerCursor(ServerCursor):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.format = pq.Format.BINARY

    connection.server_cursor_factory = BinaryServerCursor


def _read_only(conn, source: SqlSource) -> None:
    """Make the connection's transaction read-only, one snapshot, timed."""
    dialect = conn.dialect.name
    if dialect == "postgresql":
        conn.exec_driver_sql(f"SET LOCAL statement_timeout = {int(source.timeout * 1000)}")
    elif dialect == "sqlite":
        raw = conn.connection.dbapi_connection
        raw.execute("PRAGMA query_only = ON")
        deadline = time.monotonic() + source.timeout
        raw.set_progress_handler(lambda: int(time.monotonic() > deadline), 10_000)


@contextlib.contextmanager
def query_result(source: SqlSource):
    """Connect, run the query in a read-only snapshot, yield ``(column names, chunks)``:
    ``chunks`` yields lists of row tuples, :data:`CHUNK_CELLS` cells at a time.

    Raises
    ------
    SiteDataError
        Cannot connect (the database's message, the password blanked); the query refused
        (its message); the read took longer than ``data-timeout``; no column.
    """
    import sqlalchemy as sa

    password = _password(source)
    secrets = [password, os.environ.get("PGPASSWORD")]
    engine = _engine(source, password)
    options = {}
    if engine.dialect.name == "postgresql":
        options.update(isolation_level="REPEATABLE READ", postgresql_readonly=True)
    stage = "connect"
    try:
        with engine.connect() as conn:
            conn = conn.execution_options(**options)
            stage = "query"
            _read_only(conn, source)
            statement = sa.text(source.query) if source.query is not None else \
                sa.select(sa.text("*")).select_from(sa.table(
                    source.table.split(".")[-1],
                    schema=source.table.split(".")[0] if "." in source.table else None))
            result = conn.execute(statement, execution_options={"stream_results": True})
            names = [str(name) for name in result.keys()]
            if not names:
                raise SiteDataError(f"{source.source}: the result has no column")
            deadline = time.monotonic() + source.timeout

            def chunks():
                for part in result.partitions(max(1, CHUNK_CELLS // len(names))):
                    if time.monotonic() > deadline:
                        raise SiteDataError(f"{source.source}: the read took longer than "
                                            f"data-timeout ({source.timeout:g} s)")
                    yield part

            yield names, chunks()
            conn.rollback()  # a read-only transaction: nothing to keep
    except sa.exc.DBAPIError as err:
        detail = _blanked(str(err.orig) if err.orig is not None else str(err), secrets)
        detail = detail.splitlines()[0] if stage == "query" else " ".join(detail.split())
        if stage == "connect":
            raise SiteDataError(f"data-url {source.shown_url}: cannot connect: {detail}") from None
        what = "data-table" if source.table is not None else source.key.split(" ")[0]
        raise SiteDataError(f"{what} on {source.shown_url}: the database refused it: "
                            f"{detail}") from None
    finally:
        engine.dispose()


# ------------------------------------------------------------------ cells
def chunk_columns(rows, names: list[str], source: str) -> list:
    """A chunk of rows (tuples) as columns of cells, as ``table_files`` gives a file's:
    numbers as a numpy array (float64, NaN for NULL; int64 when all are integers and none
    is NULL), text as a list of str (``""`` for NULL), booleans as ``"true"``/``"false"``,
    a column mixing numbers and text (SQLite's dynamic types) as its cells.

    Raises
    ------
    SiteDataError
        A cell of another type (a date, bytes, ...), naming the column and type.
    """
    if rows and all(type(v) is float for v in rows[0]) \
            and set(map(type, itertools.chain.from_iterable(rows))) == {float}:
        # Every cell a float (double precision columns, no NULL): the chunk in one pass.
        block = np.fromiter(itertools.chain.from_iterable(rows), dtype=np.float64,
                            count=len(rows) * len(names)).reshape(len(rows), len(names))
        return [block[:, j].copy() for j in range(len(names))]
    return [_cells(column, name, source) for name, column in zip(names, zip(*rows))]


_NUMBERS = (int, float, decimal.Decimal)


def _cells(column: tuple, name: str, source: str):
    kinds = set(map(type, column))
    nulls = type(None) in kinds
    kinds.discard(type(None))
    if not kinds:
        return [""] * len(column)
    if kinds <= {int} and not nulls:
        with contextlib.suppress(OverflowError):  # beyond int64: read as text
            return np.array(column, dtype=np.int64)
    if kinds <= {int, float, decimal.Decimal}:
        if nulls:
            return np.array([np.nan if v is None else v for v in column], dtype=np.float64)
        return np.array(column, dtype=np.float64)
    if kinds == {bool}:
        return ["" if v is None else ("true" if v else "false") for v in column]
    other = [k for k in kinds if k is not str and not issubclass(k, _NUMBERS)]
    if other:
        raise SiteDataError(f"{source}: column {name!r} holds {other[0].__name__} values, which "
                            "a site cannot read (numbers, text and booleans can): select it "
                            "as a number or as text (CAST)")
    return ["" if v is None else v for v in column]

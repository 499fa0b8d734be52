"""``fedcluster partition``: a built-in data set written as its sites' data. As CSV
files (``--format csv``, the default: one file per site; the clinical demo with its
``schema.toml``, ``clinical_demo.py``), or, for sites that read a database (node config
``data-url``), into SQL databases: ``--format sqlite`` (one table ``site`` per site,
typed: numbers as double precision, text as text, an empty cell as NULL) and, for the
clinical demo, ``--format omop`` (the OMOP CDM v5.4 tables, ``omop_demo.py``).

By default each site is a SQLite file ``site-<i>.db`` in the output directory (SQLite
is Python's own); ``--database-url`` names one database per site instead (PostgreSQL
with the ``postgres`` extra), whose password comes from the driver's environment
(``PGPASSWORD``, ``PGPASSFILE``), never from the URL. Everything goes through SQLAlchemy
Core (installed with Flower): no hand-written SQL driver, and the same code for both.
"""

from __future__ import annotations

from pathlib import Path

#: The table a site's rows are written to (``--format sqlite``).
SITE_TABLE = "site"


def database_urls(out_dir: str | Path, n_sites: int, urls: list[str] | None = None) -> list[str]:
    """One SQLAlchemy URL per site: ``urls`` (one per site, checked), else a fresh SQLite
    file ``site-<i>.db`` in ``out_dir`` (an existing one is replaced)."""
    if urls:
        if len(urls) != n_sites:
            raise ValueError(f"--database-url names {len(urls)} database(s) for {n_sites} sites; "
                             "give one per site")
        from sqlalchemy.engine import make_url

        if any(make_url(url).password is not None for url in urls):
            raise ValueError("--database-url holds a password: give it in PGPASSWORD or "
                             "PGPASSFILE instead (it is not shown)")
        return list(urls)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"site-{i}.db" for i in range(n_sites)]
    for path in paths:
        path.unlink(missing_ok=True)
    return [f"sqlite:///{path.resolve().as_posix()}" for path in paths]


def write_table(url: str, name: str, header: list[str], columns: list) -> int:
    """Replace table ``name`` of ``url`` with ``columns`` (per header cell: floats, NaN
    missing, written as double precision; or text, "" missing, written as text; both
    NULL where missing). Returns the rows written."""
    import numpy as np
    import sqlalchemy as sa

    numeric = [isinstance(col, np.ndarray) and col.dtype.kind == "f" for col in columns]
    table = sa.Table(name, sa.MetaData(), *[
        sa.Column(h, sa.Float(precision=53) if num else sa.Text) for h, num in zip(header, numeric)])
    keys = [f"c{j}" for j in range(len(header))]  # bind names: a header may hold any text
    cells = [[None if (v != v if num else v == "") else (float(v) if num else str(v))
              for v in col] for col, num in zip(columns, numeric)]
    rows = [dict(zip(keys, row)) for row in zip(*cells)]
    from fedcluster.common.omop_demo import engine

    with engine(url).begin() as conn:
        table.drop(conn, checkfirst=True)
        table.create(conn)
        if rows:
            conn.execute(table.insert().values({h: sa.bindparam(k) for h, k in zip(header, keys)}),
                         rows)
    return len(rows)


def typed_clinical(header: list[str], rows: list[list[str]]) -> list:
    """A clinical demo site's text cells typed: ``age`` and the labs (by the header's
    name, a unit suffix aside) as floats (NaN for ""), the other columns as text."""
    import numpy as np

    from fedcluster.common import clinical_demo
    from fedcluster.common.schema import split_unit

    numbers = {"age", *clinical_demo._LABS, *(a for lab in clinical_demo._LABS
                                              for a in clinical_demo.ALIASES.get(lab, ()))}
    columns = [list(col) for col in zip(*rows)]
    return [np.array([float(c) if c else np.nan for c in col])
            if split_unit(h)[0] in numbers else col for h, col in zip(header, columns)]


def write_clinical_tables(urls: list[str], n_sites: int, seed: int) -> list[int]:
    """The clinical demo's sites (``clinical_demo.make_clinical``), one table ``site``
    per database, with the CSV files' headers, column order and values."""
    from fedcluster.common.clinical_demo import make_clinical

    return [write_table(url, SITE_TABLE, header, typed_clinical(header, rows))
            for url, (header, rows) in zip(urls, make_clinical(n_sites, seed))]


def write_sites(dataset: str, fmt: str, out_dir: str | Path, n_sites: int, partitioning: str,
                seed: int, with_labels: bool, urls: list[str] | None = None) -> list[str]:
    """``fedcluster partition``: the data set's sites written as files (``csv``) or into
    databases (and, for the clinical demo, its schema; for OMOP the cohort's query and
    schema) in ``out_dir``. Returns what the command prints, a line per file or database.

    Raises
    ------
    ValueError
        ``--database-url`` with ``--format csv``, ``omop`` for another data set than the
        clinical demo, ``--partitioning`` for it, or URLs not one per site (or holding a
        password).
    """
    import numpy as np

    from fedcluster.common import clinical_demo

    if fmt == "csv":
        if urls:
            raise ValueError("--database-url is for --format sqlite or omop")
        return write_files(dataset, out_dir, n_sites, partitioning, seed, with_labels)
    if fmt == "omop" and dataset != "clinical":
        raise ValueError("--format omop is for --dataset clinical")
    if dataset == "clinical":
        if partitioning != "iid":
            raise ValueError("--partitioning does not apply to --dataset clinical (its sites "
                             "are generated as such, with their own sizes and phenotype mixes)")
        clinical_demo.make_clinical(n_sites, seed)  # checks n_sites before anything is written
    targets = database_urls(out_dir, n_sites, urls)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if fmt == "omop":
        from fedcluster.common import omop_demo

        query, schema = omop_demo.write_cohort_files(out)
        lines = [f"{query}: the cohort query", f"{schema}: the cohort's schema"]
        for url, counts in zip(targets, omop_demo.write_omop(targets, n_sites, seed)):
            lines.append(f"{shown(url)}: OMOP CDM v5.4, "
                         + ", ".join(f"{n} {table}" for table, n in counts.items()))
        return lines
    if dataset == "clinical":
        schema = out / "schema.toml"
        schema.write_text(clinical_demo.clinical_schema_toml(), encoding="utf-8")
        counts = write_clinical_tables(targets, n_sites, seed)
        return [f"{schema}: the schema"] + [f"{shown(url)}: table {SITE_TABLE}, {n} rows"
                                             for url, n in zip(targets, counts)]
    from fedcluster.common.datasets import load_builtin, partition

    X, y = load_builtin(dataset, seed)
    header = [f"x{j}" for j in range(X.shape[1])] + (["label"] if with_labels else [])
    lines = []
    for url, rows in zip(targets, partition(y, n_sites, partitioning, seed)):
        columns = [X[rows, j].astype(np.float64) for j in range(X.shape[1])]
        columns += [y[rows].astype(np.float64)] if with_labels else []
        lines.append(f"{shown(url)}: table {SITE_TABLE}, "
                     f"{write_table(url, SITE_TABLE, header, columns)} rows")
    return lines


def shown(url: str) -> str:
    """``url`` as printed (never a password)."""
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def write_files(dataset: str, out_dir: str | Path, n_sites: int, partitioning: str, seed: int,
                with_labels: bool) -> list[str]:
    """``--format csv``: one CSV file per site (the clinical demo: its schema.toml and its
    sites, the phenotype label column always written)."""
    import csv

    import numpy as np

    from fedcluster.common.clinical_demo import write_clinical
    from fedcluster.common.datasets import load_builtin, partition

    out = Path(out_dir)
    if dataset == "clinical":
        if partitioning != "iid":
            raise ValueError("--partitioning does not apply to --dataset clinical (its sites "
                             "are generated as such, with their own sizes and phenotype mixes)")
        schema, *sites = write_clinical(out, n_sites, seed)
        lines = [f"{schema}: the schema"]
        for path in sites:
            with open(path, encoding="utf-8", newline="") as f:
                lines.append(f"{path}: {sum(1 for _ in csv.reader(f)) - 1} rows")
        return lines
    X, y = load_builtin(dataset, seed)
    out.mkdir(parents=True, exist_ok=True)
    header = ",".join(f"x{j}" for j in range(X.shape[1]))
    lines = []
    for i, rows in enumerate(partition(y, n_sites, partitioning, seed)):
        path = out / f"site-{i}.csv"
        data = np.column_stack([X[rows], y[rows]]) if with_labels else X[rows]
        names = header + (",label" if with_labels else "")
        np.savetxt(path, data, delimiter=",", header=names, comments="", fmt="%.17g")
        lines.append(f"{path}: {len(rows)} rows")
    return lines

"""Sites that read a SQL database (issue 46): SQLite by default, PostgreSQL for real.

- Must-show 1: a throwaway PostgreSQL server (``pg_server.py``), three real SuperNodes
  over gRPC each reading its own database through ``data-url`` + ``data-query``: the run
  equals the in-process run on CSV exports of those tables (1e-12, Table 1 included);
  each site queried its database once in the run (the server's own statement log); no
  password in any file the run left.
- Must-show 2: ``fedcluster partition --dataset clinical --format sqlite`` and a run on
  it, equal to the run on the CSV files; the OMOP tutorial's PostgreSQL commands (its
  SQLite ones run in tests/test_docs.py); the cohort query gives the demo's table back.
- Must-show 3: versions from a database: an INSERT keeps the earlier groups, bit for bit;
  a DELETE withdraws the group that lost the row, and only it; an unchanged result is the
  same version; a run reads once and keeps its version.
- Must-show 4: an unreachable database, a refused login, a query error, a non-numeric
  column, an empty result, a query that is not a SELECT, a write hidden in a WITH, a
  statement timeout and a URL holding a password: each site fails its own start with a
  message naming the key, the run goes on without them, and no password is in any
  output, log, ledger, cache or file.

One PostgreSQL server for the module (about 1 s to start); the tutorial's test starts its
own, as a newcomer's (deploy/make-site-databases.sh makes its roles and databases).
"""

from __future__ import annotations

import csv
import json
import logging
import re
from pathlib import Path

import numpy as np
import pytest

import fedcluster
import flower_processes as fp
from fedcluster.cli import main
from fedcluster.client_app.data import group_entries, group_table
from fedcluster.client_app.data.sql_table import load_sql_table, read_sql_columns, sql_reading
from fedcluster.client_app.data.versions import Store
from fedcluster.client_app.node_config import ConfigError, parse_node_config
from fedcluster.common import clinical_demo, omop_demo
from fedcluster.simulation import run_in_process
from pg_server import pg_server
from test_deployment import APP_DIR, RUN_TIMEOUT
from test_docs import same_words, shown

QUERY = "SELECT * FROM site ORDER BY patient_id"
PASSWORDS = {f"site{i}": f"pw-{i}-Zq8#x{i}" for i in range(3)}
CONFIG = {"n-clusters": 4, "num-rounds": 1, "tol": 0.0, "min-sites": 2, "seed": 1,
          "scale": "standard"}


@pytest.fixture(scope="module")
def pg():
    with pg_server() as server:
        for name, password in PASSWORDS.items():
            server.create_site(name, password)
        yield server


def _pgpass(path: Path, pg, names) -> Path:
    """libpq's password file: one line per site database (mode 0600, or libpq ignores it)."""
    path.write_text("".join(f"127.0.0.1:{pg.port}:{n}:{n}:{PASSWORDS[n]}\n" for n in names))
    path.chmod(0o600)
    return path


def _cli(*argv: str) -> str:
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = main(list(argv))
    assert code == 0, out.getvalue()
    return out.getvalue()


def _export_csv(pg, name: str, path: Path) -> Path:
    """The site table as its CSV export: the same query, the numbers as Python writes
    them (shortest round trip), NULL as an empty cell."""
    with pg.admin(name) as conn:
        cursor = conn.execute(QUERY)
        header = [c.name for c in cursor.description]
        rows = [["" if v is None else (repr(v) if isinstance(v, float) else str(v)) for v in row]
                for row in cursor]
    with open(path, "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows([header, *rows])
    return path


def _no_password_in(directory: Path, texts: list[str], passwords, allowed=()) -> None:
    """No password in any file under ``directory`` (but ``allowed``) nor in ``texts``."""
    for path in directory.rglob("*"):
        if path.is_file() and path not in allowed:
            data = path.read_bytes()
            for password in passwords:
                assert password.encode() not in data, f"a password is in {path}"
    for text in texts:
        for password in passwords:
            assert password not in text


def _same_run(ours, theirs) -> None:
    np.testing.assert_allclose(ours.centroids, theirs.centroids, rtol=0, atol=1e-12)
    assert ours.metrics["table"] == theirs.metrics["table"]
    a, b = ours.profile, theirs.profile
    assert len(a) == len(b) > 0
    keys = ["cluster", "variable", "level", "statistic"]
    assert a[keys].equals(b[keys])
    for x, y in zip(a.value, b.value):  # numbers to 1e-12; a range or "<p" as text
        try:
            numbers = float(x), float(y)
        except ValueError:
            assert str(x) == str(y)
        else:
            np.testing.assert_allclose(*numbers, rtol=1e-12)


# ------------------------------------------------------------------ must-show 1
def test_three_postgres_sites_over_grpc_equal_their_csv_exports(pg, tmp_path, numba_cache,
                                                                monkeypatch):
    names = list(PASSWORDS)
    urls = [pg.url(n, n) for n in names]
    monkeypatch.setenv("PGPASSFILE", str(_pgpass(tmp_path / "writer.pgpass", pg, names)))
    _cli("partition", "--dataset", "clinical", "--format", "sqlite", "--num-sites", "3",
         "--out", str(tmp_path / "clinical"), "--database-url", *urls)
    schema = tmp_path / "clinical" / "schema.toml"
    with pg.admin() as conn:  # the server's own record of each query the sites send
        for n in names:
            conn.execute(f'ALTER DATABASE "{n}" SET log_statement = \'all\'')
    # site 0 reads its password from data-password-file; sites 1 and 2 from PGPASSFILE,
    # which holds no line for site 0
    password_file = tmp_path / "site0-password"
    password_file.write_text(PASSWORDS["site0"] + "\n")
    pgpass = _pgpass(tmp_path / "sites.pgpass", pg, names[1:])
    nodes = {str(i): {"data-url": url, "data-query": QUERY, "schema-path": str(schema),
                      "site-id": str(i), "cache-dir": str(tmp_path / f"cache-{i}")}
             for i, url in enumerate(urls)}
    nodes["0"]["data-password-file"] = str(password_file)
    monkeypatch.delenv("PGPASSFILE")
    # no scaling (no stats round) keeps the real run to six rounds, each a fresh ClientApp
    # process per site (~3 s a round here)
    config = {**CONFIG, "min-sites": 3, "schema": str(schema), "scale": "none"}
    out = tmp_path / "outputs"
    with fp.sandbox(tmp_path, NUMBA_CACHE_DIR=numba_cache, PGPASSFILE=pgpass) as bed:
        link = bed.superlink(simulation=False)
        bed.supernodes(link, {f"supernode-{key}": cfg for key, cfg in nodes.items()})
        bed.connect("sql", link.control_address)
        bed.run(APP_DIR, "sql", {**config, "output-dir": str(out), "run-name": "pg"},
                timeout=RUN_TIMEOUT)
    model = fedcluster.Model.load(out / "pg" / "model.json")
    assert model.metrics["rejected-sites"] == {} and model.metrics["n-sites"] == 3
    assert [h["task"] for h in model.history][-1] == "profile"  # Table 1 crossed gRPC

    csvs = [_export_csv(pg, n, tmp_path / f"export-{i}.csv") for i, n in enumerate(names)]
    harness = run_in_process([{"data-path": str(path), "schema-path": str(schema), "site-id": str(i),
                               "cache-dir": str(tmp_path / "harness-cache")}
                              for i, path in enumerate(csvs)],
                             {**config, "output-dir": str(tmp_path / "harness")})
    _same_run(model, harness)
    assert model.metrics["n-rows"] == sum(len(rows) for _, rows in clinical_demo.make_clinical(3, 0))

    # each site ran its query once in the run, though every message was a fresh process
    log = (pg.directory / "server.log").read_text()
    for n in names:
        ran = re.findall(rf"^{n}:.*statement: .*ORDER BY patient_id", log, re.M)
        assert len(ran) == 1, (n, ran)
    with pg.admin() as conn:
        for n in names:
            conn.execute(f'ALTER DATABASE "{n}" RESET log_statement')
    texts = [p.read_text(errors="replace") for p in (tmp_path / "logs").glob("*.log")]
    assert len(texts) >= 5  # the SuperLink's, the SuperNodes' and flwr run's logs
    _no_password_in(tmp_path, texts, PASSWORDS.values(),
                    allowed={password_file, pgpass, tmp_path / "writer.pgpass"})


# ------------------------------------------------------------------ must-show 2
def test_partition_sqlite_and_a_run_on_it_equal_the_csv_files(tmp_path):
    for fmt in ("csv", "sqlite"):
        _cli("partition", "--dataset", "clinical", "--format", fmt, "--num-sites", "3",
             "--out", str(tmp_path / fmt))
    schema = str(tmp_path / "csv" / "schema.toml")
    assert Path(schema).read_text() == (tmp_path / "sqlite" / "schema.toml").read_text()
    runs = []
    for fmt in ("csv", "sqlite"):
        key = "data-path" if fmt == "csv" else "data-url"
        where = [str(tmp_path / "csv" / f"site-{i}.csv") if fmt == "csv"
                 else f"sqlite:///{tmp_path / 'sqlite' / f'site-{i}.db'}" for i in range(3)]
        nodes = [{key: w, "schema-path": schema, "site-id": str(i),
                  "cache-dir": str(tmp_path / f"cache-{fmt}"),
                  **({"data-table": "site"} if fmt == "sqlite" else {})} for i, w in enumerate(where)]
        runs.append(run_in_process(nodes, {**CONFIG, "schema": schema,
                                           "output-dir": str(tmp_path / f"out-{fmt}")}))
    _same_run(runs[1], runs[0])
    assert runs[1].metrics["n-rows"] == runs[0].metrics["n-rows"] > 1500


def test_the_cohort_query_gives_the_demo_table_back(tmp_path):
    _cli("partition", "--dataset", "clinical", "--format", "omop", "--num-sites", "2",
         "--seed", "3", "--out", str(tmp_path))
    query = (tmp_path / "cohort.sql").read_text()
    assert query == omop_demo.cohort_query()
    for i, site in enumerate(clinical_demo._generate(2, 3)):
        reading = sql_reading(parse_node_config({
            "data-url": f"sqlite:///{tmp_path / f'site-{i}.db'}",
            "data-query-file": str(tmp_path / "cohort.sql")}))
        header, columns = read_sql_columns(reading.source)
        got = dict(zip(header, columns))
        want = site.columns
        assert got["person"] == [str(v) for v in want["patient_id"]]
        assert got["condition"] == [omop_demo.CONDITIONS[p][1].lower() if p in omop_demo.CONDITIONS
                                    else omop_demo.NO_CONDITION for p in want["phenotype"]]
        np.testing.assert_array_equal(got["age at index"], want["age"])
        assert got["sex"] == list(want["sex"])
        assert got["smoking status"] == [omop_demo.SMOKING[s][1].lower() if s else ""
                                         for s in want["smoking"]]
        for lab, (_, name, _) in omop_demo.LABS.items():  # the latest before the index date
            units = np.asarray([u or "" for u in got[omop_demo.unit_column(lab)]])
            present = ~np.isnan(want[lab])
            assert (units[present] != "").all() and (units[~present] == "").all()
            values = np.asarray(got[name], dtype=float)
            own = units == clinical_demo._LABS[lab][0]
            np.testing.assert_array_equal(values[own], want[lab][own], lab)
            if lab in clinical_demo.OTHER_UNITS:  # glucose and creatinine: both units
                other, factor = clinical_demo.OTHER_UNITS[lab]
                assert 0.15 < (units[present] == other).mean() < 0.45, lab
                np.testing.assert_allclose(values[units == other] * factor,
                                           want[lab][units == other], rtol=1e-9)
            else:
                assert own[present].all(), lab
    # the schema reads the cohort; Table 1's names are the concepts'
    schema = (tmp_path / "schema.toml").read_text()
    assert '"Glucose [Mass/volume] in Serum or Plasma"' in schema


def test_the_cohort_converts_each_rows_unit_or_refuses_one_it_does_not_know(tmp_path):
    """Issue 55: glucose and creatinine come in two units; the schema's unit-column
    converts each row from its own (the encoded cohort equals the demo's values, in the
    schema's units), and a latest value in a unit the schema does not convert fails the
    site's start naming the column, the row and the unit, in site check and a run alike."""
    import sqlite3

    from fedcluster.common.datasets import SiteDataError
    from fedcluster.common.schema import load_schema

    _cli("partition", "--dataset", "clinical", "--format", "omop", "--num-sites", "2",
         "--seed", "3", "--out", str(tmp_path))
    schema = load_schema(tmp_path / "schema.toml")
    db = tmp_path / "site-0.db"
    node = {"data-url": f"sqlite:///{db}", "data-query-file": str(tmp_path / "cohort.sql"),
            "schema-path": str(tmp_path / "schema.toml")}
    data = load_sql_table(sql_reading(parse_node_config(node)), cache_dir=tmp_path / "cache")
    want = clinical_demo._generate(2, 3)[0].columns
    names = schema.feature_names()
    for lab, (_, name, _) in omop_demo.LABS.items():
        np.testing.assert_allclose(np.asarray(data.X)[:, names.index(name)], want[lab],
                                   rtol=1e-9, err_msg=lab)
    as_text = " ".join(f'{key}="{value}"' for key, value in node.items())
    checked = _cli("site", "check", "--node-config", as_text)
    glucose = omop_demo.LABS["glucose"][1]
    (line,) = [ln for ln in checked.splitlines() if ln.startswith(glucose + " |")]
    assert re.search(r"mg/dL \d+, mmol/L \d+ \(per row: glucose_unit\)", line), line
    # the latest glucose of one person, recorded in mg/L: not a unit the schema converts
    with sqlite3.connect(db) as conn:
        person, measurement = conn.execute(
            "SELECT person_id, measurement_id FROM measurement WHERE measurement_concept_id = ? "
            "AND measurement_date <= ? ORDER BY person_id, measurement_date DESC, "
            "measurement_id DESC LIMIT 1",
            (omop_demo.LABS["glucose"][0], omop_demo.INDEX_DATE.isoformat())).fetchone()
        conn.execute("UPDATE measurement SET unit_concept_id = ? WHERE measurement_id = ?",
                     (omop_demo.UNITS["mg/L"], measurement))
    row = person - 1_000_000  # the cohort's rows go by person_id: site 0's i-th is 10^6 + i
    with pytest.raises(SiteDataError) as refused:
        load_sql_table(sql_reading(parse_node_config(node)), cache_dir=tmp_path / "cache")
    message = str(refused.value)
    assert f"column {glucose!r}" in message and "'mg/L'" in message, message
    assert "accepted units: mg/dL, mmol/L" in message and f"row {row}," in message, message
    from fedcluster.cli import main as cli_main

    assert cli_main(["site", "check", "--node-config", as_text]) != 0


def test_the_omop_tutorial_runs_on_postgres(tmp_path, monkeypatch):
    """The tutorial's PostgreSQL section on a server of its own, as a newcomer meets it:
    deploy/make-site-databases.sh makes the sites' roles and databases (as the server's
    administrator, the passwords into the password file), then its commands run (the
    server's host and port for the tutorial's localhost:5432); the cohort it reads is the
    SQLite one's, cell by cell."""
    import os
    import shlex
    import subprocess

    from pg_server import ADMIN, ADMIN_PASSWORD
    from test_docs import ROOT, blocks, commands

    page = ROOT / "docs" / "tutorials" / "omop-cohort.md"
    setup, block = [b for b in blocks(page) if b.marker == ("run by", "tests/test_sql_sites.py")]
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FEDCLUSTER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.setenv("PGPASSFILE", str(tmp_path / "pgpass"))
    with pg_server() as pg:
        (line,) = commands(setup.code)
        script, *names = shlex.split(line)
        env = {**os.environ, "PATH": f"{pg.bin}{os.pathsep}{os.environ['PATH']}",
               "PGPASSWORD": ADMIN_PASSWORD,
               "ADMIN_PSQL": f"psql -h 127.0.0.1 -p {pg.port} -U {ADMIN}"}
        made = subprocess.run([str(ROOT / script), "--host", "127.0.0.1", "--port", str(pg.port),
                               *names], env=env, capture_output=True, text=True, timeout=60)
        assert made.returncode == 0, made.stderr
        assert made.stdout.count("site database") == 3 == len(names)
        again = subprocess.run([str(ROOT / script), "--port", str(pg.port), "site1"], env=env,
                               capture_output=True, text=True, timeout=60)
        assert again.returncode == 1 and "exists already" in again.stderr
        assert (tmp_path / "pgpass").stat().st_mode & 0o777 == 0o600
        _the_tutorials_postgres_block(pg, block, tmp_path)


def _the_tutorials_postgres_block(pg, block, tmp_path) -> None:
    import shlex

    from test_docs import commands

    lines = commands(block.code)
    assert [line.split()[1] for line in lines] == ["partition", "site", "simulate"]
    for line in lines:
        _cli(*shlex.split(line.replace("localhost:5432", f"127.0.0.1:{pg.port}"))[1:])
    table1 = (tmp_path / "outputs" / "omop-pg" / "table1.md").read_text()
    assert "Glucose [Mass/volume] in Serum or Plasma (mg/dL)" in table1
    _cli("partition", "--dataset", "clinical", "--format", "omop", "--num-sites", "3",
         "--out", str(tmp_path / "omop-lite"))
    query = str(tmp_path / "omop-pg" / "cohort.sql")
    for i in range(3):
        pg_cohort = read_sql_columns(sql_reading(parse_node_config(
            {"data-url": pg.url(f"site{i}", f"site{i}"), "data-query-file": query})).source)
        lite = read_sql_columns(sql_reading(parse_node_config(
            {"data-url": f"sqlite:///{tmp_path / 'omop-lite' / f'site-{i}.db'}",
             "data-query-file": query})).source)
        assert pg_cohort[0] == lite[0]
        for a, b in zip(pg_cohort[1], lite[1]):
            if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
                np.testing.assert_array_equal(np.asarray(a, dtype=float), np.asarray(b, dtype=float))
            else:
                assert a == b


# ------------------------------------------------------------------ must-show 3
def _table(pg, name: str, sql: str, rows=()) -> None:
    with pg.admin(name) as conn:
        with conn.cursor() as cursor:
            cursor.execute(sql) if not rows else cursor.executemany(sql, rows)


def test_versions_from_a_database(pg, tmp_path, monkeypatch):
    with pg.admin() as conn:
        conn.execute('CREATE DATABASE "versions" OWNER "site0"')
    _table(pg, "versions", "CREATE TABLE t (id text PRIMARY KEY, a float8, b float8)")
    _table(pg, "versions", 'GRANT SELECT ON t TO "site0"')
    rng = np.random.default_rng(4)
    rows = [(f"p{i:03d}", *map(float, rng.normal(size=2))) for i in range(90)]
    _table(pg, "versions", "INSERT INTO t VALUES (%s, %s, %s)", rows[:60])
    monkeypatch.setenv("PGPASSWORD", PASSWORDS["site0"])
    cache = tmp_path / "cache"
    node = parse_node_config({"data-url": pg.url("site0", "versions"),
                              "data-query": "SELECT id, a, b FROM t ORDER BY id",
                              "id-column": "id", "cache-dir": str(cache)})
    reading = sql_reading(node)

    def version():
        site = load_sql_table(reading, cache_dir=cache)
        groups, _ = group_table.site_groups(site, 3, cache)
        return site, groups

    first, g1 = version()
    again, same = version()  # an unchanged result: the same version, the same table
    assert again.version == first.version and same.digest == g1.digest
    _table(pg, "versions", "INSERT INTO t VALUES (%s, %s, %s)", rows[60:])
    grown, g2 = version()
    assert grown.reading == first.reading and grown.version != first.version
    assert grown.n_rows == 90 and g2.n_rows + g2.waiting == 90
    n1 = g1.n_groups  # every earlier group kept, its statistics bit for bit
    for name in ("counts", "sums", "m2"):
        np.testing.assert_array_equal(getattr(g2, name)[:n1], getattr(g1, name))
    record = Store.read_tables(g2.table_ref.store)[-1]
    assert record["kept-groups"] == n1 and record["withdrawn-groups"] == 0

    # a DELETE: the one group that held the row is withdrawn whole, the others stay
    parts = group_entries.read_arrays(cache / "groups" / group_entries.entry_key(grown, 3))[1]
    row_groups = np.asarray(parts["row-groups"])
    gone = int(row_groups[17])  # the row of p017 (ORDER BY id)
    _table(pg, "versions", "DELETE FROM t WHERE id = 'p017'")
    shrunk, g3 = version()
    record = Store.read_tables(g3.table_ref.store)[-1]
    assert record["withdrawn-groups"] == 1 and record["kept-groups"] == g2.n_groups - 1
    kept = [g for g in range(g2.n_groups) if g != gone]
    np.testing.assert_array_equal(g3.sums[:len(kept)], g2.sums[kept])
    np.testing.assert_array_equal(g3.counts[:len(kept)], g2.counts[kept])
    assert shrunk.n_rows == 89 and g3.table_ref.lineage == g1.table_ref.lineage


def test_a_site_reads_its_database_once_per_run(tmp_path):
    """The ClientApp's reading (data_sources.load_site, a database's loader): a run's later
    messages map the version its first one read, even with the database gone; the next run
    reads it again."""
    import sqlite3

    from flwr.common import RecordDict

    from fedcluster.client_app.data_sources import load_site

    def load_sql_site(node, run_config, state, run_id):
        return load_site(node, run_config, (state, run_id))[0]

    db = tmp_path / "site.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE t (a REAL, b REAL)")
        conn.executemany("INSERT INTO t VALUES (?, ?)", [(i, i * i) for i in range(20)])
    node = parse_node_config({"data-url": f"sqlite:///{db}", "data-table": "t",
                              "cache-dir": str(tmp_path / "cache")})
    state = RecordDict()
    first = load_sql_site(node, {}, state, run_id=7)
    with sqlite3.connect(db) as conn:
        conn.execute("INSERT INTO t VALUES (100, 1)")
    db.rename(tmp_path / "away.db")  # the run's later messages do not connect
    later = load_sql_site(node, {}, state, run_id=7)
    assert later.version == first.version and later.n_rows == 20
    (tmp_path / "away.db").rename(db)
    next_run = load_sql_site(node, {}, state, run_id=8)
    assert next_run.n_rows == 21 and next_run.version != first.version


# ------------------------------------------------------------------ must-show 4
def test_a_broken_database_site_fails_its_own_start_and_the_run_goes_on(pg, tmp_path, monkeypatch,
                                                                        caplog, capsys):
    names = list(PASSWORDS)
    monkeypatch.setenv("PGPASSFILE", str(_pgpass(tmp_path / "pgpass", pg, names)))
    _cli("partition", "--dataset", "clinical", "--format", "sqlite", "--num-sites", "3",
         "--out", str(tmp_path / "clinical"), "--database-url", *[pg.url(n, n) for n in names])
    schema = str(tmp_path / "clinical" / "schema.toml")
    _table(pg, "site0", "CREATE SEQUENCE IF NOT EXISTS rows_read")
    _table(pg, "site0", 'GRANT USAGE ON SEQUENCE rows_read TO "site0"')
    wrong = tmp_path / "wrong-password"
    wrong.write_text("not-the-pw-Kx91\n")
    header = clinical_demo.make_clinical(3, 0)[0][0]
    others = ", ".join(f'"{h}"' for h in header if h != "age")
    closed = fp.free_port()
    broken = {
        "unreachable": {"data-url": f"postgresql+psycopg://site0@127.0.0.1:{closed}/site0",
                        "data-query": QUERY},
        "login": {"data-url": pg.url("site0", "site0"), "data-query": QUERY,
                  "data-password-file": str(wrong)},
        "query": {"data-url": pg.url("site0", "site0"), "data-query": "SELECT * FROM cohort"},
        "text": {"data-url": pg.url("site0", "site0"),
                 "data-query": f"SELECT {others}, CASE WHEN age > 60 THEN 'old' ELSE 'young' "
                               "END AS age FROM site ORDER BY patient_id"},
        "empty": {"data-url": pg.url("site0", "site0"), "data-query": "SELECT * FROM site WHERE 1 = 0"},
        "delete": {"data-url": pg.url("site0", "site0"), "data-query": "DELETE FROM site"},
        "hidden-write": {"data-url": pg.url("site0", "site0"),  # a SELECT that writes
                         "data-query": "SELECT nextval('rows_read') AS n, * FROM site"},
        "timeout": {"data-url": pg.url("site0", "site0"), "data-timeout": 0.3,
                    "data-query": "SELECT pg_sleep(3), * FROM site"},
        "password-in-url": {"data-url": pg.url("site0", "site0", PASSWORDS["site0"]),
                            "data-query": QUERY},
    }
    nodes = [{"data-url": pg.url(n, n), "data-query": QUERY, "schema-path": schema, "site-id": n,
              "cache-dir": str(tmp_path / "cache")} for n in names[1:]]
    nodes += [{**cfg, "schema-path": schema, "site-id": key, "cache-dir": str(tmp_path / "cache")}
              for key, cfg in broken.items()]
    with caplog.at_level(logging.DEBUG):
        result = run_in_process(nodes, {**CONFIG, "schema": schema, "every-site": False,
                                        "output-dir": str(tmp_path / "out")})
    rejected = result.metrics["rejected-sites"]
    assert sorted(rejected) == sorted(broken) and result.metrics["n-sites"] == 2
    expected = {
        "unreachable": rf"^data-url postgresql\+psycopg://site0@127\.0\.0\.1:{closed}/site0: "
                       r"cannot connect: .*refused",
        "login": r"^data-url postgresql\+psycopg://site0@.*: cannot connect: .*password "
                 r"authentication failed for user \"site0\"",
        "query": r"^data-query on postgresql\+psycopg://site0@.*/site0: the database refused "
                 r"it: relation \"cohort\" does not exist",
        "text": r"\(data-query\): row 1, column 'age': '(old|young)' is not a number",
        "empty": r"\(data-query\): the query returned no rows",
        "delete": r"^data-query: must be one read-only SELECT .* it starts with 'DELETE'",
        "hidden-write": r"^data-query on .*: the database refused it: cannot execute "
                        r"nextval\(\) in a read-only transaction",
        "timeout": r"^data-query on .*: the database refused it: canceling statement due to "
                   r"statement timeout",
        "password-in-url": r"node-config key 'data-url' holds a password \(the URL is not shown\)",
    }
    for key, pattern in expected.items():  # the site's own message, as the server relays it
        message = rejected[key].removeprefix("the site refused: ")
        assert re.search(pattern, message), (key, message)
    # as docs/reference/node-config.md shows it (its server on PostgreSQL's usual port)
    query = re.sub(r"@127\.0\.0\.1:\d+/", "@127.0.0.1:5432/",
                   rejected["query"].removeprefix("the site refused: "))
    assert same_words(query, shown("docs/reference/node-config.md", "data-query on ")), query
    with pg.admin("site0") as conn:  # nothing was written
        assert conn.execute("SELECT count(*) FROM site").fetchone()[0] == \
            len(clinical_demo.make_clinical(3, 0)[0][1])
    captured = capsys.readouterr()
    _no_password_in(tmp_path, [caplog.text, captured.out, captured.err, json.dumps(rejected)],
                    [*PASSWORDS.values(), "not-the-pw-Kx91"],
                    allowed={tmp_path / "pgpass", wrong})


def test_the_node_config_refuses_a_url_with_a_password_unshown():
    for url in ("postgresql+psycopg://u:s3cret-pw@h:5432/db", "postgresql://u:s3cret-pw@h/db"):
        with pytest.raises(ConfigError) as err:
            parse_node_config({"data-url": url, "data-query": "SELECT 1"})
        assert "holds a password" in str(err.value) and "s3cret-pw" not in str(err.value)
    with pytest.raises(ConfigError) as err:  # not a URL at all: not echoed either
        parse_node_config({"data-url": "::s3cret-pw::", "data-query": "SELECT 1"})
    assert "not a SQLAlchemy URL" in str(err.value) and "s3cret-pw" not in str(err.value)


@pytest.mark.parametrize("query, word", [("DELETE FROM t", "DELETE"), ("  insert into t values (1)", "insert"),
                                         ("-- a comment\nDROP TABLE t", "DROP"), ("", "(nothing)")])
def test_a_query_that_is_not_a_select_is_refused(query, word):
    from fedcluster.client_app.data.sql_source import check_select
    from fedcluster.common.datasets import SiteDataError

    with pytest.raises(SiteDataError, match=re.escape(f"it starts with {word!r}")):
        check_select(query)
    for fine in ("SELECT 1;", " -- why\n/* note */ select a from t", "WITH x AS (SELECT 1) SELECT * FROM x",
                 "(SELECT 1)"):
        assert check_select(fine)

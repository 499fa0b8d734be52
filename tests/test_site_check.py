"""`fedcluster site check` (issue 20): a site's table against the agreed schema, before it
joins and without contacting anyone; a file that does not fit fails with the message a
run gives (file, row, column, value) and exit code 2."""

from __future__ import annotations

import re

import numpy as np
import pytest

from fedcluster.cli import main
from test_schema import SCHEMA_TOML

GOOD = """outcome,smoking,Glu [mmol/L],age,patient_id
a,never,5,40,p1
b,vaper,NA,130,p2
a,,6.5,61,p3
b,former,7,,p4
"""


@pytest.fixture()
def schema_path(tmp_path):
    path = tmp_path / "schema.toml"
    path.write_text(SCHEMA_TOML)
    return path


def test_the_check_reports_what_the_file_holds(tmp_path, schema_path, capsys):
    data = tmp_path / "site.csv"
    data.write_text(GOOD)
    # 3 usable rows: the run would refuse the site (min-site-rows, default 10), and so
    # does the check, after its report (tests/test_site_check_judges.py)
    assert main(["site", "check", str(data), "--schema", str(schema_path)]) == 1
    out = capsys.readouterr().out
    assert out.rstrip().endswith("site policy min-site-rows=10: this site holds 3 rows and "
                                 "takes part only with at least 10")
    assert f"{data}: 4 rows, 3 usable (1 dropped by drop-row), 7 encoded features" in out
    assert "glucose | Glu [mmol/L] | 1 (25.0%) | impute-mean | 0 (an error) | mmol/L" in out
    assert "age | age | 1 (25.0%) | drop-row | 1 (clipped) | -" in out
    assert "smoking: never 1, former 1, current 0, unknown 0; unlisted (mapped to 'unknown'): vaper 1" in out
    assert "the check sends nothing" in out


def test_the_check_reports_the_groups_and_rows_waiting(tmp_path, schema_path, capsys):
    """What the site would answer from: how many groups, their sizes, the table's hash;
    with the site's cache-dir, the groups it keeps there, and after its file grew by one
    row (fewer than p_site new rows), that row waiting."""
    header, *rows = GOOD.strip().splitlines()
    rng = np.random.default_rng(3)
    more = [f"a,never,{rng.uniform(4, 10):.2f},{rng.integers(20, 80)},p{i}" for i in range(40)]
    data = tmp_path / "site.csv"
    data.write_text("\n".join([header, *more]) + "\n")
    cache = tmp_path / "cache"
    assert main(["site", "check", str(data), "--schema", str(schema_path),
                 "--cache-dir", str(cache), "--record"]) == 0  # as the site answering
    out = capsys.readouterr().out
    groups_line = next(line for line in out.splitlines() if line.startswith("Groups"))
    assert "min-cluster-size p_site = 2" in groups_line and "groups of at least 2 rows" in groups_line
    sizes = groups_line.split("sizes: ")[1]
    assert sum(int(n) * int(s) for n, s in (part.split(" of ") for part in
                                               sizes.replace(" rows", "").split(", "))) == 40
    assert "group table sha256" in out and "wait" not in out
    data.write_text("\n".join([header, *more, "b,never,6.50,50,p99"]) + "\n")
    import os
    stat = os.stat(data)
    os.utime(data, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert main(["site", "check", str(data), "--schema", str(schema_path),
                 "--cache-dir", str(cache)]) == 0
    assert ("1 row(s) wait, in no group (no task uses them): new rows until there are 2 of "
            "them") in capsys.readouterr().out
    assert main(["site", "check", str(data), "--schema", str(schema_path),
                 "--min-cluster-size", "1"]) == 0
    assert "this site answers from its 41 rows" in capsys.readouterr().out


def test_the_check_writes_nothing_to_the_history_unless_asked(tmp_path, schema_path, capsys):
    """Without --record the check works on a scratch copy of the site's history: the
    history's files are the same bytes after it, and a second check of other rows still
    shows them as the first version; with --record the table joins the history (the next
    check shows it as version 1)."""
    header, *rows = GOOD.strip().splitlines()
    rng = np.random.default_rng(4)
    more = [f"a,never,{rng.uniform(4, 10):.2f},{rng.integers(20, 80)},p{i}" for i in range(30)]
    data, cache = tmp_path / "site.csv", tmp_path / "cache"
    data.write_text("\n".join([header, *more]) + "\n")

    def history() -> dict:
        root = cache / "groups"
        return {} if not root.exists() else {
            str(path.relative_to(root)): path.read_bytes()
            for path in sorted(root.rglob("*")) if path.is_file()}

    def check(*extra) -> str:
        assert main(["site", "check", str(data), "--schema", str(schema_path), "--cache-dir",
                     str(cache), "--no-cost-table", *extra]) == 0
        return capsys.readouterr().out

    def version(out: str, line: str, rows: int) -> bool:
        """Whether the versions table shows version ``line`` (e.g. "1 (this one)") of
        ``rows`` rows, read from this file on a given day."""
        return re.search(rf"^{re.escape(line)} \| {re.escape(str(data))} \| "
                         rf"\d{{4}}-\d{{2}}-\d{{2}} \| {rows} \|", out, re.M) is not None

    before = history()
    assert version(check(), "1 (this one)", 30) and history() == before
    data.write_text("\n".join([header, *more[:-2]]) + "\n")  # two patients withdraw
    assert version(check(), "1 (this one)", 28) and history() == before
    check("--record")
    assert history() != before
    data.write_text("\n".join([header, *more]) + "\n")
    out = check()
    assert version(out, "1", 28) and version(out, "2 (this one)", 30)


@pytest.mark.parametrize("body, message", [
    ("patient_id,glucose,age,smoking,outcome\np1,5000,4,never,a\n",
     "row 1, column 'glucose': 5000 is outside the schema's range [10, 1000] mg/dL"),
    ("patient_id,glucose,smoking,outcome\np1,50,never,a\n",
     "the schema's column(s) 'age' are not in the file"),
    ("patient_id,glucose,age,smoking,outcome\np1,50,4,never\n",
     "data row 1 (line 2) has 4 fields; the header has 5"),
    ("patient_id,glucose (g/L),age,smoking,outcome\np1,5,4,never,a\n",
     "column 'glucose' is in 'g/L', which the schema does not convert"),
])
def test_a_file_that_does_not_fit_fails_with_the_runs_message(tmp_path, schema_path, capsys,
                                                              body, message):
    data = tmp_path / "site.csv"
    data.write_text(body)
    assert main(["site", "check", str(data), "--schema", str(schema_path)]) == 2
    err = capsys.readouterr().err
    assert str(data) in err and message in err


def test_units_given_on_the_command_line_and_a_bad_schema(tmp_path, schema_path, capsys):
    data = tmp_path / "site.csv"
    data.write_text("patient_id,glucose,age,smoking,outcome\np1,5,40,never,a\n")
    assert main(["site", "check", str(data), "--schema", str(schema_path),
                 "--units", "glucose=mmol/L"]) == 1  # (1 row: below min-site-rows)
    assert "| mmol/L" in capsys.readouterr().out
    assert main(["site", "check", str(data), "--schema", str(schema_path), "--units", "glucose"]) == 2
    assert "write COLUMN=UNIT" in capsys.readouterr().err
    # the data file after --units (which takes a list) is still the data file
    assert main(["site", "check", "--schema", str(schema_path), "--units", "glucose=mmol/L",
                 str(data)]) == 1
    assert "| mmol/L" in capsys.readouterr().out
    assert main(["site", "check", "--schema", str(schema_path), "--units", "glucose=mmol/L"]) == 2
    assert "site check needs the data file" in capsys.readouterr().err
    bad = tmp_path / "bad.toml"
    bad.write_text('[[columns]]\nname = "a"\ntype = "categorical"\n')
    assert main(["site", "check", str(data), "--schema", str(bad)]) == 2
    assert "a categorical column needs its list of categories" in capsys.readouterr().err


def test_a_node_config_is_checked_before_a_supernode_starts_with_it(tmp_path, schema_path,
                                                                     capsys):
    """`--node-config` takes the text `flower-supernode --node-config` takes, validates it
    as the site's ClientApp will (an unknown key names the key meant), and checks the file
    it names as the flags would."""
    data = tmp_path / "site.csv"
    data.write_text(GOOD)
    assert main(["site", "check", "--node-config",
                 f'data-file="{data}" schema-path="{schema_path}"']) == 2
    err = capsys.readouterr().err
    assert "unknown node-config key 'data-file' (did you mean 'data-path'?)" in err
    assert main(["site", "check", "--node-config", 'min-cluster-size=0']) == 2
    assert "min-cluster-size" in capsys.readouterr().err
    # text Flower's parser skips without a word (a JSON object, a stray word, a space
    # around '='): the SuperNode would start without it, so the check refuses it
    for text, stray in ((f'{{"data-path": "{data}"}}', f'{{"data-path": "{data}"}}'),
                        (f'data-path="{data}" min-cluster-size = 3', "min-cluster-size = 3")):
        assert main(["site", "check", "--node-config", text]) == 2
        assert f"--node-config: {stray!r} is not key=value" in capsys.readouterr().err
    node = f'data-path="{data}" schema-path="{schema_path}" min-cluster-size=3'
    assert main(["site", "check", "--node-config", node, "--no-cost-table"]) == 1  # (3 rows)
    out = capsys.readouterr().out
    assert out.startswith("node config: valid (data-path, min-cluster-size, schema-path)\n")
    assert main(["site", "check", str(data), "--schema", str(schema_path), "--min-cluster-size",
                 "3", "--no-cost-table"]) == 1
    assert out.split("\n", 1)[1] == capsys.readouterr().out  # the same report as the flags
    assert main(["site", "check", "--node-config", 'site-id="a" ledger-path="off"']) == 0
    assert capsys.readouterr().out == "node config: valid (ledger-path, site-id)\n"
    # without a schema: the file read as the site will read it, its own cache untouched
    plain = tmp_path / "plain.csv"
    plain.write_text("a,b,c\n1,2,3\n4,5,6\n7,8,9\n")
    cache = tmp_path / "site-cache"
    assert main(["site", "check", "--node-config",
                 f'data-path="{plain}" cache-dir="{cache}" columns="a,c" min-site-rows=3']) == 0
    out = capsys.readouterr().out
    assert f"{plain}: 3 rows, 2 features, read as the site will read them" in out
    assert "every reply is a function of 1 groups of at least 2 rows" in out
    assert not cache.exists()
    # --record answers from it (its history in cache-dir); a grown file's new row then
    # waits for a group of its own, which the check shows before the site joins with it
    config = f'data-path="{plain}" cache-dir="{cache}" columns="a,c" min-site-rows=3'
    assert main(["site", "check", "--node-config", config, "--record"]) == 0
    assert (cache / "groups").is_dir()
    capsys.readouterr()
    plain.write_text("a,b,c\n1,2,3\n4,5,6\n7,8,9\n10,11,12\n")
    before = sorted(p.name for p in (cache / "groups").rglob("*"))
    assert main(["site", "check", "--node-config", config]) == 0
    out = capsys.readouterr().out
    assert "answers from 3 of its 4 usable rows; 1 row(s) wait, in no group" in out, out
    assert sorted(p.name for p in (cache / "groups").rglob("*")) == before  # nothing written

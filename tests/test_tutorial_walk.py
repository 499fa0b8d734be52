"""The tutorials as a newcomer runs them (issue 55): one after another, in ONE folder,
with one default cache (``~/.cache/fedcluster``, here ``FEDCLUSTER_CACHE_DIR``) shared by
every step, as one OS user on one machine would.

In page order: first-simulation, hospital-tables, omop-cohort (its SQLite sections; the
PostgreSQL section runs in tests/test_sql_sites.py on a throwaway server) and
first-deployment. Every block a page does not mark runs here (test_docs leaves these pages
to this walk); every ``fedcluster site check`` a page shows prints exactly the text block
after it (a block that starts with ``...`` shows the output's last lines; a day reads
YYYY-MM-DD) and exits as the page says (``|| true``: it fails); every run answers from all
of each site's usable rows (an earlier tutorial's history in the shared cache must not
hold any back: the case that filed the issue). The steps a page marks run by
tests/test_deployment.py (real SuperLink and SuperNodes) run there, where the run equals
the in-process run on the same files and node configs (1e-9, Table 1 included); here the
hospital-tables page's figures are those of that in-process run, made in the same folder
with the same default cache: its summary lines, its rounds, its Table 1 excerpts at p 2
and p 10 and the adjusted Rand indices its prose quotes (p 1, 2 and 10). The same holds
for first-simulation's listing of a run's files and its Table 1 excerpt.
"""

from __future__ import annotations

import json
import re
import shlex

from test_docs import ROOT, WALKED, blocks, commands, compare_printed, fedcluster_output, run_bash

SHOWN = {"docs/tutorials/hospital-tables.md": 7, "docs/tutorials/first-deployment.md": 1}


def test_the_tutorials_in_order_in_one_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FEDCLUSTER_CACHE_DIR", str(tmp_path / "home-cache"))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    runs = 0
    for page in WALKED:
        found = blocks(ROOT / page)
        namespace: dict = {"__name__": f"docs:{page}"}
        shown = 0
        for block, after in zip(found, [*found[1:], None]):
            if block.marker is not None or block.language not in ("bash", "python"):
                continue
            if block.language == "python":
                exec(compile(block.code, block.where, "exec"), namespace)  # noqa: S102
                continue
            for line in commands(block.code):
                words = shlex.split(line.removesuffix("|| true"), comments=True)
                if words[0] != "fedcluster" or re.search(r"[|&;<>$`]", line.removesuffix("|| true")):
                    run_bash(line, tmp_path, block.where)
                    continue
                code, printed = fedcluster_output(words[1:])
                assert (code == 0) == ("|| true" not in line), f"{block.where}: {line}\n{printed}"
                if words[1:3] == ["site", "check"] and after is not None and after.language == "text":
                    compare_printed(printed, after.code, block.where)
                    shown += 1
                if words[1] == "simulate" and "--help" not in words:
                    # every site answered from all its usable rows (the run's model.json)
                    model = max(tmp_path.rglob("model.json"), key=lambda p: p.stat().st_mtime_ns)
                    site_rows = json.loads(model.read_text())["metrics"]["site-rows"]
                    assert site_rows and all(
                        rows["answered"] == rows["usable"] and not rows["held-back"]
                        and not rows["waiting"] for rows in site_rows.values()), \
                        f"{block.where}: {line}: {site_rows}"
                    runs += 1
        assert shown == SHOWN.get(page, 0), page
        if page.endswith("first-simulation.md"):
            _first_simulation_as_printed(found, tmp_path)
        if page.endswith("hospital-tables.md"):
            _hospital_runs_as_printed(found, tmp_path)
        if page.endswith("omop-cohort.md"):  # Table 1's rows, named by the concepts
            table1 = (tmp_path / "outputs" / "omop" / "table1.md").read_text().replace("\u2003", " ")
            for row in _text_after(found, "| age at index").splitlines():
                assert any(line.startswith(row.removesuffix(" ...")) for line in table1.splitlines()), \
                    f"omop-cohort.md: {row!r} starts no line of its Table 1:\n{table1}"
    assert runs == 4  # first-simulation 2, omop-cohort 2 (the clinical tables, the cohort)


def _text_after(found, starts: str, nth: int = 0) -> str:
    return [b.code for b in found if b.language == "text" and b.code.startswith(starts)][nth]


def _every_line_in(excerpt: str, text: str, where: str) -> None:
    text = text.replace("\u2003", " ")  # (Table 1 indents a level with an em space)
    lines = set(text.splitlines())
    missing = [line for line in excerpt.replace("\u2003", " ").splitlines() if line not in lines]
    assert not missing, (f"{where}: not in the run's output:\n" + "\n".join(missing)
                         + "\nthe run's:\n" + text)


def _first_simulation_as_printed(found, tmp_path) -> None:
    run = tmp_path / "outputs" / "first"
    assert _text_after(found, "checkpoint").split() == sorted(p.name for p in run.iterdir())
    _every_line_in(_text_after(found, "| Characteristic"), (run / "table1.md").read_text(),
                   "first-simulation's Table 1")


def _hospital_runs_as_printed(found, tmp_path) -> None:
    """The deployment run of the page (its node configs and `fedcluster run` config), in
    process: the figures the page prints."""
    import csv

    from fedcluster.server_app.outputs import table_lines
    from fedcluster.simulation import run_in_process

    page = (ROOT / "docs" / "tutorials" / "hospital-tables.md").read_text()
    schema = str(tmp_path / "clinical" / "schema.toml")
    config = {"n-clusters": 4, "min-sites": 3, "scale": "standard", "schema": schema}
    (run_line,) = [ln for b in found for ln in commands(b.code) if ln.startswith("fedcluster run")]
    assert '--run-config "n-clusters=4 min-sites=3 scale=\\"standard\\" schema=' in run_line
    ari = {}
    for floor in (2, 1, 10):  # the page's run, its rows answered from one by one, then p 10
        nodes = [{"data-path": str(tmp_path / "clinical" / f"site-{i}.csv"), "schema-path": schema,
                  "site-id": str(i), **({} if floor == 2 else {"min-cluster-size": floor})}
                 for i in range(3)]  # (one cache: p 10 is a raised floor over p 2's groups)
        out = tmp_path / f"hospital-p{floor}"
        result = run_in_process(nodes, {**config, "output-dir": str(out), "run-name": "run"})
        ari[floor] = f"{result.metrics['ari']:.2f}"
        assert all(rows["answered"] == rows["usable"]  # every row answered from, every floor
                   for rows in result.metrics["site-rows"].values()), result.metrics["site-rows"]
        table1 = (out / "run" / "table1.md").read_text()
        if floor == 2:
            assert "\n".join(table_lines(result.metrics["table"])) == \
                _text_after(found, "  table schema sha256").rstrip("\n")
            with open(out / "run" / "history.csv", newline="") as f:
                rounds = [f"{row['round']},{row['task']}" for row in csv.DictReader(f)]
            assert ["round,task", *rounds] == _text_after(found, "round,task").split()
            _every_line_in(_text_after(found, "| Characteristic", 0), table1, "Table 1 at p 2")
            # the page's `Model.profile` example prints this run's medians (issue 70)
            profile = result.model.profile
            printed = str(profile[(profile.variable == "crp") & (profile.statistic == "median")])
            assert printed == _text_after(found, "    cluster variable").rstrip("\n"), printed
        if floor == 10:
            _every_line_in(_text_after(found, "| Characteristic", 1), table1, "Table 1 at p 10")
    assert f"adjusted Rand\nindex {ari[2]} against" in page or f"adjusted Rand index {ari[2]} against" in page, ari
    assert f"`min-cluster-size=1`, gives {ari[1]})" in page, ari
    assert f"(adjusted Rand index {ari[10]}, against {ari[2]} at\np = 2)" in page, ari
    # choosing-p quotes the same runs (issue 70: it said 0.76 and 0.80)
    choosing = (ROOT / "docs" / "tutorials" / "choosing-p.md").read_text()
    assert (f"adjusted Rand index {ari[2]} with groups of 2, {ari[10]} with groups of 10"
            in choosing), ari


def test_the_small_cells_example_of_the_outputs_reference_is_a_run(tmp_path):
    """Issue 70 (pages that contradict each other): outputs.md's Table 1 excerpt with `<10`
    and `suppressed` cells is the run it names (the tutorial's files, sites at p 10 from
    the start, k = 5), not a table of another release."""
    from fedcluster.common.clinical_demo import write_clinical
    from fedcluster.simulation import run_in_process

    write_clinical(tmp_path / "clinical", 3, 0)  # = fedcluster partition --dataset clinical --seed 0
    schema = str(tmp_path / "clinical" / "schema.toml")
    nodes = [{"data-path": str(tmp_path / "clinical" / f"site-{i}.csv"), "schema-path": schema,
              "site-id": str(i), "min-cluster-size": 10, "cache-dir": str(tmp_path / f"cache-{i}")}
             for i in range(3)]
    run_in_process(nodes, {"n-clusters": 5, "min-sites": 3, "scale": "standard", "schema": schema,
                           "output-dir": str(tmp_path / "out"), "run-name": "run"})
    found = blocks(ROOT / "docs" / "reference" / "outputs.md")
    excerpt = _text_after(found, "| Characteristic")
    assert "<10" in excerpt and "suppressed" in excerpt
    _every_line_in(excerpt, (tmp_path / "out" / "run" / "table1.md").read_text(),
                   "outputs.md's small-cell excerpt")

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
tests/test_deployment.py (real SuperLink and SuperNodes) run there.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import shlex

from test_docs import ROOT, WALKED, blocks, commands, run_bash

from fedcluster.cli import main

SHOWN = {"docs/tutorials/hospital-tables.md": 7, "docs/tutorials/first-deployment.md": 1}


def _fedcluster(argv: list[str]) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            code = main(argv)
        except SystemExit as stop:  # --help
            code = stop.code or 0
    return code, out.getvalue()


def _compare(printed: str, shown: str, where: str) -> None:
    printed = re.sub(r"\b\d{4}-\d{2}-\d{2}\b", "YYYY-MM-DD", printed.rstrip("\n"))
    shown = shown.rstrip("\n")
    if shown.startswith("...\n"):  # the output's last lines
        assert printed.endswith("\n" + shown[4:]), f"{where}:\n{printed}"
    else:
        assert printed == shown, f"{where}:\n{printed}"


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
                code, printed = _fedcluster(words[1:])
                assert (code == 0) == ("|| true" not in line), f"{block.where}: {line}\n{printed}"
                if words[1:3] == ["site", "check"] and after is not None and after.language == "text":
                    _compare(printed, after.code, block.where)
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
    assert runs == 4  # first-simulation 2, omop-cohort 2 (the clinical tables, the cohort)

"""Every deployment page's command blocks as the page shows them (issue 70): no port
substituted, no flag added, under whichever Flower is installed (1.42 in CI's main leg,
1.39 in its other leg).

A page that starts SuperNodes on this machine (the SuperLink on loopback) runs here on a
host of its own (a network namespace: the page's fixed ports are its own), in one folder
that holds a copy of the app (``flwr run .`` is run from it, as from the repository root)
and the files the page's earlier steps made (its own ``fedcluster partition`` lines, and
first-deployment's, which the how-to pages build on). Each of the page's
``flower-superlink`` and ``flower-supernode`` lines starts as the page shows it, through
bash (``$PWD`` as a shell expands it); where the page starts no SuperLink, the one the
first-deployment tutorial starts (with its ``~/.flwr`` connection ``mylink``). Every
SuperNode must register with the SuperLink (the error this test was written for: a page
naming Flower 1.39's port retries "Connection attempt failed" forever under 1.42), and a
page's ``fedcluster run`` (or ``flwr run``) line must end its run completed, every site answering
(``rejected-sites`` empty). first-deployment itself runs as written in
tests/test_deployment.py (which also compares it with the in-process run).

A page that names another machine (``coordinator.example.org``, the ``deploy/`` scripts
with TLS credentials) cannot run as written on one host; for those the address is
checked: no port, or 8000 (Flower 1.40+'s Fleet port), or 9092 only where the block or the
sentence before it says Flower 1.39 (the scripts in ``deploy/`` choose the port from the
installed Flower when given none: tests/test_secure_deployment.py).
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import flower_processes as fp
import netns
from test_deployment import sandbox  # noqa: F401  (the fixture)
from test_docs import PAGES, ROOT, blocks, commands, rel

FIRST_DEPLOYMENT = ROOT / "docs" / "tutorials" / "first-deployment.md"
RUN_TIMEOUT = 600.0
STARTS = ("flower-superlink", "flower-supernode", "flwr run", "fedcluster run")


def _deployment_lines(page: Path) -> list[str]:
    return [line for b in blocks(page) if b.language == "bash" for line in commands(b.code)
            if line.startswith(STARTS)]


def _is_local(lines: list[str]) -> bool:
    return not any(re.search(r"example\.org|coordinator|--root-certificates", line) for line in lines)


DEPLOYING = {rel(page): lines for page in PAGES if (lines := _deployment_lines(page))}
LOCAL = sorted(p for p, lines in DEPLOYING.items()
               if _is_local(lines) and any(line.startswith("flower-supernode") for line in lines)
               and Path(p) != FIRST_DEPLOYMENT.relative_to(ROOT))


def test_the_local_deployment_pages_are_the_ones_run_here():
    """A new page that starts SuperNodes on one machine is run by this file, by name."""
    assert LOCAL == ["docs/how-to/privacy-budget.md", "docs/how-to/site-policy.md",
                     "docs/tutorials/hospital-tables.md"], LOCAL


def test_no_page_names_one_release_s_port_for_every_release():
    """The SuperNodes' address in every bash block of every page: no port (the installed
    Flower's default, or the deploy scripts' choice), 8000, or 9092 said to be 1.39's."""
    problems = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for block in blocks(page):
            if block.language != "bash":
                continue
            start = text.find(block.code)
            before = text[max(0, start - 400):start]
            for line in commands(block.code):
                for port in re.findall(r"--superlink\s+\S+:(\d+)|start-site\.sh\s+\S+\s+\S+\s+\S+:(\d+)",
                                       line):
                    port = "".join(port)
                    if port == "9092" and "1.39" not in block.code + before:
                        problems.append(f"{block.where}: {line}")
                    elif port not in ("8000", "9092"):
                        problems.append(f"{block.where}: port {port}: {line}")
    assert not problems, "\n".join(problems)


def _page_files(page: Path, work: Path) -> None:
    """The page's own `fedcluster partition` lines and first-deployment's, in ``work``;
    and the app, so that ``flwr run .`` there is the repository root's."""
    for source in (FIRST_DEPLOYMENT, page):
        for b in blocks(source):
            if b.language != "bash" or b.marker is not None:
                continue
            for line in commands(b.code):
                if line.startswith("fedcluster partition"):
                    words = shlex.split(line, comments=True)
                    subprocess.run([str(Path(sys.executable).parent / words[0]), *words[1:]],
                                   cwd=work, check=True, capture_output=True)
    shutil.copy(ROOT / "pyproject.toml", work)
    shutil.copytree(ROOT / "fedcluster", work / "fedcluster",
                    ignore=shutil.ignore_patterns("__pycache__"))


def _operator_home(tmp_path: Path) -> Path:
    home = tmp_path / "operator-flwr"
    home.mkdir()
    (config,) = [b.code for b in blocks(FIRST_DEPLOYMENT) if b.language == "toml"]
    (home / "config.toml").write_text(config + "\n")
    return home


def _shell(line: str) -> list[str]:
    return ["bash", "-c", "exec " + line]


def _bash_on(prefix: list[str], line: str, env: dict, cwd: Path, log: Path) -> tuple[int | None, str]:
    """``line`` through bash on the page's host, its output kept in ``log``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w+b") as out:
        popen = subprocess.Popen([*prefix, "bash", "-c", line], stdin=subprocess.DEVNULL,
                                 stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                                 start_new_session=True)
        try:
            rc = popen.wait(timeout=RUN_TIMEOUT)
        except subprocess.TimeoutExpired:
            rc = None
            fp.stop_process_group(popen, grace=2.0)
        out.seek(0)
        return rc, out.read().decode(errors="replace")


@pytest.mark.skipif(netns.unavailable() is not None,
                    reason=f"the pages' fixed ports need a host of their own: {netns.unavailable()}")
@pytest.mark.parametrize("page", LOCAL)
def test_a_deployment_page_as_written(page, sandbox, tmp_path):
    lines = DEPLOYING[page]
    servers = [line for line in lines if line.startswith(("flower-superlink", "flower-supernode"))]
    runs = [line for line in lines if line.startswith(("flwr run", "fedcluster run"))]
    if not servers[0].startswith("flower-superlink"):  # a how-to that adds a site
        first = [line for line in _deployment_lines(FIRST_DEPLOYMENT)
                 if line.startswith("flower-superlink")]
        servers = first + servers
    work = tmp_path / "work"
    work.mkdir()
    _page_files(ROOT / page, work)
    home = _operator_home(tmp_path)
    with netns.lan(["machine"]) as net, sandbox() as bed:
        on_machine = net.exec_prefix("machine")
        started = []
        for i, line in enumerate(servers):
            superlink = line.startswith("flower-superlink")
            proc = bed.stack.enter_context(fp.flower_process(
                "superlink" if superlink else f"supernode-{i}", [*on_machine, *_shell(line)],
                log_dir=bed.log_dir, env=bed.env, cwd=work,
                ready_log=fp.SUPEREXEC_STARTED if superlink else fp.SUPERNODE_ID,
                wait=superlink, startup_timeout=90))
            bed.processes.append(proc)
            started.append(proc)
        for proc in started[1:]:
            proc.wait_ready()  # registered: the page's address reached the installed Flower's
        operator = {**bed.env, "FLWR_HOME": str(home)}
        for n, line in enumerate(runs):
            rc, output = _bash_on(on_machine, line, operator, work, bed.log_dir / f"flwr-run-{n}.log")
            assert rc == 0, output
            run_id = re.search(r"Successfully started run (\d+)|fedcluster: run (\d+) submitted",
                               output)
            run_id = run_id.group(1) or run_id.group(2)
            connection = shlex.split(line)[3]
            rc, listed = fp._flwr(["ls", connection, "--run-id", run_id, "--format", "json"],
                                  operator, work, 60, prefix=on_machine)
            assert rc == 0, listed
            status = [run["status"] for run in json.loads(listed[listed.index("{"):])["runs"]]
            assert status == ["finished:completed"], (status, output[-3000:])
    assert not fp.find_processes(tag=bed.tag, patterns=bed.patterns), "processes left behind"
    for model in (work / "outputs").glob("*/model.json") if runs else ():
        metrics = json.loads(model.read_text())["metrics"]
        assert metrics["rejected-sites"] == {} and metrics["n-sites"] == len(servers) - 1, metrics
    assert not runs or len(list((work / "outputs").glob("*/model.json"))) == len(runs)

"""The docs keep their promises (README.md and docs/**):

- the run-config and node-config reference tables agree with ``pyproject.toml``'s
  ``[tool.flwr.app.config]`` and with ``RunConfig`` / ``NodeConfig`` (keys and defaults,
  types included);
- every ```bash and ```python block is either run here, in a temporary directory, block
  after block in page order (the tutorials of ``WALKED`` one after another in one folder,
  in tests/test_tutorial_walk.py), or marked on the line just before it with
  ``<!-- run by PATH[, PATH ...] -->`` (the files that exercise it; each must exist) or
  ``<!-- not run here: REASON -->`` (docs/index.md, "Conventions of these pages");
- the README's Python example runs as it is, and its test command is CI's;
- every relative link resolves to a file or folder of the repository (anchors skipped),
  and docs/index.md links every page under docs/.

Commands of the form ``fedcluster ...`` run in this process through
``fedcluster.cli.main`` (one import, one set of compiled kernels); any other line of a
bash block runs in ``bash``.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = [README, *sorted(DOCS.rglob("*.md"))]

CHECKED_LANGUAGES = ("bash", "python")
#: a block of what a command printed (a ```text block): marked ``printed by`` the tests
#: that compare it with what the code prints, or ``not run here:``
PRINTED_LANGUAGE = "text"
FENCE = re.compile(r"^(\s*)(`{3,})\s*([\w+-]*)\s*$")
MARKER = re.compile(r"^<!--\s*(run by|printed by|not run here:)\s*(.*?)\s*-->$")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
TEST_COMMAND = "python -m pytest -q"


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


@dataclass
class Block:
    page: Path
    line: int  # 1-based line of the opening fence
    language: str
    code: str
    marker: tuple[str, str] | None  # ("run by" | "printed by", "a, b") or ("not run here:", reason)

    @property
    def where(self) -> str:
        return f"{rel(self.page)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """The fenced code blocks of a page, with the marker on the line before each."""
    lines = page.read_text(encoding="utf-8").splitlines()
    found, i = [], 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, fence, language = opening.groups()
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == fence), None)
        assert end is not None, f"{rel(page)}:{i + 1}: code block never closed"
        before = next((lines[j].strip() for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        marker = MARKER.match(before)
        code = [line.removeprefix(indent) for line in lines[i + 1:end]]  # (a block in a list)
        found.append(Block(page, i + 1, language, "\n".join(code),
                           marker.groups() if marker else None))
        i = end + 1
    return found


def prose(page: Path) -> str:
    """The page without its fenced code blocks."""
    text = page.read_text(encoding="utf-8")
    return re.sub(r"^(`{3,}).*?^\1\s*$", "", text, flags=re.M | re.S)


# ------------------------------------------------------------------ reference tables

def table(page: Path, header: str) -> dict[str, str]:
    """``{key: default cell}`` of the table whose header row is ``header``."""
    lines = page.read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == header)
    rows: dict[str, str] = {}
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        key = cells[0].strip("`")
        assert key not in rows, f"{rel(page)}: key {key!r} documented twice"
        rows[key] = cells[1]
    assert rows, f"{rel(page)}: no rows under {header!r}"
    return rows


def toml_value(cell: str):
    """A default cell as TOML reads it (``"dwf"``, ``10``, ``1e-4``, ``true``); ``(none)``
    is an unset key."""
    text = cell.strip().strip("`")
    if text == "(none)":
        return None
    return tomllib.loads(f"v = {text}")["v"]


def same(a, b) -> bool:
    """Equal and of the same type (``1 == 1.0 == True`` in Python; not here)."""
    return type(a) is type(b) and a == b


def disagreements(sources: dict[str, dict]) -> list[str]:
    names = list(sources)
    keys = set().union(*(set(s) for s in sources.values()))
    problems = []
    for key in sorted(keys):
        missing = [n for n in names if key not in sources[n]]
        if missing:
            problems.append(f"{key}: missing from {', '.join(missing)}")
            continue
        values = [sources[n][key] for n in names]
        if not all(same(values[0], v) for v in values[1:]):
            problems.append(f"{key}: " + ", ".join(f"{n} {v!r}" for n, v in zip(names, values)))
    return problems


def test_run_config_table_matches_pyproject_and_run_config():
    from fedcluster.common.config import RunConfig

    page = DOCS / "reference" / "run-config.md"
    docs = {k: toml_value(v) for k, v in table(page, "| key | default | meaning |").items()}
    with open(ROOT / "pyproject.toml", "rb") as fh:
        pyproject = tomllib.load(fh)["tool"]["flwr"]["app"]["config"]
    model = RunConfig().model_dump(by_alias=True)
    problems = disagreements({"docs": docs, "pyproject.toml": pyproject, "RunConfig": model})
    assert not problems, "run-config defaults disagree:\n  " + "\n  ".join(problems)


def test_node_config_table_matches_node_config():
    from fedcluster.client_app.node_config import NodeConfig

    page = DOCS / "reference" / "node-config.md"
    docs = {k: toml_value(v) for k, v in table(page, "| key | default | meaning |").items()}
    model = NodeConfig().model_dump(by_alias=True)
    problems = disagreements({"docs": docs, "NodeConfig": model})
    assert not problems, "node-config defaults disagree:\n  " + "\n  ".join(problems)


def test_table_check_catches_a_wrong_default():
    assert disagreements({"a": {"x": 600.0}, "b": {"x": 600}}) == ["x: a 600.0, b 600"]
    assert disagreements({"a": {"x": True}, "b": {"x": 1}})
    assert disagreements({"a": {"x": 1}, "b": {}}) == ["x: missing from b"]
    assert toml_value('`"dirichlet:0.3"`') == "dirichlet:0.3" and toml_value("1e-4") == 1e-4


# ------------------------------------------------------------------ markers

def checked_blocks() -> list[Block]:
    return [b for page in PAGES for b in blocks(page)
            if b.language in (*CHECKED_LANGUAGES, PRINTED_LANGUAGE)]


def test_every_marker_names_existing_files_or_a_reason():
    """A ``run by`` or ``printed by`` marker names files that exist; a ``printed by`` file
    also names the page (it reads the block it compares from there; this file reads every
    page); a ``not run here`` gives its reason."""
    problems = []
    for block in checked_blocks():
        if block.marker is None:
            continue
        kind, argument = block.marker
        if kind == "not run here:":
            if not argument:
                problems.append(f"{block.where}: 'not run here:' without a reason")
            continue
        if (kind == "printed by") != (block.language == PRINTED_LANGUAGE):
            problems.append(f"{block.where}: '{kind}' on a {block.language or 'plain'} block")
        paths = [p.strip() for p in argument.split(",") if p.strip()]
        if not paths:
            problems.append(f"{block.where}: '{kind}' names no file")
        problems += [f"{block.where}: '{kind} {p}': no such file" for p in paths
                     if not (ROOT / p).is_file()]
        if kind == "printed by":
            problems += [f"{block.where}: '{kind} {p}': {p} does not name {block.page.name}"
                         for p in paths if (ROOT / p).is_file() and p != "tests/test_docs.py"
                         and block.page.name not in (ROOT / p).read_text(encoding="utf-8")]
    assert not problems, "\n".join(problems)


def test_every_printed_block_is_compared_with_what_the_code_prints():
    """What a page shows a command printing (a ```text block) is what it prints: each is
    marked ``printed by`` the tests that compare it, or ``not run here:`` with a reason."""
    unmarked = [b.where for page in PAGES for b in blocks(page)
                if b.language == PRINTED_LANGUAGE and b.marker is None]
    assert not unmarked, "text blocks no test compares:\n" + "\n".join(unmarked)


def shown(page: str, starts: str, nth: int = 0) -> str:
    """The ``nth`` printed block of ``page`` (relative to the repository) that starts with
    ``starts``; for the tests a ``printed by`` marker names."""
    found = [b.code for b in blocks(ROOT / page)
             if b.language == PRINTED_LANGUAGE and b.code.startswith(starts)]
    assert len(found) > nth, f"{page}: no printed block starting {starts!r}"
    return found[nth]


def _shown(block_text: str) -> re.Pattern:
    """What a printed block's text matches: itself, each ``...`` in it any text left out."""
    return re.compile(".*?".join(re.escape(part) for part in block_text.split("...")), re.S)


def same_words(printed: str, block: str) -> bool:
    """``printed`` is the block, read as a page wraps it (whitespace runs are one space;
    ``...`` marks text left out)."""
    return _shown(" ".join(block.split())).fullmatch(" ".join(printed.split())) is not None


def compare_printed(printed: str, block: str, where: str) -> None:
    """``printed`` is the text ``block`` shows, line by line (a day reads YYYY-MM-DD, a run
    id N; a block that starts with a line ``...`` shows the output's last lines; a ``...``
    in a line marks text left out)."""
    printed = re.sub(r"\b\d{4}-\d{2}-\d{2}\b", "YYYY-MM-DD", printed.rstrip("\n"))
    printed_lines = re.sub(r"\brun \d+", "run N", printed).split("\n")
    block_lines = re.sub(r"\brun \d+", "run N", block.rstrip("\n")).split("\n")
    if block_lines[0] == "...":  # the output's last lines
        block_lines = block_lines[1:]
        printed_lines = printed_lines[-len(block_lines):]
    assert len(printed_lines) == len(block_lines) and all(
        _shown(shown).fullmatch(ours) for ours, shown in zip(printed_lines, block_lines)), \
        f"{where}:\n{printed}"


def test_every_unrecognised_marker_like_comment_is_an_error():
    """A comment just before a block that looks like a marker but is not one (a typo)
    would silently turn the block into one that runs; say so instead."""
    problems = []
    for page in PAGES:
        lines = page.read_text(encoding="utf-8").splitlines()
        for i, line in enumerate(lines):
            text = line.strip()
            if text.startswith("<!--") and ("run" in text) and not MARKER.match(text):
                problems.append(f"{rel(page)}:{i + 1}: not a marker: {text}")
    assert not problems, "\n".join(problems)


def test_readme_test_command_is_ci_s():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert TEST_COMMAND in lines, f"README.md has no line {TEST_COMMAND!r}"
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert TEST_COMMAND in ci, f".ci/run does not run {TEST_COMMAND!r}"
    assert len(lines) < 200, f"README.md has {len(lines)} lines; keep it under 200"


# ------------------------------------------------------------------ running the blocks

def commands(code: str) -> list[str]:
    """The logical lines of a bash block: continuations joined, blanks and comments out."""
    out, pending = [], ""
    for raw in code.splitlines():
        line = pending + raw.strip()
        if line.endswith("\\"):
            pending = line[:-1].rstrip() + " "
            continue
        pending = ""
        if line and not line.startswith("#"):
            out.append(line)
    assert not pending, f"a continuation line ends the block: {pending!r}"
    return out


def fedcluster_output(argv: list[str]) -> tuple[int, str]:
    """``fedcluster ARGV`` in this process: its exit code and what it printed."""
    from fedcluster.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            code = main(argv)
        except SystemExit as stop:  # --help
            code = stop.code or 0
    return code, out.getvalue()


def run_bash(line: str, cwd: Path, where: str) -> None:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", line], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, (f"{where}: `{line}` exited {done.returncode}:\n"
                                  f"{done.stdout[-2000:]}{done.stderr[-2000:]}")


def run_block(block: Block, cwd: Path, namespace: dict, after: Block | None = None) -> int:
    """Run ``block``; where it ends with a ``fedcluster`` command and ``after`` is the
    printed block this file compares (``printed by tests/test_docs.py``), its output is
    that block (``|| true``: a command the page shows failing). How many it compared."""
    if block.language == "python":
        exec(compile(block.code, block.where, "exec"), namespace)  # noqa: S102
        return 0
    compared = 0
    lines = commands(block.code)
    for i, line in enumerate(lines):
        fails = line.endswith("|| true")
        words = shlex.split(line.removesuffix("|| true"), comments=True)
        if not (words and words[0] == "fedcluster"
                and not re.search(r"[|&;<>$`]", line.removesuffix("|| true"))):
            run_bash(line, cwd, block.where)
            continue
        code, printed = fedcluster_output(words[1:])
        assert (code == 0) != fails, \
            f"{block.where}: `{line}` exited {code}:\n{printed[-3000:]}"
        if i == len(lines) - 1 and after is not None and after.language == PRINTED_LANGUAGE \
                and after.marker is not None and "tests/test_docs.py" in after.marker[1]:
            compare_printed(printed, after.code, block.where)
            compared += 1
    return compared


# the tutorials a newcomer walks in order, in one folder: tests/test_tutorial_walk.py
WALKED = ("docs/tutorials/first-simulation.md", "docs/tutorials/hospital-tables.md",
          "docs/tutorials/omop-cohort.md", "docs/tutorials/first-deployment.md")
RUN_HERE = {rel(page): [b for b in blocks(page) if b.language in CHECKED_LANGUAGES
                        and b.marker is None] for page in PAGES if rel(page) not in WALKED}


@pytest.mark.parametrize("page", [p for p, found in RUN_HERE.items() if found])
def test_page_blocks_run(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FEDCLUSTER_CACHE_DIR", str(tmp_path / "site-cache"))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    namespace: dict = {"__name__": f"docs:{page}"}
    found = blocks(ROOT / page)
    compared = 0
    for block in RUN_HERE[page]:
        at = next(i for i, b in enumerate(found) if b.line == block.line)
        compared += run_block(block, tmp_path, namespace, (found[at + 1:] or [None])[0])
    # every printed block this file is named for is one a block before it printed
    assert compared == sum(b.language == PRINTED_LANGUAGE and b.marker is not None
                           and "tests/test_docs.py" in b.marker[1] for b in found), page


def test_readme_python_example_is_run_here():
    python = [b for b in blocks(README) if b.language == "python"]
    assert python, "README.md has no Python example"
    assert all(b.marker is None for b in python), "the README's Python example must run as is"
    assert "README.md" in RUN_HERE and any(b.language == "python" for b in RUN_HERE["README.md"])


def test_commands_split_as_a_shell_would():
    assert commands("a \\\n  b  # c\n\n# d\ne") == ["a b  # c", "e"]
    assert shlex.split("fedcluster x --y 'a b'  # note", comments=True) == ["fedcluster", "x", "--y", "a b"]


# ------------------------------------------------------------------ links

def links(page: Path) -> list[str]:
    return [target for target in LINK.findall(prose(page))
            if not re.match(r"^[a-z][a-z0-9+.-]*:", target) and not target.startswith("#")]


def test_relative_links_resolve():
    missing = {}
    for page in PAGES:
        for target in links(page):
            path = (page.parent / target.split("#", 1)[0]).resolve()
            if not path.exists():
                missing.setdefault(rel(path) if path.is_relative_to(ROOT) else str(path),
                                   []).append(f"{rel(page)} -> {target}")
    assert not missing, "broken links:\n  " + "\n  ".join(x for v in missing.values() for x in v)


def test_docs_index_links_every_page():
    index = DOCS / "index.md"
    linked = {(index.parent / t.split("#", 1)[0]).resolve() for t in links(index)}
    pages = {p.resolve() for p in DOCS.rglob("*.md") if p != index}
    unlinked = sorted(rel(p) for p in pages - linked)
    assert not unlinked, f"docs/index.md does not link: {unlinked}"

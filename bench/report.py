"""Writing benchmark results into BENCHMARKS.md: one section per script, replaced in place
between ``<!-- name -->`` and ``<!-- /name -->`` markers so scripts do not overwrite each
other, each with the command that made it, the date, the machine and the versions."""

from __future__ import annotations

import datetime
import os
import platform
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHARED_DATA = ROOT.parent / "shared" / "data"


def machine() -> str:
    """Cores, Python and the versions that matter for the figures."""
    import numba
    import numpy
    import sklearn

    import flwr

    return (
        f"{os.cpu_count()} cores ({platform.processor() or platform.machine()}), "
        f"Python {platform.python_version()}, numpy {numpy.__version__}, numba "
        f"{numba.__version__}, scikit-learn {sklearn.__version__}, flwr {flwr.__version__}"
    )


def quiet_flower() -> None:
    """Flower's logger at WARNING: a benchmark prints its own line per run, not Flower's and
    fedcluster's report of every round."""
    import logging

    from flwr.common.logger import FLOWER_LOGGER

    FLOWER_LOGGER.setLevel(logging.WARNING)


def header(title: str) -> str:
    command = "python " + " ".join([Path(sys.argv[0]).as_posix().split(str(ROOT) + "/")[-1],
                                    *sys.argv[1:]])
    return (
        f"## {title}\n\n"
        f"Made by `{command}` on {datetime.date.today().isoformat()}; {machine()}.\n"
    )


def write_section(name: str, text: str, path: Path | None = None) -> Path | None:
    """Put ``text`` into ``path`` (a script's ``--out``, e.g. BENCHMARKS.md) as section
    ``name``, replacing the previous version of that section and leaving the others alone.

    None: print the section and write nothing. A run with a subset of a script's options
    (one algorithm, one seed) would otherwise replace the section of record with its
    partial table; writing it is asked for by name."""
    if path is None:
        print(f"{text.rstrip()}\n\n(section '{name}' not written: --out BENCHMARKS.md writes it)")
        return None
    path = Path(path)
    start, end = f"<!-- {name} -->", f"<!-- /{name} -->"
    block = f"{start}\n{text.rstrip()}\n{end}\n"
    old = path.read_text() if path.exists() else "# Benchmarks\n\n"
    if start in old and end in old:
        before, rest = old.split(start, 1)
        after = rest.split(end, 1)[1].lstrip("\n")
        new = before + block + ("\n" + after if after else "")
    else:
        new = old.rstrip("\n") + "\n\n" + block
    path.write_text(new)
    return path

"""The app package (FAB) that `flwr run .` sends to the SuperLink and every site installs:
the fedcluster package and pyproject.toml only (issue 55), whatever else the checkout
holds: tutorial data, a site's cache and answered history, a run's outputs, notes.

Built in process with Flower's own ``build_fab_from_disk`` (what ``flwr build`` and
``flwr run`` call) from a copy of the repository's app with such files added.
"""

from __future__ import annotations

import io
import shutil
import zipfile
from pathlib import Path

from flwr.cli.build import build_fab_from_disk

REPO = Path(__file__).resolve().parents[1]

#: Files a newcomer's checkout may hold after the tutorials, each of a kind Flower's own
#: rules would otherwise pack (.json, .jsonl, .toml, .yaml, .md, .py).
STRAY = {
    "clinical/schema.toml": "[columns]\n",
    "clinical/site-0.csv": "age,crp\n50,1.0\n",
    "site-2-cache/groups/entry.json": '{"digest": "abc", "rows": 563}',
    "site-2-cache/lineage/tables.jsonl": '{"table": 0}\n',
    "runs/model.json": '{"score": 1.0}',
    "runs/ledger.jsonl": '{"basis": {}}\n',
    "notes.md": "# my notes\n",
    "deploy/site.yaml": "site: 1\n",
    "my_analysis.py": "print('a local script')\n",
    "fedcluster/__pycache__/app.cpython-311.pyc": "",
}


def _names(fab: bytes) -> set[str]:
    with zipfile.ZipFile(io.BytesIO(fab)) as z:
        return set(z.namelist())


def test_the_fab_holds_the_package_and_pyproject_only(tmp_path):
    app = tmp_path / "checkout"
    shutil.copytree(REPO / "fedcluster", app / "fedcluster",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", app)
    for name, text in STRAY.items():
        (app / name).parent.mkdir(parents=True, exist_ok=True)
        (app / name).write_text(text)
    names = _names(build_fab_from_disk(app))
    package = {str(p.relative_to(app)) for p in (app / "fedcluster").rglob("*.py")
               if "__pycache__" not in p.parts}
    assert len(package) > 50
    assert names - {".info/CONTENT"} == package | {"pyproject.toml"}
    assert not any(name.startswith(("clinical/", "site-2-cache/", "runs/", "deploy/"))
                   for name in names)
    # the control: Flower's own rules alone (no include list) would pack the stray files
    text = (app / "pyproject.toml").read_text()
    (app / "pyproject.toml").write_text(text.replace('fab-include = ["fedcluster/**"]\n', ""))
    loose = _names(build_fab_from_disk(app))
    assert {"site-2-cache/groups/entry.json", "runs/model.json", "notes.md",
            "my_analysis.py"} <= loose

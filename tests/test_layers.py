"""The house: fedcluster's layers, read from the code's own import statements.

The layer order (lowest first); a module may import only from a lower layer or from its own
package, and the two sides of the middle layer never import each other::

    common  <-  client_app (the site) | strategies  <-  server_app  <-  simulation  <-  cli

Every import counts, at the top of a module or inside a function (a lazy import that goes
the wrong way is still a wrong way). Also: no import circle among fedcluster's modules, no
module over 450 lines except the one compiled-kernel module, no pickle anywhere, and only
the protocol module indexes a reply's arrays by position.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import fedcluster

PACKAGE = Path(fedcluster.__file__).parent

# (layer, side): a module may import a module of a lower layer, or of its own package.
LAYERS = {
    "fedcluster.common": (0, "common"),
    "fedcluster.client_app": (1, "site"),
    "fedcluster.strategies": (1, "server"),
    "fedcluster.server_app": (2, "server_app"),
    "fedcluster.simulation": (3, "simulation"),
    "fedcluster.simulation_tables": (3, "simulation"),
    "fedcluster.cli": (4, "cli"),
}
MAX_LINES = 450
COMPILED_MODULE = PACKAGE / "common" / "kernels" / "_compiled.py"
PROTOCOL_MODULE = PACKAGE / "common" / "protocol.py"


def module_name(path: Path, root: Path = PACKAGE) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path, name: str, known: set[str]) -> set[str]:
    """The fedcluster modules ``path`` imports (``from pkg import mod`` counts as ``pkg.mod``
    when that is a module)."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                       for alias in node.names]
        else:
            continue
        found.update(t for t in targets if t == "fedcluster" or t.startswith("fedcluster."))
    return found


def import_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    files = {module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    known = set(files)
    graph = {}
    for name, path in files.items():
        targets = set()
        for target in imports_of(path, name, known):
            # importing pkg.mod.attr means importing pkg.mod
            while target not in known and "." in target:
                target = target.rpartition(".")[0]
            if target in known and target != name:
                targets.add(target)
        graph[name] = targets
    return graph


def layer_of(name: str) -> tuple[int, str] | None:
    for prefix, layer in LAYERS.items():
        if name == prefix or name.startswith(prefix + "."):
            return layer
    return None


def wrong_way(graph: dict[str, set[str]]) -> list[str]:
    """Every import that goes up a layer or across the sides."""
    problems = []
    for source, targets in graph.items():
        here = layer_of(source)
        if here is None:  # the package's own __init__: lazy attribute access only
            continue
        for target in sorted(targets):
            there = layer_of(target)
            if there is None:
                problems.append(f"{source} imports {target}, which has no layer")
            elif there[1] == here[1]:
                continue
            elif there[0] >= here[0]:
                problems.append(f"{source} (layer {here[1]}) imports {target} (layer {there[1]})")
    return problems


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_goes_up_a_layer_or_across_the_sides():
    graph = import_graph()
    assert "fedcluster.client_app.app" in graph and "fedcluster.common.config" in graph
    assert wrong_way(graph) == []


def test_no_import_circle():
    assert circles(import_graph()) == []


def test_the_checker_sees_upward_imports_and_circles(tmp_path):
    """Self-test on a small package: an upward import, a cross-side import, a lazy one in a
    function, a relative one and a circle are all found."""
    root = tmp_path / "fedcluster"
    files = {
        "__init__.py": "",
        "common/__init__.py": "",
        "common/a.py": "def f():\n    from fedcluster.server_app import run\n",
        "common/b.py": "from . import c\n",
        "common/c.py": "from fedcluster.common.b import x\n",
        "client_app/__init__.py": "from fedcluster.strategies import base\n",
        "strategies/__init__.py": "",
        "strategies/base.py": "from fedcluster.common import a\n",
        "server_app/__init__.py": "from fedcluster.strategies.base import Thing\n",
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    graph = import_graph(root)
    assert graph["fedcluster.common.b"] == {"fedcluster.common.c"}
    assert graph["fedcluster.server_app"] == {"fedcluster.strategies.base"}
    assert sorted(wrong_way(graph)) == [
        "fedcluster.client_app (layer site) imports fedcluster.strategies.base (layer server)",
        "fedcluster.common.a (layer common) imports fedcluster.server_app (layer server_app)",
    ]
    assert circles(graph) == [  # the lazy import in common.a closes a circle too
        ["fedcluster.common.a", "fedcluster.server_app", "fedcluster.strategies.base"],
        ["fedcluster.common.b", "fedcluster.common.c"],
    ]


def test_no_module_over_450_lines_but_the_compiled_kernels():
    long = {str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob("*.py")
            if p != COMPILED_MODULE and (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert COMPILED_MODULE.exists()
    assert long == {}


def test_no_pickle_anywhere():
    """Checkpoints are data (JSON + .npz): loading one runs no code."""
    users = [str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if "pickle" in p.read_text()]
    assert users == []


def test_only_the_protocol_module_indexes_reply_arrays():
    """A reply's array order is known in one place: everywhere else arrays are named."""
    assert PROTOCOL_MODULE.exists()
    indexing = re.compile(r"\barrays\[")
    users = [f"{p.relative_to(PACKAGE)}:{i}" for p in PACKAGE.rglob("*.py") if p != PROTOCOL_MODULE
             for i, line in enumerate(p.read_text().splitlines(), 1) if indexing.search(line)]
    assert users == []

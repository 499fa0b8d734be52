"""The house: fedcluster's layers, read from the code's own import statements.

The layer order (lowest first); a module may import only from a lower layer or from its own
package, and the two sides of the middle layer never import each other::

    common  <-  client_app (the site) | strategies  <-  server_app  <-  simulation  <-  cli

Every import counts, at the top of a module or inside a function (a lazy import that goes
the wrong way is still a wrong way). Also: no import circle among fedcluster's modules, no
module over 450 lines except the one compiled-kernel module (none of the server's two
packages over 300), no function outside the run's classes taking the strategy, no phase
as a string, no pickle anywhere, and only the protocol module indexes a reply's arrays
by position.
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
    "fedcluster.simulation_progress": (3, "simulation"),
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


#: The server's two packages hold a run in small rooms (issue 57): the Flower adapter,
#: the run controller, the algorithm base, the phases' pure functions.
SERVER_PACKAGES = (PACKAGE / "strategies", PACKAGE / "server_app")
SERVER_MAX_LINES = 300
#: The run's own classes: the controller and the algorithm base (an algorithm subclasses it).
RUN_CLASSES = {"Run", "ClusteringStrategy"}


def _functions_outside_the_run(tree: ast.AST):
    """Every function of ``tree`` outside the run's own classes (and their subclasses
    in the module), with its class name ("" for a module-level function)."""
    def walk(node, owner):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                bases = {getattr(b, "id", getattr(b, "attr", "")) for b in child.bases}
                yield from walk(child, None if bases & RUN_CLASSES or child.name in RUN_CLASSES
                                else child.name)
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if owner is not None:
                    yield owner, child
                yield from walk(child, owner)
            else:
                yield from walk(child, owner)
    yield from walk(tree, "")


def test_no_module_of_the_server_over_300_lines():
    long = {str(p.relative_to(PACKAGE)): n for root in SERVER_PACKAGES for p in root.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > SERVER_MAX_LINES}
    assert long == {}


def _strategy_arguments(tree: ast.AST, where: str) -> list[str]:
    found = []
    for owner, fn in _functions_outside_the_run(tree):
        for arg in [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs]:
            note = set() if arg.annotation is None else {
                getattr(n, "id", getattr(n, "attr", getattr(n, "value", None)))
                for n in ast.walk(arg.annotation)}
            if arg.arg in ("strategy", "run") or note & RUN_CLASSES:
                found.append(f"{where}:{owner or '-'}.{fn.name}({arg.arg})")
    return found


def test_no_function_outside_the_run_takes_the_strategy():
    """The run's state changes in its own methods: every other function of the server
    takes what it reads (a config, the sites, a plan, a ``RoundFacts``) and returns what
    it makes. An argument named ``strategy`` (or ``run``) outside the run's classes is the
    old way back in; so is one annotated with the run's classes."""
    found = [hit for root in SERVER_PACKAGES for path in root.rglob("*.py")
             for hit in _strategy_arguments(ast.parse(path.read_text()), str(path.relative_to(PACKAGE)))]
    # The Flower adapter holds the run it drives (its constructor is given it).
    assert found == ["strategies/flower_adapter.py:FlowerAdapter.__init__(run)"]
    # and the check sees what it looks for
    sample = ast.parse("def f(strategy): pass\n"
                       "class A(ClusteringStrategy):\n    def g(self, strategy): pass\n"
                       "class B:\n    def h(self, other: ClusteringStrategy): pass\n"
                       "def k(config: RunConfig): pass\n")
    assert _strategy_arguments(sample, "m") == ["m:-.f(strategy)", "m:B.h(other)"]


def _phase_literals(tree: ast.AST, where: str) -> list[str]:
    found = []
    for node in ast.walk(tree):
        targets, values = [], []
        if isinstance(node, ast.Assign):
            targets, values = node.targets, [node.value]
        elif isinstance(node, ast.Compare):
            targets = values = [node.left, *node.comparators]
        if any(ast.unparse(t).endswith("phase") for t in targets) and any(
                isinstance(v, ast.Constant) and isinstance(v.value, str) for v in values):
            found.append(f"{where}:{node.lineno}")
    return found


def test_no_phase_is_a_string_literal():
    """The phases are defined once (``strategies/phases.py``): nothing assigns a phase a
    string or compares one with a string."""
    found = [hit for root in SERVER_PACKAGES for path in root.rglob("*.py")
             for hit in _phase_literals(ast.parse(path.read_text()), str(path.relative_to(PACKAGE)))]
    assert found == []
    sample = ast.parse('self.phase = "train"\nif self.phase == "evaluate": pass\n'
                       'self.phase = Phase.TRAIN\n')
    assert _phase_literals(sample, "m") == ["m:1", "m:2"]

"""The leak check: no test module leaves a process, a network namespace or a listening
port behind. After each module: no live process carries a test tag (every process that
tests/flower_processes.py starts, and all their descendants, do), no namespace or
interface made by tests/netns.py exists, and nothing listens on a port that
flower_processes handed out. What is found is killed or removed, and the module's last
test fails with the list (so a leak is a red test, not a silent slowdown)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

import flower_processes as fp
import netns

# The app the real-Flower tests submit (`flwr run` of the repository).
REPO = Path(__file__).resolve().parents[1]


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture(scope="module", autouse=True)
def nothing_left_behind(request):
    ports_before = set(fp.HANDED_OUT_PORTS)
    yield
    problems = []
    processes = fp.tagged_processes()
    if processes:
        fp.kill_pids([p.pid for p in processes])
        problems += [f"process {p.pid}: {p.cmdline[:160]}" for p in processes]
    for ns in netns.namespaces():
        netns._ip("netns", "delete", ns, check=False)
        problems.append(f"network namespace {ns}")
    for link in netns.links():
        netns._ip("link", "delete", link, check=False)
        problems.append(f"network interface {link}")
    ports = sorted(p for p in fp.HANDED_OUT_PORTS - ports_before if _listening(p))
    problems += [f"something still listens on port {p}" for p in ports]
    if problems:
        pytest.fail(f"{request.module.__name__} left behind:\n  " + "\n  ".join(problems),
                    pytrace=False)


@pytest.fixture(scope="session")
def numba_cache(tmp_path_factory) -> Path:
    """One Numba cache directory for the real Flower processes of the session, and one
    FLWR_HOME (``fp.SESSION_HOME``) per worker: a fresh ClientApp process then loads the
    kernels compiled for its path instead of compiling them.

    Before it returns, tests/warm_kernels.py (a subprocess, with the Flower processes'
    environment) installs the app into the worker's FLWR_HOME as a SuperNode would and
    compiles every kernel specialisation the site tasks use into the cache, for that
    path and for the installed fedcluster: on a fresh clone no ClientApp then compiles
    (which cost minutes, every site compiling the same kernel at once). Its output:
    ``warm-kernels.log`` in the worker's base temp dir."""
    base = tmp_path_factory.getbasetemp()
    # Shared by the xdist workers (Numba writes its cache files by atomic renames): a
    # kernel compiled for a path by one worker's processes is loaded by the other's.
    path = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "numba-cache"
    if os.environ.get("NUMBA_CACHE_DIR"):
        # CI sets one for the whole run: the kernels that pytest's own processes compile
        # for the installed fedcluster are then the ones the warm-up compiles, once.
        path = Path(os.environ["NUMBA_CACHE_DIR"])
    path.mkdir(parents=True, exist_ok=True)
    fp.SESSION_HOME = base / "flwr-home"  # per worker: see its comment
    fp.SESSION_HOME.mkdir(exist_ok=True)
    fp.warm_numba_cache(path, fp.SESSION_HOME, REPO, log_path=base / "warm-kernels.log")
    return path


@pytest.fixture()
def bed(tmp_path, numba_cache):
    """A sandbox for real Flower processes (tests/flower_processes.py) in this test's
    directory, with a Numba cache shared by the session and a per-test site cache."""
    with fp.sandbox(tmp_path, NUMBA_CACHE_DIR=numba_cache,
                    FEDCLUSTER_CACHE_DIR=tmp_path / "site-cache") as sandbox:
        yield sandbox


# The modules that run real Flower processes, longest first, collected before the rest.
# xdist (with pyproject's --no-loadscope-reorder, which keeps this order instead of
# putting the modules with the most tests first) hands each worker two modules to start:
# the gRPC runs and test_deployment to one, the engine runs and test_faults to the other
# (whose corrupting ClientApp imports the installed fedcluster the engine runs compiled),
# so the long single-test modules never end the session on one worker alone.
SLOW_MODULES = ["test_flower_algorithms", "test_flower_engine", "test_deployment", "test_faults",
                "test_secure_deployment", "test_secure_aggregation", "test_site_policy",
                "test_parity"]


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(SLOW_MODULES)}
    items.sort(key=lambda item: rank.get(item.module.__name__, len(SLOW_MODULES)))

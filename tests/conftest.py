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


@pytest.fixture(autouse=True)
def site_cache_of_the_test(tmp_path_factory, monkeypatch):
    """A site with a data file and no cache-dir keeps its files (data cache, the guard's
    row sets, the privacy budget, the disclosure ledger) in FEDCLUSTER_CACHE_DIR: one
    fresh directory per test, never the user's ~/.cache (a test that wants another
    monkeypatches it again)."""
    monkeypatch.setenv("FEDCLUSTER_CACHE_DIR", str(tmp_path_factory.mktemp("site-cache")))
    # A simulated site's rows are cached per process (the same array objects every
    # message), and its groups and record with them: each test starts as a fresh process
    # would, not with the partitions (and reports) of the worker's earlier tests.
    from fedcluster.client_app.data import site_data

    site_data._partition_cached.cache_clear()


@pytest.fixture(scope="session")
def numba_cache(tmp_path_factory) -> Path:
    """One Numba cache directory for the real Flower processes of the session, and one
    FLWR_HOME (``fp.SESSION_HOME``) per worker.

    The sites of the real-Flower tests are small enough for the NumPy path of the kernels
    (fedcluster/common/kernels/small_work.py; test_small_work.py checks that every
    algorithm runs on such sites without Numba), so their ClientApp processes never load
    a compiled kernel, and nothing is compiled ahead for them. A process that did need
    one would compile it into this cache once and load it from there after."""
    base = tmp_path_factory.getbasetemp()
    # Shared by the xdist workers (Numba writes its cache files by atomic renames).
    path = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "numba-cache"
    if os.environ.get("NUMBA_CACHE_DIR"):
        path = Path(os.environ["NUMBA_CACHE_DIR"])  # CI sets one for the whole run
    path.mkdir(parents=True, exist_ok=True)
    fp.SESSION_HOME = base / "flwr-home"  # per worker: see its comment
    fp.SESSION_HOME.mkdir(exist_ok=True)
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
# the gRPC runs and test_deployment to one, the engine runs and test_faults to the other,
# so the long single-test modules never end the session on one worker alone.
SLOW_MODULES = ["test_flower_algorithms", "test_flower_engine", "test_deployment", "test_faults",
                "test_secure_deployment", "test_secure_aggregation", "test_site_policy",
                "test_site_ledgers_processes", "test_signed_apps", "test_parity", "test_sql_sites",
                "test_pages_as_written", "test_run_command"]


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(SLOW_MODULES)}
    items.sort(key=lambda item: rank.get(item.module.__name__, len(SLOW_MODULES)))

"""Start real Flower processes for a test, and never leave one behind.

Flower's own processes spread out: ``flower-superlink`` and ``flower-supernode`` each
start a ``flower-superexec`` (the SuperLink's in a NEW session, so it escapes the
SuperLink's process group), the SuperExec starts ``flwr-serverapp`` /
``flwr-simulation`` / ``flwr-clientapp`` processes, and the simulation starts Ray
(``gcs_server``, ``raylet``, workers). Killing the process we started is therefore not
enough. Every process started here gets two environment
variables that all its descendants inherit:

- ``FEDCLUSTER_TEST_TAG``: one value per test (see :func:`child_env`);
- ``FEDCLUSTER_TEST_OWNER``: ``<tag>/<name>``, one value per started process.

Stopping a process kills its process group, gives Flower's children a few seconds to
exit on their own (they watch their parent's pid), then kills every process whose
environment carries its owner value or whose command line names one of its ports;
:func:`reap` does the same for a whole test (tag, tmp dirs, ports) as the final safety
net.

Public helpers: :func:`free_port`, :func:`child_env`, :func:`flower_process`,
:func:`superlink`, :func:`supernode`, :func:`flwr_home`, :func:`run_flwr`,
:func:`reap`, :func:`format_run_config`, and :func:`sandbox`, which puts
them together for one test.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
import uuid
import warnings
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

TAG_VAR = "FEDCLUSTER_TEST_TAG"
OWNER_VAR = "FEDCLUSTER_TEST_OWNER"
# The virtualenv's bin dir (flwr, flower-superlink, flower-supernode, flower-superexec).
BIN_DIR = Path(sys.executable).parent
#: tests/flower_speedups: the sitecustomize that shortens the test SuperNodes' idle sleep.
SPEEDUPS_DIR = Path(__file__).resolve().parent / "flower_speedups"
LOG_TAIL_LINES = 60
CHILD_EXIT_GRACE = 10.0  # seconds Flower's children get to exit after their parent
SUPERNODE_ID = re.compile(r"SuperNode ID: (\d+)")
#: The installed Flower, (major, minor). Flower 1.39 serves the Fleet API (the sites'
#: connection) over gRPC on a port of its own; 1.40 and later over HTTP on the
#: SuperLink's ``--port``, beside its Control and Runtime APIs (issue 58).
FLWR_VERSION = tuple(int(part) for part in importlib.metadata.version("flwr").split(".")[:2])
HTTP_FLEET = FLWR_VERSION >= (1, 40)
#: The port ``deploy/start-superlink.sh`` serves the sites on, by default.
DEPLOY_FLEET_PORT = 8000 if HTTP_FLEET else 9092
SUPEREXEC_STARTED = re.compile(r"Starting Flower SuperExec")

# Processes started by flower_process() that are still running: run_flwr() shows the
# tail of each one's log when a run fails.
_LIVE: dict[int, FlowerProcess] = {}
# `flwr` CLI processes still running (e.g. `flwr run` in a test's thread), by pid.
_CLIENTS: dict[int, subprocess.Popen] = {}


class FlowerProcessError(RuntimeError):
    """A Flower process or run did not do what the test needed; the message has logs."""


# ---------------------------------------------------------------------- ports, env


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (bound to port 0, closed)."""
    return free_ports(1)[0]


#: Every port handed out by :func:`free_ports` (the leak check in conftest.py verifies
#: that nothing listens on them once a test module is done).
HANDED_OUT_PORTS: set[int] = set()


def free_ports(n: int) -> list[int]:
    """``n`` distinct free ports (all bound at once, so they cannot repeat)."""
    sockets = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        ports = [s.getsockname()[1] for s in sockets]
        HANDED_OUT_PORTS.update(ports)
        return ports
    finally:
        for s in sockets:
            s.close()


def short_tmp_dir(prefix: str) -> Path:
    """A fresh directory with a short path under the system tmp dir.

    For Ray (``RAY_TMPDIR``): it puts Unix sockets under it, and a socket path may be at
    most 107 bytes, which a pytest ``tmp_path`` plus Ray's session dir exceeds.
    """
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))


def child_env(tag: str, **extra: str | os.PathLike) -> dict[str, str]:
    """The environment for every process of one test.

    The virtualenv's bin dir first on PATH (so ``flwr``, ``flower-*`` and the processes
    Flower starts by name resolve to it), the test's ``tag`` (inherited by every
    descendant, see :func:`reap`), unbuffered Python output (logs are complete when a
    process is killed), bytecode written, Flower's telemetry off, and ``extra`` (e.g.
    ``FLWR_HOME``, ``NUMBA_CACHE_DIR``).
    """
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(BIN_DIR), env.get("PATH", "")])
    env[TAG_VAR] = tag
    env["PYTHONUNBUFFERED"] = "1"
    # As at a site: the app's bytecode is written once to its install folder (a fresh
    # ClientApp process per message otherwise compiles every module from source), and
    # Flower's telemetry is off (a site sends nothing to flower.ai; docs/how-to say so).
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["FLWR_TELEMETRY_ENABLED"] = "0"
    env.pop(OWNER_VAR, None)
    env.update({key: str(value) for key, value in extra.items()})
    return env


#: Every tag this test process made (the leak check looks for exactly these, so a
#: concurrent test run on the same machine is left alone).
TAGS_MADE: set[str] = set()


def new_tag() -> str:
    tag = f"fedcluster-test-{uuid.uuid4().hex[:12]}"
    TAGS_MADE.add(tag)
    return tag


# ------------------------------------------------------------ finding processes


@dataclass(frozen=True)
class ProcInfo:
    pid: int
    cmdline: str


def _ancestors() -> set[int]:
    """This process and its ancestors (never to be killed by a sweep)."""
    pids, pid = set(), os.getpid()
    while pid > 1 and pid not in pids:
        pids.add(pid)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        pid = int(stat.rsplit(")", 1)[1].split()[1])  # field 4: ppid
    return pids


def _scan() -> Iterator[tuple[ProcInfo, dict[str, str]]]:
    """Every live (non-zombie) process we may inspect: its command line and environment."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            if stat.rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                continue
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            env = _test_vars(pid)
        except (OSError, IndexError):  # gone, or not ours to read
            continue
        text = cmdline.replace(b"\0", b" ").decode(errors="replace").strip()
        yield ProcInfo(pid, text), env


def _test_vars(pid: int) -> dict[str, str]:
    """``TAG_VAR`` and ``OWNER_VAR`` from a process's environment (OSError if unreadable)."""
    env = {}
    for item in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep and key in (TAG_VAR.encode(), OWNER_VAR.encode()):
            env[key.decode()] = value.decode(errors="replace")
    return env


def tagged_processes() -> list[ProcInfo]:
    """Every live process carrying a tag that this test process made (see
    :data:`TAGS_MADE`), but this one and its ancestors."""
    spared = _ancestors()
    return [info for info, env in _scan()
            if env.get(TAG_VAR) in TAGS_MADE and info.pid not in spared]


def _environ_tag(pid: int) -> str | None:
    try:
        return _test_vars(pid).get(TAG_VAR)
    except OSError:
        return None


def port_pattern(port: int) -> re.Pattern[str]:
    """Matches a command line that names ``port`` (``host:PORT`` or ``--port PORT``)."""
    return re.compile(rf"(?::|--port[ =]){port}(?!\d)")


def path_pattern(path: Path | str) -> re.Pattern[str]:
    """Matches a command line that names ``path`` or something under it."""
    return re.compile(re.escape(str(path)) + r"(?![\w.-])")


def find_processes(
    *,
    tag: str | None = None,
    owner: str | None = None,
    patterns: Iterable[str | re.Pattern[str]] = (),
) -> list[ProcInfo]:
    """Processes (not this one or its ancestors) carrying ``tag`` or ``owner`` in their
    environment, or whose command line contains one of ``patterns`` (a plain string is
    matched literally)."""
    regexes = [p if isinstance(p, re.Pattern) else re.compile(re.escape(p)) for p in patterns]
    spared = _ancestors()
    found = []
    for info, env in _scan():
        if info.pid in spared:
            continue
        if (
            (tag is not None and env.get(TAG_VAR) == tag)
            or (owner is not None and env.get(OWNER_VAR) == owner)
            or any(r.search(info.cmdline) for r in regexes)
        ):
            found.append(info)
    return found


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def kill_pids(pids: Iterable[int], grace: float = 5.0) -> None:
    """SIGTERM, wait up to ``grace`` seconds, then SIGKILL whatever is left."""
    pids = [pid for pid in pids if _alive(pid)]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        deadline = time.monotonic() + (grace if sig == signal.SIGTERM else 5.0)
        while pids and time.monotonic() < deadline:
            pids = [pid for pid in pids if _alive(pid)]
            if pids:
                time.sleep(0.05)
        if not pids:
            return


def wait_gone(
    *,
    tag: str | None = None,
    owner: str | None = None,
    patterns: Iterable[str | re.Pattern[str]] = (),
    timeout: float = 10.0,
) -> bool:
    """Wait until :func:`find_processes` finds nothing; False if it still does."""
    patterns = list(patterns)
    deadline = time.monotonic() + timeout
    while find_processes(tag=tag, owner=owner, patterns=patterns):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def wait_reaped(pids: Iterable[int], timeout: float = 3.0) -> None:
    """Wait (at most ``timeout``) until ``pids`` are gone from /proc, zombies included."""
    pending = [pid for pid in pids if pid != os.getpid()]
    deadline = time.monotonic() + timeout
    while pending and time.monotonic() < deadline:
        pending = [pid for pid in pending if Path(f"/proc/{pid}").exists()]
        if pending:
            time.sleep(0.1)


def reap(
    *,
    tag: str | None = None,
    owner: str | None = None,
    patterns: Iterable[str | re.Pattern[str]] = (),
    grace: float = 5.0,
) -> list[ProcInfo]:
    """Kill every process :func:`find_processes` finds; return what was found.

    Loops until nothing is found (a dying parent may start nothing new, but a process
    found late, e.g. a Ray worker, is caught by the next pass).
    """
    killed: list[ProcInfo] = []
    for _ in range(5):
        found = find_processes(tag=tag, owner=owner, patterns=patterns)
        if not found:
            break
        killed += found
        kill_pids([p.pid for p in found], grace=grace)
    return killed


# ------------------------------------------------------------------- processes


@dataclass
class FlowerProcess:
    """One process started by :func:`flower_process`."""

    name: str
    argv: list[str]
    popen: subprocess.Popen
    log_path: Path
    owner: str
    ports: list[int] = field(default_factory=list)
    leftovers: list[ProcInfo] = field(default_factory=list)
    ready_match: re.Match[str] | None = None
    ready_conditions: list[object] = field(default_factory=list)
    settle: float = 0.0
    startup_timeout: float = 60.0
    started: float = field(default_factory=time.monotonic)

    def wait_ready(self) -> None:
        """Block until every readiness condition holds (ports open, log line seen), then
        ``settle`` seconds; raise with the log tail if the process exits or times out."""
        deadline = self.started + self.startup_timeout
        pending = list(self.ready_conditions)
        while pending:
            if not self.running():
                raise FlowerProcessError(
                    f"{self.name} exited with {self.popen.returncode} before it was ready\n"
                    + _log_tails([self])
                )
            if time.monotonic() > deadline:
                raise FlowerProcessError(
                    f"{self.name} was not ready within {self.startup_timeout:g} s (waiting for "
                    f"{', '.join(_describe(p) for p in pending)})\n" + _log_tails([self])
                )
            pending = [p for p in pending if not _is_ready(p, self)]
            if pending:
                time.sleep(0.1)
        if self.settle:
            time.sleep(self.settle)
        if not self.running():
            raise FlowerProcessError(
                f"{self.name} exited with {self.popen.returncode} right after start\n"
                + _log_tails([self])
            )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def running(self) -> bool:
        return self.popen.poll() is None

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def tail(self, lines: int = LOG_TAIL_LINES) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])


def _log_tails(processes: Iterable[FlowerProcess], lines: int = LOG_TAIL_LINES) -> str:
    parts = []
    for proc in processes:
        state = "running" if proc.running() else f"exited with {proc.popen.returncode}"
        parts.append(
            f"----- {proc.name} ({state}; log {proc.log_path}; last {lines} lines) -----\n"
            f"{proc.tail(lines)}"
        )
    return "\n".join(parts)


def _group_members(pgid: int) -> list[int]:
    members = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):  # field 5: pgrp
                members.append(int(entry))
    return members


def stop_process_group(popen: subprocess.Popen, grace: float = 10.0) -> None:
    """SIGTERM the process group led by ``popen``, wait, SIGKILL if needed; reap it."""
    pgid = popen.pid  # started with start_new_session=True: its own group
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            with contextlib.suppress(subprocess.TimeoutExpired):
                popen.wait(timeout=0.1)
            if popen.poll() is not None and not _group_members(pgid):
                return
    with contextlib.suppress(subprocess.TimeoutExpired):
        popen.wait(timeout=5)


def _wait_port(port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout):
            return True
    except OSError:
        return False


def _is_ready(condition: object, proc: FlowerProcess) -> bool:
    if isinstance(condition, int):
        return _wait_port(condition)
    match = condition.search(proc.log_text())  # type: ignore[union-attr]
    if match:
        proc.ready_match = match
    return match is not None


def _describe(condition: object) -> str:
    return f"port {condition}" if isinstance(condition, int) else f"log line /{condition.pattern}/"  # type: ignore[union-attr]


def wait_for_log(proc: FlowerProcess, pattern: str | re.Pattern[str], timeout: float = 30.0) -> re.Match[str]:
    """Wait until ``proc``'s log matches ``pattern``; raise with the log tail if not."""
    regex = re.compile(pattern) if isinstance(pattern, str) else pattern
    deadline = time.monotonic() + timeout
    while True:
        match = regex.search(proc.log_text())
        if match:
            return match
        if not proc.running() or time.monotonic() > deadline:
            state = "exited" if not proc.running() else f"no match within {timeout:g} s"
            raise FlowerProcessError(
                f"{proc.name}: log never matched /{regex.pattern}/ ({state})\n" + _log_tails([proc])
            )
        time.sleep(0.1)


@contextlib.contextmanager
def flower_process(
    name: str,
    argv: list[str],
    *,
    log_dir: Path,
    env: Mapping[str, str],
    ready_ports: Iterable[int] = (),
    ready_log: re.Pattern[str] | None = None,
    ports: Iterable[int] = (),
    settle: float = 0.0,
    startup_timeout: float = 60.0,
    cwd: Path | None = None,
    wait: bool = True,
) -> Iterator[FlowerProcess]:
    """Start ``argv`` in its own session, wait until it is ready, yield it, and ALWAYS
    stop it, its process group and its descendants on exit (also when the test fails).

    stdout and stderr go to ``log_dir/<name>.log``. Ready means: every port in
    ``ready_ports`` accepts a TCP connection and the log matches ``ready_log`` (the match
    is kept in ``.ready_match``), then ``settle`` more seconds. With ``wait=False`` the
    process is yielded at once and the caller calls ``.wait_ready()`` (to start several
    in parallel). ``ports`` (default: ``ready_ports``) are the ports the process owns:
    any process left whose command line names one of them is killed on exit.
    """
    ready_ports = list(ready_ports)
    ports = list(ports) or ready_ports
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}.log"
    owner = f"{env.get(TAG_VAR, 'untagged')}/{name}"
    full_env = {**env, OWNER_VAR: owner}
    executable = shutil.which(argv[0], path=full_env.get("PATH")) or argv[0]
    with open(log_path, "ab") as log:
        log.write(f"$ {' '.join(argv)}\n".encode())
        log.flush()
        popen = subprocess.Popen(
            [executable, *argv[1:]],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=full_env,
            cwd=cwd,
            start_new_session=True,
        )
    proc = FlowerProcess(name, list(argv), popen, log_path, owner, ports)
    proc.ready_conditions = list(ready_ports) + ([ready_log] if ready_log else [])
    proc.settle, proc.startup_timeout = settle, startup_timeout
    _LIVE[popen.pid] = proc
    try:
        if wait:
            proc.wait_ready()
        yield proc
    finally:
        _LIVE.pop(popen.pid, None)
        family = {p.pid for p in find_processes(owner=owner)}
        stop_process_group(popen)
        # Flower's children watch their parent's pid and exit once it is gone, some only
        # after a few seconds (a ServerApp waiting for sites takes ~5 s): give them that
        # time, then kill what is left and keep it as ``leftovers``.
        patterns = [port_pattern(p) for p in ports]
        wait_gone(owner=owner, patterns=patterns, timeout=CHILD_EXIT_GRACE)
        proc.leftovers = reap(owner=owner, patterns=patterns)
        # Orphans are re-parented to init; let it collect the zombies (cosmetic: so that
        # `ps` right after a test shows nothing of it).
        wait_reaped(family | {p.pid for p in proc.leftovers})


@dataclass
class SuperLink:
    process: FlowerProcess
    control_port: int
    fleet_port: int | None
    ca: Path | None = None  # the CA of its TLS certificate (None: insecure)

    @property
    def control_address(self) -> str:
        return f"127.0.0.1:{self.control_port}"

    @property
    def fleet_address(self) -> str | None:
        return None if self.fleet_port is None else f"127.0.0.1:{self.fleet_port}"


@contextlib.contextmanager
def superlink(
    *, log_dir: Path, env: Mapping[str, str], simulation: bool, name: str = "superlink",
    tls: Path | None = None,
) -> Iterator[SuperLink]:
    """A ``flower-superlink`` on loopback, free ports only; with ``tls`` (a directory made
    by ``deploy/make-credentials.sh``) over TLS with its ``server.pem``, else insecure.

    Simulation: the Control and Runtime HTTP APIs on one port, Ray behind it.
    Deployment: the same, plus the Fleet API: under Flower 1.39 gRPC (grpc-rere) on a
    second port, from 1.40 HTTP on the same port (:data:`HTTP_FLEET`).
    Runtime dependency installation is off: runs use this test's environment.
    """
    if simulation:
        control_port, fleet_port = free_port(), None
    elif HTTP_FLEET:
        control_port = fleet_port = free_port()
    else:
        control_port, fleet_port = free_ports(2)
    security = (["--insecure"] if tls is None else
                ["--ssl-ca-certfile", str(tls / "ca.crt"), "--ssl-certfile", str(tls / "server.pem"),
                 "--ssl-keyfile", str(tls / "server.key")])
    argv = [
        "flower-superlink",
        *security,
        "--disable-runtime-dependency-installation",
        "--host",
        "127.0.0.1",
        "--port",
        str(control_port),
    ]
    if simulation:
        argv.append("--simulation")
    elif not HTTP_FLEET:
        argv += ["--fleet-api-type", "grpc-rere", "--fleet-api-address", f"127.0.0.1:{fleet_port}"]
    ready = [control_port] + ([fleet_port] if fleet_port not in (None, control_port) else [])
    # Ready once its SuperExec (which will start the ServerApp) is up, too.
    with flower_process(
        name, argv, log_dir=log_dir, env=env, ready_ports=ready, ready_log=SUPEREXEC_STARTED
    ) as proc:
        yield SuperLink(proc, control_port, fleet_port, None if tls is None else tls / "ca.crt")


def format_node_config(config: Mapping[str, object]) -> str:
    return " ".join(f"{key}={toml_value(value)}" for key, value in config.items())


@contextlib.contextmanager
def supernode(
    name: str,
    *,
    fleet_address: str,
    node_config: Mapping[str, object],
    log_dir: Path,
    env: Mapping[str, str],
    wait: bool = True,
    extra_args: Iterable[str] = (),
    root_certificates: Path | None = None,
) -> Iterator[FlowerProcess]:
    """A ``flower-supernode`` connected to ``fleet_address`` (gRPC grpc-rere under Flower
    1.39, HTTP from 1.40; over TLS
    trusting ``root_certificates`` when given, else insecure) with its own ClientAppIo port; ready when that port is open and the node logged its
    SuperNode ID (``.ready_match.group(1)``), i.e. the SuperLink has activated it.
    ``extra_args`` are appended to its command line (e.g. ``--trusted-entities FILE``)."""
    port = free_port()
    argv = [
        "flower-supernode",
        *(["--insecure"] if root_certificates is None
          else ["--root-certificates", str(root_certificates)]),
        *([] if HTTP_FLEET else ["--grpc-rere"]),
        "--superlink",
        fleet_address,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--node-config",
        format_node_config(node_config),
        *extra_args,
    ]
    with flower_process(
        name, argv, log_dir=log_dir, env=env, ready_ports=[port], ready_log=SUPERNODE_ID,
        wait=wait,
    ) as proc:
        yield proc


# ---------------------------------------------------------------------- sandbox


@dataclass
class FlowerSandbox:
    """The Flower processes of one test, sharing one tag, environment and log dir."""

    workdir: Path
    tag: str
    env: dict[str, str]
    log_dir: Path
    home: Path
    stack: contextlib.ExitStack
    processes: list[FlowerProcess] = field(default_factory=list)
    leftovers: list[ProcInfo] = field(default_factory=list)
    patterns: list[str | re.Pattern[str]] = field(default_factory=list)

    def superlink(self, *, simulation: bool, tls: Path | None = None) -> SuperLink:
        link = self.stack.enter_context(superlink(log_dir=self.log_dir, env=self.env,
                                                  simulation=simulation, tls=tls))
        self.processes.append(link.process)
        self.patterns += [port_pattern(p) for p in link.process.ports]
        return link

    def supernodes(
        self, link: SuperLink, node_configs: Mapping[str, Mapping[str, object]]
    ) -> list[FlowerProcess]:
        """One SuperNode of ``link`` per ``name -> node config``, started in parallel;
        returns once ``link`` has activated all of them, so a run submitted afterwards
        sees every one from its first round."""
        assert link.fleet_address is not None, "a simulation SuperLink has no Fleet API"
        procs = []
        for name, node_config in node_configs.items():
            proc = self.stack.enter_context(
                supernode(
                    name,
                    fleet_address=link.fleet_address,
                    node_config=node_config,
                    log_dir=self.log_dir,
                    env=self.env,
                    wait=False,
                    root_certificates=link.ca,
                )
            )
            self.processes.append(proc)
            self.patterns += [port_pattern(p) for p in proc.ports]
            procs.append(proc)
        for proc in procs:
            proc.wait_ready()
            node_id = proc.ready_match.group(1)  # type: ignore[union-attr]
            wait_for_log(link.process, rf"Activated node_id={node_id}\b")
        return procs

    def connect(self, name: str, address: str, root_certificates: Path | None = None) -> None:
        """Add a SuperLink connection to this sandbox's ``FLWR_HOME`` (over TLS trusting
        ``root_certificates`` when given)."""
        flwr_home(self.home.parent, name, address, home=self.home,
                  root_certificates=root_certificates)

    def run(
        self,
        app_dir: Path,
        connection: str,
        run_config: Mapping[str, object],
        federation_config: Mapping[str, object] | None = None,
        *,
        timeout: float = 300.0,
        log_name: str = "flwr-run",
    ) -> FlwrRun:
        """:func:`run_flwr` with this sandbox's environment; output in ``log_dir/<log_name>.log``."""
        return run_flwr(
            app_dir, connection, run_config, federation_config,
            env=self.env, timeout=timeout, processes=self.processes,
            log_path=self.log_dir / f"{log_name}.log",
        )


#: Run-config keys that leave a run without Table 1's profile rounds (one or two real
#: rounds, ~4 s each here, and a fresh ClientApp process per site for each). The
#: deployment tests that check something else add them; Table 1 itself crosses real gRPC
#: in test_deployment's hospital-table run (against the in-process harness),
#: test_site_policy and test_secure_aggregation.
NO_TABLE1 = {"profile": False}


# One FLWR_HOME for every sandbox of a test session (set by conftest's numba_cache
# fixture, per xdist worker; a worker runs one test at a time, so its connections never
# race). A ClientApp imports the app from FLWR_HOME/apps/<name>.<version>.<FAB hash>:
# with one home the app is installed (and its bytecode written) once per worker. The
# kernels' Numba cache is named by their source, so it is shared with the installed
# fedcluster and the other worker whatever the home.
SESSION_HOME: Path | None = None

@contextlib.contextmanager
def sandbox(
    workdir: Path, *, home: Path | None = None, **extra_env: str | os.PathLike
) -> Iterator[FlowerSandbox]:
    """Everything one test needs to run Flower processes, and its cleanup.

    ``FLWR_HOME`` is ``home`` (default :data:`SESSION_HOME`, else ``workdir/flwr-home``;
    never ``~/.flwr``): the ``flwr`` CLI's connections, and where the SuperLink and
    SuperNodes install the app (FAB) that their ServerApp and ClientApps then import.
    ``RAY_TMPDIR`` is a fresh short dir, logs go to ``workdir/logs``, the SuperExecs poll
    for tasks every 0.5 s instead of 1 s (``FLWR_SUPEREXEC_TASK_POLL_INTERVAL``; speed
    only: an idle 3-site federation here uses 7% of a core at 1 s, 10.5% at 0.5 s and
    19.6% at 0.2 s, CPU the ClientApps of the other xdist worker then lack), the
    SuperNodes pull every 0.25 s while idle instead of Flower's hard-coded 3 s
    (``flower_speedups/sitecustomize.py``: a deployed round no longer waits ~3 s for
    nothing; ``FEDCLUSTER_TEST_SUPERNODE_IDLE=""`` in ``extra_env`` keeps Flower's), and
    ``extra_env`` is added (``FEDCLUSTER_TEST_SUPERNODE_HEARTBEAT="10"``, in the same file,
    is for a test that kills a site: see there).

    On exit, even after a failure: every process started through the sandbox is stopped
    (last started first), then the safety net kills any process left that carries the
    test's tag, or whose command line names the test's ports, ``workdir`` or Ray dir.
    What the net had to kill is in ``leftovers`` (and reported as a warning).
    """
    workdir = Path(workdir)
    tag = new_tag()
    ray_tmp = short_tmp_dir("fcray-")
    home = Path(home) if home is not None else (SESSION_HOME or workdir / "flwr-home")
    home.mkdir(parents=True, exist_ok=True)
    env = child_env(
        tag,
        FLWR_HOME=home,
        RAY_TMPDIR=ray_tmp,
        FLWR_SUPEREXEC_TASK_POLL_INTERVAL="0.5",
        # The SuperNodes pull every 0.25 s while idle instead of Flower's hard-coded 3 s
        # (flower_speedups/sitecustomize.py; "" keeps Flower's, as the benchmarks do).
        FEDCLUSTER_TEST_SUPERNODE_IDLE="0.25",
        PYTHONPATH=os.pathsep.join(filter(None, [str(SPEEDUPS_DIR),
                                                 os.environ.get("PYTHONPATH", "")])),
        **extra_env,
    )
    bed = FlowerSandbox(workdir, tag, env, workdir / "logs", home, contextlib.ExitStack())
    bed.patterns += [path_pattern(workdir), path_pattern(ray_tmp)]
    try:
        with bed.stack:
            try:
                yield bed
            finally:
                # Clients first: a SuperLink shuts down only once `flwr run --stream`
                # has closed its log stream (uvicorn waits for open connections).
                for popen in list(_CLIENTS.values()):
                    if popen.poll() is None and _environ_tag(popen.pid) == tag:
                        stop_process_group(popen, grace=2.0)
                # Then every SuperNode at once: each takes ~2 s to go with its SuperExec
                # child, which one after another cost a test of five sites 10 s. The
                # stack below then finds them going, and stops the SuperLink last.
                # (A SuperNode: a process ready once it logs its ID, however started.)
                for proc in bed.processes:
                    if SUPERNODE_ID in proc.ready_conditions and proc.popen.poll() is None:
                        with contextlib.suppress(ProcessLookupError, PermissionError):
                            os.killpg(proc.popen.pid, signal.SIGTERM)
    finally:
        bed.leftovers = [p for proc in bed.processes for p in proc.leftovers]
        bed.leftovers += reap(tag=tag, patterns=bed.patterns)
        shutil.rmtree(ray_tmp, ignore_errors=True)
        if bed.leftovers:
            warnings.warn(
                "processes left after their parents were stopped (killed by the safety net):\n"
                + "\n".join(f"  {p.pid} {p.cmdline[:200]}" for p in bed.leftovers),
                stacklevel=3,
            )


# --------------------------------------------------------------------- flwr CLI


def flwr_home(tmp_path: Path, name: str, address: str, *, home: Path | None = None,
              root_certificates: Path | None = None) -> Path:
    """Write (or extend) ``tmp_path/flwr-home/config.toml`` (or ``home/config.toml``) with
    a SuperLink connection ``name`` -> ``address`` (insecure, or over TLS trusting
    ``root_certificates``); the first connection written is the default. Return the
    directory, to be used as ``FLWR_HOME``."""
    home = Path(home) if home is not None else Path(tmp_path) / "flwr-home"
    home.mkdir(parents=True, exist_ok=True)
    path = home / "config.toml"
    connections: dict[str, dict] = {}
    default = name
    if path.exists():
        data = tomllib.loads(path.read_text())
        section = dict(data.get("superlink", {}))
        default = str(section.pop("default", name))
        connections = {key: dict(value) for key, value in section.items()}
    connections[name] = {"address": address}
    connections[name].update({"insecure": True} if root_certificates is None
                             else {"root-certificates": str(root_certificates)})
    lines = ["[superlink]", f"default = {json.dumps(default)}", ""]
    for key, value in connections.items():
        lines += [f"[superlink.{key}]",
                  *(f"{field} = {json.dumps(entry)}" for field, entry in value.items()), ""]
    path.write_text("\n".join(lines))
    return home


def toml_value(value: object) -> str:
    """One value as Flower's ``--run-config`` / ``--node-config`` parser wants it (TOML)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)  # '0.5', '1e-12', 'inf', 'nan' are all TOML floats
    if isinstance(value, (str, os.PathLike)):
        text = os.fspath(value)
        # Flower splits the string with a regex: a quoted value cannot contain its quote.
        if not re.search(r'["\\\x00-\x1f\x7f]', text):
            return f'"{text}"'
        if not re.search(r"['\x00-\x1f\x7f]", text):
            return f"'{text}'"  # TOML literal string: no escapes
        raise ValueError(f"cannot pass {text!r} on Flower's command line")
    raise TypeError(f"{type(value).__name__} is not a run-config value (bool, int, float, str)")


def format_run_config(config: Mapping[str, object]) -> str:
    """``{"n-clusters": 5, "run-name": "t1"}`` -> ``n-clusters=5 run-name="t1"``."""
    for key in config:
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", key):
            raise ValueError(f"run-config key {key!r} cannot be passed on the command line")
    return " ".join(f"{key}={toml_value(value)}" for key, value in config.items())


@dataclass
class FlwrRun:
    """A finished ``flwr run``: its output, run id, final status and duration."""

    output: str
    run_id: int
    status: str
    details: str
    seconds: float


def _tail(text: str, lines: int = LOG_TAIL_LINES) -> str:
    return "\n".join(text.splitlines()[-lines:])


def _flwr(
    args: list[str],
    env: Mapping[str, str],
    cwd: Path,
    timeout: float,
    log_path: Path | None = None,
    prefix: Iterable[str] = (),
) -> tuple[int | None, str]:
    """Run the ``flwr`` CLI in its own session, its output going to ``log_path`` (a
    temporary file if None) as it comes; on timeout kill its group. (rc or None, output).
    ``prefix`` goes before the command (``ip netns exec NS``: the CLI on another host)."""
    executable = shutil.which("flwr", path=env.get("PATH")) or "flwr"
    with contextlib.ExitStack() as stack:
        if log_path is None:
            out = stack.enter_context(tempfile.TemporaryFile())
        else:
            Path(log_path).parent.mkdir(parents=True, exist_ok=True)
            out = stack.enter_context(open(log_path, "w+b"))
        popen = subprocess.Popen(
            [*prefix, executable, *args],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=dict(env),
            cwd=cwd,
            start_new_session=True,
        )
        _CLIENTS[popen.pid] = popen
        try:
            rc: int | None = popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            rc = None
        finally:
            if popen.poll() is None:
                stop_process_group(popen, grace=2.0)
            _CLIENTS.pop(popen.pid, None)
        out.seek(0)
        return rc, out.read().decode(errors="replace")


# Flower's CLI functions read FLWR_HOME from the process environment; run_status sets it
# for their call only, one call at a time (a test may follow a run from a thread).
_FLWR_HOME_LOCK = threading.Lock()


def run_status(connection: str, run_id: int, *, env: Mapping[str, str]) -> tuple[str, str]:
    """(status, details) of a run, e.g. ``("finished:completed", "N/A")``: what
    ``flwr ls CONNECTION --run-id N --format json`` prints, read with the same Flower
    calls (``flwr.cli.ls``: the connection from ``FLWR_HOME``'s config, the Control
    API's ``ListRuns``) in this process, which saves a ``flwr`` process (~1 s of CPU,
    mostly Flower's imports) after every run."""
    from flwr.cli.flower_config import read_superlink_connection
    from flwr.cli.utils import init_http_client_from_connection
    from flwr.common.serde import run_from_proto
    from flwr.proto.control_pb2 import ListRunsRequest  # pylint: disable=E0611

    try:
        with _FLWR_HOME_LOCK:
            saved = os.environ.get("FLWR_HOME")
            os.environ["FLWR_HOME"] = str(env["FLWR_HOME"])
            try:
                client = init_http_client_from_connection(read_superlink_connection(connection))
                try:
                    reply = client.ListRuns(ListRunsRequest(run_id=run_id))
                finally:
                    client.close()
            finally:
                if saved is None:
                    os.environ.pop("FLWR_HOME", None)
                else:
                    os.environ["FLWR_HOME"] = saved
        status = run_from_proto(reply.run_dict[run_id]).status
    except Exception as err:  # noqa: BLE001 (whatever Flower raised, said with the run)
        raise FlowerProcessError(
            f"ListRuns of run {run_id} on connection {connection!r} gave no status: {err!r}"
        ) from None
    text = f"{status.status}:{status.sub_status}" if status.sub_status else status.status
    return text, status.details or "N/A"


def run_flwr(
    app_dir: Path,
    connection: str,
    run_config: Mapping[str, object],
    federation_config: Mapping[str, object] | None = None,
    *,
    env: Mapping[str, str],
    timeout: float = 300.0,
    processes: Iterable[FlowerProcess] = (),
    log_path: Path | None = None,
    app_spec: str | None = None,
) -> FlwrRun:
    """``flwr run APP_DIR CONNECTION --stream --run-config ...``, waiting for the run.

    With ``app_spec`` (``@account/app==x.y.z``) the run is of that app, which the
    SuperLink fetches from its app registry (Flower Hub, or ``FLWR_SUPERGRID_API_URL``),
    instead of APP_DIR, which is then only the working directory of ``flwr``.

    Its output (the ServerApp's streamed log) is also written to ``log_path`` as it
    comes, if given, so a test can follow a run in progress.

    ``--stream`` returns when the run ends but exits 0 also when the ServerApp failed,
    so the run's final status is then read as ``flwr ls`` reads it (:func:`run_status`). Raise
    :class:`FlowerProcessError` (with the tail of the output and of every process log:
    ``processes`` and all processes still running from :func:`flower_process`) if the
    CLI fails, times out after ``timeout`` seconds, or the run does not end
    ``finished:completed``.
    """
    app_dir = Path(app_dir)
    args = ["run", app_spec or str(app_dir), connection, "--stream"]
    if run_config:
        args += ["--run-config", format_run_config(run_config)]
    if federation_config:
        args += ["--federation-config", format_run_config(federation_config)]
    started = time.monotonic()
    rc, output = _flwr(args, env, app_dir, timeout, log_path)
    seconds = time.monotonic() - started

    def fail(problem: str) -> FlowerProcessError:
        shown = {p.pid: p for p in [*processes, *_LIVE.values()]}
        return FlowerProcessError(
            f"{problem}\n$ flwr {' '.join(args)}\n"
            f"----- flwr run output (last {LOG_TAIL_LINES} lines) -----\n{_tail(output)}\n"
            + _log_tails(shown.values())
        )

    if rc is None:
        raise fail(f"`flwr run` did not finish within {timeout:g} s")
    if rc != 0:
        raise fail(f"`flwr run` exited with {rc}")
    match = re.search(r"Successfully started run (\d+)", output)
    if not match:
        raise fail("`flwr run` did not start a run")
    run_id = int(match.group(1))
    status, details = "", ""
    # The stream ends when the run does; the status may lag by a moment.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            status, details = run_status(connection, run_id, env=env)
        except FlowerProcessError as err:
            raise fail(f"the status of run {run_id} is unknown: {err}") from None
        if status.startswith("finished"):
            break
        time.sleep(0.5)
    if status != "finished:completed":
        raise fail(f"run {run_id} ended with status {status!r}: {details}")
    return FlwrRun(output, run_id, status, details, seconds)

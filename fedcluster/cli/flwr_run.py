"""``fedcluster run``: submit the app to a SuperLink, stream the run's log, and exit with
the run's end (issue 70).

``flwr run --stream`` exits 0 whatever became of the run (failed, a site lost, stopped),
and Ctrl-C only detaches its log stream while the run goes on. This command is the same
submission (``flwr run APP [CONNECTION] --format json``, then ``flwr log RUN_ID
[CONNECTION]`` streamed here), followed by the run's status at the SuperLink (``flwr ls
--run-id``):

=====  =====================================================================
exit   the run
=====  =====================================================================
0      finished:completed
1      finished:failed (the reason, from the run's log, on stderr)
2      could not be submitted (Flower's message on stderr)
3      finished:stopped by someone else (``flwr stop``)
130    stopped here: Ctrl-C (SIGINT) or SIGTERM sends ``flwr stop RUN_ID``, waits
       until the SuperLink has it stopped, and says so
=====  =====================================================================

The ``flwr`` CLI of the installed Flower does the talking (its connections in
``~/.flwr/config.toml``, TLS and logins as ``flwr`` has them), so this works alike on
Flower 1.39 and 1.42 and on the local simulation connection.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import deque

EXAMPLES = """\
examples:
  fedcluster run . --run-config "n-clusters=10" --federation-config "num-supernodes=10"
  fedcluster run . mylink --run-config "n-clusters=4 min-sites=3 scale=\\"standard\\""

exit status: 0 completed, 1 failed, 2 not submitted, 3 stopped elsewhere, 130 stopped
here (Ctrl-C stops the run on the SuperLink). Page: docs/reference/cli.md#fedcluster-run"""

FINISHED = "finished:"
REASON = re.compile(r"\b([A-Za-z]*(?:Error|Exception)): (.+)")
POLL_SECONDS = 1.0
STATUS_WAIT_SECONDS = 120.0


class RunCommandError(RuntimeError):
    """What ``fedcluster run`` could not do (submit, ask the SuperLink)."""


def add_parser(sub) -> None:
    run = sub.add_parser(
        "run", help="submit the app to a SuperLink, stream its log, exit with the run's end",
        description=__doc__.split("\n\n")[0], epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    run.add_argument("app", nargs="?", default=".", help="the app's folder (default: .)")
    run.add_argument("connection", nargs="?", default=None,
                     help="the SuperLink connection in ~/.flwr/config.toml (default: flwr's)")
    run.add_argument("--run-config", default=None, metavar='"KEY=VALUE ..."',
                     help="run-config keys, as `flwr run --run-config` takes them")
    run.add_argument("--federation-config", default=None, metavar='"KEY=VALUE ..."',
                     help="a simulation connection's settings, e.g. num-supernodes=10")
    run.set_defaults(func=cmd_run)


def _flwr_executable() -> str:
    """The ``flwr`` of this install (beside this interpreter), else the first on PATH."""
    here = os.path.dirname(sys.executable)
    return shutil.which("flwr", path=here + os.pathsep + os.environ.get("PATH", "")) or "flwr"


def _flwr(*args: str, timeout: float = 120.0) -> subprocess.CompletedProcess:
    executable = _flwr_executable()
    return subprocess.run([executable, *args], capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL, start_new_session=True)


def _json_of(output: str) -> dict:
    start = output.find("{")
    if start < 0:
        raise ValueError("no JSON")
    return json.loads(output[start:])


def submit(args: argparse.Namespace) -> int:
    """Submit the app; the run's id (RunCommandError with Flower's words if not)."""
    command = ["run", args.app, *([args.connection] if args.connection else []), "--format", "json"]
    if args.run_config:
        command += ["--run-config", args.run_config]
    if args.federation_config:
        command += ["--federation-config", args.federation_config]
    done = _flwr(*command, timeout=600.0)
    try:
        reply = _json_of(done.stdout)
        if done.returncode == 0 and reply.get("success") and reply.get("run-id"):
            return int(reply["run-id"])
    except ValueError:
        reply = {}
    said = (reply.get("error-message") or (done.stdout + done.stderr).strip())
    raise RunCommandError(f"flwr run did not start the run: {said}")


def status(run_id: int, connection: str | None) -> str:
    """The run's status at the SuperLink (``finished:completed``, ``running``, ...)."""
    done = _flwr("ls", *([connection] if connection else []), "--run-id", str(run_id),
                 "--format", "json")
    try:
        runs = _json_of(done.stdout).get("runs", [])
    except ValueError:
        runs = []
    if done.returncode != 0 or not runs:
        raise RunCommandError(f"flwr ls could not tell run {run_id}'s status: "
                              f"{(done.stdout + done.stderr).strip()[-500:]}")
    return str(runs[0]["status"])


def _stream(run_id: int, connection: str | None, tail: deque) -> subprocess.Popen:
    """``flwr log RUN_ID --stream`` in its own session (a Ctrl-C is this command's to
    handle), its lines copied to stdout and the last ones kept in ``tail``."""
    executable = _flwr_executable()
    popen = subprocess.Popen([executable, "log", str(run_id), *([connection] if connection else []),
                              "--stream"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, text=True, start_new_session=True)

    def copy() -> None:
        for line in popen.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            tail.append(line.rstrip("\n"))

    threading.Thread(target=copy, name="fedcluster-run-log", daemon=True).start()
    return popen


def _end_stream(popen: subprocess.Popen) -> None:
    try:
        popen.wait(timeout=10)  # the rest of the log, after the run's end
    except subprocess.TimeoutExpired:
        popen.terminate()
        popen.wait(timeout=10)


def _wait_finished(run_id: int, connection: str | None, limit: float) -> str:
    deadline = time.monotonic() + limit
    while True:
        now = status(run_id, connection)
        if now.startswith(FINISHED) or time.monotonic() > deadline:
            return now
        time.sleep(POLL_SECONDS)


def reason(tail) -> str:
    """Why a failed run failed, from the end of its log: its last error."""
    for line in reversed(list(tail)):
        found = REASON.search(line)
        if found:
            return f"{found.group(1)}: {found.group(2).strip()}"
    return "see the run's log above"


def cmd_run(args: argparse.Namespace) -> int:
    try:
        run_id = submit(args)
    except (RunCommandError, subprocess.TimeoutExpired) as err:
        print(f"fedcluster: {err}", file=sys.stderr)
        return 2
    where = args.connection or "flwr's default connection"
    print(f"fedcluster: run {run_id} submitted to {where}; its log follows "
          "(Ctrl-C stops the run)", file=sys.stderr, flush=True)
    tail: deque = deque(maxlen=400)
    stream = _stream(run_id, args.connection, tail)
    # Ctrl-C and SIGTERM stop the run, whatever this process inherited: a shell without
    # job control (a script's `cmd &`, nohup, a CI runner) starts it with SIGINT ignored,
    # and Python then keeps it ignored.
    previous = {sig: signal.signal(sig, signal.default_int_handler)
                for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        try:
            while not (now := status(run_id, args.connection)).startswith(FINISHED):
                time.sleep(POLL_SECONDS)
        except KeyboardInterrupt:
            return _stop(run_id, args.connection, stream)
        _end_stream(stream)
    except RunCommandError as err:
        print(f"fedcluster: {err}", file=sys.stderr)
        return 2
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if stream.poll() is None:
            stream.terminate()
    if now == "finished:completed":
        print(f"fedcluster: run {run_id} completed", file=sys.stderr)
        return 0
    if now == "finished:stopped":
        print(f"fedcluster: run {run_id} was stopped (flwr stop)", file=sys.stderr)
        return 3
    print(f"fedcluster: run {run_id} failed ({now}): {reason(tail)}", file=sys.stderr)
    return 1


def _stop(run_id: int, connection: str | None, stream: subprocess.Popen) -> int:
    print(f"\nfedcluster: stopping run {run_id} on the SuperLink (flwr stop) ...",
          file=sys.stderr, flush=True)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # one stop, however many Ctrl-C
    try:
        done = _flwr("stop", str(run_id), *([connection] if connection else []))
        now = _wait_finished(run_id, connection, STATUS_WAIT_SECONDS)
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        _end_stream(stream)
    if now.startswith(FINISHED):
        print(f"fedcluster: run {run_id} stopped ({now})", file=sys.stderr)
    else:
        print(f"fedcluster: run {run_id} is {now} after flwr stop: "
              f"{(done.stdout + done.stderr).strip()[-500:]}", file=sys.stderr)
    return 130

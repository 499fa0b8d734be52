"""``fedcluster run`` against a real SuperLink and real SuperNodes (issue 70, must-show 2):
its exit status is the run's end, Ctrl-C stops the run on the SuperLink, a run that lost
a site fails under ``every-site`` (the default) and says so in its summary's first lines
without it, and a reused run name does not overwrite the earlier run's outputs.

One federation of three sites, site 2's file broken (a cell that is not a number), serves
every case, one run after another; each ``fedcluster run`` is the installed command in
a process of its own, with this sandbox's ``~/.flwr`` (FLWR_HOME)."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

import flower_processes as fp
from test_deployment import APP_DIR, write_site_csv

FEDCLUSTER = str(Path(sys.executable).parent / "fedcluster")
BASE = 'n-clusters=3 num-rounds=2 profile=false min-sites=2'


def _sites(tmp_path: Path) -> dict[str, dict]:
    rng = np.random.default_rng(5)
    nodes = {}
    for i in range(3):
        X = rng.normal(size=(40, 2)) + rng.integers(0, 3, 40)[:, None] * 5.0
        path = write_site_csv(tmp_path / f"site-{i}.csv", X)
        if i == 2:  # a cell that is not a number: the site fails its own start
            lines = path.read_text().splitlines()
            lines[7] = "abc," + lines[7].split(",", 1)[1]
            path.write_text("\n".join(lines) + "\n")
        nodes[f"supernode-{i}"] = {"data-path": str(path), "site-id": str(i),
                                   "cache-dir": str(tmp_path / f"cache-{i}")}
    return nodes


def _run(bed, run_config: str, *, interrupt_at: str | None = None) -> tuple[int, str, str]:
    """``fedcluster run`` to its end: exit code, stdout, stderr; with ``interrupt_at``,
    Ctrl-C once the run's log shows that line (and a second more)."""
    command = [FEDCLUSTER, "run", str(APP_DIR), "cmd", "--run-config", run_config]
    if interrupt_at is not None:
        # started with SIGINT ignored, as a shell without job control (a script's `cmd &`,
        # nohup, a CI runner) starts it: Ctrl-C must stop the run all the same
        command = ["sh", "-c", 'trap "" INT; exec "$@"', "sh", *command]
    out_path, err_path = bed.workdir / "run.stdout", bed.workdir / "run.stderr"
    with out_path.open("w") as out, err_path.open("w") as err:
        popen = subprocess.Popen(command, stdout=out, stderr=err, text=True, env=bed.env,
                                 cwd=bed.workdir)
        if interrupt_at is not None:
            deadline = time.monotonic() + 120
            while interrupt_at not in out_path.read_text() + err_path.read_text():
                assert popen.poll() is None and time.monotonic() < deadline, err_path.read_text()
                time.sleep(0.5)
            time.sleep(1)
            popen.send_signal(signal.SIGINT)  # as Ctrl-C in a terminal
        popen.wait(timeout=300)
    return popen.returncode, out_path.read_text(), err_path.read_text()


def _status(bed, run_id: str) -> str:
    rc, listed = fp._flwr(["ls", "cmd", "--run-id", run_id, "--format", "json"],
                          bed.env, bed.workdir, 60)
    assert rc == 0, listed
    return json.loads(listed[listed.index("{"):])["runs"][0]["status"]


def _run_id(err: str) -> str:
    return err.split("fedcluster: run ", 1)[1].split()[0]


def test_fedcluster_run_exits_with_the_run_s_end(bed, tmp_path):
    out = tmp_path / "outputs"
    link = bed.superlink(simulation=False)
    bed.supernodes(link, _sites(tmp_path))
    bed.connect("cmd", link.control_address)
    where = f'output-dir="{out}"'

    # every-site (the default): site 2 was rejected, so the run fails, its outputs written
    rc, stdout, err = _run(bed, f'{BASE} seed=1 {where} run-name="strict"')
    assert rc == 1, (stdout[-3000:], err)
    assert "failed (finished:failed)" in err and "every-site" in err and "site 2" in err, err
    assert _status(bed, _run_id(err)) == "finished:failed"
    assert (out / "strict" / "model.json").exists()

    # every-site=false: the run goes on with two sites, completes, and its summary starts
    # by saying whom it lost
    rc, stdout, err = _run(bed, f'{BASE} seed=1 every-site=false {where} run-name="kept"')
    assert rc == 0, (stdout[-3000:], err)
    assert f"fedcluster: run {_run_id(err)} completed" in err
    assert "WARNING: this run lost 1 of 3 site(s)" in stdout and "site 2: rejected:" in stdout
    summary = stdout[stdout.index("WARNING: this run lost"):]
    assert summary.index("site 2: rejected") < summary.index("federated score")
    model = out / "kept" / "model.json"
    digest = hashlib.sha256(model.read_bytes()).hexdigest()

    # the same run name again: written beside, the first run's model untouched
    rc, stdout, err = _run(bed, f'{BASE} every-site=false seed=2 {where} run-name="kept"')
    assert rc == 0, (stdout[-3000:], err)
    assert hashlib.sha256(model.read_bytes()).hexdigest() == digest
    assert (out / "kept-2" / "model.json").exists()
    assert "run name 'kept' is taken" in stdout

    # a bad run config: failed, the key named
    rc, stdout, err = _run(bed, f'n-clusters=0 num-rounds=2 min-sites=2 {where} run-name="bad"')
    assert rc == 1 and "'n-clusters'" in err, err

    # Ctrl-C: the run is stopped on the SuperLink, not only the log stream
    rc, stdout, err = _run(bed, f'n-clusters=3 num-rounds=100000 tol=0.0 min-sites=2 '
                                f'every-site=false profile=false {where} run-name="long"',
                           interrupt_at="round   3 [")  # (the progress line of round 3)
    assert rc == 130, (stdout[-3000:], err)
    assert "stopping run" in err and "stopped (finished:stopped)" in err, err
    assert _status(bed, _run_id(err)) == "finished:stopped"


def test_fedcluster_run_that_cannot_submit_says_why(tmp_path):
    """No SuperLink at the connection's address: exit 2, Flower's words on stderr."""
    home = fp.flwr_home(tmp_path, "nowhere", f"127.0.0.1:{fp.free_port()}")
    env = {**os.environ, "FLWR_HOME": str(home)}
    done = subprocess.run([FEDCLUSTER, "run", str(APP_DIR), "nowhere"], capture_output=True,
                          text=True, env=env, timeout=300)
    assert done.returncode == 2, done
    assert "flwr run did not start the run" in done.stderr, done.stderr

"""Faults on real processes (a SuperLink and SuperNodes on loopback, gRPC): a site killed
with SIGKILL in the middle of a run, and sites whose replies are corrupted (NaN, wrong
shape, inflated counts) by a test-only wrapper around the real ClientApp. In both the
run finishes, the output names what happened to which site, and the model equals (or is
within 2% of) the run without those sites. (A site with a broken data file:
tests/test_deployment.py; a restarted SuperLink: tests/test_secure_deployment.py.)"""

from __future__ import annotations

import os
import re
import shutil
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

import fedcluster
import flower_processes as fp
from fedcluster.common.datasets import load_builtin, partition
from test_deployment import py_kwargs, start_federation, write_site_csv

APP_DIR = Path(__file__).resolve().parents[1]

# The wrapper: the real ClientApp, then the reply spoiled as the node config's `corrupt`
# says, for every task but `describe` (so the site joins and then sends garbage).
CORRUPTING_CLIENT = '''
import dataclasses

import numpy as np
from flwr.clientapp import ClientApp

from fedcluster.client_app.app import SiteClient


class CorruptingClient(SiteClient):
    def __init__(self, context):
        # `corrupt` is this wrapper's key, not fedcluster's (which refuses unknown keys)
        node_config = {k: v for k, v in context.node_config.items() if k != "corrupt"}
        super().__init__(dataclasses.replace(context, node_config=node_config))
        self.mode = str(context.node_config.get("corrupt", ""))

    def fit(self, parameters, config):
        arrays, n_rows, metrics = super().fit(parameters, config)
        # (a describe carrying the run's first task, "then", sends that task's arrays)
        if (config.get("task") == "describe" and "then" not in config) or not arrays:
            return arrays, n_rows, metrics
        arrays = [np.array(a) for a in arrays]
        if self.mode == "nan":
            first = next(i for i, a in enumerate(arrays) if a.dtype.kind == "f")
            arrays[first] = arrays[first] * np.nan
        elif self.mode == "shape":
            arrays[0] = arrays[0][:-1]
        elif self.mode == "counts":
            counts = [i for i, a in enumerate(arrays) if a.dtype.kind == "i"]
            if counts:
                arrays[counts[0]] = arrays[counts[0]] * 1000 + 1
            else:  # a task without counts (Davies-Bouldin's pass): the site's size, then
                n_rows = n_rows * 1000 + 1
        return arrays, n_rows, metrics


app = ClientApp(client_fn=lambda context: CorruptingClient(context).to_client())
'''


def site_files(tmp_path: Path, n_sites: int, seed: int) -> tuple[list[np.ndarray], dict[str, Path]]:
    X, y = load_builtin("blobs", seed=seed)
    arrays = [X[rows] for rows in partition(y, n_sites, "iid", seed=seed)]
    return arrays, {str(i): write_site_csv(tmp_path / f"site-{i}.csv", Xi)
                    for i, Xi in enumerate(arrays)}


def test_site_killed_mid_run(bed, tmp_path):
    arrays, paths = site_files(tmp_path, 4, seed=6)
    # The SuperNodes register a 10 s heartbeat interval (Flower's minimum) instead of its
    # 30 s: the SuperLink calls the killed site gone after ~17 s instead of ~47 s. Only
    # here: a SuperNode reconnecting to a restarted SuperLink can take longer than 20 s
    # (test_secure_deployment), and under load a busy one might.
    bed.env["FEDCLUSTER_TEST_SUPERNODE_HEARTBEAT"] = "10"
    start_federation(bed, "faults", paths, )  # init random
    victim = next(p for p in bed.processes if p.name == "supernode-3")
    config = {"algorithm": "dwf", "n-clusters": 5, "num-rounds": 3, "tol": 0.0, "seed": 6,
              "min-sites": 3, "round-timeout": 120.0, "init": "random", "every-site": False,
              **fp.NO_TABLE1}
    out = tmp_path / "outputs"
    log = bed.log_dir / "flwr-run-kill.log"
    with ThreadPoolExecutor(1) as pool:
        run = pool.submit(bed.run, APP_DIR, "faults",
                          {**config, "output-dir": str(out), "run-name": "kill"},
                          timeout=600, log_name="flwr-run-kill")
        deadline = time.monotonic() + 300
        while not re.search(r"round +3 \[lloyd", log.read_text() if log.exists() else ""):
            assert time.monotonic() < deadline and not run.done(), "the run never reached round 3"
            time.sleep(0.2)
        os.killpg(victim.pid, signal.SIGKILL)  # the site, its SuperExec and its ClientApp
        run.result()
    model = fedcluster.Model.load(out / "kill" / "model.json")
    failures = model.metrics["site-failures"]
    assert list(failures) == ["3"], failures  # named by its site id
    assert any(h["sites-failed"] and "site 3:" in h["failures"] for h in model.history)
    assert sorted(model.metrics["per-site"]) == ["0", "1", "2"]  # evaluated without it
    without = fedcluster.simulate(arrays[:3],
                                  **py_kwargs(config))
    assert abs(model.metrics["score"] / without.metrics["score"] - 1) < 0.02


def test_corrupt_replies_are_dropped_with_reasons(bed, tmp_path):
    # The app as deployed, with the corrupting ClientApp as its client component. The
    # fedcluster package is not copied into it: the ServerApp and ClientApps import the
    # installed one (as a site whose image holds fedcluster does).
    app = tmp_path / "app"
    app.mkdir()
    shutil.copy(APP_DIR / "README.md", app)
    pyproject = (APP_DIR / "pyproject.toml").read_text()
    assert 'clientapp = "fedcluster.client_app:app"' in pyproject
    # (fab-include names the package folder, which this app does not have)
    pyproject = re.sub(r"(?m)^fab-include = .*\n", "", pyproject)
    (app / "pyproject.toml").write_text(pyproject.replace(
        'clientapp = "fedcluster.client_app:app"', 'clientapp = "corrupting_client:app"'))
    (app / "corrupting_client.py").write_text(CORRUPTING_CLIENT)

    arrays, paths = site_files(tmp_path, 2, seed=2)
    bad = {"7": "nan", "8": "shape", "9": "counts"}  # ordered after the good sites
    link = bed.superlink(simulation=False)
    nodes = {f"supernode-{key}": {"data-path": str(path), "site-id": key}
             for key, path in paths.items()}
    # The corrupting sites read site 0's file; each keeps its own cache (its differencing
    # guard's row sets, which site 0's replies would otherwise be checked against too).
    nodes.update({f"supernode-{key}": {"data-path": str(paths["0"]), "site-id": key,
                                       "corrupt": mode, "cache-dir": str(tmp_path / f"cache-{key}")}
                  for key, mode in bad.items()})
    bed.supernodes(link, nodes)
    bed.connect("faults", link.control_address)
    config = {"algorithm": "dwf", "n-clusters": 4, "num-rounds": 1, "min-sites": 2, "seed": 2,
              "every-site": False, **fp.NO_TABLE1}
    out = tmp_path / "outputs"
    bed.run(app, "faults", {**config, "output-dir": str(out), "run-name": "corrupt"},
            timeout=600, log_name="flwr-run-corrupt")
    model = fedcluster.Model.load(out / "corrupt" / "model.json")
    clean = fedcluster.simulate(arrays, **py_kwargs(config))
    np.testing.assert_allclose(model.centroids, clean.centroids, rtol=0, atol=1e-9)
    failures = model.metrics["site-failures"]
    assert sorted(failures) == ["7", "8", "9"]
    assert all("non-finite" in event for event in failures["7"]), failures
    assert all("shape" in event or "sent" in event for event in failures["8"]), failures
    # (a withheld cluster's count 0 spoiled to 1 is caught as under the floor)
    assert all("more than the site's" in event or "rows now but" in event
               or "fewer members than the privacy floor" in event
               for event in failures["9"]), failures
    assert sorted(model.metrics["per-site"]) == ["0", "1"]

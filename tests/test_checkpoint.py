"""Checkpoints: a run stopped after round 3 (the server process dies) and resumed from
its checkpoint ends with exactly the model of the uninterrupted run."""

from __future__ import annotations

import numpy as np
import pytest

import fedcluster
from fedcluster import simulation
from fedcluster.common.config import ConfigError
from fedcluster.common.datasets import load_builtin, partition


class ServerKilled(RuntimeError):
    pass


def crashing_grid(after_rounds: int):
    """An in-process Grid whose server dies when round ``after_rounds + 1`` is sent."""

    class CrashingGrid(simulation.InProcessGrid):
        calls = 0

        def send_and_receive(self, messages, *, timeout=None):
            CrashingGrid.calls += 1
            if CrashingGrid.calls > after_rounds:
                raise ServerKilled(f"server stopped after round {after_rounds}")
            return super().send_and_receive(messages, timeout=timeout)

    return CrashingGrid


@pytest.fixture(scope="module")
def sites():
    X, y = load_builtin("blobs", seed=1)
    return [X[rows] for rows in partition(y, 4, "dirichlet:0.5", seed=1)]


CASES = {
    "dwf": {"momentum": 0.3, "learning-rate": 0.8},
    "minibatch": {"batch-size": 64, "epochs": 2, "fraction": 0.75},
    "fkm": {"local-iters": 2},
    "ffcm": {"aggregation": "avg2", "local-iters": 2},
    "gtv": {"topology": "ring"},
}


@pytest.mark.parametrize("algorithm", sorted(CASES))
def test_resumed_run_equals_uninterrupted(algorithm, sites, tmp_path, monkeypatch):
    config = {"algorithm": algorithm, "n_clusters": 5, "num_rounds": 8, "tol": 0.0,
              "min_sites": 3, "seed": 4, "n_init": 2, "output_dir": str(tmp_path),
              **{k.replace("-", "_"): v for k, v in CASES[algorithm].items()}}
    whole = fedcluster.simulate(sites, run_name="whole", **config)

    monkeypatch.setattr(simulation, "InProcessGrid", crashing_grid(3))
    with pytest.raises(ServerKilled):
        fedcluster.simulate(sites, run_name="stopped", **config)
    monkeypatch.undo()
    assert (tmp_path / "stopped" / "checkpoint.pkl").exists()

    resumed = fedcluster.simulate(sites, run_name="resumed",
                                  resume_from=str(tmp_path / "stopped"), **config)
    np.testing.assert_array_equal(resumed.centroids, whole.centroids)
    assert resumed.metrics["score"] == whole.metrics["score"]
    tasks = [h["task"] for h in resumed.history]
    # the whole history: rounds 1-3, the describe round of the resume, then the rest
    assert tasks[:3] == [h["task"] for h in whole.history][:3] and tasks[3] == "describe"
    assert tasks[4:] == [h["task"] for h in whole.history][3:]
    assert [h["round"] for h in resumed.history] == list(range(1, len(resumed.history) + 1))


def test_resume_refuses_a_changed_config_or_a_missing_checkpoint(sites, tmp_path, monkeypatch):
    config = {"n_clusters": 5, "num_rounds": 6, "min_sites": 3, "output_dir": str(tmp_path)}
    monkeypatch.setattr(simulation, "InProcessGrid", crashing_grid(3))
    with pytest.raises(ServerKilled):
        fedcluster.simulate(sites, run_name="stopped", **config)
    monkeypatch.undo()
    with pytest.raises(ConfigError, match=r"differs .* n-clusters = 5 -> 6"):
        fedcluster.simulate(sites, resume_from=str(tmp_path / "stopped"),
                            **{**config, "n_clusters": 6})
    with pytest.raises(ConfigError, match="no checkpoint at"):
        fedcluster.simulate(sites, resume_from=str(tmp_path / "nowhere"), **config)
    # a site that is not the checkpointed run's site of that id is rejected on resume
    changed = [sites[0][:-10], *sites[1:]]
    r = fedcluster.simulate(changed, resume_from=str(tmp_path / "stopped"), run_name="r2",
                            **config)
    assert "rows" in r.metrics["rejected-sites"]["0"]
    assert r.metrics["n-sites"] == 4  # the federation is the checkpoint's

"""Checkpoints: a run stopped after round 3 (the server process dies) and resumed from
its checkpoint ends with exactly the model of the uninterrupted run; a checkpoint is data
(JSON + .npz) holding the strategy's whole state, for every algorithm, and one of another
format (format 1's checkpoint.pkl included) is refused without being read."""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import math
import pickle
import re
import warnings
from pathlib import Path

import numpy as np
import pytest

import fedcluster
from fedcluster import simulation
from fedcluster.common.config import ConfigError, parse_run_config
from fedcluster.common.datasets import load_builtin, partition
from fedcluster.common.scaling import FeatureTransform
from fedcluster.server_app import checkpoint, workflow
from fedcluster.strategies.base import ClusteringStrategy
from fedcluster.strategies import make_strategy, state
from fedcluster.strategies.metrics import PooledStats
from fedcluster.strategies.sites import Site


class ServerKilled(RuntimeError):
    pass


def crashing_grid(after_rounds: int):
    """An in-process Grid whose server dies when round ``after_rounds + 1`` is sent."""

    class CrashingGrid(simulation.InProcessGrid):
        calls = 0

        def push_messages(self, messages):  # the server pushes once per round
            CrashingGrid.calls += 1
            if CrashingGrid.calls > after_rounds:
                raise ServerKilled(f"server stopped after round {after_rounds}")
            return super().push_messages(messages)

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
    assert (tmp_path / "stopped" / "checkpoint.json").exists()

    resumed = fedcluster.simulate(sites, run_name="resumed",
                                  resume_from=str(tmp_path / "stopped"), **config)
    np.testing.assert_array_equal(resumed.centroids, whole.centroids)
    assert resumed.metrics["score"] == whole.metrics["score"]
    tasks = [h["task"] for h in resumed.history]
    # the whole history: rounds 1-3, the describe round of the resume, then the rest
    assert tasks[:3] == [h["task"] for h in whole.history][:3] and tasks[3] == "describe"
    assert tasks[4:] == [h["task"] for h in whole.history][3:]
    assert [h["round"] for h in resumed.history] == list(range(1, len(resumed.history) + 1))


def test_a_checkpoint_written_before_a_key_existed_resumes_as_its_release_ran(sites, tmp_path,
                                                                              monkeypatch):
    """A checkpoint whose run config lacks a key a later release added (``report-groups``,
    checkpoint.ADDED_KEYS) resumes under the resuming config's default as the older release
    ran: the same as an uninterrupted run with the key at that value; a key changed on
    purpose is still refused."""
    import json

    config = {"n_clusters": 5, "num_rounds": 6, "tol": 0.0, "min_sites": 3, "seed": 4,
              "n_init": 2, "output_dir": str(tmp_path)}
    monkeypatch.setattr(simulation, "InProcessGrid", crashing_grid(9))
    with pytest.raises(ServerKilled):
        fedcluster.simulate(sites, run_name="stopped", report_groups=False, **config)
    monkeypatch.undo()
    document = tmp_path / "stopped" / "checkpoint.json"
    saved = json.loads(document.read_text())
    assert saved["config"].pop("report-groups") is False  # as an older release wrote it
    document.write_text(json.dumps(saved))
    resumed = fedcluster.simulate(sites, run_name="resumed",
                                  resume_from=str(tmp_path / "stopped"), **config)
    whole = fedcluster.simulate(sites, run_name="whole", report_groups=False, **config)
    np.testing.assert_array_equal(resumed.centroids, whole.centroids)
    assert resumed.metrics["score"] == whole.metrics["score"]
    assert resumed.metrics["cluster-sizes"] == whole.metrics["cluster-sizes"]
    assert resumed.metrics["report-groups"] is False


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
    r = fedcluster.simulate(changed, resume_from=str(tmp_path / "stopped"), run_name="r2", every_site=False,
                            **config)
    assert "rows" in r.metrics["rejected-sites"]["0"]
    assert r.metrics["n-sites"] == 4  # the federation is the checkpoint's


# --------------------------------------------------------- the state, attribute by attribute
def assert_same(saved, restored, path="state"):
    """Equal value by value and type by type (arrays: dtype, shape and values)."""
    assert type(saved) is type(restored), f"{path}: {type(saved)} != {type(restored)}"
    if isinstance(saved, np.ndarray):
        assert (saved.dtype, saved.shape) == (restored.dtype, restored.shape), path
        assert np.array_equal(saved, restored, equal_nan=saved.dtype.kind in "fc"), path
    elif isinstance(saved, np.random.Generator):
        assert_same(saved.bit_generator.state, restored.bit_generator.state, f"{path}.state")
    elif dataclasses.is_dataclass(saved):
        for f in dataclasses.fields(saved):
            assert_same(getattr(saved, f.name), getattr(restored, f.name), f"{path}.{f.name}")
    elif isinstance(saved, dict):
        assert list(saved) == list(restored), path
        for key in saved:
            assert_same(saved[key], restored[key], f"{path}[{key!r}]")
    elif isinstance(saved, (list, tuple)):
        assert len(saved) == len(restored), path
        for i, (a, b) in enumerate(zip(saved, restored)):
            assert_same(a, b, f"{path}[{i}]")
    elif isinstance(saved, (float, np.floating)) and math.isnan(saved):
        assert math.isnan(restored), path
    else:
        assert saved == restored, path


def _dp_sites():
    rng = np.random.default_rng(3)
    centres = np.array([[1.0, 1.0], [4.0, 4.0], [1.0, 4.0]])
    X = np.concatenate([c + 0.3 * rng.standard_normal((300, 2)) for c in centres])
    return np.array_split(np.clip(X, 0.0, 5.0), 3)


#: What a checkpoint leaves out (strategies/state.py says why); nothing else may be.
NOT_STATE = {"config", "_stand_ins"}  # state.TRANSIENT, spelled out: a new one is a choice
SMALL = {"n_clusters": 4, "num_rounds": 3, "tol": 0.0, "min_sites": 3, "seed": 4, "n_init": 2}
STATE_RUNS = {
    "dwf": {**SMALL, "algorithm": "dwf", "momentum": 0.3},
    "ewf": {**SMALL, "algorithm": "ewf", "init": "random"},
    "minibatch": {**SMALL, "algorithm": "minibatch", "batch_size": 32, "reassign_patience": 1,
                  "reassign_fraction": 0.3},
    "kfed": {**SMALL, "algorithm": "kfed"},
    "fkm": {**SMALL, "algorithm": "fkm", "scale": "standard"},
    "ffcm": {**SMALL, "algorithm": "ffcm", "aggregation": "avg2", "eval_every": 2},
    "gtv": {**SMALL, "algorithm": "gtv", "topology": "ring", "eval_every": 2},
    "divisive": {**SMALL, "algorithm": "dwf", "init": "divisive"},
    "dp": {"algorithm": "dwf", "n_clusters": 3, "num_rounds": 3, "tol": 0.0, "seed": 1,
           "init": "random", "data_bounds": "", "dp_epsilon": 5.0, "central_baseline": False},  # no data-bounds: a bounds round
    "secure": {"algorithm": "dwf", "n_clusters": 3, "num_rounds": 3, "tol": 0.0, "seed": 1,
               "min_sites": 3, "init": "random", "data_bounds": "0:5",
               "secure_aggregation": True, "secagg_data_bound": 5.0, "central_baseline": False},
    "secure-divisive": {"algorithm": "dwf", "n_clusters": 3, "num_rounds": 3, "tol": 0.0,
                        "seed": 1, "min_sites": 3, "secure_aggregation": True,
                        "secagg_data_bound": 5.0, "central_baseline": False},
}


@pytest.mark.parametrize("case", list(STATE_RUNS))
def test_every_round_checkpoint_restores_the_whole_state(case, sites, tmp_path, monkeypatch):
    """After every round of a real run, the strategy rebuilt from the checkpoint holds the
    same state as the live one, attribute by attribute: an attribute that is not stored,
    or not stored exactly, fails here."""
    saves, runs = [], []
    snapshot = ClusteringStrategy.snapshot

    def snapshot_of_the_live_run(run):  # the run the workflow checkpoints, kept to compare
        runs.append(run)
        return snapshot(run)

    def save_and_compare(taken, directory):
        strategy = runs[-1]
        path = checkpoint.save_checkpoint(taken, directory)
        restored = checkpoint.read_checkpoint(directory, strategy.config)
        # every attribute but the config is state
        live = {k: v for k, v in vars(strategy).items() if k not in NOT_STATE}
        assert set(live) == set(state.state_attributes(vars(strategy)))
        assert set(live) == {k for k in vars(restored) if k not in NOT_STATE}
        for name, value in live.items():
            assert_same(value, getattr(restored, name), name)
        assert restored.config is strategy.config
        assert sorted(p.name for p in directory.glob("checkpoint*")) == sorted(
            [path.name, json.loads(path.read_text())["arrays-file"]])
        saves.append(strategy.phase)

    monkeypatch.setattr(ClusteringStrategy, "snapshot", snapshot_of_the_live_run)
    monkeypatch.setattr(workflow, "save_checkpoint", save_and_compare)
    data = _dp_sites() if case in ("dp", "secure", "secure-divisive") else sites
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fedcluster.simulate(data, output_dir=str(tmp_path), run_name=case, **STATE_RUNS[case])
    assert saves[-1] == "done" and len(saves) >= 5


def test_the_encoder_round_trips_every_type_it_writes_and_refuses_the_rest():
    shared = np.arange(6, dtype=np.int32).reshape(2, 3)
    generator = np.random.default_rng(7)
    generator.random(3)
    value = {
        "floats": [1.5, -0.0, math.nan, math.inf, -math.inf, 1e-310, 0.1 + 0.2],
        "ints": [0, -3, 2 ** 80, True, None, "text"],
        "tuple": (1, (2.0, "x"), []), "set": {3, 1, 2}, "frozen": frozenset({"a"}),
        "int-keys": {1: "a", 2: {"b": ()}}, "tagged": {"__type__": "mine"},
        "scalars": [np.float64(math.nan), np.float32(0.1), np.int64(-5), np.uint8(7),
                    np.bool_(True), np.complex128(1 + 2j), np.longdouble(1) / 3],
        "arrays": [shared, shared, np.array(2.5), np.zeros((0, 3)), np.array([math.nan]),
                   np.asfortranarray(np.ones((2, 2))), np.array(["a", "bc"])],
        "generator": generator,
        "site": Site("3", 12, 100, 2, ["x", "y"], {"dataset": "blobs"}, max_rounds=None),
        "stats": PooledStats(10, 1.0, 2.0, np.ones(2, np.int64), np.ones((2, 2)), np.ones(2),
                             {"a": np.array([1, 2])}),
        "transform": FeatureTransform("standard", np.zeros(2), np.ones(2)),
    }
    encoder = state.Encoder()
    text = json.dumps(encoder.encode(value), allow_nan=False)
    back = state.decode(json.loads(text), dict(encoder.stored))
    assert_same(value, back)
    assert back["arrays"][0] is back["arrays"][1]  # one array object stays one
    assert back["generator"].random() == generator.random()
    for bad, where in [(object(), "x"), (np.array([None]), "x"), (lambda: 0, "x"),
                       ({"k": [1, {2: Path("p")}]}, "x['k'][1][2]")]:
        with pytest.raises(state.StateError, match="^" + re.escape(where) + ": "):
            state.Encoder().encode(bad, "x")
    # the decoder builds registered types only
    for data in [{"__type__": "dataclass", "name": "Popen", "fields": {}},
                 {"__type__": "os.system"}, {"__type__": "generator",
                                             "state": {"bit_generator": "Evil"}},
                 {"__type__": "ndarray", "key": "nowhere"}]:
        with pytest.raises(state.StateError):
            state.decode(data, {})


def _fresh(tmp_path):
    config = parse_run_config({"n-clusters": 2, "min-sites": 1})
    return make_strategy(config), config, tmp_path / "run"


def test_a_crash_mid_write_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    strategy, config, directory = _fresh(tmp_path)
    checkpoint.save_checkpoint(strategy.snapshot(), directory)
    assert sorted(p.name for p in directory.iterdir()) == ["checkpoint-0.npz", "checkpoint.json"]
    strategy.history.append({"round": 1, "task": "describe", "score": math.nan})
    strategy.centroids = np.ones((2, 2))
    replace = checkpoint.os.replace

    def crash_on_json(src, dst):
        if Path(dst).name == checkpoint.CHECKPOINT_FILE:
            raise OSError("disk gone")
        replace(src, dst)

    monkeypatch.setattr(checkpoint.os, "replace", crash_on_json)
    with pytest.raises(OSError, match="disk gone"):
        checkpoint.save_checkpoint(strategy.snapshot(), directory)
    monkeypatch.undo()
    assert checkpoint.read_checkpoint(directory, config).history == []
    checkpoint.save_checkpoint(strategy.snapshot(), directory)
    assert sorted(p.name for p in directory.iterdir()) == ["checkpoint-1.npz", "checkpoint.json"]
    # the same round saved again never rewrites the arrays the JSON names
    checkpoint.save_checkpoint(strategy.snapshot(), directory)
    assert sorted(p.name for p in directory.iterdir()) == ["checkpoint-1b.npz", "checkpoint.json"]
    restored = checkpoint.read_checkpoint(directory, config)
    assert_same(restored.centroids, strategy.centroids)
    assert math.isnan(restored.history[0]["score"])


class _Canary:
    """An object whose unpickling would create a file: proof that nothing was unpickled."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (Path.touch, (self.path,))


def test_other_formats_are_refused_without_being_read(tmp_path):
    strategy, config, directory = _fresh(tmp_path)
    canary = tmp_path / "unpickled"
    old = tmp_path / "old"
    old.mkdir()
    (old / "checkpoint.pkl").write_bytes(
        pickle.dumps({"format-version": 1, "strategy": _Canary(canary)}, protocol=4))
    for where in (old, old / "checkpoint.pkl"):
        with pytest.raises(ConfigError, match="format 1, this fedcluster reads format 2"):
            checkpoint.load_checkpoint(str(where), config)
    renamed = old / "checkpoint.json"  # a format-1 stream under the new name
    renamed.write_bytes((old / "checkpoint.pkl").read_bytes())
    with pytest.raises(ConfigError, match="format 1, this fedcluster reads format 2"):
        checkpoint.load_checkpoint(str(renamed), config)
    assert not canary.exists()

    path = checkpoint.save_checkpoint(strategy.snapshot(), directory)
    document = json.loads(path.read_text())
    path.write_text(json.dumps({**document, "format-version": 3}))
    with pytest.raises(ConfigError, match="format 3, this fedcluster reads format 2"):
        checkpoint.load_checkpoint(str(directory), config)

    # arrays of Python objects are never loaded (np.load's default refuses them)
    assert inspect.signature(np.load).parameters["allow_pickle"].default is False
    evil = directory / "checkpoint-9.npz"
    np.savez(evil, a0=np.array([_Canary(canary)], dtype=object))
    path.write_text(json.dumps({**document, "arrays-file": evil.name,
                                "arrays-sha256": hashlib.sha256(evil.read_bytes()).hexdigest()}))
    with pytest.raises(ConfigError, match="not a readable fedcluster checkpoint"):
        checkpoint.load_checkpoint(str(directory), config)
    assert not canary.exists()
    # arrays that are not the ones this JSON wrote
    path.write_text(json.dumps({**document, "arrays-file": evil.name}))
    with pytest.raises(ConfigError, match="SHA-256 differs"):
        checkpoint.load_checkpoint(str(directory), config)

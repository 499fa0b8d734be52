"""The algorithms through Flower's simulation engine for real (`flwr run` against a
simulation SuperLink), equal to the in-process harness to 1e-12: k-FED (one shot), FFCM
(fuzzy) and GTV (per-site models over a graph, its training round with simulated devices
that come and go: the same sites answer in both), each with its own server flow. DWF runs on
the engine in test_parity.py; mini-batch and FKM go through the same ClientApp/ServerApp
plumbing as DWF and are run over gRPC with every other algorithm in
test_flower_algorithms.py (each engine run costs CI the better part of a minute). Its own
module so that it and the gRPC runs, the longest real-Flower tests, run on different
xdist workers."""

from __future__ import annotations

from pathlib import Path

import numpy as np

import fedcluster
import flower_processes as fp
from test_deployment import py_kwargs
from test_flower_algorithms import ALGORITHMS, COMMON

ON_THE_ENGINE = ("kfed", "ffcm", "gtv")
# GTV's training round on the engine with simulated devices (server_app/availability.py):
# at seed 2 two of its four sites are offline and one answers late, as in the harness.
DEVICES = {"gtv": {"simulated-availability": 0.7, "simulated-stragglers": 0.6}}

APP_DIR = Path(__file__).resolve().parents[1]


def test_each_algorithm_on_the_simulation_engine(tmp_path, numba_cache):
    out = tmp_path / "outputs"
    config = {**COMMON, "partitioning": "dirichlet:0.5"}
    with fp.sandbox(tmp_path / "engine", NUMBA_CACHE_DIR=numba_cache) as bed:
        link = bed.superlink(simulation=True)
        bed.connect("sim", link.control_address)
        for algorithm in ON_THE_ENGINE:
            extra = {**ALGORITHMS[algorithm], **DEVICES.get(algorithm, {})}
            bed.run(APP_DIR, "sim",
                    {**config, **extra, "algorithm": algorithm, "output-dir": str(out),
                     "run-name": algorithm},
                    {"num-supernodes": 4}, timeout=300, log_name=f"flwr-run-{algorithm}")
    for algorithm in ON_THE_ENGINE:
        extra = {**ALGORITHMS[algorithm], **DEVICES.get(algorithm, {})}
        engine = fedcluster.Model.load(out / algorithm / "model.json")
        harness = fedcluster.simulate(num_sites=4, algorithm=algorithm,
                                      **py_kwargs({**config, **extra}))
        assert engine.algorithm == algorithm
        np.testing.assert_allclose(engine.centroids, harness.centroids, rtol=0, atol=1e-12)
        assert [h["task"] for h in engine.history] == [h["task"] for h in harness.history]
        who = ("answered", "sites-offline", "sites-late")
        assert ([[h[c] for c in who] for h in engine.history]
                == [[h[c] for c in who] for h in harness.history])
    # who answered GTV's training round: the same draw in both engines
    train = [h for h in fedcluster.Model.load(out / "gtv" / "model.json").history
             if "movement" in h]
    assert [(h["answered"], h["sites-offline"], h["sites-late"]) for h in train] == [("3", 2, 1)]

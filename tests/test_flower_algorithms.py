"""Every algorithm (k-means family, FFCM, GTV) through Flower for real: one run each over
the gRPC Fleet API of a real SuperLink with three SuperNodes, equal to the in-process
harness to 1e-9. The same runs on Flower's simulation engine: test_flower_engine.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np

import fedcluster
import flower_processes as fp
from fedcluster.common.datasets import load_builtin, partition
from fedcluster.simulation import run_in_process
from test_deployment import start_federation, write_site_csv

APP_DIR = Path(__file__).resolve().parents[1]
ALGORITHMS = {
    "minibatch": {"batch-size": 64, "epochs": 2, "beta": 0.5, "learning-rate": 0.8},
    "kfed": {"k-local": 4},
    "fkm": {"local-iters": 2},
    # (the k-FED start, not FFCM's default divisive one: its 5 extra Lloyd rounds would
    # cost ~35 s of CI here, and DWF's runs already carry Lloyd rounds through Flower)
    "ffcm": {"aggregation": "avg2", "local-iters": 2, "fuzzifier": 1.8, "init": "kfed"},
    # (no refining rounds: each costs a real round, ~7 s, and DWF's runs carry Lloyd rounds)
    "gtv": {"topology": "ring", "local-iters": 2, "consensus-rounds": 0},
}
# One training round: enough to show each algorithm's rounds through Flower equal the
# harness's (every round costs each site a fresh ClientApp process, ~3 s of CPU).
COMMON = {"n-clusters": 6, "num-rounds": 1, "seed": 2, "min-sites": 3, **fp.NO_TABLE1}


def test_each_algorithm_over_grpc(tmp_path, numba_cache):
    X, y = load_builtin("blobs", seed=4)
    arrays = [X[rows] for rows in partition(y, 3, "dirichlet:1.0", seed=4)]
    paths = {str(i): write_site_csv(tmp_path / f"site-{i}.csv", Xi) for i, Xi in enumerate(arrays)}
    out = tmp_path / "outputs"
    with fp.sandbox(tmp_path / "deploy", NUMBA_CACHE_DIR=numba_cache,
                    FEDCLUSTER_CACHE_DIR=tmp_path / "site-cache") as bed:
        start_federation(bed, "dep", paths)
        for algorithm, extra in ALGORITHMS.items():
            bed.run(APP_DIR, "dep",
                    {**COMMON, **extra, "algorithm": algorithm, "output-dir": str(out),
                     "run-name": algorithm}, timeout=300, log_name=f"flwr-run-{algorithm}")
    # The harness runs the same runs on the same files, its sites' groups made once and
    # cached like the deployed sites' (one cache directory for all five runs).
    nodes = [{"data-path": str(path), "site-id": key, "cache-dir": str(tmp_path / "harness")}
             for key, path in paths.items()]
    for algorithm, extra in ALGORITHMS.items():
        model = fedcluster.Model.load(out / algorithm / "model.json")
        harness = run_in_process([dict(n) for n in nodes],
                                 {**COMMON, **extra, "algorithm": algorithm, "output-dir": ""})
        np.testing.assert_allclose(model.centroids, harness.centroids, rtol=0, atol=1e-9)
        assert model.metrics["n-sites"] == 3
        assert all(h["sites-failed"] == 0 for h in model.history)
    graph = fedcluster.Model.load(out / "gtv" / "model.json")  # sites named by site-id
    assert sorted(graph.site_centroids) == ["0", "1", "2"]
    fuzzy = fedcluster.Model.load(out / "ffcm" / "model.json")
    assert fuzzy.fuzzifier == 1.8 and 0.5 < fuzzy.metrics["partition-coefficient"] <= 1.0

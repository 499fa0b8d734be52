"""The in-process harness and Flower's simulation engine give the same centroids (to
1e-12) for the same seed and config.

One run goes through a real ``flower-superlink --simulation`` (Ray) and ``flwr run``, the
other through ``fedcluster.simulate(num_sites=...)``, which cuts the built-in data set
exactly as the engine does. ``fraction`` 0.5 makes the server sample sites each round, so
the seeded sampling must agree too; a Dirichlet split with a non-default seed makes the
sites unequal.
"""

from __future__ import annotations

import csv
import re
from pathlib import Path

import numpy as np
import pytest

import fedcluster
import flower_processes as fp

APP_DIR = Path(__file__).resolve().parents[1]
NUM_SITES = 4
CONFIG = {
    "n-clusters": 6,
    "num-rounds": 6,
    "seed": 3,
    "partitioning": "dirichlet:0.5",
    "fraction": 0.5,
}
PROGRESS = re.compile(r"round +\d+ \[")


@pytest.fixture(scope="module")
def module_dir(tmp_path_factory) -> Path:
    """This module's FLWR_HOME lives here: nothing touches ~/.flwr."""
    return tmp_path_factory.mktemp("parity")


@pytest.fixture(scope="module")
def engine_run(module_dir, numba_cache):
    """One run through the simulation SuperLink: (model, flwr run, output dir)."""
    out = module_dir / "outputs"
    with fp.sandbox(module_dir / "engine", NUMBA_CACHE_DIR=numba_cache) as bed:
        link = bed.superlink(simulation=True)
        bed.connect("sim", link.control_address)
        run = bed.run(
            APP_DIR,
            "sim",
            {**CONFIG, "output-dir": str(out), "run-name": "parity"},
            {"num-supernodes": NUM_SITES},
            timeout=300,
        )
    assert not fp.find_processes(tag=bed.tag, patterns=bed.patterns), "processes left behind"
    directory = out / "parity"
    return fedcluster.Model.load(directory / "model.json"), run, directory


def test_simulation_engine_matches_in_process(engine_run):
    engine, run, _ = engine_run
    harness = fedcluster.simulate(
        num_sites=NUM_SITES, **{key.replace("-", "_"): value for key, value in CONFIG.items()}
    )

    np.testing.assert_allclose(engine.centroids, harness.centroids, rtol=0, atol=1e-12)
    assert len(engine.history) == len(harness.history)
    answered = [row["sites-answered"] for row in engine.history]
    assert answered == [row["sites-answered"] for row in harness.history]
    assert [row["task"] for row in engine.history] == [row["task"] for row in harness.history]
    # fraction 0.5 really sampled: training rounds asked 2 of the 4 sites
    train = [row for row in engine.history if row["task"] == "lloyd"]
    assert train and all(row["sites-asked"] == NUM_SITES // 2 for row in train)
    assert engine.metrics["n-sites"] == NUM_SITES
    assert engine.metrics["rounds"] == harness.metrics["rounds"]
    np.testing.assert_allclose(engine.metrics["score"], harness.metrics["score"], rtol=1e-12)
    # the streamed ServerApp log has one progress line per round
    assert len(PROGRESS.findall(run.output)) == len(engine.history)
    # Table 1 by cluster (two rounds, the histograms' range and the profile: no schema
    # declares a range): the same rows
    assert [row["task"] for row in engine.history][-2:] == ["value_range", "profile"]
    ours, theirs = engine.profile, harness.profile
    assert len(ours) == len(theirs) > 64 * (CONFIG["n-clusters"] + 1) * 5
    assert ours[["cluster", "variable", "level", "statistic"]].equals(
        theirs[["cluster", "variable", "level", "statistic"]])
    np.testing.assert_allclose(ours.value.astype(float), theirs.value.astype(float), rtol=1e-12)


def test_simulation_engine_writes_outputs(engine_run):
    engine, _, directory = engine_run
    for name in ("model.json", "history.csv", "convergence.png", "report.html", "table1.csv",
                 "table1.md", "table1.html", "profile.png", "sites.png"):
        assert (directory / name).stat().st_size > 0, name
    # Table 1 in the clinical layout, and on the page
    table = (directory / "table1.md").read_text()
    assert table.splitlines()[0].startswith("|") and "mean (SD)" in table
    assert "Who is in each cluster" in (directory / "report.html").read_text()
    # the run's page: self-contained, and it lists every round's task
    page = (directory / "report.html").read_text()
    assert "data:image/png;base64," in page and "<script" not in page
    assert all(f"<td>{h['round']}</td>" in page and h["task"] in page for h in engine.history)
    with open(directory / "history.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == len(engine.history)
    assert [int(r["round"]) for r in rows] == list(range(1, len(rows) + 1))
    assert [int(r["sites-answered"]) for r in rows] == [h["sites-answered"] for h in engine.history]

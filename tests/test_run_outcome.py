"""How a run ends (issue 70; ``server_app/run_outcome.py``): a run that lost a site fails
under ``every-site`` (the default) with its outputs written, and names the site in its
summary's first lines without it; a reused run name never overwrites an earlier run's
outputs. In process here (the real ServerApp and ClientApps); tests/test_run_command.py
shows the same through ``fedcluster run`` and real Flower processes."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from fedcluster.cli import main
from fedcluster.server_app.run_outcome import lost_lines, lost_sites, run_directory
from fedcluster.simulation import run_in_process
from fedcluster.strategies import FederationError

CONFIG = {"n-clusters": 3, "num-rounds": 2, "seed": 1, "profile": False, "min-sites": 2}


def _files(tmp_path, broken: bool = True) -> list[dict]:
    rng = np.random.default_rng(3)
    nodes = []
    for i in range(3):
        X = rng.normal(size=(40, 2)) + rng.integers(0, 3, 40)[:, None] * 5.0
        lines = ["x0,x1", *(f"{float(a)!r},{float(b)!r}" for a, b in X)]
        if broken and i == 2:
            lines[5] = "abc," + lines[5].split(",")[1]
        path = tmp_path / f"site-{i}.csv"
        path.write_text("\n".join(lines) + "\n")
        nodes.append({"data-path": str(path), "site-id": str(i),
                      "cache-dir": str(tmp_path / f"cache-{i}")})
    return nodes


def test_a_run_that_lost_a_site_fails_with_its_outputs_written(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(FederationError) as err:
        run_in_process(_files(tmp_path), {**CONFIG, "output-dir": str(out), "run-name": "r"})
    assert "site 2: rejected:" in str(err.value) and "every-site" in str(err.value)
    assert "abc" in str(err.value)  # the site's own reason
    assert (out / "r" / "model.json").exists()
    metrics = json.loads((out / "r" / "model.json").read_text())["metrics"]
    assert list(metrics["rejected-sites"]) == ["2"]


def test_without_every_site_the_summary_starts_with_the_lost_site(tmp_path, capsys):
    code = main(["simulate", "--data", *[n["data-path"] for n in _files(tmp_path)],
                 "--n-clusters", "3", "--num-rounds", "2", "--min-sites", "2",
                 "--profile", "false", "--output-dir", str(tmp_path / "out"),
                 "--run-name", "r", "--every-site", "false"])
    assert code == 0
    code = main(["simulate", "--data", *[n["data-path"] for n in _files(tmp_path)],
                 "--n-clusters", "3", "--num-rounds", "2", "--min-sites", "2",
                 "--profile", "false", "--output-dir", str(tmp_path / "out2"), "--run-name", "r"])
    printed = capsys.readouterr()
    assert code == 1 and "every-site" in printed.err and "site 2" in printed.err, printed.err


def test_the_lost_sites_and_the_summary_lines():
    metrics = {"n-sites": 3, "rejected-sites": {"4": "its data has 3 columns"},
               "per-site": {"0": {}, "1": {}}, "site-failures": {"2": ["round 3: timeout"],
                                                                  "1": ["round 2: timeout"]},
               "sites-at-max-rounds": {"3": 2}}
    lost = lost_sites(metrics)
    # 1 failed a round but answered the final evaluation; 3 stopped at its own limit
    assert lost == {"4": "rejected: its data has 3 columns",
                    "2": "not in the final evaluation (last failure: round 3: timeout)"}
    lines = lost_lines(metrics)
    assert lines[0].startswith("  WARNING: this run lost 2 of 4 site(s)")
    assert lost_sites({"n-sites": 2, "per-site": {"0": {}, "1": {}}}) == {}
    assert lost_lines({"n-sites": 2}) == []


def test_a_reused_run_name_is_suffixed_never_overwritten(tmp_path, caplog):
    nodes = _files(tmp_path, broken=False)
    config = {**CONFIG, "output-dir": str(tmp_path / "out"), "run-name": "same"}
    run_in_process(nodes, config)
    first = tmp_path / "out" / "same" / "model.json"
    digest = hashlib.sha256(first.read_bytes()).hexdigest()
    run_in_process(nodes, {**config, "seed": 2})
    run_in_process(nodes, {**config, "seed": 3})
    assert hashlib.sha256(first.read_bytes()).hexdigest() == digest
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["same", "same-2", "same-3"]
    assert all((tmp_path / "out" / name / "model.json").exists() for name in ("same-2", "same-3"))


def test_run_directory_takes_an_empty_folder_and_a_resumed_one(tmp_path):
    (tmp_path / "empty").mkdir()
    assert run_directory(str(tmp_path), "empty") == tmp_path / "empty"
    (tmp_path / "done").mkdir()
    (tmp_path / "done" / "model.json").write_text("{}")
    assert run_directory(str(tmp_path), "done", resume_from=str(tmp_path / "done")) == tmp_path / "done"
    assert run_directory(str(tmp_path), "done",
                         resume_from=str(tmp_path / "done" / "checkpoint.json")) == tmp_path / "done"
    assert run_directory(str(tmp_path), "done") == tmp_path / "done-2"
    assert run_directory("", "x") is None

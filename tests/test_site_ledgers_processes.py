"""A site's privacy budget over REAL site processes (flower-superlink + flower-supernode on
loopback over gRPC): a second DP run that does not fit in the site's dp-budget is refused
by that site with the spent and remaining budget, after a restart of its SuperNode (the
ledger is a file in its cache, not the SuperNode's memory), and the site's disclosure
ledger says so to `fedcluster site ledger`."""

from __future__ import annotations

import contextlib
import io
import json
import re

import numpy as np
import pytest

import fedcluster
import flower_processes as fp
from fedcluster import cli
from fedcluster.client_app.release import ledger as disclosure_ledger
from fedcluster.common import privacy
from test_deployment import write_site_csv
from test_site_policy import APP_DIR

# One training round and the final evaluation under DP (epsilon 1 for the whole run);
# the sites' own budget at site 0 holds one such run and not two. The start is `random`
# in the data-bounds box: DP's default `divisive` start would add five Lloyd rounds, each a
# real round of fresh ClientApp processes, to a test about the budget, not the start.
CONFIG = {"algorithm": "dwf", "n-clusters": 3, "num-rounds": 1, "tol": 0.0, "seed": 4,
          "min-sites": 1, "dp-epsilon": 1.0, "data-bounds": "-4:10", "init": "random",
          "every-site": False}
BUDGET = {"require-dp": True, "dp-budget": "1.2"}


def _sites(rows: int = 60) -> list[np.ndarray]:
    rng = np.random.default_rng(11)
    centres = np.array([[0.0, 0.0], [6.0, 0.0], [0.0, 6.0]])
    return [centres[rng.integers(0, 3, rows)] + rng.normal(size=(rows, 2)) for _ in range(2)]


def test_a_site_budget_outlives_runs_and_supernode_restarts(bed, tmp_path):
    nodes = {}
    for i, X in enumerate(_sites()):
        path = write_site_csv(tmp_path / f"site-{i}.csv", X)
        nodes[f"supernode-{i}"] = {"data-path": str(path), "site-id": str(i),
                                   "cache-dir": str(tmp_path / f"cache-{i}"),
                                   **(BUDGET if i == 0 else {})}
    link = bed.superlink(simulation=False)
    procs = dict(zip(nodes, bed.supernodes(link, nodes)))
    bed.connect("budget", link.control_address)
    out = tmp_path / "outputs"
    bed.run(APP_DIR, "budget", {**CONFIG, "output-dir": str(out), "run-name": "first"},
            timeout=300, log_name="flwr-run-first")
    first = fedcluster.Model.load(out / "first" / "model.json")
    assert first.metrics["site-failures"] == {} and sorted(first.metrics["per-site"]) == ["0", "1"]

    # Site 0's SuperNode stops (it deactivates itself at the SuperLink) and starts again.
    fp.stop_process_group(procs["supernode-0"].popen)
    assert not procs["supernode-0"].running()
    bed.supernodes(link, {"supernode-0-restarted": nodes["supernode-0"]})

    bed.run(APP_DIR, "budget", {**CONFIG, "output-dir": str(out), "run-name": "second"},
            timeout=300, log_name="flwr-run-second")
    second = fedcluster.Model.load(out / "second" / "model.json")
    rejected = second.metrics["rejected-sites"]
    assert list(rejected) == ["0"], rejected
    refusal = rejected["0"]
    # the remaining budget: epsilon (at delta 1e-5) of rho(1.2) - rho(1)
    remaining = privacy.epsilon_from_rho(
        privacy.rho_from_epsilon(1.2, 1e-5) - privacy.rho_from_epsilon(1.0, 1e-5), 1e-5)
    assert re.search(r"site policy dp-budget=1\.2,1e-05: this run plans epsilon 1 .* budget has "
                     r"epsilon 1 spent over 1 run\(s\) and " + re.escape(f"{remaining:.4g}")
                     + " remaining", refusal), refusal
    assert sorted(second.metrics["per-site"]) == ["1"]  # the run went on without site 0

    # the budget file kept the first run's spend, and only it
    (budget_file,) = (tmp_path / "cache-0" / "privacy-budget").glob("budget-*.json")
    runs = json.loads(budget_file.read_text())["runs"]
    assert len(runs) == 1
    assert sum(r["spent-rho"] for r in runs.values()) == pytest.approx(
        privacy.rho_from_epsilon(1.0, 1e-5))

    # the site's disclosure ledger: both runs, the refusal, the budget; and the summary
    ledger = tmp_path / "cache-0" / disclosure_ledger.DEFAULT_NAME
    lines = disclosure_ledger.read(ledger)
    assert len({line["run-id"] for line in lines}) == 2
    assert any(line.get("refused", "").startswith("site policy dp-budget") for line in lines)
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        assert cli.main(["site", "ledger", str(ledger)]) == 0
    summary = buffer.getvalue()
    assert "refused round 1 (describe): site policy dp-budget=1.2" in summary
    assert "spent of 1.2 (delta 1e-05)" in summary
    # site 1 keeps its own ledger, with no refusal
    other = disclosure_ledger.read(tmp_path / "cache-1" / disclosure_ledger.DEFAULT_NAME)
    assert other and not any("refused" in line for line in other)

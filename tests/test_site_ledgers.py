"""A site's own records across runs: the privacy budget (``dp-budget``, ``require-dp``),
the disclosure ledger (``ledger-path``, ``fedcluster site ledger``) and the min/max policy
(minima and maxima from the groups), in process (the real-process test is in test_site_ledgers_processes.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import fedcluster
from fedcluster import cli
from fedcluster.client_app import privacy_budget
from fedcluster.client_app.release import ledger as disclosure_ledger
from fedcluster.common import privacy, protocol
from fedcluster.client_app.node_config import ConfigError, parse_node_config
from fedcluster.simulation import run_in_process, site_nodes
from fedcluster.strategies.errors import FederationError

BOX = "-4:10"
DP_RUN = {"algorithm": "dwf", "n-clusters": 3, "num-rounds": 2, "tol": 0.0, "seed": 4,
          "min-sites": 1, "dp-epsilon": 1.0, "data-bounds": BOX, "output-dir": "",
          "every-site": False}


def _sites(n_sites: int = 2, rows: int = 60) -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    centres = np.array([[0.0, 0.0], [6.0, 0.0], [0.0, 6.0]])
    return [centres[rng.integers(0, 3, rows)] + rng.normal(size=(rows, 2)) for _ in range(n_sites)]


def _file_nodes(tmp_path, sites, **policy) -> list[dict]:
    """Deployed-style sites: a data file and a cache directory each (the budget and the
    ledgers are kept there, across runs)."""
    nodes = []
    for i, X in enumerate(sites):
        path = tmp_path / f"site-{i}.npy"
        np.save(path, X)
        nodes.append({"data-path": str(path), "site-id": str(i),
                      "cache-dir": str(tmp_path / f"cache-{i}"), **policy})
    return nodes


# ------------------------------------------------------------------ the budget maths


def test_budget_parses_is_finite_by_default_and_bad_values_name_the_key():
    assert parse_node_config({"dp-budget": "3"}).dp_budget == (3.0, 1e-5)
    assert parse_node_config({"dp-budget": "2.5,1e-6"}).dp_budget == (2.5, 1e-6)
    # no key: the default, epsilon 10 at delta 1e-5 (rho-zCDP about 1.55)
    assert parse_node_config({}).dp_budget == (10.0, 1e-5)
    assert privacy_budget.Budget(*parse_node_config({}).dp_budget).rho == pytest.approx(
        1.5503552, rel=1e-6)
    # there is no unlimited value: an empty or infinite budget is an error
    for bad in ("", "inf", "1e400", "nan"):
        with pytest.raises(ConfigError, match="dp-budget"):
            parse_node_config({"dp-budget": bad})
    for bad in ("x", "0", "1,2", "1,1e-5,3"):
        with pytest.raises(ConfigError, match="dp-budget"):
            parse_node_config({"dp-budget": bad})


def test_charge_adds_rho_per_run_and_refuses_what_does_not_fit():
    budget = privacy_budget.Budget(2.0, 1e-5)
    run = privacy.rho_from_epsilon(1.0, 1e-5)  # a whole run of epsilon 1
    ledger: dict = {}
    for _ in range(4):  # run 1: four equal shares
        privacy_budget.charge(budget, ledger, 1, run / 4, planned=run)
    assert ledger["runs"]["1"]["spent-rho"] == pytest.approx(run)
    assert ledger["runs"]["1"]["tasks"] == 4
    # zCDP adds rho, which composes below the sum of epsilons: three whole runs of
    # epsilon 1 fit in a budget of epsilon 2 (floor(rho(2) / rho(1)) = 3) ...
    fits = int(budget.rho // run)
    assert fits == 3
    for run_id in range(2, fits + 1):
        for _ in range(4):
            privacy_budget.charge(budget, ledger, run_id, run / 4, planned=run)
    assert privacy_budget.status(budget, ledger)["spent-epsilon"] < 2.0
    before = json.dumps(ledger)
    # ... but a fourth does not: refused at its first task, nothing charged
    with pytest.raises(privacy_budget.BudgetExhausted) as refusal:
        privacy_budget.charge(budget, ledger, fits + 1, run / 4, planned=run)
    assert json.dumps(ledger) == before
    text = str(refusal.value)
    now = privacy_budget.status(budget, ledger)
    assert "site policy dp-budget=2,1e-05" in text and "this run plans epsilon 1" in text
    assert f"{now['spent-epsilon']:.4g} spent over 3 run(s)" in text
    assert f"{now['remaining-epsilon']:.4g} remaining" in text
    # a run that planned little but keeps asking is stopped at the task that overflows
    ledger2: dict = {}
    with pytest.raises(privacy_budget.BudgetExhausted, match="this task would spend"):
        for _ in range(100):
            privacy_budget.charge(budget, ledger2, 9, run / 4, planned=run / 4)
    assert privacy_budget.spent_rho(ledger2) <= budget.rho


def test_a_site_charges_what_its_own_share_of_the_noise_costs():
    """Distributed DP: a site adds share x sigma of the noise a task's dp-rho calibrates;
    alone, that noise is rho / share^2-zCDP (here against the Gaussian mechanism's cost
    computed from the noise itself), and that is what the site charges, for the task
    and for the run's planned spend: a tiny share is refused as over budget."""
    import math

    sensitivity, rho, share = 3.0, 0.2, 0.5
    own_sigma = share * sensitivity / math.sqrt(2 * rho)
    assert privacy.own_noise_rho(rho, share) == pytest.approx(
        privacy.gaussian_rho(sensitivity, own_sigma), rel=1e-12)
    assert privacy.own_noise_rho(rho, 1.0) == rho  # local DP: the task's rho
    assert privacy.own_noise_rho(1.0, 1e-200) == math.inf  # refused, not an overflow
    for bad in ((0.0, 0.5), (1.0, 0.0), (1.0, 1.5), (float("nan"), 1.0)):
        with pytest.raises(ValueError):
            privacy.own_noise_rho(*bad)
    budget = privacy_budget.Budget(10.0, 1e-5)
    ledger: dict = {}
    assert privacy_budget.charge(budget, ledger, 1, rho, None, share) == pytest.approx(4 * rho)
    assert privacy_budget.spent_rho(ledger) == pytest.approx(4 * rho)
    with pytest.raises(privacy_budget.BudgetExhausted,
                       match=r"site policy dp-budget=10,1e-05: this task would spend epsilon .* "
                             r"for its own share 1e-06 of the noise alone .* remaining"):
        privacy_budget.charge(budget, ledger, 1, 1e-3, None, 1e-6)
    assert privacy_budget.spent_rho(ledger) == pytest.approx(4 * rho)  # nothing charged
    # a run's planned spend, scaled the same way: rho / 4 at share 1/2 fits exactly, more not
    privacy_budget.check_fits(budget, {}, 2, budget.rho / 4, noise_share=0.5)
    with pytest.raises(privacy_budget.BudgetExhausted, match="this run plans epsilon"):
        privacy_budget.check_fits(budget, {}, 2, budget.rho / 3, noise_share=0.5)


def test_budget_file_survives_and_a_foreign_file_is_never_overwritten(tmp_path):
    budget = privacy_budget.Budget(1.0, 1e-5)
    with privacy_budget.ledger_in_file(tmp_path, "ab" * 32) as ledger:
        privacy_budget.charge(budget, ledger, 5, 0.001, planned=0.002)
    (target,) = tmp_path.glob("budget-*.json")
    with privacy_budget.ledger_in_file(tmp_path, "ab" * 32) as ledger:
        assert ledger["runs"]["5"]["spent-rho"] == 0.001
    assert not list(tmp_path.glob("*.partial"))
    target.write_text("not json")
    with pytest.raises(ValueError, match="is not a privacy-budget ledger"):
        with privacy_budget.ledger_in_file(tmp_path, "ab" * 32):
            pass
    assert target.read_text() == "not json"


# ------------------------------------------------------------- budget over runs


def test_a_site_budget_refuses_the_run_that_does_not_fit(tmp_path):
    sites = _sites()
    nodes = _file_nodes(tmp_path, sites)
    nodes[0].update({"dp-budget": "1.2", "require-dp": True})
    first = run_in_process([dict(n) for n in nodes], DP_RUN)
    assert first.metrics["site-failures"] == {} and sorted(first.metrics["per-site"]) == ["0", "1"]
    second = run_in_process([dict(n) for n in nodes], DP_RUN)
    # site 0 refused the second run at its first task (describe), naming what is left,
    # and the server rejected it at once
    rejected = second.metrics["rejected-sites"]
    assert list(rejected) == ["0"]
    assert "site policy dp-budget=1.2,1e-05: this run plans epsilon 1" in rejected["0"]
    assert "spent over 1 run(s)" in rejected["0"] and "remaining" in rejected["0"]
    assert sorted(second.metrics["per-site"]) == ["1"]
    # what the site recorded: the first run's spend, exactly the run's budget
    (ledger_file,) = (tmp_path / "cache-0" / "privacy-budget").glob("budget-*.json")
    runs = json.loads(ledger_file.read_text())["runs"]
    assert len(runs) == 1
    (spent,) = [r["spent-rho"] for r in runs.values()]
    assert spent == pytest.approx(privacy.rho_from_epsilon(1.0, 1e-5))


def test_a_distributed_dp_run_costs_each_site_what_its_own_share_of_the_noise_gives(tmp_path):
    """Under SecAgg+ each site adds 1/sqrt(t) of the noise and charges its budget t x the
    run's rho (its own noise alone): recorded so in its budget file (3 sites, t = 2); a
    run whose t x rho exceeds a default site's budget (5 sites, t = 4, epsilon 5: 4 x
    rho(5) is epsilon 10.9 > 10) is refused at its describe handshake, naming the share."""
    secure_run = {**DP_RUN, "dp-epsilon": 2.0, "secure-aggregation": True,
                  "secagg-data-bound": 10.0, "min-sites": 3}
    nodes = _file_nodes(tmp_path, _sites(3))
    result = run_in_process([dict(n) for n in nodes], secure_run)
    assert result.metrics["dp-mode"] == "distributed" and result.metrics["site-failures"] == {}
    for i in range(3):
        (budget_file,) = (tmp_path / f"cache-{i}" / "privacy-budget").glob("budget-*.json")
        (run,) = json.loads(budget_file.read_text())["runs"].values()
        assert run["spent-rho"] == pytest.approx(2 * privacy.rho_from_epsilon(2.0, 1e-5))
    wide = {key.replace("-", "_"): value for key, value in {
        **secure_run, "dp-epsilon": 5.0, "min-sites": 5, "secagg-num-shares": 0.8,
        "secagg-reconstruction-threshold": 0.7}.items() if key != "output-dir"}
    with pytest.raises(FederationError, match=r"site policy dp-budget=10,1e-05: this run plans "
                                              r"epsilon 10\.9 \(at delta 1e-05\) for its own "
                                              r"share 0\.5 of the noise alone"):
        fedcluster.simulate(_sites(5), **wide)


def test_require_dp_refuses_a_plain_run_and_answers_a_private_one(tmp_path):
    sites = _sites()
    plain = {k: v for k, v in DP_RUN.items() if k not in ("dp-epsilon",)}
    with site_nodes(sites, site_config={"require-dp": True}) as nodes:
        with pytest.raises(FederationError, match="site policy require-dp refuses task 'local_kmeans'"):
            run_in_process(nodes, plain)
    with site_nodes(sites, site_config={"require-dp": True}) as nodes:
        result = run_in_process(nodes, DP_RUN)
    assert result.metrics["site-failures"] == {}


# ---------------------------------------------------------------- minima and maxima


@pytest.mark.parametrize("config, task", [({"init": "random"}, "bounds"),
                                          ({"scale": "minmax"}, "stats")])
def test_minima_and_maxima_are_the_groups_means_extremes(config, task):
    """A site sends per-feature minima and maxima (init random's bounds, scale minmax)
    as the extremes of its groups' means, each a mean of at least its min-cluster-size
    rows; a site policy that refused them (allow-minmax) is gone, and naming it is an
    error that says why."""
    from fedcluster.client_app.data import group_table
    from fedcluster.client_app.data.site_data import SiteData

    run = {"algorithm": "dwf", "n-clusters": 3, "num-rounds": 2, "seed": 4, "output-dir": "",
           **config}
    records: list[dict] = []
    result = fedcluster.simulate(_sites(), record_replies=records,
                                 **{k.replace("-", "_"): v for k, v in run.items()})
    assert result.history[0]["task"] == f"describe+{task}"  # carried by the describe round
    for record in records:
        if record["task"] != "describe" or protocol.THEN not in record["params"]:
            continue
        site = int(record["metrics"]["site-key"])
        groups, _ = group_table.build(SiteData(_sites()[site], None, None, "s"), 2)
        minima, maxima = record["arrays"][:2]
        np.testing.assert_array_equal(minima, np.asarray(groups.means).min(axis=0))
        np.testing.assert_array_equal(maxima, np.asarray(groups.means).max(axis=0))
        assert not (minima == _sites()[site].min(axis=0)).any()  # no single row's value
    with pytest.raises(FederationError, match="allow-minmax' was removed"):
        fedcluster.simulate(_sites(), site_config={"allow-minmax": True},
                            **{k.replace("-", "_"): v for k, v in run.items()})


# ----------------------------------------------------------- disclosure ledger


def _replies_by_site_round(records: list[dict]) -> dict:
    out = {}
    for record in records:
        if record["task"] is None:
            continue
        key = (str(record["metrics"][protocol.SITE_KEY]), int(record["params"][protocol.ROUND]))
        out[key] = record
    return out


@pytest.mark.parametrize("algorithm", ["dwf", "ffcm"])
def test_every_ledger_line_is_exactly_what_the_server_received(tmp_path, algorithm):
    path = tmp_path / "ledger.jsonl"
    records: list = []
    fedcluster.simulate(_sites(3), algorithm=algorithm, n_clusters=3, seed=1, eval_every=1,
                        record_replies=records, site_config={"ledger-path": str(path)})
    lines = disclosure_ledger.read(path)
    received = _replies_by_site_round(records)
    # one line per task: a describe that carried the run's first task writes two, in order
    per_message: dict = {}
    for line in lines:
        per_message.setdefault((line["site"], line["round"]), []).append(line)
    assert set(per_message) == set(received) and len(received) > 6
    # DWF's describe carries its k-FED round; FFCM's default start (divisive) sends
    # centroids of the federation's width, so its describe carries nothing
    assert any(len(tasks) == 2 for tasks in per_message.values()) == (algorithm == "dwf")
    for key, mine in per_message.items():
        record = received[key]
        # (describe and the first task it carried: two lines; a training reply's carried
        # evaluation is in its own line, under evaluation- names)
        carried = [record["params"][protocol.THEN]] if protocol.THEN in record["params"] else []
        assert [line["task"] for line in mine] == [record["task"], *carried]
        assert all(line["algorithm"] == algorithm for line in mine)
        assert all(line["n-rows"] == record["num-examples"] for line in mine)
        # the reply's arrays are its last task's (describe sends none), exactly
        assert all(not line["values"] for line in mine[:-1])
        sent = [np.asarray(v, dtype=np.float64) for v in mine[-1]["values"].values()]
        assert len(sent) == len(record["arrays"])
        for value, theirs in zip(sent, record["arrays"]):
            np.testing.assert_array_equal(value, theirs)  # exact, not close
        # and its metrics are those of its tasks together
        metrics = {name: v for line in mine for name, v in line["metrics"].items()}
        assert metrics == json.loads(json.dumps(record["metrics"]))
    # every line names the group table its reply came from (each site's own, every time)
    from fedcluster.client_app.data import group_table
    from fedcluster.client_app.data.site_data import SiteData

    tables = {str(i): group_table.build(SiteData(X, None, None, f"site {i}"), 2)[0].digest[:16]
              for i, X in enumerate(_sites(3))}
    assert {(line["site"], line["groups"]) for line in lines} == set(tables.items())
    out = cli_output(["site", "ledger", str(path)])
    assert f"disclosure ledger {path}: {len(lines)} line(s)" in out
    assert f"({algorithm}), site 0:" in out and "numbers in plain replies" in out
    assert f"from group table(s) {tables['0']}" in out


def cli_output(argv: list[str]) -> str:
    import contextlib
    import io

    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        assert cli.main(argv) == 0
    return buffer.getvalue()


def test_the_ledger_records_refusals_and_the_budget(tmp_path):
    sites = _sites()
    nodes = _file_nodes(tmp_path, sites)
    nodes[0].update({"dp-budget": "1.2"})
    run_in_process([dict(n) for n in nodes], DP_RUN)
    run_in_process([dict(n) for n in nodes], DP_RUN)
    path = tmp_path / "cache-0" / disclosure_ledger.DEFAULT_NAME
    lines = disclosure_ledger.read(path)
    refused = [line for line in lines if "refused" in line]
    # the second run was refused at its describe handshake, and asked nothing more
    assert [line["task"] for line in refused] == ["describe"]
    assert refused[0]["run-id"] != lines[0]["run-id"] and lines[-1] == refused[0]
    spent = [line["dp-rho"] for line in lines if "dp-rho" in line]
    assert sum(spent) == pytest.approx(privacy.rho_from_epsilon(1.0, 1e-5))
    last = [line["budget"] for line in lines if "budget" in line][-1]
    assert last["runs"] == 1 and last["budget-epsilon"] == 1.2
    out = cli_output(["site", "ledger", str(path)])
    assert "refused round 1 (describe): site policy dp-budget=1.2" in out
    assert "privacy budget (as last recorded): epsilon" in out and "spent of 1.2" in out


def test_a_ledger_that_is_not_jsonl_is_named_with_its_line(tmp_path):
    path = tmp_path / "ledger.jsonl"
    path.write_text('{"task": "lloyd"}\nnot json\n')
    with pytest.raises(ValueError, match=r"ledger.jsonl, line 2: not a ledger line"):
        disclosure_ledger.read(path)
    assert cli.main(["site", "ledger", str(path)]) == 2
    with pytest.raises(ValueError, match=r"disclosure ledger '.*nowhere.jsonl' does not exist"):
        disclosure_ledger.read(tmp_path / "nowhere.jsonl")


def test_under_secure_aggregation_the_ledger_records_the_masked_share_only(tmp_path):
    path = tmp_path / "ledger.jsonl"
    fedcluster.simulate(_sites(3), n_clusters=3, num_rounds=2, seed=1, min_sites=3,
                        secure_aggregation=True, secagg_data_bound=12.0, data_bounds=BOX,
                        site_config={"ledger-path": str(path)})
    lines = disclosure_ledger.read(path)
    masked = [line for line in lines if "secure" in line]
    assert {line["task"] for line in masked} >= {"lloyd", "evaluate"}
    # no values of a masked share are kept (only their sum over the sites is learnt) ...
    assert all("values" not in line and "metrics" not in line for line in masked)
    assert all(line["secure"]["length"] > 0 and line["secure"]["terms"] for line in masked)
    # ... while the plain describe round's reply is recorded with its values
    assert all("metrics" in line for line in lines if line["task"] == "describe")

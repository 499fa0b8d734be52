"""Site policy in the node config (``max-rounds``, ``allow-algorithms``,
``min-cluster-size``): parsing, the count kept in Flower's ``Context.state``, enforcement
in the in-process harness, and one real deployment (a SuperLink and three SuperNode
processes on loopback, gRPC) in which one site stops after two rounds, another refuses
the run's algorithm and the third hides its small clusters under its own privacy floor;
the run finishes with the third, model.json names both refusing sites with their policy,
and each refusing site's own log says why."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from flwr.app import Context, RecordDict
from flwr.common.serde import context_from_proto, context_to_proto

import fedcluster
from fedcluster.client_app import site_policy
from fedcluster.client_app.node_config import ConfigError, parse_node_config
from fedcluster.simulation import run_in_process, site_nodes
from fedcluster.strategies import FederationError
from test_deployment import write_site_csv
from test_docs import same_words, shown

APP_DIR = Path(__file__).resolve().parents[1]
# A short dwf run: a min/max round (init "random"), two training rounds, evaluation.
CONFIG = {"algorithm": "dwf", "n-clusters": 3, "num-rounds": 2, "tol": 0.0, "seed": 4,
          "min-sites": 1, "init": "random", "every-site": False}


def _sites(n_sites: int = 3, rows: int = 40) -> list[np.ndarray]:
    rng = np.random.default_rng(4)
    centres = np.array([[0.0, 0.0], [6.0, 0.0], [0.0, 6.0]])
    return [centres[rng.integers(0, 3, rows)] + rng.normal(size=(rows, 2)) for _ in range(n_sites)]


# ------------------------------------------------------------------- parsing


def test_policy_keys_parse():
    node = parse_node_config({"max-rounds": 3, "allow-algorithms": " fkm, dwf ,fkm"})
    assert node.max_rounds == 3
    assert node.allow_algorithms == ("fkm", "dwf")  # stripped, duplicates dropped, in order
    default = parse_node_config({})
    assert default.max_rounds is None and default.allow_algorithms is None  # no limit


@pytest.mark.parametrize(
    ("values", "key", "says"),
    [
        ({"max-rounds": 0}, "max-rounds", "greater than or equal to 1"),
        ({"max-rounds": -2}, "max-rounds", "greater than or equal to 1"),
        ({"max-rounds": 2.5}, "max-rounds", "fractional part"),
        ({"max-rounds": "two"}, "max-rounds", "valid integer"),
        ({"max-rounds": True}, "max-rounds", "not a boolean"),
        ({"allow-algorithms": ""}, "allow-algorithms", "leave the key out"),
        ({"allow-algorithms": "fkm,,dwf"}, "allow-algorithms", "empty algorithm name"),
        ({"allow-algorithms": "fkm,kmeans"}, "allow-algorithms", "unknown algorithm(s) 'kmeans'"),
    ],
)
def test_bad_policy_values_name_the_key(values, key, says):
    with pytest.raises(ConfigError) as err:
        parse_node_config(values)
    assert f"node-config key '{key}'" in str(err.value)
    assert says in str(err.value)


def test_a_misspelt_key_is_an_error_not_a_policy_silently_ignored():
    """'requier-dp' would leave the site answering non-DP tasks while its operator
    believes it refuses them: the site refuses every task, naming the key it meant."""
    with pytest.raises(ConfigError, match=r"unknown node-config key 'requier-dp' \(did you "
                                          r"mean 'require-dp'\?\)"):
        parse_node_config({"requier-dp": True})
    rng = np.random.default_rng(0)
    with site_nodes([rng.normal(size=(30, 2)), rng.normal(size=(30, 2))],
                    site_config={"requier-dp": True}) as nodes:
        with pytest.raises(FederationError, match=r"unknown node-config key 'requier-dp'"):
            run_in_process(nodes, {"n-clusters": 2, "output-dir": ""})


# ------------------------------------------------------- the count in the state


def test_round_count_survives_the_supernodes_serialisation():
    """The SuperNode sends the Context to each ClientApp process and stores back what
    it returns (as protobuf); the count must survive that round trip, per run."""
    node = parse_node_config({"max-rounds": 2})
    context = Context(run_id=2**64 - 5, node_id=1, node_config={}, state=RecordDict(),
                      run_config={})  # run ids are unsigned 64-bit
    for task in ("describe", "bounds", "lloyd"):  # describe is not counted
        site_policy.check_rounds(node, context.state, context.run_id, task)
        site_policy.count_round(context.state, context.run_id, task)
        context = context_from_proto(context_to_proto(context))  # next process
    assert site_policy.rounds_answered(context.state, context.run_id) == 2
    with pytest.raises(site_policy.PolicyRefusal, match=r"site policy max-rounds=2 reached"):
        site_policy.check_rounds(node, context.state, context.run_id, "lloyd")
    site_policy.check_rounds(node, context.state, context.run_id, "describe")  # still answered
    # another run (e.g. a resumed one) sharing the state starts its own count
    site_policy.check_rounds(node, context.state, 7, "lloyd")
    assert site_policy.rounds_answered(context.state, 7) == 0


def test_allow_algorithms_names_algorithm_and_list():
    node = parse_node_config({"allow-algorithms": "fkm,kfed"})
    site_policy.check_algorithm(node, "kfed")
    with pytest.raises(site_policy.PolicyRefusal) as err:
        site_policy.check_algorithm(node, "dwf")
    assert "allow-algorithms=fkm,kfed" in str(err.value) and "'dwf'" in str(err.value)


# --------------------------------------------------------- in-process harness


def _policy_run(policies: dict[int, dict], config: dict):
    with site_nodes(_sites()) as nodes:
        for index, policy in policies.items():
            nodes[index].update(policy)
        return run_in_process(nodes, {**config, "output-dir": ""})


def test_max_rounds_counts_answered_task_rounds_in_process():
    result = _policy_run({1: {"max-rounds": 2}}, CONFIG)
    rounds = [(h["task"], h["sites-asked"], h["sites-answered"]) for h in result.history]
    # describe (not counted) with bounds, + one lloyd answered by all; site 1 declared its
    # limit, so the server does not ask it after that (no refusals, no failures)
    assert rounds == [("describe+bounds", 3, 3), ("lloyd", 3, 3), ("lloyd", 2, 2),
                      ("evaluate", 2, 2), ("evaluate_distances", 2, 2),
                      ("value_range", 2, 2), ("profile", 2, 2)]
    assert result.metrics["site-failures"] == {}
    # Table 1 says whose rows it counts
    assert result.metrics["profile-note"].startswith("2 of 3 sites answered the profile round")
    assert result.metrics["sites-at-max-rounds"] == {"1": 2}
    assert sorted(result.metrics["per-site"]) == ["0", "2"]
    from fedcluster.server_app.outputs import summary_table

    assert "site 1 answered its max-rounds=2 task rounds" in summary_table(result.metrics)


def test_a_site_under_its_min_site_rows_refuses_to_take_part():
    small = _sites()
    small[2] = small[2][:6]
    results = {}
    for min_rows in (None, 6):
        with site_nodes(small) as nodes:
            if min_rows is not None:
                nodes[2]["min-site-rows"] = min_rows
            results[min_rows] = run_in_process(nodes, {**CONFIG, "output-dir": ""})
    refused = results[None].metrics["rejected-sites"]
    assert list(refused) == ["2"] and "site policy min-site-rows=10" in refused["2"]
    assert "holds 6 rows" in refused["2"]
    assert results[6].metrics["rejected-sites"] == {} and results[6].metrics["n-sites"] == 3


def test_a_site_at_its_limit_that_is_still_asked_refuses():
    """The site enforces its limit whatever the server does: a server that ignores the
    declared max-rounds (here: it forgets its count every round) gets refusals, recorded
    under site-failures."""
    from fedcluster.strategies.sites import Site

    at_limit = Site.at_limit
    Site.at_limit = property(lambda site: False)
    try:
        result = _policy_run({1: {"max-rounds": 2}}, CONFIG)
    finally:
        Site.at_limit = at_limit
    failures = result.metrics["site-failures"]
    assert list(failures) == ["1"] and len(failures["1"]) == 5
    assert all("site policy max-rounds=2 reached" in event for event in failures["1"])
    assert [h["sites-answered"] for h in result.history] == [3, 3, 2, 2, 2, 2, 2]


def test_the_server_follows_the_sites_own_count():
    """rounds-left (the site's count) sets the server's; a reply without a valid one
    counts as one more round; describe never counts."""
    from fedcluster.strategies.sites import Site, count_answer

    a, b = Site("a", 1, 10, 2, [], {}, max_rounds=5), Site("b", 2, 10, 2, [], {})
    count_answer(a, "describe", 4)
    assert a.rounds_answered == 0
    count_answer(a, "lloyd", 2)  # the site counted 3 (a reply lost earlier)
    assert a.rounds_answered == 3 and not a.at_limit
    for bad in (None, -1, 5, "1", 2.0):
        count_answer(a, "lloyd", bad)
    assert a.rounds_answered == 8 and a.at_limit
    count_answer(b, "lloyd", None)
    count_answer(None, "lloyd", 1)  # a key the server does not know: nothing to count
    assert b.rounds_answered == 1 and not b.at_limit


def test_allowed_algorithm_runs_and_refused_one_is_rejected_in_process():
    allowed = _policy_run({0: {"allow-algorithms": "dwf,fkm"}}, CONFIG)
    assert allowed.metrics["rejected-sites"] == {} and allowed.metrics["n-sites"] == 3
    refused = _policy_run({0: {"allow-algorithms": "fkm"}}, CONFIG)
    assert list(refused.metrics["rejected-sites"]) == ["0"]
    assert "allow-algorithms=fkm refuses algorithm 'dwf'" in refused.metrics["rejected-sites"]["0"]
    assert refused.metrics["n-sites"] == 2


def test_site_with_a_bad_policy_value_is_rejected_naming_the_key():
    """A mistyped policy must not silently lift the limit: the site answers nothing."""
    result = _policy_run({2: {"max-rounds": 0}}, CONFIG)
    assert list(result.metrics["rejected-sites"]) == ["2"]
    assert "node-config key 'max-rounds'" in result.metrics["rejected-sites"]["2"]
    assert result.metrics["n-sites"] == 2


# -------------------------------------------------------- real site processes


def test_site_policies_on_real_site_processes(bed, tmp_path):
    arrays = _sites()
    nodes = {}
    # site 0's own privacy floor (10) is above the run's: its small clusters stay hidden
    policies = {"0": {"min-cluster-size": 10}, "1": {"max-rounds": 2},
                "2": {"allow-algorithms": "fkm"}}
    for i, X in enumerate(arrays):
        key = str(i)
        path = write_site_csv(tmp_path / f"site-{key}.csv", X)
        nodes[f"supernode-{key}"] = {"data-path": str(path), "site-id": key,
                                     **policies.get(key, {})}
    link = bed.superlink(simulation=False)
    procs = dict(zip(nodes, bed.supernodes(link, nodes)))
    bed.connect("policy", link.control_address)
    out = tmp_path / "outputs"
    bed.run(APP_DIR, "policy", {**CONFIG, "output-dir": str(out), "run-name": "policy"},
            timeout=300, log_name="flwr-run-policy")

    model = fedcluster.Model.load(out / "policy" / "model.json")
    rejected, failures = model.metrics["rejected-sites"], model.metrics["site-failures"]
    assert list(rejected) == ["2"]
    assert "site policy allow-algorithms=fkm refuses algorithm 'dwf'" in rejected["2"]
    # Site 1 answered bounds and the first lloyd round; it declared its limit, so the
    # server did not ask it after that. The server follows the site's own count
    # (rounds-left), so had the count not persisted across the fresh ClientApp process
    # of every message, site 1 would have been asked (and answered) every round.
    assert sorted(failures) == ["2"] and model.metrics["sites-at-max-rounds"] == {"1": 2}
    # (describe with bounds, lloyd, lloyd, evaluate, then the distances for Davies-Bouldin:
    # site 0's groups of 10 split by their spread in training, so the centroids are not
    # the evaluation's means of whole groups; then Table 1's two rounds, the histograms'
    # range and the profile, site 1 at its limit)
    assert [h["task"] for h in model.history] == ["describe+bounds", "lloyd", "lloyd", "evaluate",
                                                  "evaluate_distances", "value_range", "profile"]
    assert [h["sites-answered"] for h in model.history] == [2, 2, 1, 1, 1, 1, 1]
    assert [h["sites-asked"] for h in model.history] == [3, 2, 1, 1, 1, 1, 1]
    assert sorted(model.metrics["per-site"]) == ["0"]
    # the refusing site says so in its own log (its ClientApp processes log there)
    assert "refused" not in procs["supernode-1"].log_text()
    line = next(line for line in procs["supernode-2"].log_text().splitlines()
                if "ERROR" in line and "site 2: task describe refused" in line)
    # as docs/how-to/site-policy.md shows it
    assert same_words(line[line.index("site 2:"):], shown("docs/how-to/site-policy.md", "site 2:")), line
    assert "refused" not in procs["supernode-0"].log_text()
    # the run equals the in-process harness with the same policies
    harness = _policy_run({0: {"min-cluster-size": 10}, 1: {"max-rounds": 2},
                           2: {"allow-algorithms": "fkm"}}, CONFIG)
    np.testing.assert_allclose(model.centroids, harness.centroids, rtol=0, atol=1e-9)
    # site 0 enforced its own floor: no size under 10 is reported (a cluster it withheld
    # is empty, as its groups hold 10 rows or more, and its row count then shows it as 0)
    sizes = model.metrics["per-site"]["0"]["cluster-sizes"]
    assert 0 in sizes and all(s == 0 or s >= 10 for s in sizes), sizes
    assert sizes == harness.metrics["per-site"]["0"]["cluster-sizes"]

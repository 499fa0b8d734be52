"""Differential privacy: calibration, clipping, sensitivity, accounting, config errors,
and DP runs through the real ServerApp/ClientApp (in-process harness)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

import fedcluster
from fedcluster.client_app import secure_mod
from fedcluster.common import secure_codec as secure
from fedcluster.common import privacy
from fedcluster.common.config import ConfigError, parse_run_config
from fedcluster.client_app.data.site_data import SiteData
from fedcluster.client_app.task_io import TaskError
from site_rows import run_on_rows
from fedcluster.simulation import record_tasks

BOX = (np.zeros(64), np.full(64, 16.0))  # the digits' pixel range, D = 16 * 8 = 128


# ------------------------------------------------------------------ calibration
def test_rho_from_epsilon_matches_an_independent_inversion():
    """rho from (epsilon, delta) against bisection on the forward bound
    epsilon(rho) = rho + 2 sqrt(rho ln(1/delta)) (Bun & Steinke, Prop. 1.3)."""
    for epsilon, delta in [(0.1, 1e-6), (1.0, 1e-5), (10.0, 1e-5), (50.0, 1e-3)]:
        lo, hi = 0.0, epsilon
        for _ in range(200):
            mid = (lo + hi) / 2
            if mid + 2 * math.sqrt(mid * math.log(1 / delta)) < epsilon:
                lo = mid
            else:
                hi = mid
        assert privacy.rho_from_epsilon(epsilon, delta) == pytest.approx(lo, rel=1e-9)
        assert privacy.epsilon_from_rho(lo, delta) == pytest.approx(epsilon, rel=1e-9)


def test_sigma_is_the_formula_for_the_box_and_the_rounds():
    rho_total = privacy.rho_from_epsilon(1.0, 1e-5)
    rho_round = privacy.rho_per_round(1.0, 1e-5, 11)
    assert rho_round == pytest.approx(rho_total / 11)
    # Independently: Delta = ||hi - lo|| = 16 sqrt(64) = 128, sigma = Delta / sqrt(2 rho).
    expected = 128.0 / math.sqrt(2 * rho_total / 11)
    assert privacy.sums_counts_sigma(*BOX, rho_round) == pytest.approx(expected, rel=1e-12)
    assert privacy.gaussian_rho(128.0, expected) == pytest.approx(rho_round)


def test_empirical_noise_matches_the_calibrated_sigma():
    """Many draws of the mechanism on fixed sums: the noise on the sums has std sigma,
    on the counts 2 sigma / D, mean 0; with noise_share 1/sqrt(n), the SUM of n sites'
    noise has std sigma (distributed DP)."""
    lo, hi = np.zeros(4), np.full(4, 2.0)  # D = 4, centre 1
    sigma = privacy.sums_counts_sigma(lo, hi, rho=0.05)
    sums = np.array([[3.0, 3.0, 3.0, 3.0]] * 3)  # 3 rows of ones per cluster: centred 0
    counts = np.array([3.0, 3.0, 3.0])
    rng = np.random.default_rng(1)
    draws = [privacy.noisy_sums_counts(sums, counts, lo, hi, sigma, rng) for _ in range(20000)]
    noise_sums = np.stack([d[0] for d in draws]).ravel()  # centred sums are 0 exactly
    noise_counts = np.stack([d[1] for d in draws]).ravel() - 3.0
    assert np.std(noise_sums) == pytest.approx(sigma, rel=0.02)
    assert abs(np.mean(noise_sums)) < 0.02 * sigma
    assert np.std(noise_counts) == pytest.approx(2 * sigma / 4.0, rel=0.02)
    n = 4
    shared = [sum(privacy.noisy_sums_counts(sums, counts, lo, hi, sigma, rng, 1 / math.sqrt(n))[0]
                  for _ in range(n)) for _ in range(5000)]
    assert np.std(np.stack(shared).ravel()) == pytest.approx(sigma, rel=0.03)
    with pytest.raises(ValueError, match="noise_share"):
        privacy.noisy_sums_counts(sums, counts, lo, hi, sigma, rng, 0.0)


def test_joint_sensitivity_of_sums_and_scaled_counts_is_the_diameter():
    """Replace one row by another anywhere in the box, same or another cluster: the
    released vector (centred sums, D/2 * counts) moves by at most D, and by exactly D
    for opposite corners."""
    rng = np.random.default_rng(0)
    d, k = 3, 4
    lo, hi = np.array([-1.0, 0.0, 2.0]), np.array([1.0, 5.0, 3.0])
    D = privacy.l2_diameter(lo, hi)
    centre, gamma = (lo + hi) / 2, D / 2

    def vector(X, labels):
        sums = np.zeros((k, d))
        np.add.at(sums, labels, X - centre)
        return np.concatenate([sums.ravel(), gamma * np.bincount(labels, minlength=k)])

    worst = 0.0
    for trial in range(2000):
        X = lo + rng.random((10, d)) * (hi - lo)
        labels = rng.integers(0, k, 10)
        corner = np.where(rng.random(d) < 0.5, lo, hi)
        X2, labels2 = X.copy(), labels.copy()
        X2[0], labels2[0] = corner, rng.integers(0, k)
        if trial % 2:
            X[0] = lo + hi - corner  # the opposite corner
        worst = max(worst, np.linalg.norm(vector(X, labels) - vector(X2, labels2)))
    assert worst <= D * (1 + 1e-12)
    X = np.array([lo, lo])
    X2 = np.array([hi, lo])
    assert np.linalg.norm(vector(X, np.array([0, 1])) - vector(X2, np.array([0, 1]))) == pytest.approx(D)


# --------------------------------------------------------------- bounds, clipping
def test_parse_data_bounds_forms_and_errors():
    lo, hi = privacy.parse_data_bounds("0:16")
    assert lo.tolist() == [0.0] and hi.tolist() == [16.0]
    lo, hi = privacy.parse_data_bounds("-1:1, 0:2.5")
    assert lo.tolist() == [-1.0, 0.0] and hi.tolist() == [1.0, 2.5]
    assert privacy.parse_data_bounds("") is None
    assert [a.tolist() for a in privacy.bounds_for((np.array([0.0]), np.array([1.0])), 3)] == [[0.0] * 3, [1.0] * 3]
    for bad, why in [("16:0", "LO < HI"), ("0-16", "LO:HI"), ("a:b", "LO:HI"), ("0:inf", "finite")]:
        with pytest.raises(ValueError, match=why):
            privacy.parse_data_bounds(bad)
    with pytest.raises(ValueError, match="2 ranges but the data has 3"):
        privacy.bounds_for(privacy.parse_data_bounds("0:1,0:1"), 3)
    round_trip = privacy.parse_data_bounds(privacy.encode_bounds(np.array([0.1, -3.0]), np.array([0.7, 1e-9])))
    assert round_trip[0].tolist() == [0.1, -3.0] and round_trip[1].tolist() == [0.7, 1e-9]


def test_clip_rows_and_the_site_sees_only_clipped_rows():
    X = np.array([[-5.0, 0.5], [0.2, 9.0], [0.3, 0.4]])
    np.testing.assert_array_equal(privacy.clip_rows(X, np.zeros(2), np.ones(2)),
                                  [[0.0, 0.5], [0.2, 1.0], [0.3, 0.4]])
    site = SiteData(X, None, None, "test")
    reply = run_on_rows(site, [], {"task": "bounds", "data-bounds": "0:1"}, 1)
    np.testing.assert_array_equal(reply.arrays[0], [0.0, 0.4])
    np.testing.assert_array_equal(reply.arrays[1], [0.3, 1.0])
    with pytest.raises(TaskError, match="data-bounds"):
        run_on_rows(site, [], {"task": "bounds", "data-bounds": "0:1,0:1,0:1"}, 1)


def test_release_counts_post_processing():
    counts = privacy.release_counts(np.array([-3.2, 0.4, 1.6, 7.4, 250.0]), n_rows=100, floor=3)
    assert counts.dtype == np.int64
    assert counts.sum() <= 100
    assert counts[0] == counts[1] == counts[2] == 0  # negative, rounded to 0, under the floor
    assert counts[3] in (0, 7) and counts[4] > 90


# ------------------------------------------------------------------ accounting
def test_budget_is_split_over_the_data_rounds_and_adds_up():
    assert privacy.data_rounds(10, 0, 1) == 11
    assert privacy.data_rounds(10, 5, 2) == 2 * (10 + 2 + 1)
    rho_round = privacy.rho_per_round(3.0, 1e-6, 26)
    assert rho_round * 26 == pytest.approx(privacy.rho_from_epsilon(3.0, 1e-6))
    assert privacy.spent(rho_round, 26, 1e-6)["dp-epsilon-spent"] == pytest.approx(3.0)
    half = privacy.spent(rho_round, 13, 1e-6)
    assert half["dp-rho-spent"] == pytest.approx(rho_round * 13)
    assert half["dp-epsilon-spent"] < 3.0


# ------------------------------------------------------------------ config
@pytest.mark.parametrize(
    "values, key",
    [
        ({"dp-epsilon": -1.0}, "'dp-epsilon'"),
        ({"dp-delta": 1.0}, "'dp-delta'"),
        ({"dp-delta": 0.0}, "'dp-delta'"),
        ({"data-bounds": "3:1"}, "'data-bounds'"),
        ({"dp-epsilon": 1.0, "algorithm": "kfed"}, "'dp-epsilon' > 0: algorithm 'kfed'"),
        ({"dp-epsilon": 1.0, "algorithm": "fkm"}, "'dp-epsilon' > 0: algorithm 'fkm'"),
        ({"dp-epsilon": 1.0, "algorithm": "gtv"}, "'dp-epsilon' > 0: algorithm 'gtv'"),
        ({"dp-epsilon": 1.0, "algorithm": "ffcm"}, "'dp-epsilon' > 0: algorithm 'ffcm'"),
        ({"dp-epsilon": 1.0, "algorithm": "minibatch"}, "'dp-epsilon' > 0: algorithm 'minibatch'"),
        ({"dp-epsilon": 1.0, "local-iters": 3}, "'local-iters' must be 1"),
        ({"dp-epsilon": 1.0, "init": "kfed"}, "'init' must be 'divisive', 'random'"),
        ({"dp-epsilon": 1.0, "scale": "standard"}, "'scale' must be 'none'"),
        ({"dp-epsilon": 1.0, "k-range": "2:5"}, "'k-range' cannot"),
        ({"data-bounds": "0:1", "scale": "minmax"}, "'data-bounds' cannot be combined"),
    ],
)
def test_config_errors_name_the_key(values, key):
    with pytest.raises(ConfigError, match=key):
        parse_run_config(values)


def test_dp_config_accepted_and_init_resolves_to_divisive():
    config = parse_run_config({"dp-epsilon": 2.0, "data-bounds": "0:16", "algorithm": "ewf"})
    assert config.private and config.resolved_init == "divisive"
    assert parse_run_config({}).resolved_init == "kfed" and not parse_run_config({}).private


def test_a_site_refuses_non_private_tasks_under_dp():
    site = SiteData(np.random.default_rng(0).random((20, 2)), None, None, "test")
    params = {"task": "local_kmeans", "k-local": 2, "seed": 0, "dp-rho": 0.1, "data-bounds": "0:1"}
    with pytest.raises(TaskError, match="no differentially private version"):
        run_on_rows(site, [], params, 1)
    with pytest.raises(TaskError, match="data-bounds"):
        run_on_rows(site, [np.zeros((2, 2))], {"task": "lloyd", "local-iters": 1, "tol": 0.0,
                                            "dp-rho": 0.1}, 1)
    with pytest.raises(TaskError, match="local-iters 1"):
        run_on_rows(site, [np.zeros((2, 2))], {"task": "lloyd", "local-iters": 2, "tol": 0.0,
                                            "dp-rho": 0.1, "data-bounds": "0:1"}, 1)


# ------------------------------------------------------------------ DP runs
def _blobs():
    rng = np.random.default_rng(3)
    centres = np.array([[1.0, 1.0], [4.0, 4.0], [1.0, 4.0]])
    X = np.concatenate([c + 0.3 * rng.standard_normal((300, 2)) for c in centres])
    rng.shuffle(X)
    return np.array_split(X, 3), centres


#: Site policy for the runs without data-bounds (their box comes from a bounds round).
ROWS = {"min-cluster-size": 1}  # sites answering from their rows
#: Sites whose own dp-budget holds the runs at huge epsilon below (1e6 for a run, which
#: under distributed DP costs a site t times that): these tests show what DP converges
#: to, and a site's default budget (epsilon 10) refuses such a run, as it must.
LARGE_BUDGET = {"dp-budget": "1e8"}


def _run(sites, **config):
    defaults = dict(n_clusters=3, algorithm="dwf", num_rounds=8, tol=0.0, seed=1,
                    data_bounds="0:5", init="random", central_baseline=False)
    return fedcluster.simulate(sites, **{**defaults, **config})


def test_dp_run_approaches_the_non_private_run_as_epsilon_grows():
    sites, _ = _blobs()
    # DP replies come from the rows (clipped, noised): the plain run they approach is
    # exact Lloyd on the rows (the sites answering from their rows).
    plain = _run(sites, site_config=ROWS).centroids
    gaps = {eps: np.linalg.norm(_run(sites, dp_epsilon=eps, site_config=LARGE_BUDGET).centroids
                                - plain) for eps in (0.5, 20.0, 1e6)}
    assert gaps[1e6] < 1e-2
    assert gaps[1e6] < gaps[20.0] < gaps[0.5]


def test_dp_run_is_reproducible_accounted_and_sends_no_sse():
    sites, _ = _blobs()
    replies = []
    first = _run(sites, dp_epsilon=5.0, record_replies=replies)
    again = _run(sites, dp_epsilon=5.0)
    other_seed = _run(sites, dp_epsilon=5.0, seed=2)
    np.testing.assert_array_equal(first.centroids, again.centroids)
    assert not np.array_equal(first.centroids, other_seed.centroids)
    metrics = first.metrics
    rho_round = privacy.rho_per_round(5.0, 1e-5, 9)  # 8 training rounds + the evaluation
    assert metrics["dp-rounds"] == 9 and metrics["dp-rounds-planned"] == 9
    assert metrics["dp-rho-spent"] == pytest.approx(9 * rho_round)
    assert metrics["dp-epsilon-spent"] == pytest.approx(5.0)
    assert metrics["dp-delta"] == 1e-5 and metrics["dp-bounds-from-data"] is False
    assert metrics["dp-sigma-sums"] == pytest.approx(5 * math.sqrt(2) / math.sqrt(2 * rho_round))
    assert "simplified-silhouette" not in metrics and "davies-bouldin" not in metrics
    spent = [row["dp-epsilon-spent"] for row in first.history]
    assert spent == sorted(spent) and spent[0] == 0.0
    assert spent[-1] == pytest.approx(metrics["dp-epsilon-spent"])
    tasks = [task for r in replies for task in record_tasks(r)]
    assert "bounds" not in tasks and "local_kmeans" not in tasks  # init drawn in the box
    for reply in replies:
        if reply["task"] == "lloyd":
            assert "sse" not in reply["metrics"]
            counts = reply["arrays"][1]
            assert np.all((counts == 0) | (counts >= 2))  # the floor on noisy counts
            assert np.all((reply["arrays"][0] >= 0) & (reply["arrays"][0] <= 5))


def test_early_stop_spends_less_than_the_budget():
    sites, _ = _blobs()
    result = _run(sites, dp_epsilon=1e6, tol=0.5, num_rounds=30, site_config=LARGE_BUDGET)
    assert result.metrics["dp-rounds"] < 31
    assert result.metrics["dp-epsilon-spent"] < 1e6


def test_a_run_that_sends_minima_and_maxima_warns_and_one_that_does_not_is_silent():
    """Without DP too: init 'random' without data-bounds runs a bounds round. From the
    sites' groups its minima and maxima are extremes of group means, as any reply is, and
    nothing is said; from a site answering from its rows they are single values, and the
    run says so, naming the site. With data-bounds or k-FED's start no bounds round runs."""
    import warnings

    sites, _ = _blobs()
    with pytest.warns(privacy.PrivacyLeakWarning, match="init 'random' without data-bounds: "
                                                        r"site\(s\) 0, 1, 2 answer from their rows"):
        _run(sites, data_bounds="", num_rounds=2, site_config=ROWS)
    with warnings.catch_warnings():
        warnings.simplefilter("error", privacy.PrivacyLeakWarning)
        _run(sites, data_bounds="", num_rounds=2)  # from the groups
        _run(sites, num_rounds=2)  # data-bounds "0:5": the start is drawn in that box
        _run(sites, data_bounds="", init="kfed", num_rounds=2)


def test_missing_bounds_warn_and_come_from_a_bounds_round():
    sites, _ = _blobs()
    with pytest.warns(privacy.PrivacyLeakWarning, match="without data-bounds"):
        result = _run(sites, dp_epsilon=5.0, data_bounds="")
    assert result.metrics["dp-bounds-from-data"] is True
    with pytest.raises(Exception, match="data-bounds"):
        _run(sites, dp_epsilon=5.0, data_bounds="", init_centroids=np.ones((3, 2)))


def test_distributed_dp_refuses_a_box_from_the_data_beyond_the_secure_bound():
    """Without data-bounds the box comes from the bounds round; under distributed DP it
    must lie within secagg-data-bound (a site clips a term past its scale), so a run
    whose data reaches past it stops with a reason instead of biasing the sums."""
    from fedcluster.strategies.base import FederationError

    sites, _ = _blobs()  # values up to about 5
    secure_dp = dict(dp_epsilon=5.0, data_bounds="", secure_aggregation=True, min_sites=3)
    with pytest.raises(FederationError, match="beyond secagg-data-bound 3"):
        _run(sites, secagg_data_bound=3.0, **secure_dp)
    with pytest.warns(privacy.PrivacyLeakWarning):
        result = _run(sites, secagg_data_bound=8.0, num_rounds=2, **secure_dp)
    assert result.metrics["dp-mode"] == "distributed" and result.metrics["dp-bounds-from-data"]


def test_noise_is_seeded_in_simulation_and_fresh_entropy_in_deployment():
    from flwr.app import Context, RecordDict

    from fedcluster.client_app.app import SiteClient

    def client(node_config):
        return SiteClient(Context(run_id=1, node_id=7, node_config=node_config,
                                  state=RecordDict(), run_config={"seed": 3}))

    task = {"task": "lloyd", "dp-rho": 0.1, "dp-round": 5}
    simulated = client({"partition-id": 1, "num-partitions": 3})
    seed = simulated._noise_seed(task)
    assert seed is not None and seed[0] == 3 and seed[2] == 5
    assert seed != simulated._noise_seed({**task, "dp-round": 6})
    assert seed != client({"partition-id": 2, "num-partitions": 3})._noise_seed(task)
    assert client({"data-path": "/data/site.csv"})._noise_seed(task) is None  # deployment
    assert simulated._noise_seed({"task": "lloyd"}) is None  # no DP, no noise


# ------------------------------------------------------------- distributed DP
SECURE_BOX = "0:5"  # _blobs' box; secagg-data-bound 5 contains it


def _secure_params(task: str, share: float, rho: float = 0.05) -> dict:
    request = {"terms": ["n"], "scales": [1.0], "clip": True}
    return {"task": task, "local-iters": 1, "tol": 0.0, "dp-rho": rho, "data-bounds": "0:2",
            "dp-noise-share": share, secure.SECURE_PARAM: json.dumps(request)}


def test_a_site_under_secure_aggregation_adds_its_share_and_sends_raw_linear_terms():
    """Distributed DP at the site: the noise on the lloyd sums, counts and the
    evaluation's counts and SSE has std (calibrated sigma) / sqrt(t), mean 0, and the
    statistics are sent raw (no rounding, clamping, floor or mean)."""
    t = 3
    X = np.array([[1.0, 1.0], [1.0, 1.0], [0.0, 2.0], [2.0, 0.0]])  # centre (1, 1), D = sqrt 8
    site = SiteData(X, None, None, "test")
    C = np.array([[1.0, 1.0], [9.0, 9.0]])  # every row in cluster 0; its centred sum is 0
    D = math.sqrt(8.0)
    sigma = D / math.sqrt(2 * 0.05)  # independently of privacy.sums_counts_sigma
    params = _secure_params("lloyd", 1 / math.sqrt(t))
    draws = [run_on_rows(site, [C], params, 1, noise_seed=[seed]).terms for seed in range(4000)]
    sums = np.stack([d["wc"] for d in draws])
    counts = np.stack([d["w-int"] for d in draws]) - np.array([4.0, 0.0])
    assert np.std(sums) == pytest.approx(sigma / math.sqrt(t), rel=0.02)
    assert abs(np.mean(sums)) < 0.02 * sigma
    assert np.std(counts) == pytest.approx(2 * sigma / D / math.sqrt(t), rel=0.02)
    assert (counts < -4).any() and not np.all(counts == np.rint(counts))  # raw: not released
    evaluations = [run_on_rows(site, [C], _secure_params("evaluate", 1 / math.sqrt(t)), 1,
                            noise_seed=[seed]) for seed in range(4000)]
    box = privacy.bounds_for(privacy.parse_data_bounds("0:2"), 2)
    sigma_counts, sigma_sse, cap = privacy.evaluation_sigmas(*box, 0.05)
    assert cap == pytest.approx(8.0) and sigma_counts == pytest.approx(2 / math.sqrt(0.1))
    eval_counts = np.stack([r.arrays[0] for r in evaluations]) - np.array([4.0, 0.0])
    sse = np.array([r.metrics["sse"] for r in evaluations]) - 4.0  # two rows at distance^2 2
    assert np.std(eval_counts) == pytest.approx(sigma_counts / math.sqrt(t), rel=0.02)
    assert np.std(sse) == pytest.approx(sigma_sse / math.sqrt(t), rel=0.03)
    assert (sse < -4.0).any()  # not clamped at the site


def test_the_noise_share_follows_flowers_reconstruction_threshold(monkeypatch):
    """dp-noise-share = 1 / sqrt(t), t the threshold Flower's SecAggPlusWorkflow really
    sends the sites (captured from its setup message), for fractions that make t differ
    from the number of sites; and the rule against hand-worked values."""
    from flwr.common.secure_aggregation.secaggplus_constants import Key, Stage

    thresholds = []
    original = secure_mod.secaggplus_mod

    def spy(msg, context, call_next):
        cfg = msg.content.config_records[secure_mod.RECORD_KEY_CONFIGS]
        if cfg[Key.STAGE] == Stage.SETUP:
            thresholds.append(cfg[Key.THRESHOLD])
        return original(msg, context, call_next)

    monkeypatch.setattr(secure_mod, "secaggplus_mod", spy)
    X = np.concatenate(_blobs()[0])
    replies = []
    _run(np.array_split(X, 5), dp_epsilon=5.0, secure_aggregation=True, secagg_data_bound=5.0,
         min_sites=5, num_rounds=2, secagg_num_shares=0.8, secagg_reconstruction_threshold=0.7,
         record_replies=replies, site_config=LARGE_BUDGET)  # t = 4: a site's own cost 4 rho
    shares = {r["params"]["dp-noise-share"] for r in replies if "dp-noise-share" in r["params"]}
    assert set(thresholds) == {4} and shares == {0.5}  # s = round(4.0) -> odd 5, t = round(3.5)
    assert secure.reconstruction_threshold(5, 0.8, 0.7) == 4
    assert secure.reconstruction_threshold(5, 0.8, 0.5) == 2  # Python's round: half to even
    assert secure.reconstruction_threshold(3, 1.0, 0.67) == 2
    assert secure.reconstruction_threshold(10, 1.0, 0.67) == 7
    assert secure.reconstruction_threshold(10, 0.5, 1.0) == 5
    assert secure.reconstruction_threshold(4, 0.1, 0.1) == 2  # s <= 2 -> n; t at least 2


def test_distributed_dp_run_is_accounted_and_matches_the_plain_run_at_huge_epsilon():
    sites, _ = _blobs()
    secure_dp = dict(secure_aggregation=True, secagg_data_bound=5.0, min_sites=3)
    plain = _run(sites, site_config=ROWS)  # exact Lloyd on the rows, as the DP run at huge epsilon
    replies = []
    result = _run(sites, dp_epsilon=5.0, record_replies=replies, **secure_dp)
    metrics = result.metrics
    assert metrics["dp-mode"] == "distributed" and metrics["dp-rounds"] == 9
    assert metrics["dp-epsilon-spent"] == pytest.approx(5.0)
    assert result.history[-1]["dp-epsilon-spent"] == pytest.approx(5.0)
    assert all(h["sites-answered"] == 3 for h in result.history)
    assert "davies-bouldin" not in metrics and metrics["per-site"] == {}
    # every DP round was a secure sum: a masked vector only, each site adding 1/sqrt(2)
    # of sigma (3 sites, threshold round(0.67 x 3) = 2)
    dp_rounds = [r for r in replies if "dp-rho" in r["params"]]
    assert {r["task"] for r in dp_rounds} == {"lloyd", "evaluate"}  # no Davies-Bouldin round
    assert all(r["arrays"] == [] and r["params"]["dp-noise-share"] == 1 / math.sqrt(2)
               for r in dp_rounds)
    assert _run(sites, dp_epsilon=5.0).metrics["dp-mode"] == "local"
    huge = _run(sites, dp_epsilon=1e6, site_config=LARGE_BUDGET, **secure_dp)
    assert np.linalg.norm(huge.centroids - plain.centroids) < 1e-2
    assert huge.metrics["score"] == pytest.approx(plain.metrics["score"], rel=1e-2)
    assert sum(huge.metrics["cluster-sizes"]) == 900


def test_the_server_post_processes_the_noisy_sum():
    """release_sum: the decoded noisy sum becomes counts >= 0 under the floor, means in
    the box (a withheld cluster keeps its centroid), a non-negative SSE."""
    from fedcluster.strategies import private

    box = (np.zeros(2), np.full(2, 4.0))  # centre (2, 2)
    C = np.array([[1.0, 1.0], [3.0, 3.0], [2.0, 0.0]])
    noisy = {"w-int": np.array([10.0, -3.0, 1.0]),
             "wc": np.array([[5.0, -10.0], [1.0, 1.0], [0.5, 0.5]])}
    (means, counts), metrics = private.release_sum("lloyd", noisy, 20, 2, box, C)
    assert counts.tolist() == [10, 0, 0] and metrics == {}
    np.testing.assert_allclose(means, [[2.5, 1.0], [3.0, 3.0], [2.0, 0.0]])
    arrays, metrics = private.release_sum(
        "evaluate", {"counts": np.array([30.0, -2.0, 4.0]), "sse": np.array([-7.0])}, 20, 2, box, C)
    assert arrays[0].tolist() == [17, 0, 2] and metrics["sse"] == 0.0  # scaled to <= 20 rows
    assert not np.any(arrays[1]) and not np.any(arrays[3])


def test_dp_with_secure_aggregation_is_accepted_and_the_other_constraints_stay():
    both = {"algorithm": "dwf", "dp-epsilon": 1.0, "data-bounds": "0:1",
            "secure-aggregation": True, "secagg-data-bound": 1.0, "min-sites": 2}
    config = parse_run_config(both)
    assert config.private and config.secure_aggregation and config.resolved_init == "divisive"
    for extra, key in [({"algorithm": "ewf"}, "need algorithm 'dwf'"),
                       ({"data-bounds": "-2:1"}, "'data-bounds' must lie within"),
                       ({"local-iters": 2}, "'local-iters' must be 1"),
                       ({"init": "kfed"}, "'init' must be 'divisive', 'random'"),
                       ({"algorithm": "ffcm"}, "algorithm 'ffcm'"),
                       ({"min-sites": 1}, "'min-sites' >= 2")]:
        with pytest.raises(ConfigError, match=key):
            parse_run_config({**both, **extra})

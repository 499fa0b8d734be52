"""Secure aggregation (``secure-aggregation = true``): the sum-only rounds under Flower's
SecAgg+ equal the plain run within the stated quantisation error (in process, for every
algorithm that supports it, and for DWF over real gRPC: a flower-superlink and three
flower-supernode processes on loopback); the algorithms that need each site's reply
refuse the switch; what leaves a site in a secure round is masked; the encoding's error
bound holds for Flower's own quantisation."""

from __future__ import annotations

import json
import re
import time

import numpy as np
import pytest
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.app.message_type import MessageType
from flwr.client.mod import secaggplus_mod
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.common.secure_aggregation.quantization import dequantize, quantize
from flwr.common.secure_aggregation.secaggplus_constants import Key
from flwr.supercore.task_identity import TaskIdentity
from sklearn import metrics as skm

import fedcluster
from fedcluster.client_app.secure_mod import secure_mod
from fedcluster.common import protocol
from fedcluster.common import secure_codec as secure
from fedcluster.common.config import ConfigError, parse_run_config
from fedcluster.common.datasets import load_builtin, partition
from fedcluster.simulation import record_tasks
from fedcluster.strategies import FederationError

import reference as ref

T = 2**24  # the default secagg-quantization-range
BOUND = 16.0  # digits: every pixel is in 0..16
BASE = {"n_clusters": 6, "num_rounds": 3, "init": "random", "tol": 0.0, "seed": 3,
        "min_sites": 3, "central_baseline": False}


@pytest.fixture(scope="module")
def digits():
    X, y = load_builtin("digits")
    parts = partition(y, 3, "iid", seed=0)
    return [X[rows] for rows in parts], [y[rows] for rows in parts]


def lloyd_weights(records: list[dict]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per plain training round: the centroids sent and the summed weights W_j."""
    rounds: dict[bytes, list] = {}
    for rec in records:
        if rec["task"] == "lloyd":
            sent = rec["sent"][0]
            rounds.setdefault(sent.tobytes(), [sent, 0])[1] += rec["arrays"][1]
    return [tuple(v) for v in rounds.values()]


def dwf_bound(sent: np.ndarray, W: np.ndarray, n_max: int, n_sites: int) -> np.ndarray:
    """The stated bound on |D_secure - D_plain| per cluster for one DWF round with the
    same assignments: the sum's error N 2 s_wc / T (s_wc = n_max max(B, max|C|)) over W_j."""
    s_wc = n_max * max(BOUND, float(np.abs(sent).max()))
    return secure.quantisation_error(s_wc, n_sites, T) / np.maximum(W, 1)


def score_bound(sites: list[np.ndarray], centroids: np.ndarray) -> float:
    """The score's error: the SSE term's bound N 2 s_sse / T (s_sse = n_max d G^2,
    G = B + max|C|) over the rows."""
    n, d = sum(len(X) for X in sites), sites[0].shape[1]
    G = BOUND + np.abs(centroids).max() + 1e-3
    s_sse = max(len(X) for X in sites) * d * G * G
    return secure.quantisation_error(s_sse, len(sites), T) / n


# ------------------------------------------------------------------ config
@pytest.mark.parametrize("algorithm, extra, why", [
    ("fkm", {}, "weighted k-means on every site's own centroids"),
    ("kfed", {}, "union of every site's local centroids"),
    ("gtv", {}, "graph neighbours"),
    ("ffcm", {"aggregation": "avg2"}, "avg2 runs k-means on the set of every site's centres"),
    ("dwf", {"init": "kfed"}, "init 'kfed' sends each site's local centroids"),
])
def test_algorithms_that_need_each_reply_refuse(algorithm, extra, why):
    with pytest.raises(ConfigError, match="secure-aggregation") as err:
        parse_run_config({"algorithm": algorithm, "secure-aggregation": True,
                          "secagg-data-bound": 1.0, **extra})
    assert why in str(err.value)


def test_secure_config_needs_a_data_bound_and_resolves_init_to_divisive():
    with pytest.raises(ConfigError, match="'secagg-data-bound' > 0"):
        parse_run_config({"algorithm": "dwf", "secure-aggregation": True})
    with pytest.raises(ConfigError, match="secagg-quantization-range"):
        parse_run_config({"secure-aggregation": True, "secagg-data-bound": 1.0,
                          "secagg-quantization-range": 2**31})
    config = parse_run_config({"algorithm": "minibatch", "secure-aggregation": True,
                               "secagg-data-bound": 1.0})
    assert config.resolved_init == "divisive"  # k-FED (auto) is not a sum; the sum-only start
    assert parse_run_config({"algorithm": "minibatch"}).resolved_init == "kfed"


def test_protocol_range_checks():
    assert secure.check_protocol_range(3, 1000, T) is None
    assert "modulus" in secure.check_protocol_range(256, 10, T)
    # counts exact only while N 2 n_max / T < 1/2
    assert "counts would not be exact" in secure.check_protocol_range(3, T // 12 + 1, T)
    assert secure.check_protocol_range(3, T // 12, T) is None


# --------------------------------------------------------- encoding maths
def test_encoding_error_bound_holds_for_flowers_quantisation():
    """Flower's own quantize/dequantize (what SecAgg+ applies), summed as the workflow
    does: decoded sums are within N 2 s / T of the exact sums, and counts round exactly."""
    rng = np.random.default_rng(0)
    n_sites, n_max = 5, 400_000
    scale = n_max * 16.0
    sums = [rng.uniform(-scale, scale, size=(50, 8)) for _ in range(n_sites)]
    counts = [rng.integers(0, n_max, size=200).astype(float) for _ in range(n_sites)]
    encoded = [[s / scale, c / n_max] for s, c in zip(sums, counts)]
    quantised = [quantize(e, secure.CLIP, T) for e in encoded]
    total = [np.sum([q[i] for q in quantised], axis=0) for i in range(2)]
    # the workflow: dequantise, shift by -(N - 1) c, divide by N (the weight factors' sum)
    mean = [(v - (n_sites - 1) * secure.CLIP) / n_sites for v in dequantize(total, secure.CLIP, T)]
    decoded = secure.decode(mean, ["sums", "counts"], [scale, n_max], n_sites)
    err = np.abs(decoded["sums"] - np.sum(sums, axis=0)).max()
    assert 0 < err < secure.quantisation_error(scale, n_sites, T)
    assert np.array_equal(decoded["counts"], np.sum(counts, axis=0))


def test_site_refuses_values_outside_the_agreed_scale():
    request = json.dumps({"terms": ["wc", "w-int", "n"], "scales": [10.0 * 4, 10.0, 10.0]})
    centroids, weights = np.array([[3.0, 4.0]]), np.array([10])
    encoded = secure.encode("lloyd", protocol.ClusterMeans(centroids, weights), {}, 10, request)
    assert np.allclose(encoded[0], [[0.75, 1.0]]) and np.allclose(encoded[1], [1.0])
    with pytest.raises(secure.SecureAggregationError, match="secagg-data-bound"):
        secure.encode("lloyd", protocol.ClusterMeans(centroids * 2, weights), {}, 10, request)
    # Distributed DP: a noisy value past its (noise-widened) scale is clipped, not refused
    # (a refusal would disclose that the site's value was extreme); a task's own terms
    # replace those derived from its arrays.
    noisy = {"wc": np.array([[-50.0, 3.0]]), "w-int": np.array([-2.5])}
    clipped = secure.encode("lloyd", [], {}, 10, json.dumps({**json.loads(request), "clip": True}),
                            noisy)
    assert np.allclose(clipped[0], [[-1.0, 0.075]]) and np.allclose(clipped[1], [-0.25])
    assert np.allclose(clipped[2], [1.0])  # n, from the site's row count


def test_secure_mod_passes_plain_messages_through():
    """Flower's secaggplus_mod fails on a TRAIN message without SecAgg+ configs; the
    ClientApp's mod hands such a message to the app unchanged."""
    # What a ServerApp process has set before it builds messages (as the harness does).
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, SUPERLINK_NODE_ID
    msg = Message(RecordDict({"fitins.config": ConfigRecord({"task": "describe"})}),
                  dst_node_id=1, message_type=MessageType.TRAIN, group_id="1")
    context = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})
    seen = []

    def app(m, c):
        seen.append(m)
        return Message(RecordDict(), reply_to=m)

    with pytest.raises(KeyError):
        secaggplus_mod(msg, context, app)
    secure_mod(msg, context, app)
    assert seen == [msg] and "secaggplus" not in context.state.config_records


# ------------------------------------------------------- in-process runs
@pytest.mark.parametrize("algorithm, extra", [
    ("dwf", {}),
    ("ewf", {}),
    ("minibatch", {"batch_size": 150}),
    ("ffcm", {}),
])
def test_secure_run_equals_plain(digits, algorithm, extra):
    sites, labels = digits
    # Floor 1 and sites answering from their rows: no site withholds a cluster, so the
    # figures are the pooled rows' (the floor under secure aggregation:
    # test_secure_evaluation_applies_each_sites_floor; groups: the next test).
    config = {**BASE, "algorithm": algorithm, "min_cluster_size": 1, **extra,
              "site_config": {"min-cluster-size": 1}}
    plain_records, secure_records = [], []
    plain = fedcluster.simulate(sites, labels=labels, record_replies=plain_records, **config)
    sec = fedcluster.simulate(sites, labels=labels, record_replies=secure_records,
                              secure_aggregation=True, secagg_data_bound=BOUND, **config)
    # The evaluation's figures are those of the secure run's OWN centroids on the pooled
    # data: sizes exact (integer sums), the score within the quantisation bound, the
    # other figures to 1e-4. (FFCM's centroids differ from the plain run's by the error
    # each round carries into the next, and with them its figures: comparing FFCM's
    # with the plain run's held only by chance.)
    pooled = np.vstack(sites)
    found, sq_dist = ref.assign(pooled, sec.centroids)
    assert sec.metrics["cluster-sizes"] == np.bincount(found, minlength=BASE["n_clusters"]).tolist()
    assert abs(sec.metrics["score"] - sq_dist.mean()) <= score_bound(sites, sec.centroids)
    exact = {"davies-bouldin": skm.davies_bouldin_score(pooled, found),
             "calinski-harabasz": skm.calinski_harabasz_score(pooled, found),
             "simplified-silhouette": ref.simplified_silhouette(pooled, sec.centroids)}
    for key, value in exact.items():
        assert sec.metrics[key] == pytest.approx(value, rel=1e-4), key
    if algorithm != "ffcm":  # the same assignments in every round: equal sizes
        assert sec.metrics["cluster-sizes"] == plain.metrics["cluster-sizes"]
    # the same rounds, but Table 1's profile: one secure round (its bins span the
    # secagg-data-bound box) where the plain run first finds the bins' range
    clustering = lambda r: [h["task"] for h in r.history  # noqa: E731
                            if h["task"] not in ("value_range", "profile")]
    assert clustering(sec) == clustering(plain)
    assert [h["task"] for h in sec.history][-1:] == ["profile"] != clustering(sec)[-1:]
    assert [h["task"] for h in plain.history][-2:] == ["value_range", "profile"]
    assert all(h["sites-answered"] == 3 for h in sec.history)
    # centroids: within the quantisation error, and not bit-equal (really quantised)
    diff = np.abs(sec.centroids - plain.centroids)
    assert 0 < diff.max() < 1e-3
    if algorithm == "dwf":
        n_max = max(len(X) for X in sites)
        sent, W = lloyd_weights(plain_records)[-1]
        assert np.all(diff.max(axis=1) <= dwf_bound(sent, W, n_max, 3))
    # no per-site report and no label metrics (they need each site's own figures)
    assert sec.metrics["per-site"] == {} and "ari" not in sec.metrics and "ari" in plain.metrics

    # What left the sites in the secure rounds: no array, no metric but the site key,
    # the weight factor 1, and SecAgg+'s masked vector (integers mod 2**32).
    secure_tasks = [r for r in secure_records if r["task"] in protocol.SECURE_TASKS]
    assert len(secure_tasks) == 3 * (sum(h["task"] in protocol.SECURE_TASKS for h in sec.history))
    for rec in secure_tasks:
        assert rec["arrays"] == [] and set(rec["metrics"]) == {"site-key"}
        assert rec["num-examples"] == 1 and Key.MASKED_PARAMETERS in rec["secagg"]
    plain_tasks = {t for r in secure_records for t in record_tasks(r)} - set(protocol.SECURE_TASKS)
    assert plain_tasks == {"describe", "bounds"}  # the plain round (describe carried bounds)


def test_secure_run_from_groups_equals_the_plain_run_from_groups(digits):
    """From the sites' groups (their default) a secure run's sums are the plain run's:
    the same centroids up to the quantisation, the same sizes, the same metrics (of the
    groups' partition; group-scatter summed securely too)."""
    sites, labels = digits
    config = {**BASE, "algorithm": "dwf"}
    plain = fedcluster.simulate(sites, labels=labels, **config)
    sec = fedcluster.simulate(sites, labels=labels, secure_aggregation=True,
                              secagg_data_bound=BOUND, **config)
    np.testing.assert_allclose(sec.centroids, plain.centroids, atol=1e-4)
    assert sec.metrics["cluster-sizes"] == plain.metrics["cluster-sizes"]
    for key in ("score", "calinski-harabasz", "simplified-silhouette", "davies-bouldin"):
        assert sec.metrics[key] == pytest.approx(plain.metrics[key], rel=1e-4), key


def test_secure_evaluation_applies_each_sites_floor(digits):
    """With a floor of 50 rows, sites withhold clusters; the secure sum of what they
    disclose equals the plain run's pooled figures (DWF: the same assignments), and the
    withheld rows are missing from the sizes."""
    sites, labels = digits
    config = {**BASE, "algorithm": "dwf", "n_clusters": 10, "min_cluster_size": 50,
              "init_centroids": sites[0][:10]}  # a start that fills every cluster
    plain = fedcluster.simulate(sites, **config)
    sec = fedcluster.simulate(sites, secure_aggregation=True, secagg_data_bound=BOUND, **config)
    assert sec.metrics["cluster-sizes"] == plain.metrics["cluster-sizes"]
    assert sum(sec.metrics["cluster-sizes"]) < sum(len(X) for X in sites)  # some withheld
    for key in ("davies-bouldin", "calinski-harabasz", "simplified-silhouette"):
        assert sec.metrics[key] == pytest.approx(plain.metrics[key], rel=1e-4), key


def test_secure_site_outside_its_bound_stops_the_round(digits):
    sites, _ = digits
    with pytest.raises(FederationError, match="secure aggregation halted"):
        fedcluster.simulate(sites, algorithm="dwf", secure_aggregation=True,
                            secagg_data_bound=4.0, **{**BASE, "num_rounds": 1})


def test_one_site_dropping_out_is_recovered(digits):
    """SecAgg+ drops a site that fails in the masking stage and unmasks the others' sum
    (its shares reconstruct its pairwise masks): the round sums the 3 remaining sites."""
    X, y = load_builtin("digits")
    parts = [X[rows] for rows in partition(y, 4, "iid", seed=0)]
    big = parts[3].copy()
    config = {**BASE, "algorithm": "dwf", "num_rounds": 2, "min_sites": 3}
    # site 3's data break the agreed bound (x 100): its terms would be clipped, so it
    # fails every secure round in the masking stage and SecAgg+ leaves it out
    big *= 100.0
    sec = fedcluster.simulate(parts[:3] + [big], secure_aggregation=True,
                              secagg_data_bound=BOUND, init_centroids=parts[0][:6], **config)
    plain = fedcluster.simulate(parts[:3], init_centroids=parts[0][:6], **config)
    assert [h["sites-answered"] for h in sec.history if h["task"] == "lloyd"] == [3, 3]
    assert all(h["sites-failed"] == 1 for h in sec.history if h["task"] != "describe")
    assert list(sec.metrics["site-failures"]) == ["3"]  # named, though SecAgg+ does not
    assert all("left out of the secure sum" in f for f in sec.metrics["site-failures"]["3"])
    assert sec.metrics["cluster-sizes"] == plain.metrics["cluster-sizes"]
    assert np.abs(sec.centroids - plain.centroids).max() < 1e-3


# ------------------------------------------------------------ real gRPC
def test_dwf_under_secagg_over_real_grpc_equals_plain(tmp_path, numba_cache, digits):
    """Must-show: SecAgg+ DWF over real gRPC (flower-superlink + 3 flower-supernode
    processes on loopback) equals the plain run within the stated error."""
    import flower_processes as fp
    from test_deployment import APP_DIR, py_kwargs, start_federation, write_site_csv

    sites, _ = digits
    paths = {str(i): write_site_csv(tmp_path / f"site-{i}.csv", Xi) for i, Xi in enumerate(sites)}
    # One training round: every secure round is 4 message round trips (setup, share keys,
    # masked vectors, unmask) with a fresh ClientApp process per message at each site.
    config = {"algorithm": "dwf", "n-clusters": 6, "num-rounds": 1, "init": "random",
              "tol": 0.0, "seed": 3, "min-sites": 3, "round-timeout": 120.0}
    out = tmp_path / "outputs"
    started = time.monotonic()
    with fp.sandbox(tmp_path, NUMBA_CACHE_DIR=numba_cache,
                    FEDCLUSTER_CACHE_DIR=tmp_path / "site-cache") as bed:
        start_federation(bed, "secagg", paths, )
        bed.run(APP_DIR, "secagg", {**config, "secure-aggregation": True,
                                    "secagg-data-bound": BOUND, "output-dir": str(out),
                                    "run-name": "secagg"}, timeout=420, log_name="flwr-run")
        log = (bed.log_dir / "flwr-run.log").read_text()
    assert not fp.find_processes(tag=bed.tag, patterns=bed.patterns), "processes left behind"
    print(f"real-gRPC SecAgg+ run: {time.monotonic() - started:.1f} s")

    # SecAgg+ really ran: the training round, the evaluation, Davies-Bouldin's pass and
    # Table 1's profile (one round: its bins span the secagg-data-bound box)
    assert len(re.findall(r"Secure aggregation completed", log)) == 4, log[-3000:]
    model = fedcluster.Model.load(out / "secagg" / "model.json")
    records: list[dict] = []
    plain = fedcluster.simulate(sites, record_replies=records,
                                **py_kwargs(config))
    assert model.metrics["cluster-sizes"] == plain.metrics["cluster-sizes"]
    assert [h["sites-answered"] for h in model.history] == [3] * (len(plain.history) - 1)
    n_max = max(len(X) for X in sites)
    sent, W = lloyd_weights(records)[-1]
    diff = np.abs(model.centroids - plain.centroids).max(axis=1)
    assert np.all(diff <= dwf_bound(sent, W, n_max, 3)), (diff, dwf_bound(sent, W, n_max, 3))
    assert abs(model.metrics["score"] - plain.metrics["score"]) <= score_bound(sites, plain.centroids)


def test_secure_aggregate_is_validated_as_a_whole():
    """Under SecAgg+ only the sum can be checked: a row total that differs from what the
    contributing sites declared, counts beyond their rows, or a non-finite entry make
    the round's sum unusable (the strategy drops it; no site can be named)."""
    from fedcluster.strategies import make_strategy, secure_sum
    from fedcluster.strategies.sites import Site
    from fedcluster.strategies.task_plan import TaskPlan
    from fedcluster.strategies.validation import ReplyError

    config = parse_run_config({"algorithm": "dwf", "n-clusters": 2, "secure-aggregation": True,
                               "secagg-data-bound": 1.0})
    strategy = make_strategy(config)
    strategy.sites = {str(i): Site(str(i), i, 10, 3, [], {}) for i in range(3)}
    C = np.zeros((2, 3))
    plan = TaskPlan("lloyd", arrays=protocol.Centroids(C), secure=(["wc", "w-int", "sse", "n"], [1.0] * 4))
    good = {"wc": np.ones((2, 3)), "w-int": np.array([12.0, 18.0]), "sse": np.array([5.0]),
            "n": np.array([30.0])}
    reply = secure_sum.sum_reply(strategy.round_facts(), plan, good, 3, 30)
    assert reply.n_sites == 3 and reply.n_rows == 30 and reply.metrics["sse"] == 5.0
    np.testing.assert_allclose(reply.arrays[0], [[1 / 12] * 3, [1 / 18] * 3])
    for bad, reason in [({"n": np.array([31.0])}, "declared 30"),
                        ({"w-int": np.array([12.0, 31.0])}, r"outside \[0, 30\]"),
                        ({"wc": np.full((2, 3), np.nan)}, "not finite"),
                        ({"wc": np.ones((3, 3))}, "shape")]:
        with pytest.raises(ReplyError, match=reason):
            secure_sum.sum_reply(strategy.round_facts(), plan, {**good, **bad}, 3, 30)

"""GTVMin k-means over a graph of sites (Jung; ALGORITHMS.md section 6): the kernel
against a slow reference, its two limits (alpha = 0 is local Lloyd; a large alpha makes
the sites agree), the DWF-style benchmark on three graphs, the per-site payloads, and
the site-id and topology checks."""

from __future__ import annotations

import numpy as np
import pytest

import fedcluster
import reference as ref
from fedcluster.common import kernels
from fedcluster.common.datasets import load_builtin, partition
from fedcluster.strategies.topology import TopologyError, build_topology, edges
from fedcluster.strategies.aggregate import gtv_distance


def gtv_rows(result) -> list[dict]:
    """The training rounds (the first gtv round is round 0, local k-means)."""
    return [h for h in result.history if h["task"] == "gtv" and "gtv-per-edge" in h]


# ---------------------------------------------------------------- the kernel
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("alpha", [0.0, 0.3, 1.0, 4.0])
def test_gtv_update_matches_reference(dtype, alpha):
    rng = np.random.default_rng(0)
    X = np.vstack([rng.normal(c, 0.5, (40, 3)) for c in ([0, 0, 0], [4, 0, 0])]).astype(dtype)
    W = np.array([[0.1, 0.0, 0.0], [3.9, 0.1, 0.0], [50.0, 50.0, 50.0]])  # the last: no rows
    N = W[None] + rng.normal(0, 0.3, (3, 3, 3))
    got = kernels.gtv_update(X, W, N, alpha)
    want = ref.gtv_update(X, W, N, alpha)
    rtol = 1e-6 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(got[0], want[0], rtol=rtol, atol=1e-9)
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_allclose(got[2:], want[2:], rtol=rtol)
    assert got[1][2] == 0
    if alpha == 0.0:  # no local rows and no pull: it stays
        np.testing.assert_array_equal(got[0][2], W[2])
    else:  # moved by the neighbours' copies of it alone (no local row)
        pulls = [Nj[np.argmin(((Nj - W[2]) ** 2).sum(1))] for Nj in N]
        assert not np.allclose(got[0][2], W[2])
        assert np.linalg.norm(got[0][2] - np.mean(pulls, axis=0)) < 0.5


def test_gtv_update_leaves_small_clusters_local_rows_out():
    X = np.array([[0.0], [0.2], [10.0]])  # the cluster at 10 has one row
    W = np.array([[0.0], [9.0]])
    N = np.array([[[0.0], [8.0]]])
    W_new, counts, _, _ = kernels.gtv_update(X, W, N, 1.0, floor=2)
    want = ref.gtv_update(X, W, N, 1.0, floor=2)[0]
    np.testing.assert_allclose(W_new, want)
    assert counts.tolist() == [2, 1]
    assert W_new[1, 0] == pytest.approx(8.0)  # from the neighbour only, not the row at 10


def test_gtv_distance_is_zero_exactly_for_equal_sets():
    W = np.array([[0.0, 1.0], [2.0, 3.0]])
    assert gtv_distance(W, W[::-1]) == 0.0
    assert gtv_distance(W, W + [0.0, 0.5]) == pytest.approx(4 * 0.25)


# ---------------------------------------------------------------- the limits
def test_alpha_zero_is_local_lloyd_at_each_site():
    rng = np.random.default_rng(1)
    sites = [np.vstack([rng.normal(c, 0.6, (30 + 10 * i, 2)) for c in ([0, 0], [5, 1], [1, 5])])
             for i in range(3)]
    C0 = np.array([[1.0, 1.0], [4.0, 0.0], [0.0, 4.0]])
    r = fedcluster.simulate(sites, algorithm="gtv", alpha=0.0, n_clusters=3, init_centroids=C0,
                            num_rounds=50, tol=0.0, min_sites=3, min_cluster_size=1)
    for i, X in enumerate(sites):
        want = C0
        for _ in range(50):
            want = ref.gtv_update(X, want, np.zeros((0, 3, 2)), 0.0)[0]
        np.testing.assert_allclose(r.model.site_centroids[str(i)], want, atol=1e-12)


def test_large_alpha_on_complete_graph_makes_sites_agree():
    X, y = load_builtin("blobs", seed=3)
    sites = [X[rows] for rows in partition(y, 5, "dirichlet:0.5", seed=3)]
    r = fedcluster.simulate(sites, algorithm="gtv", alpha=1e6, n_clusters=5, topology="complete",
                            num_rounds=60, tol=0.0, min_sites=5, seed=3)
    variance = float(X.var(0).sum())
    assert r.metrics["gtv-per-edge"] < 1e-6 * variance
    W = list(r.model.site_centroids.values())
    assert max(gtv_distance(W[0], Wi) for Wi in W[1:]) < 1e-6 * variance


# ------------------------------------------------- the DWF-style benchmark
@pytest.fixture(scope="module")
def blobs_iid():
    X, y = load_builtin("blobs", seed=0)  # 5 blobs + 100 uniform noise points
    return X, [X[rows] for rows in partition(y, 10, "iid", seed=0)]


@pytest.mark.parametrize("topology", ["complete", "ring", "random:0.3"])
def test_gtv_falls_and_consensus_is_near_central(blobs_iid, topology):
    from sklearn.cluster import KMeans

    X, sites = blobs_iid
    # (the best site's consensus, not refined; the default is tested below)
    # (and the groups as training counts them, as the sites' scores are: the report's
    # groups, the default, count rows where the model puts them)
    r = fedcluster.simulate(sites, algorithm="gtv", n_clusters=5, topology=topology,
                            num_rounds=20, min_sites=10, seed=0, consensus="best-site",
                            consensus_rounds=0, report_groups=False)
    per_edge = [h["gtv-per-edge"] for h in gtv_rows(r)]
    assert per_edge[-1] < 0.8 * per_edge[0], per_edge
    assert max(per_edge[len(per_edge) // 2:]) < per_edge[0], per_edge  # no way back up
    central = KMeans(5, n_init=10, random_state=0).fit(X).inertia_ / len(X)
    assert r.metrics["score"] <= 1.02 * central
    # the consensus is the best site's centroids, scored on the pooled data
    best = r.metrics["consensus-site"]
    np.testing.assert_allclose(r.centroids, r.model.site_centroids[best])
    assert r.metrics["site-scores"][best] == pytest.approx(r.metrics["score"], rel=1e-12)
    assert r.metrics["site-scores"][best] == min(r.metrics["site-scores"].values())


def test_refining_rounds_take_the_consensus_to_central_on_label_skewed_sites():
    """On label-skewed sites no site's centroids fit the federation (each site has seen
    some clusters only): the best site's consensus is far above central k-means. The
    default (k-means of the sites' centroids weighted by members, refined by federated
    Lloyd rounds) reaches central k-means' score, below every site's own."""
    from sklearn.cluster import KMeans

    X, y = load_builtin("blobs", seed=3)
    sites = [X[rows] for rows in partition(y, 6, "dirichlet:0.3", seed=3)]
    config = dict(algorithm="gtv", n_clusters=5, topology="ring", min_sites=6, seed=0)
    chosen = fedcluster.simulate(sites, consensus="best-site", consensus_rounds=0, **config)
    refined = fedcluster.simulate(sites, **config)
    central = KMeans(5, n_init=10, random_state=0).fit(X).inertia_ / len(X)
    lloyd = [h for h in refined.history if h["task"] == "lloyd"]
    assert 1 <= len(lloyd) <= 10 and not any(h["task"] == "lloyd" for h in chosen.history)
    assert refined.metrics["score"] <= min(refined.metrics["site-scores"].values())
    assert refined.metrics["score"] <= 1.01 * central
    assert chosen.metrics["score"] > 1.01 * central  # what the refining rounds are for


def test_kmeans_consensus_and_per_round_pooled_scores(blobs_iid):
    X, sites = blobs_iid
    r = fedcluster.simulate(sites, algorithm="gtv", n_clusters=5, topology="ring",
                            consensus="kmeans", eval_every=1, num_rounds=4, tol=0.0,
                            min_sites=10)
    pooled = [h for h in r.history if h["task"] == "evaluate_sets"]
    assert len(pooled) == 4  # after rounds 1-3 (eval-every), and the final one after round 4
    assert all(h["pooled-score-best"] <= h["pooled-score-mean"] <= h["pooled-score-worst"]
               for h in pooled)
    # the run's score is its groups' partition's; labelled row by row the rows score less
    on_rows = fedcluster.Model(r.centroids, "gtv").score(X)
    np.testing.assert_allclose(r.metrics["score-on-rows"], on_rows, rtol=1e-10)
    assert on_rows <= r.metrics["score"] <= 1.01 * on_rows


# ------------------------------------------------------ what the server relays
def test_each_site_receives_only_its_neighbours_centroids():
    rng = np.random.default_rng(2)
    sites = [rng.normal(i, 1.0, (40, 2)) for i in range(5)]
    sent = []
    r = fedcluster.simulate(sites, algorithm="gtv", n_clusters=2, topology="ring",
                            num_rounds=3, tol=0.0, min_sites=5, record_replies=sent)
    neighbours = build_topology("ring", [str(i) for i in range(5)], 0)
    node_site = {rec["node-id"]: rec["metrics"]["site-key"] for rec in sent}
    rounds = [[rec for rec in sent if rec["task"] == "gtv"][i:i + 5] for i in range(0, 20, 5)]
    for before, now in zip(rounds, rounds[1:]):
        reply = {node_site[rec["node-id"]]: rec["arrays"][0] for rec in before}
        payloads = {}
        for rec in now:
            key = node_site[rec["node-id"]]
            own, theirs = rec["sent"]
            np.testing.assert_array_equal(own, reply[key])
            want = np.stack([reply[j] for j in neighbours[key]])
            np.testing.assert_array_equal(theirs, want)  # exactly the neighbours', in order
            payloads[key] = theirs
        assert len({p.tobytes() for p in payloads.values()}) == 5  # a different payload each
    assert r.model.site_centroids.keys() == {str(i) for i in range(5)}


# ------------------------------------------------------ ids and topologies
def test_topologies_are_connected_and_seeded():
    ids = [str(i) for i in range(12)]
    ring = build_topology("ring", ids, 0)
    assert all(len(v) == 2 for v in ring.values()) and len(edges(ring)) == 12
    assert len(edges(build_topology("complete", ids, 0))) == 66
    knn = build_topology("knn:4", ids, 5)
    assert all(len(v) == 4 for v in knn.values())
    assert knn == build_topology("knn:4", ids, 5) != build_topology("knn:4", ids, 6)
    er = build_topology("random:0.2", ids, 1)
    assert er == build_topology("random:0.2", ids, 1)
    assert all(b in er[a] for a in er for b in er[a] if a in er[b])  # symmetric


def test_edge_lists_and_disconnected_graphs(tmp_path):
    ids = ["a", "b", "c", "d"]
    path = tmp_path / "edges.txt"
    path.write_text("# hospital links\na b\nb,c\nc d  # the last\n")
    assert build_topology(f"edges:{path}", ids, 0) == {
        "a": ["b"], "b": ["a", "c"], "c": ["b", "d"], "d": ["c"]}
    path.write_text("a b\nc d\n")
    with pytest.raises(TopologyError, match=r"not connected.*2 parts.*\{a, b\}; \{c, d\}"):
        build_topology(f"edges:{path}", ids, 0)
    path.write_text("a b\nb e\n")
    with pytest.raises(TopologyError, match="line 2: unknown site 'e'"):
        build_topology(f"edges:{path}", ids, 0)
    with pytest.raises(TopologyError, match="cannot be read"):
        build_topology(f"edges:{tmp_path / 'missing.txt'}", ids, 0)
    with pytest.raises(TopologyError, match="no connected graph"):
        build_topology("random:0.0001", [str(i) for i in range(30)], 0)


@pytest.mark.parametrize("bad", ["star", "knn:0", "random:2", "ring:3", "edges:"])
def test_bad_topology_is_a_config_error(bad):
    from fedcluster.common.config import ConfigError

    with pytest.raises(ConfigError, match="topology"):
        fedcluster.simulate([np.zeros((5, 2))] * 2, algorithm="gtv", topology=bad)


def test_gtv_needs_site_ids():
    from fedcluster import client_app
    from fedcluster.client_app.data.site_data import SiteData
    from fedcluster.simulation import run_in_process
    from fedcluster.strategies import FederationError

    rng = np.random.default_rng(3)
    client_app.MEMORY_SITES["ids"] = [SiteData(rng.normal(size=(30, 2)), None, None, f"s{i}")
                                      for i in range(3)]
    try:
        nodes = [{"data-path": "memory://ids/0", "site-id": "a"},
                 {"data-path": "memory://ids/1"},  # no site-id
                 {"data-path": "memory://ids/2", "site-id": "a"}]  # duplicate
        with pytest.raises(FederationError) as err:
            run_in_process(nodes, {"algorithm": "gtv", "n-clusters": 2, "min-sites": 2,
                                   "output-dir": ""})
        assert "needs a stable site id: set `site-id`" in str(err.value)
        assert "duplicate site id 'a'" in str(err.value)
    finally:
        client_app.MEMORY_SITES.pop("ids")

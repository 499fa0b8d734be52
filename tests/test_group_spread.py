"""Groups split by their per-feature spread (issue 45; ``common/kernels/spread.py``).

The maths: far from a boundary a group is assigned whole, exactly as the hard kernel
assigns it; near one, its figures are the expected ones of the Gaussian with its moments
(checked against a large seeded sample of that Gaussian); rows, sums and the SSE add up.
What it discloses, tried as a coordinator would against the real ClientApp: at p_site 3 a
boundary laid through a group reads its per-feature spread (two sites whose groups share
count, mean and total scatter but not the spread per feature answer differently); at
p_site 2 the same two sites answer alike (a group of two rows keeps its spread per feature
to itself, since it would give both rows' values back). That rows reflected through their
group's mean (the same spreads) give identical replies at p_site 3 is
``test_indistinguishable.py``'s.
"""

from __future__ import annotations

import uuid

import numpy as np
import pytest
from flwr.common import Context, RecordDict

from fedcluster import client_app as client_module
from fedcluster.client_app.app import SiteClient
from fedcluster.client_app.data.site_data import SiteData
from fedcluster.common import kernels
from fedcluster.common.config import run_config_defaults
from fedcluster.common.kernels.spread import spread_lloyd_stats


def _groups(rng, G=40, d=3, k=4):
    C = rng.normal(0, 10, (k, d))
    means = C[rng.integers(0, k, G)] + rng.normal(0, 0.5, (G, d))
    w = rng.integers(3, 7, G)
    var = rng.uniform(0.01, 0.2, (G, d))
    return means, C, w, var, (var * w[:, None]).sum(axis=1)


def test_groups_far_from_every_boundary_are_assigned_whole_exactly():
    rng = np.random.default_rng(0)
    means, C, w, var, scatter = _groups(rng)
    var = var / 100  # (each group's spread small against its distance to every boundary)
    scatter = (var * w[:, None]).sum(axis=1)
    sums, counts, sse = spread_lloyd_stats(means, C, w, var, scatter)
    hard_sums, hard_counts, hard_sse = kernels.lloyd_stats(means, C, w, scatter)
    np.testing.assert_array_equal(counts, hard_counts)
    np.testing.assert_allclose(sums, hard_sums, rtol=1e-13)
    assert sse == pytest.approx(hard_sse, rel=1e-13)


def test_a_straddling_group_counts_as_its_gaussian_would():
    """k = 2, one group across the boundary: the expected share, sums and SSE of its
    Gaussian N(mean, diag var), against 4,000,000 seeded draws assigned one by one."""
    C = np.array([[0.0, 0.0], [2.0, 0.5]])
    mean, var, w = np.array([[0.8, 0.1]]), np.array([[0.3, 0.05]]), np.array([5])
    sums, counts, sse = spread_lloyd_stats(mean, C, w, var, (var * w).sum(axis=1))
    draws = np.random.default_rng(1).normal(mean[0], np.sqrt(var[0]), (4_000_000, 2))
    d2 = ((draws[:, None, :] - C[None]) ** 2).sum(-1)
    label = d2.argmin(axis=1)
    share = np.bincount(label, minlength=2) / len(draws)
    np.testing.assert_allclose(counts, w[0] * share, atol=5e-3 * w[0])
    for c in range(2):
        np.testing.assert_allclose(sums[c], w[0] * draws[label == c].sum(axis=0) / len(draws),
                                   atol=5e-3 * w[0])
    assert sse == pytest.approx(w[0] * d2.min(axis=1).mean(), rel=2e-3)
    assert 0.2 < counts[1] / w[0] < 0.8  # (the group really straddles)


def test_rows_sums_and_sse_add_up():
    rng = np.random.default_rng(2)
    means, C, w, var, scatter = _groups(rng, G=300, k=6)
    C = C + rng.normal(0, 3, C.shape)  # boundaries through the groups
    var = var * 40
    scatter = (var * w[:, None]).sum(axis=1)
    sums, counts, sse = spread_lloyd_stats(means, C, w, var, scatter)
    hard_sse = kernels.lloyd_stats(means, C, w, scatter)[2]
    assert counts.sum() == pytest.approx(w.sum(), rel=1e-12)
    np.testing.assert_allclose(sums.sum(axis=0), (means * w[:, None]).sum(axis=0), atol=1e-9)
    assert not np.allclose(counts, np.round(counts))  # some groups were split
    assert sse <= hard_sse  # each split group's rows go to the nearer of two centroids


# ------------------------------------------------------------- against the real ClientApp
def _clumps(offsets: np.ndarray, n: int = 12) -> SiteData:
    """n clumps of len(offsets) rows far apart (the grouping takes each clump whole)."""
    centres = np.array([[64.0 * i, 64.0 * (i % 3)] for i in range(n)])
    X = np.vstack([c + offsets for c in centres])
    return SiteData(np.ascontiguousarray(X), ("f0", "f1"), None, "site")


def _lloyd_reply(site: SiteData, floor: int, C: np.ndarray, task: str = "lloyd", **params):
    token = uuid.uuid4().hex
    client_module.MEMORY_SITES[token] = [site]
    context = Context(run_id=7, node_id=11, state=RecordDict(), run_config=run_config_defaults(),
                      node_config={"data-path": f"{client_module.MEMORY_PREFIX}{token}/0",
                                   "site-id": "target", "min-cluster-size": floor})
    try:
        out, _, metrics = SiteClient(context).fit(
            [C] if C is not None else [],
            {"task": task, "local-iters": 1, "tol": 0.0, "min-cluster-size": 1, **params})
    finally:
        client_module.MEMORY_SITES.pop(token, None)
    assert "error" not in metrics, metrics
    return [np.asarray(a) for a in out], metrics


@pytest.mark.parametrize("floor, offsets_a, offsets_b", [
    # three rows: spread along f0 only, or along f1 only (same mean, same total scatter)
    (3, [[-1.0, 0.0], [0.0, 0.0], [1.0, 0.0]], [[0.0, -1.0], [0.0, 0.0], [0.0, 1.0]]),
    # two rows: the same contrast
    (2, [[-1.0, 0.0], [1.0, 0.0]], [[0.0, -1.0], [0.0, 1.0]]),
], ids=["p3", "p2"])
def test_what_a_boundary_through_a_group_reads(floor, offsets_a, offsets_b):
    """A coordinator lays the boundary between two centroids through the first clump, at
    right angles to f0 (the other clumps lie far from every centroid but the second)."""
    A, B = _clumps(np.array(offsets_a)), _clumps(np.array(offsets_b))
    C = np.array([[-1.0, 0.0], [1.0, 0.0], [400.0, 64.0]])
    reply_a, metrics_a = _lloyd_reply(A, floor, C)
    reply_b, metrics_b = _lloyd_reply(B, floor, C)
    if floor == 3:
        # the spread along f0 splits A's clump between the two centroids; B's, with no
        # spread along f0, goes whole to the nearer: the per-feature spread is disclosed
        assert metrics_a["sse"] != metrics_b["sse"]
        assert not all(np.array_equal(a, b) for a, b in zip(reply_a, reply_b))
    else:
        # at p_site 2 the groups are assigned whole: only count, mean and total scatter
        assert metrics_a["sse"] == metrics_b["sse"]
        assert all(np.array_equal(a, b) for a, b in zip(reply_a, reply_b))


def test_rows_reflected_through_their_group_mean_give_identical_replies_at_p3():
    """Clumps of three dyadic rows (exact sums and squares); B's rows are A's reflected
    through their clump's mean: each group keeps its count, mean and per-feature spread,
    so every training task that uses the groups' spread (split by it, or FFCM's
    softening by it) answers B as A, bit for bit, while a site whose spread lies along
    the other feature is told apart."""
    offsets = np.array([[0.75, -0.5], [-0.25, 1.25], [-0.5, -0.75]])
    A, B, other = _clumps(offsets), _clumps(-offsets), _clumps(offsets[:, ::-1])
    through = np.array([[-0.3, 0.1], [0.4, -0.2], [64.5, 64.0], [128.0, 128.5]])
    messages = [("lloyd", through, {}), ("lloyd", through, {"local-iters": 3}),
                ("prune_lloyd", through, {"local-iters": 2}),
                ("local_kmeans", None, {"k-local": 14, "seed": 3}),
                ("minibatch", through, {"epochs": 2, "batch-size": 9, "beta": 0.5, "seed": 1}),
                ("fcm", through, {"fuzzifier": 2.0, "local-iters": 2}),
                ("gtv", None, {"alpha": 1.0, "local-iters": 3, "n-clusters": 4, "seed": 2})]
    told_apart = 0
    for task, C, params in messages:
        reply_a = _lloyd_reply(A, 3, C, task, **params)
        reply_b = _lloyd_reply(B, 3, C, task, **params)
        assert all(np.array_equal(a, b) for a, b in zip(reply_a[0], reply_b[0])), task
        assert reply_a[1] == reply_b[1], task
        reply_other = _lloyd_reply(other, 3, C, task, **params)
        told_apart += not all(np.array_equal(a, b) for a, b in zip(reply_a[0], reply_other[0]))
    assert told_apart >= 4  # (the messages do split groups by their spread)


@pytest.mark.parametrize("algorithm", ["dwf", "ewf", "minibatch", "fkm", "kfed", "ffcm", "gtv"])
def test_every_algorithm_runs_on_groups_split_by_their_spread(algorithm):
    """Sites at p_site 4 (groups split in training; the evaluation keeps them whole):
    every algorithm runs to its end with every site answering every round, and no
    reply counts more rows than its site holds."""
    import fedcluster

    rng = np.random.default_rng(5)
    centres = rng.normal(0, 4, (4, 3))
    sites = [np.vstack([rng.normal(c, 1.0, (30, 3)) for c in centres]) for _ in range(3)]
    result = fedcluster.simulate(sites, algorithm=algorithm, n_clusters=4, seed=1,
                                 central_baseline=False, site_config={"min-cluster-size": 4})
    assert not result.metrics.get("site-failures"), result.metrics.get("site-failures")
    assert np.isfinite(result.centroids).all()
    answered = [h["sites-answered"] for h in result.history if "sites-answered" in h]
    assert answered and all(a == 3 for a in answered)
    assert sum(s["n-rows"] for s in result.metrics["per-site"].values()) == 360


def test_a_kmeans_run_stops_on_a_stalled_score_only_where_a_site_splits_groups():
    """Split groups move the centroids a little every round: the k-means strategies then
    also stop when the score stalls (score-tol 0's meaning), and keep the movement rule
    alone where every site assigns groups whole (p_site 1 or 2)."""
    from types import SimpleNamespace as NS

    from fedcluster.strategies import stopping

    def sites(sizes):
        return {str(i): NS(group_size=g) for i, g in enumerate(sizes)}

    assert stopping.default_score_tol(None, sites([2, 3])) == stopping.SPLIT_SCORE_TOL > 0
    assert stopping.default_score_tol(None, sites([2, 1, None])) == 0.0
    assert stopping.default_score_tol(1e-5, sites([5])) == 1e-5  # (FFCM's own)

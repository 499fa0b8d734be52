"""DWF with every site, local-iters 1, eta 1, mu 0 IS central Lloyd (ALGORITHMS.md sec. 1):
on the sites' groups, central WEIGHTED Lloyd on the pooled group tables (each group a
point at its mean, weighted by its rows, assigned whole) from the same start; with
every site answering from its rows (min-cluster-size 1), central Lloyd on the rows.
And DWF beats EWF on a non-IID split."""

import numpy as np
import pytest

import fedcluster
from fedcluster.client_app.data import group_table
from fedcluster.client_app.data.site_data import SiteData
from fedcluster.common.datasets import load_builtin, partition


def central_lloyd(X, C, n_iter):
    """Plain numpy Lloyd; an empty cluster keeps its centroid."""
    C = C.copy()
    for _ in range(n_iter):
        labels = ((X[:, None, :] - C[None]) ** 2).sum(-1).argmin(1)
        for j in range(len(C)):
            if np.any(labels == j):
                C[j] = X[labels == j].mean(0)
    return C


@pytest.fixture(scope="module")
def split_digits():
    X, y = load_builtin("digits")
    parts = partition(y, 4, "dirichlet:0.5", seed=3)
    return X, [X[rows] for rows in parts]


def central_weighted_lloyd(means, counts, C, n_iter):
    """Plain numpy Lloyd on points weighted by their rows; an empty cluster keeps its centroid."""
    C = C.copy()
    for _ in range(n_iter):
        labels = ((means[:, None, :] - C[None]) ** 2).sum(-1).argmin(1)
        for j in range(len(C)):
            if np.any(labels == j):
                C[j] = (means[labels == j] * counts[labels == j, None]).sum(0) / counts[labels == j].sum()
    return C


def pooled_groups(sites, p_site=2):
    """Every site's group table at p_site, pooled: (means, counts, scatter)."""
    tables = [group_table.site_groups(SiteData(X, None, None, f"site {i}"), p_site)[0]
              for i, X in enumerate(sites)]
    return (np.vstack([np.asarray(t.means) for t in tables]),
            np.concatenate([np.asarray(t.counts) for t in tables]),
            np.concatenate([np.asarray(t.scatter) for t in tables]))


def _each_rounds_centroids(replies: list, n_sites: int, rounds: int) -> list[np.ndarray]:
    """The centroids the strategy held before each training round, as every site received
    them with the round's ``lloyd`` task (one run: round r's are the model after r - 1
    rounds, as an (r - 1)-round run would end; each round's tasks every site's, alike)."""
    out = []
    for r in sorted({e["params"]["round"] for e in replies if e["task"] == "lloyd"}):
        received = [e["sent"][0] for e in replies if e["task"] == "lloyd" and e["params"]["round"] == r]
        assert len(received) == n_sites and all(np.array_equal(c, received[0]) for c in received)
        out.append(received[0])
    assert len(out) == rounds
    return out


DWF_AS_LLOYD = dict(n_clusters=8, local_iters=1, learning_rate=1.0, momentum=0.0, fraction=1.0,
                    tol=0.0, min_cluster_size=1, min_sites=4)


def test_dwf_on_groups_is_central_weighted_lloyd_on_the_pooled_group_tables(split_digits):
    # (a jitter of 1e-6: digits' integer pixels put group means at exactly equal distances
    # from two centroids, where the last bits of two ways of computing a distance decide)
    _, sites = split_digits
    rng = np.random.default_rng(5)
    sites = [S + rng.normal(0, 1e-6, S.shape) for S in sites]
    X = np.vstack(sites)
    means, counts, scatter = pooled_groups(sites)
    assert counts.min() >= 2 and counts.sum() == len(X)
    C0 = X[np.random.default_rng(0).choice(len(X), 8, replace=False)]
    replies = []
    result = fedcluster.simulate(sites, init_centroids=C0, num_rounds=10, record_replies=replies,
                                 report_groups=False, **DWF_AS_LLOYD)
    for done, centroids in enumerate(_each_rounds_centroids(replies, n_sites=4, rounds=10)):
        expected = central_weighted_lloyd(means, counts, C0, done)
        np.testing.assert_allclose(centroids, expected, rtol=0, atol=1e-9)
    expected = central_weighted_lloyd(means, counts, C0, 10)
    np.testing.assert_allclose(result.centroids, expected, rtol=0, atol=1e-9)
    # the federated score is the exact score of the groups' partition: each group's
    # scatter plus its rows' squared distance from its mean to its centroid
    d2 = ((means[:, None, :] - result.centroids[None]) ** 2).sum(-1).min(1)
    assert result.metrics["score"] == pytest.approx((scatter + counts * d2).sum() / len(X), rel=1e-12)
    # and the rows labelled one by one score at most that (the model's own score)
    on_rows = ((X[:, None, :] - result.centroids[None]) ** 2).sum(-1).min(1).mean()
    assert result.metrics["score-on-rows"] == pytest.approx(on_rows, rel=1e-12)
    assert on_rows <= result.metrics["score"]
    # the report's groups (the default): the same model, its score the rows' own but for
    # the rows of straddlers a site keeps whole (their parts' spreads exact in sum)
    reported = fedcluster.simulate(sites, init_centroids=C0, num_rounds=10, **DWF_AS_LLOYD)
    np.testing.assert_array_equal(reported.centroids, result.centroids)
    gap = abs(reported.metrics["score"] - on_rows)
    assert gap < 0.1 * (result.metrics["score"] - on_rows)


def test_dwf_reproduces_central_lloyd_every_round_when_sites_answer_from_rows(split_digits):
    X, sites = split_digits
    C0 = X[np.random.default_rng(0).choice(len(X), 8, replace=False)]
    replies = []
    result = fedcluster.simulate(sites, init_centroids=C0, num_rounds=10, record_replies=replies,
                                 site_config={"min-cluster-size": 1}, **DWF_AS_LLOYD)
    for done, centroids in enumerate(_each_rounds_centroids(replies, n_sites=4, rounds=10)):
        np.testing.assert_allclose(centroids, central_lloyd(X, C0, done), rtol=0, atol=1e-10)
    np.testing.assert_allclose(result.centroids, central_lloyd(X, C0, 10), rtol=0, atol=1e-10)
    # and the federated score is the exact pooled score
    d2 = ((X[:, None, :] - result.centroids[None]) ** 2).sum(-1).min(1)
    assert result.metrics["score"] == pytest.approx(d2.mean(), rel=1e-12)


def test_dwf_beats_ewf_on_non_iid_split():
    X, y = load_builtin("blobs", seed=1)
    parts = partition(y, 5, "by-label", seed=1)
    sites = [X[rows] for rows in parts]
    common = dict(n_clusters=5, num_rounds=8, init="random", seed=2, min_sites=5, tol=0.0)
    dwf = fedcluster.simulate(sites, algorithm="dwf", **common)
    ewf = fedcluster.simulate(sites, algorithm="ewf", **common)
    assert dwf.metrics["score"] < 0.8 * ewf.metrics["score"]


def test_dwf_on_groups_split_by_their_spread_is_each_sites_split_step_averaged_by_whole_rows(split_digits):
    """At p_site >= 3 a site's Lloyd step splits a group near a boundary by its spread
    (privacy model, "A group's spread"): DWF (local-iters 1, eta 1, mu 0) is then, round
    by round, each site's split step (its expected sums over its expected rows) averaged
    with the weights it sends, its expected rows rounded to whole rows, a cluster under
    the site's floor sent with weight 0; written here from the formulas
    (``spread_reference``)."""
    from spread_reference import split_stats, whole_rows

    _, sites = split_digits
    rng = np.random.default_rng(5)
    sites = [S + rng.normal(0, 1e-6, S.shape) for S in sites]
    p = 4
    tables = [group_table.site_groups(SiteData(X, None, None, f"site {i}"), p)[0]
              for i, X in enumerate(sites)]
    parts = [(np.asarray(t.means), np.asarray(t.counts, dtype=float),
              np.asarray(t.m2) / np.asarray(t.counts)[:, None]) for t in tables]
    C0 = np.vstack(sites)[np.random.default_rng(0).choice(sum(map(len, sites)), 8, replace=False)]
    expected, split_somewhere = C0.copy(), False
    for rounds in range(1, 6):
        total, weight = np.zeros_like(C0), np.zeros(len(C0))
        for means, sizes, variances in parts:
            sums, counts = split_stats(means, sizes, variances, expected)
            split_somewhere |= not np.allclose(counts, np.round(counts))
            w = whole_rows(counts)
            w[w < p] = 0  # the site's floor
            local = np.where(counts[:, None] > 0, sums / np.where(counts > 0, counts, 1.0)[:, None], expected)
            total += w[:, None] * local
            weight += w
        expected = np.where(weight[:, None] > 0, total / np.where(weight > 0, weight, 1.0)[:, None], expected)
        result = fedcluster.simulate(sites, init_centroids=C0, num_rounds=rounds,
                                     site_config={"min-cluster-size": p}, report_groups=False,
                                     **DWF_AS_LLOYD)
        np.testing.assert_allclose(result.centroids, expected, rtol=0, atol=1e-9)
    assert split_somewhere

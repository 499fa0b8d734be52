"""DWF with every site, local-iters 1, eta 1, mu 0 IS central Lloyd (ALGORITHMS.md sec. 1),
and DWF beats EWF on a non-IID split.

Exact Lloyd needs every cluster's own statistics, so these runs turn the sites'
differencing guard off (``differencing_guard=False``; docs/explanation/privacy-model.md):
with it on, a cluster whose rows differ from an earlier reported one's by fewer than p is
reported as that earlier set, a row's worth off Lloyd."""

import numpy as np
import pytest

import fedcluster
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


def test_dwf_reproduces_central_lloyd_every_round(split_digits):
    X, sites = split_digits
    C0 = X[np.random.default_rng(0).choice(len(X), 8, replace=False)]
    config = dict(n_clusters=8, local_iters=1, learning_rate=1.0, momentum=0.0, fraction=1.0,
                  tol=0.0, min_cluster_size=1, min_sites=4)
    for rounds in range(1, 11):
        result = fedcluster.simulate(sites, init_centroids=C0, num_rounds=rounds,
                                     differencing_guard=False, **config)
        expected = central_lloyd(X, C0, rounds)
        np.testing.assert_allclose(result.centroids, expected, rtol=0, atol=1e-10)
    # and the federated score is the exact pooled score
    d2 = ((X[:, None, :] - result.centroids[None]) ** 2).sum(-1).min(1)
    assert result.metrics["score"] == pytest.approx(d2.mean(), rel=1e-12)


def test_dwf_beats_ewf_on_non_iid_split():
    X, y = load_builtin("blobs", seed=1)
    parts = partition(y, 5, "by-label", seed=1)
    sites = [X[rows] for rows in parts]
    common = dict(n_clusters=5, num_rounds=8, init="random", seed=2, min_sites=5, tol=0.0,
                  site_config={"allow-minmax": True})  # init random: the sites' min/max
    dwf = fedcluster.simulate(sites, algorithm="dwf", **common)
    ewf = fedcluster.simulate(sites, algorithm="ewf", **common)
    assert dwf.metrics["score"] < 0.8 * ewf.metrics["score"]

"""Server reductions against hand-computed cases."""

import numpy as np
import pytest

from fedcluster.strategies.aggregate import (
    bounding_box_init,
    fuzzy_on_centroids,
    kmeans_on_centroids,
    momentum_step,
    site_weighted_mean,
)


def test_dwf_weights_by_counts_and_ewf_equally():
    C = np.array([[[0.0, 0.0], [10.0, 10.0]], [[4.0, 0.0], [20.0, 10.0]]])  # 2 sites, k=2
    w = np.array([[3, 1], [1, 0]])
    dwf = site_weighted_mean(C, w, dynamic=True)
    # cluster 0: (3*0 + 1*4)/4 = 1; cluster 1: only site 0 has members.
    np.testing.assert_allclose(dwf, [[1.0, 0.0], [10.0, 10.0]])
    ewf = site_weighted_mean(C, w, dynamic=False)
    np.testing.assert_allclose(ewf, [[2.0, 0.0], [15.0, 10.0]])


def test_dwf_cluster_no_site_reports_uses_equal_weights():
    # ALGORITHMS.md: lambda_ij = 1/|I_t| when s_j = 0. With local-iters 1 a site sends the
    # received centroid for an empty cluster, so the cluster keeps its centroid.
    C = np.array([[[1.0], [5.0]], [[3.0], [5.0]]])
    w = np.array([[2, 0], [2, 0]])
    np.testing.assert_allclose(site_weighted_mean(C, w, dynamic=True), [[2.0], [5.0]])


def test_momentum_step_hand_computed():
    C, D, C_old = np.array([[1.0]]), np.array([[3.0]]), np.array([[0.0]])
    # 1 + 0.5 * (3 - 1) + 0.8 * (1 - 0) = 2.8
    np.testing.assert_allclose(momentum_step(C, D, C_old, 0.5, 0.8), [[2.8]])
    np.testing.assert_allclose(momentum_step(C, D, C, 1.0, 0.0), D)


def test_kmeans_on_centroids_finds_groups_and_weights_matter():
    pts = np.array([[0.0], [1.0], [10.0], [11.0]])
    got = np.sort(kmeans_on_centroids(pts, 2, seed=0).ravel())
    np.testing.assert_allclose(got, [0.5, 10.5])
    w = np.array([3.0, 1.0, 1.0, 1.0])
    got = np.sort(kmeans_on_centroids(pts, 2, seed=0, weights=w).ravel())
    np.testing.assert_allclose(got, [0.25, 10.5])


def test_kmeans_on_centroids_too_few_points():
    with pytest.raises(ValueError, match="2 distinct local centroids, fewer than the k = 3"):
        kmeans_on_centroids(np.array([[0.0], [0.0], [1.0]]), 3, seed=0)


def _weighted_fcm(points, weights, C, m, iters=2000):
    """Weighted fuzzy c-means written out here (Bezdek's memberships, computed from
    distance ratios: a k-means++ seed sits on a point), and its J_m."""
    def memberships(C):
        d2 = np.maximum(((points[:, None] - C[None]) ** 2).sum(-1), 1e-300)
        u = (d2.min(1, keepdims=True) / d2) ** (1 / (m - 1))
        return u / u.sum(1, keepdims=True), d2

    for _ in range(iters):
        um = weights[:, None] * memberships(C)[0] ** m
        C = (um.T @ points) / um.sum(0)[:, None]
    u, d2 = memberships(C)
    return C, float((weights[:, None] * u ** m * d2).sum())


@pytest.mark.parametrize("m", [1.5, 2.0])
def test_fuzzy_on_centroids_is_the_best_restart_of_weighted_fuzzy_c_means(m):
    from sklearn.cluster import kmeans_plusplus

    rng = np.random.default_rng(4)
    points = np.concatenate([rng.normal(c, 0.6, (12, 3)) for c in rng.uniform(-5, 5, (5, 3))])
    weights = rng.integers(1, 40, len(points)).astype(float)
    got = fuzzy_on_centroids(points, 5, seed=7, weights=weights, fuzzifier=m)
    # a fixed point of the weighted update
    again, j_got = _weighted_fcm(points, weights, got, m, iters=1)
    np.testing.assert_allclose(again, got, atol=1e-8)
    # no lower J_m from any of the ten k-means++ seeds it restarts from
    restarts = [_weighted_fcm(points, weights, kmeans_plusplus(
        points, 5, sample_weight=weights, random_state=7 + r)[0], m)[1] for r in range(10)]
    assert j_got == pytest.approx(min(restarts), rel=1e-9)
    # the weights count: every point equally weighted gives other centres
    assert not np.allclose(np.sort(got, 0), np.sort(fuzzy_on_centroids(
        points, 5, seed=7, weights=np.ones(len(points)), fuzzifier=m), 0), atol=1e-3)


def test_fuzzy_on_centroids_too_few_points():
    with pytest.raises(ValueError, match="2 distinct local centroids, fewer than the k = 3"):
        fuzzy_on_centroids(np.array([[0.0], [0.0], [1.0]]), 3, seed=0, weights=np.ones(3),
                           fuzzifier=2.0)


def test_bounding_box_init_inside_federated_box():
    mins = np.array([[0.0, -1.0], [2.0, -3.0]])
    maxs = np.array([[1.0, 5.0], [4.0, 0.0]])
    C = bounding_box_init(mins, maxs, 50, seed=1)
    assert C.shape == (50, 2)
    assert C[:, 0].min() >= 0 and C[:, 0].max() <= 4
    assert C[:, 1].min() >= -3 and C[:, 1].max() <= 5
    np.testing.assert_array_equal(C, bounding_box_init(mins, maxs, 50, seed=1))


def test_weighted_lloyd_empty_cluster_policy():
    from fedcluster.strategies.aggregate import weighted_lloyd

    points = np.array([[0.0, 0.0], [0.0, 1.0], [10.0, 10.0]])
    C0 = np.array([[0.0, 0.5], [10.0, 10.0], [100.0, 100.0]])  # the third gets no point
    kept = weighted_lloyd(points, np.ones(3), C0)
    np.testing.assert_allclose(kept, [[0.0, 0.5], [10.0, 10.0], [100.0, 100.0]])
    moved = weighted_lloyd(points, np.ones(3), C0, empty=np.full((3, 2), 7.0))
    np.testing.assert_allclose(moved[2], [7.0, 7.0])
    np.testing.assert_allclose(moved[:2], kept[:2])

"""Site tasks: aggregates only, the privacy floor, and the DWF site step."""

import numpy as np
import pytest

from fedcluster.client_app import local_kmeans as local
from fedcluster.common import protocol
from fedcluster.client_app.site_data import SiteData
from fedcluster.client_app.task_io import TaskError
from site_rows import run_on_rows


def site(X):
    X = np.ascontiguousarray(X, dtype=np.float64)
    return SiteData(X, None, None, "test site")


@pytest.fixture()
def two_groups():
    rng = np.random.default_rng(0)
    # 30 points near 0, 1 point near 10 (a cluster of one), nothing near 20
    return site(np.vstack([rng.normal(0, 0.1, (30, 2)), [[10.0, 10.0]]]))


def test_lloyd_task_equals_one_lloyd_step_and_counts_against_received(two_groups):
    C = np.array([[0.5, 0.5], [9.0, 9.0], [20.0, 20.0]])
    reply = run_on_rows(two_groups, [C], {"task": "lloyd", "local-iters": 1, "tol": 0.0,
                                       "min-cluster-size": 1}, 1)
    local_C, weights = reply.arrays
    np.testing.assert_array_equal(weights, [30, 1, 0])
    np.testing.assert_allclose(local_C[0], two_groups.X[:30].mean(0), rtol=1e-14)
    np.testing.assert_array_equal(local_C[1], [10.0, 10.0])
    np.testing.assert_array_equal(local_C[2], C[2])  # empty: keeps the received centroid
    d2 = ((two_groups.X[:, None] - C[None]) ** 2).sum(-1).min(1)
    assert reply.metrics["sse"] == pytest.approx(d2.sum(), rel=1e-12)


def test_privacy_floor_hides_small_cluster_as_if_empty(two_groups):
    C = np.array([[0.5, 0.5], [9.0, 9.0], [20.0, 20.0]])
    reply = run_on_rows(two_groups, [C], {"task": "lloyd", "local-iters": 1, "tol": 0.0,
                                       "min-cluster-size": 2}, 1)
    local_C, weights = reply.arrays
    np.testing.assert_array_equal(weights, [30, 0, 0])
    np.testing.assert_array_equal(local_C[1], C[1])  # the lone point is not revealed


def test_site_floor_wins_when_stricter(two_groups):
    C = np.array([[0.5, 0.5], [9.0, 9.0]])
    params = {"task": "evaluate", "min-cluster-size": 1}
    assert list(run_on_rows(two_groups, [C], params, 1).arrays[0]) == [30, 1]
    assert list(run_on_rows(two_groups, [C], params, 31).arrays[0]) == [0, 0]


def test_lloyd_task_several_local_iters_equals_local_lloyd(two_groups):
    C = np.array([[0.0, 0.0], [1.0, 1.0], [10.0, 10.0]])
    reply = run_on_rows(two_groups, [C], {"task": "lloyd", "local-iters": 5, "tol": 0.0,
                                       "min-cluster-size": 1}, 1)
    expected, counts, _ = local.lloyd(two_groups.X, C, 5, 0.0)
    np.testing.assert_array_equal(reply.arrays[0], expected)


def test_local_kmeans_drops_clusters_under_floor(two_groups):
    reply = run_on_rows(two_groups, [], {"task": "local_kmeans", "k-local": 2, "seed": 0,
                                      "min-cluster-size": 2}, 1)
    centroids, counts = reply.arrays
    assert centroids.shape == (1, 2) and list(counts) == [30]


def test_bad_task_requests_are_refused(two_groups):
    with pytest.raises(TaskError, match="unknown task 'steal'"):
        run_on_rows(two_groups, [], {"task": "steal"}, 1)
    with pytest.raises(TaskError, match="do not fit this site's 2 features"):
        run_on_rows(two_groups, [np.zeros((2, 3))], {"task": "evaluate"}, 1)
    with pytest.raises(TaskError, match="'local-iters' is missing"):
        run_on_rows(two_groups, [np.zeros((2, 2))], {"task": "lloyd", "tol": 0.0}, 1)


def test_replies_never_carry_rows(two_groups):
    """Every array a task returns has at most k rows (never n)."""
    C = np.array([[0.5, 0.5], [9.0, 9.0]])
    for params in ({"task": "lloyd", "local-iters": 3, "tol": 0.0}, {"task": "evaluate"},
                   {"task": "bounds"}, {"task": "describe"},
                   {"task": "local_kmeans", "k-local": 2, "seed": 1}):
        reply = run_on_rows(two_groups, [C], params, 2)
        for a in protocol.to_arrays(reply.arrays):
            assert a.shape[0] <= 2 or a.ndim == 1 and a.shape[0] == 2

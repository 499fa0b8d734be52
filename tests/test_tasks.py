"""Site tasks: aggregates only, the privacy floor, and the DWF site step."""

import numpy as np
import pytest

from fedcluster.client_app import local_kmeans as local
from fedcluster.common import protocol
from fedcluster.client_app.data.site_data import SiteData
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


def _lone_row_glued():
    """A site of 20 rows near 0 and 2 rows far apart near 10 and 14: at p_site 2 the two
    far rows can only be one group (or join the rows near 0)."""
    rng = np.random.default_rng(3)
    return site(np.vstack([rng.normal(0, 0.1, (20, 2)), [[10.0, 10.0]], [[14.0, 14.0]]]))


def test_min_groups_leaves_out_a_cluster_of_one_group():
    from site_rows import run_on_groups

    data = _lone_row_glued()
    C = np.array([[0.0, 0.0], [12.0, 12.0]])
    params = {"task": "lloyd", "local-iters": 1, "tol": 0.0, "min-cluster-size": 2}
    plain = run_on_groups(data, [C], params)
    assert list(plain.arrays.counts) == [20, 2]  # one group of the two far rows: shown
    strict = run_on_groups(data, [C], {**params, protocol.MIN_GROUPS: 2})
    assert list(strict.arrays.counts) == [20, 0]  # left out, as a cluster under the floor
    np.testing.assert_array_equal(strict.arrays.centroids[1], C[1])
    assert strict.metrics["sse"] == plain.metrics["sse"]  # the SSE is the site's whole
    # on rows (p_site 1) each row is a group: two rows make two groups, shown
    rows = run_on_rows(data, [C], {**params, protocol.MIN_GROUPS: 2}, 1)
    assert list(rows.arrays.counts) == [20, 2]


def test_min_groups_in_local_kmeans_and_bad_values():
    from site_rows import run_on_groups

    data = _lone_row_glued()
    params = {"task": "local_kmeans", "k-local": 2, "seed": 0, "min-cluster-size": 2}
    assert sorted(run_on_groups(data, [], params).arrays.counts) == [2, 20]
    strict = run_on_groups(data, [], {**params, protocol.MIN_GROUPS: 2})
    assert list(strict.arrays.counts) == [20]
    for bad in (0, "two"):
        with pytest.raises(TaskError, match="min-groups"):
            run_on_groups(data, [], {**params, protocol.MIN_GROUPS: bad})


def test_ewf_and_kfed_ask_for_two_groups_dwf_does_not():
    from fedcluster.common.config import parse_run_config
    from fedcluster.strategies import make_strategy

    def plans(algorithm):
        strategy = make_strategy(parse_run_config({"algorithm": algorithm, "n-clusters": 2}))
        strategy.reset_repetition()
        return strategy
    ewf, dwf, kfed = plans("ewf"), plans("dwf"), plans("kfed")
    ewf.centroids = dwf.centroids = np.zeros((2, 2))
    assert ewf.train_task().params[protocol.MIN_GROUPS] == 2
    assert protocol.MIN_GROUPS not in dwf.train_task().params
    assert kfed.init_task().params[protocol.MIN_GROUPS] == 2
    assert protocol.MIN_GROUPS not in dwf.init_task().params

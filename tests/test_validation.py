"""Reply validation: each bad reply is rejected with a reason naming the problem."""

import numpy as np
import pytest

from fedcluster.strategies.validation import Expect, ReplyError, validate

LLOYD = Expect(task="lloyd", n_features=2, n_clusters=3, floor=2, declared_rows=10)
C = np.zeros((3, 2))


def test_good_lloyd_reply_passes_and_is_typed():
    arrays = validate([C, np.array([2.0, 0.0, 5.0])], {"sse": 1.0}, 10, LLOYD)
    assert arrays[1].dtype == np.int64


@pytest.mark.parametrize(
    "arrays, metrics, n_rows, reason",
    [
        ([C[:2], np.array([2, 0])], {"sse": 1.0}, 10, "shape"),
        ([C, np.array([2, 0, 5]), C], {"sse": 1.0}, 10, "sent 3 arrays"),
        ([np.full((3, 2), np.nan), np.array([2, 0, 5])], {"sse": 1.0}, 10, "non-finite"),
        ([C, np.array([2, -1, 5])], {"sse": 1.0}, 10, "negative count"),
        ([C, np.array([2, 0, 9])], {"sse": 1.0}, 10, "more than the site's 10 rows"),
        ([C, np.array([2, 1, 5])], {"sse": 1.0}, 10, "privacy floor 2"),
        ([C, np.array([2.5, 0, 5])], {"sse": 1.0}, 10, "non-integer"),
        ([C, np.array([2, 0, 5])], {"sse": float("inf")}, 10, "sse"),
        ([C, np.array([2, 0, 5])], {"sse": 1.0}, 12, "declared 12 rows now but 10"),
        ([], {"error": "data.csv: row 3"}, 0, "the site refused: data.csv: row 3"),
    ],
)
def test_bad_lloyd_replies_rejected(arrays, metrics, n_rows, reason):
    with pytest.raises(ReplyError, match=reason):
        validate(arrays, metrics, n_rows, LLOYD)


def test_local_kmeans_rows_bounded():
    expect = Expect(task="local_kmeans", n_features=2, max_rows=2, floor=1)
    validate([np.zeros((2, 2)), np.array([3, 4])], {}, 7, expect)
    with pytest.raises(ReplyError, match="at most 2"):
        validate([np.zeros((3, 2)), np.array([3, 4, 1])], {}, 8, expect)
    with pytest.raises(ReplyError, match="no members"):
        validate([np.zeros((2, 2)), np.array([3, 0])], {}, 8, expect)


EVALUATION = Expect(task="evaluate", n_features=2, n_clusters=3, floor=1, declared_rows=10)
GOOD_EVALUATION = [np.array([3, 3, 4]), np.zeros((3, 2)), np.ones(3), np.zeros(3), np.ones(3)]


@pytest.mark.parametrize("distances, reason", [
    (np.array([1.0, -0.5, 2.0]), "negative squared norms or distance sums"),
    (np.array([1.0, np.nan, 2.0]), "distance sums"),
    (np.ones(2), "distance sums"),
])
def test_evaluation_distance_sums_checked(distances, reason):
    """The evaluation's per-cluster distance sums (Davies-Bouldin's, when the run has
    converged) are validated like its other statistics."""
    metrics = {"sse": 4.0, "silhouette-sum": 1.0}
    validate(GOOD_EVALUATION, metrics, 10, EVALUATION)
    with pytest.raises(ReplyError, match=reason):
        validate([*GOOD_EVALUATION[:4], distances], metrics, 10, EVALUATION)


@pytest.mark.parametrize(
    "fuzzy, reason",
    [
        ({"all-sq-dist": 9.0, "partition-sum": 5.0}, None),
        ({"all-sq-dist": 1.0, "partition-sum": 5.0}, "below the sse"),
        ({"all-sq-dist": 9.0, "partition-sum": 11.0}, "outside"),
        ({"all-sq-dist": 9.0, "partition-sum": 3.0}, "outside"),  # under n / k
        ({"all-sq-dist": float("nan"), "partition-sum": 5.0}, "not a finite number"),
        ({"all-sq-dist": 9.0}, "only one of"),
    ],
)
def test_fuzzy_evaluation_sums_checked(fuzzy, reason):
    metrics = {"sse": 4.0, "silhouette-sum": 1.0, **fuzzy}
    if reason is None:
        validate(GOOD_EVALUATION, metrics, 10, EVALUATION)
        return
    with pytest.raises(ReplyError, match=reason):
        validate(GOOD_EVALUATION, metrics, 10, EVALUATION)


@pytest.mark.parametrize("floor, ok", [(1, True), (3, True), (0, False), (2.5, False), (True, False)])
def test_evaluation_floor_is_an_integer_at_or_above_the_runs(floor, ok):
    metrics = {"sse": 4.0, "silhouette-sum": 1.0, "floor": floor}
    if ok:
        validate(GOOD_EVALUATION, metrics, 10, EVALUATION)
        return
    with pytest.raises(ReplyError, match="floor"):
        validate(GOOD_EVALUATION, metrics, 10, EVALUATION)

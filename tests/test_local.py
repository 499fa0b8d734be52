"""Single-site routines: Lloyd against a plain numpy Lloyd, k-means++, local k-means."""

from __future__ import annotations


import numpy as np
import pytest

import reference as ref
from reference import num_threads
from fedcluster.common import kernels
from fedcluster.client_app import local_kmeans as local

DTYPES = [np.float32, np.float64]




def separated_blobs(k, d=2, per_blob=200, seed=0, gap=100.0):
    """k blobs of unit spread whose centres are at least `gap` apart; returns X, blob ids."""
    rng = np.random.default_rng(seed)
    centres = gap * np.arange(k)[:, None] * np.ones((1, d))
    ids = np.repeat(np.arange(k), per_blob)
    X = centres[ids] + rng.standard_normal((k * per_blob, d))
    perm = rng.permutation(len(X))
    return X[perm], ids[perm]


def overlapping(n=3000, d=3, seed=0):
    """Data where Lloyd takes several iterations to settle."""
    rng = np.random.default_rng(seed)
    centres = rng.uniform(-3, 3, size=(6, d))
    return centres[rng.integers(6, size=n)] + rng.standard_normal((n, d))


# --------------------------------------------------------------------------
# lloyd
# --------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_lloyd_matches_reference_iteration_by_iteration(dtype):
    X = overlapping(seed=1).astype(dtype)
    C0 = X[np.random.default_rng(2).choice(len(X), 5, replace=False)].astype(np.float64)
    trajectory = ref.lloyd_trajectory(X, C0, 8)
    assert trajectory[-1][2] > 0  # still moving: every step is tested
    for t, (want_C, want_counts, _) in enumerate(trajectory, start=1):
        C, counts, n_iter = local.lloyd(X, C0, max_iter=t, tol=0.0)
        assert n_iter == t
        assert C.dtype == np.float64 and counts.dtype == np.int64
        np.testing.assert_array_equal(counts, want_counts)
        np.testing.assert_allclose(C, want_C, rtol=1e-12, atol=1e-12)


def test_lloyd_counts_are_those_of_the_last_assignment():
    # assignment to C0 = [0, 2.5]: {0, 1} and {2, 10} -> C1 = [0.5, 6]
    # assignment to C1: {0, 1, 2} and {10}            -> C2 = [1, 10]
    X = np.array([[0.0], [1.0], [2.0], [10.0]])
    C0 = np.array([[0.0], [2.5]])
    C, counts, n_iter = local.lloyd(X, C0, max_iter=1, tol=0.0)
    np.testing.assert_array_equal(C, [[0.5], [6.0]])
    np.testing.assert_array_equal(counts, [2, 2])
    C, counts, n_iter = local.lloyd(X, C0, max_iter=2, tol=0.0)
    np.testing.assert_array_equal(C, [[1.0], [10.0]])
    np.testing.assert_array_equal(counts, [3, 1])
    # converged: the third update does not move, so tol > 0 stops there
    C, counts, n_iter = local.lloyd(X, C0, max_iter=50, tol=1e-12)
    assert n_iter == 3
    np.testing.assert_array_equal(counts, [3, 1])


def test_lloyd_returned_rows_are_means_of_the_counted_members():
    X = overlapping(seed=3)
    C0 = X[:6].copy()
    C, counts, _ = local.lloyd(X, C0, max_iter=3, tol=0.0)
    previous, _, _ = local.lloyd(X, C0, max_iter=2, tol=0.0)
    labels, _ = ref.assign(X, previous)
    for j in range(len(C)):
        assert counts[j] == (labels == j).sum()
        np.testing.assert_allclose(C[j], X[labels == j].mean(0), rtol=1e-12)


@pytest.mark.parametrize("dtype", DTYPES)
def test_lloyd_empty_cluster_keeps_its_centroid(dtype):
    X, ids = separated_blobs(2, d=2, seed=4)
    X = X.astype(dtype)
    a, b = X[np.flatnonzero(ids == 0)[0]], X[np.flatnonzero(ids == 1)[0]]
    far = [1e4, -1e4]
    # row 2 is never the nearest; row 3 duplicates row 0, so it loses every
    # tie in the first assignment (afterwards row 0 has moved away from it)
    C0 = np.array([a, b, far, a], dtype=np.float64)
    C, counts, _ = local.lloyd(X, C0, max_iter=1, tol=0.0)
    assert counts[2] == 0 and counts[3] == 0 and counts.sum() == len(X)
    np.testing.assert_array_equal(C[2:], C0[2:])  # bit-identical: not touched
    C, counts, n_iter = local.lloyd(X, C0, max_iter=5, tol=0.0)
    assert n_iter == 5 and counts[2] == 0
    np.testing.assert_array_equal(C[2], far)
    want_C, want_counts, _ = ref.lloyd_trajectory(X, C0, 5)[-1]
    np.testing.assert_array_equal(counts, want_counts)
    np.testing.assert_allclose(C, want_C, rtol=1e-12)


def test_lloyd_tol_stops_at_the_first_small_move():
    X = overlapping(seed=5)
    C0 = X[:6].copy()
    trajectory = ref.lloyd_trajectory(X, C0, 40)
    shifts = np.array([s for _, _, s in trajectory])
    assert (shifts[:8] > 1.2 * shifts[8]).all() and shifts[9] < 0.8 * shifts[8]
    # stop after the first update whose move is < tol: the 9th just above it,
    # the 10th just below it
    for tol, stop in [(shifts[8] * (1 + 1e-9), 9), (shifts[8] * (1 - 1e-9), 10)]:
        C, counts, n_iter = local.lloyd(X, C0, max_iter=40, tol=tol)
        assert n_iter == stop
        np.testing.assert_allclose(C, trajectory[stop - 1][0], rtol=1e-12)
        np.testing.assert_array_equal(counts, trajectory[stop - 1][1])


def test_lloyd_tol_zero_runs_every_iteration_and_leaves_C0_alone():
    X, _ = separated_blobs(3, seed=6)
    C0 = X[:3].copy()
    C0_before = C0.copy()
    C, _, n_iter = local.lloyd(X, C0, max_iter=25, tol=0.0)  # converges long before
    assert n_iter == 25
    np.testing.assert_array_equal(C0, C0_before)
    assert local.lloyd(X, C0, max_iter=25, tol=1e-9)[2] < 25


def test_lloyd_float32_data_with_float64_centroids():
    X = overlapping(seed=7).astype(np.float32)
    C0 = X[:4].astype(np.float64) + 1e-3
    C, counts, _ = local.lloyd(X, C0, max_iter=4, tol=0.0)
    assert C.dtype == np.float64
    want_C, want_counts, _ = ref.lloyd_trajectory(X, C0, 4, round_centroids=True)[-1]
    np.testing.assert_array_equal(counts, want_counts)
    np.testing.assert_allclose(C, want_C, rtol=1e-12)


@pytest.mark.parametrize(
    "kwargs",
    [dict(max_iter=0, tol=0.0), dict(max_iter=5, tol=-1.0), dict(max_iter=5, tol=float("nan"))],
)
def test_lloyd_bad_arguments(kwargs):
    X = overlapping(n=50)
    with pytest.raises(ValueError):
        local.lloyd(X, X[:3], **kwargs)


def test_lloyd_shape_mismatch():
    X = overlapping(n=50)
    with pytest.raises(ValueError):
        local.lloyd(X, np.zeros((3, 2)), max_iter=3, tol=0.0)


# --------------------------------------------------------------------------
# kmeans_plusplus
# --------------------------------------------------------------------------


def rows_of(X, C):
    """Index in X of each row of C (asserting it is exactly a row of X)."""
    X64 = np.asarray(X, dtype=np.float64)
    idx = []
    for c in C:
        hits = np.flatnonzero((X64 == c).all(1))
        assert hits.size, f"{c} is not a row of X"
        idx.append(hits[0])
    return np.array(idx)


@pytest.mark.parametrize("dtype", DTYPES)
def test_kmeans_plusplus_deterministic_and_rows_of_X(dtype):
    X = overlapping(seed=8).astype(dtype)
    a = local.kmeans_plusplus(X, 7, seed=11)
    b = local.kmeans_plusplus(X, 7, seed=11)
    c = local.kmeans_plusplus(X, 7, seed=12)
    assert a.shape == (7, 3) and a.dtype == np.float64
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    assert len(set(rows_of(X, a))) == 7


def test_kmeans_plusplus_matches_numpy_reference():
    X = overlapping(n=1500, seed=9)
    for seed in range(5):
        np.testing.assert_array_equal(
            local.kmeans_plusplus(X, 9, seed), ref.kmeans_plusplus(X, 9, seed)
        )


@pytest.mark.parametrize("seed", range(8))
def test_kmeans_plusplus_one_centre_per_blob(seed):
    X, ids = separated_blobs(6, d=3, per_blob=150, seed=seed)
    C = local.kmeans_plusplus(X, 6, seed)
    assert sorted(ids[rows_of(X, C)]) == list(range(6))


def test_kmeans_plusplus_more_centres_than_distinct_rows():
    pts = np.array([[0.0, 0.0], [3.0, 1.0], [-2.0, 5.0]])
    X = np.repeat(pts, [1, 20, 5], axis=0)
    C = local.kmeans_plusplus(X, 5, seed=0)
    assert C.shape == (5, 2)
    rows_of(X, C)
    # the three distinct points come first (D^2 sampling never repeats one
    # while another is at a positive distance), then duplicates
    assert {tuple(r) for r in C[:3]} == {tuple(p) for p in pts}
    # k larger than n also works
    C = local.kmeans_plusplus(X[:2], 4, seed=1)
    assert C.shape == (4, 2)
    rows_of(X, C)
    # the uniform fallback really draws among rows, not always row 0
    fills = {tuple(local.kmeans_plusplus(X, 6, seed=s)[-1]) for s in range(30)}
    assert len(fills) >= 2


def test_kmeans_plusplus_k1_and_float32():
    X = overlapping(n=400, seed=10).astype(np.float32)
    C = local.kmeans_plusplus(X, 1, seed=3)
    assert C.shape == (1, 3) and C.dtype == np.float64
    rows_of(X, C)


def test_kmeans_plusplus_rejects_non_finite_and_bad_k():
    X = overlapping(n=100, seed=11)
    X[17, 1] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        local.kmeans_plusplus(X, 3, seed=0)
    with pytest.raises(ValueError, match="NaN"):
        local.kmeans_plusplus(X, 1, seed=0)
    with pytest.raises(ValueError):
        local.kmeans_plusplus(overlapping(n=10), 0, seed=0)
    with pytest.raises(ValueError):
        local.kmeans_plusplus(np.zeros((0, 3)), 2, seed=0)


# --------------------------------------------------------------------------
# local_kmeans
# --------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_local_kmeans_recovers_separated_blobs(dtype):
    X, ids = separated_blobs(5, d=4, per_blob=300, seed=12)
    X = X.astype(dtype)
    C, counts = local.local_kmeans(X, 5, seed=0)
    assert C.shape == (5, 4) and C.dtype == np.float64 and counts.dtype == np.int64
    assert counts.sum() == len(X)
    labels, _ = kernels.assign(X, C)
    np.testing.assert_array_equal(np.bincount(labels, minlength=5), counts)
    # each centroid is exactly the mean of one true blob
    for j in range(5):
        blob = ids[labels == j]
        assert (blob == blob[0]).all() and counts[j] == 300
        np.testing.assert_allclose(C[j], X[labels == j].astype(np.float64).mean(0), rtol=1e-12)


def test_local_kmeans_matches_seeding_then_lloyd():
    X = overlapping(seed=13)
    C, counts = local.local_kmeans(X, 6, seed=4, max_iter=300, tol=1e-4)
    C0 = local.kmeans_plusplus(X, 6, 4)
    want_C, want_counts, n_iter = local.lloyd(X, C0, 300, 1e-4)
    assert 1 < n_iter < 300
    np.testing.assert_array_equal(C, want_C)
    np.testing.assert_array_equal(counts, want_counts)


def test_local_kmeans_k_larger_than_n():
    X = overlapping(n=4, seed=14)
    C, counts = local.local_kmeans(X, 10, seed=0)
    assert C.shape == (4, 3)
    np.testing.assert_array_equal(counts, [1, 1, 1, 1])
    np.testing.assert_array_equal(np.sort(C, axis=0), np.sort(X, axis=0))


def test_local_kmeans_deterministic_and_thread_invariant():
    X = overlapping(n=30_000, seed=15).astype(np.float32)
    with num_threads(1):
        a = local.local_kmeans(X, 8, seed=5)
    with num_threads(2):
        b = local.local_kmeans(X, 8, seed=5)
    for x, y in zip(a, b):
        assert np.array_equal(x, y)


def test_kmeans_plusplus_on_a_memory_mapped_site_is_chunked_with_the_same_result(tmp_path, monkeypatch):
    """On a read-only memory-mapped site k-means++ passes over the rows in chunks and drops
    each chunk's pages (so the rows and its n-vectors are not all resident at once); the
    centres are the same bits as on the array in memory."""
    from fedcluster.client_app.data import site_data as data

    rng = np.random.default_rng(3)
    X = np.vstack([rng.normal(c, 0.5, (5_000, 6)) for c in (0.0, 3.0, 6.0, 9.0)])
    path = tmp_path / "site.npy"
    np.save(path, X)
    mapped = data.load_site_file(path).X
    assert data.read_only_mapping(mapped) is not None
    assert data.read_only_mapping(X) is None
    monkeypatch.setattr(kernels, "CHUNK_ROWS", 4_096)  # 4 chunks, the last takes the rest
    released = []
    monkeypatch.setattr(local, "release_pages", lambda A: released.append(A.shape))
    centres = local.kmeans_plusplus(mapped, 7, 11)
    assert len(released) == 4 * (1 + 6 * (2 + int(np.log(7))))  # 4 chunks x 19 passes
    np.testing.assert_array_equal(centres, local.kmeans_plusplus(X, 7, 11))
    np.testing.assert_array_equal(local.local_kmeans(mapped, 7, 11)[0], local.local_kmeans(X, 7, 11)[0])
    data.release_pages(mapped)  # the rows come back from the page cache when read again
    np.testing.assert_array_equal(mapped, X)

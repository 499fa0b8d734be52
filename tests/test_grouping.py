"""Microaggregation (fedcluster.client_app.data.grouping.group_rows): group sizes, a partition
of the rows, the small cases, bit-identical labels for 1 and 2 Numba threads, on a
read-only memmap and in memory, across calls, whatever the chunking, and the quality that
makes the groups usable (k-means on the weighted group means as good as on the rows);
then the groups' statistics (group_stats): each group's rows added in row order, the
same bits whatever the chunking, the window of groups, or where the rows are held.

At the test sizes one coarse segment holds every row (COARSE_BYTES = 16 MB of rows), so
the ``coarse`` fixture lowers it to exercise the file-order coarse splits of large sites."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.cluster import KMeans

from fedcluster.client_app.data import group_stats, grouping
from fedcluster.client_app.data.grouping import group_rows
from reference import num_threads


def blob_set(n, d, k, seed, spread=8.0):
    rng = np.random.default_rng(seed)
    centres = rng.uniform(-spread, spread, size=(k, d))
    return centres[rng.integers(k, size=n)] + rng.standard_normal((n, d))


@pytest.fixture(scope="module")
def big():
    """20,000 x 16: several split levels and many blocks, the parallel kernels."""
    return blob_set(20_000, 16, 12, seed=3)


@pytest.fixture(params=["default", "coarse"])
def coarse(request, monkeypatch):
    """Run as is, or with coarse segments of 512 rows (several levels of coarse splits
    and many chunks at 20,000 rows)."""
    if request.param == "coarse":
        monkeypatch.setattr(grouping, "COARSE_BYTES", 512 * 8 * 16)
        monkeypatch.setattr(grouping, "CHUNK_BYTES", 4096 * 8 * 16)
        monkeypatch.setattr(grouping, "RELEASE_BYTES", 1 << 16)
    return request.param


def check_partition(labels, n, g):
    """Every row in exactly one group, ids 0..G-1, numbered by first appearance, sizes
    g..2g-1 (always attainable when n >= g: see group_rows)."""
    assert labels.shape == (n,) and labels.dtype == np.int64
    counts = np.bincount(labels)
    assert counts.min() >= g and counts.max() <= max(g, 2 * g - 1)
    first = np.unique(labels, return_index=True)[1]
    assert np.array_equal(np.argsort(first, kind="stable"), np.arange(len(counts)))
    assert np.all(np.diff(first) > 0)  # group i starts before group i + 1


@pytest.mark.parametrize("n, d, g", [(2, 1, 2), (3, 2, 2), (7, 3, 4), (300, 2, 2),
                                     (1000, 5, 3), (5000, 4, 2), (3000, 3, 40)])
def test_sizes_and_partition(n, d, g):
    X = blob_set(n, d, 5, seed=n + g)
    check_partition(group_rows(X, g), n, g)


def test_sizes_on_the_parallel_path(big, coarse):
    check_partition(group_rows(big, 2), len(big), 2)


def test_duplicate_rows_and_ties():
    # all rows equal (k-means++ finds one distinct row) and a few distinct values
    check_partition(group_rows(np.ones((600, 3)), 2), 600, 2)
    X = np.repeat(np.arange(6.0)[:, None], 150, axis=0) @ np.ones((1, 2))
    check_partition(group_rows(X, 3), 900, 3)


def test_fewer_rows_than_min_size_wait():
    assert np.array_equal(group_rows(np.zeros((2, 3)), 3), [-1, -1])
    assert group_rows(np.zeros((0, 3)), 2).shape == (0,)


def test_min_size_one_is_each_row_its_own_group():
    X = blob_set(50, 2, 3, seed=0)
    assert np.array_equal(group_rows(X, 1), np.arange(50))


@pytest.mark.parametrize("min_size", [0, -1, 2.0, True, "2", None])
def test_bad_min_size(min_size):
    with pytest.raises(ValueError, match="min_size"):
        group_rows(np.zeros((5, 2)), min_size)


def test_bad_X():
    with pytest.raises(ValueError, match="2-D"):
        group_rows(np.zeros(5), 2)
    with pytest.raises(ValueError, match="no feature columns"):
        group_rows(np.zeros((5, 0)), 2)
    X = np.zeros((50, 2))
    X[7, 1] = np.nan
    with pytest.raises(ValueError, match="non-finite"):
        group_rows(X, 2)


def test_other_dtypes_are_converted():
    X = blob_set(400, 3, 4, seed=1)
    assert np.array_equal(group_rows(X.astype(np.float32), 2),
                          group_rows(X.astype(np.float32).astype(np.float64), 2))
    assert np.array_equal(group_rows(np.asfortranarray(X), 2), group_rows(X, 2))


def test_same_labels_for_one_and_two_threads(big, coarse):
    with num_threads(1):
        one = group_rows(big, 2)
    with num_threads(2):
        two = group_rows(big, 2)
    assert np.array_equal(one, two)


def test_same_labels_on_a_read_only_memmap(big, tmp_path, coarse):
    path = tmp_path / "site.npy"
    np.save(path, big)
    mapped = np.load(path, mmap_mode="r")
    assert isinstance(mapped, np.memmap) and not mapped.flags.writeable
    assert np.array_equal(group_rows(mapped, 3), group_rows(big, 3))


def test_deterministic_across_calls(big):
    X = big[:7_000]
    assert np.array_equal(group_rows(X, 2), group_rows(X.copy(), 2))


def test_chunking_and_serial_twins_do_not_change_labels(big, monkeypatch):
    """Seeds come from global positions, so cutting the finishing work into chunks of
    coarse segments changes nothing; the serial twins (small sites) compute the same."""
    X = big[:6_000]
    monkeypatch.setattr(grouping, "COARSE_BYTES", 300 * 8 * 16)
    whole = group_rows(X, 2)
    monkeypatch.setattr(grouping, "CHUNK_BYTES", 1)  # one coarse segment per chunk
    assert np.array_equal(group_rows(X, 2), whole)
    monkeypatch.setattr(grouping, "SERIAL_MAX_ROWS", 10**9)
    assert np.array_equal(group_rows(X, 2), whole)


def group_means(X, labels):
    counts = np.bincount(labels)
    sums = np.zeros((len(counts), X.shape[1]))
    np.add.at(sums, labels, X)
    return sums / counts[:, None], counts


@pytest.mark.parametrize("g", [2, 3])
def test_kmeans_on_group_means_is_as_good_as_on_rows(g):
    X = blob_set(3000, 8, 10, seed=7, spread=4.0)  # blobs that touch: not a trivial task
    means, counts = group_means(X, group_rows(X, g))
    on_groups = KMeans(10, n_init=10, random_state=0).fit(means, sample_weight=counts)
    on_rows = KMeans(10, n_init=10, random_state=0).fit(X)
    assert -on_groups.score(X) <= 1.01 * on_rows.inertia_


# ------------------------------------------------------------------ the groups' statistics
def sequential_statistics(X, labels, n_groups):
    """Each group's sums and squared deviations, its rows added one at a time in row
    order (the definition group_stats keeps bit for bit); missing cells skipped."""
    d = X.shape[1]
    sums, m2 = np.zeros((n_groups, d)), np.zeros((n_groups, d))
    present = np.zeros((n_groups, d), dtype=np.int64)
    seen = np.zeros(n_groups, dtype=bool)
    for row, g in zip(X, labels):
        if g < 0:
            continue
        cells = np.where(np.isnan(row), 0.0, row)
        sums[g] = cells if not seen[g] else sums[g] + cells
        present[g] += ~np.isnan(row)
        seen[g] = True
    with np.errstate(invalid="ignore", divide="ignore"):
        means = np.where(present > 0, sums / np.maximum(present, 1), 0.0)
    seen[:] = False
    for row, g in zip(X, labels):
        if g < 0:
            continue
        deviation = np.where(np.isnan(row), 0.0, row - means[g])
        m2[g] = deviation * deviation if not seen[g] else m2[g] + deviation * deviation
        seen[g] = True
    return np.bincount(labels[labels >= 0], minlength=n_groups), sums, m2, present


@pytest.fixture
def grouped():
    """3,000 x 5 rows on very different scales in groups of 2..5 rows, some rows waiting."""
    rng = np.random.default_rng(5)
    X = rng.standard_normal((3000, 5)) * [1.0, 1e3, 1e-3, 7.0, 1e6] + [0, 0, 1, -5, 1e7]
    labels = np.repeat(np.arange(900), rng.integers(2, 6, size=900))[:2990]
    labels = np.r_[rng.permutation(labels), [-1] * 10]
    labels = np.unique(labels, return_inverse=True)[1] - 1  # -1 stays the smallest
    return X, labels, int(labels.max()) + 1


def test_a_groups_statistics_are_its_rows_added_in_row_order(grouped, monkeypatch):
    X, labels, G = grouped
    counts, sums, m2, present = group_stats.group_statistics(X, labels, G)
    want = sequential_statistics(X, labels, G)
    assert present is None  # no cell missing: no present-cell counts at all
    for got, expected in zip((counts, sums, m2), want):
        assert np.array_equal(got, expected)
    # whatever the chunking
    monkeypatch.setattr(group_stats, "STATS_ROWS", 7)
    assert all(np.array_equal(a, b) for a, b in
               zip(group_stats.group_statistics(X, labels, G)[:3], (counts, sums, m2)))


def test_statistics_skip_missing_cells_and_count_the_present_ones(grouped):
    X, labels, G = grouped
    X = X.copy()
    X[np.random.default_rng(6).random(X.shape) < 0.2] = np.nan
    got = group_stats.group_statistics(X, labels, G)
    for a, b in zip(got, sequential_statistics(X, labels, G)):
        assert np.array_equal(a, b)
    assert got[3].dtype == np.int64 and not np.isnan(got[1]).any()


def test_statistics_of_a_memmap_are_those_in_memory_window_by_window(grouped, tmp_path):
    X, labels, G = grouped
    np.save(tmp_path / "rows.npy", X)
    mapped = np.load(tmp_path / "rows.npy", mmap_mode="r")
    counts, sums, absent, places = group_stats.group_sums(mapped, labels, G)
    whole = group_stats.group_statistics(X, labels, G)
    assert np.array_equal(sums, whole[1]) and absent is None
    windows = [group_stats.group_m2(mapped, labels, places, counts, sums, None, lo, min(G, lo + 97))
               for lo in range(0, G, 97)]
    assert np.array_equal(np.concatenate(windows), whole[2])


def _in_steps_by_place(places, groups, values, into, offset=0):
    """The row-order sums as ``group_stats`` once made them: one numpy step per place
    (quadratic in the largest group: a report's part)."""
    for k in range(int(places.max()) + 1 if places.size else 0):
        rows = np.flatnonzero(places == k)
        if rows.size:
            if k == 0:
                into[groups[rows] - offset] = values[rows]
            else:
                into[groups[rows] - offset] += values[rows]


@pytest.mark.parametrize("path", ["compiled", "numpy"])
@pytest.mark.parametrize("dtype", [np.float64, np.int16])
def test_row_order_sums_of_large_groups_are_the_steps_bit_for_bit(dtype, path):
    """A few groups of thousands of rows (a report's parts) beside small ones, rows
    waiting, a -0.0 first (place 0 sets the slot: its sign stays): the compiled pass, and
    the NumPy pass a small table takes (a fresh process then loads no Numba), add what
    the step-per-place code added, in the same order."""
    from fedcluster.common.kernels import compiled_kernels, small_work

    rng = np.random.default_rng(71)
    n, d = 20_000, 3
    labels = np.where(rng.random(n) < 0.7, rng.integers(0, 3, size=n), rng.integers(3, 4000, size=n))
    labels[rng.random(n) < 0.05] = -1
    places = group_stats.row_places(labels)
    values = (rng.standard_normal((n, d)) * 1e3).astype(dtype) if dtype == np.float64 \
        else rng.integers(0, 2, size=(n, d)).astype(dtype)
    lo = 2  # (a window of groups from lo: the offset)
    if dtype == np.float64:
        values[np.flatnonzero((places == 0) & (labels >= lo))[:5]] = -0.0
    mine = labels >= lo
    ours, theirs = np.zeros((4000 - lo, d), dtype=dtype), np.zeros((4000 - lo, d), dtype=dtype)
    kernels = small_work if path == "numpy" else compiled_kernels()
    kernels.add_in_row_order(places[mine], labels[mine], values[mine], ours, lo)
    _in_steps_by_place(places[mine], labels[mine], values[mine], theirs, lo)
    assert np.array_equal(ours.view(np.uint8), theirs.view(np.uint8))
    assert places.max() > 4_000  # (large groups: the steps' case)
    if dtype == np.float64:  # the dominance rule's extremes, ties of +-0.0 kept as met
        high, low = np.zeros((4000, d)), np.zeros((4000, d))
        values[rng.random(n) < 0.1] = 0.0
        kernels.group_extremes_at(high, low, np.maximum(labels, 0), values)
        want_high, want_low = np.zeros((4000, d)), np.zeros((4000, d))
        for g, row in zip(np.maximum(labels, 0), values):  # (row after row, strict)
            want_high[g] = np.where(row > want_high[g], row, want_high[g])
            want_low[g] = np.where(row < want_low[g], row, want_low[g])
        assert np.array_equal(high.view(np.uint8), want_high.view(np.uint8))
        assert np.array_equal(low.view(np.uint8), want_low.view(np.uint8))


def test_a_small_table_is_made_without_numba_and_a_large_one_with_it():
    """Which path a table's row-order passes take depends on its size alone."""
    from fedcluster.common.kernels import small_work

    small = np.zeros((small_work.ROW_ORDER_MAX_VALUES // 4, 4))
    assert group_stats._row_order(small) is small_work
    assert group_stats._row_order(np.zeros((small.shape[0] + 1, 4))) is not small_work

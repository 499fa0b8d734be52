"""Kernels against the numpy references, thread invariance, and the on-disk cache
(which stays correct only while every compiled function is in _compiled.py: checked).

Every kernel is checked in float32 and float64 with 1 and 2 Numba threads on:
a data set smaller than one block, one spanning several blocks (20,000 rows,
not a multiple of the block size), d = 1, k = 1, an empty cluster, and k
larger than the number of distinct rows (exact ties).
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import numpy as np
import pytest
from numba.core.caching import NullCache
from numba.core.dispatcher import Dispatcher

import fedcluster
import reference as ref
from reference import num_threads
from fedcluster.common import kernels
from fedcluster.common.kernels import fuzzy as fuzzy_kernels
from fedcluster.common.kernels import _compiled

DTYPES = [np.float32, np.float64]
THREADS = [1, 2]


@pytest.fixture(autouse=True)
def compiled_path(monkeypatch):
    """Every call here goes to the compiled kernels, whatever its size (small inputs go
    to NumPy otherwise: test_small_work.py runs the reference tests on that path)."""
    monkeypatch.setattr(kernels.small_work, "NUMPY_MAX_WORK", -1)




def blobs(n, d, k, seed, spread=10.0):
    """Seeded float64 blobs and centroids near (not at) the blob centres.

    Rows whose two nearest centroids are within a relative 1e-3 of each other
    are dropped, so float32 rounding cannot change a label.
    """
    rng = np.random.default_rng(seed)
    centres = rng.uniform(-spread, spread, size=(k, d))
    X = centres[rng.integers(k, size=n)] + rng.standard_normal((n, d))
    C = centres + 0.3 * rng.standard_normal((k, d))
    if k > 1:
        D = np.sort(ref.sq_dists(X, C), axis=1)
        X = X[D[:, 1] - D[:, 0] > 1e-3 * D[:, 1]]
    return X, C


def make_case(name, dtype):
    """(X, C) in `dtype` for a named test case."""
    if name == "small":  # fewer rows than one block
        X, C = blobs(500, 3, 4, seed=1)
    elif name == "multiblock":  # 20,000 rows: several blocks, ragged last block
        X, C = blobs(20_000, 3, 5, seed=2)
        assert len(X) > 3 * kernels.block_rows(len(X))
    elif name == "d1":
        X, C = blobs(3000, 1, 3, seed=3)
    elif name == "k1":
        X, C = blobs(3000, 4, 1, seed=4)
    elif name == "empty":  # cluster 2 is far away, cluster 3 duplicates cluster 0
        X, C = blobs(2500, 2, 2, seed=5, spread=5.0)
        C = np.vstack([C, [[1e3, 1e3]], C[:1]])
    elif name == "ties":  # k > number of distinct rows; exact ties everywhere
        pts = np.array([[0.0, 0.0], [1.0, 2.0], [-3.0, 0.5]])
        X = np.repeat(pts, [700, 1, 2400], axis=0)
        np.random.default_rng(6).shuffle(X)
        # duplicates of rows of X, and a point equidistant from pts[0] and pts[1]
        C = np.array([[5.0, 5.0], pts[1], pts[0], pts[1], pts[0], [0.5, 1.0]])
    else:  # pragma: no cover
        raise KeyError(name)
    return np.ascontiguousarray(X, dtype=dtype), np.ascontiguousarray(C, dtype=dtype)


CASES = ["small", "multiblock", "d1", "k1", "empty", "ties"]


# Tolerance against a float64 reference on the same (already rounded) inputs:
# only the summation order differs, since the kernels accumulate in float64
# whatever the input dtype (a float32 accumulator would miss this by far).
TIGHT = dict(rtol=1e-12, atol=1e-12)


# --------------------------------------------------------------------------
# Against the references
# --------------------------------------------------------------------------


@pytest.mark.parametrize("threads", THREADS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES)
def test_assign_matches_reference(case, dtype, threads):
    X, C = make_case(case, dtype)
    with num_threads(threads):
        labels, dist = kernels.assign(X, C)
    want_labels, want_dist = ref.assign(X, C)
    assert labels.dtype == np.int64 and dist.dtype == np.float64
    assert labels.shape == dist.shape == (len(X),)
    np.testing.assert_array_equal(labels, want_labels)
    np.testing.assert_allclose(dist, want_dist, **TIGHT)


@pytest.mark.parametrize("threads", THREADS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES)
def test_lloyd_stats_matches_reference(case, dtype, threads):
    X, C = make_case(case, dtype)
    with num_threads(threads):
        sums, counts, sse = kernels.lloyd_stats(X, C)
    want_sums, want_counts, want_sse = ref.lloyd_stats(X, C)
    assert sums.dtype == np.float64 and sums.shape == C.shape
    assert counts.dtype == np.int64 and counts.shape == (len(C),)
    assert isinstance(sse, float)
    np.testing.assert_array_equal(counts, want_counts)
    np.testing.assert_allclose(sums, want_sums, **TIGHT)
    assert sse == pytest.approx(want_sse, rel=1e-12, abs=1e-12)
    assert counts.sum() == len(X)


@pytest.mark.parametrize("threads", THREADS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES)
def test_min_sq_dist_update_matches_reference(case, dtype, threads):
    X, C = make_case(case, dtype)
    rng = np.random.default_rng(7)
    # some rows already closer than any candidate, some with no centre yet
    current = rng.uniform(0, 50, size=len(X))
    current[::7] = np.inf
    with num_threads(threads):
        out = kernels.min_sq_dist_update(X, C, current)
    assert out.dtype == np.float64 and out.shape == (len(C), len(X))
    np.testing.assert_allclose(out, ref.min_sq_dist_update(X, C, current), **TIGHT)
    # both sides of the minimum are actually taken
    assert (out == current[None]).any() and (out < current[None]).any()


def test_special_cases_have_what_they_claim():
    """The named cases really exercise empty clusters and exact ties."""
    _, counts, _ = ref.lloyd_stats(*make_case("empty", np.float64))
    assert counts[2] == 0 and counts[3] == 0 and counts[0] > 0
    X, C = make_case("ties", np.float64)
    D = ref.sq_dists(X, C)
    assert (np.sort(D, 1)[:, 1] == D.min(1)).all()  # every row is tied


def test_ties_go_to_lowest_index():
    X = np.array([[0.0], [2.0], [-2.0]])
    for C in ([[-1.0], [1.0]], [[1.0], [-1.0]]):
        labels, dist = kernels.assign(X, np.array(C))
        assert labels[0] == 0 and dist[0] == 1.0
    labels, _ = kernels.assign(X, np.array([[3.0], [2.0], [2.0], [-2.0], [-2.0]]))
    np.testing.assert_array_equal(labels, [1, 1, 3])
    _, counts, _ = kernels.lloyd_stats(X, np.array([[3.0], [2.0], [2.0], [-2.0], [-2.0]]))
    np.testing.assert_array_equal(counts, [0, 2, 0, 1, 0])


def test_empty_cluster_has_zero_sums_and_counts():
    X, C = make_case("empty", np.float64)
    sums, counts, _ = kernels.lloyd_stats(X, C)
    assert counts[2] == 0 and counts[3] == 0
    assert (sums[2] == 0).all() and (sums[3] == 0).all()
    # nothing was relocated: C is untouched
    np.testing.assert_array_equal(C, make_case("empty", np.float64)[1])


# --------------------------------------------------------------------------
# float32 against the float64 truth
# --------------------------------------------------------------------------


def assert_labels_match_except_near_ties(labels, D_ref, rel):
    """Labels equal the reference's except where its two best distances are within `rel`."""
    best = D_ref.min(1)
    rows = np.flatnonzero(labels != D_ref.argmin(1))
    gap = D_ref[rows, labels[rows]] - best[rows]
    assert (gap <= rel * np.maximum(best[rows], 1e-300)).all(), rows[gap > rel * best[rows]]


@pytest.mark.parametrize("threads", THREADS)
@pytest.mark.parametrize("case", ["small", "multiblock", "d1", "empty"])
def test_float32_close_to_float64_truth(case, threads):
    X64, C64 = make_case(case, np.float64)
    X32 = X64.astype(np.float32)
    with num_threads(threads):
        labels, dist = kernels.assign(X32, C64)  # C64 is rounded to float32 inside
        sums, counts, sse = kernels.lloyd_stats(X32, C64)
    D = ref.sq_dists(X64, C64)
    eps = float(np.finfo(np.float32).eps)
    assert_labels_match_except_near_ties(labels, D, rel=8 * eps)
    # the data has no near-ties, so the labels must in fact be identical
    np.testing.assert_array_equal(labels, D.argmin(1))
    want_sums, want_counts, want_sse = ref.lloyd_stats(X64, C64)
    np.testing.assert_array_equal(counts, want_counts)
    np.testing.assert_allclose(sums, want_sums, rtol=1e-5, atol=1e-5 * np.abs(X64).max())
    np.testing.assert_allclose(dist, D.min(1), rtol=1e-5, atol=1e-5)
    assert sse == pytest.approx(want_sse, rel=1e-5)


def test_float64_centroids_are_rounded_to_float32_data():
    X, C = make_case("multiblock", np.float64)
    X32 = X.astype(np.float32)
    C = C + 1e-9  # not representable in float32
    for f in (kernels.assign, kernels.lloyd_stats):
        got = f(X32, C)
        want = f(X32, C.astype(np.float32))
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(
        kernels.min_sq_dist_update(X32, C[:2], np.full(len(X), np.inf)),
        kernels.min_sq_dist_update(X32, C[:2].astype(np.float32), np.full(len(X), np.inf)),
    )


# --------------------------------------------------------------------------
# Bit-identical for 1 and 2 threads
# --------------------------------------------------------------------------


def run_all(X, C):
    current = np.random.default_rng(0).uniform(0, 100, size=len(X))
    return (
        *kernels.assign(X, C),
        *kernels.lloyd_stats(X, C),
        kernels.min_sq_dist_update(X, C, current),
    )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [20_000, 61_441])
def test_bit_identical_for_1_and_2_threads(dtype, n):
    rng = np.random.default_rng(n)
    # wide range of magnitudes so that any change of summation order shows
    X = (rng.standard_normal((n, 7)) * np.exp(rng.uniform(-8, 8, size=(n, 1)))).astype(dtype)
    C = X[rng.choice(n, 6, replace=False)]
    with num_threads(1):
        one = run_all(X, C)
    with num_threads(2):
        two = run_all(X, C)
    for a, b in zip(one, two):
        assert np.array_equal(a, b), "result depends on the number of threads"
    assert isinstance(one[4], float)  # sse compared exactly above


# --------------------------------------------------------------------------
# Wrappers: contiguity, dtype, argument checks; NaN semantics; block size
# --------------------------------------------------------------------------


def test_non_contiguous_inputs_are_accepted():
    X, C = make_case("small", np.float64)
    XF = np.asfortranarray(X)
    Xs = np.repeat(X, 2, axis=0)[::2]
    for Xn in (XF, Xs):
        assert not Xn.flags.c_contiguous
        for a, b in zip(kernels.lloyd_stats(Xn, C), kernels.lloyd_stats(X, C)):
            np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(kernels.assign(Xn, np.asfortranarray(C))[0], kernels.assign(X, C)[0])


@pytest.mark.parametrize(
    "X, C, exc",
    [
        (np.zeros(5), np.zeros((1, 1)), ValueError),  # 1-D X
        (np.zeros((5, 2)), np.zeros(2), ValueError),  # 1-D C
        (np.zeros((5, 2)), np.zeros((3, 3)), ValueError),  # d mismatch
        (np.zeros((5, 2)), np.zeros((0, 2)), ValueError),  # k = 0
        (np.zeros((5, 0)), np.zeros((1, 0)), ValueError),  # d = 0
        (np.zeros((5, 2), dtype=np.int64), np.zeros((1, 2)), TypeError),
        (np.zeros((5, 2), dtype=np.float16), np.zeros((1, 2)), TypeError),
        (np.zeros((5, 2)), np.zeros((1, 2), dtype=complex), TypeError),
    ],
)
def test_bad_arguments_are_rejected(X, C, exc):
    for f in (kernels.assign, kernels.lloyd_stats):
        with pytest.raises(exc):
            f(X, C)


def test_min_sq_dist_update_arguments():
    X, C = make_case("small", np.float64)
    inf = np.full(len(X), np.inf)
    one = kernels.min_sq_dist_update(X, C[1], inf)  # 1-D centre -> (n,)
    assert one.shape == (len(X),)
    np.testing.assert_array_equal(one, kernels.min_sq_dist_update(X, C[1:2], inf)[0])
    with pytest.raises(ValueError):
        kernels.min_sq_dist_update(X, C, inf[:-1])


def test_empty_data():
    X = np.zeros((0, 3))
    labels, dist = kernels.assign(X, np.ones((2, 3)))
    assert labels.shape == dist.shape == (0,)
    sums, counts, sse = kernels.lloyd_stats(X, np.ones((2, 3)))
    assert (sums == 0).all() and (counts == 0).all() and sse == 0.0


def test_nan_propagates():
    """No nnan fast-math flag: a NaN row shows up in its distance and the SSE."""
    X = np.array([[0.0, 0.0], [np.nan, 1.0], [5.0, 5.0]])
    C = np.array([[5.0, 5.0], [0.0, 0.0]])
    labels, dist = kernels.assign(X, C)
    np.testing.assert_array_equal(labels, [1, 0, 0])
    assert np.isnan(dist[1]) and dist[0] == 0 and dist[2] == 0
    assert np.isnan(kernels.lloyd_stats(X, C)[2])
    out = kernels.min_sq_dist_update(X, C[:1], np.array([1.0, 1.0, np.nan]))
    assert out[0, 0] == 1.0 and np.isnan(out[0, 1]) and np.isnan(out[0, 2])


def test_block_rows():
    assert kernels.block_rows(0) == 2048
    assert kernels.block_rows(20_000) == 2048
    assert kernels.block_rows(2048 * 256) == 2048
    assert kernels.block_rows(2048 * 256 + 1) == 2049
    assert kernels.block_rows(10**7) == 39063
    for n in [1, 2047, 2049, 20_000, 524_289, 10**7, 10**9 + 7]:
        b = kernels.block_rows(n)
        assert b >= 2048 and -(-n // b) <= 256
    with pytest.raises(ValueError):
        kernels.block_rows(-1)


def test_fastmath_flags():
    assert kernels.FASTMATH <= {"nsz", "arcp", "contract", "reassoc", "afn"}
    assert not kernels.FASTMATH & {"nnan", "ninf", "fast"}
    for impl in (kernels._assign_impl, kernels._lloyd_stats_impl, kernels._min_sq_dist_update_impl):
        assert impl.targetoptions["fastmath"] == kernels.FASTMATH
        assert impl.targetoptions["parallel"] is True
    for impl, twin in kernels._SERIAL.items():
        assert impl.targetoptions["parallel"] is True
        assert twin.targetoptions["fastmath"] == kernels.FASTMATH
        assert not twin.targetoptions.get("parallel")
        assert twin.py_func.__code__ is impl.py_func.__code__  # the same code


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 101, 2048])
def test_one_block_runs_the_serial_twin_with_the_same_bits(dtype, n):
    """Up to one block of rows the wrappers call the serial twin (no thread pool to
    wait for); it gives exactly what the parallel kernel gives."""
    rng = np.random.default_rng(n)
    X = rng.standard_normal((n, 5)).astype(dtype)
    C = np.ascontiguousarray(X[[0, -1, n // 2]])
    block = kernels.block_rows(n)
    assert kernels._for_rows(kernels._lloyd_stats_impl, n) is kernels._SERIAL[kernels._lloyd_stats_impl]
    assert kernels._for_rows(kernels._lloyd_stats_impl, n + 2048) is kernels._lloyd_stats_impl
    # Rows (weights 1, no scatter): the same bits. Groups: the same up to the last bits
    # (LLVM vectorises the weighted sums of the two differently; which of the two runs
    # depends on n alone, so the result still does not depend on the thread count).
    for (w, s), exact in (((np.ones(n, dtype=np.int64), np.zeros(n)), True),
                          ((rng.integers(1, 4, size=n), rng.random(n)), False)):
        for impl, args in ((kernels._lloyd_stats_impl, (X, w, s, C, block)),
                           (kernels._assign_impl, (X, C, block)),
                           (kernels._evaluation_stats_impl, (X, w, s, C, block)),
                           (kernels._fcm_stats_impl, (X, w, C, 2.0, np.zeros(len(X)), block)),
                           (kernels._min_sq_dist_update_impl, (X, C, np.full(n, np.inf)))):
            parallel, serial = impl(*args), kernels._SERIAL[impl](*args)
            for a, b in zip(parallel if isinstance(parallel, tuple) else (parallel,),
                            serial if isinstance(serial, tuple) else (serial,)):
                if exact:
                    np.testing.assert_array_equal(a, b)
                else:
                    np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-12)
    sums, counts, sse = kernels.lloyd_stats(X, C)
    want = kernels._lloyd_stats_impl(X, np.ones(n, dtype=np.int64), np.zeros(n), C, block)
    np.testing.assert_array_equal(sums, want[0])
    np.testing.assert_array_equal(counts, want[1])
    assert sse == want[2]


# --------------------------------------------------------------------------
# Groups: each row a group's mean, weighted by its rows, with its scatter
# --------------------------------------------------------------------------


def grouped_case(n_rows: int, seed: int = 0):
    """Rows cut into groups of 1..5 (consecutive rows), and the groups' (means, counts,
    scatter), with a numpy reference of every weighted kernel from the ROWS: each group
    goes whole to the centroid nearest its mean."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n_rows, 5)) * [1, 3, 0.5, 10, 1] + [0, 0, 0, 50, 0]
    sizes = rng.integers(1, 6, size=n_rows)
    group_of_row = np.repeat(np.arange(n_rows), sizes)[:n_rows]
    G = group_of_row.max() + 1
    counts = np.bincount(group_of_row, minlength=G)
    means = np.stack([X[group_of_row == g].mean(0) for g in range(G)])
    scatter = np.array([((X[group_of_row == g] - means[g]) ** 2).sum() for g in range(G)])
    return X, group_of_row, means, counts, scatter


@pytest.mark.parametrize("n_rows", [300, 9000])
def test_the_weighted_kernels_are_the_groups_statistics_from_their_rows(n_rows):
    X, group_of_row, means, counts, scatter = grouped_case(n_rows)
    C = means[[0, 7, 20, 41]] + 0.3
    cluster = ref.assign(means, C)[0][group_of_row]  # each row goes where its group's mean goes
    k = C.shape[0]
    want_sums = np.stack([X[cluster == j].sum(0) for j in range(k)])
    want_counts = np.bincount(cluster, minlength=k)
    want_sse = ((X - C[cluster]) ** 2).sum()
    sums, got_counts, sse = kernels.lloyd_stats(means, C, counts, scatter)
    np.testing.assert_allclose(sums, want_sums, rtol=1e-11, atol=1e-9)
    np.testing.assert_array_equal(got_counts, want_counts)
    assert sse == pytest.approx(want_sse, rel=1e-11)
    e_sums, e_counts, sqnorms, e_sse, sil = kernels.evaluation_stats(means, C, counts, scatter)
    np.testing.assert_allclose(e_sums, want_sums, rtol=1e-11, atol=1e-9)
    np.testing.assert_array_equal(e_counts, want_counts)
    assert e_sse == pytest.approx(want_sse, rel=1e-11)
    # Per cluster every figure is of the groups' means (times their rows): a group's
    # spread is in the total SSE only, no per-cluster figure carries it.
    labels = ref.assign(means, C)[0]
    np.testing.assert_allclose(sqnorms, np.bincount(labels, weights=counts * (means ** 2).sum(1),
                                                    minlength=k), rtol=1e-11)
    D = ref.sq_dists(means, C)
    a, b = np.sqrt(np.sort(D, 1)[:, 0]), np.sqrt(np.sort(D, 1)[:, 1])
    assert sil == pytest.approx((counts * (b - a) / np.maximum(a, b)).sum(), rel=1e-11)
    distances, d_counts = kernels.distance_to_means(means, C, C, counts)
    np.testing.assert_allclose(distances, np.bincount(labels, weights=counts * a, minlength=k),
                               rtol=1e-11)
    # fuzzy: a group's rows take the memberships of its mean
    U = ref.fcm_memberships(means, C, 2.0)
    f_sums, f_weights, hard = fuzzy_kernels.fcm_stats(means, C, 2.0, counts)
    np.testing.assert_allclose(f_weights, (counts[:, None] * U**2).sum(0), rtol=1e-11)
    np.testing.assert_allclose(f_sums, (counts[:, None] * U**2).T @ means, rtol=1e-10)
    np.testing.assert_array_equal(hard, np.bincount(U.argmax(1), weights=counts, minlength=k))


def test_weights_of_one_and_no_scatter_are_the_rows_bit_for_bit():
    X, C = make_case("small", np.float64)
    ones, zeros = np.ones(len(X), dtype=np.int64), np.zeros(len(X))
    for a, b in zip(kernels.lloyd_stats(X, C, ones, zeros), kernels.lloyd_stats(X, C)):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(kernels.evaluation_stats(X, C, ones, zeros), kernels.evaluation_stats(X, C)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("n", [20_000, 61_441])
def test_weighted_kernels_bit_identical_for_1_and_2_threads(n):
    rng = np.random.default_rng(n)
    X = rng.standard_normal((n, 7)) * np.exp(rng.uniform(-8, 8, size=(n, 1)))
    C = X[rng.choice(n, 6, replace=False)]
    w, s = rng.integers(1, 9, size=n), rng.random(n) * 10

    def every():
        return (*kernels.lloyd_stats(X, C, w, s), *kernels.evaluation_stats(X, C, w, s),
                *kernels.distance_to_means(X, C, C, w), *fuzzy_kernels.fcm_stats(X, C, 2.0, w))

    with num_threads(1):
        one = every()
    with num_threads(2):
        two = every()
    for a, b in zip(one, two):
        assert np.array_equal(a, b), "result depends on the number of threads"


def test_a_spread_softens_the_memberships_as_the_rows_would_see_them():
    """fcm_stats(spread=s) gives each point the memberships of squared distances + s:
    those a group's rows have on average (E||x - c||^2 = ||mean - c||^2 + spread)."""
    rng = np.random.default_rng(3)
    X, C = rng.normal(size=(500, 4)), rng.normal(size=(3, 4))
    w = rng.integers(1, 4, size=500)
    D = ref.sq_dists(X, C) + 0.7
    U = (1 / D) / (1 / D).sum(1, keepdims=True)
    for force_compiled in (False, True):
        with pytest.MonkeyPatch.context() as patch:
            if force_compiled:
                patch.setattr(kernels.small_work, "NUMPY_MAX_WORK", -1)
            sums, weights, hard = fuzzy_kernels.fcm_stats(X, C, 2.0, w, spread=0.7)
            np.testing.assert_allclose(weights, (w[:, None] * U**2).sum(0), rtol=1e-10)
            np.testing.assert_allclose(sums, (w[:, None] * U**2).T @ X, rtol=1e-10)
            np.testing.assert_allclose(fuzzy_kernels.fcm_memberships(X, C, 2.0, 0.7), U, rtol=1e-12)
    with pytest.raises(ValueError, match="spread"):
        fuzzy_kernels.fcm_stats(X, C, 2.0, spread=-1.0)


def test_a_weight_under_one_is_refused():
    X, C = make_case("small", np.float64)
    with pytest.raises(ValueError, match="weight"):
        kernels.lloyd_stats(X, C, np.zeros(len(X), dtype=np.int64))


# --------------------------------------------------------------------------
# All compiled code in one module: Numba's on-disk cache keys a kernel on its
# own source file, and does not notice an edit to a callee in another file
# --------------------------------------------------------------------------


def dispatchers(module) -> list[Dispatcher]:
    """Every Numba dispatcher of ``module``: its attributes, and the keys and values of
    its dict attributes (the serial twins)."""
    found = {}
    for value in vars(module).values():
        items = [*value.keys(), *value.values()] if isinstance(value, dict) else [value]
        for item in items:
            if isinstance(item, Dispatcher):
                found[id(item)] = item
    return list(found.values())


def code_names(code: types.CodeType) -> set[str]:
    """The global, attribute and free-variable names ``code`` uses, nested code included."""
    names = set(code.co_names) | set(code.co_freevars)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= code_names(const)
    return names


def foreign_callees(module) -> list[tuple[str, str, str]]:
    """``(kernel, name, module)`` for every cached (``cache=True``) dispatcher of
    ``module`` whose code names a dispatcher defined in another module: through its
    globals, its closure, or an attribute of a module it names (``other.kernel``)."""
    found = []
    for disp in dispatchers(module):
        if isinstance(disp._cache, NullCache):  # not cached: nothing goes stale on disk
            continue
        f = disp.py_func
        scope = dict(f.__globals__)
        for name, cell in zip(f.__code__.co_freevars, f.__closure__ or ()):
            try:
                scope[name] = cell.cell_contents
            except ValueError:  # an empty cell
                pass
        names = code_names(f.__code__)
        for name in sorted(names & scope.keys()):
            value = scope[name]
            if isinstance(value, types.ModuleType):
                targets = [(f"{name}.{attr}", getattr(value, attr, None)) for attr in sorted(names)]
            else:
                targets = [(name, value)]
            for label, target in targets:
                if isinstance(target, Dispatcher) and target.__module__ != module.__name__:
                    found.append((f.__qualname__, label, target.__module__))
    return found


def test_compiled_kernels_call_only_dispatchers_of_their_own_module():
    disps = dispatchers(_compiled)
    # every compiled function is found (the wrappers' kernels, the twins and the helpers)
    assert {d.py_func.__name__ for d in disps} >= {
        "_assign_impl", "_lloyd_stats_impl", "_gtv_m_step_impl", "_sq_dist", "_tile_sq_dists",
        "_memberships", "_assign_impl_serial", "_fcm_memberships_impl_serial"}
    for disp in disps:
        assert disp.__module__ == _compiled.__name__, disp
        assert not isinstance(disp._cache, NullCache), f"{disp.py_func.__name__} is not cache=True"
    assert foreign_callees(_compiled) == []
    # the package re-exports the compiled kernels, it does not define any
    assert all(d.__module__ == _compiled.__name__ for d in dispatchers(kernels))


def load_module(tmp_path, monkeypatch, name, source):
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(source))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)  # removed again after the test
    spec.loader.exec_module(module)
    return module


def test_foreign_callee_checker_flags_a_dispatcher_of_another_module(tmp_path, monkeypatch):
    """The checker above does find a cached kernel calling another module's kernel, by
    name, as a module attribute and from a closure (nothing is compiled here)."""
    load_module(tmp_path, monkeypatch, "fc_foreign_kernels", """
        from numba import njit

        @njit(cache=True)
        def helper(x):
            return x + 1

        @njit(cache=True)
        def twice(x):
            return 2 * x
        """)
    user = load_module(tmp_path, monkeypatch, "fc_user_kernels", """
        from numba import njit
        import fc_foreign_kernels as other
        from fc_foreign_kernels import helper

        @njit(cache=True)
        def local(x):
            return 2 * x

        @njit(cache=True)
        def calls_local(x):
            return local(x)

        @njit(cache=True)
        def calls_foreign(x):
            return local(helper(x))

        @njit(cache=True)
        def calls_foreign_attr(x):
            return other.twice(x)

        def _make():
            h = helper

            @njit(cache=True)
            def calls_foreign_in_closure(x):
                return h(x)
            return calls_foreign_in_closure

        calls_foreign_in_closure = _make()

        @njit
        def uncached(x):  # no cache entry to go stale
            return helper(x)
        """)
    assert sorted(foreign_callees(user)) == [
        ("_make.<locals>.calls_foreign_in_closure", "h", "fc_foreign_kernels"),
        ("calls_foreign", "helper", "fc_foreign_kernels"),
        ("calls_foreign_attr", "other.twice", "fc_foreign_kernels"),
    ]


def numba_imports(path: Path) -> list[int]:
    """Line numbers where the Python file ``path`` imports numba (``import numba...``,
    ``from numba... import``, or ``importlib.import_module``/``__import__`` of it)."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""] if node.level == 0 else []
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            names = [node.args[0].value] if called in ("import_module", "__import__") else []
        else:
            continue
        if any(isinstance(n, str) and n.split(".")[0] == "numba" for n in names):
            lines.append(node.lineno)
    return lines


def test_only_the_compiled_module_imports_numba():
    root = Path(fedcluster.__file__).resolve().parent
    compiled = Path(_compiled.__file__).resolve()
    assert numba_imports(compiled)  # the checker sees an import
    offenders = {str(path.relative_to(root.parent)): numba_imports(path)
                 for path in sorted(root.rglob("*.py")) if path.resolve() != compiled}
    assert {path: lines for path, lines in offenders.items() if lines} == {}


# --------------------------------------------------------------------------
# The on-disk cache works in a fresh process (one process per federated round)
# --------------------------------------------------------------------------

CACHE_SCRIPT = textwrap.dedent(
    """
    import json, time
    import numpy as np
    from fedcluster.common import kernels as K

    K.small_work.NUMPY_MAX_WORK = -1  # these sizes would go to NumPy otherwise
    impls = ("_assign_impl", "_lloyd_stats_impl", "_min_sq_dist_update_impl")
    t0 = time.perf_counter()
    for dtype in (np.float32, np.float64):
        # one block (the serial twins) and several blocks (the parallel kernels)
        for n in (300, 5000):
            X = np.random.default_rng(0).standard_normal((n, 3)).astype(dtype)
            C = X[:4]
            K.assign(X, C)
            K.lloyd_stats(X, C)
            K.min_sq_dist_update(X, C, np.full(len(X), np.inf))
    seconds = time.perf_counter() - t0
    out = {"seconds": seconds}
    for name in impls:
        for label, f in ((name, getattr(K, name)), (name + "_serial", K._SERIAL[getattr(K, name)])):
            out[label] = {
                "parallel": bool(f.targetoptions.get("parallel")),
                "hits": sum(f.stats.cache_hits.values()),
                "misses": sum(f.stats.cache_misses.values()),
                "signatures": len(f.signatures),
            }
    out["module"] = K.__file__
    print(json.dumps(out))
    """
)


def test_parallel_kernels_load_from_cache_in_a_fresh_process(tmp_path):
    env = dict(os.environ)
    env["NUMBA_CACHE_DIR"] = str(tmp_path / "numba-cache")
    env.pop("NUMBA_DISABLE_JIT", None)
    env.pop("NUMBA_CACHE_LOCATOR_CLASSES", None)

    def run(cwd=None):
        proc = subprocess.run(
            [sys.executable, "-c", CACHE_SCRIPT],
            env=env, capture_output=True, text=True, timeout=300, cwd=cwd,
        )
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout.strip().splitlines()[-1])

    first = run()
    second = run()
    # A copy of the package in another folder (as a site installs each app version in
    # a folder of its own) loads the same entries: the cache folder is named by the
    # kernels' source, not by where it sits (_compiled.SourceKeyedCacheLocator).
    copy = tmp_path / "new-app-version"
    shutil.copytree(Path(kernels.__file__).parents[2], copy / "fedcluster",
                    ignore=shutil.ignore_patterns("__pycache__"))
    env["PYTHONPATH"] = str(copy)
    from_copy = run(cwd=copy)
    assert from_copy["module"].startswith(str(copy)), from_copy["module"]
    for name in ("_assign_impl", "_lloyd_stats_impl", "_min_sq_dist_update_impl"):
        assert from_copy[name]["misses"] == 0 and from_copy[name]["hits"] == 2, from_copy
    assert [p.name for p in (tmp_path / "numba-cache").iterdir()] == [
        f"fedcluster-kernels-{hashlib.sha256(Path(_compiled.__file__).read_bytes()).hexdigest()[:32]}"]
    impls = ("_assign_impl", "_lloyd_stats_impl", "_min_sq_dist_update_impl")
    for name in impls:
        for label, parallel in ((name, True), (name + "_serial", False)):
            # fresh cache: both dtype specialisations compiled, nothing loaded
            assert first[label] == {"parallel": parallel, "hits": 0, "misses": 2,
                                    "signatures": 2}, first
            # second process: both loaded from disk, nothing compiled (the twin has its
            # own cache entry: never the parallel kernel's)
            assert second[label] == {"parallel": parallel, "hits": 2, "misses": 0,
                                     "signatures": 2}, second
    assert any(p.suffix == ".nbi" for p in (tmp_path / "numba-cache").rglob("*"))
    print(f"first call: {first['seconds']:.2f} s compiling, {second['seconds']:.2f} s from cache")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch", [1, 7, 64, 500])
def test_minibatch_epoch_matches_reference(dtype, batch):
    rng = np.random.default_rng(batch)
    X = np.vstack([rng.normal(c, 0.3, (100, 3)) for c in (0.0, 4.0, 8.0)]).astype(dtype)
    order = rng.permutation(len(X))
    gamma0 = np.array([[0.5] * 3, [3.0] * 3, [20.0] * 3])  # the last one gets no member
    want_gamma, want_lam = ref.minibatch_epoch(X, order, batch, gamma0, 0.7)
    gamma = gamma0.copy()
    lam = kernels.minibatch_epoch(X, order, batch, gamma, 0.7)
    np.testing.assert_array_equal(lam, want_lam)
    np.testing.assert_allclose(gamma, want_gamma, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(gamma[2], gamma0[2])


def test_minibatch_full_batch_beta_one_is_a_lloyd_step():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(300, 2))
    C = X[:4].copy()
    gamma = C.copy()
    lam = kernels.minibatch_epoch(X, np.arange(300), 300, gamma, 1.0)
    sums, counts, _ = kernels.lloyd_stats(X, C)
    np.testing.assert_array_equal(lam, counts)
    np.testing.assert_allclose(gamma, sums / counts[:, None], rtol=1e-13)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("threads", THREADS)
@pytest.mark.parametrize("m", [1.5, 2.0, 3.0])
def test_fcm_stats_matches_reference(dtype, threads, m):
    rng = np.random.default_rng(int(m * 10))
    X = rng.normal(size=(5000, 3)).astype(dtype)
    C = np.vstack([X[7], rng.normal(size=(3, 3))]).astype(dtype)  # row 7 sits on centre 0
    X[11] = C[2]  # and row 11 on centre 2
    with num_threads(threads):
        sums, weights, hard = fuzzy_kernels.fcm_stats(X, C, m)
    u = ref.fcm_memberships(X, C, m)
    assert u[7, 0] == 1.0 and u[11, 2] == 1.0
    w = u ** m
    np.testing.assert_allclose(weights, w.sum(0), rtol=1e-10)
    np.testing.assert_allclose(sums, w.T @ X.astype(np.float64), rtol=1e-9, atol=1e-9)
    np.testing.assert_array_equal(hard, np.bincount(u.argmax(1), minlength=4))


def test_fcm_stats_thread_invariant_and_rejects_bad_m():
    X = np.random.default_rng(0).normal(size=(20000, 4))
    C = X[:5].copy()
    with num_threads(1):
        one = fuzzy_kernels.fcm_stats(X, C, 2.0)
    with num_threads(2):
        two = fuzzy_kernels.fcm_stats(X, C, 2.0)
    for a, b in zip(one, two):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="fuzzifier m must be > 1"):
        fuzzy_kernels.fcm_stats(X, C, 1.0)

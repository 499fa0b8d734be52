"""The checked wrappers of the fuzzy c-means kernels (Bezdek memberships, fuzzifier m),
as those of :mod:`fedcluster.common.kernels`: argument checks, the block size, serial or
parallel, NumPy below ``small_work``'s size."""

from __future__ import annotations

import numpy as np

from fedcluster.common import kernels
from fedcluster.common.kernels import small_work


def fcm_stats(X, C, m: float, weights=None):
    """Sufficient statistics of one fuzzy c-means step (Bezdek memberships, fuzzifier m).

    Returns ``(sums, weights, hard_counts)``: sum_i u_ij^m x_i (k, d), W_j = sum_i
    u_ij^m (k,), and the sizes of the hard assignment (argmax membership, ties to the
    lowest index), which the privacy floor is applied to. A row that coincides with a
    centre has membership 1 there and 0 elsewhere. Deterministic for any thread count.
    With ``weights``, row i is the mean of a group of ``weights[i]`` rows, each given
    the group's memberships (those of its mean): it counts that many times.
    """
    X = kernels._check_X(X)
    C = kernels._check_centres(C, X)
    if not m > 1.0:
        raise ValueError(f"the fuzzifier m must be > 1, got {m}")
    w, _ = kernels._group_weights(X, weights, None)
    if small_work.small(X, C.shape[0]):
        return small_work.fcm_stats(X, C, float(m), w)
    return kernels._blocked("_fcm_stats_impl", X, w, C, float(m))


def fcm_memberships(X, C, m: float) -> np.ndarray:
    """Bezdek memberships (n, k) of every row (rows sum to 1; a row on a centre has 1
    there)."""
    X = kernels._check_X(X)
    C = kernels._check_centres(C, X)
    if not m > 1.0:
        raise ValueError(f"the fuzzifier m must be > 1, got {m}")
    if small_work.small(X, C.shape[0]):
        return small_work.fcm_memberships(X, C, float(m))
    return kernels._blocked("_fcm_memberships_impl", X, C, float(m))

"""Slow, obviously-correct numpy references for the kernels and local k-means.

Everything is computed in float64 by broadcasting, with no blocking and no
cleverness; memory is O(n * k * d), so keep the test data small.  Ties go to
the lowest index because ``np.argmin`` returns the first minimum.

The references take the arrays they are given: to mirror the kernels'
contract (centroids are converted to X's dtype before the assignment), pass
``C.astype(X.dtype)`` yourself, or use ``round_centroids=True`` in
:func:`lloyd_trajectory`.
"""

from __future__ import annotations

import contextlib

import numba
import numpy as np


def sq_dists(X, C) -> np.ndarray:
    """(n, k) matrix of squared Euclidean distances, in float64."""
    X = np.asarray(X, dtype=np.float64)
    C = np.asarray(C, dtype=np.float64)
    return ((X[:, None, :] - C[None, :, :]) ** 2).sum(-1)


def assign(X, C) -> tuple[np.ndarray, np.ndarray]:
    """Labels (lowest index on ties) and squared distance to the nearest centroid."""
    d = sq_dists(X, C)
    labels = d.argmin(1)
    return labels.astype(np.int64), d[np.arange(len(d)), labels]


def simplified_silhouette(X, C) -> float:
    """Mean over rows of (b - a) / max(a, b), a and b the distances to the nearest and
    second nearest centroid (0 for a row where both are 0)."""
    d = np.sqrt(sq_dists(X, C))
    d.sort(axis=1)
    a, b = d[:, 0], d[:, 1]
    top = np.maximum(a, b)
    return float(np.mean(np.where(top > 0, (b - a) / np.where(top > 0, top, 1), 0.0)))


def lloyd_stats(X, C) -> tuple[np.ndarray, np.ndarray, float]:
    """Per-cluster sums (float64), counts and SSE of the assignment of X to C."""
    X64 = np.asarray(X, dtype=np.float64)
    k = np.asarray(C).shape[0]
    labels, dist = assign(X, C)
    sums = np.zeros((k, X64.shape[1]))
    np.add.at(sums, labels, X64)
    counts = np.bincount(labels, minlength=k).astype(np.int64)
    return sums, counts, float(dist.sum())


def min_sq_dist_update(X, centres, current) -> np.ndarray:
    """(m, n): min(current[i], ||X[i] - centres[t]||^2) for each candidate t."""
    return np.minimum(np.asarray(current, np.float64)[None, :], sq_dists(X, centres).T)


def lloyd_trajectory(X, C0, n_iter: int, round_centroids: bool = True):
    """Plain Lloyd: list of (C, counts, shift) after each of `n_iter` updates.

    ``counts`` are those of the assignment that produced ``C``; an empty
    cluster keeps its centroid; ``shift`` is the Frobenius norm of the move.
    With ``round_centroids`` the assignment uses C rounded to X's dtype, as
    the kernels do.
    """
    X = np.asarray(X)
    C = np.array(C0, dtype=np.float64)
    out = []
    for _ in range(n_iter):
        C_assign = C.astype(X.dtype) if round_centroids else C
        labels, _ = assign(X, C_assign)
        new = C.copy()
        counts = np.zeros(len(C), dtype=np.int64)
        for j in range(len(C)):
            members = labels == j
            counts[j] = members.sum()
            if counts[j] > 0:
                new[j] = np.asarray(X[members], dtype=np.float64).mean(0)
        out.append((new, counts, float(np.linalg.norm(new - C))))
        C = new
    return out


def kmeans_plusplus(X, k: int, seed) -> np.ndarray:
    """Greedy k-means++ with the same random stream as the library's.

    Candidates by D^2 sampling (``2 + int(log k)`` per centre) on the
    sequential cumulative sum, the candidate with the smallest potential
    wins; uniform draw when every row coincides with a chosen centre.
    """
    X = np.asarray(X)
    n = len(X)
    rng = np.random.default_rng(seed)
    n_trials = 2 + int(np.log(k))
    first = int(rng.integers(n))
    centres = [np.asarray(X[first], dtype=np.float64)]
    closest = sq_dists(X, X[first:first + 1])[:, 0]
    for _ in range(1, k):
        cumulative = np.cumsum(closest)
        if cumulative[-1] > 0:
            draws = rng.random(n_trials) * cumulative[-1]
            candidates = np.minimum(np.searchsorted(cumulative, draws, side="right"), n - 1)
        else:
            candidates = rng.integers(n, size=1)
        updated = np.minimum(closest[None, :], sq_dists(X, X[candidates]).T)
        best = int(np.argmin(updated.sum(1)))
        closest = updated[best]
        centres.append(np.asarray(X[candidates[best]], dtype=np.float64))
    return np.array(centres)


# -- test harness helper shared by the kernel tests ------------------------
@contextlib.contextmanager
def num_threads(n: int):
    """Run with `n` Numba threads, restoring the previous setting."""
    if n > numba.config.NUMBA_NUM_THREADS:  # pragma: no cover - machine dependent
        raise RuntimeError(
            f"this test needs {n} Numba threads but NUMBA_NUM_THREADS is "
            f"{numba.config.NUMBA_NUM_THREADS}; run with NUMBA_NUM_THREADS=2"
        )
    old = numba.get_num_threads()
    numba.set_num_threads(n)
    try:
        yield
    finally:
        numba.set_num_threads(old)


def minibatch_epoch(X, order, batch, gamma, beta):
    """Slow reference of one mini-batch k-means epoch (ALGORITHMS.md sec. 2)."""
    gamma = np.array(gamma, dtype=np.float64)
    lam = np.zeros(len(gamma), dtype=np.int64)
    for start in range(0, len(order), batch):
        rows = X[order[start:start + batch]].astype(np.float64)
        labels = ((rows[:, None, :] - gamma[None]) ** 2).sum(-1).argmin(1)
        for c in range(len(gamma)):
            members = rows[labels == c]
            if len(members):
                lam[c] += len(members)
                gamma[c] += beta * len(members) / lam[c] * (members.mean(0) - gamma[c])
    return gamma, lam


def fcm_memberships(X, C, m):
    """Bezdek memberships (n, k), with the exact-hit case: a row on a centre belongs to it."""
    d = ((X[:, None, :].astype(np.float64) - C[None].astype(np.float64)) ** 2).sum(-1)
    u = np.zeros_like(d)
    hit = d == 0
    has_hit = hit.any(axis=1)
    u[has_hit, hit[has_hit].argmax(axis=1)] = 1.0
    free = ~has_hit
    ratio = (d[free][:, :, None] / d[free][:, None, :]) ** (1.0 / (m - 1.0))
    u[free] = 1.0 / ratio.sum(axis=2)
    return u


def gtv_update(X, W, N, alpha, floor=1):
    """GTVMin E1-E3 and M (ALGORITHMS.md section 6), loop by loop, as printed there."""
    X64 = np.asarray(X, dtype=np.float64)
    W = np.asarray(W, dtype=np.float64)
    k, d = W.shape
    labels, dist = assign(X, W.astype(np.asarray(X).dtype))  # E1
    counts = np.bincount(labels, minlength=k)
    num = np.zeros((k, d))
    den = np.zeros(k)
    for c in range(k):
        if counts[c] >= floor:
            num[c] += X64[labels == c].sum(0)
            den[c] += counts[c]
    gtv = 0.0
    for Nj in np.asarray(N, dtype=np.float64):
        to_local = sq_dists(Nj, W)  # (k', k)
        for cp in range(len(Nj)):  # E2: a(i', c') = nearest local centroid
            a = int(np.argmin(to_local[cp]))
            num[a] += alpha * Nj[cp]
            den[a] += alpha
            gtv += to_local[cp, a]
        for c in range(k):  # E3: b(i', c) = nearest centroid of the neighbour
            b = int(np.argmin(to_local[:, c]))
            num[c] += alpha * Nj[b]
            den[c] += alpha
            gtv += to_local[b, c]
    W_new = W.copy()
    W_new[den > 0] = num[den > 0] / den[den > 0, None]
    return W_new, counts, float(dist.sum()), gtv

"""Single-site clustering: k-means++ seeding, Lloyd iterations, local k-means.

Everything here runs on one site's groups (``site_groups.py``: each point is a group's
mean, weighted by its rows; with p_site = 1 a point is a row and every weight 1, which
gives the row-level algorithm bit for bit) and is built on the compiled kernels of
:mod:`fedcluster.common.kernels`, which return sums and counts; the division and the
policies live here.

Empty-cluster policy
--------------------
A cluster that receives no row in an assignment **keeps its current
centroid** (it is not relocated, re-seeded or dropped).  Its count is 0, so
anything weighting centroids by their counts ignores it.

Determinism
-----------
For a given seed, data and centroids, every function here returns the same
bits whatever the number of Numba threads (see the kernels' reproducibility
contract).  Randomness comes only from ``np.random.default_rng(seed)``.
"""

from __future__ import annotations

import numpy as np

from fedcluster.common import kernels
from fedcluster.common.kernels import frobenius
from fedcluster.client_app.mapped_pages import read_only_mapping, release_pages

__all__ = ["frobenius", "kmeans_plusplus", "lloyd", "local_kmeans"]


# k-means++ passes over a read-only memory-mapped site in chunks of this many rows and
# drops each chunk's pages from the process once done (see _min_sq_dist_update).


def _min_sq_dist_update(X, centre, current) -> np.ndarray:
    """``kernels.min_sq_dist_update`` for one centre; on a large read-only memory-mapped
    site in chunks of rows, each chunk's pages dropped once done.

    k-means++ makes ``k x (2 + log k)`` passes over the data with a few n-vectors alive;
    with the chunks, the site's rows are not all resident at the same time as those
    vectors (bench/scale.py: the peak memory of a 1,000,000 x 64 site). The result is
    the same bits: one value per row, every chunk (> 2048 rows, the last takes the rest)
    through the same parallel kernel as the whole array.
    """
    n = X.shape[0]
    if n < 2 * kernels.CHUNK_ROWS or read_only_mapping(X) is None:
        return kernels.min_sq_dist_update(X, centre, current)
    out = np.empty(n, dtype=np.float64)
    starts = list(range(0, n - kernels.CHUNK_ROWS, kernels.CHUNK_ROWS))
    for start, stop in zip(starts, [*starts[1:], n]):
        out[start:stop] = kernels.min_sq_dist_update(X[start:stop], centre, current[start:stop])
        release_pages(X)
    return out


def _check_data(X) -> np.ndarray:
    return np.ascontiguousarray(kernels.check_rows(X, min_rows=1))


def kmeans_plusplus(X, k: int, seed, weights=None) -> np.ndarray:
    """Greedy k-means++ seeding (Arthur & Vassilvitskii 2007, as in scikit-learn).

    The first centre is a row drawn uniformly at random.  Each further centre
    is chosen among ``2 + int(log(k))`` candidate rows drawn with probability
    proportional to their squared distance to the closest centre chosen so
    far (D^2 sampling); the candidate that minimises the resulting potential
    (sum of closest squared distances) wins, the first one on a tie.  With
    ``weights`` (a group's rows, each row of ``X`` a group's mean) the first
    draw, the D^2 sampling and the potential count each row that many times,
    as scikit-learn's ``sample_weight``; None is every weight 1, bit for bit.

    Parameters
    ----------
    X : array_like of shape (n, d), float32 or float64
        Data rows, ``n >= 1``.
    k : int
        Number of centres, ``k >= 1``.  May exceed the number of distinct
        rows (or even ``n``), see Notes.
    seed : int, None or numpy.random.Generator
        Passed to :func:`numpy.random.default_rng`.

    Returns
    -------
    ndarray of shape (k, d), float64
        The centres; every row is a row of ``X``.  Deterministic for an
        integer seed.

    Notes
    -----
    While some row is at a positive distance from every chosen centre, D^2
    sampling can only pick such rows, so the first centres are distinct rows.
    Once all rows coincide with chosen centres (all remaining squared
    distances are 0: ``X`` has fewer distinct rows than ``k``), each further
    centre is a row drawn uniformly at random, so duplicate centres are
    returned rather than fewer than ``k``.

    Raises
    ------
    ValueError
        If ``X`` contains NaN or infinity (detected through the potential,
        at no extra pass over the data).
    """
    X = _check_data(X)
    k = int(k)
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    n, d = X.shape
    rng = np.random.default_rng(seed)
    n_trials = 2 + int(np.log(k))
    w = None if weights is None else np.asarray(weights, dtype=np.float64)

    centres = np.empty((k, d), dtype=np.float64)
    if w is None:
        first = int(rng.integers(n))
    else:  # a row drawn with probability proportional to its weight
        first = min(int(np.searchsorted(np.cumsum(w), rng.random() * w.sum(), side="right")), n - 1)
    centres[0] = X[first]
    closest = _min_sq_dist_update(X, X[first], np.full(n, np.inf))

    # One pass more than centres to pick, so that the potential of the last
    # choice (and of the first centre when k = 1) is checked for NaN too.
    for c in range(1, k + 1):
        # cumsum is sequential, hence deterministic; its last element is the
        # potential, so the sampling below is consistent with it.
        cumulative = np.cumsum(closest if w is None else w * closest)
        potential = cumulative[-1]
        if not np.isfinite(potential):
            raise ValueError("X contains NaN or infinite values")
        if c == k:
            break
        if potential > 0:
            draws = rng.random(n_trials) * potential
            # side="right" returns the first row whose cumulative weight
            # exceeds the draw, i.e. a row with a positive weight: a row
            # already chosen (weight 0) cannot be picked again.
            candidates = np.searchsorted(cumulative, draws, side="right")
            np.minimum(candidates, n - 1, out=candidates)  # draw rounded up to the total
        else:
            # Every row coincides with a chosen centre: pick uniformly.
            candidates = rng.integers(n, size=1)
        del cumulative
        # The candidates are scored one at a time: each potential is the same pairwise
        # sum as a row of a (trials x n) matrix would give, but only two rows of n floats
        # are alive at once. On a large memory-mapped site that matrix was the biggest
        # temporary of the k-FED round (bench/scale.py measures the site's peak memory).
        # The first smallest potential wins, as np.argmin; the potentials are finite.
        best, best_potential = 0, np.inf
        for t, row in enumerate(candidates):
            trial = _min_sq_dist_update(X, X[row], closest)
            trial_potential = trial.sum() if w is None else (w * trial).sum()
            if t == 0 or trial_potential < best_potential:
                best, best_potential, best_closest = t, trial_potential, trial
            del trial
        closest = best_closest
        del best_closest
        centres[c] = X[candidates[best]]
    return centres


def update_centroids(C: np.ndarray, sums: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The Lloyd update from sufficient statistics: sums / counts per cluster; an
    empty cluster keeps its current centroid (the empty-cluster policy)."""
    new = np.array(C, dtype=np.float64, copy=True)
    nonempty = counts > 0
    new[nonempty] = sums[nonempty] / counts[nonempty, None]
    return new


def lloyd(X, C0, max_iter: int, tol: float, weights=None, scatter=None, variances=None):
    """Lloyd iterations from given centroids.

    Each iteration computes ``sums, counts, sse = lloyd_stats(X, C, weights, scatter)``
    and moves every non-empty cluster to ``sums / counts``; an empty cluster keeps its
    current centroid.  Iteration stops after `max_iter` updates or as soon as the
    Frobenius norm of the centroid movement is ``< tol``.

    Parameters
    ----------
    X : array_like of shape (n, d), float32 or float64
        Data rows, or a site's group means.
    C0 : array_like of shape (k, d)
        Starting centroids (copied to float64; not modified).  For float32
        ``X`` the assignment step uses them rounded to float32, the means are
        float64.
    max_iter : int
        Maximum number of Lloyd updates, ``>= 1``.
    tol : float
        Stop when ``||C_new - C_old||_F < tol``.  ``tol = 0`` runs exactly
        `max_iter` iterations.
    weights, scatter : array_like of shape (n,), optional
        Rows of ``X`` as groups (``kernels.lloyd_stats``): each counts ``weights``
        rows. None: rows.
    variances : array_like of shape (n, d), optional
        The groups' per-feature variances: a group near a boundary is split as its
        spread says (``kernels.spread``); the counts are then float64 expected rows.

    Returns
    -------
    C : ndarray of shape (k, d), float64
        Centroids after the last update.
    counts : ndarray of shape (k,), int64 (float64 with ``variances``)
        Cluster sizes (in rows) of the **last assignment**, i.e. the rows whose mean
        each returned row of ``C`` is (0: the row is the kept centroid of an
        empty cluster).  No extra assignment is made after the last update.
    n_iter : int
        Number of updates performed.
    """
    X = _check_data(X)
    C = np.array(C0, dtype=np.float64, copy=True)
    if C.ndim != 2 or C.shape[0] < 1 or C.shape[1] != X.shape[1]:
        raise ValueError(f"C0 of shape {C.shape} does not fit X of shape {X.shape}")
    max_iter = int(max_iter)
    if max_iter < 1:
        raise ValueError(f"max_iter must be >= 1, got {max_iter}")
    tol = float(tol)
    if not tol >= 0:
        raise ValueError(f"tol must be >= 0, got {tol}")

    n_iter = 0
    counts = np.zeros(C.shape[0], dtype=np.int64)
    for n_iter in range(1, max_iter + 1):
        sums, counts, _ = kernels.lloyd_stats(X, C, weights, scatter, variances)
        new = update_centroids(C, sums, counts)
        shift = frobenius(new - C)
        C = new
        if shift < tol:
            break
    return C, counts, n_iter


def local_kmeans(X, k: int, seed, max_iter: int = 300, tol: float = 1e-4, weights=None,
                 scatter=None, variances=None):
    """k-means on one site: k-means++ seeding, then Lloyd to convergence.

    Parameters
    ----------
    X : array_like of shape (n, d), float32 or float64
        Data rows, ``n >= 1``, or a site's group means.
    k : int
        Number of clusters, ``k >= 1``; if ``k > n`` then ``k = n`` is used
        (so ``n`` centroids are returned).
    seed : int, None or numpy.random.Generator
        Seed of the k-means++ seeding (the only randomness).
    max_iter, tol
        As in :func:`lloyd` (absolute tolerance on the centroid movement).
    weights, scatter, variances : optional
        Rows of ``X`` as groups (:func:`lloyd`), in the seeding and the iterations.

    Returns
    -------
    centroids : ndarray of shape (min(k, n), d), float64
    counts : ndarray of shape (min(k, n),), int64
        Cluster sizes of the last assignment (see :func:`lloyd`).
    """
    X = _check_data(X)
    k = int(k)
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    k = min(k, X.shape[0])
    C0 = kmeans_plusplus(X, k, seed, weights)
    C, counts, _ = lloyd(X, C0, max_iter, tol, weights, scatter, variances)
    return C, counts

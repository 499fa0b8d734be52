"""Lloyd statistics of groups that straddle a boundary: each group split between its two
nearest centroids as its per-feature spread says.

A site's group (``client_app/site_groups.py``) keeps its rows' count ``w``, mean ``mu``
and per-feature variance ``var`` (its m2 / w). Assigned whole, a group of rows from two
clusters counts entirely in one of them: at groups of 5 or 10 rows that costs the
federated fit 10-50 % at the 90th percentile of the quality bench (issue 45). Here a group
stands for the Gaussian with its moments, N(mu, diag(var)), and contributes to each
cluster what that distribution's rows would: its expected share of rows, their expected
sum and squared distances.

The form (two nearest centroids c1, c2 of the mean, unit u = (c2 - c1) / L with
L = ||c2 - c1||; the mean lies t = (||mu - c2||^2 - ||mu - c1||^2) / (2 L) from their
boundary on c1's side; the group's spread along u is s = sqrt(sum_j u_j^2 var_j);
z = t / s, phi and Phi the standard normal density and distribution):

- share of c2: P2 = Phi(-z); of c1: 1 - P2;
- sum into c2: w (mu P2 + var * u phi(z) / s); into c1: w mu minus that
  (the truncated normal's first moment: E[(x - mu) 1{u.(x - mu) > t}] = Sigma u phi / s);
- SSE: scatter + w (D1 + P2 (D2 - D1) - 2 L s phi(z)), the expected squared distance of a
  draw to the nearer of c1, c2 (D1, D2 the mean's squared distances; a few lines of
  algebra from the same moments; never above the whole group's scatter + w D1).

Exactness. A group whose mean lies at least :data:`WHOLE_BEYOND` of its spreads from the
boundary (z >= 8: Phi(-8) = 6e-16) is assigned whole, exactly as
``kernels.lloyd_stats`` assigns it, so a cluster made only of such groups has the exact
sums, counts and SSE of its groups' rows. A group nearer the boundary contributes the
expected figures of its Gaussian, not of its rows (which no site task sees). Third and
further centroids are ignored for the split (a group's spread is small against the
distances between the centroids it lies between).

Why NumPy and not a compiled kernel: the split is O(groups x d) vectorised work after the
distances (O(groups x k x d), the blocked difference form of ``small_work``, no BLAS), and
a task uses it only at groups of 3 or more rows, where the groups are at most a third of
the rows. Every operation is elementwise or a sum in a fixed order: the same bits for any
thread count.

Privacy. Every figure is a function of each group's count, mean and per-feature variance:
the promise's "function of the groups' statistics". The per-feature variance is new in
replies, which is why a site uses this only at p_site >= :data:`SPREAD_MIN_SIZE`: at
p_site = 2 a group's mean and per-feature variance give back both rows' values of each
feature (docs/explanation/privacy-model.md, "A group's spread").
"""

from __future__ import annotations

import math

import numpy as np

from fedcluster.common.kernels import small_work

__all__ = ["SPLIT_MAX_WIDTH", "SPREAD_MIN_SIZE", "WHOLE_BEYOND", "spread_lloyd_stats",
           "spread_minibatch_epoch"]

#: The fewest rows of a site's groups (its ``min-cluster-size``) at which its replies use
#: the groups' per-feature spread.
SPREAD_MIN_SIZE = 3
#: A group whose mean is at least this many of its spreads from the boundary between its
#: two nearest centroids is assigned whole (its other share is below 1e-15).
WHOLE_BEYOND = 8.0
#: A group whose spread along the line between its two nearest centroids is more than
#: this many times their distance is assigned whole: the two-centroid form holds for a
#: group narrow against the centroids it lies between; a wider one (a group holding an
#: outlier) would send rows beyond both, and third centroids matter (quality bench, the
#: ``outliers`` set: 1.65 x central split, 1.24 whole).
SPLIT_MAX_WIDTH = 1.0
_SQRT_2PI = math.sqrt(2.0 * math.pi)


def _normal_tail(z: np.ndarray) -> np.ndarray:
    """Phi(-z), the standard normal's upper tail, elementwise (``math.erfc``: no SciPy in
    a site's process; the arrays are the groups near a boundary, few)."""
    return np.array([0.5 * math.erfc(v / math.sqrt(2.0)) for v in z.ravel()],
                    dtype=np.float64).reshape(z.shape)


def spread_lloyd_stats(X: np.ndarray, C: np.ndarray, weights: np.ndarray, variances: np.ndarray,
                       scatter: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """One Lloyd step's statistics with each group split by its spread (module docstring).

    Parameters
    ----------
    X : (G, d) float64
        The groups' means.
    C : (k, d) float64
        Centroids, k >= 1.
    weights : (G,) int
        Rows per group.
    variances : (G, d) float64
        Per feature, the group's variance about its mean (m2 / rows), >= 0.
    scatter : (G,) float64
        The group's squared deviations from its mean, summed over the features.

    Returns
    -------
    sums : (k, d) float64
        Per cluster, the expected sum of its rows.
    counts : (k,) float64
        Per cluster, its expected rows (whole groups' counts where no group is split).
    sse : float
        The expected sum of squared distances to the nearer centroid.
    """
    X = np.ascontiguousarray(X, dtype=np.float64)
    C = np.ascontiguousarray(C, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    var = np.asarray(variances, dtype=np.float64)
    s_all = np.asarray(scatter, dtype=np.float64)
    k, d = C.shape
    if X.ndim != 2 or X.shape[1] != d or var.shape != X.shape or w.shape != (X.shape[0],) \
            or s_all.shape != w.shape:
        raise ValueError(f"means {X.shape}, weights {w.shape}, variances {var.shape} and "
                         f"scatter {s_all.shape} do not fit centroids {C.shape}")
    sums, counts, sse = np.zeros((k, d)), np.zeros(k), 0.0
    for start, stop, rows in small_work._blocks(X, k):
        D = small_work._sq_dists(rows, C)
        m = stop - start
        at = np.arange(m)
        c1 = np.argmin(D, axis=1)  # ties to the lowest index, as the kernels
        D1 = D[at, c1]
        gw, gs, gv = w[start:stop], s_all[start:stop], var[start:stop]
        whole_sums = gw[:, None] * rows
        if k == 1:
            np.add.at(sums, c1, whole_sums)
            np.add.at(counts, c1, gw)
            sse += float((gs + gw * D1).sum())
            continue
        rest = D.copy()
        rest[at, c1] = np.inf
        c2 = np.argmin(rest, axis=1)
        D2 = D[at, c2]
        gap = C[c2] - C[c1]
        L = np.sqrt((gap * gap).sum(axis=1))
        with np.errstate(divide="ignore", invalid="ignore"):
            u = np.where(L[:, None] > 0, gap / L[:, None], 0.0)
            s = np.sqrt((u * u * gv).sum(axis=1))
            z = np.where((s > 0) & (L > 0), (D2 - D1) / (2.0 * L * s), np.inf)
        split = (z < WHOLE_BEYOND) & (s <= SPLIT_MAX_WIDTH * L)  # (NaN means: not split; their NaN goes on as the kernels')
        P2 = np.zeros(m)
        phi = np.zeros(m)
        if split.any():
            zs = z[split]
            P2[split] = _normal_tail(zs)
            phi[split] = np.exp(-0.5 * zs * zs) / _SQRT_2PI
        with np.errstate(divide="ignore", invalid="ignore"):
            shift = np.where(split[:, None], gv * u * (phi / np.where(split, s, 1.0))[:, None], 0.0)
        to_c2 = gw[:, None] * (rows * P2[:, None] + shift)
        np.add.at(sums, c1, np.where(split[:, None], whole_sums - to_c2, whole_sums))
        np.add.at(sums, c2, np.where(split[:, None], to_c2, 0.0))
        np.add.at(counts, c1, np.where(split, gw * (1.0 - P2), gw))
        np.add.at(counts, c2, np.where(split, gw * P2, 0.0))
        expected = np.where(split, D1 + P2 * (D2 - D1) - 2.0 * L * np.where(split, s, 0.0) * phi, D1)
        sse += float((gs + gw * expected).sum())
    return sums, counts, sse


def spread_minibatch_epoch(X: np.ndarray, order: np.ndarray, batch: int, gamma: np.ndarray,
                           beta: float, weights: np.ndarray, variances: np.ndarray,
                           scatter: np.ndarray) -> np.ndarray:
    """One epoch of the mini-batch site step (``kernels.minibatch_epoch``) with each
    batch's groups split by their spread (:func:`spread_lloyd_stats`): per batch, for
    every cluster with expected rows in it, ``Lambda += Lambda_b`` and
    ``gamma += beta * (Lambda_b / Lambda) * (mean_b - gamma)``. ``gamma`` is updated in
    place; returns Lambda (float64 expected rows)."""
    lam = np.zeros(gamma.shape[0])
    order = np.asarray(order, dtype=np.int64)
    for start in range(0, order.size, max(1, int(batch))):
        rows = order[start:start + max(1, int(batch))]
        sums, counts, _ = spread_lloyd_stats(X[rows], gamma, weights[rows], variances[rows],
                                             scatter[rows])
        moved = counts > 0
        lam[moved] += counts[moved]
        step = beta * counts[moved] / lam[moved]
        gamma[moved] += step[:, None] * (sums[moved] / counts[moved, None] - gamma[moved])
    return lam

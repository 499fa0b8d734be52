"""Groups split by their spread, written here from the formulas (privacy model, "A group's
spread"; docs/explanation/algorithms.md), without the package's code: the tests'
reference for ``common/kernels/spread.py``."""

from __future__ import annotations

import numpy as np
from scipy.stats import norm


def split_stats(means, sizes, variances, C):
    """(sums (k, d), expected rows (k,)) of groups (means, rows, per-feature variances)
    against centroids C, each group split between its two nearest centroids as the
    Gaussian with its moments would be; whole where its mean lies 8 of its spreads from
    their boundary or its spread along their line exceeds their distance."""
    D = ((means[:, None, :] - C[None]) ** 2).sum(axis=2)
    order = np.argsort(D, axis=1, kind="stable")
    c1, c2 = order[:, 0], order[:, 1]
    at = np.arange(len(means))
    L = np.linalg.norm(C[c2] - C[c1], axis=1)
    u = (C[c2] - C[c1]) / np.where(L > 0, L, 1.0)[:, None]
    s = np.sqrt((u * u * variances).sum(axis=1))
    t = (D[at, c2] - D[at, c1]) / (2 * np.where(L > 0, L, 1.0))
    z = np.where((s > 0) & (L > 0), t / np.where(s > 0, s, 1.0), np.inf)
    split = (z < 8.0) & (s <= L)
    share = np.where(split, norm.sf(z), 0.0)
    shift = np.where(split[:, None],
                     variances * u * (norm.pdf(np.where(split, z, 0.0)) / np.where(split, s, 1.0))[:, None],
                     0.0)
    to_c2 = sizes[:, None] * (means * share[:, None] + shift)
    sums, counts = np.zeros_like(C, dtype=float), np.zeros(len(C))
    np.add.at(sums, c2, to_c2)
    np.add.at(sums, c1, sizes[:, None] * means - to_c2)
    np.add.at(counts, c2, sizes * share)
    np.add.at(counts, c1, sizes * (1 - share))
    return sums, counts


def whole_rows(counts):
    """Expected rows rounded to whole rows by largest remainder (ties: the lowest index)."""
    whole = np.floor(counts)
    short = round(float(counts.sum() - whole.sum()))
    whole[np.argsort(-(counts - whole), kind="stable")[:short]] += 1
    return whole

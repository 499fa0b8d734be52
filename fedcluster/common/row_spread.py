"""Table 1's spread figures as a reader takes them: of the ROWS, and never impossible
(issue 70).

The sites send, per cluster and numeric column, a histogram of their groups' means (each
counting its present values) and the exact sum of squared deviations of the values. The
histogram alone is narrower than the rows: a group's mean hides the spread within it
(read as the rows' quartiles, a normal column's IQR came out about half its width). So
the quartiles here are those of the mixture the released figures describe: each bin's
groups spread uniformly over the bin, each group's values spread normally about its mean
with the within-group variance that the exact total leaves once the groups' means'
spread is taken out,

    s_w^2 = (SS_total - sum_b h_b (c_b - mean)^2 - n w^2 / 12) / n,

so that the mixture has the values' exact mean and variance, except that s_w is at most
``WITHIN_AT_MOST`` times the groups' means' own SD: a site stands its pooled spread in for
the spreads it withholds, and in a column whose values are skewed across clusters (CRP)
that stand-in can be several times a cluster's real spread (on the clinical demo, CRP's
SD in a low cluster 12.3 against its rows' 3.7), which would spread the quartiles far
beyond the rows'. Nothing new is asked of the sites. Where a column's range is known (the schema's declared ``range``, or a built-in
data set's), every figure stays in it: the quartiles are clipped to it, and the SD is at
most what a column of that mean in that range can have (Bhatia and Davis, 2000:
``var <= (mean - lo)(hi - mean)``, times n / (n - 1) for the sample SD), which the
sites' stand-in spreads (a site's pooled spread standing in for one it withholds) can
exceed, e.g. for a pixel that is 0 in every row of a cluster.

How close the quartiles come to the rows' own is measured on the clinical demo
(``tests/test_table1_spread.py``, ``ROWS_QUARTILE_ERROR``).
"""

from __future__ import annotations

import math

import numpy as np

#: The within-group SD at most this many times the groups' means' SD (module docstring;
#: on the clinical demo 2 gave the smallest worst gap of 1.5, 2, 2.5 and 3).
WITHIN_AT_MOST = 2.0
#: On the clinical demo (p 2, 3, 5, 10; 14 numeric columns, every cluster of at least 30
#: rows and all rows: 70 cells a floor), the gap between a quartile shown and the rows'
#: own, in the rows' SDs: every one within ROWS_QUARTILE_ERROR, and at each floor half
#: within ROWS_QUARTILE_TYPICAL (measured: largest 0.52, 0.48, 0.56, 0.76 and median
#: 0.08, 0.10, 0.21, 0.30 at p 2, 3, 5, 10; from the groups' means alone, as before issue 70:
#: medians 0.44 to 0.58). tests/test_table1_spread.py holds Table 1 to both.
ROWS_QUARTILE_ERROR = 0.8
ROWS_QUARTILE_TYPICAL = 0.35


def _g(z: np.ndarray) -> np.ndarray:
    """An antiderivative of the normal CDF: z Phi(z) + phi(z)."""
    # Imported here, not at the top: a site imports this module (its profile task) but never
    # draws quartiles, and a small site's process must not load SciPy (tests/test_small_work.py).
    from scipy.special import erf

    phi = np.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)
    Phi = 0.5 * (1.0 + erf(z / math.sqrt(2.0)))
    return z * Phi + phi


def within_variance(hist: np.ndarray, lo: float, hi: float, mean: float,
                    total_ss: float) -> float:
    """The variance within groups that the exact sum of squares ``total_ss`` (about
    ``mean``, over the histogram's ``hist.sum()`` values) leaves beyond the groups'
    means' spread (the bins' centres and their widths), at most ``WITHIN_AT_MOST``^2
    times that spread."""
    hist = np.asarray(hist, dtype=np.float64)
    n = hist.sum()
    width = (hi - lo) / hist.size
    centres = lo + width * (np.arange(hist.size) + 0.5)
    between = float((hist * (centres - mean) ** 2).sum()) + n * width * width / 12.0
    return min(max(total_ss - between, 0.0) / n, WITHIN_AT_MOST ** 2 * between / n)


def _mixture_cdfs(x: np.ndarray, hists: np.ndarray, lo: float, hi: float,
                  sigmas: np.ndarray) -> np.ndarray:
    """(P, len(x)): for each of P histograms over [lo, hi] (rows of ``hists``), the mass of
    its mixture (each bin uniform over itself, widened by a normal of SD its ``sigmas``)
    at or below each of ``x``, in its counts; each part's figures computed as for it alone
    (elementwise, then one matrix-vector product a part), so that a sum over the parts
    is the same, bit for bit, as a sum of the parts one by one. An empty bin's figure is
    not computed (it is multiplied by 0: a sum gains a zero either way)."""
    width = (hi - lo) / hists.shape[1]
    left = lo + width * np.arange(hists.shape[1])
    shift = x[:, None] - left  # (Q, B), as for one part
    inside = np.zeros((sigmas.size, x.size, hists.shape[1]))
    part, at = np.nonzero(hists)
    sigma = sigmas[part][:, None]
    flat = sigma[:, 0] <= 0.0
    near = shift.T[at]  # (used bins, Q)
    if flat.any():
        inside[part[flat], :, at[flat]] = np.clip(near[flat] / width, 0.0, 1.0)
    if not flat.all():
        wide, spread = near[~flat], sigma[~flat]
        inside[part[~flat], :, at[~flat]] = (spread / width) * (
            _g(wide / spread) - _g((wide - width) / spread))
    return np.matmul(inside, hists[:, :, None])[:, :, 0]


def row_quantiles(components, lo: float, hi: float, quantiles,
                  bounds: tuple[float, float] | None = None) -> dict[str, float]:
    """``{name: value}`` for each ``(name, q)`` of ``quantiles``: the rows' quantiles as
    the histograms of the groups' means and the exact sums of squares describe them
    (module docstring). ``components``: per cluster pooled, ``(hist, mean, total_ss)``
    (its histogram over [lo, hi], its values' mean and their squared deviations about
    it), each widened by its own within-group spread, so that "all rows" is the sum of
    its clusters. Clipped to ``bounds`` where the column's range is known, else to the
    histogram's [lo, hi] (the groups' means' range)."""
    parts = [(np.asarray(h, dtype=np.float64), m, s) for h, m, s in components]
    parts = [(h, math.sqrt(within_variance(h, lo, hi, m, s))) for h, m, s in parts if h.sum() > 0]
    total = sum(h.sum() for h, _ in parts)
    if total <= 0:
        return {}
    spread = max(sigma for _, sigma in parts)
    hists = np.array([h for h, _ in parts])
    sigmas = np.array([sigma for _, sigma in parts], dtype=np.float64)
    targets = np.array([q for _, q in quantiles]) * total
    a = np.full(targets.size, lo - 8.0 * spread)
    b = np.full(targets.size, hi + 8.0 * spread)
    for _ in range(60):  # bisection, every quantile at once: the CDF is monotone
        middle = 0.5 * (a + b)
        below = sum(_mixture_cdfs(middle, hists, lo, hi, sigmas)) < targets  # (parts in order)
        a, b = np.where(below, middle, a), np.where(below, b, middle)
    # in the column's known range; without one, in the groups' means' (a quarter of the
    # rows below the lowest group's mean is possible, but not seen in practice)
    low, high = bounds if bounds is not None else (lo, hi)
    values = np.clip(0.5 * (a + b), low, high)
    return {name: float(value) for (name, _), value in zip(quantiles, values)}


def bounded_sd(sd: float, mean: float, n: int, bounds: tuple[float, float] | None) -> tuple[float, bool]:
    """The SD, at most what n values in ``bounds`` with this mean can have (Bhatia-Davis);
    and whether it was lowered to that."""
    if bounds is None or n < 2:
        return sd, False
    most = math.sqrt(max((mean - bounds[0]) * (bounds[1] - mean), 0.0) * n / (n - 1))
    if most == 0.0:
        return 0.0, False  # every value at that end: its SD is 0, no bound about it
    return (most, True) if sd > most * (1 + 1e-12) else (sd, False)

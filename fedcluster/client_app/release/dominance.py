"""The dominance rule on spreads: no released spread from which one row can be estimated
closely (the statistical-disclosure-control literature's (n, k) and p% rules, on what a
group's spread says of its rows).

A spread unit's squared deviations (``spreads.py``), with its groups' means, bound every
row of it: a row that alone made its unit's spread would lie at its group's mean plus
d_hat = sqrt(m2_U (n - 1) / n) (n the group's cells of the feature). For an ordinary row
that bound says little (the group's mean already places the row within its group's
spread). For a row far from the rest of its group it is an estimate: a row 10 SD out in
one feature, in a group of 3, lies within 0.07 % of mean + d_hat, while its group's mean
alone misses it by 36-43 % (issue 54).

**The rule** (a (1, k) dominance rule on the spread): a unit's spread in a feature is
WITHHELD when one of its rows

- lies at least :data:`DOMINANT_SD` of the feature's standard deviations at the site from
  its group's mean (a row that stands out of its group: the rule does not touch the
  ordinary rows of a tight group, whose values the group's mean already gives to within
  the group's spread), and
- carries so much of the unit's spread that d_hat is within :data:`ESTIMATE_WITHIN` of the
  row's own distance from its group's mean.

A withheld spread is replaced, for every group of the unit, by the site's pooled spread of
the feature (``spreads.released_m2``): the unit then says of its rows what its means say,
no more.

**The p% rule on means** (the same thresholds, on what a group's MEAN says of its rows).
A coordinator that knows the site's mean mu of a feature (``describe`` gives it) estimates
a group's row that stands out by assuming the group's other rows lie at mu:
x_hat = n mean - (n - 1) mu, off by the other rows' summed deviations from mu. A group's
sum of a feature is WITHHELD when one of its rows

- lies at least :data:`DOMINANT_SD` standard deviations from the site's mean, and
- x_hat puts it within :data:`ESTIMATE_WITHIN` of its distance from the site's mean (the
  p% rule's p: the rest of the group hides less than 10 % of the row's contribution).

It applies from p_site :data:`MEANS_FROM_P` (3) on. A withheld sum is replaced by the group's cells times the site's mean of the feature over
the cells of no flagged group (``data/group_spreads.stand_in_means``: computed from what
the site releases anyway, so that no total gives the withheld sum back by difference),
and its unit's spread is withheld as above: the group then says of the feature what the
site's mean says, no more, and the table stays complete (a run that imputes nothing still
runs). Without it, a row 10 SD out in a group of 3 whose other rows lie near the site's mean is
placed to within 0.2-7 % by its group's mean alone once its spread is withheld
(``bench/dominance.py``, wine, breast cancer, MNIST). Both rules are applied where the
table is made (``data/group_stats.ordered``), so every task, Table 1 and ``describe`` see
the same withheld cells.

What the rules do not stop: an attacker with a better guess of the other rows than the
site's mean (the other rows known, or a near-constant feature's mode) estimates a row
from a mean the rules release; a row that stands out by less than
:data:`DOMINANT_SD` is not judged; the estimate of a row from several groups' means
together (differences of overlapping tables are the versions audit's, not this rule's).

``bench/dominance.py`` measures both rules: rows of ordinary data they flag (false flags)
against planted outliers they catch.
"""

from __future__ import annotations

import numpy as np

__all__ = ["DOMINANT_SD", "ESTIMATE_WITHIN", "MEANS_FROM_P", "dominated", "dominated_means",
           "stand_out", "stand_out_cells"]

#: A row this many of its feature's standard deviations (at the site) from its group's
#: mean stands out of its group.
DOMINANT_SD = 2.0
#: The spread of a unit that puts such a row within this share of its distance from its
#: group's mean is withheld (the p% rule's 10 %).
ESTIMATE_WITHIN = 0.10
#: The p% rule on means applies from this p_site on. At p_site 2 it would cost DWF's
#: quality at defaults (``bench/quality.py``: digits 1.0024 -> 1.021, the outliers set
#: 1.016 -> 1.160 x central, 2026-11-29) where a group of two rows' mean places either
#: row only to within the other's distance from the site's mean; a site holding rows
#: far out takes p_site 3 or more (``site check`` shows what the rule would withhold).
MEANS_FROM_P = 3


def stand_out(peak: np.ndarray, sd: np.ndarray) -> np.ndarray:
    """Which groups' largest squared deviation per feature (``peak``: (G, d), a cell's
    squared distance from its group's mean) is at least :data:`DOMINANT_SD` of the
    feature's site-wide standard deviation ``sd`` (d,): the only cells the rule may flag."""
    limit = (DOMINANT_SD * np.asarray(sd, dtype=np.float64)) ** 2
    return (peak >= limit[None, :]) & (limit[None, :] > 0)


def stand_out_cells(extremes: tuple, sd: np.ndarray, lo: int,
                    chunk: int = 1 << 12) -> tuple[np.ndarray, ...]:
    """The cells of groups ``lo..`` (``extremes``: their largest and smallest deviations
    from their group's mean, (G, d) each) whose row stands out of its group
    (:func:`stand_out`): (groups, features, squared deviations), ``chunk`` groups at a
    time (the temporaries of a chunk)."""
    found = []
    for at in range(0, extremes[0].shape[0], chunk):
        high, low = extremes[0][at:at + chunk], extremes[1][at:at + chunk]
        peak = np.maximum(high * high, low * low)
        group, feature = np.nonzero(stand_out(peak, sd))
        found.append((group + lo + at, feature, peak[group, feature]))
    if not found:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0)
    return tuple(np.concatenate(part) for part in zip(*found))


def dominated(peak: np.ndarray, unit_m2: np.ndarray, cells: np.ndarray) -> np.ndarray:
    """Whether a unit's spread (``unit_m2``: its squared deviations in the feature, over
    all its groups) puts a standing-out row of a group (``peak``: its squared distance from
    the group's mean; ``cells``: the group's present cells of the feature) within
    :data:`ESTIMATE_WITHIN` of that distance. Elementwise over candidate cells."""
    peak = np.asarray(peak, dtype=np.float64)
    cells = np.asarray(cells, dtype=np.float64)
    estimate = np.sqrt(np.maximum(unit_m2, 0.0) * np.maximum(cells - 1.0, 0.0)
                       / np.maximum(cells, 1.0))
    distance = np.sqrt(peak)
    return np.abs(estimate - distance) < ESTIMATE_WITHIN * distance


def dominated_means(means: np.ndarray, high: np.ndarray, low: np.ndarray, cells: np.ndarray,
                    site_mean: np.ndarray, sd: np.ndarray) -> np.ndarray:
    """(k, d) bool: the p% rule on means (module docstring) for k groups.

    Parameters
    ----------
    means : (k, d) float
        Each group's mean of its present cells per feature.
    high, low : (k, d) float
        The largest and the smallest deviation of a present cell from its group's mean
        (the group's two rows that may stand out most from the site's mean).
    cells : (k, d) int
        The group's present cells per feature (0: nothing to judge).
    site_mean, sd : (d,) float
        The site's mean and standard deviation per feature (the coordinator's guess of
        the other rows, and the yardstick of standing out).
    """
    means = np.asarray(means, dtype=np.float64)
    cells = np.asarray(cells, dtype=np.float64)
    limit = DOMINANT_SD * np.asarray(sd, dtype=np.float64)[None, :]
    offset = means - np.asarray(site_mean, dtype=np.float64)[None, :]
    flagged = np.zeros(means.shape, dtype=bool)
    for extreme in (high, low):
        row = offset + extreme  # the row's distance from the site's mean
        others = (cells - 1.0) * offset - extreme  # the rest of the group's, summed
        flagged |= (np.abs(row) >= limit) & (np.abs(others) < ESTIMATE_WITHIN * np.abs(row))
    return flagged & (cells > 0) & (limit > 0)

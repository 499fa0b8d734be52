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
no more. ``bench/dominance.py`` measures the rule: rows of ordinary data it flags (false
flags) against planted outliers it catches.
"""

from __future__ import annotations

import numpy as np

__all__ = ["DOMINANT_SD", "ESTIMATE_WITHIN", "dominated", "stand_out"]

#: A row this many of its feature's standard deviations (at the site) from its group's
#: mean stands out of its group.
DOMINANT_SD = 2.0
#: The spread of a unit that puts such a row within this share of its distance from its
#: group's mean is withheld (the p% rule's 10 %).
ESTIMATE_WITHIN = 0.10


def stand_out(peak: np.ndarray, sd: np.ndarray) -> np.ndarray:
    """Which groups' largest squared deviation per feature (``peak``: (G, d), a cell's
    squared distance from its group's mean) is at least :data:`DOMINANT_SD` of the
    feature's site-wide standard deviation ``sd`` (d,): the only cells the rule may flag."""
    limit = (DOMINANT_SD * np.asarray(sd, dtype=np.float64)) ** 2
    return (peak >= limit[None, :]) & (limit[None, :] > 0)


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

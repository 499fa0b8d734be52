"""The p% rule on means applied to a group table as it is made (the rule itself:
``release/dominance.py``; this module reads what it needs of the groups' rows, which
only the data layer may).

While ``group_stats.ordered`` passes over the rows it gives each group's largest and
smallest deviation from its group's mean per feature (``extremes``): with the group's
mean and the site's, they say how far the group's most outlying rows lie from the site's
mean and how much of the group's sum the other rows hide (:func:`dominant_means`). A
flagged group's sum of the feature is replaced (:func:`stand_in_means`), and the spread
rule withholds its unit's spread there (``group_spreads.Spreads``).
"""

from __future__ import annotations

import numpy as np

from fedcluster.client_app.release import dominance

__all__ = ["CHUNK_GROUPS", "dominant_means", "stand_in_means"]

#: Groups per chunk of the rule's pass over a window of groups.
CHUNK_GROUPS = 1 << 14


def dominant_means(counts: np.ndarray, sums: np.ndarray, absent: np.ndarray | None,
                   extremes: tuple, lo: int, moments: tuple,
                   judged: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The p% rule on means (``dominance.dominated_means``) on groups
    ``lo..lo + len(extremes[0])``, of the ``judged`` features (None: all): the flagged
    (groups, features). :data:`CHUNK_GROUPS` groups at a time (the rule's temporaries
    are a few chunks' (groups, d) arrays, not the window's)."""
    width = extremes[0].shape[1]
    groups, features = [], []
    for at in range(0, extremes[0].shape[0], CHUNK_GROUPS):
        a, b = lo + at, lo + min(extremes[0].shape[0], at + CHUNK_GROUPS)
        cells = np.repeat(counts[a:b, None], width, axis=1) if absent is None \
            else counts[a:b, None] - absent[a:b]
        with np.errstate(invalid="ignore", divide="ignore"):
            means = np.where(cells > 0, sums[a:b] / np.maximum(cells, 1), 0.0)
        flagged = dominance.dominated_means(means, extremes[0][a - lo:b - lo],
                                            extremes[1][a - lo:b - lo], cells, *moments)
        group, feature = np.nonzero(flagged if judged is None else flagged & judged[None, :])
        groups.append(group + a)
        features.append(feature)
    return (np.concatenate(groups) if groups else np.zeros(0, np.int64),
            np.concatenate(features) if features else np.zeros(0, np.int64))


def stand_in_means(counts: np.ndarray, sums: np.ndarray, absent: np.ndarray | None,
                   flagged: tuple[np.ndarray, np.ndarray], totals: np.ndarray | None = None,
                   put=None) -> None:
    """Replace each flagged (group, feature) sum by its present cells times the mean of
    the feature's cells in no flagged group (in place on ``sums``, or ``put(groups,
    features, values)``): the site's mean stands in, computed from what the site releases
    anyway, so that no total (``describe``, Table 1) gives the withheld sum back by
    difference. ``totals``: ``sums.sum(axis=0)`` where the sums were made a window at a
    time."""
    group, feature = flagged
    if group.size == 0:
        return
    width = sums.shape[1]
    cells = (counts[group] if absent is None else counts[group] - absent[group, feature]
             ).astype(np.float64)
    all_cells = float(counts.sum()) - (np.zeros(width) if absent is None
                                       else absent.sum(axis=0, dtype=np.float64))
    out_cells = np.bincount(feature, weights=cells, minlength=width)
    out_sums = np.bincount(feature, weights=np.asarray(sums[group, feature]), minlength=width)
    kept_cells = all_cells - out_cells
    total = sums.sum(axis=0) if totals is None else totals
    mean = np.where(kept_cells > 0, (total - out_sums) / np.maximum(kept_cells, 1.0), 0.0)
    if put is None:
        sums[group, feature] = cells * mean[feature]
    else:
        put(group, feature, cells * mean[feature])

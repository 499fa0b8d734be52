"""The lone-cell rule: a feature's present cells in a group number 0 or at least p_site.

Where a group holds 1 to p_site - 1 present cells of a feature (its other rows' cells
missing), those cells are withheld, as if missing, and counted apart (local suppression,
in the statistical-disclosure-control literature; ``data/present_groups.py`` first
merges groups so that few are). Without the rule, the group's sum of that
feature would rest on fewer than p_site rows, and at one present cell be one row's
value: a coordinator that sends two fills a hair apart reads every group's missing cells
and present sums from two ``local_kmeans`` replies (``tests/test_lone_cells.py``, first
shown against a site without the rule). Applied to every table a task is handed
(``data/group_table.py``), kept tables made before the rule included; the spread rule
(``spreads.py``) counts the cells as this rule leaves them.
"""

from __future__ import annotations

import numpy as np

__all__ = ["withhold_lone_cells"]


def withhold_lone_cells(sums: np.ndarray, m2: np.ndarray | None, present: np.ndarray | None,
                        min_size: int):
    """The group statistics with each feature's present cells in a group counted as
    missing where they number 1 to ``min_size`` - 1: (sums, m2, present, withheld), the
    last (G, d) int64, per group and feature the present cells withheld (None: none).

    A group keeps its rows (its count); of such a feature it then keeps no value, and
    the run's pooled fill stands for the cells, as for any missing cell. The arrays are
    returned as given where nothing is withheld (a kept table maps them from disk).
    ``withheld`` says how many cells were present, never their values: which cells are
    missing the span audit already counts as known to a coordinator, so a count of them
    tells it nothing the audit has not allowed (Table 1 shows it apart from the cells
    missing in the data)."""
    if present is None or min_size <= 1:
        return sums, m2, present, None
    lone = (present > 0) & (present < min_size)
    if not lone.any():
        return sums, m2, present, None
    return (np.where(lone, 0.0, sums), None if m2 is None else np.where(lone, 0.0, m2),
            np.where(lone, 0, present), np.where(lone, present, 0).astype(np.int64))

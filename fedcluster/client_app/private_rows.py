"""The one way a site task reaches rows: differential privacy's clipped rows.

Every other task answers from the site's groups (``site_groups.py``). Differential
privacy answers from rows, clipped to the task's box and noised before anything leaves
(``private_tasks.py``), within the site's own ``dp-budget`` (``privacy_budget.py``).

Why rows and not groups: DP calibrates its noise to the sensitivity of a release, how
far it can move when ONE row is replaced by any other. A sum of per-row terms over rows
clipped to a box moves by at most the box's diameter. A statistic of the site's groups
has no such bound: the grouping (``grouping.py``) is a deterministic function of ALL the
site's rows, so two neighbouring data sets can be grouped completely differently, and a
cluster of whole groups can then gain or lose many rows at once (up to every row of the
site). A data-independent grouping, fixed before the rows are seen, would have a bound;
the site's groups are not one. So no sound noise could be calibrated on the groups.

The rows here are the site's rows in groups (a row waiting for a group is used by no
task), under the run's fill and clipped to ``data-bounds``; what a DP task takes from
them are sums of per-row terms whose sensitivity the box bounds.
"""

from __future__ import annotations

import numpy as np

from fedcluster.common import kernels, privacy, scaling


class PrivateRows:
    """A site's rows, handed to a differentially private task only.

    Parameters
    ----------
    X : (n, d) array
        The site's rows (NaN where the run's fill is due).
    grouped : (n,) bool or None
        The rows in a group (None: every row).
    source : str
    """

    def __init__(self, X: np.ndarray, grouped: np.ndarray | None, source: str) -> None:
        self._X, self._grouped, self.source = X, grouped, source

    def clipped(self, transform: str | None, box: tuple[np.ndarray, np.ndarray]) -> "ClippedRows":
        """The rows under the run's transform (``transform``: its exact text), clipped to
        the box (ValueError: a transform that does not fit)."""
        X = self._X if self._grouped is None else self._X[self._grouped]
        if transform is not None:
            X = scaling.scaled_rows(X, self.source, transform)
        return ClippedRows(privacy.clip_rows(X, *box))


class ClippedRows:
    """Per-row sums over clipped rows, each bounded by the box (what DP noises)."""

    def __init__(self, X: np.ndarray) -> None:
        self._X = X

    @property
    def n_rows(self) -> int:
        return int(self._X.shape[0])

    def cluster_sums(self, C: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per cluster of the rows' assignment to ``C``: sums (k, d) and counts (k,)."""
        sums, counts, _ = kernels.lloyd_stats(self._X, C)
        return sums, counts

    def cluster_counts_and_sse(self, C: np.ndarray, cap: float) -> tuple[np.ndarray, float]:
        """Per cluster of the assignment to ``C`` its rows (k,), and the SSE with each
        row's term capped at ``cap``."""
        labels, sq_dist = kernels.assign(self._X, C)
        counts = np.bincount(labels, minlength=C.shape[0]).astype(np.float64)
        return counts, float(np.minimum(sq_dist, cap).sum())

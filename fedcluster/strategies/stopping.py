"""When a repetition's training stops besides the round cap: the centroids moved less
than ``tol``, or (with ``score-tol``) the score has stopped improving. The maths of a
stalled score are ``aggregate.score_stalled``; this module says which ``score-tol`` a
run means."""

from __future__ import annotations

from collections.abc import Mapping

from fedcluster.common.kernels.spread import SPREAD_MIN_SIZE
from fedcluster.strategies import aggregate

#: The k-means strategies' default ``score-tol`` where a site splits its groups by their
#: spread (p_site >= SPREAD_MIN_SIZE): a split group's share moves a little every round,
#: so the centroids approach their fixed point only linearly (as FFCM's do) and the
#: movement rule alone ran MNIST to the round cap (bench/quality.py).
SPLIT_SCORE_TOL = 1e-6


def default_score_tol(own: float | None, sites: Mapping) -> float:
    """``score-tol`` 0's meaning: the algorithm's ``own`` default (FFCM's), or for a
    k-means algorithm (None) :data:`SPLIT_SCORE_TOL` where a site's groups are split by
    their spread (``sites``: the admitted sites), else 0 (the movement rule alone)."""
    if own is not None:
        return own
    split = any((site.group_size or 1) >= SPREAD_MIN_SIZE for site in sites.values())
    return SPLIT_SCORE_TOL if split else 0.0


def score_stalled(scores: list[float], score_tol: float, own: float | None, sites: Mapping,
                  best_patience: int | None) -> bool:
    """Whether a repetition's training ``scores`` have stalled: ``score_tol`` (0: its
    :func:`default_score_tol`) and the algorithm's ``best_patience`` (GTV's, EWF's)
    through ``aggregate.score_stalled``."""
    return aggregate.score_stalled(scores, score_tol or default_score_tol(own, sites),
                                   best_patience=best_patience)

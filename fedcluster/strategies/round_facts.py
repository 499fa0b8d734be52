"""What the Flower adapter (``flower_adapter.py``) knows of the run for one round: the
facts its planning, the secure-sum and DP parameters and the reply checks read, given
by the run (``ClusteringStrategy.round_facts``) and never changed by the adapter."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from fedcluster.common.config import RunConfig
from fedcluster.common.scaling import FeatureTransform


@dataclass(frozen=True)
class RoundFacts:
    """The run as one round's messages need it.

    Attributes
    ----------
    config : RunConfig
        The run config.
    k : int
        The run's number of clusters.
    n_features : int or None
        The federation's width (None before the describe round has admitted a site).
    sites : Mapping[str, Site]
        The admitted sites by key (``sites.Site``; read only here).
    round_offset : int
        Rounds run before a resume (the history numbers rounds from it).
    secure : bool
        The round runs under SecAgg+ (``ClusteringStrategy.is_secure_round``).
    dynamic : bool
        A weighted mean of the sites' centroids in training (EWF's plain mean: False).
    box : (lower, upper) or None
        The clipping box (``data-bounds``, or the bounds round's; None: not known).
    dp_rho_round : float
        Under differential privacy, the zCDP share of each data round.
    transform : FeatureTransform or None
        The run's global fill and scaling (travels with every task after ``stats``).
    value_box : (lower, upper) or None
        A secure profile round's interval of every cell (``profile.value_box``).
    """

    config: RunConfig
    k: int
    n_features: int | None
    sites: Mapping
    round_offset: int = 0
    secure: bool = False
    dynamic: bool = True
    box: tuple[np.ndarray, np.ndarray] | None = None
    dp_rho_round: float = 0.0
    transform: FeatureTransform | None = None
    value_box: tuple[np.ndarray, np.ndarray] | None = None

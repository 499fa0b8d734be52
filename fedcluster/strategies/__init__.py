"""One strategy module per algorithm family, on the shared base (``base.py``)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import numpy as np

from fedcluster.common.config import RunConfig
from fedcluster.strategies.base import ClusteringStrategy
from fedcluster.strategies.errors import FederationError
from fedcluster.strategies.fkm import FederatedKMeansPruning
from fedcluster.strategies.fuzzy import FederatedFuzzyCMeans
from fedcluster.strategies.gtv import GTVKMeans
from fedcluster.strategies.kfed import KFed
from fedcluster.strategies.minibatch import MiniBatchKMeans
from fedcluster.strategies.weighted import WeightedFedKMeans


#: One strategy per algorithm card (common/algorithms.py): the registry make_strategy
#: reads; tests/test_algorithms.py checks that cards and strategies match both ways.
STRATEGIES: dict[str, Callable[..., ClusteringStrategy]] = {
    "dwf": partial(WeightedFedKMeans, dynamic=True),
    "ewf": partial(WeightedFedKMeans, dynamic=False),
    "minibatch": MiniBatchKMeans,
    "kfed": KFed,
    "fkm": FederatedKMeansPruning,
    "ffcm": FederatedFuzzyCMeans,
    "gtv": GTVKMeans,
}


def make_strategy(
    config: RunConfig, initial_centroids: np.ndarray | None = None
) -> ClusteringStrategy:
    """The strategy for ``config.algorithm``."""
    if config.algorithm not in STRATEGIES:
        raise ValueError(f"unknown algorithm {config.algorithm!r}")
    return STRATEGIES[config.algorithm](config, initial_centroids)


__all__ = ["STRATEGIES", "ClusteringStrategy", "FederationError", "make_strategy"]

"""One strategy module per algorithm family, on the shared base (``base.py``)."""

from __future__ import annotations

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


def make_strategy(
    config: RunConfig, initial_centroids: np.ndarray | None = None
) -> ClusteringStrategy:
    """The strategy for ``config.algorithm``."""
    if config.algorithm in ("dwf", "ewf"):
        return WeightedFedKMeans(config, initial_centroids, dynamic=config.algorithm == "dwf")
    if config.algorithm == "minibatch":
        return MiniBatchKMeans(config, initial_centroids)
    if config.algorithm == "kfed":
        return KFed(config, initial_centroids)
    if config.algorithm == "fkm":
        return FederatedKMeansPruning(config, initial_centroids)
    if config.algorithm == "ffcm":
        return FederatedFuzzyCMeans(config, initial_centroids)
    if config.algorithm == "gtv":
        return GTVKMeans(config, initial_centroids)
    raise ValueError(f"unknown algorithm {config.algorithm!r}")


__all__ = ["ClusteringStrategy", "FederationError", "make_strategy"]

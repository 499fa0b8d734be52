"""What a finished run hands the server app (``server_app/workflow.build_model``): the
figures of its best repetition and everything the model file and the reports say about
the sites, read from the run once it is done (``Run.result``)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedcluster.common.scaling import FeatureTransform


@dataclass(frozen=True)
class RunResult:
    """A finished run's result.

    Attributes
    ----------
    best : dict
        The repetition with the lowest score (``base.ClusteringStrategy.finish_repetition``
        says its keys: seed, score, stats, per-site, centroids, rounds, ...).
    final_metrics : dict
        The exact federated metrics of ``best`` (``metrics.compute_metrics``).
    k : int
        The number of clusters.
    sites : list
        The admitted sites (``sites.Site``), in site order.
    rejected, site_failures : dict
        Why each rejected site was rejected; every failed or dropped reply per site.
    history : list[dict]
        One row per round.
    transform : FeatureTransform or None
        The run's global fill and scaling.
    feature_names : list[str]
        The federation's column names (empty: unnamed).
    box : (lower, upper) or None
        The clipping box; ``bounds_from_data`` whether it came from the sites' data.
    profile_note : str
        Why Table 1 is missing or partial ("" where it is whole).
    table1 : dict or None
        Table 1 as the model keeps it (``profile.table1_of``).
    floor : int
        Table 1's small-cell floor (``profile.floor``).
    """

    best: dict
    final_metrics: dict
    k: int
    sites: list
    rejected: dict
    site_failures: dict
    history: list
    transform: FeatureTransform | None
    feature_names: list
    box: tuple[np.ndarray, np.ndarray] | None
    bounds_from_data: bool
    profile_note: str
    table1: dict | None
    floor: int

"""What every site task reads and sends: its parameters, the server's centroids, its
reply (with the rules its figures are released by: ``release/floor.py``) and its
refusal (:class:`TaskError`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fedcluster.client_app.site_groups import SiteGroups
from fedcluster.common import protocol, scaling

Scalar = bool | int | float | str


@dataclass
class TaskReply:
    """What a site sends back: its arrays (aggregates), as the task's named reply type of
    ``common/protocol.py``, and scalar metrics; ``terms``, when set, are the sums a secure
    round takes instead of those derived from the arrays (``secure_codec.site_terms``;
    distributed DP's noisy linear statistics). A task's reply carries ``rules``, which
    of its figures rest on which rows (``release/floor.py``); the release step
    (``release/gate.py``) applies them and attaches the reply's ``basis``."""

    arrays: tuple = protocol.NoArrays()
    metrics: dict[str, Scalar] = field(default_factory=dict)
    terms: dict[str, np.ndarray] | None = None
    # ``evaluate-too``: the evaluation of the received centroids, sent after this reply
    evaluation: "TaskReply | None" = None
    rules: tuple = ()
    basis: dict | None = None

    def wire(self) -> tuple[list[np.ndarray], dict]:
        """The (arrays, metrics) that travel: this reply's, then its evaluation's."""
        arrays, metrics = protocol.to_arrays(self.arrays), dict(self.metrics)
        if self.evaluation is None:
            return arrays, metrics
        return protocol.with_evaluation(arrays, metrics,
                                        protocol.to_arrays(self.evaluation.arrays),
                                        self.evaluation.metrics)


class TaskError(ValueError):
    """The server asked for something this site cannot do (bad task or parameters)."""


def task_param(params: dict, key: str, kind: type, default=None):
    """Task parameter ``key`` as ``kind``; ``default`` when absent (a missing parameter
    without a default, or one that does not convert, is a :class:`TaskError`)."""
    if key not in params:
        if default is None:
            raise TaskError(f"task parameter '{key}' is missing")
        return default
    value = params[key]
    try:
        return kind(value)
    except (TypeError, ValueError):
        raise TaskError(f"task parameter '{key}' must be {kind.__name__}, got {value!r}") from None


def in_run_space(groups: SiteGroups, params: dict) -> SiteGroups:
    """The groups in the run's space, the task's ``transform`` (its pooled fill and
    scaling) applied; as they are when the task carries none."""
    if "transform" not in params:
        return groups
    try:
        return groups.in_run_space(scaling.FeatureTransform.decode(str(params["transform"])))
    except ValueError as err:
        raise TaskError(f"task parameter 'transform': {err}") from None


def received_centroids(centroids: np.ndarray | None, site: SiteGroups) -> np.ndarray:
    """Centroids the server sent (``inputs.centroids``, ``inputs.means``...), checked
    against this site's width and for finiteness, as a contiguous float64 array."""
    if centroids is None:
        raise TaskError("the task needs the global centroids")
    C = np.asarray(centroids, dtype=np.float64)
    if C.ndim != 2 or C.shape[1] != site.n_features or C.shape[0] < 1:
        raise TaskError(
            f"centroids of shape {C.shape} do not fit this site's {site.n_features} features"
        )
    if not np.all(np.isfinite(C)):
        raise TaskError("the centroids sent by the server are not all finite")
    return np.ascontiguousarray(C)

"""The trained model: centroids plus what produced them; save/load and prediction.

``model.json`` is the one file a site needs to label its own rows
(``fedcluster predict``); labels never leave the site.

With a run's ``scale``, the clustering happened on scaled rows: the centroids are in that
scaled space, the transform is stored (``scaling``) and applied by ``predict``,
``transform``, ``score`` and ``memberships``, which all take raw rows; model.json also
gives the centroids in original units (``centroids-original``) for people to read.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from fedcluster.common import kernels
from fedcluster.common.scaling import FeatureTransform

FORMAT_VERSION = 1


@dataclass
class Model:
    """A federated clustering model."""

    centroids: np.ndarray
    algorithm: str
    config: dict = field(default_factory=dict)
    feature_names: list[str] = field(default_factory=list)
    metrics: dict = field(default_factory=dict)
    history: list[dict] = field(default_factory=list)
    fuzzifier: float | None = None  # set for fuzzy c-means models
    # GTV (decentralised) models: every site's own centroids, by site id; ``centroids``
    # is then the consensus.
    site_centroids: dict[str, np.ndarray] | None = None
    scaling: FeatureTransform | None = None  # the run's global transform (scale)

    @property
    def n_clusters(self) -> int:
        return int(self.centroids.shape[0])

    @property
    def n_features(self) -> int:
        return int(self.centroids.shape[1])

    @property
    def centroids_original(self) -> np.ndarray:
        """The centroids in the data's original units (the same as ``centroids`` unscaled)."""
        return self.centroids if self.scaling is None else self.scaling.inverse(self.centroids)

    def _check(self, X) -> np.ndarray:
        """Raw rows, checked, in the space of the centroids (scaled when the run was)."""
        X = np.ascontiguousarray(kernels.check_rows(X, "data"), dtype=np.float64)
        if X.shape[1] != self.n_features:
            raise ValueError(
                f"data of shape {X.shape} does not match the model's {self.n_features} features"
            )
        return X if self.scaling is None else np.ascontiguousarray(self.scaling.apply(X))

    def predict(self, X) -> np.ndarray:
        """Index of the nearest centroid for each row (ties: lowest index)."""
        return kernels.assign(self._check(X), self.centroids)[0]

    def memberships(self, X) -> np.ndarray:
        """Fuzzy memberships (n, k) of a fuzzy c-means model (Bezdek, m = fuzzifier)."""
        if self.fuzzifier is None:
            raise ValueError("memberships need a fuzzy c-means model (algorithm 'ffcm')")
        return kernels.fcm_memberships(self._check(X), self.centroids, self.fuzzifier)

    def transform(self, X) -> np.ndarray:
        """Euclidean distance of each row to each centroid, (n, k), in the scaled space."""
        X = self._check(X)
        diff = X[:, None, :] - self.centroids[None, :, :]
        return np.sqrt(np.einsum("nkd,nkd->nk", diff, diff))

    def score(self, X) -> float:
        """Mean squared distance to the nearest centroid (the global score on X; in the
        scaled space when the run was scaled)."""
        return float(np.mean(kernels.assign(self._check(X), self.centroids)[1]))

    def to_sklearn(self):
        """A fitted ``sklearn.cluster.KMeans`` with these centroids as ``cluster_centers_``
        (so its ``predict`` equals :meth:`predict`); for a scaled model, a ``Pipeline`` of a
        ``StandardScaler`` whose ``mean_`` and ``scale_`` are the stored shift and factor
        (it applies exactly the model's transform, whatever its kind) and that KMeans."""
        from sklearn.cluster import KMeans
        from sklearn.pipeline import Pipeline
        from sklearn.preprocessing import StandardScaler

        # Fitting on the centroids themselves from init = centroids gives a fitted
        # estimator in one Lloyd step; the centres are then set to ours exactly.
        model = KMeans(self.n_clusters, init=self.centroids, n_init=1, max_iter=1)
        model.fit(self.centroids)
        model.cluster_centers_ = self.centroids.copy()
        model.labels_ = np.arange(self.n_clusters)
        model.inertia_ = 0.0
        names = np.asarray(self.feature_names, dtype=object) if self.feature_names else None
        if self.scaling is None:
            if names is not None:
                model.feature_names_in_ = names
            return model
        scaler = StandardScaler()
        scaler.mean_, scaler.scale_ = self.scaling.shift.copy(), self.scaling.factor.copy()
        scaler.var_ = scaler.scale_**2
        scaler.n_features_in_, scaler.n_samples_seen_ = self.n_features, int(self.metrics.get("n-rows", 0))
        if names is not None:
            scaler.feature_names_in_ = names
        return Pipeline([("scale", scaler), ("kmeans", model)])

    def to_dict(self) -> dict:
        out = asdict(self)
        out["centroids"] = self.centroids.tolist()
        out["scaling"] = None if self.scaling is None else self.scaling.to_dict()
        if self.scaling is not None:
            out["centroids-original"] = self.centroids_original.tolist()
        out["n-features"] = self.n_features
        out["format-version"] = FORMAT_VERSION
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, default=json_default)

    @classmethod
    def from_json(cls, text: str) -> "Model":
        data = json.loads(text)
        return cls(
            centroids=np.asarray(data["centroids"], dtype=np.float64),
            algorithm=data["algorithm"],
            config=data.get("config", {}),
            feature_names=data.get("feature_names", []),
            metrics=data.get("metrics", {}),
            history=data.get("history", []),
            fuzzifier=data.get("fuzzifier"),
            site_centroids=(
                None if data.get("site_centroids") is None
                else {key: np.asarray(W, dtype=np.float64)
                      for key, W in data["site_centroids"].items()}
            ),
            scaling=FeatureTransform.from_dict(data["scaling"]) if data.get("scaling") else None,
        )

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json())

    @classmethod
    def load(cls, path: str | Path) -> "Model":
        return cls.from_json(Path(path).read_text())


def json_default(value):
    """numpy arrays and scalars as JSON (``json.dumps(..., default=json_default)``): the
    one converter of model.json and choose-k.json."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"cannot store {type(value).__name__} as JSON")

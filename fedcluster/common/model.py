"""The trained model: centroids plus what produced them; save/load and prediction.

``model.json`` is the one file a site needs to label its own rows
(``fedcluster predict``); labels never leave the site.

With a run's ``scale``, the clustering happened on scaled rows: the centroids are in that
scaled space, the transform is stored (``scaling``) and applied by ``predict``,
``transform``, ``score`` and ``memberships``, which all take raw rows; model.json also
gives the centroids in original units (``centroids-original``) for people to read.

A run read through a schema (run config ``schema``) stores the schema too (``schema``: it
is public, every site holds it), and :meth:`Model.predict_table` labels a raw table (a
header and its columns, as ``client_app.table_files.read_table`` gives them, or any
columns of text or numbers) with the run's own encoding, imputation and scaling.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from fedcluster.common import kernels
from fedcluster.common.kernels import fuzzy as fuzzy_kernels
from fedcluster.common.profile import FIELDS
from fedcluster.common.scaling import FeatureTransform
from fedcluster.common.schema import Schema, parse_schema
from fedcluster.common.table_encoding import encode_table, frame_columns

FORMAT_VERSION = 1


@dataclass(frozen=True)
class TablePrediction:
    """What :meth:`Model.predict_table` gives.

    Attributes
    ----------
    labels : np.ndarray
        int64 (rows kept,): the index of the nearest centroid of every row that was kept,
        in the table's order.
    kept : np.ndarray
        bool (rows of the table,): False for a row dropped by a ``drop-row`` column (a
        missing cell), as a site drops it in a run; ``labels`` are those of the True rows.
    """

    labels: np.ndarray
    kept: np.ndarray

    @property
    def dropped_rows(self) -> np.ndarray:
        """0-based indices of the table's rows that were dropped (data row i + 1)."""
        return np.flatnonzero(~self.kept)

    def by_row(self, dropped: int = -1) -> np.ndarray:
        """One label per row of the table, ``dropped`` for a dropped row (-1: the
        "no cluster" label of scikit-learn's DBSCAN)."""
        out = np.full(self.kept.shape, dropped, dtype=np.int64)
        out[self.kept] = self.labels
        return out


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
    # The run's table schema (``Schema.model_dump(mode="json", by_alias=True)``; a Schema
    # is converted), None for a run on arrays or files read without one.
    schema: dict | None = None
    # Table 1 by cluster (``strategies/profile.py``): ``{"rows": [tidy rows], "floor": p,
    # "secure": bool, "notes": [str], "from-groups": bool}``; None when the run left none
    # (its metrics' ``profile-note`` says why).
    table1: dict | None = None

    def __post_init__(self) -> None:
        if isinstance(self.schema, Schema):
            self.schema = self.schema.model_dump(mode="json", by_alias=True)
        # Validated once (SchemaError, a ValueError, names the key); kept parsed.
        self._schema = None if self.schema is None else parse_schema(self.schema, "model schema")

    @property
    def n_clusters(self) -> int:
        return int(self.centroids.shape[0])

    @property
    def n_features(self) -> int:
        return int(self.centroids.shape[1])

    @property
    def profile(self):
        """Table 1 by cluster as a pandas DataFrame: the rows of ``table1.csv`` (cluster,
        variable, level, unit, statistic, value; a count of 1 to p-1 reads "<p", one
        withheld to protect those "suppressed", a figure known to lie between a and b
        "a-b": the table's small-cell rule, ``common/small_cells.py``); None when the run
        left no profile.

        Raises
        ------
        ImportError
            pandas is not installed (``pip install pandas``; ``table1`` holds the rows).
        """
        if self.table1 is None:
            return None
        try:
            import pandas as pd
        except ImportError:
            raise ImportError("Model.profile is a pandas DataFrame: pip install pandas (or "
                              "read the rows from Model.table1['rows'])") from None
        return pd.DataFrame(self.table1["rows"], columns=list(FIELDS))

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
        X = X if self.scaling is None else np.ascontiguousarray(self.scaling.apply(X))
        if np.isnan(X).any():  # a missing cell the run's fill does not cover
            row, j = np.argwhere(np.isnan(X))[0]
            name = self.feature_names[j] if j < len(self.feature_names or []) else f"feature {j}"
            raise ValueError(f"data row {row + 1}, {name}: the cell is missing and the model "
                             "has no value to fill it with (the run imputed no such column)")
        return X

    def predict(self, X) -> np.ndarray:
        """Index of the nearest centroid for each row (ties: lowest index). Missing cells
        (NaN) take the run's pooled fill (``scaling.fill``). A pandas DataFrame, given to
        a model that keeps its schema, is read through it (:meth:`predict_table`); a row
        the schema's ``drop-row`` drops gets -1."""
        if self.schema is not None and hasattr(X, "columns") and hasattr(X, "to_numpy"):
            return self.predict_table(*frame_columns(X), source="DataFrame").by_row(dropped=-1)
        return kernels.assign(self._check(X), self.centroids)[0]

    def predict_table(self, header: list[str], columns: list, source: str = "table",
                      units: dict[str, str] | None = None) -> TablePrediction:
        """Label a raw table through the model's schema: encoded as a site encodes its
        file (columns by name or alias in any order, units from header suffixes such as
        ``glucose [mmol/L]`` or from ``units``, categories one-hot), missing cells filled
        with the run's pooled values and scaled by ``scaling``, each row then given its
        nearest centroid (ties: lowest index).

        Parameters
        ----------
        header : list of str
            The column names.
        columns : list
            ``columns[j]``: the cells of ``header[j]`` (text, or numbers).
        source : str
            The table's name in error messages (e.g. its path).
        units : dict, optional
            Schema column name -> the unit its cells are in; overrides a header suffix.

        Returns
        -------
        TablePrediction
            ``labels`` of the kept rows and ``kept``, the mask of the table's rows that
            were kept (a row with a missing cell in a ``drop-row`` column is dropped,
            as in the run); ``by_row()`` gives one label per row, -1 for a dropped one.

        Raises
        ------
        ValueError
            The model was trained without a schema; the schema's features differ from the
            model's; a cell is still missing after the fill (its column was not imputed
            in the run), named by feature and row.
        SiteDataError
            The table does not fit the schema (a missing column, an unknown unit or
            category, a cell that is not a number or outside the range, a missing cell under
            ``missing = "error"``, no row left): the message names source, row, column and
            value.
        """
        schema = self._table_schema()
        table = encode_table(header, columns, schema, source, units)
        X, kept = table.X, table.kept
        names = schema.feature_names()
        if X.shape[1] != self.n_features or (self.feature_names and names != self.feature_names):
            raise ValueError(f"the model's schema encodes the features {names}, but the model "
                             f"has {self.n_features}: {self.feature_names}")
        Z = X if self.scaling is None else self.scaling.apply(X)
        left = np.isnan(Z)
        if left.any():
            i, j = np.argwhere(left)[0]
            row = int(np.flatnonzero(kept)[i]) + 1
            raise ValueError(f"{source}: row {row}: feature {names[j]!r} is missing and the "
                             "model has no value to fill it with (the run did not impute it; "
                             f"{int(left[:, j].sum())} such row(s))")
        return TablePrediction(kernels.assign(np.ascontiguousarray(Z), self.centroids)[0], kept)

    @property
    def table_schema(self) -> Schema | None:
        """The run's schema, parsed (None for a model trained without one)."""
        return self._schema

    def _table_schema(self) -> Schema:
        if self._schema is None:
            raise ValueError("this model was trained without a schema (run config `schema`), "
                             "so it cannot read a raw table: encode the rows as the sites did "
                             "and use predict(X)")
        return self._schema

    def memberships(self, X) -> np.ndarray:
        """Fuzzy memberships (n, k) of a fuzzy c-means model (Bezdek, m = fuzzifier)."""
        if self.fuzzifier is None:
            raise ValueError("memberships need a fuzzy c-means model (algorithm 'ffcm')")
        return fuzzy_kernels.fcm_memberships(self._check(X), self.centroids, self.fuzzifier)

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
        (it applies exactly the model's transform, whatever its kind) and that KMeans; for
        a model whose run imputed, a first step that fills a missing cell with the run's
        pooled fill (a cell the run did not impute stays NaN, which KMeans refuses)."""
        from sklearn.cluster import KMeans
        from sklearn.pipeline import Pipeline
        from sklearn.preprocessing import FunctionTransformer, StandardScaler

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
        fill = self.scaling.fill
        if fill is None or np.isnan(fill).all():
            if names is not None:
                scaler.feature_names_in_ = names
            return Pipeline([("scale", scaler), ("kmeans", model)])
        # The fill step hands the scaler an array, so the names stay with the first step.
        filler = FunctionTransformer(FeatureTransform.fill_only(fill).apply, validate=False,
                                     feature_names_out="one-to-one")
        filler.fit(np.zeros((1, self.n_features)))
        if names is not None:
            filler.feature_names_in_ = names
        return Pipeline([("fill", filler), ("scale", scaler), ("kmeans", model)])

    def to_dict(self) -> dict:
        out = asdict(self)
        out["centroids"] = self.centroids.tolist()
        out["scaling"] = None if self.scaling is None else self.scaling.to_dict()
        if self.scaling is not None:
            out["centroids-original"] = self.centroids_original.tolist()
        if self.table1 is not None:  # rows as lists: a long table, written once
            out["table1"] = {**self.table1, "columns": list(FIELDS),
                             "rows": [[row[c] for c in FIELDS] for row in self.table1["rows"]]}
        out["n-features"] = self.n_features
        out["format-version"] = FORMAT_VERSION
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, default=json_default)

    @classmethod
    def from_json(cls, text: str, source: str = "model.json") -> "Model":
        """The model a :meth:`to_json` text holds.

        Raises
        ------
        ValueError
            Not JSON, not a model (a key missing, naming it), or a newer format.
        """
        try:
            data = json.loads(text)
            if not isinstance(data, dict):
                raise ValueError("not a JSON object")
            version = data.get("format-version", FORMAT_VERSION)
            if not isinstance(version, int) or version > FORMAT_VERSION:
                raise ValueError(f"format-version {version!r} is newer than this fedcluster "
                                 f"reads ({FORMAT_VERSION}): upgrade fedcluster")
            return cls._from_dict(data)
        except KeyError as err:
            raise ValueError(f"{source}: not a fedcluster model (no key {err})") from None
        except (ValueError, TypeError) as err:
            raise ValueError(f"{source}: not a fedcluster model ({err})") from None

    @classmethod
    def _from_dict(cls, data: dict) -> "Model":
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
            schema=data.get("schema"),  # absent in a model.json from before schemas
            table1=_table1(data.get("table1")),
        )

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json())

    @classmethod
    def load(cls, path: str | Path) -> "Model":
        return cls.from_json(Path(path).read_text(), str(path))


def _table1(stored: dict | None) -> dict | None:
    """A stored ``table1``, its rows as dicts again."""
    if stored is None:
        return None
    columns = stored.get("columns", list(FIELDS))
    rows = [dict(zip(columns, row)) for row in stored["rows"]]
    return {**{k: v for k, v in stored.items() if k != "columns"}, "rows": rows}


def json_default(value):
    """numpy arrays and scalars as JSON (``json.dumps(..., default=json_default)``): the
    one converter of model.json and choose-k.json."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"cannot store {type(value).__name__} as JSON")

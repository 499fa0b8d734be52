"""Built-in data sets and the partitioners that cut them into simulated sites.

Used by both sides: a simulated site loads its partition (``client_app.data.site_data``), the
simulation's server rebuilds the pooled data for the central comparison, and the CLI's
``partition`` command writes demo site files. ``SiteDataError`` is defined here because a
bad data set name is a site data error on either side.
"""

from __future__ import annotations

import math

import numpy as np

BUILTIN_DATASETS: tuple[str, ...] = ("digits", "blobs")
MAX_DIRICHLET_ATTEMPTS = 100


class SiteDataError(ValueError):
    """A site's data is missing, malformed or unusable; the message says where and why."""


# ---------------------------------------------------------------- built-in datasets

def _make_blobs(seed: int) -> tuple[np.ndarray, np.ndarray]:
    # DWF paper (Holzer, Jacob, Kavane), sec. "Datasets": 5 isotropic Gaussian blobs, 10,000
    # points, std 0.2, centres uniform in [-1, 1]^2 (the paper gives no fixed centres, so they
    # are drawn from the seed), plus 100 uniform points in [-1, 1]^2 as noise (label 5).
    # Draw order (fixed, part of the dataset's definition): centres, Gaussian offsets, noise,
    # shuffle. 2,000 points per blob, as sklearn's make_blobs splits 10,000 over 5 centres.
    rng = np.random.default_rng(seed)
    n_blobs, n_points, n_noise, std = 5, 10_000, 100, 0.2
    centres = rng.uniform(-1.0, 1.0, size=(n_blobs, 2))
    blob_labels = np.repeat(np.arange(n_blobs, dtype=np.int64), n_points // n_blobs)
    blob_points = centres[blob_labels] + rng.normal(0.0, std, size=(n_points, 2))
    noise = rng.uniform(-1.0, 1.0, size=(n_noise, 2))
    X = np.vstack([blob_points, noise])
    y = np.concatenate([blob_labels, np.full(n_noise, n_blobs, dtype=np.int64)])
    order = rng.permutation(len(y))  # so that no slice of the rows is one blob or all noise
    return np.ascontiguousarray(X[order]), y[order]


#: Where every value of a built-in data set lies (Table 1 keeps its figures in it):
#: digits' pixels are intensities 0 to 16.
KNOWN_RANGES = {"digits": (0.0, 16.0)}


def load_builtin(name: str, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Return a built-in dataset as (X float64 (n, d), y int64 (n,)).

    ``"digits"``: scikit-learn's bundled 8x8 digits, 1797 x 64 (`seed` unused).
    ``"blobs"``: the DWF paper's synthetic set, 10,100 x 2, labels 0-4 and 5 for noise.
    """
    if name == "digits":
        from sklearn.datasets import load_digits

        bunch = load_digits()
        return np.ascontiguousarray(bunch.data, dtype=np.float64), bunch.target.astype(np.int64)
    if name == "blobs":
        return _make_blobs(seed)
    raise SiteDataError(f"dataset '{name}': unknown; known datasets are {', '.join(BUILTIN_DATASETS)}")


# ---------------------------------------------------------------- partitioners

_PARTITIONING_FORMS = "'iid', 'dirichlet:ALPHA' (ALPHA > 0) or 'by-label'"


def parse_partitioning(spec: str) -> tuple[str, float | None]:
    """Parse a partitioning spec into (kind, alpha); alpha is None except for Dirichlet."""
    if spec in ("iid", "by-label"):
        return spec, None
    if isinstance(spec, str) and spec.startswith("dirichlet:"):
        try:
            alpha = float(spec.split(":", 1)[1])
        except ValueError:
            alpha = math.nan
        if math.isfinite(alpha) and alpha > 0:
            return "dirichlet", alpha
    raise ValueError(f"partitioning {spec!r} is not valid; use {_PARTITIONING_FORMS}")


def partition(y: np.ndarray, n_sites: int, spec: str, seed: int, min_rows: int = 2) -> list[np.ndarray]:
    """Split row indices ``0..len(y)-1`` over `n_sites` sites.

    Returns `n_sites` sorted int64 index arrays that cover every row exactly once, each with at
    least `min_rows` rows; the result depends only on (y, n_sites, spec, seed).
    ``iid`` shuffles and cuts into near-equal parts; ``dirichlet:ALPHA`` gives each class's
    rows to sites in proportions drawn from Dirichlet(ALPHA) (Hsu et al. 2019, as in Flower
    Datasets' DirichletPartitioner), re-drawing up to 100 times until every site has
    `min_rows` rows; ``by-label`` deals whole classes, largest first, to the smallest site.
    """
    kind, alpha = parse_partitioning(spec)
    y = np.asarray(y)
    if y.ndim != 1:
        raise ValueError(f"labels must be 1-D, got shape {y.shape}")
    n = len(y)
    if not 1 <= n_sites <= n:
        raise ValueError(f"n_sites must be between 1 and the number of rows ({n}), got {n_sites}")
    if n_sites * min_rows > n:
        raise ValueError(f"{n} rows cannot give {n_sites} sites at least {min_rows} rows each")
    rng = np.random.default_rng(seed)
    classes, y_codes = np.unique(y, return_inverse=True)
    if kind == "iid":
        parts = np.array_split(rng.permutation(n), n_sites)
    elif kind == "dirichlet":
        rows_of_class = [np.flatnonzero(y_codes == c) for c in range(len(classes))]
        for _ in range(MAX_DIRICHLET_ATTEMPTS):
            pieces: list[list[np.ndarray]] = [[] for _ in range(n_sites)]
            for rows in rows_of_class:
                rows = rng.permutation(rows)
                share = rng.dirichlet(np.full(n_sites, alpha))
                cuts = (np.cumsum(share)[:-1] * len(rows)).astype(np.int64)
                for site, chunk in enumerate(np.split(rows, cuts)):
                    pieces[site].append(chunk)
            parts = [np.concatenate(p) for p in pieces]
            smallest = min(len(p) for p in parts)
            if smallest >= min_rows:
                break
        else:
            raise ValueError(f"partitioning {spec!r}: no split of {n} rows over {n_sites} sites gave "
                             f"every site {min_rows} rows in {MAX_DIRICHLET_ATTEMPTS} attempts (last "
                             f"smallest site: {smallest}); use a larger ALPHA or fewer sites")
    else:
        if n_sites > len(classes):
            raise ValueError(f"partitioning 'by-label': {n_sites} sites but only {len(classes)} "
                             "classes; each site needs at least one whole class")
        counts = np.bincount(y_codes, minlength=len(classes))
        site_of_class = np.empty(len(classes), dtype=np.int64)
        site_rows = np.zeros(n_sites, dtype=np.int64)
        for c in np.argsort(-counts, kind="stable"):
            site = int(np.argmin(site_rows))  # first smallest site: ties go to the lowest id
            site_of_class[c] = site
            site_rows[site] += counts[c]
        if site_rows.min() < min_rows:
            raise ValueError(f"partitioning 'by-label': a site gets only {site_rows.min()} rows; "
                             f"at least {min_rows} are needed")
        parts = [np.flatnonzero(site_of_class[y_codes] == s) for s in range(n_sites)]
    return [np.sort(p).astype(np.int64) for p in parts]

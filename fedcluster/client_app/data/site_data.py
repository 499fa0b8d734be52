"""Site data: loading and validation of the rows one site clusters.

A site's rows never leave it. In deployment each site loads a file named by its node config
(`data-path`); Flower starts a fresh process for every round, so a CSV is parsed once into a
memory-mapped float64 cache and later rounds only map it. In simulation each site takes one
partition of a built-in dataset (cut by ``common.datasets``). Every data problem raises `SiteDataError`, whose message starts
with the source and names the row, line and column, because it is shown to the site admin and
relayed to the server operator.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from fedcluster.client_app import site_files
from fedcluster.client_app.mapped_pages import read_only_mapping, release_pages  # noqa: F401 (re-exported)
from fedcluster.client_app.site_groups import TableFacts
from fedcluster.client_app.data.tables import parse_csv, read_column
from fedcluster.client_app.data.versions.row_keys import id_keys
from fedcluster.common import kernels
from fedcluster.common.datasets import SiteDataError, load_builtin, partition

__all__ = ["SiteData", "SiteDataError", "TableFacts", "check_site_array", "load_partition", "load_site_file"]

logger = logging.getLogger(__name__)
SUPPORTED_SUFFIXES: tuple[str, ...] = (".csv", ".tsv", ".npy")
CACHE_FORMAT = "fedcluster-site-cache-v1"  # in the key: a format change invalidates old caches


@dataclass(frozen=True)
class SiteData:
    """The rows one site clusters.

    Attributes
    ----------
    X : np.ndarray
        float64, 2-D, C-contiguous; may be a read-only `np.memmap`.
    feature_names : tuple of str or None
        Column names, when the source has them.
    labels : np.ndarray or None
        1-D int64 ground truth, kept at the site for evaluation only.
    source : str
        Human-readable origin (file path or dataset/partition).
    label_names : tuple of str or None
        Original label values when they were not integers: code ``i`` means ``label_names[i]``.
    table : TableFacts or None
        A table read through the agreed schema (``schema_table.py``): the schema, what the
        encoding dropped and left missing. ``X`` then holds NaN in a cell the run imputes.
    fingerprint : str or None
        :func:`data_fingerprint` of ``X`` when it is known without hashing the rows again
        (a cache entry keeps it); None: compute it (:meth:`rows_fingerprint`).
    version : str or None
        The key of this version of a file (its cache key: path, size, mtime and the
        columns read), under which its group table is kept; None: data held in memory.
    lineage : str or None
        The file and the columns read, whatever its version (the key under which an
        earlier release kept a file's latest group table; ``group_table.py`` imports it).
    reading : str or None
        The way the data are read (columns, label, id, schema, units), whatever the file
        or its version: the key of the site's answered history
        (``release/record/``); None: data held in memory.
    row_ids : np.ndarray or None
        (n, 2) uint64: each row's id (a hash of its id column's text), where the data
        name an id column: what makes a corrected row the same row (``versions/row_keys.py``).
    dropped_keys : np.ndarray or None
        (m, 2) uint64: a hash of each row the schema's ``drop-row`` dropped (its cells'
        text): the rows dropped are counted by groups of them too (``group_table.py``).
    """

    X: np.ndarray
    feature_names: tuple[str, ...] | None
    labels: np.ndarray | None
    source: str
    label_names: tuple[str, ...] | None = None
    table: "TableFacts | None" = None
    fingerprint: str | None = None
    version: str | None = None
    lineage: str | None = None
    reading: str | None = None
    row_ids: np.ndarray | None = None
    dropped_keys: np.ndarray | None = None

    @property
    def n_rows(self) -> int:
        return int(self.X.shape[0])

    def rows_fingerprint(self) -> str:
        """:func:`data_fingerprint` of ``X`` (the cache entry's, when it kept one)."""
        return self.fingerprint or data_fingerprint(np.asarray(self.X))

    @property
    def n_features(self) -> int:
        return int(self.X.shape[1])


def data_fingerprint(X: np.ndarray) -> str:
    """sha256 of a site's rows (shape, dtype, values): what the privacy budget belongs to
    (other rows start afresh). A cache entry keeps it, so a deployed site hashes its rows
    once per file version, not per task."""
    digest = hashlib.sha256(f"{X.shape}\0{X.dtype.str}\0".encode())
    block = max(1, (1 << 22) // max(1, X.shape[1]))
    for start in range(0, X.shape[0], block):
        digest.update(np.ascontiguousarray(X[start:start + block]).tobytes())
        release_pages(X)  # a memory-mapped cache is hashed without all of it resident
    return digest.hexdigest()


# ---------------------------------------------------------------- validation

def check_site_array(X: np.ndarray, source: str, min_rows: int = 1) -> np.ndarray:
    """Validate a site's data matrix and return it as float64 C-contiguous.

    Checks: 2-D, at least one column, an int or float dtype, every value finite (the first bad
    value is named by 0-based row and column index), at least `min_rows` rows. No copy is made
    when `X` already is float64 C-contiguous, so a memmap stays a memmap.
    """
    X = X if isinstance(X, np.ndarray) else np.asarray(X)
    if X.dtype.kind not in "iuf":
        raise SiteDataError(f"{source}: dtype {X.dtype} is not numeric; an int or float array is needed")
    kernels.check_rows(X, source, min_rows, error=SiteDataError)
    if not (X.dtype == np.float64 and X.flags.c_contiguous):
        X = np.ascontiguousarray(X, dtype=np.float64)
    # Row blocks of ~1M values bound the temporary mask to ~1 MB, so checking a large
    # memory-mapped file adds next to nothing to the site's peak memory (bench/scale.py).
    block = max(1, (1 << 20) // X.shape[1])
    for start in range(0, X.shape[0], block):
        finite = np.isfinite(X[start:start + block])
        if not finite.all():
            row, col = np.argwhere(~finite)[0]
            raise SiteDataError(f"{source}: row index {start + row}, column index {col} (0-based) "
                                f"is {X[start + row, col]}; every value must be finite")
        release_pages(X)  # a memory-mapped file is checked without all of it resident
    return X


@lru_cache(maxsize=4)
def _builtin_readonly(dataset: str, seed: int) -> tuple[np.ndarray, np.ndarray]:
    # Cached because a simulated site may be asked for its partition every round.
    X, y = load_builtin(dataset, seed)
    X.setflags(write=False)
    y.setflags(write=False)
    return X, y


@lru_cache(maxsize=8)
def _partition_cached(dataset: str, partitioning: str, n_sites: int, seed: int) -> tuple:
    """Each site's (X, y), read-only, made once: the same array objects every message, so
    a simulated site's groups are made once too (``group_table``'s memory is per array
    object; a fresh ``X[rows]`` per message regrouped the site every round)."""
    X, y = _builtin_readonly(dataset, seed)
    sites = []
    for rows in partition(y, n_sites, partitioning, seed):
        X_site, y_site = X[rows], y[rows]
        X_site.setflags(write=False)  # read-only, like a deployed site's memmap
        y_site.setflags(write=False)
        sites.append((X_site, y_site))
    return tuple(sites)


def load_partition(dataset: str, partitioning: str, partition_id: int, num_partitions: int,
                   seed: int) -> SiteData:
    """Return the rows of partition `partition_id` of a built-in dataset (simulation path)."""
    source = f"{dataset}[partition {partition_id} of {num_partitions}, {partitioning}]"
    if isinstance(partition_id, bool) or not isinstance(partition_id, (int, np.integer)) \
            or not 0 <= partition_id < num_partitions:
        raise SiteDataError(f"{source}: partition-id must be an integer in [0, {num_partitions})")
    try:
        X_site, y_site = _partition_cached(dataset, partitioning, int(num_partitions),
                                           int(seed))[partition_id]
    except SiteDataError:
        raise
    except ValueError as error:
        raise SiteDataError(f"{source}: {error}") from error
    names = tuple(f"pixel_{i // 8}_{i % 8}" for i in range(64)) if dataset == "digits" else None
    return SiteData(X=X_site, feature_names=names, labels=y_site, source=source)


# ---------------------------------------------------------------- file loading + cache

def lineage_key(path: str | os.PathLike, *choices) -> str:
    """The key of a file and the way it is read (``choices``: columns, schema, units),
    whatever its version: a grown file keeps the groups of its earlier version."""
    text = "\0".join([CACHE_FORMAT, os.path.realpath(path), *map(repr, choices)])
    return hashlib.sha256(text.encode()).hexdigest()


def reading_key(*choices) -> str:
    """The key of a way of reading a site's data (``choices``: columns, label, id, schema,
    units), whatever the file: the site's answered history is kept per reading, so a
    file exported anew under another name continues it."""
    return hashlib.sha256("\0".join([CACHE_FORMAT, *map(repr, choices)]).encode()).hexdigest()


def in_history(site: "SiteData", name: str | None) -> "SiteData":
    """``site`` with its answered history named ``name`` (node config ``history``: a
    study of its own, whose groups are not audited against another history's); None:
    the default, one history per way of reading the data."""
    if not name or site.reading is None:
        return site
    return dataclasses.replace(site, reading=reading_key(site.reading, "history", name))


def cache_key(path: str | os.PathLike, label_column: str | None = None,
              columns: tuple[str, ...] | None = None, id_column: str | None = None) -> str:
    """Cache key of a data file: sha256 of its real path, size and mtime (ns), and of the
    column keys (label, selection, id), so an edited file or another choice of columns gets
    a fresh cache entry."""
    real = os.path.realpath(path)
    stat = os.stat(real)
    text = f"{CACHE_FORMAT}\0{real}\0{stat.st_size}\0{stat.st_mtime_ns}\0{label_column!r}"
    if columns is not None or id_column is not None:  # keeps the keys of older entries valid
        text += f"\0{columns!r}\0{id_column!r}"
    return hashlib.sha256(text.encode()).hexdigest()


def default_cache_dir() -> Path:
    env = os.environ.get("FEDCLUSTER_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "fedcluster"


def write_atomic(target: Path, write) -> None:
    # Temp file in the same directory + os.replace: a concurrent reader sees the old file or the
    # complete new one, never a partial one.
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=target.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(site_files.InPieces(f))  # (in pieces: site_files.WRITE_PIECE)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def cache_sibling(base: Path, suffix: str) -> Path:
    """A cache entry's file: ``base`` (the key's path) with ``suffix``."""
    return base.parent / (base.name + suffix)


def read_cache(base: Path, source: str, ids: bool = False) -> tuple[SiteData, dict] | None:
    """The cached entry at ``base``, memory-mapped, and its sidecar (what the writer's
    ``columns`` said); None: missing, incomplete, damaged, or without the rows' ids when
    ``ids`` (an entry written before ids were kept: parsed again)."""
    try:  # the sidecar is written last, so its presence means the entry is complete
        meta = json.loads(cache_sibling(base, ".json").read_text())
        X = np.load(cache_sibling(base, ".npy"), mmap_mode="r")
        labels = np.load(cache_sibling(base, ".labels.npy")) if meta["has_labels"] else None
        row_ids = np.load(cache_sibling(base, ".ids.npy")) if meta.get("has_ids") else None
        dropped = np.load(cache_sibling(base, ".dropped.npy")) if meta.get("has_dropped") else None
    except (OSError, ValueError, KeyError, TypeError):
        return None  # missing or damaged: parse again and overwrite
    if meta.get("format") != CACHE_FORMAT or list(X.shape) != meta.get("shape") or X.dtype != np.float64 \
            or (labels is not None and labels.shape != X.shape[:1]) \
            or (ids and (row_ids is None or row_ids.shape != (X.shape[0], 2))):
        return None
    names = meta.get("feature_names")
    label_names = meta.get("label_names")
    fingerprint = meta.get("rows-sha256")
    return SiteData(X=X, feature_names=tuple(names) if names else None, labels=labels, source=source,
                    label_names=tuple(label_names) if label_names else None,
                    fingerprint=fingerprint if isinstance(fingerprint, str) else None,
                    row_ids=row_ids, dropped_keys=dropped), meta


def write_cache(base: Path, data: SiteData, real_path: str, columns: dict,
                rows_file: Path | None = None) -> None:
    """Write ``data`` as the entry at ``base`` (the arrays, then the sidecar with
    ``columns``: what else a reader of the entry needs to know, and the rows' fingerprint).
    ``rows_file``: a complete ``.npy`` of ``data.X`` already written beside ``base`` (a
    database's result, streamed there), moved into place instead of written again."""
    base.parent.mkdir(parents=True, exist_ok=True)
    if data.labels is not None:
        write_atomic(cache_sibling(base, ".labels.npy"), lambda f: np.save(f, data.labels))
    if data.row_ids is not None:
        write_atomic(cache_sibling(base, ".ids.npy"), lambda f: np.save(f, data.row_ids))
    if data.dropped_keys is not None:
        write_atomic(cache_sibling(base, ".dropped.npy"), lambda f: np.save(f, data.dropped_keys))
    if rows_file is None:
        X = np.ascontiguousarray(data.X, dtype=np.float64)
        write_atomic(cache_sibling(base, ".npy"), lambda f: np.save(f, X))
    else:
        X = data.X
        os.replace(rows_file, cache_sibling(base, ".npy"))
    meta = {"format": CACHE_FORMAT, "source": real_path, **columns,
            "rows-sha256": data_fingerprint(X),
            "shape": list(data.X.shape), "feature_names": data.feature_names,
            "has_labels": data.labels is not None, "label_names": data.label_names,
            "has_ids": data.row_ids is not None, "has_dropped": data.dropped_keys is not None}
    write_atomic(cache_sibling(base, ".json"), lambda f: f.write(json.dumps(meta, indent=1).encode()))


def _open_npy(path: Path) -> np.ndarray:
    fmt = np.lib.format
    try:  # the header first: object arrays cannot be mapped and must be named as such
        with open(path, "rb") as f:
            version = fmt.read_magic(f)
            read_header = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
            dtype = read_header(f)[2]
        if dtype.hasobject:
            raise SiteDataError(f"{path}: the array holds Python objects; a numeric (int or float) "
                                "array is needed")
        return np.load(path, mmap_mode="r")
    except SiteDataError:
        raise
    except (ValueError, OSError, EOFError) as error:
        raise SiteDataError(f"{path}: cannot be read as a .npy array ({error})") from None


def load_site_file(path: str | os.PathLike, *, cache_dir: str | os.PathLike | None = None,
                   label_column: str | None = None, min_rows: int = 1,
                   columns: tuple[str, ...] | None = None, id_column: str | None = None) -> SiteData:
    """Load a site's data file (deployment path), through a memory-mapped cache.

    A ``.csv`` (``.tsv``) needs a header row. `id_column` is dropped unread, `label_column`
    is kept as labels, and the features are `columns` (header names, in that order) or
    else every other column; all features must be numeric (see ``tabular.py``). A ``.npy`` must hold a 2-D int or float array;
    a float64 C-order one is memory-mapped in place. Anything else is parsed once and cached
    as float64 ``.npy`` in `cache_dir` (default ``$FEDCLUSTER_CACHE_DIR``, else
    ``~/.cache/fedcluster``), keyed by `cache_key`; later calls map the cache read-only without
    reading the source. An unwritable cache dir only costs a warning and an in-memory parse.

    Raises
    ------
    SiteDataError
        For any data problem, with the file, data row, line and column where they apply.
    """
    path = Path(path)
    source = str(path)
    if not path.exists():
        raise SiteDataError(f"data-path '{path}' does not exist")
    if path.is_dir():
        raise SiteDataError(f"data-path '{path}' is a directory, not a data file")
    suffix = path.suffix.lower()
    if suffix not in SUPPORTED_SUFFIXES:
        raise SiteDataError(f"{source}: unsupported file type {suffix or '(none)'!r}; "
                            f"supported: {', '.join(SUPPORTED_SUFFIXES)}")
    for key, value in (("label-column", label_column), ("columns", columns), ("id-column", id_column)):
        if suffix == ".npy" and value is not None:
            raise SiteDataError(f"{source}: {key} needs a CSV file; a .npy holds features only")
    if not os.access(path, os.R_OK):
        raise SiteDataError(f"{source}: the file is not readable by this process")
    key = cache_key(path, label_column, columns, id_column)
    known = {"version": key, "lineage": lineage_key(path, label_column, columns, id_column),
             "reading": reading_key("plain", label_column, columns, id_column)}
    if suffix == ".npy":
        mapped = _open_npy(path)
        if mapped.dtype == np.float64 and mapped.flags.c_contiguous:
            return SiteData(X=check_site_array(mapped, source, min_rows), feature_names=None,
                            labels=None, source=source, **known)
    base = Path(cache_dir if cache_dir is not None else default_cache_dir()) / key
    entry = read_cache(base, source, ids=id_column is not None)
    if entry is not None:
        kernels.check_rows(entry[0].X, source, min_rows, error=SiteDataError)  # values checked before caching
        return dataclasses.replace(entry[0], **known)
    row_ids = None
    if suffix == ".npy":
        X, names, labels, label_names = mapped, None, None, None
    else:
        X, names, labels, label_names = parse_csv(path, label_column, columns, id_column)
        if id_column is not None:
            row_ids = id_keys(read_column(path, id_column))
    X = check_site_array(X, source, min_rows)
    data = SiteData(X=X, feature_names=names, labels=labels, source=source, label_names=label_names,
                    row_ids=row_ids, **known)
    try:
        write_cache(base, data, os.path.realpath(path),
                     {"label_column": label_column, "columns": columns, "id_column": id_column})
    except OSError as error:
        logger.warning("%s: cannot write the data cache in %s (%s); parsing in memory every round",
                       source, base.parent, error)
        X.setflags(write=False)
        return data
    entry = read_cache(base, source)
    if entry is None:  # e.g. removed by a cleaner in between: the parsed data is still good
        X.setflags(write=False)
        return data
    return dataclasses.replace(entry[0], **known)

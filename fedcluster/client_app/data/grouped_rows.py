"""What the grouping sees of a site's rows, and the groups it makes of them.

The grouping (``grouping.py``) decides who is with whom from the rows with each missing
cell at its feature's site mean; where cells are missing, a group that would hold a
feature's present cell alone is then merged with a near one (``present_groups.py``).
``group_table.py`` computes the statistics of the groups made here; the versions rule
groups a new version's waiting rows here too.
"""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path

import numpy as np

from fedcluster.client_app.data import present_groups
from fedcluster.client_app.data.grouping import group_rows, grouping_scale
from fedcluster.client_app.data.site_data import SiteData, release_pages
from fedcluster.client_app.data.versions import row_keys
from fedcluster.client_app.mapped_pages import rows_in_spans
from fedcluster.client_app.site_files import write_pieces
from fedcluster.client_app.site_groups import GroupLabels

__all__ = ["CHUNK_ROWS", "grouped", "grouping_rows", "grouping_sums", "judged_features",
           "label_codes", "labels_of_groups", "mended", "row_hashes"]

#: Rows per chunk of a pass over the rows: bounds the temporaries to a few CHUNK_ROWS x d
#: values (the same figure as group_table's passes).
CHUNK_ROWS = 1 << 14


# ------------------------------------------------------------------ what the grouping sees
@contextlib.contextmanager
def grouping_rows(site: SiteData, rows: np.ndarray | None = None, scratch: Path | None = None):
    """The rows the grouping sees (``rows``: those rows of the site, ascending): a missing
    cell at its feature's site mean (the grouping only decides who is with whom; the
    statistics keep the cell missing). The site's own rows when it has all of them and
    no missing cell; else a copy, made a chunk at a time, in a temporary file in
    ``scratch`` when given (mapped read-only, so never all resident), else in memory."""
    X = site.X
    missing = site.table is not None and site.table.has_missing
    if rows is None and not missing:
        yield X
        return
    n, d = (X.shape[0] if rows is None else len(rows)), X.shape[1]

    def chunks():  # in file order, a memory-mapped site's pages dropped after each
        for start in range(0, n, CHUNK_ROWS):
            yield start, np.asarray(X[start:start + CHUNK_ROWS] if rows is None
                                    else rows_in_spans(X, rows[start:start + CHUNK_ROWS], CHUNK_ROWS))
            release_pages(X)

    means = None
    if missing:  # chunked, so a file and memory give the same bits
        present, total = np.zeros(d, dtype=np.int64), np.zeros(d)
        for _, block in chunks():
            absent = np.isnan(block)
            present += (~absent).sum(axis=0)
            total += np.where(absent, 0.0, block).sum(axis=0)
        means = total / np.maximum(present, 1)
    with contextlib.ExitStack() as stack:
        out = stack.enter_context(tempfile.TemporaryFile(dir=scratch)) if scratch else None
        copy = np.empty((n, d)) if out is None else None
        for start, block in chunks():
            if means is not None:
                block = np.where(np.isnan(block), means, block)
            if out is None:
                copy[start:start + len(block)] = block
            else:
                write_pieces(out, np.ascontiguousarray(block))
        if out is not None:
            out.flush()
            copy = np.memmap(out, dtype=np.float64, mode="r", shape=(n, d))
        yield copy


def grouped(site: SiteData, min_size: int, rows: np.ndarray | None = None,
            scratch: Path | None = None) -> np.ndarray:
    """Each row's group (``rows``: of those rows alone), numbered by first appearance;
    where cells are missing, a group that would hold a feature's present cell alone is
    merged with a near one (``present_groups.py``)."""
    with grouping_rows(site, rows, scratch) as X:
        scale = grouping_scale(X)
        labels = group_rows(X, min_size, scale)
        if min_size <= 1 or site.table is None or not site.table.has_missing or labels.max() < 1:
            return labels
        return present_groups.merge_lone_groups(
            labels, *grouping_sums(site, X, scale, labels, rows), min_size)


def grouping_sums(site: SiteData, X, scale: np.ndarray | None, labels: np.ndarray,
                  rows: np.ndarray | None):
    """Per group (``labels``) its rows, its sum in the grouping's space (``X`` times
    ``scale``) and its present cells per feature (the site's own rows: a missing cell is
    NaN there), a chunk of rows at a time in file order."""
    n_groups, d = int(labels.max()) + 1, X.shape[1]
    counts = np.zeros(n_groups, dtype=np.int64)
    sums, present = np.zeros((n_groups, d)), np.zeros((n_groups, d), dtype=np.int64)
    for start in range(0, len(labels), CHUNK_ROWS):
        stop = min(len(labels), start + CHUNK_ROWS)
        group = labels[start:stop]
        keep = group >= 0
        raw = np.asarray(site.X[start:stop] if rows is None
                         else rows_in_spans(site.X, rows[start:stop], CHUNK_ROWS))
        block = np.asarray(X[start:stop]) * (1.0 if scale is None else scale)
        group, block, there = group[keep], block[keep], ~np.isnan(raw[keep])
        counts += np.bincount(group, minlength=n_groups)
        for j in range(d):  # (bincount per column: np.add.at is many times slower)
            sums[:, j] += np.bincount(group, weights=block[:, j], minlength=n_groups)
            present[:, j] += np.bincount(group, weights=there[:, j], minlength=n_groups).astype(np.int64)
        release_pages(site.X)
        release_pages(X)
    return counts, sums, present


def mended(site: SiteData, groups: list[np.ndarray], min_size: int,
           scratch: Path | None = None) -> list[np.ndarray]:
    """Groups a new version of the data makes (``versions/next_version.py``: of fresh
    rows, of the rows of withdrawn groups, or both; each an array of the site's rows)
    with those that would hold a feature's present cells alone merged with near ones
    (``present_groups.py``): the same rule as :func:`grouped`, over these groups."""
    if min_size <= 1 or site.table is None or not site.table.has_missing or len(groups) < 2:
        return groups
    rows = np.concatenate(groups)
    order = np.argsort(rows, kind="stable")
    labels = np.repeat(np.arange(len(groups), dtype=np.int64), [len(g) for g in groups])[order]
    rows = rows[order]
    with grouping_rows(site, rows, scratch) as X:
        merged = present_groups.merge_lone_groups(
            labels, *grouping_sums(site, X, grouping_scale(X), labels, rows), min_size)
    if merged is labels:
        return groups
    order = np.argsort(merged, kind="stable")
    ends = np.cumsum(np.bincount(merged))[:-1]
    return [np.sort(part) for part in np.split(rows[order], ends)]


# ------------------------------------------------------------------ what a table says besides its statistics
def label_codes(site: SiteData) -> tuple[np.ndarray, tuple[str, ...]] | None:
    """Each row's label as an index into the site's sorted distinct labels, and their text."""
    if site.labels is None:
        return None
    values, codes = np.unique(site.labels, return_inverse=True)
    names = tuple(str(site.label_names[v]) if site.label_names is not None else str(int(v))
                  for v in values)
    return codes.astype(np.int64), names


def labels_of_groups(site: SiteData, group_of_row: np.ndarray) -> GroupLabels | None:
    if (coded := label_codes(site)) is None:
        return None
    codes, names = coded
    grouped = group_of_row >= 0
    key = group_of_row[grouped] * len(names) + codes[grouped]
    pairs, count = np.unique(key, return_counts=True)
    return GroupLabels(pairs // len(names), pairs % len(names), count.astype(np.int64), names)


def judged_features(site: SiteData) -> np.ndarray | None:
    """(d,) bool: the features the p% rule on means judges (``release/dominance.py``):
    a schema's numeric columns (a level's indicator sums to a count, which Table 1's
    small-cell rule protects; a stood-in mean would not be one), every column without a
    schema (None)."""
    schema = None if site.table is None else site.table.schema
    if schema is None:
        return None
    judged = []
    for column in schema.features:
        judged += [column.type == "numeric"] if column.type == "numeric" \
            else [False] * len(column.categories)
        judged += [False] if column.missing_indicator else []
    return np.array(judged, dtype=bool) if len(judged) == site.n_features else None


def row_hashes(site: SiteData) -> np.ndarray:
    """(n, 2) uint64: each row's content, wherever it sits in the file (its cells' bits
    and its label's text: ``versions.row_keys.content_keys``)."""
    return row_keys.content_keys(site.X, *(label_codes(site) or (None, None)))

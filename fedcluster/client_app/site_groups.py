"""A site's groups: what every site task answers from.

Once per data version, alone, a site cuts its rows into groups of at least p_site rows
(its own floor, node config ``min-cluster-size``; ``grouping.py`` cuts,
``group_table.py`` keeps) and keeps, per group, what every task needs and nothing finer.
A task receives a :class:`SiteGroups`, never rows, so every value a site sends (outside
differential privacy, which answers from clipped rows with noise: ``private_rows.py``)
is a function of its groups' statistics, each group of at least p_site rows, whatever a
coordinator asks and however often (docs/explanation/privacy-model.md).

What a group keeps (per feature, over its present cells):

- ``counts``: its rows;
- ``sums``: the sum of its present cells;
- ``m2``: the sum of the squared deviations of its present cells from their mean (the
  same information as the sum of squares, given the count and the sum, without the
  cancellation of sum x^2 - (sum x)^2 / n when the data sit far from 0);
- ``present``: its present cells (None: no cell of the table is missing);
- its label counts (:class:`GroupLabels`), for the evaluation's contingency table.

A feature's present cells in a group number 0 or at least p_site: where a group holds 1
to p_site - 1 present cells of a feature, those cells are withheld as missing and
counted apart (``release/lone_cells.py``, the statistical-disclosure-control
literature's local suppression; the groups are first merged so that few are:
``data/present_groups.py``). Their sum would be a function of fewer than p_site rows (of one row's
value, at one present cell), and a coordinator that sends two fills reads it from any
group's mean (``tests/test_lone_cells.py``).

In the run's space (:meth:`SiteGroups.in_run_space`: the run's pooled fill of a missing
cell, then its per-feature affine scaling) every per-feature sum and sum of squares is
exact, so a cluster of whole groups has exact sums, counts and SSE:
SSE(c) = sum over its groups of (scatter + count ||mean - c||^2), ``scatter`` = the
group's m2 summed over the features. A group is assigned whole, to the centroid nearest
its mean (which minimises its SSE). With p_site = 1 every group is one row (``m2``
None), and every task is the row-level algorithm, bit for bit.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from functools import cached_property

import numpy as np

from fedcluster.client_app.mapped_pages import release_pages
from fedcluster.common.scaling import FeatureTransform

__all__ = ["GroupLabels", "SiteGroups", "TableFacts"]


@dataclass(frozen=True)
class TableFacts:
    """What a site knows of its table read through the schema: the schema and its hash,
    the rows ``drop-row`` dropped, per feature column the missing cells among the rows
    kept (``impute-*`` fills them; the schema's other policies leave none)."""

    schema: object  # common.schema.Schema (kept untyped: this module stays light to import)
    schema_hash: str
    rows_dropped: int = 0
    cells_missing: dict = field(default_factory=dict)

    @property
    def has_missing(self) -> bool:
        return any(self.cells_missing.values())

    def of_groups(self, counts: np.ndarray, present: np.ndarray | None,
                  rows_dropped: int) -> "TableFacts":
        """These facts as a group table keeps them, for ``describe``: the missing cells
        per column among the rows in groups (``present``: the groups' present cells before
        the lone-cell rule, so a cell it withholds is not counted missing), and
        ``rows_dropped`` as counted by groups (``versions/dropped_rows.py``), so that both
        move only by whole groups between versions."""
        if self.schema is None:  # (facts made by hand, without a schema: as they are)
            return TableFacts(self.schema, self.schema_hash, int(rows_dropped), self.cells_missing)
        rows = int(np.asarray(counts).sum())
        missing, start = {}, 0
        for column in self.schema.features:
            width = 1 if column.type == "numeric" else len(column.categories)
            missing[column.name] = 0 if present is None else \
                rows - int(np.asarray(present)[:, start].sum())
            start += width + (1 if column.missing_indicator else 0)
        return TableFacts(self.schema, self.schema_hash, int(rows_dropped), missing)


@dataclass(frozen=True)
class GroupLabels:
    """The label counts of a site's groups, as (group, label code, rows) triples sorted
    by group; ``names[code]`` is the label as the site's file writes it."""

    group: np.ndarray
    code: np.ndarray
    count: np.ndarray
    names: tuple[str, ...]

    def contingency(self, cluster_of_group: np.ndarray, k: int) -> np.ndarray:
        """(labels, k) rows per label and cluster, every group in its cluster whole."""
        table = np.zeros((len(self.names), k), dtype=np.int64)
        np.add.at(table, (self.code, np.asarray(cluster_of_group)[self.group]), self.count)
        return table


@dataclass(frozen=True, eq=False)
class SiteGroups:
    """A site's groups (module docstring): the only data a site task receives.

    Attributes
    ----------
    counts : (G,) int64
        Rows per group (at least ``min_size``).
    sums : (G, d) float64
        Per feature, the sum of the group's present cells.
    m2 : (G, d) float64 or None
        Per feature, the squared deviations of the present cells from their mean,
        summed; None: every group is one row (p_site = 1), so every m2 is 0.
    present : (G, d) int64 or None
        Per feature, the group's present cells; None: none is missing.
    source : str
        The site's data, as its errors name it.
    min_size : int
        p_site, the fewest rows of a group (1: the site answers from its rows).
    digest : str
        sha256 of the group table (what the disclosure ledger names).
    feature_names : tuple of str, optional
    labels : GroupLabels, optional
    table : TableFacts, optional
        A table read through a schema: its facts (``describe``, ``impute_stats``).
    waiting : int
        Rows of the site in no group (new rows fewer than p_site: ``group_table.py``).
    data_fingerprint : str, optional
        sha256 of the site's rows: the key of its DP budget (which answers from rows).
    withheld : (G, d) int64 or None
        Per feature, the group's present cells counted as missing, fewer than p_site of
        their feature in their group (``release/lone_cells.py``); None: none.
    table_ref : versions.TableRef, optional
        The table's place in the site's answered history (a deployed site's file; None:
        data held in memory).
    spread_rule : dict, optional
        What the spread rule did to the groups the table made (``release/spreads.py``:
        ``Spreads.summary``), for ``site check``.
    held_back : int
        Of the ``waiting`` rows, those the versions audit held back
        (``data/versions/audited.py``), and ``held_back_why``, the audit's first finding.
    units : (G,) int64 or None
        Each group's spread unit, named by its first group (-1: in none), where the table
        was made in memory (a kept table's are in its store); for the report's audit.
    """

    counts: np.ndarray
    sums: np.ndarray
    m2: np.ndarray | None
    present: np.ndarray | None
    source: str
    min_size: int
    digest: str
    feature_names: tuple[str, ...] | None = None
    labels: GroupLabels | None = None
    table: TableFacts | None = None
    waiting: int = 0
    data_fingerprint: str | None = None
    withheld: np.ndarray | None = None
    table_ref: object = None
    spread_rule: dict | None = None
    held_back: int = 0
    held_back_why: str = ""
    units: np.ndarray | None = None

    @cached_property
    def cells_withheld(self) -> int:
        """Present cells the lone-cell rule withholds, in all."""
        return 0 if self.withheld is None else int(self.withheld.sum())

    @property
    def n_groups(self) -> int:
        return int(self.counts.shape[0])

    @property
    def n_features(self) -> int:
        return int(self.sums.shape[1])

    @cached_property
    def n_rows(self) -> int:
        """Rows in the groups (the site's size, as every task reports it)."""
        return int(self.counts.sum())

    @property
    def singletons(self) -> bool:
        """Every group is one row (p_site = 1)."""
        return self.m2 is None

    @cached_property
    def means(self) -> np.ndarray:
        """(G, d) each group's mean (of its present cells; NaN where it has none)."""
        if self.present is None:
            if self.singletons:
                return self.sums  # x / 1 is x
            return _in_blocks(lambda rows: self.sums[rows] / self.counts[rows, None],
                              self.sums.shape, self.sums)
        with np.errstate(invalid="ignore", divide="ignore"):
            return _in_blocks(lambda rows: np.where(
                self.present[rows] > 0, self.sums[rows] / np.maximum(self.present[rows], 1),
                np.nan), self.sums.shape, self.sums, self.present)

    @cached_property
    def scatter(self) -> np.ndarray:
        """(G,) each group's squared deviations from its mean, over all features: its SSE
        about its mean (0 for a group of one row)."""
        if self.m2 is None:
            return np.zeros(self.n_groups)
        return _in_blocks(lambda rows: self.m2[rows].sum(axis=1), (self.n_groups,), self.m2)

    @cached_property
    def variances(self) -> np.ndarray | None:
        """(G, d) each group's variance per feature about its mean (m2 over its rows);
        None for rows (p_site = 1)."""
        if self.m2 is None:
            return None
        return _in_blocks(lambda rows: self.m2[rows] / self.counts[rows, None], self.m2.shape,
                          self.m2)

    @property
    def has_missing(self) -> bool:
        return self.present is not None and bool((self.present < self.counts[:, None]).any())

    def in_run_space(self, transform: FeatureTransform) -> "SiteGroups":
        """The groups in the run's space: each missing cell filled with the run's pooled
        ``fill`` (a cell the transform does not fill leaves its feature's sums NaN), then
        ``(x - shift) / factor`` per feature. Exact for sums and sums of squares:
        m filled cells of value f add m f to the sum and c m / n (mean_present - f)^2 to
        m2; the affine map takes the sum to (S - n shift) / factor and m2 to
        m2 / factor^2. Computed once per (groups, transform) in this process.

        Raises
        ------
        ValueError
            The transform's width is not the groups'.
        """
        if transform.n_features != self.n_features:
            raise ValueError(f"the scaling transform has {transform.n_features} features, "
                             f"the site's data {self.n_features}")
        key = (id(self), transform.encode())
        hit = _IN_SPACE.get(key)
        if hit is not None and hit[0]() is self:
            _IN_SPACE.move_to_end(key)
            return hit[1]
        view = self._transformed(transform)
        _IN_SPACE[key] = (weakref.ref(self), view)
        while len(_IN_SPACE) > _CACHE_SIZE:
            _IN_SPACE.popitem(last=False)
        return view

    def _transformed(self, transform: FeatureTransform) -> "SiteGroups":
        n = self.counts.astype(np.float64)[:, None]
        sums, m2 = self.sums, self.m2
        if self.present is not None and transform.fill is not None:
            filled = ~np.isnan(transform.fill)
            absent = (self.counts[:, None] - self.present) * filled[None, :]
            fill = np.where(filled, transform.fill, 0.0)[None, :]
            sums = np.where(absent > 0, self.sums + absent * fill, self.sums)
            if m2 is not None:
                present = self.present.astype(np.float64)
                with np.errstate(invalid="ignore", divide="ignore"):
                    gap = np.where(present > 0, self.sums / np.maximum(present, 1.0) - fill, 0.0)
                    m2 = np.where(absent > 0, m2 + present * absent / n * gap * gap, m2)
            left = self.present + absent < self.counts[:, None]  # cells the run leaves missing
            sums = np.where(left, np.nan, sums)
        elif self.present is not None:
            sums = np.where(self.present < self.counts[:, None], np.nan, sums)
        if transform.kind != "none":  # a block at a time: a kept table's pages dropped
            filled_sums, filled_m2 = sums, m2
            sums = _in_blocks(lambda rows: (filled_sums[rows] - n[rows] * transform.shift)
                              / transform.factor, sums.shape, filled_sums)
            if m2 is not None:
                m2 = _in_blocks(lambda rows: filled_m2[rows] / (transform.factor * transform.factor),
                                m2.shape, filled_m2)
        sums = np.ascontiguousarray(sums, dtype=np.float64)
        return replace(self, sums=sums, m2=m2, present=None, spread_rule=None)

    def clipped(self, lo: np.ndarray, hi: np.ndarray) -> "SiteGroups":
        """The groups with their means clipped into the box [lo, hi] (``data-bounds`` of
        a run without DP): each group moves whole, its spread kept, so what a task sends
        stays a function of the group's statistics (clipping its rows one by one would
        let a coordinator choosing the box read single values)."""
        means = np.clip(self.means, lo, hi)
        sums = means if self.singletons else means * self.counts[:, None]
        return replace(self, sums=np.ascontiguousarray(sums), present=None, spread_rule=None)

    def missing_features(self) -> list[int]:
        """The features with a cell the run has not filled (NaN in the sums)."""
        return np.flatnonzero(np.isnan(self.sums).any(axis=0)).tolist()

    def farthest(self, sq_dist: np.ndarray, rows: int) -> np.ndarray:
        """The groups whose means are farthest from their nearest centroid (``sq_dist``:
        their means' squared distances), fewest that hold at least ``rows`` rows: a
        boolean mask (by the means alone: a group's spread decides nothing a reply shows)."""
        order = np.argsort(-np.asarray(sq_dist), kind="stable")
        taken = np.searchsorted(np.cumsum(self.counts[order]), rows) + 1
        mask = np.zeros(self.n_groups, dtype=bool)
        mask[order[:taken]] = True
        return mask


#: Per-group arrays derived from a table are computed this many bytes of it at a time.
BLOCK_BYTES = 1 << 25


def _in_blocks(block_of, shape: tuple, *sources: np.ndarray) -> np.ndarray:
    """An array of ``shape`` (its first axis the groups) filled block by block of
    groups, ``block_of(rows)`` for each slice ``rows`` (element for element what one
    pass gives), dropping the ``sources``' pages after each block where they are a kept
    table mapped from disk (``mapped_pages.release_pages``): a large site's table need
    not be resident beside what is derived from it (bench/scale.py, part 3)."""
    out = np.empty(shape)
    step = max(1, BLOCK_BYTES // (8 * max(1, sources[0][:1].size)))
    for start in range(0, shape[0], step):
        rows = slice(start, start + step)
        out[rows] = block_of(rows)
        for source in sources:
            release_pages(source)
    return out

# In-run-space views kept per process (in-process harness: a few per simulated site).
_CACHE_SIZE = 32
_IN_SPACE: OrderedDict[tuple, tuple[weakref.ref, SiteGroups]] = OrderedDict()

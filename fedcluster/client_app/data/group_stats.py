"""A group table's statistics, from one site's rows: what ``group_table.py`` keeps.

Per group (``grouping.group_rows``' groups): its count, per feature the sum of its
present cells, the squared deviations of those cells from their mean (m2), and its
present cells when a cell of the table is missing (``site_groups.SiteGroups``).

- **Bits.** A group's rows are added one at a time in row order (its k-th row in step k,
  where no two rows share a group): ((x0 + x1) + x2) ..., whatever the chunking, the
  threads, or whether the rows are a memory-mapped file or an array in memory.
- **Memory.** The rows are read in file order only, STATS_ROWS at a time, a memory-mapped
  site's pages dropped after each chunk. The sums and the m2 of a table kept in a file
  are made a window of groups at a time (a pass over the rows per window each) and
  spilled to temporary files, read back in file order; present-cell counts exist only
  once a missing cell is met. The table is written in its canonical order chunk by
  chunk (:class:`Table`), never reordered in memory.
- **Canonical order.** The groups are ordered by a 64-bit hash of their statistics' bits
  (ties by the bits themselves): the table is a function of the groups' statistics
  alone, whatever the file order of their rows, in O(G) memory.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedcluster.common.kernels import compiled_kernels, small_work
from fedcluster.client_app.mapped_pages import release_pages, rows_at
from fedcluster.client_app.site_files import write_pieces
from fedcluster.client_app.release import dominance
from fedcluster.client_app.release.record.instances import mix
from fedcluster.client_app.site_groups import GroupLabels

__all__ = ["DTYPES", "Table", "canonical_order", "group_m2", "group_statistics", "group_sums",
           "joined", "mix", "ordered", "piece", "relabel", "row_places", "spread", "stats_keys",
           "write_column"]

#: Rows per chunk of a pass over the rows: bounds its temporaries to a few
#: STATS_ROWS x d values (8 MB at d = 64).
STATS_ROWS = 1 << 14
#: Groups per chunk of a pass over the groups (hashing, writing).
CHUNK_GROUPS = 1 << 14
#: The sums and the m2 of a table kept in a file are made at most this many bytes of
#: groups at a time (spilled to files): the (G, d) arrays then cost a few windows (the
#: sums', the m2's, two of extremes), not a whole array (226 MB at 1M x 64, g = 2).
M2_WINDOW_BYTES = 1 << 26


# ------------------------------------------------------------------ statistics
def row_places(group_of_row: np.ndarray) -> np.ndarray:
    """Each row's place among its group's rows in row order (0: the group's first row),
    int32; -1 for a row in no group."""
    order = np.argsort(group_of_row, kind="stable")
    sorted_groups = group_of_row[order]
    index = np.arange(order.size, dtype=np.int64)
    first = np.ones(order.size, dtype=bool)
    first[1:] = sorted_groups[1:] != sorted_groups[:-1]
    places = np.empty(order.size, dtype=np.int32)
    places[order] = index - np.maximum.accumulate(np.where(first, index, 0))
    places[group_of_row < 0] = -1
    return places


def _row_order(table: np.ndarray):
    """Where a pass over ``table``'s rows adds each value to its group's slot
    (``add_in_row_order(places, groups, values, into, offset)``: ``into[group - offset]``)
    in its row's place order: place 0 sets the slot, place k adds to it (per group, its
    rows in row order, one pass whatever the groups' sizes): the compiled kernels, or
    NumPy with the same bits where the table is small (``small_work``)."""
    return small_work if table.size <= small_work.ROW_ORDER_MAX_VALUES else compiled_kernels()


def group_sums(X: np.ndarray, group_of_row: np.ndarray, n_groups: int,
               squares: np.ndarray | None = None, hi: int | None = None):
    """Per group: ``(counts, sums, absent, places)``: its rows, per feature the sum of its
    present (non-NaN) cells, per feature its missing cells (None: no cell is missing;
    int16 unless a group is larger), and :func:`row_places` (for :func:`group_m2`).
    ``squares`` (d,), when given, gains the grouped rows' sums of squares per feature
    (the site's spread, which the dominance rule measures rows against); ``hi``: the
    sums of groups 0..hi-1 only (the first window: :func:`window_sums` makes the others).

    One pass over ``X`` in file order; ``absent`` is allocated only when a missing cell
    is met (a table without one keeps no present-cell counts)."""
    n, d = X.shape
    counts = np.bincount(group_of_row[group_of_row >= 0], minlength=n_groups).astype(np.int64)
    places = row_places(group_of_row)
    hi = n_groups if hi is None else hi
    sums = np.zeros((hi, d))  # (each group's first row sets its slot)
    absent = None
    small = np.int16 if counts.size == 0 or counts.max() < np.iinfo(np.int16).max else np.int64
    for r0 in range(0, n, STATS_ROWS):
        groups, at = group_of_row[r0:r0 + STATS_ROWS], places[r0:r0 + STATS_ROWS]
        rows = np.asarray(X[r0:r0 + STATS_ROWS])
        missing = np.isnan(rows)
        if missing.any():
            if absent is None:
                absent = np.zeros((n_groups, d), dtype=small)
            rows = np.where(missing, 0.0, rows)
            _row_order(X).add_in_row_order(at, groups, missing.astype(small), absent, 0)  # (counts)
        if squares is not None:
            inside = rows[groups >= 0]
            squares += (inside * inside).sum(axis=0)
        if hi < n_groups:
            mine = groups < hi
            groups, at, rows = groups[mine], at[mine], rows[mine]
        _row_order(X).add_in_row_order(at, groups, rows, sums, 0)
        release_pages(X)
    return counts, sums, absent, places


def window_sums(X: np.ndarray, group_of_row: np.ndarray, places: np.ndarray, lo: int,
                hi: int) -> np.ndarray:
    """(hi - lo, d): :func:`group_sums`' sums of groups lo..hi-1 (the same bits: each
    group's rows added in row order), one pass over ``X`` in file order."""
    sums = np.zeros((hi - lo, X.shape[1]))
    for r0 in range(0, X.shape[0], STATS_ROWS):
        groups = group_of_row[r0:r0 + STATS_ROWS]
        mine = np.flatnonzero((groups >= lo) & (groups < hi))
        if mine.size:
            rows = np.asarray(X[r0:r0 + STATS_ROWS])[mine]
            _row_order(X).add_in_row_order(places[r0:r0 + STATS_ROWS][mine], groups[mine],
                                           np.where(np.isnan(rows), 0.0, rows), sums, lo)
        release_pages(X)
    return sums


def group_m2(X: np.ndarray, group_of_row: np.ndarray, places: np.ndarray, counts: np.ndarray,
             sums: np.ndarray, absent: np.ndarray | None, lo: int, hi: int,
             extremes: tuple | None = None) -> np.ndarray:
    """(hi - lo, d): per feature, the squared deviations of the present cells of groups
    ``lo..hi-1`` from their group's mean (``sums`` / present cells), summed in row order.
    One pass over ``X`` in file order, which takes the rows of those groups alone (a
    table larger than memory should hold is made a window of groups at a time).
    ``extremes`` ((hi - lo, d), (hi - lo, d)), when given, get each group's largest and
    smallest deviation of a present cell per feature (what the dominance rules judge,
    ``release/dominance.py``)."""
    n, d = X.shape
    m2 = np.zeros((hi - lo, d))
    for r0 in range(0, n, STATS_ROWS):
        groups = group_of_row[r0:r0 + STATS_ROWS]
        mine = np.flatnonzero((groups >= lo) & (groups < hi))
        if mine.size == 0:
            continue
        rows, groups, at = X[r0:r0 + STATS_ROWS][mine], groups[mine], places[r0:r0 + STATS_ROWS][mine]
        if absent is None:
            deviation = rows - sums[groups] / counts[groups, None]
        else:
            present = counts[groups, None] - absent[groups]
            with np.errstate(invalid="ignore", divide="ignore"):
                deviation = rows - np.where(present > 0, sums[groups] / np.maximum(present, 1), 0.0)
            deviation[np.isnan(rows)] = 0.0
        _row_order(X).add_in_row_order(at, groups, deviation * deviation, m2, lo)
        if extremes is not None:  # (np.maximum.at / np.minimum.at, compiled: the same values)
            _row_order(X).group_extremes_at(extremes[0], extremes[1], groups - lo,
                                            np.ascontiguousarray(deviation))
        release_pages(X)
    return m2


def group_statistics(X: np.ndarray, group_of_row: np.ndarray, n_groups: int):
    """Per group: ``(counts, sums, m2, present)`` of ``X``'s rows (``group_of_row``: each
    row's group 0..n_groups-1, -1 for none), over present (non-NaN) cells; ``present``
    None when no cell is missing. In memory, in group order (:func:`group_sums`,
    :func:`group_m2`)."""
    counts, sums, absent, places = group_sums(X, group_of_row, n_groups)
    m2 = group_m2(X, group_of_row, places, counts, sums, absent, 0, n_groups)
    present = None if absent is None else counts[:, None] - absent
    return counts, sums, m2, present


# ------------------------------------------------------------------ canonical order
def _stats_bits(counts, sums, m2, present) -> list[np.ndarray]:
    """The bits of some groups' statistics, one uint64 column per value (count, then per
    feature sums, m2, present)."""
    parts = [counts[:, None], sums, m2] + ([] if present is None else [present])
    return [column for part in parts
            for column in np.ascontiguousarray(np.asarray(part).T).view(np.uint64)]


def stats_keys(counts, sums, m2, present) -> np.ndarray:
    """A 64-bit hash of each group's statistics (the bits of its count, sums, m2 and
    present cells, chained through splitmix64's finaliser)."""
    keys = np.empty(len(counts), dtype=np.uint64)
    for lo in range(0, len(counts), CHUNK_GROUPS):
        key = np.full(min(CHUNK_GROUPS, len(counts) - lo), 0x9E3779B97F4A7C15, dtype=np.uint64)
        hi = lo + key.size
        for column in _stats_bits(counts[lo:hi], sums[lo:hi], m2[lo:hi],
                                  None if present is None else present[lo:hi]):
            key = mix(key ^ column)
        keys[lo:hi] = key
    return keys


def canonical_order(keys: np.ndarray, bits_of) -> np.ndarray:
    """The groups in canonical order (position -> group): by :func:`stats_keys`, groups
    whose keys are equal by their statistics' bits (``bits_of(groups)``: a (len, width)
    uint64 array), equal statistics in group order. The table then depends on the
    groups' statistics alone, not on where their rows sit in the file, so two sites
    whose groups have equal statistics hold equal tables (and send equal replies); and
    the order needs O(G) memory, not the (G, d) means a sort by value would."""
    order = np.argsort(keys, kind="stable")
    sorted_keys = keys[order]
    first = np.ones(order.size, dtype=bool)
    first[1:] = sorted_keys[1:] != sorted_keys[:-1]
    tied = np.flatnonzero(~first)
    if tied.size == 0:
        return order
    run = np.maximum.accumulate(np.where(first, np.arange(order.size), 0))
    unequal = set()  # runs of equal keys whose statistics differ (a hash collision)
    for lo in range(0, tied.size, CHUNK_GROUPS):
        at = tied[lo:lo + CHUNK_GROUPS]
        differ = (bits_of(order[at]) != bits_of(order[run[at]])).any(axis=1)
        unequal.update(run[at[differ]].tolist())
    starts = np.flatnonzero(first)
    for start in sorted(unequal):
        stop = int(starts[np.searchsorted(starts, start, "right")]) \
            if start < starts[-1] else order.size
        groups = order[start:stop]
        order[start:stop] = groups[np.lexsort(bits_of(groups).T[::-1])]
    return order


def relabel(group_of_row: np.ndarray, order: np.ndarray) -> np.ndarray:
    """Each row's group renumbered by its position in ``order`` (-1 stays -1)."""
    if order.size == 0:
        return np.full(group_of_row.shape, -1, dtype=np.int64)
    new_id = np.empty_like(order)
    new_id[order] = np.arange(order.size)
    return np.where(group_of_row >= 0, new_id[np.maximum(group_of_row, 0)], -1)


# ------------------------------------------------------------------ a table in pieces
def piece(array: np.ndarray, order: np.ndarray | None = None) -> tuple:
    """A piece of a table's column: ``array``'s rows (in ``order``), taken lo..hi at a
    time (a memory-mapped array's pages dropped after each)."""
    def take(lo, hi):  # a copy either way, so that a mapping's pages can go at once
        if order is not None:
            return rows_at(array, order[lo:hi])
        rows = np.array(array[lo:hi])
        release_pages(array)
        return rows
    return len(array) if order is None else len(order), take


def spread(counts: tuple, width: int) -> tuple:
    """The present cells of groups that miss none (``counts``: a piece of their counts):
    their count on every feature."""
    rows, take = counts
    return rows, lambda lo, hi: np.repeat(take(lo, hi)[:, None], width, axis=1)


def joined(pieces: list) -> tuple:
    """One piece of these pieces, one after another (rows lo..hi taken from each piece
    they fall in: a chunk at a time, as every piece is)."""
    if len(pieces) == 1:
        return pieces[0]
    starts = np.concatenate([[0], np.cumsum([rows for rows, _ in pieces])]).astype(np.int64)

    def take(lo, hi):
        parts = [pieces[i][1](max(lo, starts[i]) - starts[i], min(hi, starts[i + 1]) - starts[i])
                 for i in range(len(pieces)) if lo < starts[i + 1] and starts[i] < hi]
        return np.concatenate(parts) if parts else pieces[0][1](0, 0)
    return int(starts[-1]), take


@dataclass
class Table:
    """A group table to keep or hold. Each array (counts, sums, m2, present) is a list of
    pieces ``(rows, take)``, ``take(lo, hi)`` giving rows lo..hi of the piece: it is
    written in its final order chunk by chunk, never reordered or joined in memory."""

    columns: dict
    width: int
    labels: GroupLabels | None
    waiting: int
    spreads: object = None  # group_spreads.Spreads of the new groups (None: own m2 kept)

    def held(self) -> list:
        """The arrays, in memory (counts, sums, m2, present; present may be None)."""
        return [None if pieces is None else
                np.concatenate([take(0, rows) for rows, take in pieces]).astype(DTYPES[name], copy=False)
                for name, pieces in self.columns.items()]


#: The dtype of each column of a table.
DTYPES = {"counts": np.int64, "sums": np.float64, "m2": np.float64, "present": np.int64}


def ordered(X: np.ndarray, group_of_row: np.ndarray, n_groups: int, scratch: Path | None,
            min_size: int = 1, prior: tuple | None = None, units: np.ndarray | None = None,
            base: tuple | None = None, judged: np.ndarray | None = None,
            forced: tuple[np.ndarray, np.ndarray] | None = None):
    """The statistics of groups 0..n_groups-1 as a table's columns, in canonical order,
    the order, and the spread rule's record (:class:`group_spreads.Spreads`; None at
    ``min_size`` 1, which keeps every group's own m2). With ``scratch`` (a directory) a
    large table's sums and squared deviations are made a window of groups at a time and
    spilled to temporary files there. At ``min_size`` >= 2 the m2 column is what the site
    may release (``release/spreads.py``): its units' shared m2, the dominance rule's
    withheld spreads at the site's pooled one (``prior``: (m2 sum, degrees of freedom)
    per feature of groups already kept, pooled too; ``units``: the groups' spread units
    as the versions audit judged them, a label per group number, else the rule pairs
    them; ``base``: the (cells, sums, squares) per feature of a version's kept groups;
    ``judged``: the features the rule on means judges, None all). The p% rule on means
    replaces its flagged groups' sums (``group_means.stand_in_means``) and withholds
    their units' spreads; ``forced``: (groups, features) holding a cell the rule withheld
    before (``release/audit.protected_features``), stood in alike."""
    from fedcluster.client_app.data import group_means, group_spreads

    width = X.shape[1]
    squares = np.zeros(width)
    window = max(1, n_groups if scratch is None else M2_WINDOW_BYTES // (8 * width))
    # A large table's sums are made a window at a time too, spilled (a d = 1 column's
    # total is summed pairwise by NumPy, not row after row: held whole, as it is small)
    spilled = n_groups > window and width > 1
    totals = put = None
    with contextlib.ExitStack() as stack:
        counts, sums, absent, places = group_sums(X, group_of_row, n_groups, squares,
                                                  min(window, n_groups) if spilled else None)
        if spilled:
            sums, totals, put = _spilled_sums(stack, scratch, X, group_of_row, places, sums,
                                              n_groups, window)

        def present(ids):
            return None if absent is None else counts[ids, None] - absent[ids]

        moments = group_spreads.site_moments(counts, sums, absent, squares, base, totals) \
            if min_size >= 2 else None
        sd = None if moments is None else moments[1]
        candidates, flagged = [], []
        keys = np.empty(n_groups, dtype=np.uint64)
        spill = stack.enter_context(tempfile.TemporaryFile(dir=scratch)) \
            if n_groups > window else None
        m2 = np.zeros((0, width))
        for lo in range(0, n_groups, window):
            hi = min(n_groups, lo + window)
            m2 = None  # the last window goes before the next is made
            extremes = None if sd is None else (np.zeros((hi - lo, width)), np.zeros((hi - lo, width)))
            m2 = group_m2(X, group_of_row, places, counts, sums, absent, lo, hi, extremes)
            keys[lo:hi] = stats_keys(counts[lo:hi], sums[lo:hi], m2, present(slice(lo, hi)))
            if extremes is not None:
                if min_size >= dominance.MEANS_FROM_P:
                    flagged.append(group_means.dominant_means(counts, sums, absent, extremes,
                                                              lo, moments, judged))
                candidates.append(dominance.stand_out_cells(extremes, sd, lo))
            if spill is not None:
                write_pieces(spill, m2)
            release_pages(sums)
        del places
        if spill is not None:
            spill.flush()
            m2 = np.memmap(spill, dtype=np.float64, mode="r", shape=(n_groups, width))
        means_flagged = None
        if forced is not None and np.size(forced[0]):  # (a pair the rule flags itself stays its)
            own = {pair for groups, features in flagged
                   for pair in zip(groups.tolist(), features.tolist())}
            pairs = [pair for pair in zip(np.asarray(forced[0]).tolist(),
                                          np.asarray(forced[1]).tolist()) if pair not in own]
            forced = (np.array([g for g, _ in pairs], dtype=np.int64),
                      np.array([f for _, f in pairs], dtype=np.int64))
            flagged.append(forced)
        if flagged:
            means_flagged = tuple(np.concatenate(part) for part in zip(*flagged))
            group_means.stand_in_means(counts, sums, absent, means_flagged, totals, put)
            release_pages(sums)
            changed = np.unique(means_flagged[0])  # keyed again, by the sums the table gives
            if changed.size:
                keys[changed] = stats_keys(counts[changed], rows_at(sums, changed),
                                           rows_at(m2, changed), present(changed))

    def bits_of(ids):
        return np.stack(_stats_bits(counts[ids], rows_at(sums, ids), rows_at(m2, ids),
                                    present(ids)), axis=1)

    order = canonical_order(keys, bits_of)
    spreads = None
    m2_piece = piece(m2, order)
    if sd is not None:
        spreads = group_spreads.Spreads.of(order, counts, sums, absent, m2, moments, candidates,
                                           min_size, prior, units, means_flagged, forced)
        m2_piece = (n_groups, spreads.take)
    columns = {"counts": [piece(counts, order)], "sums": [piece(sums, order)],
               "m2": [m2_piece], "present": None}
    if absent is not None:
        columns["present"] = [(n_groups, lambda lo, hi: present(order[lo:hi]))]
    return columns, order, spreads


def _spilled_sums(stack, scratch, X, group_of_row, places, first, n_groups: int, window: int):
    """Every group's sums, a window at a time (``first``: the first window's), in a
    temporary file in ``scratch``: (the file mapped read-only, the total per feature,
    ``put(groups, features, values)`` writing sums in the file). The total is NumPy's
    ``sums.sum(axis=0)`` to the bit: over a (G, d > 1) array it adds row after row, so
    the total so far added to a window's first row carries it (tests/test_site_groups.py)."""
    out, totals, width = stack.enter_context(tempfile.TemporaryFile(dir=scratch)), 0.0, X.shape[1]
    for lo in range(0, n_groups, window):
        part = first if lo == 0 else window_sums(X, group_of_row, places, lo, min(n_groups, lo + window))
        write_pieces(out, part)
        if lo:  # (not 0.0 + the first: -0.0 would become 0.0)
            part[0] += totals
        totals = part.sum(axis=0)
    out.flush()

    def put(groups, features, values):
        for g, f, v in zip(groups.tolist(), features.tolist(), np.asarray(values).tolist()):
            os.pwrite(out.fileno(), np.float64(v).tobytes(), 8 * (g * width + f))
    return np.memmap(out, dtype=np.float64, mode="r", shape=(n_groups, width)), totals, put


def kept_again(X: np.ndarray, kept_of_row: np.ndarray, n_kept: int, min_size: int,
               judged: np.ndarray | None = None) -> dict:
    """The kept groups' columns recomputed from their rows, in their order (their base
    table's entry is gone), the spread rule applied among themselves."""
    from fedcluster.client_app.data import group_means, group_spreads

    squares = np.zeros(X.shape[1])
    counts, sums, absent, places = group_sums(X, kept_of_row, n_kept, squares)
    extremes = (np.zeros((n_kept, X.shape[1])), np.zeros((n_kept, X.shape[1])))
    m2 = group_m2(X, kept_of_row, places, counts, sums, absent, 0, n_kept, extremes)
    moments = group_spreads.site_moments(counts, sums, absent, squares)
    flagged = None
    if min_size >= dominance.MEANS_FROM_P:
        flagged = group_means.dominant_means(counts, sums, absent, extremes, 0, moments,
                                               judged)
        group_means.stand_in_means(counts, sums, absent, flagged)
    record = group_spreads.Spreads.of(np.arange(n_kept), counts, sums, absent, m2, moments,
                                      [dominance.stand_out_cells(extremes, moments[1], 0)], min_size,
                                      means_flagged=flagged)
    present = None if absent is None else counts[:, None] - absent
    return {"counts": [piece(counts)], "sums": [piece(sums)], "m2": [(n_kept, record.take)],
            "present": None if present is None else [piece(present)]}


def write_column(out, name: str, pieces: list, width: int, digest) -> None:
    """Column ``name`` of a table as a .npy written to ``out``, its pieces' rows chunk by
    chunk (each chunk also into ``digest``: the table's digest without a copy of it)."""
    dtype, width, rows = DTYPES[name], None if name == "counts" else width, sum(n for n, _ in pieces)
    np.lib.format.write_array_header_1_0(out, {
        "descr": np.lib.format.dtype_to_descr(np.dtype(dtype)), "fortran_order": False,
        "shape": (rows,) if width is None else (rows, width)})
    for n, take in pieces:
        for lo in range(0, n, CHUNK_GROUPS):
            block = np.ascontiguousarray(take(lo, min(n, lo + CHUNK_GROUPS)), dtype=dtype)
            out.write(block)
            digest.update(block)

"""Pages of a read-only memory-mapped array (a deployed site's cached rows, or a group
table): dropped from the process once a pass is done with them, so that a large site's
rows need not all be resident at once (bench/scale.py measures the peak memory)."""

from __future__ import annotations

import mmap

import numpy as np


def read_only_mapping(X: np.ndarray) -> mmap.mmap | None:
    """The mmap behind ``X`` if ``X`` is (a view of) a read-only ``np.memmap``, else None."""
    while isinstance(X, np.ndarray):
        if isinstance(X, np.memmap) and X.mode == "r" and X._mmap is not None:
            return X._mmap
        X = X.base
    return None


def release_pages(X: np.ndarray) -> None:
    """Drop the pages of a read-only memory-mapped ``X`` from this process's resident set.

    They stay in the OS page cache (getting them back costs no disk read), and the next
    access maps them again. Anything else (in memory, or a writable mapping) is left alone.
    A site's rows then need not all be resident at once when a pass over them is
    followed by other work (bench/scale.py measures the peak memory of a 512 MB site).
    """
    mapping = read_only_mapping(X)
    if mapping is not None and hasattr(mmap, "MADV_DONTNEED"):
        mapping.madvise(mmap.MADV_DONTNEED)


def rows_in_spans(X: np.ndarray, rows: np.ndarray, span: int) -> np.ndarray:
    """``X[rows]`` (``rows`` ascending), read a span of at most ``span`` rows of the file
    at a time, a memory-mapped array's pages dropped after each: a few rows scattered over
    a large file would otherwise map all of it (the kernel reads ahead around every page
    it faults in)."""
    out = np.empty((len(rows), X.shape[1]), dtype=X.dtype)
    at = 0
    while at < len(rows):
        stop = max(at + 1, int(np.searchsorted(rows, rows[at] + span)))
        out[at:stop] = X[rows[at:stop]]
        release_pages(X)
        at = stop
    return out

"""Pages of a read-only memory-mapped array (a deployed site's cached rows, or a group
table): dropped from the process once a pass is done with them, so that a large site's
rows need not all be resident at once (bench/scale.py measures the peak memory)."""

from __future__ import annotations

import contextlib
import importlib
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
    out = np.empty((len(rows),) + X.shape[1:], dtype=X.dtype)
    at = 0
    while at < len(rows):
        stop = max(at + 1, int(np.searchsorted(rows, rows[at] + span)))
        out[at:stop] = X[rows[at:stop]]
        release_pages(X)
        at = stop
    return out


def rows_at(X: np.ndarray, ids: np.ndarray, span: int = 1 << 13) -> np.ndarray:
    """``X[ids]`` (a new array) for ``ids`` in any order. A read-only memory-mapped ``X``
    is read in ascending order, a span of at most ``span`` rows at a time, its pages
    dropped after each (:func:`rows_in_spans`): a chunk of groups in a table's canonical
    order lies all over its file, and gathering it at once mapped all of the file (at 1M
    rows, p 2: +226 MB for every chunk of the spread rule's passes, bench/grouping.py)."""
    ids = np.asarray(ids)
    if read_only_mapping(X) is None or ids.size == 0:
        return np.array(X[ids])
    order = np.argsort(ids, kind="stable")
    out = np.empty((ids.size,) + X.shape[1:], dtype=X.dtype)
    out[order] = rows_in_spans(X, ids[order], span)
    return out


def _huge_page_advice():
    """NumPy's switch of its transparent-huge-page advice (None: this NumPy has none)."""
    for name in ("numpy._core.multiarray", "numpy.core.multiarray"):
        with contextlib.suppress(ImportError):
            return getattr(importlib.import_module(name), "_set_madvise_hugepage", None)
    return None


@contextlib.contextmanager
def small_pages():
    """Within: NumPy allocates its large arrays without advising the kernel to back them
    with transparent huge pages (its default on Linux), restored after. A table's build
    makes and drops many large temporaries a pass at a time; where the kernel honours the
    advice (``transparent_hugepage/enabled`` = madvise, as here and on most distributions)
    version 0 of 1,000,000 x 64 took 27-32 s with it and 22-27 s without, at the same peak
    (bench/large_site.py; measured, not traced to one kernel path)."""
    advise = _huge_page_advice()
    if advise is None:
        yield
        return
    before = advise(False)
    try:
        yield
    finally:
        advise(before)

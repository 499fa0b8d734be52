"""The files a deployed site keeps about itself across runs (its group tables, the
privacy budget, the disclosure ledger): where they live, and how they are written so
that two messages never interleave and a crash never leaves half a file, and in pieces
(:func:`write_pieces`).

Flower starts a fresh ClientApp process per message, and a SuperNode can run several
runs at once: every read-modify-write holds an exclusive ``flock`` on a lock file beside
the target, and a rewritten file replaces the old one atomically (``os.replace`` of a
fsynced temporary), so a reader sees the old file or the new one, never a mix.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO


#: The most one ``write`` call hands the kernel. Linux 6.x gives a large buffered write to a
#: file page-cache folios as large as 2 MB (ext4's large folios), for which memory that
#: has become fragmented must first be compacted: on the benchmark machine a 64 MB array
#: written whole took 0.5-0.7 s, in 1 MB pieces 0.015 s (BENCHMARKS.md, a large site).
WRITE_PIECE = 1 << 20


def write_pieces(out: BinaryIO, data) -> None:
    """Write ``data`` (bytes, or a C-contiguous array) to ``out`` in pieces of at most
    :data:`WRITE_PIECE` bytes."""
    view = memoryview(data)
    if view.nbytes == 0:
        return
    if view.ndim != 1 or view.format != "B":
        view = view.cast("B")
    for at in range(0, view.nbytes, WRITE_PIECE):
        out.write(view[at:at + WRITE_PIECE])


class InPieces:
    """``out`` whose every write goes in :func:`write_pieces`' pieces (``np.save``
    through it writes an array 16 MB at a time, each in pieces, not whole)."""

    def __init__(self, out: BinaryIO):
        self.out = out

    def write(self, data) -> int:
        write_pieces(self.out, data)
        return memoryview(data).nbytes


#: The locks this thread holds (a lock taken again by its holder is held already: a
#: second ``flock`` on another descriptor of the same file would wait for itself).
_HELD = threading.local()


@contextlib.contextmanager
def locked(directory: str | os.PathLike, name: str) -> Iterator[Path]:
    """Hold the lock of ``directory/name`` (made if missing) and yield that path; a thread
    that holds it already holds it on.

    Raises
    ------
    OSError
        The directory cannot be made or the lock file cannot be opened.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / name
    held = _HELD.__dict__.setdefault("paths", set())
    key = os.path.realpath(target)
    if key in held:
        yield target
        return
    with open(target.with_name(target.name + ".lock"), "a+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        held.add(key)
        try:
            yield target
        finally:
            held.discard(key)
            fcntl.flock(lock, fcntl.LOCK_UN)


def replace_atomically(target: Path, write: Callable[[BinaryIO], None]) -> None:
    """Write ``target`` anew through ``write(file)``: a fsynced temporary beside it, then
    ``os.replace`` (call it with the target's lock held)."""
    partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
    with open(partial, "wb") as out:
        write(InPieces(out))
        out.flush()
        os.fsync(out.fileno())
    os.replace(partial, target)


def append_line(target: Path, line: str) -> None:
    """Append one line and fsync it (call it with the target's lock held)."""
    with open(target, "a", encoding="utf-8") as out:
        out.write(line.rstrip("\n") + "\n")
        out.flush()
        os.fsync(out.fileno())

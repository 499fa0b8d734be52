"""Fill the session's Numba cache before the real-Flower tests start their processes.

Run by :func:`flower_processes.warm_numba_cache` (from conftest's ``numba_cache``
fixture, once per session and xdist worker) as a subprocess, with the environment the
Flower processes get (:func:`flower_processes.child_env`: ``NUMBA_CACHE_DIR`` the
session's cache, ``FLWR_HOME`` the worker's Flower home)::

    python tests/warm_kernels.py APP_DIR [--installed]

Why: Flower starts a fresh ClientApp process for every message, and that process
imports fedcluster from ``FLWR_HOME/apps/<publisher>.<name>.<version>.<FAB hash>/``
(the FAB installed there, first on ``sys.path``). Numba keys a cache entry on the
kernel's source file and the argument types (fedcluster's kernels name their cache folder
by the file's content, ``_compiled.SourceKeyedCacheLocator``, so the FAB's copy and the
installed package share entries), so on an empty cache (a fresh CI clone) the first
ClientApp that calls a kernel compiles it, at every site at once: minutes on 2 busy
cores, and a round can miss its timeout.

What:

1. The FAB of ``APP_DIR`` is built as ``flwr run`` builds it (``build_fab_from_disk``:
   the same bytes, hence the same hash) and installed into ``FLWR_HOME`` as the
   SuperLink and the SuperNodes install it (``install_from_fab``, which leaves an
   installed FAB alone), so their processes later import these very files.
2. A child process, with that directory first on ``sys.path`` as a ClientApp has it,
   calls every public kernel with the argument types the site tasks give it
   (:func:`warm`), once with one block of rows (the serial twins) and once with several
   (the parallel kernels); the cache then holds every entry a ClientApp looks up.
3. ``--installed``: the same for the fedcluster installed in the environment, which an
   app that does not ship fedcluster imports (tests/test_faults.py's corrupting
   ClientApp). That directory is the same for every xdist worker: a worker that finds
   another one warming it (a lock) goes on at once rather than compile it twice.

Prints one JSON line per directory: the kernels' source file, and how many
specialisations were compiled and how many loaded from the cache.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import subprocess
import sys
import time
from pathlib import Path


def install_app(app_dir: Path) -> Path:
    """Build ``app_dir``'s FAB as ``flwr run`` does and install it into ``FLWR_HOME`` as
    a SuperNode does; return the directory a ClientApp imports the app from."""
    from flwr.cli.build import build_fab_from_disk
    from flwr.cli.install import install_from_fab

    fab = build_fab_from_disk(app_dir)
    with contextlib.redirect_stdout(sys.stderr):  # Flower's "Successfully installed ..."
        return install_from_fab(fab, skip_prompt=True)


def warm(kernels) -> None:
    """Call every public kernel of ``kernels`` with the argument types of the site tasks
    (fedcluster/client_app/tasks.py, private_tasks.py, local_kmeans.py):

    - ``X`` is a site's data: float64, C-contiguous and READ-ONLY (the loader converts
      every table to float64 and freezes it; a cached site is a read-only memmap;
      scaling returns a frozen copy). float32 never reaches a Flower process, so its
      specialisations are not compiled here (they would only cost time).
    - centroids, means and ``W`` as the server sent them or a site computed them:
      float64, writable; k-means++ candidates are rows of ``X``, hence read-only;
      ``current``, ``order``, ``gamma``, GTV's neighbours ``N`` writable.

    These are the types the Numba cache held after tests/test_flower_algorithms.py ran
    every algorithm over gRPC on an empty cache (one entry per kernel, no other); a
    type that differs (say a read-only ``C``) is merely compiled by its first caller.
    """
    import numpy as np

    rng = np.random.default_rng(0)
    k, d = 4, 3
    # one block (<= SERIAL_MAX_ROWS rows: the serial twins) and several (parallel)
    for n in (300, 2 * kernels.SERIAL_MAX_ROWS + 3):
        X = rng.standard_normal((n, d))
        X.setflags(write=False)
        C = np.ascontiguousarray(X[:k] + 0.5)
        kernels.assign(X, C)
        kernels.lloyd_stats(X, C)
        kernels.min_sq_dist_update(X, X[1], np.full(n, np.inf))
        kernels.evaluation_stats(X, C)
        kernels.distance_to_means(X, C, C.copy())
        kernels.fcm_stats(X, C, 2.0)
        kernels.fcm_memberships(X, C, 2.0)
        kernels.minibatch_epoch(X, rng.permutation(n), 64, C.copy(), 0.5)
        kernels.gtv_update(X, C, np.stack([C, C + 1.0]), 1.0, 2)


def warm_here(directory: str | None) -> dict:
    """In this process: import fedcluster from ``directory`` (first on ``sys.path``, as
    Flower's ``load_app`` puts the app; None: the installed one), warm its kernels, and
    count what was compiled and what was loaded."""
    if directory is not None:
        sys.path.insert(0, directory)
    from fedcluster.common import kernels
    from fedcluster.common.kernels import _compiled

    source = Path(_compiled.__file__).resolve()
    if directory is not None and not source.is_relative_to(Path(directory).resolve()):
        raise RuntimeError(f"fedcluster imported from {source}, not from {directory}")
    started = time.perf_counter()
    warm(kernels)
    seconds = time.perf_counter() - started
    dispatchers = {id(v): v for v in vars(_compiled).values() if hasattr(v, "stats")}
    dispatchers.update({id(v): v for v in _compiled._SERIAL.values()})
    compiled = sum(sum(v.stats.cache_misses.values()) for v in dispatchers.values())
    loaded = sum(sum(v.stats.cache_hits.values()) for v in dispatchers.values())
    return {"source": str(source), "compiled": compiled, "loaded": loaded,
            "seconds": round(seconds, 1)}


@contextlib.contextmanager
def lock_or_none(path: Path):
    """Hold an exclusive lock on ``path``: yields True, or False (at once) if another
    process holds it."""
    with open(path, "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def warm_in_child(directory: Path | None) -> None:
    """:func:`warm_here` in a fresh interpreter (each fedcluster is its own import)."""
    argv = [sys.executable, __file__, "--child", "" if directory is None else str(directory)]
    done = subprocess.run(argv, stdout=subprocess.PIPE, text=True, check=False)
    sys.stdout.write(done.stdout)
    if done.returncode != 0:
        raise SystemExit(f"warming the kernels of {directory or 'the installed fedcluster'} "
                         f"failed (exit {done.returncode})")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("app_dir", nargs="?", type=Path,
                        help="the app that `flwr run` will submit (the repository)")
    parser.add_argument("--installed", action="store_true",
                        help="also warm the fedcluster installed in the environment")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:  # the worker: one directory, in this process
        print(json.dumps(warm_here(args.child or None)), flush=True)
        return
    for var in ("NUMBA_CACHE_DIR", "FLWR_HOME"):
        if not os.environ.get(var):
            parser.error(f"{var} must be set (the session's Numba cache / Flower home)")
    if args.app_dir is not None:
        warm_in_child(install_app(args.app_dir.resolve()))
    if args.installed:
        cache = Path(os.environ["NUMBA_CACHE_DIR"])
        cache.mkdir(parents=True, exist_ok=True)
        with lock_or_none(cache / ".warm-installed.lock") as mine:
            if mine:
                warm_in_child(None)
            else:
                print(json.dumps({"source": "installed fedcluster", "skipped":
                                  "another xdist worker is warming it"}), flush=True)


if __name__ == "__main__":
    main()

"""Microaggregation (``fedcluster.client_app.grouping.group_rows``): time and peak memory
on one large memory-mapped site, and the quality of k-means on the group means.

1. **Time and memory** (default): a 1,000,000 x 64 float64 site (50 Gaussian blobs of
   random sizes and spreads + 2 % uniform noise, seed 0) written to a ``.npy`` in a
   temporary folder and opened read-only memory-mapped, as a deployed site's cache is.
   ``group_rows`` runs in a fresh child process (``NUMBA_NUM_THREADS=2``) whose peak RSS
   (``ru_maxrss``, and VmHWM as a check) then covers the interpreter, numpy, Numba with
   the grouping kernels loaded from the on-disk cache (an untimed child on a small file
   fills it first; the child's own warm-up call on a 40,000-row file loads every kernel)
   and the grouping alone.  The files are written by other processes: Linux starts a
   child's ``ru_maxrss`` at its parent's high-water mark, so the parent stays small.
   Printed: seconds, the child's baseline (after its imports and the warm-up, before the
   data is opened) and peak RSS, over the data's size.  Targets: at most 60 s and at most
   1.5 x the data.
2. **Quality** (``--quality``): for g = 2 and 3, the 13 SIPU sets and scikit-learn's iris,
   wine, breast cancer and digits, z-scored, each split IID over 5 sites (seed 0, as
   ``bench/quality.py``); each site's rows are grouped alone; scikit-learn's
   ``KMeans(k, n_init=10, random_state=0)`` is fitted on the pooled group means weighted
   by their counts and its inertia on the pooled rows is divided by that of the same
   KMeans fitted on the pooled rows (k = the set's number of labels).  Printed per set,
   then median, 90th percentile and worst per g.  ``--seeds S`` takes the best of
   ``random_state`` 0..S-1 on both sides, which separates the grouping's cost from
   KMeans landing in another local optimum on either side (on a set with many clusters
   one seed's ratio can move by several percent: seen once at 1.10 on d31).

Usage::

    python bench/grouping.py [--rows 1000000] [--dim 64] [--min-size 2]
    python bench/grouping.py --quality [--seeds 1] [--sets a1 iris ...]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent

CHILD = """
import json, resource, sys, time
import numpy as np
from fedcluster.client_app.grouping import group_rows

path, warm, g = sys.argv[1], sys.argv[2], int(sys.argv[3])
group_rows(np.load(warm, mmap_mode="r"), g)  # kernels from the disk cache
baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
X = np.load(path, mmap_mode="r")
t0 = time.perf_counter()
labels = group_rows(X, g)
seconds = time.perf_counter() - t0
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
with open("/proc/self/status") as status:  # the same high-water mark, from the kernel's mm
    hwm = [int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM")][0]
counts = np.bincount(labels)
print(json.dumps({"seconds": seconds, "baseline": baseline, "peak": peak, "hwm": hwm,
                  "groups": int(len(counts)), "smallest": int(counts.min()),
                  "largest": int(counts.max())}))
"""


def write_site(path: Path, n: int, d: int, seed: int = 0, blobs: int = 50) -> None:
    """``n x d`` float64 rows into the ``.npy`` at ``path``, written in chunks (the bench
    process never holds the whole site): blobs of Dirichlet-random sizes and random
    spreads, rows in random order, 2 % of them uniform noise over the blobs' box."""
    rng = np.random.default_rng(seed)
    centres = rng.uniform(-10, 10, (blobs, d))
    spreads = rng.uniform(0.5, 2.0, blobs)
    weights = rng.dirichlet(np.full(blobs, 1.0))
    out = np.lib.format.open_memmap(path, mode="w+", dtype=np.float64, shape=(n, d))
    chunk = 1 << 16
    for start in range(0, n, chunk):
        m = min(chunk, n - start)
        which = rng.choice(blobs, size=m, p=weights)
        rows = centres[which] + spreads[which, None] * rng.standard_normal((m, d))
        noise = rng.random(m) < 0.02
        rows[noise] = rng.uniform(-12, 12, (int(noise.sum()), d))
        out[start:start + m] = rows
    out.flush()
    del out


def run_child(*args, code: str | None = CHILD) -> dict | None:
    """``python -c code args`` (``code`` None: this script with ``args``) in a fresh
    process, NUMBA_NUM_THREADS=2; its last output line as JSON."""
    env = dict(os.environ, NUMBA_NUM_THREADS="2")
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    command = [sys.executable, "-c", code] if code else [sys.executable, __file__]
    done = subprocess.run(command + [str(a) for a in args], env=env,
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"child failed:\n{done.stderr}")
    lines = done.stdout.strip().splitlines()
    return json.loads(lines[-1]) if lines else None


def time_and_memory(n: int, d: int, g: int) -> None:
    with tempfile.TemporaryDirectory(prefix="fedcluster-grouping-") as tmp:
        path, warm = Path(tmp) / "site.npy", Path(tmp) / "warm.npy"
        t0 = time.perf_counter()
        # Written by other processes: Linux starts a child's ru_maxrss at its parent's
        # high-water mark (kept across fork and exec), so this process must stay small.
        run_child("--write", path, n, d, 0, code=None)
        # past the serial twins and one coarse split, so that every kernel is loaded
        run_child("--write", warm, 40_000, d, 1, code=None)
        print(f"wrote {n:,} x {d} float64 ({path.stat().st_size / 2**20:.0f} MB) in "
              f"{time.perf_counter() - t0:.1f} s")
        # fill Numba's on-disk cache (compiling costs time and memory that a site pays
        # once per app version, not per grouping)
        run_child(warm, warm, g)
        r = run_child(path, warm, g)
        data = path.stat().st_size
        print(f"group_rows(min_size={g}), NUMBA_NUM_THREADS=2: {r['seconds']:.1f} s; "
              f"{r['groups']:,} groups of {r['smallest']}..{r['largest']} rows")
        print(f"child baseline {r['baseline'] / 2**20:.0f} MB, peak RSS "
              f"{r['peak'] / 2**20:.0f} MB (VmHWM {r['hwm'] / 2**20:.0f} MB) = "
              f"{r['peak'] / data:.2f} x the data "
              f"({data / 2**20:.0f} MB); (peak - baseline) / data = "
              f"{(r['peak'] - r['baseline']) / data:.2f}")


def quality(sets: list[str], sizes: tuple[int, ...], seeds: int = 1) -> None:
    import warnings

    from sklearn.cluster import KMeans

    sys.path.insert(0, str(BENCH))
    from quality import load, split_sites  # noqa: E402  (bench/quality.py)

    from fedcluster.client_app.grouping import group_rows

    warnings.filterwarnings("ignore")
    data = ROOT.parent / "shared" / "data"
    ratios = {g: [] for g in sizes}
    print(f"{'set':12s} {'n':>6s} {'k':>3s} " + " ".join(f"{'g=' + str(g):>8s}" for g in sizes)
          + "   (pooled KMeans on group means / KMeans on rows, inertia on the rows)")
    for name in sets:
        X, y = load(name, data)
        k = len(np.unique(y))
        sites = split_sites(X, y, "iid")
        rows = np.concatenate(sites)
        central = min(KMeans(k, n_init=10, random_state=seed).fit(rows).inertia_
                      for seed in range(seeds))
        line = f"{name:12s} {len(rows):6d} {k:3d} "
        for g in sizes:
            means, counts = [], []
            for site in sites:
                labels = group_rows(np.ascontiguousarray(site), g)
                c = np.bincount(labels)
                s = np.zeros((len(c), site.shape[1]))
                np.add.at(s, labels, site)
                means.append(s / c[:, None])
                counts.append(c)
            M, W = np.concatenate(means), np.concatenate(counts)
            ratio = min(-KMeans(k, n_init=10, random_state=seed).fit(M, sample_weight=W)
                        .score(rows) for seed in range(seeds)) / central
            ratios[g].append(ratio)
            line += f"{ratio:8.4f} "
        print(line, flush=True)
    for g in sizes:
        r = np.array(ratios[g])
        print(f"g = {g}: median {np.median(r):.4f}, 90th percentile {np.percentile(r, 90):.4f}, "
              f"worst {r.max():.4f} ({sets[int(r.argmax())]}), over {len(r)} sets")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--min-size", type=int, default=2)
    parser.add_argument("--quality", action="store_true")
    parser.add_argument("--seeds", type=int, default=1,
                        help="--quality: best of KMeans random_state 0..SEEDS-1 on both sides "
                             "(1, the default: random_state 0 only)")
    parser.add_argument("--write", nargs=4, metavar=("PATH", "ROWS", "DIM", "SEED"),
                        help=argparse.SUPPRESS)  # internal: the bench's data writer
    parser.add_argument("--sets", nargs="+", default=[
        "a1", "s1", "s2", "s3", "s4", "unbalance", "d31", "r15", "aggregation", "compound",
        "flame", "jain", "pathbased", "iris", "wine", "cancer", "digits"])
    args = parser.parse_args()
    if args.write:
        path, rows, dim, seed = args.write
        write_site(Path(path), int(rows), int(dim), int(seed))
    elif args.quality:
        quality(args.sets, (2, 3), args.seeds)
    else:
        time_and_memory(args.rows, args.dim, args.min_size)


if __name__ == "__main__":
    main()

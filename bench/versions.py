"""Versions of a site's data (the no-back-door issue): what the versions rule costs.

A deployed site's file changes; each version's group table keeps the last version's
groups whose rows are all there, withdraws a group that lost or changed a row, groups the
waiting rows, and runs the span audit (``client_app/data/versions/``). Two parts:

1. **History** (``--parts history``): a 2,000-row table (3 features, 5 Gaussian blobs,
   seed ``--seed``), then 50 versions, each one of three changes drawn at random: 1-5
   rows deleted, 1-5 cells corrected (a cell of a random row moved by N(0, 1)), or 5-30
   rows appended (from the same blobs); with and without an id column, at p_site 2 and
   5 (``--p``). Per version: rows kept (in a kept group), groups withdrawn, rows of
   withdrawn groups, rows waiting (in no group), rows the audit held back, seconds.
   Printed per version; the table in BENCHMARKS.md gives, per setting, the mean and the
   largest waiting and held back over the 50 versions and the seconds of a version.
2. **Scale** (``--parts scale``): one site of ``--rows`` x ``--dim`` float64 rows (a
   ``.npy`` the site memory-maps; ``--data``: ``bench/grouping.py``'s blobs, and/or its
   ``whole`` data, with whole-number columns and ties), then ``--versions``
   versions, each touching ``--change`` of the rows: half of them corrected (one cell
   each), a quarter deleted, a quarter appended (new rows from the same blobs). Each
   version is built in a fresh child process (NUMBA_NUM_THREADS=2), as a site's first
   message after the file changed builds it: ``load_site_file`` + ``site_groups``.
   Measured per version: the whole build's seconds; the audit's seconds
   (``release/audit.judge``, the one audit) and its own peak memory (tracemalloc: what the audit allocates,
   numpy's arrays included), over the data's size; the child's peak RSS over the data;
   rows waiting and held back. Targets (issue): the audit under 10 s and under 0.5 x the
   data per version on 2 cores.

``--out BENCHMARKS.md`` writes the parts run as the section ``versions``.

Usage::

    python bench/versions.py --parts history scale --out BENCHMARKS.md
    python bench/versions.py --parts scale --rows 200000 --versions 5
    python bench/versions.py --parts scale --data blobs whole --out BENCHMARKS.md
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))
from grouping import MB, PEAK, run_child  # noqa: E402  (bench/grouping.py)
from report import header, write_section  # noqa: E402

# ------------------------------------------------------------------ the history
def history(seed: int, with_id: bool, p: int, versions: int = 50, rows: int = 2000) -> list[dict]:
    """Build a random history of ``versions`` versions of a table (module docstring), as
    a deployed site does; each version's record in the site's store."""
    from fedcluster.client_app.data import group_table
    from fedcluster.client_app.data.site_data import load_site_file
    from fedcluster.client_app.data.versions import Store

    rng = np.random.default_rng(seed)
    centres = rng.normal(scale=5.0, size=(5, 3))

    def fresh(m):
        return centres[rng.integers(5, size=m)] + rng.normal(size=(m, 3))

    X, ids, next_id = fresh(rows), np.arange(rows), rows
    seconds = []
    with tempfile.TemporaryDirectory(prefix="fedcluster-versions-") as tmp:
        path, cache = Path(tmp) / "site.csv", Path(tmp) / "cache"
        for version in range(versions + 1):
            if version:
                change = rng.integers(3)
                if change == 0:
                    gone = rng.choice(len(X), rng.integers(1, 6), replace=False)
                    X, ids = np.delete(X, gone, axis=0), np.delete(ids, gone)
                elif change == 1:
                    for _ in range(rng.integers(1, 6)):
                        X[rng.integers(len(X)), rng.integers(3)] += rng.normal()
                else:
                    m = int(rng.integers(5, 31))
                    X, ids = np.vstack([X, fresh(m)]), np.r_[ids, next_id + np.arange(m)]
                    next_id += m
            head = "id,a,b,c" if with_id else "a,b,c"
            lines = [(f"{i}," if with_id else "") + ",".join(repr(float(v)) for v in row)
                     for i, row in zip(ids, X)]
            path.write_text(head + "\n" + "\n".join(lines) + "\n")
            os.utime(path, ns=(version * 10**9, version * 10**9))
            t0 = time.perf_counter()
            site = load_site_file(path, cache_dir=cache, id_column="id" if with_id else None)
            group_table.site_groups(site, p, cache)
            seconds.append(time.perf_counter() - t0)
        store = Store.open(Store.path_for(cache, site.reading))
        return [{**t, "seconds": s} for t, s in zip(store.tables, seconds)]


def history_part(seeds: list[int], sizes: list[int]) -> list[str]:
    out = ["A 2,000-row table (3 features, 5 blobs), then 50 versions, each one change "
           "drawn at random: 1-5 rows deleted, 1-5 cells corrected, or 5-30 rows appended. "
           "Per setting and history seed, over the 50 versions: rows waiting (in no group: "
           "mean / most), rows the audit held back (mean / most), groups withdrawn (total), "
           "seconds to build a version (mean / most, the site's first message after the "
           "file changed: read, match, group, audit, write).", "",
           "| p_site | id column | seed | waiting mean / most | held back mean / most | "
           "withdrawn groups | seconds mean / most |", "|---|---|---|---|---|---|---|"]
    for p in sizes:
        for with_id in (False, True):
            for seed in seeds:
                tables = history(seed, with_id, p)[1:]
                waiting = [t["waiting"] for t in tables]
                held = [t["held-back"] for t in tables]
                seconds = [t["seconds"] for t in tables]
                line = (f"| {p} | {'yes' if with_id else 'no'} | {seed} | "
                        f"{np.mean(waiting):.1f} / {max(waiting)} | {np.mean(held):.1f} / "
                        f"{max(held)} | {sum(t['withdrawn-groups'] for t in tables)} | "
                        f"{np.mean(seconds):.2f} / {max(seconds):.2f} |")
                print(line, flush=True)
                out.append(line)
    return out


# ------------------------------------------------------------------ the scale part
VERSION_CHILD = PEAK + """
import sys, tracemalloc
import numpy as np
from fedcluster.client_app.data import group_table, site_data
from fedcluster.client_app.data.versions import Store, next_version
from fedcluster.client_app.release import audit as the_audit

path, cache, p = sys.argv[1], sys.argv[2], int(sys.argv[3])
audits = []
audit = the_audit.judge

def timed_audit(*args, **kwargs):
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        return audit(*args, **kwargs)
    finally:
        audits.append((time.perf_counter() - t0, tracemalloc.get_traced_memory()[1]))
        tracemalloc.stop()

from fedcluster.client_app.data.versions import audited as _audited_module  # noqa: E402
_audited_module.audit.judge = timed_audit
baseline = peak()
t0 = time.perf_counter()
site = site_data.load_site_file(path, cache_dir=cache)
groups, _ = group_table.site_groups(site, p, cache)
seconds = time.perf_counter() - t0
record = Store.read_tables(Store.path_for(cache, site.reading))[-1]
print(json.dumps({"seconds": seconds, "baseline": baseline, "peak": peak(),
                  "audit-seconds": sum(a[0] for a in audits), "audit-calls": len(audits),
                  "audit-memory": max([a[1] for a in audits] or [0]), "record": record}))
"""

EDIT_CHILD = """
import sys
import numpy as np
sys.path.insert(0, sys.argv[5])
from grouping import WRITERS, whole_columns

source, target, change, seed, kind = (sys.argv[1], sys.argv[2], float(sys.argv[3]),
                                      int(sys.argv[4]), sys.argv[6])
X = np.load(source, mmap_mode="r")
n, d = X.shape
rng = np.random.default_rng(seed)
touched = int(round(change * n))
corrected = rng.choice(n, touched // 2, replace=False)
deleted = rng.choice(np.setdiff1d(np.arange(n), corrected), touched // 4, replace=False)
keep = np.ones(n, dtype=bool)
keep[deleted] = False
WRITERS[kind](target + ".new.npy", touched // 4, d, seed=10_000 + seed)
new = np.load(target + ".new.npy", mmap_mode="r")
out = np.lib.format.open_memmap(target, mode="w+", dtype=np.float64, shape=(int(keep.sum()) + len(new), d))
whole = whole_columns(d)[0] if kind == "whole" else np.zeros(0, dtype=np.int64)
at = 0
is_corrected = np.zeros(n, dtype=bool)
is_corrected[corrected] = True
for start in range(0, n, 1 << 16):
    block = np.array(X[start:start + (1 << 16)])
    fix = np.flatnonzero(is_corrected[start:start + len(block)])
    column = rng.integers(d, size=fix.size)
    step = rng.normal(size=fix.size)
    block[fix, column] += np.where(np.isin(column, whole), np.round(step * 3), step)  # (whole stays whole)
    block = block[keep[start:start + len(block)]]
    out[at:at + len(block)] = block
    at += len(block)
out[at:] = new
out.flush()
"""


def edit_site(path: Path, change: float, version: int, kind: str = "blobs") -> None:
    """The site's file at ``path`` made its next version in place (:data:`EDIT_CHILD`, in a
    process of its own): ``change`` of its rows touched (appended rows from the same data
    set ``kind``: a whole-number column stays whole); its mtime set to ``version`` s."""
    edited = path.with_name(f"{path.stem}-{version}.npy")
    subprocess.run([sys.executable, "-c", EDIT_CHILD, str(path), str(edited), str(change),
                    str(version), str(BENCH), kind], check=True,
                   env=dict(os.environ, PYTHONPATH=str(ROOT)))
    os.replace(edited, path)
    Path(str(edited) + ".new.npy").unlink()
    os.utime(path, ns=(version * 10**9, version * 10**9))


def scale_part(n: int, d: int, versions: int, change: float, p: int,
               kind: str = "blobs") -> list[str]:
    with tempfile.TemporaryDirectory(prefix="fedcluster-versions-") as tmp:
        tmp = Path(tmp)
        cache, path = tmp / "cache", tmp / "site.npy"
        run_child("--write", path, n, d, 0, "--kind", kind, code=None)  # grouping.py's writer
        data = path.stat().st_size
        out = [f"One site of {n:,} x {d} float64 rows ({data / MB:.0f} MB .npy, memory-mapped), "
               f"p_site {p}, then {versions} versions each touching {change:.0%} of the rows "
               "(half corrected, one cell each; a quarter deleted; a quarter appended). Each "
               "version built in a fresh process (NUMBA_NUM_THREADS=2) as the site's first "
               "message after the change builds it. audit = `release/audit.judge` (seconds; its "
               "own peak allocation by tracemalloc, over the data); peak RSS = the whole "
               "process's, over the data.", "",
               "| version | rows | kept rows | withdrawn groups | waiting | held back | build s "
               "| audit s | audit memory / data | peak RSS / data |",
               "|---|---|---|---|---|---|---|---|---|---|"]
        for version in range(versions + 1):
            if version:
                edit_site(path, change, version, kind)
            r = run_child(path, cache, p, code=VERSION_CHILD)
            rec = r["record"]
            line = (f"| {version} | {rec['rows']:,} | {rec.get('kept-rows', 0):,} | "
                    f"{rec.get('withdrawn-groups', 0):,} | {rec['waiting']:,} | "
                    f"{rec['held-back']:,} | {r['seconds']:.1f} | {r['audit-seconds']:.1f} | "
                    f"{r['audit-memory'] / data:.3f} | {r['peak'] / data:.2f} |")
            print(line, flush=True)
            out.append(line)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", nargs="+", default=["history"], choices=["history", "scale"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--p", type=int, nargs="+", default=[2, 5])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--versions", type=int, default=20)
    parser.add_argument("--change", type=float, default=0.01)
    parser.add_argument("--data", nargs="+", default=["blobs"], choices=["blobs", "whole"],
                        help="the scale part's data sets (bench/grouping.py's writers)")
    parser.add_argument("--out", type=Path, default=None,
                        help="write the section 'versions' into this file (BENCHMARKS.md)")
    args = parser.parse_args()
    lines = [header("Versions of a site's data: kept, withdrawn, waiting, the audit"), ""]
    if "history" in args.parts:
        lines += ["### A history of 50 versions", ""] + history_part(args.seeds, args.p) + [""]
    if "scale" in args.parts:
        for kind in args.data:
            lines += [f"### A large site (data `{kind}`)", ""] + scale_part(
                args.rows, args.dim, args.versions, args.change, args.p[0], kind) + [""]
    write_section("versions", "\n".join(lines), args.out)


if __name__ == "__main__":
    main()

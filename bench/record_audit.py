"""What the one audit costs a reply (issue 69, must-show 4): a site's record of
``--versions`` versions of its data and ``--runs`` runs' reports, and the audit of one
more reply against all of it.

One site of ``--rows`` x ``--dim`` float64 rows (a ``.npy``, ``bench/grouping.py``'s
blobs), then ``--versions`` versions each touching ``--change`` of the rows (half
corrected, a quarter deleted, a quarter appended: ``bench/versions.py``'s edit), each
built in a fresh process as a site's first message after the change builds it; after
every (versions / runs)-th version, a run's report: the report's evaluation at 8
centroids (the first 8 rows, moved a little each run), asked of the site's real
ClientApp in a fresh process, whose release step judges the report's parts with the
whole record (``release/gate.admit_report``: the one audit, ``release/audit.judge``) and
records them. Measured per report: the seconds of its admission (the judgement and the
record's write; the resident memory it adds at its peak, over the data's size: the
kernel's high-water mark reset before it, ``/proc/self/clear_refs``), the
seconds of a plain reply's check (``gate.in_record``: the table in the record), and what
the record then holds (groups, partitions).

Usage::

    python bench/record_audit.py --rows 2000 --dim 8 --out BENCHMARKS.md
    python bench/record_audit.py --rows 1000000 --dim 64 --out BENCHMARKS.md
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))
from grouping import MB, PEAK, run_child  # noqa: E402  (bench/grouping.py)
from report import header, write_section  # noqa: E402
from versions import VERSION_CHILD, edit_site  # noqa: E402

REPORT_CHILD = PEAK + """
import json, sys, time
import numpy as np
sys.path.insert(0, sys.argv[4])
from record_check import RunSite
from fedcluster.client_app.release import gate

path, cache, p, shift = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[5])
X = np.load(path, mmap_mode="r")
C = np.array(X[:8]) + shift
admissions, checks = [], []
admit, in_record = gate.admit_report, gate.in_record

def timed_admit(*args, **kwargs):
    with open("/proc/self/clear_refs", "w") as clear:  # (the high-water mark from here)
        clear.write("5")
    before = resident()
    t0 = time.perf_counter()
    try:
        verdict = admit(*args, **kwargs)
        return verdict
    finally:
        admissions.append((time.perf_counter() - t0, max(hwm() - before, 0)))

def timed_check(groups):
    t0 = time.perf_counter()
    try:
        return in_record(groups)
    finally:
        checks.append(time.perf_counter() - t0)
gate.admit_report, gate.in_record = timed_admit, timed_check
site = RunSite({"data-path": path, "min-cluster-size": p}, cache, "error")
t0 = time.perf_counter()
site.ask("evaluate", [C], report=True)
seconds = time.perf_counter() - t0
site.ask("lloyd", [C], **{"local-iters": 1, "tol": 0.0})
store = sorted((__import__("pathlib").Path(cache) / "groups").glob("store-*"))[0]
meta = json.loads((store / "store.json").read_text())
print(json.dumps({"seconds": seconds, "peak": peak(), "admissions": admissions,
                  "check": checks[-1], "groups": meta["groups"], "instances": meta["instances"],
                  "partitions": sum(len(v) if isinstance(v, list) else 1
                                    for v in meta.get("reports", {}).values())}))
"""


def measure(n: int, d: int, versions: int, runs: int, change: float, p: int) -> list[str]:
    with tempfile.TemporaryDirectory(prefix="fedcluster-record-") as tmp:
        tmp = Path(tmp)
        cache, path = tmp / "cache", tmp / "site.npy"
        run_child("--write", path, n, d, 0, code=None)  # bench/grouping.py's writer
        data = path.stat().st_size
        every = max(1, versions // runs)
        out = [f"One site of {n:,} x {d} float64 rows ({data / MB:.1f} MB), p_site {p}, "
               f"{versions} versions each touching {change:.0%} of the rows, a run's report "
               f"after every {every} version(s) ({runs} runs). Per report: the admission's "
               "seconds (the one audit against the whole record, and the record written) and "
               "the resident memory it adds at its peak (MB, and over the data's size); the "
               "plain reply's check; the record's groups and partitions after it (a run "
               "whose partition equals one recorded is answered as recorded: no new one).", "",
               "The runs' centroids move a little from run to run, so later runs' partitions "
               "are often one the record holds already.", "",
               "| run | version | record: groups / partitions | admissions (rounds) | audit s "
               "(last round) | audit s (all rounds) | audit memory MB (x data) | plain check ms | "
               "report s (whole task) |",
               "|---|---|---|---|---|---|---|---|---|"]
        run = 0
        for version in range(versions + 1):
            if version:
                edit_site(path, change, version)
            run_child(path, cache, p, code=VERSION_CHILD)
            if version % every or run >= runs:
                continue
            run += 1
            r = run_child(path, cache, p, ROOT / "tests", 0.01 * run, code=REPORT_CHILD)
            rounds = r["admissions"]
            line = (f"| {run} | {version} | {r['groups']:,} / {r['partitions']} | {len(rounds)} | "
                    f"{rounds[-1][0]:.2f} | {sum(a[0] for a in rounds):.2f} | "
                    f"{max(a[1] for a in rounds) / MB:.1f} ({max(a[1] for a in rounds) / data:.2f}) | "
                    f"{1000 * r['check']:.2f} | "
                    f"{r['seconds']:.1f} |" if rounds else
                    f"| {run} | {version} | {r['groups']:,} / {r['partitions']} | 0 | - | - | - | "
                    f"{1000 * r['check']:.2f} | {r['seconds']:.1f} |")
            print(line, flush=True)
            out.append(line)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--dim", type=int, default=8)
    parser.add_argument("--versions", type=int, default=50)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--change", type=float, default=0.01)
    parser.add_argument("--p", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    lines = measure(args.rows, args.dim, args.versions, args.runs, args.change, args.p)
    # (one section per shape: the 2,000 x 8 record's marker has no width, as before)
    name = f"record-audit-{args.rows}" + ("" if args.dim == 8 else f"x{args.dim}")
    write_section(name, "\n".join([header(f"The one audit of a reply against the record "
                                          f"({args.rows:,} x {args.dim})"), ""] + lines) + "\n",
                  args.out)


if __name__ == "__main__":
    main()

"""Site groups (issue 35): what a deployed site does when it first meets a new data
version, timed with its peak memory on one large memory-mapped site; and the quality of
k-means on the groups' means.

1. **Time and memory** (``--parts scale``, the default): a 1,000,000 x 64 float64 site
   (50 Gaussian blobs of random sizes and spreads + 2 % uniform noise, seed 0) written to
   a ``.npy`` in a temporary folder, which a site memory-maps read-only. Each measure
   runs in a fresh child process (``NUMBA_NUM_THREADS=2``) whose peak RSS (``ru_maxrss``,
   and VmHWM as a check) then covers the interpreter, numpy, Numba with the kernels
   loaded from the on-disk cache (an untimed child on a small file fills it first; the
   child's own warm-up on a 40,000-row file loads every kernel and code path) and the
   measure alone. The files are written by other processes: Linux starts a child's
   ``ru_maxrss`` at its parent's high-water mark, so the parent stays small.

   - *grouping alone*: ``grouping.group_rows(X, g)`` on the mapped rows;
   - *whole build*: ``site_data.load_site_file(path, cache_dir=...)`` then
     ``group_table.site_groups(site, g, cache_dir)`` on a fresh cache folder: the
     grouping scale (a pass over the rows), the grouping, the statistics (sums, then
     the squared deviations a window of groups at a time), the canonical order, the
     labels, the row hashes (for growth), the entry written (.npy files and the json
     sidecar) and read back memory-mapped. Its parts are timed by wrapping those
     functions in the child; "high-water after" is the child's ``ru_maxrss`` when the
     part returns (which part raised the peak).

   Printed: seconds, the child's baseline (after its imports and the warm-up, before the
   data is opened) and peak RSS, over the data's size. Targets (issue 35): at most 60 s
   and at most 1.5 x the data.
2. **Quality** (``--parts quality``, or ``--quality``): for g = 2 and 3 (``--min-size``),
   the 13 SIPU sets and scikit-learn's iris, wine, breast cancer and digits, z-scored,
   each split IID over 5 sites (seed 0, as ``bench/quality.py``; ``--splits iid skew``
   and ``--split-seeds N`` for its label skew and more splits); each site's rows are
   grouped alone as a site groups them (``group_rows`` with ``grouping_scale``);
   scikit-learn's ``KMeans(k, n_init=10, random_state=0)`` is fitted on
   the pooled group means weighted by their counts and its inertia on the pooled rows is
   divided by that of the same KMeans fitted on the pooled rows (k = the set's number of
   labels). Printed per set, then median, 90th percentile and worst per g.  ``--seeds S``
   takes the best of ``random_state`` 0..S-1 on both sides, which separates the
   grouping's cost from KMeans landing in another local optimum on either side (on a set
   with many clusters one seed's ratio can move by several percent: seen once at 1.10 on
   d31). ``--leave-out`` probes rules that keep some rows out of the groups (no site
   applies one; BENCHMARKS.md says why): ``lone-by-label`` (the rows alone of their
   class at their site, the labels as an oracle) and ``far:T`` (rows whose nearest
   neighbour at the site is over T x the median nearest-neighbour distance).

``--out BENCHMARKS.md`` writes the parts run as its section ``grouping`` (``--section``
names another).

Usage::

    python bench/grouping.py [--rows 1000000] [--dim 64] [--min-size 2 3]
    python bench/grouping.py --quality [--seeds 1] [--sets a1 iris ...]
    python bench/grouping.py --quality --splits iid skew --split-seeds 5 --min-size 2 \
        --leave-out none lone-by-label far:8 --section grouping-lone-rows --out BENCHMARKS.md
    python bench/grouping.py --parts scale quality --out BENCHMARKS.md
    python bench/grouping.py --min-size 2 5 10 --data blobs whole --section grouping-scale \
        --out BENCHMARKS.md
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
MB = 2**20

PEAK = """
import json, resource, time

def peak():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

def resident():  # now, not the high-water mark
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize()

def hwm():  # the same high-water mark, from the kernel's mm
    with open("/proc/self/status") as status:
        return [int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM")][0]
"""

GROUPING_CHILD = PEAK + """
import sys
import numpy as np
from fedcluster.client_app.data.grouping import group_rows

path, warm, g = sys.argv[1], sys.argv[2], int(sys.argv[3])
group_rows(np.load(warm, mmap_mode="r"), g)  # kernels from the disk cache
baseline = peak()
X = np.load(path, mmap_mode="r")
t0 = time.perf_counter()
labels = group_rows(X, g)
seconds = time.perf_counter() - t0
counts = np.bincount(labels)
print(json.dumps({"seconds": seconds, "baseline": baseline, "peak": peak(), "hwm": hwm(),
                  "groups": int(len(counts)), "smallest": int(counts.min()),
                  "largest": int(counts.max())}))
"""

SITE_CHILD = PEAK + """
import sys
import numpy as np
from fedcluster.client_app.data import group_stats, group_table, grouped_rows, site_data, version_table

path, warm, g, cache, warm_cache = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
# the whole build once on a small file: kernels from the disk cache, every code path
group_table.site_groups(site_data.load_site_file(warm, cache_dir=warm_cache), g, warm_cache)
baseline = peak()
parts = {}

def timed(module, name, label):
    function = getattr(module, name)

    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        parts.setdefault(label, {"calls": 0, "seconds": 0.0, "first": len(parts)})
        try:
            return function(*args, **kwargs)
        finally:
            part = parts[label]
            part["calls"] += 1
            part["seconds"] += time.perf_counter() - t0
            part["after"] = peak()
            part["resident"] = resident()
    setattr(module, name, wrapper)

for module, name, label in [
        (site_data, "load_site_file", "load_site_file (map, check finite)"),
        (version_table, "row_hashes", "row_hashes (growth)"),
        (grouped_rows, "grouping_scale", "grouping_scale"),
        (grouped_rows, "group_rows", "group_rows"),
        (group_stats, "group_sums", "group_sums (counts, sums)"),
        (group_stats, "group_m2", "group_m2 (a window of groups each)"),
        (group_stats, "stats_keys", "stats_keys (hash of each group's statistics)"),
        (group_stats, "canonical_order", "canonical_order"),
        (group_table, "labels_of_groups", "labels"),
        (group_table.group_entries, "write_entry", "write_entry (.npy files, json)"),
        (group_table, "_read_entry", "_read_entry (first a miss; then the entry, mapped)")]:
    timed(module, name, label)
t0 = time.perf_counter()
site = site_data.load_site_file(path, cache_dir=cache)
groups, grouped = group_table.site_groups(site, g, cache)
seconds = time.perf_counter() - t0
counts = np.asarray(groups.counts)
print(json.dumps({"seconds": seconds, "baseline": baseline, "peak": peak(), "hwm": hwm(),
                  "groups": int(groups.n_groups), "smallest": int(counts.min()),
                  "largest": int(counts.max()), "waiting": groups.waiting, "parts": parts}))
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


#: The whole-number columns of the ``whole`` data and how each is scaled before rounding.
WHOLE_COLUMNS = {3: 1.0, 11: 2.0, 19: 0.5, 27: 5.0, 40: 1.0, 55: 3.0}


def whole_columns(d: int) -> tuple[np.ndarray, np.ndarray]:
    """The :data:`WHOLE_COLUMNS` a table of ``d`` columns has, and their scales."""
    columns = [c for c in WHOLE_COLUMNS if c < d]
    return np.array(columns, dtype=np.int64), np.array([WHOLE_COLUMNS[c] for c in columns])


def write_whole(path: Path, n: int, d: int, seed: int = 0, blobs: int = 40) -> None:
    """``whole``: anisotropic blobs (each its own random linear map), Student-t noise, the
    :data:`WHOLE_COLUMNS` rounded to whole numbers; written a chunk at a time."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(0, 5, (blobs, d))
    maps = rng.normal(0, 1, (blobs, d, d)) * rng.uniform(0.1, 1.5, (blobs, 1, d)) * 0.3
    weights = rng.dirichlet(np.ones(blobs))
    out = np.lib.format.open_memmap(path, mode="w+", dtype=np.float64, shape=(n, d))
    columns, scales = whole_columns(d)
    for start in range(0, n, 1 << 16):
        m = min(1 << 16, n - start)
        which = rng.choice(blobs, size=m, p=weights)
        noise = rng.standard_t(3, (m, d))
        rows = centres[which]
        for blob in np.unique(which):  # (one blob's map at a time: a chunk's maps would be GBs)
            mine = which == blob
            rows[mine] += noise[mine] @ maps[blob]
        rows[:, columns] = np.round(rows[:, columns] * scales)
        out[start:start + m] = rows
    out.flush()
    del out


#: The bench's data sets by name (``--write ... --kind``).
WRITERS = {"blobs": write_site, "whole": write_whole}


def run_child(*args, code: str | None) -> dict | None:
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


def time_and_memory(n: int, d: int, sizes: list[int], kind: str = "blobs") -> list[str]:
    """Run the scale part on the data set ``kind`` (:data:`WRITERS`); its lines for
    BENCHMARKS.md."""
    load = os.getloadavg()[0]
    out = []
    with tempfile.TemporaryDirectory(prefix="fedcluster-grouping-") as tmp:
        tmp = Path(tmp)
        path, warm = tmp / "site.npy", tmp / "warm.npy"
        t0 = time.perf_counter()
        # Written by other processes: Linux starts a child's ru_maxrss at its parent's
        # high-water mark (kept across fork and exec), so this process must stay small.
        run_child("--write", path, n, d, 0, "--kind", kind, code=None)
        # past the serial twins and one coarse split, so that every kernel is loaded
        run_child("--write", warm, 40_000, d, 1, "--kind", kind, code=None)
        data = path.stat().st_size
        print(f"wrote {n:,} x {d} float64 ({data / MB:.0f} MB) in "
              f"{time.perf_counter() - t0:.1f} s; load average {load:.2f}")
        out += [f"One site, {n:,} x {d} float64 rows of the data `{kind}` ({data / MB:.0f} MB "
                ".npy, memory-mapped), "
                f"NUMBA_NUM_THREADS=2, each measure in a fresh process; MB = 2^20 bytes; "
                f"limit 1.5 x the data = {1.5 * data / MB:.0f} MB. baseline = the process "
                "after its imports and a warm-up on a 40,000-row file (every kernel loaded), "
                "before the data is opened; peak = its ru_maxrss (VmHWM agrees). "
                f"Load average (1 min) {load:.2f} at the start on {os.cpu_count()} cores.", "",
                "| g | measure | seconds | groups (sizes) | baseline MB | peak RSS MB "
                "| peak / data | (peak - baseline) / data |", "|---|---|---|---|---|---|---|---|"]
        builds = {}
        for g in sizes:
            # fill Numba's on-disk cache (compiling costs time and memory that a site pays
            # once per app version, not per grouping)
            run_child(warm, warm, g, code=GROUPING_CHILD)
            for label, code, extra in (("grouping alone (`group_rows`)", GROUPING_CHILD, ()),
                                       ("whole build (`load_site_file` + `site_groups`)",
                                        SITE_CHILD, (tmp / f"cache-{g}", tmp / f"warm-{g}"))):
                r = run_child(path, warm, g, *extra, code=code)
                print(f"g = {g}, {label}: {r['seconds']:.1f} s; {r['groups']:,} groups of "
                      f"{r['smallest']}..{r['largest']} rows; baseline {r['baseline'] / MB:.0f} "
                      f"MB, peak {r['peak'] / MB:.0f} MB (VmHWM {r['hwm'] / MB:.0f} MB) = "
                      f"{r['peak'] / data:.2f} x the data", flush=True)
                out.append(f"| {g} | {label} | {r['seconds']:.1f} | {r['groups']:,} "
                           f"({r['smallest']}..{r['largest']}) | {r['baseline'] / MB:.0f} | "
                           f"{r['peak'] / MB:.0f} | **{r['peak'] / data:.2f}** | "
                           f"{(r['peak'] - r['baseline']) / data:.2f} |")
                if "parts" in r:
                    builds[g] = r
        for g, r in builds.items():
            out += ["", _reading(g, r, data)]
            out += ["", f"The whole build's parts at g = {g} (seconds summed over calls; "
                    "high-water after = the process's peak RSS when the part's last call "
                    "returned, resident after = its RSS then):", "",
                    "| part (in the order first called) | calls | seconds | high-water after, MB "
                    "| resident after, MB |", "|---|---|---|---|---|"]
            print(f"parts at g = {g}:")
            for label, part in sorted(r["parts"].items(), key=lambda item: item[1]["first"]):
                print(f"  {label:48s} {part['calls']:3d} {part['seconds']:6.1f} s "
                      f"{part['after'] / MB:6.0f} MB high-water {part['resident'] / MB:6.0f} MB now")
                out.append(f"| {label} | {part['calls']} | {part['seconds']:.1f} | "
                           f"{part['after'] / MB:.0f} | {part['resident'] / MB:.0f} |")
    return out


def _reading(g: int, r: dict, data: int) -> str:
    """What a whole build's measure says, from its parts: the time they account for and
    where the high-water mark is reached (``_read_entry``, called again at the end, aside)."""
    parts = sorted(((label, part) for label, part in r["parts"].items()
                    if not label.startswith("_read_entry")), key=lambda item: item[1]["first"])
    timed = sum(part["seconds"] for _, part in parts)
    before, reached = None, None
    for label, part in parts:
        if part["after"] >= r["peak"]:
            reached = label
            break
        before = (label, part["after"])
    where = "" if reached is None else (
        f" The high-water mark is reached by the end of {reached.split(' (')[0]}"
        + ("" if before is None else f" ({before[1] / MB:.0f} MB after {before[0].split(' (')[0]})")
        + ".")
    return (f"Reading, g = {g}: the whole build takes {r['seconds']:.1f} s and peaks at "
            f"{r['peak'] / data:.2f} x the data (issue 71's target: 1.5 x; its time against a "
            f"k-means fit: the large-site section). The parts timed below add up to {timed:.1f} "
            f"s; the other {r['seconds'] - timed:.1f} s are not timed as parts: the versions "
            "plan around the grouping (the rows' keys matched to the record, their cells' "
            "hashes) and the spread rule (`group_spreads.Spreads.of`: pairing, merging, "
            "dominance, the pooled spread)." + where)


def _left_out(site: np.ndarray, labels: np.ndarray, rule: str) -> np.ndarray:
    """Which rows of one site a ``--leave-out`` rule keeps out of the groups (a probe of
    rules the sites do not apply): ``lone-by-label`` the rows alone of their class at the
    site (the labels as an oracle, which a site does not have); ``far:T`` the rows whose
    nearest neighbour at the site is over T x the site's median nearest-neighbour
    distance (measured as the grouping measures)."""
    if rule == "none":
        return np.zeros(len(site), dtype=bool)
    if rule == "lone-by-label":
        return np.bincount(labels)[labels] == 1
    from sklearn.neighbors import NearestNeighbors

    from fedcluster.client_app.data.grouping import grouping_scale

    scale = grouping_scale(site)
    Z = site if scale is None else site * scale
    nearest = NearestNeighbors(n_neighbors=2).fit(Z).kneighbors(Z)[0][:, 1]
    return nearest > float(rule.partition(":")[2]) * np.median(nearest)


def quality(sets: list[str], sizes: tuple[int, ...], seeds: int = 1,
            splits: tuple[str, ...] = ("iid",), split_seeds: int = 1,
            leave_out: tuple[str, ...] = ("none",)) -> list[str]:
    """Run the quality part; its lines for BENCHMARKS.md."""
    import warnings

    from sklearn.cluster import KMeans

    sys.path.insert(0, str(BENCH))
    from quality import SPLITS, load  # noqa: E402  (bench/quality.py)

    from fedcluster.client_app.data.grouping import grouping_scale
    from fedcluster.client_app.data.grouping import group_rows
    from fedcluster.common.datasets import partition

    warnings.filterwarnings("ignore")
    data = ROOT.parent / "shared" / "data"
    columns = [(g, rule) for rule in leave_out for g in sizes]
    name_of = {c: f"g = {c[0]}" + ("" if c[1] == "none" else f", {c[1]} left out")
               for c in columns}
    state = "random_state 0" if seeds == 1 else f"the best of random_state 0..{seeds - 1}"
    many = len(splits) > 1 or split_seeds > 1
    out = [f"Pooled KMeans(k, n_init=10, {state}) on the count-weighted group means, its "
           "inertia on the pooled rows over that of the same KMeans on the rows; each set "
           f"z-scored, split over 5 sites ({', '.join(splits)}; "
           + (f"split seeds 0-{split_seeds - 1}" if split_seeds > 1 else "split seed 0")
           + "), each site's rows grouped alone as a site groups them (`group_rows` with "
           "`grouping_scale`)."
           + (" A rule 'left out' keeps some rows of each site out of every group (a probe: "
              "no site does this; `lone-by-label`: the rows alone of their class at their "
              "site, the labels as an oracle; `far:T`: the rows whose nearest neighbour at "
              "the site is over T x the site's median nearest-neighbour distance)."
              if any(r != "none" for r in leave_out) else ""),
           "", "| set | split | n | k | " + " | ".join(name_of[c] for c in columns) + " |",
           "|---|---|---|---|" + "---|" * len(columns)]
    ratios = {(c, split): [] for c in columns for split in splits}
    for name in sets:
        X, y = load(name, data)
        k = len(np.unique(y))
        for split in splits:
            for split_seed in range(split_seeds):
                parts = partition(y, 5, SPLITS[split], seed=split_seed)
                sites = [np.ascontiguousarray(X[p]) for p in parts]
                rows = np.concatenate(sites)
                central = min(KMeans(k, n_init=10, random_state=seed).fit(rows).inertia_
                              for seed in range(seeds))
                # per rule, each site's rows that are grouped and their grouping scale
                # (the same for every g)
                kept_rows = {}
                for rule in leave_out:
                    kept_rows[rule] = []
                    for site, part in zip(sites, parts):
                        grouped = np.ascontiguousarray(site[~_left_out(site, y[part], rule)])
                        kept_rows[rule].append((grouped, grouping_scale(grouped)))
                cells = []
                for g, rule in columns:
                    means, counts = [], []
                    for site, (grouped, scale) in zip(sites, kept_rows[rule]):
                        labels = group_rows(grouped, g, scale)
                        c = np.bincount(labels)
                        s = np.zeros((len(c), site.shape[1]))
                        np.add.at(s, labels, grouped)
                        means.append(s / c[:, None])
                        counts.append(c)
                    M, W = np.concatenate(means), np.concatenate(counts)
                    ratio = min(-KMeans(k, n_init=10, random_state=seed)
                                .fit(M, sample_weight=W).score(rows)
                                for seed in range(seeds)) / central
                    ratios[((g, rule), split)].append((ratio, name, split_seed))
                    cells.append(f"{ratio:.4f}")
                label = split + (f" {split_seed}" if split_seeds > 1 else "")
                print(f"{name:12s} {label:7s} " + " ".join(f"{c:>8s}" for c in cells), flush=True)
                if not many:
                    out.append(f"| {name} | {label} | {len(rows)} | {k} | " + " | ".join(cells) + " |")
    if many:  # one line per set and split would be long: the summary only
        out = out[:1]
    out.append("")
    for (column, split), values in ratios.items():
        r = np.array([v[0] for v in values])
        worst = values[int(r.argmax())]
        summary = (f"{name_of[column]}, {split}: median {np.median(r):.4f}, 90th percentile "
                   f"{np.percentile(r, 90):.4f}, worst {r.max():.4f} ({worst[1]}"
                   + (f", split seed {worst[2]}" if split_seeds > 1 else "")
                   + f"), over {len(r)} runs")
        print(summary)
        out.append(f"- {summary}.")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--min-size", type=int, nargs="+", default=[2, 3])
    parser.add_argument("--parts", nargs="+", choices=["scale", "quality"], default=["scale"])
    parser.add_argument("--data", nargs="+", choices=["blobs", "whole"], default=["blobs"],
                        help="scale: the data sets (blobs; whole: whole-number columns, ties)")
    parser.add_argument("--quality", action="store_true", help="the same as --parts quality")
    parser.add_argument("--seeds", type=int, default=1,
                        help="quality: best of KMeans random_state 0..SEEDS-1 on both sides "
                             "(1, the default: random_state 0 only)")
    parser.add_argument("--splits", nargs="+", default=["iid"], choices=["iid", "skew"],
                        help="quality: the splits (bench/quality.py's)")
    parser.add_argument("--split-seeds", type=int, default=1,
                        help="quality: split seeds 0..N-1, each a run of its own")
    parser.add_argument("--leave-out", nargs="+", default=["none"],
                        help="quality: rows kept out of the groups, a probe (none, "
                             "lone-by-label, far:T)")
    parser.add_argument("--out", type=Path, default=None,
                        help="write the parts run as section SECTION of this file")
    parser.add_argument("--section", default="grouping")
    parser.add_argument("--write", nargs=4, metavar=("PATH", "ROWS", "DIM", "SEED"),
                        help=argparse.SUPPRESS)  # internal: the bench's data writer
    parser.add_argument("--kind", default="blobs", choices=["blobs", "whole"],
                        help=argparse.SUPPRESS)  # internal: which data --write writes
    parser.add_argument("--sets", nargs="+", default=[
        "a1", "s1", "s2", "s3", "s4", "unbalance", "d31", "r15", "aggregation", "compound",
        "flame", "jain", "pathbased", "iris", "wine", "cancer", "digits"])
    args = parser.parse_args()
    if args.write:
        path, rows, dim, seed = args.write
        WRITERS[args.kind](Path(path), int(rows), int(dim), int(seed))
        return
    parts = ["quality"] if args.quality else args.parts
    lines = []
    if "scale" in parts:
        for kind in args.data:
            lines += [f"### Time and memory: a site's first meeting with a data version ({kind})",
                      "", *time_and_memory(args.rows, args.dim, args.min_size, kind), ""]
    if "quality" in parts:
        lines += ["### Quality: k-means on the groups' means", "",
                  *quality(args.sets, tuple(args.min_size), args.seeds, tuple(args.splits),
                           args.split_seeds, tuple(args.leave_out)), ""]
    if args.out is not None:
        sys.path.insert(0, str(BENCH))
        import report  # noqa: E402

        title = {"grouping": "Site groups: grouping one large site, and the quality of its "
                             "groups",
                 "grouping-lone-rows": "Site groups: rows alone at their site, grouped or "
                                       "left out",
                 "grouping-scale": "Site groups: a site's first meeting with its data, on "
                                   "blobs and on whole-number columns"}.get(args.section, f"Site groups: {args.section}")
        text = "\n".join([report.header(title), "", *lines])
        print(f"wrote section '{args.section}' of "
              f"{report.write_section(args.section, text, args.out)}")


if __name__ == "__main__":
    main()

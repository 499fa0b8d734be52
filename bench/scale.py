"""How a federated round's cost grows with the number of sites and the data size, and the
peak memory of one large memory-mapped site.

1. **Sites**: DWF (k = 5, random init, tol 0 so that every round runs) on the built-in
   ``blobs`` set (10,100 x 2) cut IID into 10, 100 and 1000 sites, through the in-process
   harness (``fedcluster.simulate(num_sites=...)``) and through Flower's simulation engine
   (a real ``flower-superlink --simulation`` and ``flwr run``, Ray backend). Seconds per
   round = (T(R2 rounds) - T(R1 rounds)) / (R2 - R1): start-up, the describe/init/evaluate
   rounds and (for the engine) Ray's start cancel out; an untimed engine run first installs
   the FAB and compiles the kernels for its path. Peak memory: the harness runs in a
   child process (its peak RSS); for the engine, the sum of the RSS of every process of
   the federation (SuperLink, SuperExec, ServerApp, Ray and its workers), sampled every
   0.25 s, at its highest.
2. **Data size**: the harness with 100 sites of 100, 1,000 and 10,000 rows each (d = 16,
   k = 10, random blobs): seconds per round and peak RSS.
3. **One large site**: a 1,000,000 x 64 float64 ``.npy`` (512 MB) opened with
   ``load_site_file`` (memory-mapped, no copy), running the rounds of a DWF run with
   k = 10 (describe, the k-FED initialisation round, 3 training rounds, the evaluation and
   Davies-Bouldin rounds), after the same rounds on a small site have filled Numba's
   on-disk cache. As in a deployment, where Flower starts a fresh ClientApp
   process for every round, each round is a fresh process that imports what a ClientApp
   imports, opens the file, builds its group table at the site's default p_site = 2 (the
   first round; kept beside the site's cache, in the bench's workdir) or reads the kept
   one, and runs the site task on the groups (``task_runner.run_task``); the server steps
   between rounds are fedcluster's own reductions, run here. Peak RSS is the process's
   VmHWM: interpreter, libraries and compiled kernels (the baseline, measured before the
   data is opened) + the mapped pages of the data it reads + temporaries.

4. **Many small sites** (``bench/many_sites.py``, issue 47): 1,000, 3,000 and 10,000
   sites of 20 x 8 rows in process, DWF at C = 1 and C = 0.01, availability 1 and 0.7
   (with stragglers 0.1): the whole run, seconds per training round and per message,
   peak memory, who answered; Flower's floor (two no-op apps in the same harness, as many
   sites); and the quality of DWF, mini-batch and FKM against central KMeans at 1,000 and
   10,000 sites.

Usage::

    python bench/scale.py [--sites 10,100,1000] [--rows-per-site 100,1000,10000]
        [--big-rows 1000000] [--no-engine] [--edge-sites 1000,3000,10000]
        [--edge-quality-sites 1000,10000] [--edge-floor-sites 1000,10000] [--out BENCHMARKS.md]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))
import many_sites  # noqa: E402
import report  # noqa: E402

ROUNDS = (2, 7)  # R1, R2: seconds per round = (T(R2) - T(R1)) / (R2 - R1)


def _hwm_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM"):
            return int(line.split()[1]) * 1024
    return 0


def _rss_bytes(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _run_child(args: list[str], env: dict | None = None) -> dict:
    """Run this script in child mode; its last stdout line is a JSON result."""
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), *args],
                          capture_output=True, text=True, env=env, cwd=ROOT)
    if proc.returncode != 0:
        raise RuntimeError(f"child {args} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ----------------------------------------------------------- 1 + 2: the harness (child)
def child_harness(spec: dict) -> dict:
    """Timed harness runs with R1 and R2 rounds; the process's peak RSS."""
    report.quiet_flower()
    import fedcluster

    config = dict(algorithm="dwf", init="random", tol=0.0, min_sites=2,
                  central_baseline=False, seed=0, n_clusters=spec["k"])
    if spec["kind"] == "builtin":
        call = dict(num_sites=spec["sites"], dataset="blobs", partitioning="iid")
    else:
        rng = np.random.default_rng(0)
        centres = rng.uniform(-10, 10, size=(spec["k"], spec["d"]))
        sites = []
        for _ in range(spec["sites"]):
            labels = rng.integers(spec["k"], size=spec["rows"])
            sites.append(centres[labels] + rng.standard_normal((spec["rows"], spec["d"])))
        call = dict(sites=sites)
    fedcluster.simulate(**call, **{**config, "num_rounds": 1})  # warm-up: compile, caches
    times = []
    for rounds in ROUNDS:
        t0 = time.perf_counter()
        fedcluster.simulate(**call, **{**config, "num_rounds": rounds})
        times.append(time.perf_counter() - t0)
    return {"seconds": times, "peak": _hwm_bytes()}


# ----------------------------------------------------------- 1: Flower's simulation engine
def engine_runs(site_counts: list[int], workdir: Path) -> dict[int, dict]:
    """Seconds per round and peak total RSS per number of sites on the simulation engine."""
    sys.path.insert(0, str(ROOT / "tests"))
    import flower_processes as fp

    os.environ["PATH"] = f"{fp.BIN_DIR}{os.pathsep}{os.environ.get('PATH', '')}"
    results = {}
    numba_cache = workdir / "numba-cache"
    numba_cache.mkdir(exist_ok=True)
    with fp.sandbox(workdir / "engine", NUMBA_CACHE_DIR=numba_cache) as bed:
        link = bed.superlink(simulation=True)
        bed.connect("sim", link.control_address)

        def run(n_sites: int, rounds: int, log_name: str):
            return bed.run(ROOT, "sim", {
                "algorithm": "dwf", "n-clusters": 5, "num-rounds": rounds,
                # (the engine's sites have no node config of ours: init random's
                # bounds round would be refused without allow-minmax; data-bounds
                # declares the box instead, so no site round and no min/max)
                "init": "random", "data-bounds": "-2:2", "tol": 0.0, "dataset": "blobs",
                "partitioning": "iid", "central-baseline": False, "output-dir": "",
            }, {"num-supernodes": n_sites}, timeout=3600, log_name=log_name)

        # Warm-up, untimed: the first run installs the FAB and compiles the kernels for
        # its path (the Numba cache is empty), which the first timed run would carry.
        print(f"engine warm-up: {run(min(site_counts), 1, 'warm-up').seconds:.1f} s", flush=True)
        for n_sites in site_counts:
            times, peak = [], 0
            for rounds in ROUNDS:
                stop = threading.Event()
                samples = []

                def sample():
                    while not stop.is_set():
                        pids = [p.pid for p in fp.find_processes(tag=bed.tag)]
                        samples.append(sum(_rss_bytes(pid) for pid in pids))
                        stop.wait(0.25)

                sampler = threading.Thread(target=sample, daemon=True)
                sampler.start()
                try:
                    timed = run(n_sites, rounds, f"run-{n_sites}-{rounds}")
                finally:
                    stop.set()
                    sampler.join()
                times.append(timed.seconds)
                peak = max([peak, *samples])
            results[n_sites] = {"seconds": times, "peak": peak}
            print(f"engine {n_sites} sites: {times} s, peak {peak / 2**20:.0f} MB", flush=True)
    return results


# ----------------------------------------------------------- 3: one large site (children)
CHILD_SITE = "site-task"
SITE_FLOOR = 2  # a deployed site's default min-cluster-size: the size of its groups


def child_site_task(path: str, task: str, params: dict, arrays_in: str, arrays_out: str) -> dict:
    """One round of one site, as a fresh ClientApp process runs it: the file's cache,
    the site's groups (built and kept beside the cache the first time, read after that:
    ``group_table.site_groups``) at its default p_site = 2, then the task."""
    import fedcluster.client_app  # noqa: F401  (what a ClientApp process imports)
    from fedcluster.client_app import task_runner
    from fedcluster.client_app.data import group_table
    from fedcluster.client_app.data.site_data import default_cache_dir, load_site_file
    from fedcluster.client_app.private_rows import PrivateRows
    from fedcluster.common import protocol

    baseline = _hwm_bytes()
    arrays = list(np.load(arrays_in).values()) if arrays_in != "-" else []
    t0 = time.perf_counter()
    cache = default_cache_dir()
    site = load_site_file(path, cache_dir=cache)
    groups, grouped = group_table.site_groups(site, SITE_FLOOR, cache)
    reply = task_runner.run_task(groups, arrays, {"task": task, **params}, SITE_FLOOR,
                                 private_rows=PrivateRows(site.X, grouped, site.source))
    seconds = time.perf_counter() - t0
    np.savez(arrays_out, *protocol.to_arrays(reply.arrays))
    return {"baseline": baseline, "peak": _hwm_bytes(), "seconds": seconds,
            "metrics": {k: v for k, v in reply.metrics.items() if isinstance(v, (int, float))}}


def write_big_site(path: Path, rows: int, d: int, k: int) -> None:
    """A rows x d float64 .npy written in slices (never held in memory at once)."""
    X = np.lib.format.open_memmap(path, mode="w+", dtype=np.float64, shape=(rows, d))
    rng = np.random.default_rng(0)
    centres = rng.uniform(-10, 10, size=(k, d))
    step = 100_000
    for start in range(0, rows, step):
        stop = min(rows, start + step)
        X[start:stop] = centres[rng.integers(k, size=stop - start)] + rng.standard_normal((stop - start, d))
    X.flush()
    del X


def big_site_rounds(path: Path, k: int, train_rounds: int, workdir: Path) -> list[dict]:
    """The site rounds of a DWF run, each in a fresh process; the server steps here."""
    from fedcluster.common.config import parse_run_config
    from fedcluster.strategies.aggregate import kmeans_on_centroids, momentum_step, site_weighted_mean

    config = parse_run_config({"algorithm": "dwf", "n-clusters": k})
    floor = config.min_cluster_size
    rows = []

    def site_round(task: str, params: dict, arrays: list[np.ndarray]) -> list[np.ndarray]:
        arrays_in = "-"
        if arrays:
            arrays_in = str(workdir / "in.npz")
            np.savez(arrays_in, *arrays)
        out = workdir / "out.npz"
        # the site's cache (its group table, kept between rounds) in the bench's workdir
        result = _run_child([CHILD_SITE, str(path), task,
                             json.dumps({"min-cluster-size": floor, **params}), arrays_in, str(out)],
                            env={**os.environ, "FEDCLUSTER_CACHE_DIR": str(workdir / "site-cache")})
        result["task"] = task
        rows.append(result)
        print(f"  {task}: {result['seconds']:.1f} s, peak {result['peak'] / 2**20:.0f} MB", flush=True)
        return list(np.load(out).values())

    site_round("describe", {}, [])
    # k-FED initialisation round: local k-means with k-local clusters, then the server's
    # (weighted) k-means on the local centroids.
    local_centroids, counts = site_round("local_kmeans", {"k-local": config.resolved_k_local,
                                                          "seed": 1}, [])
    C = kmeans_on_centroids(local_centroids, k, seed=0,
                            weights=counts.astype(float) if config.resolved_weighted else None)
    previous = C
    for _ in range(train_rounds):
        site_C, weights = site_round("lloyd", {"local-iters": config.local_iters,
                                               "tol": config.tol}, [C])
        D = site_weighted_mean(site_C[None], weights[None], dynamic=True)
        C, previous = momentum_step(C, D, previous, config.learning_rate, config.momentum), C
    counts, sums = site_round("evaluate", {}, [C])[:2]
    means = np.where(counts[:, None] > 0, sums / np.maximum(counts, 1)[:, None], C)
    site_round("evaluate_distances", {}, [C, means])
    return rows


# ----------------------------------------------------------- report
def per_round(seconds: list[float]) -> float:
    return (seconds[1] - seconds[0]) / (ROUNDS[1] - ROUNDS[0])


def main(argv=None) -> None:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == CHILD_SITE:
        _, _, path, task, params, arrays_in, arrays_out = sys.argv
        print(json.dumps(child_site_task(path, task, json.loads(params), arrays_in, arrays_out)))
        return
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "harness":
        print(json.dumps(child_harness(json.loads(sys.argv[2]))))
        return
    if argv is None and len(sys.argv) > 1 and sys.argv[1] in many_sites.CHILDREN:
        report.quiet_flower()
        print(json.dumps(many_sites.CHILDREN[sys.argv[1]](json.loads(sys.argv[2])),
                         default=float))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sites", default="10,100,1000", help="site counts (part 1)")
    parser.add_argument("--rows-per-site", default="100,1000,10000", help="part 2, 100 sites")
    parser.add_argument("--data-sites", type=int, default=100, help="site count of part 2")
    parser.add_argument("--engine", action=argparse.BooleanOptionalAction, default=True,
                        help="also run Flower's simulation engine (part 1)")
    parser.add_argument("--engine-sites", default=None,
                        help="site counts for the simulation engine (default: --sites)")
    parser.add_argument("--big-rows", type=int, default=1_000_000, help="part 3 rows (0: skip)")
    parser.add_argument("--big-d", type=int, default=64)
    parser.add_argument("--big-k", type=int, default=10)
    parser.add_argument("--big-rounds", type=int, default=3, help="part 3 training rounds")
    parser.add_argument("--edge-sites", default="1000,3000,10000",
                        help="part 4: site counts of the speed grid ('' skips part 4)")
    parser.add_argument("--edge-cells", default=None,
                        help="part 4: the speed grid's cells as C:availability pairs, e.g. "
                        "'1:1,0.01:1' (default: all of many_sites.CELLS)")
    parser.add_argument("--edge-quality-sites", default="1000,10000",
                        help="part 4: site counts of the quality runs")
    parser.add_argument("--edge-floor-sites", default="1000,10000",
                        help="part 4: site counts of the no-op apps (Flower's floor)")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="where the large .npy and the engine's files go (default: a temp dir)")
    parser.add_argument("--out", type=Path, default=None,
                        help="the file to write the section into (e.g. BENCHMARKS.md; "
                        "default: print it only)")
    args = parser.parse_args(argv)
    site_counts = [int(s) for s in args.sites.split(",") if s]
    row_counts = [int(s) for s in args.rows_per_site.split(",") if s]
    t_start = time.perf_counter()
    load_before = os.getloadavg()[0]
    text = [report.header("Scale: sites, data size, and the memory of a large site"), ""]

    edge = [int(s) for s in args.edge_sites.split(",") if s]
    cells = many_sites.CELLS if args.edge_cells is None else tuple(
        tuple(float(x) for x in cell.split(":")) for cell in args.edge_cells.split(",") if cell)
    unknown = [cell for cell in cells if cell not in many_sites.CELLS]
    if unknown:
        parser.error(f"--edge-cells: {unknown} not among {many_sites.CELLS}")
    edge_speed, edge_floor, edge_quality = {}, {}, {}
    for n in edge:
        for fraction, available in cells:
            edge_speed[(n, fraction, available)] = r = _run_child(["edge-speed", json.dumps(
                {"sites": n, "fraction": fraction, "availability": available})])
            print(f"edge {n} sites, C {fraction}, a {available}: {r['seconds']:.1f} s, "
                  f"rounds {r['round-seconds']}, peak {r['peak'] / 2**20:.0f} MB", flush=True)
    for n in ([int(s) for s in args.edge_floor_sites.split(",") if s] if edge else []):
        edge_floor[n] = _run_child(["edge-floor", json.dumps({"sites": n})])
        print(f"edge floor {n} sites: {edge_floor[n]}", flush=True)
    for n in ([int(s) for s in args.edge_quality_sites.split(",") if s] if edge else []):
        edge_quality[n] = _run_child(["edge-quality", json.dumps(
            {"sites": n, "algorithms": list(many_sites.ALGORITHMS)})])
        print(f"edge quality {n} sites: {edge_quality[n]}", flush=True)
    edge_log = BENCH / "logs" / "scale-many-sites.json"
    if edge_speed and args.out is not None:  # kept at once: the other parts run long
        edge_log.write_text(many_sites.results_json(edge_speed, edge_floor, edge_quality))

    with tempfile.TemporaryDirectory(prefix="fcscale-", dir=args.workdir) as tmp:
        workdir = Path(tmp)
        harness = {n: _run_child(["harness", json.dumps({"kind": "builtin", "sites": n, "k": 5})])
                   for n in site_counts}
        for n, r in harness.items():
            print(f"harness {n} sites: {r}", flush=True)
        engine_counts = ([int(s) for s in args.engine_sites.split(",") if s]
                         if args.engine_sites is not None else site_counts)
        engine = engine_runs(engine_counts, workdir) if args.engine and engine_counts else {}
        sizes = {rows: _run_child(["harness", json.dumps({
            "kind": "synthetic", "sites": args.data_sites, "rows": rows, "d": 16, "k": 10})])
            for rows in row_counts}
        for rows, r in sizes.items():
            print(f"harness {args.data_sites} x {rows} rows: {r}", flush=True)
        big_rows = []
        if args.big_rows:
            path = workdir / "site.npy"
            # The same rounds on a small site first, so that every kernel the rounds call
            # is in Numba's on-disk cache (as after a deployment's first run): compiling
            # costs memory that a round with a warm cache does not need.
            warm = workdir / "warm-up.npy"
            write_big_site(warm, 20_000, args.big_d, args.big_k)
            print("warm-up (fills Numba's cache):", flush=True)
            big_site_rounds(warm, args.big_k, 1, workdir)
            write_big_site(path, args.big_rows, args.big_d, args.big_k)
            data_bytes = path.stat().st_size
            print("the large site:", flush=True)
            big_rows = big_site_rounds(path, args.big_k, args.big_rounds, workdir)

    if site_counts:
        text += ["### Seconds per round against the number of sites (DWF, blobs 10,100 x 2, "
                 "k = 5, IID)", "",
                 "| sites | in-process s/round | in-process peak RSS MB "
                 + ("| simulation engine s/round | simulation engine peak RSS MB (all processes) "
                    if engine else "") + "|",
                 "|---|---|---" + ("|---|---" if engine else "") + "|"]
        for n in site_counts:
            row = (f"| {n} | {per_round(harness[n]['seconds']):.3f} "
                   f"| {harness[n]['peak'] / 2**20:.0f} ")
            if engine and n in engine:
                row += (f"| {per_round(engine[n]['seconds']):.3f} "
                        f"| {engine[n]['peak'] / 2**20:.0f} ")
            elif engine:
                row += "| not run | not run "
            text.append(row + "|")
        text.append("")
    if row_counts:
        text += [f"### Seconds per round against the data size (in-process, DWF, "
                 f"{args.data_sites} sites, d = 16, k = 10)", "",
                 "| rows per site | rows in all | s/round | peak RSS MB |", "|---|---|---|---|"]
        for rows in row_counts:
            text.append(f"| {rows:,} | {rows * args.data_sites:,} "
                        f"| {per_round(sizes[rows]['seconds']):.3f} "
                        f"| {sizes[rows]['peak'] / 2**20:.0f} |")
        text.append("")
    if big_rows:
        mb = data_bytes / 2**20
        worst = max(r["peak"] for r in big_rows)
        text += [f"### One site with {args.big_rows:,} x {args.big_d} float64 rows "
                 f"({mb:.0f} MB .npy, memory-mapped), DWF k = {args.big_k}", "",
                 "Each round a fresh process (as Flower starts one ClientApp process per round). "
                 "baseline = the process after its imports, before the data is opened; peak = "
                 "its VmHWM over the round.", "",
                 "| round (task) | seconds | baseline MB | peak RSS MB | peak / data "
                 "| (peak - baseline) / data |", "|---|---|---|---|---|---|"]
        for r in big_rows:
            text.append(f"| {r['task']} | {r['seconds']:.1f} | {r['baseline'] / 2**20:.0f} "
                        f"| {r['peak'] / 2**20:.0f} | **{r['peak'] / data_bytes:.2f}** "
                        f"| {(r['peak'] - r['baseline']) / data_bytes:.2f} |")
        text += ["", f"Highest peak over the run: {worst / 2**20:.0f} MB = "
                 f"**{worst / data_bytes:.2f} x the data**.", ""]
    if edge_speed:
        text += many_sites.section(edge_speed, edge_floor, edge_quality)
        if args.out is not None:
            text += [f"(every figure of this part: `bench/logs/{edge_log.name}`)", ""]
    text.append(f"Load average (1 min) {load_before:.2f} at the start on {os.cpu_count()} "
                f"cores; total time {time.perf_counter() - t_start:.0f} s.")
    if (path := report.write_section("scale", "\n".join(text), args.out)) is not None:
        print(f"wrote {path}")


if __name__ == "__main__":
    main()

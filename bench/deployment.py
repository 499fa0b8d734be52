"""Deployment overhead: seconds per round of a real SuperLink + 3 SuperNodes on loopback,
split into Flower's own time (polling, transport, process start-up) and fedcluster's.

1. **Deployment**: ``flower-superlink`` (gRPC Fleet API) and three ``flower-supernode``
   processes on 127.0.0.1 (``tests/flower_processes.py``, as the deployment tests start
   them), each site reading its own ``.npy`` through its node config's ``data-path``
   (memory-mapped, no copy); ``flwr run`` runs DWF. Seconds per round = the ServerApp's
   own wall time of each training round (the history's ``seconds``: send the task, wait
   for the three replies, aggregate), median over the training rounds.
2. **fedcluster's time**: the same run (same files, node configs, run config and seed)
   through the in-process harness (``fedcluster.simulation.run_in_process``): the real
   ServerApp and ClientApp code, messages passed by function call, no network, no
   polling, no process start. Its seconds per training round = the three site tasks (run
   one after the other, so an upper bound for three parallel sites) + opening the site's
   file + (de)serialisation of the messages + the server's aggregation. The site task
   alone (``task_runner.run_task``, ``lloyd``) and the opening of a site's file are also timed
   on their own; the rest of the in-process round is (de)serialisation and aggregation.
3. **A ClientApp process start**: Flower's deployment runs every message in a fresh
   ``flwr-clientapp`` process. Its imports are timed in a fresh interpreter: Flower's
   ClientApp modules alone, then fedcluster's ClientApp on top with the training round's
   site task on the benchmark's site shape (a Lloyd step of one local iteration: NumPy,
   ``kernels/small_work.py``, no Numba), and with one pass through the compiled kernels
   (numba and the kernels from Numba's on-disk cache), as a task of many passes loads them.
4. **Flower's floor**: on the same federation, right after, the no-op app of
   ``bench/noop-app`` runs as many rounds: one message per site, a ClientApp that replies
   at once. The ratio of fedcluster's median training round to its median round is
   reported.

5. **The default run, before and after** (issue 18): DWF at its defaults (k-FED start,
   ``tol`` 1e-4, up to 50 rounds) from ``flwr run`` to model.json, on a federation of
   its own (a fresh SuperLink and 3 SuperNodes on the same files, the same 0.2 s SuperExec
   poll), once with the code of ``--before`` (default 62492cf, the last commit before
   issue 18's work: the ServerApp waits with Flower's ``send_and_receive``, which sleeps
   3 s between pulls, and every phase is a round of its own) unpacked from git, and once
   with this checkout. Wall time, rounds per run and the median training round, each also
   as a ratio to the no-op floor's round.

Flower's share = deployment seconds per round - fedcluster's in-process seconds per round.
The SuperExecs poll for work every 0.2 s here (``FLWR_SUPEREXEC_TASK_POLL_INTERVAL``, set
below; the tests use 0.5 s to spare CPU; Flower's default is 1 s, which adds up to ~1.6 s
per round).

Usage::

    python bench/deployment.py [--rows 100000] [--d 16] [--k 10] [--rounds 10] [--out BENCHMARKS.md]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(ROOT / "tests"))
import report  # noqa: E402

N_SITES = 3
TRAIN_TASK = "lloyd"


def write_sites(directory: Path, rows: int, d: int, k: int) -> list[Path]:
    """Three sites of Gaussian blobs (shared centres), float64 .npy each."""
    rng = np.random.default_rng(0)
    centres = rng.uniform(-10, 10, size=(k, d))
    paths = []
    for i in range(N_SITES):
        X = centres[rng.integers(k, size=rows)] + rng.standard_normal((rows, d))
        path = directory / f"site-{i}.npy"
        np.save(path, X)
        paths.append(path)
    return paths


def run_config(k: int, rounds: int) -> dict:
    # random init and tol 0: every run trains for exactly `rounds` rounds
    return {"algorithm": "dwf", "n-clusters": k, "num-rounds": rounds, "init": "random",
            "tol": 0.0, "min-sites": N_SITES, "seed": 1}


def node_configs(paths: list[Path], cache: Path) -> list[dict]:
    return [{"data-path": str(p), "site-id": str(i), "cache-dir": str(cache)}
            for i, p in enumerate(paths)]


def train_seconds(history: list[dict]) -> list[float]:
    return [float(h["seconds"]) for h in history if h["task"] == TRAIN_TASK]


def credentials(workdir: Path) -> Path:
    """A CA and the SuperLink's TLS certificate for loopback (``deploy/make-credentials.sh``,
    as an operator makes them; the site key it also makes is not used: no SuperNode
    authentication here)."""
    creds = workdir / "creds"
    subprocess.run(["bash", str(ROOT / "deploy" / "make-credentials.sh"), str(creds), "127.0.0.1",
                    "bench-site"], check=True, capture_output=True)
    return creds


def deployment(paths: list[Path], config: dict, workdir: Path,
               tls: Path | None) -> tuple[list[float], dict, list[float]]:
    """One run on a real SuperLink + 3 SuperNodes, then the no-op app (``bench/noop-app``)
    for as many rounds on the same federation: (training-round seconds, model metrics,
    no-op round seconds)."""
    import flower_processes as fp

    import fedcluster

    os.environ["PATH"] = f"{fp.BIN_DIR}{os.pathsep}{os.environ.get('PATH', '')}"
    numba_cache = Path(os.environ.get("NUMBA_CACHE_DIR") or workdir / "numba-cache")
    numba_cache.mkdir(parents=True, exist_ok=True)
    out = workdir / "outputs"
    with fp.sandbox(workdir / "deploy", NUMBA_CACHE_DIR=numba_cache,
                    FEDCLUSTER_CACHE_DIR=workdir / "site-cache") as bed:
        bed.env["FLWR_SUPEREXEC_TASK_POLL_INTERVAL"] = "0.2"
        bed.env["FEDCLUSTER_TEST_SUPERNODE_IDLE"] = ""  # Flower's own 3 s idle pull: its floor
        link = bed.superlink(simulation=False, tls=tls)
        bed.supernodes(link, {f"supernode-{i}": {"data-path": str(p), "site-id": str(i)}
                              for i, p in enumerate(paths)})
        bed.connect("bench", link.control_address, link.ca)
        # a first short run installs the app and fills Numba's cache (not measured)
        bed.run(ROOT, "bench", {**config, "num-rounds": 1, "output-dir": ""}, timeout=600,
                log_name="warm-up")
        run = bed.run(ROOT, "bench", {**config, "output-dir": str(out), "run-name": "bench"},
                      timeout=1800, log_name="bench")
        noop = bed.run(BENCH / "noop-app", "bench",
                       {"num-rounds": config["num-rounds"], "min-sites": N_SITES},
                       timeout=600, log_name="noop")
    model = fedcluster.Model.load(out / "bench" / "model.json")
    floor = [float(s) for s in re.findall(r"noop round \d+: ([\d.]+) s", noop.output)]
    floor.append(noop.seconds)  # the last entry: the no-op run's wall time, flwr run to its end
    return train_seconds(model.history), {"run-seconds": run.seconds, **model.metrics}, floor


#: The last commit before issue 18's work (the "before" of the default-run comparison).
BEFORE = "62492cf"


def default_config(k: int) -> dict:
    """DWF at its defaults (k-FED start, tol 1e-4, up to 50 rounds) on the bench's sites."""
    return {"algorithm": "dwf", "n-clusters": k, "min-sites": N_SITES, "seed": 1}


def unpack(commit: str, directory: Path) -> Path:
    """The app as it was at ``commit`` (``git archive``; the repository is not touched).
    ``flwr run`` packs it into the FAB, and the fresh ServerApp and ClientApp processes put
    the FAB's folder first on ``sys.path``, so its ``fedcluster`` is the one that runs."""
    directory.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", "--format=tar", commit], cwd=ROOT,
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(directory)], input=archive, check=True)
    return directory


def default_runs(app_dir: Path, paths: list[Path], k: int, workdir: Path, name: str,
                 repeats: int, tls: Path | None) -> list[dict]:
    """``repeats`` default runs of the app in ``app_dir`` on a fresh federation (after a
    one-round warm-up that installs the app and fills its Numba cache): per run the wall
    time of ``flwr run`` to model.json, the rounds and their tasks, the training rounds'
    seconds (model.json's history, read as JSON: the format of either version)."""
    import json

    import flower_processes as fp

    config = default_config(k)
    out = workdir / f"outputs-{name}"
    runs = []
    with fp.sandbox(workdir / name, NUMBA_CACHE_DIR=workdir / f"numba-{name}",
                    FEDCLUSTER_CACHE_DIR=workdir / f"site-cache-{name}") as bed:
        bed.env["FLWR_SUPEREXEC_TASK_POLL_INTERVAL"] = "0.2"
        bed.env["FEDCLUSTER_TEST_SUPERNODE_IDLE"] = ""  # Flower's own 3 s idle pull
        link = bed.superlink(simulation=False, tls=tls)
        bed.supernodes(link, {f"supernode-{i}": {"data-path": str(p), "site-id": str(i)}
                              for i, p in enumerate(paths)})
        bed.connect(name, link.control_address, link.ca)
        bed.run(app_dir, name, {**config, "num-rounds": 1, "output-dir": ""}, timeout=900,
                log_name=f"warm-up-{name}")
        for i in range(repeats):
            run = bed.run(app_dir, name, {**config, "output-dir": str(out), "run-name": f"run-{i}"},
                          timeout=1800, log_name=f"{name}-{i}")
            model = json.loads((out / f"run-{i}" / "model.json").read_text())
            history = model["history"]
            runs.append({"seconds": run.seconds, "rounds": len(history),
                         "tasks": [h["task"] for h in history],
                         "round-seconds": [float(h["seconds"]) for h in history],
                         "train": [float(h["seconds"]) for h in history if h["task"] == TRAIN_TASK],
                         "score": model["metrics"]["score"]})
    return runs


def in_process(paths: list[Path], config: dict, workdir: Path) -> tuple[list[float], dict]:
    from fedcluster.simulation import run_in_process

    configs = node_configs(paths, workdir / "site-cache-inproc")
    run_in_process(configs, {**config, "num-rounds": 1, "output-dir": ""})  # warm-up
    result = run_in_process(configs, {**config, "output-dir": ""})
    return train_seconds(result.history), result.metrics


def parts(paths: list[Path], k: int, repeats: int = 5) -> dict[str, float]:
    """The site task of a training round as the run sends it (a Lloyd step that carries
    the evaluation of the centroids sent, on the site's groups, as by default) and the
    opening of a site's file and its kept group table, timed alone."""
    from fedcluster.client_app.data import group_table
    from fedcluster.client_app.data.site_data import load_site_file
    from fedcluster.client_app.task_runner import run_task
    from fedcluster.common import protocol

    cache = paths[0].parent / "parts-cache"
    sites = [group_table.site_groups(load_site_file(p, cache_dir=cache), 2, cache)[0] for p in paths]
    C = np.asarray(sites[0].means[:k], dtype=np.float64)
    params = {"task": TRAIN_TASK, "local-iters": 1, "tol": 0.0, "min-cluster-size": 2,
              protocol.EVALUATE_TOO: True}

    def site_task(groups):
        return run_task(groups, [C], params, 2)

    def open_site(p):
        group_table._MEMORY.clear()
        return group_table.site_groups(load_site_file(p, cache_dir=cache), 2, cache)

    site_task(sites[0])  # compile / load what the task needs

    def best(fn) -> float:
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return min(times)

    task_seconds = [best(lambda s=s: site_task(s)) for s in sites]
    load = best(lambda: [open_site(p) for p in paths]) / len(paths)

    return {"site task (lloyd + the evaluation it carries, on groups), max of 3 sites":
            max(task_seconds),
            "site task (lloyd + the evaluation it carries, on groups), sum of 3 sites":
            sum(task_seconds),
            "open the site's file and group table (per site)": load}


def child_imports(what: str, rows: int, d: int, k: int) -> float:
    """Seconds of a fresh interpreter's imports and, for fedcluster, its first pass on the
    benchmark's site shape (``rows x d``, k centroids): the training round's site task as a
    site runs it (``task_runner.run_task``, ``lloyd`` with one local iteration: a task of a
    few passes, NumPy up to ``small_work.FEW_PASSES_MAX_WORK``), or one Lloyd pass through
    the compiled kernels (numba and the kernels from Numba's on-disk cache: what a task of
    many passes, such as k-FED's local k-means, loads)."""
    site = ("import numpy as np; X = np.random.default_rng(0).standard_normal(({n}, {d})); "
            "C = X[:{k}].copy(); ").format(n=rows, d=d, k=k)
    code = {
        "flower": "import flwr.clientapp, flwr.client",
        "fedcluster": ("import flwr.clientapp, flwr.client; import fedcluster.client_app; "
                       "from fedcluster.client_app.data.site_data import SiteData; "
                       "from fedcluster.client_app.data.group_table import rows_as_groups; "
                       "from fedcluster.client_app.task_runner import run_task; " + site
                       + "run_task(rows_as_groups(SiteData(X, None, None, 'bench')), [C], "
                       "{'task': 'lloyd', 'local-iters': 1, 'tol': 0.0}, 1)"),
        "fedcluster-compiled": ("import flwr.clientapp, flwr.client; import fedcluster.client_app; "
                                "from fedcluster.client_app import local_kmeans as local; "
                                + site + "local.lloyd(X, C, 1, 0.0)"),
    }[what]
    script = f"import time; t0 = time.perf_counter(); {code}; print(time.perf_counter() - t0)"
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          check=True, cwd=ROOT)
    return float(proc.stdout.strip().splitlines()[-1])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=100_000, help="rows per site")
    parser.add_argument("--d", type=int, default=16)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=10, help="training rounds per run")
    parser.add_argument("--import-repeats", type=int, default=5)
    parser.add_argument("--default-runs", type=int, default=2,
                        help="default DWF runs before and after (0: skip the comparison)")
    parser.add_argument("--before", default=BEFORE, help="the commit of the 'before' code")
    parser.add_argument("--no-tls", dest="tls", action="store_false",
                        help="insecure gRPC (default: TLS on every connection, as deployed)")
    parser.add_argument("--out", type=Path, default=None,
                        help="the file to write the section into (e.g. BENCHMARKS.md; "
                        "default: print it only)")
    args = parser.parse_args(argv)
    t_start = time.perf_counter()
    load_before = os.getloadavg()[0]
    config = run_config(args.k, args.rounds)
    with tempfile.TemporaryDirectory(prefix="fcdeploy-") as tmp:
        workdir = Path(tmp)
        paths = write_sites(workdir, args.rows, args.d, args.k)
        tls = credentials(workdir) if args.tls else None
        dep, dep_metrics, noop = deployment(paths, config, workdir, tls)
        noop, noop_run = noop[:-1], noop[-1]
        print(f"deployment: {dep}; no-op app: {noop}", flush=True)
        inproc, in_metrics = in_process(paths, config, workdir)
        print(f"in-process: {inproc}", flush=True)
        pieces = parts(paths, args.k)
        print(f"parts: {pieces}", flush=True)
        compared = {}
        if args.default_runs:
            before_app = unpack(args.before, workdir / "before-app")
            compared["before"] = default_runs(before_app, paths, args.k, workdir, "before",
                                              args.default_runs, tls)
            print(f"default runs, before: {compared['before']}", flush=True)
            compared["now"] = default_runs(ROOT, paths, args.k, workdir, "now", args.default_runs,
                                           tls)
            print(f"default runs, now: {compared['now']}", flush=True)
            # the 'before' really ran the old code: its describe was a round of its own
            assert compared["before"][0]["tasks"][:2] == ["describe", "local_kmeans"], compared
    imports = {what: min(child_imports(what, args.rows, args.d, args.k)
                         for _ in range(args.import_repeats))
               for what in ("flower", "fedcluster", "fedcluster-compiled")}
    print(f"imports: {imports}", flush=True)
    same = np.isclose(dep_metrics["score"], in_metrics["score"], rtol=1e-9)

    dep_round, in_round = statistics.median(dep), statistics.median(inproc)
    floor = statistics.median(noop)
    fc_imports = imports["fedcluster"] - imports["flower"]
    flower = dep_round - in_round - fc_imports
    text = [report.header("Deployment overhead: a real SuperLink + 3 sites on loopback"), ""]
    transport = ("TLS on every connection (a CA and the SuperLink's certificate from "
                 "`deploy/make-credentials.sh`)" if args.tls else "insecure gRPC (`--no-tls`)")
    text.append(
        f"{transport}. DWF, k = {args.k}, {args.rounds} training rounds (random init, tol 0), 3 sites of "
        f"{args.rows:,} x {args.d} float64 rows each (.npy, memory-mapped). Seconds per round = "
        "the ServerApp's wall time of a training round (history `seconds`), median over the "
        "training rounds. fedcluster's time = the same run in-process (the real ServerApp and "
        "ClientApp code, the same files; sites one after the other, so an upper bound) + what "
        "fedcluster adds to the imports of the fresh ClientApp process Flower starts for every "
        "message (its modules and the training task's first pass; the sites' processes run in parallel, so "
        "one process's imports are counted). Flower's = the rest (the SuperExecs' polling every "
        "0.2 s (set by the script), gRPC transport, starting the ClientApp process and "
        "Flower's own imports in it). Same final score in both: "
        f"{'yes' if same else 'NO'}.\n")
    rest = (in_round - pieces["site task (lloyd + the evaluation it carries, on groups), sum of 3 sites"]
            - 3 * pieces["open the site's file and group table (per site)"])
    text += ["| per training round | seconds | share |", "|---|---|---|",
             f"| deployment (SuperLink + 3 SuperNodes, gRPC{' + TLS' if args.tls else ''} on "
             f"loopback) | {dep_round:.3f} | 100% |",
             f"| **fedcluster** | **{in_round + fc_imports:.3f}** "
             f"| **{(in_round + fc_imports) / dep_round:.1%}** |",
             f"| &nbsp;&nbsp;the round in-process | {in_round:.3f} | {in_round / dep_round:.1%} |"]
    for name, seconds in [*pieces.items(), ("the rest of the in-process round: (de)serialisation, "
                                            "the site's ledger and kept row sets, the server's "
                                            "aggregation", rest)]:
        text.append(f"| &nbsp;&nbsp;&nbsp;&nbsp;{name} | {seconds:.4f} | {seconds / dep_round:.1%} |")
    text.append(f"| &nbsp;&nbsp;its imports and first pass in the fresh ClientApp process "
                f"| {fc_imports:.3f} | {fc_imports / dep_round:.1%} |")
    text.append(f"| **Flower** (polling, transport, ClientApp process start and Flower's imports: "
                f"the rest) | **{flower:.3f}** | **{flower / dep_round:.1%}** |")
    text += ["", f"Flower's floor on the same federation, right after: a no-op app "
             "(`bench/noop-app`: its ServerApp sends one message per site per round and waits "
             "with fedcluster's short-poll loop, its ClientApp replies at once and imports "
             f"only Flower), median round {floor:.3f} s ({', '.join(f'{s:.2f}' for s in noop)}). "
             f"fedcluster's median training round is **{dep_round / floor:.2f} x** that floor."]
    text += ["", "Imports of a fresh ClientApp process (Flower starts one per message; best of "
             f"{args.import_repeats}):", "",
             "| fresh interpreter imports | seconds |", "|---|---|",
             f"| Flower's ClientApp modules (`flwr.clientapp`, `flwr.client`) "
             f"| {imports['flower']:.2f} |",
             f"| + fedcluster's ClientApp and the training round's site task (lloyd, one local "
             f"iteration: NumPy, no Numba) on a {args.rows:,} x {args.d} site, k = {args.k} "
             f"| {imports['fedcluster']:.2f} |",
             f"| fedcluster's part | {imports['fedcluster'] - imports['flower']:.2f} |",
             "| + fedcluster's ClientApp and one Lloyd pass through the compiled kernels (Numba "
             "cache) on the same site, as a task of many passes (k-FED's local k-means) loads "
             f"them | {imports['fedcluster-compiled']:.2f} |",
             f"| fedcluster's part | {imports['fedcluster-compiled'] - imports['flower']:.2f} |",
             ""]
    text.append(
        f"Deployment training rounds (s): {', '.join(f'{s:.2f}' for s in dep)}; in-process: "
        f"{', '.join(f'{s:.3f}' for s in inproc)}. Load average (1 min) {load_before:.2f} at "
        f"the start on {os.cpu_count()} cores; total time {time.perf_counter() - t_start:.0f} s.")
    if compared:
        text += ["", *default_run_table(compared, floor, noop_run, args)]
    if (path := report.write_section("deployment", "\n".join(text), args.out)) is not None:
        print(f"wrote {path}")


def default_run_table(compared: dict, floor: float, noop_run: float, args) -> list[str]:
    """The default run before and after, as seconds, rounds and ratios to the floor."""
    def median(key: str, name: str) -> float:
        values = [run[key] for run in compared[name]]
        return statistics.median(values)

    def train(name: str) -> float:
        return statistics.median([s for run in compared[name] for s in run["train"]])

    rows = [("wall time, `flwr run` to model.json (s)", median("seconds", "before"),
             median("seconds", "now"), True),
            ("rounds per run", median("rounds", "before"), median("rounds", "now"), False),
            ("median training round (s)", train("before"), train("now"), True)]
    lines = [f"The default run, before and after: DWF at its defaults (k-FED start, tol 1e-4, "
             f"up to 50 rounds, k = {args.k}) on the same 3 sites, from `flwr run` to model.json, "
             f"{args.default_runs} runs each (median), each on a fresh federation after a "
             f"warm-up run. Before = commit {args.before} (`git archive`: the ServerApp waits "
             "with Flower's `send_and_receive`, 3 s between pulls; describe, the k-FED round "
             "and Davies-Bouldin's pass are rounds of their own); now = this checkout. Ratios "
             f"to the no-op floor's median round ({floor:.3f} s); the no-op app's whole run "
             f"({args.rounds} rounds, `flwr run` to its end) took {noop_run:.1f} s.", "",
             "| default DWF run | before | now | now / before | before / floor round "
             "| now / floor round |", "|---|---|---|---|---|---|"]
    for name, before, now, seconds in rows:
        ratios = (f"{before / floor:.2f} | {now / floor:.2f}" if seconds else "- | -")
        lines.append(f"| {name} | {before:.2f} | {now:.2f} | **{now / before:.2f}** | {ratios} |")
    # What the same number of rounds costs at Flower's floor: the no-op app's run less its
    # rounds is Flower's start and end of a run (submit, ServerApp start, the last pull).
    start_end = noop_run - args.rounds * floor
    rounds_now = median("rounds", "now")
    at_floor = rounds_now * floor + start_end
    lines += ["", f"At Flower's floor a run of {rounds_now:.0f} rounds would take ~{at_floor:.1f} s "
              f"({rounds_now:.0f} x {floor:.2f} s + {start_end:.1f} s of start and end, from the "
              f"no-op app's run) = {at_floor / median('seconds', 'before'):.2f} of the run "
              "before."]
    for name in ("before", "now"):
        run = compared[name][0]
        lines.append("")
        walls = ", ".join(f"{r['seconds']:.1f}" for r in compared[name])
        rounds = ", ".join(f"{task} {seconds:.1f} s" for task, seconds
                           in zip(run["tasks"], run.get("round-seconds", [])))
        lines.append(f"Rounds {name} (the first run's, with the ServerApp's seconds each): "
                     f"{rounds or ', '.join(run['tasks'])}; wall times {walls} s; "
                     f"score {run['score']:.6g}.")
    return lines


if __name__ == "__main__":
    main()

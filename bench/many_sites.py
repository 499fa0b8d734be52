"""Part 4 of bench/scale.py: many small sites (edge devices) in the in-process harness,
with devices that come and go (issue 47).

The sites: n sites of 20 rows x 8 features, k = 5 well-separated Gaussian clusters (unit
spread, centres uniform in [-10, 10]^8, seed 0), each site's rows drawn from 2 of the 5
clusters (devices see a few of the patterns each). Every figure comes from a fresh child
process (its peak RSS is the run's), after a 50-site warm-up run in that child (imports,
Numba's cache and the first-call costs are not the run's).

- **Speed**: DWF, random start, tol 0 (every round runs), Table 1 and the central
  baseline off, as the issue measured it; 5 training rounds at C = 1, 20 at C = 0.01;
  availability 1, and 0.7 with stragglers 0.1 (``simulated-availability``,
  ``simulated-stragglers``). Whole run = the ``fedcluster.simulate`` call, describe to
  evaluation; seconds per training round = the mean of the history's ``seconds`` of the
  training rounds.
- **Flower's floor**: the same harness (``simulation.InProcessGrid``) driving two no-op
  apps with as many sites, in the same child: bench/noop-app (Message API: a config
  record out, a metric record back) and its legacy twin here (a ``NumPyClient`` that
  answers a FitIns carrying a 5 x 8 array at once with the arrays of a Lloyd reply, its
  messages made as ``workflow.fit_round`` makes them: ``FitIns`` <-> ``RecordDict``).
- **Quality**: DWF, mini-batch and FKM at their defaults (k-FED start, tol 1e-4, up to 50
  rounds), the model's score on the pooled rows over central KMeans' (n_init 10,
  random_state 0), at C = 1 with availability 1 and 0.7 (stragglers 0.1), and at C = 0.01
  with availability 0.7 (stragglers 0.1); above 3,000 sites not the second (its 50 rounds
  of 7,000 messages: ~10 minutes per algorithm at 10,000 sites).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

BENCH = Path(__file__).resolve().parent
K, D, ROWS = 5, 8, 20
SIMULATED = {"simulated-availability": 0.7, "simulated-stragglers": 0.1}
# (C, availability): the speed grid's cells; availability 0.7 comes with stragglers 0.1
CELLS = ((1.0, 1.0), (1.0, 0.7), (0.01, 1.0), (0.01, 0.7))
QUALITY_CELLS = ((1.0, 1.0), (1.0, 0.7), (0.01, 0.7))
# Above this many sites the cell (C = 1, availability 0.7) is not run: a partial round
# at C = 1 moves the centroids by more than tol every round, so it runs its 50 rounds,
# ~10 minutes per algorithm at 10,000 sites.
FULL_QUALITY_MAX_SITES = 3000


def quality_cells(n_sites: int) -> tuple:
    """The quality part's cells at ``n_sites``."""
    if n_sites <= FULL_QUALITY_MAX_SITES:
        return QUALITY_CELLS
    return tuple(cell for cell in QUALITY_CELLS if cell != (1.0, 0.7))
ALGORITHMS = ("dwf", "minibatch", "fkm")


def edge_sites(n_sites: int, seed: int = 0) -> list[np.ndarray]:
    """n sites of 20 x 8 rows, each from 2 of the 5 clusters (module docstring)."""
    rng = np.random.default_rng(seed)
    centres = rng.uniform(-10, 10, size=(K, D))
    own = np.argsort(rng.random((n_sites, K)), axis=1)[:, :2]
    which = own[np.arange(n_sites)[:, None], rng.integers(2, size=(n_sites, ROWS))]
    X = centres[which] + rng.standard_normal((n_sites, ROWS, D))
    return list(X)


def cell_config(fraction: float, available: float) -> dict:
    return {"fraction": fraction,
            **({"simulated_availability": available, "simulated_stragglers": 0.1}
               if available < 1 else {})}


def _peak() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM"):
            return int(line.split()[1]) * 1024
    return 0


def _warm_up() -> None:
    import fedcluster

    fedcluster.simulate(edge_sites(50, seed=1), n_clusters=K, init="random", num_rounds=2,
                        tol=0.0, profile=False, central_baseline=False)


# ------------------------------------------------------------------ children
def child_speed(spec: dict) -> dict:
    """One timed DWF run of the speed grid (module docstring)."""
    import fedcluster

    _warm_up()
    sites = edge_sites(spec["sites"])
    rounds = 5 if spec["fraction"] == 1 else 20
    t0, cpu0 = time.perf_counter(), time.process_time()
    result = fedcluster.simulate(sites, n_clusters=K, init="random", tol=0.0, num_rounds=rounds,
                                 profile=False, central_baseline=False,
                                 **cell_config(spec["fraction"], spec["availability"]))
    seconds, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    train = [h for h in result.history if "movement" in h]
    return {"seconds": seconds, "cpu-seconds": cpu, "peak": _peak(),
            "round-seconds": [h["seconds"] for h in train],
            "other-seconds": {h["task"]: h["seconds"] for h in result.history
                              if "movement" not in h},
            "messages": [h["sites-asked"] - h["sites-offline"] for h in train],
            "participation": result.metrics["participation"],
            "score-on-rows": result.metrics["score-on-rows"]}


class _Echo:
    """The legacy no-op site: a NumPyClient that answers a FitIns at once with the arrays
    of a Lloyd reply (the centroids it received and k counts) and an SSE."""

    @staticmethod
    def client_app():
        from flwr.client import NumPyClient
        from flwr.clientapp import ClientApp

        class Echo(NumPyClient):
            def fit(self, parameters, config):
                centroids = parameters[0]
                return [centroids, np.full(len(centroids), 4.0)], ROWS, {"sse": 0.0}

        return ClientApp(client_fn=lambda context: Echo().to_client())


def _legacy_rounds(grid, rounds: int) -> float:
    """Rounds of FitIns messages to every node, made and read as fit_round makes and reads
    them; seconds per message."""
    from flwr.app import Message
    from flwr.app.message_type import MessageType
    from flwr.common import FitIns, ndarrays_to_parameters, parameters_to_ndarrays
    from flwr.compat.common import recorddict_compat as compat

    from fedcluster.server_app.polling import exchange

    nodes = sorted(grid.get_node_ids())
    centroids = np.random.default_rng(0).uniform(size=(K, D))
    t0 = time.perf_counter()
    for server_round in range(1, rounds + 1):
        fitins = FitIns(ndarrays_to_parameters([centroids]),
                        {"task": "lloyd", "local-iters": 1, "tol": 0.0, "round": server_round})
        messages = [Message(compat.fitins_to_recorddict(fitins, True), dst_node_id=node,
                            message_type=MessageType.TRAIN, group_id=str(server_round))
                    for node in nodes]
        for reply in exchange(grid, messages, 600.0):
            parameters_to_ndarrays(compat.recorddict_to_fitres(reply.content, False).parameters)
    return (time.perf_counter() - t0) / (rounds * len(nodes))


def child_floor(spec: dict) -> dict:
    """Flower's floor in the harness: seconds per message of the two no-op apps."""
    from flwr.app import Context, RecordDict
    from flwr.common.constant import SUPERLINK_NODE_ID
    from flwr.supercore.task_identity import TaskIdentity

    from fedcluster.simulation import InProcessGrid

    sys.path.insert(0, str(BENCH / "noop-app"))
    import noop_app

    n, rounds = spec["sites"], 3
    nodes = [{} for _ in range(n)]
    out = {}
    grid = InProcessGrid(noop_app.client, nodes, {})
    # what Flower's ServerApp runtime (and serve_in_process) set before a ServerApp runs
    TaskIdentity.task_id, TaskIdentity.run_id = 1, grid.run.run_id
    TaskIdentity.node_id = SUPERLINK_NODE_ID
    context = Context(run_id=grid.run.run_id, node_id=0, node_config={}, state=RecordDict(),
                      run_config={"num-rounds": rounds, "min-sites": n})
    t0 = time.perf_counter()
    noop_app.server(grid, context)
    out["message-api"] = (time.perf_counter() - t0) / (rounds * n)
    out["legacy"] = _legacy_rounds(InProcessGrid(_Echo.client_app(), nodes, {}), rounds)
    return out


def child_quality(spec: dict) -> dict:
    """Every (algorithm, cell) run of the quality part at n sites: score on the pooled
    rows, rounds, seconds, who answered; and central KMeans on the pooled rows."""
    import fedcluster
    from sklearn.cluster import KMeans

    _warm_up()
    sites = edge_sites(spec["sites"])
    X = np.concatenate(sites)
    central = KMeans(K, n_init=10, random_state=0).fit(X)
    out = {"central": float(central.inertia_ / len(X)), "runs": []}
    for algorithm in spec["algorithms"]:
        for fraction, available in quality_cells(spec["sites"]):
            t0 = time.perf_counter()
            result = fedcluster.simulate(sites, algorithm=algorithm, n_clusters=K, profile=False,
                                         central_baseline=False,
                                         **cell_config(fraction, available))
            out["runs"].append({
                "algorithm": algorithm, "fraction": fraction, "availability": available,
                "seconds": time.perf_counter() - t0, "rounds": result.metrics["rounds"],
                "score-on-rows": result.metrics["score-on-rows"],
                "participation": result.metrics["participation"]})
            print(f"  quality {spec['sites']} {algorithm} C={fraction} a={available}: "
                  f"{out['runs'][-1]}", file=sys.stderr, flush=True)
    return out


CHILDREN = {"edge-speed": child_speed, "edge-floor": child_floor, "edge-quality": child_quality}


# ------------------------------------------------------------------ the section
def _fmt_cell(fraction: float, available: float) -> str:
    return (f"C = {fraction:g}, " + ("availability 1" if available == 1
                                     else f"availability {available:g}, stragglers 0.1"))


def section(speed: dict, floor: dict, quality: dict) -> list[str]:
    """The part's tables and its reading (``speed[(n, C, a)]``, ``floor[n]``,
    ``quality[n]``)."""
    sizes = sorted({n for n, _, _ in speed})
    text = [f"### Many small sites: {sizes[0]:,} to {sizes[-1]:,} devices in process (DWF, "
            "20 x 8 rows a site, k = 5)", "",
            "Sites from 2 of 5 clusters each; every run a fresh process after a 50-site "
            "warm-up. Whole run: `fedcluster.simulate`, describe to evaluation (random "
            "start, tol 0, 5 training rounds at C = 1 and 20 at C = 0.01, no Table 1, no "
            "central baseline). s/round: the mean over the training rounds. Availability "
            "0.7 comes with stragglers 0.1 (`simulated-availability`, "
            "`simulated-stragglers`): answered = sites whose replies a training round used, "
            "per round.", "",
            "| sites | cell | whole run s | s / training round | ms / message | answered / asked "
            "per round | peak RSS MB | score on rows |", "|---|---|---|---|---|---|---|---|"]
    for n in sizes:
        for fraction, available in CELLS:
            r = speed.get((n, fraction, available))
            if r is None:
                continue
            per_round = float(np.mean(r["round-seconds"]))
            per_message = sum(r["round-seconds"]) / max(1, sum(r["messages"])) * 1e3
            p = r["participation"]
            text.append(f"| {n:,} | {_fmt_cell(fraction, available)} | {r['seconds']:.1f} "
                        f"| {per_round:.3f} | {per_message:.2f} | {p['answered'] / p['rounds']:.1f}"
                        f" / {p['asked'] / p['rounds']:.1f} | {r['peak'] / 2**20:.0f} "
                        f"| {r['score-on-rows']:.4f} |")
    text.append("")
    base = speed.get((sizes[0], 1.0, 1.0))
    if base is not None:
        text += [f"Whole run against {sizes[0]:,} sites (C = 1, availability 1; CPU "
                 "seconds of the run's process too, which other work on the machine does not "
                 "inflate):", "",
                 "| sites | whole run s | / the smallest | CPU s | / the smallest | / sites "
                 "ratio (CPU) |", "|---|---|---|---|---|---|"]
        for n in sizes:
            r = speed.get((n, 1.0, 1.0))
            if r is not None:
                ratio = r["seconds"] / base["seconds"]
                cpu = r["cpu-seconds"] / base["cpu-seconds"]
                text.append(f"| {n:,} | {r['seconds']:.1f} | **{ratio:.2f}** | "
                            f"{r['cpu-seconds']:.1f} | {cpu:.2f} | {cpu / (n / sizes[0]):.2f} |")
        text.append("")
    if floor:
        text += ["Flower's floor in the same harness (ms per message; fedcluster's: a "
                 "training round at C = 1, availability 1, over its messages):", "",
                 "| sites | fedcluster (Lloyd round) | no-op legacy app (FitIns/FitRes, NumPyClient) "
                 "| no-op Message app (bench/noop-app) | legacy no-op / fedcluster |",
                 "|---|---|---|---|---|"]
        for n in sorted(floor):
            r = speed.get((n, 1.0, 1.0))
            ours = (sum(r["round-seconds"]) / sum(r["messages"]) * 1e3) if r else float("nan")
            f = floor[n]
            text.append(f"| {n:,} | {ours:.2f} | {f['legacy'] * 1e3:.2f} "
                        f"| {f['message-api'] * 1e3:.2f} | {f['legacy'] * 1e3 / ours:.2f} |")
        text.append("")
    for n in sorted(quality):
        q = quality[n]
        text += [f"Quality at {n:,} sites: score on the pooled rows / central KMeans' "
                 f"({q['central']:.4f}; n_init 10), defaults (k-FED start, tol 1e-4, up to "
                 "50 rounds):", "",
                 "| algorithm | " + " | ".join(_fmt_cell(c, a) for c, a in QUALITY_CELLS)
                 + " |", "|---" * (len(QUALITY_CELLS) + 1) + "|"]
        for algorithm in ALGORITHMS:
            cells = []
            for fraction, available in QUALITY_CELLS:
                run = next((r for r in q["runs"] if r["algorithm"] == algorithm
                            and r["fraction"] == fraction and r["availability"] == available),
                           None)
                cells.append("not run (50 rounds at C = 1: ~10 min per algorithm)"
                             if run is None else
                             f"{run['score-on-rows'] / q['central']:.5f} ({run['rounds']} rounds, "
                             f"{run['seconds']:.0f} s)")
            text.append(f"| {algorithm} | " + " | ".join(cells) + " |")
        text.append("")
    return text + reading(speed, floor, quality)


def reading(speed: dict, floor: dict, quality: dict) -> list[str]:
    """The part's figures against issue 47's targets, in words."""
    sizes = sorted({n for n, _, _ in speed})
    small, large = sizes[0], sizes[-1]
    out = []
    if (large, 1.0, 1.0) in speed and (small, 1.0, 1.0) in speed and large > small:
        ratio = speed[(large, 1.0, 1.0)]["seconds"] / speed[(small, 1.0, 1.0)]["seconds"]
        cpu = speed[(large, 1.0, 1.0)]["cpu-seconds"] / speed[(small, 1.0, 1.0)]["cpu-seconds"]
        out.append(f"Reading: the whole run at {large:,} sites takes {ratio:.2f} x the run at "
                   f"{small:,} ({cpu:.2f} x its CPU time; target: at most 12 x; "
                   f"{large / small:g} x the sites).")
    if (large, 0.01, 1.0) in speed:
        per_round = float(np.mean(speed[(large, 0.01, 1.0)]["round-seconds"]))
        asked = speed[(large, 0.01, 1.0)]["participation"]["asked"] // \
            max(1, speed[(large, 0.01, 1.0)]["participation"]["rounds"])
        out.append(f"A training round at C = 0.01 ({asked} sites) at {large:,} sites takes "
                   f"{per_round:.2f} s (target: at most 2 s).")
    for n in sorted(floor):
        r = speed.get((n, 1.0, 1.0))
        if r is None:
            continue
        ours = sum(r["round-seconds"]) / sum(r["messages"]) * 1e3
        legacy, bare = floor[n]["legacy"] * 1e3, floor[n]["message-api"] * 1e3
        out.append(f"Per message at {n:,} sites: fedcluster {ours:.2f} ms, of which Flower's "
                   f"legacy path (FitIns/FitRes <-> RecordDict, np.save/np.load of every "
                   f"array, the ClientApp's dispatch, the harness's copy of the message) is "
                   f"{legacy:.2f} ms ({100 * legacy / ours:.0f}%), a bare Message "
                   f"{bare:.2f} ms; the rest, {ours - legacy:.2f} ms, is fedcluster's (the "
                   "site's task and policies, the reply's validation and reduction).")
    for n in sorted(quality):
        runs = {(r["algorithm"], r["fraction"], r["availability"]): r for r in quality[n]["runs"]}
        full, partial = runs.get(("dwf", 1.0, 1.0)), runs.get(("dwf", 1.0, 0.7))
        if full and partial:
            central = quality[n]["central"]
            gap = (partial["score-on-rows"] - full["score-on-rows"]) / central
            out.append(f"DWF at {n:,} sites, C = 1: with availability 0.7 and stragglers 0.1 "
                       f"{partial['score-on-rows'] / central:.5f} x central against "
                       f"{full['score-on-rows'] / central:.5f} with every site (difference "
                       f"{gap:+.5f}; target: within 0.002).")
        same = [cell for cell in QUALITY_CELLS if len({round(r["score-on-rows"], 9) for key, r in
                                                      runs.items() if key[1:] == cell}) == 1
                and sum(key[1:] == cell for key in runs) == len(ALGORITHMS)]
        if same:
            out.append(f"At {n:,} sites the three algorithms end on the same centroids in "
                       f"{len(same)} of the cells: at its defaults a mini-batch round (the "
                       "full batch, one epoch, rates 1) is one Lloyd step over the answering "
                       "sites' groups, DWF's step, and FKM's server k-means on the sites' "
                       "local means converges to the same centroids on these separated "
                       "clusters.")
    return [" ".join(out), ""] if out else []


def results_json(speed: dict, floor: dict, quality: dict) -> str:
    """All figures of the part, for bench/logs."""
    return json.dumps({"speed": [{"sites": n, "fraction": c, "availability": a, **r}
                                 for (n, c, a), r in speed.items()],
                       "floor": floor, "quality": quality}, indent=1, default=float)

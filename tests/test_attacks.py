"""Coordinators against a site's real ClientApp (issue 35, must-show 1).

A curious one runs every algorithm at its defaults and subtracts every pair of
per-cluster sums a site sent whose counts differ by one: from sites answering from
their rows it gets rows exactly, from sites at their defaults (groups) none.

A malicious one:

The coordinator writes its own tasks, message by message, to ONE site's real ClientApp
(the in-process Grid calls it as a SuperNode would, keeping its Context between messages)
and tries to read rows out of the replies:

- the hyperplane binary search (two centroids mirrored about a plane moved until one
  cluster gains exactly the rows of one step), with the coordinator's floor at 1 and at 5;
- the three-query form (S1 = A + {x}, S2 = A + D, S3 = D; x = S1 - S2 + S3);
- a four-set combination (S1 - S2 + S3 - S4 = x);
- an SSE oracle through ``evaluate_sets`` (many centroid sets per message) and through
  ``lloyd``'s ``sse`` (one per message): two centroids mirrored about a plane w.x = b,
  the plane set just under the top row's projection (found from the SSE alone), then the
  far centroid nudged along each axis: the SSE differences give that row's coordinates;
- FFCM with a fuzzifier near 1: the fuzzy sums of the side that keeps every other row,
  differenced between two positions of the plane, give the one row between them.

Each attack is first shown to recover a row to 1e-6 from a site that opted out of groups
(node config ``min-cluster-size = 1``: it answers from its rows), so the test can fail;
against a site at its DEFAULT node config (groups of at least 2 rows) nothing it recovers
is closer to any row than a group's mean is to its rows. What the groups do not stop
is in docs/explanation/privacy-model.md.
"""

from __future__ import annotations

import uuid

import numpy as np
import pytest
from flwr.common import FitIns, Message, MessageType, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.compat.common import recorddict_compat as compat
from flwr.supercore.task_identity import TaskIdentity

from fedcluster import client_app as client_module
from fedcluster.client_app.data import group_table
from fedcluster.client_app.data.site_data import SiteData
from fedcluster.common.config import run_config_defaults
from fedcluster.simulation import InProcessGrid, record_parts

OPTED_OUT = {"min-cluster-size": 1}  # the site answers from its rows
DEFAULT: dict = {}  # the site's defaults: groups of at least 2 rows


class Coordinator:
    """A coordinator that writes its own tasks to ONE site's real ClientApp; the site's
    Context (its state) is kept between messages, as a SuperNode keeps it."""

    def __init__(self, X: np.ndarray, node: dict, server_floor: int = 1,
                 algorithm: str = "dwf") -> None:
        self.token = uuid.uuid4().hex
        self.X = np.ascontiguousarray(X, dtype=np.float64)
        client_module.MEMORY_SITES[self.token] = [SiteData(self.X, None, None, "site")]
        config = {"data-path": f"{client_module.MEMORY_PREFIX}{self.token}/0",
                  "site-id": "target", **node}
        self.grid = InProcessGrid(client_module.app, [config],
                                  {**run_config_defaults(), "algorithm": algorithm})
        self.node_id = next(iter(self.grid.contexts))
        self.messages = 0
        self.server_floor = server_floor  # the min-cluster-size its tasks ask for

    def close(self) -> None:
        client_module.MEMORY_SITES.pop(self.token, None)

    def ask(self, task: str, arrays: list[np.ndarray], **params):
        """The site's reply to one task: (arrays, metrics); its refusal raises."""
        self.messages += 1
        TaskIdentity.task_id, TaskIdentity.run_id = 1, self.grid.run.run_id
        TaskIdentity.node_id = SUPERLINK_NODE_ID
        fitins = FitIns(ndarrays_to_parameters([np.asarray(a, dtype=np.float64) for a in arrays]),
                        {"task": task, "min-cluster-size": self.server_floor, **params})
        msg = Message(content=compat.fitins_to_recorddict(fitins, True), dst_node_id=self.node_id,
                      message_type=MessageType.TRAIN, group_id=str(self.messages))
        (reply,) = self.grid.pull_messages(self.grid.push_messages([msg]))
        if reply.has_error():  # under SecAgg+ a site's refusal fails the message
            raise AssertionError(f"the site refused: {reply.error.reason}")
        fitres = compat.recorddict_to_fitres(reply.content, keep_input=True)
        if "error" in fitres.metrics:
            raise AssertionError(f"the site refused: {fitres.metrics['error']}")
        return [np.asarray(a) for a in parameters_to_ndarrays(fitres.parameters)], dict(fitres.metrics)

    def lloyd(self, C: np.ndarray, **params) -> tuple[np.ndarray, np.ndarray, float]:
        """A 'lloyd' reply (means, counts, sse; sse NaN under DP, which sends none)."""
        (means, counts), metrics = self.ask("lloyd", [C], **{"local-iters": 1, "tol": 0.0, **params})
        return means, counts, float(metrics.get("sse", np.nan))

    def refusal(self, C: np.ndarray, **params) -> str:
        """The site's refusal text of a 'lloyd' task (AssertionError: it answered)."""
        try:
            self.lloyd(C, **params)
        except AssertionError as refused:
            return str(refused)
        raise AssertionError("the site answered")


@pytest.fixture
def site_factory():
    made = []

    def make(X, node, **kwargs):
        made.append(Coordinator(X, node, **kwargs))
        return made[-1]

    yield make
    for coordinator in made:
        coordinator.close()


# ------------------------------------------------------------------ what counts as a leak
def is_row(candidate: np.ndarray, X: np.ndarray, tol: float = 1e-6) -> bool:
    """Whether ``candidate`` is one of the rows of ``X`` (to ``tol`` in every coordinate)."""
    return bool(np.any(np.abs(X - candidate).max(axis=1) <= tol))


def own_group_distance(X: np.ndarray, p_site: int = 2) -> np.ndarray:
    """Each row's distance to the mean of its own group (the site's groups at p_site):
    what a coordinator may learn of a row is its group's mean, no closer than this."""
    site = SiteData(X, None, None, "site")
    groups, group_of_row = group_table.build(site, p_site)
    return np.linalg.norm(X - np.asarray(groups.means)[group_of_row], axis=1)


def assert_no_row(candidates: list[np.ndarray | None], X: np.ndarray) -> None:
    """Nothing recovered is closer to any row than that row's own group mean (None: the
    attack isolated no rows at all)."""
    allowed = own_group_distance(X)
    for candidate in candidates:
        if candidate is None:
            continue
        distance = np.linalg.norm(X - candidate, axis=1)
        closer = np.flatnonzero(distance < allowed - 1e-9)
        assert closer.size == 0, (candidate, X[closer], distance[closer], allowed[closer])
        assert not is_row(candidate, X)


def site_rows(n: int = 400, d: int = 3, seed: int = 5) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, d))


# ------------------------------------------------------------------ the curious coordinator
# Replies whose arrays are per-cluster means and counts (their product is a sum) or the
# evaluation's sums and counts.
MEAN_REPLIES = {"lloyd", "minibatch", "kmeanspp", "prune_lloyd", "local_kmeans", "gtv"}


def disclosed_sums(replies: list[dict], site_key: str) -> tuple[np.ndarray, np.ndarray]:
    """Every per-cluster (sum, count) one site sent in a run."""
    sums, counts = [], []
    for r in replies:
        if r["metrics"].get("site-key") != site_key or not r["arrays"]:
            continue
        # per task whose statistics the reply carries (simulation.record_parts)
        for task, arrays, _ in record_parts(r):
            if task in MEAN_REPLIES:
                means, n = arrays[0], arrays[1]
                cluster_sums = means * n[:, None]
            elif task == "evaluate":
                n, cluster_sums = arrays[0], arrays[1]
            else:
                continue
            for j in np.flatnonzero(n > 0):
                sums.append(cluster_sums[j])
                counts.append(int(n[j]))
    return np.array(sums), np.array(counts)


def rows_recovered(sums: np.ndarray, counts: np.ndarray, X: np.ndarray) -> set[int]:
    """The site rows equal (to 1e-9) to the difference of two sums whose counts differ by 1."""
    found: set[int] = set()
    for a in range(len(counts)):
        for b in np.flatnonzero(counts == counts[a] + 1):
            candidate = sums[b] - sums[a]
            error = np.abs(X - candidate).max(axis=1)
            found.update(np.flatnonzero(error <= 1e-9 * (1.0 + np.abs(candidate).max())).tolist())
    return found


def leaked_rows(replies: list[dict], sites: list[np.ndarray]) -> int:
    return sum(len(rows_recovered(*disclosed_sums(replies, str(i)), X)) for i, X in enumerate(sites))


def public_table(name: str) -> tuple[list[np.ndarray], int]:
    """A public table, z-scored, over 5 sites (a seeded shuffle), and its number of classes."""
    from sklearn import datasets

    X, y = {"iris": datasets.load_iris, "wine": datasets.load_wine}[name](return_X_y=True)
    X = (X - X.mean(axis=0)) / X.std(axis=0)
    rows = np.array_split(np.random.default_rng(0).permutation(len(X)), 5)
    return [X[r] for r in rows], len(np.unique(y))


# (algorithm, table, extra run config): each leaks rows from sites answering from rows.
HONEST_RUNS = [
    ("dwf", "iris", {}),
    ("ewf", "iris", {}),
    ("minibatch", "iris", {}),
    ("fkm", "iris", {}),
    ("kfed", "iris", {}),
    ("gtv", "wine", {}),
    # FFCM's fuzzy replies are no sums of row sets; its evaluation rounds are.
    ("ffcm", "iris", {"eval_every": 1}),
]


@pytest.mark.parametrize("algorithm, name, extra", HONEST_RUNS, ids=[r[0] for r in HONEST_RUNS])
def test_an_honest_default_run_gives_a_differencing_coordinator_no_row(algorithm, name, extra):
    import fedcluster

    sites, k = public_table(name)
    leaks = {}
    for label, node in (("rows", OPTED_OUT), ("groups", DEFAULT)):
        replies: list[dict] = []
        fedcluster.simulate(sites, algorithm=algorithm, n_clusters=k, record_replies=replies,
                            site_config=node, **extra)
        leaks[label] = leaked_rows(replies, sites)
    assert leaks["rows"] >= 1, "the data must show the leak the groups stop"
    assert leaks["groups"] == 0


# ------------------------------------------------------------------ the binary search
def binary_search(site: Coordinator, d: int, span: float = 10.0, max_messages: int = 80):
    """Two centroids mirrored about the plane x_0 = h; bisect h until the first cluster's
    count steps (m to m + s, s the rows of the step); the difference of the two replies'
    sums over s is the mean of the rows that crossed (one row, when s is 1)."""
    e0 = np.eye(d)[0]

    def ask(h):
        means, counts, _ = site.lloyd(np.stack([(h - 1.0) * e0, (h + 1.0) * e0]))
        return means[0] * counts[0], int(counts[0])

    lo, hi = -span, span
    sum_lo, m_lo = ask(lo)
    sum_hi, m_hi = ask(hi)
    target = (m_lo + m_hi) // 2  # the count the search steps over
    while site.messages < max_messages and hi - lo > 1e-12:
        mid = (lo + hi) / 2
        s, m = ask(mid)
        if m <= target:
            lo, sum_lo, m_lo = mid, s, m
        else:
            hi, sum_hi, m_hi = mid, s, m
        if m_hi > m_lo and hi - lo <= 1e-12 or m_hi - m_lo == 1:
            break
    return [(sum_hi - sum_lo) / (m_hi - m_lo)]


@pytest.mark.parametrize("server_floor", [1, 5])
def test_the_binary_search_gets_a_row_only_from_a_site_that_answers_from_rows(site_factory,
                                                                              server_floor):
    X = site_rows()
    opted_out = site_factory(X, OPTED_OUT, server_floor=server_floor)
    candidates = binary_search(opted_out, X.shape[1])
    assert is_row(candidates[0], X) and opted_out.messages <= 60
    grouped = site_factory(X, DEFAULT, server_floor=server_floor)
    assert_no_row(binary_search(grouped, X.shape[1]), X)


# ------------------------------------------------------------------ the three-query form
def three_query_site(a_rows: int = 40, d_rows: int = 20) -> tuple[np.ndarray, np.ndarray]:
    """Rows on the line y = 0: A in [0, 1], D in [2, 3]; the target x* = (1.5, 1) off it."""
    rng = np.random.default_rng(11)
    A = np.column_stack([rng.uniform(0, 1, a_rows), np.zeros(a_rows)])
    D = np.column_stack([rng.uniform(2, 3, d_rows), np.zeros(d_rows)])
    target = np.array([1.5, 1.0])
    return np.vstack([A, D, target]), target


# Centroids whose first cluster is S1 = A + {x*}, S2 = A + D, S3 = D (worked out by hand;
# test_the_queries_build_the_sets_they_claim checks each set).
THREE_QUERIES = [
    np.array([[0.75, 0.3], [2.5, 0.0]]),    # S1 = A + {x*}   (D in the second)
    np.array([[1.5, -0.5], [1.5, 1.5]]),    # S2 = A + D      ({x*} alone in the second)
    np.array([[2.5, 0.0], [0.6, 0.2]]),     # S3 = D          (A + {x*} in the second)
]


def halfplane(normal, point, t: float = 1.0) -> np.ndarray:
    """Two centroids whose first cluster is the half-plane normal . (x - point) < 0."""
    normal = np.asarray(normal, dtype=np.float64) / np.linalg.norm(normal)
    return np.stack([point - t * normal, point + t * normal])


def four_set_site() -> tuple[np.ndarray, np.ndarray]:
    """Rows on y = 0: A in [0, 1], D in [2, 3], E in [4, 5]; the target x* = (1.5, 1)."""
    rng = np.random.default_rng(12)
    parts = [np.column_stack([rng.uniform(lo, lo + 1, 30), np.zeros(30)]) for lo in (0, 2, 4)]
    target = np.array([1.5, 1.0])
    return np.vstack([*parts, target]), target


# S1 = A + {x*} (x < 1.75), S2 = A + D (0.4 x + y < 1.4), S3 = D + E (x - y > 1.75),
# S4 = E (x > 3.5): S1 - S2 + S3 - S4 = x*.
FOUR_QUERIES = [halfplane([1, 0], [1.75, 0]), halfplane([0.4, 1], [3.5, 0]),
                halfplane([-1, 1], [1.75, 0]), halfplane([-1, 0], [3.5, 0])]


def test_the_queries_build_the_sets_they_claim():
    from fedcluster.common import kernels
    X, _ = three_query_site()
    A, D, target = set(range(40)), set(range(40, 60)), 60
    first = [set(np.flatnonzero(kernels.assign(X, C)[0] == 0)) for C in THREE_QUERIES]
    assert first == [A | {target}, A | D, D]
    X, _ = four_set_site()
    A, D, E, target = set(range(30)), set(range(30, 60)), set(range(60, 90)), 90
    first = [set(np.flatnonzero(kernels.assign(X, C)[0] == 0)) for C in FOUR_QUERIES]
    assert first == [A | {target}, A | D, D | E, E]


def combine(site: Coordinator, queries: list[np.ndarray]) -> np.ndarray | None:
    """The alternating sum of the first clusters' sums, over the alternating sum of their
    counts: the mean of the rows the combination isolates (one row's count is 1; None:
    the counts cancel, no row is isolated)."""
    signs = [(-1) ** i for i in range(len(queries))]
    replies = [site.lloyd(C) for C in queries]
    total = sum(s * means[0] * counts[0] for s, (means, counts, _) in zip(signs, replies))
    rows = sum(s * int(counts[0]) for s, (_, counts, _) in zip(signs, replies))
    return total / rows if rows else None


@pytest.mark.parametrize("make_site, queries", [(three_query_site, THREE_QUERIES),
                                                (four_set_site, FOUR_QUERIES)],
                         ids=["three-query", "four-set"])
def test_set_combinations_get_a_row_only_from_a_site_that_answers_from_rows(
        site_factory, make_site, queries):
    X, target = make_site()
    recovered = combine(site_factory(X, OPTED_OUT), queries)
    np.testing.assert_allclose(recovered, target, rtol=0, atol=1e-12)
    assert_no_row([combine(site_factory(X, DEFAULT), queries)], X)


# ------------------------------------------------------------------ the SSE oracle
def sse_oracle_attack(sse_of, d: int, direction: np.ndarray, span: float = 10.0,
                      grid: int = 32, delta: float = 1.0, max_rounds: int = 12) -> np.ndarray:
    """The top row along ``direction`` from the site's SSE alone (``sse_of(sets)``: the
    site's SSE against each centroid set).

    For the plane w.x = b, the centroids c1 = (b - delta) w and c2 = (b + delta) w give
    SSE(c1, c2) - SSE(c1, c1) = -4 delta sum over the rows above b of (w.x - b): its
    slope in b is 4 delta times the rows above b, its value their distance. A grid of
    planes per message finds a b with one row (the coordinator's estimate) above, then
    c2 nudged by eps along each axis moves the SSE by -2 eps (x_j - c2_j) + eps^2 for
    that row: its coordinates."""
    w = direction / np.linalg.norm(direction)

    def pair(b):
        c1, c2 = (b - delta) * w, (b + delta) * w
        return [np.stack([c1, c1]), np.stack([c1, c2])]

    seen: dict[float, int] = {}  # every plane asked, and the rows above it
    lo, hi = -span, span
    for _ in range(max_rounds):
        planes = np.linspace(lo, hi, grid)
        h = (planes[1] - planes[0]) / 4  # the slope's step: within the grid's spacing
        sets = [s for b in planes for s in (*pair(b), *pair(b + h))]
        sse = np.asarray(sse_of(sets)).reshape(grid, 4)
        gap = sse[:, 1] - sse[:, 0]  # -4 delta sum (w.x - b) over the rows above
        above = np.rint((sse[:, 3] - sse[:, 2] - gap) / (4 * delta * h)).astype(int)
        seen.update(zip(planes.tolist(), above.tolist()))
        top = np.flatnonzero(above > 0)
        if top.size == 0:
            raise AssertionError("no row above any plane: widen the span")
        i = top[-1]
        if above[i] == 1 or planes[1] - planes[0] < 1e-6:
            break  # one row above; or as alone as it gets
        lo, hi = planes[i], planes[min(i + 1, grid - 1)] + h  # several rows: a finer grid
    rows = int(above[i])
    t_top = planes[i] - gap[i] / (4 * delta * rows)  # (their mean projection; one row: its own)
    # The count above the plane falls as the plane rises: between the lowest and the
    # highest plane asked with `rows` above, every plane has them (and only them) above.
    same = sorted(b for b, n in seen.items() if n == rows and b < t_top)
    lowest, highest = same[0], same[-1]
    b = (lowest + highest) / 2 if highest > lowest else lowest
    eps = min(1e-3, (t_top - b) / 8, (b - lowest) / 8 if highest > lowest else 1e-3)
    c1, c2 = (b - delta) * w, (b + delta) * w
    nudged = [np.stack([c1, c2 + eps * e]) for e in np.eye(d)]
    sse = np.asarray(sse_of([np.stack([c1, c2]), *nudged]))
    change = sse[1:] - sse[0]  # rows * (-2 eps (x_j - c2_j) + eps^2)
    return c2 + (rows * eps * eps - change) / (2 * rows * eps)


def outlier_rows() -> np.ndarray:
    """400 rows in 3-D with a few rows standing out along the axes (what an attacker
    goes for first)."""
    X = site_rows()
    for j, sign in ((0, 1), (0, -1), (1, 1)):
        X[np.argmax(sign * X[:, j]), j] += sign * 1.0
    return X


DIRECTIONS = [np.array([1.0, 0, 0]), np.array([-1.0, 0, 0]), np.array([0, 1.0, 0])]


def evaluate_sets_oracle(site: Coordinator):
    return lambda sets: site.ask("evaluate_sets", [np.stack(sets)])[0][0]


def lloyd_sse_oracle(site: Coordinator):
    return lambda sets: [site.lloyd(C)[2] for C in sets]


@pytest.mark.parametrize("oracle", [evaluate_sets_oracle, lloyd_sse_oracle],
                         ids=["evaluate_sets", "lloyd-sse"])
def test_the_sse_oracle_gets_rows_only_from_a_site_that_answers_from_rows(site_factory, oracle):
    X = outlier_rows()
    opted_out = site_factory(X, OPTED_OUT, server_floor=5)
    found = [sse_oracle_attack(oracle(opted_out), 3, w) for w in DIRECTIONS]
    assert all(is_row(row, X) for row in found)
    if oracle is evaluate_sets_oracle:
        assert opted_out.messages <= 15  # a few messages of many sets each
    grouped = site_factory(X, DEFAULT, server_floor=5)
    assert_no_row([sse_oracle_attack(oracle(grouped), 3, w) for w in DIRECTIONS], X)


# ------------------------------------------------------------------ FFCM near m = 1
def ffcm_top_row(site: Coordinator, d: int, m: float = 1.01, delta: float = 2.0,
                 span: float = 10.0, margin: float = 0.3) -> np.ndarray:
    """With a fuzzifier near 1 the memberships are nearly hard: two centres mirrored about
    the plane x_0 = b; bisect b until the fuzzy weight above it is one half (the top
    row on the plane), step the plane ``margin`` below it and read the upper centre,
    the fuzzy mean of what lies above: the top row, to the weight of the others."""
    e0 = np.eye(d)[0]

    def ask(b):
        (centres, weights), _ = site.ask("fcm", [np.stack([(b - delta) * e0, (b + delta) * e0])],
                                         **{"fuzzifier": m, "local-iters": 1})
        return centres, weights

    lo, hi = -span, span
    for _ in range(60):
        mid = (lo + hi) / 2
        if ask(mid)[1][1] > 0.5:
            lo = mid
        else:
            hi = mid
    centres, weights = ask(lo - margin)
    return centres[1]


def test_ffcm_near_m_1_gets_a_row_only_from_a_site_that_answers_from_rows(site_factory):
    X = outlier_rows()
    assert np.sort(X[:, 0])[-1] - np.sort(X[:, 0])[-2] > 1.0  # the top row stands out
    recovered = ffcm_top_row(site_factory(X, OPTED_OUT, algorithm="ffcm"), 3)
    assert is_row(recovered, X)
    assert_no_row([ffcm_top_row(site_factory(X, DEFAULT, algorithm="ffcm"), 3)], X)


# ------------------------------------------------------------------ differential privacy
def test_a_site_dp_policy_leaves_the_best_placed_attack_an_error_the_noise_implies(site_factory):
    """DP answers from rows (clipped, noised). The site's own DP policy (require-dp,
    dp-budget epsilon 1 for all runs, the clipping box given): the coordinator cannot ask
    plain tasks, and even one that already knows where a row crosses between its two
    clusters (found on a copy of the site answering from its rows) and spends the whole
    budget on the two queries that bracket it gets the row only up to the noise; a third
    query is refused."""
    from fedcluster.common import privacy

    X = site_rows()
    d = X.shape[1]
    (row,) = binary_search(site_factory(X, OPTED_OUT), d)  # the exact row
    direction = np.eye(d)[0]
    h = row[0]
    brackets = [h - 1e-9, h + 1e-9]
    rho_total = privacy.rho_from_epsilon(1.0, 1e-5)
    dp = {"dp-rho": rho_total / 2, "dp-rho-planned": rho_total, "data-bounds": "-6:6"}
    site = site_factory(X, {"require-dp": True, "dp-budget": "1"}, server_floor=2)
    plane = lambda b: np.stack([(b - 1.0) * direction, (b + 1.0) * direction])  # noqa: E731
    assert "site policy require-dp" in site.refusal(plane(h))
    replies = [site.lloyd(plane(b), **dp) for b in brackets]
    assert "site policy dp-budget=1,1e-05" in site.refusal(plane(h), **dp)
    (m_lo, n_lo, _), (m_hi, n_hi, _) = replies
    recovered = m_lo[0] * n_lo[0] - m_hi[0] * n_hi[0]  # the row moved out of cluster 0
    lo, hi = np.full(d, -6.0), np.full(d, 6.0)
    sigma = privacy.sums_counts_sigma(lo, hi, rho_total / 2)
    # Each released sum carries noise of std sigma per coordinate (here 7 box diameters),
    # their difference sigma sqrt(2): the "row" comes out box widths away from it. (The
    # site's noise is seeded in simulation, so the figure is the same every run.)
    error = float(np.linalg.norm(recovered - row))
    assert sigma > 5 * privacy.l2_diameter(lo, hi) and error > sigma / 2, (error, sigma)

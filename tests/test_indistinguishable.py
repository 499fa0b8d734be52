"""Two sites whose rows differ but whose group tables are equal give identical replies
(issue 35, must-show 2): every reply is a function of the groups' statistics.

Site B's rows are site A's reflected through their group's mean (x -> 2 mean - x, cell by
cell over the present cells): each group keeps its count, its per-feature sums and
per-feature squared deviations, its missing cells and its labels, so its table is the
same, while no row of B is a row of A. The rows are dyadic (integers / 4) about integer
centres, so every sum and square is exact and the two tables are equal bit for bit; the
test checks that first (the grouping must find the same groups on both), then sends
both sites' real ClientApps the same messages: every task of the protocol, its plain
and (for the tasks SecAgg+ carries) secure variant, with honest inputs and crafted ones
(centroids on the site's rows, duplicates, a fuzzifier near 1, a clipping box through
the groups, a scaling with odd factors, a server floor of 1), and asks for identical
replies, bit for bit. Differential privacy answers from rows (clipped, noised) and is
not covered: its guarantee is its own.
"""

from __future__ import annotations

import json
import uuid

import numpy as np
import pytest
from flwr.common import Context, RecordDict

from fedcluster import client_app as client_module
from fedcluster.client_app.app import SiteClient
from fedcluster.client_app.data import group_table
from fedcluster.client_app.data.schema_table import plain_schema
from fedcluster.client_app.data.site_data import SiteData
from fedcluster.client_app.site_groups import TableFacts
from fedcluster.client_app.data.tables import encode_labels
from fedcluster.common import protocol
from fedcluster.common import secure_codec as secure
from fedcluster.common.config import run_config_defaults
from fedcluster.common.scaling import FeatureTransform

D = 3


def mirrored_sites(seed: int = 0, n_clumps: int = 60) -> tuple[SiteData, SiteData]:
    """Sites A and B: clumps of three rows about integer centres far apart; B's rows are
    A's reflected through their clump's mean. Some clumps miss a cell (the other two
    cells of that feature mirror each other), every row has a label. The centres lie in
    pairs c, -c, and a clump that misses a cell of feature j is centred at 0 in j: the
    grouping sees a missing cell at its column's mean (0), so in the clump."""
    rng = np.random.default_rng(seed)
    half = rng.integers(1, 9, size=(n_clumps // 2, D)) * rng.choice([-64.0, 64.0], size=(n_clumps // 2, D))
    centres = np.vstack([half, -half])
    gaps = np.arange(0, len(centres), 5)
    centres[gaps, gaps % D] = 0.0  # the clumps that miss a cell of feature i % D
    _, first = np.unique(centres, axis=0, return_index=True)
    keep = np.sort(first)
    rows, mirrored = [], []
    for i, centre in zip(keep, centres[keep]):
        a, b = rng.integers(-4, 5, size=D), rng.integers(-4, 5, size=D)
        offsets = np.stack([a, b, -(a + b)]) * 0.25
        if i % 5 == 0:  # feature i % D missing in the clump's third row
            j = i % D
            offsets[:, j] = [offsets[0, j], -offsets[0, j], np.nan]
        rows.append(centre + offsets)
        mirrored.append(centre - offsets)
    labels = rng.choice(["mild", "severe", "none"], size=3 * len(centres))
    header = [f"f{j}" for j in range(D)] + ["diagnosis"]
    schema = plain_schema(header, "site", label_column="diagnosis", missing="impute-mean")

    def site(X):
        missing = {f"f{j}": int(np.isnan(X[:, j]).sum()) for j in range(D)}
        codes, names = encode_labels(sorted(set(labels)), np.searchsorted(sorted(set(labels)), labels))
        return SiteData(np.ascontiguousarray(X), tuple(header[:D]), codes, "site", names,
                        TableFacts(schema, "", 0, missing))

    return site(np.vstack(rows)), site(np.vstack(mirrored))


@pytest.fixture(scope="module")
def sites():
    A, B = mirrored_sites()
    assert not (set(map(tuple, np.nan_to_num(A.X))) & set(map(tuple, np.nan_to_num(B.X))))
    tables = [group_table.build(s, 2)[0] for s in (A, B)]
    assert tables[0].digest == tables[1].digest  # the premise: equal group tables
    assert (np.asarray(tables[0].counts) == 3).all() and tables[0].has_missing
    return A, B


def client(site: SiteData, node: dict | None = None) -> tuple[SiteClient, str]:
    token = uuid.uuid4().hex
    client_module.MEMORY_SITES[token] = [site]
    context = Context(run_id=7, node_id=11, state=RecordDict(), run_config=run_config_defaults(),
                      node_config={"data-path": f"{client_module.MEMORY_PREFIX}{token}/0",
                                   "site-id": "target", **(node or {})})
    return SiteClient(context), token


FILL = FeatureTransform.fill_only(np.array([1.5, -2.25, 0.75]))
ODD = FeatureTransform("standard", np.array([3.0, -7.5, 0.125]), np.array([0.3, 17.0, 2.5]),
                       np.array([1.5, -2.25, 0.75]))


def messages(A: SiteData):
    """(task, arrays, params) for every task: honest inputs and crafted ones."""
    X = np.nan_to_num(A.X)
    honest = np.unique(np.round(X[::9] / 64.0) * 64.0, axis=0)[:6]
    on_rows = X[[0, 1, 2, 7]]  # centroids placed on the site's rows
    duplicate = np.stack([X[4], X[4], X[5]])
    sets = np.stack([honest[:4], on_rows, np.stack([X[0], X[3], X[9], X[12]])])
    out = [("describe", [], {}), ("impute_stats", [], {})]
    for transform, floor in ((FILL, 2), (ODD, 1), (FILL, 5)):
        t = {"transform": transform.encode(), "min-cluster-size": floor}
        C = transform.apply(np.where(np.isnan(A.X[:4]), 0.0, A.X[:4])) if transform is ODD else on_rows
        out += [
            ("stats", [], {**t, "scale": "standard"}), ("stats", [], {**t, "scale": "minmax"}),
            ("bounds", [], t),
            ("value_range", [], t),
            ("local_kmeans", [], {**t, "k-local": 7, "seed": 3}),
            ("kmeanspp", [], {**t, "k-local": 5, "seed": 4}),
            ("kmeanspp", [], {**t, "k-local": 5, "seed": 4, "init": "random"}),
            ("prune_lloyd", [honest], {**t, "local-iters": 3, "tol": 0.0}),
            ("lloyd", [honest], {**t, "local-iters": 1, "tol": 0.0,
                                 protocol.EVALUATE_TOO: True}),
            ("lloyd", [C], {**t, "local-iters": 4, "tol": 0.0}),
            ("lloyd", [duplicate], {**t, "local-iters": 1, "tol": 0.0, "data-bounds": "-100:100"}),
            ("minibatch", [honest], {**t, "epochs": 2, "batch-size": 7, "beta": 0.5, "seed": 1,
                                     protocol.FAR_ROWS: 4}),
            ("minibatch", [C], {**t, "epochs": 1, "batch-size": 0, "beta": 1.0, "seed": 1}),
            ("fcm", [honest], {**t, "fuzzifier": 2.0, "local-iters": 2}),
            ("fcm", [C], {**t, "fuzzifier": 1.01, "local-iters": 1}),
            ("gtv", [], {**t, "alpha": 1.0, "local-iters": 3, "tol": 0.0, "n-clusters": 4,
                         "seed": 2}),
            ("gtv", [honest[:4], np.stack([on_rows, honest[:4]])],
             {**t, "alpha": 0.5, "local-iters": 2, "tol": 0.0}),
            ("evaluate_sets", [sets], t),
            ("evaluate", [honest], {**t, "fuzzifier": 2.0}),
            ("evaluate", [C], t),
            ("evaluate_distances", [honest, honest + 0.5], t),
            ("evaluate_distances", [C, on_rows], t),
            ("profile", [honest, honest, np.full(D, -600.0), np.full(D, 600.0), np.zeros(D)],
             {**t, protocol.BINS: 50}),
            # centroids and references on rows, a narrow range cut into fine bins
            ("profile", [C, on_rows, X.min(axis=0), X.min(axis=0) + 1.0, np.zeros(D)],
             {**t, protocol.BINS: 4000, "data-bounds": "-100:100"}),
        ]
    return out


SECURE_TERMS = {"lloyd": ["n", "sse", "wc", "w-int", "c"], "minibatch": ["n", "wc", "w-int", "c"],
                "fcm": ["n", "wc", "w", "c"],
                "evaluate": ["n", "sse", "silhouette-sum", "counts", "sums", "sqnorms", "hidden",
                             "distances"],
                "evaluate_distances": ["n", "distances"],
                "profile": ["n", *(protocol.PROFILE_TERM + f for f in protocol.ClusterProfile._fields)]}


def answer(site: SiteClient, task: str, arrays: list, params: dict, secure_round: bool):
    config = {"task": task, **params}
    if secure_round:  # (a secure run re-seeds no cluster: no far rows)
        config.pop(protocol.FAR_ROWS, None)
        terms = SECURE_TERMS[task]
        config[secure.SECURE_PARAM] = json.dumps({"terms": terms, "scales": [1e9] * len(terms)})
    try:
        out, n_rows, metrics = site.fit([np.asarray(a, dtype=np.float64) for a in arrays], config)
    except Exception as err:  # a secure round's refusal fails the message
        return ("raised", str(err))
    return [np.asarray(a) for a in out], n_rows, metrics


def same(a, b) -> bool:
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.asarray(a).shape == np.asarray(b).shape and np.array_equal(a, b, equal_nan=True)
    return a == b


def test_every_task_covered():
    A, _ = mirrored_sites()
    asked = {task for task, _, _ in messages(A)}
    assert asked == set(protocol.TASKS)
    assert set(SECURE_TERMS) == set(protocol.SECURE_TASKS)


@pytest.mark.parametrize("secure_round", [False, True], ids=["plain", "secure"])
def test_equal_group_tables_give_identical_replies(sites, secure_round):
    A, B = sites
    (site_a, token_a), (site_b, token_b) = client(A), client(B)
    try:
        compared, tasks_answered = 0, set()
        for task, arrays, params in messages(A):
            if secure_round and task not in protocol.SECURE_TASKS:
                continue
            reply_a = answer(site_a, task, arrays, params, secure_round)
            reply_b = answer(site_b, task, arrays, params, secure_round)
            assert same(reply_a, reply_b), (task, params, reply_a, reply_b)
            # (a crafted input may be refused, alike by both: a NaN from a fuzzifier
            # near 1 cannot be summed securely)
            answered = reply_a[0] != "raised" and "error" not in reply_a[2]
            compared += answered
            tasks_answered |= {task} if answered else set()
        assert compared >= (22 if secure_round else 60)
        # every task (secure: every sum) was answered at least once, not only refused
        assert tasks_answered == set(protocol.SECURE_TASKS if secure_round else protocol.TASKS)
    finally:
        client_module.MEMORY_SITES.pop(token_a, None)
        client_module.MEMORY_SITES.pop(token_b, None)


def test_sites_answering_from_rows_tell_the_two_apart(sites):
    """The same messages to the same sites opted out of groups (min-cluster-size 1):
    their replies differ, so the test above could fail."""
    A, B = sites
    (site_a, token_a), (site_b, token_b) = client(A, OPT_OUT), client(B, OPT_OUT)
    try:
        task, arrays, params = next(m for m in messages(A) if m[0] == "lloyd")
        assert not same(answer(site_a, task, arrays, params, False),
                        answer(site_b, task, arrays, params, False))
    finally:
        client_module.MEMORY_SITES.pop(token_a, None)
        client_module.MEMORY_SITES.pop(token_b, None)


OPT_OUT = {"min-cluster-size": 1}

"""Leakage audit (issue 8, must-show 3): what leaves a site, in a full run of every
algorithm, discloses no row, no row count of the site's shape, and no count under the
privacy floor.

The in-process harness records every reply that leaves a site (``simulate(...,
record_replies=list)``: arrays, metrics, the task and its parameters). Each algorithm
(and scaling, and the interim evaluation rounds) runs on seeded non-IID sites in which
every site holds a few rows (fewer than the floor p) of two of the four groups, so
clusters under the floor DO occur and must be withheld. The checker :func:`audit` then
asserts, for every recorded reply:

- no array has a dimension equal to the site's number of rows;
- every count array (cluster sizes, contingency cells, local k-means sizes) has no
  entry in 1..p-1, and every integer array is a known count or flag array (so a new
  count cannot slip past the audit unclassified);
- no array holds one of the site's rows (raw, or as the task saw it under the run's
  scaling transform): every row of a float array whose last dimension is d, including
  1-D arrays of length d, is compared with the site's rows;
- metrics are scalars or short strings (a JSON list in a string holds names only), and
  no float metric equals a value of the site's data;
- a label the site names (``label-names``) has at least p rows there.

The audit found one leak, fixed in ``common/tasks.py``: the evaluation named every label
a site holds (``label-names``), also those with fewer than p rows there (a rare diagnosis
at a hospital), while their contingency cells were withheld.

The audit can fail: the same run with the floor off (p = 1) is caught sending small
counts and naming rare labels, and hand-made replies carrying a row, a per-row array or
a list of values are caught too.

Tables read through a schema (the imputation round ``impute_stats``: sums, counts and
histogram bins of present cells, and describe's counts of missing cells) are audited on
the clinical demo in ``tests/test_imputation.py`` (``test_leakage_audit_of_the_imputation_round``).
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

import fedcluster
from fedcluster.common import scaling
from fedcluster.common.algorithms import ALGORITHMS
from fedcluster.common.privacy import PrivacyLeakWarning
from fedcluster.simulation import record_parts, record_tasks
from test_attacks import leaked_rows

P = 5  # the privacy floor of the audited runs (run-config min-cluster-size)
K, D = 4, 3
# Site sizes: primes above every other dimension a reply can have (k = 4, d = 3,
# k-local <= 6, 4 sites in GTV's evaluate_sets, <= 4 labels in a contingency table),
# so a dimension equal to a site's size can only be a per-row array.
SITE_ROWS = (53, 59, 61, 67)
MINORITY = 2  # rows of each of a site's two minority groups: fewer than P
CENTRES = 8.0 * np.array([[0, 0, 0], [1, 0, 0], [0, 1, 0], [0, 0, 1]], dtype=np.float64)

# Which arrays of a task's reply are counts (no entry in 1..P-1) or 0/1 flags.
COUNT_ARRAYS = {
    "local_kmeans": (1,), "lloyd": (1,), "minibatch": (1, 3), "kmeanspp": (1,),
    "prune_lloyd": (1,), "gtv": (1,), "evaluate": (0, 5),
    # Table 1's profile: cluster sizes and rows counted (a cluster it shows, the site
    # sends whole: its present cells and bins are sums of its groups', however few)
    "profile": (0, 1),
}
# Integer arrays that are not floored: functions of the site's groups (Table 1's present
# cells, histogram bins and present cells withheld by the lone-cell rule; the table's
# own rule applies to the pooled counts).
GROUP_COUNT_ARRAYS = {"profile": (2, 5, 7)}
# which clusters (evaluate) or cells (profile) were withheld
FLAG_ARRAYS = {"evaluate": (3,), "profile": (6,)}
MAX_METRIC_TEXT = 200  # characters; feature and label names are short


def make_sites() -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Four non-IID sites: most rows from groups i and i+1, MINORITY rows of the others."""
    rng = np.random.default_rng(8)
    sites, labels = [], []
    for i, n in enumerate(SITE_ROWS):
        minor = [(i + 2) % K, (i + 3) % K]
        major = n - MINORITY * len(minor)
        y = np.concatenate([np.full(major // 2, i), np.full(major - major // 2, (i + 1) % K),
                            np.repeat(minor, MINORITY)])
        rng.shuffle(y)
        sites.append(CENTRES[y] + rng.normal(size=(n, D)))
        labels.append(y)
    return sites, labels


SITES, LABELS = make_sites()


# ------------------------------------------------------------------ the checker


def _site_views(X: np.ndarray, params: dict) -> list[np.ndarray]:
    """The site's rows as stored and as the task saw them (under the run's transform)."""
    views = [X]
    if "transform" in params:
        views.append(scaling.scaled_rows(X, "audit", str(params["transform"])))
    return views


def _holds_a_row(a: np.ndarray, views: list[np.ndarray]) -> bool:
    """Whether any length-d row of ``a`` equals (to 1e-9 relative) one of the rows."""
    rows = np.asarray(a, dtype=np.float64).reshape(-1, D)
    for data in views:
        close = np.abs(rows[:, None, :] - data[None, :, :]) <= 1e-9 * (1.0 + np.abs(data))
        if close.all(axis=2).any():
            return True
    return False


def _array_problems(task: str, arrays: list[np.ndarray], n_rows: int, views, floor: int):
    counts, flags = COUNT_ARRAYS.get(task, ()), FLAG_ARRAYS.get(task, ())
    for i, a in enumerate(np.asarray(a) for a in arrays):
        if n_rows in a.shape:
            yield f"array {i} {a.shape} has a dimension equal to the site's {n_rows} rows"
        if a.dtype.kind in "iub" and i not in counts + flags + GROUP_COUNT_ARRAYS.get(task, ()):
            yield f"array {i} is integer but neither a known count nor a flag array"
        if i in counts and np.any((a >= 1) & (a < floor)):
            yield f"count array {i} has entries under the floor {floor}: {a.ravel().tolist()}"
        if i in flags and not np.isin(a, (0, 1)).all():
            yield f"flag array {i} holds values other than 0/1"
        if i in flags and floor > 1 and a.ndim == 1 and not np.array_equal(
                a != 0, np.asarray(arrays[0]) == 0):
            # A flag that sets a withheld cluster (1..p-1 members) apart from an empty
            # one would say which clusters the site holds a few rows of.
            yield f"flag array {i} says more than the zero counts: {a.ravel().tolist()}"
        if i in flags and floor > 1 and a.ndim == 2 and not np.all(
                a[np.asarray(arrays[0]) == 0] == 1):
            # the profile's cells: every cell of a withheld or empty cluster flagged alike
            yield f"flag array {i} sets a withheld cluster apart from an empty one"
        if a.dtype.kind == "f" and a.ndim >= 1 and a.shape[-1] == D and _holds_a_row(a, views):
            yield f"array {i} {a.shape} contains one of the site's data rows"


def _metric_problems(metrics: dict, views):
    values = np.concatenate([v.ravel() for v in views])
    for key, value in metrics.items():
        if isinstance(value, str):
            if len(value) > MAX_METRIC_TEXT:
                yield f"metric {key!r} is a long string ({len(value)} characters)"
            try:
                parsed = json.loads(value)
            except ValueError:
                continue
            if isinstance(parsed, list) and not all(isinstance(v, str) for v in parsed):
                yield f"metric {key!r} is a list of values, not of names"
        elif not isinstance(value, (bool, int, float)):
            yield f"metric {key!r} is a {type(value).__name__}, not a scalar"
        elif isinstance(value, float) and np.any(np.abs(values - value)
                                                 <= 1e-12 * (1 + abs(value))):
            yield f"metric {key!r} = {value!r} is a value of the site's data"


def _label_problems(metrics: dict, y: np.ndarray | None, floor: int):
    """A label the site names must have at least ``floor`` rows there: naming a label
    tells that the site holds rows of it (a group under the floor, e.g. a rare diagnosis)."""
    if "label-names" not in metrics or y is None:
        return
    names, sizes = np.unique(np.asarray(y).astype(str), return_counts=True)
    size = dict(zip(names.tolist(), sizes.tolist()))
    small = [n for n in json.loads(metrics["label-names"]) if size.get(n, 0) < floor]
    if small:
        yield f"label-names names labels with fewer than {floor} rows: {small}"


def audit(records: list[dict], sites: list[np.ndarray], floor: int,
          labels: list[np.ndarray] | None = None) -> list[str]:
    """Every problem found in the recorded replies (empty: nothing leaks).

    ``records`` are the harness's records; a reply's site is its ``site-key`` metric,
    the index into ``sites`` (the harness names in-memory sites "0", "1", ...) and into
    ``labels`` (the sites' labels, integer codes, if the run had them).
    """
    problems = []
    for rec in records:
        site = int(rec["metrics"]["site-key"])
        X = sites[site]
        y = None if labels is None else labels[site]
        views = _site_views(X, rec.get("params", {}))
        # per task whose statistics the reply carries (a describe's carried first task, a
        # training round's evaluation: simulation.record_parts)
        for task, arrays, metrics in record_parts(rec):
            found = [*_array_problems(task, arrays, X.shape[0], views, floor),
                     *_metric_problems(metrics, views),
                     *_label_problems(metrics, y, floor)]
            problems += [f"site {site}, task {task}: {p}" for p in found]
    return problems


# ------------------------------------------------------------------ the runs

COMMON = {"n_clusters": K, "num_rounds": 3, "tol": 0.0, "seed": 0, "min_sites": 2}
CASES = {
    # name: (run config, tasks the run must have recorded)
    # (a converged run: the evaluation's distances stand for Davies-Bouldin's second
    # pass, which the one-shot and fuzzy runs below still send)
    "dwf": ({"algorithm": "dwf"}, {"describe", "local_kmeans", "lloyd", "evaluate"}),
    # (init random without data-bounds: a bounds round, which the sites must allow)
    "dwf-random-local-iters": ({"algorithm": "dwf", "init": "random", "local_iters": 3}, {"bounds", "lloyd"}),
    "ewf": ({"algorithm": "ewf", "local_iters": 2}, {"local_kmeans", "lloyd"}),
    "minibatch": ({"algorithm": "minibatch", "batch_size": 16, "epochs": 2}, {"minibatch"}),
    "minibatch-full": ({"algorithm": "minibatch"}, {"minibatch"}),
    "fkm": ({"algorithm": "fkm"}, {"local_kmeans", "prune_lloyd"}),
    "fkm-kmeans++": ({"algorithm": "fkm", "init": "kmeans++"}, {"kmeanspp", "prune_lloyd"}),
    "fkm-random": ({"algorithm": "fkm", "init": "random", "local_iters": 2},
                   {"kmeanspp", "prune_lloyd"}),
    "kfed": ({"algorithm": "kfed", "k_local": 6},
             {"local_kmeans", "evaluate", "evaluate_distances"}),
    "ffcm-avg1": ({"algorithm": "ffcm", "aggregation": "avg1"},
                  {"lloyd", "fcm", "evaluate"}),
    "ffcm-avg2": ({"algorithm": "ffcm", "aggregation": "avg2", "local_iters": 2},
                  {"lloyd", "fcm", "evaluate"}),
    "ffcm-kfed": ({"algorithm": "ffcm", "init": "kfed"}, {"local_kmeans", "fcm", "evaluate"}),
    "ffcm-random": ({"algorithm": "ffcm", "init": "random"},
                    {"bounds", "fcm", "evaluate"}),
    "gtv": ({"algorithm": "gtv", "local_iters": 2}, {"gtv", "evaluate_sets"}),
    "scale-standard": ({"algorithm": "dwf", "scale": "standard"}, {"stats", "lloyd"}),
    "scale-minmax": ({"algorithm": "dwf", "scale": "minmax", "init": "random"}, {"stats", "bounds", "lloyd"}),
    "eval-every": ({"algorithm": "dwf", "eval_every": 1}, {"lloyd", "evaluate"}),
    # the sum-only start's Lloyd rounds (grown clusters' sums and counts, under the floor)
    "divisive": ({"algorithm": "dwf", "init": "divisive"}, {"lloyd", "evaluate"}),
}


def recorded_run(config: dict, floor: int = P) -> tuple[list[dict], fedcluster.SimulationResult]:
    records: list[dict] = []
    result = fedcluster.simulate(SITES, labels=LABELS, record_replies=records,
                                 min_cluster_size=floor, **{**COMMON, **config})
    return records, result


@pytest.mark.parametrize("name", sorted(CASES))
def test_nothing_leaks(name):
    config, tasks = CASES[name]
    records, result = recorded_run(config)
    seen = {task for rec in records for task in record_tasks(rec)}
    assert tasks | {"profile"} <= seen, \
        f"the run recorded {sorted(seen)}, not all of {sorted(tasks)} and profile"
    # every site took part to the end (none was dropped, so none escaped the audit)
    assert result.metrics["n-sites"] == len(SITES) and not result.metrics["site-failures"]
    assert {rec["metrics"]["site-key"] for rec in records} == {"0", "1", "2", "3"}
    # the floor withheld clusters at some site (so the count check below is not vacuous)
    evaluations = [arrays for rec in records for task, arrays, _ in record_parts(rec)
                   if task == "evaluate"]
    assert any(arrays[3].any() for arrays in evaluations)
    if name == "eval-every":  # an interim evaluation after every training round
        assert len(evaluations) > 2 * len(SITES)
    assert audit(records, SITES, P, LABELS) == []
    # (unscaled runs, where a difference of sums would be a raw row) subtracting every
    # pair of a site's reported sums gives no row: the sites answer from their groups
    if "scale" not in config:
        assert leaked_rows(records, SITES) == 0


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_every_algorithm_at_its_defaults_warns_of_no_leak(algorithm):
    """No default run needs a round outside the aggregates-only promise: none raises a
    PrivacyLeakWarning, and none sends per-feature minima or maxima."""
    records: list[dict] = []
    with warnings.catch_warnings():
        warnings.simplefilter("error", PrivacyLeakWarning)
        fedcluster.simulate(SITES, algorithm=algorithm, n_clusters=K, record_replies=records)
    tasks = {task for rec in records for task in record_tasks(rec)}
    assert "describe" in tasks and "bounds" not in tasks and "stats" not in tasks


#: Secure aggregation and DP at their defaults (the start: ``divisive``), per algorithm
#: that accepts them.
PRIVATE_DEFAULTS = {
    "secure-dwf": {"algorithm": "dwf", "secure_aggregation": True, "secagg_data_bound": 12.0},
    "secure-ewf": {"algorithm": "ewf", "secure_aggregation": True, "secagg_data_bound": 12.0},
    "secure-minibatch": {"algorithm": "minibatch", "secure_aggregation": True,
                         "secagg_data_bound": 12.0},
    "secure-ffcm": {"algorithm": "ffcm", "aggregation": "avg1", "secure_aggregation": True,
                    "secagg_data_bound": 12.0},
    "dp-dwf": {"algorithm": "dwf", "dp_epsilon": 10.0, "data_bounds": "-4:12"},
    "dp-ewf": {"algorithm": "ewf", "dp_epsilon": 10.0, "data_bounds": "-4:12"},
}


@pytest.mark.parametrize("name", sorted(PRIVATE_DEFAULTS))
def test_secure_and_dp_defaults_warn_of_no_leak_and_send_no_extremes(name):
    """Under secure aggregation and DP (with data-bounds) the default start sends sums
    and counts only: no PrivacyLeakWarning, no per-feature minima or maxima (issue 21)."""
    records: list[dict] = []
    with warnings.catch_warnings():
        warnings.simplefilter("error", PrivacyLeakWarning)
        result = fedcluster.simulate(SITES, n_clusters=K, record_replies=records,
                                     **PRIVATE_DEFAULTS[name])
    tasks = {task for rec in records for task in record_tasks(rec)}
    assert "bounds" not in tasks and "stats" not in tasks and "local_kmeans" not in tasks
    assert result.centroids.shape == (K, D)
    assert audit([rec for rec in records if rec["task"]], SITES, 1, LABELS) == []


def test_distributed_dp_sends_only_masked_vectors():
    """DWF under distributed DP (dp-epsilon with secure-aggregation): every DP round is a
    SecAgg+ sum, so what leaves a site there is its masked vector alone (no array, no
    metric but its key); the plain rounds (describe) pass the audit as above."""
    config = {"algorithm": "dwf", "init": "random", "dp_epsilon": 2.0, "data_bounds": "-4:12",
              "secure_aggregation": True, "secagg_data_bound": 12.0}
    records, result = recorded_run(config)
    assert result.metrics["dp-mode"] == "distributed" and not result.metrics["site-failures"]
    replies = [rec for rec in records if rec["task"]]  # the others: SecAgg+'s keys and shares
    private = [rec for rec in replies if "dp-rho" in rec["params"]]
    # (no Davies-Bouldin round under DP: it is not released)
    assert {rec["task"] for rec in private} == {"lloyd", "evaluate"}
    assert all(rec["arrays"] == [] and set(rec["metrics"]) == {"site-key"} for rec in private)
    assert audit(replies, SITES, P, LABELS) == []


def test_minibatch_far_rows_of_a_reseed_leak_nothing():
    """A dead cluster (a start far from every row): the minibatch rounds then carry each
    site's farthest rows' mean and count (protocol.FAR_ROWS), a cluster like any other."""
    start = CENTRES.copy()
    start[3] = 500.0
    records, result = recorded_run({"algorithm": "minibatch", "init_centroids": start,
                                    "num_rounds": 8})
    far = [rec for rec in records if "far-rows" in rec.get("params", {})]
    assert far and all(len(rec["arrays"]) == 4 for rec in far)
    assert any(np.asarray(rec["arrays"][3])[0] >= P for rec in far)  # some were reported
    assert audit(records, SITES, P, LABELS) == []
    assert np.abs(result.centroids).max() < 100  # the dead cluster was re-seeded


def test_choose_k_leaks_nothing():
    """A k-range run (every k from 2 to 5 on the same federation, k + 1 warm-started from
    k's centroids, n-init 2 so that cold starts run too) passes the same audit."""
    from fedcluster.simulation import serve_in_process, site_nodes

    records: list[dict] = []
    run_config = {"algorithm": "dwf", "k-range": "2:5", "n-init": 2, "num-rounds": 3,
                  "tol": 0.0, "seed": 0, "min-sites": 2, "min-cluster-size": P,
                  "output-dir": ""}
    with site_nodes(SITES, LABELS) as nodes:
        record = serve_in_process(nodes, run_config, None, records)
    per_k = json.loads(str(record["choose-k"]))["per-k"]
    assert sorted(int(k) for k in per_k) == [2, 3, 4, 5]
    assert {"describe", "local_kmeans", "lloyd", "evaluate"} <= {
        task for rec in records for task in record_tasks(rec)}
    assert {rec["metrics"]["site-key"] for rec in records} == {"0", "1", "2", "3"}
    assert audit(records, SITES, P, LABELS) == []


# ------------------------------------------------------- the audit can fail


def test_audit_catches_counts_under_the_floor():
    """Without the floor (p = 1) the same data make sites send clusters of 1..4 members."""
    records, _ = recorded_run({"algorithm": "dwf"}, floor=1)
    problems = audit(records, SITES, P, LABELS)
    assert any("local_kmeans: count array 1 has entries under the floor" in p for p in problems)
    # ... and name the labels of which they hold only MINORITY rows
    assert "site 0, task evaluate: label-names names labels with fewer than 5 rows: ['2', '3']" \
        in problems
    assert any("evaluate: count array 5 has entries under the floor" in p for p in problems)
    # ... and profile their clusters' cells with counts of 2..4 (groups of 2)
    assert any("task profile: count array 0 has entries under the floor" in p for p in problems)


def _fake(task: str, arrays: list, metrics: dict | None = None, site: int = 1) -> dict:
    return {"task": task, "arrays": [np.asarray(a) for a in arrays], "params": {},
            "metrics": {"site-key": str(site), **(metrics or {})}, "num-examples": 0}


def test_audit_catches_a_data_row():
    C = np.array(CENTRES)
    C[2] = SITES[1][17]  # a centroid that is a row of site 1
    problems = audit([_fake("lloyd", [C, np.array([9, 9, 9, 9])])], SITES, P)
    assert problems == ["site 1, task lloyd: array 0 (4, 3) contains one of the site's data rows"]
    # a row as a 1-D array, and a row of another site is not site 1's
    assert audit([_fake("bounds", [SITES[1][3], SITES[1][3] + 1])], SITES, P) == [
        "site 1, task bounds: array 0 (3,) contains one of the site's data rows"]
    assert audit([_fake("bounds", [SITES[2][3], SITES[2][3] + 1])], SITES, P) == []


def test_audit_catches_a_scaled_row():
    """Under a scaling transform the task sees scaled rows; a scaled row is a leak too."""
    records, _ = recorded_run({"algorithm": "dwf", "scale": "standard"})
    params = next(r["params"] for r in records if "transform" in r["params"])
    scaled = scaling.scaled_rows(SITES[0], "audit", str(params["transform"]))
    rec = {**_fake("lloyd", [scaled[:4], np.full(4, 9)], site=0), "params": params}
    assert audit([rec], SITES, P) == [
        "site 0, task lloyd: array 0 (4, 3) contains one of the site's data rows"]


def test_audit_catches_per_row_arrays_and_value_lists():
    n = SITE_ROWS[1]
    labels = np.zeros(n, dtype=np.int64)  # an assignment per row
    problems = audit([_fake("evaluate", [np.full(4, 9), np.zeros((4, 3)), np.zeros(4),
                                         np.zeros(4, dtype=np.int64), np.zeros(4), labels])],
                     SITES, P)
    assert problems == [f"site 1, task evaluate: array 5 ({n},) has a dimension equal to the "
                        f"site's {n} rows"]
    row = json.dumps(SITES[1][0].tolist())  # short enough, but a list of values
    value = float(SITES[1][5, 2])
    odd = audit([_fake("lloyd", [np.zeros((4, 3)), np.full(4, 9), np.zeros(4, dtype=np.int64)],
                       {"row": row, "x": value, "notes": "n" * (MAX_METRIC_TEXT + 1)})],
                SITES, P)
    assert odd == [
        "site 1, task lloyd: array 2 is integer but neither a known count nor a flag array",
        "site 1, task lloyd: metric 'row' is a list of values, not of names",
        f"site 1, task lloyd: metric 'x' = {value!r} is a value of the site's data",
        f"site 1, task lloyd: metric 'notes' is a long string ({MAX_METRIC_TEXT + 1} characters)",
    ]

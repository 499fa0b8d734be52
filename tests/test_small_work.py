"""The NumPy path of the distance kernels (fedcluster/common/kernels/small_work.py):
the same references and special cases as the compiled kernels, agreement with them,
a choice that depends on the shape and the task alone, and a site process that never imports Numba
for a small task."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from fedcluster.client_app.task_runner import is_few_pass_task
from fedcluster.common import kernels
from fedcluster.common.kernels import fuzzy as fuzzy_kernels
from fedcluster.common.kernels import small_work

# The reference tests of test_kernels.py, collected again here, where the fixture below
# sends every call to the NumPy path (test_kernels.py sends them to the compiled one).
from test_kernels import (  # noqa: F401  (collected by pytest)
    test_assign_matches_reference,
    test_empty_cluster_has_zero_sums_and_counts,
    test_empty_data,
    test_fcm_stats_matches_reference,
    test_minibatch_epoch_matches_reference,
    test_minibatch_full_batch_beta_one_is_a_lloyd_step,
    test_float32_close_to_float64_truth,
    test_float64_centroids_are_rounded_to_float32_data,
    test_lloyd_stats_matches_reference,
    test_min_sq_dist_update_matches_reference,
    test_nan_propagates,
    test_non_contiguous_inputs_are_accepted,
    test_special_cases_have_what_they_claim,
    test_ties_go_to_lowest_index,
)


@pytest.fixture(autouse=True)
def numpy_path(monkeypatch):
    monkeypatch.setattr(small_work, "NUMPY_MAX_WORK", 1 << 62)


def compiled(monkeypatch):
    monkeypatch.setattr(small_work, "NUMPY_MAX_WORK", -1)


SHAPES = [(1, 1, 1), (500, 4, 3), (3001, 6, 2), (700, 8, 64), (2049, 1, 5), (5000, 20, 10)]


@pytest.mark.parametrize("n,k,d", SHAPES)
def test_numpy_and_compiled_paths_agree(n, k, d, monkeypatch):
    """(float32 on the NumPy path: the reference tests above, collected from
    test_kernels.py, run in both dtypes.)"""
    rng = np.random.default_rng(n + k + d)
    X = rng.normal(size=(n, d))
    C = X[rng.choice(n, k)] + 0.01
    current = rng.uniform(0, 3, size=n)
    runs = {}
    for path in ("numpy", "compiled"):
        if path == "compiled":
            compiled(monkeypatch)
        labels, dist = kernels.assign(X, C)
        lloyd = kernels.lloyd_stats(X, C)
        evaluation = kernels.evaluation_stats(X, C)
        means = lloyd[0] / np.maximum(lloyd[1], 1)[:, None]
        runs[path] = (labels, dist, *lloyd, *evaluation,
                      *kernels.distance_to_means(X, C, means),
                      kernels.min_sq_dist_update(X, C[:2], current))
    a, b = runs["numpy"], runs["compiled"]
    np.testing.assert_array_equal(a[0], b[0])  # labels
    for got, want in zip(a[1:], b[1:]):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-9)


@pytest.mark.parametrize("n,k,d", [(500, 4, 3), (3001, 6, 2), (700, 8, 16), (50, 3, 2)])
def test_fuzzy_minibatch_and_gtv_paths_agree(n, k, d, monkeypatch):
    rng = np.random.default_rng(n * k)
    X = rng.normal(size=(n, d))
    C = X[rng.choice(n, k)] + 0.01
    C[0] = X[3]  # a row on a centre: membership 1 there
    order = rng.permutation(n)
    neighbours = rng.normal(size=(2, k, d))
    runs = {}
    for path in ("numpy", "compiled"):
        if path == "compiled":
            compiled(monkeypatch)
        got = []
        for m in (2.0, 1.7):
            got += [*fuzzy_kernels.fcm_stats(X, C, m), fuzzy_kernels.fcm_memberships(X, C, m)]
        for batch in (1, 7, n):
            gamma = C.copy()
            got += [kernels.minibatch_epoch(X, order, batch, gamma, 0.7), gamma]
        for floor, N in ((1, neighbours), (50, neighbours), (1, np.zeros((0, k, d)))):
            got += list(kernels.gtv_update(X, C, N, 0.5, floor))
        runs[path] = got
    for got, want in zip(runs["numpy"], runs["compiled"]):
        if np.asarray(want).dtype.kind == "i":  # hard counts, mini-batch's Lambda, sizes
            np.testing.assert_array_equal(got, want)
        else:
            np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)


def test_evaluation_stats_silhouette_and_norms_match_a_direct_computation():
    X = np.array([[0.0, 0.0], [1.0, 0.0], [4.0, 0.0], [6.0, 0.0]])
    C = np.array([[0.0, 0.0], [5.0, 0.0]])
    sums, counts, sqnorms, sse, sil = kernels.evaluation_stats(X, C)
    np.testing.assert_array_equal(counts, [2, 2])
    np.testing.assert_array_equal(sums, [[1.0, 0.0], [10.0, 0.0]])
    np.testing.assert_array_equal(sqnorms, [1.0, 52.0])
    assert sse == 3.0
    # (b - a) / max(a, b) per row: 1, (4-1)/4, (4-1)/4, (6-1)/6
    assert sil == pytest.approx(1 + 0.75 + 0.75 + 5 / 6, rel=1e-15)
    one_centre = kernels.evaluation_stats(X, C[:1])
    assert one_centre[4] == 0.0 and one_centre[3] == 53.0


def test_the_choice_depends_on_the_shape_alone(monkeypatch):
    # (monkeypatch: the limit set here used to stay for the worker's later tests)
    monkeypatch.setattr(small_work, "NUMPY_MAX_WORK", 1000)
    limit = small_work.NUMPY_MAX_WORK
    assert small_work.small(np.zeros((100, 5)), 2)        # 1000 multiply-adds
    assert not small_work.small(np.zeros((101, 5)), 2)
    assert small_work.small(np.zeros((0, 5)), 2)
    assert limit == small_work.NUMPY_MAX_WORK


SITE_PROCESS = textwrap.dedent('''
    import json, sys
    import numpy as np
    from fedcluster.client_app.data import group_table
    from fedcluster.client_app.data.site_data import load_site_file
    from fedcluster.client_app.task_runner import run_task
    path, cache, p_site, lloyd_iters, make = sys.argv[1:]
    site = load_site_file(path, cache_dir=cache)
    groups, _ = group_table.site_groups(site, int(p_site), cache)
    if make == "make":  # the site's first message: it groups its rows (once per version)
        print(json.dumps("numba" in sys.modules))
        raise SystemExit
    C = np.asarray(groups.means[:5]).copy()
    for task, arrays, extra in [("describe", [], {}),
                                ("lloyd", [C], {"local-iters": int(lloyd_iters), "tol": 0.0}),
                                ("evaluate", [C], {}), ("evaluate_distances", [C, C], {})]:
        run_task(groups, arrays, {"task": task, **extra}, int(p_site))
    print(json.dumps(sorted(m for m in ("numba", "sklearn", "scipy", "matplotlib")
                            if m in sys.modules)))
''')


@pytest.mark.parametrize("p_site", [1, 2])
@pytest.mark.parametrize("rows,lloyd_iters,heavy", [(3000, 2, []), (40000, 2, ["numba", "scipy"]),
                                                     (40000, 1, []), (900000, 1, ["numba", "scipy"])])
def test_a_site_process_loads_numba_only_for_work_that_needs_it(rows, lloyd_iters, heavy, p_site,
                                                                tmp_path):
    """As a fresh ClientApp process of a deployed site whose group table is kept (its
    first message made it, loading Numba for the grouping when p_site > 1): 3000 x 8
    rows against 5 centroids (120,000 multiply-adds per pass over the rows, fewer over
    the groups) run describe, lloyd and both evaluation tasks without importing Numba
    (or scikit-learn, SciPy, matplotlib); 40,000 rows (1.6 M per pass, over
    NUMPY_MAX_WORK) go to the compiled kernels for a Lloyd step of 2 local iterations
    (Numba brings SciPy in for its BLAS check), but not when every task is one of a few
    passes (a Lloyd step of one iteration, the evaluations: up to FEW_PASSES_MAX_WORK);
    900,000 rows (36 M per pass) are over that too. At p_site = 2 a pass goes over the
    groups, some 2.5 times fewer: 40,000 rows make ~16,000 groups (0.64 M per pass, under
    NUMPY_MAX_WORK) and 900,000 some 360,000 (14 M, under FEW_PASSES_MAX_WORK)."""
    if p_site == 2 and (rows, lloyd_iters) in ((40000, 2), (900000, 1)):
        heavy = []
    path = tmp_path / "site.npy"
    np.save(path, np.random.default_rng(0).normal(size=(rows, 8)))
    base = [sys.executable, "-c", SITE_PROCESS, str(path), str(tmp_path / "cache"), str(p_site),
            str(lloyd_iters)]
    made = subprocess.run(base + ["make"], check=True, capture_output=True, text=True, timeout=300)
    assert json.loads(made.stdout.strip().splitlines()[-1]) is (p_site > 1)
    out = subprocess.run(base + ["answer"], check=True, capture_output=True, text=True, timeout=300)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == heavy


def test_few_pass_tasks_raise_the_numpy_limit_only_inside_the_task(monkeypatch):
    monkeypatch.setattr(small_work, "NUMPY_MAX_WORK", 1000)
    monkeypatch.setattr(small_work, "FEW_PASSES_MAX_WORK", 5000)
    X = np.zeros((500, 5))  # 5000 multiply-adds against 2 centres
    assert not small_work.small(X, 2)
    with small_work.few_passes():
        assert small_work.small(X, 2) and not small_work.small(np.zeros((501, 5)), 2)
        with small_work.few_passes(False):
            assert not small_work.small(X, 2)
        monkeypatch.setattr(small_work, "NUMPY_MAX_WORK", -1)  # a test forcing compiled
        assert not small_work.small(X, 2)
    monkeypatch.setattr(small_work, "NUMPY_MAX_WORK", 1000)
    assert not small_work.small(X, 2)
    assert is_few_pass_task("evaluate", {}) and is_few_pass_task("evaluate_distances", {})
    assert is_few_pass_task("lloyd", {"local-iters": 1})
    assert not is_few_pass_task("lloyd", {"local-iters": 3})
    assert not is_few_pass_task("local_kmeans", {})
    assert not is_few_pass_task("fcm", {"local-iters": 1})


REPORT_PROCESS = textwrap.dedent('''
    import json, sys
    sys.path.insert(0, sys.argv[1])
    import numpy as np
    from fedcluster.common.kernels import small_work
    path, cache, step, path_kind = sys.argv[2:6]
    if path_kind == "compiled":
        small_work.ROW_ORDER_MAX_VALUES = -1
    from record_check import RunSite
    site = RunSite({"data-path": path, "min-cluster-size": 2}, cache, "error")
    if step == "describe":
        site.ask("describe", [])
        raise SystemExit
    X = np.loadtxt(path, delimiter=",", skiprows=1)
    arrays, metrics = site.ask("evaluate", [X[:4] + 0.01], report=True)
    print(json.dumps({"numba": "numba" in sys.modules, "arrays": [a.tobytes().hex() for a in arrays],
                      "metrics": {k: repr(v) for k, v in metrics.items()}}))
''')


def test_a_small_site_answers_a_report_without_numba_and_the_same_bits(tmp_path):
    """The report's parts (the model's clusters cutting the site's groups) are made from
    the rows by the row-order passes; on a small site (3,000 x 5) they run in NumPy, so
    the ClientApp process answering the report never imports Numba, and answers what the
    compiled passes give, bit for bit."""
    from pathlib import Path

    rng = np.random.default_rng(5)
    X = np.r_[rng.normal(size=(1500, 5)), rng.normal(size=(1500, 5)) + 4]
    path = tmp_path / "site.csv"
    np.savetxt(path, X, delimiter=",", header=",".join(f"f{j}" for j in range(5)), comments="")
    tests = str(Path(__file__).resolve().parent)
    answers = {}
    for kind in ("numpy", "compiled"):
        base = [sys.executable, "-c", REPORT_PROCESS, tests, str(path), str(tmp_path / kind)]
        subprocess.run(base + ["describe", kind], check=True, capture_output=True, timeout=300)
        out = subprocess.run(base + ["report", kind], check=True, capture_output=True, text=True,
                             timeout=300)
        assert "the report splits" in out.stderr  # (parts made from the rows)
        answers[kind] = json.loads(out.stdout.strip().splitlines()[-1])
    assert answers["numpy"]["numba"] is False and answers["compiled"]["numba"] is True
    assert answers["numpy"]["arrays"] == answers["compiled"]["arrays"]
    assert answers["numpy"]["metrics"] == answers["compiled"]["metrics"]

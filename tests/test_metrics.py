"""The federated metrics equal scikit-learn's on the pooled data (a numpy reference for
the simplified silhouette, which scikit-learn lacks), whatever the split."""

import numpy as np
import pytest
from scipy.optimize import linear_sum_assignment
from sklearn import metrics as skm

import fedcluster
from reference import simplified_silhouette


def split(X, y, n_sites, rng):
    """Uneven split along the first feature (so some clusters are absent at some sites),
    plus a site holding one row."""
    order = np.argsort(X[:, 0])
    if n_sites == 1:
        return [X], [y]
    cuts = np.sort(rng.choice(np.arange(5, len(X) - 5), n_sites - 2, replace=False))
    parts = [order[:1]] + np.split(order[1:], cuts)
    return [X[p] for p in parts], [y[p] for p in parts]


@pytest.mark.parametrize("n_sites", [1, 3, 10])
def test_federated_metrics_equal_pooled(n_sites):
    rng = np.random.default_rng(n_sites)
    centres = rng.uniform(-6, 6, (5, 3))
    y = rng.integers(0, 5, 600)
    X = centres[y] + rng.normal(0, 1.2, (600, 3)) + 40.0  # an offset tests cancellation
    sites, labels = split(X, y, n_sites, rng)
    # The one-row site takes part only with its own min-site-rows lowered; every site
    # answers from its rows (their groups' partition: the next test).
    r = fedcluster.simulate(sites, labels=labels, n_clusters=5, num_rounds=4, min_sites=1,
                            min_cluster_size=1, init="random",
                            site_config={"min-site-rows": 1, "min-cluster-size": 1})
    Xp, yp = np.vstack(sites), np.concatenate(labels)
    found = r.model.predict(Xp)
    want = {
        "score": ((Xp - r.centroids[found]) ** 2).sum() / len(Xp),
        "simplified-silhouette": simplified_silhouette(Xp, r.centroids),
        "davies-bouldin": skm.davies_bouldin_score(Xp, found),
        "calinski-harabasz": skm.calinski_harabasz_score(Xp, found),
        "ari": skm.adjusted_rand_score(yp, found),
        "nmi": skm.normalized_mutual_info_score(yp, found),
        "v-measure": skm.v_measure_score(yp, found),
        "homogeneity": skm.homogeneity_score(yp, found),
        "completeness": skm.completeness_score(yp, found),
    }
    table = skm.cluster.contingency_matrix(yp, found)
    rows, cols = linear_sum_assignment(table, maximize=True)
    want["accuracy"] = table[rows, cols].sum() / len(yp)
    for name, value in want.items():
        assert r.metrics[name] == pytest.approx(value, rel=1e-9), name
    assert r.metrics["inertia"] == pytest.approx(want["score"] * len(Xp), rel=1e-9)
    if n_sites > 1:  # the split really left clusters out at some sites
        sizes = [s["cluster-sizes"] for s in r.metrics["per-site"].values()]
        assert any(0 in row for row in sizes)


def ari_of(table: np.ndarray) -> float:
    """The adjusted Rand index of a contingency table (Hubert and Arabie)."""
    pairs = lambda v: (v * (v - 1) / 2).sum()  # noqa: E731
    index, a, b = pairs(table), pairs(table.sum(1)), pairs(table.sum(0))
    expected = a * b / pairs(np.array([table.sum()]))
    return float((index - expected) / ((a + b) / 2 - expected))


def _groups_calinski_harabasz(counts, means, m2, cluster) -> float:
    """Calinski-Harabasz of whole groups (their kept spreads within)."""
    n, M, c = np.concatenate(counts), np.vstack(means), np.concatenate(cluster)
    k = np.unique(c).size
    mean = (n[:, None] * M).sum(0) / n.sum()
    centre = np.stack([(n[c == j, None] * M[c == j]).sum(0) / n[c == j].sum() for j in range(c.max() + 1)
                       if (c == j).any()])
    slot = np.searchsorted(np.unique(c), c)
    within = sum(m2) + (n * ((M - centre[slot]) ** 2).sum(1)).sum()
    between = sum(n[c == j].sum() * ((centre[i] - mean) ** 2).sum() for i, j in enumerate(np.unique(c)))
    return float(between / (k - 1) / (within / (n.sum() - k)))


def test_metrics_from_groups_are_those_of_the_groups_partition():
    """From the sites' groups (their default) the metrics are those of the partition that
    puts each group of the REPORT's table (the site's groups, its straddlers re-cut within
    the model's clusters: ``report_table.py``) whole in the cluster nearest its mean: the
    score (over the groups' kept spreads), Calinski-Harabasz and every label metric
    exactly; the silhouette and Davies-Bouldin with each group's rows at its mean (no
    per-cluster figure carries a group's spread). Rows labelled one by one
    (``score-on-rows``) score at most that."""
    from fedcluster.client_app.data import group_table, report_table
    from fedcluster.client_app.data.site_data import SiteData

    rng = np.random.default_rng(4)
    centres = rng.uniform(-6, 6, (5, 3))
    y = rng.integers(0, 5, 600)
    X = centres[y] + rng.normal(0, 1.2, (600, 3)) + 40.0
    sites, labels = [X[:200], X[200:350], X[350:]], [y[:200], y[200:350], y[350:]]
    r = fedcluster.simulate(sites, labels=labels, n_clusters=5, num_rounds=4, min_sites=1,
                            min_cluster_size=1, init="random", report_groups=True)
    C = r.centroids
    rows, truth, means, counts, sse = [], [], [], [], 0.0
    split, groupwise = 0, ([], [], [], [])
    for S, yS in zip(sites, labels):
        site = SiteData(S, None, yS, "site")
        groups, group_of_row = group_table.build(site, 2)
        made = report_table.report_groups(site, groups, group_of_row, C, None, None)
        split += made.split
        groups = made.groups
        group_of_row = group_of_row if made.group_of_row is None else made.group_of_row
        M = np.asarray(groups.means)
        d2 = ((M[:, None] - C[None]) ** 2).sum(-1)
        rows.append(d2.argmin(1)[group_of_row])  # each row in its group's cluster
        sse += float(groups.m2.sum() + (groups.counts * d2.min(1)).sum())
        groupwise[0].append(np.asarray(groups.counts)), groupwise[1].append(M)
        groupwise[2].append(float(groups.m2.sum())), groupwise[3].append(d2.argmin(1))
        truth.append(yS)
        means.append(M), counts.append(np.asarray(groups.counts))
    Xp = np.vstack(sites)
    M, n = np.vstack(means), np.concatenate(counts)
    # the label metrics from the sites' contingency tables, each cell of 1 row withheld
    # (the floor: max(the run's 1, the sites' 2)), and each site's withheld rows of a
    # cluster (its size less its cells sent) spread evenly over its cells sent as 0
    tables = [np.histogram2d(yS, fS, bins=[np.arange(6), np.arange(6)])[0]
              for yS, fS in zip(truth, rows)]
    table = np.zeros((5, 5))
    for t in tables:
        sent = np.where(t < 2, 0.0, t)
        zero = sent == 0
        sent += zero * (t.sum(axis=0) - sent.sum(axis=0)) / np.maximum(zero.sum(axis=0), 1)
        table += sent
    assert split > 0  # the report re-cut straddlers here (its own tests: test_report_table.py)
    exact = {"score": sse / len(Xp),
             "calinski-harabasz": _groups_calinski_harabasz(*groupwise),
             "ari": ari_of(table)}
    for name, value in exact.items():
        assert r.metrics[name] == pytest.approx(value, rel=1e-9), name
    D = ((M[:, None] - C[None]) ** 2).sum(-1)  # each group at its mean
    a, b = np.sqrt(np.sort(D, 1)[:, 0]), np.sqrt(np.sort(D, 1)[:, 1])
    silhouette = (n * (b - a) / np.maximum(a, b)).sum() / n.sum()
    assert r.metrics["simplified-silhouette"] == pytest.approx(silhouette, rel=1e-9)
    assert r.metrics["simplified-silhouette"] == pytest.approx(simplified_silhouette(Xp, C), rel=0.05)
    # Davies-Bouldin with each group's rows at its mean, exactly (a report's part pools a
    # cluster's straddling rows, so against the rows it is a coarser estimate than whole
    # groups were: 0.80 against sklearn's 0.88 here)
    Xg = np.repeat(M, n, axis=0)
    fg = np.repeat(np.concatenate(groupwise[3]), n)
    assert r.metrics["davies-bouldin"] == pytest.approx(skm.davies_bouldin_score(Xg, fg), rel=1e-9)
    on_rows = ((Xp[:, None] - C[None]) ** 2).sum(-1).min(1).mean()
    assert r.metrics["score-on-rows"] == pytest.approx(on_rows, rel=1e-12) and on_rows <= r.metrics["score"]


def test_string_labels_merge_across_sites_by_name(tmp_path):
    """Each site codes its own label strings; the tables are merged by NAME (site 0 has
    only "malignant", whose local code 0 is "benign"'s code at site 1)."""
    from fedcluster.simulation import run_in_process

    rng = np.random.default_rng(0)
    X = np.vstack([rng.normal(0, 1, (60, 2)), rng.normal(6, 1, (60, 2))])
    y = np.array(["benign"] * 60 + ["malignant"] * 60)
    parts = [np.arange(90, 120), np.arange(0, 90)]
    nodes = []
    for i, rows in enumerate(parts):
        path = tmp_path / f"site{i}.csv"
        lines = ["a,b,diag"] + [f"{a:.17g},{b:.17g},{lab}" for (a, b), lab in zip(X[rows], y[rows])]
        path.write_text("\n".join(lines) + "\n")
        nodes.append({"data-path": str(path), "label-column": "diag", "site-id": str(i),
                      "cache-dir": str(tmp_path / "cache")})
    r = run_in_process(nodes, {"n-clusters": 2, "min-cluster-size": 1, "output-dir": ""})
    Xp, yp = X[np.concatenate(parts)], y[np.concatenate(parts)]
    found = r.model.predict(Xp)
    assert r.metrics["ari"] == pytest.approx(skm.adjusted_rand_score(yp, found), rel=1e-12)
    assert r.metrics["accuracy"] > 0.9


def test_report_never_shows_a_count_under_the_floor():
    rng = np.random.default_rng(1)
    sites = [np.vstack([rng.normal(0, 1, (40, 2)), rng.normal(20, 0.1, (2, 2))]),
             rng.normal(0, 1, (60, 2))]
    C0 = np.array([[0.0, 0.0], [20.0, 20.0]])
    r = fedcluster.simulate(sites, init_centroids=C0, n_clusters=2, num_rounds=2,
                            min_cluster_size=3, min_sites=2)
    shown = r.metrics["per-site"]["0"]["cluster-sizes"]
    assert shown[1] == "<3"
    for report in r.metrics["per-site"].values():
        # (Table 1's rule: "suppressed", so that site 0's <3 cannot be had from its rows)
        assert all(c in ("<3", "suppressed") or c == 0 or c >= 3
                   for c in report["cluster-sizes"])
    assert r.metrics["per-site"]["0"]["cluster-sizes"][0] == "suppressed"
    assert all(c == 0 or c >= 3 for c in r.metrics["cluster-sizes"])
    from fedcluster.server_app.outputs import summary_table

    report = summary_table(r.metrics)
    site0 = next(line for line in report.splitlines() if "site 0:" in line)
    assert site0.endswith("sizes [suppressed, <3]")


def test_to_sklearn_predicts_like_the_model_and_the_kernel():
    from fedcluster.common import kernels

    rng = np.random.default_rng(2)
    X = rng.normal(size=(300, 4))
    r = fedcluster.simulate([X[:150], X[150:]], n_clusters=6, min_sites=2)
    km = r.model.to_sklearn()
    np.testing.assert_array_equal(km.cluster_centers_, r.centroids)
    np.testing.assert_array_equal(km.predict(X), r.model.predict(X))
    np.testing.assert_array_equal(r.model.predict(X), kernels.assign(X, r.centroids)[0])


def test_label_column_is_never_used_for_training(tmp_path):
    """The same rows with and without a (very informative) label column train the same
    centroids; the labels only add label metrics."""
    from fedcluster.simulation import run_in_process

    rng = np.random.default_rng(3)
    data = [rng.normal(size=(50, 2)) for _ in range(2)]
    runs = []
    for with_label in (False, True):
        nodes = []
        for i, X in enumerate(data):
            path = tmp_path / f"{with_label}-{i}.csv"
            header = "a,b" + (",y" if with_label else "")
            rows = [f"{a:.17g},{b:.17g}" + (f",{1000 * int(a > 0)}" if with_label else "")
                    for a, b in X]
            path.write_text("\n".join([header] + rows) + "\n")
            node = {"data-path": str(path), "site-id": str(i), "cache-dir": str(tmp_path / "c")}
            if with_label:
                node["label-column"] = "y"
            nodes.append(node)
        runs.append(run_in_process(nodes, {"n-clusters": 3, "min-cluster-size": 1, "output-dir": ""}))
    np.testing.assert_array_equal(runs[0].centroids, runs[1].centroids)
    assert "ari" in runs[1].metrics and "ari" not in runs[0].metrics


def test_the_summary_says_why_there_is_no_central_baseline_and_what_one_is():
    """Issue 70: no sentence that reads as false in a simulation of arrays ("no pooled data
    outside simulation"); with the baseline, both scores and their ratio."""
    from fedcluster.server_app.outputs import summary_table

    metrics = {"score": 2.0, "inertia": 20.0, "n-rows": 10, "n-sites": 2, "rounds": 3}
    without = summary_table(metrics)
    assert "no central k-means to compare with: the rows stay at the sites" in without
    assert "outside simulation" not in without
    with_baseline = summary_table({**metrics, "central-score": 1.6, "score-on-rows": 1.8})
    assert "no central" not in with_baseline
    assert "on the rows / central" in with_baseline and "1.125" in with_baseline


def test_simulate_is_quiet_with_a_progress_bar_unless_verbose(capfd, caplog):
    """Issue 70: in a notebook, simulate() shows a progress bar over its rounds and only
    warnings, not a line per round; verbose=True shows the lines; Python's logging gets
    every record either way."""
    import io
    import logging

    from flwr.common.logger import FLOWER_LOGGER

    rng = np.random.default_rng(0)
    sites = [rng.normal(size=(60, 2)) + rng.integers(0, 2, (60, 1)) * 6 for _ in range(2)]
    console = io.StringIO()  # Flower's console, wherever its handler was pointed
    streams = [(h, h.setStream(console)) for h in FLOWER_LOGGER.handlers
               if isinstance(h, logging.StreamHandler)]
    try:
        capfd.readouterr()
        # (at INFO whatever an earlier test of this process set Flower's logger to)
        with caplog.at_level(logging.INFO, logger="flwr"):
            quiet = fedcluster.simulate(sites, n_clusters=2, num_rounds=4, min_sites=2, seed=1)
        bar, said = capfd.readouterr().err, console.getvalue()
        rounds = len(quiet.history)
        assert "round   1 [" not in said and "result" not in said  # no round lines, no summary
        assert "fedcluster: 100%" in bar and f"{rounds}/{rounds}" in bar  # full at the end
        assert "round   1 [" in caplog.text  # the records still reach logging
        with caplog.at_level(logging.INFO, logger="flwr"):
            loud = fedcluster.simulate(sites, n_clusters=2, num_rounds=4, min_sites=2, seed=1,
                                       verbose=True)
        assert "round   1 [" in console.getvalue()[len(said):]
        assert "fedcluster: " not in capfd.readouterr().err
    finally:
        for handler, stream in streams:
            handler.setStream(stream)
    np.testing.assert_array_equal(loud.centroids, quiet.centroids)

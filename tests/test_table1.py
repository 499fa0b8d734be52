"""Table 1 by cluster, end to end (issues 36 and 44): the clinical demo's three sites read
their CSV files through the schema in the real ClientApp, the run imputes (impute-mean),
scales and clusters, and its ``profile`` round gives Table 1. Checked against the pooled
table read through the same schema, each group's spread the one it keeps (a spread
unit's share, ``release/spreads.py``), each row in the cluster the run gives it (its
group's, as the site assigns groups: the group table is rebuilt here from the same rows,
and the cluster sizes are checked against the run's own): every count and % exactly,
means and SDs to 1e-9, medians and quartiles within one bin where the sites answer from
rows, a ``<p`` count 1 to p-1 and a ``suppressed`` one not (``check_truth`` of
``test_table1_small_cells``, which runs the hospital floors). Where the run's floor is
above the sites' own, a site withholds its clusters under it: those clusters' counts
read as intervals that hold them, and their other figures are of the rows shown. Under
secure aggregation the same table comes from the sums alone (no per-site figures), and
the server drops a profile reply that reports a cluster under the floor.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from fedcluster.client_app.data import group_table, report_table
from fedcluster.client_app.data.schema_table import load_schema_table
from fedcluster.common import kernels, profile, protocol
from fedcluster.common.clinical_demo import write_clinical
from fedcluster.common.schema import load_schema
from fedcluster.simulation import record_parts, run_in_process
from fedcluster.strategies.validation import Expect, ReplyError, cluster_profile
from test_site_groups import as_the_groups_keep_them, with_kept_means, with_kept_spreads
from test_table1_small_cells import audit, check_truth, secure_tolerance, truth

K = 4


def _demo(tmp_path):
    paths = write_clinical(tmp_path / "demo", n_sites=3, seed=0)
    return paths[0], paths[1:]


def _run(tmp_path, p_site: int, floor: int, records=None, prepare=None, **extra):
    schema_path, files = _demo(tmp_path)
    if prepare is not None:  # change the files before the sites read them
        prepare(files)
    nodes = [{"data-path": str(p), "schema-path": str(schema_path), "site-id": f"H{i + 1}",
              "cache-dir": str(tmp_path / "cache"), "min-cluster-size": p_site}
             for i, p in enumerate(files)]
    config = {"algorithm": "dwf", "n-clusters": K, "scale": "standard", "num-rounds": 8,
              "min-cluster-size": floor, "central-baseline": False, "seed": 1,
              "schema": str(schema_path), "output-dir": "", **extra}
    return run_in_process(nodes, config, record_replies=records), schema_path, files


def _pooled_rows(result, schema_path, files, p_site, tmp_path):
    """The pooled encoded rows in groups (NaN where missing, and where the groups withhold a
    present cell: fewer than p_site of its feature in its group; each group's
    cells moved about its mean to the spread it keeps), per site:
    its key, its rows, each row's cluster (its group's: the group's run-space mean
    nearest to the centroids) and its cells missing in the data."""
    schema = load_schema(schema_path)
    parts = []
    for i, path in enumerate(files):
        data = load_schema_table(path, schema, cache_dir=tmp_path / "reread")
        X = data.X
        absent = np.isnan(X)  # missing in the data
        if p_site == 1:
            groups, group_of_row = group_table.rows_as_groups(data), np.arange(len(X))
        else:
            groups, group_of_row = _as_reported(path, schema, p_site, result, tmp_path / "cache")
            X = with_kept_means(as_the_groups_keep_them(X, group_of_row, p_site, groups.present),
                                group_of_row, groups)
            X = with_kept_spreads(X, group_of_row, np.asarray(groups.m2))
        kept = group_of_row >= 0
        means = groups.in_run_space(result.model.scaling).means
        cluster = kernels.assign(means, result.centroids)[0][group_of_row[kept]]
        parts.append((f"H{i + 1}", X[kept], cluster, absent[kept]))
    return schema, parts


def _as_reported(path, schema, p_site: int, result, cache):
    """The groups the site answered the report from, and each row's (the model's
    evaluation and profile: ``report_table.as_answered``, from the site's own cache and
    answered history)."""
    scaling = result.model.scaling
    return report_table.as_answered(load_schema_table(path, schema, cache_dir=cache), p_site,
                                    cache, result.centroids,
                                    None if scaling is None else scaling.encode())


def _table(result) -> dict:
    frame = result.profile
    return {(r.cluster, r.variable, r.level, r.statistic): r.value for r in frame.itertuples()}


@pytest.fixture(scope="module")
def from_rows(tmp_path_factory):
    """Sites answering from their rows (p_site 1) at floor 1: no cell withheld."""
    tmp_path = tmp_path_factory.mktemp("rows")
    result, schema_path, files = _run(tmp_path, p_site=1, floor=1)
    return result, *_pooled_rows(result, schema_path, files, 1, tmp_path)


def test_counts_means_and_sds_equal_the_pooled_rows_from_groups(tmp_path):
    """At the defaults (groups of 2, floor 2): every count and % exactly, means and SDs
    to 1e-9, each row in its group's cluster; the per-site composition is the run
    summary's per-site sizes."""
    result, schema_path, files = _run(tmp_path, p_site=2, floor=2)
    schema, parts = _pooled_rows(result, schema_path, files, 2, tmp_path)
    # the partition is the run's own: its evaluation counted these cluster sizes
    sizes = np.bincount(np.concatenate([c for _, _, c, *_ in parts]), minlength=K)
    assert sizes.tolist() == result.metrics["cluster-sizes"]
    rows = result.model.table1["rows"]
    seen = check_truth(rows, truth(parts, profile.variables_of(schema), K), 2)
    assert seen["exact"] > 300
    table = _table(result)
    for c in range(K):  # the size row and the per-site composition, exactly
        assert table[str(c), "size", "", "n"] == sizes[c]
        for site, _, cluster, *_ in parts:
            assert table[str(c), "site", site, "n"] == int((cluster == c).sum())
    for site, report in result.metrics["per-site"].items():
        assert report["cluster-sizes"] == [table[str(c), "site", site, "n"] for c in range(K)]
    sites = {key: r["n-rows"] for key, r in result.metrics["per-site"].items()}
    assert audit(rows, 2, sites) == []


def test_from_rows_medians_and_quartiles_within_one_bin(from_rows):
    result, schema, parts = from_rows
    table = _table(result)
    check_truth(result.model.table1["rows"], truth(parts, profile.variables_of(schema), K), 1)
    _quartiles_within_a_bin(table, parts, schema)
    assert result.metrics["sites-answering-from-rows"] == ["H1", "H2", "H3"]


def _quartiles_within_a_bin(table, parts, schema):
    """Every median and quartile within one bin of the rows' own."""
    X = np.vstack([x for _, x, _, *_ in parts])
    cluster = np.concatenate([c for _, _, c, *_ in parts])
    checked = 0
    for column in schema.features:
        if column.type != "numeric":
            continue
        j = schema.feature_names().index(column.name)
        width = (column.range[1] - column.range[0]) / schema.median_bins
        for name, mask in [(str(c), cluster == c) for c in range(K)] + [("all", cluster >= 0)]:
            values = X[mask, j]
            values = values[~np.isnan(values)]
            for stat, q in (("q1", 0.25), ("median", 0.5), ("q3", 0.75)):
                # (pandas' default quantile: linear between order statistics)
                assert abs(float(table[name, column.name, "", stat])
                           - np.quantile(values, q)) <= width, (name, column.name, stat)
                checked += 1
    assert checked > 100


def test_a_run_floor_above_the_sites_gives_intervals_that_hold(tmp_path):
    """The run's floor 40 over sites at p_site 2: each site withholds its clusters of 2
    to 39 rows, in this round as in every other, so the table does not know those rows:
    such a cluster's size and counts read as intervals that hold the rows' own, its
    other figures are those of the rows shown, a site's withheld cluster reads <40 in
    the composition, and no count shown is 1 to 39."""
    k = 8
    result, schema_path, files = _run(tmp_path, p_site=2, floor=40, **{"n-clusters": k})
    schema, parts = _pooled_rows(result, schema_path, files, 2, tmp_path)
    variables = profile.variables_of(schema)
    rows = result.model.table1["rows"]
    seen = check_truth(rows, truth(parts, variables, k), 40,
                       shown=truth(parts, variables, k, site_floor=40))
    partial = {r["cluster"] for r in rows if r["statistic"] == "rows shown"}
    assert partial and seen["interval"] > 50 and seen["<p"] > 0, (partial, seen)
    assert "all" in partial  # (so are all rows' counts)
    table = _table(result)
    for site, _, cluster, *_ in parts:
        for c in range(k):
            here = int((cluster == c).sum())
            assert table[str(c), "site", site, "n"] in ((here, "suppressed") if here >= 40
                                                       else (0, "<40")), (site, c, here)


def test_secure_aggregation_gives_table1_from_sums_only(tmp_path):
    """The run under SecAgg+: the profile round is a secure sum (no site sends a plain
    profile), and Table 1 from the decoded sums equals the pooled rows (counts exactly,
    means and SDs within the quantisation's bound, quartiles within a bin), with no
    per-site composition."""
    records: list[dict] = []
    result, schema_path, files = _run(
        tmp_path, p_site=1, floor=1, records=records,
        **{"secure-aggregation": True, "secagg-data-bound": 40.0,
           # 3 sites x 2**30 < 2**32: the finest quantisation SecAgg+ allows here
           "secagg-quantization-range": 2**30})
    assert not result.metrics["site-failures"]
    profile_replies = [rec for rec in records if rec["task"] == "profile"]
    assert profile_replies and all(rec["arrays"] == [] for rec in profile_replies)
    table = _table(result)
    assert not any(key[1] == "site" for key in table)
    schema, parts = _pooled_rows(result, schema_path, files, 1, tmp_path)
    variables = profile.variables_of(schema)
    bounds = secure_tolerance(result.model, parts, variables, K, n_sites=3,
                              quantization=2**30)
    check_truth(result.model.table1["rows"], truth(parts, variables, K), 1, secure=bounds)
    _quartiles_within_a_bin(table, parts, schema)


def test_the_server_drops_a_profile_that_reports_a_cluster_under_the_floor(tmp_path):
    """The profile round's replies pass the checks, and one that reports a cluster of 3
    rows at floor 5 (a site that ignored the floor) does not: the server drops it."""
    records: list[dict] = []
    _run(tmp_path, p_site=1, floor=5, records=records)
    replies = [arrays for rec in records for task, arrays, _ in record_parts(rec)
               if task == "profile"]
    assert replies
    d = replies[-1][3].shape[1]
    expect = Expect("profile", d, K, replies[-1][5].shape[2], floor=5)
    for arrays in replies:
        reply = profile.ClusterProfile(*arrays)
        cluster_profile(reply, expect, n_rows=10_000)  # every reply validates
        counts = np.asarray(reply.counts)
        assert not np.any((counts > 0) & (counts < 5))
        assert arrays[3].ndim == 2 and arrays[3].shape[0] == K  # per cluster, never per row
    broken = profile.ClusterProfile(*replies[-1])
    counts, rows = np.array(broken.counts), np.array(broken.rows)
    c = int(np.argmax(counts))
    counts[c], rows[c] = 3, 3
    with pytest.raises(ReplyError, match="fewer members than the privacy floor 5"):
        cluster_profile(broken._replace(counts=counts, rows=rows), expect, n_rows=10_000)


def _profile_replies(records) -> list[profile.ClusterProfile]:
    return [profile.ClusterProfile(*arrays) for rec in records
            for task, arrays, _ in record_parts(rec) if task == "profile" and arrays]


def test_a_site_sends_the_clusters_it_shows_whole_and_the_table_keeps_the_rule(
        tmp_path, monkeypatch):
    """A site's profile is a function of its groups (``test_indistinguishable``: equal
    group tables, bit-identical replies): a cluster it shows goes whole, its level
    counts and missing cells too, however few (each a sum of its groups' own, which
    other tasks give a coordinator anyway). Which columns are levels the site reads from
    its own schema: a coordinator that appends zero level weights where they once went
    gets the same replies. The table then applies its rule to the POOLED counts: none
    shown is 1 to p-1."""
    from typing import NamedTuple

    from fedcluster.strategies import profile as server_module

    assert "level_weights" not in protocol.ProfileInputs._fields
    records: list[dict] = []
    honest_run, schema_path, _ = _run(tmp_path / "honest", p_site=2, floor=2,
                                      records=records, **{"n-clusters": 8})
    honest = _profile_replies(records)
    schema = load_schema(schema_path)
    weights = profile.level_weights(profile.variables_of(schema), len(schema.feature_names()))
    levels = np.concatenate([reply.sums[:, weights > 0] / weights[weights > 0]
                             for reply in honest])
    missing = np.concatenate([np.asarray(reply.rows) - np.asarray(reply.present)
                              for reply in honest])
    assert np.any((levels > 0) & (levels < 10)) and np.any((missing > 0) & (missing < 10))
    for row in honest_run.model.table1["rows"]:  # (floor 2: a count of 1 reads <2)
        assert not (row["statistic"] in ("n", "missing n") and row["value"] == 1), row

    plan_of = server_module.profile_task
    Lying = NamedTuple("Lying", [(f, np.ndarray) for f in protocol.ProfileInputs._fields]
                       + [("level_weights", np.ndarray)])

    def lying(centroids, transform, lower, upper, bins, report=False):
        plan = plan_of(centroids, transform, lower, upper, bins, report)
        zeros = np.zeros(np.shape(centroids)[1])
        return dataclasses.replace(plan, arrays=Lying(*plan.arrays, zeros))

    monkeypatch.setattr(server_module, "profile_task", lying)
    records = []
    told, _, _ = _run(tmp_path / "told", p_site=2, floor=2, records=records,
                      **{"n-clusters": 8})
    for a, b in zip(honest, _profile_replies(records), strict=True):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)
    assert told.model.table1["rows"] == honest_run.model.table1["rows"]


def _one_glucose_at_site_0(files) -> None:
    """Site 0 keeps a single glucose value: fewer than p_site = 2 in its whole table, so no
    merge of groups gives it company and the group rule withholds it."""
    import csv

    with open(files[0], newline="") as f:
        header, *rows = list(csv.reader(f))
    g = next(j for j, name in enumerate(header) if name.startswith("glucose"))
    kept = next(i for i, row in enumerate(rows) if row[g])
    for i, row in enumerate(rows):
        row[g] = row[g] if i == kept else ""
    with open(files[0], "w", newline="") as f:
        csv.writer(f).writerows([header, *rows])


def test_a_withheld_value_is_counted_apart_from_the_missing(tmp_path):
    """Missing is missing; withheld is withheld: every figure of Table 1 against the pooled
    rows, where a value present in the file but withheld by the group rule is in no
    figure and is counted on its own line (``withheld n``), not as missing."""
    result, schema_path, files = _run(tmp_path, p_site=2, floor=1,
                                      prepare=_one_glucose_at_site_0)
    schema, parts = _pooled_rows(result, schema_path, files, 2, tmp_path)
    rows = result.model.table1["rows"]
    check_truth(rows, truth(parts, profile.variables_of(schema), K), 1)
    table = _table(result)
    assert table["all", "glucose", "", "withheld n"] == "<2"  # one value: under the floor 2
    (glucose,) = [v for v in profile.variables_of(schema) if v.name == "glucose"]
    absent = sum(int(np.isnan(load_schema_table(f, schema, cache_dir=tmp_path / "again").X[
        :, glucose.columns[0]]).sum()) for f in files)
    # the cells empty in the files, or withheld so that the "<2" cannot be worked out
    # (every figure shown was checked against the rows above)
    assert table["all", "glucose", "", "missing n"] in (absent, profile.SUPPRESSED)
    assert not any(r["statistic"] == "withheld n" and r["variable"] != "glucose" for r in rows)
    from fedcluster.server_app.table1 import table1_markdown

    text = table1_markdown(rows, {"floor": 1})
    assert "withheld (group rule), n (%)" in text and "Withheld (group rule): values present" in text

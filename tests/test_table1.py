"""Table 1 by cluster, end to end (issue 36, must-shows 1 and 4): the clinical demo's three
sites read their CSV files through the schema in the real ClientApp, the run imputes
(impute-mean), scales and clusters, and its ``profile`` round gives Table 1. Checked
against pandas on the pooled table read through the same schema, each row in the cluster
the run gives it (its group's, as the site assigns groups: the group table is rebuilt
here from the same rows, and the cluster sizes are checked against the run's own), with
the floor applied cell by cell at each site as the docs say: means and SDs to 1e-9, every
n and % exactly, medians and quartiles within one bin where the sites answer from rows,
and "<p" for a count no site could show. Under secure aggregation the same table comes
from the sums alone (no per-site figures), and the leakage audit of the profile round
catches a floor broken by hand.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

from fedcluster.client_app import group_table
from fedcluster.client_app.schema_table import load_schema_table
from fedcluster.common import kernels, profile, protocol
from fedcluster.common.clinical_demo import write_clinical
from fedcluster.common.schema import load_schema
from fedcluster.simulation import record_parts, run_in_process
from fedcluster.strategies.validation import Expect, ReplyError, cluster_profile
from test_site_groups import as_the_groups_keep_them

K = 4


def _demo(tmp_path):
    paths = write_clinical(tmp_path / "demo", n_sites=3, seed=0)
    return paths[0], paths[1:]


def _run(tmp_path, p_site: int, floor: int, records=None, **extra):
    schema_path, files = _demo(tmp_path)
    nodes = [{"data-path": str(p), "schema-path": str(schema_path), "site-id": f"H{i + 1}",
              "cache-dir": str(tmp_path / "cache"), "min-cluster-size": p_site}
             for i, p in enumerate(files)]
    config = {"algorithm": "dwf", "n-clusters": K, "scale": "standard", "num-rounds": 8,
              "min-cluster-size": floor, "central-baseline": False, "seed": 1,
              "schema": str(schema_path), "output-dir": "", **extra}
    return run_in_process(nodes, config, record_replies=records), schema_path, files


def _pooled_rows(result, schema_path, files, p_site, tmp_path):
    """The pooled encoded rows (NaN where missing, and where the groups count a present
    cell as missing: fewer than p_site of its feature in its group), each with its site
    and the cluster the run gives it: its group's, the group's run-space mean nearest to
    the centroids."""
    schema = load_schema(schema_path)
    parts = []
    for i, path in enumerate(files):
        data = load_schema_table(path, schema, cache_dir=tmp_path / "reread")
        X = data.X
        if p_site == 1:
            groups, group_of_row = group_table.rows_as_groups(data), np.arange(len(X))
        else:
            groups, group_of_row = group_table.build(data, p_site)
            X = as_the_groups_keep_them(X, group_of_row, p_site)
        means = groups.in_run_space(result.model.scaling).means
        cluster = kernels.assign(means, result.centroids)[0][group_of_row]
        parts.append((f"H{i + 1}", X, cluster))
    return schema, parts


def _expected(schema, parts, floor):
    """Table 1's figures from the rows, each site's cell left out where the docs say it
    is withheld (its cluster under p rows there; its present, missing or level count
    1..p-1), as {(cluster, variable, level, statistic): value}."""
    variables = profile.variables_of(schema)
    small = lambda n: 0 < n < floor  # noqa: E731
    out = {}
    clusters = [(str(c), [c]) for c in range(K)] + [("all", list(range(K)))]
    for name, members in clusters:
        for v in variables:
            cells = []  # (column, the cell's values at one site) kept
            withheld = set()  # the columns a site withheld a cell of
            for _, X, cluster in parts:
                for c in members:
                    rows = X[cluster == c]
                    for j in v.columns:
                        col = rows[:, j]
                        present = int((~np.isnan(col)).sum())
                        level = int(round(np.nansum(col) / v.weight)) if v.kind != "numeric" else 0
                        hide = (len(rows) < floor or small(present) or small(len(rows) - present)
                                or small(level))
                        if hide:
                            withheld.add(j)
                        else:
                            cells.append((j, col))
            if v.kind == "numeric":
                values = np.concatenate([col for _, col in cells]) if cells else np.array([])
                series = pd.Series(values)
                out[name, v.name, "", "n"] = int(series.count()) if series.count() or not withheld \
                    else f"<{floor}"
                if series.count():
                    out[name, v.name, "", "mean"] = series.mean()
                    if series.count() > 1:
                        out[name, v.name, "", "sd"] = series.std()
                    out[name, v.name, "", "missing n"] = int(series.isna().sum())
                    for stat, q in (("q1", 0.25), ("median", 0.5), ("q3", 0.75)):
                        out[name, v.name, "", stat] = series.quantile(q)
            else:
                for level, j in zip(v.levels, v.columns):
                    kept = [col for jj, col in cells if jj == j]
                    n = int(round(sum(np.nansum(col) for col in kept) / v.weight))
                    present = sum(int((~np.isnan(col)).sum()) for col in kept)
                    level_hidden = j in withheld and n == 0
                    out[name, v.name, level, "n"] = f"<{floor}" if level_hidden else n
                    if not level_hidden and present:
                        out[name, v.name, level, "%"] = 100.0 * n / present
    return out


def _table(result) -> dict:
    frame = result.profile
    return {(r.cluster, r.variable, r.level, r.statistic): r.value for r in frame.itertuples()}


@pytest.fixture(scope="module")
def from_rows(tmp_path_factory):
    """Sites answering from their rows (p_site 1) at floor 1: no cell or bin withheld (a
    floor of 2 would withhold every bin that holds one row's value)."""
    tmp_path = tmp_path_factory.mktemp("rows")
    result, schema_path, files = _run(tmp_path, p_site=1, floor=1)
    return result, *_pooled_rows(result, schema_path, files, 1, tmp_path)


def test_means_sds_and_counts_equal_pandas_on_the_pooled_table_from_groups(tmp_path):
    """At the defaults (groups of 2, floor 2): every mean and SD to 1e-9, every n and %
    exactly, each row in its group's cluster."""
    result, schema_path, files = _run(tmp_path, p_site=2, floor=2)
    schema, parts = _pooled_rows(result, schema_path, files, 2, tmp_path)
    # the partition is the run's own: its evaluation counted these cluster sizes
    sizes = np.bincount(np.concatenate([c for _, _, c in parts]), minlength=K)
    assert sizes.tolist() == result.metrics["cluster-sizes"]
    _compare(_table(result), _expected(schema, parts, 2), quantiles=False)
    table = _table(result)
    for c in range(K):  # the size row and the per-site composition, exactly
        assert table[str(c), "size", "", "n"] == sizes[c]
        for site, _, cluster in parts:  # (none there: "<2", as a withheld one)
            here = int((cluster == c).sum())
            assert table[str(c), "site", site, "n"] == (here if here >= 2 else "<2")


def test_from_rows_medians_and_quartiles_within_one_bin(from_rows):
    result, schema, parts = from_rows
    table = _table(result)
    _compare(table, _expected(schema, parts, 1), quantiles=True, schema=schema)
    assert result.metrics["sites-answering-from-rows"] == ["H1", "H2", "H3"]


def _compare(table, expected, quantiles: bool, schema=None, rel=1e-9):
    widths = {}
    if schema is not None:
        widths = {c.name: (c.range[1] - c.range[0]) / schema.median_bins
                  for c in schema.features if c.type == "numeric"}
    checked = 0
    for key, want in expected.items():
        stat = key[3]
        if stat in ("q1", "median", "q3"):
            if quantiles:
                assert abs(float(table[key]) - want) <= widths[key[1]], (key, table[key], want)
                checked += 1
            continue
        got = table[key]
        if isinstance(want, str):
            assert got == want, key
        elif stat in ("mean", "sd"):
            assert float(got) == pytest.approx(want, rel=rel, abs=rel), key
        elif stat == "%":
            assert float(got) == pytest.approx(want, rel=1e-12, abs=1e-12), key
        else:
            assert float(got) == want, key
        checked += 1
    assert checked > 200


def test_cells_under_the_floor_show_under_p(tmp_path):
    """At floor 40 the demo's small cells (the 'other' ward, current smokers in a small
    cluster, ...) are withheld at the sites; a count no site shows reads "<40", and no
    figure of the table is a count of 1..39."""
    result, schema_path, files = _run(tmp_path, p_site=2, floor=40)
    schema, parts = _pooled_rows(result, schema_path, files, 2, tmp_path)
    table, expected = _table(result), _expected(schema, parts, 40)
    _compare(table, expected, quantiles=False)
    assert "<40" in table.values() and "<40" in expected.values()
    for (cluster, variable, level, stat), value in table.items():
        if stat in ("n", "missing n") and not isinstance(value, str) and variable != "size":
            assert not 0 < value < 40, (cluster, variable, level, stat, value)


def test_secure_aggregation_gives_table1_from_sums_only(tmp_path):
    """The run under SecAgg+: the profile round is a secure sum (no site sends a plain
    profile), and Table 1 from the decoded sums equals pandas on the pooled rows (counts
    exactly, means and SDs to the quantisation error, quartiles within a bin), with no
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
    # (stochastic rounding: each sum within N x 2 x its scale / 2**30; the widest, CRP over
    # 0..500 mg/L, moves a small cluster's SD by a few parts in 1e5)
    _compare(table, _expected(schema, parts, 1), quantiles=True, schema=schema, rel=3e-4)


def test_the_audit_catches_a_profile_that_breaks_the_floor(tmp_path):
    """The profile round's replies pass the checks, and one with a count of 1 put in by
    hand (a site that ignored the floor) does not: the server drops it."""
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
        for name in ("counts", "rows", "present", "histograms"):
            values = np.asarray(getattr(reply, name))
            assert not np.any((values > 0) & (values < 5)), name
        assert arrays[3].ndim == 2 and arrays[3].shape[0] == K  # per cluster, never per row
    # a site that ignored the floor: one present cell of age in cluster 0, its sum that
    # one row's age, its histogram one count
    broken = profile.ClusterProfile(*replies[-1])
    c = int(np.argmax(broken.counts))
    present, histograms = np.array(broken.present), np.array(broken.histograms)
    present[c, 0] = 1
    histograms[c, 0] = 0
    histograms[c, 0, 10] = 1
    with pytest.raises(ReplyError, match="fewer than the privacy floor 5"):
        cluster_profile(broken._replace(present=present, histograms=histograms), expect,
                        n_rows=10_000)


def _profile_replies(records) -> list[profile.ClusterProfile]:
    return [profile.ClusterProfile(*arrays) for rec in records
            for task, arrays, _ in record_parts(rec) if task == "profile" and arrays]


def _small(values, floor: int) -> bool:
    values = np.rint(np.asarray(values, dtype=np.float64))
    return bool(np.any((values > 0) & (values < floor)))


def test_a_missing_indicator_does_not_carry_a_missing_count_under_the_floor(tmp_path,
                                                                           monkeypatch):
    """The demo's smoking column has a missing indicator (0/1): its cluster sum is
    smoking's missing cells there. Where those are 1 to p-1 the smoking cells are
    withheld; a site that floored the indicator as a plain numeric column would still
    send the count as the indicator's sum. Shown first with the indicators not marked
    (the attack reads counts of 1..p-1), then at the real site (none)."""
    from fedcluster.client_app import site_profile as site_module
    from fedcluster.common.schema import encoded_kinds

    def sent_missing_counts(records, schema_path):
        kinds = encoded_kinds(load_schema(schema_path))
        marks = np.array([kind == "indicator" for kind in kinds])
        ones = [reply.sums[:, marks] for reply in _profile_replies(records)]
        zeros = [np.asarray(reply.counts)[:, None] - reply.sums[:, marks]
                 for reply in _profile_replies(records)]
        assert marks.any() and ones
        return ones, zeros

    real = site_module.site_encoding
    monkeypatch.setattr(site_module, "site_encoding",
                        lambda groups, d: (real(groups, d)[0], np.zeros(d, dtype=bool)))
    records: list[dict] = []
    _, schema_path, _ = _run(tmp_path / "unmarked", p_site=2, floor=40, records=records)
    ones, _ = sent_missing_counts(records, schema_path)
    assert any(_small(o, 40) for o in ones)  # the attack works without the marks
    monkeypatch.setattr(site_module, "site_encoding", real)
    records = []
    result, schema_path, _ = _run(tmp_path / "real", p_site=2, floor=40, records=records)
    ones, zeros = sent_missing_counts(records, schema_path)
    assert not any(_small(o, 40) for o in ones) and not any(_small(z, 40) for z in zeros)
    assert result.model.table1 is not None


def test_a_coordinator_cannot_choose_which_columns_are_floored_as_levels(tmp_path,
                                                                         monkeypatch):
    """A level's count is floored through its one-hot weight. A site that took the
    weights from the coordinator, sent 0 for every level, would have the counts pass as
    numeric columns' sums: shown first (it sends level counts of 1..p-1). The real task
    carries no weights (the site reads them from its own schema): against a coordinator
    that appends zero weights where they once went, the real site ignores them, sends no
    level count under the floor, and Table 1 is made."""
    from typing import NamedTuple

    from fedcluster.client_app import site_profile as site_module
    from fedcluster.strategies import profile as server_module

    assert "level_weights" not in protocol.ProfileInputs._fields

    def level_counts(records, schema_path):
        schema = load_schema(schema_path)
        weights = profile.level_weights(profile.variables_of(schema),
                                        len(schema.feature_names()))
        levels = weights > 0
        counts = [reply.sums[:, levels] / weights[levels] for reply in _profile_replies(records)]
        assert levels.any() and counts
        return counts

    real = site_module.site_encoding
    monkeypatch.setattr(site_module, "site_encoding",  # a site told every level is numeric
                        lambda groups, d: (np.zeros(d), real(groups, d)[1]))
    records: list[dict] = []
    _, schema_path, _ = _run(tmp_path / "told", p_site=2, floor=40, records=records)
    assert any(_small(c, 40) for c in level_counts(records, schema_path))  # the attack works
    monkeypatch.setattr(site_module, "site_encoding", real)

    honest = server_module.profile_task
    Lying = NamedTuple("Lying", [(f, np.ndarray) for f in protocol.ProfileInputs._fields]
                       + [("level_weights", np.ndarray)])

    def lying(strategy, lower, upper, bins):
        plan = honest(strategy, lower, upper, bins)
        zeros = np.zeros(strategy.n_features)
        return dataclasses.replace(plan, arrays=Lying(*plan.arrays, zeros))

    monkeypatch.setattr(server_module, "profile_task", lying)
    records = []
    result, schema_path, _ = _run(tmp_path / "real", p_site=2, floor=40, records=records)
    assert not any(_small(c, 40) for c in level_counts(records, schema_path))
    assert result.model.table1 is not None

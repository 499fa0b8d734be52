"""The report's groups within the final model's clusters (``client_app/data/report_table.py``,
issue 56): what a report task answers from, and what it does not give a coordinator."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fedcluster.client_app.data import group_table, report_cuts, report_table
from fedcluster.client_app.data.site_data import SiteData
from fedcluster.client_app.release import audit, gate
from fedcluster.client_app.release.audit import span as span_audit
from test_attacks import site_factory  # noqa: F401 (the fixture: one site's real ClientApp)


def _site(seed: int = 3, n: int = 240):
    rng = np.random.default_rng(seed)
    centres = np.array([[0.0, 0.0], [4.0, 0.0], [0.0, 4.0]])
    X = centres[rng.integers(0, 3, n)] + rng.normal(0, 1.3, (n, 2))
    return X


def _made(X, p, C, labels=None):
    site = SiteData(np.ascontiguousarray(X), None, labels, "site")
    groups, group_of_row = group_table.build(site, p)
    return site, groups, group_of_row, report_table.report_groups(site, groups, group_of_row,
                                                                   C, None, None)


def _cluster(X, C):
    return ((X[:, None] - C[None]) ** 2).sum(-1).argmin(1)


C3 = np.array([[0.0, 0.0], [4.0, 0.0], [0.0, 4.0]])


def test_split_groups_lie_within_one_cluster_and_nothing_is_lost():
    X = _site()
    site, groups, group_of_row, made = _made(X, 2, C3)
    assert made.split > 0 and made.moved > 0 and made.why == ""
    report = made.groups
    # totals: every row and every value still counted once
    assert report.counts.sum() == groups.counts.sum()
    np.testing.assert_allclose(report.sums.sum(0), groups.sums.sum(0), rtol=1e-12)
    # each report group's rows: one cluster, but for the groups the report kept whole
    row_cluster = _cluster(X, C3)
    spans = [np.unique(row_cluster[made.group_of_row == j]).size for j in range(report.n_groups)]
    straddlers_before = sum(np.unique(row_cluster[group_of_row == j]).size > 1
                            for j in range(groups.n_groups))
    assert sum(s > 1 for s in spans) == straddlers_before - made.split
    # every group still holds at least p rows, and each group's mean lands in its rows' cluster
    assert report.counts.min() >= 2
    means_cluster = _cluster(np.asarray(report.means), C3)
    for j in np.flatnonzero(np.array(spans) == 1):
        assert means_cluster[j] == row_cluster[made.group_of_row == j][0]


def test_the_audit_rerun_finds_nothing_with_the_report_groups():
    X = _site(3, 600)
    site, groups, group_of_row, made = _made(X, 2, C3)
    assert made.split > 0
    old = [np.flatnonzero(group_of_row == j) for j in range(groups.n_groups)]
    new = [np.flatnonzero(made.group_of_row == j) for j in range(made.groups.n_groups)]
    fresh = [m for m in new if not any(np.array_equal(m, o) for o in old)]
    everything = old + fresh
    offsets = np.concatenate([[0], np.cumsum([m.size for m in everything])]).astype(np.int64)
    members = np.concatenate(everything).astype(np.int64)
    findings = span_audit.audit(offsets, members, X.shape[0],
                                np.arange(len(old), len(everything)),
                                np.full(len(everything), 2), 2, lambda u, w: False)
    assert findings == []


def _admit(site, groups, group_of_row, made):
    """The release step's judgement of a report's parts with the site's record (data held
    in memory: its record in this process)."""
    from fedcluster.client_app.release import record

    with record.Record.of(groups.table_ref).held() as store:
        instance = report_table.row_instances(site, store)
        return gate.admit_report(store, groups.table_ref.number,
                                 [instance[part] for part in made.parts], made.carried_features,
                                 groups.min_size, groups.n_features)


def test_any_number_of_partitions_of_one_version_each_judged_with_the_others():
    """The same partition asked again is the same table (admitted as it is); another
    partition of the same version is judged with the first one (both in the record): one
    drawn at other centroids passes, one that differs from the first by a single row
    is refused (the two parts' difference would be that row)."""
    X = _site(3, 600)
    site = SiteData(np.ascontiguousarray(X), None, None, "site")
    groups, _ = group_table.site_groups(site, 2)
    group_of_row = group_table.row_groups(site, 2)
    first = report_table.report_groups(site, groups, group_of_row, C3, None, None)
    assert first.split > 0 and _admit(site, groups, group_of_row, first).admitted
    again = report_table.report_groups(site, groups, group_of_row, C3, None, None)
    assert again.groups.digest == first.groups.digest
    verdict = _admit(site, groups, group_of_row, again)
    assert verdict.admitted and verdict.digest == gate.partition_digest(
        [np.asarray(part) for part in first.parts], 2)
    other = report_table.report_groups(site, groups, group_of_row, C3 + 0.3, None, None)
    assert other.split > 0 and _admit(site, groups, group_of_row, other).admitted
    # a partition one row off the first: move one straddling row to another part
    parts = [np.array(part) for part in first.parts]
    mover = parts[0][0]
    crafted = report_table.Report(first.groups, first.split, first.moved, "", None, 0,
                                  (parts[0][1:], np.sort(np.r_[parts[1], mover]), *parts[2:]),
                                  first.carried_features, first.straddlers)
    refused = _admit(site, groups, group_of_row, crafted)
    assert not refused.admitted and "isolates 1 row" in refused.why
    assert mover in refused.instances


# ------------------------------------------------------------------ against the real ClientApp
def _pairs_and_a_target():
    """Pairs of rows far apart on a grid, each pair a group at p_site 2 (its two rows
    0.02 apart, vertically), and one TARGET pair at the origin, horizontal: a vertical
    boundary through the origin cuts the target alone."""
    rng = np.random.default_rng(11)
    centres = [(x, y) for x in (-15.0, -10.0, -5.0, 5.0, 10.0, 15.0) for y in (-10.0, 0.0, 10.0)]
    rows = []
    for cx, cy in centres:
        rows += [(cx, cy - 0.01), (cx, cy + 0.01)]
    target = np.array([[-0.013, 0.002], [0.017, -0.001]])
    X = np.vstack([np.array(rows) + rng.normal(0, 1e-4, (len(rows), 2)), target])
    return X, target


def _attack(coordinator, X):
    """The coordinator's attack: a boundary through the target pair's mean (two centroids
    either side), the report's evaluation asked, and the left cluster's sum less every
    group it knows lies left (every group's mean and count: ``local_kmeans`` with one
    cluster per group gives them; here read from the site's table)."""
    site = SiteData(X, None, None, "site")
    groups, _ = group_table.build(site, 2)
    means, counts = np.asarray(groups.means), np.asarray(groups.counts)
    C = np.array([[-1.0, 0.0], [1.0, 0.0]])
    arrays, _ = coordinator.ask("evaluate", [C], report=True)
    from fedcluster.common import protocol
    reply = protocol.reply_arrays("evaluate", arrays)
    left = means[:, 0] < 0
    return reply.sums[0] - (counts[left, None] * means[left]).sum(axis=0), reply


def test_a_boundary_through_one_group_gives_its_row_without_the_gate(site_factory, monkeypatch):
    """Shown first without the gate (the report's checks and audit switched off): the
    report's left part holds the target's left row alone, and the left cluster's sum less
    the groups known to lie left is that row, exactly."""
    from test_attacks import is_row

    X, target = _pairs_and_a_target()
    monkeypatch.setattr(report_cuts, "exposed", lambda site, rows, g, *rest: (
        np.zeros(int(g.max()) + 1, dtype=bool), np.zeros(site.n_features, dtype=bool)))
    monkeypatch.setattr(audit, "judge", lambda *a, **k: [])
    recovered, _ = _attack(site_factory(X, {}), X)
    assert is_row(recovered, X) and np.allclose(recovered, target[0], atol=1e-9)


def test_a_boundary_through_one_group_gives_nothing_through_the_gate(site_factory):
    """Through the gate: the target's rows would be a part of one row (and a part less its
    group: the other), so the site keeps the group whole; its reply is the evaluation of
    the groups whole, and the attack's difference is no row."""
    from test_attacks import is_row

    X, _ = _pairs_and_a_target()
    recovered, reply = _attack(site_factory(X, {}), X)
    assert not is_row(recovered, X, tol=1e-3)
    assert np.allclose(recovered, 0.0, atol=1e-9)  # the left cluster is the groups left, whole
    assert reply.counts.tolist() == [36 // 2, 36 // 2 + 2]


def test_deployed_sites_answer_each_run_its_own_partition_judged_with_the_others(tmp_path):
    """Deployed sites (files, a cache): the first run's report partition goes into each
    site's record (its parts are groups of no table, with no spread unit, so every later
    audit counts them); a second run whose model cuts the rows otherwise answers its own
    partition, judged with the first and recorded beside it: its cluster sizes are those
    of the groups each site answered it from (``report_table.as_answered``)."""
    from fedcluster.client_app.data.schema_table import load_schema_table
    from fedcluster.client_app.release.record import Store
    from fedcluster.common import kernels
    from fedcluster.common.clinical_demo import write_clinical
    from fedcluster.common.schema import load_schema
    from fedcluster.simulation import run_in_process

    schema_path, *files = write_clinical(tmp_path / "demo", n_sites=3, seed=0)
    cache = tmp_path / "cache"
    nodes = [{"data-path": str(f), "schema-path": str(schema_path), "site-id": f"H{i + 1}",
              "cache-dir": str(cache)} for i, f in enumerate(files)]
    config = {"algorithm": "dwf", "n-clusters": 4, "scale": "standard", "central-baseline": False,
              "schema": str(schema_path), "output-dir": "", "profile": False}
    first = run_in_process(nodes, {**config, "seed": 1})
    schema = load_schema(schema_path)

    def stores():
        for path in files:
            site = load_schema_table(path, schema, cache_dir=cache)
            groups, _ = group_table.site_groups(site, 2, cache)
            yield site, groups, Store.open(Path(groups.table_ref.store))
    for _, groups, store in stores():
        parts = np.flatnonzero(store.report_group_mask())
        assert parts.size and (store.unit[parts] == -1).all()
        in_tables = np.concatenate([store.table_groups(t["n"]) for t in store.tables])
        assert not np.isin(parts, in_tables).any()
        assert len(store.reports_of(groups.table_ref.number)) == 1
    second = run_in_process(nodes, {**config, "seed": 5, "init": "random"})
    assert not np.allclose(second.centroids, first.centroids)
    sizes = np.zeros(4, dtype=np.int64)
    transform = second.model.scaling.encode()
    partitions = 0
    for site, groups, store in stores():
        partitions += len(store.reports_of(groups.table_ref.number))
        answered, _ = report_table.as_answered(site, 2, cache, second.centroids, transform)
        means = answered.in_run_space(second.model.scaling).means
        sizes += np.bincount(kernels.assign(np.ascontiguousarray(means), second.centroids)[0],
                             weights=answered.counts, minlength=4).astype(np.int64)
    assert partitions > 3  # a second partition recorded beside the first
    assert second.metrics["cluster-sizes"] == sizes.tolist()


# ------------------------------------------------------------------ a feature carried
def _two_groups_across():
    """Vertical pairs far apart on a grid (each a group at p_site 2) with a third feature
    z, and two TARGET groups of three rows, A at y = 0 and B at y = 30, that a vertical
    boundary through x = 0 cuts: A's two left rows hold its z cells (its right row's z is
    missing), B has one row left. The cut isolates 2 rows (p_site 2: the report may split
    the groups) but one present cell of z, B's left one: the left part less A's released
    sum. z is carried."""
    from fedcluster.client_app.site_groups import TableFacts

    rng = np.random.default_rng(11)
    rows = []
    for cx in (-30.0, -25.0, -20.0, 20.0, 25.0, 30.0):
        for cy in (-10.0, 0.0, 10.0):
            z = rng.normal(50.0, 5.0)
            rows += [(cx, cy - 0.01, z), (cx, cy + 0.01, z + 1.0)]
    X = np.array(rows)
    X[:, :2] += rng.normal(0, 1e-4, X[:, :2].shape)
    target = np.array([(-0.010, 0.0, 50.2), (-0.012, 0.01, 50.3), (0.015, 0.005, np.nan),
                       (-0.011, 30.0, 50.4), (0.012, 30.01, 50.5), (0.014, 29.99, 50.6)])
    X = np.ascontiguousarray(np.vstack([X, target]))
    return X, SiteData(X, None, None, "site", table=TableFacts(None, "", 0, {"z": 1}))


def _fill(X):
    from fedcluster.common import scaling
    return scaling.FeatureTransform.fill_only(np.nanmean(X, axis=0)).encode()


C_Z = np.array([[-1.0, 0.0, 50.0], [1.0, 0.0, 50.0]])


def test_a_feature_whose_cut_isolates_few_cells_is_carried_at_a_stood_in_mean():
    """The report splits both groups (rows: exact) and carries z: the parts' z sums are
    their cells at their cluster's groups' mean, shifted so that the site's z total
    stays the groups' own, not their rows' z; and the span audit over the table and the
    parts (z: the parts report no value of it) finds nothing, while with the parts' own
    z it would find B's left cell."""
    X, site = _two_groups_across()
    groups, group_of_row = group_table.build(site, 2)
    a, b = group_of_row[-6], group_of_row[-3]
    assert (group_of_row[-6:] == [a, a, a, b, b, b]).all() and a != b  # the scenario
    made = report_table.report_groups(site, groups, group_of_row, C_Z, _fill(X), None)
    assert made.split == 2 and made.carried == 1 and made.why == ""
    report = made.groups
    parts = report.n_groups - 2 + np.arange(2)
    assert report.counts[parts].tolist() == [3, 3] and report.present[parts, 2].tolist() == [3, 2]
    left_rows = X.shape[0] - np.array([6, 5, 3])
    np.testing.assert_allclose(report.sums[parts[0], :2], X[left_rows, :2].sum(0), rtol=1e-12)
    assert not np.isclose(report.sums[parts[0], 2], X[left_rows, 2].sum(), atol=1e-3)
    np.testing.assert_allclose(report.sums[:, 2].sum(), groups.sums[:, 2].sum(), rtol=1e-12)
    # the stood-in means: each cluster's groups whole (means left or right of x = 0), one shift
    side = [np.asarray(groups.means)[:, 0] < 0, np.asarray(groups.means)[:, 0] >= 0]
    at = [groups.sums[s, 2].sum() / groups.present[s, 2].sum() for s in side]
    shift = (groups.sums[[a, b], 2].sum() - (3 * at[0] + 2 * at[1])) / 5
    np.testing.assert_allclose(report.sums[parts, 2], [3 * (at[0] + shift), 2 * (at[1] + shift)],
                               rtol=1e-12)
    # the audit re-run: rows and each feature's cells, the parts reporting x and y only
    old = [np.flatnonzero(group_of_row == j) for j in range(groups.n_groups)]
    new = [np.flatnonzero(made.group_of_row == j) for j in parts.tolist()]
    everything = old + new
    offsets = np.concatenate([[0], np.cumsum([m.size for m in everything])]).astype(np.int64)
    members = np.concatenate(everything).astype(np.int64)

    def present(rows):
        return ~np.isnan(X[rows])

    def audit(carried):
        def reports(ids):
            return np.array([(present(members[offsets[g]:offsets[g + 1]]).sum(0) >= 2)
                             & ~(carried & (g >= len(old))) for g in np.asarray(ids).tolist()])
        return span_audit.audit(offsets, members, X.shape[0], np.arange(len(old), len(everything)),
                                np.full(len(everything), 2), 2, lambda u, w: False, present,
                                reports)
    assert audit(np.array([False, False, True])) == []
    assert audit(np.zeros(3, dtype=bool)) != []  # the parts' own z: B's left cell, isolated


def _z_attack(coordinator, X, site):
    """The left cluster's z sum (the run's space: no cell of the left part is missing)
    less every pair known to lie left and group A's released z sum: B's left row's z,
    where the left part releases its rows' own."""
    from fedcluster import client_app as client_module
    from fedcluster.common import protocol

    client_module.MEMORY_SITES[coordinator.token] = [site]  # (the site, with its facts)
    groups, group_of_row = group_table.build(site, 2)
    means, counts = np.asarray(groups.means), np.asarray(groups.counts)
    arrays, _ = coordinator.ask("evaluate", [C_Z], report=True, transform=_fill(X))
    reply = protocol.reply_arrays("evaluate", arrays)
    pairs_left = (means[:, 0] < -10)
    known = (counts[pairs_left] * means[pairs_left, 2]).sum() + groups.sums[group_of_row[-6], 2]
    return reply.sums[0][2] - known, reply


def test_a_carried_feature_gives_its_cell_without_the_carry(site_factory, monkeypatch):
    """Shown first without the carry (the report's cut checks and audit switched off):
    the left part less what the coordinator knows is B's left row's z, exactly."""
    X, site = _two_groups_across()
    monkeypatch.setattr(report_cuts, "exposed", lambda site, rows, g, *rest: (
        np.zeros(int(g.max()) + 1, dtype=bool), np.zeros(site.n_features, dtype=bool)))
    monkeypatch.setattr(audit, "judge", lambda *a, **k: [])
    recovered, reply = _z_attack(site_factory(X, {}), X, site)
    assert reply.counts.tolist()[0] == 18 + 3  # nine pairs, and the left part's 3 rows
    assert np.isclose(recovered, X[-3, 2], atol=1e-9)


def test_a_carried_feature_gives_no_cell_through_the_report(site_factory):
    """Through the report: the groups are split (the left cluster counts the three
    target rows on the left) and z carried, so the attack's difference is no cell."""
    X, site = _two_groups_across()
    recovered, reply = _z_attack(site_factory(X, {}), X, site)
    assert reply.counts.tolist()[0] == 18 + 3
    cells = X[-6:, 2][~np.isnan(X[-6:, 2])]
    assert not np.isclose(recovered, cells, atol=1e-3).any()


def test_a_deployed_site_audits_and_records_a_carried_feature(tmp_path):
    """The same two groups read from a file through a schema and a cache: the record's
    audit (every group the site answered from) passes the parts because they report no
    value of z, and fails them where they would (the same call without the carried
    feature); the release step records z as carried by the parts (CARRIED stand-ins), so
    that every later audit judges them so."""
    from fedcluster.client_app.data.schema_table import load_schema_table
    from fedcluster.client_app.release import record
    from fedcluster.common.schema import load_schema

    X, _ = _two_groups_across()
    schema_path = tmp_path / "schema.toml"
    schema_path.write_text('missing = "impute-mean"\n' + "".join(
        f'[[columns]]\nname = "{name}"\n' for name in ("x", "y", "z")))
    path = tmp_path / "site.csv"
    path.write_text("x,y,z\n" + "".join(",".join("" if np.isnan(v) else repr(float(v)) for v in row)
                                       + "\n" for row in X))
    cache = tmp_path / "cache"
    site = load_schema_table(path, load_schema(schema_path), cache_dir=cache)
    groups, _ = group_table.site_groups(site, 2, cache)
    group_of_row = group_table.row_groups(site, 2, cache)
    made = report_table.report_groups(site, groups, group_of_row, C_Z, _fill(X), None)
    assert made.split == 2 and made.carried == 1 and made.why == ""
    with record.Record.of(groups.table_ref).held() as store:
        instance = report_table.row_instances(site, store)
        parts = [instance[part] for part in made.parts]

        def present(instances):
            return store.present_cells(instances, 3)
        units = np.full(len(parts), -1)
        assert audit.judge(store, parts, units, 2, present, 3, made.carried_features) == []
        assert audit.judge(store, parts, units, 2, present, 3) != []
        assert gate.admit_report(store, groups.table_ref.number, parts, made.carried_features,
                                 2, 3).admitted
    store = record.Store.open(Path(groups.table_ref.store))
    carried = store.stood_in(3, kinds=(record.CARRIED,))
    assert carried[store.report_group_mask()].tolist() == [[False, False, True]] * 2
    assert not carried[~store.report_group_mask()].any()


def test_a_site_logs_its_report_once_per_run(caplog):
    """Issue 70: a run asks for the final model's report in three rounds (the evaluation,
    Davies-Bouldin's, the profile); each site says what its report did once per run, not
    once per round, and says it again in the next run."""
    import logging

    import fedcluster

    sites = [_site(seed) for seed in (3, 4, 5)]

    def lines():
        return [r.getMessage() for r in caplog.records
                if "the report splits" in r.getMessage() or "the report counts" in r.getMessage()]

    # (Flower's logger at INFO, whatever an earlier test of this process set it to)
    with caplog.at_level(logging.INFO, logger="flwr"):
        fedcluster.simulate(sites, n_clusters=3, num_rounds=3, seed=1)
        first = lines()
        caplog.clear()
        fedcluster.simulate(sites, n_clusters=3, num_rounds=3, seed=1)
        second = lines()
    said = [line.split(":")[0] for line in first]
    assert len(said) == 3 and sorted(said) == ["site 0", "site 1", "site 2"]
    assert second == first

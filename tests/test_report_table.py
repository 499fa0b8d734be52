"""The report's groups within the final model's clusters (``client_app/data/report_table.py``,
issue 56): what a report task answers from, and what it does not give a coordinator."""

from __future__ import annotations

import numpy as np

from fedcluster.client_app.data import group_table, report_table
from fedcluster.client_app.data.site_data import SiteData
from fedcluster.client_app.release import span_audit


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


def test_a_cut_of_one_row_is_not_answered():
    """The attack: a coordinator places a boundary through one group so that one of its
    rows falls on the other side, alone: the part less the group would be that row."""
    X = _site(5, 60)
    site = SiteData(np.ascontiguousarray(X), None, None, "site")
    groups, group_of_row = group_table.build(site, 2)
    target = np.flatnonzero(group_of_row == 0)
    a, b = X[target[0]], X[target[1]]
    # two centroids just either side of the midpoint between the group's two rows, far
    # from everything else along the axis between them
    mid, axis = (a + b) / 2, (b - a) / np.linalg.norm(b - a)
    C = np.stack([mid - 1e-3 * axis, mid + 1e-3 * axis])
    made = report_table.report_groups(site, groups, group_of_row, C, None, None)
    # whatever straddles, no combination isolates fewer than 2 rows: here every group
    # the boundary cuts stays whole unless the cut holds 2 or more rows on each side
    if made.split:
        old = [np.flatnonzero(group_of_row == j) for j in range(groups.n_groups)]
        new = [np.flatnonzero(made.group_of_row == j) for j in range(made.groups.n_groups)]
        everything = old + new
        offsets = np.concatenate([[0], np.cumsum([m.size for m in everything])]).astype(np.int64)
        assert span_audit.audit(offsets, np.concatenate(everything).astype(np.int64), X.shape[0],
                                np.arange(len(old), len(everything)), np.full(len(everything), 2),
                                2, lambda u, w: False) == []
    # the group of the target rows is never split into its two single rows
    assert not any(np.array_equal(np.flatnonzero(made.group_of_row == j), target[:1])
                   for j in range(made.groups.n_groups)) if made.group_of_row is not None else True


def test_without_the_audit_the_lone_row_would_leave():
    """Shown first without the gate: pooling a cut's rows where a straddler's minority is
    one row gives that row as the part less the group (the attack the audit stops)."""
    X = _site(5, 60)
    site = SiteData(np.ascontiguousarray(X), None, None, "site")
    groups, group_of_row = group_table.build(site, 2)
    target = np.flatnonzero(group_of_row == 0)
    a, b = X[target[0]], X[target[1]]
    mid, axis = (a + b) / 2, (b - a) / np.linalg.norm(b - a)
    C = np.stack([mid - 1e-3 * axis, mid + 1e-3 * axis])
    cluster = _cluster(X, C)
    # every straddler's rows pooled per cluster, no gate: a part minus its straddlers
    straddle = [j for j in range(groups.n_groups)
                if np.unique(cluster[group_of_row == j]).size > 1]
    assert 0 in straddle
    part = np.flatnonzero(np.isin(group_of_row, straddle) & (cluster == cluster[target[0]]))
    rest = np.setdiff1d(np.flatnonzero(np.isin(group_of_row, straddle)), part)
    smaller = min(part.size, rest.size)
    if smaller < 2:  # the combination part - its groups' rows on that side isolates them
        made = report_table.report_groups(site, groups, group_of_row, C, None, None)
        assert made.split == 0 and made.why


def test_one_partition_per_version():
    X = _site(3, 600)
    site = SiteData(np.ascontiguousarray(X), None, None, "site")
    groups, group_of_row = group_table.build(site, 2)
    first = report_table.report_groups(site, groups, group_of_row, C3, None, None)
    again = report_table.report_groups(site, groups, group_of_row, C3, None, None)
    assert first.split > 0 and again.groups.digest == first.groups.digest
    other = report_table.report_groups(site, groups, group_of_row, C3 + 0.3, None, None)
    assert other.split == 0 and "another partition" in other.why
    assert other.groups is groups  # counted whole, as before the report

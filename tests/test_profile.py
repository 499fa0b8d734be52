"""Table 1 by cluster, its maths (issues 36, 44): a site's cluster profile from its groups
(``client_app/site_profile.py``) pooled into tidy rows (``common/profile.py``), checked
against pandas on the pooled rows, each row given its group's cluster (and its group's
spread as the site keeps it: a spread unit's share, release/spreads.py); the small-cell
rule on the pooled counts; a cluster a site withheld shown as intervals."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fedcluster.client_app.data import group_table
from fedcluster.client_app.data.site_data import SiteData
from fedcluster.client_app.site_groups import TableFacts
from fedcluster.client_app.site_profile import site_profile
from fedcluster.common import profile
from test_site_groups import as_the_groups_keep_them, with_kept_means, with_kept_spreads

LEVELS = ("a", "b", "c")
VARIABLES = [profile.Variable("age", "numeric", (0,), "years"),
             profile.Variable("crp", "numeric", (1,), "mg/L"),
             profile.Variable("ward", "categorical", (2, 3, 4), "", LEVELS, 1.5)]
LOWER, UPPER, BINS = np.array([0.0, 0.0, 0, 0, 0]), np.array([100.0, 20.0, 1, 1, 1]), 200


def _sites(seed=0):
    rng = np.random.default_rng(seed)
    sites = []
    for s, n in enumerate((150, 120, 90)):
        age = rng.normal(40 + 10 * s, 12, n).clip(1, 99)
        crp = rng.gamma(2.0, 2.0 + s, n).clip(0, 19.9)
        crp[rng.random(n) < 0.1] = np.nan  # missing cells
        ward = rng.choice(3, n, p=(0.5, 0.3, 0.2))
        onehot = np.eye(3)[ward] * 1.5
        sites.append(np.column_stack([age, crp, onehot]))
    return sites


CENTROIDS = np.array([[30.0, 4.0], [50.0, 8.0], [70.0, 6.0]])


def _run(sites, p_site, floor):
    """Every site's profile at p_site (each site's floor ``floor``), the rows with their
    group's cluster."""
    k, d = len(CENTROIDS), sites[0].shape[1]
    references = np.column_stack([CENTROIDS, np.zeros((k, 3))])
    replies, labelled, site_rows = {}, [], {}
    for s, X in enumerate(sites):
        facts = TableFacts(None, "", 0, {"crp": int(np.isnan(X[:, 1]).sum())})
        data = SiteData(X, None, None, f"site {s}", table=facts)
        absent = np.isnan(X)  # missing in the data
        if p_site == 1:
            groups, group_of_row = group_table.rows_as_groups(data), np.arange(len(X))
        else:
            groups, group_of_row = group_table.build(data, p_site)
            X = with_kept_means(as_the_groups_keep_them(X, group_of_row, p_site), group_of_row,
                                groups)  # what the groups keep
            # the numeric columns' spreads as kept (a level's count is a sum: exact)
            X[:, :2] = with_kept_spreads(X[:, :2], group_of_row, np.asarray(groups.m2)[:, :2])
        means = np.nan_to_num(groups.means[:, :2], nan=5.0)
        cluster = ((means[:, None] - CENTROIDS[None]) ** 2).sum(-1).argmin(1)
        replies[f"site {s}"] = site_profile(groups, cluster, references, LOWER, UPPER, BINS,
                                            profile.level_weights(VARIABLES, d), floor)
        site_rows[f"site {s}"] = groups.n_rows
        labels = cluster[group_of_row]  # each row in its group's cluster
        frame = pd.DataFrame({"age": X[:, 0], "crp": X[:, 1],
                              "ward": np.array(LEVELS)[X[:, 2:].argmax(1)],
                              "cluster": labels, "site": f"site {s}",
                              # present in the data, withheld by the groups' lone-cell rule
                              **{f"{name} missing": absent[:, j] for j, name in enumerate(("age", "crp"))},
                              **{f"{name} withheld": np.isnan(X[:, j]) & ~absent[:, j]
                                 for j, name in enumerate(("age", "crp"))}})
        labelled.append(frame)
    pooled = profile.pool(list(replies.values()))
    answered = profile.Answered(sum(site_rows.values()), floor, replies, site_rows,
                                dict.fromkeys(replies, floor))
    rows = profile.table1_rows(pooled, VARIABLES, references, LOWER, UPPER, floor, answered)
    return rows, pd.concat(labelled, ignore_index=True)


def _value(rows, cluster, variable, statistic, level=""):
    hits = [r["value"] for r in rows if (r["cluster"], r["variable"], r["level"],
                                         r["statistic"]) == (cluster, variable, level, statistic)]
    assert len(hits) == 1, (cluster, variable, level, statistic, hits)
    return hits[0]


@pytest.mark.parametrize("p_site", [1, 2, 3])
def test_means_sds_counts_equal_pandas_on_the_pooled_rows(p_site):
    rows, frame = _run(_sites(), p_site, floor=1)
    for cluster, part in [*[(str(c), frame[frame.cluster == c]) for c in range(3)],
                          ("all", frame)]:
        assert _value(rows, cluster, "size", "n") == len(part)
        for name in ("age", "crp"):
            assert _value(rows, cluster, name, "n") == part[name].count()
            assert _value(rows, cluster, name, "mean") == pytest.approx(part[name].mean(), abs=1e-9)
            assert _value(rows, cluster, name, "sd") == pytest.approx(part[name].std(), abs=1e-9)
            assert _value(rows, cluster, name, "missing n") == part[f"{name} missing"].sum()
            withheld = [r["value"] for r in rows if (r["cluster"], r["variable"], r["statistic"])
                        == (cluster, name, "withheld n")]
            assert withheld == ([part[f"{name} withheld"].sum()] if frame[f"{name} withheld"].any()
                                else [])
        for level in LEVELS:
            assert _value(rows, cluster, "ward", "n", level) == (part.ward == level).sum()
            assert _value(rows, cluster, "ward", "%", level) == pytest.approx(
                100 * (part.ward == level).mean(), abs=1e-9)
        for site, here in part.groupby("site"):
            assert _value(rows, cluster, "site", "n", site) == len(here)


def test_medians_and_quartiles_within_one_bin_on_rows():
    rows, frame = _run(_sites(), 1, floor=1)
    width = (UPPER[:2] - LOWER[:2]) / BINS
    for cluster, part in [*[(str(c), frame[frame.cluster == c]) for c in range(3)],
                          ("all", frame)]:
        for j, name in enumerate(("age", "crp")):
            for stat, q in (("q1", 0.25), ("median", 0.5), ("q3", 0.75)):
                assert abs(_value(rows, cluster, name, stat) - part[name].quantile(q)) <= width[j]


def test_the_rule_works_on_the_pooled_counts():
    """Groups of 5 at floor 5: sites 1 and 2 hold 3 rows of ward c each, one site in
    cluster 0, the other in cluster 2, which they send whole (in the past each withheld
    them). A pooled count of 1 to 4 reads <5, one of 5
    or more is exact, both sites' rows in it; a suppressed count is not 1 to 4."""
    sites = _sites()
    for X in sites:  # ward c only at sites 1 and 2, 3 rows each
        X[:, 2:] = np.eye(3)[(X[:, 3] > 0).astype(int)] * 1.5
    for X, age in ((sites[1], 25.0), (sites[2], 75.0)):  # (clusters 0 and 2)
        X[:3, 2:] = np.eye(3)[[2, 2, 2]] * 1.5
        X[:3, 0] = age
    floor = 5
    rows, frame = _run(sites, 5, floor)
    marks = {"<5": 0, "suppressed": 0}
    for cluster, part in [*[(str(c), frame[frame.cluster == c]) for c in range(3)],
                          ("all", frame)]:
        assert _value(rows, cluster, "size", "n") == len(part)
        for level in LEVELS:
            truth, value = int((part.ward == level).sum()), _value(rows, cluster, "ward", "n", level)
            if value == "<5":
                assert 1 <= truth < 5
            elif value == "suppressed":
                assert not 1 <= truth < 5
            else:
                assert value == truth and not 1 <= truth < 5
                assert _value(rows, cluster, "ward", "%", level) == pytest.approx(
                    100 * truth / len(part), abs=1e-9)
            marks[value] = marks.get(value, 0) + 1
    assert marks["<5"] and marks["suppressed"]
    assert int((frame.ward == "c").sum()) == 6  # (so all rows' count may be shown)
    # (here it is withheld too: with the other clusters' 0 and <5 shown, 6 would tell
    # that cluster 0's <5 is at least 2)
    assert _value(rows, "all", "ward", "n", "c") == "suppressed"


def test_a_cluster_a_site_withheld_reads_as_intervals_that_hold():
    """Groups of 2 at floor 5: site 2 holds 3 rows of cluster 2, under its floor, and
    withholds that cluster (as every task does). The table cannot know those rows: the
    cluster's size and counts (and all rows') read lo-hi and hold the rows' own, its
    means are of the rows shown, and site 2's composition there reads <5."""
    sites = _sites()
    X = sites[2]
    X[:, 0] = 30.0 + np.arange(len(X)) % 7  # site 2: young, so cluster 0 ...
    X[:3, :2] = [[75.0, 6.0], [76.0, 6.0], [77.0, 6.0]]  # ... but for 3 rows of cluster 2
    rows, frame = _run(sites, 2, floor=5)
    here = frame[(frame.site == "site 2") & (frame.cluster == 2)]
    assert len(here) == 3
    shown_rows = frame.drop(here.index)
    for cluster in ("2", "all"):
        part = frame if cluster == "all" else frame[frame.cluster == 2]
        shown = shown_rows if cluster == "all" else shown_rows[shown_rows.cluster == 2]
        assert _value(rows, cluster, "size", "rows shown") == len(shown)
        for name, level, truth in [("size", "", len(part)), ("crp", "", part.crp.count()),
                                   ("ward", "a", int((part.ward == "a").sum()))]:
            value = _value(rows, "all" if cluster == "all" and name == "size" else cluster,
                           name, "n", level)
            if name == "size" and cluster == "all":
                assert value == len(frame)  # all rows: each site's row count, exact
                continue
            if value != "suppressed":  # (withheld so that no <5 can be worked out)
                low, high = map(int, value.split("-"))
                assert low <= truth <= high, (cluster, name, value, truth)
        assert _value(rows, cluster, "age", "mean") == pytest.approx(shown.age.mean(), abs=1e-9)
    assert _value(rows, "2", "site", "n", "site 2") == "<5"
    assert _value(rows, "2", "site", "n", "site 0") == int(
        ((frame.site == "site 0") & (frame.cluster == 2)).sum())


def test_a_constant_column_has_its_value_as_median_and_quartiles():
    """A column whose present values are all one value (a blank pixel, a fixed dose): its
    quartiles are that value, not a point spread over the value's bin."""
    sites = _sites()
    for X in sites:
        X[:, 0] = 37.0
    rows, frame = _run(sites, 2, floor=1)
    for cluster in [*map(str, sorted(set(frame.cluster))), "all"]:
        assert _value(rows, cluster, "age", "sd") == pytest.approx(0.0, abs=1e-9)
        for stat in ("q1", "median", "q3"):
            assert _value(rows, cluster, "age", stat) == pytest.approx(37.0, abs=1e-9)
    # (the other columns keep their histogram quartiles)
    assert _value(rows, "all", "crp", "q1") != _value(rows, "all", "crp", "q3")


def test_the_profile_is_the_same_a_slab_of_groups_at_a_time(monkeypatch):
    """The site's pass goes a slab of groups at a time (memory on large sites): slabs of
    5 groups give the profile of one slab, counts exactly, sums to rounding."""
    from fedcluster.client_app import site_profile as module

    whole, _ = _run(_sites(), 2, floor=2)
    monkeypatch.setattr(module, "SLAB_GROUPS", 5)
    slabs, _ = _run(_sites(), 2, floor=2)
    assert [(r["cluster"], r["variable"], r["level"], r["statistic"]) for r in whole] == \
        [(r["cluster"], r["variable"], r["level"], r["statistic"]) for r in slabs]
    for a, b in zip(whole, slabs):
        if isinstance(a["value"], str):
            assert a["value"] == b["value"]
        else:
            assert b["value"] == pytest.approx(a["value"], rel=1e-12, abs=1e-12), a


def test_no_quartile_lies_outside_what_the_groups_span_without_a_schema():
    """Digits (no schema, so no declared range; pixels 0 to 16): the histograms span the
    sites' least to greatest group means (``value_range``), so every median and quartile
    of Table 1 lies within the pixels' own span. With a mean +- 3 SD range, as before,
    pixel_0_1's quartiles read -0.00878 [-0.0496, 0.0321]."""
    import fedcluster
    from fedcluster.common.datasets import load_builtin
    from fedcluster.server_app.table1 import table1_markdown

    X = load_builtin("digits")[0]
    result = fedcluster.simulate(num_sites=3, dataset="digits", n_clusters=10, num_rounds=10)
    assert [h["task"] for h in result.history][-2:] == ["value_range", "profile"]
    rows = result.model.table1["rows"]
    names = [f"pixel_{i}_{j}" for i in range(8) for j in range(8)]
    quartiles = [(r["variable"], r["value"]) for r in rows
                 if r["statistic"] in ("q1", "median", "q3") and not isinstance(r["value"], str)]
    assert len(quartiles) == 3 * 64 * 11
    for name, value in quartiles:
        column = X[:, names.index(name)]
        assert column.min() <= value <= column.max(), (name, value)
    # medians and quartiles estimated from groups say how (issue 70: the rows', estimated)
    assert "estimated from their groups' means" in table1_markdown(rows, result.model.table1)

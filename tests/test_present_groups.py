"""Groups that keep present values (issue 56): a group that would hold a feature's present
cell alone (1 to p_site - 1 of them) is merged with a near group that mends it
(``client_app/data/present_groups.py``), so the lone-cell rule withholds nothing where a
site holds at least p_site present cells of every feature (it withheld half as many
cells as were missing, and more)."""

from __future__ import annotations

import numpy as np
import pytest

from fedcluster.client_app.data import group_table, grouping, present_groups
from fedcluster.client_app.data.schema_table import load_schema_table
from fedcluster.client_app.data.site_data import SiteData
from fedcluster.client_app.site_groups import TableFacts
from fedcluster.common.clinical_demo import write_clinical
from fedcluster.common.schema import load_schema


@pytest.fixture(scope="module")
def demo_site(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("demo")
    schema, path = write_clinical(tmp / "data", n_sites=1, seed=3)
    return load_schema_table(path, load_schema(schema), cache_dir=tmp / "cache")


def _present_per_group(X, labels):
    n_groups = int(labels.max()) + 1
    return np.stack([np.bincount(labels, weights=~np.isnan(X[:, j]), minlength=n_groups)
                     for j in range(X.shape[1])], axis=1)


@pytest.mark.parametrize("p_site", [2, 3, 5, 10])
def test_no_present_value_is_left_alone_and_none_is_withheld(demo_site, p_site):
    site = demo_site
    X = site.X
    groups, labels = group_table.build(site, p_site)
    present = _present_per_group(X, labels)
    # computed here from the rows: the present cells a group holds 1 to p - 1 of
    assert not np.any((present > 0) & (present < p_site))
    assert groups.cells_withheld == 0 and groups.withheld is None
    assert int(np.asarray(groups.present).sum()) == int((~np.isnan(X)).sum())
    sizes = np.bincount(labels)
    assert sizes.min() >= p_site and sizes.sum() == len(X)


def test_the_grouping_alone_leaves_lone_cells_that_merging_mends(demo_site):
    """What the step is for: the grouping's own groups leave many present cells alone at
    p_site 3; each group the step forms is a union of the grouping's groups."""
    site = demo_site
    X = site.X
    filled = np.where(np.isnan(X), np.nanmean(X, axis=0), X)
    before = grouping.group_rows(filled, 3, grouping.grouping_scale(filled))
    present = _present_per_group(X, before)
    assert int(present[(present > 0) & (present < 3)].sum()) > 0.5 * int(np.isnan(X).sum())
    _, after = group_table.build(site, 3)
    for g in np.unique(before):  # a group of the grouping lies within one merged group
        assert len(np.unique(after[before == g])) == 1


def test_merging_is_a_function_of_the_rows_and_leaves_complete_rows_alone(demo_site):
    site = demo_site
    a = group_table.build(site, 2)[1]
    b = group_table.build(SiteData(site.X.copy(), site.feature_names, site.labels, site.source,
                                   label_names=site.label_names, table=site.table), 2)[1]
    assert np.array_equal(a, b)
    # without a missing cell there is nothing to mend: the grouping's labels as they are
    rng = np.random.default_rng(0)
    full = rng.normal(size=(400, 5))
    facts = TableFacts(None, "", 0, {})
    labels = group_table.build(SiteData(full, None, None, "full", table=facts), 3)[1]
    alone = grouping.group_rows(full, 3, grouping.grouping_scale(full))
    # the same partition (the table numbers its groups in canonical order)
    pairs = np.unique(np.column_stack([labels, alone]), axis=0)
    assert len(pairs) == labels.max() + 1 == alone.max() + 1


def test_merge_picks_the_cheapest_mend_among_near_groups():
    """Four groups on a line: group 0 holds one present cell of feature 1; group 1 (near)
    holds none of it, group 2 (a little farther) two, group 3 (far) two: 0 merges with 2,
    the nearest that mends it."""
    labels = np.repeat(np.arange(4), 2)
    counts = np.full(4, 2)
    means = np.array([[0.0, 0.0], [0.1, 0.0], [1.0, 0.0], [9.0, 0.0]])
    present = np.array([[2, 1], [2, 0], [2, 2], [2, 2]])
    out = present_groups.merge_lone_groups(labels, counts, means * 2, present, 2)
    assert out.tolist() == [0, 0, 1, 1, 0, 0, 2, 2]  # numbered by first appearance
    shuffled = present_groups.merge_lone_groups(np.array([3, 3, 1, 1, 2, 2, 0, 0]), counts[[3, 1, 2, 0]],
                                                (means * 2)[[3, 1, 2, 0]], present[[3, 1, 2, 0]], 2)
    assert shuffled.tolist() == [0, 0, 1, 1, 0, 0, 2, 2]  # whatever the groups' numbers


def test_a_feature_too_rare_to_mend_stays_withheld():
    """One present cell of a feature in the whole site: no merge can give it company of
    p_site - 1 more, so nothing merges for it and the rule withholds it."""
    labels = np.repeat(np.arange(3), 2)
    counts = np.full(3, 2)
    sums = np.array([[0.0], [2.0], [4.0]])
    present = np.array([[1], [0], [0]])
    out = present_groups.merge_lone_groups(labels, counts, sums, present, 2)
    assert np.array_equal(out, labels)


def test_a_floor_raised_over_answered_groups_keeps_every_present_value(tmp_path):
    """A site answered at p_site 2, then at 10 under the same cache (a new version of its
    table, ``versions/``): a kept group of 10 rows or more that would hold a value alone at
    10 is grouped anew, and the new groups are merged like a fresh table's, before the
    versions audit judges them; every row answered, no value withheld."""
    schema, path = write_clinical(tmp_path / "data", n_sites=1, seed=3)
    site = load_schema_table(path, load_schema(schema), cache_dir=tmp_path / "reread")
    at_2, _ = group_table.site_groups(site, 2, tmp_path / "cache")
    at_10, grouped = group_table.site_groups(site, 10, tmp_path / "cache")
    assert at_2.cells_withheld == at_10.cells_withheld == 0
    assert at_10.waiting == at_10.held_back == 0 and grouped is None
    assert at_10.n_rows == len(site.X) and at_10.counts.min() >= 10

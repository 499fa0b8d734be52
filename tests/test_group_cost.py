"""The site check's cost table (issue 45, must-show 3): what a site's groups at p cost its
own k-means, from its rows alone (``client_app/data/group_cost.py``).

Each figure is checked against the same quantity computed here, independently of the
module: the rows z-scored by scikit-learn's ``StandardScaler``, the groups' means and sizes
by numpy from the grouping's group ids (``group_rows``, the site's own grouping: what is
measured), the fits by scikit-learn's ``KMeans`` and the objective by broadcasting.
"""

from __future__ import annotations

import contextlib
import io
import re

import numpy as np
import pytest
from sklearn.cluster import KMeans
from sklearn.preprocessing import StandardScaler
from threadpoolctl import threadpool_limits

from fedcluster.cli import main
from spread_reference import split_stats
from fedcluster.client_app.data import group_cost as gc
from fedcluster.client_app.release import dominance
from fedcluster.client_app.data.grouping import group_rows, grouping_scale
from fedcluster.client_app.data.site_data import SiteData
from fedcluster.client_app.site_groups import TableFacts


# ------------------------------------------------------------------ computed here
def objective(Z: np.ndarray, C: np.ndarray) -> float:
    return float(((Z[:, None, :] - C[None]) ** 2).sum(axis=2).min(axis=1).sum())


def kmeans(points, k, weights=None, init=None) -> np.ndarray:
    model = KMeans(n_clusters=k, n_init=gc.N_STARTS if init is None else 1,
                   init="k-means++" if init is None else init, random_state=gc.SEED)
    return model.fit(points, sample_weight=weights).cluster_centers_


def means_rule(X: np.ndarray, group_of_row: np.ndarray, judged: np.ndarray | None = None):
    """The p% rule on means (``release/dominance.py``), from the rows: which (group,
    feature) a row dominates (at least DOMINANT_SD of the feature's SD from the site's
    mean, the group's other rows' summed deviations under ESTIMATE_WITHIN of its own),
    and the mean that stands in (the feature's over the cells of no flagged group)."""
    n_groups = group_of_row.max() + 1
    present = ~np.isnan(X)
    values = np.where(present, X, 0.0)
    mean = values.sum(axis=0) / present.sum(axis=0)
    sd = np.sqrt((values ** 2).sum(axis=0) / present.sum(axis=0) - mean ** 2)
    deviation = np.where(present, X - mean, 0.0)
    total = np.zeros((n_groups, X.shape[1]))
    np.add.at(total, group_of_row, deviation)
    rest = total[group_of_row] - deviation  # each row's group's other rows
    dominates = present & (np.abs(deviation) >= dominance.DOMINANT_SD * sd) & \
        (np.abs(rest) < dominance.ESTIMATE_WITHIN * np.abs(deviation))
    flagged = np.zeros((n_groups, X.shape[1]), dtype=bool)
    np.logical_or.at(flagged, group_of_row, dominates)
    if judged is not None:  # (a schema's numeric columns: group_table.judged_features)
        flagged &= judged[None, :]
    kept = present & ~flagged[group_of_row]
    return flagged, np.where(kept, X, 0.0).sum(axis=0) / np.maximum(kept.sum(axis=0), 1)


def group_means(X: np.ndarray, group_of_row: np.ndarray, p: int, fill: np.ndarray,
                kept_m2: np.ndarray | None = None, judged: np.ndarray | None = None):
    """The groups' means as a run sees them, their sizes and per-feature variances, from
    the group ids: a feature's present cells in a group kept where they number at least p
    (else all of them count as missing), every missing cell at ``fill``. ``kept_m2``: the
    squared deviations of each group's kept present cells as the site releases them (the
    spread rule shares a unit's spread among its groups: ``release/spreads.py``, tested on
    its own); the filled cells' part is added here (m filled cells of value f among n add
    c m / n (mean_present - f)^2); None: the groups' own, from the rows. A group's
    present cells of a feature whose sum the p% rule on means withholds are at the
    mean that stands in (:func:`means_rule`; from p = ``MEANS_FROM_P``)."""
    n_groups = group_of_row.max() + 1
    if p >= dominance.MEANS_FROM_P:
        flagged, stand_in = means_rule(X, group_of_row, judged)
        X = np.where(flagged[group_of_row] & ~np.isnan(X), stand_in, X)
    sizes = np.bincount(group_of_row, minlength=n_groups).astype(float)
    missing = np.isnan(X)
    present = np.zeros((n_groups, X.shape[1]))
    np.add.at(present, group_of_row, (~missing).astype(float))
    withheld = missing | (present < p)[group_of_row]
    seen = np.where(withheld, fill, X)  # each cell as a run sees it
    sums = np.zeros((n_groups, X.shape[1]))
    np.add.at(sums, group_of_row, seen)
    means = sums / sizes[:, None]
    if kept_m2 is None:
        m2 = np.zeros_like(sums)
        np.add.at(m2, group_of_row, (seen - means[group_of_row]) ** 2)
        return means, sizes, m2 / sizes[:, None]
    kept = np.where(present >= p, present, 0.0)
    present_sums = np.zeros_like(sums)
    np.add.at(present_sums, group_of_row, np.where(withheld, 0.0, X))
    gap = np.where(kept > 0, present_sums / np.maximum(kept, 1.0) - fill, 0.0)
    m2 = kept_m2 + kept * (sizes[:, None] - kept) / sizes[:, None] * gap * gap
    return means, sizes, m2 / sizes[:, None]


def split_lloyd(means, sizes, variances, C, iters=gc.SPREAD_ITERS, tol=gc.SPREAD_TOL):
    """Lloyd on groups split by their spread (``spread_reference``), to convergence."""
    for _ in range(iters):
        sums, counts = split_stats(means, sizes, variances, C)
        new = np.where(counts[:, None] > 0, sums / np.where(counts > 0, counts, 1.0)[:, None], C)
        moved = np.linalg.norm(new - C)
        C = new
        if moved < tol:
            break
    return C


def as_site(X: np.ndarray) -> SiteData:
    return SiteData(X, None, None, "site", table=TableFacts(None, "", 0, {"a": 1}))


def expected_table(X, site_p, k_values, max_rows=None, site=None):
    """(ratios, rows' objective, groups' objective, groups per p) as the module's docstring
    defines them, computed without it: only the groups' ids come from the site's own
    grouping (``group_table.build``)."""
    from fedcluster.client_app.data import group_table

    site = as_site(X) if site is None else site
    n = X.shape[0]
    p_values = sorted({site_p, *gc.EXTRA_P_VALUES})
    missing = np.isnan(X)
    fill = np.where(missing, 0.0, X).sum(axis=0) / np.maximum((~missing).sum(axis=0), 1)
    filled = np.where(missing, fill, X)
    scaler = StandardScaler().fit(filled)
    rng = np.random.default_rng(gc.SEED)
    scored = np.sort(rng.choice(n, max_rows, replace=False)) if max_rows else np.arange(n)
    Z = scaler.transform(filled)[scored]
    points, n_groups = {}, []
    for p in p_values:
        if p == 1:
            n_groups.append(n)
            continue
        groups, group_of_row = group_table.build(site, p)
        means, sizes, variances = group_means(X, group_of_row, p, fill,
                                              np.asarray(groups.m2) if p >= 3 else None,
                                              group_table.judged_features(site))
        n_groups.append(len(sizes))
        if max_rows:
            chosen = np.sort(rng.choice(len(sizes), round(len(sizes) * max_rows / n),
                                        replace=False))
            means, sizes, variances = means[chosen], sizes[chosen], variances[chosen]
        # at p >= 3 a run's training splits groups by their spread: the fit is refined so
        points[p] = (scaler.transform(means), sizes,
                     variances / scaler.scale_ ** 2 if p >= 3 else None)
    groups_fit = np.full((len(k_values), len(p_values)), np.nan)
    rows_fit = np.full(len(k_values), np.nan)
    with threadpool_limits(1):
        for i, k in enumerate(k_values):
            starts = []
            for j, p in enumerate(p_values):
                if p in points and len(points[p][0]) >= k:
                    C = kmeans(points[p][0], k, points[p][1])
                    if points[p][2] is not None:
                        C = split_lloyd(points[p][0], points[p][1], points[p][2], C)
                    starts.append(C)
                    groups_fit[i, j] = objective(Z, C)
            rows_fit[i] = min([objective(Z, kmeans(Z, k))] +
                              [objective(Z, kmeans(Z, k, init=C)) for C in starts])
            groups_fit[i, [j for j, p in enumerate(p_values) if p == 1]] = rows_fit[i]
    return groups_fit / rows_fit[:, None], rows_fit, groups_fit, tuple(n_groups)


@pytest.fixture(scope="module")
def blob_rows():
    """400 rows, 4 features in different units, 5 clusters of different spreads."""
    rng = np.random.default_rng(11)
    centres = rng.normal(scale=3.0, size=(5, 4))
    which = rng.integers(0, 5, 400)
    X = centres[which] + rng.normal(size=(400, 4)) * (0.5 + which[:, None] * 0.3)
    return X * np.array([1.0, 10.0, 0.1, 100.0]) + np.array([0.0, 50.0, 3.0, 1000.0])


# ------------------------------------------------------------------ the figures
def test_the_figure_is_kmeans_on_the_rows_against_on_the_groups(blob_rows):
    k_values = (2, 3, 5, 8)
    table = gc.group_cost(blob_rows, 3, k_values)
    ratios, rows_fit, groups_fit, n_groups = expected_table(blob_rows, 3, k_values)
    assert table.p_values == (2, 3, 5, 10) and table.k_values == k_values
    assert table.n_groups == n_groups and table.sampled_rows is None
    np.testing.assert_allclose(table.rows_objective, rows_fit, rtol=1e-9)
    np.testing.assert_allclose(table.groups_objective, groups_fit, rtol=1e-9)
    np.testing.assert_allclose(table.ratios, ratios, rtol=1e-9)
    assert table.ratio(5, 10) == pytest.approx(ratios[2, 3], rel=1e-9)
    # the groups do cost something here (a check that could not see a cost would pass 1s)
    assert np.nanmax(table.ratios) > 1.005 and np.all(table.ratios >= 1 - 1e-12)
    lines = table.lines()
    assert lines[2] == "k | p = 2 | p = 3 (this site's) | p = 5 | p = 10"
    assert lines[5] == "5 | " + " | ".join(f"{r:.3f}" for r in ratios[2])
    assert lines[7] == "groups | " + " | ".join(str(g) for g in n_groups)


def test_a_large_site_is_fitted_on_the_sample_the_docstring_names(blob_rows):
    """Above max_rows: every row grouped, the fits and the objective on the seeded sample
    of rows and the same share of each p's groups."""
    X = np.vstack([blob_rows, blob_rows[::-1] + 0.01])  # 800 rows
    table = gc.group_cost(X, 2, (2, 4), max_rows=300)
    ratios, rows_fit, _, n_groups = expected_table(X, 2, (2, 4), max_rows=300)
    assert table.sampled_rows == 300 and table.n_rows == 800 and table.n_groups == n_groups
    np.testing.assert_allclose(table.rows_objective, rows_fit, rtol=1e-9)
    np.testing.assert_allclose(table.ratios, ratios, rtol=1e-9)
    assert "a seeded sample of 300 of the 800 rows" in table.lines()[1]


def test_missing_cells_and_lone_cells_sit_at_the_site_mean(blob_rows):
    """A site's rows with missing cells: grouped with each at its column's site mean, as
    the site groups them; a group's cells of a column fewer than p (the lone-cell rule)
    count as missing too, every missing cell at that mean; the p_site column's groups are
    those the site answers from."""
    from fedcluster.client_app.data import group_table

    X = blob_rows.copy()
    X[np.random.default_rng(2).random(X.shape) < 0.2] = np.nan
    # a column with 4 present cells: fewer than p in the site, so no merge of groups can
    # give them company (present_groups.py) and the rule withholds them
    X[:4, -1], X[4:, -1] = blob_rows[:4, -1], np.nan
    site = as_site(X)
    answered, _ = group_table.site_groups(site, 5)
    assert answered.cells_withheld > 0  # the rule withholds cells here
    table = gc.group_cost(site, 5, (2, 4), site_groups=answered)
    ratios, rows_fit, groups_fit, n_groups = expected_table(X, 5, (2, 4), site=site)
    np.testing.assert_allclose(table.rows_objective, rows_fit, rtol=1e-9)
    np.testing.assert_allclose(table.groups_objective, groups_fit, rtol=1e-9)
    np.testing.assert_allclose(table.ratios, ratios, rtol=1e-9)
    assert table.n_groups == n_groups and n_groups[1] == answered.n_groups
    # the same rows as an array (NaN: missing) give the same table
    np.testing.assert_array_equal(gc.group_cost(X, 5, (2, 4)).ratios, table.ratios)


def test_p_1_costs_nothing_and_too_few_groups_show_a_dash(blob_rows):
    X = blob_rows[:60]
    table = gc.group_cost(X, 1, (2, 7, 12), scale="none")
    assert table.p_values == (1, 2, 5, 10) and table.n_groups[0] == 60
    assert table.n_groups[1:] == tuple(group_rows(X, p, grouping_scale(X)).max() + 1
                                       for p in (2, 5, 10))
    np.testing.assert_array_equal(table.ratios[:, 0], 1.0)  # every group is one row
    too_few = np.array(table.k_values)[:, None] > np.array(table.n_groups)[None, :]
    assert too_few[1:, 3].all() and not too_few[0].any()  # p = 10: at most 6 groups
    np.testing.assert_array_equal(np.isnan(table.ratios), too_few)
    lines = table.lines()
    assert lines[-4].endswith("| -") and lines[-2] == "-: fewer groups than k at that p"
    assert "the rows as encoded (no scaling)" in lines[1]


@pytest.mark.parametrize("text, values", [("2-10", tuple(range(2, 11))), ("4", (4,)),
                                          ("8, 3,5,3", (3, 5, 8)), (" 2 - 3 ", (2, 3))])
def test_k_values_are_read_from_text(text, values):
    assert gc.parse_k_values(text) == values


@pytest.mark.parametrize("text, message", [
    ("5-2", "ends below its start"), ("1-4", "must be >= 2"), ("0", "must be >= 2"),
    ("two", "a range LO-HI"), ("2-", "a range LO-HI"), ("", "a range LO-HI")])
def test_a_bad_k_is_refused_with_what_to_write(text, message):
    with pytest.raises(ValueError, match=message):
        gc.parse_k_values(text)


def test_bad_input_is_refused(blob_rows):
    with pytest.raises(ValueError, match="too few rows for a cost table: 5, at least 6"):
        gc.group_cost(blob_rows[:5], 2, (3, 4))
    with pytest.raises(ValueError, match="scale must be one of"):
        gc.group_cost(blob_rows, 2, (2,), scale="minmax")
    with pytest.raises(ValueError, match="min-cluster-size must be an integer >= 1"):
        gc.group_cost(blob_rows, 0, (2,))
    with pytest.raises(ValueError, match="integers >= 2"):
        gc.group_cost(blob_rows, 2, (2.5,))
    with pytest.raises(ValueError, match="infinite"):
        gc.group_cost(np.where(blob_rows > 5, np.inf, blob_rows), 2, (2,))


# ------------------------------------------------------------------ the site check
@pytest.fixture(scope="module")
def clinical(tmp_path_factory):
    out = tmp_path_factory.mktemp("clinical")
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["partition", "--dataset", "clinical", "--num-sites", "3", "--seed", "0",
                     "--out", str(out)]) == 0
    return out


def site_check(*argv) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["site", "check", *map(str, argv)])
    return code, out.getvalue() + err.getvalue()


def test_site_check_shows_the_cost_table_on_the_clinical_demo(clinical):
    """The table `fedcluster site check` prints on a clinical demo site, against the same
    figures computed here from the site's rows (encoded as the check encodes them)."""
    from fedcluster.client_app.data.schema_table import encode_site_columns
    from fedcluster.client_app.data.table_files import read_table
    from fedcluster.common.schema import load_schema

    path, schema = clinical / "site-1.csv", clinical / "schema.toml"
    code, out = site_check(path, "--schema", schema, "--min-cluster-size", 3, "--cost-k", "2-5")
    assert code == 0
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Cost of the groups"))
    assert "computed here from its 565 rows (nothing is sent)" in lines[start]
    assert lines[start + 2] == "k | p = 2 | p = 3 (this site's) | p = 5 | p = 10"
    shown = np.array([[float(v) for v in line.split(" | ")[1:]]
                      for line in lines[start + 3:start + 7]])
    assert [line.split(" | ")[0] for line in lines[start + 3:start + 8]] == \
        ["2", "3", "4", "5", "groups"]
    assert start < next(i for i, line in enumerate(lines) if line.startswith("What a run sends"))
    # computed here: the site's rows, each missing cell at its column's site mean
    header, columns = read_table(path)
    site = encode_site_columns(header, columns, load_schema(schema), str(path), None)[0]
    ratios, *_ = expected_table(np.asarray(site.X), 3, (2, 3, 4, 5), site=site)
    assert np.abs(shown - ratios).max() <= 0.0005 + 1e-9
    assert shown.max() > 1.0  # groups of 10 cost this site something at k = 5
    # the Python API: the same table, as data
    from fedcluster.client_app.site_check import report

    found = report(path, load_schema(schema), floor=3, cost_k="2-5")
    assert found.cost.ratios.shape == (4, 4) and found.text.rstrip("\n") == out.rstrip("\n")
    np.testing.assert_allclose(found.cost.ratios, ratios, rtol=1e-9)


def test_site_check_options_and_too_few_rows(clinical, tmp_path):
    path, schema = clinical / "site-0.csv", clinical / "schema.toml"
    code, out = site_check(path, "--schema", schema, "--no-cost-table")
    assert code == 0 and "Cost of the groups" not in out and "What a run sends" in out
    code, out = site_check(path, "--schema", schema, "--cost-k", "6-3")
    assert code == 2 and "the cost table's k range '6-3' ends below its start" in out
    code, out = site_check(path, "--schema", schema, "--cost-k", "3", "--cost-scale", "none")
    assert code == 0 and re.search(r"^3 \| \d\.\d{3} \| \d\.\d{3} \| \d\.\d{3}$", out, re.MULTILINE)
    assert "the rows as encoded (no scaling)" in out
    few = tmp_path / "few.csv"
    text = path.read_text().splitlines()
    few.write_text("\n".join(text[:4]) + "\n")  # 3 rows
    code, out = site_check(few, "--schema", schema)
    assert code == 1  # a run would refuse a site of 3 rows (min-site-rows); the report still shows
    assert ("Cost of the groups to this site's own k-means: not computed (3 usable rows; "
            "at least 4 needed for k = 2)") in out


def test_the_choosing_p_tutorial_shows_what_site_check_prints(tmp_path, monkeypatch):
    """docs/tutorials/choosing-p.md: its blocks run in order; every `fedcluster site
    check` it shows prints the text block after it (its parts between `...` lines, in
    order), and its Python block prints what its comment says."""
    import shlex

    from test_docs import ROOT, blocks, run_block

    page = ROOT / "docs" / "tutorials" / "choosing-p.md"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FEDCLUSTER_CACHE_DIR", str(tmp_path / "cache"))
    found = blocks(page)
    checks, namespace = 0, {}
    for block, after in zip(found, found[1:] + [None]):
        if block.language == "python":
            printed = io.StringIO()
            with contextlib.redirect_stdout(printed):
                run_block(block, tmp_path, namespace)
            said = block.code.strip().splitlines()[-1].split("# ", 1)[1]
            assert printed.getvalue().strip() == said, block.where
        elif block.language == "bash" and "fedcluster site check" in block.code:
            code, out = site_check(*shlex.split(block.code.strip())[3:])
            assert code == 0 and after is not None and after.language == "text", block.where
            position = 0
            for part in re.split(r"^\.\.\.$\n?", after.code, flags=re.MULTILINE):
                part = part.strip("\n")
                if part:
                    position = out.index(part, position) + len(part)  # ValueError: not shown
            checks += 1
        elif block.language == "bash":
            with contextlib.redirect_stdout(io.StringIO()):
                run_block(block, tmp_path, namespace)
    assert checks == 2

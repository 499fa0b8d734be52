"""Second moments a coordinator reads from a site's real ClientApp (issue 54, must-shows
1 and 2): the site reads a CSV through its cache, as a deployed SuperNode does.

- **A group's spread** (one version, two messages): ``kmeanspp`` with k at least the
  site's groups gives every group's mean and count; sent back as the centroids (and the
  reference points) of a ``profile`` task, they put one group in each cluster, and the
  reply's squared deviations give each group's m2. A group of two rows with mean m and
  m2 v holds m +- sqrt(v / 2) in each feature. Shown first against a site answering from
  its rows (each row its own group: every cell), and with each group's own m2 (every
  cell of every 2-row group), then against the site's own defaults (spread units,
  ``release/spreads.py``): nothing; at p 3 and 5 the groups' own m2, of 3 rows or more.
- **A dominant row** (one version): a row 10 SD out in one feature, in a group whose
  mean and spread put it at mean + sqrt(v (n - 1) / n). Without the dominance rule
  (``release/dominance.py``) that is within 1 % of the row at p 3 and 5; with it, the
  best of the coordinator's estimates is at least 10 % off.
"""

from __future__ import annotations

import numpy as np
import pytest

from fedcluster.client_app.release import dominance

from test_versions import FileSite


def _site(tmp_path, X, node: dict, name: str = "site") -> FileSite:
    """The real ClientApp of a site reading ``X`` from a CSV through its cache."""
    path, cache = tmp_path / f"{name}.csv", tmp_path / f"cache-{name}"
    lines = [",".join(f"f{j}" for j in range(X.shape[1]))]
    lines += [",".join(repr(float(v)) for v in row) for row in X]
    path.write_text("\n".join(lines) + "\n")
    site = FileSite(path, cache, node, with_id=False)
    site.server_floor = 1  # a coordinator asks for the lowest floor; the site's own applies
    return site


def every_group(site: FileSite, n_rows: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(means, counts, m2) of every group: ``kmeanspp`` with a seed on every group, then a
    ``profile`` with one cluster on each (squared deviations about its own mean)."""
    (means, counts), _ = site.ask("kmeanspp", [], **{"k-local": n_rows, "seed": 0})
    d = means.shape[1]
    reply, _ = site.ask("profile", [means, means, np.full(d, -1e3), np.full(d, 1e3)], bins=1)
    assert np.array_equal(np.asarray(reply[0]), counts)  # one group a cluster
    return means, counts, np.asarray(reply[4])


def rows_of_groups(site: FileSite, means: np.ndarray, X: np.ndarray) -> list[np.ndarray]:
    """The rows of each group a reply names by its mean (the site's kept table says which
    rows each group holds; matched to the reply by the mean, to rounding)."""
    site.table_now()
    entry = next(site.cache.joinpath("groups").glob("*.row-groups.npy"))
    groups = np.asarray(np.load(entry))
    members = [np.flatnonzero(groups == g) for g in range(groups.max() + 1)]
    mean_of = np.array([X[m].mean(axis=0) for m in members])
    match = [int(np.argmin(((mean_of - m) ** 2).sum(axis=1))) for m in means]
    # (equal to rounding but where the p% rule on means stood the site's mean in)
    assert np.isclose(mean_of[match], means, rtol=1e-12, atol=1e-12).mean() > 0.98
    return [members[g] for g in match]


def own_m2(rows: list[np.ndarray], X: np.ndarray) -> np.ndarray:
    return np.array([((X[r] - X[r].mean(axis=0)) ** 2).sum(axis=0) for r in rows])


def pair_cells(means, counts, m2, rows, X, tol: float = 1e-9) -> int:
    """The cells of 2-row groups the pair formula gives: per group and feature, m +-
    sqrt(m2 / 2) against the group's own two values (both, in either order)."""
    found = 0
    for g in np.flatnonzero(counts == 2):
        half = np.sqrt(np.maximum(m2[g], 0.0) / 2.0)
        lo, hi = means[g] - half, means[g] + half
        a, b = np.sort(X[rows[g]], axis=0)
        near = (np.abs(lo - a) <= tol * np.maximum(np.abs(a), 1.0)) & \
            (np.abs(hi - b) <= tol * np.maximum(np.abs(b), 1.0))
        found += 2 * int(np.count_nonzero(near))
    return found


def _data(kind: str) -> np.ndarray:
    if kind == "cancer":
        from sklearn.datasets import load_breast_cancer
        return load_breast_cancer().data.astype(np.float64)
    return np.random.default_rng(54).normal(size=(200, 4))


@pytest.mark.parametrize("kind", ["normal", "cancer"])
def test_a_groups_spread_gives_rows_only_from_a_site_answering_from_rows(tmp_path, kind):
    X = _data(kind)
    # the control: each row its own group, its "mean" the row itself
    control = _site(tmp_path, X, {"min-cluster-size": 1}, "control")
    means, counts, _ = every_group(control, len(X))
    assert counts.max() == 1
    assert np.array_equal(np.sort(means, axis=0), np.sort(X, axis=0))
    # groups of two rows: were each group's own m2 sent, the pair formula would give
    # every cell of those groups (the attack works: the test can fail)
    site = _site(tmp_path, X, {}, "default")
    means, counts, squares = every_group(site, len(X))
    rows = rows_of_groups(site, means, X)
    pairs = int((counts == 2).sum())
    assert pairs > 20
    assert pair_cells(means, counts, own_m2(rows, X), rows, X) >= 0.99 * 2 * X.shape[1] * pairs
    # what the site sends: each group's share of its spread unit's, of at least 3 rows
    assert pair_cells(means, counts, squares, rows, X) == 0
    for p in (3, 5):
        bigger = _site(tmp_path, X, {"min-cluster-size": p}, f"p{p}")
        means, counts, squares = every_group(bigger, len(X))
        assert counts.min() >= p
        # a group's m2 is its own (a unit of >= 3 rows), where no rule withholds it
        rows = rows_of_groups(bigger, means, X)
        assert np.mean(np.isclose(squares, own_m2(rows, X), rtol=1e-9, atol=0)) > 0.9


# ------------------------------------------------------------------ a dominant row
def _with_outlier(seed: int) -> tuple[np.ndarray, int]:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(300, 3))
    X[17, 1] = 10.0  # 10 SD out in one feature
    return X, 17


def _with_quiet_neighbours(p: int) -> tuple[np.ndarray, int]:
    """A row far out in a feature where every other row lies near the site's mean (a
    rare pixel's ink, a rare lab value): whatever its group, n x mean - (n - 1) x the
    site's mean is the row."""
    X, row = _with_outlier(p)
    X[:, 1] = np.random.default_rng(100 + p).normal(scale=0.001, size=len(X))
    X[row, 1] = 1.0
    return X, row


def _estimates(site: FileSite, X: np.ndarray, feature: int) -> dict:
    """The coordinator's estimates of the outlier's value from everything one version
    gives: its group's mean and m2 (every group's, through kmeanspp + profile), the site's
    mean (stats), and the group's size: mean + sqrt(m2 (n - 1) / n) (the row alone made
    the spread), n x mean - (n - 1) x the site's mean (the mean alone, the group's other
    rows taken at the site's mean), and the site's mean (what is left where the group
    says nothing of the feature)."""
    means, counts, squares = every_group(site, len(X))
    (site_mean, _, _), _ = site.ask("stats", [], scale="standard")
    estimates = {"site mean": site_mean[feature]}
    for g in range(len(counts)):  # every group: which holds the row is the attacker's guess
        n, m, v = counts[g], means[g, feature], squares[g, feature]
        estimates[f"spread {g}"] = m + np.sqrt(v * (n - 1) / n)
        estimates[f"mean {g}"] = n * m - (n - 1) * site_mean[feature]
    return estimates


def _best(estimates: dict, true: float, kind: str) -> float:
    """The closest of the estimates of one kind ("spread", "mean", "") to ``true``."""
    return min(abs(e - true) for name, e in estimates.items() if name.startswith(kind))


def _no_rule(monkeypatch, name: str) -> None:
    if name == "dominated":
        monkeypatch.setattr(dominance, name, lambda peak, unit_m2, cells: np.zeros(
            np.shape(peak), dtype=bool))
    else:
        monkeypatch.setattr(dominance, name, lambda means, *_: np.zeros(np.shape(means), bool))


@pytest.mark.parametrize("p", [3, 5])
def test_a_dominant_rows_value_is_not_estimated_closely(tmp_path, monkeypatch, p):
    X, row = _with_outlier(p)
    true = X[row, 1]
    # without the rules (a site that flags nothing), the spread pins the row
    _no_rule(monkeypatch, "dominated")
    _no_rule(monkeypatch, "dominated_means")
    bare = _estimates(_site(tmp_path, X, {"min-cluster-size": p}, "bare"), X, 1)
    assert _best(bare, true, "spread") < 0.01 * true
    monkeypatch.undo()
    ruled = _estimates(_site(tmp_path, X, {"min-cluster-size": p}, "ruled"), X, 1)
    assert _best(ruled, true, "") >= 0.10 * true


@pytest.mark.parametrize("p", [3, 5])
def test_a_dominant_rows_value_is_not_read_from_its_groups_mean(tmp_path, monkeypatch, p):
    """The rule on spreads alone leaves the group's mean: where the group's other rows
    lie at the site's mean, n x mean - (n - 1) x the site's mean is the row (within 3 %);
    the p% rule on means withholds that sum (the site's mean stands in)."""
    X, row = _with_quiet_neighbours(p)
    true = X[row, 1]
    _no_rule(monkeypatch, "dominated_means")
    spreads_only = _estimates(_site(tmp_path, X, {"min-cluster-size": p}, "spreads"), X, 1)
    assert _best(spreads_only, true, "mean") < 0.03 * true
    monkeypatch.undo()
    site = _site(tmp_path, X, {"min-cluster-size": p}, "ruled")
    ruled = _estimates(site, X, 1)
    assert _best(ruled, true, "") >= 0.10 * true
    assert site.table_now().spread_rule["dominated-means"] >= 1


@pytest.mark.parametrize("p", [2, 3, 5])
def test_each_dominance_rule_applies_where_it_says(tmp_path, p):
    """The rule on spreads at every p_site (a 2-row group's spread unit too); the p% rule
    on means from p_site ``MEANS_FROM_P`` (3) on: at 2 a group's mean is left as it is."""
    X, _ = _with_outlier(p)
    assert _site(tmp_path, X, {"min-cluster-size": p}, "far").table_now().spread_rule[
        "dominated"] >= 1
    X, row = _with_quiet_neighbours(p)
    site = _site(tmp_path, X, {"min-cluster-size": p}, "quiet")
    means = site.table_now().spread_rule["dominated-means"]
    assert (means >= 1) if p >= dominance.MEANS_FROM_P else (means == 0)

"""Table 1 at the small-cell rules hospitals use (issue 44, must-shows 1 and 2).

The clinical demo's four sites (a new seed) at p_site 5, 10 and 11 (each site's own
``min-cluster-size``, the table's floor p), with k 6, 8 and 10, plain and under SecAgg+:
18 tables from the real ServerApp and ClientApps in process, each checked

1. for truth against pandas-free numpy on the pooled rows as the groups keep them (each
   row in its group's cluster; a value alone in its group counts as missing,
   ``test_site_groups.as_the_groups_keep_them``, and each group's spread is the one it
   keeps, ``with_kept_spreads``): every count, %, mean and SD shown is
   exact (means and SDs to 1e-9; under SecAgg+ to its quantisation), every interval holds
   its figure, a ``<p`` count is 1 to p-1 and a ``suppressed`` one is not;
2. by an audit written here from the published table alone (the cells shown, their
   markers, the cluster sizes, all rows, and in a plain run each site's rows): each
   withheld cell's least and greatest value by linear programming; from the figures
   alone none may be a point or lie inside 1..p-1, and with what the markers say too
   (``<p``: 1 to p-1) none may be a point, and here every ``<p`` still spans all of
   1..p-1. The audit first catches
   the table as the sites' floors made it before (each site withholding its cells of 1
   to p-1; the pooled table then contradicts its own sizes), and the table with its
   complementary cells shown (every ``<p`` then reads exactly, by subtraction).

The runs start from fixed centroids (central k-means on the pooled table) and train two
rounds: the table's truth does not depend on how well the run converged, and the 18 runs
then take about 18 s on two cores.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from scipy.optimize import linprog

from fedcluster.client_app.data import report_table
from fedcluster.client_app.data.schema_table import load_schema_table
from fedcluster.common import kernels, profile, secure_codec
from fedcluster.common.clinical_demo import write_clinical
from fedcluster.common.schema import load_schema
from fedcluster.simulation import run_in_process
from test_site_groups import as_the_groups_keep_them, with_kept_means, with_kept_spreads

FLOORS = (5, 10, 11)
KS = (6, 8, 10)
SEED = 5
SITES = 4
SECURE = {"secure-aggregation": True, "secagg-data-bound": 40.0,
          # 4 sites x 2**29 < 2**32: the finest quantisation SecAgg+ allows here
          "secagg-quantization-range": 2**29}
COUNTS = ("n", "missing n", "withheld n")


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """The demo's files, each site's encoded rows, and starting centroids per k (central
    k-means on the pooled rows, imputed with column means and standardised)."""
    from sklearn.cluster import KMeans

    tmp = tmp_path_factory.mktemp("demo")
    paths = write_clinical(tmp / "files", n_sites=SITES, seed=SEED)
    schema = load_schema(paths[0])
    data = [load_schema_table(p, schema, cache_dir=tmp / "reread") for p in paths[1:]]
    X = np.vstack([d.X for d in data])
    X = np.where(np.isnan(X), np.nanmean(X, axis=0), X)
    sd = X.std(axis=0)
    Z = (X - X.mean(axis=0)) / np.where(sd > 0, sd, 1.0)
    starts = {k: KMeans(k, n_init=1, random_state=0).fit(Z).cluster_centers_ for k in KS}
    return {"paths": paths, "schema": schema, "data": data, "starts": starts, "tmp": tmp}


@pytest.fixture(scope="module")
def tables(demo):
    """(p, k, secure) -> (the run's model, the pooled rows: per site its key, its rows as
    the groups keep them and each row's cluster)."""
    out = {}
    for p in FLOORS:
        for k in KS:
            for secure in (False, True):
                nodes = [{"data-path": str(f), "schema-path": str(demo["paths"][0]),
                          "site-id": f"H{i + 1}", "cache-dir": str(demo["tmp"] / f"cache-{p}"),
                          "min-cluster-size": p} for i, f in enumerate(demo["paths"][1:])]
                config = {"algorithm": "dwf", "n-clusters": k, "scale": "standard",
                          "num-rounds": 2, "central-baseline": False, "seed": 1,
                          "schema": str(demo["paths"][0]), "output-dir": "",
                          **(SECURE if secure else {})}
                model = run_in_process(nodes, config, initial_centroids=demo["starts"][k]).model
                parts = []
                for i, d in enumerate(demo["data"]):
                    g, group_of_row = _as_reported(demo, i, p, model)
                    kept = group_of_row >= 0
                    cluster = kernels.assign(g.in_run_space(model.scaling).means,
                                             model.centroids)[0][group_of_row[kept]]
                    X = with_kept_spreads(with_kept_means(
                        as_the_groups_keep_them(d.X, group_of_row, p, g.present), group_of_row, g),
                                          group_of_row, np.asarray(g.m2))[kept]
                    parts.append((f"H{i + 1}", X, cluster, np.isnan(d.X)[kept]))
                out[p, k, secure] = model, parts
    return out


def _as_reported(demo, i: int, p: int, model):
    """Site i's groups as it answered the model's report from, and each row's
    (``report_table.as_answered``: the partition its history records; another run's model
    over the same version: the groups whole, as the site answered it)."""
    cache = demo["tmp"] / f"cache-{p}"
    site = load_schema_table(demo["paths"][1 + i], demo["schema"], cache_dir=cache)
    return report_table.as_answered(site, p, cache, model.centroids,
                                    None if model.scaling is None else model.scaling.encode())


# ------------------------------------------------------------------ the truth, from rows

def truth(parts, variables, k, site_floor: int = 1) -> dict:
    """{(cluster, variable, level, statistic): value} from the pooled rows; with
    ``site_floor``, of the rows a site shows (its rows of a cluster that holds fewer
    there are left out, as the site withholds that cluster). A part (key, rows, cluster,
    absent) says which cells are missing in the data (``absent``); a NaN of its rows
    that is not is a present cell the groups withheld (``withheld n``)."""
    X = np.vstack([x for _, x, _, *_ in parts])
    absent = np.vstack([rest[0] if rest else np.isnan(x) for _, x, _, *rest in parts])
    cluster = np.concatenate([c for _, _, c, *_ in parts])
    site = np.concatenate([[key] * len(c) for key, _, c, *_ in parts])
    shown = np.concatenate([np.bincount(c, minlength=k)[c] >= site_floor for _, _, c, *_ in parts])
    X, cluster, site, absent = X[shown], cluster[shown], site[shown], absent[shown]
    out = {}
    for name, mask in [(str(c), cluster == c) for c in range(k)] + [("all", cluster >= 0)]:
        rows = X[mask]
        size = len(rows)
        out[name, "size", "", "n"] = size
        out[name, "size", "", "%"] = 100.0 * size / len(X)
        for v in variables:
            if v.kind == "numeric":
                col = rows[:, v.columns[0]]
                values = col[~np.isnan(col)]
                out[name, v.name, "", "n"] = len(values)
                if len(values):
                    out[name, v.name, "", "mean"] = values.mean()
                if len(values) > 1:
                    out[name, v.name, "", "sd"] = values.std(ddof=1)
                present = len(values)
            else:
                present = int((~np.isnan(rows[:, v.columns[0]])).sum())
                for level, j in zip(v.levels, v.columns):
                    n = int(round(np.nansum(rows[:, j]) / v.weight))
                    out[name, v.name, level, "n"] = n
                    if present:
                        out[name, v.name, level, "%"] = 100.0 * n / present
            missing = int(absent[mask][:, v.columns[0]].sum())
            out[name, v.name, "", "missing n"] = missing
            out[name, v.name, "", "withheld n"] = size - present - missing
            if size:
                out[name, v.name, "", "missing %"] = 100.0 * missing / size
                out[name, v.name, "", "withheld %"] = 100.0 * (size - present - missing) / size
        for key in dict.fromkeys(site):
            here = int((site[mask] == key).sum())
            out[name, "site", key, "n"] = here
            if size:
                out[name, "site", key, "%"] = 100.0 * here / size
    return out


INTERVAL = re.compile(r"^(\d+(?:\.\d+)?)-(\d+(?:\.\d+)?)$")


def secure_tolerance(model, parts, variables, k, n_sites=SITES,
                     quantization=SECURE["secagg-quantization-range"]):
    """Under SecAgg+ a mean or SD carries the quantisation of its sums (``secure_codec``:
    each decoded sum within N 2 s / T of the exact one, s its scale): per (cluster,
    variable), the bounds that follow for a mean's sum and an SD's spread."""
    lower = np.zeros(len(model.feature_names))
    upper = np.ones(len(model.feature_names))
    for v in variables:
        if v.kind == "numeric":
            lower[v.columns[0]], upper[v.columns[0]] = v.range
    references = model.scaling.inverse(model.centroids)
    lo, hi = np.minimum(lower, references.min(0)), np.maximum(upper, references.max(0))
    n_max = max(len(x) for _, x, _, *_ in parts)
    step = secure_codec.quantisation_error(1.0, n_sites, quantization) * n_max
    e_sum = step * np.maximum(abs(lo), abs(hi))
    e_sq = step * (hi - lo) ** 2
    out = {}
    for name in [str(c) for c in range(k)] + ["all"]:
        members = k if name == "all" else 1
        for v in variables:
            if v.kind == "numeric":
                j = v.columns[0]
                # the mean: each cluster's sum off by e_sum; the spread: each cluster's
                # squares off by e_sq, and its mean (to first order) by e_sum
                out[name, v.name] = (members * e_sum[j],
                                     members * (e_sq[j] + 6 * (hi[j] - lo[j]) * e_sum[j]))
    return out


def check_truth(table: list[dict], expected: dict, floor: int, secure=None,
                shown: dict | None = None) -> dict:
    """Every figure of ``table`` against the rows; returns how many of each kind
    (``secure``: :func:`secure_tolerance`'s bounds for means and SDs, else 1e-9). A
    cluster a site withheld rows of (its ``rows shown``): its counts are intervals of the
    rows' (``expected``), its other figures those of the rows shown (``shown``)."""
    partial = {r["cluster"] for r in table if r["statistic"] == "rows shown"}
    seen = {"exact": 0, "<p": 0, "suppressed": 0, "interval": 0}
    for row in table:
        key = (row["cluster"], row["variable"], row["level"], row["statistic"])
        value = row["value"]
        if key[3] in ("q1", "median", "q3", "rows shown") or value == "":
            continue
        whole = expected[key]
        # (the sites' rows, the composition's "all", are whole: each site's row count)
        of_shown = key[0] in partial and key[1] != "size" and key[:2] != ("all", "site")
        want = shown[key] if of_shown else whole
        if isinstance(value, str) and value.startswith("<"):
            # a count the rule withheld (1 to p-1), or a cluster withheld at a site
            # (fewer than its floor: none too) or a size of under p
            assert key[3] in COUNTS and whole < int(value[1:]), (key, whole)
            assert whole >= (0 if key[1] in ("site", "size") else 1), (key, whole)
            seen["<p"] += 1
        elif value == profile.SUPPRESSED:
            assert key[3] in COUNTS and not 1 <= want < floor, (key, want)
            seen["suppressed"] += 1
        elif isinstance(value, str):
            low, high = map(float, INTERVAL.match(value).groups())
            target = whole if key[3] in COUNTS else want
            assert low - 0.05 <= target <= high + 0.05, (key, value, target)  # (% to 0.1)
            seen["interval"] += 1
        elif key[3] in ("mean", "sd"):
            n = (shown if key[0] in partial else expected)[key[0], key[1], "", "n"]
            if secure is None:
                allowed = 1e-9 * max(1.0, abs(want))
            elif key[3] == "mean":
                allowed = secure[key[:2]][0] / n
            else:  # |sqrt(a) - sqrt(b)| <= |a - b| / sqrt(a)
                allowed = secure[key[:2]][1] / (n - 1) / want
            assert abs(value - want) <= allowed, (key, value, want, allowed)
            seen["exact"] += 1
        else:
            assert value == pytest.approx(want, rel=1e-12, abs=1e-9), (key, value, want)
            if key[3] in COUNTS:
                assert not 1 <= value < floor, (key, value)  # no small count shown
            seen["exact"] += 1
    # a mean and SD are shown wherever their count is (and only there)
    index = {(r["cluster"], r["variable"], r["level"], r["statistic"]) for r in table}
    for row in table:
        c, var, level, stat = row["cluster"], row["variable"], row["level"], row["statistic"]
        if stat != "n" or var in ("size", "site") or level != "":
            continue
        n = (shown if c in partial else expected)[c, var, "", "n"]
        if row["value"] == profile.SUPPRESSED or str(row["value"]).startswith("<"):
            assert (c, var, "", "mean") not in index, (c, var)
        elif n > 1 and not str(row["value"]).startswith("0-"):  # (0-b: may be none)
            assert (c, var, "", "mean") in index and (c, var, "", "sd") in index, (c, var)
    return seen


# ------------------------------------------------------------------ the audit, by LP

def published(table: list[dict], site_rows: dict | None):
    """The linear relations a reader has: per block (a variable, or the sites) the
    cells as {(cluster, column): value}, and the cluster sizes (with "all")."""
    index = {(r["cluster"], r["variable"], r["level"], r["statistic"]): r["value"]
             for r in table}
    sizes = {c: v for (c, var, _, stat), v in index.items() if var == "size" and stat == "n"}
    blocks = {}
    for (c, var, level, stat), value in index.items():
        if var == "size" or stat not in COUNTS:
            continue
        column = level if level else stat
        blocks.setdefault(var, {})[c, column] = value
    if site_rows:
        for key, rows in site_rows.items():
            assert blocks["site"]["all", key] == rows
    return blocks, sizes


def audit(table: list[dict], floor: int, site_rows: dict | None = None,
          narrowed: list | None = None) -> list[str]:
    """The withheld cells of ``table`` that the published figures narrow more than the
    rule allows: by LP over every table of non-negative counts that agrees with them,
    from the figures alone (any withheld cell from 0) a point or an interval inside
    1..p-1; with what the markers say too (``<p``: 1 to p-1, zeros being shown), a
    point, or a cell other than a ``<p`` inside 1..p-1. A table no counts fit (it
    contradicts itself) is one failure. ``narrowed``: gets each ``<p`` cell's interval
    with the markers (within 1..p-1)."""
    blocks, sizes = published(table, site_rows)
    failures = []
    for var, cells in blocks.items():
        clusters = sorted({c for c, _ in cells} - {"all"}, key=int)
        columns = sorted({col for _, col in cells})
        unknown = [cell for cell, v in cells.items() if not isinstance(v, (int, float))]
        if not unknown:
            continue
        at = {cell: i for i, cell in enumerate(unknown)}
        A, b = [], []

        def relation(terms: dict, rhs: float):
            line = np.zeros(len(unknown))
            for cell, coeff in terms.items():
                if cell in at:
                    line[at[cell]] += coeff
                else:
                    rhs -= coeff * cells.get(cell, 0)
            A.append(line)
            b.append(rhs)

        for c in clusters + ["all"]:  # a cluster's cells sum to its size
            relation({(c, col): 1.0 for col in columns}, float(sizes[c]))
        for col in columns:  # a column's clusters sum to its "all" cell
            relation({**{(c, col): 1.0 for c in clusters}, ("all", col): -1.0}, 0.0)
        for markers in (False, True):
            bounds = [_bounds(cells[cell], markers) for cell in unknown]
            for cell in unknown:
                span = []
                for sign in (1.0, -1.0):
                    objective = np.zeros(len(unknown))
                    objective[at[cell]] = sign
                    result = linprog(objective, A_eq=np.array(A), b_eq=np.array(b),
                                     bounds=bounds, method="highs")
                    if result.status != 0:
                        return failures + [f"{var}: no table of counts fits the figures shown"]
                    span.append(sign * result.fun)
                low, high = span
                marker = cells[cell]
                if markers and marker.startswith("<") and narrowed is not None:
                    narrowed.append((low, high))
                if high - low < 0.5 and not (markers and marker == "<2"):  # ("<2" says 1)
                    failures.append(f"{var} {cell}: exactly {low:g}")
                elif markers and marker.startswith("<"):
                    continue
                elif high - low < 0.5:
                    failures.append(f"{var} {cell}: exactly {low:g}")
                elif low > 0.5 and high < floor - 0.5:
                    failures.append(f"{var} {cell}: {low:g} to {high:g}, under {floor}")
    return failures


def _bounds(value: str, markers: bool) -> tuple:
    if value == profile.SUPPRESSED:
        return (0, None)
    if value.startswith("<"):
        return (1, int(value[1:]) - 1) if markers else (0, None)
    low, high = map(float, INTERVAL.match(value).groups())
    return (low, high)


def todays_table(parts, variables, k, floor) -> list[dict]:
    """The table as the sites' floors made it before issue 44: each site withheld a
    cluster of 1 to p-1 rows, and its cell of a variable where the present, missing or a
    level count there was 1 to p-1; the pooled totals left them out, and a count no site
    showed but one withheld read "<p" (the counts only: what the audit reads)."""
    small = lambda n: 0 < n < floor  # noqa: E731
    rows = []
    for name, members in [(str(c), [c]) for c in range(k)] + [("all", list(range(k)))]:
        size = sum(int(np.isin(cluster, members).sum()) for _, _, cluster, *_ in parts)
        rows.append({"cluster": name, "variable": "size", "level": "", "unit": "",
                     "statistic": "n", "value": size})
        for v in variables:
            kept = {j: [0, 0, 0] for j in v.columns}  # level count, present, rows
            withheld = set()
            for _, X, cluster, *_ in parts:
                for c in members:
                    here = X[cluster == c]
                    for j in v.columns:
                        col = here[:, j]
                        present = int((~np.isnan(col)).sum())
                        level = int(round(np.nansum(col) / v.weight)) if v.kind != "numeric" else 0
                        if small(len(here)) or small(present) or small(len(here) - present) \
                                or small(level):
                            withheld.add(j)
                        else:
                            kept[j][0] += level
                            kept[j][1] += present
                            kept[j][2] += len(here)
            j0 = v.columns[0]

            def add(level, stat, value):
                rows.append({"cluster": name, "variable": v.name, "level": level, "unit": "",
                             "statistic": stat, "value": value})

            if v.kind == "numeric":
                n = kept[j0][1]
                add("", "n", f"<{floor}" if not n and j0 in withheld else n)
                add("", "missing n", kept[j0][2] - n)
            else:
                for level, j in zip(v.levels, v.columns):
                    n = kept[j][0]
                    add(level, "n", f"<{floor}" if not n and j in withheld else n)
                best = max(v.columns, key=lambda j: kept[j][2])
                add("", "missing n", kept[best][2] - kept[best][1])
    return rows


# ------------------------------------------------------------------ the must-shows

def test_every_figure_of_table1_is_true_at_hospital_floors(tables, demo):
    variables = profile.variables_of(demo["schema"])
    totals = {"exact": 0, "<p": 0, "suppressed": 0, "interval": 0}
    for (p, k, secure), (model, parts) in tables.items():
        assert model.table1["floor"] == p
        rows = model.table1["rows"]
        expected = truth(parts, variables, k)
        seen = check_truth(rows, expected, p, secure_tolerance(model, parts, variables, k)
                           if secure else None)
        assert seen["exact"] > 400, (p, k, secure, seen)
        for key in totals:
            totals[key] += seen[key]
        # the per-site composition, plain only, is the run summary's per-site sizes too
        site_rows = [r for r in rows if r["variable"] == "site"]
        assert bool(site_rows) != secure
        for key, report in model.metrics["per-site"].items():
            shown = {r["cluster"]: r["value"] for r in site_rows
                     if r["level"] == key and r["statistic"] == "n"}
            assert report["cluster-sizes"] == [shown[str(c)] for c in range(k)]
    # the rule did something: small cells and the cells that protect them
    assert totals["<p"] > 50 and totals["suppressed"] > 50, totals


def test_the_lp_audit_finds_no_withheld_cell_it_can_narrow(tables, demo):
    variables = profile.variables_of(demo["schema"])
    caught_today = caught_unsuppressed = false_small = 0
    spans: list = []
    for (p, k, secure), (model, parts) in tables.items():
        rows = model.table1["rows"]
        site_rows = None if secure else {key: r["n-rows"]
                                         for key, r in model.metrics["per-site"].items()}
        if not secure:
            # first: the audit catches the table as the sites' floors made it before
            # (whose "<p" could hide p or more rows) ...
            expected = truth(parts, variables, k)
            today = todays_table(parts, variables, k, p)
            assert audit(today, p), (p, k)
            caught_today += 1
            false_small += sum(r["value"] == f"<{p}" for r in today
                               if expected[r["cluster"], r["variable"], r["level"],
                                           r["statistic"]] >= p)
            # ... and the pooled table without its complementary cells
            bare = [{**r, "value": expected[r["cluster"], r["variable"], r["level"],
                                            r["statistic"]]}
                    if r["value"] == profile.SUPPRESSED else r for r in rows]
            if bare != rows:  # (every "<p" cell then reads exactly, by subtraction)
                assert any("exactly" in f for f in audit(bare, p, site_rows)), (p, k)
                caught_unsuppressed += 1
        assert audit(rows, p, site_rows, narrowed := []) == [], (p, k, secure)
        spans += [high - low >= p - 2 for low, high in narrowed]
    # (a table whose rule needed no complementary cell has no bare version to catch: the
    # clusters decide, so most tables, not all, have one)
    assert caught_today == len(FLOORS) * len(KS) and false_small > 20
    assert caught_unsuppressed >= len(FLOORS) * len(KS) - 2
    # with the markers too, every <p cell of these tables can still be anything from 1
    # to p-1: the figures narrow none of them (the rule prefers such complements; where a
    # column's few rows allow none, it settles for the audit above)
    assert len(spans) > 100 and all(spans)


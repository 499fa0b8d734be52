"""Table 1 by cluster from the sites' cluster profiles (issues 36, 44): pooled sums, the
table's small-cell rule on the POOLED counts, then the tidy rows ``server_app/table1.py``
renders (``cluster``, ``variable``, ``level``, ``unit``, ``statistic``, ``value``).

Every figure comes from sums over the sites (``protocol.ClusterProfile``, made by
``client_app/site_profile.py``, which sends a cluster it shows whole), so secure
aggregation could carry them: per numeric variable n, mean and SD (exact: SD from the
squared deviations about the reference points, corrected to the mean; for all rows,
within plus between clusters), median and quartiles from the pooled histogram (linear
within a bin), missing n (%); per category level n (% of the cluster's rows with the
variable present), and missing n (% of the cluster's rows); the cluster sizes; per site
(when the replies are seen one by one) the rows of each cluster.

The small-cell rule (``common/small_cells.py``) then works on the pooled counts, variable
by variable (clusters x levels and missing; clusters x present and missing) and on the
per-site composition (clusters x sites, with each site's rows): a count of 1 to p-1 reads
``<p``, and the cells withheld to protect those read ``suppressed``; a mean, SD or
quartile is shown only where its n is, and a % only where its count is (a level's % whose
denominator, the rows with the variable present, is withheld is shown as the interval the
published figures allow). Where a site withheld a cluster (fewer rows there than its
floor: only where the run's ``min-cluster-size`` is above the site's own, as a site's
clusters are whole groups), that cluster's true counts are not known: its size and counts
are shown as intervals, ``lo-hi`` (the rows shown to the rows shown plus all the site
could have withheld), and its other figures are of the rows the sites showed (the
``rows shown`` statistic says how many).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fedcluster.common.protocol import ClusterProfile
from fedcluster.common.row_spread import bounded_sd, row_quantiles
from fedcluster.common.small_cells import (AT_SITE, PRIMARY, SECONDARY, SHOWN, CountTable,
                                           protect)

#: The columns of a tidy Table 1 row (``table1.csv``, ``Model.profile``).
FIELDS = ("cluster", "variable", "level", "unit", "statistic", "value")
#: The quantiles Table 1 shows.
QUANTILES = (("q1", 0.25), ("median", 0.5), ("q3", 0.75))


@dataclass(frozen=True)
class Variable:
    """One row block of Table 1: a numeric column (one encoded feature) or a category
    (one encoded feature per level, ``weight`` its one-hot 1)."""

    name: str
    kind: str  # "numeric" or "categorical"
    columns: tuple[int, ...]
    unit: str = ""
    levels: tuple[str, ...] = ()
    weight: float = 1.0
    range: tuple[float, float] | None = None  # a numeric column's declared range
    # Where every value of the column lies, as far as the run knows (the declared range,
    # or a built-in data set's): Table 1's figures stay in it (common/row_spread.py).
    bounds: tuple[float, float] | None = None


def variables_of(schema=None, feature_names=None, known_range=None) -> list[Variable]:
    """The variables of a run: its schema's feature columns (a missing-indicator column
    is left out: the missing counts say it), or every feature numeric (``known_range``:
    where all their values lie, e.g. a built-in data set's)."""
    if schema is None:
        return [Variable(str(name), "numeric", (j,), bounds=known_range)
                for j, name in enumerate(feature_names)]
    out, j = [], 0
    for column in schema.features:
        if column.type == "numeric":
            out.append(Variable(column.name, "numeric", (j,), column.unit or "",
                                range=column.range, bounds=column.range))
            j += 1
        else:
            n = len(column.categories)
            out.append(Variable(column.name, "categorical", tuple(range(j, j + n)), "",
                                tuple(column.categories), column.category_weight))
            j += n
        j += 1 if column.missing_indicator else 0
    return out


def level_weights(variables: list[Variable], d: int) -> np.ndarray:
    """(d,) each encoded feature's one-hot weight (0: numeric), as a site needs it."""
    weights = np.zeros(d)
    for v in variables:
        if v.kind == "categorical":
            weights[list(v.columns)] = v.weight
    return weights


def pool(replies: list[ClusterProfile]) -> ClusterProfile:
    """The sum of the sites' profiles (what secure aggregation would give)."""
    return ClusterProfile(*(np.sum([np.asarray(r[i]) for r in replies], axis=0)
                            for i in range(len(ClusterProfile._fields))))


def cluster_moments(pooled: ClusterProfile, references: np.ndarray):
    """(k, d) per cluster and feature: its present cells, their mean (0 where none) and
    their squared deviations about that mean (from those about the reference point)."""
    present = np.asarray(pooled.present, dtype=np.float64)
    means = np.where(present > 0, pooled.sums / np.maximum(present, 1.0), 0.0)
    return present, means, pooled.squares - present * (means - references) ** 2


#: A count withheld so that no ``<p`` cell can be worked out from the others.
SUPPRESSED = "suppressed"


@dataclass(frozen=True)
class Answered:
    """Who a pooled profile is of: the answering sites' rows (in their groups) and the
    highest floor any of them applied; in a plain round also each site's rows, floor and
    own profile (``sites`` None under secure aggregation)."""

    rows: int
    site_floor: int
    sites: dict[str, ClusterProfile] | None = None
    site_rows: dict[str, int] = field(default_factory=dict)
    site_floors: dict[str, int] = field(default_factory=dict)


@dataclass
class Table1:
    """Table 1's tidy rows and the notes its figures need."""

    rows: list[dict]
    notes: list[str]


def table1(pooled: ClusterProfile, variables: list[Variable], references: np.ndarray,
           lower: np.ndarray, upper: np.ndarray, floor: int,
           answered: Answered | None = None) -> Table1:
    """Table 1 (module docstring) of a pooled profile at the table's floor p =
    ``floor``; ``answered`` None: every cluster shown whole, no per-site composition."""
    counts = np.asarray(pooled.counts, dtype=np.int64)
    k = len(counts)
    if answered is None:
        answered = Answered(int(counts.sum()), floor)
    slack, withheld = _withheld_at_sites(pooled, answered)
    total = int(counts.sum()) + withheld
    clusters = [(str(j), [j]) for j in range(k)] + [("all", list(range(k)))]
    slack = np.append(slack, withheld)  # per row of a table: the clusters, then "all"
    shown = np.append(counts, counts.sum())
    rows: list[dict] = []
    notes: list[str] = []

    def add(cluster, variable, level, unit, statistic, value):
        rows.append({"cluster": cluster, "variable": variable, "level": level, "unit": unit,
                     "statistic": statistic, "value": value})

    others = slack[:k].sum()
    for i, (name, _) in enumerate(clusters):
        if i == k:
            add(name, "size", "", "", "n", total)
            add(name, "size", "", "", "%", 100.0 if total else "")
            if withheld:
                add(name, "size", "", "", "rows shown", int(shown[i]))
            continue
        lo = int(shown[i] + max(0, withheld - (others - slack[i])))
        hi = int(shown[i] + min(slack[i], withheld))
        if lo == hi:
            small = 0 < lo < floor
            if small and slack[i]:
                notes.append(f"All rows less the other clusters' sizes give cluster {name}'s: "
                             "the rows the sites withheld of it, fewer than their floors.")
            add(name, "size", "", "", "n", f"<{floor}" if small else lo)
            add(name, "size", "", "", "%", "" if small or not total else 100.0 * lo / total)
        else:
            add(name, "size", "", "", "n", f"<{floor}" if hi < floor else f"{lo}-{hi}")
            add(name, "size", "", "", "%", "" if hi < floor else _span(100 * lo / total,
                                                                      100 * hi / total))
        if slack[i]:
            add(name, "size", "", "", "rows shown", int(shown[i]))
    moments = cluster_moments(pooled, references)
    for v in variables:
        table = _variable_table(v, pooled, shown)
        protected = protect(table, floor)
        names = ["n", "missing"] if v.kind == "numeric" else [*v.levels, "missing"]
        notes += _exposed(protected, clusters, v.name,  # (and withheld, where counted)
                          names + ["withheld"][:table.values.shape[1] - len(names)])
        for i, (name, members) in enumerate(clusters):
            if v.kind == "numeric":
                _numeric(add, name, v, pooled, moments, members, lower, upper, protected, i,
                         table, slack[i], floor)
            else:
                _categorical(add, name, v, protected, i, table, slack[i], floor)
    if answered.sites:
        _composition(add, clusters, answered, shown, floor, notes)
    return Table1(rows, notes)


def table1_rows(pooled, variables, references, lower, upper, floor, answered=None) -> list[dict]:
    """The tidy rows of :func:`table1`."""
    return table1(pooled, variables, references, lower, upper, floor, answered).rows


def _withheld_at_sites(pooled: ClusterProfile, answered: Answered) -> tuple[np.ndarray, int]:
    """(k,) the most rows each cluster can hold beyond those shown (sites that withheld
    it, each up to its floor - 1, and no more than all rows withheld), and the rows
    withheld in all (the answering sites' rows less those shown)."""
    counts = np.asarray(pooled.counts, dtype=np.int64)
    slack = np.zeros(len(counts), dtype=np.int64)
    if answered.sites:
        for key, reply in answered.sites.items():
            flagged = np.asarray(reply.hidden)[:, 0] > 0
            gone = answered.site_rows[key] - int(np.asarray(reply.counts).sum())
            slack[flagged] += min(answered.site_floors[key] - 1, max(gone, 0))
        withheld = sum(answered.site_rows.values()) - int(counts.sum())
    else:
        withheld = answered.rows - int(counts.sum())
        flagged = np.rint(np.asarray(pooled.hidden)[:, 0]).astype(np.int64)
        slack = flagged * (answered.site_floor - 1)
    withheld = max(withheld, 0)
    return np.minimum(slack, withheld), withheld


def _withheld_cells(v: Variable, pooled: ClusterProfile) -> np.ndarray | None:
    """(k,) per cluster the variable's present cells the sites' lone-cell rule withheld
    (None: none, and Table 1 has no such line)."""
    withheld = np.asarray(pooled.withheld, dtype=np.int64)[:, v.columns[0]]
    return withheld if withheld.any() else None


def _variable_table(v: Variable, pooled: ClusterProfile, shown: np.ndarray) -> CountTable:
    """A variable's counts against the clusters: a category's levels and missing cells,
    or a numeric variable's present and missing cells (its present cells carry its mean,
    SD and quartiles: dearer to withhold); then, where the sites' lone-cell rule withheld
    present cells, their count (missing: the cells absent in the data alone)."""
    k = len(pooled.counts)
    present = np.asarray(pooled.present, dtype=np.int64)[:, v.columns[0]]
    withheld = _withheld_cells(v, pooled)
    missing = pooled.counts - present - (0 if withheld is None else withheld)
    if v.kind == "numeric":
        cells, cost = np.column_stack([present, missing]), [3.0, 1.0]
    else:
        levels = np.rint(np.asarray(pooled.sums)[:, list(v.columns)] / v.weight)
        cells = np.column_stack([levels, missing])
        cost = [1.0] * len(v.columns) + [1.0]
    if withheld is not None:
        cells, cost = np.column_stack([cells, withheld]), cost + [1.0]
    cells = np.vstack([cells, cells.sum(axis=0)]).astype(np.int64)
    assert cells.shape[0] == k + 1
    return CountTable(cells, shown, column_cost=np.array(cost))


def _count(status: int, value: int, slack: int, floor: int):
    """A count as Table 1 shows it: exact, ``<p``, ``suppressed``, or where a site
    withheld rows of the cluster the interval it lies in."""
    if status == SECONDARY:
        return SUPPRESSED
    if status == PRIMARY:
        return f"<{floor}" if not slack else f"0-{floor - 1 + slack}"
    return int(value) if not slack else f"{int(value)}-{int(value) + int(slack)}"


def _span(lo: float, hi: float) -> str:
    return f"{lo:.1f}-{hi:.1f}"


def _numeric(add, cluster, v, pooled, moments, members, lower, upper, protected, i, table,
             slack, floor):
    j = v.columns[0]
    n, missing = (int(x) for x in table.values[i, :2])
    status = protected.status[i]
    add(cluster, v.name, "", v.unit, "n", _count(status[0], n, slack, floor))
    if status[0] == SHOWN and n > 0:
        P, means, within = (m[members, j] for m in moments)
        Q = pooled.squares[members, j]
        mean = pooled.sums[members, j].sum() / n
        # within each cluster about its own mean, then between the clusters' means
        spread = within.sum() + (P * (means - mean) ** 2).sum()
        if v.bounds is not None and not v.bounds[0] <= mean <= v.bounds[1]:
            # a stand-in (a withheld sum's) moved it out of the column's range, where the
            # true mean is not: the nearest end is nearer the truth (row_spread.py)
            mean = min(max(mean, v.bounds[0]), v.bounds[1])
            add(cluster, v.name, "", v.unit, "mean held to range", 1)
        add(cluster, v.name, "", v.unit, "mean", mean)
        if n > 1:  # at most what the column's known range allows (row_spread.py)
            sd, lowered = bounded_sd(float(np.sqrt(max(spread, 0.0) / (n - 1))), mean, n, v.bounds)
            add(cluster, v.name, "", v.unit, "sd", sd)
            if lowered:
                add(cluster, v.name, "", v.unit, "sd at most", 1)
        else:
            add(cluster, v.name, "", v.unit, "sd", "")
        at_end = v.bounds is not None and min(mean - v.bounds[0], v.bounds[1] - mean) <= \
            1e-12 * max(1.0, abs(v.bounds[0]), abs(v.bounds[1]))
        quantiles = {name: mean for name, _ in QUANTILES} if at_end else row_quantiles(
            [(pooled.histograms[m, j], means[i], max(within[i], 0.0))
             for i, m in enumerate(members)],
            lower[j], upper[j], QUANTILES, v.bounds)  # (every value at that end: so all are)
        if quantiles and spread <= 1e-12 * (float(np.abs(Q).sum()) + n * mean * mean):
            # every present value is the mean (to rounding): so are its quartiles, exactly,
            # where the histogram would spread them over the mean's bin
            quantiles = {stat: mean for stat in quantiles}
        for stat, value in quantiles.items():
            add(cluster, v.name, "", v.unit, stat, value)
    _missing(add, cluster, v, protected, i, table, 1, slack, floor)


def _missing(add, cluster, v, protected, i, table, at, slack, floor):
    """The variable's cells missing in the data (column ``at`` of its count table) and,
    where the table has one more column, the present cells the lone-cell rule withheld:
    each a count and a % of the cluster's rows."""
    rows = int(table.row_totals[i])
    for column, name in ((at, "missing"), (at + 1, "withheld")):
        if column >= table.values.shape[1]:
            break
        count, status = int(table.values[i, column]), protected.status[i][column]
        add(cluster, v.name, "", v.unit, f"{name} n", _count(status, count, slack, floor))
        if status == SHOWN and rows:
            add(cluster, v.name, "", v.unit, f"{name} %", 100.0 * count / rows)


def _categorical(add, cluster, v, protected, i, table, slack, floor):
    rows = int(table.row_totals[i])
    at = len(v.levels)  # the missing cells' column; then the withheld cells', if any
    status = protected.status[i]
    present = int(table.values[i, :at].sum())
    absent = list(range(at, table.values.shape[1]))
    if all(status[c] == SHOWN for c in absent):
        denominators = (present, present)
    else:  # the rows with the variable present, as far as the published figures say
        hidden = [c for c in absent if status[c] != SHOWN]
        low, high = protected.bounds([(i, c) for c in hidden])
        shown = sum(int(table.values[i, c]) for c in absent if status[c] == SHOWN)
        denominators = (rows - shown - int(high[i, hidden].sum()),
                        rows - shown - int(low[i, hidden].sum()))
    for c, level in enumerate(v.levels):
        n = int(table.values[i, c])
        add(cluster, v.name, level, "", "n", _count(status[c], n, slack, floor))
        if status[c] != SHOWN or denominators[1] <= 0:
            continue
        if denominators[0] == denominators[1]:
            add(cluster, v.name, level, "", "%", 100.0 * n / present)
        else:
            low = 100.0 * n / denominators[1]
            add(cluster, v.name, level, "", "%",
                _span(low, 100.0 * n / denominators[0] if denominators[0] > 0 else 100.0))
    _missing(add, cluster, v, protected, i, table, at, slack, floor)


def _composition(add, clusters, answered: Answered, shown: np.ndarray, floor: int,
                 notes: list[str]) -> None:
    """Each site's rows per cluster (:func:`protected_composition`)."""
    keys = list(answered.sites)
    counts = {key: np.asarray(answered.sites[key].counts) for key in keys}
    flagged = {key: np.asarray(answered.sites[key].hidden)[:, 0] > 0 for key in keys}
    values, note = protected_composition(counts, flagged, answered.site_rows,
                                         answered.site_floors, floor)
    notes += note
    totals = np.append(shown[:-1], sum(answered.site_rows.values()))
    for i, (name, _) in enumerate(clusters):
        for key in keys:
            value = values[key][i]
            add(name, "site", key, "", "n", value)
            if not isinstance(value, str) and totals[i]:
                add(name, "site", key, "", "%", 100.0 * value / totals[i])


def protected_composition(counts: dict, flagged: dict, site_rows: dict, site_floors: dict,
                          floor: int) -> tuple[dict, list[str]]:
    """Each site's rows per cluster under the table's rule, the sites' row counts as the
    "all" row (published: the per-site report's ``n-rows``): per site, its k clusters' and
    its own row count as Table 1 shows them (``<p`` for a cluster the site withheld under
    its floor p, unless the published figures fix it at 0), and the notes. The run
    summary's per-site sizes and Table 1's ``site`` rows are both this."""
    keys = list(counts)
    k = len(next(iter(counts.values()))) if keys else 0
    values = np.zeros((k + 1, len(keys)), dtype=np.int64)
    at_site = np.zeros((k + 1, len(keys)), dtype=bool)
    upper = np.zeros((k + 1, len(keys)), dtype=np.int64)
    for s, key in enumerate(keys):
        values[:k, s] = np.where(flagged[key], 0, np.asarray(counts[key], dtype=np.int64))
        at_site[:k, s] = flagged[key]
        upper[:k, s] = site_floors[key] - 1
        values[k, s] = site_rows[key]
    totals = np.append(values[:k].sum(axis=1), values[k].sum())
    protected = protect(CountTable(values, totals, at_site, upper, fixed_all_row=True), floor)
    out = {key: [f"<{site_floors[key]}" if protected.status[i, s] == AT_SITE
                 else _count(protected.status[i, s], values[i, s], 0, floor)
                 for i in range(k + 1)] for s, key in enumerate(keys)}
    clusters = [(str(j), None) for j in range(k)] + [("all", None)]
    return out, _exposed(protected, clusters, "site", keys)


def _exposed(protected, clusters, variable: str, columns: list[str]) -> list[str]:
    """A note per withheld cell that the published margins alone give away."""
    return [f"The published margins (cluster sizes, the sites' rows) alone give {variable} "
            f"{columns[c]} in {'all rows' if clusters[r][0] == 'all' else 'cluster ' + clusters[r][0]}, "
            "withheld as it is." for r, c in protected.exposed]

"""The profile round: who is in each cluster (Table 1 by cluster, issue 36).

After the final evaluation, one ``profile`` round (``protocol.TASKS["profile"]``) asks
every usable site for its clusters' profile (``client_app/site_profile.py``): each group
in the cluster of the final centroids its mean is nearest to (the evaluation's
partition), and per cluster and encoded feature, in the encoded units (the schema's
declared units; the run's scaling and fill undone), the rows, present cells, their sum,
their squared deviations about the point sent and a histogram of the groups' means (a
cluster under the site's floor withheld whole, nothing else). The server pools them,
applies the table's small-cell rule to the pooled counts (``common/small_cells.py``) and
makes the tidy rows of Table 1 (``common/profile.py``), which ``server_app/table1.py``
renders.

The histograms span, per numeric feature, the schema's declared ``range``. Where a
feature has none, a first round (``value_range``) asks each site for the least and the
greatest of its groups' means of present cells, and the histograms span the sites'
least to greatest: every group mean falls inside, so no median or quartile read from
them lies outside what the groups' values span (a mean +- 3 SD hull, used before, put
quartiles of pixel intensities below 0). Two rounds then, one with a schema that
declares every range. Under secure aggregation, where every round is a SecAgg+ sum
of four message round trips, a feature without a declared range spans the
``secagg-data-bound`` box instead (in the encoded units), in one round: coarser bins
where the bound is loose.

Not computed: under differential privacy (its counts, sums and histograms would each
spend budget: the run says so instead), in a k-range run (profile the k you keep), or
with ``profile = false``.
"""

from __future__ import annotations

import numpy as np

from fedcluster.common import profile, protocol
from fedcluster.common.schema import DEFAULT_MEDIAN_BINS, run_schema
from fedcluster.strategies import site_rows
from fedcluster.strategies.task_plan import TaskPlan
from fedcluster.strategies.phases import Phase



def not_profiled(config) -> str | None:
    """Why a run with this config leaves no Table 1 (None: it profiles its clusters)."""
    if not config.profile:
        return "run config profile = false"
    if config.private:
        return ("not computed under differential privacy: its counts, sums and histograms "
                "would each need noise and budget of their own")
    if config.k_bounds is not None:
        return "a k-range run profiles none of its k; run the k you keep to profile it"
    return None


def first_phase(strategy) -> Phase | None:
    """The phase the profile starts with once the final metrics are known (None: none)."""
    why = not_profiled(strategy.config)
    strategy.profile_note = why or ""
    if why is not None:
        return None
    unknown = np.isnan(declared_ranges(strategy)[0]).any()
    if unknown and not strategy.config.secure_aggregation:
        return Phase.PROFILE_RANGE
    return Phase.PROFILE


def _schema(strategy):
    run = run_schema(strategy.config.schema_file)
    return None if run is None else run[0]


def floor(strategy) -> int:
    """Table 1's floor p, its small-cell rule's (a pooled count of 1 to p-1 reads "<p"):
    the highest any site applies (the run's ``min-cluster-size``, or a site's own above
    it), so the table keeps the strictest rule of the hospitals whose rows it counts."""
    return max([strategy.config.min_cluster_size,
                *(s.group_size or 1 for s in strategy.sites.values())])


def _bins(strategy) -> int:
    schema = _schema(strategy)
    return schema.median_bins if schema is not None else DEFAULT_MEDIAN_BINS


def variables(strategy) -> list[profile.Variable]:
    """Table 1's variables: the schema's feature columns, or every feature numeric."""
    schema = _schema(strategy)
    names = strategy.feature_names or [f"feature {j}" for j in range(strategy.n_features)]
    return profile.variables_of(schema, None if schema is not None else names)


def declared_ranges(strategy) -> tuple[np.ndarray, np.ndarray]:
    """Per encoded feature, the histogram's range as far as the run knows it unasked: a
    numeric column's declared ``range`` (NaN where the schema declares none, or the run
    has no schema), [0, weight] for a category level, [0, 1] for any other column (a
    missing indicator: not in Table 1)."""
    lower, upper = np.zeros(strategy.n_features), np.ones(strategy.n_features)
    for v in variables(strategy):
        if v.kind == "categorical":
            upper[list(v.columns)] = v.weight
        else:
            lower[v.columns[0]], upper[v.columns[0]] = v.range or (np.nan, np.nan)
    return lower, upper


def value_box(strategy) -> tuple[np.ndarray, np.ndarray]:
    """Under secure aggregation, per encoded feature the interval every cell lies in (the
    scales of the profile's sums): its declared range, else the ``secagg-data-bound`` box
    of the scaled rows in the encoded units."""
    lower, upper = declared_ranges(strategy)
    bound = strategy.config.secagg_data_bound
    corners = np.vstack([np.full(len(lower), -bound), np.full(len(lower), bound)])
    if strategy.transform is not None:
        corners = strategy.transform.inverse(corners)
    unknown = np.isnan(lower)
    lower[unknown], upper[unknown] = corners.min(axis=0)[unknown], corners.max(axis=0)[unknown]
    return lower, upper


def plan(strategy) -> TaskPlan:
    """The profile's round: in the range phase each site's least and greatest group means
    (``value_range``), else the profile over the ranges found."""
    if strategy.phase == Phase.PROFILE_RANGE:
        return TaskPlan("value_range")
    if strategy.profile_range is None:  # declared (secure: the box where not declared)
        strategy.profile_range = (value_box(strategy) if strategy.config.secure_aggregation
                                  else declared_ranges(strategy))
    return profile_task(strategy, *strategy.profile_range, bins=_bins(strategy))


def reduce(strategy, plan: TaskPlan, replies) -> dict:
    """Reduce the round of the profile phase the strategy is in."""
    if strategy.phase == Phase.PROFILE_RANGE:
        return reduce_range(strategy, plan, replies)
    return reduce_profile(strategy, plan, replies)


def reduce_range(strategy, plan: TaskPlan, replies) -> dict:
    """The range of each feature without a declared one: from the least to the greatest
    of the sites' groups' means of present cells (``value_range``), so that no median
    or quartile read from the histograms lies outside what the groups' values span; a
    feature with no spread spans one unit about its value."""
    lower, upper = declared_ranges(strategy)
    unknown = np.isnan(lower)
    lo, hi = np.zeros(len(lower)), np.ones(len(lower))
    if replies:
        lo = np.min([np.asarray(r.arrays.minima, dtype=np.float64) for r in replies], axis=0)
        hi = np.max([np.asarray(r.arrays.maxima, dtype=np.float64) for r in replies], axis=0)
    lower[unknown], upper[unknown] = lo[unknown], hi[unknown]
    flat = ~(upper > lower)
    lower[flat], upper[flat] = lower[flat] - 0.5, lower[flat] + 0.5
    strategy.profile_range = (lower, upper)
    strategy.phase = Phase.PROFILE
    return {}


def profile_task(strategy, lower: np.ndarray, upper: np.ndarray, bins: int) -> TaskPlan:
    """A ``profile`` round: the final centroids, the references (the centroids in the
    encoded units), the histogram's range and bins (the sites know their levels)."""
    centroids = np.asarray(strategy.best["centroids"], dtype=np.float64)
    references = (centroids if strategy.transform is None
                  else strategy.transform.inverse(centroids))
    inputs = protocol.ProfileInputs(centroids, np.asarray(references, dtype=np.float64),
                                    np.asarray(lower, dtype=np.float64),
                                    np.asarray(upper, dtype=np.float64))
    return TaskPlan("profile", params={protocol.BINS: int(bins)}, arrays=inputs, max_rows=bins)


def reduce_profile(strategy, plan: TaskPlan, replies) -> dict:
    """Table 1's tidy rows from the sites' profiles (one reply: the secure sum)."""
    strategy.phase = Phase.DONE
    strategy.finished = True
    if not replies:
        strategy.profile_note = "no site answered the profile round"
        return {}
    inputs = plan.arrays
    pooled = profile.pool([r.arrays for r in replies])
    table = profile.table1(pooled, variables(strategy), inputs.references, inputs.lower,
                           inputs.upper, floor(strategy), answered_by(strategy, replies))
    # (as data: the strategy's state is checkpointed)
    strategy.profile_table = {"rows": table.rows, "notes": table.notes}
    answered = sum(r.n_sites for r in replies)
    if answered < len(strategy.sites):
        strategy.profile_note = (f"{answered} of {len(strategy.sites)} sites answered the "
                                 "profile round: Table 1 counts their rows only")
    return {}


def answered_by(strategy, replies) -> profile.Answered:
    """Who answered the profile round: their rows and floors (a site's floor: the run's
    ``min-cluster-size`` or its own group size, the larger), and in a plain round each
    site's own profile."""
    run = strategy.config.min_cluster_size
    floors = {key: max(run, site.group_size or 1) for key, site in strategy.sites.items()}
    if any(r.n_sites > 1 for r in replies):  # the secure sum: no site's own figures
        return profile.Answered(sum(r.n_rows for r in replies), max(floors.values()))
    return profile.Answered(sum(r.n_rows for r in replies),
                            max(floors[r.site_key] for r in replies),
                            {r.site_key: r.arrays for r in replies},
                            {r.site_key: r.n_rows for r in replies},
                            {r.site_key: floors[r.site_key] for r in replies})


def table1_of(strategy) -> dict | None:
    """Table 1 as the model keeps it (``Model.table1``): its rows, the floor its "<p"
    cells name, whether it came from a secure sum, and its notes (None: no profile)."""
    if strategy.profile_table is None:
        return None
    otherwise = ("the secagg-data-bound box: a median or quartile may then lie outside "
                 "what the values span; declare the column's range in the schema"
                 if strategy.config.secure_aggregation
                 else "the least to the greatest of the sites' group means")
    notes = [f"Medians and quartiles come from a histogram of {_bins(strategy)} bins per "
             f"variable over its range (the schema's; else {otherwise}), linear within a "
             "bin: exact to one bin where a site answers from its rows."]
    if any((s.group_size or 1) > 1 for s in strategy.sites.values()):
        notes.append("Sites answer from groups of rows (each at least its min-cluster-size): "
                     "a group is counted whole in the cluster its mean is nearest to, as the "
                     "run's metrics count it, and enters the histograms at its mean, which "
                     "draws the quartiles towards the median (on the clinical demo at p_site "
                     "2: a median 1.3 bins, 11% of the rows' IQR, from the rows' own quartiles, "
                     "at worst 9.3 bins; BENCHMARKS.md, table1-quartiles). Means "
                     "and counts are those of the rows' present values (a value the group rule "
                     "withholds is counted apart and is in no figure); an SD is of the groups' "
                     "spreads as the sites keep them, where a site withholds a group's spread "
                     "(the dominance rule, or a spread that would give values back) the site's "
                     "pooled spread of the variable standing in for it, which can make an SD "
                     "larger than the rows' own.")
    notes += strategy.profile_table["notes"]
    accounts = [site.rows for site in strategy.ordered_sites() if site.rows]
    if (short := sum(site_rows.not_answered(rows) for rows in accounts)):
        usable = sum(rows["usable"] for rows in accounts)
        notes.append(f"The sites answered from {usable - short} of their {usable} usable rows: "
                     f"{short} were in no group or held back by the versions audit (run "
                     "summary and model.json, site-rows); Table 1 describes the rows answered "
                     "from.")
    if strategy.profile_note:
        notes.append(strategy.profile_note[0].upper() + strategy.profile_note[1:] + ".")
    return {"rows": strategy.profile_table["rows"], "floor": floor(strategy),
            "secure": bool(strategy.config.secure_aggregation), "notes": notes,
            "from-groups": any((s.group_size or 1) > 1 for s in strategy.sites.values())}

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
from fedcluster.common.datasets import KNOWN_RANGES
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


def first_phase(config, feature_names: list[str], width: int) -> tuple[Phase | None, str]:
    """The phase the profile starts with once the final metrics are known (None: none),
    and why there is none ("" where there is)."""
    why = not_profiled(config)
    if why is not None:
        return None, why
    unknown = np.isnan(declared_ranges(config, feature_names, width)[0]).any()
    if unknown and not config.secure_aggregation:
        return Phase.PROFILE_RANGE, ""
    return Phase.PROFILE, ""


def _schema(config):
    run = run_schema(config.schema_file)
    return None if run is None else run[0]


def floor(config, sites) -> int:
    """Table 1's floor p, its small-cell rule's (a pooled count of 1 to p-1 reads "<p"):
    the highest any site applies (the run's ``min-cluster-size``, or a site's own above
    it: ``sites``, the admitted sites), so the table keeps the strictest rule of the
    hospitals whose rows it counts."""
    return max([config.min_cluster_size, *(s.group_size or 1 for s in sites)])


def bins(config) -> int:
    """The histograms' bins per variable: the schema's ``median-bins`` or the default."""
    schema = _schema(config)
    return schema.median_bins if schema is not None else DEFAULT_MEDIAN_BINS


def variables(config, feature_names: list[str], width: int, sites=()) -> list[profile.Variable]:
    """Table 1's variables: the schema's feature columns, or every feature numeric (where
    every one of ``sites`` holds a part of one built-in data set, with its known range)."""
    schema = _schema(config)
    names = feature_names or [f"feature {j}" for j in range(width)]
    held = {site.provenance.get("dataset") for site in sites}
    known = KNOWN_RANGES.get(held.pop()) if len(held) == 1 else None
    return profile.variables_of(schema, None if schema is not None else names, known)


def declared_ranges(config, feature_names: list[str], width: int) -> tuple[np.ndarray, np.ndarray]:
    """Per encoded feature, the histogram's range as far as the run knows it unasked: a
    numeric column's declared ``range`` (NaN where the schema declares none, or the run
    has no schema), [0, weight] for a category level, [0, 1] for any other column (a
    missing indicator: not in Table 1)."""
    lower, upper = np.zeros(width), np.ones(width)
    for v in variables(config, feature_names, width):
        if v.kind == "categorical":
            upper[list(v.columns)] = v.weight
        else:
            lower[v.columns[0]], upper[v.columns[0]] = v.range or (np.nan, np.nan)
    return lower, upper


def value_box(config, feature_names: list[str], width: int,
              transform) -> tuple[np.ndarray, np.ndarray]:
    """Under secure aggregation, per encoded feature the interval every cell lies in (the
    scales of the profile's sums): its declared range, else the ``secagg-data-bound`` box
    of the scaled rows in the encoded units (``transform``: the run's)."""
    lower, upper = declared_ranges(config, feature_names, width)
    bound = config.secagg_data_bound
    corners = np.vstack([np.full(len(lower), -bound), np.full(len(lower), bound)])
    if transform is not None:
        corners = transform.inverse(corners)
    unknown = np.isnan(lower)
    lower[unknown], upper[unknown] = corners.min(axis=0)[unknown], corners.max(axis=0)[unknown]
    return lower, upper


def unasked_range(config, feature_names: list[str], width: int, transform):
    """The histograms' range where no ``value_range`` round asks the sites: the declared
    ranges (secure: the :func:`value_box` where none is declared)."""
    if config.secure_aggregation:
        return value_box(config, feature_names, width, transform)
    return declared_ranges(config, feature_names, width)


def range_from_sites(declared: tuple[np.ndarray, np.ndarray], replies) -> tuple[np.ndarray, np.ndarray]:
    """The range of each feature without a ``declared`` one: from the least to the
    greatest of the sites' groups' means of present cells (``value_range``), so that no
    median or quartile read from the histograms lies outside what the groups' values
    span; a feature with no spread spans one unit about its value."""
    lower, upper = (np.array(v, dtype=np.float64) for v in declared)
    unknown = np.isnan(lower)
    lo, hi = np.zeros(len(lower)), np.ones(len(lower))
    if replies:
        lo = np.min([np.asarray(r.arrays.minima, dtype=np.float64) for r in replies], axis=0)
        hi = np.max([np.asarray(r.arrays.maxima, dtype=np.float64) for r in replies], axis=0)
    lower[unknown], upper[unknown] = lo[unknown], hi[unknown]
    flat = ~(upper > lower)
    lower[flat], upper[flat] = lower[flat] - 0.5, lower[flat] + 0.5
    return lower, upper


def profile_task(centroids: np.ndarray, transform, lower: np.ndarray, upper: np.ndarray,
                 bins: int, report: bool = False) -> TaskPlan:
    """A ``profile`` round: the final centroids, the references (the centroids in the
    encoded units: ``transform`` undone), the histogram's range and bins (the sites know
    their levels); ``report``: over the report's groups, as the evaluation was
    (``protocol.REPORT``)."""
    centroids = np.asarray(centroids, dtype=np.float64)
    references = centroids if transform is None else transform.inverse(centroids)
    inputs = protocol.ProfileInputs(centroids, np.asarray(references, dtype=np.float64),
                                    np.asarray(lower, dtype=np.float64),
                                    np.asarray(upper, dtype=np.float64))
    params = {protocol.BINS: int(bins), **({protocol.REPORT: True} if report else {})}
    return TaskPlan("profile", params=params, arrays=inputs, max_rows=bins)


def table1_rows(plan: TaskPlan, replies, variables: list, floor: int,
                answered: profile.Answered, n_sites: int) -> tuple[dict | None, str]:
    """Table 1's tidy rows from the sites' profiles (one reply: the secure sum), as the
    run keeps them (data: checkpointed), and a note where not every one of the
    ``n_sites`` admitted sites answered (None, a note: nobody did)."""
    if not replies:
        return None, "no site answered the profile round"
    inputs = plan.arrays
    pooled = profile.pool([r.arrays for r in replies])
    table = profile.table1(pooled, variables, inputs.references, inputs.lower, inputs.upper,
                           floor, answered)
    n_answered = sum(r.n_sites for r in replies)
    note = (f"{n_answered} of {n_sites} sites answered the profile round: Table 1 counts "
            "their rows only") if n_answered < n_sites else ""
    return {"rows": table.rows, "notes": table.notes}, note


def answered_by(config, sites, replies) -> profile.Answered:
    """Who answered the profile round: their rows and floors (a site's floor: the run's
    ``min-cluster-size`` or its own group size, the larger), and in a plain round each
    site's own profile."""
    run = config.min_cluster_size
    floors = {key: max(run, site.group_size or 1) for key, site in sites.items()}
    if any(r.n_sites > 1 for r in replies):  # the secure sum: no site's own figures
        return profile.Answered(sum(r.n_rows for r in replies), max(floors.values()))
    return profile.Answered(sum(r.n_rows for r in replies),
                            max(floors[r.site_key] for r in replies),
                            {r.site_key: r.arrays for r in replies},
                            {r.site_key: r.n_rows for r in replies},
                            {r.site_key: floors[r.site_key] for r in replies})


def table1_of(config, ordered_sites: list, profile_table: dict | None,
              profile_note: str, report: bool = False) -> dict | None:
    """Table 1 as the model keeps it (``Model.table1``): its rows, the floor its "<p"
    cells name, whether it came from a secure sum, and its notes (None: no profile;
    ``report``: the profile was of the report's groups, ``report_round.py``);
    ``ordered_sites`` the admitted sites in site order, ``profile_table`` and
    ``profile_note`` the run's (:func:`table1_rows`)."""
    if profile_table is None:
        return None
    otherwise = ("the secagg-data-bound box: a median or quartile may then lie outside "
                 "what the values span; declare the column's range in the schema"
                 if config.secure_aggregation
                 else "the least to the greatest of the sites' group means")
    notes = [f"Medians and quartiles come from a histogram of {bins(config)} bins per "
             f"variable over its range (the schema's; else {otherwise}), linear within a "
             "bin: exact to one bin where a site answers from its rows."]
    if any((s.group_size or 1) > 1 for s in ordered_sites):
        recut = ("; a site first re-cuts the groups whose rows the model puts in two "
                 "clusters, each cluster's such rows pooled into one group, where its privacy "
                 "rules allow (else they count in their group's cluster, where predict may "
                 "not put them; where the few values of a numeric variable on one side would "
                 "stand alone, that group's values of it stand at its cluster's mean, the "
                 "site's total exact)") if report else ""
        notes.append("Sites answer from groups of rows (each at least its min-cluster-size): "
                     "a group is counted whole in the cluster its mean is nearest to, as the "
                     f"run's metrics count it{recut}. A group enters the histograms at its mean, which "
                     "draws the quartiles towards the median (on the clinical demo at p_site "
                     "2: a median 1.7 bins, 18% of the rows' IQR, from the rows' own quartiles, "
                     "at worst 11 bins; BENCHMARKS.md, table1-quartiles). Means "
                     "and counts are those of the rows' present values (a value the group rule "
                     "withholds is counted apart and is in no figure); an SD is of the groups' "
                     "spreads as the sites keep them, where a site withholds a group's spread "
                     "(the dominance rule, or a spread that would give values back) the site's "
                     "pooled spread of the variable standing in for it, which can make an SD "
                     "larger than the rows' own.")
    notes += profile_table["notes"]
    accounts = [site.rows for site in ordered_sites if site.rows]
    if (short := sum(site_rows.not_answered(rows) for rows in accounts)):
        usable = sum(rows["usable"] for rows in accounts)
        notes.append(f"The sites answered from {usable - short} of their {usable} usable rows: "
                     f"{short} were in no group or held back by the versions audit (run "
                     "summary and model.json, site-rows); Table 1 describes the rows answered "
                     "from.")
    if profile_note:
        notes.append(profile_note[0].upper() + profile_note[1:] + ".")
    return {"rows": profile_table["rows"], "floor": floor(config, ordered_sites),
            "secure": bool(config.secure_aggregation), "notes": notes,
            "from-groups": any((s.group_size or 1) > 1 for s in ordered_sites)}

"""``fedcluster site check``: a site's data file against the agreed schema, before it
joins, without contacting anyone (for the site's own eyes: its data officer's).

It reads the file as text, encodes it as a site would (``common/table_encoding.py``)
and reports rows, usable rows, per column the missing share, cells outside the range and
the unit read, per category the count of each level and of unlisted values, the groups
the site would answer from (how many, their sizes, rows waiting), with a cache
directory the versions of the data it has answered from (what each kept, withdrew and
held back), what its groups would cost its own k-means at its p and at 2, 5 and 10
(``data/group_cost.py``, from its rows alone), and what a run would send from the file,
task by task. When the table does not fit the schema, the check fails with the same
message the encoding gives (file, row, column, value). :func:`report` returns the same
as data (the text and the cost table); :func:`check`, the text.
"""

from __future__ import annotations

import contextlib
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fedcluster.client_app import row_account, site_check_config
from fedcluster.client_app.data import group_cost, group_table
from fedcluster.client_app.data.group_cost import GroupCostTable
from fedcluster.client_app.data.site_data import SiteDataError
from fedcluster.client_app.data.table_files import read_table, with_file_line
from fedcluster.common.imputation import imputation_plan
from fedcluster.common.schema import Schema, schema_hash
from fedcluster.common.table_encoding import (
    EncodedTable, RowUnits, cell_text, encode_table, match_columns, numeric_values, row_units,
)


@dataclass
class ColumnSurvey:
    """What the check saw in one schema column of the file."""

    name: str
    header: str
    kind: str
    unit: str | None = None
    missing: int = 0
    out_of_range: int = 0
    levels: dict[str, int] = field(default_factory=dict)
    unlisted: dict[str, int] = field(default_factory=dict)


def survey(header: list[str], columns: list[list[str]], schema: Schema, source: str,
           declared_units: dict[str, str] | None = None) -> tuple[list[ColumnSurvey], EncodedTable]:
    """Per feature column, its counts; and the table encoded (``SiteDataError`` as a run's)."""
    where = match_columns(header, schema, source, declared_units)
    missing_tokens = schema.missing_cells
    out = []
    for column in schema.features:
        j, unit = where[column.name]
        seen = ColumnSurvey(column.name, header[j], column.type)
        if column.type == "categorical":
            cells = [cell_text(c) for c in columns[j]]
            seen.missing = sum(c in missing_tokens for c in cells)
            for c in cells:
                if c in missing_tokens:
                    continue
                bucket = seen.levels if c in column.categories else seen.unlisted
                bucket[c] = bucket.get(c, 0) + 1
        else:  # parsed and converted as a run does (its errors, too)
            units = row_units(unit, columns)
            values = numeric_values(columns[j], column, units, source, header[j],
                                    missing=missing_tokens)
            seen.missing = int(np.isnan(values).sum())
            seen.unit = unit or column.unit
            if isinstance(unit, RowUnits):  # how many values came in each unit
                found, counts = np.unique(np.asarray(units, dtype=object)[~np.isnan(values)]
                                          .astype(str), return_counts=True)
                seen.unit = (", ".join(f"{u} {n}" for u, n in zip(found, counts))
                             + f" (per row: {unit.header})")
            if column.range is not None:
                lo, hi = column.range
                seen.out_of_range = int(((values < lo) | (values > hi)).sum())
        out.append(seen)
    return out, encode_table(header, columns, schema, source, declared_units)


@dataclass(frozen=True)
class SiteCheckReport:
    """What ``fedcluster site check`` found: the report it prints (``text``) and the cost
    of the site's groups to its own k-means (``cost``: None when turned off or when the
    site has too few rows, ``cost_note`` then says which)."""

    text: str
    cost: GroupCostTable | None
    cost_note: str | None = None
    refusal: str | None = None  # what a run would get from the site (site_check_config)


def format_groups(groups, cost_lines: list[str] = ()) -> list[str]:
    """What a data officer reads of the site's groups: how many, their sizes, rows
    waiting; then ``cost_lines`` (what they cost), then the versions of the data."""
    sizes, how_many = np.unique(np.asarray(groups.counts), return_counts=True)
    if groups.min_size == 1:
        head = (f"Groups: none (min-cluster-size = 1: this site answers from its {groups.n_rows} "
                "rows, an explicit opt-out; a coordinator can then isolate single rows)")
        return [head, "", *cost_lines]
    lines = [f"Groups (min-cluster-size p_site = {groups.min_size}): every reply is a function of "
             f"{groups.n_groups} groups of at least {groups.min_size} rows, made by this site "
             f"alone; sizes: " + ", ".join(f"{int(n)} of {int(s)} rows"
                                           for s, n in zip(sizes, how_many)),
             f"group table sha256 {groups.digest[:16]} (the disclosure ledger names it)"]
    if groups.waiting:
        lines.append(row_account.waiting_text(groups))
    if groups.cells_withheld:
        lines.append(f"{groups.cells_withheld} present cell(s) withheld: fewer than "
                     f"{groups.min_size} of their column in their group (a column with fewer "
                     "than that in the site's whole table: no merge of groups gives them "
                     "company), their sum would rest on fewer rows than that; a run fills them "
                     "as missing, Table 1 counts them apart")
    lines += format_spreads(groups.spread_rule, groups.min_size)
    return lines + ["", *cost_lines] + format_lineage(groups)


def format_spreads(rule: dict | None, min_size: int) -> list[str]:
    """What the spread rules did to the groups the table made (``release/spreads.py``,
    ``release/dominance.py``)."""
    if not rule:
        return []
    from fedcluster.client_app.release import dominance, spreads

    if not rule['groups']:  # a version that kept its groups and grouped nothing anew
        return [f"Spreads: no second moment of fewer than {spreads.SPREAD_MIN_ROWS} rows leaves "
                "this site (this version made no new group; its kept groups keep their spreads)"]
    return [f"Spreads: no second moment of fewer than {spreads.SPREAD_MIN_ROWS} rows leaves this "
            f"site. Of the {rule['groups']} groups this table made, {rule['paired']} share their "
            "spread with a nearby group (a spread unit, its m2 shared), "
            f"{rule['merged-units']} unit(s) were merged where values tie (a spread that would "
            f"give cells back); the dominance rule (1 row, {dominance.ESTIMATE_WITHIN:.0%}: a row "
            f"{dominance.DOMINANT_SD:g} SD out of its group whose unit's spread would place it "
            f"within {dominance.ESTIMATE_WITHIN:.0%}) withheld {rule['dominated']} spread(s) of "
            f"a feature, {rule['withheld']} group-feature spread(s) withheld in all (the site's "
            "pooled spread stands in)",
            f"Means: the p% rule on means ({dominance.ESTIMATE_WITHIN:.0%}: a row "
            f"{dominance.DOMINANT_SD:g} SD from the site's mean that its group's mean would "
            f"place within {dominance.ESTIMATE_WITHIN:.0%}, the group's other rows taken at the "
            f"site's mean; from p_site {dominance.MEANS_FROM_P}) "
            + (f"withheld {rule.get('dominated-means', 0)} group sum(s) of a feature (the "
               "site's mean of the feature stands in for it, and its unit's spread is withheld)"
               if min_size >= dominance.MEANS_FROM_P else
               f"does not apply at this site's p_site {min_size}: a group's mean places a row "
               "far out to within its group's other rows' distance from the site's mean")]


def format_lineage(groups) -> list[str]:
    """The versions of the site's data it has answered from (its lineage: every table
    it made, oldest first), what each kept, withdrew and held back (``versions/``)."""
    from fedcluster.client_app.data.versions import Store

    ref = groups.table_ref
    if ref is None or ref.lineage is None:
        return []  # (data held in memory: one table, its record in this process)
    tables = [t for t in Store.read_tables(ref.store) if t["lineage"] == ref.lineage]
    lines = ["Versions of this data (every table counts as answered from): a new version keeps "
             "the groups of any earlier version whose rows are all there, withdraws whole a "
             "group that lost or changed a row (its other rows join new groups when they can), "
             "groups new rows, and holds back what the audit finds would isolate fewer rows "
             "than the groups' size",
             "version | file | made | rows | kept rows (of other versions) | withdrawn groups "
             "(their rows) | new groups | rows in no group | held back by the audit"]
    for i, t in enumerate(tables):
        mark = " (this one)" if t["n"] == ref.number else ""
        reused = t.get("reused-rows", 0)
        kept = "-" if "kept-rows" not in t and not reused else \
            f"{t.get('kept-rows', 0) + reused}" + (f" ({reused})" if reused else "")
        lines.append(f"{i + 1}{mark} | {t.get('file', '-')} | {str(t.get('made', '-'))[:10]} | "
                     f"{t.get('rows', '-')} | {kept} | {t.get('withdrawn-groups', 0)} "
                     f"({t.get('withdrawn-rows', 0)}) | {t.get('new-groups', '-')} | "
                     f"{t.get('waiting', 0)} | {t.get('held-back', 0)}")
        for finding in sorted(set(t.get("findings", [])))[:3]:
            lines.append(f"    held back because {finding}")
    return lines + [""]


def format_survey(source: str, n_rows: int, columns: list[ColumnSurvey], table: EncodedTable,
                  schema: Schema, floor: int = 2, groups=None,
                  cost_lines: list[str] = ()) -> str:
    lines = [f"{source}: {n_rows} rows, {table.X.shape[0]} usable ({table.rows_dropped} dropped "
             f"by drop-row), {table.X.shape[1]} encoded features",
             f"schema sha256 {schema_hash(schema)} (a run's schema must have the same)", "",
             "column | read from | missing | policy | outside the range | unit read"]
    by_name = {c.name: c for c in schema.features}
    for seen in columns:
        column = by_name[seen.name]
        share = f"{seen.missing} ({100 * seen.missing / max(n_rows, 1):.1f}%)"
        outside = "-" if column.range is None else (
            f"{seen.out_of_range} ({'clipped' if column.out_of_range == 'clip' else 'an error'})")
        lines.append(f"{seen.name} | {seen.header} | {share} | {schema.policy(column)} | "
                     f"{outside} | {seen.unit or '-'}")
    for seen in columns:
        if seen.kind == "categorical":
            counts = ", ".join(f"{level} {seen.levels.get(level, 0)}"
                               for level in by_name[seen.name].categories)
            lines.append(f"{seen.name}: {counts}" + (
                f"; unlisted (mapped to {by_name[seen.name].other!r}): "
                + ", ".join(f"{k} {v}" for k, v in sorted(seen.unlisted.items()))
                if seen.unlisted else ""))
    lines += ["", "These counts are for this site's eyes: the check sends nothing.", ""]
    if groups is not None:
        lines += format_groups(groups, cost_lines)
    return "\n".join(lines + would_send(table, schema, floor))


def would_send(table: EncodedTable, schema: Schema, floor: int) -> list[str]:
    """What a run would send from this file, task by task (never a row)."""
    plan = imputation_plan(schema)
    medians = sorted({c.name for c in schema.features if schema.policy(c) == "impute-median"})
    lines = [f"What a run sends from this file (privacy floor p = {floor}: the larger of the "
             "run's min-cluster-size and this site's; a figure over fewer than p rows is "
             "withheld or sent as \"<p\"):",
             f"- describe: the rows in its groups, {table.X.shape[1]} features and their "
             "names, the schema's hash, the rows dropped and the missing cells per column "
             "(counts, as its groups keep them: they move between versions by whole groups), "
             "and the rows in no group and held back by the audit (counts of rows)"]
    if plan.needed:
        lines.append("- impute_stats (once): per imputed column the sum and count of its "
                     "present cells" + (f"; for {', '.join(medians)} a histogram over the "
                                        f"schema's range in {schema.median_bins} bins"
                                        if medians else ""))
    lines += ["- stats (with scale = standard, once): per feature the mean, the sum of "
              "deviations and M2 over all rows",
              "- training rounds: per cluster (of whole groups) the mean (or sum) and the count "
              "of its members",
              "- evaluation: per cluster its size, coordinate sums, squared norms and SSE; the "
              "final model's (and its Table 1) over the report's groups: the groups its "
              "clusters straddle re-cut within them where the audit allows (each partition "
              "judged with everything this site released: its record)",
              "- Table 1 (profile): per cluster its rows; per feature its present cells, their "
              "sum, their squared deviations (each group's as it keeps it: its spread unit's, "
              "of at least 3 rows), a histogram of its groups' means and the present cells "
              "its groups withhold (a count)",
              "(a differentially private run answers from the rows, clipped and noised, "
              "within this site's dp-budget)"]
    return lines


def site_cost(site, floor: int, k_values: tuple[int, ...], cost_scale: str,
              groups=None) -> tuple[GroupCostTable | None, list[str]]:
    """The cost table of the site's groups and its lines; with too few rows, None and a
    line that says so (the rest of the check still runs)."""
    need = group_cost.rows_needed(k_values)
    if site.n_rows < need:
        note = (f"Cost of the groups to this site's own k-means: not computed ({site.n_rows} "
                f"usable rows; at least {need} needed for k = {k_values[0]})")
        return None, [note, ""]
    table = group_cost.group_cost(site, floor, k_values, scale=cost_scale, site_groups=groups)
    return table, table.lines()


def report(path, schema: Schema, declared_units: dict[str, str] | None = None,
           floor: int = 2, cache_dir: str | Path | None = None, *, cost: bool = True,
           cost_k=group_cost.DEFAULT_K_VALUES, cost_scale: str = "standard",
           history: str | None = None, record: bool = False, node=None,
           run_config: dict | None = None) -> SiteCheckReport:
    """The findings of ``fedcluster site check`` (``SiteDataError`` when the file does not
    fit); ``path``: the file, or a database's query (``sql_source.SqlSource``);
    ``floor``: the site's own floor p_site (its groups' size; the run's default 2).
    With ``cache_dir`` (the site's node config ``cache-dir``) the groups are those the
    site keeps there (a grown file's, rows waiting included), else made here alone.
    ``cost``: compute the cost table (``data/group_cost.py``) for ``cost_k`` (k values,
    or text as ``"2-10"``) in the space ``cost_scale`` (``"standard"`` or ``"none"``),
    from the site's rows here: at ``floor`` the groups reported, at the other p the
    groups the site would make of these rows. ``history``: the site's named history (node
    config ``history``). ``record``: the table made here is written to the site's history
    in ``cache_dir`` (it then counts as answered from, as when the site answers); else the
    check works on a scratch copy of that history and writes nothing to it. ``node`` (the
    site's node config; default: every default at ``floor``) and ``run_config`` (a run's,
    optional): the site's policy and the run judged as the site will
    (``site_check_config``), ``refusal`` the error a run would get."""
    from fedcluster.client_app.data.schema_table import encode_site_columns, load_schema_table
    from fedcluster.client_app.data.sql_source import SqlSource
    from fedcluster.client_app.data.site_data import in_history
    from fedcluster.client_app.data.sql_table import Reading, load_sql_table, read_sql_columns

    if cost:  # a bad k or scale fails before the file is read
        cost_k = group_cost.parse_k_values(cost_k) if isinstance(cost_k, str) \
            else group_cost.checked_k_values(cost_k)
        if cost_scale not in group_cost.SCALES:
            raise ValueError(f"the cost table's scale must be one of {group_cost.SCALES}, "
                             f"got {cost_scale!r}")
    database = isinstance(path, SqlSource)
    source = path.source if database else str(path)
    header, columns = read_sql_columns(path) if database else read_table(path)
    try:
        seen, table = survey(header, columns, schema, source, declared_units)
    except SiteDataError as err:
        raise err if database else with_file_line(err, path) from None
    if cache_dir is not None and database:  # the version a site would read now
        site = load_sql_table(Reading(path, schema, declared_units), cache_dir=cache_dir)
    elif cache_dir is not None:
        site = load_schema_table(path, schema, units=declared_units, cache_dir=cache_dir)
    else:
        site = encode_site_columns(header, columns, schema, source, declared_units)[0]
    site = in_history(site, history)
    with _history_to_use(cache_dir, record) as groups_dir:
        groups, _ = group_table.site_groups(site, floor, groups_dir)
        cost_table, cost_lines = site_cost(site, floor, cost_k, cost_scale, groups) if cost \
            else (None, [])
        text = format_survey(source, len(columns[0]), seen, table, schema, floor, groups,
                             cost_lines)
        policy, refusal = site_check_config.findings(site_check_config.node_for(node, floor),
                                                     groups, run_config)
    note = cost_lines[0] if cost and cost_table is None else None
    return SiteCheckReport("\n".join([text, "", *policy]), cost_table, note, refusal)


@contextlib.contextmanager
def _history_to_use(cache_dir, record: bool):
    """Where the check keeps the groups it makes: the site's own ``cache_dir`` when asked
    to ``record``; else a scratch copy of its answered history (``<cache-dir>/groups``),
    so the check sees what the site would answer from next and writes nothing to it."""
    if cache_dir is None or record:
        yield cache_dir
        return
    with tempfile.TemporaryDirectory(prefix="fedcluster-check-") as scratch:
        if (Path(cache_dir) / "groups").is_dir():
            shutil.copytree(Path(cache_dir) / "groups", Path(scratch) / "groups",
                            ignore=shutil.ignore_patterns("*.lock", "*.tmp"))
        yield scratch


def check(path, schema: Schema, declared_units: dict[str, str] | None = None,
          floor: int = 2, cache_dir: str | Path | None = None, **cost_options) -> str:
    """The report of ``fedcluster site check``, as text (:func:`report`, which takes the
    same arguments, ``cost``, ``cost_k`` and ``cost_scale`` among them)."""
    return report(path, schema, declared_units, floor, cache_dir, **cost_options).text


def read_as_the_site_will(node, record: bool = False,
                          run_config: dict | None = None) -> tuple[str, str | None]:
    """A node config without a schema: its data file read as the site's ClientApp will
    read it (columns, label, id), its parsed cache made in a scratch directory; what was
    read, and the groups the site would answer from next, with its rows waiting or held
    back against its answered history (its ``cache-dir``, else the default cache; a
    scratch copy of it unless ``record``, as :func:`report`); and the refusal a run would
    get (None: none), as :func:`report`."""
    from fedcluster.client_app.data_sources import load_site
    from fedcluster.client_app.data.site_data import default_cache_dir, in_history
    from fedcluster.common.config import run_config_defaults

    with tempfile.TemporaryDirectory(prefix="fedcluster-check-") as scratch:
        site, _ = load_site(node.model_copy(update={"cache_dir": scratch}),
                            run_config_defaults())
        site = in_history(site, node.history)
        rows, features = site.X.shape
        lines = [f"{node.data_path}: {rows} rows, {features} features, read as the site will "
                 "read them (no schema-path: --schema checks the file against the agreed "
                 "schema)", ""]
        with _history_to_use(node.cache_dir or default_cache_dir(), record) as groups_dir:
            groups, _ = group_table.site_groups(site, node.min_cluster_size, groups_dir)
            lines += format_groups(groups)
            policy, refusal = site_check_config.findings(node, groups, run_config)
    return "\n".join([*lines, "", *policy]).replace("\n\n\n", "\n\n"), refusal


def command(args) -> int:
    """``fedcluster site check`` from its parsed arguments (``cli.py``): prints the
    report, or the node config's check; returns the exit code."""
    from fedcluster.common.schema import load_schema, parse_units

    units = list(args.units or [])
    run_config = site_check_config.parsed_run_config(getattr(args, "run_config", None))
    node = site_check_config.checked_node_config(args.node_config) if args.node_config else None
    if node is not None:
        vars(args).update(site_check_config.with_node_config(vars(args), node))
        if args.data is None and not units:
            return 0  # a node config without data to check: valid is all there is to say
        if args.schema is None and node.data_path is not None:
            text, refusal = read_as_the_site_will(node, record=args.record, run_config=run_config)
            print(text)
            return refused(refusal)
    if args.schema is None:
        raise ValueError("site check needs the schema (--schema, or --node-config's schema-path)")
    args.min_cluster_size = 2 if args.min_cluster_size is None else args.min_cluster_size
    if args.data is None:  # `--units a=x FILE`: --units took the file too
        if not units or "=" in units[-1]:
            raise ValueError("site check needs the data file (fedcluster site check DATA "
                             "--schema SCHEMA)")
        args.data = units.pop()
    units = parse_units(units, "--units")
    if args.min_cluster_size < 1:
        raise ValueError("--min-cluster-size must be >= 1")
    from fedcluster.client_app.data_sources import is_database_url

    data = args.data
    if is_database_url(data):  # a database (node config data-url) and what to read from it
        from fedcluster.client_app.data.sql_source import sql_source

        data = sql_source(data, args.data_query, args.data_query_file, args.data_table)
    found = report(data, load_schema(args.schema), units, args.min_cluster_size, args.cache_dir,
                   cost=not args.no_cost_table, cost_k=args.cost_k, cost_scale=args.cost_scale,
                   history=args.history, record=args.record, node=node, run_config=run_config)
    print(found.text)
    return refused(found.refusal)


def refused(refusal: str | None) -> int:
    """The check's exit status: 1, the refusal on stderr, where a run would refuse the
    site; else 0."""
    if refusal is None:
        return 0
    print(f"fedcluster: error: a run would refuse this site: {refusal}", file=sys.stderr)
    return 1

"""Table 1 by cluster: who is in each cluster, rendered from tidy profile rows.

The federated part computes a cluster profile and hands it over as *tidy rows*, one
figure per row (``cluster, variable, level, unit, statistic, value``); this module only
renders them: ``table1.csv`` (the rows as they are), ``table1.md`` and ``table1.html``
(the familiar clinical layout: one column per cluster, largest first, and "All").

Tidy rows
---------
cluster
    ``"all"`` or a cluster id ``"0"``..``"k-1"`` (the labels ``Model.predict`` gives).
variable
    ``"size"`` (statistics ``n``, ``%`` of all rows), ``"site"`` (level = the site's name;
    ``n``, ``%`` of the cluster) or a schema column.
level
    ``""`` for a numeric variable (``n``, ``mean``, ``sd``, ``median``, ``q1``, ``q3``,
    ``missing n``, ``missing %``: cells absent in the data; ``withheld n``, ``withheld
    %``: cells present in the data that the sites' lone-cell rule withheld, only where
    there are any); a categorical level's label (``n``, ``%`` of the rows with the
    variable present), and ``""`` for its ``missing``/``withheld`` ``n`` and ``%``.
unit
    The numeric variable's unit, or ``""``.
value
    A float; ``"<p"`` (a count of 1 to p-1 rows, withheld by the small-cell rule, or a
    cluster a site withheld, under its own floor); ``"suppressed"`` (a count withheld so
    that no ``<p`` cell can be worked out from the others, ``common/small_cells.py``);
    ``"a-b"`` (a count, or a %, known to lie between a and b: where a site withheld rows
    of the cluster, or a % whose denominator is withheld); ``""`` (not available, e.g.
    per-site figures under secure aggregation). A cluster some site withheld rows of has
    a ``size`` row ``rows shown``: its means, SDs, quartiles and % are of those rows.
"""

from __future__ import annotations

import csv
import html
from pathlib import Path

from fedcluster.common import profile
from fedcluster.common.row_spread import ROWS_QUARTILE_ERROR, ROWS_QUARTILE_TYPICAL
from fedcluster.server_app.table1_cells import (_at_most, _lower_end, _median, _n_equals, _n_pct, _number,
                                                _pair, _why_not, format_count)

FIELDS = list(profile.FIELDS)
ALL = "all"
SIZE = "size"
SITE = "site"
# An em space: the indent of a level row, visible in the raw markdown and rendered alike.
INDENT = "\u2003"


def write_table1(rows: list[dict], meta: dict, directory: str | Path) -> list[Path]:
    """Write ``table1.csv``, ``table1.md`` and ``table1.html`` into ``directory``.

    Parameters
    ----------
    rows : list of dict
        The tidy profile rows (see the module docstring).
    meta : dict
        ``{"floor": p, "secure": bool, "notes": [str, ...], "from-groups": bool}``; every
        key optional (``from-groups``: a site answered from groups, so medians and
        quartiles are of group means, and their rows say so).
    directory : str or Path
        Created if missing.

    Returns
    -------
    list of Path
        The three files, in that order.

    Raises
    ------
    ValueError
        A row lacks one of the six keys (the message names the row and the key).
    """
    rows = _checked(rows)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = [directory / "table1.csv", directory / "table1.md", directory / "table1.html"]
    with open(paths[0], "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=FIELDS)
        writer.writeheader()
        for row in rows:
            writer.writerow({**{key: row[key] for key in FIELDS}, "value": _csv_value(row["value"])})
    paths[1].write_text(table1_markdown(rows, meta))
    paths[2].write_text(table1_html(rows, meta))
    return paths


def read_table1(path: str | Path) -> list[dict]:
    """The tidy rows of a ``table1.csv``: values as floats, ``"<p"`` and ``""`` kept as text.

    Raises
    ------
    ValueError
        The file's header is not ``cluster,variable,level,unit,statistic,value``.
    """
    with open(path, newline="") as fh:
        reader = csv.DictReader(fh)
        if reader.fieldnames != FIELDS:
            raise ValueError(f"{path}: not a table1.csv (header {reader.fieldnames}, "
                             f"expected {','.join(FIELDS)})")
        return [{**row, "value": _parse_value(row["value"])} for row in reader]


def cluster_order(rows: list[dict]) -> list[str]:
    """The cluster ids, largest first (by the ``size``/``n`` rows, an interval by its
    lower end; a suppressed or unknown size after every known one; ties by id), without
    ``"all"``."""
    sizes = {r["cluster"]: _lower_end(r["value"]) for r in rows
             if r["variable"] == SIZE and r["statistic"] == "n" and r["cluster"] != ALL}
    ids = list(dict.fromkeys(r["cluster"] for r in rows if r["cluster"] != ALL))

    def key(cid: str):
        size = sizes.get(cid)
        known = size is not None
        # A suppressed size is 1..p-1 rows: smaller than any size shown, so it goes last.
        return (0 if known else 1, -(size if known else 0), _id_key(cid))

    return sorted(ids, key=key)


def table1_layout(rows: list[dict], meta: dict) -> tuple[list[str], list[tuple[str, list[str], str]], list[str]]:
    """The table as text cells, shared by the markdown and the HTML.

    Returns
    -------
    header : list of str
        ``"Characteristic"``, then one ``"Cluster c (n = ...)"`` per cluster, largest
        first, then ``"All (n = ...)"``.
    body : list of (label, cells, kind)
        ``kind`` is ``"row"``, ``"group"`` (a categorical variable's heading, empty cells)
        or ``"level"`` (indented under a heading or a numeric variable).
    notes : list of str
        The footnote lines.
    """
    index = {(r["cluster"], r["variable"], r["level"], r["statistic"]): r["value"] for r in rows}
    columns = cluster_order(rows) + [ALL]

    def get(cid, variable, level, statistic):
        return index.get((cid, variable, level, statistic), "")

    def n_pct(variable, level, n_stat="n", pct_stat="%"):
        return [_n_pct(get(c, variable, level, n_stat), get(c, variable, level, pct_stat))
                for c in columns]

    def head(c):
        shown = get(c, SIZE, "", "rows shown")
        of = "" if shown == "" else f"; {format_count(shown)} shown"
        return f"{'All' if c == ALL else f'Cluster {c}'} ({_n_equals(get(c, SIZE, '', 'n'))}{of})"

    header = ["Characteristic"] + [head(c) for c in columns]
    body: list[tuple[str, list[str], str]] = [("rows, n (% of all rows)", n_pct(SIZE, ""), "row")]
    for variable in dict.fromkeys(r["variable"] for r in rows if r["variable"] != SIZE):
        of_variable = [r for r in rows if r["variable"] == variable]
        levels = list(dict.fromkeys(r["level"] for r in of_variable if r["level"] != ""))
        unit = next((r["unit"] for r in of_variable if r["unit"]), "")
        label = f"{variable} ({unit})" if unit else variable
        if levels:  # categorical (and "site"): a heading, then one row per level
            body.append((f"{label}, n (%)", [""] * len(columns), "group"))
            body += [(INDENT + level, n_pct(variable, level), "level") for level in levels]
        else:
            body.append((f"{label}, mean (SD)",
                         [_pair(get(c, variable, "", "mean"),
                                _at_most(get(c, variable, "", "sd"), get(c, variable, "", "sd at most")),
                                "({})")
                          if get(c, variable, "", "mean") != "" else _why_not(get(c, variable, "", "n"))
                          for c in columns], "row"))
            body.append((INDENT + "median [Q1, Q3]",
                         [_median(get(c, variable, "", "median"), get(c, variable, "", "q1"),
                                  get(c, variable, "", "q3")) for c in columns], "level"))
        for name, text in (("missing", "missing"), ("withheld", "withheld (group rule)")):
            counts = [get(c, variable, "", f"{name} n") for c in columns]
            # Shown when any cell has such rows, or may have (a withheld count, an interval).
            if any(isinstance(m, str) and m != "" or _number(m) and m > 0 for m in counts):
                body.append((INDENT + f"{text}, n (%)",
                             n_pct(variable, "", f"{name} n", f"{name} %"), "level"))
    return header, body, _notes(meta, rows)


def table1_markdown(rows: list[dict], meta: dict) -> str:
    """Table 1 as a markdown (pipe) table, then the footnote lines."""
    header, body, notes = table1_layout(_checked(rows), meta)

    def line(cells):
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

    out = [line(header), "|" + "|".join([":---"] + ["---:"] * (len(header) - 1)) + "|"]
    for label, cells, kind in body:
        out.append(line([f"**{label}**" if kind == "group" else label] + cells))
    return "\n".join(out + [""] + notes) + "\n"


def table1_html(rows: list[dict], meta: dict) -> str:
    """Table 1 as an HTML fragment: ``<table class="table1">`` and a ``<div
    class="table1-notes">`` of footnotes; no ``<html>`` wrapper; every text escaped."""
    header, body, notes = table1_layout(_checked(rows), meta)
    esc = html.escape
    out = ['<table class="table1">', "<thead><tr>"
           + "".join(f'<th scope="col">{esc(h)}</th>' for h in header) + "</tr></thead>", "<tbody>"]
    for label, cells, kind in body:
        out.append(f'<tr class="{kind}"><th scope="row">{esc(label.lstrip(INDENT))}</th>'
                   + "".join(f"<td>{esc(c)}</td>" for c in cells) + "</tr>")
    out += ["</tbody>", "</table>", '<div class="table1-notes">']
    out += [f"<p>{esc(note)}</p>" for note in notes]
    out.append("</div>")
    return "\n".join(out) + "\n"


def _notes(meta: dict, rows: list[dict] = ()) -> list[str]:
    notes = []
    floor = meta.get("floor")
    if floor:
        p = int(floor)
        small = f"1 to {p - 1} rows" if p > 2 else "1 row"
        notes.append(f"Small cells (p = {p}): a count of {small} reads <{p}; "
                     f"\"suppressed\": a count withheld so that no <{p} cell can be worked out "
                     "from the counts shown and the published margins (cluster sizes, all "
                     "rows, each site's rows); every other count is exact. Where a count is "
                     "withheld, so are its mean (SD), quartiles and %.")
    notes.append("Numeric variables: mean (SD), then median [Q1, Q3]"
                 + (" (the rows': where sites answered from groups, estimated from their "
                    "groups' means and the exact spread within the groups, a normal spread "
                    f"about each group's mean; on the clinical demo half within "
                    f"{ROWS_QUARTILE_TYPICAL} SD of the rows' own, all within "
                    f"{ROWS_QUARTILE_ERROR} SD)" if meta.get("from-groups") else "")
                 + "; categories: n (% of the "
                 "cluster's rows with the variable present; where that number is withheld, "
                 "the range of % the figures allow); missing: n (% of the cluster's rows); "
                 "\"-\": not available.")
    if any(r["statistic"] == "mean held to range" for r in rows):
        notes.append("A mean at an end of its column's known range where the sites' stand-ins "
                     "(for sums they withhold) put it outside: the true mean is inside, so "
                     "the end is nearer to it.")
    if any(r["statistic"] == "sd at most" for r in rows):
        notes.append("\u2264 before an SD: the sites' spreads (a site's pooled spread stands in "
                     "for one it withholds) gave more than a column of that mean can have "
                     "within its known range; the SD shown is that most (Bhatia-Davis), the "
                     "true one no larger.")
    if any(r["statistic"] == "withheld n" for r in rows):
        notes.append("Withheld (group rule): values present in the data but not used, each "
                     "alone or nearly (fewer than the site's floor) among the present values "
                     "of its variable in its group of rows; they are in no mean, SD or "
                     "quartile, and are not counted missing.")
    if any(r["statistic"] == "rows shown" for r in rows):
        notes.append("A cluster with \"shown\" in its heading: a site withheld its rows of it "
                     "(fewer than that site's floor), so its counts read a-b (from those shown "
                     "to the most that site could hold), and its means, SDs, quartiles and % are "
                     "of the rows shown.")
    if meta.get("secure"):
        notes.append("Secure aggregation: the server saw only sums over all sites, so "
                     "per-site figures are not available.")
    return notes + [str(note) for note in meta.get("notes", [])]


# --- values and checks --------------------------------------------------------------------

def _id_key(cid: str):
    return (0, int(cid), "") if cid.isdigit() else (1, 0, cid)


def _csv_value(value) -> str:
    if isinstance(value, str):
        return value
    value = float(value)
    # Whole numbers without ".0" (counts read as counts); others round-trip exactly (repr).
    return str(int(value)) if value.is_integer() and abs(value) < 2**53 else repr(value)


def _parse_value(text: str):
    if text == "" or text.startswith("<"):
        return text
    try:
        return float(text)
    except ValueError:
        return text  # any other text is shown as it is, never guessed at


def _checked(rows: list[dict]) -> list[dict]:
    out = []
    for i, row in enumerate(rows):
        missing = [key for key in FIELDS if key not in row]
        if missing:
            raise ValueError(f"profile row {i} ({row!r}) has no key {missing[0]!r}")
        value = "" if row["value"] is None else row["value"]
        if isinstance(value, str) and value not in ("",) and not value.startswith("<"):
            value = _parse_value(value)
        out.append({**{key: str(row[key]) for key in FIELDS[:-1]}, "value": value})
    return out

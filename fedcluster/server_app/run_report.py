"""``report.html``: one self-contained page about a finished run, for a clinician and a
data officer (``fedcluster report RUN_DIR``).

Everything is inside the file: the CSS in a ``<style>`` element, the images as
``data:image/png;base64`` URIs, no script, and nothing the browser fetches (so it opens
offline, behind a hospital proxy, or attached to an e-mail). Every text read from the run
directory is escaped with ``html.escape``.
"""

from __future__ import annotations

import base64
import csv
import html
import json
import tempfile
from pathlib import Path

from fedcluster.common.model import Model
from fedcluster.common.protocol import TASKS
from fedcluster.common.schema import parse_schema, schema_hash
from fedcluster.server_app.profile_plots import plot_profile, plot_sites
from fedcluster.server_app.table1 import read_table1, table1_html
from fedcluster.strategies import site_rows
from fedcluster.strategies.metrics import LABEL_METRICS, LABEL_NOTE

esc = html.escape

# System fonts only: a web font would be a fetch.
STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", Helvetica, Arial, sans-serif;
       max-width: 1100px; margin: 2em auto; padding: 0 1em; color: #222; line-height: 1.45; }
h1 { font-size: 1.6em; border-bottom: 2px solid #444; padding-bottom: .2em; }
h2 { font-size: 1.25em; margin-top: 2em; border-bottom: 1px solid #bbb; }
table { border-collapse: collapse; margin: .8em 0; font-size: .92em; }
th, td { padding: .25em .7em; text-align: right; border-bottom: 1px solid #e2e2e2; }
th[scope=row], td.text { text-align: left; }
thead th { border-bottom: 2px solid #444; vertical-align: bottom; }
/* Table 1 at k = 10 (12 columns) fits a 1200-pixel window without sideways scrolling */
table.table1 { font-size: .8em; }
table.table1 th, table.table1 td { padding: .2em .35em; }
table.table1 tr.group th { font-weight: bold; padding-top: .6em; }
table.table1 tr.level th { font-weight: normal; padding-left: 2em; }
table.table1 tr.row th { font-weight: normal; }
.table1-notes p, .note { font-size: .85em; color: #555; margin: .2em 0; }
img { max-width: 100%; height: auto; border: 1px solid #ddd; }
.warning { background: #fff4e5; border-left: 4px solid #e69500; padding: .4em .8em; }
"""

# Metrics with their own section (or too large for the metrics table).
NESTED = ("per-site", "rejected-sites", "site-failures", "sites-answering-from-rows",
          "sites-at-max-rounds", "table", "cluster-sizes", "site-rows", "report-groups")


def write_report(run_dir: str | Path) -> Path:
    """Write ``run_dir/report.html`` from what the run left there.

    Reads ``model.json`` (required), and if present ``history.csv``, ``table1.csv``,
    ``profile.png``, ``sites.png`` and ``convergence.png``; the two profile pictures are
    drawn from ``table1.csv`` when the run did not leave them (in a temporary directory:
    the run directory gets only ``report.html``).

    Returns
    -------
    Path
        ``run_dir/report.html``.

    Raises
    ------
    FileNotFoundError
        ``run_dir`` or its ``model.json`` is missing (the message names the path).
    ValueError
        ``model.json`` is not a fedcluster model, or ``table1.csv`` not a Table 1.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"{run_dir}: no such run directory")
    if not (run_dir / "model.json").is_file():
        raise FileNotFoundError(f"{run_dir / 'model.json'}: no such file (is {run_dir} the "
                                "output directory of a run?)")
    model = Model.load(run_dir / "model.json")
    parts = [f"<h1>Federated clustering run: {esc(run_dir.name)}</h1>",
             _what_was_run(model), _metrics(model.metrics),
             _profile(run_dir, model), _convergence(run_dir), _sites_section(model.metrics),
             _history(run_dir / "history.csv")]
    page = ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<title>fedcluster run {esc(run_dir.name)}</title>\n<style>{STYLE}</style>\n"
            "</head>\n<body>\n" + "\n".join(parts) + "\n</body>\n</html>\n")
    path = run_dir / "report.html"
    path.write_text(page, encoding="utf-8")
    return path


def _what_was_run(model: Model) -> str:
    metrics, config = model.metrics, model.config
    facts = [("algorithm", model.algorithm), ("clusters (k)", model.n_clusters),
             ("features", ", ".join(model.feature_names) or model.n_features),
             ("sites", metrics.get("n-sites", "-")), ("rows", metrics.get("n-rows", "-")),
             ("training rounds", metrics.get("rounds", "-")),
             ("scaling", config.get("scale", "none" if model.scaling is None else "yes"))]
    if model.schema is not None:
        facts.append(("schema", config.get("schema") or "(kept in model.json)"))
        facts.append(("schema sha256", schema_hash(parse_schema(model.schema, "model schema"))))
    out = ["<h2>What was run</h2>", _pairs(facts)]
    if "dp-epsilon" in metrics:
        out.append('<p class="warning">Differential privacy: the sizes, the score and every '
                   f"figure are noisy (epsilon {esc(_text(metrics.get('dp-epsilon-spent')))} "
                   f"spent of {esc(_text(metrics['dp-epsilon']))}).</p>")
    if config:
        out.append("<details><summary>The run configuration</summary>"
                   + _pairs(sorted(config.items())) + "</details>")
    return "\n".join(out)


def _metrics(metrics: dict) -> str:
    scalars = [(k, v) for k, v in metrics.items()
               if k not in NESTED and not isinstance(v, (dict, list))]
    labelled = [(k, v) for k, v in scalars if k in LABEL_METRICS]
    out = ["<h2>Metrics</h2>",
           '<p class="note">The score is the mean squared distance of a row to its nearest '
           "centroid (in the scaled space when the run scaled); lower is tighter.</p>",
           *(['<p class="note">Every figure below counts the sites\' groups of rows, each in '
              "one cluster whole, the groups the model's clusters straddle re-cut within them "
              "where the sites' rules allow: rows where the model's predict puts them, but "
              "for a group a site kept whole.</p>"] if metrics.get("report-groups") else []),
           _pairs([(k, v) for k, v in scalars if k not in LABEL_METRICS])]
    if labelled:
        out += ["<h3>Against known labels</h3>",
                f'<p class="note">These metrics: {esc(LABEL_NOTE)}.</p>', _pairs(labelled)]
    if "cluster-sizes" in metrics:
        out.append("<p>Cluster sizes (clusters 0 to k-1): "
                   f"{esc(', '.join(_text(s) for s in metrics['cluster-sizes']))}</p>")
    return "\n".join(out)


def _profile(run_dir: Path, model: Model) -> str:
    out = ["<h2>Who is in each cluster (Table 1)</h2>"]
    table = run_dir / "table1.csv"
    if not table.is_file():
        why = model.metrics.get("profile-note")
        out.append("<p>This run left no cluster profile (no table1.csv in its directory), "
                   "so there is no Table 1 here" + (f": {esc(str(why))}" if why else "")
                   + ".</p>")
        return "\n".join(out)
    rows = read_table1(table)
    meta = _table1_meta(run_dir)
    out.append(table1_html(rows, meta))
    with tempfile.TemporaryDirectory() as scratch:
        profile = _image(run_dir / "profile.png") or _image(plot_profile(rows, Path(scratch) / "p.png"))
        sites = run_dir / "sites.png"
        drawn = sites if sites.is_file() else plot_sites(rows, Path(scratch) / "s.png")
        site_image = _image(drawn) if drawn else None
    out += ["<h3>How each cluster differs from all rows</h3>",
            _img(profile, "Heatmap: each cluster's standardised difference from all rows")]
    out.append("<h3>Each site's cluster composition</h3>")
    out.append(_img(site_image, "Stacked bars: rows per cluster at each site") if site_image else
               "<p>No per-site figures: under secure aggregation the server sees only sums "
               "over all sites, never one site's composition.</p>")
    return "\n".join(out)


def _table1_meta(run_dir: Path) -> dict:
    """The footnotes' facts: a ``table1-meta.json`` if the run left one, else the floor and
    secure flag from the run config."""
    path = run_dir / "table1-meta.json"
    if path.is_file():
        return json.loads(path.read_text())
    config = json.loads((run_dir / "model.json").read_text()).get("config", {})
    return {"floor": config.get("min-cluster-size"), "secure": bool(config.get("secure-aggregation")),
            "notes": []}


def _convergence(run_dir: Path) -> str:
    image = _image(run_dir / "convergence.png")
    if image is None:
        return ""
    return ("<h2>Convergence</h2>\n"
            + _img(image, "Score and centroid movement per training round, and the centroids"))


def _sites_section(metrics: dict) -> str:
    out = ["<h2>Sites: rejected, failed, answering from rows</h2>"]
    items = []
    accounts = metrics.get("site-rows", {})
    for key, rows in accounts.items():
        if site_rows.not_answered(rows):
            items.append(f'<li class="warning">site {esc(str(key))} '
                         f"{esc(site_rows.short_text(rows))}</li>")
    for key, reason in metrics.get("rejected-sites", {}).items():
        items.append(f"<li>site {esc(str(key))} was rejected: {esc(_text(reason))}</li>")
    for key, events in metrics.get("site-failures", {}).items():
        events = events if isinstance(events, list) else [events]
        items.append(f"<li>site {esc(str(key))} failed {len(events)} time(s); first: "
                     f"{esc(_text(events[0] if events else ''))}</li>")
    for key in metrics.get("sites-answering-from-rows", []):
        items.append(f"<li>site {esc(str(key))} answered from its rows (its min-cluster-size "
                     "= 1, an explicit opt-out of site groups)</li>")
    for key, limit in metrics.get("sites-at-max-rounds", {}).items():
        items.append(f"<li>site {esc(str(key))} reached its own max-rounds = "
                     f"{esc(_text(limit))} and was not asked after that</li>")
    if accounts:
        usable = sum(int(r["usable"]) for r in accounts.values())
        answered = sum(int(r["answered"]) for r in accounts.values())
        out.append(f"<p>The sites answered from {answered} of their {usable} usable rows"
                   f" ({100 * answered / max(usable, 1):.1f}%).</p>")
    everything = accounts and not any(site_rows.not_answered(r) for r in accounts.values())
    out.append(f"<ul>{''.join(items)}</ul>" if items else
               "<p>No site was rejected or failed; every site answered from all its usable "
               "rows, in its groups.</p>" if everything else
               "<p>No site was rejected or failed (this model.json does not say how many of "
               "its rows each site answered from).</p>")
    return "\n".join(out)


def _history(path: Path) -> str:
    out = ["<h2>What each site sent, round by round</h2>"]
    if not path.is_file():
        out.append("<p>No history.csv in the run directory.</p>")
        return "\n".join(out)
    with open(path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    out.append('<table class="history"><thead><tr><th>round</th><th>repetition</th>'
               '<th scope="col">task</th><th>sites answered</th>'
               '<th scope="col">what each answering site sent</th></tr></thead><tbody>')
    for row in rows:
        task = row.get("task", "")
        sends = _sends(task)
        out.append(f"<tr><td>{esc(row.get('round', ''))}</td><td>{esc(row.get('repetition', ''))}"
                   f'</td><td class="text">{esc(task)}</td><td>{esc(row.get("sites-answered", ""))}'
                   f'</td><td class="text">{esc(sends)}</td></tr>')
    out.append("</tbody></table>")
    return "\n".join(out)


# --- helpers ----------------------------------------------------------------------------

def _sends(label: str) -> str:
    """What a round's sites sent, from its history label: a task, or a describe that
    carried the run's first task (``describe+stats``): both sentences."""
    names = [part.split()[0] for part in label.split("+") if part.split()]
    known = [TASKS[name].sends for name in names if name in TASKS and TASKS[name].sends]
    if not known or len(known) != len(names):
        return "unknown task"
    return "; and in the same message: ".join(known)


def _image(path: Path | None) -> str | None:
    """A PNG as a data URI (inlined: the page fetches nothing), None if absent."""
    if path is None or not Path(path).is_file():
        return None
    return "data:image/png;base64," + base64.b64encode(Path(path).read_bytes()).decode("ascii")


def _img(uri: str | None, alt: str) -> str:
    return f'<p><img src="{uri}" alt="{esc(alt)}"></p>' if uri else ""


def _text(value) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    return str(value)


def _pairs(items) -> str:
    rows = "".join(f'<tr><th scope="row">{esc(str(k))}</th><td class="text">{esc(_text(v))}</td></tr>'
                   for k, v in items)
    return f"<table>{rows}</table>"

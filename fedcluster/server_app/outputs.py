"""What a run leaves behind and shows: progress lines, the summary, and the files
``model.json``, ``history.csv``, ``convergence.png`` and ``report.html`` in
``output-dir/<run-name>/``;
for a k-range run ``choose-k.json``, ``choose-k.png`` and ``model-k<k>.json``.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path


from fedcluster.strategies import site_rows
from fedcluster.strategies.metrics import LABEL_METRICS, LABEL_NOTE, METRIC_NAMES
from fedcluster.common.model import Model
from fedcluster.server_app.convergence_plot import plot_convergence
from fedcluster.server_app.run_outcome import lost_lines

MAX_SITE_LINES = 20

HISTORY_COLUMNS = [
    "round",
    "repetition",
    "task",
    "sites-asked",
    "sites-answered",
    "sites-failed",
    # simulated devices (simulated-availability, simulated-stragglers): not failures
    "sites-offline",
    "sites-late",
    "movement",
    "score",
    "seconds",
    "failures",
    # the sites whose replies the round used, e.g. 0-3,7,9-12
    "answered",
    # the rows those replies came from, and the usable rows of those sites they did not
    # (waiting in no group, held back by the versions audit: model.json's site-rows)
    "rows-answered",
    "rows-not-answered",
    # differential privacy only: the epsilon spent so far
    "dp-epsilon-spent",
    # GTV only (empty otherwise)
    "gtv-per-edge",
    "local-score-mean",
    "local-score-max",
    "pooled-score-best",
    "pooled-score-mean",
    "pooled-score-worst",
]


def progress_line(row: dict, max_rounds: int) -> str:
    """One line per round, for the console."""

    def num(key: str, fmt: str) -> str:
        value = row.get(key)
        return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, fmt)

    return (
        f"round {row['round']:>3} [{row['task']:<21}] rep {row['repetition']} "
        f"sites {row['sites-answered']}/{row['sites-asked']} "
        f"(failed {row['sites-failed']}"
        + (f", offline {row['sites-offline']}, late {row['sites-late']}"
           if row.get("sites-offline") or row.get("sites-late") else "")
        + f") movement {num('movement', '.3e')} "
        f"score {num('score', '.6g')} {num('seconds', '.2f')}s"
        + (f" epsilon spent {row['dp-epsilon-spent']:.4g}" if "dp-epsilon-spent" in row else "")
    )


def summary_table(metrics: dict) -> str:
    """The closing table: federated score, and the central baseline where known."""
    lines = ["", *lost_lines(metrics), "  result                          value", "  " + "-" * 44]
    rows = [
        ("federated score (inertia / N)", metrics.get("score")),
        ("federated inertia", metrics.get("inertia")),
        ("rows / sites", f"{metrics.get('n-rows')} / {metrics.get('n-sites')}"),
        ("training rounds", metrics.get("rounds")),
    ]
    rows += [(f"{name} (needs labels)" if name in LABEL_METRICS else name, metrics[name])
             for name in METRIC_NAMES[2:] if name in metrics]
    central = metrics.get("central-score")
    if central is not None:
        on_rows = metrics.get("score-on-rows", metrics["score"])
        rows += [
            ("score on the pooled rows", on_rows),
            ("central KMeans score (n_init 10)", central),
            ("on the rows / central", on_rows / central),
        ]
    for name, value in rows:
        text = f"{value:.6g}" if isinstance(value, float) else str(value)
        lines.append(f"  {name:<32}{text:>12}")
    if any(name in metrics for name in LABEL_METRICS):
        lines.append(f"  (needs labels: {LABEL_NOTE})")
    if "dp-epsilon" in metrics:
        lines.append(
            f"  differential privacy ({metrics.get('dp-mode', 'local')}): epsilon "
            f"{metrics['dp-epsilon-spent']:.4g} spent of "
            f"{metrics['dp-epsilon']:.4g} (delta {metrics['dp-delta']:.3g}) over "
            f"{metrics['dp-rounds']} of {metrics['dp-rounds-planned']} planned data rounds, "
            f"noise sigma {metrics.get('dp-sigma-sums', float('nan')):.4g} per sum and "
            f"{metrics.get('dp-sigma-counts', float('nan')):.4g} per count; score and sizes "
            "are noisy")
        if metrics.get("dp-bounds-from-data"):
            lines.append("  WARNING: the clipping box came from the sites' data (no data-bounds): "
                         "their minima and maxima were disclosed outside the DP guarantee")
    per_site = metrics.get("per-site", {})
    if per_site:
        lines.append("  per site (sizes as in Table 1: <p fewer than p rows; suppressed: withheld so "
                     "that no <p can be worked out):")
        for key, report in list(per_site.items())[:MAX_SITE_LINES]:
            sizes = ", ".join(str(c) for c in report["cluster-sizes"])
            lines.append(f"    site {key}: {report['n-rows']} rows, score {report['score']:.6g}, sizes [{sizes}]")
        if len(per_site) > MAX_SITE_LINES:
            lines.append(f"    ... {len(per_site) - MAX_SITE_LINES} more in model.json")
    lines += rows_lines(metrics.get("site-rows", {}))
    lines += table_lines(metrics.get("table"))
    if metrics.get("report-groups"):
        lines.append("  (the score and the metrics are those of the sites' groups, each in one cluster whole,")
        lines.append("   those the model's clusters straddle re-cut within them where the sites' rules allow;")
        lines.append("   a site's predict labels its rows one by one: where a group stayed whole, otherwise)")
    else:
        lines.append("  (the score and the metrics are those of the sites' groups, each in one cluster whole;")
        lines.append("   a site's predict labels its rows one by one, which scores at most that)")
    for key in metrics.get("sites-answering-from-rows", []):
        lines.append(f"  site {key} answered from its rows (its min-cluster-size = 1, an explicit "
                     "opt-out of site groups: no promise holds for its rows)")
    for key, reason in metrics.get("rejected-sites", {}).items():
        lines.append(f"  rejected site {key}: {reason}")
    for key, limit in metrics.get("sites-at-max-rounds", {}).items():
        lines.append(f"  site {key} answered its max-rounds={limit} task rounds (its own policy) "
                     "and was not asked after that")
    failures = metrics.get("site-failures", {})
    for key, events in list(failures.items())[:MAX_SITE_LINES]:
        lines.append(f"  site {key} failed {len(events)} time(s); first: {events[0]}; "
                     f"last: {events[-1]}")
    if len(failures) > MAX_SITE_LINES:
        lines.append(f"    ... {len(failures) - MAX_SITE_LINES} more sites failed: model.json")
    lines += participation_lines(metrics.get("participation"))
    if "profile-note" in metrics:
        lines.append(f"  Table 1 by cluster: {metrics['profile-note']}")
    if central is None:
        lines.append("  (no central k-means to compare with: the rows stay at the sites; only a "
                     "simulation of a built-in data set lets the server rebuild them)")
    else:
        lines.append(
            "  (central baseline: simulation only, the server rebuilt the pooled "
            "data set from its name)"
        )
    return "\n".join(lines)


def rows_lines(accounts: dict) -> list[str]:
    """The summary's account of the sites' rows (``site-rows``): how many of their usable
    rows they answered from and, per site that did not answer from all, why."""
    if not accounts:
        return []
    usable = sum(int(r["usable"]) for r in accounts.values())
    answered = sum(int(r["answered"]) for r in accounts.values())
    short = {key: r for key, r in accounts.items() if site_rows.not_answered(r)}
    if not short:
        return [f"  rows answered from: all {answered} usable rows of the {len(accounts)} sites"]
    lines = [f"  rows answered from: {answered} of {usable} usable rows "
             f"({100 * answered / max(usable, 1):.1f}%); {len(short)} site(s) answered from "
             "fewer than all theirs:"]
    for key, rows in list(short.items())[:MAX_SITE_LINES]:
        lines.append(f"    WARNING site {key} {site_rows.short_text(rows)}")
    if len(short) > MAX_SITE_LINES:
        lines.append(f"    ... {len(short) - MAX_SITE_LINES} more in model.json (site-rows)")
    return lines


def participation_lines(participation: dict | None) -> list[str]:
    """Who answered the training rounds, in the summary (``participation`` of
    ``build_model``); who answered each round is history.csv's ``answered``."""
    if not participation or not participation["rounds"]:
        return []
    n = participation["rounds"]
    line = (f"  training rounds: {participation['answered'] / n:.1f} of "
            f"{participation['asked'] / n:.1f} asked sites answered per round")
    if participation.get("simulated"):
        line += (f" ({participation['offline'] / n:.1f} offline, "
                 f"{participation['late'] / n:.1f} late: simulated-availability "
                 f"{participation['simulated']['availability']:g}, simulated-stragglers "
                 f"{participation['simulated']['stragglers']:g})")
    return [line, "  (who answered each round: history.csv, column 'answered')"]


def write_history(path: Path, history: list[dict]) -> None:
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=HISTORY_COLUMNS, extrasaction="ignore")
        writer.writeheader()
        for row in history:
            writer.writerow({key: row.get(key, "") for key in HISTORY_COLUMNS})


#: Table 1's files (``table1.py``, ``profile_plots.py``), written when the run profiled
#: its clusters.
TABLE1_FILES = ("table1.csv", "table1.md", "table1.html", "table1-meta.json", "profile.png",
                "sites.png")


def write_outputs(directory: Path, model: Model) -> None:
    """model.json, history.csv, convergence.png, Table 1 (``write_table1_files``) and
    report.html (``run_report.py``: the page that shows them all) into ``directory``."""
    from fedcluster.server_app.run_report import write_report

    directory.mkdir(parents=True, exist_ok=True)
    model.save(directory / "model.json")
    write_history(directory / "history.csv", model.history)
    plot_convergence(directory / "convergence.png", model)
    write_table1_files(directory, model.table1)
    write_report(directory)


def write_table1_files(directory: Path, table1: dict | None) -> None:
    """table1.csv/md/html, table1-meta.json (its floor, secure flag and notes),
    profile.png and (not under secure aggregation) sites.png; none of them, and none left
    from an earlier run of the same name, when ``table1`` is None."""
    from fedcluster.server_app.profile_plots import plot_profile, plot_sites
    from fedcluster.server_app.table1 import write_table1

    for name in TABLE1_FILES:
        (directory / name).unlink(missing_ok=True)
    if table1 is None:
        return
    rows, meta = table1["rows"], {k: v for k, v in table1.items() if k != "rows"}
    write_table1(rows, meta, directory)
    (directory / "table1-meta.json").write_text(json.dumps(meta, indent=1))
    plot_profile(rows, directory / "profile.png")
    plot_sites(rows, directory / "sites.png")


def plot_choose_k(path: Path, result: dict) -> None:
    """The four criteria against k, each with the k it picks marked; the elbow panel also
    shows kneedle's chord."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ks = [int(k) for k in result["per-k"]]
    rows = list(result["per-k"].values())
    panels = [
        ("inertia", "elbow", "inertia (sum of squared distances)", "elbow (kneedle)"),
        ("simplified-silhouette", "simplified-silhouette", "simplified silhouette", "largest"),
        ("davies-bouldin", "davies-bouldin", "Davies-Bouldin index", "smallest"),
        ("calinski-harabasz", "calinski-harabasz", "Calinski-Harabasz index", "largest"),
    ]
    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    for ax, (metric, criterion, label, rule) in zip(axes.ravel(), panels):
        values = [row.get(metric, float("nan")) for row in rows]
        ax.plot(ks, values, marker="o", markersize=4)
        best = result["best"].get(criterion)
        if metric == "inertia":
            ax.plot([ks[0], ks[-1]], [values[0], values[-1]], color="0.6", linestyle=":",
                    label="chord")
        if best is not None:
            ax.axvline(best, color="C3", linestyle="--", label=f"{rule}: k = {best}")
            ax.plot([best], [values[ks.index(best)]], "o", color="C3")
        ax.set(xlabel="k", ylabel=label, title=label)
        ax.set_xticks(ks[:: math.ceil(len(ks) / 15)])
        ax.legend(fontsize=8)
    fig.suptitle(f"choose k: {result['algorithm']}, scale {result['scale']}, k = {ks[0]}..{ks[-1]}\n"
                 "every figure computed federatedly (exact pooled values)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_choose_k(directory: Path, result: dict, models: dict) -> None:
    """choose-k.json, choose-k.png and one model-k<k>.json per k into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "choose-k.json").write_text(json.dumps(result, indent=1))
    plot_choose_k(directory / "choose-k.png", result)
    for k, model in models.items():
        model.save(directory / f"model-k{k}.json")


def table_lines(table: dict | None) -> list[str]:
    """The summary's lines for tables read through a schema (``reports.table_summary``)."""
    if not table:
        return []

    def count(figure: dict) -> str:
        under = figure.get("sites-under-floor", 0)
        return f"{figure['total']}" + (f" (+ {under} site(s) with fewer than p)" if under else "")

    read = (f"table schema sha256 {table['schema-hash'][:16]}..." if table["schema-hash"]
            else "tables (no schema)")
    lines = [f"  {read}: rows dropped (drop-row) {count(table['rows-dropped'])}"]
    missing = {c: f for c, f in table.get("cells-missing", {}).items()
               if f["total"] or f.get("sites-under-floor")}
    if missing:
        lines.append("  missing cells per column: "
                     + ", ".join(f"{c} {count(f)}" for c, f in missing.items()))
    return lines

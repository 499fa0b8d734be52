"""Table 1 by cluster, its pictures and the run report (issues 36, 44): rendering only,
from tidy profile rows built by hand."""

from __future__ import annotations

from html import escape as esc

import base64
import csv
import re
import shutil
import subprocess
import tomllib
from html.parser import HTMLParser

import numpy as np
import pytest

from fedcluster import cli
from fedcluster.common.clinical_demo import clinical_schema_toml
from fedcluster.common.model import Model
from fedcluster.common.protocol import TASKS
from fedcluster.common.schema import parse_schema, schema_hash
from fedcluster.server_app import table1, table1_cells
from fedcluster.server_app.profile_plots import plot_profile, plot_sites, profile_matrix
from fedcluster.server_app.run_report import write_report

PNG = b"\x89PNG\r\n\x1a\n"
META = {"floor": 2, "secure": False, "notes": ["Synthetic test profile."]}


def row(cluster, variable, statistic, value, level="", unit=""):
    return {"cluster": cluster, "variable": variable, "level": level, "unit": unit,
            "statistic": statistic, "value": value}


def profile_rows() -> list[dict]:
    """Cluster 1 (120 rows) is larger than cluster 0 (79): the table shows 1 first."""
    rows = []
    for cid, n, pct in (("0", 79.0, 39.7), ("1", 120.0, 60.3), ("all", 199.0, 100.0)):
        rows += [row(cid, "size", "n", n), row(cid, "size", "%", pct)]
    glucose = {"0": (7.812, 1.234, 7.5, 6.9, 8.6, 3.0, 3.8),
               "1": (5.1, 0.9, 5.0, 4.4, 5.7, 0.0, 0.0),
               "all": (6.2, 1.6, 5.9, 4.9, 7.1, 3.0, 1.5)}
    for cid, (mean, sd, med, q1, q3, miss, miss_pct) in glucose.items():
        for stat, value in (("n", 0.0), ("mean", mean), ("sd", sd), ("median", med),
                            ("q1", q1), ("q3", q3), ("missing n", miss), ("missing %", miss_pct)):
            rows.append(row(cid, "glucose", stat, value, unit="mmol/L"))
    smoking = {"0": ((60.0, 75.9), (18.0, 22.8), ("<2", "<2")),
               "1": ((40.0, 33.3), (80.0, 66.7), (0.0, 0.0)),
               "all": ((100.0, 50.3), (98.0, 49.2), (1.0, 0.5))}
    for cid, levels in smoking.items():
        for level, (n, pct) in zip(("never", "current", "former"), levels):
            rows += [row(cid, "smoking", "n", n, level), row(cid, "smoking", "%", pct, level)]
        rows += [row(cid, "smoking", "missing n", 0.0), row(cid, "smoking", "missing %", 0.0)]
    # Per-site composition; site B's cluster 0 cell is suppressed, cluster 1's unavailable.
    for site, (n0, n1) in {"A": (78.0, 70.0), "B": ("<2", "")}.items():
        rows += [row("0", "site", "n", n0, site), row("1", "site", "n", n1, site)]
    return rows


def test_table1_layout_orders_by_size_and_formats_cells():
    md = table1.table1_markdown(profile_rows(), META)
    header = md.splitlines()[0]
    assert header.index("Cluster 1 (n = 120)") < header.index("Cluster 0 (n = 79)") < header.index("All (n = 199)")
    glucose = next(line for line in md.splitlines() if line.startswith("| glucose (mmol/L), mean (SD)"))
    # columns: cluster 1, cluster 0, all
    assert [c.strip() for c in glucose.split("|")[2:5]] == ["5.10 (0.900)", "7.81 (1.23)", "6.20 (1.60)"]
    assert "7.50 [6.90, 8.60]" in md
    missing = next(line for line in md.splitlines() if "missing, n (%)" in line and "0 (0.0)" in line)
    assert "3 (3.8)" in missing
    former = next(line for line in md.splitlines() if "former" in line)
    assert [c.strip() for c in former.split("|")[2:5]] == ["0 (0.0)", "<2", "1 (0.5)"]
    site_b = next(line for line in md.splitlines() if line.startswith("| \u2003B"))
    assert [c.strip() for c in site_b.split("|")[2:4]] == ["-", "<2"]
    assert ("Small cells (p = 2): a count of 1 row reads <2; \"suppressed\": a count "
            "withheld so that no <2 cell can be worked out from the counts shown and the "
            "published margins") in md
    assert "Synthetic test profile." in md
    # smoking has no missing cells: no missing row under it
    lines = md.splitlines()
    after = lines[lines.index(former) + 1]
    assert "missing" not in after


def test_table1_shows_the_small_cell_markers_and_intervals():
    """The rule's markers as the reader sees them: ``<p`` and ``suppressed`` counts
    without a %, a withheld n's mean cell saying why, a % known only as a range, and a
    cluster a site withheld rows of: its size and counts as intervals, "shown" in its
    heading and a note saying what that means."""
    rows = profile_rows()
    for r in rows:
        if r["variable"] == "glucose" and r["cluster"] == "0" and r["statistic"] in (
                "mean", "sd", "median", "q1", "q3"):
            r["statistic"] = "dropped"
        if (r["cluster"], r["variable"], r["level"], r["statistic"]) == ("1", "smoking", "current", "n"):
            r["value"] = "suppressed"
        if (r["cluster"], r["variable"], r["level"], r["statistic"]) == ("1", "smoking", "never", "%"):
            r["value"] = "31.2-35.0"
    rows = [r for r in rows if r["statistic"] != "dropped"]
    rows += [row("0", "glucose", "n", "<2"), row("1", "size", "rows shown", 118.0)]
    for r in rows:
        if (r["cluster"], r["variable"], r["statistic"]) == ("1", "size", "n"):
            r["value"] = "118-121"
    md = table1.table1_markdown(rows, {**META, "floor": 10})
    lines = md.splitlines()
    assert lines[0].split("|")[2].strip() == "Cluster 1 (n = 118-121; 118 shown)"
    glucose = next(line for line in lines if line.startswith("| glucose (mmol/L), mean (SD)"))
    assert [c.strip() for c in glucose.split("|")[2:4]] == ["5.10 (0.900)", "n <2"]
    current = next(line for line in lines if "current" in line)
    assert current.split("|")[2].strip() == "suppressed"
    never = next(line for line in lines if "never" in line)
    assert never.split("|")[2].strip() == "40 (31.2-35.0)"
    assert 'a count of 1 to 9 rows reads <10; "suppressed"' in md
    assert 'A cluster with "shown" in its heading: a site withheld its rows of it' in md
    assert table1.cluster_order(rows) == ["1", "0"]  # (an interval by its lower end)


def test_table1_html_is_an_escaped_fragment():
    rows = profile_rows() + [row("all", "ward<script>", "mean", 1.0)]
    fragment = table1.table1_html(rows, {**META, "notes": ["a & b"]})
    assert fragment.startswith('<table class="table1">') and "<html" not in fragment
    assert "<script>" not in fragment and "ward&lt;script&gt;" in fragment
    assert "a &amp; b" in fragment and "&lt;2" in fragment
    heads = re.findall(r'<th scope="col">([^<]*)</th>', fragment)
    assert heads == ["Characteristic", "Cluster 1 (n = 120)", "Cluster 0 (n = 79)", "All (n = 199)"]


def test_format_number_rules():
    assert [table1_cells.format_number(v) for v in (123.456, 45.67, 5.432, 0.01234, "<3", "", float("nan"))] \
        == ["123", "45.7", "5.43", "0.0123", "<3", "-", "-"]


def test_csv_round_trip(tmp_path):
    rows = profile_rows()
    paths = table1.write_table1(rows, META, tmp_path)
    assert [p.name for p in paths] == ["table1.csv", "table1.md", "table1.html"]
    with open(paths[0], newline="") as fh:
        assert next(csv.reader(fh)) == ["cluster", "variable", "level", "unit", "statistic", "value"]
    back = table1.read_table1(paths[0])
    assert back == [{**r, "value": r["value"] if isinstance(r["value"], str) else float(r["value"])}
                    for r in rows]
    assert {type(r["value"]) for r in back} == {float, str}
    assert paths[1].read_text() == table1.table1_markdown(back, META)


def test_bad_rows_and_files_are_named(tmp_path):
    with pytest.raises(ValueError, match="no key 'statistic'"):
        table1.table1_markdown([{"cluster": "0", "variable": "size", "level": "", "unit": "", "value": 1}], META)
    (tmp_path / "x.csv").write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="not a table1.csv"):
        table1.read_table1(tmp_path / "x.csv")


def test_profile_matrix_and_plots(tmp_path):
    rows = profile_rows()
    clusters, labels, Z, text = profile_matrix(rows)
    assert clusters == ["1", "0"]
    assert labels == ["glucose (mmol/L)", "smoking: never", "smoking: current", "smoking: former"]
    assert Z[0] == pytest.approx([(5.1 - 6.2) / 1.6, (7.812 - 6.2) / 1.6])
    assert np.isnan(Z[3, 1])  # suppressed: blank
    # issue 56: every cell prints the figure it is coloured by (a level: and its pp below)
    cells = np.array(text, dtype=object).reshape(Z.shape)
    for (i, j), z in np.ndenumerate(Z):
        if np.isnan(z):
            assert cells[i, j] == ""
            continue
        assert float(cells[i, j].split("\n")[0]) == pytest.approx(z, abs=0.05)
        assert cells[i, j].endswith(" pp") == (i > 0)
    assert plot_profile(rows, tmp_path / "p.png").read_bytes().startswith(PNG)
    # issue 70: a variable with one value in every row reads "constant", not withheld
    flat = [dict(r, variable="pixel", unit="", level="",
                 value=0 if r["statistic"] in ("mean", "sd") else r["value"])
            for r in rows if r["variable"] == "glucose"]
    _, flat_labels, flat_Z, flat_text = profile_matrix(flat + rows)
    row = flat_labels.index("pixel")
    assert flat_text[row * len(clusters):(row + 1) * len(clusters)] == ["constant"] * len(clusters)
    assert np.isnan(flat_Z[row]).all()
    assert "" in flat_text  # the suppressed cell stays n/a
    assert plot_sites(rows, tmp_path / "s.png").stat().st_size > 5000
    secure = [r for r in rows if r["variable"] != "site"]
    assert plot_sites(secure, tmp_path / "none.png") is None and not (tmp_path / "none.png").exists()


def make_run(tmp_path, with_table=True):
    schema = parse_schema(tomllib.loads(clinical_schema_toml()), "clinical")
    names = schema.feature_names()
    model = Model(
        centroids=np.arange(2 * len(names), dtype=float).reshape(2, len(names)),
        algorithm="fedkmeans", feature_names=names, schema=schema,
        config={"n-clusters": 2, "min-cluster-size": 2, "schema": "clinical.toml"},
        metrics={"score": 1.25, "n-rows": 199, "n-sites": 2, "rounds": 3,
                 "rejected-sites": {"7": "schema hash <differs>"},
                 "site-failures": {"3": ["timeout in round 2"]},
                 "sites-answering-from-rows": []})
    run = tmp_path / "run"
    run.mkdir()
    model.save(run / "model.json")
    with open(run / "history.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=["round", "repetition", "task", "sites-answered"])
        writer.writeheader()
        for i, task in enumerate(["describe+stats", "lloyd", "profile", "mystery-task"]):
            writer.writerow({"round": i + 1, "repetition": 0, "task": task, "sites-answered": 2})
    if with_table:
        table1.write_table1(profile_rows(), META, run)
    (run / "convergence.png").write_bytes(PNG + b"\0" * 64)
    return run, schema


def assert_offline(text):
    for bad in ('src="http', "src='http", 'href="http', "href='http", "<script", "@import",
                "url(http", "<link"):
        assert bad not in text.lower(), bad


def test_report_is_one_self_contained_page(tmp_path):
    run, schema = make_run(tmp_path)
    path = write_report(run)
    assert path == run / "report.html"
    text = path.read_text()
    assert_offline(text)
    assert '<table class="table1">' in text and "7.81 (1.23)" in text and "&lt;2" in text
    images = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', text)
    assert len(images) == 3  # profile and sites drawn from table1.csv, convergence inlined
    assert all(base64.b64decode(i).startswith(PNG) for i in images)
    assert schema_hash(schema) in text and "clinical.toml" in text and "fedkmeans" in text
    assert "schema hash &lt;differs&gt;" in text and "timeout in round 2" in text
    assert TASKS["describe"].sends.split(";")[0] in text and "unknown task" in text
    # a describe that carried the run's first task: both sentences
    assert esc(TASKS["describe"].sends + "; and in the same message: " + TASKS["stats"].sends) in text
    assert esc(TASKS["profile"].sends) in text
    assert sorted(p.name for p in run.iterdir()) == [
        "convergence.png", "history.csv", "model.json", "report.html", "table1.csv",
        "table1.html", "table1.md"]  # the pictures were drawn elsewhere


def test_label_metrics_are_marked_as_needing_labels(tmp_path):
    """Issue 56: ARI, NMI, accuracy and the like measure agreement with labels a hospital
    rarely has; report.html puts them apart under that heading and the summary marks each."""
    from fedcluster.server_app.outputs import summary_table
    from fedcluster.strategies.metrics import LABEL_NOTE

    run, _ = make_run(tmp_path, with_table=False)
    model = Model.load(run / "model.json")
    model.metrics.update({"ari": 0.75, "accuracy": 0.9, "davies-bouldin": 1.5})
    model.save(run / "model.json")
    text = write_report(run).read_text()
    general, labelled = text.split("<h3>Against known labels</h3>")
    assert "davies-bouldin" in general and "ari" not in general.split("<h2>Metrics</h2>")[1]
    assert "ari" in labelled.split("<h2>")[0] and "accuracy" in labelled.split("<h2>")[0]
    assert esc(LABEL_NOTE) in labelled
    summary = summary_table(model.metrics).splitlines()
    assert any(line.startswith("  ari (needs labels)") for line in summary)
    assert any(line.startswith("  davies-bouldin ") for line in summary)
    assert f"  (needs labels: {LABEL_NOTE})" in summary
    model.metrics.pop("ari"), model.metrics.pop("accuracy")
    assert not any("needs labels" in line for line in summary_table(model.metrics).splitlines())


def test_report_without_profile_says_so(tmp_path):
    run, _ = make_run(tmp_path, with_table=False)
    text = write_report(run).read_text()
    assert "no cluster profile" in text and 'class="table1"' not in text
    assert len(re.findall(r'src="data:image/png', text)) == 1


def test_cli_report(tmp_path, capsys):
    run, _ = make_run(tmp_path)
    assert cli.main(["report", str(run)]) == 0
    assert capsys.readouterr().out.strip() == str(run / "report.html")
    assert (run / "report.html").is_file()
    assert cli.main(["report", str(tmp_path / "nowhere")]) == 2
    assert f"{tmp_path / 'nowhere'}: no such run directory" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert cli.main(["report", str(tmp_path / "empty")]) == 2
    assert str(tmp_path / "empty" / "model.json") in capsys.readouterr().err


class _Dom(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags, self.urls = [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        self.urls += [v for k, v in attrs if k in ("src", "href") and v]


BROWSER = shutil.which("chromium-headless-shell") or shutil.which("chromium")


def test_report_renders_in_a_headless_browser_offline(tmp_path):
    # Not skipped when absent: .ci/run installs Debian's chromium-headless-shell.
    assert BROWSER is not None, ("no chromium-headless-shell or chromium: install Debian's "
                                 "chromium-headless-shell (.ci/run does)")
    run, _ = make_run(tmp_path)
    report = write_report(run)
    # Every host name resolves to nothing: a page that fetched anything would fail to.
    base = [BROWSER, "--no-sandbox", "--headless", "--disable-gpu",
            '--host-resolver-rules=MAP * ~NOTFOUND']
    dom = subprocess.run(base + ["--dump-dom", report.as_uri()], capture_output=True,
                         text=True, timeout=60, check=True).stdout
    parsed = _Dom()
    parsed.feed(dom)
    assert any(t == "table" and a.get("class") == "table1" for t, a in parsed.tags)
    assert sum(t == "img" for t, _ in parsed.tags) == 3
    assert parsed.urls and all(u.startswith("data:image/png;base64,") for u in parsed.urls)
    shot = tmp_path / "shot.png"
    subprocess.run(base + [f"--screenshot={shot}", "--window-size=1200,2000", report.as_uri()],
                   capture_output=True, timeout=60, check=True)
    assert shot.read_bytes().startswith(PNG) and shot.stat().st_size > 10_000


def test_table1_at_k_10_fits_a_1200_pixel_window_in_a_headless_browser(tmp_path):
    """Issue 56: report.html with Table 1 at k = 10 (digits, 12 columns) reads without
    sideways scrolling in a 1200-pixel window (it was 1351 pixels wide): measured in the
    browser by a copy of the page that writes the document's width into its title (the
    report itself holds no script)."""
    assert BROWSER is not None, "no chromium-headless-shell or chromium (.ci/run installs it)"
    assert cli.main(["simulate", "--dataset", "digits", "--num-sites", "3", "--n-clusters", "10",
                     "--num-rounds", "3", "--output-dir", str(tmp_path), "--run-name", "k10"]) == 0
    page = (tmp_path / "k10" / "report.html").read_text()
    assert page.count('<th scope="col"') >= 12 or page.count("Cluster ") >= 10
    probe = tmp_path / "probe.html"
    probe.write_text(page.replace("</body>", "<script>document.title = "
                                  "document.documentElement.scrollWidth + ' ' + "
                                  "window.innerWidth;</script></body>"))
    dom = subprocess.run([BROWSER, "--no-sandbox", "--headless", "--disable-gpu",
                          "--window-size=1200,2000", "--dump-dom", probe.as_uri()],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    width, window = map(int, re.search(r"<title>(\d+) (\d+)</title>", dom).groups())
    assert window == 1200 and width <= window, (width, window)

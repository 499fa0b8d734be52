"""The benchmark scripts keep working: each runs at its smallest size and writes its
section of BENCHMARKS.md (the figures themselves belong to bench/, not to tests)."""

import sys
from pathlib import Path

import numpy as np

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

import choose_k_s1  # noqa: E402
import ffcm_paper  # noqa: E402
import report  # noqa: E402


def test_write_section_replaces_its_own_section_only(tmp_path):
    path = tmp_path / "BENCHMARKS.md"
    report.write_section("a", "first A", path)
    report.write_section("b", "only B", path)
    report.write_section("a", "second A", path)
    text = path.read_text()
    assert "second A" in text and "first A" not in text and "only B" in text
    assert text.count("<!-- a -->") == 1 and text.index("<!-- a -->") < text.index("<!-- b -->")


def test_a_section_is_written_only_when_a_file_is_named(tmp_path, monkeypatch, capsys):
    # without --out a script prints its section: a partial run must not replace the
    # table of record in the repository's BENCHMARKS.md
    monkeypatch.setattr(report, "ROOT", tmp_path)
    assert report.write_section("a", "the table", None) is None
    assert "the table" in capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []


def test_ffcm_paper_writes_its_table(tmp_path):
    out = tmp_path / "BENCHMARKS.md"
    ffcm_paper.main(["--seeds", "1", "--cases", "1", "--out", str(out)])
    text = out.read_text()
    assert "### Case 1 (Table 2)" in text
    row = next(line for line in text.splitlines() if line.startswith("| 3 clients"))
    assert len(row.strip("|").split("|")) == 18  # setting, 3 methods x 5, 2 round counts
    assert "(0.3588)" in row and "(3.7041)" in row  # the paper's numbers beside ours
    assert "Made by `python" in text and "cores" in text


def test_choose_k_s1_writes_its_table(tmp_path):
    out = tmp_path / "BENCHMARKS.md"
    choose_k_s1.main(["--data", str(Path(__file__).resolve().parent / "data" / "sipu"), "--k-range", "13:16", "--splits", "iid", "--modes", "warm", "--out", str(out),
                      "--plot", str(tmp_path / "ck.png")])
    text = out.read_text()
    assert "## Choosing k on SIPU s1" in text
    row = next(line for line in text.splitlines() if line.startswith("| iid | warm"))
    assert row.split("|")[3].strip().endswith("/ 15 / 15 / 15")  # picks, k = 13..16
    assert (tmp_path / "ck.png").stat().st_size > 10_000


def test_quality_writes_its_tables_with_the_dp_runs_against_the_oracle(tmp_path, monkeypatch):
    import quality

    out = tmp_path / "BENCHMARKS.md"
    monkeypatch.setattr(sys, "argv", ["bench/quality.py", "--sets", "iris", "--splits", "iid",
                                      "--modes", "plain", "dp10", "dp10-oracle", "--out", str(out)])
    quality.main()
    text = out.read_text()
    assert "## Quality at defaults (quality)" in text
    rows = [line for line in text.splitlines() if line.startswith("| dwf | dp10 | 2 | 2 | iid |")]
    assert len(rows) == 3  # against central, against the plain run, against the oracle
    assert "against the `dp10-oracle` run" in text
    oracle = rows[2].split("|")
    assert oracle[6].strip() == oracle[8].strip().split()[0]  # one set: median = worst


def test_quality_keeps_apart_the_federations_whose_optimum_needs_no_value_under_p(
        tmp_path, monkeypatch):
    import quality

    out = tmp_path / "BENCHMARKS.md"
    monkeypatch.setattr(sys, "argv", ["bench/quality.py", "--sets", "iris", "--splits", "iid",
                                      "--modes", "plain", "--site-floors", "2", "5",
                                      "--out", str(out)])
    quality.main()
    text = out.read_text()
    # iris IID: a site holds 3 rows of a cluster of central's optimum, fewer than 5, none under 2
    assert "federations: p_site 2 iid: 1; p_site 5 iid: 0)" in text
    lines = text.splitlines()
    assert sum(line.startswith("| dwf | plain | 2 | 2 | iid |") for line in lines) == 2
    assert sum(line.startswith("| dwf | plain | 2 | 5 | iid |") for line in lines) == 1


def test_grouping_quality_probes_rows_left_out(tmp_path, monkeypatch):
    import grouping

    site = np.array([[0.0, 0.0], [0.1, 0.0], [0.0, 0.1], [0.1, 0.1], [5.0, 5.0], [9.0, 0.0]])
    labels = np.array([0, 0, 0, 0, 1, 2])
    assert grouping._left_out(site, labels, "none").tolist() == [False] * 6
    assert grouping._left_out(site, labels, "lone-by-label").tolist() == [False] * 4 + [True] * 2
    # the two far rows: their nearest neighbours 6-7 away, 60-70 x the median 0.1
    assert grouping._left_out(site, labels, "far:8").tolist() == [False] * 4 + [True] * 2

    out = tmp_path / "BENCHMARKS.md"
    monkeypatch.setattr(sys, "argv", ["bench/grouping.py", "--quality", "--sets", "iris",
                                      "--splits", "iid", "skew", "--min-size", "2",
                                      "--leave-out", "none", "lone-by-label",
                                      "--section", "grouping-lone-rows", "--out", str(out)])
    grouping.main()
    text = out.read_text()
    assert "## Site groups: rows alone at their site, grouped or left out" in text
    summaries = [line for line in text.splitlines() if line.startswith("- g = 2")]
    assert len(summaries) == 4  # 2 rules x 2 splits
    assert all("over 1 runs" in line for line in summaries)
    assert any(line.startswith("- g = 2, lone-by-label left out, skew:") for line in summaries)


def test_group_floor_pools_every_sites_groups_and_writes_its_table(tmp_path, monkeypatch):
    import group_floor
    import quality

    X, y = quality.load("iris", report.SHARED_DATA)
    sites = quality.split_sites(X, y, "iid", 0)
    means, counts, variances = group_floor.pooled_groups(sites, 5)
    assert counts.sum() == len(X) and counts.min() >= 5
    np.testing.assert_allclose((counts[:, None] * means).sum(0), X.sum(0), atol=1e-9)
    # the groups' scatter adds up with the means' to the rows' own (nothing lost)
    total = (counts[:, None] * (variances + means ** 2)).sum(0)
    np.testing.assert_allclose(total, (X ** 2).sum(0), rtol=1e-9)

    out = tmp_path / "BENCHMARKS.md"
    monkeypatch.setattr(sys, "argv", ["bench/group_floor.py", "--sets", "iris",
                                      "--site-floors", "2", "5", "--out", str(out)])
    group_floor.main()
    text = out.read_text()
    assert "## What the groups allow (quality-group-floor)" in text
    rows = [line for line in text.splitlines() if line.startswith(("| 2 |", "| 5 |"))]
    assert len(rows) == 4 and all(line.count("(iris)") == 4 for line in rows)
    # under p: site 0 holds 2 and 1 rows of the clusters, site 1 holds 1 and 4 (p = 3)
    labels = np.array([0, 0, 0, 1, 1, 1, 1, 1])
    assert quality.under_p(labels, [np.array([0, 1, 3]), np.array([2, 4, 5, 6, 7])], 3) == 0.5

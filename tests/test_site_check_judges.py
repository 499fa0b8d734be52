"""`fedcluster site check` judges what the run judges (issue 70): the site's own policy
(`min-site-rows`, `allow-algorithms`, `require-dp`) with the message the site's ClientApp
gives a run, a node-config value Flower cannot read named by its key, and the same
missing tokens with and without a schema (a token a schema does not list named with the
key that would accept it)."""

from __future__ import annotations

import numpy as np
import pytest

from fedcluster.cli import main
from fedcluster.simulation import run_in_process


def _csv(path, rows: int, seed: int = 0, cell: str | None = None):
    X = np.random.default_rng(seed).normal(size=(rows, 2))
    lines = ["a,b", *(f"{float(x)!r},{float(y)!r}" for x, y in X)]
    if cell is not None:
        lines[3] = lines[3].split(",")[0] + "," + cell
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDCLUSTER_CACHE_DIR", str(tmp_path / "cache"))


def test_a_file_too_small_for_the_site_policy_fails_the_check_as_it_fails_the_run(tmp_path, capsys):
    small = _csv(tmp_path / "small.csv", 3)
    code = main(["site", "check", "--node-config", f'data-path="{small}"', "--no-cost-table"])
    printed = capsys.readouterr()
    assert code == 1, printed
    said = "site policy min-site-rows=10: this site holds 3 rows and takes part only with at least 10"
    assert said in printed.err and "Site policy: REFUSED" in printed.out
    # the run refuses it with the same words
    big = _csv(tmp_path / "big.csv", 40, seed=1)
    result = run_in_process(
        [{"data-path": str(big), "site-id": "0"}, {"data-path": str(small), "site-id": "1"}],
        {"n-clusters": 2, "num-rounds": 1, "min-sites": 1, "every-site": False, "profile": False,
         "output-dir": ""})
    assert said in result.metrics["rejected-sites"]["1"]
    # the same file passes where the site's policy lets it take part
    assert main(["site", "check", "--node-config", f'data-path="{small}" min-site-rows=3',
                 "--no-cost-table"]) == 0
    assert "Site policy: min-site-rows=3: 3 row(s) in groups, the site takes part" in capsys.readouterr().out


def test_the_run_config_is_judged_by_the_site_s_policy(tmp_path, capsys):
    data = _csv(tmp_path / "site.csv", 30)
    node = f'data-path="{data}" allow-algorithms="fkm"'
    assert main(["site", "check", "--node-config", node, "--run-config", 'algorithm="dwf"',
                 "--no-cost-table"]) == 1
    assert "allow-algorithms=fkm refuses algorithm 'dwf'" in capsys.readouterr().err
    assert main(["site", "check", "--node-config", node, "--run-config",
                 'algorithm="fkm" min-cluster-size=4', "--no-cost-table"]) == 0
    assert ("every reply held to p = 4 (the larger of the run's min-cluster-size 4 and this "
            "site's 2)") in capsys.readouterr().out
    assert main(["site", "check", "--node-config", f'data-path="{data}" require-dp=true',
                 "--run-config", 'n-clusters=3', "--no-cost-table"]) == 1
    assert "require-dp=true: the run is not differentially private" in capsys.readouterr().err
    assert main(["site", "check", "--node-config", f'data-path="{data}"', "--run-config",
                 "n-clusters=0"]) == 2
    assert "'n-clusters'" in capsys.readouterr().err


def test_a_node_config_value_flower_cannot_read_is_named_by_its_key(tmp_path, capsys):
    data = _csv(tmp_path / "site.csv", 30)
    assert main(["site", "check", "--node-config", f'data-path="{data}" min-cluster-size=five']) == 2
    err = capsys.readouterr().err
    assert "--node-config key 'min-cluster-size': 'five' is not a value Flower reads" in err, err


def test_the_same_missing_tokens_with_and_without_a_schema(tmp_path, capsys):
    na = _csv(tmp_path / "na.csv", 30, cell="NA")
    assert main(["site", "check", "--node-config", f'data-path="{na}"', "--no-cost-table"]) == 2
    err = capsys.readouterr().err
    assert "column 'b': 'NA' is a missing cell (run config 'missing' is \"error\"" in err, err
    # a run that fills missing cells reads the same file (no other reading)
    result = run_in_process([{"data-path": str(na), "site-id": "0"}],
                            {"n-clusters": 2, "num-rounds": 1, "min-sites": 1, "profile": False,
                             "missing": "impute-mean", "output-dir": ""})
    assert result.metrics["n-rows"] == 30
    # a text no token list holds: named with the key that would read it as missing
    odd = _csv(tmp_path / "odd.csv", 30, cell="?")
    assert main(["site", "check", "--node-config", f'data-path="{odd}"', "--no-cost-table"]) == 2
    assert "lists it in 'missing-tokens'" in capsys.readouterr().err
    schema = tmp_path / "schema.toml"
    schema.write_text('[[columns]]\nname = "a"\ntype = "numeric"\n\n'
                      '[[columns]]\nname = "b"\ntype = "numeric"\nmissing = "impute-mean"\n')
    assert main(["site", "check", str(odd), "--schema", str(schema), "--no-cost-table"]) == 2
    err = capsys.readouterr().err
    assert "'?' is not a number (if it marks a missing cell, list it in the schema's " \
           "'missing-tokens'" in err, err
    assert main(["site", "check", str(na), "--schema", str(schema), "--no-cost-table"]) == 0
    assert "b | b | 1 (3.3%) | impute-mean" in capsys.readouterr().out

"""`fedcluster predict` end to end (a site labels its own rows), and its error cases."""

import subprocess
import sys

import numpy as np
import pytest

import fedcluster
from fedcluster.cli import main


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cli")
    rng = np.random.default_rng(0)
    X = np.vstack([rng.normal(0, 1, (80, 2)), rng.normal(9, 1, (80, 2))])
    sites = [tmp / "s0.csv", tmp / "s1.csv"]
    for path, rows in zip(sites, (X[::2], X[1::2])):
        np.savetxt(path, rows, delimiter=",", header="age,dose", comments="", fmt="%.17g")
    assert main(["simulate", "--data", str(sites[0]), str(sites[1]), "--n-clusters", "2",
                 "--output-dir", str(tmp / "out"), "--run-name", "r"]) == 0
    return tmp, X, fedcluster.Model.load(tmp / "out" / "r" / "model.json")


def test_predict_labels_a_csv(trained):
    tmp, X, model = trained
    out = tmp / "labels.csv"
    result = subprocess.run([sys.executable, "-m", "fedcluster.cli", "predict", "--model",
                             str(tmp / "out" / "r" / "model.json"), "--data", str(tmp / "s0.csv"),
                             "--out", str(out)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    rows, labels = np.loadtxt(out, delimiter=",", skiprows=1, dtype=int, unpack=True)
    np.testing.assert_array_equal(labels, model.predict(X[::2]))
    # issue 70: each label with its data row (1-based, as the errors count rows)
    assert out.read_text().splitlines()[0] == "row,cluster"
    np.testing.assert_array_equal(rows, np.arange(1, len(X[::2]) + 1))


@pytest.mark.parametrize(
    "content, message",
    [
        ("age,dose,weight\n1,2,3\n", "has 3 feature columns, the model expects 2"),
        ("age,height\n1,2\n", "header ['age', 'height'] differs from the model's features ['age', 'dose']"),
        ("age,dose\n1,x\n", "column 'dose': 'x' is not a number"),
        (None, "does not exist"),
    ],
)
def test_predict_errors_name_the_problem(trained, tmp_path, capsys, content, message):
    tmp, _, _ = trained
    data = tmp_path / "bad.csv"
    if content is not None:
        data.write_text(content)
    code = main(["predict", "--model", str(tmp / "out" / "r" / "model.json"), "--data", str(data),
                 "--out", str(tmp_path / "never.csv")])
    assert code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "never.csv").exists()


def test_predict_rejects_a_bad_model_file(trained, capsys):
    tmp, _, _ = trained
    (tmp / "junk.json").write_text("{not json")
    assert main(["predict", "--model", str(tmp / "junk.json"), "--data", str(tmp / "s0.csv"),
                 "--out", str(tmp / "never.csv")]) == 2
    assert f"{tmp / 'junk.json'}: not a fedcluster model (Expecting property name" in \
        capsys.readouterr().err
    (tmp / "old.json").write_text('{"algorithm": "dwf"}')
    assert main(["predict", "--model", str(tmp / "old.json"), "--data", str(tmp / "s0.csv"),
                 "--out", str(tmp / "never.csv")]) == 2
    assert "old.json: not a fedcluster model (no key 'centroids')" in capsys.readouterr().err
    assert main(["predict", "--model", str(tmp / "nowhere.json"), "--data", str(tmp / "s0.csv"),
                 "--out", str(tmp / "never.csv")]) == 2
    assert "nowhere.json: cannot read the model (No such file or directory)" in \
        capsys.readouterr().err


def test_run_writes_a_non_trivial_convergence_png(trained):
    import matplotlib.image as mpimg

    tmp, _, _ = trained
    png = tmp / "out" / "r" / "convergence.png"
    image = mpimg.imread(png)
    assert image.shape[0] > 300 and image.shape[1] > 900  # three panels
    assert len(np.unique(image.reshape(-1, image.shape[-1]), axis=0)) > 50  # not blank
    history = (tmp / "out" / "r" / "history.csv").read_text().splitlines()
    assert history[0].startswith("round,repetition,task")
    # describe with the init, >= 2 training rounds (the last moved nothing, so it carried
    # the evaluation, whose distances spared Davies-Bouldin's pass)
    assert len(history) >= 4


def test_convergence_numbers_rounds_as_history_csv_and_shows_no_movement_at_0(trained):
    """Issue 56: convergence.png's x axis is history.csv's round, and a round that moved
    nothing is plotted at 0 (a log axis floored it at 1e-12 of the largest before)."""
    import csv

    import matplotlib.pyplot as plt

    from fedcluster.server_app.convergence_plot import convergence_figure

    tmp, _, _ = trained
    run = tmp / "out" / "r"
    with open(run / "history.csv", newline="") as fh:
        rows = [r for r in csv.DictReader(fh) if r["movement"] not in ("", None)
                and r["task"] not in ("evaluate", "evaluate_distances")]
    model = fedcluster.Model.load(run / "model.json")
    last = [r for r in model.history if "movement" in r
            and r["task"] not in ("evaluate", "evaluate_distances")][-1]
    assert abs(last["movement"]) < 1e-9  # converged (here: rounding noise); say 0 exactly
    last["movement"] = 0.0
    fig = convergence_figure(model)
    try:
        (move,) = fig.axes[1].get_lines()
        assert list(move.get_xdata()) == [int(r["round"]) for r in rows]
        assert list(move.get_ydata())[:-1] == [float(r["movement"]) for r in rows][:-1]
        assert move.get_ydata()[-1] == 0.0
        assert fig.axes[1].get_yscale() == "symlog" and fig.axes[1].get_ylim()[0] == 0
        # linear below the least real movement: 0 sits on the axis, not at a log floor
        least = min((float(r["movement"]) for r in rows[:-1]), default=1.0)
        assert fig.axes[1].yaxis.get_transform().linthresh == least
        (score,) = fig.axes[0].get_lines()[:1]
        assert list(score.get_xdata()) == [int(r["round"]) for r in rows]
        # issue 70: whole rounds on both axes; the final score is a line the legend names
        fig.canvas.draw()
        for ax in fig.axes[:2]:
            assert all(float(t).is_integer() for t in ax.get_xticks())
        (final,) = [line for line in fig.axes[0].get_lines() if line.get_linestyle() == "--"]
        assert set(final.get_ydata()) == {model.metrics["score"]}
        assert final.get_label().startswith(f"final score {model.metrics['score']:.6g}")
    finally:
        plt.close(fig)


def test_a_run_that_cannot_go_on_ends_with_its_reason_not_a_traceback(tmp_path, capsys):
    """Every site refuses (an empty cell, no missing policy): exit 1 with the reason each
    site gave, where the run's FederationError used to escape as a traceback."""
    paths = []
    for i in range(2):
        paths.append(tmp_path / f"s{i}.csv")
        paths[-1].write_text("a,b\n1,2\n3,\n5,6\n")
    assert main(["simulate", "--data", *map(str, paths), "--n-clusters", "2",
                 "--output-dir", ""]) == 1
    err = capsys.readouterr().err
    assert "fedcluster: the run stopped: no site described its data" in err
    assert "s1.csv: data row 2 (line 3), column 'b': the cell is empty" in err
    assert "Traceback" not in err


def _commands(parser, path=()):
    """(path, parser) of every command and sub-command of ``fedcluster``."""
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield (*path, name), child
                yield from _commands(child, (*path, name))


def test_every_command_s_help_ends_with_an_example_that_parses_and_its_page():
    """Issue 70: `--help` with one example per command and a link to the page. Each
    example is a command line this parser takes (for that command) and each page link
    names a section of docs/reference/cli.md."""
    import re
    import shlex
    from pathlib import Path

    from fedcluster.cli import build_parser

    cli_page = Path(__file__).resolve().parents[1] / "docs" / "reference" / "cli.md"
    sections = {re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
                for line in cli_page.read_text().splitlines() if line.startswith("## ")}
    found = list(_commands(build_parser()))
    assert {" ".join(path) for path, _ in found} >= {"run", "simulate", "choose-k", "partition",
                                                     "predict", "site check", "report"}
    for path, command in found:
        text = command.format_help()
        examples = [line.strip() for line in text.splitlines()
                    if line.strip().startswith("fedcluster ")]
        assert examples, f"fedcluster {' '.join(path)} --help shows no example:\n{text}"
        for example in examples:
            words = shlex.split(example.rstrip("\\"))
            if example.endswith("\\"):  # a continued example: its first line's command only
                continue
            args = build_parser().parse_args(words[1:])
            assert args.command == words[1] == path[0], example
        (page,) = re.findall(r"Page: docs/reference/cli\.md#([\w-]+)", text)
        assert page in sections, (path, page, sorted(sections))

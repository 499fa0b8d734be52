"""A real deployment on loopback: one ``flower-superlink`` and one ``flower-supernode``
process per site, talking over the Fleet API (gRPC under Flower 1.39, HTTP under 1.40+),
each site reading its own CSV via its node config's ``data-path``. The first-deployment
tutorial runs as its page shows it (its fixed ports on a host of its own) and equals the
in-process run on the same files and node configs; a site with a broken file is
rejected with the file's problem while the others go on, a site that holds back rows
says so wherever a person looks, and a run that cannot go on ends failed; a run stopped mid-training
resumes from its checkpoint on the same federation; hospital tables cross through the
schema. Every test cleans up its processes, also when it fails (one test fails on
purpose mid-run and checks).

Deployment starts a fresh ClientApp process for every message, so the child processes
share one ``NUMBA_CACHE_DIR`` (compiled kernels, should a site need one: these sites are
small enough for the NumPy path) and the tests of this module one ``FLWR_HOME``: the
SuperLink and the SuperNodes install the app there (the tutorial's operator has its own).
"""

from __future__ import annotations

import csv
import json
import re
import shlex
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

import fedcluster
import flower_processes as fp
import netns
from fedcluster.common.datasets import load_builtin, partition

APP_DIR = Path(__file__).resolve().parents[1]
CONFIG = {"n-clusters": 8, "num-rounds": 2, "min-sites": 3, "seed": 1, **fp.NO_TABLE1}
RUN_TIMEOUT = 300.0


def py_kwargs(config: dict) -> dict:
    """Run-config keys as ``fedcluster.simulate`` takes them (``-`` written ``_``)."""
    return {key.replace("-", "_"): value for key, value in config.items()}


def write_site_csv(path: Path, X: np.ndarray) -> Path:
    header = ",".join(f"x{j}" for j in range(X.shape[1]))
    np.savetxt(path, X, delimiter=",", header=header, comments="", fmt="%.17g")
    return path


def read_history_csv(path: Path) -> list[dict]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


@pytest.fixture(scope="module")
def module_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("deployment")


@pytest.fixture(scope="module")
def digits_sites(module_dir) -> tuple[list[np.ndarray], list[Path]]:
    """digits cut iid into 3 sites: the arrays, and one CSV per site."""
    X, y = load_builtin("digits")
    arrays = [X[rows] for rows in partition(y, 3, "iid", seed=0)]
    data = module_dir / "data"
    data.mkdir()
    paths = [write_site_csv(data / f"site-{i}.csv", Xi) for i, Xi in enumerate(arrays)]
    for Xi, path in zip(arrays, paths):  # the CSVs round-trip exactly
        back = np.loadtxt(path, delimiter=",", skiprows=1, ndmin=2)
        assert np.array_equal(back, Xi)
    return arrays, paths


@pytest.fixture()
def sandbox(tmp_path, numba_cache):
    """A sandbox for this test's processes: session FLWR_HOME and Numba cache, the
    sites' parsed-data cache in this test's tmp dir."""
    def make():
        return fp.sandbox(
            tmp_path,
            NUMBA_CACHE_DIR=numba_cache,
            FEDCLUSTER_CACHE_DIR=tmp_path / "site-cache",
        )

    return make


def start_federation(bed: fp.FlowerSandbox, connection: str, sites: dict[str, Path],
                     policy: dict | None = None) -> fp.SuperLink:
    """SuperLink (gRPC Fleet API) + one SuperNode per ``site-id -> data file``, each with
    the node-config keys of ``policy``."""
    link = bed.superlink(simulation=False)
    bed.supernodes(
        link,
        {
            f"supernode-{site_id}": {"data-path": str(path), "site-id": site_id, **(policy or {})}
            for site_id, path in sites.items()
        },
    )
    bed.connect(connection, link.control_address)
    return link


TUTORIAL = APP_DIR / "docs" / "tutorials" / "first-deployment.md"


def tutorial_steps() -> tuple[str, list[str], str, str]:
    """The first-deployment tutorial's steps, as its page shows them: the command that
    makes the sites' files, the SuperLink's and the SuperNodes' command lines, the
    ``flwr`` config and the ``flwr run`` line."""
    from test_docs import blocks, commands

    found = blocks(TUTORIAL)
    partition = next(line for b in found if b.language == "bash" and b.marker is None
                     for line in commands(b.code) if line.startswith("fedcluster partition"))
    servers, submit = (commands(b.code) for b in found if b.marker == ("run by", "tests/test_deployment.py"))
    config = next(b.code for b in found if b.language == "toml")
    assert len(submit) == 1, submit
    return partition, servers, config, submit[0]


@pytest.mark.skipif(netns.unavailable() is not None,
                    reason=f"the tutorial's fixed ports need a host of their own: {netns.unavailable()}")
def test_first_deployment_tutorial_as_written(sandbox, tmp_path):
    """The first-deployment tutorial, its commands as the page shows them (ports, paths,
    node configs, the ``flwr`` config, the run config), on a host of its own (a network
    namespace: its loopback and fixed ports are its own) under whichever Flower is
    installed: the SuperNodes find the SuperLink at Flower's default address (gRPC :9092
    under 1.39, HTTP :8000 under 1.40+). The run completes, every site answers every
    round, and its result equals the in-process run on the same files and node configs
    (centroids to 1e-9, Table 1 exactly)."""
    from flwr.common.config import parse_config_args

    from fedcluster.simulation import run_in_process

    partition, servers, config_toml, submit = tutorial_steps()
    work = tmp_path / "tutorial"
    work.mkdir()
    words = shlex.split(partition, comments=True)
    subprocess.run([str(Path(sys.executable).parent / words[0]), *words[1:]], cwd=work,
                   check=True, capture_output=True)
    home = tmp_path / "operator-flwr"
    home.mkdir()
    (home / "config.toml").write_text(config_toml + "\n")
    assert [shlex.split(line)[0] for line in servers] == ["flower-superlink"] + ["flower-supernode"] * 3
    submit_words = shlex.split(submit, comments=True)
    assert submit_words[:3] == ["fedcluster", "run", "."], submit
    connection = submit_words[3]
    with netns.lan(["machine"]) as net, sandbox() as bed:
        on_machine = net.exec_prefix("machine")
        operator = {**bed.env, "FLWR_HOME": str(home)}  # the flwr CLI's ~/.flwr
        started = []
        for i, line in enumerate(servers):
            name = "superlink" if i == 0 else f"supernode-{i - 1}"
            proc = bed.stack.enter_context(fp.flower_process(
                name, [*on_machine, *shlex.split(line, comments=True)], log_dir=bed.log_dir,
                env=bed.env, cwd=work, ready_log=fp.SUPEREXEC_STARTED if i == 0 else fp.SUPERNODE_ID,
                wait=i == 0, startup_timeout=90))
            bed.processes.append(proc)
            started.append(proc)
        for proc in started[1:]:
            proc.wait_ready()
        # "submit the app from the repository root": `fedcluster run` exits 0 once the
        # run has completed
        done = subprocess.run([*on_machine, str(Path(sys.executable).parent / "fedcluster"),
                               *submit_words[1:]], cwd=APP_DIR, env=operator,
                              capture_output=True, text=True, timeout=RUN_TIMEOUT)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr
        run_id = re.search(r"fedcluster: run (\d+) submitted", done.stderr).group(1)
        # the status as the page says a script reads it
        rc, listed = fp._flwr(["ls", connection, "--run-id", run_id, "--format", "json"],
                              operator, work, 60, prefix=on_machine)
        assert rc == 0, listed
    assert not fp.find_processes(tag=bed.tag, patterns=bed.patterns), "processes left behind"
    runs = json.loads(listed[listed.index("{"):])["runs"]
    assert [run["status"] for run in runs] == ["finished:completed"], runs

    outputs = list((work / "outputs").glob("*/model.json"))  # the coordinator's cwd
    assert len(outputs) == 1, outputs
    model = fedcluster.Model.load(outputs[0])
    node_configs = [parse_config_args([shlex.split(line)[shlex.split(line).index("--node-config") + 1]])
                    for line in servers[1:]]
    nodes = [{**cfg, "data-path": str(work / cfg["data-path"]),
              "cache-dir": str(tmp_path / "harness" / cfg["cache-dir"])} for cfg in node_configs]
    run_config = parse_config_args([submit_words[submit_words.index("--run-config") + 1]])
    harness = run_in_process(nodes, {**run_config, "output-dir": str(tmp_path / "harness-out")})
    np.testing.assert_allclose(model.centroids, harness.centroids, rtol=0, atol=1e-9)
    np.testing.assert_allclose(model.metrics["score"], harness.metrics["score"], rtol=1e-9)
    assert [h["task"] for h in model.history] == [h["task"] for h in harness.history]
    assert model.history[-1]["task"] == "profile"  # Table 1 crossed the real Fleet API
    ours, theirs = model.profile, harness.profile
    assert ours[["cluster", "variable", "level", "statistic"]].equals(
        theirs[["cluster", "variable", "level", "statistic"]])
    np.testing.assert_allclose(ours.value.astype(float), theirs.value.astype(float), rtol=1e-12)

    # the coordinator's side: all 3 sites answered every round, every row
    rows = read_history_csv(outputs[0].parent / "history.csv")
    assert len(rows) == len(model.history)
    assert [(int(r["sites-asked"]), int(r["sites-answered"]), int(r["sites-failed"]))
            for r in rows] == [(3, 3, 0)] * len(rows)
    assert model.metrics["n-sites"] == 3 and model.metrics["rejected-sites"] == {}
    assert model.metrics["n-rows"] == harness.metrics["n-rows"] == 1797
    assert model.feature_names == harness.model.feature_names
    assert "central-score" not in model.metrics  # nobody holds the pooled data
    # each site parsed its file into the cache-dir its node config names
    for cfg in node_configs:
        assert list((work / cfg["cache-dir"]).glob("*.json")), cfg


def hold_back_history(cache: Path, X: np.ndarray, other: np.ndarray, work: Path, p: int,
                      final: Path) -> None:
    """A site's answered history (kept in ``cache``, at ``min-cluster-size`` ``p``) in
    which its file ``final`` (the rows ``X``) holds back rows: earlier files of the same
    columns answered from the first half of its rows; the second half with rows of
    another site's; then those other rows alone, which regroups the parts of the groups
    they shared. The second half's rows then make groups of parts of earlier groups, and
    ``final``'s version is made here with the units of those parts grouped two at a time
    (``joining.lost_group_units``: the versions rule's own makes groups of max(p, 3) units
    or more, which the audit passes here: it held these rows back only while it gave up
    on 20,000+ combinations). Two units' group less their two former groups is the two
    rows they lost: the one audit finds that combination, fewer than ``p`` rows, and holds
    their rows back: what the site then says of them is what this test reads."""
    from unittest import mock

    from fedcluster.client_app.data import group_table
    from fedcluster.client_app.data.site_data import load_site_file
    from fedcluster.client_app.data.versions import next_version

    half = len(X) // 2
    for name, rows in (("a", X[:half]), ("b", np.vstack([X[half:], other])), ("c", other)):
        path = write_site_csv(work / f"earlier-{name}.csv", rows)
        group_table.site_groups(load_site_file(path, cache_dir=cache), p, cache)
    with mock.patch.object(next_version.joining, "lost_group_units", lambda min_size: (2,)):
        group_table.site_groups(load_site_file(final, cache_dir=cache), p, cache)


def test_broken_site_is_rejected_held_back_rows_are_named_and_a_failed_run_fails(
        sandbox, digits_sites, tmp_path):
    """Site 1's file is broken: it is rejected with the file's problem, the run goes on.
    Site 2 holds back rows (a crafted history, issue 55 must-show 2): the coordinator
    warns, the summary, model.json, history.csv and report.html give its held-back
    count, and report.html does not say every site answered from all its rows. Then a
    run that cannot go on (min-sites 3 of 2 usable sites) ends with Flower's status
    ``finished:failed`` and the reason, and ``flwr run --stream`` exits 0 (the CLI of
    Flower 1.39 to 1.42 does not read the status: the docs say so)."""
    import shutil

    from fedcluster.simulation import run_in_process

    arrays, paths = digits_sites
    broken = tmp_path / "site-1-broken.csv"
    lines = paths[1].read_text().splitlines()
    cells = lines[5].split(",")
    cells[3] = "n/a"  # data row 5, column x3
    lines[5] = ",".join(cells)
    broken.write_text("\n".join(lines) + "\n")
    crafted = tmp_path / "site-2-cache"
    hold_back_history(crafted, arrays[2], arrays[0][:300], tmp_path, p=5, final=paths[2])
    shutil.copytree(crafted, tmp_path / "harness-cache")  # the harness's site: the same history
    site_2 = {"data-path": str(paths[2]), "site-id": "2", "cache-dir": str(crafted),
              "min-cluster-size": 5}
    # init "random" (a min/max round, which the sites allow) and one training round keep
    # this run short
    config = {"n-clusters": 8, "num-rounds": 1, "min-sites": 2, "seed": 1, "init": "random",
              "every-site": False,
              **fp.NO_TABLE1}
    out = tmp_path / "outputs"
    with sandbox() as bed:
        link = bed.superlink(simulation=False)
        bed.supernodes(link, {"supernode-0": {"data-path": str(paths[0]), "site-id": "0"},
                              "supernode-1": {"data-path": str(broken), "site-id": "1"},
                              "supernode-2": site_2})
        bed.connect("dep-broken", link.control_address)
        done = bed.run(APP_DIR, "dep-broken", {**config, "output-dir": str(out),
                                               "run-name": "broken"}, timeout=RUN_TIMEOUT)
        with pytest.raises(fp.FlowerProcessError) as failed:
            bed.run(APP_DIR, "dep-broken", {**config, "min-sites": 3, "output-dir": str(out),
                                            "run-name": "too-few"}, timeout=RUN_TIMEOUT,
                    log_name="flwr-run-too-few")
    assert not fp.find_processes(tag=bed.tag, patterns=bed.patterns), "processes left behind"

    model = fedcluster.Model.load(out / "broken" / "model.json")
    assert model.metrics["n-sites"] == 2
    rejected = model.metrics["rejected-sites"]
    assert list(rejected) == ["1"]
    assert str(broken) in rejected["1"]
    assert re.search(r"\bx3\b", rejected["1"]), rejected["1"]  # the column, by name
    assert "n/a" in rejected["1"]
    # asked 3 to describe their data, then only the 2 good sites
    rows = read_history_csv(out / "broken" / "history.csv")
    got = [(r["task"], int(r["sites-asked"]), int(r["sites-answered"])) for r in rows]
    assert got[0] == ("describe+bounds", 3, 2)  # the describe round carried the bounds task
    assert all(asked == answered == 2 for _, asked, answered in got[1:])
    # the two good sites give what the in-process harness gives on the same files and
    # histories
    harness = run_in_process([{"data-path": str(paths[0]), "site-id": "0",
                               "cache-dir": str(tmp_path / "harness-cache-0")},
                              {**site_2, "cache-dir": str(tmp_path / "harness-cache")}],
                             {**config, "output-dir": ""})
    np.testing.assert_allclose(model.centroids, harness.centroids, rtol=0, atol=1e-9)
    # site 2's rows accounted for everywhere a person looks
    held = model.metrics["site-rows"]["2"]
    assert held == harness.metrics["site-rows"]["2"]
    assert held["held-back"] > 0 and held["usable"] == len(arrays[2])
    assert held["answered"] + held["held-back"] + held["waiting"] == len(arrays[2])
    assert "isolates" in held["held-back-why"]
    assert model.metrics["site-rows"]["0"] == {"answered": len(arrays[0]), "waiting": 0,
                                               "held-back": 0, "usable": len(arrays[0])}
    figure = (f"site 2 answers from {held['answered']} of {len(arrays[2])} usable rows; "
              + (f"{held['waiting']} wait in no group; " if held["waiting"] else "")
              + f"{held['held-back']} held back by the versions audit")
    assert f"WARNING {figure}" in done.output  # the summary `flwr run` streams
    assert re.search(rf"{re.escape(figure)} .*\(\d+\.\d% of its usable rows\)",
                     done.output)  # the coordinator's warning
    assert {int(r["rows-not-answered"]) for r in rows[1:]} == {held["held-back"] + held["waiting"]}
    report = (out / "broken" / "report.html").read_text()
    assert figure in report and "answered from all its usable rows" not in report
    # the run that could not go on: failed, with the reason, as Flower records it
    assert "ended with status 'finished:failed'" in str(failed.value)
    assert "exited with" not in str(failed.value)  # flwr run --stream exited 0 (1.39-1.42)
    assert "2 usable site(s)" in str(failed.value)


def test_a_stopped_run_resumes_from_its_checkpoint_over_grpc(sandbox, digits_sites, tmp_path):
    """An operator stops a run mid-training (`flwr stop`: the SuperLink ends it and its
    ServerApp process goes); a new run with ``resume-from`` continues on the same real
    federation from the checkpoint the ServerApp wrote after its last completed round.
    The result is the uninterrupted in-process run's, and the history is the stopped
    rounds, the resume's describe round, then the rest."""
    arrays, paths = digits_sites
    config = {**CONFIG, "tol": 0.0}
    out = tmp_path / "outputs"
    with sandbox() as bed:
        start_federation(bed, "dep-resume", {str(i): path for i, path in enumerate(paths)})
        log = bed.log_dir / "flwr-run-stopped.log"
        with ThreadPoolExecutor(1) as pool:
            stopped = pool.submit(bed.run, APP_DIR, "dep-resume",
                                  {**config, "output-dir": str(out), "run-name": "stopped"},
                                  timeout=RUN_TIMEOUT, log_name="flwr-run-stopped")
            deadline = time.monotonic() + RUN_TIMEOUT
            while not re.search(r"round +3 \[lloyd", _text(log)):  # the first training round
                assert time.monotonic() < deadline and not stopped.done(), _text(log)
                time.sleep(0.2)
            run_id = re.search(r"Successfully started run (\d+)", _text(log)).group(1)
            rc, said = fp._flwr(["stop", run_id, "dep-resume"], bed.env, APP_DIR, 60)
            assert rc == 0, said
            with pytest.raises(fp.FlowerProcessError, match="finished:stopped"):
                stopped.result()
        saved = json.loads((out / "stopped" / "checkpoint.json").read_text())
        harness = fedcluster.simulate(arrays, **py_kwargs(config))
        assert not saved["finished"] and 2 <= saved["round"] < len(harness.history)
        bed.run(APP_DIR, "dep-resume",
                {**config, "output-dir": str(out), "run-name": "resumed",
                 "resume-from": str(out / "stopped")},
                timeout=RUN_TIMEOUT, log_name="flwr-run-resumed")
    model = fedcluster.Model.load(out / "resumed" / "model.json")
    np.testing.assert_allclose(model.centroids, harness.centroids, rtol=0, atol=1e-9)
    np.testing.assert_allclose(model.metrics["score"], harness.metrics["score"], rtol=1e-9)
    done, whole = [h["task"] for h in model.history], [h["task"] for h in harness.history]
    cut = saved["round"]
    assert done[:cut] == whole[:cut] and done[cut] == "describe" and done[cut + 1:] == whole[cut:]
    assert [h["round"] for h in model.history] == list(range(1, len(done) + 1))


def test_processes_are_cleaned_up_when_a_test_fails_mid_run(sandbox, digits_sites):
    _, paths = digits_sites
    with ThreadPoolExecutor(1) as pool:
        with pytest.raises(RuntimeError, match="the test fails here"):
            with sandbox() as bed:
                start_federation(bed, "dep-stuck", {"0": paths[0]})
                # min-sites 3 but one site: the ServerApp waits for sites that never come
                run = pool.submit(bed.run, APP_DIR, "dep-stuck", {"min-sites": 3, "output-dir": ""},
                                  timeout=RUN_TIMEOUT, log_name="stuck-run")
                run_log = bed.log_dir / "stuck-run.log"
                deadline = time.monotonic() + 120
                while "waiting for 3 site(s) to connect" not in _text(run_log):
                    if run.done():
                        run.result()  # it should not have ended: raise what it says
                    assert time.monotonic() < deadline, "the ServerApp did not start:\n" + _text(run_log)
                    time.sleep(0.2)
                in_flight = fp.find_processes(tag=bed.tag)
                raise RuntimeError("the test fails here, with the run in flight")
        # the sandbox stopped every process, so the run failed too, and it says why:
        # its output and the tail of every process log
        with pytest.raises(fp.FlowerProcessError) as failure:
            run.result(timeout=60)
    message = str(failure.value)
    assert "waiting for 3 site(s) to connect" in message
    assert "----- superlink" in message and "----- supernode-0" in message
    # when the test failed, Flower's own children were running: the SuperLink's
    # SuperExec (in a session of its own), the ServerApp, the SuperNode's SuperExec ...
    running = [p.cmdline for p in in_flight]
    assert sum("flower-superexec" in c for c in running) == 2, running
    assert any("flwr-serverapp" in c for c in running), running
    # ... and now nothing of this test is left, the `flwr run` CLI included
    assert not fp.find_processes(tag=bed.tag, patterns=bed.patterns), "processes left behind"


def _text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def test_hospital_tables_through_the_schema_over_grpc(sandbox, tmp_path):
    """Issue 20, over real processes: three sites hold the clinical demo's tables (missing
    cells, categories, shuffled columns, one site in other units) and read them through
    the schema; a fourth holds another schema and is rejected with both hashes named.
    DWF with the pooled imputation (impute-mean) and scaling ends where the in-process
    run over the same files and node configs ends, to 1e-9."""
    from fedcluster.common.clinical_demo import write_clinical
    from fedcluster.common.schema import load_schema, schema_hash
    from fedcluster.simulation import run_in_process

    schema, *files = write_clinical(tmp_path / "clinical", n_sites=3, seed=0)
    other = tmp_path / "other-schema.toml"
    other.write_text("median-bins = 50\n" + schema.read_text())
    nodes = {str(i): {"data-path": str(path), "site-id": str(i), "schema-path": str(schema)}
             for i, path in enumerate(files)}
    nodes["3"] = {"data-path": str(files[0]), "site-id": "3", "schema-path": str(other)}
    config = {"n-clusters": 4, "num-rounds": 1, "tol": 0.0, "min-sites": 3, "seed": 1,
              "schema": str(schema), "scale": "standard", "every-site": False}
    out = tmp_path / "outputs"
    with sandbox() as bed:
        link = bed.superlink(simulation=False)
        bed.supernodes(link, {f"supernode-{key}": cfg for key, cfg in nodes.items()})
        bed.connect("dep-tables", link.control_address)
        bed.run(APP_DIR, "dep-tables", {**config, "output-dir": str(out), "run-name": "tables"},
                timeout=RUN_TIMEOUT)
    assert not fp.find_processes(tag=bed.tag, patterns=bed.patterns), "processes left behind"

    model = fedcluster.Model.load(out / "tables" / "model.json")
    rejected = model.metrics["rejected-sites"]
    assert list(rejected) == ["3"]
    assert schema_hash(load_schema(other)) in rejected["3"]
    assert schema_hash(load_schema(schema)) in rejected["3"]
    assert [h["task"] for h in model.history[:2]] == ["describe+impute_stats", "stats"]
    harness = run_in_process([{**nodes[str(i)], "cache-dir": str(tmp_path / "harness-cache")}
                              for i in range(3)],
                             {**config, "output-dir": str(tmp_path / "harness")})
    np.testing.assert_allclose(model.centroids, harness.centroids, rtol=0, atol=1e-9)
    np.testing.assert_allclose(model.scaling.fill, harness.model.scaling.fill, rtol=1e-15)
    assert model.metrics["table"] == harness.metrics["table"]
    assert model.metrics["table"]["cells-missing"]["glucose"]["total"] > 0
    # Table 1 by cluster crossed the real gRPC: the harness's rows (this file's other runs
    # leave it out, fp.NO_TABLE1)
    assert [h["task"] for h in model.history][-1] == "profile"
    ours, theirs = model.profile, harness.profile
    assert len(ours) == len(theirs) > 0
    assert ours[["cluster", "variable", "level", "statistic"]].equals(
        theirs[["cluster", "variable", "level", "statistic"]])
    np.testing.assert_allclose(ours.value.astype(float), theirs.value.astype(float), rtol=1e-12)

"""Edge scale (issue 47): the in-process harness's work per message does not grow with the
number of sites, and devices that come and go (``simulated-availability``,
``simulated-stragglers``: ``server_app/availability.py``) leave each algorithm doing what
it documents for a partial round: its server step over the replies of exactly the sites
that answered (DWF's dynamic weights, mini-batch's counts, FKM's k-means on the pruned
local means), and GTV relaying a neighbour's last centroids the server kept. The
seconds and the quality at 1,000-10,000 sites are bench/scale.py's (BENCHMARKS.md)."""

from __future__ import annotations

import csv
import json
import sys

import numpy as np
import pytest

import fedcluster
import fedcluster.server_app.app  # noqa: F401  (the module, for its fit_round)
from fedcluster.common import protocol
from fedcluster.common.config import ConfigError, parse_run_config
from fedcluster.server_app import availability
from fedcluster.server_app.outputs import summary_table
from fedcluster.simulation import record_parts
from fedcluster.strategies.aggregate import (count_weighted_mean, momentum_step,
                                             site_weighted_mean, weighted_lloyd)
from fedcluster.strategies.round_replies import key_list
from fedcluster.strategies.sites import site_order

SIMULATED = {"simulated_availability": 0.6, "simulated_stragglers": 0.25}


def skewed_sites(n_sites: int, seed: int = 0, rows: int = 24) -> list[np.ndarray]:
    """Sites of ``rows`` rows in 3 dimensions, each from 2 of 4 clusters (label skew:
    the dynamic weights matter, and FKM's sites prune)."""
    rng = np.random.default_rng(seed)
    centres = rng.uniform(-8, 8, size=(4, 3))
    sites = []
    for _ in range(n_sites):
        own = rng.choice(4, size=2, replace=False)
        sites.append(centres[rng.choice(own, size=rows)] + rng.standard_normal((rows, 3)))
    return sites


def parse_keys(text: str) -> set[str]:
    """The sites ``answered`` names (``0-3,7,H1``)."""
    keys = set()
    for part in filter(None, text.split(",")):
        first, _, last = part.partition("-")
        if first.isdigit() and last.isdigit():
            keys.update(str(i) for i in range(int(first), int(last) + 1))
        else:
            keys.add(part)
    return keys


# ------------------------------------------------------------------ cost per message
def _traced_rounds(n_sites: int) -> list[tuple[str, int, int]]:
    """Per round of a DWF run: its task, the Python-level work it did (every line
    executed, each loop iteration included, in fedcluster, Flower and numpy's Python
    code), traced from the ServerApp's fit round (planning, pushing, the ClientApp of each
    site, matching, validating, reducing), and the messages it sent."""
    rounds, events = [], [0]

    def count(frame, event, arg):
        events[0] += 1
        return count

    server_app = sys.modules["fedcluster.server_app.app"]
    plain_round = server_app.fit_round

    def traced_round(grid, context):
        events[0] = 0
        sys.settrace(count)
        try:
            plain_round(grid, context)
        finally:
            sys.settrace(None)
        row = context.strategy.run.history[-1]
        rounds.append((row["task"], events[0], row["sites-asked"] - row["sites-offline"]))

    server_app.fit_round = traced_round
    try:
        fedcluster.simulate(skewed_sites(n_sites, seed=1, rows=20), n_clusters=4,
                            init="random", tol=0.0, num_rounds=2, profile=False,
                            central_baseline=False)
    finally:
        server_app.fit_round = plain_round
    return rounds


def test_a_site_adds_the_same_work_per_message_at_100_and_at_400_sites():
    """Counts, not seconds. A round's work is a part of its own (a few lines, whatever
    the sites) plus the work of its messages: in each round (describe, two Lloyd rounds,
    the evaluation), the lines a message adds from 50 to 100 sites and from 100 to 400
    sites are the same (to 1%; 10,000-15,000 a message, equal to 0.1% when measured).
    A per-message step that walks all the sites (the group cache's scan of every kept
    entry, issue 47) adds at least one line per site per message: 350 more per message
    from the first pair to the second. It does not see inside a C call (a copy of every
    site's entry per message would not show): bench/scale.py's seconds per round at
    1,000-10,000 sites do."""
    fedcluster.simulate(skewed_sites(20, rows=20), n_clusters=4, init="random", num_rounds=1,
                        profile=False)  # warm: imports and compiled kernels
    runs = [_traced_rounds(n) for n in (50, 100, 400)]
    tasks = [task for task, _, _ in runs[0]]
    assert tasks[:4] == ["describe+bounds", "lloyd", "lloyd", "evaluate"]
    for i, task in enumerate(tasks[:4]):
        (_, e50, m50), (_, e100, m100), (_, e400, m400) = (run[i] for run in runs)
        fewer = (e100 - e50) / (m100 - m50)
        more = (e400 - e100) / (m400 - m100)
        assert 5_000 < fewer < 50_000, task
        assert abs(more - fewer) <= 0.01 * fewer, (task, fewer, more)


# ------------------------------------------------------------------ the simulated devices
def test_a_site_draws_its_own_availability_per_round_from_the_seed():
    config = parse_run_config({"simulated-availability": 0.7, "simulated-stragglers": 0.2,
                               "seed": 5})
    keys = {100 + i: str(i) for i in range(4000)}
    absent = availability.draw(config, 3, keys)
    assert 0.27 < len(absent.offline) / 4000 < 0.33  # 1 - a offline
    assert 0.12 < len(absent.late) / 4000 < 0.16  # a * s late
    assert not absent.offline & absent.late
    # a site's draw is its own: the same whichever others were asked
    few = availability.draw(config, 3, {7: "12", 8: "40"})
    for node, key in ((7, "12"), (8, "40")):
        assert (node in few.offline) == (100 + int(key) in absent.offline)
        assert (node in few.late) == (100 + int(key) in absent.late)
    assert availability.draw(config, 4, keys) != absent  # a new round, a new draw
    assert availability.site_draw(5, 3, "12") == availability.site_draw(5, 3, "12")
    assert availability.draw(parse_run_config({}), 3, keys) is availability.NOBODY


@pytest.mark.parametrize("values, words", [
    ({"simulated-availability": 0.0}, "simulated-availability"),
    ({"simulated-stragglers": 1.0}, "simulated-stragglers"),
    ({"simulated-availability": 0.5, "secure-aggregation": True, "secagg-data-bound": 10.0,
      "init": "divisive"}, "SecAgg+"),
])
def test_bad_simulated_devices_are_refused_naming_the_key(values, words):
    with pytest.raises(ConfigError, match=words):
        parse_run_config(values)


def _training_rounds(result, records):
    """Per training round: its history row, the records of the replies the sites sent in
    it (site key -> record), and the centroids the next round sent."""
    by_round: dict[int, dict[str, dict]] = {}
    for record in records:
        if record["task"] is None:
            continue
        key = record["metrics"][protocol.SITE_KEY]
        by_round.setdefault(int(record["params"][protocol.ROUND]), {})[key] = record
    rows = [row for row in result.history if "movement" in row]
    out = []
    for row in rows:
        later = [r for t, sent in sorted(by_round.items()) if t > row["round"]
                 for r in sent.values() if r["task"] in ("lloyd", "evaluate", "minibatch",
                                                          "prune_lloyd")]
        sent_next = protocol.task_inputs(later[0]["task"], later[0]["sent"]).centroids
        out.append((row, by_round[row["round"]], sent_next))
    return out


def _replies(task: str, records: dict, keys) -> list:
    """The reply arrays of the sites ``keys``, in site order."""
    out = []
    for key in sorted(keys, key=site_order):
        record = records[key]
        arrays = record_parts(record)[0][1]
        out.append(protocol.reply_arrays(task, arrays, far=protocol.FAR_ROWS in record["params"]))
    return out


def _check_partial_rounds(result, records, task: str, server_step) -> None:
    """Every training round's new centroids are ``server_step`` over the replies of the
    sites the round names as answered, and not over those plus the late ones (which did
    leave their sites); the counts add up; some rounds lost sites both ways."""
    lost = {"offline": 0, "late": 0}
    previous = None
    for row, sent, new in _training_rounds(result, records):
        answered = parse_keys(row["answered"])
        late = set(sent) - answered
        assert len(answered) == row["sites-answered"] and len(late) == row["sites-late"]
        assert row["sites-asked"] == (row["sites-answered"] + row["sites-offline"]
                                      + row["sites-late"] + row["sites-failed"])
        assert row["sites-failed"] == 0 and not row["failures"]
        centroids = protocol.task_inputs(task, next(iter(sent.values()))["sent"]).centroids
        expected = server_step(_replies(task, sent, answered), centroids, previous)
        np.testing.assert_allclose(new, expected, rtol=0, atol=1e-12)
        if late:
            with_late = server_step(_replies(task, sent, answered | late), centroids, previous)
            assert not np.allclose(new, with_late, rtol=0, atol=1e-9)
        lost["offline"] += row["sites-offline"]
        lost["late"] += row["sites-late"]
        previous = centroids
    assert lost["offline"] > 0 and lost["late"] > 0


def test_dwf_weighs_the_sites_that_answered_and_writes_who_they_were(tmp_path):
    records = []
    result = fedcluster.simulate(skewed_sites(24), n_clusters=4, num_rounds=4, tol=0.0,
                                 learning_rate=0.8, momentum=0.3, record_replies=records,
                                 output_dir=str(tmp_path), run_name="edge", **SIMULATED)

    def dwf(replies, C, C_old):
        D = site_weighted_mean(np.stack([r.centroids for r in replies]),
                               np.stack([r.counts for r in replies]), dynamic=True)
        return momentum_step(C, D, C if C_old is None else C_old, 0.8, 0.3)

    _check_partial_rounds(result, records, "lloyd", dwf)
    # who answered each round: the summary, history.csv and model.json
    with open(tmp_path / "edge" / "history.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [r["answered"] for r in rows] == [h["answered"] for h in result.history]
    assert rows[0]["answered"] == "0-23" and rows[0]["sites-offline"] == "0"
    train = [h for h in result.history if "movement" in h]
    saved = json.loads((tmp_path / "edge" / "model.json").read_text())["metrics"]
    assert saved["participation"] == {
        "rounds": 4, "asked": 96, "answered": sum(h["sites-answered"] for h in train),
        "failed": 0, "offline": sum(h["sites-offline"] for h in train),
        "late": sum(h["sites-late"] for h in train),
        "simulated": {"availability": 0.6, "stragglers": 0.25}}
    summary = summary_table(result.metrics)
    assert "asked sites answered per round" in summary and "offline" in summary
    assert result.metrics["site-failures"] == {}  # a simulated absence is not a failure


def test_minibatch_averages_the_counts_of_the_sites_that_answered():
    records = []
    result = fedcluster.simulate(skewed_sites(24, seed=2), algorithm="minibatch", n_clusters=4,
                                 num_rounds=4, tol=0.0, learning_rate=0.7, beta=0.5,
                                 record_replies=records, **SIMULATED)

    def minibatch(replies, C, _):
        gamma, _totals = count_weighted_mean(np.stack([r.centroids for r in replies]),
                                             np.stack([r.counts for r in replies]), C)
        return C + 0.7 * (gamma - C)

    _check_partial_rounds(result, records, "minibatch", minibatch)


def test_fkm_clusters_the_pruned_means_of_the_sites_that_answered():
    records = []
    result = fedcluster.simulate(skewed_sites(24, seed=3), algorithm="fkm", n_clusters=4,
                                 num_rounds=4, tol=0.0, record_replies=records, **SIMULATED)

    def fkm(replies, C, _):
        points = np.concatenate([r.centroids for r in replies])
        counts = np.concatenate([r.counts for r in replies]).astype(np.float64)
        return weighted_lloyd(points, counts, C)

    _check_partial_rounds(result, records, "prune_lloyd", fkm)
    pruned = [r for r in records if r["task"] == "prune_lloyd"
              and len(protocol.reply_arrays("prune_lloyd", r["arrays"]).centroids) < 4]
    assert pruned  # sites holding 2 of the 4 clusters dropped the others


def test_gtv_relays_the_last_centroids_the_server_kept_of_each_neighbour():
    """A site's payload holds each neighbour's centroids as the server last stored them:
    from the last round that neighbour answered (a late reply is never stored)."""
    records = []
    result = fedcluster.simulate(skewed_sites(12, seed=4), algorithm="gtv", n_clusters=4,
                                 num_rounds=5, tol=0.0, topology="ring", consensus_rounds=0,
                                 site_config={"min-site-rows": 1}, record_replies=records,
                                 **SIMULATED)
    gtv_rounds = sorted({int(r["params"][protocol.ROUND]) for r in records if r["task"] == "gtv"})
    answered = {row["round"]: parse_keys(row["answered"]) for row in result.history}
    kept: dict[str, np.ndarray] = {}
    stale = late_seen = 0
    for t in gtv_rounds:
        sent = {r["metrics"][protocol.SITE_KEY]: r for r in records
                if r["task"] == "gtv" and int(r["params"][protocol.ROUND]) == t}
        for key, record in sent.items():
            state = protocol.task_inputs("gtv", record["sent"])
            if state.own is None:
                continue
            np.testing.assert_array_equal(state.own, kept[key])
            i = int(key)
            for j in ((i - 1) % 12, (i + 1) % 12):
                assert any(np.array_equal(block, kept[str(j)]) for block in state.neighbours)
                stale += str(j) not in answered.get(t - 1, set())
        for key, record in sent.items():
            reply = protocol.reply_arrays("gtv", record["arrays"]).centroids
            if key in answered[t]:
                kept[key] = reply
            elif key in kept:  # late: its reply left the site but was never stored
                late_seen += not np.array_equal(reply, kept[key])
    assert stale > 0 and late_seen > 0
    assert sum(h.get("sites-offline", 0) for h in result.history) > 0

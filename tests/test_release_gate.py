"""The release step (issue 54, "one gate"): every value a site sends leaves through
``release/gate.py``, which applies the floor's rules the task declared and says what the
reply is a function of; the tasks themselves withhold nothing.

- A task's own reply (``tasks.TASKS``, before the gate) still holds clusters under the
  floor; what ``run_task`` returns, and what the ClientApp sends and records, does not.
- Every reply the real ClientApp sends carries its basis in the site's ledger: the table
  it came from (its digest and number in the site's answered history), p_site, and which
  of the table's statistics (counts, sums, spreads); a DP reply: rows, clipped and noised.
- A task over all the site's rows is refused by a site under the floor before it runs.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from fedcluster.client_app import tasks
from fedcluster.client_app.data import group_table
from fedcluster.client_app.data.site_data import SiteData
from fedcluster.client_app.release import floor as floor_rules
from fedcluster.client_app.release import gate
from fedcluster.client_app.release import ledger
from fedcluster.client_app.task_io import TaskError
from fedcluster.client_app.task_runner import run_task
from fedcluster.common import protocol

from test_versions import FileSite


def _site(seed: int = 0, n: int = 120) -> SiteData:
    rng = np.random.default_rng(seed)
    centres = rng.normal(0, 6, (4, 3))
    X = centres[rng.integers(4, size=n)] + rng.normal(size=(n, 3))
    return SiteData(X, None, None, "site")


def test_the_tasks_withhold_nothing_and_the_gate_withholds_every_cluster_under_the_floor():
    site = _site()
    groups, _ = group_table.site_groups(site, 2)
    C = np.vstack([groups.means[:6], np.full((1, 3), 40.0)])  # a cluster per group: 2-3 rows
    params = {"task": "lloyd", "local-iters": 1, "tol": 0.0, "min-cluster-size": 10}
    raw = tasks.TASKS["lloyd"](groups, protocol.Centroids(C), params, 10)
    counts = np.asarray(raw.arrays.counts)
    assert ((counts > 0) & (counts < 10)).sum() >= 2  # clusters of a few rows, in the task's reply
    assert raw.rules and raw.basis is None
    sent = run_task(groups, [C], params, 2)
    shown = np.asarray(sent.arrays.counts)
    assert not ((shown > 0) & (shown < 10)).any()
    hidden = (counts < 10)
    np.testing.assert_array_equal(np.asarray(sent.arrays.centroids)[hidden], C[hidden])
    assert sent.rules == () and sent.basis["statistics"] == ["counts", "sums", "spreads"]


def test_every_reply_the_clientapp_sends_is_recorded_with_its_basis(tmp_path):
    rng = np.random.default_rng(5)
    X = rng.normal(size=(90, 3))
    path, cache = tmp_path / "site.csv", tmp_path / "cache"
    path.write_text("a,b,c\n" + "\n".join(",".join(repr(float(v)) for v in r) for r in X) + "\n")
    site = FileSite(path, cache, {"ledger-path": str(tmp_path / "ledger.jsonl")}, False)
    site.ask("describe", [])
    site.ask("stats", [], scale="standard")
    means, _ = site.ask("kmeanspp", [], **{"k-local": 5, "seed": 0})
    site.ask("lloyd", [means[0]], **{"local-iters": 1, "tol": 0.0})
    lines = ledger.read(tmp_path / "ledger.jsonl")
    assert [line["task"] for line in lines] == ["describe", "stats", "kmeanspp", "lloyd"]
    table = site.table_now()
    for line in lines:
        assert line["basis"]["table"] == table.digest[:16] == line["groups"]
        assert line["basis"]["p-site"] == 2
        assert line["basis"]["table-number"] == table.table_ref.number
    assert lines[0]["basis"]["statistics"] == ["counts"]
    assert lines[2]["basis"]["statistics"] == ["counts", "sums"]
    assert "spreads" in lines[1]["basis"]["statistics"] and "spreads" in lines[3]["basis"]["statistics"]
    assert json.loads(json.dumps(lines[3]["values"]))["counts"]  # the values, as sent


@pytest.mark.parametrize("task", sorted(floor_rules.WHOLE_SITE))
def test_a_reply_over_all_rows_is_refused_under_the_floor_before_the_task_runs(task, monkeypatch):
    groups, _ = group_table.site_groups(_site(n=30), 2)
    ran = []
    monkeypatch.setitem(tasks.TASKS, task, lambda *a: ran.append(1))
    with pytest.raises(TaskError, match="fewer than the privacy floor 40"):
        gate.admit(task, groups, 40)
    with pytest.raises(TaskError, match=floor_rules.WHOLE_SITE[task]):
        run_task(groups, [], {"task": task, "min-cluster-size": 40, "scale": "standard",
                              "alpha": 1.0, "local-iters": 1, "tol": 0.0}, 2)
    assert ran == []

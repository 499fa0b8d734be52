"""A named history (node config ``history``, issue 55): a site's answered history is kept
per way of reading its data, whatever the file, so a second study's file that shares
rows with a first one's, read under the same cache, counts as a new version of it, and
the rows of the first's groups it breaks wait; a site that keeps separate studies apart
names their histories, and each answers from all of its rows. Against the real ClientApp
(a site reading a CSV through its cache)."""

from __future__ import annotations

from test_versions import FileSite, Table, blobs


def _rows_answered(path, cache, history: str | None) -> int:
    node = {} if history is None else {"history": history}
    site = FileSite(path, cache, node, with_id=False)
    _, metrics = site.ask("stats", [], scale="standard")
    return int(metrics["n-rows"])


def test_a_second_study_waits_in_one_history_and_not_in_a_named_one(tmp_path):
    X = blobs(400, seed=3)
    first, second = tmp_path / "study-a.csv", tmp_path / "study-b.csv"
    Table(X, with_id=False).write(first)
    Table(X[100:], with_id=False).write(second)  # 300 of the first study's rows
    shared = tmp_path / "cache"
    assert _rows_answered(first, shared, None) == 400
    assert _rows_answered(second, shared, None) < 300  # a new version of the first: rows wait
    apart = tmp_path / "cache-apart"
    assert _rows_answered(first, apart, "study-a") == 400
    assert _rows_answered(second, apart, "study-b") == 300
    assert _rows_answered(first, apart, "study-a") == 400  # each history as it was

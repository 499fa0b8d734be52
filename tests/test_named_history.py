"""A named history (node config ``history``, issue 55): a site's answered history is kept
per way of reading its data, whatever the file, so a second study's file that shares
rows with a first one's, read under the same cache, is a new version of it: its groups
are audited together with the first's (it answers from the first's groups whose rows are
all there, and the parts of the groups it splits make groups the audits judge). A site
that keeps separate studies apart names their histories: each is audited alone. Against
the real ClientApp (a site reading a CSV through its cache)."""

from __future__ import annotations

from test_versions import FileSite, Table, blobs


def _rows_answered(path, cache, history: str | None) -> int:
    node = {} if history is None else {"history": history}
    site = FileSite(path, cache, node, with_id=False)
    _, metrics = site.ask("stats", [], scale="standard")
    return int(metrics["n-rows"])


def _tables(cache) -> list[list[dict]]:
    """The tables of each answered history kept under ``cache``."""
    from fedcluster.client_app.data.versions import Store

    return [Store.read_tables(d) for d in sorted((cache / "groups").glob("store-*"))]


def test_a_second_study_is_audited_with_the_first_in_one_history_and_apart_in_a_named_one(
        tmp_path):
    X = blobs(400, seed=3)
    first, second = tmp_path / "study-a.csv", tmp_path / "study-b.csv"
    Table(X, with_id=False).write(first)
    Table(X[100:], with_id=False).write(second)  # 300 of the first study's rows
    shared = tmp_path / "cache"
    assert _rows_answered(first, shared, None) == 400
    assert _rows_answered(second, shared, None) >= 294  # a new version of the first
    tables, = _tables(shared)  # one history: the second study's table audited with the first's
    assert [t["rows"] for t in tables] == [400, 300] and tables[1]["base"] == 0
    apart = tmp_path / "cache-apart"
    assert _rows_answered(first, apart, "study-a") == 400
    assert _rows_answered(second, apart, "study-b") == 300
    assert _rows_answered(first, apart, "study-a") == 400  # each history as it was
    assert sorted([t["rows"] for t in h] for h in _tables(apart)) == [[300], [400]]

"""The differencing guard's refusing mode (node config ``guard-refuse = true``, issue 19):
a task the guard would answer with an earlier cluster (or withhold one in) is refused
with an error reply naming the policy, and nothing of it is kept.

The malicious coordinator of ``test_differencing.py`` plays the binary search and the
three queries against the real ClientApp (its Context kept between messages)."""

from __future__ import annotations

import numpy as np
import pytest

from fedcluster.client_app.differencing_guard import (
    DifferencingGuard, GuardRefusal, RowSetHistory, pack,
)
from test_differencing import (
    THREE_QUERIES, Coordinator, _is_row, _mask, _site_rows, rows_recovered, three_query_site,
)

REFUSING = {"guard-refuse": True}


def test_the_binary_search_is_refused_at_its_first_caught_query():
    X = _site_rows()
    site = Coordinator(X, policy=REFUSING)
    direction = np.eye(X.shape[1])[0]
    sums, counts, error = [], [], None
    lo, hi = -10.0, 10.0
    try:
        for h in (lo, hi):
            means, n = site.lloyd(np.stack([(h - 1.0) * direction, (h + 1.0) * direction]))
            sums.append(means[0] * n[0])
            counts.append(int(n[0]))
        target = (counts[0] + counts[1]) // 2
        while site.queries < 80:
            mid = (lo + hi) / 2
            reply = site.lloyd(np.stack([(mid - 1.0) * direction, (mid + 1.0) * direction]))
            if isinstance(reply, str):
                error = reply
                break
            means, n = reply
            sums.append(means[0] * n[0])
            counts.append(int(n[0]))
            lo, hi = (mid, hi) if n[0] <= target else (lo, mid)
        after = site.lloyd(np.stack([-11.0 * direction, 9.0 * direction]))  # a far, new set
    finally:
        site.close()
    assert error is not None and "differencing-guard (guard-refuse)" in error
    assert "1 to 1 rows" in error  # the default floor p = 2 of the tasks
    # every reply before the refusal is a new set at least p rows from the others: no row
    assert rows_recovered(np.array(sums), np.array(counts), X) == set()
    assert site.queries < 45  # refused before the unguarded search would have finished
    assert not isinstance(after, str)  # refusing one task does not end the site's run


def test_the_three_queries_are_refused_at_the_second():
    X, _, _ = three_query_site(40, 20)
    site = Coordinator(X, policy=REFUSING)
    try:
        replies = [site.lloyd(C) for C in THREE_QUERIES]
    finally:
        site.close()
    assert not isinstance(replies[0], str) and replies[0][1][0] == 41  # S1 as asked
    assert isinstance(replies[1], str) and "combines into" in replies[1]  # S2: a triple
    # S2 was refused, so nothing of it was kept: S3 = D alone is new and answered
    assert not isinstance(replies[2], str) and replies[2][1][0] == 20
    s1 = replies[0][0][0] * 41
    s3 = replies[2][0][0] * 20
    assert not _is_row(s1 - s3, X) and not _is_row(s1 + s3, X)


def test_a_refusing_guard_raises_where_the_default_one_snaps_and_keeps_nothing():
    history = RowSetHistory(20)
    guard = DifferencingGuard(history, refuse=True)
    first = _mask(20, range(10))
    assert guard.admit(first, floor=2) is first
    assert guard.admit(_mask(20, range(10)), floor=2) is not None  # the same rows again
    with pytest.raises(GuardRefusal, match="guard-refuse"):
        guard.admit(_mask(20, range(11)), floor=2)
    assert len(history) == 1 and guard.snapped == 0
    far = _mask(20, range(12))
    assert guard.admit(far, floor=2) is far and len(history) == 2
    assert history.find(pack(_mask(20, range(11)))) is None

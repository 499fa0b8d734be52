"""The server's wait for replies (server_app/polling.py): every reply is collected, the
pause between pulls never exceeds LONGEST_PAUSE (Flower's send_and_receive sleeps 3 s),
the deadline is kept, and FastPollGrid hands Flower's own workflows (SecAgg+) that loop
while leaving the rest of the Grid as it is."""

from __future__ import annotations

from types import SimpleNamespace

from fedcluster.server_app import polling


class SlowGrid:
    """Replies to message i arrive at pull number ``arrive[i]``."""

    def __init__(self, arrive: list[int]) -> None:
        self.arrive, self.pulls, self.pushed = arrive, 0, []

    def push_messages(self, messages):
        self.pushed = [f"m{i}" for i, _ in enumerate(messages)]
        return list(self.pushed)

    def pull_messages(self, message_ids):
        self.pulls += 1
        return [SimpleNamespace(metadata=SimpleNamespace(reply_to_message_id=mid))
                for i, mid in enumerate(self.pushed)
                if mid in message_ids and self.arrive[i] == self.pulls]

    def get_node_ids(self):
        return [7, 8]


def test_exchange_collects_every_reply_with_short_pauses(monkeypatch):
    pauses = []
    monkeypatch.setattr(polling.time, "sleep", pauses.append)
    grid = SlowGrid([2, 9])
    replies = polling.exchange(grid, ["a", "b"], timeout=60.0)
    assert sorted(r.metadata.reply_to_message_id for r in replies) == ["m0", "m1"]
    assert grid.pulls == 9
    assert pauses and max(pauses) <= polling.LONGEST_PAUSE
    assert pauses[1] == polling.FIRST_PAUSE  # a reply arrived: back to the short pause


def test_exchange_stops_at_the_deadline(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(polling.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(polling.time, "sleep", lambda s: clock.__setitem__(0, clock[0] + s))
    grid = SlowGrid([1, 10**9])  # the second site never answers
    replies = polling.exchange(grid, ["a", "b"], timeout=5.0)
    assert [r.metadata.reply_to_message_id for r in replies] == ["m0"]
    assert 5.0 <= clock[0] <= 5.0 + polling.LONGEST_PAUSE


def test_fast_poll_grid_is_the_grid_with_a_short_send_and_receive(monkeypatch):
    pauses = []
    monkeypatch.setattr(polling.time, "sleep", pauses.append)
    grid = SlowGrid([3, 4])
    fast = polling.FastPollGrid(grid)
    assert fast.get_node_ids() == [7, 8]  # everything else is the wrapped Grid's
    replies = fast.send_and_receive(["a", "b"], timeout=None)  # None: no deadline
    assert len(list(replies)) == 2 and grid.pulls == 4
    assert max(pauses) <= polling.LONGEST_PAUSE < 3

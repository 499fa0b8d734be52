"""Waiting for the sites' replies: a push/pull loop with a short poll.

Flower's ``Grid.send_and_receive`` sleeps 3 s between pulls (``GrpcGrid``), so every
round waits up to 3 s after the last reply has arrived. :func:`exchange` pulls every
0.05 s, doubling to 0.5 s while nothing arrives; :class:`FastPollGrid` gives Flower's
own workflows (SecAgg+, which calls ``send_and_receive`` once per stage) the same loop.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable

from flwr.app import Message
from flwr.serverapp import Grid

# The pause between two pulls starts short and doubles up to LONGEST_PAUSE while nothing
# arrives: a reply is seen within ~0.5 s of its arrival, at a few pulls per second at most.
FIRST_PAUSE, LONGEST_PAUSE = 0.05, 0.5


def exchange(grid: Grid, messages: list[Message], timeout: float) -> list[Message]:
    """Push ``messages`` and pull their replies until every one has answered or
    ``timeout`` seconds have passed (Flower's ``send_and_receive`` with a short poll)."""
    pushed = list(grid.push_messages(messages))
    waiting = set(pushed)
    deadline = time.monotonic() + timeout
    replies: list[Message] = []
    pause = FIRST_PAUSE
    while waiting:
        pulled = list(grid.pull_messages([mid for mid in pushed if mid in waiting]))
        replies.extend(pulled)
        waiting.difference_update(m.metadata.reply_to_message_id for m in pulled)
        if not waiting or time.monotonic() >= deadline:
            break
        pause = FIRST_PAUSE if pulled else min(2 * pause, LONGEST_PAUSE)
        time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
    return replies


class FastPollGrid:
    """A Grid whose ``send_and_receive`` is :func:`exchange`; everything else is the
    wrapped Grid's. For Flower workflows that call ``send_and_receive`` themselves."""

    def __init__(self, grid: Grid) -> None:
        self.grid = grid

    def __getattr__(self, name: str):
        return getattr(self.grid, name)

    def send_and_receive(self, messages: Iterable[Message], *,
                         timeout: float | None = None) -> list[Message]:
        return exchange(self.grid, list(messages), math.inf if timeout is None else timeout)

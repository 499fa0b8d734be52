"""The errors of a federation as the server sees it (a reply that does not validate is
``validation.ReplyError``)."""

from __future__ import annotations


class FederationError(RuntimeError):
    """The run cannot go on (e.g. fewer than ``min-sites`` usable sites); says why."""


class SiteFailure(Exception):
    """A site that was asked gave no usable reply (no reply in time, an error message);
    the strategy names it by its site id."""

    def __init__(self, node_id: int, reason: str) -> None:
        super().__init__(f"node {node_id}: {reason}")
        self.node_id = int(node_id)
        self.reason = reason


class SiteAbsence(Exception):
    """A simulated device's absence (``server_app/availability.py``): ``kind`` "offline"
    (it was sent nothing) or "late" (its reply came after the round's deadline). The
    round counts it apart: it is not a failure."""

    def __init__(self, node_id: int, kind: str) -> None:
        super().__init__(f"node {node_id}: {kind}")
        self.node_id = int(node_id)
        self.kind = kind

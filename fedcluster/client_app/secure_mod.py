"""The site's half of SecAgg+: Flower's ``secaggplus_mod``, for the protocol's messages only.

The encoding of a site's terms is ``common.secure_codec``; the server's half (the SecAgg+
fit workflow for the sum rounds) is ``server_app.secure_fit``.
"""

from __future__ import annotations

from collections.abc import Callable

from flwr.app import Context, Message
from flwr.client.mod import secaggplus_mod
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS


def secure_mod(msg: Message, context: Context, call_next: Callable) -> Message:
    """Flower's ``secaggplus_mod`` for the SecAgg+ protocol's messages only.

    ``secaggplus_mod`` handles every TRAIN message and fails on one without its
    ``secaggplus`` config record; the plain rounds (and plain runs) carry none, so they
    go straight to the ClientApp, unchanged.
    """
    if RECORD_KEY_CONFIGS not in msg.content.config_records:
        return call_next(msg, context)
    return secaggplus_mod(msg, context, call_next)

"""Test-only timing of the SuperNodes the tests start (``tests/flower_processes.py``).

Flower 1.39's SuperNode sleeps a hard-coded 3 s whenever a pull from the SuperLink
brings no message (``flwr/supernode/start_client_internal.py``: ``time.sleep(3)``), and
waits for a ClientApp's reply in 0.5 s steps. A deployed round therefore waits ~3 s for
nothing: the next round's message arrives just after the SuperNode has gone to sleep.
This module runs at the start of every Python process of a test whose ``PYTHONPATH``
holds this folder (``sitecustomize``); in a ``flower-supernode`` process, and only when
``FEDCLUSTER_TEST_SUPERNODE_IDLE`` is set, it shortens those two sleeps (3 s to that
value, 0.5 s to a fifth of a second). With ``FEDCLUSTER_TEST_SUPERNODE_HEARTBEAT`` set,
it also sets the heartbeat interval the SuperNode registers (Flower's hard-coded 30 s,
``flwr.common.constant.HEARTBEAT_DEFAULT_INTERVAL``) to that many seconds: the SuperLink
declares a silent site gone after twice its interval, so a test that kills a site waits
~20 s at Flower's own minimum of 10 s instead of ~45 s (that test alone sets it: a
SuperNode reconnecting to a restarted SuperLink can stay silent for longer than 20 s).
Everything else of Flower runs unchanged: the same processes, gRPC, messages and code
paths, only sooner. The benchmarks run with neither (``bench/deployment.py`` measures
Flower's real floor).
"""

import os
import sys

_IDLE = os.environ.get("FEDCLUSTER_TEST_SUPERNODE_IDLE", "")
if _IDLE and sys.argv and os.path.basename(sys.argv[0]) == "flower-supernode":
    import time

    _sleep = time.sleep
    _SHORTER = {3: float(_IDLE), 0.5: 0.2}

    def _sooner(seconds: float) -> None:
        _sleep(_SHORTER.get(seconds, seconds))

    time.sleep = _sooner

_HEARTBEAT = os.environ.get("FEDCLUSTER_TEST_SUPERNODE_HEARTBEAT", "")
if _HEARTBEAT and sys.argv and os.path.basename(sys.argv[0]) == "flower-supernode":
    # Before the SuperNode's modules copy the constant (``from ... import``).
    import flwr.common.constant as _constant

    _constant.HEARTBEAT_DEFAULT_INTERVAL = int(_HEARTBEAT)

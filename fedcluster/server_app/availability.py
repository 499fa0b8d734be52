"""Devices that come and go, simulated: ``simulated-availability`` and
``simulated-stragglers``.

An edge device is often offline, and a slow one answers after the round's deadline. In a
training round (one that samples sites by ``fraction``), each asked site draws, from the
run's ``seed``, the round and its own key (so the same site draws the same in every
engine, whichever others were asked):

- **offline**, with chance 1 - a (``simulated-availability`` = a): its message is never
  delivered, and no reply comes, as from a device that is not connected;
- **late**, with chance s (``simulated-stragglers``) when online: its message is
  delivered, the site runs its task and replies (what it sends leaves the site, and
  counts against its own policies), and the reply is dropped as arriving after the
  round's deadline, as ``round-timeout`` drops a late reply in a deployment, without
  the wait;
- answers, otherwise.

The strategy then sees what a deployed server sees: the replies of the sites that
answered, none from the others; it reduces a partial round as it reduces a fraction-C
sample (``docs/explanation/algorithms.md``). A simulated absence is not a site failure
(``site-failures`` keeps the real ones): the round's history row counts it in
``sites-offline`` or ``sites-late``, and ``answered`` names the sites that answered.

The draw is the ServerApp's (``workflow.fit_round``), so ``flwr run`` on Flower's
simulation engine and the in-process harness give the same rounds. Only training rounds:
the describe handshake, the preparation rounds (impute, stats: a site that misses them
leaves the run), the initialisation and the evaluation and profile rounds (the exact
pooled score over every site, which makes runs comparable) reach every site.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from fedcluster.common.config import RunConfig


@dataclass(frozen=True)
class Absent:
    """The node ids of a round's asked sites that are offline and that answer late."""

    offline: frozenset[int] = frozenset()
    late: frozenset[int] = frozenset()


NOBODY = Absent()


def site_draw(seed: int, round_number: int, key: str) -> tuple[float, float]:
    """Two uniform numbers in [0, 1) for site ``key`` in round ``round_number``: whether it
    is online, and whether its reply is late. A hash of the three (BLAKE2b), so a site's
    draw does not depend on which other sites were asked, nor on the process."""
    digest = hashlib.blake2b(f"{seed}\0{round_number}\0{key}".encode(),
                             digest_size=16, person=b"fedcluster-devs").digest()
    return (int.from_bytes(digest[:8], "little") / 2**64,
            int.from_bytes(digest[8:], "little") / 2**64)


def draw(config: RunConfig, round_number: int, keys: dict[int, str]) -> Absent:
    """Which of a training round's asked sites (node id -> site key) are offline and
    which answer late (module docstring); nobody without ``simulated-*``."""
    if not config.simulates_devices:
        return NOBODY
    offline, late = set(), set()
    for node_id, key in keys.items():
        online, slow = site_draw(config.seed, round_number, key)
        if online >= config.simulated_availability:
            offline.add(node_id)
        elif slow < config.simulated_stragglers:
            late.add(node_id)
    return Absent(frozenset(offline), frozenset(late))

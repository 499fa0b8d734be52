"""A no-op Flower app: Flower's own cost per round on a federation (bench/deployment.py).

The ServerApp sends one message to each of ``min-sites`` sites per round and waits for
the replies with the same short-poll loop as fedcluster's ServerApp
(``fedcluster.server_app.polling.exchange``; Flower's ``send_and_receive`` would add up to
3 s of its own sleep), logging ``noop round N: S s``. The ClientApp replies at once and
imports nothing but Flower: its process start, Flower's imports, the SuperNode's and the
SuperExec's polling and the transport are the whole round.
"""

from __future__ import annotations

import logging
import time

from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.app.message_type import MessageType
from flwr.clientapp import ClientApp
from flwr.common.logger import log
from flwr.serverapp import Grid, ServerApp

server = ServerApp()
client = ClientApp()


@server.main()
def main(grid: Grid, context: Context) -> None:
    from fedcluster.server_app.polling import exchange  # the ServerApp's only, as fedcluster's

    rounds, sites = int(context.run_config["num-rounds"]), int(context.run_config["min-sites"])
    while len(nodes := sorted(grid.get_node_ids())) < sites:
        time.sleep(0.2)
    for server_round in range(1, rounds + 1):
        messages = [Message(RecordDict({"config": ConfigRecord({"round": server_round})}),
                            dst_node_id=node, message_type=MessageType.TRAIN,
                            group_id=str(server_round))
                    for node in nodes[:sites]]
        started = time.perf_counter()
        replies = exchange(grid, messages, 120.0)
        seconds = time.perf_counter() - started
        log(logging.INFO, "noop round %d: %.3f s (%d replies)", server_round, seconds, len(replies))


@client.train()
def reply(msg: Message, context: Context) -> Message:
    return Message(RecordDict({"metrics": MetricRecord({"ok": 1})}), reply_to=msg)

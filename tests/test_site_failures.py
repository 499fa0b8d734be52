"""Failures are named by the site they concern, however they arrive. The SuperLink itself
answers for a site it considers gone (no heartbeat): that error reply comes from the
SuperLink's node id, not the site's, and must still be put down to the site."""

from __future__ import annotations

from flwr.app import Error, Message
from flwr.common.constant import SUPERLINK_NODE_ID, ErrorCode

import fedcluster
from fedcluster import simulation
from fedcluster.common.datasets import load_builtin, partition

GONE = "Error: Node Unavailable - the destination node failed to report a heartbeat"


class SuperLinkAnswersForSiteTwo(simulation.InProcessGrid):
    """From the third round on, site 2's replies are the SuperLink's unavailability error."""

    rounds = 0

    def push_messages(self, messages):
        SuperLinkAnswersForSiteTwo.rounds += 1  # the server pushes once per round
        return super().push_messages(messages)

    def pull_messages(self, message_ids):
        asked = {mid: self._inbox[mid] for mid in message_ids if mid in self._inbox}
        replies = list(super().pull_messages(message_ids))
        if SuperLinkAnswersForSiteTwo.rounds < 3:
            return replies
        out = []
        for reply in replies:
            instruction = asked[reply.metadata.reply_to_message_id]
            config = self.contexts[instruction.metadata.dst_node_id].node_config
            if str(config["data-path"]).endswith("/2"):
                reply = Message(Error(ErrorCode.NODE_UNAVAILABLE, GONE), reply_to=instruction)
                reply.metadata.__dict__["_src_node_id"] = SUPERLINK_NODE_ID
            out.append(reply)
        return out


def test_superlink_error_for_a_gone_site_names_that_site(monkeypatch):
    X, y = load_builtin("blobs", seed=3)
    sites = [X[rows] for rows in partition(y, 4, "iid", seed=3)]
    monkeypatch.setattr(simulation, "InProcessGrid", SuperLinkAnswersForSiteTwo)
    result = fedcluster.simulate(sites, n_clusters=4, num_rounds=4, tol=0.0, min_sites=3, every_site=False,
                                 init="random", seed=3)
    failures = result.metrics["site-failures"]
    assert list(failures) == ["2"], failures  # not "node-1" (the SuperLink's id)
    assert all("Node Unavailable" in event for event in failures["2"])
    assert sorted(result.metrics["per-site"]) == ["0", "1", "3"]

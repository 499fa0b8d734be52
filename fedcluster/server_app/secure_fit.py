"""The server's half of SecAgg+: the fit workflow that runs Flower's ``SecAggPlusWorkflow``
for the rounds whose task is a sum (``common.secure_codec`` has the encoding and its
error bounds) and the plain round for every other phase.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from flwr.common.logger import log

from fedcluster.server_app.polling import FastPollGrid
from fedcluster.common.secure_codec import CLIP, MODULUS, WEIGHT
from fedcluster.strategies.errors import FederationError


def make_fit_workflow(config, plain_round: Callable) -> Callable:
    """The fit workflow of a run: ``plain_round`` or, with ``secure-aggregation``,
    Flower's SecAgg+ workflow for the rounds whose task is a sum."""
    if not config.secure_aggregation:
        return plain_round
    from flwr.server.workflow import SecAggPlusWorkflow

    secagg = SecAggPlusWorkflow(
        num_shares=float(config.secagg_num_shares),
        reconstruction_threshold=float(config.secagg_reconstruction_threshold),
        max_weight=float(WEIGHT),
        clipping_range=CLIP,
        quantization_range=int(config.secagg_quantization_range),
        modulus_range=MODULUS,
        timeout=float(config.round_timeout),
    )

    def fit(grid, context) -> None:
        strategy = context.strategy.run  # the FlowerAdapter's run
        if not strategy.is_secure_round():
            plain_round(grid, context)
            return
        rows_before = len(strategy.history)
        # Flower's workflow waits through send_and_receive (3 s pulls): give it the short poll
        secagg(FastPollGrid(grid), context)
        if len(strategy.history) == rows_before:  # SecAgg+ halted before aggregate_fit
            log(logging.ERROR, "secure aggregation halted in phase %s", strategy.phase)
            raise FederationError(
                f"secure aggregation halted ({strategy.phase} round): fewer than 2 sites, or "
                "too few sites answered to reach the reconstruction threshold "
                "(secagg-reconstruction-threshold); see the log above")

    return fit

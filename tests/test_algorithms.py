"""The algorithm cards (common/algorithms.py) are the one source of the per-algorithm rules:
the config's allowed values, the strategy registry and the site policy derive from them."""

from __future__ import annotations

import re
import typing

import pytest

from fedcluster.common import algorithms, config
from fedcluster.common.config import ConfigError, RunConfig, parse_run_config
from fedcluster.strategies import STRATEGIES, make_strategy
from fedcluster.strategies.base import ClusteringStrategy


def test_every_card_has_a_strategy_and_every_strategy_a_card():
    assert set(STRATEGIES) == set(algorithms.CARDS)
    assert typing.get_args(RunConfig.model_fields["algorithm"].annotation) == algorithms.ALGORITHMS


@pytest.mark.parametrize("name", algorithms.ALGORITHMS)
def test_a_card_makes_its_strategy_and_its_rules_hold(name):
    card = algorithms.CARDS[name]
    assert card.default_init in card.allowed_init
    strategy = make_strategy(parse_run_config({"algorithm": name}))
    assert isinstance(strategy, ClusteringStrategy)
    assert strategy.config.resolved_init == card.default_init
    refused = [init for init in ("kfed", "random", "kmeans++") if init not in card.allowed_init]
    for init in refused:
        with pytest.raises(ConfigError, match=re.escape(f"init '{init}' does not apply")):
            parse_run_config({"algorithm": name, "init": init})
    if card.secure_refused:
        with pytest.raises(ConfigError, match="secure-aggregation"):
            parse_run_config({"algorithm": name, "secure-aggregation": True})
    assert config.DP_REFUSED.get(name) == card.dp_refused


def test_an_unknown_algorithm_is_refused_naming_the_known_ones():
    with pytest.raises(ConfigError, match="algorithm"):
        parse_run_config({"algorithm": "kmedoids"})

"""The server's side of differential privacy and ``data-bounds``: the clipping box,
the task parameters that carry the budget to the sites, the accounting of what a run
spent, and what the model reports (README "Differential privacy").

The box: ``data-bounds`` when given (declared, no data round). A DP run without it takes
the box from a ``bounds`` round (per-site minima and maxima, sent without noise) and
warns with :class:`~fedcluster.common.privacy.PrivacyLeakWarning`, as diffprivlib does:
those bounds disclose the sites' extreme values outside the DP guarantee.

The budget: ``dp-epsilon``/``dp-delta`` for the WHOLE run, turned into rho-zCDP and split
equally over the most data rounds the run can take (``privacy.data_rounds``), fixed up
front from ``num-rounds``, ``eval-every`` and ``n-init``. A run that stops early (on
``tol``) spends less; the model reports what was spent, for every site (a site not
sampled in a round spends nothing in it; the figure is the worst case).
"""

from __future__ import annotations

import logging
import warnings

import numpy as np
from flwr.common.logger import log

from fedcluster.common import privacy
from fedcluster.common.config import RunConfig

#: Server tasks that release noised data under DP (and count against the budget).
NOISED_TASKS = ("lloyd", "evaluate")
#: Tasks that carry the DP parameters (the distances round answers zeros under DP).
DP_PARAM_TASKS = ("lloyd", "evaluate", "evaluate_distances")
#: Metrics computed from figures a site does not send under DP (they would be wrong).
NOT_RELEASED = ("simplified-silhouette", "davies-bouldin", "calinski-harabasz", "ari", "nmi",
                "v-measure", "homogeneity", "completeness", "accuracy")


def rho_per_round(config: RunConfig) -> float:
    """This run's zCDP share per data round (0 without DP)."""
    if not config.private:
        return 0.0
    rounds = privacy.data_rounds(config.num_rounds, config.eval_every, config.n_init)
    return privacy.rho_per_round(config.dp_epsilon, config.dp_delta, rounds)


def declared_box(config: RunConfig, n_features: int) -> tuple[np.ndarray, np.ndarray] | None:
    """``data-bounds`` for the federation's width (None when not given)."""
    parsed = privacy.parse_data_bounds(config.data_bounds)
    if parsed is None:
        return None
    try:
        return privacy.bounds_for(parsed, n_features)
    except ValueError as err:
        from fedcluster.strategies.base import FederationError

        raise FederationError(f"run-config key 'data-bounds' {err}") from None


def box_from_data(mins: np.ndarray, maxs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The box of the sites' own minima and maxima, with the leak warned about. A
    feature whose range is a single value gets a width of 1 (the box must have
    positive width for the means to be clipped into it)."""
    lo, hi = np.min(mins, axis=0), np.max(maxs, axis=0)
    hi = np.where(hi > lo, hi, lo + 1.0)
    message = ("dp-epsilon without data-bounds: the clipping box was computed from the sites' "
               "data (their per-feature minima and maxima, sent without noise), which leaks "
               "privacy outside the DP guarantee; give data-bounds from domain knowledge")
    warnings.warn(message, privacy.PrivacyLeakWarning, stacklevel=2)
    log(logging.WARNING, "%s", message)
    return lo, hi


def task_params(strategy, task: str, server_round: int) -> dict:
    """The parameters a round adds to the task: ``data-bounds`` (every task but
    ``describe`` and ``stats``, when the box is known) and, under DP, ``dp-rho``,
    ``dp-noise-share`` (1: local DP) and ``dp-round`` (names the round; the noise seed
    in simulation)."""
    if task in ("describe", "stats", "bounds") or strategy.box is None:
        if strategy.config.private and task in DP_PARAM_TASKS:
            raise RuntimeError(f"a DP {task} round without a clipping box")
        return {}
    out = {"data-bounds": privacy.encode_bounds(*strategy.box)}
    if strategy.config.private and task in DP_PARAM_TASKS:
        out.update({"dp-rho": strategy.dp_rho_round, "dp-noise-share": 1.0,
                    "dp-round": server_round + strategy.round_offset})
    return out


def accounting(config: RunConfig, history: list[dict], box, bounds_from_data: bool) -> dict:
    """The model's DP metrics: the budget, what was spent over the rounds run, the
    noise of one training round; empty without DP."""
    if not config.private:
        return {}
    rho_round = rho_per_round(config)
    rounds_run = sum(1 for row in history if row["task"] in NOISED_TASKS)
    out = {"dp-epsilon": config.dp_epsilon, "dp-delta": config.dp_delta,
           "dp-rho-per-round": rho_round,
           "dp-rounds-planned": privacy.data_rounds(config.num_rounds, config.eval_every,
                                                     config.n_init),
           **privacy.spent(rho_round, rounds_run, config.dp_delta),
           "dp-bounds-from-data": bounds_from_data}
    if box is not None:
        out["dp-sigma-sums"] = privacy.sums_counts_sigma(box[0], box[1], rho_round)
        out["dp-sigma-counts"] = out["dp-sigma-sums"] * 2.0 / privacy.l2_diameter(*box)
    return out


def round_accounting(config: RunConfig, history: list[dict]) -> dict:
    """The epsilon spent up to the round just added to ``history`` (a history column
    under DP, shown in the progress line); empty without DP."""
    if not config.private:
        return {}
    rounds_run = sum(1 for row in history if row["task"] in NOISED_TASKS)
    return {"dp-epsilon-spent": privacy.spent(rho_per_round(config), rounds_run,
                                              config.dp_delta)["dp-epsilon-spent"]}


def private_metrics(config: RunConfig, metrics: dict) -> dict:
    """Under DP, the model's metrics without those the sites did not release."""
    if not config.private:
        return metrics
    return {key: value for key, value in metrics.items() if key not in NOT_RELEASED}

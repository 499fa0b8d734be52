"""The server's side of differential privacy and ``data-bounds``: the clipping box,
the task parameters that carry the budget to the sites, the accounting of what a run
spent, and what the model reports (docs/how-to/differential-privacy.md).

The box: ``data-bounds`` when given (declared, no data round). A DP run without it takes
the box from a ``bounds`` round (per-site minima and maxima, sent without noise) and
warns with :class:`~fedcluster.common.privacy.PrivacyLeakWarning`, as diffprivlib does:
those bounds disclose the sites' extreme values outside the DP guarantee.

The budget: ``dp-epsilon``/``dp-delta`` for the WHOLE run, turned into rho-zCDP and split
equally over the most data rounds the run can take (``privacy.data_rounds``), fixed up
front from ``num-rounds``, ``eval-every`` and ``n-init``. A run that stops early (on
``tol``) spends less; the model reports what was spent, for every site (a site not
sampled in a round spends nothing in it; the figure is the worst case).

The mode: *local* DP (each site adds the full noise sigma and post-processes its own
release) or, with ``secure-aggregation``, *distributed* DP: each site adds the share
sigma / sqrt(t) (``noise_share``; t the sites SecAgg+ needs to form the sum at all) and
sends its noisy statistics raw; the server widens the agreed scales by a noise margin
(``secure_scales``) and post-processes the decoded SUM (``release_sum``): the sum of at
least t shares carries noise of std at least sigma, so it is as private as one site's
local-DP release, and the accounting is the same.
"""

from __future__ import annotations

import logging
import math
import warnings

import numpy as np
from flwr.common.logger import log

from fedcluster.common import secure_codec as secure
from fedcluster.common import privacy, protocol
from fedcluster.common.config import RunConfig
from fedcluster.strategies import divisive
from fedcluster.strategies.errors import FederationError

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
    rounds = privacy.data_rounds(config.num_rounds, config.eval_every, config.n_init,
                                 start_rounds(config))
    return privacy.rho_per_round(config.dp_epsilon, config.dp_delta, rounds)


def start_rounds(config: RunConfig) -> int:
    """The noised rounds of a repetition's start: the divisive start's Lloyd rounds."""
    return divisive.start_rounds(config.n_clusters) if config.resolved_init == "divisive" else 0


def declared_box(config: RunConfig, n_features: int) -> tuple[np.ndarray, np.ndarray] | None:
    """``data-bounds`` for the federation's width (None when not given)."""
    parsed = privacy.parse_data_bounds(config.data_bounds)
    if parsed is None:
        return None
    try:
        return privacy.bounds_for(parsed, n_features)
    except ValueError as err:
        raise FederationError(f"run-config key 'data-bounds' {err}") from None


def check_start(config: RunConfig, box, start) -> None:
    """A DP run without ``data-bounds`` takes its clipping box from a ``bounds`` round in
    the init phase, which a run from given centroids (``start``) skips: FederationError."""
    if config.private and box is None and start is not None:
        raise FederationError(
            "dp-epsilon without data-bounds takes the clipping box from a bounds round at "
            "the start, which a run from given centroids skips; set data-bounds")


def box_from_data(config: RunConfig, mins: np.ndarray,
                  maxs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The box of the sites' own minima and maxima, with the leak warned about. A
    feature whose range is a single value gets a width of 1 (the box must have
    positive width for the means to be clipped into it).

    Raises
    ------
    FederationError
        Under distributed DP, when the box does not lie within [-secagg-data-bound,
        secagg-data-bound] (``privacy.box_within``; a declared box is checked with the
        run config).
    """
    lo, hi = np.min(mins, axis=0), np.max(maxs, axis=0)
    hi = np.where(hi > lo, hi, lo + 1.0)
    bound = config.secagg_data_bound
    if config.secure_aggregation and not privacy.box_within(lo, hi, bound):
        raise FederationError(f"the sites' data (the clipping box from the bounds round) reaches "
                              f"beyond secagg-data-bound {bound:g}; raise 'secagg-data-bound' "
                              f"or give data-bounds")
    warn_leak("dp-epsilon without data-bounds: the clipping box was computed from the sites' "
              "data (the per-feature extremes of their groups' means, sent without noise), "
              "which leaks privacy outside the DP guarantee; give data-bounds from domain "
              "knowledge")
    return lo, hi


def warn_extremes(sites, what: str) -> None:
    """Per-feature minima and maxima (``what`` sent them) are the extremes of each site's
    groups' means, each a mean of at least its min-cluster-size rows, as every reply is;
    a site that answers from its rows (min-cluster-size 1) sent single values: say so
    (``sites``: the admitted sites, in site order)."""
    from_rows = [site.key for site in sites if site.group_size in (None, 1)]
    if from_rows:
        warn_leak(f"{what}: site(s) {', '.join(from_rows)} answer from their rows (min-cluster-"
                  "size 1), so their per-feature minima and maxima are single values of their "
                  "data; scale 'standard' and init 'kfed' or 'divisive' send sums only")


def warn_leak(message: str) -> None:
    """Say that a round disclosed something outside a guarantee (values outside DP, or
    single values of a site that answers from its rows): a PrivacyLeakWarning for the
    caller of ``fedcluster.simulate`` and a warning in the server's log."""
    warnings.warn(message, privacy.PrivacyLeakWarning, stacklevel=3)
    log(logging.WARNING, "%s", message)


def dp_mode(config: RunConfig) -> str:
    """``distributed`` (with secure aggregation) or ``local`` DP."""
    return "distributed" if config.secure_aggregation else "local"


def noise_share(config: RunConfig, n_sites: int) -> float:
    """The share of sigma each of a round's ``n_sites`` sites adds: 1 for local DP;
    1 / sqrt(t) for distributed DP, t the sites that must contribute for SecAgg+ to form
    the sum (``secure.reconstruction_threshold``). A formed sum of m >= t shares then
    has noise of std sigma sqrt(m / t) >= sigma."""
    if not config.secure_aggregation:
        return 1.0
    t = secure.reconstruction_threshold(n_sites, config.secagg_num_shares,
                                        config.secagg_reconstruction_threshold)
    return 1.0 / math.sqrt(t)


def task_params(facts, task: str, server_round: int, n_sites: int) -> dict:
    """The parameters a round of ``n_sites`` sites adds to the task: ``data-bounds``
    (every task but ``describe`` and ``stats``, when the box is known) and, under DP,
    ``dp-rho``, ``dp-rho-planned`` (the whole run's budget, for a site's ``dp-budget``),
    ``dp-noise-share`` (``noise_share``; a site charges its budget rho / share^2, the
    zCDP of its own noise, ``privacy.own_noise_rho``) and ``dp-round`` (names the round;
    the noise seed in simulation). ``describe`` carries the planned rho and the share."""
    if task == "describe" and facts.config.private:  # a site's dp-budget checks it
        # and the share the site would add if every site asked took part (a site charges
        # its own noise, planned rho / share^2; fewer sites give a larger share)
        return {protocol.DP_RHO_PLANNED: privacy.rho_from_epsilon(facts.config.dp_epsilon,
                                                                  facts.config.dp_delta),
                "dp-noise-share": noise_share(facts.config, n_sites)}
    if task in ("describe", "stats", "bounds") or facts.box is None:
        if facts.config.private and task in DP_PARAM_TASKS:
            raise RuntimeError(f"a DP {task} round without a clipping box")
        return {}
    out = {"data-bounds": privacy.encode_bounds(*facts.box)}
    if facts.config.private and task in DP_PARAM_TASKS:
        out.update({protocol.DP_RHO: facts.dp_rho_round,
                    protocol.DP_RHO_PLANNED: privacy.rho_from_epsilon(facts.config.dp_epsilon,
                                                                      facts.config.dp_delta),
                    "dp-noise-share": noise_share(facts.config, n_sites),
                    "dp-round": server_round + facts.round_offset})
    return out


# ------------------------------------------------------------- distributed DP
def noise_sigmas(task: str, box, rho: float) -> dict[str, float]:
    """The std of the whole noise (sigma, before the sites' shares) per entry of each
    noisy term of a DP task, by term name (``fedcluster.common.secure_codec``); the site draws it in
    ``common/private_tasks.py`` from the same functions."""
    if task == "lloyd":
        sigma_sums, sigma_counts = privacy.sums_counts_sigmas(*box, rho)
        return {"wc": sigma_sums, "w-int": sigma_counts}
    if task == "evaluate":
        sigma_counts, sigma_sse, _ = privacy.evaluation_sigmas(*box, rho)
        return {"counts": sigma_counts, "sse": sigma_sse}
    return {}


def secure_scales(facts, task: str, names: list[str], scales: list[float],
                  n_sites: int) -> list[float]:
    """The agreed scales of a secure round, under distributed DP widened by
    ``secure.NOISE_MARGIN`` standard deviations of one site's share of the noise (a
    site's noisy term exceeds its data bound by the noise), unchanged otherwise. The box
    lies within the data bound (checked once, when it is set: the run config for
    ``data-bounds``, ``box_from_data`` for a box from the data)."""
    if not facts.config.private:
        return scales
    sigmas = noise_sigmas(task, facts.box, facts.dp_rho_round)
    margin = secure.NOISE_MARGIN * noise_share(facts.config, n_sites)
    return [scale + margin * sigmas.get(name, 0.0) for name, scale in zip(names, scales)]


def release_sum(task: str, sums: dict, n_rows: int, floor: int, box,
                centroids: np.ndarray) -> tuple[tuple, dict]:
    """The reply (arrays, metrics) that stands for a distributed-DP round's decoded
    noisy SUM over sites with ``n_rows`` rows, post-processed as a local-DP site does
    its own release (free under DP): counts rounded, clamped at 0, scaled to at most
    ``n_rows`` and the privacy floor applied to the noisy aggregate; means = noisy
    centred sums / counts + the box's centre, clipped into the box, a withheld or empty
    cluster keeping its ``centroids`` row; the SSE clamped at 0; what a site does not
    release under DP (sums, squared norms, hidden flags, silhouette) zeros."""
    if task == "lloyd":
        counts = privacy.release_counts(sums["w-int"], n_rows, floor)
        return protocol.ClusterMeans(privacy.release_means(sums["wc"], counts, *box, centroids), counts), {}
    if task == "evaluate":
        counts = privacy.release_counts(sums["counts"], n_rows, floor)
        return privacy.evaluation_reply(counts, max(float(sums["sse"][0]), 0.0),
                                        np.shape(centroids)[1])
    return protocol.Distances(sums["distances"]), {}


def accounting(config: RunConfig, history: list[dict], box, bounds_from_data: bool) -> dict:
    """The model's DP metrics: the budget, what was spent over the rounds run, the
    noise of one training round; empty without DP."""
    if not config.private:
        return {}
    rho_round = rho_per_round(config)
    rounds_run = sum(1 for row in history if row["task"] in NOISED_TASKS)
    out = {"dp-epsilon": config.dp_epsilon, "dp-delta": config.dp_delta,
           "dp-mode": dp_mode(config), "dp-rho-per-round": rho_round,
           "dp-rounds-planned": privacy.data_rounds(config.num_rounds, config.eval_every,
                                                     config.n_init, start_rounds(config)),
           **privacy.spent(rho_round, rounds_run, config.dp_delta),
           "dp-bounds-from-data": bounds_from_data}
    if box is not None:
        out["dp-sigma-sums"], out["dp-sigma-counts"] = privacy.sums_counts_sigmas(*box, rho_round)
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

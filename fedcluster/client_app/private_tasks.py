"""The site tasks under differential privacy (``dp-epsilon`` > 0;
docs/how-to/differential-privacy.md; the maths in ``common/privacy.py``).

The server sends, with every task of a DP run, ``data-bounds`` (the clipping box),
``dp-rho`` (this round's zCDP share of the run's budget) and ``dp-noise-share`` (1 for
local DP). These tasks answer from the site's ROWS, clipped to the box
(``private_rows.py``: the one way a task reaches rows, and why: every other task
answers from the site's groups, and a grouping made from all the rows has no bounded
sensitivity to one of them), compute sigma ITSELF from the box and ``dp-rho`` and add
the noise before anything leaves the site. The ClientApp charges each noised task to
the site's own ``dp-budget`` first (``privacy_budget.py``: the zCDP of the site's own
noise, ``privacy.own_noise_rho``) and refuses what does not fit, so neither ``dp-rho``
nor ``dp-noise-share`` sets the noise below what the site's remaining budget allows.
Only these tasks run under DP:

``lloyd`` (DWF/EWF, ``local-iters`` 1)
    Per-cluster sums and counts against the received centroids, noised jointly (L2
    sensitivity = the box's diameter), post-processed into the ordinary reply
    [means (k, d), counts (k,)]: counts rounded, clamped at 0 and to the site's size,
    the privacy floor applied to the NOISY counts, means clipped into the box. No SSE
    is sent.
``evaluate``
    Per-cluster counts and the SSE (each row's term capped at D^2), noised jointly;
    sums, squared norms, the silhouette and the labels' contingency table are NOT sent
    (zeros), so under DP the run reports the score and the cluster sizes only.
``evaluate_distances``
    Zeros, without touching the data (Davies-Bouldin is not computed under DP).
``describe``, ``bounds``
    As without DP, from the groups: the size and width are public; ``bounds`` (sent only
    when the run has no ``data-bounds``) discloses the per-feature extremes of the
    groups' means outside the DP guarantee, and the server says so with a
    PrivacyLeakWarning.

Distributed DP (the task also carries ``secure``: the round is a SecAgg+ sum). The site
adds only its share of the noise, ``dp-noise-share`` x sigma with the share 1/sqrt(t) (t
the sites that must contribute for the sum to be formed; its budget is charged
``dp-rho`` / share^2, what that share alone gives), and sends its noisy statistics RAW: the centred per-cluster sums and counts of ``lloyd`` as the terms ``wc`` and
``w-int``, the per-cluster counts and SSE of ``evaluate``. No rounding, clamping, floor or
mean at the site: each of those is a nonlinear step on a value that carries only this
site's share of the noise, and the sum of such steps is not the sum plus the full noise,
so the guarantee would fall to that of one share (sigma / sqrt(t)). The server
post-processes the SUM instead (``strategies/private.py``), which is free under DP.

Every other task is refused: its reply is not a sum of bounded per-row terms with a
known sensitivity (see ``RunConfig``'s check for the reasons per algorithm).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedcluster.common import secure_codec as secure
from fedcluster.common import privacy, protocol
from fedcluster.client_app.private_rows import ClippedRows
from fedcluster.client_app.site_groups import SiteGroups
from fedcluster.client_app.task_io import TaskError, TaskReply, received_centroids, task_param


@dataclass(frozen=True)
class SitePrivacy:
    """This round's DP parameters, as the site reads them from the task."""

    rho: float
    lo: np.ndarray
    hi: np.ndarray
    noise_share: float = 1.0


def task_privacy(params: dict, n_features: int) -> SitePrivacy | None:
    """The DP parameters of a task (None when the run is not private).

    Raises
    ------
    TaskError
        When ``dp-rho`` is given without ``data-bounds``, or a value is out of range.
    """
    if "dp-rho" not in params:
        return None
    rho, share = task_rho(params)
    box = site_bounds(params, n_features)
    if box is None:
        raise TaskError("task parameter 'data-bounds' is missing: a DP task needs the clipping box")
    return SitePrivacy(rho, box[0], box[1], share)


def task_rho(params: dict) -> tuple[float, float]:
    """A DP task's ``dp-rho`` and ``dp-noise-share`` (1 when not sent), checked.

    Raises
    ------
    TaskError
        When ``dp-rho`` is not > 0 or the share not in (0, 1].
    """
    rho = task_param(params, "dp-rho", float)
    if not rho > 0:
        raise TaskError(f"bad DP parameter: dp-rho {rho}")
    return rho, task_noise_share(params)


def task_noise_share(params: dict) -> float:
    """A task's ``dp-noise-share`` (1 when not sent: local DP), checked (TaskError when
    not in (0, 1])."""
    share = task_param(params, "dp-noise-share", float, default=1.0)
    if not 0 < share <= 1:
        raise TaskError(f"bad DP parameter: dp-noise-share {share}")
    return share


def site_bounds(params: dict, n_features: int) -> tuple[np.ndarray, np.ndarray] | None:
    """The clipping box of ``data-bounds`` for this site's width (None when absent)."""
    if not params.get("data-bounds"):
        return None
    try:
        parsed = privacy.parse_data_bounds(str(params["data-bounds"]))
        return privacy.bounds_for(parsed, n_features)
    except ValueError as err:
        raise TaskError(f"task parameter 'data-bounds': {err}") from None


def private_lloyd(site: SiteGroups, rows: ClippedRows, arrays, params, floor: int,
                  dp: SitePrivacy, rng: np.random.Generator) -> TaskReply:
    C = received_centroids(arrays.centroids, site)
    local_iters = task_param(params, "local-iters", int)
    if local_iters != 1:
        raise TaskError(f"under DP the lloyd task needs local-iters 1, got {local_iters}")
    sums, counts = rows.cluster_sums(C)
    sigma = privacy.sums_counts_sigma(dp.lo, dp.hi, dp.rho)
    noisy_sums, noisy_counts = privacy.noisy_sums_counts(
        sums, counts, dp.lo, dp.hi, sigma, rng, dp.noise_share)
    if secure.SECURE_PARAM in params:  # distributed DP: linear, the server post-processes
        return TaskReply(terms={"wc": noisy_sums, "w-int": noisy_counts})
    released = privacy.release_counts(noisy_counts, site.n_rows, floor)
    means = privacy.release_means(noisy_sums, released, dp.lo, dp.hi, C)
    return TaskReply(arrays=protocol.ClusterMeans(means, released))


def private_evaluate(site: SiteGroups, rows: ClippedRows, arrays, params, floor: int,
                     dp: SitePrivacy, rng: np.random.Generator) -> TaskReply:
    C = received_centroids(arrays.centroids, site)
    k = C.shape[0]
    sigma_counts, sigma_sse, cap = privacy.evaluation_sigmas(dp.lo, dp.hi, dp.rho)
    counts, sse = rows.cluster_counts_and_sse(C, cap)
    noisy_counts = counts + rng.normal(0.0, dp.noise_share * sigma_counts, size=k)
    noisy_sse = sse + rng.normal(0.0, dp.noise_share * sigma_sse)
    if secure.SECURE_PARAM in params:  # distributed DP: linear, the server post-processes
        return TaskReply(*privacy.evaluation_reply(noisy_counts, noisy_sse, site.n_features))
    released = privacy.release_counts(noisy_counts, site.n_rows, floor)
    hidden = (released == 0) & (np.rint(noisy_counts) >= 1)
    return TaskReply(*privacy.evaluation_reply(released, max(noisy_sse, 0.0), site.n_features,
                                               hidden))


def private_distances(site: SiteGroups, rows: ClippedRows, arrays, params, floor: int,
                      dp: SitePrivacy, rng: np.random.Generator) -> TaskReply:
    C = received_centroids(arrays.centroids, site)
    return TaskReply(arrays=protocol.Distances(np.zeros(C.shape[0])))


#: The tasks whose reply is noised, each spending its ``dp-rho`` of the run's budget (and
#: of a site's ``dp-budget``); ``evaluate_distances`` answers zeros and spends nothing.
SPENDING_TASKS = ("lloyd", "evaluate")

PRIVATE_TASKS = {
    "lloyd": private_lloyd,
    "evaluate": private_evaluate,
    "evaluate_distances": private_distances,
}


def run_private(name: str, site: SiteGroups, rows, arrays, params, floor: int,
                dp: SitePrivacy, rng: np.random.Generator):
    """The DP version of task ``name``; None for the tasks that run unchanged on the
    groups (``describe``, ``bounds``). Refuses every task outside ``protocol.DP_TASKS``.
    ``rows``: a callable giving the site's :class:`ClippedRows` (made only when used)."""
    if name not in protocol.DP_TASKS:
        raise TaskError(f"task {name!r} has no differentially private version; under "
                        f"dp-epsilon a site runs only {', '.join(protocol.DP_TASKS)}")
    fn = PRIVATE_TASKS.get(name)
    return None if fn is None else fn(site, rows(), arrays, params, floor, dp, rng)

"""A coordinator against a site's real ClientApp under differential privacy (issue 43,
must-show 1): DP answers only within the site's own budget.

A DP task answers from the site's clipped ROWS with the noise its ``dp-rho`` implies
(under SecAgg+ distributed DP: ``dp-noise-share`` of it), and both are the coordinator's
to choose. A coordinator that sends ``dp-rho = 1e24`` with a wide ``data-bounds`` runs the
binary search of ``test_attacks.py`` (two centroids mirrored about a plane) on
noiseless rows. Under SecAgg+ it sends an honest ``dp-rho`` and a tiny share instead,
and reads the site's terms as if it colluded with (or ran) every other summed site,
which SecAgg+ does not stop; here it reads them in the clear, before SecAgg+'s
quantisation: a stronger coordinator than a real one.

Each attack first recovers a row to 1e-6 from a site whose own ``dp-budget`` is large
enough (so the test can fail); a site at its DEFAULT budget (epsilon 10 at delta 1e-5,
rho-zCDP 1.55) refuses it, naming ``dp-budget`` and what is left. Then the best-placed
coordinator within the default budget: it knows every other row (DP's adversary), puts
the target in a cluster with rows whose sum it knows and spends the whole budget on
that one release. Its error per coordinate has standard deviation Delta / sqrt(2 rho),
Delta the box's L2 diameter D, the bound the node-config reference states; every
further DP task is refused. The same under ``require-dp`` and for SecAgg+ rounds.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from fedcluster.client_app import privacy_budget
from fedcluster.client_app.node_config import DEFAULT_DP_BUDGET
from fedcluster.common import privacy
from fedcluster.common import secure_codec as secure
from test_docs import same_words, shown
from test_attacks import binary_search, is_row, site_factory, site_rows  # noqa: F401 (fixture)

WIDE = "-1000:1000"  # a box no row reaches: nothing is clipped
LARGE_BUDGET = "1e30"  # a site that explicitly allows the attack (so the test can fail)
DEFAULT_RHO = privacy_budget.Budget(*DEFAULT_DP_BUDGET).rho  # 1.55


class DPTasks:
    """The coordinator's ``lloyd`` tasks to one site, each with these DP parameters."""

    def __init__(self, site, **dp) -> None:
        self.site, self.dp = site, dp

    @property
    def messages(self) -> int:
        return self.site.messages

    def sums(self, C: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per cluster, the released sums (k, d) and counts (k,)."""
        means, counts, _ = self.site.lloyd(C, **self.dp)
        return means * counts[:, None], counts

    def lloyd(self, C: np.ndarray):
        """As ``Coordinator.lloyd`` (for ``binary_search``)."""
        sums, counts = self.sums(C)
        return sums / np.maximum(counts, 1)[:, None], counts, np.nan


class SecureTasks(DPTasks):
    """Distributed-DP ``lloyd`` tasks, sent with the secure parameter as the site receives
    it in a SecAgg+ round (terms ``wc``, ``w-int``; ``clip`` as a DP run asks); the reply
    is the site's encoded terms, which the coordinator learns in the clear when it
    colludes with every other site of the sum."""

    SCALES = [1e4, 1e3]  # |a centred sum| < 400 x 4, a count <= 400: nothing is clipped

    def sums(self, C: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        request = {"terms": ["wc", "w-int"], "scales": self.SCALES, "clip": True}
        (wc, counts), _ = self.site.ask("lloyd", [C], **{
            "local-iters": 1, "tol": 0.0, **self.dp, secure.SECURE_PARAM: json.dumps(request)})
        lo, hi = privacy.parse_data_bounds(self.dp["data-bounds"])
        centre = float((lo[0] + hi[0]) / 2)  # (one range for every feature here)
        counts = counts * self.SCALES[1]
        return wc * self.SCALES[0] + counts[:, None] * centre, np.rint(counts)


def plane(b: float, d: int) -> np.ndarray:
    """Two centroids mirrored about x_0 = b: the first cluster is every row with x_0 < b."""
    e0 = np.eye(d)[0]
    return np.stack([(b - 1.0) * e0, (b + 1.0) * e0])


#: (mode, the site's policy, the task's class, its DP parameters for the negligible-noise
#: search). Under SecAgg+ the dp-rho is what an honest epsilon-1 run of 10 rounds sends;
#: the share 1e-12 makes the site's own noise negligible.
MODES = {
    "local": ({}, DPTasks, {"dp-rho": 1e24}),
    "require-dp": ({"require-dp": True}, DPTasks, {"dp-rho": 1e24}),
    "secagg": ({}, SecureTasks, {"dp-rho": privacy.rho_from_epsilon(1.0, 1e-5) / 11,
                                 "dp-noise-share": 1e-12}),
}


@pytest.mark.parametrize("mode", list(MODES))
def test_the_negligible_noise_binary_search_needs_a_budget_the_site_set(site_factory, mode):
    policy, tasks, dp = MODES[mode]
    X = site_rows()
    d = X.shape[1]
    dp = {**dp, "data-bounds": WIDE}
    allowing = tasks(site_factory(X, {**policy, "dp-budget": LARGE_BUDGET}), **dp)
    (row,) = binary_search(allowing, d)
    assert is_row(row, X, tol=1e-6) and allowing.messages <= 60
    # the same coordinator against a site at its default budget: refused at once
    default = tasks(site_factory(X, policy), **dp)
    with pytest.raises(AssertionError, match="the site refused") as refused:
        default.lloyd(plane(0.0, d))
    text = str(refused.value)
    assert "site policy dp-budget=10,1e-05: this task would spend epsilon" in text
    assert "epsilon 0 spent over 0 run(s) and 10 remaining" in text
    if mode == "secagg":
        assert "for its own share 1e-12 of the noise alone" in text
        # as docs/how-to/privacy-budget.md shows it
        assert same_words(text[text.index("site policy dp-budget"):text.index("DP tasks") + 8],
                          shown("docs/how-to/privacy-budget.md", "site policy dp-budget=10")), text
    if mode == "require-dp":  # and no plain task either
        assert "site policy require-dp" in default.site.refusal(plane(0.0, d))


@pytest.mark.parametrize("mode", list(MODES))
def test_within_the_default_budget_a_row_comes_out_no_closer_than_the_noise_it_implies(
        site_factory, mode):
    """Five rows, each attacked at a site of its own (fresh budget, independent noise) by
    the best-placed coordinator: it knows every other row, so one release of the first
    cluster's sum with the row in it, the whole default budget spent on it, minus the
    other rows' (clipped) sum, is the row plus the noise. The bound: per coordinate,
    standard deviation Delta / sqrt(2 rho_budget), Delta = D the box's L2 diameter (the
    sums release's sensitivity; common/privacy.py), about 0.57 D. Checked on 15
    coordinates (RMS at least half the bound: a chi-square with 15 degrees of freedom
    under 3.75 has probability 0.001, so no lucky draw passes it); and every further DP
    task is refused."""
    policy, tasks, _ = MODES[mode]
    X = site_rows()
    n, d = X.shape
    box = "-6:6"
    lo, hi = np.full(d, -6.0), np.full(d, 6.0)
    clipped = privacy.clip_rows(X, lo, hi)
    bound = privacy.l2_diameter(lo, hi) / np.sqrt(2 * DEFAULT_RHO)  # Delta / sqrt(2 rho)
    assert bound == pytest.approx(0.568 * privacy.l2_diameter(lo, hi), rel=1e-3)
    # the whole budget in one release: under SecAgg+, a share whose own cost is all of it
    share = 1e-3 if mode == "secagg" else 1.0
    whole = {"dp-rho": DEFAULT_RHO * share**2, "data-bounds": box}
    if mode == "secagg":
        whole["dp-noise-share"] = share
    order = np.argsort(X[:, 0])
    errors = []
    for i, position in enumerate((150, 180, 200, 220, 250)):
        target, others = order[position], order[:position]  # others: the rows it knows
        site = tasks(site_factory(X, {**policy, "site-id": f"site-{i}"}), **whole)
        # the first cluster: the target and the rows below it along x_0, nothing else
        C = plane((X[target, 0] + X[order[position + 1], 0]) / 2, d)
        if mode == "secagg":  # first the tiny share: refused, nothing spent
            tiny = tasks(site.site, **{**whole, "dp-noise-share": 1e-12})
            with pytest.raises(AssertionError, match="dp-budget=10,1e-05"):
                tiny.sums(C)
        sums, counts = site.sums(C)
        errors.append(sums[0] - clipped[others].sum(axis=0) - X[target])
        # anything more is refused (a rounding slack of 1e-9 of the budget aside): here a
        # dp-rho whose noise is 700 box diameters
        for more in ({"dp-rho": 1e-6}, {"dp-rho": 1e-6, "dp-noise-share": 1.0}):
            with pytest.raises(AssertionError, match=r"dp-budget=10,1e-05: this task would "
                                                     r"spend .* 10 spent over 1 run"):
                tasks(site.site, **{**whole, **more}).sums(C)
    errors = np.concatenate(errors)
    rms = float(np.sqrt(np.mean(errors**2)))
    assert rms > bound / 2, (rms, bound)
    # and not far above it either: the site adds the noise the budget implies, no more
    assert rms < 2 * bound, (rms, bound)

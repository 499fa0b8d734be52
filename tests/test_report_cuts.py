"""The straddlers a report keeps whole (``data/report_cuts._short_cuts``, applied until
nothing changes, as ``report_table.report_groups`` does) are the fewest any report that
counts each straddler's rows where the model puts them, or all with its group, must keep
whole: the split sets whose every cut of the clusters isolates 0 or at least p rows are
closed under union, and the fixed point is their largest (privacy model, "The report's
groups"). Checked against every subset of the straddlers, by the definition."""

from __future__ import annotations

from itertools import combinations

import numpy as np
import pytest

from fedcluster.client_app.data import report_cuts


def _feasible(sides: np.ndarray, chosen: np.ndarray, p: int) -> bool:
    """Every cut T of the clusters: the chosen straddlers' smaller sides, summed, are 0
    or at least p (``sides``: rows per straddler and cluster)."""
    k = sides.shape[1]
    for size in range(1, k):
        for T in combinations(range(k), size):
            inside = sides[chosen][:, list(T)].sum(axis=1)
            support = np.minimum(inside, sides[chosen].sum(axis=1) - inside).sum()
            if 0 < support < p:
                return False
    return True


@pytest.mark.parametrize("seed", range(20))
def test_the_straddlers_split_are_the_largest_set_any_exact_report_may_split(seed):
    rng = np.random.default_rng(seed)
    k, p = int(rng.integers(2, 5)), int(rng.choice([3, 5, 10]))
    n_straddlers = int(rng.integers(3, 10))
    sides = np.zeros((n_straddlers, k), dtype=np.int64)
    for s in range(n_straddlers):  # a majority cluster and a few rows elsewhere
        sides[s, rng.integers(k)] += int(rng.integers(p, 3 * p))
        for c in rng.choice(k, int(rng.integers(1, k)), replace=False):
            sides[s, c] += int(rng.integers(1, p))
    sides = sides[(sides > 0).sum(axis=1) > 1]  # straddlers only
    g = np.repeat(np.arange(len(sides)).repeat(k), sides.ravel())
    cluster = np.repeat(np.tile(np.arange(k), len(sides)), sides.ravel())
    observed = np.ones((g.size, 1))
    fixed = np.array([True])
    split = np.ones(len(sides), dtype=bool)
    while True:  # as report_groups applies it
        whole, _ = report_cuts._short_cuts(g, cluster, observed, split, k, p, fixed)
        if not (whole & split).any():
            break
        split &= ~whole
    best = np.zeros(len(sides), dtype=bool)
    for mask in range(1 << len(sides)):
        chosen = np.array([(mask >> s) & 1 for s in range(len(sides))], dtype=bool)
        if _feasible(sides, chosen, p):
            assert not (chosen & ~split).any()  # every feasible set lies within the fixed point
            best |= chosen
    assert np.array_equal(split, best) and _feasible(sides, split, p)

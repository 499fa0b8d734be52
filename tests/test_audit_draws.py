"""The audit of a large component, block by block (``release/audit/draws.py``): a report's
parts pool the straddlers of whole clusters, so on a large site one component holds every
straddler, too large for its matrices held dense (a 1,000,000-row site's report asked for a
(236,107 x 334,980) Jacobian, its next version for a (207,612 x 103,491) incidence). Here
the block paths are forced on small random components, over values
(``moments._determined_by_blocks``) and over instances (``span._columns``), and their
verdicts are the dense paths'."""

from __future__ import annotations

import numpy as np
import pytest

from fedcluster.client_app.release.audit import draws, moments, span, support


def _component(rng, n_groups: int):
    """Groups of 2-5 values, spread units of 1-3 groups, 1-3 hubs over many groups' values
    (parts), and the changes of a few pairs."""
    sizes = rng.integers(2, 6, size=n_groups)
    bounds = np.r_[0, np.cumsum(sizes)]
    n = int(bounds[-1])
    groups = [np.arange(bounds[g], bounds[g + 1]) for g in range(n_groups)]
    units, g = [], 0
    while g < n_groups:
        take = int(rng.integers(1, 4))
        units.append(np.concatenate(groups[g:g + take]))
        g += take
    hubs = [np.sort(rng.choice(n, size=int(rng.integers(n // 4, n // 2)), replace=False))
            for _ in range(int(rng.integers(1, 4)))]
    # a hub less some groups: what a part less its straddlers gives (small supports)
    for h in range(len(hubs)):
        if rng.random() < 0.5:
            drop = np.concatenate([groups[int(i)] for i in rng.choice(n_groups, 2, replace=False)])
            hubs.append(np.setdiff1d(hubs[h], drop[: int(rng.integers(1, drop.size))]))
    changes = [tuple(sorted(map(int, rng.choice(n, 2, replace=False)))) for _ in range(3)]
    return groups + [h for h in hubs if h.size], units, n, changes


@pytest.mark.parametrize("seed", range(4))
def test_the_block_path_decides_as_the_dense_jacobian(seed):
    rng = np.random.default_rng(seed)
    verdicts = {True: 0, False: 0}
    for _ in range(40):
        first, second, n, changes = _component(rng, int(rng.integers(6, 30)))
        hub_size = max(5, max(r.size for r in first) // 4)  # (the hubs' sizes are n/4 and up)
        blocks = draws.blocks([r for r in first if r.size <= hub_size] + second, n, largest=n)
        assert blocks is not None
        dense = moments.determined(first, second, n, changes)  # (small: held dense)
        by_blocks = moments._determined_by_blocks(first, second, n, changes, blocks, hub_size)
        assert (dense is None) == (by_blocks is None), (dense, by_blocks)
        assert dense is None or ("change" in dense) == ("change" in by_blocks), (dense, by_blocks)
        verdicts[dense is None] += 1
    assert min(verdicts.values()) >= 5, verdicts  # both verdicts exercised


@pytest.mark.parametrize("p", [2, 3])
def test_the_instances_audit_by_draws_decides_as_the_dense_null_space(monkeypatch, p):
    """Groups over instances, report parts (hubs) over many, a later table's groups
    across both (atoms in three sets: no graph, so the columns of the null space decide,
    at p 2 and 3): the verdict by draws is the dense one's."""
    rng = np.random.default_rng(20 + p)
    verdicts = {True: 0, False: 0}
    for _ in range(60):
        n = int(rng.integers(60, 150))
        bounds = np.cumsum(rng.integers(p, p + 3, size=n))
        lists = np.split(np.arange(n), bounds[bounds < n])
        lists = lists[:-1] + ([lists[-1]] if lists[-1].size >= p else [])
        base = len(lists)
        for _ in range(int(rng.integers(1, 4))):  # parts: whole groups, less a few rows or more
            whole = np.concatenate([lists[int(g)] for g in rng.choice(base, size=base // 3, replace=False)])
            less = rng.choice(whole, size=int(rng.choice([0, 0, 0, 1])), replace=False)
            extra = rng.choice(n, size=int(rng.choice([0, 0, 0, 1])), replace=False)
            lists.append(np.union1d(np.setdiff1d(whole, less), extra))
        for _ in range(int(rng.integers(1, 4))):  # a later version's groups: two whole ones
            lists.append(np.concatenate([lists[int(g)] for g in rng.choice(base, 2, replace=False)]))
        same = {(int(u), int(w)) for u, w in rng.integers(0, n, size=(3, 2)) if u < w}

        def same_row(u, w, same=same):
            return (min(u, w), max(u, w)) in same
        found = support.atoms(lists)
        if max(sum(g in sets for sets in found.sets) for g in range(found.n_sets)) <= 4:
            continue  # (no set of more than 4 atoms: no hub)
        dense = span._by_columns(found, p, same_row)
        with monkeypatch.context() as forced:
            forced.setattr(draws, "BLOCK_SIZE", 0)
            forced.setattr(draws, "HUB_SIZE", 4)  # (a group holds at most 4 atoms)
            called = []
            forced.setattr(draws, "null_draws", lambda *a, **k: called.append(1) or null_draws(*a, **k))
            by_draws = span._by_columns(found, p, same_row)
        assert called  # (the draws decided)
        assert (dense is None) == (by_draws is None), (lists, dense, by_draws)
        verdicts[dense is None] += 1
    assert min(verdicts.values()) >= 5 and sum(verdicts.values()) >= 40, verdicts


null_draws = draws.null_draws

"""The audit over values of a large component, block by block (``release/audit/moments.py``,
``_determined_by_blocks``): a report's parts pool the straddlers of whole clusters, so on a
large site one component holds every straddler, too large for the Jacobian held dense (a
1,000,000-row site's report asked for a (236,107 x 334,980) array). Here the block path is
forced on small random components and its verdict is the dense path's."""

from __future__ import annotations

import numpy as np
import pytest

from fedcluster.client_app.release.audit import moments


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
        blocks = moments._blocks(first, second, n, hub_size, largest=n)
        assert blocks is not None
        dense = moments.determined(first, second, n, changes)  # (small: held dense)
        by_blocks = moments._determined_by_blocks(first, second, n, changes, blocks, hub_size)
        assert (dense is None) == (by_blocks is None), (dense, by_blocks)
        assert dense is None or ("change" in dense) == ("change" in by_blocks), (dense, by_blocks)
        verdicts[dense is None] += 1
    assert min(verdicts.values()) >= 5, verdicts  # both verdicts exercised

"""One round's task as the server plans it: the task's name, its parameters, the arrays
it sends (named as ``common/protocol.py`` says) and which sites get it."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fedcluster.common import protocol


@dataclass
class TaskPlan:
    """One round's task: its name, scalar parameters, arrays, and which sites get it.

    ``per_site`` adds parameters that differ per site, keyed by site key; ``seed_base``
    seeds the task per site (each site draws ``protocol.site_seed(seed_base, its key)``).
    ``carries``: a describe round's plan may carry the run's first task (``protocol.THEN``).
    """

    task: str
    params: dict = field(default_factory=dict)
    arrays: tuple = protocol.NoArrays()  # the task's inputs (common/protocol.py)
    sample: bool = False  # True: the seeded fraction-C sample; False: every usable site
    per_site: dict[str, dict] = field(default_factory=dict)
    max_rows: int | None = None
    # Arrays that differ per site (GTV: each site's own and its neighbours' centroids),
    # keyed by site key; a site not in it gets ``arrays``.
    per_site_arrays: dict[str, tuple] = field(default_factory=dict)
    # Secure aggregation: the terms the sites encode and their agreed scales (set by
    # the Flower adapter for a secure round; None: a plain round).
    secure: tuple[list[str], list[float]] | None = None
    seed_base: tuple[int, ...] | None = None
    carries: "TaskPlan | None" = None
    # A carried task's replies as received (node id -> arrays, metrics, rows), validated
    # once the describe round has admitted the sites (``preparation.py``).
    received: dict = field(default_factory=dict)

    @property
    def n_clusters(self) -> int | None:
        """How many centroids the task sends (None: it sends none); a reply has one row
        per centroid (a start may send more or fewer than k: ``divisive.py``)."""
        centroids = getattr(self.arrays, "centroids", None)
        return None if centroids is None else int(np.shape(centroids)[0])

    @property
    def label(self) -> str:
        """The round's name in the history: its task, and the task it carries."""
        return self.task if self.carries is None else f"{self.task}+{self.carries.task}"

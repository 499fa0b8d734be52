"""A site's cluster profile: what Table 1 by cluster needs from one site (issue 36).

Per cluster of whole groups (each group in the cluster its mean is nearest to in the
run's space, as the final evaluation assigns it) and per encoded feature, in the encoded
units (the schema's declared unit; the run's scaling undone, no fill): the rows counted,
the present cells, their sum, their squared deviations about a reference point the
server sends (exact: a group adds its m2 plus present x (its mean - reference)^2; sums
over sites then give exact pooled SDs, also under secure aggregation, which needs every
term to be a sum), and a histogram of the groups' present means, each counting its present
cells, over the bins the server sends (medians and quartiles: exact to one bin where a
site answers from rows). A category level's count is its one-hot column's sum over the
level's ``category-weight``.

The floor p, at the site, cell by cell: a cluster under p rows is withheld whole; a
feature's cell whose present cells or missing cells number 1 to p-1 is withheld (every
term 0, ``hidden`` 1); so is a level count of 1 to p-1 and a histogram bin of 1 to p-1
cells. A withheld cell is left out of the pooled totals and shows as ``<p``. What this
does not stop: a withheld level's count can be had by subtraction from its variable's
other levels and the cluster's size (no secondary suppression yet).

The round that asks for it is not part of the protocol yet: these are its maths, tested
against pandas on the pooled rows (``tests/test_profile.py``).
"""

from __future__ import annotations

import numpy as np

from fedcluster.client_app.site_groups import SiteGroups
from fedcluster.common.protocol import ClusterProfile


def site_profile(groups: SiteGroups, cluster_of_group: np.ndarray, references: np.ndarray,
                 lower: np.ndarray, upper: np.ndarray, bins: int, level_weights: np.ndarray,
                 floor: int) -> ClusterProfile:
    """The profile of one site's clusters.

    Parameters
    ----------
    groups : SiteGroups
        The site's groups in the encoded units (not in the run's space).
    cluster_of_group : (G,) int
        Each group's cluster, 0..k-1.
    references : (k, d)
        Per cluster, the point its squared deviations are taken about (the pooled
        centroid in encoded units: small, well-conditioned sums).
    lower, upper : (d,)
        The histogram's range per feature (values outside fall in the end bins).
    bins : int
        Bins per feature.
    level_weights : (d,)
        A category level's ``category-weight`` (its one-hot column's 1); 0 for a numeric
        feature.
    floor : int
        The privacy floor p.

    Returns
    -------
    ClusterProfile
    """
    k, d = references.shape
    labels = np.asarray(cluster_of_group, dtype=np.int64)
    counts = np.bincount(labels, weights=groups.counts, minlength=k).astype(np.int64)
    present_g = (np.broadcast_to(groups.counts[:, None], groups.sums.shape)
                 if groups.present is None else groups.present).astype(np.int64)
    present = np.zeros((k, d), dtype=np.int64)
    np.add.at(present, labels, present_g)
    sums = np.zeros((k, d))
    np.add.at(sums, labels, np.where(present_g > 0, groups.sums, 0.0))
    with np.errstate(invalid="ignore", divide="ignore"):
        means = np.where(present_g > 0, groups.sums / np.maximum(present_g, 1), 0.0)
    m2 = 0.0 if groups.m2 is None else np.where(present_g > 0, groups.m2, 0.0)
    gap = means - references[labels]
    squares = np.zeros((k, d))
    np.add.at(squares, labels, m2 + present_g * gap * gap)
    numeric = np.asarray(level_weights) == 0
    width = (np.asarray(upper, float) - np.asarray(lower, float)) / bins
    where = np.clip(np.floor((means - lower) / width), 0, bins - 1).astype(np.int64)
    histograms = np.zeros((k, d, bins), dtype=np.int64)
    np.add.at(histograms, (labels[:, None], np.arange(d)[None, :], where),
              present_g * numeric[None, :])
    rows = np.repeat(counts[:, None], d, axis=1)
    missing = rows - present
    levels = np.rint(np.where(numeric, 0.0, sums / np.where(numeric, 1.0, level_weights)))
    small = lambda a: (a > 0) & (a < floor)  # noqa: E731
    hide = (counts < floor)[:, None] | small(present) | small(missing) | small(levels)
    hidden = (hide & (rows > 0)).astype(np.int64)
    for term in (rows, present, sums, squares):
        term[hide] = 0
    histograms[hide] = 0
    histograms[small(histograms)] = 0
    counts[counts < floor] = 0
    return ClusterProfile(counts, rows, present, sums, squares, histograms, hidden)

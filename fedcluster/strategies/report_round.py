"""The final model's figures over the report's groups (issue 56; the sites' side:
``client_app/data/report_table.py``).

Training assigns each site's groups whole; the figures a person reads (the final
evaluation's metrics, Davies-Bouldin's pass, Table 1's profile and the pictures drawn
from them) are asked with ``protocol.REPORT`` so that each site answers from its groups
re-cut within the model's clusters, where the promise allows. Each partition a site
answers is judged with everything it has released and joins its record, so only the
model's centroids are asked (a partition of no use to the report is no partition worth
recording): with ``n-init`` 1 the repetition's own evaluation; with more, one more
evaluation round of the best repetition's centroids once they are known (its figures
replace that repetition's; its score, which chose it, stays).
"""

from __future__ import annotations

import numpy as np

from fedcluster.strategies import metrics, reports

__all__ = ["evaluation_record", "report_wanted"]


def report_wanted(config, sites) -> bool:
    """Whether the run asks for the report's groups (run config ``report-groups``): not
    in a k-range run (its k are compared, not reported), not under DP (whose figures
    come from rows), and only where some site answers from groups (``group-size`` > 1:
    a site of rows has nothing to re-cut)."""
    return bool(config.report_groups and config.k_bounds is None and not config.private
                and any(site.group_size != 1 for site in sites.values()))


def evaluation_record(replies, config) -> dict:
    """An evaluation round's figures as a repetition keeps them: the pooled statistics,
    each site's own report (none under secure aggregation: no site's reply is seen) and
    the summed distances to the centroids (Davies-Bouldin's, if the means are those)."""
    return {
        "stats": metrics.pool([reports.site_stats(r) for r in replies]),
        "per-site": {r.site_key: reports.site_report(r, config.min_cluster_size)
                     for r in replies if r.n_sites == 1 and not config.secure_aggregation},
        "distances": np.sum([r.arrays.distances for r in replies], axis=0),
    }

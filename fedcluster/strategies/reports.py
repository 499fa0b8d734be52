"""What the server makes of the evaluation replies: one site's statistics as
``metrics.pool`` sums them, and one site's line of the run summary."""

from __future__ import annotations

import json

import numpy as np

from fedcluster.common.profile import protected_composition
from fedcluster.strategies.reply import Reply


def site_stats(reply: Reply) -> dict:
    """A validated ``evaluate`` reply as the statistics ``metrics.pool`` sums."""
    evaluation = reply.arrays
    stats = {
        "n_rows": reply.n_rows,
        "sse": reply.metrics["sse"],
        "silhouette_sum": reply.metrics["silhouette-sum"],
        "counts": evaluation.counts,
        "sums": evaluation.sums,
        "sqnorms": evaluation.sqnorms,
        # (DP's evaluation answers from rows, which have no spread)
        "group_scatter": reply.metrics.get("group-scatter", 0.0),
    }
    if "all-sq-dist" in reply.metrics:
        stats["all_sq_dist"] = reply.metrics["all-sq-dist"]
        stats["partition_sum"] = reply.metrics["partition-sum"]
    if evaluation.contingency is not None:
        names = json.loads(str(reply.metrics["label-names"]))
        stats["contingency"] = dict(zip(names, evaluation.contingency))
    return stats


def site_report(reply: Reply, floor: int) -> dict:
    """What the server shows of one site: its score and sizes, "<p" where it hid one (p
    the site's own floor when it is above the server's)."""
    counts, hidden = reply.arrays.counts, reply.arrays.hidden
    floor = max(floor, int(reply.metrics.get("floor", floor)))
    return {
        "n-rows": reply.n_rows,
        "score": reply.metrics["sse"] / reply.n_rows,
        "cluster-sizes": [f"<{floor}" if h else int(c) for c, h in zip(counts, hidden)],
    }


def protected_per_site(per_site: dict, floor: int) -> dict:
    """The per-site reports with each site's cluster sizes under Table 1's small-cell rule
    at floor p (``profile.protected_composition``: a size of 1 to p-1 reads "<p", others
    withheld so that none can be worked out from the sites' rows and the cluster sizes
    read "suppressed"; a cluster a site withheld keeps its "<p", unless every figure
    fixes it at 0)."""
    if not per_site:
        return per_site

    def flagged(size) -> bool:
        return isinstance(size, str)

    counts = {key: [0 if flagged(c) else int(c) for c in r["cluster-sizes"]]
              for key, r in per_site.items()}
    flags = {key: np.array([flagged(c) for c in r["cluster-sizes"]]) for key, r in per_site.items()}
    floors = {key: max([int(c[1:]) for c in r["cluster-sizes"] if flagged(c)], default=1)
              for key, r in per_site.items()}
    rows = {key: int(r["n-rows"]) for key, r in per_site.items()}
    values, _ = protected_composition(counts, flags, rows, floors, floor)
    return {key: {**r, "cluster-sizes": values[key][:-1]} for key, r in per_site.items()}


def table_summary(sites, schema_hash: str | None) -> dict:
    """What the sites reading their tables through the schema reported, summed: the rows
    ``drop-row`` dropped and, per column, the missing cells (imputed, or none under the
    other policies); a site's count under the floor ("<p") is not added but counted in
    ``sites-under-floor``. Empty without a schema."""
    if schema_hash is None:
        return {}

    def add(total: dict, value) -> None:
        if isinstance(value, int):
            total["total"] += value
        else:
            total["sites-under-floor"] += 1

    dropped = {"total": 0, "sites-under-floor": 0}
    missing: dict[str, dict] = {}
    for site in sites:
        add(dropped, site.table.get("rows-dropped", 0))
        cells = site.table.get("cells-missing", {})
        for column, value in (cells.items() if isinstance(cells, dict) else ()):
            add(missing.setdefault(column, {"total": 0, "sites-under-floor": 0}), value)
    return {"schema-hash": schema_hash, "rows-dropped": dropped, "cells-missing": missing}

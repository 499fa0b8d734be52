"""The final model's report, from the site's side: its table built by the data layer
(``data/report_table.py``: the groups the model's clusters straddle re-cut within them),
its parts judged and recorded by the release step (``release/gate.admit_report``, with
the site's whole record, under its lock), and, where the judgement refuses, the table
made again coarser where the refusal rests (:func:`coarser`), until one passes or every
group counts whole.

A partition the record holds already (the same model asked again: the evaluation, then
Davies-Bouldin's round and the profile) is the same table, answered as it is
(``report_table.answered``). A new one is judged with every earlier one: a part that
differs from an earlier part by a few rows would give those rows away, so such a row goes
with its earlier part (to the cluster that holds most of that part's rows now), or its
straddling group is kept whole, as the judgement's finding says.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from fedcluster.client_app.data import report_table as tables
from fedcluster.client_app.data.report_table import Report
from fedcluster.client_app.data.site_data import SiteData
from fedcluster.client_app.release import gate
from fedcluster.client_app.site_groups import SiteGroups

__all__ = ["REPORT_ROUNDS", "coarser", "report_table"]

#: How many times a report's table is made again, coarser where the release step's
#: findings rest, before every group counts whole.
REPORT_ROUNDS = 40


def report_table(site: SiteData, groups: SiteGroups, group_of_row: np.ndarray,
                 centroids: np.ndarray, transform: str | None, box, store) -> tuple[Report, str]:
    """The report's table of ``groups`` at ``centroids`` (in the run's space) as the site
    answers it (its ``groups.table_ref`` naming the partition), and why it kept groups
    whole ("": it did not); ``store``: the site's record, held under its lock."""
    instance = tables.row_instances(site, store)
    known = tables.answered(site, groups, group_of_row, centroids, transform, box, store,
                            instance)
    if known is not None:  # a partition the record holds, asked again: the same table
        return _named(known[0], known[1], groups), ""
    keep = np.zeros(groups.n_groups, dtype=bool)
    earlier = tables.earlier_parts(store, instance)
    snapped = np.zeros(site.n_rows, dtype=bool)
    why = ""
    for _ in range(REPORT_ROUNDS):
        made = tables.report_groups(site, groups, group_of_row, centroids, transform, box,
                                    keep, earlier, snapped)
        if not made.split:
            return Report(groups, 0, 0, why or made.why), why or made.why
        verdict = gate.admit_report(store, groups.table_ref.number,
                                    [instance[part] for part in made.parts],
                                    made.carried_features, groups.min_size, groups.n_features,
                                    np.flatnonzero(keep), np.flatnonzero(snapped))
        if verdict.admitted:
            return _named(made, verdict.digest, groups), why
        why = f"the audit keeps groups whole: {verdict.why}"
        keep, snapped = coarser(keep, snapped, made, group_of_row, instance, earlier,
                                verdict.instances, store.beside(verdict.instances))
    return Report(groups, 0, 0, why), why


def _named(made: Report, digest: str, base: SiteGroups) -> Report:
    """``made`` with its table naming the partition of ``base``'s table it answers from
    (``TableRef.partition``)."""
    return dataclasses.replace(made, groups=dataclasses.replace(
        made.groups, table_ref=dataclasses.replace(base.table_ref, partition=digest)))


def coarser(keep: np.ndarray, snapped: np.ndarray, made: Report, group_of_row: np.ndarray,
            instance: np.ndarray, earlier: np.ndarray | None, rests_on: np.ndarray,
            beside: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The next candidate of a refused report, coarser where the refusal rests (its
    instances): a row of an earlier part goes with that part (the cluster that holds most
    of its rows now), its group split where it must be; a straddler of the candidate
    that holds another of its rows is kept whole; else the candidate's straddlers that
    hold a row of the earlier parts beside it (``beside``) are kept whole; nothing named:
    every straddler whole."""
    def whole(rows):
        return keep | made.straddlers & np.isin(np.arange(keep.size), group_of_row[rows])

    rows = np.isin(instance, rests_on) & (group_of_row >= 0)
    follow = rows & ~snapped & (earlier >= 0 if earlier is not None else False)
    if follow.any():  # (a snapped row's group is no longer kept whole)
        return keep & ~np.isin(np.arange(keep.size), group_of_row[follow]), snapped | follow
    grown = whole(rows & made.straddlers[np.maximum(group_of_row, 0)])
    if (grown != keep).any():
        return grown, snapped
    grown = whole(np.isin(instance, beside) & (group_of_row >= 0))
    if (grown != keep).any():
        return grown, snapped
    return keep | made.straddlers, snapped

"""Where a site keeps the report's partition, and the audit of its parts
(``report_table.py``; issue 56).

The parts a report adds are groups the site answers from: their counts and their sums
per feature (their spreads are derived from released figures, no unit of their own; a
feature they carry at a stood-in mean reports no value of their rows). Before a site
answers from them, the audit judges them with everything it answered from before:

- a deployed site (a file): every group, unit and link of its answered history's store
  (``versions/audited.py``: the instances' audit and the values' audit, first and
  second moments); once answered, the parts go into the store, so that every later
  version is judged with them (``Store.add_report``);
- data held in memory (simulation, tests, benchmarks): the table the site holds, per
  feature over the cells' values, its groups' sums and its spread units' sums of
  squares with the parts' (``release/versions_audit.component_finding``: no
  combination isolates fewer than p values, no sum of squares covers fewer than
  max(3, p), and none with the sums determines a value).

A site answers ONE partition per version of its data (in memory: per array and run): the
coordinator chooses the centroids and so which side of its boundaries each straddling
row counts on; the counts of a second partition of the same rows, compared with the
first, say which rows lie between two boundaries it picked, which no linear audit judges.
"""

from __future__ import annotations

import hashlib
import json
import weakref
from pathlib import Path

import numpy as np

from fedcluster.client_app.data.site_data import SiteData
from fedcluster.client_app.release import span_audit, versions_audit
from fedcluster.client_app.site_groups import SiteGroups

__all__ = ["ReportHistory", "partition_digest"]


def partition_digest(parts: list[np.ndarray], p: int) -> str:
    """The key of a partition of one version's rows: its parts' rows (their places in the
    version, which the store's table number names), sorted, and p."""
    text = json.dumps([p, [np.sort(part).tolist() for part in parts]])
    return hashlib.sha256(text.encode()).hexdigest()


class ReportHistory:
    """Which partition of a version's rows the site answered a report from, and the
    audit of a new one (module docstring).

    Parameters
    ----------
    site : SiteData
    groups : SiteGroups
        The table the parts re-cut (a kept table names its store: ``table_ref``).
    run : optional
        Data held in memory: the run whose one partition this is.
    """

    _MEMORY: dict[tuple, tuple[weakref.ref, str]] = {}

    def __init__(self, site: SiteData, groups: SiteGroups, run=None) -> None:
        self.site, self.groups, self.run = site, groups, run
        self.store = None
        if groups.table_ref is not None:
            from fedcluster.client_app.data.versions.lineage import Store
            self.store = Store.open(Path(groups.table_ref.store))
            self.number = int(groups.table_ref.number)

    def unit_heads(self) -> np.ndarray:
        """(G,) each group's spread unit (a label; -1: in none): the table's own where it
        was made in memory, else its store's; every group its own where neither knows."""
        if self.store is not None:
            return np.asarray(self.store.unit)[self.store.table_groups(self.number)]
        units = self.groups.units
        return np.arange(self.groups.n_groups) if units is None else np.asarray(units)

    def answered(self) -> str | None:
        """The digest of the partition answered for this version (None: none yet)."""
        if self.store is not None:
            return self.store.meta.get("reports", {}).get(str(self.number))
        hit = self._MEMORY.get((id(self.site.X), self.run))
        return hit[1] if hit is not None and hit[0]() is self.site.X else None

    def instances(self, rows: np.ndarray) -> np.ndarray:
        """The audit's unknowns of ``rows``: the store's instances, else the rows."""
        if self.store is None:
            return rows
        from fedcluster.client_app.data import group_table
        from fedcluster.client_app.data.versions import row_keys
        keys = row_keys.instance_keys(group_table.row_hashes(self.site), self.site.row_ids)
        return self.store.match(keys, self.site.row_ids)[0][rows]

    def audit(self, parts: list[np.ndarray], straddlers: np.ndarray, group_of_row: np.ndarray,
              p: int, carried: np.ndarray) -> str | None:
        """Why the parts (instances; their sums and counts: their spreads are derived
        from released figures, ``report_table._part_spreads``) may not be answered
        (None: they may). ``straddlers``: the groups they re-cut; ``group_of_row``: each
        row's group (in memory, the table's); ``carried``: (d,) the features the parts
        carry at stood-in means (no value of their rows: not judged)."""
        units = np.full(len(parts), -1, dtype=np.int64)
        if self.store is not None:
            from fedcluster.client_app.data.versions import audited
            store = self.store
            present = None
            if store.present is not None:
                width = self.site.n_features
                present = lambda instances: store.present_cells(instances, width)  # noqa: E731
            failing = audited._failures(store, parts, units, p, present, carried)
            return failing[0][1] if failing else None
        return self._in_memory(parts, units, straddlers, group_of_row, p, carried)

    def _in_memory(self, parts, units, straddlers, group_of_row, p, carried) -> str | None:
        """The audit over the table held in memory: the instances' (counts and each
        feature's present cells), then per feature the values' with the spread units."""
        heads = self.unit_heads()
        # the component: the groups re-cut, every group of their spread units, the parts
        touched = np.isin(heads, heads[straddlers]) & (heads >= 0)
        touched[straddlers] = True
        old = np.flatnonzero(touched)
        members = [np.flatnonzero(group_of_row == j) for j in old.tolist()]
        everything = members + list(parts)
        sizes = np.array([m.size for m in everything], dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        flat = np.concatenate(everything).astype(np.int64)
        X = self.site.X
        absent = np.isnan(np.asarray(X[flat]))
        present = reports = None
        if absent.any():
            present = lambda rows: ~np.isnan(np.asarray(X[rows]))  # noqa: E731

            def group_reports(ids):  # (a part reports no feature it carries)
                return np.array([(present(flat[offsets[g]:offsets[g + 1]]).sum(axis=0) >= p)
                                 & ~(carried & (g >= len(members)))
                                 for g in np.asarray(ids).tolist()])
            reports = group_reports
        findings = span_audit.audit(offsets, flat, X.shape[0],
                                    np.arange(len(members), len(everything)),
                                    np.full(len(everything), p), p, lambda u, w: False,
                                    present, reports)
        if findings:
            return findings[0].reason
        # the values' audit, per feature: sums of the groups that report it, sums of
        # squares of the units (the table's, whole; the parts' that release their own)
        unit_of = np.concatenate([heads[old], np.where(units >= 0, heads.size + units, -1)])
        judged: dict = {}  # the decision depends on who is where, never on the values: a
        for j in range(X.shape[1]):  # feature missing in the same cells is judged once
            cells = [m[~np.isnan(np.asarray(X[m, j]))] for m in everything[:len(members)]]
            cells += [np.zeros(0, np.int64) if carried[j] else m[~np.isnan(np.asarray(X[m, j]))]
                      for m in parts]
            values, local = np.unique(np.concatenate(cells), return_inverse=True)
            if values.size == 0:
                continue
            split = np.split(local, np.cumsum([c.size for c in cells])[:-1])
            first = [s for s in split if s.size >= p]
            second = [np.unique(np.concatenate([split[i] for i in np.flatnonzero(unit_of == u)]))
                      for u in np.unique(unit_of[unit_of >= 0]).tolist()]
            second = [s for s in second if s.size]
            key = hashlib.sha256(repr([values.size, [a.tolist() for a in first],
                                       [a.tolist() for a in second]]).encode()).digest()
            if key not in judged:
                judged[key] = versions_audit.component_finding(
                    versions_audit.Component(first, second, values.size, np.arange(values.size)), p)
            reason = judged[key]
            if reason is not None:
                return f"feature {j}: {reason}"
        return None

    def record(self, digest: str, parts: list[np.ndarray], p: int,
               carried: np.ndarray | None = None) -> None:
        """This version's partition is ``digest`` (its parts, as instances; ``carried``:
        the features they carry at stood-in means)."""
        if self.store is None:
            for stale in [key for key, (ref, _) in self._MEMORY.items() if ref() is None]:
                del self._MEMORY[stale]
            self._MEMORY[(id(self.site.X), self.run)] = (weakref.ref(self.site.X), digest)
            return
        from fedcluster.client_app import site_files
        from fedcluster.client_app.data.versions.lineage import Store
        directory = Path(self.groups.table_ref.store)
        with site_files.locked(directory, "store.json"):  # another process may have answered
            store = Store.open(directory)
            if store.meta.get("reports", {}).get(str(self.number)) is None:
                store.add_report(self.number, digest, parts, p, () if carried is None else carried)

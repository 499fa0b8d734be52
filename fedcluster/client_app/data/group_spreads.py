"""The spread rule applied to a group table as it is made (the rule itself:
``release/spreads.py`` and ``release/dominance.py``; this module reads what it needs of
the rows, which only the data layer may).

While ``group_stats.ordered`` passes over the rows it also gives each group's largest
squared deviation per feature (``peak``) and the site's spread per feature; this module
takes the few cells whose row stands out of its group (``dominance.stand_out_cells``),
pairs the small groups into spread units (in canonical order, so that the pairing, like
the table, is a function of the groups' statistics alone), applies the dominance rule to
the standing-out cells, pools the released spreads (``typical``) and gives the m2 column the
table keeps, a chunk of groups at a time (:meth:`Spreads.take`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fedcluster.common.kernels import compiled_kernels
from fedcluster.client_app.mapped_pages import rows_at
from fedcluster.client_app.release import dominance, spreads

__all__ = ["Spreads", "site_moments"]

#: Groups per chunk of a pass over the table.
CHUNK_GROUPS = 1 << 12
#: The pairing compares groups by at most this many coordinates (a fixed projection of
#: their standardised means when the table is wider): it decides who shares a spread.
PAIRING_WIDTH = 16


def site_moments(counts: np.ndarray, sums: np.ndarray, absent: np.ndarray | None,
                 squares: np.ndarray, base: tuple | None = None,
                 totals: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(d,) (d,): the mean and standard deviation of each feature over the grouped rows'
    present cells (from its sum of squares: yardsticks for the rules, not released);
    ``base``: (cells, sums, squares) per feature of groups kept from an earlier table
    (``version_table.kept_summary``), counted in; ``totals``: ``sums.sum(axis=0)`` where
    the sums were made a window at a time (``group_stats.ordered``)."""
    n = float(counts.sum()) - (0.0 if absent is None else absent.sum(axis=0, dtype=np.float64))
    total = sums.sum(axis=0) if totals is None else totals
    squares = np.asarray(squares, dtype=np.float64)
    if base is not None:
        n, total, squares = n + base[0], total + base[1], squares + base[2]
    n = np.maximum(n, 1.0)
    mean = total / n
    return mean, np.sqrt(np.maximum(squares / n - mean * mean, 0.0))


@dataclass
class Spreads:
    """The spread rule's record of one table (canonical positions).

    Attributes
    ----------
    partner : (G,) int64
        Each group's spread partner (-1: none).
    unit_head : (G,) int64
        Each position's merged unit, named by its smallest position (-1: in none), for
        the units merged beyond a pair (a unit that gave cells back, or a small group
        left alone: ``release/spreads.py``).
    withheld : dict
        Position -> the features whose unit's spread is withheld (the dominance rule, or
        a unit merging could not mend).
    typical : (d,) float
        The site's pooled spread per degree of freedom (what a withheld spread becomes).
    alone : set
        Positions in no unit (the versions audit's -1: old rows that would give part of
        an earlier unit's sum of squares): their spreads withheld in every feature.
    """

    order: np.ndarray
    counts: np.ndarray
    absent: np.ndarray | None
    m2: np.ndarray
    min_size: int
    partner: np.ndarray
    tiny: np.ndarray
    unit_head: np.ndarray | None = None
    withheld: dict = field(default_factory=dict)
    typical: np.ndarray | None = None
    dominated: int = 0
    dominated_means: int = 0
    replaced: dict = field(default_factory=dict)  # position -> features: sums stood in for
    forced: set = field(default_factory=set)  # (position, feature) of them: a protected cell's
    alone: set = field(default_factory=set)
    _leaf: np.ndarray | None = None
    _leaves: list | None = None
    _sorted: tuple | None = None  # (epoch, withheld, merged positions, withheld positions)
    _epoch: int = 0  # counts the changes of the merged units
    _members: tuple | None = None  # (epoch, heads, offsets, members): _units
    _table: tuple | None = None  # (epoch, unit row per position, totals, dofs, reveals)

    def __post_init__(self):
        if self.unit_head is None:
            self.unit_head = np.full(self.order.size, -1, dtype=np.int64)

    def merge(self, positions) -> None:
        """Make ``positions`` one merged unit."""
        self.unit_head[positions] = np.min(positions)
        self._epoch += 1

    @property
    def withheld_cells(self) -> int:
        return sum(len(f) for f in self.withheld.values())

    def _take_units(self, labels: np.ndarray) -> None:
        """Units given as a label per position: pairs as partners, larger ones merged;
        -1 a position in no unit, its spread withheld in every feature."""
        for position in np.flatnonzero(labels < 0).tolist():
            self.alone.add(position)
            self.withheld[position] = list(range(self.m2.shape[1]))
        positions = np.flatnonzero(labels >= 0)
        order = positions[np.argsort(labels[positions], kind="stable")]
        edges = np.flatnonzero(np.diff(labels[order])) + 1 if order.size else np.zeros(0, np.int64)
        for unit in np.split(order, edges):
            if unit.size == 2:
                self.partner[unit[0]], self.partner[unit[1]] = unit[1], unit[0]
            elif unit.size > 2:
                self.unit_head[unit] = unit.min()
        self._epoch += 1

    def summary(self) -> dict:
        """What the rule did to this table's groups, as ``site check`` shows it: the
        2-row groups paired, the units merged (values that tie), the (group, feature)
        spreads withheld, of them the dominance rule's."""
        return {"groups": int(self.order.size), "paired": int(np.count_nonzero(self.partner >= 0)),
                "merged-units": int(np.unique(self.unit_head[self.unit_head >= 0]).size),
                "withheld": int(self.withheld_cells), "dominated": int(self.dominated),
                "dominated-means": int(self.dominated_means)}

    def stand_ins(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(positions, features, forced) of the sums the table stands in for: the p% rule
        on means flagged them, or (``forced`` True) they hold a cell it withheld before."""
        pairs = sorted((p, f) for p, features in self.replaced.items() for f in set(features))
        positions = np.array([p for p, _ in pairs], dtype=np.int64)
        features = np.array([f for _, f in pairs], dtype=np.int64)
        return positions, features, np.array([pair in self.forced for pair in pairs], dtype=bool)

    def unit_heads(self) -> np.ndarray:
        """(G,) each position's unit named by its smallest position (-1: in none)."""
        heads = np.where(self.partner >= 0, np.minimum(np.arange(self.partner.size), self.partner),
                         np.arange(self.partner.size))
        heads = np.where(self.unit_head >= 0, self.unit_head, heads)
        heads[list(self.alone)] = -1
        return heads

    def unit_of(self, position: int) -> np.ndarray:
        """The positions of a group's spread unit."""
        if self.unit_head[position] >= 0:
            heads, offsets, members = self._units()
            k = int(np.searchsorted(heads, self.unit_head[position]))
            return members[offsets[k]:offsets[k + 1]]
        mate = int(self.partner[position])
        return np.array([position] if mate < 0 else sorted((position, mate)), dtype=np.int64)

    # ------------------------------------------------------------ the table's arrays
    def _cells(self, ids: np.ndarray) -> np.ndarray:
        """(n, d) the present cells of groups ``ids``, a feature's 1..p-1 cells as none
        (the lone-cell rule: ``release/lone_cells.py``)."""
        width = self.m2.shape[1]
        present = np.repeat(self.counts[ids, None], width, axis=1) if self.absent is None \
            else self.counts[ids, None] - self.absent[ids]
        return np.where(present >= self.min_size, present, 0)

    def _unit(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(own m2, cells) of some positions' groups, (k, d)."""
        ids = self.order[positions]
        return rows_at(self.m2, ids), self._cells(ids)

    def _block(self, lo: int, hi: int):
        """Positions lo..hi: (own m2, cells, their unit's shares, released (n, d))."""
        ids = self.order[lo:hi]
        pp = self.partner[lo:hi]
        has = pp >= 0
        mates = self.order[np.where(has, pp, 0)]
        m2 = rows_at(self.m2, ids)
        mate_m2 = np.where(has[:, None], rows_at(self.m2, mates), 0.0)
        cells = self._cells(ids)
        mate_cells = np.where(has[:, None], self._cells(mates), 0)
        # spreads.pair_shares and pair_reveals in one compiled pass (the same values)
        share, reveals = compiled_kernels().spread_pair_rule(
            m2, mate_m2, np.ascontiguousarray(cells, dtype=np.int64),
            np.ascontiguousarray(mate_cells, dtype=np.int64), self.tiny, spreads.EQUAL_WITHIN,
            spreads.SPREAD_MIN_ROWS)
        merged, withheld = self._keys()
        inside = merged[np.searchsorted(merged, lo):np.searchsorted(merged, hi)]
        if inside.size:  # each merged unit computed once for the table (_table)
            row, totals, dofs, unit_reveals = self._unit_table()
            unit = row[inside]
            share[inside - lo] = spreads.member_shares(totals[unit], dofs[unit], cells[inside - lo])
            reveals[inside - lo] = unit_reveals[unit]
        for position in withheld[np.searchsorted(withheld, lo):np.searchsorted(withheld, hi)].tolist():
            reveals[position - lo, self.withheld[position]] = True
        return m2, cells, share, ~reveals

    def _units(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The merged units as they are: (U,) heads ascending, (U + 1,) offsets into
        (M,) members (each unit's positions ascending)."""
        if self._members is None or self._members[0] != self._epoch:
            positions = np.flatnonzero(self.unit_head >= 0)
            members = positions[np.argsort(self.unit_head[positions], kind="stable")]
            heads, starts = np.unique(self.unit_head[members], return_index=True)
            self._members = (self._epoch, heads, np.append(starts, members.size), members)
        return self._members[1:]

    def _unit_table(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(G,) each position's merged unit (-1: none) and, per unit, (U, d) its m2 total,
        degrees of freedom and reveals (``spreads.units_rule``): (d,) a unit, computed once
        a change of the units, so that no pass holds a share per member."""
        if self._table is None or self._table[0] != self._epoch:
            heads, offsets, members = self._units()
            row = np.full(self.order.size, -1, dtype=np.int64)
            row[members] = np.repeat(np.arange(heads.size), np.diff(offsets))
            self._table = (self._epoch, row, *self._units_rule(offsets, members))
        return self._table[1:]

    def _units_rule(self, offsets: np.ndarray, members: np.ndarray) -> tuple:
        """``spreads.units_rule`` of the units ``members[offsets[u]:offsets[u + 1]]``, a
        chunk's worth of their groups at a time (memory)."""
        count, width = offsets.size - 1, self.m2.shape[1]
        out = (np.empty((count, width)), np.empty((count, width)),
               np.empty((count, width), dtype=bool))
        u = 0
        while u < count:
            v = max(u + 1, int(np.searchsorted(offsets, offsets[u] + CHUNK_GROUPS, side="right")) - 1)
            lo, hi = offsets[u], offsets[v]
            for array, part in zip(out, spreads.units_rule(*self._unit(members[lo:hi]),
                                                           offsets[u:v] - lo, self.tiny)):
                array[u:v] = part
            u = v
        return out

    def _keys(self) -> tuple[np.ndarray, np.ndarray]:
        """The positions of merged units and of withheld spreads, sorted (a chunk finds its
        own by bisection); withheld positions are only ever added, so their count says when
        to sort."""
        if self._sorted is None or self._sorted[:2] != (self._epoch, len(self.withheld)):
            self._sorted = (self._epoch, len(self.withheld), np.flatnonzero(self.unit_head >= 0),
                            np.array(sorted(self.withheld), dtype=np.int64))
        return self._sorted[2], self._sorted[3]

    def take(self, lo: int, hi: int) -> np.ndarray:
        """The released m2 of positions lo..hi (the table's m2 column)."""
        _, cells, share, released = self._block(lo, hi)
        dof = np.maximum(cells - 1.0, 0.0)
        return np.where(released, share, self.typical[None, :] * dof)

    # ------------------------------------------------------------ making the record
    @classmethod
    def of(cls, order, counts, sums, absent, m2, moments: tuple, found: list, min_size: int,
           prior: tuple | None = None, units: np.ndarray | None = None,
           means_flagged: tuple | None = None, forced: tuple | None = None) -> "Spreads":
        """The rule's record of a table made of these groups (their statistics in group
        order; ``moments``: :func:`site_moments`; ``found``: ``dominance.stand_out_cells``
        of each window; ``units``: a unit label per group number, where the versions audit
        judged them; ``means_flagged``: the (groups, features) whose sum the p% rule on
        means replaced, ``group_means.stand_in_means``)."""
        width = m2.shape[1]
        mean, sd = moments
        record = cls(order, counts, absent, m2, min_size, np.full(order.size, -1, np.int64),
                     spreads.tiny_spread(mean, sd))
        points = None
        if units is not None:
            record._take_units(np.asarray(units, dtype=np.int64)[order])
        elif (counts[order] < spreads.SPREAD_MIN_ROWS).any():
            points = record._points(sums, sd)
            record.partner = spreads.spread_partners(points, counts[order])
        record._mend(lambda: record._points(sums, sd) if points is None else points)
        record._dominance(found)
        record._withhold_means(means_flagged)
        if forced is not None and np.size(forced[0]):
            position = np.empty(order.size, dtype=np.int64)
            position[order] = np.arange(order.size)
            record.forced = set(zip(position[np.asarray(forced[0], dtype=np.int64)].tolist(),
                                    np.asarray(forced[1], dtype=np.int64).tolist()))
        total, dof = np.zeros(width), np.zeros(width)
        if prior is not None:
            total, dof = total + prior[0], dof + prior[1]
        for lo in range(0, order.size, CHUNK_GROUPS):
            own, cells, _, released = record._block(lo, min(order.size, lo + CHUNK_GROUPS))
            total += np.where(released, own, 0.0).sum(axis=0)
            dof += np.where(released, np.maximum(cells - 1.0, 0.0), 0.0).sum(axis=0)
        record.typical = np.where(dof > 0, total / np.where(dof > 0, dof, 1.0), 0.0)
        return record

    def _points(self, sums: np.ndarray, sd: np.ndarray) -> np.ndarray:
        """Where each group lies for the pairing: its mean standardised by the site's
        spread, projected on at most :data:`PAIRING_WIDTH` fixed directions."""
        width = sums.shape[1]
        scale = np.where(sd > 0, 1.0 / np.where(sd > 0, sd, 1.0), 0.0)
        project = None
        if width > PAIRING_WIDTH:  # a fixed projection: the same for every site and table
            project = np.random.default_rng(width).standard_normal((width, PAIRING_WIDTH))
        out = np.empty((self.order.size, min(width, PAIRING_WIDTH)))
        for lo in range(0, self.order.size, CHUNK_GROUPS):
            ids = self.order[lo:lo + CHUNK_GROUPS]
            present = self._cells(ids) if self.absent is not None else self.counts[ids, None]
            with np.errstate(invalid="ignore", divide="ignore"):
                mean = np.where(present > 0, rows_at(sums, ids) / np.maximum(present, 1), 0.0) * scale
            out[lo:lo + ids.size] = mean if project is None else mean @ project
        return out

    def _mend(self, points_of) -> None:
        """Merge every unit that would give cells back (``spreads.unit_reveals``) with its
        nearest unit, up to :data:`MERGE_ROUNDS` times; withhold what is left."""
        flagged = self._revealing()
        if not flagged.size:
            return
        points = points_of()
        for _ in range(MERGE_ROUNDS):
            label = self._labels()
            heads = np.unique(label[flagged])
            self._merge(heads, self._nearest(points, heads, label), label)
            heads = np.unique(self.unit_head[heads])
            heads_, offsets, members = self._units()
            at = np.searchsorted(heads_, heads)
            sizes = offsets[at + 1] - offsets[at]
            starts = np.cumsum(sizes) - sizes
            chosen = members[np.repeat(offsets[at] - starts, sizes) + np.arange(sizes.sum())]
            reveals = self._units_rule(np.append(starts, sizes.sum()), chosen)[2]
            keep = reveals.any(axis=1)
            flagged, reveals = heads[keep], reveals[keep]
            if not flagged.size:
                return
        for head, reveal in zip(flagged.tolist(), reveals):
            features = np.flatnonzero(reveal).tolist()
            for member in self.unit_of(head).tolist():
                self.withheld[member] = sorted(set(self.withheld.get(member, [])) | set(features))

    def _labels(self) -> np.ndarray:
        """(G,) each position's unit, named by its smallest position (the alone: their own)."""
        positions = np.arange(self.order.size)
        heads = np.where(self.partner >= 0, np.minimum(positions, self.partner), positions)
        return np.where(self.unit_head >= 0, self.unit_head, heads)

    def _merge(self, heads: np.ndarray, near: np.ndarray, label: np.ndarray) -> None:
        """Each unit of ``heads`` merged with the unit of its ``near`` group (-1: alone, but
        a merged unit still): the connected components of those pairs of units."""
        from scipy.sparse import coo_matrix, csgraph  # (here: a light task loads no scipy)

        found = near >= 0
        nodes = np.unique(np.concatenate([heads, label[near[found]]]))
        a, b = np.searchsorted(nodes, heads[found]), np.searchsorted(nodes, label[near[found]])
        n_parts, part = csgraph.connected_components(
            coo_matrix((np.ones(a.size), (a, b)), shape=(nodes.size, nodes.size)), directed=False)
        smallest = np.full(n_parts, self.order.size, dtype=np.int64)
        np.minimum.at(smallest, part, nodes)  # (a unit's name is its smallest position)
        at = np.searchsorted(nodes, label)
        touched = nodes[np.minimum(at, nodes.size - 1)] == label
        self.unit_head[touched] = smallest[part[at[touched]]]
        self._epoch += 1

    def _revealing(self) -> np.ndarray:
        """The positions whose unit would give cells back in some feature (not the alone)."""
        out = []
        for lo in range(0, self.order.size, CHUNK_GROUPS):
            released = self._block(lo, min(self.order.size, lo + CHUNK_GROUPS))[3]
            out.append(lo + np.flatnonzero(~released.all(axis=1)))
        out = np.concatenate(out) if out else np.zeros(0, dtype=np.int64)
        return out[~np.isin(out, np.fromiter(self.alone, dtype=np.int64, count=len(self.alone)))]

    def _nearest(self, points: np.ndarray, heads: np.ndarray, label: np.ndarray) -> np.ndarray:
        """For each unit head, the nearest group of another unit (-1: none; never one of
        the alone, whose spreads are withheld), looked for in the head's leaf of median
        splits of the groups (``spreads.LEAF_GROUPS`` of them), else among all groups; the
        heads of a leaf at once, each distance as one head's alone would be."""
        if self._leaf is None:
            self._leaf = np.empty(points.shape[0], dtype=np.int64)
            self._leaves = spreads._leaves(points, np.arange(points.shape[0]), spreads.LEAF_GROUPS)
            for k, leaf in enumerate(self._leaves):
                self._leaf[leaf] = k
        alone = np.zeros(points.shape[0], dtype=bool)
        alone[list(self.alone)] = True
        out = np.full(heads.size, -1, dtype=np.int64)
        leaf_of = self._leaf[heads]
        order = np.argsort(leaf_of, kind="stable")
        for at in np.split(order, np.flatnonzero(np.diff(leaf_of[order])) + 1):
            if not at.size:
                continue
            among = self._leaves[leaf_of[at[0]]]
            out[at] = self._nearest_in(points, among, heads[at], label, alone)
        for k in np.flatnonzero(out < 0).tolist():  # a leaf of one unit: among all groups
            out[k] = self._nearest_in(points, np.arange(points.shape[0]), heads[k:k + 1], label, alone)[0]
        return out

    @staticmethod
    def _nearest_in(points, among, heads, label, alone) -> np.ndarray:
        d2 = ((points[among][None, :, :] - points[heads][:, None, :]) ** 2).sum(axis=2)
        d2[(label[among][None, :] == label[heads][:, None]) | alone[among][None, :]] = np.inf
        best = np.argmin(d2, axis=1)
        return np.where(np.isfinite(d2).any(axis=1), among[best], -1)

    def _withhold_means(self, flagged: tuple | None) -> None:
        """Withhold the spreads of the units of the groups whose sum the p% rule on means
        replaced (their own m2 is about values the table no longer gives)."""
        if flagged is None or flagged[0].size == 0:
            return
        position = np.empty(self.order.size, dtype=np.int64)
        position[self.order] = np.arange(self.order.size)
        self.dominated_means = int(flagged[0].size)
        for p, f in zip(position[flagged[0]].tolist(), flagged[1].tolist()):
            self.replaced.setdefault(p, []).append(f)
            members = [p] if p in self.alone else self.unit_of(p).tolist()
            for member in members:
                self.withheld[member] = sorted(set(self.withheld.get(member, [])) | {f})

    def _dominance(self, found: list) -> None:
        """Withhold the units' spreads the dominance rule flags (``release/dominance.py``)."""
        if not found:
            return
        groups = np.concatenate([f[0] for f in found]).astype(np.int64)
        if groups.size == 0:
            return
        features = np.concatenate([f[1] for f in found]).astype(np.int64)
        peaks = np.concatenate([f[2] for f in found])
        position = np.empty(self.order.size, dtype=np.int64)
        position[self.order] = np.arange(self.order.size)
        present = self.counts[groups] - (0 if self.absent is None else self.absent[groups, features])
        cells = np.where(present >= self.min_size, present, 0)  # (:meth:`_cells`, pair by pair)
        kept = [(p, f, peak, n) for p, f, peak, n in zip(
            position[groups].tolist(), features.tolist(), peaks.tolist(), cells.tolist())
            if p not in self.alone]
        units = [self.unit_of(p) for p, *_ in kept]
        unit_m2s = self._feature_sums(units, [f for _, f, _, _ in kept])
        for (p, f, peak, n), unit, unit_m2 in zip(kept, units, unit_m2s):
            if n > 0 and bool(dominance.dominated(np.array([peak]), unit_m2, np.array([n]))[0]):
                self.dominated += 1
                for member in unit.tolist():
                    self.withheld[member] = sorted(set(self.withheld.get(member, [])) | {f})

    def _feature_sums(self, units: list, features: list) -> list:
        """Per unit (positions), its own m2 of one feature summed: the m2 rows read in
        file order a chunk at a time (``mapped_pages.rows_at``; read one unit at a time,
        all of a 1M-row table's spilled m2 was mapped at once)."""
        sizes = [unit.size for unit in units]
        members = self.order[np.concatenate(units)] if units else np.zeros(0, dtype=np.int64)
        feature = np.repeat(np.asarray(features, dtype=np.int64), sizes)
        values = np.empty(members.size)
        for lo in range(0, members.size, CHUNK_GROUPS):
            hi = min(members.size, lo + CHUNK_GROUPS)
            values[lo:hi] = rows_at(self.m2, members[lo:hi])[np.arange(hi - lo), feature[lo:hi]]
        ends = np.cumsum(sizes)
        return [float(values[end - size:end].sum()) for end, size in zip(ends.tolist(), sizes)]


#: How many times a unit that gives cells back is merged with its nearest before its
#: spread is withheld.
MERGE_ROUNDS = 3

"""The differencing guard: a site never reports the statistics of a row set that, with
the row sets it reported before, gives away a set of fewer than p rows (the floor).

Why: the privacy floor p holds for each reply alone, not across replies. When a cluster
gains one row between two rounds, the difference of its two reported sums (mean x
count) IS that row; a malicious coordinator can arrange this on purpose (a centroid
moved until exactly one row changes side). See docs/explanation/privacy-model.md.

What the guard keeps: the membership of every row set whose per-cluster statistics
(mean, sum, count, squared norm, summed distance) the site has reported, as a bitset of
the site's rows, deduplicated. What it checks, before a cluster's statistics leave the
site (p the effective privacy floor of the task; with p = 1 a one-row cluster may be
reported anyway, so nothing is checked, but the sets are still kept for later tasks):

- **pairs**: the new set S differs from every kept set A by 0 or at least p rows
  (|S symmetric-difference A|);
- **triples**: no signed combination S - A - B or S - A + B of the new set and two kept
  sets has between 1 and p-1 non-zero rows (e.g. S1 = A + {x}, S2 = A + D, S3 = D: the
  third query gives x = S1 - S2 + S3 and is caught).

What it does with a set that fails: it reports the statistics of the CLOSEST kept set
instead ("snap": the server learns nothing it could not compute already, and an honest
run converges as before, a row's worth off exact Lloyd): for a pair, the kept set 1..p-1
rows away; for a triple, the kept set closest to S if it differs from S in at most
max(2p, |S|/4) rows, else the cluster is withheld as if it were under the floor (the
site does not refuse the task: honest runs meet such triples too, e.g. a cluster that
became two earlier ones merged, give or take a row). Combinations of four or more kept sets are not checked.

A site may refuse instead (node config ``guard-refuse = true``): any task the guard would
answer with an earlier set or a withheld cluster is refused with an error reply naming
the policy, and nothing of it is kept. Not the default, because honest runs meet the
guard nearly always (at floor 2, 285 of 294 default runs of the seven algorithms on
bench/quality.py's sets; a withheld cluster in 125: bench/guard_interventions.py): a site cannot tell a
crafted query from an honest cluster that gained a row or split in two, so refusing
would drop honest sites from honest runs (bench/guard_refuse.py: even with the server's
stand-ins for refused training replies, about half of such runs stop), while snapping
already gives the coordinator nothing new.

Cost, stated: memory n/8 bytes per distinct kept set (n = the site's rows), at most
:data:`MAX_BYTES`; time per checked cluster: one XOR-popcount per kept set of a size
within p of it, plus, for triples, one per candidate pair (pairs are filtered by size).
"""

from __future__ import annotations

import contextlib
import hashlib
import os

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

from fedcluster.client_app import site_files
from fedcluster.client_app.site_policy import PolicyRefusal

#: The most memory the kept sets of one data set may take (bytes); past it the guard
#: refuses further tasks rather than forget a set (forgetting would reopen differencing).
MAX_BYTES = 256 * 2**20
#: The most pairs the triple check examines for one new set; past it the set counts as a conflict.
MAX_PAIRS = 200_000


class GuardFull(PolicyRefusal):
    """The kept sets reached :data:`MAX_BYTES`: the site answers no more tasks."""


class GuardRefusal(PolicyRefusal):
    """``guard-refuse``: the task asked for a cluster the guard would have altered."""


def pack(mask: np.ndarray) -> np.ndarray:
    """A boolean row mask as a bitset (uint8; padding bits are 0)."""
    return np.packbits(np.asarray(mask, dtype=bool))


class RowSetHistory:
    """The row sets a site has reported, as bitsets over its ``n_rows`` rows.

    Parameters
    ----------
    n_rows : int
    bits : (m, ceil(n_rows / 8)) uint8, optional
        Kept sets (as saved by :meth:`arrays`).
    """

    def __init__(self, n_rows: int, bits: np.ndarray | None = None) -> None:
        self.n_rows = int(n_rows)
        width = (self.n_rows + 7) // 8
        self._bits = (np.zeros((0, width), dtype=np.uint8) if bits is None
                      else np.ascontiguousarray(bits, dtype=np.uint8))
        if self._bits.ndim != 2 or self._bits.shape[1] != width:
            raise ValueError(f"kept sets of shape {self._bits.shape} do not fit {n_rows} rows")
        self._store = self._bits  # _bits is a view of its first rows (add() grows it)
        self._sizes = np.bitwise_count(self._bits).sum(axis=1, dtype=np.int64)
        self._index = {hashlib.sha1(row.tobytes()).digest(): i for i, row in enumerate(self._bits)}
        self.changed = False

    def __len__(self) -> int:
        return int(self._bits.shape[0])

    @property
    def nbytes(self) -> int:
        return int(self._bits.nbytes)

    def arrays(self) -> np.ndarray:
        """The kept sets, (m, ceil(n/8)) uint8, for saving."""
        return self._bits

    def mask(self, i: int) -> np.ndarray:
        return np.unpackbits(self._bits[i], count=self.n_rows).astype(bool)

    def find(self, bits: np.ndarray) -> int | None:
        return self._index.get(hashlib.sha1(bits.tobytes()).digest())

    def add(self, bits: np.ndarray) -> None:
        if self.nbytes + bits.nbytes > MAX_BYTES:
            raise GuardFull(
                f"the differencing guard keeps {len(self)} row sets of this data "
                f"({self.nbytes / 2**20:.0f} MiB, its limit): the site answers no more tasks "
                "on it (a new set could not be checked against the earlier ones)")
        m = len(self)
        self._index[hashlib.sha1(bits.tobytes()).digest()] = m
        if m == self._store.shape[0]:  # grown by doubling (an add copies nothing), to the cap
            width = max(1, self._store.shape[1])
            grown = np.zeros((min(max(8, 2 * m), MAX_BYTES // width + 1), self._store.shape[1]),
                             dtype=np.uint8)
            grown[:m] = self._store[:m]
            self._store = grown
        self._store[m] = bits
        self._bits = self._store[:m + 1]
        self._sizes = np.append(self._sizes, np.bitwise_count(bits).sum(dtype=np.int64))
        self.changed = True

    def closest(self, bits: np.ndarray, size: int, within: int) -> int | None:
        """The kept set closest to ``bits`` among those 1..within rows away, or None."""
        near = np.flatnonzero(np.abs(self._sizes - size) <= within)
        if near.size == 0:
            return None
        distance = np.bitwise_count(self._bits[near] ^ bits).sum(axis=1, dtype=np.int64)
        close = (distance >= 1) & (distance <= within)
        if not close.any():
            return None
        return int(near[close][np.argmin(distance[close])])

    def triple_conflict(self, bits: np.ndarray, size: int, gap: int) -> bool:
        """True if S - A - B or S - A + B has 1..gap-1 non-zero rows for two kept sets."""
        sizes, order = self._sizes, np.argsort(self._sizes, kind="stable")
        sorted_sizes = sizes[order]
        examined = 0
        for a in range(len(self)):
            A = self._bits[a]
            for sign in (-1, 1):
                # The combination's entries sum to size - |A| + sign |B|; its support is at
                # least the absolute value of that sum, so |B| lies in a window of 2 gap - 1.
                centre = sign * (sizes[a] - size)
                lo, hi = np.searchsorted(sorted_sizes, [centre - gap + 1, centre + gap], side="left")
                candidates = order[lo:hi]
                candidates = candidates[candidates != a]
                if sign == -1:
                    candidates = candidates[candidates > a]  # S - A - B is symmetric in A, B
                if candidates.size == 0:
                    continue
                examined += candidates.size
                if examined > MAX_PAIRS:
                    return True  # too many to check: treat as unsafe
                B = self._bits[candidates]
                S, nA, nB, nS = bits, ~A, ~B, ~bits
                if sign == -1:  # S - A - B = 0 at (0,0,0), (1,1,0), (1,0,1)
                    zero = (nS & nA & nB) | (S & A & nB) | (S & nA & B)
                else:  # S - A + B = 0 at (0,0,0), (1,1,0), (0,1,1)
                    zero = (nS & nA & nB) | (S & A & nB) | (nS & A & B)
                support = np.bitwise_count(~zero).sum(axis=1, dtype=np.int64)
                # Padding bits are 0 in every set, so they count as zeros.
                if np.any((support >= 1) & (support < gap)):
                    return True
        return False


class DifferencingGuard:
    """Decides, cluster by cluster, which row set's statistics a reply may carry.

    Parameters
    ----------
    history : RowSetHistory or None
        The site's kept sets; None: the guard is off (node config
        ``differencing-guard = false``) and every set is reported as it is.
    refuse : bool
        Refuse the task (:class:`GuardRefusal`) instead of snapping or withholding
        (node config ``guard-refuse``).
    """

    def __init__(self, history: RowSetHistory | None, refuse: bool = False) -> None:
        self.history = history
        self.refuse = refuse
        self.snapped = 0  # clusters reported as an earlier set
        self.withheld = 0  # clusters withheld (a triple no kept set stands in for)

    @property
    def active(self) -> bool:
        return self.history is not None

    def admit(self, mask: np.ndarray, floor: int) -> np.ndarray | None:
        """The row set whose statistics may be reported for the cluster ``mask``.

        Returns ``mask`` itself (kept from now on), an earlier kept set to report
        instead (1..p-1 rows away, p = ``floor``; or, for a triple, a near one), or None:
        withhold the cluster (a triple no kept set can stand in for).
        """
        if self.history is None:
            return mask
        bits = pack(mask)
        if self.history.find(bits) is not None:
            return mask  # reported before: nothing new
        size = int(np.count_nonzero(mask))
        gap = int(floor)
        if gap <= 1:  # floor 1: a one-row cluster may be reported anyway; kept for later runs
            self.history.add(bits)
            return mask
        near = self.history.closest(bits, size, gap - 1)
        if near is None and self.history.triple_conflict(bits, size, gap):
            # No kept set is that close, but two combine with this one into a few rows:
            # report the closest kept set if it is near (honest runs meet this in small
            # clusters, a few rows apart; a crafted query is far from every kept set).
            self._refuse_if_asked(size, "with two clusters it reported before combines into "
                                        f"1 to {gap - 1} rows")
            near = self.history.closest(bits, size, max(2 * gap, size // 4))
            if near is None:
                self.withheld += 1
                return None
        if near is not None:
            self._refuse_if_asked(size, f"differs from a cluster it reported before by 1 to "
                                        f"{gap - 1} rows")
            self.snapped += 1
            return self.history.mask(near)
        self.history.add(bits)
        return mask


    def _refuse_if_asked(self, size: int, why: str) -> None:
        if self.refuse:
            raise GuardRefusal(
                f"site policy differencing-guard (guard-refuse): the task asks for a cluster "
                f"of {size} rows that {why} (the privacy floor); a coordinator could "
                "difference the replies into fewer rows than the floor, so the site refuses "
                "the task rather than answer with an earlier cluster")


#: The guard that is off (exactness tests, ``differencing-guard = false``).
OFF = DifferencingGuard(None)


# ------------------------------------------------------------------ where the sets are kept
#: The ``Context.state`` records that keep the sets in simulation (the SuperNode, the
#: simulation engine and the in-process harness keep one state per run and site).
STATE_RECORD = "fedcluster-row-sets"
#: Which rows they belong to (one RecordDict holds every record under one name space).
STATE_DATA_RECORD = "fedcluster-row-sets-data"


@contextlib.contextmanager
def kept_in_state(state: RecordDict, fingerprint: str, n_rows: int):
    """The history of this run's ``Context.state`` (simulation: one run's sets)."""
    config = state.config_records.get(STATE_DATA_RECORD)
    history = RowSetHistory(n_rows)
    if config is not None and config.get("data") == fingerprint:
        history = RowSetHistory(n_rows, state.array_records[STATE_RECORD]["bits"].numpy())
    yield history
    if history.changed:
        state.config_records[STATE_DATA_RECORD] = ConfigRecord({"data": fingerprint})
        state.array_records[STATE_RECORD] = ArrayRecord({"bits": Array(history.arrays())})


@contextlib.contextmanager
def kept_in_file(directory: str | os.PathLike, fingerprint: str, n_rows: int):
    """The history of a data file, across all runs, in ``directory`` (a deployed site's
    cache): read and written under a lock, replaced atomically, so two tasks never
    interleave and a crash never leaves half a file.

    Raises
    ------
    OSError
        The directory cannot hold the file (the site then answers no task).
    """
    with site_files.locked(directory, f"row-sets-{fingerprint[:40]}.npy") as target:
        bits = np.load(target) if target.exists() else None
        history = RowSetHistory(n_rows, bits)
        yield history
        if history.changed:
            site_files.replace_atomically(target, lambda out: np.save(out, history.arrays()))

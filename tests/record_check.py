"""An audit of a site's record written in the tests, apart from the site's own
(``release/audit``): it reads the record's files with numpy, maps each row instance to
the test's own rows (by the rows' keys), and checks with its own linear algebra.

- **Every recorded value is its function of the rows**: each table's kept entry (its
  groups' counts and sums, in the table's order) equals the counts and present sums of
  the rows the record says each group holds, or, where the record names a stand-in
  (the p% rule's), its present cells times the mean of the table's other groups' cells.
- **Nothing in the record's span gives a value away**, per feature over the cells' values
  (a corrected row's unchanged cell one value; a missing cell none), with the groups that
  release a real sum of it (present cells at least the group's p, no stand-in): no
  nonzero combination isolates fewer than p values (the smallest support, exactly, by
  mixed-integer programs); with the spread units' sums of squares no value and no row's
  change is determined (floating-point SVD of the Jacobian at the true values); no sum
  the p% rule withheld is in the span of the real sums, and no real sum made after it
  holds one of its cells.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.linalg import null_space

from fedcluster.client_app.data.versions import row_keys
from test_versions import FileSite


def _array(directory: Path, name: str, rows: int, shape=(), dtype=np.int64) -> np.ndarray:
    path = directory / name
    if rows == 0 or not path.exists():
        return np.zeros((0, *shape), dtype=dtype)
    return np.array(np.load(path)[:rows])


@dataclass
class Version:
    """A version of the test's table as written: its rows, each row's id and each
    cell's corrections so far (a cell's VALUE is (row id, column, corrections))."""

    X: np.ndarray
    ids: np.ndarray
    cell_edits: np.ndarray


class RecordCheck:
    """The record of one site (``store``: its directory), read apart from the site."""

    def __init__(self, store: Path) -> None:
        self.store = Path(store)
        meta = json.loads((self.store / "store.json").read_text())
        self.meta = meta
        n_i, n_g = int(meta["instances"]), int(meta["groups"])
        self.keys = _array(self.store, "keys.npy", n_i, (2,), np.uint64)
        self.offsets = _array(self.store, "offsets.npy", n_g + 1)
        self.members = _array(self.store, "members.npy", int(meta["members"]))
        self.group_p = _array(self.store, "group-p.npy", n_g)
        unit = _array(self.store, "unit.npy", int(meta.get("units", 0)))
        self.unit = np.concatenate([unit, np.arange(unit.size, n_g)])
        self.stand = _array(self.store, "stand-ins.npy", int(meta.get("stand-ins", 0)), (3,))
        self.identity: dict[int, tuple] = {}  # instance -> (row id, values keys, values)

    @property
    def n_groups(self) -> int:
        return int(self.offsets.size - 1)

    def group(self, g: int) -> np.ndarray:
        return self.members[self.offsets[g]:self.offsets[g + 1]]

    def add_version(self, version: Version) -> None:
        """Name the record's instances of ``version``'s rows: the k-th row of a key in
        file order is the k-th instance of that key."""
        keys = row_keys.content_keys(np.ascontiguousarray(version.X))
        by_key: dict[tuple, list[int]] = {}
        for instance, key in enumerate(map(tuple, self.keys.tolist())):
            by_key.setdefault(key, []).append(instance)
        seen: dict[tuple, int] = {}
        for r, key in enumerate(map(tuple, keys.tolist())):
            k = seen.get(key, 0)
            seen[key] = k + 1
            instance = by_key[key][k]
            cells = tuple(None if np.isnan(v) else (int(version.ids[r]), j, int(e))
                          for j, (v, e) in enumerate(zip(version.X[r], version.cell_edits[r])))
            self.identity[instance] = (int(version.ids[r]), cells, tuple(version.X[r].tolist()))

    def stood(self, g: int, j: int, kinds=(0, 1, 2)) -> bool:
        hit = (self.stand[:, 0] == g) & (self.stand[:, 1] == j) & np.isin(self.stand[:, 2], kinds)
        return bool(hit.any())

    # ------------------------------------------------------------ values are functions of rows
    def entry_findings(self, cache: Path) -> list[str]:
        """Each table's kept entry against the rows its groups hold (module docstring)."""
        out = []
        earlier: set[int] = set()
        for table in self.meta["tables"]:
            if table.get("entry") == "memory":
                continue
            base = cache / "groups" / table["entry"]
            if not Path(f"{base}.counts.npy").exists():
                continue
            counts = np.load(f"{base}.counts.npy")
            sums = np.load(f"{base}.sums.npy")
            numbers = np.load(self.store / f"table-{table['n']}.npy")
            flagged = np.zeros(sums.shape, dtype=bool)
            for at, g in enumerate(numbers.tolist()):
                for j in range(sums.shape[1]):
                    flagged[at, j] = self.stood(g, j, (0, 2))
            cells = np.zeros(sums.shape)
            for at, g in enumerate(numbers.tolist()):
                rows = [self.identity[i] for i in self.group(g).tolist() if i in self.identity]
                if len(rows) != self.group(g).size:
                    continue  # (an instance of a version this test did not add)
                if counts[at] != len(rows):
                    out.append(f"table {table['n']}, group {at}: count {counts[at]} of {len(rows)} rows")
                values = np.array([r[2] for r in rows])
                present = ~np.isnan(values)
                cells[at] = present.sum(axis=0)
                true = np.where(present, values, 0.0).sum(axis=0)
                real = (~flagged[at]) & (cells[at] >= int(self.group_p[g]))
                if not np.allclose(sums[at, real], true[real], rtol=1e-9, atol=1e-9):
                    out.append(f"table {table['n']}, group {at}: sums {sums[at, real]} of {true[real]}")
            # the p% rule's stand-ins, where made (a kept group keeps its table's): its cells
            # times the mean of the released cells of the groups the table made with it
            new = ~np.isin(numbers, list(earlier))
            earlier.update(numbers.tolist())
            for j in np.flatnonzero((flagged & new[:, None]).any(axis=0)).tolist():
                keep = new & ~flagged[:, j]
                mean = sums[keep, j].sum() / max(cells[keep, j].sum(), 1.0)
                made = new & flagged[:, j]
                if not np.allclose(sums[made, j], cells[made, j] * mean, rtol=1e-9):
                    out.append(f"table {table['n']}, feature {j}: a stand-in is no mean of the rest")
        return out

    # ------------------------------------------------------------ the span
    def span_findings(self, width: int, p: int) -> list[str]:
        """Per feature, what the record's span would give (module docstring)."""
        out = []
        known = [g for g in range(self.n_groups) if all(i in self.identity for i in self.group(g).tolist())]
        for j in range(width):
            index: dict[tuple, int] = {}
            value: list[float] = []
            sets = {}
            for g in known:
                keys = [self.identity[i][1][j] for i in self.group(g).tolist()]
                present = [k for k in keys if k is not None]
                for k, i in zip(keys, self.group(g).tolist()):
                    if k is not None and k not in index:
                        index[k] = len(value)
                        value.append(self.identity[i][2][j])
                sets[g] = sorted({index[k] for k in present})
            real = [g for g in known if len(sets[g]) >= int(self.group_p[g]) and not self.stood(g, j)]
            if not real:
                continue
            A = np.zeros((len(real), len(value)))
            for r, g in enumerate(real):
                A[r, sets[g]] = 1.0
            smallest = _smallest_support(A)
            if smallest < p:
                out.append(f"feature {j}: a combination isolates {smallest} value(s)")
            rank = np.linalg.matrix_rank(A)
            for g in known:  # a withheld sum: not in the span, no later sum holds its cells
                if not self.stood(g, j, (0,)) or not sets[g]:
                    continue
                e = np.zeros(len(value))
                e[sets[g]] = 1.0
                if np.linalg.matrix_rank(np.vstack([A, e])) == rank:
                    out.append(f"feature {j}: the span gives the sum group {g}'s p% rule withheld")
                later = [h for h in real if h > g and set(sets[h]) & set(sets[g])]
                if later:
                    out.append(f"feature {j}: group {later[0]} sums a cell group {g} withheld")
            out += self._jacobian(j, real, sets, np.array(value), index, p)
        return out

    def _jacobian(self, j: int, real: list, sets: dict, x: np.ndarray, index: dict, p: int) -> list:
        units: dict[int, set] = {}
        stood = {int(self.unit[g]) for g in range(self.n_groups) if self.stood(g, j)}
        for g in real:  # (a unit whose group stood in has its spread withheld there)
            if self.unit[g] >= 0 and int(self.unit[g]) not in stood:
                units.setdefault(int(self.unit[g]), set()).update(sets[g])
        rows = [np.isin(np.arange(x.size), sets[g]).astype(float) for g in real]
        scale = 1.0 + np.abs(x).max()
        rows += [np.isin(np.arange(x.size), sorted(u)) * 2.0 * x / scale for u in units.values()]
        out = [f"feature {j}: a unit's sum of squares over {len(u)} value(s)"
               for u in units.values() if 0 < len(u) < max(3, p)]
        N = null_space(np.array(rows))
        determined = [v for v in range(x.size) if np.linalg.norm(N[v]) < 1e-8]
        if determined:
            out.append(f"feature {j}: {len(determined)} value(s) determined")
        by_row: dict[int, list[int]] = {}
        for key, v in index.items():
            by_row.setdefault(key[0], []).append(v)
        for values in by_row.values():
            for a in range(len(values)):
                for b in range(a + 1, len(values)):
                    if np.linalg.norm(N[values[a]] - N[values[b]]) < 1e-8:
                        out.append(f"feature {j}: a row's change determined")
        return out


def _smallest_support(A: np.ndarray) -> int:
    """The fewest columns (values) a nonzero combination of the rows of ``A`` isolates:
    per column v0, a mixed-integer program min sum z subject to c = A^T y, c_v0 = 1,
    -z <= c <= z, z binary (every nonzero c, scaled so that its largest coefficient is
    1, is feasible for the v0 it sits at); columns alike in every row share their c, so
    one v0 per kind."""
    from scipy.optimize import Bounds, LinearConstraint, milp

    m, n = A.shape
    kinds: dict[tuple, int] = {}
    for v in range(n):
        kinds.setdefault(tuple(A[:, v].tolist()), v)
    best = n + 1
    cost = np.r_[np.zeros(m), np.ones(n)]
    integrality = np.r_[np.zeros(m), np.ones(n)]
    bounds = Bounds(np.r_[np.full(m, -np.inf), np.zeros(n)], np.r_[np.full(m, np.inf), np.ones(n)])
    upper = LinearConstraint(np.hstack([A.T, -np.eye(n)]), -np.inf, 0.0)
    lower = LinearConstraint(np.hstack([A.T, np.eye(n)]), 0.0, np.inf)
    for v0 in kinds.values():
        fixed = LinearConstraint(np.r_[A[:, v0], np.zeros(n)][None, :], 1.0, 1.0)
        result = milp(cost, constraints=[upper, lower, fixed], integrality=integrality,
                      bounds=bounds, options={"time_limit": 30})
        if result.status == 0:
            best = min(best, int(round(result.fun)))
        elif result.status != 2:  # (2: infeasible, no combination reaches v0)
            raise AssertionError(f"the check's program did not solve: {result.message}")
    return best


# ------------------------------------------------------------------ sites the tests drive
class RunSite(FileSite):
    """A site's real ClientApp in a run whose config says ``missing``: a CSV data-path,
    or a SQLite table (``data-url``), through one cache."""

    def __init__(self, node: dict, cache, missing: str) -> None:
        from fedcluster import client_app as client_module
        from fedcluster.common.config import run_config_defaults
        from fedcluster.simulation import InProcessGrid

        config = {"cache-dir": str(cache), "site-id": "target", "ledger-path": "off", **node}
        self.grid = InProcessGrid(client_module.app, [config],
                                  {**run_config_defaults(), "missing": missing})
        self.node_id = next(iter(self.grid.contexts))
        self.messages, self.server_floor = 0, 1
        self.node = node


#: One site's ClientApp in a process of its own (a SuperNode's per-message process), on
#: the cache it shares with the other: it waits for the start, asks the report's
#: evaluation at its centroids and prints the reply. ``bare``: without the defence (no
#: lock over the record; each judges what it read before the other wrote).
_CHILD = r"""
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
import numpy as np
from record_check import RunSite
from fedcluster.common import protocol
path, cache, node, missing, transform, centroids, start, me, bare = sys.argv[2:11]
site = RunSite({"data-path": path, **json.loads(node)}, cache, missing)
params = {} if transform == "" else {"transform": transform}
# (the version is made before the race, one process after the other: the race shown is the
# report's, not the version's, whose build holds the record's lock in either mode)
while me != "0" and not os.path.exists(os.path.join(os.path.dirname(start), "described-0")):
    time.sleep(0.01)
site.ask("describe", [])
open(os.path.join(os.path.dirname(start), f"described-{me}"), "w").close()
if bare == "1":
    import contextlib
    from fedcluster.client_app.release import gate, record

    @contextlib.contextmanager
    def unlocked(self):
        yield record.Store.open(__import__("pathlib").Path(self.name))
    record.Record.held = unlocked
    admit = gate.admit_report

    def met(*args, **kwargs):  # both have read the record before either writes it
        open(os.path.join(os.path.dirname(start), f"read-{me}"), "w").close()
        while len([n for n in os.listdir(os.path.dirname(start)) if n.startswith("read-")]) < 2:
            time.sleep(0.01)
        return admit(*args, **kwargs)
    gate.admit_report = met
    # without the lock the two processes' writes of the record can lose each other's
    # partition, and the check before the reply would then refuse by accident: the bare
    # site (the code before the one record) had no such check
    gate.in_record = lambda groups: True
while not os.path.exists(start):
    time.sleep(0.01)
arrays, _ = site.ask("evaluate", [np.array(json.loads(centroids))], report=True, **params)
reply = protocol.reply_arrays("evaluate", arrays)
print(json.dumps({"counts": reply.counts.tolist(), "sums": reply.sums.tolist()}))
"""


def race(path: Path, cache: Path, node: dict, missing: str, transform: str | None,
         centroids: list, bare: bool = False) -> list[dict]:
    """Two processes on one cache, started together, each asking the report's evaluation
    at its own centroids: their replies (counts and sums per cluster)."""
    import subprocess
    import sys

    gate = Path(path).parent / f"race-{np.random.default_rng().integers(1 << 40)}"
    gate.mkdir()
    start = gate / "start"
    tests = str(Path(__file__).parent)
    children = [subprocess.Popen(
        [sys.executable, "-c", _CHILD, tests, str(path), str(cache), json.dumps(node), missing,
         transform or "", json.dumps(C), str(start), str(me), "1" if bare else "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for me, C in enumerate(centroids)]
    start.touch()
    replies = []
    for child in children:
        out, err = child.communicate(timeout=300)
        assert child.returncode == 0, err[-2000:]
        replies.append(json.loads(out.strip().splitlines()[-1]))
    return replies

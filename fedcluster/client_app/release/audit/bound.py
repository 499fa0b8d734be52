"""The sound bound of ``support.py``'s docstring: one linear program per light atom.

For a nonzero c of V (the row space's vectors that vanish on every heavy atom) with
support weight W < p, scale c so that its largest coefficient in magnitude is 1 at atom
a0: then sum_a w_a |c_a| <= W. So

    LP(a0) = min sum_a w_a t_a  subject to  c = A^T y,  c_a = 0 on heavy atoms,
             c_a0 = 1,  -t_a <= c_a <= t_a <= 1

is at most p - 1 for that a0, and LP(a0) > p - 1 for every light a0 proves that no
combination isolates fewer than p rows.

The programs differ in a0 alone, so they are one model solved again with two bounds
changed (t_a0 fixed at 1, the row c_a0 - t_a0 <= 0 made an equality), each solve starting
from the last one's basis: HiGHS through the binding SciPy ships
(``scipy.optimize._highspy``), where ``scipy.optimize.linprog`` built, checked and solved
each program from nothing, about six times the solver's own time (a report's audit at
p_site 5 to 11 made thousands of them). The optimum of each program is the same
(the same model, the same solver and tolerances); where several optima tie, the support
named may be another of them. Where that binding is absent (another SciPy), each program
is solved by ``linprog`` as before.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Bound", "LP_MARGIN", "lp_bound"]

#: How far above p - 1 a linear program's optimum must lie to prove a bound (the solver's
#: feasibility tolerance is 1e-7; supports are whole numbers of rows).
LP_MARGIN = 1e-3

OPTIMAL, INFEASIBLE, UNSOLVED = "optimal", "infeasible", "unsolved"


@dataclass(frozen=True)
class Bound:
    """What the linear programs showed.

    Attributes
    ----------
    holds : bool
        Every LP(a0) above p - 1: no combination isolates fewer than p rows.
    witness : int or None
        Where it does not hold: the rows of the support the failing program found (under
        p: a combination found; p or more: the bound's own refusal); None where the
        solver did not finish.
    atoms : (A,) bool
        That support's atoms.
    programs : int
        How many programs were solved.
    """

    holds: bool
    witness: int | None
    atoms: np.ndarray
    programs: int


def _highs():
    """SciPy's HiGHS binding, or None (another SciPy)."""
    try:
        from scipy.optimize._highspy import _core
    except ImportError:
        return None
    return _core if hasattr(_core, "_Highs") and hasattr(_core, "HighsLp") else None


class _Session:
    """The programs as one HiGHS model, LP(a0) by two bound changes (module docstring).
    Variables (y: one per set, free; t: one per light atom, in [0, 1]); rows: c_a - t_a
    <= 0 and -c_a - t_a <= 0 per light atom, c_h = 0 per heavy atom."""

    def __init__(self, core, on_light, on_heavy, cost) -> None:
        from scipy.sparse import bmat, identity

        self.core, self.n_sets, self.n_light = core, on_light.shape[1], on_light.shape[0]
        eye = identity(self.n_light, format="csr")
        matrix = bmat([[on_light, -eye], [-on_light, -eye], [on_heavy, None]], format="csc")
        lp = core.HighsLp()
        lp.num_col_, lp.num_row_ = matrix.shape[1], matrix.shape[0]
        lp.a_matrix_.num_col_, lp.a_matrix_.num_row_ = matrix.shape[1], matrix.shape[0]
        lp.a_matrix_.format_ = core.MatrixFormat.kColwise
        lp.a_matrix_.start_ = matrix.indptr.astype(np.int32)
        lp.a_matrix_.index_ = matrix.indices.astype(np.int32)
        lp.a_matrix_.value_ = matrix.data.astype(np.float64)
        inf = core.kHighsInf
        lp.col_cost_ = np.r_[np.zeros(self.n_sets), cost]
        lp.col_lower_ = np.r_[np.full(self.n_sets, -inf), np.zeros(self.n_light)]
        lp.col_upper_ = np.r_[np.full(self.n_sets, inf), np.ones(self.n_light)]
        lp.row_lower_ = np.r_[np.full(2 * self.n_light, -inf), np.zeros(on_heavy.shape[0])]
        lp.row_upper_ = np.zeros(matrix.shape[0])
        self.highs = core._Highs()
        self.highs.setOptionValue("output_flag", False)
        # (no presolve: each solve starts from the last basis, and an infeasible program
        # is reported so, not "unbounded or infeasible")
        self.highs.setOptionValue("presolve", "off")
        self.highs.passModel(lp)

    def solve(self, i: int) -> tuple[str, float, np.ndarray | None]:
        highs, core, inf = self.highs, self.core, self.core.kHighsInf
        t = self.n_sets + i
        highs.changeColBounds(t, 1.0, 1.0)
        highs.changeRowBounds(i, 0.0, 0.0)
        try:
            status = self._run()
            if status not in (core.HighsModelStatus.kOptimal, core.HighsModelStatus.kInfeasible):
                highs.clearSolver()  # (once more from nothing before calling it unsolved)
                status = self._run()
            if status == core.HighsModelStatus.kInfeasible:
                return INFEASIBLE, np.inf, None
            if status != core.HighsModelStatus.kOptimal:
                return UNSOLVED, np.nan, None
            y = np.asarray(highs.getSolution().col_value[:self.n_sets], dtype=np.float64)
            return OPTIMAL, float(highs.getInfo().objective_function_value), y
        finally:
            highs.changeColBounds(t, 0.0, 1.0)
            highs.changeRowBounds(i, -inf, 0.0)

    def _run(self):
        if self.highs.run() == self.core.HighsStatus.kError:
            return None
        return self.highs.getModelStatus()


class _EachAlone:
    """The programs one by one through ``scipy.optimize.linprog`` (where SciPy ships no
    HiGHS binding this module knows)."""

    def __init__(self, on_light, on_heavy, cost) -> None:
        from scipy.optimize import linprog
        from scipy.sparse import csr_matrix, hstack, identity, vstack

        self.linprog = linprog
        n_light, n_sets = on_light.shape
        eye = identity(n_light, format="csr")
        self.upper = vstack([hstack([on_light, -eye]), hstack([-on_light, -eye])], format="csr")
        self.cost = np.r_[np.zeros(n_sets), cost]
        self.bounds = [(None, None)] * n_sets + [(0.0, 1.0)] * n_light
        self.fixed = hstack([on_heavy, csr_matrix((on_heavy.shape[0], n_light))], format="csr")
        self.zero_t, self.on_light, self.n_sets = csr_matrix((1, n_light)), on_light, n_sets

    def solve(self, i: int) -> tuple[str, float, np.ndarray | None]:
        from scipy.sparse import hstack, vstack

        equal = vstack([self.fixed, hstack([self.on_light[i], self.zero_t])], format="csr")
        result = self.linprog(self.cost, A_ub=self.upper, b_ub=np.zeros(self.upper.shape[0]),
                         A_eq=equal, b_eq=np.r_[np.zeros(self.fixed.shape[0]), 1.0],
                         bounds=self.bounds, method="highs")
        if result.status == 2:
            return INFEASIBLE, np.inf, None
        if result.status != 0:
            return UNSOLVED, np.nan, None
        return OPTIMAL, float(result.fun), np.asarray(result.x[:self.n_sets])


def lp_bound(found, p: int, *, one_model: bool = True) -> Bound:
    """The bound of the module docstring over the light atoms of ``found`` (an
    ``support.Atoms``), at ``p``; ``one_model`` False: each program by ``linprog``."""
    from scipy.sparse import csr_matrix

    weights = found.weights
    light = np.flatnonzero(weights < p)
    if light.size == 0:
        return Bound(True, None, np.zeros(weights.size, dtype=bool), 0)
    heavy = np.flatnonzero(weights >= p)
    incidence = csr_matrix((np.ones(found.set_idx.size), (found.entry_atoms(), found.set_idx)),
                           shape=(weights.size, found.n_sets))
    on_light, on_heavy = incidence[light], incidence[heavy]
    cost = weights[light].astype(np.float64)
    core = _highs() if one_model else None
    programs = _Session(core, on_light, on_heavy, cost) if core is not None \
        else _EachAlone(on_light, on_heavy, cost)
    solved, best = 0, None
    for i in np.argsort(weights[light], kind="stable").tolist():
        solved += 1
        status, value, y = programs.solve(i)
        if status == INFEASIBLE:
            continue  # no combination reaches this atom without a heavy atom
        if status == UNSOLVED:
            return Bound(False, None, np.zeros(weights.size, dtype=bool), solved)
        if value > p - 1 + LP_MARGIN:
            continue
        support = np.abs(incidence @ y) > 1e-7
        found_here = Bound(False, int(weights[support].sum()), support, solved)
        if best is None or found_here.witness < best.witness:
            best = found_here
        if best.witness < p:
            break  # a combination found: the finding is proved
    if best is not None:
        return Bound(False, best.witness, best.atoms, solved)
    return Bound(True, None, np.zeros(weights.size, dtype=bool), solved)

"""Pyomo backend: the one-hot MILP (:mod:`formulations.milp`) as a Pyomo model, solved by HiGHS
or by any MILP solver Pyomo knows (``--solver gurobi``, ``scip``, ``cbc``) when it is installed.

The model is written once, solver-agnostically; only the option names for "prove optimality"
(a zero relative gap) and the time limit differ per solver. Variables carry domain names
(``x_T=8``, ``f_P^1*T^1=32``, ``combo=2``) so an LP file or a solver log reads like the problem.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sys
import time

from formulations import ties
from formulations.encoding import NO_CUTS, Cuts, Encoding
from formulations.milp import INF, build_rows, decode, plan_objective
from formulations.result import RawSolution, Status

#: Pyomo solver names for the names users type.
SOLVER_NAMES = {"highs": "appsi_highs", "gurobi": "gurobi", "scip": "scip", "cbc": "cbc",
                "glpk": "glpk", "cplex": "cplex"}
GAP_OPTION = {"appsi_highs": "mip_rel_gap", "gurobi": "MIPGap", "cbc": "ratioGap",
              "scip": "limits/gap", "glpk": "mipgap", "cplex": "mipgap"}
TIME_OPTION = {"appsi_highs": "time_limit", "gurobi": "TimeLimit", "cbc": "seconds",
               "scip": "limits/time", "glpk": "tmlim", "cplex": "timelimit"}

#: HiGHS's options beyond the zero relative gap (docs/encoding.md, "HiGHS through Pyomo")
HIGHS_OPTIONS = {
    "mip_abs_gap": 1e-9,                      # rows are scaled: the objective is near 1
    # tight feasibility so a near-zero binary cannot carry a visible share of a product term
    "mip_feasibility_tolerance": 1e-9,
    "primal_feasibility_tolerance": 1e-9,
}
# (tried and not adopted: mip_pscost_minreliable = 0, benchmarks/README.md, "HiGHS branching")


@functools.lru_cache(maxsize=None)
def available(name: str = "highs") -> bool:
    """Whether Pyomo finds the solver (probed once per process: a probe costs ~35 ms)."""
    try:
        import pyomo.environ as pyo
    except ImportError:
        return False
    log = logging.getLogger("pyomo")
    level = log.level
    log.setLevel(logging.CRITICAL)         # Pyomo logs a traceback for a missing executable
    try:
        return bool(pyo.SolverFactory(SOLVER_NAMES.get(name, name)).available(exception_flag=False))
    except Exception:  # a solver plugin that cannot even be probed is not available
        return False
    finally:
        log.setLevel(level)


def build_model(enc: Encoding, cuts: Cuts = NO_CUTS):
    """The Pyomo model of an encoding and a query's cuts, and the rows it was built from."""
    import pyomo.environ as pyo
    from pyomo.core.expr.numeric_expr import LinearExpression

    r = build_rows(enc, cuts)
    m = pyo.ConcreteModel(name="plan")
    names = list(r.names)
    if len(set(names)) != len(names):          # keep names readable but unique
        names = [f"{n}#{i}" for i, n in enumerate(names)]
    pos = {n: i for i, n in enumerate(names)}

    def bounds(_m, n):
        lo, hi = r.lb[pos[n]], r.ub[pos[n]]
        return (None if lo == -INF else lo, None if hi == INF else hi)

    def domain(_m, n):
        i = pos[n]
        return pyo.Binary if r.integer[i] and r.ub[i] > 0 else pyo.Reals

    m.x = pyo.Var(names, bounds=bounds, domain=domain)
    xs = [m.x[n] for n in names]

    def linear(coefs: dict[int, float], constant: float = 0.0):
        # a flat LinearExpression, not a sum of products: Pyomo reads its terms off directly
        # instead of walking a nested expression tree for every row
        return LinearExpression(constant=constant, linear_coefs=list(coefs.values()),
                                linear_vars=[xs[i] for i in coefs])

    m.rows = pyo.ConstraintList()
    for coefs, lo, hi, _name in r.rows:
        body = linear(coefs)
        if lo == hi:
            m.rows.add(body == lo)
        else:
            m.rows.add(pyo.inequality(None if lo == -INF else lo, body, None if hi == INF else hi))
    m.goals = pyo.ObjectiveList(sense=pyo.minimize)
    m.caps = pyo.ConstraintList()
    m.goal_exprs = {g: linear(coefs, r.obj_const if g == "objective" else 0.0)
                    for g, coefs in r.goals.items()}
    m.xs = xs
    return m, r


def solve(enc: Encoding, cuts: Cuts = NO_CUTS, time_limit: float | None = None,
          solver: str = "highs") -> RawSolution:
    import pyomo.environ as pyo

    t0 = time.perf_counter()
    m, r = build_model(enc, cuts)
    build_s = time.perf_counter() - t0
    if r.violated:
        return RawSolution(Status.INFEASIBLE, None, None, None, None, 0.0, build_s, solver,
                           note="violated: " + ", ".join(r.violated))
    name = SOLVER_NAMES.get(solver, solver)
    # APPSI's HiGHS, told that every variable of the model is one of its own (all are m.x),
    # takes them in one call, not by a walk of each row for variables it has not met:
    # set_instance of GPT-3 175B's 3,207 rows 0.16 -> 0.11 s
    opt = pyo.SolverFactory(name, **({"only_child_vars": True} if name == "appsi_highs" else {}))
    if name in GAP_OPTION:
        opt.options[GAP_OPTION[name]] = 0.0
    if name == "appsi_highs":
        opt.options.update(HIGHS_OPTIONS)
    session = _Session(m, r, opt, name)
    first, last, note = ties.run(session, time_limit, cuts.break_ties, window=cuts.window)
    if not first.ok:
        return RawSolution(first.status, None, None, None, None, session.solve_s, build_s,
                           solver, note=first.note)
    choice, combo = decode(enc, r, last.x)
    objective = plan_objective(enc, choice, combo)
    bound = first.bound * r.time_unit if first.bound is not None else None
    # "zero gap" up to the solver's floating-point tolerances (1e-6 relative, rows near 1)
    proven = first.proven and bound is not None and \
        first.value * r.time_unit - bound <= 1e-6 * abs(objective)
    return RawSolution(Status.OPTIMAL if proven else Status.FEASIBLE, choice, enc.combos[combo],
                       objective, bound, session.solve_s, build_s, solver,
                       note=note or str(first.status))


@contextlib.contextmanager
def _stdout_to_stderr():
    """Standard output (file descriptor 1) sent to standard error for the duration: HiGHS
    writes its warnings there from C++ (e.g. 'HighsSparseMatrix ... at/below tolerance of
    1e-09: ignored'), which broke the JSON of `plan solve --solver highs --json` (a fuzzer)."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


class _Session:
    """One Pyomo model re-solved for each tie-break goal (:mod:`formulations.ties`)."""

    def __init__(self, m, rows, opt, name: str):
        self.m, self.rows, self.opt, self.name = m, rows, opt, name
        self.solve_s = 0.0

    def goals(self) -> list[str]:
        return list(self.rows.goals)

    def cap(self, goal: str, value: float) -> None:
        if self.rows.goals[goal]:                          # a constant goal caps nothing
            self.m.caps.add(self.m.goal_exprs[goal] <= self.rows.tie_cap(goal, value))

    def minimize(self, goal: str, time_limit: float | None, hint: list | None) -> ties.Answer:
        import pyomo.environ as pyo
        from pyomo.opt import TerminationCondition as TC

        m, opt = self.m, self.opt
        for o in m.goals.values():
            o.deactivate()
        m.goals.add(m.goal_exprs[goal])
        if time_limit and self.name in TIME_OPTION:
            opt.options[TIME_OPTION[self.name]] = max(float(time_limit), 1e-3)
        t1 = time.perf_counter()
        try:
            # (no MIP start from the previous goal's solution: HiGHS then certified a lex goal
            # two units above its optimum as optimal, a different tie than the other backends';
            # benchmarks/README.md, "HiGHS tie goals from a MIP start: dropped")
            with _stdout_to_stderr():
                res = opt.solve(m, load_solutions=False)
        except Exception as exc:  # a solver crash is reported, not raised
            self.solve_s += time.perf_counter() - t1
            return ties.Answer(False, False, None, None, None, Status.ERROR,
                               f"{type(exc).__name__}: {exc}")
        self.solve_s += time.perf_counter() - t1
        tc = res.solver.termination_condition
        lower = res.problem.lower_bound
        if tc in (TC.infeasible, TC.infeasibleOrUnbounded):
            return ties.Answer(False, False, None, None, None, Status.INFEASIBLE, str(tc))
        log = logging.getLogger("pyomo")
        level = log.level
        # Pyomo warns, on standard output, when it loads the incumbent of a solve stopped by
        # the time limit; the status says so already, and `--json` output must stay JSON
        log.setLevel(logging.ERROR)
        try:
            m.solutions.load_from(res)
        except Exception:
            status = Status.NO_SOLUTION_IN_LIMIT if tc == TC.maxTimeLimit else Status.ERROR
            return ties.Answer(False, False, None, None, None, status, str(tc))
        finally:
            log.setLevel(level)
        x = [pyo.value(v, exception=False) or 0.0 for v in m.xs]
        value = float(pyo.value(m.goal_exprs[goal]))
        bound = float(lower) if lower is not None and abs(float(lower)) != float("inf") else None
        return ties.Answer(True, tc == TC.optimal, x, value, bound, tc, str(tc))

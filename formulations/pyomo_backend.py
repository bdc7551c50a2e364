"""Pyomo backend: the one-hot MILP (:mod:`formulations.milp`) as a Pyomo model, solved by HiGHS
or by any MILP solver Pyomo knows (``--solver gurobi``, ``scip``, ``cbc``) when it is installed.

The model is written once, solver-agnostically; only the option names for "prove optimality"
(a zero relative gap) and the time limit differ per solver. Variables carry domain names
(``x_T=8``, ``f_P^1*T^1=32``, ``combo=2``) so an LP file or a solver log reads like the problem.
"""

from __future__ import annotations

import logging
import time

from formulations.encoding import NO_CUTS, Cuts, Encoding
from formulations.milp import INF, build_rows, decode
from formulations.result import RawSolution, Status

#: Pyomo solver names for the names users type.
SOLVER_NAMES = {"highs": "appsi_highs", "gurobi": "gurobi", "scip": "scip", "cbc": "cbc",
                "glpk": "glpk", "cplex": "cplex"}
GAP_OPTION = {"appsi_highs": "mip_rel_gap", "gurobi": "MIPGap", "cbc": "ratioGap",
              "scip": "limits/gap", "glpk": "mipgap", "cplex": "mipgap"}
TIME_OPTION = {"appsi_highs": "time_limit", "gurobi": "TimeLimit", "cbc": "seconds",
               "scip": "limits/time", "glpk": "tmlim", "cplex": "timelimit"}


def available(name: str = "highs") -> bool:
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
    m.rows = pyo.ConstraintList()
    for coefs, lo, hi, _name in r.rows:
        body = sum(c * xs[i] for i, c in coefs.items())
        if lo == hi:
            m.rows.add(body == lo)
        else:
            m.rows.add(pyo.inequality(None if lo == -INF else lo, body, None if hi == INF else hi))
    m.obj = pyo.Objective(expr=sum(c * xs[i] for i, c in r.obj.items()) + r.obj_const,
                          sense=pyo.minimize)
    m.xs = xs
    return m, r


def solve(enc: Encoding, cuts: Cuts = NO_CUTS, time_limit: float | None = None,
          solver: str = "highs") -> RawSolution:
    import pyomo.environ as pyo
    from pyomo.opt import TerminationCondition as TC

    t0 = time.perf_counter()
    m, r = build_model(enc, cuts)
    build_s = time.perf_counter() - t0
    if r.violated:
        return RawSolution(Status.INFEASIBLE, None, None, None, None, 0.0, build_s, solver,
                           note="violated: " + ", ".join(r.violated))
    name = SOLVER_NAMES.get(solver, solver)
    opt = pyo.SolverFactory(name)
    if name in GAP_OPTION:
        opt.options[GAP_OPTION[name]] = 0.0
    if name == "appsi_highs":
        opt.options["mip_abs_gap"] = 1e-9     # rows are scaled: the objective is near 1
        # tight feasibility so a near-zero binary cannot carry a visible share of a product term
        opt.options["mip_feasibility_tolerance"] = 1e-9
        opt.options["primal_feasibility_tolerance"] = 1e-9
    if time_limit and name in TIME_OPTION:
        opt.options[TIME_OPTION[name]] = float(time_limit)
    t1 = time.perf_counter()
    try:
        res = opt.solve(m, load_solutions=False)
    except Exception as exc:  # a solver crash is reported, not raised
        return RawSolution(Status.ERROR, None, None, None, None, time.perf_counter() - t1,
                           build_s, solver, note=f"{type(exc).__name__}: {exc}")
    solve_s = time.perf_counter() - t1
    tc = res.solver.termination_condition
    lower = res.problem.lower_bound
    has_solution = len(res.solution) > 0 if hasattr(res, "solution") else False
    if tc in (TC.infeasible, TC.infeasibleOrUnbounded):
        return RawSolution(Status.INFEASIBLE, None, None, None, None, solve_s, build_s, solver,
                           note=str(tc))
    if not has_solution:
        try:
            m.solutions.load_from(res)
            has_solution = True
        except Exception:
            has_solution = False
    else:
        m.solutions.load_from(res)
    if not has_solution:
        status = Status.NO_SOLUTION_IN_LIMIT if tc == TC.maxTimeLimit else Status.ERROR
        return RawSolution(status, None, None, None, None, solve_s, build_s, solver, note=str(tc))
    x = [pyo.value(v, exception=False) or 0.0 for v in m.xs]
    choice, combo = decode(enc, r, x)
    objective = float(pyo.value(m.obj)) * r.time_unit
    bound = (float(lower) * r.time_unit
             if lower is not None and abs(float(lower)) != float("inf") else None)
    # "zero gap" up to the solver's floating-point tolerances (1e-6 relative, rows near 1)
    proven = tc == TC.optimal and bound is not None and objective - bound <= 1e-6 * abs(objective)
    status = Status.OPTIMAL if proven else Status.FEASIBLE
    return RawSolution(status, choice, enc.combos[combo], objective, bound, solve_s, build_s, solver,
                       note=str(tc))

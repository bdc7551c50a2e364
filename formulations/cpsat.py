"""OR-Tools CP-SAT backend (``--solver cpsat``, the default).

It solves the one-hot MILP of :mod:`formulations.milp` (the very rows HiGHS solves) in integer
units: table entries rounded to the objective quantum (:func:`quantum`), memory in bytes, and
each product with a class factor rounded up to one quantum, so "optimal" means optimal up to
that rounding (docs/encoding.md, "CP-SAT in integer units"). Memory entries above the limit are
capped (:func:`formulations.milp.capped_memory`: the same plans fit), a minimum-MFU cap that
cannot bind is left out, and an instance whose integers would not fit CP-SAT
(:data:`formulations.milp.SAFE_INT`) is refused with a :class:`~planner.model.errors.SolverError`
naming the problem instead of overflowing.

An earlier element formulation (one integer index per form and ``AddElement`` into its table)
proved the same optima 10-500x more slowly on the shipped instances; it was removed, and the
measurement is kept in benchmarks/README.md.
"""

from __future__ import annotations

import functools
import math
import time

import numpy as np

from formulations import ties
from formulations.encoding import NO_CUTS, Cuts, Encoding
from formulations.milp import SAFE_INT
from formulations.result import RawSolution, Status
from planner.model.errors import SolverError

#: The objective unit is 1e-7 of the objective's magnitude, rounded down to a power of ten
#: (1 microsecond for a step of about 10 s).
RELATIVE_QUANTUM = 1e-7


@functools.cache
def available() -> bool:
    try:
        import ortools.sat.python.cp_model  # noqa: F401
    except ImportError:
        return False
    return True


def quantum(enc: Encoding) -> float:
    """Seconds (or seconds per sequence) per integer unit of the CP-SAT objective."""
    return 10.0 ** np.floor(np.log10(max(enc.scale, 1e-300) * RELATIVE_QUANTUM))


def _run(model, time_limit: float | None, workers: int):
    """Solve a CP-SAT model: the solver, its status in our terms, the seconds it took and
    CP-SAT's own status name."""
    from ortools.sat.python import cp_model

    solver = cp_model.CpSolver()
    solver.parameters.num_workers = workers
    # OR-Tools 9.15: the inclusion-detection presolve can certify a wrong optimum on linear
    # models (google/or-tools issue #5293; the parameter below is the workaround found there).
    # Seen here on a one-hot model whose optimum HiGHS, the enumerator and CP-SAT without
    # presolve agree on, while default CP-SAT proved a 3% worse plan "optimal".
    solver.parameters.presolve_inclusion_work_limit = 0
    if time_limit:
        solver.parameters.max_time_in_seconds = float(time_limit)
    t1 = time.perf_counter()
    st = solver.solve(model)
    status = {cp_model.OPTIMAL: Status.OPTIMAL, cp_model.FEASIBLE: Status.FEASIBLE,
              cp_model.INFEASIBLE: Status.INFEASIBLE,
              cp_model.UNKNOWN: Status.NO_SOLUTION_IN_LIMIT,
              cp_model.MODEL_INVALID: Status.ERROR}[st]
    return solver, status, time.perf_counter() - t1, solver.status_name(st)


def _infeasible(t0: float, why: str) -> RawSolution:
    return RawSolution(Status.INFEASIBLE, None, None, None, None, 0.0, time.perf_counter() - t0,
                       "cpsat", note=why)


#: CP-SAT rejects a model (MODEL_INVALID) when a linear expression's range over the variable
#: domains could overflow int64; ``sum |c| (|lo| + |hi|)`` bounds that range, and 2^62 keeps it a
#: factor 2 below 2^63.
RANGE = 2**62


def _fits(value, what: str, q_t: float, limit: int = SAFE_INT, rounding=round) -> int:
    """``rounding(value)`` as an int (exact for Python ints beyond 2^53), or a SolverError
    naming ``what`` when it is not finite or beyond ``limit``: a clean message instead of an
    OverflowError / TypeError inside OR-Tools or a MODEL_INVALID status."""
    if not abs(value) <= limit:                    # NaN fails too
        raise SolverError(f"CP-SAT needs integer units: {what} reaches {float(value):g} units "
                          f"(quanta of {q_t:g} s, or bytes), more than 2^{limit.bit_length() - 1}"
                          f"; use --solver highs or --solver enumerate")
    return int(rounding(value))


def solve(enc: Encoding, cuts: Cuts = NO_CUTS, time_limit: float | None = None,
          workers: int = 4) -> RawSolution:
    """CP-SAT on the one-hot MILP of :mod:`formulations.milp` in integer units (the same model
    HiGHS solves, each product rounded up to one quantum), with the query's ``cuts``. Four
    portfolio workers even on two cores: measured about 3x faster than two on the shipped
    instances."""
    from ortools.sat.python import cp_model

    from formulations.milp import INF, build_rows, decode

    t0 = time.perf_counter()
    q_t = quantum(enc)
    r = build_rows(enc, cuts, memory_unit=1.0, time_unit=q_t, integral=True)
    if r.violated:
        return _infeasible(t0, "violated: " + ", ".join(r.violated))
    model = cp_model.CpModel()
    big = 2**50
    xs = []
    span = []                                   # |lo| + |hi| of each variable
    # bounds derived in build_rows are exact Python ints (table entries are <= SAFE_INT there),
    # so only int64 safety is checked for them; right-hand sides come from floats: <= SAFE_INT
    for name, lb, ub in zip(r.names, r.lb, r.ub):
        lo = -big if lb == -INF else _fits(lb, f"the bound of {name}", q_t, RANGE, math.floor)
        hi = big if ub == INF else _fits(ub, f"the bound of {name}", q_t, RANGE, math.ceil)
        span.append(abs(lo) + abs(hi))
        if lo == 0 and hi == 0:
            xs.append(0)                        # a value the encoding rules out
        elif lo == 0 and hi == 1:
            xs.append(model.new_bool_var(name))
        else:
            xs.append(model.new_int_var(lo, hi, name))

    def int_expr(coefs: dict[int, float], name: str):
        if all(abs(c) <= RANGE for c in coefs.values()):     # (False for NaN) the common case
            ints = {i: int(round(c)) for i, c in coefs.items()}
        else:                                                 # names the coefficient
            ints = {i: _fits(c, f"a coefficient of row {name}", q_t, RANGE)
                    for i, c in coefs.items()}
        _fits(sum(abs(c) * span[i] for i, c in ints.items()), f"the range of row {name}", q_t,
              RANGE)
        live = [(xs[i], c) for i, c in ints.items() if not isinstance(xs[i], int) and c]
        if not live:
            return 0
        # one weighted sum: building it term by term with + costs more than solving small models
        return cp_model.LinearExpr.weighted_sum([v for v, _ in live], [c for _, c in live])

    for coefs, lo, hi, name in r.rows:
        expr = int_expr(coefs, name)
        what = f"the bound of row {name}"
        if isinstance(expr, int):               # every variable of the row is ruled out
            if not lo - 1e-9 <= expr <= hi + 1e-9:
                return _infeasible(t0, f"violated: {name}")
            continue
        if lo == hi:
            model.add(expr == _fits(lo, what, q_t))
        else:
            if lo != -INF:
                model.add(expr >= _fits(lo - 1e-9, what, q_t, rounding=math.ceil))
            if hi != INF:
                model.add(expr <= _fits(hi + 1e-9, what, q_t, rounding=math.floor))
    goals = {g: int_expr(c, f"goal {g}") for g, c in r.goals.items()}
    session = _Session(model, xs, goals, r, workers)
    build_s = time.perf_counter() - t0
    first, last, note = ties.run(session, time_limit, cuts.break_ties)
    if not first.ok:
        return RawSolution(first.status, None, None, None, None, session.solve_s, build_s,
                           "cpsat", note=first.note)
    choice, combo = decode(enc, r, last.x)
    objective = r.value("objective", last.x) * q_t
    return RawSolution(Status.OPTIMAL if first.proven else Status.FEASIBLE, choice,
                       enc.combos[combo], objective, first.bound * q_t, session.solve_s, build_s,
                       "cpsat", note=note, extra={"quantum_s": q_t})


class _Session:
    """One CP-SAT model re-solved for each tie-break goal (:mod:`formulations.ties`), the
    previous solution given as a hint."""

    def __init__(self, model, xs, goals, rows, workers: int):
        self.model, self.xs, self.exprs, self.rows, self.workers = model, xs, goals, rows, workers
        self.solve_s = 0.0

    def goals(self) -> list[str]:
        return list(self.exprs)

    def cap(self, goal: str, value: float) -> None:
        if not isinstance(self.exprs[goal], int):          # a constant goal caps nothing
            self.model.add(self.exprs[goal] <= int(self.rows.tie_cap(goal, value)))

    def minimize(self, goal: str, time_limit: float | None, hint: list | None) -> ties.Answer:
        self.model.minimize(self.exprs[goal])
        self.model.clear_hints()
        if hint is not None:
            for v, val in zip(self.xs, hint):
                if not isinstance(v, int):
                    self.model.add_hint(v, val)
        solver, status, solve_s, name = _run(self.model, time_limit, self.workers)
        self.solve_s += solve_s
        if status not in (Status.OPTIMAL, Status.FEASIBLE):
            return ties.Answer(False, False, None, None, None, status, name)
        return ties.Answer(True, status == Status.OPTIMAL,
                           [v if isinstance(v, int) else solver.value(v) for v in self.xs],
                           solver.objective_value, solver.best_objective_bound, status, name)

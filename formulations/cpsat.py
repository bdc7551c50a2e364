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
from formulations.milp import INF, SAFE_INT
from formulations.result import RawSolution, Status
from planner.model.errors import SolverError

#: The objective unit is 1e-7 of the objective's magnitude, rounded down to a power of ten
#: (1 microsecond for a step of about 10 s).
RELATIVE_QUANTUM = 1e-7


@functools.cache
def available() -> bool:
    try:
        import ortools.sat.python.cp_model_helper  # noqa: F401
    except ImportError:
        return False
    return True


#: The largest objective entry, in units, a quantum allows: :data:`SAFE_INT` over 2^3, room for
#: the sums the rows form of such entries.
TOP_UNITS = SAFE_INT / 2**3


def quantum(enc: Encoding) -> float:
    """Seconds (or seconds per sequence) per integer unit of the CP-SAT objective:
    :data:`RELATIVE_QUANTUM` of the objective's magnitude, or, where the tables span more
    than that leaves room for, the power of ten that keeps their largest entry within
    :data:`TOP_UNITS`.

    Why the second: the magnitude is a median table entry, and a step's tables hold both
    microsecond pieces and the seconds of degrees no plan would take (DeepSeek-V3 on 1,024
    GB200: a median of about 1e-3 s, entries up to 1.4e6 s), so a quantum from the median
    alone overflowed CP-SAT's integers and the default solver refused the instance. The
    coarser quantum (1e-8 s there) still resolves a step of seconds to about 1e-9 of it."""
    from formulations.milp import magnitude
    q = 10.0 ** np.floor(np.log10(max(enc.scale, 1e-300) * RELATIVE_QUANTUM))
    top = magnitude([enc.objective, *(a for args in enc.maxes for a in args)])
    if np.isfinite(top) and top / q > TOP_UNITS:
        q = 10.0 ** np.ceil(np.log10(top / TOP_UNITS))
    return float(q)


#: CP-SAT's bounds of an unbounded side (the int64 range)
_INT_MIN, _INT_MAX = -(2**63), 2**63 - 1


def _run(model, time_limit: float | None, workers: int, probing: bool = False,
         presolve: bool = True, subsolvers: tuple[str, ...] = (), full: bool = False):
    """Solve a CP-SAT model (a ``CpModelProto``): the response, its status in our terms, the
    seconds it took and CP-SAT's own status name.

    Presolve probing is off (``probing=False``, ``cp_model_probing_level = 0``) for every
    goal. Measured on every model ``plan solve`` builds for 13 instances (the shipped
    gpt3-175b-a100, llama3.1-405b-h100, mixtral-8x7b-h100, llama3-70b-h100, deepseek-v3-h800
    and the batch-range and fixed-batch GPT-3 175B / 405B-shaped instances at 512 and 131,072
    GPUs), each model re-solved as dumped, medians of 3 interleaved runs, under a load of 5-7
    on this 2-core machine: 104.3 s of CP-SAT with probing everywhere, 77.0 s as it was (on
    for the memory tie goal and for a first solve capped at an incumbent), 70.1 s on for the
    memory goal only, 68.6 s off everywhere (at commit 5c79b20, by the procedure of
    ``python benchmarks/cpsat_params.py FILE --repeat 3``). Against the mixed rule, off is slower
    on seven of the 13, by 0.6-0.8 s on four (GPT-3 175B on 512 A100 with a batch range,
    11.18 -> 11.90 s) and under 0.1 s on three, and faster on six by 0.25-4.1 s (the
    405B-shaped fixed-batch model on 131,072 H100, 9.66 -> 5.52 s; GPT-3 175B with a batch
    range on 131,072 A100, 13.68 -> 10.11 s). Runs vary a lot (four portfolio workers, as
    every goal then ran, on two shared cores): the same model solved twice can differ by 3x.

    The memory and lexicographic tie goals are solved without presolve (``presolve=False``):
    re-measured the same way on eight of those instances (af131072, bg131072, b131k, a512 and
    a131k as benchmarks/README.md names them, gpt3-175b-a100, llama3-70b-h100,
    llama3.1-405b-h100; load 1.5-3), the memory goal took 4.38 s summed with presolve, 3.94 s
    without (faster on six, slower on one), the lexicographic goal 1.54 s and 0.79 s (faster
    on seven, the same on one); the internode goal 2.71 s and 2.75 s (slower on two by 0.2-0.3
    s), and the objective solves mixed, so both keep it. Which optimal solution a goal returns
    does not change the plan: each goal caps the next at its optimal value, and the last
    (lexicographic) goal has one optimum.

    The model is built and solved through OR-Tools' C++ helper (``cp_model_helper``) rather than
    ``cp_model``: the Python layer imports pandas (measured 1.06 s against 0.08 s to import, on
    this machine) and builds each row through Python objects."""
    from ortools.sat.python import cp_model_helper as cmh

    params = cmh.SatParameters()
    params.num_workers = workers
    params.subsolvers.extend(subsolvers)
    if full:                    # every worker one of the named full-problem searches
        params.num_full_subsolvers = len(subsolvers)
    # OR-Tools 9.15: the inclusion-detection presolve can certify a wrong optimum on linear
    # models (google/or-tools issue #5293; the parameter below is the workaround found there).
    # Seen here on a one-hot model whose optimum HiGHS, the enumerator and CP-SAT without
    # presolve agree on, while default CP-SAT proved a 3% worse plan "optimal".
    params.presolve_inclusion_work_limit = 0
    if not probing:
        params.cp_model_probing_level = 0
    if not presolve:
        params.cp_model_presolve = False
    if time_limit:
        params.max_time_in_seconds = float(time_limit)
    t1 = time.perf_counter()
    wrapper = cmh.SolveWrapper()            # one per solve, as cp_model.CpSolver does
    wrapper.set_parameters(params)
    response = wrapper.solve(model)
    st = response.status
    status = {cmh.OPTIMAL: Status.OPTIMAL, cmh.FEASIBLE: Status.FEASIBLE,
              cmh.INFEASIBLE: Status.INFEASIBLE, cmh.UNKNOWN: Status.NO_SOLUTION_IN_LIMIT,
              cmh.MODEL_INVALID: Status.ERROR}[st]
    return response, status, time.perf_counter() - t1, st.name


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
          on_optimum=None) -> RawSolution:
    """CP-SAT on the one-hot MILP of :mod:`formulations.milp` in integer units (the same model
    HiGHS solves, each product rounded up to one quantum), with the query's ``cuts``; each
    goal's workers and subsolvers as :func:`search_workers` says. ``on_optimum(z)`` is called
    with the objective (seconds; the proven bound, else the incumbent) as soon as the first
    goal is solved, before the tie goals."""
    from ortools.sat.python import cp_model_helper as cmh

    from formulations.milp import build_rows, decode, plan_objective
    from formulations.space import SMALL_SPACE, joint_size

    small = joint_size(enc.space) <= SMALL_SPACE

    t0 = time.perf_counter()
    q_t = quantum(enc)
    r = build_rows(enc, cuts, memory_unit=1.0, time_unit=q_t, integral=True)
    if r.violated:
        return _infeasible(t0, "violated: " + ", ".join(r.violated))
    base = _base_model(enc, r, cuts.break_ties, q_t)
    if isinstance(base, str):                   # a row no variable is left in fails
        return _infeasible(t0, base)
    proto, xs, span, goals = base
    model = cmh.CpModelProto()
    model.copy_from(proto)                      # (the session adds its caps and goals to it)
    to_int = _IntRows(xs, span, q_t)
    for coefs, lo, hi, name in r.rows[r.cuts_from:]:    # the query's cuts
        why = to_int.add(model, coefs, lo, hi, name)
        if why:
            return _infeasible(t0, why)
    session = _Session(model, xs, goals, r, capped=cuts.max_objective is not None, small=small)
    build_s = time.perf_counter() - t0
    hook = None if on_optimum is None else (
        lambda a: on_optimum((a.bound if a.proven else a.value) * q_t))
    first, last, note = ties.run(session, time_limit, cuts.break_ties, hook, cuts.window)
    if not first.ok:
        return RawSolution(first.status, None, None, None, None, session.solve_s, build_s,
                           "cpsat", note=first.note)
    choice, combo = decode(enc, r, last.x)
    objective = plan_objective(enc, choice, combo)
    return RawSolution(Status.OPTIMAL if first.proven else Status.FEASIBLE, choice,
                       enc.combos[combo], objective,
                       # (the rounded model's bound may sit a few quanta above the exact
                       # objective of a proven plan: each product is rounded up; no bound
                       # when the caller gave the window, cuts.window)
                       None if first.bound is None else min(first.bound * q_t, objective),
                       session.solve_s, build_s,
                       "cpsat", note=note, extra={"quantum_s": q_t})


class _IntRows:
    """Rows of :func:`formulations.milp.build_rows` (integral) as CP-SAT linear constraints:
    ``xs`` maps each row variable to its CP-SAT index (-1: ruled out), ``span`` holds each
    variable's ``|lo| + |hi|`` (a row's reach, checked against :data:`RANGE`)."""

    def __init__(self, xs: list[int], span: list[int], q_t: float):
        self.xs, self.span, self.q_t = xs, span, q_t

    def expr(self, coefs: dict[int, float], name: str) -> tuple[list[int], list[int]]:
        """The row's live terms as (CP-SAT variables, integer coefficients)."""
        vs, cs, reach = [], [], 0
        xs, span = self.xs, self.span
        for i, c in coefs.items():               # one pass: the common case
            if not -RANGE <= c <= RANGE:          # (True for NaN) names the coefficient
                _fits(c, f"a coefficient of row {name}", self.q_t, RANGE)
            c = int(round(c))
            reach += abs(c) * span[i]
            x = xs[i]
            if c and x >= 0:
                vs.append(x)
                cs.append(c)
        if reach > RANGE:
            _fits(reach, f"the range of row {name}", self.q_t, RANGE)
        return vs, cs

    def side(self, x: float, rounding, name: str) -> int:
        """A row's bound as an int (:func:`_fits`, its message formatted only when needed)."""
        if -SAFE_INT <= x <= SAFE_INT:
            return int(rounding(x))
        return _fits(x, f"the bound of row {name}", self.q_t, rounding=rounding)

    def add(self, model, coefs: dict[int, float], lo: float, hi: float, name: str
            ) -> str | None:
        """Add the row to ``model``; why the model is infeasible when the row has no live
        variable left and its constant part breaks it, else None."""
        vs, cs = self.expr(coefs, name)
        if not vs:                              # every variable of the row is ruled out
            return None if lo - 1e-9 <= 0 <= hi + 1e-9 else f"violated: {name}"
        if lo == hi:
            dom = [self.side(lo, round, name)] * 2
        else:
            dom = [_INT_MIN if lo == -INF else self.side(lo - 1e-9, math.ceil, name),
                   _INT_MAX if hi == INF else self.side(hi + 1e-9, math.floor, name)]
        _add_linear(model, vs, cs, dom)
        return None


def _base_model(enc: Encoding, r, break_ties: bool, q_t: float):
    """CP-SAT's model of the encoding's rows in a query's rows ``r`` (built by
    :func:`solve` with ``break_ties`` and the quantum ``q_t``: the rows before
    ``r.cuts_from``, :func:`formulations.milp.base_rows`, are then the same for every query),
    kept in ``enc.derived`` for every query that asks the encoding again: (the model, the
    variables' CP-SAT indices and spans, the goals as integer expressions), or why no plan is
    left (a row whose variables are all ruled out fails)."""
    key = ("cpsat", break_ties, q_t)
    if key in enc.derived:
        return enc.derived[key]
    from ortools.sat.python import cp_model_helper as cmh

    model = cmh.CpModelProto()
    big = 2**50
    xs = []                                     # per row variable: its CP-SAT index, or -1
    span = []                                   # |lo| + |hi| of each variable
    # bounds derived in build_rows are exact Python ints (table entries are <= SAFE_INT there),
    # so only int64 safety is checked for them; right-hand sides come from floats: <= SAFE_INT
    variables = model.variables
    for name, lb, ub in zip(r.names, r.lb, r.ub):
        if lb == 0 and ub == 1:                 # a binary (most variables): no checks needed
            lo, hi = 0, 1
        else:
            lo = -big if lb == -INF else _fits(lb, f"the bound of {name}", q_t, RANGE, math.floor)
            hi = big if ub == INF else _fits(ub, f"the bound of {name}", q_t, RANGE, math.ceil)
        span.append(abs(lo) + abs(hi))
        if lo == 0 and hi == 0:
            xs.append(-1)                       # a value the encoding rules out
        else:
            xs.append(len(variables))
            v = variables.add()
            v.name = name
            v.domain.extend((lo, hi))
    to_int = _IntRows(xs, span, q_t)
    out = None
    for coefs, lo, hi, name in r.rows[:r.cuts_from]:
        why = to_int.add(model, coefs, lo, hi, name)
        if why:
            out = why
            break
    if out is None:
        goals = {g: to_int.expr(c, f"goal {g}") for g, c in r.goals.items()}
        out = (model, xs, span, goals)
    enc.derived[key] = out
    return out


def _add_linear(model, vs: list[int], cs: list[int], domain: list[int]) -> None:
    """``domain[0] <= sum(cs * x[vs]) <= domain[1]`` on a ``CpModelProto``."""
    lin = model.constraints.add().linear
    lin.vars.extend(vs)
    lin.coeffs.extend(cs)
    lin.domain.extend(domain)


#: A search: (workers, named subsolvers, whether every worker runs one of the named
#: full-problem searches: CP-SAT's ``num_full_subsolvers``, :func:`_run`'s ``full``).
#: The search of a goal that finds and proves an optimum: one worker, CP-SAT's ``no_lp``
#: subsolver (the default search without the linear relaxation).
SEARCH = (1, ("no_lp",), False)
#: The search of a capped objective solve on a space above SMALL_SPACE: three workers named
#: for the LP-free, core-based and LP-based searches (CP-SAT runs the first two and its
#: helpers: :func:`search_workers`).
CAPPED_SEARCH = (3, ("no_lp", "core", "default_lp"), False)
#: The search of a capped objective solve on a small space: one default worker.
SMALL_CAPPED_SEARCH = (1, (), False)
#: The search of the first objective solve (uncapped): two workers, both full-problem
#: searches, ``no_lp`` and ``max_lp`` (CP-SAT's search with its full linear relaxation),
#: racing and sharing their bounds and solutions.
FIRST_SEARCH = (2, ("no_lp", "max_lp"), True)


def search_workers(goal: str, capped: bool, small: bool) -> tuple[int, tuple[str, ...], bool]:
    """The search of one goal's solve (:data:`SEARCH`'s form: workers, subsolvers, whether all
    are full-problem searches).

    The models are small (a few thousand binaries) and a proof takes a few hundred conflicts;
    the time goes to propagation, which the linear relaxation makes several times dearer. So
    the tie goals (memory, internode, lexicographic) are searched by one worker without the LP
    (``no_lp``), which is also deterministic.

    The first objective solve (uncapped) races two full-problem workers, ``no_lp`` and
    ``max_lp`` (the search with CP-SAT's full linear relaxation), which share bounds and
    solutions; the first proof ends the solve. On most models ``no_lp`` proves first and the
    race costs its second thread; on some the relaxation's bound meets the optimum and
    ``no_lp`` alone stalls after a poor first solution (GPT 1.3B on two DGX A100 nodes: 45%
    above the optimum at 0.07 s, nothing better until 0.71 s, where ``max_lp``'s first bound
    was the optimum).
    Re-solved as recorded (``benchmarks/cpsat_params.py --goals 'objective!'``, medians of 3):
    0.71 -> 0.13 s on instances/gpt-1.3b-1node.toml, 0.77 -> 0.11 s on two nodes, 0.27 ->
    0.16 s for Llama 3 8B on one H100 node; on the shipped large instances and the issue-10
    scaling ones -0.03 to +0.14 s, at up to twice the CPU (benchmarks/README.md, "The first
    objective solve: a race"). Without ``num_full_subsolvers`` CP-SAT gives the second worker
    to its neighbourhood-search helpers, not to ``max_lp``. The race may return another
    solution of the proven optimum from run to run; the tie goals after it decide the plan
    (the last has one optimum), so the answer does not change. The test suite, whose workers
    already fill every core, runs this solve with one worker (tests/conftest.py).

    A capped objective solve (a part or a batch model asked only whether it beats the
    incumbent, nearly always proven infeasible) runs three workers named ``no_lp``, ``core``
    and ``default_lp``: CP-SAT 9.15 runs the first two as full-problem searches and gives the
    third worker to its first-solution and neighbourhood-search helpers (its log: "2 full
    problem subsolvers: [core, no_lp]"), so ``default_lp`` does not run; the figures below
    measured that search. On a small space (:data:`formulations.space.SMALL_SPACE`) one default
    worker, as before (the 40 instances tests/test_solvers.py's agreement test then drew took
    24.9 s of CPU with one worker, 31.4 s with two or four).

    Before this rule every goal ran CP-SAT's default portfolio of four workers even on two
    cores (measured about 3x faster than two), one worker on a small space.

    Measured, the models of eight instances re-solved as dumped (``benchmarks/cpsat_params.py``
    with ``num_workers`` / ``subsolvers`` variants, single runs, load below 2): summed seconds of the
    default four-worker portfolio against one ``no_lp`` worker, 16.15 against 11.54 s, faster on
    all eight (the 405B-shaped model on 131,072 H100: 4.04 -> 2.79 s); on the capped models of
    GPT-3 175B with a batch range on 131,072 A100 one ``no_lp`` worker lost (7.0 s -> 11.9 s
    over 18 models) where the three workers above took 5.2 s. End to end, ``plan solve FILE
    --json`` on the 14 instances of benchmarks/README.md's issue-10 section, two rounds: 181.7 s
    of wall time as before, 157.5 s with this rule, the same objective and plan on all 28."""
    if goal != "objective":
        return SEARCH
    if capped:
        return SMALL_CAPPED_SEARCH if small else CAPPED_SEARCH
    return FIRST_SEARCH


class _Session:
    """One CP-SAT model re-solved for each tie-break goal (:mod:`formulations.ties`), the
    previous solution given as a hint."""

    def __init__(self, model, xs, goals, rows, capped: bool, small: bool):
        # capped: the objective goal only has to beat an incumbent (or a minimum MFU)
        self.model, self.xs, self.exprs, self.rows = model, xs, goals, rows
        self.capped, self.small = capped, small
        self.solve_s = 0.0

    def goals(self) -> list[str]:
        return list(self.exprs)

    def cap(self, goal: str, value: float) -> None:
        vs, cs = self.exprs[goal]
        if vs:                                              # a constant goal caps nothing
            _add_linear(self.model, vs, cs, [_INT_MIN, int(self.rows.tie_cap(goal, value))])

    def minimize(self, goal: str, time_limit: float | None, hint: list | None) -> ties.Answer:
        vs, cs = self.exprs[goal]
        self.model.clear_objective()
        self.model.objective.vars.extend(vs)
        self.model.objective.coeffs.extend(cs)
        self.model.clear_solution_hint()
        if hint is not None:
            live = [(v, int(val)) for v, val in zip(self.xs, hint) if v >= 0]
            self.model.solution_hint.vars.extend([v for v, _ in live])
            self.model.solution_hint.values.extend([val for _, val in live])
        workers, subs, full = search_workers(goal, self.capped, self.small)
        response, status, solve_s, name = _run(
            self.model, time_limit, workers,
            presolve=not (goal == "memory" or goal.startswith("lex")), subsolvers=subs,
            full=full)
        self.solve_s += solve_s
        if status not in (Status.OPTIMAL, Status.FEASIBLE):
            return ties.Answer(False, False, None, None, None, status, name)
        sol = response.solution
        return ties.Answer(True, status == Status.OPTIMAL,
                           [0 if v < 0 else sol[v] for v in self.xs],
                           response.objective_value, response.best_objective_bound, status, name)

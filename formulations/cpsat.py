"""OR-Tools CP-SAT backends.

:func:`solve_rows` (``--solver cpsat``) solves the one-hot model of :mod:`formulations.milp`
(the model HiGHS solves) in integer units: table entries rounded to the objective quantum,
memory in bytes, and each product with a class factor rounded up to one quantum. On the shipped
instances it proves the optimum 10-500x faster than the element model below.

:func:`solve` (``--solver cpsat-element``) is the element formulation of DESIGN.md section 2,
kept for comparison: integer exponents, one index per form, ``AddElement`` into tables.

Every base variable is an index into its value list; its per-prime exponents come from
``AddElement`` over the exponent columns. A form's index is the mixed-radix number of its
per-prime exponents (a linear expression of base exponents), and every table lookup is one
``AddElement`` on ``(form index, indicator class, categorical sub-choice)``. Times are scaled to
integers with a quantum of ``QUANTUM_S`` seconds (memory: 1 byte), so "optimal" means optimal up
to the rounding of each table entry to the quantum (at most half a quantum per lookup).

Both backends cap memory entries above the limit (:func:`formulations.milp.capped_memory`:
the same plans fit), leave out a minimum-MFU cap that cannot bind, and refuse, with a
:class:`~planner.errors.SolverError` naming the problem, an instance whose integers would not
fit CP-SAT (:data:`formulations.milp.SAFE_INT`) instead of overflowing.
"""

from __future__ import annotations

import math
import time

import numpy as np

from formulations.encoding import Encoding, LinExpr
from formulations.milp import SAFE_INT, capped_memory, check_units
from formulations.result import RawSolution, Status
from planner.errors import SolverError

#: The objective unit is 1e-7 of the objective's magnitude, rounded down to a power of ten
#: (1 microsecond for a step of about 10 s).
RELATIVE_QUANTUM = 1e-7


def available() -> bool:
    try:
        import ortools.sat.python.cp_model  # noqa: F401
    except ImportError:
        return False
    return True


def quantum(enc: Encoding) -> float:
    """Seconds (or seconds per sequence) per integer unit of the CP-SAT objective."""
    return 10.0 ** np.floor(np.log10(max(enc.scale, 1e-300) * RELATIVE_QUANTUM))


def solve(enc: Encoding, time_limit: float | None = None, workers: int = 2) -> RawSolution:
    from ortools.sat.python import cp_model

    t0 = time.perf_counter()
    sp = enc.space
    q_t = quantum(enc)
    memory = capped_memory(enc)
    check_units(enc, memory, q_t, 1.0, integral=True, attr="table")   # entries <= SAFE_INT
    model = cp_model.CpModel()
    primes = sp.primes
    nq = len(primes)

    # base variables: an index into the value list, and per-prime exponent expressions
    idx: dict[str, object] = {}
    exps: dict[str, list] = {}
    for name, bv in sp.base.items():
        if name in sp.fixed:
            exps[name] = list(bv.exps[0])
            continue
        iv = model.NewIntVar(0, len(bv.values) - 1, f"x_{name}")
        idx[name] = iv
        cols = []
        for qi in range(nq):
            col = [e[qi] for e in bv.exps]
            if min(col) == max(col):
                cols.append(col[0])
            else:
                ev = model.NewIntVar(min(col), max(col), f"e_{name}_{primes[qi]}")
                model.AddElement(iv, col, ev)
                cols.append(ev)
        exps[name] = cols

    def exp_expr(mono, qi):
        return sum(e * exps[v][qi] for v, e in mono)

    def gt1(name):
        """Bool: the base variable's value is > 1 (values are sorted, 1 first if present)."""
        bv = sp.base[name]
        if name in sp.fixed:
            return bv.values[0] > 1
        b = model.NewBoolVar(f"{name}_gt1")
        if bv.values[0] == 1:
            model.Add(idx[name] >= 1).OnlyEnforceIf(b)
            model.Add(idx[name] == 0).OnlyEnforceIf(b.Not())
        else:
            model.Add(b == 1)
        return b

    v_gt1, p_gt1 = gt1("V"), gt1("P")
    if v_gt1 is True and p_gt1 is False:
        return _infeasible(t0, "vp > 1 needs pp > 1")
    if not isinstance(v_gt1, bool):
        if p_gt1 is False:
            model.Add(v_gt1 == 0)
        elif not isinstance(p_gt1, bool):
            model.AddImplication(v_gt1, p_gt1)

    for con in sp.constraints:
        if con.when_v_gt1 and v_gt1 is False:
            continue                       # no interleaving possible: the rule never applies
        for qi in range(nq):
            expr = con.const[qi] + exp_expr(con.mono, qi)
            if isinstance(expr, (int, np.integer)):
                if not (expr == 0 if con.eq else expr >= 0):
                    if con.when_v_gt1 and v_gt1 is not True:
                        model.Add(v_gt1 == 0)
                    else:
                        return _infeasible(t0, con.name)
                continue
            ct = model.Add(expr == 0) if con.eq else model.Add(expr >= 0)
            if con.when_v_gt1 and v_gt1 is not True:
                ct.OnlyEnforceIf(v_gt1)

    # forms: mixed-radix index over per-prime exponents
    form_index: dict = {}
    radix: dict = {}
    for mono, f in enc.forms.items():
        ranges = [h - lo + 1 for lo, h in zip(f.lo, f.hi)]
        strides = [int(np.prod(ranges[qi + 1:])) for qi in range(nq)]
        size = int(np.prod(ranges))
        radix[mono] = (strides, size)
        expr = sum((exp_expr(mono, qi) - f.lo[qi]) * strides[qi] for qi in range(nq))
        pos = [sum((t[qi] - f.lo[qi]) * strides[qi] for qi in range(nq)) for t in f.tuples]
        allowed = [p for p, ok in zip(pos, f.allowed) if ok]
        if not allowed:
            return _infeasible(t0, f"no allowed value of {mono}")
        if isinstance(expr, (int, np.integer)):
            if expr not in allowed:
                return _infeasible(t0, f"cap on {mono}")
            form_index[mono] = int(expr)
            continue
        iv = model.NewIntVarFromDomain(cp_model.Domain.FromValues(allowed),
                                       "f_" + "_".join(f"{v}{e}" for v, e in mono))
        model.Add(iv == expr)
        form_index[mono] = (iv, pos)

    def full_table(mono, per_tuple):
        """Values per tuple -> list over the mixed-radix index (unreachable slots: 0)."""
        strides, size = radix[mono]
        f = enc.forms[mono]
        out = np.zeros((size,) + per_tuple.shape[1:], dtype=per_tuple.dtype)
        pos = form_index[mono][1] if isinstance(form_index[mono], tuple) else None
        if pos is None:
            pos = [sum((t[qi] - f.lo[qi]) * strides[qi] for qi in range(nq)) for t in f.tuples]
        out[pos] = per_tuple
        return out

    n_combos = len(enc.combos)
    combo = model.NewIntVar(0, n_combos - 1, "combo") if n_combos > 1 else 0

    sub_vars: dict = {}
    class_vars: dict = {}
    copy_index: dict = {}

    def copy_idx(key):
        """Composite index ((j * n_1 + c_1) * n_2 + c_2 ...) * n_sub + s of a copy set."""
        if key in copy_index:
            return copy_index[key]
        cs = enc.copies[key]
        fi = form_index[key.main]
        expr = fi[0] if isinstance(fi, tuple) else fi
        for (fm, _), classes, class_of in zip(key.others, cs.classes, cs.class_of):
            n_cls = len(classes)
            okey = (fm, tuple(class_of.tolist()))
            if okey not in class_vars:
                oi = form_index[fm]
                cls_full = full_table(fm, class_of.astype(np.int64))
                if isinstance(oi, tuple):
                    cv = model.NewIntVar(0, n_cls - 1, "class")
                    model.AddElement(oi[0], cls_full.tolist(), cv)
                    class_vars[okey] = cv
                else:
                    class_vars[okey] = int(cls_full[oi])
            expr = expr * n_cls + class_vars[okey]
        n_sub = len(cs.subcombos)
        if n_sub > 1:
            skey = tuple(cs.combo_sub)
            if skey not in sub_vars:
                sv = model.NewIntVar(0, n_sub - 1, "sub")
                model.AddElement(combo, list(cs.combo_sub), sv)
                sub_vars[skey] = sv
            expr = expr * n_sub + sub_vars[skey]
        copy_index[key] = expr
        return expr

    def lookup(expr_idx, table_ints, name):
        lo, hi = int(min(table_ints)), int(max(table_ints))
        if isinstance(expr_idx, (int, np.integer)):
            return int(table_ints[int(expr_idx)])
        if lo == hi:
            return lo
        tv = model.NewIntVar(lo, hi, name)
        if not isinstance(expr_idx, cp_model.IntVar):
            iv = model.NewIntVar(0, len(table_ints) - 1, name + "_i")
            model.Add(iv == expr_idx)
            expr_idx = iv
        model.AddElement(expr_idx, table_ints, tv)
        return tv

    def linear(expr: LinExpr, unit: float, name: str):
        """The expression in integer units, a lower and an upper bound of it (each term's
        least / largest entry; a few dozen terms of at most SAFE_INT each: no int64 overflow)."""
        terms = []
        const = np.rint(expr.constant_by_combo / unit).astype(np.int64)
        lower, upper = int(const.min()), int(const.max())
        if np.any(const != const[0]):
            terms.append(lookup(combo, const.tolist(), f"{name}_const"))
        else:
            terms.append(int(const[0]))
        for ui, u in enumerate(expr.usages):
            full = full_table(u.copy.main, u.table)
            ints = np.rint(full.reshape(-1) / unit).astype(np.int64)
            lower, upper = lower + int(ints.min()), upper + int(ints.max())
            terms.append(lookup(copy_idx(u.copy), ints.tolist(), f"{name}_{ui}"))
        return sum(terms), lower, upper

    objective, _, obj_upper = linear(enc.objective, q_t, "obj")
    for i, args in enumerate(enc.maxes):
        exprs = [linear(a, q_t, f"max{i}_{k}") for k, a in enumerate(args)]
        low, up = max(e[1] for e in exprs), max(e[2] for e in exprs)
        y = model.NewIntVar(min(-(2**50), low), max(2**50, up), f"max{i}")  # reaches every max
        for e in exprs:
            model.Add(y >= e[0])
        objective = objective + y
        obj_upper += up
    for stage, expr in memory.items():
        model.Add(linear(expr, 1.0, f"mem_{stage}")[0] <= int(np.floor(enc.memory_limit)))
    # a cap above every plan's objective cannot bind (see milp.build_rows): left out
    cap = None if enc.max_objective is None else np.floor(enc.max_objective / q_t)
    if cap is not None and cap < obj_upper:
        model.Add(objective <= _fits(cap, "the minimum-MFU cap on the objective", q_t))
    for choice_x, knobs_x in enc.exclude:                      # no-good cuts (top-k)
        if knobs_x not in enc.combos:
            continue
        differs = []
        for name, iv in idx.items():
            b = model.NewBoolVar(f"ex_{name}")
            k_x = sp.base[name].values.index(choice_x[name])
            model.Add(iv != k_x).OnlyEnforceIf(b)
            differs.append(b)
        if not isinstance(combo, int):
            b = model.NewBoolVar("ex_combo")
            model.Add(combo != enc.combos.index(knobs_x)).OnlyEnforceIf(b)
            differs.append(b)
        if not differs:
            return _infeasible(t0, "the only plan is excluded")
        model.AddBoolOr(differs)
    model.Minimize(objective)
    build_s = time.perf_counter() - t0

    solver, status, solve_s, name = _run(model, time_limit, workers)
    if status not in (Status.OPTIMAL, Status.FEASIBLE):
        return RawSolution(status, None, None, None, None, solve_s, build_s, "cpsat", note=name)
    choice = {n: (sp.fixed[n] if n in sp.fixed else sp.base[n].values[solver.Value(idx[n])])
              for n in sp.base}
    k = solver.Value(combo) if not isinstance(combo, int) else 0
    return RawSolution(status, choice, enc.combos[k], solver.ObjectiveValue() * q_t,
                       solver.BestObjectiveBound() * q_t, solve_s, build_s, "cpsat",
                       extra={"quantum_s": q_t})


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
    st = solver.Solve(model)
    status = {cp_model.OPTIMAL: Status.OPTIMAL, cp_model.FEASIBLE: Status.FEASIBLE,
              cp_model.INFEASIBLE: Status.INFEASIBLE,
              cp_model.UNKNOWN: Status.NO_SOLUTION_IN_LIMIT,
              cp_model.MODEL_INVALID: Status.ERROR}[st]
    return solver, status, time.perf_counter() - t1, solver.StatusName(st)


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


def solve_rows(enc: Encoding, time_limit: float | None = None, workers: int = 4) -> RawSolution:
    """CP-SAT on the one-hot MILP of :mod:`formulations.milp` in integer units (the same model
    HiGHS solves, each product rounded up to one quantum). Four portfolio workers even on two
    cores: measured about 3x faster than two on the shipped instances."""
    from ortools.sat.python import cp_model

    from formulations.milp import INF, build_rows, decode

    t0 = time.perf_counter()
    q_t = quantum(enc)
    r = build_rows(enc, memory_unit=1.0, time_unit=q_t, integral=True)
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
        if lo == 0 and hi <= 1:
            xs.append(model.NewBoolVar(name) if hi == 1 else model.NewConstant(0))
        else:
            xs.append(model.NewIntVar(lo, hi, name))

    def int_expr(coefs: dict[int, float], name: str):
        ints = {i: _fits(c, f"a coefficient of row {name}", q_t, RANGE) for i, c in coefs.items()}
        _fits(sum(abs(c) * span[i] for i, c in ints.items()), f"the range of row {name}", q_t,
              RANGE)
        return sum(c * xs[i] for i, c in ints.items())

    for coefs, lo, hi, name in r.rows:
        expr = int_expr(coefs, name)
        what = f"the bound of row {name}"
        if lo == hi:
            model.Add(expr == _fits(lo, what, q_t))
        else:
            if lo != -INF:
                model.Add(expr >= _fits(lo - 1e-9, what, q_t, rounding=math.ceil))
            if hi != INF:
                model.Add(expr <= _fits(hi + 1e-9, what, q_t, rounding=math.floor))
    model.Minimize(int_expr(r.obj, "objective"))
    build_s = time.perf_counter() - t0
    solver, status, solve_s, name = _run(model, time_limit, workers)
    if status not in (Status.OPTIMAL, Status.FEASIBLE):
        return RawSolution(status, None, None, None, None, solve_s, build_s, "cpsat", note=name)
    x = [solver.Value(v) for v in xs]
    choice, combo = decode(enc, r, x)
    return RawSolution(status, choice, enc.combos[combo], solver.ObjectiveValue() * q_t,
                       solver.BestObjectiveBound() * q_t, solve_s, build_s, "cpsat",
                       extra={"quantum_s": q_t})

"""The one-hot MILP form of an :class:`~formulations.encoding.Encoding`, solver-neutral.

docs/encoding.md, "The one-hot MILP": one binary per value of each form (``sum_j z_j = 1`` and the form's
per-prime exponents ``= sum_j exps_j z_j``), one binary per categorical combination, and for a
table that depends on a second form's indicator class or on categorical choices, one continuous
cell per (value, class, choice) tied to the binaries by its margins. Every objective and memory
term is then linear: ``sum(table * cells)``. Base variables are forms of one variable, so they
share the same binaries.

:func:`build_rows` produces plain rows (variables, bounds, integrality, ``lo <= a.x <= hi``, a
linear objective). The Pyomo backend and the CP-SAT backend both read these rows, so they solve
literally the same model; only the scaling to integers (CP-SAT) differs.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace
from fractions import Fraction

import numpy as np

from formulations import ties
from formulations.encoding import NO_CUTS, CopyKey, Cuts, Encoding, LinExpr, Usage
from planner.model.errors import SolverError


@dataclass
class Rows:
    names: list[str] = field(default_factory=list)
    lb: list[float] = field(default_factory=list)
    ub: list[float] = field(default_factory=list)
    integer: list[bool] = field(default_factory=list)
    obj: dict[int, float] = field(default_factory=dict)
    obj_const: float = 0.0
    rows: list[tuple[dict[int, float], float, float, str]] = field(default_factory=list)
    # bookkeeping for decoding
    form_vars: dict = field(default_factory=dict)     # mono -> [var index per tuple]
    combo_vars: list[int] = field(default_factory=list)
    violated: list[str] = field(default_factory=list)  # rows that fail on constants alone
    time_unit: float = 1.0                              # objective value = unit * obj . x
    #: the goals of :mod:`formulations.ties`, in order: name -> linear expression, and its unit
    goals: dict[str, dict[int, float]] = field(default_factory=dict)
    goal_units: dict[str, float] = field(default_factory=dict)
    #: per goal with maxima: its linear part and each maximum's argument expressions
    goal_parts: dict[str, tuple[dict[int, float], list[list[dict[int, float]]]]] = field(
        default_factory=dict)
    integral: bool = False
    #: ``rows[:cuts_from]`` are the encoding's rows (:func:`base_rows`, shared by every query
    #: of the encoding), the rest the query's cuts
    cuts_from: int = 0

    def value(self, goal: str, x: list[float]) -> float:
        """A goal's value at a solution, in its unit: each maximum at its largest argument
        (a later goal may leave an epigraph variable above it)."""
        def dot(acc):
            return sum(c * x[i] for i, c in acc.items())
        if goal not in self.goal_parts:
            return dot(self.goals[goal])
        linear, maxes = self.goal_parts[goal]
        return dot(linear) + sum(max(dot(a) for a in args) for args in maxes)

    def tie_cap(self, goal: str, value: float) -> float:
        """The largest value of ``goal`` (in its unit) a plan tied with ``value`` may have."""
        unit = self.goal_units[goal]
        if goal == "objective":
            cap = ties.objective_cap(value)
        elif goal == "memory":
            cap = value + ties.MEMORY_TOLERANCE_BYTES / unit
        elif goal == "internode":
            cap = ties.internode_cap(value * unit) / unit
        else:                              # lexicographic goals are exact integers
            cap = value + (0.0 if self.integral else 0.5)
        return float(math.floor(cap + 1e-9)) if self.integral else cap

    def var(self, name: str, lb: float = 0.0, ub: float = 1.0, integer: bool = True) -> int:
        self.names.append(name)
        self.lb.append(lb)
        self.ub.append(ub)
        self.integer.append(integer)
        return len(self.names) - 1

    def row(self, coefs: dict[int, float], lo: float, hi: float, name: str) -> None:
        coefs = {k: v for k, v in coefs.items() if v != 0.0}
        if not coefs:                      # a row on fixed quantities only: check it now
            if not lo - 1e-9 <= 0.0 <= hi + 1e-9:
                self.violated.append(name)
            return
        self.rows.append((coefs, lo, hi, name))


INF = float("inf")

#: Largest magnitude (quanta or bytes) of a value CP-SAT receives that is rounded from a float:
#: table entries, constants, right-hand sides. Every integer up to 2^53 is exact in a float64,
#: so below it the rounding is exact (beyond it the float has already lost the units digit);
#: CP-SAT computes in int64 (2^63), which leaves a factor 2^10 of headroom for sums of such
#: values (the row model also checks each row's range). Bounds that :func:`build_rows` derives
#: from these entries in integral mode are exact Python ints.
SAFE_INT = 2**53


def _add(acc: dict[int, float], var: int, coef: float) -> None:
    acc[var] = acc.get(var, 0.0) + coef


def magnitude(exprs) -> float:
    """Largest ``|constant|`` or ``|entry|`` of the expressions' main tables (the factors the
    rows read); NaN if one is NaN."""
    tops = [0.0]
    for e in exprs:
        for a in (e.constant_by_combo, *(u.main_table for u in e.usages)):
            if a.size:
                tops.append(float(np.max(np.abs(a))))
    return float(np.max(tops))


def capped_memory(enc: Encoding) -> dict[str, LinExpr]:
    """The memory rows with every entry above the limit lowered to ``cap = 2 max(limit, 0) + 1``
    bytes, above the limit.

    Why it is exact: a plan fits only if its memory total is at most the limit, and when every
    term of a stage is non-negative a single term above the limit already rules the plan out,
    so lowering that term to another value above the limit keeps exactly the same plans
    feasible. Why it is needed: a 1e20-byte entry (a huge model at a small degree) overflows
    CP-SAT's int64 and swamps a MILP solver's tolerances. Twice the limit rather than one byte
    more, so the excess survives the tolerance of a floating-point MILP solver.

    ``table`` (whole terms, read by :func:`formulations.encoding.evaluate_encoding`) is capped
    at ``cap``. ``main_table``
    (read by the row model, which multiplies it by a product ``h`` of class values) is capped
    at ``cap / h_min`` (``h_min``: the smallest positive such product), so every non-zero
    product of a capped entry is still at least ``cap``. Each is exact on its own; they are no
    longer each other's multiples. A stage with a negative (or NaN) entry is returned
    unchanged: there a term above the limit could be offset."""
    cap = 2.0 * max(enc.memory_limit, 0.0) + 1.0
    out: dict[str, LinExpr] = {}
    for stage, expr in enc.memory.items():
        classes = [cl for u in expr.usages for cl in enc.copies[u.copy].classes]
        parts = [expr.constant_by_combo, *classes,
                 *(t for u in expr.usages for t in (u.table, u.main_table))]
        if not all(np.all(p >= 0) for p in parts):           # NaN compares False too
            out[stage] = expr
            continue
        usages = []
        for u in expr.usages:
            h_min = float(np.prod([cl[cl > 0].min() if np.any(cl > 0) else 1.0
                                   for cl in enc.copies[u.copy].classes]))
            usages.append(Usage(u.copy, np.minimum(u.table, cap),
                                np.minimum(u.main_table, cap / h_min)))
        out[stage] = LinExpr(np.minimum(expr.constant_by_combo, cap), usages)
    return out


def check_units(enc: Encoding, memory: dict[str, LinExpr], time_unit: float,
                memory_unit: float, integral: bool) -> None:
    """Raise a :class:`SolverError` naming the problem when a time or memory entry (see
    :func:`magnitude`), in its unit, is not finite or (``integral``: CP-SAT) exceeds
    :data:`SAFE_INT`.

    Why here: the rows are built in floats and then rounded; an overflow there would surface as
    a NumPy warning and a TypeError deep inside OR-Tools, or as a meaningless MILP."""
    times = [enc.objective, *(a for args in enc.maxes for a in args)]
    for what, exprs, unit, name in (("the objective", times, time_unit, "s"),
                                    ("memory", memory.values(), memory_unit, "bytes")):
        top = magnitude(exprs)
        with np.errstate(all="ignore"):
            count = top / unit
        if not (np.isfinite(top) and np.isfinite(count)):
            raise SolverError(f"the MILP needs finite coefficients: {what} reaches {top:g} {name} "
                              f"(units of {unit:g} {name}); use --solver enumerate")
        if integral and count > SAFE_INT:
            raise SolverError(f"CP-SAT needs integer units: {what} spans {unit:g} {name} to "
                              f"{top:g} {name}, more than 2^53 quanta; use --solver highs or "
                              f"--solver enumerate")


class _RealUnits:
    """How the rows carry numbers for a floating-point MILP solver (HiGHS): as they are."""

    integral = False

    def entry(self, x: float) -> float:
        return x

    def bound(self, lo: float, hi: float) -> tuple[float, float]:
        return lo, hi

    def limit(self, x: float) -> float:
        return x

    def scale(self, rb: _RowBuilder, ws: list[int], classes, lo: float, hi: float, tag: int):
        """Multiply the disaggregated running value by the class factors: ``sum h_c w_c``,
        and the range of the result."""
        acc = {w: float(h) for w, h in zip(ws, classes) if h}
        hs = [float(h) for h in classes]
        lo2, hi2 = min(lo * h for h in hs + [min(hs)]), max(hi * h for h in hs)
        return acc, min(lo2, min(x * y for x in (lo2, hi2) for y in hs)), hi2

    def total(self, terms) -> float:
        return sum(c * b for c, b in terms)


@functools.lru_cache(maxsize=1 << 14)
def _ratio(h: float, reach: int = 1) -> Fraction:
    """A class factor as the fraction :class:`_IntegerUnits` multiplies by (cached: the same
    few factors recur in every table of every model), for running values up to ``reach``
    units. The denominator bound is 1e6, raised for a small factor towards ``1e6 / |h|`` as
    far as the product row ``D u - H w`` stays within 2^60 units: a fixed 1e6 turned every
    factor below 5e-7 into 0 (a gradient bucket's share of a tiny layer, 4.5e-8 .. 1.8e-7),
    so CP-SAT dropped those products and proved a bound below the optimum (a fuzzer)."""
    f = Fraction(h)
    if f == 0:
        return f
    a = abs(f)
    room = int(2**60 / (a * max(reach, 1)))
    return f.limit_denominator(max(10**6, min(math.ceil(10**6 / a), room)))


def _ceil_mul(x: int, q: Fraction) -> int:
    """``ceil(x q)`` for an integer ``x``, in integers (Fraction arithmetic is slow here)."""
    return -((-x * q.numerator) // q.denominator)


def _floor_mul(x: int, q: Fraction) -> int:
    """``floor(x q)`` for an integer ``x``."""
    return (x * q.numerator) // q.denominator


class _IntegerUnits(_RealUnits):
    """The same rows for a pure integer solver (CP-SAT): every entry rounded to its unit, every
    variable integer, and multiplying a running value ``w`` by a class factor ``h = H / D``
    an integer ``u = ceil(h w)`` (``H w <= D u <= H w + D - 1``): each product exact up to one
    unit. Bounds are exact Python ints (a float would round them beyond 2^53)."""

    integral = True

    def entry(self, x: float) -> float:
        return float(np.rint(x))

    def bound(self, lo: float, hi: float) -> tuple[int, int]:
        return math.floor(lo), math.ceil(hi)

    def limit(self, x: float) -> float:
        return float(np.floor(x))

    def scale(self, rb: _RowBuilder, ws: list[int], classes, lo, hi, tag: int):
        r = rb.r
        acc = {}
        reach = max(abs(int(lo)), abs(int(hi)), 1)
        qs = [_ratio(float(h), reach) for h in classes]
        for c, (w, q) in enumerate(zip(ws, qs)):
            if q == 0:
                continue
            if q.denominator == 1:
                acc[w] = float(q.numerator)
                continue
            big = max(0, _ceil_mul(hi, q), _ceil_mul(lo, q))
            small = min(0, _floor_mul(hi, q), _floor_mul(lo, q))
            uv = r.var(f"u{tag}[{c}]", lb=small, ub=big, integer=True)
            # D u - H w in [0, D - 1]: u = ceil(h w)
            r.row({uv: float(q.denominator), w: -float(q.numerator)}, 0.0,
                  float(q.denominator - 1), f"prod{tag}[{c}]")
            acc[uv] = 1.0
        # the next running value is some ceil(q w), w in [lo, hi] (or 0): exact range
        ends = [_ceil_mul(x, q) for q in qs for x in (lo, hi)]
        return acc, min(ends), max(ends)

    def total(self, terms) -> int:
        return sum(int(c) * int(b) for c, b in terms)


class _RowBuilder:
    """Builds :class:`Rows` from an encoding, one named step per kind of row (see
    :func:`build_rows` for the order)."""

    def __init__(self, enc: Encoding, units: _RealUnits):
        self.enc, self.sp, self.units = enc, enc.space, units
        self.nq = len(enc.space.primes)
        self.r = Rows()
        self.exps_of: dict[str, list[dict[int, float]]] = {}
        self.grids: dict = {}

    # -- helpers ---------------------------------------------------------------------------
    def exp_lin(self, mono, qi) -> tuple[dict[int, float], float]:
        """The exponent of prime ``qi`` in a form, as a linear expression of the binaries."""
        acc: dict[int, float] = {}
        const = 0.0
        for v, e in mono:
            if v in self.sp.fixed:
                const += e * self.sp.base[v].exps[0][qi]
            else:
                for z, c in self.exps_of[v][qi].items():
                    _add(acc, z, e * c)
        return acc, const

    def indicator_gt1(self, name):
        """Linear expression (dict, const) equal to 1 when the base variable exceeds 1."""
        bv = self.sp.base[name]
        if name in self.sp.fixed:
            return {}, float(bv.values[0] > 1)
        zs = self.r.form_vars[((name, 1),)]
        return {z: 1.0 for z, v in zip(zs, bv.values) if v > 1}, 0.0

    def bound(self, acc: dict[int, float], sign: int = 1):
        """An upper (``sign=-1``: lower) bound of ``acc . x`` from the variable bounds."""
        r = self.r
        return self.units.total((c, r.ub[v] if c * sign > 0 else r.lb[v])
                                for v, c in acc.items())

    # -- 1. base variables and the structural rules ------------------------------------------
    def base_variables(self) -> None:
        """One binary per value of each base variable (``x_T=8``), exactly one of them on."""
        r, sp = self.r, self.sp
        for name, bv in sp.base.items():
            if name in sp.fixed:
                self.exps_of[name] = [{} for _ in range(self.nq)]
                continue
            zs = [r.var(f"x_{name}={v}") for v in bv.values]
            r.row({z: 1.0 for z in zs}, 1, 1, f"one_{name}")
            r.form_vars[((name, 1),)] = zs
            self.exps_of[name] = [{z: float(e[qi]) for z, e in zip(zs, bv.exps) if e[qi]}
                                  for qi in range(self.nq)]

    def structural_rows(self) -> None:
        """The rule table's rows (:mod:`formulations.space`): implications between indicators,
        and per prime ``const + exponents >= 0`` (``== 0``); an interleaved-only row is relaxed
        by a big M when ``V = 1``."""
        r, sp = self.r, self.sp
        for imp in sp.implications:              # if_var > 1 implies then_var > 1
            a, a_c = self.indicator_gt1(imp.if_var)
            b, b_c = self.indicator_gt1(imp.then_var)
            acc = dict(a)
            for z, c in b.items():
                _add(acc, z, -c)
            r.row(acc, -INF, b_c - a_c, imp.name)
        v_gt1, v_c = self.indicator_gt1("V")
        for con in sp.constraints:
            for qi in range(self.nq):
                lin, const = self.exp_lin(con.mono, qi)
                total_const = con.const[qi] + const
                name = f"{con.name}[{sp.primes[qi]}]"
                if con.when_v_gt1:
                    # const + lin >= -M (1 - v_gt1)  <=>  lin - M v_gt1 >= -M - const
                    big = float(abs(total_const) + sum(abs(c) for c in lin.values()) * 64 + 64)
                    acc = dict(lin)
                    for z, c in v_gt1.items():
                        _add(acc, z, -big * c)
                    r.row(acc, -big * (1 - v_c) - total_const, INF, name)
                elif con.eq:
                    r.row(lin, -total_const, -total_const, name)
                else:
                    r.row(lin, -total_const, INF, name)

    # -- 2. forms and categorical combinations ---------------------------------------------
    def forms(self) -> None:
        """One binary per reachable value of each derived form, linked to the base binaries per
        prime; a value the encoding does not allow gets no variable (a base variable's value,
        an upper bound of 0)."""
        r = self.r
        for mono, f in self.enc.forms.items():
            if mono in r.form_vars:
                for z, ok in zip(r.form_vars[mono], f.allowed):
                    if not ok:
                        r.ub[z] = 0.0
                continue
            zs = [r.var(f"f_{'*'.join(f'{v}^{e}' for v, e in mono)}={val:g}") if ok else -1
                  for val, ok in zip(f.values, f.allowed)]
            r.form_vars[mono] = zs
            r.row({z: 1.0 for z in zs if z >= 0}, 1, 1, f"one_{mono}")
            for qi in range(self.nq):
                lin, const = self.exp_lin(mono, qi)
                acc = {z: float(t[qi]) for z, t in zip(zs, f.tuples) if t[qi] and z >= 0}
                for z, c in lin.items():
                    _add(acc, z, -c)
                r.row(acc, const, const, f"link_{mono}[{self.sp.primes[qi]}]")

    def combinations(self) -> None:
        """One binary per categorical combination, exactly one on."""
        r = self.r
        r.combo_vars = [r.var(f"combo={k}") for k in range(len(self.enc.combos))]
        r.row({u: 1.0 for u in r.combo_vars}, 1, 1, "one_combo")

    def value_indicator(self, name: str, value: int) -> tuple[dict[int, float], float]:
        """Linear expression (dict, const) equal to 1 when base variable ``name`` = ``value``."""
        bv = self.sp.base[name]
        if name in self.sp.fixed:
            return {}, float(bv.values[0] == value)
        if value not in bv.values:
            return {}, 0.0
        return {self.r.form_vars[((name, 1),)][bv.values.index(value)]: 1.0}, 0.0

    def layout_rows(self) -> None:
        """The layout rules (:attr:`SearchSpace.layout_pairs`): under the combinations of a
        layout, the chosen pipeline degree needs a virtual-stage count that layout allows,
        ``x_P=p + layout <= 1 + sum(x_V=v for the allowed v)``."""
        from formulations.space import layout_key
        r, sp, combos = self.r, self.sp, self.enc.combos
        by_layout: dict[tuple, list[int]] = {}
        for k, kn in enumerate(combos):
            by_layout.setdefault(layout_key(kn), []).append(k)
        for lay, ks in by_layout.items():
            allowed = sp.layout_pairs[lay]
            for p in sp.base["P"].values:
                acc, const = self.value_indicator("P", p)
                if len(by_layout) > 1:
                    for k in ks:
                        _add(acc, r.combo_vars[k], 1.0)
                else:
                    const += 1.0
                for v in sp.base["V"].values:
                    if (p, v) in allowed:
                        lin, c = self.value_indicator("V", v)
                        for z, w in lin.items():
                            _add(acc, z, -w)
                        const -= c
                if acc or const > 1 + 1e-9:
                    r.row(acc, -INF, 1.0 - const, f"layout_{lay}_P={p}")

    def one_shard_rows(self) -> None:
        """The plans at ``dp * cp = 1`` under the combinations their ZeRO-1 twin always
        chooses first (:attr:`Encoding.one_shard`, formulations/one_shard.py) are left out:
        ``dp * cp = N / (tp pp)`` is 1 exactly at the pairs ``tp * pp = N``, so per such pair
        ``x_T=t + x_P=N/t + sum(those combinations) <= 2``."""
        r, sp, enc = self.r, self.sp, self.enc
        if not enc.one_shard:
            return
        n = sp.inst.gpus
        for t in sp.base["T"].values:
            if n % t or n // t not in sp.base["P"].values:
                continue
            acc, const = self.value_indicator("T", t)
            lin, c = self.value_indicator("P", n // t)
            for z, w in lin.items():
                _add(acc, z, w)
            const += c
            for i in enc.one_shard:
                _add(acc, r.combo_vars[i], 1.0)
            if acc and const < 2 + 1e-9:
                r.row(acc, -INF, 2.0 - const, f"one_shard_T={t}")

    # -- 3. terms -----------------------------------------------------------------------------
    def main_cells(self, key: CopyKey, cs) -> np.ndarray:
        """Cells (main value x categorical sub-choice) tied to the binaries by their margins;
        a table with one sub-choice reads the form's binaries directly."""
        r = self.r
        gk = (key.main, key.dims)
        if gk in self.grids:
            return self.grids[gk]
        zs = r.form_vars[key.main]
        n_sub = len(cs.subcombos)
        if n_sub == 1:
            self.grids[gk] = np.array(zs, dtype=int).reshape(-1, 1)
            return self.grids[gk]
        tag = len(self.grids)
        grid = np.full((len(zs), n_sub), -1, dtype=int)
        for j, z in enumerate(zs):
            if z < 0 or r.ub[z] == 0:
                continue
            for s_ in range(n_sub):
                grid[j, s_] = r.var(f"cell{tag}[{j},{s_}]", integer=False, ub=r.ub[z])
            acc = {int(v): 1.0 for v in grid[j]}
            acc[z] = -1.0
            r.row(acc, 0, 0, f"margin{tag}_main[{j}]")
        for s_ in range(n_sub):
            acc = {int(v): 1.0 for v in grid[:, s_] if v >= 0}
            for k, sk in enumerate(cs.combo_sub):
                if sk == s_:
                    _add(acc, r.combo_vars[k], -1.0)
            r.row(acc, 0, 0, f"margin{tag}_choice[{s_}]")
        self.grids[gk] = grid
        return grid

    def usage_terms(self, u: Usage, unit: float) -> dict[int, float]:
        """Linear terms worth ``u``: the main table on its cells, then each secondary factor
        applied by disaggregating the running value over the factor's classes
        (``w_c in [lo y_c, hi y_c]``, ``sum_c w_c = value``; exact when ``y`` is integral)."""
        r, units = self.r, self.units
        cs = self.enc.copies[u.copy]
        grid = self.main_cells(u.copy, cs)
        allowed = np.array([z >= 0 and r.ub[z] > 0 for z in r.form_vars[u.copy.main]])
        vals = u.main_table / unit
        if units.integral:
            vals = np.rint(vals)
        acc: dict[int, float] = {}
        live_cells = (vals != 0) & (grid >= 0)
        for v, c in zip(grid[live_cells].tolist(), vals[live_cells].tolist()):
            _add(acc, v, c)
        if not u.copy.others:
            return acc
        live = vals[allowed] if allowed.any() else vals
        lo, hi = float(live.min()), float(live.max())
        for (fm, _), classes, class_of in zip(u.copy.others, cs.classes, cs.class_of):
            tag = len(r.names)
            lo, hi = units.bound(lo, hi)
            # floating-point rows: carry w / s, the running value in units of its own largest
            # magnitude, so a split's rows have coefficients and big-Ms near 1 whatever the
            # term's share of the objective (a term worth 1e-9 of the step left rows with
            # 1e-11 entries beside 1.0 ones, and HiGHS's presolve, at the tight feasibility
            # tolerance the products need, proved a wrong optimum on Llama-3-405B shapes)
            s = 1.0 if units.integral else max(abs(lo), abs(hi)) or 1.0
            if s != 1.0:
                acc = {v: c / s for v, c in acc.items()}
                lo, hi = lo / s, hi / s
            ws = [r.var(f"w{tag}[{c}]", lb=min(0.0, lo), ub=max(0.0, hi), integer=units.integral)
                  for c in range(len(classes))]
            row = {w: 1.0 for w in ws}
            for v, c in acc.items():
                _add(row, v, -c)
            r.row(row, 0, 0, f"split{tag}")
            of_class: dict[int, list[int]] = {}       # class -> its values' binaries
            for z, cl in zip(r.form_vars[fm], class_of.tolist()):
                if z >= 0:
                    of_class.setdefault(cl, []).append(z)
            for c, w in enumerate(ws):
                ind = dict.fromkeys(of_class.get(c, ()), 1.0)
                r.row({w: 1.0, **{z: -hi for z in ind}}, -INF, 0.0, f"split{tag}_hi[{c}]")
                r.row({w: 1.0, **{z: -lo for z in ind}}, 0.0, INF, f"split{tag}_lo[{c}]")
            acc, lo, hi = units.scale(self, ws, classes, lo, hi, tag)
            if s != 1.0:
                acc = {v: c * s for v, c in acc.items()}
                lo, hi = lo * s, hi * s
        return acc

    def linear(self, expr: LinExpr, unit: float) -> dict[int, float]:
        """An expression's linear terms: its constant per combination, then its tables."""
        acc: dict[int, float] = {}
        for k, c in enumerate(expr.constant_by_combo):
            if self.units.entry(c / unit):
                _add(acc, self.r.combo_vars[k], self.units.entry(c / unit))
        for u in expr.usages:
            for v, c in self.usage_terms(u, unit).items():
                _add(acc, v, c)
        return acc

    # -- 4. objective, memory, the tie-break goals, the query's cuts ------------------------
    def with_maxes(self, expr: LinExpr, maxes: list[list[LinExpr]], unit: float, tag: str
                   ) -> tuple[dict[int, float], float, tuple]:
        """An expression plus one epigraph variable per maximum (``y >= each argument``; the
        goal is minimised, so ``y`` is the maximum); returns it, an upper bound of it over
        every plan (each maximum at its largest argument), and its parts (the linear part and
        each maximum's arguments, for :meth:`Rows.value`)."""
        r = self.r
        acc = self.linear(expr, unit)
        upper = self.bound(acc)
        parts: tuple[dict[int, float], list] = (dict(acc), [])
        for i, args in enumerate(maxes):
            y = r.var(f"{tag}max_{i}", lb=-INF, ub=INF, integer=False)
            _add(acc, y, 1.0)
            lows, ups = [], []
            parts[1].append([])
            for a, arg in enumerate(args):
                row = self.linear(arg, unit)
                parts[1][-1].append(dict(row))
                lows.append(self.bound(row, -1))
                ups.append(self.bound(row))
                _add(row, y, -1.0)
                r.row(row, -INF, 0.0, f"{tag}max_{i}_arg{a}")
            upper += max(ups)
            if self.units.integral:    # bounds every plan's max lies within (no arbitrary 2^50)
                r.lb[y], r.ub[y] = max(lows), max(ups)
        return acc, upper, parts

    def objective(self, unit: float) -> float:
        """The objective (the first goal); returns an upper bound of it over every plan."""
        self.r.obj, upper, parts = self.with_maxes(self.enc.objective, self.enc.maxes, unit, "")
        self.r.goals["objective"], self.r.goal_units["objective"] = self.r.obj, unit
        self.r.goal_parts["objective"] = parts
        return upper

    def memory(self, memory: dict[str, LinExpr], memory_unit: float) -> None:
        """Per pipeline stage: memory per GPU within the limit; and the memory goal, a variable
        ``peak`` no smaller than any stage's memory."""
        r = self.r
        limit = self.units.limit(self.enc.memory_limit / memory_unit)
        peak = r.var("memory_peak", lb=0.0, ub=max(limit, 0.0), integer=self.units.integral)
        for stage, expr in memory.items():
            acc = self.linear(expr, memory_unit)
            r.row(acc, -INF, limit, f"mem_{stage}")
            below = {v: -c for v, c in acc.items()}
            _add(below, peak, 1.0)
            r.row(below, 0.0, INF, f"peak_{stage}")
        r.goals["memory"], r.goal_units["memory"] = {peak: 1.0}, memory_unit

    def internode(self, unit: float) -> None:
        """The goal of bytes sent across nodes per step."""
        enc = self.enc
        if enc.internode is None:
            return
        acc, _, parts = self.with_maxes(enc.internode, enc.internode_maxes, unit, "b")
        self.r.goals["internode"], self.r.goal_units["internode"] = acc, unit
        self.r.goal_parts["internode"] = parts

    def lex(self) -> None:
        """The lexicographic goals: weighted ranks of the base variables' values and of the
        combinations (:func:`formulations.ties.lex_goals`)."""
        r, sp = self.r, self.sp
        values = {n: sp.base[n].values for n in sp.base}
        for i, goal in enumerate(ties.lex_goals(ties.lex_ranks(values, len(self.enc.combos)))):
            acc: dict[int, float] = {}
            for name, weights in goal:
                zs = r.combo_vars if name == "combo" else r.form_vars[((name, 1),)]
                for z, w in zip(zs, weights):
                    if w:
                        _add(acc, z, float(w))
            r.goals[f"lex{i}"], r.goal_units[f"lex{i}"] = acc, 1.0

    def cuts(self, cuts: Cuts, unit: float, obj_upper: float) -> None:
        """The query's cap on the objective (left out when no plan's objective can reach it: a
        tiny min_mfu gives a cap far beyond any integer CP-SAT accepts) and its no-good cuts."""
        r, enc = self.r, self.enc
        cap = None if cuts.max_objective is None else cuts.max_objective / unit
        if cap is not None and cap <= obj_upper + 1e-9 * abs(obj_upper) + 1:
            r.row(dict(r.obj), -INF, self.units.limit(cap), "objective_cap")
        for n_ex, (choice, knobs) in enumerate(cuts.exclude):      # no-good cuts (top-k)
            if knobs not in enc.combos:
                continue
            acc: dict[int, float] = {}
            free = 0
            for name, bv in self.sp.base.items():
                if name in self.sp.fixed:
                    continue
                free += 1
                acc[r.form_vars[((name, 1),)][bv.values.index(choice[name])]] = 1.0
            if len(enc.combos) > 1:
                free += 1
                acc[r.combo_vars[enc.combos.index(knobs)]] = 1.0
            r.row(acc, -INF, free - 1, f"exclude_{n_ex}")


def build_rows(enc: Encoding, cuts: Cuts = NO_CUTS, memory_unit: float = 2.0**30,
               time_unit: float | None = None, integral: bool = False) -> Rows:
    """Rows of the MILP of an encoding and a query's cuts. Times are in units of ``time_unit``
    seconds (per sample for that objective; default: the encoding's magnitude, so rows are
    near 1), memory in ``memory_unit`` bytes (GiB by default).

    The steps: the base variables' binaries, the structural rows, the derived forms' binaries,
    the categorical combinations, the objective (with its maxima), the memory rows, the
    tie-break goals of :mod:`formulations.ties` (``Rows.goals``), the cuts.
    ``integral=True`` builds the same model for a pure integer solver (:class:`_IntegerUnits`).

    Memory entries above the limit are capped (:func:`capped_memory`: the same plans fit), and
    entries that are not finite (or, integral, beyond :data:`SAFE_INT` units) raise a
    :class:`SolverError` (:func:`check_units`).

    Every step but the cuts depends on the encoding and the units alone: those rows are made
    once (:func:`base_rows`) and each call adds its cuts to a copy of them, so the queries
    that ask one encoding again (the k solves of top-k, the capped re-solves) skip them."""
    unit = time_unit or enc.scale or 1.0   # default: objective rows near 1
    base, obj_upper = base_rows(enc, cuts.break_ties, memory_unit, unit, integral)
    # the cuts only add rows (and may find one violated): the rest is shared, read-only
    rb = _RowBuilder(enc, _IntegerUnits() if integral else _RealUnits())
    rb.r = replace(base, rows=list(base.rows), violated=list(base.violated),
                   cuts_from=len(base.rows))
    rb.cuts(cuts, unit, obj_upper)
    return rb.r


def base_rows(enc: Encoding, break_ties: bool, memory_unit: float, unit: float,
              integral: bool) -> tuple[Rows, float]:
    """The rows of :func:`build_rows` before any cut, and the objective's upper bound (which
    the objective cap is compared with), kept in ``enc.derived``. Read-only: a query's rows
    are a copy (:func:`build_rows`)."""
    key = ("rows", break_ties, memory_unit, unit, integral)
    if key not in enc.derived:
        memory = capped_memory(enc)
        check_units(enc, memory, unit, memory_unit, integral)
        rb = _RowBuilder(enc, _IntegerUnits() if integral else _RealUnits())
        rb.r.time_unit, rb.r.integral = unit, integral
        rb.base_variables()
        rb.structural_rows()
        rb.forms()
        rb.combinations()
        rb.layout_rows()
        rb.one_shard_rows()
        obj_upper = rb.objective(unit)
        rb.memory(memory, memory_unit)
        if break_ties:             # (a model asked only for its optimum needs no later goal)
            rb.internode(internode_unit(enc, memory_unit, integral))
            rb.lex()
        # a goal without variables cannot break a tie (a single plan, a fixed grid)
        rb.r.goals = {g: c for g, c in rb.r.goals.items() if c or g == "objective"}
        enc.derived[key] = (rb.r, obj_upper)
    return enc.derived[key]


def internode_unit(enc: Encoding, memory_unit: float, integral: bool) -> float:
    """Bytes per unit of the internode goal: the memory unit, raised for an integer solver to
    a power of ten that keeps the largest entry below 2^40 units."""
    if not integral or enc.internode is None:
        return memory_unit
    top = magnitude([enc.internode, *(a for args in enc.internode_maxes for a in args)])
    if not np.isfinite(top) or top <= 2**40 * memory_unit:
        return memory_unit
    return float(10.0 ** np.ceil(np.log10(top / 2**40)))


def decode(enc: Encoding, r: Rows, x: list[float]) -> tuple[dict[str, int], int]:
    """Base-variable values and the combination index from a solution vector."""
    sp = enc.space
    choice = {}
    for name, bv in sp.base.items():
        if name in sp.fixed:
            choice[name] = sp.fixed[name]
        else:
            zs = r.form_vars[((name, 1),)]
            choice[name] = bv.values[int(np.argmax([x[z] for z in zs]))]
    combo = int(np.argmax([x[u] for u in r.combo_vars]))
    return choice, combo


def plan_objective(enc: Encoding, choice: dict[str, int], combo: int) -> float:
    """The objective of the decoded plan, from the encoding's tables with every maximum at
    its value. Not the objective row at the solution: after the objective goal, the tie goals
    only cap it, so a variable standing for a maximum may sit anywhere above its arguments
    within the tie window (0.01%): a CP-SAT solution of a torchtitan instance read 0.28637001 s
    for a plan the evaluator costs at 0.28636505 s (found by a fuzzer)."""
    from formulations.encoding import evaluate_encoding

    return evaluate_encoding(enc, choice, combo)["objective"]

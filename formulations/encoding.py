"""Encode an instance as the log-domain model every MIP backend solves (docs/encoding.md).

The evaluator (:func:`planner.model.terms.step_terms`) is run on symbols, once per categorical
combination (recompute x sequence parallelism x sharding mode x pipeline layout x host offload x
recomputed share x overlap switches: ``SearchSpace.combos``), and returns the step time
and the memory of each pipeline stage as signomials. Each monomial is a function of one *form*
(a product of base variables such as ``B T / (N b)``); a few also carry an indicator of a second
form (``gt1(P / P_in)``: the pipeline crosses nodes). Terms are grouped by form, and each group
becomes a table over the form's few values (times the categorical choices it depends on):

one binary per form value, a continuous copy per (value, choice) cell linked by margins, and the
table as objective / constraint coefficients (:mod:`formulations.milp` writes those rows; HiGHS
and CP-SAT both solve them).

Whole terms are never tabulated jointly over several variables: that blows up
(docs/encoding.md, "Measured design findings"). This module is solver-free; :class:`Encoding`
is what the backends read, and a query's :class:`Cuts` travel beside it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property, lru_cache

import numpy as np

from formulations.space import SearchSpace
from planner.model.algebra import FUNCTIONS, Fn, Mono, Sig, Unencodable
from planner.model.plan import Degrees, Grid, Knobs
from planner.model.terms import internode_bytes, memory_limit_bytes, step_terms

OBJECTIVES = ("step_time", "time_per_sample")


# ------------------------------------------------------------------------------------------
# Forms
# ------------------------------------------------------------------------------------------


def canon(mono: Mono) -> tuple[Mono, int]:
    """A form up to inversion: ``(P/P_in)`` and ``(P_in/P)`` share one set of binaries."""
    if mono and mono[0][1] < 0:
        return tuple((v, -e) for v, e in mono), -1
    return mono, 1


@dataclass
class Form:
    """A product of base variables and the exponent vectors (over the primes) it can take."""

    mono: Mono
    tuples: list[tuple[int, ...]]          # reachable exponent vectors
    values: np.ndarray                     # the form's value for each tuple
    lo: tuple[int, ...]                    # per-prime exponent bounds (for mixed-radix indices)
    hi: tuple[int, ...]
    allowed: np.ndarray                    # False where a cap forbids the value

    @property
    def size(self) -> int:
        return len(self.tuples)

    @cached_property
    def _index(self) -> dict[tuple[int, ...], int]:
        return {t: i for i, t in enumerate(self.tuples)}

    def position(self, exps: tuple[int, ...]) -> int:
        """The index of the exponent vector ``exps`` in :attr:`tuples` (ValueError if the form
        cannot take it)."""
        try:
            return self._index[exps]
        except KeyError:
            raise ValueError(f"{exps} is not a value of the form {self.mono}") from None


def _reachable(space: SearchSpace, mono: Mono) -> set[tuple[int, ...]]:
    acc = {tuple(0 for _ in space.primes)}
    for v, e in mono:
        options = {tuple(e * x for x in ex) for ex in space.base[v].exps}
        acc = {tuple(a + o for a, o in zip(t, opt)) for t in acc for opt in options}
    return acc


def make_form(space: SearchSpace, mono: Mono) -> Form:
    """The form ``mono`` with every value allowed. Its values depend on the domains of its
    variables alone, so they are computed once for all the models of a batch range and their
    parts (:meth:`SearchSpace.shared`: the fixed global batch is in no form)."""
    def make():
        if len(mono) == 1 and mono[0][1] == 1:      # a base variable: keep its value order
            tuples = list(space.base[mono[0][0]].exps)
        else:
            tuples = sorted(_reachable(space, mono))
        primes = np.array(space.primes, dtype=float)
        arr = np.array(tuples, dtype=float)
        values = np.prod(primes ** arr, axis=1)
        lo = tuple(int(x) for x in arr.min(axis=0))
        hi = tuple(int(x) for x in arr.max(axis=0))
        return tuples, values, lo, hi
    tuples, values, lo, hi = space.shared(("form", mono), make)
    return Form(mono, tuples, values, lo, hi, np.ones(len(tuples), dtype=bool))


# ------------------------------------------------------------------------------------------
# Features: a function of one form (optionally times a function of a second form's class)
# ------------------------------------------------------------------------------------------


Axis = tuple[Mono, tuple[tuple[str, int, float], ...]]   # (form, functions on it)


@dataclass(frozen=True)
class CopyKey:
    """Identifies one set of cells: (main form value x class of each secondary axis x
    categorical sub-choice)."""

    main: Mono                   # canonical form of the main axis
    others: tuple[Axis, ...]     # secondary axes: a form and the functions applied to it
    dims: tuple[str, ...]        # categorical dimensions the tables depend on


@dataclass
class CopySet:
    key: CopyKey
    classes: list[np.ndarray]    # per secondary axis: the distinct values of its function
    class_of: list[np.ndarray]   # per secondary axis: class index of each value of its form
    subcombos: list[tuple]       # values of the dependent dims
    combo_sub: list[int]         # for each full combo: its sub-combo index



@dataclass
class Usage:
    """``sum(table[j, c, s] * cell[j, c, s])`` for one copy set; the table is in SI units."""

    copy: CopyKey
    table: np.ndarray            # [main value, class of each secondary axis..., sub-combo]
    main_table: np.ndarray       # [main value, sub-combo]; table = main_table x classes


@dataclass
class LinExpr:
    constant_by_combo: np.ndarray                # constant part, per full combo
    usages: list[Usage] = field(default_factory=list)


@dataclass
class Encoding:
    """Everything a backend needs, solver-free."""

    space: SearchSpace
    objective_kind: str                          # step_time, or time_per_sample (B varies)
    scale: float                                 # typical objective magnitude (for units)
    forms: dict[Mono, Form]
    copies: dict[CopyKey, CopySet]
    objective: LinExpr
    maxes: list[list[LinExpr]]                   # each: max over its argument expressions
    memory: dict[str, LinExpr]                   # stage -> bytes, must be <= memory_limit
    memory_limit: float
    combos: list[Knobs]
    #: bytes each GPU sends across nodes per step, and its maxima (a tie-break goal)
    internode: LinExpr | None = None
    internode_maxes: list[list[LinExpr]] = field(default_factory=list)
    #: indices into ``combos`` whose plans at dp * cp = 1 their ZeRO-1 twin always beats or
    #: matches first (formulations/one_shard.py): the MIPs leave those plans out
    one_shard: tuple[int, ...] = ()
    #: what the backends derive from the encoding alone, made once for every query that asks
    #: (the rows before a query's cuts, formulations/milp.py; CP-SAT's model of them,
    #: formulations/cpsat.py): an encoding is kept for later solves (formulations/solve.py)
    derived: dict = field(default_factory=dict, compare=False, repr=False)


@dataclass(frozen=True)
class Cuts:
    """What a query adds to an encoding when it asks a backend: a cap on the objective (a
    minimum MFU is a maximum step time) and plans to leave out (top-k no-good cuts), each a
    (base-variable values, knobs) pair. Passed to the backends beside the encoding, never
    written into it."""

    max_objective: float | None = None
    exclude: tuple[tuple[dict[str, int], Knobs], ...] = ()
    #: run the tie-break goals after the objective (formulations/ties.py); a scan that only
    #: needs the optimum (one batch model of a range) leaves them out
    break_ties: bool = True
    #: ``max_objective`` is the tie window of an optimum the caller has proven (the ties of
    #: several parts of a split space, re-solved together): the objective goal is not solved
    #: again, the tie goals start in that window (formulations/ties.py, ``run``)
    window: bool = False


NO_CUTS = Cuts()

def symbolic_degrees(space: SearchSpace) -> tuple[Degrees, dict]:
    """Degrees as symbols of the base variables (fixed ones substituted by their value): the
    one derivation (:meth:`planner.model.plan.Grid.from_base`) run on symbols."""
    inst = space.inst
    sym = {n: (space.fixed[n] if n in space.fixed else Sig.var(n)) for n in space.base}
    return Grid.from_base(sym, inst.gpus, inst.node_size).degrees(), sym


def _as_sig(x) -> Sig:
    return x if isinstance(x, Sig) else Sig.const(float(x))


class _Collector:
    """Accumulates, per expression slot, terms grouped by copy set and by combo."""

    def __init__(self, space: SearchSpace, n_combos: int):
        self.space = space
        self.n = n_combos
        self.forms: dict[Mono, Form] = {}
        # slot -> {"const": array, "groups": {(main, other, other_fns): {combo: [terms]}}}
        self.slots: dict = {}
        self.degree_args: set = set()   # (form, sign, scale) used as a function's argument
        self.seen: set = set()          # the terms added so far (their forms are registered)

    def form(self, mono: Mono) -> Form:
        if mono not in self.forms:
            self.forms[mono] = make_form(self.space, mono)
        return self.forms[mono]

    def add(self, slot, k: int, sig: Sig) -> None:
        entry = self.slots.setdefault(slot, {"const": np.zeros(self.n), "groups": {}})
        shapes = self.space.shared(("term shapes",), dict)
        for term, coef in sig.terms.items():
            shape = shapes.get(term)
            if shape is None:
                shapes[term] = shape = self._shape(*term)
            touch, group, msign, main_fns, args = shape
            if term not in self.seen:                # its forms, in the order they are read
                self.seen.add(term)
                for fm in touch:
                    self.form(fm)
                self.degree_args.update(args)
            if group is None:
                entry["const"][k] += coef
                continue
            entry["groups"].setdefault(group, {}).setdefault(k, []).append(
                (coef, msign, main_fns))

    def _shape(self, mono: Mono, fns) -> tuple:
        """Where a term ``(mono, fns)`` goes: the forms it reads (in reading order), its group
        ``(main form, secondary axes)`` (None: a constant), the main form's sign and functions,
        and the (form, sign, scale) arguments of its functions. It depends on the term alone
        (and the forms' sizes, shared by every model of a root space), so it is worked out once
        per term for all of them: the same terms recur in every combination and batch model."""
        main, msign = canon(mono)
        by_form: dict[Mono, list] = {}
        for f in fns:
            fm, fs = canon(f.form)
            by_form.setdefault(fm, []).append((f.name, fs, f.scale))
        touch = []
        if not main and by_form:                 # a pure function term: its form is the axis
            touch = list(by_form)
            main = max(by_form, key=lambda fm: self.form(fm).size)
            msign = 0
        if not main:
            return tuple(touch), None, 0, (), ()
        main_fns = tuple(sorted(by_form.pop(main, [])))
        others = tuple(sorted((fm, tuple(sorted(fl))) for fm, fl in by_form.items()))
        touch += [main] + [fm for fm, _ in others]
        args = tuple((fm, sgn, scale) for fm, fl in [(main, main_fns)] + list(others)
                     for _name, sgn, scale in fl)
        return tuple(touch), (main, others), msign, main_fns, args


def _fn_values(values: np.ndarray, fns, sign: int = 1) -> np.ndarray:
    """``value^sign * prod f(scale * value^s)`` over a form's values."""
    out = values ** sign if sign else np.ones_like(values)
    for name, s, scale in fns:
        f = np.vectorize(FUNCTIONS[name], otypes=[float])
        out = out * f(scale * values ** s)
    return out


def encode(space: SearchSpace, objective: str = "step_time", prune: bool = True,
           ties: bool = True) -> Encoding:
    """The evaluator run on symbols and tabulated by form: the model every MIP backend solves.

    ``prune`` drops dominated categorical combinations (not when listing distinct plans);
    ``ties=False`` leaves out the bytes across nodes, which only the tie-break goals read (a
    model asked for its optimum alone, as a batch range's capped models are, is then smaller
    and may prune more combinations: dominance on the objective and memory keeps the optimum).
    The steps, in order:

    1. :func:`_collect`: run :func:`~planner.model.terms.step_terms` on symbols for every
       categorical combination and group the monomials by the forms they depend on;
    2. :func:`_restrict_forms`: forbid form values no plan reaches (a fractional argument of a
       function, a value no assignment keeping the rules reaches, a cap on a derived degree);
    3. :func:`_tabulate`: one table per group over its form's values and the combinations;
    4. :func:`_undominated`: drop combinations another one beats everywhere;
    5. :func:`_expressions`: the objective, the maxima's arguments and the memory rows as
       linear expressions over the tables, each table split by the categorical choices it
       really depends on.
    """
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {OBJECTIVES}")
    col, arity = _collect(space, objective, ties)
    _restrict_forms(col, space)
    tabulated = _tabulate(col)
    n = len(space.combos)
    keep = _undominated(tabulated, n, col.forms, space.combos) if prune else list(range(n))
    exprs, copies = _expressions(space, tabulated, keep, arity)
    combos = [space.combos[k] for k in keep]
    one_shard = ()
    if prune:             # (not when listing distinct plans: a dominated one is still a plan)
        from formulations.one_shard import dominated_at_one_shard
        dominated = dominated_at_one_shard(space, objective)
        one_shard = tuple(i for i, k in enumerate(combos) if k in dominated)
    return Encoding(space=space, objective_kind=objective, scale=_magnitude(exprs["obj"]),
                    forms=col.forms, copies=copies, objective=exprs["obj"], maxes=exprs["max"],
                    memory=exprs["mem"], memory_limit=memory_limit_bytes(space.inst),
                    combos=combos, internode=exprs["bytes"], internode_maxes=exprs["bmax"],
                    one_shard=one_shard)


def _collect(space: SearchSpace, objective: str, ties: bool = True
             ) -> tuple[_Collector, dict[str, list[int]]]:
    """Step 1: the step time (or time per sequence), every stage's memory and the bytes sent
    across nodes (a tie-break goal), per categorical combination, grouped by form; a maximum's
    arguments go to slots of their own. The maxima must keep their shape across combinations,
    and a constraint (memory) may not hold a maximum: the algebra's
    :class:`~planner.model.algebra.Unencodable` is raised rather than dropping it."""
    deg, sym = symbolic_degrees(space)
    col = _Collector(space, len(space.combos))
    arity: dict[str, list[int]] = {}

    def add_with_maxes(slot: str, max_slot: str, k: int, sig: Sig) -> None:
        shape = [len(mx) for mx in sig.maxes]
        if arity.setdefault(max_slot, shape) != shape:
            raise Unencodable(f"categorical choices changed the structure of {slot}")
        col.add(slot, k, Sig(sig.terms))
        for i, mx in enumerate(sig.maxes):
            for a, arg in enumerate(mx):
                col.add((max_slot, i, a), k, arg)

    for k, knobs in enumerate(space.combos):
        obj, mems, crossing = _combo_terms(space, deg, sym, knobs, objective, ties)
        add_with_maxes("obj", "max", k, obj)
        for stage, mem in mems.items():
            col.add(("mem", stage), k, mem)
        if crossing is not None:
            add_with_maxes("bytes", "bmax", k, crossing)
    return col, arity


def _combo_terms(space: SearchSpace, deg, sym, knobs, objective: str, ties: bool):
    """One combination's symbolic objective, memory per stage and (with ``ties``) internode
    bytes. Kept in ``space.terms_cache``, which the narrowed spaces of one fixed-batch space
    share (formulations/solve.py solves its sharding modes as models of their own, then the
    tied ones again as one model): each combination is written out once. A batch model of a
    range takes the range's terms, written once per combination with the batch as a symbol,
    and substitutes its batch (:func:`_substitute`): measured on GPT-3 175B / the 405B-shaped
    model on 512 GPUs with batches [256, 16384] (models A and B of
    benchmarks/solve_scaling.py with --batch-range --batch-factor 8, 26 models each), the
    summed build 2.25 -> 1.86 s and 2.41 -> 2.11 s (medians of 3, in-process ``solve``, load
    0.2-1.8), the same answers to the last bit."""
    # (the maxima flags do not take part in comparing knobs, but they change the terms)
    key = (knobs.terms_key, objective, ties)
    if key in space.terms_cache:
        return space.terms_cache[key]
    root = space.root()
    if SHARE_BATCH_TERMS and "B" in space.fixed and "B" not in root.fixed:
        # a batch model of a range: the range's terms with the batch as a symbol, written out
        # once per combination for all the batch models, the batch substituted here
        rdeg, rsym = root.shared(("symbolic degrees",), lambda: symbolic_degrees(root))
        obj, mems, crossing = _combo_terms(root, rdeg, rsym, knobs, objective, ties)
        batch = space.fixed["B"]
        space.terms_cache[key] = (
            _substitute(obj, "B", batch),
            {stage: _substitute(mem, "B", batch) for stage, mem in mems.items()},
            None if crossing is None else _substitute(crossing, "B", batch))
        return space.terms_cache[key]
    terms = step_terms(space.inst, deg, knobs)
    obj = _as_sig(terms.step_time)
    if objective == "time_per_sample":
        obj = obj / _as_sig(sym["B"]) if isinstance(sym["B"], Sig) else obj / sym["B"]
    mems = {}
    for stage in terms.memory:
        mems[stage] = _as_sig(terms.memory_total(stage))
        mems[stage].require_linear(f"the memory of the {stage} pipeline stage (a constraint)")
    crossing = None
    if ties:                    # a model asked only for its optimum has no tie-break goal
        # on one NVLink segment nothing crosses the NIC: the goal is zero (no second evaluation)
        crossing = _as_sig(internode_bytes(space.inst, deg, knobs)
                           if space.inst.segments > 1 else 0.0)
    space.terms_cache[key] = (obj, mems, crossing)
    return space.terms_cache[key]


#: Write a range's terms once with the batch as a symbol (:func:`_combo_terms`); off, each
#: batch model runs ``step_terms`` with its batch as a number.
SHARE_BATCH_TERMS = True


def _substitute(sig: Sig, name: str, value: float) -> Sig:
    """``sig`` with the variable ``name`` set to ``value``: the signomial ``step_terms`` gives
    when that variable is the number ``value`` from the start. Each monomial loses the
    variable into its coefficient, each function factor into its scale (a factor left without
    a form is evaluated into the coefficient), and terms that meet are added. The terms are the
    same; a coefficient can differ in its last bit (the products are taken in another order),
    far below the 1e-12 the encoding compares tables at and the 1e-7 quantum of CP-SAT."""
    terms: dict = {}
    v = float(value)
    for (mono, fns), c in sig.terms.items():
        mono, e = _without(mono, name)
        if e:
            c = c * v ** e
        kept = []
        for f in fns:
            form, ef = _without(f.form, name)
            if not ef:
                kept.append(f)
                continue
            scale = f.scale * v ** ef
            if form:
                kept.append(Fn(f.name, form, scale))
            else:
                c = c * FUNCTIONS[f.name](scale)
        if c == 0.0:
            continue
        k = (mono, tuple(sorted(kept)))
        terms[k] = terms.get(k, 0.0) + c
    return Sig({k: c for k, c in terms.items() if c != 0.0},
               tuple(tuple(_substitute(a, name, value) for a in mx) for mx in sig.maxes))


@lru_cache(maxsize=2**16)
def _without(mono: Mono, name: str) -> tuple[Mono, int]:
    """``mono`` without the variable ``name``, and its exponent there (0: ``mono`` itself).
    Cached: every batch model of a range substitutes its batch into the same monomials."""
    e = dict(mono).get(name, 0)
    return (tuple((x, k) for x, k in mono if x != name), e) if e else (mono, 0)


def _restrict_forms(col: _Collector, space: SearchSpace) -> None:
    """Step 2: mark the form values no plan can take as not allowed (the model stays exact and
    gets smaller and tighter)."""
    # a function's argument is a degree (a positive integer) at every feasible point, so form
    # values that would make it fractional are unreachable: forbidding them keeps the LP from
    # mixing impossible values (e.g. a ring share 1 - 8/1 < 0)
    for fm, sgn, scale in col.degree_args:
        f = col.forms[fm]
        arg = scale * f.values ** sgn
        f.allowed &= (arg >= 1 - 1e-9) & (np.abs(arg - np.rint(arg)) <= 1e-9 * np.maximum(arg, 1))

    # presolve: keep only form values some assignment keeping the structural rules reaches,
    # counted by the rules, never listed (SearchSpace.form_reach, once per form for all the
    # batch models of a range); without it HiGHS took 15x longer on Narayanan's 530B run (89 s,
    # not 6 s)
    for mono, f in col.forms.items():
        f.allowed &= space.reach_mask(mono, f.tuples)

    # caps on derived forms (dp <= max_dp ...)
    for _name, mono, coef, lo, hi in space.form_caps:
        main, sign = canon(mono)
        f = col.form(main)
        vals = coef * f.values ** sign
        ok = np.ones(f.size, dtype=bool)
        if lo is not None:
            ok &= vals >= lo - 1e-9
        if hi is not None:
            ok &= vals <= hi + 1e-9
        f.allowed &= ok


@dataclass
class _Table:
    """One group's table over the main form's values x the classes of each secondary axis x
    every combination: ``cols[:, k]`` (the main factor of combination ``k``) times ``outer``,
    the secondary classes' outer product, which no combination changes; zero for the
    combinations without terms in the group (``has``). The whole table is formed only for the
    columns asked (:meth:`columns`): on a batch model of the 405B-shaped model at 131,072 GPUs
    the tables hold 11.7 million numbers, their main columns 0.6 million."""

    main: Mono
    others: tuple[Axis, ...]
    classes: list[np.ndarray]
    class_of: list[np.ndarray]
    outer: np.ndarray
    cols: np.ndarray
    has: np.ndarray

    def columns(self, idx) -> np.ndarray:
        """The table's columns ``idx``: ``outer(cols[:, k], outer)``, zero where ``has`` is
        false (so a non-finite class never meets an empty column)."""
        c, h = self.cols[:, idx], self.has[idx]
        out = c.reshape((c.shape[0],) + (1,) * self.outer.ndim + (c.shape[1],)) \
            * self.outer[None, ..., None]
        if not np.all(h):
            out[..., ~h] = 0.0
        return out

    @cached_property
    def scaled(self) -> bool:
        """Whether the columns decide comparisons between combinations: the outer product is
        finite and not all zero, and the columns finite. Then two combinations' tables are
        close (or ordered, entry by entry, for each sign the outer product takes) exactly
        where their columns are."""
        return bool(np.all(np.isfinite(self.cols)) and np.all(np.isfinite(self.outer))
                    and np.any(self.outer != 0))


def _tabulate(col: _Collector) -> dict:
    """Step 3: per slot, its constants and, per group, the table over the main form's values x
    the classes of each secondary form x every combination (and the main factor alone)."""
    n = col.n
    tabulated: dict = {}
    fn_vals: dict = {}                  # (form, sign, functions) -> values, within this model

    def main_values(main: Mono, msign: int, mfns) -> np.ndarray:
        key = (main, msign, mfns)
        if key not in fn_vals:
            fn_vals[key] = _fn_values(col.forms[main].values, mfns, msign)
        return fn_vals[key]

    def axis_classes(fm: Mono, fns) -> tuple[np.ndarray, np.ndarray]:
        # a secondary axis' classes depend on its form's values alone: shared by the models
        # of a root space
        def make():
            vals = _fn_values(col.forms[fm].values, fns, 0)
            return np.unique(np.round(vals, 12), return_inverse=True)
        return col.space.shared(("axis classes", fm, fns), make)

    for slot, entry in col.slots.items():
        groups = []
        for (main, others), by_combo in entry["groups"].items():
            fmain = col.forms[main]
            classes, class_of = [], []
            for fm, fns in others:
                cl, inv = axis_classes(fm, fns)
                classes.append(cl)
                class_of.append(inv)
            outer = np.ones(())                 # outer product of the secondary classes
            for cl_vals in classes:
                outer = np.multiply.outer(outer, cl_vals)
            main_cols = np.zeros((fmain.size, n))
            for k, items in by_combo.items():
                for coef, msign, mfns in items:
                    main_cols[:, k] += coef * main_values(main, msign, mfns)
            has = np.zeros(n, dtype=bool)
            has[list(by_combo)] = True
            groups.append(_Table(main, others, classes, class_of, outer, main_cols, has))
        tabulated[slot] = (entry["const"], groups)
    return tabulated


def _expressions(space: SearchSpace, tabulated: dict, keep: list[int],
                 arity: dict[str, list[int]]) -> tuple[dict, dict[CopyKey, CopySet]]:
    """Step 5: the linear expressions of the kept combinations (``obj``, ``mem`` by stage,
    ``bytes``, and the arguments of each maximum of ``obj`` and ``bytes``). A table is split only by the
    categorical dimensions it depends on (one copy of its cells per value of those), so a
    term that does not change with recompute shares its cells across the recompute modes."""
    n = len(space.combos)
    combos = [space.combos[k] for k in keep]
    every = keep == list(range(n))              # (no combination dropped: no copies to take)
    dims = list(space.dims)
    copies: dict[CopyKey, CopySet] = {}

    # per dimension with two values or more: pairs of combinations that differ in it alone
    # (the first of each group of equal other values, and each other member of the group)
    pairs: dict[str, tuple[list[int], list[int]]] = {}
    for di, dname in enumerate(dims):
        if len({getattr(kn, dname) for kn in combos}) < 2:
            continue
        by_rest: dict = {}
        for k, kn in enumerate(combos):
            rest = tuple(getattr(kn, d2) for jj, d2 in enumerate(dims) if jj != di)
            by_rest.setdefault(rest, []).append(k)
        firsts = [ks[0] for ks in by_rest.values() for _ in ks[1:]]
        others = [kk for ks in by_rest.values() for kk in ks[1:]]
        pairs[dname] = (firsts, others)

    index = {d: (np.array(f, dtype=np.intp), np.array(o, dtype=np.intp))
             for d, (f, o) in pairs.items() if o}

    groupings: dict[tuple[str, ...], tuple[np.ndarray, np.ndarray]] = {}

    def grouping(ds: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
        """Each combination and the last one with its values of ``ds`` (the column a copy keyed
        by ``ds`` takes), for the combinations that are not that last one."""
        if ds not in groupings:
            last = {tuple(getattr(kn, d) for d in ds): k for k, kn in enumerate(combos)}
            rep = [last[tuple(getattr(kn, d) for d in ds)] for kn in combos]
            ks = [k for k in range(len(combos)) if rep[k] != k]
            groupings[ds] = (np.array(ks, dtype=np.intp),
                             np.array([rep[k] for k in ks], dtype=np.intp))
        return groupings[ds]

    def depends(full: np.ndarray) -> tuple[str, ...]:
        """The dimensions the table ``full`` (combinations last) changes along.

        Found from the pairs of combinations that differ in one dimension alone, then checked on
        every combination: where dimensions move together (a pinned recompute count is a
        different share under each layout, so no two combinations differ in the share alone)
        the pairs miss one, and the dimensions that vary are added until every combination
        agrees with the column its copy takes."""
        if not pairs:
            return ()
        by_combo = np.ascontiguousarray(np.moveaxis(full, -1, 0))   # (a combination per row)
        found = tuple(d for d, (f, o) in index.items()
                      if not _all_close(by_combo[f], by_combo[o]))
        for extra in [d for d in pairs if d not in found] + [None]:
            ks, reps = grouping(found)
            if not len(ks) or _all_close(by_combo[ks], by_combo[reps]):
                return found
            if extra is not None:
                found = tuple(d for d in dims if d in found or d == extra)
        raise AssertionError("combinations with equal categorical values differ")

    def build(slot) -> LinExpr:
        const, groups = tabulated.get(slot, (np.zeros(n), []))
        expr = LinExpr(const[keep].copy())
        for tab in groups:
            main, others = tab.main, tab.others
            cols = tab.cols if every else tab.cols[:, keep]
            # where the columns decide (_Table.scaled), they are the smaller array to compare
            # (19x on the 405B-shaped model's batch models at 131,072 GPUs)
            key = CopyKey(main, others, depends(
                cols if SCALED_DEPENDS and tab.scaled else tab.columns(keep)))
            if key not in copies:
                subs = sorted({tuple(getattr(kn, d) for d in key.dims) for kn in combos}, key=str)
                combo_sub = [subs.index(tuple(getattr(kn, d) for d in key.dims)) for kn in combos]
                copies[key] = CopySet(key, tab.classes, tab.class_of, subs, combo_sub)
            cs = copies[key]
            # each sub-choice's column is that of its last combination (they are all close)
            last = {sub: k for k, sub in enumerate(cs.combo_sub)}
            pick = [last[sub] for sub in range(len(cs.subcombos))]
            expr.usages.append(Usage(key, tab.columns([keep[k] for k in pick]), cols[:, pick]))
        return expr

    exprs = {"obj": build("obj"), "bytes": build("bytes"),
             "mem": {slot[1]: build(slot) for slot in tabulated if slot[0] == "mem"}}
    for max_slot in ("max", "bmax"):
        exprs[max_slot] = [[build((max_slot, i, a)) for a in range(n_args)]
                           for i, n_args in enumerate(arity.get(max_slot, []))]
    return exprs, copies


#: Compare combinations on a table's main columns where they decide (:attr:`_Table.scaled`:
#: the categorical dependence in :func:`_expressions`, dominance in :func:`_undominated`); off,
#: on the whole table (tests/test_encoding.py compares the two).
SCALED_DEPENDS = True


def _all_close(a: np.ndarray, b: np.ndarray) -> bool:
    """``np.allclose(a, b, rtol=1e-12, atol=0)`` (equal infinities close, NaN never), without
    its overhead: it runs once per table and dimension of every model."""
    if np.array_equal(a, b):                    # (most tables, along most dimensions)
        return True
    with np.errstate(invalid="ignore"):
        d = np.abs(a - b)
        return bool(np.all((a == b) | ((d <= 1e-12 * np.abs(b)) & (d != np.inf))))


def _magnitude(objective_expr: LinExpr) -> float:
    """A typical objective value (the largest constant, else the median entry): the unit the
    backends scale the objective by."""
    consts = np.abs(objective_expr.constant_by_combo)
    entries = [np.abs(u.table[u.table != 0]) for u in objective_expr.usages]
    nonzero = np.concatenate(entries) if entries else np.zeros(0)
    return float(consts.max()) if consts.max() > 0 else (
        float(np.median(nonzero)) if nonzero.size else 1.0)


def _undominated(tabulated: dict, n: int, forms: dict, combos) -> list[int]:
    """Categorical combinations not dominated by another one.

    Combination ``a`` dominates ``b`` when every table entry of the objective, of every max
    argument and of every memory row is no larger under ``a`` than under ``b``: then any plan
    under ``b`` is matched by the same degrees under ``a``, feasible and no slower. In this model
    sequence parallelism and the distributed optimizer dominate their absence (same traffic,
    less memory) unless a constraint pins them; the check is done on the numbers, not assumed.
    Of identical combinations the first is kept.
    """
    # a layout has its own rules (which pipeline degrees it allows): only combinations of the
    # same layout can dominate each other
    from formulations.space import layout_key
    lay = [layout_key(kn) for kn in combos]
    # the pairs (a, b) where no entry under a exceeds its entry under b so far: every pair of
    # one layout at first, fewer after each table (in row chunks that keep the array small),
    # none left long before the last table on most models
    pa, pb = np.nonzero([[a != b and lay[a] == lay[b] for b in range(n)] for a in range(n)])

    def meet(x: np.ndarray) -> None:
        nonlocal pa, pb
        x = x.reshape(-1, n)
        i = 0
        while i < len(x) and len(pa):
            c = x[i:i + max(1, 4_000_000 // len(pa))]
            i += len(c)
            ca, cb = c[:, pa], c[:, pb]
            ok = ~np.any(ca > cb + 1e-12 * np.abs(cb), axis=0)
            pa, pb = pa[ok], pb[ok]

    for const, groups in tabulated.values():
        meet(const)
        for tab in groups:
            if not len(pa):
                break
            allowed = forms[tab.main].allowed        # unreachable values cannot matter
            if SCALED_DEPENDS and tab.scaled:
                # each entry is a column's value times an outer entry: ordered as the columns
                # where that entry is positive, reversed where negative, equal where zero
                if np.any(tab.outer > 0):
                    meet(tab.cols[allowed])
                if np.any(tab.outer < 0):
                    meet(-tab.cols[allowed])
            else:
                meet(tab.columns(slice(None))[allowed])
    le = np.zeros((n, n), dtype=bool)
    le[pa, pb] = True
    keep = []
    for b in range(n):
        dominated = any(lay[a] == lay[b] and le[a, b] and (not le[b, a] or a < b)
                        for a in range(n) if a != b)
        if not dominated:
            keep.append(b)
    return keep


def evaluate_encoding(enc: Encoding, choice: dict[str, int], combo: int) -> dict[str, float]:
    """Objective and memory of one point, computed from the encoding's tables (for checks)."""
    space = enc.space
    # (each variable's exponents looked up once, each form's position once: the table checks
    # of the tests read a few forms thousands of times per point)
    ex = {v: space.base[v].exps[space.base[v].values.index(val)] for v, val in choice.items()
          if v in space.base}

    @lru_cache(maxsize=None)
    def form_pos(mono: Mono) -> int:
        exps = [0] * len(space.primes)
        for v, e in mono:
            for q, x in enumerate(ex[v]):
                exps[q] += e * x
        return enc.forms[mono].position(tuple(exps))

    def value(expr: LinExpr) -> float:
        total = expr.constant_by_combo[combo]
        for u in expr.usages:
            cs = enc.copies[u.copy]
            pos = (form_pos(u.copy.main),)
            pos += tuple(int(co[form_pos(fm)]) for (fm, _), co in zip(u.copy.others, cs.class_of))
            total += u.table[pos + (cs.combo_sub[combo],)]
        return float(total)

    out = {"objective": value(enc.objective)}
    out["objective"] += sum(max(value(a) for a in mx) for mx in enc.maxes)
    for st, e in enc.memory.items():
        out[f"memory_{st}"] = value(e)
    return out


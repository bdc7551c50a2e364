"""The search space every backend walks: base variables, their allowed values, the rows that
link them, and the categorical choices.

Base variables (the free choices of a plan, :data:`planner.model.plan.BASE_NAMES`; ``N`` GPUs,
``g`` GPUs per node):

========  ===============================================  ===========================
name      meaning                                          derived from it
========  ===============================================  ===========================
``T``     tensor-parallel degree                           ``t_out = T / T_in``
``T_in``  its factor inside a node
``C``     context-parallel degree                          ``c_out = C / C_in``
``C_in``  its factor inside a node
``P``     pipeline-parallel degree                         ``p_out = P / P_in``
``P_in``  its factor inside a node
``V``     virtual stages per pipeline rank
``b``     micro-batch size
``B``     global batch (only when the instance gives a range)
``E``     expert-parallel degree (MoE models)              ``e_out = E / E_in``
``E_in``  its factor inside a node
``R``     replicas of the data-parallel shard group        ``dp_shard_size = dp / R``
          (HSDP, across nodes; 1 where the framework
          has no HSDP or nothing is sharded)
========  ===============================================  ===========================

Everything else (``dp = N / (T C P)``, ``dp_in = g / (T_in C_in P_in)``, the micro-batch count,
the expert data-parallel group) is derived by :meth:`planner.model.plan.Grid.from_base`, the one
derivation every reader shares.

Degrees are not limited to powers of two: every value is a vector of exponents over the primes
of the instance (``N``, ``g``, nodes, layers, heads, kv heads, sequence, experts, batch, and 2,
3, 5, 7), products are sums of exponent vectors and divisibility is a per-prime ``<=``
(docs/encoding.md, "Degrees as exponent vectors").

The degrees' structural rules are not restated here: the rows come from the rule table
(:mod:`planner.model.rules`), each rule's quantity run on the symbols of the base variables
(:func:`rule_rows`), and so do the domains (:func:`_domains`): a rule ``K / (x_1^a_1 ...)`` that
must be an integer bounds each ``x_i`` to the divisors of ``K``, and a rule of two variables
keeps only the values of each that the other can match. The only inputs beyond the rules are
the ranges of the batch knobs (``[training] global_batch``, the micro-batch caps) and the
``[constraints]`` pins and caps. The knob combinations are another matter: :func:`build_space`
filters them by rules it writes itself, which planner/model/frameworks.py also states as the
messages of a fixed plan: the sharding modes and HSDP the framework runs, parameter-gather
overlap only with a sharded mode, and host offload's (optimizer offload in the framework's
modes; activation offload only where the framework runs it, without recompute and on an even
layout).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from fractions import Fraction

from planner.model.algebra import Mono, Sig
from planner.model.errors import InfeasibleError
from planner.model.instance import Instance
from types import SimpleNamespace

from planner.model.frameworks import OVERLAP_KNOBS, sharding_refusal, framework_of
from planner.model.plan import (BASE_NAMES, Grid, Knobs, layout_choices, offload_choices,
                                overlap_default, recompute_share_choices, shortfall_words,
                                stage_shortfall)
from planner.model.schema import MAX_STAGE_SHORTFALL, PIN_CAPS, WHAT_IFS, lifted
from planner.model.words import pinned
from planner.model.rules import BY_NAME, EXPERT_ONLY, Rule, Sizes, rules_for
from planner.model.terms import reduce_every_microbatch

#: The user's names of the base variables, and their pin / cap keys in [constraints].
LABELS = {"T": ("tensor-parallel degree", "tp"), "T_in": ("intra-node tensor factor", None),
          "C": ("context-parallel degree", "cp"), "C_in": ("intra-node context factor", None),
          "P": ("pipeline-parallel degree", "pp"), "P_in": ("intra-node pipeline factor", None),
          "V": ("virtual-stage count", "vp"), "b": ("micro-batch size", "micro_batch"),
          "B": ("global batch", None), "E": ("expert-parallel degree", "ep"),
          "E_in": ("intra-node expert factor", None),
          "R": ("shard-group replica count (HSDP)", None)}


def factorize(n: int) -> dict[int, int]:
    out: dict[int, int] = {}
    q = 2
    while q * q <= n:
        while n % q == 0:
            out[q] = out.get(q, 0) + 1
            n //= q
        q += 1
    if n > 1:
        out[n] = out.get(n, 0) + 1
    return out


def divisors(n: int) -> list[int]:
    small = [k for k in range(1, math.isqrt(n) + 1) if n % k == 0]
    return sorted(set(small + [n // k for k in small]))


def smooth_in_range(lo: int, hi: int, primes: tuple[int, ...]) -> list[int]:
    """Integers in [lo, hi] whose prime factors all lie in ``primes``."""
    out = [1]
    for q in primes:
        grown = []
        for x in out:
            y = x
            while y <= hi:
                grown.append(y)
                y *= q
        out = grown
    return sorted(x for x in set(out) if lo <= x <= hi)


@dataclass(frozen=True)
class BaseVar:
    name: str
    values: tuple[int, ...]
    exps: tuple[tuple[int, ...], ...]   # per value, exponent of each prime


@dataclass(frozen=True)
class ExpConstraint:
    """``const + sum(coef * exponent(var))`` per prime, ``>= 0`` (or ``== 0`` with ``eq``): one
    rule quantity ``c * prod(var^coef)`` being an integer (exactly 1), ``const`` the exponents of
    ``c``."""

    name: str
    mono: Mono
    const: tuple[int, ...]
    eq: bool = False
    when_v_gt1: bool = False    # enforced only for interleaved plans (V > 1)


@dataclass(frozen=True)
class Implication:
    """``if_var > 1`` implies ``then_var > 1`` (interleaving needs a pipeline)."""

    name: str
    if_var: str
    then_var: str


@dataclass
class SearchSpace:
    inst: Instance
    primes: tuple[int, ...]
    base: dict[str, BaseVar]
    fixed: dict[str, int]                  # base variables with a single value (substituted)
    constraints: list[ExpConstraint]
    combos: list[Knobs]
    dims: dict[str, tuple]                 # categorical dimension -> its values
    form_caps: list[tuple[str, Mono, float, int | None, int | None]] = field(default_factory=list)
    #: (name, mono, coefficient, lo, hi): ``lo <= coef * value(mono) <= hi``
    implications: list[Implication] = field(default_factory=list)
    #: per pipeline layout (:func:`layout_key`), the (P, V) pairs its layout rules allow
    layout_pairs: dict[tuple, frozenset] = field(default_factory=dict)
    #: per :func:`layout_key` and "the data-parallel states are sharded" (plain data
    #: parallelism has no shard group, so its plans are those at ``R = 1``), the knob
    #: combinations the constraints allow with sequence parallelism on and off, counting those
    #: the search leaves out because others dominate or equal them (:func:`build_space`): what
    #: :func:`space_size` counts. Made for the space :func:`build_space` returns; the parts a
    #: solve narrows it to keep it unchanged
    counted_combos: dict[tuple, tuple[int, int]] = field(default_factory=dict)
    #: the space this one narrows (a fixed-batch model of a batch range): what is reachable
    #: there is a superset of what is reachable here, so presolve counts can be shared
    parent: SearchSpace | None = field(default=None, compare=False, repr=False)
    _reach: dict = field(default_factory=dict, compare=False, repr=False)
    #: symbolic terms per knob combination (formulations/encoding.py), shared by the spaces
    #: that narrow this one's combinations without changing its variables
    terms_cache: dict = field(default_factory=dict, compare=False, repr=False)

    def form_reach(self, mono: Mono) -> dict[tuple, int]:
        """The exponent vectors of ``mono`` that assignments keeping the rules reach (counted,
        :func:`count_points`), of the widest space this one narrows, computed once per form.

        A fixed-batch model of a batch range keeps only the values reached by the assignments
        whose *largest* admissible batch is its own (``dominant_batch``, one count per form
        for all the batch models): an assignment that also admits a larger batch is no faster
        per sequence here than there (docs/encoding.md, "Global-batch ranges"), and the
        enumerator leaves it out too. Every kept plan's forms keep their values (a projection
        of that set, so exact), and the capped models of smaller batches lose the near-ties
        that made them slow to prove: GPT-3 175B on 512 A100 with batches [256, 16384] (model
        A of benchmarks/solve_scaling.py with --batch-range --batch-factor 8), its 25 capped
        models 7.46 s -> 0.57 s of CP-SAT."""
        root = self.root()
        batch = self.fixed.get("B") if len(root.base["B"].values) > 1 else None
        if batch is None:
            return self.shared(mono, lambda: _form_counts(root, self.diagram(False), mono))

        def by_batch() -> dict[int, dict[tuple, int]]:
            out: dict[int, dict[tuple, int]] = {}
            values = root.base["B"].values
            for k, n in _form_counts(root, self.diagram(True), mono, batch=True).items():
                out.setdefault(values[k[0]], {})[k[1:]] = n
            return out
        return self.shared(("dominant", mono), by_batch).get(batch, {})

    def diagram(self, dominant_batch: bool) -> _Diagram:
        """The walk of the root's rules as a graph (:class:`_Diagram`), built once: what
        :meth:`form_reach` reads every form's values off."""
        return self.shared(("diagram", dominant_batch),
                           lambda: _Diagram(self.root(), dominant_batch))

    def root(self) -> SearchSpace:
        """The widest space this one narrows (itself when it narrows none)."""
        root = self
        while root.parent is not None:
            root = root.parent
        return root

    def reach_mask(self, mono: Mono, tuples: list[tuple[int, ...]]):
        """:meth:`form_reach` as a mask over the form's exponent vectors ``tuples`` (which
        depend on the form alone), kept on the root for the other parts of the same model."""
        import numpy as np

        def mask():
            reach = self.form_reach(mono)
            return np.fromiter((t in reach for t in tuples), bool, len(tuples))
        return self.shared(("mask", mono, self.fixed.get("B")), mask)

    def shared(self, key, make):
        """``make()``, computed once per root space under ``key``: what the spaces narrowing
        a root share (the forms depend on the base variables' domains alone: a narrowing's
        fixed global batch appears in no form); a key that depends on that batch names it."""
        cache = self.root()._reach
        if key not in cache:
            cache[key] = make()
        return cache[key]

    @property
    def N(self) -> int:
        return self.inst.gpus

    def exps_of(self, n: int) -> tuple[int, ...]:
        return exponent_vector(n, self.primes)


#: Grid cells (:func:`joint_size`) up to which a space is small: one joint model and one CP-SAT
#: worker serve it best (formulations/solve.py, formulations/cpsat.py).
SMALL_SPACE = 2**17


def joint_size(space: SearchSpace) -> int:
    """The knob combinations times the product of the base variables' domain sizes: the size
    of the grid one joint model's tables span (an upper bound on its plans)."""
    return len(space.combos) * math.prod(len(v.values) for v in space.base.values())


def layout_key(k: Knobs) -> tuple:
    """The pipeline layout of a categorical combination with its partial-recompute count: the
    knobs whose rules act on the pipeline degree and the virtual-stage count alone
    (:attr:`SearchSpace.layout_pairs`)."""
    return k.layout + (k.recompute_share,)


#: the layout rules a (pp, vp, layout) breaks, per (rule names, instance sizes, knobs) and then
#: per (pp, vp): the rules read nothing else (``Rule.on_knobs``), and a size's spaces are built
#: again and again (the solve, an explanation's relaxed spaces, capacity's and sweeps' revisits:
#: pareto's 512 sizes of Llama 3 70B checked 2.5 million pairs in 981 builds); bounded,
#: cleared when full
_LAYOUT_BROKEN: dict[tuple, dict[tuple[int, int], tuple[str, ...]]] = {}
_LAYOUT_BROKEN_MAX = 1 << 12


def _layout_rule_memo(names: tuple[str, ...], sizes: Sizes, kn: Knobs
                      ) -> dict[tuple[int, int], tuple[str, ...]]:
    key = (names, sizes, kn)
    memo = _LAYOUT_BROKEN.get(key)
    if memo is None:
        if len(_LAYOUT_BROKEN) >= _LAYOUT_BROKEN_MAX:
            _LAYOUT_BROKEN.clear()
        memo = _LAYOUT_BROKEN[key] = {}
    return memo


def _broken_layout_rules(rules: list[Rule], memo: dict, p: int, v: int, sizes: Sizes,
                         kn: Knobs) -> tuple[str, ...]:
    got = memo.get((p, v))
    if got is None:
        g = SimpleNamespace(pp=p, vp=v)
        got = memo[(p, v)] = tuple(r.name for r in rules if not r.holds(g, sizes, kn))
    return got


def _layout_keeps(lay: tuple, rules: list[Rule], names: tuple[str, ...], sizes: Sizes, c,
                  P: list[int], V: list[int], alone: set, any_broken: set
                  ) -> list[tuple[int, int]]:
    """The (P, V) pairs at which the layout ``lay`` (first / last shortfalls, the embedding
    and loss flags, the layout string) keeps the layout rules and the first / last stage pins;
    the rules broken on the way go to ``alone`` (broken alone) or ``any_broken``."""
    kn = Knobs(first_short=lay[0], last_short=lay[1], account_for_embedding=lay[2],
               account_for_loss=lay[3], layout_string=lay[4])
    memo = _layout_rule_memo(names, sizes, kn)
    # a middle stage holds m = n / p layers (the tests below are on n: integers, not Fractions)
    n = sizes.layers + kn.padded_layers
    ok = []
    for p in P:
        if p == 2 and lay[0] and lay[1]:
            # two stages both short of m: the same stages as a layout with one shortfall 0 (m
            # is a free reference there), which the search keeps; the model's search form
            # (planner/model/terms.py) relies on it
            continue
        if c.first_stage_layers is not None and n != (c.first_stage_layers + lay[0]) * p:
            continue
        if c.last_stage_layers is not None and n != (c.last_stage_layers + lay[1]) * p:
            continue
        for v in V:
            if lay[4] and (v == 1 or n < max(lay[0], lay[1]) * p * v):
                # a layout string at vp = 1 is the first / last counts' layout, kept there;
                # its short stage holds no fewer than zero layers
                continue
            broken = _broken_layout_rules(rules, memo, p, v, sizes, kn)
            if broken:
                # (the rules named when no layout is left: those a candidate that keeps the
                # pins breaks alone, else every one such a candidate breaks)
                (alone if len(broken) == 1 else any_broken).update(broken)
                continue
            ok.append((p, v))
    return ok


def _layout_pairs(inst: Instance, rules: list[Rule], layouts, P: list[int], V: list[int],
                  suggest: bool = True) -> tuple[dict[tuple, frozenset], list[str]]:
    """Per layout (with its partial-recompute share, :func:`layout_key`), the (P, V) pairs that
    keep the layout rules (the rules that read the knobs, checked on numbers: they involve only
    ``pp``, ``vp`` and the layout) and the ``[constraints]`` pins on the first / last stage
    counts; and, when no pair is left, why (with ``suggest``, and ``vp`` pinned, the nearest
    ``vp`` that has a layout)."""
    sizes, c = Sizes.of(inst), inst.spec.constraints
    names = tuple(r.name for r in rules)
    out, why = {}, []
    alone, any_broken = set(), set()
    # the pairs that keep a layout's rules and pins, per layout without its recompute share
    # (the share is then one more test per pair: a layout has up to a dozen shares)
    kept: dict[tuple, list[tuple[int, int]]] = {}
    for lay in layouts:
        head = lay[:5]
        if head not in kept:
            kept[head] = _layout_keeps(head, rules, names, sizes, c, P, V, alone, any_broken)
        ok = {(p, v) for p, v in kept[head]
              if not lay[5] or _recompute_fits(lay, p, v, sizes.layers, c)}
        if ok:
            out[lay] = frozenset(ok)
    # a layout string where the first / last counts allow the same shortfalls spreads them
    # less evenly and holds no less on the last stage (the same time, memory no lower:
    # planner/model/terms.py): it adds plans only at the (P, V) pairs the counts leave out
    for lay in [lay for lay in out if lay[4]]:
        spread = out.get(lay[:2] + (False, False, False) + lay[5:], frozenset())
        if out[lay] - spread:
            out[lay] = out[lay] - spread
        else:
            del out[lay]
    # the model reads only the shortfalls: of two layouts with the same shortfalls, one whose
    # pairs the other also allows adds no plan (explicit 1 / 1 is the account-for-embedding-
    # and-loss layout at vp = 1)
    for lay in list(out):
        if any(o != lay and o[:2] == lay[:2] and o[4:] == lay[4:] and out[lay] <= out[o]
               and (out[lay] != out[o] or o > lay) for o in out):
            del out[lay]
    if not out:
        pins = pinned(c, ("first_stage_layers", "last_stage_layers", "account_for_embedding",
                          "account_for_loss", "recompute_layers", "pp", "vp", "max_pp", "max_vp"))
        if c.recompute_layers:
            why.append(f"constraints.recompute_layers = {c.recompute_layers} needs more layers "
                       "in each virtual stage (layers / (pp*vp), of a short first / last stage "
                       f"too) than it recomputes: no pipeline degree in {P} with virtual stages "
                       f"in {V} has them")
        for key in ("first_stage_layers", "last_stage_layers"):
            pin = getattr(c, key)
            if pin is None:
                continue
            if max(P, default=1) < 2:
                why.append(f"constraints.{key} = {pin} needs pp > 1, and the constraints "
                           f"leave pp in {P}")
            for p in P:
                if p < 2:
                    continue
                why.append(f"constraints.{key} = {pin} leaves {sizes.layers - pin} layers for "
                           f"the other {p - 1} stages at pp={p}: no split with each stage at "
                           f"most {shortfall_words(inst)} layer(s) short of a middle one, in "
                           f"multiples of vp (vp in {V})")
        if c.account_for_embedding and c.account_for_loss and 2 in P:
            # the skipped pair above: at pp = 2 both counted is the even split relabelled
            why.append(f"at pp=2, counting both the embedding and the loss as layers gives "
                       f"each rank {Fraction(sizes.layers + 2, 2) - 1} decoder layers, the even "
                       "split, which the search holds as the even layout without the two "
                       "flags: unpin constraints.account_for_embedding / account_for_loss (the "
                       "plan is the same)" + (" or allow pp > 2" if c.pp == 2 or (
                           c.max_pp is not None and c.max_pp <= 2) else ""))
        broken = [r for r in rules if r.name in (alone or alone | any_broken)]
        why.append(f"no pipeline layout of the {sizes.layers} layers fits pipeline degrees {P} "
                   f"and virtual stages {V} ("
                   + (f"rules broken: {'; '.join(r.says for r in broken)}; " if broken else "")
                   + f"first / last stage up to {shortfall_words(inst)} layers short)"
                   + (f" under {', '.join(pins)}" if pins else ""))
        if suggest and c.vp is not None:
            near = next((v for v in sorted(range(1, 2 * sizes.layers + 3),
                                           key=lambda x: (abs(x - c.vp), x))
                         if v != c.vp and _layout_pairs(inst, rules, layouts, P, [v],
                                                        suggest=False)[0]), None)
            if near is not None:
                why.append(f"nearest change: vp = {near} (or lift constraints.vp)")
        if suggest:
            why += _nearest_stage_counts(inst, rules, P, V)
    return out, why


def _nearest_stage_counts(inst: Instance, rules: list[Rule], P: list[int], V: list[int]
                          ) -> list[str]:
    """For a pinned first / last stage count that leaves no layout: the nearest count that has
    one, and the least ``max_stage_shortfall`` that lets the pinned count stand (each checked
    as the search would, at the allowed ``pp`` and the ``vp`` the rules allow)."""
    c = inst.spec.constraints

    def has_layout(**change) -> bool:
        return _has_layout(inst, rules, P, V, **change)

    out = []
    short = stage_shortfall(inst)
    flags = [k for k in ("account_for_embedding", "account_for_loss") if getattr(c, k)]
    if flags and has_layout(**{k: None for k in flags}):
        out.append(f"nearest change: unpin {' and '.join(f'constraints.{k}' for k in flags)}")
    for key in ("first_stage_layers", "last_stage_layers"):
        pin = getattr(c, key)
        if pin is None or max(P, default=1) < 2:
            continue
        # (bounded: each trial walks (shortfall + 1)^2 layouts at every pp and vp, so an
        # unbounded walk over a 126-layer model's shortfalls ran for minutes)
        layers = inst.model.layers
        # (a first / last stage holds at most a middle stage's (layers + shortfalls) / pp)
        most = -(-(layers + 2 * short) // min(q for q in P if q >= 2))
        near = next((n for n in sorted(range(1, min(layers, most + 1)),
                                       key=lambda x: (abs(x - pin), x))
                     if n != pin and has_layout(**{key: n})), None)
        deeper = next((k for k in range(short + 1, min(layers, short + 9))
                       if has_layout(max_stage_shortfall=k)), None)
        options = ([f"{key} = {near}"] if near is not None else []) + (
            [f"raise constraints.max_stage_shortfall from {short} to {deeper}"]
            if deeper is not None else [])
        if options:
            out.append(f"nearest change: {' or '.join(options)} (or lift constraints.{key})")
    return out


def _has_layout(inst: Instance, rules: list[Rule], P: list[int], V: list[int],
                **change) -> bool:
    """Whether some pipeline layout is left with the ``[constraints]`` ``change`` made, at the
    ``pp`` values ``P`` and the ``vp`` values ``V`` or the changed layouts' own candidates."""
    c = inst.spec.constraints
    trial = inst.with_spec(constraints=c.model_copy(update=change))
    layouts, split = _layouts_of(trial)
    vs = sorted(set(V) | {v for v in split if trial.spec.constraints.vp in (None, v)
                          and (c.max_vp is None or v <= c.max_vp)})
    return bool(_layout_pairs(trial, rules, layouts, P, vs, suggest=False)[0])


def _layouts_of(inst: Instance) -> tuple[list[tuple], list[int]]:
    """The pipeline layouts the search considers (:func:`~planner.model.plan.layout_choices`),
    each with its partial-recompute shares, and the candidate ``pp`` / ``vp`` values: the
    divisors of the layouts' padded layer counts (layers + the shortfalls)."""
    layouts = layout_choices(inst)
    padded = {inst.model.layers + lay[0] + lay[1] for lay in layouts}
    split = sorted({d for n in padded for d in divisors(n)})
    # each with the partial-recompute shares: their rule, too, acts on pp and vp alone (the
    # virtual-stage sizes are the padded counts' divisors)
    shares = recompute_share_choices(inst, {n // d for n in padded for d in split if n % d == 0})
    return [lay + (f,) for lay in layouts for f in shares], split


def _recompute_fits(lay: tuple, p: int, v: int, layers: int, c) -> bool:
    """Whether the partial-recompute share ``lay[5]`` of a layout holds at ``(p, v)``: the
    share of a middle virtual stage is a whole count ``N`` (``recompute_layers``) of at least
    one layer, within ``constraints.max_recompute_layers`` (equal to the pin
    ``recompute_layers``), and the ``N v`` layers each stage recomputes are no more than a
    short first / last stage holds (so every stage recomputes ``N v``: the model's search
    form, planner/model/terms.py)."""
    m = Fraction(layers + lay[0] + lay[1], p)
    n = lay[5] * m / v
    if n.denominator != 1 or n < 1 or n * v > m - max(lay[0], lay[1]):
        return False
    if lay[4] and n > m / v - max(lay[0], lay[1]):
        return False                # (a layout string's short stage recomputes n as well)
    if c.recompute_layers is not None and n != c.recompute_layers:
        return False
    return c.max_recompute_layers is None or n <= c.max_recompute_layers


def exponent_vector(n: int, primes: tuple[int, ...]) -> tuple[int, ...]:
    """The exponents of ``n`` over ``primes``. A prime of ``n`` outside the list would be
    dropped silently (13 read as 1), so it is an error: every candidate value's primes must be
    in the instance's list (:func:`build_space`)."""
    f = factorize(n)
    if set(f) - set(primes):
        raise ValueError(f"{n} has primes outside {primes}")
    return tuple(f.get(q, 0) for q in primes)


def monomial(x) -> tuple[Fraction, Mono]:
    """A rule quantity on symbols as its exact coefficient and monomial (the quantities are
    products of the instance's integer sizes and the base variables, so the coefficient is a
    ratio of integers below 2^40: the float is recovered exactly)."""
    if isinstance(x, Sig):
        mono, c = x.single_form()
    else:
        mono, c = (), float(x)
    return Fraction(c).limit_denominator(1 << 40), mono


def _exponents(c: Fraction, primes: tuple[int, ...]) -> tuple[int, ...]:
    num, den = factorize(c.numerator), factorize(c.denominator)
    if (set(num) | set(den)) - set(primes):
        raise ValueError(f"{c} has primes outside {primes}")
    return tuple(num.get(q, 0) - den.get(q, 0) for q in primes)


def symbols(inst: Instance) -> Grid:
    """The grid of the instance on the symbols of every base variable."""
    return Grid.from_base({n: Sig.var(n) for n in BASE_NAMES}, inst.gpus, inst.node_size)


@dataclass(frozen=True)
class RuleRow:
    """One quantity of one rule, on the base variables: ``coef * prod(var^e)``."""

    rule: Rule
    index: int
    coef: Fraction
    mono: Mono


def rule_rows(inst: Instance) -> tuple[list[RuleRow], list[Implication], list[Rule]]:
    """The rule table on the symbols of the base variables: the monomial of every quantity of
    the product rules (a constant one holds by construction and gets no row), the implications,
    and the rules that need a knob."""
    grid, sizes = symbols(inst), Sizes.of(inst)
    rows, implications, knob_rules = [], [], []
    for rule in rules_for(inst):
        if rule.on_knobs:                  # per layout, on numbers (_layout_pairs)
            continue
        if rule.kind == "integer" and rule.knob and \
                getattr(inst.spec.constraints, rule.knob) is False:
            continue                       # (a rule of plans with a knob pinned off)
        quantities = rule.quantities(grid, sizes)
        if rule.kind == "implies":
            (a, _), (b, _) = (q.single_form() for q in quantities)
            implications.append(Implication(rule.name, a[0][0], b[0][0]))
            continue
        if rule.kind == "needs_knob":
            knob_rules.append(rule)
            continue
        for i, q in enumerate(quantities):
            coef, mono = monomial(q)
            if not mono:
                ok = coef == 1 if rule.kind == "one" else (coef.denominator == 1 and coef >= 1)
                if not ok:                 # a rule no assignment can keep: the model is wrong
                    raise RuntimeError(f"rule {rule.name} is the constant {coef}")
                continue
            rows.append(RuleRow(rule, i, coef, mono))
    return rows, implications, knob_rules


def _domains(rows: list[RuleRow], start: dict[str, list[int] | None], caps: dict[str, tuple]
             ) -> tuple[dict[str, list[int]], dict[str, list[str]]]:
    """The values each base variable can take under the rules (and which rules bound it).

    A product rule whose quantity ``K / (x_1^a_1 ... x_n^a_n)`` (every exponent negative) must
    be an integer bounds each ``x_i^a_i`` to the divisors of ``K`` (the other factors are
    positive integers); a rule of exactly 1 on one variable fixes it. Pins and caps cut the
    values; then every rule of two variables keeps only the values of each that some value of
    the other matches, until nothing changes. Rules of more variables are left to the rows."""
    dom = dict(start)
    why: dict[str, list[str]] = {n: [] for n in dom}
    for row in rows:
        if row.rule.interleaved:
            continue
        if row.rule.kind == "one" and len(row.mono) == 1:
            (v, e), = row.mono
            val = (1 / row.coef) ** Fraction(1, e) if e > 0 else row.coef ** Fraction(1, -e)
            keep = [int(val)] if float(val).is_integer() else []
        elif row.coef.denominator == 1 and all(e < 0 for _, e in row.mono):
            K = row.coef.numerator
            for v, e in row.mono:
                values = [x for x in divisors(K) if K % x ** -e == 0]
                dom[v] = values if dom[v] is None else [x for x in dom[v] if x in values]
                why[v].append(row.rule.says)
            continue
        else:
            continue
        dom[v] = keep if dom[v] is None else [x for x in dom[v] if x in keep]
        why[v].append(row.rule.says)
    unbounded = [n for n, d in dom.items() if d is None]
    if unbounded:                             # every variable must be bounded by some rule
        raise RuntimeError(f"no rule bounds {unbounded}")
    for v, (pin, lo, hi) in caps.items():
        dom[v] = [x for x in dom[v] if (pin is None or x == pin) and (lo is None or x >= lo)
                  and (hi is None or x <= hi)]
    pairs = [r for r in rows if len(r.mono) == 2 and not r.rule.interleaved]
    changed = True
    while changed:
        changed = False
        for r in pairs:
            (a, ea), (b, eb) = r.mono

            def ok(xa, xb, n=r.coef.numerator, d=r.coef.denominator, ea=ea, eb=eb,
                   one=r.rule.kind == "one") -> bool:
                # q = (n / d) xa^ea xb^eb as num / den in integers (d and the values are
                # positive): a Fraction per pair was most of a build of a pinned space
                num, den = n, d
                if ea > 0:
                    num *= xa ** ea
                else:
                    den *= xa ** -ea
                if eb > 0:
                    num *= xb ** eb
                else:
                    den *= xb ** -eb
                return num == den if one else (num >= den and num % den == 0)

            for x, y, swap in ((a, b, False), (b, a, True)):
                kept = [vx for vx in dom[x]
                        if any(ok(vy, vx) if swap else ok(vx, vy) for vy in dom[y])]
                if len(kept) < len(dom[x]):
                    dom[x] = kept
                    why[x].append(r.rule.says)
                    changed = True
    return dom, why


def _caps_text(var: str, caps: dict[str, tuple], inst: Instance,
               capped: dict[str, str] | None = None) -> str:
    """The pin and cap that cut ``var``'s values as the search applied them (``caps``, from
    :func:`build_space`), not as the file wrote them: a cap the search puts below the file's
    (``sequence_parallel = false`` caps an MoE model's tp at 1) is said with its reason from
    ``capped``."""
    key = LABELS[var][1]
    c = inst.spec.constraints
    pin, _, hi = caps.get(var, (None, None, None))
    parts = []
    if key and pin is not None:
        parts.append(f"constraints.{key} = {pin}")
    cap = PIN_CAPS.get(key)
    if hi is not None:
        if cap and getattr(c, cap) == hi:
            parts.append(f"constraints.{cap} = {hi}")
        else:
            why = (capped or {}).get(var)
            parts.append(f"{key or LABELS[var][0]} at most {hi}" + (f" ({why})" if why else ""))
    if var == "b":
        parts.append(f"micro-batch sizes {c.min_micro_batch} to {c.max_micro_batch}")
    return (" within " + " and ".join(parts)) if parts else ""


def _pins_that_bind(rows, start, caps, dom, bounded_by, start_pins,
                    sp_may_be_off: bool = False, admits=None) -> None:
    """A ``[constraints]`` pin of a degree that no value of the rules allows (``pp = 16`` on 8
    GPUs) empties the other degrees' domains too; say the pin alone, with the values the rules
    leave once it is lifted, and stop (raises :class:`InfeasibleError`). ``start_pins``: pins
    made by a variable's candidates (the micro-batch), with its candidates when unpinned.
    ``sp_may_be_off``: sequence parallelism may be pinned off (a dense model that leaves it
    free), which lifts the rule that splits the sequence over tp. ``admits(key, value)``:
    whether the pin changed to ``value`` (the other constraints kept) leaves a plan that
    keeps every structural rule, the layout's included (a first-stage pin can rule out the
    degree the domains alone would suggest); the nearest such value is suggested."""
    lines = []
    # per pinned variable: (pin, the starting candidates and caps with the pin lifted)
    # (a cap at the pin itself, the default cap a pin raises or one written equal to it, is
    # lifted with the pin: it would hide the allowed values just above the pin)
    lifted = {var: (pin, start, {**caps, var: (None, lo, None if hi == pin else hi)})
              for var, (pin, lo, hi) in caps.items()}
    lifted |= {var: (pin, {**start, var: cand}, caps) for var, (pin, cand) in start_pins.items()}
    for var, (pin, start_free, caps_free) in lifted.items():
        if pin is None or dom[var]:
            continue
        free, _ = _domains(rows, start_free, caps_free)
        key = LABELS[var][1]
        rules = "; ".join(dict.fromkeys(bounded_by[var]))
        if free[var]:
            lines.append(f"constraints.{key} = {pin} binds: the {LABELS[var][0]} must satisfy "
                         f"{rules}, and the rules leave only {key} in {free[var]}")
            by_distance = sorted(free[var], key=lambda x: (abs(x - pin), x))
            near = next((x for x in by_distance if admits is None or admits(key, x)), None)
            sp_off = sp_may_be_off and BY_NAME["sp_seq"].says in rules
            if near is None:
                pair = admits.with_one_lifted(key, by_distance) if admits else None
                lines.append(f"no {key} in {free[var]} leaves a plan with the other "
                             "constraints kept" + (
                                 f"; nearest change: {key} = {pair[1]} and lift "
                                 f"constraints.{pair[0]}" if pair else
                                 ": change another pin as well"))
                continue
            deeper = _deeper_shortfall(admits) if key == "pp" else None
            lines.append(f"nearest change: {key} = {near} (or lift constraints.{key}"
                         + (", or set constraints.sequence_parallel = false" if sp_off else "")
                         + (f", or raise constraints.max_stage_shortfall from "
                            f"{admits.inst.spec.constraints.max_stage_shortfall} to {deeper}"
                            if deeper is not None else "")
                         + ")")
        else:
            lines.append(f"constraints.{key} = {pin}: no {LABELS[var][0]} satisfies {rules}, "
                         "pinned or not")
    if lines:
        raise InfeasibleError("the constraints leave no plan", lines)


def _deeper_shortfall(admits: Admits | None) -> int | None:
    """For a ``pp`` pin that binds where ``[constraints] max_stage_shortfall`` is given: the
    least larger shortfall at which the pinned degree keeps a plan, the other constraints
    kept (80 layers at a pinned ``pp = 6`` need the first / last stages 2 short: 14 x 6 - 80
    = 4), or None (also where the key is unset: the search's own already reaches the pinned
    degree where the cap of :data:`~planner.model.plan.AUTO_SHORTFALL_CAP` allows)."""
    if admits is None:
        return None
    c = admits.inst.spec.constraints
    if "max_stage_shortfall" not in c.model_fields_set:
        return None
    return next((k for k in range(c.max_stage_shortfall + 1, MAX_STAGE_SHORTFALL + 1)
                 if admits("max_stage_shortfall", k)), None)


class Admits:
    """``admits(key, value)``: whether ``[constraints] key = value`` (a cap below it raised to
    it), the other constraints kept (or ``lift`` set to its default), leaves a plan keeping
    the structural rules: the check of every "nearest change" of a degree pin (here and
    formulations/explain.py). Its spaces are built without the suggestion search
    (``suggest=False``): a pin that binds there only has to be seen to bind."""

    def __init__(self, inst: Instance):
        self.inst = inst

    def __call__(self, key: str, value: int, lift: str | None = None) -> bool:
        c = self.inst.spec.constraints
        cap = PIN_CAPS.get(key, "")
        change = {key: value}
        if cap and getattr(c, cap) is not None and getattr(c, cap) < value:
            change[cap] = value
        if lift is not None:
            change[lift] = lifted(c, lift)
        try:
            space = build_space(self.inst.with_spec(constraints=c.model_copy(update=change)),
                                suggest=False)
        except InfeasibleError:
            return False
        return bool(count_points(space))

    def with_one_lifted(self, key: str, values: list[int]) -> tuple[str, int] | None:
        """The nearest of ``values`` that leaves a plan once one other pin the instance writes
        is lifted (to its unconstrained value, :func:`planner.model.schema.lifted`), and that
        pin: ``(pin, value)``, or None."""
        c = self.inst.spec.constraints
        cap = PIN_CAPS.get(key, "")
        others = [k for k in sorted(c.model_fields_set) if k not in (key, cap)
                  and WHAT_IFS[k] != "kept" and getattr(c, k) != lifted(c, k)]
        for value in values:
            for other in others:
                if self(key, value, lift=other):
                    return other, value
        return None


def build_space(inst: Instance, suggest: bool = True) -> SearchSpace:
    """The search space of an instance under its ``[constraints]`` (pins and caps are domains).
    ``suggest``: a pin that binds is explained with the nearest value that leaves a plan,
    each candidate checked on a space of its own (built without that check)."""
    m = inst.model
    c = inst.spec.constraints
    tr = inst.spec.training
    N, g = inst.gpus, inst.node_size
    nodes = inst.segments
    gb = tr.global_batch
    base_primes = {2, 3, 5, 7}
    # the layouts' padded layer counts too: pp and vp are divisors of layers + shortfalls
    # (126 + 2 = 128, 128 + 2 = 130 = 2 x 5 x 13), so their primes must be in the list
    layouts, split = _layouts_of(inst)
    padded = {m.layers + lay[0] + lay[1] for lay in layouts}
    for n in (N, g, nodes, m.layers, m.heads, m.kv, m.seq_len, max(m.experts, 1), *padded):
        base_primes |= set(factorize(n))
    if isinstance(gb, int):
        base_primes |= set(factorize(gb))
    primes = tuple(sorted(base_primes))

    why: list[str] = []
    # the batch knobs' ranges: the only candidate values that do not come from a rule
    B = [gb] if isinstance(gb, int) else smooth_in_range(gb[0], gb[1], primes)
    if not B:
        why.append(f"training.global_batch range {list(gb)} holds no batch that factors over "
                   f"the primes {primes}")
    lo_mb, hi_mb = c.min_micro_batch, c.max_micro_batch
    if c.micro_batch is not None:
        lo_mb = hi_mb = c.micro_batch
    start: dict[str, list[int] | None] = {n: None for n in BASE_NAMES}
    start["B"] = B
    start["b"] = smooth_in_range(lo_mb, min(hi_mb, max(B, default=1)), primes)
    # the layout rules split layers + shortfalls over pp * vp: both divide one of those counts
    start["P"], start["V"] = list(split), list(split)
    caps = {"T": (c.tp, None, c.max_tp), "C": (c.cp, None, c.max_cp),
            "P": (c.pp, None, c.max_pp), "V": (c.vp, None, c.max_vp),
            "E": (c.ep, None, c.max_ep)}

    capped: dict[str, str] = {}          # a cap below the file's -> why
    rows, implications, knob_rules = rule_rows(inst)
    # a knob the rules need (sequence parallelism for MoE layers with tp > 1) that the
    # constraints turn off leaves the degree it needs at 1
    for rule in knob_rules:
        if getattr(c, rule.knob) is False:
            (mono, _), = (q.single_form() for q in rule.quantities(symbols(inst), Sizes.of(inst)))
            var = mono[0][0]
            pin, lo, hi = caps.get(var, (None, None, None))
            if pin not in (None, 1):
                raise InfeasibleError("the constraints leave no plan", [
                    f"{rule.message(None, Sizes.of(inst))}, which the constraints turn off, "
                    f"and constraints.{LABELS[var][1]} = {pin}"])
            caps[var] = (pin, lo, 1)
            capped[var] = f"{rule.says}, which constraints.{rule.knob} = false turns off"
    # The shard group's replicas (HSDP): a degree like the others, R = dp / dp_shard_size,
    # across nodes (the rules dp_shard / dp_replicas); 1 where the framework has no HSDP or
    # only unsharded data parallelism is allowed. A pinned dp_shard_size is a cap on the form
    # dp / R (below).
    no_hsdp = bool(c.framework) and not framework_of(c.framework).hsdp
    if no_hsdp or set(c.sharding_modes) <= {"none"}:
        caps["R"] = (None, None, 1)
        capped["R"] = (f"constraints.framework = \"{c.framework}\" has no HSDP" if no_hsdp
                       else "the constraints allow only unsharded data parallelism")
    dom, bounded_by = _domains(rows, start, caps)
    if not m.moe:       # (a dense model's reasons are the dense rules)
        silent = {BY_NAME[name].says for name in EXPERT_ONLY}
        bounded_by = {v: [w for w in said if w not in silent] or said
                      for v, said in bounded_by.items()}
    for var in ("P", "V"):          # their candidates come from the layouts' padded counts
        bounded_by[var].insert(0, f"pp*vp divides the {m.layers} layers plus a layout's "
                               f"shortfalls ({shortfall_words(inst)})")
    # the micro-batch's candidates come from the batch: where no rule row narrowed them, that
    # is the rule to name (micro_batch * dp divides the global batch)
    if not bounded_by["b"]:
        bounded_by["b"].append("micro_batch * dp divides the global batch ("
                               + (f"{gb}" if isinstance(gb, int) else
                                  f"one of {gb[0]}..{gb[1]}") + ")")
    if B:
        cap_b = max(B) if c.max_micro_batch == c.micro_batch else c.max_micro_batch
        free_b = smooth_in_range(c.min_micro_batch, min(cap_b, max(B)), primes)
        _pins_that_bind(rows, start, caps, dom, bounded_by,
                        {"b": (c.micro_batch, free_b)} if c.micro_batch is not None else {},
                        # (MoE layers need sequence parallelism at tp > 1)
                        sp_may_be_off=not m.moe and c.sequence_parallel is None,
                        admits=Admits(inst) if suggest else None)
    layout_rules = [r for r in rules_for(inst) if r.on_knobs]
    pairs, layout_why = _layout_pairs(inst, layout_rules, layouts, dom["P"], dom["V"])
    layout_binds = bool(layout_why and dom["P"] and dom["V"])
    if dom["P"] and dom["V"] and B:
        why += layout_why           # (with P or V empty, their own message says why)
        dom["P"] = [x for x in dom["P"] if any(p == x for ok in pairs.values() for p, _ in ok)]
        dom["V"] = [x for x in dom["V"] if any(v == x for ok in pairs.values() for _, v in ok)]
    for var in BASE_NAMES:
        if var in ("P", "V") and layout_binds:  # (said above)
            continue
        if not dom[var] and B:               # (an empty batch range is reported above)
            rules = "; ".join(dict.fromkeys(bounded_by[var]))
            why.append(f"no {LABELS[var][0]} satisfies: {rules}"
                       f"{_caps_text(var, caps, inst, capped)}")
    modes = c.recompute_modes
    if not modes:
        why.append("constraints.recompute allows no mode")
    fw = framework_of(c.framework) if c.framework else None
    if c.recompute_layers and fw is not None and not fw.partial_recompute:
        why.append(f"constraints.recompute_layers = {c.recompute_layers}, but constraints."
                   f"framework = \"{fw.name}\": {fw.label} recomputes every layer or none (no "
                   "count per stage)")
    shardings = c.sharding_modes
    if fw is not None:
        refused = [m for m in shardings if m not in fw.sharding_modes]
        shardings = tuple(m for m in shardings if m in fw.sharding_modes)
        if not shardings:
            why.append(f"constraints.framework = \"{fw.name}\" runs dp_sharding "
                       f"{' | '.join(fw.sharding_modes)}, not {' | '.join(refused)}")
        if not fw.hsdp:
            if c.dp_shard_size is not None and c.dp is not None and c.dp_shard_size != c.dp:
                why.append(f"constraints.framework = \"{fw.name}\" has no HSDP: "
                           "dp_shard_size must be dp")
    if c.dp_shard_size is not None:      # a shard group size asks for a sharded mode
        shardings = tuple(m for m in shardings if m != "none")
    if not shardings and fw is None:
        why.append("constraints.dp_sharding allows no mode"
                   + (" (constraints.dp_shard_size needs a sharded mode)"
                      if c.dp_shard_size is not None else ""))
    if shardings:
        # FP8 parameters and master weights as remainders run with the framework's modes
        # for them only (frameworks.py sharding_refusal)
        refused = {m: sharding_refusal(inst.spec.training, c.framework, m) for m in shardings}
        kept = tuple(m for m in shardings if refused[m] is None)
        if not kept:
            # (the modes left are said where the refusal depends on the mode, each mode with
            # its own reason where they differ: MXFP8 parameters under torchtitan are refused
            # by plain DP for wanting FSDP and by FSDP for wanting the distributed optimizer)
            reasons = list(dict.fromkeys(refused.values()))
            if len(reasons) == 1:
                why.append(reasons[0] + ("" if len(shardings) > 1 else
                                         f"; the constraints and framework leave dp_sharding "
                                         f"{shardings[0]}"))
            else:
                why.append("no data-parallel sharding mode the constraints and framework leave "
                           "runs these [training] settings: " + "; ".join(
                               f"dp_sharding = \"{m}\": {refused[m]}" for m in shardings))
        shardings = kept
    if why:
        raise InfeasibleError("the constraints leave no plan", why)

    def var(name: str) -> BaseVar:
        vals = tuple(sorted(set(dom[name])))
        return BaseVar(name, vals, tuple(exponent_vector(v, primes) for v in vals))

    base = {n: var(n) for n in BASE_NAMES}
    fixed = {n: bv.values[0] for n, bv in base.items() if len(bv.values) == 1}
    cons = [ExpConstraint(f"{r.rule.says}" + (f" [{r.index}]" if r.index else ""), r.mono,
                          _exponents(r.coef, primes), eq=r.rule.kind == "one",
                          when_v_gt1=r.rule.interleaved) for r in rows]

    # The overlap switches are not searched: each is the [constraints] pin, else the
    # framework's default (planner/model/frameworks.py). Under the cost rules (docs/model.md,
    # "Overlap") an overlap never exposes more than the raw collective, and only
    # tp_comm_overlap adds memory (Transformer Engine's userbuffers, docs/model.md "Memory"), so
    # a search would switch the others on always; what a user runs is the framework's choice
    # or theirs, the userbuffers' memory included. A default may follow the sharding mode
    # (DeepSpeed's overlap_comm, on for ZeRO-3 alone): ``overlaps`` are the switches of no
    # mode in particular, the rules below read them; each combination takes its mode's.
    def overlaps_of(mode: str | None) -> dict[str, bool]:
        return {o: getattr(c, o) if getattr(c, o) is not None
                else overlap_default(inst, o, mode) for o in OVERLAP_KNOBS}

    overlaps = overlaps_of(None)

    # Unless a constraint pins them, sequence parallelism and the distributed optimizer are
    # turned on: in this model they never add memory and the distributed optimizer costs no
    # time without data-parallel overlap (it moves the same data-parallel bytes and shards the
    # optimizer states; with overlap_param_gather its all-gather hides only behind the first
    # forward, up to 0.03% more, and with overlap_grad_reduce alone not at all, up to 0.20%
    # more: then plain data parallelism is searched too, docs/encoding.md); sequence
    # parallelism moves the same tensor-parallel bytes and shards what was replicated, and
    # costs no time with tensor parallelism inside a node. Across nodes its exposed backward
    # all-gather (where the plain all-reduce runs beside the weight-gradient GEMM, terms.py)
    # can cost up to ~3% more than it saves, so where tensor parallelism may span nodes
    # (constraints.tp_within_node = false) both are searched: exact, at twice the categorical
    # combinations there. tests/test_dominance.py checks the dominance on random plans. A rule
    # that needs sequence parallelism (MoE layers with tp > 1) or tp_comm_overlap (Megatron-LM's
    # validate_args requires it) keeps it on everywhere: it is required at tp > 1 and changes
    # nothing at tp = 1.
    sp_needed = any(rule.knob == "sequence_parallel" for rule in knob_rules) or \
        overlaps["tp_comm_overlap"]
    tp_spans = not c.tp_within_node and max(dom["T"], default=1) > 1 and not sp_needed
    sp_vals = (c.sequence_parallel,) if c.sequence_parallel is not None else \
        ((True, False) if tp_spans else (True,))
    # The data-parallel sharding mode is compared, never assumed: sharding the gradients or
    # the parameters costs collectives per micro-batch (docs/model.md, "Data-parallel
    # sharding"). The HSDP shard group is the degree R. The reshard policy exists only when
    # the parameters are sharded: the [constraints] pin, else the framework's default policy
    # (reshard without pipeline parallelism, not with it), which the model reads off the
    # pipeline degree, so it is no categorical choice of its own. Plain data parallelism
    # (none) is left out where the distributed optimizer dominates it: without overlap of the
    # data-parallel collectives, its reduce-scatter + all-gather at R = 1 move no more bytes in
    # the same ring steps and it holds less memory (tests/test_dominance.py).
    shard_choices = every_choice = [
        (mode, c.reshard_after_forward if mode == "optim_grads_params" else False)
        for mode in shardings]
    overlapped = any(overlaps[o] for o in ("overlap_grad_reduce", "overlap_param_gather"))
    if not overlapped and "optim" in shardings and c.distributed_optimizer is None:
        shard_choices = [sc for sc in shard_choices if sc[0] != "none"]
    # ZeRO-2 is ZeRO-1 where the gradients are reduced once per step and not bucket by bucket
    # during the backward (overlap_grad_reduce off): they accumulate whole over the
    # micro-batches and are reduce-scattered after the last, so both modes hold the same bytes
    # and run the same collectives (planner/model/terms.py): the same plans, kept once.
    if "optim" in shardings and not any(reduce_every_microbatch(inst)) \
            and not overlaps["overlap_grad_reduce"]:
        shard_choices = [sc for sc in shard_choices if sc[0] != "optim_grads"]
    lays = [lay for lay in layouts if lay in pairs]
    paced = any(lay[1] for lay in lays)
    partial = any(lay[5] for lay in lays)
    # Host offload (docs/model.md, "Host offload"; docs/encoding.md): optimizer offload on /
    # off and the offloaded layer count from a small set (plan.offload_choices), kept where
    # the framework runs them (the optimizer with its offload modes, Megatron-Core's
    # activation offload without recompute and, since it needs pp = 1, on the even layout
    # only, the one layout of a single stage; pp = 1 is a row of the model, like the
    # framework rules). Offload never saves time, so where it adds none its plans tie with
    # the plans without it and the tie-break (memory headroom first) keeps the offloaded one.
    opt_vals, layer_vals = offload_choices(inst)
    fw_off = framework_of(c.framework)
    offloads = [(o, n) for o in opt_vals for n in layer_vals]

    # overlap_param_gather pinned on rules plain data parallelism out (Megatron-LM asserts the
    # distributed optimizer for it); a framework default of on costs nothing there (no
    # parameter all-gather) and the plan reports it off (Plan.__post_init__)
    if c.overlap_param_gather:
        shard_choices = [sc for sc in shard_choices if sc[0] != "none"]
        every_choice = [sc for sc in every_choice if sc[0] != "none"]
        if not every_choice:
            raise InfeasibleError("the constraints leave no plan", [
                "constraints.overlap_param_gather = true needs a sharded data-parallel mode "
                "(Megatron-LM: the distributed optimizer); the allowed modes "
                f"({', '.join(shardings)}) have none"])

    # a switch on under some modes and off under others (a default that follows the mode)
    # puts its exposure's maxima in every combination: Knobs.overlap_maxes
    by_mode = {mode: overlaps_of(mode) for mode, _ in every_choice}
    mixed = tuple(o for o in OVERLAP_KNOBS if len({ov[o] for ov in by_mode.values()}) > 1)
    if set(mixed) - {"overlap_grad_reduce"} or (mixed and any(
            ov["overlap_param_gather"] for ov in by_mode.values())):
        # (terms.py writes the zero maxima of the gradient reduction alone, and only where the
        # parameter gather is not overlapped, which would merge the two exposures)
        raise AssertionError(f"overlap defaults that follow the sharding mode: {mixed}")

    def knob_combos(sps, choices) -> list[Knobs]:
        return [Knobs(r, s, mode != "none", **by_mode[mode],
                      dp_sharding=mode, overlap_maxes=mixed,
                      reshard_after_forward=rf,
                      first_short=lay[0], last_short=lay[1], account_for_embedding=lay[2],
                      account_for_loss=lay[3], layout_string=lay[4], paced=paced,
                      optimizer_offload=oo, offload_layers=on, offload_maxes=any(layer_vals),
                      recompute_share=lay[5],
                      recompute_maxes=partial)
                for r, s, (mode, rf), lay, (oo, on) in itertools.product(
                    modes, sps, choices, lays, offloads)
                if not (oo and mode not in fw_off.optimizer_offload_modes)
                and not (on and not fw_off.activation_offload)
                and not (on and (r != "none" or lay[:5] != (0, 0, False, False, False)))
                and not (lay[5] and r != "full")]
    combos = knob_combos(sp_vals, shard_choices)
    # what solver.space counts: the same combinations with the values the search leaves out
    # (sequence parallelism off where it is free; plain data parallelism, ZeRO-2), each mode
    # with the offload and recompute choices its framework runs
    counted: dict[tuple, tuple[int, int]] = {}
    sp_all = (c.sequence_parallel,) if c.sequence_parallel is not None else (True, False)
    for k in knob_combos(sp_all, every_choice):
        key = (layout_key(k), k.dp_sharding != "none")
        on, off = counted.get(key, (0, 0))
        counted[key] = (on + k.sequence_parallel, off + (not k.sequence_parallel))
    if not combos:
        pins = pinned(c, ("optimizer_offload", "offload_layers", "recompute", "dp_sharding",
                          "distributed_optimizer", "framework"))
        raise InfeasibleError("the constraints leave no plan", [
            f"host offload: {fw_off.offload_source or fw_off.label}; no allowed combination "
            f"runs it under {', '.join(pins)}"])
    dims = {"recompute": modes, "sequence_parallel": sp_vals,
            "sharding_choice": tuple(shard_choices),
            # one dimension: its five fields vary together
            "layout": tuple(dict.fromkeys(lay[:5] for lay in lays)),
            "recompute_share": tuple(dict.fromkeys(lay[5] for lay in lays)),
            "offload": tuple(dict.fromkeys(k.offload for k in combos)),
            # (a switch whose default follows the sharding mode takes each value a mode gives)
            **{o: tuple(dict.fromkeys(getattr(k, o) for k in combos)) for o in OVERLAP_KNOBS}}
    caps_on_forms = []
    if c.dp is not None or c.max_dp is not None:
        mono, coef = symbols(inst).dp.single_form()
        caps_on_forms.append(("dp", mono, coef, c.dp, c.dp or c.max_dp))
    if c.dp_shard_size is not None:
        mono, coef = symbols(inst).dp_shard.single_form()
        caps_on_forms.append(("dp_shard_size", mono, coef, c.dp_shard_size, c.dp_shard_size))
    return SearchSpace(inst, primes, base, fixed, cons, combos, dims, caps_on_forms,
                       implications, layout_pairs=pairs, counted_combos=counted)


# ------------------------------------------------------------------------------------------
# Counting by dynamic programming over the rules (no walk of the product of the domains)
# ------------------------------------------------------------------------------------------


def count_points(space: SearchSpace, track: tuple[str, ...] = (), only: tuple[str, ...] | None
                 = None, form: Mono | None = None, dominant_batch: bool = False,
                 layout: tuple | None = None) -> dict[tuple, int]:
    """:func:`_count_points` (below) where the pipeline layouts have their say: only the
    ``(P, V)`` pairs some layout allows (:attr:`SearchSpace.layout_pairs`) count, or those of
    one ``layout`` when it is given. The layout rules read the knobs, so they are not per-prime
    rows; they act on two variables, which the count tracks and then sums out."""
    if not space.layout_pairs or (only is not None and not {"P", "V"} <= set(only)):
        return _count_points(space, track, only, form, dominant_batch)
    pairs = (space.layout_pairs[layout] if layout is not None
             else frozenset().union(*space.layout_pairs.values()))
    if form is not None:                        # (no caller needs both: a bound, not a count)
        return _count_points(space, track, only, form, dominant_batch)
    # the counter's keys list the tracked variables in BASE_NAMES order
    full = sorted(set(track) | {"P", "V"}, key=BASE_NAMES.index)
    ip, iv = full.index("P"), full.index("V")
    P, V = space.base["P"].values, space.base["V"].values
    out: dict[tuple, int] = {}
    for key, n in _count_points(space, tuple(full), only, None, dominant_batch).items():
        if (P[key[ip]], V[key[iv]]) in pairs:
            k = tuple(x for x, v in zip(key, full) if v in track)
            out[k] = out.get(k, 0) + n
    return out


#: the base variables the counter takes last (see :func:`_count_points`)
_BATCH_LAST = ("V", "b", "B")


def _walk_order(only: tuple[str, ...] | None = None) -> list[str]:
    """The order in which :func:`_count_points` takes the variables (of ``only``, or all)."""
    return [n for n in BASE_NAMES if (only is None or n in only) and n not in _BATCH_LAST] + \
        [n for n in _BATCH_LAST if only is None or n in only]


def _count_points(space: SearchSpace, track: tuple[str, ...] = (), only: tuple[str, ...] | None
                  = None, form: Mono | None = None, dominant_batch: bool = False,
                  diagram: list | None = None) -> dict[tuple, int]:
    """How many assignments of the base variables keep the rules, grouped by the values of the
    ``track`` variables (value indices) and by the exponent vector of ``form`` (a product of
    base variables): ``{key: count}``, empty when no assignment keeps them.

    It never lists the assignments: the variables are taken one at a time (in
    :data:`~planner.model.plan.BASE_NAMES` order) and an assignment so far is reduced to what
    the rules still need of it, the partial per-prime exponent sum of each rule not yet
    complete (and the ``> 1`` flags of the implications and of the interleaved-only rules);
    assignments with the same state are one row with a count. The cost is the number of
    distinct states, which the rules keep small (a handful of exponents each), not the product
    of the domains.

    ``only`` restricts the walk to some variables and the rules among them (the others are
    left free: a per-form bound). ``dominant_batch`` keeps, per assignment of the other
    variables, only the largest global batch the rules admit, as
    :func:`formulations.enumerate.feasible_points` does (the batches that can hold an optimum
    of a batch range).

    ``diagram``, a list, receives the walk as a layered graph (:class:`_Diagram`): per
    variable, the edges (state, value, next state) its kept values take."""
    import numpy as np

    # the batch variables last: the rules that link the degrees (the expert ones read P) close
    # before them, so the many batch values meet few states (the count is order-free; the keys
    # are put back in BASE_NAMES order below)
    names = _walk_order(only)
    pos = {n: i for i, n in enumerate(names)}
    nq = len(space.primes)
    exps = {n: np.array(space.base[n].exps, dtype=np.int64).reshape(-1, nq) for n in names}
    gt1 = {n: (np.array(space.base[n].values) > 1).astype(np.int64)[:, None] for n in names}
    logq = np.log(np.array(space.primes, dtype=float))
    # an item: (variables, {variable: per-value delta, shape (values, width)}, check | None)
    items: list[tuple[set, dict, object]] = []

    def vec(mono, flag: str | None = None) -> dict:
        out = {}
        for v in {x for x, _ in mono} | ({flag} if flag else set()):
            e = dict(mono).get(v, 0)
            d = e * exps[v]
            if flag:
                d = np.hstack([d, gt1[v] if v == flag else np.zeros_like(gt1[v])])
            out[v] = d
        return out

    # per inequality row: its exponents, constant and V > 1 flag; where it ends at a variable
    # of positive exponent it is a lower bound on that variable's exponents (judged as one)
    lower: dict[int, tuple] = {}
    for con in space.constraints:
        vs = {v for v, _ in con.mono} | ({"V"} if con.when_v_gt1 else set())
        if not vs <= set(names):
            continue
        const = np.array(con.const, dtype=np.int64)

        def check(p, const=const, eq=con.eq, flag=con.when_v_gt1):
            tot = p[:, :nq] + const
            ok = np.all(tot == 0, axis=1) if eq else np.all(tot >= 0, axis=1)
            return ok | (p[:, nq] == 0) if flag else ok
        if not con.eq:
            lower[len(items)] = (dict(con.mono), const, con.when_v_gt1)
        items.append((vs, vec(con.mono, "V" if con.when_v_gt1 else None), check))
    for imp in space.implications:
        a, b = imp.if_var, imp.then_var
        if {a, b} <= set(names):
            z = {v: np.zeros_like(gt1[v]) for v in (a, b)}
            items.append(({a, b}, {a: np.hstack([gt1[a], z[a]]), b: np.hstack([z[b], gt1[b]])},
                          lambda p: ~((p[:, 0] > 0) & (p[:, 1] == 0))))
    for _name, mono, coef, lo, hi in space.form_caps:
        if {v for v, _ in mono} <= set(names):
            def cap_ok(p, coef=coef, lo=lo, hi=hi):
                val = coef * np.exp(p @ logq)
                return ((val >= lo * (1 - 1e-9)) if lo is not None else True) & \
                    ((val <= hi * (1 + 1e-9)) if hi is not None else True)
            items.append(({v for v, _ in mono}, vec(mono), cap_ok))
    n_rules = len(items)
    items += [({n}, {n: np.arange(len(exps[n]), dtype=np.int64)[:, None]}, None)
              for n in track if n in pos]
    n_track_end = len(items)
    if form is not None:
        items.append(({v for v, _ in form}, vec(form), None))
    first = [min(pos[v] for v in vs) for vs, _, _ in items]
    last = [max(pos[v] for v in vs) for vs, _, _ in items]
    width = [next(iter(d.values())).shape[1] for _, d, _ in items]

    states = np.zeros((1, 0), dtype=np.int64)          # one row per distinct state
    counts = np.ones(1, dtype=np.int64)
    active: list[int] = []                             # items carried in the state, in order
    for i, name in enumerate(names):
        carry = active + [k for k in range(len(items)) if first[k] == i]
        start = np.cumsum([0] + [width[k] for k in carry])
        n_vals = len(exps[name])
        base = np.hstack([states, np.zeros((len(states), start[-1] - states.shape[1]),
                                           dtype=np.int64)])
        closing = [s for s, k in enumerate(carry) if last[k] == i and k < n_rules]
        # the rules that end here, judged once per distinct value of the columns they read;
        # the inequality rows in which this variable has a positive exponent only bound its
        # exponents from below, so they are judged as one lower bound per prime
        bounds = [s for s in closing if carry[s] in lower
                  and lower[carry[s]][0].get(name, 0) > 0
                  and not (lower[carry[s]][2] and name == "V")]
        generic = [s for s in closing if s not in bounds]
        cols = [c for s in generic for c in range(start[s], start[s + 1])]
        key = base[:, cols]
        if bounds:
            lo_x, hi_x = exps[name].min(axis=0), exps[name].max(axis=0)
            need = np.broadcast_to(lo_x, (len(base), nq))
            for s in bounds:
                e, const, flag = lower[carry[s]]
                got = -np.floor_divide(base[:, start[s]:start[s] + nq] + const, e[name])
                if flag:                          # enforced only when V > 1
                    got = np.where(base[:, start[s] + nq][:, None] > 0, got, lo_x)
                need = np.maximum(need, got)
            key = np.hstack([key, np.minimum(need, hi_x + 1)])
        sub, inv = _unique_rows(key)
        ok_sub = np.ones((len(sub), n_vals), dtype=bool)
        if bounds:
            ok_sub &= np.all(exps[name][None, :, :] >= sub[:, None, len(cols):], axis=2)
        at = 0
        for s in generic:
            w = start[s + 1] - start[s]
            d = items[carry[s]][1].get(name)
            d = np.zeros((n_vals, w), dtype=np.int64) if d is None else d
            cur = (sub[:, None, at:at + w] + d[None, :, :]).reshape(-1, w)
            ok_sub &= items[carry[s]][2](cur).reshape(len(sub), n_vals)
            at += w
        if name == "B" and dominant_batch and n_vals > 1:
            # values ascend: per state keep only the largest batch the rules admit (the rules
            # judge a state by its closing columns, so per distinct columns)
            top = n_vals - 1 - np.argmax(ok_sub[:, ::-1], axis=1)
            live_sub = ok_sub.any(axis=1)
            ok_sub = np.zeros_like(ok_sub)
            ok_sub[np.flatnonzero(live_sub), top[live_sub]] = True
        kept = [s for s in range(len(carry)) if s not in closing]
        active = [carry[s] for s in kept]
        if not any(name in items[carry[s]][1] for s in kept):
            # the value leaves no trace in the state: each state stays, times its values
            counts = counts * ok_sub.sum(axis=1)[inv]
            live = counts > 0
            if diagram is not None:
                s_e, j_e = np.nonzero(ok_sub[inv])
                diagram.append((s_e, j_e, (np.cumsum(live) - 1)[s_e]))
            cols = [c for s in kept for c in range(start[s], start[s + 1])]
            states, counts = base[live][:, cols], counts[live]
            if not len(states):
                return {}
            continue
        sel = np.flatnonzero(ok_sub[inv].ravel())    # candidate rows (state, value) kept
        s_sel, j_sel = np.divmod(sel, n_vals)

        # each kept item's state columns after this variable's value, on the kept rows
        parts = []
        for s in kept:
            sl = slice(start[s], start[s + 1])
            d = items[carry[s]][1].get(name)
            parts.append(base[s_sel, sl] + d[j_sel] if d is not None else base[s_sel, sl])
        rows = np.hstack(parts) if parts else np.zeros((len(sel), 0), dtype=np.int64)
        cnt = counts[s_sel]
        if not len(rows):
            return {}
        states, inverse = _unique_rows(rows)
        if diagram is not None:
            diagram.append((s_sel, j_sel, inverse))
        counts = np.bincount(inverse.ravel(), weights=cnt, minlength=len(states)).astype(np.int64)
    start = np.cumsum([0] + [width[k] for k in active])
    # the keys: the tracked variables in BASE_NAMES order, then the form
    at = {k: range(start[s], start[s + 1]) for s, k in enumerate(active)}
    cols = [c for k in sorted((k for k in active if k >= n_rules),
                              key=lambda k: (BASE_NAMES.index(next(iter(items[k][0])))
                                             if k < n_track_end else len(BASE_NAMES)))
            for c in at[k]]
    out: dict[tuple, int] = {}
    for row, c in zip(states[:, cols].tolist(), counts.tolist()):
        out[tuple(row)] = out.get(tuple(row), 0) + c
    return out


def _unique_rows(rows):
    """``np.unique(rows, axis=0, return_inverse=True)``, through one integer key per row when
    the columns' ranges allow it (much faster than sorting rows)."""
    import numpy as np

    if rows.shape[1] == 0:
        return rows[:1], np.zeros(len(rows), dtype=np.int64)
    lo, hi = rows.min(axis=0), rows.max(axis=0)
    span = (hi - lo + 1).astype(object)
    if math.prod(span.tolist()) >= 2**62:
        states, inverse = np.unique(rows, axis=0, return_inverse=True)
        return states, inverse.ravel()
    key = np.zeros(len(rows), dtype=np.int64)
    for c in range(rows.shape[1]):
        key = key * int(span[c]) + (rows[:, c] - lo[c])
    _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    return rows[first], inverse.ravel()


class _Diagram:
    """The rules' walk (:func:`_count_points`) kept as a layered graph, to read off the values
    of many forms without walking the rules again for each.

    Layer ``i`` holds the walk's states before its ``i``-th variable (``names[i]``); an edge
    (state, value, next state) is a value the rules keep from that state, so the paths from the
    one first state to the last layer are the assignments that keep the rules, one each. Only
    edges on such a path are kept (``edges``: per layer, the values, next states, and each
    state's first edge and edge count), and ``fwd`` / ``bwd`` count the paths into / out of
    each state. A form's values (:func:`_form_counts`) then take one pass over the
    layers from its first variable to its last, with (state, partial exponents) pairs: the
    layers before and after it are summed up by ``fwd`` and ``bwd``. Per form that is a few
    array operations per layer it spans, where a walk of the rules judged every rule at every
    variable again (the presolve of every encoding: 45 s of the suite's 410 s of CPU, 8,400
    walks, before this)."""

    def __init__(self, space: SearchSpace, dominant_batch: bool):
        import numpy as np

        self.names = _walk_order()
        self.layer = {n: i for i, n in enumerate(self.names)}
        nq = len(space.primes)
        #: per variable, its values' exponent vectors (what a form's pass adds up)
        self.exps = {n: np.array(space.base[n].exps, dtype=np.int64).reshape(-1, nq)
                     for n in self.names}
        layers: list = []
        self.empty = not _count_points(space, dominant_batch=dominant_batch, diagram=layers)
        if self.empty:
            return
        sizes = [1] + [int(dst.max()) + 1 if len(dst) else 0 for _, _, dst in layers]
        n = len(layers)
        bwd = [None] * (n + 1)
        bwd[n] = np.ones(sizes[n], dtype=np.int64)
        self.edges = [None] * n
        for i in range(n - 1, -1, -1):
            src, val, dst = layers[i]
            keep = bwd[i + 1][dst] > 0
            src, val, dst = src[keep], val[keep], dst[keep]
            order = np.argsort(src, kind="stable")
            src, val, dst = src[order], val[order], dst[order]
            deg = np.bincount(src, minlength=sizes[i])
            self.edges[i] = (val, dst, np.cumsum(deg) - deg, deg)
            bwd[i] = np.bincount(src, weights=bwd[i + 1][dst], minlength=sizes[i]).astype(np.int64)
        fwd = [np.ones(1, dtype=np.int64)]
        for i in range(n):
            val, dst, first, deg = self.edges[i]
            src = np.repeat(np.arange(sizes[i]), deg)
            fwd.append(np.bincount(dst, weights=fwd[i][src], minlength=sizes[i + 1])
                       .astype(np.int64))
        self.fwd, self.bwd = fwd, bwd


def _form_counts(space: SearchSpace, diag: _Diagram, form: Mono, batch: bool = False
                 ) -> dict[tuple, int]:
    """``_count_points(space, form=form)`` (with ``track=("B",)`` when ``batch``), read off
    the walk's graph ``diag`` of the same space and ``dominant_batch``."""
    import numpy as np

    if diag.empty:
        return {}
    nq = len(space.primes)
    e_of = dict(form)
    spans = [diag.layer[v] for v in e_of] + ([diag.layer["B"]] if batch else [])
    if not spans:                                          # a constant form
        return {(): int(diag.bwd[0][0])} if int(diag.bwd[0][0]) else {}
    a, z = min(spans), max(spans)
    width = (1 if batch else 0) + nq
    live = np.flatnonzero((diag.fwd[a] > 0) & (diag.bwd[a] > 0))
    nodes, weight = live, diag.fwd[a][live]
    code = np.zeros((len(live), width), dtype=np.int64)
    for i in range(a, z + 1):
        val, dst, first, deg = diag.edges[i]
        name = diag.names[i]
        k = deg[nodes]
        rep = np.repeat(np.arange(len(nodes)), k)
        at = first[nodes][rep] + np.arange(len(rep)) - (np.cumsum(k) - k)[rep]
        j = val[at]
        code = code[rep]
        if name in e_of:
            code[:, width - nq:] += e_of[name] * diag.exps[name][j]
        if batch and name == "B":
            code[:, 0] = j
        nodes, weight = dst[at], weight[rep]
        if i < z:                 # merge the pairs that meet (the last layer is summed below)
            rows, inv = _unique_rows(np.hstack([nodes[:, None], code]))
            nodes, code = rows[:, 0], rows[:, 1:]
            weight = np.bincount(inv, weights=weight, minlength=len(rows)).astype(np.int64)
    weight = weight * diag.bwd[z + 1][nodes]
    out: dict[tuple, int] = {}
    for row, c in zip(code.tolist(), weight.tolist()):
        if c:
            out[tuple(row)] = out.get(tuple(row), 0) + c
    return out


def candidate_batches(space: SearchSpace) -> list[int]:
    """The global batches of a range that can hold an optimum, largest first: the largest
    batch some assignment of the other variables admits (:func:`count_points` with
    ``dominant_batch``; tests/test_dominance.py checks that a larger batch is never slower
    per sequence). Empty when no assignment keeps the rules."""
    reach = count_points(space, track=("B",), dominant_batch=True)
    return sorted((space.base["B"].values[k[0]] for k in reach), reverse=True)


def space_size(space: SearchSpace) -> dict[str, int]:
    """The size of the space a question ranges over, counted over the rules (never listed):
    ``space_points``, the assignments of the base variables that keep the structural rules
    (every global batch of a range); ``space_combos``, the knob combinations the constraints
    allow, counting the values the search fixes or leaves out because others dominate or equal
    them (sequence parallelism; plain data parallelism and ZeRO-2, see :func:`build_space`);
    ``space_plans``, the plans (an assignment with a knob combination it admits: a pipeline
    layout its own (P, V) pairs, sequence parallelism off only at tp = 1 where MoE layers need
    it, plain data parallelism only at R = 1; :attr:`SearchSpace.counted_combos`)."""
    c = space.inst.spec.constraints
    combos = sum(on + off for on, off in space.counted_combos.values())
    needs_sp = c.sequence_parallel is None and any(
        r.kind == "needs_knob" and r.knob == "sequence_parallel" for r in rules_for(space.inst))
    # one count by (T, P, V, R) serves all three figures: the layouts' pairs, the tp = 1 rule
    # and plain data parallelism's R = 1 are read off its keys (the counter lists tracked
    # variables in BASE_NAMES order)
    T, P, V, R = (space.base[n].values for n in ("T", "P", "V", "R"))
    rows = [(T[t], (P[p], V[v]), R[r], n)
            for (t, p, v, r), n in _count_points(space, track=("T", "P", "V", "R")).items()]
    union = frozenset().union(*space.layout_pairs.values()) if space.layout_pairs else None
    points = sum(n for _, pv, _, n in rows if union is None or pv in union)
    plans = 0
    for (lay, sharded), (on, off) in space.counted_combos.items():   # a layout: its (P, V)
        pairs = space.layout_pairs[lay] if space.layout_pairs else None
        laid = [(t, n) for t, pv, r, n in rows if (pairs is None or pv in pairs)
                and (sharded or r == 1)]
        total = sum(n for _, n in laid)
        # sequence parallelism off is a plan only at tp = 1 where MoE layers need it
        plans += total * on + (sum(n for t, n in laid if t == 1) if needs_sp else total) * off
    return {"space_points": points, "space_combos": combos, "space_plans": plans}

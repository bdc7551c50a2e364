"""A tiny symbolic algebra so that the evaluator is written once and read three ways.

The AMPeD step time is a sum of monomials ``c * x1^e1 * x2^e2 ...`` in the parallel degrees
(docs/encoding.md, "The evaluator on symbols"). The evaluator (:mod:`planner.model.terms`) is
plain arithmetic on its inputs; fed numbers it returns numbers (``plan evaluate``), fed numpy
arrays it returns arrays (the enumerator), and fed :class:`Sig` symbols it returns the step time
as a signomial that the MIP encoders (:mod:`formulations.encoding`) turn into solver rows. One
source of truth, so the solver's objective and the evaluator's number cannot drift apart.

What a model term may use, and nothing else (anything else raises :class:`Unencodable`, so a
term the encoders cannot represent exactly can never be dropped or approximated silently):

* sums, differences and products of degrees, numbers and such terms, and division by a
  *single* monomial (a degree, a product of degrees, a number);
* integer powers of those;
* ``Fn`` factors: a named function of one monomial *form* (``gt1(p_inter)`` = 1 if the pipeline
  crosses nodes; ``ring_share(n) = (n - 1) / n``; ``steps(n) = n - 1``; ``eq1``), tabulated by
  the encoders over the form's few values;
* ``vmax``: a maximum of such expressions, in the *objective only* (it is minimised, so an
  epigraph variable encodes it exactly), never nested, never scaled by a factor that may be
  negative, never inside a constraint (memory);
* :func:`is_one` to skip a term whose degree is known to be 1.

Not supported, and raising :class:`Unencodable`: division by a sum or by a function factor,
a function of a sum, a product of two maxima, a maximum that is negated, nested, scaled by a
possibly negative factor or used in a constraint, comparisons and truth tests of symbols
(``if t > 1`` must be written with ``gt1``), ``float()`` of a symbol, non-integer powers.

Example
-------
>>> t = Sig.var("t")
>>> cost = 2 * (t - 1) / t
>>> cost.evaluate({"t": 8})
1.75
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

Mono = tuple[tuple[str, int], ...]  # sorted (variable, exponent) pairs, exponents != 0

#: Named functions of one form; the encoders tabulate them over the form's values.
FUNCTIONS: dict[str, Callable[[float], float]] = {
    "gt1": lambda x: 1.0 if x > 1 + 1e-9 else 0.0,
    "eq1": lambda x: 1.0 if abs(x - 1) <= 1e-9 else 0.0,
    "ring_share": lambda x: 1.0 - 1.0 / x,
    "steps": lambda x: x - 1.0,
    "gt2": lambda x: 1.0 if x > 2 + 1e-9 else 0.0,
    "le2": lambda x: 0.0 if x > 2 + 1e-9 else 1.0,
    "not_whole": lambda x: 0.0 if x >= 1 - 1e-9 and abs(x - round(x)) <= 1e-9 * max(x, 1)
    else 1.0,
}


@dataclass(frozen=True, order=True)
class Fn:
    """A factor ``FUNCTIONS[name](scale * value of form)``."""

    name: str
    form: Mono
    scale: float = 1.0

    def __call__(self, values: Mapping[str, float]) -> float:
        return FUNCTIONS[self.name](self.scale * mono_value(self.form, values))


Key = tuple[Mono, tuple[Fn, ...]]


class Unencodable(TypeError):
    """A model term uses a construct the MIP encodings cannot represent exactly (see the
    module docstring for what is supported)."""


@functools.lru_cache(maxsize=1 << 16)
def mono_mul(a: Mono, b: Mono, sign: int = 1) -> Mono:
    """Product of two monomial forms (``sign=-1`` divides)."""
    if not b:                      # (most products have a constant factor: no new form)
        return a
    if not a and sign == 1:
        return b
    acc = dict(a)
    for v, e in b:
        acc[v] = acc.get(v, 0) + sign * e
    return tuple(sorted((v, e) for v, e in acc.items() if e))


def mono_value(form: Mono, values: Mapping[str, float]) -> float:
    out = 1.0
    for v, e in form:
        out *= float(values[v]) ** e
    return out


class Sig:
    """A signomial ``sum_k coef_k * monomial_k * prod(Fn factors)`` plus maxima of signomials.

    ``maxes`` holds terms ``max(arg_1, ..., arg_n)`` added to the sum; a maximum may be scaled by
    a non-negative signomial (distributed into its arguments) but never by a negative number.
    """

    __slots__ = ("maxes", "terms")

    def __init__(self, terms: dict[Key, float] | None = None, maxes: tuple = ()):
        self.terms: dict[Key, float] = terms or {}
        self.maxes: tuple[tuple[Sig, ...], ...] = maxes

    # construction -----------------------------------------------------------------------
    @staticmethod
    def var(name: str) -> Sig:
        return Sig({(((name, 1),), ()): 1.0})

    @staticmethod
    def const(c: float) -> Sig:
        return Sig({((), ()): float(c)} if c else {})

    @staticmethod
    def fn(name: str, x: Sig) -> Sig:
        form, scale = x.single_form()
        if not form:
            return Sig.const(FUNCTIONS[name](scale))
        return Sig({((), (Fn(name, form, scale),)): 1.0})

    def single_form(self) -> tuple[Mono, float]:
        """The monomial and coefficient of a one-term signomial (a degree or a product)."""
        if self.maxes or len(self.terms) > 1:
            raise Unencodable("expected a single monomial (a degree or a product of degrees), "
                              f"got {self!r}")
        if not self.terms:
            return (), 0.0
        (mono, fns), c = next(iter(self.terms.items()))
        if fns:
            raise Unencodable(f"expected a monomial without function factors, got {self!r}")
        return mono, c

    def require_linear(self, what: str) -> None:
        """Raise :class:`Unencodable` if the expression holds a maximum: ``what`` (a
        constraint) must be a plain signomial."""
        if self.maxes:
            raise Unencodable(f"{what} holds a maximum, which only the objective may: write "
                              "it without vmax")

    def __bool__(self):
        raise Unencodable("a symbol has no truth value: write the condition with gt1 / eq1")

    def __float__(self):
        raise Unencodable("a symbol has no numeric value until the encoders tabulate it")

    def __lt__(self, other):
        raise Unencodable("symbols cannot be compared: write the condition with gt1 / eq1 "
                          "or the choice with vmax")

    __le__ = __gt__ = __ge__ = __lt__

    # arithmetic ---------------------------------------------------------------------------
    def __add__(self, other) -> Sig:
        o = _lift(other)
        if o is NotImplemented:
            return NotImplemented
        terms = dict(self.terms)
        for k, c in o.terms.items():
            terms[k] = terms.get(k, 0.0) + c
        return Sig({k: c for k, c in terms.items() if c != 0.0}, self.maxes + o.maxes)

    __radd__ = __add__

    def __neg__(self) -> Sig:
        if self.maxes:
            raise Unencodable("a maximum cannot be negated")
        return Sig({k: -c for k, c in self.terms.items()})

    def __sub__(self, other) -> Sig:
        o = _lift(other)
        return NotImplemented if o is NotImplemented else self + (-o)

    def __rsub__(self, other) -> Sig:
        return (-self) + other

    def __mul__(self, other) -> Sig:
        if isinstance(other, (int, float, np.integer, np.floating)):
            return self._scaled(float(other))
        o = _lift(other)
        if o is NotImplemented:
            return NotImplemented
        if self.maxes and o.maxes:
            raise Unencodable("a product of two maxima is not representable")
        if o.maxes:
            return o * self
        if self.maxes and any(c < 0 for c in o.terms.values()):
            raise Unencodable("a maximum cannot be scaled by a factor that may be negative")
        terms: dict[Key, float] = {}
        for (m1, f1), c1 in self.terms.items():
            for (m2, f2), c2 in o.terms.items():
                k = (mono_mul(m1, m2), tuple(sorted(f1 + f2)) if f1 and f2 else f1 or f2)
                terms[k] = terms.get(k, 0.0) + c1 * c2
        terms = {k: c for k, c in terms.items() if c != 0.0}
        maxes = tuple(tuple(arg * o for arg in mx) for mx in self.maxes)
        return Sig(terms, maxes)

    __rmul__ = __mul__

    def _scaled(self, f: float) -> Sig:
        """``self * f`` for a number ``f``: the same terms, coefficients scaled (the product
        by a constant signomial, without forming the products of forms)."""
        if not f:
            if self.maxes:           # (0 * max(...) is 0: every argument scaled to 0)
                return Sig({}, tuple(tuple(arg._scaled(0.0) for arg in mx)
                                     for mx in self.maxes))
            return Sig()
        if self.maxes and f < 0:
            raise Unencodable("a maximum cannot be scaled by a factor that may be negative")
        return Sig({k: c * f for k, c in self.terms.items()},
                   tuple(tuple(arg._scaled(f) for arg in mx) for mx in self.maxes))

    def __truediv__(self, other) -> Sig:
        if isinstance(other, Sig):
            if len(other.terms) != 1 or other.maxes:
                raise Unencodable(f"can only divide by a single monomial, not by {other!r}")
            (mono, fns), c = next(iter(other.terms.items()))
            if fns:
                raise Unencodable("cannot divide by a function factor")
            inv = Sig({(tuple((v, -e) for v, e in mono), ()): 1.0 / c})
            return self * inv
        return self * (1.0 / other)

    def __rtruediv__(self, other) -> Sig:
        return Sig.const(other) / self if not isinstance(other, Sig) else other / self

    def __pow__(self, n: int) -> Sig:
        if not isinstance(n, int):
            raise Unencodable(f"only integer powers of a symbol are supported, not {n!r}")
        out = Sig.const(1.0)
        for _ in range(abs(n)):
            out = out * self
        return out if n >= 0 else 1.0 / out

    # evaluation --------------------------------------------------------------------------
    def evaluate(self, values: Mapping[str, float]) -> float:
        """Numeric value at a point (variables by name); used to check encodings."""
        total = 0.0
        for (mono, fns), c in self.terms.items():
            term = c * mono_value(mono, values)
            for f in fns:
                term *= f(values)
            total += term
        for mx in self.maxes:
            total += max(arg.evaluate(values) for arg in mx)
        return total

    def __repr__(self) -> str:
        parts = [f"{c:.4g}*" + "*".join(f"{v}^{e}" for v, e in m) +
                 "".join(f"*{f.name}({f.form})" for f in fns)
                 for (m, fns), c in self.terms.items()]
        parts += [f"max({', '.join(map(repr, mx))})" for mx in self.maxes]
        return " + ".join(parts) or "0"


def _lift(x) -> Sig:
    if isinstance(x, Sig):
        return x
    if isinstance(x, (int, float, np.integer, np.floating)):
        return Sig.const(float(x))
    return NotImplemented


# Helpers that work on numbers, numpy arrays and Sig alike --------------------------------

#: The same functions on numpy arrays, elementwise (np.vectorize is far too slow here).
ARRAY_FUNCTIONS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "gt1": lambda x: (x > 1 + 1e-9).astype(float),
    "eq1": lambda x: (np.abs(x - 1) <= 1e-9).astype(float),
    "ring_share": lambda x: 1.0 - 1.0 / x,
    "steps": lambda x: x - 1.0,
    "gt2": lambda x: (x > 2 + 1e-9).astype(float),
    "le2": lambda x: (x <= 2 + 1e-9).astype(float),
    "not_whole": lambda x: 1.0 - ((x >= 1 - 1e-9)
                                  & (np.abs(x - np.rint(x)) <= 1e-9 * np.maximum(x, 1))).astype(float),
}


def _apply(name: str, x):
    if isinstance(x, Sig):
        return Sig.fn(name, x)
    if isinstance(x, np.ndarray):
        return ARRAY_FUNCTIONS[name](x)
    return FUNCTIONS[name](float(x))


def gt1(x):
    """1 if ``x > 1`` else 0 (x a degree or a product of degrees)."""
    return _apply("gt1", x)


def gt2(x):
    """1 if ``x > 2`` else 0: a pipeline of ``x`` stages has middle stages."""
    return _apply("gt2", x)


def le2(x):
    """1 if ``x <= 2`` else 0: a pipeline of ``x`` stages has no middle stage (an argument of a
    function is a degree at every feasible point, so ``eq1(p / 2)`` would rule out ``p = 1``:
    formulations/encoding.py, ``_restrict_forms``)."""
    return _apply("le2", x)


def eq1(x):
    """1 if ``x == 1`` else 0."""
    return _apply("eq1", x)


def not_whole(x):
    """1 unless ``x`` is a positive whole number: a quotient of degrees that a framework needs
    to be a degree itself (the encoders' presolve forbids the form values where it is 1, since
    a function's argument is a degree at every feasible point)."""
    return _apply("not_whole", x)


def ring_share(n):
    """``(n - 1) / n``: the share of the data a ring of ``n`` moves per GPU per pass. Kept as one
    factor (not ``1 - 1/n``) so the encoders never see a difference of large terms."""
    return _apply("ring_share", n)


def steps(n):
    """``n - 1``: the number of steps of a ring of ``n`` (kept as one non-negative factor)."""
    return _apply("steps", n)


def capped_quotient(x, num: int, cap: int):
    """``min(num / x, cap)`` (x a degree): e.g. the MoE layers of the pipeline stage that holds
    the most of them, ``min(L / p, n_moe)``. Registered per ``(num, cap)`` as a named function of
    one form, so the encoders tabulate it like any other."""
    name = f"capq_{num}_{cap}"
    if name not in FUNCTIONS:
        FUNCTIONS[name] = lambda v, n=num, c=cap: min(n / v, float(c))
        ARRAY_FUNCTIONS[name] = lambda v, n=num, c=cap: np.minimum(n / v, float(c))
    return _apply(name, x)


def quotient_excess(x, num: int, cap: int):
    """``max(num / x - cap, 0)`` (x a degree): what :func:`capped_quotient` leaves of ``num /
    x``, e.g. the dense layers of that stage, ``L / p - min(L / p, n_moe)``. One non-negative
    factor (not a difference), so it may scale a maximum."""
    name = f"qexcess_{num}_{cap}"
    if name not in FUNCTIONS:
        FUNCTIONS[name] = lambda v, n=num, c=cap: max(n / v - float(c), 0.0)
        ARRAY_FUNCTIONS[name] = lambda v, n=num, c=cap: np.maximum(n / v - float(c), 0.0)
    return _apply(name, x)


def run_max(x, num: int, marks: tuple[int, ...]):
    """The most marked items in any run of ``num / x`` consecutive items of ``marks`` (x a
    degree; ``num / x`` rounded up where it is not whole, at points the rules exclude): e.g.
    the full-attention layers of the fullest chunk of ``L / (p v)`` consecutive layers.
    Registered per ``(num, marks)`` as a named function of one form."""
    digest = hashlib.md5(bytes(marks)).hexdigest()[:12]
    name = f"runmax_{num}_{digest}"
    if name not in FUNCTIONS:
        prefix = np.concatenate([[0], np.cumsum(marks)])

        def one(v, n_all=num, pre=prefix):
            run = min(max(math.ceil(n_all / float(v) - 1e-9), 1), len(pre) - 1)
            return float(np.max(pre[run:] - pre[:-run]))
        FUNCTIONS[name] = one
        ARRAY_FUNCTIONS[name] = _per_value(one)
    return _apply(name, x)


def _per_value(one):
    """``one`` (a scalar function of a degree) over an array of points, computed once per
    distinct value: a form takes few values, the enumerator's arrays hold thousands of points."""
    def many(v):
        u, back = np.unique(np.asarray(v, dtype=float), return_inverse=True)
        return np.array([one(x) for x in u])[back].reshape(np.shape(v))
    return many


def remote_nodes(x, experts: int, top_k: int):
    """The expected number of nodes other than its own that a token's ``top_k`` experts sit on,
    with ``experts`` spread evenly over ``x`` nodes (x a degree) and the experts drawn without
    replacement, uniformly (balanced routing): ``(x - 1) (1 - C(E - E/x, k) / C(E, k))``, the
    tokens a deduplicating dispatcher (DeepEP / HybridEP) sends across nodes, one per remote
    node. Registered per ``(experts, top_k)`` as a named function of one form."""
    name = f"remote_{experts}_{top_k}"
    if name not in FUNCTIONS:
        def one(v, e=experts, k=top_k):
            v = float(v)
            if v <= 1 + 1e-9:
                return 0.0
            per = e / v                       # experts per node (whole where v divides e)
            miss = math.comb(e - round(per), k) / math.comb(e, k) if e - round(per) >= k \
                else 0.0
            return (v - 1.0) * (1.0 - miss)
        FUNCTIONS[name] = one
        ARRAY_FUNCTIONS[name] = _per_value(one)
    return _apply(name, x)


def vmax(*args):
    """Maximum of expressions; symbolic arguments make a ``max`` term of a :class:`Sig`."""
    if any(isinstance(a, Sig) for a in args):
        sigs = tuple(_lift(a) for a in args)
        for s in sigs:
            if s.maxes:
                raise Unencodable("nested maxima are not representable")
        return Sig({}, (sigs,))
    if any(isinstance(a, np.ndarray) for a in args):
        out = np.asarray(args[0], dtype=float)
        for a in args[1:]:
            out = np.maximum(out, a)
        return out
    return max(args)


def is_one(x) -> bool:
    """True when ``x`` is the number 1 (a degree known to be 1 needs no term at all)."""
    return not isinstance(x, (Sig, np.ndarray)) and math.isclose(float(x), 1.0)


def is_zero(x) -> bool:
    """True when ``x`` is the number 0 (a numpy array, e.g. of candidate calibration values,
    is never taken for zero: its terms are kept)."""
    return not isinstance(x, (Sig, np.ndarray)) and float(x) == 0.0

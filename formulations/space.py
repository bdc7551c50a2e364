"""The search space every backend walks: base degrees, their allowed values, the rules that
link them, and the categorical choices.

Base variables (the rest is derived from them and the GPU count ``N``, ``g`` GPUs per node):

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
========  ===============================================  ===========================

``dp = N / (T C P)``, ``dp_in = g / (T_in C_in P_in)``, ``dp_out = dp / dp_in`` and the
micro-batch count ``m = B / (dp b)``; the MoE layers' expert data-parallel degree is
``N / (P E)`` with ``g / (E_in P_in)`` of it inside a node (expert tensor parallelism 1).
Degrees are not limited to powers of two: every value is a vector of exponents over the primes
of the instance (``N``, ``g``, layers, heads, kv heads, sequence, experts, batch, and 2, 3, 5,
7), products are sums of exponent vectors and divisibility is a
per-prime ``<=`` (DESIGN.md section 2). A global-batch range is searched over its values that
factor over these primes.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

from planner.model.algebra import Mono
from planner.model.errors import InfeasibleError
from planner.model.terms import Knobs
from planner.model.instance import Instance

BASE_NAMES = ("T", "T_in", "C", "C_in", "P", "P_in", "V", "b", "B", "E", "E_in")


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
    """``const + sum(coef * exponent(var))`` per prime, ``>= 0`` (or ``== 0`` with ``eq``)."""

    name: str
    mono: Mono
    const: tuple[int, ...]
    eq: bool = False
    when_v_gt1: bool = False    # enforced only for interleaved plans (V > 1)


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

    @property
    def N(self) -> int:
        return self.inst.gpus

    def exps_of(self, n: int) -> tuple[int, ...]:
        f = factorize(n)
        if set(f) - set(self.primes):
            raise ValueError(f"{n} has primes outside {self.primes}")
        return tuple(f.get(q, 0) for q in self.primes)


def _vec(f: dict[int, int], primes: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(f.get(q, 0) for q in primes)


def build_space(inst: Instance) -> SearchSpace:
    """The search space of an instance under its ``[constraints]`` (pins and caps are domains)."""
    m = inst.model
    c = inst.spec.constraints
    tr = inst.spec.training
    N, g = inst.gpus, inst.node_size
    nodes = N // g
    gb = tr.global_batch
    base_primes = {2, 3, 5, 7}
    for n in (N, g, nodes, m.layers, m.heads, m.kv, m.seq_len, max(m.experts, 1)):
        base_primes |= set(factorize(n))
    if isinstance(gb, int):
        base_primes |= set(factorize(gb))
    primes = tuple(sorted(base_primes))

    def var(name: str, values) -> BaseVar:
        vals = tuple(sorted(set(values)))
        return BaseVar(name, vals, tuple(_vec(factorize(v), primes) for v in vals))

    def capped(values, pin, cap):
        vals = [v for v in values if (cap is None or v <= cap) and (pin is None or v == pin)]
        return vals

    why: list[str] = []
    head_div = divisors(math.gcd(m.heads, m.kv))
    T = capped(head_div, c.tp, c.max_tp)
    if not T:
        why.append(f"no tensor degree divides heads={m.heads} and kv_heads={m.kv} within "
                   f"tp={c.tp} / max_tp={c.max_tp}")
    T_in = [v for v in divisors(g) if any(t % v == 0 for t in T)]
    C = capped(divisors(m.seq_len), c.cp, c.max_cp)
    if not C:
        why.append(f"no context degree divides seq_len={m.seq_len} within cp={c.cp} / "
                   f"max_cp={c.max_cp}")
    C_in = [v for v in divisors(g) if any(x % v == 0 for x in C)]
    P = capped(divisors(m.layers), c.pp, c.max_pp)
    if not P:
        why.append(f"no pipeline degree divides layers={m.layers} within pp={c.pp} / max_pp={c.max_pp}")
    P_in = [v for v in divisors(g) if any(x % v == 0 for x in P)]
    V = capped(divisors(m.layers), c.vp, c.max_vp)
    if not V:
        why.append(f"no virtual-stage count divides layers={m.layers} within vp={c.vp} / "
                   f"max_vp={c.max_vp}")
    if isinstance(gb, int):
        B = [gb]
        b_all = divisors(gb)
    else:
        B = smooth_in_range(gb[0], gb[1], primes)
        if not B:
            why.append(f"training.global_batch range {list(gb)} holds no batch that factors over "
                       f"the primes {primes}")
        b_all = smooth_in_range(1, max(B) if B else 1, primes)
    lo_mb, hi_mb = c.min_micro_batch, c.max_micro_batch
    if c.micro_batch is not None:
        lo_mb = hi_mb = c.micro_batch
    b = [v for v in b_all if lo_mb <= v <= hi_mb]
    if not b:
        why.append(f"no micro-batch size in [{lo_mb}, {hi_mb}] divides the global batch")
    if m.moe:
        E = capped(divisors(m.experts), c.ep, c.max_ep)
        if not E:
            why.append(f"no expert-parallel degree divides experts={m.experts} within "
                       f"ep={c.ep} / max_ep={c.max_ep}")
    else:
        E = [1]
        if c.ep not in (None, 1):
            why.append(f"constraints.ep = {c.ep} needs a mixture-of-experts model")
    E_in = [v for v in divisors(g) if any(x % v == 0 for x in E)]
    modes = c.recompute_modes
    if not modes:
        why.append("constraints.recompute allows no mode")
    # Unless a constraint pins them, sequence parallelism and the distributed optimizer are
    # turned on: in this model they never cost time and never add memory (sequence parallelism
    # moves the same tensor-parallel bytes and shards what was replicated; the distributed
    # optimizer moves the same data-parallel bytes and shards the optimizer states), so the
    # optimum is unchanged. tests/test_dominance.py checks this on random plans.
    sp_vals = (c.sequence_parallel,) if c.sequence_parallel is not None else (True,)
    if m.moe and sp_vals == (False,):       # MoE with tp > 1 needs sequence parallelism
        base_T = [1]
        if 1 not in T:
            raise InfeasibleError("the constraints leave no plan", [
                "MoE layers with tp > 1 need sequence parallelism, which the constraints turn off,"
                " and tp = 1 is not allowed"])
        T = base_T
        T_in = [1]
    elif m.moe:
        sp_vals = (True,)                     # equivalent at tp = 1, required at tp > 1
    if why:
        raise InfeasibleError("the constraints leave no plan", why)

    base = {"T": var("T", T), "T_in": var("T_in", T_in), "C": var("C", C),
            "C_in": var("C_in", C_in), "P": var("P", P), "P_in": var("P_in", P_in),
            "V": var("V", V), "b": var("b", b), "B": var("B", B), "E": var("E", E),
            "E_in": var("E_in", E_in)}
    fixed = {n: bv.values[0] for n, bv in base.items() if len(bv.values) == 1}

    zero = tuple(0 for _ in primes)
    NE, gE, nodesE = _vec(factorize(N), primes), _vec(factorize(g), primes), \
        _vec(factorize(nodes), primes)
    LE = _vec(factorize(m.layers), primes)
    cons = [
        ExpConstraint("t_out = T / T_in is an integer", (("T", 1), ("T_in", -1)), zero),
        ExpConstraint("c_out = C / C_in is an integer", (("C", 1), ("C_in", -1)), zero),
        ExpConstraint("p_out = P / P_in is an integer", (("P", 1), ("P_in", -1)), zero),
        ExpConstraint("dp = N / (T C P) is an integer", (("C", -1), ("P", -1), ("T", -1)), NE),
        ExpConstraint("dp_in = g / (T_in C_in P_in) is an integer",
                      (("C_in", -1), ("P_in", -1), ("T_in", -1)), gE),
        ExpConstraint("dp_out = dp / dp_in is an integer",
                      (("C", -1), ("C_in", 1), ("P", -1), ("P_in", 1), ("T", -1), ("T_in", 1)),
                      nodesE),
        ExpConstraint("pp * vp divides layers", (("P", -1), ("V", -1)), LE),
        ExpConstraint("m = B / (dp b) is an integer",
                      (("B", 1), ("C", 1), ("P", 1), ("T", 1), ("b", -1)),
                      tuple(-e for e in NE)),
        ExpConstraint("e_out = E / E_in is an integer", (("E", 1), ("E_in", -1)), zero),
        ExpConstraint("expert dp = N / (P E) is an integer", (("E", -1), ("P", -1)), NE),
        ExpConstraint("expert dp_in = g / (E_in P_in) is an integer",
                      (("E_in", -1), ("P_in", -1)), gE),
        ExpConstraint("expert dp_out is an integer",
                      (("E", -1), ("E_in", 1), ("P", -1), ("P_in", 1)), nodesE),
        ExpConstraint("interleaving needs pp | micro-batches",
                      (("B", 1), ("C", 1), ("T", 1), ("b", -1)), tuple(-e for e in NE),
                      when_v_gt1=True),
    ]
    if c.tp_within_node:
        cons.append(ExpConstraint("tp within a node", (("T", 1), ("T_in", -1)), zero, eq=True))
    if c.pp_within_node:
        cons.append(ExpConstraint("pp within a node", (("P", 1), ("P_in", -1)), zero, eq=True))
    if c.cp_within_node:
        cons.append(ExpConstraint("cp within a node", (("C", 1), ("C_in", -1)), zero, eq=True))

    do_vals = ((c.distributed_optimizer,) if c.distributed_optimizer is not None else (True,))
    combos = [Knobs(r, s, o) for r, s, o in itertools.product(modes, sp_vals, do_vals)]
    dims = {"recompute": modes, "sequence_parallel": sp_vals, "distributed_optimizer": do_vals}
    caps = []
    if c.dp is not None or c.max_dp is not None:
        caps.append(("dp", (("C", -1), ("P", -1), ("T", -1)), float(N), c.dp, c.dp or c.max_dp))
    return SearchSpace(inst, primes, base, fixed, cons, combos, dims, caps)

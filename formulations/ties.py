"""One answer per question: how every backend breaks ties between plans of equal objective.

Many plans often share the optimal step time (the micro-batch size may not change it, two
placements may cost the same, a recompute mode may be free). Each backend returns the same one,
chosen by these goals in order, each among the plans the previous goals left:

1. ``objective``: the proven optimum ``z``; plans within ``TIE_RELATIVE`` of it (0.01%) are
   ties. The window is two orders of magnitude above CP-SAT's rounding (each table entry to a
   quantum of 1e-7 of the objective), so exactly tied plans are ties in every backend.
2. ``memory``: the least memory per GPU on the most loaded stage (most headroom); equal within
   ``MEMORY_TOLERANCE_BYTES`` (1 MiB).
3. ``internode``: the fewest bytes a GPU sends across nodes per step
   (:func:`planner.model.terms.internode_bytes`); equal within 1 MiB or 1e-6 of the value.
4. ``lex``: the simplest plan: lexicographically smallest ``(tp, pp, cp, ep, vp,
   micro_batch)``, then the largest global batch and intra-node factors (``tp_intra``,
   ``cp_intra``, ``pp_intra``, ``ep_intra``: more of each group inside a node), then the first
   categorical combination (recompute none before selective before full). On the MIPs this is
   one integer objective ``sum weight_v * rank_v`` (split into several when the weights would
   pass 2^40), exact on both solvers.

The MIP backends run the goals as successive solves of one model (:func:`run`), each capping
the goal before it; the enumerator applies the same filters to its arrays (:func:`pick`). With a
global-batch range, ties are broken within the batch whose model holds the optimum.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np

TIE_RELATIVE = 1e-4
MEMORY_TOLERANCE_BYTES = float(2**20)
INTERNODE_TOLERANCE_BYTES = float(2**20)
INTERNODE_RELATIVE = 1e-6

#: The lexicographic key of the last goal: (base variable, +1 smaller first / -1 larger first).
LEX_ORDER = (("T", 1), ("P", 1), ("C", 1), ("E", 1), ("V", 1), ("b", 1), ("B", -1),
             ("T_in", -1), ("C_in", -1), ("P_in", -1), ("E_in", -1))
#: Largest weight of one lexicographic goal (exact integers in floats and in CP-SAT).
LEX_LIMIT = 2**40


def objective_cap(z: float) -> float:
    """The largest objective a tie may have."""
    return z + TIE_RELATIVE * abs(z)


def internode_cap(b):
    """The most bytes across nodes a plan tied with ``b`` may move (a number, or an array
    elementwise)."""
    cap = b + np.maximum(INTERNODE_TOLERANCE_BYTES, INTERNODE_RELATIVE * np.abs(b))
    return float(cap) if np.ndim(cap) == 0 else cap


def lex_ranks(values: dict[str, tuple[int, ...]], n_combos: int
              ) -> list[tuple[str, list[int]]]:
    """Per variable of :data:`LEX_ORDER` with more than one value (and the combinations, named
    ``combo``), the rank of each of its values: 0 for the preferred one."""
    out = []
    for name, sign in LEX_ORDER:
        vals = values[name]
        if len(vals) > 1:
            order = sorted(range(len(vals)), key=lambda i: sign * vals[i])
            ranks = [0] * len(vals)
            for r, i in enumerate(order):
                ranks[i] = r
            out.append((name, ranks))
    if n_combos > 1:
        out.append(("combo", list(range(n_combos))))
    return out


def lex_goals(ranks: list[tuple[str, list[int]]]) -> list[list[tuple[str, list[int]]]]:
    """The lexicographic key as a sequence of weighted goals: each a list of (variable, weight
    per value), the weights of one goal below :data:`LEX_LIMIT`."""
    goals, current, span = [], [], 1
    for name, r in reversed(ranks):
        size = max(r) + 1
        if span * size > LEX_LIMIT and current:
            goals.append(current)
            current, span = [], 1
        current.append((name, [span * x for x in r]))
        span *= size
    if current:
        goals.append(current)
    return [list(reversed(g)) for g in reversed(goals)]


# ------------------------------------------------------------------------------------------
# the enumerator
# ------------------------------------------------------------------------------------------


def pick(obj: np.ndarray, memory: np.ndarray, internode: np.ndarray,
         lex_keys: list[np.ndarray]) -> tuple[int, int] | None:
    """The (combination, point) the goals choose, from arrays of shape (combinations, points):
    ``obj`` (+inf where a plan is excluded or does not fit), ``memory``, ``internode`` bytes,
    and the lexicographic ranks (most significant first), each broadcastable to that shape."""
    z = np.min(obj)
    if not np.isfinite(z):
        return None
    cand = obj <= objective_cap(float(z))
    m = np.min(memory[cand])
    cand &= memory <= m + MEMORY_TOLERANCE_BYTES
    b = np.min(internode[cand])
    cand &= internode <= internode_cap(float(b))
    ks, ps = np.nonzero(cand)
    keys = [np.broadcast_to(key, obj.shape)[ks, ps] for key in lex_keys]
    best = np.lexsort(tuple(reversed(keys))) if keys else np.arange(len(ks))
    return int(ks[best[0]]), int(ps[best[0]])


# ------------------------------------------------------------------------------------------
# the MIP backends
# ------------------------------------------------------------------------------------------


@dataclass
class Answer:
    """A solve of one goal: its status, the solution vector, the goal's value and bound."""

    ok: bool            # a solution was found
    proven: bool        # and proven optimal
    x: list | None
    value: float | None
    bound: float | None
    status: object = None
    note: str = ""


class Session(Protocol):
    """One solver model of an encoding, re-solved for each goal."""

    def minimize(self, goal: str, time_limit: float | None, hint: list | None) -> Answer: ...

    def cap(self, goal: str, value: float) -> None:
        """Keep only the plans tied with ``value`` on ``goal`` (in the session's units)."""
        ...

    def goals(self) -> list[str]: ...


def run(session: Session, time_limit: float | None, break_ties: bool = True,
        on_first=None, window: bool = False) -> tuple[Answer, Answer, str]:
    """Minimise the goals in order. Returns the answer of the first goal (its bound is the
    proof), the answer of the last goal solved (its solution is the plan) and a note. A later
    goal that finds nothing in the time left keeps the plan found so far. ``on_first(answer)``
    is called once the objective is solved, before the tie goals (a caller may start other
    work that needs only the optimum).

    ``window``: the model's objective is already capped at the tie window of an optimum the
    caller proved (several parts of a split space holding ties, re-solved as one model), so the
    objective goal is skipped and the first tie goal is the first solve, without a hint: the
    objective solve would only find the optimum again (measured on a 24-B200 GPT-3 175B
    instance whose ZeRO-1 and ZeRO-2 parts tie at dp = 1: 0.48 s, while the memory goal took
    0.43 s without the hint it would have given against 0.39 s with it). The first answer then
    carries no objective value or bound."""
    t0 = time.perf_counter()
    names = session.goals()
    if window and break_ties and len(names) > 1:
        first = session.minimize(names[1], time_limit, None)
        if not first.ok:
            return first, first, ""
        last, first, names = first, replace(first, value=None, bound=None), names[1:]
    else:
        first = session.minimize("objective", time_limit, None)
        if on_first is not None and first.ok:
            on_first(first)
        if not first.ok or not break_ties:
            return first, first, ""
        last = first
    for prev, goal in zip(names, names[1:]):
        session.cap(prev, last.value)
        left = None if time_limit is None else time_limit - (time.perf_counter() - t0)
        if left is not None and left <= 0:
            return first, last, f"ties not fully broken: the time limit ended before {goal}"
        ans = session.minimize(goal, left, last.x)
        if not ans.ok:
            # (a solver can also fail a tie goal without a time limit: HiGHS ended one with
            # termination condition 'error' on a fuzzer's instance; say which)
            stopped = getattr(ans.status, "value", ans.status)
            why = ("in the time left" if stopped == "no_solution_in_limit" else
                   f"(the solver ended it with {ans.note or stopped})")
            return first, last, (f"ties not fully broken: no answer for {goal} {why}; the plan "
                                 "is optimal but may be another tie than other backends'")
        last = ans
    return first, last, ""

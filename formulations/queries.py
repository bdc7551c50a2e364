"""The planning questions users ask, each answered with proven optima (docs/encoding.md, "Queries"):

* :func:`pareto`: the optimum at every allowed cluster size, and the non-dominated front of
  (days, dollars), the GPU count counted through the dollars;
* :func:`capacity`: the fewest nodes whose optimal plan meets a deadline (exact: every smaller
  size is shown to miss it, by a proven optimum or by a compute lower bound);
* :func:`compare`: a constrained optimum next to the unconstrained one, with the constraints
  that bind;
* :func:`top_k`: the K best distinct plans with their gaps to the optimum.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from planner.model.errors import InfeasibleError, InputError, SolverError
from planner.model.instance import Instance
from planner.model.plan import own_shortfall
from planner.model.schema import REACHES, WHAT_IFS, ConstraintSpec, lifted
from planner.model.terms import gemm_rate
from planner.model.words import plural
from planner.model.workload import Shape

from formulations import pool, progress, ties
from formulations.result import SolveResult, Status
from formulations.solve import default_objective, solve


def time_limit_advice(time_limit: float | None) -> str:
    """What to do about a solve that stopped at its time limit, in the command line's terms
    (docs/contract.md, "Exit codes": exit 4, the message says to raise ``--time-limit``)."""
    return (f"raise --time-limit (it was {time_limit:g} s)" if time_limit
            else "give it more time with --time-limit S")


def no_plan_words(res: SolveResult, time_limit: float | None) -> str:
    """How a solve ended without a usable plan, as messages say it after their own opening:
    ``(status: note)``, and the advice to raise ``--time-limit`` when it stopped there."""
    words = f"({res.status.value}" + (f": {res.note}" if res.note else "") + ")"
    if res.status == Status.NO_SOLUTION_IN_LIMIT:
        words += f"; {time_limit_advice(time_limit)}"
    return words


def _no_plan(what: str, res: SolveResult, time_limit: float | None) -> SolverError:
    """The error of a query that needs a plan from ``res`` and got none: a solver that stopped
    proved nothing, so the query has no answer to give (exit 4), not an infeasible one."""
    return SolverError(f"{what}: the solver returned no plan {no_plan_words(res, time_limit)}")


# ------------------------------------------------------------------------------------------
# Pareto front
# ------------------------------------------------------------------------------------------


@dataclass
class ParetoPoint:
    nodes: int
    result: SolveResult | None          # None: no plan at this size
    reason: str = ""
    detail: list[str] = field(default_factory=list)   # what binds, when infeasible
    on_front: bool = False
    #: without a plan: "infeasible" (proven), or the status of a solver that stopped without
    #: one ("no_solution_in_limit" at the time limit), which proves nothing about the size
    status: str = "infeasible"

    @property
    def stopped(self) -> bool:
        """No plan because the solver stopped at its time limit, not because none exists."""
        return self.status == Status.NO_SOLUTION_IN_LIMIT.value

    @property
    def gpus(self) -> int:
        return self.result.report.plan.gpus if self.result else 0

    def to_dict(self) -> dict[str, Any]:
        if self.result is None:
            return {"nodes": self.nodes, "feasible": False, "status": self.status,
                    "reason": self.reason, "detail": self.detail}
        d = self.result.to_dict()
        d["nodes"] = self.nodes
        d["on_front"] = self.on_front
        return d


def _dominates(a: tuple, b: tuple) -> bool:
    return all(x <= y for x, y in zip(a, b)) and any(x < y for x, y in zip(a, b))


MAX_PARETO_SIZES = 512      # about 0.3 s each: a few minutes at most


def pareto(inst: Instance, solver: str = "cpsat", time_limit: float | None = None,
           node_options: list[int] | None = None, workers: int = 1) -> list[ParetoPoint]:
    """Proven optimum at each node count, with ``on_front`` marking the non-dominated ones.

    A size is on the front unless another size is at least as fast *and* at least as cheap,
    and strictly better in one of the two. Fast is training days (with a token budget), else
    time per sequence; cheap is dollars (with a price), else GPU-seconds per sequence, which
    orders sizes as dollars would at any price. The GPU count is the size being chosen, not
    a criterion of its own: its price is in the cost, so a larger size that trains both faster
    and cheaper (a smaller one that needs far more memory-saving recompute, or a worse batch
    split) dominates the smaller one. For a fixed batch, days, step time and time per sequence
    order the sizes alike.

    With ``workers`` > 1 the sizes are solved side by side in a process pool
    (:mod:`formulations.pool`): each size is its own proof, so the answer is the same.
    """
    from formulations.solve import check_backend

    options = list(node_options or inst.node_options)
    if len(options) > MAX_PARETO_SIZES:
        raise InputError(f"{inst.source}: {too_many_sizes(inst, len(options))}")
    check_backend(solver)        # (before any size: one may be infeasible before a backend runs)
    tasks = [(inst.at_size(n), solver, time_limit, "brief") for n in options]
    points = [_pareto_point(n, res) for n, res in zip(options, progress.awaited(
        pool.imap(_solve_or_infeasible, tasks, workers), "cluster size", len(options)))]
    feasible = [p for p in points if p.result is not None]
    for p in feasible:
        p.on_front = not any(_dominates(front_key(q), front_key(p))
                             for q in feasible if q is not p)
    return points


def _pareto_point(n: int, res: SolveResult | InfeasibleError) -> ParetoPoint:
    """One size of a front: its proven optimum, or why it has none."""
    if isinstance(res, InfeasibleError):
        return ParetoPoint(n, None, res.args[0], list(res.explanation))
    if res.report:
        return ParetoPoint(n, res, res.note)
    return ParetoPoint(n, None, _stop_reason(res), status=res.status.value)


def solve_below(inst: Instance, known: float | None, solver: str = "cpsat",
                time_limit: float | None = None, explain: bool | str = True,
                fallback: bool = True) -> SolveResult:
    """:func:`solve` of an instance whose space holds, as far as the caller knows, a plan of
    objective ``known`` (the constrained optimum, for ``--compare``'s baseline and lifted
    solves): capped at that value's tie window (formulations/ties.py), which keeps every tie
    of the optimum, so the answer is the uncapped one, and the MIPs need only find a plan as
    fast or faster, which they prove sooner when the known plan is close to the optimum
    (docs/encoding.md, "Queries"). With no plan under the cap the known plan was not in the
    space after all: solved again uncapped (``fallback``), or the :class:`InfeasibleError` of
    the cap (nothing in the space is as fast).

    (Not used by ``evaluate --vs-optimum``: capped at the shipped instances' own plans, 10% to
    116% slower than their optima, the solve took as long or longer: Llama 3.1 405B 5.64 ->
    5.46 s, GPT-3 175B 2.66 -> 3.11 s, DeepSeek-V3 4.60 -> 5.07 s, BLOOM 2.74 -> 2.93 s,
    one run each.)"""
    if known is None:
        return solve(inst, solver=solver, time_limit=time_limit, explain=explain)
    try:
        return solve(inst, solver=solver, time_limit=time_limit,
                     explain=False if fallback else explain,
                     max_objective=ties.objective_cap(known))
    except InfeasibleError:
        if not fallback:
            raise
    return solve(inst, solver=solver, time_limit=time_limit, explain=explain)


def _solve_or_infeasible(task: tuple) -> SolveResult | InfeasibleError:
    """One solve of a query that solves many (a pool's task: ``(instance, solver, time limit,
    explain)``, or with ``(known, fallback)`` after it, :func:`solve_below`'s): its result,
    or the infeasibility it proved, returned to be read in order rather than raised from the
    pool."""
    inst, solver, time_limit, explain, known, fallback = (*task, None, True)[:6]
    try:
        return solve_below(inst, known, solver, time_limit, explain, fallback)
    except InfeasibleError as exc:
        return exc


def too_many_sizes(inst: Instance, count: int) -> str:
    """Why a range is too long for pareto, naming the key the instance gave its sizes with."""
    if inst.spec.cluster.node_counts is not None:
        return (f"cluster.node_counts: lists {count:,} sizes, each a separate proof; pareto "
                f"takes at most {MAX_PARETO_SIZES}: keep the {MAX_PARETO_SIZES} or fewer of "
                "interest")
    return (f"cluster.nodes: the range holds {count:,} sizes, each a separate proof; pareto "
            f"takes at most {MAX_PARETO_SIZES}: give node_counts = [...] with at most "
            f"{MAX_PARETO_SIZES} sizes of interest, or a narrower range")


def _stop_reason(res: SolveResult) -> str:
    """A size's reason when its solver returned no plan without proving there is none."""
    head = ("stopped at the time limit without a plan" if res.status == Status.NO_SOLUTION_IN_LIMIT
            else f"the solver returned no plan ({res.status.value})")
    return head + (f" ({res.note})" if res.note else "")


def front_key(p: ParetoPoint) -> tuple[float, float]:
    """(time, cost) of a size, both to minimise (see :func:`pareto`)."""
    rep = p.result.report
    per_seq = rep.step_time_s / rep.plan.global_batch
    time_key = rep.total_days if rep.total_days is not None else per_seq
    cost_key = rep.cost if rep.cost is not None else per_seq * rep.plan.gpus
    return (time_key, cost_key)


# ------------------------------------------------------------------------------------------
# Capacity planning
# ------------------------------------------------------------------------------------------


#: the proof a capacity answer gives for one node fewer when that size is not in the range
OUTSIDE_RANGE = "outside the instance's node range"
#: the proof of a size without any plan (``reason`` gives the solver's sentence, ``detail``
#: what binds): a stable token a script can switch on, as the other proofs are
NO_PLAN = "no plan fits"


@dataclass
class CapacityAnswer:
    deadline_days: float
    nodes: int | None
    result: SolveResult | None
    checked: list[dict[str, Any]] = field(default_factory=list)   # every size looked at
    next_smaller: dict[str, Any] | None = None
    cheapest: dict[str, Any] | None = None
    wall_s: float = 0.0
    #: the sizes the compute lower bound ruled out without a solve, smallest first, and the
    #: bound of the largest of them (the least days any of them needs)
    bound_skipped: list[int] = field(default_factory=list)
    skipped_days_lower_bound: float | None = None
    #: the GPU count of an instance smaller than one host (``cluster.gpus = 4`` on 8-GPU
    #: hosts), its one size; None for whole nodes
    partial_gpus: int | None = None

    @property
    def unproven(self) -> list[int]:
        """The sizes checked whose solver stopped at the time limit (with a plan not proven
        optimal, or none): any of them might meet the deadline, so without an answer the range
        is not shown to miss it, and with one (they are all smaller) it is not shown minimal.
        The answer's own size is not among them: its plan meets the deadline, proven the
        fastest there or not."""
        return [c["nodes"] for c in self.checked if c["nodes"] != self.nodes
                and c.get("status") in (Status.FEASIBLE.value, Status.NO_SOLUTION_IN_LIMIT.value)]

    @property
    def fastest(self) -> dict[str, Any] | None:
        """Without an answer, the fastest size solved (``{"nodes", "days", "status",
        "proof"}``; the smallest size of a tie): the best the range was shown to do, which
        need not be its largest size. None with an answer, or when no size solved has a
        plan."""
        if self.nodes is not None:
            return None
        timed = [c for c in self.checked if c.get("days") is not None]
        if not timed:
            return None
        best = min(timed, key=lambda c: (c["days"], c["nodes"]))
        return {**best, "proof": _proof(best["status"])}

    @property
    def without_plan(self) -> list[dict[str, Any]]:
        """The sizes solved that have no plan at all (``checked`` entries, ``feasible`` false)."""
        return [c for c in self.checked if c.get("feasible") is False]

    @property
    def none_has_a_plan(self) -> bool:
        """No answer, and every size solved is proven to have no plan: the deadline is not
        what rules them out (some smaller sizes may be out by the compute bound as well)."""
        return (self.nodes is None and bool(self.checked)
                and len(self.without_plan) == len(self.checked))

    def miss_reason(self) -> str:
        """Why there is no answer, in one sentence (the error of exit 3): the fastest size
        found and its days, or why no size has a plan, never only the deadline."""
        deadline = plural(self.deadline_days, "day")
        if self.none_has_a_plan:
            sizes = [c["nodes"] for c in self.checked]
            head = (f"no size in the range has a plan ({_sizes(sizes)}: "
                    f"{_common_reason(self.without_plan)})")
            if self.bound_skipped:
                lb = days_text(self.skipped_days_lower_bound, self.deadline_days)
                head += (f"; the smaller {_sizes(self.bound_skipped)} need at least {lb} days "
                         f"by the compute lower bound, more than {deadline}")
            return head
        fast = self.fastest
        if fast is not None and self.partial_gpus is not None:
            return (f"the instance's one size, {_size_words(fast['nodes'], self.partial_gpus)}, "
                    f"does not meet {deadline}: its plan needs "
                    f"{days_text(fast['days'], self.deadline_days)} days ({fast['proof']})")
        if fast is not None:
            return (f"no size in the range meets {deadline}: the fastest found, "
                    f"{_size_words(fast['nodes'], self.partial_gpus)}, needs "
                    f"{days_text(fast['days'], self.deadline_days)} days ({fast['proof']})")
        ns = self.next_smaller or {}
        if "days_lower_bound" in ns:
            return (f"no size in the range meets {deadline}: even the largest, "
                    f"{_size_words(ns['nodes'], self.partial_gpus)}, needs at least "
                    f"{days_text(ns['days_lower_bound'], self.deadline_days)} days "
                    "(compute lower bound)")
        return f"no size in the range meets {deadline}"

    def to_dict(self) -> dict[str, Any]:
        out = self.result.to_dict() if self.result else {"plan": None}
        out["nodes"] = self.nodes
        out["deadline_days"] = self.deadline_days
        out["meets_deadline"] = self.result is not None
        out["next_smaller"] = self.next_smaller
        out["fastest"] = self.fastest
        out["checked"] = self.checked
        out["cheapest"] = self.cheapest
        out["unproven"] = self.unproven
        out["wall_s"] = self.wall_s
        return out


def _proof(status: str) -> str:
    return "proven optimum" if status == Status.OPTIMAL.value else "not proven (time limit)"


def _sizes(nodes: list[int]) -> str:
    """``3 nodes``, ``1-3 nodes``, ``1, 3 nodes``."""
    if len(nodes) == 1:
        return plural(nodes[0], "node")
    if nodes == list(range(nodes[0], nodes[-1] + 1)):
        return f"{nodes[0]:,}-{nodes[-1]:,} nodes"
    shown = ", ".join(f"{n:,}" for n in nodes[:8])
    return shown + (f" and {len(nodes) - 8:,} more" if len(nodes) > 8 else "") + " nodes"


def _size_words(nodes: int, partial_gpus: int | None) -> str:
    """A size in a sentence: ``80 nodes``, or ``4 GPUs`` for an instance smaller than a host."""
    if partial_gpus is not None:
        return f"{plural(partial_gpus, 'GPU')} (part of one node)"
    return plural(nodes, "node")


def _common_reason(entries: list[dict[str, Any]]) -> str:
    """The sentence of the sizes without a plan: theirs when they share it, else the largest
    size's, said to be that size's (what binds at each follows the error line)."""
    last = entries[-1]["reason"]
    same = sum(1 for e in entries if e["reason"] == last)
    if len(entries) == 1 or same == len(entries):
        return last
    return f"at {entries[-1]['nodes']:,} nodes, {last}; other sizes for other reasons"


def days_text(days: float, versus: float | None = None) -> str:
    """Days as a reader compares them: one decimal from 1 day up, three significant figures
    below (``0.00724``, where one decimal printed ``0.0``), and more decimals where that would
    not show on which side of ``versus`` (a deadline) the value lies (``29.97`` against 30, not
    ``30.0``). Engineering notation beyond a trillion."""
    import math

    from planner.model.words import number

    if not math.isfinite(days) or days >= 1e12:
        return number(days)
    if days <= 0:
        return "0"
    decimals = 1 if days >= 1 else 2 - math.floor(math.log10(days))
    if versus is not None and days != versus:
        # (a value that rounds onto the deadline, 29.97 -> 30.0, does not say its side either)
        while decimals < 12 and (round(days, decimals) == versus
                                 or (round(days, decimals) > versus) != (days > versus)):
            decimals += 1
    return f"{days:,.{decimals}f}"


def days_lower_bound(inst: Instance, nodes: int) -> float:
    """Days no plan on ``nodes`` nodes can beat: the GEMM FLOPs of the whole token budget (the
    model FLOPs less the attention core's) at the GPUs' fastest calibrated GEMM rate. The
    attention core is left out: the step model runs it on its own figures (fused: the causal
    half at ``attention_efficiency`` of the peak, 0.87 on Blackwell against a GEMM asymptote
    of 0.52), so counting it at the GEMM rate overstated the bound at long sequences, and
    capacity skipped sizes that met the deadline (an audit found 1 B200 node at 0.61 days
    where the bound said at least 0.67). The GPUs are the size's own (:meth:`Instance.at_size`:
    a ``cluster.gpus`` smaller than a host is that many, not the host's)."""
    sh = Shape.of(inst.model)
    hw = inst.hw
    rate = max(hw.peak * hw.efficiency, gemm_rate(inst))
    sequences = inst.spec.training.tokens / sh.s
    gemm_flops = sh.model_flops(sequences) - sh.core_flops(sequences)
    return gemm_flops / (inst.at_size(nodes).gpus * rate) / 86400


def _infeasible(n: int, exc: InfeasibleError) -> dict[str, Any]:
    """A size without a plan, as pareto gives one: ``reason`` the solver's sentence (which
    kind of rule leaves no plan: memory, the structural rules, a constraint), ``detail`` what
    binds, one line each."""
    return {"nodes": n, "feasible": False, "reason": exc.args[0], "detail": list(exc.explanation)}


def _objective_for_days(sized: Instance, days: float) -> float:
    """The objective (step time, or time per sequence for a batch range) of a plan of
    ``sized`` that trains the token budget in ``days``: at a fixed size and batch, days are
    the objective times ``tokens / seq_len`` (per sequence) or the steps."""
    sequences = sized.spec.training.tokens / Shape.of(sized.model).s
    per_sample = days * 86400 / sequences
    if default_objective(sized) == "time_per_sample":
        return per_sample
    return per_sample * sized.spec.training.global_batch


def capacity(inst: Instance, deadline_days: float, solver: str = "cpsat",
             time_limit: float | None = None, budget_usd: float | None = None,
             workers: int = 1) -> CapacityAnswer:
    """The fewest nodes in the instance's range whose optimal plan trains the token budget
    within ``deadline_days``, and that plan.

    Sizes whose compute lower bound already misses the deadline are skipped (provably too
    small); the rest are solved in increasing order until one meets the deadline, so the answer
    is minimal. A size's proven optimum decides it, not the plan the tie-break goals chose
    (up to 0.01% slower, formulations/ties.py): when only the optimum meets the deadline, a
    plan within it is asked for. With ``budget_usd`` (and a price) it also reports the
    cheapest plan meeting the deadline among the sizes from the answer up to the end of the
    range, and whether it fits the budget. Without an answer, ``fastest`` is the fastest size
    solved, and sizes without any plan say why (``checked[].reason`` and ``detail``).

    With ``workers`` > 1 the sizes are solved ahead, side by side, in a process pool
    (:mod:`formulations.pool`) and read in increasing order as here: the answer and the sizes
    checked are the same; the pool stops at the answer, having spent at most ``workers - 1``
    solves on larger sizes. (The cheapest plan's walk stays in order: each size's cap is the
    best cost before it.)
    """
    from formulations.solve import check_backend

    if not inst.spec.training.tokens:
        raise InputError(f"{inst.source}: capacity needs training.tokens (the token budget)")
    if budget_usd is not None and inst.spec.cluster.price_per_gpu_hour is None:
        raise InputError(f"{inst.source}: a budget (--budget-usd, budget_usd) needs "
                         "cluster.price_per_gpu_hour (dollars per GPU-hour) to cost the plans")
    check_backend(solver)        # (even when the compute bound leaves no size to solve)
    t0 = time.perf_counter()
    options = sorted(inst.node_options)
    ans = CapacityAnswer(deadline_days, None, None,
                         partial_gpus=inst.gpus if inst.partial_host else None)
    last_miss: dict[str, Any] | None = None
    bounds = {n: days_lower_bound(inst, n) for n in options}
    solved = pool.imap(_capacity_size, [(inst.at_size(n), deadline_days, solver, time_limit)
                                        for n in options if bounds[n] <= deadline_days], workers)
    try:
        for i, n in enumerate(options):
            lb = bounds[n]
            if lb > deadline_days:
                last_miss = {"nodes": n, "days_lower_bound": lb, "proof": "compute lower bound"}
                ans.bound_skipped.append(n)
                ans.skipped_days_lower_bound = lb
                continue
            progress.starting("cluster size", i, len(options), None, "step_time")
            res = next(solved)
            if isinstance(res, InfeasibleError):        # no plan at this size
                entry = _infeasible(n, res)
                ans.checked.append(entry)
                last_miss = {"nodes": n, "feasible": False, "proof": NO_PLAN,
                             "reason": entry["reason"], "detail": entry["detail"]}
                continue
            days = res.report.total_days if res.report else None
            ans.checked.append({"nodes": n, "days": days, "status": res.status.value})
            # a plan that meets the deadline shows the size suffices, proven optimal there or not
            # (a solve stopped at the time limit with a plan: Status.FEASIBLE; the answer then
            # says its plan is not proven the fastest at that size)
            if days is not None and days <= deadline_days and res.status in (Status.OPTIMAL,
                                                                              Status.FEASIBLE):
                ans.nodes, ans.result = n, res
                break
            last_miss = {"nodes": n, "days": days, "status": res.status.value,
                         "proof": _proof(res.status.value)}
    finally:
        solved.close()                        # (a pool stops its solves of larger sizes)
    if ans.nodes is None:
        ans.next_smaller = last_miss          # the largest size and why it misses
    elif last_miss is not None and last_miss["nodes"] == ans.nodes - 1:
        ans.next_smaller = last_miss
    elif ans.nodes - 1 >= 1 and ans.partial_gpus is None:
        n = ans.nodes - 1
        ans.next_smaller = {"nodes": n, "days_lower_bound": days_lower_bound(inst, n),
                            "proof": OUTSIDE_RANGE if n not in options
                            else "compute lower bound"}
    if budget_usd is not None and ans.result is not None:
        ans.cheapest = _cheapest(inst, ans, options, deadline_days, solver, time_limit,
                                 budget_usd)
    ans.wall_s = time.perf_counter() - t0
    return ans


def _capacity_size(task: tuple[Instance, float, str, float | None]
                   ) -> SolveResult | InfeasibleError:
    """One size of a capacity search (a pool's task): its optimum, or a plan within the
    deadline where only the tie window misses it (:func:`_within_deadline`), or the
    infeasibility it proved (:func:`_solve_or_infeasible`)."""
    sized, deadline, solver, time_limit = task
    res = _solve_or_infeasible((sized, solver, time_limit, "limits"))
    if isinstance(res, InfeasibleError):
        return res
    return _within_deadline(sized, res, deadline, solver, time_limit)


def _within_deadline(sized: Instance, res: SolveResult, deadline: float, solver: str,
                     time_limit: float | None) -> SolveResult:
    """``res``, or, when its plan misses the deadline only by the tie window (the tie-break
    goals may choose a plan up to 0.01% slower than the proven optimum, which meets it), a
    plan of the size that meets the deadline: the size suffices, and the answer must say so."""
    rep = res.report
    if (rep is None or rep.total_days is None or rep.total_days <= deadline
            or res.status != Status.OPTIMAL or not res.bound or not res.objective):
        return res
    if rep.total_days * res.bound / res.objective > deadline:
        return res                        # the optimum itself misses
    try:
        capped = solve(sized, solver=solver, time_limit=time_limit, explain=False,
                       max_objective=_objective_for_days(sized, deadline))
    except InfeasibleError:
        return res                        # (the optimum sits on the deadline, within rounding)
    ok = capped.report and capped.report.total_days <= deadline
    return capped if ok and capped.status in (Status.OPTIMAL, Status.FEASIBLE) else res


def _cheapest(inst, ans, options, deadline, solver, time_limit, budget):
    """The cheapest plan meeting the deadline from the answer's size to the end of the range.

    Each larger size is asked only for a plan that meets the deadline and costs less than
    the best so far, as a cap on its objective: at a fixed size the cost is the time per
    sequence times ``tokens / seq_len * GPUs * price``, the deadline the time per sequence
    times ``tokens / seq_len``. A size that cannot beat it is a proof of infeasibility, which
    the MIP finds faster than the size's own optimum. A size whose capped solve stopped at the
    time limit (without a plan, or with one not proven the cheapest there) proves neither:
    it is listed in ``unproven``, and the cheapest is then not proven."""
    best = ans.result
    price = inst.spec.cluster.price_per_gpu_hour
    larger = [x for x in options if x > ans.nodes]
    unproven = []
    for n in larger:
        sized = inst.at_size(n)
        # (days at this size's GPUs that cost what the best so far costs)
        cap_days = min(deadline, best.report.cost / (24 * sized.gpus * price))
        try:
            res = solve(sized, solver=solver, time_limit=time_limit, explain=False,
                        max_objective=_objective_for_days(sized, cap_days) * (1 + 1e-9))
        except InfeasibleError:
            continue
        if res.status in (Status.NO_SOLUTION_IN_LIMIT, Status.FEASIBLE):
            unproven.append(n)
        rep = res.report
        if rep and rep.total_days <= deadline and (rep.cost or 0) < (best.report.cost or 0):
            best = res
    cost = best.report.cost
    return {"nodes": best.report.plan.nodes, "cost": cost, "within_budget":
            cost is not None and cost <= budget, "budget_usd": budget,
            "plan": best.report.plan.to_dict(), "total_days": best.report.total_days,
            "sizes_checked": len(larger), "unproven": unproven}


# ------------------------------------------------------------------------------------------
# What-if: constrained vs unconstrained
# ------------------------------------------------------------------------------------------


@dataclass
class Comparison:
    """What :func:`compare` found. ``proven``: every solve it read proved its optimum, so the
    slowdown is exact and ``binding`` names every constraint that binds alone; a solve stopped
    at the time limit with a plan (``--time-limit``) leaves it False. ``undecided``: the
    constraints whose lifted solve stopped with a plan no faster than the constrained optimum
    (or, capped at it, with no plan), so whether they bind is open (a faster plan, proven or
    not, shows that one binds)."""

    constrained: SolveResult | None
    unconstrained: SolveResult
    slowdown: float | None            # constrained / unconstrained - 1
    binding: list[dict[str, Any]]
    proven: bool = True
    undecided: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"constrained": self.constrained.to_dict() if self.constrained else None,
                "unconstrained": self.unconstrained.to_dict(), "slowdown": self.slowdown,
                "binding": self.binding, "proven": self.proven, "undecided": self.undecided}


#: the ``[constraints]`` keys that restrict the space, the what-ifs, in the file's order:
#: every key but the ones :data:`~planner.model.schema.WHAT_IFS` keeps (the framework, its
#: overlaps, the reserves)
WHATIF_KEYS = tuple(k for k in ConstraintSpec.model_fields if WHAT_IFS[k] != "kept")


def unconstrained_spec(c: ConstraintSpec) -> ConstraintSpec:
    """The instance's constraints with every what-if lifted, each to the value
    :func:`~planner.model.schema.lifted` gives by its kind: a pin or a filter is lifted, a cap
    or a floor keeps whichever of the instance's value and the default lets more plans in, a
    placement rule the instance sets is lifted; the framework, its overlaps and the memory
    reserves are kept. A key whose value does not change stays as the instance gives it, set
    or not: an unset ``max_stage_shortfall`` is the search's own, which follows the layer
    count (:func:`~planner.model.plan.stage_shortfall`), not the schema's 1."""
    return c.model_copy(update={k: v for k in WHATIF_KEYS
                                if (v := lifted(c, k)) != getattr(c, k)})


def baseline_spec(inst: Instance) -> ConstraintSpec:
    """The constraints of ``--compare``'s baseline: :func:`unconstrained_spec`, and a given
    ``max_stage_shortfall`` lifted to the search's own where that is larger (a cap keeps
    whichever lets more plans in, and where this key is unset the search goes up to its own
    shortfall, not the schema's 1: :func:`~planner.model.plan.own_shortfall`, on the baseline's
    pipeline degrees). MT-NLG's 105 layers on 256 GPUs with a given 0 lift to 4, as deep as
    the same instance with the key unset searches."""
    c = inst.spec.constraints
    spec = unconstrained_spec(c)
    if "max_stage_shortfall" in c.model_fields_set:
        own = own_shortfall(inst.with_spec(constraints=spec))
        if own > spec.max_stage_shortfall:
            spec = spec.model_copy(update={"max_stage_shortfall": own})
    return spec


def _lifted_alone(inst: Instance, lifted_all: ConstraintSpec, key: str) -> dict[str, Any]:
    """The ``[constraints]`` update that lifts ``key`` alone: its baseline value, with the
    reach keys that follow it as a pin. A given ``max_stage_shortfall`` lifts as deep as the
    instance with the key unset searches under its other constraints, which a pin can make
    deeper than the baseline's: Llama 3's 80 layers on 480 GPUs need 2 short at a pinned
    ``pp = 6``, where the baseline (pp free) goes to 1."""
    update = {key: getattr(lifted_all, key)} | {
        reach: getattr(lifted_all, reach) for reach, pin in REACHES.items() if pin == key}
    if key == "max_stage_shortfall" and key in inst.spec.constraints.model_fields_set:
        update[key] = max(update[key], own_shortfall(inst))
    return update


def compare(inst: Instance, solver: str = "cpsat", time_limit: float | None = None,
            constrained: SolveResult | InfeasibleError | None = None,
            workers: int = 1) -> Comparison:
    """The instance's constrained optimum next to the optimum without its what-if constraints
    (:func:`baseline_spec`: caps the instance raises stay raised, so the baseline's space
    holds the constrained one; only a ``recompute_layers`` pin on a count that is not a share
    the search tries, a quarter, half or three quarters of a virtual stage, lies outside it, and
    the constrained plan may then be the faster), and each constraint that binds on its own
    (lifting it alone speeds the optimum up).

    Every solve must return a plan (a stop at the time limit without one raises
    :class:`SolverError`): a missing optimum leaves nothing to compare, and a missing lifted
    one leaves open whether that constraint binds. A solve stopped with a plan is read as the
    best it found: the comparison is then not ``proven`` (its slowdown compares a plan that may
    not be the optimum; ``Comparison.undecided`` lists the constraints it cannot say bind or
    not). ``constrained``: the instance's own solve, when the caller has it
    (``plan solve --compare``), not solved again, and the cap of the other solves (below); or
    the :class:`InfeasibleError` it raised, where the constraints leave no plan. The
    solves are independent: with ``workers`` > 1 they run side by side in a process pool
    (:mod:`formulations.pool`), read in the order one process would solve them."""
    c = inst.spec.constraints
    lifted_all = baseline_spec(inst)
    # (a reach key only follows its pin: lifted with it, never alone)
    alone = {k: _lifted_alone(inst, lifted_all, k) for k in WHATIF_KEYS if k not in REACHES}
    set_keys = [k for k, update in alone.items() if update[k] != getattr(c, k)]
    withouts = [inst.with_spec(constraints=c.model_copy(update=alone[k])) for k in set_keys]
    # A given constrained plan lies in the baseline's and in every lifted space (but for the
    # recompute_layers case above): those solves are capped at it (solve_below; Llama 3.1
    # 405B's compare 37.6 -> 25.4 s, DeepSeek-V3's 197 -> 152 s, one run each on 2 cores). A
    # lifted space with no plan under the cap is one where the constraint does not bind.
    known = (constrained.objective
             if isinstance(constrained, SolveResult) and constrained.report is not None else None)
    tasks = [(inst.with_spec(constraints=lifted_all), solver, time_limit, True, known, True)]
    tasks += [(inst, solver, time_limit, True)] if constrained is None else []
    tasks += [(without, solver, time_limit, False, known, False) for without in withouts]
    solved = progress.awaited(pool.imap(_solve_or_infeasible, tasks, workers),
                              "comparison solve", len(tasks))
    try:
        base = next(solved)
        if isinstance(base, InfeasibleError):
            raise base
        if base.report is None:
            raise _no_plan("--compare, the optimum without the [constraints] what-ifs", base,
                           time_limit)
        con = next(solved) if constrained is None else constrained
        con = None if isinstance(con, InfeasibleError) else con
        if con is not None and con.report is None:
            raise _no_plan("--compare, the optimum under the [constraints]", con, time_limit)
        slow = ((con.report.step_time_s / base.report.step_time_s - 1) if con and con.report
                else None)
        binding, undecided = [], []
        for key, alt in zip(set_keys, solved):
            if isinstance(alt, InfeasibleError):
                continue
            entry = {"constraint": key, "value": getattr(c, key),
                     "lifted_to": alone[key][key], "step_time_without_s": None}
            if alt.report is None:
                if known is None:
                    raise _no_plan(f"--compare, the optimum with constraints.{key} lifted", alt,
                                   time_limit)
                # capped at the constrained optimum, it found no faster plan and ruled none out
                undecided.append({**entry, "status": alt.status.value})
                continue
            entry["step_time_without_s"] = alt.report.step_time_s
            if con is None or alt.report.step_time_s < con.report.step_time_s * (1 - 1e-9):
                t_con = con.report.step_time_s if con else None
                binding.append({**entry,
                                # > 0: the optimum is that much faster without it
                                "speedup_if_lifted": (t_con / alt.report.step_time_s - 1)
                                if con else None,
                                # < 0: the step time falls by that share without it
                                "step_time_change_if_lifted": (alt.report.step_time_s / t_con - 1)
                                if con else None,
                                # (a lifted plan faster than the constrained optimum binds
                                # for certain; exact figures need both optima proven)
                                "proven": alt.proven and (con is None or con.proven)})
            elif not alt.proven:
                # no faster plan found, but none ruled out: the lifted optimum may be faster
                undecided.append({**entry, "status": alt.status.value})
    finally:
        solved.close()
    proven = (base.proven and (con is None or con.proven) and not undecided
              and all(b["proven"] for b in binding))
    return Comparison(con, base, slow, binding, proven, undecided)


# ------------------------------------------------------------------------------------------
# Top-k
# ------------------------------------------------------------------------------------------


#: The longest list :func:`top_k` makes. Each plan is a solve of its own with every better one
#: excluded (about 0.2 s on a one-node instance, more as the exclusions grow and on larger
#: spaces), so 100 plans is already minutes on a real instance, and a list that long is read
#: for its first rows; past it, constraints (a pin, a cap) ask the question better.
MAX_TOP_K = 100


class Ranked(list):
    """The plans of :func:`top_k`, best first, with ``ended``: why the list is shorter than
    asked ("" when it is not)."""

    ended: str = ""


def top_k(inst: Instance, k: int, solver: str = "cpsat",
          time_limit: float | None = None) -> Ranked:
    """The ``k`` best distinct plans, each a proven optimum once the better ones are excluded.

    When the first solve returns no plan (it stopped at the time limit) the list is that one
    result, as :func:`~formulations.solve.solve` would return it, for the caller to report.
    A later solve ends the list early either because no further plan exists (proven) or
    because it stopped without a plan; ``Ranked.ended`` says which, so a short list is never
    mistaken for the whole space."""
    if k > MAX_TOP_K:
        raise InputError(f"--top {k}: at most {MAX_TOP_K} plans (each is a solve of its own); "
                         "pin or cap knobs in [constraints] to look further down the list")
    out = Ranked()
    exclude: list = []
    for _ in range(k):
        try:
            res = solve(inst, solver=solver, time_limit=time_limit, explain=not out,
                        exclude=exclude)
        except InfeasibleError:
            if not out:
                raise
            out.ended = (f"only {len(out)} distinct plan" + (
                "s satisfy" if len(out) > 1 else " satisfies") + " the limits (proven)")
            break
        if res.report is None:
            if not out:
                out.append(res)
                return out
            stopped = f"the solve for plan {len(out) + 1} returned no plan ({res.status.value}"
            out.ended = (f"{stopped}); {time_limit_advice(time_limit)}"
                         if res.status == Status.NO_SOLUTION_IN_LIMIT else
                         f"{stopped}{': ' + res.note if res.note else ''})")
            break
        out.append(res)
        exclude.append((res.choice, res.knobs))
    return out

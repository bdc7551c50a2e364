"""The planning questions users ask, each answered with proven optima (docs/encoding.md, "Queries"):

* :func:`pareto`: the optimum at every allowed cluster size, and the non-dominated front of
  (GPUs, step time, days, dollars);
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
from planner.model.schema import REACHES, WHAT_IFS, ConstraintSpec, lifted
from planner.model.terms import gemm_rate
from planner.model.workload import Shape

from formulations.result import SolveResult, Status
from formulations.solve import default_objective, solve


def time_limit_advice(time_limit: float | None) -> str:
    """What to do about a solve that stopped at its time limit, in the command line's terms
    (docs/contract.md, "Exit codes": exit 4, the message says to raise ``--time-limit``)."""
    return (f"raise --time-limit (it was {time_limit:g} s)" if time_limit
            else "give it more time with --time-limit S")


def _no_plan(what: str, res: SolveResult, time_limit: float | None) -> SolverError:
    """The error of a query that needs a plan from ``res`` and got none: a solver that stopped
    proved nothing, so the query has no answer to give (exit 4), not an infeasible one."""
    why = f"{what}: the solver returned no plan ({res.status.value}" + (
        f": {res.note}" if res.note else "") + ")"
    if res.status == Status.NO_SOLUTION_IN_LIMIT:
        why += f"; {time_limit_advice(time_limit)}"
    return SolverError(why)


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
           node_options: list[int] | None = None) -> list[ParetoPoint]:
    """Proven optimum at each node count, with ``on_front`` marking the non-dominated ones.

    A size is on the front unless another size is at least as fast *and* at least as cheap,
    and strictly better in one of the two. Fast is training days (with a token budget), else
    time per sequence; cheap is dollars (with a price), else GPU-seconds per sequence, which
    orders sizes as dollars would at any price. The GPU count is the size being chosen, not
    a criterion of its own: its price is in the cost, so a larger size that trains both faster
    and cheaper (a smaller one that needs far more memory-saving recompute, or a worse batch
    split) dominates the smaller one. For a fixed batch, days, step time and time per sequence
    order the sizes alike.
    """
    options = list(node_options or inst.node_options)
    if len(options) > MAX_PARETO_SIZES:
        from planner.model.errors import InputError

        raise InputError(f"{inst.source}: cluster.nodes: the range holds {len(options):,} sizes, "
                         f"each a separate proof; pareto takes at most {MAX_PARETO_SIZES}: give "
                         "node_counts = [...] with the sizes of interest, or a narrower range")
    points = []
    for n in options:
        sized = inst.with_nodes(n)
        try:
            res = solve(sized, solver=solver, time_limit=time_limit, explain="brief")
            if res.report:
                points.append(ParetoPoint(n, res, res.note))
            else:
                points.append(ParetoPoint(n, None, _stop_reason(res), status=res.status.value))
        except InfeasibleError as exc:
            points.append(ParetoPoint(n, None, exc.args[0], list(exc.explanation)))
    feasible = [p for p in points if p.result is not None]
    for p in feasible:
        p.on_front = not any(_dominates(front_key(q), front_key(p))
                             for q in feasible if q is not p)
    return points


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


@dataclass
class CapacityAnswer:
    deadline_days: float
    nodes: int | None
    result: SolveResult | None
    checked: list[dict[str, Any]] = field(default_factory=list)   # every size looked at
    next_smaller: dict[str, Any] | None = None
    cheapest: dict[str, Any] | None = None
    wall_s: float = 0.0

    @property
    def unproven(self) -> list[int]:
        """The sizes checked whose solver stopped at the time limit (with a plan not proven
        optimal, or none): any of them might meet the deadline, so without an answer the range
        is not shown to miss it, and with one (they are all smaller) it is not shown minimal.
        The answer's own size is not among them: its plan meets the deadline, proven the
        fastest there or not."""
        return [c["nodes"] for c in self.checked if c["nodes"] != self.nodes
                and c.get("status") in (Status.FEASIBLE.value, Status.NO_SOLUTION_IN_LIMIT.value)]

    def to_dict(self) -> dict[str, Any]:
        out = self.result.to_dict() if self.result else {"plan": None}
        out["nodes"] = self.nodes
        out["deadline_days"] = self.deadline_days
        out["meets_deadline"] = self.result is not None
        out["next_smaller"] = self.next_smaller
        out["checked"] = self.checked
        out["cheapest"] = self.cheapest
        out["unproven"] = self.unproven
        out["wall_s"] = self.wall_s
        return out


def days_lower_bound(inst: Instance, nodes: int) -> float:
    """Days no plan on ``nodes`` nodes can beat: the GEMM FLOPs of the whole token budget (the
    model FLOPs less the attention core's) at the GPUs' fastest calibrated GEMM rate. The
    attention core is left out: the step model runs it on its own figures (fused: the causal
    half at ``attention_efficiency`` of the peak, 0.87 on Blackwell against a GEMM asymptote
    of 0.52), so counting it at the GEMM rate overstated the bound at long sequences, and
    capacity skipped sizes that met the deadline (an audit found 1 B200 node at 0.61 days
    where the bound said at least 0.67)."""
    sh = Shape.of(inst.model)
    hw = inst.hw
    rate = max(hw.peak * hw.efficiency, gemm_rate(inst))
    sequences = inst.spec.training.tokens / sh.s
    gemm_flops = sh.model_flops(sequences) - 3 * sequences * sh.L * sh.attention_flops(1)
    return gemm_flops / (nodes * hw.gpus_per_host * rate) / 86400


def capacity(inst: Instance, deadline_days: float, solver: str = "cpsat",
             time_limit: float | None = None, budget_usd: float | None = None) -> CapacityAnswer:
    """The fewest nodes in the instance's range whose optimal plan trains the token budget
    within ``deadline_days``, and that plan.

    Sizes whose compute lower bound already misses the deadline are skipped (provably too
    small); the rest are solved in increasing order until one meets the deadline, so the answer
    is minimal. With ``budget_usd`` (and a price) it also reports the cheapest plan meeting the
    deadline among the sizes from the answer up to the end of the range, and whether it fits
    the budget.
    """
    if not inst.spec.training.tokens:
        raise InputError(f"{inst.source}: capacity needs training.tokens (the token budget)")
    if budget_usd is not None and inst.spec.cluster.price_per_gpu_hour is None:
        raise InputError(f"{inst.source}: a budget (--budget-usd, budget_usd) needs "
                         "cluster.price_per_gpu_hour (dollars per GPU-hour) to cost the plans")
    t0 = time.perf_counter()
    options = sorted(inst.node_options)
    ans = CapacityAnswer(deadline_days, None, None)
    last_miss: dict[str, Any] | None = None
    for n in options:
        lb = days_lower_bound(inst, n)
        if lb > deadline_days:
            last_miss = {"nodes": n, "days_lower_bound": lb, "proof": "compute lower bound"}
            continue
        try:
            res = solve(inst.with_nodes(n), solver=solver, time_limit=time_limit,
                        explain=False)
        except InfeasibleError as exc:
            ans.checked.append({"nodes": n, "feasible": False, "reason": str(exc)})
            last_miss = {"nodes": n, "feasible": False, "proof": exc.args[0]}
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
                     "proof": "proven optimum" if res.status.value == "optimal" else
                     "not proven (time limit)"}
    if ans.nodes is None:
        ans.next_smaller = last_miss          # the largest size and why it misses
    elif last_miss is not None and last_miss["nodes"] == ans.nodes - 1:
        ans.next_smaller = last_miss
    elif ans.nodes - 1 >= 1:
        n = ans.nodes - 1
        ans.next_smaller = {"nodes": n, "days_lower_bound": days_lower_bound(inst, n),
                            "proof": OUTSIDE_RANGE if n not in options
                            else "compute lower bound"}
    if budget_usd is not None and ans.result is not None:
        ans.cheapest = _cheapest(inst, ans, options, deadline_days, solver, time_limit,
                                 budget_usd)
    ans.wall_s = time.perf_counter() - t0
    return ans


def _cheapest(inst, ans, options, deadline, solver, time_limit, budget):
    """The cheapest plan meeting the deadline from the answer's size to the end of the range.

    Each larger size is asked only for a plan that meets the deadline and costs less than
    the best so far, as a cap on its objective: at a fixed size the cost is the time per
    sequence times ``tokens / seq_len * GPUs * price``, the deadline the time per sequence
    times ``tokens / seq_len``. A size that cannot beat it is a proof of infeasibility, which
    the MIP finds faster than the size's own optimum."""
    best = ans.result
    sequences = inst.spec.training.tokens / Shape.of(inst.model).s
    price = inst.spec.cluster.price_per_gpu_hour
    larger = [x for x in options if x > ans.nodes]
    for n in larger:
        sized = inst.with_nodes(n)
        kind = default_objective(sized)
        per_sample = min(deadline * 86400, best.report.cost * 3600 / (sized.gpus * price)) \
            / sequences
        unit = 1 if kind == "time_per_sample" else sized.spec.training.global_batch
        try:
            res = solve(sized, solver=solver, time_limit=time_limit, explain=False,
                        max_objective=per_sample * unit * (1 + 1e-9))
        except InfeasibleError:
            continue
        rep = res.report
        if rep and rep.total_days <= deadline and (rep.cost or 0) < (best.report.cost or 0):
            best = res
    cost = best.report.cost
    return {"nodes": best.report.plan.nodes, "cost": cost, "within_budget":
            cost is not None and cost <= budget, "budget_usd": budget,
            "plan": best.report.plan.to_dict(), "total_days": best.report.total_days,
            "sizes_checked": len(larger)}


# ------------------------------------------------------------------------------------------
# What-if: constrained vs unconstrained
# ------------------------------------------------------------------------------------------


@dataclass
class Comparison:
    constrained: SolveResult | None
    unconstrained: SolveResult
    slowdown: float | None            # constrained / unconstrained - 1
    binding: list[dict[str, Any]]

    def to_dict(self) -> dict[str, Any]:
        return {"constrained": self.constrained.to_dict() if self.constrained else None,
                "unconstrained": self.unconstrained.to_dict(), "slowdown": self.slowdown,
                "binding": self.binding}


#: the ``[constraints]`` keys that restrict the space, the what-ifs, in the file's order:
#: every key but the ones :data:`~planner.model.schema.WHAT_IFS` keeps (the framework, its
#: overlaps, the reserves)
WHATIF_KEYS = tuple(k for k in ConstraintSpec.model_fields if WHAT_IFS[k] != "kept")


def unconstrained_spec(c: ConstraintSpec) -> ConstraintSpec:
    """The instance's constraints with every what-if lifted, each to the value
    :func:`~planner.model.schema.lifted` gives by its kind: a pin or a filter is lifted, a cap
    or a floor keeps whichever of the instance's value and the default lets more plans in, a
    placement rule the instance sets is lifted; the framework, its overlaps and the memory
    reserves are kept."""
    return c.model_copy(update={k: lifted(c, k) for k in WHATIF_KEYS})


def compare(inst: Instance, solver: str = "cpsat", time_limit: float | None = None) -> Comparison:
    """The instance's constrained optimum next to the optimum without its what-if constraints
    (:func:`unconstrained_spec`: caps the instance raises stay raised, so the baseline's space
    holds the constrained one; only a ``recompute_layers`` pin on a count that is not a share
    the search tries, a quarter, half or three quarters of a virtual stage, lies outside it, and
    the constrained plan may then be the faster), and each constraint that binds on its own
    (lifting it alone speeds the optimum up).

    Every solve must return a plan (a stop at the time limit raises :class:`SolverError`): a
    missing optimum leaves nothing to compare, and a missing lifted one leaves open whether
    that constraint binds."""
    c = inst.spec.constraints
    lifted_all = unconstrained_spec(c)
    free = inst.with_spec(constraints=lifted_all)
    base = solve(free, solver=solver, time_limit=time_limit)
    if base.report is None:
        raise _no_plan("--compare, the optimum without the [constraints] what-ifs", base,
                       time_limit)
    try:
        con = solve(inst, solver=solver, time_limit=time_limit)
    except InfeasibleError:
        con = None
    if con is not None and con.report is None:
        raise _no_plan("--compare, the optimum under the [constraints]", con, time_limit)
    slow = (con.report.step_time_s / base.report.step_time_s - 1) if con and con.report else None
    binding = []
    # (a reach key only follows its pin: lifted with it, never alone)
    set_keys = [k for k in WHATIF_KEYS
                if getattr(c, k) != getattr(lifted_all, k) and k not in REACHES]
    for key in set_keys:
        update = {key: getattr(lifted_all, key)} | {
            reach: getattr(lifted_all, reach) for reach, pin in REACHES.items() if pin == key}
        without = inst.with_spec(constraints=c.model_copy(update=update))
        try:
            alt = solve(without, solver=solver, time_limit=time_limit, explain=False)
        except InfeasibleError:
            continue
        if alt.report is None:
            raise _no_plan(f"--compare, the optimum with constraints.{key} lifted", alt,
                           time_limit)
        if con is None or alt.report.step_time_s < con.report.step_time_s * (1 - 1e-9):
            t_con = con.report.step_time_s if con else None
            binding.append({"constraint": key, "value": getattr(c, key),
                            "lifted_to": getattr(lifted_all, key),
                            "step_time_without_s": alt.report.step_time_s,
                            # > 0: the optimum is that much faster without it
                            "speedup_if_lifted": (t_con / alt.report.step_time_s - 1)
                            if con else None,
                            # < 0: the step time falls by that share without it
                            "step_time_change_if_lifted": (alt.report.step_time_s / t_con - 1)
                            if con else None})
    return Comparison(con, base, slow, binding)


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

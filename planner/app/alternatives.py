"""How the model orders plans that were all measured on one cluster (``plan validate``).

A published run (planner/data/published_runs.toml) is one expert plan, so it can only say
how far that plan lies from the model's optimum. A set of measured alternatives
(planner/data/measured_alternatives.toml) is one model timed under many plans on the same
machines on the same day, with the plans that ran out of memory: it says whether the model
puts the plans in the order the hardware did, which is what a proven optimum is worth. Nothing
here is fitted; the sets are judged as they are.

Per set this reports:

- ``kendall_tau``: Kendall's tau-a between the predicted and measured seconds per sequence of
  the timed plans (+1: the same order, 0: no better than chance, -1: reversed); a step time
  per sequence, since the plans of a set may differ a little in global batch;
- ``pick_regret``: how much slower, measured, the plan the model ranks first among the timed
  ones ran than the best measured one (0: the model picks the fastest);
- ``measured_best_rank``: where the model ranks the measured fastest plan (1: first);
- ``oom_predicted``: of the plans that ran out of memory, how many the model says do not fit;
  ``fit_predicted``: of the timed plans, how many the model says fit;
- ``memory``: per timed plan with a measured peak, the model's peak beside it (nvidia-smi's
  peak holds the CUDA context and the allocator's cache, so it is expected above the model);
- ``optimum`` (with the ranking): the model's own optimum over the set's cluster and knob
  space, and whether that plan is one that ran out of memory.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from planner.model.errors import InfeasibleError, InputError
from planner.model.evaluate import evaluate
from planner.model.instance import Instance, read_toml
from planner.model.plan import plan_from_spec

#: GB (10^9 bytes, as nvidia-smi's sources print them) in GiB
GB_IN_GIB = 1e9 / 2**30
#: the keys every plan of a set shares (the rest come from the set)
PLAN_OWN = ("tp", "pp", "dp", "cp", "ep", "micro_batch", "global_batch")
#: a measured plan's outcome: a step time, or out of memory
OUTCOMES = ("oom",)


def default_path() -> Path:
    return Path(str(resources.files("planner").joinpath("data/measured_alternatives.toml")))


def load_sets(path: str | Path | None = None) -> list[dict[str, Any]]:
    """The sets of a measured-alternatives file, each plan checked as a run is."""
    p = Path(path) if path else default_path()
    data = read_toml(p, "measured alternatives file")
    sets = data.get("sets")
    if not isinstance(sets, list) or not sets:
        raise InputError(f"{p}: expected [[sets]] entries")
    problems = []
    for s in sets:
        sid = s.get("id", "?")
        for key in ("id", "model", "gpu", "precision", "plans"):
            if key not in s:
                problems.append(f"set {sid}: missing {key}")
        for i, pl in enumerate(s.get("plans", [])):
            timed = "measured_step_time_s" in pl
            if timed == (pl.get("outcome") in OUTCOMES):
                problems.append(f"set {sid}, plans[{i}]: give measured_step_time_s or outcome "
                                f"= \"oom\", one of them")
            elif "outcome" in pl and pl["outcome"] not in OUTCOMES:
                problems.append(f"set {sid}, plans[{i}]: outcome = {pl['outcome']!r}: "
                                "expected \"oom\"")
    if problems:
        raise InputError(f"{p}: invalid measured alternatives file", problems)
    return sets


def _run(s: dict[str, Any], pl: dict[str, Any]) -> dict[str, Any]:
    """One plan of a set as a published run (planner/app/validate.py reads it)."""
    own = {k: pl[k] for k in PLAN_OWN if k in pl}
    label = "-".join(f"{k}{own[k]}" for k in ("tp", "pp", "dp", "micro_batch") if k in own)
    run = {"id": f"{s['id']}:{label}", "model": s["id"], "gpu": s["gpu"],
           "precision": s["precision"], "plan": {**s.get("plan", {}), **own},
           "training": dict(s.get("training", {})),
           # (an out-of-memory plan has no time; the run format needs one, never read)
           "measured_step_time_s": pl.get("measured_step_time_s", 1.0)}
    if "framework" in s:
        run["framework"] = s["framework"]
    return run


def _instance(s: dict[str, Any], pl: dict[str, Any]) -> Instance:
    from planner.app.validate import run_instance

    return run_instance({"models": {s["id"]: s["model"]}}, _run(s, pl), s.get("cluster"))


@dataclass
class PlanResult:
    label: str
    global_batch: int
    measured_s: float | None            # None: out of memory
    predicted_s: float
    memory_gib: float                   # the model's peak (its fullest stage)
    fits: bool
    headroom_gib: float                 # the model's limit less its peak (< 0: over)
    measured_memory_gib: float | None = None

    @property
    def oom(self) -> bool:
        return self.measured_s is None


@dataclass
class SetResult:
    id: str
    source: str
    plans: list[PlanResult]
    kendall_tau: float | None
    pick_regret: float | None
    measured_best_rank: int | None
    oom_predicted: int
    oom_plans: int
    fit_predicted: int
    timed_plans: int
    optimum: dict[str, Any] | None = field(default=None)

    def as_json(self) -> dict[str, Any]:
        return {"id": self.id, "source": self.source, "kendall_tau": self.kendall_tau,
                "pick_regret": self.pick_regret,
                "measured_best_rank": self.measured_best_rank,
                "oom_predicted": self.oom_predicted, "oom_plans": self.oom_plans,
                "fit_predicted": self.fit_predicted, "timed_plans": self.timed_plans,
                "optimum": self.optimum,
                "plans": [{"plan": r.label, "global_batch": r.global_batch,
                           "measured_s": r.measured_s, "predicted_s": r.predicted_s,
                           "memory_gib": r.memory_gib, "fits": r.fits,
                           "memory_headroom_gib": r.headroom_gib,
                           "measured_memory_gib": r.measured_memory_gib,
                           "outcome": "oom" if r.oom else "ran"} for r in self.plans]}


def kendall_tau(xs: list[float], ys: list[float]) -> float | None:
    """Kendall's tau-a of two paired lists: (concordant - discordant pairs) / all pairs, a tie
    in either list counting as neither; None for fewer than two pairs' worth of items."""
    n = len(xs)
    if n < 2 or len(ys) != n:
        return None
    score = 0
    for i in range(n):
        for j in range(i + 1, n):
            a, b = xs[i] - xs[j], ys[i] - ys[j]
            score += (a * b > 0) - (a * b < 0)
    return score / (n * (n - 1) / 2)


def order_figures(predicted: list[float], measured: list[float]
                  ) -> tuple[float | None, float | None, int | None]:
    """(Kendall's tau, the pick's regret, the measured best's predicted rank) of paired
    predicted and measured times (lower is better)."""
    if not measured:
        return None, None, None
    tau = kendall_tau(predicted, measured)
    pick = min(range(len(predicted)), key=lambda i: predicted[i])
    best = min(range(len(measured)), key=lambda i: measured[i])
    regret = measured[pick] / measured[best] - 1
    rank = 1 + sum(1 for p in predicted if p < predicted[best])
    return tau, regret, rank


def evaluate_set(s: dict[str, Any], optimum: bool = True) -> SetResult:
    """How the model orders one set's plans (and, with ``optimum``, what it would pick)."""
    rows = []
    for pl in s["plans"]:
        inst = _instance(s, pl)
        plan = plan_from_spec(inst, inst.spec.plan)
        rep = evaluate(inst, plan, spec=inst.spec.plan)
        gb = plan.global_batch
        timed = pl.get("measured_step_time_s")
        mem = pl.get("memory_GB")
        rows.append(PlanResult(
            plan.label(), gb, None if timed is None else timed / gb, rep.step_time_s / gb,
            rep.memory_gib["total"], rep.fits, rep.memory_gib["headroom"],
            None if mem is None else mem * GB_IN_GIB))
    timed = [r for r in rows if not r.oom]
    tau, regret, rank = order_figures([r.predicted_s for r in timed],
                                      [r.measured_s for r in timed])
    res = SetResult(s["id"], s.get("source", ""), rows, tau, regret, rank,
                    sum(1 for r in rows if r.oom and not r.fits), sum(r.oom for r in rows),
                    sum(1 for r in timed if r.fits), len(timed))
    if optimum:
        res.optimum = _optimum(s, rows)
    return res


def _optimum(s: dict[str, Any], rows: list[PlanResult]) -> dict[str, Any]:
    """The model's optimum over the set's cluster, at the largest global batch of its timed
    plans, in the knob space its plans share (validate.run_pins): its plan, seconds per
    sequence, and whether that plan ran out of memory in the set."""
    from formulations.solve import solve
    from planner.app.validate import run_pins

    timed = [pl for pl in s["plans"] if "measured_step_time_s" in pl]
    lead = max(timed, key=lambda pl: pl["global_batch"])
    inst = _instance(s, lead)
    pins = run_pins(plan_from_spec(inst, inst.spec.plan))
    free = inst.with_spec(plan=None,
                          constraints=inst.spec.constraints.model_copy(update=pins))
    try:
        res = solve(free, explain="brief")
    except InfeasibleError as exc:
        return {"plan": None, "note": str(exc)}
    if res.report is None:
        return {"plan": None, "note": res.note}
    label = res.report.plan.label()
    return {"plan": label, "predicted_s": res.report.step_time_s / res.report.plan.global_batch,
            "status": res.status.value,
            "ran_out_of_memory": any(r.oom and r.label == label for r in rows)}


def evaluate_sets(sets: list[dict[str, Any]], optimum: bool = True) -> list[SetResult]:
    return [evaluate_set(s, optimum) for s in sets]

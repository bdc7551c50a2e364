"""How the model orders plans that were all measured on one cluster (``plan validate``).

A published run (planner/data/published_runs.toml) is one expert plan, so it can only say
how far that plan lies from the model's optimum. A set of measured alternatives
(planner/data/measured_alternatives.toml) is one model (or a few shapes of it) timed under
many plans on the same machines on the same day, with the plans that ran out of memory: it
says whether the model puts the plans in the order the hardware did, which is what a proven
optimum is worth. A plan may also run under another framework or change knobs the set's plans
otherwise share (a paper setting its scheme against a baseline on one cluster: the data
file's Narayanan et al. sets, Megatron-LM's 3D parallelism against DeepSpeed's ZeRO-3). The
times are never fitted; one figure rests on the sets' memory: DeepSpeed's default reserve
(frameworks.py ``measured_peak_ratio``, the lowest of their nvidia-smi readings over the
model's peak, checked day against day in tests/test_alternatives.py).

Per set this reports:

- ``kendall_tau``: Kendall's tau-a between the predicted and measured seconds per sequence of
  the timed plans (+1: the same order, 0: no better than chance, -1: reversed); a step time
  per sequence, since the plans of a set may differ a little in global batch;
- ``pick_regret``: how much slower, measured, the plan the model ranks first among the timed
  ones ran than the best measured one (0: the model picks the fastest);
- ``measured_best_rank``: where the model ranks the measured fastest plan (1: first);
- ``oom_predicted``: of the plans that ran out of memory, how many the model says do not fit;
  ``fit_predicted``: of the timed plans, how many the model says fit;
- ``plans``: per plan, its measured and predicted seconds per sequence, the model's peak
  memory, headroom and fit, and the memory nvidia-smi showed where the source gives it (a
  snapshot holding the CUDA context and the allocator's cache: expected above the model);
- ``optimum`` (with the ranking): the model's own optimum over the set's cluster and knob
  space, and whether that plan is one that ran out of memory.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from planner.model.errors import InputError
from planner.model.evaluate import evaluate
from planner.model.instance import Instance, read_toml
from planner.model.plan import plan_from_spec, structural_violations
from planner.model.words import toml_value

#: each plan's own keys (the rest of its [plan] comes from the set's ``plan``), the required
#: first
PLAN_OWN = ("tp", "pp", "dp", "micro_batch", "global_batch", "cp", "ep")
#: what a plan may say beside them: its own shape (``model``), framework and knobs (``knobs``:
#: the set's ``plan`` keys this plan changes), and what it measured
PLAN_EXTRA = ("model", "framework", "knobs", "measured_step_time_s", "memory_GiB", "outcome")
#: a set's keys, the required first
SET_KEYS = ("id", "model", "gpu", "precision", "plans", "source", "framework", "cluster", "plan",
            "training")
#: a measured plan's outcome: a step time, or out of memory
OUTCOMES = ("oom",)


def default_path() -> Path:
    return Path(str(resources.files("planner").joinpath("data/measured_alternatives.toml")))


def _positive(x: Any, whole: bool = False) -> bool:
    return (isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0
            and (not whole or isinstance(x, int)))


def _framework_problems(where: str, table: dict[str, Any]) -> list[str]:
    """A set's or a plan's ``framework`` that names no framework, in the file's words."""
    from planner.app.runs_file import RUN_FRAMEWORK_NAMES

    if "framework" not in table or table["framework"] in RUN_FRAMEWORK_NAMES:
        return []
    return [f"{where}.framework = {toml_value(table['framework'])}: expected one of "
            f"{', '.join(RUN_FRAMEWORK_NAMES)}"]


def _plan_problems(where: str, pl: Any) -> list[str]:
    """What is wrong with one plan of a set, in the file's words."""
    if not isinstance(pl, dict):
        return [f"{where}: expected a table {{ tp = ..., pp = ..., ... }}"]
    out = [f"{where}.{k}: unknown key; expected one of {', '.join(PLAN_OWN + PLAN_EXTRA)}"
           for k in pl if k not in PLAN_OWN + PLAN_EXTRA]
    out += [f"{where}: missing {k}" for k in PLAN_OWN[:5] if k not in pl]
    out += [f"{where}.{k} = {toml_value(pl[k])}: expected a positive whole number" for k in PLAN_OWN
            if k in pl and not _positive(pl[k], whole=True)]
    out += [f"{where}.{k} = {toml_value(pl[k])}: expected a positive number" for k in
            ("measured_step_time_s", "memory_GiB") if k in pl and not _positive(pl[k])]
    if "model" in pl and not isinstance(pl["model"], dict):
        out.append(f"{where}.model: expected a table of the set's model keys it changes")
    if "knobs" in pl and not isinstance(pl["knobs"], dict):
        out.append(f"{where}.knobs: expected a table of the set's plan keys it changes")
    elif "knobs" in pl and set(pl["knobs"]) & set(PLAN_OWN):
        out.append(f"{where}.knobs: {', '.join(sorted(set(pl['knobs']) & set(PLAN_OWN)))} "
                   "belong in the plan itself")
    out += _framework_problems(where, pl)
    if ("measured_step_time_s" in pl) == ("outcome" in pl):
        out.append(f"{where}: give measured_step_time_s or outcome = \"oom\", one of them")
    elif "outcome" in pl and pl["outcome"] not in OUTCOMES:
        out.append(f"{where}.outcome = {toml_value(pl['outcome'])}: expected \"oom\"")
    return out


def _set_problems(s: Any, n: int) -> list[str]:
    """What is wrong with one set, in the file's words (its plans' degrees, shapes and rules
    are checked when it is evaluated, as a published run's are)."""
    if not isinstance(s, dict):
        return [f"sets[{n}]: expected a [[sets]] table"]
    sid = s.get("id", f"sets[{n}]")
    out = [f"set {sid}.{k}: unknown key; expected one of {', '.join(SET_KEYS)}"
           for k in s if k not in SET_KEYS]
    out += [f"set {sid}: missing {k}" for k in SET_KEYS[:5] if k not in s]
    out += [f"set {sid}.{k}: expected a table" for k in ("model", "cluster", "plan", "training")
            if k in s and not isinstance(s[k], dict)]
    out += _framework_problems(f"set {sid}", s)
    plans = s.get("plans")
    if "plans" in s and (not isinstance(plans, list) or not plans):
        return out + [f"set {sid}.plans: expected a non-empty list of plans"]
    for i, pl in enumerate(plans or []):
        out += _plan_problems(f"set {sid}, plans[{i}]", pl)
    if out:
        return out
    gpus = {pl["tp"] * pl["pp"] * pl["dp"] * pl.get("cp", 1) for pl in plans}
    if len(gpus) > 1:
        out.append(f"set {sid}: its plans run on {sorted(gpus)} GPUs; a set is one cluster "
                   "(tp * pp * dp * cp the same in every plan)")
    timed = [pl for pl in plans if "measured_step_time_s" in pl]
    if len(timed) < 2 or not any("model" not in pl for pl in timed):
        out.append(f"set {sid}: needs two timed plans or more, one of them of the set's own "
                   "model (no plan.model)")
    return out


def load_sets(path: str | Path | None = None) -> list[dict[str, Any]]:
    """The sets of a measured-alternatives file, every key checked (each problem named by
    set, plan and key)."""
    p = Path(path) if path else default_path()
    data = read_toml(p, "measured alternatives file")
    sets = data.get("sets")
    if not isinstance(sets, list) or not sets:
        raise InputError(f"{p}: expected [[sets]] entries")
    problems = [x for n, s in enumerate(sets) for x in _set_problems(s, n)]
    ids = [s.get("id") for s in sets if isinstance(s, dict)]
    problems += [f"set {i}: the id is given twice" for i in sorted({i for i in ids
                                                                  if ids.count(i) > 1}, key=str)]
    if problems:
        raise InputError(f"{p}: invalid measured alternatives file", problems)
    return sets


def model_of(s: dict[str, Any], pl: dict[str, Any]) -> dict[str, Any]:
    """The model a plan of a set ran: the set's, with the keys the plan's own ``model``
    changes (a search over shapes as well as plans, on the same machines that day)."""
    return {**s["model"], **pl.get("model", {})}


def shape_label(pl: dict[str, Any]) -> str:
    """What a plan's own ``model`` changes, in words (empty for the set's model)."""
    return " ".join(f"{k}={v}" for k, v in pl.get("model", {}).items())


def setting_label(s: dict[str, Any], pl: dict[str, Any]) -> str:
    """What a plan runs otherwise than the set's plans, in words: its framework where it is
    not the set's, and the knobs it changes (empty for neither)."""
    fw = pl.get("framework")
    return " ".join([*([fw] if fw is not None and fw != s.get("framework") else []),
                     *(f"{k}={v if isinstance(v, str) else toml_value(v)}"
                       for k, v in pl.get("knobs", {}).items())])


def _run(s: dict[str, Any], pl: dict[str, Any]) -> dict[str, Any]:
    """One plan of a set as a published run (planner/app/runs_file.py reads it)."""
    own = {k: pl[k] for k in PLAN_OWN if k in pl}
    label = "-".join(f"{k}{own[k]}" for k in ("tp", "pp", "dp", "micro_batch") if k in own)
    run = {"id": f"{s['id']}:{label}", "model": "model", "gpu": s["gpu"],
           "precision": s["precision"],
           "plan": {**s.get("plan", {}), **pl.get("knobs", {}), **own},
           "training": dict(s.get("training", {})),
           # (an out-of-memory plan has no time; the run format needs one, never read)
           "measured_step_time_s": pl.get("measured_step_time_s", 1.0)}
    if "framework" in pl or "framework" in s:
        run["framework"] = pl.get("framework", s.get("framework"))
    return run


def _set_words(problem: str, pl: dict[str, Any]) -> str:
    """A problem the run reader named, in the set file's words: ``model.<key>`` for the runs
    file's ``models.model.<key>``, ``knobs.<key>`` for a ``plan.<key>`` the plan's own
    ``knobs`` gave."""
    problem = problem.replace("models.model.", "model.")
    for k in pl.get("knobs", {}):           # (load_sets checked it is a table)
        if problem.startswith(f"plan.{k}:") or problem.startswith(f"plan.{k} "):
            return "knobs." + problem.removeprefix("plan.")
    return problem


def _instance(s: dict[str, Any], pl: dict[str, Any]) -> Instance:
    from planner.app.runs_file import run_instance

    return run_instance({"models": {"model": model_of(s, pl)}}, _run(s, pl), s.get("cluster"))


@dataclass
class PlanResult:
    label: str
    global_batch: int
    measured_s: float | None            # None: out of memory
    predicted_s: float
    memory_gib: float                   # the model's peak (its fullest stage)
    fits: bool                          # in memory (the plan keeps the structural rules)
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
    in either list counting as neither; None for fewer than two items (no pair)."""
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
    predicted and measured times (lower is better); a plan the model predicts as fast as the
    measured best is not counted ahead of it."""
    if not measured:
        return None, None, None
    tau = kendall_tau(predicted, measured)
    pick = min(range(len(predicted)), key=lambda i: predicted[i])
    best = min(range(len(measured)), key=lambda i: measured[i])
    regret = measured[pick] / measured[best] - 1
    rank = 1 + sum(1 for p in predicted if p < predicted[best])
    return tau, regret, rank


def evaluate_set(s: dict[str, Any], optimum: bool = True, solver: str = "cpsat") -> SetResult:
    """How the model orders one set's plans (and, with ``optimum``, what it would pick, solved
    by ``solver``)."""
    rows = []
    for i, pl in enumerate(s["plans"]):
        try:
            inst = _instance(s, pl)
            plan = plan_from_spec(inst, inst.spec.plan)
        except InputError as exc:           # (in the set's words, not a run's)
            # (the set's model is the runs file's models.model table to run_instance, and a
            # key the plan's own knobs gave is its knobs.<key>, not the set's plan.<key>)
            raise InputError(f"set {s['id']}, plans[{i}]: not a plan the model can cost",
                             [_set_words(p, pl) for p in exc.problems or [str(exc)]]) from None
        broken = structural_violations(inst, plan, inst.spec.plan)
        if broken:
            raise InputError(f"set {s['id']}, plans[{i}]: not a plan the model can cost",
                             broken)
        rep = evaluate(inst, plan, spec=inst.spec.plan)
        gb = plan.global_batch
        timed = pl.get("measured_step_time_s")
        rows.append(PlanResult(
            " ".join(x for x in (shape_label(pl), setting_label(s, pl), plan.label()) if x), gb,
            None if timed is None else timed / gb, rep.step_time_s / gb,
            rep.memory_gib["total"], rep.memory_gib["headroom"] >= 0,
            rep.memory_gib["headroom"], pl.get("memory_GiB")))
    timed = [r for r in rows if not r.oom]
    tau, regret, rank = order_figures([r.predicted_s for r in timed],
                                      [r.measured_s for r in timed])
    res = SetResult(s["id"], s.get("source", ""), rows, tau, regret, rank,
                    sum(1 for r in rows if r.oom and not r.fits), sum(r.oom for r in rows),
                    sum(1 for r in timed if r.fits), len(timed))
    if optimum:
        res.optimum = _optimum(s, rows, solver)
    return res


def _optimum(s: dict[str, Any], rows: list[PlanResult], solver: str = "cpsat") -> dict[str, Any]:
    """The model's optimum over the set's cluster for the set's own model (not a plan's
    changed shape), at the largest global batch of its timed plans, in the knob space its
    plans share (ranking.run_pins): its plan, seconds per sequence, and whether that plan
    ran out of memory in the set."""
    from planner.app.ranking import run_pins, solve_pinned

    timed = [pl for pl in s["plans"] if "measured_step_time_s" in pl and "model" not in pl]
    if not timed:
        return {"plan": None, "note": "no timed plan of the set's own model"}
    lead = max(timed, key=lambda pl: pl["global_batch"])
    inst = _instance(s, lead)
    res, why = solve_pinned(inst.with_spec(plan=None),
                            run_pins(plan_from_spec(inst, inst.spec.plan)), solver)
    if res is None:
        return {"plan": None, "note": why}
    if res.report is None:
        return {"plan": None, "note": res.note}
    label, gb = res.report.plan.label(), res.report.plan.global_batch
    return {"plan": label, "global_batch": gb, "predicted_s": res.report.step_time_s / gb,
            "status": res.status.value,
            "ran_out_of_memory": any(r.oom and (r.label, r.global_batch) == (label, gb)
                                     for r in rows)}


def evaluate_sets(sets: list[dict[str, Any]], optimum: bool = True,
                  solver: str = "cpsat") -> list[SetResult]:
    return [evaluate_set(s, optimum, solver) for s in sets]

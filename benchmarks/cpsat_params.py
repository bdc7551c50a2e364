#!/usr/bin/env python
"""CP-SAT parameters measured on the very models ``plan solve`` builds (formulations/cpsat.py,
``_run``, where the choice of presolve probing is recorded).

For each instance: ``formulations.solve.solve`` is run once with CP-SAT while every model it
hands to CP-SAT (each goal of each part, with its caps and hint) is copied; then each copy is
re-solved with every variant, the variants interleaved, ``--repeat`` times, and the medians are
printed per model and summed (the TOTAL line: wall seconds, then the process's CPU seconds
over every CP-SAT thread). A line says MISMATCH when the variants end in different statuses
or objectives. ``shipped`` is each model's own search (workers and subsolvers as
formulations/cpsat.py chose them, probing off), ``portfolio4`` the four-worker default
portfolio with probing off (the rule before ``search_workers``), ``probe4`` the same with
probing on; ``--variant
NAME=param:value;param:value`` adds one (CP-SAT ``SatParameters`` fields; a comma list, or
any ``subsolvers`` value, fills a repeated field); a variant that sets ``num_workers``
replaces the model's own workers and subsolvers. ``--goals objective`` re-solves only the
models of those goals (``objective!``: the objective solves no incumbent caps, the first
part's and any part's solved before it has one; ``objective^``: the capped ones, the parts and
batch models asked only whether they beat the incumbent); ``--only`` runs ``shipped`` and the given
variants, not the other two.

Example::

    python benchmarks/cpsat_params.py instances/gpt3-175b-a100.toml --repeat 3
    python benchmarks/cpsat_params.py instances/gpt-1.3b-1node.toml --goals 'objective!' --only \
        --variant "nolp=num_workers:1;subsolvers:no_lp;cp_model_probing_level:0"
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

from formulations import cpsat
from formulations import solve as fsolve
from planner.model.instance import load_instance


def record(path: str) -> list[dict]:
    """The models CP-SAT solves for one instance, in order, with their goal and workers. The
    solve runs in one thread (``PARTS_BESIDE_TIES`` off): the same models, each labelled with
    its own goal (two threads would interleave the labels)."""
    seen: list[dict] = []
    goal = {}
    minimize, run = cpsat._Session.minimize, cpsat._run
    beside = fsolve.PARTS_BESIDE_TIES
    fsolve.PARTS_BESIDE_TIES = False

    def spy_minimize(self, name, time_limit, hint):
        goal["name"], goal["capped"] = name, self.capped
        return minimize(self, name, time_limit, hint)

    def spy_run(model, time_limit, workers, *args, **kwargs):
        out = run(model, time_limit, workers, *args, **kwargs)
        seen.append({"model": copy.deepcopy(model), "goal": goal["name"], "workers": workers,
                     "capped": goal["capped"],
                     "status": out[3], "presolve": kwargs.get("presolve", True),
                     "subsolvers": list(kwargs.get("subsolvers", ())),
                     "full": kwargs.get("full", False)})
        return out
    cpsat._Session.minimize, cpsat._run = spy_minimize, spy_run
    try:
        fsolve.solve(load_instance(path), "cpsat")
    finally:
        cpsat._Session.minimize, cpsat._run = minimize, run
        fsolve.PARTS_BESIDE_TIES = beside
    return seen


def solve_with(model, workers: int, extra: dict, presolve: bool = True
               ) -> tuple[float, float, str, float]:
    """Wall seconds, CPU seconds (every thread of the process), status and objective."""
    from ortools.sat.python import cp_model_helper as cmh

    params = cmh.SatParameters()
    params.num_workers = workers
    params.presolve_inclusion_work_limit = 0          # as formulations/cpsat.py (issue #5293)
    if not presolve:
        params.cp_model_presolve = False
    for key, value in extra.items():
        if isinstance(value, list):                   # a repeated field (subsolvers)
            getattr(params, key).extend(value)
        else:
            setattr(params, key, value)
    wrapper = cmh.SolveWrapper()
    wrapper.set_parameters(params)
    t, c = time.perf_counter(), time.process_time()
    response = wrapper.solve(model)
    return (time.perf_counter() - t, time.process_time() - c, response.status.name,
            response.objective_value)


def run_recorded(m: dict, extra: dict) -> tuple[float, float, tuple]:
    """One recorded model (:func:`record`) under a variant: its own search (workers,
    subsolvers, full-problem flag) unless the variant sets ``num_workers``."""
    own = {} if "num_workers" in extra else (
        {"subsolvers": m["subsolvers"]} if m["subsolvers"] else {})
    if m["full"] and "num_workers" not in extra:        # (the first objective)
        own["num_full_subsolvers"] = len(m["subsolvers"])
    t, c, status, obj = solve_with(m["model"], m["workers"], {**own, **extra}, m["presolve"])
    return t, c, (status, round(obj))


def parse_variant(spec: str) -> tuple[str, dict]:
    """``NAME=key:value;key:value`` as (NAME, {key: value}): an integer, a float, true / false
    (any case), a comma list (or any ``subsolvers`` value: CP-SAT's repeated field), else the
    string itself (HiGHS's string options, benchmarks/highs_params.py)."""
    name, body = spec.split("=", 1)
    out: dict = {}
    for item in body.split(";"):
        key, value = item.split(":")
        low = value.lower()
        if "," in value or key == "subsolvers":
            out[key] = value.split(",")
        elif low in ("true", "false"):
            out[key] = low == "true"
        elif value.lstrip("-").isdigit():
            out[key] = int(value)
        else:
            try:
                out[key] = float(value)
            except ValueError:
                out[key] = value
    return name, out


def re_solve(models: list, variants: dict, repeat: int, run) -> None:
    """Each of ``models`` (label, model) re-solved under every variant, the variants
    interleaved, ``repeat`` times: ``run(model, extra)`` gives wall seconds, CPU seconds and
    how the solve ended. Prints a line per model (medians, MISMATCH when the variants end
    differently) and the TOTAL line (summed medians, wall then CPU). Shared by
    benchmarks/highs_params.py."""
    total, cpu = dict.fromkeys(variants, 0.0), dict.fromkeys(variants, 0.0)
    for label, model in models:
        times: dict[str, list[float]] = {n: [] for n in variants}
        cpus: dict[str, list[float]] = {n: [] for n in variants}
        ends = {}
        for _ in range(repeat):
            for n, extra in variants.items():
                t, c, ends[n] = run(model, extra)
                times[n].append(t)
                cpus[n].append(c)
        med = {n: statistics.median(v) for n, v in times.items()}
        for n, v in med.items():
            total[n] += v
            cpu[n] += statistics.median(cpus[n])
        same = len(set(ends.values())) == 1
        print(label, " ".join(f"{n}={v:.3f}" for n, v in med.items()),
              "" if same else f"MISMATCH {ends}", flush=True)
    print("TOTAL", " ".join(f"{n}={v:.2f}" for n, v in total.items()),
          "CPU", " ".join(f"{n}={v:.2f}" for n, v in cpu.items()), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("instances", nargs="+")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--variant", action="append", default=[])
    ap.add_argument("--goals", default="", help="comma list of goals to re-solve (default all)")
    ap.add_argument("--only", action="store_true", help="shipped and --variant only")
    args = ap.parse_args()
    variants = {"shipped": {"cp_model_probing_level": 0}}
    if not args.only:
        variants.update({"portfolio4": {"cp_model_probing_level": 0, "num_workers": 4},
                         "probe4": {"num_workers": 4}})
    variants.update(parse_variant(v) for v in args.variant)
    goals = set(filter(None, args.goals.split(",")))
    for path in args.instances:
        models = record(path)
        if goals:
            models = [m for m in models if m["goal"] in goals
                      or (m["goal"] == "objective"
                          and ("objective^" if m["capped"] else "objective!") in goals)]
        print(path, len(models), "models", flush=True)
        re_solve([(f"{i} {m['goal']} {m['status']}", m) for i, m in enumerate(models)],
                 variants, args.repeat, run_recorded)


if __name__ == "__main__":
    main()

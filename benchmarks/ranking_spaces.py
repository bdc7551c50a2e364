#!/usr/bin/env python
"""The published runs' own knob spaces (the ranking of `plan validate`), solved by each backend.

Each shipped run's ranking space fixes its GPU count and global batch and pins what the run
pinned (``planner.app.ranking.ranking``); these are the spaces the planner is judged on. For
each backend the whole ranking is solved once per ``--repeat``, every run timed alone; the
script prints per backend the total and the median and largest per-run seconds, and whether
every run got the same optimum plan and ratio as the first backend. ``solver.space`` sizes
(``formulations.space.space_size``) of the largest spaces are printed too.

Example::

    python benchmarks/ranking_spaces.py --backends enumerate,cpsat
    python benchmarks/ranking_spaces.py planner/data/fsdp_runs.toml --backends enumerate,cpsat
"""

from __future__ import annotations

import argparse
import statistics
import time

from formulations.space import build_space, space_size
from planner.app.ranking import ranking, ranking_spaces, run_pins
from planner.app.runs_file import load_runs, run_instance
from planner.model.plan import plan_from_spec


def plans_of(data: dict, run: dict) -> int:
    """``solver.space``'s plan count of the run's ranking space (the union of its spaces)."""
    inst = run_instance(data, run)
    pins = run_pins(plan_from_spec(inst, inst.spec.plan))
    free = inst.with_spec(plan=None)
    return sum(space_size(build_space(free.with_spec(
        constraints=free.spec.constraints.model_copy(update=upd))))["space_plans"]
        for upd in ranking_spaces(run, pins))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="?", default=None, help="runs TOML (default: the shipped runs)")
    ap.add_argument("--backends", default="enumerate,cpsat")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--largest", type=int, default=5, help="how many of the largest spaces to list")
    args = ap.parse_args()
    data = load_runs(args.runs)
    runs = data["runs"]
    answers: dict[str, dict] = {}
    times: dict[str, dict[str, float]] = {}
    for backend in args.backends.split(","):
        per_run: dict[str, list[float]] = {r["id"]: [] for r in runs}
        for _ in range(args.repeat):
            for run in runs:
                t = time.perf_counter()
                got = ranking({**data, "runs": [run]}, solver=backend)[run["id"]]
                per_run[run["id"]].append(time.perf_counter() - t)
                answers.setdefault(backend, {})[run["id"]] = (got.get("optimum_plan"),
                                                              got.get("ratio"))
        times[backend] = {k: statistics.median(v) for k, v in per_run.items()}
    first = args.backends.split(",")[0]
    print(f"{len(runs)} runs, medians of {args.repeat} per run")
    print(f"{'backend':10} {'total s':>8} {'median s':>9} {'max s':>7}  same as {first}")
    for backend, per in times.items():
        same = sum(1 for rid, (plan, ratio) in answers[backend].items()
                   if plan == answers[first][rid][0] and (ratio is None) == (
                       answers[first][rid][1] is None)
                   and (ratio is None or abs(ratio - answers[first][rid][1]) <= 1e-9 * ratio))
        slow = max(per, key=per.get)
        print(f"{backend:10} {sum(per.values()):8.2f} {statistics.median(per.values()):9.3f} "
              f"{per[slow]:7.2f}  {same} of {len(runs)} (slowest: {slow})")
    sizes = sorted(((plans_of(data, r), r["id"]) for r in runs), reverse=True)
    print(f"plans per ranking space: median {statistics.median(n for n, _ in sizes):,.0f}, "
          f"{sum(n >= 10**6 for n, _ in sizes)} of {len(sizes)} spaces with 10^6 or more")
    print("largest spaces (solver.space plans):")
    sizes = sizes[:args.largest]
    for n, rid in sizes:
        print(f"  {rid:55} {n:>12,}  " + "  ".join(f"{b} {times[b][rid]:.2f} s" for b in times))


if __name__ == "__main__":
    main()

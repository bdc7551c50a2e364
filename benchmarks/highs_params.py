#!/usr/bin/env python
"""HiGHS options measured on the very models ``plan solve --solver highs`` hands to HiGHS
(formulations/pyomo_backend.py), as benchmarks/cpsat_params.py does for CP-SAT.

For each instance: ``formulations.solve.solve`` is run once with HiGHS while every model APPSI
passes to HiGHS (each goal of each part, with its caps) is written out with
``Highs.writeModel``; then each model is read back into a fresh ``highspy.Highs`` and solved
with the shipped options (``shipped``: formulations/pyomo_backend.py's) and with every
``--variant NAME=option:value;option:value`` on top of them (parsed as cpsat_params.py's),
the variants interleaved, ``--repeat`` times (``--time-limit`` bounds the recording solve and
each re-solve; ``--first`` re-solves only the first models). The medians are printed per model
and summed (the TOTAL line: wall, then CPU). A line says MISMATCH when the variants end in different statuses
or objectives (to 1e-7).

Example::

    python benchmarks/highs_params.py instances/gpt3-175b-a100.toml --repeat 3 \\
        --variant "nosym=mip_detect_symmetry:false"
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from cpsat_params import parse_variant, re_solve
from formulations import pyomo_backend
from formulations import solve as fsolve
from planner.model.instance import load_instance

#: the options formulations/pyomo_backend.py sets on HiGHS
SHIPPED = {"mip_rel_gap": 0.0, **pyomo_backend.HIGHS_OPTIONS}


def record(path: str, out: Path, time_limit: float | None = None
           ) -> list[tuple[Path, str, str]]:
    """The models HiGHS solves for one instance, in order, written to ``out``, with their goal
    and how the solve ended.
    The parts are solved in one thread (``PARTS_BESIDE_TIES`` off) so the files keep order."""
    seen: list[tuple[Path, str, str]] = []
    minimize = pyomo_backend._Session.minimize
    beside = fsolve.PARTS_BESIDE_TIES
    fsolve.PARTS_BESIDE_TIES = False

    def spy(self, goal, limit, hint):
        answer = minimize(self, goal, limit, hint)
        f = out / f"{len(seen):03d}-{goal}.mps"
        self.opt._solver_model.writeModel(str(f))       # the model as HiGHS held it
        seen.append((f, goal, answer.note))
        return answer
    pyomo_backend._Session.minimize = spy
    try:
        with pyomo_backend._stdout_to_stderr():         # (writeModel reports on stdout)
            fsolve.solve(load_instance(path), "highs", time_limit=time_limit)
    finally:
        pyomo_backend._Session.minimize = minimize
        fsolve.PARTS_BESIDE_TIES = beside
        fsolve.clear_spaces()
    return seen


def solve_with(model: Path, options: dict, time_limit: float | None = None
               ) -> tuple[float, float, str, float]:
    """Wall and CPU seconds of ``Highs.run``, the model status and the objective."""
    import highspy

    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    for key, value in {**SHIPPED, **options}.items():
        h.setOptionValue(key, value)
    if time_limit:
        h.setOptionValue("time_limit", float(time_limit))
    h.readModel(str(model))
    t, c = time.perf_counter(), time.process_time()
    h.run()
    wall, cpu = time.perf_counter() - t, time.process_time() - c
    return (wall, cpu, h.modelStatusToString(h.getModelStatus()),
            h.getInfo().objective_function_value)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("instances", nargs="+")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--variant", action="append", default=[])
    ap.add_argument("--time-limit", type=float, default=None,
                    help="seconds for the recording solve and for each re-solve")
    ap.add_argument("--first", type=int, default=None, help="re-solve only the first N models")
    args = ap.parse_args()
    variants = {"shipped": {}}
    variants.update(parse_variant(v) for v in args.variant)

    def run(f, extra):
        wall, cpu, status, obj = solve_with(f, extra, args.time_limit)
        return wall, cpu, (status, round(obj, 7) if status == "Optimal" else None)
    for path in args.instances:
        with tempfile.TemporaryDirectory() as tmp:
            models = record(path, Path(tmp), args.time_limit)[:args.first]
            print(path, len(models), "models", flush=True)
            re_solve([(f"{f.stem} {goal} {note}", f) for f, goal, note in models], variants, args.repeat,
                     run)


if __name__ == "__main__":
    main()

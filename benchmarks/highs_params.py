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
and summed (the TOTAL line). A line says MISMATCH when the variants end in different statuses
or objectives (to 1e-7).

Example::

    python benchmarks/highs_params.py instances/gpt3-175b-a100.toml --repeat 3 \\
        --variant "nosym=mip_detect_symmetry:false"
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from cpsat_params import parse_variant
from formulations import pyomo_backend
from formulations import solve as fsolve
from planner.model.instance import load_instance

#: the options formulations/pyomo_backend.py sets on HiGHS
SHIPPED = {"mip_rel_gap": 0.0, **pyomo_backend.HIGHS_OPTIONS}


def record(path: str, out: Path, time_limit: float | None = None) -> list[tuple[Path, str]]:
    """The models HiGHS solves for one instance, in order, written to ``out``, with their goal.
    The parts are solved in one thread (``PARTS_BESIDE_TIES`` off) so the files keep order."""
    seen: list[tuple[Path, str]] = []
    minimize = pyomo_backend._Session.minimize
    beside = fsolve.PARTS_BESIDE_TIES
    fsolve.PARTS_BESIDE_TIES = False

    def spy(self, goal, time_limit, hint):
        answer = minimize(self, goal, time_limit, hint)
        f = out / f"{len(seen):03d}-{goal}.mps"
        self.opt._solver_model.writeModel(str(f))       # the model as HiGHS held it
        seen.append((f, goal))
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
               ) -> tuple[float, str, float]:
    """Wall seconds of ``Highs.run``, the model status and the objective."""
    import highspy

    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    for key, value in {**SHIPPED, **options}.items():
        h.setOptionValue(key, value)
    if time_limit:
        h.setOptionValue("time_limit", float(time_limit))
    h.readModel(str(model))
    t = time.perf_counter()
    h.run()
    wall = time.perf_counter() - t
    return wall, h.modelStatusToString(h.getModelStatus()), h.getInfo().objective_function_value


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
    for path in args.instances:
        with tempfile.TemporaryDirectory() as tmp:
            models = record(path, Path(tmp), args.time_limit)[:args.first]
            print(path, len(models), "models", flush=True)
            total = dict.fromkeys(variants, 0.0)
            for f, goal in models:
                times: dict[str, list[float]] = {n: [] for n in variants}
                ends = {}
                for _ in range(args.repeat):
                    for n, opts in variants.items():
                        wall, status, obj = solve_with(f, opts, args.time_limit)
                        times[n].append(wall)
                        ends[n] = (status, round(obj, 7) if status == "Optimal" else None)
                med = {n: statistics.median(v) for n, v in times.items()}
                for n, v in med.items():
                    total[n] += v
                same = len(set(ends.values())) == 1
                print(f.stem, goal, ends["shipped"][0],
                      " ".join(f"{n}={v:.3f}" for n, v in med.items()),
                      "" if same else f"MISMATCH {ends}", flush=True)
            print("TOTAL", " ".join(f"{n}={v:.2f}" for n, v in total.items()), flush=True)


if __name__ == "__main__":
    main()

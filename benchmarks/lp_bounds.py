#!/usr/bin/env python
"""How tight the linear relaxation of each part model is, against the proven optimum.

A fixed-batch space is solved as one model per sharding mode and layout (formulations/solve.py
``sharding_parts``); every part after the first only has to be proven unable to beat the
incumbent, which CP-SAT does with three workers. A part whose LP relaxation bound already lies
above the optimum would need no CP-SAT solve at all. This script builds each part's rows
(``formulations.milp.build_rows``, the rows HiGHS and CP-SAT solve), relaxes every variable to
its bounds, minimises the objective with HiGHS' LP solver and prints the bound beside the
optimum ``plan solve`` proves.

Example::

    python benchmarks/lp_bounds.py benchmarks/instances/scaling-A131072.toml
"""

from __future__ import annotations

import argparse
import time

import highspy
import numpy as np

from formulations.encoding import NO_CUTS, encode
from formulations.milp import INF, build_rows
from formulations.solve import (SPLIT_LAYOUTS_ABOVE, default_objective, sharding_parts,
                                solve)
from formulations.space import build_space, joint_size
from planner.model.instance import load_instance


def lp_bound(rows) -> float:
    """The minimum of the objective over the relaxation of ``rows``, in seconds (per sample
    for that objective)."""
    n = len(rows.names)
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    inf = highspy.kHighsInf
    h.addVars(n, np.array([-inf if x == -INF else x for x in rows.lb], dtype=float),
              np.array([inf if x == INF else x for x in rows.ub], dtype=float))
    cost = np.zeros(n)
    for j, c in rows.goals["objective"].items():
        cost[j] += c
    h.changeColsCost(n, np.arange(n, dtype=np.int32), cost)
    for coefs, lo, hi, _ in rows.rows:
        h.addRow(-inf if lo == -INF else lo, inf if hi == INF else hi, len(coefs),
                 np.array(list(coefs), dtype=np.int32), np.array(list(coefs.values()), dtype=float))
    h.run()
    return h.getInfo().objective_function_value * rows.time_unit


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("instance", help="a fixed-batch instance TOML")
    inst = load_instance(ap.parse_args().instance)
    kind = default_objective(inst)
    optimum = solve(inst).report.step_time_s
    if kind == "time_per_sample":
        raise SystemExit("a fixed global batch is needed (the parts of one batch model)")
    space = build_space(inst)
    parts = sharding_parts(space, joint_size(space) > SPLIT_LAYOUTS_ABOVE)
    print(f"optimum {optimum:.6f} s; {len(parts)} parts")
    below = 0
    for i, sub in enumerate(parts):
        t0 = time.perf_counter()
        bound = lp_bound(build_rows(encode(sub, kind), NO_CUTS))
        below += bound <= optimum
        print(f"part {i}: LP bound {bound:.6f} s ({bound / optimum:.3f} of the optimum), "
              f"{time.perf_counter() - t0:.2f} s to build and solve")
    print(f"{below} of {len(parts)} parts have an LP bound at or below the optimum "
          "(an LP check could not prove them; CP-SAT must)")


if __name__ == "__main__":
    main()

#!/usr/bin/env python
"""One MIP per data-parallel sharding mode against one MIP of every mode (docs/encoding.md,
"One model per data-parallel sharding mode").

For each instance and backend, in one run: the proven optimum of the instance's fixed-batch space
as one model carrying every sharding mode (``formulations.solve._solve_model``), and as the best
of one model per mode with the incumbent cap (``formulations.solve._best_of_parts``, what
``plan solve`` runs), each encoded and solved ``--repeat`` times; the medians, their ratio and
whether the two optima agree are printed. ``--ties`` adds the tie-break goals to both (the full
``plan solve`` answer); without it, the objective alone.

Example::

    python benchmarks/sharding_parts.py instances/llama3.1-405b-h100.toml --repeat 3
"""

from __future__ import annotations

import argparse
import statistics
import time

from formulations.encoding import Cuts
from formulations.solve import _best_of_parts, _solve_model, sharding_parts
from formulations.space import build_space
from planner.model.instance import load_instance


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("instances", nargs="+")
    ap.add_argument("--backends", default="cpsat,highs")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--ties", action="store_true", help="break ties too (the whole answer)")
    args = ap.parse_args()
    print(f"{'instance':34} {'backend':7} {'modes':>5} {'joint s':>8} {'parts s':>8} "
          f"{'ratio':>6}  same optimum")
    for path in args.instances:
        space = build_space(load_instance(path))
        if len(space.base["B"].values) != 1:
            raise SystemExit(f"{path}: a fixed global batch is needed")
        choices = space.dims["sharding_choice"]
        cuts = Cuts(None, (), args.ties)
        for backend in args.backends.split(","):
            joint, parts, z = [], [], {}
            for _ in range(args.repeat):
                t = time.perf_counter()
                z["joint"] = _solve_model(space, backend, None, "step_time", cuts)[0].objective
                joint.append(time.perf_counter() - t)
                t = time.perf_counter()
                z["parts"] = _best_of_parts(space, sharding_parts(space), backend, None,
                                            "step_time", cuts, "sharding-mode and layout")[0].objective
                parts.append(time.perf_counter() - t)
            a, b = statistics.median(joint), statistics.median(parts)
            same = abs(z["joint"] - z["parts"]) <= 1e-6 * abs(z["joint"])
            print(f"{path.split('/')[-1]:34} {backend:7} {len(choices):5d} {a:8.2f} {b:8.2f} "
                  f"{a / b:6.2f}  {same} ({z['joint']:.6g} s)")


if __name__ == "__main__":
    main()

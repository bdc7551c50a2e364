"""Time a 200-point ``plan sweep`` with 1 and 2 local workers and with Ray in local mode.

Targets (issue 14): 2 workers take <= 0.6x the time of 1; Ray's overhead per point stays under
50 ms. Ray's overhead per point is (Ray sweep - 2-worker pool sweep) / points, both with 2
CPUs, Ray's start-up (``ray.init``) reported apart. Every ratio is computed from timings of the
same run (medians over ``--repeat`` runs), and the three tables are checked to be identical
(wall-clock columns aside).

    python benchmarks/sweep_bench.py                  # HiGHS, 200 points, one repeat
    python benchmarks/sweep_bench.py --solver cpsat --repeat 3

Run it on an otherwise idle machine: the ratios measure parallel speedup, which anything else
running on the cores takes away.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner.app import sweep as sw  # noqa: E402
from planner.app.sweep_output import comparable  # noqa: E402

SWEEP = """
[model]
preset = "gpt-1.3b"
[training]
global_batch = 256
tokens = 1e11
[cluster]
gpu = "a100-80gb"
nodes = 1
price_per_gpu_hour = 2.0
[sweep]
solver = "{solver}"
"model.preset" = ["gpt-1.3b", "llama3-8b"]
"cluster.nodes" = [1, 2, 4, 8, 16]
"training.global_batch" = [128, 256, 512, 1024]
"constraints.max_pp" = [1, 2, 4, 8, 16]
"""


def timed(fn) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--solver", default="cpsat", help="cpsat (default) | highs | enumerate")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each; medians are printed")
    ap.add_argument("--no-ray", action="store_true", help="skip the Ray measurement")
    args = ap.parse_args()

    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.toml"
        path.write_text(SWEEP.format(solver=args.solver))
        spec = sw.load_sweep(path)
        n = len(spec.points)
        t1s, t2s, trs, inits = [], [], [], []
        tables = {}
        ray = None
        if not args.no_ray:
            import ray
        for _ in range(args.repeat):
            t, run = timed(lambda: sw.run_sweep(spec, workers=1))
            t1s.append(t)
            tables["1 worker"] = comparable(run.rows)
            t, run = timed(lambda: sw.run_sweep(spec, workers=2))
            t2s.append(t)
            tables["2 workers"] = comparable(run.rows)
            if ray is not None:
                t, _ = timed(lambda: ray.init(num_cpus=2, include_dashboard=False,
                                              log_to_driver=False, logging_level="ERROR"))
                inits.append(t)
                t, run = timed(lambda: sw.run_sweep(spec, engine="ray"))
                trs.append(t)
                tables["Ray local"] = comparable(run.rows)
                ray.shutdown()
        med = statistics.median
        t1, t2 = med(t1s), med(t2s)
        statuses = {}
        for r in tables["1 worker"]:
            statuses[r.get("solver.status")] = statuses.get(r.get("solver.status"), 0) + 1
        print(f"sweep: {n} points, solver {args.solver}, {args.repeat} run(s) of each "
              f"(medians); statuses {statuses}")
        print(f"  1 worker (in-process)   {t1:7.2f} s   {1e3 * t1 / n:6.1f} ms/point")
        print(f"  2 workers (local pool)  {t2:7.2f} s   {1e3 * t2 / n:6.1f} ms/point   "
              f"ratio to 1 worker {t2 / t1:.2f} (target <= 0.60)")
        if trs:
            tr, ti = med(trs), med(inits)
            over = (tr - t2) / n
            print(f"  Ray local, 2 CPUs       {tr:7.2f} s   {1e3 * tr / n:6.1f} ms/point   "
                  f"ratio to 1 worker {tr / t1:.2f}; ray.init {ti:.2f} s apart")
            print(f"  Ray overhead per point  {1e3 * over:+7.1f} ms   (Ray - 2-worker pool) / "
                  f"points (target < 50 ms)")
        same = all(t == tables["1 worker"] for t in tables.values())
        print(f"  identical tables across {', '.join(tables)}: {same}")
        print(f"  load average (1 min) {load0:.1f} before, {os.getloadavg()[0]:.1f} after, on "
              f"{os.cpu_count()} cores: parallel ratios mean little when it exceeds the cores")


if __name__ == "__main__":
    main()

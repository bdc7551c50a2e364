"""The three-way agreement of tests/test_solvers.py on many more drawn instances than the suite
can afford: a deeper check to run before a change to the search, the encoding or the model.

The suite draws 36 instances (three tests of 12, derandomized) from ``instances()`` in
tests/test_solvers.py. This draws ``N`` from the same strategy under a seed of your choice, and
with ``--deep`` from a variant that stresses the pipeline layouts: odd layer counts (5 to 61)
on 8 to 48 GPUs and batches of 16 to 128, with ``max_stage_shortfall`` left unset so that the
search takes its own (planner/model/plan.py, ``stage_shortfall``; up to 4 layers short). Each
instance is solved by the enumerator and CP-SAT, and every ``--highs-every``-th by HiGHS too;
a backend disagrees when it differs from the enumerator on feasibility, status (not proven),
objective (beyond the suite's tolerance) or plan (the tie-broken answer). Every disagreement is
printed with its instance as JSON, which ``plan solve`` reads back once written as TOML.

Usage: python tools/agreement_stress.py [N] [--seed S] [--deep] [--highs-every K]
Exit status 1 when any backend disagreed. (About 1-10 s per instance on 2 cores: most draws
solve in under a second, a few deep ones with HiGHS take a minute.)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from hypothesis import HealthCheck, given, seed, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import test_solvers  # noqa: E402  (the suite's strategy and tolerance: one owner)
from formulations.result import Status  # noqa: E402
from formulations.solve import solve  # noqa: E402
from planner.model.errors import InfeasibleError, InputError  # noqa: E402
from planner.model.instance import parse_instance  # noqa: E402


@st.composite
def deep_instances(draw):
    """The suite's draw with the layers, the GPUs and the batch changed to ones that need
    uneven pipeline layouts, and the search's own stage shortfall."""
    doc = draw(test_solvers.instances())
    doc["model"]["layers"] = draw(st.sampled_from([5, 7, 9, 11, 13, 15, 21, 25, 35, 61]))
    doc["cluster"] = {"gpu": doc["cluster"]["gpu"],
                      "gpus": draw(st.sampled_from([8, 12, 16, 24, 32, 48]))}
    doc["constraints"].pop("max_stage_shortfall", None)
    doc["constraints"].pop("dp_shard_size", None)       # (drawn for the suite's GPU counts)
    if isinstance(doc["training"]["global_batch"], int):
        doc["training"]["global_batch"] = draw(st.sampled_from([16, 32, 48, 64, 96, 128]))
    return doc


def disagreement(inst, backend: str, ref) -> str | None:
    """What ``backend`` says differently from the enumerator's ``ref`` (None: infeasible)."""
    try:
        res = solve(inst, solver=backend, explain=False)
    except InfeasibleError:
        res = None
    except Exception as exc:  # a crash is a finding, not the end of the run
        return f"{backend} raised {type(exc).__name__}: {exc}"
    if ref is None:
        return None if res is None else f"{backend} found {res.objective}, the enumerator no plan"
    if res is None:
        return f"{backend} found no plan, the enumerator {ref.objective}"
    if res.status != Status.OPTIMAL:
        return f"{backend} ended {res.status.value}: {res.note}"
    if abs(res.objective - ref.objective) > 1e-6 * abs(ref.objective) + test_solvers.tolerance(res):
        return f"{backend} objective {res.objective} against {ref.objective}"
    if res.report.plan != ref.report.plan:
        return f"{backend} plan {res.report.plan.label()} against {ref.report.plan.label()}"
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("n", nargs="?", type=int, default=100, help="instances to draw")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--deep", action="store_true", help="odd layer counts, uneven layouts")
    ap.add_argument("--highs-every", type=int, default=4, metavar="K",
                    help="HiGHS on every K-th instance (0: never)")
    args = ap.parse_args(argv)
    seen = {"drawn": 0, "with a plan": 0, "disagreements": 0}
    t0 = time.perf_counter()

    @seed(args.seed)
    @settings(max_examples=args.n, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(deep_instances() if args.deep else test_solvers.instances())
    def run(doc):
        seen["drawn"] += 1
        try:
            inst = parse_instance(doc)
        except InputError:
            return
        try:
            ref = solve(inst, solver="enumerate", explain=False)
        except InfeasibleError:
            ref = None
        seen["with a plan"] += ref is not None
        backends = ["cpsat"]
        if args.highs_every and seen["drawn"] % args.highs_every == 0:
            backends.append("highs")
        for backend in backends:
            why = disagreement(inst, backend, ref)
            if why:
                seen["disagreements"] += 1
                print(json.dumps({"disagreement": why, "instance": doc}), flush=True)

    run()
    print(f"{seen['drawn']} drawn ({seen['with a plan']} with a plan), "
          f"{seen['disagreements']} disagreements, {time.perf_counter() - t0:.0f} s")
    return 1 if seen["disagreements"] else 0


if __name__ == "__main__":
    sys.exit(main())

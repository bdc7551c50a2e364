"""The three-way check on the shipped instances, as a user runs them: every backend's proven
optimum and plan agree, and ``plan evaluate`` of the returned plan gives back the same step.

The suite checks CP-SAT against the enumerator on every shipped instance
(tests/test_one_answer.py) but HiGHS only on the two it solves in seconds; this runs all three,
each as its own ``plan solve FILE --solver S --json`` process, on every ``instances/*.toml``
of one cluster size (the capacity and Pareto examples, which give a range, are left to their
own queries). Per instance it checks:

* every backend proves an optimum (status ``optimal``);
* the objectives agree within the tolerance ``plan solve`` itself uses (relative 1e-6 plus 200
  CP-SAT quanta, ``solver.quantum_s``);
* the plans are the same (``plan_spec``, every knob and placement);
* the plan, pasted as the instance's ``[plan]`` (the README: "paste it into the instance"),
  evaluates (``plan evaluate FILE --json``) to the same step time, relative 1e-9, with no
  violation.

It prints one row per instance (each backend's whole-process seconds) and exits 1 when any
check fails. Run it before a change to the model, the encoding or a backend lands; about 2-4
minutes on 2 cores, most of it HiGHS.

Usage: python tools/check_shipped.py [FILE ...] [--solvers cpsat,highs,enumerate]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from planner.model.instance import load_instance  # noqa: E402
from planner.model.words import toml_value  # noqa: E402

#: the agreement tolerance of ``plan solve`` (and benchmarks/solve_scaling.py)
REL_TOL, QUANTUM_FACTOR = 1e-6, 200
#: how close ``plan evaluate`` of the returned plan must come to the solver's objective
EVAL_TOL = 1e-9


def plan_cli(*args: str) -> tuple[dict, float]:
    """``plan ARGS --json`` in its own process: its JSON and its wall seconds."""
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "planner.app.cli", *args, "--json"],
                          capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - t0
    try:
        return json.loads(proc.stdout), wall
    except json.JSONDecodeError:
        return {"error": f"no JSON (exit {proc.returncode}): {proc.stderr.strip()[-300:]}"}, wall


def with_plan(text: str, spec: dict) -> str:
    """The instance file's text with its ``[plan]`` table replaced by ``spec``."""
    out, skipping = [], False
    for line in text.splitlines():
        if re.match(r"\s*\[", line):
            skipping = re.match(r"\s*\[plan\]", line) is not None
        if not skipping:
            out.append(line)
    return "\n".join(out + ["", "[plan]"] + [f"{k} = {toml_value(v)}" for k, v in spec.items()
                                             if v is not None]) + "\n"


def check(path: Path, solvers: list[str]) -> tuple[list[str], dict[str, float]]:
    """The problems found on one instance and each backend's wall seconds."""
    problems, walls, got = [], {}, {}
    for s in solvers:
        res, walls[s] = plan_cli("solve", str(path), "--solver", s)
        if "error" in res:
            problems.append(f"{s}: {res['error']}")
        elif res["solver"]["status"] != "optimal":
            problems.append(f"{s}: status {res['solver']['status']}")
        else:
            got[s] = res
    if len(got) < 2 and not problems:
        return problems, walls
    ref_name = next(iter(got), None)
    for s, res in got.items():
        if s == ref_name:
            continue
        ref = got[ref_name]
        a, b = ref["step_time_s"], res["step_time_s"]
        q = max(ref["solver"].get("quantum_s") or 0.0, res["solver"].get("quantum_s") or 0.0)
        if abs(a - b) > REL_TOL * max(abs(a), abs(b)) + QUANTUM_FACTOR * q:
            problems.append(f"{s}: objective {b!r} against {ref_name}'s {a!r}")
        if res["plan_spec"] != ref["plan_spec"]:
            keys = sorted(k for k in set(res["plan_spec"]) | set(ref["plan_spec"])
                          if res["plan_spec"].get(k) != ref["plan_spec"].get(k))
            problems.append(f"{s}: another plan than {ref_name}'s ("
                            + ", ".join(f"{k} {res['plan_spec'].get(k)} against "
                                        f"{ref['plan_spec'].get(k)}" for k in keys) + ")")
    for s, res in got.items():
        with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as f:
            f.write(with_plan(path.read_text(), res["plan_spec"]))
        ev, _ = plan_cli("evaluate", f.name)
        Path(f.name).unlink()
        if "error" in ev:
            problems.append(f"{s}: plan evaluate of its plan: {ev['error']}")
            continue
        if ev.get("violations"):
            problems.append(f"{s}: plan evaluate of its plan: {ev['violations']}")
        if abs(ev["step_time_s"] - res["step_time_s"]) > EVAL_TOL * abs(res["step_time_s"]):
            problems.append(f"{s}: plan evaluate gives {ev['step_time_s']!r} for its plan, "
                            f"the solver {res['step_time_s']!r}")
    return problems, walls


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="*", type=Path,
                    help="instance files (default: every instances/*.toml of one size)")
    ap.add_argument("--solvers", default="cpsat,highs,enumerate")
    args = ap.parse_args(argv)
    solvers = [s.strip() for s in args.solvers.split(",") if s.strip()]
    # (absolute: the processes run in the repository, wherever this was started)
    files = [p.resolve() for p in args.files] or [
        p for p in sorted((ROOT / "instances").glob("*.toml"))
        if len(load_instance(p).node_options) == 1]
    failed = 0
    print(f"{'instance':28s} " + " ".join(f"{s + ' s':>11s}" for s in solvers) + "  result")
    for path in files:
        problems, walls = check(path, solvers)
        failed += bool(problems)
        print(f"{path.name:28s} " + " ".join(f"{walls.get(s, float('nan')):11.2f}"
                                              for s in solvers)
              + ("  agree, evaluate reproduces" if not problems else "  FAILED"), flush=True)
        for p in problems:
            print(f"    {p}")
    print(f"{len(files) - failed} of {len(files)} instances pass")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

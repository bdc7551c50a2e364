#!/usr/bin/env python
"""CPU time of ``build_space`` over many spaces, for two revisions of the code, interleaved.

The spaces: each shipped instance (as written and without its ``[plan]``), each published
run's ranking spaces (``planner.app.ranking.ranking_spaces``: the run's GPU count and batch,
its pins) and, per run, four pinned variants (a first / last stage count, a recompute count,
an odd ``vp``) that mostly leave no layout or no value, so that the build walks the
explanation's paths (1,247 of the 1,708 on the shipped runs of 2026-12-06). A space
that cannot be built counts with its error message. Each round builds them all once per
revision, in a fresh process, the revisions alternating; the table gives the median CPU
seconds and whether every build of both revisions produced the same spaces (the layouts'
(pp, vp) pairs, the knob combinations, the base variables' values, the fixed ones, the rule
rows and the error texts, as one digest).

Example::

    python benchmarks/space_builds.py HEAD~3 WORKTREE --repeat 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

from compare_revisions import revision_args, revisions
from solve_scaling import ROOT

#: pins that often leave a run's space without a layout (or a value), so a build explains why
PINNED = ({"first_stage_layers": 3}, {"last_stage_layers": 5, "vp": 3}, {"recompute_layers": 2},
          {"vp": 7})

CHILD = r"""
import glob, hashlib, json, time
from formulations.space import build_space
from planner.app.ranking import ranking_spaces, run_pins
from planner.app.runs_file import load_runs, run_instance
from planner.model.instance import load_instance
from planner.model.plan import plan_from_spec

spaces = []
for f in sorted(glob.glob(ROOT + "/instances/*.toml")):
    inst = load_instance(f)
    spaces += [inst, inst.with_spec(plan=None)]
for src in (None, ROOT + "/planner/data/fsdp_runs.toml"):
    data = load_runs(src)
    for run in data["runs"]:
        try:
            inst = run_instance(data, run)
            pins = run_pins(plan_from_spec(inst, inst.spec.plan))
        except Exception:
            continue
        free = inst.with_spec(plan=None)
        c = free.spec.constraints
        spaces += [free.with_spec(constraints=c.model_copy(update=u))
                   for u in [*ranking_spaces(run, pins), *PINNED]]
digest = hashlib.md5()
t = time.process_time()
for inst in spaces:
    try:
        sp = build_space(inst)
        got = (sorted((repr(k), sorted(v)) for k, v in sp.layout_pairs.items()),
               [str(k) for k in sp.combos],
               {n: (b.values, b.exps) for n, b in sp.base.items()}, sorted(sp.fixed.items()),
               [repr(r) for r in sp.constraints])
    except Exception as exc:
        got = (type(exc).__name__, str(exc))
    digest.update(repr(got).encode())
print(json.dumps({"cpu_s": time.process_time() - t, "spaces": len(spaces),
                  "digest": digest.hexdigest()}))
"""


def build_once(env: dict | None, cwd: str) -> dict:
    """One build of every space in a fresh process, in the revision's directory (``python -c``
    puts it first on the path: the snapshot's code), the instance files read from this
    checkout."""
    code = f"PINNED = {PINNED!r}\nROOT = {str(ROOT)!r}\n" + CHILD
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=cwd, text=True,
                         capture_output=True)
    if out.returncode:
        raise SystemExit(f"a build failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    revision_args(ap)
    args = ap.parse_args()
    with revisions(args.base, args.new) as revs:
        runs: dict[str, list[dict]] = {r: [] for r in revs}
        for _ in range(args.repeat):
            for rev, (env, cwd, _) in revs.items():
                runs[rev].append(build_once(env, cwd))
    digests = {r["digest"] for rs in runs.values() for r in rs}
    n = runs[args.base][0]["spaces"]
    meds = {rev: statistics.median(r["cpu_s"] for r in rs) for rev, rs in runs.items()}
    print(f"\n{n} spaces, CPU seconds, medians of {args.repeat}\n")
    print(f"| {args.base} | {args.new} | ratio | spaces |\n|---:|---:|---:|---|")
    print(f"| {meds[args.base]:.2f} | {meds[args.new]:.2f} | "
          f"{meds[args.base] / meds[args.new]:.2f}x | "
          f"{'same' if len(digests) == 1 else 'DIFFER'} |")


if __name__ == "__main__":
    sys.exit(main())

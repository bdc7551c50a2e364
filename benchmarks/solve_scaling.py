#!/usr/bin/env python
"""How ``plan solve`` scales with the GPU count, per backend, with every knob free.

For each model and GPU count, one instance TOML is written to a temporary directory and
``plan solve FILE --solver B --json`` is run as a subprocess for each backend (cpsat, highs,
enumerate). Measured per run:

* whole-process time: wall time of the subprocess (interpreter start, imports, instance loading,
  space, encoding, solve, decode, evaluator check, JSON);
* in-solver time ``solver.solve_s`` and model build time ``solver.build_s`` from the JSON;
* status and objective, and whether the three backends agree on the objective
  (relative 1e-6 plus 200 CP-SAT quanta ``solver.quantum_s``, the tolerance ``plan solve`` itself uses).

Models (issue 3 targets: "plan solve <= 1 s up to 131,072 GPUs" and ">= 10x faster
than enumeration from 4,096 GPUs up"):

* A: GPT-3 175B dense (preset ``gpt3-175b``) on a100-80gb (``--gpu-a h100-sxm`` for H100);
* B: Llama-3-405B-shaped GQA model (preset ``llama3-405b``) on h100-sxm, ``max_cp = 2``,
  with 128 layers by default: an even split at every power-of-two pipeline degree, the space
  the earlier measurements in benchmarks/README.md were taken on. ``--b-layers 126`` measures
  the real preset, which solves wherever the 128-layer model does (from 64 GPUs) through uneven
  layouts (first / last stage short, the embedding and loss counted as layers) and whose layout
  tables make CP-SAT several times slower (benchmarks/README.md, "The real 126 layers").

No ``[constraints]`` pins: the schema defaults (``max_cp = 1``, micro-batch 1..32, every recompute
mode, SP and distributed optimizer free) except ``max_cp = 2`` for model B and
``tp_within_node = false`` (tensor parallelism may cross nodes, the space the README's figures
were measured on). Global batch: a fixed
``max(2048, GPUs // 16)`` sequences (2048 up to 32,768 GPUs, 8192 at 131,072), which admits plans
at every size where the model fits in memory at all (175B and the 405B-shaped model from 64
GPUs, the latter with its optimizer states offloaded there).

Example::

    /tmp/pv/bin/python benchmarks/solve_scaling.py --gpus 8,512,4096 --time-limit 60
    /tmp/pv/bin/python benchmarks/solve_scaling.py --repeat 3 --json /tmp/scaling.json
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from importlib import metadata
from pathlib import Path

BACKENDS = ("cpsat", "highs", "enumerate")
DEFAULT_GPUS = (8, 64, 512, 4096, 32768, 131072)
GPUS_PER_NODE = 8
REL_TOL = 1e-6
QUANTUM_FACTOR = 200

MODELS = {
    "A": {"label": "GPT-3 175B dense", "preset": "gpt3-175b", "gpu": "a100-80gb", "max_cp": None,
          "layers": None},
    "B": {"label": "Llama-3-405B-shaped GQA", "preset": "llama3-405b", "gpu": "h100-sxm",
          "max_cp": 2, "layers": 128},
}


def global_batch_for(gpus: int) -> int:
    """Sequences per step: 2048 up to 32,768 GPUs, GPUs / 16 beyond (8192 at 131,072)."""
    return max(2048, gpus // 16)


def batch_text(batch) -> str:
    return f"{batch[0]}-{batch[1]}" if isinstance(batch, tuple) else str(batch)


def instance_toml(model: dict, gpus: int, batch) -> str:
    lines = ["[model]", f'preset = "{model["preset"]}"']
    if model["layers"] is not None:
        lines.append(f"layers = {model['layers']}")
    gb = f"[{batch[0]}, {batch[1]}]" if isinstance(batch, tuple) else str(batch)
    lines += ["", "[training]", f"global_batch = {gb}", "", "[cluster]",
              f'gpu = "{model["gpu"]}"', f"gpus = {gpus}", f"gpus_per_node = {GPUS_PER_NODE}"]
    # TP free to cross nodes, as measured before tp_within_node defaulted to true: the same space
    lines += ["", "[constraints]", "tp_within_node = false"]
    if model["max_cp"] is not None:
        lines.append(f"max_cp = {model['max_cp']}")
    return "\n".join(lines) + "\n"


def plan_command() -> list[str]:
    """The ``plan`` console script next to this interpreter, else ``python -m planner.app.cli``."""
    script = Path(sys.executable).with_name("plan")
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script)]
    return [sys.executable, "-m", "planner.app.cli"]


# ---------------------------------------------------------------------------------------------
# one run


def run_once(cmd: list[str], limit: float, grace: float, env: dict | None = None,
             cwd: str | None = None) -> dict:
    """One ``plan solve`` subprocess. The solver gets ``--time-limit limit``; the process is
    killed at ``limit + grace`` (enumerate ignores the solver limit; build time is not in it)."""
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=limit + grace,
                           env=env, cwd=cwd)
    except subprocess.TimeoutExpired:
        return {"wall_s": time.perf_counter() - t0, "rc": None, "status": "killed",
                "objective": None, "solve_s": None, "build_s": None, "quantum_s": None,
                "note": f"killed after {limit + grace:.0f} s", "hit_limit": True}
    wall = time.perf_counter() - t0
    rec = {"wall_s": wall, "rc": p.returncode, "status": None, "objective": None,
           "solve_s": None, "build_s": None, "quantum_s": None, "note": "", "hit_limit": False}
    data = None
    if p.stdout.strip():
        try:
            data = json.loads(p.stdout)
        except json.JSONDecodeError:
            data = None
    if data is not None and "solver" in data:
        s = data["solver"]
        rec.update(status=s.get("status"), objective=s.get("objective"), solve_s=s.get("solve_s"),
                   build_s=s.get("build_s"), quantum_s=s.get("quantum_s"),
                   note=s.get("note") or "", inproc_wall_s=s.get("wall_s"),
                   plans=(s.get("space") or {}).get("plans"))
        if data.get("plan"):
            pl = data["plan"]
            rec["plan"] = {k: pl.get(k) for k in ("tp", "pp", "cp", "dp", "vp", "micro_batch",
                                                  "recompute", "sequence_parallel",
                                                  "distributed_optimizer")}
    elif p.returncode == 3:
        rec["status"] = "infeasible"
        rec["note"] = " ".join(p.stderr.split())[:300]
    else:
        rec["status"] = "error"
        rec["note"] = f"exit {p.returncode}: " + " ".join((p.stderr or p.stdout).split())[-300:]
    rec["hit_limit"] = (rec["status"] in ("feasible", "no_solution_in_limit")
                        or (rec["solve_s"] is not None and rec["solve_s"] >= 0.98 * limit))
    return rec


def summarise(runs: list[dict]) -> dict:
    """Medians over the repeats; status/objective of the last run (they are deterministic)."""
    def med(key):
        vals = [r[key] for r in runs if r.get(key) is not None]
        return statistics.median(vals) if vals else None

    last = runs[-1]
    return {"whole_s": med("wall_s"), "solve_s": med("solve_s"), "build_s": med("build_s"),
            "status": last["status"], "objective": last["objective"],
            "quantum_s": last["quantum_s"], "hit_limit": any(r["hit_limit"] for r in runs),
            "note": last["note"], "plan": last.get("plan"), "repeats": len(runs),
            "plans": last.get("plans")}


# ---------------------------------------------------------------------------------------------
# agreement


def agreement(res: dict[str, dict]) -> tuple[bool, str]:
    """(agree, text). Only finished runs count; a run stopped at the limit is not a proof."""
    done = {b: r for b, r in res.items() if not r["hit_limit"] and r["status"] != "error"}
    errors = [b for b, r in res.items() if r["status"] == "error"]
    if not done:
        return True, "n/a (no run finished)"
    infeas = sorted(b for b, r in done.items() if r["status"] == "infeasible")
    opt = {b: r for b, r in done.items() if r["status"] == "optimal"}
    other = sorted(set(done) - set(infeas) - set(opt))
    if infeas and opt:
        return False, (f"!! DISAGREE: {', '.join(infeas)} infeasible, "
                       f"{', '.join(sorted(opt))} optimal")
    if other:
        return False, "!! status " + ", ".join(f"{b}={done[b]['status']}" for b in other)
    if infeas:
        txt = "all infeasible" if len(infeas) == len(res) else f"infeasible ({', '.join(infeas)})"
        return not errors, txt + (f"; ERROR: {', '.join(errors)}" if errors else "")
    worst, worst_pair = 0.0, None
    names = sorted(opt)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            oa, ob = opt[a]["objective"], opt[b]["objective"]
            q = max(opt[a]["quantum_s"] or 0.0, opt[b]["quantum_s"] or 0.0)
            tol = REL_TOL * max(abs(oa), abs(ob)) + QUANTUM_FACTOR * q
            excess = abs(oa - ob) / tol if tol > 0 else (0.0 if oa == ob else float("inf"))
            if excess > worst:
                worst, worst_pair = excess, (a, b, oa, ob)
    if worst > 1.0:
        a, b, oa, ob = worst_pair
        return False, f"!! DISAGREE: {a} {oa:.9g} vs {b} {ob:.9g}"
    missing = sorted(set(res) - set(opt))
    txt = "yes" if len(opt) == len(res) else f"yes ({'+'.join(names)} only)"
    if missing:
        txt += "; not proven: " + ", ".join(missing)
    return True, txt


# ---------------------------------------------------------------------------------------------
# formatting


def fmt_t(x: float | None, hit: bool = False) -> str:
    if x is None:
        return "-"
    s = f"{x:.3f}" if x < 10 else (f"{x:.2f}" if x < 100 else f"{x:.1f}")
    return (">" + s) if hit else s


def ratio(num: dict | None, den: dict | None, key: str) -> tuple[float | None, str]:
    """enumerate time / backend time, with '<' or '>' when one side stopped at the limit."""
    if not num or not den or num.get(key) is None or den.get(key) is None or den[key] <= 0:
        return None, "-"
    r = num[key] / den[key]
    pre = ""
    if den["hit_limit"] and not num["hit_limit"]:
        pre = "<"                      # the backend would have needed longer: ratio even lower
    elif num["hit_limit"] and not den["hit_limit"]:
        pre = ">"
    elif num["hit_limit"] and den["hit_limit"]:
        pre = "?"
    s = f"{r:.3g}" if r < 1000 else f"{r:.0f}"
    return r, f"{pre}{s}x"


def print_table(mkey: str, model: dict, rows: list[dict], backends: list[str], limit: float,
                repeat: int) -> None:
    layers = f", {model['layers']} layers" if model["layers"] else ""
    cp = f", max_cp={model['max_cp']}" if model["max_cp"] else ", max_cp=1 (default)"
    title = (f"Model {mkey}: {model['label']} (preset {model['preset']}{layers}) on "
             f"{model['gpu']}{cp}; no pins; median of {repeat} run(s); limit {limit:g} s")
    print()
    print(title)
    print("=" * len(title))
    cols = [("GPUs", 7), ("batch", 6), ("plans", 9)]
    for b in backends:
        short = {"enumerate": "enum"}.get(b, b)
        cols += [(f"{short} whole", 12), (f"{short} solve", 12)]
    ratio_pairs = [(o, "enumerate") for o in ("cpsat", "highs")
                   if o in backends and "enumerate" in backends]
    for o, _ in ratio_pairs:
        cols += [(f"enum/{o} whole", 15), (f"enum/{o} solve", 15)]
    cols += [("objective s", 12), ("agree", 0)]
    print("  ".join(f"{c:>{w}}" if w else c for c, w in cols))
    print("  ".join("-" * (w or 5) for _, w in cols))
    for row in rows:
        res = row["results"]
        sizes = [r["plans"] for r in res.values() if r.get("plans")]
        cells = [f"{row['gpus']:>7,}", f"{batch_text(row['global_batch']):>6}",
                 f"{sizes[0]:>9,}" if sizes else f"{'-':>9}"]
        for b in backends:
            r = res.get(b)
            cells.append(f"{fmt_t(r and r['whole_s'], bool(r and r['hit_limit'])):>12}")
            cells.append(f"{fmt_t(r and r['solve_s'], bool(r and r['hit_limit'])):>12}")
        for o, e in ratio_pairs:
            for key in ("whole_s", "solve_s"):
                cells.append(f"{ratio(res.get(e), res.get(o), key)[1]:>15}")
        objs = [r for r in res.values() if r["status"] == "optimal" and not r["hit_limit"]]
        if objs:
            obj = f"{objs[0]['objective']:.6g}"
        elif any(r["status"] == "infeasible" for r in res.values()):
            obj = "infeasible"
        else:
            obj = "-"
        cells.append(f"{obj:>12}")
        cells.append(row["agree_text"])
        print("  ".join(cells))
    # notes: limits, infeasibility reasons, errors, plans
    notes = []
    for row in rows:
        for b, r in row["results"].items():
            if r["hit_limit"]:
                extra = (f"; best objective {r['objective']:.6g}" if r["objective"] is not None
                         else "")
                notes.append(f"{row['gpus']:,} GPUs, {b}: hit the {limit:g} s limit "
                             f"(status {r['status']}{extra})")
            elif r["status"] == "error":
                notes.append(f"{row['gpus']:,} GPUs, {b}: ERROR {r['note']}")
        inf = [r for r in row["results"].values() if r["status"] == "infeasible"]
        if inf:
            msg = inf[0]["note"].removeprefix("error: ")
            notes.append(f"{row['gpus']:,} GPUs: infeasible ({msg[:160]}...); in-solver time not "
                         "reported by plan solve for infeasible instances")
        builds = [f"{b} {fmt_t(r['build_s'])}" for b, r in row["results"].items()
                  if r["build_s"] is not None]
        if builds:
            notes.append(f"{row['gpus']:,} GPUs build_s (model build, not in 'solve'): "
                         + ", ".join(builds))
        plans = {b: r["plan"] for b, r in row["results"].items() if r.get("plan")}
        if plans:
            b, p = next(iter(plans.items()))
            notes.append(f"{row['gpus']:,} GPUs plan ({b}): TP{p['tp']} PP{p['pp']} CP{p['cp']} "
                         f"DP{p['dp']} VP{p['vp']} mb{p['micro_batch']} recompute={p['recompute']}"
                         f" SP={p['sequence_parallel']} DO={p['distributed_optimizer']}")
    print("plans = size of the search space (solver.space.plans: the degree assignments that "
          "keep the structural rules, every global batch of a range, x every knob value; counted "
          "over the rules by plan solve, never listed)")
    print("whole = wall time of the `plan solve` subprocess; solve = solver.solve_s (in-solver); "
          "'>' = stopped at the limit (a lower bound); ratios '<'/'>' inherit that bound.")
    for n in notes:
        print("  - " + n)
    print_targets(rows, backends)
    print_large_space_targets(rows, backends)


#: Issue 10's targets: on spaces of at least this many plans, CP-SAT within TARGET_WHOLE_S
#: whole-process and the enumerator at least ENUM_FACTOR times slower.
LARGE_SPACE = 10**6
TARGET_WHOLE_S = 2.0
ENUM_FACTOR = 3.0


def print_large_space_targets(rows: list[dict], backends: list[str]) -> None:
    """Per instance of >= 10^6 plans: its size, the three whole-process times (medians), the
    ratio enumerate / cpsat, and whether issue 10's targets hold there."""
    big = []
    for r in rows:
        sizes = [x["plans"] for x in r["results"].values() if x.get("plans")]
        if sizes and sizes[0] >= LARGE_SPACE:
            big.append((r, sizes[0]))
    if not big:
        print(f"TARGET (issue 10) on spaces >= {LARGE_SPACE:,} plans: no such instance measured")
        return
    print(f"Instances of >= {LARGE_SPACE:,} plans (whole-process medians; issue 10: cpsat <= "
          f"{TARGET_WHOLE_S:g} s, highs agrees, enumerate >= {ENUM_FACTOR:g}x cpsat):")
    ok_all = True
    for r, size in big:
        res = r["results"]
        times = "  ".join(f"{b} {fmt_t(res[b]['whole_s'], res[b]['hit_limit'])} s"
                          for b in backends if b in res)
        v, txt = ratio(res.get("enumerate"), res.get("cpsat"), "whole_s")
        c = res.get("cpsat")
        ok = (c is not None and c["status"] == "optimal" and not c["hit_limit"]
              and c["whole_s"] <= TARGET_WHOLE_S and v is not None and v >= ENUM_FACTOR
              and r["agree"])
        ok_all &= ok
        print(f"  {_where(r)} GPUs, batch {batch_text(r['global_batch'])}: {size:,} plans; "
              f"{times}; enumerate/cpsat {txt}; agree {r['agree_text']}; "
              f"{'MET' if ok else 'NOT met'}")
    print(f"TARGET (issue 10) on spaces >= {LARGE_SPACE:,} plans: "
          f"{'MET' if ok_all else 'NOT met'} on the {len(big)} instance(s) above")


def _where(row: dict) -> str:
    return (f"{row['model']} " if row.get("tagged") else "") + f"{row['gpus']:,}"


def print_targets(rows: list[dict], backends: list[str]) -> None:
    if not rows:
        return
    top = max(r["gpus"] for r in rows)
    scope = "" if top >= 131072 else f" [measured only up to {top:,} GPUs]"
    met, missed = [], []
    for b in backends:
        vals = [(r["results"][b]["whole_s"], r["gpus"], r["results"][b]["hit_limit"])
                for r in rows if b in r["results"] and r["results"][b]["whole_s"] is not None]
        if not vals:
            continue
        w, g, hit = max(vals)
        at = next(_where(r) for r in rows if r["gpus"] == g and b in r["results"]
                  and r["results"][b]["whole_s"] == w)
        txt = f"{b} (max {fmt_t(w, hit)} s at {at} GPUs)"
        (met if w <= 1.0 and not hit else missed).append(txt)
    print(f"TARGET plan solve <= 1 s whole-process up to 131,072 GPUs{scope}: "
          f"{'MET by ' + ', '.join(met) if met else 'met by no backend'}"
          + (f"; NOT met by {', '.join(missed)}" if missed else ""))
    big = [r for r in rows if r["gpus"] >= 4096]
    if "enumerate" not in backends or not big:
        print("TARGET >= 10x faster than enumeration from 4,096 GPUs up: not measured "
              "(needs enumerate and a size >= 4,096)")
        return
    parts = []
    for o in ("cpsat", "highs"):
        if o not in backends:
            continue
        ok = True
        txts = []
        for key, lab in (("whole_s", "whole"), ("solve_s", "in-solver")):
            rs = []
            for r in big:
                v, s = ratio(r["results"].get("enumerate"), r["results"].get(o), key)
                rs.append(f"{_where(r)}: {s}")
                if v is None or v < 10 or s.startswith(("<", "?")):
                    ok = False
            txts.append(f"{lab} " + ", ".join(rs))
        parts.append(f"{o} {'MET' if ok else 'NOT met'} (enumerate time / {o} time: "
                     + "; ".join(txts) + ")")
    print("TARGET >= 10x faster than enumeration from 4,096 GPUs up: " + " | ".join(parts))


# ---------------------------------------------------------------------------------------------


def host_info() -> str:
    try:
        aff = len(os.sched_getaffinity(0))
    except AttributeError:
        aff = os.cpu_count()
    load = os.getloadavg() if hasattr(os, "getloadavg") else ("?",) * 3
    vers = []
    for pkg in ("ortools", "highspy", "pyomo", "numpy"):
        try:
            vers.append(f"{pkg} {metadata.version(pkg)}")
        except metadata.PackageNotFoundError:
            vers.append(f"{pkg} missing")
    return (f"host: {platform.node()}  CPUs: {os.cpu_count()} (usable {aff})  load avg: "
            + " ".join(f"{x:.2f}" if isinstance(x, float) else x for x in load)
            + f"\nPython {platform.python_version()} ({sys.executable}); " + ", ".join(vers))


ROOT = Path(__file__).resolve().parents[1]


def snapshot(rev: str, dest: Path) -> tuple[dict, str, str]:
    """``git archive REV`` of the project into ``dest``; the environment and working directory
    that make ``plan`` import it (PYTHONPATH precedes the editable install's finder), and a label.
    Formulations/ and planner/ change under our feet on a shared checkout; a snapshot keeps every
    solve of one run on the same code."""
    sha = subprocess.run(["git", "rev-parse", "--short", rev], cwd=ROOT, text=True,
                         capture_output=True, check=True).stdout.strip()
    data = subprocess.run(["git", "archive", "--format=tar", rev], cwd=ROOT,
                          capture_output=True, check=True).stdout
    dest.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        tf.extractall(dest, filter="data")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(x for x in (str(dest), env.get("PYTHONPATH")) if x)
    where = subprocess.run([sys.executable, "-c", "import planner, formulations; "
                            "print(planner.__file__); print(formulations.__file__)"],
                           env=env, cwd=str(dest.parent), text=True, capture_output=True)
    files = where.stdout.split()
    if len(files) != 2 or not all(f.startswith(str(dest)) for f in files):
        raise SystemExit(f"--snapshot: the snapshot at {dest} is not the code plan imports "
                         f"({where.stdout.strip() or where.stderr.strip()})")
    return env, str(dest.parent), f"snapshot of {rev} = {sha} (git archive into {dest})"


def code_revision() -> str:
    """Git revision of the code under test, and whether formulations/ or planner/ are modified
    (other people change them while benchmarks run: print it at the start and the end)."""
    root = ROOT
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, text=True,
                             capture_output=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "formulations", "planner"],
                               cwd=root, text=True, capture_output=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown (no git)"
    return (rev or "unknown") + (" + uncommitted changes in formulations/ or planner/"
                                 if dirty.strip() else " (formulations/, planner/ clean)")


def warm_up(cmd: list[str], tmp: Path, env: dict | None, cwd: str | None) -> None:
    """One untimed import of the heavy modules and one tiny solve: the first process on a cold
    page cache would otherwise pay disk reads the others do not."""
    subprocess.run([sys.executable, "-c", "import ortools.sat.python.cp_model, pyomo.environ, "
                    "highspy, numpy, planner.app.cli, formulations.solve"], capture_output=True,
                   env=env, cwd=cwd)
    f = tmp / "warmup.toml"
    f.write_text('[model]\npreset = "gpt-1.3b"\n[training]\nglobal_batch = 64\n'
                 '[cluster]\ngpu = "a100-80gb"\ngpus = 8\n')
    for b in BACKENDS:
        subprocess.run(cmd + ["solve", str(f), "--solver", b, "--json", "--time-limit", "5"],
                       capture_output=True, timeout=60, env=env, cwd=cwd)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="A,B", help="comma list of A, B (default A,B)")
    ap.add_argument("--gpus", default=",".join(map(str, DEFAULT_GPUS)),
                    help="comma list of GPU counts (default %(default)s)")
    ap.add_argument("--backends", default=",".join(BACKENDS), help="default %(default)s")
    ap.add_argument("--repeat", type=int, default=1, help="runs per case; medians (default 1)")
    ap.add_argument("--time-limit", type=float, default=120.0,
                    help="seconds per solve (passed to the solver; the process is killed at "
                         "limit + grace); default %(default)s")
    ap.add_argument("--grace", type=float, default=None,
                    help="extra seconds before the process is killed (default max(15, limit/4))")
    ap.add_argument("--gpu-a", default="a100-80gb", choices=("a100-80gb", "h100-sxm"),
                    help="GPU of model A (default %(default)s)")
    ap.add_argument("--b-layers", type=int, default=128,
                    help="layers of model B (default 128; 126 is the real preset, solved "
                         "through uneven pipeline layouts)")
    ap.add_argument("--max-cp", type=int, default=None,
                    help="context-parallel cap of both models (default: A 1, B 2); a larger cap "
                         "grows the space by the CP degrees and their splits")
    ap.add_argument("--json", dest="json_out", type=Path, default=None,
                    help="write the raw measurements to this file")
    ap.add_argument("--keep", action="store_true", help="keep the instance TOML directory")
    ap.add_argument("--batch-range", action="store_true",
                    help="let the planner choose the global batch in [B/F, F*B] around each "
                    "size's fixed batch B (objective: time per sequence; F: --batch-factor)")
    ap.add_argument("--batch-factor", type=int, default=4,
                    help="with --batch-range, the range is [B/F, F*B] (default %(default)s)")
    ap.add_argument("--snapshot", metavar="REV", default=None,
                    help="run `plan` on a `git archive REV` copy of the project (e.g. HEAD) instead "
                         "of the live checkout, which others may be editing during the run")
    args = ap.parse_args(argv)

    models = [m.strip().upper() for m in args.models.split(",") if m.strip()]
    bad = [m for m in models if m not in MODELS]
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    badb = [b for b in backends if b not in BACKENDS]
    try:
        gpus = [int(x) for x in args.gpus.split(",") if x.strip()]
    except ValueError:
        ap.error(f"--gpus: expected a comma list of integers, got {args.gpus!r}")
    if bad:
        ap.error(f"--models: unknown {bad}; expected A and/or B")
    if badb:
        ap.error(f"--backends: unknown {badb}; expected some of {', '.join(BACKENDS)}")
    if args.repeat < 1 or args.time_limit <= 0:
        ap.error("--repeat must be >= 1 and --time-limit > 0")
    badg = [g for g in gpus if g <= 0 or (g > GPUS_PER_NODE and g % GPUS_PER_NODE)]
    if badg:
        ap.error(f"--gpus: {badg} do not fill whole nodes of {GPUS_PER_NODE}")
    grace = args.grace if args.grace is not None else max(15.0, args.time_limit / 4)

    cfg = {k: dict(v) for k, v in MODELS.items()}
    cfg["A"]["gpu"] = args.gpu_a
    cfg["B"]["layers"] = args.b_layers if args.b_layers != 126 else None
    if args.max_cp is not None:
        if args.max_cp < 1:
            ap.error("--max-cp must be >= 1")
        for m in cfg.values():
            m["max_cp"] = args.max_cp
    cmd = plan_command()

    print("plan solve scaling benchmark (benchmarks/solve_scaling.py)")
    print(host_info())
    tmp = Path(tempfile.mkdtemp(prefix="solve_scaling_"))
    env, cwd = None, None
    if args.snapshot:
        env, cwd, rev0 = snapshot(args.snapshot, tmp / "code")
    else:
        rev0 = code_revision()
    print(f"code: {rev0}")
    print(f"NOTE: the machine is shared and noisy; every time is the MEDIAN of {args.repeat} "
          f"run(s) (--repeat), and single runs can be off by tens of percent.")
    print(f"command: {' '.join(cmd)} solve FILE --solver B --json --time-limit {args.time_limit:g}"
          f" (killed at {args.time_limit + grace:g} s)")
    print("global batch per size: " + ", ".join(f"{g:,} GPUs -> {global_batch_for(g)}"
                                                for g in gpus)
          + ("  (max(2048, GPUs // 16)); --batch-range: the planner chooses in "
             f"[B/{args.batch_factor}, {args.batch_factor}B], "
             "objective = time per sequence" if args.batch_range else
             "  (max(2048, GPUs // 16), fixed: objective = step time)"))
    print("constraints: schema defaults (no pins; max_cp = 1, micro-batch 1..32, recompute/SP/"
          "distributed optimizer free; tp_within_node = false), "
          + (f"max_cp = {args.max_cp} for both models" if args.max_cp is not None
             else "model B max_cp = 2"))
    sys.stdout.flush()

    all_rows: dict[str, list[dict]] = {}
    raw: list[dict] = []
    t_start = time.perf_counter()
    try:
        warm_up(cmd, tmp, env, cwd)
        for mk in models:
            model = cfg[mk]
            rows = []
            for n in gpus:
                batch = global_batch_for(n)
                if args.batch_range:
                    batch = (batch // args.batch_factor, batch * args.batch_factor)
                f = tmp / f"model{mk}_{n}.toml"
                f.write_text(instance_toml(model, n, batch))
                runs: dict[str, list[dict]] = {b: [] for b in backends}
                for _rep in range(args.repeat):
                    for b in backends:          # interleaved so drift hits every backend alike
                        if runs[b] and runs[b][-1]["hit_limit"]:
                            continue            # one limit hit is enough
                        rec = run_once(cmd + ["solve", str(f), "--solver", b, "--json",
                                              "--time-limit", f"{args.time_limit:g}"],
                                       args.time_limit, grace, env, cwd)
                        runs[b].append(rec)
                        print(f"  [{time.perf_counter() - t_start:7.1f} s] model {mk} "
                              f"{n:>7,} GPUs {b:<9} whole {rec['wall_s']:8.3f} s  solve "
                              f"{fmt_t(rec['solve_s']):>8} s  {rec['status']}"
                              + ("  (LIMIT)" if rec["hit_limit"] else ""),
                              file=sys.stderr, flush=True)
                res = {b: summarise(runs[b]) for b in backends}
                ok, txt = agreement(res)
                rows.append({"model": mk, "gpus": n, "global_batch": batch, "results": res, "agree": ok,
                             "agree_text": txt})
                raw.append({"model": mk, "gpus": n, "global_batch": batch,
                            "instance": f.read_text(), "runs": runs, "summary": res,
                            "agree": ok, "agree_text": txt})
            all_rows[mk] = rows
            print_table(mk, model, rows, backends, args.time_limit, args.repeat)
            sys.stdout.flush()
    finally:
        if args.keep:
            print(f"instances kept in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)

    flat = [r for rows in all_rows.values() for r in rows]
    rev1 = rev0 if args.snapshot else code_revision()
    if rev1 != rev0:
        print(f"\n!! the code changed during the run: {rev0} -> {rev1}; rerun for clean numbers")
    disagree = [(mk, r["gpus"]) for mk, rows in all_rows.items() for r in rows if not r["agree"]]
    print()
    print(f"total benchmark time {time.perf_counter() - t_start:.0f} s; "
          + ("all finished backends agree on every objective" if not disagree
             else "!! DISAGREEMENT at " + ", ".join(f"model {m} {g:,} GPUs" for m, g in disagree)))
    if len(all_rows) > 1:
        print("Both models together (A = model A, B = model B):")
        print_targets([{**r, "tagged": True} for r in flat], backends)
    if args.json_out:
        args.json_out.write_text(json.dumps({
            "config": {"models": {k: cfg[k] for k in models}, "gpus": gpus,
                       "global_batch": {str(g): global_batch_for(g) for g in gpus},
                       "backends": backends, "repeat": args.repeat, "time_limit": args.time_limit,
                       "grace": grace, "command": cmd, "host": host_info(),
                       "code_start": rev0, "code_end": rev1,
                       "rel_tol": REL_TOL, "quantum_factor": QUANTUM_FACTOR},
            "cases": raw}, indent=2))
        print(f"raw measurements written to {args.json_out}")
    return 1 if disagree else 0


if __name__ == "__main__":
    sys.exit(main())

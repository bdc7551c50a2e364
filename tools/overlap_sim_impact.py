"""What the overlap simulations of tests/test_overlap_sim.py would change on the shipped instances.

For each instance and variant: the optimum under the model as it is (``plan solve``, the
enumerator), its step time under the model with the variant's exposed time, and the optimum
re-solved under that variant. The model is not changed: each variant is the text of
planner/model/terms.py with one rule replaced, loaded in a fresh process in place of the module
(``--variant``); the driver (no argument) runs every variant and prints one table.

Variants (the simulations' closed forms; ``--check`` compares each with its simulator on the
tests' grids: the model's own p2p rule (``model``) and tp_userbuffers exactly, p2p_head within
4.3% (its closed form is the limit of short transfers; exact at GPT-3 175B's optimum, transfers
6% of a chunk forward), dp_queue within 1.5% of the queue of the model's buckets):
- ``p2p_head``: overlap_p2p_comm leaves 2 (v p - 1) + max(0, (m - p) v - 1) transfers exposed
  (Megatron-Core's interleaved schedule since Megatron-LM #4047, deallocate_pipeline_outputs on,
  as Megatron-LM's training sets it), not the model's 2 (v p - 1) (the schedule before #4047,
  which the model follows since the simulation showed it; the former variant ``p2p_pre4047``).
- ``tp_userbuffers``: tp_comm_overlap leaves, per pass and block, what Transformer Engine's pairing
  leaves: ring exchange max(0, C - G (t-1)/t), pipelined reduce-scatter max(C/4, C - 3G/4), bulk
  max(0, C - G), each collective with its paired GEMM (dense layers; MoE layers keep the model's
  rule).
- ``dp_queue``: the bucket rule max(unit, raw - window + window unit / raw) (the queue's
  window / n past the window), for every caller of ``exposed`` (the interleaved chunk rule of
  the reduction keeps its window and unit). Megatron's own bucket layout (the embeddings in the
  last bucket) is not a closed form here: tests/test_overlap_sim.py measures it.
The tensor-parallel and data-parallel switches are off in every framework default the instances
use (Megatron-LM: only overlap_p2p_comm), so those variants are also run with the switches pinned
on (``[constraints] tp_comm_overlap = true``, resp. overlap_grad_reduce and overlap_param_gather).

Usage: PYTHONPATH=. python tools/overlap_sim_impact.py            (the table, about a minute)
       PYTHONPATH=. python tools/overlap_sim_impact.py --check    (each variant's closed form
                                                                   against the simulators)
       PYTHONPATH=. python tools/overlap_sim_impact.py --layout   (Megatron's bucket layout on
                                                                   the optima it applies to)
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
INSTANCES = sorted((ROOT / "instances").glob("*.toml"))

P2P_OLD = "+ gt1(v) * 2 * steps(v * p) * pp_step, slow)"
TP_OLD = "tp_layer = hidden_cost(tp_layer, vmax(tp_layer / t, tp_layer - gemm), slow)"
DP_OLD = "return hidden_cost(raw, vmax(raw - window, unit), slowdown) if overlapped else raw"

TP_NEW = """_g = [gemm_s([g], peak_gemm) for g in dense_gemms]          # qkv, proj, fc1, fc2
        def _ring(c, g):
            return vmax(0.0, c - g * ring_share(t))
        def _pipe(c, g):
            return vmax(c / 4, c - 0.75 * g)
        def _bulk(c, g):
            return vmax(0.0, c - g)
        _fwd = (_ring(tp_ag, _g[0]) + _pipe(tp_rs, _g[1]) + _ring(tp_ag, _g[2])
                + _pipe(tp_rs, _g[3]))
        _bwd = (_ring(tp_ag, _g[3]) + _bulk(tp_rs, _g[2]) + _ring(tp_ag, _g[1])
                + _bulk(tp_rs, _g[0]))
        tp_layer = hidden_cost(tp_layer, (passes - 2) * _fwd + _bwd, slow)"""

PATCHES = {
    "model": [],
    "p2p_head": [(P2P_OLD, "+ gt1(v) * (2 * (v * p - 1) + vmax(0.0, (m - p) * v - 1)) * pp_step, "
                           "slow)")],
    "tp_userbuffers": [(TP_OLD, TP_NEW)],
    "dp_queue": [(DP_OLD, "return hidden_cost(raw, vmax(unit, raw - window + window * unit "
                          "/ vmax(raw, 1e-30)), slowdown) if overlapped else raw")],
}
PINS = {
    "tp_userbuffers": {"tp_comm_overlap": True},
    "dp_queue": {"overlap_grad_reduce": True, "overlap_param_gather": True},
}


def load_patched(variant: str) -> None:
    """planner.model.terms with the variant's rule, registered before anything imports it."""
    spec = importlib.util.find_spec("planner.model.terms")
    src = Path(spec.origin).read_text()
    for old, new in PATCHES[variant]:
        assert src.count(old) == 1, (variant, old)
        src = src.replace(old, new)
    mod = types.ModuleType("planner.model.terms")
    mod.__file__ = spec.origin
    sys.modules["planner.model.terms"] = mod
    exec(compile(src, spec.origin, "exec"), mod.__dict__)
    import planner.model
    planner.model.terms = mod


def run(variant: str, pins: str, baseline: str | None) -> list[dict]:
    """In this process (terms patched for ``variant``; the pins of variant ``pins`` applied, or
    none): per instance, the optimum solved here and, given the model's optima
    (``baseline``, a JSON file of the model's run), each one's step time here."""
    load_patched(variant)
    import dataclasses

    from formulations.solve import solve
    from planner.model.evaluate import evaluate
    from planner.model.instance import load_instance
    from planner.model.plan import Plan

    base = json.loads(Path(baseline).read_text()) if baseline else {}
    rows = []
    for path in INSTANCES:
        inst = load_instance(path)
        if pins in PINS:
            inst = inst.with_spec(constraints=inst.spec.constraints.model_copy(
                update=PINS[pins]))
        row = {"instance": path.name}
        try:
            res = solve(inst, "enumerate", explain=False)
        except Exception as exc:           # (no plan under the pins)
            rows.append({**row, "error": str(exc)[:100]})
            continue
        row.update(label=res.report.plan.label(), step=res.report.step_time_s,
                   terms=res.report.breakdown_s, plan=dataclasses.asdict(res.report.plan))
        if path.name in base and "plan" in base[path.name]:
            rep = evaluate(inst, Plan(**base[path.name]["plan"]))
            row.update(base_step_here=rep.step_time_s, base_terms_here=rep.breakdown_s)
        rows.append(row)
    return rows


def call(variant: str, pins: str, baseline: Path | None = None) -> list[dict]:
    cmd = [sys.executable, __file__, "--variant", variant, "--pins", pins]
    if baseline:
        cmd += ["--baseline", str(baseline)]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    if out.returncode:
        raise SystemExit(out.stderr)
    return json.loads(out.stdout)


SCENARIOS = [("none", ["p2p_head", "tp_userbuffers", "dp_queue"]),
             ("tp_userbuffers", ["tp_userbuffers"]), ("dp_queue", ["dp_queue"])]


def driver() -> None:
    import tempfile

    print("| instance | pins | variant | model's optimum | its step, model -> variant | "
          "optimum under the variant (step, vs the model's optimum) |")
    print("|---|---|---|---|---|---|")
    for pins, variants in SCENARIOS:
        model_rows = call("model", pins)
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as fh:
            json.dump({r["instance"]: r for r in model_rows}, fh)
        for variant in variants:
            for m, v in zip(model_rows, call(variant, pins, Path(fh.name))):
                if "error" in m:
                    print(f"| {m['instance']} | {pins} | {variant} | {m['error']} | | |")
                    continue
                same = v["base_step_here"]
                changed = v["label"] != m["label"]
                print(f"| {m['instance']} | {pins} | {variant} | {m['label']} | "
                      f"{m['step']:.4f} -> {same:.4f} s ({100 * (same / m['step'] - 1):+.2f}%) | "
                      f"{v['label'] if changed else 'same plan'} {v['step']:.4f} s "
                      f"({100 * (v['step'] / m['step'] - 1):+.2f}%) |")


def check(variant: str) -> None:
    """The variant's closed form against the simulators of tests/test_overlap_sim.py on the
    tests' grids (the model's own instances, the variant's terms): the largest relative gap."""
    load_patched(variant)
    sys.path.insert(0, str(ROOT / "tests"))
    import test_overlap_sim as t

    if variant in ("model", "p2p_head"):      # (the model's own p2p rule: the schedule before #4047)
        cases = [t.p2p_case(*c, at_once=variant == "p2p_head") for c in t.P2P_CASES]
    elif variant == "tp_userbuffers":
        cases = [t.tp_case(tp, bw, rc) for tp in (2, 4, 8, 16) for bw in (8.0, 2.0, 0.5, 0.1)
                 for rc in ("none", "full")]
    else:
        cases = [t.dp_case(*c) for c in t.AGREE + t.OUTLAST]
    gap = max(abs(c[1] / c[0] - 1) for c in cases)
    print(f"{variant}: the variant's term against the simulation, {len(cases)} cases: "
          f"largest relative gap {gap:.2e}")


def layout() -> None:
    """Megatron's bucket layout (tests/test_overlap_sim.py, the embeddings in the last bucket)
    on the optima with overlap_grad_reduce and overlap_param_gather pinned on that it applies
    to (one pipeline stage, dense, no recompute: the simulation's backward): the exposed
    reduce-scatter and all-gather of the simulated buckets in place of the model's, at the
    model's price of overlap. The raw halves are split by their bytes (gradients of
    ``reduce_dtype`` against 16-bit parameters); a bucket is max(40M, 1M dp) parameters."""
    import dataclasses

    sys.path.insert(0, str(ROOT / "tests"))
    import test_overlap_sim as t
    from formulations.solve import solve
    from planner.model.evaluate import evaluate
    from planner.model.instance import load_instance
    from planner.model.terms import reduce_dtype, step_terms
    from planner.model.workload import Shape

    for path in INSTANCES:
        inst = load_instance(path)
        inst = inst.with_spec(constraints=inst.spec.constraints.model_copy(
            update=PINS["dp_queue"]))
        plan = solve(inst, "enumerate", explain=False).report.plan
        sh = Shape.of(inst.model)
        if plan.pp > 1 or sh.n_moe or plan.recompute != "none":
            print(f"{path.name}: {plan.label()}, not simulated (pipeline, MoE or recompute)")
            continue
        off = dataclasses.replace(plan, overlap_grad_reduce=False, overlap_param_gather=False)
        raw = evaluate(inst, off).breakdown_s["dp_comm"]
        on = evaluate(inst, plan)
        s_ = inst.hw.overlap_slowdown
        f = s_ / (1 + s_)
        shown_model = (on.breakdown_s["dp_comm"] - f * raw) / (1 - f)
        gw = 4 if reduce_dtype(inst) == "fp32" else 2
        halves = [raw * gw / (gw + 2), raw * 2 / (gw + 2)] if plan.distributed_optimizer \
            else [raw, 0.0]
        terms = step_terms(inst, plan.grid.degrees(), plan.knobs)
        names, numel, weight = t.gpt_tensors(sh, plan.tp)
        layer_w = sum(weight[names.index(f"0.{n}")]
                      for n in ("qkv.weight", "proj.weight", "fc1.weight", "fc2.weight"))
        # forward seconds per weight: a layer's third of its compute (3 passes), the logits'
        # a third of the layer's GEMMs scaled by the output layer's weights; backward twice
        per_w = terms.layer["compute"] / 3 / layer_w
        per_w_logits = terms.layer["gemm"] / 3 / layer_w
        fwd = [w * (per_w_logits if n == "output_layer" else per_w)
               for n, w in zip(names, weight)]
        bwd = [2 * x for x in fwd]
        buckets = t.megatron_buckets(numel, max(40e6, 1e6 * plan.dp))
        params = (sh.L * sh.layer_params + sh.embedding_params + sh.norm
                  + (0 if sh.tied else sh.V * sh.h)) / plan.tp
        sizes = [sum(numel[i] for i in b) for b in buckets]
        sim = t.grad_reduce_exposed(bwd, buckets, [halves[0] / params * x for x in sizes])
        if plan.distributed_optimizer:
            sim += t.param_gather_exposed(fwd, buckets, [halves[1] / params * x for x in sizes])
        delta = (1 - f) * (sim - shown_model)
        print(f"{path.name}: {plan.label()}, {len(buckets)} buckets, the last "
              f"{sizes[-1] / 1e6:.1f}M: exposed {shown_model * 1e3:.2f} ms (model) -> "
              f"{sim * 1e3:.2f} ms (simulated); step {on.step_time_s:.4f} -> "
              f"{on.step_time_s + delta:.4f} s ({100 * delta / on.step_time_s:+.3f}%)")


if __name__ == "__main__":
    if "--layout" in sys.argv:
        layout()
    elif "--check" in sys.argv:
        for name in ("model", "p2p_head", "tp_userbuffers", "dp_queue"):
            subprocess.run([sys.executable, __file__, "--check-one", name], cwd=ROOT,
                           env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, check=True)
    elif "--check-one" in sys.argv:
        check(sys.argv[sys.argv.index("--check-one") + 1])
    elif "--variant" in sys.argv:
        arg = dict(zip(sys.argv[1::2], sys.argv[2::2]))
        print(json.dumps(run(arg["--variant"], arg["--pins"], arg.get("--baseline")),
                         default=str))
    else:
        driver()

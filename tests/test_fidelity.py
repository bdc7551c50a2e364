"""The knobs the model used to ignore (issue 12): micro-batch size at pp = 1 through the GEMM size
curve, selective recompute under fused attention, the exposed context-parallel exchange, the
per-GPU memory reserve and the headroom in every result."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from planner.app.cli import app
from planner.model.evaluate import evaluate
from planner.model.plan import Knobs
from planner.model.terms import step_terms
from planner.model.instance import load_instance, parse_instance
from planner.model.plan import plan_from_spec
from planner.model.schema import default_reserve_GiB

ROOT = Path(__file__).resolve().parents[1]
SMALL = ROOT / "instances" / "gpt-1.3b-1node.toml"
GPT3 = ROOT / "instances" / "gpt3-175b-a100.toml"


def _step(inst, **over):
    plan = plan_from_spec(inst, inst.spec.plan, **over)
    return evaluate(inst, plan, spec=inst.spec.plan)


def test_micro_batch_changes_the_step_at_pp1():
    """One node, pp = 1: fewer, larger GEMMs per step run closer to the GPU's asymptote, so the
    step time falls strictly with the micro-batch (it was flat before the size curve)."""
    inst = load_instance(SMALL)
    times = [_step(inst, micro_batch=b).step_time_s for b in (1, 2, 4, 8, 16)]
    assert all(a > b for a, b in zip(times, times[1:])), times
    assert times[0] / times[-1] > 1.02          # a visible effect, not rounding


def test_gemm_curve_reaches_the_asymptote_on_large_gemms():
    """Efficiency per GEMM is efficiency * M/(M+kt) * N/(N+kw) * K/(K+kw): the GEMM share of
    the layer time per FLOP shrinks toward 1 / (peak * efficiency) as the GEMMs grow."""
    inst = load_instance(SMALL)
    hw = inst.hw
    assert hw.knee_tokens > 0 and hw.knee_width > 0

    def per_flop(b):
        plan = plan_from_spec(inst, inst.spec.plan, micro_batch=b)
        tm = step_terms(inst, plan.grid.degrees(), Knobs(plan.recompute))
        from planner.model.workload import Shape
        return tm.layer["gemm"] / (3 * Shape.of(inst.model).gemm_flops(b))

    flat = 1 / (hw.peak * hw.efficiency)
    assert per_flop(1) > per_flop(4) > per_flop(32) > flat


def test_selective_recompute_costs_time_with_flash_attention():
    """With fused attention selective recompute saves no memory and re-runs the attention
    forward: it is slower than no recompute, so the two are no longer the same plan."""
    inst = load_instance(GPT3)
    none = _step(inst, recompute="none")
    sel = _step(inst, recompute="selective")
    assert inst.spec.training.flash_attention
    assert sel.step_time_s > none.step_time_s
    assert sel.memory_gib["activations"] == pytest.approx(none.memory_gib["activations"])


def test_top5_lists_distinct_plans(tmp_path):
    """Before, selective recompute was free under flash attention: the same degrees appeared
    twice in a row at one step time (recompute none, then selective). (ZeRO-1 pinned: the
    recompute modes are the point; the enumerator lists them: the model is the subject here,
    the solvers' top-k is tests/test_cli.py's)"""
    toml = tmp_path / "gpt3.toml"
    toml.write_text(GPT3.read_text().replace("[constraints]",
                                             '[constraints]\ndp_sharding = "optim"', 1))
    res = CliRunner().invoke(app, ["solve", str(toml), "--top", "5", "--json",
                                 "--solver", "enumerate"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    times = [p["step_time_s"] for p in data["top"]]
    assert len(times) == 5
    # never equal step times between recompute modes of the same degrees
    for a, b in zip(data["top"], data["top"][1:]):
        if round(a["step_time_s"], 9) == round(b["step_time_s"], 9):
            pa, pb = a["plan"], b["plan"]
            assert pa["recompute"] == pb["recompute"], (pa, pb)


def test_cp_exchange_shows_in_the_breakdown():
    """Even where the K/V ring hides behind the attention core, the last backward hop (the K/V
    gradients going home) is exposed: cp_comm > 0 whenever cp > 1."""
    doc = {"model": {"preset": "llama3-8b", "seq_len": 16384},
           "training": {"global_batch": 8}, "cluster": {"gpu": "h100-sxm", "nodes": 1},
           "constraints": {"max_cp": 2},
           "plan": {"tp": 4, "cp": 2, "pp": 1, "dp": 1, "micro_batch": 1,
                    "sequence_parallel": True}}
    inst = parse_instance(doc)
    rep = evaluate(inst, plan_from_spec(inst, inst.spec.plan))
    assert rep.breakdown_s["cp_comm"] > 0
    no_cp = parse_instance({**doc, "plan": {**doc["plan"], "cp": 1, "dp": 2}})
    assert evaluate(no_cp, plan_from_spec(no_cp, no_cp.spec.plan)).breakdown_s["cp_comm"] == 0


def test_reserve_default_depends_on_the_gpu_and_the_key_overrides_it():
    inst = load_instance(SMALL)
    rep = _step(inst)
    cap = inst.hw.gpu.hbm_capacity_GiB
    assert rep.memory_gib["reserve"] == pytest.approx(default_reserve_GiB(cap))
    assert 4 < default_reserve_GiB(80.0) < 8            # CUDA context + NCCL + fragmentation
    assert default_reserve_GiB(192.0) > default_reserve_GiB(80.0)
    doc = {"model": {"preset": "gpt-1.3b"}, "training": {"global_batch": 512},
           "cluster": {"gpu": "a100-80gb", "nodes": 1},
           "constraints": {"memory_reserve_GiB": 1.5},
           "plan": {"tp": 1, "pp": 1, "dp": 8, "micro_batch": 8}}
    inst2 = parse_instance(doc)
    assert _step(inst2).memory_gib["reserve"] == 1.5



def test_expandable_segments_leave_the_reserve_its_fixed_part():
    """``[training] expandable_segments``: PyTorch's allocator grows one virtual segment per
    pool and stream, so the reserve keeps the CUDA context and NCCL (2 GiB) and no share of
    the capacity for fragmentation; an explicit memory_reserve_GiB still wins, and the launch
    exports say the setting the limit assumes (the megatron one sets it)."""
    from planner.app.emit import emit
    doc = {"model": {"preset": "gpt-1.3b"},
           "training": {"global_batch": 512, "expandable_segments": True},
           "cluster": {"gpu": "a100-80gb", "nodes": 1},
           "plan": {"tp": 1, "pp": 1, "dp": 8, "micro_batch": 8}}
    inst = parse_instance(doc)
    rep = _step(inst)
    plain = _step(parse_instance({**doc, "training": {"global_batch": 512}}))
    assert rep.memory_gib["reserve"] == pytest.approx(2.0)
    assert plain.memory_gib["reserve"] - rep.memory_gib["reserve"] == pytest.approx(
        0.05 * inst.hw.gpu.hbm_capacity_GiB, abs=0.01)
    assert rep.memory_gib["total"] == plain.memory_gib["total"]
    pinned = parse_instance({**doc, "constraints": {"memory_reserve_GiB": 4.0}})
    assert _step(pinned).memory_gib["reserve"] == 4.0
    plan = plan_from_spec(inst, inst.spec.plan)
    assert "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in emit(inst, plan, "megatron")
    ddp = plan_from_spec(inst, inst.spec.plan, dp_sharding="none")    # (torchtitan's DDP)
    for fmt in ("nemo", "torchtitan", "deepspeed"):
        assert "expandable_segments:True" in emit(inst, ddp, fmt), fmt
    assert "expandable_segments" not in emit(parse_instance({**doc, "training": {
        "global_batch": 512}}), plan, "megatron")


@pytest.mark.parametrize("path", sorted((ROOT / "instances").glob("*.toml")))
def test_headroom_in_every_result(path):
    res = CliRunner().invoke(app, ["evaluate", str(path), "--json"])
    data = json.loads(res.stdout)
    if "error" in data:
        pytest.skip(data["error"])
    mem = data["memory_gib"]
    assert mem["headroom"] == pytest.approx(mem["limit"] - mem["total"])
    assert (mem["headroom"] >= 0) == (not any(v.startswith("memory") for v in data["violations"]))


def test_tp_across_infiniband_loses_on_its_collectives():
    """A 1T model on 32 A100 nodes with no constraint: the optimum keeps TP inside the node. The
    TP32 plan the flat model chose loses on its tensor-parallel collectives across the NICs
    (at the bus bandwidth NCCL reaches), not on a rule."""
    from formulations.solve import solve
    from planner.model.schema import PlanSpec

    doc = {"model": {"preset": "megatron-1t"}, "training": {"global_batch": 512},
           "cluster": {"gpu": "a100-80gb", "nodes": 32},
           # both plans without host offload (the TP32 plan is the flat model's, without it)
           "constraints": {"optimizer_offload": False, "offload_layers": 0}}
    inst = parse_instance(doc)
    best = solve(inst).report
    assert best.plan.tp <= 8 and best.plan.tp == best.plan.tp_intra
    tp32 = evaluate(inst, plan_from_spec(inst, PlanSpec(
        tp=32, pp=8, dp=1, vp=4, micro_batch=1, recompute="none", sequence_parallel=True,
        distributed_optimizer=True)))
    assert tp32.step_time_s > best.step_time_s
    assert tp32.breakdown_s["tp_comm"] > 3 * best.breakdown_s["tp_comm"]
    assert tp32.breakdown_s["tp_comm"] > tp32.step_time_s - best.step_time_s

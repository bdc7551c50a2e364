"""overlap_moe_expert_parallel_comm: Megatron-Core's batch-level overlap of the expert
all-to-alls (the combined 1F1B schedule), its cost rule (docs/model.md, "Overlap"), the plans
Megatron-Core refuses it on, and the exports. The three backends' agreement with the switch on
is in tests/test_solvers.py; that it never costs time or memory, in tests/test_dominance.py."""

import pytest

from planner.model.errors import InputError
from planner.model.evaluate import evaluate
from planner.model.instance import parse_instance
from planner.model.plan import plan_from_spec

#: 16 experts of 4096 on 16 H100 in two nodes, no tensor parallelism: each GPU holds one
#: expert per layer and sends its tokens' copies to the other fifteen
MODEL = {"layers": 8, "hidden": 4096, "heads": 32, "kv_heads": 8, "vocab": 32000,
         "seq_len": 4096, "experts": 16, "top_k": 2, "moe_ffn_hidden": 4096}


def report(plan: dict, gpus: int = 16, model: dict | None = None, **flags):
    inst = parse_instance({"model": model or MODEL, "training": {"global_batch": 256},
                           "cluster": {"gpu": "h100-sxm", "gpus": gpus},
                           "plan": {"recompute": "none", **plan}})
    return evaluate(inst, plan_from_spec(inst, inst.spec.plan, **flags), spec=inst.spec.plan)


def test_without_a_pipeline_only_the_first_forward_and_last_backward_stay_exposed():
    """At pp = 1 the schedule pairs the forward of micro-batch i + 1 with the backward of
    micro-batch i: of m micro-batches' all-to-alls, one micro-batch's (the first forward, the
    last backward) has no other micro-batch's compute beside it. With experts inside a node
    (NVLink) the layer's compute outlasts its all-to-all, so everything else hides, at the
    price of overlap (the collectives slow the compute they run beside: hardware catalog
    overlap_slowdown): exposed = raw / m + f (raw - raw / m), f = s / (1 + s)."""
    plan = {"tp": 1, "pp": 1, "dp": 8, "ep": 8, "micro_batch": 1}
    off = report(plan, gpus=8, overlap_moe_expert_parallel_comm=False)
    on = report(plan, gpus=8, overlap_moe_expert_parallel_comm=True)
    raw = off.breakdown_s["ep_comm"]
    m = 256 // 8
    s = 0.189                                    # h100-sxm.toml overlap_slowdown
    f = s / (1 + s)
    assert raw > 0 and on.plan.overlap_moe_expert_parallel_comm
    assert on.breakdown_s["ep_comm"] == pytest.approx(raw / m + f * (raw - raw / m), rel=1e-9)
    assert on.breakdown_s["compute"] == off.breakdown_s["compute"]


def test_an_all_to_all_longer_than_the_compute_leaves_the_difference_exposed():
    """Across nodes the all-to-all outlasts the layer's compute: the overlap hides no more than
    that compute per paired micro-batch, so what it saves grows with the compute, not with the
    all-to-all (narrower experts, less to hide behind)."""
    plan = {"tp": 1, "pp": 1, "dp": 16, "ep": 16, "micro_batch": 1}
    saved = []
    for width in (1024, 512):                    # top 8 of 16 narrow experts: a2a-bound
        model = {**MODEL, "top_k": 8, "moe_ffn_hidden": width}
        off = report(plan, model=model, overlap_moe_expert_parallel_comm=False)
        on = report(plan, model=model, overlap_moe_expert_parallel_comm=True)
        assert off.breakdown_s["ep_comm"] > off.breakdown_s["compute"]
        assert 0 < on.breakdown_s["ep_comm"] < off.breakdown_s["ep_comm"]
        saved.append(off.breakdown_s["ep_comm"] - on.breakdown_s["ep_comm"])
    assert saved[1] < saved[0]


def test_a_pipeline_without_interleaving_is_refused_and_never_costed():
    """Megatron-Core asserts the interleaved schedule for it when pipelined (and expert
    parallelism, and no full recompute): a [plan] that asks for it there is an input error,
    and a framework default or pin over such plans leaves the plan's switch off, its cost the
    raw all-to-all."""
    plain = {"tp": 1, "pp": 2, "dp": 8, "ep": 8, "vp": 1, "micro_batch": 1}
    with pytest.raises(InputError, match="interleaved schedule at pp = 2"):
        report(plain, overlap_moe_expert_parallel_comm=True)
    with pytest.raises(InputError, match="expert parallelism"):
        report({**plain, "pp": 1, "ep": 1}, overlap_moe_expert_parallel_comm=True)
    with pytest.raises(InputError, match="full"):
        report({**plain, "pp": 1, "recompute": "full"}, overlap_moe_expert_parallel_comm=True)
    inst = parse_instance({"model": MODEL, "training": {"global_batch": 256},
                           "cluster": {"gpu": "h100-sxm", "gpus": 16},
                           "constraints": {"overlap_moe_expert_parallel_comm": True},
                           "plan": {"recompute": "none", **plain}})
    rep = evaluate(inst, plan_from_spec(inst, inst.spec.plan), spec=inst.spec.plan)
    off = report(plain, overlap_moe_expert_parallel_comm=False)
    assert not rep.plan.overlap_moe_expert_parallel_comm
    assert rep.breakdown_s["ep_comm"] == off.breakdown_s["ep_comm"]
    interleaved = report({**plain, "vp": 2}, overlap_moe_expert_parallel_comm=True)
    assert interleaved.plan.overlap_moe_expert_parallel_comm


def test_exports_carry_the_switch_or_say_they_cannot():
    """Megatron-LM: --overlap-moe-expert-parallel-comm --delay-wgrad-compute (Megatron-Core's
    MoE README); NeMo: the two ModelParallelConfig fields; torchtitan has no such overlap and
    says so."""
    from planner.app.emit import emit
    inst = parse_instance({"model": MODEL, "training": {"global_batch": 256},
                           "cluster": {"gpu": "h100-sxm", "gpus": 16},
                           "plan": {"recompute": "none", "tp": 1, "pp": 1, "dp": 16, "ep": 16,
                                    "micro_batch": 1, "dp_sharding": "none",
                                    "overlap_moe_expert_parallel_comm": True}})
    plan = plan_from_spec(inst, inst.spec.plan)
    megatron = emit(inst, plan, "megatron")
    assert "--overlap-moe-expert-parallel-comm" in megatron and "--delay-wgrad-compute" in megatron
    nemo = emit(inst, plan, "nemo")
    assert "overlap_moe_expert_parallel_comm: true" in nemo and "delay_wgrad_compute: true" in nemo
    fsdp = plan_from_spec(inst, inst.spec.plan, dp_sharding="optim_grads_params")
    titan = emit(inst, fsdp, "torchtitan")        # (its experts live in the FSDP mesh)
    assert "overlap_moe_expert_parallel_comm: cannot express" in titan
    off = plan_from_spec(inst, inst.spec.plan, overlap_moe_expert_parallel_comm=False)
    assert "moe-expert-parallel-comm" not in emit(inst, off, "megatron")

"""Data-parallel sharding (ZeRO-0..3, FSDP2, HSDP): the ladder of modes on one plan, hand
computations from the ZeRO paper and the FSDP2 design, the search choosing the mode, the
framework rules and the exports."""

from __future__ import annotations

import pytest

from formulations.solve import solve
from planner.app.emit import emit
from planner.model.errors import InputError
from planner.model.evaluate import evaluate
from planner.model.frameworks import SHARDING_MODES
from planner.model.instance import parse_instance
from planner.model.plan import plan_from_spec
from planner.model.terms import internode_bytes, step_terms
from planner.model.workload import Shape

# a Llama-2-13B shape (torchtitan's llama2 13B flavor: 40 layers, hidden 5120, 40 heads,
# ffn 13824, SwiGLU, vocab 32000)
LLAMA13B = {"layers": 40, "hidden": 5120, "heads": 40, "ffn_hidden": 13824, "gated_mlp": True,
            "vocab": 32000, "seq_len": 4096, "tied_embeddings": False,
            "position_embedding": "rope", "dropout": False}


def inst_of(plan=None, training=None, cluster=None, constraints=None, model=None):
    doc = {"model": model or LLAMA13B,
           "training": {"global_batch": 16, **(training or {})},
           "cluster": cluster or {"gpu": "a100-80gb", "nodes": 2},
           "constraints": constraints or {}}
    if plan is not None:
        doc["plan"] = plan
    return parse_instance(doc)


def report(inst, **over):
    return evaluate(inst, plan_from_spec(inst, inst.spec.plan, **over))


def test_the_ladder_trades_memory_for_traffic():
    """For the same plan: memory falls and bytes on the network never fall down the ladder
    none -> optim -> optim_grads -> optim_grads_params, and fully sharding moves more (16-bit
    reduction, one micro-batch, so every mode's gradient pass moves the same bytes). The
    gradients are reduced bucket by bucket during the backward (overlap_grad_reduce): reduced
    after it, ZeRO-2's gradients are whole at the memory peak and it saves nothing over ZeRO-1."""
    inst = inst_of(plan={"tp": 1, "pp": 1, "dp": 16, "micro_batch": 1},
                   training={"grad_reduce_dtype": "bf16"})
    mems, traffic = [], []
    for mode in SHARDING_MODES:
        plan = plan_from_spec(inst, inst.spec.plan, dp_sharding=mode, overlap_grad_reduce=True)
        mems.append(evaluate(inst, plan).memory_gib["total"])
        traffic.append(float(internode_bytes(inst, plan.grid.degrees(), plan.knobs)))
    assert all(a > b for a, b in zip(mems, mems[1:])), mems
    assert all(a <= b * (1 + 1e-12) for a, b in zip(traffic, traffic[1:])), traffic
    assert traffic[-1] > traffic[0] * 1.4


def test_zero3_moves_one_and_a_half_times_plain_data_parallel():
    """ZeRO paper (Rajbhandari et al. 2020, Sec. 7.2.2): ZeRO-3 all-gathers the parameters in
    forward and again in backward and reduce-scatters the gradients: 3 x Psi per step against
    plain data parallelism's all-reduce of 2 x Psi, 1.5x. Here on a pure inter-node group
    (tp = 8 fills each node), 16-bit everywhere, one micro-batch."""
    inst = inst_of(plan={"tp": 8, "pp": 1, "dp": 2, "micro_batch": 8},
                   training={"grad_reduce_dtype": "bf16"})
    base = plan_from_spec(inst, inst.spec.plan, dp_sharding="none")
    full = plan_from_spec(inst, inst.spec.plan, dp_sharding="optim_grads_params",
                          reshard_after_forward=True)
    assert base.micro_batches == 1 and base.dp_intra == 1
    b0 = float(internode_bytes(inst, base.grid.degrees(), base.knobs))
    b3 = float(internode_bytes(inst, full.grid.degrees(), full.knobs))
    assert b3 == pytest.approx(1.5 * b0, rel=1e-9)
    # by hand: the all-reduce of 2-byte gradients over 2 ranks sends (2-1)/2 * 2 = 1x the
    # buffer per GPU, P/8 parameters of the stage
    params_gpu = (Shape.of(inst.model).total_params) / 8
    assert b0 == pytest.approx(2 * params_gpu * 2 * (1 / 2), rel=2e-3)


def test_fsdp_bytes_per_parameter():
    """Sharded states per parameter over d ranks, t = p = 1, by hand: Megatron's
    distributed-optimizer table for ZeRO-1 (bf16, fp32 gradients: 6 + 12/d); ZeRO-3 under
    Megatron-FSDP / DeepSpeed 18/d (16-bit shard, fp32 gradient and optimizer shards); under
    PyTorch FSDP2 (torchtitan) 16/d: the fp32 master is the shard (FSDP2 design,
    MixedPrecisionPolicy casts the gathered parameters to bf16), plus the working set."""
    d = 16
    for fw, sharded in (("megatron", 18), ("torchtitan", 16)):
        inst = inst_of(plan={"tp": 1, "pp": 1, "dp": d, "micro_batch": 1},
                       constraints={"framework": fw})
        sh = Shape.of(inst.model)
        plan = plan_from_spec(inst, inst.spec.plan, dp_sharding="optim_grads_params")
        mem = step_terms(inst, plan.grid.degrees(), plan.knobs).memory["first"]
        states = mem["weights"] + mem["gradients"] + mem["optimizer_states"]
        layer = sh.layer_params
        working = 2 * (2 * layer + sh.V * sh.h + 2 * sh.h) + 4 * layer  # 2 layers + head, 1 grad
        per_gpu_params = sh.total_params           # first stage of pp = 1: the whole model
        assert states == pytest.approx(sharded * per_gpu_params / d + working, rel=1e-3), fw
    inst = inst_of(plan={"tp": 1, "pp": 1, "dp": d, "micro_batch": 1})
    plan = plan_from_spec(inst, inst.spec.plan, dp_sharding="optim")
    mem = step_terms(inst, plan.grid.degrees(), plan.knobs).memory["first"]
    states = mem["weights"] + mem["gradients"] + mem["optimizer_states"]
    assert states / Shape.of(inst.model).total_params == pytest.approx(6 + 12 / d, rel=1e-12)


def test_reshard_after_forward_trades_gathers_for_memory():
    inst = inst_of(plan={"tp": 1, "pp": 1, "dp": 16, "micro_batch": 1,
                         "dp_sharding": "optim_grads_params"})
    on, off = report(inst, reshard_after_forward=True), report(inst, reshard_after_forward=False)
    assert on.memory_gib["weights"] < off.memory_gib["weights"]
    assert on.breakdown_s["dp_comm"] >= off.breakdown_s["dp_comm"]
    # the default follows torchtitan: resharded without pipeline parallelism, kept with it
    assert plan_from_spec(inst, inst.spec.plan).reshard_after_forward is True
    assert plan_from_spec(inst, inst.spec.plan, pp=2, dp=8).reshard_after_forward is False


def test_hsdp_replicas_add_an_all_reduce_across_nodes():
    """HSDP on 2 nodes, 4 micro-batches: sharding inside a node (dp_shard_size 8) keeps the
    per-micro-batch gathers and reduce-scatters on NVLink and adds one all-reduce of the shard
    across the 2 replicas. By hand, per GPU across nodes (P parameters, 8 GPUs per node, fp32
    reduction): full sharding gathers 2-byte parameters twice per micro-batch, (2P/8)(1/2)
    each, and reduce-scatters 4-byte gradients after every micro-batch's backward (Megatron-FSDP,
    the default framework), (4P/8)(1/2) each: 4 * P/4 + 4 * P/4, or 4 * P/4 + P/4 reduced once
    per step (``[training] grad_reduce_every_microbatch = false``); HSDP all-reduces the 4P/8
    shard over 2 replicas, 2 (1/2) 4P/8 = P/2."""
    P = None
    for every, reduces in ((None, 4), (False, 1)):
        training = {"global_batch": 64, **({} if every is None
                                           else {"grad_reduce_every_microbatch": every})}
        inst = inst_of(plan={"tp": 1, "pp": 1, "dp": 16, "micro_batch": 1,
                             "dp_sharding": "optim_grads_params"}, training=training)
        full, hsdp = report(inst), report(inst, dp_shard_size=8)
        assert hsdp.plan.dp_replicate == 2 and hsdp.plan.to_dict()["dp_shard_size"] == 8
        assert hsdp.memory_gib["total"] > full.memory_gib["total"]
        bytes_full = float(internode_bytes(inst, full.plan.grid.degrees(), full.plan.knobs))
        bytes_hsdp = float(internode_bytes(inst, hsdp.plan.grid.degrees(), hsdp.plan.knobs))
        P = Shape.of(inst.model).total_params
        assert bytes_full == pytest.approx(4 * P / 4 + reduces * P / 4, rel=1e-9)
        assert bytes_hsdp == pytest.approx(P / 2, rel=1e-9)
        # and the gradients at the last backward: the 4P/16 shard and one layer's unsharded
        # when reduce-scattered every micro-batch, whole (4P) when they accumulate unsharded
        grads = full.memory_gib["gradients"] * 2**30
        layer = 4 * Shape.of(inst.model).layer_params
        assert grads == pytest.approx(4 * P / 16 + layer if reduces == 4 else 4 * P, rel=1e-9)
    bad = report(inst, dp_shard_size=4)          # a shard group smaller than the node's ranks
    assert any("dp_shard_size = 4" in v for v in bad.violations)


def test_torchtitan_pipelined_stages_hold_their_gradients_whole():
    """torch.distributed.pipelining runs a stage's FSDP2 backwards with gradient sync off and
    reduces once after the stage's last micro-batch (torch stage.py backward_maybe_with_nosync;
    FSDP2 accumulates the unsharded gradients in its fp32 reduce dtype): under torchtitan a
    pipelined stage holds the fp32 gradients of all its layers at the last backward, where
    without a pipeline (or with the policy pinned to every micro-batch) it holds a 1/16 shard
    and one layer's. And that reduction has no backward of the stage left to overlap: with
    one stage per rank, overlap_grad_reduce hides nothing of it. The stage's parameters,
    not resharded after forward nor (the pipelining stage's set_reshard_after_backward(False))
    after backward, are gathered once per step."""
    layer = Shape.of(inst_of().model).layer_params
    plan = {"tp": 1, "pp": 2, "dp": 8, "micro_batch": 1, "dp_sharding": "optim_grads_params"}
    titan = {"framework": "torchtitan"}
    piped = report(inst_of(plan=plan, training={"global_batch": 64}, constraints=titan))
    grads = piped.memory_gib["gradients"] * 2**30
    # the stage's 20 layers whole in fp32, and at most the embedding / output layer beside
    assert 4 * 20 * layer <= grads <= 4 * 20 * layer + 4 * 2 * 32000 * 5120, grads / layer
    # one micro-batch: its backward, the stage's last, runs with sync off too (still whole)
    single = report(inst_of(plan={**plan, "micro_batch": 8}, training={"global_batch": 64},
                            constraints=titan))
    assert single.plan.micro_batches == 1
    assert single.memory_gib["gradients"] == pytest.approx(piped.memory_gib["gradients"])
    # not resharded (torchtitan's default with a pipeline) the stage's parameters stay
    # gathered over the micro-batches: one all-gather per step, 8 micro-batches or 1
    assert piped.plan.micro_batches == 8
    assert piped.breakdown_s["dp_comm"] == pytest.approx(single.breakdown_s["dp_comm"])
    pinned = report(inst_of(plan=plan, training={"global_batch": 64,
                                                 "grad_reduce_every_microbatch": True},
                            constraints=titan))
    # a 1/8 shard of the stage and one layer's unsharded: 3.5 layers' worth of 20
    assert pinned.memory_gib["gradients"] * 2**30 < 4 * 4 * layer
    flat = report(inst_of(plan={**plan, "pp": 1, "dp": 16}, training={"global_batch": 64},
                          constraints=titan))
    assert flat.memory_gib["gradients"] * 2**30 < 4 * 4 * layer     # 40/16 + 1 layers
    dp_comm = {og: report(inst_of(plan={**plan, "overlap_grad_reduce": og},
                                  training={"global_batch": 64}, constraints=titan)
                          ).breakdown_s["dp_comm"] for og in (False, True)}
    assert dp_comm[True] == pytest.approx(dp_comm[False], rel=1e-12)
    flat_comm = {og: report(inst_of(plan={**plan, "pp": 1, "dp": 16, "overlap_grad_reduce": og},
                                    training={"global_batch": 64}, constraints=titan)
                            ).breakdown_s["dp_comm"] for og in (False, True)}
    assert flat_comm[True] < flat_comm[False]


def test_deepspeed_pipelines_reduce_after_the_last_backward():
    """DeepSpeed's PipelineEngine switches the engine's backward all-reduce off ("We schedule
    the all-reduces, so disable it in super().backward()") and reduces in TrainSchedule's
    ReduceGrads after the last backward: with a pipeline overlap_comm hides nothing of the
    reduction, without one it overlaps the last backward (ZeRO-1 and plain DDP)."""
    for mode in ("none", "optim"):
        comm = {}
        for pp, dp in ((2, 8), (1, 16)):
            for og in (False, True):
                inst = inst_of(plan={"tp": 1, "pp": pp, "dp": dp, "micro_batch": 1,
                                     "dp_sharding": mode, "overlap_grad_reduce": og},
                               training={"global_batch": 64},
                               constraints={"framework": "deepspeed"})
                comm[pp, og] = report(inst).breakdown_s["dp_comm"]
        assert comm[2, True] == pytest.approx(comm[2, False], rel=1e-12), (mode, comm)
        assert comm[1, True] < comm[1, False], (mode, comm)


def test_13b_on_one_a100_40gb_node_solves_fully_sharded():
    """Without tensor or pipeline parallelism a 13B model fits one 8 x A100-40GB node only
    with its parameters sharded (18 bytes per parameter replicated is 218 GiB)."""
    inst = inst_of(training={"global_batch": 16},
                   cluster={"gpu": "a100-40gb", "nodes": 1},
                   constraints={"tp": 1, "pp": 1})
    res = solve(inst, solver="cpsat")
    p = res.report.plan
    assert (p.tp, p.pp, p.dp) == (1, 1, 8)
    assert p.dp_sharding == "optim_grads_params"
    assert res.report.fits


def test_search_compares_every_mode():
    """Nothing is switched on by default: the search's optimum is the best of the optima with
    each mode pinned, and here the modes' optima differ (the choice is a real one)."""
    inst = inst_of(model={**LLAMA13B, "layers": 4, "hidden": 1024, "heads": 8,
                          "ffn_hidden": 2816},
                   training={"global_batch": 64}, cluster={"gpu": "a100-80gb", "nodes": 2})
    free = solve(inst, solver="enumerate").report.step_time_s
    pinned = {}
    for mode in SHARDING_MODES:
        c = inst.spec.constraints.model_copy(update={"dp_sharding": mode})
        pinned[mode] = solve(inst.with_spec(constraints=c), solver="enumerate").report.step_time_s
    assert free == pytest.approx(min(pinned.values()), rel=1e-12)
    assert max(pinned.values()) > min(pinned.values()) * 1.001, pinned


def test_framework_rules_restrict_the_search_and_the_exports():
    ds = inst_of(training={"global_batch": 64}, constraints={"framework": "deepspeed",
                                                             "pp": 2})
    res = solve(ds, solver="enumerate")
    assert res.report.plan.dp_sharding in ("none", "optim")     # ZeRO-2/3 refuse pp > 1
    inst = inst_of(plan={"tp": 1, "pp": 2, "dp": 8, "micro_batch": 1,
                         "dp_sharding": "optim_grads_params"})
    with pytest.raises(InputError) as err:
        emit(inst, plan_from_spec(inst, inst.spec.plan), "deepspeed")
    assert "needs pp = 1 under DeepSpeed" in str(err.value)
    zero1 = inst_of(plan={"tp": 1, "pp": 1, "dp": 16, "micro_batch": 1, "dp_sharding": "optim"})
    with pytest.raises(InputError):                 # torchtitan has no ZeRO-1 mode
        emit(zero1, plan_from_spec(zero1, zero1.spec.plan), "torchtitan")


def test_exports_say_the_mode_the_model_costed():
    inst = inst_of(plan={"tp": 1, "pp": 1, "dp": 16, "micro_batch": 1,
                         "dp_sharding": "optim_grads_params", "dp_shard_size": 8})
    plan = plan_from_spec(inst, inst.spec.plan)
    titan = emit(inst, plan, "torchtitan")
    assert "data_parallel_shard_degree = 8" in titan
    assert "data_parallel_replicate_degree = 2" in titan
    assert 'fsdp_reshard_after_forward = "always"' in titan
    meg = emit(inst, plan, "megatron")
    assert "--data-parallel-sharding-strategy optim_grads_params" in meg
    assert "--num-distributed-optimizer-instances 2" in meg
    flat = inst_of(plan={"tp": 1, "pp": 1, "dp": 16, "micro_batch": 1,
                         "dp_sharding": "optim_grads"})
    import json
    ds = json.loads(emit(flat, plan_from_spec(flat, flat.spec.plan), "deepspeed"))
    assert ds["zero_optimization"]["stage"] == 2


def test_overlap_param_gather_is_reported_only_where_parameters_are_gathered():
    """NeMo switches the parameter-gather overlap on by default; plain data parallelism has
    no parameter all-gather (Megatron-LM asserts the distributed optimizer for the flag), so
    a plain-DP plan reports it off, and a pin of it on leaves plain DP out of the search."""
    def inst(**c):
        return inst_of(constraints={"framework": "nemo", **c})

    # (the reported switches are the plan's, whichever backend found it: the enumerator is
    # the fast one on this small space; the pin below is checked on a MIP too)
    plain = solve(inst(dp_sharding="none"), "enumerate").report.plan
    assert plain.dp_sharding == "none" and not plain.overlap_param_gather
    assert plain.overlap_grad_reduce                  # (the other NeMo default stays on)
    sharded = solve(inst(dp_sharding="optim"), "enumerate").report.plan
    assert sharded.overlap_param_gather
    for backend in ("cpsat", "enumerate"):
        pinned = solve(inst(dp_sharding=["none", "optim"], overlap_param_gather=True), backend)
        assert pinned.report.plan.dp_sharding != "none"

"""FP8 parameters (``[training] fp8_param_gather``): memory, the all-gather's bytes, the rules.

References
----------
* Megatron-LM ``--fp8-param-gather``: "Keep the compute param in fp8 (do not use any other
  intermediate dtype) and perform the param all-gather in fp8"; validate_args asserts the
  distributed optimizer (or FSDP). Megatron-Core's DDP keeps such parameters in a uint8 buffer.
* Transformer Engine keeps a transposed FP8 copy of each GEMM weight where FP8 GEMMs are TN only
  (Hopper), none on Blackwell (``is_non_tn_fp8_gemm_supported``): 2 bytes per FP8 parameter on
  H100, 1 on B200.
* GPT-3 175B: L=96, h=12288 (Brown et al. 2020), 12 h^2 + 13 h parameters per layer
  (Narayanan et al. 2021).
"""

from __future__ import annotations

import tomllib

import pytest

from formulations.solve import solve
from planner.app.emit import emit
from planner.model.errors import InfeasibleError, InputError
from planner.model.evaluate import evaluate
from planner.model.instance import parse_instance
from planner.model.plan import plan_from_spec

GiB = 2**30
L, h = 96, 12288
LAYER = 12 * h * h + 13 * h


def gpt3(gpu: str, fp8_params: bool, **training):
    inst = parse_instance({
        "model": {"preset": "gpt3-175b"},
        "training": {"global_batch": 256, "precision": "fp8", "grad_reduce_dtype": "bf16",
                     "fp8_param_gather": fp8_params, **training},
        "cluster": {"gpu": gpu, "gpus": 512},
        "plan": {"tp": 4, "pp": 8, "dp": 16, "vp": 1, "micro_batch": 1, "recompute": "none",
                 "dp_sharding": "optim", "overlap_grad_reduce": False,
                 "overlap_param_gather": False},
    })
    return evaluate(inst, plan_from_spec(inst, inst.spec.plan), spec=inst.spec.plan)


@pytest.mark.parametrize("gpu, saved_bytes", [("h100-sxm", 2), ("b200", 2)])
def test_fp8_parameters_drop_the_16bit_copy_of_the_layers_weights(gpu, saved_bytes):
    """The 12 layers of a middle-free GPT-3 stage (pp = 8, tp = 4) keep no 16-bit copy of their
    weights: 2 bytes per layer parameter fewer on either GPU (the FP8 copy, with its transpose
    on Hopper, stays); the embedding of the first stage stays 16-bit."""
    off, on = gpt3(gpu, False), gpt3(gpu, True)
    layer_params = (L // 8) * LAYER / 4
    for stage in ("first", "last"):
        saved = (off.memory_by_stage_gib[stage]["weights"]
                 - on.memory_by_stage_gib[stage]["weights"]) * GiB
        assert saved == pytest.approx(saved_bytes * layer_params, rel=1e-9), stage
    # what remains on the last stage: the layers' FP8 bytes and the 16-bit output layer
    fp8_bytes = {"h100-sxm": 2, "b200": 1}[gpu]
    head = (51200 * h + 2 * h) / 4
    assert on.memory_by_stage_gib["last"]["weights"] * GiB == pytest.approx(
        fp8_bytes * layer_params + 2 * head, rel=1e-9)


def test_fp8_all_gather_moves_half_the_bytes():
    """With bf16 gradients the distributed optimizer's reduce-scatter and all-gather move the
    same bytes; gathering the layers' weights in 1 byte takes a quarter off the data-parallel
    time of a 175B model on 16 nodes' worth of replicas (bandwidth-bound: the 16-bit embedding
    and the latency keep it a little above 3/4)."""
    off, on = gpt3("h100-sxm", False), gpt3("h100-sxm", True)
    ratio = on.breakdown_s["dp_comm"] / off.breakdown_s["dp_comm"]
    assert 0.75 < ratio < 0.76
    assert on.breakdown_s["compute"] == off.breakdown_s["compute"]


def test_fp8_parameters_need_fp8_and_the_distributed_optimizer():
    with pytest.raises(InputError, match="needs precision = \"fp8\""):
        gpt3("h100-sxm", True, precision="bf16")
    inst = parse_instance({
        "model": {"preset": "gpt3-175b"},
        "training": {"global_batch": 256, "precision": "fp8", "fp8_param_gather": True},
        "cluster": {"gpu": "h100-sxm", "gpus": 512},
        "plan": {"tp": 4, "pp": 8, "dp": 16, "dp_sharding": "none"},
    })
    with pytest.raises(InputError, match="needs dp_sharding = \"optim\" \\| \"optim_grads\" \\| "
                       "\"optim_grads_params\", not \"none\""):
        plan_from_spec(inst, inst.spec.plan)


def small(**constraints):
    return parse_instance({
        "model": {"layers": 8, "hidden": 1024, "heads": 8, "vocab": 32000, "seq_len": 2048},
        "training": {"global_batch": 64, "precision": "fp8", "fp8_param_gather": True},
        "cluster": {"gpu": "h100-sxm", "nodes": 2},
        "constraints": constraints,
    })


def test_the_search_keeps_the_distributed_optimizer_and_the_backends_agree():
    """Every backend searches the modes FP8 parameters run with (the distributed optimizer and
    Megatron-FSDP's) and returns the same plan and step time."""
    inst = small(max_micro_batch=4)
    res = {b: solve(inst, solver=b, explain=False) for b in ("cpsat", "highs", "enumerate")}
    plans = {b: r.report.plan for b, r in res.items()}
    assert plans["cpsat"] == plans["highs"] == plans["enumerate"], plans
    assert all(p.dp_sharding != "none" for p in plans.values())
    z = res["enumerate"].objective
    for b in ("cpsat", "highs"):
        assert res[b].objective == pytest.approx(z, rel=1e-6)
    assert evaluate(inst, plans["cpsat"]).step_time_s == pytest.approx(z, rel=1e-6)


@pytest.mark.parametrize("constraints, says", [
    ({"framework": "deepspeed"}, "DeepSpeed has no FP8 parameters"),
    ({"dp_sharding": ["none"]}, "needs dp_sharding = \"optim\""),
    ({"framework": "torchtitan", "dp_sharding": ["none"]},
     "needs dp_sharding = \"optim_grads_params\""),
])
def test_no_mode_left_is_explained(constraints, says):
    with pytest.raises(InfeasibleError) as err:
        solve(small(**constraints), solver="enumerate", explain=False)
    assert any(says in why for why in err.value.explanation), err.value.explanation


def test_exports_carry_or_refuse_the_fp8_parameters():
    inst = small()
    plan = solve(inst, solver="enumerate", explain=False).report.plan
    assert "--fp8-param-gather" in emit(inst, plan, "megatron").split()
    assert "fp8_param_gather" in emit(inst, plan, "nemo")
    for fmt, says in (("torchtitan", "needs dp_sharding = \"optim_grads_params\""),
                      ("deepspeed", "DeepSpeed has no FP8 parameters")):
        with pytest.raises(InputError) as err:
            emit(inst, plan, fmt)
        assert any(says in why for why in err.value.problems), err.value.problems


def test_megatron_fsdp_keeps_fp8_shards_and_gathers_layers_in_one_byte():
    """Megatron-FSDP with FP8 parameters (Megatron-Bridge's 70B recipes on GB200 / GB300):
    each GPU holds an FP8 shard of the layers' weights and gathers them layer by layer in one
    byte, with no FP8 copy of every unsharded layer beside its shards (keep_fp8_transpose_cache
    = False). By hand for Llama 3 70B over 64 GB300: without FP8 parameters Transformer
    Engine's FP8 copies of the 80 layers' weights (1 byte each on Blackwell) are most of the
    weights' memory; with them the weights are a 1-byte shard, a 16-bit head shard and two
    gathered layers: under 5 GiB. The per-layer all-gathers move half the bytes."""
    from planner.model.workload import Shape
    doc = {"model": {"preset": "llama3-70b"},
           "training": {"global_batch": 256, "precision": "fp8", "grad_reduce_dtype": "bf16"},
           "cluster": {"gpu": "gb300", "gpus": 64},
           "plan": {"tp": 1, "pp": 1, "dp": 64, "micro_batch": 2, "recompute": "none",
                    "dp_sharding": "optim_grads_params", "overlap_grad_reduce": False,
                    "overlap_param_gather": False}}
    cached = parse_instance(doc)
    fp8p = parse_instance({**doc, "training": {**doc["training"], "fp8_param_gather": True}})
    a = evaluate(cached, plan_from_spec(cached, cached.spec.plan))
    b = evaluate(fp8p, plan_from_spec(fp8p, fp8p.spec.plan))
    sh = Shape.of(cached.model)
    layers_gib = cached.model.layers * sh.layer_params / 2**30     # 1 byte each
    assert a.memory_gib["weights"] - b.memory_gib["weights"] == pytest.approx(
        layers_gib, rel=0.1)
    assert b.memory_gib["weights"] < 5
    assert b.breakdown_s["dp_comm"] < 0.75 * a.breakdown_s["dp_comm"]
    assert b.breakdown_s["compute"] == a.breakdown_s["compute"]


def titan(fp8_params: bool, **training):
    return parse_instance({
        "model": {"preset": "llama3-70b"},
        "training": {"global_batch": 128, "precision": "fp8", "kernel_stack": "pytorch",
                     **({"fp8_param_gather": True} if fp8_params else {}), **training},
        "cluster": {"gpu": "h100-sxm", "gpus": 64},
        "constraints": {"framework": "torchtitan"},
        "plan": {"tp": 1, "pp": 1, "dp": 64, "micro_batch": 1, "recompute": "full",
                 "dp_sharding": "optim_grads_params", "overlap_grad_reduce": False,
                 "overlap_param_gather": False},
    })


def test_torchtitan_fp8_all_gather_halves_the_layers_gathers_and_says_so_in_the_export():
    """torchtitan's FP8 parameters are torchao's FSDP2 FP8 all-gather
    (``enable_fsdp_float8_all_gather``: each Float8Linear weight's fp32 shard is cast to FP8,
    then gathered). Llama 3 70B under FSDP2 over 64 H100, nothing overlapped: the per-layer
    gathers (forward, and again for the backward when resharded) move one byte per layer
    parameter instead of two, the gradients' reduce-scatter in fp32 is unchanged, so the
    data-parallel time falls by more than a sixth and less than a third; compute is the same,
    and the gathered working set (two layers) takes less memory. The export turns the FP8
    all-gather on exactly when the plan costs it."""
    off, on = titan(False), titan(True)
    a = evaluate(off, plan_from_spec(off, off.spec.plan))
    b = evaluate(on, plan_from_spec(on, on.spec.plan))
    assert 0.66 < b.breakdown_s["dp_comm"] / a.breakdown_s["dp_comm"] < 0.84
    assert b.breakdown_s["compute"] == a.breakdown_s["compute"]
    assert b.memory_gib["weights"] < a.memory_gib["weights"]
    for inst, flag in ((off, False), (on, True)):
        f8 = tomllib.loads(emit(inst, plan_from_spec(inst, inst.spec.plan), "torchtitan"))[
            "quantize"]["linear"]["float8"]
        assert f8["enable_fsdp_float8_all_gather"] is flag
        assert f8["precompute_float8_dynamic_scale_for_fsdp"] is flag


@pytest.mark.parametrize("fp8_params", [True, False])
def test_torchtitan_fp8_solves_the_same_on_every_backend(fp8_params):
    """Under torchtitan (torchao's float8: one layer's FP8 copy, FP8 tensor-parallel
    gathers) every backend returns the same plan and step time, which the evaluator
    reproduces; with FP8 parameters the search keeps FSDP2."""
    inst = parse_instance({
        "model": {"layers": 8, "hidden": 1024, "heads": 8, "vocab": 32000, "seq_len": 2048},
        "training": {"global_batch": 64, "precision": "fp8", "fp8_param_gather": fp8_params,
                     "kernel_stack": "pytorch"},
        "cluster": {"gpu": "h100-sxm", "nodes": 2},
        "constraints": {"framework": "torchtitan", "max_micro_batch": 4},
    })
    res = {b: solve(inst, solver=b, explain=False) for b in ("cpsat", "highs", "enumerate")}
    plans = {b: r.report.plan for b, r in res.items()}
    assert plans["cpsat"] == plans["highs"] == plans["enumerate"], plans
    assert plans["cpsat"].dp_sharding == "optim_grads_params" or not fp8_params
    z = res["enumerate"].objective
    for b in ("cpsat", "highs"):
        assert res[b].objective == pytest.approx(z, rel=1e-6)
    assert evaluate(inst, plans["cpsat"]).step_time_s == pytest.approx(z, rel=1e-6)


def test_torchao_holds_the_fp8_copy_of_one_layer_only():
    """torchao's Float8Linear saves the 16-bit weight for the backward and casts it to FP8 per
    GEMM (float8_linear.py, matmul_with_hp_or_float8_args), where Transformer Engine keeps the
    FP8 copy of every layer from the forward to the backward. So under FSDP2 on the PyTorch
    stack, FP8 adds to the weights exactly one layer's FP8 copy over BF16: 2 bytes per layer
    parameter on H100 (the value and its transpose), not the 80 layers' 140 GB."""
    from planner.model.workload import Shape
    fp8, bf16 = titan(False), titan(False, precision="bf16")
    a = evaluate(fp8, plan_from_spec(fp8, fp8.spec.plan))
    b = evaluate(bf16, plan_from_spec(bf16, bf16.spec.plan))
    extra = (a.memory_gib["weights"] - b.memory_gib["weights"]) * GiB
    assert extra == pytest.approx(2 * Shape.of(fp8.model).layer_params, rel=1e-9)


def test_under_torchtitan_fp8_is_torchao_whatever_figures_the_gemms_take():
    """torchtitan's FP8 is torchao's converter on either kernel stack (the stack picks the
    GEMM and attention figures only): the same memory, component by component, and the same
    tensor-parallel bytes (FP8 gathers) at TP 2 with sequence parallelism."""
    plan = {"tp": 2, "pp": 1, "dp": 32, "micro_batch": 1, "recompute": "none",
            "sequence_parallel": True, "dp_sharding": "optim_grads_params"}
    rep = {}
    for stack, precision in (("fused", "fp8"), ("pytorch", "fp8"), ("pytorch", "bf16")):
        inst = parse_instance({
            "model": {"preset": "llama3-70b"},
            "training": {"global_batch": 128, "precision": precision, "kernel_stack": stack},
            "cluster": {"gpu": "h100-sxm", "gpus": 64},
            "constraints": {"framework": "torchtitan"}, "plan": plan})
        rep[stack, precision] = evaluate(inst, plan_from_spec(inst, inst.spec.plan))
    fused, pytorch, bf16 = rep["fused", "fp8"], rep["pytorch", "fp8"], rep["pytorch", "bf16"]
    assert fused.memory_gib == pytorch.memory_gib
    assert fused.breakdown_s["tp_comm"] == pytorch.breakdown_s["tp_comm"]
    # the all-gathers in 1 byte, the reduce-scatters in 2: 3/4 of BF16's time when all four
    # pairs are exposed, 2/3 when the backward reduce-scatters hide behind the weight-gradient
    # GEMMs (asynchronous TP, the default): (2 (1 + 2) + 2 x 1) / (2 (2 + 2) + 2 x 2)
    assert 2 / 3 < pytorch.breakdown_s["tp_comm"] / bf16.breakdown_s["tp_comm"] < 3 / 4
    assert fused.breakdown_s["compute"] != pytorch.breakdown_s["compute"]


def test_torchao_fp8_parameters_need_torchtitan():
    """torchao's FP8 parameters can only be torchtitan's FSDP2 FP8 all-gather: under another
    framework, or none, a [plan] with them is an input error naming both keys, a search has
    no sharding mode left and says why, and the same file solves once the framework is
    torchtitan (as ``plan solve --emit torchtitan`` sets it). Transformer Engine's FP8
    parameters on the PyTorch stack's figures are Megatron's and solve."""
    doc = {"model": {"layers": 8, "hidden": 1024, "heads": 8, "vocab": 32000, "seq_len": 2048},
           "training": {"global_batch": 64, "precision": "fp8", "kernel_stack": "pytorch",
                        "fp8_param_gather": True, "fp8_library": "torchao"},
           "cluster": {"gpu": "h100-sxm", "nodes": 2}}
    plan = {"tp": 1, "pp": 1, "dp": 16, "micro_batch": 1, "dp_sharding": "optim_grads_params"}
    says = "needs constraints.framework = \"torchtitan\""
    for constraints in ({}, {"framework": "megatron"}):
        inst = parse_instance({**doc, "constraints": constraints, "plan": plan})
        with pytest.raises(InputError, match="training.fp8_param_gather = true .*" + says):
            plan_from_spec(inst, inst.spec.plan)
        with pytest.raises(InfeasibleError) as err:
            solve(parse_instance({**doc, "constraints": constraints}), solver="enumerate",
                  explain=False)
        assert any(says in why for why in err.value.explanation), err.value.explanation
        # (a refusal that holds in every mode does not list the modes the constraints leave)
        assert not any("leave dp_sharding" in why for why in err.value.explanation)
    titan = parse_instance({**doc, "constraints": {"framework": "torchtitan"}})
    assert solve(titan, solver="enumerate", explain=False).report.plan.dp_sharding == \
        "optim_grads_params"
    te = parse_instance({**doc, "training": {**doc["training"],
                                             "fp8_library": "transformer_engine"}})
    assert solve(te, solver="enumerate", explain=False).report is not None


def test_fp8_library_overrides_the_frameworks_default():
    """llm-foundry's amp_fp8 runs Transformer Engine's FP8 linears under PyTorch FSDP (the
    rules of torchtitan here): with ``fp8_library = "transformer_engine"`` the plan holds
    every layer's FP8 copy (80 layers, not one: 79 x 2 bytes per layer parameter more on
    H100) and torchao's 16-bit held inputs become FP8 (less activation memory)."""
    from planner.model.workload import Shape
    ao, te = titan(False), titan(False, fp8_library="transformer_engine")
    a = evaluate(ao, plan_from_spec(ao, ao.spec.plan))
    b = evaluate(te, plan_from_spec(te, te.spec.plan))
    extra = (b.memory_gib["weights"] - a.memory_gib["weights"]) * GiB
    assert extra == pytest.approx(79 * 2 * Shape.of(ao.model).layer_params, rel=1e-9)
    assert b.memory_gib["activations"] < a.memory_gib["activations"]
    assert a.breakdown_s == b.breakdown_s                      # the same time at TP 1


def test_fp8_library_needs_a_narrow_precision():
    # (Transformer Engine's linears run NVFP4 too: the message names both precisions)
    with pytest.raises(InputError, match="fp8_library = \"torchao\" names whose FP8 linears "
                       "run, which needs precision = \"fp8\" or \"nvfp4\""):
        titan(False, precision="bf16", fp8_library="torchao")


@pytest.mark.parametrize("training", [{"precision": "nvfp4"},
                                      {"precision": "fp8", "fp8_recipe": "mxfp8"}])
def test_torchao_has_no_block_scaled_costs(training):
    with pytest.raises(InputError, match="fp8_library = \"torchao\" with"):
        parse_instance({"model": {"preset": "llama3-70b"},
                        "training": {"global_batch": 128, "fp8_library": "torchao", **training},
                        "cluster": {"gpu": "b200", "gpus": 64}})

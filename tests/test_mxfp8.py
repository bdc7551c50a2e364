"""MXFP8 (``[training] fp8_recipe = "mxfp8"``): Transformer Engine's block-scaled FP8 on Blackwell.

What is checked, and against what:

- the weight bytes, by a hand count of Llama 3 8B's GEMM weights from its shape and TE's MXFP8
  layout (each weight quantized rowwise and columnwise, one E8M0 scale byte per 32 values),
  the embedding, output layer and norms in bf16;
- the parameter all-gather: Megatron-Core gathers MXFP8 parameters in 16 bits through the
  gradient buffer, so its data-parallel time equals that of 16-bit parameters (no FP8
  parameters) on the same plan, where per-tensor FP8 parameters gather one byte;
- the input rules (Hopper, precision, the remainders, the sharding modes);
- Megatron-Bridge 25.11's three same-plan FP8-CS / FP8-MX pairs (the fit of the GEMM rate,
  so in sample: a guard that the rate and the costs stay together);
- CP-SAT = HiGHS = enumerator on an instance where MXFP8's weight copies move the optimum.
"""
from __future__ import annotations

import copy

import pytest

from formulations.solve import solve
from planner.model.catalog import GiB
from planner.model.errors import InputError
from planner.model.evaluate import evaluate
from planner.model.instance import parse_instance
from planner.model.plan import plan_from_spec
from tests.test_emit import emitted


def llama8b(recipe: str | None, gpu: str = "b200", fp8_params: bool = True, **plan):
    inst = parse_instance({
        "model": {"preset": "llama3-8b"},
        "training": {"global_batch": 128, "precision": "fp8", "grad_reduce_dtype": "bf16",
                     "fp8_param_gather": fp8_params,
                     **({"fp8_recipe": recipe} if recipe else {})},
        "cluster": {"gpu": gpu, "gpus": 8},
        "plan": {"tp": 1, "pp": 1, "dp": 8, "micro_batch": 2, "recompute": "none",
                 "dp_sharding": "optim", **plan},
    })
    return evaluate(inst, plan_from_spec(inst, inst.spec.plan), spec=inst.spec.plan)


#: Llama 3 8B counted by hand from its shape (hidden 4096, 8 KV heads of 128, gated MLP 14336,
#: 32 layers, vocabulary 128256, untied): the layers' GEMM weights (QKV, projection, gated MLP)
#: and the 16-bit rest (embedding, output layer, norms)
_H, _KV, _F, _L, _V = 4096, 1024, 14336, 32, 128256
LLAMA8B_GEMM_PARAMS = _L * (_H * (_H + 2 * _KV) + _H * _H + 3 * _H * _F)
LLAMA8B_16BIT_PARAMS = 2 * _V * _H + _L * 2 * _H + _H


def test_weights_hold_both_directions_with_their_scales():
    gemm, sixteen_bit = LLAMA8B_GEMM_PARAMS, LLAMA8B_16BIT_PARAMS
    mx_bytes = 2 * (1 + 1 / 32)                                 # rowwise + columnwise + E8M0
    expected = (gemm * mx_bytes + sixteen_bit * 2) / GiB
    got = llama8b("mxfp8").memory_gib["weights"]
    assert got == pytest.approx(expected, rel=1e-3)
    # per-tensor FP8 parameters on Blackwell: one FP8 copy, no transpose
    assert llama8b("tensorwise").memory_gib["weights"] == pytest.approx(
        (gemm * 1 + sixteen_bit * 2) / GiB, rel=1e-3)


def test_mxfp8_parameters_are_gathered_in_16_bits():
    # no overlap: the whole gather is exposed
    mx = llama8b("mxfp8").breakdown_s["dp_comm"]
    plain = llama8b("mxfp8", fp8_params=False).breakdown_s["dp_comm"]
    per_tensor = llama8b("tensorwise").breakdown_s["dp_comm"]
    assert mx == pytest.approx(plain, rel=1e-9)
    assert per_tensor < mx


def test_mxfp8_runs_slower_than_per_tensor_fp8_on_the_same_plan():
    mx, cs = llama8b("mxfp8"), llama8b("tensorwise")
    assert 1.02 < mx.step_time_s / cs.step_time_s < 1.08
    assert mx.memory_gib["total"] > cs.memory_gib["total"]


@pytest.mark.parametrize("training, gpu, says", [
    # the key, then the reason: Blackwell-only (Transformer Engine's compute capability 10.0)
    ({"precision": "fp8", "fp8_recipe": "mxfp8"}, "h100-sxm",
     ('training.fp8_recipe: "mxfp8" needs block-scaled FP8 tensor cores (b200, b300, gb200, '
      'gb300); cluster.gpu = "h100-sxm" has none',)),
    ({"precision": "bf16", "fp8_recipe": "mxfp8"}, "b200",
     ('training: fp8_recipe = "mxfp8" scales FP8 tensors, which needs precision = "fp8" '
      '(precision = "bf16")',)),
    ({"precision": "fp8", "fp8_recipe": "mxfp8", "store_param_remainders": True}, "b200",
     ('training: store_param_remainders = true with fp8_recipe = "mxfp8"',
      "keeps a whole fp32 master under current and MXFP8 scaling")),
    # Transformer Engine's stack only
    ({"precision": "fp8", "fp8_recipe": "mxfp8", "kernel_stack": "pytorch"}, "b200",
     ('training: fp8_recipe = "mxfp8" is Transformer Engine\'s MXFP8 block scaling '
      '(kernel_stack = "fused")', 'kernel_stack = "pytorch" has no MXFP8 costs')),
])
def test_input_errors(training, gpu, says):
    with pytest.raises(InputError) as exc:
        parse_instance({"model": {"preset": "llama3-8b"},
                        "training": {"global_batch": 128, **training},
                        "cluster": {"gpu": gpu, "gpus": 8}})
    (problem,) = exc.value.problems         # one problem, naming the key and the reason
    assert all(part in problem for part in says), problem


def test_mxfp8_parameters_keep_zero_1():
    with pytest.raises(InputError) as exc:
        llama8b("mxfp8", dp_sharding="optim_grads_params")
    assert "MXFP8 parameters" in str(exc.value)
    # the search keeps to ZeRO-1 too
    res = solve(parse_instance({
        "model": {"preset": "llama3-8b"},
        "training": {"global_batch": 128, "precision": "fp8", "fp8_recipe": "mxfp8",
                     "fp8_param_gather": True},
        "cluster": {"gpu": "b200", "gpus": 8}}), solver="enumerate")
    assert res.report.plan.dp_sharding == "optim"


#: Megatron-Bridge 25.11's performance summary: tokens/s/GPU of FP8-CS (FP8-MX) on one plan
PAIRS = {"mbridge2511-gb200-llama3-8b-fp8-8": (31508, 29789),
         "mbridge2511-b200-llama3-8b-fp8-8": (30624, 29521),
         "mbridge2511-b200-llama31-405b-fp8-128": (661, 624)}


#: 25.11's MXFP8 Llama 3.1 405B builder switches the parameter-gather overlap off ("keeping
#: this eanbled causes NaN grad norm", llama31_llm_pretrain.py at 877ce8c5f); its FP8-CS twin
#: keeps it
MX_WITHOUT_PARAM_GATHER_OVERLAP = {"mbridge2511-b200-llama31-405b-fp8-128"}


@pytest.mark.parametrize("rid", sorted(PAIRS))
def test_same_plan_pairs_of_megatron_bridge_25_11(rid):
    from planner.app.runs_file import load_runs, run_instance
    data = load_runs()
    run = next(r for r in data["runs"] if r["id"] == rid)
    times = []
    for recipe in ("tensorwise", "mxfp8"):
        r = copy.deepcopy(run)
        r["training"]["fp8_recipe"] = recipe
        if recipe == "mxfp8" and rid in MX_WITHOUT_PARAM_GATHER_OVERLAP:
            r["plan"]["overlap_param_gather"] = False
        inst = run_instance(data, r)
        times.append(evaluate(inst, plan_from_spec(inst, inst.spec.plan),
                              spec=inst.spec.plan).step_time_s)
    cs, mx = PAIRS[rid]
    assert times[1] / times[0] == pytest.approx(cs / mx, abs=0.025)


MX_DECIDES = {
    "model": {"preset": "llama3-70b", "seq_len": 4096},
    "training": {"global_batch": 32, "precision": "fp8", "fp8_recipe": "mxfp8",
                 "fp8_param_gather": True, "grad_reduce_dtype": "bf16"},
    # (8 GPUs: MXFP8's extra memory moves the optimum from tensorwise's TP2 PP4 VP20 to TP4
    # PP2 here; at 8,192 tokens and a batch of 64 it no longer does since the projections keep
    # their 16-bit input under both recipes, not a narrow copy: both pick TP4 PP2)
    "cluster": {"gpu": "b200", "gpus": 8},
    # (a smaller space, the same optima as the free one, which HiGHS takes much longer on)
    "constraints": {"recompute": "none", "max_micro_batch": 2},
}


def test_backends_agree_where_mxfp8_decides():
    from tests.test_solvers import _agree
    _agree(MX_DECIDES)
    mx = solve(parse_instance(MX_DECIDES), solver="cpsat").report
    doc = copy.deepcopy(MX_DECIDES)
    doc["training"]["fp8_recipe"] = "tensorwise"
    cs = solve(parse_instance(doc), solver="cpsat").report
    assert (mx.plan.tp, mx.plan.pp) != (cs.plan.tp, cs.plan.pp)
    assert mx.memory_gib["total"] <= mx.memory_gib["limit"]


def test_exports_say_the_recipe():
    plan = {"tp": 4, "pp": 2, "dp": 1, "vp": 20, "micro_batch": 2}
    megatron = emitted(MX_DECIDES, plan, "megatron")
    assert "--fp8-recipe mxfp8" in megatron and "--fp8-format e4m3" in megatron
    assert "--reuse-grad-buf-for-mxfp8-param-ag" in megatron
    nemo = emitted(MX_DECIDES, plan, "nemo")
    assert "fp8_recipe: mxfp8" in nemo
    # the same 16-bit gather through the gradient buffer (bf16_with_mxfp8_mixed sets it)
    assert "reuse_grad_buf_for_mxfp8_param_ag: true" in nemo
    doc = copy.deepcopy(MX_DECIDES)
    doc["training"]["fp8_param_gather"] = False       # torchtitan has no MXFP8 parameters
    torchtitan = emitted(doc, {"tp": 4, "pp": 1, "dp": 2, "micro_batch": 1,
                               "dp_sharding": "optim_grads_params"}, "torchtitan")
    assert "quantize.linear.mx" in torchtitan and "mxfp8_cublas" in torchtitan


def test_mxfp8_parameters_under_torchtitan_say_why_each_mode_is_refused():
    """torchtitan's FP8 parameters are FSDP2's all-gather (plain DP cannot), and MXFP8
    parameters are the distributed optimizer's path, which torchtitan has not: the search
    has no mode left and says both reasons, not one that names a mode as needed and then as
    left (an audit found "needs dp_sharding = "optim_grads_params" ...; the constraints and
    framework leave dp_sharding none | optim_grads_params")."""
    doc = {"model": {"preset": "llama3-8b"},
           "training": {"global_batch": 256, "precision": "fp8", "fp8_recipe": "mxfp8",
                        "fp8_param_gather": True},
           "cluster": {"gpu": "b200", "nodes": 4}, "constraints": {"framework": "torchtitan"}}
    from planner.model.errors import InfeasibleError
    with pytest.raises(InfeasibleError) as err:
        solve(parse_instance(doc), solver="enumerate", explain=False)
    why = " ".join(err.value.explanation)
    assert 'dp_sharding = "none": training.fp8_param_gather = true needs dp_sharding = ' \
        '"optim_grads_params"' in why
    assert 'dp_sharding = "optim_grads_params": training.fp8_param_gather = true: torchtitan ' \
        'has no MXFP8 parameters' in why

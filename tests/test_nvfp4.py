"""NVFP4 (``precision = "nvfp4"``): Transformer Engine's NVFP4BlockScaling on Blackwell.

What is checked, and against what:

- the weight bytes, by a hand count of Llama 3 8B from its shape: bf16 weights beside two
  NVFP4 copies of every GEMM weight (rowwise and columnwise, half a byte per value and one E4M3
  scale byte per 16 values);
- the GEMM rate against the catalog's FP4 peak: a plan whose GEMMs dominate runs faster at
  NVFP4 than at FP8, and faster on GB300 (three times FP8's peak) than on GB200 (twice);
- narrower held activations than FP8's on the same plan;
- the input rules (a GPU without an FP4 figure, FP8-only keys, the kernel stack);
- Megatron-Bridge 26.02's three same-plan NVFP4 / MXFP8 pairs (the fit of the rate, so in
  sample: a guard that the rate and the costs stay together);
- CP-SAT = HiGHS = enumerator on an NVFP4 instance, and the exports.
"""
from __future__ import annotations

import pytest

from formulations.solve import solve
from planner.app.emit import emit
from planner.model.catalog import GiB
from planner.model.errors import InputError
from planner.model.evaluate import evaluate
from planner.model.instance import parse_instance
from planner.model.plan import plan_from_spec
from tests.test_emit import emitted
from tests.test_mxfp8 import LLAMA8B_16BIT_PARAMS, LLAMA8B_GEMM_PARAMS


def llama8b(precision: str, gpu: str = "gb200", **training):
    inst = parse_instance({
        "model": {"preset": "llama3-8b"},
        "training": {"global_batch": 128, "precision": precision, "grad_reduce_dtype": "bf16",
                     **training},
        "cluster": {"gpu": gpu, "gpus": 8},
        "plan": {"tp": 1, "pp": 1, "dp": 8, "micro_batch": 2, "recompute": "none",
                 "dp_sharding": "optim"},
    })
    return evaluate(inst, plan_from_spec(inst, inst.spec.plan), spec=inst.spec.plan)


def test_weights_are_bf16_beside_two_nvfp4_copies():
    gemm, sixteen_bit = LLAMA8B_GEMM_PARAMS, LLAMA8B_16BIT_PARAMS
    nvfp4 = 2 * (0.5 + 1 / 16)                                  # rowwise + columnwise + E4M3
    expected = (gemm * (2 + nvfp4) + sixteen_bit * 2) / GiB
    assert llama8b("nvfp4").memory_gib["weights"] == pytest.approx(expected, rel=1e-3)


def test_nvfp4_gemms_run_at_the_fp4_peak():
    nv, f8 = llama8b("nvfp4"), llama8b("fp8")
    assert nv.step_time_s < f8.step_time_s
    # GB300's FP4 peak is three times its FP8 one, GB200's twice: NVFP4 gains more there
    gain_gb200 = f8.breakdown_s["compute"] / nv.breakdown_s["compute"]
    gain_gb300 = (llama8b("fp8", "gb300").breakdown_s["compute"]
                  / llama8b("nvfp4", "gb300").breakdown_s["compute"])
    assert 1.0 < gain_gb200 < gain_gb300


def test_b300_runs_nvfp4_and_says_it_is_unfitted():
    """HGX B300's dense FP4 (13.1 PFLOPS) is 2.9x its FP8 where B200's is 2x (the same FP8
    peak): NVFP4 gains more over FP8 there; with no run of its own the plan carries the
    unfitted-precision caveat."""
    rep = llama8b("nvfp4", "b300")
    assert any("b300 has no measured run at nvfp4" in c for c in rep.caveats)
    gains = {g: llama8b("fp8", g).breakdown_s["compute"] / llama8b("nvfp4", g).breakdown_s[
        "compute"] for g in ("b200", "b300")}
    assert 1.0 < gains["b200"] < gains["b300"], gains


def test_held_activations_are_narrower_than_fp8s():
    acts = {p: llama8b(p).memory_gib["activations"] for p in ("bf16", "fp8", "nvfp4")}
    assert acts["nvfp4"] < acts["fp8"] < acts["bf16"]


@pytest.mark.parametrize("training, gpu, says", [
    # the key, then the reason: Blackwell-only (an FP4 peak in the catalog)
    ({"precision": "nvfp4"}, "h100-sxm",
     ('training.precision: "nvfp4" needs FP4 tensor cores with a peak in the catalog '
      '(b200, b300, gb200, gb300); cluster.gpu = "h100-sxm" has none',)),
    ({"precision": "nvfp4"}, "mi300x",
     ('training.precision: "nvfp4" needs FP4 tensor cores', 'cluster.gpu = "mi300x" has none '
      "(hardware_catalog/mi300x.toml peak_tflops_fp4)")),
    # FP8-only settings under NVFP4
    ({"precision": "nvfp4", "fp8_param_gather": True}, "gb200",
     ('training: fp8_param_gather = true keeps the weights in FP8, which needs precision = '
      '"fp8" (precision = "nvfp4")',)),
    ({"precision": "nvfp4", "fp8_recipe": "mxfp8"}, "gb200",
     ('training: fp8_recipe = "mxfp8" scales FP8 tensors, which needs precision = "fp8" '
      '(precision = "nvfp4")',)),
    # Transformer Engine's stack only
    ({"precision": "nvfp4", "kernel_stack": "pytorch"}, "gb200",
     ('training: precision = "nvfp4" is Transformer Engine\'s NVFP4BlockScaling '
      '(kernel_stack = "fused")', 'kernel_stack = "pytorch" has no NVFP4 costs')),
])
def test_input_errors(training, gpu, says):
    with pytest.raises(InputError) as exc:
        parse_instance({"model": {"preset": "llama3-8b"},
                        "training": {"global_batch": 128, **training},
                        "cluster": {"gpu": gpu, "gpus": 8}})
    (problem,) = exc.value.problems         # one problem, naming the key and the reason
    assert all(part in problem for part in says), problem


#: Megatron-Bridge 26.02's NVFP4 rows and the MXFP8 rows of the same plan
PAIRS = [("mbridge2602-gb300-llama3-70b-nvfp4-64", "mbridge2602-gb300-llama3-70b-mxfp8-64"),
         ("mbridge2602-gb200-llama3-70b-nvfp4-64", "mbridge2602-gb200-llama3-70b-mxfp8-64"),
         ("mbridge2602-gb200-llama31-405b-nvfp4-256", "mbridge2602-gb200-llama31-405b-mxfp8-256")]


def test_same_plan_pairs_of_megatron_bridge_26_02():
    """In sample (they set the rate): the model's MXFP8 / NVFP4 step ratio against the
    measured one, within the spread the fit left (docs/model.md, "FP8", item 6)."""
    from planner.app.runs_file import load_runs, run_instance
    data = load_runs()
    runs = {r["id"]: r for r in data["runs"]}

    def predicted(rid):
        inst = run_instance(data, runs[rid])
        return evaluate(inst, plan_from_spec(inst, inst.spec.plan),
                        spec=inst.spec.plan).step_time_s
    diffs = []
    for nv, mx in PAIRS:
        measured = runs[mx]["measured_step_time_s"] / runs[nv]["measured_step_time_s"]
        diffs.append(predicted(mx) / predicted(nv) - measured)
    assert all(abs(d) < 0.16 for d in diffs)
    assert sum(abs(d) for d in diffs) / len(diffs) < 0.08


NVFP4_INSTANCE = {
    "model": {"preset": "llama3-70b"},
    "training": {"global_batch": 64, "precision": "nvfp4", "grad_reduce_dtype": "bf16"},
    "cluster": {"gpu": "gb200", "gpus": 16},
    "constraints": {"recompute": "none", "max_micro_batch": 2},     # (a smaller space)
}


def test_backends_agree_at_nvfp4():
    from tests.test_solvers import _agree
    _agree(NVFP4_INSTANCE)
    res = solve(parse_instance(NVFP4_INSTANCE), solver="cpsat").report
    assert res.memory_gib["total"] <= res.memory_gib["limit"]


def test_exports_say_nvfp4():
    plan = {"tp": 4, "pp": 2, "dp": 2, "vp": 20, "micro_batch": 1}
    megatron = emitted(NVFP4_INSTANCE, plan, "megatron")
    assert "--fp4-format e2m1" in megatron and "--fp4-recipe nvfp4" in megatron
    assert "--fp8" not in megatron
    nemo = emitted(NVFP4_INSTANCE, plan, "nemo")
    assert "fp4: e2m1" in nemo and "fp4_recipe: nvfp4" in nemo
    assert "nvfp4: cannot express" in emitted(
        NVFP4_INSTANCE, {"tp": 4, "pp": 1, "dp": 4, "micro_batch": 1,
                         "dp_sharding": "optim_grads_params"}, "torchtitan")


def test_fp4_parameters_hold_no_bf16_copy_and_gather_in_fp4():
    """``fp4_param_gather``: the GEMM weights are the NVFP4 copies alone (hand count as above,
    the embedding, output layer and norms still bf16), and the parameter all-gather moves the
    packed FP4 values (half a byte; the scales are recomputed on every rank) instead of bf16
    ones."""
    gemm, sixteen_bit = LLAMA8B_GEMM_PARAMS, LLAMA8B_16BIT_PARAMS
    fp4 = llama8b("nvfp4", fp4_param_gather=True)
    assert fp4.memory_gib["weights"] == pytest.approx(
        (gemm * 2 * (0.5 + 1 / 16) + sixteen_bit * 2) / GiB, rel=1e-3)
    assert fp4.breakdown_s["dp_comm"] < llama8b("nvfp4").breakdown_s["dp_comm"]


@pytest.mark.parametrize("training, says", [
    ({"precision": "fp8", "fp4_param_gather": True}, "needs precision = \"nvfp4\""),
    ({"precision": "nvfp4", "fp4_param_gather": True, "store_param_remainders": True},
     "fp4_param_gather = true keeps them in FP4"),
])
def test_fp4_parameter_input_errors(training, says):
    with pytest.raises(InputError) as exc:
        parse_instance({"model": {"preset": "llama3-8b"},
                        "training": {"global_batch": 128, **training},
                        "cluster": {"gpu": "gb200", "gpus": 8}})
    assert says in str(exc.value)          # (InputError's text lists its problems)


def test_fp4_parameters_keep_zero_1():
    inst = parse_instance({
        "model": {"preset": "llama3-8b"},
        "training": {"global_batch": 128, "precision": "nvfp4", "fp4_param_gather": True},
        "cluster": {"gpu": "gb200", "gpus": 8}})
    res = solve(inst, solver="enumerate")
    assert res.report.plan.dp_sharding == "optim"
    megatron = emit(inst, res.report.plan, "megatron")
    assert "--fp4-param-gather" in megatron
    assert "fp4_param_gather: cannot express" in emit(inst, res.report.plan, "nemo")


@pytest.mark.parametrize("gpu, training, vp", [
    ("gb200", {"precision": "nvfp4"}, 1),
    ("b200", {"precision": "fp8", "fp8_recipe": "mxfp8"}, 1),
    ("h100-sxm", {"precision": "fp8"}, 2),
])
def test_an_moe_layer_holds_its_narrow_inputs_whatever_dense_layers_precede_it(gpu, training, vp):
    """A stage is checked as if its layers were all of one kind, so an MoE model's MoE-kind
    activations must not depend on whether dense layers come first: with one leading dense
    layer they equal those of the all-MoE model (the narrow bytes each linear layer holds,
    instance.narrow_bytes, are the same for both kinds; a name shared with the stage loop's
    micro-batch count once made the MoE kind of a mixed model hold 1 byte at NVFP4)."""
    def activations(first_dense):
        inst = parse_instance({
            "model": {"layers": 8, "hidden": 1024, "heads": 8, "vocab": 32000,
                      "seq_len": 2048, "experts": 8, "top_k": 2, "moe_ffn_hidden": 1024,
                      "first_dense_layers": first_dense},
            "training": {"global_batch": 16, **training},
            "cluster": {"gpu": gpu, "gpus": 8},
            "plan": {"tp": 1, "pp": 2, "dp": 4, "ep": 2, "vp": vp, "micro_batch": 1}})
        rep = evaluate(inst, plan_from_spec(inst, inst.spec.plan), spec=inst.spec.plan)
        return {k: v["activations"] for k, v in rep.memory_by_stage_gib.items()}
    mixed, moe = activations(1), activations(0)
    assert mixed["first_moe"] == pytest.approx(moe["first"], rel=1e-12)
    assert mixed["last_moe"] == pytest.approx(moe["last"], rel=1e-12)
    assert mixed["first_dense"] != pytest.approx(mixed["first_moe"], rel=1e-3)

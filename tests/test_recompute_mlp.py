"""Megatron-Core's ``mlp`` recompute module (``[training] selective_recompute = ["mlp"]``):
a dense layer's MLP re-runs from its input before its backward (transformer_layer.py
``recompute_mlp``: ``tensor_parallel.checkpoint`` / ``te_checkpoint`` of ``self.mlp``), so the
layer keeps none of the MLP's own tensors; the re-run forward costs the MLP's GEMMs, its fused
norm and activation traffic and its tensor-parallel pair again.

Counted here from the tensors Megatron-Core and Transformer Engine keep, and from how full
recompute (which re-runs attention and MLP both) relates to it, not from the model's formula.
"""

from __future__ import annotations

import pytest

from planner.model.evaluate import evaluate
from planner.model.instance import parse_instance
from planner.model.plan import plan_from_spec
from planner.model.terms import step_terms

H, HEADS, KV, F, SEQ, TP = 1024, 8, 2, 2816, 2048, 2
TOK = SEQ // TP                           # micro-batch 1, the sequence-parallel shard
MODEL = {"name": "dense", "layers": 4, "hidden": H, "heads": HEADS, "kv_heads": KV,
         "ffn_hidden": F, "gated_mlp": True, "vocab": 32000, "seq_len": SEQ,
         "dropout": False, "position_embedding": "rope", "normalization": "rmsnorm",
         "linear_bias": False, "tied_embeddings": False}


def _inst(recompute: str, modules=None, precision="bf16", recipe=None, **plan):
    return parse_instance({
        "model": MODEL,
        "training": {"global_batch": 8, "precision": precision,
                     **({"selective_recompute": modules} if modules else {}),
                     **({"fp8_recipe": recipe} if recipe else {})},
        "cluster": {"gpu": "h100-sxm", "gpus": 8},
        "plan": {"tp": TP, "pp": 1, "dp": 4, "micro_batch": 1, "recompute": recompute,
                 "sequence_parallel": True, **plan}}, "dense")


def _layer(inst):
    plan = plan_from_spec(inst, inst.spec.plan)
    return step_terms(inst, plan.grid.degrees(), plan.knobs).layer


@pytest.mark.parametrize("precision, narrow, recipe", [("bf16", 2, None),
                                                        ("fp8", 1, "tensorwise")])
def test_the_mlp_module_frees_the_mlp_s_tensors(precision, narrow, recipe):
    """What a dense layer stops keeping, per GPU: fc1's input (the fused norm's output,
    Transformer Engine's ``ln_out``, kept on the rank's sequence shard of s / t tokens,
    narrow at FP8), fc1's output (both SwiGLU halves, 16-bit, 2 f / t wide on all s tokens
    after the gather) and fc2's input (the activation's output, f / t wide, narrow at FP8);
    the norm's own input, the MLP's input, is the checkpoint's, kept either way. One layer's
    come back for its backward."""
    freed = TOK * narrow * H + SEQ * (2 * 2 * F + narrow * F) / TP
    none = _layer(_inst("none", precision=precision, recipe=recipe))
    mlp = _layer(_inst("selective", ["mlp"], precision=precision, recipe=recipe))
    assert none["stored_first"] - mlp["stored_first"] == pytest.approx(freed, rel=1e-12)
    assert mlp["working_first"] == pytest.approx(freed, rel=1e-12)


def test_the_re_run_forward_gathers_and_scatters_the_mlp_again():
    """Full recompute re-runs the attention's and the MLP's forward, two tensor-parallel
    pairs more per layer; the mlp module re-runs the MLP's alone: one pair, half full
    recompute's extra collectives (sequence parallelism, no overlap)."""
    tp = {m: evaluate(i, plan_from_spec(i, i.spec.plan)).breakdown_s["tp_comm"]
          for m, i in (("none", _inst("none")), ("full", _inst("full")),
                       ("mlp", _inst("selective", ["mlp"])))}
    assert tp["mlp"] - tp["none"] == pytest.approx((tp["full"] - tp["none"]) / 2, rel=1e-9)


def test_the_re_run_costs_the_mlp_s_gemms_and_its_element_wise_traffic_again():
    """The re-run forward's GEMMs are fc1's and fc2's: full recompute re-runs those and the
    attention's projections, so the mlp module adds the MLP's share of that, about its share
    of the layer's weights (3 h f against h (q + 2 kv) + q h: 0.77 here; the GEMM size curve
    runs the MLP's wider GEMMs a little faster, 0.71). Its element-wise
    traffic is the fused norm's (read 2h, write 2h on the rank's s / t tokens) and SwiGLU's
    (read 4f / t, write 2f / t on all s tokens), once more, over the HBM bandwidth."""
    inst = _inst("none")
    none, full, mlp = (_layer(i) for i in (inst, _inst("full"), _inst("selective", ["mlp"])))
    share = (mlp["gemm"] - none["gemm"]) / (full["gemm"] - none["gemm"])
    weights = 3 * H * F / (3 * H * F + H * (H + 2 * KV * H // HEADS) + H * H)
    assert share == pytest.approx(weights, abs=0.1)
    bytes_ = SEQ * (4 * H / TP + 6 * F / TP)
    assert mlp["eltwise"] - none["eltwise"] == pytest.approx(bytes_ / inst.hw.hbm_bw, rel=1e-9)


@pytest.mark.parametrize("overlap", ["plain", "async", "tp_comm_overlap"])
def test_every_tensor_parallel_branch_charges_the_re_run(overlap):
    """Without the asynchronous all-reduce, with it (the default) and under userbuffers'
    overlap, the re-run's pair adds time; plainly exposed it is half full recompute's."""
    kw = {"plain": {"async_tensor_model_parallel_allreduce": False}, "async": {},
          "tp_comm_overlap": {}}[overlap]
    plan = {"tp_comm_overlap": True} if overlap == "tp_comm_overlap" else {}

    def tp(recompute, modules=None):
        inst = parse_instance({
            "model": MODEL, "training": {"global_batch": 8, **kw,
                                         **({"selective_recompute": modules} if modules else {})},
            "cluster": {"gpu": "h100-sxm", "gpus": 8},
            "plan": {"tp": TP, "pp": 1, "dp": 4, "micro_batch": 1, "recompute": recompute,
                     "sequence_parallel": True, **plan}}, "dense")
        return _layer(inst)["tp_comm"]
    assert tp("selective", ["mlp"]) > tp("none")
    if overlap == "plain":
        assert tp("selective", ["mlp"]) - tp("none") == pytest.approx(
            (tp("full") - tp("none")) / 2, rel=1e-9)


def test_moe_layers_are_not_touched():
    """Megatron-Core sets recompute_mlp only where the layer is not an MoE layer: with one
    dense layer before MoE ones, the MoE layers' compute, collectives and memory row stay;
    the dense layer's change."""
    moe = {**MODEL, "experts": 8, "top_k": 2, "moe_ffn_hidden": 1024, "shared_experts": 1,
           "first_dense_layers": 1}

    def run(modules):
        inst = parse_instance({
            "model": moe,
            "training": {"global_batch": 8, **({"selective_recompute": modules} if modules
                                                else {})},
            "cluster": {"gpu": "h100-sxm", "gpus": 8},
            "plan": {"tp": TP, "pp": 1, "dp": 4, "ep": 4, "micro_batch": 1,
                     "recompute": "selective" if modules else "none",
                     "sequence_parallel": True}}, "moe")
        plan = plan_from_spec(inst, inst.spec.plan)
        return _layer(inst), evaluate(inst, plan).memory_by_stage_gib
    (a, ma), (b, mb) = run(None), run(["mlp"])
    assert (a["moe_compute"], a["tp_comm_moe"]) == (b["moe_compute"], b["tp_comm_moe"])
    assert ma["first_moe"] == mb["first_moe"]
    assert b["dense_compute"] > a["dense_compute"] and b["tp_comm"] > a["tp_comm"]
    assert mb["first_dense"]["activations"] < ma["first_dense"]["activations"]


def test_the_mlp_module_costs_less_time_than_full_recompute_and_saves_less_memory():
    """It re-runs the MLP's GEMMs, not the attention's: between no recompute and full
    recompute in time; it keeps the attention's tensors, so more memory than full."""
    r = {m: evaluate(i, plan_from_spec(i, i.spec.plan))
         for m, i in (("none", _inst("none")), ("full", _inst("full")),
                      ("mlp", _inst("selective", ["mlp"])))}
    assert r["none"].step_time_s < r["mlp"].step_time_s < r["full"].step_time_s
    acts = {m: x.memory_gib["activations"] for m, x in r.items()}
    assert acts["full"] < acts["mlp"] < acts["none"]


def test_the_mlp_module_is_exported_and_the_backends_agree():
    from planner.app.emit import emit
    from tests.test_solvers import _agree
    inst = _inst("selective", ["mlp", "core_attn"])
    text = emit(inst, plan_from_spec(inst, inst.spec.plan), "megatron")
    assert "--recompute-modules core_attn mlp \\\n" in text
    _agree({"model": {**MODEL, "layers": 8, "seq_len": 8192},
            "training": {"global_batch": 32, "precision": "bf16",
                         "selective_recompute": ["mlp"]},
            "cluster": {"gpu": "h100-sxm", "nodes": 2},
            "constraints": {"recompute": "selective", "max_recompute_layers": 0,
                            "optimizer_offload": False}})

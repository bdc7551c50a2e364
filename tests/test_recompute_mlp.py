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

"""The activations one MoE layer keeps for its backward, counted tensor by tensor from
Megatron-Core's source (Megatron-LM d98e8a64dd, Transformer Engine d0067d0da), against the
model's stored bytes per layer and micro-batch.

The layer: SwiGLU experts, ``alltoall`` dispatcher, grouped GEMM, expert tensor parallelism 1,
sequence parallelism at TP 2, flash attention, no dropout, Megatron-Core's defaults
(``moe_permute_fusion`` off, the router in the logits' dtype, no auxiliary loss), no recompute.
Each GPU holds ``tok = b s / t`` tokens of the layer's input."""

from __future__ import annotations

import pytest

from planner.model.instance import parse_instance
from planner.model.plan import plan_from_spec
from planner.model.terms import step_terms

H, HEADS, FE, TOP_K, SEQ, TP = 1024, 8, 512, 2, 1024, 2
TOK = SEQ // TP                           # micro-batch 1, the sequence-parallel shard


def model_layer(precision: str, shared: int = 0, modules: list[str] | None = None,
                recipe: str | None = None) -> dict:
    """The evaluator's per-layer figures (``stored_first``, ``working_first``) of the layer,
    with Megatron-Core's ``recompute_modules`` ``modules`` under selective recompute, at FP8
    with the scaling ``recipe`` (None: Megatron-Core's default, delayed)."""
    inst = parse_instance({
        "model": {"name": "moe", "layers": 4, "hidden": H, "heads": HEADS, "vocab": 32000,
                  "seq_len": SEQ, "dropout": False, "gated_mlp": True, "experts": 8,
                  "top_k": TOP_K, "moe_ffn_hidden": FE, "position_embedding": "rope",
                  "shared_experts": shared},
        "training": {"global_batch": 8, "precision": precision,
                     **({"selective_recompute": modules} if modules else {}),
                     **({"fp8_recipe": recipe} if recipe else {})},
        "cluster": {"gpu": "h100-sxm", "gpus": 8},
        "plan": {"tp": TP, "pp": 1, "dp": 4, "ep": 2, "micro_batch": 1,
                 "recompute": "selective" if modules else "none",
                 "sequence_parallel": True}}, "moe")
    plan = plan_from_spec(inst, inst.spec.plan)
    return step_terms(inst, plan.grid.degrees(), plan.knobs).layer


def model_stored(precision: str, shared: int = 0) -> float:
    return float(model_layer(precision, shared)["stored_first"])


def hand_count(narrow: float, shared: int = 0, delayed: bool = True) -> int:
    """Bytes per GPU; ``narrow`` is what a Transformer Engine linear keeps of its input per
    element (2 in bf16, 1 under per-tensor FP8); ``shared``: shared experts of width f_e, one
    MLP (Megatron-Core ``SharedExpertMLP``) on the same norm output as the router. Two linears
    keep a narrow copy of a 16-bit tensor another holds under ``delayed`` scaling only: the
    shared expert's fc1 (of the router's input) and the attention's output projection (of the
    flash output); for the other recipes Megatron-Core sets ``set_save_original_input`` on
    both (shared_experts.py ``linear_fc1``, attention.py ``linear_proj``), and they keep the
    16-bit tensor."""
    q = kv = H                            # 8 heads of 128, as many key / value heads
    attention = (
        2 * H                             # the input norm's input
        + narrow * H                      # the QKV linear's input (the norm's output)
        + 2 * (q + kv + kv)               # Q, K, V for the flash kernel (heads split over TP)
        + 2 * q                           # the kernel's output, kept by flash for its backward
        + (narrow * q if narrow < 2 and delayed else 0)  # the projection's own narrow copy
        + 4 * HEADS                       # fp32 softmax statistics per head and query
    )
    moe = (
        2 * H                             # the pre-MLP norm's input
        + 2 * H                           # its output, saved in 16 bits by the router's gating
                                          # GEMM (moe_utils.py RouterGatingLinearFunction)
        + 8 * TOP_K + 4 * TOP_K           # top-k indices (int64) and softmax (fp32)
        + 16 * TOP_K                      # permute: sorted indices and the probs' gather index
        + 2 * TOP_K                       # permuted probs, saved by the weighted SwiGLU
        + TOP_K * (narrow * H             # per routed copy: the grouped fc1's input,
                   + 2 * 2 * FE           # fc1's output (the SwiGLU's 16-bit input),
                   + narrow * FE)         # the grouped fc2's input
    )
    if shared:
        moe += ((narrow * H if narrow < 2 and delayed else 0)  # its fc1's own narrow
                                                   # copy of the input (in 16 bits, and kept
                                                   # original, it shares the router's)
                + shared * (2 * 2 * FE             # its fc1 output (both SwiGLU halves)
                            + narrow * FE))        # its fc2 input
    return TOK * (attention + moe)


@pytest.mark.parametrize("shared", [0, 1])
@pytest.mark.parametrize("precision, narrow, recipe", [("bf16", 2, None), ("fp8", 1, None),
                                                        ("fp8", 1, "tensorwise")])
def test_an_moe_layer_keeps_what_megatron_core_saves(precision, narrow, recipe, shared):
    layer = model_layer(precision, shared, recipe=recipe)
    assert layer["stored_first"] == pytest.approx(
        hand_count(narrow, shared, delayed=recipe is None), rel=1e-12)


def test_fp8_keeps_the_routers_input_in_16_bits():
    """Under FP8 an MoE layer saves less than in bf16 only where Transformer Engine's linears
    keep narrow copies (the QKV input and each routed copy's fc1 and fc2 inputs); the MLP's
    input stays 16-bit for the router, and the flash output adds the projection's narrow copy:
    ``tok (h - h + top_k (h + f_e))`` fewer bytes."""
    saved = model_stored("bf16") - model_stored("fp8")
    assert saved == TOK * TOP_K * (H + FE)


# ---- Megatron-Core's output-discarding recompute modules ----------------------------------

def freed_by(module: str, narrow: float) -> int:
    """Bytes per GPU the layer above stops keeping under one recompute module, named by the
    tensors of :func:`hand_count` that Megatron-Core (Megatron-LM d98e8a64dd) frees:

    * ``layernorm`` (transformer_layer.py: ``recompute_pre_mlp_layernorm``, the pre-MLP
      norm's output discarded once read, CheckpointWithoutOutput): the router's 16-bit copy of
      the norm output, which a shared expert's fc1 reads too (under the recipes these modules
      run with it keeps the original: no copy of its own). The input norm is fused into the
      QKV layer here (an IdentityOp: not recomputed).
    * ``moe_act`` (experts.py ``activation_recompute``): the grouped fc2's input per routed
      copy (at a narrow precision ``set_save_original_input(linear_fc2)``: its narrow copy is
      not made, the original is freed)."""
    if module == "layernorm":
        return TOK * 2 * H
    return TOK * TOP_K * narrow * FE


@pytest.mark.parametrize("shared", [0, 1])
@pytest.mark.parametrize("precision, narrow, recipe", [("bf16", 2, None),
                                                        ("fp8", 1, "tensorwise")])
@pytest.mark.parametrize("modules", [["layernorm"], ["moe_act"], ["layernorm", "moe_act"]])
def test_recompute_modules_free_what_megatron_core_discards(precision, narrow, recipe, shared,
                                                            modules):
    """Each layer keeps the hand count less what the modules free; one layer's freed tensors
    come back during its backward (the working set). (Under delayed scaling, Megatron-Core's
    default FP8 recipe, these modules are refused, as TransformerConfig refuses them.)"""
    layer = model_layer(precision, shared, modules, recipe)
    freed = sum(freed_by(m, narrow) for m in modules)
    assert layer["stored_first"] == pytest.approx(
        hand_count(narrow, shared, delayed=False) - freed, rel=1e-12)
    assert layer["working_first"] == pytest.approx(freed, rel=1e-12)


def test_recompute_modules_cost_time_and_free_memory():
    """A re-run costs time (element-wise, so little) and the freed bytes lower the peak: no
    recompute < layernorm < both in time, the other way in memory."""
    from planner.model.evaluate import evaluate

    def run(modules):
        inst = parse_instance({
            "model": {"name": "moe", "layers": 8, "hidden": H, "heads": HEADS, "vocab": 32000,
                      "seq_len": SEQ, "dropout": False, "gated_mlp": True, "experts": 8,
                      "top_k": TOP_K, "moe_ffn_hidden": FE, "position_embedding": "rope"},
            "training": {"global_batch": 64,
                         **({"selective_recompute": modules} if modules else {})},
            "cluster": {"gpu": "h100-sxm", "gpus": 8},
            "plan": {"tp": TP, "pp": 1, "dp": 4, "ep": 2, "micro_batch": 4,
                     "recompute": "selective" if modules else "none",
                     "sequence_parallel": True}}, "moe")
        r = evaluate(inst, plan_from_spec(inst, inst.spec.plan))
        return r.step_time_s, r.memory_gib["total"]
    none, norm, both = run(None), run(["layernorm"]), run(["layernorm", "moe_act"])
    assert none[0] < norm[0] < both[0] < 1.02 * none[0]
    assert none[1] > norm[1] > both[1]

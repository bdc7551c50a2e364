"""``[model] head_dim``: attention heads whose width is not ``hidden / heads`` (Qwen3).

Checked against Megatron-LM's own FLOP count with ``--kv-channels``, not against this
project's formulas; the default width must leave every number as it was."""

from __future__ import annotations

import pytest

from planner.app.emit import emit
from planner.model.evaluate import evaluate
from planner.model.instance import parse_instance
from planner.model.plan import plan_from_spec
from planner.model.workload import Shape

#: Qwen3-0.6B (Hugging Face Qwen/Qwen3-0.6B config.json): 16 heads of 128 on a hidden of 1024
QWEN3_06B = {"layers": 28, "hidden": 1024, "heads": 16, "kv_heads": 8, "head_dim": 128,
             "ffn_hidden": 3072, "gated_mlp": True, "vocab": 151936, "seq_len": 4096,
             "tied_embeddings": True, "position_embedding": "rope", "dropout": False}


def _inst(model, plan=None, precision="bf16"):
    return parse_instance({"model": model, "training": {"global_batch": 64, "precision": precision},
                           "cluster": {"gpu": "h100-sxm", "gpus": 8},
                           "plan": plan or {"tp": 2, "pp": 1, "dp": 4, "micro_batch": 1}})


def _report(inst):
    return evaluate(inst, plan_from_spec(inst, inst.spec.plan), spec=inst.spec.plan)


def megatron_flops(m, batch):
    """Megatron-LM ``num_floating_point_operations`` (megatron/training/training.py) for a dense
    SwiGLU model with GQA and ``--kv-channels``: ``12 B s L h^2 ((1 + g/a + s/h) q/h + 3/2 f/h
    + V / (2 L h))`` with ``q = kv_channels * a``."""
    h, s, L = m["hidden"], m["seq_len"], m["layers"]
    ratio = m["head_dim"] * m["heads"] / h
    return 12 * batch * s * L * h * h * (
        (1 + m["kv_heads"] / m["heads"] + s / h) * ratio
        + m["ffn_hidden"] / h * 1.5
        + m["vocab"] / (2 * L * h))


def test_model_flops_are_megatrons_with_kv_channels():
    sh = Shape.of(_inst(QWEN3_06B).model)
    assert sh.model_flops(64) == pytest.approx(megatron_flops(QWEN3_06B, 64), rel=1e-12)
    # without the key the attention would be 1024 wide, not 2048: another count
    narrow = Shape.of(_inst({k: v for k, v in QWEN3_06B.items() if k != "head_dim"}).model)
    assert narrow.model_flops(64) < 0.85 * sh.model_flops(64)


def test_the_default_width_changes_nothing():
    """``head_dim = hidden / heads`` given explicitly is the model without the key: the same
    step time, memory and breakdown to the last bit (GQA, FP8 and context parallelism on)."""
    base = {"preset": "llama3-8b"}
    plan = {"tp": 2, "cp": 2, "pp": 1, "dp": 2, "micro_batch": 1}
    a = _report(_inst(base, plan, "fp8"))
    b = _report(_inst({**base, "head_dim": 128}, plan, "fp8"))
    assert a.step_time_s == b.step_time_s
    assert a.memory_gib == b.memory_gib and a.breakdown_s == b.breakdown_s


def test_a_wider_head_costs_attention_and_its_memory():
    """Qwen3's 2048-wide attention on a hidden of 1024: the attention GEMMs, the core and the
    stored Q / K / V / output grow against the same model read 1024 wide, the MLP does not."""
    wide = _report(_inst(QWEN3_06B))
    narrow = _report(_inst({k: v for k, v in QWEN3_06B.items() if k != "head_dim"}))
    assert wide.breakdown_s["compute"] > 1.15 * narrow.breakdown_s["compute"]
    assert wide.memory_gib["activations"] > narrow.memory_gib["activations"]
    assert wide.memory_gib["weights"] > narrow.memory_gib["weights"]


def test_hidden_need_not_be_a_multiple_of_heads_with_head_dim():
    model = {**QWEN3_06B, "hidden": 1000, "heads": 16, "kv_heads": 8}
    assert Shape.of(_inst(model).model).q == 16 * 128


def test_exports_say_the_head_width():
    inst = _inst(QWEN3_06B)
    plan = plan_from_spec(inst, inst.spec.plan)
    assert "--kv-channels 128" in emit(inst, plan, "megatron")
    assert "kv_channels: 128" in emit(inst, plan, "nemo")
    fsdp = _inst(QWEN3_06B, {"tp": 2, "pp": 1, "dp": 4, "micro_batch": 1,
                             "dp_sharding": "optim_grads_params"})
    assert "head dim 128" in emit(fsdp, plan_from_spec(fsdp, fsdp.spec.plan), "torchtitan")
    plain = _inst({k: v for k, v in QWEN3_06B.items() if k != "head_dim"})
    assert "--kv-channels" not in emit(plain, plan_from_spec(plain, plain.spec.plan), "megatron")

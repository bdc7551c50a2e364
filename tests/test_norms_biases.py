"""The norms' kind, the linear layers' biases, the QK norm and a plain MLP's activation
(``[model] normalization``, ``linear_bias``, ``qkv_bias``, ``qk_norm``, ``activation``): the
parameters they add, checked against released checkpoints, what the exports build, and the
input rules.

The checkpoints' counts are figures this project does not compute: each Hugging Face model's
``model.safetensors.index.json`` ``metadata.total_size`` (bytes, all tensors bf16) over 2.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from planner.model.errors import InputError
from planner.model.evaluate import evaluate
from planner.model.instance import parse_instance, presets
from planner.model.plan import plan_from_spec
from planner.model.schema import ModelSpec
from planner.model.workload import Shape
from tests.test_emit import emitted, parse_megatron, parse_yaml

#: total_size / 2 of the released checkpoints (meta-llama/Meta-Llama-3-8B, Meta-Llama-3-70B,
#: Llama-3.1-405B, mistralai/Mixtral-8x7B-v0.1)
CHECKPOINT_PARAMS = {
    "llama3-8b": 8_030_261_248,
    "llama3-70b": 70_553_706_496,
    "llama3-405b": 405_853_388_800,
    "mixtral-8x7b": 46_702_792_704,
}


@pytest.mark.parametrize("name", sorted(CHECKPOINT_PARAMS))
def test_presets_hold_their_checkpoints_parameters(name):
    """RMSNorm (one weight of h per norm) and no linear biases: the shape's count is the
    checkpoint's to the parameter. GPT-3's norms and biases on the same shape (the defaults)
    count more, which is what every Llama-shaped model carried before these keys."""
    spec = ModelSpec(**presets()[name])
    assert Shape.of(spec).total_params == CHECKPOINT_PARAMS[name]
    gpt_style = ModelSpec(**{**presets()[name], "normalization": "layernorm",
                             "linear_bias": True})
    assert Shape.of(gpt_style).total_params > CHECKPOINT_PARAMS[name]


def _qwen2_like(plan: dict | None = None) -> dict:
    """A Qwen2-shaped instance: RMSNorm, no linear biases but the QKV projection's."""
    doc = {"model": {"layers": 24, "hidden": 896, "heads": 14, "kv_heads": 2,
                     "ffn_hidden": 4864, "gated_mlp": True, "vocab": 151936, "seq_len": 4096,
                     "position_embedding": "rope", "dropout": False,
                     "normalization": "rmsnorm", "linear_bias": False, "qkv_bias": True},
           "training": {"global_batch": 64},
           "cluster": {"gpu": "h100-sxm", "gpus": 8}}
    if plan:
        doc["plan"] = plan
    return doc


def test_a_qkv_bias_alone_is_exported_as_megatrons_and_nemos_qkv_bias():
    """Megatron-LM sets ``add_qkv_bias`` whenever ``add_bias_linear`` holds (validate_args),
    so a QKV bias alone is ``--disable-bias-linear --add-qkv-bias``; NeMo takes the
    TransformerConfig fields of the same names."""
    doc = _qwen2_like({"tp": 2, "pp": 1, "dp": 4, "micro_batch": 2})
    a = parse_megatron(emitted(doc, doc["plan"], "megatron"))
    assert a["--normalization"] == "RMSNorm"
    assert a["--disable-bias-linear"] is True and a["--add-qkv-bias"] is True
    y = parse_yaml(emitted(doc, doc["plan"], "nemo"))
    assert (y["model.config.normalization"], y["model.config.add_bias_linear"],
            y["model.config.add_qkv_bias"]) == ("RMSNorm", False, True)
    # without the QKV bias Megatron-LM is not told, and NeMo is told false, so that a Qwen2
    # recipe's own add_qkv_bias = True does not survive the overrides
    doc["model"]["qkv_bias"] = False
    assert "--add-qkv-bias" not in parse_megatron(emitted(doc, doc["plan"], "megatron"))
    y = parse_yaml(emitted(doc, doc["plan"], "nemo"))
    assert y["model.config.add_qkv_bias"] is False and y["model.config.qk_layernorm"] is False


def test_torchtitan_says_which_parts_of_the_model_its_models_cannot_build():
    """torchtitan's job config takes the model from a registered flavor of its own models
    (RMSNorm, bias-free layers, SwiGLU, rotary positions): the export says what of the costed
    model those cannot be, and says nothing for a Llama-shaped model."""
    plan = {"tp": 1, "pp": 1, "dp": 8, "micro_batch": 2, "dp_sharding": "optim_grads_params"}
    text = emitted(_qwen2_like(), plan, "torchtitan")
    assert "a QKV bias: cannot express with torchtitan" in text
    llama = _qwen2_like(plan)
    del llama["model"]["qkv_bias"]
    assert "cannot express with torchtitan" not in emitted(llama, llama["plan"], "torchtitan")
    gpt = _qwen2_like(plan)
    gpt["model"].update(normalization="layernorm", linear_bias=True, qkv_bias=True,
                        position_embedding="learned", gated_mlp=False)
    said = emitted(gpt, gpt["plan"], "torchtitan").replace("\n#   ", " ")
    assert ("LayerNorm, a bias on every linear layer, learned positions, a plain (not gated) "
            "MLP: cannot express with torchtitan") in said


def test_a_qkv_bias_switched_off_under_linear_biases_is_an_input_error():
    doc = _qwen2_like()
    doc["model"].update(linear_bias=True, qkv_bias=False)
    with pytest.raises(InputError, match="qkv_bias = false needs linear_bias = false"):
        parse_instance(doc)
    mla = {"preset": "deepseek-v3", "qkv_bias": True}
    with pytest.raises(InputError, match="qkv_bias does not apply to multi-head latent"):
        parse_instance({**_qwen2_like(), "model": mla})


def test_biases_and_norms_move_the_weights_the_plan_holds():
    """Without tensor or pipeline parallelism a GPU holds every weight, so its weights' bytes
    scale with the parameter count: the keys reach the memory the plan is checked against."""
    def weights(**keys):
        doc = _qwen2_like({"tp": 1, "pp": 1, "dp": 8, "micro_batch": 1})
        doc["model"].update(keys)
        inst = parse_instance(doc)
        rep = evaluate(inst, plan_from_spec(inst, inst.spec.plan), spec=inst.spec.plan)
        return rep.memory_gib["weights"], Shape.of(inst.model).total_params
    lean, lean_p = weights(qkv_bias=False)
    full, full_p = weights(normalization="layernorm", linear_bias=True, qkv_bias=True)
    assert full_p > lean_p
    assert full / lean == pytest.approx(full_p / lean_p, rel=1e-9)


def test_a_qk_norm_is_exported_and_costs_memory_and_time():
    """Qwen3's QK norm: Megatron-LM ``--qk-layernorm``, NeMo ``qk_layernorm``; it keeps the
    queries and keys before it for its backward and reads and writes them, so a plan holds
    more activations and takes longer with it, and Megatron-LM's CI case with the flag
    (gpt3_mcore_te_tp4_pp1_qk_layernorm_test_mode) still measured at least the model's peak
    (tests/test_megatron_ci_memory.py bounds every row)."""
    plan = {"tp": 2, "pp": 1, "dp": 4, "micro_batch": 2}
    doc = _qwen2_like(plan)
    doc["model"].update(qkv_bias=False, qk_norm=True, head_dim=128)
    a = parse_megatron(emitted(doc, doc["plan"], "megatron"))
    assert a["--qk-layernorm"] is True and "--add-qkv-bias" not in a
    assert parse_yaml(emitted(doc, doc["plan"], "nemo"))["model.config.qk_layernorm"] is True

    def report(qk: bool):
        d = _qwen2_like(plan)
        d["model"].update(qkv_bias=False, qk_norm=qk, head_dim=128)
        inst = parse_instance(d)
        return evaluate(inst, plan_from_spec(inst, inst.spec.plan), spec=inst.spec.plan)
    with_norm, without = report(True), report(False)
    assert with_norm.memory_gib["activations"] > without.memory_gib["activations"]
    assert with_norm.breakdown_s["compute"] > without.breakdown_s["compute"]
    with pytest.raises(InputError, match="qk_norm does not apply to multi-head latent"):
        parse_instance({**_qwen2_like(), "model": {"preset": "deepseek-v3", "qk_norm": True}})


def test_a_squared_relu_mlp_is_exported_as_one():
    """Nemotron's plain MLP runs squared ReLU (Megatron-LM ``--squared-relu``; NeMo's
    NemotronConfig sets ``activation_func = squared_relu``, a callable the YAML cannot hold, so a
    comment says it); GeLU's default builds none of it, and a gated MLP (SwiGLU) refuses it."""
    doc = {"model": {"preset": "nemotron4-15b"}, "training": {"global_batch": 64},
           "cluster": {"gpu": "h100-sxm", "gpus": 16},
           "plan": {"tp": 4, "pp": 1, "dp": 4, "micro_batch": 1}}
    a = parse_megatron(emitted(doc, doc["plan"], "megatron"))
    assert a["--squared-relu"] is True and "--swiglu" not in a
    assert a["--disable-bias-linear"] is True and "--normalization" not in a    # LayerNorm
    assert "activation_func = nemo.collections.llm.fn.activation.squared_relu" in \
        emitted(doc, doc["plan"], "nemo").replace("\n#   ", " ")
    gelu = {**doc, "model": {"preset": "gpt3-175b"}, "cluster": {"gpu": "a100-80gb", "gpus": 16}}
    assert "--squared-relu" not in parse_megatron(emitted(gelu, gelu["plan"], "megatron"))
    bad = _qwen2_like()
    bad["model"]["activation"] = "squared_relu"
    with pytest.raises(InputError, match="applies to a plain MLP: a gated_mlp is SwiGLU"):
        parse_instance(bad)


def test_exports_that_megatron_lm_would_refuse_or_build_differently():
    """Three rules of Megatron-LM read from its source (the mirror at d98e8a64dd):

    - multi-head latent attention builds the norms of its compressed query and key / value
      only with ``qk_layernorm`` (gpt_layer_specs.py; its DeepSeek-shaped CI case passes both),
      and the model counts them, so an MLA export sets it (NeMo's DeepSeekV3Config too);
    - squared ReLU with biases needs ``--no-bias-gelu-fusion`` (TransformerConfig raises for a
      fused bias-activation that is not GeLU or SiLU; only --disable-bias-linear clears it);
    - an MoE model with biases needs ``--no-bias-dropout-fusion`` (TEGroupedMLP asserts
      against biases with the fused bias-dropout-add, which is on by default)."""
    mla = {"model": {"preset": "deepseek-v3", "mtp_layers": 0}, "training": {"global_batch": 64},
           "cluster": {"gpu": "h100-sxm", "gpus": 64},
           "plan": {"tp": 1, "pp": 8, "dp": 8, "ep": 8, "micro_batch": 1,
                    "first_stage_layers": 5, "last_stage_layers": 8}}
    a = parse_megatron(emitted(mla, mla["plan"], "megatron"))
    assert a["--multi-latent-attention"] is True and a["--qk-layernorm"] is True
    assert parse_yaml(emitted(mla, mla["plan"], "nemo"))["model.config.qk_layernorm"] is True
    assert "--no-bias-dropout-fusion" not in a               # (no biases)

    relu = {"model": {"preset": "nemotron4-15b", "linear_bias": True},
            "training": {"global_batch": 64}, "cluster": {"gpu": "h100-sxm", "gpus": 16},
            "plan": {"tp": 4, "pp": 1, "dp": 4, "micro_batch": 1}}
    assert parse_megatron(emitted(relu, relu["plan"], "megatron"))["--no-bias-gelu-fusion"] is True
    relu["model"]["linear_bias"] = False
    assert "--no-bias-gelu-fusion" not in parse_megatron(emitted(relu, relu["plan"], "megatron"))
    # NeMo's GPT and Llama configs switch the fusion on; the export switches it off where
    # TransformerConfig would refuse it (squared ReLU; a plain GeLU MLP without biases)
    assert parse_yaml(emitted(relu, relu["plan"], "nemo"))["model.config.bias_activation_fusion"] is False
    gelu = {**relu, "model": {"preset": "gpt-1.3b"}}
    assert "model.config.bias_activation_fusion" not in parse_yaml(emitted(gelu, gelu["plan"], "nemo"))
    gelu["model"]["linear_bias"] = False
    assert parse_yaml(emitted(gelu, gelu["plan"], "nemo"))["model.config.bias_activation_fusion"] is False

    moe = {"model": {"preset": "mixtral-8x7b", "linear_bias": True},
           "training": {"global_batch": 64}, "cluster": {"gpu": "h100-sxm", "gpus": 64},
           "plan": {"tp": 1, "pp": 4, "dp": 16, "ep": 8, "micro_batch": 1}}
    assert parse_megatron(emitted(moe, moe["plan"], "megatron"))["--no-bias-dropout-fusion"] is True
    moe["model"]["linear_bias"] = False
    assert "--no-bias-dropout-fusion" not in parse_megatron(emitted(moe, moe["plan"], "megatron"))


_MEGATRON = tomllib.loads((Path(__file__).resolve().parent / "data"
                           / "megatron_param_counts.toml").read_text())["cases"]


@pytest.mark.parametrize("case", _MEGATRON, ids=[c["name"] for c in _MEGATRON])
def test_parameter_counts_are_megatron_cores(case):
    """Megatron-Core, building the model itself (GPTModel on CPU at Megatron-LM d98e8a64dd:
    tools/megatron_params.py), counts what the planner counts, to the parameter: norms and
    biases (the router's bias of one per expert included), the QK norm, squared ReLU, GQA,
    MoE with dense layers, MLA (with the norm the Transformer Engine spec puts before an
    uncompressed query projection) and multi-token prediction. Of the models it refuses, the
    one with biased shared experts is refused by the Megatron-LM and NeMo exports too."""
    m = ModelSpec(**case["model"])
    if "refused" in case:
        if m.moe and m.shared_experts and m.linear_bias:
            doc = {"model": case["model"], "training": {"global_batch": 8},
                   "cluster": {"gpu": "h100-sxm", "gpus": 8},
                   "plan": {"tp": 1, "pp": 1, "dp": 8, "ep": 4, "micro_batch": 1}}
            for fmt in ("megatron", "nemo"):
                with pytest.raises(InputError, match="Megatron-Core builds shared experts "
                                                     "without biases"):
                    emitted(doc, doc["plan"], fmt)
        return
    assert Shape.of(m).total_params == case["megatron_params"]

"""Hugging Face families read since the reader's first families: GLM-4.5 (``glm4_moe``),
Llama 4 (``llama4``, a vision-language wrapper whose decoder sits in ``text_config``) and the
wrapper rule itself; with the keys they brought (``qk_l2_norm``, ``moe_router_score_function``)
as the exports write them.

The configs are the public ones, as published elsewhere: GLM-4.5-Air's ``config.json`` as
ms-swift dumps it for zai-org/GLM-4.5-Air; Llama-4-Maverick-17B-128E's as TensorRT-LLM's
tests carry it (tests/unittest/_torch/modeling/test_modeling_llama_min_latency.py, there cut
to 2 layers with ``no_rope_layer_interval = 2`` added: here 48 layers and the default
interval, as the checkpoint has them). Scout differs from Maverick by its 16 experts in every
layer and its query / key L2 norm. Parameter totals are counted tensor by tensor from
transformers' module shapes (modeling_glm4_moe.py, modeling_llama4.py), independently of
:class:`~planner.model.workload.Shape`, and checked against the totals their authors publish
(GLM-4.5-Air: 106B total; Llama 4 Maverick: 400B total, 17B active; Scout: 17B active).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from planner.model.errors import InputError
from planner.model.hf_config import read_hf_config, read_hf_config_with_context
from planner.model.instance import parse_instance
from planner.model.schema import ModelSpec
from planner.model.workload import Shape

GLM45_AIR = {
    "architectures": ["Glm4MoeForCausalLM"], "attention_bias": True, "attention_dropout": 0.0,
    "first_k_dense_replace": 1, "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096,
    "intermediate_size": 10944, "max_position_embeddings": 131072, "model_type": "glm4_moe",
    "moe_intermediate_size": 1408, "n_group": 1, "n_routed_experts": 128, "n_shared_experts": 1,
    "norm_topk_prob": True, "num_attention_heads": 96, "num_experts_per_tok": 8,
    "num_hidden_layers": 46, "num_key_value_heads": 8, "num_nextn_predict_layers": 1,
    "partial_rotary_factor": 0.5, "rms_norm_eps": 1e-05, "rope_scaling": None,
    "rope_theta": 1000000, "routed_scaling_factor": 1.0, "tie_word_embeddings": False,
    "topk_group": 1, "use_qk_norm": False, "vocab_size": 151552}

MAVERICK = {
    "architectures": ["Llama4ForConditionalGeneration"], "model_type": "llama4",
    "boi_token_index": 200080, "eoi_token_index": 200081, "image_token_index": 200092,
    "text_config": {
        "attention_bias": False, "attention_chunk_size": 8192, "attention_dropout": 0.0,
        "head_dim": 128, "hidden_act": "silu", "hidden_size": 5120,
        "interleave_moe_layer_step": 2, "intermediate_size": 8192,
        "intermediate_size_mlp": 16384, "max_position_embeddings": 1048576,
        "model_type": "llama4_text", "num_attention_heads": 40, "num_experts_per_tok": 1,
        "num_hidden_layers": 48, "num_key_value_heads": 8, "num_local_experts": 128,
        "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 500000.0,
        "use_qk_norm": False, "vocab_size": 202048},
    "vision_config": {"model_type": "llama4_vision_model"}}


def scout() -> dict:
    cfg = json.loads(json.dumps(MAVERICK))
    cfg["text_config"].update(num_local_experts=16, interleave_moe_layer_step=1,
                              use_qk_norm=True)
    return cfg


def write(tmp_path: Path, cfg: dict, name: str = "config.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(cfg))
    return path


def shape(keys: dict, seq_len: int = 4096) -> Shape:
    return Shape.of(ModelSpec(**{**keys, "seq_len": seq_len}))


def linear(n_in: int, n_out: int, bias: bool = False) -> int:
    return n_in * n_out + (n_out if bias else 0)


# ---- GLM-4.5 ------------------------------------------------------------------------------

def glm_air_params() -> tuple[int, int]:
    """(main model, one prediction depth) of GLM-4.5-Air, from Glm4MoeForCausalLM's modules:
    q / k / v with a bias (attention_bias), o without; two RMSNorms per layer; layer 0 a
    gated MLP of intermediate_size, the others 128 routed experts, one shared expert and a
    router of 128 x hidden (its e_score_correction_bias a buffer, not a parameter); untied
    embedding and head, a final norm. The prediction depth (checkpoint layer 46, as
    DeepSeek-V3's): a decoder layer of the last kind, its two input norms, the 2h -> h
    projection and its head's norm (the head and embedding shared with the main model)."""
    h, a, kv, d, v = 4096, 96, 8, 128, 151552
    attn = linear(h, a * d, True) + 2 * linear(h, kv * d, True) + linear(a * d, h) + 2 * h
    dense = 3 * h * 10944
    moe = 128 * 3 * h * 1408 + 3 * h * 1408 + 128 * h
    main = 46 * attn + dense + 45 * moe + 2 * v * h + h
    return main, attn + moe + 2 * h + linear(2 * h, h) + h


def test_glm45_air_keys_and_parameters(tmp_path):
    d = read_hf_config(write(tmp_path, GLM45_AIR))
    assert d == {
        "layers": 46, "hidden": 4096, "heads": 96, "kv_heads": 8, "head_dim": 128,
        "ffn_hidden": 10944, "gated_mlp": True, "vocab": 151552, "tied_embeddings": False,
        "position_embedding": "rope", "dropout": False, "normalization": "rmsnorm",
        "linear_bias": False, "qkv_bias": True, "mtp_layers": 1, "experts": 128, "top_k": 8,
        "moe_ffn_hidden": 1408, "shared_experts": 1, "first_dense_layers": 1,
        "moe_layer_interval": 1, "moe_router_score_function": "sigmoid"}
    main, depth = glm_air_params()
    assert abs(main / 106e9 - 1) < 0.01          # "106B total parameters" (zai-org)
    assert shape({k: v for k, v in d.items() if k != "mtp_layers"}).total_params == main
    assert shape(d).total_params == main + depth
    # Hugging Face's sparse layers (Glm4MoeDecoderLayer: layer_idx >= first_k_dense_replace)
    spec = ModelSpec(**d, seq_len=4096)
    assert spec.moe_layers == sum(1 for i in range(46) if i >= 1)


def test_glm45_qk_norm_defaults_and_alias(tmp_path):
    """GLM-4.5 (not Air) norms queries and keys (``use_qk_norm``); absent keys take
    Glm4MoeConfig's defaults (8 kv heads, 1 shared expert, 1 dense layer, 1 prediction
    depth), and the expert count may come under transformers' alias ``num_local_experts``."""
    d = read_hf_config(write(tmp_path, {**GLM45_AIR, "use_qk_norm": True}))
    assert d["qk_norm"] is True and "qk_l2_norm" not in d
    sparse = {k: v for k, v in GLM45_AIR.items()
              if k not in ("num_key_value_heads", "n_shared_experts", "first_k_dense_replace",
                           "num_nextn_predict_layers", "n_routed_experts")}
    d = read_hf_config(write(tmp_path, {**sparse, "num_local_experts": 160}, "b.json"))
    assert (d["kv_heads"], d["shared_experts"], d["first_dense_layers"], d["mtp_layers"],
            d["experts"]) == (8, 1, 1, 1, 160)
    d = read_hf_config(write(tmp_path, {**GLM45_AIR, "num_nextn_predict_layers": 0}, "c.json"))
    assert "mtp_layers" not in d


# ---- Llama 4 ------------------------------------------------------------------------------

def llama4_params(experts: int, step: int) -> tuple[int, int]:
    """(total, active) of a Llama 4 decoder from Llama4ForCausalLM's modules: q / k / v / o
    without biases, two RMSNorms per layer (the L2 norm has no weights); MoE layers (every
    step-th from step - 1) with experts whose gate_up is h x 2f and down f x h, one shared
    expert of f and a router of experts x h; the other layers a gated MLP of
    intermediate_size_mlp; untied embedding and head, a final norm. Active: one routed
    expert, the shared one and the router per MoE layer."""
    h, v, f, f_mlp = 5120, 202048, 8192, 16384
    attn = linear(h, 40 * 128) + 2 * linear(h, 8 * 128) + linear(40 * 128, h) + 2 * h
    n_moe = len(range(step - 1, 48, step))
    expert = 3 * h * f
    moe = experts * expert + expert + experts * h
    rest = 48 * attn + (48 - n_moe) * 3 * h * f_mlp + 2 * v * h + h
    return rest + n_moe * moe, rest + n_moe * (2 * expert + experts * h)


def test_llama4_maverick_and_scout_from_their_wrappers(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mav, ctx = read_hf_config_with_context(write(tmp_path, MAVERICK, "m.json"))
        sco = read_hf_config(write(tmp_path, scout(), "s.json"))
    assert mav == {
        "layers": 48, "hidden": 5120, "heads": 40, "kv_heads": 8, "ffn_hidden": 16384,
        "gated_mlp": True, "vocab": 202048, "tied_embeddings": False,
        "position_embedding": "rope", "dropout": False, "normalization": "rmsnorm",
        "linear_bias": False, "experts": 128, "top_k": 1, "moe_ffn_hidden": 8192,
        "shared_experts": 1, "first_dense_layers": 1, "moe_layer_interval": 2,
        "moe_router_score_function": "sigmoid",
        "approximates": "the language model (text_config) alone: its vision encoder and "
                        "projector (vision_config) are not costed"}
    assert sco["qk_l2_norm"] is True and "qk_norm" not in sco and "qk_norm" not in mav
    assert (sco["experts"], sco["first_dense_layers"], sco["moe_layer_interval"]) == (16, 0, 1)
    # the MoE layers are transformers' moe_layers: range(step - 1, layers, step)
    m = ModelSpec(**mav, seq_len=8192)
    assert [int(i >= m.first_dense_layers and (i - 1) % 2 == 0) for i in range(48)] == \
        [int(i in range(1, 48, 2)) for i in range(48)] and m.moe_layers == 24
    # 36 of the 48 layers attend in chunks of 8,192 (all but every 4th: the NoPE layers)
    assert (ctx.chunk, ctx.chunked_layers, ctx.max_context) == (8192, 36, 1048576)
    for keys, (experts, step), published in ((mav, (128, 2), 400e9), (sco, (16, 1), None)):
        total, active = llama4_params(experts, step)
        assert shape(keys).total_params == total
        assert abs(active / 17e9 - 1) < 0.02             # "17B active parameters" (Meta)
        if published:
            assert abs(total / published - 1) < 0.005    # Maverick: "400B total"


def test_llama4_absent_keys_take_llama4_text_config_s_defaults(tmp_path):
    """Absent keys are Llama4TextConfig's: head_dim 128 (not hidden / heads), 8 key / value
    heads, intermediate_size 8192, intermediate_size_mlp 16384, 16 experts, top 1, the
    query / key L2 norm on, a chunk of 8192 on all but every 4th layer."""
    small = {"model_type": "llama4_text", "hidden_size": 1024, "num_attention_heads": 16,
             "num_hidden_layers": 8, "vocab_size": 1000}
    d, ctx = read_hf_config_with_context(write(tmp_path, small))
    assert (d["head_dim"], d["kv_heads"], d["moe_ffn_hidden"], d["ffn_hidden"],
            d["experts"], d["top_k"], d["qk_l2_norm"]) == (128, 8, 8192, 16384, 16, 1, True)
    assert (ctx.chunk, ctx.chunked_layers) == (8192, 6)
    # written null, the head width is hidden / heads, as Llama4TextConfig.__post_init__ sets it
    assert "head_dim" not in read_hf_config(write(tmp_path, {**small, "head_dim": None},
                                                  "null.json"))


def test_llama4_moe_layers_list_and_text_config_alone(tmp_path):
    """An explicit ``moe_layers`` (transformers saves the list it derived) is read as the
    run it is; one that is no run is modelled by the interleave step, with a warning; the
    text config alone (``llama4_text``) reads the same decoder, without the vision caveat."""
    text = dict(MAVERICK["text_config"])
    d = read_hf_config(write(tmp_path, {**text, "moe_layers": list(range(1, 48, 2))}))
    assert (d["first_dense_layers"], d["moe_layer_interval"]) == (1, 2)
    assert "approximates" not in d
    d = read_hf_config(write(tmp_path, {**text, "interleave_moe_layer_step": 1,
                                        "moe_layers": list(range(3, 48, 4))}, "b.json"))
    assert (d["first_dense_layers"], d["moe_layer_interval"]) == (3, 4)
    with pytest.warns(UserWarning, match="moe_layers"):
        d = read_hf_config(write(tmp_path, {**text, "moe_layers": [1, 2, 5]}, "c.json"))
    assert (d["first_dense_layers"], d["moe_layer_interval"]) == (1, 2)
    d = read_hf_config(write(tmp_path, {**text, "moe_layers": []}, "d.json"))
    assert "experts" not in d                       # no MoE layer: a dense model
    # a null chunk size turns chunked attention off (Llama4TextConfig: full_attention)
    _, ctx = read_hf_config_with_context(
        write(tmp_path, {**text, "attention_chunk_size": None}, "e.json"))
    assert ctx.chunk is None


def test_chunked_attention_is_said_only_beyond_the_chunk(tmp_path):
    path = write(tmp_path, MAVERICK)

    def caveat(seq_len: int) -> str:
        inst = parse_instance({"model": {"hf_config": str(path), "seq_len": seq_len},
                               "training": {"global_batch": 64},
                               "cluster": {"gpu": "h100-sxm", "gpus": 64}})
        return inst.spec.model.approximates
    assert "chunk" not in caveat(8192)
    said = caveat(16384)
    assert "within chunks of 8,192 tokens (attention_chunk_size; 36 of the config's 48)" \
        in said and "16,384" in said
    assert said.startswith("the language model (text_config) alone")


# ---- the wrapper rule ---------------------------------------------------------------------

def test_text_config_of_another_wrapper(tmp_path):
    """Mistral 3 keeps a Mistral decoder in text_config (Mistral3Config): read as Mistral,
    with the wrapper's tie, which transformers reads from the top-level config where the
    wrapper holds the output layer (Llama 4's text model holds its own: its text config's
    tie decides); a decoder of a family the reader does not know is named with where it
    sat."""
    text = {"model_type": "mistral", "hidden_size": 5120, "intermediate_size": 32768,
            "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
            "num_hidden_layers": 40, "vocab_size": 131072, "sliding_window": None}
    d = read_hf_config(write(tmp_path, {"model_type": "mistral3", "text_config": text,
                                        "tie_word_embeddings": True,
                                        "vision_config": {"model_type": "pixtral"}}))
    assert d["tied_embeddings"] is True and d["head_dim"] == 128 and d["layers"] == 40
    d = read_hf_config(write(tmp_path, {"model_type": "mistral3", "text_config": {
        **text, "tie_word_embeddings": False}, "tie_word_embeddings": True}, "b.json"))
    assert d["tied_embeddings"] is True and "approximates" not in d
    d = read_hf_config(write(tmp_path, {"model_type": "mistral3", "text_config": {
        **text, "tie_word_embeddings": False}}, "b2.json"))
    assert d["tied_embeddings"] is True           # (Mistral3Config's own default: True)
    llama4 = {**MAVERICK, "tie_word_embeddings": True}
    assert read_hf_config(write(tmp_path, llama4, "b3.json"))["tied_embeddings"] is False
    with pytest.raises(InputError) as exc:
        read_hf_config(write(tmp_path, {"model_type": "qwen3_vl", "text_config": {
            "model_type": "qwen3_vl_text"}}, "c.json"))
    assert 'model_type "qwen3_vl_text" (the text_config of model_type "qwen3_vl")' \
        in str(exc.value)
    with pytest.raises(InputError, match="text_config: expected an object"):
        read_hf_config(write(tmp_path, {"model_type": "llama4", "text_config": 3}, "d.json"))


# ---- the keys they brought, as the exports write them --------------------------------------

def _emit(cfg: dict, fmt: str, tmp_path: Path, ep: int = 16, **model) -> str:
    from planner.app.emit import emit
    from planner.model.plan import plan_from_spec

    path = write(tmp_path, cfg, "x.json")
    inst = parse_instance({"model": {"hf_config": str(path), "seq_len": 8192, **model},
                           "training": {"global_batch": 64},
                           "cluster": {"gpu": "h100-sxm", "gpus": 64},
                           "plan": {"tp": 1, "pp": 1, "dp": 64, "ep": ep, "micro_batch": 1}})
    return emit(inst, plan_from_spec(inst, inst.spec.plan), fmt)


def test_router_and_l2_norm_exports(tmp_path):
    """Scout's router scores with a sigmoid and its queries and keys take the L2 norm
    (Megatron-Core TransformerConfig ``moe_router_score_function``, ``qk_l2_norm``); top-1
    routing scored by softmax needs the score before the choice (TransformerConfig refuses
    ``moe_router_topk = 1`` with a softmax after it: its gradient is zero)."""
    import yaml

    from tests.test_emit import parse_megatron

    a = parse_megatron(_emit(scout(), "megatron", tmp_path))
    assert a["--moe-router-score-function"] == "sigmoid" and a["--qk-l2-norm"] is True
    assert "--moe-router-pre-softmax" not in a and "--qk-layernorm" not in a
    a = parse_megatron(_emit(scout(), "megatron", tmp_path,
                             moe_router_score_function="softmax"))
    assert a["--moe-router-pre-softmax"] is True and "--moe-router-score-function" not in a
    config = yaml.safe_load(_emit(scout(), "nemo", tmp_path))["model"]["config"]
    assert config["moe_router_score_function"] == "sigmoid" and config["qk_l2_norm"] is True
    assert config["moe_router_pre_softmax"] is False          # (written over a recipe's own)
    config = yaml.safe_load(_emit(scout(), "nemo", tmp_path,
                                  moe_router_score_function="softmax"))["model"]["config"]
    assert config["moe_router_pre_softmax"] is True
    assert config["moe_router_score_function"] == "softmax"
    mixtral = Path(__file__).resolve().parent / "data" / "hf" / "mixtral-8x7b.config.json"
    a = parse_megatron(_emit(json.loads(mixtral.read_text()), "megatron", tmp_path, ep=8))
    assert not {"--moe-router-score-function", "--moe-router-pre-softmax",
                "--qk-l2-norm"} & set(a)


def test_qk_l2_norm_rules():
    base = {"layers": 4, "hidden": 512, "heads": 8, "vocab": 1000, "seq_len": 256}
    with pytest.raises(ValueError, match="qk_norm and qk_l2_norm"):
        ModelSpec(**base, qk_norm=True, qk_l2_norm=True)
    with pytest.raises(ValueError, match="qk_l2_norm does not apply to multi-head latent"):
        ModelSpec(**base, qk_l2_norm=True, kv_lora_rank=64, qk_head_dim=32,
                  qk_pos_emb_head_dim=16, v_head_dim=32)
    # the L2 norm keeps and moves what a QK norm does, without its weights
    plain, rms, l2 = (Shape.of(ModelSpec(**base, **k))
                      for k in ({}, {"qk_norm": True}, {"qk_l2_norm": True}))
    assert l2.qk_norm_bytes == rms.qk_norm_bytes > 0
    assert l2.total_params == plain.total_params < rms.total_params


# ---- GLM-4.7-Flash (glm4_moe_lite) ---------------------------------------------------------

#: transformers' Glm4MoeLiteConfig defaults (transformers 5.25 configuration_glm4_moe_lite.py),
#: written out as a config.json would be (the checkpoint's own config is not read here)
GLM_LITE = {
    "architectures": ["Glm4MoeLiteForCausalLM"], "model_type": "glm4_moe_lite",
    "vocab_size": 154880, "hidden_size": 2048, "intermediate_size": 10240,
    "moe_intermediate_size": 1536, "num_hidden_layers": 47, "num_attention_heads": 20,
    "num_key_value_heads": 20, "n_shared_experts": 1, "n_routed_experts": 64,
    "kv_lora_rank": 512, "q_lora_rank": 768, "qk_rope_head_dim": 64, "v_head_dim": 256,
    "qk_nope_head_dim": 192, "num_experts_per_tok": 4, "max_position_embeddings": 202752,
    "tie_word_embeddings": False, "attention_bias": False, "attention_dropout": 0.0}


def glm_lite_params() -> int:
    """Glm4MoeLiteForCausalLM's parameters from its modules: DeepseekV3Attention (q_a 2048 x
    768 and its norm, q_b 768 x 20 (192 + 64), kv_a_proj_with_mqa 2048 x (512 + 64) and the
    norm of its 512, kv_b 512 x 20 (192 + 256), o 20 x 256 x 2048, no biases), two RMSNorms a
    layer, layer 0 a gated MLP of 10240 (mlp_layer_types' default), the 46 others 64 routed
    experts of 1536, one shared expert of 1536 and a 64 x 2048 router; untied embedding and
    head, a final norm."""
    h, a, v = 2048, 20, 154880
    attn = (linear(h, 768) + 768 + linear(768, a * 256) + linear(h, 576) + 512
            + linear(512, a * 448) + linear(a * 256, h) + 2 * h)
    moe = 64 * 3 * h * 1536 + 3 * h * 1536 + 64 * h
    return 47 * attn + 3 * h * 10240 + 46 * moe + 2 * v * h + h


def test_glm47_flash_keys_and_parameters(tmp_path):
    d = read_hf_config(write(tmp_path, GLM_LITE))
    assert d == {
        "layers": 47, "hidden": 2048, "heads": 20, "ffn_hidden": 10240, "gated_mlp": True,
        "vocab": 154880, "tied_embeddings": False, "position_embedding": "rope",
        "dropout": False, "normalization": "rmsnorm", "linear_bias": False,
        "kv_lora_rank": 512, "q_lora_rank": 768, "qk_head_dim": 192,
        "qk_pos_emb_head_dim": 64, "v_head_dim": 256, "experts": 64, "top_k": 4,
        "moe_ffn_hidden": 1536, "shared_experts": 1, "first_dense_layers": 1,
        "moe_layer_interval": 1, "moe_router_score_function": "sigmoid"}
    assert shape(d).total_params == glm_lite_params()


def test_glm47_flash_defaults_layer_types_and_head_dim_alias(tmp_path):
    """Absent keys take Glm4MoeLiteConfig's defaults (its MLA widths, not DeepSeek's); the
    leading "dense" entries of mlp_layer_types are the dense layers (a dense layer after a
    sparse one is modelled as MoE, with a warning); ``head_dim``, the config's alias of
    qk_rope_head_dim (Glm4MoeLiteConfig.attribute_map), is read as that, not as the
    attention's head width; a prediction depth where the config names one."""
    bare = {k: GLM_LITE[k] for k in ("model_type", "vocab_size", "hidden_size",
                                      "intermediate_size", "num_hidden_layers",
                                      "num_attention_heads")}
    d = read_hf_config(write(tmp_path, bare))
    assert {k: d[k] for k in ("kv_lora_rank", "q_lora_rank", "qk_head_dim",
                              "qk_pos_emb_head_dim", "v_head_dim", "experts", "top_k",
                              "moe_ffn_hidden", "shared_experts", "first_dense_layers")} == {
        "kv_lora_rank": 512, "q_lora_rank": 768, "qk_head_dim": 192, "qk_pos_emb_head_dim": 64,
        "v_head_dim": 256, "experts": 64, "top_k": 4, "moe_ffn_hidden": 1536,
        "shared_experts": 1, "first_dense_layers": 1}
    d = read_hf_config(write(tmp_path, {**bare, "head_dim": 32}, "alias.json"))
    assert d["qk_pos_emb_head_dim"] == 32
    assert "head_dim" not in d and "kv_heads" not in d and "mtp_layers" not in d
    two = ["dense", "dense"] + ["sparse"] * 45
    d = read_hf_config(write(tmp_path, {**GLM_LITE, "mlp_layer_types": two,
                                        "num_nextn_predict_layers": 1}, "b.json"))
    assert d["first_dense_layers"] == 2 and d["mtp_layers"] == 1
    mixed = ["dense", "sparse", "dense"] + ["sparse"] * 44
    with pytest.warns(UserWarning, match="dense layers after the first sparse one"):
        d = read_hf_config(write(tmp_path, {**GLM_LITE, "mlp_layer_types": mixed}, "c.json"))
    assert d["first_dense_layers"] == 1


def test_glm47_flash_dense_layers_from_first_k_and_its_megatron_export(tmp_path):
    """Without mlp_layer_types the dense layers are first_k_dense_replace's (the key
    checkpoints carry and Megatron-Bridge's glm47_flash_bridge.py reads). Its 20 heads do not
    divide its 2048-wide hidden state: Megatron-LM's validate_args asserts that division
    unless --kv-channels is given, which multi-head latent attention does not read, so the
    export gives one (the value width); DeepSeek-V3 (7168 / 128) needs none."""
    from tests.test_emit import emitted, parse_megatron

    d = read_hf_config(write(tmp_path, {**GLM_LITE, "first_k_dense_replace": 3}))
    assert d["first_dense_layers"] == 3
    plan = {"tp": 1, "pp": 1, "dp": 8, "ep": 8, "micro_batch": 1}
    cluster = {"gpu": "h100-sxm", "gpus": 8}
    flags = parse_megatron(emitted({"model": {**d, "seq_len": 4096},
                                    "training": {"global_batch": 64}, "cluster": cluster},
                                   plan, "megatron"))
    assert flags["--kv-channels"] == "256" and flags["--multi-latent-attention"] is True
    v3 = parse_megatron(emitted({"model": {"preset": "deepseek-v3", "layers": 4,
                                           "first_dense_layers": 1, "mtp_layers": 0},
                                 "training": {"global_batch": 64}, "cluster": cluster},
                                plan, "megatron"))
    assert "--kv-channels" not in v3


def test_a_bad_wrapper_model_type_or_moe_layer_list_is_named(tmp_path):
    """(tracebacks, found by a fuzzer of config files: a wrapper's model_type that is not a
    string was looked up in a dict, and a moe_layers that is not a list of indices sorted)"""
    cfg = {**MAVERICK, "model_type": {"a": 1}}
    d = read_hf_config(write(tmp_path, cfg, "a.json"))
    assert d == read_hf_config(write(tmp_path, MAVERICK, "b.json"))   # the text model decides
    bad = {**MAVERICK, "text_config": {**MAVERICK["text_config"], "moe_layers": "silu"}}
    with pytest.raises(InputError) as exc:
        read_hf_config(write(tmp_path, bad, "c.json"))
    assert 'moe_layers: expected a list of layer indices (got "silu")' in str(exc.value)

"""Hugging Face config.json -> ModelSpec keys (planner/hf_config.py).

The shipped configs in ``tests/data/hf`` are the public ``config.json`` files of Llama-3-8B,
Mixtral-8x7B-v0.1 and DeepSeek-V3; the other families are checked with small inline configs that
carry the public values of a representative model. Errors are checked through ``str(exc)``,
which is what the CLI prints.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from planner.model.errors import InputError
from planner.model.hf_config import SUPPORTED, read_hf_config
from planner.model.schema import ModelSpec
from planner.model.workload import Shape

DATA = Path(__file__).resolve().parent / "data" / "hf"
LLAMA3_8B = DATA / "llama3-8b.config.json"
MIXTRAL_8X7B = DATA / "mixtral-8x7b.config.json"
DEEPSEEK_V3 = DATA / "deepseek-v3.config.json"

MOE_DEFAULTS = {"shared_experts": 0, "first_dense_layers": 0, "moe_layer_interval": 1}
#: every supported family: RMSNorm and bias-free MLPs (biases of the attention per family)
NORMS = {"normalization": "rmsnorm", "linear_bias": False}


def spec(d: dict, seq_len: int = 4096) -> ModelSpec:
    """Build a ModelSpec from the reader's keys (the instance overrides seq_len). Any key the
    schema rejects fails the test: the reader and the schema must agree (a key truly pending
    would be a strict xfail on the test that needs it)."""
    return ModelSpec(**{**d, "seq_len": seq_len})


def write(tmp_path: Path, cfg: object, name: str = "config.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(cfg))
    return path


def shipped(path: Path) -> dict:
    return json.loads(path.read_text())


def error_of(path: Path) -> str:
    with pytest.raises(InputError) as info:
        read_hf_config(path)
    return str(info.value)


# ---- the shipped public configs ------------------------------------------------------------

def test_llama3_8b():
    d = read_hf_config(LLAMA3_8B)
    assert d == {
        "layers": 32, "hidden": 4096, "heads": 32, "kv_heads": 8, "ffn_hidden": 14336,
        "gated_mlp": True, "vocab": 128256, "tied_embeddings": False,
        "position_embedding": "rope", "dropout": False, **NORMS,
    }
    m = spec(d)
    assert (m.kv, m.ffn, m.moe, m.seq_len) == (8, 14336, False, 4096)


def test_mixtral_8x7b():
    d = read_hf_config(MIXTRAL_8X7B)
    assert d == {
        "layers": 32, "hidden": 4096, "heads": 32, "kv_heads": 8, "ffn_hidden": 14336,
        "gated_mlp": True, "vocab": 32000, "tied_embeddings": False,
        "position_embedding": "rope", "dropout": False, **NORMS,
        "experts": 8, "top_k": 2, "moe_ffn_hidden": 14336, **MOE_DEFAULTS,
    }
    m = spec(d)
    assert m.moe and m.moe_layers == 32


def test_deepseek_v3():
    d = read_hf_config(DEEPSEEK_V3)
    assert d == {
        "layers": 61, "hidden": 7168, "heads": 128, "ffn_hidden": 18432,
        "gated_mlp": True, "vocab": 129280, "tied_embeddings": False,
        "position_embedding": "rope", "dropout": False, **NORMS,
        "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_head_dim": 128,
        "qk_pos_emb_head_dim": 64, "v_head_dim": 128, "mtp_layers": 1,
        "experts": 256, "top_k": 8, "moe_ffn_hidden": 2048, "shared_experts": 1,
        "first_dense_layers": 3, "moe_layer_interval": 1,
        "moe_router_score_function": "sigmoid",     # (its config: "scoring_func": "sigmoid")
    }
    m = spec(d)
    assert m.moe_layers == 58 and m.mla   # 61 layers, the first 3 dense
    # the shipped preset is the released config (and the published runs use the preset)
    from planner.model.instance import parse_instance
    preset = parse_instance({"model": {"preset": "deepseek-v3"}, "training": {"global_batch": 8},
                             "cluster": {"gpu": "h100-sxm", "gpus": 8}})
    given = preset.spec.model.model_dump(exclude={"preset", "name", "seq_len"},
                                         exclude_defaults=True)
    assert given == {k: v for k, v in d.items() if v != ModelSpec.model_fields[k].default}


@pytest.mark.parametrize("path", [LLAMA3_8B, MIXTRAL_8X7B, DEEPSEEK_V3])
def test_never_returns_hf_config_and_needs_no_warning(path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        d = read_hf_config(path)
    assert "hf_config" not in d
    assert set(d) <= set(ModelSpec.model_fields)


# ---- the other families (inline configs with public values) -------------------------------

#: gpt-oss-120b's public config.json (openai/gpt-oss-120b), the keys the reader uses
GPT_OSS_120B = {
    "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "head_dim": 64,
    "hidden_size": 2880, "intermediate_size": 2880, "num_hidden_layers": 36,
    "num_attention_heads": 64, "num_key_value_heads": 8, "num_local_experts": 128,
    "num_experts_per_tok": 4, "experts_per_token": 4, "vocab_size": 201088,
    "max_position_embeddings": 131072, "sliding_window": 128, "tie_word_embeddings": False,
    "layer_types": ["sliding_attention", "full_attention"] * 18,
}


def test_gpt_oss_120b(tmp_path):
    """Every layer MoE (128 experts of 2880, top 4), 64 heads of 64 on a hidden of 2880, and
    every other layer from the first attending within 128 tokens (the query and the 127
    before it: Megatron-Core's window_size 127, every second layer full attention). The
    shape's parameters are OpenAI's: 116.8B in all (the model card; the attention sinks and
    the router's bias, which the shape leaves out, are the rest), 5.1B active per token
    without the input embedding."""
    d = read_hf_config(write(tmp_path, GPT_OSS_120B))
    assert (d.pop("window_size"), d.pop("window_attn_skip_freq")) == (127, 2)
    assert d == {
        "layers": 36, "hidden": 2880, "heads": 64, "kv_heads": 8, "ffn_hidden": 2880,
        "gated_mlp": True, "vocab": 201088, "tied_embeddings": False,
        "position_embedding": "rope", "dropout": False, "head_dim": 64,
        "normalization": "rmsnorm", "linear_bias": True,
        "softmax_type": "learnable",       # (its attention sinks, GptOssAttention.sinks)
        "experts": 128, "top_k": 4, "moe_ffn_hidden": 2880, **MOE_DEFAULTS,
    }
    sh = Shape.of(spec(d))
    assert sh.total_params == pytest.approx(116.83e9, rel=1e-3)
    experts = 36 * 128 * sh.expert_params
    active = sh.total_params - experts * (1 - 4 / 128) - sh.embedding_params
    assert active == pytest.approx(5.13e9, rel=5e-3)
    # OpenAI's own key for the routed count, when the Hugging Face one is absent
    own = {k: v for k, v in GPT_OSS_120B.items() if k != "num_experts_per_tok"}
    assert read_hf_config(write(tmp_path, own, "own.json"))["top_k"] == 4
    # without layer_types, transformers' GptOssConfig default: the same alternation
    bare = {k: v for k, v in GPT_OSS_120B.items() if k != "layer_types"}
    assert read_hf_config(write(tmp_path, bare, "bare.json"))["window_attn_skip_freq"] == 2
    # windowed layers Megatron's integer cannot say are its list, 1 where windowed
    odd = {**GPT_OSS_120B, "layer_types": ["full_attention"] * 4
           + ["sliding_attention", "full_attention"] * 16}
    assert read_hf_config(write(tmp_path, odd, "odd.json"))["window_attn_skip_freq"] == \
        [0] * 4 + [1, 0] * 16
    with pytest.raises(InputError, match="layer_types: expected 36 entries"):
        read_hf_config(write(tmp_path, {**GPT_OSS_120B, "layer_types": ["full_attention"]},
                             "short.json"))


def test_mistral_and_qwen2_dense(tmp_path):
    mistral = {"architectures": ["MistralForCausalLM"], "model_type": "mistral",
               "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
               "num_hidden_layers": 32, "num_key_value_heads": 8, "vocab_size": 32000,
               "max_position_embeddings": 32768, "sliding_window": 4096,
               "tie_word_embeddings": False, "attention_dropout": 0.0}
    d = read_hf_config(write(tmp_path, mistral))
    # (Mistral 7B v0.1 attends within 4,096 tokens, the query's own included, in every layer)
    assert d.pop("window_size") == 4095 and "window_attn_skip_freq" not in d
    assert "window_size" not in read_hf_config(write(tmp_path, {**mistral, "sliding_window": None},
                                                     "nowindow.json"))
    assert d == {"layers": 32, "hidden": 4096, "heads": 32, "kv_heads": 8, "ffn_hidden": 14336,
                 "gated_mlp": True, "vocab": 32000, "tied_embeddings": False,
                 "position_embedding": "rope", "dropout": False, **NORMS}
    # the checkpoint's 7,241,732,096 parameters (Hugging Face mistralai/Mistral-7B-v0.1,
    # safetensors)
    assert Shape.of(spec(d)).total_params == 7_241_732_096
    qwen2 = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 896,
             "intermediate_size": 4864, "num_attention_heads": 14, "num_hidden_layers": 24,
             "num_key_value_heads": 2, "vocab_size": 151936, "max_position_embeddings": 32768,
             "tie_word_embeddings": True, "attention_dropout": 0.0}   # Qwen2-0.5B
    d = read_hf_config(write(tmp_path, qwen2))
    assert (d["layers"], d["hidden"], d["heads"], d["kv_heads"], d["ffn_hidden"], d["vocab"],
            d["tied_embeddings"]) == (24, 896, 14, 2, 4864, 151936, True)
    assert "experts" not in d
    # Qwen2's q, k and v projections carry a bias: with it the shape holds the checkpoint's
    # 494,032,768 parameters (Hugging Face Qwen/Qwen2-0.5B, safetensors), without it fewer
    assert (d["normalization"], d["linear_bias"], d["qkv_bias"]) == ("rmsnorm", False, True)
    assert Shape.of(spec(d)).total_params == 494_032_768
    assert Shape.of(spec({**d, "qkv_bias": False})).total_params == 494_032_768 - 24 * (896 + 2 * 128)
    # Qwen2's window (Qwen2-0.5B writes sliding_window 32768, max_window_layers 24) holds only
    # with use_sliding_window, and from layer max_window_layers (counted from 0) up
    qwen2.update(sliding_window=32768, max_window_layers=24, use_sliding_window=False)
    assert "window_size" not in read_hf_config(write(tmp_path, qwen2, "qwen2-off.json"))
    qwen2.update(sliding_window=4096, max_window_layers=21, use_sliding_window=True)
    d = read_hf_config(write(tmp_path, qwen2, "qwen2-on.json"))
    assert (d["window_size"], d["window_attn_skip_freq"]) == (4095, [0] * 21 + [1] * 3)


def qwen15_moe() -> dict:   # Qwen1.5-MoE-A2.7B
    return {"architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe",
            "hidden_size": 2048, "intermediate_size": 5632, "moe_intermediate_size": 1408,
            "shared_expert_intermediate_size": 5632, "num_experts": 60, "num_experts_per_tok": 4,
            "decoder_sparse_step": 1, "mlp_only_layers": [], "num_attention_heads": 16,
            "num_hidden_layers": 24, "num_key_value_heads": 16, "vocab_size": 151936,
            "max_position_embeddings": 8192, "tie_word_embeddings": False,
            "attention_dropout": 0.0}


def test_qwen2_moe(tmp_path):
    d = read_hf_config(write(tmp_path, qwen15_moe()))
    assert d == {"layers": 24, "hidden": 2048, "heads": 16, "kv_heads": 16, "ffn_hidden": 5632,
                 "gated_mlp": True, "vocab": 151936, "tied_embeddings": False,
                 "position_embedding": "rope", "dropout": False, **NORMS, "qkv_bias": True,
                 "experts": 60, "top_k": 4, "moe_ffn_hidden": 1408, "shared_experts": 4,
                 "first_dense_layers": 0, "moe_layer_interval": 1}
    assert spec(d).moe_layers == 24
    # the checkpoint's 14,315,784,192 parameters (Hugging Face Qwen/Qwen1.5-MoE-A2.7B,
    # safetensors) less the shared experts' sigmoid gates the shape leaves out (h per layer)
    assert Shape.of(spec(d)).total_params == 14_315_784_192 - 24 * 2048


@pytest.mark.parametrize("layers, step", [(24, 2), (25, 2), (28, 3), (24, 1)])
def test_qwen_decoder_sparse_step_matches_hugging_face_layer_set(tmp_path, layers, step):
    cfg = {**qwen15_moe(), "num_hidden_layers": layers, "decoder_sparse_step": step}
    d = read_hf_config(write(tmp_path, cfg))
    assert d["moe_layer_interval"] == step and d["first_dense_layers"] == step - 1
    hf_sparse = [i for i in range(layers) if (i + 1) % step == 0]   # Qwen2MoeDecoderLayer
    assert list(range(d["first_dense_layers"], layers, d["moe_layer_interval"])) == hf_sparse
    assert spec(d).moe_layers == len(hf_sparse)


def test_qwen_shared_expert_rounds_to_whole_experts(tmp_path):
    cfg = {**qwen15_moe(), "shared_expert_intermediate_size": 2000}   # 2000 / 1408 = 1.42
    assert read_hf_config(write(tmp_path, cfg))["shared_experts"] == 1
    cfg = {**qwen15_moe(), "shared_expert_intermediate_size": 500}    # > 0 but < one expert
    assert read_hf_config(write(tmp_path, cfg))["shared_experts"] == 1
    cfg = {**qwen15_moe(), "shared_expert_intermediate_size": 0}
    assert read_hf_config(write(tmp_path, cfg))["shared_experts"] == 0


def test_qwen_mlp_only_layers_ignored_with_a_warning(tmp_path):
    cfg = {**qwen15_moe(), "mlp_only_layers": [0, 5]}
    with pytest.warns(UserWarning, match=r"mlp_only_layers \[0, 5\] ignored"):
        d = read_hf_config(write(tmp_path, cfg))
    assert d["first_dense_layers"] == 0 and d["experts"] == 60


def test_qwen3_moe_head_dim_is_read(tmp_path):
    """Qwen3-30B-A3B's attention is 32 heads of 128 on a hidden of 2048: read as ``head_dim``,
    the model's parameter counts are the model card's (Qwen/Qwen3-30B-A3B: 30.5B in total,
    3.3B activated); attention modelled hidden / heads wide would activate 2.8B."""
    cfg = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
           "hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 768,
           "num_experts": 128, "num_experts_per_tok": 8, "decoder_sparse_step": 1,
           "mlp_only_layers": [], "num_attention_heads": 32, "num_hidden_layers": 48,
           "num_key_value_heads": 4, "head_dim": 128, "vocab_size": 151936,
           "max_position_embeddings": 40960, "tie_word_embeddings": False,
           "attention_dropout": 0.0}   # Qwen3-30B-A3B
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        d = read_hf_config(write(tmp_path, cfg))
    assert (d["experts"], d["top_k"], d["moe_ffn_hidden"], d["shared_experts"]) == (128, 8, 768, 0)
    assert (d["heads"], d["kv_heads"], d["head_dim"]) == (32, 4, 128)

    def active(sh):
        per_token = (sh.n_dense * sh.layer_params
                     + sh.n_moe * (sh.moe_dense_params + sh.top_k * sh.expert_params))
        return per_token + sh.embedding_params + (0 if sh.tied else sh.V * sh.h) + 2 * sh.h

    sh = Shape.of(spec(d))
    assert sh.total_params == pytest.approx(30.5e9, rel=0.01)
    # to the parameter: the checkpoint's 30,532,122,624 (Hugging Face Qwen/Qwen3-30B-A3B,
    # safetensors), its QK norms (2 x 128 per layer) included
    assert d["qk_norm"] is True and sh.total_params == 30_532_122_624
    assert Shape.of(spec({**d, "qk_norm": False})).total_params == 30_532_122_624 - 48 * 256
    assert active(sh) == pytest.approx(3.3e9, rel=0.02)
    narrow = Shape.of(spec({k: v for k, v in d.items() if k != "head_dim"}))
    assert active(narrow) < 0.9 * 3.3e9


def test_qwen3_dense_consistent_head_dim_is_silent(tmp_path):
    cfg = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 4096,
           "intermediate_size": 12288, "num_attention_heads": 32, "num_hidden_layers": 36,
           "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
           "max_position_embeddings": 40960, "tie_word_embeddings": False}   # Qwen3-8B
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        d = read_hf_config(write(tmp_path, cfg))
    assert (d["layers"], d["ffn_hidden"], d["kv_heads"]) == (36, 12288, 8)
    assert "experts" not in d
    # RMSNorm, QK norms, no biases: the checkpoint's 8,190,735,360 parameters (Hugging Face
    # Qwen/Qwen3-8B, safetensors)
    assert Shape.of(spec(d)).total_params == 8_190_735_360


def test_deepseek_v2_mla_widths_default_and_kv_heads_unread(tmp_path):
    cfg = {"architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2",
           "hidden_size": 5120, "intermediate_size": 12288, "moe_intermediate_size": 1536,
           "n_routed_experts": 160, "n_shared_experts": 2, "num_experts_per_tok": 6,
           "first_k_dense_replace": 1, "moe_layer_freq": 1, "num_attention_heads": 128,
           "num_hidden_layers": 60, "num_key_value_heads": 128, "kv_lora_rank": 512,
           "vocab_size": 102400, "max_position_embeddings": 163840,
           "tie_word_embeddings": False, "attention_dropout": 0.0}   # DeepSeek-V2
    d = read_hf_config(write(tmp_path, cfg))
    # the widths the file leaves out are transformers' DeepseekV2Config defaults
    assert d == {"layers": 60, "hidden": 5120, "heads": 128, "ffn_hidden": 12288,
                 "gated_mlp": True, "vocab": 102400, "tied_embeddings": False,
                 "position_embedding": "rope", "dropout": False, **NORMS,
                 "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_head_dim": 128,
                 "qk_pos_emb_head_dim": 64, "v_head_dim": 128,
                 "experts": 160, "top_k": 6, "moe_ffn_hidden": 1536, "shared_experts": 2,
                 "first_dense_layers": 1, "moe_layer_interval": 1}
    assert spec(d).moe_layers == 59
    # MLA has no key / value groups: num_key_value_heads is not read
    assert "kv_heads" not in read_hf_config(write(tmp_path, {**cfg, "num_key_value_heads": 8}))
    # DeepSeek-V2-Lite: q_lora_rank null, queries projected directly (no q_lora_rank key)
    lite = read_hf_config(write(tmp_path, {**cfg, "q_lora_rank": None, "kv_lora_rank": 256}))
    assert "q_lora_rank" not in lite and lite["kv_lora_rank"] == 256
    assert spec(lite).mla and spec(lite).q_lora_rank is None


@pytest.mark.parametrize("layers, first, freq", [(61, 3, 1), (61, 3, 2), (30, 4, 3), (10, 0, 2)])
def test_deepseek_layer_freq_matches_hugging_face_layer_set(layers, first, freq, tmp_path):
    cfg = {**shipped(DEEPSEEK_V3), "num_hidden_layers": layers, "first_k_dense_replace": first,
           "moe_layer_freq": freq}
    d = read_hf_config(write(tmp_path, cfg))
    hf_sparse = [i for i in range(layers) if i >= first and i % freq == 0]   # DeepseekV3DecoderLayer
    assert list(range(d["first_dense_layers"], layers, d["moe_layer_interval"])) == hf_sparse
    assert spec(d).moe_layers == len(hf_sparse)


def test_no_routed_experts_is_dense(tmp_path):
    cfg = {**shipped(DEEPSEEK_V3), "n_routed_experts": None}
    d = read_hf_config(write(tmp_path, cfg))
    assert "experts" not in d and d["ffn_hidden"] == 18432
    cfg = {**shipped(DEEPSEEK_V3), "first_k_dense_replace": 61}   # no MoE layer left
    assert "experts" not in read_hf_config(write(tmp_path, cfg))


# ---- defaults and fallbacks ---------------------------------------------------------------

def test_defaults_kv_heads_tied_dropout(tmp_path):
    cfg = shipped(LLAMA3_8B)
    for key in ("num_key_value_heads", "tie_word_embeddings", "attention_dropout"):
        del cfg[key]
    d = read_hf_config(write(tmp_path, cfg))
    assert (d["kv_heads"], d["tied_embeddings"], d["dropout"]) == (32, False, False)


@pytest.mark.parametrize("key", ["attention_dropout", "hidden_dropout"])
def test_dropout_when_either_rate_is_positive(tmp_path, key):
    cfg = {**shipped(LLAMA3_8B), key: 0.1}
    assert read_hf_config(write(tmp_path, cfg))["dropout"] is True


def test_architectures_fallback(tmp_path):
    cfg = shipped(MIXTRAL_8X7B)
    del cfg["model_type"]
    assert read_hf_config(write(tmp_path, cfg)) == read_hf_config(MIXTRAL_8X7B)
    cfg = {**shipped(LLAMA3_8B), "model_type": "llama_custom"}   # a fork with its own model_type
    assert read_hf_config(write(tmp_path, cfg)) == read_hf_config(LLAMA3_8B)


# ---- errors -------------------------------------------------------------------------------

def test_unknown_model_type(tmp_path):
    cfg = {**shipped(LLAMA3_8B), "model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}
    path = write(tmp_path, cfg)
    msg = error_of(path)
    assert str(path) in msg and "unsupported architecture" in msg
    assert '"gpt2"' in msg and "GPT2LMHeadModel" in msg
    assert all(name in msg for name in SUPPORTED)


@pytest.mark.parametrize("model_type", [{}, [1, 2]])
def test_a_model_type_that_is_not_a_string(tmp_path, model_type):
    """(a traceback, found by a fuzzer of config files: the value was looked up in a dict)"""
    cfg = {**shipped(LLAMA3_8B), "model_type": model_type, "architectures": ["GPT2LMHeadModel"]}
    msg = error_of(write(tmp_path, cfg))
    assert "unsupported architecture" in msg and json.dumps(model_type) in msg


@pytest.mark.parametrize("value", [0.5, [1, 2]])
def test_a_bad_dense_layer_count_is_named(tmp_path, value):
    """(a traceback, found by the same fuzzer: DeepSeek's dense layer count was rounded to the
    MoE interval before its problem was raised)"""
    msg = error_of(write(tmp_path, {**shipped(DEEPSEEK_V3), "first_k_dense_replace": value}))
    assert "first_k_dense_replace" in msg and "not a usable Hugging Face config" in msg


def test_no_model_type_no_architectures(tmp_path):
    cfg = shipped(LLAMA3_8B)
    del cfg["model_type"], cfg["architectures"]
    msg = error_of(write(tmp_path, cfg))
    assert "no model_type" in msg and "llama" in msg


def test_missing_required_key_names_file_and_key(tmp_path):
    cfg = shipped(LLAMA3_8B)
    del cfg["num_hidden_layers"]
    path = write(tmp_path, cfg, "llama.json")
    msg = error_of(path)
    assert str(path) in msg and "num_hidden_layers: required key is missing" in msg


def test_every_missing_key_is_reported(tmp_path):
    cfg = shipped(MIXTRAL_8X7B)
    del cfg["hidden_size"], cfg["num_local_experts"]
    msg = error_of(write(tmp_path, cfg))
    assert "hidden_size: required key is missing" in msg
    assert "num_local_experts: required key is missing" in msg


def test_missing_moe_key(tmp_path):
    cfg = shipped(DEEPSEEK_V3)
    del cfg["moe_intermediate_size"]
    msg = error_of(write(tmp_path, cfg))
    assert "moe_intermediate_size: required key is missing" in msg and "deepseek_v3" in msg


@pytest.mark.parametrize("key, value", [("hidden_size", "4096"), ("num_hidden_layers", 0),
                                        ("vocab_size", 1.5), ("num_attention_heads", True)])
def test_bad_value_names_key(tmp_path, key, value):
    msg = error_of(write(tmp_path, {**shipped(LLAMA3_8B), key: value}))
    assert f"{key}: expected a positive integer (got {json.dumps(value)})" in msg


def test_bad_tie_word_embeddings(tmp_path):
    msg = error_of(write(tmp_path, {**shipped(LLAMA3_8B), "tie_word_embeddings": "no"}))
    assert "tie_word_embeddings: expected true or false" in msg


def test_missing_file(tmp_path):
    path = tmp_path / "nope" / "config.json"
    msg = error_of(path)
    assert str(path) in msg and "no such file" in msg


def test_bad_json(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{"model_type": "llama",\n "hidden_size": 4096,,\n}')
    msg = error_of(path)
    assert str(path) in msg and "invalid JSON" in msg and "line 2" in msg


def test_json_not_an_object(tmp_path):
    msg = error_of(write(tmp_path, [1, 2, 3]))
    assert "expected a JSON object" in msg and "list" in msg


def test_binary_file(tmp_path):
    path = tmp_path / "config.json"
    path.write_bytes(b"\xff\xfe\x00\x81")
    assert "not a text file" in error_of(path)


def test_what_transformers_would_read_the_reader_reads_alike(tmp_path):
    """Keys as transformers reads them (an audit against its config classes): Mixtral's expert
    count under its alias ``num_experts`` (MixtralConfig.attribute_map), an absent
    ``num_key_value_heads`` as Mistral's / Mixtral's default 8, one routed expert as a dense
    MLP, Qwen-MoE's leading ``mlp_only_layers`` as first dense layers, and a ``head_dim`` that
    is no positive integer refused by name (it was dropped silently: 6.9% fewer parameters)."""
    mixtral = json.loads(MIXTRAL_8X7B.read_text())
    ref = read_hf_config(MIXTRAL_8X7B)
    alias = {k: v for k, v in mixtral.items() if k != "num_local_experts"} | {"num_experts": 8}
    assert read_hf_config(write(tmp_path, alias, "alias.json")) == ref
    no_kv = {k: v for k, v in mixtral.items() if k != "num_key_value_heads"}
    assert read_hf_config(write(tmp_path, no_kv, "nokv.json"))["kv_heads"] == 8
    one = read_hf_config(write(tmp_path, {**mixtral, "num_local_experts": 1}, "one.json"))
    assert "experts" not in one and spec(one).experts == 0
    qwen = {"model_type": "qwen3_moe", "hidden_size": 2048, "intermediate_size": 6144,
            "moe_intermediate_size": 768, "num_experts": 128, "num_experts_per_tok": 8,
            "mlp_only_layers": [0, 1, 2], "num_attention_heads": 32, "num_hidden_layers": 48,
            "num_key_value_heads": 4, "head_dim": 128, "vocab_size": 151936}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        d = read_hf_config(write(tmp_path, qwen, "q.json"))
    assert d["first_dense_layers"] == 3 and spec(d).moe_layers == 45
    with pytest.warns(UserWarning, match="mlp_only_layers"):
        read_hf_config(write(tmp_path, {**qwen, "mlp_only_layers": [5, 9]}, "q2.json"))
    for bad in ("128", -1, 0, 12.5):
        with pytest.raises(InputError) as exc:
            read_hf_config(write(tmp_path, {**qwen, "head_dim": bad}, "q3.json"))
        assert "head_dim: expected a positive integer" in str(exc.value)


def test_deepseek_mla_saved_activations_counted_by_tensor():
    """The activations one MLA layer keeps for its backward, counted here tensor by tensor from
    DeepSeek-V3's widths (its technical report, Sec. 2.1.1: 128 heads, per-head query / key
    width 128 + 64 rotary, value width 128, query and KV compression ranks 1536 and 512),
    16-bit, per token, as Megatron-Core's MLASelfAttention and fused attention save them: the
    heads split over the tensor group, the compressed ones on each rank's sequence shard."""
    from planner.model.workload import Shape
    split = {
        "query (128 heads x 192)": 128 * 192,
        "key (128 heads x 192)": 128 * 192,
        "value (128 heads x 128)": 128 * 128,
        "attention output = projection input (128 x 128)": 128 * 128,
    }
    sharded = {
        "query layer norm input (1536)": 1536,
        "query up-projection input (1536)": 1536,
        "KV layer norm input (512)": 512,
        "KV up-projection input (512)": 512,
    }
    sh = Shape.of(spec({**read_hf_config(DEEPSEEK_V3), "seq_len": 4096}))
    # the hidden-wide tensors every layer keeps (norm, QKV / MLP inputs: 8 h) are the same
    # as multi-head attention's
    plain = Shape.of(spec({**read_hf_config(LLAMA3_8B), "seq_len": 4096}))
    assert plain.act_replicated_bytes == 8 * plain.h
    assert sh.act_replicated_bytes - 8 * sh.h == 2 * sum(sharded.values())
    assert sh.attn_act_parallel_bytes == 2 * sum(split.values())
    assert 2 * (sum(split.values()) + sum(sharded.values())) == 172_032


def test_the_model_is_named_by_its_file_or_else_by_the_config(tmp_path):
    """A named file gives its name (``llama3-8b.config.json``: llama3-8b); a bare
    ``config.json`` says nothing, so the config's ``_name_or_path`` (the model id transformers
    saved it from) names the model, else its ``model_type``; a [model] name wins."""
    from planner.model.instance import parse_instance

    def name(path, **model):
        return parse_instance({"model": {"hf_config": str(path), "seq_len": 4096, **model},
                               "training": {"global_batch": 8},
                               "cluster": {"gpu": "h100-sxm", "gpus": 8}}).model.name
    assert name(LLAMA3_8B) == "llama3-8b"
    cfg = shipped(LLAMA3_8B)
    bare = tmp_path / "a"
    bare.mkdir()
    assert name(write(bare, cfg)) == "llama"
    assert name(write(bare, {**cfg, "_name_or_path": "meta-llama/Meta-Llama-3-8B"})) \
        == "Meta-Llama-3-8B"
    assert name(write(bare, cfg), name="mine") == "mine"


def test_phi3_family_reads_as_llama_and_holds_its_checkpoints_parameters(tmp_path):
    """Phi-3 / Phi-4 (model_type phi3): Llama's keys and layers, with q / k / v and gate / up
    fused into single matrices (the same shapes). The counts are the checkpoints' (Hugging Face
    microsoft/phi-4: 14,659,507,200; microsoft/Phi-3-mini-4k-instruct: 3,821,079,552,
    safetensors), and Phi-3-mini attends within 2,047 tokens (window_size 2046)."""
    phi4 = {"architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "hidden_size": 5120,
            "intermediate_size": 17920, "num_attention_heads": 40, "num_key_value_heads": 10,
            "num_hidden_layers": 40, "vocab_size": 100352, "max_position_embeddings": 16384,
            "sliding_window": None, "tie_word_embeddings": False, "attention_dropout": 0.0}
    d = read_hf_config(write(tmp_path, phi4))
    assert {k: d[k] for k in NORMS} == NORMS and "window_size" not in d
    assert Shape.of(spec(d)).total_params == 14_659_507_200
    mini = {**phi4, "hidden_size": 3072, "intermediate_size": 8192, "num_attention_heads": 32,
            "num_key_value_heads": 32, "num_hidden_layers": 32, "vocab_size": 32064,
            "max_position_embeddings": 4096, "sliding_window": 2047}
    d = read_hf_config(write(tmp_path, mini, "mini.json"))
    assert d.pop("window_size") == 2046
    assert Shape.of(spec(d)).total_params == 3_821_079_552

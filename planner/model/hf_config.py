"""Read a Hugging Face ``config.json`` into :class:`~planner.model.schema.ModelSpec` keys.

:func:`read_hf_config` returns a plain dict of ModelSpec keys (never ``hf_config`` itself) for
the instance loader to merge under the keys the instance gives explicitly. Every problem is a
:class:`~planner.model.errors.InputError` that names the file and the key.

Supported ``model_type`` values (``architectures``, e.g. ``LlamaForCausalLM``, is the fallback
when ``model_type`` is absent or not one of these):

    llama, mistral, mixtral, qwen2, qwen2_moe, qwen3, qwen3_moe, deepseek_v2, deepseek_v3,
    gpt_oss, phi3 (Phi-3 / Phi-3.5 / Phi-4: Llama's keys and layers, q / k / v and gate / up
    each fused into one matrix, which changes neither the shapes nor the counts), glm4_moe
    (GLM-4.5 / 4.6 / 4.5-Air), glm4_moe_lite (GLM-4.7-Flash: DeepSeek-V3's latent attention
    on GLM-4.5's experts), llama4 (Llama 4; llama4_text, its decoder alone)

A vision-language wrapper (Llama 4, Mistral 3, ...) keeps its decoder's keys in
``text_config``: the reader reads them there, by the text config's own ``model_type``
(``architectures`` and ``_name_or_path`` from the wrapper where the text config has none;
the wrapper's ``tie_word_embeddings`` where it gives one, as transformers reads it, but for
Llama 4, whose output layer is its text model's), and says in ``approximates`` that the
vision encoder and projector (``vision_config``) are not costed.

Key mapping, all families (required unless a default is given)::

    num_hidden_layers                  -> layers
    hidden_size                        -> hidden
    num_attention_heads                -> heads
    num_key_value_heads                -> kv_heads            (absent: 8 for mistral / mixtral /
                                                             glm4_moe / llama4, as
                                                             transformers' defaults; else
                                                             heads; DeepSeek: not read)
    head_dim                           -> head_dim            (below; a positive integer)
    intermediate_size                  -> ffn_hidden          (width of the dense MLP layers)
    vocab_size                         -> vocab
    max_position_embeddings            -> (not seq_len: checked against it, see below)
    tie_word_embeddings                -> tied_embeddings     (default false)
    attention_dropout, hidden_dropout  -> dropout = either > 0 (default false)
    (constant)                         -> position_embedding = "rope", gated_mlp = true (SwiGLU),
                                          normalization = "rmsnorm", linear_bias = false

Biases (Megatron-Core's add_bias_linear / add_qkv_bias, what the exports build)::

    qwen2, qwen2_moe     qkv_bias = true (transformers' Qwen2Attention: q, k, v with a bias)
    qwen3, qwen3_moe     qk_norm = true (Qwen3Attention's q_norm / k_norm over a head)
    llama, qwen3,        attention_bias (default false) -> qkv_bias; llama with mlp_bias too
    qwen3_moe            -> linear_bias = true (every linear layer)
    gpt_oss              attention_bias (default true) -> linear_bias (attention and experts);
                         softmax_type = "learnable" (its attention sinks: not costed, but
                         context parallelism then needs cp_comm_type = "a2a")
    glm4_moe             attention_bias (default false) -> qkv_bias (q / k / v, o without);
                         use_qk_norm (default false) -> qk_norm
    llama4               attention_bias as llama's; use_qk_norm (default true) ->
                         qk_l2_norm (Llama4TextL2Norm, weightless; transformers applies it
                         on the RoPE layers, Megatron-Core's qk_l2_norm on every layer)
    mistral, mixtral,    none (glm4_moe_lite: attention_bias, default false, not read)
    deepseek_v2 / v3,
    glm4_moe_lite

``max_position_embeddings`` is the model's *maximum* context, usually far longer than the
training sequence (131072 for Qwen2-7B, 163840 for DeepSeek-V3), so it never becomes
``seq_len``: the instance must set ``[model] seq_len`` to the length it trains at (the loader
says so, naming ``model.seq_len``, when it is missing, and warns when it exceeds the maximum).

Mixture of experts (``experts``, ``top_k``, ``moe_ffn_hidden``, ``shared_experts``,
``first_dense_layers``, ``moe_layer_interval`` are returned for the MoE families only)::

    mixtral      num_local_experts (or its alias num_experts) -> experts,
                 num_experts_per_tok -> top_k, intermediate_size -> moe_ffn_hidden (every
                 layer is MoE; no shared experts)
    gpt_oss      the same keys (num_experts_per_tok, or experts_per_token as OpenAI's own
                 config writes it); every layer is MoE; head_dim (64 on gpt-oss-20b / 120b,
                 against hidden / heads = 45) is read as below
    qwen2_moe,   num_experts -> experts, num_experts_per_tok -> top_k,
    qwen3_moe    moe_intermediate_size -> moe_ffn_hidden,
                 shared_expert_intermediate_size (default 0) -> shared_experts =
                     max(1, round(shared / moe_intermediate_size)) when > 0, else 0,
                 decoder_sparse_step (default 1) -> moe_layer_interval = step and
                     first_dense_layers = step - 1 (Hugging Face makes layer i sparse when
                     (i + 1) % step == 0, i.e. layers step-1, 2*step-1, ...: exactly that set)
    glm4_moe     n_routed_experts (alias num_local_experts) -> experts,
                 num_experts_per_tok -> top_k, moe_intermediate_size -> moe_ffn_hidden,
                 n_shared_experts -> shared_experts, first_k_dense_replace ->
                 first_dense_layers (Glm4MoeDecoderLayer: layer_idx >= it is sparse),
                 num_nextn_predict_layers (alias num_mtp_layers) -> mtp_layers; absent keys
                 at Glm4MoeConfig's defaults (128 experts, top 8, 1408, 1 shared, 1 dense
                 layer, 1 prediction depth); the router scores with a sigmoid
    glm4_moe_lite  the same keys as glm4_moe (absent: Glm4MoeLiteConfig's 64 experts, top 4,
                 1536, 1 shared), but the dense layers from mlp_layer_types (its leading
                 "dense" entries -> first_dense_layers; absent, first_k_dense_replace as
                 Megatron-Bridge reads it, default 1, transformers' first layer; a dense
                 layer after a sparse one is modelled as MoE, with a warning); the router
                 scores with a sigmoid; num_nextn_predict_layers where a config gives it
                 (transformers builds none)
    llama4       num_local_experts -> experts, num_experts_per_tok -> top_k,
                 intermediate_size -> moe_ffn_hidden, one shared expert of that width
                 (Llama4TextMoe.shared_expert), intermediate_size_mlp -> ffn_hidden (the
                 dense layers), interleave_moe_layer_step -> moe_layer_interval = step and
                 first_dense_layers = step - 1 (transformers' moe_layers = range(step - 1,
                 layers, step)), or moe_layers where the config lists them (a run of every
                 n-th layer to the last; another list is modelled by the step, with a
                 warning); absent keys at Llama4TextConfig's defaults (head_dim 128,
                 intermediate_size 8192, 16 experts, top 1, 8 kv heads); the router scores
                 with a sigmoid
    deepseek_v2, n_routed_experts -> experts, num_experts_per_tok -> top_k,
    deepseek_v3  moe_intermediate_size -> moe_ffn_hidden,
                 n_shared_experts (default 0) -> shared_experts (each moe_intermediate_size wide),
                 moe_layer_freq (default 1) -> moe_layer_interval,
                 first_k_dense_replace (default 0) -> first_dense_layers, rounded up to a
                     multiple of moe_layer_freq (Hugging Face makes layer i sparse when
                     i >= first_k_dense_replace and i % moe_layer_freq == 0; identical when the
                     frequency is 1, as in every published DeepSeek config)
                 DeepSeek-V3's router scores with a sigmoid (DeepseekV3TopkRouter), V2's
                 with a softmax

``moe_router_score_function`` (Megatron-Core's name) is not costed: the exports write it, so
that the launched router scores as the original's (its other details, DeepSeek-V3's and GLM's
expert bias and scaling factor, Llama 4's router probability applied to the expert input, are
not written).

DeepSeek's multi-head latent attention (deepseek_v2, deepseek_v3, glm4_moe_lite), absent keys at
transformers' DeepseekV2Config / DeepseekV3Config defaults (Glm4MoeLiteConfig's in brackets;
its ``head_dim`` is an alias of qk_rope_head_dim, read as that where the latter is absent)::

    kv_lora_rank       -> kv_lora_rank         (default 512)
    q_lora_rank        -> q_lora_rank          (default 1536 [768]; null: queries not
                                                compressed, as DeepSeek-V2-Lite, and the key is
                                                left out)
    qk_nope_head_dim   -> qk_head_dim          (default 128 [192])
    qk_rope_head_dim   -> qk_pos_emb_head_dim  (default 64)
    v_head_dim         -> v_head_dim           (default 128 [256])
    num_nextn_predict_layers -> mtp_layers     (multi-token prediction depths; absent or 0:
                                                none, and the key is left out)

Sliding-window attention (``sliding_window``: Mistral / Mixtral / Phi-3, gpt-oss, and Qwen
with ``use_sliding_window``) becomes ``window_size = sliding_window - 1`` (Hugging Face counts
the query in its window, Megatron-Core's ``window_size`` the keys before it) and, where only
some layers are windowed, ``window_attn_skip_freq`` (from ``layer_types``, else Qwen's layers
from ``max_window_layers`` up, gpt-oss's every other layer from the first)::

    gpt-oss (sliding, full, sliding, ...)   -> window_attn_skip_freq = 2
    any other mix of layers                 -> window_attn_skip_freq = [1, 0, ...] (1 windowed)

An MoE config with no routed experts (0, 1 or null: one expert is a dense MLP), or whose dense
layers leave no MoE layer, is returned as a dense model.

Approximations (what the returned shape does not capture):

* ``layers`` is ``num_hidden_layers``; DeepSeek-V3's multi-token prediction module
  (``num_nextn_predict_layers``) is ``mtp_layers``, outside ``layers``.
* ``head_dim`` (Qwen3, newer Mistral) becomes the ModelSpec's ``head_dim`` when ``head_dim *
  heads != hidden`` (e.g. Qwen3-0.6B, Qwen3-30B-A3B: 32 heads of 128 on a hidden of 2048), so
  the attention projections and the attention core are ``heads * head_dim`` wide.
* Qwen-MoE ``mlp_only_layers``: the leading layers ``[0, 1, ..., k-1]`` (at
  ``decoder_sparse_step = 1``) are ``first_dense_layers = k``; dense layers elsewhere are
  ignored, with a :class:`UserWarning` (the list is empty in the published configs).
* The Qwen2-MoE shared-expert sigmoid gate (one hidden-wide vector) is not counted.
  gpt-oss's attention sinks (one logit per head; ``softmax_type`` says they are there),
  router bias and the SwiGLU clamp are not counted.
* Llama 4's chunked attention (``attention_chunk_size``, 8192: its RoPE layers, all but
  every fourth, attend within the chunk of their query) is costed as full causal attention,
  which it is up to ``attention_chunk_size`` tokens; beyond, the loader adds it to
  ``approximates`` (Megatron-Core builds no such layer). Its NoPE layers and attention
  temperature tuning change no cost. GLM's partial rotary embedding is not counted.
* ``attention_bias`` of Llama and Qwen3 also puts a bias on the output projection (``h`` per
  layer), which Megatron-Core's ``add_qkv_bias`` leaves out: not counted. Llama's ``mlp_bias``
  alone (without ``attention_bias``) is not counted either.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from planner.model.errors import InputError

SUPPORTED = ("llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe",
             "deepseek_v2", "deepseek_v3", "gpt_oss", "phi3", "glm4_moe", "glm4_moe_lite",
             "llama4")
#: the families with DeepSeek's multi-head latent attention, and their transformers config
#: defaults for absent keys: (kv_lora_rank, q_lora_rank, qk_nope_head_dim, qk_rope_head_dim,
#: v_head_dim) (DeepseekV2Config / DeepseekV3Config, Glm4MoeLiteConfig)
_MLA_DEFAULTS = {"deepseek_v2": (512, 1536, 128, 64, 128),
                 "deepseek_v3": (512, 1536, 128, 64, 128),
                 "glm4_moe_lite": (512, 768, 192, 64, 256)}
#: the language model's own ``model_type`` inside a wrapper's ``text_config`` where it is not a
#: family name itself (transformers' Llama4TextConfig)
_TEXT_TYPES = {"llama4_text": "llama4"}
#: a wrapper's own tie_word_embeddings default where it holds the output layer and the config
#: leaves the key out (transformers' Mistral3Config: True); other wrappers: the text config's
_WRAPPER_TIE = {"mistral3": True}

# ``architectures`` entries are ``<Prefix>For<Task>``; the prefix names the family
_ARCH_PREFIX = {
    "Llama": "llama", "Mistral": "mistral", "Mixtral": "mixtral",
    "Qwen2": "qwen2", "Qwen2Moe": "qwen2_moe", "Qwen3": "qwen3", "Qwen3Moe": "qwen3_moe",
    "DeepseekV2": "deepseek_v2", "DeepseekV3": "deepseek_v3", "GptOss": "gpt_oss",
    "Phi3": "phi3", "Glm4Moe": "glm4_moe", "Glm4MoeLite": "glm4_moe_lite", "Llama4": "llama4",
}

_REQUIRED = object()


class _Reader:
    """Typed access to the config's keys that collects every problem before raising."""

    def __init__(self, cfg: dict[str, Any]):
        self.cfg = cfg
        self.problems: list[str] = []

    def _get(self, key: str, default: Any, check: Callable[[Any], bool], expected: str) -> Any:
        value = self.cfg.get(key)
        if value is None:   # absent, or null as Hugging Face writes unset optional keys
            if default is _REQUIRED:
                self.problems.append(f"{key}: required key is missing")
            return None if default is _REQUIRED else default
        if not check(value):
            self.problems.append(f"{key}: expected {expected} (got {json.dumps(value)})")
            return None
        return value

    def count(self, key: str, default: Any = _REQUIRED, minimum: int = 1) -> Any:
        return self._get(key, default,
                         lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= minimum,
                         "a positive integer" if minimum == 1 else f"an integer >= {minimum}")

    def number(self, key: str, default: float = 0.0) -> Any:
        return self._get(key, default,
                         lambda v: isinstance(v, int | float) and not isinstance(v, bool) and v >= 0,
                         "a number >= 0")

    def flag(self, key: str, default: bool) -> Any:
        return self._get(key, default, lambda v: isinstance(v, bool), "true or false")

    def int_list(self, key: str) -> list:
        return self._get(key, [], lambda v: isinstance(v, list)
                         and all(isinstance(i, int) and not isinstance(i, bool) for i in v),
                         "a list of layer indices")


def _window(cfg: dict[str, Any], family: str, r: _Reader, layers: int | None) -> dict[str, Any]:
    """The sliding-window keys (``window_size``, ``window_attn_skip_freq``) of a config that
    attends within a window, else none. Hugging Face's ``sliding_window`` counts the query
    itself, Megatron-Core's ``window_size`` the keys before it: one fewer (Megatron-Bridge
    models/conversion/utils.py mcore_to_hf_window_size). Which layers: ``layer_types``
    where the config lists them; else every layer (Mistral, Mixtral, Phi-3), the layers from
    ``max_window_layers`` up (Qwen, only with ``use_sliding_window``), every other layer from
    the first (gpt-oss: transformers' GptOssConfig default)."""
    qwen = family.startswith("qwen")
    if family not in ("mistral", "mixtral", "phi3", "gpt_oss") and not qwen:
        return {}
    if qwen and cfg.get("use_sliding_window") is not True:
        return {}               # (transformers' Qwen configs drop the window without it)
    if cfg.get("sliding_window") == 0:
        return {}               # (0 written for none)
    window = r.count("sliding_window", None, minimum=2)
    if window is None or not layers:
        return {}
    kinds = cfg.get("layer_types")
    if kinds is not None:
        if not (isinstance(kinds, list) and len(kinds) == layers
                and all(k in ("sliding_attention", "full_attention") for k in kinds)):
            r.problems.append(f"layer_types: expected {layers} entries (num_hidden_layers), each "
                              "\"sliding_attention\" or \"full_attention\"")
            return {}
        pattern = [k == "sliding_attention" for k in kinds]
    elif qwen:
        first = r.count("max_window_layers", 0, minimum=0)
        pattern = [i >= (first or 0) for i in range(layers)]
    elif family == "gpt_oss":
        pattern = [i % 2 == 0 for i in range(layers)]
    else:
        pattern = [True] * layers
    if not any(pattern):
        return {}
    keys: dict[str, Any] = {"window_size": window - 1}
    if not all(pattern):
        # Megatron-Core's integer form where it says the same (every N-th layer, counted from
        # 1, full attention), else its list of 0 / 1 per layer
        freq = next((n for n in range(2, layers + 1)
                     if pattern == [(i + 1) % n != 0 for i in range(layers)]), None)
        keys["window_attn_skip_freq"] = freq if freq else [int(w) for w in pattern]
    return keys


def _load(p: Path) -> dict[str, Any]:
    from planner.model.instance import check_readable

    check_readable(p, "Hugging Face config.json")
    try:
        cfg = json.loads(p.read_text(encoding="utf-8"))
    except RecursionError:
        raise InputError(f"{p}: nested too deeply to read (expected a Hugging Face config.json)") \
            from None
    except UnicodeDecodeError:
        raise InputError(f"{p}: not a text file (expected a Hugging Face config.json)") from None
    except json.JSONDecodeError as exc:
        raise InputError(f"{p}: invalid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") \
            from None
    if not isinstance(cfg, dict):
        raise InputError(f"{p}: expected a JSON object of config keys, got a {type(cfg).__name__}")
    return cfg


def _language_model(cfg: dict[str, Any], p: Path) -> tuple[dict[str, Any], str, str, list[str]]:
    """The language model's keys: a multimodal wrapper's ``text_config`` (Llama 4, Mistral 3
    and others write the decoder's keys there, beside a ``vision_config``), else the config
    itself; with their family, where they were read (for the messages) and what the shape
    leaves out (the model's ``approximates``): the decoder is what the planner costs, a
    vision encoder and its projector are not. The wrapper's
    ``architectures`` and ``_name_or_path`` stand where the text config has none; its
    ``tie_word_embeddings`` wins but for Llama 4, whose output layer is its text model's."""
    text = cfg.get("text_config")
    if text is None:
        return cfg, _family(cfg, p), "", []
    if not isinstance(text, dict):
        raise InputError(f"{p}: text_config: expected an object of the language model's keys "
                         f"(got {json.dumps(text)})")
    inner = dict(text)
    for key in ("architectures", "_name_or_path"):
        if inner.get(key) is None and cfg.get(key) is not None:
            inner[key] = cfg[key]
    if inner.get("model_type") is None and cfg.get("model_type") is not None:
        inner["model_type"] = cfg["model_type"]
    outer = cfg.get("model_type")
    where = f" (the text_config of model_type {json.dumps(outer)})" if outer else \
        " (the text_config)"
    # the tie is the wrapper's where the wrapper holds the output layer (transformers reads
    # the top-level config's tie_word_embeddings: Mistral 3, Gemma 3); Llama 4's output layer
    # is its text model's (Llama4ForCausalLM on text_config), whose key decides
    family = _family(inner, p, where)
    tie = cfg.get("tie_word_embeddings",
                  _WRAPPER_TIE.get(outer) if isinstance(outer, str) else None)
    if tie is not None and family != "llama4":
        inner["tie_word_embeddings"] = tie
    return inner, family, where, (["the language model (text_config) alone: its vision encoder and "
                           "projector (vision_config) are not costed"]
                          if cfg.get("vision_config") is not None else [])


def _family(cfg: dict[str, Any], p: Path, where: str = "") -> str:
    model_type = cfg.get("model_type")
    if isinstance(model_type, str):
        model_type = _TEXT_TYPES.get(model_type, model_type)
    if model_type in SUPPORTED:
        return model_type
    archs = cfg.get("architectures")
    archs = archs if isinstance(archs, list) else []
    for arch in archs:
        if isinstance(arch, str) and arch.split("For")[0] in _ARCH_PREFIX:
            return _ARCH_PREFIX[arch.split("For")[0]]
    found = "no model_type" if model_type is None else f"model_type {json.dumps(model_type)}"
    if archs:
        found += f" (architectures {', '.join(map(str, archs))})"
    found += where
    raise InputError(f"{p}: unsupported architecture: {found}; supported model_type values: "
                     + ", ".join(SUPPORTED))


def read_hf_config(path: Path) -> dict[str, Any]:
    """ModelSpec keys from the Hugging Face ``config.json`` at ``path`` (mapping in the module
    docstring), never ``seq_len``; the instance may override any key with an explicit value."""
    return read_hf_config_with_context(path)[0]


class ConfigContext(NamedTuple):
    """What the loader needs beside the keys, for its messages (it alone knows ``seq_len``)."""

    max_context: int | None   # max_position_embeddings: the longest sequence the model supports
    label: str                # names the model when the file's name says nothing (config.json)
    chunk: int | None         # Llama 4's attention_chunk_size, where some layers attend in chunks
    chunked_layers: int       # how many: costed as full causal attention (exact up to chunk)


def _chunked(cfg: dict[str, Any], family: str, r: _Reader, layers: int) -> tuple[int | None, int]:
    """Llama 4's chunked attention: ``(attention_chunk_size, layers attending in chunks)``, else
    ``(None, 0)``. Its RoPE layers attend only within the ``chunk``-long block of their query
    (transformers' Llama4TextConfig: ``layer_types`` "chunked_attention", else the layers
    ``no_rope_layers`` marks 1, else all but every ``no_rope_layer_interval``-th; a null
    ``attention_chunk_size`` turns it off). Megatron-Core has no such layer (NeMo's Llama 4
    spec adds one), so the planner costs those layers as full causal attention: exact up to
    ``chunk`` tokens per sequence, an overestimate of their attention core beyond."""
    if family != "llama4" or ("attention_chunk_size" in cfg and cfg["attention_chunk_size"] is None):
        return None, 0
    chunk = r.count("attention_chunk_size", 8192)
    kinds = cfg.get("layer_types")
    if isinstance(kinds, list):
        return chunk, sum(k == "chunked_attention" for k in kinds)
    rope = cfg.get("no_rope_layers")
    if isinstance(rope, list) and rope:
        return chunk, sum(1 for k in rope[:layers] if k)
    every = r.count("no_rope_layer_interval", 4)
    return chunk, sum(1 for i in range(layers) if (i + 1) % (every or 1) != 0)


def _glm_experts(cfg: dict[str, Any], r: _Reader, defaults: tuple[int, int, int],
                 first: int) -> dict[str, Any]:
    """GLM's MoE keys (glm4_moe, glm4_moe_lite: the same router, experts and shared expert):
    ``n_routed_experts`` (alias ``num_local_experts``), ``num_experts_per_tok``,
    ``moe_intermediate_size`` at the family's config defaults (experts, top_k, width),
    ``n_shared_experts`` (default 1), the ``first`` dense layers the caller read, a sigmoid
    router."""
    experts, top_k, width = defaults
    routed = "num_local_experts" if cfg.get("n_routed_experts") is None \
        and cfg.get("num_local_experts") is not None else "n_routed_experts"
    return {"experts": r.count(routed, experts, minimum=0),
            "top_k": r.count("num_experts_per_tok", top_k),
            "moe_ffn_hidden": r.count("moe_intermediate_size", width),
            "shared_experts": r.count("n_shared_experts", 1, minimum=0),
            "first_dense_layers": first, "moe_layer_interval": 1,
            "moe_router_score_function": "sigmoid"}


def read_hf_config_with_context(path: Path) -> tuple[dict[str, Any], ConfigContext]:
    """:func:`read_hf_config` and its :class:`ConfigContext`: the config's
    ``max_position_embeddings`` (None when absent), a label for the model (the last part of
    ``_name_or_path``, the model id or directory transformers saved it from, e.g.
    ``Qwen/Qwen2-72B``, else its ``model_type``) and Llama 4's chunked attention."""
    p = Path(path)
    cfg, family, where, left_out = _language_model(_load(p), p)
    notes: list[str] = []
    r = _Reader(cfg)

    heads = r.count("num_attention_heads")
    # an absent num_key_value_heads is transformers' default of the family: 8 for Mistral and
    # Mixtral (configuration_mistral.py / configuration_mixtral.py), else the heads (Llama's
    # None, read as num_attention_heads); null is read as absent
    # (Glm4MoeConfig and Llama4TextConfig default to 8 as well)
    kv_default = 8 if family in ("mistral", "mixtral", "glm4_moe", "llama4") \
        and "num_key_value_heads" not in cfg else heads
    out: dict[str, Any] = {
        "layers": r.count("num_hidden_layers"),
        "hidden": r.count("hidden_size"),
        "heads": heads,
        "kv_heads": r.count("num_key_value_heads", kv_default),
        # (Llama 4's expert width; absent, Llama4TextConfig's 8192)
        "ffn_hidden": r.count("intermediate_size", 8192 if family == "llama4" else _REQUIRED),
        "gated_mlp": True,
        "vocab": r.count("vocab_size"),
        "tied_embeddings": r.flag("tie_word_embeddings", False),
        "position_embedding": "rope",
        "dropout": bool((r.number("attention_dropout") or 0) > 0
                        or (r.number("hidden_dropout") or 0) > 0),
        # every supported family normalises with RMSNorm and has bias-free MLPs; the
        # attention's biases by family below
        "normalization": "rmsnorm",
        "linear_bias": False,
    }
    if family in ("qwen2", "qwen2_moe"):
        out["qkv_bias"] = True     # (transformers Qwen2Attention: q / k / v with a bias, o without)
    if family in ("qwen3", "qwen3_moe"):
        out["qk_norm"] = True      # (transformers Qwen3Attention: q_norm, k_norm over head_dim)
    elif family == "glm4_moe" and r.flag("use_qk_norm", False):
        out["qk_norm"] = True      # (Glm4MoeAttention: q_norm / k_norm as Qwen3's)
    elif family == "llama4" and r.flag("use_qk_norm", True):
        out["qk_l2_norm"] = True   # (Llama4TextL2Norm: weightless, on the RoPE layers)
    if family == "glm4_moe":
        if r.flag("attention_bias", False):
            out["qkv_bias"] = True  # (Glm4MoeAttention: q / k / v with a bias, o without)
    elif family in ("llama", "qwen3", "qwen3_moe", "llama4"):
        if r.flag("attention_bias", False):
            out["qkv_bias"] = True
        if family == "llama" and r.flag("mlp_bias", False) and out.get("qkv_bias"):
            out["linear_bias"] = True
            del out["qkv_bias"]
    elif family == "gpt_oss":
        # attention biases (q, k, v, o) and the experts' (gate_up, down): every linear layer
        out["linear_bias"] = bool(r.flag("attention_bias", True))
        # its attention sinks (GptOssAttention.sinks, a logit per head; Megatron-Bridge's
        # gpt_oss_bridge.py: softmax_type "learnable")
        out["softmax_type"] = "learnable"
    max_context = r.count("max_position_embeddings", None)
    moe: dict[str, Any] | None = None

    # Mixtral's and gpt-oss's expert count, under the alias transformers maps to it
    # (attribute_map {"num_experts": "num_local_experts"}; OpenAI's own config writes it so)
    local = ("num_experts" if cfg.get("num_local_experts") is None
             and cfg.get("num_experts") is not None else "num_local_experts")
    if family == "mixtral":
        moe = {"experts": r.count(local, minimum=0),
               "top_k": r.count("num_experts_per_tok"),
               "moe_ffn_hidden": out["ffn_hidden"],
               "shared_experts": 0, "first_dense_layers": 0, "moe_layer_interval": 1}
    elif family == "gpt_oss":
        # (Hugging Face's key, else OpenAI's own; null counts as absent, as _Reader reads it)
        top_k = r.count("num_experts_per_tok" if cfg.get("num_experts_per_tok") is not None
                        else "experts_per_token")
        moe = {"experts": r.count(local, minimum=0), "top_k": top_k,
               "moe_ffn_hidden": out["ffn_hidden"],
               "shared_experts": 0, "first_dense_layers": 0, "moe_layer_interval": 1}
    elif family in ("qwen2_moe", "qwen3_moe"):
        width = r.count("moe_intermediate_size")
        shared = r.count("shared_expert_intermediate_size", 0, minimum=0)
        step = r.count("decoder_sparse_step", 1)
        moe = {"experts": r.count("num_experts", minimum=0),
               "top_k": r.count("num_experts_per_tok"),
               "moe_ffn_hidden": width,
               "shared_experts": max(1, round(shared / width)) if shared and width else 0,
               "first_dense_layers": step - 1 if step else 0,
               "moe_layer_interval": step}
        dense_at = r.int_list("mlp_only_layers")
        if dense_at and step == 1 and sorted(dense_at) == list(range(len(dense_at))):
            moe["first_dense_layers"] = len(dense_at)    # the leading layers: expressible
        elif dense_at:
            notes.append(f"mlp_only_layers {dense_at} ignored: those layers are modelled as MoE")
    elif family == "glm4_moe":
        # DeepSeek-V3's layout with grouped-query attention: the leading dense layers, then MoE
        # layers with shared experts, and multi-token prediction (absent keys at
        # transformers' Glm4MoeConfig defaults: 1 shared expert, 1 dense layer, 1 depth)
        mtp = r.count("num_nextn_predict_layers" if "num_mtp_layers" not in cfg
                      else "num_mtp_layers", 1, minimum=0)
        if mtp:
            out["mtp_layers"] = mtp
        moe = _glm_experts(cfg, r, (128, 8, 1408),
                           r.count("first_k_dense_replace", 1, minimum=0))
    elif family == "llama4":
        # the dense layers are intermediate_size_mlp wide, each expert (and the one shared
        # expert of every MoE layer) intermediate_size; the MoE layers are every
        # interleave_moe_layer_step-th from step - 1 (transformers' Llama4TextConfig), or
        # moe_layers where given (defaults: Llama4TextConfig's)
        out["ffn_hidden"] = r.count("intermediate_size_mlp", 16384)
        step = r.count("interleave_moe_layer_step", 1)
        first, interval = (step - 1, step) if step else (0, 1)
        # (a list that is not of layer indices is None, a problem raised below)
        listed = sorted(set(r.int_list("moe_layers") or []))
        layers = out["layers"] or 0
        if "moe_layers" in cfg and cfg["moe_layers"] is not None and layers:
            gap = listed[1] - listed[0] if len(listed) > 1 else layers - (listed or [0])[0]
            if not listed:
                first, interval = layers, 1                  # (no MoE layer: a dense model)
            elif gap >= 1 and listed == list(range(listed[0], layers, gap)):
                first, interval = listed[0], gap
            else:
                notes.append(f"moe_layers {listed} is not every n-th layer up to the last: "
                             f"modelled as one layer in {interval} from layer {first} on "
                             "(interleave_moe_layer_step)")
        moe = {"experts": r.count("num_local_experts", 16, minimum=0),
               "top_k": r.count("num_experts_per_tok", 1),
               "moe_ffn_hidden": r.count("intermediate_size", 8192),
               "shared_experts": 1, "first_dense_layers": first,
               "moe_layer_interval": interval, "moe_router_score_function": "sigmoid"}
    if family in _MLA_DEFAULTS:
        # multi-head latent attention: its widths (the family's transformers defaults where
        # absent, _MLA_DEFAULTS; q_lora_rank null: queries not compressed)
        kv_lora, q_lora, nope, rope, v_dim = _MLA_DEFAULTS[family]
        del out["kv_heads"]
        out["kv_lora_rank"] = r.count("kv_lora_rank", kv_lora)
        if "q_lora_rank" not in cfg or cfg["q_lora_rank"] is not None:
            out["q_lora_rank"] = r.count("q_lora_rank", q_lora)
        out["qk_head_dim"] = r.count("qk_nope_head_dim", nope)
        # (Glm4MoeLiteConfig's attribute_map reads head_dim as qk_rope_head_dim)
        alias = (family == "glm4_moe_lite" and cfg.get("qk_rope_head_dim") is None
                 and cfg.get("head_dim") is not None)
        out["qk_pos_emb_head_dim"] = r.count("head_dim" if alias else "qk_rope_head_dim", rope)
        out["v_head_dim"] = r.count("v_head_dim", v_dim)
        mtp = r.count("num_nextn_predict_layers", 0, minimum=0)
        if mtp:
            out["mtp_layers"] = mtp
    if family == "glm4_moe_lite":
        # GLM-4.7-Flash: DeepSeek-V3's attention (Glm4MoeLiteAttention) on GLM-4.5's MoE
        # (router, experts, shared expert), the dense layers named by mlp_layer_types
        # (Glm4MoeLiteConfig's default: the first dense, the rest sparse); absent keys at
        # that config's defaults (64 experts, top 4, 1536, 1 shared)
        layers = out["layers"] or 0
        kinds = cfg.get("mlp_layer_types")
        if isinstance(kinds, list) and kinds:
            lead = next((i for i, t in enumerate(kinds) if t != "dense"), len(kinds))
            first = lead
            if any(t != "sparse" for t in kinds[lead:layers]):
                notes.append(f"mlp_layer_types has dense layers after the first sparse one: "
                             f"modelled as {lead} leading dense layers, the rest MoE")
        else:
            # (checkpoints' config.json carry first_k_dense_replace too, which
            # Megatron-Bridge's GLM-4.7-Flash bridge reads: glm47_flash_bridge.py)
            first = r.count("first_k_dense_replace", 1, minimum=0)
        moe = _glm_experts(cfg, r, (64, 4, 1536), first)
    elif family in ("deepseek_v2", "deepseek_v3"):
        freq = r.count("moe_layer_freq", 1)
        first = r.count("first_k_dense_replace", 0, minimum=0)
        moe = {"experts": r.count("n_routed_experts", 0, minimum=0),
               "top_k": r.count("num_experts_per_tok"),
               "moe_ffn_hidden": r.count("moe_intermediate_size"),
               "shared_experts": r.count("n_shared_experts", 0, minimum=0),
               # (a bad count is None, a problem raised below before the value is used)
               "first_dense_layers": (-(-first // freq) * freq if freq and first is not None
                                      else first),
               "moe_layer_interval": freq}
        if family == "deepseek_v3":
            moe["moe_router_score_function"] = "sigmoid"   # (DeepseekV3TopkRouter; V2: softmax)

    out.update(_window(cfg, family, r, out["layers"]))

    if r.problems:
        raise InputError(f"{p}: not a usable Hugging Face config (model_type {family})", r.problems)

    # (one routed expert is a dense MLP: the schema's experts = 0)
    if moe is not None and moe["experts"] > 1 and moe["first_dense_layers"] < out["layers"]:
        out.update(moe)

    # (Llama4TextConfig's head_dim defaults to 128, not hidden / heads)
    # (written null, Llama4TextConfig takes hidden / heads)
    # (MLA families: no head_dim; Glm4MoeLiteConfig maps the key to qk_rope_head_dim)
    head_dim = None if family in _MLA_DEFAULTS else r.count(
        "head_dim", 128 if family == "llama4" and "head_dim" not in cfg else None)
    if r.problems:
        raise InputError(f"{p}: not a usable Hugging Face config (model_type {family})", r.problems)
    if head_dim and head_dim * heads != out["hidden"]:
        out["head_dim"] = head_dim     # the attention is a d wide, not hidden (Qwen3)
    for note in notes:
        warnings.warn(f"{p}: {note}", UserWarning, stacklevel=2)
    named = cfg.get("_name_or_path")
    label = (named.rstrip("/").rsplit("/", 1)[-1] if isinstance(named, str) and named.strip("/ ")
             else family)
    if left_out:
        out["approximates"] = "; ".join(left_out)
    chunk, chunked_layers = _chunked(cfg, family, r, out["layers"])
    if r.problems:
        raise InputError(f"{p}: not a usable Hugging Face config (model_type {family})", r.problems)
    return out, ConfigContext(max_context, label, chunk if chunked_layers else None, chunked_layers)

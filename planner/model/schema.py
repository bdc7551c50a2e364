"""The instance file schema (docs/contract.md, "Instance files") as pydantic models.

Unknown keys are errors everywhere (``extra="forbid"``) so a misspelt key never silently falls
back to a default. Types are strict (``layers = true`` or ``global_batch = "512"`` are errors, not
1 and 512) and floats must be finite. Every number is range-checked here, with upper limits far
beyond any real job (they keep the search and the solvers' integer units finite); cross-field
rules (heads divisible by kv_heads, a pin within its cap) are model validators, so all problems
surface at load time with the key path that holds them.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal, get_args

from pydantic import (BaseModel, ConfigDict, Field, ValidationError, WrapValidator,
                      field_validator, model_validator)

from planner.model.frameworks import (FRAMEWORKS, OVERLAP_KNOBS, SHARDING_MODES, FrameworkName,
                                      delayed_scaling, on_megatron_core, param_gather_refusal,
                                      te_holds_master)

RECOMPUTE_MODES = ("none", "selective", "full")
Recompute = Literal["none", "selective", "full"]
Precision = Literal["bf16", "fp16", "fp8", "nvfp4"]
Sharding = Literal["none", "optim", "optim_grads", "optim_grads_params"]
Fraction = Annotated[float, Field(ge=0, le=1)]
Efficiency = Annotated[float, Field(ge=0.01, le=1)]
Bandwidth = Annotated[float, Field(ge=1e-3, le=1e6)]        # GB/s: 1 MB/s .. 1 PB/s


def upto(limit: int):
    """A positive integer no larger than ``limit``."""
    return Annotated[int, Field(gt=0, le=limit)]


MAX_LAYERS, MAX_WIDTH, MAX_VOCAB, MAX_SEQ = 100_000, 1 << 22, 1 << 26, 1 << 26
MAX_BATCH, MAX_NODES, MAX_GPUS, MAX_EXPERTS = 1 << 30, 1 << 20, 1 << 24, 1 << 16
#: the deepest first / last stage shortfall a file may give (each is more layouts to solve)
MAX_STAGE_SHORTFALL = 8

# knob -> its cap, for pins that must lie within their caps
PIN_CAPS = {"tp": "max_tp", "pp": "max_pp", "dp": "max_dp", "cp": "max_cp", "ep": "max_ep",
            "vp": "max_vp", "micro_batch": "max_micro_batch"}
#: What each ``[constraints]`` key is to a what-if, the one list of them (``plan solve
#: --compare``'s unconstrained baseline and the "nearest change" of an infeasible instance
#: read it; tests/test_answers_cli.py checks that every key is here). :func:`lifted` gives
#: the value the baseline lifts each kind to:
#:
#: - ``pin``: fixes a knob (a degree, a switch, a layer count); freed (None, the search's
#:   default);
#: - ``filter``: allows some values only (recompute and sharding modes, ``min_mfu``); lifted
#:   (None: all);
#: - ``cap`` / ``floor``: bounds a knob; the baseline keeps whichever of the instance's value
#:   and the default lets more plans in (None: no bound), so a cap the instance *raises* above
#:   its default (``max_cp = 2``) stays raised;
#: - ``reach``: a key that widens the search (``max_offload_layers``: without it activation
#:   offload is not searched): kept, and raised to the pin it reaches (:data:`REACHES`) so
#:   that the pinned value stays in the baseline's space;
#: - ``placement``: keeps a degree inside a node; lifted (false) where the instance sets it,
#:   kept at its default otherwise (``tp_within_node`` defaults to true, as recipes run it);
#: - ``kept``: not a what-if: the framework the plan must run on, its overlap switches (the
#:   framework's settings, not a choice of the search) and the memory reserves (physics).
WHAT_IFS = {
    **dict.fromkeys(("tp", "pp", "dp", "cp", "vp", "ep", "micro_batch", "sequence_parallel",
                     "distributed_optimizer", "dp_shard_size", "reshard_after_forward",
                     "first_stage_layers", "last_stage_layers", "account_for_embedding",
                     "account_for_loss", "recompute_layers", "optimizer_offload",
                     "offload_layers"), "pin"),
    **dict.fromkeys(("recompute", "dp_sharding", "min_mfu"), "filter"),
    **dict.fromkeys(("max_tp", "max_pp", "max_dp", "max_cp", "max_ep", "max_vp",
                     "max_micro_batch", "max_stage_shortfall", "max_recompute_layers"), "cap"),
    "min_micro_batch": "floor",
    "max_offload_layers": "reach",
    **dict.fromkeys(("tp_within_node", "pp_within_node", "cp_within_node"), "placement"),
    **dict.fromkeys(("framework", *OVERLAP_KNOBS, "memory_reserve_GiB",
                     "host_memory_reserve_GiB"), "kept"),
}
#: a ``reach`` key of :data:`WHAT_IFS` -> the pin whose value it must reach
REACHES = {"max_offload_layers": "offload_layers"}
#: The one default of the two memory knobs, for ``plan evaluate`` (a ``[plan]`` that does not
#: set them) and ``plan solve`` (a ``[constraints]`` that does not pin them) alike: on. In this
#: model neither ever costs time or adds memory (tests/test_dominance.py), and both are what
#: Megatron-Core recipes run; sequence parallelism only acts under tensor parallelism (the
#: exports omit it at tp = 1). A ``[plan]`` value wins, then a ``[constraints]`` pin.
#: (``distributed_optimizer`` is ``plan evaluate``'s default only: ``[plan]`` without
#: ``dp_sharding`` is evaluated with the distributed optimizer, or under torchtitan, which has
#: none, with its own default, FSDP (planner/model/plan.py, ``_sharding``); the search compares every
#: sharding mode, none switched on by default, since sharding parameters or gradients costs
#: time.)
KNOB_DEFAULTS = {"sequence_parallel": True, "distributed_optimizer": True}
#: overlap knobs (Megatron-Core names): the share of a collective the framework hides behind
#: compute, by the rules of docs/model.md ("Overlap"); default: ``[constraints] framework``'s
OVERLAP_DESCRIPTIONS = {
    "overlap_grad_reduce": "reduce gradients bucket by bucket during the last micro-batch's "
                           "backward (exposed: the last bucket, or what the backward cannot hide)",
    "overlap_param_gather": "distributed optimizer: all-gather parameters bucket by bucket during "
                            "the first micro-batch's forward (exposed: the first bucket, or what "
                            "the forward cannot hide)",
    "tp_comm_overlap": "tensor-parallel collectives pipelined with their GEMMs in tp chunks "
                       "(Transformer Engine userbuffers; needs sequence parallelism; exposed: "
                       "one chunk, or what the GEMMs cannot hide)",
    "overlap_p2p_comm": "interleaved pipeline (vp > 1): sends and receives overlap the next "
                        "chunk's compute (exposed: the warm-up's and cool-down's, 2 (vp pp - 1))",
    "overlap_moe_expert_parallel_comm": "MoE with ep > 1, at pp = 1 or interleaved (vp > 1), "
                                        "no full recompute: each micro-batch's expert "
                                        "all-to-alls overlap another micro-batch's layer "
                                        "compute (Megatron-Core's combined 1F1B; exposed: "
                                        "what the layer's compute cannot hide, and the "
                                        "warm-up forwards' and cool-down backwards' "
                                        "all-to-alls)",
}
REPLACED_OVERLAP_KEYS = {"dp_overlap": "overlap_grad_reduce / overlap_param_gather",
                         "tp_overlap": "tp_comm_overlap"}
#: The widths multi-head latent attention needs (``q_lora_rank`` is optional).
MLA_KEYS = ("kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim")
#: The keys of grouped-query attention's shape, which multi-head latent attention refuses.
GQA_KEYS = ("kv_heads", "head_dim")


def replaced_attention_keys(explicit) -> set[str]:
    """The keys a preset or a Hugging Face config fills in that the instance's own attention
    keys replace: its key / value heads and head width where the instance gives MLA's widths
    (a Llama preset made MLA). Without this the filled-in keys would meet the explicit ones and
    be refused, and TOML has no way to unset a key. The other way (``kv_heads`` or
    ``head_dim`` written on an MLA preset) stays an error naming the written key: one such key
    says less about the intent than MLA's widths do."""
    return set(GQA_KEYS) if set(("q_lora_rank",) + MLA_KEYS) & set(explicit) else set()
MOE_KEYS = ("top_k", "moe_ffn_hidden", "shared_experts", "first_dense_layers",
            "moe_layer_interval", "moe_router_score_function")


def _int_or_ints(expected: str) -> WrapValidator:
    """One message for a key that takes a whole number or a list of them (pydantic would say
    "a valid integer" for a list it also accepts), with the value as the TOML wrote it."""
    def check(value, handler):
        try:
            return handler(value)
        except ValidationError:
            from planner.model.words import toml_value
            raise ValueError(f"expected {expected} (got {toml_value(value)})") from None
    return WrapValidator(check)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


class ModelSpec(_Strict):
    """Transformer shape. ``preset`` fills keys from ``planner/data/presets.toml``."""

    preset: str | None = Field(default=None, description="name of a model preset")
    name: str | None = None
    layers: upto(MAX_LAYERS)
    hidden: upto(MAX_WIDTH)
    heads: upto(MAX_WIDTH)
    kv_heads: upto(MAX_WIDTH) | None = Field(default=None, description="GQA key/value heads; default heads")
    head_dim: upto(MAX_WIDTH) | None = Field(
        default=None, description="width of one attention head (Megatron-LM --kv-channels, "
        "Hugging Face head_dim); default hidden / heads")
    # multi-head latent attention (DeepSeek-V2 / V3), Megatron-Core's MLATransformerConfig
    # names; kv_lora_rank set makes the attention MLA (docs/model.md, "Multi-head latent
    # attention")
    kv_lora_rank: upto(MAX_WIDTH) | None = Field(
        default=None, description="multi-head latent attention: rank of the compressed keys "
        "and values (Megatron-Core --kv-lora-rank, Hugging Face kv_lora_rank); given, the "
        "attention is MLA and qk_head_dim, qk_pos_emb_head_dim and v_head_dim are needed too")
    q_lora_rank: upto(MAX_WIDTH) | None = Field(
        default=None, description="MLA: rank of the compressed queries (--q-lora-rank); "
        "none: the queries are projected from the hidden state directly (DeepSeek-V2-Lite)")
    qk_head_dim: upto(MAX_WIDTH) | None = Field(
        default=None, description="MLA: width of a query / key head without its RoPE part "
        "(--qk-head-dim, Hugging Face qk_nope_head_dim)")
    qk_pos_emb_head_dim: upto(MAX_WIDTH) | None = Field(
        default=None, description="MLA: the RoPE part of a query / key head "
        "(--qk-pos-emb-head-dim, Hugging Face qk_rope_head_dim)")
    v_head_dim: upto(MAX_WIDTH) | None = Field(
        default=None, description="MLA: width of a value head (--v-head-dim)")
    ffn_hidden: upto(MAX_WIDTH) | None = Field(default=None, description="MLP width; default 4 * hidden")
    gated_mlp: bool = Field(default=False, description="SwiGLU-style three-matrix MLP")
    activation: Literal["gelu", "squared_relu"] = Field(
        default="gelu", description="a plain MLP's activation: GeLU, or squared ReLU "
        "(Nemotron; Megatron-LM --squared-relu); the same bytes and stored tensors, so the "
        "same cost: what the exports build (a gated MLP is SwiGLU)")
    vocab: upto(MAX_VOCAB)
    seq_len: upto(MAX_SEQ)
    tied_embeddings: bool = Field(default=True, description="output layer shares the input embedding")
    position_embedding: Literal["learned", "rope"] = "learned"
    dropout: bool = Field(default=True, description="trained with dropout (stores 1-byte masks)")
    # the layers' norms and biases (Megatron-Core TransformerConfig normalization,
    # add_bias_linear, add_qkv_bias): parameters of their own, and what the exports build
    normalization: Literal["layernorm", "rmsnorm"] = Field(
        default="layernorm", description="the norms' kind: LayerNorm (a weight and a bias, 2h "
        "each) or RMSNorm (a weight, h; Megatron-LM --normalization RMSNorm)")
    linear_bias: bool = Field(
        default=True, description="a bias on every linear layer of the attention and the MLP "
        "(Megatron-LM's default; false: --disable-bias-linear, as Llama, Mixtral, DeepSeek)")
    qkv_bias: bool | None = Field(
        default=None, description="a bias on the QKV projection; default linear_bias (true "
        "without linear_bias: Qwen2's, Megatron-LM --add-qkv-bias)")
    qk_norm: bool = Field(
        default=False, description="a norm (of the normalization's kind) on each query and "
        "key head before the attention (Qwen3; Megatron-LM --qk-layernorm)")
    softmax_type: Literal["vanilla", "off-by-one", "learnable"] = Field(
        default="vanilla", description="the attention's softmax (Megatron-Core softmax_type): "
        "vanilla, or with a sink, off-by-one (a fixed one) or learnable (a logit per head: "
        "gpt-oss); the sink is not costed (a number per head), but Transformer Engine runs "
        "it under context parallelism only with cp_comm_type = \"a2a\"")
    qk_l2_norm: bool = Field(
        default=False, description="a weightless L2 norm on each query and key head before the "
        "attention (Llama 4; Megatron-Core qk_l2_norm, Megatron-LM --qk-l2-norm)")
    # sliding-window attention (Megatron-Core TransformerConfig window_size and
    # window_attn_skip_freq; docs/model.md, "Sliding-window attention")
    window_size: Annotated[int | list[int] | None, _int_or_ints(
        "a whole number of tokens or [left, 0]")] = Field(
        default=None, description="sliding-window attention: each query attends to itself "
        "and the window_size tokens before it (Megatron-Core's window_size (left, 0), given "
        "as that number or as [left, 0]; a Hugging Face sliding_window counts the query too: "
        "one more); -1, or a window covering seq_len, is full causal attention (-1 overrides "
        "an hf_config's window); default none: full causal attention")
    window_attn_skip_freq: Annotated[int | list[int] | None, _int_or_ints(
        "a whole number N or a list of 0 / 1 per layer")] = Field(
        default=None, description="which layers attend within the window (Megatron-Core's "
        "names): N, every N-th layer full attention and the others windowed; or a list of 0 / "
        "1 per layer, 1 windowed; default every layer (with window_size)")
    approximates: str | None = Field(
        default=None, description="what this shape stands in for where the model has no "
        "term of its own, said in the plan's caveats and in every export, whose model "
        "arguments build the approximation")
    hf_config: str | None = Field(
        default=None, description="a Hugging Face config.json (path relative to the instance) "
        "filling the keys above; explicit keys override it")
    # mixture of experts (experts = 0: a dense model)
    experts: int = Field(default=0, ge=0, le=MAX_EXPERTS,
                         description="routed experts per MoE layer (0 = dense)")
    top_k: upto(MAX_EXPERTS) = Field(default=2, description="routed experts per token")
    moe_router_score_function: Literal["softmax", "sigmoid"] = Field(
        default="softmax", description="how the router scores the experts (Megatron-Core's "
        "name; sigmoid: DeepSeek-V3, GLM-4.5, Llama 4); not costed, written by the exports")
    moe_ffn_hidden: upto(MAX_WIDTH) | None = Field(
        default=None, description="MLP width of one expert; default ffn_hidden")
    shared_experts: int = Field(default=0, ge=0, le=MAX_EXPERTS,
                                description="always-on experts per MoE layer")
    first_dense_layers: int = Field(default=0, ge=0, description="leading dense layers")
    moe_layer_interval: upto(MAX_LAYERS) = Field(
        default=1, description="every n-th layer after the dense ones is an MoE layer")
    mtp_layers: int = Field(
        default=0, ge=0, le=MAX_LAYERS, description="multi-token prediction depths (DeepSeek-V3; "
        "Megatron-Core --mtp-num-layers, Hugging Face num_nextn_predict_layers): each runs, on "
        "the last pipeline stage, a 2h -> h projection, one transformer layer of the last "
        "layer's kind and the output layer and loss once more")

    @model_validator(mode="after")
    def _shape(self) -> ModelSpec:
        if self.mtp_layers and self.position_embedding != "rope":
            raise ValueError("mtp_layers needs position_embedding = \"rope\": Megatron-Core's "
                             "multi-token prediction runs with rotary positions, not learned "
                             "ones (Megatron-LM validate_args)")
        mla_given = [k for k in ("q_lora_rank",) + MLA_KEYS if getattr(self, k) is not None]
        if mla_given:
            missing = [k for k in MLA_KEYS if getattr(self, k) is None]
            if missing:
                raise ValueError(f"multi-head latent attention ({', '.join(mla_given)} given) "
                                 f"also needs {', '.join(missing)}")
            other = [k for k in GQA_KEYS if getattr(self, k) is not None]
            if other:
                raise ValueError(f"{' and '.join(other)} "
                                 f"{'do' if len(other) > 1 else 'does'} not apply to multi-head latent "
                                 "attention (its heads are qk_head_dim + qk_pos_emb_head_dim "
                                 "wide for queries and keys, v_head_dim for values): remove "
                                 f"{'them' if len(other) > 1 else 'it'}")
        elif self.head_dim is None and self.hidden % self.heads:
            raise ValueError(f"hidden ({self.hidden}) must be divisible by heads ({self.heads}), "
                             "or give head_dim")
        if self.heads % self.kv:
            raise ValueError(f"heads ({self.heads}) must be divisible by kv_heads ({self.kv})")
        if self.linear_bias and self.qkv_bias is False:
            raise ValueError("qkv_bias = false needs linear_bias = false: linear_bias puts a "
                             "bias on the QKV projection too (Megatron-LM validate_args sets "
                             "add_qkv_bias with add_bias_linear)")
        if self.gated_mlp and self.activation != "gelu":
            raise ValueError(f"activation = \"{self.activation}\" applies to a plain MLP: a "
                             "gated_mlp is SwiGLU; remove one of them")
        if self.qk_norm and self.qk_l2_norm:
            raise ValueError("qk_norm and qk_l2_norm: one norm on the queries and keys; "
                             "Megatron-Core builds the L2 norm when both are set, keep one")
        if self.mla and self.qk_l2_norm:
            raise ValueError("qk_l2_norm does not apply to multi-head latent attention "
                             "(Megatron-Core's layer specs refuse it): remove it")
        if self.mla and self.qk_norm:
            raise ValueError("qk_norm does not apply to multi-head latent attention: its norms "
                             "are on the compressed query and key / value, always counted and "
                             "exported as Megatron-LM's --qk-layernorm; remove it")
        if self.mla and self.qkv_bias:
            raise ValueError("qkv_bias does not apply to multi-head latent attention "
                             "(Megatron-Core builds its projections without a QKV bias): "
                             "remove it")
        self._check_window()
        if self.experts == 1:
            raise ValueError("experts = 1 is a dense model: use experts = 0")
        moe_given = [k for k in MOE_KEYS if k in self.model_fields_set]
        if not self.experts and moe_given:
            raise ValueError(f"{', '.join(moe_given)} given for a dense model (experts = 0): "
                             "set experts for a mixture of experts, or remove them")
        if self.experts and self.top_k > self.experts:
            raise ValueError(f"top_k ({self.top_k}) cannot exceed experts ({self.experts})")
        if self.experts and self.first_dense_layers >= self.layers:
            raise ValueError(f"first_dense_layers ({self.first_dense_layers}) leaves no MoE layer "
                             f"of layers ({self.layers}); expected fewer dense layers than "
                             "layers")
        return self

    def _check_window(self) -> None:
        """The sliding-window keys as Megatron-Core reads them (TransformerConfig window_size,
        window_attn_skip_freq; transformer/utils.py is_layer_window_attention)."""
        w, skip = self.window_size, self.window_attn_skip_freq
        if w is None:
            if skip is not None:
                raise ValueError("window_attn_skip_freq needs window_size (the window its "
                                 "layers attend within): set window_size, or remove it")
            return
        if isinstance(w, list):
            if len(w) != 2 or w[1] != 0:
                raise ValueError(f"window_size = {w}: expected [left, 0], a causal decoder's "
                                 "window (Megatron-Core's (left, right) with right = 0), or "
                                 "the number left")
            w = w[0]
        if not (1 <= w <= MAX_SEQ or w == -1):
            raise ValueError(f"window_size = {self.window_size}: expected a whole number of "
                             f"tokens from 1 to {MAX_SEQ:,} (the keys before a query it "
                             "attends to), or -1 for no window (Megatron-Core's infinite one)")
        if isinstance(skip, int):
            if skip < 2:
                raise ValueError(f"window_attn_skip_freq = {skip}: expected N >= 2 (every "
                                 "N-th layer full attention, the others windowed); 1 would "
                                 "leave no windowed layer: remove window_size instead")
        elif isinstance(skip, list):
            if len(skip) != self.layers or any(x not in (0, 1) for x in skip):
                raise ValueError(f"window_attn_skip_freq: a list needs one 0 or 1 per layer "
                                 f"(layers = {self.layers}; 1 = windowed), got {len(skip)} "
                                 "entries" + ("" if all(x in (0, 1) for x in skip)
                                              else " with values other than 0 and 1"))
            if not any(skip):
                raise ValueError("window_attn_skip_freq: the list marks no layer windowed "
                                 "(1): remove window_size and the list instead")

    @property
    def window_left(self) -> int | None:
        """The keys before a query that a windowed layer attends to (``window_size``'s left
        side), or None for full causal attention: no window, Megatron-Core's infinite one
        (-1), or one that covers the sequence (``seq_len - 1`` keys or more), which attends
        as full causal attention does and is built as that (no window in the exports, no
        window rule)."""
        w = self.window_size
        w = w[0] if isinstance(w, list) else w
        return None if w is None or w == -1 or w >= self.seq_len - 1 else w

    @property
    def windowed_layers(self) -> tuple[bool, ...]:
        """Which decoder layers attend within the window, as Megatron-Core decides it
        (transformer/utils.py is_layer_window_attention: layer numbers count from 1; an
        integer N leaves every N-th layer full attention)."""
        skip = self.window_attn_skip_freq
        if self.window_left is None:
            return (False,) * self.layers
        if skip is None:
            return (True,) * self.layers
        if isinstance(skip, int):
            return tuple(n % skip != 0 for n in range(1, self.layers + 1))
        return tuple(bool(x) for x in skip)

    @property
    def windowed(self) -> bool:
        """Some layer attends within a sliding window."""
        return any(self.windowed_layers)

    @property
    def windowed_extent(self) -> str:
        """Which layers attend within the window, in words (the plan report's model line and
        the exports' comments): "every layer" or "18 of the 36 layers"."""
        n = sum(self.windowed_layers)
        return "every layer" if n == self.layers else f"{n} of the {self.layers} layers"

    @property
    def moe(self) -> bool:
        return self.experts > 1

    @property
    def last_layer_moe(self) -> bool:
        """The last decoder layer is an MoE layer (the kind of a multi-token prediction
        layer, as Megatron-LM's ``last_layer_is_moe``)."""
        return self.moe and (self.layers - 1 - self.first_dense_layers) % \
            self.moe_layer_interval == 0

    @property
    def moe_layers(self) -> int:
        """Number of MoE layers: every ``moe_layer_interval``-th after the dense ones."""
        if not self.moe:
            return 0
        return len(range(self.first_dense_layers, self.layers, self.moe_layer_interval))

    @property
    def kv(self) -> int:
        return self.kv_heads or self.heads

    @property
    def mla(self) -> bool:
        """Multi-head latent attention (``kv_lora_rank`` given)."""
        return self.kv_lora_rank is not None

    @property
    def has_qkv_bias(self) -> bool:
        """The QKV projection carries a bias: ``qkv_bias``, by default ``linear_bias``; never
        under multi-head latent attention (Megatron-Core builds its projections without one)."""
        return not self.mla and (self.linear_bias if self.qkv_bias is None else self.qkv_bias)

    @property
    def ffn(self) -> int:
        return self.ffn_hidden or 4 * self.hidden

    @property
    def moe_ffn(self) -> int:
        """The MLP width of one expert (and of each shared expert): ``moe_ffn_hidden``, by
        default :attr:`ffn`."""
        return self.moe_ffn_hidden or self.ffn


def _pair_or_number(v, what: str, instead: str):
    """A number or ``[lo, hi]``: a list of another length gets a message saying both forms
    (pydantic's own says only "should be a valid integer")."""
    if isinstance(v, (list, tuple)) and len(v) != 2:
        raise ValueError(f"expected {what} (a number) or a range [lo, hi] (two numbers), got a "
                         f"list of {len(v)}: [{', '.join(str(x) for x in v)}]{instead}")
    return v


#: Megatron-Core's recompute_modules the model costs, in TransformerConfig's order (the
#: order the exports write them in); "moe" and "shared_experts" (an MoE layer's modules
#: re-run whole) are not modelled
RecomputeModule = Literal["core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp"]
MODELLED_MODULES = get_args(RecomputeModule)
UNMODELLED_MODULES = ("moe", "shared_experts")
#: the single-word values of [training] selective_recompute
SelectiveName = Literal["core_attention", "op", "mla_up_proj"]
SELECTIVE_NAMES = get_args(SelectiveName)


def recompute_module_set(selective: str | list[str] | None) -> frozenset[str]:
    """``[training] selective_recompute`` as the set of what re-runs: Megatron-Core's module
    names (``core_attention`` is its ``core_attn``), or ``{"op"}`` for torchtitan's policy;
    empty for None (the framework's, :func:`planner.model.terms.selective_recompute`)."""
    if selective is None:
        return frozenset()
    if isinstance(selective, str):
        return frozenset({"core_attn" if selective == "core_attention" else selective})
    return frozenset(selective)


class TrainingSpec(_Strict):
    """The job: batch, token budget, precision, and software behaviour the model needs to know."""

    global_batch: upto(MAX_BATCH) | tuple[upto(MAX_BATCH), upto(MAX_BATCH)] = Field(
        description="sequences per step, or [lo, hi] to let the planner choose")
    # (bounded like every other number: 1e300 tokens gave a cost of Infinity, which is not
    # JSON; 1e18 is 10^5 times the largest published run, DeepSeek-V3's 14.8T)
    tokens: Annotated[float, Field(gt=0, le=1e18)] | None = Field(
        default=None, description="token budget for days and cost")
    precision: Precision = "bf16"
    flash_attention: bool = Field(
        default=True, description="fused attention: no s^2 score tensors in HBM")
    bubble_ratio: Annotated[float, Field(ge=0, le=1)] = Field(
        default=1.0, description="AMPeD's R: non-overlapped share of the pipeline bubble")
    async_tensor_model_parallel_allreduce: bool = Field(
        default=True, description="the backward tensor-parallel collective of each "
        "column-parallel linear (input-gradient all-reduce, or reduce-scatter with sequence "
        "parallelism) runs beside that linear's weight-gradient GEMM (Megatron-LM "
        "--async-tensor-model-parallel-allreduce, on since Sep 2021; always in Megatron-Core)")
    grad_reduce_dtype: Literal["fp32", "bf16"] | None = Field(
        default=None, description="dtype of the data-parallel gradient reduction and of the "
        "gradient buffer (bf16: the 16-bit training dtype); default the framework's "
        "(planner/model/frameworks.py: fp32 for Megatron-LM bf16, NeMo, torchtitan)")
    grad_reduce_every_microbatch: bool | None = Field(
        default=None, description="sharded gradients are reduce-scattered after every "
        "micro-batch (true: Megatron-FSDP under Megatron-LM and NeMo, DeepSpeed, torchtitan "
        "without pipeline parallelism) or once per step, accumulating unsharded in between "
        "(false: torchtitan's pipelined stages); default the framework's, by the pipeline "
        "degree")
    selective_recompute: (SelectiveName
                          | Annotated[list[RecomputeModule], Field(min_length=1)]
                          | None) = Field(
        default=None, description="what recompute = \"selective\" recomputes: core_attention "
        "(Megatron-Core's recompute module core_attn: the attention core re-runs, the rest is "
        "kept), op (torchtitan's op-level selective checkpointing: the outputs of every "
        "second matmul and of the attention kernel are kept, the other matmuls and the "
        "element-wise ops re-run) or mla_up_proj (Megatron-Core's recompute module of that "
        "name, for multi-head latent attention: the up-projections and RoPE re-run before the "
        "attention's backward, so its queries, keys and values are not kept); or a list of "
        "Megatron-Core's recompute_modules: core_attn, mla_up_proj, layernorm (the norms kept "
        "apart from a linear layer, an MoE layer's pre-MLP norm and MLA's input norm, re-run "
        "in the backward instead of keeping their outputs), moe_act (the routed experts' "
        "activation, re-run instead of keeping fc2's input), mlp (a dense layer's MLP re-run "
        "from its input, its collectives included); default the framework's (torchtitan: "
        "op)")
    kernel_stack: Literal["fused", "pytorch"] | None = Field(
        default=None, description="the kernels the GEMMs and the attention core run on, "
        "with their own calibrated figures per GPU type (hardware_catalog/*.toml "
        "[kernel_stacks.*]): fused = Megatron-Core / NeMo with Transformer Engine (the "
        "catalog's main figures); pytorch = PyTorch eager modules (torch.nn.Linear on cuBLAS, a "
        "Triton or SDPA flash-attention kernel), as llm-foundry's MPT benchmarks and torchtitan "
        "without torch.compile run; a GPU type without figures for the stack uses the fused ones. "
        "Default the framework's: pytorch under torchtitan (its compile.enable defaults to "
        "false), fused elsewhere and for NVFP4 / MXFP8 (costed on Transformer Engine's kernels "
        "only). Whose FP8 linears run is fp8_library, not the stack")
    moe_token_dispatcher: Literal["alltoall", "deepep", "hybridep"] = Field(
        default="alltoall", description="MoE token dispatch: alltoall (Megatron-Core's "
        "all-to-all dispatcher: one message per token copy) or a deduplicating flex dispatcher, "
        "deepep / hybridep (--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend: "
        "a token crosses to each remote node its experts sit on once, then fans out over "
        "NVLink); both flex backends are costed alike")
    cp_comm_type: Literal["p2p", "a2a", "all_gather"] = Field(
        default="p2p", description="how context parallelism exchanges the attention's inputs "
        "(Megatron-Core cp_comm_type, Megatron-LM --cp-comm-type): p2p, the ring of key / "
        "value blocks hidden behind the attention core (the default); a2a, Ulysses-style "
        "all-to-alls of the queries, keys, values and output over the context-parallel "
        "ranks, exposed, which needs the heads per tensor rank divisible by cp; all_gather, "
        "the keys and values all-gathered before the core and their gradients "
        "reduce-scattered after it, exposed (Llama 3's scheme); Transformer Engine runs a "
        "sliding window with a2a and all_gather, where p2p refuses it")
    expandable_segments: bool = Field(
        default=False, description="the process runs PyTorch's caching allocator with "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: the default memory_reserve_GiB keeps "
        "no fragmentation share (2 GiB instead of 2 GiB + 5% of the capacity; "
        "planner/model/schema.py default_reserve_GiB)")
    fused_cross_entropy: bool = Field(
        default=False, description="the loss is a fused cross-entropy kernel that writes the "
        "logits' gradient in place in their 16-bit dtype (flash-attn's xentropy, llm-foundry's "
        "MPT default loss_fn = fused_crossentropy): 2 bytes per logit at the memory peak "
        "instead of the 16-bit logits plus their fp32 softmax copy (6 bytes)")
    compiled_loss: bool | None = Field(
        default=None, description="torchtitan: the loss runs under torch.compile (its "
        "[compile] components with \"loss\"), which keeps the 16-bit logits and writes their "
        "16-bit gradient: 4 bytes per logit at its peak instead of the eager loss's 12 "
        "(measured on CPU: tools/loss_memory.py --compiled); under tensor parallelism counted "
        "as the eager loss_parallel, 16. Default: on where torchtitan compiles the plan's "
        "layers on the fused kernel stack (kernel_stack = \"fused\", not MXFP8), as its "
        "export writes; off elsewhere (the eager loss, the safe side). torchtitan only")
    optimizer_dtype: Literal["fp32", "bf16"] = Field(
        default="fp32", description="dtype of the optimizer's states: fp32 (fp32 master "
        "weights and Adam moments, Megatron-LM / Megatron-Core and torchtitan) or bf16 (two "
        "bf16 Adam moments and no master copy: NeMo's distributed_fused_adam with optim.dtype "
        "= bf16, whose Apex DistributedFusedAdam keeps its states in that dtype and, the "
        "optimizer dtype being the weights', stores no parameter copy; with "
        "store_param_remainders, Megatron-Core's precision-aware optimizer with bf16 moments "
        "and the fp32 master kept as remainders)")
    main_params_dtype: Literal["fp32"] | None = Field(
        default=None, description="with optimizer_dtype = \"bf16\": keep an fp32 master "
        "weight beside the two bf16 Adam moments, 8 bytes of states per parameter "
        "(Megatron-Core's precision-aware optimizer: --use-precision-aware-optimizer "
        "--main-params-dtype fp32 --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16, as "
        "Megatron-Bridge's and NeMo's DeepSeek-V3 recipes set it; under FP8 and MXFP8 too, "
        "where store_param_remainders is refused); unset, bf16 states keep no master copy "
        "(NeMo 1's distributed_fused_adam) or, with store_param_remainders, its remainders. "
        "Needs dp_sharding = \"optim\" under Megatron-LM or NeMo")
    fp8_param_gather: bool = Field(
        default=False, description="FP8 parameters: the layers' GEMM weights are kept in FP8 "
        "(no 16-bit copy beside Transformer Engine's FP8 one) and the distributed optimizer "
        "all-gathers them in FP8, 1 byte per parameter (Megatron-LM --fp8-param-gather; NeMo "
        "MegatronMixedPrecision fp8_param_gather, fp8_params in NeMo 25.02, on in its FP8 "
        "recipes); needs precision = \"fp8\" and the distributed optimizer")
    fp4_param_gather: bool = Field(
        default=False, description="FP4 parameters: the layers' GEMM weights are kept in NVFP4 "
        "alone (no bf16 copy) and the distributed optimizer quantizes its fp32 shard into them "
        "and all-gathers their packed FP4 values, half a byte each (Megatron-LM "
        "--fp4-param-gather; Megatron-Bridge's NVFP4 "
        "recipes from 26.04.01); needs precision = \"nvfp4\" and dp_sharding = \"optim\"")
    fp8_recipe: Literal["tensorwise", "delayed", "mxfp8"] | None = Field(
        default=None, description="how FP8 tensors are scaled (Megatron-Core --fp8-recipe): "
        "tensorwise / delayed = one scale per tensor (current or delayed scaling, costed "
        "alike but for the attention projection, which keeps its 16-bit input under every "
        "recipe but delayed, docs/model.md \"FP8\", item 3; None: Megatron-Core's default, "
        "delayed: the exports write no recipe); "
        "mxfp8 = Transformer Engine's MXFP8BlockScaling, one "
        "E8M0 scale per 32 elements, Blackwell only: every FP8 tensor is held twice (rowwise "
        "and columnwise, each quantized from 16 bits) and FP8 parameters are all-gathered in "
        "16 bits through the gradient buffer (docs/model.md, \"FP8\", item 5); needs "
        "precision = \"fp8\"")
    fp8_library: Literal["transformer_engine", "torchao"] | None = Field(
        default=None, description="whose FP8 linear layers run: transformer_engine (Megatron-LM, "
        "NeMo, llm-foundry's amp_fp8) or torchao (torchtitan's float8 converter); default the "
        "framework's: torchao under constraints.framework = \"torchtitan\", else "
        "transformer_engine. They differ in the inputs they hold, the FP8 weight copies and, "
        "under delayed scaling, the tensor-parallel all-gathers (docs/model.md, \"FP8\"); "
        "MXFP8 and NVFP4 are costed as Transformer Engine's")
    store_param_remainders: bool = Field(
        default=False, description="the distributed optimizer keeps each fp32 master weight "
        "as the bf16 weight plus its lower 16 bits, 2 bytes instead of 4 (10 bytes of Adam "
        "states per parameter instead of 12): Megatron-Core's precision-aware optimizer "
        "(--use-precision-aware-optimizer, store_param_remainders on by default from "
        "Transformer Engine 2.1; Megatron-Bridge's BF16 performance recipes) and NeMo 1's "
        "distributed_fused_adam on bf16 weights with fp32 states (Apex DistributedFusedAdam "
        "store_param_remainders); with optimizer_dtype = \"bf16\", Megatron-Core's "
        "precision-aware optimizer with bf16 moments (--exp-avg-dtype / --exp-avg-sq-dtype "
        "bf16, Megatron-Bridge's DeepSeek-V3 recipes): 6 bytes; needs bf16 weights (precision "
        "bf16, or fp8 without fp8_param_gather) and dp_sharding = \"optim\"")

    @property
    def precision_label(self) -> str:
        """The precision as reports and export headers name it: ``fp8 (mxfp8)`` for MXFP8,
        ``nvfp4 (FP4 parameters)`` with them, else ``precision``."""
        if self.fp8_recipe == "mxfp8":
            return "fp8 (mxfp8)"
        if self.fp4_param_gather:
            return "nvfp4 (FP4 parameters)"
        return self.precision

    @model_validator(mode="before")
    @classmethod
    def _replaced_keys(cls, data):
        """The overlap fractions of earlier versions are the framework's overlap switches now."""
        if isinstance(data, dict):
            for key, new in REPLACED_OVERLAP_KEYS.items():
                if key in data:
                    raise ValueError(f"{key} was replaced by the overlap switches {new} in "
                                     "[plan] (evaluate) or [constraints] (solve); see "
                                     "docs/model.md, \"Overlap\"")
        return data

    @field_validator("selective_recompute", mode="before")
    @classmethod
    def _recompute_modules(cls, v):
        """Says what a value is not, in the user's words: a module name written bare, a
        Megatron-Core module the model does not cost, a name of nothing."""
        from planner.model.words import toml_value

        listed = ("a list of Megatron-Core's recompute_modules from "
                  + ", ".join(f'"{m}"' for m in MODELLED_MODULES))
        if isinstance(v, str) and v not in SELECTIVE_NAMES:
            hint = (f"; as a module, write it in a list: [{toml_value(v)}]"
                    if v in MODELLED_MODULES else "")
            raise ValueError(f"expected \"core_attention\", \"op\" or \"mla_up_proj\", or "
                             f"{listed} (got {toml_value(v)}){hint}")
        if isinstance(v, list):
            if not v:
                raise ValueError(f"expected {listed}, at least one (got [])")
            for m in v:
                if m in UNMODELLED_MODULES:
                    raise ValueError(f"{toml_value(m)} is a Megatron-Core recompute module the "
                                     "model does not cost (moe and shared_experts re-run an "
                                     "MoE layer's modules whole, the all-to-alls included); "
                                     "modelled: " + ", ".join(MODELLED_MODULES))
                if m not in MODELLED_MODULES:
                    raise ValueError(f"expected {listed} (got {toml_value(m)} in "
                                     f"{toml_value(v)})")
        return v

    @field_validator("global_batch", mode="before")
    @classmethod
    def _range_shape(cls, v):
        return _pair_or_number(v, "sequences per step", "")

    @field_validator("global_batch")
    @classmethod
    def _range(cls, v):
        if isinstance(v, tuple) and v[0] > v[1]:
            raise ValueError(f"[lo, hi] needs lo <= hi, got [{v[0]}, {v[1]}]")
        return v

    @model_validator(mode="after")
    def _optimizer_dtype(self) -> TrainingSpec:
        if self.main_params_dtype is not None and self.optimizer_dtype != "bf16":
            raise ValueError("main_params_dtype = \"fp32\" keeps an fp32 master beside bf16 "
                             "Adam moments, and optimizer_dtype = \"fp32\" keeps one already "
                             "(with fp32 moments): set optimizer_dtype = \"bf16\", or remove "
                             "main_params_dtype")
        if self.main_params_dtype is not None and self.store_param_remainders:
            raise ValueError("main_params_dtype = \"fp32\" keeps the whole fp32 master, "
                             "store_param_remainders = true only its lower 16 bits: keep one")
        if self.optimizer_dtype == "bf16" and self.precision == "fp16":
            kept = ("keeps bf16 moments" if self.main_params_dtype else "keeps no master copy")
            raise ValueError(f"optimizer_dtype = \"bf16\" {kept}: the weights must be bf16 "
                             "(precision bf16 or fp8), not fp16")
        if self.fp8_param_gather and self.precision != "fp8":
            raise ValueError(f"fp8_param_gather = true keeps the weights in FP8, which needs "
                             f"precision = \"fp8\" (precision = \"{self.precision}\")")
        if self.fp4_param_gather and self.precision != "nvfp4":
            raise ValueError(f"fp4_param_gather = true keeps the weights in NVFP4, which needs "
                             f"precision = \"nvfp4\" (precision = \"{self.precision}\")")
        if self.fp8_recipe is not None and self.precision != "fp8":
            raise ValueError(f"fp8_recipe = \"{self.fp8_recipe}\" scales FP8 tensors, which "
                             f"needs precision = \"fp8\" (precision = \"{self.precision}\")")
        if self.precision == "nvfp4" and self.kernel_stack == "pytorch":
            raise ValueError("precision = \"nvfp4\" is Transformer Engine's NVFP4BlockScaling "
                             "(kernel_stack = \"fused\"); kernel_stack = \"pytorch\" has no "
                             "NVFP4 costs in this model")
        if self.fp8_library is not None and self.precision not in ("fp8", "nvfp4"):
            raise ValueError(f"fp8_library = \"{self.fp8_library}\" names whose FP8 linears "
                             f"run, which needs precision = \"fp8\" or \"nvfp4\" (precision = "
                             f"\"{self.precision}\")")
        if self.fp8_library == "torchao" and (self.precision == "nvfp4"
                                              or self.fp8_recipe == "mxfp8"):
            what = "precision = \"nvfp4\"" if self.precision == "nvfp4" else \
                "fp8_recipe = \"mxfp8\""
            raise ValueError(f"fp8_library = \"torchao\" with {what}: this model costs "
                             "Transformer Engine's block-scaled formats only; drop fp8_library "
                             "or set it to \"transformer_engine\"")
        if self.fp8_recipe == "mxfp8" and self.kernel_stack == "pytorch":
            raise ValueError("fp8_recipe = \"mxfp8\" is Transformer Engine's MXFP8 block "
                             "scaling (kernel_stack = \"fused\"); kernel_stack = \"pytorch\" "
                             "has no MXFP8 costs in this model")
        if self.store_param_remainders:
            # the remainder is the lower half of an fp32 master whose upper half is the bf16
            # weight: no bf16 weight (fp16, FP8 parameters), or no fp32 master (bf16 states),
            # no remainder
            if self.precision == "fp16":
                raise ValueError("store_param_remainders = true stores the fp32 master weight "
                                 "as the bf16 weight plus 16 bits: the weights must be bf16 "
                                 "(precision bf16 or fp8), not fp16")
            if self.fp8_param_gather or self.fp4_param_gather:
                key = "fp8_param_gather" if self.fp8_param_gather else "fp4_param_gather"
                raise ValueError(f"store_param_remainders = true needs bf16 weights, but {key} "
                                 f"= true keeps them in {key[:3].upper()}")
            if not te_holds_master(self):
                raise ValueError(
                    f"store_param_remainders = true with fp8_recipe = \"{self.fp8_recipe}\": "
                    "Megatron-Core's precision-aware optimizer keeps a whole fp32 master "
                    "under current and MXFP8 scaling (OptimizerConfig "
                    "use_precision_aware_optimizer_no_fp8_or_ds_fp8); drop one of them")
        return self


class ClusterSpec(_Strict):
    """The machines: a catalog GPU, how many, and optional overrides of catalog figures."""

    #: the size keys, of which a cluster takes exactly one
    SIZE_KEYS: ClassVar[tuple[str, ...]] = ("nodes", "node_counts", "gpus")

    gpu: str
    nodes: upto(MAX_NODES) | tuple[upto(MAX_NODES), upto(MAX_NODES)] | None = Field(
        default=None, description="node count, or [lo, hi] for pareto / capacity")
    node_counts: Annotated[list[upto(MAX_NODES)], Field(min_length=1)] | None = Field(
        default=None, description="explicit list of node counts for pareto / capacity")
    gpus: upto(MAX_GPUS) | None = Field(default=None, description="GPU count instead of nodes")

    @field_validator("nodes", mode="before")
    @classmethod
    def _nodes_shape(cls, v):
        return _pair_or_number(v, "a node count", "; for a list of sizes give node_counts = "
                               "[...]")
    gpus_per_node: upto(MAX_GPUS) | None = Field(
        default=None, description="GPUs per node where a host is one NVLink domain (DGX-style): "
        "sets both gpus_per_host and nvlink_domain; default from the catalog")
    gpus_per_host: upto(MAX_GPUS) | None = Field(
        default=None, description="GPUs per host, the scheduling node that `nodes` counts")
    nvlink_domain: upto(MAX_GPUS) | None = Field(
        default=None, description="GPUs joined by NVLink (72 on GB200 NVL72)")
    # (a cap far above any price, so that costs stay printable numbers)
    price_per_gpu_hour: Annotated[float, Field(gt=0, le=1e6)] | None = None
    intra_node_bandwidth_GBps: Bandwidth | None = None
    inter_node_bandwidth_GBps: Bandwidth | None = None
    efficiency: Efficiency | None = None
    efficiency_fp8: Efficiency | None = None
    gemm_knee_tokens: Annotated[float, Field(ge=0, le=1e6)] | None = Field(
        default=None, description="override of the catalog's GEMM size knee in tokens")
    gemm_knee_width: Annotated[float, Field(ge=0, le=1e6)] | None = Field(
        default=None, description="override of the catalog's GEMM size knee in weight width")
    attention_efficiency: Efficiency | None = Field(
        default=None, description="override of the catalog's share of the 16-bit peak the "
        "fused (flash) attention core reaches")
    overlap_slowdown: Annotated[float, Field(ge=0, le=1)] | None = Field(
        default=None, description="override of the catalog's share by which compute runs "
        "slower while a collective runs beside it (0.189: 18.9% longer; 0: overlap is free)")
    host_link_bandwidth_GBps: Bandwidth | None = Field(
        default=None, description="override of the catalog's GPU <-> host link (PCIe or "
        "NVLink-C2C) per GPU and per direction, which host offload moves its bytes on")
    host_memory_GiB: Annotated[float, Field(gt=0, le=1e7)] | None = Field(
        default=None, description="override of the catalog's host (CPU) memory per host: the "
        "offloaded bytes of its GPUs must fit in it, less constraints.host_memory_reserve_GiB")
    host_memory_bandwidth_GBps: Bandwidth | None = Field(
        default=None, description="override of the catalog's host memory bandwidth per host, "
        "which bounds the optimizer step offloaded to the CPU")

    @model_validator(mode="after")
    def _size(self) -> ClusterSpec:
        given = [k for k in self.SIZE_KEYS if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of nodes, node_counts or gpus"
                             + (f" (got {', '.join(given)})" if given else ""))
        if self.gpus_per_node is not None and (self.gpus_per_host or self.nvlink_domain):
            raise ValueError("give gpus_per_node (a host that is one NVLink domain) or "
                             "gpus_per_host / nvlink_domain, not both")
        if isinstance(self.nodes, tuple) and self.nodes[0] > self.nodes[1]:
            raise ValueError(f"nodes = [lo, hi] needs lo <= hi, got {list(self.nodes)}")
        return self


#: The default per-GPU reserve, what a training process holds beyond the model's tensors:
#: - 1 GiB for the CUDA context and the cuBLAS / cuDNN workspaces of the process (PyTorch docs,
#:   "CUDA semantics", memory management: the context and library workspaces are not in
#:   ``torch.cuda.memory_allocated()``; a bare PyTorch CUDA context on A100/H100 is 0.5-1 GiB);
#: - 1 GiB for NCCL: each communicator (tensor, pipeline, data, context, expert and embedding
#:   groups) allocates ``NCCL_BUFFSIZE`` (4 MiB by default, NCCL environment-variable docs) per
#:   channel and protocol for each peer it connects to, plus NVLink SHARP buffers on Hopper;
#: - 5% of the capacity for the caching allocator's fragmentation (reserved but not allocated
#:   blocks; PyTorch "CUDA semantics": ``memory_reserved`` exceeds ``memory_allocated``, the
#:   reason for ``expandable_segments``), unless the process runs with
#:   ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` (``[training] expandable_segments``):
#:   then the allocator maps physical pages into one growing virtual segment per pool and
#:   stream, so free blocks merge across what would have been separate ``cudaMalloc``
#:   segments (PyTorch devlog "When does fragmentation occur in the CUDA caching allocator?",
#:   E. Yang, 2026-06-01), and NVIDIA's performance recipes switch it on where a plan would
#:   otherwise run out of memory on fragmentation (Megatron-Bridge scripts/performance/
#:   perf_plugins.py: Llama 3.1 405B at FP8 on GB200 / GB300). What it leaves, free blocks
#:   pinned between live ones and the rounding to its 20 MiB pages, is not reserved.
RESERVE_FIXED_GiB, RESERVE_FRAGMENTATION, RESERVE_FRAGMENTATION_EXPANDABLE = 2.0, 0.05, 0.0


def default_reserve_GiB(capacity_GiB: float, expandable_segments: bool = False,
                        framework: str | None = None) -> float:
    """The default ``constraints.memory_reserve_GiB`` for a GPU of ``capacity_GiB``:
    ``2 GiB + 5%`` of the capacity (6 GiB on an 80 GiB GPU), ``2 GiB`` under expandable
    segments; see :data:`RESERVE_FIXED_GiB`. Under a framework whose measured peaks ran above
    the model's by a known ratio (``Framework.measured_peak_ratio``: DeepSpeed), at least what
    keeps the model's peak times that ratio within the capacity (14.3 GiB on 80 GiB)."""
    share = RESERVE_FRAGMENTATION_EXPANDABLE if expandable_segments else RESERVE_FRAGMENTATION
    reserve = RESERVE_FIXED_GiB + share * capacity_GiB
    ratio = FRAMEWORKS[framework].measured_peak_ratio if framework in FRAMEWORKS else None
    if ratio:
        reserve = max(reserve, capacity_GiB * (1 - 1 / ratio))
    return round(reserve, 2)


class ConstraintSpec(_Strict):
    """What-if constraints: pins and caps on every knob, honoured by every backend."""

    tp: upto(MAX_GPUS) | None = None
    pp: upto(MAX_GPUS) | None = None
    dp: upto(MAX_GPUS) | None = None
    cp: upto(MAX_GPUS) | None = None
    vp: upto(MAX_GPUS) | None = None
    micro_batch: upto(MAX_BATCH) | None = None
    max_tp: upto(MAX_GPUS) | None = None
    max_pp: upto(MAX_GPUS) | None = None
    max_dp: upto(MAX_GPUS) | None = None
    max_cp: upto(MAX_GPUS) | None = Field(default=1, description="context parallelism is off unless raised")
    ep: upto(MAX_GPUS) | None = None
    max_ep: upto(MAX_GPUS) | None = None
    max_vp: upto(MAX_GPUS) | None = None
    min_micro_batch: upto(MAX_BATCH) = 1
    max_micro_batch: upto(MAX_BATCH) = Field(default=32, description="cap on the micro-batch size")
    recompute: Recompute | list[Recompute] | None = Field(
        default=None, description="allowed recompute mode(s); default all")
    sequence_parallel: bool | None = Field(default=None, description="pin on/off; default free")
    distributed_optimizer: bool | None = Field(
        default=None, description="pin on/off (true: dp_sharding = optim, false: none); "
        "default free")
    dp_sharding: Sharding | list[Sharding] | None = Field(
        default=None, description="allowed data-parallel sharding mode(s); default all")
    dp_shard_size: upto(MAX_GPUS) | None = Field(
        default=None, description="pin the HSDP shard group size (a divisor of dp)")
    reshard_after_forward: bool | None = Field(
        default=None, description="pin FSDP2's reshard policy; default free")
    tp_within_node: bool = Field(
        default=True, description="keep tensor parallelism inside a node (NVLink); false lets "
        "it cross nodes")
    pp_within_node: bool = False
    cp_within_node: bool = False
    min_mfu: Annotated[float, Field(gt=0, lt=1)] | None = Field(
        default=None, description="only plans reaching this MFU (a cap on the step time)")
    memory_reserve_GiB: Annotated[float, Field(ge=0)] | None = Field(
        default=None, description="per-GPU memory kept free (CUDA context, NCCL buffers, "
        "allocator fragmentation); default: default_reserve_GiB(capacity, "
        "[training] expandable_segments, framework)")
    overlap_grad_reduce: bool | None = Field(
        default=None, description="pin; " + OVERLAP_DESCRIPTIONS["overlap_grad_reduce"]
        + "; default: the framework's")
    overlap_param_gather: bool | None = Field(
        default=None, description="pin; " + OVERLAP_DESCRIPTIONS["overlap_param_gather"]
        + "; default: the framework's")
    tp_comm_overlap: bool | None = Field(
        default=None, description="pin; " + OVERLAP_DESCRIPTIONS["tp_comm_overlap"]
        + "; default: the framework's")
    overlap_p2p_comm: bool | None = Field(
        default=None, description="pin; " + OVERLAP_DESCRIPTIONS["overlap_p2p_comm"]
        + "; default: the framework's")
    overlap_moe_expert_parallel_comm: bool | None = Field(
        default=None, description="pin; " + OVERLAP_DESCRIPTIONS["overlap_moe_expert_parallel_comm"]
        + "; default: the framework's")
    framework: FrameworkName | None = Field(
        default=None, description="only plans this framework runs, with its defaults "
        "(planner/model/frameworks.py); default: any framework, Megatron-LM's defaults")
    max_stage_shortfall: Annotated[int, Field(ge=0, le=MAX_STAGE_SHORTFALL)] = Field(
        default=1, description="uneven pipeline layouts the search considers: the first / "
        "last stage holds up to this many decoder layers fewer than a middle one (0: even "
        "layouts only); unset: 1, or more where the layer count needs it: the least (up to 4) "
        "at which every pipeline degree the GPU count allows has one as deep within a factor "
        "of two that the search reaches (planner/model/plan.py stage_shortfall)")
    first_stage_layers: upto(MAX_LAYERS) | None = Field(
        default=None, description="pin the decoder layers of the first pipeline stage")
    last_stage_layers: upto(MAX_LAYERS) | None = Field(
        default=None, description="pin the decoder layers of the last pipeline stage")
    account_for_embedding: bool | None = Field(
        default=None, description="pin Megatron-LM's account-for-embedding layout on / off; "
        "default free")
    account_for_loss: bool | None = Field(
        default=None, description="pin Megatron-LM's account-for-loss layout on / off; "
        "default free")
    optimizer_offload: bool | None = Field(
        default=None, description="pin optimizer offload on / off (the optimizer states in "
        "host memory, the Adam step on the CPU: Megatron-Core --optimizer-cpu-offload, "
        "DeepSpeed offload_optimizer); default free where the framework runs it")
    offload_layers: Annotated[int, Field(ge=0, le=MAX_LAYERS)] | None = Field(
        default=None, description="pin the decoder layers whose activations are offloaded to "
        "host memory (Megatron-Core --cpu-offloading-num-layers; 0: none); default: 0 unless "
        "max_offload_layers is given")
    max_offload_layers: Annotated[int, Field(ge=0, le=MAX_LAYERS)] | None = Field(
        default=None, description="cap on offload_layers: the search picks the layer count from "
        "0, L/2, L - 1 and the cap, below it (docs/encoding.md, \"Host offload\"); default: "
        "activation offload is not searched")
    recompute_layers: Annotated[int, Field(ge=0, le=MAX_LAYERS)] | None = Field(
        default=None, description="pin the layers of each virtual stage recomputed under "
        "recompute = \"full\" (Megatron-LM --recompute-method block --recompute-num-layers; "
        "0: every layer, plain full recompute or none / selective); default: searched")
    max_recompute_layers: Annotated[int, Field(ge=0, le=MAX_LAYERS)] | None = Field(
        default=None, description="cap on recompute_layers: with it the search also "
        "recomputes 1/4, 1/2 or 3/4 of each virtual stage's layers under recompute = \"full\", "
        "wherever that is a whole count from 1 to the cap (docs/encoding.md, \"Partial "
        "recompute\"); absent: no cap; 0: partial recompute is not searched")
    host_memory_reserve_GiB: Annotated[float, Field(ge=0)] | None = Field(
        default=None, description="host memory per host kept free of offloaded bytes; default "
        "a third of it (DeepSpeed's offload memory estimator's 1.5x buffer factor)")

    @model_validator(mode="before")
    @classmethod
    def _pins_raise_default_caps(cls, data):
        """A pin above a *default* cap (``cp = 2`` with the default ``max_cp = 1``,
        ``micro_batch = 64`` with the default ``max_micro_batch = 32``) asks for that value: the
        default cap follows the pin. An explicit cap is checked against the pin below."""
        if isinstance(data, dict):
            for pin, cap in (("cp", "max_cp"), ("micro_batch", "max_micro_batch")):
                if isinstance(data.get(pin), int) and cap not in data:
                    # (raised, never lowered: micro_batch = 7 keeps the default cap of 32)
                    default = cls.model_fields[cap].default
                    data = {**data, cap: max(data[pin], default) if isinstance(default, int)
                            else data[pin]}
        return data

    @field_validator("recompute", "dp_sharding", mode="before")
    @classmethod
    def _some_mode(cls, v):
        """An empty list of modes allows no plan: a slip in the file, refused as one (exit 2)
        rather than explained as an empty search space (exit 3)."""
        if isinstance(v, list) and not v:
            raise ValueError("an empty list allows no mode: list at least one, or leave the key "
                             "out to allow all")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> ConstraintSpec:
        refused = overlap_refusal(self.framework, self)
        if refused:
            raise ValueError(refused)
        if self.tp_comm_overlap and self.sequence_parallel is False:
            raise ValueError("tp_comm_overlap = true needs sequence parallelism (Megatron-LM: "
                             "tensor-parallel communication overlap runs only with it), but "
                             "sequence_parallel = false")
        if self.overlap_param_gather and (self.dp_sharding in ("none", ["none"])
                                          or self.distributed_optimizer is False):
            raise ValueError("overlap_param_gather = true needs a sharded data-parallel mode "
                             "(Megatron-LM: --overlap-param-gather needs the distributed "
                             "optimizer), but " + ("distributed_optimizer = false"
                                                   if self.distributed_optimizer is False else
                                                   "dp_sharding = \"none\""))
        for pin, cap in PIN_CAPS.items():
            v, c = getattr(self, pin), getattr(self, cap)
            if v is not None and c is not None and v > c:
                raise ValueError(f"{pin} = {v} exceeds {cap} = {c}: raise the cap or change the pin")
        if self.micro_batch is not None and self.micro_batch < self.min_micro_batch:
            raise ValueError(f"micro_batch = {self.micro_batch} is below min_micro_batch = "
                             f"{self.min_micro_batch}")
        if self.min_micro_batch > self.max_micro_batch:
            raise ValueError(f"min_micro_batch = {self.min_micro_batch} exceeds max_micro_batch = "
                             f"{self.max_micro_batch}")
        if self.distributed_optimizer is not None and self.dp_sharding is not None:
            raise ValueError("give distributed_optimizer or dp_sharding, not both "
                             "(distributed_optimizer = true is dp_sharding = \"optim\")")
        if (self.offload_layers is not None and self.max_offload_layers is not None
                and self.offload_layers > self.max_offload_layers):
            raise ValueError(f"offload_layers = {self.offload_layers} exceeds "
                             f"max_offload_layers = {self.max_offload_layers}: raise the cap "
                             "or change the pin")
        if (self.recompute_layers is not None and self.max_recompute_layers is not None
                and self.recompute_layers > self.max_recompute_layers):
            raise ValueError(f"recompute_layers = {self.recompute_layers} exceeds "
                             f"max_recompute_layers = {self.max_recompute_layers}: raise the cap "
                             "or change the pin")
        if self.recompute_layers and "full" not in self.recompute_modes:
            raise ValueError(f"recompute_layers = {self.recompute_layers} needs recompute = "
                             f"\"full\", which constraints.recompute = "
                             f"{list(self.recompute_modes)} does not allow")
        if (self.vp or 1) > 1 and (self.pp == 1 or self.max_pp == 1):
            raise ValueError(f"vp = {self.vp} (interleaved pipeline) needs pp > 1, but "
                             + ("pp = 1" if self.pp == 1 else "max_pp = 1"))
        return self

    @property
    def sharding_modes(self) -> tuple[str, ...]:
        """The sharding modes the constraints allow (``distributed_optimizer`` pins one)."""
        if self.distributed_optimizer is not None:
            return ("optim",) if self.distributed_optimizer else ("none",)
        if self.dp_sharding is None:
            return SHARDING_MODES
        chosen = (self.dp_sharding,) if isinstance(self.dp_sharding, str) else self.dp_sharding
        return tuple(m for m in SHARDING_MODES if m in chosen)

    @property
    def recompute_modes(self) -> tuple[str, ...]:
        if self.recompute is None:
            return RECOMPUTE_MODES
        if isinstance(self.recompute, str):
            return (self.recompute,)
        return tuple(m for m in RECOMPUTE_MODES if m in self.recompute)


def lifted(c: ConstraintSpec, key: str) -> object:
    """The value of ``[constraints]`` key ``key`` in the unconstrained baseline of ``c``, by
    its kind in :data:`WHAT_IFS` (a ``kept`` key keeps its value)."""
    kind, given = WHAT_IFS[key], getattr(c, key)
    default = ConstraintSpec.model_fields[key].default
    if kind in ("pin", "filter"):
        return None
    if kind == "cap":
        return None if given is None or default is None else max(given, default)
    if kind == "floor":
        return min(given, default)
    if kind == "reach":
        pin = getattr(c, REACHES[key])
        return given if not pin else max(given or 0, pin)
    if kind == "placement":
        return False if key in c.model_fields_set else default
    return given


class PlanSpec(_Strict):
    """A fixed parallel plan for ``plan evaluate``; keys as in published runs."""

    tp: upto(MAX_GPUS) = 1
    pp: upto(MAX_GPUS) = 1
    dp: upto(MAX_GPUS) | None = Field(default=None, description="default: gpus / (tp * pp * cp)")
    cp: upto(MAX_GPUS) = 1
    vp: upto(MAX_GPUS) = Field(default=1, description="virtual pipeline chunks per stage")
    micro_batch: upto(MAX_BATCH) = 1
    micro_batches: upto(MAX_BATCH) | None = Field(default=None, description="checked if given")
    global_batch: upto(MAX_BATCH) | None = Field(default=None, description="default from [training]")
    recompute: Recompute = "none"
    sequence_parallel: bool | None = Field(
        default=None, description="default: the [constraints] pin, else on (KNOB_DEFAULTS)")
    distributed_optimizer: bool | None = Field(
        default=None, description="default: the [constraints] pin, else on (KNOB_DEFAULTS); "
        "true is dp_sharding = \"optim\"")
    dp_sharding: Sharding | None = Field(
        default=None, description="data-parallel sharding (ZeRO-0..3): none | optim | "
        "optim_grads | optim_grads_params; default from distributed_optimizer")
    dp_shard_size: upto(MAX_GPUS) | None = Field(
        default=None, description="HSDP shard group size, a divisor of dp (dp / dp_shard_size "
        "replicas across nodes); default dp")
    reshard_after_forward: bool | None = Field(
        default=None, description="FSDP2: free gathered parameters after forward (gathered "
        "again in backward); default the framework's: true without pipeline parallelism, false "
        "with it")
    ep: upto(MAX_GPUS) = Field(default=1, description="expert-parallel degree (MoE models)")
    first_stage_layers: upto(MAX_LAYERS) | None = Field(
        default=None, description="decoder layers of the first pipeline stage (Megatron-LM "
        "--decoder-first-pipeline-num-layers); default: an even share")
    last_stage_layers: upto(MAX_LAYERS) | None = Field(
        default=None, description="decoder layers of the last pipeline stage (Megatron-LM "
        "--decoder-last-pipeline-num-layers); default: an even share")
    account_for_embedding: bool = Field(
        default=False, description="the embedding counts as one layer of the pipeline split "
        "(Megatron-LM --account-for-embedding-in-pipeline-split)")
    account_for_loss: bool = Field(
        default=False, description="the loss / output layer counts as one layer of the pipeline "
        "split (Megatron-LM --account-for-loss-in-pipeline-split)")
    pipeline_layout: Annotated[str, Field(min_length=1, max_length=4096)] | None = Field(
        default=None, description="Megatron-Core's layout string (Megatron-LM "
        "--pipeline-model-parallel-layout, e.g. \"Et*4|(t*4|)*14tmL\"): the virtual stages in "
        "order, | between them, E embedding, t decoder layer, m prediction depth, L loss; "
        "every stage holds the same decoder layers but the first and the last; vp follows "
        "from it; exclusive with the four keys above")
    recompute_layers: upto(MAX_LAYERS) | None = Field(
        default=None, description="with recompute = \"full\": layers of each virtual stage "
        "recomputed, the rest keep their activations (Megatron-LM --recompute-method block "
        "--recompute-num-layers); default: all")
    optimizer_offload: bool | None = Field(
        default=None, description="optimizer states in host memory, the Adam step on the CPU "
        "(Megatron-Core --optimizer-cpu-offload, DeepSpeed offload_optimizer); default: the "
        "[constraints] pin, else off")
    offload_layers: Annotated[int, Field(ge=0, le=MAX_LAYERS)] | None = Field(
        default=None, description="decoder layers whose activations go to host memory in "
        "forward and come back in backward (Megatron-Core --cpu-offloading-num-layers); "
        "default: the [constraints] pin, else 0")
    ep_intra: upto(MAX_GPUS) | None = Field(default=None, description="factor of ep inside a node")
    tp_intra: upto(MAX_GPUS) | None = Field(default=None, description="factor of tp inside a node")
    cp_intra: upto(MAX_GPUS) | None = None
    pp_intra: upto(MAX_GPUS) | None = None
    dp_intra: upto(MAX_GPUS) | None = None
    overlap_grad_reduce: bool | None = Field(
        default=None, description=OVERLAP_DESCRIPTIONS["overlap_grad_reduce"]
        + "; default: the [constraints] pin, else the framework's")
    overlap_param_gather: bool | None = Field(
        default=None, description=OVERLAP_DESCRIPTIONS["overlap_param_gather"]
        + "; default: the [constraints] pin, else the framework's")
    tp_comm_overlap: bool | None = Field(
        default=None, description=OVERLAP_DESCRIPTIONS["tp_comm_overlap"]
        + "; default: the [constraints] pin, else the framework's")
    overlap_p2p_comm: bool | None = Field(
        default=None, description=OVERLAP_DESCRIPTIONS["overlap_p2p_comm"]
        + "; default: the [constraints] pin, else the framework's")
    overlap_moe_expert_parallel_comm: bool | None = Field(
        default=None, description=OVERLAP_DESCRIPTIONS["overlap_moe_expert_parallel_comm"]
        + "; default: the [constraints] pin, else the framework's")

    @field_validator("first_stage_layers", "last_stage_layers", "recompute_layers",
                     mode="before")
    @classmethod
    def _zero_is_the_default(cls, v):
        """0 is the key left out, as the flags read it (``--first-stage-layers 0``: an even
        share; ``--recompute-layers 0``: every layer) and as a result's ``plan`` writes it, so
        that a plan copied from the JSON evaluates as it came."""
        return None if type(v) is int and v == 0 else v        # (not false, not 0.0)

    @model_validator(mode="after")
    def _sharding(self) -> PlanSpec:
        if (self.dp_sharding is not None and self.distributed_optimizer is not None
                and (self.dp_sharding != "none") != self.distributed_optimizer):
            raise ValueError(f"distributed_optimizer = {str(self.distributed_optimizer).lower()} "
                             f"contradicts dp_sharding = \"{self.dp_sharding}\"")
        return self


def overlap_refusal(framework: str | None, spec, where: str = "") -> str | None:
    """The sentence refusing an overlap switch set on (in ``[constraints]``, or in a plan: any
    object with the switches as attributes) that ``framework`` cannot run, or None."""
    if framework is None:
        return None
    fw = FRAMEWORKS[framework]
    bad = [k for k in OVERLAP_KNOBS if getattr(spec, k) and k not in fw.overlaps_expressible]
    if not bad:
        # (a switch not given is the framework's default)
        reduce = spec.overlap_grad_reduce
        return param_gather_refusal(
            fw, bool(spec.overlap_param_gather),
            fw.overlap_default("overlap_grad_reduce") if reduce is None else reduce, where)
    return (f"{', '.join(where + k for k in bad)} = true, but constraints.framework = "
            f"\"{framework}\": {fw.label} has no switch for "
            + ("it" if len(bad) == 1 else "them") + " (planner/model/frameworks.py)")


class InstanceSpec(_Strict):
    """A whole instance file."""

    model: ModelSpec
    training: TrainingSpec
    cluster: ClusterSpec
    constraints: ConstraintSpec = ConstraintSpec()
    plan: PlanSpec | None = None

    @model_validator(mode="after")
    def _compiled_loss_is_torchtitans(self) -> InstanceSpec:
        from planner.model.words import toml_value
        if self.training.compiled_loss and self.constraints.framework != "torchtitan":
            raise ValueError("training.compiled_loss = true is torchtitan's compiled loss "
                             "([compile] components with \"loss\"), and constraints."
                             f"framework = {toml_value(self.constraints.framework or 'unset')} "
                             "runs its own: set constraints.framework = \"torchtitan\", or "
                             "remove it (fused_cross_entropy is a fused loss kernel)")
        if self.training.compiled_loss and self.training.fused_cross_entropy:
            raise ValueError("training.compiled_loss and training.fused_cross_entropy name two "
                             "different losses: keep one")
        return self

    @model_validator(mode="after")
    def _moe_keys_need_experts(self) -> InstanceSpec:
        # (the [model] MoE keys are refused on a dense model by ModelSpec; the [training] one
        # is here, where both sections are known)
        if not self.model.experts and "moe_token_dispatcher" in self.training.model_fields_set:
            raise ValueError("training.moe_token_dispatcher applies to mixture-of-experts "
                             "models only (how tokens reach their experts), and model.experts "
                             "= 0 is a dense model: set model.experts, or remove it")
        if (self.training.cp_comm_type != "p2p"
                and not on_megatron_core(self.constraints.framework)):
            raise ValueError(f"training.cp_comm_type \"{self.training.cp_comm_type}\" is "
                             "Megatron-Core's (Transformer Engine's) exchange; constraints."
                             f"framework = \"{self.constraints.framework}\" runs its own "
                             "context parallelism (costed as the p2p ring): remove "
                             "training.cp_comm_type")
        from planner.model.words import toml_value

        sel = self.training.selective_recompute
        modules = recompute_module_set(sel)
        said = f"training.selective_recompute {toml_value(sel)}"
        if isinstance(sel, list) and len(set(sel)) < len(sel):
            raise ValueError(f"{said} names a module twice; name each once")
        if "mla_up_proj" in modules and not self.model.mla:
            raise ValueError(f"{said} recomputes multi-head latent attention's "
                             "up-projections, and the model has none (model.kv_lora_rank not "
                             "given): use core_attention, or describe the model's MLA")
        if "moe_act" in modules and not self.model.moe:
            raise ValueError(f"{said}: moe_act recomputes the routed experts' activation, and "
                             "the model has no experts (model.experts = 0): remove moe_act")
        if "mlp" in modules and self.model.moe and self.model.moe_layers == self.model.layers:
            raise ValueError(f"{said}: mlp recomputes the dense layers' MLP (Megatron-Core "
                             "skips MoE layers), and every layer of this model is an MoE "
                             "layer: remove mlp")
        if "layernorm" in modules and not (self.model.moe or self.model.mla):
            raise ValueError(f"{said}: layernorm recomputes the norms Megatron-Core keeps "
                             "apart from a linear layer (an MoE layer's pre-MLP norm, "
                             "multi-head latent attention's input norm); this model fuses "
                             "each of its norms into the linear layer after it, so it would "
                             "recompute nothing: remove layernorm")
        if modules & {"moe_act", "layernorm"} and delayed_scaling(self.training):
            raise ValueError(f"{said} under FP8 with training.fp8_recipe "
                             f"{toml_value(self.training.fp8_recipe or 'unset')}: Megatron-Core "
                             "refuses moe_act and layernorm recompute under delayed scaling, "
                             "its default recipe (TransformerConfig); set training.fp8_recipe "
                             "= \"tensorwise\" or \"mxfp8\", or other modules")
        if ((isinstance(sel, list) or "mla_up_proj" in modules)
                and not on_megatron_core(self.constraints.framework)):
            raise ValueError(f"{said} names Megatron-Core recompute modules; constraints."
                             f"framework = \"{self.constraints.framework}\" has none: use "
                             "its own selective recompute")
        return self

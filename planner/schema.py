"""The instance file schema (DESIGN.md section 3) as pydantic models.

Unknown keys are errors everywhere (``extra="forbid"``) so a misspelt key never silently falls
back to a default. Every number is range-checked here; cross-field rules (heads divisible by
kv_heads, a GPU count that fills whole nodes) are model validators, so all problems surface
at load time with the key path that holds them.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, field_validator, model_validator

RECOMPUTE_MODES = ("none", "selective", "full")
Recompute = Literal["none", "selective", "full"]
Precision = Literal["bf16", "fp16", "fp8"]
PositiveFloat = Annotated[float, Field(gt=0)]
Fraction = Annotated[float, Field(ge=0, le=1)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelSpec(_Strict):
    """Transformer shape. ``preset`` fills keys from ``planner/data/presets.toml``."""

    preset: str | None = Field(default=None, description="name of a model preset")
    name: str | None = None
    layers: PositiveInt
    hidden: PositiveInt
    heads: PositiveInt
    kv_heads: PositiveInt | None = Field(default=None, description="GQA key/value heads; default heads")
    ffn_hidden: PositiveInt | None = Field(default=None, description="MLP width; default 4 * hidden")
    gated_mlp: bool = Field(default=False, description="SwiGLU-style three-matrix MLP")
    vocab: PositiveInt
    seq_len: PositiveInt
    tied_embeddings: bool = Field(default=True, description="output layer shares the input embedding")
    position_embedding: Literal["learned", "rope"] = "learned"
    dropout: bool = Field(default=True, description="trained with dropout (stores 1-byte masks)")
    hf_config: str | None = Field(
        default=None, description="a Hugging Face config.json (path relative to the instance) "
        "filling the keys above; explicit keys override it")
    # mixture of experts (experts = 0: a dense model)
    experts: int = Field(default=0, ge=0, description="routed experts per MoE layer (0 = dense)")
    top_k: PositiveInt = Field(default=2, description="routed experts per token")
    moe_ffn_hidden: PositiveInt | None = Field(
        default=None, description="MLP width of one expert; default ffn_hidden")
    shared_experts: int = Field(default=0, ge=0, description="always-on experts per MoE layer")
    first_dense_layers: int = Field(default=0, ge=0, description="leading dense layers")
    moe_layer_interval: PositiveInt = Field(
        default=1, description="every n-th layer after the dense ones is an MoE layer")

    @model_validator(mode="after")
    def _shape(self) -> ModelSpec:
        if self.hidden % self.heads:
            raise ValueError(f"hidden ({self.hidden}) must be divisible by heads ({self.heads})")
        if self.heads % self.kv:
            raise ValueError(f"heads ({self.heads}) must be divisible by kv_heads ({self.kv})")
        if self.experts == 1:
            raise ValueError("experts = 1 is a dense model: use experts = 0")
        if self.experts and self.top_k > self.experts:
            raise ValueError(f"top_k ({self.top_k}) cannot exceed experts ({self.experts})")
        if self.experts and self.first_dense_layers >= self.layers:
            raise ValueError(f"first_dense_layers ({self.first_dense_layers}) leaves no MoE layer "
                             f"of the {self.layers}")
        return self

    @property
    def moe(self) -> bool:
        return self.experts > 1

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
    def ffn(self) -> int:
        return self.ffn_hidden or 4 * self.hidden


class TrainingSpec(_Strict):
    """The job: batch, token budget, precision, and software behaviour the model needs to know."""

    global_batch: PositiveInt | tuple[PositiveInt, PositiveInt] = Field(
        description="sequences per step, or [lo, hi] to let the planner choose")
    tokens: PositiveFloat | None = Field(default=None, description="token budget for days and cost")
    precision: Precision = "bf16"
    flash_attention: bool = Field(
        default=True, description="fused attention: no s^2 score tensors in HBM")
    dp_overlap: Fraction = Field(
        default=0.0, description="share of the data-parallel communication that may hide behind "
        "the backward pass (AMPeD default 0: not overlapped)")
    tp_overlap: Fraction = Field(
        default=0.0, description="share of the tensor-parallel communication that may hide "
        "behind the GEMMs of its layer")
    bubble_ratio: Annotated[float, Field(ge=0, le=1)] = Field(
        default=1.0, description="AMPeD's R: non-overlapped share of the pipeline bubble")

    @field_validator("global_batch")
    @classmethod
    def _range(cls, v):
        if isinstance(v, tuple) and v[0] > v[1]:
            raise ValueError(f"[lo, hi] needs lo <= hi, got [{v[0]}, {v[1]}]")
        return v


class ClusterSpec(_Strict):
    """The machines: a catalog GPU, how many, and optional overrides of catalog figures."""

    gpu: str
    nodes: PositiveInt | tuple[PositiveInt, PositiveInt] | None = Field(
        default=None, description="node count, or [lo, hi] for pareto / capacity")
    node_counts: list[PositiveInt] | None = Field(
        default=None, description="explicit list of node counts for pareto / capacity")
    gpus: PositiveInt | None = Field(default=None, description="GPU count instead of nodes")
    gpus_per_node: PositiveInt | None = Field(default=None, description="default from the catalog")
    price_per_gpu_hour: PositiveFloat | None = None
    intra_node_bandwidth_GBps: PositiveFloat | None = None
    inter_node_bandwidth_GBps: PositiveFloat | None = None
    efficiency: Annotated[float, Field(gt=0, le=1)] | None = None
    efficiency_fp8: Annotated[float, Field(gt=0, le=1)] | None = None

    @model_validator(mode="after")
    def _size(self) -> ClusterSpec:
        given = [k for k in ("nodes", "node_counts", "gpus") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of nodes, node_counts or gpus"
                             + (f" (got {', '.join(given)})" if given else ""))
        if isinstance(self.nodes, tuple) and self.nodes[0] > self.nodes[1]:
            raise ValueError(f"nodes = [lo, hi] needs lo <= hi, got {list(self.nodes)}")
        return self


class ConstraintSpec(_Strict):
    """What-if constraints: pins and caps on every knob, honoured by every backend."""

    tp: PositiveInt | None = None
    pp: PositiveInt | None = None
    dp: PositiveInt | None = None
    cp: PositiveInt | None = None
    vp: PositiveInt | None = None
    micro_batch: PositiveInt | None = None
    max_tp: PositiveInt | None = None
    max_pp: PositiveInt | None = None
    max_dp: PositiveInt | None = None
    max_cp: PositiveInt | None = Field(default=1, description="context parallelism is off unless raised")
    ep: PositiveInt | None = None
    max_ep: PositiveInt | None = None
    max_vp: PositiveInt | None = None
    min_micro_batch: PositiveInt = 1
    max_micro_batch: PositiveInt = Field(default=32, description="cap on the micro-batch size")
    recompute: Recompute | list[Recompute] | None = Field(
        default=None, description="allowed recompute mode(s); default all")
    sequence_parallel: bool | None = Field(default=None, description="pin on/off; default free")
    distributed_optimizer: bool | None = Field(default=None, description="pin on/off; default free")
    tp_within_node: bool = False
    pp_within_node: bool = False
    cp_within_node: bool = False
    min_mfu: Annotated[float, Field(gt=0, lt=1)] | None = Field(
        default=None, description="only plans reaching this MFU (a cap on the step time)")
    memory_reserve_GiB: Annotated[float, Field(ge=0)] = Field(
        default=2.0, description="per-GPU memory kept free (CUDA context, NCCL, fragmentation)")

    @property
    def recompute_modes(self) -> tuple[str, ...]:
        if self.recompute is None:
            return RECOMPUTE_MODES
        if isinstance(self.recompute, str):
            return (self.recompute,)
        return tuple(m for m in RECOMPUTE_MODES if m in self.recompute)


class PlanSpec(_Strict):
    """A fixed parallel plan for ``plan evaluate``; keys as in published runs."""

    tp: PositiveInt = 1
    pp: PositiveInt = 1
    dp: PositiveInt | None = Field(default=None, description="default: gpus / (tp * pp * cp)")
    cp: PositiveInt = 1
    vp: PositiveInt = Field(default=1, description="virtual pipeline chunks per stage")
    micro_batch: PositiveInt = 1
    micro_batches: PositiveInt | None = Field(default=None, description="checked if given")
    global_batch: PositiveInt | None = Field(default=None, description="default from [training]")
    recompute: Recompute = "none"
    sequence_parallel: bool = False
    distributed_optimizer: bool = False
    ep: PositiveInt = Field(default=1, description="expert-parallel degree (MoE models)")
    ep_intra: PositiveInt | None = Field(default=None, description="factor of ep inside a node")
    tp_intra: PositiveInt | None = Field(default=None, description="factor of tp inside a node")
    cp_intra: PositiveInt | None = None
    pp_intra: PositiveInt | None = None
    dp_intra: PositiveInt | None = None


class InstanceSpec(_Strict):
    """A whole instance file."""

    model: ModelSpec
    training: TrainingSpec
    cluster: ClusterSpec
    constraints: ConstraintSpec = ConstraintSpec()
    plan: PlanSpec | None = None

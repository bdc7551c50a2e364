"""What the four launch formats share (:mod:`planner.app.emit`): where the ranks sit on the
hosts, the header that says what the model costed, the model-shape and recompute fields the
Megatron-Core based formats (Megatron-LM, NeMo) write alike, and the comments on what a format
cannot express."""

from __future__ import annotations

import textwrap

from planner.model.evaluate import TIGHT_MEMORY_CAVEAT, UNCOUNTED_PEAK_GIB, evaluate
from planner.model.frameworks import OVERLAP_KNOBS, on_megatron_core, torchao_float8
from planner.model.terms import selective_recompute
from planner.model.instance import Instance
from planner.model.plan import ORDER, Plan, default_placement
from planner.model.schema import MODELLED_MODULES
from planner.model.words import stage_words


TP_PP_DP_ORDER = ("tp", "pp", "dp", "cp")       # --use-tp-pp-dp-mapping ("tp-pp-dp", cp = 1)


def host_gpus(plan: Plan) -> int:
    """GPUs per host, the count a launcher starts per node (GB200: 4, not the 72 of the
    NVLink domain)."""
    return plan.gpus // plan.nodes


def segment(plan: Plan) -> str:
    """What the plan's ``*_intra`` factors fill: a node, or on rack-scale systems (GB200: 4
    GPUs per host, 72 per NVLink domain) an NVLink segment of several hosts."""
    per_host = host_gpus(plan)
    if plan.node_size == per_host:
        return "node"
    return (f"NVLink segment of {plan.node_size} GPUs ({plan.node_size // per_host} hosts of "
            f"{per_host})")


def rank_order(plan: Plan) -> str | None:
    """The Megatron-Core rank order that gives the plan's placement: "default" (tp-cp-ep-dp-pp),
    "tp-pp-dp" (``use_tp_pp_dp_mapping``, cp = 1 only) or None (no stock order does)."""
    node = plan.node_size
    if intra_factors(plan) == placed(plan, node, ORDER):
        return "default"
    if plan.cp == 1 and intra_factors(plan) == placed(plan, node, TP_PP_DP_ORDER):
        return "tp-pp-dp"
    return None


def megatron_fsdp(plan: Plan) -> bool:
    """Whether the plan runs on Megatron-FSDP (gradients or parameters sharded)."""
    return plan.dp_sharding in ("optim_grads", "optim_grads_params")


def op_selective(inst: Instance, plan: Plan) -> bool:
    """Selective recompute costed as torchtitan's op-level policy (``[training]
    selective_recompute = "op"``), which Megatron-Core's selective recompute is not."""
    return plan.recompute == "selective" and "op" in selective_recompute(inst)


def recompute_modules(inst: Instance, plan: Plan) -> list[str] | None:
    """The plan's selective recompute as Megatron-Core's ``recompute_modules`` where it is
    more than the default ``core_attn`` (None: the default, or no selective recompute, or
    torchtitan's op-level policy, which has no module)."""
    modules = selective_recompute(inst)
    if plan.recompute != "selective" or modules in ({"core_attn"}, {"op"}):
        return None
    return [m for m in MODELLED_MODULES if m in modules]   # (in Megatron-Core's order)


#: what the Megatron-based exports say of an op-level selective recompute
OP_SELECTIVE = ("selective recompute \"op\": cannot express; the plan costs torchtitan's "
                 "op-level policy (saves the outputs of every second matmul and of attention, "
                 "recomputes the rest), while Megatron-Core's selective recompute (recompute "
                 "module core_attn) recomputes only the attention core: the memory and time of "
                 "the run differ from the plan's")


def intra_factors(plan: Plan) -> dict[str, int]:
    return {d: getattr(plan, f"{d}_intra") for d in ORDER}


def placed(plan: Plan, node_size: int, order: tuple[str, ...]) -> dict[str, int]:
    """Intra-node factors a launcher filling nodes in ``order`` (innermost first) produces."""
    return default_placement({d: getattr(plan, d) for d in order}, node_size, order)


def fmt_intra(f: dict[str, int]) -> str:
    return ", ".join(f"{d}_intra={f[d]}" for d in ORDER)


def ep(plan: Plan) -> int:
    return getattr(plan, "ep", 1)


def moe_fields(inst: Instance) -> dict[str, object] | None:
    """The MoE shape of the model (None for a dense model): experts, top-k, expert width,
    shared-expert width, which layers are MoE layers (1) or dense (0), the router's score
    function and whether it scores before choosing (``pre_softmax``: Megatron-Core refuses a
    softmax over a single chosen expert, whose gradient is zero, so top-1 softmax routing
    scores first, as the Switch Transformer does)."""
    m = inst.model
    if not getattr(m, "moe", False):
        return None
    d, n = m.first_dense_layers, m.moe_layer_interval
    pattern = [int(i >= d and (i - d) % n == 0) for i in range(m.layers)]
    ffn = m.moe_ffn
    score = m.moe_router_score_function
    return {"experts": m.experts, "top_k": m.top_k, "ffn": ffn,
            "shared_ffn": m.shared_experts * ffn, "pattern": pattern,
            "freq": 1 if all(pattern) else _freq_expr(m.layers, d, n), "score": score,
            "pre_softmax": m.top_k == 1 and score == "softmax"}


def _freq_expr(layers: int, dense: int, interval: int) -> str:
    """Megatron's ``--moe-layer-freq`` list expression, e.g. ``([0]*3+[1]*58)``."""
    q, r = divmod(layers - dense, interval)
    unit = "[1]" if interval == 1 else f"([1]+[0]*{interval - 1})"
    terms = [f"[0]*{dense}"] if dense else []
    if q:
        terms.append(f"{unit}*{q}")
    if r:
        terms.append("[1]" + (f"+[0]*{r - 1}" if r > 1 else ""))
    return "(" + "+".join(terms) + ")"


def mxfp8_params(inst: Instance) -> bool:
    """MXFP8 parameters: all-gathered in 16 bits through the gradient buffer (Megatron-LM
    ``--reuse-grad-buf-for-mxfp8-param-ag``, NeMo ``reuse_grad_buf_for_mxfp8_param_ag``)."""
    tr = inst.spec.training
    return tr.precision == "fp8" and tr.fp8_recipe == "mxfp8" and bool(tr.fp8_param_gather)


def newer_schedule_note(plan: Plan) -> list[str]:
    """Megatron-LM and NeMo exports of a plan that interleaves with p2p overlap and has a
    steady phase: the schedule the model costs is the one before Megatron-LM #4047, which the
    flags cannot choose (its send wait comes with deallocate_pipeline_outputs, which
    Megatron-LM's training sets); the plan's caveats give the time the newer one adds."""
    from planner.model.evaluate import P2P_4047_CAVEAT, p2p_since_4047_s

    if p2p_since_4047_s(plan, 1.0, 0.0) <= 0:        # (per unit transfer: any more exposed?)
        return []
    return [P2P_4047_CAVEAT + "; the plan's caveats give how much longer its step then runs"]


def overlaps(plan: Plan) -> dict[str, bool]:
    """The plan's overlap switches by name. The plan holds them as they run and as the model
    costs them (``Plan.__post_init__``: parameter-gather overlap only with a sharded mode,
    tensor-parallel overlap and sequence parallelism only at tp > 1, p2p overlap only when
    interleaved, the expert all-to-all overlap where Megatron-Core runs it)."""
    return {name: getattr(plan, name) for name in OVERLAP_KNOBS}


def mla_widths(m) -> dict[str, int]:
    """Multi-head latent attention's widths under Megatron-Core's names (``q_lora_rank`` only
    where the queries are compressed), as [model] gives them."""
    keys = ("q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim")
    return {k: getattr(m, k) for k in keys if getattr(m, k) is not None}


def layers_per_stage(inst: Instance, plan: Plan) -> int:
    """Decoder layers of a (middle) virtual stage."""
    return (inst.model.layers + plan.knobs.padded_layers) // (plan.pp * plan.vp)


def uneven(plan: Plan) -> bool:
    return plan.knobs.uneven


def header(inst: Instance, plan: Plan, what: str, torchrun: bool = True) -> list[str]:
    per_node = host_gpus(plan)
    m = inst.model
    gpus = (f"{plan.nodes} node{'s' if plan.nodes > 1 else ''} x {per_node} GPUs per node = "
            f"{plan.gpus} GPUs")
    if torchrun:
        gpus += f" (torchrun --nnodes {plan.nodes} --nproc-per-node {per_node})"
    return [
        f"{what} for plan {plan.label()} ({m.name or 'model'}, {inst.spec.training.precision_label})",
        gpus,
        f"global batch {plan.global_batch} = dp {plan.dp} x micro_batch {plan.micro_batch} x "
        f"{plan.micro_batches} micro-batches per step",
        costed(inst, plan),
    ] + ([f"model shape: {inst.spec.model.approximates}; the model arguments below build "
          "the approximation, not the original"] if inst.spec.model.approximates else []) \
        + ([BF16_STATES] if bf16_without_master(inst) else []) \
        + ([EXPANDABLE] if inst.spec.training.expandable_segments else [])


def costed(inst: Instance, plan: Plan) -> str:
    """What the model costs the plan, for the export to say beside it (to set against the
    launch's own step time and memory): ``costed by the model: 7.671 s per step, 72.82 GiB
    per GPU (the middle pipeline stage), 0.80 GiB under its 73.62 GiB limit (capacity 79.60 -
    reserve 5.98)``, and where the plan runs within :data:`UNCOUNTED_PEAK_GIB` of the limit,
    that Megatron-LM's CI measured peaks up to that much above the model's."""
    rep = evaluate(inst, plan)
    mem = rep.memory_gib
    text = (f"costed by the model: {rep.step_time_s:.4g} s per step, {mem['total']:.2f} GiB per "
            f"GPU ({stage_words(rep.most_loaded_stage)}), {mem['headroom']:.2f} GiB under its "
            f"{mem['limit']:.2f} GiB limit (capacity {mem['capacity']:.2f} - reserve "
            f"{mem['reserve']:.2f})")
    if TIGHT_MEMORY_CAVEAT in rep.caveats:
        text += (f"; that is within the {UNCOUNTED_PEAK_GIB} GiB by which measured peaks on "
                 "Megatron-LM's CI exceeded the model's: raise constraints.memory_reserve_GiB "
                 "for room")
    return text


#: what every export says of ``[training] expandable_segments`` (an environment variable of the
#: launch, not a framework argument; the megatron export also sets it)
EXPANDABLE = ("memory: the plan's limit keeps no fragmentation share, as PyTorch's caching "
               "allocator runs with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
               "([training] expandable_segments): set it in the launch environment")


def bf16_without_master(inst: Instance) -> bool:
    """bf16 optimizer states with no master copy (NeMo 1's distributed_fused_adam), which no
    export can write; with ``store_param_remainders`` they are Megatron-Core's precision-aware
    optimizer with bf16 moments, which the Megatron and NeMo exports write."""
    tr = inst.spec.training
    return (tr.optimizer_dtype == "bf16" and not tr.store_param_remainders
            and tr.main_params_dtype is None)


def bf16_moments_fp32_master(inst: Instance) -> bool:
    """bf16 Adam moments beside a whole fp32 master (``[training] main_params_dtype``):
    Megatron-Core's precision-aware optimizer, which the Megatron and NeMo exports write."""
    tr = inst.spec.training
    return tr.optimizer_dtype == "bf16" and tr.main_params_dtype == "fp32"


#: what the exports say of ``[training] optimizer_dtype = "bf16"`` without a master copy, which
#: none of them can write
BF16_STATES = ("optimizer_dtype bf16: cannot express; the plan's memory counts bf16 Adam "
                "moments and no master copy (NeMo 1's distributed_fused_adam with optim.dtype: "
                "bf16), while this framework keeps fp32 main parameters and moments: the plan "
                "may not fit as written")


def comment_lines(lines: list[str], prefix: str = "# ") -> list[str]:
    out = []
    for line in lines:
        out += textwrap.wrap(line, width=100, initial_indent=prefix, subsequent_indent=prefix + "  ",
                             break_on_hyphens=False, break_long_words=False)
    return out


def stages_text(plan: Plan) -> str:
    layers = plan.stage_layers or []
    return ", ".join(str(n) for n in layers) + f" (pp={plan.pp}, vp={plan.vp})"


def norm_bias_config(m) -> dict[str, str | bool]:
    """The model's norms, biases and QK norm as Megatron-Core TransformerConfig fields, which
    the NeMo export writes and the Megatron-LM export turns into flags. ``add_qkv_bias`` is
    the QKV bias alone (Megatron-LM's validate_args sets it whenever ``add_bias_linear``).
    Multi-head latent attention takes ``qk_layernorm`` as the switch of its norms of the
    compressed query and key / value (gpt_layer_specs.py: without it the up-projections are
    plain linear layers), which the model always counts, so an MLA model sets it. The
    attention's ``softmax_type`` (a sink: gpt-oss) rides along."""
    return {"normalization": "RMSNorm" if m.normalization == "rmsnorm" else "LayerNorm",
            "add_bias_linear": m.linear_bias,
            "add_qkv_bias": m.has_qkv_bias and not m.linear_bias,
            "qk_layernorm": m.qk_norm or m.mla,
            "qk_l2_norm": m.qk_l2_norm,
            "softmax_type": m.softmax_type}


def window_config(m) -> dict[str, object]:
    """The model's sliding window as Megatron-Core TransformerConfig fields (``window_size``
    ``(left, 0)``, ``window_attn_skip_freq`` where not every layer is windowed), which the
    NeMo export writes and the Megatron-LM export turns into flags; none without a window."""
    if not m.windowed:
        return {}
    out: dict[str, object] = {"window_size": [m.window_left, 0]}
    if m.window_attn_skip_freq is not None:
        out["window_attn_skip_freq"] = m.window_attn_skip_freq
    return out


def window_words(m) -> str:
    """The sliding window in words, for the exports that take the model from elsewhere."""
    return (f"sliding-window attention (each query attends to itself and the {m.window_left} "
            f"tokens before it, in {m.windowed_extent}"
            + f"; Megatron-Core window_size ({m.window_left}, 0)"
            + (f", window_attn_skip_freq {m.window_attn_skip_freq}"
               if isinstance(m.window_attn_skip_freq, int) else "") + ")")


def norm_bias_words(m) -> str:
    """The norms and biases in words, for the exports that take the model from elsewhere."""
    biases = ("a bias on every linear layer" if m.linear_bias
              else "a QKV bias only" if m.has_qkv_bias else "no linear biases")
    return (f"{'RMSNorm' if m.normalization == 'rmsnorm' else 'LayerNorm'}"
            + (" (QK norm too)" if m.qk_norm else " (QK L2 norm too)" if m.qk_l2_norm else "")
            + f", {biases}"
            + (f", attention sinks (softmax_type {m.softmax_type})"
               if m.softmax_type != "vanilla" else ""))


#: What a Megatron-LM / NeMo export says of a plan costed on eager PyTorch kernels
EAGER_ON_TE = ("kernel_stack pytorch: the plan costs eager PyTorch kernels (torchtitan's "
                "default stack), while Megatron-Core runs Transformer Engine's fused ones: the "
                "run may be faster than planned (kernel_stack = \"fused\" plans for them)")


def fp8_library_note(inst: Instance, fmt: str) -> str | None:
    """A comment when the plan's FP8 linears ([training] fp8_library) are not the ones the
    framework runs: torchtitan's FP8 is torchao's float8 converter, Megatron-LM's and NeMo's
    Transformer Engine's. They hold different bytes (docs/model.md, "FP8"), so the run's
    memory differs from the plan's."""
    tr = inst.spec.training
    if tr.precision != "fp8" or tr.fp8_recipe == "mxfp8":
        return None
    torchao = torchao_float8(tr, inst.spec.constraints.framework)
    if fmt == "torchtitan" and not torchao:
        return ("fp8_library transformer_engine: cannot express (torchtitan's FP8 linears are "
                "torchao's float8); the plan costs Transformer Engine's, which hold other "
                "weight copies and linear inputs (docs/model.md, \"FP8\"): expect the memory "
                "to differ from the plan's")
    if on_megatron_core(fmt) and torchao:
        return ("fp8_library torchao: cannot express (Megatron-Core's FP8 linears are "
                "Transformer Engine's); the plan costs torchao's float8, which holds other "
                "weight copies and linear inputs (docs/model.md, \"FP8\"): expect the memory "
                "to differ from the plan's")
    return None

"""Launch configuration text for a chosen plan: Megatron-LM arguments, NeMo 2 overrides, a
torchtitan job config or a DeepSpeed JSON.

``emit(inst, plan, fmt)`` returns the text; every value comes from the :class:`~planner.model.plan.Plan`
and the instance's model, so the launch runs the plan that was evaluated. Comments in the output
say where a framework has no equivalent of a plan knob (``docs/launch_configs.md`` has the same
table with more caveats).

Versions followed
-----------------
* **Megatron-LM** ``pretrain_gpt.py`` arguments (``megatron/training/arguments.py``) with
  Megatron-Core's default rank order ``tp-cp-ep-dp-pp``.
* **NeMo 2** recipe tree (``nemo.collections.llm`` recipes, NeMo 2.x): ``trainer.strategy`` is a
  ``MegatronStrategy``, ``trainer.plugins`` a ``MegatronMixedPrecision``, ``data`` the data module,
  ``model.config`` the Megatron-Core ``TransformerConfig``, ``optim.config`` the Megatron-Core
  ``OptimizerConfig``. NeMo 1 (``megatron_gpt_config.yaml``) names differ: ``model.micro_batch_size``,
  ``model.activations_checkpoint_granularity``, ``model.optim.name: distributed_fused_adam``.
* **torchtitan 0.2.x** TOML job config (``torchtitan/config/job_config.py`` of 0.2.2, the last
  release read from ``--job.config_file``). torchtitan 0.3 replaced the TOML files with Python
  ``config_registry`` functions; its ``--parallelism.*`` / ``--training.*`` command-line overrides
  keep these names, except that ``enable_async_tensor_parallel`` moved to ``[compile]`` and
  sequence parallelism got a switch (``parallelism.enable_sequence_parallel``).
* **DeepSpeed** JSON config (0.19 key names).

Every argument and key name below was checked against the frameworks' sources:
Megatron-LM ``megatron/training/arguments.py`` (its ``_add_*_args`` groups and the flags it
builds from ``TransformerConfig`` fields), Megatron-Core ``megatron/core/model_parallel_config.py``
and ``megatron/core/transformer/transformer_config.py`` (``ModelParallelConfig`` raises "Cannot use
sequence parallelism without tensor parallelism"), NeMo 2 ``nemo/lightning/pytorch/strategies/
megatron_strategy.py`` (``MegatronStrategy.__init__``), torchtitan 0.2
``torchtitan/config/job_config.py`` and DeepSpeed ``deepspeed/runtime/config.py`` /
``deepspeed/runtime/activation_checkpointing/config.py``. ``tools/check_exports.py`` feeds every
shipped instance's exports to those frameworks' own parsers where they install.

Mapping (L layers; m = micro-batches per step = global_batch / (dp * micro_batch))
------------------------------------------------------------------------------------
Each knob: Megatron-LM | NeMo 2 | torchtitan 0.2 | DeepSpeed.

tp
    ``--tensor-model-parallel-size`` | ``trainer.strategy.tensor_model_parallel_size`` |
    ``parallelism.tensor_parallel_degree`` | ``plan_parallelism.tensor`` (*)
pp
    ``--pipeline-model-parallel-size`` | ``trainer.strategy.pipeline_model_parallel_size`` |
    ``parallelism.pipeline_parallel_degree`` | ``plan_parallelism.pipeline`` (*)
dp
    implied, world / (tp*pp*cp) | implied | ``parallelism.data_parallel_shard_degree`` (FSDP;
    ``data_parallel_replicate_degree`` for plain DDP) | implied by ``train_batch_size`` /
    (micro batch * accumulation); also ``plan_parallelism.data``
cp
    ``--context-parallel-size`` | ``trainer.strategy.context_parallel_size`` |
    ``parallelism.context_parallel_degree`` | an error (Megatron-DeepSpeed has no context
    parallelism)
vp
    ``--num-layers-per-virtual-pipeline-stage`` L/(pp*vp), only when vp > 1 (interleaved on two
    stages without p2p overlap: an error, as validate_args) |
    ``trainer.strategy.virtual_pipeline_model_parallel_size`` (null when 1) |
    ``pipeline_parallel_schedule = "Interleaved1F1B"`` and ``pipeline_parallel_layers_per_stage``
    L/(pp*vp) with the first/last-stage layer allowances at 0 (a comment names
    ``module_fqns_per_model_part`` when the split these give is not the plan's) | an error
    (DeepSpeed's PipelineEngine has no interleaved schedule)
micro_batch
    ``--micro-batch-size`` | ``data.micro_batch_size`` |
    ``parallelism.pipeline_parallel_microbatch_size`` (``training.local_batch_size`` when pp = 1) |
    ``train_micro_batch_size_per_gpu``
global_batch
    ``--global-batch-size`` | ``data.global_batch_size`` | ``training.global_batch_size`` |
    ``train_batch_size``
m
    derived | derived | ``training.local_batch_size`` = micro_batch * m when pp > 1 (the schedule
    splits it); m accumulation steps when pp = 1 | ``gradient_accumulation_steps``
recompute
    selective: ``--recompute-activations``; full: ``--recompute-granularity full
    --recompute-method uniform --recompute-num-layers 1`` | ``model.config.recompute_granularity``
    (+ ``recompute_method``, ``recompute_num_layers``) | ``activation_checkpoint.mode`` (selective
    with ``selective_ac_option = "op"``) | ``plan_parallelism.recompute`` (*): DeepSpeed
    recomputes what the model code wraps in ``deepspeed.checkpointing.checkpoint``
    (``plan_parallelism.recompute_how`` says what); the JSON's ``activation_checkpointing`` section only
    tunes those checkpoints (``partition_activations`` shards the saved inputs over the tensor-
    parallel ranks, it does not turn recompute on), so it is emitted with every option off.
    ``[training] selective_recompute = "op"`` (torchtitan's policy): a "cannot express" comment
    in the Megatron, NeMo and DeepSpeed exports (Megatron-Core recomputes the attention core);
    Megatron-Core's recompute modules beyond ``core_attn`` (``mla_up_proj``, ``layernorm``,
    ``moe_act``, ``mlp``): ``--recompute-granularity selective --recompute-modules ...`` |
    ``recompute_modules`` | a "cannot express" comment | ``recompute_how`` says "cannot express"
sequence_parallel
    ``--sequence-parallel`` | ``trainer.strategy.sequence_parallel`` | none: always on under
    tensor parallelism in 0.2 | ``plan_parallelism.sequence_parallel`` (*); only with tp > 1
    (Megatron-Core refuses sequence parallelism without tensor parallelism), false at tp = 1
dp_sharding (distributed_optimizer = optim), dp_shard_size, reshard_after_forward
    optim: ``--use-distributed-optimizer``; optim_grads / optim_grads_params: also
    ``--use-megatron-fsdp --data-parallel-sharding-strategy MODE
    --no-gradient-accumulation-fusion --ckpt-format fsdp_dtensor`` and no
    ``CUDA_DEVICE_MAX_CONNECTIONS=1``; HSDP replicas ``--num-distributed-optimizer-instances``;
    16-bit reduction ``--grad-reduce-in-bf16`` | ``optim.config.use_distributed_optimizer``,
    ``trainer.strategy.fsdp = megatron`` with ``save_ckpt_format = fsdp_dtensor`` and
    ``model.config.gradient_accumulation_fusion = false``,
    ``trainer.strategy.ddp.data_parallel_sharding_strategy`` / ``grad_reduce_in_fp32`` (also
    ``trainer.plugins.grad_reduce_in_fp32``, which overrides it),
    ``trainer.strategy.num_distributed_optimizer_instances`` | none: DDP
    (``data_parallel_replicate_degree = dp``, only without other parallelism);
    optim_grads_params: FSDP2 ``data_parallel_shard_degree = dp_shard_size``,
    ``data_parallel_replicate_degree = dp / dp_shard_size``, ``fsdp_reshard_after_forward``
    always / never, ``training.mixed_precision_reduce``; a shard group of one without context
    parallelism beside tp / pp (torchtitan runs it as DDP), optim and optim_grads: an error
    (torchtitan has no such mode) | ``zero_optimization.stage`` 0-3 and
    ``communication_data_type`` (with bf16 and fp32 gradients also ``data_types.
    grad_accum_dtype = "fp32"``); stage 2/3 with pp > 1 and HSDP are errors. Every export says
    the mode the model costed; a mode the framework cannot run is an error naming the rule
    (:func:`planner.model.frameworks.framework_violations`).
optimizer_offload, offload_layers (host offload)
    ``--optimizer-cpu-offload --optimizer-offload-fraction 1.0 --overlap-cpu-optimizer-d2h-h2d
    --use-precision-aware-optimizer``, ``--cpu-offloading-num-layers N`` |
    ``optim.config.optimizer_cpu_offload`` (same three companions),
    ``model.config.cpu_offloading`` / ``cpu_offloading_num_layers`` | an error (torchtitan's
    only CPU offload moves parameters too) | ``zero_optimization.offload_optimizer.device =
    "cpu"`` (stages 1-3); activation offload an error. A rule broken is an error naming it
    (:func:`planner.model.frameworks.offload_violations`).
precision
    ``--bf16`` / ``--fp16`` / ``--bf16 --fp8-format hybrid`` | ``trainer.plugins.precision``
    (bf16-mixed / 16-mixed) and ``trainer.plugins.fp8`` (hybrid) |
    ``training.mixed_precision_param = "bfloat16"``, fp8 via ``model.converters =
    ["quantize.linear.float8"]`` with ``filter_fqns = ["output"]`` (MoE: the experts' FP8 is a
    "cannot express" comment) | ``bf16.enabled`` / ``fp16.enabled`` (fp8: none)
precision = "nvfp4"
    ``--bf16 --fp4-format e2m1 --fp4-recipe nvfp4`` | ``trainer.plugins.fp4: e2m1``,
    ``fp4_recipe: nvfp4`` | a "cannot express" comment (bfloat16 emitted) | ``bf16.enabled``
fp8_recipe ([training])
    ``--fp8-recipe R`` (mxfp8: ``--fp8-format e4m3``, and with FP8 parameters
    ``--reuse-grad-buf-for-mxfp8-param-ag``) | ``trainer.plugins.fp8_recipe`` (mxfp8: ``fp8:
    e4m3``) | mxfp8: ``model.converters = ["quantize.linear.mx"]``, ``recipe_name =
    "mxfp8_cublas"``, with a comment (torchao's kernels, not the costed ones); delayed: a
    "cannot express" comment (tensorwise emitted) | not said (DeepSpeed's config has no FP8)
fp8_param_gather ([training])
    ``--fp8-param-gather`` | ``trainer.plugins.fp8_param_gather`` (said either way under FP8:
    NeMo's FP8 recipes switch it on) | ``[quantize.linear.float8]
    enable_fsdp_float8_all_gather`` and ``precompute_float8_dynamic_scale_for_fsdp`` (true
    under FSDP2 with it, false otherwise; other modes an error) | an error (no FP8 parameters:
    :func:`planner.model.frameworks.sharding_refusal`)
store_param_remainders ([training])
    ``--use-precision-aware-optimizer`` (``store_param_remainders`` is its default; with
    ``optimizer_dtype = "bf16"`` also ``--exp-avg-dtype bf16 --exp-avg-sq-dtype bf16``) |
    ``optim.config.use_precision_aware_optimizer``, ``store_param_remainders`` (and
    ``exp_avg_dtype`` / ``exp_avg_sq_dtype``) | an error | an error
    (:func:`planner.model.frameworks.sharding_refusal`)
main_params_dtype ([training])
    ``--use-precision-aware-optimizer --main-params-dtype fp32 --exp-avg-dtype bf16
    --exp-avg-sq-dtype bf16`` (for bf16 weights a comment: Transformer Engine keeps
    remainders there, no flag) | ``optim.config.use_precision_aware_optimizer``,
    ``exp_avg_dtype`` / ``exp_avg_sq_dtype`` (``main_params_dtype`` left at its fp32 default;
    ``store_param_remainders: false`` for bf16 weights) | an error | an error
pp > 1 (NeMo)
    ``trainer.strategy.pipeline_dtype`` = the training dtype (``torch.bfloat16`` /
    ``torch.float16``): the dtype of the activations sent between stages
tp > 1 or cp > 1 (Megatron-LM)
    ``export CUDA_DEVICE_MAX_CONNECTIONS=1``: ``validate_args`` asserts it on GPUs before
    Blackwell (one CUDA connection orders the communication kernels before the compute they
    overlap), except under Megatron-FSDP, where it asserts the opposite
nodes x GPUs per node (per host, not per NVLink domain)
    comment (torchrun line) | ``trainer.num_nodes``, ``trainer.devices`` | comment |
    ``plan_parallelism.nodes``, ``gpus_per_node``
ep (MoE models only)
    ``--expert-model-parallel-size`` with ``--expert-tensor-parallel-size 1`` and the expert
    shape (``--num-experts``, ``--moe-router-topk``, ``--moe-ffn-hidden-size``,
    ``--moe-shared-expert-intermediate-size``, ``--moe-layer-freq``), plus
    ``--moe-token-dispatcher-type alltoall`` (the model costs all-to-all dispatch; Megatron-Core's
    default is allgather) and ``--moe-grouped-gemm`` |
    ``trainer.strategy.expert_model_parallel_size`` and ``model.config.num_moe_experts`` ...,
    ``moe_token_dispatcher_type = alltoall``, ``moe_grouped_gemm = true`` |
    ``parallelism.expert_parallel_degree`` (an error unless ep divides dp_shard_size * cp * tp,
    the ranks torchtitan's mesh takes it from) | ``plan_parallelism.expert`` (*)
placement (*_intra)
    default rank order tp-cp-dp-pp, or ``--use-tp-pp-dp-mapping`` when that order gives the plan's
    placement | the same, ``trainer.strategy.use_tp_pp_dp_mapping``; comment when no stock order
    gives it | comment when not the mesh order (pp, dp, cp, tp) | ``plan_parallelism.intra_node``

``*`` DeepSpeed's JSON has no standard keys for tensor, pipeline or sequence parallelism:
they are set in code (Megatron-DeepSpeed's ``--tensor-model-parallel-size``, ``PipelineModule(
num_stages=...)``, Ulysses' sequence-parallel group); the plan's values sit under the custom key
``plan_parallelism``, which DeepSpeed ignores, for the launch script to read. (DeepSpeed's
``pipeline`` section has no stage-count key the engine uses, and ``tensor_parallel.autotp_size``
is AutoTP for Hugging Face models, not Megatron-style tensor parallelism.)

torchtitan: fp16 is not offered (bf16 is emitted); the
model shape comes from ``[model] name/flavor``, not from the job config.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Callable

from planner.model.errors import InputError
from planner.model.evaluate import TIGHT_MEMORY_CAVEAT, UNCOUNTED_PEAK_GIB, evaluate
from planner.model.frameworks import (OVERLAP_KNOBS, SHARDING_MODES, compiled_loss,
                                      cp_exchange, framework_violations, offload_violations,
                                      on_megatron_core, sharding_refusal, te_holds_master,
                                      torchao_float8)
from planner.model.terms import (LOW_PRECISIONS, keeps_remainders, reduce_dtype,
                                  selective_recompute)
from planner.model.instance import Instance
from planner.model.plan import ORDER, Plan, default_placement
from planner.model.rules import violations
from planner.model.schema import MODELLED_MODULES
from planner.model.words import stage_words

FORMATS = ("megatron", "nemo", "torchtitan", "deepspeed")

TP_PP_DP_ORDER = ("tp", "pp", "dp", "cp")       # --use-tp-pp-dp-mapping ("tp-pp-dp", cp = 1)


def emit(inst: Instance, plan: Plan, fmt: str) -> str:
    """Launch configuration text for ``plan`` in one of :data:`FORMATS`.

    Raises :class:`~planner.model.errors.InputError` for an unknown format, or for a plan the
    format's framework cannot launch, naming each reason: a structural rule it breaks (a global
    batch that is not a whole number of micro-batches, pp * vp not dividing the layers, ...), a
    framework rule (:func:`~planner.model.frameworks.framework_violations`: sharding modes,
    HSDP, expert grid, interleaving, context parallelism, Megatron-LM's overlap checks), a host
    offload rule (:func:`~planner.model.frameworks.offload_violations`) or a sharding mode the
    framework refuses for the precision (:func:`~planner.model.frameworks.sharding_refusal`).

    Example
    -------
    >>> from planner.model.instance import load_instance                 # doctest: +SKIP
    >>> from planner.model.plan import plan_from_spec                    # doctest: +SKIP
    >>> inst = load_instance("instances/gpt3-175b-a100.toml")      # doctest: +SKIP
    >>> print(emit(inst, plan_from_spec(inst, inst.spec.plan), "megatron"))  # doctest: +SKIP
    """
    try:
        writer = _WRITERS[fmt]
    except (KeyError, TypeError):
        raise InputError(f"unknown launch format \"{fmt}\"; expected one of: "
                         + ", ".join(FORMATS)) from None
    problems = (_launch_problems(inst, plan) + framework_violations(fmt, plan)
                + offload_violations(fmt, plan, inst.spec.training))
    refused = sharding_refusal(inst.spec.training, fmt, plan.dp_sharding)
    if refused:
        problems.append(refused)
    m = inst.model
    if on_megatron_core(fmt) and m.moe and m.shared_experts and m.linear_bias:
        problems.append("shared_experts with linear_bias = true: Megatron-Core builds shared "
                        "experts without biases (SharedExpertMLP asserts add_bias_linear is "
                        "false, moe/shared_experts.py); set [model] linear_bias = false")
    named = inst.spec.constraints.framework
    if problems and named not in (None, fmt):
        # the plan was costed under another framework's rules, by the user's choice: say how to
        # get one that this framework runs
        problems.append(f"the plan was costed under constraints.framework = \"{named}\"; set "
                        f"framework = \"{fmt}\" (or leave it out: plan solve --emit {fmt} then "
                        f"solves under {fmt}'s rules) for a plan {fmt} runs")
    if problems:
        raise InputError(f"plan {plan.label()} cannot be written as a {fmt} launch", problems)
    return writer(inst, plan)


def _launch_problems(inst: Instance, plan: Plan) -> list[str]:
    """The structural rules the plan breaks (:mod:`planner.model.rules`), without the
    ``[constraints]`` what-ifs: a framework could not launch it."""
    return violations(inst, plan.grid, plan.knobs, what_ifs=False)


# ---------------------------------------------------------------------------------------- helpers

def _per_host(plan: Plan) -> int:
    """GPUs per host, the count a launcher starts per node (GB200: 4, not the 72 of the
    NVLink domain)."""
    return plan.gpus // plan.nodes


def _segment(plan: Plan) -> str:
    """What the plan's ``*_intra`` factors fill: a node, or on rack-scale systems (GB200: 4
    GPUs per host, 72 per NVLink domain) an NVLink segment of several hosts."""
    per_host = _per_host(plan)
    if plan.node_size == per_host:
        return "node"
    return (f"NVLink segment of {plan.node_size} GPUs ({plan.node_size // per_host} hosts of "
            f"{per_host})")


def _rank_order(plan: Plan) -> str | None:
    """The Megatron-Core rank order that gives the plan's placement: "default" (tp-cp-ep-dp-pp),
    "tp-pp-dp" (``use_tp_pp_dp_mapping``, cp = 1 only) or None (no stock order does)."""
    node = plan.node_size
    if _intra(plan) == _placed(plan, node, ORDER):
        return "default"
    if plan.cp == 1 and _intra(plan) == _placed(plan, node, TP_PP_DP_ORDER):
        return "tp-pp-dp"
    return None


def _megatron_fsdp(plan: Plan) -> bool:
    """Whether the plan runs on Megatron-FSDP (gradients or parameters sharded)."""
    return plan.dp_sharding in ("optim_grads", "optim_grads_params")


def _op_selective(inst: Instance, plan: Plan) -> bool:
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
_OP_SELECTIVE = ("selective recompute \"op\": cannot express; the plan costs torchtitan's "
                 "op-level policy (saves the outputs of every second matmul and of attention, "
                 "recomputes the rest), while Megatron-Core's selective recompute (recompute "
                 "module core_attn) recomputes only the attention core: the memory and time of "
                 "the run differ from the plan's")


def _intra(plan: Plan) -> dict[str, int]:
    return {d: getattr(plan, f"{d}_intra") for d in ORDER}


def _placed(plan: Plan, node_size: int, order: tuple[str, ...]) -> dict[str, int]:
    """Intra-node factors a launcher filling nodes in ``order`` (innermost first) produces."""
    return default_placement({d: getattr(plan, d) for d in order}, node_size, order)


def _fmt_intra(f: dict[str, int]) -> str:
    return ", ".join(f"{d}_intra={f[d]}" for d in ORDER)


def _ep(plan: Plan) -> int:
    return getattr(plan, "ep", 1)


def _moe(inst: Instance) -> dict[str, object] | None:
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


def _mxfp8_params(inst: Instance) -> bool:
    """MXFP8 parameters: all-gathered in 16 bits through the gradient buffer (Megatron-LM
    ``--reuse-grad-buf-for-mxfp8-param-ag``, NeMo ``reuse_grad_buf_for_mxfp8_param_ag``)."""
    tr = inst.spec.training
    return tr.precision == "fp8" and tr.fp8_recipe == "mxfp8" and bool(tr.fp8_param_gather)


def _newer_schedule_note(plan: Plan) -> list[str]:
    """Megatron-LM and NeMo exports of a plan that interleaves with p2p overlap and has a
    steady phase: the schedule the model costs is the one before Megatron-LM #4047, which the
    flags cannot choose (its send wait comes with deallocate_pipeline_outputs, which
    Megatron-LM's training sets); the plan's caveats give the time the newer one adds."""
    from planner.model.evaluate import P2P_4047_CAVEAT, p2p_since_4047_s

    if p2p_since_4047_s(plan, 1.0, 0.0) <= 0:        # (per unit transfer: any more exposed?)
        return []
    return [P2P_4047_CAVEAT + "; the plan's caveats give how much longer its step then runs"]


def _overlaps(plan: Plan) -> dict[str, bool]:
    """The plan's overlap switches by name. The plan holds them as they run and as the model
    costs them (``Plan.__post_init__``: parameter-gather overlap only with a sharded mode,
    tensor-parallel overlap and sequence parallelism only at tp > 1, p2p overlap only when
    interleaved, the expert all-to-all overlap where Megatron-Core runs it)."""
    return {name: getattr(plan, name) for name in OVERLAP_KNOBS}


def _mla_widths(m) -> dict[str, int]:
    """Multi-head latent attention's widths under Megatron-Core's names (``q_lora_rank`` only
    where the queries are compressed), as [model] gives them."""
    keys = ("q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim")
    return {k: getattr(m, k) for k in keys if getattr(m, k) is not None}


def _layers_per_stage(inst: Instance, plan: Plan) -> int:
    """Decoder layers of a (middle) virtual stage."""
    return (inst.model.layers + plan.knobs.padded_layers) // (plan.pp * plan.vp)


def _uneven(plan: Plan) -> bool:
    return plan.knobs.uneven


def _header(inst: Instance, plan: Plan, what: str, torchrun: bool = True) -> list[str]:
    per_node = _per_host(plan)
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
        + ([_BF16_STATES] if _bf16_without_master(inst) else []) \
        + ([_EXPANDABLE] if inst.spec.training.expandable_segments else [])


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
_EXPANDABLE = ("memory: the plan's limit keeps no fragmentation share, as PyTorch's caching "
               "allocator runs with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
               "([training] expandable_segments): set it in the launch environment")


def _bf16_without_master(inst: Instance) -> bool:
    """bf16 optimizer states with no master copy (NeMo 1's distributed_fused_adam), which no
    export can write; with ``store_param_remainders`` they are Megatron-Core's precision-aware
    optimizer with bf16 moments, which the Megatron and NeMo exports write."""
    tr = inst.spec.training
    return (tr.optimizer_dtype == "bf16" and not tr.store_param_remainders
            and tr.main_params_dtype is None)


def _bf16_moments_fp32_master(inst: Instance) -> bool:
    """bf16 Adam moments beside a whole fp32 master (``[training] main_params_dtype``):
    Megatron-Core's precision-aware optimizer, which the Megatron and NeMo exports write."""
    tr = inst.spec.training
    return tr.optimizer_dtype == "bf16" and tr.main_params_dtype == "fp32"


#: what the exports say of ``[training] optimizer_dtype = "bf16"`` without a master copy, which
#: none of them can write
_BF16_STATES = ("optimizer_dtype bf16: cannot express; the plan's memory counts bf16 Adam "
                "moments and no master copy (NeMo 1's distributed_fused_adam with optim.dtype: "
                "bf16), while this framework keeps fp32 main parameters and moments: the plan "
                "may not fit as written")


def _comments(lines: list[str], prefix: str = "# ") -> list[str]:
    out = []
    for line in lines:
        out += textwrap.wrap(line, width=100, initial_indent=prefix, subsequent_indent=prefix + "  ",
                             break_on_hyphens=False, break_long_words=False)
    return out


def _stages_text(plan: Plan) -> str:
    layers = plan.stage_layers or []
    return ", ".join(str(n) for n in layers) + f" (pp={plan.pp}, vp={plan.vp})"


# --------------------------------------------------------------------------------------- Megatron

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


def _runs_expr(pattern: list[int]) -> str:
    """A per-layer 0 / 1 list as the Python list expression Megatron-LM's list-valued flags
    evaluate (arguments.py _eval_pattern), in runs: ``([0]*21+[1]*3)``."""
    runs: list[list[int]] = []
    for x in pattern:
        if runs and runs[-1][0] == x:
            runs[-1][1] += 1
        else:
            runs.append([x, 1])
    return "(" + "+".join(f"[{x}]*{n}" if n > 1 else f"[{x}]" for x, n in runs) + ")"


def _megatron_window(m) -> list[str]:
    """:func:`window_config` as Megatron-LM arguments (``--window-size`` takes ``left,right``,
    ``--window-attn-skip-freq`` an integer or a quoted list expression)."""
    c = window_config(m)
    if not c:
        return []
    left, right = c["window_size"]
    args = [f"--window-size {left},{right}"]
    skip = c.get("window_attn_skip_freq")
    if isinstance(skip, int):
        args.append(f"--window-attn-skip-freq {skip}")
    elif skip is not None:
        args.append(f"--window-attn-skip-freq '{_runs_expr(skip)}'")     # quoted for the shell
    return args


def _window_words(m) -> str:
    """The sliding window in words, for the exports that take the model from elsewhere."""
    return (f"sliding-window attention (each query attends to itself and the {m.window_left} "
            f"tokens before it, in {m.windowed_extent}"
            + f"; Megatron-Core window_size ({m.window_left}, 0)"
            + (f", window_attn_skip_freq {m.window_attn_skip_freq}"
               if isinstance(m.window_attn_skip_freq, int) else "") + ")")


def _megatron_norm_bias(m) -> list[str]:
    """:func:`norm_bias_config` as Megatron-LM arguments (its defaults are LayerNorm, a bias on
    every linear layer and no QK norm, as the model's are)."""
    c = norm_bias_config(m)
    args = [f"--normalization {c['normalization']}"] if c["normalization"] != "LayerNorm" else []
    if not c["add_bias_linear"]:
        args.append("--disable-bias-linear")
    if c["add_qkv_bias"]:
        args.append("--add-qkv-bias")
    if c["qk_layernorm"]:
        args.append("--qk-layernorm")
    if c["qk_l2_norm"]:
        args.append("--qk-l2-norm")
    if c["softmax_type"] != "vanilla":
        args.append(f"--softmax-type {c['softmax_type']}")
    return args


def _norm_bias_words(m) -> str:
    """The norms and biases in words, for the exports that take the model from elsewhere."""
    biases = ("a bias on every linear layer" if m.linear_bias
              else "a QKV bias only" if m.has_qkv_bias else "no linear biases")
    return (f"{'RMSNorm' if m.normalization == 'rmsnorm' else 'LayerNorm'}"
            + (" (QK norm too)" if m.qk_norm else " (QK L2 norm too)" if m.qk_l2_norm else "")
            + f", {biases}"
            + (f", attention sinks (softmax_type {m.softmax_type})"
               if m.softmax_type != "vanilla" else ""))


def _megatron(inst: Instance, plan: Plan) -> str:
    m = inst.model
    precision = inst.spec.training.precision
    node = plan.node_size       # (the NVLink segment the placement fills)
    intra = _intra(plan)
    order = _rank_order(plan)
    comments = _header(inst, plan, "Megatron-LM pretrain_gpt.py arguments")
    comments.append(f"data-parallel size {plan.dp} is implied: world size / (tensor * pipeline * "
                    f"context) = {plan.gpus} / ({plan.tp}*{plan.pp}*{plan.cp})")
    extra: list[str] = []
    if order == "default":
        comments.append(
            "rank order: Megatron's default (tp innermost, then cp, dp, pp) fills each "
            f"{_segment(plan)} with {_fmt_intra(intra)}, the placement the plan assumes")
    elif order == "tp-pp-dp":
        comments.append(
            f"rank order: the plan places {_fmt_intra(intra)} per {_segment(plan)}, not "
            "Megatron's default (tp innermost, then cp, dp, pp); --use-tp-pp-dp-mapping "
            "(order tp-pp-dp) gives it")
        extra.append("--use-tp-pp-dp-mapping")
    else:
        comments.append(
            f"rank order: the plan places {_fmt_intra(intra)} per {_segment(plan)}, which "
            f"Megatron's default order (tp innermost, then cp, dp, pp) does not give (it gives "
            f"{_fmt_intra(_placed(plan, node, ORDER))}); order the hosts or ranks to match, "
            "or expect the communication times to differ from the plan's")
    if precision in LOW_PRECISIONS:
        comments.append(f"{precision} needs Transformer Engine (--transformer-impl "
                        "transformer_engine)")
    if (note := _fp8_library_note(inst, "megatron")) is not None:
        comments.append(note)
    if inst.kernel_stack == "pytorch":
        comments.append(_EAGER_ON_TE)
    comments.append(f"vocabulary {m.vocab} comes from the tokenizer arguments (not emitted)")
    comments.append("not emitted, as they do not change the cost: "
                    + ("--rotary-base (Megatron-LM's default 10000; Llama 3 trains with "
                       "500000), " if m.position_embedding == "rope" else "")
                    + "--norm-epsilon, the initialisation and the optimizer's hyper-parameters: "
                    "take them from the model's own recipe")
    if _op_selective(inst, plan):
        comments.append(_OP_SELECTIVE)
    env: list[str] = []
    if (plan.tp > 1 or plan.cp > 1) and _megatron_fsdp(plan):
        # megatron/training/arguments.py validate_args: Megatron-FSDP asserts
        # CUDA_DEVICE_MAX_CONNECTIONS != "1" ("FSDP requires CUDA_DEVICE_MAX_CONNECTIONS > 1 or
        # unset") and with tensor / context parallelism only warns
        comments.append("tensor or context parallelism with Megatron-FSDP: validate_args "
                        "requires CUDA_DEVICE_MAX_CONNECTIONS unset or above 1 (it only warns "
                        "that tensor parallelism prefers 1): no export line")
    elif plan.tp > 1 or plan.cp > 1:
        # megatron/training/arguments.py validate_args: with tensor or context parallelism on a
        # GPU before Blackwell, it asserts CUDA_DEVICE_MAX_CONNECTIONS == "1"
        comments.append("tensor or context parallelism: Megatron's validate_args requires "
                        "CUDA_DEVICE_MAX_CONNECTIONS=1 (before Blackwell GPUs), set by the export "
                        "line; the lines after it are the arguments of pretrain_gpt.py")
        env.append("export CUDA_DEVICE_MAX_CONNECTIONS=1")
    if inst.spec.training.expandable_segments:
        env.append("export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")

    args: list[str] = [
        f"--tensor-model-parallel-size {plan.tp}",
        f"--pipeline-model-parallel-size {plan.pp}",
        f"--context-parallel-size {plan.cp}",
    ]
    exchange = cp_exchange(inst.spec.training, inst.spec.constraints.framework)
    if exchange != "p2p":
        # (Megatron-LM's default is p2p, the ring)
        args.append(f"--cp-comm-type {exchange}")
    if plan.pipeline_layout:
        # the layout string sets the whole split, the interleaving with it (validate_args
        # derives the virtual stages from it and refuses the other layout flags beside it)
        args.append(f"--pipeline-model-parallel-layout '{plan.pipeline_layout}'")
    elif plan.vp > 1 and _uneven(plan):
        # an uneven split is given per rank; interleaving then counts chunks per rank
        args.append(f"--num-virtual-stages-per-pipeline-rank {plan.vp}")
    elif plan.vp > 1:
        args.append(f"--num-layers-per-virtual-pipeline-stage {_layers_per_stage(inst, plan)}")
    if plan.first_stage_layers:
        args.append(f"--decoder-first-pipeline-num-layers {plan.first_stage_layers}")
    if plan.last_stage_layers:
        args.append(f"--decoder-last-pipeline-num-layers {plan.last_stage_layers}")
    if plan.account_for_embedding:
        args.append("--account-for-embedding-in-pipeline-split")
    if plan.account_for_loss:
        args.append("--account-for-loss-in-pipeline-split")
    if _uneven(plan):
        comments.append("pipeline layout: decoder layers per rank " + _stages_text(plan))
    args += [f"--micro-batch-size {plan.micro_batch}", f"--global-batch-size {plan.global_batch}"]
    if plan.sequence_parallel:                     # (off at tp = 1: Plan.__post_init__)
        args.append("--sequence-parallel")
    args += _megatron_sharding(inst, plan, comments)
    args += _megatron_offload(plan)
    modules = recompute_modules(inst, plan)
    if modules:
        # (Megatron-LM examples/megatron_fsdp/sbatch_mfsdp_deepseek_v3.sh writes it so)
        args += ["--recompute-granularity selective",
                 "--recompute-modules " + " ".join(modules)]
    elif plan.recompute == "selective":
        args.append("--recompute-activations")
    elif plan.recompute == "full" and plan.recompute_layers:
        # block: the first N layers of each virtual stage recompute, the rest keep activations
        args += ["--recompute-granularity full", "--recompute-method block",
                 f"--recompute-num-layers {plan.recompute_layers}"]
    elif plan.recompute == "full":
        args += ["--recompute-granularity full", "--recompute-method uniform",
                 "--recompute-num-layers 1"]
    # overlap flags (megatron/training/arguments.py): --overlap-grad-reduce and
    # --overlap-param-gather (validate_args: the latter needs the former and the distributed
    # optimizer), --tp-comm-overlap (a TransformerConfig flag; needs sequence parallelism and
    # Transformer Engine); p2p overlap is on by default when interleaved and switched off by
    # --no-overlap-p2p-communication (older Megatron-LM, before Oct 2023: --overlap-p2p-communication)
    # (the switches validate_args refuses together are framework_violations', checked by emit)
    ov = _overlaps(plan)
    if ov["overlap_grad_reduce"]:
        args.append("--overlap-grad-reduce")
    if ov["overlap_param_gather"]:
        args.append("--overlap-param-gather")
    if ov["tp_comm_overlap"]:
        args.append("--tp-comm-overlap")
        comments.append("--tp-comm-overlap needs Transformer Engine (userbuffers); "
                        "--tp-comm-overlap-cfg may name a tuned split configuration")
    if plan.vp > 1 and not ov["overlap_p2p_comm"]:
        args.append("--no-overlap-p2p-communication")
    comments += _newer_schedule_note(plan)
    if ov["overlap_moe_expert_parallel_comm"]:
        # Megatron-Core's MoE README: "Batch-level overlapping to hide EP-A2A communication
        # (--overlap-moe-expert-parallel-comm --delay-wgrad-compute)"
        args += ["--overlap-moe-expert-parallel-comm", "--delay-wgrad-compute"]
        comments.append("--overlap-moe-expert-parallel-comm wants a larger "
                        "CUDA_DEVICE_MAX_CONNECTIONS than tensor / context parallelism's 1 on "
                        "Hopper and before (Megatron-LM validate_args warning)")
    args += extra
    args += [
        f"--num-layers {m.layers}",
        f"--hidden-size {m.hidden}",
        f"--num-attention-heads {m.heads}",
        f"--ffn-hidden-size {m.ffn}",
        f"--seq-length {m.seq_len}",
        f"--max-position-embeddings {m.seq_len}",
    ]
    if m.kv < m.heads:
        args += ["--group-query-attention", f"--num-query-groups {m.kv}"]
    if m.head_dim is not None:
        args.append(f"--kv-channels {m.head_dim}")
    if m.mla:
        # multi-head latent attention (Megatron-LM arguments.py _add_mla_args; its
        # --q-lora-rank default None is queries not compressed)
        args.append("--multi-latent-attention")
        args += [f"--{key.replace('_', '-')} {value}" for key, value in _mla_widths(m).items()]
        if m.head_dim is None and m.hidden % m.heads:
            # validate_args asserts hidden % heads == 0 unless --kv-channels is given, which
            # MLA does not read (its widths are the ones above): GLM-4.7-Flash's 2048 / 20
            args.append(f"--kv-channels {m.v_head_dim}")
    if m.mtp_layers:
        args.append(f"--mtp-num-layers {m.mtp_layers}")   # (arguments.py, the mtp group)
    if m.gated_mlp:
        args.append("--swiglu")
    elif m.activation == "squared_relu":
        args.append("--squared-relu")
        if m.linear_bias:
            # the fused bias-activation kernel is GeLU's: TransformerConfig raises for squared
            # ReLU with it, and only --disable-bias-linear clears it (arguments.py)
            args.append("--no-bias-gelu-fusion")
    if not m.tied_embeddings:
        args.append("--untie-embeddings-and-output-weights")
    if m.position_embedding == "rope":
        args.append("--position-embedding-type rope")
    args += _megatron_norm_bias(m)
    args += _megatron_window(m)
    if not m.dropout:
        args += ["--attention-dropout 0.0", "--hidden-dropout 0.0"]
    moe = _moe(inst)
    if moe:
        args += [f"--num-experts {moe['experts']}", f"--moe-router-topk {moe['top_k']}",
                 f"--moe-ffn-hidden-size {moe['ffn']}"]
        if m.linear_bias:
            # TEGroupedMLP asserts not (add_bias_linear and bias_dropout_fusion), and the
            # fusion is on by default (moe/experts.py)
            args.append("--no-bias-dropout-fusion")
        if moe["shared_ffn"]:
            args.append(f"--moe-shared-expert-intermediate-size {moe['shared_ffn']}")
        if moe["freq"] != 1:
            args.append(f"--moe-layer-freq '{moe['freq']}'")     # quoted for the shell
        if moe["score"] != "softmax":
            args.append(f"--moe-router-score-function {moe['score']}")
        if moe["pre_softmax"]:
            args.append("--moe-router-pre-softmax")
        # the plan's expert grid is ep x expert-dp (expert tensor parallelism 1); Megatron's
        # default expert tensor parallel size is the dense tp
        args += [f"--expert-model-parallel-size {_ep(plan)}", "--expert-tensor-parallel-size 1"]
        # TransformerConfig.moe_token_dispatcher_type (allgather | alltoall | flex, default
        # allgather) and moe_grouped_gemm, flags of megatron/training/arguments.py: the model
        # prices the all-to-all dispatch and combine, and one grouped GEMM for the local experts
        dispatcher = inst.spec.training.moe_token_dispatcher
        if dispatcher == "alltoall":
            args += ["--moe-token-dispatcher-type alltoall", "--moe-grouped-gemm"]
        else:               # the flex dispatcher with the plan's backend (deepep / hybridep)
            args += ["--moe-token-dispatcher-type flex",
                     f"--moe-flex-dispatcher-backend {dispatcher}", "--moe-grouped-gemm"]
    if precision == "fp16":
        args.append("--fp16")
    else:
        args.append("--bf16")
        if precision == "nvfp4":
            # Megatron-Core's NVFP4 (TE NVFP4BlockScaling), as Megatron-Bridge's
            # bf16_with_nvfp4_mixed sets it; FP4 parameters (--fp4-param-gather) not costed
            args += ["--fp4-format e2m1", "--fp4-recipe nvfp4"]
            if inst.spec.training.fp4_param_gather:
                args.append("--fp4-param-gather")
        if precision == "fp8":
            recipe = inst.spec.training.fp8_recipe
            # MXFP8 in e4m3 throughout, as Megatron-Bridge's bf16_with_mxfp8_mixed sets it
            args.append("--fp8-format " + ("e4m3" if recipe == "mxfp8" else "hybrid"))
            if recipe:
                args.append(f"--fp8-recipe {recipe}")
            if inst.spec.training.fp8_param_gather:
                args.append("--fp8-param-gather")
                if _mxfp8_params(inst):
                    # the 16-bit all-gather through the gradient buffer the model costs
                    args.append("--reuse-grad-buf-for-mxfp8-param-ag")
    lines = _comments(comments) + env
    lines += [a + " \\" for a in args[:-1]] + [args[-1]]
    return "\n".join(lines) + "\n"


def _megatron_sharding(inst: Instance, plan: Plan, comments: list[str]) -> list[str]:
    """The sharding mode as Megatron-LM arguments: ``--use-distributed-optimizer`` (optim), the
    Megatron-FSDP switch with ``--data-parallel-sharding-strategy`` (optim_grads,
    optim_grads_params; Megatron-FSDP user guide: it needs the distributed optimizer and
    ``--no-gradient-accumulation-fusion``; validate_args asserts ``--ckpt-format
    fsdp_dtensor``), the shard group's replicas
    (``--num-distributed-optimizer-instances``) and ``--grad-reduce-in-bf16``."""
    mode, args = plan.dp_sharding, []
    if _megatron_fsdp(plan):
        args += ["--use-megatron-fsdp", f"--data-parallel-sharding-strategy {mode}",
                 "--no-gradient-accumulation-fusion", "--ckpt-format fsdp_dtensor"]
        if mode == "optim_grads_params" and not plan.reshard_after_forward:
            comments.append("the plan keeps gathered parameters from forward to backward "
                            "(reshard_after_forward = false); Megatron-FSDP has no switch for it "
                            "here: expect its default policy")
    if mode != "none":
        args.append("--use-distributed-optimizer")
    if keeps_remainders(inst, plan.knobs):
        # the master weights as remainders: Megatron-Core's precision-aware optimizer, whose
        # OptimizerConfig.store_param_remainders is on by default (TE >= 2.1); under optimizer
        # offload _megatron_offload already passes the flag
        args.append("--use-precision-aware-optimizer")
        bf16_moments = inst.spec.training.optimizer_dtype == "bf16"
        if bf16_moments:
            args += ["--exp-avg-dtype bf16", "--exp-avg-sq-dtype bf16"]
        comments.append("master weights stored as 16-bit remainders (store_param_remainders, "
                        "OptimizerConfig's default with --use-precision-aware-optimizer from "
                        "Transformer Engine 2.1; "
                        + ("Adam moments in bf16" if bf16_moments
                           else "main gradients and Adam moments stay fp32") + ")"
                        + ("; with the default --fp8-recipe delayed (under current scaling "
                           "Megatron-Core keeps a whole fp32 master)"
                           if inst.spec.training.precision == "fp8" else ""))
    if _bf16_moments_fp32_master(inst):
        # (under optimizer offload _megatron_offload already passes the first flag)
        args += ([] if plan.optimizer_offload else ["--use-precision-aware-optimizer"]) + [
            "--main-params-dtype fp32", "--exp-avg-dtype bf16", "--exp-avg-sq-dtype bf16"]
        comments.append("Adam moments in bf16 beside fp32 master weights (main_params_dtype)"
                        + ("" if not te_holds_master(inst.spec.training) else
                           "; cannot express the whole master for bf16 weights: Megatron-Core "
                           "hands them to Transformer Engine's FusedAdam, which keeps the "
                           "master as 16-bit remainders (OptimizerConfig.store_param_remainders"
                           ", true by default, has no flag): the run keeps 6 bytes of states a "
                           "parameter where the plan counts 8"))
    if mode != "none" and plan.dp_replicate > 1:
        comments.append(f"HSDP: shard group of {plan.dp_shard_size} data-parallel ranks, "
                        f"{plan.dp_replicate} replicas across nodes")
        args.append(f"--num-distributed-optimizer-instances {plan.dp_replicate}")
    if reduce_dtype(inst) == "bf16" and inst.spec.training.precision != "fp16":
        args.append("--grad-reduce-in-bf16")
    return args


def _megatron_offload(plan: Plan) -> list[str]:
    """Host offload as Megatron-LM arguments (megatron/training/arguments.py): the optimizer
    on the CPU (``--optimizer-cpu-offload`` with all of it, ``--optimizer-offload-fraction
    1.0``; validate_args requires ``--use-precision-aware-optimizer``; the transfers overlap
    the CPU step as the model costs them, ``--overlap-cpu-optimizer-d2h-h2d``) and the
    activations of N layers (``--cpu-offloading-num-layers N``: Megatron-LM has no
    ``--cpu-offloading`` flag, validate_args switches offloading on from the layer count and
    TransformerConfig offloads activations, not weights, by default; checked with
    tools/check_exports.py against Megatron-LM d98e8a64)."""
    args = []
    if plan.optimizer_offload:
        args += ["--optimizer-cpu-offload", "--optimizer-offload-fraction 1.0",
                 "--overlap-cpu-optimizer-d2h-h2d", "--use-precision-aware-optimizer"]
    if plan.offload_layers:
        args += [f"--cpu-offloading-num-layers {plan.offload_layers}"]
    return args


# ------------------------------------------------------------------------------------------ NeMo

def _yaml_scalar(v: object) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, list):
        return "[" + ", ".join(_yaml_scalar(x) for x in v) + "]"
    return str(v)


def _yaml(tree: dict, indent: int = 0) -> list[str]:
    out = []
    for key, val in tree.items():
        pad = "  " * indent
        if isinstance(val, dict):
            out.append(f"{pad}{key}:")
            out += _yaml(val, indent + 1)
        else:
            out.append(f"{pad}{key}: {_yaml_scalar(val)}")
    return out


def _nemo_moe(inst: Instance) -> dict[str, object]:
    moe = _moe(inst)
    if not moe:
        return {}
    out = {"num_moe_experts": moe["experts"], "moe_router_topk": moe["top_k"],
           "moe_ffn_hidden_size": moe["ffn"]}
    if moe["shared_ffn"]:
        out["moe_shared_expert_intermediate_size"] = moe["shared_ffn"]
    out["moe_layer_freq"] = 1 if moe["freq"] == 1 else moe["pattern"]
    # (written either way, over a recipe's own)
    out["moe_router_score_function"] = moe["score"]
    out["moe_router_pre_softmax"] = moe["pre_softmax"]
    # Megatron-Core TransformerConfig fields (megatron/core/transformer/transformer_config.py)
    dispatcher = inst.spec.training.moe_token_dispatcher
    out["moe_token_dispatcher_type"] = "alltoall" if dispatcher == "alltoall" else "flex"
    if dispatcher != "alltoall":
        out["moe_flex_dispatcher_backend"] = dispatcher
    out["moe_grouped_gemm"] = True
    return out


def _nemo(inst: Instance, plan: Plan) -> str:
    m = inst.model
    precision = inst.spec.training.precision
    full = plan.recompute == "full"
    comments = _header(inst, plan, "NeMo 2 recipe overrides (nemo.collections.llm)", torchrun=False)
    comments += [
        "apply to a pretrain recipe (recipe.trainer.strategy.tensor_model_parallel_size = ...) or as",
        "dotted key=value overrides of `nemo llm pretrain --factory <recipe>`",
    ]
    order = _rank_order(plan)
    if order == "tp-pp-dp":
        comments.append(f"rank order: the plan places {_fmt_intra(_intra(plan))} per "
                        f"{_segment(plan)}, not Megatron-Core's default (tp innermost, then cp, "
                        "dp, pp); use_tp_pp_dp_mapping (order tp-pp-dp) gives it")
    elif order is None:
        comments.append(f"rank order: the plan places {_fmt_intra(_intra(plan))} per "
                        f"{_segment(plan)}, not Megatron-Core's default (tp innermost, then cp, "
                        "dp, pp), and no stock order gives it")
    if (note := _fp8_library_note(inst, "nemo")) is not None:
        comments.append(note)
    if inst.kernel_stack == "pytorch":
        comments.append(_EAGER_ON_TE)
    if inst.spec.training.fp4_param_gather:
        comments.append("fp4_param_gather: cannot express; NeMo 2's MegatronMixedPrecision has no "
                        "FP4-parameter switch (Megatron-Bridge's MixedPrecisionConfig."
                        "fp4_param_gather, Megatron-LM --fp4-param-gather); without it the "
                        "weights stay bf16 beside their NVFP4 copies (more memory than planned)")
    if _op_selective(inst, plan):
        comments.append(_OP_SELECTIVE)
    if _mxfp8_params(inst) and _overlaps(plan)["overlap_param_gather"]:
        comments.append("reuse_grad_buf_for_mxfp8_param_ag with overlap_param_gather: NeMo 2.7's "
                        "performance scripts switch the overlap off beside it (\"not supported "
                        "with reuse_grad_buf_for_mxfp8_param_ag\", scripts/performance/"
                        "helpers.py); Megatron-Core main runs both. With an overlap-less "
                        "NeMo the parameter all-gather is exposed (slower than planned)")
    if plan.pp > 1:
        comments.append("pipeline_dtype is a torch.dtype: in a Python recipe write "
                        "recipe.trainer.strategy.pipeline_dtype = torch.bfloat16 (torch.float16 "
                        "for fp16)")
    if ((keeps_remainders(inst, plan.knobs) and inst.spec.training.optimizer_dtype == "bf16")
            or _bf16_moments_fp32_master(inst)):
        comments.append("exp_avg_dtype and exp_avg_sq_dtype are torch.dtype fields of "
                        "OptimizerConfig: in a Python recipe write "
                        "recipe.optim.config.exp_avg_dtype = torch.bfloat16 (and exp_avg_sq_dtype)")
    if _uneven(plan):
        comments.append("pipeline layout: decoder layers per rank " + _stages_text(plan))
    if m.activation == "squared_relu":
        comments.append("squared ReLU: model.config.activation_func is a callable; in a Python "
                        "recipe write recipe.model.config.activation_func = nemo.collections."
                        "llm.fn.activation.squared_relu (NeMo's Nemotron configs set it)")
    comments.append("pick a recipe whose model config matches: "
                    + ", ".join([s for s, on in (("gated (SwiGLU) MLP", m.gated_mlp),
                                                 ("squared-ReLU MLP",
                                                  m.activation == "squared_relu"),
                                                 ("rope", m.position_embedding == "rope"),
                                                 ("untied embeddings", not m.tied_embeddings))
                                 if on] + [_norm_bias_words(m)]))
    comments.append("overlaps as the plan costs them: a recipe's MegatronCommOverlapCallback "
                    "overrides these keys, so give it the same values (its tp_comm_overlap, "
                    "overlap_p2p_comm, overlap_grad_reduce, overlap_param_gather arguments)")
    comments += _newer_schedule_note(plan)
    ov = _overlaps(plan)
    if ov["tp_comm_overlap"]:
        comments.append("tp_comm_overlap: model.config.tp_comm_overlap alone does not overlap; "
                        "the trainer needs MegatronCommOverlapCallback(tp_comm_overlap=True) "
                        "among its callbacks, which sets up Transformer Engine's userbuffers "
                        "(nemo/lightning/pytorch/callbacks/megatron_comm_overlap.py, "
                        "initialize_ub)")
    fsdp = _megatron_fsdp(plan)
    replicas = plan.dp_replicate if plan.dp_sharding != "none" and plan.dp_replicate > 1 else 0
    fp32_reduce = reduce_dtype(inst) == "fp32"
    remainders = keeps_remainders(inst, plan.knobs)
    tree = {
        "trainer": {
            "num_nodes": plan.nodes,
            "devices": _per_host(plan),        # Lightning's devices: GPUs per host
            "strategy": {
                "tensor_model_parallel_size": plan.tp,
                "pipeline_model_parallel_size": plan.pp,
                "virtual_pipeline_model_parallel_size": plan.vp if plan.vp > 1 else None,
                # MegatronStrategy's names for Megatron-Core's uneven split
                **({"pipeline_model_parallel_layout": plan.pipeline_layout}
                   if plan.pipeline_layout else
                   {"num_layers_in_first_pipeline_stage": plan.first_stage_layers or None,
                    "num_layers_in_last_pipeline_stage": plan.last_stage_layers or None,
                    "account_for_embedding_in_pipeline_split": plan.account_for_embedding,
                    "account_for_loss_in_pipeline_split": plan.account_for_loss}
                   if _uneven(plan) else {}),
                "context_parallel_size": plan.cp,
                **({"expert_model_parallel_size": _ep(plan), "expert_tensor_parallel_size": 1}
                   if _moe(inst) else {}),
                "sequence_parallel": plan.sequence_parallel,
                # MegatronStrategy(pipeline_dtype: torch.dtype): the dtype of the activations
                # passed between pipeline stages
                **({"pipeline_dtype": "torch.float16" if precision == "fp16" else "torch.bfloat16"}
                   if plan.pp > 1 else {}),
                # MegatronStrategy(fsdp="megatron", ddp=DistributedDataParallelConfig(...)):
                # Megatron-Core's data-parallel overlap switches, sharding strategy and
                # gradient reduction dtype
                # Megatron-FSDP checkpoints only as fsdp_dtensor (MegatronStrategy raises for
                # another save_ckpt_format; Megatron-LM validate_args asserts it)
                **({"fsdp": "megatron", "save_ckpt_format": "fsdp_dtensor"} if fsdp else {}),
                # MegatronStrategy(use_tp_pp_dp_mapping: bool): the tp-pp-dp rank order
                **({"use_tp_pp_dp_mapping": True} if order == "tp-pp-dp" else {}),
                # a MegatronStrategy argument: __init__ copies it into the ddp config (and
                # the parallelism config), overwriting a value set in ddp (NeMo
                # nemo/lightning/pytorch/strategies/megatron_strategy.py)
                **({"num_distributed_optimizer_instances": replicas} if replicas else {}),
                "ddp": {
                    "overlap_grad_reduce": ov["overlap_grad_reduce"],
                    "overlap_param_gather": ov["overlap_param_gather"],
                    # the interleaved schedule's gathers launched together on every pipeline
                    # rank, as the runs the overlap rule is fitted on had them: Megatron-LM's
                    # CLI default (--no-align-param-gather turns it off) and NeMo's
                    # MegatronCommOverlapCallback at dp > 1, pp > 1, vp > 1; the ddp
                    # dataclass's own default is False
                    **({"align_param_gather": True}
                       if ov["overlap_param_gather"] and plan.vp > 1
                       and plan.pp > 1 and plan.dp > 1 else {}),
                    "data_parallel_sharding_strategy": {"none": "no_shard"}.get(
                        plan.dp_sharding, plan.dp_sharding),
                    "grad_reduce_in_fp32": fp32_reduce,
                },
            },
            "plugins": {
                "precision": "16-mixed" if precision == "fp16" else "bf16-mixed",
                "fp8": (("e4m3" if inst.spec.training.fp8_recipe == "mxfp8" else "hybrid")
                        if precision == "fp8" else None),
                # MegatronMixedPrecision(fp8_recipe): NeMo's default is delayed scaling
                **({"fp8_recipe": inst.spec.training.fp8_recipe}
                   if precision == "fp8" and inst.spec.training.fp8_recipe else {}),
                # MegatronMixedPrecision(fp8_param_gather): NeMo's FP8 recipes switch it on,
                # so the export says what the plan costs either way
                **({"fp8_param_gather": inst.spec.training.fp8_param_gather}
                   if precision == "fp8" else {}),
                # MXFP8 parameters gathered in 16 bits through the gradient buffer, as the
                # model costs them and as bf16_with_mxfp8_mixed() sets it (NeMo's recipes)
                **({"reuse_grad_buf_for_mxfp8_param_ag": True} if _mxfp8_params(inst) else {}),
                # MegatronMixedPrecision(fp4, fp4_recipe): NVFP4 GEMMs on bf16 weights
                **({"fp4": "e2m1", "fp4_recipe": "nvfp4"} if precision == "nvfp4" else {}),
                # (FP4 parameters: NeMo 2's MegatronMixedPrecision has no switch; a comment)
                # MegatronMixedPrecision(grad_reduce_in_fp32=True by default) overrides the ddp
                # config's value in MegatronStrategy.connect (update_config_with_dtype_overrides)
                "grad_reduce_in_fp32": fp32_reduce,
            },
        },
        "data": {
            "micro_batch_size": plan.micro_batch,
            "global_batch_size": plan.global_batch,
            "seq_length": m.seq_len,
        },
        "model": {
            "config": {
                "num_layers": m.layers,
                "hidden_size": m.hidden,
                "ffn_hidden_size": m.ffn,
                "num_attention_heads": m.heads,
                # (MLA: Megatron-Core's MLATransformerConfig fields, which NeMo's DeepSeek
                # configs subclass; it has no query groups)
                # (q_lora_rank null where the queries are not compressed: the config's
                # default, 512, would compress them)
                **({"multi_latent_attention": True, "q_lora_rank": None, **_mla_widths(m)}
                   if m.mla else {"num_query_groups": m.kv}),
                **({"kv_channels": m.head_dim} if m.head_dim is not None else {}),
                **({"mtp_num_layers": m.mtp_layers} if m.mtp_layers else {}),
                # TransformerConfig's norm and bias fields, each written (false too, so that a
                # recipe's own value does not survive the overrides)
                **norm_bias_config(m),
                **window_config(m),
                # (TransformerConfig.cp_comm_type; None runs the p2p ring, NeMo writes p2p)
                "cp_comm_type": cp_exchange(inst.spec.training, inst.spec.constraints.framework),
                # the fused bias-activation is GeLU's with a bias or SwiGLU's: TransformerConfig
                # raises for squared ReLU, or a plain GeLU MLP without biases, with it on, as
                # NeMo's GPT and Llama configs set it
                **({"bias_activation_fusion": False} if not m.gated_mlp and (
                    m.activation != "gelu" or not m.linear_bias) else {}),
                "seq_length": m.seq_len,
                "recompute_granularity": None if plan.recompute == "none" else plan.recompute,
                # (the default core_attn written too, over a recipe's own modules)
                **({"recompute_modules": recompute_modules(inst, plan) or ["core_attn"]}
                   if plan.recompute == "selective" and not _op_selective(inst, plan)
                   else {}),
                "recompute_method": ("block" if plan.recompute_layers else "uniform") if full
                else None,
                "recompute_num_layers": (plan.recompute_layers or 1) if full else None,
                # ModelParallelConfig overlap fields (Megatron-Core)
                "tp_comm_overlap": ov["tp_comm_overlap"],
                "overlap_p2p_comm": ov["overlap_p2p_comm"],
                **({"overlap_moe_expert_parallel_comm": True, "delay_wgrad_compute": True}
                   if ov["overlap_moe_expert_parallel_comm"] else {}),
                # Megatron-FSDP runs without the fused weight-gradient accumulation (as the
                # megatron export's --no-gradient-accumulation-fusion)
                **({"gradient_accumulation_fusion": False} if fsdp else {}),
                # TransformerConfig's activation offload of N layers (Megatron-Core)
                **({"cpu_offloading": True, "cpu_offloading_num_layers": plan.offload_layers,
                    "cpu_offloading_activations": True, "cpu_offloading_weights": False}
                   if plan.offload_layers else {}),
                **_nemo_moe(inst),
            },
        },
        "optim": {
            "config": {
                "use_distributed_optimizer": plan.distributed_optimizer,
                "bf16": precision != "fp16",
                "fp16": precision == "fp16",
                # Megatron-Core OptimizerConfig's optimizer offload (as the megatron export)
                **({"optimizer_cpu_offload": True, "optimizer_offload_fraction": 1.0,
                    "overlap_cpu_optimizer_d2h_h2d": True,
                    "use_precision_aware_optimizer": True} if plan.optimizer_offload else {}),
                # the master weights as remainders (Megatron-Core OptimizerConfig), where the
                # model costs them: not under optimizer offload, whose CPU step keeps fp32
                # copies (terms.keeps_remainders; the megatron export's rule too)
                **({"use_precision_aware_optimizer": True, "store_param_remainders": True}
                   if remainders else {}),
                # bf16 moments of the precision-aware optimizer (OptimizerConfig dtypes),
                # beside remainders or a whole fp32 master
                **({"exp_avg_dtype": "torch.bfloat16", "exp_avg_sq_dtype": "torch.bfloat16"}
                   if remainders and inst.spec.training.optimizer_dtype == "bf16" else {}),
                # (a whole fp32 master: remainders off where Transformer Engine would keep
                # them, frameworks.te_holds_master)
                # (main_params_dtype is left at OptimizerConfig's default, torch.float32: a
                # string there would compare unequal to it and hand the master to Transformer
                # Engine)
                **({"use_precision_aware_optimizer": True,
                    "exp_avg_dtype": "torch.bfloat16", "exp_avg_sq_dtype": "torch.bfloat16",
                    **({"store_param_remainders": False} if te_holds_master(inst.spec.training) else {})}
                   if _bf16_moments_fp32_master(inst) else {}),
            },
        },
    }
    return "\n".join(_comments(comments) + _yaml(tree)) + "\n"


# ------------------------------------------------------------------------------------ torchtitan

def _toml_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return str(v)


def _torchtitan_stages(layers: int, per_stage: int, first_less: int,
                       last_less: int) -> list[int]:
    """The decoder layers per virtual stage torchtitan 0.2.2 builds from its pipeline keys
    (distributed/pipeline_parallel.py pipeline_llm and generate_llm_fqn_per_model_part): the
    layers plus both allowances over ceil(that / layers_per_stage) virtual stages, as evenly as
    whole layers allow with the first stages one larger, the first and last stage less their
    allowance. Rank r runs stages r, r + pp, ... (the "loop" style of 1F1B and
    Interleaved1F1B); torchtitan refuses a stage count the pipeline degree does not divide.
    The export compares both with the plan's layout."""
    total = layers + first_less + last_less
    n = -(-total // per_stage)
    base, extra = divmod(total, n)
    stages = [base + (i < extra) for i in range(n)]
    stages[0] -= first_less
    stages[-1] -= last_less
    return stages


#: What a Megatron-LM / NeMo export says of a plan costed on eager PyTorch kernels
_EAGER_ON_TE = ("kernel_stack pytorch: the plan costs eager PyTorch kernels (torchtitan's "
                "default stack), while Megatron-Core runs Transformer Engine's fused ones: the "
                "run may be faster than planned (kernel_stack = \"fused\" plans for them)")


def _fp8_library_note(inst: Instance, fmt: str) -> str | None:
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


def _torchtitan_fp8_experts(plan: Plan) -> str:
    """What the torchtitan export says of a plan that costs FP8 expert GEMMs."""
    why = ("torchtitan 0.2.2's quantize.linear.float8 converts nn.Linear modules only, and "
           "GroupedExperts hold w1/w2/w3 as parameters (models/moe/moe.py)")
    refused = [f"{name} = {n}" for name, n in (("pp", plan.pp), ("cp", plan.cp)) if n > 1]
    if refused:
        how = ("its quantize.grouped_mm.float8 converter refuses pipeline and context "
               "parallelism (components/quantization/float8.py: the Float8 MoE training "
               f"prototype), and this plan has {', '.join(refused)}")
    else:
        how = ("its prototype converter quantize.grouped_mm.float8 (fqns = [\"experts\"], with "
               "torch.compile) may convert them; it is not emitted")
    return (f"fp8 experts: cannot express; the plan costs the experts' GEMMs and weight copies "
            f"in FP8, but {why}; {how}: the experts run in bf16 as written (slower than planned)")


def _torchtitan_compile(inst: Instance, plan: Plan) -> tuple[bool, list[str]]:
    """``[compile] enable`` for a plan, and what the export says of it. torch.compile is on
    where the plan's costs assume it: the fused kernel stack (Transformer Engine's figures,
    of which compiled modules are torchtitan's nearest), async tensor parallelism (torchtitan
    applies it to compiled models only: ``enable_async_tensor_parallel``) and torchao's
    float8, whose casts torchtitan's float8 guide says need compile to perform; off for eager
    modules (``kernel_stack = "pytorch"``, torchtitan's default). torchao's MXFP8 refuses
    compile beside tensor parallelism (torchtitan 0.2 components/quantization/mx.py: "TP not
    yet supported with torch.compile for mxfp8"), so such a plan runs eager."""
    tr = inst.spec.training
    stack, async_tp = inst.kernel_stack, _overlaps(plan)["tp_comm_overlap"]
    mx = tr.precision == "fp8" and tr.fp8_recipe == "mxfp8"
    ao = tr.precision == "fp8" and not mx         # (the export's quantize.linear.float8)
    if mx and plan.tp > 1:
        said = ["compile: off; torchao's MXFP8 refuses torch.compile with tensor parallelism "
                "(components/quantization/mx.py), so the layers run eager, slower than the "
                "fused kernels the plan costs"]
        if async_tp:
            said.append("tp_comm_overlap: cannot express (async tensor parallelism runs "
                        "compiled only): the tensor-parallel collectives run exposed, slower "
                        "than planned")
        return False, said
    if stack == "fused":
        why = ("Transformer Engine's figures, of which torch.compile is torchtitan's nearest"
               + ("" if tr.precision == "nvfp4" or mx else
                  "; kernel_stack = \"pytorch\" plans for its eager modules, its default"))
        return True, [f"compile: on; the plan costs fused kernels (kernel_stack = \"fused\": "
                      f"{why})"]
    if async_tp or ao:
        why = " and ".join(w for w, on in (
            ("async tensor parallelism (tp_comm_overlap) runs compiled only", async_tp),
            ("torchao's float8 casts need it to run at the speed planned", ao)) if on)
        return True, [f"compile: on, as {why}; the plan costs eager GEMM and attention "
                      "kernels (kernel_stack = \"pytorch\"), so the run may be faster than "
                      "planned"]
    return False, []


def _torchtitan(inst: Instance, plan: Plan) -> str:
    m = inst.model
    precision = inst.spec.training.precision
    node = plan.node_size       # (the NVLink segment the placement fills)
    mb, micro = plan.micro_batch, int(plan.micro_batches)
    comments = _header(inst, plan, "torchtitan 0.2 job config (--job.config_file)")
    comments.append(
        f"model shape (layers {m.layers}, hidden {m.hidden}, heads {m.heads}, "
        + (("multi-head latent attention: " + ", ".join(
            f"{k} {v}" for k, v in _mla_widths(m).items()) + ", ") if m.mla
           else f"kv heads {m.kv}, ")
        + (f"head dim {m.head_dim}, " if m.head_dim is not None else "")
        + f"ffn {m.ffn}, vocab {m.vocab}"
        + (", {experts} experts, top-{top_k}, expert ffn {ffn}".format(**_moe(inst)) if _moe(inst) else "")
        + f", {_norm_bias_words(m)}"
        + ") comes from [model] name/flavor: register a matching flavor")
    # torchtitan 0.2's llama3, llama4, deepseek_v3 and qwen3 models build RMSNorm,
    # nn.Linear(..., bias=False) layers, a SwiGLU MLP and rotary positions
    differs = [w for w, on in (
        ("LayerNorm", m.normalization != "rmsnorm"),
        ("a bias on every linear layer" if m.linear_bias else "a QKV bias",
         m.linear_bias or m.has_qkv_bias),
        ("learned positions", m.position_embedding == "learned"),
        ("a plain (not gated) " + ("squared-ReLU " if m.activation == "squared_relu" else "")
         + "MLP", not m.gated_mlp)) if on]
    if differs:
        comments.append(", ".join(differs) + ": cannot express with torchtitan 0.2's llama3, "
                        "llama4, deepseek_v3 or qwen3 models (RMSNorm, bias-free linear layers, "
                        "SwiGLU, rotary positions); a flavor of them is not the model the plan "
                        "costs")
    if m.windowed:
        # torchtitan 0.2's gpt_oss model (MoE) windows its even layers (layer_id % 2 == 0)
        # with sliding_window_size keys, the query's own included (models/attention.py
        # get_sliding_window_mask_mod), 128 in its flavors (gpt_oss/model/args.py) and not a
        # job-config key; its other models attend causally in full
        fits = m.window_attn_skip_freq == 2 and m.moe and m.window_left + 1 == 128
        comments.append(_window_words(m) + (
            ": torchtitan 0.2's gpt_oss model builds it (sliding_window_size 128, every other "
            "layer from the first); its llama3, llama4, deepseek_v3 and qwen3 models cannot"
            if fits else
            ": cannot express with torchtitan 0.2's model flavors (its gpt_oss MoE model "
            "windows every other layer from the first at 128 keys, query included; another "
            "window needs its model arguments edited; its other models have none)"))
    if m.mtp_layers:
        comments.append(f"mtp_layers {m.mtp_layers}: cannot express in torchtitan 0.2's job "
                        "config (no multi-token prediction there); the plan costs that many "
                        "prediction depths on the last stage")
    # the plan's mode is one torchtitan runs (emit() refused the others): plain DDP without
    # other parallelism, or FSDP2 / HSDP (optim_grads_params)
    ddp = plan.dp_sharding == "none"
    if ddp:
        comments.append("dp_sharding none: plain DDP (data_parallel_replicate_degree)")
    else:
        comments.append(f"dp_sharding optim_grads_params: FSDP2 over {plan.dp_shard_size} ranks"
                        + (f", {plan.dp_replicate} replicas (HSDP)" if plan.dp_replicate > 1
                           else ""))
    if plan.tp > 1:
        comments.append(f"sequence parallel: {'on' if plan.sequence_parallel else 'off'} in the "
                        "plan; torchtitan 0.2 always shards norms over the sequence under tensor "
                        "parallelism (0.3: parallelism.enable_sequence_parallel)")
    if plan.pp > 1:
        comments.append(f"local_batch_size = micro_batch * micro-batches = {mb} * {micro}, split by "
                        "the pipeline schedule into micro-batches of pipeline_parallel_microbatch_size")
    elif micro > 1:
        comments.append(f"no pipeline: local_batch_size = micro_batch; global_batch_size gives "
                        f"{micro} gradient-accumulation steps")
    if _intra(plan) != _placed(plan, node, ORDER):
        comments.append(f"rank order: the plan places {_fmt_intra(_intra(plan))} per "
                        f"{_segment(plan)}; torchtitan's mesh (pp, dp, cp, tp; tp innermost) "
                        "does not")
    compiled, said = _torchtitan_compile(inst, plan)
    comments += said
    loss_compiled = compiled_loss(inst.spec.training, inst.spec.constraints.framework,
                                  inst.kernel_stack)
    if (loss_compiled and not compiled and plan.tp > 1
            and inst.spec.training.compiled_loss is None):
        # (the layers not compiled, torchao's MXFP8 beside tensor parallelism: at tp > 1 the
        # compiled loss costs as the eager one, so nothing is compiled alone by default)
        loss_compiled = False
    if loss_compiled != compiled:
        which = "the loss alone" if loss_compiled else "the layers alone"
        comments.append(f"compile components: {which}, as the plan costs the loss's memory ("
                        + ("compiled: 4 bytes per logit at tp = 1" if loss_compiled else
                           "eager: 12 bytes per logit at tp = 1; training.compiled_loss = true "
                           "to compile it too") + ")")
    ov = _overlaps(plan)
    if not (ov["overlap_grad_reduce"] and ov["overlap_param_gather"]) and plan.dp > 1:
        comments.append("overlap: torchtitan always reduces gradients during the backward and "
                        "prefetches parameters (per-block hooks); the plan costs "
                        + " and ".join(n for n in ("overlap_grad_reduce", "overlap_param_gather")
                                       if not ov[n])
                        + " off, so the run may be faster than planned (cannot express off)")
    if ov["overlap_p2p_comm"]:
        comments.append("overlap_p2p_comm: cannot express (torchtitan's pipeline schedules have "
                        "no p2p-overlap switch); the plan costs only the warm-up's and cool-down's "
                        "transfers")
    if ov["overlap_moe_expert_parallel_comm"]:
        comments.append("overlap_moe_expert_parallel_comm: cannot express (torchtitan has no "
                        "batch-level overlap of the expert all-to-alls); the plan costs them "
                        "mostly hidden, so the run may be slower than planned")
    if ov["tp_comm_overlap"] and compiled:
        comments.append("tp_comm_overlap: enable_async_tensor_parallel, which needs "
                        "torch.compile (compile.enable)")
    if precision == "fp16":
        comments.append("fp16: torchtitan mixes in bfloat16 or float32 only; bfloat16 is emitted "
                        "(same speed and memory as fp16)")
    if plan.recompute == "full" and plan.recompute_layers:
        comments.append(f"cannot express: the plan recomputes {plan.recompute_layers} layer(s) of "
                        "each virtual stage (Megatron's block method); torchtitan's "
                        "activation_checkpoint has full (every layer) or selective per layer "
                        "frequency, not a count per stage: mode = \"full\" is emitted (slower, "
                        "less memory than planned)")
    if precision == "nvfp4":
        comments.append("nvfp4: cannot express in this TOML; the plan costs Transformer "
                        "Engine's NVFP4 GEMMs. torchtitan's own NVFP4 is an experimental "
                        "converter of torchao's kernels in its Python configs "
                        "(torchtitan/components/quantization/nvfp4.py, August 2026: Blackwell "
                        "only, every local GEMM dimension a multiple of 128, e.g. --config "
                        "llama3_8b_first_85_pct_layers_nvfp4), not in this format: bfloat16 "
                        "GEMMs are emitted (slower than planned)")
    if (note := _fp8_library_note(inst, "torchtitan")) is not None:
        comments.append(note)
    if precision == "fp8" and _moe(inst):
        comments.append(_torchtitan_fp8_experts(plan))
    if _moe(inst) and inst.spec.training.moe_token_dispatcher != "alltoall":
        comments.append("expert_parallel_comm_backend: torchtitan 0.2.1 and 0.2.2 take "
                        "standard | deepep (job_config.py; 0.2.0 has no key: drop it there, "
                        "its standard all-to-all costs more across nodes than the plan counts)"
                        + ("; hybridep: no such backend, deepep emitted, which the plan costs "
                           "alike (a token crosses to each remote node its experts sit on "
                           "once)" if inst.spec.training.moe_token_dispatcher == "hybridep"
                           else ""))
    modules = recompute_modules(inst, plan)
    if modules:
        comments.append("selective recompute of Megatron-Core's modules "
                        + ", ".join(modules) + ": cannot express; "
                        "torchtitan's per-op checkpointing is emitted, which saves matmul "
                        "outputs and recomputes the rest: its memory and time differ from the "
                        "plan's")
    elif plan.recompute == "selective" and "op" not in selective_recompute(inst):
        comments.append("selective: torchtitan's per-op checkpointing saves matmul outputs and "
                        "recomputes the rest, close to but not the same as Megatron's attention-only "
                        "selective recompute")

    sections: list[tuple[str, dict]] = []
    mx = inst.spec.training.fp8_recipe == "mxfp8"
    if precision == "fp8" and inst.spec.training.fp8_recipe == "delayed":
        comments.append("fp8_recipe delayed: cannot express (torchtitan's float8 converter "
                        "scales dynamically); tensorwise is emitted"
                        + (", whose tensor-parallel all-gathers move FP8 where the plan costs "
                           "16 bits (faster than planned)"
                           if plan.sequence_parallel
                           and torchao_float8(inst.spec.training, inst.spec.constraints.framework)
                           else ""))
    if precision == "fp8" and mx:
        comments.append("mxfp8: torchtitan's MXFP8 is torchao's (converter quantize.linear.mx, "
                        "recipe mxfp8_cublas, as dgxc-benchmarking's torchtitan DeepSeek-V3 "
                        "launch runs it); the plan costs Transformer Engine's MXFP8, whose "
                        "held activations and weight copies torchao's need not match")
    if precision == "fp8":
        sections.append(("model", {"converters": [
            "quantize.linear.mx" if mx else "quantize.linear.float8"]}))
    sections.append(("training", {
        "local_batch_size": mb * micro if plan.pp > 1 else mb,
        "global_batch_size": plan.global_batch,
        "seq_len": m.seq_len,
        "mixed_precision_param": "bfloat16",
        # (torchtitan's job config takes Literal["float32"] here, 0.2.0 to 0.2.2 and main)
        "mixed_precision_reduce": "float32",
    }))
    if reduce_dtype(inst) != "fp32":
        comments.append(f"grad_reduce_dtype {reduce_dtype(inst)}: cannot express; torchtitan's "
                        "training.mixed_precision_reduce takes \"float32\" only (its job "
                        "config's Literal), so float32 is emitted: FSDP2 reduces twice the "
                        "bytes the plan costs (slower than planned)")
    par: dict[str, object] = {
        "data_parallel_replicate_degree": plan.dp if ddp else plan.dp_replicate,
        "data_parallel_shard_degree": 1 if ddp else plan.dp_shard_size,
        "tensor_parallel_degree": plan.tp,
        # async tensor parallelism (needs torch.compile) is torchtitan's tp_comm_overlap
        "enable_async_tensor_parallel": ov["tp_comm_overlap"] and compiled,
        "pipeline_parallel_degree": plan.pp,
    }
    if not ddp:        # "default" would be true without pp, false with it: say the plan's
        par["fsdp_reshard_after_forward"] = "always" if plan.reshard_after_forward else "never"
    if plan.pp > 1:
        par["pipeline_parallel_schedule"] = "Interleaved1F1B" if plan.vp > 1 else "1F1B"
        par["pipeline_parallel_layers_per_stage"] = _layers_per_stage(inst, plan)
        # the first / last of the pp*vp virtual stages hold that many layers fewer (torchtitan
        # shortens only those two; 0: exactly pp*vp equal stages)
        k = plan.knobs
        spread = plan.vp > 1 and k.explicit_layout
        par["pipeline_parallel_first_stage_less_layers"] = 0 if spread else int(k.first_short)
        par["pipeline_parallel_last_stage_less_layers"] = 0 if spread else int(k.last_short)
        if _uneven(plan):
            comments.append("pipeline layout: decoder layers per rank " + _stages_text(plan))
        stages = _torchtitan_stages(
            m.layers, par["pipeline_parallel_layers_per_stage"],
            par["pipeline_parallel_first_stage_less_layers"],
            par["pipeline_parallel_last_stage_less_layers"])
        built = [sum(stages[r::plan.pp]) for r in range(plan.pp)]
        virtual = len(stages)
        if virtual % plan.pp:
            # (torchtitan 0.2.2 distributed/pipeline_parallel.py refuses it: "Number of
            # virtual stages ... must be divisible by" the pipeline degree)
            comments.append(
                f"cannot express: these keys make {virtual} virtual stages, which torchtitan "
                f"requires divisible by pipeline_parallel_degree {plan.pp}; list each virtual "
                "stage's modules in module_fqns_per_model_part instead")
        elif built != list(plan.stage_layers or built):
            comments.append(
                "cannot express: "
                + ("the plan spreads the first / last rank's shortfall over its "
                   f"{plan.vp} virtual stages (Megatron's first/last stage counts), while "
                   "pipeline_parallel_first/last_stage_less_layers shorten one virtual stage "
                   "only; " if spread else "")
                + "torchtitan splits the keys emitted here into decoder layers per rank "
                + ", ".join(map(str, built)) + ", not the plan's; list each virtual stage's "
                "modules in module_fqns_per_model_part instead")
    par["pipeline_parallel_microbatch_size"] = mb
    par["context_parallel_degree"] = plan.cp
    if plan.cp > 1 and inst.spec.training.cp_comm_type != "p2p":
        costed = cp_exchange(inst.spec.training, inst.spec.constraints.framework)
        kind = {"a2a": "Ulysses exchange",
                "all_gather": "key / value all-gather"}[inst.spec.training.cp_comm_type]
        comments.append(f"cp_comm_type \"{inst.spec.training.cp_comm_type}\" (Transformer "
                        f"Engine's {kind}): cannot express; torchtitan's context "
                        "parallelism is PyTorch's (context_parallel_rotate_method allgather or "
                        "alltoall rotate the key / value shards), "
                        + ("costed here as the ring, under torchtitan's rules" if costed == "p2p"
                           else "not the exchange the plan costs"))
    if _moe(inst):
        par["expert_parallel_degree"] = _ep(plan)
        par["expert_tensor_parallel_degree"] = 1
        if inst.spec.training.moe_token_dispatcher != "alltoall":
            # (0.2.x: Literal["standard", "deepep"]; the two flex backends cost alike)
            par["expert_parallel_comm_backend"] = "deepep"
    sections.append(("parallelism", par))
    ac: dict[str, object] = {"mode": plan.recompute}
    if plan.recompute == "selective":
        ac["selective_ac_option"] = "op"
    sections.append(("activation_checkpoint", ac))
    # the loss compiled where the plan costs it so (frameworks.compiled_loss: its memory),
    # the layers where _torchtitan_compile says
    parts = ["model"] * compiled + ["loss"] * loss_compiled
    sections.append(("compile", {"enable": compiled or loss_compiled,
                                 "components": parts or ["model", "loss"]}))
    if precision == "fp8" and mx:
        sections.append(("quantize.linear.mx", {"recipe_name": "mxfp8_cublas",
                                                "filter_fqns": ["output"]}))
    elif precision == "fp8":
        # tensorwise scaling is the converter's path without recipe_name: with a recipe_name
        # it asserts enable_fsdp_float8_all_gather is off (components/quantization/float8.py);
        # the FP8 all-gather under FSDP2 is the plan's FP8 parameters ([training]
        # fp8_param_gather: the model costs the layers' gathers in 1 byte only then); the
        # output layer stays 16-bit as the model costs it (torchtitan's own llama3_405b
        # config filters "output" too)
        fp8_gather = inst.spec.training.fp8_param_gather and not ddp
        sections.append(("quantize.linear.float8", {
            "enable_fsdp_float8_all_gather": fp8_gather,
            "precompute_float8_dynamic_scale_for_fsdp": fp8_gather,
            "filter_fqns": ["output"],
        }))
    lines = _comments(comments)
    for name, body in sections:
        lines += ["", f"[{name}]"] + [f"{k} = {_toml_value(v)}" for k, v in body.items()]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------- DeepSpeed

def _ds_recompute(mode: str, layers: int = 0, op_level: bool = False,
                  modules: list[str] | None = None) -> str:
    """How the model code turns the plan's recompute on under DeepSpeed (the JSON cannot);
    ``op_level``: the plan costs torchtitan's op-level selective policy, which Megatron-based
    model code has no flag for; ``modules``: Megatron-Core's recompute modules beyond the
    attention core, which Megatron-DeepSpeed's model code has none of."""
    if mode == "full" and layers:
        return (f"full for {layers} layer(s) of each pipeline stage chunk: the model code wraps "
                "those layers' forward in deepspeed.checkpointing.checkpoint (Megatron-based "
                "model code: the block-recompute flags of the megatron export)")
    if mode == "none":
        return "none: no activation checkpointing in the model code"
    if mode == "full":
        return ("full: the model code wraps every transformer layer's forward in "
                "deepspeed.checkpointing.checkpoint (Megatron-based model code: the full-"
                "recompute flags of the megatron export)")
    if modules:
        return ("selective, Megatron-Core's recompute modules " + ", ".join(modules)
                + " as the plan costs them: cannot express with Megatron-DeepSpeed's model "
                "code, whose selective recompute wraps only the attention core in "
                "deepspeed.checkpointing.checkpoint; memory and time differ from the plan's")
    if op_level:
        return ("selective, op-level as the plan costs it (torchtitan's policy: save the "
                "outputs of every second matmul and of attention, recompute the rest): cannot "
                "express with Megatron-based model code, whose selective recompute wraps only "
                "the attention core in deepspeed.checkpointing.checkpoint; the model code must "
                "apply such a per-op policy itself, or memory and time differ from the plan's")
    return ("selective: the model code checkpoints only the attention core (softmax and "
            "dropout of QK^T) with deepspeed.checkpointing.checkpoint (Megatron-based model "
            "code: the selective-recompute flag of the megatron export)")


def _deepspeed(inst: Instance, plan: Plan) -> str:
    precision = inst.spec.training.precision
    doc = {
        "train_batch_size": plan.global_batch,
        "train_micro_batch_size_per_gpu": plan.micro_batch,
        "gradient_accumulation_steps": int(plan.micro_batches),
        "bf16": {"enabled": precision in ("bf16", "fp8", "nvfp4")},
        "fp16": {"enabled": precision == "fp16"},
        # ZeRO stage = the sharding mode's index (none, optim, optim_grads, optim_grads_params);
        # overlap_comm: reduce gradients during the backward (DeepSpeed's overlap_grad_reduce)
        "zero_optimization": {"stage": SHARDING_MODES.index(plan.dp_sharding),
                              "overlap_comm": _overlaps(plan)["overlap_grad_reduce"],
                              # ZeRO-Offload: optimizer states and the Adam step on the CPU
                              # (DeepSpeed's CPU Adam), pinned host buffers for the transfers
                              **({"offload_optimizer": {"device": "cpu", "pin_memory": True}}
                                 if plan.optimizer_offload else {})},
        "communication_data_type": "fp32" if reduce_dtype(inst) == "fp32" else (
            "fp16" if precision == "fp16" else "bf16"),
        # bf16 with fp32 gradients: accumulated in fp32 too (DeepSpeed's default accumulates
        # in the model dtype), which at ZeRO stage 0 / 1 runs its BF16_Optimizer, the 16-bit
        # and fp32 gradients the plan's memory counts (frameworks.py
        # keeps_16bit_grads_beside_fp32; deepspeed/runtime/engine.py _do_optimizer_sanity_check)
        **({"data_types": {"grad_accum_dtype": "fp32"}}
           if precision != "fp16" and reduce_dtype(inst) == "fp32" else {}),
        # deepspeed/runtime/activation_checkpointing/config.py: these options shape the
        # checkpoints the model code makes; partition_activations shards the saved inputs over
        # the tensor-parallel group (a memory saving the plan does not count), so all stay off
        "activation_checkpointing": {
            "partition_activations": False,
            "contiguous_memory_optimization": False,
            "cpu_checkpointing": False,
        },
        "plan_parallelism": {
            "_comment": ("not a DeepSpeed key (DeepSpeed ignores it): DeepSpeed's JSON has no "
                         "standard tensor/pipeline-parallel keys; pass these to the model code "
                         "(e.g. Megatron-DeepSpeed --tensor-model-parallel-size, "
                         "PipelineModule(num_stages=pipeline)); virtual_pipeline and context "
                         "are 1 (DeepSpeed runs neither). fp8 and nvfp4 need Transformer "
                         "Engine in the model."),
            "recompute_how": _ds_recompute(plan.recompute, plan.recompute_layers,
                                           _op_selective(inst, plan),
                                           recompute_modules(inst, plan)),
            "plan": plan.label(),
            "costed": costed(inst, plan),
            "tensor": plan.tp,
            "pipeline": plan.pp,
            "data": plan.dp,
            "context": plan.cp,
            **({"expert": _ep(plan), "expert_tensor": 1} if _moe(inst) else {}),
            "virtual_pipeline": plan.vp,
            "layers_per_virtual_stage": _layers_per_stage(inst, plan),
            "stage_layers": plan.stage_layers,
            **({"layout_how": (
                "cannot express in the JSON: PipelineModule(partition_method=...) offers "
                "'uniform', 'parameters' and 'type:<regex>', not decoder layers per stage; the "
                "model code must build the stages of stage_layers (e.g. Megatron-DeepSpeed "
                "with the megatron export's layout flags)")} if _uneven(plan) else {}),
            # (the model code builds the attention: the window the plan costs)
            **({"window_how": _window_words(inst.model) + ": DeepSpeed's JSON has no model "
                "keys; the model code must build it"}
               if inst.model.windowed else {}),
            "sequence_parallel": plan.sequence_parallel,
            "recompute": plan.recompute,
            **({"recompute_layers": plan.recompute_layers} if plan.recompute_layers else {}),
            "precision": precision,
            "nodes": plan.nodes,
            "gpus_per_node": _per_host(plan),
            "gpus": plan.gpus,
            # (the factors of one NVLink segment: a node, or several hosts on rack-scale
            # systems, where nvlink_domain says how many GPUs)
            "intra_node": _intra(plan),
            "nvlink_domain": plan.node_size,
            # overlaps the plan costs that DeepSpeed's JSON cannot switch on
            "overlap_cannot_express": [n for n, on in _overlaps(plan).items()
                                       if on and n != "overlap_grad_reduce"],
            **({"optimizer_dtype_how": _BF16_STATES}
               if _bf16_without_master(inst) else {}),
            **({"environment": _EXPANDABLE}
               if inst.spec.training.expandable_segments else {}),
        },
    }
    return json.dumps(doc, indent=2) + "\n"


_WRITERS: dict[str, Callable[[Instance, Plan], str]] = {
    "megatron": _megatron,
    "nemo": _nemo,
    "torchtitan": _torchtitan,
    "deepspeed": _deepspeed,
}

__all__ = ["FORMATS", "emit"]

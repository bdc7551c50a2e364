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

from collections.abc import Callable

from planner.app.emit.common import norm_bias_config, window_config
from planner.app.emit.deepspeed import _deepspeed
from planner.app.emit.megatron import _megatron
from planner.app.emit.nemo import _nemo
from planner.app.emit.torchtitan import _torchtitan
from planner.model.errors import InputError
from planner.model.frameworks import (framework_violations, offload_violations, on_megatron_core,
                                      sharding_refusal)
from planner.model.instance import Instance
from planner.model.plan import Plan
from planner.model.rules import violations


FORMATS = ("megatron", "nemo", "torchtitan", "deepspeed")


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


_WRITERS: dict[str, Callable[[Instance, Plan], str]] = {
    "megatron": _megatron,
    "nemo": _nemo,
    "torchtitan": _torchtitan,
    "deepspeed": _deepspeed,
}

__all__ = ["FORMATS", "emit", "norm_bias_config", "window_config"]

"""Training frameworks: what each one runs and the defaults it applies.

``[constraints] framework`` names the framework the plan will run on. It does two things, both
read from the table below and nowhere else: it restricts the search to what that framework can
run, and it sets the defaults of the settings a framework decides for the user (which overlap
switches are on, in which dtype gradients are reduced, when they are reduced, the reshard
policy of fully sharded parameters). Without it, the search may pick any plan some framework
runs, and the defaults are Megatron-LM's (its command line, not NeMo's recipes).

Each fact carries its source: the framework's argument or config name, checked in its code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from planner.model.algebra import eq1, gt1, is_one, le2, not_whole

#: The data-parallel sharding modes (Megatron-Core ``data_parallel_sharding_strategy`` names;
#: ZeRO stages 0 to 3; FSDP full shard is ``optim_grads_params``)
SHARDING_MODES: tuple[str, ...] = ("none", "optim", "optim_grads", "optim_grads_params")

FrameworkName = Literal["megatron", "nemo", "torchtitan", "deepspeed"]


@dataclass(frozen=True)
class Framework:
    """One framework's capabilities and defaults (fields are added with the knobs they set)."""

    name: str
    label: str                      # as the user reads it
    #: it builds the model from Megatron-Core (Transformer Engine's layers, its recompute
    #: modules, context-parallel exchanges and pipeline schedules): Megatron-LM and NeMo
    megatron_core: bool = False
    #: the overlap switches it turns on when the user does not say (docs/model.md, "Overlap")
    overlap_defaults: tuple[tuple[str, bool], ...] = ()
    #: defaults that depend on the data-parallel sharding mode: (mode, switch, default), over
    #: ``overlap_defaults`` for a plan of that mode (DeepSpeed's overlap_comm, on for ZeRO-3)
    mode_overlap_defaults: tuple[tuple[str, str, bool], ...] = ()
    #: the overlap switches its configuration can turn on (the others it cannot run)
    overlaps_expressible: tuple[str, ...] = ()
    #: parameters per gradient bucket of its overlapped data-parallel reduction
    grad_bucket_params: int = 40_000_000

    #: data-parallel sharding modes it runs
    sharding_modes: tuple[str, ...] = SHARDING_MODES
    #: modes it runs only without pipeline parallelism (pp = 1), with the reason
    sharding_needs_no_pp: tuple[str, ...] = ()
    sharding_no_pp_source: str = ""
    #: ``none`` (plain DDP) only without tensor, pipeline and context parallelism
    ddp_needs_1d: bool = False
    #: a shard group of one rank without context parallelism is not sharded at all: the
    #: framework runs it as its plain DDP, which ``ddp_needs_1d`` refuses beside tensor and
    #: pipeline parallelism
    unit_shard_is_ddp: bool = False
    #: expert parallelism is taken from the shard group's, context and tensor ranks (ep must
    #: divide dp_shard_size * cp * tp), not from all data-parallel ranks (the rule ep_stage)
    ep_in_shard_group: bool = False
    #: it runs interleaved pipelines (vp > 1) and context parallelism (cp > 1); the sources
    #: when it does not (the sentences a refusal names)
    interleaving: bool = True
    interleaving_source: str = ""
    context_parallel: bool = True
    context_parallel_source: str = ""
    #: whether it replicates shard groups (HSDP: dp_shard_size < dp)
    hsdp: bool = True
    #: sharded gradients are reduce-scattered after every micro-batch's backward (True) or once
    #: per step after the last one (False: they accumulate unsharded in between), without
    #: pipeline parallelism and with it
    reduce_every_microbatch: tuple[bool, bool] = (False, False)
    #: under pipeline parallelism the once-per-step reduction of a stage starts after that
    #: stage's last backward, not bucket by bucket during it (torch.distributed.pipelining's
    #: FSDP2 stages under torchtitan, DeepSpeed's PipelineEngine: see their entries)
    reduce_after_last_backward: bool = False
    #: the lowest ratio of the memory nvidia-smi showed (the CUDA context and the allocator's
    #: reservation, a snapshot: at most the peak) to the peak this model counts, over the
    #: framework's measured plans; None where none was measured (the default reserve stands):
    #: its default reserve keeps the model's peak at or under the capacity over this ratio
    #: (schema.default_reserve_GiB)
    measured_peak_ratio: float | None = None
    #: bf16 training (FP8 and NVFP4 included: their master path is bf16) that accumulates its
    #: gradients in fp32 without sharding them keeps the 16-bit gradients beside the fp32 ones
    #: (DeepSpeed's BF16_Optimizer: see its entry)
    keeps_16bit_grads_beside_fp32: bool = False
    #: under pipeline parallelism a stage's FSDP2 parameters, once gathered, stay gathered over
    #: the step's micro-batches when they are not resharded after forward (torchtitan: the
    #: pipelining stage's set_reshard_after_backward(False), and FSDP2's unshard is a no-op on
    #: gathered parameters): one all-gather per step, not one per micro-batch
    pipelined_params_stay_gathered: bool = False
    #: default ``[training] grad_reduce_dtype`` ("fp32", or "bf16": the 16-bit training dtype)
    grad_reduce_dtype: str = "fp32"
    #: FSDP2 ``reshard_after_forward`` default: (without pipeline parallelism, with it)
    reshard_after_forward: tuple[bool, bool] = (True, False)
    #: Megatron-Core's interleaved schedule: each virtual chunk's gradient reduction starts
    #: once that chunk's last micro-batch backward is done (schedules.py,
    #: backward_step_helper_postprocess / _preprocess), so it overlaps the rest of the
    #: cool-down (docs/model.md, "Overlap")
    chunked_grad_sync: bool = False
    #: with sharded parameters, a 16-bit shard besides the fp32 master (18 bytes per parameter
    #: over the group: Megatron-FSDP, DeepSpeed ZeRO-3) or the fp32 master is the shard and
    #: only the gathered layers are 16-bit (16 bytes: PyTorch FSDP's MixedPrecisionPolicy)
    sharded_16bit_copy: bool = True
    #: what recompute = "selective" recomputes: "core_attention" (Megatron-Core's default
    #: recompute module core_attn) or "op" (torchtitan's op-level selective checkpointing)
    selective_recompute: str = "core_attention"
    #: host offload (docs/model.md, "Host offload"): the sharding modes it offloads the
    #: optimizer with (empty: no optimizer offload), whether it offloads the activations of N
    #: layers (Megatron-Core's --cpu-offloading-num-layers) and whether the gradients' and
    #: parameters' host transfers overlap the CPU optimizer step
    optimizer_offload_modes: tuple[str, ...] = ()
    activation_offload: bool = False
    offload_overlap: bool = False
    offload_source: str = ""
    #: the share of the host's peak memory bandwidth its CPU Adam step reaches (the step's
    #: bytes over peak bandwidth is a lower bound on its time): DeepSpeed's DeepSpeedCPUAdam
    #: is taken at the bound (1.0, optimistic); Megatron-Core's HybridDeviceOptimizer runs
    #: torch.optim.AdamW on the CPU (megatron/core/optimizer/__init__.py imports it as
    #: CPUAdam), which DeepSpeed's ZeRO-Offload tutorial puts 5-7x slower than its
    #: DeepSpeedCPUAdam: 1/6 of DeepSpeed's rate
    cpu_adam_share: float = 1.0
    #: whether it recomputes a count of layers per virtual stage (``recompute_layers``:
    #: Megatron-LM / NeMo ``--recompute-method block --recompute-num-layers N``; DeepSpeed's
    #: Megatron-based model code takes the same flags); torchtitan's activation_checkpoint has
    #: full or per-layer-frequency selective checkpointing, no count per stage
    partial_recompute: bool = True
    #: the sharding modes under which it keeps the layers' GEMM weights in FP8 and all-gathers
    #: them in FP8 (``[training] fp8_param_gather``; empty: it cannot)
    fp8_param_gather_modes: tuple[str, ...] = ("optim",)
    fp8_param_gather_source: str = ""
    #: the sharding modes under which its optimizer keeps the fp32 master weight as the bf16
    #: weight plus a 16-bit remainder (``[training] store_param_remainders``; empty: it cannot)
    param_remainders_modes: tuple[str, ...] = ("optim",)
    param_remainders_source: str = ""
    #: Megatron-LM's validate_args on the overlap switches (megatron/training/arguments.py):
    #: ``--overlap-param-gather`` only with ``--overlap-grad-reduce`` ("Must use
    #: --overlap-param-gather with --overlap-grad-reduce"), and an interleaved schedule
    #: without p2p overlap only on more than two pipeline ranks (it asserts
    #: pipeline_model_parallel_size > 2 "to avoid having multiple p2p sends and recvs between
    #: same 2 ranks per communication batch"); NeMo and Megatron-Bridge build Megatron-Core's
    #: configs without that function
    validate_args_overlaps: bool = False
    #: the kernels its layers run on by default (``[training] kernel_stack``): "fused"
    #: (Transformer Engine's, Megatron-Core / NeMo) or "pytorch" (eager PyTorch modules)
    kernel_stack: str = "fused"
    #: bytes per logit its loss holds at the peak without a fused cross-entropy, at tp = 1
    #: and at tp > 1 (:func:`logit_bytes`): the 16-bit logits and their fp32 softmax (6),
    #: Megatron-Core's vocab-parallel cross-entropy working in place on that copy
    loss_bytes: tuple[float, float] = (6.0, 6.0)

    def overlap_default(self, name: str, mode: str | None = None) -> bool:
        """The framework's default for an overlap knob (:data:`OVERLAP_KNOBS`) on a plan of the
        data-parallel sharding ``mode`` (None: the mode-independent default)."""
        for m, knob, value in self.mode_overlap_defaults:
            if m == mode and knob == name:
                return value
        return dict(self.overlap_defaults).get(name, False)


#: The overlap knobs (Megatron-Core / NeMo names; their cost rules: planner/model/terms.py)
OVERLAP_KNOBS = ("overlap_grad_reduce", "overlap_param_gather", "tp_comm_overlap",
                 "overlap_p2p_comm", "overlap_moe_expert_parallel_comm")

# Overlap defaults, each checked in the framework's code:
# - Megatron-LM (megatron/training/arguments.py): --overlap-grad-reduce, --overlap-param-gather
#   and --tp-comm-overlap are store_true flags (off); overlap_p2p_comm is on unless
#   --no-overlap-p2p-communication (store_false, the default since Megatron-LM commit 4eeff55,
#   Oct 2023), and validate_args sets it off without interleaving (vp = 1).
# - NeMo 2 (nemo/collections/llm/recipes/*.py trainer(): MegatronStrategy(ddp=
#   DistributedDataParallelConfig(overlap_grad_reduce=True, overlap_param_gather=True, ...)) with
#   the distributed fused Adam; nemo/lightning/pytorch/callbacks/megatron_comm_overlap.py:
#   overlap_p2p_comm on when pp > 1 and vp > 1, tp_comm_overlap off unless a recipe asks).
# - torchtitan (FSDP2 / replicate): gradients are reduce-scattered (all-reduced) by per-layer
#   hooks during the backward and the next layer's parameters are prefetched in the forward,
#   always; async tensor parallelism (parallelism.enable_async_tensor_parallel) is off by
#   default; its pipeline schedules have no p2p-overlap switch.
# - DeepSpeed (deepspeed/runtime/zero/config.py): zero_optimization.overlap_comm is false for
#   ZeRO-1/2 and true for ZeRO-3 (DeepSpeedZeroConfig.overlap_comm_valid: None becomes
#   ``stage == 3``): overlap_grad_reduce by sharding mode (``mode_overlap_defaults``); no
#   tensor-parallel, parameter-gather or p2p overlap switch.
# - overlap_moe_expert_parallel_comm (Megatron-Core ModelParallelConfig, "overlap EP A2A
#   communications with independent computations of different micro-batches in 1f1b phase"):
#   off in Megatron-LM (--overlap-moe-expert-parallel-comm, store_true) and in NeMo /
#   Megatron-Bridge (CommOverlapConfig; the performance recipes switch it on per model,
#   moe_a2a_overlap in scripts/performance/configs); torchtitan and DeepSpeed have no such switch.
# Gradient buckets (parameters): Megatron-Core DistributedDataParallelConfig.bucket_size defaults
# to max(40M, 1M * dp) (40M is the value up to dp = 40; the rule keeps the 40M); NeMo's
# MegatronCommOverlapCallback sets 128 * 1024 * 1024 when dp > 1; torchtitan reduces per
# transformer block (fully_shard / replicate per block: one layer, no other cap); DeepSpeed
# zero_optimization.reduce_bucket_size defaults to 5e8 elements.
#: Sources (checked in each framework's code):
#: - Megatron-LM: ``--data-parallel-sharding-strategy {no_shard, optim, optim_grads,
#:   optim_grads_params}`` with ``--use-megatron-fsdp`` (docs/discussions/megatron-fsdp-user-guide),
#:   ``--use-distributed-optimizer`` for ``optim``; ``DistributedInitConfig.use_torch_fsdp2``
#:   "FSDP2 is not currently working with Pipeline Parallel" (sharded gradients / parameters are
#:   taken as pp = 1 only); the training loop reduces unsharded gradients once per step
#:   (``no_sync`` for all micro-batches but the last), but Megatron-FSDP reduce-scatters sharded
#:   ones after every backward (megatron_fsdp.py ``grad_reduce_every_bprop`` for optim_grads and
#:   optim_grads_params, ahead of ``is_last_microbatch``; so since custom FSDP's first version,
#:   ``is_delay_grad_reduce`` only for no_shard and optim); bf16 main gradients are fp32
#:   (``accumulate_allreduce_grads_in_fp32`` is set by ``validate_args`` under ``--bf16``;
#:   ``--grad-reduce-in-bf16`` switches it off); replicas of the shard group:
#:   ``--num-distributed-optimizer-instances``.
#: - NeMo 2: Megatron-Core underneath (``MegatronStrategy(ddp=DistributedDataParallelConfig)``);
#:   its LLM recipes set ``grad_reduce_in_fp32 = True``.
#: - torchtitan: FSDP2 (``fully_shard``) is its data parallelism; ``data_parallel_replicate_degree``
#:   alone is DDP, which ``parallelize`` applies only without other parallelism ("DDP has not
#:   supported > 1D parallelism"); ``mixed_precision_reduce = "float32"``;
#:   ``fsdp_reshard_after_forward = "default"``: True without pipeline parallelism, False with it;
#:   without pipeline parallelism FSDP2 reduce-scatters each backward (gradient accumulation
#:   included).
#: - torchtitan under pipeline parallelism: its schedules are torch.distributed.pipelining's,
#:   whose stages run every micro-batch backward of an FSDP2 module with
#:   ``set_requires_gradient_sync(False)`` and ``set_reshard_after_backward(False)`` and call
#:   the module's ``post_backward`` (the reduce-scatter, then the replicas' all-reduce) once,
#:   after the stage's last backward
#:   (PyTorch torch/distributed/pipelining/stage.py ``backward_maybe_with_nosync``; in later
#:   releases the schedule's ``REDUCE_GRAD`` action, ``perform_reduce_grad``, "scheduled after
#:   all microbatches W, B actions"). With sync off FSDP2 upcasts each unsharded gradient to the
#:   reduce dtype and accumulates it there (``FSDPParam.to_accumulated_grad_if_needed``,
#:   ``accumulate_unsharded_grad_if_needed``): a pipelined stage holds its parameters'
#:   gradients whole, in fp32 under torchtitan's ``mixed_precision_reduce``, until the step's
#:   reduction, which has no backward of that stage left to hide behind.
#: - torchtitan 0.2.2 ``distributed/parallel_dims.py``: ``fsdp_enabled = dp_shard_enabled or
#:   cp_enabled`` (dp_shard > 1 or cp > 1), so a shard group of one without context
#:   parallelism takes the DDP branch of ``models/llama3/infra/parallelize.py``, which raises
#:   "DDP has not supported > 1D parallelism" unless the world is the replicate mesh;
#:   ``build_mesh`` unflattens the world into ``(pp, dp_replicate, efsdp, ep, etp)`` with
#:   ``efsdp = dp_shard * cp * tp // (etp * ep)``: expert parallelism (etp = 1 in the exports)
#:   must divide dp_shard * cp * tp, the replicas are outside it.
#: - DeepSpeed: ``zero_optimization.stage`` 0-3; ``PipelineEngine`` asserts ZeRO stage < 2
#:   ("ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism"); stage 2/3 reduce in every
#:   backward (``reduce_ipg_grads``); ``communication_data_type`` defaults to the model dtype;
#:   no replica groups of the ZeRO partition here (ZeRO++ hpZ is a secondary copy, not modelled).
#:   No interleaving: DeepSpeed 0.19.8 ``deepspeed/runtime/pipe/schedule.py`` has
#:   ``TrainSchedule`` (1F1B) and ``DualPipeVSchedule`` (a fixed two-chunk V), and
#:   ``PipelineModule`` builds one stage per rank. No context parallelism: Megatron-DeepSpeed
#:   (``megatron/arguments.py``) has no ``--context-parallel-size``, only
#:   ``--ds-sequence-parallel-size`` (Ulysses all-to-all, which the model does not cost).
#: - Host offload, Megatron-Core: ``--optimizer-cpu-offload`` (validate_args asserts
#:   ``--use-precision-aware-optimizer``, a distributed-optimizer path: ZeRO-1 here; the
#:   exports pass ``--overlap-cpu-optimizer-d2h-h2d``, so the cost rule overlaps the transfers
#:   with the CPU step); ``--cpu-offloading-num-layers N`` (switches ``cpu_offloading`` on, which
#:   has no flag of its own): TransformerConfig
#:   requires ``0 <= N < num_layers``, refuses it with pipeline parallelism and with any
#:   activation recompute (megatron/core/transformer/transformer_config.py __post_init__).
_MEGATRON_OFFLOAD = ("Megatron-Core --optimizer-cpu-offload needs the distributed optimizer "
                     "(dp_sharding = \"optim\"); --cpu-offloading-num-layers needs pp = 1, no "
                     "recompute and fewer layers than the model's (TransformerConfig)")

#: - FP8 parameters (``[training] fp8_param_gather``), Megatron-LM: ``--fp8-param-gather``
#:   ("Keep the compute param in fp8 ... and perform the param all-gather in fp8";
#:   validate_args asserts the distributed optimizer, torch FSDP2 or Megatron-FSDP, and turns it
#:   off under FSDP2 with TE >= 2.0); Megatron-Core's DDP puts such parameters in a uint8
#:   buffer (``param_and_grad_buffer.py``: ``param_dtype = torch.uint8``), Megatron-FSDP
#:   builds them as FP8 shards (``megatron_fsdp/param_and_grad_buffer.py``:
#:   ``init_param_with_fp8`` = ``ddp_config.fp8_param_gather``). NeMo 2: the
#:   MegatronMixedPrecision plugin's ``fp8_param_gather`` (``fp8_params`` in 25.02), set by its
#:   FP8 recipes (``bf16_with_fp8_mixed``); NeMo's 25.x performance scripts switched it off under
#:   Megatron-FSDP ("Currently FSDP does not support FP8 param gather"), Megatron-Bridge's
#:   (26.04: scripts/performance/utils/overrides.py ``_set_megatron_fsdp_overrides``) keep it,
#:   with ``keep_fp8_transpose_cache = False``. The model takes it with the distributed
#:   optimizer (ZeRO-1) and Megatron-FSDP's modes. torchtitan: ``[quantize.linear.float8]
#:   enable_fsdp_float8_all_gather`` (docs/float8.md: "cast Float8Linear.weight from high
#:   precision to float8 before FSDP all-gather"), torchao's ``WeightWithDynamicFloat8CastTensor``
#:   under FSDP2: the fp32 shard is cast per step and the layers' linear weights gathered in
#:   FP8, the embedding, norms and output layer in 16 bits; FSDP2 only. DeepSpeed: none.
_MEGATRON_FP8_GATHER = ("Megatron-LM --fp8-param-gather needs the distributed optimizer or "
                        "Megatron-FSDP (megatron/training/arguments.py)")
_TORCHTITAN_FP8_GATHER = ("torchtitan's FP8 parameters are torchao's FSDP2 FP8 all-gather "
                          "([quantize.linear.float8] enable_fsdp_float8_all_gather)")
_NEMO_FP8_GATHER = ("NeMo's fp8_param_gather runs with the distributed optimizer or "
                    "Megatron-FSDP (Megatron-Bridge's FSDP recipes keep it)")

#: - Master weights as remainders (``[training] store_param_remainders``): an fp32 master
#:   weight is the bf16 weight (its upper 16 bits) plus the lower 16 bits, so the optimizer
#:   needs to store only the latter: 2 bytes per parameter instead of 4. Megatron-Core: the
#:   precision-aware optimizer (``--use-precision-aware-optimizer``, Transformer Engine's
#:   FusedAdam, ``OptimizerConfig.store_param_remainders`` default True from TE 2.1;
#:   ``distrib_optimizer.py`` allocates the ``master_param`` state as int16 when bf16), which
#:   ``get_megatron_optimizer`` refuses without the distributed optimizer and Megatron-Bridge's
#:   performance scripts switch off under Megatron-FSDP (``_set_megatron_fsdp_overrides``) and
#:   on for BF16 runs (``set_post_overrides``, 25.11 and 26.04). NeMo 1 (the launcher's
#:   ``optim.name: distributed_fused_adam``): ``megatron_base_model.setup_optimization`` passes
#:   ``store_params = False, store_param_remainders = True`` to Apex's DistributedFusedAdam
#:   when the optimizer dtype is fp32 and the weights bf16 (megatron_amp_O2), and that
#:   optimizer's ``StateBucket`` then holds an int16 ``param_remainders_shard`` beside the fp32
#:   ``exp_avg`` / ``exp_avg_sq`` shards (apex/contrib/optimizers/distributed_fused_adam.py).
#:   Both are ZeRO-1 optimizers: the model takes the remainders with dp_sharding = "optim".
_MEGATRON_REMAINDERS = ("Megatron-Core's precision-aware optimizer stores remainders with the "
                        "distributed optimizer only (get_megatron_optimizer; Megatron-FSDP "
                        "keeps its own fp32 main weights)")
_NEMO_REMAINDERS = ("NeMo stores remainders with its distributed Adam (NeMo 1 "
                    "distributed_fused_adam, NeMo 2 / Megatron-Bridge "
                    "use_precision_aware_optimizer), the distributed optimizer only")
#: - bf16 Adam moments beside an fp32 master (``[training] main_params_dtype = "fp32"`` with
#:   ``optimizer_dtype = "bf16"``): Megatron-Core's precision-aware optimizer again
#:   (``--exp-avg-dtype bf16 --exp-avg-sq-dtype bf16``, ``main_params_dtype`` fp32, its
#:   default), a distributed-optimizer path (get_megatron_optimizer); NeMo 2 and
#:   Megatron-Bridge set it through the same OptimizerConfig (their DeepSeek-V3 recipes).
#:   The frameworks that store remainders are the ones that run it, with the same modes.
BF16_MOMENTS_SOURCE = ("Megatron-Core's precision-aware optimizer (--use-precision-aware-"
                       "optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16), a path of the "
                       "distributed optimizer: NeMo and Megatron-Bridge set it through its "
                       "OptimizerConfig")

FRAMEWORKS: dict[str, Framework] = {
    "megatron": Framework("megatron", "Megatron-LM", megatron_core=True,
                          overlap_defaults=(("overlap_p2p_comm", True),),
                          reduce_every_microbatch=(True, True), chunked_grad_sync=True,
                          overlaps_expressible=OVERLAP_KNOBS, grad_bucket_params=40_000_000,
                          sharding_needs_no_pp=("optim_grads", "optim_grads_params"),
                          sharding_no_pp_source="Megatron-LM's FSDP path does not run with "
                          "pipeline parallelism (DistributedInitConfig.use_torch_fsdp2)",
                          optimizer_offload_modes=("optim",), activation_offload=True,
                          offload_overlap=True, offload_source=_MEGATRON_OFFLOAD,
                          cpu_adam_share=1 / 6, fp8_param_gather_source=_MEGATRON_FP8_GATHER,
                          fp8_param_gather_modes=("optim", "optim_grads", "optim_grads_params"),
                          param_remainders_source=_MEGATRON_REMAINDERS,
                          validate_args_overlaps=True),
    "nemo": Framework("nemo", "NeMo", megatron_core=True, reduce_every_microbatch=(True, True),
                      chunked_grad_sync=True,
                      overlap_defaults=(("overlap_grad_reduce", True),
                                        ("overlap_param_gather", True),
                                        ("overlap_p2p_comm", True)),
                      overlaps_expressible=OVERLAP_KNOBS, grad_bucket_params=128 * 1024 * 1024,
                      sharding_needs_no_pp=("optim_grads", "optim_grads_params"),
                      sharding_no_pp_source="NeMo's FSDP (Megatron-Core) does not run with "
                                            "pipeline parallelism",
                      optimizer_offload_modes=("optim",), activation_offload=True,
                      offload_overlap=True, offload_source=_MEGATRON_OFFLOAD,
                      cpu_adam_share=1 / 6, fp8_param_gather_source=_NEMO_FP8_GATHER,
                      fp8_param_gather_modes=("optim", "optim_grads", "optim_grads_params"),
                      param_remainders_source=_NEMO_REMAINDERS),
    "torchtitan": Framework("torchtitan", "torchtitan",
                            overlap_defaults=(("overlap_grad_reduce", True),
                                              ("overlap_param_gather", True)),
                            overlaps_expressible=("overlap_grad_reduce", "overlap_param_gather",
                                                  "tp_comm_overlap"),
                            grad_bucket_params=1 << 40,
                            sharding_modes=("none", "optim_grads_params"), ddp_needs_1d=True,
                            unit_shard_is_ddp=True, ep_in_shard_group=True,
                            # FSDP2 reduce-scatters after each backward; under pipeline
                            # parallelism torch.distributed.pipelining runs every stage backward
                            # with gradient sync off and reduces once after the stage's last
                            # (the notes above, "torchtitan under pipeline parallelism")
                            reduce_every_microbatch=(True, False),
                            reduce_after_last_backward=True,
                            pipelined_params_stay_gathered=True, sharded_16bit_copy=False,
                            # activation_checkpoint.mode = "selective", selective_ac_option =
                            # "op" (its train_configs): a policy that saves the outputs of mm,
                            # the SDPA kernels and reduce-scatter, except every second mm
                            # (torchtitan/parallelisms/parallelize_llama.py @1ea476e)
                            selective_recompute="op", partial_recompute=False,
                            fp8_param_gather_modes=("optim_grads_params",),
                            fp8_param_gather_source=_TORCHTITAN_FP8_GATHER,
                            param_remainders_modes=(),
                            param_remainders_source="its FSDP2 shard is the fp32 master "
                            "weight itself (MixedPrecisionPolicy), with no remainder storage",
                            offload_source="torchtitan's only CPU offload is FSDP2's "
                            "CPUOffloadPolicy (parameters, gradients and optimizer states "
                            "together), which this model does not cost",
                            # its job config's [compile] enable defaults to false
                            # (torchtitan/config/job_config.py, class Compile, 0.2.x): eager
                            # torch.nn.Linear and SDPA, the stack of its runs here
                            kernel_stack="pytorch",
                            # F.cross_entropy(logits.float()), and its loss_parallel under
                            # TP (logit_bytes)
                            loss_bytes=(12.0, 16.0)),
    "deepspeed": Framework("deepspeed", "DeepSpeed",
                           overlaps_expressible=("overlap_grad_reduce",),
                           mode_overlap_defaults=(("optim_grads_params", "overlap_grad_reduce",
                                                   True),),
                           grad_bucket_params=500_000_000,
                           sharding_needs_no_pp=("optim_grads", "optim_grads_params"),
                           sharding_no_pp_source="DeepSpeed's PipelineEngine refuses ZeRO "
                           "stage 2 and 3 with pipeline parallelism",
                           hsdp=False, reduce_every_microbatch=(True, True),
                           # its PipelineEngine schedules the reduction itself: "We schedule
                           # the all-reduces, so disable it in super().backward()"
                           # (deepspeed/runtime/pipe/engine.py, enable_backward_allreduce =
                           # False), TrainSchedule's ReduceGrads after the last backward
                           reduce_after_last_backward=True,
                           grad_reduce_dtype="bf16",
                           # bf16 with fp32 gradient accumulation (data_types.grad_accum_dtype =
                           # "fp32", or the BLOOM-era bf16 optimizer) at ZeRO stage 0 / 1 runs
                           # BF16_Optimizer (deepspeed/runtime/engine.py
                           # _do_optimizer_sanity_check), which accumulates into a whole fp32
                           # buffer (bf16_optimizer.py fp32_groups_gradients_flat, zeros_like
                           # the flat 16-bit parameters) and leaves the 16-bit gradients in
                           # place (update_hp_grads(clear_lp_grads=False), the default of
                           # backward_epilogue and of the PipelineEngine's backward)
                           keeps_16bit_grads_beside_fp32=True,
                           # BigScience's Megatron-DeepSpeed runs on 384 A100 80GB (2022;
                           # planner/data/measured_alternatives.toml, both days): nvidia-smi's
                           # readings over the model's peak were 1.218-1.436 on 02-25 (fp16,
                           # ZeRO-1) and 1.286-1.399 on 02-28 (BF16_Optimizer); the lowest of
                           # the 31 (tests/test_alternatives.py recomputes it, and checks each
                           # day against the other day's lowest: every plan that ran fits, 2 and
                           # 3 of the 3 that ran out of memory do not)
                           measured_peak_ratio=1.218,
                           interleaving=False, context_parallel=False,
                           interleaving_source="its PipelineEngine runs one stage per rank "
                           "with 1F1B (deepspeed/runtime/pipe/schedule.py TrainSchedule), no "
                           "interleaved schedule",
                           context_parallel_source="Megatron-DeepSpeed has no "
                           "--context-parallel-size, only Ulysses --ds-sequence-parallel-size, "
                           "which this model does not cost",
                           optimizer_offload_modes=("optim", "optim_grads",
                                                    "optim_grads_params"),
                           offload_source="DeepSpeed zero_optimization.offload_optimizer "
                           "(device cpu) is valid for ZeRO stages 1-3; it has no Megatron "
                           "activation offload",
                           fp8_param_gather_modes=(),
                           fp8_param_gather_source="DeepSpeed keeps 16-bit parameters (no FP8 "
                           "parameter storage or all-gather)",
                           param_remainders_modes=(),
                           param_remainders_source="DeepSpeed's ZeRO optimizers keep a whole "
                           "fp32 master copy of their partition"),
}

#: the framework whose defaults apply when ``[constraints] framework`` is not given
DEFAULT_FRAMEWORK = "megatron"


def framework_of(name: str | None) -> Framework:
    """The framework an instance names, or the default one."""
    return FRAMEWORKS[name or DEFAULT_FRAMEWORK]


def on_megatron_core(name: str | None) -> bool:
    """Whether the framework an instance names (None: the default, Megatron-LM) builds its
    model from Megatron-Core (:attr:`Framework.megatron_core`)."""
    return framework_of(name).megatron_core


def grad_reduce_dtype(name: str | None, precision: str) -> str:
    """The framework's gradient reduction dtype for a precision: Megatron-LM keeps fp16 main
    gradients in fp16 (its fp16 row: 20 bytes per parameter) and bf16 ones in fp32."""
    fw = framework_of(name)
    if fw.name == "megatron" and precision == "fp16":
        return "bf16"
    return fw.grad_reduce_dtype


def kernel_stack(stated: str | None, precision: str, fp8_recipe: str | None,
                 name: str | None) -> str:
    """The kernel stack whose figures cost the GEMMs and the attention core: the ``[training]
    kernel_stack`` ``stated``, else the framework's (:attr:`Framework.kernel_stack`: torchtitan
    runs eager PyTorch modules unless its ``compile.enable`` is set). NVFP4 and MXFP8 are
    costed on Transformer Engine's kernels only, so they keep the fused stack by default
    everywhere (a stated ``kernel_stack = "pytorch"`` with them is an input error)."""
    if stated is not None:
        return stated
    if precision == "nvfp4" or fp8_recipe == "mxfp8":
        return "fused"
    return framework_of(name).kernel_stack


def delayed_scaling(training) -> bool:
    """FP8 under delayed scaling: ``fp8_recipe = "delayed"``, or unset, which launches as
    Megatron-Core's default recipe (delayed). The one test of it: what Transformer Engine keeps
    and refuses, and what Megatron-LM asserts, differ there."""
    return training.precision == "fp8" and training.fp8_recipe in (None, "delayed")


def te_holds_master(training) -> bool:
    """Whether Megatron-Core's precision-aware optimizer hands the master weights to
    Transformer Engine's FusedAdam, which keeps them as 16-bit remainders unless
    ``store_param_remainders`` is off (OptimizerConfig
    ``use_precision_aware_optimizer_no_fp8_or_ds_fp8``): bf16 weights, or FP8 under delayed
    scaling; under current and MXFP8 scaling Megatron-Core keeps a whole fp32 master itself."""
    return training.precision != "fp8" or delayed_scaling(training)


#: Bytes per logit torchtitan's loss holds at its peak under torch.compile, at tp = 1: the
#: 16-bit logits it keeps for the backward (no fp32 copy, no saved log-softmax: the compiled
#: backward recomputes them from the logits and a per-token log-sum-exp) and their 16-bit
#: gradient. Measured on CPU with PyTorch's profiler, torch 2.13's inductor: ``python
#: tools/loss_memory.py --compiled`` (2.00 alive at the backward's start, 4.00 at its peak)
COMPILED_LOSS_BYTES = 4.0


def compiled_loss(training, name: str | None, kernel_stack: str) -> bool:
    """Whether the loss runs under torch.compile: ``[training] compiled_loss``, else
    torchtitan's export on the fused kernel stack (it compiles there, and its ``[compile]
    components`` default holds the loss; torchao's MXFP8 refuses only the layers' compile
    beside tensor parallelism, where the compiled loss costs as the eager one anyway), not
    beside a fused cross-entropy (a loss of its own); an eager loss everywhere else."""
    if training.compiled_loss is not None:
        return training.compiled_loss
    return (framework_of(name).name == "torchtitan" and kernel_stack == "fused"
            and not training.fused_cross_entropy)


def logit_bytes(fused_cross_entropy: bool, name: str | None, tp, compiled: bool = False):
    """Bytes per logit the loss holds at its peak (inside its backward, every layer's
    activations still held), per tensor rank's vocabulary shard; ``tp`` may be a symbol.
    A fused cross-entropy kernel (``[training] fused_cross_entropy``) writes the gradient in
    place in the 16-bit logits: 2. A ``compiled`` loss (:func:`compiled_loss`) at tp = 1:
    :data:`COMPILED_LOSS_BYTES`, 4; at tp > 1 as the eager one (torchtitan's vocab-parallel
    function under compile is not measured: the safe side). Otherwise the framework's
    :attr:`Framework.loss_bytes`:

    - Megatron-Core's vocab-parallel cross-entropy: the 16-bit logits and their fp32 softmax,
      6 (the other frameworks' default);
    - torchtitan's ``F.cross_entropy(pred.flatten(0, 1).float(), labels)``
      (components/loss.py; ``del pred`` in its train step drops the 16-bit logits): the
      backward of ``nll_loss`` allocates an fp32 gradient of the logits' shape while
      ``log_softmax``'s fp32 output is still saved, and ``log_softmax``'s backward writes a
      third fp32 tensor (ATen ``_log_softmax_backward_data``): 12; under tensor parallelism its
      default ``loss_parallel`` runs DTensor's vocab-parallel backward, ``(grad_input +
      exp(x)) * grad_output``, one fp32 temporary more: 16 (both peaks measured on CPU with
      PyTorch's profiler, torch 2.13: ``python tools/loss_memory.py [--parallel]``)."""
    if fused_cross_entropy:
        return 2.0
    one, many = framework_of(name).loss_bytes
    if compiled:
        one = COMPILED_LOSS_BYTES
    return one if one == many else one + (many - one) * gt1(tp)


def selective_recompute_of(name: str | None) -> str:
    """What the framework's selective recompute recomputes (:attr:`Framework.selective_recompute`)."""
    return framework_of(name).selective_recompute


#: Why FP4 parameters keep ZeRO-1 here (sharding_refusal): the distributed optimizer quantizes
#: its fp32 shard into them (Megatron-Core fp4_utils.quantize_nvfp4_param_shard); their
#: Megatron-FSDP path is not modelled
FP4_PARAMS_SOURCE = ("Megatron-Core's distributed optimizer quantizes its fp32 shard into the "
                     "NVFP4 parameters and all-gathers them (quantize_nvfp4_param_shard); the "
                     "model costs that path only")
#: Why MXFP8 parameters keep ZeRO-1 (sharding_refusal)
MXFP8_PARAMS_SOURCE = ("Megatron-Core all-gathers MXFP8 parameters in 16 bits through the "
                       "gradient buffer, a path of the distributed optimizer only: "
                       "distrib_optimizer.py _copy_main_params_to_param_buffer raises "
                       "NotImplementedError under Megatron-FSDP")


def cp_exchange(training, framework: str | None) -> str:
    """How context parallelism exchanges the attention's inputs: ``[training] cp_comm_type``
    (Transformer Engine's p2p ring, a2a or all_gather) under Megatron-LM and NeMo;
    torchtitan's and DeepSpeed's plans run their own, costed as the p2p ring (a pinned
    framework with another exchange is an input error; ``plan solve --emit`` searches under
    that framework's rules, this one among them)."""
    return training.cp_comm_type if on_megatron_core(framework) else "p2p"


def torchao_float8(training, framework: str | None) -> bool:
    """Whether the FP8 linear layers are torchao's float8 (``Float8Linear``) rather than
    Transformer Engine's: ``[training] fp8_library``, by default torchao under torchtitan (its
    ``quantize.linear.float8`` converter) and Transformer Engine elsewhere, whatever figures
    the GEMMs are costed with (``kernel_stack``: llm-foundry's ``amp_fp8``, the PyTorch-stack
    FP8 runs, which validate under torchtitan's data-parallel rules, swaps in Transformer
    Engine's FP8 linears). Per-tensor scaling only: MXFP8 and NVFP4 are costed as Transformer
    Engine's everywhere. The two differ in what they hold and gather
    (planner.model.terms.step_terms: torchao keeps the 16-bit linear inputs and one layer's FP8
    weight copy, and its tensor-parallel all-gathers are FP8 only at dynamic scaling)."""
    library = training.fp8_library or ("torchao" if framework == "torchtitan"
                                       else "transformer_engine")
    return (training.precision == "fp8" and training.fp8_recipe != "mxfp8"
            and library == "torchao")


def sharding_refusal(training, name: str | None, mode: str) -> str | None:
    """Why the instance's ``[training]`` cannot run with sharding ``mode`` under the named
    framework (or Megatron-LM's rules without one), or None: FP8 parameters
    (``fp8_param_gather``) and master weights as remainders (``store_param_remainders``) each
    need one of the framework's modes for them, as do bf16 moments beside an fp32 master
    (``main_params_dtype``). The one test of these rules, for the plan's
    input check, the search's sharding modes and the exports alike."""
    fw = framework_of(name)
    if training.fp8_param_gather and torchao_float8(training, name) and \
            fw.name != "torchtitan":
        # torchao's only FP8 parameters are FSDP2's FP8 all-gather, which torchtitan runs
        return ("training.fp8_param_gather = true with torchao's FP8 linears (fp8_library) is "
                "FSDP2's FP8 all-gather (torchtitan's enable_fsdp_float8_all_gather), which "
                f"needs constraints.framework = \"torchtitan\" (the rules now: {fw.label}'s); "
                "Megatron-LM's and NeMo's FP8 parameters are Transformer Engine's: "
                "fp8_library = \"transformer_engine\"")
    mx_params = training.fp8_param_gather and training.fp8_recipe == "mxfp8"
    # (MXFP8 and FP4 parameters: the distributed optimizer's path, where the framework has it)
    zero1 = tuple(m for m in fw.fp8_param_gather_modes if m == "optim")
    for key, on, modes, source, what in (
            ("fp8_param_gather", training.fp8_param_gather, fw.fp8_param_gather_modes,
             fw.fp8_param_gather_source, "FP8 parameters"),
            ("fp8_param_gather", mx_params, zero1, MXFP8_PARAMS_SOURCE, "MXFP8 parameters"),
            ("fp4_param_gather", training.fp4_param_gather, zero1, FP4_PARAMS_SOURCE,
             "FP4 parameters"),
            ("store_param_remainders", training.store_param_remainders,
             fw.param_remainders_modes, fw.param_remainders_source,
             "master weights stored as remainders"),
            ("main_params_dtype", training.main_params_dtype is not None,
             tuple(m for m in fw.param_remainders_modes if m == "optim"), BF16_MOMENTS_SOURCE,
             "bf16 Adam moments beside an fp32 master")):
        if not on or mode in modes:
            continue
        said = f"training.{key} = " + ('"fp32"' if key == "main_params_dtype" else "true")
        if not modes:
            return f"{said}: {fw.label} has no {what} ({source})"
        listed = " | ".join('"%s"' % m for m in modes)
        return f"{said} needs dp_sharding = {listed}, not \"{mode}\" ({source})"
    return None


def framework_violations(name: str | None, plan) -> list[str]:
    """The framework rules a plan breaks (``name`` None: none), as sentences naming the rule:
    a sharding mode the framework does not run, one it runs only without pipeline
    parallelism, plain DDP beside other parallelism (a shard group of one included where the
    framework runs that as DDP), HSDP where it has none, an expert grid its device mesh cannot
    build, interleaving or context parallelism where it has none, and the overlap rules of
    Megatron-LM's argument checks. In the search's form :func:`framework_bar` holds those that
    depend on the degrees; the rest the search applies where it chooses the knobs (the
    sharding modes and HSDP it offers: formulations/space.py ``build_space``; the overlap
    pins: :func:`param_gather_refusal`)."""
    if name is None:
        return []
    fw = FRAMEWORKS[name]
    return (_sharding_violations(fw, plan) + _expert_violations(fw, plan)
            + _pipeline_violations(fw, plan) + _overlap_violations(fw, plan))


def param_gather_refusal(fw: Framework, gather: bool, reduce: bool, where: str = "") -> str | None:
    """Why the framework refuses parameter-gather overlap ``gather`` beside grad-reduce overlap
    ``reduce`` (each the pin or the framework's default), or None."""
    if not (fw.validate_args_overlaps and gather and not reduce):
        return None
    return (f"{where}overlap_param_gather = true needs {where}overlap_grad_reduce = true under "
            f"{fw.label} (megatron/training/arguments.py validate_args: 'Must use "
            f"--overlap-param-gather with --overlap-grad-reduce'): set {where}overlap_grad_reduce "
            f"= true, or {where}overlap_param_gather = false")


def _overlap_violations(fw: Framework, plan) -> list[str]:
    """Megatron-LM's validate_args on the overlap switches (:attr:`Framework.
    validate_args_overlaps`): parameter-gather overlap without grad-reduce overlap, and an
    interleaved pipeline of two ranks without p2p overlap."""
    out = []
    gather = param_gather_refusal(fw, plan.overlap_param_gather, plan.overlap_grad_reduce)
    if gather:
        out.append(gather)
    if fw.validate_args_overlaps and plan.vp > 1 and plan.pp <= 2 \
            and not plan.overlap_p2p_comm:
        out.append(f"vp = {plan.vp} with overlap_p2p_comm = false needs pp > 2 (pp = "
                   f"{plan.pp}): {fw.label}'s validate_args refuses an interleaved schedule "
                   "without p2p overlap on two pipeline ranks")
    return out


def _sharding_violations(fw: Framework, plan) -> list[str]:
    """The data-parallel sharding rules: the modes it runs, with or without a pipeline, plain
    DDP only in one dimension, HSDP."""
    mode, out = plan.dp_sharding, []
    if mode not in fw.sharding_modes:
        out.append(f"{fw.label} runs dp_sharding {' | '.join(fw.sharding_modes)}, not "
                   f"\"{mode}\"")
    elif mode in fw.sharding_needs_no_pp and plan.pp > 1:
        out.append(f"dp_sharding = \"{mode}\" needs pp = 1 under {fw.label} (pp = {plan.pp}): "
                   f"{fw.sharding_no_pp_source}")
    elif mode == "none" and fw.ddp_needs_1d and max(plan.tp, plan.pp, plan.cp) > 1:
        out.append(f"dp_sharding = \"none\" is plain DDP, which {fw.label} runs only without "
                   f"tensor, pipeline and context parallelism (tp = {plan.tp}, pp = {plan.pp}, "
                   f"cp = {plan.cp}): use optim_grads_params (FSDP2)")
    elif _unit_shard_ddp(fw, plan):
        out.append(f"dp_shard_size = 1 without context parallelism is plain DDP over the "
                   f"{plan.dp_replicate} replicas under {fw.label} (distributed/parallel_dims.py: "
                   "fsdp_enabled = dp_shard_enabled or cp_enabled), which it runs only without "
                   f"tensor and pipeline parallelism (tp = {plan.tp}, pp = {plan.pp}: \"DDP has "
                   "not supported > 1D parallelism\"): use a shard group of 2 or more ranks")
    if not fw.hsdp and mode != "none" and plan.dp_replicate > 1:
        out.append(f"{fw.label} has no HSDP: dp_shard_size = {plan.dp_shard_size} must be "
                   f"dp = {plan.dp}")
    return out


def _unit_shard_ddp(fw: Framework, plan) -> bool:
    """A sharded mode whose shard group is one rank, without context parallelism, replicated,
    beside tensor or pipeline parallelism: what a framework that runs it as DDP cannot."""
    return (fw.unit_shard_is_ddp and plan.dp_sharding != "none" and plan.dp_shard_size == 1
            and plan.cp == 1 and plan.dp_replicate > 1 and max(plan.tp, plan.pp) > 1)


def _expert_violations(fw: Framework, plan) -> list[str]:
    """Expert parallelism the framework's device mesh cannot build: torchtitan takes it from
    the shard group x cp x tp ranks (plain DDP: a shard degree of 1)."""
    ep = getattr(plan, "ep", 1)
    if not fw.ep_in_shard_group or ep == 1:
        return []
    shard = 1 if plan.dp_sharding == "none" else plan.dp_shard_size
    ranks = shard * plan.cp * plan.tp
    if ranks % ep == 0:
        return []
    return [f"ep = {ep} must divide dp_shard_size * cp * tp = {shard} * {plan.cp} * {plan.tp} "
            f"= {ranks} under {fw.label} (distributed/parallel_dims.py build_mesh: efsdp = "
            "dp_shard * cp * tp // (etp * ep) with etp = 1; the replicas are outside it)"]


def _pipeline_violations(fw: Framework, plan) -> list[str]:
    """Interleaving (vp > 1) and context parallelism (cp > 1) where the framework has none."""
    out = []
    if not fw.interleaving and plan.vp > 1:
        out.append(f"vp = {plan.vp}: {fw.label} has no interleaved pipeline "
                   f"({fw.interleaving_source})")
    if not fw.context_parallel and plan.cp > 1:
        out.append(f"cp = {plan.cp}: {fw.label} has no context parallelism "
                   f"({fw.context_parallel_source})")
    return out


def framework_bar(fw: Framework, named: str | None, mode: str, x, p2p_overlap: bool = True):
    """1 (or more) where the named framework cannot run ``mode`` (with p2p overlap
    ``p2p_overlap``) on the grid ``x`` (0 without a named framework): the rules of
    :func:`framework_violations` that depend on the degrees, as indicator functions of them
    (planner/model/algebra.py), so the evaluator, the enumerator and the MIP encoders leave the
    same plans (the model charges the bar as memory no GPU has). The rest are the pins' and
    defaults' (the modes and HSDP the search offers, :func:`param_gather_refusal`)."""
    if named is None:
        return 0.0
    bar = 0.0
    if fw.validate_args_overlaps and not p2p_overlap:
        # interleaved (v > 1) on two ranks (p > 1 when interleaved: the rule interleave_pp)
        bar = bar + gt1(x.v) * le2(x.p)
    if mode in fw.sharding_needs_no_pp:
        bar = bar + gt1(x.p)
    if mode == "none" and fw.ddp_needs_1d:
        bar = bar + gt1(x.t * x.p * x.c)
    if mode != "none" and fw.unit_shard_is_ddp:
        # dp / r = 1 (d = r > 1 replicas), cp = 1, beside tp or pp
        bar = bar + eq1(x.d / x.r) * eq1(x.c) * gt1(x.r) * gt1(x.t * x.p)
    if fw.ep_in_shard_group and not is_one(x.e):
        # plain DDP has a shard degree of 1 (and no tp / cp beside it): ep must be 1; the
        # sharded mode's quotient is a positive whole number or the mesh cannot be built
        bar = bar + (gt1(x.e) if mode == "none" else not_whole(x.d * x.c * x.t / (x.r * x.e)))
    if not fw.interleaving:
        bar = bar + gt1(x.v)
    if not fw.context_parallel:
        bar = bar + gt1(x.c)
    return bar


def optimizer_offload_refusal(training, name: str | None) -> str | None:
    """Why the optimizer cannot go to the host with these ``[training]`` settings under the
    named framework (Megatron-LM's rules without one), or None. Megatron-Core's hybrid device
    optimizer takes FP8 parameters under delayed scaling only: Megatron-LM's validate_args
    asserts "When `--fp8-param-gather` is enabled, the optimizer cpu offload must be used in
    conjunction with `--fp8-recipe delayed`" (its default recipe; the planner's None)."""
    fw = framework_of(name)
    if (fw.megatron_core and training.fp8_param_gather
            and not delayed_scaling(training)):
        return (f"optimizer_offload = true with training.fp8_param_gather = true needs "
                f"fp8_recipe = \"delayed\", not \"{training.fp8_recipe}\" (Megatron-LM "
                "validate_args: the optimizer CPU offload takes FP8 parameters under delayed "
                "scaling only)")
    if training.main_params_dtype is not None:
        # (Megatron-Core's HybridDeviceOptimizer is built without the precision-aware dtypes
        # and steps torch's CPU Adam on fp32 copies: cpu_offloading/hybrid_optimizer.py)
        return ("optimizer_offload = true with training.main_params_dtype = \"fp32\": "
                "Megatron-Core's CPU optimizer (HybridDeviceOptimizer) keeps fp32 moments, not "
                "the bf16 ones of the GPU's precision-aware optimizer; drop main_params_dtype "
                "(and optimizer_dtype = \"bf16\") to offload, or keep the optimizer on the GPU")
    return None


def offload_violations(name: str | None, plan, training) -> list[str]:
    """The host-offload rules a plan breaks, as sentences naming the rule: activation offload
    is Megatron-Core's (``--cpu-offloading-num-layers N``: ``N`` below the model's layers, no
    pipeline parallelism, no recompute), the optimizer offload of each framework runs with
    some sharding modes only (without a named framework, Megatron-LM's rules) and, with the
    instance's ``[training]`` settings, not beside FP8 parameters under current scaling
    (:func:`optimizer_offload_refusal`)."""
    fw = framework_of(name)
    out = []
    refused = optimizer_offload_refusal(training, name) if plan.optimizer_offload else None
    if refused:
        out.append(refused)
    n = plan.offload_layers
    if n:
        if not fw.activation_offload:
            out.append(f"offload_layers = {n}: {fw.label} has no activation offload "
                       f"({fw.offload_source})")
        if plan.pp > 1:
            out.append(f"offload_layers = {n} needs pp = 1 (pp = {plan.pp}): Megatron-Core "
                       "has no pipeline parallelism with CPU offloading (TransformerConfig)")
        if plan.recompute != "none":
            out.append(f"offload_layers = {n} needs recompute = \"none\" (recompute = "
                       f"\"{plan.recompute}\"): Megatron-Core's CPU offloading does not work "
                       "with activation recompute (TransformerConfig)")
        if plan.layers and n >= plan.layers:
            out.append(f"offload_layers = {n} must be below the model's {plan.layers} layers "
                       "(Megatron-Core: CPU offloading can be done only for fewer layers "
                       "than num_layers)")
    if plan.optimizer_offload and plan.dp_sharding not in fw.optimizer_offload_modes:
        runs = (f"with dp_sharding {' | '.join(fw.optimizer_offload_modes)} only"
                if fw.optimizer_offload_modes else "not at all")
        out.append(f"optimizer_offload = true with dp_sharding = \"{plan.dp_sharding}\": "
                   f"{fw.label} offloads the optimizer {runs} ({fw.offload_source})")
    return out

"""Megatron-LM launch arguments (``pretrain_gpt.py``, ``megatron/training/arguments.py``) with
Megatron-Core's default rank order ``tp-cp-ep-dp-pp``: the mapping is in :mod:`planner.app.emit`'s
docstring and docs/launch_configs.md."""

from __future__ import annotations

from planner.app.emit.common import (EAGER_ON_TE, OP_SELECTIVE, bf16_moments_fp32_master,
                                     comment_lines, ep, fmt_intra, fp8_library_note, header,
                                     intra_factors, layers_per_stage, megatron_fsdp, mla_widths,
                                     moe_fields, mxfp8_params, newer_schedule_note,
                                     norm_bias_config, op_selective, overlaps, placed, rank_order,
                                     recompute_modules, segment, stages_text, uneven, window_config)
from planner.model.frameworks import cp_exchange, te_holds_master
from planner.model.terms import LOW_PRECISIONS, keeps_remainders, reduce_dtype
from planner.model.instance import Instance
from planner.model.plan import ORDER, Plan


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


#: TransformerConfig switches of :func:`norm_bias_config` and their Megatron-LM flags (store_true)
_SWITCHES = (("add_qkv_bias", "--add-qkv-bias"), ("qk_layernorm", "--qk-layernorm"),
             ("qk_l2_norm", "--qk-l2-norm"))


def _megatron_norm_bias(m) -> list[str]:
    """:func:`norm_bias_config` as Megatron-LM arguments (its defaults are LayerNorm, a bias on
    every linear layer and no QK norm, as the model's are)."""
    c = norm_bias_config(m)
    args = [f"--normalization {c['normalization']}"] if c["normalization"] != "LayerNorm" else []
    if not c["add_bias_linear"]:
        args.append("--disable-bias-linear")
    args += [flag for field, flag in _SWITCHES if c[field]]
    if c["softmax_type"] != "vanilla":
        args.append(f"--softmax-type {c['softmax_type']}")
    return args


def _megatron(inst: Instance, plan: Plan) -> str:
    m = inst.model
    precision = inst.spec.training.precision
    node = plan.node_size       # (the NVLink segment the placement fills)
    intra = intra_factors(plan)
    order = rank_order(plan)
    comments = header(inst, plan, "Megatron-LM pretrain_gpt.py arguments")
    comments.append(f"data-parallel size {plan.dp} is implied: world size / (tensor * pipeline * "
                    f"context) = {plan.gpus} / ({plan.tp}*{plan.pp}*{plan.cp})")
    extra: list[str] = []
    if order == "default":
        comments.append(
            "rank order: Megatron's default (tp innermost, then cp, dp, pp) fills each "
            f"{segment(plan)} with {fmt_intra(intra)}, the placement the plan assumes")
    elif order == "tp-pp-dp":
        comments.append(
            f"rank order: the plan places {fmt_intra(intra)} per {segment(plan)}, not "
            "Megatron's default (tp innermost, then cp, dp, pp); --use-tp-pp-dp-mapping "
            "(order tp-pp-dp) gives it")
        extra.append("--use-tp-pp-dp-mapping")
    else:
        comments.append(
            f"rank order: the plan places {fmt_intra(intra)} per {segment(plan)}, which "
            f"Megatron's default order (tp innermost, then cp, dp, pp) does not give (it gives "
            f"{fmt_intra(placed(plan, node, ORDER))}); order the hosts or ranks to match, "
            "or expect the communication times to differ from the plan's")
    if precision in LOW_PRECISIONS:
        comments.append(f"{precision} needs Transformer Engine (--transformer-impl "
                        "transformer_engine)")
    if (note := fp8_library_note(inst, "megatron")) is not None:
        comments.append(note)
    if inst.kernel_stack == "pytorch":
        comments.append(EAGER_ON_TE)
    comments.append(f"vocabulary {m.vocab} comes from the tokenizer arguments (not emitted)")
    comments.append("not emitted, as they do not change the cost: "
                    + ("--rotary-base (Megatron-LM's default 10000; Llama 3 trains with "
                       "500000), " if m.position_embedding == "rope" else "")
                    + "--norm-epsilon, the initialisation and the optimizer's hyper-parameters: "
                    "take them from the model's own recipe")
    if op_selective(inst, plan):
        comments.append(OP_SELECTIVE)
    env: list[str] = []
    if (plan.tp > 1 or plan.cp > 1) and megatron_fsdp(plan):
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
    elif plan.vp > 1 and uneven(plan):
        # an uneven split is given per rank; interleaving then counts chunks per rank
        args.append(f"--num-virtual-stages-per-pipeline-rank {plan.vp}")
    elif plan.vp > 1:
        args.append(f"--num-layers-per-virtual-pipeline-stage {layers_per_stage(inst, plan)}")
    if plan.first_stage_layers:
        args.append(f"--decoder-first-pipeline-num-layers {plan.first_stage_layers}")
    if plan.last_stage_layers:
        args.append(f"--decoder-last-pipeline-num-layers {plan.last_stage_layers}")
    if plan.account_for_embedding:
        args.append("--account-for-embedding-in-pipeline-split")
    if plan.account_for_loss:
        args.append("--account-for-loss-in-pipeline-split")
    if uneven(plan):
        comments.append("pipeline layout: decoder layers per rank " + stages_text(plan))
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
    ov = overlaps(plan)
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
    comments += newer_schedule_note(plan)
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
        args += [f"--{key.replace('_', '-')} {value}" for key, value in mla_widths(m).items()]
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
    moe = moe_fields(inst)
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
        args += [f"--expert-model-parallel-size {ep(plan)}", "--expert-tensor-parallel-size 1"]
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
                if mxfp8_params(inst):
                    # the 16-bit all-gather through the gradient buffer the model costs
                    args.append("--reuse-grad-buf-for-mxfp8-param-ag")
    lines = comment_lines(comments) + env
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
    if megatron_fsdp(plan):
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
    if bf16_moments_fp32_master(inst):
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

"""NeMo 2 recipe overrides (``nemo.collections.llm`` recipes: ``trainer.strategy`` a
``MegatronStrategy``, ``model.config`` Megatron-Core's ``TransformerConfig``, ``optim.config`` its
``OptimizerConfig``) as YAML: the mapping is in :mod:`planner.app.emit`'s docstring."""

from __future__ import annotations

from planner.app.emit.common import (EAGER_ON_TE, OP_SELECTIVE, bf16_moments_fp32_master,
                                     comment_lines, ep, fmt_intra, fp8_library_note, header,
                                     host_gpus, intra_factors, megatron_fsdp, mla_widths,
                                     moe_fields, mxfp8_params, newer_schedule_note,
                                     norm_bias_config, norm_bias_words, op_selective, overlaps,
                                     rank_order, recompute_modules, segment, stages_text, uneven,
                                     window_config)
from planner.model.frameworks import cp_exchange, te_holds_master
from planner.model.terms import keeps_remainders, reduce_dtype
from planner.model.instance import Instance
from planner.model.plan import Plan


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
    moe = moe_fields(inst)
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
    comments = header(inst, plan, "NeMo 2 recipe overrides (nemo.collections.llm)", torchrun=False)
    comments += [
        "apply to a pretrain recipe (recipe.trainer.strategy.tensor_model_parallel_size = ...) or as",
        "dotted key=value overrides of `nemo llm pretrain --factory <recipe>`",
    ]
    order = rank_order(plan)
    if order == "tp-pp-dp":
        comments.append(f"rank order: the plan places {fmt_intra(intra_factors(plan))} per "
                        f"{segment(plan)}, not Megatron-Core's default (tp innermost, then cp, "
                        "dp, pp); use_tp_pp_dp_mapping (order tp-pp-dp) gives it")
    elif order is None:
        comments.append(f"rank order: the plan places {fmt_intra(intra_factors(plan))} per "
                        f"{segment(plan)}, not Megatron-Core's default (tp innermost, then cp, "
                        "dp, pp), and no stock order gives it")
    if (note := fp8_library_note(inst, "nemo")) is not None:
        comments.append(note)
    if inst.kernel_stack == "pytorch":
        comments.append(EAGER_ON_TE)
    if inst.spec.training.fp4_param_gather:
        comments.append("fp4_param_gather: cannot express; NeMo 2's MegatronMixedPrecision has no "
                        "FP4-parameter switch (Megatron-Bridge's MixedPrecisionConfig."
                        "fp4_param_gather, Megatron-LM --fp4-param-gather); without it the "
                        "weights stay bf16 beside their NVFP4 copies (more memory than planned)")
    if op_selective(inst, plan):
        comments.append(OP_SELECTIVE)
    if mxfp8_params(inst) and overlaps(plan)["overlap_param_gather"]:
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
            or bf16_moments_fp32_master(inst)):
        comments.append("exp_avg_dtype and exp_avg_sq_dtype are torch.dtype fields of "
                        "OptimizerConfig: in a Python recipe write "
                        "recipe.optim.config.exp_avg_dtype = torch.bfloat16 (and exp_avg_sq_dtype)")
    if uneven(plan):
        comments.append("pipeline layout: decoder layers per rank " + stages_text(plan))
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
                                 if on] + [norm_bias_words(m)]))
    comments.append("overlaps as the plan costs them: a recipe's MegatronCommOverlapCallback "
                    "overrides these keys, so give it the same values (its tp_comm_overlap, "
                    "overlap_p2p_comm, overlap_grad_reduce, overlap_param_gather arguments)")
    comments += newer_schedule_note(plan)
    ov = overlaps(plan)
    if ov["tp_comm_overlap"]:
        comments.append("tp_comm_overlap: model.config.tp_comm_overlap alone does not overlap; "
                        "the trainer needs MegatronCommOverlapCallback(tp_comm_overlap=True) "
                        "among its callbacks, which sets up Transformer Engine's userbuffers "
                        "(nemo/lightning/pytorch/callbacks/megatron_comm_overlap.py, "
                        "initialize_ub)")
    fsdp = megatron_fsdp(plan)
    replicas = plan.dp_replicate if plan.dp_sharding != "none" and plan.dp_replicate > 1 else 0
    fp32_reduce = reduce_dtype(inst) == "fp32"
    remainders = keeps_remainders(inst, plan.knobs)
    tree = {
        "trainer": {
            "num_nodes": plan.nodes,
            "devices": host_gpus(plan),        # Lightning's devices: GPUs per host
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
                   if uneven(plan) else {}),
                "context_parallel_size": plan.cp,
                **({"expert_model_parallel_size": ep(plan), "expert_tensor_parallel_size": 1}
                   if moe_fields(inst) else {}),
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
                **({"reuse_grad_buf_for_mxfp8_param_ag": True} if mxfp8_params(inst) else {}),
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
                **({"multi_latent_attention": True, "q_lora_rank": None, **mla_widths(m)}
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
                   if plan.recompute == "selective" and not op_selective(inst, plan)
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
                   if bf16_moments_fp32_master(inst) else {}),
            },
        },
    }
    return "\n".join(comment_lines(comments) + _yaml(tree)) + "\n"

"""A torchtitan 0.2.x TOML job config (``torchtitan/config/job_config.py`` of 0.2.2): the
mapping, and what torchtitan 0.3 renamed, are in :mod:`planner.app.emit`'s docstring."""

from __future__ import annotations

import json

from planner.app.emit.common import (comment_lines, ep, fmt_intra, fp8_library_note, header,
                                     intra_factors, layers_per_stage, mla_widths, moe_fields,
                                     norm_bias_words, overlaps, placed, recompute_modules, segment,
                                     stages_text, uneven, window_words)
from planner.model.frameworks import compiled_loss, cp_exchange, torchao_float8
from planner.model.terms import reduce_dtype, selective_recompute
from planner.model.instance import Instance
from planner.model.plan import ORDER, Plan


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
    stack, async_tp = inst.kernel_stack, overlaps(plan)["tp_comm_overlap"]
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
    comments = header(inst, plan, "torchtitan 0.2 job config (--job.config_file)")
    comments.append(
        f"model shape (layers {m.layers}, hidden {m.hidden}, heads {m.heads}, "
        + (("multi-head latent attention: " + ", ".join(
            f"{k} {v}" for k, v in mla_widths(m).items()) + ", ") if m.mla
           else f"kv heads {m.kv}, ")
        + (f"head dim {m.head_dim}, " if m.head_dim is not None else "")
        + f"ffn {m.ffn}, vocab {m.vocab}"
        + (", {experts} experts, top-{top_k}, expert ffn {ffn}".format(**moe_fields(inst))
           if moe_fields(inst) else "")
        + f", {norm_bias_words(m)}"
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
        comments.append(window_words(m) + (
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
    if intra_factors(plan) != placed(plan, node, ORDER):
        comments.append(f"rank order: the plan places {fmt_intra(intra_factors(plan))} per "
                        f"{segment(plan)}; torchtitan's mesh (pp, dp, cp, tp; tp innermost) "
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
    ov = overlaps(plan)
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
    if (note := fp8_library_note(inst, "torchtitan")) is not None:
        comments.append(note)
    if precision == "fp8" and moe_fields(inst):
        comments.append(_torchtitan_fp8_experts(plan))
    if moe_fields(inst) and inst.spec.training.moe_token_dispatcher != "alltoall":
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
        par["pipeline_parallel_layers_per_stage"] = layers_per_stage(inst, plan)
        # the first / last of the pp*vp virtual stages hold that many layers fewer (torchtitan
        # shortens only those two; 0: exactly pp*vp equal stages)
        k = plan.knobs
        spread = plan.vp > 1 and k.explicit_layout
        par["pipeline_parallel_first_stage_less_layers"] = 0 if spread else int(k.first_short)
        par["pipeline_parallel_last_stage_less_layers"] = 0 if spread else int(k.last_short)
        if uneven(plan):
            comments.append("pipeline layout: decoder layers per rank " + stages_text(plan))
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
    if moe_fields(inst):
        par["expert_parallel_degree"] = ep(plan)
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
    lines = comment_lines(comments)
    for name, body in sections:
        lines += ["", f"[{name}]"] + [f"{k} = {_toml_value(v)}" for k, v in body.items()]
    return "\n".join(lines) + "\n"

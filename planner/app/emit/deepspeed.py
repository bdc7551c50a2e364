"""A DeepSpeed JSON config (0.19 key names), with the degrees DeepSpeed sets in code under the
custom key ``plan_parallelism``: the mapping is in :mod:`planner.app.emit`'s docstring."""

from __future__ import annotations

import json

from planner.app.emit.common import (BF16_STATES, EXPANDABLE, bf16_without_master, costed, ep,
                                     host_gpus, intra_factors, layers_per_stage, moe_fields,
                                     op_selective, overlaps, recompute_modules, uneven, window_words)
from planner.model.frameworks import SHARDING_MODES
from planner.model.terms import reduce_dtype
from planner.model.instance import Instance
from planner.model.plan import Plan


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
                              "overlap_comm": overlaps(plan)["overlap_grad_reduce"],
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
                                           op_selective(inst, plan),
                                           recompute_modules(inst, plan)),
            "plan": plan.label(),
            "costed": costed(inst, plan),
            "tensor": plan.tp,
            "pipeline": plan.pp,
            "data": plan.dp,
            "context": plan.cp,
            **({"expert": ep(plan), "expert_tensor": 1} if moe_fields(inst) else {}),
            "virtual_pipeline": plan.vp,
            "layers_per_virtual_stage": layers_per_stage(inst, plan),
            "stage_layers": plan.stage_layers,
            **({"layout_how": (
                "cannot express in the JSON: PipelineModule(partition_method=...) offers "
                "'uniform', 'parameters' and 'type:<regex>', not decoder layers per stage; the "
                "model code must build the stages of stage_layers (e.g. Megatron-DeepSpeed "
                "with the megatron export's layout flags)")} if uneven(plan) else {}),
            # (the model code builds the attention: the window the plan costs)
            **({"window_how": window_words(inst.model) + ": DeepSpeed's JSON has no model "
                "keys; the model code must build it"}
               if inst.model.windowed else {}),
            "sequence_parallel": plan.sequence_parallel,
            "recompute": plan.recompute,
            **({"recompute_layers": plan.recompute_layers} if plan.recompute_layers else {}),
            "precision": precision,
            "nodes": plan.nodes,
            "gpus_per_node": host_gpus(plan),
            "gpus": plan.gpus,
            # (the factors of one NVLink segment: a node, or several hosts on rack-scale
            # systems, where nvlink_domain says how many GPUs)
            "intra_node": intra_factors(plan),
            "nvlink_domain": plan.node_size,
            # overlaps the plan costs that DeepSpeed's JSON cannot switch on
            "overlap_cannot_express": [n for n, on in overlaps(plan).items()
                                       if on and n != "overlap_grad_reduce"],
            **({"optimizer_dtype_how": BF16_STATES}
               if bf16_without_master(inst) else {}),
            **({"environment": EXPANDABLE}
               if inst.spec.training.expandable_segments else {}),
        },
    }
    return json.dumps(doc, indent=2) + "\n"

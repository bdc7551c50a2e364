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

FrameworkName = Literal["megatron", "nemo", "torchtitan", "deepspeed"]


@dataclass(frozen=True)
class Framework:
    """One framework's capabilities and defaults (fields are added with the knobs they set)."""

    name: str
    label: str                      # as the user reads it
    #: the overlap switches it turns on when the user does not say (docs/model.md, "Overlap")
    overlap_defaults: tuple[tuple[str, bool], ...] = ()
    #: the overlap switches its configuration can turn on (the others it cannot run)
    overlaps_expressible: tuple[str, ...] = ()
    #: parameters per gradient bucket of its overlapped data-parallel reduction
    grad_bucket_params: int = 40_000_000

    def overlap_default(self, name: str) -> bool:
        """The framework's default for an overlap knob (:data:`OVERLAP_KNOBS`)."""
        return dict(self.overlap_defaults).get(name, False)


#: The four overlap knobs (Megatron-Core / NeMo names; their cost rules: planner/model/terms.py)
OVERLAP_KNOBS = ("overlap_grad_reduce", "overlap_param_gather", "tp_comm_overlap",
                 "overlap_p2p_comm")

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
#   ZeRO-1/2 (true for ZeRO-3); no tensor-parallel, parameter-gather or p2p overlap switch.
# Gradient buckets (parameters): Megatron-Core DistributedDataParallelConfig.bucket_size defaults
# to max(40M, 1M * dp) (40M is the value up to dp = 40; the rule keeps the 40M); NeMo's
# MegatronCommOverlapCallback sets 128 * 1024 * 1024 when dp > 1; torchtitan reduces per
# transformer block (fully_shard / replicate per block: one layer, no other cap); DeepSpeed
# zero_optimization.reduce_bucket_size defaults to 5e8 elements.
FRAMEWORKS: dict[str, Framework] = {
    "megatron": Framework("megatron", "Megatron-LM",
                          overlap_defaults=(("overlap_p2p_comm", True),),
                          overlaps_expressible=OVERLAP_KNOBS, grad_bucket_params=40_000_000),
    "nemo": Framework("nemo", "NeMo",
                      overlap_defaults=(("overlap_grad_reduce", True),
                                        ("overlap_param_gather", True),
                                        ("overlap_p2p_comm", True)),
                      overlaps_expressible=OVERLAP_KNOBS, grad_bucket_params=128 * 1024 * 1024),
    "torchtitan": Framework("torchtitan", "torchtitan",
                            overlap_defaults=(("overlap_grad_reduce", True),
                                              ("overlap_param_gather", True)),
                            overlaps_expressible=("overlap_grad_reduce", "overlap_param_gather",
                                                  "tp_comm_overlap"),
                            grad_bucket_params=1 << 40),
    "deepspeed": Framework("deepspeed", "DeepSpeed",
                           overlaps_expressible=("overlap_grad_reduce",),
                           grad_bucket_params=500_000_000),
}

#: the framework whose defaults apply when ``[constraints] framework`` is not given
DEFAULT_FRAMEWORK = "megatron"


def framework_of(name: str | None) -> Framework:
    """The framework an instance names, or the default one."""
    return FRAMEWORKS[name or DEFAULT_FRAMEWORK]

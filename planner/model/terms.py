"""The AMPeD step-time and memory model: the single source of truth for every number.

:func:`step_terms` is the model. It is plain arithmetic on the degrees in :class:`Degrees`, so it
evaluates a fixed plan (numbers), a whole search space at once (numpy arrays, the enumerator) or
the step time as a signomial for the MIP encoders (:class:`~planner.model.algebra.Sig`). The total step
time is the sum of the named terms (docs/model.md, "Step time"):

``step = compute + bubble + tp_comm + cp_comm + ep_comm + pp_comm + dp_comm + optimizer + offload``
(:data:`TIME_TERMS`)

Reference: Moolchandani et al., "AMPeD: An Analytical Model for Performance in Distributed
Training of Transformers", ISPASS 2023 (Sec. III: compute, communication, bubble, memory),
extended as docs/model.md describes (recompute, sequence/context parallelism, interleaving, the
distributed optimizer, GQA, gated MLPs, FP8).

It gives the terms only: :func:`planner.model.evaluate.evaluate` turns one
:class:`~planner.model.plan.Plan` into a :class:`~planner.model.evaluate.StepReport` with the
breakdown, memory per GPU against capacity, MFU, days and cost, and the list of limits the plan
violates (never an exception for a plan that does not fit).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from planner.model.algebra import (Sig, capped_quotient, eq1, gt1, gt2, is_one, is_zero,
                                   quotient_excess, ring_share, run_max, steps, vmax)
from planner.model.catalog import GiB
from planner.model.collectives import all_to_all, allreduce, dedup_all_to_all, ring_step
from planner.model.frameworks import (OVERLAP_KNOBS, compiled_loss, cp_exchange,
                                      delayed_scaling, framework_bar, framework_of,
                                      grad_reduce_dtype, logit_bytes, selective_recompute_of,
                                      torchao_float8)
from planner.model.instance import FP8_COPY_BYTES, Hardware, Instance, narrow_bytes
from planner.model.memo import IdentityCache
from planner.model.plan import Degrees, Knobs
from planner.model.schema import default_reserve_GiB, recompute_module_set
from planner.model.workload import Shape

#: The step time's terms, each with its words: a report's row and a plot's legend entry.
TIME_TERM_LABELS = {
    "compute": ("compute (fwd + bwd + recompute)", "compute"),
    "bubble": ("pipeline bubble", "pipeline bubble"),
    "tp_comm": ("tensor-parallel comm", "TP comm"),
    "cp_comm": ("context-parallel comm (exposed)", "CP comm"),
    "ep_comm": ("expert-parallel all-to-all", "EP all-to-all"),
    "pp_comm": ("pipeline p2p comm", "PP p2p"),
    "dp_comm": ("data-parallel grad reduction", "DP grad reduction"),
    "optimizer": ("optimizer step (HBM-bound)", "optimizer step"),
    "offload": ("host offload transfers (exposed)", "host offload"),
}
TIME_TERMS = tuple(TIME_TERM_LABELS)
#: The communication terms of the step time (each a collective or transfer on its links).
COMM_TERMS = ("tp_comm", "cp_comm", "ep_comm", "pp_comm", "dp_comm")
MEMORY_TERMS = ("weights", "gradients", "optimizer_states", "activations", "logits",
                "comm_buffers")

#: Bytes per parameter in mixed-precision Adam (Megatron-LM; Korthikanti et al. Sec. 4):
#: 16-bit weights, fp32 gradients, fp32 master weights + two Adam moments.
WEIGHT_BYTES, GRAD_BYTES, OPTIMIZER_BYTES = 2, 4, 12
#: The optimizer's states per parameter by ``[training] optimizer_dtype``, and the gradient
#: shard it steps on when gradients are 16-bit: fp32, the 12 above plus an fp32 main gradient
#: (Megatron-LM's fp16 row, 20 bytes); bf16, two bf16 moments and the reduced bf16 gradient
#: shard, no master copy (NeMo 2.0 megatron_base_model.setup_optimization: store_params =
#: False when optim.dtype is the model's dtype; Apex DistributedFusedAdam StateBucket holds
#: exp_avg / exp_avg_sq in that dtype and grads_shard in grad_sync_dtype)
OPTIMIZER_STATE_BYTES = {"fp32": (OPTIMIZER_BYTES, GRAD_BYTES), "bf16": (4, 2)}
#: The fp32 master weight's bytes among :data:`OPTIMIZER_STATE_BYTES`: 4 with fp32 states, none
#: with bf16 ones (NeMo 1's distributed_fused_adam keeps no master when the states are the
#: weights' dtype). ``[training] store_param_remainders`` keeps the master as its lower 16
#: bits beside the bf16 weight (an int16 state: Apex DistributedFusedAdam
#: ``param_remainders_shard``, Megatron-Core ``master_param``), :data:`MASTER_REMAINDER_BYTES`:
#: 10 bytes of states with fp32 moments, 6 with bf16 ones (Megatron-Core's precision-aware
#: optimizer with ``exp_avg_dtype`` / ``exp_avg_sq_dtype`` bf16)
MASTER_BYTES = {"fp32": 4, "bf16": 0}
MASTER_REMAINDER_BYTES = 2
#: bf16 moments beside a whole fp32 master (``[training] main_params_dtype = "fp32"``,
#: Megatron-Core's precision-aware optimizer with ``exp_avg_dtype`` / ``exp_avg_sq_dtype``
#: bf16 and ``main_params_dtype`` fp32): the two moments (4) and the master (4), stepping on
#: an fp32 copy of each 16-bit gradient shard (distrib_optimizer.py
#: ``_copy_model_grads_to_main_grads``: ``shard_model_grad.float()``, the safe side where
#: bf16 weights take the gradient as it is)
BF16_MOMENTS_FP32_MASTER = (8, 4)
#: Transformer Engine's userbuffers for ``tp_comm_overlap``, bytes per element of the gathered
#: ``[s b / c, h]`` activation (Megatron-LM ``_initialize_tp_communicators``: ``input_shape =
#: [seq_length * micro_batch_size // context_parallel_size, hidden_size]``): ``initialize_ub``
#: registers one buffer of that shape for each of ten GEMMs (qkv/fc1 fprop, dgrad and wgrad,
#: proj/fc2 fprop and dgrad), 16-bit, except that under FP8 the six all-gather buffers (qkv and
#: fc1 fprop and dgrad, proj and fc2 dgrad) hold 1-byte elements (TE
#: ``pytorch/module/base.py`` ``fp8_buf``). The buffers are allocated once per process by the
#: userbuffers library (``register_user_buffer_collective``), outside PyTorch's caching
#: allocator and for the whole run.
UB_BYTES_16, UB_BYTES_FP8 = 10 * 2, 6 * 1 + 4 * 2
#: Bytes per element on the wire: 16-bit (parameter all-gathers; gradients with
#: ``grad_reduce_dtype = "bf16"``) and fp32 (gradients reduced in fp32, Megatron-LM's bf16
#: default ``accumulate_allreduce_grads_in_fp32``, NeMo's ``grad_reduce_in_fp32``, torchtitan's
#: ``mixed_precision_reduce = "float32"``).
WIRE_16, GRAD_WIRE_FP32 = 2, 4
#: FP8 parameters (``[training] fp8_param_gather``) on the wire and in memory: one FP8 copy
FP8_WIRE = FP8_COPY_BYTES
#: Block-scaled (MXFP8) GEMMs and their quantization run at this share of the per-tensor FP8
#: rate (docs/model.md, "FP8", item 5: fitted once on Megatron-Bridge 25.11's three same-plan
#: FP8-CS / FP8-MX pairs; the MXFP8 rows of later releases are held out)
MXFP8_GEMM_RATE = 0.94
#: NVFP4 GEMMs (and their quantization, random Hadamard transforms and stochastic rounding) at
#: this share of the FP4 peak times the GPU's FP8 efficiency (docs/model.md, "FP8", item 6:
#: fitted once on Megatron-Bridge 26.02's same-plan NVFP4 / MXFP8 pairs; later releases held out)
NVFP4_GEMM_RATE = 0.64
#: The narrow formats whose linear GEMMs run through Transformer Engine's quantized path
LOW_PRECISIONS = ("fp8", "nvfp4")
#: FP4 parameters (``[training] fp4_param_gather``) on the wire: the packed E2M1 values alone
#: (Megatron-Core's uint8 parameter buffer maps each weight's rowwise data only); every rank
#: recomputes the E4M3 block scales from an all-reduced amax per 16 x 16 tile (Transformer
#: Engine _cast_master_weights_to_nvfp4_2d: about 1/64 byte per parameter, not costed) and
#: transposes the gathered values into the columnwise copy (post_all_gather_processing)
NVFP4_WIRE = 0.5


def gemm_rate(inst: Instance):
    """FLOP/s the layers' linear GEMMs reach at the instance's precision before the GEMM size
    curve: the 16-bit peak times its efficiency; FP8's peak times the FP8 efficiency (MXFP8
    at MXFP8_GEMM_RATE of it); NVFP4's FP4 peak times the FP8 efficiency times
    NVFP4_GEMM_RATE (no NVFP4 run fits a figure of its own). One owner for the search's
    bounds and the step terms."""
    hw, tr = inst.hw, inst.spec.training
    if tr.precision == "fp8":
        return (hw.peak_fp8 * hw.efficiency_fp8
                * (MXFP8_GEMM_RATE if tr.fp8_recipe == "mxfp8" else 1.0))
    if tr.precision == "nvfp4":
        return hw.peak_fp4 * hw.efficiency_fp8 * NVFP4_GEMM_RATE
    return hw.peak * hw.efficiency


@dataclass(frozen=True)
class Sharding:
    """One data-parallel sharding mode: which states are sharded over the shard group
    (ZeRO stages, Rajbhandari et al. 2020 Sec. 5; Megatron-Core ``data_parallel_sharding_strategy``)."""

    optim: bool     # optimizer states (fp32 master weights, Adam moments)
    grads: bool     # gradients
    params: bool    # 16-bit parameters (gathered per layer for its forward / backward)


SHARDING = {
    "none": Sharding(False, False, False),
    "optim": Sharding(True, False, False),
    "optim_grads": Sharding(True, True, False),
    "optim_grads_params": Sharding(True, True, True),
}


def reduce_dtype(inst: Instance) -> str:
    """``[training] grad_reduce_dtype``, else the framework's default for the precision."""
    tr = inst.spec.training
    return tr.grad_reduce_dtype or grad_reduce_dtype(inst.spec.constraints.framework,
                                                     tr.precision)


def reduce_every_microbatch(inst: Instance) -> tuple[bool, bool]:
    """``[training] grad_reduce_every_microbatch``, else the framework's default, without
    pipeline parallelism and with it: whether sharded gradients are reduce-scattered after
    every micro-batch (Megatron-FSDP, DeepSpeed, torchtitan without a pipeline) or once per
    step (torchtitan's pipelined stages; the override's false)."""
    pin = inst.spec.training.grad_reduce_every_microbatch
    return framework_of(inst.spec.constraints.framework).reduce_every_microbatch \
        if pin is None else (pin, pin)


def by_pipeline(without_pp: bool, with_pp: bool, p):
    """A 0/1 policy chosen by the pipeline degree, as a term: the plain number where both
    agree (so the other frameworks' terms keep their shape), else ``eq1(p)`` or ``gt1(p)``."""
    if without_pp == with_pp:
        return int(without_pp)
    return eq1(p) if without_pp else gt1(p)


def selective_recompute(inst: Instance) -> frozenset[str]:
    """What recompute = "selective" re-runs: ``[training] selective_recompute``, else the
    framework's, as Megatron-Core's module names (``core_attn``, ``mla_up_proj``,
    ``layernorm``, ``moe_act``) or ``{"op"}`` for torchtitan's op-level policy
    (:func:`~planner.model.schema.recompute_module_set`)."""
    return recompute_module_set(inst.spec.training.selective_recompute
                                or selective_recompute_of(inst.spec.constraints.framework))


#: HBM bytes touched per parameter by the Adam step: read fp32 master, m, v, grad (16), write
#: master, m, v (12), write the 16-bit weight (2).
ADAM_STEP_BYTES = 30
#: the same with bf16 states (``optimizer_dtype = "bf16"``): read m, v, grad, weight (8),
#: write m, v, weight (6)
ADAM_STEP_BYTES_BF16 = 14


def hidden_cost(raw, shown, slowdown):
    """What a transfer of ``raw`` seconds costs when all but ``shown`` of it runs beside compute
    (docs/model.md, "Overlap"): the part left exposed, plus the compute the hidden rest slowed.
    The collective's kernels take SMs and HBM bandwidth from the compute beside it, which then
    runs ``slowdown`` (Hardware.overlap_slowdown, ``s``) slower: compute of ``w`` seconds takes
    ``w (1 + s)``, so a transfer hidden for ``H = w (1 + s)`` seconds costs ``s w = H f`` with
    ``f = s / (1 + s)``. Written ``(1 - f) shown + f raw``, each term >= 0, as the encoders
    need. The one owner of the price of overlap: every overlapped transfer of the model
    (data-parallel buckets and prefetch, tensor-parallel, pipeline and context-parallel
    exchanges) goes through it."""
    if is_zero(slowdown):
        return shown
    f = slowdown / (1 + slowdown)
    return (1 - f) * shown + f * raw


def exposed(raw, window, unit, overlapped: bool, slowdown, shape: bool = False):
    """What a run of buckets or of prefetched layers costs when it overlaps ``window`` seconds
    of compute (docs/model.md, "Overlap"): the transfers beyond the window, and never less than
    the one ``unit`` (bucket, layer) that has nothing to hide behind, plus the price of the
    hidden rest at ``slowdown`` (:func:`hidden_cost`); all of ``raw`` when not overlapped. The
    one owner of this rule: the data-parallel buckets of Megatron-Core and FSDP2's per-layer
    prefetch both go through it. ``shape`` (the search's symbols, for a combination without
    the overlap where others of its space have it: ``Knobs.overlap_maxes``): ``raw`` plus the
    rule's maximum at zero, so that every combination has the same maxima."""
    if overlapped:
        return hidden_cost(raw, vmax(raw - window, unit), slowdown)
    if shape:
        zero = Sig.const(0.0)
        return raw + vmax(zero, zero)
    return raw


@dataclass
class Terms:
    """The model's output before summation: named time terms (seconds) and, per pipeline stage,
    named memory terms (bytes)."""

    time: dict[str, Any]
    memory: dict[str, dict[str, Any]]
    layer: dict[str, Any] = field(default_factory=dict)   # per-layer pieces, for reports

    @property
    def step_time(self):
        return sum(self.time.values())

    def memory_total(self, stage: str):
        return sum(self.memory[stage].values())

    def memory_stages(self) -> list[str]:
        return list(self.memory)


def cp_exchange_time(inst: Instance, sh: Shape, x: Degrees, tokens, passes: int,
                     core_attn: bool, attn, slow) -> tuple[Any, bool, Any]:
    """Seconds of the context-parallel exchange per layer and micro-batch, by the framework's
    exchange (:func:`planner.model.frameworks.cp_exchange`; docs/model.md, "Context-parallel
    communication"), on one GPU of ``tokens`` tokens per micro-batch with ``passes`` forward
    and backward passes (``core_attn``: selective recompute re-runs the core, exchanges
    included) beside ``attn`` seconds of attention core (what the ring hides behind, at the
    overlap price ``slow``). Returns the seconds, whether the exchange is the all-gather, and
    the bytes that exchange gathers (its working set: the memory rows count it)."""
    hw, tr = inst.hw, inst.spec.training
    t, c, b, s = x.t, x.c, x.b, sh.s
    # (the all_gather exchange's whole-sequence keys and values of the tensor rank's heads,
    # 16-bit: its collectives' size and, held while the core runs, its working set)
    exchange = cp_exchange(tr, inst.spec.constraints.framework)
    cp_gather = exchange == "all_gather"
    cp_gathered = 2 * b * s * (sh.k_w + sh.v_w) / t if cp_gather else 0.0
    if is_one(x.c_in) and is_one(x.c_out):
        cp_layer = 0.0
    elif exchange == "a2a":
        # Ulysses (Transformer Engine AttnFuncWithCPAndQKVOA2A): an all-to-all turns the
        # rank's queries, keys and values (s / c tokens, every head of the tensor rank) into
        # the whole sequence of a / (t c) heads, and one turns the output back; the backward
        # does the same with the output's gradient and the inputs' gradients, a recomputed
        # forward once more. The attention waits for them: exposed (docs/model.md,
        # "Context-parallel communication")
        # (one message per tensor: q, k, v and the output each way; selective recompute of
        # the core re-runs its call, exchanges included)
        def a2a(width):
            return all_to_all(2 * tokens * width / t, x.c_in, x.c_out, hw.bw_intra,
                              hw.bw_inter, hw.lat_intra, hw.lat_inter)
        cp_layer = (passes - 1 + (1 if core_attn else 0)) * (
            a2a(sh.q) + a2a(sh.k_w) + a2a(sh.v_w) + a2a(sh.o_w))
    elif cp_gather:
        # Transformer Engine AttnFuncWithCPAndKVAllGather ("KV all-gather between CP ranks is
        # exposed", Llama 3's scheme, Dubey et al. 2024 Sec. 3.3.2): each forward all-gathers
        # the whole sequence's keys and values of the tensor rank's heads before the core;
        # the backward gathers them again and reduce-scatters their gradients (16-bit, the
        # same bytes); a recomputed core gathers once more. Exposed (docs/model.md,
        # "Context-parallel communication")
        # (K and V each their own collective: gather_along_first_dim / reduce_scatter_...)
        gather = sum(0.5 * allreduce(2 * b * s * w / t, x.c_in, x.c_out, hw.bw_intra,
                                     hw.bw_inter, hw.lat_intra, hw.lat_inter)
                     for w in (sh.k_w, sh.v_w))
        cp_layer = (passes + (1 if core_attn else 0)) * gather
    else:
        kv_bytes = 2 * tokens * (sh.k_w + sh.v_w) / t      # (MLA: every head's K and V)
        # forward: K/V; backward: K/V and their gradients; a recomputed core (selective
        # recompute's core_attn) runs its forward ring again
        hops = steps(c) * (passes + (1 if core_attn else 0))
        cp_raw = hops * ring_step(kv_bytes, x.c_out, hw.bw_intra, hw.bw_inter,
                                   hw.lat_intra, hw.lat_inter)
        # hidden behind the attention core up to its length; the last backward hop (the
        # K/V gradients returning to their owner) follows the last block and stays exposed
        # (written as gt1(c) * intra-node hop + gt1(c_out) * (inter - intra): c_out > 1 implies
        # c > 1, and each term carries one indicator, as the encoders handle best)
        hop_in = kv_bytes / hw.bw_intra + hw.lat_intra
        hop_out = kv_bytes / hw.bw_inter + hw.lat_inter
        cp_layer = (hidden_cost(cp_raw, vmax(0.0, cp_raw - attn), slow) + gt1(c) * hop_in
                    + gt1(x.c_out) * (hop_out - hop_in))
    return cp_layer, cp_gather, cp_gathered


def pp_comm_time(inst: Instance, x: Degrees, k: Knobs, pp_bytes, slow) -> tuple[Any, Any]:
    """Seconds of one step's pipeline point-to-point transfers on one GPU, and of one transfer
    (``pp_bytes``, the activations of a micro-batch on the GPU, across the stage boundary:
    inside a node or across nodes by where the pipeline degree sits). Each GPU sends
    ``m (v - 1/p) = m ((v - 1) + (1 - 1/p))`` activations forward and as many back;
    ``overlap_p2p_comm`` hides the steady phase's (below), at the overlap price ``slow``."""
    hw, m, v, p = inst.hw, x.m, x.v, x.p
    pp_step = ring_step(pp_bytes, x.p_out, hw.bw_intra, hw.bw_inter, hw.lat_intra,
                        hw.lat_inter)
    raw = 2 * m * (steps(v) + ring_share(p)) * pp_step
    if not k.overlap_p2p_comm:
        return raw, pp_step
    # overlap_p2p_comm (Megatron-Core's interleaved schedule; off at vp = 1): the steady 1F1B
    # phase's sends and receives run under the next chunk's compute; the warm-up's and
    # cool-down's are blocking, and the first micro-batch crosses all v p virtual stages with
    # no slack, so v p - 1 forward and v p - 1 backward transfers stay exposed
    # (tests/test_overlap_sim.py simulates the schedule from its source; <= the raw
    # 2 m (v - 1/p) transfers, as interleaving needs m >= p). The schedule as the fitted runs
    # ran it: since Megatron-LM #4047 (April 2026) more shows (docs/model.md, "Overlap")
    return hidden_cost(raw, eq1(v) * 2 * m * ring_share(p) * pp_step
                       + gt1(v) * 2 * steps(v * p) * pp_step, slow), pp_step


def step_terms(inst: Instance, x: Degrees, k: Knobs) -> Terms:
    """Step time and memory of one plan under the AMPeD model (see the module docstring).

    Per layer and micro-batch, on one GPU (``b`` sequences, ``s/c`` tokens each, tensor group
    ``t``), with ``n_fwd`` forward passes (2 with full recompute, else 1):

    * GEMMs: ``(n_fwd + 2) * gemm_flops / (t c) / (peak * efficiency)`` (backward = 2x forward).
      Under FP8 the four linear layers run at the FP8 peak and FP8 efficiency; the attention
      core and the output layer stay in 16-bit.
    * Attention core: fused (flash) attention is compute-bound and recomputes ``QK^T`` in the
      backward pass (3.5 passes), on the keys its queries attend to (a sliding window's
      share, ``Shape.attn_share``); unfused attention is a roofline
      ``max(flops / (peak eff), bytes / HBM bandwidth)`` over its ``s^2`` score tensors, plus one
      more pass under selective recompute.
    * Element-wise kernels: forward HBM traffic (norms, bias-dropout-add, activation, unfused
      softmax/dropout) over HBM bandwidth, backward taken as twice the forward traffic.
    * Tensor-parallel: 4 all-reduces of ``b s h / c`` 16-bit activations per layer (2 forward,
      2 backward; reduce-scatter + all-gather under sequence parallelism move the same bytes),
      plus 2 with full recompute; hierarchical ring cost (:func:`collectives.allreduce`).
      With ``tp_comm_overlap`` (and sequence parallelism) all but one chunk in ``t`` may hide
      behind the layer's GEMMs.
    * Context-parallel: ring exchange of the K/V shard, ``cp - 1`` steps forward and twice that
      backward (K/V plus their gradients), assumed to overlap with the attention core (only the
      excess over it is exposed).

    Per step: compute = ``m`` micro-batch times of the slowest stage (the pace: the first stage
    holds its layers less its shortfall, a middle one ``L/p`` layers, the last its layers less
    its shortfall and the output layer and logits; with an even layout the last); bubble =
    ``R (p - 1) / v`` stage times of the slowest stage (Narayanan et al. Sec. 2.2); pipeline
    transfers =
    ``2 m (v - 1/p)`` sends of ``b s h / (c t)`` per GPU (scatter-gather / sequence-parallel
    layout), with ``overlap_p2p_comm`` and interleaving only the ``2 (v p - 1)`` of the warm-up
    and cool-down; data-parallel
    gradient reduction over ``dp * cp`` ranks of the stage's parameters, hidden behind the last
    micro-batch's backward (``overlap_grad_reduce``) and the first one's forward
    (``overlap_param_gather``) but for one bucket each; the Adam step as HBM traffic; host
    offload's transfers and CPU Adam step (``offload``). Memory has a row per distinct stage:
    the first (most activations in flight: ``1 + (p - 1) / (p v)`` times the layers' worth,
    Korthikanti et al. Sec. 4.2.3), the last (output layer and logits) and, with an uneven
    layout at ``p > 2``, a middle one (Megatron's rank 1, full-size stages); a ``<stage>_step``
    row for the optimizer step's peak where it holds a main-gradient copy; and, with host
    offload, a ``host`` row (the host's share, scaled to the GPU limit:
    :func:`host_memory_row`).
    """
    if k.recompute == "full" and (k.recompute_layers or k.recompute_share):
        return _partial_recompute(inst, x, k)
    sh = Shape.of(inst.model)
    hw: Hardware = inst.hw
    tr = inst.spec.training
    t, c, p, b, v = x.t, x.c, x.p, x.b, x.v
    m = x.m
    L, h, s = sh.L, sh.h, sh.s
    full = k.recompute == "full"
    selective = k.recompute == "selective"
    # what selective recompute recomputes ([training] selective_recompute, else the
    # framework's): torchtitan's op-level policy (every second matmul of the layer and the
    # element-wise ops; the attention output is kept), or Megatron-Core's recompute modules
    modules = selective_recompute(inst) if selective else frozenset()
    op_level = "op" in modules
    # mla_up_proj: MLA's up-projections (and RoPE) re-run before the core's backward, their
    # outputs (Q, K, V) dropped once the core has read them
    up_proj = "mla_up_proj" in modules
    core_attn = "core_attn" in modules
    # layernorm: the norms kept apart from a linear layer (an MoE layer's pre-MLP norm, MLA's
    # input norm) re-run in the backward, their outputs dropped once read; moe_act: the
    # routed experts' activation re-runs, fc2's input dropped (output-discarding
    # checkpoints, Megatron-Core CheckpointWithoutOutput: below, per layer kind)
    norm_redo = "layernorm" in modules
    act_redo = "moe_act" in modules
    # mlp: a dense layer's MLP (its fused pre-MLP norm, fc1, activation, fc2 and their
    # tensor-parallel collectives) re-runs before its backward from the MLP's input, which
    # the checkpoint keeps, and keeps nothing else (transformer_layer.py recompute_mlp:
    # tensor_parallel.checkpoint / te_checkpoint of self.mlp); MoE layers are not touched
    mlp_redo = "mlp" in modules
    n_fwd = 2 if full else 1
    passes = n_fwd + 2
    flash = tr.flash_attention
    sp = k.sequence_parallel
    peak16 = hw.peak * hw.efficiency
    # FP8 and NVFP4 run the layers' linear GEMMs in a narrow format through Transformer
    # Engine, with the same kinds of costs beside them (casts, weight copies, narrow held
    # activations: docs/model.md, "FP8"); NVFP4 with its own byte counts
    fp8 = tr.precision == "fp8"
    lowp = tr.precision in LOW_PRECISIONS
    peak_gemm = gemm_rate(inst) if lowp else peak16
    # Transformer Engine's quantized linear path, or torchao's float8 (frameworks.torchao_float8),
    # which keeps the held inputs in 16 bits and casts again
    torchao = torchao_float8(tr, inst.spec.constraints.framework)
    te_narrow = lowp and not torchao
    # what the sequence-parallel all-gathers move narrow: Transformer Engine's quantized path,
    # and torchao's float8 TP at per-tensor dynamic scaling (torchtitan's Float8ColwiseParallel,
    # Float8RowwiseParallel and PrepareFloat8ModuleInput cast to FP8 before the all-gather,
    # forward and backward; they refuse delayed scaling: 16-bit gathers then)
    gather_narrow = te_narrow or (torchao and tr.fp8_recipe != "delayed")
    delayed = delayed_scaling(tr)
    # the attention's output projection keeps the 16-bit input it read (the attention
    # output, which fused attention keeps anyway) and quantizes it again in its backward,
    # under Transformer Engine's quantized path at every recipe but delayed scaling, where
    # Megatron-Core asks it to (attention.py / multi_latent_attention.py
    # set_save_original_input(linear_proj); Transformer Engine refuses it under delayed
    # scaling): Megatron-LM and NeMo, not the other frameworks' TE layers
    proj_original = (te_narrow and not delayed
                     and framework_of(inst.spec.constraints.framework).name in ("megatron",
                                                                                "nemo"))
    tokens = b * s / c                       # tokens per GPU per micro-batch (context split)
    shard = t if sp else 1                   # replicated tensors are split only with SP

    # ---- compute per layer and micro-batch ------------------------------------------------
    attn_fwd_flops = sh.attention_flops(b) / (t * c)
    if flash:
        # the fused kernel runs at its own share of the peak (GPU.attention_efficiency)
        peak_attn = hw.peak * (hw.efficiency if hw.attention_efficiency is None
                               else hw.attention_efficiency)
        # selective recompute re-runs the core attention forward (Megatron-Core's default
        # recompute module "core_attn"); with fused attention it saves no memory. A sliding
        # window skips the keys outside it: the core costs the keys its queries attend to,
        # here the layers' average (Shape.attn_share), and a full-attention layer
        # attn_excess more than a windowed one (the stage's own mix: below; the unfused path
        # masks a full score matrix instead)
        attn_one = (passes + 0.5 + (1 if core_attn else 0)) * attn_fwd_flops / peak_attn
        attn = attn_one * sh.attn_share
        attn_excess = attn_one * (1 - sh.window_layer_share)
        score_bytes = 0.0
    else:
        score_elems = sh.a * b * s * s / (t * c)           # s/c query rows x s keys, a/t heads
        # per (b s^2 / (t c)): flops (QK^T over q, AV over o) vs bytes
        roof = vmax(2 * (sh.q + sh.o_w) / peak16, 2 * 2 * sh.a / hw.hbm_bw)
        attn = (passes + (1 if core_attn else 0)) * (b * s * s / (t * c)) * roof
        attn_excess = 0.0
        score_bytes = sh.score_eltwise_bytes_per_element * score_elems

    kt, kw = hw.knee_tokens, hw.knee_width
    slow = hw.overlap_slowdown     # the price of overlap (hidden_cost)

    def rate_ratio(rate):
        """``rate / peak16`` (numbers or calibration grids); 1 for a 16-bit GEMM and where
        the rates are free (:func:`internode_bytes`: inf / inf)."""
        if rate is peak16:
            return 1.0
        with np.errstate(invalid="ignore"):
            ratio = np.where(np.isfinite(rate) & np.isfinite(peak16), np.divide(rate, peak16), 1.0)
        return float(ratio) if np.ndim(ratio) == 0 else ratio

    def gemm_s(shapes, rate):
        """Forward seconds of GEMMs given as per-GPU ``(M, N, K, count)`` (M tokens, N x K the
        weight shard): ``2 M N K / rate`` at the size curve
        ``eff = e_max M/(M+kt) N/(N+kw) K/(K+kw')`` (two knees per GPU type, calibrated). The
        backward GEMMs (dgrad ``M x K`` over N, wgrad ``N x K`` over M) touch the same weight
        shard and tokens and are charged the forward's efficiency. Expanded, each GEMM is a
        plain signomial: ``2MNK/rate * (1 + kt/M)(1 + kw/N)(1 + kw'/K)``.

        Read as a roofline, each knee is a cost per element of one operand over the GEMM's
        rate: ``kw/K`` is the ``M x N`` output written per ``K``-long dot product, ``kw/N``
        and ``kt/M`` the input and weight read. An FP8 GEMM runs at ``rate`` above the 16-bit
        ``peak16`` but still writes a 16-bit output, while its FP8 operands are half the
        bytes: so its output knee is ``kw' = kw rate / peak16`` and the other two stay
        (docs/model.md, "FP8"); for a 16-bit GEMM ``kw' = kw``."""
        total = 0.0
        kw_out = kw * rate_ratio(rate) if not is_zero(kw) else 0.0
        for M, N, K, count in shapes:
            f = count * 2 * M * N * K / rate
            if not is_zero(kt):
                f = f * (1 + kt / M)
            if not is_zero(kw):
                f = f * (1 + kw / N) * (1 + kw_out / K)
            total = total + f
        return total

    fc1_w = (2 if sh.gated else 1)
    # the QKV and output projections (MLA: its down- and up-projections, workload.Shape)
    attn_gemms = sh.attn_gemms(tokens, t, shard)
    mlp_gemms = [(tokens, fc1_w * sh.f / t, h, 1), (tokens, h, sh.f / t, 1)]
    dense_gemms = attn_gemms + mlp_gemms
    if sh.n_moe:
        # expert tensor parallelism 1: a GPU holds experts / ep whole experts and receives
        # top_k copies of its tokens / t (sequence-sharded) tokens, tokens * top_k * ep / (t E)
        # per local expert; the router and the shared experts see the tokens / t of the rank
        m_e = tokens * sh.top_k * x.e / (t * sh.experts)
        local = sh.experts / x.e
        moe_gemms = attn_gemms + [
            (tokens / t, sh.experts, h, 1),
            (m_e, fc1_w * sh.f_e, h, local), (m_e, h, sh.f_e, local)]
        if sh.shared:
            moe_gemms += [(tokens / t, fc1_w * sh.f_e, h, sh.shared),
                          (tokens / t, h, sh.f_e, sh.shared)]

    # torchtitan's op-level policy counts the layer's matmuls in the order they run (q, k, v,
    # o, then w1, w3, w2 gated or w1, w2 plain) and recomputes the even ones: k, o and w3
    # (gated) or w2 (plain); for an MoE layer the experts' matmuls stand for the MLP's
    attn_recomputed = sh.attn_recomputed_gemms(tokens, t, shard)
    dense_recomputed = attn_recomputed + [
        (tokens, sh.f / t, h, 1) if sh.gated else (tokens, h, sh.f / t, 1)]

    # FP8 casts, bytes per token (docs/model.md, "FP8"): an FP8 GEMM takes FP8 operands, so
    # each linear layer's input is cast (and transposed for the weight gradient) in the
    # forward and its output gradient in the backward, Transformer Engine's kernels: a plain
    # cast_transpose reads 2 bytes and writes 1 + 1 (4 per element: the projection input,
    # the output gradients); the norms and the activation write their output in FP8 (1 byte
    # fewer than the 16-bit write counted above) and it is transposed later (read 1, write
    # 1: +1), under sequence parallelism on the gathered tensor (2 h) after the cast of the
    # rank's tokens; the activation's backward casts its own output (fused, +0).
    if lowp:
        norm_fed = h + (h * ring_share(t) if sp else 0)     # the QKV / fc1 input: 2h - h/t
        row_grad = 2 * h + 2 * h / shard              # the projection's / fc2's output gradient
        # (the attention's input GEMMs' output gradients: QKV, MLA's projections; MLA's
        # compressed query and key / value are norm outputs like norm_fed, on the shard)
        # (the projection input: cast_transpose, 4 bytes; kept original (proj_original), a
        # rowwise cast in the forward, 3, and a columnwise one from the 16-bit original in the
        # backward, 3)
        proj_cast = (3, 3) if proj_original else (4, 0)
        # (MLA's input norm is a TENorm apart, writing 16 bits, and each of its two readers,
        # TELinear layers, cast_transposes its own copy on the rank's shard: 4 bytes each)
        attn_in_cast = sh.attn_input_readers * 4 * h / shard if sh.mla else norm_fed
        attn_cast = (attn_in_cast + proj_cast[0] * sh.o_w / t + 2 * sh.lora_w / shard,
                     sum(4 * n * mm for mm, n, _, _ in sh.attn_gemms(1, t, shard)[:-1]) + row_grad
                     + proj_cast[1] * sh.o_w / t)
        dense_cast = (attn_cast[0] + norm_fed + sh.f / t, attn_cast[1] + row_grad)
        copies = (sh.top_k + sh.shared) / t if sh.n_moe else 0.0
        # an MoE layer's experts: the permuted tokens cast whole, the activation fused, the
        # fc2 output gradient cast whole, per routed copy and shared expert
        moe_cast = (attn_cast[0] + copies * (4 * h + sh.f_e), attn_cast[1] + copies * 4 * h)
    else:
        dense_cast = moe_cast = None

    # the output-discarding checkpoints' re-runs in the backward, bytes per token
    # (Megatron-Core CheckpointWithoutOutput): layernorm re-runs each norm it covers (read
    # 2h, write 2h on the rank's sequence shard: an MoE layer's pre-MLP norm, MLA's input
    # norm), moe_act the routed experts' activation (its forward traffic again, per routed
    # copy); at a narrow precision the linear layer after the re-run kept the 16-bit
    # original (set_save_original_input) and quantizes it again for its backward (read 2,
    # write 1 per element): MLA's down-projection input, fc2's input (moe_act); the router
    # reads the MoE layer's in 16 bits, and a shared expert's fc1 keeps the original
    # whether or not the norm re-runs (shared_experts.py, the recipes these modules allow)
    requant = 3 if te_narrow else 0
    # (MLA: the query and key / value down-projections each quantize the norm output again,
    # only the latter without q_lora_rank, where the query projection keeps its own narrow
    # copy: multi_latent_attention.py set_for_recompute_input_layernorm)
    # (MLA's readers of the norm output that keep its original for the re-run: both
    # down-projections with q_lora_rank, the key / value one alone without)
    norm_readers = 2 if sh.q_lora else 1
    mla_norm_redo = ((4 + requant * norm_readers) * h / shard
                     if norm_redo and sh.mla else 0.0)
    # (mlp: the fused norm, read 2h and write 2h on the sequence shard, the activation's
    # traffic, and at a narrow precision the MLP's forward casts: norm output and fc2 input)
    dense_redo = mla_norm_redo + (
        (4 * h / shard + (6 if sh.gated else 4) * sh.f / t
         + (dense_cast[0] - attn_cast[0] if dense_cast else 0.0)) if mlp_redo else 0.0)
    moe_redo = mla_norm_redo + (4 * h / shard if norm_redo else 0.0) + (
        sh.top_k * ((6 if sh.gated else 4) + requant) * sh.f_e / t if act_redo else 0.0)

    def layer_time(gemms, mlp_bytes, recomputed, cast, redo=0.0, redo_gemms=()):
        """GEMMs + attention core + element-wise traffic of one layer and micro-batch
        (``cast``: the FP8 casts' forward and backward bytes per token, or None; ``redo``:
        the bytes per token the recompute modules re-run, ``redo_gemms`` their GEMMs)."""
        gemm_s_ = passes * gemm_s(gemms, peak_gemm) + gemm_s(redo_gemms, peak_gemm)
        if op_level:
            gemm_s_ = gemm_s_ + gemm_s(recomputed, peak_gemm)
        if up_proj:
            gemm_s_ = gemm_s_ + gemm_s(sh.gathering_gemms(tokens, t, shard), peak_gemm)
        fwd = tokens * (sh.eltwise_replicated_bytes / shard + mlp_bytes / t) + score_bytes
        elt_s = ((passes + (1 if op_level else 0)) * fwd
                 + (score_bytes if core_attn else 0) + tokens * redo
                 + (tokens * (n_fwd * cast[0] + cast[1]) if cast else 0)) / hw.hbm_bw
        return gemm_s_, elt_s, gemm_s_ + attn + elt_s

    gemm, eltwise, dense_compute = layer_time(dense_gemms, sh.eltwise_parallel_bytes,
                                              dense_recomputed, dense_cast, dense_redo,
                                              mlp_gemms if mlp_redo else ())
    logits = 3 * gemm_s([(tokens, sh.V / t, h, 1)], peak16)
    dense_share = sh.n_dense / L
    moe_share = sh.n_moe / L
    if sh.n_moe:
        moe_recomputed = attn_recomputed + [
            (m_e, sh.f_e, h, local) if sh.gated else (m_e, h, sh.f_e, local)]
        moe_gemm, _, moe_compute = layer_time(moe_gemms, sh.moe_eltwise_parallel_bytes,
                                              moe_recomputed, moe_cast, moe_redo)
    else:
        moe_gemm, moe_compute = 0.0, 0.0
    # multi-token prediction (Megatron-Core's MultiTokenPredictionBlock, after the decoder on
    # the last stage): per depth and micro-batch the 2h -> h projection, a layer of the last
    # layer's kind and the output layer and loss again; the last stage's work beside its layers
    last_extra = logits
    if sh.mtp:
        eh_proj = passes * gemm_s([(tokens, h / t, 2 * h, 1)], peak_gemm)
        last_extra = logits + sh.mtp * (
            (moe_compute if sh.mtp_moe else dense_compute) + eh_proj + logits)

    # ---- tensor-parallel communication per layer and micro-batch ---------------------------
    # a dense layer: 2 collectives forward (attention, MLP), 2 backward, 2 more under full
    # recompute; an MoE layer only the attention's half (its experts have expert tensor
    # parallelism 1: tokens stay sequence-sharded and reach the experts by the all-to-all)
    # With sequence parallelism each collective is an all-gather of a linear layer's input
    # (forward) or of a row-parallel output's gradient (backward) and a reduce-scatter of a
    # GEMM's 16-bit output; Transformer Engine quantizes what it gathers first, so at FP8 /
    # NVFP4 the all-gather moves narrow_bytes per element (TE layernorm_linear.py: the norm
    # writes the quantized input, gather_along_first_dim(ln_out, quantizer=...); base.py
    # grad_output_preprocess: the gradient is quantized, then gathered; so since TE 1.0), and
    # so does torchao's float8 at per-tensor dynamic scaling (gather_narrow)
    # MLA's attention gathers its compressed query and key / value instead of the hidden state
    # (workload.Shape.attn_gather_w): its forward pair is that all-gather and the hidden
    # state's reduce-scatter, its backward pair the hidden gradient's all-gather and the
    # compressed ones' reduce-scatter (without sequence parallelism: an all-reduce of the
    # hidden state forward, of the compressed widths backward)
    act_bytes = 2 * tokens * h

    def tp_pair(width):
        """(all-gather, reduce-scatter) of ``width``-wide tokens over the tensor group."""
        act = 2 * tokens * width
        gathered = narrow_bytes(tr) * tokens * width if (sp and gather_narrow) else act
        return tuple(0.5 * allreduce(z, x.t_in, x.t_out, hw.bw_intra, hw.bw_inter,
                                     hw.lat_intra, hw.lat_inter) for z in (gathered, act))

    tp_ag, tp_rs = tp_pair(h)
    tp_one = tp_ag + tp_rs
    # the attention's collectives: (all-gather, reduce-scatter) of its backward pair, and its
    # forward pair's time
    ag_w, rs_w = tp_pair(sh.attn_gather_w) if sh.mla else (tp_ag, tp_rs)
    attn_bwd_pair = (tp_ag, rs_w) if sp else (ag_w, rs_w)
    attn_fwd = ag_w + tp_rs if sp else tp_one
    # (the mlp module's re-run forward gathers the MLP's input and reduce-scatters its output
    # again, an all-reduce without sequence parallelism: one more pair, exposed)
    mlp_redo_tp = tp_one if mlp_redo else 0.0
    tp_layer = n_fwd * (attn_fwd + tp_one) + sum(attn_bwd_pair) + tp_one + mlp_redo_tp
    tp_moe = n_fwd * attn_fwd + sum(attn_bwd_pair)
    if k.tp_comm_overlap and sp and not is_one(t):
        # tp_comm_overlap (Transformer Engine userbuffers, needs sequence parallelism): each
        # all-gather / reduce-scatter is split into tp chunks pipelined with the chunks of its
        # GEMM; one chunk's transfer has no GEMM to hide behind, and no more than the layer's
        # GEMM time can be hidden (docs/model.md, "Overlap")
        tp_layer = hidden_cost(tp_layer, vmax(tp_layer / t, tp_layer - gemm), slow)
        if sh.n_moe:
            tp_moe = hidden_cost(tp_moe, vmax(tp_moe / t, tp_moe - moe_gemm), slow)
    elif tr.async_tensor_model_parallel_allreduce and not is_one(t):
        # the backward collective of each block (attention, MLP) is its column-parallel
        # linear's input gradient (QKV, FC1): an all-reduce, issued asynchronously and run
        # beside that linear's weight-gradient GEMM; with sequence parallelism it is a
        # reduce-scatter, and the all-gather of the row-parallel output's gradient before it
        # stays exposed (Megatron-Core LinearWithGradAccumulationAndAsyncCommunication;
        # Korthikanti et al. 2022, Sec. 5, Table 4). The recomputed forward's are exposed.
        def backward_exposed(wgrad, ag=tp_ag, rs=tp_rs):
            if sp:
                return ag + hidden_cost(rs, vmax(0.0, rs - wgrad), slow)
            return hidden_cost(ag + rs, vmax(0.0, ag + rs - wgrad), slow)
        # (MLA: the two up-projections' input gradients, beside their weight gradients)
        wgrad_qkv = gemm_s(sh.gathering_gemms(tokens, t, shard), peak_gemm)
        exposed_qkv = backward_exposed(wgrad_qkv, *attn_bwd_pair)
        tp_layer = (n_fwd * (attn_fwd + tp_one) + exposed_qkv + mlp_redo_tp
                    + backward_exposed(gemm_s(mlp_gemms[:1], peak_gemm)))
        tp_moe = n_fwd * attn_fwd + exposed_qkv

    # ---- context-parallel exchange per layer and micro-batch ------------------------------
    cp_layer, cp_gather, cp_gathered = cp_exchange_time(inst, sh, x, tokens, passes, core_attn,
                                                        attn, slow)

    # ---- mixture of experts: MoE layers replace the MLP by routed + shared experts ----------
    # Expert tensor parallelism is 1 (Megatron-Core MoE parallel folding): the ep ranks of a
    # stage hold experts / ep whole experts; tokens reach them sharded over tp (sequence
    # parallelism) and cp. Per MoE layer and micro-batch each GPU dispatches and combines
    # top_k copies of its tokens' hidden states (all-to-all over ep), forward and backward.
    if sh.n_moe:
        a2a_bytes = 2 * tokens * h * sh.top_k / t
        if tr.moe_token_dispatcher == "alltoall":
            a2a = all_to_all(a2a_bytes, x.e_in, x.e_out, hw.bw_intra, hw.bw_inter,
                             hw.lat_intra, hw.lat_inter)
        else:       # DeepEP / HybridEP: a token crosses to each remote node once
            a2a = dedup_all_to_all(a2a_bytes, sh.experts, sh.top_k, x.e_in, x.e_out,
                                   hw.bw_intra, hw.bw_inter, hw.lat_intra, hw.lat_inter)
        ep_layer = 2 * (n_fwd + 1) * a2a
    else:
        ep_layer = 0.0
    layer_compute = dense_share * dense_compute + moe_share * moe_compute   # model average

    # the pipeline layout: a middle stage holds (L + first_short + last_short) / p layers, the
    # first and last stages first_short / last_short fewer (an even split: both 0)
    sf, sl = k.first_short, k.last_short
    padded = L + sf + sl
    stage_layers = padded / p
    # the slowest pipeline stage sets the pace of compute and bubble: the one holding the most
    # MoE layers, min(L/p, n_moe) of them (an all-MoE stage as soon as p >= L / n_moe)
    if not sh.n_moe:
        stage_moe, stage_dense = 0.0, stage_layers
    elif sh.n_moe == L:
        stage_moe, stage_dense = stage_layers, 0.0
    else:       # min(L/p, n_moe) and the rest, max(L/p - n_moe, 0): each one factor >= 0
        stage_moe, stage_dense = (capped_quotient(p, padded, sh.n_moe),
                                  quotient_excess(p, padded, sh.n_moe))
    stage_compute = stage_dense * dense_compute + stage_moe * moe_compute   # one micro-batch
    if sh.full_marks and not is_zero(attn_excess):
        # under a sliding window the layers above cost the average core; the slowest stage
        # holds the most full-attention layers: at most, in each of its v chunks of
        # padded / (p v) consecutive layers, the most a run that long holds (Megatron-LM
        # deals chunks round-robin: with one layer per chunk and gpt-oss's alternation, every
        # other rank holds full-attention layers alone; docs/model.md, "Sliding-window
        # attention"); that many more than the average pay attn_excess
        # (a first or last stage longer than a middle one, which only a [plan] can give:
        # runs as long as its chunks; the search's layouts have sf, sl >= 0)
        longer = min(0, sf, sl)
        full_here = v * run_max(p * v, padded - longer * p if longer else padded,
                                sh.full_marks)
        avg_excess = sh.full_share * attn_excess                # an average layer's
        window_extra = (full_here - stage_layers * sh.full_share) * attn_excess
    else:
        avg_excess = window_extra = 0.0

    # on symbols (the search; any of the pace's pieces symbolic, so every combination has the
    # same maxima)
    symbolic = any(isinstance(z, Sig) for z in (stage_compute, last_extra, p, v))
    # Per stage: the first holds stage_layers - sf layers (and the embedding lookup, no FLOPs),
    # a middle one stage_layers (only when p > 2), the last stage_layers - sl and the output
    # layer (and the multi-token prediction depths: last_extra); compute and bubble follow the
    # slowest one. A first / last stage runs its share of the middle stage's layer mix. The
    # communication per layer is charged on the fullest stage (a middle one: an upper bound;
    # the prediction depths' layers are within it where the last stage is as many layers
    # short).
    # (under a window a first or last stage is short of windowed layers, and the fullest
    # stage's full-attention layers stay whole on every stage: an upper bound)
    per_layer = stage_compute / stage_layers - avg_excess
    stage_compute = stage_compute + window_extra
    if symbolic:
        # the search's layouts have sf, sl >= 0 and, at p = 2, one of them 0 (the space keeps
        # to these): then the middle stage is the slowest but for the output layer, and the
        # maximum over the stages reduces to this one (equal to the general one below); with
        # no short last stage in the search (not k.paced) it is the last stage
        if k.paced:
            pace_compute = stage_compute + vmax(0.0, last_extra - sl * per_layer)
        elif sl:
            raise ValueError("a short last stage in the search needs Knobs.paced")
        else:
            pace_compute = stage_compute + last_extra
        pace_bubble = stage_compute
    elif k.uneven:
        first_c, last_c = stage_compute - sf * per_layer, stage_compute - sl * per_layer
        pace_compute = vmax(first_c, gt2(p) * stage_compute, last_c + last_extra)
        pace_bubble = vmax(first_c, gt2(p) * stage_compute, last_c)
    else:
        pace_compute, pace_bubble = stage_compute + last_extra, stage_compute

    time = {
        "compute": m * pace_compute,
        # (p - 1)/v stage times of the slowest stage
        "bubble": tr.bubble_ratio * steps(p) / v * (
            pace_bubble + stage_dense * tp_layer + stage_moe * (tp_moe + ep_layer)
            + stage_layers * cp_layer),
        "tp_comm": m * (stage_dense * tp_layer + stage_moe * tp_moe),
        "cp_comm": m * stage_layers * cp_layer,
        "ep_comm": m * stage_moe * ep_layer,
    }
    if k.overlap_moe_expert_parallel_comm and sh.n_moe:
        # overlap_moe_expert_parallel_comm (Megatron-Core's combined 1F1B, schedules.py and
        # combined_1f1b.py): in the 1F1B phase the forward of one micro-batch and the backward
        # of another run layer by layer on two streams, each one's all-to-alls beside the
        # other's compute, so per MoE layer and paired micro-batch only what the layer's
        # compute cannot hide stays exposed. The warm-up forwards and cool-down backwards run
        # alone, 2 (p - 1) + (v - 1) p + 1 chunks each way on the first rank (one more than
        # without the overlap): p + (p - 1) / v micro-batches of the stage (1 at pp = 1, the
        # first forward and the last backward). Their all-to-alls are exposed: p micro-batches'
        # here, the (p - 1) / v of the fill and flush in the bubble, which already charges the
        # all-to-all (interleaving keeps m a multiple of p, so m - p >= 0 pairs remain).
        # Megatron-Core runs it at pp = 1 or interleaved only: eq1(p) + gt1(v) selects those
        # plans, the others (gt1(p) eq1(v)) pay the raw all-to-all (docs/model.md, "Overlap").
        # Under full recompute Megatron-Core refuses it: the raw all-to-all, the maximum kept
        # at weight 0 so that every combination of the search has the same terms' shape.
        raw = time["ep_comm"]
        shown = (vmax(0.0, (m - p) * stage_moe * (ep_layer - moe_compute))
                 + p * stage_moe * ep_layer)
        if full:
            time["ep_comm"] = raw + 0.0 * shown
        else:
            time["ep_comm"] = ((eq1(p) + gt1(v)) * hidden_cost(raw, shown, slow)
                               + gt1(p) * eq1(v) * raw)

    # the prediction depths' collectives where the last stage holds more layers than the
    # fullest stage the terms above charge (not short by as many layers as there are depths;
    # always at pp = 1), exposed: an upper bound. Added at weight 0 where the shortfall covers
    # the depths, so that every layout of the search has the same maxima (the collectives'
    # overlap maxima): a layout's terms may not change the objective's shape
    over = max(0, sh.mtp - sl)
    if sh.mtp:
        time["tp_comm"] = time["tp_comm"] + m * over * (tp_moe if sh.mtp_moe else tp_layer)
        if sh.mtp_moe:
            time["ep_comm"] = time["ep_comm"] + m * over * ep_layer

    # ---- pipeline point-to-point ------------------------------------------------------------
    time["pp_comm"], pp_step = pp_comm_time(inst, x, k, act_bytes / t, slow)

    # ---- parameters of the most loaded stage ------------------------------------------------
    # dense parameters (everything but routed experts) are split over tp and reduced over
    # dp x cp; routed experts are split over ep and reduced over the expert data-parallel group
    untied_extra = 0 if sh.tied else sh.V * h
    dense_layer_avg = dense_share * sh.layer_params + moe_share * sh.moe_dense_params
    stage_params = stage_layers * dense_layer_avg + sh.embedding_params + sh.norm \
        + eq1(p) * untied_extra                      # upper bound over first and last stage
    # (the multi-token prediction depths, on the last stage: their layers' non-expert weights
    # and projection, and their experts)
    stage_params = stage_params + sh.mtp * sh.mtp_dense_params
    # (split over the tensor group but for MLA's duplicated down-projections)
    params_gpu = sh.per_rank(stage_params, stage_layers + sh.mtp, t)
    expert_gpu = stage_layers * moe_share * sh.experts * sh.expert_params / x.e if sh.n_moe \
        else 0.0
    if sh.mtp_expert_params:
        expert_gpu = expert_gpu + sh.mtp * sh.mtp_expert_params / x.e

    # ---- data-parallel communication (over dp x cp ranks) + optimizer step ----------------
    # The sharding mode (SHARDING) says what each rank keeps whole and which collectives run
    # (docs/model.md, "Data-parallel sharding"). The shard group is dp x cp; under HSDP it is
    # dp_shard_size x cp (inside a node: all of dp_intra x cp_intra; across nodes:
    # dp_inter x cp_inter / r), replicated r = dp / dp_shard_size times across nodes.
    mode = SHARDING[k.dp_sharding]
    fw = framework_of(inst.spec.constraints.framework)
    # narrow parameters, FP8 or FP4 (the distributed optimizer: frameworks.sharding_refusal)
    fp8_params = tr.fp8_param_gather or tr.fp4_param_gather
    # the layers' weights on the wire when they are narrow parameters: FP8's 1 byte; MXFP8
    # parameters gathered in 16 bits through the gradient buffer and quantized after
    # (Megatron-Core reuse_grad_buf_for_mxfp8_param_ag; docs/model.md, "FP8", item 5); FP4
    # parameters as packed FP4 values, their scales recomputed on every rank (item 6)
    param_wire = (NVFP4_WIRE if tr.precision == "nvfp4"
                  else WIRE_16 if tr.fp8_recipe == "mxfp8" else FP8_WIRE)
    gw = GRAD_WIRE_FP32 if reduce_dtype(inst) == "fp32" else WIRE_16
    r = x.r
    s_in, s_out = x.d_in * x.c_in, x.d_out * x.c_out / r
    shards = s_in * s_out if mode.optim else 1
    # 1 where sharded gradients are reduce-scattered every micro-batch, and its complement
    # (both written by the pipeline degree where the framework's policy depends on it)
    every_pair = reduce_every_microbatch(inst)
    every_mb = by_pipeline(*every_pair, p) if mode.grads else 0
    once = by_pipeline(*(not e for e in every_pair), p) if mode.grads else 1

    def half(size, n_in, n_out):
        """A reduce-scatter or an all-gather: half the ring all-reduce's bytes and steps."""
        return 0.5 * allreduce(size, n_in, n_out, hw.bw_intra, hw.bw_inter, hw.lat_intra,
                               hw.lat_inter)

    def over_group(wire, per_gpu, experts):
        """A reduce-scatter or all-gather of ``per_gpu`` parameters' worth over the shard group
        (and of the experts' over the expert data-parallel group), ``wire`` bytes each."""
        out = half(wire * per_gpu, s_in, s_out)
        if sh.n_moe:
            out = out + half(wire * experts, x.ed_in, x.ed_out)
        return out

    # the embedding, output layer and final norm on the GPU (FSDP2's root unit)
    head_p = (sh.embedding_params + sh.norm + eq1(p) * untied_extra) / t
    # once per step: a plain all-reduce (none); else the gradient reduce-scatter (unless it
    # runs every micro-batch), the replicas' all-reduce of the shard (HSDP) and the parameter
    # all-gather after the optimizer step (unless the parameters stay sharded)
    if mode.optim:
        reduce_raw = allreduce(gw * params_gpu / shards, 1, r, hw.bw_intra, hw.bw_inter,
                               hw.lat_intra, hw.lat_inter)
        if not is_zero(once):
            rs_step = over_group(gw, params_gpu, expert_gpu)
            reduce_raw = reduce_raw + (rs_step if is_one(once) else once * rs_step)
        if mode.params:
            gather_raw = 0.0
        elif fp8_params:
            # FP8 parameters: the layers' weights on the wire in 1 byte (MXFP8: 16 bits), the
            # embedding, output layer and final norm in 16 bits (Megatron-Core keeps them in a
            # uint8 and a bf16 buffer; taken as one collective)
            gather_raw = over_group(1.0, param_wire * sh.per_rank(
                stage_layers * dense_layer_avg, stage_layers, t) + WIRE_16 * head_p,
                param_wire * expert_gpu)
        else:
            gather_raw = over_group(WIRE_16, params_gpu, expert_gpu)
    else:
        reduce_raw = allreduce(gw * params_gpu, x.d_in * x.c_in, x.d_out * x.c_out,
                               hw.bw_intra, hw.bw_inter, hw.lat_intra, hw.lat_inter)
        if sh.n_moe:
            reduce_raw = reduce_raw + allreduce(gw * expert_gpu, x.ed_in, x.ed_out, hw.bw_intra,
                                                hw.bw_inter, hw.lat_intra, hw.lat_inter)
        gather_raw = 0.0

    # Per micro-batch, per layer (FSDP / ZeRO-3, and ZeRO-2 where gradients are reduced every
    # micro-batch): the layer's parameters are all-gathered before its forward, again before
    # its backward when resharded, and its gradients reduce-scattered after its backward; the
    # embedding and output layer (FSDP2's root unit) likewise.
    layer_params_gpu = sh.per_rank(dense_layer_avg, 1, t)
    expert_layer = moe_share * sh.experts * sh.expert_params / x.e if sh.n_moe else 0.0
    # (FP8 parameters under Megatron-FSDP: the layers are gathered in one byte)
    ag_layer = (over_group(param_wire if fp8_params else WIRE_16, layer_params_gpu, expert_layer)
                if mode.params else 0.0)
    ag_head = over_group(WIRE_16, head_p, 0.0) if mode.params else 0.0
    # the reshard policy without and with a pipeline: the plan's, else the framework's default
    # (and its complement, written with the complementary indicators: every term >= 0)
    reshard = fw.reshard_after_forward if k.reshard_after_forward is None \
        else (k.reshard_after_forward,) * 2
    resharded = by_pipeline(*reshard, p)
    kept = by_pipeline(*(not r for r in reshard), p)
    regather = resharded if mode.params else 0
    rs_layer = rs_head = 0.0
    if not is_zero(every_mb):
        rs_layer = over_group(gw, layer_params_gpu, expert_layer)
        rs_head = over_group(gw, head_p, 0.0)
        if not is_one(every_mb):
            rs_layer, rs_head = every_mb * rs_layer, every_mb * rs_head

    # Overlap (docs/model.md, "Overlap"): one rule for what a bucket or a layer prefetch leaves
    # exposed, :func:`exposed`. Per step (Megatron-Core DDP buckets): the gradient reduction
    # runs during the last micro-batch's backward on the stage (with its recomputed forward)
    # but for its last bucket, the distributed optimizer's all-gather during the first
    # micro-batch's forward but for its first bucket. A bucket is the framework's bucket
    # size, or one layer's parameters on the GPU when those are fewer (written as
    # bucket * min(layer / (bucket t), 1): a function near 1 and the size in the coefficient
    # keep the encoders' rows well scaled). Per micro-batch (FSDP2 prefetch): layer i+1's
    # all-gather runs during layer i's compute and layer i's reduce-scatter during layer
    # i-1's backward, the unit being one layer (and the root unit): the first gather and the
    # last reduce-scatter have nothing to hide behind.
    # (the lightest stage's compute: a lower bound on the window of every stage; under a
    # sliding window, of windowed layers only)
    lightest = (stage_compute - window_extra - stage_layers * avg_excess if sh.full_marks
                else stage_compute)
    window = lightest - max(sf, sl) * per_layer if k.uneven else lightest
    backward = window * (passes - 1) / passes
    forward = window / passes
    og, opg = k.overlap_grad_reduce, k.overlap_param_gather
    # (a combination without the reduction's overlap in a search whose other combinations
    # have it: its maxima at zero, exposed(shape=...))
    og_shape = not og and "overlap_grad_reduce" in k.overlap_maxes and isinstance(window, Sig)
    if og or opg:
        bucket_size = framework_of(inst.spec.constraints.framework).grad_bucket_params
        layer_params = sh.layer_params if sh.n_dense else sh.moe_dense_params
        bucket_params = bucket_size * capped_quotient(t, layer_params / bucket_size, 1)
        if mode.optim:      # (a unit only where its collective runs once per step)
            bucket_rs = allreduce(gw * bucket_params / shards, 1, r, hw.bw_intra, hw.bw_inter,
                                  hw.lat_intra, hw.lat_inter)
            if not is_zero(once):
                rs_bucket = half(gw * bucket_params, s_in, s_out)
                bucket_rs = bucket_rs + (rs_bucket if is_one(once) else once * rs_bucket)
            bucket_ag = 0.0 if mode.params else half(
                (param_wire if fp8_params else WIRE_16) * bucket_params, s_in, s_out)
        else:
            bucket_rs = allreduce(gw * bucket_params, x.d_in * x.c_in, x.d_out * x.c_out,
                                  hw.bw_intra, hw.bw_inter, hw.lat_intra, hw.lat_inter)
            bucket_ag = 0.0
        if fw.chunked_grad_sync:
            # Interleaved (v > 1) under Megatron-Core's schedule: virtual chunk c's reduction
            # starts after its last micro-batch backward, aligned across the pipeline ranks
            # (align_grad_reduce, on by default), which leaves c p chunk-backwards (backward /
            # v each) of the cool-down after it; chunk 0's starts after the last one. On a
            # serial network the exposed time is the larger of chunk 0's whole reduction
            # (raw / v) and what the (v - 1) p chunk-backwards cannot hide. At v = 1 (plain
            # 1F1B) the buckets reduce during the last micro-batch's backward, as below.
            reduce_window = eq1(v) * backward + gt1(v) * backward * p * ring_share(v)
            reduce_unit = eq1(v) * bucket_rs + gt1(v) * reduce_raw / v
        elif fw.reduce_after_last_backward:
            # torch.distributed.pipelining (torchtitan; frameworks.py, "torchtitan under
            # pipeline parallelism") and DeepSpeed's PipelineEngine (its ReduceGrads after
            # the last backward): a stage (virtual chunk) reduces after its own last
            # micro-batch backward. Interleaved, as Megatron-Core's chunks above (chunk c's
            # reduction has c p chunk-backwards of the cool-down after it); one stage per rank
            # (p > 1, v = 1), nothing after it: the whole reduction is exposed. Without a
            # pipeline, the buckets (FSDP2's layers, the replicas' all-reduce) overlap the last
            # backward as below. (v > 1 needs p > 1.)
            reduce_window = eq1(p) * backward + gt1(v) * backward * p * ring_share(v)
            reduce_unit = (eq1(p) * bucket_rs + gt1(p) * eq1(v) * reduce_raw
                           + gt1(v) * reduce_raw / v)
        else:
            reduce_window, reduce_unit = backward, bucket_rs
        step_reduce = exposed(reduce_raw, reduce_window, reduce_unit, og, slow, og_shape)
        step_gather = exposed(gather_raw, forward, bucket_ag, opg, slow)
    else:
        step_reduce = exposed(reduce_raw, None, None, False, slow, og_shape)
        step_gather = gather_raw
    n_units = stage_layers
    fwd_raw = n_units * ag_layer + ag_head
    bwd_gather = regather * (n_units * ag_layer + ag_head)
    bwd_reduce = n_units * rs_layer + rs_head
    mb_forward = exposed(fwd_raw, forward, ag_layer + ag_head, opg, slow)
    if og and opg:
        mb_backward = exposed(bwd_gather + bwd_reduce, backward,
                              regather * ag_layer + rs_layer + rs_head, True, slow)
    else:
        mb_backward = (exposed(bwd_gather, backward, regather * ag_layer, opg, slow)
                       + exposed(bwd_reduce, backward, rs_layer + rs_head, og, slow, og_shape))
    # the forward gathers: every micro-batch, or once per step on a pipelined stage whose
    # gathered parameters stay gathered (frameworks.py, "torchtitan under pipeline
    # parallelism"; the plan's reshard policy at p > 1 keeps them)
    gathers = (eq1(p) * m + gt1(p)) if (fw.pipelined_params_stay_gathered and mode.params
                                        and not reshard[1]) else m
    time["dp_comm"] = step_reduce + step_gather + gathers * mb_forward + m * mb_backward
    expert_shards = x.ed if mode.optim else 1
    # the Adam step on this GPU's shard, HBM-bound, or with host offload of the optimizer
    # (docs/model.md, "Host offload") on the CPU, the gradients' and parameters' transfers
    # then the offload term
    opt_local = params_gpu / shards + (expert_gpu / expert_shards if sh.n_moe else 0)
    time["optimizer"], time["offload"] = optimizer_offload_time(inst, k, opt_local, gw)

    # ---- memory per GPU, first and last pipeline stage --------------------------------------
    # A stage is checked as if all its L/p layers were of one kind, for each kind the model
    # has: a stage mixing dense and MoE layers needs no more than the larger of the two.
    fp8_cache = hw.fp8_weight_cache_bytes if lowp else 0
    grad_bytes = GRAD_BYTES if gw == GRAD_WIRE_FP32 else WIRE_16
    # bf16 gradients accumulated in a whole fp32 buffer beside the 16-bit ones the backward
    # writes, which stay allocated (frameworks.keeps_16bit_grads_beside_fp32: DeepSpeed; its
    # FP8 and NVFP4 runs train in bf16 too, bf16.enabled, as the export writes them)
    beside_fp32 = (WIRE_16 if fw.keeps_16bit_grads_beside_fp32 and tr.precision != "fp16"
                   and gw == GRAD_WIRE_FP32 and not mode.grads else 0.0)
    # 16-bit gradients: the optimizer steps on a main-gradient copy of its shard (fp32: Megatron-LM's
    # fp16 row, 20 bytes per parameter, 4 + 16/d distributed; with bf16 states a bf16 shard:
    # OPTIMIZER_STATE_BYTES). The copy lives only through the optimizer step: Megatron-Core makes
    # it in the step (DistributedOptimizer._copy_model_grads_to_main_grads:
    # ``shard_main_param.grad = shard_model_grad.float()``) and frees it with zero_grad
    # (set_to_none) before the next forward, so it is not held with the activations: the
    # forward / backward peak counts the states alone, and a second row per stage, the step
    # peak (``<stage>_step``), counts the copy with no activations
    state_bytes, main_grad_bytes = optimizer_state_bytes(tr)
    if keeps_remainders(inst, k):
        # the fp32 master weight as the bf16 weight plus a 16-bit remainder (frameworks.py,
        # "Master weights as remainders")
        state_bytes += MASTER_REMAINDER_BYTES - MASTER_BYTES[tr.optimizer_dtype]
    step_copy = main_grad_bytes if grad_bytes == WIRE_16 else 0
    opt_bytes = state_bytes / shards
    # gradients reduced once per step accumulate unsharded over the micro-batches
    # Sharded gradients at the memory peak (the last backward): reduce-scattered every
    # micro-batch, a shard plus one layer's; reduced once per step, whole (the accumulation
    # buffer), unless they are reduced layer by layer during the backward (FSDP's per-layer
    # hooks under sharded parameters, or bucket by bucket with overlap_grad_reduce) with one
    # micro-batch: then nothing accumulates, a shard again
    # A pipelined stage that reduces after its last backward (torchtitan) runs that backward
    # with gradient sync off too, so reduced once per step its gradients are whole at p > 1
    # whatever m. The (sharded, whole) shares of each side of the pipeline degree, by the
    # side's policy, then written by the pipeline degree where the two sides differ.
    piped_whole = (fw.reduce_after_last_backward and mode.grads
                   and k.dp_sharding not in fw.sharding_needs_no_pp)

    def held(every: bool, whole_anyway: bool):
        if every:
            return 1.0, 0.0
        if whole_anyway or not (k.overlap_grad_reduce or mode.params):
            return 0.0, 1.0
        return eq1(m), gt1(m)

    sides = ((every_pair[0], False), (every_pair[1], piped_whole))
    if sides[0] == sides[1]:
        sharded_grads, whole_grads = held(*sides[0])
    else:
        (s1, w1), (s2, w2) = held(*sides[0]), held(*sides[1])
        sharded_grads = eq1(p) * s1 + gt1(p) * s2
        whole_grads = eq1(p) * w1 + gt1(p) * w2
    working_layer = sharded_grads
    grad_share = (sharded_grads / shards + whole_grads) if mode.grads else 1
    keep16 = 1 if fw.sharded_16bit_copy else 0
    weight_share = keep16 / shards if mode.params else 1
    expert_weight_share = keep16 / x.ed if mode.params else 1
    expert_grad_share = (sharded_grads / x.ed + whole_grads) if mode.grads else 1
    # the unsharded working set: the gathered 16-bit parameters of the layer being computed
    # and of the prefetched next one (all the stage's layers when not resharded after forward)
    # plus the input / output layer, and one layer's unsharded gradients before its
    # reduce-scatter
    units = (2 * resharded + kept * stage_layers) if mode.params else 0
    kinds = [kind for kind, n_kind in (("dense", sh.n_dense), ("moe", sh.n_moe)) if n_kind]

    # Transformer Engine keeps the linear layers' inputs for the backward narrow (te_narrow),
    # narrow_held bytes each (not ``held``: the stage loop below counts micro-batches in that)
    narrow_held = narrow_bytes(tr)
    held_in = narrow_held if te_narrow else WIRE_16     # bytes a linear layer keeps per input
    dense_replicated = sh.act_replicated_bytes - (sh.fp8_saved_replicated_bytes(narrow_held)
                                                  if te_narrow else 0)
    # an MoE layer also keeps its routing state, and under FP8 its MLP input (the router's)
    # in 16 bits (workload.Shape.moe_routing_bytes, moe_fp8_saved_replicated_bytes)
    # (a shared expert's narrow copy of the MLP input: under delayed scaling only)
    moe_replicated = sh.act_replicated_bytes + sh.moe_routing_bytes - (
        sh.moe_fp8_saved_replicated_bytes(narrow_held, shared_copy=delayed) if te_narrow else 0)

    def stored_per_layer(parallel_bytes, mlp_kept, replicated_bytes):
        """(stored bytes per layer and micro-batch, working set of one re-materialised layer).
        ``parallel_bytes``: the tensor-parallel stored bytes per token (FP8-held included);
        ``mlp_kept``: bytes per token of the MLP's first matmul output (op-level policy);
        ``replicated_bytes``: the bytes per token of the sequence shard."""
        # (mla_up_proj: Q, K and V are not kept; one layer's are re-materialised for its
        # backward)
        qkv = 2 * (sh.q + sh.k_w + sh.v_w) if up_proj else 0
        none = tokens * (replicated_bytes / shard + (parallel_bytes - qkv) / t)
        if flash:
            none = none + 4 * sh.a * tokens / t                  # fp32 softmax statistics
            sel = none
        else:
            sel = none
            none = none + sh.act_score_bytes_per_element * sh.a * tokens * s / t
        if full:
            return 2 * tokens * h / shard, none                   # the layer input checkpoint
        if up_proj:
            return (sel if core_attn else none), tokens * qkv / t
        if op_level:
            # torchtitan's op-level policy keeps the layer input, the outputs of the odd
            # matmuls (q, v, the MLP's first; gated also its last, w2) and of the attention
            # kernel (with its softmax statistics); the backward re-materialises one layer
            kept_repl = 2 * h * (2 if sh.gated else 1)
            kept = sh.op_kept_attention_bytes(t, shard) + mlp_kept / t
            return tokens * (kept_repl / shard + kept), none
        return (sel if core_attn else none), 0.0

    # 1F1B keeps p micro-batches of the first stage's L/p layers in flight; interleaving adds
    # (p - 1) / (p v) of that (Korthikanti et al. Sec. 4.2.3). The last stage keeps
    # (v - 1) / v + 1 / (p v) layers' worth (Megatron's interleaved warm-up on rank p - 1).
    # Without interleaving (v = 1) Megatron runs plain 1F1B: exactly p micro-batches of L/p
    # layers on the first stage, hence the gt1(v) factor on the interleaving term.
    first_flight = 1 + gt1(v) * ring_share(p) / v
    last_flight = ring_share(v) + 1 / (p * v)
    in_flight = p + gt1(v) * steps(p) / v                        # micro-batches, first stage
    embed_mask = sh.dropout_mask_bytes * tokens * h / shard * in_flight
    # what the loss holds per logit at the peak (frameworks.logit_bytes)
    logits_buffer = (logit_bytes(tr.fused_cross_entropy, inst.spec.constraints.framework, t,
                                 compiled_loss(tr, inst.spec.constraints.framework,
                                               inst.kernel_stack))
                     * tokens * sh.V / t)

    # every distinct stage: the first and last (their own layers), and with an uneven layout
    # the second rank, the middle stage holding most activations: (p - 1) micro-batches of
    # its layers, interleaved 2 (p - 2) + (v - 1) p + 1 chunks of layers / v (Megatron's
    # warm-up on rank 1)
    stages = {"first": stage_layers - sf, "last": stage_layers - sl}
    if k.uneven and (symbolic or not isinstance(p, (int, float)) or p > 2):
        stages = {"first": stages["first"], "middle": stage_layers, "last": stages["last"]}
    mid_flight = steps(p) + gt1(v) * (1 + steps(p) / v - 2 / v)

    # tp_comm_overlap's userbuffers (UB_BYTES_16 / UB_BYTES_FP8), on every stage, under the
    # same condition as its time rule above; Transformer Engine's (Megatron-LM, NeMo), not
    # torchtitan's async tensor parallelism, whose symmetric-memory workspace is not costed
    comm_buffers = ((UB_BYTES_FP8 if fp8 else UB_BYTES_16) * tokens * h * gt1(t)
                    if k.tp_comm_overlap and sp and fw.name != "torchtitan" else 0.0)

    memory = {}
    layer_info: dict[str, Any] = {}
    stored_by_kind: dict[str, Any] = {}
    for kind in kinds:
        if kind == "dense":
            layer_p, experts_p, act_bytes_p = sh.layer_params, 0.0, sh.act_parallel_bytes
            act_bytes_p -= (sh.fp8_saved_parallel_bytes(flash, narrow_held, proj_original)
                            if te_narrow else 0)
        else:
            layer_p = sh.moe_dense_params
            experts_p = stage_layers * sh.experts * sh.expert_params / x.e
            act_bytes_p = sh.moe_act_parallel_bytes
            act_bytes_p -= (sh.moe_fp8_saved_parallel_bytes(flash, narrow_held, proj_original)
                            if te_narrow else 0)
        mlp_kept = (2 * sh.f if kind == "dense"
                    else 2 * sh.f_e * (sh.top_k + sh.shared) + 2 * h * sh.top_k)
        # what the output-discarding checkpoints free, bytes per token (layernorm: MLA's
        # down-projection input, as held, and an MoE layer's MLP input, the router's 16-bit
        # copy, which a shared expert reads too; moe_act: fc2's input per routed copy); one
        # layer's come back for its backward (the working set)
        # (MLA at a narrow precision: both down-projections' narrow copies; without
        # q_lora_rank the query projection's own narrow copy stays, the key / value
        # down-projection's goes with the norm output; in 16 bits their one shared tensor)
        mla_freed = held_in * h * (norm_readers if te_narrow else 1)
        freed_rep = (mla_freed if norm_redo and sh.mla else 0.0) + (
            2 * h if norm_redo and kind == "moe" else 0.0)
        freed_par = sh.top_k * sh.f_e * held_in if act_redo and kind == "moe" else 0.0
        if mlp_redo and kind == "dense":
            # (mlp: fc1's input, the fused norm's output, as held; fc1's output, 16-bit, both
            # halves gated; fc2's input as held; the checkpoint keeps the MLP's input, which
            # the norm kept anyway)
            freed_rep = freed_rep + held_in * h
            freed_par = freed_par + (4 if sh.gated else 2) * sh.f + held_in * sh.f
        stored, working = stored_per_layer(
            act_bytes_p - freed_par, mlp_kept,
            (dense_replicated if kind == "dense" else moe_replicated) - freed_rep)
        if freed_rep or freed_par:
            working = working + tokens * (freed_rep / shard + freed_par / t)
        if cp_gather:
            # the all_gather exchange's backward, for the layer whose core runs
            # (context_parallel.py AttnFuncWithCPAndKVAllGather.backward): the gathered keys
            # and values (k_ag, v_ag), their whole-sequence gradients (dk, dv), the two
            # steps' gradients kept until the end (dk_per_step, dv_per_step: up to
            # (1 + 1 / 2c) of the sequence under the causal mask, counted whole) and the
            # reordered copy index_select makes of one of them beside its source: 3.5 times
            # the gathered K and V, an upper bound (a window attends fewer keys per step)
            working = working + gt1(c) * 3.5 * cp_gathered
        expert_opt = state_bytes / expert_shards
        for stage, n_layers in stages.items():
            # the stage's layers, and what sits beside them: the embedding (and, at p = 1, the
            # output layer and final norm) on the first stage, those two on the last; the
            # multi-token prediction depths on the last (on the first at p = 1), each a layer
            # of this row's kind with its projection, and (p > 1) a copy of the embedding
            # they read
            mtp_here = bool(sh.mtp) and stage != "middle"
            on_stage = (1 if stage == "last" else eq1(p)) if mtp_here else 0
            layers_p = ((gt2(p) if stage == "middle" else 1)
                        * sh.per_rank(n_layers * layer_p, n_layers, t))
            stage_experts = experts_p
            if mtp_here:
                layers_p = layers_p + on_stage * sh.per_rank(
                    sh.mtp * (layer_p + sh.mtp_extra_params), sh.mtp, t)
                if kind == "moe":
                    stage_experts = experts_p + on_stage * sh.mtp * sh.experts \
                        * sh.expert_params / x.e
            stage_head = 0.0 if stage == "middle" else (
                (sh.embedding_params + eq1(p) * (untied_extra + sh.norm)) / t
                if stage == "first" else
                (sh.V * h + sh.norm + (gt1(p) * sh.V * h if sh.mtp else 0.0)) / t)
            dense_p = layers_p + stage_head
            if stage == "first":
                acts = p * n_layers * stored * first_flight + working + embed_mask
                held, kept_working = p * first_flight, working
                logit = eq1(p) * logits_buffer * (1 + sh.mtp)
            elif stage == "middle":
                acts = gt2(p) * (n_layers * stored * mid_flight + working)
                held, kept_working = gt2(p) * mid_flight, gt2(p) * working
                logit = 0.0
            else:
                acts = p * n_layers * stored * last_flight + working
                held, kept_working = p * last_flight, working
                # (one logits tensor per loss: the output layer's and each depth's)
                logit = logits_buffer * (1 + sh.mtp)
            name = stage if len(kinds) == 1 else f"{stage}_{kind}"
            one_layer = (sh.per_rank(layer_p, 1, t)
                         + (experts_p / stage_layers if kind == "moe" else 0.0))
            # (the root unit: the embedding on the first stage, the output layer on the last)
            head = 0.0 if stage == "middle" else (sh.V * h + sh.norm) / t
            # (Megatron-FSDP with FP8 parameters gathers the layers in FP8, their transpose
            # made per use on Hopper: the cache's bytes; the root unit stays 16-bit)
            gathered = fp8_cache if fp8_params else WIRE_16
            working_w = (units * one_layer * gathered + head * WIRE_16) if mode.params else 0.0
            # (gradients accumulated whole hold it already)
            working_g = one_layer * grad_bytes * working_layer if mode.grads else 0.0
            # host offload: the optimizer states leave the GPU; the offloaded layers'
            # stored activations too (pp = 1, else barred: one micro-batch of the L layers in
            # flight, L - N of them kept), written with the complementary indicators so that
            # every term stays >= 0 (the memory rows are capped term by term)
            off_acts = 0.0
            if k.offload_layers and stage != "middle":
                off_acts = eq1(p) * k.offload_layers * stored
                flight = first_flight if stage == "first" else last_flight
                acts = (gt1(p) * p * n_layers * stored * flight
                        + eq1(p) * (L - k.offload_layers) * stored + working
                        + (embed_mask if stage == "first" else 0.0))
                held = gt1(p) * p * flight + eq1(p) * (L - k.offload_layers) / n_layers
            # an interleaved last rank whose shortfall sits in its last chunk (the account-for-
            # loss split, a layout string) peaks as if that chunk were whole: past the first p
            # micro-batches its steady phase runs the next round's first-chunk forward before
            # the previous round's backward, so the peak holds p micro-batches of every chunk
            # but the last and one of the first (Megatron-Core's schedule, simulated in
            # tests/test_pipeline_layout.py; with m = p an upper bound). The even spread above
            # counts the shortfall out of every chunk: the layers short come back at the
            # last stage's flight (docs/model.md, "Pipeline layout"). A short first
            # chunk on the first rank is over-counted by the spread, an upper bound kept
            chunk = (gt1(v) * k.last_short * p * last_flight
                     if stage == "last" and k.chunk_shortfall else 0.0)
            acts = acts + chunk * stored
            layer_info[f"chunk_{name}"] = chunk
            # the prediction depths' layers, held as the stage's own
            mtp_acts = 0.0
            if mtp_here:
                mtp_acts = on_stage * sh.mtp * stored * p * (
                    first_flight if stage == "first" else last_flight)
                acts = acts + mtp_acts
            # what a partial recompute mixes (_partial_recompute): the stored bytes of one
            # layer, the micro-batches' worth of them the stage holds per layer, the working
            # set as it enters acts and the rest (acts = held x layers x stored + working +
            # extra)
            layer_info[f"stored_{name}"] = stored
            layer_info[f"held_{name}"] = held
            layer_info[f"working_{name}"] = kept_working
            layer_info[f"extra_{name}"] = (embed_mask if stage == "first" else 0.0) + mtp_acts
            opt_gpu = dense_p * opt_bytes + stage_experts * expert_opt
            # the weights whose FP8 copies are held: every layer's under Transformer Engine,
            # which keeps them from the forward to the backward; torchao's float8 saves the
            # 16-bit weight for the backward and casts it per GEMM
            # (float8_linear.py matmul_with_hp_or_float8_args), so only the layer being
            # computed has one
            fp8_copies = one_layer if torchao else layers_p + stage_experts
            # the FP8 weight copies are of the layers' GEMM weights only: the embedding is a
            # lookup and Megatron-Core's output layer a tensor_parallel.ColumnParallelLinear,
            # outside Transformer Engine's FP8 modules (gpt_model.py)
            if fp8_params and mode.params:
                # FP8 parameters sharded (Megatron-FSDP): each GPU holds an FP8 shard of the
                # layers' GEMM weights and a 16-bit shard of the rest, and no FP8 copy of the
                # unsharded weights beside them (Megatron-Bridge's FSDP recipes set
                # keep_fp8_transpose_cache = False): the working set is the gathered layers
                weights = ((layers_p * weight_share + stage_experts * expert_weight_share)
                           * FP8_WIRE + stage_head * weight_share * WEIGHT_BYTES
                           + working_w)
            elif fp8_params:
                # FP8 parameters (ZeRO-1: whole): the layers' GEMM weights are the FP8
                # copy alone, the embedding, output layer and final norm stay 16-bit
                weights = stage_head * WEIGHT_BYTES + (layers_p + stage_experts) * fp8_cache
            else:
                weights = ((dense_p * weight_share + stage_experts * expert_weight_share)
                           * WEIGHT_BYTES + fp8_copies * fp8_cache + working_w)
            memory[name] = {
                "weights": weights,
                "gradients": (dense_p * grad_share + stage_experts * expert_grad_share) * grad_bytes
                + working_g + (dense_p + stage_experts) * beside_fp32,
                "optimizer_states": 0.0 if k.optimizer_offload else opt_gpu,
                "activations": acts,
                "logits": logit,
                "comm_buffers": comm_buffers,
            }
            if step_copy and not k.optimizer_offload:
                # the optimizer step: the same weights, gradients and states, the main-gradient
                # copy of the shard, no activations (freed after the last backward)
                memory[f"{name}_step"] = {
                    **memory[name], "activations": 0.0, "logits": 0.0,
                    "optimizer_states": opt_gpu + step_copy * (dense_p / shards
                                                               + stage_experts / expert_shards)}
            if stage == "first" and k.offloads:
                host_opt = (dense_p / shards + stage_experts / expert_shards) \
                    * host_optimizer_bytes(tr)
                memory[name.replace("first", "host")] = host_memory_row(
                    inst, (host_opt if k.optimizer_offload else 0.0) + off_acts)
                if k.offload_layers:        # Megatron-Core: no CPU offloading with pp > 1
                    memory[name]["offload_rule"] = gt1(p) * 2 * memory_limit_bytes(inst)
                stored_by_kind[kind] = stored
            # a sharding mode the named framework does not run with this grid: memory no GPU
            # has, so the search leaves it (the search's only way to say "not under this
            # mode"); evaluate reports the rule itself (framework_violations)
            bar = framework_bar(fw, inst.spec.constraints.framework, k.dp_sharding, x,
                                k.overlap_p2p_comm)
            if not is_zero(bar):
                memory[name]["framework_rule"] = bar * 2 * memory_limit_bytes(inst)
    time["offload"] = time["offload"] + activation_offload_time(
        inst, k, m, stored_by_kind, dense_share, moe_share, layer_compute)
    if k.recompute_maxes:
        # the search mixes two evaluations in its partial-recompute combinations, each with its
        # own maxima (_partial_recompute): the others carry a zero copy of theirs (one shape)
        time = {n: t + Sig({}, t.maxes)._scaled(0.0) if isinstance(t, Sig) and t.maxes else t
                for n, t in time.items()}
    return Terms(time=time, memory=memory,
                 layer={**layer_info, "compute": layer_compute, "dense_compute": dense_compute,
                        "moe_compute": moe_compute, "stage_moe_layers": stage_moe,
                        "tp_comm_moe": tp_moe, "cp_comm": cp_layer,
                        "gemm": gemm, "attention": attn,
                        "eltwise": eltwise, "tp_comm": tp_layer, "ep_comm": ep_layer,
                        "pp_step": pp_step})


def optimizer_state_bytes(training) -> tuple[int, int]:
    """The optimizer's states per parameter and the gradient copy it steps on
    (:data:`OPTIMIZER_STATE_BYTES` by ``optimizer_dtype``; bf16 moments beside an fp32 master,
    :data:`BF16_MOMENTS_FP32_MASTER`); remainders are the caller's (:func:`keeps_remainders`)."""
    if training.optimizer_dtype == "bf16" and training.main_params_dtype == "fp32":
        return BF16_MOMENTS_FP32_MASTER
    return OPTIMIZER_STATE_BYTES[training.optimizer_dtype]


def host_optimizer_bytes(training) -> int:
    """Host bytes per shard parameter of the offloaded optimizer: its states and the gradient
    it steps on (:func:`optimizer_state_bytes`). In fp32, 16: the fp32 master weight and the
    two Adam moments (12) and the fp32 gradient the CPU step reads (4), as DeepSpeed's
    ZeRO-Offload keeps its fp32 optimizer states and gradients on the CPU (Ren et al. 2021,
    Sec. 4.1) and Megatron-Core's HybridDeviceOptimizer its fp32 parameters, gradients and
    states; with bf16 states, 6 (two bf16 moments, the bf16 gradient shard). (bf16 moments
    beside an fp32 master are refused there: frameworks.optimizer_offload_refusal.)"""
    states, grad = optimizer_state_bytes(training)
    return states + grad


def adam_step_bytes(training, with_remainders: bool = False) -> int:
    """Bytes the Adam step touches per parameter, on the GPU or the CPU alike. With the master
    as remainders it reads and writes the bf16 weight and the 16-bit remainder (4 each way)
    where it read and wrote the fp32 master and wrote the weight (4 + 6): 28 bytes with fp32
    moments; with bf16 ones the remainder's 2 each way come on top of the 14: 18. bf16 moments
    beside an fp32 master (``main_params_dtype``): read the master, m, v and the fp32
    gradient (12), write the master, m and v (8) and the 16-bit weight (2): 22."""
    if training.optimizer_dtype == "fp32":
        return ADAM_STEP_BYTES - 2 if with_remainders else ADAM_STEP_BYTES
    if training.main_params_dtype == "fp32":
        return ADAM_STEP_BYTES - 2 * 4
    return ADAM_STEP_BYTES_BF16 + (2 * MASTER_REMAINDER_BYTES if with_remainders else 0)


def keeps_remainders(inst: Instance, k: Knobs) -> bool:
    """Whether the plan's optimizer keeps its master weights as remainders on the GPU:
    ``[training] store_param_remainders`` with the optimizer not offloaded (the host's CPU
    optimizer steps on whole fp32 copies). Which sharding modes may carry it is the
    framework's rule (:func:`planner.model.frameworks.sharding_refusal`): the plan's input
    check and the search's modes leave only those."""
    return inst.spec.training.store_param_remainders and not k.optimizer_offload


#: Layers whose compute an activation transfer hides behind: the next layer's forward (its
#: offload) and the next layer's backward, twice the forward (its reload).
OFFLOAD_WINDOW_PASSES = 3


def host_memory_limit_bytes(inst: Instance) -> float:
    """Host memory one GPU's offloaded bytes may use: the host's memory less
    ``constraints.host_memory_reserve_GiB`` (default a third of it: DeepSpeed's estimator of
    offload memory, ``estimate_zero2_model_states_mem_needs``, budgets 1.5x the offloaded
    states), shared evenly by the GPUs of the host."""
    reserve = inst.spec.constraints.host_memory_reserve_GiB
    total = inst.hw.host_mem_bytes
    kept = total / 3 if reserve is None else reserve * GiB
    return (total - kept) / inst.hw.gpus_per_host


def host_memory_row(inst: Instance, host_bytes):
    """The host-memory limit as one more memory row of the search: the offloaded bytes of one
    GPU scaled so that the GPU limit stands for the host's share (``host_bytes <=
    host_memory_limit_bytes`` iff the row is ``<= memory_limit_bytes``); the terms of
    :data:`MEMORY_TERMS` are zero. ``plan evaluate`` reports it in bytes itself."""
    scale = memory_limit_bytes(inst) / max(host_memory_limit_bytes(inst), 1.0)
    return {**{n: 0.0 for n in MEMORY_TERMS}, "host_offload": host_bytes * scale}


def optimizer_offload_time(inst: Instance, k: Knobs, local_params, grad_wire):
    """``(optimizer, offload)`` seconds of one step (docs/model.md, "Host offload").

    Without optimizer offload: the Adam step bound by HBM bandwidth (:func:`adam_step_bytes`
    per parameter of the GPU's shard, ``local_params``) and no transfer. With it: the Adam
    step runs on the CPU, bound by host memory bandwidth (the same bytes touched per
    parameter, over the framework's share of the host's bandwidth shared by its GPUs);
    the GPU's gradient shard (``grad_wire`` bytes per element) goes device -> host and the
    16-bit parameters come back host -> device, each over the host link. Megatron-Core with
    ``--overlap-cpu-optimizer-d2h-h2d`` pipelines the three over parameter groups: what stays
    exposed beyond the CPU step is the longer transfer's excess over it,
    ``max(0, d2h - cpu, h2d - cpu)``; a framework without that overlap (DeepSpeed here)
    exposes both transfers. All three are the local parameters times a per-instance rate, so
    the maximum is one number per instance (no maximum of the search's forms)."""
    hw = inst.hw
    step = adam_step_bytes(inst.spec.training, keeps_remainders(inst, k))
    if not k.optimizer_offload:
        return local_params * step / hw.hbm_bw, 0.0
    fw = framework_of(inst.spec.constraints.framework)
    # seconds per parameter: the step's bytes at the framework's share of the host's memory
    # bandwidth, shared by its GPUs
    cpu = step / (fw.cpu_adam_share * hw.host_mem_bw / hw.gpus_per_host)
    d2h, h2d = grad_wire / hw.host_bw, WIRE_16 / hw.host_bw
    exposed = max(0.0, d2h - cpu, h2d - cpu) if fw.offload_overlap else d2h + h2d
    return local_params * cpu, local_params * exposed


def activation_offload_time(inst: Instance, k: Knobs, m, stored: dict, dense_share,
                            moe_share, layer_compute):
    """Seconds of one step the activation offload of ``k.offload_layers`` layers leaves
    exposed (docs/model.md, "Host offload"). Per micro-batch and offloaded layer its stored
    activations (``x`` seconds on the host link) go to the host while the next layer runs
    its forward (``f``) and come back while the next layer runs its backward (``2 f``), as
    Megatron-Core's offload handler overlaps them: exposed ``max(0, x - f) + max(0, x - 2 f)``,
    written as one maximum ``max(0, x - f, 2 x - 3 f)`` (equal for ``f >= 0``)."""
    if not k.offload_layers:
        if k.offload_maxes and isinstance(layer_compute, Sig):
            zero = Sig.const(0.0)                    # the same maximum, identically 0
            return vmax(zero, zero, zero)
        return 0.0
    per_layer = sum(share * stored[kind] for kind, share in (("dense", dense_share),
                                                              ("moe", moe_share))
                    if kind in stored and not is_zero(share))
    x = per_layer / inst.hw.host_bw
    f = layer_compute / OFFLOAD_WINDOW_PASSES
    return m * k.offload_layers * vmax(0.0, x - f, 2 * x - 3 * f)


#: the full- and no-recompute terms the last partial recomputes mixed, by the identity of
#: their instance and degrees and by the knobs (the shares of one combination's layout and
#: sharding mix the same two: the enumerator and the encoders ask for each share on the same
#: degrees); the maxima flags, which knobs' equality leaves out, are part of the key, as they
#: change the terms
_MIXED = IdentityCache(maxsize=16)


def _mixed_terms(inst: Instance, x: Degrees, base: Knobs) -> tuple[Terms, Terms]:
    """``step_terms`` under full recompute and without it, for :func:`_partial_recompute`."""
    return _MIXED.get((inst, x), base.terms_key, lambda: (
        step_terms(inst, x, base), step_terms(inst, x, replace(base, recompute="none"))))


def _partial_recompute(inst: Instance, x: Degrees, k: Knobs) -> Terms:
    """Full recompute of ``N = k.recompute_layers`` layers of each virtual stage (Megatron-LM's
    block method), the others keeping their activations (docs/model.md, "Recompute"). Each
    recomputed layer costs what it costs under full recompute, each other one what it costs
    without: every time term is the no-recompute one plus the recomputed share of the
    difference, ``f = min(N p v / (L + shortfalls), 1)`` (the share of a middle stage's
    layers, the pace of the pipeline). A stage of ``n`` layers recomputes ``r = min(N v, n)``
    of them: its activations hold ``n - r`` layers' stored bytes without recompute and ``r``
    layer inputs, plus the working set of the one re-materialised layer.

    The search (symbols) gives the share itself, ``f = k.recompute_share``, a constant of its
    combination, at the (P, V) pairs where ``f`` of a virtual stage is a whole count no larger
    than a short first / last stage's chunk (formulations/space.py): then ``r = f n_mid`` and
    ``n - r = (1 - f) n_mid - shortfall``, and every term is the no-recompute or the
    full-recompute one times a constant (a maximum is scaled apart: ``(1 - f) max(none) + f
    max(full)``), every memory term >= 0 on an even layout."""
    base = replace(k, recompute_layers=0, recompute_share=0, recompute_maxes=False)
    full, none = _mixed_terms(inst, x, base)
    padded = inst.model.layers + k.padded_layers
    m = padded / x.p                           # layers of a middle stage
    share = k.recompute_share
    if share:
        f = float(share)
    elif any(isinstance(z, Sig) for z in (x.p, x.v)):
        raise ValueError("the search recomputes a share of each virtual stage "
                         "(Knobs.recompute_share), not a count")
    else:
        f = np.minimum(k.recompute_layers * x.p * x.v / padded, 1.0)

    def mix(a, b):
        """``(1 - f) a + f b``: the terms as ``a + f (b - a)``, the maxima scaled apart."""
        if not (isinstance(a, Sig) and a.maxes or isinstance(b, Sig) and b.maxes):
            return a + f * (b - a)
        a, b = (z if isinstance(z, Sig) else Sig.const(z) for z in (a, b))
        return (Sig(a.terms) + f * (Sig(b.terms) - Sig(a.terms))
                + Sig({}, a.maxes)._scaled(1.0 - f) + Sig({}, b.maxes)._scaled(f))

    time = {n: mix(none.time[n], full.time[n]) for n in full.time}
    short = {"first": k.first_short, "middle": 0, "last": k.last_short}
    memory = {}
    for name, terms in full.memory.items():
        memory[name] = dict(terms)
        if name.startswith("host") or name.endswith("_step"):   # (no activations held)
            continue
        s = short[name.partition("_")[0]]
        if share:
            r, kept = f * m, (1.0 - f) * m - s
        else:
            r = np.minimum(k.recompute_layers * x.v, m - s)
            kept = m - s - r
        layers = kept * none.layer[f"stored_{name}"] + r * full.layer[f"stored_{name}"]
        # (a short last chunk's layers counted as kept, an upper bound: step_terms)
        memory[name]["activations"] = (full.layer[f"held_{name}"] * layers
                                       + full.layer[f"working_{name}"]
                                       + full.layer[f"extra_{name}"]
                                       + full.layer[f"chunk_{name}"]
                                       * none.layer[f"stored_{name}"])
    return Terms(time=time, memory=memory, layer=full.layer)


def memory_reserve_GiB(inst: Instance) -> float:
    """The per-GPU reserve: ``constraints.memory_reserve_GiB``, else the GPU's default."""
    reserve = inst.spec.constraints.memory_reserve_GiB
    return (default_reserve_GiB(inst.hw.gpu.hbm_capacity_GiB,
                                inst.spec.training.expandable_segments,
                                inst.spec.constraints.framework)
            if reserve is None else reserve)


def memory_limit_bytes(inst: Instance) -> float:
    """Bytes a plan may use per GPU: the capacity less the reserve."""
    return inst.hw.hbm_bytes - memory_reserve_GiB(inst) * GiB


def internode_bytes(inst: Instance, x: Degrees, k: Knobs):
    """Bytes one GPU sends across nodes per step: the communication terms of
    :func:`step_terms` on a network where the NIC moves one byte per second and everything
    else (NVLink, latency, compute, HBM) is free, with no overlap. Counting them with the model's
    own collectives means the bytes can never disagree with the time terms; the search uses
    them to break ties between plans of equal step time (docs/encoding.md, "Ties")."""
    free = float("inf")
    hw = replace(inst.hw, peak=free, peak_fp8=free, peak_fp4=free, hbm_bw=free, bw_intra=free, bw_inter=1.0,
                 lat_intra=0.0, lat_inter=0.0)
    network = replace(inst, hw=hw)
    time = step_terms(network, x, replace(k, **{o: False for o in OVERLAP_KNOBS})).time
    return sum(time[name] for name in COMM_TERMS)


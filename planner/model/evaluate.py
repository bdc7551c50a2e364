"""One plan's numbers: the model's terms summed into the step time and its breakdown, memory
per GPU against the limit, MFU, days and cost, and the limits the plan breaks
(:class:`StepReport`, the JSON of every command's plan result; docs/contract.md).

The terms themselves are :func:`planner.model.terms.step_terms`; this module only assembles
them, so the model and its report cannot disagree.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from planner.model.catalog import GiB
from planner.model.frameworks import DEFAULT_FRAMEWORK, on_megatron_core
from planner.model.instance import Instance
from planner.model.plan import Plan, structural_violations
from planner.model.schema import PlanSpec
from planner.model.terms import (LOW_PRECISIONS, MEMORY_TERMS, SHARDING, TIME_TERMS, hidden_cost,
                                 host_memory_limit_bytes, memory_limit_bytes, memory_reserve_GiB,
                                 step_terms)
from planner.model.words import stage_words
from planner.model.workload import Shape


@dataclass
class StepReport:
    """Everything ``plan evaluate`` prints, and the JSON contract of docs/contract.md, "JSON: plan result"."""

    plan: Plan
    step_time_s: float
    breakdown_s: dict[str, float]
    memory_gib: dict[str, float]
    memory_by_stage_gib: dict[str, dict[str, float]]
    most_loaded_stage: str
    mfu: float
    model_tflops_per_gpu: float
    total_days: float | None
    cost: float | None
    tokens_per_step: int
    steps: float | None
    violations: list[str]
    #: what the model's numbers for this plan rest on that measured runs have not confirmed
    #: (:func:`caveats`), as sentences; empty where the validation covers the case
    caveats: list[str] = field(default_factory=list)
    #: whose rules and defaults cost the plan (``[constraints] framework``, else Megatron-LM's)
    #: and whose kernel figures (``[training] kernel_stack``, else the framework's)
    framework: str = DEFAULT_FRAMEWORK
    kernel_stack: str = "fused"

    @property
    def fits(self) -> bool:
        return not self.violations

    def to_dict(self) -> dict[str, Any]:
        return {
            "plan": self.plan.to_dict(),
            # the same plan as a [plan] table plan evaluate reads back (Plan.to_spec)
            "plan_spec": self.plan.to_spec(),
            "step_time_s": self.step_time_s,
            "breakdown_s": self.breakdown_s,
            "memory_gib": self.memory_gib,
            "memory_by_stage_gib": self.memory_by_stage_gib,
            "most_loaded_stage": self.most_loaded_stage,
            "mfu": self.mfu,
            "mfu_formula": MFU_FORMULA,
            "model_tflops_per_gpu": self.model_tflops_per_gpu,
            "total_days": self.total_days,
            "cost": self.cost,
            "tokens_per_step": self.tokens_per_step,
            "steps": self.steps,
            "feasible": self.fits,
            "violations": self.violations,
            "caveats": self.caveats,
            "framework": self.framework,
            "kernel_stack": self.kernel_stack,
        }


MFU_FORMULA = ("MFU = model FLOPs per step / (step time * GPUs * dense 16-bit peak); model FLOPs "
               "= 3 * B * (L * (GEMM + 4 s^2 a d) + 2 s h V) per sequence (a d = h unless "
               "head_dim is given; multi-head latent attention: 2 s^2 a (qk_head_dim + "
               "qk_pos_emb_head_dim + v_head_dim); each multi-token prediction depth adds a "
               "layer, 4 s h^2 and 2 s h V), no recompute, the attention core counted "
               "in full (not halved for the causal mask) "
               "(Narayanan et al. 2021 Eq. 3; Megatron-LM until March 2025, which since halves "
               "the core: its logged MFU is lower, 1-13% here)")


#: Why an MoE plan's numbers are uncertain (README, "What is validated and what is not"); the
#: figures are ``plan validate``'s on the shipped MoE runs, errors and ranking (tests keep them
#: so: test_validation.py, test_ranking.py).
MOE_CAVEAT = ("mixture of experts: the MoE terms (router, expert GEMMs, token permutation, "
              "all-to-all) are not validated: the 45 measured MoE runs in the shipped set "
              "(DeepSeek-V3, Qwen3-235B-A22B, Qwen3-30B-A3B and gpt-oss-120b on H100, B200, "
              "GB200 and GB300) took 0.8x to 2.9x the step time this model predicts, 16 of "
              "them longer, "
              "so read the step time, days and cost as uncertain by that much either way; and "
              "the model ranks plans that keep expert parallelism inside a node up to 1.7x "
              "faster than NVIDIA's tuned plans of those runs, which spread it over nodes "
              "(plan validate's ranking): weigh its choice of expert placement with that in "
              "mind. Its memory counts the experts' activations at balanced routing: on "
              "Megatron-LM's CI, a DeepSeek-shaped MoE proxy's allocator peak ended 1.047x the "
              "model's in bf16 and 1.016x in FP8, a peak that grew during the run with routing "
              "imbalance, so leave headroom beyond the reserve for a long run")


#: The most a measured peak of Megatron-LM's CI exceeded the peak the model counts, GiB: the
#: bf16 DeepSeek-shaped MoE proxy (planner/data/megatron_ci_memory.toml, docs/model.md
#: "Memory"; ``plan validate --json``: ``megatron_ci_memory.summary.max_uncounted_gib``, which
#: tests/test_megatron_ci_memory.py checks against this). What the reserve covers comes on top.
UNCOUNTED_PEAK_GIB = 2.49
#: a Megatron-Core plan that runs closer to the limit than that
TIGHT_MEMORY_CAVEAT = (
    f"memory: the plan runs within {UNCOUNTED_PEAK_GIB} GiB of the memory limit, and on "
    f"Megatron-LM's CI measured peaks ran up to {UNCOUNTED_PEAK_GIB} GiB above the peak this "
    "model counts (planner/data/megatron_ci_memory.toml): the reserve "
    "(constraints.memory_reserve_GiB) then has to hold that as well as the CUDA context, NCCL's "
    "buffers and the allocator's cache; raise it for more room")

#: What every plan under torchtitan's rules is told of its memory: the model's peak against the
#: peaks torchtitan reserved on its own runs (planner/data/torchtitan_memory.toml; the figures
#: are kept true by tests/test_torchtitan_memory.py)
TORCHTITAN_MEMORY_CAVEAT = (
    "torchtitan's memory: on its own H100 benchmarks (December 2024: Llama 3.1 8B, 70B and "
    "405B under FSDP with TP, PP or CP, eager or compiled, BF16 or float8) torchtitan "
    "reserved 1.0x to 1.2x the peak memory this model counts per GPU without pipeline "
    "parallelism and 1.0x to 1.3x with it (PP 8; planner/data/torchtitan_memory.toml); a "
    "reservation includes the allocator's cache, so it bounds the need from above, but with "
    "pipeline parallelism keep more room than the memory reserve before trusting a plan near "
    "the limit")


#: What every plan under DeepSpeed's rules is told of its memory: on BigScience's topology search
#: (planner/data/measured_alternatives.toml; the figures are kept true by
#: tests/test_alternatives.py), nvidia-smi's peaks against the model's, what the DeepSpeed
#: reserve (frameworks.py measured_peak_ratio) tells, and the plan it does not
DEEPSPEED_MEMORY_CAVEAT = (
    "DeepSpeed's memory: on BigScience's Megatron-DeepSpeed runs (models of 176B-206B on 384 "
    "A100 80GB, 2022: ZeRO-1, full recompute, planner/data/measured_alternatives.toml) the "
    "memory nvidia-smi showed was 1.2x to 1.4x the peak this model counts per GPU; the "
    "default reserve under DeepSpeed keeps the model's peak within the capacity over the "
    "lowest of those ratios, 1.22x, which tells 5 of the 6 plans that ran out of memory "
    "there, and one ran out with 14.3 GiB left under it: keep more room than the reserve "
    "where the plan's memory is unlike those runs'")


#: What every plan under DeepSpeed's rules without sharded parameters is told of its time: the
#: measured steps of such plans over the model's (BigScience's sets,
#: planner/data/measured_alternatives.toml, and MT-NLG 530B's held-out runs in
#: planner/data/published_runs.toml; tests/test_alternatives.py recomputes the range)
DEEPSPEED_TIME_CAVEAT = (
    "DeepSpeed's step time: its measured plans without sharded parameters (BigScience's 35 on "
    "384 A100 in 2022, MT-NLG 530B's 3 on 2,240-3,360 A100 in 2021) took 1.02x to 1.31x the "
    "step time this model predicts, none less: read this plan's step time, days and cost as "
    "that much low")

#: What a DeepSpeed plan with sharded parameters (ZeRO-3) is told of its time instead: the SC21
#: comparison of Megatron-LM's 3D parallelism with DeepSpeed's ZeRO-3 on one cluster
#: (planner/data/measured_alternatives.toml, the Narayanan et al. sets; tests/test_alternatives.py
#: recomputes the range and the pairs the model orders wrong)
DEEPSPEED_ZERO3_CAVEAT = (
    "DeepSpeed's ZeRO-3: in the SC21 comparison (Narayanan et al. 2021, Table 2: GPT 175B and "
    "530B on 384 to 2,240 A100 80GB, DeepSpeed of 2021, ZeRO-3 without model parallelism) its "
    "measured steps took 1.32x to 2.94x the step time this model predicts, more on more GPUs, "
    "and the model put ZeRO-3 ahead of the 3D-parallel plan that ran faster in 3 of the 5 "
    "pairs: read this plan's step time, days and cost as that much low, and weigh a plan "
    "whose parameters are not sharded")


#: What a torchtitan plan with context parallelism is told of its time: on the same benchmark,
#: costed on the H100 SXM (its own 96 GB / 500 W parts are not in the catalog), the model's
#: tokens/s over the measured ones sat at 0.92x-1.06x of their median on the rows without
#: context parallelism and 1.0x-1.4x of it on the rows with it (tests/test_torchtitan_memory.py
#: recomputes both ranges from planner/data/torchtitan_memory.toml's measured_tps)
TORCHTITAN_CP_CAVEAT = (
    "torchtitan's context parallelism: on its own H100 benchmark (December 2024: Llama 3.1 8B "
    "and 405B at 32K-256K tokens, CP 1-8) the model's tokens per second sat 1.0x to 1.4x "
    "further above the measured ones on the rows with context parallelism than on the rows "
    "without (torch's context parallelism: Transformer Engine's, under NeMo, validates within "
    "5% on the long-context runs); this plan may run up to that much slower than planned")


def p2p_since_4047_s(plan: Plan, pp_step: float, slowdown: float) -> float:
    """Seconds more per step that Megatron-LM's interleaved schedule since #4047 (2026-04-16:
    with ``deallocate_pipeline_outputs``, as its training sets it, each steady forward's send is
    waited for at once) exposes beyond the model's rule, the schedule before it (docs/model.md,
    "Overlap"): ``(m - p) v - 1`` more transfers of ``pp_step`` seconds, the short-transfer
    limit of the simulation in tests/test_overlap_sim.py, each costing what it costs shown less
    the price of overlap it paid hidden (``hidden_cost`` of a transfer with nothing hidden);
    0 without interleaving or p2p overlap."""
    if plan.vp <= 1 or not plan.overlap_p2p_comm:
        return 0.0
    more = max(0, (plan.micro_batches - plan.pp) * plan.vp - 1) * pp_step
    return float(hidden_cost(0.0, more, slowdown))


#: What a model with sliding-window attention is told (docs/model.md, "Sliding-window
#: attention"): the window's cost is an exact count of keys, which no measured run confirms
WINDOW_CAVEAT = ("sliding-window attention: its attention core is costed as the keys each "
                 "query attends to, at the full attention's rate; the fused kernels work on "
                 "whole tiles of 64-128 keys, so a window of a few hundred tokens costs up to "
                 "about twice its count there; the shipped runs with a window are six "
                 "mixture-of-experts runs (gpt-oss-120b, held out), whose error is the MoE "
                 "terms' (1.2x to 1.6x the predicted step), so the window's cost is not "
                 "confirmed apart")
#: ... with attention dropout: Transformer Engine's backend filter (dot_product_attention/
#: utils.py) disables its cuDNN attention for a window with dropout
WINDOW_DROPOUT = ("; with dropout, Transformer Engine's cuDNN attention refuses the window, "
                  "so flash-attn 2.3 or later must be installed to run it")
#: ... without fused attention: Megatron-Core's fused softmax kernel (fused_softmax.py
#: is_kernel_available) takes 16-bit causal scores up to 4,096 keys without asking for the
#: window, so the unfused path may train without it
WINDOW_UNFUSED = ("; with flash_attention = false, Megatron-Core's fused softmax kernel runs "
                  "16-bit causal scores of up to 4,096 keys without the window's mask "
                  "(is_kernel_available does not check it): the costed unfused path may not "
                  "train the window")


def window_caveat(inst: Instance) -> str:
    """What a model with a sliding window is told (:data:`WINDOW_CAVEAT`, and the backends
    that may not run the window)."""
    tr = inst.spec.training
    return (WINDOW_CAVEAT + (WINDOW_DROPOUT if inst.model.dropout and tr.flash_attention else "")
            + ("" if tr.flash_attention else WINDOW_UNFUSED))

#: The part of the newer-schedule caveat every plan shares; :data:`P2P_4047_PLAN` adds the plan's
#: own figure (a table of plans states the range of those: :func:`plan_figure`)
P2P_4047_CAVEAT = ("pipeline p2p: costed as Megatron-Core's interleaved schedule before "
                   "Megatron-LM #4047 (April 2026), which the fitted runs ran; since #4047 each "
                   "steady forward's send is waited for at once (deallocate_pipeline_outputs), "
                   "which exposes more transfers")
P2P_4047_PLAN = "; on this plan about {time} more per step, {share:.2g}% of the step"


def p2p_since_4047_caveat(plan: Plan, pp_step: float, slowdown: float,
                          step_s: float) -> str | None:
    """What a Megatron-Core plan that interleaves with ``overlap_p2p_comm`` is told of the
    newer schedule (:func:`p2p_since_4047_s`), or None when it exposes nothing more."""
    extra = p2p_since_4047_s(plan, pp_step, slowdown)
    if extra <= 0:
        return None
    time = f"{extra:.3g} s" if extra >= 1 else f"{extra * 1e3:.3g} ms"
    return P2P_4047_CAVEAT + P2P_4047_PLAN.format(time=time, share=100 * extra / step_s)


def plan_figure(caveat: str) -> tuple[str, float | None]:
    """A caveat split into the text every plan shares and the plan's own share of the step (a
    percentage), for the caveats that carry one (:data:`P2P_4047_CAVEAT`); ``(caveat, None)``
    otherwise."""
    if not caveat.startswith(P2P_4047_CAVEAT):
        return caveat, None
    share = caveat.rsplit(", ", 1)[-1].removesuffix("% of the step")
    return P2P_4047_CAVEAT, float(share)


def caveats(inst: Instance, plan: Plan | None = None, pp_step: float | None = None,
            step_s: float | None = None, headroom_gib: float | None = None) -> list[str]:
    """The parts of the model a plan of ``inst`` leans on that the measured runs do not
    confirm: the MoE terms, DeepSpeed's step time (its measured steps ran longer than the
    model's), torchtitan's and DeepSpeed's memory (their measured peaks sit above the model's)
    and, for a ``plan`` with context parallelism, torchtitan's context-parallel time,
    a GPU type at a precision it has no measured run at (its
    figures there are assumptions, catalog ``measured_precisions``), a kernel stack the type
    has no figures for (the fused ones stand in), and the type's own
    measured caveat (catalog ``caveat``: how far newer software ran from the figures); with
    the ``plan``'s one-transfer time ``pp_step`` and its ``step_s``, what Megatron-LM's newer
    interleaved schedule would add (:func:`p2p_since_4047_caveat`); with its memory headroom
    ``headroom_gib``, under Megatron-Core, whether it runs within :data:`UNCOUNTED_PEAK_GIB` of
    the limit (:data:`TIGHT_MEMORY_CAVEAT`)."""
    out = [MOE_CAVEAT] if Shape.of(inst.model).n_moe else []
    if inst.model.windowed:
        out.append(window_caveat(inst))
    if inst.spec.model.approximates:
        out.append(f"model shape: {inst.spec.model.approximates}; its time and memory are "
                   "the approximation's")
    if inst.spec.constraints.framework == "deepspeed":
        zero3 = plan is not None and SHARDING[plan.dp_sharding].params
        out += [DEEPSPEED_ZERO3_CAVEAT if zero3 else DEEPSPEED_TIME_CAVEAT,
                DEEPSPEED_MEMORY_CAVEAT]
    if inst.spec.constraints.framework == "torchtitan":
        out.append(TORCHTITAN_MEMORY_CAVEAT)
        if plan is not None and plan.cp > 1:
            out.append(TORCHTITAN_CP_CAVEAT)
    precision = inst.spec.training.precision
    gpu = inst.hw.gpu
    if (precision if precision in LOW_PRECISIONS else "16-bit") not in gpu.measured_precisions:
        out.append(f"{gpu.key} has no measured run at {precision} in the shipped set: its "
                   f"efficiencies there are assumptions (hardware_catalog/{gpu.key}.toml, "
                   "calibration), not fitted on runs of its own")
    stack = inst.kernel_stack
    if stack != "fused" and stack not in gpu.kernel_stacks:
        # (torchtitan's default stack on a GPU type no PyTorch-eager run has calibrated)
        out.append(f"{gpu.key} has no figures for kernel_stack = \"{stack}\" (catalog "
                   f"[kernel_stacks.{stack}]): its fused-kernel figures cost this plan, so "
                   "eager modules may run slower than planned")
    if gpu.caveat:
        out.append(f"{gpu.key}: {gpu.caveat}")
    if plan is not None and pp_step is not None and step_s and \
            on_megatron_core(inst.spec.constraints.framework):
        newer = p2p_since_4047_caveat(plan, pp_step, inst.hw.overlap_slowdown, step_s)
        if newer:
            out.append(newer)
    if headroom_gib is not None and 0 <= headroom_gib < UNCOUNTED_PEAK_GIB and \
            on_megatron_core(inst.spec.constraints.framework):
        out.append(TIGHT_MEMORY_CAVEAT)
    return out


def evaluate(inst: Instance, plan: Plan, extra_violations: list[str] | None = None,
             spec: PlanSpec | None = None) -> StepReport:
    """Evaluate one plan: step time with breakdown, memory against capacity, MFU, days, cost.

    Example
    -------
    >>> from planner.model.instance import load_instance          # doctest: +SKIP
    >>> inst = load_instance("instances/gpt3-175b-a100.toml")  # doctest: +SKIP
    >>> evaluate(inst, plan_from_spec(inst, inst.spec.plan)).step_time_s  # doctest: +SKIP
    """
    terms = step_terms(inst, plan.grid.degrees(), plan.knobs)
    breakdown = {name: float(terms.time[name]) for name in TIME_TERMS}
    step = sum(breakdown.values())
    # (the host-memory rows of host offload are not GPU stages: reported below, in bytes)
    host_rows = [st for st in terms.memory if st.startswith("host")]
    by_stage = {st: {n: float(terms.memory[st][n]) / GiB for n in MEMORY_TERMS}
                for st in terms.memory if st not in host_rows}
    for st in by_stage:
        by_stage[st]["total"] = sum(by_stage[st][n] for n in MEMORY_TERMS)
    worst = max(by_stage, key=lambda st: by_stage[st]["total"])
    limit = memory_limit_bytes(inst) / GiB
    memory = dict(by_stage[worst])
    memory["capacity"] = inst.hw.hbm_bytes / GiB
    memory["reserve"] = memory_reserve_GiB(inst)
    memory["limit"] = limit
    memory["headroom"] = limit - memory["total"]      # GiB left under the limit (< 0: over)

    host_limit = host_memory_limit_bytes(inst)
    scale = host_limit / memory_limit_bytes(inst)
    memory["host_offload"] = max((float(terms.memory[st]["host_offload"]) * scale / GiB
                                  for st in host_rows), default=0.0)
    memory["host_limit"] = host_limit / GiB

    violations = structural_violations(inst, plan, spec) + list(extra_violations or [])
    if host_rows and (inst.hw.host_bw <= 0 or inst.hw.host_mem_bytes <= 0):
        violations.append(
            f"host offload: {inst.hw.gpu.key} has no host link or host memory figure in the "
            "catalog; give cluster.host_link_bandwidth_GBps and cluster.host_memory_GiB")
    elif memory["host_offload"] > memory["host_limit"] * (1 + 1e-9):
        hs = inst.hw.gpus_per_host
        violations.append(
            f"host memory: offloading {memory['host_offload']:.1f} GiB per GPU needs "
            f"{memory['host_offload'] * hs:.1f} GiB on a host of {hs} GPUs, over the "
            f"{memory['host_limit'] * hs:.1f} GiB limit (cluster.host_memory_GiB = "
            f"{inst.hw.host_mem_bytes / GiB:g} less constraints.host_memory_reserve_GiB = "
            f"{inst.hw.host_mem_bytes / GiB - memory['host_limit'] * hs:g})")
    if memory["total"] > limit:
        violations.append(
            f"memory: the {stage_words(worst)} needs {memory['total']:.1f} GiB per GPU, over the "
            f"{limit:.1f} GiB limit ({memory['capacity']:.1f} GiB capacity - "
            f"{memory['reserve']:.1f} GiB reserve)")

    sh = Shape.of(inst.model)
    flops = sh.model_flops(plan.global_batch)
    achieved = flops / step / plan.gpus
    mfu = achieved / inst.hw.peak
    tokens_step = plan.global_batch * sh.s
    tr = inst.spec.training
    n_steps = tr.tokens / tokens_step if tr.tokens else None
    days = n_steps * step / 86400 if n_steps is not None else None
    price = inst.spec.cluster.price_per_gpu_hour
    cost = days * 24 * plan.gpus * price if (days is not None and price) else None
    return StepReport(plan=plan, step_time_s=step, breakdown_s=breakdown, memory_gib=memory,
                      memory_by_stage_gib=by_stage, most_loaded_stage=worst, mfu=mfu,
                      model_tflops_per_gpu=achieved / 1e12, total_days=days, cost=cost,
                      tokens_per_step=tokens_step, steps=n_steps, violations=violations,
                      caveats=caveats(inst, plan, float(terms.layer["pp_step"]), step,
                                      memory["headroom"]),
                      framework=inst.spec.constraints.framework or DEFAULT_FRAMEWORK,
                      kernel_stack=inst.kernel_stack)

"""The AMPeD step-time and memory model: the single source of truth for every number.

:func:`step_terms` is the model. It is plain arithmetic on the degrees in :class:`Degrees`, so it
evaluates a fixed plan (numbers), a whole search space at once (numpy arrays, the enumerator) or
the step time as a signomial for the MIP encoders (:class:`~planner.algebra.Sig`). The total step
time is the sum of the named terms of DESIGN.md section 1:

``step = compute + bubble + tp_comm + cp_comm + pp_comm + dp_comm + optimizer``

Reference: Moolchandani et al., "AMPeD: An Analytical Model for Performance in Distributed
Training of Transformers", ISPASS 2023 (Sec. III: compute, communication, bubble, memory),
extended as DESIGN.md lists (recompute, sequence/context parallelism, interleaving, the
distributed optimizer, GQA, gated MLPs, FP8).

:func:`evaluate` turns one :class:`~planner.plan.Plan` into a :class:`StepReport` with the
breakdown, memory per GPU against capacity, MFU, days and cost, and the list of limits the plan
violates (never an exception for a plan that does not fit).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from planner.algebra import eq1, gt1, is_one, ring_share, steps, vmax
from planner.catalog import GiB
from planner.collectives import all_to_all, allreduce, ring_step
from planner.instance import Hardware, Instance
from planner.plan import Plan, structural_violations
from planner.words import stage_words
from planner.schema import PlanSpec
from planner.workload import Shape

TIME_TERMS = ("compute", "bubble", "tp_comm", "cp_comm", "ep_comm", "pp_comm", "dp_comm",
              "optimizer")
MEMORY_TERMS = ("weights", "gradients", "optimizer_states", "activations", "logits")
STAGES = ("first", "last")

#: Bytes per parameter in mixed-precision Adam (Megatron-LM; Korthikanti et al. Sec. 4):
#: 16-bit weights, fp32 gradients, fp32 master weights + two Adam moments.
WEIGHT_BYTES, GRAD_BYTES, OPTIMIZER_BYTES = 2, 4, 12
#: Extra bytes per parameter under FP8 (Transformer Engine keeps an FP8 copy of each GEMM weight
#: and of its transpose).
FP8_WEIGHT_CACHE_BYTES = 2
#: Bytes per gradient element on the wire (16-bit gradient reduction, Megatron-Core default).
GRAD_WIRE_BYTES = 2
#: HBM bytes touched per parameter by the Adam step: read fp32 master, m, v, grad (16), write
#: master, m, v (12), write the 16-bit weight (2).
ADAM_STEP_BYTES = 30


@dataclass(frozen=True)
class Knobs:
    """The categorical choices of a plan."""

    recompute: str = "none"
    sequence_parallel: bool = False
    distributed_optimizer: bool = False


@dataclass
class Degrees:
    """Degrees split into intra- and inter-node factors, micro-batch ``b``, virtual stages ``v``
    and global batch ``B``. Any field may be a number, a numpy array or a symbol."""

    t_in: Any
    t_out: Any
    c_in: Any
    c_out: Any
    p_in: Any
    p_out: Any
    d_in: Any
    d_out: Any
    b: Any
    v: Any
    B: Any
    e_in: Any = 1      # expert-parallel group: inside a node / across nodes
    e_out: Any = 1
    ed_in: Any = 1     # expert data-parallel group (gradients of the experts)
    ed_out: Any = 1

    @property
    def t(self):
        return self.t_in * self.t_out

    @property
    def c(self):
        return self.c_in * self.c_out

    @property
    def p(self):
        return self.p_in * self.p_out

    @property
    def d(self):
        return self.d_in * self.d_out

    @property
    def m(self):
        """Micro-batches per step: ``B / (d b)``."""
        return self.B / (self.d * self.b)

    @property
    def e(self):
        return self.e_in * self.e_out

    @property
    def ed(self):
        return self.ed_in * self.ed_out

    @staticmethod
    def of(plan: Plan) -> Degrees:
        node = plan.gpus // plan.nodes
        ed_in = node / (plan.ep_intra * plan.pp_intra)
        return Degrees(t_in=plan.tp_intra, t_out=plan.inter("tp"), c_in=plan.cp_intra,
                       c_out=plan.inter("cp"), p_in=plan.pp_intra, p_out=plan.inter("pp"),
                       d_in=plan.dp_intra, d_out=plan.inter("dp"), b=plan.micro_batch,
                       v=plan.vp, B=plan.global_batch, e_in=plan.ep_intra,
                       e_out=plan.inter("ep"), ed_in=ed_in, ed_out=plan.expert_dp / ed_in)


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


def step_terms(inst: Instance, x: Degrees, k: Knobs) -> Terms:
    """Step time and memory of one plan under the AMPeD model (see the module docstring).

    Per layer and micro-batch, on one GPU (``b`` sequences, ``s/c`` tokens each, tensor group
    ``t``), with ``n_fwd`` forward passes (2 with full recompute, else 1):

    * GEMMs: ``(n_fwd + 2) * gemm_flops / (t c) / (peak * efficiency)`` (backward = 2x forward).
      Under FP8 the four linear layers run at the FP8 peak and FP8 efficiency; the attention
      core and the output layer stay in 16-bit.
    * Attention core: fused (flash) attention is compute-bound and recomputes ``QK^T`` in the
      backward pass (3.5 passes); unfused attention is a roofline
      ``max(flops / (peak eff), bytes / HBM bandwidth)`` over its ``s^2`` score tensors, plus one
      more pass under selective recompute.
    * Element-wise kernels: forward HBM traffic (norms, bias-dropout-add, activation, unfused
      softmax/dropout) over HBM bandwidth, backward taken as twice the forward traffic.
    * Tensor-parallel: 4 all-reduces of ``b s h / c`` 16-bit activations per layer (2 forward,
      2 backward; reduce-scatter + all-gather under sequence parallelism move the same bytes),
      plus 2 with full recompute; hierarchical ring cost (:func:`collectives.allreduce`).
      A share ``tp_overlap`` may hide behind the layer's GEMMs.
    * Context-parallel: ring exchange of the K/V shard, ``cp - 1`` steps forward and twice that
      backward (K/V plus their gradients), assumed to overlap with the attention core (only the
      excess over it is exposed).

    Per step: compute = ``m * (L/p * layer + logits)`` on the last (slowest) stage; bubble =
    ``R (p - 1) / v`` micro-batch stage times (Narayanan et al. Sec. 2.2); pipeline transfers =
    ``2 m (v - 1/p)`` sends of ``b s h / (c t)`` per GPU (scatter-gather / sequence-parallel
    layout); data-parallel gradient reduction over ``dp * cp`` ranks of the stage's parameters;
    the Adam step as HBM traffic. Memory is checked on the first stage (most activations in
    flight: ``1 + (p - 1) / (p v)`` times the layers' worth, Korthikanti et al. Sec. 4.2.3) and
    on the last (output layer and logits).
    """
    sh = Shape.of(inst.model)
    hw: Hardware = inst.hw
    tr = inst.spec.training
    t, c, p, d, b, v = x.t, x.c, x.p, x.d, x.b, x.v
    m = x.m
    L, h, s = sh.L, sh.h, sh.s
    full = k.recompute == "full"
    selective = k.recompute == "selective"
    n_fwd = 2 if full else 1
    passes = n_fwd + 2
    flash = tr.flash_attention
    sp = k.sequence_parallel
    peak16 = hw.peak * hw.efficiency
    peak_gemm = hw.peak_fp8 * hw.efficiency_fp8 if tr.precision == "fp8" else peak16
    tokens = b * s / c                       # tokens per GPU per micro-batch (context split)
    shard = t if sp else 1                   # replicated tensors are split only with SP

    # ---- compute per layer and micro-batch ------------------------------------------------
    attn_fwd_flops = sh.attention_flops(b) / (t * c)
    if flash:
        attn = (passes + 0.5) * attn_fwd_flops / peak16
        score_bytes = 0.0
    else:
        score_elems = sh.a * b * s * s / (t * c)           # s/c query rows x s keys, a/t heads
        roof = max(4 * h / peak16, 2 * 2 * sh.a / hw.hbm_bw)   # per (b s^2 / (t c)): flops vs bytes
        attn = (passes + (1 if selective else 0)) * (b * s * s / (t * c)) * roof
        score_bytes = sh.score_eltwise_bytes_per_element * score_elems

    def layer_time(gemm_flops, mlp_bytes):
        """GEMMs + attention core + element-wise traffic of one layer and micro-batch."""
        gemm_s = passes * gemm_flops / (t * c) / peak_gemm
        fwd = tokens * (sh.eltwise_replicated_bytes / shard + mlp_bytes / t) + score_bytes
        elt_s = (passes * fwd + (score_bytes if selective else 0)) / hw.hbm_bw
        return gemm_s, elt_s, gemm_s + attn + elt_s

    gemm, eltwise, dense_compute = layer_time(sh.gemm_flops(b), sh.eltwise_parallel_bytes)
    logits = 3 * sh.logits_flops(b) / (t * c) / peak16
    dense_share = sh.n_dense / L
    moe_share = sh.n_moe / L
    if sh.n_moe:
        moe_gemm, _, moe_compute = layer_time(sh.moe_gemm_flops(b), sh.moe_eltwise_parallel_bytes)
    else:
        moe_gemm, moe_compute = 0.0, 0.0
    gemm_avg = dense_share * gemm + moe_share * moe_gemm        # GEMM time of a stage's layer

    # ---- tensor-parallel communication per layer and micro-batch ---------------------------
    act_bytes = 2 * tokens * h
    n_allreduce = 4 + (2 if full else 0)
    tp_layer = n_allreduce * allreduce(act_bytes, x.t_in, x.t_out, hw.bw_intra, hw.bw_inter,
                                       hw.lat_intra, hw.lat_inter)
    if tr.tp_overlap > 0:
        tp_layer = vmax((1 - tr.tp_overlap) * tp_layer, tp_layer - gemm_avg)

    # ---- context-parallel ring exchange per layer and micro-batch --------------------------
    if is_one(x.c_in) and is_one(x.c_out):
        cp_layer = 0.0
    else:
        kv_bytes = 2 * 2 * tokens * h * sh.k / sh.a / t
        hops = steps(c) * passes          # forward: K/V; backward: K/V and their gradients
        cp_raw = hops * ring_step(kv_bytes, x.c_out, hw.bw_intra, hw.bw_inter,
                                   hw.lat_intra, hw.lat_inter)
        cp_layer = vmax(0.0, cp_raw - attn)

    # ---- mixture of experts: MoE layers replace the MLP by routed + shared experts ----------
    # Expert tensor parallelism is 1 (Megatron-Core MoE parallel folding): the ep ranks of a
    # stage hold experts / ep whole experts; tokens reach them sharded over tp (sequence
    # parallelism) and cp. Per MoE layer and micro-batch each GPU dispatches and combines
    # top_k copies of its tokens' hidden states (all-to-all over ep), forward and backward.
    if sh.n_moe:
        a2a_bytes = 2 * tokens * h * sh.top_k / t
        ep_layer = 2 * (n_fwd + 1) * all_to_all(a2a_bytes, x.e_in, x.e_out, hw.bw_intra,
                                                hw.bw_inter, hw.lat_intra, hw.lat_inter)
    else:
        ep_layer = 0.0
    layer_compute = dense_share * dense_compute + moe_share * moe_compute   # stage average

    stage_layers = L / p

    time = {
        "compute": m * (stage_layers * layer_compute + logits),
        # (p - 1)/v stage times of L/p layers = L (1 - 1/p) / v layer times
        "bubble": tr.bubble_ratio * ring_share(p) * L / v * (
            layer_compute + tp_layer + cp_layer + moe_share * ep_layer),
        "tp_comm": m * stage_layers * tp_layer,
        "cp_comm": m * stage_layers * cp_layer,
        "ep_comm": m * stage_layers * moe_share * ep_layer,
    }

    # ---- pipeline point-to-point ------------------------------------------------------------
    pp_bytes = act_bytes / t
    # each GPU sends m (v - 1/p) = m ((v - 1) + (1 - 1/p)) activations forward, as many back
    time["pp_comm"] = 2 * m * (steps(v) + ring_share(p)) * ring_step(
        pp_bytes, x.p_out, hw.bw_intra, hw.bw_inter, hw.lat_intra, hw.lat_inter)

    # ---- parameters of the most loaded stage ------------------------------------------------
    # dense parameters (everything but routed experts) are split over tp and reduced over
    # dp x cp; routed experts are split over ep and reduced over the expert data-parallel group
    untied_extra = 0 if sh.tied else sh.V * h
    dense_layer_avg = dense_share * sh.layer_params + moe_share * sh.moe_dense_params
    stage_params = stage_layers * dense_layer_avg + sh.embedding_params + 2 * h \
        + eq1(p) * untied_extra                      # upper bound over first and last stage
    params_gpu = stage_params / t
    expert_gpu = stage_layers * moe_share * sh.experts * sh.expert_params / x.e if sh.n_moe \
        else 0.0

    # ---- data-parallel gradient reduction (over dp x cp ranks) + optimizer step -------------
    dp_raw = allreduce(GRAD_WIRE_BYTES * params_gpu, x.d_in * x.c_in, x.d_out * x.c_out,
                       hw.bw_intra, hw.bw_inter, hw.lat_intra, hw.lat_inter)
    if sh.n_moe:
        dp_raw = dp_raw + allreduce(GRAD_WIRE_BYTES * expert_gpu, x.ed_in, x.ed_out,
                                    hw.bw_intra, hw.bw_inter, hw.lat_intra, hw.lat_inter)
    if tr.dp_overlap > 0:
        # it may hide behind one micro-batch's compute on the stage (the backward of the last
        # micro-batch for the gradient reduce-scatter, the forward of the first for the
        # parameter all-gather of the distributed optimizer)
        window = stage_layers * layer_compute
        dp_raw = vmax((1 - tr.dp_overlap) * dp_raw, dp_raw - window)
    time["dp_comm"] = dp_raw
    dist = k.distributed_optimizer
    shards = d * c if dist else 1
    expert_shards = x.ed if dist else 1
    time["optimizer"] = (params_gpu / shards
                         + (expert_gpu / expert_shards if sh.n_moe else 0)) * ADAM_STEP_BYTES \
        / hw.hbm_bw

    # ---- memory per GPU, first and last pipeline stage --------------------------------------
    # A stage is checked as if all its L/p layers were of one kind, for each kind the model
    # has: a stage mixing dense and MoE layers needs no more than the larger of the two.
    weight_bytes = WEIGHT_BYTES + (FP8_WEIGHT_CACHE_BYTES if tr.precision == "fp8" else 0)
    opt_bytes = OPTIMIZER_BYTES / shards
    kinds = [kind for kind, n_kind in (("dense", sh.n_dense), ("moe", sh.n_moe)) if n_kind]

    def stored_per_layer(parallel_bytes):
        """(stored bytes per layer and micro-batch, working set of one re-materialised layer)."""
        none = tokens * (sh.act_replicated_bytes / shard + parallel_bytes / t)
        if flash:
            none = none + 4 * sh.a * tokens / t                  # fp32 softmax statistics
            sel = none
        else:
            sel = none
            none = none + sh.act_score_bytes_per_element * sh.a * tokens * s / t
        if full:
            return 2 * tokens * h / shard, none                   # the layer input checkpoint
        return (sel if selective else none), 0.0

    # 1F1B keeps p micro-batches of the first stage's L/p layers in flight; interleaving adds
    # (p - 1) / (p v) of that (Korthikanti et al. Sec. 4.2.3). The last stage keeps
    # (v - 1) / v + 1 / (p v) layers' worth (Megatron's interleaved warm-up on rank p - 1).
    # Without interleaving (v = 1) Megatron runs plain 1F1B: exactly p micro-batches of L/p
    # layers on the first stage, hence the gt1(v) factor on the interleaving term.
    first_flight = 1 + gt1(v) * ring_share(p) / v
    last_flight = ring_share(v) + 1 / (p * v)
    in_flight = p + gt1(v) * steps(p) / v                        # micro-batches, first stage
    embed_mask = sh.dropout_mask_bytes * tokens * h / shard * in_flight
    logits_buffer = 6 * tokens * sh.V / t                         # 16-bit logits + fp32 softmax

    memory = {}
    for kind in kinds:
        if kind == "dense":
            layer_p, experts_p, act_bytes_p = sh.layer_params, 0.0, sh.act_parallel_bytes
        else:
            layer_p = sh.moe_dense_params
            experts_p = stage_layers * sh.experts * sh.expert_params / x.e
            act_bytes_p = sh.moe_act_parallel_bytes
        stored, working = stored_per_layer(act_bytes_p)
        expert_opt = OPTIMIZER_BYTES / expert_shards
        for stage in STAGES:
            if stage == "first":
                dense_p = (stage_layers * layer_p + sh.embedding_params
                           + eq1(p) * (untied_extra + 2 * h)) / t
                acts = L * stored * first_flight + working + embed_mask
                logit = eq1(p) * logits_buffer
            else:
                dense_p = (stage_layers * layer_p + sh.V * h + 2 * h) / t
                acts = L * stored * last_flight + working
                logit = logits_buffer
            name = stage if len(kinds) == 1 else f"{stage}_{kind}"
            memory[name] = {
                "weights": (dense_p + experts_p) * weight_bytes,
                "gradients": (dense_p + experts_p) * GRAD_BYTES,
                "optimizer_states": dense_p * opt_bytes + experts_p * expert_opt,
                "activations": acts,
                "logits": logit,
            }
    return Terms(time=time, memory=memory,
                 layer={"compute": layer_compute, "gemm": gemm, "attention": attn,
                        "eltwise": eltwise, "tp_comm": tp_layer, "ep_comm": ep_layer})


# ------------------------------------------------------------------------------------------
# Reports
# ------------------------------------------------------------------------------------------


@dataclass
class StepReport:
    """Everything ``plan evaluate`` prints, and the JSON contract of DESIGN.md section 3."""

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

    @property
    def fits(self) -> bool:
        return not self.violations

    def to_dict(self) -> dict[str, Any]:
        return {
            "plan": self.plan.to_dict(),
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
        }


MFU_FORMULA = ("MFU = model FLOPs per step / (step time * GPUs * dense 16-bit peak); model FLOPs "
               "= 3 * B * (L * (GEMM + 4 s^2 h) + 2 s h V) per sequence, no recompute "
               "(Megatron-LM / Narayanan et al. 2021 Eq. 3)")


def memory_limit_bytes(inst: Instance) -> float:
    return inst.hw.hbm_bytes - inst.spec.constraints.memory_reserve_GiB * GiB


def evaluate(inst: Instance, plan: Plan, extra_violations: list[str] | None = None,
             spec: PlanSpec | None = None) -> StepReport:
    """Evaluate one plan: step time with breakdown, memory against capacity, MFU, days, cost.

    Example
    -------
    >>> from planner.instance import load_instance          # doctest: +SKIP
    >>> inst = load_instance("instances/gpt3-175b-a100.toml")  # doctest: +SKIP
    >>> evaluate(inst, plan_from_spec(inst, inst.spec.plan)).step_time_s  # doctest: +SKIP
    """
    k = Knobs(plan.recompute, plan.sequence_parallel, plan.distributed_optimizer)
    terms = step_terms(inst, Degrees.of(plan), k)
    breakdown = {name: float(terms.time[name]) for name in TIME_TERMS}
    step = sum(breakdown.values())
    by_stage = {st: {n: float(terms.memory[st][n]) / GiB for n in MEMORY_TERMS}
                for st in terms.memory}
    for st in by_stage:
        by_stage[st]["total"] = sum(by_stage[st][n] for n in MEMORY_TERMS)
    worst = max(by_stage, key=lambda st: by_stage[st]["total"])
    limit = memory_limit_bytes(inst) / GiB
    memory = dict(by_stage[worst])
    memory["capacity"] = inst.hw.hbm_bytes / GiB
    memory["reserve"] = inst.spec.constraints.memory_reserve_GiB
    memory["limit"] = limit

    violations = structural_violations(inst, plan, spec) + list(extra_violations or [])
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
                      tokens_per_step=tokens_step, steps=n_steps, violations=violations)

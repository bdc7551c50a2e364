"""The parallel plan: one frozen record that owns the degrees and their placement on nodes.

Like torchtitan's ``ParallelDims`` it is the single owner of the degrees; unlike it, checking a
plan never raises: :func:`structural_violations` returns every broken rule so a report can list
them all (DESIGN.md: "a plan that does not fit is reported with the limits it violates").

Placement follows AMPeD: each degree splits into an intra-node factor and an inter-node factor
(``tp = tp_intra * tp_inter``) and the intra factors of all degrees multiply to the GPUs of one
node, i.e. every node holds a box of the process grid. When a plan does not say, the box is taken
in Megatron-LM's rank order (tp innermost, then cp, dp, pp).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from planner.instance import Instance
from planner.schema import KNOB_DEFAULTS, PlanSpec
from planner.words import plural

ORDER = ("tp", "cp", "dp", "pp")  # Megatron-LM rank order, innermost first


@dataclass(frozen=True)
class Plan:
    """Degrees, micro-batching, categorical knobs and the intra-node factor of each degree."""

    tp: int
    pp: int
    dp: int
    micro_batch: int
    global_batch: int
    gpus: int
    nodes: int
    cp: int = 1
    vp: int = 1
    recompute: str = "none"
    sequence_parallel: bool = False
    distributed_optimizer: bool = False
    tp_intra: int = 1
    cp_intra: int = 1
    pp_intra: int = 1
    dp_intra: int = 1
    ep: int = 1          # expert-parallel degree (MoE layers): experts sharded over ep ranks
    ep_intra: int = 1    # its factor inside a node

    @property
    def expert_dp(self) -> float:
        """Expert data-parallel degree: the MoE layers' grid is ep x expert_dp per stage
        (expert tensor parallelism 1, Megatron-Core's MoE parallel folding)."""
        return self.gpus / (self.pp * self.ep)

    @property
    def micro_batches(self) -> float:
        """Micro-batches per step per pipeline: global_batch / (dp * micro_batch)."""
        m = self.global_batch / (self.dp * self.micro_batch)
        return int(m) if float(m).is_integer() else m

    def inter(self, dim: str) -> float:
        """Inter-node factor of a degree (tp_inter = tp / tp_intra)."""
        return getattr(self, dim) / getattr(self, f"{dim}_intra")

    def label(self) -> str:
        """Short human label, e.g. ``TP8 PP8 DP16 mb1``."""
        s = f"TP{self.tp} PP{self.pp} DP{self.dp}"
        if self.cp > 1:
            s += f" CP{self.cp}"
        if self.vp > 1:
            s += f" VP{self.vp}"
        if self.ep > 1:
            s += f" EP{self.ep}"
        return s + f" mb{self.micro_batch}"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["micro_batches"] = self.micro_batches
        for dim in ORDER + ("ep",):
            d[f"{dim}_inter"] = self.inter(dim)
        d["expert_dp"] = self.expert_dp
        return d


def default_placement(degrees: dict[str, int], node_size: int) -> dict[str, int]:
    """Intra-node factors in Megatron rank order: a degree gets a factor of the node only once
    every inner degree fits entirely inside it."""
    rem, full, out = node_size, True, {}
    for dim in ORDER:
        f = math.gcd(degrees[dim], rem) if full else 1
        rem //= f
        full = full and f == degrees[dim]
        out[dim] = f
    return out


def plan_from_spec(inst: Instance, spec: PlanSpec, **overrides: Any) -> Plan:
    """Build a :class:`Plan` from ``[plan]`` plus command-line overrides (``tp=8``)."""
    fields = spec.model_dump()
    fields.update({k: v for k, v in overrides.items() if v is not None})
    tp, pp, cp = fields["tp"], fields["pp"], fields["cp"]
    gpus = inst.gpus
    dp = fields["dp"] or max(1, gpus // (tp * pp * cp))
    tb = inst.spec.training.global_batch
    gb = fields["global_batch"] or (tb if isinstance(tb, int) else tb[1])
    degrees = {"tp": tp, "cp": cp, "dp": dp, "pp": pp}
    placed = default_placement(degrees, inst.node_size)
    intra = {d: fields.get(f"{d}_intra") or placed[d] for d in ORDER}
    ep = fields.get("ep") or 1
    # experts fill the innermost ranks of a stage: as much of ep as the stage's share of a node
    ep_intra = fields.get("ep_intra") or math.gcd(ep, max(1, inst.node_size // intra["pp"]))
    return Plan(tp=tp, pp=pp, dp=dp, cp=cp, vp=fields["vp"], micro_batch=fields["micro_batch"],
                ep=ep, ep_intra=ep_intra,
                global_batch=gb, gpus=gpus, nodes=inst.nodes, recompute=fields["recompute"],
                sequence_parallel=_knob(inst, fields, "sequence_parallel"),
                distributed_optimizer=_knob(inst, fields, "distributed_optimizer"),
                **{f"{d}_intra": intra[d] for d in ORDER})


def _knob(inst: Instance, fields: dict[str, Any], name: str) -> bool:
    """A memory knob: the plan's (or a flag's) value, else the ``[constraints]`` pin, else the
    default ``plan solve`` uses too (:data:`planner.schema.KNOB_DEFAULTS`)."""
    if fields.get(name) is not None:
        return fields[name]
    pin = getattr(inst.spec.constraints, name)
    return KNOB_DEFAULTS[name] if pin is None else pin


def structural_violations(inst: Instance, plan: Plan, spec: PlanSpec | None = None) -> list[str]:
    """Every structural rule the plan breaks, as sentences naming the numbers."""
    m = inst.model
    out = []
    if plan.tp * plan.pp * plan.dp * plan.cp != plan.gpus:
        out.append(f"tp*pp*dp*cp = {plan.tp}*{plan.pp}*{plan.dp}*{plan.cp} = "
                   f"{plan.tp * plan.pp * plan.dp * plan.cp}, not the {plan.gpus} GPUs")
    if m.heads % plan.tp or m.kv % plan.tp:
        out.append(f"tp={plan.tp} must divide heads={m.heads} and kv_heads={m.kv}")
    if m.layers % (plan.pp * plan.vp):
        out.append(f"pp*vp = {plan.pp * plan.vp} must divide layers={m.layers}")
    if plan.vp > 1 and plan.pp == 1:
        out.append("vp > 1 needs pp > 1 (interleaving splits pipeline stages)")
    if m.seq_len % plan.cp:
        out.append(f"cp={plan.cp} must divide seq_len={m.seq_len}")
    if plan.global_batch % (plan.dp * plan.micro_batch):
        out.append(f"dp*micro_batch = {plan.dp * plan.micro_batch} must divide "
                   f"global_batch={plan.global_batch}")
    elif plan.vp > 1 and plan.micro_batches % plan.pp:
        out.append(f"interleaving needs micro_batches ({plan.micro_batches}) divisible by "
                   f"pp ({plan.pp})")
    if spec is not None and spec.micro_batches and spec.micro_batches != plan.micro_batches:
        out.append(f"plan.micro_batches={spec.micro_batches} but global_batch/(dp*micro_batch)"
                   f" = {plan.micro_batches}")
    box = 1
    for dim in ORDER:
        f, deg = getattr(plan, f"{dim}_intra"), getattr(plan, dim)
        box *= f
        if deg % f:
            out.append(f"{dim}_intra={f} must divide {dim}={deg}")
    if box != inst.node_size:
        out.append(f"intra-node factors tp*cp*dp*pp = {box} must equal the {inst.node_size} GPUs "
                   "of a node (each node holds a box of the process grid); set *_intra in [plan]")
    if plan.ep > 1 and not m.moe:
        out.append(f"ep={plan.ep} needs a mixture-of-experts model (model.experts > 1)")
    if m.moe:
        if m.experts % plan.ep:
            out.append(f"ep={plan.ep} must divide experts={m.experts}")
        if (plan.gpus // plan.pp) % plan.ep:
            out.append(f"ep={plan.ep} must divide the {plan.gpus // plan.pp} GPUs of a pipeline "
                       "stage (tp*cp*dp)")
        if plan.ep % plan.ep_intra or (inst.node_size // plan.pp_intra) % plan.ep_intra:
            out.append(f"ep_intra={plan.ep_intra} must divide ep={plan.ep} and the "
                       f"{inst.node_size // plan.pp_intra} GPUs a stage has in a node")
        else:
            ed_in = inst.node_size // (plan.ep_intra * plan.pp_intra)
            ed_out = plan.expert_dp / ed_in
            if ed_out < 1 or not float(ed_out).is_integer():
                out.append(f"ep_intra={plan.ep_intra}: the expert data-parallel group "
                           f"({plan.expert_dp:g} ranks, {ed_in} of them inside a node) does not "
                           f"tile the {plural(plan.nodes, 'node')}; choose ep_intra so ep / "
                           "ep_intra divides the node count")
        if plan.tp > 1 and not plan.sequence_parallel:
            out.append("MoE layers with tp > 1 need sequence parallelism (Megatron-Core)")
    c = inst.spec.constraints
    for dim in ("tp", "pp", "cp"):      # only rules the instance sets: a default (tp inside a
        key = f"{dim}_within_node"       # node) steers the search, it does not judge a plan
        if key in c.model_fields_set and getattr(c, key) and plan.inter(dim) != 1:
            out.append(f"constraints.{dim}_within_node = true but {dim} = {getattr(plan, dim)} "
                       "crosses nodes")
    return out

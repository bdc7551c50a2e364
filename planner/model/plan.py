"""The parallel plan and the one derivation of every degree from the base variables.

Three readers need the degrees of a plan: the evaluator (a fixed plan, numbers), the enumerator
(a whole search space at once, numpy arrays) and the MIP encoding (symbols of
:mod:`planner.model.algebra`); the decoder turns a solver's answer back into a :class:`Plan`.
All four go through the two functions here, written once as plain arithmetic:

* :meth:`Grid.from_base` maps the search's *base variables* (``T, T_in, C, C_in, P, P_in, V, b,
  B, E, E_in``: the degrees a plan chooses freely) to the whole process grid, deriving the data
  degree ``dp = N / (T C P)`` and its intra-node factor ``dp_intra = g / (T_in C_in P_in)``;
* :meth:`Grid.degrees` maps a grid to the evaluator's :class:`Degrees`: every degree split into
  its factor inside a node and across nodes, the micro-batch count and the expert data-parallel
  group.

Placement follows AMPeD: each degree splits into an intra-node factor and an inter-node factor
(``tp = tp_intra * tp_inter``) and the intra factors of all degrees multiply to the GPUs of one
node, i.e. every node holds a box of the process grid. When a plan does not say, the box is taken
in Megatron-LM's rank order (tp innermost, then cp, dp, pp): :func:`default_placement`.

Whether a plan keeps the structural rules (divisibility, node tiling, ...) is decided by the one
rule table of :mod:`planner.model.rules`; :func:`structural_violations` lists every rule broken,
and never raises (a report lists them all).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from fractions import Fraction
from typing import Any

from planner.model.errors import InfeasibleError, InputError
from planner.model.frameworks import (OVERLAP_KNOBS, framework_of, optimizer_offload_refusal,
                                      sharding_refusal)
from planner.model.instance import Instance
from planner.model.pipeline_layout import check_layout, layout_stages, layout_text, shortfalls
from planner.model.rules import violations
from planner.model.schema import KNOB_DEFAULTS, PIN_CAPS, PlanSpec, overlap_refusal

#: Megatron-LM's rank order, innermost first (Megatron-Core's default "tp-cp-ep-dp-pp"; the
#: exports check a plan's placement against it)
ORDER = ("tp", "cp", "dp", "pp")

#: The search's base variables (the free choices of a plan), in enumeration order.
#: ``R``: replicas of the data-parallel shard group (HSDP; ``dp_shard_size = dp / R``).
BASE_NAMES = ("T", "T_in", "C", "C_in", "P", "P_in", "V", "b", "B", "E", "E_in", "R")


@dataclass(frozen=True)
class Knobs:
    """The categorical choices of a plan.

    ``dp_sharding`` is the data-parallel sharding mode (``none | optim | optim_grads |
    optim_grads_params``); left empty it follows ``distributed_optimizer`` (on: ``optim``), and
    ``distributed_optimizer`` is always set to "some sharding": the two name one choice, so
    equal choices compare equal. ``reshard_after_forward`` only means something when the
    parameters are sharded (it is False otherwise); left None it is the framework's default
    policy, true without pipeline parallelism and false with it (torchtitan's "default"; the
    model reads it off the pipeline degree, :func:`planner.model.terms.step_terms`)."""

    recompute: str = "none"
    sequence_parallel: bool = False
    distributed_optimizer: bool = False
    # framework overlap switches (Megatron-Core names; cost rules in planner/model/terms.py)
    overlap_grad_reduce: bool = False
    overlap_param_gather: bool = False
    tp_comm_overlap: bool = False
    overlap_p2p_comm: bool = False
    overlap_moe_expert_parallel_comm: bool = False
    #: The pipeline layout, as the search chooses it (independent of the pipeline degree): how
    #: many decoder layers the first / last stage holds fewer than a middle one (a middle stage
    #: holds ``m = (layers + first_short + last_short) / pp``), and whether that shortfall is
    #: Megatron-LM's "the embedding / the loss counts as one layer" (then it is 1, and only the
    #: first chunk of rank 0 / the last chunk of rank pp-1 is short). ``Plan`` keeps Megatron's
    #: absolute counts; :func:`layout_knobs` converts.
    first_short: Any = 0
    last_short: Any = 0
    account_for_embedding: bool = False
    account_for_loss: bool = False
    #: the shortfalls above sit in the first / last virtual stage and the plan writes its
    #: split as Megatron-Core's layout string (:mod:`planner.model.pipeline_layout`): a
    #: ``[plan] pipeline_layout``, or a layout of the search (shortfalls of 2 or more, at
    #: vp > 1; the account flags are the shortfalls of 1)
    layout_string: bool = False
    #: set by the search when one of its layouts has a short last stage: the symbolic model
    #: then carries the maximum that decides whether the last stage (with the output layer) or
    #: a middle one is the slowest (not a choice: ignored when comparing knobs)
    paced: bool = field(default=False, compare=False)
    #: with recompute = "full": layers of each virtual stage recomputed (Megatron-LM's block
    #: method, --recompute-num-layers); 0: all of them
    recompute_layers: int = 0
    #: the search's partial recompute (docs/encoding.md, "Partial recompute"): with recompute =
    #: "full", the share of each virtual stage's layers recomputed (a Fraction below 1; 0: not
    #: a share); the plan's recompute_layers is that share of its virtual stage
    recompute_share: Any = 0

    #: data-parallel sharding (ZeRO stage; see the class docstring)
    dp_sharding: str = ""
    reshard_after_forward: bool | None = None
    #: host offload (docs/model.md, "Host offload"): the optimizer states in host memory, and
    #: the decoder layers whose activations are offloaded (Megatron-Core
    #: --cpu-offloading-num-layers)
    optimizer_offload: bool = False
    offload_layers: int = 0
    #: set by the search when one of its combinations offloads: every combination then
    #: carries the offload terms' maxima (the encoders need one shape; not a choice)
    offload_maxes: bool = field(default=False, compare=False)
    #: set by the search when one of its combinations recomputes part of the layers: every
    #: combination then carries two copies of the time terms' maxima (a partial recompute mixes
    #: the no-recompute and the full-recompute ones; the encoders need one shape; not a choice)
    recompute_maxes: bool = field(default=False, compare=False)
    #: set by the search for an overlap switch that is on in some of its combinations and off
    #: in others (a framework default that follows the sharding mode: DeepSpeed's ZeRO-3):
    #: the combinations without it carry the maxima of its exposure rule at zero (the
    #: encoders need one shape; not a choice)
    overlap_maxes: tuple[str, ...] = field(default=(), compare=False)

    def __post_init__(self):
        mode = self.dp_sharding or ("optim" if self.distributed_optimizer else "none")
        # (None: the framework's default policy, which depends on the pipeline degree; the
        # search's choice, resolved to a bool in a Plan)
        reshard = self.reshard_after_forward if mode == "optim_grads_params" else False
        object.__setattr__(self, "dp_sharding", mode)
        object.__setattr__(self, "distributed_optimizer", mode != "none")
        object.__setattr__(self, "reshard_after_forward", reshard)

    @property
    def terms_key(self) -> tuple:
        """The knobs with the search's flags that their equality leaves out (the fields with
        ``compare=False``: ``paced`` and the maxima flags): not choices, but they change the
        terms :func:`planner.model.terms.step_terms` writes, so a memo of terms or of an
        encoding keys on this, not on the knobs alone."""
        return (self, *(getattr(self, name) for name in _SEARCH_FLAGS))

    @property
    def sharding_choice(self) -> tuple[str, bool]:
        """The sharding mode with its reshard policy: one categorical choice of the search."""
        return (self.dp_sharding, self.reshard_after_forward)

    @property
    def offload(self) -> tuple[bool, int]:
        """Optimizer offload with the offloaded layer count: one categorical dimension."""
        return (self.optimizer_offload, self.offload_layers)

    @property
    def offloads(self) -> bool:
        """Something goes to host memory: the optimizer states or some layers' activations."""
        return bool(self.optimizer_offload or self.offload_layers)

    @property
    def layout(self) -> tuple:
        """The five layout fields, one categorical dimension of the search."""
        return (self.first_short, self.last_short, self.account_for_embedding,
                self.account_for_loss, self.layout_string)

    @property
    def padded_layers(self) -> Any:
        """``layers + first_short + last_short`` over the layers: the count ``pp * vp`` splits."""
        return self.first_short + self.last_short

    @property
    def uneven(self) -> bool:
        return bool(self.first_short or self.last_short)

    @property
    def explicit_layout(self) -> bool:
        """First/last counts given as numbers (Megatron ``--decoder-first/last-pipeline-num-
        layers``), not by counting the embedding / loss as layers nor by a layout string."""
        return self.uneven and not (self.account_for_embedding or self.account_for_loss
                                    or self.layout_string)

    @property
    def chunk_shortfall(self) -> bool:
        """The first / last rank's shortfall sits in one virtual stage (its first / last
        chunk: the account flags, a layout string), not spread over the rank's chunks as
        Megatron's first / last stage counts spread it: the memory of the last rank follows
        (docs/model.md, "Pipeline layout")."""
        return self.uneven and not self.explicit_layout


#: the fields of :class:`Knobs` that its equality leaves out (:attr:`Knobs.terms_key`)
_SEARCH_FLAGS = tuple(f.name for f in fields(Knobs) if not f.compare)


def plan_label(plan: Mapping[str, Any]) -> str:
    """The short human label of a plan given by its degrees (a :class:`Plan`'s fields, or
    ``Plan.to_dict()`` as JSON and sweep rows carry it), e.g. ``TP8 PP8 DP16 EP8 mb1``: tp, pp
    and dp, then every other degree above 1 (CP, VP, EP), then the micro-batch. The one writer
    of the label (:meth:`Plan.label`, plots, sweep rows)."""
    s = f"TP{plan['tp']} PP{plan['pp']} DP{plan['dp']}"
    for dim in ("cp", "vp", "ep"):
        if plan.get(dim, 1) > 1:
            s += f" {dim.upper()}{plan[dim]}"
    return s + f" mb{plan['micro_batch']}"


#: The deepest first / last stage shortfall the search takes on where ``[constraints]
#: max_stage_shortfall`` is not given (:func:`stage_shortfall`): each pair of shortfalls up to
#: it is a layout, and each layout a set of tables, so the search slows with it (docs/encoding.md,
#: "Pipeline layouts"); 4 reaches MT-NLG's 105 layers at every power-of-two pipeline degree up
#: to 16 (its 16-stage split is 4, 14 x 7, 3)
AUTO_SHORTFALL_CAP = 4


def least_shortfall(layers: int, pp: int) -> int | None:
    """The least first / last stage shortfall at which Megatron-LM splits ``layers`` over ``pp``
    stages (``--decoder-first/last-pipeline-num-layers``, no virtual stages): the middle stages
    hold ``m = ceil(layers / pp)`` each, and the ``pp m - layers`` layers they hold beyond the
    count come off the first and the last stage, the larger share of them off one. None when
    that leaves an end stage without a layer (no such split)."""
    if pp <= 2:
        return layers % pp
    m = -(-layers // pp)
    short = -(-(pp * m - layers) // 2)
    return short if m - short >= 1 else None


def stage_shortfall(inst: Instance) -> int:
    """The first / last stage shortfall the search goes up to: ``[constraints]
    max_stage_shortfall`` where given. Unset, the least from 1 up at which the search reaches a
    pipeline about as deep as any the layers allow: for every pipeline degree ``p`` the GPU
    count allows (its divisors up to the layer count, within the ``pp`` pin and ``max_pp``)
    whose split needs no more than :data:`AUTO_SHORTFALL_CAP` (:func:`least_shortfall`), one
    from ``p / 2`` to ``p`` that the search reaches. A layer count the GPU count does not
    divide is then still searched at pipelines of its depth: MT-NLG's 105 layers on 256 GPUs
    split over 8 or 16 stages only 4 layers short at the ends, which a search kept to 1 short
    leaves out (it reaches pp 1 and 2); Llama 3's 80 layers on 480 GPUs reach pp 5 and 8 one
    short, and are not searched at pp 6 as well (each shortfall more is more layouts to
    solve: docs/encoding.md, "Pipeline layouts")."""
    c = inst.spec.constraints
    if "max_stage_shortfall" in c.model_fields_set:
        return c.max_stage_shortfall
    return own_shortfall(inst)


def own_shortfall(inst: Instance) -> int:
    """The search's own shortfall (:func:`stage_shortfall` with ``max_stage_shortfall``
    unset), whether or not the instance gives one: ``--compare``'s baseline lifts a given
    value below it to it (formulations/queries.py, ``baseline_spec``)."""
    c = inst.spec.constraints
    layers, n = inst.model.layers, inst.gpus
    top = min(layers, n, c.pp or n, c.max_pp or n)
    need = {p: least_shortfall(layers, p) for p in range(max(2, c.pp or 2), top + 1)
            if n % p == 0}
    wanted = [p for p, k in need.items() if k is not None and k <= AUTO_SHORTFALL_CAP]
    for k in range(1, AUTO_SHORTFALL_CAP):
        reached = [1] + [p for p in wanted if need[p] <= k]
        if all(any(p <= 2 * q <= 2 * p for q in reached) for p in wanted):
            return k
    return AUTO_SHORTFALL_CAP


def shortfall_words(inst: Instance) -> str:
    """The shortfall the search goes up to, in the instance's words (its key, and where unset
    why it is that)."""
    k = stage_shortfall(inst)
    if "max_stage_shortfall" in inst.spec.constraints.model_fields_set:
        return f"constraints.max_stage_shortfall = {k}"
    return (f"constraints.max_stage_shortfall = {k} (unset: the search's own, the least up to "
            f"{AUTO_SHORTFALL_CAP} that reaches pipelines as deep as {inst.model.layers} layers "
            f"allow on {inst.gpus} GPUs)")


def layout_choices(inst: Instance) -> list[tuple[int, int, bool, bool, bool]]:
    """The pipeline layouts the search considers, as ``(first_short, last_short,
    account_for_embedding, account_for_loss, layout_string)``: the even split; each first /
    last shortfall up to :func:`stage_shortfall` (``constraints.max_stage_shortfall``;
    Megatron-LM's first / last stage counts); the embedding and / or loss counted as a layer;
    and shortfalls of 2 or more in the first / last virtual stage alone, a layout string (the
    search keeps these at vp > 1, where they differ from the first / last counts). The
    ``[constraints]`` pins on the account flags keep or drop those; pins on the first / last
    counts are checked per pipeline degree by the search (they depend on it)."""
    c = inst.spec.constraints
    k = stage_shortfall(inst)
    out: list[tuple[int, int, bool, bool]] = []
    for ae in (False, True):
        for al in (False, True):
            if c.account_for_embedding is not None and ae != c.account_for_embedding:
                continue
            if c.account_for_loss is not None and al != c.account_for_loss:
                continue
            if ae or al:
                if k >= 1 and c.first_stage_layers is None and c.last_stage_layers is None:
                    out.append((int(ae), int(al), ae, al, False))
                continue
            out += [(sf, sl, False, False, False) for sf in range(k + 1) for sl in range(k + 1)]
    if not (c.account_for_embedding or c.account_for_loss) and c.first_stage_layers is None \
            and c.last_stage_layers is None:
        # the same shortfalls in the first / last virtual stage alone, written as a layout
        # string (the account flags are the shortfalls of one; a pinned first / last count is
        # Megatron's flag, which a string replaces)
        out += [(sf, sl, False, False, True) for sf in range(k + 1) for sl in range(k + 1)
                if max(sf, sl) >= 2]
    return out


def layout_knobs(layers: int, pp: int, first: int = 0, last: int = 0,
                 account_for_embedding: bool = False, account_for_loss: bool = False
                 ) -> tuple[Any, Any]:
    """The shortfalls ``(first_short, last_short)`` of a plan's layout in Megatron-LM's terms.

    ``first`` / ``last`` are ``--decoder-first/last-pipeline-num-layers`` (0: not given, the
    stage takes a middle stage's share); the middle stages split the rest evenly, so a middle
    holds ``m = (layers - first - last) / (pp - 2)`` (with only one of them given, the other
    stage is a middle one: ``m = (layers - first) / (pp - 1)``). With ``pp = 2`` there is no
    middle stage and ``m`` is the larger of the two. The account flags make the shortfall 1.
    ``m`` may come out fractional (a layout that does not split): the rules report it."""
    from fractions import Fraction
    if account_for_embedding or account_for_loss:
        return int(account_for_embedding), int(account_for_loss)
    if not first and not last:
        return 0, 0
    given = [n for n in (first, last) if n]
    middles = pp - len(given)
    if middles > 0:
        m = Fraction(layers - sum(given), middles)
    elif len(given) == 2:
        m = Fraction(max(first, last))
    else:                                  # pp = 1 with a first / last count: not a layout
        m = Fraction(layers)
    m = int(m) if m.denominator == 1 else m
    sf = m - first if first else 0
    sl = m - last if last else 0
    return sf, sl
@dataclass(frozen=True)
class Degrees:
    """Degrees split into intra- and inter-node factors, micro-batch ``b``, virtual stages ``v``
    and global batch ``B``: what the evaluator reads. Any field may be a number, a numpy array or
    a symbol; build it with :meth:`Grid.degrees`, never by hand."""

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
    r: Any = 1         # replicas of the data-parallel shard group (HSDP), all across nodes

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


@dataclass(frozen=True)
class Grid:
    """The process grid of a plan: every degree, its intra-node factor, the micro-batch and the
    global batch, on ``gpus`` GPUs with ``node_size`` GPUs per node. Fields may be numbers,
    numpy arrays or symbols, so the same derivation serves every reader."""

    tp: Any
    tp_intra: Any
    cp: Any
    cp_intra: Any
    pp: Any
    pp_intra: Any
    dp: Any
    dp_intra: Any
    vp: Any
    micro_batch: Any
    global_batch: Any
    ep: Any
    ep_intra: Any
    gpus: Any
    node_size: Any
    dp_replicate: Any = 1

    @staticmethod
    def from_base(x, gpus, node_size) -> Grid:
        """The grid of an assignment ``x`` of the base variables (:data:`BASE_NAMES`): the data
        degree fills the GPUs the model-parallel degrees leave, inside a node and overall."""
        T, Ti, C, Ci, P, Pi = (x[n] for n in ("T", "T_in", "C", "C_in", "P", "P_in"))
        return Grid(tp=T, tp_intra=Ti, cp=C, cp_intra=Ci, pp=P, pp_intra=Pi,
                    dp=gpus / (T * C * P), dp_intra=node_size / (Ti * Ci * Pi), vp=x["V"],
                    micro_batch=x["b"], global_batch=x["B"], ep=x["E"], ep_intra=x["E_in"],
                    gpus=gpus, node_size=node_size, dp_replicate=x.get("R", 1))

    def inter(self, dim: str):
        """Inter-node factor of a degree (``tp_inter = tp / tp_intra``)."""
        return getattr(self, dim) / getattr(self, f"{dim}_intra")

    @property
    def micro_batches(self):
        """Micro-batches per step per pipeline: ``global_batch / (dp * micro_batch)``."""
        return self.global_batch / (self.dp * self.micro_batch)

    @property
    def dp_shard(self):
        """The HSDP shard group along dp: ``dp / dp_replicate`` (all of dp without HSDP)."""
        return self.dp / self.dp_replicate

    @property
    def expert_dp(self):
        """Expert data-parallel degree: the MoE layers' grid is ``ep x expert_dp`` per stage
        (expert tensor parallelism 1, Megatron-Core's MoE parallel folding)."""
        return self.gpus / (self.pp * self.ep)

    @property
    def expert_dp_intra(self):
        """Its factor inside a node: the GPUs a stage has in a node, over ``ep_intra``."""
        return self.node_size / (self.ep_intra * self.pp_intra)

    def degrees(self) -> Degrees:
        """The evaluator's degrees: each split into its intra- and inter-node factor."""
        ed_in = self.expert_dp_intra
        return Degrees(t_in=self.tp_intra, t_out=self.inter("tp"), c_in=self.cp_intra,
                       c_out=self.inter("cp"), p_in=self.pp_intra, p_out=self.inter("pp"),
                       d_in=self.dp_intra, d_out=self.inter("dp"), b=self.micro_batch,
                       v=self.vp, B=self.global_batch, e_in=self.ep_intra,
                       e_out=self.inter("ep"), ed_in=ed_in, ed_out=self.expert_dp / ed_in,
                       r=self.dp_replicate)


def _whole(x: Any) -> Any:
    """An integral number as an int (a derived degree such as ``dp = N / (T C P)``)."""
    return int(x) if float(x).is_integer() else x


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
    #: GPUs of one NVLink segment, the "node" of the placement (0: gpus / nodes, a host that is
    #: one NVLink domain)
    nvlink_domain: int = 0
    overlap_grad_reduce: bool = False
    overlap_param_gather: bool = False
    tp_comm_overlap: bool = False
    overlap_p2p_comm: bool = False
    overlap_moe_expert_parallel_comm: bool = False
    #: Pipeline layout, Megatron-LM's names: decoder layers of the first / last pipeline stage
    #: (0: not given, an even share), and the embedding / loss counted as one layer each
    first_stage_layers: int = 0
    last_stage_layers: int = 0
    account_for_embedding: bool = False
    account_for_loss: bool = False
    #: Megatron-Core's layout string (``--pipeline-model-parallel-layout``), exclusive with
    #: the four above; "" none (:mod:`planner.model.pipeline_layout`)
    pipeline_layout: str = ""
    #: with recompute = "full": decoder layers of each virtual stage recomputed (Megatron-LM
    #: --recompute-method block --recompute-num-layers); 0: all (Megatron's uniform method)
    recompute_layers: int = 0
    #: the model's decoder layers (to derive the layout; not a knob, not in the JSON plan)
    layers: int = 0
    #: data-parallel sharding (see :class:`Knobs`; empty: from distributed_optimizer), HSDP
    #: replicas of the shard group (dp_shard_size = dp / dp_replicate) and FSDP2's reshard policy
    dp_sharding: str = ""
    dp_replicate: int = 1
    reshard_after_forward: bool | None = None
    #: host offload: optimizer states in host memory; decoder layers whose activations go
    #: to host memory (see :class:`Knobs`)
    optimizer_offload: bool = False
    offload_layers: int = 0

    def __post_init__(self):
        reshard = self.reshard_after_forward
        if reshard is None:                # the default policy: reshard without pipelining
            reshard = self.pp == 1
        k = Knobs(distributed_optimizer=self.distributed_optimizer, dp_sharding=self.dp_sharding,
                  reshard_after_forward=reshard)
        object.__setattr__(self, "dp_sharding", k.dp_sharding)
        object.__setattr__(self, "distributed_optimizer", k.distributed_optimizer)
        object.__setattr__(self, "reshard_after_forward", k.reshard_after_forward)
        # a framework default of on (NeMo) means nothing without a parameter all-gather
        # (Megatron-LM: --overlap-param-gather needs the distributed optimizer)
        object.__setattr__(self, "overlap_param_gather",
                           self.overlap_param_gather and k.dp_sharding != "none")
        # likewise the expert all-to-all overlap where Megatron-Core cannot run it (a pin or a
        # framework default over a search space that holds such plans)
        object.__setattr__(self, "overlap_moe_expert_parallel_comm",
                           self.overlap_moe_expert_parallel_comm
                           and moe_overlap_refusal(self.ep, self.pp, self.vp,
                                                   self.recompute) is None)
        # switches a framework turns off at these degrees, and which the model costs at
        # nothing there (no tensor-parallel collective at tp = 1, no interleaving at vp = 1):
        # Megatron-LM's validate_args disables sequence parallelism at tp = 1 ("Disabling
        # sequence parallelism because tensor model parallelism is disabled"), so its
        # --tp-comm-overlap would fail its assertion that SP is on, and sets overlap_p2p_comm
        # off for the non-interleaved schedule. The plan says what runs.
        if self.tp == 1:
            object.__setattr__(self, "sequence_parallel", False)
            object.__setattr__(self, "tp_comm_overlap", False)
        if self.vp == 1:
            object.__setattr__(self, "overlap_p2p_comm", False)

    @staticmethod
    def from_base(x, knobs: Knobs, gpus: int, nodes: int, node_size: int,
                  layers: int = 0, reshard_default: tuple[bool, bool] = (True, False),
                  mtp_layers: int = 0) -> Plan:
        """Decode an assignment of the base variables (a solver's answer) into a plan on
        ``nodes`` hosts whose NVLink segments hold ``node_size`` GPUs."""
        g = Grid.from_base(x, gpus, node_size)
        grid = {f.name: _whole(getattr(g, f.name)) for f in fields(Grid)
                if f.name not in ("node_size",)}
        if knobs.dp_sharding == "none":      # nothing is sharded: no shard group to replicate
            grid["dp_replicate"] = 1
        reshard = knobs.reshard_after_forward
        if reshard is None:          # the framework's policy: (without pipelining, with it)
            reshard = reshard_default[grid["pp"] > 1]
        first = last = 0
        text = ""
        if knobs.layout_string:            # the layout string of the search's shortfalls
            text = layout_text(layers, mtp_layers, grid["pp"], grid["vp"],
                               int(knobs.first_short), int(knobs.last_short))
        elif knobs.explicit_layout:        # Megatron's counts from the search's shortfalls
            m = (layers + knobs.padded_layers) // grid["pp"]
            first = m - knobs.first_short if knobs.first_short else 0
            last = m - knobs.last_short if knobs.last_short else 0
        return Plan(nodes=nodes, recompute=knobs.recompute,
                    sequence_parallel=knobs.sequence_parallel,
                    distributed_optimizer=knobs.distributed_optimizer, nvlink_domain=node_size,
                    first_stage_layers=first, last_stage_layers=last,
                    account_for_embedding=knobs.account_for_embedding,
                    account_for_loss=knobs.account_for_loss, layers=layers,
                    pipeline_layout=text,
                    recompute_layers=knobs.recompute_layers or int(
                        knobs.recompute_share * (layers + knobs.padded_layers)
                        / (grid["pp"] * grid["vp"])), dp_sharding=knobs.dp_sharding,
                    reshard_after_forward=reshard,
                    optimizer_offload=knobs.optimizer_offload,
                    offload_layers=knobs.offload_layers,
                    **{o: getattr(knobs, o) for o in OVERLAP_KNOBS}, **grid)

    @property
    def knobs(self) -> Knobs:
        sf, sl = 0, 0
        if self.pipeline_layout:
            sf, sl = shortfalls(self.pipeline_layout)
        elif self.first_stage_layers or self.last_stage_layers or self.account_for_embedding \
                or self.account_for_loss:
            if not self.layers:
                raise ValueError("a plan with a pipeline layout needs its model's layers")
            sf, sl = layout_knobs(self.layers, self.pp, self.first_stage_layers,
                                  self.last_stage_layers, self.account_for_embedding,
                                  self.account_for_loss)
        return Knobs(self.recompute, self.sequence_parallel, self.distributed_optimizer,
                     dp_sharding=self.dp_sharding,
                     reshard_after_forward=self.reshard_after_forward,
                     first_short=sf, last_short=sl,
                     account_for_embedding=self.account_for_embedding,
                     account_for_loss=self.account_for_loss,
                     layout_string=bool(self.pipeline_layout),
                     **{o: getattr(self, o) for o in OVERLAP_KNOBS},
                     recompute_layers=self.recompute_layers,
                     optimizer_offload=self.optimizer_offload,
                     offload_layers=self.offload_layers)

    @property
    def stage_layers(self) -> list[int] | None:
        """Decoder layers of each pipeline rank (None without the model's layer count)."""
        if not self.layers:
            return None
        k = self.knobs
        m = (self.layers + k.padded_layers) / self.pp
        if self.pp == 1:
            return [self.layers]
        out = [m - k.first_short] + [m] * (self.pp - 2) + [m - k.last_short]
        return [_whole(n) for n in out]

    @property
    def dp_shard_size(self) -> int:
        """The HSDP shard group size: dp / dp_replicate (dp without HSDP)."""
        return _whole(self.dp / self.dp_replicate)

    @property
    def node_size(self) -> int:
        """GPUs per node of the placement: the plan's NVLink segment."""
        return self.nvlink_domain or self.gpus // self.nodes

    @property
    def grid(self) -> Grid:
        return Grid(**{f.name: getattr(self, f.name) for f in fields(Grid)
                       if f.name != "node_size"}, node_size=self.node_size)

    @property
    def expert_dp(self) -> float:
        return self.grid.expert_dp

    @property
    def micro_batches(self) -> float:
        """Micro-batches per step per pipeline: global_batch / (dp * micro_batch)."""
        return _whole(self.grid.micro_batches)

    def inter(self, dim: str) -> float:
        """Inter-node factor of a degree (tp_inter = tp / tp_intra)."""
        return self.grid.inter(dim)

    def label(self) -> str:
        """Short human label, e.g. ``TP8 PP8 DP16 mb1`` (:func:`plan_label`)."""
        return plan_label(vars(self))

    def to_spec(self) -> dict[str, Any]:
        """The plan as a ``[plan]`` table that ``plan evaluate`` reads back to this plan: every
        ``[plan]`` key the plan sets, the layout and recompute counts only where given (0 is
        the even split and every layer, which ``[plan]`` says by leaving the key out), the
        sharding by ``dp_sharding`` alone (``distributed_optimizer`` is its older name)."""
        spec = {k: getattr(self, k) for k in PlanSpec.model_fields if hasattr(self, k)}
        spec["dp_shard_size"] = self.dp_shard_size
        spec["micro_batches"] = self.micro_batches
        spec.pop("distributed_optimizer", None)
        for k in ("first_stage_layers", "last_stage_layers", "recompute_layers",
                  "pipeline_layout"):
            if not spec[k]:
                del spec[k]
        return spec

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["micro_batches"] = self.micro_batches
        for dim in ORDER + ("ep",):
            d[f"{dim}_inter"] = self.inter(dim)
        d["expert_dp"] = self.expert_dp
        d["nvlink_domain"] = self.node_size
        d.pop("layers")
        d["stage_layers"] = self.stage_layers
        d["dp_shard_size"] = self.dp_shard_size
        return d


def default_placement(degrees: dict[str, int], node_size: int,
                      order: tuple[str, ...] = ORDER) -> dict[str, int]:
    """Intra-node factors a launcher filling nodes in ``order`` (innermost first) produces: a
    degree gets a factor of the node only once every inner degree fits entirely inside it."""
    rem, full, out = node_size, True, {}
    for dim in order:
        f = math.gcd(degrees[dim], rem) if full else 1
        rem //= f
        full = full and f == degrees[dim]
        out[dim] = f
    return out


def plan_from_spec(inst: Instance, spec: PlanSpec, **overrides: Any) -> Plan:
    """Build a :class:`Plan` from ``[plan]`` plus command-line overrides (``tp=8``)."""
    f = spec.model_dump()
    f.update({k: v for k, v in overrides.items() if v is not None})
    tp, pp, cp = f["tp"], f["pp"], f["cp"]
    if f.get("pipeline_layout"):
        f["vp"] = _layout_vp(inst, spec, f, overrides)
    gpus = inst.gpus
    dp = f["dp"] or max(1, gpus // (tp * pp * cp))
    tb = inst.spec.training.global_batch
    gb = f["global_batch"] or (tb if isinstance(tb, int) else tb[1])
    placed = default_placement({"tp": tp, "cp": cp, "dp": dp, "pp": pp}, inst.node_size)
    intra = {d: f.get(f"{d}_intra") or placed[d] for d in ORDER}
    mode = _sharding(inst, f)
    refused = overlap_refusal(inst.spec.constraints.framework,
                             Knobs(**{o: _knob(inst, f, o, mode) for o in OVERLAP_KNOBS}),
                             "plan.")
    if refused:
        raise InputError(refused)
    ep = f.get("ep") or 1
    # experts fill the innermost ranks of a stage: as much of ep as the stage's share of a node
    ep_intra = f.get("ep_intra") or math.gcd(ep, max(1, inst.node_size // intra["pp"]))
    if f.get("tp_comm_overlap") and tp > 1 and not _knob(inst, f, "sequence_parallel"):
        # Megatron-LM's validate_args: the userbuffer overlap runs on sequence-parallel
        # collectives only; the model costs it so (terms.py), so the switch would be echoed on
        # and costed off
        raise InputError("plan.tp_comm_overlap = true needs sequence parallelism at tp = "
                         f"{tp} (Megatron-LM: tensor-parallel communication overlap runs only "
                         "with sequence parallelism); set sequence_parallel = true or "
                         "tp_comm_overlap = false")
    if f.get("overlap_moe_expert_parallel_comm"):
        # Megatron-Core's TransformerConfig asserts these for the combined 1F1B schedule
        why = moe_overlap_refusal(ep, pp, f.get("vp") or 1, f["recompute"])
        if why:
            raise InputError(f"plan.overlap_moe_expert_parallel_comm = true {why}; set "
                             "overlap_moe_expert_parallel_comm = false")
    if f.get("reshard_after_forward") and mode != "optim_grads_params":
        # (only FSDP's full sharding gathers parameters for the forward; elsewhere the switch
        # would be echoed false and costed so, a silent drop)
        raise InputError(f"plan.reshard_after_forward = true: dp_sharding = \"{mode}\" keeps "
                         "whole parameters on every rank, nothing to reshard; it applies to "
                         "dp_sharding = \"optim_grads_params\" (FSDP) only")
    if mode == "none" and f.get("dp_shard_size") not in (None, dp):
        # (the search refuses the same pair in [constraints]; here it was dropped silently)
        raise InputError(f"plan.dp_shard_size = {f['dp_shard_size']}: dp_sharding = \"none\" "
                         f"shards nothing (plain data parallelism over dp = {dp}); leave "
                         "dp_shard_size out or choose a sharded dp_sharding")
    if mode == "none" and f.get("overlap_param_gather"):
        # Megatron-LM's validate_args asserts the distributed optimizer for it: plain data
        # parallelism has no parameter all-gather to overlap
        raise InputError("plan.overlap_param_gather = true needs a sharded data-parallel mode "
                         "(Megatron-LM: --overlap-param-gather needs the distributed "
                         "optimizer), but dp_sharding = \"none\"; set overlap_param_gather = "
                         "false or choose a sharded dp_sharding")
    refused = sharding_refusal(inst.spec.training, inst.spec.constraints.framework, mode)
    if refused:
        raise InputError(f"plan.dp_sharding = \"{mode}\": {refused}")
    shard = f.get("dp_shard_size") or inst.spec.constraints.dp_shard_size or dp
    reshard = f.get("reshard_after_forward")
    if reshard is None:
        reshard = inst.spec.constraints.reshard_after_forward
    if reshard is None:
        reshard = reshard_default(inst, pp)
    return Plan(tp=tp, pp=pp, dp=dp, cp=cp, vp=f["vp"], micro_batch=f["micro_batch"],
                ep=ep, ep_intra=ep_intra, global_batch=gb, gpus=gpus, nodes=inst.nodes,
                recompute=f["recompute"], sequence_parallel=_knob(inst, f, "sequence_parallel"),
                distributed_optimizer=mode != "none", dp_sharding=mode,
                dp_replicate=_whole(dp / shard) if mode != "none" else 1,
                reshard_after_forward=reshard,
                nvlink_domain=inst.node_size, **{f"{d}_intra": intra[d] for d in ORDER},
                first_stage_layers=f["first_stage_layers"] or 0,
                last_stage_layers=f["last_stage_layers"] or 0,
                account_for_embedding=f["account_for_embedding"],
                account_for_loss=f["account_for_loss"], layers=inst.model.layers,
                pipeline_layout=f.get("pipeline_layout") or "",
                **{o: _knob(inst, f, o, mode) for o in OVERLAP_KNOBS},
                recompute_layers=f["recompute_layers"] or 0,
                optimizer_offload=_offload_knob(inst, f, "optimizer_offload", False),
                offload_layers=_offload_knob(inst, f, "offload_layers", 0))


def _layout_vp(inst: Instance, spec: PlanSpec, f: dict[str, Any],
               overrides: dict[str, Any]) -> int:
    """The virtual pipeline degree of a ``[plan] pipeline_layout``: its stages over ``pp``
    (Megatron-LM derives it so), which a ``vp`` given beside it (in ``[plan]`` or ``--vp``)
    must equal. A string that breaks a rule of :func:`~planner.model.pipeline_layout.
    check_layout` is an input error naming each."""
    text, pp = f["pipeline_layout"], f["pp"]
    bad = check_layout(text, pp, inst.model.layers, inst.model.mtp_layers)
    if bad:
        raise InputError("plan.pipeline_layout: not a layout the model costs", bad)
    vp = len(layout_stages(text)) // pp
    flag = overrides.get("vp") is not None
    given = overrides["vp"] if flag else (spec.vp if "vp" in spec.model_fields_set else None)
    if given is not None and given != vp:
        raise InputError(f"{'--vp' if flag else 'plan.vp ='} {given}, but plan.pipeline_layout has "
                         f"{len(layout_stages(text))} stages over pp = {pp}: vp = {vp} "
                         "(leave vp out: the layout gives it)")
    return vp


def _offload_knob(inst: Instance, fields: dict[str, Any], name: str, off: Any) -> Any:
    """A host-offload knob of ``plan evaluate``: the plan's (or a flag's) value, else the
    ``[constraints]`` pin, else off (offload only costs time; the search decides it)."""
    if fields.get(name) is not None:
        return fields[name]
    pin = getattr(inst.spec.constraints, name)
    return off if pin is None else pin


def offload_choices(inst: Instance) -> tuple[tuple[bool, ...], tuple[int, ...]]:
    """The host-offload values the search considers: optimizer offload off / on, and the
    offloaded layer counts ``0, L/2, L - 1`` (rounded down; Megatron-Core needs ``N < L``)
    within ``constraints.max_offload_layers`` (the cap itself joins the set; without a cap
    activation offload is not searched), or the ``[constraints]`` pins. Off where the host
    figures are missing (no host link or memory) or the framework has no such offload
    (:data:`planner.model.frameworks.FRAMEWORKS`)."""
    c = inst.spec.constraints
    fw = framework_of(c.framework)
    host = inst.hw.host_bw > 0 and inst.hw.host_mem_bytes > 0
    refused = optimizer_offload_refusal(inst.spec.training, c.framework)
    opt: tuple[bool, ...] = (False, True) if host and fw.optimizer_offload_modes \
        and refused is None else (False,)
    if c.optimizer_offload is not None:
        if c.optimizer_offload and refused:
            raise InfeasibleError("the constraints leave no plan",
                                  [f"constraints.{refused}"])
        opt = (c.optimizer_offload,)
    L = inst.model.layers
    if c.offload_layers is not None:
        layers: tuple[int, ...] = (c.offload_layers,)
    elif not (host and fw.activation_offload) or not c.max_offload_layers:
        # searched where the instance asks for it (a cap): it doubles the CP-SAT time of the
        # quick-start instance (docs/encoding.md, "Host offload")
        layers = (0,)
    else:
        cap = min(c.max_offload_layers, L - 1)
        grid = {0, L // 2, L - 1, cap}
        layers = tuple(sorted(n for n in grid if 0 <= n <= cap))
    return opt, layers


#: The shares of a virtual stage's layers the search may recompute (with recompute = "full";
#: docs/encoding.md, "Partial recompute"): a share is one categorical value whose time and
#: memory are the no-recompute and full-recompute tables mixed by a constant, so it adds no
#: form to the encoding; the plan's recompute_layers is that share of its virtual stage
RECOMPUTE_SHARES = (Fraction(1, 4), Fraction(1, 2), Fraction(3, 4))


def recompute_share_choices(inst: Instance, chunks) -> tuple[Any, ...]:
    """The partial-recompute values the search considers, as shares of a virtual stage's
    layers (0: every layer under full recompute, or none / selective), and
    :data:`RECOMPUTE_SHARES` unless ``[constraints] max_recompute_layers = 0``; with the pin
    ``recompute_layers = N > 0`` only the shares ``N / c`` of the virtual-stage sizes ``chunks``
    above ``N``. Which pipeline degrees and virtual-stage counts a share holds at
    (a whole count within the cap, below the stage's layers) is decided per pair
    (formulations/space.py). Searched by default (no cap: any whole count below the stage's
    layers); only 0 where full recompute is not allowed, the framework has no count per stage
    (torchtitan) or the cap is 0. Since each share is a model of its own (formulations/solve.py,
    parts) it costs the shipped instances 0.3-0.7 s of CP-SAT (docs/encoding.md)."""
    c = inst.spec.constraints
    if c.recompute_layers is not None:
        n = c.recompute_layers
        return (0,) if not n else tuple(sorted({Fraction(n, k) for k in chunks if k > n}))
    if ("full" not in c.recompute_modes or not framework_of(c.framework).partial_recompute
            or c.max_recompute_layers == 0):
        return (0,)
    return (0,) + RECOMPUTE_SHARES


def reshard_default(inst: Instance, pp) -> bool:
    """FSDP2's ``reshard_after_forward`` as the framework sets it: torchtitan's "default"
    policy, true without pipeline parallelism and false with it (the gathered parameters are
    kept across the micro-batches of the schedule)."""
    from planner.model.frameworks import framework_of
    without_pp, with_pp = framework_of(inst.spec.constraints.framework).reshard_after_forward
    return with_pp if pp > 1 else without_pp


def _sharding(inst: Instance, fields: dict[str, Any]) -> str:
    """The plan's sharding mode: ``dp_sharding``, else ``distributed_optimizer`` (on: optim),
    else the ``[constraints]`` pin when it allows one mode, else the evaluate default, the
    distributed optimizer where the framework runs it: torchtitan has none, and its data
    parallelism is FSDP2 by default (``parallelism.data_parallel_shard_degree = -1``, every
    data-parallel rank in the shard group), so a plan under it that names no mode is that."""
    from planner.model.frameworks import framework_of

    if fields.get("dp_sharding"):
        return fields["dp_sharding"]
    if fields.get("distributed_optimizer") is not None:
        return "optim" if fields["distributed_optimizer"] else "none"
    modes = inst.spec.constraints.sharding_modes
    if len(modes) == 1:
        return modes[0]
    default = "optim" if KNOB_DEFAULTS["distributed_optimizer"] else "none"
    runs = framework_of(inst.spec.constraints.framework).sharding_modes
    if default not in runs:
        sharded = [m for m in runs if m != "none"]
        return sharded[-1] if sharded else "none"
    return default


def _knob(inst: Instance, fields: dict[str, Any], name: str, mode: str | None = None) -> bool:
    """A memory or overlap knob: the plan's (or a flag's) value, else the ``[constraints]`` pin,
    else the default ``plan solve`` uses too (:data:`planner.model.schema.KNOB_DEFAULTS`; for
    an overlap knob, the ``[constraints] framework``'s default for the plan's sharding
    ``mode``, :func:`overlap_default`)."""
    if fields.get(name) is not None:
        return fields[name]
    pin = getattr(inst.spec.constraints, name)
    if pin is not None:
        return pin
    return overlap_default(inst, name, mode) if name in OVERLAP_KNOBS else KNOB_DEFAULTS[name]


def moe_overlap_refusal(ep: int, pp: int, vp: int, recompute: str) -> str | None:
    """Why ``overlap_moe_expert_parallel_comm`` cannot run on this plan, or None: Megatron-Core
    (``TransformerConfig.__post_init__``) asserts expert parallelism, an interleaved schedule
    when pipelined ("virtual_pipeline_model_parallel_size must be specified when
    pipeline_model_parallel_size > 1") and no full recompute."""
    if ep <= 1:
        return "needs expert parallelism (ep > 1): there is no all-to-all to overlap"
    if pp > 1 and vp <= 1:
        return (f"needs the interleaved schedule at pp = {pp} (vp > 1; Megatron-Core: "
                "\"virtual_pipeline_model_parallel_size must be specified\")")
    if recompute == "full":
        return "cannot run with recompute = \"full\" (Megatron-Core asserts it)"
    return None


def overlap_default(inst: Instance, name: str, mode: str | None = None) -> bool:
    """An overlap knob's value when neither ``[plan]`` nor a ``[constraints]`` pin gives it:
    the default of ``[constraints] framework`` (Megatron-LM's without one) for a plan of the
    data-parallel sharding ``mode`` (DeepSpeed's depends on it)."""
    return framework_of(inst.spec.constraints.framework).overlap_default(name, mode)


def layout_violations(inst: Instance, plan: Plan) -> list[str]:
    """The pipeline-layout rules a plan breaks (``[plan] first_stage_layers`` ... an input
    error of ``plan evaluate``): the exclusive ways of setting the layout, then the layout rules
    of the rule table (those that read the knobs)."""
    if plan.pipeline_layout and (plan.account_for_embedding or plan.account_for_loss
                                 or plan.first_stage_layers or plan.last_stage_layers):
        return ["plan.pipeline_layout cannot be combined with first_stage_layers / "
                "last_stage_layers / account_for_embedding / account_for_loss (Megatron-LM: "
                "the layout string sets the whole split)"]
    if (plan.account_for_embedding or plan.account_for_loss) and (
            plan.first_stage_layers or plan.last_stage_layers):
        return [f"plan.first_stage_layers={plan.first_stage_layers} / last_stage_layers="
                f"{plan.last_stage_layers} cannot be combined with account_for_embedding / "
                "account_for_loss (Megatron-LM: the two ways of setting an uneven layout are "
                "exclusive)"]
    first, last = plan.first_stage_layers, plan.last_stage_layers
    if first and last and plan.pp == 2 and first + last != plan.layers:
        # no middle stage takes the rest: the two counts are the whole split (the shortfalls
        # cannot say so, they only measure each end against the larger one)
        return [f"plan.first_stage_layers={first} + last_stage_layers={last} = {first + last}, "
                f"but with pp = 2 there is no middle stage: the two must hold all "
                f"{plan.layers} layers (Megatron-LM splits the rest over the pp - 2 middle "
                "stages)"]
    if not plan.knobs.uneven and not plan.recompute_layers:
        return []
    return [v for v in violations(inst, plan.grid, plan.knobs, what_ifs=False, layout_only=True)]


def structural_violations(inst: Instance, plan: Plan, spec: PlanSpec | None = None) -> list[str]:
    """Every structural rule the plan breaks, as sentences naming the numbers (the rules of
    :mod:`planner.model.rules`), plus a ``[plan] micro_batches`` that disagrees with the plan."""
    bad = layout_violations(inst, plan)
    if bad and not plan.knobs.uneven:          # the exclusive settings: no layout to judge
        return bad
    from planner.model.frameworks import framework_violations
    out = violations(inst, plan.grid, plan.knobs)
    out += framework_violations(inst.spec.constraints.framework, plan)
    from planner.model.frameworks import offload_violations
    out += offload_violations(inst.spec.constraints.framework, plan, inst.spec.training)
    if spec is not None and spec.micro_batches and spec.micro_batches != plan.micro_batches:
        out.append(f"plan.micro_batches={spec.micro_batches} but global_batch/(dp*micro_batch)"
                   f" = {plan.micro_batches}")
    return out + degree_pin_violations(inst, plan)


def degree_pin_violations(inst: Instance, plan: Plan) -> list[str]:
    """The ``[constraints]`` degree pins and caps the instance sets (``tp = 4``, ``max_tp =
    4``, ...) that a fixed plan breaks, as ``*_within_node`` judges one: a what-if written in
    the file holds for the plan evaluated under it. Only keys the instance writes: a default
    cap (``max_cp = 1``, ``max_micro_batch = 32``) steers the search, not a given plan."""
    c = inst.spec.constraints
    written = c.model_fields_set
    out = []
    for knob, cap in PIN_CAPS.items():
        value = getattr(plan, knob)
        pin = getattr(c, knob) if knob in written else None
        if pin is not None and value != pin:
            out.append(f"constraints.{knob} = {pin} but the plan has {knob} = {value}")
        limit = getattr(c, cap) if cap in written else None
        if limit is not None and value > limit:
            out.append(f"constraints.{cap} = {limit} but the plan has {knob} = {value}")
    if "min_micro_batch" in written and plan.micro_batch < c.min_micro_batch:
        out.append(f"constraints.min_micro_batch = {c.min_micro_batch} but the plan has "
                   f"micro_batch = {plan.micro_batch}")
    return out

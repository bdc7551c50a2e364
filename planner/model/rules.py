"""The structural rules of a plan, written once as data.

Each :class:`Rule` states a fact every runnable plan has (``tp`` divides the attention heads, the
global batch is a whole number of micro-batches, each node holds a box of the process grid, ...)
as *quantities* that must be positive integers (``kind = "integer"``) or exactly 1
(``kind = "one"``). A quantity is a product of powers of the plan's degrees and the instance's
sizes, written as plain arithmetic on a :class:`~planner.model.plan.Grid`, so the same
expression is read two ways:

* on a plan's numbers it decides whether the plan keeps the rule, and :meth:`Rule.message`
  says why not in the user's terms (``plan evaluate``, ``plan validate``, the launch exports);
* on the symbols of the search's base variables (:meth:`Grid.from_base
  <planner.model.plan.Grid.from_base>` run on :class:`~planner.model.algebra.Sig`) it is one
  monomial ``c * prod x_i^e_i``; "a positive integer" is then, per prime ``q`` of the instance,
  ``v_q(c) + sum_i e_i v_q(x_i) >= 0`` (``== 0`` for "exactly 1"): the rows of the MIPs and the
  filter of the enumerator (``formulations/space.py``). A rule whose quantity is a constant
  there (the search derives ``dp`` so that ``tp*pp*dp*cp = N`` always holds) needs no row.

Two rules are not products: ``kind = "implies"`` (interleaving needs a pipeline: ``vp > 1``
implies ``pp > 1``) and ``kind = "needs_knob"`` (MoE layers with ``tp > 1`` need sequence
parallelism): both name the degrees they relate, which the search reads as its own rows.

A rule may apply only to some instances (``applies``: MoE models, ``*_within_node``
constraints), only to interleaved plans (``interleaved``), or only once other rules hold
(``requires``: a fractional micro-batch count is not also reported as "not divisible by pp").
A product rule with a ``knob`` holds only for plans with that knob on (sequence parallelism
splits the sequence over tp); the search, which keeps the knob on where it may, applies its
rows unless the instance pins the knob off: the plans it would allow with the knob off at
such degrees are left to a search with the knob pinned off.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from planner.model.frameworks import cp_exchange
from planner.model.instance import Instance
from planner.model.pipeline_layout import uneven_split
from planner.model.words import as_written as _g


@dataclass(frozen=True)
class Sizes:
    """The instance sizes the rules mention (``N`` GPUs, ``g`` GPUs per node, ...)."""

    N: int
    g: int
    nodes: int          # the model's nodes: NVLink segments of g GPUs
    layers: int
    heads: int
    kv: int
    seq: int
    experts: int

    @staticmethod
    def of(inst: Instance) -> Sizes:
        m = inst.model
        return Sizes(N=inst.gpus, g=inst.node_size, nodes=inst.segments, layers=m.layers,
                     heads=m.heads, kv=m.kv, seq=m.seq_len, experts=max(m.experts, 1))


Quantities = Callable[[Any, Sizes], tuple]


@dataclass(frozen=True)
class Rule:
    """One structural rule; see the module docstring for the kinds."""

    name: str
    kind: str                                   # integer | one | implies | needs_knob
    quantities: Quantities                      # (grid, sizes) -> the quantities
    says: str                                   # the rule in a few words (for domain messages)
    message: Callable[[Any, Sizes], str]        # the broken rule, with the plan's numbers
    applies: Callable[[Instance], bool] = lambda inst: True
    interleaved: bool = False                   # only for plans with vp > 1
    requires: tuple[str, ...] = ()              # checked only when these rules hold
    knob: str | None = None                     # needs_knob: the knob the rule needs;
    #                                             integer: the knob the plans it judges have on
    what_if: bool = False                       # a [constraints] what-if, not a framework rule
    judges: Callable[[Instance], bool] | None = None   # when it judges a fixed plan (default: always)
    #: a layout rule: its quantities and message also read the knobs (``(grid, sizes, knobs)``),
    #: and only ``pp`` and ``vp`` of the grid; the search checks it per layout on numbers
    on_knobs: bool = False

    def quantities_of(self, grid, sizes: Sizes, knobs=None) -> tuple:
        return self.quantities(grid, sizes, knobs) if self.on_knobs else \
            self.quantities(grid, sizes)

    def message_of(self, grid, sizes: Sizes, knobs=None) -> str:
        return self.message(grid, sizes, knobs) if self.on_knobs else self.message(grid, sizes)

    def holds(self, grid, sizes: Sizes, knobs=None) -> bool:
        """Whether a plan's numbers keep the rule."""
        if self.kind == "integer" and self.knob and knobs is not None \
                and not getattr(knobs, self.knob):
            return True                  # (a rule of plans with the knob on)
        q = self.quantities_of(grid, sizes, knobs)
        if self.kind == "integer":
            return all(_positive_integer(x) for x in q)
        if self.kind == "one":
            return all(abs(float(x) - 1.0) <= 1e-9 for x in q)
        if self.kind == "implies":       # q[0] > 1 implies q[1] > 1
            return not (q[0] > 1 and not q[1] > 1)
        if self.kind == "needs_knob":    # q[0] > 1 needs the knob on
            return not (q[0] > 1 and not getattr(knobs, self.knob))
        raise ValueError(f"unknown rule kind {self.kind!r}")


def _positive_integer(x) -> bool:
    x = float(x)
    return x >= 1 - 1e-9 and abs(x - round(x)) <= 1e-9 * max(1.0, abs(x))


def _exchange(inst: Instance) -> str:
    """Context parallelism's exchange (frameworks.cp_exchange)."""
    return cp_exchange(inst.spec.training, inst.spec.constraints.framework)


def _moe(inst: Instance) -> bool:
    return inst.model.moe


def _within(dim: str) -> Rule:
    key = f"{dim}_within_node"
    return Rule(
        key, "one", lambda v, k, dim=dim: (v.inter(dim),), f"{dim} within a node",
        lambda v, k, dim=dim: f"constraints.{key} = true but {dim} = {getattr(v, dim)} "
                              "crosses nodes",
        applies=lambda inst, key=key: getattr(inst.spec.constraints, key),
        # a default (tp inside a node) steers the search; only a rule the instance sets judges
        # a fixed plan
        judges=lambda inst, key=key: key in inst.spec.constraints.model_fields_set,
        what_if=True)


def _intra(dim: str) -> Rule:
    return Rule(
        f"{dim}_intra", "integer", lambda v, k, dim=dim: (v.inter(dim),),
        f"{dim}_intra divides {dim}",
        lambda v, k, dim=dim: f"{dim}_intra={getattr(v, f'{dim}_intra')} must divide "
                              f"{dim}={getattr(v, dim)}")


def _padded(v, k: Sizes, kn) -> Any:
    """Layers the pipeline split counts: the decoder layers plus the layout's shortfalls."""
    return k.layers + (kn.padded_layers if kn is not None else 0)


def _layers_message(v, k: Sizes, kn) -> str:
    if kn is None or not kn.uneven:
        return (f"pp*vp = {v.pp * v.vp} must divide layers={k.layers}"
                + _completed(k.layers, v.pp, v.vp, {}, "or an uneven layout"))
    lp = _padded(v, k, kn)
    if not kn.explicit_layout:
        counted = " and ".join(n for n, on in (("the embedding", kn.account_for_embedding),
                                                 ("the loss", kn.account_for_loss)) if on)
        return (f"with {counted} counted as a layer (account_for_embedding / account_for_loss), "
                f"layers={k.layers} + {_g(kn.padded_layers)} = {_g(lp)} must be divisible by "
                f"pp={v.pp} and "
                f"the per-rank count {_g(lp / v.pp)} by vp={v.vp}")
    m = lp / v.pp
    ends = [(n, m - s) for n, s in (("first", kn.first_short), ("last", kn.last_short)) if s]
    given = " and ".join(f"{n}_stage_layers={_g(c)}" for n, c in ends)
    middles = v.pp - len(ends)
    left = k.layers - sum(c for _, c in ends)
    others = f"the {middles} other pipeline stage{'s' if middles != 1 else ''}"
    if left < 0:
        return (f"{given}: {_g(k.layers - left)} layers on the end stages, more than the "
                f"model's layers={k.layers} (pp={v.pp})")
    if left == 0 and middles > 0:
        return (f"{given} take all of the model's layers={k.layers}, leaving none for {others} "
                f"(pp={v.pp})")
    return (f"the {_g(left)} of the model's layers={k.layers} left after {given} must split "
            f"evenly over the {middles} other pipeline stage{'s' if middles != 1 else ''} "
            f"(pp={v.pp}), each a multiple of vp={v.vp} (got {_g(m)} per stage)"
            + _completed(k.layers, v.pp, v.vp, dict(ends), "a layout that splits"))


def _completed(layers: int, pp: Any, vp: Any, given: dict[str, Any], lead: str) -> str:
    """``lead`` and a layout (:func:`~planner.model.pipeline_layout.uneven_split`) that keeps
    the given first / last stage counts (each alone where the pair has none), in ``[plan]``'s
    keys, to follow a rule a layout breaks; "" where there is none, or the counts are not
    whole numbers (a rule stated over symbols)."""
    if not all(isinstance(x, int) or (isinstance(x, (float, Fraction)) and x == int(x))
               for x in (pp, vp, *given.values())):
        return ""
    fixed = {n: int(c) for n, c in given.items()}
    for keep in [fixed] + ([{n: c} for n, c in fixed.items()] if len(fixed) > 1 else []):
        split = uneven_split(layers, int(pp), int(vp), keep.get("first"), keep.get("last"))
        if split:
            middle = f" + {int(pp) - 2} x {split[1]}" if pp > 2 else ""
            return (f"; {lead}: first_stage_layers = {split[0]}, last_stage_layers = "
                    f"{split[2]} ({split[0]}{middle} + {split[2]})")
    return ""


def _ends(v, k: Sizes, kn) -> tuple:
    """Explicit first / last counts are positive multiples of vp. With the embedding / loss
    counted as a layer the short chunk may build no decoder layer at all, a chunk of the
    embedding (the loss) alone: Megatron-LM's get_num_layers_to_build asserts
    ``num_layers_to_build >= 0`` there (megatron/core/transformer/transformer_block.py, since
    ef490839, Feb 2025), the layout of Llama 3 405B (Dubey et al. 2024, Sec. 3.3.2: "the first
    model chunk on the first stage has only the embedding"), so nothing is left to check once
    the per-rank count splits into vp chunks (the ``layers`` rule)."""
    if kn is None or not kn.explicit_layout:
        return (1,)
    m = _padded(v, k, kn) / v.pp
    return tuple((m - s) / v.vp for s in (kn.first_short, kn.last_short))


def _ends_message(v, k: Sizes, kn) -> str:
    m = _padded(v, k, kn) / v.pp
    return (f"first_stage_layers={_g(m - kn.first_short)} and last_stage_layers="
            f"{_g(m - kn.last_short)} must each be > 0 and divisible by vp={v.vp}")


#: The expert rules are reported once the grid itself is consistent (and ep = 1 on a dense model)
_GRID_OK = ("ep_dense", "gpus", "box", "pp_intra")

#: Every structural rule, in the order a report lists broken ones.
RULES: tuple[Rule, ...] = (
    Rule("gpus", "one", lambda v, k: (v.tp * v.pp * v.dp * v.cp / k.N,),
         "tp*pp*dp*cp = GPUs",
         lambda v, k: f"tp*pp*dp*cp = {v.tp}*{v.pp}*{v.dp}*{v.cp} = "
                      f"{_g(v.tp * v.pp * v.dp * v.cp)}, not the {k.N} GPUs"),
    Rule("dp", "integer", lambda v, k: (v.dp,), "dp = GPUs / (tp*cp*pp) is whole",
         lambda v, k: f"dp = {_g(v.dp)} is not a whole number"),
    Rule("dp_in_node", "integer", lambda v, k: (v.dp_intra,),
         "dp_intra = node / (tp_intra*cp_intra*pp_intra) is whole",
         lambda v, k: f"dp_intra = {_g(v.dp_intra)} is not a whole number"),
    Rule("heads", "integer", lambda v, k: (k.heads / v.tp, k.kv / v.tp),
         "tp divides heads and kv_heads",
         lambda v, k: f"tp={v.tp} must divide heads={k.heads}"
                      + (f" and kv_heads={k.kv}" if k.kv != k.heads else "")),
    Rule("layers", "integer", lambda v, k, kn: (_padded(v, k, kn) / (v.pp * v.vp),),
         "pp*vp divides layers (plus the layout's shortfalls)", _layers_message, on_knobs=True),
    Rule("layout_pp", "integer",
         lambda v, k, kn: (v.pp - 1 if kn is not None and kn.uneven else 1,),
         "an uneven layout needs pp > 1",
         lambda v, k, kn: "an uneven pipeline layout (first_stage_layers / last_stage_layers / "
                          "account_for_embedding / account_for_loss / pipeline_layout) needs "
                          "pp > 1",
         on_knobs=True),
    Rule("layout_ends", "integer", _ends, "explicit first / last counts: positive multiples of vp",
         _ends_message, on_knobs=True, requires=("layers", "layout_pp")),
    # (0, never a positive integer, when the mode is not full: a factor of 1/2 let an even
    # remainder through, recompute = "selective" with 19 of 24 layers)
    Rule("recompute_layers", "integer",
         lambda v, k, kn: ((_padded(v, k, kn) / (v.pp * v.vp) - kn.recompute_layers + 1)
                           * (1 if kn.recompute == "full" else 0),)
         if kn is not None and kn.recompute_layers else (1,),
         "recompute_layers needs full recompute and at most a virtual stage's layers",
         lambda v, k, kn: (f"recompute_layers={kn.recompute_layers} needs recompute = "
                           f"\"full\", not \"{kn.recompute}\"") if kn.recompute != "full" else
                          (f"recompute_layers={kn.recompute_layers} exceeds the "
                           f"{_g(_padded(v, k, kn) / (v.pp * v.vp))} layers of a virtual stage "
                           f"(pp={v.pp}, vp={v.vp})"),
         on_knobs=True, requires=("layers",)),
    Rule("interleave_pp", "implies", lambda v, k: (v.vp, v.pp), "vp > 1 needs pp > 1",
         lambda v, k: "vp > 1 needs pp > 1 (interleaving splits pipeline stages)"),
    # Megatron-LM's validate_args: "seq-length should be a multiple of 2 *
    # context-parallel-size if context-parallel-size > 1" (each rank holds two chunks of the
    # sequence, balancing the causal mask); an odd seq_len leaves cp = 1 only
    Rule("seq", "integer", lambda v, k: ((k.seq / 2 if k.seq % 2 == 0 else 1) / v.cp,),
         "2*cp divides seq_len (cp > 1)",
         lambda v, k: f"cp={v.cp} needs seq_len={k.seq} to be a multiple of 2*cp = {2 * v.cp} "
         "(Megatron-LM: two chunks of the sequence per context-parallel rank)"),
    # Transformer Engine runs sliding-window attention under context parallelism only with
    # the a2a or all_gather exchange (dot_product_attention/context_parallel.py asserts
    # "Context parallelism does not support sliding window attention with cp_comm_type=..."
    # otherwise); under the p2p ring, Megatron-Core's default, cp stays 1
    # ... and an attention sink (softmax_type other than vanilla) only with a2a: "Context
    # parallelism only supports softmax_type=... with cp_comm_type = 'a2a'!"
    Rule("sink_cp", "one", lambda v, k: (v.cp,), "cp = 1 with an attention sink",
         lambda v, k: f"cp={v.cp}: an attention sink (model.softmax_type) runs under context "
                      "parallelism only with Transformer Engine's a2a exchange, not the p2p "
                      "ring or the all_gather; use cp = 1, or training.cp_comm_type = \"a2a\"",
         applies=lambda inst: (inst.model.softmax_type != "vanilla"
                               and _exchange(inst) != "a2a")),
    Rule("window_cp", "one", lambda v, k: (v.cp,), "cp = 1 with sliding-window attention",
         lambda v, k: f"cp={v.cp}: sliding-window attention (model.window_size) runs under "
                      "context parallelism only with Transformer Engine's a2a or all_gather "
                      "exchange, not the p2p ring (training.cp_comm_type = \"p2p\"); use "
                      "cp = 1, or training.cp_comm_type = \"a2a\" or \"all_gather\"",
         applies=lambda inst: inst.model.windowed and _exchange(inst) == "p2p"),
    # Ulysses splits the heads of a tensor rank over the context-parallel ranks: Transformer
    # Engine asserts "cp_comm_type='a2a' requires num_heads % cp_size == 0 for Q, K, V"
    Rule("cp_heads", "integer", lambda v, k: (k.heads / (v.tp * v.cp), k.kv / (v.tp * v.cp)),
         "tp*cp divides heads and kv_heads (cp_comm_type a2a)",
         lambda v, k: f"training.cp_comm_type = \"a2a\" splits the heads of a tensor rank over the "
                      f"context-parallel ranks: tp*cp = {v.tp}*{v.cp} must divide "
                      f"heads={k.heads}" + (f" and kv_heads={k.kv}" if k.kv != k.heads else ""),
         applies=lambda inst: _exchange(inst) == "a2a", requires=("heads",)),
    # Megatron-Core's sequence parallelism scatters the [s/cp, b, h] activations over the tp
    # ranks along the sequence, and tensor_parallel/mappings.py _split_along_first_dim asserts
    # "First dimension of the tensor should be divisible by tensor parallel size"
    Rule("sp_seq", "integer", lambda v, k: (k.seq / (v.cp * v.tp),),
         "tp*cp divides seq_len (sequence parallelism)",
         lambda v, k: f"sequence parallelism splits the {_g(k.seq / v.cp)} tokens of a "
                      f"context-parallel rank over tp = {v.tp}, which must divide them "
                      "(Megatron-Core: the first dimension must be divisible by the tensor "
                      "parallel size); or turn sequence_parallel off",
         knob="sequence_parallel", requires=("seq",)),
    Rule("micro_batch", "integer", lambda v, k: (v.global_batch / v.micro_batch,),
         "micro_batch divides the global batch",
         lambda v, k: f"micro_batch={v.micro_batch} must divide global_batch={v.global_batch}"),
    Rule("batch", "integer", lambda v, k: (v.micro_batches,),
         "dp*micro_batch divides the global batch",
         lambda v, k: f"dp*micro_batch = {_g(v.dp * v.micro_batch)} must divide "
                      f"global_batch={v.global_batch}", requires=("micro_batch",)),
    Rule("interleave_m", "integer", lambda v, k: (v.micro_batches / v.pp,),
         "pp divides the micro-batches when interleaved",
         lambda v, k: f"interleaving needs micro_batches ({_g(v.micro_batches)}) divisible by "
                      f"pp ({v.pp})", interleaved=True, requires=("micro_batch", "batch")),
    *(_intra(dim) for dim in ("tp", "cp", "dp", "pp")),
    Rule("box", "one",
         lambda v, k: (v.tp_intra * v.cp_intra * v.dp_intra * v.pp_intra / k.g,),
         "each node holds a box of the process grid",
         lambda v, k: f"intra-node factors tp*cp*dp*pp = "
                      f"{_g(v.tp_intra * v.cp_intra * v.dp_intra * v.pp_intra)} must equal the "
                      f"{k.g} GPUs of a node (each node holds a box of the process grid); set "
                      "*_intra in [plan]"),
    Rule("ep_dense", "one", lambda v, k: (v.ep,), "ep = 1 for a dense model",
         lambda v, k: f"ep={v.ep} needs a mixture-of-experts model (model.experts > 1)",
         applies=lambda inst: not inst.model.moe),
    Rule("experts", "integer", lambda v, k: (k.experts / v.ep,), "ep divides experts",
         lambda v, k: f"ep={v.ep} must divide experts={k.experts}", applies=_moe),
    # the expert rules hold for every dense plan with ep = 1; they are checked for dense models
    # too (so the search's expert variables get their domains from them), after ep_dense
    Rule("ep_stage", "integer", lambda v, k: (v.expert_dp,),
         "ep divides the GPUs of a pipeline stage",
         lambda v, k: f"ep={v.ep} must divide the {_g(k.N / v.pp)} GPUs of a pipeline stage "
                      "(tp*cp*dp)", requires=_GRID_OK),
    Rule("ep_intra", "integer", lambda v, k: (v.inter("ep"), v.expert_dp_intra),
         "ep_intra divides ep and the GPUs a stage has in a node",
         lambda v, k: f"ep_intra={v.ep_intra} must divide ep={v.ep} and the "
                      f"{_g(k.g / v.pp_intra)} GPUs a stage has in a node",
         requires=_GRID_OK),
    Rule("expert_dp", "integer", lambda v, k: (v.expert_dp / v.expert_dp_intra,),
         "the expert data-parallel group tiles the nodes",
         lambda v, k: f"ep_intra={v.ep_intra}: the expert data-parallel group "
                      f"({_g(v.expert_dp)} ranks, {_g(v.expert_dp_intra)} of them inside a node) "
                      f"does not tile the {k.nodes} node{'s' if k.nodes != 1 else ''}; choose "
                      "ep_intra so ep / ep_intra divides the node count",
         requires=_GRID_OK + ("ep_intra",)),
    Rule("moe_sp", "needs_knob", lambda v, k: (v.tp,), "MoE with tp > 1 needs sequence "
         "parallelism",
         lambda v, k: "MoE layers with tp > 1 need sequence parallelism (Megatron-Core)",
         applies=_moe, knob="sequence_parallel"),
    # HSDP: the shard group spans the data-parallel ranks inside a node and dp_shard_size /
    # dp_intra nodes' worth across them; its dp / dp_shard_size replicas sit across nodes
    # (torchtitan's mesh puts dp_replicate outside dp_shard)
    Rule("dp_shard", "integer", lambda v, k: (v.dp_replicate, v.inter("dp") / v.dp_replicate),
         "dp_shard_size is dp_intra times a divisor of the data-parallel ranks across nodes",
         lambda v, k: f"dp_shard_size = {_g(v.dp_shard)} must be a divisor of dp = {v.dp} and "
                      f"a multiple of dp_intra = {v.dp_intra} (the replicas of the shard group "
                      "sit across nodes)", requires=("dp", "dp_in_node", "dp_intra")),
    # (implied by dp_shard; it bounds the replica count for the search)
    Rule("dp_replicas", "integer", lambda v, k: (k.nodes / v.dp_replicate,),
         "the shard group's replicas divide the nodes",
         lambda v, k: f"dp / dp_shard_size = {_g(v.dp_replicate)} replicas must divide the "
                      f"{k.nodes} nodes", requires=("dp_shard",)),
    *(_within(dim) for dim in ("tp", "pp", "cp")),
)

BY_NAME = {r.name: r for r in RULES}

#: The expert rules a dense model keeps only through ep = 1 (each then restates "dp is
#: whole"): they bound the search's expert variables but are no reason to name to its user.
EXPERT_ONLY = ("ep_stage", "ep_intra", "expert_dp")


def rules_for(inst: Instance) -> list[Rule]:
    """The rules that apply to an instance."""
    return [r for r in RULES if r.applies(inst)]


def violations(inst: Instance, grid, knobs, what_ifs: bool = True,
               layout_only: bool = False) -> list[str]:
    """Every applicable rule a plan's grid (numbers) breaks, as the user reads it
    (``what_ifs=False``: only the rules every framework has, not the ``[constraints]``;
    ``layout_only``: only the pipeline-layout rules, those that read the knobs)."""
    sizes = Sizes.of(inst)
    held: set[str] = set()
    out = []
    for rule in rules_for(inst):
        if rule.what_if and not what_ifs or rule.judges and not rule.judges(inst):
            continue
        if layout_only and not rule.on_knobs:
            continue
        if any(r not in held for r in rule.requires if r in BY_NAME and BY_NAME[r].applies(inst)):
            continue
        if rule.interleaved and not grid.vp > 1:
            held.add(rule.name)
            continue
        if rule.holds(grid, sizes, knobs):
            held.add(rule.name)
        else:
            out.append(rule.message_of(grid, sizes, knobs))
    return out

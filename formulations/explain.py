"""Why an instance has no plan: which limit binds, by how much, and the nearest change that helps.

The solvers prove infeasibility; this module says why in the user's terms. It works on the same
search space with the enumerator's machinery: first the structural rules (divisibility, products,
caps), then memory, where it reports the smallest per-GPU need any allowed plan has and what
would make it fit (a relaxed constraint, or more GPUs).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from formulations.enumerate import by_layout, feasible_points
from formulations.space import (LABELS, Admits, SearchSpace, build_space, count_points,
                                divisors)
from planner.model.plan import layout_choices
from planner.model.catalog import GiB
from planner.model.errors import InfeasibleError
from planner.model.schema import PIN_CAPS, WHAT_IFS, ConstraintSpec, lifted
from planner.model.terms import host_memory_limit_bytes, memory_limit_bytes, step_terms
from planner.model.words import pinned, plural, toml_value
from planner.model.workload import Shape


def _structural(space: SearchSpace) -> InfeasibleError:
    inst = space.inst
    N = inst.gpus
    gb = inst.spec.training.global_batch
    lines = []
    model_par = sorted({t * c * p for t in space.base["T"].values for c in space.base["C"].values
                        for p in space.base["P"].values if N % (t * c * p) == 0})
    if not model_par:
        lines.append(f"no tp*cp*pp allowed by the model shape and constraints divides the "
                     f"{N} GPUs (tp from {list(space.base['T'].values)}, pp from "
                     f"{list(space.base['P'].values)}, cp from {list(space.base['C'].values)})")
        lines += _nearest_degree_pin(inst)
    else:
        dps = sorted({N // x for x in model_par})
        cons = inst.spec.constraints
        capped = [d for d in dps if (cons.dp is None or d == cons.dp)
                  and (cons.max_dp is None or d <= cons.max_dp)]
        # the dp pin and cap as written ("" when neither is given)
        dp_pins = " and ".join(f"{key} = {val}" for key, val in (("dp", cons.dp),
                                                                 ("max_dp", cons.max_dp))
                               if val is not None)
        if dps and not capped:
            ceiling = cons.max_dp if cons.max_dp is not None else math.inf
            # the allowed dp nearest the pin (under the cap), else the cap raised to the least
            near = min(dps, key=lambda d: (d > ceiling, abs(d - (cons.dp or 0)), d))
            change = (f"dp = {near}" if cons.dp is not None and near <= ceiling
                      else f"max_dp = {near}" if cons.dp is None
                      else f"dp = {near} and max_dp = {near}")
            return InfeasibleError("no plan satisfies the structural rules", [
                f"constraints.{dp_pins} binds: on {N} GPUs dp can only be one of "
                f"{dps} (GPUs / (tp*cp*pp))",
                f"nearest change: {change}"])
        every_dp, dps = dps, capped
        batches = list(space.base["B"].values)
        mbs = list(space.base["b"].values)
        ok = [(d, b, B) for d in dps for b in mbs for B in batches if B % (d * b) == 0]
        if not ok:
            gb_text = f"global batch {gb}" if isinstance(gb, int) else f"global batch in {list(gb)}"
            lines.append(f"no dp x micro_batch divides the {gb_text} on {N} GPUs: dp can only "
                         f"be one of {dps} (GPUs / (tp*cp*pp)) and micro_batch one of {mbs}")
            if isinstance(gb, int):
                near = sorted({d * b * k for d in dps for b in mbs
                               for k in range(1, 2 * gb // (d * b) + 3)},
                              key=lambda B: (abs(B - gb), B))[:3]
                lines.append(f"nearest change: a global batch of "
                             f"{' or '.join(str(x) for x in near)}"
                             + ("" if dp_pins else
                                f", or a GPU count whose data-parallel degree divides {gb}"))
                lines += _memory_beside(inst, {"global_batch": near[0]})
            else:
                # the range widened to the nearest batch that splits, below or above it
                lo, hi = gb
                steps = {d * b for d in dps for b in mbs}
                below = max((s * (lo // s) for s in steps if lo // s), default=None)
                above = min(s * -(-hi // s) for s in steps)
                wider = ([[below, hi]] if below else []) + [[lo, above]]
                lines.append("nearest change: training.global_batch = "
                             + " or ".join(f"[{a}, {b}]" for a, b in wider)
                             + ("" if dp_pins else
                                ", or a GPU count whose data-parallel degree divides a batch "
                                "of the range"))
                lines += _memory_beside(inst, {"global_batch": wider[-1]})
            if dp_pins:
                # (the pin or cap that narrowed dp is part of why no batch split exists)
                lines.append(f"constraints.{dp_pins} leaves dp one of {dps}; lifting it allows "
                             f"dp in {every_dp}")
        elif caps := _binding_caps(space):
            lines += caps
        else:
            lines.append("the placement rules leave no plan: each node must hold a box of the "
                         f"process grid (tp_intra*cp_intra*dp_intra*pp_intra = "
                         f"{inst.node_size}); constraints: tp_within_node = "
                         f"{toml_value(cons.tp_within_node)}, pp_within_node = "
                         f"{toml_value(cons.pp_within_node)}, cp_within_node = "
                         f"{toml_value(cons.cp_within_node)}")
            pins = [f"{k} = {getattr(cons, k)}" for k in ("tp", "pp", "cp", "dp")
                    if getattr(cons, k) is not None]
            if pins:
                lines.append("with the pins constraints." + ", ".join(pins))
            within = [k for k in ("tp_within_node", "pp_within_node", "cp_within_node")
                      if getattr(cons, k)]
            if within or N % inst.node_size:
                lines.append("nearest change: "
                             + (f"set {' or '.join(f'constraints.{k} = false' for k in within)}"
                                if within else "")
                             + (" or " if within and N % inst.node_size else "")
                             + (f"a GPU count that is a multiple of the node size "
                                f"({inst.node_size})" if N % inst.node_size else ""))
    lines += _binding_rules(space)
    return InfeasibleError("no plan satisfies the structural rules", lines)


def _nearest_degree_pin(inst) -> list[str]:
    """With tp, pp or cp pinned so that no model-parallel product divides the GPUs: per pin,
    the nearest value (a divisor of the GPU count) with which the structural rules leave a
    plan, the other pins kept."""
    c = inst.spec.constraints
    admits = Admits(inst)
    out = []
    for key in ("tp", "pp", "cp"):
        pin = getattr(c, key)
        if pin is None:
            continue
        near = next((value for value in sorted(divisors(inst.gpus),
                                               key=lambda v: (abs(v - pin), v))
                     if value != pin and admits(key, value)), None)
        if near is not None:
            out.append(f"{key} = {near}")
    return [f"nearest change: {' or '.join(out)} (one pin changed, the others kept)"] if out \
        else []


def _memory_beside(inst, training_change: dict) -> list[str]:
    """A memory bar behind a structural one: with the suggested ``[training]`` change the
    structural rules hold, but may no plan fit? Then say so, rather than leave the suggestion
    to fail on memory when applied."""
    try:
        changed = build_space(inst.with_spec(
            training=inst.spec.training.model_copy(update=training_change)))
    except InfeasibleError:
        return []
    limit = memory_limit_bytes(inst)
    # (the usual case: the first combination that fits ends the walk)
    found = _min_memory_at(changed, _points(changed), enough=limit)
    if found is None or found[0] <= limit:
        return []
    key, value = next(iter(training_change.items()))
    return [f"memory binds too: with training.{key} = {value} the least any allowed plan "
            f"needs is {found[0] / GiB:.1f} GiB per GPU, over the {limit / GiB:.1f} GiB limit "
            f"on {inst.gpus} GPUs (plan solve with that change says what would fit)"]


def _binding_caps(space: SearchSpace) -> list[str]:
    """The ``[constraints]`` pins on a derived size (``dp``, ``dp_shard_size``: caps on a
    form of the base variables) that bind on their own, each with the values the size could
    take with that pin lifted."""
    out = []
    for cap in space.form_caps:
        name, mono, coef, lo, hi = cap
        relaxed = dataclasses.replace(space, form_caps=[c for c in space.form_caps if c != cap],
                                      _reach={})
        if not count_points(relaxed):
            continue
        values = sorted({round(coef * float(np.prod([q ** e for q, e in zip(space.primes, key)
                                                     ])))
                         for key in count_points(relaxed, form=mono)})
        pin = getattr(space.inst.spec.constraints, name, None)
        said = f"constraints.{name} = {pin}" if pin is not None else \
            f"constraints.max_{name} = {hi}"
        shown = ", ".join(str(v) for v in values[:12]) + (" ..." if len(values) > 12 else "")
        out.append(f"{said} binds: with it lifted, {name} can only be one of {shown}")
        near = min(values, key=lambda v: (abs(v - (pin or hi)), v))
        out.append(f"nearest change: {name} = {near}")
    return out


def _binding_rules(space: SearchSpace) -> list[str]:
    """The structural rules (of :mod:`planner.model.rules`) that bind on their own: with the
    rows of any one of them left out, some assignment of the degrees would remain."""
    names = list(dict.fromkeys(con.name.split(" [")[0] for con in space.constraints))
    out = []
    for name in names:
        rest = [con for con in space.constraints if con.name.split(" [")[0] != name]
        # (its own reach memos: the space is kept for later solves, formulations/solve.py)
        relaxed = dataclasses.replace(space, constraints=rest, _reach={})
        if count_points(relaxed):
            out.append(name)
    if not out:
        return []
    return [f"rules that bind on their own (lifting any one alone would leave degrees that "
            f"keep the other structural rules; memory is not checked here): "
            f"{'; '.join(out)}"]


def _points(space: SearchSpace) -> dict | None:
    """The assignments that keep the structural rules, as columns; None when there are
    none."""
    if not count_points(space):                  # structural: counted, not listed
        return None
    cols = feasible_points(space)
    if not cols or len(next(iter(cols.values()))) == 0:
        return None
    return cols


def _stage_memory(t, n: int) -> dict[str, np.ndarray]:
    """Each memory row of the terms ``t`` (GPU stages and host rows) over the ``n`` points."""
    return {st: np.broadcast_to(np.asarray(t.memory_total(st), float), (n,))
            for st in t.memory_stages()}


def _min_memory(space: SearchSpace) -> tuple[float, dict, object] | None:
    return _min_memory_at(space, _points(space))


def _combo_memory(space: SearchSpace, points, keep=None):
    """Per combination (those ``keep`` accepts), at the ``points`` (:func:`_points`) its
    pipeline layout allows: its index, knobs, terms, those points' columns and each memory row
    over them (:func:`_stage_memory`)."""
    for rows, _, cols, deg in by_layout(space, points):
        n = len(cols["T"])
        for k in rows:
            knobs = space.combos[k]
            if keep is None or keep(knobs):
                t = step_terms(space.inst, deg, knobs)
                yield k, knobs, t, cols, _stage_memory(t, n)


def _min_memory_at(space: SearchSpace, points, enough: float | None = None) -> tuple | None:
    """The least per-GPU need over the ``points`` (:func:`_points`) and every combination, each
    at the points its pipeline layout allows: (bytes, the point, its knobs, the terms of its
    most loaded GPU row, the name of its most loaded row (a ``host`` row when the host's share
    binds: its bytes are scaled to the GPU limit,
    :func:`~planner.model.terms.host_memory_row`), the bytes of that GPU row). Of equal needs,
    the first combination's. With ``enough``, the walk stops at the first need at or below it
    (a question of whether anything fits, not of the least)."""
    if points is None:
        return None
    best, best_k = None, None
    for k, knobs, t, cols, per_stage in _combo_memory(space, points):
        mem = np.max(np.stack(list(per_stage.values())), axis=0)
        i = int(np.argmin(mem))
        if best is None or (mem[i], k) < (best[0], best_k):
            worst = max(per_stage, key=lambda st: per_stage[st][i])
            gpu = max((st for st in per_stage if not st.startswith("host")),
                      key=lambda st: per_stage[st][i])
            parts = {name: float(np.broadcast_to(np.asarray(v, float), mem.shape)[i])
                     for name, v in t.memory[gpu].items()}
            best = (float(mem[i]), {k2: int(c[i]) for k2, c in cols.items()}, knobs, parts,
                    worst, float(per_stage[gpu][i]))
            best_k = k
            if enough is not None and best[0] <= enough:
                break
    return best


def explain_infeasible(space: SearchSpace, max_objective: float | None = None,
                       kind: str = "step_time", suggest: bool = True) -> InfeasibleError:
    """An :class:`InfeasibleError` whose lines say what binds and what would help."""
    inst = space.inst
    points = _points(space)
    found = _min_memory_at(space, points)
    if found is None:
        return _structural(space)
    if found[0] <= memory_limit_bytes(inst) and max_objective is not None:
        from formulations import enumerate as en

        best = en.solve(space, kind)
        if best.objective is not None:
            mfu = inst.spec.constraints.min_mfu
            reach = mfu * max_objective / best.objective
            # (rounded down: a value printed above the reach would fail again as written)
            below = math.floor(reach * 1e4) / 1e4
            return InfeasibleError("no plan reaches the minimum MFU", [
                f"constraints.min_mfu = {mfu:g} binds: the fastest plan that fits reaches "
                f"an MFU of {reach:.5f}",
                f"nearest change: min_mfu = {below:.4f} (or lower)"])
    need, point, knobs, parts, worst, gpu_need = found
    if parts.get("framework_rule", 0.0) > 0 or parts.get("offload_rule", 0.0) > 0:
        return _rule_binds(space, point, knobs, suggest)
    limit = memory_limit_bytes(inst)
    static = parts["weights"] + parts["gradients"] + parts["optimizer_states"]
    plan_words = (f"tp={point['T']}, pp={point['P']}, cp={point['C']}, "
                  f"micro_batch={point['b']}, recompute={knobs.recompute}, distributed "
                  f"optimizer {'on' if knobs.distributed_optimizer else 'off'}"
                  + (", optimizer states offloaded to the host" if knobs.optimizer_offload
                     else "")
                  + (f", {plural(knobs.offload_layers, 'layer')}' activations offloaded"
                     if knobs.offload_layers else ""))
    if worst.startswith("host"):         # the closest plan offloads more than the host holds
        host_limit = host_memory_limit_bytes(inst)
        lines = [
            f"memory: no allowed plan fits both the GPU and its share of the host; the closest "
            f"({plan_words}) needs {gpu_need / GiB:.1f} GiB per GPU (limit {limit / GiB:.1f} "
            f"GiB) and offloads {need * host_limit / limit / GiB:.1f} GiB per GPU to the host, "
            f"over its {host_limit / GiB:.1f} GiB share (cluster.host_memory_GiB less "
            "constraints.host_memory_reserve_GiB, over the GPUs of a host)"]
    else:
        lines = [
            f"memory: the least any allowed plan needs is {need / GiB:.1f} GiB per GPU "
            f"({plan_words}), over the {limit / GiB:.1f} GiB limit by "
            f"{(need - limit) / GiB:.1f} GiB"]
    if static > limit:
        lines.append(f"weights + gradients + optimizer states alone need {static / GiB:.1f} GiB "
                     f"per GPU even at the largest model-parallel degree the constraints allow")
        pps = sorted(space.base["P"].values[k[0]] for k in count_points(space, track=("P",)))
        cons = inst.spec.constraints
        shorts = {lay[0] + lay[1] for lay in layout_choices(inst)}
        by_layers = [d for n in shorts for d in divisors(inst.model.layers + n)
                     if (cons.max_pp is None or d <= cons.max_pp) and cons.pp in (None, d)]
        if pps and pps[-1] < max(by_layers, default=1):
            plus = (f" (plus up to {max(shorts)} layers a shorter first / last stage leaves "
                    "free)") if max(shorts) else ""
            lines.append(f"on {inst.gpus} GPUs pp can only be {pps}: it must divide the "
                         f"{inst.model.layers} layers{plus} and the GPUs left by tp*cp")
    else:
        lines.append(f"weights + gradients + optimizer states take {static / GiB:.1f} GiB on "
                     f"the GPU; activations and logits the other "
                     f"{(gpu_need - static) / GiB:.1f} GiB")
    host = _host_binds(space, points)
    if host:
        lines.insert(0, host)
    if suggest:
        lines += _suggestions(space)
    return InfeasibleError("no plan fits in GPU memory", lines)


def _rule_binds(space: SearchSpace, point: dict, knobs, suggest: bool = True
                ) -> InfeasibleError:
    """Every plan is barred by a framework or offload rule (charged as memory no GPU has,
    planner/model/terms.py): say which rules the least barred plan breaks, not a memory need
    that is the bar's."""
    from formulations.solve import decode_plan
    from planner.model.frameworks import framework_violations, offload_violations

    inst = space.inst
    plan = decode_plan(space, {**space.fixed, **point}, knobs)
    name = inst.spec.constraints.framework
    by_framework = framework_violations(name, plan)
    by_offload = offload_violations(name, plan, inst.spec.training)
    # (the rules named are the ones the closest plan breaks: a context-parallel refusal is
    # not told about host offload)
    whose = ("the framework" if not by_offload else "host offload" if not by_framework
             else "the framework and of host offload")
    pins = pinned(inst.spec.constraints, ("framework", "vp", "cp", "pp", "dp_sharding",
                                          "offload_layers", "optimizer_offload", "ep"))
    return InfeasibleError(f"the rules of {whose} leave no plan", [
        f"no plan that keeps the rules of {whose} fits"
        + (f" under {', '.join(pins)}" if pins else "") + "; the closest "
        f"({plan.label()}) breaks: {'; '.join(by_framework + by_offload) or 'a framework rule'}"]
        # (a pin lifted or a knob freed may leave a plan the rules allow; more GPUs do not)
        + (_suggestions(space, grow=False, need=False) if suggest else []))


def _host_binds(space: SearchSpace, points) -> str | None:
    """With host offload in the space: when some offloading plan at the ``points``
    (:func:`_points`) fits on the GPU but none in its share of the host, the sentence saying
    so (naming the keys), else None."""
    inst = space.inst
    if points is None or not any(k.offloads for k in space.combos):
        return None
    limit, host_limit = memory_limit_bytes(inst), host_memory_limit_bytes(inst)
    need = None
    for *_, rows in _combo_memory(space, points, keep=lambda knobs: knobs.offloads):
        gpu = np.max([v for st, v in rows.items() if not st.startswith("host")], axis=0)
        host = np.max([v for st, v in rows.items() if st.startswith("host")], axis=0)
        fits = gpu <= limit
        if fits.any():
            low = float(np.min(host[fits])) * host_limit / limit
            need = low if need is None else min(need, low)
    if need is None:
        return None
    hs, total = inst.hw.gpus_per_host, inst.hw.host_mem_bytes / GiB
    return (f"host memory binds: with host offload a plan fits on the GPU, but the least it "
            f"offloads is {need / GiB:.1f} GiB per GPU, over its {host_limit / GiB:.1f} GiB "
            f"share of the host (cluster.host_memory_GiB = {total:g} less "
            f"constraints.host_memory_reserve_GiB = {total - host_limit * hs / GiB:.1f}, over "
            f"{hs} GPUs per host)")


def _weights_alone_exceed(inst, gpus: int) -> bool:
    """Whether the model's weights alone, at one byte per parameter (the least any mode keeps:
    FP8; parameters are never offloaded) spread over all ``gpus``, exceed the memory limit: then
    no plan on that many GPUs fits, whatever its degrees, sharding or offload."""
    return Shape.of(inst.model).total_params / gpus > memory_limit_bytes(inst)


def _suggestions(space: SearchSpace, grow: bool = True, need: bool = True) -> list[str]:
    """Single relaxations of the constraints that would make some plan fit (the framework and
    offload rules are charged as memory no GPU has, so a plan that fits keeps them too); with
    ``grow``, when none does, the nearest larger cluster that has one; with ``need``, each
    with what the plan then needs per GPU."""
    inst = space.inst
    c = inst.spec.constraints
    trials = []
    #: a cap on a degree is raised to the degree of the plan that then fits (a cap the user
    #: never wrote, max_cp's default 1, cannot be "lifted" by deleting it); the micro-batch's
    #: cap is not (a larger micro-batch never needs less memory)
    degree_of = {PIN_CAPS[key]: var for var, (_, key) in LABELS.items()
                 if key in PIN_CAPS and var != "b"}
    # every what-if the instance sets (planner/model/schema.py WHAT_IFS), lifted as --compare
    # lifts it, but a placement rule even at its default; not min_mfu, a cap on the step time
    # (explained on its own), nor the reach of a pin
    for key in ConstraintSpec.model_fields:
        kind = WHAT_IFS[key]
        if kind in ("kept", "reach") or key == "min_mfu":
            continue
        given = getattr(c, key)
        free = (None if key in degree_of else False if kind == "placement"
                else lifted(c, key))
        if given != free and given is not None:
            trials.append((f"lift constraints.{key} = {toml_value(given)}", {key: free}))
    if (c.memory_reserve_GiB or 0) > 0:
        trials.append(("memory_reserve_GiB", {"memory_reserve_GiB": 0.0}))
    out = []
    for text, change in trials:
        try:
            sp2 = build_space(inst.with_spec(constraints=c.model_copy(update=change)))
        except InfeasibleError:
            continue
        found = _min_memory(sp2)
        if not (found and found[0] <= memory_limit_bytes(sp2.inst)):
            continue
        key = next(iter(change))
        if key == "memory_reserve_GiB":
            # the largest reserve that still leaves the plan room, rounded down
            room = math.floor((memory_limit_bytes(sp2.inst) - found[0]) / GiB * 10) / 10
            given = "" if "memory_reserve_GiB" in c.model_fields_set else " (the default)"
            text = (f"lower constraints.memory_reserve_GiB from {c.memory_reserve_GiB:g}"
                    f"{given} to {room:g} or less")
        elif key in degree_of:
            # the least raise of the cap that lets a plan fit (the lifted space's values of the
            # degree above the cap, in order)
            raised = None
            for value in sorted(v for v in sp2.base[degree_of[key]].values
                                if v > getattr(c, key)):
                try:
                    sp3 = build_space(inst.with_spec(
                        constraints=c.model_copy(update={key: value})))
                except InfeasibleError:
                    continue
                at = _min_memory(sp3)
                if at and at[0] <= memory_limit_bytes(sp3.inst):
                    raised, found = value, at
                    break
            if raised is None:
                continue
            text = f"raise constraints.{key} from {getattr(c, key)} to {raised}"
        out.append(f"nearest change: {text}"
                   + (f" (then a plan needs {found[0] / GiB:.1f} GiB)" if need else ""))
    if grow and not out:
        out += _larger_cluster(inst)
    return out


def _larger_cluster(inst) -> list[str]:
    """The nearest larger cluster with a plan that fits: below a host, each larger GPU count
    up to a whole host (``cluster.gpus``); then the next 32 node counts and a few multiples
    (memory only falls as GPUs are added, but divisibility is jumpy)."""
    host = inst.hw.gpus_per_host
    sizes = [(g, dataclasses.replace(inst, gpus=g, node_options=(1,)))
             for g in range(inst.gpus + 1, host + 1)] if inst.gpus < host else []
    n = inst.nodes
    counts = sorted(set(range(n + 1, n + 33)) | {round(n * f) for f in (1.5, 2, 3, 4, 8)})
    sizes += [(None, inst.with_nodes(m)) for m in counts]
    if _weights_alone_exceed(inst, sizes[-1][1].gpus):
        return []                    # (no cluster of the list can hold the weights)
    for gpus, bigger in sizes:
        try:
            found = _min_memory(build_space(bigger))
        except InfeasibleError:
            continue
        if found and found[0] <= memory_limit_bytes(bigger):
            point = found[1]
            size = (f"cluster.gpus = {gpus}" if gpus is not None else
                    f"{plural(bigger.nodes, 'node')} ({bigger.gpus} GPUs)")
            return [f"nearest change: {size} ({bigger.gpus / inst.gpus:.2f}x) admit"
                    f"{'s' if gpus is not None else ''} a plan that fits (tp={point['T']}, "
                    f"pp={point['P']}: {found[0] / GiB:.1f} GiB per GPU)"]
    return []


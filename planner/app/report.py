"""Human reports (rich) for plan results; the JSON view is ``StepReport.to_dict``.

Rendering lives here and nowhere else so every command prints a plan the same way.
"""

from __future__ import annotations

import math
from typing import Any

from rich.console import Console, Group
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from formulations.queries import OUTSIDE_RANGE, days_text
from planner.model.evaluate import MFU_FORMULA, StepReport
from planner.model.frameworks import OVERLAP_KNOBS, framework_of
from planner.model.terms import MEMORY_TERMS, TIME_TERM_LABELS, TIME_TERMS
from planner.model.instance import Instance
from planner.model.words import count, number, ordinal, plural, stage_words, toml_value

TERM_LABELS = {term: long for term, (long, _) in TIME_TERM_LABELS.items()}


def _fmt_s(x: float) -> str:
    if x >= 1:
        return f"{x:.3f} s"
    if x >= 1e-3:
        return f"{x * 1e3:.2f} ms"
    return f"{x * 1e6:.1f} us"


def _big(x: float, fmt: str) -> str:
    """``fmt`` below a trillion (``$1,021,133``), engineering notation beyond, where digit
    groups stop being readable (1e30 tokens is 37.6e18 days)."""
    return format(x, fmt) if abs(x) < 1e12 else number(x)


def _dollars(x: float) -> str:
    """Whole dollars from $100 up (``91,487``), three significant figures below (``11.1``),
    where whole dollars printed sizes the front tells apart as the same cost."""
    if x >= 100 or x <= 0:
        return _big(x, ",.0f")
    return f"{x:.{max(0, 2 - math.floor(math.log10(x)))}f}"


def plan_table(rep: StepReport, inst: Instance) -> Table:
    p = rep.plan
    t = Table(title="Plan", show_header=False, box=None, pad_edge=False)
    t.add_column(style="bold")
    t.add_column()
    m = inst.model
    if m.mla:
        heads = (f"{m.heads} heads (MLA: query / key {m.qk_head_dim} + {m.qk_pos_emb_head_dim}"
                 f" RoPE wide, value {m.v_head_dim}; compressed"
                 + (f" query {m.q_lora_rank}," if m.q_lora_rank else "")
                 + f" key / value {m.kv_lora_rank})")
    else:
        heads = (f"{m.heads} heads ({m.kv} kv"
                 + (f", {m.head_dim} wide" if m.head_dim is not None else "") + ")")
    mtp = f" (+ {plural(m.mtp_layers, 'prediction layer')})" if m.mtp_layers else ""
    window = (f", sliding window of {m.window_left:,} tokens before each query in "
              f"{m.windowed_extent}" if m.windowed else "")
    t.add_row("model", f"{escape(m.name or 'custom')}: {m.layers} layers{mtp}, hidden "
              f"{m.hidden}, {heads}, seq {m.seq_len}{window}")
    hosts = f"{plural(p.nodes, 'node')} of {inst.hw.gpus_per_host}"
    if inst.node_size != inst.hw.gpus_per_host:
        hosts += f", NVLink segments of {inst.node_size}"
    # (the fused stack, Transformer Engine's kernels, goes unsaid: most instances run it)
    kernels = ", eager PyTorch kernels (kernel_stack pytorch)" \
        if inst.kernel_stack == "pytorch" else ""
    t.add_row("cluster", f"{p.gpus} x {inst.hw.gpu.name} ({hosts}), "
              f"{inst.spec.training.precision_label}{kernels}")
    if inst.spec.constraints.framework is not None:       # (Megatron-LM's otherwise)
        t.add_row("framework", f"{framework_of(inst.spec.constraints.framework).label}: its "
                  "rules and defaults")
    t.add_row("degrees", f"TP {p.tp}  PP {p.pp}  DP {p.dp}  CP {p.cp}  VP {p.vp}"
              + (f"  EP {p.ep} (inside a node {p.ep_intra}, expert DP {p.expert_dp:g})"
                 if p.ep > 1 else ""))
    # the model's "node" is the NVLink segment; on rack-scale systems it spans several hosts
    unit = "node" if inst.node_size == inst.hw.gpus_per_host else "NVLink segment"
    t.add_row(f"inside a {unit}" if unit == "node" else "inside a segment",
              f"TP {p.tp_intra}  CP {p.cp_intra}  DP {p.dp_intra}  "
              f"PP {p.pp_intra}   (across {unit}s: TP {p.inter('tp'):g}  CP {p.inter('cp'):g}  "
              f"DP {p.inter('dp'):g}  PP {p.inter('pp'):g})")
    t.add_row("batch", f"global {p.global_batch} = DP {p.dp} x micro-batch {p.micro_batch} x "
              f"{count(p.micro_batches)} micro-batches")
    rc = p.recompute + (f" of {p.recompute_layers} layer{'s' * (p.recompute_layers > 1)} per "
                        "virtual stage (block method)"
                        if p.recompute == "full" and p.recompute_layers else "")
    t.add_row("memory knobs", f"recompute {rc}, sequence parallel "
              f"{'on' if p.sequence_parallel else 'off'}, distributed optimizer "
              f"{'on' if p.distributed_optimizer else 'off'}")
    on = [k for k in OVERLAP_KNOBS if getattr(p, k)]
    t.add_row("overlap", ", ".join(on) if on else "none (every collective exposed)")
    if p.stage_layers and (len(set(p.stage_layers)) > 1 or p.pipeline_layout):
        how = (f"layout {p.pipeline_layout}" if p.pipeline_layout else
               "embedding / loss counted as layers" if p.account_for_embedding
               or p.account_for_loss else f"first {p.first_stage_layers or 'even'}, last "
               f"{p.last_stage_layers or 'even'}")
        t.add_row("pipeline layout", f"{' '.join(str(n) for n in p.stage_layers)} decoder layers "
                  f"per rank ({how})")
    shard = f"dp_sharding {p.dp_sharding}"
    if p.dp_sharding != "none":
        shard += f", shard group {p.dp_shard_size}" + (
            f" x {p.dp_replicate} replicas (HSDP)" if p.dp_replicate > 1 else "")
    if p.dp_sharding == "optim_grads_params":
        shard += f", reshard after forward {'on' if p.reshard_after_forward else 'off'}"
    t.add_row("sharding", shard)
    if p.knobs.offloads:
        acts = (f"activations of {plural(p.offload_layers, 'layer')}" if p.offload_layers
                else "activations kept")
        t.add_row("host offload", f"optimizer {'on' if p.optimizer_offload else 'off'}, {acts}")
    return t


def time_table(rep: StepReport) -> Table:
    t = Table(title=f"Step time {_fmt_s(rep.step_time_s)}")
    t.add_column("term")
    t.add_column("time", justify="right")
    t.add_column("share", justify="right")
    # (context, expert parallelism and host offload are shown where the plan has them)
    absent = {"cp_comm", "ep_comm"}
    if not rep.plan.knobs.offloads:
        absent.add("offload")
    for name in TIME_TERMS:
        v = rep.breakdown_s[name]
        if v == 0 and name in absent:
            continue
        label = TERM_LABELS[name]
        if name == "optimizer" and rep.plan.optimizer_offload:
            label = "optimizer step (on the CPU, host-memory-bound)"
        t.add_row(label, _fmt_s(v), f"{100 * v / rep.step_time_s:.1f}%")
    return t


def memory_table(rep: StepReport) -> Table:
    mem = rep.memory_gib
    t = Table(title=f"Memory per GPU, {stage_words(rep.most_loaded_stage)} (GiB = 2^30 B)")
    t.add_column("component")
    t.add_column("GiB", justify="right")
    t.add_column("of limit", justify="right")
    at_step = rep.most_loaded_stage.endswith("_step")   # the optimizer step's peak
    for name in MEMORY_TERMS:
        label = name.replace("_", " ")
        if at_step and name == "optimizer_states":
            label += " + main-gradient copy"
        if name == "comm_buffers":
            if not mem[name]:                 # (held under tp_comm_overlap only)
                continue
            label = "comm buffers (tp_comm_overlap userbuffers)"
        t.add_row(label, f"{mem[name]:.2f}", f"{100 * mem[name] / mem['limit']:.1f}%")
    style = "bold red" if mem["total"] > mem["limit"] else "bold green"
    t.add_row(Text("total", style=style), Text(f"{mem['total']:.2f}", style=style),
              Text(f"{100 * mem['total'] / mem['limit']:.1f}%", style=style))
    t.add_row("limit", f"{mem['limit']:.2f}",
              f"capacity {mem['capacity']:.1f} - reserve {mem['reserve']:.1f}")
    if rep.plan.knobs.offloads:
        t.add_row("host offload", f"{mem['host_offload']:.2f}",
                  f"of a {mem['host_limit']:.1f} GiB host share per GPU")
    return t


def summary_table(rep: StepReport, inst: Instance) -> Table:
    t = Table(title="Summary", show_header=False, box=None)
    t.add_column(style="bold")
    t.add_column()
    t.add_row("MFU", f"{100 * rep.mfu:.1f}%  ({rep.model_tflops_per_gpu:.0f} model TFLOP/s per GPU)")
    t.add_row("", Text(MFU_FORMULA, style="dim"))
    tokens = inst.spec.training.tokens
    if rep.total_days is not None:
        steps = (f"{_big(rep.steps, ',.0f')} steps" if rep.steps >= 1
                 else f"{rep.steps:.3g} of one step")
        days = f"{_big(rep.total_days, '.1f')} days" if rep.total_days >= 0.1 else (
            f"{rep.total_days * 24:.2g} hours")
        t.add_row("training time", f"{days} for {tokens:.3g} tokens ({steps} of "
                  f"{rep.tokens_per_step:,} tokens)")
    else:
        t.add_row("training time", "set training.tokens for days and cost")
    if rep.cost is not None:
        t.add_row("cost", f"${_big(rep.cost, ',.0f')} at "
                  f"${inst.spec.cluster.price_per_gpu_hour}/GPU-hour")
    return t


def violations_panel(rep: StepReport) -> Panel:
    """The limits the plan breaks (or that it fits), then what its numbers rest on that the
    measured runs do not confirm (``caveats``)."""
    if rep.violations:
        body = Text("\n".join(f"- {v}" for v in rep.violations), style="red")
    else:
        body = Text("fits: every limit holds", style="green")
    body.append("".join(f"\nnot validated: {c}" for c in rep.caveats), style="yellow")
    return Panel(body, title="Violated limits" if rep.violations else "Feasibility")


def solver_panel(res) -> Panel:
    """The optimality certificate of a solver result."""
    from formulations.result import Status

    ok = res.status == Status.OPTIMAL
    t = Table(show_header=False, box=None)
    t.add_column(style="bold")
    t.add_column()
    status = "optimal (proven)" if ok else f"{res.status.value} (NOT proven optimal)"
    t.add_row("status", Text(status, style="green" if ok else "yellow"))
    unit = "s per step" if res.objective_kind == "step_time" else "s per sequence"
    if res.objective is not None:
        t.add_row("objective", f"{res.objective:.9g} {unit}")
    if res.bound is not None:
        t.add_row("bound", f"{res.bound:.9g} {unit}")
    if res.gap is not None:
        tie = (" (a tie: the plan the tie-break goals chose, within 0.01% of the proven "
               "optimum, the bound)" if ok and res.gap > 1e-6 else "")
        t.add_row("gap", f"{100 * res.gap:.4f}%{tie}")
    # the solve and build times are sums over the solve's models (parts, tie goals, batch
    # models); CP-SAT solves two parts at once, so the sums can exceed the wall time
    t.add_row("time", f"{res.wall_s:.3f} s wall; summed over the solver's models: "
              f"{res.solve_s:.3f} s solving, {res.build_s:.3f} s building"
              + (" (two models at a time)" if res.solve_s + res.build_s > res.wall_s else ""))
    t.add_row("backend", res.backend)
    if res.space_points is not None:
        t.add_row("search space", f"{res.space_points:,} degree assignments that satisfy the "
                  f"structural rules x {res.space_combos} knob combinations"
                  + (" = " if res.space_plans == res.space_points * res.space_combos else
                     ", each at the assignments it admits: ")
                  + f"{res.space_plans:,} plans (counted over the rules, not listed)")
    if res.stage_shortfall_words:
        t.add_row("layouts", "pipeline layouts with the first / last stage up to "
                  f"{res.stage_shortfall} layer(s) short of a middle one: "
                  f"{res.stage_shortfall_words}")
    t.add_row("ties", "plans within 0.01% of the optimum are ties, broken by the most memory "
              "headroom, then the fewest bytes across nodes, then the simplest plan (the same in "
              "every backend)")
    if res.quantum_s:
        t.add_row("quantum", f"CP-SAT works in integer units of {res.quantum_s:g} s: optimal up "
                  "to the rounding of each table entry and product to one unit")
    if res.note and not ok:
        t.add_row("note", res.note)
    return Panel(t, title="Solver certificate")


def render_step(rep: StepReport, inst: Instance, extra: list[Any] | None = None) -> Group:
    parts: list[Any] = [plan_table(rep, inst), time_table(rep), memory_table(rep),
                        summary_table(rep, inst), violations_panel(rep)]
    return Group(*(parts + list(extra or [])))


def print_step(rep: StepReport, inst: Instance, console: Console | None = None,
               extra: list[Any] | None = None) -> None:
    (console or Console()).print(render_step(rep, inst, extra))


#: plan keys the top table shows in its own columns (or derives from them)
_TOP_SHOWN = {"tp", "pp", "dp", "cp", "vp", "ep", "micro_batch", "micro_batches", "recompute",
              "sequence_parallel", "distributed_optimizer", "gpus", "nodes", "expert_dp",
              "nvlink_domain", "dp_replicate"}


def _differs(plan, first) -> str:
    """What sets ``plan`` apart from ``first`` beyond the table's columns (the plans of a top
    list are distinct, but may differ only in, e.g., the HSDP shard group or an overlap)."""
    a, b = plan.to_dict(), first.to_dict()
    keys = [k for k in a if k not in _TOP_SHOWN and not k.endswith(("_intra", "_inter"))
            and a[k] != b.get(k)]
    return ", ".join(f"{k} {toml_value(a[k])}" for k in keys)


def top_table(results) -> Table:
    """The K best distinct plans with their gap to the optimum. Under a time limit a solve may
    stop with the best plan it has (``feasible``): the list is then the plans in the order
    solved, not proven best, and the table says so, with each row's status."""
    proven = all(r.proven for r in results)
    t = Table(title="Best distinct plans (each proven optimal once the better ones are excluded)"
              if proven else "Distinct plans in the order solved: not proven best (a solve "
              "stopped at the time limit; a later row may be faster, a better plan missing)")
    cols = ("rank", "plan", "in a node TP/CP/DP/PP", "recompute", "SP", "dist-opt",
            "also differs (vs 1) in", "step s", "gap") + (() if proven else ("status",))
    for col in cols:
        t.add_column(col, no_wrap=col in ("plan", "step s", "gap"))
    best, first = results[0].objective, results[0].report.plan
    for i, r in enumerate(results, 1):
        p = r.report.plan
        t.add_row(str(i), p.label(), f"{p.tp_intra}/{p.cp_intra}/{p.dp_intra}/{p.pp_intra}",
                  p.recompute, "on" if p.sequence_parallel else "off",
                  "on" if p.distributed_optimizer else "off", _differs(p, first),
                  f"{r.report.step_time_s:.4f}", f"{100 * (r.objective / best - 1):+.3f}%",
                  *(() if proven else (r.status.value,)))
    return t


def compare_table(cmp) -> Table:
    """Constrained vs unconstrained optimum, and what binds; under a time limit, which of them
    a solve stopped at left unproven (the caption says what that leaves open)."""
    t = Table(title=escape("What-if: with and without the [constraints]"))
    t.add_column("")
    t.add_column("plan")
    t.add_column("step s", justify="right")
    t.add_column("vs unconstrained", justify="right")

    def unproven(res) -> str:                # a solve stopped at the time limit with a plan
        return "" if res.proven else f" ({res.status.value}, not proven)"

    def versus(slowdown: float) -> str:
        return (f"{100 * slowdown:+.2f}% slower" if slowdown >= 5e-5 else
                f"{-100 * slowdown:.2f}% faster" if slowdown <= -5e-5 else "as fast")

    u = cmp.unconstrained
    t.add_row("unconstrained", u.report.plan.label() + unproven(u), f"{u.report.step_time_s:.4f}",
              "")
    if cmp.constrained and cmp.constrained.report:
        c = cmp.constrained.report
        t.add_row("constrained", c.plan.label() + unproven(cmp.constrained),
                  f"{c.step_time_s:.4f}", versus(cmp.slowdown))
    else:
        t.add_row("constrained", "no plan", "", "")
    for b in cmp.binding:
        change = b.get("step_time_change_if_lifted")
        t.add_row(f"binds: {b['constraint']} = {toml_value(b['value'])}",
                  f"lifted alone ({b['constraint']} = {toml_value(b['lifted_to'])})"
                  + ("" if b["proven"] else " (not proven)"),
                  f"{b['step_time_without_s']:.4f}",
                  # (against the constrained optimum; with none, against the unconstrained)
                  f"step time {100 * change:+.2f}%" if change is not None else
                  versus(b["step_time_without_s"] / u.report.step_time_s - 1))
    for b in cmp.undecided:
        t.add_row(f"undecided: {b['constraint']} = {toml_value(b['value'])}",
                  f"lifted alone ({b['constraint']} = {toml_value(b['lifted_to'])}): "
                  f"{b['status']}, no faster plan found",
                  "" if b["step_time_without_s"] is None else f"{b['step_time_without_s']:.4f}",
                  "")
    if not cmp.binding and not cmp.undecided:
        t.add_row("binds", "no single constraint binds", "", "")
    if not cmp.proven:
        t.caption = escape(
            "not proven: a solve stopped at the time limit with the best plan it had found, "
            "not its optimum, so the percentages compare those plans and an undecided "
            "constraint may bind; raise --time-limit for a proven comparison")
    return t


def pareto_table(points, batch_range: bool = False) -> Table:
    """One row per size; ``*`` marks the sizes no other size beats on both training time and
    cost. With a global-batch range each row shows the batch its optimum chose."""
    # (a size solved to a plan but not proven: the best plan found there, said in the title,
    # its status column and a note)
    proven = all(p.result is None or p.result.proven for p in points)
    t = Table(title=("Proven optimum" if proven else "Best plan found (not all proven)")
              + " per cluster size (* = on the Pareto front: no other size is both faster and "
              "cheaper)")
    cols = ["", "nodes", "GPUs", "plan"] + (["batch"] if batch_range else []) + [
        "step s", "days", "cost $", "MFU", "status"]
    for col in cols:
        t.add_column(col, justify="right" if col not in ("plan", "status", "") else "left")
    for group in _planless_runs(points):
        p = group[0]
        if p.result is None:      # the status says infeasible or stopped at the time limit
            # (adjacent sizes without a plan for the same reason share one row: a range of
            # hundreds of node counts mostly holds sizes the structural rules rule out)
            nodes = [q.nodes for q in group]
            label = str(p.nodes) if len(group) == 1 else (
                f"{nodes[0]}-{nodes[-1]}" if nodes == list(range(nodes[0], nodes[-1] + 1))
                else f"{nodes[0]}..{nodes[-1]}")
            why = p.reason + (f" ({len(group)} sizes)" if len(group) > 1 else "")
            t.add_row("", label, "", Text(why, style="dim"),
                      *([""] * (len(cols) - 5)), p.status)
            continue
        rep = p.result.report
        t.add_row("*" if p.on_front else "", str(p.nodes), str(rep.plan.gpus), rep.plan.label(),
                  *([f"{rep.plan.global_batch:,}"] if batch_range else []),
                  f"{rep.step_time_s:.4f}",
                  days_text(rep.total_days) if rep.total_days is not None else "-",
                  _dollars(rep.cost) if rep.cost is not None else "-",
                  f"{100 * rep.mfu:.1f}%", p.result.status.value)
    return t


def front_basis_lines(inst) -> list[str]:
    """What the front of a pareto table is decided on where its days or cost column is empty
    (``-``): the fallbacks of :func:`formulations.queries.front_key`, which the table does not
    show."""
    if not inst.spec.training.tokens:           # (no days, so no dollars either)
        return ["front: without training.tokens, time is the time per sequence (step s / "
                "global batch) instead of days, and cost GPU-seconds per sequence (that x "
                "GPUs) instead of dollars"]
    if inst.spec.cluster.price_per_gpu_hour is None:
        return ["front: without cluster.price_per_gpu_hour, cost is GPU-seconds per sequence "
                "(step s / global batch x GPUs) instead of dollars"]
    return []


def caveat_lines(points) -> list[str]:
    """The caveats of the table's plans (what their numbers rest on that the measured runs do
    not confirm: the MoE terms, a precision the GPU type has no measured run at, ...), once
    each, as ``plan solve`` prints them under a plan; one that holds for some sizes only names
    them."""
    from planner.model.evaluate import plan_figure

    planned = [p for p in points if p.result is not None and p.result.report is not None]
    held: dict[str, list[int]] = {}
    shares: dict[str, list[float]] = {}
    for p in planned:
        for c in p.result.report.caveats:
            # (one line per caveat, a plan's own figure as the range over the plans)
            stem, share = plan_figure(c)
            held.setdefault(stem, []).append(p.nodes)
            if share is not None:
                shares.setdefault(stem, []).append(share)
    lines = []
    for c, sizes in held.items():
        if c in shares:
            lo, hi = min(shares[c]), max(shares[c])
            c += (f"; on these plans {lo:.2g}% of the step" if lo == hi else
                  f"; on these plans {lo:.2g}-{hi:.2g}% of the step")
        lines.append(f"not validated: {c}" + ("" if len(sizes) == len(planned)
                                              else f" (at {sizes_text(sizes)})"))
    return lines


def _planless_runs(points) -> list[list]:
    """The points in order, adjacent points without a plan for the same reason and status
    together, each point with a plan alone."""
    groups: list[list] = []
    for p in points:
        last = groups[-1][-1] if groups else None
        if (p.result is None and last is not None and last.result is None
                and (last.reason, last.status) == (p.reason, p.status)):
            groups[-1].append(p)
        else:
            groups.append([p])
    return groups


def sizes_text(nodes: list[int], shown: int = 8) -> str:
    """Node counts in a message: ``3 nodes``, ``2 sizes (3, 4 nodes)``; the first ``shown`` of
    many (a range may hold hundreds)."""
    if len(nodes) == 1:
        return plural(nodes[0], "node")
    more = f" and {len(nodes) - shown:,} more" if len(nodes) > shown else ""
    return (f"{plural(len(nodes), 'size')} ({', '.join(f'{n:,}' for n in nodes[:shown])}{more} "
            "nodes)")


def capacity_panel(ans) -> Panel:
    lines = []
    deadline = plural(ans.deadline_days, "day")
    partial = ans.partial_gpus

    def size(n: int) -> str:
        return (f"{plural(partial, 'GPU')} (cluster.gpus, part of one node)" if partial
                else plural(n, "node"))

    def days(x: float) -> str:
        return days_text(x, ans.deadline_days)

    def fastest_line() -> None:
        fast = ans.fastest
        if fast is not None:
            lead = ("Its plan" if partial else f"The fastest size solved, {size(fast['nodes'])},")
            lines.append(f"{lead} needs {days(fast['days'])} days ({fast['proof']}).")

    def skipped_line() -> str:
        return (f"The smaller {sizes_text(ans.bound_skipped)} need at least "
                f"{days(ans.skipped_days_lower_bound)} days (compute lower bound).")

    none_here = ("The instance's one size" if partial else "No size in the range")
    if ans.nodes is None and ans.unproven:
        lines.append(f"{none_here} is proven to meet {deadline}: at "
                     f"{sizes_text(ans.unproven)} the solver stopped at the time limit without a "
                     "proven answer.")
        fastest_line()
    elif ans.nodes is None and ans.none_has_a_plan:
        lines.append(f"{none_here} has a plan: the deadline is not what rules "
                     f"{'it' if partial else 'them'} out.")
        why: dict[str, list[int]] = {}
        for c in ans.without_plan:
            why.setdefault(c["reason"], []).append(c["nodes"])
        for reason, sizes in why.items():
            lines.append(f"At {size(sizes[0]) if len(sizes) == 1 else sizes_text(sizes)}: "
                         f"{reason} (what binds: on stderr, or --json checked[].detail).")
        if ans.bound_skipped:
            lines.append(skipped_line())
    elif ans.nodes is None:
        lines.append(f"The instance's one size does not meet {deadline}." if partial
                     else f"No size in the range meets {deadline}.")
        fastest_line()
        ns = ans.next_smaller or {}
        if ans.fastest is None and "days_lower_bound" in ns:
            lines.append(f"Even the largest size, {size(ns['nodes'])}, needs at least "
                         f"{days(ns['days_lower_bound'])} days (compute lower bound).")
        elif ans.bound_skipped:
            lines.append(skipped_line())
        if ans.without_plan:
            lines.append(f"No plan at {sizes_text([c['nodes'] for c in ans.without_plan])} "
                         "(each size's reason: --json checked[].reason).")
    else:
        ns = ans.next_smaller or {}
        proven = ans.result.proven
        status = ("proven optimal plan" if proven else
                  "plan not proven optimal: the solver stopped at the time limit")
        took = f"{days(ans.result.report.total_days)} days, {status}"
        if partial:
            lines.append(f"The instance's one size, {size(ans.nodes)}, meets {deadline} "
                         f"({took}).")
            lines.append(escape("Fewer GPUs may suffice: cluster.gpus fixes one size; give a "
                                "smaller cluster.gpus to try fewer."))
        else:
            # the range's smallest size, with fewer nodes not ruled out by the compute bound:
            # the fewest of the range, not shown the fewest that suffice
            open_below = (ns.get("proof") == OUTSIDE_RANGE
                          and ns.get("days_lower_bound", 0.0) <= ans.deadline_days)
            lines.append(f"Fewest nodes {'of the range ' if open_below else ''}meeting "
                         f"{deadline}: {ans.nodes} ({took}).")
            if open_below:
                # (one node fewer is not among the instance's sizes: below a range's start, or
                # a gap of node_counts, whose smaller listed sizes the answer already ruled out)
                lines.append(escape(f"Fewer nodes may suffice: {plural(ans.nodes - 1, 'node')} "
                                    "(one fewer) is not among the instance's sizes; give "
                                    "cluster.nodes = [lo, hi] (or node_counts) that include it "
                                    "to search it."))
    ns = ans.next_smaller if ans.nodes is not None else None   # else: said above
    if ns:
        if "days" in ns and ns.get("days") is not None:
            lines.append(f"One node fewer ({ns['nodes']}): at best {days(ns['days'])} days "
                         f"({ns['proof']}).")
        elif "days_lower_bound" in ns:
            lines.append(f"One node fewer ({ns['nodes']}): at least "
                         f"{days(ns['days_lower_bound'])} days ({ns['proof']}).")
        else:
            # (the solver's sentence says there is no plan, and which kind of rule excludes
            # them all: memory, the structural rules, a constraint)
            why = ns.get("reason") or ns.get("proof", "no plan fits")
            lines.append(f"One node fewer ({ns['nodes']}): {why}.")
    if ans.cheapest:
        ch = ans.cheapest
        lines.append(f"Cheapest plan meeting the deadline: {size(ch['nodes'])}, "
                     f"${ch['cost']:,.0f} ({'within' if ch['within_budget'] else 'over'} the "
                     f"${ch['budget_usd']:,.0f} budget; {plural(ch['sizes_checked'], 'larger size')} "
                     "checked" + (f", {len(ch['unproven'])} not proven: the solver stopped at "
                                  "the time limit" if ch.get("unproven") else "") + ").")
    lines.append(f"{plural(len(ans.checked), 'size')} solved, {ans.wall_s:.2f} s.")
    return Panel("\n".join(lines), title="Capacity")


def alternatives_table(res) -> Table:
    """One set of measured alternatives (planner/app/alternatives.py): each plan's measured and
    predicted seconds per sequence and ranks, and its memory, the model's beside the peak
    nvidia-smi showed."""
    t = Table(title=f"Measured alternatives: {res.id}")
    for col in ("plan", "batch", "meas. s/seq", "pred. s/seq", "meas. rank", "pred. rank",
                "mem GiB", "meas. mem GiB"):
        t.add_column(col, justify="left" if col == "plan" else "right")
    timed = [r for r in res.plans if not r.oom]
    meas_rank = {id(r): 1 + sum(q.measured_s < r.measured_s for q in timed) for r in timed}
    pred_rank = {id(r): 1 + sum(q.predicted_s < r.predicted_s for q in timed) for r in timed}
    for r in res.plans:
        mem = f"{r.memory_gib:.1f}" + ("" if r.fits else " (!)")
        t.add_row(r.label, str(r.global_batch),
                  "out of memory" if r.oom else f"{r.measured_s:.4f}", f"{r.predicted_s:.4f}",
                  "-" if r.oom else str(meas_rank[id(r)]),
                  "-" if r.oom else str(pred_rank[id(r)]), mem,
                  "-" if r.measured_memory_gib is None else f"{r.measured_memory_gib:.1f}",
                  style="red" if r.oom and r.fits else ("dim" if r.oom else ""))
    return t


def alternatives_summary(res) -> str:
    """The set's order figures in one paragraph (planner/app/alternatives.py)."""
    tau = "-" if res.kendall_tau is None else f"{res.kendall_tau:+.2f}"
    text = (f"{res.id}: Kendall's tau {tau} between predicted and measured s/seq over "
            f"{res.timed_plans} timed plans")
    if res.pick_regret is not None:
        text += ("; the model's pick among them is the fastest" if res.pick_regret == 0 else
                 f"; the model's pick among them ran {100 * res.pick_regret:.1f}% slower than "
                 f"the fastest, which it ranks {ordinal(res.measured_best_rank)}")
    if res.oom_plans:
        text += (f"; {res.oom_predicted} of {res.oom_plans} plans that ran out of memory do "
                 f"not fit under the model, {res.fit_predicted} of {res.timed_plans} that ran fit")
    else:       # (no plan of the set ran out of memory)
        text += f"; {res.fit_predicted} of the {res.timed_plans} plans fit under the model"
    opt = res.optimum
    if opt and opt.get("plan"):
        text += (f"; the model's optimum over the set's cluster is {opt['plan']} at "
                 f"{opt['global_batch']} sequences "
                 f"({opt['predicted_s']:.4f} s/seq)"
                 + (", a plan that ran out of memory" if opt["ran_out_of_memory"] else ""))
    return text


def validation_lines(v) -> list[Any]:
    """``plan validate`` as text (planner/app/validate.py, ``Validation``): the table of
    predicted against measured step times, the error figures in and out of sample, the
    held-out and calibration-only runs, the ranking and its outliers with the gap by term, the
    settings the runs leave unstated, and the plans the model says do not fit."""
    # (here, not at the top: every command's report would load the runs file's reader and the
    # ranking, which only plan validate uses)
    from planner.app.ranking import RANKING_TARGET
    from planner.app.runs_file import UNSTATED_KEYS, framework_origin, unstated

    lines: list[Any] = []
    summ, oos = v.summary, v.out_of_sample
    ratios = [v.ranks[r.id]["ratio"] for r in v.results if v.ranks.get(r.id, {}).get("ratio")]
    t = Table(title="Predicted vs measured step time")
    cols = ["run", "GPUs", "GPU", "prec", "meas. s", "pred. s", "error", "out of sample",
            "mem GiB"] + (["pub./opt."] if v.ranks else [])
    for col in cols:
        t.add_column(col, justify="left" if col in ("run", "GPU", "prec") else "right")
    for r in v.results:
        style = "red" if abs(r.error) > 0.15 else ("yellow" if abs(r.error) > 0.08 else "")
        style = "dim" if r.held_out else style
        mem = f"{r.report.memory_gib['total']:.1f}" + ("" if r.report.fits else " (!)")
        row = [r.id, str(r.gpus), r.gpu, r.label, f"{r.measured_s:.3f}",
               f"{r.predicted_s:.3f}", f"{100 * r.error:+.1f}%",
               "-" if oos[r.id] is None else f"{100 * oos[r.id]:+.1f}%", mem]
        if v.ranks:
            ratio = v.ranks.get(r.id, {}).get("ratio")
            row.append(f"{ratio:.3f}" if ratio else "-")
        t.add_row(*row, style=style)
    lines.append(t)
    if summ["runs"]:
        lines.append(f"runs: {summ['runs']}   mean |error|: {100 * summ['mean_abs_error']:.1f}%   "
                     f"max |error|: {100 * summ['max_abs_error']:.1f}%   out of sample (fitted "
                     f"without the run's source): mean "
                     f"{100 * summ['mean_abs_error_out_of_sample']:.1f}%, max "
                     f"{100 * summ['max_abs_error_out_of_sample']:.1f}%")
    else:
        lines.append("runs: 0 in the bounded figures (every run is held out or calibration "
                     "only: no error bound)")
    if summ.get("calibration_only"):
        keys = sorted({f"{r.gpu} ({r.calibration_only})" for r in v.results
                       if r.calibration_only})
        lines.append(f"calibration only ({summ['calibration_only']} runs, in sample, out of the "
                     f"figures above): mean |error| "
                     f"{100 * summ['mean_abs_error_calibration_only']:.1f}%, max "
                     f"{100 * summ['max_abs_error_calibration_only']:.1f}%; the runs of "
                     f"{', '.join(keys)}: figures that rest on that source alone, so without it "
                     "there is no fit to judge them out of sample")
    for r in v.results:
        if r.held_out:
            lines.append(f"[dim]{r.id} is held out of the fit and the figures above "
                         f"(error {100 * r.error:+.1f}%): {r.held_out}[/]")
    if summ["held_out"]:
        lines.append(f"held out ({summ['held_out']} runs, never fitted): mean |error| "
                     f"{100 * summ['mean_abs_error_held_out']:.1f}%, max "
                     f"{100 * summ['max_abs_error_held_out']:.1f}%")
    if ratios:
        lines.append(f"ranking (published plan's predicted step / the model's optimum in the run's "
                     f"knob space, solved by {v.solver}): max {summ['max_ranking_ratio']:.3f}, "
                     f"{summ['runs_ranking_within_10pct']} of {len(ratios)} runs within 10%")
        for r in v.results:
            rk = v.ranks.get(r.id, {})
            if (rk.get("ratio") or 0) > RANKING_TARGET:
                terms = ", ".join(f"{k} {x:+.3f} s" for k, x in rk["gap_by_term_s"].items())
                lines.append(f"  {r.id} ({rk['ratio']:.3f}): published {rk['published_s']:.3f} s "
                             f"against {rk['optimum_plan']} {rk['optimum_s']:.3f} s; "
                             f"published minus optimum by term: {terms}; memory headroom "
                             f"{rk['published_headroom_gib']:.1f} GiB published, "
                             f"{rk['optimum_headroom_gib']:.1f} GiB optimum")
    missing = [unstated(run) for run in v.data["runs"]]
    if any(missing):
        counts = {k: sum(k in m for m in missing) for k in UNSTATED_KEYS}
        by_source = sum(framework_origin(run) == "source" for run in v.data["runs"])
        lines.append(f"{sum(map(bool, missing))} of {len(missing)} runs leave settings that change "
                     "the cost unstated, taken from the run's framework (named by the run, or by "
                     f"its source: {by_source} run{'' if by_source == 1 else 's'}) or, with none, "
                     "Megatron-LM's "
                     "command-line defaults (overlaps off but p2p, fp32 gradient reduction, fp32 "
                     "optimizer states): " + ", ".join(f"{k} {n}" for k, n in counts.items() if n)
                     + " (per run: --json, \"unstated\", \"framework\", \"framework_from\")")
    misfits = [r for r in v.results if not r.report.fits]
    for r in misfits:
        lines.append(f"[yellow]{r.id}: the model says this plan does not fit: "
                     f"{'; '.join(r.report.violations)}[/]")
    return lines


def calibration_line(fitted: dict[str, dict[str, float]]) -> str:
    """The parameters ``plan validate --calibrate`` fitted per GPU type, in one line."""
    return ("calibration (minimiser of the mean |error|; see hardware_catalog/*.toml "
            "calibration): " + ", ".join(f"{g}: " + ", ".join(f"{k}={x}" for k, x in f.items())
                                         for g, f in fitted.items()))

"""The ``plan`` command line: thin wrappers that call library functions and print.

Exit codes: 0 success; 2 bad input (file, key, flag); 3 infeasible (the explanation says what
binds); 4 solver failure; 1 anything else the tool reports. No command shows a traceback for a
user error.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.text import Text
from typer.core import TyperGroup

from planner.app.waiting import SolveStatus
from planner.model.errors import InfeasibleError, PlanError

try:                                    # typer >= 0.20 vendors click
    from typer._click.exceptions import UsageError
except ImportError:                     # pragma: no cover - older typer on click
    from click.exceptions import UsageError


class _Group(TyperGroup):
    """The command group: a usage error (an unknown flag, ``--tp 0``) under ``--json`` is also a
    JSON object on stdout, as every other error is."""

    def invoke(self, ctx):
        args = [*getattr(ctx, "_protected_args", []), *ctx.args]
        try:
            return super().invoke(ctx)
        except UsageError as exc:
            if "--json" not in args:
                raise
            exc.show()
            _emit_json({"error": exc.format_message(), "exit_code": exc.exit_code})
            raise typer.Exit(exc.exit_code) from None


app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  rich_markup_mode=None, cls=_Group,
                  help="Provably optimal parallel plans for transformer training (AMPeD model).")
out = Console(width=None if sys.stdout.isatty() else 120)   # readable tables in pipes and logs
err = Console(stderr=True)

def _finite(value: float | None) -> float | None:
    """A number flag is held to the rule for a number in an instance file: finite (click parses
    ``inf`` and ``nan`` as floats, and ``nan`` passes any min/max check)."""
    if value is not None and not math.isfinite(value):
        raise typer.BadParameter(f"{value} is not a finite number")
    return value


def _finite_from(least: float, above: bool = False):
    """:func:`_finite`, then at least ``least`` (with ``above``: greater than it): the range
    checked after finiteness, so that ``nan`` is told it is not a number (typer's own ``min=``
    check said "should be greater than or equal to 0.001" of it)."""
    def check(value: float | None) -> float | None:
        if _finite(value) is not None and (value <= least if above else value < least):
            raise typer.BadParameter(f"{value:g}: expected a number "
                                     f"{'above' if above else 'of at least'} {least:g}")
        return value
    return check


JsonOpt = Annotated[bool, typer.Option("--json", help="machine-readable JSON on stdout")]
SolverOpt = Annotated[str, typer.Option(
    help="cpsat | highs | enumerate, or any MILP solver Pyomo knows (gurobi, scip, cbc)")]
TimeOpt = Annotated[float | None, typer.Option(
    callback=_finite_from(0.001),
    help="seconds per solve; at the limit the best plan found is returned, not proven")]
NodesOpt = Annotated[int | None, typer.Option(min=1, help="override the node count")]
EmitOpt = Annotated[str | None, typer.Option(
    help="write a launch configuration (megatron | nemo | torchtitan | deepspeed) alone on "
         "stdout, byte-exact; the report goes to stderr")]
EmitToOpt = Annotated[Path | None, typer.Option(
    help="with --emit: write the launch configuration to this file instead (the report stays on "
         "stdout)")]
FileArg = Annotated[Path, typer.Argument(metavar="INSTANCE.toml", help="instance TOML file",
                                          show_default=False)]


def _emit_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, default=_json_default) + "\n")


def _json_default(o: Any) -> Any:
    if hasattr(o, "item"):
        return o.item()
    if hasattr(o, "to_dict"):
        return o.to_dict()
    raise TypeError(f"not JSON serialisable: {type(o)}")


def _fail(exc: PlanError, as_json: bool = False, extra: dict[str, Any] | None = None) -> None:
    """Print the error on stderr (and, under ``--json``, as a JSON object on stdout, with the
    ``extra`` keys) and exit with its code."""
    err.print(Text("error: ", style="bold red") + Text(str(exc)), highlight=False, soft_wrap=True)
    if as_json:
        _emit_json(_error_doc(exc) | (extra or {}))
    raise typer.Exit(exc.exit_code)


def _error_doc(exc: PlanError) -> dict[str, Any]:
    doc: dict[str, Any] = {"error": exc.args[0] if exc.args else str(exc),
                           "exit_code": exc.exit_code}
    details = getattr(exc, "problems", None) or getattr(exc, "explanation", None)
    if details:
        doc["details"] = list(details)
    return doc


def _check_emit(emit: str | None, emit_to: Path | None) -> None:
    """``--emit-to`` needs ``--emit``; an unknown format fails before any solve."""
    from planner.app.emit import FORMATS
    from planner.model.errors import InputError

    if emit_to is not None and emit is None:
        raise InputError("--emit-to needs --emit FMT (megatron | nemo | torchtitan | deepspeed)")
    if emit is not None and emit not in FORMATS:
        raise InputError(f"--emit: unknown launch format \"{emit}\"; expected one of: "
                         + ", ".join(FORMATS))
    if emit_to is not None:
        if emit_to.is_dir():
            raise InputError(f"--emit-to: {emit_to} is a directory, expected a file path")
        if not emit_to.parent.exists():
            raise InputError(f"--emit-to: the directory {emit_to.parent} does not exist")


def _write_launch(launch: str, emit_to: Path | None) -> None:
    """The launch configuration, byte for byte, to ``emit_to`` or to stdout (never through the
    rich console: no wrapping, no markup)."""
    if emit_to is None:
        sys.stdout.write(launch)
        sys.stdout.flush()
        return
    from planner.model.errors import InputError

    try:
        emit_to.write_text(launch)
    except OSError as exc:
        raise InputError(f"--emit-to: cannot write {emit_to}: {exc.strerror or exc}") from None


def _load(path: Path, nodes: int | None = None):
    from planner.app.plan_flags import check_flags
    from planner.model.instance import load_instance
    from planner.model.schema import ClusterSpec

    check_flags(ClusterSpec, {"nodes": nodes})
    inst = load_instance(path)
    if nodes is not None:
        inst = inst.with_nodes(nodes)
    return inst


# ---------------------------------------------------------------------------------------------


@app.command()
def evaluate(
    file: FileArg,
    tp: Annotated[int | None, typer.Option(min=1, help="tensor-parallel degree")] = None,
    pp: Annotated[int | None, typer.Option(min=1, help="pipeline-parallel degree")] = None,
    dp: Annotated[int | None, typer.Option(min=1, help="data-parallel degree")] = None,
    cp: Annotated[int | None, typer.Option(min=1, help="context-parallel degree")] = None,
    ep: Annotated[int | None, typer.Option(min=1, help="expert-parallel degree (MoE)")] = None,
    vp: Annotated[int | None, typer.Option(min=1, help="virtual stages per pipeline rank")] = None,
    micro_batch: Annotated[int | None, typer.Option(min=1, help="micro-batch size")] = None,
    global_batch: Annotated[int | None, typer.Option(min=1, help="global batch")] = None,
    recompute: Annotated[str | None, typer.Option(help="none | selective | full")] = None,
    sequence_parallel: Annotated[bool | None, typer.Option(
        "--sp/--no-sp", help="sequence parallelism")] = None,
    distributed_optimizer: Annotated[bool | None, typer.Option(
        "--distributed-optimizer/--no-distributed-optimizer",
        help="dp_sharding optim / none")] = None,
    dp_sharding: Annotated[str | None, typer.Option(
        help="none | optim | optim_grads | optim_grads_params")] = None,
    dp_shard_size: Annotated[int | None, typer.Option(
        min=1, help="HSDP shard group size (a divisor of dp)")] = None,
    reshard_after_forward: Annotated[bool | None, typer.Option(
        "--reshard-after-forward/--no-reshard-after-forward",
        help="FSDP (dp_sharding optim_grads_params): free the gathered parameters after the "
        "forward and gather them again in the backward")] = None,
    overlap_grad_reduce: Annotated[bool | None, typer.Option(
        "--overlap-grad-reduce/--no-overlap-grad-reduce")] = None,
    overlap_param_gather: Annotated[bool | None, typer.Option(
        "--overlap-param-gather/--no-overlap-param-gather")] = None,
    tp_comm_overlap: Annotated[bool | None, typer.Option(
        "--tp-comm-overlap/--no-tp-comm-overlap")] = None,
    overlap_p2p_comm: Annotated[bool | None, typer.Option(
        "--overlap-p2p-comm/--no-overlap-p2p-comm")] = None,
    overlap_moe_expert_parallel_comm: Annotated[bool | None, typer.Option(
        "--overlap-moe-expert-parallel-comm/--no-overlap-moe-expert-parallel-comm",
        help="MoE: overlap the expert all-to-alls with another micro-batch's compute")] = None,
    optimizer_offload: Annotated[bool | None, typer.Option(
        "--optimizer-offload/--no-optimizer-offload",
        help="optimizer states in host memory, the Adam step on the CPU")] = None,
    offload_layers: Annotated[int | None, typer.Option(
        min=0, help="decoder layers whose activations are offloaded to host memory")] = None,
    first_stage_layers: Annotated[int | None, typer.Option(
        min=0, help="decoder layers of the first pipeline stage (0: an even share)")] = None,
    last_stage_layers: Annotated[int | None, typer.Option(
        min=0, help="decoder layers of the last pipeline stage (0: an even share)")] = None,
    account_for_embedding: Annotated[bool | None, typer.Option(
        "--account-for-embedding/--no-account-for-embedding",
        help="the embedding counts as a layer of the pipeline split")] = None,
    account_for_loss: Annotated[bool | None, typer.Option(
        "--account-for-loss/--no-account-for-loss",
        help="the loss counts as a layer of the pipeline split")] = None,
    recompute_layers: Annotated[int | None, typer.Option(
        min=0, help="with --recompute full: layers of each virtual stage recomputed (0: all)")
    ] = None,
    pipeline_layout: Annotated[str | None, typer.Option(
        help="Megatron-Core's layout string, e.g. 'Et*4|(t*4|)*14tmL' (vp follows from it; "
        "replaces [plan]'s first / last stage counts and account flags)")] = None,
    nodes: NodesOpt = None,
    vs_optimum: Annotated[bool, typer.Option(
        "--vs-optimum", help="also solve for the optimum and print how far this plan is")
    ] = False,
    solver: SolverOpt = "cpsat",
    time_limit: TimeOpt = None,
    emit: EmitOpt = None,
    emit_to: EmitToOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Evaluate the plan in [plan] (flags override any knob): step time, memory, MFU, days, cost.
    Exit 3 when the plan breaks a structural rule or does not fit (the report lists why)."""
    from planner.model.evaluate import evaluate as run_evaluate
    from planner.model.errors import InputError
    from planner.app.plan_flags import check_plan_flags, plan_with_flags
    from planner.app.report import print_step

    # the knobs the flags override ([plan]'s keys; planner/app/plan_flags.py combines them)
    knobs = dict(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, vp=vp, micro_batch=micro_batch,
                 global_batch=global_batch, recompute=recompute,
                 sequence_parallel=sequence_parallel,
                 distributed_optimizer=distributed_optimizer,
                 overlap_grad_reduce=overlap_grad_reduce,
                 overlap_param_gather=overlap_param_gather, tp_comm_overlap=tp_comm_overlap,
                 overlap_p2p_comm=overlap_p2p_comm,
                 overlap_moe_expert_parallel_comm=overlap_moe_expert_parallel_comm,
                 dp_sharding=dp_sharding, dp_shard_size=dp_shard_size,
                 reshard_after_forward=reshard_after_forward,
                 optimizer_offload=optimizer_offload, offload_layers=offload_layers,
                 first_stage_layers=first_stage_layers, last_stage_layers=last_stage_layers,
                 account_for_embedding=account_for_embedding,
                 account_for_loss=account_for_loss, recompute_layers=recompute_layers,
                 pipeline_layout=pipeline_layout)
    try:
        _check_emit(emit, emit_to)
        from formulations.solve import check_backend
        check_backend(solver)           # a bad name is bad input, whether or not it solves
        if time_limit is not None and not vs_optimum:
            raise InputError("--time-limit: only with --vs-optimum (the solve of the optimum); "
                             "evaluating a plan solves nothing")
        check_plan_flags(knobs)
        inst = _load(file, nodes)
        spec, plan, notes = plan_with_flags(inst, knobs, nodes)
        rep = run_evaluate(inst, plan, spec=spec)
        best = None
        if vs_optimum:
            from formulations.solve import solve as run_solve

            with SolveStatus(err, file.name):
                best = run_solve(inst, solver=solver, time_limit=time_limit)
        # a plan that breaks a rule or does not fit gets no launch configuration: it would not
        # run as written (a fractional replica count, an out-of-memory job)
        launch = _emit_text(inst, plan, emit) if emit and not rep.violations else None
        if launch is not None and (emit_to is not None or not as_json):
            _write_launch(launch, emit_to)
    except PlanError as exc:
        _fail(exc, as_json)
    gap = (rep.step_time_s / best.report.step_time_s - 1) if best and best.report else None
    if as_json:
        doc = rep.to_dict()
        if best:
            doc["optimum"] = best.to_dict()
            doc["slower_than_optimum_by"] = gap
            # (false: the solve stopped at --time-limit; "optimum" is the best plan it found)
            doc["optimum_proven"] = best.proven
        if launch:
            doc["launch"] = {"format": emit, "text": launch}
        if notes:               # (the text report's "note:" lines on stderr)
            doc["notes"] = notes
        if rep.violations:
            doc.update(error="the plan breaks a structural rule or does not fit (see violations)",
                       exit_code=3)
        _emit_json(doc)
    else:
        console = err if (emit is not None and emit_to is None) else out   # stdout: the config alone
        print_step(rep, inst, console)
        for said in notes:
            err.print(f"note: {said}", markup=False, highlight=False)
        if best:                 # (the queries' words, loaded only when an optimum was asked)
            from formulations.queries import no_plan_words, time_limit_advice
            from formulations.result import Status

            if not best.report:
                err.print(f"note: the optimum could not be computed "
                          f"{no_plan_words(best, time_limit)}", markup=False, highlight=False)
            elif best.status != Status.FEASIBLE:
                console.print(f"The optimum under the same constraints is "
                              f"{best.report.plan.label()} at {best.report.step_time_s:.4g} s "
                              f"per step ({best.status.value}); this plan is "
                              f"{100 * gap:+.2f}% slower.", markup=False, highlight=False)
            else:                # stopped at the time limit with a plan, not proven
                console.print(f"The best plan found under the same constraints is "
                              f"{best.report.plan.label()} at {best.report.step_time_s:.4g} s "
                              f"per step ({best.status.value}: the solver stopped at the time "
                              f"limit, not proven optimal; {time_limit_advice(time_limit)}); "
                              f"this plan is {100 * gap:+.2f}% slower than it.", markup=False,
                              highlight=False)
        if emit_to is not None and launch is not None:
            console.print(f"launch configuration ({emit}) written to {emit_to}", markup=False,
                          highlight=False)
    if rep.violations:            # the report says which rules or limits the plan breaks
        if emit:
            err.print(f"no launch configuration ({emit}) written: the plan breaks the limits "
                      "listed in the report", markup=False, highlight=False)
        raise typer.Exit(3)


@app.command()
def validate(
    runs: Annotated[Path | None, typer.Argument(
        metavar="RUNS.toml", help="runs TOML (default: the shipped published runs)")] = None,
    calibrate: Annotated[bool, typer.Option(
        "--calibrate", help="also print the parameters fitted per GPU type")] = False,
    rank: Annotated[bool, typer.Option(
        "--ranking/--no-ranking", help="solve each run's knob space and report the published "
        "plan's step time over the model's optimum")] = True,
    solver: Annotated[str, typer.Option(
        help="the solver of the ranking's and the measured sets' optima: enumerate (each run's "
             "space is small, its GPUs and global batch fixed: the exhaustive walk proves them "
             "in seconds), cpsat, highs, or any MILP solver Pyomo knows")] = "enumerate",
    alternatives_file: Annotated[Path | None, typer.Option(
        "--alternatives", metavar="SETS.toml", help="sets of plans measured on one cluster "
        "(the format of planner/data/measured_alternatives.toml): how the model orders them "
        "(default: the shipped sets, with the shipped runs only)")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Predicted vs measured step time for every published run: error in sample, error out of
    sample (parameters fitted without the run's source) and the ranking ratio; and how the
    model orders sets of plans measured on one cluster."""
    from formulations.solve import check_backend
    from planner.app import alternatives, memory_peaks
    from planner.app.report import (alternatives_summary, alternatives_table, calibration_line,
                                    validation_lines)
    from planner.app.runs_file import load_runs
    from planner.app.validate import validate_file

    try:
        check_backend(solver)           # a bad name is bad input, whether or not it solves
        with SolveStatus(err, runs.name if runs else "the shipped runs", verb="ranking"):
            res = validate_file(load_runs(runs), rank=rank, solver=solver, calibrate=calibrate)
        # the shipped sets of measured alternatives go with the shipped runs
        alts = (alternatives.evaluate_sets(alternatives.load_sets(alternatives_file),
                                           optimum=rank, solver=solver)
                if alternatives_file is not None or runs is None else [])
        # so do the allocator peaks of Megatron-LM's CI
        peaks = memory_peaks.compare(memory_peaks.load()) if runs is None else []
    except PlanError as exc:
        _fail(exc, as_json)
    if as_json:
        _emit_json({"runs": res.runs_json(), "summary": res.summary,
                    "calibration": res.fitted,
                    "alternatives": [a.as_json() for a in alts],
                    "megatron_ci_memory": {"runs": [p.as_json() for p in peaks],
                                           "summary": memory_peaks.summary(peaks)}
                    if peaks else None})
        return
    for line in validation_lines(res):
        out.print(line)
    for a in alts:
        out.print(alternatives_table(a))
        out.print(alternatives_summary(a))
    if peaks:
        out.print(memory_peaks.summary_text(memory_peaks.summary(peaks)))
    if res.fitted:
        out.print(calibration_line(res.fitted))


def _compare_without_a_plan(exc: InfeasibleError, inst, solver: str, time_limit: float | None,
                            workers: int | None, as_json: bool) -> None:
    """``plan solve --compare`` where the constraints leave no plan: what binds (the
    explanation, on stderr) and the comparison, whose constrained side is null: the optimum
    without the what-ifs and each constraint whose lifting alone gives a plan, with its step
    time (the contract's ``"constrained": null``). Exit 3, as without ``--compare``; where the
    comparison has nothing to add (no plan without the what-ifs either), the error alone."""
    from formulations import queries
    from formulations.pool import workers_or_default
    from planner.app.report import compare_table

    try:
        with SolveStatus(err, Path(inst.source).name):
            cmp = queries.compare(inst, solver=solver, time_limit=time_limit, constrained=exc,
                                  workers=workers_or_default(workers))
    except PlanError:
        return                   # (the caller raises the constrained solve's own error)
    if not as_json:
        out.print(compare_table(cmp))
    _fail(exc, as_json, extra={"compare": cmp.to_dict()})


@app.command()
def solve(
    file: FileArg,
    solver: SolverOpt = "cpsat",
    time_limit: TimeOpt = None,
    nodes: NodesOpt = None,
    compare: Annotated[bool, typer.Option(
        "--compare", help="also solve without the [constraints] what-ifs; show what binds")
    ] = False,
    top: Annotated[int, typer.Option(min=1, help="list the K best distinct plans (at most 100, "
                                                  "each a solve)")] = 1,
    workers: Annotated[int | None, typer.Option(
        min=1, help="with --compare: its solves side by side, one process each (default: the "
        "cores)")] = None,
    emit: EmitOpt = None,
    emit_to: EmitToOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """The fastest plan under the model, with its optimality certificate."""
    from formulations import queries
    from formulations.pool import workers_or_default
    from formulations.result import Status
    from formulations.solve import solve as run_solve
    from planner.app.report import compare_table, print_step, solver_panel, top_table
    from planner.model.errors import InputError

    try:
        if workers is not None and not compare:
            raise InputError("--workers: only with --compare (its solves side by side); one "
                             "solve runs in one process")
        _check_emit(emit, emit_to)
        inst = _load(file, nodes)
        _single_size(inst, nodes)
        if emit and inst.spec.constraints.framework is None:
            # the plan will run on that framework: search what it runs, with its defaults, so
            # the export says the mode the model costed
            inst = inst.with_spec(constraints=inst.spec.constraints.model_copy(
                update={"framework": emit}))
        try:
            with SolveStatus(err, file.name):
                ranked = (queries.top_k(inst, top, solver=solver, time_limit=time_limit)
                          if top > 1 else None)
                res = ranked[0] if top > 1 else run_solve(inst, solver=solver,
                                                          time_limit=time_limit)
        except InfeasibleError as exc:
            if compare:
                _compare_without_a_plan(exc, inst, solver, time_limit, workers, as_json)
            raise
        # (the constrained optimum is the solve above, or the list's first plan under --top:
        # the plan the report shows, not solved again, and the cap of compare's other solves)
        with SolveStatus(err, file.name):
            cmp = queries.compare(inst, solver=solver, time_limit=time_limit, constrained=res,
                                  workers=workers_or_default(workers)) if compare else None
        launch = _emit_text(inst, res.report.plan, emit) if (emit and res.report) else None
        if launch is not None and (emit_to is not None or not as_json):
            _write_launch(launch, emit_to)
    except PlanError as exc:
        _fail(exc, as_json)
    failed = res.report is None or res.status == Status.ERROR
    if failed:
        why = f"the solver returned no usable plan {queries.no_plan_words(res, time_limit)}"
        err.print(f"error: {why}", markup=False, highlight=False)
    if as_json:
        doc = res.to_dict()
        if ranked and not failed:
            doc["top"] = [dict(r.to_dict(), gap_to_optimum=_gap(r, ranked[0])) for r in ranked]
            # (false: a solve stopped at the time limit with a plan; the list is in solve
            # order, its gaps are to the first plan found)
            doc["top_proven"] = all(r.proven for r in ranked)
            if ranked.ended:
                doc["top_ended"] = ranked.ended
        if cmp:
            doc["compare"] = cmp.to_dict()
        if launch:
            doc["launch"] = {"format": emit, "text": launch}
        if failed:
            doc.update(error=why, exit_code=4)
        _emit_json(doc)
    else:
        console = err if (launch is not None and emit_to is None) else out
        extra = [solver_panel(res)]
        if ranked and not failed:
            extra.append(top_table(ranked))
            if ranked.ended:
                err.print(f"--top {top}: {len(ranked)} plan{'s' * (len(ranked) > 1)} listed; "
                          f"{ranked.ended}", markup=False, highlight=False)
        if cmp:
            extra.append(compare_table(cmp))
        if res.report is None:
            console.print(*extra)
        else:
            print_step(res.report, inst, console, extra=extra)
        if emit and res.report is None:
            err.print("no launch configuration: the solver returned no plan", markup=False,
                      highlight=False)
        if emit_to is not None and launch is not None:
            console.print(f"launch configuration ({emit}) written to {emit_to}", markup=False,
                          highlight=False)
    if failed:
        raise typer.Exit(4)


def _gap(r, best) -> float:
    return r.objective / best.objective - 1


def _emit_text(inst, plan, fmt: str) -> str:
    from planner.app.emit import emit as run_emit

    return run_emit(inst, plan, fmt)


@app.command()
def pareto(
    file: FileArg,
    solver: SolverOpt = "cpsat",
    time_limit: TimeOpt = None,
    plot: Annotated[Path | None, typer.Option(help="write a PNG of the front")] = None,
    workers: Annotated[int | None, typer.Option(
        min=1, help="sizes solved side by side, one process each (default: the cores)")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Proven optimum at every node count of [cluster] nodes = [lo, hi] (or node_counts), and
    the front: the sizes no other size beats on both training days and dollars (time per
    sequence without training.tokens, GPU-seconds per sequence without a price)."""
    from formulations import queries
    from formulations.pool import workers_or_default
    from planner.app.report import caveat_lines, front_basis_lines, pareto_table, sizes_text

    try:
        if plot:
            from planner.app.plot import check_plot_path

            check_plot_path(plot)
        inst = _load(file)
        with SolveStatus(err, file.name):
            points = queries.pareto(inst, solver=solver, time_limit=time_limit,
                                    workers=workers_or_default(workers))
        docs = [p.to_dict() for p in points]
        if plot and any(d.get("plan") for d in docs):
            from planner.app.plot import plot_front

            plot_front([d for d in docs if d.get("plan")], plot,
                       f"{inst.model.name or 'model'} on {inst.hw.gpu.name}")
    except PlanError as exc:
        _fail(exc, as_json)
    none_fits = not any(p.result is not None for p in points)
    stopped = [p.nodes for p in points if p.stopped]
    stop_msg = (f"at {sizes_text(stopped)} the solver stopped at the time limit without a plan; "
                + queries.time_limit_advice(time_limit)) if stopped else ""
    # sizes whose solve stopped with a plan: the best found there, not a proven optimum
    unproven = [p.nodes for p in points if p.result is not None and not p.result.proven]
    # without any plan, the sizes that stopped are why there is no answer (exit 4); the others
    # are proven infeasible (exit 3, each size's reason in its row)
    none_msg, none_code = (
        (f"no size in the range has a plan: {stop_msg}", 4) if stopped else
        ("no size in the range admits a plan (each size's reason is in its row)", 3))
    if as_json:
        doc = {"points": [d for d in docs if d.get("on_front")], "all": docs,
               # (false: a size's plan or a size's absence is the time limit's, not a proof)
               "proven": not stopped and not unproven}
        if none_fits:
            doc.update(error=none_msg, exit_code=none_code)
        _emit_json(doc)
    else:
        out.print(pareto_table(points, batch_range=not isinstance(
            inst.spec.training.global_batch, int)))
        for line in front_basis_lines(inst):
            out.print(Text(line, style="dim"), soft_wrap=True)
        for line in caveat_lines(points):
            out.print(Text(line, style="yellow"), soft_wrap=True)
    if none_fits:
        err.print(f"error: {none_msg}", markup=False, highlight=False)
        if not as_json:
            _print_why(docs)
        raise typer.Exit(none_code)
    if stopped:        # a front without those sizes: any of them might have been on it
        err.print(f"note: the front leaves out {stop_msg}", markup=False, highlight=False)
    if unproven:       # a front of the plans found: a size's optimum may be faster
        err.print(f"note: at {sizes_text(unproven)} the solver stopped at the time limit with "
                  "a plan, not proven optimal: those rows are the best plans it found and the "
                  "front is drawn from them; " + queries.time_limit_advice(time_limit),
                  markup=False, highlight=False)
    if plot and not as_json:
        out.print(f"plot written to {plot}", markup=False, highlight=False)


@app.command()
def capacity(
    file: FileArg,
    deadline_days: Annotated[float, typer.Option(
        callback=_finite_from(0, above=True), help="train the token budget within this many days")],
    budget_usd: Annotated[float | None, typer.Option(
        callback=_finite_from(0), help="also find the cheapest plan meeting the deadline and "
        "check this budget (solves every larger size of the range too: slower)")
    ] = None,
    solver: SolverOpt = "cpsat",
    time_limit: TimeOpt = None,
    workers: Annotated[int | None, typer.Option(
        min=1, help="sizes solved ahead side by side, one process each, read in order "
        "(default: the cores)")] = None,
    as_json: JsonOpt = False,
) -> None:
    """The fewest nodes (in the instance's range) whose optimal plan meets the deadline."""
    from formulations import queries
    from formulations.pool import workers_or_default
    from formulations.result import Status
    from planner.app.report import capacity_panel, print_step, sizes_text
    from planner.model.words import plural

    try:
        inst = _load(file)
        with SolveStatus(err, file.name):
            ans = queries.capacity(inst, deadline_days, solver=solver, time_limit=time_limit,
                                   budget_usd=budget_usd, workers=workers_or_default(workers))
    except PlanError as exc:
        _fail(exc, as_json)
    over = bool(ans.cheapest and not ans.cheapest["within_budget"])
    missed = ans.result is None or over
    deadline = plural(ans.deadline_days, "day")
    advice = queries.time_limit_advice(time_limit)
    stop_msg = (f"at {sizes_text(ans.unproven)} the solver stopped at the time limit without a "
                f"proven answer; {advice}") if ans.unproven else ""
    cheap_unproven = (ans.cheapest or {}).get("unproven") or []
    cheap_msg = (f"at {sizes_text(cheap_unproven)} the solver stopped at the time limit before "
                 f"ruling out a cheaper plan; {advice}") if cheap_unproven else ""
    details: list[str] = []
    if ans.result is None and ans.unproven:     # no answer because sizes stopped: exit 4
        error, code = f"no size in the range is proven to meet {deadline}: {stop_msg}", 4
    elif ans.result is None:
        error, code = ans.miss_reason(), 3
        details = _why_lines(ans.without_plan) if ans.none_has_a_plan else []
    else:
        ch = ans.cheapest or {}
        error = (f"the cheapest plan meeting the deadline, {plural(ch.get('nodes', 0), 'node')} "
                 f"at ${ch.get('cost') or 0:,.0f}, is over the ${budget_usd or 0:,.0f} budget")
        code = 3
        if over and cheap_unproven:             # a cheaper plan is not ruled out: no verdict
            error, code = f"{error} as far as proven: {cheap_msg}", 4
    if as_json:
        doc = ans.to_dict()
        if missed:
            doc.update(error=error, exit_code=code)
            if details:
                doc["details"] = details
        _emit_json(doc)
    elif ans.result is not None:
        print_step(ans.result.report, inst.at_size(ans.nodes), out,
                   extra=[capacity_panel(ans)])
    else:
        out.print(capacity_panel(ans))
    sys.stdout.flush()            # the report before the notes and the error on stderr
    if ans.result is not None and ans.result.status == Status.FEASIBLE:
        err.print(f"note: the plan on {plural(ans.nodes, 'node')} meets the "
                  f"deadline but is not proven the fastest there (the solver stopped at the time "
                  f"limit; {advice})", markup=False, highlight=False)
    if ans.result is not None and ans.unproven:  # a smaller size might have met the deadline
        err.print(f"note: {ans.nodes} nodes is not proven the fewest: {stop_msg}", markup=False,
                  highlight=False)
    if cheap_unproven and not (missed and code == 4):
        err.print(f"note: the cheapest plan is not proven the cheapest: {cheap_msg}",
                  markup=False, highlight=False)
    if missed:
        err.print(f"error: {error}", markup=False, highlight=False, soft_wrap=True)
        if not as_json:
            _print_why(ans.without_plan if ans.none_has_a_plan else [])
        raise typer.Exit(code)


def _why_groups(entries: list[dict[str, Any]]) -> dict[tuple[str, ...], list[int]]:
    """What binds at sizes without a plan (``{"nodes", "detail"}`` entries), once per distinct
    explanation, with the sizes it holds for."""
    why: dict[tuple[str, ...], list[int]] = {}
    for d in entries:
        if d.get("detail"):
            why.setdefault(tuple(d["detail"]), []).append(d["nodes"])
    return why


def _why_lines(entries: list[dict[str, Any]]) -> list[str]:
    """:func:`_why_groups` as one string per line of explanation, for ``--json``'s details."""
    from planner.app.report import sizes_text

    return [f"at {sizes_text(sizes)}: {line}"
            for lines, sizes in _why_groups(entries).items() for line in lines]


def _print_why(entries: list[dict[str, Any]]) -> None:
    """:func:`_why_groups` on stderr, under the error line (the table's rows and the capacity
    panel carry only each size's one-line reason; --json has each size's detail)."""
    from planner.app.report import sizes_text

    for lines, sizes in _why_groups(entries).items():
        err.print(f"at {sizes_text(sizes)}:", markup=False, highlight=False, soft_wrap=True)
        for line in lines:
            err.print(f"  - {line}", markup=False, highlight=False, soft_wrap=True)


@app.command()
def sweep(
    file: Annotated[Path, typer.Argument(metavar="SWEEP.toml", help="sweep TOML file",
                                         show_default=False)],
    engine: Annotated[str, typer.Option(help="local (a process pool) | ray")] = "local",
    workers: Annotated[int | None, typer.Option(
        min=1, help="parallel points (default: the cores; Ray local: its CPUs)")] = None,
    address: Annotated[str | None, typer.Option(
        help="Ray cluster to join: auto | HOST:PORT (default: start Ray locally)")] = None,
    out_file: Annotated[Path | None, typer.Option(
        "--out", help="results file, .csv or .parquet: rows appended as points finish; "
        "re-running skips the points it holds")] = None,
    plot: Annotated[Path | None, typer.Option(help="write a figure of the results (PNG)")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Run the planning query of SWEEP.toml at every point of its grid ([sweep]: dotted
    instance keys -> lists). Bad axes are reported before anything runs (exit 2); an
    infeasible or failing point is a row with its reason; Ctrl-C keeps every finished point
    (exit 130) and the same command resumes. Exit 4 when some point's solver failed."""
    from planner.app import sweep as sw
    from planner.app.sweep_output import check_out_path

    try:
        if plot:
            from planner.app.plot import check_plot_path

            check_plot_path(plot)
        if out_file:
            check_out_path(out_file)
        spec = sw.load_sweep(file)
        with sw.RichProgress(err, f"{file.name}") as bar:
            run = sw.run_sweep(spec, engine=engine, workers=workers, address=address,
                               out=out_file, progress=bar)
        # a sweep without any plan is an answer (each row says why), not an error: no figure
        drawn = bool(plot and any(r.get("plan_label") for r in run.rows))
        plot_warnings: list[str] = []
        if drawn:
            from planner.app.sweep_plot import plot_sweep

            plot_warnings = plot_sweep(run.rows, spec, plot)
    except PlanError as exc:
        _fail(exc, as_json)
    counts = ", ".join(f"{n} {s}" for s, n in sorted(run.counts().items()))
    failure = "" if run.interrupted else _sweep_failure(run.counts(), spec.time_limit)
    if as_json:
        doc = dict(run.to_dict(), out=str(out_file) if out_file else None,
                   plot=str(plot) if drawn else None)
        if failure:
            doc.update(error=failure, exit_code=4)
        _emit_json(doc)
    else:
        out.print(sw.rows_table(run))
        if len(run.rows) > 60:
            out.print(f"(first 60 of {len(run.rows)} rows"
                      + (f"; all in {out_file})" if out_file else ")"), markup=False)
    sys.stdout.flush()            # the table before the summary line on stderr
    # (pareto: a row per size of each point, and the counts are of rows)
    rows_of = f", {len(run.rows)} rows" if spec.query == "pareto" else ""
    err.print(f"{len(spec.points)} points ({run.ran} run now, {run.resumed} already in the "
              f"output){rows_of}: {counts}; {run.wall_s:.1f} s"
              + (f"; results in {out_file}" if out_file else "")
              + (f"; figure in {plot}" if drawn else ""), markup=False,
              highlight=False)
    if plot and not drawn:
        err.print(f"note: no figure written to {plot}: no point has a plan", markup=False,
                  highlight=False)
    for w in plot_warnings:
        err.print(f"warning: {w}", markup=False, highlight=False)
    for note in run.notes:
        err.print(f"note: {note}", markup=False, highlight=False)
    if run.foreign:
        err.print(f"note: {run.foreign} row(s) of {out_file} are not points of this sweep; kept",
                  markup=False, highlight=False)
    if run.interrupted:
        err.print(f"interrupted: {run.ran + run.resumed} of {len(spec.points)} points done"
                  + (f", saved in {out_file}; run the same command to resume" if out_file else ""),
                  markup=False, highlight=False)
        raise typer.Exit(130)
    if failure:
        err.print(f"error: {failure}", markup=False, highlight=False)
        raise typer.Exit(4)


def _sweep_failure(counts: dict[str, int], time_limit: float | None) -> str:
    """Why a finished sweep exits 4 ("" when it does not): rows whose solver failed, and rows
    whose solver stopped at ``[sweep] time_limit`` without a plan, an answer missing as it is
    when ``plan solve`` exits 4 (docs/sweeps.md); infeasible rows are answers."""
    from planner.model.words import plural

    parts = []
    if counts.get("error"):
        parts.append(f"{plural(counts['error'], 'row')} failed (solver.status error; each row's "
                     "reason says why)")
    if counts.get("no_solution_in_limit"):
        parts.append(f"{plural(counts['no_solution_in_limit'], 'row')} stopped at the time "
                     "limit without a plan (solver.status no_solution_in_limit); raise [sweep] "
                     "time_limit" + (f" (it was {time_limit:g} s)" if time_limit else ""))
    return "; ".join(parts)


def _single_size(inst, nodes: int | None) -> None:
    """``solve`` answers for one cluster size: a range needs ``--nodes``. The message names the
    key the file used (``nodes = [lo, hi]`` or ``node_counts``)."""
    from planner.model.errors import InputError

    if nodes is None and len(inst.node_options) > 1:
        key = ("cluster.node_counts lists several sizes"
               if inst.spec.cluster.node_counts is not None else "cluster.nodes gives a range")
        raise InputError(f"{inst.source}: {key}; pass --nodes N for a single size, or use "
                         "plan pareto / plan capacity")


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """Warnings as one line, ``warning: ...``, without the source line Python would print."""
    err.print(Text(f"warning: {message}", style="yellow"), highlight=False, soft_wrap=True)


def main() -> None:
    """Console-script entry point."""
    import warnings

    warnings.showwarning = _show_warning
    try:
        app()
    except PlanError as exc:  # a last guard: no tracebacks for domain errors
        err.print(Text(f"error: {exc}"), highlight=False, soft_wrap=True)
        if "--json" in sys.argv[1:]:
            _emit_json(_error_doc(exc))
        sys.exit(exc.exit_code)
    except OSError as exc:    # e.g. stdout on a full disk or a closed pipe
        sys.stderr.write(f"error: cannot write the output: {exc.strerror or exc}\n")
        sys.exit(1)


if __name__ == "__main__":
    main()

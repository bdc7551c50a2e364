"""The ``plan`` command line: thin wrappers that call library functions and print.

Exit codes: 0 success; 2 bad input (file, key, flag); 3 infeasible (the explanation says what
binds); 4 solver failure; 1 anything else the tool reports. No command shows a traceback for a
user error.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from planner.errors import PlanError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  rich_markup_mode=None,
                  help="Provably optimal parallel plans for transformer training (AMPeD model).")
out = Console(width=None if sys.stdout.isatty() else 120)   # readable tables in pipes and logs
err = Console(stderr=True)

JsonOpt = Annotated[bool, typer.Option("--json", help="machine-readable JSON on stdout")]
SolverOpt = Annotated[str, typer.Option(
    help="cpsat | highs | enumerate | cpsat-element, or any MILP solver Pyomo knows (gurobi, scip, cbc)")]
TimeOpt = Annotated[float | None, typer.Option(
    min=0.001, help="seconds per solve; at the limit the best plan found is returned, not proven")]
NodesOpt = Annotated[int | None, typer.Option(min=1, help="override the node count")]
EmitOpt = Annotated[str | None, typer.Option(
    help="print a launch configuration: megatron | nemo | torchtitan | deepspeed")]
FileArg = Annotated[Path, typer.Argument(help="instance TOML file", show_default=False)]


def _emit_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, default=_json_default) + "\n")


def _json_default(o: Any) -> Any:
    if hasattr(o, "item"):
        return o.item()
    if hasattr(o, "to_dict"):
        return o.to_dict()
    raise TypeError(f"not JSON serialisable: {type(o)}")


def _fail(exc: PlanError) -> None:
    err.print(Text("error: ", style="bold red") + Text(str(exc)), highlight=False, soft_wrap=True)
    raise typer.Exit(exc.exit_code)


def _load(path: Path, nodes: int | None = None):
    from planner.instance import load_instance

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
    vp: Annotated[int | None, typer.Option(min=1, help="virtual stages per pipeline rank")] = None,
    micro_batch: Annotated[int | None, typer.Option(min=1, help="micro-batch size")] = None,
    global_batch: Annotated[int | None, typer.Option(min=1, help="global batch")] = None,
    recompute: Annotated[str | None, typer.Option(help="none | selective | full")] = None,
    sequence_parallel: Annotated[bool | None, typer.Option(
        "--sp/--no-sp", help="sequence parallelism")] = None,
    distributed_optimizer: Annotated[bool | None, typer.Option(
        "--distributed-optimizer/--no-distributed-optimizer")] = None,
    nodes: NodesOpt = None,
    vs_optimum: Annotated[bool, typer.Option(
        "--vs-optimum", help="also solve for the optimum and print how far this plan is")
    ] = False,
    solver: SolverOpt = "cpsat",
    emit: EmitOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Evaluate the plan in [plan] (flags override any knob): step time, memory, MFU, days, cost.
    Exit 3 when the plan breaks a structural rule or does not fit (the report lists why)."""
    from planner.evaluator import evaluate as run_evaluate
    from planner.plan import plan_from_spec
    from planner.report import print_step
    from planner.schema import RECOMPUTE_MODES, PlanSpec

    try:
        if recompute is not None and recompute not in RECOMPUTE_MODES:
            from planner.errors import InputError

            raise InputError(f"--recompute: expected one of {', '.join(RECOMPUTE_MODES)}, "
                             f"got {recompute!r}")
        inst = _load(file, nodes)
        spec = inst.spec.plan or PlanSpec()
        plan = plan_from_spec(inst, spec, tp=tp, pp=pp, dp=dp, cp=cp, vp=vp,
                              micro_batch=micro_batch, global_batch=global_batch,
                              recompute=recompute, sequence_parallel=sequence_parallel,
                              distributed_optimizer=distributed_optimizer)
        rep = run_evaluate(inst, plan, spec=spec)
        best = None
        if vs_optimum:
            from formulations.solve import solve as run_solve

            best = run_solve(inst, solver=solver)
        launch = _emit_text(inst, plan, emit) if emit else None
    except PlanError as exc:
        _fail(exc)
    gap = (rep.step_time_s / best.report.step_time_s - 1) if best and best.report else None
    if as_json:
        doc = rep.to_dict()
        if best:
            doc["optimum"] = best.to_dict()
            doc["slower_than_optimum_by"] = gap
        if launch:
            doc["launch"] = {"format": emit, "text": launch}
        _emit_json(doc)
    else:
        print_step(rep, inst, out)
        if best and not best.report:
            err.print(f"note: the optimum could not be computed ({best.status.value}"
                      + (f": {best.note}" if best.note else "") + ")", markup=False, highlight=False)
        if best and best.report:
            out.print(f"The optimum under the same constraints is {best.report.plan.label()} at "
                      f"{best.report.step_time_s:.4g} s per step ({best.status.value}); this "
                      f"plan is {100 * gap:+.2f}% slower.", markup=False, highlight=False)
        if launch:
            out.print(f"# launch configuration ({emit})", markup=False, highlight=False)
            out.print(launch, markup=False, highlight=False)
    if rep.violations:            # the report says which rules or limits the plan breaks
        raise typer.Exit(3)


@app.command()
def validate(
    runs: Annotated[Path | None, typer.Argument(
        help="runs TOML (default: the shipped published runs)")] = None,
    calibrate: Annotated[bool, typer.Option(
        "--calibrate", help="also fit one efficiency per GPU type and print it")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Predicted vs measured step time for every published run, with mean and max error."""
    from planner import validate as v

    try:
        data = v.load_runs(runs)
        results = v.validate_runs(data)
        fitted = v.calibrate(data) if calibrate else None
    except PlanError as exc:
        _fail(exc)
    summ = v.summary(results)
    if as_json:
        _emit_json({"runs": [{"id": r.id, "gpu": r.gpu, "precision": r.precision, "gpus": r.gpus,
                              "measured_s": r.measured_s, "predicted_s": r.predicted_s,
                              "error": r.error, "fits": r.report.fits,
                              "memory_gib": r.report.memory_gib["total"], "source": r.source}
                             for r in results], "summary": summ, "calibration": fitted})
        return
    t = Table(title="Predicted vs measured step time")
    for col in ("run", "GPUs", "GPU", "prec", "measured s", "predicted s", "error", "mem GiB"):
        t.add_column(col, justify="left" if col in ("run", "GPU", "prec") else "right")
    for r in results:
        style = "red" if abs(r.error) > 0.15 else ("yellow" if abs(r.error) > 0.08 else "")
        mem = f"{r.report.memory_gib['total']:.1f}" + ("" if r.report.fits else " (!)")
        t.add_row(r.id, str(r.gpus), r.gpu, r.precision, f"{r.measured_s:.3f}",
                  f"{r.predicted_s:.3f}", f"{100 * r.error:+.1f}%", mem, style=style)
    out.print(t)
    out.print(f"runs: {summ['runs']}   mean |error|: {100 * summ['mean_abs_error']:.1f}%   "
              f"max |error|: {100 * summ['max_abs_error']:.1f}%")
    misfits = [r for r in results if not r.report.fits]
    for r in misfits:
        out.print(f"[yellow]{r.id}: the model says this plan does not fit: "
                  f"{'; '.join(r.report.violations)}[/]")
    if fitted:
        out.print("calibration (minimiser of the mean |error| per GPU type): "
                  + ", ".join(f"{g}: " + ", ".join(f"{k}={x}" for k, x in f.items())
                              for g, f in fitted.items()))


@app.command()
def solve(
    file: FileArg,
    solver: SolverOpt = "cpsat",
    time_limit: TimeOpt = None,
    nodes: NodesOpt = None,
    compare: Annotated[bool, typer.Option(
        "--compare", help="also solve without the [constraints] what-ifs; show what binds")
    ] = False,
    top: Annotated[int, typer.Option(min=1, help="list the K best distinct plans")] = 1,
    emit: EmitOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """The fastest plan under the model, with its optimality certificate."""
    from formulations import queries
    from formulations.result import Status
    from formulations.solve import solve as run_solve
    from planner.report import compare_table, print_step, solver_panel, top_table

    try:
        inst = _load(file, nodes)
        _single_size(inst, nodes)
        if top > 1:
            ranked = queries.top_k(inst, top, solver=solver, time_limit=time_limit)
            res = ranked[0]
        else:
            ranked = None
            res = run_solve(inst, solver=solver, time_limit=time_limit)
        cmp = queries.compare(inst, solver=solver, time_limit=time_limit) if compare else None
        launch = _emit_text(inst, res.report.plan, emit) if (emit and res.report) else None
    except PlanError as exc:
        _fail(exc)
    if as_json:
        doc = res.to_dict()
        if ranked:
            doc["top"] = [dict(r.to_dict(), gap_to_optimum=_gap(r, ranked[0])) for r in ranked]
        if cmp:
            doc["compare"] = cmp.to_dict()
        if launch:
            doc["launch"] = {"format": emit, "text": launch}
        _emit_json(doc)
    else:
        extra = [solver_panel(res)]
        if ranked:
            extra.append(top_table(ranked))
        if cmp:
            extra.append(compare_table(cmp))
        if res.report is None:
            out.print(*extra)
        else:
            print_step(res.report, inst, out, extra=extra)
        if launch:
            out.print(f"# launch configuration ({emit})", markup=False, highlight=False)
            out.print(launch, markup=False, highlight=False)
    if res.report is None or res.status == Status.ERROR:
        raise typer.Exit(4)


def _gap(r, best) -> float:
    return r.objective / best.objective - 1


def _emit_text(inst, plan, fmt: str) -> str:
    from planner.emit import emit as run_emit

    return run_emit(inst, plan, fmt)


@app.command()
def pareto(
    file: FileArg,
    solver: SolverOpt = "cpsat",
    time_limit: TimeOpt = None,
    plot: Annotated[Path | None, typer.Option(help="write a PNG of the front")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Proven optimum at every node count of [cluster] nodes = [lo, hi] (or node_counts), and
    the non-dominated front of GPUs, step time, days and dollars."""
    from formulations import queries
    from planner.report import pareto_table

    try:
        if plot:
            from planner.plot import check_plot_path

            check_plot_path(plot)
        inst = _load(file)
        points = queries.pareto(inst, solver=solver, time_limit=time_limit)
        docs = [p.to_dict() for p in points]
        if plot and any(d.get("plan") for d in docs):
            from planner.plot import plot_front

            plot_front([d for d in docs if d.get("plan")], plot,
                       f"{inst.model.name or 'model'} on {inst.hw.gpu.name}")
    except PlanError as exc:
        _fail(exc)
    if as_json:
        _emit_json({"points": [d for d in docs if d.get("on_front")], "all": docs})
    else:
        out.print(pareto_table(points))
    if not any(p.result is not None for p in points):
        err.print("error: no size in the range admits a plan (each size's reason is in its row)",
                  markup=False, highlight=False)
        raise typer.Exit(3)
    if plot and not as_json:
        out.print(f"plot written to {plot}", markup=False, highlight=False)


@app.command()
def capacity(
    file: FileArg,
    deadline_days: Annotated[float, typer.Option(
        min=1e-9, help="train the token budget within this many days")],
    budget_usd: Annotated[float | None, typer.Option(
        min=0, help="also find the cheapest plan meeting the deadline and check this budget")
    ] = None,
    solver: SolverOpt = "cpsat",
    time_limit: TimeOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """The fewest nodes (in the instance's range) whose optimal plan meets the deadline."""
    from formulations import queries
    from planner.report import capacity_panel, print_step

    try:
        inst = _load(file)
        ans = queries.capacity(inst, deadline_days, solver=solver, time_limit=time_limit,
                               budget_usd=budget_usd)
    except PlanError as exc:
        _fail(exc)
    if as_json:
        _emit_json(ans.to_dict())
    elif ans.result is not None:
        print_step(ans.result.report, inst.with_nodes(ans.nodes), out,
                   extra=[capacity_panel(ans)])
    else:
        out.print(capacity_panel(ans))
    if ans.result is None or (ans.cheapest and not ans.cheapest["within_budget"]):
        raise typer.Exit(3)


@app.command()
def sweep(
    file: Annotated[Path, typer.Argument(help="sweep TOML file", show_default=False)],
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
    from planner import sweep as sw

    try:
        if plot:
            from planner.plot import check_plot_path

            check_plot_path(plot)
        if out_file:
            sw.check_out_path(out_file)
        spec = sw.load_sweep(file)
        with sw.RichProgress(err, f"{file.name}") as bar:
            run = sw.run_sweep(spec, engine=engine, workers=workers, address=address,
                               out=out_file, progress=bar)
        if plot and run.rows:
            from planner.sweep_plot import plot_sweep

            plot_sweep(run.rows, spec, plot)
    except PlanError as exc:
        _fail(exc)
    counts = ", ".join(f"{n} {s}" for s, n in sorted(run.counts().items()))
    if as_json:
        _emit_json(dict(run.to_dict(), out=str(out_file) if out_file else None,
                        plot=str(plot) if plot and run.rows else None))
    else:
        out.print(sw.rows_table(run))
        if len(run.rows) > 60:
            out.print(f"(first 60 of {len(run.rows)} rows"
                      + (f"; all in {out_file})" if out_file else ")"), markup=False)
    sys.stdout.flush()            # the table before the summary line on stderr
    err.print(f"{len(spec.points)} points ({run.ran} run now, {run.resumed} already in the "
              f"output): {counts}; {run.wall_s:.1f} s"
              + (f"; results in {out_file}" if out_file else "")
              + (f"; figure in {plot}" if plot and run.rows else ""), markup=False,
              highlight=False)
    if run.foreign:
        err.print(f"note: {run.foreign} row(s) of {out_file} are not points of this sweep; kept",
                  markup=False, highlight=False)
    if run.interrupted:
        err.print(f"interrupted: {run.ran + run.resumed} of {len(spec.points)} points done"
                  + (f", saved in {out_file}; run the same command to resume" if out_file else ""),
                  markup=False, highlight=False)
        raise typer.Exit(130)
    if run.counts().get("error"):
        raise typer.Exit(4)


def _single_size(inst, nodes: int | None) -> None:
    from planner.errors import InputError

    if nodes is None and len(inst.node_options) > 1:
        raise InputError(f"{inst.source}: cluster.nodes gives a range; pass --nodes N for a "
                         "single size, or use plan pareto / plan capacity")


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
        sys.exit(exc.exit_code)
    except OSError as exc:    # e.g. stdout on a full disk or a closed pipe
        sys.stderr.write(f"error: cannot write the output: {exc.strerror or exc}\n")
        sys.exit(1)


if __name__ == "__main__":
    main()

"""Design-space sweeps: ``plan sweep SWEEP.toml`` runs one planning query per point of a grid.

A sweep file holds a base instance (``base = "instance.toml"``, and/or inline ``[model]``,
``[training]``, ``[cluster]``, ``[constraints]`` tables that override the base key by key) and a
``[sweep]`` table whose dotted keys are instance keys and whose values are lists::

    base = "../gpt3-175b-a100.toml"
    [sweep]
    mode = "grid"                                   # the product of the axes; "zip" pairs them
    "cluster.inter_node_bandwidth_GBps" = [25, 50, 100, 200, 400]
    "cluster.nodes" = [128, 512]

Named cases are one more axis (column ``case``), each a set of dotted overrides::

    [sweep.cases]
    optimum = {}
    DP8 = {"constraints.tp" = 1, "constraints.pp" = 1}

Every point is checked (schema, catalog, query) before anything runs; a bad axis is one
:class:`~planner.model.errors.InputError` listing each problem with the axis values that cause it.
Points are plain dicts (instance documents with every file reference inlined), so they run the
same in this process, in a local process pool or as Ray tasks on another machine, and give the
same rows. Rows are appended to the output as points finish, and a re-run skips the points the
output already holds (matched on the axis values, checked against a hash of the point's
resolved document so that a changed sweep is never silently mixed with an old one).

This module knows nothing of typer; the CLI block in :mod:`planner.app.cli` calls :func:`load_sweep`
and :func:`run_sweep`. The output file (its columns, appending, the sorted rewrite) and how a
re-run judges an existing one are in :mod:`planner.app.sweep_output`; figures are in
:mod:`planner.app.sweep_plot`.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from itertools import product
from pathlib import Path
from typing import Any

from formulations import pool
from planner.model.words import plural, toml_value
from planner.model.errors import InfeasibleError, InputError, PlanError
from planner.model.instance import parse_instance, read_toml
from planner.model.plan import plan_label
from planner.model.schema import ClusterSpec
from planner.app.sweep_output import (Sink, axes_text, check_out_path, point_hash,
                                      resume_state)

QUERIES = ("solve", "capacity", "pareto")
MODES = ("grid", "zip")
ENGINES = ("local", "ray")
SWEEP_KEYS = ("mode", "query", "deadline_days", "budget_usd", "solver", "time_limit", "cases")
PLOT_KEYS = ("kind", "x", "lines", "y", "title")
PLOT_KINDS = ("auto", "lines", "heatmap")
PLOT_Y = ("step_time_s", "speedup", "total_days", "cost", "mfu", "memory_gib.total",
          "time_per_sequence_s", "capacity.nodes")
SECTIONS = ("model", "training", "cluster", "constraints")
SIZE_KEYS = ClusterSpec.SIZE_KEYS     # [cluster] takes exactly one of these
MAX_POINTS = 100_000
CASE = "case"


def _spec_classes() -> dict[str, Any]:
    from planner.model.schema import ClusterSpec, ConstraintSpec, ModelSpec, TrainingSpec

    return {"model": ModelSpec, "training": TrainingSpec, "cluster": ClusterSpec,
            "constraints": ConstraintSpec}


# ---------------------------------------------------------------------------------------------
# The sweep file
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Axis:
    """One dimension of the sweep: a dotted instance key (or ``case``) and its values."""

    key: str
    values: tuple[Any, ...]


@dataclass(frozen=True)
class Point:
    """One point: its index in grid order, its axis values (column -> value) and the instance
    document it solves (a plain dict, every file reference inlined)."""

    index: int
    axes: dict[str, Any]
    doc: dict[str, Any]

    @property
    def key(self) -> str:
        """Canonical identity of the point in an output file: its axis values as JSON."""
        return json.dumps(self.axes, sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class Sweep:
    source: str
    base: dict[str, Any]
    axes: tuple[Axis, ...]
    cases: dict[str, dict[str, Any]]
    mode: str = "grid"
    query: str = "solve"
    solver: str = "cpsat"
    time_limit: float | None = None
    deadline_days: float | None = None
    budget_usd: float | None = None
    plot: dict[str, Any] = field(default_factory=dict)
    points: tuple[Point, ...] = ()

    @property
    def axis_keys(self) -> list[str]:
        return [a.key for a in self.axes]

    def options(self) -> dict[str, Any]:
        """What every point runs besides its instance (part of each point's hash)."""
        return {"query": self.query, "solver": self.solver, "time_limit": self.time_limit,
                "deadline_days": self.deadline_days, "budget_usd": self.budget_usd}

    def task(self, p: Point) -> dict[str, Any]:
        """The picklable unit of work a worker runs (:func:`run_point`)."""
        return {"index": p.index, "axes": p.axes, "key": p.key, "doc": p.doc,
                "hash": point_hash(p, self.options()), "source": f"{self.source} point {p.index}",
                **self.options()}


def _flatten_keys(table: dict[str, Any], prefix: str = "",
                  twice: list[str] | None = None) -> dict[str, Any]:
    """``{"cluster": {"gpu": [...]}}`` (unquoted dotted TOML keys) -> ``{"cluster.gpu": [...]}``.

    TOML keeps a quoted ``"cluster.gpu"`` and a dotted ``cluster.gpu`` apart, so one key can be
    given twice; the later would silently replace the earlier. Such keys are added to
    ``twice`` (the first value is kept) for the caller to report."""
    out: dict[str, Any] = {}
    for k, v in table.items():
        inner = _flatten_keys(v, f"{prefix}{k}.", twice) if isinstance(v, dict) else {
            f"{prefix}{k}": v}
        for key, value in inner.items():
            if key in out:
                if twice is not None:
                    twice.append(key)
                continue
            out[key] = value
    return out


def _slot(key: str) -> str:
    """What a dotted key sets in a point's instance: the cluster's size keys replace one another
    (:func:`_set`), so they are one slot."""
    section, _, name = key.partition(".")
    return "cluster.size" if section == "cluster" and name in SIZE_KEYS else key


def _value_id(v: Any) -> Any:
    """A value as the point it makes: 25 and 25.0 are one point, true and 1 are not; lists and
    tables compare by content."""
    if isinstance(v, bool):
        return ("bool", v)
    if isinstance(v, list | tuple):
        return ("list", tuple(_value_id(x) for x in v))
    if isinstance(v, dict):
        return ("table", tuple(sorted((k, _value_id(x)) for k, x in v.items())))
    return v            # (hash(25) == hash(25.0) and 25 == 25.0: one key)


def _repeated_values(where: str, values: list[Any]) -> list[str]:
    """One problem per value an axis repeats: a repeated value runs the same point twice and
    its rows share one point_key."""

    first: dict[Any, Any] = {}
    out = []
    for v in values:
        vid = _value_id(v)
        if vid not in first:
            first[vid] = v
            continue
        a, b = toml_value(first[vid]), toml_value(v)
        out.append(f"{where}: the value {b} is given twice" if a == b else
                   f"{where}: the value {b} repeats {a} (the same point)")
    return out


def _check_key(key: str, where: str) -> str | None:
    """A problem with a dotted instance key, or None."""
    section, _, name = key.partition(".")
    if not name or "." in name:
        return (f"{where}: {toml_value(key)} is not a dotted instance key; expected "
                f"\"section.key\" with a section of {', '.join(SECTIONS)} (e.g. "
                "\"cluster.nodes\")")
    if section == "plan":
        return (f"{where}: {toml_value(key)}: a sweep solves for the plan; pin a knob with "
                f"'constraints.{name}' instead")
    classes = _spec_classes()
    if section not in classes:
        return (f"{where}: {toml_value(key)}: unknown section {toml_value(section)}; expected "
                f"one of {', '.join(SECTIONS)}")
    fields = classes[section].model_fields
    if name not in fields:
        return (f"{where}: {toml_value(key)}: unknown key of [{section}]; expected one of "
                f"{', '.join(sorted(fields))}")
    return None


def _resolve_hf(doc: dict[str, Any], base_dir: Path) -> None:
    """Make ``model.hf_config`` an absolute path (relative paths are the file's own)."""
    model = doc.get("model")
    if isinstance(model, dict) and isinstance(model.get("hf_config"), str) and model["hf_config"]:
        ref = Path(model["hf_config"])
        if not ref.is_absolute():
            model["hf_config"] = str((base_dir / ref).resolve())


def _inline_hf(doc: dict[str, Any]) -> None:
    """Replace ``model.hf_config`` by the keys it gives, so that the point needs no file (a Ray
    worker on another machine has none). Explicit keys still override the config's."""
    model = doc.get("model")
    if not (isinstance(model, dict) and isinstance(model.get("hf_config"), str)
            and model["hf_config"]):
        return
    from planner.model.hf_config import read_hf_config

    ref = Path(model.pop("hf_config"))
    merged = {**read_hf_config(ref), **model}
    merged.setdefault("name", ref.stem.replace(".config", ""))
    doc["model"] = merged


def _set(doc: dict[str, Any], key: str, value: Any) -> None:
    section, _, name = key.partition(".")
    sec = dict(doc.get(section) or {})
    if section == "cluster" and name in SIZE_KEYS:     # one size key replaces the others
        for other in SIZE_KEYS:
            sec.pop(other, None)
    sec[name] = value
    doc[section] = sec


def load_sweep(path: str | Path, check: bool = True) -> Sweep:
    """Read a sweep file, expand its points and (``check``) validate every point's instance and
    query before anything runs. Raises :class:`InputError` listing every problem.

    Example
    -------
    >>> sw = load_sweep("instances/sweeps/optical-bandwidth.toml")      # doctest: +SKIP
    >>> len(sw.points), sw.axis_keys                                      # doctest: +SKIP
    (15, ['cluster.nodes', 'cluster.inter_node_bandwidth_GBps'])
    """
    p = Path(path)
    data = read_toml(p)
    problems: list[str] = []
    extra = [k for k in data if k not in ("base", "sweep", "plot", "plan", *SECTIONS)]
    for k in extra:
        problems.append(f"{k}: unknown top-level key; expected base, [sweep], [plot] or an "
                        f"instance section ({', '.join((*SECTIONS, 'plan'))})")
    # the base instance, then the inline sections over it, key by key
    base: dict[str, Any] = {}
    if "base" in data:
        ref = data["base"]
        if not isinstance(ref, str) or not ref.strip():
            raise InputError(f"{p}: invalid sweep", [f"base: expected a path to an instance "
                                                     f"file, got {toml_value(ref)}"])
        bpath = Path(ref) if Path(ref).is_absolute() else p.parent / ref
        try:
            base = read_toml(bpath)
        except InputError as exc:
            raise InputError(f"{p}: invalid sweep", [f"base: {exc}"]) from None
        if "sweep" in base or "base" in base:
            # (a sweep's own keys would read as unknown instance keys at every point)
            raise InputError(f"{p}: invalid sweep", [
                f"base = {toml_value(ref)}: {bpath} is a sweep file (it has "
                f"{'[sweep]' if 'sweep' in base else 'a base'}); base names an instance file"])
        _resolve_hf(base, bpath.parent)
    for sec in (*SECTIONS, "plan"):
        if sec in data:
            if not isinstance(data[sec], dict):
                problems.append(f"{sec}: expected a table")
                continue
            inline = dict(data[sec])
            if sec == "cluster" and any(k in inline for k in SIZE_KEYS):
                base[sec] = {k: v for k, v in (base.get(sec) or {}).items() if k not in SIZE_KEYS}
            base[sec] = {**(base.get(sec) or {}), **inline}
    _resolve_hf(base, p.parent)
    if "model" not in base and "model" not in data:
        problems.append("base: no instance: give base = \"instance.toml\" or inline [model], "
                        "[training] and [cluster] tables")

    table = data.get("sweep")
    if not isinstance(table, dict):
        problems.append("sweep: a [sweep] table of dotted instance keys and lists is required")
        raise InputError(f"{p}: invalid sweep", problems)
    table = dict(table)
    opts = {k: table.pop(k) for k in SWEEP_KEYS if k in table}
    mode = opts.get("mode", "grid")
    if mode not in MODES:
        problems.append(f"sweep.mode: expected one of {', '.join(MODES)}, got {toml_value(mode)}")
    query = opts.get("query", "solve")
    if query not in QUERIES:
        problems.append(f"sweep.query: expected one of {', '.join(QUERIES)}, "
                        f"got {toml_value(query)}")
    solver = opts.get("solver", "cpsat")
    problems += _check_solver(solver)
    time_limit = _number(opts, "time_limit", problems)
    deadline = _number(opts, "deadline_days", problems)
    budget = _number(opts, "budget_usd", problems, allow_zero=True)
    if query == "capacity" and deadline is None:
        problems.append("sweep.deadline_days: required with query = \"capacity\"")
    if query != "capacity":
        for k in ("deadline_days", "budget_usd"):
            if k in opts:
                problems.append(f"sweep.{k}: only used with query = \"capacity\"")

    axes: list[Axis] = []
    twice: list[str] = []
    for key, values in _flatten_keys(table, twice=twice).items():
        where = f"sweep.{toml_value(key)}" if "." in key else f"sweep.{key}"
        if "." not in key:
            problems.append(f"{where}: unknown key; expected {', '.join(SWEEP_KEYS)} or a dotted "
                            f"instance key such as \"cluster.nodes\"")
            continue
        bad = _check_key(key, where)
        if bad:
            problems.append(bad)
            continue
        if not isinstance(values, list) or not values:
            problems.append(f"{where}: expected a non-empty list of values, "
                            f"got {toml_value(values)}")
            continue
        problems += _repeated_values(where, values)
        clash = next((a.key for a in axes if _slot(a.key) == _slot(key)), None)
        if clash:
            problems.append(f"{where}: {toml_value(clash)} is an axis too; a point has one "
                            "cluster size, so sweep one of the two")
            continue
        axes.append(Axis(key, tuple(values)))
    problems += [f"sweep.{toml_value(key)}: given twice (quoted \"{key}\" and dotted {key}); "
                 "give each axis once" for key in twice]
    cases = opts.get("cases")
    case_overrides: dict[str, dict[str, Any]] = {}
    if cases is not None:
        if not isinstance(cases, dict) or not cases:
            problems.append("sweep.cases: expected a table of named cases, each a table of "
                            "dotted instance keys (e.g. DP8 = {\"constraints.tp\" = 1})")
        else:
            for name, over in cases.items():
                if not isinstance(over, dict):
                    problems.append(f"sweep.cases.{name}: expected a table of dotted instance "
                                    f"keys, got {toml_value(over)}")
                    continue
                given_twice: list[str] = []
                flat = _flatten_keys(over, twice=given_twice)
                problems += [f"sweep.cases.{name}: {toml_value(key)} given twice (quoted and "
                             "dotted); give each key once" for key in given_twice]
                case_overrides[name] = {}
                for key, value in flat.items():
                    bad = _check_key(key, f"sweep.cases.{name}") or _case_clash(name, key, axes)
                    if bad:
                        problems.append(bad)
                    else:
                        case_overrides[name][key] = value
            # (a case that is not a table is a problem above and no point: the points of the
            # valid ones are still checked below)
            if case_overrides:
                axes.append(Axis(CASE, tuple(case_overrides)))
    if not axes and not problems:
        problems.append("sweep: no axis: add a dotted instance key with a list of values, e.g. "
                        "\"cluster.nodes\" = [1, 2, 4]")
    if mode == "zip" and len({len(a.values) for a in axes}) > 1:
        problems.append("sweep.mode = \"zip\": every axis needs the same number of values; got "
                        + ", ".join(f"{a.key} {len(a.values)}" for a in axes))
    expandable = bool(axes) and mode in MODES and not (
        mode == "zip" and len({len(a.values) for a in axes}) > 1) and (
        "model" in base or "model" in data)
    plot = data.get("plot", {})
    problems += _check_plot(plot, [a.key for a in axes])
    count = (len(axes[0].values) if mode == "zip" and axes
             else math.prod(len(a.values) for a in axes))
    if expandable and count > MAX_POINTS:
        raise InputError(f"{p}: invalid sweep", problems + [f"sweep: {count:,} points; at most "
                                                            f"{MAX_POINTS:,} in one sweep"])
    sw = Sweep(str(p), base, tuple(axes), case_overrides, mode, query, solver, time_limit,
               deadline, budget, dict(plot))
    if problems:
        # the points of the axes that are valid are checked too, so that one run reports every
        # problem (an unknown key and a bad value together, not the first alone)
        if check and expandable:
            problems += point_problems(replace(sw, points=tuple(expand(sw))))
        raise InputError(f"{p}: invalid sweep", problems)
    sw = replace(sw, points=tuple(expand(sw)))
    if check:
        check_points(sw)
    return sw


def _case_clash(name: str, key: str, axes: list[Axis]) -> str | None:
    """A case may not set what an axis sets: the case's value would win while the row shows the
    axis's."""
    clash = next((a.key for a in axes if a.key != CASE and _slot(a.key) == _slot(key)), None)
    if clash is None:
        return None
    return (f"sweep.cases.{name}: {toml_value(key)} is also set by the axis "
            f"{toml_value(clash)}; the case would replace the axis value its rows show: set it "
            "in the cases or in the axis, not both")


def _number(opts: dict, key: str, problems: list[str], allow_zero: bool = False) -> float | None:
    v = opts.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or (
            v < 0 or (v == 0 and not allow_zero)):
        problems.append(f"sweep.{key}: expected a positive number, got {toml_value(v)}")
        return None
    return float(v)


def _check_solver(solver: Any) -> list[str]:
    from formulations.pyomo_backend import SOLVER_NAMES
    from formulations.solve import BACKENDS, not_installed

    names = BACKENDS + tuple(n for n in SOLVER_NAMES if n != "highs")
    if solver not in names:
        return [f"sweep.solver: expected one of {', '.join(names)}, got {toml_value(solver)}"]
    missing = not_installed(solver)
    return [f"sweep.solver: {missing}"] if missing else []


def _check_plot(plot: Any, axis_keys: list[str]) -> list[str]:
    if not isinstance(plot, dict):
        return ["plot: expected a table (kind, x, lines, y, title)"]
    out = [f"plot.{k}: unknown key; expected one of {', '.join(PLOT_KEYS)}"
           for k in plot if k not in PLOT_KEYS]
    if plot.get("kind", "auto") not in PLOT_KINDS:
        out.append(f"plot.kind: expected one of {', '.join(PLOT_KINDS)}, "
                   f"got {toml_value(plot['kind'])}")
    for k in ("x", "lines"):
        if k in plot and plot[k] not in axis_keys:
            out.append(f"plot.{k}: {toml_value(plot[k])} is not an axis of this sweep; expected "
                       f"one of {', '.join(axis_keys)}")
    if "x" in plot and plot.get("lines") == plot["x"]:
        out.append("plot.lines: must differ from plot.x")
    if plot.get("y", "step_time_s") not in PLOT_Y:
        out.append(f"plot.y: expected one of {', '.join(PLOT_Y)}, got {toml_value(plot['y'])}")
    if "title" in plot and not isinstance(plot["title"], str):
        out.append("plot.title: expected a string")
    return out


def expand(sw: Sweep) -> list[Point]:
    """The points in grid order (the last axis varies fastest) or zipped order."""
    values = [a.values for a in sw.axes]
    combos: Iterable[tuple] = zip(*values) if sw.mode == "zip" else product(*values)
    points = []
    for i, combo in enumerate(combos):
        doc = json.loads(json.dumps(sw.base))           # a deep copy of plain TOML data
        axes: dict[str, Any] = {}
        for a, v in zip(sw.axes, combo):
            axes[a.key] = v
            for key, value in (sw.cases[v].items() if a.key == CASE else [(a.key, v)]):
                _set(doc, key, value)
        _resolve_hf(doc, Path(sw.source).parent)       # an axis's path is the sweep file's
        points.append(Point(i, axes, doc))
    return points


def check_points(sw: Sweep) -> None:
    """Validate every point's instance (schema, presets, catalog, hf_config) and that the query
    can run on it; raise one :class:`InputError` with each distinct problem and the first
    point that shows it. Inlines ``model.hf_config`` into each point's document."""
    lines = point_problems(sw)
    if lines:
        raise InputError(f"{sw.source}: invalid sweep: {plural(len(lines), 'problem')} in its "
                         "points, nothing was run", lines)


def point_problems(sw: Sweep) -> list[str]:
    """Each distinct problem of the points (see :func:`check_points`), with the axis values of
    the first point that shows it and how many more do."""
    seen: dict[str, tuple[dict[str, Any], int]] = {}
    for pt in sw.points:
        try:
            _inline_hf(pt.doc)
            inst = parse_instance(pt.doc, f"point {pt.index}")
            found = _query_problems(sw, inst)
        except InputError as exc:
            found = exc.problems or [str(exc)]
        for prob in found:
            if prob in seen:
                seen[prob] = (seen[prob][0], seen[prob][1] + 1)
            else:
                seen[prob] = (pt.axes, 1)
    return [f"{prob}  [at {axes_text(axes)}"
            + (f"; {plural(n - 1, 'more point')}" if n > 1 else "") + "]"
            for prob, (axes, n) in seen.items()]


def _query_problems(sw: Sweep, inst) -> list[str]:
    from formulations import queries

    if sw.query == "solve" and len(inst.node_options) > 1:
        key = ("cluster.node_counts: lists several sizes" if inst.spec.cluster.node_counts
               is not None else "cluster.nodes: gives a range of sizes")
        return [f"{key}; query = \"solve\" needs one size (use "
                "query = \"pareto\" or \"capacity\", or sweep \"cluster.nodes\" over counts)"]
    if sw.query == "capacity" and not inst.spec.training.tokens:
        return ["training.tokens: required with query = \"capacity\" (the token budget)"]
    if (sw.query == "capacity" and sw.budget_usd is not None
            and inst.spec.cluster.price_per_gpu_hour is None):
        return ["cluster.price_per_gpu_hour: required with budget_usd (the cost of a plan)"]
    if sw.query == "pareto" and len(inst.node_options) > queries.MAX_PARETO_SIZES:
        return [queries.too_many_sizes(inst, len(inst.node_options))]
    return []


# ---------------------------------------------------------------------------------------------
# Running one point (in a worker)
# ---------------------------------------------------------------------------------------------

#: result keys that are not columns: constant text, per-stage detail, lists of sub-results,
#: the plan again as a [plan] table (its plan.* columns say it)
_SKIP = {"memory_by_stage_gib", "mfu_formula", "violations", "checked", "cheapest", "all",
         "next_smaller", "fastest", "plan_spec"}


def flatten_result(doc: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A result document (``SolveResult.to_dict()``) as flat dotted columns; lists as JSON."""
    out: dict[str, Any] = {}
    for k, v in doc.items():
        if not prefix and k in _SKIP:
            continue
        name = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten_result(v, f"{name}."))
        elif isinstance(v, list | tuple):
            out[name] = json.dumps(v)
        elif hasattr(v, "item"):          # numpy scalars
            out[name] = v.item()
        else:
            out[name] = v
    return out


def _label(plan: dict[str, Any]) -> str:
    """The plan's label as reports print it (:func:`~planner.model.plan.plan_label`), and its
    recompute mode when it recomputes (``TP8 PP4 DP2 VP2 EP8 mb1 rc-full``)."""
    s = plan_label(plan)
    if plan.get("recompute", "none") != "none":
        s += f" rc-{plan['recompute']}"
    return s


def _result_row(doc: dict[str, Any]) -> dict[str, Any]:
    row = flatten_result(doc)
    plan = doc.get("plan")
    row["plan_label"] = _label(plan) if plan else None
    if plan and doc.get("step_time_s") is not None:
        row["time_per_sequence_s"] = doc["step_time_s"] / plan["global_batch"]
    return row


def run_point(task: dict[str, Any]) -> list[dict[str, Any]]:
    """Run one point's query; always returns rows, never raises for the point's own failure:
    an infeasible point or a failing solver is a row with ``solver.status`` and ``reason``.
    ``pareto`` gives one row per cluster size of the point, the others one row."""
    t0 = time.perf_counter()
    head = {**task["axes"], "point": task["index"]}
    tail = {"point_key": task["key"], "point_hash": task["hash"]}
    try:
        rows = _run_query(task)
    except InfeasibleError as exc:
        rows = [{"solver.status": "infeasible", "reason": _one_line(exc)}]
    except PlanError as exc:
        rows = [{"solver.status": "error", "reason": _one_line(exc)}]
    except Exception as exc:   # a bug or a solver crash must not end the sweep: it is a row
        rows = [{"solver.status": "error", "reason": f"{type(exc).__name__}: {exc}"}]
    wall = time.perf_counter() - t0
    # (the limit it ran under: a resume runs a point stopped at it again under a larger one)
    return [{**head, **r, "time_limit_s": task["time_limit"], "point_wall_s": wall, **tail}
            for r in rows]


def _stopped(note: str, time_limit: float | None) -> str:
    """The reason of a point whose solver stopped at the time limit without a plan: what
    ``plan solve`` says, in the sweep file's words."""
    return ("the solver returned no usable plan (no_solution_in_limit" + (f": {note}" if note else "")
            + "); " + (f"raise [sweep] time_limit (it was {time_limit:g} s)" if time_limit
                       else "give it more time with [sweep] time_limit"))


def _one_line(exc: Exception) -> str:
    return "; ".join(line.strip(" -") for line in str(exc).splitlines() if line.strip())


def _run_query(task: dict[str, Any]) -> list[dict[str, Any]]:
    from formulations import queries
    from formulations.solve import solve

    inst = parse_instance(task["doc"], task["source"])
    solver, limit = task["solver"], task["time_limit"]
    if task["query"] == "solve":
        res = solve(inst, solver=solver, time_limit=limit, explain="brief")
        row = _result_row(res.to_dict())
        row["reason"] = res.note if res.report is None or res.status.value == "error" else ""
        if res.report is None and res.status.value == "no_solution_in_limit":
            row["reason"] = _stopped(res.note, limit)
        return [row]
    if task["query"] == "capacity":
        ans = queries.capacity(inst, task["deadline_days"], solver=solver, time_limit=limit,
                               budget_usd=task.get("budget_usd"))
        d = ans.to_dict()
        row = _result_row(d)
        row["capacity.nodes"] = ans.nodes
        row["capacity.sizes_solved"] = len(ans.checked)
        row["capacity.wall_s"] = row.pop("wall_s", None)
        if ans.cheapest:
            row["capacity.cheapest_nodes"] = ans.cheapest["nodes"]
            row["capacity.cheapest_cost"] = ans.cheapest["cost"]
            row["capacity.within_budget"] = ans.cheapest["within_budget"]
        if ans.result is None and ans.unproven:    # not an answer: sizes stopped unproven
            row["solver.status"] = "no_solution_in_limit"
            row["reason"] = (f"no size of the range is proven to meet "
                             f"{plural(ans.deadline_days, 'day')}: the solver stopped at "
                             "the time limit at "
                             + ", ".join(map(str, ans.unproven)) + " nodes")
        elif ans.result is None:
            row["solver.status"] = "infeasible"
            row["reason"] = ans.miss_reason()
        else:
            row["reason"] = ""
        return [row]
    rows = []
    for pp in queries.pareto(inst, solver=solver, time_limit=limit):
        if pp.result is None:
            rows.append({"pareto.nodes": pp.nodes, "solver.status": pp.status,
                         "reason": "; ".join([pp.reason, *pp.detail]).strip("; ")})
        else:
            row = _result_row(pp.result.to_dict())
            rows.append({"pareto.nodes": pp.nodes, "pareto.on_front": pp.on_front, **row,
                         "reason": ""})
    return rows


# ---------------------------------------------------------------------------------------------
# Engines
# ---------------------------------------------------------------------------------------------


def run_local(tasks: list[dict], workers: int, on_rows: Callable[[list[dict]], None]) -> None:
    """Run tasks in this process (one worker) or a process pool (:mod:`formulations.pool`),
    calling ``on_rows`` in this process as each point finishes, in the order they finish."""
    for rows in pool.imap(run_point, tasks, workers, ordered=False,
                          preload=("planner.app.sweep",)):
        on_rows(rows)


def ray_available() -> bool:
    try:
        import ray  # noqa: F401
    except ImportError:
        return False
    return True


def run_ray(tasks: list[dict], workers: int | None, address: str | None,
            on_rows: Callable[[list[dict]], None]) -> None:
    """Run tasks as Ray tasks (one CPU each). Uses the running Ray session if there is one,
    else connects to ``address`` ("auto" or HOST:PORT), else joins the Ray cluster running on
    this machine (``ray start``, or ``RAY_ADDRESS``) with its own CPUs, else starts a local Ray
    with ``workers`` CPUs; a connection it made is shut down at the end (a cluster it joined
    keeps running). Every machine of a cluster needs this package installed
    (``pip install 'plan[sweep]'``)."""
    try:
        import ray
    except ImportError:
        raise InputError("--engine ray needs Ray: pip install -e '.[sweep]'") from None
    started = False
    if not ray.is_initialized():
        kw: dict[str, Any] = {"log_to_driver": False, "logging_level": "ERROR",
                              "include_dashboard": False}
        try:
            if address:
                ray.init(address=address, **kw)
            else:
                try:    # a cluster running on this machine (RAY_ADDRESS, or `ray start`): join
                    # it, as ray.init() would, but without num_cpus, which Ray refuses then
                    ray.init(address="auto", **kw)
                except ConnectionError:     # none running: a local Ray of the workers' CPUs
                    ray.init(num_cpus=pool.workers_or_default(workers), **kw)
        except Exception as exc:     # a cluster that is not there is the user's input
            raise InputError(f"--address {address or '(local)'}: cannot start or reach Ray: "
                             f"{exc}") from None
        started = True
    remote = ray.remote(num_cpus=1, max_retries=0)(run_point)
    pending = [remote.remote(t) for t in tasks]
    index = {ref: t for ref, t in zip(pending, tasks)}
    try:
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                try:
                    rows = ray.get(ref)
                except Exception as exc:    # a worker died (out of memory, node lost)
                    rows = _failed(index[ref], f"Ray task failed: {type(exc).__name__}: {exc}")
                on_rows(rows)
    except BaseException:
        for ref in pending:
            ray.cancel(ref, force=True)
        raise
    finally:
        if started:
            ray.shutdown()


def _failed(task: dict[str, Any], reason: str) -> list[dict[str, Any]]:
    return [{**task["axes"], "point": task["index"], "solver.status": "error", "reason": reason,
             "point_key": task["key"], "point_hash": task["hash"]}]
# ---------------------------------------------------------------------------------------------
# The whole run
# ---------------------------------------------------------------------------------------------


@dataclass
class SweepRun:
    sweep: Sweep
    rows: list[dict]              # rows of this sweep's points, sorted by point
    ran: int                      # points run now
    resumed: int                  # points found in the output and skipped
    foreign: int                  # rows in the output that are not points of this sweep
    interrupted: bool = False
    wall_s: float = 0.0
    notes: list[str] = field(default_factory=list)     # what the resume dropped, and why

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.rows:
            s = r.get("solver.status") or "?"
            out[s] = out.get(s, 0) + 1
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"sweep": self.sweep.source, "query": self.sweep.query, "mode": self.sweep.mode,
                "axes": {a.key: list(a.values) for a in self.sweep.axes},
                "points": len(self.sweep.points), "ran": self.ran, "resumed": self.resumed,
                "interrupted": self.interrupted, "status_counts": self.counts(),
                "wall_s": self.wall_s, "rows": self.rows}


def run_sweep(sw: Sweep, engine: str = "local", workers: int | None = None,
              address: str | None = None, out: Path | None = None,
              progress: Callable[[int, int], None] | None = None) -> SweepRun:
    """Run every point not already in ``out``; ``progress(done, total)`` after each point.

    On Ctrl-C the output is rewritten (valid, sorted) with every finished point and the
    :class:`SweepRun` comes back with ``interrupted`` set; re-running resumes.
    """
    if engine not in ENGINES:
        raise InputError(f"--engine: expected one of {', '.join(ENGINES)}, "
                         f"got {toml_value(engine)}")
    if workers is not None and workers < 1:
        raise InputError(f"--workers: expected a positive count, got {workers}")
    if address and engine != "ray":
        raise InputError("--address is for --engine ray")
    if engine == "ray" and not ray_available():
        raise InputError("--engine ray needs Ray: pip install -e '.[sweep]'")
    t0 = time.perf_counter()
    if out is not None:
        out = check_out_path(out)
    resume = resume_state(out, sw)
    done = resume.done
    tasks = [sw.task(p) for p in sw.points if p.key not in done]
    sink = Sink(out, sw.axis_keys, resume.rows, columns=resume.columns, rewrite=resume.rewrite,
                newline=resume.newline)
    total, count = len(sw.points), len(done)
    if progress:
        progress(count, total)

    def on_rows(rows: list[dict]) -> None:
        nonlocal count
        sink.add(rows)
        count += 1
        if progress:
            progress(count, total)

    interrupted = False
    try:
        if not tasks:
            pass                                  # everything is in the output already
        elif engine == "ray":
            run_ray(tasks, workers, address, on_rows)
        else:
            run_local(tasks, pool.workers_or_default(workers), on_rows)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        sink.finish()
    keys = {p.key for p in sw.points}
    rows = [r for r in sink.rows if r.get("point_key") in keys]
    return SweepRun(sw, rows, count - len(done), len(done), resume.foreign, interrupted,
                    time.perf_counter() - t0, resume.notes)


# ---------------------------------------------------------------------------------------------
# Human view helpers (rich)
# ---------------------------------------------------------------------------------------------


class RichProgress:
    """A rich progress bar on stderr: done/total, points per second, elapsed and ETA. Shown
    only on a terminal (a log gets the summary line alone)."""

    def __init__(self, console, label: str):
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                                   TimeElapsedColumn, TimeRemainingColumn)

        self.progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                                 MofNCompleteColumn(), TextColumn("{task.fields[rate]}"),
                                 TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                                 console=console, disable=not console.is_terminal,
                                 transient=False)
        self.task = None
        self.label = label
        self.t0 = time.perf_counter()
        self.start_done = None

    def __enter__(self):
        self.progress.start()
        return self

    def __exit__(self, *exc):
        self.progress.stop()

    def __call__(self, done: int, total: int) -> None:
        if self.task is None:
            self.start_done = done
            self.task = self.progress.add_task(self.label, total=total, completed=done,
                                               rate="")
            return
        el = time.perf_counter() - self.t0
        n = done - self.start_done
        rate = f"{n / el:.2f} pt/s" if el > 0 and n else ""
        self.progress.update(self.task, completed=done, rate=rate)


def rows_table(run: SweepRun, limit: int = 60):
    """A rich table of the rows: axis values, plan, step time, days, cost, MFU, status."""
    from rich.table import Table

    sw = run.sweep
    t = Table(title=f"{sw.source}: {len(sw.points)} points ({sw.query})")
    cols = list(sw.axis_keys)
    extra = ["pareto.nodes"] if sw.query == "pareto" else (
        ["capacity.nodes"] if sw.query == "capacity" else [])
    for c in cols + extra:
        t.add_column(c, justify="right")
    for c in ("plan", "step s", "days", "cost $", "MFU", "status"):
        t.add_column(c, justify="left" if c in ("plan", "status") else "right")
    for r in run.rows[:limit]:
        status = r.get("solver.status") or ""
        cells = [_cell(r.get(c)) for c in cols + extra]
        if r.get("plan_label"):
            cells += [r["plan_label"], _num(r.get("step_time_s"), ".4g"),
                      _num(r.get("total_days"), ".1f"), _num(r.get("cost"), ",.0f"),
                      _num(r.get("mfu"), ".1%"), status]
        else:
            cells += [(r.get("reason") or "")[:60], "", "", "", "", status]
        t.add_row(*cells, style="" if r.get("plan_label") else "yellow")
    return t


def _cell(v: Any) -> str:
    return "" if v is None else (json.dumps(v) if isinstance(v, list) else str(v))


def _num(v: Any, fmt: str) -> str:
    return "" if v is None else format(v, fmt)

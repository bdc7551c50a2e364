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
and :func:`run_sweep`. Figures are in :mod:`planner.app.sweep_plot`.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from itertools import product
from pathlib import Path
from typing import Any

from planner.model.words import plural
from planner.model.errors import InfeasibleError, InputError, PlanError
from planner.model.instance import parse_instance, read_toml

QUERIES = ("solve", "capacity", "pareto")
MODES = ("grid", "zip")
ENGINES = ("local", "ray")
SWEEP_KEYS = ("mode", "query", "deadline_days", "budget_usd", "solver", "time_limit", "cases")
PLOT_KEYS = ("kind", "x", "lines", "y", "title")
PLOT_KINDS = ("auto", "lines", "heatmap")
PLOT_Y = ("step_time_s", "speedup", "total_days", "cost", "mfu", "memory_gib.total",
          "time_per_sequence_s", "capacity.nodes")
SECTIONS = ("model", "training", "cluster", "constraints")
SIZE_KEYS = ("nodes", "node_counts", "gpus")     # [cluster] takes exactly one of these
MAX_POINTS = 100_000
CASE = "case"
OUT_SUFFIXES = (".csv", ".parquet")
#: columns that change from run to run (wall clocks); every other column is a pure function of
#: the point and is identical whichever engine ran it
TIMING_COLUMNS = ("solver.wall_s", "solver.solve_s", "solver.build_s", "capacity.wall_s",
                  "point_wall_s")


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


def point_hash(p: Point, options: dict[str, Any]) -> str:
    blob = json.dumps({"doc": p.doc, **options}, sort_keys=True, default=str)
    return "h" + hashlib.sha256(blob.encode()).hexdigest()[:16]   # never read back as a number


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
    from planner.model.words import toml_value

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
        return (f"{where}: {key!r} is not a dotted instance key; expected 'section.key' with a "
                f"section of {', '.join(SECTIONS)} (e.g. 'cluster.nodes')")
    if section == "plan":
        return (f"{where}: {key!r}: a sweep solves for the plan; pin a knob with "
                f"'constraints.{name}' instead")
    classes = _spec_classes()
    if section not in classes:
        return f"{where}: {key!r}: unknown section {section!r}; expected one of {', '.join(SECTIONS)}"
    fields = classes[section].model_fields
    if name not in fields:
        return (f"{where}: {key!r}: unknown key of [{section}]; expected one of "
                f"{', '.join(sorted(fields))}")
    return None


def _resolve_hf(doc: dict[str, Any], base_dir: Path) -> None:
    """Make ``model.hf_config`` an absolute path (relative paths are the file's own)."""
    model = doc.get("model")
    if isinstance(model, dict) and isinstance(model.get("hf_config"), str) and model["hf_config"]:
        ref = Path(model["hf_config"])
        if not ref.is_absolute():
            model["hf_config"] = str((base_dir / ref).resolve())


def _inline_hf(doc: dict[str, Any], source: str) -> None:
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
                        f"instance section ({', '.join(SECTIONS)})")
    # the base instance, then the inline sections over it, key by key
    base: dict[str, Any] = {}
    if "base" in data:
        ref = data["base"]
        if not isinstance(ref, str) or not ref.strip():
            raise InputError(f"{p}: invalid sweep", [f"base: expected a path to an instance "
                                                     f"file, got {ref!r}"])
        bpath = Path(ref) if Path(ref).is_absolute() else p.parent / ref
        try:
            base = read_toml(bpath)
        except InputError as exc:
            raise InputError(f"{p}: invalid sweep", [f"base: {exc}"]) from None
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
        problems.append(f"sweep.mode: expected one of {', '.join(MODES)}, got {mode!r}")
    query = opts.get("query", "solve")
    if query not in QUERIES:
        problems.append(f"sweep.query: expected one of {', '.join(QUERIES)}, got {query!r}")
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
        where = f"sweep.{key!r}" if "." in key else f"sweep.{key}"
        if "." not in key:
            problems.append(f"{where}: unknown key; expected {', '.join(SWEEP_KEYS)} or a dotted "
                            f"instance key such as \"cluster.nodes\"")
            continue
        bad = _check_key(key, where)
        if bad:
            problems.append(bad)
            continue
        if not isinstance(values, list) or not values:
            problems.append(f"{where}: expected a non-empty list of values, got {values!r}")
            continue
        problems += _repeated_values(where, values)
        clash = next((a.key for a in axes if _slot(a.key) == _slot(key)), None)
        if clash:
            problems.append(f"{where}: {clash!r} is an axis too; a point has one cluster size, "
                            "so sweep one of the two")
            continue
        axes.append(Axis(key, tuple(values)))
    problems += [f"sweep.{key!r}: given twice (quoted \"{key}\" and dotted {key}); give each "
                 "axis once" for key in twice]
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
                                    f"keys, got {over!r}")
                    continue
                given_twice: list[str] = []
                flat = _flatten_keys(over, twice=given_twice)
                problems += [f"sweep.cases.{name}: {key!r} given twice (quoted and dotted); "
                             "give each key once" for key in given_twice]
                case_overrides[name] = {}
                for key, value in flat.items():
                    bad = _check_key(key, f"sweep.cases.{name}") or _case_clash(name, key, axes)
                    if bad:
                        problems.append(bad)
                    else:
                        case_overrides[name][key] = value
            axes.append(Axis(CASE, tuple(cases)))
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
    return (f"sweep.cases.{name}: {key!r} is also set by the axis {clash!r}; the case would "
            "replace the axis value its rows show: set it in the cases or in the axis, not both")


def _number(opts: dict, key: str, problems: list[str], allow_zero: bool = False) -> float | None:
    v = opts.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or (
            v < 0 or (v == 0 and not allow_zero)):
        problems.append(f"sweep.{key}: expected a positive number, got {v!r}")
        return None
    return float(v)


def _check_solver(solver: Any) -> list[str]:
    from formulations.pyomo_backend import SOLVER_NAMES
    from formulations.solve import BACKENDS, not_installed

    names = BACKENDS + tuple(n for n in SOLVER_NAMES if n != "highs")
    if solver not in names:
        return [f"sweep.solver: expected one of {', '.join(names)}, got {solver!r}"]
    missing = not_installed(solver)
    return [f"sweep.solver: {missing}"] if missing else []


def _check_plot(plot: Any, axis_keys: list[str]) -> list[str]:
    if not isinstance(plot, dict):
        return ["plot: expected a table (kind, x, lines, y, title)"]
    out = [f"plot.{k}: unknown key; expected one of {', '.join(PLOT_KEYS)}"
           for k in plot if k not in PLOT_KEYS]
    if plot.get("kind", "auto") not in PLOT_KINDS:
        out.append(f"plot.kind: expected one of {', '.join(PLOT_KINDS)}, got {plot['kind']!r}")
    for k in ("x", "lines"):
        if k in plot and plot[k] not in axis_keys:
            out.append(f"plot.{k}: {plot[k]!r} is not an axis of this sweep; expected one of "
                       f"{', '.join(axis_keys)}")
    if "x" in plot and plot.get("lines") == plot["x"]:
        out.append("plot.lines: must differ from plot.x")
    if plot.get("y", "step_time_s") not in PLOT_Y:
        out.append(f"plot.y: expected one of {', '.join(PLOT_Y)}, got {plot['y']!r}")
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


def _axes_text(axes: dict[str, Any]) -> str:
    return ", ".join(f"{k} = {json.dumps(v)}" for k, v in axes.items())


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
            _inline_hf(pt.doc, sw.source)
            inst = parse_instance(pt.doc, f"point {pt.index}")
            found = _query_problems(sw, inst)
        except InputError as exc:
            found = exc.problems or [str(exc)]
        for prob in found:
            if prob in seen:
                seen[prob] = (seen[prob][0], seen[prob][1] + 1)
            else:
                seen[prob] = (pt.axes, 1)
    return [f"{prob}  [at {_axes_text(axes)}"
            + (f"; {plural(n - 1, 'more point')}" if n > 1 else "") + "]"
            for prob, (axes, n) in seen.items()]


def _query_problems(sw: Sweep, inst) -> list[str]:
    if sw.query == "solve" and len(inst.node_options) > 1:
        return ["cluster.nodes: gives a range of sizes; query = \"solve\" needs one size (use "
                "query = \"pareto\" or \"capacity\", or sweep \"cluster.nodes\" over counts)"]
    if sw.query == "capacity" and not inst.spec.training.tokens:
        return ["training.tokens: required with query = \"capacity\" (the token budget)"]
    if (sw.query == "capacity" and sw.budget_usd is not None
            and inst.spec.cluster.price_per_gpu_hour is None):
        return ["cluster.price_per_gpu_hour: required with budget_usd (the cost of a plan)"]
    if sw.query == "pareto" and len(inst.node_options) > 512:
        return [f"cluster.nodes: {len(inst.node_options):,} sizes; pareto takes at most 512"]
    return []


# ---------------------------------------------------------------------------------------------
# Running one point (in a worker)
# ---------------------------------------------------------------------------------------------

#: result keys that are not columns: constant text, per-stage detail, lists of sub-results,
#: the plan again as a [plan] table (its plan.* columns say it)
_SKIP = {"memory_by_stage_gib", "mfu_formula", "violations", "checked", "cheapest", "all",
         "next_smaller", "plan_spec"}


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
    s = f"TP{plan['tp']} PP{plan['pp']} DP{plan['dp']}"
    for k in ("cp", "ep", "vp"):
        if plan.get(k, 1) > 1:
            s += f" {k.upper()}{plan[k]}"
    s += f" mb{plan['micro_batch']}"
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
    return [{**head, **r, "point_wall_s": wall, **tail} for r in rows]


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
            miss = ans.next_smaller or {}
            row["solver.status"] = "infeasible"
            row["reason"] = (f"no size of the range meets {plural(ans.deadline_days, 'day')}"
                             + (f"; {miss.get('nodes')} nodes: {miss.get('proof')}" if miss else ""))
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


def default_workers() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:      # not Linux
        return os.cpu_count() or 1


def _ignore_sigint() -> None:
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)   # Ctrl-C is the parent's to handle


#: imported once by the fork server, so that each worker starts with the solver stack loaded
_PRELOAD = ["planner.app.sweep", "formulations.solve", "formulations.queries", "formulations.cpsat",
            "formulations.pyomo_backend"]


def _context():
    """The process start method: ``forkserver`` where there is one (workers forked from a clean
    server process that has imported the solver stack, not from this process, whose solver
    thread pools, e.g. HiGHS's after an in-process solve, would deadlock a forked child),
    else ``spawn``."""
    import multiprocessing as mp

    if "forkserver" in mp.get_all_start_methods():
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(_PRELOAD)
        return ctx
    return mp.get_context("spawn")


def run_local(tasks: list[dict], workers: int, on_rows: Callable[[list[dict]], None]) -> None:
    """Run tasks in this process (one worker) or a process pool, calling ``on_rows`` in this
    process as each point finishes. Ctrl-C terminates the pool and re-raises. As with any
    non-fork multiprocessing, a script calling this needs the ``if __name__ == "__main__":``
    guard (the ``plan`` command has it)."""
    if workers <= 1 or len(tasks) <= 1:
        for t in tasks:
            on_rows(run_point(t))
        return
    pool = _context().Pool(min(workers, len(tasks)), initializer=_ignore_sigint)
    try:
        for rows in pool.imap_unordered(run_point, tasks, chunksize=1):
            on_rows(rows)
        pool.close()
    except BaseException:
        pool.terminate()
        raise
    finally:
        pool.join()


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
                    ray.init(num_cpus=workers or default_workers(), **kw)
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
# Output files: append as points finish, resume, rewrite sorted at the end
# ---------------------------------------------------------------------------------------------

_ORDER = ("point", "pareto.nodes", "pareto.on_front", "capacity.nodes", "solver.status",
          "reason", "plan_label", "plan.", "step_time_s", "time_per_sequence_s", "breakdown_s.",
          "memory_gib.", "most_loaded_stage", "mfu", "model_tflops_per_gpu", "total_days",
          "cost", "tokens_per_step", "steps", "feasible", "capacity.", "deadline_days",
          "meets_deadline", "solver.", "point_wall_s", "point_key", "point_hash")


def column_order(rows: list[dict], axis_keys: list[str]) -> list[str]:
    """Axis columns first (file order), then the result columns in a fixed reading order."""
    seen: dict[str, None] = {}
    for r in rows:
        for k in r:
            seen.setdefault(k, None)
    rest = [k for k in seen if k not in axis_keys]

    def rank(k: str) -> tuple[int, int]:
        for i, pre in enumerate(_ORDER):
            if k == pre or (pre.endswith(".") and k.startswith(pre)):
                return (i, 0)
        return (len(_ORDER) - 3, 0)          # other result keys rank with point_wall_s
    # stable: first-seen order within a group, so the result keys _ORDER does not name
    # (caveats, framework, kernel_stack, ...) come after the solver block, before point_wall_s
    # (a row has them before it)
    rest.sort(key=rank)
    return [k for k in axis_keys if k in seen] + rest


def normalise(rows: list[dict], columns: list[str]) -> list[dict]:
    """One type per column (Parquet needs it): ints and floats mixed become floats; lists
    become JSON text; any other mix becomes text."""
    out = [dict(r) for r in rows]
    for c in columns:
        for r in out:
            if isinstance(r.get(c), list | tuple | dict):
                r[c] = json.dumps(r[c])
        kinds = {type(r[c]) for r in out if r.get(c) is not None}
        if kinds and kinds <= {int, float}:
            if float in kinds:
                for r in out:
                    if r.get(c) is not None:
                        r[c] = float(r[c])
        elif len(kinds) > 1:
            for r in out:
                if r.get(c) is not None:
                    r[c] = r[c] if isinstance(r[c], str) else json.dumps(r[c])
    return out


def _csv_text(rows: list[dict], columns: list[str], header: bool) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    if header:
        w.writerow(columns)
    for r in rows:
        w.writerow(["" if r.get(c) is None else _csv_cell(r[c]) for c in columns])
    return buf.getvalue()


def _csv_cell(v: Any) -> str:
    if isinstance(v, float):
        return repr(v)            # exact round trip
    return str(v)


#: columns that are text whatever they look like (a hash of digits, a reason such as "1e9")
_TEXT_COLUMNS = {"point_key", "point_hash", "reason", "plan_label", "solver.note"}


def _parse_cell(s: str) -> Any:
    if s == "":
        return None
    if s in ("True", "False"):
        return s == "True"
    try:
        return int(s)
    except ValueError:
        pass
    try:
        return float(s)
    except ValueError:
        return s


def read_rows(path: str | Path) -> list[dict]:
    """The rows of a sweep output (.csv or .parquet); a missing or empty file has none."""
    return _read_output(Path(path)).rows


@dataclass
class _Output:
    """What an output file holds, as read: its columns, its rows and (CSV) each row's line."""

    columns: list[str] = field(default_factory=list)
    rows: list[dict] = field(default_factory=list)
    lines: list[int] = field(default_factory=list)     # CSV: the line each row ends on
    widths: list[int] = field(default_factory=list)    # CSV: the fields on each row's line
    newline: bool = True                               # CSV: the file ends with a newline


def _read_output(p: Path) -> _Output:
    """Read a .csv or .parquet output as it is; :func:`resume_state` judges it."""
    if not p.exists() or p.stat().st_size == 0:
        return _Output()
    try:
        if p.suffix.lower() == ".parquet":
            table = _pyarrow_parquet().read_table(p)
            return _Output(list(table.column_names), table.to_pylist())
        return _read_csv(p)
    except PlanError:
        raise
    except UnicodeDecodeError:
        raise InputError(f"--out {p}: exists and is not a sweep output CSV (not UTF-8 text); "
                         "choose another file") from None
    except csv.Error as exc:
        raise InputError(f"--out {p}: exists and is not a sweep output CSV ({exc}); choose "
                         "another file") from None
    except Exception as exc:
        raise InputError(f"--out {p}: cannot read the existing file to resume: {exc}") from None


def _read_csv(p: Path) -> _Output:
    with p.open("rb") as f:
        f.seek(-1, os.SEEK_END)
        newline = f.read(1) == b"\n"
    out = _Output(newline=newline)
    with p.open(newline="", encoding="utf-8") as f:
        rd = csv.reader(f)
        out.columns = next(rd, None) or []
        for line in rd:
            if not line:
                continue
            # (an empty cell is None under its column, so that a column empty in every row,
            # such as reason when every point has a plan, survives the rewrite on resume)
            out.rows.append({c: (None if v == "" else v if c in _TEXT_COLUMNS else _parse_cell(v))
                             for c, v in zip(out.columns, line)})
            out.lines.append(rd.line_num)
            out.widths.append(len(line))
    return out


def write_rows(path: str | Path, rows: list[dict], columns: list[str]) -> None:
    """Write every row atomically (a temporary file renamed over the target). A value a row
    does not have is an empty cell in a CSV and null in Parquet, whether it is missing (the
    step time of a point without a plan) or an empty text (the reason of a point with one):
    a CSV cannot tell the two apart, and so Parquet does not either."""
    p = Path(path)
    rows = normalise(rows, columns)
    tmp = p.with_name(f".{p.name}.tmp")
    if p.suffix.lower() == ".parquet":
        pa, pq = _pyarrow(), _pyarrow_parquet()
        table = pa.Table.from_pylist([{c: (None if r.get(c) == "" else r.get(c)) for c in columns}
                                      for r in rows])
        pq.write_table(table, tmp)
    else:
        tmp.write_text(_csv_text(rows, columns, header=True), encoding="utf-8")
    os.replace(tmp, p)


def _pyarrow():
    try:
        import pyarrow
    except ImportError:
        raise InputError("Parquet output needs pyarrow: pip install -e '.[sweep]' "
                         "(or write --out results.csv)") from None
    return pyarrow


def _pyarrow_parquet():
    _pyarrow()
    import pyarrow.parquet as pq

    return pq


def check_out_path(path: str | Path) -> Path:
    p = Path(path)
    if p.suffix.lower() not in OUT_SUFFIXES:
        raise InputError(f"--out {p}: expected a file name ending in .csv or .parquet, got "
                         f"{p.suffix or 'no suffix'}")
    if p.is_dir():
        raise InputError(f"--out {p}: is a directory")
    if not p.parent.is_dir():
        raise InputError(f"--out {p}: the directory {p.parent} does not exist")
    if p.suffix.lower() == ".parquet":
        _pyarrow_parquet()
    _probe_writable(p)
    return p


def _probe_writable(p: Path) -> None:
    """Fail now, naming --out, rather than when the first point has run: the file is appended
    to, and rewritten through a temporary file beside it (:func:`write_rows`), so both must be
    writable."""
    tmp = p.with_name(f".{p.name}.tmp")
    try:
        with tmp.open("w"):
            pass
        tmp.unlink()
    except OSError as exc:
        raise InputError(f"--out {p}: cannot write a file in {p.parent} "
                         f"({exc.strerror or exc})") from None
    try:
        if p.exists():
            with p.open("a"):
                pass
    except OSError as exc:
        raise InputError(f"--out {p}: cannot write to it ({exc.strerror or exc})") from None


class Sink:
    """Collects rows; with a path, appends each point's rows as it finishes (CSV: one write per
    point, a new column rewrites the file; Parquet cannot append: the whole file is rewritten
    atomically at most every ``every_s`` seconds) and rewrites the file sorted at the end.

    ``existing`` are the rows a resume keeps (:func:`resume_state`): a CSV is appended to in its
    own ``columns``; ``rewrite`` (rows were dropped from the file) rewrites it at once, and a
    file without a final ``newline`` gets one before the first appended row."""

    def __init__(self, path: Path | None, axis_keys: list[str], existing: list[dict],
                 every_s: float = 2.0, columns: list[str] | None = None,
                 rewrite: bool = False, newline: bool = True):
        self.path, self.axis_keys, self.every_s = path, axis_keys, every_s
        self.rows: list[dict] = list(existing)
        self.columns = column_order(self.rows, axis_keys) if self.rows else []
        if path is not None and path.suffix.lower() == ".csv" and self.rows and columns:
            self.columns = list(columns)      # append in the existing file's column order
        self.newline = newline
        self.last = time.monotonic()
        self.dirty = False
        if rewrite:
            self.flush()

    def add(self, rows: list[dict]) -> None:
        self.rows.extend(rows)
        if self.path is None:
            return
        new_cols = [k for r in rows for k in r if k not in self.columns]
        if self.path.suffix.lower() == ".csv" and not new_cols and self.columns:
            text = _csv_text(normalise(rows, self.columns), self.columns, header=False)
            if not self.newline:          # else the row would be glued to the last line
                text, self.newline = "\n" + text, True
            with self.path.open("a", newline="", encoding="utf-8") as f:
                f.write(text)             # one write per point: Ctrl-C lands between points
            return
        if new_cols:
            self.columns = column_order(self.rows, self.axis_keys)
        self.dirty = True
        if self.path.suffix.lower() == ".csv" or time.monotonic() - self.last >= self.every_s:
            self.flush()

    def flush(self) -> None:
        if self.path is not None and self.rows:
            write_rows(self.path, self.rows, self.columns)
            self.last, self.dirty, self.newline = time.monotonic(), False, True

    def finish(self) -> None:
        """Rewrite sorted by point (and size), so the file does not depend on finishing order."""
        self.rows.sort(key=lambda r: (_int(r.get("point")), _int(r.get("pareto.nodes"))))
        self.columns = column_order(self.rows, self.axis_keys)
        self.flush()


def _int(v: Any) -> int:
    return v if isinstance(v, int) else -1


# ---------------------------------------------------------------------------------------------
# Resuming from an existing output
# ---------------------------------------------------------------------------------------------

#: what every row plan sweep writes has besides its axes (run_point's head and tail, and a
#: status and a reason whatever the outcome)
_ROW_COLUMNS = ("point", "solver.status", "reason", "point_key", "point_hash")
#: what every row with a plan has besides those (among them what the table and figure read)
_PLAN_COLUMNS = ("plan_label", "step_time_s", "time_per_sequence_s", "mfu", "total_days", "cost")
#: the result columns _ORDER does not name (they sort with point_wall_s): result-document keys
#: ("plan" is the empty plan of a point without one; nodes and unproven are capacity's)
_OTHER_COLUMNS = ("plan", "caveats", "framework", "kernel_stack", "nodes", "unproven")
#: columns of numbers (or nothing): a text there is a hand edit the table and figure fail on
_NUMBER_COLUMNS = ("point", "pareto.nodes", "capacity.nodes", "step_time_s",
                   "time_per_sequence_s", "breakdown_s.", "memory_gib.", "mfu",
                   "model_tflops_per_gpu", "total_days", "cost", "tokens_per_step", "steps",
                   "point_wall_s")


_RESTORE = "restore it, or write to another file"


def _matches(column: str, names: Iterable[str]) -> bool:
    """``column`` is one of ``names``, or under one that ends with a dot (``breakdown_s.``)."""
    return any(column == n or (n.endswith(".") and column.startswith(n)) for n in names)


def written_column(column: str, axis_keys: Iterable[str]) -> bool:
    """Whether plan sweep writes ``column`` in the output of a sweep with these axes."""
    return column in axis_keys or _matches(column, _ORDER) or column in _OTHER_COLUMNS


@dataclass
class Resume:
    """What an existing output gives a run: the rows it keeps, the points they finish, and how
    the file is to be written on (see :class:`Sink`)."""

    rows: list[dict] = field(default_factory=list)
    columns: list[str] = field(default_factory=list)
    done: set[str] = field(default_factory=set)
    foreign: int = 0
    notes: list[str] = field(default_factory=list)
    rewrite: bool = False
    newline: bool = True


def resume_state(out: Path | None, sw: Sweep) -> Resume:
    """Read ``out`` and judge it before any point runs. Another sweep's file, an edited header,
    a text in a number column, or one point twice with different results are refused (exit 2,
    naming the file and what is wrong) rather than mixed into this sweep's rows; a last line
    cut short (a run killed while writing) and repeated identical rows are dropped with a note
    (their points run again, or once)."""
    got = _read_output(out) if out is not None else _Output()
    if not got.columns and not got.rows:
        return Resume()
    _check_header(out, got.columns)
    notes: list[str] = []
    rows = _drop_cut_line(out, got, sw, notes)
    _check_identity(out, rows, got)
    res = Resume(rows, got.columns, notes=notes, newline=got.newline,
                 rewrite=len(rows) < len(got.rows))
    by_key = {p.key: p for p in sw.points}
    hashes = {p.key: point_hash(p, sw.options()) for p in sw.points}
    for r in rows:
        k = r.get("point_key")
        if k not in by_key:
            res.foreign += 1
            continue
        if r.get("point_hash") != hashes[k]:
            raise InputError(
                f"--out {out}: holds a result of a different sweep for the point "
                f"{_axes_text(json.loads(k))} (its instance or query options changed); "
                "write to another file, or delete this one to start over")
        res.done.add(k)
    if rows and not res.done:
        raise InputError(f"--out {out}: holds another sweep's rows (none of its "
                         f"{plural(len(rows), 'row')} is a point of {sw.source}); write to "
                         "another file, or delete this one to start over")
    _check_columns(out, got.columns, rows, sw.axis_keys)
    _check_numbers(out, rows)
    res.rows = _drop_repeats(out, rows, got, notes)
    res.rewrite = res.rewrite or len(res.rows) < len(rows)
    for r in res.rows:            # (axis values as the sweep has them: a list, not its JSON)
        p = by_key.get(r.get("point_key"))
        if p is not None:
            r.update(p.axes)
            r["point"] = p.index
    return res


def _check_header(out: Path, columns: list[str]) -> None:
    """The columns every output has, each once."""
    if "point_key" not in columns:
        raise InputError(f"--out {out}: exists and is not a sweep output (no point_key "
                         "column); choose another file")
    seen: set[str] = set()
    for c in columns:
        if c in seen:
            raise InputError(f"--out {out}: the column {c!r} appears twice in its header, "
                             f"which plan sweep never writes (edited?); {_RESTORE}")
        seen.add(c)
    for c in _ROW_COLUMNS:
        if c not in seen:
            raise InputError(f"--out {out}: no {c!r} column, which every row plan sweep writes "
                             f"has (renamed or deleted?); {_RESTORE}")


def _drop_cut_line(out: Path, got: _Output, sw: Sweep, notes: list[str]) -> list[dict]:
    """The rows without a last line cut short. A CSV line has as many fields as the header,
    except a last line without its newline where a run stopped while writing: it has fewer
    fields, or a point_hash that is only the start of its point's."""
    rows, n = got.rows, len(got.columns)
    for i, width in enumerate(got.widths):
        if width != n and not (i == len(rows) - 1 and not got.newline and width < n):
            raise InputError(f"--out {out}: line {got.lines[i]} has {width} fields where the "
                             f"header has {n}: not a file plan sweep wrote (edited?); "
                             f"{_RESTORE}")
    if got.widths and not got.newline and (got.widths[-1] < n or _hash_cut(rows[-1], sw)):
        notes.append(f"the last line of {out} (line {got.lines[-1]}) was cut short, as by a "
                     "run stopped while writing it; dropped: its point runs again")
        return rows[:-1]
    return rows


def _check_identity(out: Path, rows: list[dict], got: _Output) -> None:
    """Every row names its point: a point_key (its axis values as a JSON table) and a
    point_hash. A row without them was not written by plan sweep, and would be kept as another
    sweep's."""
    for i, r in enumerate(rows):
        try:
            ok = isinstance(json.loads(r.get("point_key") or ""), dict) and r.get("point_hash")
        except (TypeError, ValueError):
            ok = False
        if not ok:
            where = f"line {got.lines[i]}" if got.lines else f"row {i + 1}"
            raise InputError(f"--out {out}: {where} has no point_key and point_hash naming its "
                             f"point, which every row plan sweep writes has (edited?); "
                             f"{_RESTORE}")


def _hash_cut(row: dict, sw: Sweep) -> bool:
    """The row's point_hash is the start of its point's hash, not all of it."""
    p = next((p for p in sw.points if p.key == row.get("point_key")), None)
    if p is None:
        return False
    full, got = point_hash(p, sw.options()), str(row.get("point_hash") or "")
    return got != full and full.startswith(got)


def _check_columns(out: Path, columns: list[str], rows: list[dict], axis_keys: list[str]) -> None:
    """Every axis column, the plan columns when a row has a plan, and no column plan sweep does
    not write (a result column renamed is one missing and one unknown)."""
    for key in axis_keys:
        if key not in columns:
            raise InputError(f"--out {out}: no {key!r} column, an axis of this sweep (renamed "
                             f"or deleted?); {_RESTORE}")
    if any(r.get("plan_label") for r in rows):
        for c in _PLAN_COLUMNS:
            if c not in columns:
                raise InputError(f"--out {out}: no {c!r} column, which every row with a plan "
                                 f"has (renamed or deleted?); {_RESTORE}")
    for c in columns:
        if not written_column(c, axis_keys):
            raise InputError(f"--out {out}: the column {c!r} is not one plan sweep writes for "
                             f"this sweep (renamed, or added by hand?); {_RESTORE}")


def _row_name(r: dict) -> str:
    """A row as the user finds it: its point index and axis values."""
    try:
        axes = json.loads(r.get("point_key") or "")
    except (TypeError, ValueError):
        axes = None
    return f"point {r.get('point')}" + (f" ({_axes_text(axes)})" if isinstance(axes, dict)
                                        else "")


def _check_numbers(out: Path, rows: list[dict]) -> None:
    """A number (or nothing) in every number column; the point index a whole number."""
    for r in rows:
        for c, v in r.items():
            if v is None or not _matches(c, _NUMBER_COLUMNS):
                continue
            ok = isinstance(v, int) if c == "point" else isinstance(v, int | float)
            if isinstance(v, bool) or not ok:
                raise InputError(f"--out {out}: {_row_name(r)}: {c} = {json.dumps(v)} is not "
                                 f"a {'point index' if c == 'point' else 'number'} (edited?); "
                                 "fix the cell, or delete the row to run its point again")


def _drop_repeats(out: Path, rows: list[dict], got: _Output, notes: list[str]) -> list[dict]:
    """One row per point (per point and size for pareto): a repeat with the same results (the
    wall clocks aside) is dropped with a note; one with other results is refused."""
    first: dict[tuple, int] = {}
    kept, dropped = [], 0
    for i, r in enumerate(rows):
        ident = (r.get("point_key"), r.get("pareto.nodes"))
        if ident not in first:
            first[ident] = i
            kept.append(r)
        elif comparable([r]) == comparable([rows[first[ident]]]):
            dropped += 1
        else:
            where = (f" (lines {got.lines[first[ident]]} and {got.lines[i]})"
                     if got.lines else "")
            raise InputError(f"--out {out}: {_row_name(r)} has two rows with different "
                             f"results{where}; delete the wrong one, or write to another file")
    if dropped:
        notes.append(f"{plural(dropped, 'repeated row')} of {out} (a point with the same results "
                     "twice) dropped")
    return kept


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
        raise InputError(f"--engine: expected one of {', '.join(ENGINES)}, got {engine!r}")
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
            run_local(tasks, workers or default_workers(), on_rows)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        sink.finish()
    keys = {p.key for p in sw.points}
    rows = [r for r in sink.rows if r.get("point_key") in keys]
    return SweepRun(sw, rows, count - len(done), len(done), resume.foreign, interrupted,
                    time.perf_counter() - t0, resume.notes)


def comparable(rows: list[dict]) -> list[dict]:
    """Rows without their wall-clock columns and empty cells (a CSV cannot tell an empty text
    from a missing value): what must be identical whichever engine ran."""
    return [{k: v for k, v in r.items() if k not in TIMING_COLUMNS and v not in (None, "")}
            for r in rows]


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

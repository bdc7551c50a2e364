"""Figures of a sweep (``plan sweep SWEEP.toml --plot FILE.png``).

Two panels. Left, the figure that fits the axes: a line plot of the metric (``[plot] y``:
step time by default, or ``speedup`` over the first value of the x axis on each line) against
one axis with one line per value of the others, or a heatmap when the sweep has two axes of
many values each (``[plot] kind = "heatmap"`` forces it). Right, the step time of every point
split into its named terms (compute, bubble, each communication, optimizer) as shares of the
step: AMPeD's per-configuration pie charts drawn as stacked bars. Infeasible points are gaps
(grey crosses in a heatmap) and the title counts them.

matplotlib is an optional dependency (``pip install 'plan[plot]'``) and is imported only here.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from planner.model.errors import InputError
from planner.model.terms import TIME_TERM_LABELS, TIME_TERMS

STYLE = {"font.size": 9, "axes.titlesize": 10, "axes.labelsize": 9, "legend.fontsize": 8}
Y_LABELS = {"step_time_s": "step time (s)", "speedup": "speedup (x)",
            "total_days": "training time (days)", "cost": "training cost (USD)",
            "mfu": "MFU", "memory_gib.total": "memory per GPU (GiB)",
            "time_per_sequence_s": "time per sequence (s)",
            "capacity.nodes": "nodes to meet the deadline"}
TERM_LABELS = {term: short for term, (_, short) in TIME_TERM_LABELS.items()}
HEATMAP_MIN_VALUES = 7       # auto: a heatmap when both axes have at least this many values


def _short(key: str) -> str:
    return key.rsplit(".", 1)[-1]


def _fmt(v: Any) -> str:
    """A value as the sweep file writes it: a list value of an axis reads [1, 16] whether the
    row holds a list (run now) or a tuple (grouped for a line)."""
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_fmt(x) for x in v) + "]"
    return str(v)


def _numeric(values: list[Any]) -> bool:
    return all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)


def _metric(row: dict[str, Any], y: str) -> float:
    v = row.get("step_time_s" if y == "speedup" else y)
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else math.nan


def layout(sweep) -> dict[str, Any]:
    """What the left panel shows: kind, x column, the line keys and the metric."""
    opts = sweep.plot
    keys = sweep.axis_keys
    default_y = "capacity.nodes" if sweep.query == "capacity" else "step_time_s"
    y = opts.get("y", default_y)
    if sweep.query == "pareto":         # every point is a front: GPUs sizes on the x axis
        return {"kind": "lines", "x": "pareto.nodes", "lines": keys, "y": y}
    values = {a.key: list(a.values) for a in sweep.axes}
    kind = opts.get("kind", "auto")
    if kind == "auto":
        kind = ("heatmap" if len(keys) == 2 and all(len(values[k]) >= HEATMAP_MIN_VALUES
                                                     for k in keys) else "lines")
    if kind == "heatmap" and len(keys) != 2:
        raise InputError(f"[plot] kind = \"heatmap\" needs exactly two axes; this sweep has "
                         f"{len(keys)}")
    x = opts.get("x")
    if x is None:
        if "lines" in opts:
            rest = [k for k in keys if k != opts["lines"]]
        else:
            rest = list(keys)
        numeric = [k for k in rest if _numeric(values[k])]
        x = max(numeric, key=lambda k: len(values[k])) if numeric else rest[0]
    lines = [opts["lines"]] if "lines" in opts else [k for k in keys if k != x]
    if "lines" in opts:
        lines += [k for k in keys if k not in (x, opts["lines"])]
    return {"kind": kind, "x": x, "lines": lines, "y": y}


def plot_sweep(rows: list[dict[str, Any]], sweep, path: str | Path) -> list[str]:
    """Write the sweep's figure to ``path`` (PNG, PDF or SVG by its suffix). Returns warnings
    for the user (the CLI prints them on stderr): what the figure leaves out and why."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise InputError("plotting needs matplotlib: pip install 'plan[plot]'") from None
    lay = layout(sweep)
    solved = [r for r in rows if r.get("plan_label")]
    if not solved:
        raise InputError("--plot: nothing to plot: no point has a plan")
    failed = len({r.get("point") for r in rows} - {r.get("point") for r in solved})
    title = sweep.plot.get("title") or Path(sweep.source).stem
    if failed:
        title += f" ({failed} point(s) without a plan)"
    warnings: list[str] = []
    y = lay["y"]
    no_values = all(math.isnan(_metric(r, y)) for r in rows)
    if no_values:         # (e.g. cost without a price, capacity.nodes of a solve sweep)
        warnings.append(f"--plot: [plot] y = \"{y}\": no row has a value of it; the left "
                        "panel is empty")
    with plt.rc_context(STYLE):
        fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.6),
                                     gridspec_kw={"width_ratios": [1.1, 1]})
        if lay["kind"] == "heatmap":
            _heatmap(ax, fig, rows, sweep, lay, warnings)
        else:
            _lines(ax, rows, sweep, lay, warnings)
        if no_values:
            ax.text(0.5, 0.5, f"no values of {y}", transform=ax.transAxes, ha="center",
                    va="center", color="#555555")
        _breakdown(bx, solved, sweep)
        fig.suptitle(title.replace("$", r"\$"), fontsize=11, fontweight="bold")
        fig.tight_layout()
        try:
            fig.savefig(path, dpi=100)
        except OSError as exc:
            raise InputError(f"--plot {path}: cannot write: {exc.strerror or exc}") from None
        plt.close(fig)
    return warnings


def _order(sweep, key: str) -> list[Any]:
    for a in sweep.axes:
        if a.key == key:
            return list(a.values)
    return []


def _no_base(x: str, first: Any, lines: list[str]) -> str:
    """The warning for speedups with no base: the first x value has no plan on those lines."""
    return (f"--plot: [plot] y = \"speedup\" is over the first value of {x} ({_fmt(first)}), "
            f"which has no plan for {'; '.join(lines)}: those speedups are not drawn")


def _lines(ax, rows, sweep, lay, warnings: list[str]) -> None:
    x, y, line_keys = lay["x"], lay["y"], lay["lines"]
    if x == "pareto.nodes":
        xs_all = sorted({r["pareto.nodes"] for r in rows if r.get("pareto.nodes") is not None})
    else:
        xs_all = _order(sweep, x)
    numeric = _numeric(xs_all)
    groups: dict[tuple, dict[Any, float]] = {}
    for r in rows:
        g = tuple(_hashable(r.get(k)) for k in line_keys)
        groups.setdefault(g, {})[_hashable(r.get(x))] = _metric(r, y)
    order = {k: [_hashable(v) for v in _order(sweep, k)] for k in line_keys}
    keys = sorted(groups, key=lambda g: tuple(order[k].index(v) if v in order[k] else 0
                                              for k, v in zip(line_keys, g)))
    if len(keys) > 12:
        raise InputError(f"--plot: {len(keys)} lines (one per combination of "
                         f"{', '.join(line_keys)}); set [plot] x and lines, or use fewer axes")
    pos = {v: (v if numeric else i) for i, v in enumerate(_hashable(v) for v in xs_all)}
    no_base = []
    for g in keys:
        pts = groups[g]
        xs = [v for v in (_hashable(v) for v in xs_all) if v in pts]
        ys = [pts[v] for v in xs]
        label = ", ".join(f"{_short(k)}={_fmt(v)}" if k != "case" else _fmt(v)
                          for k, v in zip(line_keys, g)) or None
        if y == "speedup":          # over the first x value, as the heatmap: none, no speedups
            base = pts.get(_hashable(xs_all[0]), math.nan) if xs_all else math.nan
            ys = [base / v if v and not math.isnan(v) else math.nan for v in ys]
            if math.isnan(base):
                no_base.append(label or "the line")
                label = label and f"{label} (no plan at {_fmt(xs_all[0])})"
        ax.plot([pos[v] for v in xs], ys, "-o", ms=4, lw=1.6, label=label)
    if no_base and any(not math.isnan(v) for g in groups.values() for v in g.values()):
        warnings.append(_no_base(x, xs_all[0], no_base))
    if numeric and xs_all and min(xs_all) > 0 and max(xs_all) / min(xs_all) >= 8:
        ax.set_xscale("log", base=2)
    if numeric:
        ax.set_xticks(list(xs_all))
        ax.set_xticklabels([_fmt(v) for v in xs_all], rotation=45 if len(xs_all) > 8 else 0)
    else:
        ax.set_xticks(range(len(xs_all)))
        ax.set_xticklabels([_fmt(v) for v in xs_all], rotation=30, ha="right")
    if numeric:
        ax.minorticks_off()
    vals = [v for g in groups.values() for v in g.values() if not math.isnan(v)]
    if y in ("step_time_s", "total_days", "time_per_sequence_s") and vals and (
            min(vals) > 0 and max(vals) / min(vals) > 20):
        ax.set_yscale("log")
    ax.set_xlabel("nodes" if x == "pareto.nodes" else x)
    ax.set_ylabel(Y_LABELS.get(y, y) + (" over the first x value" if y == "speedup" else ""))
    ax.grid(True, alpha=0.3)
    if any(ax.get_legend_handles_labels()[1]):
        ax.legend(loc="best", frameon=True)
    ax.set_title(f"{Y_LABELS.get(y, y)} vs {_short(x)}")


def _hashable(v: Any) -> Any:
    return tuple(v) if isinstance(v, list) else v


def _heatmap(ax, fig, rows, sweep, lay, warnings: list[str]) -> None:
    import numpy as np
    from matplotlib.colors import LogNorm

    x, y = lay["x"], lay["y"]
    other = lay["lines"][0]
    xs, ys = _order(sweep, x), _order(sweep, other)
    grid = np.full((len(ys), len(xs)), np.nan)
    for r in rows:
        try:
            i = [_hashable(v) for v in ys].index(_hashable(r.get(other)))
            j = [_hashable(v) for v in xs].index(_hashable(r.get(x)))
        except ValueError:
            continue
        grid[i, j] = _metric(r, y)
    if y == "speedup":              # over the first x value: none, no speedups on that row
        empty = [f"{_short(other)}={_fmt(v)}" for v, base in zip(ys, grid[:, 0])
                 if np.isnan(base) and not np.isnan(grid).all()]
        if empty and xs:
            warnings.append(_no_base(x, xs[0], empty))
        grid = grid[:, :1] / grid
    vals = grid[~np.isnan(grid)]
    norm = LogNorm() if (vals.size and vals.min() > 0 and vals.max() / vals.min() > 20) else None
    im = ax.imshow(np.ma.masked_invalid(grid), aspect="auto", cmap="viridis", norm=norm,
                   origin="lower")
    ax.set_facecolor("#d0d0d0")
    fig.colorbar(im, ax=ax, label=Y_LABELS.get(y, y))
    ax.set_xticks(range(len(xs)))
    ax.set_xticklabels([_fmt(v) for v in xs], rotation=45 if len(xs) > 8 else 0)
    ax.set_yticks(range(len(ys)))
    ax.set_yticklabels([_fmt(v) for v in ys])
    if grid.size <= 150:
        for i in range(grid.shape[0]):
            for j in range(grid.shape[1]):
                v = grid[i, j]
                ax.text(j, i, "x" if np.isnan(v) else f"{v:.3g}", ha="center", va="center",
                        fontsize=7, color="white" if not np.isnan(v) else "#555555")
    ax.set_xlabel(x)
    ax.set_ylabel(other)
    ax.set_title(f"{Y_LABELS.get(y, y)} ({_short(other)} x {_short(x)})")


def _breakdown(ax, solved, sweep) -> None:
    terms = [t for t in TIME_TERMS if any((r.get(f"breakdown_s.{t}") or 0) > 0 for r in solved)]
    labels = []
    for r in solved:
        parts = [_fmt(r.get(k)) for k in sweep.axis_keys]
        if r.get("pareto.nodes") is not None:
            parts.append(f"{r['pareto.nodes']}n")
        labels.append("/".join(parts))
    bottom = [0.0] * len(solved)
    colors = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3",
              "#8c8c8c", "#ccb974"]
    for i, t in enumerate(terms):
        share = [100 * (r.get(f"breakdown_s.{t}") or 0) / r["step_time_s"] for r in solved]
        ax.bar(range(len(solved)), share, bottom=bottom, color=colors[i % len(colors)],
               label=TERM_LABELS[t], width=0.85)
        bottom = [b + s for b, s in zip(bottom, share)]
    step = max(1, math.ceil(len(solved) / 40))
    ax.set_xticks(range(0, len(solved), step))
    ax.set_xticklabels(labels[::step], rotation=90, fontsize=6 if len(solved) > 20 else 7)
    ax.set_ylim(0, 100)
    ax.set_ylabel("share of the step time (%)")
    ax.set_xlabel(" / ".join(_short(k) for k in sweep.axis_keys)
                  + (" / nodes" if sweep.query == "pareto" else ""))
    ax.set_title("step time breakdown per point")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, frameon=False)

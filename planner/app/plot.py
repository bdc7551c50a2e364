"""A picture of a GPUs / step time / cost front (``plan pareto --plot front.png``).

Left panel: step time against GPUs on log-log axes, the front joined and labelled with each
plan (``TP8 PP8 DP16 EP8 mb1``, every degree above 1, and ``B512``, the global batch, when the
sizes chose different batches), dominated points faint; a right-hand axis gives training days when
every point has the same days per second of step time (a fixed batch and token budget). Right
panel: dollars against GPUs (a linear axis from $0) when every point has a cost, else
training days when they do not follow from the step time (a batch range).

matplotlib is an optional dependency (``pip install 'plan[plot]'``) and is imported only here.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from planner.model.errors import InputError
from planner.model.plan import plan_label as label_of

FRONT = "#1f5fbf"
OTHER = "#9a9a9a"
STYLE = {"font.size": 10, "axes.titlesize": 12, "axes.labelsize": 11, "legend.fontsize": 9}


def plan_label(plan: dict[str, Any], batch: bool = False) -> str:
    """:func:`planner.model.plan.plan_label` of a plan dict (``Plan.to_dict()``); with ``batch``
    also the global batch (for a front whose sizes chose different batches)."""
    return label_of(plan) + (f" B{plan['global_batch']}" if batch and "global_batch" in plan
                             else "")


def _dollars(v: float, locs: list[float] | tuple = ()) -> str:
    """``$1.02M``: the unit from the largest tick, decimals enough to tell the ticks apart."""
    if v == 0:
        return "$0"
    top = max([abs(x) for x in locs] + [abs(v)])
    scale, suffix = next(((f, u) for f, u in ((1e9, "B"), (1e6, "M"), (1e3, "k")) if top >= f),
                         (1.0, ""))
    steps = [b - a for a, b in zip(locs, locs[1:]) if b > a]
    decimals = 2 if not steps else min(4, max(0, math.ceil(-math.log10(min(steps) / scale) - 1e-9)))
    return f"${v / scale:,.{decimals}f}{suffix}"


def _plain(v: float, _pos: Any = None) -> str:
    """A tick value as written: digit groups from 1 up (``2,048``), and the decimals a log
    axis's 1.5, 2.5 ... mantissas need (``1.5``, not ``2``, beside the 2 tick)."""
    if v >= 1:
        return f"{v:,.3f}".rstrip("0").rstrip(".")
    return f"{v:g}"


def _log_subs(span: float) -> tuple[float, ...]:
    """Mantissas of the labelled ticks on a log axis spanning ``span`` (max / min): denser
    within a decade so that a narrow range still shows several values."""
    if span < 4:
        return (1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0)
    if span < 30:
        return (1.0, 2.0, 3.0, 5.0)
    return (1.0, 2.0, 5.0)


def _gpus(ps: list[dict]) -> list[int]:
    return [p["plan"]["gpus"] for p in ps]


PLOT_SUFFIXES = (".png", ".pdf", ".svg")


def check_plot_path(path: str | Path) -> Path:
    """The plot's path, checked before any solving: a supported suffix, an existing directory,
    not a directory itself. Raises :class:`~planner.model.errors.InputError` naming the problem."""
    p = Path(path)
    if p.is_dir():
        raise InputError(f"--plot {p}: is a directory; expected a file name such as {p / 'front.png'}")
    if p.suffix.lower() not in PLOT_SUFFIXES:
        raise InputError(f"--plot {p}: expected a file name ending in "
                         f"{', '.join(PLOT_SUFFIXES)}, got {p.suffix or 'no suffix'}")
    if not p.parent.is_dir():
        raise InputError(f"--plot {p}: the directory {p.parent} does not exist")
    return p


def plot_front(points: list[dict], path: str | Path, title: str) -> None:
    """Write a PNG (150 dpi) of plan results to ``path``.

    ``points`` are :meth:`StepReport.to_dict` documents (``plan``, ``step_time_s``, ``cost``,
    ``total_days``) with an optional ``on_front`` flag; when no point carries the flag every
    point is drawn as part of the front. Points without a plan or a step time are skipped.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import Formatter, FuncFormatter, LogLocator, NullFormatter
    except ImportError:
        raise InputError("plotting needs matplotlib: pip install 'plan[plot]'") from None

    pts = [p for p in points if p.get("plan") and p.get("step_time_s")]
    if not pts:
        raise InputError("nothing to plot: no point has a plan and a step time")
    flagged = any("on_front" in p for p in pts)
    on = [bool(p.get("on_front", not flagged)) for p in pts]
    front = sorted((p for p, f in zip(pts, on) if f), key=lambda p: (p["plan"]["gpus"], p["step_time_s"]))
    rest = [p for p, f in zip(pts, on) if not f]

    # days = step time * steps / 86400: one ratio for every point means a second y axis will do
    has_days = all(p.get("total_days") is not None for p in pts)
    ratios = [p["total_days"] / p["step_time_s"] for p in pts] if has_days else []
    days_ratio = None
    if ratios and max(ratios) - min(ratios) <= 1e-9 * max(ratios):
        days_ratio = ratios[0]
    if all(p.get("cost") is not None for p in pts):
        second = "cost"
    elif has_days and days_ratio is None:
        second = "total_days"
    else:
        second = None

    class _DollarFormatter(Formatter):
        def format_ticks(self, values: list[float]) -> list[str]:   # sees every tick at once
            return [_dollars(v, tuple(values)) for v in values]

        def __call__(self, x: float, pos: Any = None) -> str:
            return _dollars(x)

    with plt.rc_context(STYLE):
        ncols = 2 if second else 1
        fig, axes = plt.subplots(1, ncols, figsize=(7.5 * ncols, 5.6), squeeze=False)
        ax = axes[0][0]
        _panel(ax, front, rest, "step_time_s", log_y=True)
        ax.set_ylabel("step time (s)")
        ax.set_title("step time vs GPUs")
        if days_ratio:
            r = days_ratio
            sec = ax.secondary_yaxis("right", functions=(lambda s: s * r, lambda d: d / r))
            sec.set_ylabel("training days")
            steps = [p["step_time_s"] for p in pts]
            sec.yaxis.set_major_locator(LogLocator(base=10, subs=_log_subs(max(steps) / min(steps))))
            sec.yaxis.set_major_formatter(FuncFormatter(_plain))
            sec.yaxis.set_minor_formatter(NullFormatter())
        if second:
            ax2 = axes[0][1]
            _panel(ax2, front, rest, second, log_y=second == "total_days")
            if second == "cost":
                # a linear dollar axis from $0: a reader compares bar-like heights, and a
                # range cut to the data would turn a 6% difference into a cliff
                ax2.set_ylim(bottom=0, top=max(p["cost"] for p in pts) * 1.15)
                ax2.yaxis.set_major_formatter(_DollarFormatter())
                ax2.set_ylabel("training cost (USD, axis from $0)")
                ax2.set_title("cost vs GPUs")
            else:
                ax2.set_ylabel("training time (days)")
                ax2.set_title("training days vs GPUs")
        fig.suptitle(title.replace("$", r"\$"), fontsize=14, fontweight="bold")  # no mathtext
        fig.tight_layout()
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        batch = len({p["plan"].get("global_batch") for p in pts}) > 1
        _annotate(ax, front, "step_time_s", renderer, batch)
        if second:
            _annotate(axes[0][1], front, second, renderer, batch)
        try:
            fig.savefig(path, dpi=150)
        except OSError as exc:
            raise InputError(f"--plot {path}: cannot write: {exc.strerror or exc}") from None
        plt.close(fig)


def _panel(ax: Any, front: list[dict], rest: list[dict], ykey: str, log_y: bool) -> None:
    """One panel: faint dominated points, the front joined and labelled, log GPU axis."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    if rest:
        ax.scatter(_gpus(rest), [p[ykey] for p in rest], s=28, color=OTHER, alpha=0.45,
                   edgecolors="none", label="dominated", zorder=2)
    ax.plot(_gpus(front), [p[ykey] for p in front], "-o", color=FRONT, lw=2, ms=7,
            markeredgecolor="white", markeredgewidth=1.2, label="front", zorder=3)
    ax.set_xscale("log")
    if log_y:
        ys = [p[ykey] for p in front + rest]
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=_log_subs(max(ys) / min(ys))))
        ax.yaxis.set_major_formatter(FuncFormatter(_plain))
        ax.yaxis.set_minor_formatter(NullFormatter())
    xs = sorted(set(_gpus(front) + _gpus(rest)))
    if len(xs) <= 12:
        ax.set_xticks(xs)
    else:
        ax.xaxis.set_major_locator(LogLocator(base=10, subs=_log_subs(xs[-1] / xs[0])))
    ax.xaxis.set_major_formatter(FuncFormatter(_plain))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("GPUs")
    ax.grid(True, which="major", alpha=0.35)
    ax.grid(True, which="minor", alpha=0.12)
    ax.margins(x=0.1, y=0.12)
    ax.legend(loc="best", frameon=True)


def _annotate(ax: Any, front: list[dict], ykey: str, renderer: Any, batch: bool = False) -> None:
    """Label front points on the side away from the line: right of the point, above a falling
    line and below a rising one (the last point on its left), else on the other vertical side.
    The ends are labelled first; a label that would overlap another or leave the panel is left
    out, and the panel title says how many plans are labelled."""
    from matplotlib.text import Text

    ys = [p[ykey] for p in front]
    n = len(front)
    if not n:
        return
    frame = ax.get_window_extent(renderer)
    placed: list[Any] = []
    order = [0] + ([n - 1] if n > 1 else []) + list(range(1, n - 1))
    for i in order:
        p = front[i]
        nb = (i - 1 if i == n - 1 else i + 1) if n > 1 else i
        lo, hi = (nb, i) if nb < i else (i, nb)
        rising = ys[hi] > ys[lo]
        left = i == n - 1 and n > 1
        up = rising if left else not rising
        for u in (up, not up):
            ann = ax.annotate(
                plan_label(p["plan"], batch), (p["plan"]["gpus"], p[ykey]),
                xytext=(-7 if left else 7, 8 if u else -8), textcoords="offset points",
                ha="right" if left else "left", va="bottom" if u else "top",
                fontsize=8, color="#222222", zorder=4,
                bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": "none", "alpha": 0.8})
            ann.update_positions(renderer)
            box = Text.get_window_extent(ann, renderer).expanded(1.04, 1.2)
            inside = (box.x0 >= frame.x0 and box.x1 <= frame.x1
                      and box.y0 >= frame.y0 and box.y1 <= frame.y1)
            if inside and not any(box.overlaps(b) for b in placed):
                placed.append(box)
                break
            ann.remove()
    if len(placed) < n:
        ax.set_title(f"{ax.get_title()} (labels on {len(placed)} of {n} front plans)")

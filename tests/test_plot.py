"""The front plot writes a real PNG (skipped without matplotlib)."""

from __future__ import annotations

import struct
import sys

import pytest

from planner.model.errors import InputError
from planner.model.plan import Plan
from planner.app.plot import _dollars, _plain, plan_label, plot_front

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _point(gpus: int, step: float, *, tp=8, pp=8, vp=1, cp=1, mb=1, on_front=None,
           cost: float | None = 0.0, days_per_s: float = 1.1) -> dict:
    dp = gpus // (tp * pp * cp)
    d = {
        "plan": {"tp": tp, "pp": pp, "dp": dp, "cp": cp, "vp": vp, "micro_batch": mb,
                 "gpus": gpus, "global_batch": 1536},
        "step_time_s": step,
        "total_days": step * days_per_s,
        "cost": None if cost is None else gpus * step * days_per_s * 24 * 2.0,
    }
    if on_front is not None:
        d["on_front"] = on_front
    return d


def _front() -> list[dict]:
    pts = []
    for gpus, step in ((128, 150.0), (256, 76.0), (512, 38.5), (1024, 19.6), (2048, 10.3)):
        pts.append(_point(gpus, step, vp=3, on_front=True))
        pts.append(_point(gpus, step * 1.06, pp=16, on_front=False))
        pts.append(_point(gpus, step * 1.15, mb=2, on_front=False))
    return pts


def _png_size(path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == PNG_MAGIC
    return struct.unpack(">II", head[16:24])


def test_plot_front_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "front.png"
    plot_front(_front(), out, "gpt3-175b on A100 80GB")
    assert out.is_file()
    assert out.stat().st_size > 20_000
    w, h = _png_size(out)
    assert w >= 1500 and h >= 600           # two panels at 150 dpi


def test_without_costs_or_flags(tmp_path):
    """No cost and days proportional to step time: one panel with a days axis; no on_front flag:
    every point is the front."""
    pytest.importorskip("matplotlib")
    pts = [_point(g, s, tp=1, pp=1, cost=None) for g, s in ((8, 40.0), (16, 21.0), (32, 11.0))]
    out = tmp_path / "days.png"
    plot_front(pts, out, "no prices")
    w, h = _png_size(out)
    assert 700 <= w < 1500 and h >= 600


def test_days_panel_when_days_do_not_follow_step_time(tmp_path):
    """A batch range: days per second of step differ by point, so days get their own panel."""
    pytest.importorskip("matplotlib")
    pts = [_point(g, s, tp=1, pp=1, cost=None, days_per_s=r)
           for g, s, r in ((8, 40.0, 1.0), (16, 21.0, 1.3), (32, 11.0, 1.7))]
    out = tmp_path / "days2.png"
    plot_front(pts, out, "batch range")
    w, h = _png_size(out)
    assert w >= 1500 and h >= 600


def test_single_panel_when_neither_cost_nor_days(tmp_path):
    pytest.importorskip("matplotlib")
    pts = [_point(g, s, tp=1, pp=1, cost=None) for g, s in ((8, 40.0), (16, 21.0))]
    for p in pts:
        p["total_days"] = None
    out = tmp_path / "one.png"
    plot_front(pts + [{"plan": None, "feasible": False}], out, "step time only")
    w, h = _png_size(out)
    assert 700 <= w < 1500 and h >= 600


def test_nothing_to_plot_is_an_input_error(tmp_path):
    pytest.importorskip("matplotlib")
    with pytest.raises(InputError, match="nothing to plot"):
        plot_front([{"plan": None}], tmp_path / "x.png", "empty")


@pytest.mark.parametrize("kw", [dict(tp=8, pp=8, dp=16, vp=3, micro_batch=1),
                                dict(tp=8, pp=4, dp=8, cp=2, micro_batch=2),
                                dict(tp=1, pp=1, dp=8, micro_batch=8)])
def test_label_matches_plan_label(kw):
    plan = Plan(global_batch=1536, gpus=1024, nodes=128, **kw)
    assert plan_label(plan.to_dict()) == plan.label()


def test_missing_matplotlib_is_an_input_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)     # makes `import matplotlib` fail
    with pytest.raises(InputError, match=r"pip install 'plan\[plot\]'"):
        plot_front(_front(), tmp_path / "x.png", "no matplotlib")


def test_all_points_dominated_still_draws(tmp_path):
    pytest.importorskip("matplotlib")
    pts = [p for p in _front() if not p["on_front"]]
    out = tmp_path / "dominated.png"
    plot_front(pts, out, "nothing on the front")
    assert _png_size(out)[0] >= 1500


def test_dollar_ticks_stay_distinct():
    ticks = (1_002_000, 1_005_000, 1_008_000, 1_010_000)
    labels = [_dollars(t, ticks) for t in ticks]
    assert len(set(labels)) == len(labels) and all(lb.endswith("M") for lb in labels)
    assert _dollars(1.5e6, (1e6, 1.5e6, 2e6)) == "$1.5M"


def test_log_axis_tick_labels_are_the_tick_values():
    """A log axis spanning less than a decade ticks at 1, 1.5, 2, 2.5, ... x 10^k: 1.5 and 2
    both read "2" (values from 1 up were rounded to whole numbers)."""
    ticks = [m * 10.0 ** k for k in range(-2, 4) for m in (1, 1.5, 2, 2.5, 3, 4, 5, 7.5)]
    labels = [_plain(t) for t in ticks]
    assert len(set(labels)) == len(labels)
    for t, lb in zip(ticks, labels):
        assert float(lb.replace(",", "")) == pytest.approx(t, rel=1e-9)
    assert _plain(2048) == "2,048" and _plain(1.5) == "1.5" and _plain(0.15) == "0.15"


def test_a_narrow_front_s_drawn_step_time_labels_are_distinct(tmp_path):
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    pts = [_point(g, s, on_front=True) for g, s in ((64, 2.6), (128, 1.9), (256, 1.3))]
    seen = {}
    real_close = plt.close

    def keep(fig):
        ax = fig.axes[0]
        lo, hi = ax.get_ylim()
        seen["labels"] = [t.get_text() for t, v in zip(ax.yaxis.get_majorticklabels(),
                                                        ax.yaxis.get_majorticklocs())
                          if lo <= v <= hi and t.get_text()]
        real_close(fig)

    plt.close = keep
    try:
        plot_front(pts, tmp_path / "f.png", "narrow")
    finally:
        plt.close = real_close
    assert len(seen["labels"]) >= 2
    assert len(set(seen["labels"])) == len(seen["labels"]), seen["labels"]

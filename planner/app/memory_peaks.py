"""The model's memory per GPU against allocator peaks a framework's own CI measured.

A file of such peaks (planner/data/megatron_ci_memory.toml: Megatron-LM's functional tests,
``mem-max-allocated-bytes`` on the last rank) holds runs, each a model, a plan on a GPU count
and the peak of live tensors the caching allocator saw. That peak is what the model's memory
terms describe (the reserve is for what lies outside it: the CUDA context, NCCL's buffers,
the allocator's cache), so the comparison judges the terms: a peak below the model's would
be memory the model counts and the run never held, a peak above it is what the terms leave
out. ``plan validate`` prints the summary; tests/test_megatron_ci_memory.py holds its figures.
"""

from __future__ import annotations

import json
import statistics
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from planner.model.evaluate import evaluate
from planner.model.instance import parse_instance
from planner.model.plan import plan_from_spec

MEGATRON_CI = Path(__file__).resolve().parents[1] / "data" / "megatron_ci_memory.toml"


@dataclass(frozen=True)
class PeakResult:
    """One run: the measured allocator peak and the model's peak on the same rank (GiB)."""
    id: str
    gpu: str
    gpus: int
    plan: str
    measured_gib: float
    model_gib: float
    reserve_gib: float       # the default memory reserve of the run's GPU and framework
    setting: str = ""        # the run's GPU count, model, plan and training keys, as one key

    @property
    def ratio(self) -> float:
        return self.measured_gib / self.model_gib

    @property
    def uncounted_gib(self) -> float:
        """What the run held beyond the model's terms (negative: the model counts more)."""
        return self.measured_gib - self.model_gib

    def as_json(self) -> dict[str, Any]:
        return {"id": self.id, "gpu": self.gpu, "gpus": self.gpus, "plan": self.plan,
                "measured_gib": self.measured_gib, "model_gib": self.model_gib,
                "reserve_gib": self.reserve_gib, "ratio": self.ratio,
                "uncounted_gib": self.uncounted_gib}


def load(path: Path = MEGATRON_CI) -> list[dict[str, Any]]:
    return tomllib.loads(path.read_text())["runs"]


def last_rank_peak(row: dict[str, Any]) -> tuple[str, float, float]:
    """The plan's label, the model's peak (GiB, no reserve) on the rank Megatron-LM logs (the
    last pipeline stage, every row of it, the optimizer step's too; the only stage when
    pp = 1) and the default reserve."""
    plan = row["plan"]
    inst = parse_instance({
        "model": {"name": row["test_case"], **row["model"]},
        "training": {"global_batch": plan["global_batch"], **row["training"]},
        "cluster": {"gpu": row["gpu"], "gpus": row["gpus"]},
        "constraints": {"max_cp": plan.get("cp", 1)},
        "plan": plan}, row["id"])
    p = plan_from_spec(inst, inst.spec.plan)
    rep = evaluate(inst, p, spec=inst.spec.plan)
    stages = rep.memory_by_stage_gib
    names = [k for k in stages if k.startswith("last")] if p.pp > 1 else list(stages)
    return p.label(), max(stages[k]["total"] for k in names), rep.memory_gib["reserve"]


def compare(rows: list[dict[str, Any]]) -> list[PeakResult]:
    out = []
    for row in rows:
        label, model, reserve = last_rank_peak(row)
        setting = json.dumps([row["gpus"], row["model"], row["plan"], row["training"]],
                             sort_keys=True)
        out.append(PeakResult(row["id"], row["gpu"], row["gpus"], label,
                              float(row["measured_GiB"]), model, reserve, setting))
    return out


def summary(results: list[PeakResult]) -> dict[str, Any]:
    """The figures the docs quote: the range and median of measured / model, how many runs
    the model counts more than the run held, and the most the terms leave out."""
    ratios = [r.ratio for r in results]
    return {"runs": len(results),
            "settings": len({r.setting for r in results}),
            "ratio_min": min(ratios), "ratio_median": statistics.median(ratios),
            "ratio_max": max(ratios),
            "runs_model_above": sum(r.ratio < 1 for r in results),
            "max_uncounted_gib": max(r.uncounted_gib for r in results),
            "runs_beyond_reserve": sum(r.uncounted_gib > r.reserve_gib for r in results)}


def summary_text(s: dict[str, Any]) -> str:
    above = ("never below it" if not s["runs_model_above"] else
             f"below it on {s['runs_model_above']} runs (the model counts memory they did not "
             "hold)")
    return (f"memory against Megatron-LM's CI (planner/data/megatron_ci_memory.toml, the "
            f"allocator's peak on the last rank): {s['runs']} runs, measured "
            f"{s['ratio_min']:.3f}x-{s['ratio_max']:.3f}x the model's peak (median "
            f"{s['ratio_median']:.3f}x), {above}; what the terms leave out is at most "
            f"{s['max_uncounted_gib']:.2f} GiB, "
            + ("within the default reserve on every run" if not s["runs_beyond_reserve"]
               else f"beyond the default reserve on {s['runs_beyond_reserve']} runs"))

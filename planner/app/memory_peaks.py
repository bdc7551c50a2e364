"""The model's memory per GPU against allocator figures a framework's own CI measured.

A file of such figures (planner/data/megatron_ci_memory.toml: Megatron-LM's functional tests
on its last rank) holds runs, each a model and a plan on a GPU count with two measurements: the
peak of live tensors the caching allocator saw (``measured_GiB``) and what stayed allocated
between steps (``measured_static_GiB``: weights, gradients, optimizer states). Both are what
the model's memory terms describe (the reserve is for what lies outside them: the CUDA context,
NCCL's buffers, the allocator's cache), so the comparison judges the terms, not the reserve:
a model figure above a measured one would be memory the run never held, one below it is what
the terms leave out. ``plan validate`` prints the summary; tests/test_megatron_ci_memory.py
holds its figures.
"""

from __future__ import annotations

import json
import statistics
import tomllib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from planner.model.evaluate import evaluate
from planner.model.plan import plan_from_spec

MEGATRON_CI = "data/megatron_ci_memory.toml"       # (in the planner package, as its siblings)
#: the memory terms that stay allocated between steps
STATIC_TERMS = ("weights", "gradients", "optimizer_states")


@dataclass(frozen=True)
class PeakResult:
    """One run: measured and modelled figures on the last rank (GiB, no reserve)."""
    id: str
    gpu: str
    gpus: int
    plan: str
    measured_gib: float          # the allocator's peak of live tensors
    model_gib: float             # the model's peak on the last pipeline stage
    measured_static_gib: float | None    # allocated between steps
    model_static_gib: float      # the model's weights, gradients and optimizer states there
    setting: str = ""            # the run's GPU count, model, plan and training keys, one key

    @property
    def ratio(self) -> float:
        return self.measured_gib / self.model_gib

    @property
    def static_ratio(self) -> float | None:
        return None if self.measured_static_gib is None else \
            self.measured_static_gib / self.model_static_gib

    @property
    def uncounted_gib(self) -> float:
        """What the run held at its peak beyond the model's (negative: the model counts more)."""
        return self.measured_gib - self.model_gib

    def as_json(self) -> dict[str, Any]:
        return {"id": self.id, "gpu": self.gpu, "gpus": self.gpus, "plan": self.plan,
                "measured_gib": self.measured_gib, "model_gib": self.model_gib,
                "ratio": self.ratio, "uncounted_gib": self.uncounted_gib,
                "measured_static_gib": self.measured_static_gib,
                "model_static_gib": self.model_static_gib, "static_ratio": self.static_ratio}


def load(path: str | Path | None = None) -> list[dict[str, Any]]:
    """The runs of a file of such figures (default: the shipped one, read as
    planner/app/runs_file.py and alternatives.py read theirs)."""
    text = Path(path).read_text() if path else \
        resources.files("planner").joinpath(MEGATRON_CI).read_text()
    return tomllib.loads(text)["runs"]


def last_rank_figures(row: dict[str, Any]) -> tuple[str, float, float]:
    """The plan's label, and the model's peak and static memory (GiB, no reserve) on the rank
    Megatron-LM logs: the last pipeline stage (its rows in ``memory_by_stage_gib`` are the
    ones named ``last...``: as dense and as MoE layers, and the optimizer step's), the only
    stage when pp = 1. The row is read as a published run (planner/app/runs_file.py
    ``run_instance``), as the measured alternatives' plans are."""
    from planner.app.runs_file import run_instance

    training = dict(row["training"])
    run = {"id": row["id"], "model": "model", "gpu": row["gpu"],
           "precision": training.pop("precision"), "plan": row["plan"], "training": training,
           "measured_step_time_s": 1.0}          # (the run format needs one; never read)
    inst = run_instance({"models": {"model": {"name": row["test_case"], **row["model"]}}}, run)
    plan = plan_from_spec(inst, inst.spec.plan)
    stages = evaluate(inst, plan, spec=inst.spec.plan).memory_by_stage_gib
    names = [k for k in stages if k.startswith("last")] if plan.pp > 1 else list(stages)
    return (plan.label(), max(stages[k]["total"] for k in names),
            max(sum(stages[k][t] for t in STATIC_TERMS) for k in names
                if not k.endswith("_step")))


def compare(rows: list[dict[str, Any]]) -> list[PeakResult]:
    out = []
    for row in rows:
        label, peak, static = last_rank_figures(row)
        setting = json.dumps([row["gpus"], row["model"], row["plan"], row["training"]],
                             sort_keys=True)
        out.append(PeakResult(row["id"], row["gpu"], row["gpus"], label,
                              float(row["measured_GiB"]), peak,
                              row.get("measured_static_GiB"), static, setting))
    return out


def summary(results: list[PeakResult]) -> dict[str, Any]:
    """The figures the docs quote: the range and median of measured / model at the peak and
    between steps, how many runs the model counts more than the run held, and the most the
    terms leave out at the peak."""
    if not results:
        return {"runs": 0}
    ratios = [r.ratio for r in results]
    statics = [r.static_ratio for r in results if r.static_ratio is not None]
    return {"runs": len(results), "settings": len({r.setting for r in results}),
            "ratio_min": min(ratios), "ratio_median": statistics.median(ratios),
            "ratio_max": max(ratios), "runs_model_above": sum(x < 1 for x in ratios),
            "max_uncounted_gib": max(r.uncounted_gib for r in results),
            "static_runs": len(statics),
            "static_ratio_min": min(statics, default=None),
            "static_ratio_median": statistics.median(statics) if statics else None,
            "static_ratio_max": max(statics, default=None),
            "static_runs_model_above": sum(x < 1 for x in statics)}


def summary_text(s: dict[str, Any]) -> str:
    def above(n: int) -> str:
        return "never below it" if not n else f"below it on {n} runs"

    text = (f"memory against Megatron-LM's CI (planner/data/megatron_ci_memory.toml, the last "
            f"rank): {s['runs']} runs; the allocator's peak is {s['ratio_min']:.3f}x-"
            f"{s['ratio_max']:.3f}x the model's (median {s['ratio_median']:.3f}x), "
            f"{above(s['runs_model_above'])}, at most {s['max_uncounted_gib']:.2f} GiB more")
    if s.get("static_runs"):
        text += (f"; what stays allocated between steps is {s['static_ratio_min']:.3f}x-"
                 f"{s['static_ratio_max']:.3f}x the model's weights, gradients and optimizer "
                 f"states, {above(s['static_runs_model_above'])}")
    return text

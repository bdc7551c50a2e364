"""Validation against measured training runs, and the one-efficiency-per-GPU calibration.

The shipped set (``planner/data/published_runs.toml``) is the copy of ``shared/published_runs.toml``
with each run's source. Every run becomes an instance (its model, its GPU, ``gpus`` = the plan's
product, global batch from the plan) and its published plan is evaluated; the prediction error is
``predicted / measured - 1``.

Calibration fits exactly one number per GPU type (``efficiency``: the achieved share of the
16-bit peak on GEMMs) by minimising the mean absolute error over that GPU's 16-bit runs, then
``efficiency_fp8`` the same way over its FP8 runs. Nothing is fitted per run.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from planner.model.errors import InputError, PlanError
from planner.model.evaluate import StepReport, evaluate
from planner.model.instance import Instance, parse_instance, read_toml
from planner.model.plan import plan_from_spec
from planner.model.schema import PlanSpec

PLAN_KEYS = set(PlanSpec.model_fields)


@dataclass
class RunResult:
    id: str
    gpu: str
    precision: str
    gpus: int
    measured_s: float
    report: StepReport
    source: str

    @property
    def predicted_s(self) -> float:
        return self.report.step_time_s

    @property
    def error(self) -> float:
        return self.predicted_s / self.measured_s - 1


def default_runs_path() -> Path:
    return Path(str(resources.files("planner").joinpath("data/published_runs.toml")))


def load_runs(path: str | Path | None = None) -> dict[str, Any]:
    p = Path(path) if path else default_runs_path()
    data = read_toml(p)
    if "runs" not in data or "models" not in data:
        raise InputError(f"{p}: expected [models.*] tables and [[runs]] entries")
    return data


def run_instance(data: dict[str, Any], run: dict[str, Any],
                 overrides: dict[str, float] | None = None) -> Instance:
    """The instance a published run describes (``overrides`` patch ``[cluster]``, for calibration)."""
    rid = run.get("id", "?")
    try:
        model = dict(data["models"][run["model"]])
        plan = dict(run["plan"])
    except KeyError as exc:
        raise InputError(f"run {rid}: missing {exc}") from None
    unknown = set(plan) - PLAN_KEYS
    if unknown:
        raise InputError(f"run {rid}: unknown plan keys {sorted(unknown)}")
    gpus = plan["tp"] * plan["pp"] * plan["dp"] * plan.get("cp", 1)
    inst = {
        "model": model,
        "training": {"global_batch": plan["global_batch"], "precision": run["precision"],
                     **run.get("training", {})},
        "cluster": {"gpu": run["gpu"], "gpus": gpus, **(overrides or {})},
        "plan": plan,
    }
    return parse_instance(inst, f"run {rid}")


def validate_runs(data: dict[str, Any], overrides: dict[str, dict[str, float]] | None = None,
                  only_gpu: str | None = None) -> list[RunResult]:
    """Evaluate every run's published plan; ``overrides`` maps GPU key -> cluster overrides."""
    out = []
    for run in data["runs"]:
        if only_gpu and run["gpu"] != only_gpu:
            continue
        inst = run_instance(data, run, (overrides or {}).get(run["gpu"]))
        plan = plan_from_spec(inst, inst.spec.plan)
        rep = evaluate(inst, plan, spec=inst.spec.plan)
        out.append(RunResult(run["id"], run["gpu"], run["precision"], plan.gpus,
                             float(run["measured_step_time_s"]), rep,
                             run.get("source", run.get("reported", ""))))
    return out


def summary(results: list[RunResult]) -> dict[str, float]:
    errs = [abs(r.error) for r in results]
    return {"runs": len(errs), "mean_abs_error": sum(errs) / len(errs), "max_abs_error": max(errs)}


def _golden(f, lo: float, hi: float, tol: float = 1e-4) -> float:
    """Minimise a unimodal function on [lo, hi] (golden-section search)."""
    g = (5 ** 0.5 - 1) / 2
    a, b = lo, hi
    c, d = b - g * (b - a), a + g * (b - a)
    fc, fd = f(c), f(d)
    while b - a > tol:
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - g * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + g * (b - a)
            fd = f(d)
    return (a + b) / 2


def calibrate(data: dict[str, Any]) -> dict[str, dict[str, float]]:
    """One efficiency per GPU type (and one FP8 efficiency where FP8 runs exist), each the
    minimiser of the mean absolute step-time error over that GPU's runs."""
    out: dict[str, dict[str, float]] = {}
    for gpu in sorted({r["gpu"] for r in data["runs"]}):
        runs16 = {"models": data["models"],
                  "runs": [r for r in data["runs"] if r["gpu"] == gpu and r["precision"] != "fp8"]}
        runs8 = {"models": data["models"],
                 "runs": [r for r in data["runs"] if r["gpu"] == gpu and r["precision"] == "fp8"]}

        def mae(over: dict[str, float], sub: dict[str, Any], gpu: str = gpu) -> float:
            try:
                return summary(validate_runs(sub, {gpu: over}))["mean_abs_error"]
            except PlanError:
                return float("inf")

        fit: dict[str, float] = {}
        if runs16["runs"]:
            fit["efficiency"] = round(
                _golden(lambda e, sub=runs16: mae({"efficiency": e}, sub), 0.2, 1.0), 3)
        if runs8["runs"]:
            base = {"efficiency": fit["efficiency"]} if "efficiency" in fit else {}
            fit["efficiency_fp8"] = round(
                _golden(lambda e, b=base, sub=runs8: mae({**b, "efficiency_fp8": e}, sub),
                        0.2, 1.0), 3)
        out[gpu] = fit
    return out

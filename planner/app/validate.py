"""Validation against measured training runs: each run's published plan evaluated, its error
``predicted / measured - 1`` in sample and out of sample, and the summary the bounds are on.

The shipped set (``planner/data/published_runs.toml``) is the copy of ``shared/published_runs.toml``
with each run's source (runs_file.py reads it). In sample: the catalog's figures, fitted on these
runs (calibration.py). Out of sample: each run's error with the parameters fitted without every
run of its *source* (the publication or benchmark release, :func:`planner.app.runs_file.source_of`).
How the published plans rank against the model's optimum is ranking.py's; :func:`validate_file`
puts the three together for ``plan validate``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from planner.app.calibration import Calibrator, calibration_only_keys, fit_key
from planner.app.ranking import RANKING_TARGET, ranking
from planner.app.runs_file import (framework_origin, held_out, run_framework, run_instance,
                                   source_of, unstated)
from planner.model.evaluate import StepReport, evaluate
from planner.model.plan import plan_from_spec


@dataclass
class RunResult:
    id: str
    gpu: str
    precision: str
    gpus: int
    measured_s: float
    report: StepReport
    source: str
    #: why the run is held out of the calibration and the error bounds (None: it is in them)
    held_out: str | None = None
    #: the source of a run whose GPU type (its fit_key) the catalog fits on that source alone:
    #: fitted, but out of the error bounds (:func:`calibration_only_keys`); None: in them
    calibration_only: str | None = None
    #: the run's FP8 scaling recipe (``[training] fp8_recipe``; None: per-tensor)
    fp8_recipe: str | None = None

    @property
    def label(self) -> str:
        """The precision as the table shows it: ``mxfp8`` for an MXFP8 run."""
        return "mxfp8" if self.fp8_recipe == "mxfp8" else self.precision

    @property
    def predicted_s(self) -> float:
        return self.report.step_time_s

    @property
    def error(self) -> float:
        return self.predicted_s / self.measured_s - 1


def validate_runs(data: dict[str, Any], overrides: dict[str, dict[str, float]] | None = None,
                  only_gpu: str | None = None, alone: dict[str, str] | None = None
                  ) -> list[RunResult]:
    """Evaluate every run's published plan; ``overrides`` maps GPU key -> cluster overrides;
    ``alone``: the calibration-only fit keys (:func:`calibration_only_keys`), none if not
    given."""
    out = []
    singles = alone or {}
    for run in data["runs"]:
        if only_gpu and run["gpu"] != only_gpu:
            continue
        inst = run_instance(data, run, (overrides or {}).get(fit_key(run)))
        plan = plan_from_spec(inst, inst.spec.plan)
        rep = evaluate(inst, plan, spec=inst.spec.plan)
        out.append(RunResult(run["id"], run["gpu"], run["precision"], plan.gpus,
                             float(run["measured_step_time_s"]), rep,
                             run.get("source", run.get("reported", "")), held_out(run),
                             singles.get(fit_key(run)) if held_out(run) is None else None,
                             run.get("training", {}).get("fp8_recipe")))
    return out


def summary(results: list[RunResult]) -> dict[str, float | None]:
    """Mean and max |error| over the runs in the bounds: neither held out (``held_out`` counts
    them) nor calibration-only (``calibration_only``, :func:`calibration_only_keys`); the
    held-out runs' own mean and max, when there are any: never fitted, they are what the
    model predicts for runs it has not seen; and the calibration-only runs' (in sample)."""
    errs = [abs(r.error) for r in results if r.held_out is None and r.calibration_only is None]
    mean, top = mean_max(errs)
    out = {"runs": len(errs), "mean_abs_error": mean, "max_abs_error": top,
           "held_out": sum(r.held_out is not None for r in results)}
    alone = [abs(r.error) for r in results if r.calibration_only is not None]
    if alone:
        out["calibration_only"] = len(alone)
        out["mean_abs_error_calibration_only"], out["max_abs_error_calibration_only"] = \
            mean_max(alone)
    unseen = [abs(r.error) for r in results if r.held_out is not None]
    if unseen:
        out["mean_abs_error_held_out"], out["max_abs_error_held_out"] = mean_max(unseen)
    return out


def mean_max(errs: list[float]) -> tuple[float | None, float | None]:
    """The mean and the max of some |errors|, both None without any: a runs file may hold out
    every run (only predictions, nothing fitted), and then there is no error bound to state."""
    if not errs:
        return None, None
    return sum(errs) / len(errs), max(errs)


def out_of_sample(data: dict[str, Any], cal: Calibrator | None = None,
                  alone: dict[str, str] | None = None) -> dict[str, float | None]:
    """Per run id: the error with the parameters fitted without every run of its source; None
    for a calibration-only run (:func:`calibration_only_keys`, or ``alone`` when the caller
    has them): without its source its GPU type has no fit, and the catalog's figures are the
    ones fitted on it."""
    cal = cal or Calibrator(data)
    singles = calibration_only_keys(data, cal) if alone is None else alone
    out: dict[str, float | None] = {}
    for src in sorted({source_of(r) for r in data["runs"]}):
        fitted = cal.fit(exclude_source=src)
        runs = [r for r in data["runs"] if source_of(r) == src]
        sub = {"models": data["models"], "runs": runs}
        for run, res in zip(runs, validate_runs(sub, fitted)):
            only = held_out(run) is None and fit_key(run) in singles
            out[res.id] = None if only else res.error
    return out


@dataclass
class Validation:
    """One ``plan validate`` of a runs file: every run's result, its out-of-sample error, its
    ranking (empty without one), the summary the bounds are stated on, and the fitted figures
    when asked for. The CLI prints it (planner/app/report.py, ``validation_lines``) or emits
    :meth:`runs_json` with the summary and the figures."""

    data: dict[str, Any]
    results: list[RunResult]
    out_of_sample: dict[str, float | None]
    ranks: dict[str, dict[str, Any]]
    summary: dict[str, Any]
    fitted: dict[str, dict[str, float]] | None
    solver: str

    def runs_json(self) -> list[dict[str, Any]]:
        """Each run's line of ``plan validate --json`` (docs/contract.md, "validate")."""
        return [{"id": r.id, "gpu": r.gpu, "precision": r.precision,
                 "fp8_recipe": r.fp8_recipe, "gpus": r.gpus,
                 "measured_s": r.measured_s, "predicted_s": r.predicted_s,
                 "error": r.error, "error_out_of_sample": self.out_of_sample[r.id],
                 "source_group": source_of(run),
                 "ranking": self.ranks.get(r.id), "fits": r.report.fits,
                 "memory_gib": r.report.memory_gib["total"],
                 "memory_headroom_gib": r.report.memory_gib["headroom"],
                 "held_out": r.held_out, "source": r.source,
                 "calibration_only": r.calibration_only is not None,
                 "framework": run_framework(run),
                 "framework_from": framework_origin(run),
                 "unstated": unstated(run)}
                for r, run in zip(self.results, self.data["runs"])]


def validate_file(data: dict[str, Any], rank: bool = True, solver: str = "enumerate",
                  calibrate: bool = False) -> Validation:
    """``plan validate`` on a loaded runs file (:func:`planner.app.runs_file.load_runs`): the
    runs evaluated in sample, each out of sample, and ranked with ``solver`` when ``rank``;
    the summary (:func:`summary`) with the out-of-sample mean and max over the runs in the
    bounds and, ranked, the largest ratio and the runs within :data:`RANKING_TARGET`."""
    cal = Calibrator(data)
    alone = calibration_only_keys(data, cal)
    results = validate_runs(data, alone=alone)
    fitted = cal.fit() if calibrate else None
    oos = out_of_sample(data, cal, alone)
    ranks = ranking(data, solver=solver) if rank else {}
    summ: dict[str, Any] = summary(results)
    summ["mean_abs_error_out_of_sample"], summ["max_abs_error_out_of_sample"] = mean_max(
        [abs(oos[r.id]) for r in results if r.held_out is None and oos[r.id] is not None])
    ratios = [ranks[r.id]["ratio"] for r in results if ranks.get(r.id, {}).get("ratio")]
    if ratios:
        summ["max_ranking_ratio"] = max(ratios)
        summ["runs_ranking_within_10pct"] = sum(1 for x in ratios if x <= RANKING_TARGET)
        summ["ranking_solver"] = solver
    return Validation(data, results, oos, ranks, summ, fitted, solver)

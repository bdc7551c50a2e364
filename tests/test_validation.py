"""Prediction error on the shipped published runs (README "Validation"; docs/contract.md,
"Runs files"), and the calibration the catalog records.

Bounds: mean absolute step-time error <= 8%, max <= 15% over every run of
``planner/data/published_runs.toml``. Each GPU type's ``efficiency`` (and ``efficiency_fp8``) in
``hardware_catalog/`` must be the value ``calibrate()`` finds on those runs, within 0.01.
"""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path

import pytest

from planner.app.validate import calibrate, load_runs, summary, validate_runs

ROOT = Path(__file__).resolve().parents[1]
MEAN_BOUND, MAX_BOUND = 0.08, 0.15


@pytest.fixture(scope="module")
def data():
    return load_runs()


@pytest.fixture(scope="module")
def results(data):
    return validate_runs(data)


def _table(results) -> str:
    return "\n".join(f"  {r.id:40s} measured {r.measured_s:8.3f} s  predicted "
                     f"{r.predicted_s:8.3f} s  error {100 * r.error:+6.1f}%" for r in results)


def test_every_run_is_evaluated(data, results):
    assert [r.id for r in results] == [r["id"] for r in data["runs"]]
    assert len(results) >= 20
    for r in results:
        assert r.predicted_s > 0 and r.measured_s > 0


def test_mean_abs_error_bound(results):
    s = summary(results)
    assert s["runs"] == len(results)
    assert s["mean_abs_error"] <= MEAN_BOUND, (
        f"mean |error| {100 * s['mean_abs_error']:.1f}% > {100 * MEAN_BOUND:.0f}%\n"
        + _table(results))


def test_max_abs_error_bound(results):
    s = summary(results)
    worst = max(results, key=lambda r: abs(r.error))
    assert s["max_abs_error"] == pytest.approx(abs(worst.error))
    assert s["max_abs_error"] <= MAX_BOUND, (
        f"max |error| {100 * s['max_abs_error']:.1f}% ({worst.id}) > {100 * MAX_BOUND:.0f}%\n"
        + _table(results))


def test_summary_of_hand_made_errors(results):
    """Three runs predicted 10% slow, 20% fast and exact: mean |error| 10%, max 20%."""
    base = results[0]
    p = base.predicted_s
    made = [dataclasses.replace(base, measured_s=p / 1.1),     # predicted = 1.1 x measured
            dataclasses.replace(base, measured_s=p / 0.8),     # predicted = 0.8 x measured
            dataclasses.replace(base, measured_s=p)]
    s = summary(made)
    assert s["runs"] == 3
    assert s["mean_abs_error"] == pytest.approx(0.10, rel=1e-12)
    assert s["max_abs_error"] == pytest.approx(0.20, rel=1e-12)


@pytest.fixture(scope="module")
def fitted(data):
    return calibrate(data)


def test_calibration_covers_every_gpu_with_runs(data, fitted):
    assert set(fitted) == {r["gpu"] for r in data["runs"]}
    for gpu, fit in fitted.items():
        precisions = {r["precision"] for r in data["runs"] if r["gpu"] == gpu}
        assert ("efficiency" in fit) == bool(precisions - {"fp8"})
        assert ("efficiency_fp8" in fit) == ("fp8" in precisions)


def test_catalog_records_the_calibrated_efficiency(fitted):
    """The catalog file holds the value calibrate() finds (read the file, not the loader)."""
    for gpu, fit in fitted.items():
        catalog = tomllib.loads((ROOT / "hardware_catalog" / f"{gpu}.toml").read_text())
        for key, value in fit.items():
            assert key in catalog, f"hardware_catalog/{gpu}.toml has no {key}"
            assert abs(catalog[key] - value) <= 0.01, (
                f"{gpu}: calibrate() gives {key}={value}, the catalog records {catalog[key]}")
        assert "calibrat" in catalog["calibration"].lower()

"""Extreme but valid inputs at the edge of the solvers' number ranges.

CP-SAT works in integers (objective in quanta, memory in bytes, int64 underneath), so a huge
model or a tiny link bandwidth used to overflow into a NumPy warning and a TypeError traceback,
or a MODEL_INVALID reported as a solver failure. Now: memory entries above the limit are capped
(the same plans fit, see ``formulations.milp.capped_memory``), a minimum-MFU cap that cannot bind
is left out, and whatever still does not fit CP-SAT's integers is a clean ``SolverError`` naming
the problem and the backends that handle it. Some cases go beyond the schema's limits on purpose
(``dataclasses.replace`` / ``model_copy`` skip validation): the backends must not rely on them.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from formulations.encoding import Cuts, encode, evaluate_encoding
from formulations.enumerate import feasible_points
from formulations.milp import build_rows, capped_memory
from formulations.solve import solve
from formulations.space import build_space
from planner.app.cli import app
from planner.model.errors import InfeasibleError, SolverError
from planner.model.instance import load_instance, parse_instance

ROOT = Path(__file__).resolve().parents[1]
BACKENDS = ("cpsat", "highs", "enumerate")
CPSAT = ("cpsat",)
BASE = {"model": {"preset": "gpt-1.3b"}, "training": {"global_batch": 512},
        "cluster": {"gpu": "a100-80gb", "nodes": 1},
        "constraints": {"max_recompute_layers": 0}}     # (the subject is numbers, not knobs)
# widest and deepest the schema allows: 1e20-byte weights, layer counts near 1e5 as factors
HUGE_MODEL = {"hidden": 4194304, "heads": 16, "layers": 100000}


def instance(**sections):
    return parse_instance({k: {**BASE.get(k, {}), **sections.get(k, {})}
                           for k in {*BASE, *sections}})


def with_bandwidth(inst, bytes_per_s: float):
    """Both link bandwidths set directly (below the schema's floor of 1 MB/s)."""
    return dataclasses.replace(inst, hw=dataclasses.replace(
        inst.hw, bw_intra=bytes_per_s, bw_inter=bytes_per_s))


def all_text(result) -> str:
    """stdout and stderr, whichever way this click version captures them (as tests/test_cli)."""
    try:
        err = result.stderr
    except ValueError:
        err = ""
    return result.output if err in result.output else result.output + err


def objective_or_error(inst, backend: str):
    try:
        return solve(inst, solver=backend, explain="brief").objective
    except (InfeasibleError, SolverError) as exc:
        return exc


@pytest.mark.parametrize("model", [HUGE_MODEL, {"hidden": 1099511627776, "heads": 16}],
                         ids=["schema-max", "beyond-schema"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_huge_memory_is_infeasible_on_every_backend(model, backend):
    inst = instance()
    inst = inst.with_spec(model=inst.spec.model.model_copy(update=model))
    with pytest.raises(InfeasibleError, match="no plan fits in GPU memory"):
        solve(inst, solver=backend, explain="brief")


def test_capped_memory_keeps_exactly_the_feasible_plans():
    inst = load_instance(ROOT / "instances" / "gpt3-175b-a100.toml")    # entries up to 30x the limit
    space = build_space(inst)
    points = feasible_points(space)
    enc = encode(space, "step_time")
    capped = dataclasses.replace(enc, memory=capped_memory(enc))
    limit = enc.memory_limit
    assert any(np.max(u.table) > 2 * limit for e in enc.memory.values() for u in e.usages)
    rng = np.random.default_rng(0)
    fits = 0
    for i in rng.choice(len(points["T"]), size=min(60, len(points["T"])), replace=False):
        choice = {v: int(points[v][i]) for v in space.base}
        for k in range(len(enc.combos)):
            old = evaluate_encoding(enc, choice, k)
            new = evaluate_encoding(capped, choice, k)
            for key, value in old.items():
                if key.startswith("memory_"):
                    assert (value <= limit) == (new[key] <= limit)
                    if value <= limit:
                        fits += 1
                        assert new[key] == value
    assert fits                                             # both sides were exercised


@pytest.mark.parametrize("bytes_per_s", [1e6, 1e3, 1.0])
def test_tiny_bandwidth_solves_alike_or_cpsat_says_why(bytes_per_s):
    """1e6 B/s is the schema's floor; below it the objective spans more than 2^53 quanta.
    (HiGHS is only compared where the schema allows: at 1 B/s its floating-point tolerances
    are swamped by a 1e18 coefficient range.)"""
    inst = with_bandwidth(instance(), bytes_per_s)
    best = objective_or_error(inst, "enumerate")
    assert isinstance(best, float) and best > 0
    for backend in CPSAT:
        got = objective_or_error(inst, backend)
        if isinstance(got, SolverError):
            assert "CP-SAT needs integer units" in str(got)
            assert "--solver highs or --solver enumerate" in str(got)
            assert "2^53" in str(got)
        else:
            assert got == pytest.approx(best, rel=1e-6), backend
    if bytes_per_s >= 1e6:
        assert objective_or_error(inst, "highs") == pytest.approx(best, rel=1e-6)
        assert all(isinstance(objective_or_error(inst, b), float) for b in CPSAT)


@pytest.mark.parametrize("backend", ["cpsat", "highs"])
def test_non_finite_times_are_a_clear_solver_error(backend):
    inst = with_bandwidth(instance(), 1e-320)               # times overflow to inf / nan
    with np.errstate(all="ignore"), pytest.raises(SolverError, match="finite") as info:
        solve(inst, solver=backend)
    assert "--solver enumerate" in str(info.value)


@pytest.mark.parametrize("backend", CPSAT)
def test_tiny_min_mfu_is_the_unconstrained_optimum(backend):
    free = solve(instance(), solver=backend)
    capped = solve(instance(constraints={"min_mfu": 1e-12}), solver=backend)
    assert capped.status == free.status
    assert capped.objective == pytest.approx(free.objective, rel=1e-12)


def test_cap_rows_only_when_they_can_bind():
    def cap_rows(min_mfu, **kw):
        from formulations.solve import objective_cap

        inst = instance(constraints={"min_mfu": min_mfu})
        space = build_space(inst)
        enc = encode(space, "step_time")
        cuts = Cuts(max_objective=objective_cap(inst, "step_time"))
        return [row for row in build_rows(enc, cuts, **kw).rows if row[3] == "objective_cap"]

    assert cap_rows(1e-12, memory_unit=1.0, time_unit=1e-7, integral=True) == []
    assert cap_rows(1e-12) == []
    (row,) = cap_rows(0.4, memory_unit=1.0, time_unit=1e-7, integral=True)
    assert math.isfinite(row[2]) and row[2] < 2**53


def test_cli_huge_model_exits_3_without_traceback(tmp_path):
    path = tmp_path / "huge.toml"
    path.write_text('[model]\npreset = "gpt-1.3b"\nhidden = 4194304\nheads = 16\n'
                    'layers = 100000\n\n[training]\nglobal_batch = 512\n\n'
                    '[cluster]\ngpu = "a100-80gb"\nnodes = 1\n')
    for backend in ("cpsat",):
        result = CliRunner().invoke(app, ["solve", str(path), "--solver", backend])
        text = all_text(result)
        assert result.exit_code == 3, text
        assert "Traceback" not in text
        assert "no plan fits in GPU memory" in text
        assert result.exception is None or isinstance(result.exception, SystemExit)


def test_cli_out_of_range_instance_exits_4_with_the_reason(monkeypatch, tmp_path):
    """No instance file can reach this any more (the schema bounds the bandwidth): the loaded
    instance is replaced, the rest of the command runs as usual. Its objective reaches 1e9 s
    (1 B/s links): CP-SAT's unit grows to fit it and the plan comes back (exit 0); with the
    unit held to the median entry's (``TOP_UNITS`` unbounded, the rule before the unit could
    grow), the objective overflows CP-SAT's integers and the command says so (exit 4)."""
    tiny = with_bandwidth(instance(), 1.0)
    monkeypatch.setattr("planner.app.cli._load", lambda path, nodes=None: tiny)
    path = tmp_path / "any.toml"
    path.write_text("")
    assert CliRunner().invoke(app, ["solve", str(path)]).exit_code == 0
    monkeypatch.setattr("formulations.cpsat.TOP_UNITS", float("inf"))
    result = CliRunner().invoke(app, ["solve", str(path)])
    text = all_text(result)
    assert result.exit_code == 4, text
    assert "Traceback" not in text
    assert "CP-SAT needs integer units" in text
    assert "--solver highs or --solver enumerate" in text
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_out_of_range_integers_name_the_problem():
    from formulations.cpsat import RANGE, _fits

    assert _fits(2**53, "x", 1e-7) == 2**53
    assert _fits(3 * 2**60 + 1, "x", 1e-7, RANGE, math.ceil) == 3 * 2**60 + 1    # exact int
    for bad, limit in ((float("nan"), 2**53), (2.0**53 * 2, 2**53), (2**63, RANGE)):
        with pytest.raises(SolverError, match=r"CP-SAT needs integer units: the bound of x "
                           r"reaches .* more than 2\^\d+; use --solver highs"):
            _fits(bad, "the bound of x", 1e-7, limit)

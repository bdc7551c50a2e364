"""The model's memory per GPU against the peaks torchtitan measured on its own H100 runs
(planner/data/torchtitan_memory.toml: torchtitan's December 2024 benchmark, the allocator's
peak reservation). Reserved memory bounds a run's need from above, so the model may stay
below it; how far below is what ``TORCHTITAN_MEMORY_CAVEAT`` tells every torchtitan plan, and
these tests keep its figures true."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from planner.model.evaluate import TORCHTITAN_MEMORY_CAVEAT, caveats, evaluate
from planner.model.instance import parse_instance
from planner.model.plan import plan_from_spec

DATA = Path(__file__).resolve().parents[1] / "planner" / "data" / "torchtitan_memory.toml"
ROWS = tomllib.loads(DATA.read_text())["runs"]


def _instance(row):
    plan = row["plan"]
    return parse_instance({
        "model": {"preset": row["preset"], "seq_len": row["seq_len"]},
        "training": {"global_batch": plan["global_batch"], **row["training"]},
        "cluster": {"gpu": "h100-sxm", "gpus": row["gpus"]},
        "constraints": {"framework": "torchtitan", "max_cp": plan.get("cp", 1)},
        "plan": plan}, row["id"])


def _ratio(row) -> float:
    """torchtitan's measured peak over the model's peak memory per GPU (the most loaded
    stage, without the reserve)."""
    inst = _instance(row)
    rep = evaluate(inst, plan_from_spec(inst, inst.spec.plan), spec=inst.spec.plan)
    return row["measured_gib"] / rep.memory_gib["total"]


RATIOS = {row["id"]: _ratio(row) for row in ROWS}


def test_the_rows_are_the_benchmarks():
    """18 rows of the six tables, each run's GPU count
    the product of its degrees."""
    assert len(ROWS) == 18
    for row in ROWS:
        p = row["plan"]
        assert p["tp"] * p["pp"] * p["dp"] * p.get("cp", 1) == row["gpus"], row["id"]


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r["id"])
def test_the_model_stays_below_torchtitans_reservation(row):
    """Reserved memory holds the live tensors and the cache: a model peak above it would
    count memory the run never held."""
    assert RATIOS[row["id"]] >= 1.0


@pytest.mark.parametrize("piped", [False, True])
def test_the_caveat_quotes_the_measured_range(piped):
    """The ranges it quotes, without and with pipeline parallelism."""
    ratios = [RATIOS[row["id"]] for row in ROWS if (row["plan"]["pp"] > 1) == piped]
    said = f"{min(ratios):.1f}x to {max(ratios):.1f}x the peak memory" if not piped else \
        f"{min(ratios):.1f}x to {max(ratios):.1f}x with it"
    assert said in TORCHTITAN_MEMORY_CAVEAT


def test_torchtitan_plans_carry_the_caveat():
    """Every plan under torchtitan's rules carries it; plans under the other frameworks do
    not."""
    titan = _instance(ROWS[0])
    assert TORCHTITAN_MEMORY_CAVEAT in caveats(titan)
    other = titan.with_spec(constraints=titan.spec.constraints.model_copy(
        update={"framework": "megatron"}))
    assert TORCHTITAN_MEMORY_CAVEAT not in caveats(other)

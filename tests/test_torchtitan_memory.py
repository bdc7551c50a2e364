"""The model's memory per GPU against the peaks torchtitan measured on its own H100 runs
(planner/data/torchtitan_memory.toml: torchtitan's December 2024 benchmark, the allocator's
peak reservation). Reserved memory bounds a run's need from above, so the model may stay
below it; how far below is what ``TORCHTITAN_MEMORY_CAVEAT`` tells every torchtitan plan, and
these tests keep its figures true. The same rows' tokens/s, compared as ratios between rows
(the benchmark's GPUs are not in the catalog), keep ``TORCHTITAN_CP_CAVEAT`` true."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

import statistics

from planner.model.evaluate import (TORCHTITAN_CP_CAVEAT, TORCHTITAN_MEMORY_CAVEAT, caveats,
                                    evaluate)
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


def _report(row):
    inst = _instance(row)
    return evaluate(inst, plan_from_spec(inst, inst.spec.plan), spec=inst.spec.plan)


REPORTS = {row["id"]: _report(row) for row in ROWS}
#: torchtitan's measured peak over the model's peak memory per GPU (the most loaded stage,
#: without the reserve)
RATIOS = {row["id"]: row["measured_gib"] / REPORTS[row["id"]].memory_gib["total"]
          for row in ROWS}
#: the model's tokens/s/GPU over the measured ones (the machine's own factor included)
SPEED = {row["id"]: row["plan"]["global_batch"] * row["seq_len"] / row["gpus"]
         / REPORTS[row["id"]].step_time_s / row["measured_tps"] for row in ROWS}


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


def test_context_parallel_rows_are_what_the_cp_caveat_says():
    """Costed on the H100 SXM, every row's model tokens/s over the measured carries the
    benchmark machine's own factor (500 W, HBM2e). Without context parallelism the rows keep
    within 10% of their median (the factor is one number: 0.92x-1.06x of it), so the rows with
    context parallelism can be read against it: the range the caveat quotes."""
    flat = [SPEED[r["id"]] for r in ROWS if r["plan"].get("cp", 1) == 1]
    median = statistics.median(flat)
    assert all(0.9 <= f / median <= 1.1 for f in flat), [round(f / median, 3) for f in flat]
    with_cp = [SPEED[r["id"]] / median for r in ROWS if r["plan"].get("cp", 1) > 1]
    assert f"{min(with_cp):.1f}x to {max(with_cp):.1f}x further above" in TORCHTITAN_CP_CAVEAT


def test_torchtitan_context_parallel_plans_carry_the_cp_caveat():
    """A torchtitan plan with context parallelism carries it; one without, or the same plan
    under Megatron-LM's rules (Transformer Engine's context parallelism), does not."""
    row = next(r for r in ROWS if r["id"] == "t6-405b-512gpu-cp2-64k")
    assert TORCHTITAN_CP_CAVEAT in REPORTS[row["id"]].caveats
    assert TORCHTITAN_CP_CAVEAT not in REPORTS["t6-405b-512gpu-cp1-32k"].caveats
    inst = _instance(row)
    mega = inst.with_spec(constraints=inst.spec.constraints.model_copy(
        update={"framework": "megatron"}))
    plan = plan_from_spec(mega, mega.spec.plan, dp_sharding="optim")
    assert plan.cp == 2 and TORCHTITAN_CP_CAVEAT not in caveats(mega, plan)


#: torchtitan's "Memory(GiB)" (max_memory_reserved at the 100th iteration) of Trainy's H200
#: runs, the runs file's section "torchtitan on H200" (pytorch/torchtitan
#: benchmarks/llama3-8b_h200_202506_trainy-whitefiber.md): compile on, so the loss compiled
H200_RESERVED_GIB = {"trainy2506-h200-llama31-8b-fp8-32": 47.96,
                     "trainy2506-h200-llama31-8b-fp8-64": 46.97}


@pytest.mark.parametrize("rid", sorted(H200_RESERVED_GIB))
def test_the_compiled_loss_keeps_the_model_under_torchtitans_reservation(rid):
    """With the loss compiled (frameworks.compiled_loss: 4 bytes per logit, measured on CPU by
    tools/loss_memory.py --compiled) the model's peak sits under what the run reserved, by as
    little as the December 2024 rows' (TORCHTITAN_MEMORY_CAVEAT: 1.0x to 1.2x without
    pipeline parallelism); costed as the eager loss (12 bytes) it would count more than the
    run ever held."""
    from planner.app.runs_file import load_runs, run_instance

    data = load_runs()
    run = next(r for r in data["runs"] if r["id"] == rid)

    def peak(**training):
        r = {**run, "training": {**run["training"], **training}}
        inst = run_instance(data, r)
        return evaluate(inst, plan_from_spec(inst, inst.spec.plan),
                        spec=inst.spec.plan).memory_gib["total"]
    reserved = H200_RESERVED_GIB[rid]
    assert 1.0 <= reserved / peak() <= 1.2, (reserved, peak())
    assert peak(compiled_loss=False) > reserved

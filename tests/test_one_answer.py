"""One answer per question (issue 13): every backend returns the same plan for the same input,
run after run, on the shipped instances; ties are broken by the documented order
(formulations/ties.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from formulations.solve import solve
from planner.model.instance import load_instance, parse_instance
from planner.model.terms import internode_bytes

INSTANCES = Path(__file__).resolve().parent.parent / "instances"
#: every shipped instance of one size
FIXED = sorted(p.name for p in INSTANCES.glob("*.toml") if len(load_instance(p).node_options) == 1)
#: HiGHS takes 5-60 s on these (the agreement test covers HiGHS on 36 drawn instances, MoE ones
#: among them): left out of the default run to keep it under 3 minutes. `python
#: tools/check_shipped.py` runs all three backends on every shipped instance (2026-12-08: the
#: same plans, HiGHS 5.2-36.0 s on these, 1 min 47 s in all)
SLOW_FOR_HIGHS = {"llama3-70b-h100.toml", "gpt3-175b-a100.toml", "llama3.1-405b-h100.toml",
                  "deepseek-v3-h800.toml", "mixtral-8x7b-h100.toml"}


@pytest.mark.parametrize("name", FIXED)
def test_backends_return_the_same_plan_on_every_shipped_instance(name):
    inst = load_instance(INSTANCES / name)
    ref = solve(inst, solver="enumerate").report.plan
    backends = ["cpsat"] + ([] if name in SLOW_FOR_HIGHS else ["highs"])
    for backend in backends:
        assert solve(inst, solver=backend).report.plan == ref, backend


def test_cpsat_returns_the_same_plan_run_after_run():
    """Five runs of the 1.3B instance gave micro-batches 16, 16, 16, 8, 1 before ties were
    broken (CP-SAT's portfolio finds any of the tied plans first). The instance is loaded
    for each run, so that each also builds and encodes its space anew."""
    plans = {solve(load_instance(INSTANCES / "gpt-1.3b-1node.toml"), solver="cpsat").report.plan
             for _ in range(3)}
    assert len(plans) == 1


@pytest.mark.shipped_search
@pytest.mark.parametrize("name", ["gpt-1.3b-1node.toml", "gpt3-175b-a100.toml"])
def test_the_first_objective_race_gives_the_one_worker_answer(name, monkeypatch):
    """The first objective solve races no_lp against max_lp (formulations/cpsat.py,
    FIRST_SEARCH); either may prove first and return another solution of the optimum. The
    plan and objective are the ones the enumerator and one no_lp worker give, on the instance
    where max_lp proves first (GPT 1.3B on one node) and on one where no_lp does."""
    from formulations import cpsat

    runs = []
    real = cpsat._run

    def spy(model, time_limit, workers, *args, **kwargs):
        runs.append((workers, kwargs.get("subsolvers"), kwargs.get("full")))
        return real(model, time_limit, workers, *args, **kwargs)

    monkeypatch.setattr(cpsat, "_run", spy)
    raced = solve(load_instance(INSTANCES / name), solver="cpsat")
    assert (2, ("no_lp", "max_lp"), True) in runs          # the race ran
    monkeypatch.setattr(cpsat, "FIRST_SEARCH", cpsat.SEARCH)
    alone = solve(load_instance(INSTANCES / name), solver="cpsat")
    ref = solve(load_instance(INSTANCES / name), solver="enumerate")
    assert raced.report.plan == alone.report.plan == ref.report.plan
    assert raced.objective == pytest.approx(ref.objective, rel=1e-6)


def _tied_instance():
    """One GPU, a batch of 8 and the flat GEMM model (no size curve): with no pipeline and no
    collective, the step time does not depend on how the batch is split into micro-batches, so
    memory decides the tie."""
    return parse_instance({
        "model": {"layers": 2, "hidden": 256, "heads": 4, "vocab": 1000, "seq_len": 256},
        "training": {"global_batch": 8},
        "cluster": {"gpu": "a100-80gb", "gpus": 1, "gemm_knee_tokens": 0, "gemm_knee_width": 0},
        "constraints": {"recompute": "none"}})


@pytest.mark.parametrize("backend", ["enumerate", "cpsat", "highs"])
def test_among_equal_times_the_most_headroom_wins(backend):
    """With a flat GEMM model a micro-batch of 1 or 8 costs the same time on one GPU; the
    smaller one keeps fewer activations, so it is the answer in every backend."""
    inst = _tied_instance()
    res = solve(inst, solver=backend)
    assert res.report.plan.micro_batch == 1
    big = solve(inst.with_spec(constraints=inst.spec.constraints.model_copy(
        update={"micro_batch": 8})), solver=backend)
    assert big.report.step_time_s == pytest.approx(res.report.step_time_s, rel=1e-4)
    assert big.report.memory_gib["total"] > res.report.memory_gib["total"]


def test_internode_bytes_count_only_what_crosses_the_nic():
    """Inside one node nothing crosses the NIC; across two, the data-parallel gradients do."""
    one = load_instance(INSTANCES / "gpt-1.3b-1node.toml")
    res = solve(one, solver="enumerate")
    plan = res.report.plan
    assert internode_bytes(one, plan.grid.degrees(), plan.knobs) == 0
    two = one.with_nodes(2)
    res2 = solve(two, solver="enumerate").report.plan
    assert internode_bytes(two, res2.grid.degrees(), res2.knobs) > 0


@pytest.mark.parametrize("backend", ["cpsat", "highs"])
def test_a_kept_space_answers_as_a_fresh_one(backend):
    """``solve`` keeps an instance object's space, its parts' encodings, their rows before the
    cuts and CP-SAT's model of them for later solves (formulations/solve.py, ``space_of``;
    formulations/milp.py, ``base_rows``). One query's cuts must not reach the next: after a
    top-3 list (each solve excluding the plans before it), a plain solve of the same object
    returns the optimum a fresh object returns, and a second list is the first again."""
    from formulations.queries import top_k

    doc = {"model": {"layers": 4, "hidden": 1024, "heads": 8, "vocab": 32000, "seq_len": 2048},
           "training": {"global_batch": 16},
           "cluster": {"gpu": "h100-sxm", "gpus": 8},
           "constraints": {"max_micro_batch": 4, "max_recompute_layers": 0, "recompute": "none",
                           "distributed_optimizer": True}}
    inst = parse_instance(doc)
    first = [r.report.plan for r in top_k(inst, 3, solver=backend)]
    assert len(set(first)) == 3
    fresh = solve(parse_instance(doc), solver=backend).report.plan
    assert solve(inst, solver=backend).report.plan == fresh == first[0]
    assert [r.report.plan for r in top_k(inst, 3, solver=backend)] == first

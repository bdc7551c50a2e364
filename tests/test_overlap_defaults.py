"""The overlap switches take their defaults from ``[constraints] framework`` (planner/model/
frameworks.py), a pin overrides them, ``[plan]`` overrides both, and a switch the framework has
no way to run is an input error naming the keys."""

from __future__ import annotations

import pytest

from formulations.solve import solve
from planner.model.errors import InputError
from planner.model.frameworks import OVERLAP_KNOBS
from planner.model.instance import parse_instance
from planner.model.evaluate import evaluate
from planner.model.plan import plan_from_spec


def doc(constraints=None, plan=None):
    d = {"model": {"layers": 8, "hidden": 1024, "heads": 16, "vocab": 32000, "seq_len": 2048},
         "training": {"global_batch": 64},
         "cluster": {"gpu": "h100-sxm", "nodes": 2},
         "constraints": constraints or {}}
    if plan is not None:
        d["plan"] = plan
    return d


def switches(plan):
    return {k: getattr(plan, k) for k in OVERLAP_KNOBS}


@pytest.mark.parametrize("framework, on", [
    (None, {"overlap_p2p_comm"}),                     # Megatron-LM's command line
    ("megatron", {"overlap_p2p_comm"}),
    ("nemo", {"overlap_grad_reduce", "overlap_param_gather", "overlap_p2p_comm"}),
    ("torchtitan", {"overlap_grad_reduce", "overlap_param_gather"}),
    ("deepspeed", set()),
])
def test_framework_defaults_reach_evaluate_and_solve(framework, on):
    cons = {"framework": framework} if framework else {}
    inst = parse_instance(doc(cons, {"tp": 2, "pp": 2, "vp": 2}))
    expect = {k: k in on for k in OVERLAP_KNOBS}
    assert switches(plan_from_spec(inst, inst.spec.plan)) == expect
    res = solve(parse_instance(doc(cons)), solver="enumerate", explain=False)
    plan = res.report.plan
    # (where they run: tp_comm_overlap under tensor parallelism, the p2p overlap interleaved)
    runs = {"tp_comm_overlap": plan.tp > 1, "overlap_p2p_comm": plan.vp > 1}
    assert switches(plan) == {k: on and runs.get(k, True) for k, on in expect.items()}


def test_pin_overrides_the_framework_and_the_plan_overrides_the_pin():
    cons = {"framework": "nemo", "overlap_grad_reduce": False, "tp_comm_overlap": True}
    inst = parse_instance(doc(cons, {"tp": 2, "overlap_grad_reduce": True}))
    got = switches(plan_from_spec(inst, inst.spec.plan))
    assert got["overlap_grad_reduce"] is True and got["tp_comm_overlap"] is True
    # (tp = 2: the switch runs only under tensor parallelism)
    res = solve(parse_instance(doc({**cons, "tp": 2})), solver="enumerate", explain=False)
    assert res.report.plan.overlap_grad_reduce is False
    assert res.report.plan.tp_comm_overlap is True
    assert res.report.plan.overlap_param_gather is True          # NeMo's default kept


@pytest.mark.parametrize("where", ["constraints", "plan"])
def test_a_switch_the_framework_cannot_run_is_an_input_error(where):
    cons = {"framework": "deepspeed"}
    plan = {"tp": 2}
    (cons if where == "constraints" else plan)["tp_comm_overlap"] = True
    with pytest.raises(InputError) as exc:
        inst = parse_instance(doc(cons, plan))
        plan_from_spec(inst, inst.spec.plan)
    assert "tp_comm_overlap" in str(exc.value) and "deepspeed" in str(exc.value)


def test_the_old_fractions_are_an_input_error_naming_the_switches():
    d = doc()
    d["training"]["tp_overlap"] = 1.0
    with pytest.raises(InputError) as exc:
        parse_instance(d)
    assert "tp_comm_overlap" in str(exc.value)


@pytest.mark.parametrize("framework", [None, "nemo"])
def test_switches_that_do_not_run_at_these_degrees_are_reported_off(framework):
    """Megatron-LM's validate_args turns sequence parallelism off at tp = 1 (and
    --tp-comm-overlap then fails its assertion that SP is on) and overlap_p2p_comm off without
    interleaving. The model costs them at nothing there; the plan, its panel and its JSON say
    they are off, and the cost is the same as with them pinned off."""
    cons = {"framework": framework} if framework else {}
    on = {"sequence_parallel": True, "tp_comm_overlap": True, "overlap_p2p_comm": True}
    for degrees in ({"tp": 1, "pp": 2, "vp": 2}, {"tp": 2, "pp": 2, "vp": 1},
                    {"tp": 1, "pp": 1, "dp": 16}):
        tp, vp = degrees["tp"], degrees.get("vp", 1)
        running = {"sequence_parallel": tp > 1, "tp_comm_overlap": tp > 1,
                   "overlap_p2p_comm": vp > 1}
        reports = []
        for knobs in (on, running):
            inst = parse_instance(doc(cons, {**degrees, **knobs}))
            plan = plan_from_spec(inst, inst.spec.plan)
            reports.append(evaluate(inst, plan, spec=inst.spec.plan))
        plan = reports[0].plan
        assert plan.sequence_parallel == plan.tp_comm_overlap == (plan.tp > 1), degrees
        assert plan.overlap_p2p_comm == (plan.vp > 1), degrees
        assert reports[0].step_time_s == pytest.approx(reports[1].step_time_s, rel=1e-12)
        assert reports[0].memory_gib["total"] == pytest.approx(reports[1].memory_gib["total"],
                                                               rel=1e-12)
    # a solve on one node at tp = 1, pp = 1: nothing of the three is on
    res = solve(parse_instance({**doc(cons), "constraints": {**cons, "max_tp": 1, "max_pp": 1}}),
                solver="enumerate", explain=False)
    plan = res.report.plan
    assert (plan.tp, plan.pp) == (1, 1)
    assert not (plan.sequence_parallel or plan.tp_comm_overlap or plan.overlap_p2p_comm)

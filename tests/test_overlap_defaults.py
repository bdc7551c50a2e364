"""The overlap switches take their defaults from ``[constraints] framework`` (planner/model/
frameworks.py), a pin overrides them, ``[plan]`` overrides both, and a switch the framework has
no way to run is an input error naming the keys."""

from __future__ import annotations

import pytest

from formulations.solve import solve
from planner.model.errors import InputError
from planner.model.frameworks import OVERLAP_KNOBS
from planner.model.instance import parse_instance
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
    assert switches(res.report.plan) == expect


def test_pin_overrides_the_framework_and_the_plan_overrides_the_pin():
    cons = {"framework": "nemo", "overlap_grad_reduce": False, "tp_comm_overlap": True}
    inst = parse_instance(doc(cons, {"tp": 2, "overlap_grad_reduce": True}))
    got = switches(plan_from_spec(inst, inst.spec.plan))
    assert got["overlap_grad_reduce"] is True and got["tp_comm_overlap"] is True
    res = solve(parse_instance(doc(cons)), solver="enumerate", explain=False)
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

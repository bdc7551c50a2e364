"""Rack-scale NVLink domains: on GB200 NVL72 a "node" is the 72-GPU NVLink domain, so tensor,
context and expert groups up to 72 GPUs stay on NVLink, and the solver uses that."""

from __future__ import annotations

import pytest

from formulations.solve import solve
from planner.model.evaluate import evaluate
from planner.model.plan import Knobs
from planner.model.terms import step_terms
from planner.model.instance import parse_instance
from planner.model.plan import plan_from_spec
from planner.model.schema import PlanSpec


def inst_of(gpu: str, nodes: int, **plan):
    return parse_instance({
        "model": {"preset": "mixtral-8x7b"},
        "training": {"global_batch": 576},
        "cluster": {"gpu": gpu, "nodes": nodes},
        **({"plan": plan} if plan else {}),
    })


def test_gb200_domain_is_72_gpus():
    inst = inst_of("gb200", 2)
    assert inst.hw.gpus_per_node == 72 and inst.gpus == 144 and inst.node_size == 72


def test_expert_and_tensor_groups_stay_on_nvlink_inside_the_domain():
    inst = inst_of("gb200", 2)
    plan = plan_from_spec(inst, PlanSpec(tp=4, pp=1, dp=36, ep=8, micro_batch=1,
                                         sequence_parallel=True, distributed_optimizer=True))
    assert plan.tp_intra == 4 and plan.ep_intra == 8 and plan.inter("ep") == 1
    rep = evaluate(inst, plan)
    assert not rep.violations
    # every collective of this plan stays on NVLink: only gradients cross the two racks
    terms = step_terms(inst, plan.grid.degrees(), Knobs("none", True, True))
    slow_nic = parse_instance({
        "model": {"preset": "mixtral-8x7b"}, "training": {"global_batch": 576},
        "cluster": {"gpu": "gb200", "nodes": 2, "inter_node_bandwidth_GBps": 1.0}})
    slow = step_terms(slow_nic, plan.grid.degrees(), Knobs("none", True, True))
    assert slow.time["ep_comm"] == pytest.approx(terms.time["ep_comm"], rel=1e-12)
    assert slow.time["tp_comm"] == pytest.approx(terms.time["tp_comm"], rel=1e-12)
    assert slow.time["dp_comm"] > terms.time["dp_comm"]


@pytest.mark.parametrize("backend", ["cpsat", "highs", "enumerate"])
def test_solver_places_groups_inside_the_72_gpu_domain(backend):
    res = solve(inst_of("gb200", 2), solver=backend)
    plan = res.report.plan
    assert res.status.value == "optimal"
    assert plan.inter("tp") == 1 and plan.inter("ep") == 1

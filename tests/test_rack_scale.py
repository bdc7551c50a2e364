"""Rack-scale NVLink domains: on GB200 NVL72 a host (the scheduling node that `nodes` counts) is
a compute tray of 4 GPUs and the NVLink domain is the rack of 72, so tensor, context and expert
groups up to 72 GPUs stay on NVLink, any whole number of hosts is a job, and the solver uses
that."""

from __future__ import annotations

import math

import pytest

from formulations.solve import solve
from planner.model.evaluate import evaluate
from planner.model.plan import Knobs
from planner.model.terms import step_terms
from planner.model.instance import parse_instance
from planner.model.plan import plan_from_spec
from planner.model.errors import InputError
from planner.model.schema import PlanSpec


def inst_of(gpu: str, gpus: int, **plan):
    """Mixtral on ``gpus`` GPUs; ZeRO-1 pinned and the optimizer kept on the GPU (the placement
    of the groups is the point)."""
    return parse_instance({
        "model": {"preset": "mixtral-8x7b"},
        "training": {"global_batch": 576},
        "cluster": {"gpu": gpu, "gpus": gpus},
        "constraints": {"dp_sharding": "optim", "optimizer_offload": False},
        **({"plan": plan} if plan else {}),
    })


def test_gb200_hosts_are_trays_of_4_and_the_domain_is_72_gpus():
    inst = inst_of("gb200", 144)
    assert inst.hw.gpus_per_host == 4 and inst.hw.nvlink_domain == 72
    assert inst.nodes == 36 and inst.node_size == 72 and inst.segments == 2
    # nodes counts hosts: 36 trays are the same job
    same = parse_instance({"model": {"preset": "mixtral-8x7b"}, "training": {"global_batch": 576},
                           "cluster": {"gpu": "gb200", "nodes": 36}})
    assert same.gpus == 144 and same.node_size == 72


def test_a_128_gpu_gb200_job_runs_as_two_nvlink_segments_of_64():
    """NVIDIA's benchmark recipes run 128 GB200 GPUs as 32 trays in two NVLink segments of 16
    trays (Slurm --segment 16): the job is valid and its groups of up to 64 stay on NVLink."""
    inst = parse_instance({"model": {"preset": "llama3-70b"}, "training": {"global_batch": 128},
                           "cluster": {"gpu": "gb200", "gpus": 128}})
    assert inst.nodes == 32 and inst.node_size == 64 and inst.segments == 2
    plan = plan_from_spec(inst, PlanSpec(tp=8, pp=4, dp=4, micro_batch=1,
                                         sequence_parallel=True, distributed_optimizer=True))
    rep = evaluate(inst, plan)
    assert not rep.violations
    # Megatron order (tp, cp, dp, pp innermost first): tp and dp inside a segment, pp across two
    assert plan.inter("tp") == 1 and plan.inter("dp") == 1 and plan.inter("pp") == 2
    assert rep.plan.to_dict()["nvlink_domain"] == 64 and rep.plan.to_dict()["nodes"] == 32


def test_exports_say_the_intra_factors_fill_an_nvlink_segment_of_hosts():
    """On GB200 the plan's inside factors fill an NVLink segment of several 4-GPU hosts; the
    exports say so instead of "per node" beside "4 GPUs per node" (an audit found "fills each
    node with tp_intra=2, cp_intra=1, dp_intra=32" under a 4-GPU header)."""
    import json
    from planner.app.emit import emit
    inst = parse_instance({"model": {"preset": "llama3-70b"}, "training": {"global_batch": 128},
                           "cluster": {"gpu": "gb200", "gpus": 128}})
    plan = plan_from_spec(inst, PlanSpec(tp=8, pp=4, dp=4, micro_batch=1,
                                         sequence_parallel=True, distributed_optimizer=True))
    def flat(text):                  # (the comments are wrapped at 100 columns)
        return " ".join(text.replace("#", " ").split())
    meg = flat(emit(inst, plan, "megatron"))
    assert "--nproc-per-node 4" in meg
    assert "fills each NVLink segment of 64 GPUs (16 hosts of 4) with tp_intra=8" in meg
    ds = json.loads(emit(inst, plan, "deepspeed"))["plan_parallelism"]
    assert ds["gpus_per_node"] == 4 and ds["nvlink_domain"] == 64
    assert math.prod(ds["intra_node"].values()) == 64
    h100 = parse_instance({"model": {"preset": "llama3-70b"}, "training": {"global_batch": 128},
                           "cluster": {"gpu": "h100-sxm", "gpus": 128}})
    plan = plan_from_spec(h100, PlanSpec(tp=8, pp=4, dp=4, micro_batch=1))
    assert "fills each node with tp_intra=8" in flat(emit(h100, plan, "megatron"))


def test_any_whole_number_of_hosts_is_a_job_and_a_partial_host_is_not():
    assert inst_of("gb200", 12).node_size == 12            # three trays in one rack
    with pytest.raises(InputError, match="whole hosts of 4"):
        inst_of("gb200", 10)


def test_dgx_style_gpus_per_node_sets_host_and_domain():
    inst = parse_instance({"model": {"preset": "gpt-1.3b"}, "training": {"global_batch": 64},
                           "cluster": {"gpu": "gb200", "gpus": 16, "gpus_per_node": 8}})
    assert inst.hw.gpus_per_host == 8 and inst.hw.nvlink_domain == 8 and inst.node_size == 8
    with pytest.raises(InputError, match="not both"):
        parse_instance({"model": {"preset": "gpt-1.3b"}, "training": {"global_batch": 64},
                        "cluster": {"gpu": "gb200", "gpus": 16, "gpus_per_node": 8,
                                    "nvlink_domain": 8}})


def test_expert_and_tensor_groups_stay_on_nvlink_inside_the_domain():
    inst = inst_of("gb200", 144)
    plan = plan_from_spec(inst, PlanSpec(tp=4, pp=1, dp=36, ep=8, micro_batch=1,
                                         sequence_parallel=True, distributed_optimizer=True))
    assert plan.tp_intra == 4 and plan.ep_intra == 8 and plan.inter("ep") == 1
    rep = evaluate(inst, plan)
    assert not rep.violations
    # every collective of this plan stays on NVLink: only gradients cross the two racks
    terms = step_terms(inst, plan.grid.degrees(), Knobs("none", True, True))
    slow_nic = parse_instance({
        "model": {"preset": "mixtral-8x7b"}, "training": {"global_batch": 576},
        "cluster": {"gpu": "gb200", "gpus": 144, "inter_node_bandwidth_GBps": 1.0}})
    slow = step_terms(slow_nic, plan.grid.degrees(), Knobs("none", True, True))
    assert slow.time["ep_comm"] == pytest.approx(terms.time["ep_comm"], rel=1e-12)
    assert slow.time["tp_comm"] == pytest.approx(terms.time["tp_comm"], rel=1e-12)
    assert slow.time["dp_comm"] > terms.time["dp_comm"]


@pytest.mark.parametrize("backend", ["cpsat", "highs", "enumerate"])
def test_solver_places_groups_inside_the_72_gpu_domain(backend):
    res = solve(inst_of("gb200", 144), solver=backend)
    plan = res.report.plan
    assert res.status.value == "optimal"
    assert plan.inter("tp") == 1 and plan.inter("ep") == 1


def test_an_nvlink_domain_that_splits_hosts_unevenly_is_an_input_error():
    """A domain joins whole hosts or part of one: 7 GPUs on hosts of 8 is no machine (it was
    silently taken as segments of 4)."""
    doc = {"model": {"preset": "gpt-1.3b"}, "training": {"global_batch": 64},
           "cluster": {"gpu": "h100-sxm", "nodes": 2, "nvlink_domain": 7}}
    with pytest.raises(InputError) as info:
        parse_instance(doc)
    assert "cluster.nvlink_domain: 7 GPUs is neither a multiple nor a divisor" in str(info.value)
    # a divisor of the host (NVLink islands of 4) and a multiple (a rack of hosts) are machines
    for domain in (4, 16):
        parse_instance({**doc, "cluster": {**doc["cluster"], "nvlink_domain": domain}})

"""[training] moe_token_dispatcher: Megatron-Core's flex dispatcher (DeepEP / HybridEP) sends a
token across nodes once per remote node its experts sit on (docs/model.md, "Expert-parallel
communication"); the all-to-all dispatcher once per expert copy."""

import random

import pytest

from planner.app.emit import emit
from planner.model.algebra import remote_nodes
from planner.model.evaluate import evaluate
from planner.model.instance import parse_instance
from planner.model.plan import plan_from_spec

MODEL = {"layers": 8, "hidden": 4096, "heads": 32, "kv_heads": 8, "vocab": 32000,
         "seq_len": 4096, "experts": 128, "top_k": 8, "moe_ffn_hidden": 1024}


@pytest.mark.parametrize("experts, top_k, nodes", [(128, 8, 2), (128, 8, 4), (256, 8, 8),
                                                    (64, 2, 4), (16, 4, 2)])
def test_remote_nodes_is_what_random_routing_gives(experts, top_k, nodes):
    """The expected number of other nodes a token's experts sit on, against a simulation of
    balanced routing: each token draws top_k distinct experts uniformly; experts are laid out
    node by node, experts / nodes each; the sender sits on node 0."""
    rng = random.Random(7)
    per = experts // nodes
    draws = 20000
    total = 0
    for _ in range(draws):
        hit = {e // per for e in rng.sample(range(experts), top_k)}
        total += len(hit - {0})
    assert remote_nodes(nodes, experts, top_k) == pytest.approx(total / draws, rel=0.02)
    assert remote_nodes(1, experts, top_k) == 0.0


def report(dispatcher, gpus, ep, **plan):
    inst = parse_instance({"model": MODEL,
                           "training": {"global_batch": 256, "moe_token_dispatcher": dispatcher},
                           "cluster": {"gpu": "h100-sxm", "gpus": gpus},
                           "plan": {"recompute": "none", "tp": 1, "pp": 1, "dp": gpus, "ep": ep,
                                    "micro_batch": 1, **plan}})
    return inst, evaluate(inst, plan_from_spec(inst, inst.spec.plan), spec=inst.spec.plan)


def test_flex_dispatch_saves_only_across_nodes():
    """Inside one node the flex dispatcher moves what the all-to-all moves; across two nodes
    it sends a token over the NIC about once (1 - C(64, 8) / C(128, 8) = 0.997) where the
    all-to-all sends its 4 remote copies, so its all-to-all time falls and nothing else
    changes; every flex backend is costed alike."""
    _, a8 = report("alltoall", 8, 8)
    _, d8 = report("deepep", 8, 8)
    assert d8.breakdown_s["ep_comm"] == pytest.approx(a8.breakdown_s["ep_comm"], rel=1e-12)
    _, a16 = report("alltoall", 16, 16)
    _, d16 = report("deepep", 16, 16)
    _, h16 = report("hybridep", 16, 16)
    assert d16.breakdown_s["ep_comm"] < 0.6 * a16.breakdown_s["ep_comm"]
    assert h16.breakdown_s["ep_comm"] == d16.breakdown_s["ep_comm"]
    assert d16.breakdown_s["compute"] == a16.breakdown_s["compute"]
    assert d16.memory_gib["total"] == a16.memory_gib["total"]


def test_exports_name_the_dispatcher():
    inst, rep = report("hybridep", 16, 16, dp_sharding="optim_grads_params")
    plan = rep.plan
    megatron = emit(inst, plan_from_spec(inst, inst.spec.plan, dp_sharding="optim"), "megatron")
    assert "--moe-token-dispatcher-type flex" in megatron
    assert "--moe-flex-dispatcher-backend hybridep" in megatron
    nemo = emit(inst, plan_from_spec(inst, inst.spec.plan, dp_sharding="optim"), "nemo")
    assert "moe_token_dispatcher_type: flex" in nemo and "moe_flex_dispatcher_backend: hybridep" in nemo
    # torchtitan 0.2.1-0.2.2 take standard | deepep (job_config.py Literal): hybridep, which
    # the plan costs as deepep, is written as deepep and said so
    titan = emit(inst, plan, "torchtitan")
    assert 'expert_parallel_comm_backend = "deepep"' in titan and '"hybridep"' not in titan
    assert "hybridep: no such backend, deepep emitted" in " ".join(
        titan.replace("#", " ").split())
    plain, _ = report("alltoall", 16, 16)
    assert "--moe-token-dispatcher-type alltoall" in emit(
        plain, plan_from_spec(plain, plain.spec.plan), "megatron")

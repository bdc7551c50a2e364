"""Context parallelism and mixture-of-experts terms of ``planner.model.terms.step_terms``, checked
by properties: what a degree must split, what a group must share, which link it is priced on,
and how the MoE generalisation reduces to the dense model. Hand-worked collectives (ring
all-reduce, all-to-all) are in ``tests/test_papers.py``.

Same tiny model and round cluster as ``tests/test_terms.py`` (L=4, h=64, a=4, V=128, s=32;
100 GB/s inside a node, 10 GB/s across). The MoE model: 4 layers, the first dense and 3 MoE
layers of E = 4 routed experts of width FE = 96, top_k = 2, one shared expert.
"""

from __future__ import annotations

import dataclasses

import pytest

from planner.model.evaluate import evaluate
from planner.model.plan import Knobs, structural_violations
from planner.model.terms import step_terms
from planner.model.workload import Shape
from test_terms import BWI, make_inst, make_plan, no_latency, terms_of, with_hw

L, H, A, V, S = 4, 64, 4, 128, 32
F = 4 * H                                       # default ffn_hidden (the dense layers' MLP)
BWO = 10e9

# the MoE model
E, TOPK, FE, NSH = 4, 2, 96, 1                  # experts, top_k, expert width, shared experts
N_DENSE, N_MOE = 1, 3                           # first_dense_layers = 1 of L = 4

REL = 1e-9


def moe_model(gated: bool, first_dense: int = N_DENSE, **extra) -> dict:
    return {"experts": E, "top_k": TOPK, "moe_ffn_hidden": FE, "shared_experts": NSH,
            "first_dense_layers": first_dense, "gated_mlp": gated, **extra}


# ------------------------------------------------------------------------------------------
# context parallelism
# ------------------------------------------------------------------------------------------


def test_cp_ring_is_exposed_beyond_the_attention_it_hides_behind():
    """The K/V ring of context parallelism overlaps the attention core: with tiny s it is
    exposed, on an infinitely fast link it is hidden (all but nothing), and it shrinks with the
    kv heads (ring attention passes K and V, Liu et al. 2023)."""
    inst = make_inst(2)
    plan = make_plan(inst, cp=2)
    exposed = terms_of(inst, plan).time["cp_comm"]
    assert exposed > 0
    fast = with_hw(inst, bw_intra=1e18, lat_intra=0.0)
    assert terms_of(fast, plan).time["cp_comm"] < 1e-6 * exposed
    gqa = make_inst(2, model={"kv_heads": 1})
    assert terms_of(gqa, make_plan(gqa, cp=2)).time["cp_comm"] < exposed


def test_cp_ring_runs_again_under_full_recompute():
    inst = make_inst(2)
    none = terms_of(inst, make_plan(inst, cp=2)).time["cp_comm"]
    full = terms_of(inst, make_plan(inst, cp=2, recompute="full")).time["cp_comm"]
    assert full > none


def test_cp4_spanning_is_priced_at_nic_pace():
    """Any inter-node hop makes every ring step inter-node: cp=4 over 2 nodes costs exactly the
    same as cp=4 over 4 nodes."""
    two = make_inst(4, cluster={"gpus_per_node": 2})
    four = make_inst(4, cluster={"gpus_per_node": 1})
    a = terms_of(two, make_plan(two, cp=4, cp_intra=2)).time["cp_comm"]
    b = terms_of(four, make_plan(four, cp=4, cp_intra=1)).time["cp_comm"]
    assert a == pytest.approx(b, rel=REL)


@pytest.mark.parametrize("where", ["intra", "inter"])
def test_cp_ring_hidden_behind_attention_with_long_sequences(where):
    """s = 4096: the attention core (s^2) outgrows the K/V exchange (s) on NVLink, not on the NIC:
    inside a node only the ring's last backward hop, which no attention follows, stays exposed
    (one step of the s/c tokens' K and V per layer and micro-batch)."""
    inst = make_inst(2, model={"seq_len": 4096},
                     cluster={"gpus_per_node": 8 if where == "intra" else 1})
    tm = terms_of(inst, make_plan(inst, cp=2, cp_intra=2 if where == "intra" else 1))
    kv_bytes = 2 * 2 * (4096 / 2) * H                      # K and V of s/c tokens, 16-bit, MHA
    m = 8                                                   # micro-batches (B = 8, dp = 1)
    one_hop = m * L * (kv_bytes / BWI + inst.hw.lat_intra)
    if where == "intra":
        assert 0 < tm.time["cp_comm"] <= one_hop * (1 + 1e-9)
    else:
        assert tm.time["cp_comm"] > 2 * one_hop


def test_no_cp_no_ring():
    inst = make_inst(2)
    assert terms_of(inst, make_plan(inst, dp=2)).time["cp_comm"] == 0


@pytest.mark.parametrize("flash", [True, False])
@pytest.mark.parametrize("cp", [2, 4])
def test_cp_splits_attention_and_activations(cp, flash):
    """Each context rank owns s/c of the queries: attention, the layer's compute and the stored
    activations are 1/c of one GPU's."""
    b = 2
    inst = make_inst(cp, training={"flash_attention": flash})
    tm = terms_of(inst, make_plan(inst, cp=cp, b=b))
    one = make_inst(1, training={"flash_attention": flash})
    ref = terms_of(one, make_plan(one, b=b))
    assert tm.layer["attention"] == pytest.approx(ref.layer["attention"] / cp, rel=REL)
    assert tm.layer["compute"] == pytest.approx(ref.layer["compute"] / cp, rel=REL)
    assert tm.memory["first"]["activations"] == pytest.approx(
        ref.memory["first"]["activations"] / cp, rel=REL)


# ------------------------------------------------------------------------------------------
# mixture of experts: FLOPs and compute
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("gated", [False, True])
def test_moe_that_routes_every_token_to_every_expert_is_the_dense_mlp(gated):
    """E experts of width f/E, every token sent to all of them (top_k = E), no shared expert:
    the same MLP FLOPs and weights as the dense model's width-f MLP, plus the router, an h x E
    GEMM (2 b s h E forward) and its h E weights (Fedus et al. 2021, Switch Transformer Sec. 2)."""
    base = {"gated_mlp": gated}
    dense = Shape.of(make_inst(1, model=base).model)
    moe = Shape.of(make_inst(1, model={**base, "experts": 4, "top_k": 4,
                                       "moe_ffn_hidden": F // 4}).model)
    assert moe.n_moe == L
    B = 16
    router = 3 * B * L * 2 * S * H * 4                      # fwd + bwd, every layer
    assert moe.model_flops(B) == pytest.approx(dense.model_flops(B) + router, rel=REL)
    # biases (Megatron-Core's default add_bias_linear, experts included): the experts' fc1
    # biases add up to the dense fc1's; each of the 4 experts has its own fc2 bias, h wide,
    # and the router one per expert (TopKRouter's bias)
    assert moe.total_params == pytest.approx(
        dense.total_params + L * (H * 4 + 3 * H + 4), rel=REL)
    # without biases, exactly the router's weights more
    free = {"linear_bias": False}
    dense = Shape.of(make_inst(1, model={**base, **free}).model)
    moe = Shape.of(make_inst(1, model={**base, **free, "experts": 4, "top_k": 4,
                                       "moe_ffn_hidden": F // 4}).model)
    assert moe.total_params == pytest.approx(dense.total_params + L * H * 4, rel=REL)


def test_moe_flops_follow_top_k_not_the_expert_count():
    """A token meets top_k experts: twice the experts at the same top_k add only the router's
    FLOPs (and more weights); top_k 2 instead of 1 adds one expert MLP per token."""
    def shape(experts, top_k):
        return Shape.of(make_inst(1, model={"experts": experts, "top_k": top_k,
                                            "moe_ffn_hidden": FE}).model)
    B = 8
    e4k1, e8k1, e4k2 = shape(4, 1), shape(8, 1), shape(4, 2)
    router = 3 * B * L * 2 * S * H                          # per expert of the router
    assert e8k1.model_flops(B) == pytest.approx(e4k1.model_flops(B) + 4 * router, rel=REL)
    assert e8k1.total_params > e4k1.total_params
    one_expert = 3 * B * L * 2 * S * 2 * H * FE             # a 2-matrix MLP of width FE
    assert e4k2.model_flops(B) == pytest.approx(e4k1.model_flops(B) + one_expert, rel=REL)


@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("tp", [1, 2])
def test_moe_layer_compute_is_the_dense_moe_average(tp, gated):
    """A model of 1 dense + 3 MoE layers costs per layer 1/4 of an all-dense model's layer and
    3/4 of an all-MoE model's."""
    def layer(model):
        inst = make_inst(tp * 2, model=model)
        ep = 2 if "experts" in model else 1
        return terms_of(inst, make_plan(inst, tp=tp, dp=2, ep=ep, sp=tp > 1)).layer["compute"]
    dense = layer({"gated_mlp": gated})
    all_moe = layer(moe_model(gated, first_dense=0))
    mixed = layer(moe_model(gated))
    assert mixed == pytest.approx((N_DENSE * dense + N_MOE * all_moe) / L, rel=REL)


# ------------------------------------------------------------------------------------------
# mixture of experts: all-to-all (worked by hand in test_papers.py)
# ------------------------------------------------------------------------------------------


def test_ep_all_to_all_volume_follows_top_k_and_recompute():
    """Each GPU dispatches and combines top_k copies of its tokens, forward and backward; full
    recompute reruns the forward's dispatch and combine (6 all-to-alls instead of 4)."""
    def ep_comm(top_k, recompute="none"):
        inst = no_latency(make_inst(4, model={**moe_model(False), "top_k": top_k}))
        return terms_of(inst, make_plan(inst, dp=4, ep=4, recompute=recompute)).time["ep_comm"]
    assert ep_comm(2) == pytest.approx(2 * ep_comm(1), rel=REL)
    assert ep_comm(2, "full") == pytest.approx(1.5 * ep_comm(2), rel=REL)
    assert ep_comm(2) > 0


def test_ep_all_to_all_across_nodes_costs_more():
    inside = make_inst(8, model=moe_model(False), cluster={"gpus_per_node": 8})
    spanning = make_inst(8, model=moe_model(False), cluster={"gpus_per_node": 4})
    a = terms_of(inside, make_plan(inside, dp=8, ep=4)).time["ep_comm"]
    b = terms_of(spanning, make_plan(spanning, dp=8, dp_intra=4, ep=4, ep_intra=2))
    assert b.time["ep_comm"] > a > 0
    assert terms_of(with_hw(spanning, bw_inter=2 * BWO),
                    make_plan(spanning, dp=8, dp_intra=4, ep=4, ep_intra=2)).time["ep_comm"] \
        < b.time["ep_comm"]


def test_dense_model_has_no_ep_comm():
    inst = make_inst(4)
    plan = make_plan(inst, dp=4)
    assert terms_of(inst, plan).time["ep_comm"] == 0
    # even with expert-parallel degrees forced on the degrees, a dense model has nothing to route
    x = plan.grid.degrees()
    forced = dataclasses.replace(x, e_in=2, e_out=2)
    tm = step_terms(inst, forced, Knobs())
    assert tm.time["ep_comm"] == 0
    ref = terms_of(inst, plan)
    for name, value in ref.time.items():
        assert tm.time[name] == pytest.approx(value, rel=REL), name


# ------------------------------------------------------------------------------------------
# mixture of experts: weights, gradients and optimizer
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("gated", [False, True])
def test_routed_experts_are_split_over_ep(gated):
    """Expert parallelism splits the routed experts, nothing else: from ep = 1 to 2 a GPU drops
    half the experts, from 2 to 4 a quarter (weights, gradients)."""
    inst = make_inst(4, model=moe_model(gated))
    mem = {ep: terms_of(inst, make_plan(inst, dp=4, ep=ep)).memory["first_moe"]
           for ep in (1, 2, 4)}
    for name in ("weights", "gradients"):
        assert mem[1][name] - mem[2][name] == pytest.approx(2 * (mem[2][name] - mem[4][name]),
                                                            rel=REL), name
        assert mem[4][name] < mem[2][name] < mem[1][name]


@pytest.mark.parametrize("distopt", [False, True])
def test_expert_gradients_reduce_over_the_expert_data_parallel_group(distopt):
    """Routed experts' gradients are reduced over dp / ep ranks (the expert data-parallel group),
    the rest over dp: with ep = dp the experts need no reduction, so dp_comm is that of the
    non-expert parameters alone and falls as ep grows."""
    inst = make_inst(8, model=moe_model(False), global_batch=16)
    comm = {ep: terms_of(inst, make_plan(inst, dp=8, ep=ep, distopt=distopt)).time["dp_comm"]
            for ep in (1, 2, 4)}
    assert comm[4] < comm[2] < comm[1]
    plan = make_plan(inst, dp=8, ep=4, distopt=distopt)
    assert plan.expert_dp == 2 == plan.grid.degrees().ed


@pytest.mark.parametrize("gated", [False, True])
def test_moe_memory_is_checked_per_stage_and_kind(gated):
    inst = make_inst(8, model=moe_model(gated))
    plan = make_plan(inst, tp=2, pp=2, dp=2, ep=4, sp=True)
    tm = terms_of(inst, plan)
    assert set(tm.memory) == {"first_dense", "last_dense", "first_moe", "last_moe"}
    rep = evaluate(inst, plan)
    worst = max(tm.memory, key=tm.memory_total)
    assert rep.most_loaded_stage == worst
    # a stage of MoE layers holds the experts: more weights than a stage of dense layers
    assert tm.memory["first_moe"]["weights"] > tm.memory["first_dense"]["weights"]


def test_all_moe_model_has_first_and_last_stages():
    inst = make_inst(2, model=moe_model(False, first_dense=0))
    assert inst.model.moe_layers == L
    tm = terms_of(inst, make_plan(inst, dp=2, ep=2))
    assert set(tm.memory) == {"first", "last"}
    rep = evaluate(inst, make_plan(inst, dp=2, ep=2))
    assert rep.most_loaded_stage == "first"


# ------------------------------------------------------------------------------------------
# structural rules
# ------------------------------------------------------------------------------------------


def test_ep_must_divide_experts():
    inst = make_inst(3, model=moe_model(False), global_batch=6)
    plan = make_plan(inst, dp=3, ep=3, check=False)
    assert structural_violations(inst, plan) == ["ep=3 must divide experts=4"]


def test_ep_needs_moe_model():
    inst = make_inst(2)
    plan = make_plan(inst, dp=2, ep=2, check=False)
    assert structural_violations(inst, plan) == [
        "ep=2 needs a mixture-of-experts model (model.experts > 1)"]
    assert terms_of(inst, plan).time["ep_comm"] == 0


def test_moe_tp_needs_sequence_parallelism():
    inst = make_inst(2, model=moe_model(False))
    off = make_plan(inst, tp=2, sp=False, check=False)
    on = make_plan(inst, tp=2, sp=True, check=False)
    assert structural_violations(inst, off) == [
        "MoE layers with tp > 1 need sequence parallelism (Megatron-Core)"]
    assert structural_violations(inst, on) == []
    # a dense model does not need it
    dense = make_inst(2)
    assert structural_violations(dense, make_plan(dense, tp=2, sp=False, check=False)) == []


# ------------------------------------------------------------------------------------------
# regressions of two bugs found by these tests (both fixed)
# ------------------------------------------------------------------------------------------


def test_ep_intra_must_match_a_single_node():
    """On one node of 8 GPUs, ep = 4 with ep_intra = 1 would put the 4 expert ranks on 4
    nodes: the degrees it implies are no placement (the expert group spans e_out = 4 nodes,
    its expert data-parallel group a quarter of one, ed_out = 0.25), so the plan is refused,
    by name; with ep_intra = 4 the same plan tiles the node and is accepted."""
    inst = make_inst(8, model=moe_model(False))              # one node of 8 GPUs
    plan = make_plan(inst, dp=8, ep=4, ep_intra=1, check=False)
    x = plan.grid.degrees()
    assert (x.e_in, x.e_out, x.ed_out) == (1, 4, 0.25)
    assert structural_violations(inst, plan) == [
        "ep_intra=1: the expert data-parallel group (2 ranks, 8 of them inside a node) does "
        "not tile the 1 node; choose ep_intra so ep / ep_intra divides the node count"]
    fits = make_plan(inst, dp=8, ep=4, ep_intra=4, check=False)
    y = fits.grid.degrees()
    assert (y.e_in, y.e_out, y.ed_out) == (4, 1, 1)
    assert structural_violations(inst, fits) == []


def test_all_moe_tp_overlap_ignores_unused_ffn_hidden():
    out = []
    for ffn in (64, 4096):
        inst = make_inst(2, model=moe_model(False, first_dense=0, ffn_hidden=ffn))
        out.append(terms_of(inst, make_plan(inst, tp=2, sp=True, tp_comm_overlap=True))
                   .time["tp_comm"])
    assert out[0] == pytest.approx(out[1], rel=REL)

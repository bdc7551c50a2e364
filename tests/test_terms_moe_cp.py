"""Context parallelism and mixture-of-experts terms of ``planner.evaluator.step_terms`` against
hand computations.

Same conventions as ``tests/test_terms.py``: a tiny model (L=4, h=64, a=4, V=128, s=32), cluster
overrides set to round numbers (efficiency 0.5, 100 GB/s inside a node, 10 GB/s across nodes), and
every expected value written out as explicit arithmetic with a comment naming the formula. The only
figures taken from elsewhere are the A100-80GB datasheet numbers (peak, HBM bandwidth, link
latencies), read straight from ``hardware_catalog/a100-80gb.toml`` with ``tomllib``.

The MoE model: 4 layers, the first dense (MLP width F = 4h = 256) and 3 MoE layers of E = 4 routed
experts of width FE = 96, top_k = 2, one shared expert; gated (SwiGLU, 3 matrices) or not (2).

Notation: b micro-batch, B global batch, m = B / (dp b), t tensor, p pipeline, d data, c context,
ep expert-parallel, ed expert data-parallel; PK = peak * efficiency; tensors 16-bit unless stated.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from planner.evaluator import Degrees, Knobs, evaluate, step_terms
from planner.plan import structural_violations
from planner.workload import Shape
from test_terms import make_inst, make_plan, terms_of  # the same builders and catalog figures

ROOT = Path(__file__).resolve().parents[1]
A100 = tomllib.loads((ROOT / "hardware_catalog" / "a100-80gb.toml").read_text())

PEAK = A100["peak_tflops_bf16"] * 1e12          # FLOP/s, dense bf16
HBM = A100["hbm_bandwidth_GBps"] * 1e9          # B/s
LAT_I = A100["intra_node_latency_us"] * 1e-6    # s per step inside a node
LAT_O = A100["inter_node_latency_us"] * 1e-6    # s per step across nodes
EFF = 0.5
PK = PEAK * EFF
BWI = 100e9                                     # intra-node B/s per GPU per direction
BWO = 10e9                                      # inter-node B/s per GPU per direction

L, H, A, V, S = 4, 64, 4, 128, 32
F = 4 * H                                       # default ffn_hidden (the dense layers' MLP)

# the MoE model
E, TOPK, FE, NSH = 4, 2, 96, 1                  # experts, top_k, expert width, shared experts
N_DENSE, N_MOE = 1, 3                           # first_dense_layers = 1 of L = 4

REL = 1e-9


# ------------------------------------------------------------------------------------------
# builders
# ------------------------------------------------------------------------------------------


def moe_model(gated: bool, first_dense: int = N_DENSE, **extra) -> dict:
    return {"experts": E, "top_k": TOPK, "moe_ffn_hidden": FE, "shared_experts": NSH,
            "first_dense_layers": first_dense, "gated_mlp": gated, **extra}


def hand_allreduce(size, n_in, n_out):
    """Hierarchical ring all-reduce: 2(1-1/ni) S/bwi + 2(1/ni-1/n) S/bwo + 2(ni-1)li + 2(no-1)lo."""
    n = n_in * n_out
    return (2 * (1 - 1 / n_in) * size / BWI + 2 * (1 / n_in - 1 / n) * size / BWO
            + 2 * (n_in - 1) * LAT_I + 2 * (n_out - 1) * LAT_O)


def dense_params_p1():
    """A dense model on one stage (tied, learned positions): L (12h^2 + 13h) + V h + s h + 2h."""
    return L * (12 * H * H + 13 * H) + V * H + S * H + 2 * H


def mats(gated):
    """MLP matrices: 3 for a gated MLP (gate, up, down), else 2."""
    return 3 if gated else 2


def act_f(gated):
    """Bytes per MLP-width element of the activation: gated 6 (two halves + product), GeLU 4."""
    return 6 if gated else 4


def dense_layer_params(gated):
    """QKV 3h^2 + proj h^2 + MLP (2|3) h F + norms/biases (4h + 3h + h + F + h)."""
    return 3 * H * H + H * H + mats(gated) * H * F + (4 * H + 3 * H + H + F + H)


def moe_dense_params(gated):
    """Attention 4h^2 + its norms/biases (4h + 3h + h) + router h E + shared experts (2|3) h FE."""
    return 3 * H * H + H * H + (4 * H + 3 * H + H) + H * E + NSH * mats(gated) * H * FE


def expert_params(gated):
    """One routed expert: (2|3) h FE (no biases)."""
    return mats(gated) * H * FE


# ------------------------------------------------------------------------------------------
# context parallelism
# ------------------------------------------------------------------------------------------


CP_CASES = {
    # name: (gpus, gpus_per_node, plan kwargs, kv heads, ring step crosses nodes)
    "cp2-intra": (2, 8, {"cp": 2}, A, False),
    "cp2-inter": (2, 1, {"cp": 2, "cp_intra": 1}, A, True),
    # cp = 4 as 2 nodes x 2: two of the four hops are NVLink, yet every step runs at NIC pace
    "cp4-mixed": (4, 2, {"cp": 4, "cp_intra": 2}, A, True),
    "tp2-cp2-gqa": (4, 8, {"tp": 2, "cp": 2, "sp": True}, 2, False),
}


@pytest.mark.parametrize("recompute", ["none", "full"])
@pytest.mark.parametrize("case", sorted(CP_CASES))
def test_cp_ring_exchange_exposed(case, recompute):
    gpus, gpn, kw, kv, inter = CP_CASES[case]
    inst = make_inst(gpus, model={"kv_heads": kv}, cluster={"gpus_per_node": gpn})
    plan = make_plan(inst, b=1, recompute=recompute, **kw)
    tm = terms_of(inst, plan)
    b, t, c, m = 1, kw.get("tp", 1), kw["cp"], 8             # m = B / (dp b) = 8
    tokens = b * S / c                                       # s / c tokens per GPU
    # K and V of the local shard, 16-bit, kv/heads of the width, split over tensor ranks
    kv_bytes = 2 * 2 * tokens * H * kv / A / t
    # one ring step: size / bw + latency, at the pace of the slowest (inter-node) hop
    step = kv_bytes / BWO + LAT_O if inter else kv_bytes / BWI + LAT_I
    passes = 4 if recompute == "full" else 3                 # fwd K/V (x2 under full) + bwd K/V, dK/dV
    raw = (c - 1) * passes * step
    attn = (passes + 0.5) * 4 * b * S * S * H / (t * c) / PK   # flash attention core it hides behind
    assert raw > attn                                        # tiny s: the ring is exposed
    assert tm.layer["attention"] == pytest.approx(attn, rel=REL)
    # cp_comm = m L/p (max(0, ring - attention) + the last backward hop, which nothing hides)
    assert tm.time["cp_comm"] == pytest.approx(m * L * (raw - attn + step), rel=REL)


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
    """s = 4096: the attention core (s^2) outgrows the K/V exchange (s) on NVLink, not on the NIC."""
    s, b, c, m = 4096, 1, 2, 8
    inst = make_inst(2, model={"seq_len": s}, cluster={"gpus_per_node": 8 if where == "intra" else 1})
    tm = terms_of(inst, make_plan(inst, cp=c, cp_intra=2 if where == "intra" else 1, b=b))
    kv_bytes = 2 * 2 * (b * s / c) * H                       # K, V of s/c tokens (k = a, t = 1)
    step = kv_bytes / BWI + LAT_I if where == "intra" else kv_bytes / BWO + LAT_O
    raw = (c - 1) * 3 * step
    attn = 3.5 * 4 * b * s * s * H / c / PK
    if where == "intra":
        assert raw < attn
        # max(0, raw - attn) = 0: only the last backward hop is exposed
        assert tm.time["cp_comm"] == pytest.approx(m * L * step, rel=REL)
    else:
        assert raw > attn
        assert tm.time["cp_comm"] == pytest.approx(m * L * (raw - attn + step), rel=REL)


def test_no_cp_no_ring():
    inst = make_inst(2)
    assert terms_of(inst, make_plan(inst, dp=2)).time["cp_comm"] == 0


@pytest.mark.parametrize("flash", [True, False])
@pytest.mark.parametrize("cp", [1, 2, 4])
def test_cp_splits_attention_and_activations(cp, flash):
    b, m = 2, 4                                              # B = 8, dp = 1
    inst = make_inst(cp, training={"flash_attention": flash})
    tm = terms_of(inst, make_plan(inst, cp=cp, b=b))
    tokens = b * S / cp                                      # the query rows a GPU owns
    base = tokens * (10 * H + 4 * H + 4 * H + 4 * F)         # Korthikanti Table 2, t = 1
    if flash:
        attn = 3.5 * 4 * b * S * S * H / cp / PK             # 4 b s^2 h / c, 3.5 passes
        stored = base + 4 * A * tokens                       # fp32 softmax statistics
    else:
        # roofline per (query, key) pair: max(4h / PK, 4a / HBM), b s^2 / c pairs, 3 passes
        attn = 3 * (b * S * S / cp) * max(4 * H / PK, 4 * A / HBM)
        stored = base + 5 * A * tokens * S                   # scores: 5 a (s/c) s b
    mask = tokens * H                                        # embedding dropout mask, p = 1
    assert tm.layer["attention"] == pytest.approx(attn, rel=REL)
    assert tm.memory["first"]["activations"] == pytest.approx(L * stored + mask, rel=REL)
    one = make_inst(1, training={"flash_attention": flash})
    ref = terms_of(one, make_plan(one, b=b))
    assert tm.layer["attention"] == pytest.approx(ref.layer["attention"] / cp, rel=REL)
    assert tm.memory["first"]["activations"] == pytest.approx(
        ref.memory["first"]["activations"] / cp, rel=REL)
    # the whole layer compute (GEMMs, element-wise) is split over c too
    assert tm.layer["compute"] == pytest.approx(ref.layer["compute"] / cp, rel=REL)
    assert m == 8 // b


@pytest.mark.parametrize("distopt", [False, True])
@pytest.mark.parametrize("case", ["cp-across-dp-inside", "cp-inside-dp-across", "all-inside"])
def test_dp_gradients_reduced_over_dp_times_cp(case, distopt):
    if case == "all-inside":
        inst = make_inst(4)
        plan = make_plan(inst, dp=2, cp=2, distopt=distopt)
        n_in, n_out = 4, 1
    elif case == "cp-across-dp-inside":
        inst = make_inst(4, cluster={"gpus_per_node": 2})
        plan = make_plan(inst, dp=2, cp=2, dp_intra=2, cp_intra=1, distopt=distopt)
        n_in, n_out = 2, 2
    else:
        inst = make_inst(4, cluster={"gpus_per_node": 2})
        plan = make_plan(inst, dp=2, cp=2, dp_intra=1, cp_intra=2, distopt=distopt)
        n_in, n_out = 2, 2
    tm = terms_of(inst, plan)
    grad = 2 * dense_params_p1()                             # 16-bit gradients, t = 1
    assert tm.time["dp_comm"] == pytest.approx(hand_allreduce(grad, n_in, n_out), rel=REL)
    # Adam step 30 B/param over HBM; the distributed optimizer shards it over d c = 4 ranks
    shards = 4 if distopt else 1
    assert tm.time["optimizer"] == pytest.approx(dense_params_p1() / shards * 30 / HBM, rel=REL)
    assert tm.memory["first"]["optimizer_states"] == pytest.approx(
        12 * dense_params_p1() / shards, rel=REL)


# ------------------------------------------------------------------------------------------
# mixture of experts: FLOPs and compute
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("gated", [False, True])
def test_moe_shape_flops(gated):
    inst = make_inst(1, model=moe_model(gated))
    sh = Shape.of(inst.model)
    assert (sh.n_dense, sh.n_moe, sh.experts, sh.top_k, sh.f_e, sh.shared) == (
        N_DENSE, N_MOE, E, TOPK, FE, NSH)
    b, mm = 2, mats(gated)
    # MoE layer forward: attention GEMMs 2 b s (3h^2 + h^2) + router 2 b s h E
    # + (top_k + shared) expert MLPs 2 b s (2|3) h FE
    moe = 2 * b * S * (3 * H * H + H * H) + 2 * b * S * H * E + (TOPK + NSH) * 2 * b * S * mm * H * FE
    assert sh.moe_gemm_flops(b) == pytest.approx(moe, rel=REL)
    assert sh.mlp_flops(b, FE) == pytest.approx(2 * b * S * mm * H * FE, rel=REL)
    # model FLOPs = 3 B (n_dense dense GEMMs + n_moe MoE GEMMs + L 4 s^2 h + 2 s h V) per sequence
    dense_seq = 2 * S * (3 * H * H + H * H + mm * H * F)
    moe_seq = 2 * S * (4 * H * H) + 2 * S * H * E + (TOPK + NSH) * 2 * S * mm * H * FE
    B = 16
    flops = 3 * B * (N_DENSE * dense_seq + N_MOE * moe_seq + L * 4 * S * S * H + 2 * S * H * V)
    assert sh.model_flops(B) == pytest.approx(flops, rel=REL)
    # parameters of the parts
    assert sh.expert_params == expert_params(gated)
    assert sh.moe_dense_params == pytest.approx(moe_dense_params(gated), rel=REL)
    assert sh.layer_params == pytest.approx(dense_layer_params(gated), rel=REL)


@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("tp", [1, 2])
def test_moe_layer_compute_is_the_dense_moe_average(tp, gated):
    dp, ep, b, m = 2, 2, 1, 4                                # B = 8: m = 8 / (2 * 1)
    inst = make_inst(tp * dp, model=moe_model(gated))
    tm = terms_of(inst, make_plan(inst, tp=tp, dp=dp, ep=ep, b=b, sp=tp > 1))
    mm, af = mats(gated), act_f(gated)
    tokens = b * S
    # dense layer: GEMMs 3 passes of 2 b s (4h^2 + (2|3) h F) / t; element-wise 22h / t (SP)
    # + (4|6) F / t bytes per token, 3 passes
    gemm_d = 3 * 2 * b * S * (4 * H * H + mm * H * F) / tp / PK
    elt_d = 3 * tokens * (22 * H / tp + af * F / tp) / HBM
    # MoE layer: attention GEMMs + router + (top_k + shared) experts; element-wise: the
    # experts' activations (4|6) FE (top_k + shared) + permutation 8 h top_k, / t
    gemm_m = 3 * (2 * b * S * 4 * H * H + 2 * b * S * H * E
                  + (TOPK + NSH) * 2 * b * S * mm * H * FE) / tp / PK
    elt_m = 3 * tokens * (22 * H / tp + (af * FE * (TOPK + NSH) + 8 * H * TOPK) / tp) / HBM
    attn = 3.5 * 4 * b * S * S * H / tp / PK                 # the same attention core in both
    layer = (N_DENSE / L) * (gemm_d + attn + elt_d) + (N_MOE / L) * (gemm_m + attn + elt_m)
    assert tm.layer["gemm"] == pytest.approx(gemm_d, rel=REL)
    assert tm.layer["compute"] == pytest.approx(layer, rel=REL)
    logits = 3 * 2 * b * S * H * V / tp / PK
    # compute = m (L/p layer + logits)
    assert tm.time["compute"] == pytest.approx(m * (L * layer + logits), rel=REL)


def test_all_moe_model_compute_is_the_moe_layer():
    inst = make_inst(2, model=moe_model(False, first_dense=0))
    tm = terms_of(inst, make_plan(inst, dp=2, ep=2))
    b, tokens = 1, S
    gemm_m = 3 * (2 * b * S * 4 * H * H + 2 * b * S * H * E + (TOPK + NSH) * 2 * b * S * 2 * H * FE) / PK
    elt_m = 3 * tokens * (22 * H + 4 * FE * (TOPK + NSH) + 8 * H * TOPK) / HBM
    attn = 3.5 * 4 * b * S * S * H / PK
    assert tm.layer["compute"] == pytest.approx(gemm_m + attn + elt_m, rel=REL)


# ------------------------------------------------------------------------------------------
# mixture of experts: all-to-all
# ------------------------------------------------------------------------------------------


EP_CASES = {
    # name: (gpus, gpus_per_node, plan kwargs, (e_in, e_out), recompute)
    "ep4-intra": (4, 8, {"dp": 4, "ep": 4}, (4, 1), "none"),
    "ep4-spanning": (8, 4, {"dp": 8, "dp_intra": 4, "ep": 4, "ep_intra": 2}, (2, 2), "none"),
    "ep2-across": (4, 2, {"dp": 4, "dp_intra": 2, "ep": 2, "ep_intra": 1}, (1, 2), "none"),
    "ep4-tp2-cp2-full": (8, 8, {"tp": 2, "cp": 2, "dp": 2, "ep": 4, "sp": True}, (4, 1), "full"),
}


@pytest.mark.parametrize("case", sorted(EP_CASES))
def test_ep_all_to_all(case):
    gpus, gpn, kw, (e_in, e_out), recompute = EP_CASES[case]
    B, b = 16, 1
    inst = make_inst(gpus, model=moe_model(False), cluster={"gpus_per_node": gpn}, global_batch=B)
    plan = make_plan(inst, b=b, recompute=recompute, **kw)
    x = Degrees.of(plan)
    assert (x.e_in, x.e_out) == (e_in, e_out)
    tm = terms_of(inst, plan)
    t, c, dp = kw.get("tp", 1), kw.get("cp", 1), kw["dp"]
    ep, m = e_in * e_out, B / (dp * b)
    tokens = b * S / c
    size = 2 * tokens * H * TOPK / t                         # top_k 16-bit copies of the tokens
    # all-to-all: (e_in - 1)/ep of it over NVLink, (1 - 1/e_out) over the NIC, one latency per
    # peer step inside and across nodes
    a2a = (size * (e_in - 1) / ep / BWI + size * (1 - 1 / e_out) / BWO
           + (e_in - 1) * LAT_I + (e_out - 1) * LAT_O)
    n_a2a = 2 * (2 + 1) if recompute == "full" else 2 * (1 + 1)   # 2 (n_fwd + 1): dispatch+combine
    assert tm.layer["ep_comm"] == pytest.approx(n_a2a * a2a, rel=REL)
    # ep_comm = m L/p (n_moe / L) ep_layer
    assert tm.time["ep_comm"] == pytest.approx(m * L * (N_MOE / L) * n_a2a * a2a, rel=REL)


def test_dense_model_has_no_ep_comm():
    inst = make_inst(4)
    plan = make_plan(inst, dp=4)
    assert terms_of(inst, plan).time["ep_comm"] == 0
    # even with expert-parallel degrees forced on the degrees, a dense model has nothing to route
    x = Degrees.of(plan)
    forced = Degrees(**{**vars(x), "e_in": 2, "e_out": 2})
    tm = step_terms(inst, forced, Knobs())
    assert tm.time["ep_comm"] == 0
    ref = terms_of(inst, plan)
    for name, value in ref.time.items():
        assert tm.time[name] == pytest.approx(value, rel=REL), name


# ------------------------------------------------------------------------------------------
# mixture of experts: gradient reduction and optimizer step
# ------------------------------------------------------------------------------------------


ED_CASES = {
    # name: (gpus, gpus_per_node, plan kwargs, (dp_in, dp_out), (ed_in, ed_out))
    # ed = gpus / (pp ep); ed_in = node / (ep_intra pp_intra)
    "ep4-intra": (8, 8, {"dp": 8, "ep": 4}, (8, 1), (8 // (4 * 1), 1)),
    "ep4-spanning": (8, 4, {"dp": 8, "dp_intra": 4, "ep": 4, "ep_intra": 2}, (4, 2),
                     (4 // (2 * 1), 1)),
    "ed-spanning": (8, 4, {"dp": 8, "dp_intra": 4, "ep": 2, "ep_intra": 2}, (4, 2),
                    (4 // (2 * 1), 2)),
    "pp2": (8, 4, {"pp": 2, "pp_intra": 2, "dp": 4, "dp_intra": 2, "ep": 2, "ep_intra": 2},
            (2, 2), (4 // (2 * 2), 2)),
}


@pytest.mark.parametrize("distopt", [False, True])
@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("case", sorted(ED_CASES))
def test_expert_gradients_and_optimizer(case, gated, distopt):
    gpus, gpn, kw, (d_in, d_out), (ed_in, ed_out) = ED_CASES[case]
    inst = make_inst(gpus, model=moe_model(gated), cluster={"gpus_per_node": gpn}, global_batch=16)
    plan = make_plan(inst, distopt=distopt, **kw)
    x = Degrees.of(plan)
    pp, ep = kw.get("pp", 1), kw["ep"]
    assert plan.expert_dp == gpus / (pp * ep) == ed_in * ed_out
    assert (x.ed_in, x.ed_out) == (ed_in, ed_out)
    tm = terms_of(inst, plan)
    # non-expert parameters of the stage: L/p layers at the stage average
    # (n_dense dense + n_moe MoE-without-experts) / L, + embeddings (V h + s h) + final norm 2h
    dense = (L / pp) * (N_DENSE * dense_layer_params(gated) + N_MOE * moe_dense_params(gated)) / L \
        + V * H + S * H + 2 * H
    # routed experts per GPU: L/p layers x (n_moe / L) x E / ep experts
    experts = (L / pp) * (N_MOE / L) * E / ep * expert_params(gated)
    # dense gradients reduced over dp (x cp = 1); expert gradients over the expert data-parallel
    # group, 16-bit on the wire
    dp_comm = hand_allreduce(2 * dense, d_in, d_out) + hand_allreduce(2 * experts, ed_in, ed_out)
    assert tm.time["dp_comm"] == pytest.approx(dp_comm, rel=REL)
    # Adam step: 30 B/param; the distributed optimizer shards dense states over d c, experts' over ed
    dp = kw["dp"]
    opt = (dense / (dp if distopt else 1) + experts / (ed_in * ed_out if distopt else 1)) * 30 / HBM
    assert tm.time["optimizer"] == pytest.approx(opt, rel=REL)


# ------------------------------------------------------------------------------------------
# mixture of experts: memory per stage and kind
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("distopt", [False, True])
@pytest.mark.parametrize("recompute", ["none", "full"])
@pytest.mark.parametrize("gated", [False, True])
def test_moe_memory_stages(gated, recompute, distopt):
    tp, pp, dp, ep, b = 2, 2, 2, 4, 1
    inst = make_inst(tp * pp * dp, model=moe_model(gated))
    plan = make_plan(inst, tp=tp, pp=pp, dp=dp, ep=ep, b=b, sp=True, recompute=recompute,
                     distopt=distopt)
    ed = 8 // (pp * ep)                                      # expert data-parallel degree 1 (!= d)
    assert Degrees.of(plan).ed == ed
    tm = terms_of(inst, plan)
    assert set(tm.memory) == {"first_dense", "last_dense", "first_moe", "last_moe"}
    af = act_f(gated)
    tokens = b * S
    opt = 12 / (dp if distopt else 1)                         # fp32 master + 2 moments, sharded
    expert_opt = 12 / (ed if distopt else 1)

    def stored(parallel):
        """Per layer: 10h replicated (/t with SP) + parallel / t + flash fp32 statistics 4a / t."""
        none = tokens * (10 * H / tp + parallel / tp) + 4 * A * tokens / tp
        if recompute == "full":
            return 2 * tokens * H / tp, none                 # layer input checkpoint, rebuilt layer
        return none, 0.0

    kinds = {
        # Q 2h + K,V 4h + projection input 2h + MLP (4|6) F
        "dense": (dense_layer_params(gated), 0.0, 2 * H + 4 * H + 2 * H + af * F),
        # attention as dense + per routed copy (permuted 2h + (4|6) FE) + shared (4|6) FE
        "moe": (moe_dense_params(gated), (L / pp) * E / ep * expert_params(gated),
                2 * H + 4 * H + 2 * H + TOPK * (2 * H + af * FE) + NSH * af * FE),
    }
    for kind, (layer_p, experts_p, parallel) in kinds.items():
        per_layer, working = stored(parallel)
        # first stage: L/p layers (all of this kind) + word and position embeddings (tied, p > 1)
        first_p = ((L / pp) * layer_p + V * H + S * H) / tp
        # last stage: L/p layers + output layer (tied copy) + final norm
        last_p = ((L / pp) * layer_p + V * H + 2 * H) / tp
        expect = {
            f"first_{kind}": {
                "weights": 2 * (first_p + experts_p), "gradients": 4 * (first_p + experts_p),
                "optimizer_states": first_p * opt + experts_p * expert_opt,
                # 1F1B: p micro-batches of L/p layers; embedding dropout mask h / t per token, p in flight
                "activations": L * per_layer + working + tokens * H / tp * pp,
                "logits": 0.0},
            f"last_{kind}": {
                "weights": 2 * (last_p + experts_p), "gradients": 4 * (last_p + experts_p),
                "optimizer_states": last_p * opt + experts_p * expert_opt,
                "activations": (L / pp) * per_layer + working,   # one micro-batch of L/p layers
                "logits": 6 * tokens * V / tp},                  # 16-bit logits + fp32 softmax
        }
        for stage, terms in expect.items():
            for name, value in terms.items():
                assert tm.memory[stage][name] == pytest.approx(value, rel=REL), (stage, name)


@pytest.mark.parametrize("gated", [False, True])
def test_all_moe_model_memory_first_last(gated):
    dp, ep, b = 2, 2, 1
    inst = make_inst(dp, model=moe_model(gated, first_dense=0))
    assert inst.model.moe_layers == L
    tm = terms_of(inst, make_plan(inst, dp=dp, ep=ep, b=b))
    assert set(tm.memory) == {"first", "last"}
    af = act_f(gated)
    tokens = b * S
    experts = L * E / ep * expert_params(gated)              # ed = 2 / 2 = 1
    first_p = L * moe_dense_params(gated) + V * H + S * H + 2 * H   # p = 1: everything
    last_p = L * moe_dense_params(gated) + V * H + 2 * H
    stored = tokens * (10 * H + 2 * H + 4 * H + 2 * H + TOPK * (2 * H + af * FE) + NSH * af * FE) \
        + 4 * A * tokens
    first = tm.memory["first"]
    assert first["weights"] == pytest.approx(2 * (first_p + experts), rel=REL)
    assert first["gradients"] == pytest.approx(4 * (first_p + experts), rel=REL)
    assert first["optimizer_states"] == pytest.approx(12 * (first_p + experts), rel=REL)
    assert first["activations"] == pytest.approx(L * stored + tokens * H, rel=REL)
    assert first["logits"] == pytest.approx(6 * tokens * V, rel=REL)
    last = tm.memory["last"]
    assert last["weights"] == pytest.approx(2 * (last_p + experts), rel=REL)
    assert last["activations"] == pytest.approx(L * stored, rel=REL)
    # evaluate reports the larger stage
    rep = evaluate(inst, make_plan(inst, dp=dp, ep=ep, b=b))
    assert rep.most_loaded_stage == "first"
    assert rep.memory_gib["total"] == pytest.approx(tm.memory_total("first") / 2**30, rel=REL)


def test_moe_bubble_includes_the_moe_share_of_ep():
    tp, pp, dp, ep, b = 2, 2, 2, 2, 1
    inst = make_inst(8, model=moe_model(False))
    tm = terms_of(inst, make_plan(inst, tp=tp, pp=pp, dp=dp, ep=ep, b=b, sp=True))
    tokens = b * S
    # an MoE layer runs only the attention's 2 of the 4 collectives (experts: ETP = 1)
    tp_moe = 2 * hand_allreduce(2 * tokens * H, tp, 1)
    size = 2 * tokens * H * TOPK / tp
    a2a = size * (ep - 1) / ep / BWI + (ep - 1) * LAT_I      # ep inside the node
    ep_layer = 4 * a2a
    # L/p = 2 layers per stage and 3 MoE layers: the last stage is all-MoE and sets the pace,
    # bubble = R (p - 1) / v stage times of that stage
    assert tm.layer["stage_moe_layers"] == 2
    assert tm.layer["tp_comm_moe"] == pytest.approx(tp_moe, rel=REL)
    bubble = 1.0 * (pp - 1) / 1 * 2 * (tm.layer["moe_compute"] + tp_moe + ep_layer)
    assert tm.time["bubble"] == pytest.approx(bubble, rel=REL)
    m = 8 / (dp * b)
    assert tm.time["ep_comm"] == pytest.approx(m * 2 * ep_layer, rel=REL)
    assert tm.time["tp_comm"] == pytest.approx(m * 2 * tp_moe, rel=REL)


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
    inst = make_inst(8, model=moe_model(False))              # one node of 8 GPUs
    plan = make_plan(inst, dp=8, ep=4, ep_intra=1, check=False)
    x = Degrees.of(plan)
    assert x.ed_out >= 1 and x.e_out == 1 or structural_violations(inst, plan) != []


def test_all_moe_tp_overlap_ignores_unused_ffn_hidden():
    out = []
    for ffn in (64, 4096):
        inst = make_inst(2, model=moe_model(False, first_dense=0, ffn_hidden=ffn),
                         training={"tp_overlap": 0.9})
        out.append(terms_of(inst, make_plan(inst, tp=2, sp=True)).time["tp_comm"])
    assert out[0] == pytest.approx(out[1], rel=REL)

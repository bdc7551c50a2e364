"""Each time and memory term of ``planner.evaluator.step_terms`` against a hand computation.

The configuration is tiny (L=4 layers, h=64, a=4 heads, V=128, s=32) and the cluster overrides
are round numbers (efficiency 0.5, 100 GB/s inside a node, 10 GB/s across nodes), so every
expected value below is explicit arithmetic on the formulas of DESIGN.md section 1, written out in
the test with a comment naming the formula. The only figures taken from elsewhere are the
catalog datasheet numbers of the A100-80GB (peak, HBM bandwidth, link latencies), read straight
from ``hardware_catalog/a100-80gb.toml`` with ``tomllib`` (not through the planner's loader).

Notation: b micro-batch, B global batch, m = B / (dp b) micro-batches, t tensor, p pipeline,
d data, c context, v virtual stages; PK = peak * efficiency; all tensors 16-bit unless stated.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from planner.evaluator import TIME_TERMS, Degrees, Knobs, evaluate, step_terms
from planner.instance import parse_instance
from planner.plan import Plan, structural_violations

ROOT = Path(__file__).resolve().parents[1]
A100 = tomllib.loads((ROOT / "hardware_catalog" / "a100-80gb.toml").read_text())
H100 = tomllib.loads((ROOT / "hardware_catalog" / "h100-sxm.toml").read_text())

# Catalog figures (datasheet values, not calibrated).
PEAK = A100["peak_tflops_bf16"] * 1e12          # FLOP/s, dense bf16
HBM = A100["hbm_bandwidth_GBps"] * 1e9          # B/s
LAT_I = A100["intra_node_latency_us"] * 1e-6    # s per ring step inside a node
LAT_O = A100["inter_node_latency_us"] * 1e-6    # s per ring step across nodes
# Instance overrides (round numbers).
EFF = 0.5
PK = PEAK * EFF                                 # achieved 16-bit FLOP/s
BWI = 100e9                                     # intra-node B/s per GPU per direction
BWO = 10e9                                      # inter-node B/s per GPU per direction

# The tiny model.
L, H, A, V, S = 4, 64, 4, 128, 32
F = 4 * H                                       # default ffn_hidden

REL = 1e-9


# ------------------------------------------------------------------------------------------
# builders
# ------------------------------------------------------------------------------------------


def make_inst(gpus: int, *, model: dict | None = None, training: dict | None = None,
              cluster: dict | None = None, global_batch: int = 8):
    m = {"layers": L, "hidden": H, "heads": A, "vocab": V, "seq_len": S, **(model or {})}
    tr = {"global_batch": global_batch, **(training or {})}
    cl = {"gpu": "a100-80gb", "gpus": gpus, "efficiency": EFF,
          # the flat model (no GEMM size curve): every formula below is the size-free one
          "gemm_knee_tokens": 0, "gemm_knee_width": 0,
          "intra_node_bandwidth_GBps": BWI / 1e9, "inter_node_bandwidth_GBps": BWO / 1e9,
          **(cluster or {})}
    inst = parse_instance({"model": m, "training": tr, "cluster": cl})
    # the overrides must have reached the hardware record
    assert inst.hw.efficiency == EFF
    assert inst.hw.bw_intra == BWI and inst.hw.bw_inter == BWO
    return inst


def make_plan(inst, *, tp=1, pp=1, dp=1, cp=1, vp=1, b=1, B=None, recompute="none", sp=False,
              distopt=False, ep=1, ep_intra=None, tp_intra=None, cp_intra=None, dp_intra=None,
              pp_intra=None, check=True) -> Plan:
    """A plan with explicit intra-node factors (default: everything inside one node)."""
    gpus = tp * pp * dp * cp
    assert gpus == inst.gpus
    plan = Plan(tp=tp, pp=pp, dp=dp, cp=cp, vp=vp, micro_batch=b,
                global_batch=B or inst.spec.training.global_batch, gpus=gpus, nodes=inst.nodes,
                recompute=recompute, sequence_parallel=sp, distributed_optimizer=distopt,
                tp_intra=tp if tp_intra is None else tp_intra,
                cp_intra=cp if cp_intra is None else cp_intra,
                dp_intra=dp if dp_intra is None else dp_intra,
                pp_intra=pp if pp_intra is None else pp_intra,
                ep=ep, ep_intra=ep if ep_intra is None else ep_intra)
    if check:
        assert structural_violations(inst, plan) == []
    return plan


def terms_of(inst, plan):
    k = Knobs(plan.recompute, plan.sequence_parallel, plan.distributed_optimizer)
    return step_terms(inst, Degrees.of(plan), k)


# Test-local hand formulas, used only by the composite tests (bubble, overlap, sums) after the
# direct tests below have checked each of them inline.


def hand_layer_compute_flash(b, t, sp=False, passes=3, h=H, a=A, s=S, f=F):
    """GEMMs + flash attention + element-wise traffic of one layer and micro-batch (t GPUs)."""
    gemm = passes * 2 * b * s * (3 * h * h + h * h + 2 * h * f) / t / PK
    attn = (passes + 0.5) * 4 * b * s * s * h / t / PK
    elt = passes * b * s * (22 * h / (t if sp else 1) + 4 * f / t) / HBM
    return gemm, attn, elt


def hand_allreduce(size, n_in, n_out):
    """Hierarchical ring all-reduce: 2(1-1/ni) S/bwi + 2(1/ni-1/n) S/bwo + 2(ni-1)li + 2(no-1)lo."""
    n = n_in * n_out
    return (2 * (1 - 1 / n_in) * size / BWI + 2 * (1 / n_in - 1 / n) * size / BWO
            + 2 * (n_in - 1) * LAT_I + 2 * (n_out - 1) * LAT_O)


def layer_params_gpt(h=H, f=F):
    """12 h^2 + 13 h for k = a, f = 4h (Narayanan et al. 2021 Eq. 2's per-layer count)."""
    return 3 * h * h + h * h + 2 * h * f + (4 * h + 3 * h + h + f + h)


# ------------------------------------------------------------------------------------------
# compute
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_compute_flash_no_recompute(tp):
    inst = make_inst(tp, global_batch=8)
    plan = make_plan(inst, tp=tp, b=2)                      # m = 8 / (1 * 2) = 4
    tm = terms_of(inst, plan)
    b, m = 2, 4
    # GEMMs forward: 2 b s (QKV 3h^2 + proj h^2 + MLP 2hf); fwd + bwd (2x) = 3 passes, / t
    gemm = 3 * (2 * b * S * (3 * H * H + H * H + 2 * H * F)) / tp / PK
    # flash attention core: 4 b s^2 h forward, 3.5 passes (bwd recomputes QK^T), / t
    attn = 3.5 * (4 * b * S * S * H) / tp / PK
    # element-wise forward bytes per token: 22h replicated (norms, bias-dropout-add) + 4f / t
    # (GeLU read + write); backward = 2x forward -> 3 passes over HBM
    elt = 3 * (b * S) * (22 * H + 4 * F / tp) / HBM
    # output layer: 2 b s h V forward, 3x for fwd + bwd, / t
    logits = 3 * (2 * b * S * H * V) / tp / PK
    assert tm.layer["gemm"] == pytest.approx(gemm, rel=REL)
    assert tm.layer["attention"] == pytest.approx(attn, rel=REL)
    assert tm.layer["eltwise"] == pytest.approx(elt, rel=REL)
    assert tm.layer["compute"] == pytest.approx(gemm + attn + elt, rel=REL)
    # compute = m (L/p layer + logits)
    assert tm.time["compute"] == pytest.approx(m * (L * (gemm + attn + elt) + logits), rel=REL)


@pytest.mark.parametrize("hidden, bound", [(64, "bytes"), (512, "flops")])
def test_compute_unfused_attention_roofline(hidden, bound):
    """Unfused attention: max(4h / PK, 4a / HBM) per b s^2 / t score element group; the
    small head dimension (16) is HBM-bound, the large one (128) compute-bound."""
    tp, b, f = 2, 1, 4 * hidden
    inst = make_inst(tp, model={"hidden": hidden}, training={"flash_attention": False})
    plan = make_plan(inst, tp=tp, b=b)                       # m = 8
    tm = terms_of(inst, plan)
    per_flops = 4 * hidden / PK      # QK^T + AV: 4h FLOPs per (query, key) pair and sequence
    per_bytes = 2 * 2 * A / HBM      # write + read a 16-bit score per head: 4a bytes per pair
    assert (per_flops > per_bytes) == (bound == "flops")
    roof = per_flops if bound == "flops" else per_bytes
    attn = 3 * (b * S * S / tp) * roof
    # element-wise: layer kernels + 9 bytes per score element (softmax r/w 4, dropout r/w 4,
    # mask 1), a b s^2 / t score elements per GPU
    score_bytes = 9 * A * b * S * S / tp
    elt = 3 * ((b * S) * (22 * hidden + 4 * f / tp) + score_bytes) / HBM
    gemm = 3 * (2 * b * S * (3 * hidden ** 2 + hidden ** 2 + 2 * hidden * f)) / tp / PK
    assert tm.layer["attention"] == pytest.approx(attn, rel=REL)
    assert tm.layer["eltwise"] == pytest.approx(elt, rel=REL)
    assert tm.layer["gemm"] == pytest.approx(gemm, rel=REL)


@pytest.mark.parametrize("flash", [True, False])
@pytest.mark.parametrize("mode", ["none", "selective", "full"])
def test_recompute_modes_time(mode, flash):
    tp, b = 2, 1
    inst = make_inst(tp, training={"flash_attention": flash})
    plan = make_plan(inst, tp=tp, b=b, recompute=mode)       # m = 8
    tm = terms_of(inst, plan)
    m = 8
    passes = 4 if mode == "full" else 3      # full recompute reruns the whole forward
    gemm = passes * (2 * b * S * (3 * H * H + H * H + 2 * H * F)) / tp / PK
    layer_elt_bytes = (b * S) * (22 * H + 4 * F / tp)
    if flash:
        # selective recompute re-runs the fused attention forward (one more pass)
        extra = 1 if mode == "selective" else 0
        attn = (passes + 0.5 + extra) * (4 * b * S * S * H) / tp / PK
        elt = passes * layer_elt_bytes / HBM
    else:
        extra = 1 if mode == "selective" else 0  # selective reruns the attention core forward
        attn = (passes + extra) * (b * S * S / tp) * max(4 * H / PK, 4 * A / HBM)
        score = 9 * A * b * S * S / tp
        elt = (passes * (layer_elt_bytes + score) + extra * score) / HBM
    assert tm.layer["gemm"] == pytest.approx(gemm, rel=REL)
    assert tm.layer["attention"] == pytest.approx(attn, rel=REL)
    assert tm.layer["eltwise"] == pytest.approx(elt, rel=REL)
    logits = 3 * (2 * b * S * H * V) / tp / PK
    assert tm.time["compute"] == pytest.approx(m * (L * (gemm + attn + elt) + logits), rel=REL)
    # TP: 4 all-reduces per layer (2 fwd, 2 bwd) + 2 for the recomputed forward under full;
    # each a ring of 2 b s h bytes over t=2 inside a node: 2 (1 - 1/t) S / bw + 2 (t-1) lat
    n_ar = 6 if mode == "full" else 4
    size = 2 * b * S * H
    ar = 2 * (1 - 1 / tp) * size / BWI + 2 * (tp - 1) * LAT_I
    assert tm.layer["tp_comm"] == pytest.approx(n_ar * ar, rel=REL)
    assert tm.time["tp_comm"] == pytest.approx(m * L * n_ar * ar, rel=REL)


def test_recompute_costs_time_in_order():
    tp = 2
    inst = make_inst(tp, training={"flash_attention": False})
    steps = {mode: evaluate(inst, make_plan(inst, tp=tp, recompute=mode)).step_time_s
             for mode in ("none", "selective", "full")}
    assert steps["none"] < steps["selective"] < steps["full"]


def test_sequence_parallel_shards_replicated_eltwise_not_tp_volume():
    tp, b = 4, 1
    inst = make_inst(tp)
    off = terms_of(inst, make_plan(inst, tp=tp, b=b, sp=False))
    on = terms_of(inst, make_plan(inst, tp=tp, b=b, sp=True))
    # SP: the 22h replicated element-wise bytes are split over t too
    assert on.layer["eltwise"] == pytest.approx(3 * (b * S) * (22 * H / tp + 4 * F / tp) / HBM,
                                                rel=REL)
    assert off.layer["eltwise"] == pytest.approx(3 * (b * S) * (22 * H + 4 * F / tp) / HBM,
                                                 rel=REL)
    # reduce-scatter + all-gather move the same bytes as the all-reduce: TP time unchanged
    size = 2 * b * S * H
    ar = 2 * (1 - 1 / tp) * size / BWI + 2 * (tp - 1) * LAT_I
    assert on.time["tp_comm"] == pytest.approx(8 * L * 4 * ar, rel=REL)
    assert off.time["tp_comm"] == pytest.approx(on.time["tp_comm"], rel=REL)
    # GEMMs and attention do not change
    assert on.layer["gemm"] == pytest.approx(off.layer["gemm"], rel=REL)
    assert on.layer["attention"] == pytest.approx(off.layer["attention"], rel=REL)


def test_gqa():
    tp, b, k = 2, 1, 2                                      # 4 query heads, 2 kv heads
    inst = make_inst(tp, model={"kv_heads": k})
    plan = make_plan(inst, tp=tp, b=b)
    tm = terms_of(inst, plan)
    # QKV: h (h + 2 h k / a) = h (h + h) = 2h^2 (instead of 3h^2)
    qkv = H * (H + 2 * H * k / A)
    assert qkv == 2 * H * H
    gemm = 3 * (2 * b * S * (qkv + H * H + 2 * H * F)) / tp / PK
    assert tm.layer["gemm"] == pytest.approx(gemm, rel=REL)
    # attention core FLOPs do not depend on k
    assert tm.layer["attention"] == pytest.approx(3.5 * 4 * b * S * S * H / tp / PK, rel=REL)
    # parameters per layer: qkv + h^2 + 2hf + norms/biases (4h + (h + 2hk/a) + h + f + h)
    lp = qkv + H * H + 2 * H * F + (4 * H + (H + 2 * H * k / A) + H + F + H)
    params = (L * lp + V * H + S * H + 2 * H) / tp           # p = 1: everything on one stage
    mem = tm.memory["first"]
    assert mem["weights"] == pytest.approx(2 * params, rel=REL)
    # activations per layer: 10h replicated + (Q 2h + K,V 4hk/a + proj 2h + MLP 4f) / t,
    # + fp32 softmax statistics of flash attention 4 a / t bytes per token
    tokens = b * S
    stored = tokens * (10 * H + (2 * H + 4 * H * k / A + 2 * H + 4 * F) / tp) + 4 * A * tokens / tp
    mask = tokens * H                                       # embedding dropout mask, 1 in flight
    assert mem["activations"] == pytest.approx(L * stored + mask, rel=REL)


def test_gated_mlp():
    tp, b, f = 2, 1, 160                                    # SwiGLU width, not 4h
    inst = make_inst(tp, model={"gated_mlp": True, "ffn_hidden": f})
    plan = make_plan(inst, tp=tp, b=b)
    tm = terms_of(inst, plan)
    # three MLP matrices: 3 h f
    gemm = 3 * (2 * b * S * (3 * H * H + H * H + 3 * H * f)) / tp / PK
    assert tm.layer["gemm"] == pytest.approx(gemm, rel=REL)
    # gated activation reads both f-wide halves and writes one: 6f bytes per token
    elt = 3 * (b * S) * (22 * H + 6 * f / tp) / HBM
    assert tm.layer["eltwise"] == pytest.approx(elt, rel=REL)
    lp = 3 * H * H + H * H + 3 * H * f + (4 * H + 3 * H + H + f + H)
    params = (L * lp + V * H + S * H + 2 * H) / tp
    assert tm.memory["first"]["weights"] == pytest.approx(2 * params, rel=REL)
    tokens = b * S
    # stored: both halves of fc1's output and the product: 6f bytes per token
    stored = tokens * (10 * H + (4 * H + 4 * H + 6 * f) / tp) + 4 * A * tokens / tp
    assert tm.memory["first"]["activations"] == pytest.approx(L * stored + tokens * H, rel=REL)


def test_logits_time_and_buffer():
    tp, pp, b = 2, 2, 2
    inst = make_inst(tp * pp, global_batch=8)
    tm = terms_of(inst, make_plan(inst, tp=tp, pp=pp, b=b))  # m = 4
    m = 4
    gemm, attn, elt = hand_layer_compute_flash(b, tp)
    # logits: 3 * 2 b s h V / t FLOPs once per micro-batch (on the last stage), not per layer
    logits = 3 * (2 * b * S * H * V) / tp / PK
    assert tm.time["compute"] - m * (L / pp) * (gemm + attn + elt) == pytest.approx(
        m * logits, rel=1e-6)
    assert tm.time["compute"] == pytest.approx(m * ((L / pp) * (gemm + attn + elt) + logits),
                                               rel=REL)
    # buffer: 16-bit logits + fp32 softmax = 6 bytes per (token, vocab / t); last stage only
    buf = 6 * (b * S) * V / tp
    assert tm.memory["last"]["logits"] == pytest.approx(buf, rel=REL)
    assert tm.memory["first"]["logits"] == 0
    one = make_inst(tp, global_batch=8)
    single = terms_of(one, make_plan(one, tp=tp, b=b))
    assert single.memory["first"]["logits"] == pytest.approx(buf, rel=REL)


def test_fp8_gemms_at_fp8_peak():
    peak16, peak8 = H100["peak_tflops_bf16"] * 1e12, H100["peak_tflops_fp8"] * 1e12
    hbm = H100["hbm_bandwidth_GBps"] * 1e9
    inst = parse_instance({
        "model": {"layers": L, "hidden": H, "heads": A, "vocab": V, "seq_len": S},
        "training": {"global_batch": 8, "precision": "fp8"},
        "cluster": {"gpu": "h100-sxm", "gpus": 1, "efficiency": 0.5, "efficiency_fp8": 0.25,
                    "gemm_knee_tokens": 0, "gemm_knee_width": 0}})
    tm = terms_of(inst, make_plan(inst, b=1))
    # the four linear layers at the FP8 peak and FP8 efficiency
    assert tm.layer["gemm"] == pytest.approx(
        3 * 2 * S * (3 * H * H + H * H + 2 * H * F) / (peak8 * 0.25), rel=REL)
    # attention core and output layer stay 16-bit
    assert tm.layer["attention"] == pytest.approx(3.5 * 4 * S * S * H / (peak16 * 0.5), rel=REL)
    assert tm.layer["eltwise"] == pytest.approx(3 * S * (22 * H + 4 * F) / hbm, rel=REL)
    # an FP8 copy of each weight and its transpose: 2 + 2 bytes of weights per parameter
    params = L * layer_params_gpt() + V * H + S * H + 2 * H
    assert tm.memory["first"]["weights"] == pytest.approx(4 * params, rel=REL)


# ------------------------------------------------------------------------------------------
# pipeline bubble
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("ratio", [1.0, 0.5])
@pytest.mark.parametrize("vp", [1, 2])
def test_bubble(vp, ratio):
    tp, pp, b = 2, 2, 1
    inst = make_inst(tp * pp, training={"bubble_ratio": ratio}, global_batch=8)
    tm = terms_of(inst, make_plan(inst, tp=tp, pp=pp, vp=vp, b=b))   # m = 8
    gemm, attn, elt = hand_layer_compute_flash(b, tp)
    ar = hand_allreduce(2 * b * S * H, tp, 1)
    stage = (L / pp) * (gemm + attn + elt + 4 * ar)         # one micro-batch through one stage
    # bubble = R (p - 1) / v stage times (Narayanan et al. 2021 Sec. 2.2; AMPeD's R)
    bubble = ratio * (pp - 1) / vp * stage
    assert tm.time["bubble"] == pytest.approx(bubble, rel=REL)


def test_no_bubble_without_pipeline():
    inst = make_inst(2)
    assert terms_of(inst, make_plan(inst, tp=2)).time["bubble"] == 0


# ------------------------------------------------------------------------------------------
# tensor-parallel all-reduce: inside a node and across nodes
# ------------------------------------------------------------------------------------------


def test_tp_allreduce_intra_node():
    tp, b = 4, 1
    inst = make_inst(tp)                                     # one node of 8, 4 GPUs used
    tm = terms_of(inst, make_plan(inst, tp=tp, b=b))
    size = 2 * b * S * H                                     # b s h 16-bit activations
    # ring all-reduce: 2 (t-1)/t size / bw + 2 (t-1) latency
    ar = 2 * (3 / 4) * size / BWI + 2 * 3 * LAT_I
    assert tm.layer["tp_comm"] == pytest.approx(4 * ar, rel=REL)
    assert tm.time["tp_comm"] == pytest.approx(8 * L * 4 * ar, rel=REL)   # m = 8


def test_tp_allreduce_spanning_nodes_is_hierarchical():
    tp, b = 4, 1
    inst = make_inst(tp, cluster={"gpus_per_node": 2})       # 2 nodes of 2 GPUs
    assert inst.nodes == 2
    tm = terms_of(inst, make_plan(inst, tp=tp, b=b, tp_intra=2))
    size = 2 * b * S * H
    # reduce-scatter + all-gather inside the node: 2 (1 - 1/t_in) S / bw_in, then the
    # inter-node ring on the S / t_in shard: 2 (1/t_in - 1/t) S / bw_out; ring steps
    # 2 (t_in - 1) lat_in + 2 (t_out - 1) lat_out
    ar = (2 * (1 - 1 / 2) * size / BWI + 2 * (1 / 2 - 1 / 4) * size / BWO
          + 2 * (2 - 1) * LAT_I + 2 * (2 - 1) * LAT_O)
    assert tm.layer["tp_comm"] == pytest.approx(4 * ar, rel=REL)
    assert tm.time["tp_comm"] == pytest.approx(8 * L * 4 * ar, rel=REL)
    intra = terms_of(make_inst(tp), make_plan(make_inst(tp), tp=tp, b=b))
    assert tm.time["tp_comm"] > intra.time["tp_comm"]


def test_tp_allreduce_entirely_across_nodes():
    tp, b = 2, 1
    inst = make_inst(tp, cluster={"gpus_per_node": 1})       # one GPU per node
    tm = terms_of(inst, make_plan(inst, tp=tp, b=b, tp_intra=1))
    size = 2 * b * S * H
    ar = 2 * (1 / 2) * size / BWO + 2 * (2 - 1) * LAT_O     # flat ring on the NIC
    assert tm.layer["tp_comm"] == pytest.approx(4 * ar, rel=REL)


# ------------------------------------------------------------------------------------------
# pipeline point-to-point
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("sp", [False, True])
@pytest.mark.parametrize("vp", [1, 2])
@pytest.mark.parametrize("where", ["intra", "inter"])
def test_pp_p2p(where, vp, sp):
    tp, pp, b = 2, 2, 1
    gpn = 8 if where == "intra" else 2
    inst = make_inst(tp * pp, cluster={"gpus_per_node": gpn})
    plan = make_plan(inst, tp=tp, pp=pp, vp=vp, b=b, tp_intra=2, sp=sp,
                     pp_intra=2 if where == "intra" else 1)
    tm = terms_of(inst, plan)
    m = 8
    # one send: b s h / t 16-bit, with or without sequence parallelism (the model assumes
    # Megatron's scatter-gather split of the send without SP, and does not cost the
    # receiver's intra-node all-gather)
    size = 2 * b * S * H / tp
    step = size / BWI + LAT_I if where == "intra" else size / BWO + LAT_O
    # 2 m (v - 1/p) sends per GPU (activations forward, gradients backward)
    assert tm.time["pp_comm"] == pytest.approx(2 * m * (vp - 1 / pp) * step, rel=REL)


# ------------------------------------------------------------------------------------------
# data-parallel reduction, optimizer step
# ------------------------------------------------------------------------------------------


def stage_params_p1():
    """All parameters on one stage (p = 1, tied embeddings): L (12h^2 + 13h) + V h + s h + 2h."""
    return L * (12 * H * H + 13 * H) + V * H + S * H + 2 * H


def test_layer_param_count_is_narayanan():
    assert layer_params_gpt() == 12 * H * H + 13 * H


@pytest.mark.parametrize("case", ["dp4-intra", "dp4-spanning", "dp2xcp2-spanning",
                                  "dp2xcp2-intra"])
def test_dp_reduction(case):
    if case == "dp4-intra":
        inst = make_inst(4)
        plan = make_plan(inst, dp=4, b=1)
        n_in, n_out = 4, 1
    elif case == "dp4-spanning":
        inst = make_inst(4, cluster={"gpus_per_node": 2})
        plan = make_plan(inst, dp=4, dp_intra=2, b=1)
        n_in, n_out = 2, 2
    elif case == "dp2xcp2-spanning":                         # cp inside the node, dp across
        inst = make_inst(4, cluster={"gpus_per_node": 2})
        plan = make_plan(inst, dp=2, cp=2, dp_intra=1, cp_intra=2, b=1)
        n_in, n_out = 2, 2
    else:
        inst = make_inst(4)
        plan = make_plan(inst, dp=2, cp=2, b=1)
        n_in, n_out = 4, 1
    tm = terms_of(inst, plan)
    grad = 2 * stage_params_p1()          # 16-bit gradients on the wire, t = 1
    n = n_in * n_out                      # reduced over dp * cp ranks
    dp = (2 * (1 - 1 / n_in) * grad / BWI + 2 * (1 / n_in - 1 / n) * grad / BWO
          + 2 * (n_in - 1) * LAT_I + 2 * (n_out - 1) * LAT_O)
    assert tm.time["dp_comm"] == pytest.approx(dp, rel=REL)


def test_dp_reduction_intra_vs_inter_values():
    grad = 2 * stage_params_p1()
    intra = terms_of(make_inst(2), make_plan(make_inst(2), dp=2)).time["dp_comm"]
    inst = make_inst(2, cluster={"gpus_per_node": 1})
    inter = terms_of(inst, make_plan(inst, dp=2, dp_intra=1)).time["dp_comm"]
    assert intra == pytest.approx(2 * (1 / 2) * grad / BWI + 2 * LAT_I, rel=REL)
    assert inter == pytest.approx(2 * (1 / 2) * grad / BWO + 2 * LAT_O, rel=REL)


def test_dp_reduction_uses_stage_params_over_t():
    tp, pp, dp = 2, 2, 2
    inst = make_inst(tp * pp * dp)
    tm = terms_of(inst, make_plan(inst, tp=tp, pp=pp, dp=dp))
    # most loaded stage (upper bound over first/last): L/p layers + V h + s h + 2h, / t
    params = ((L / pp) * (12 * H * H + 13 * H) + V * H + S * H + 2 * H) / tp
    grad = 2 * params
    assert tm.time["dp_comm"] == pytest.approx(2 * (1 / 2) * grad / BWI + 2 * LAT_I, rel=REL)


def test_cp_ring_exchange():
    cp, b = 2, 1
    inst = make_inst(cp)
    tm = terms_of(inst, make_plan(inst, cp=cp, b=b))
    tokens = b * S / cp
    kv = 2 * 2 * tokens * H                                 # K and V, 16-bit, k = a, t = 1
    ring = kv / BWI + LAT_I
    raw = (cp - 1) * 3 * ring                               # fwd K/V, bwd K/V + their gradients
    attn = 3.5 * 4 * b * S * S * H / cp / PK                # the attention it hides behind
    assert raw > attn
    # the excess over the attention core, plus the last backward hop (exposed)
    assert tm.time["cp_comm"] == pytest.approx(8 * L * (raw - attn + ring), rel=REL)
    # GEMMs see s / c tokens per GPU
    assert tm.layer["gemm"] == pytest.approx(
        3 * 2 * b * S * (12 * H * H) / cp / PK, rel=REL)


@pytest.mark.parametrize("distopt", [False, True])
def test_optimizer_step(distopt):
    dp = 4
    inst = make_inst(dp)
    tm = terms_of(inst, make_plan(inst, dp=dp, distopt=distopt))
    shards = dp if distopt else 1
    # Adam touches 30 B/param in HBM: read master, m, v, grad (4 x 4), write master, m, v
    # (3 x 4), write the 16-bit weight (2)
    opt = stage_params_p1() / shards * 30 / HBM
    assert tm.time["optimizer"] == pytest.approx(opt, rel=REL)


# ------------------------------------------------------------------------------------------
# memory
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dp", [1, 2, 4, 8])
def test_distributed_optimizer_bytes_per_param(dp):
    inst = make_inst(dp)
    on = terms_of(inst, make_plan(inst, dp=dp, distopt=True)).memory["first"]
    off = terms_of(inst, make_plan(inst, dp=dp, distopt=False)).memory["first"]
    params = stage_params_p1()
    # 2 (16-bit weights) + 4 (fp32 gradients) + 12 / d (master + Adam moments, sharded)
    assert on["weights"] + on["gradients"] + on["optimizer_states"] == pytest.approx(
        (6 + 12 / dp) * params, rel=REL)
    # without it, mixed-precision Adam's 18 bytes per parameter
    assert off["weights"] + off["gradients"] + off["optimizer_states"] == pytest.approx(
        18 * params, rel=REL)


def test_distributed_optimizer_shards_over_dp_times_cp():
    inst = make_inst(4)
    mem = terms_of(inst, make_plan(inst, dp=2, cp=2, distopt=True)).memory["first"]
    assert mem["optimizer_states"] == pytest.approx(12 / 4 * stage_params_p1(), rel=REL)


@pytest.mark.parametrize("flash", [True, False])
@pytest.mark.parametrize("sp", [False, True])
@pytest.mark.parametrize("mode", ["none", "selective", "full"])
def test_memory_terms_two_stages(mode, sp, flash):
    tp, pp, b = 2, 2, 2
    inst = make_inst(tp * pp, training={"flash_attention": flash})
    tm = terms_of(inst, make_plan(inst, tp=tp, pp=pp, b=b, recompute=mode, sp=sp))
    lp = 12 * H * H + 13 * H
    first_params = ((L / pp) * lp + V * H + S * H) / tp        # embeddings (word + position)
    last_params = ((L / pp) * lp + V * H + 2 * H) / tp         # output layer (tied copy) + norm
    tokens = b * S
    shard = tp if sp else 1
    # Korthikanti et al. 2022 Table 2, per layer: 10h replicated (/t with SP) + 24h / t
    base = tokens * (10 * H / shard + (4 * H + 4 * H + 4 * F) / tp)
    if flash:
        none = base + 4 * A * tokens / tp                       # fp32 softmax statistics
        selective = none
    else:
        none = base + 5 * A * tokens * S / tp                   # + 5 a s^2 b / t (scores)
        selective = base
    if mode == "full":
        stored, working = 2 * tokens * H / shard, none          # layer input + one layer rebuilt
    else:
        stored, working = (none if mode == "none" else selective), 0.0
    mask = tokens * H / shard * pp                              # embedding dropout, p in flight
    expect = {
        "first": {"weights": 2 * first_params, "gradients": 4 * first_params,
                  "optimizer_states": 12 * first_params,
                  # 1F1B: p micro-batches of L/p layers = L layers' worth
                  "activations": L * stored + working + mask, "logits": 0.0},
        "last": {"weights": 2 * last_params, "gradients": 4 * last_params,
                 "optimizer_states": 12 * last_params,
                 # one micro-batch of L/p layers
                 "activations": L * stored / pp + working,
                 "logits": 6 * tokens * V / tp},
    }
    for stage in ("first", "last"):
        for name, value in expect[stage].items():
            assert tm.memory[stage][name] == pytest.approx(value, rel=REL), (stage, name)


@pytest.mark.parametrize("pp, vp", [(2, 1), (2, 2), (4, 1), (4, 2)])
def test_in_flight_activations(pp, vp):
    layers, b = 8, 1
    inst = make_inst(pp, model={"layers": layers}, global_batch=8)
    tm = terms_of(inst, make_plan(inst, pp=pp, vp=vp, b=b))    # m = 8, divisible by p
    tokens = b * S
    stored = tokens * (10 * H + 8 * H + 4 * F) + 4 * A * tokens   # t = 1, flash, no recompute
    if vp == 1:
        # plain 1F1B: the first stage holds p micro-batches of L/p layers, the last one
        first_layers, last_layers, in_flight = layers, layers / pp, pp
    else:
        # interleaved (Korthikanti et al. Sec. 4.2.3): L (1 + (p-1)/(p v)) on the first stage;
        # the last stage's warm-up holds (v-1) p + 1 chunks of L/(p v) layers
        first_layers = layers * (1 + (pp - 1) / (pp * vp))
        last_layers = layers * ((vp - 1) * pp + 1) / (pp * vp)
        in_flight = pp + (pp - 1) / vp
    assert tm.memory["first"]["activations"] == pytest.approx(
        first_layers * stored + tokens * H * in_flight, rel=REL)
    assert tm.memory["last"]["activations"] == pytest.approx(last_layers * stored, rel=REL)


# ------------------------------------------------------------------------------------------
# overlap knobs
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", ["gemm-bound", "fraction-bound"])
def test_tp_overlap_maximum(case):
    """tp_comm = max((1 - o) raw, raw - gemm): only a share o may hide, and at most the GEMMs."""
    o, tp = 0.5, 2
    if case == "gemm-bound":                                 # tiny GEMMs hide little
        h, s, b = H, S, 1
    else:                                                    # big GEMMs: capped by the share
        h, s, b = 512, 256, 8
    inst = make_inst(tp, model={"hidden": h, "seq_len": s}, training={"tp_overlap": o},
                     global_batch=8)
    tm = terms_of(inst, make_plan(inst, tp=tp, b=b))
    m = 8 // b
    raw = 4 * (2 * (1 - 1 / tp) * (2 * b * s * h) / BWI + 2 * (tp - 1) * LAT_I)
    gemm = 3 * 2 * b * s * (12 * h * h) / tp / PK
    expect = max((1 - o) * raw, raw - gemm)
    assert (expect == raw - gemm) == (case == "gemm-bound")
    assert tm.layer["tp_comm"] == pytest.approx(expect, rel=REL)
    assert tm.time["tp_comm"] == pytest.approx(m * L * expect, rel=REL)


@pytest.mark.parametrize("case", ["window-bound", "fraction-bound"])
def test_dp_overlap_maximum(case):
    """dp_comm = max((1 - o) raw, raw - one micro-batch's stage time)."""
    o, dp = 0.5, 2
    if case == "window-bound":
        h, s, b = H, S, 1
    else:
        h, s, b = 512, 256, 8
    f = 4 * h
    inst = make_inst(dp, model={"hidden": h, "seq_len": s}, training={"dp_overlap": o},
                     global_batch=16)
    tm = terms_of(inst, make_plan(inst, dp=dp, b=b))
    params = L * (12 * h * h + 13 * h) + V * h + s * h + 2 * h
    raw = 2 * (1 / 2) * (2 * params) / BWI + 2 * LAT_I
    gemm, attn, elt = hand_layer_compute_flash(b, 1, h=h, s=s, f=f)
    window = L * (gemm + attn + elt)                         # t = 1: no TP comm
    expect = max((1 - o) * raw, raw - window)
    assert (expect == raw - window) == (case == "window-bound")
    assert tm.time["dp_comm"] == pytest.approx(expect, rel=REL)


# ------------------------------------------------------------------------------------------
# totals
# ------------------------------------------------------------------------------------------


PLANS = {
    "single": ({"gpus": 1}, {}),
    "tp2-pp2-dp2-vp2-sp-full": ({"gpus": 8}, {"tp": 2, "pp": 2, "dp": 2, "vp": 2, "sp": True,
                                              "recompute": "full", "distopt": True}),
    "cp2-dp2-spanning": ({"gpus": 4, "cluster": {"gpus_per_node": 2}},
                         {"cp": 2, "dp": 2, "cp_intra": 2, "dp_intra": 1}),
    "overlaps": ({"gpus": 4, "training": {"tp_overlap": 0.3, "dp_overlap": 0.7}},
                 {"tp": 2, "dp": 2, "recompute": "selective"}),
    "unfused-pp-inter": ({"gpus": 4, "training": {"flash_attention": False},
                          "cluster": {"gpus_per_node": 2}},
                         {"tp": 2, "pp": 2, "tp_intra": 2, "pp_intra": 1}),
}


@pytest.mark.parametrize("name", sorted(PLANS))
def test_breakdown_sums_to_step_time(name):
    inst_kw, plan_kw = PLANS[name]
    inst = make_inst(inst_kw["gpus"], **{k: v for k, v in inst_kw.items() if k != "gpus"})
    plan = make_plan(inst, **plan_kw)
    rep = evaluate(inst, plan)
    assert set(rep.breakdown_s) == set(TIME_TERMS)
    assert rep.step_time_s == pytest.approx(sum(rep.breakdown_s.values()), rel=1e-12)
    tm = terms_of(inst, plan)
    assert rep.step_time_s == pytest.approx(tm.step_time, rel=1e-12)
    for term, value in tm.time.items():
        assert rep.breakdown_s[term] == pytest.approx(float(value), rel=1e-12)
        assert value >= 0
    # memory: reported GiB of the most loaded stage
    worst = max(("first", "last"), key=tm.memory_total)
    assert rep.most_loaded_stage == worst
    assert rep.memory_gib["total"] == pytest.approx(tm.memory_total(worst) / 2**30, rel=1e-12)

"""The model against independent sources: published tables, the papers' closed forms, and
collectives worked out by hand from their algorithm.

Every expected value below is either a figure of a publication (``tests/data/papers.toml``, each
with paper, table and row) or a formula as the paper prints it (cited next to it), evaluated for
the paper's own case: GPT-3-style shapes (MHA, 4h MLP, learned positions, tied embeddings,
dropout), unfused attention where the paper predates fused attention. Where the model generalises
a paper (GQA, gated MLPs, flash attention, sequence parallelism with full recompute) the
generalisation is checked by a property that pins it to the paper's case (GQA with kv = heads is
MHA, a gated MLP of 2/3 the width costs what the plain one does).

Notation as in the papers: B global batch, b micro-batch, s sequence, l (or L) layers, h hidden,
a heads, V vocabulary, t tensor, p pipeline, d data, v interleaved stages, m micro-batches.
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
from pathlib import Path

import pytest

from planner.app.runs_file import load_runs, run_instance
from planner.model.collectives import all_to_all, allreduce, ring_step
from planner.model.evaluate import evaluate
from planner.model.instance import parse_instance
from planner.model.plan import Knobs, Plan, plan_from_spec, structural_violations
from planner.model.terms import step_terms
from planner.model.workload import Shape

PAPERS = tomllib.loads((Path(__file__).parent / "data" / "papers.toml").read_text())
TABLE1 = PAPERS["narayanan2021_table1"]
MFU = PAPERS["korthikanti2022_mfu"]
DISTOPT = PAPERS["megatron_distributed_optimizer"]
RUNS = load_runs()
RUN = {r["id"]: r for r in RUNS["runs"]}
GiB = 2**30


# ------------------------------------------------------------------------------------------
# builders
# ------------------------------------------------------------------------------------------


def instance(model: dict, gpus: int, *, training: dict | None = None,
             cluster: dict | None = None, global_batch: int = 64):
    return parse_instance({
        "model": model,
        "training": {"global_batch": global_batch, **(training or {})},
        "cluster": {"gpu": "a100-80gb", "gpus": gpus, **(cluster or {})},
    })


def no_latency(inst):
    """The same instance with zero per-step latency: only the bytes on the wire remain."""
    return dataclasses.replace(inst, hw=dataclasses.replace(inst.hw, lat_intra=0.0,
                                                            lat_inter=0.0))


def plan_of(inst, *, tp=1, pp=1, dp=1, vp=1, b=1, recompute="none", sp=False, distopt=False,
            tp_intra=None, pp_intra=None, dp_intra=None) -> Plan:
    """A plan; intra-node factors default to filling each node with tp, then dp, then pp."""
    room = min(inst.node_size, tp * pp * dp)
    tp_intra = math.gcd(tp, room) if tp_intra is None else tp_intra
    room //= tp_intra
    dp_intra = math.gcd(dp, room) if dp_intra is None else dp_intra
    room //= dp_intra
    pp_intra = math.gcd(pp, room) if pp_intra is None else pp_intra
    plan = Plan(tp=tp, pp=pp, dp=dp, vp=vp, micro_batch=b,
                global_batch=inst.spec.training.global_batch, gpus=tp * pp * dp,
                nodes=inst.nodes, recompute=recompute, sequence_parallel=sp,
                distributed_optimizer=distopt, tp_intra=tp_intra, pp_intra=pp_intra,
                dp_intra=dp_intra)
    assert structural_violations(inst, plan) == []
    return plan


def terms(inst, plan):
    return step_terms(inst, plan.grid.degrees(),
                      Knobs(plan.recompute, plan.sequence_parallel, plan.distributed_optimizer))


def table1_model(row) -> dict:
    return {"layers": row["layers"], "hidden": row["hidden"], "heads": row["heads"],
            "vocab": TABLE1["vocab"], "seq_len": TABLE1["seq_len"]}


# ------------------------------------------------------------------------------------------
# the papers' closed forms, as printed
# ------------------------------------------------------------------------------------------


def narayanan_eq2_params(L, h, V, s):
    """Narayanan et al. 2021 Eq. 2: P = 12 l h^2 (1 + 13/(12h) + (V + s)/(12 l h))."""
    return 12 * L * h**2 * (1 + 13 / (12 * h) + (V + s) / (12 * L * h))


def narayanan_eq3_flops(B, s, L, h, V):
    """Narayanan et al. 2021 Eq. 3 (with activation recomputation: one extra forward of the
    transformer layers): F = 96 B s l h^2 (1 + s/(6h) + V/(16 l h))."""
    return 96 * B * s * L * h**2 * (1 + s / (6 * h) + V / (16 * L * h))


def model_flops_closed_form(B, s, L, h, V):
    """Model FLOPs without recomputation, the MFU numerator of Korthikanti et al. 2022 and
    Megatron-LM: forward + backward = 3 x forward of Narayanan's count,
    72 B s l h^2 (1 + s/(6h) + V/(12 h l))."""
    return 72 * B * s * L * h**2 * (1 + s / (6 * h) + V / (12 * h * L))


# ------------------------------------------------------------------------------------------
# Narayanan et al. 2021, Table 1
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("row", TABLE1["rows"], ids=lambda r: r["run"])
def test_table1_transcription_is_self_consistent(row):
    """Aggregate PFLOP/s = TFLOP/s x GPUs and percent = TFLOP/s / 312, each within the table's
    rounding (TFLOP/s to 0.5, PFLOP/s to 0.05, percent to 0.5): catches a typo in papers.toml."""
    assert row["aggregate_pflops"] == pytest.approx(row["tflops_per_gpu"] * row["gpus"] / 1e3,
                                                    abs=0.5 * row["gpus"] / 1e3 + 0.05)
    pct = 100 * row["tflops_per_gpu"] / TABLE1["peak_tflops"]
    assert abs(pct - row["percent_of_peak"]) <= 0.5 + 100 * 0.5 / TABLE1["peak_tflops"]


@pytest.mark.parametrize("row", TABLE1["rows"], ids=lambda r: r["run"])
def test_parameter_count_is_narayanan_eq2_and_table1(row):
    """The model's parameter count is Eq. 2 (plus the final layer norm, 2h, which Eq. 2 leaves
    out) and rounds to Table 1's "Number of parameters (billion)"."""
    inst = instance(table1_model(row), gpus=8)
    sh = Shape.of(inst.model)
    eq2 = narayanan_eq2_params(row["layers"], row["hidden"], TABLE1["vocab"], TABLE1["seq_len"])
    assert sh.total_params == pytest.approx(eq2 + 2 * row["hidden"], rel=1e-12)
    assert sh.total_params / 1e9 == pytest.approx(row["params_billion"], abs=0.05)


@pytest.mark.parametrize("row", TABLE1["rows"], ids=lambda r: r["run"])
def test_model_flops_is_the_closed_form(row):
    """MFU's numerator is 72 B s l h^2 (1 + s/(6h) + V/(12hl)) for GPT shapes, exactly; and the
    report's TFLOP/s per GPU is that count over step time and GPUs."""
    inst = instance(table1_model(row), gpus=8)
    B, s, L, h, V = row["batch"], TABLE1["seq_len"], row["layers"], row["hidden"], TABLE1["vocab"]
    assert Shape.of(inst.model).model_flops(B) == pytest.approx(
        model_flops_closed_form(B, s, L, h, V), rel=1e-12)


@pytest.mark.parametrize("row", TABLE1["rows"], ids=lambda r: r["run"])
def test_table1_throughput_from_the_shipped_step_times(row):
    """The shipped run is Table 1's row (shape and plan), and its step time with the paper's
    Eq. 3 gives Table 1's TFLOP/s per GPU. The planner's own TFLOP/s at that step time (model
    FLOPs, no recompute) is Table 1's figure times the paper's ratio of the two counts."""
    run = RUN[row["run"]]
    model = RUNS["models"][run["model"]]
    assert (model["layers"], model["hidden"], model["heads"]) == (
        row["layers"], row["hidden"], row["heads"])
    assert (model["vocab"], model["seq_len"]) == (TABLE1["vocab"], TABLE1["seq_len"])
    plan = run["plan"]
    assert (plan["tp"], plan["pp"], plan["global_batch"]) == (row["tp"], row["pp"], row["batch"])
    assert plan["tp"] * plan["pp"] * plan["dp"] == row["gpus"]
    assert plan["recompute"] == "full"            # Table 1 runs recompute activations

    B, s, L, h, V = row["batch"], TABLE1["seq_len"], row["layers"], row["hidden"], TABLE1["vocab"]
    t_meas = run["measured_step_time_s"]
    # TFLOP/s were rounded to 1 (<= 0.37%), step times to 3-4 digits (<= 0.15%)
    tol = 0.5 / row["tflops_per_gpu"] + 0.005 / t_meas
    eq3 = narayanan_eq3_flops(B, s, L, h, V) / (t_meas * row["gpus"]) / 1e12
    assert eq3 == pytest.approx(row["tflops_per_gpu"], rel=tol)

    inst = run_instance(RUNS, run)
    rep = evaluate(inst, plan_from_spec(inst, inst.spec.plan))
    assert rep.plan.gpus == row["gpus"]
    at_measured = rep.model_tflops_per_gpu * rep.step_time_s / t_meas
    ratio = model_flops_closed_form(B, s, L, h, V) / narayanan_eq3_flops(B, s, L, h, V)
    assert at_measured == pytest.approx(row["tflops_per_gpu"] * ratio, rel=tol)
    # and MFU is that over the catalog's A100 peak, the 312 TFLOP/s of the paper
    assert inst.hw.peak == TABLE1["peak_tflops"] * 1e12
    assert rep.mfu == pytest.approx(rep.model_tflops_per_gpu / TABLE1["peak_tflops"], rel=1e-12)


# ------------------------------------------------------------------------------------------
# Korthikanti et al. 2022: model FLOPs utilisation
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("row", MFU["rows"], ids=lambda r: r["run"])
def test_korthikanti_mfu_from_the_shipped_step_times(row):
    """The planner's MFU at the paper's measured iteration time is the MFU the paper reports
    (rounded to 0.1 point; times to 0.01 s)."""
    run = RUN[row["run"]]
    inst = run_instance(RUNS, run)
    rep = evaluate(inst, plan_from_spec(inst, inst.spec.plan))
    t_meas = run["measured_step_time_s"]
    mfu_at_measured = rep.mfu * rep.step_time_s / t_meas
    tol = 0.05 / row["mfu_percent"] + 0.005 / t_meas
    assert 100 * mfu_at_measured == pytest.approx(row["mfu_percent"], rel=tol)
    assert inst.hw.peak == MFU["peak_tflops"] * 1e12


# ------------------------------------------------------------------------------------------
# Korthikanti et al. 2022: activation memory (Table 2, Sec. 4.2.3)
# ------------------------------------------------------------------------------------------

# GPT-3 175B (Brown et al. 2020 Table 2.1; Korthikanti et al. Table 3), t = 8, b = 1
L3, H3, A3, S3, T3, B3 = 96, 12288, 96, 2048, 8, 1

#: Korthikanti et al. 2022 Table 2, activation bytes per layer / (s b h)
KORTHIKANTI_TABLE2 = {
    ("none", False): 10 + 24 / T3 + 5 * A3 * S3 / (H3 * T3),     # tensor parallel (baseline)
    ("none", True): (34 + 5 * A3 * S3 / H3) / T3,                # tensor + sequence parallel
    ("selective", False): 10 + 24 / T3,                          # tensor parallel + selective
    ("selective", True): 34 / T3,                                # tensor + sequence + selective
    ("full", False): 2,                                          # full activation recompute
}


def gpt3_first_stage_activations(layers, recompute, sp, *, pp=1, vp=1, flash=False,
                                 dropout=True):
    inst = instance({"preset": "gpt3-175b", "layers": layers, "dropout": dropout},
                    gpus=T3 * pp, training={"flash_attention": flash})
    rep = evaluate(inst, plan_of(inst, tp=T3, pp=pp, vp=vp, b=B3, recompute=recompute, sp=sp))
    return rep.memory_by_stage_gib["first"]["activations"] * GiB


@pytest.mark.parametrize("recompute, sp", sorted(KORTHIKANTI_TABLE2))
def test_activation_bytes_per_layer_are_korthikanti_table2(recompute, sp):
    """Each layer added to a one-stage model adds exactly Table 2's bytes: 97 layers minus 96
    layers is one layer's stored activations, whatever the model keeps besides them (embedding
    mask, the layer being re-materialised)."""
    per_layer = (gpt3_first_stage_activations(L3 + 1, recompute, sp)
                 - gpt3_first_stage_activations(L3, recompute, sp))
    expect = KORTHIKANTI_TABLE2[(recompute, sp)] * S3 * B3 * H3
    assert per_layer == pytest.approx(expect, rel=1e-9)


def test_full_recompute_checkpoint_is_sharded_by_sequence_parallelism():
    """Table 2 gives full recomputation without sequence parallelism (2 sbh); with it, the
    checkpointed layer input is the sequence-parallel shard: 2 sbh / t (property)."""
    with_sp = (gpt3_first_stage_activations(L3 + 1, "full", True)
               - gpt3_first_stage_activations(L3, "full", True))
    assert with_sp == pytest.approx(2 * S3 * B3 * H3 / T3, rel=1e-9)


def test_a_model_without_dropout_stores_no_masks_korthikanti_sec_4_1():
    """Korthikanti et al. Sec. 4.1 itemises Table 2's dropout storage per layer: a 1-byte mask
    after attention and after the MLP (sbh each, replicated across tensor ranks without
    sequence parallelism), and in the attention core the dropout mask (a s^2 b) and its 16-bit
    output (2 a s^2 b), split over t. A model trained without dropout stores none of them."""
    def per_layer(dropout):
        return (gpt3_first_stage_activations(L3 + 1, "none", False, dropout=dropout)
                - gpt3_first_stage_activations(L3, "none", False, dropout=dropout))
    masks = 2 * S3 * B3 * H3 + 3 * A3 * S3 * S3 * B3 / T3
    assert per_layer(True) - per_layer(False) == pytest.approx(masks, rel=1e-9)


@pytest.mark.parametrize("vp", [1, 2, 3])
@pytest.mark.parametrize("recompute, sp", [("none", False), ("selective", True)])
def test_first_stage_holds_l_layers_korthikanti_sec_4_2_3(recompute, sp, vp):
    """Korthikanti et al. Sec. 4.2.3: the first stage of 1F1B stores p micro-batches of its
    L/p layers, L layers' worth whatever p; the interleaved schedule stores
    L (1 + (p - 1)/(p v)) layers' worth. Checked as the difference between 96 and 48 layers on
    p = 8 stages (m = 64 micro-batches)."""
    pp = 8
    grow = (gpt3_first_stage_activations(96, recompute, sp, pp=pp, vp=vp)
            - gpt3_first_stage_activations(48, recompute, sp, pp=pp, vp=vp))
    layers_worth = 48 * (1 + (pp - 1) / (pp * vp) if vp > 1 else 1)
    expect = layers_worth * KORTHIKANTI_TABLE2[(recompute, sp)] * S3 * B3 * H3
    assert grow == pytest.approx(expect, rel=1e-9)


# ------------------------------------------------------------------------------------------
# weights, gradients and optimizer states: Megatron-LM's bytes per parameter
# ------------------------------------------------------------------------------------------


def states_bytes_per_param(precision: str, dp: int, distopt: bool) -> float:
    """Weights + gradients + optimizer states per GPU over the parameter count, on dp GPUs
    holding the whole model (t = p = 1), for the Table 1 1.7B model, at the optimizer step:
    Megatron-LM's table counts the fp32 main gradients of 16-bit ones, which exist only
    there (the model's ``first_step`` row; with fp32 gradients there is no such row)."""
    row = TABLE1["rows"][0]
    inst = instance(table1_model(row), gpus=dp, training={"precision": precision},
                    global_batch=dp)
    memory = terms(inst, plan_of(inst, dp=dp, distopt=distopt)).memory
    mem = memory.get("first_step", memory["first"])
    states = mem["weights"] + mem["gradients"] + mem["optimizer_states"]
    return states / Shape.of(inst.model).total_params


def _distopt_rows(precision):
    return [r for r in DISTOPT["rows"] if r["precision"] == precision]


@pytest.mark.parametrize("dp", [1, 2, 8, 64])
@pytest.mark.parametrize("row", _distopt_rows("bf16"), ids=lambda r: r["row"])
def test_bf16_bytes_per_param_are_megatrons(row, dp):
    """bf16 params with fp32 gradients: 18 bytes per parameter, 6 + 12/d with the distributed
    optimizer (Megatron-LM's table)."""
    assert states_bytes_per_param("bf16", dp, False) == pytest.approx(row["non_distributed"],
                                                                     rel=1e-12)
    assert states_bytes_per_param("bf16", dp, True) == pytest.approx(
        row["distributed_fixed"] + row["distributed_sharded"] / dp, rel=1e-12)


@pytest.mark.parametrize("row", _distopt_rows("fp16"), ids=lambda r: r["row"])
def test_fp16_bytes_per_param_are_megatrons(row):
    """fp16 params with fp16 gradients (Megatron-LM's fp16 default reduces in 16 bits): 20
    bytes per parameter, 4 + 16/d distributed (the optimizer keeps fp32 main params and main
    gradients besides them)."""
    assert states_bytes_per_param("fp16", 1, False) == pytest.approx(row["non_distributed"],
                                                                    rel=1e-12)
    assert states_bytes_per_param("fp16", 8, True) == pytest.approx(
        row["distributed_fixed"] + row["distributed_sharded"] / 8, rel=1e-12)


# ------------------------------------------------------------------------------------------
# collectives, worked by hand
# ------------------------------------------------------------------------------------------
# Ring all-reduce (Patarasuk & Yuan 2009): a reduce-scatter then an all-gather, 2 (n - 1) steps,
# each GPU sends and receives 2 (n - 1)/n of the buffer; NCCL-tests doc/PERFORMANCE.md defines
# all-reduce bus bandwidth as algbw * 2 (n-1)/n and all-to-all's as algbw * (n-1)/n for the
# same reason. Each case below is the arithmetic for one concrete size.


def test_ring_allreduce_volume():
    # 4 GPUs, 1 GB each, 100 GB/s: each sends 2 * 3/4 * 1 GB = 1.5 GB -> 15 ms
    assert allreduce(1e9, 4, 1, 100e9, 10e9, 0, 0) == pytest.approx(0.015, rel=1e-12)
    # 2 GPUs: 1 GB each way -> 10 ms; a group of one sends nothing
    assert allreduce(1e9, 2, 1, 100e9, 10e9, 0, 0) == pytest.approx(0.010, rel=1e-12)
    assert allreduce(1e9, 1, 1, 100e9, 10e9, 3e-6, 8e-6) == 0


def test_ring_allreduce_latency_is_2_n_minus_1_steps():
    # 8 GPUs, a 1-byte message: 2 * 7 = 14 steps of 3 us -> 42 us (+ 1.75 B / 100 GB/s)
    assert allreduce(1.0, 8, 1, 100e9, 10e9, 3e-6, 8e-6) == pytest.approx(42e-6 + 1.75e-11,
                                                                         rel=1e-9)


@pytest.mark.parametrize("lat_i, lat_o", [(3e-6, 8e-6), (8e-6, 3e-6)])   # (either form)
@pytest.mark.parametrize("n_ranks, n_nodes", [(8, 1), (16, 2), (512, 64), (1536, 192), (64, 64)])
def test_ring_latency_is_nccls_own_model(n_ranks, n_nodes, lat_i, lat_o):
    """NCCL's tuning model (src/graph/tuning.cc since 2.7.3) gives a ring collective
    ``(nsteps - nInterSteps) * intraLat + nInterSteps * interLat``, with ``nsteps = 2 (nRanks -
    1)`` and ``nInterSteps = 2 (nNodes - 1)`` for an all-reduce, ``nRanks - 1`` and ``nNodes - 1``
    for a reduce-scatter or an all-gather (half of it here): its rings run through every GPU,
    so a group over many nodes pays an NVLink hop per GPU, not per node. A zero-byte message
    leaves the latency alone. (A network step faster than an NVLink one, which no catalog GPU
    has, takes the other way of writing it: the same number.)"""
    nsteps, n_inter_steps = 2 * (n_ranks - 1), (0 if n_nodes == 1 else 2 * (n_nodes - 1))
    nccl = (nsteps - n_inter_steps) * lat_i + n_inter_steps * lat_o
    ours = allreduce(0.0, n_ranks // n_nodes, n_nodes, 100e9, 10e9, lat_i, lat_o)
    assert ours == pytest.approx(nccl, rel=1e-12)
    # 512 GPUs on 64 nodes: 896 NVLink hops and 126 across nodes, 3.696 ms; one node's hops
    # alone (14) would be 1.05 ms
    if n_ranks == 512 and lat_i < lat_o:
        assert ours == pytest.approx(3.696e-3, rel=1e-12)


def test_two_level_allreduce_by_hand():
    """4 GPUs per node x 2 nodes, 1 GB per GPU, NVLink 100 GB/s, NIC 10 GB/s (hierarchical
    all-reduce as AMPeD Sec. III-C costs it): reduce-scatter in the node sends 3/4 GB (7.5 ms),
    the inter-node all-reduce of each GPU's 1/4 GB shard over a ring of 2 sends 1/4 GB
    (25 ms), the all-gather in the node 3/4 GB (7.5 ms): 40 ms."""
    assert allreduce(1e9, 4, 2, 100e9, 10e9, 0, 0) == pytest.approx(0.040, rel=1e-12)
    # the whole group across nodes, one GPU per node: 2 * 7/8 * 1 GB over the NIC = 175 ms
    assert allreduce(1e9, 1, 8, 100e9, 10e9, 0, 0) == pytest.approx(0.175, rel=1e-12)


def test_all_to_all_by_hand():
    # 8 GPUs in a node, each spreads 8 GB evenly: keeps 1 GB, sends 7 GB at 400 GB/s -> 17.5 ms
    assert all_to_all(8e9, 8, 1, 400e9, 50e9, 0, 0) == pytest.approx(0.0175, rel=1e-12)
    # 4 per node x 2 nodes: 3 GB to the 3 node peers over NVLink (7.5 ms), 4 GB to the other
    # node's 4 GPUs over a 50 GB/s NIC (80 ms), one after the other: 87.5 ms
    assert all_to_all(8e9, 4, 2, 400e9, 50e9, 0, 0) == pytest.approx(0.0875, rel=1e-12)


def test_point_to_point_by_hand():
    # 1 GB over a 25 GB/s NIC plus 8 us: 40.008 ms; inside a node at 300 GB/s plus 3 us
    assert ring_step(1e9, 2, 300e9, 25e9, 3e-6, 8e-6) == pytest.approx(0.040008, rel=1e-12)
    assert ring_step(1e9, 1, 300e9, 25e9, 3e-6, 8e-6) == pytest.approx(1e9 / 300e9 + 3e-6,
                                                                      rel=1e-12)


# ------------------------------------------------------------------------------------------
# communication of a training step, worked by hand from the papers' accounting
# ------------------------------------------------------------------------------------------

NVLINK = {"intra_node_bandwidth_GBps": 300.0, "inter_node_bandwidth_GBps": 25.0}


@pytest.mark.parametrize("recompute, sp, n_allreduce", [
    ("none", False, 4), ("selective", False, 4), ("none", True, 4), ("full", False, 6)])
def test_tensor_parallel_allreduces_of_gpt3_by_hand(recompute, sp, n_allreduce):
    """Megatron tensor parallelism (Shoeybi et al. 2019 Sec. 3, Fig. 4; Korthikanti et al. 2022
    Sec. 4.2.2): 2 all-reduces of the b s h activations in the forward pass of a layer and 2 in
    the backward; sequence parallelism replaces each by a reduce-scatter + all-gather of the same
    volume; full recompute reruns the forward, its 2 all-reduces included. GPT-3 175B, t = 8 in
    a node at 300 GB/s, b = 1, one micro-batch: each all-reduce moves
    2 * 7/8 * (2 * 2048 * 12288 B = 50,331,648 B) = 88,080,384 B -> 0.29360128 ms."""
    inst = no_latency(instance({"preset": "gpt3-175b"}, gpus=8, cluster=NVLINK, global_batch=1,
                               training={"async_tensor_model_parallel_allreduce": False}))
    tm = terms(inst, plan_of(inst, tp=8, recompute=recompute, sp=sp))
    per_allreduce = 0.29360128e-3
    assert tm.time["tp_comm"] == pytest.approx(96 * n_allreduce * per_allreduce, rel=1e-12)


@pytest.mark.parametrize("vp", [1, 2])
def test_pipeline_sends_by_hand(vp):
    """Narayanan et al. 2021 Sec. 2.2 and 4.1: each micro-batch crosses every stage boundary
    forward (activations) and backward (gradients): p v - 1 boundaries with v model chunks per
    stage, each send b s h / t per GPU with the scatter/gather optimisation. p = 4 stages one
    per node, t = 2 in a node, m = 8, h = 1024, s = 2048: a send is 2 * 2048 * 1024 / 2 =
    2,097,152 B over a 25 GB/s NIC = 83.88608 us. Per GPU (averaged over the p stages):
    2 m (p v - 1) / p sends = 12 (v = 1) or 28 (v = 2)."""
    model = {"layers": 8, "hidden": 1024, "heads": 8, "vocab": 51200, "seq_len": 2048}
    inst = no_latency(instance(model, gpus=8, cluster={**NVLINK, "gpus_per_node": 2},
                               global_batch=8))
    tm = terms(inst, plan_of(inst, tp=2, pp=4, vp=vp, tp_intra=2, pp_intra=1))
    sends = {1: 12, 2: 28}[vp]
    assert tm.time["pp_comm"] == pytest.approx(sends * 83.88608e-6, rel=1e-12)


@pytest.mark.parametrize("reduce", ["bf16", "fp32"])
@pytest.mark.parametrize("distopt", [False, True])
def test_data_parallel_gradient_allreduce_by_hand(distopt, reduce):
    """Gradients of every parameter (Narayanan Eq. 2 for the 1.7B model: 1,652,226,048 + 2h for
    the final norm) all-reduced over d = 8 GPUs of a node at 300 GB/s: 2 * 7/8 * w bytes per
    parameter, w = 2 (16-bit reduction) or 4 (fp32, Megatron-LM's bf16 default). ZeRO
    (Rajbhandari et al. 2020 Sec. 7.2): sharding the optimizer states (reduce-scatter of the
    gradients + all-gather of the 16-bit parameters) moves 7/8 (w + 2) bytes per parameter: the
    all-reduce's bytes in 16 bits, 0.75x the fp32 all-reduce."""
    row = TABLE1["rows"][0]
    inst = no_latency(instance(table1_model(row), gpus=8, cluster=NVLINK, global_batch=8,
                               training={"grad_reduce_dtype": reduce}))
    params = narayanan_eq2_params(24, 2304, 51200, 2048)
    assert params == pytest.approx(1_652_226_048, rel=1e-12)
    tm = terms(inst, plan_of(inst, dp=8, distopt=distopt))
    w = {"bf16": 2, "fp32": 4}[reduce]
    per_param = 7 / 8 * (w + 2) if distopt else 2 * 7 / 8 * w
    assert tm.time["dp_comm"] == pytest.approx(per_param * (params + 2 * 2304) / 300e9,
                                               rel=1e-12)


# ------------------------------------------------------------------------------------------
# the pipeline bubble and recomputation: Narayanan et al. 2021
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("pp, vp", [(2, 1), (4, 1), (4, 2), (8, 4)])
def test_bubble_fraction_is_narayanan(pp, vp):
    """Sec. 2.2.1: the 1F1B bubble is (p - 1)/m of the ideal step time; Sec. 2.2.2: the
    interleaved schedule divides it by v. t = 1 (no tensor communication), a tiny vocabulary
    so the output layer (on the last stage only) weighs < 0.05% (the flat GEMM model: the size
    curve would slow that thin output GEMM down, which is not what this checks)."""
    model = {"layers": 32, "hidden": 4096, "heads": 32, "vocab": 128, "seq_len": 2048}
    inst = instance(model, gpus=pp, global_batch=32,
                    cluster={"gemm_knee_tokens": 0, "gemm_knee_width": 0})
    tm = terms(inst, plan_of(inst, pp=pp, vp=vp))
    m = 32
    assert tm.time["bubble"] / tm.time["compute"] == pytest.approx((pp - 1) / (vp * m), rel=1e-3)


def test_full_recompute_costs_one_more_forward_narayanan_eq3():
    """Full recomputation adds one forward of every transformer layer (Sec. 3.5), so its time
    over the time without grows as Eq. 3 (96 ... V/(16lh)) over the model count (72 ...
    V/(12lh)). GPT-3 175B, unfused attention as the paper, t = 8, p = 1."""
    inst = instance({"preset": "gpt3-175b", "dropout": False}, gpus=8,
                    training={"flash_attention": False}, global_batch=1)
    full = terms(inst, plan_of(inst, tp=8, recompute="full")).time["compute"]
    none = terms(inst, plan_of(inst, tp=8)).time["compute"]
    B, s, L, h, V = 1, 2048, 96, 12288, 51200
    ratio = narayanan_eq3_flops(B, s, L, h, V) / model_flops_closed_form(B, s, L, h, V)
    assert full / none == pytest.approx(ratio, rel=1e-3)


# ------------------------------------------------------------------------------------------
# generalisations pinned to the papers' case
# ------------------------------------------------------------------------------------------


def test_gqa_with_kv_equal_heads_is_mha():
    base = {"preset": "gpt3-175b", "layers": 8}
    mha = instance(base, gpus=8, training={"flash_attention": False})
    gqa = instance({**base, "kv_heads": 96}, gpus=8, training={"flash_attention": False})
    for recompute in ("none", "selective", "full"):
        a = terms(mha, plan_of(mha, tp=8, recompute=recompute, sp=True))
        b = terms(gqa, plan_of(gqa, tp=8, recompute=recompute, sp=True))
        assert a.time == b.time and a.memory == b.memory


def test_fewer_kv_heads_shrink_qkv_and_kv_but_not_the_attention_core():
    """GQA (Ainslie et al. 2023): K and V projections of k heads instead of a; the attention
    core still runs a query heads."""
    base = {"preset": "gpt3-175b", "layers": 8}
    mha = instance(base, gpus=8)
    gqa = instance({**base, "kv_heads": 8}, gpus=8)
    a, b = terms(mha, plan_of(mha, tp=8)), terms(gqa, plan_of(gqa, tp=8))
    assert b.layer["attention"] == a.layer["attention"]
    assert b.layer["gemm"] < a.layer["gemm"]
    assert b.memory["first"]["weights"] < a.memory["first"]["weights"]
    assert b.memory["first"]["activations"] < a.memory["first"]["activations"]
    sa, sb = Shape.of(mha.model), Shape.of(gqa.model)
    # the QKV GEMM: h (h + 2 h k / a) weights instead of 3 h^2, i.e. 2 h^2 (1 - k/a) fewer
    h = 12288
    assert sa.layer_params - sb.layer_params == pytest.approx(
        2 * h * h * (1 - 8 / 96) + 2 * h * (1 - 8 / 96), rel=1e-12)


def test_gated_mlp_of_two_thirds_width_costs_the_plain_mlp():
    """Shazeer 2020 ("GLU Variants Improve Transformer", Sec. 2): a three-matrix GLU MLP of
    width 2f/3 has the parameters and FLOPs of the two-matrix MLP of width f."""
    base = {"layers": 12, "hidden": 768, "heads": 12, "vocab": 51200, "seq_len": 2048}
    plain = Shape.of(instance({**base, "ffn_hidden": 3072}, gpus=1).model)
    glu = Shape.of(instance({**base, "ffn_hidden": 2048, "gated_mlp": True}, gpus=1).model)
    assert glu.model_flops(8) == plain.model_flops(8)
    # matrices equal; only fc1's bias differs: f wide plain, 2f gated (Megatron-Core's gated
    # fc1 is one h x 2f layer with one bias)
    assert plain.layer_params - glu.layer_params == 3072 - 2 * 2048

"""Context parallelism's exchange (``[training] cp_comm_type``, Megatron-Core's name): the
p2p ring of key / value blocks, Transformer Engine's Ulysses-style all-to-alls (``a2a``) or
its key / value all-gather (``all_gather``), their cost, the heads rule ``a2a`` brings, the
sliding window the last two admit, the backends' agreement and the exports.

The properties checked come from outside the code: the DeepSpeed-Ulysses paper (arXiv
2309.14509, Sec. 3) puts a GPU's all-to-all bytes at the sequence over the context degree,
falling as the degree grows, where a ring moves ``c - 1`` blocks; Transformer Engine's
``AttnFuncWithCPAndQKVOA2A`` asserts "cp_comm_type='a2a' requires num_heads % cp_size == 0";
its p2p ring refuses a sliding window, its a2a runs one; ``AttnFuncWithCPAndKVAllGather``
gathers [c s / c, b, kv heads / t, d] keys and values before the core ("KV all-gather between
CP ranks is exposed") and again in the backward, where it reduce-scatters their gradients.
"""

from __future__ import annotations

import pytest

from planner.model.errors import InputError
from planner.model.evaluate import evaluate
from planner.model.instance import parse_instance
from planner.model.plan import plan_from_spec
from tests.test_emit import emitted, parse_megatron, parse_yaml

#: a Llama-3-8B-shaped model at 32K tokens (32 heads, 8 key / value heads)
LLAMA = {"layers": 32, "hidden": 4096, "heads": 32, "kv_heads": 8, "ffn_hidden": 14336,
         "gated_mlp": True, "vocab": 128256, "seq_len": 32768, "tied_embeddings": False,
         "position_embedding": "rope", "dropout": False, "normalization": "rmsnorm",
         "linear_bias": False}


def _doc(plan: dict | None = None, model: dict | None = None, gpus: int = 8,
         **training) -> dict:
    doc = {"model": model or LLAMA,
           "training": {"global_batch": 8, "precision": "bf16", **training},
           "cluster": {"gpu": "h100-sxm", "gpus": gpus}}
    if plan is not None:
        doc["plan"] = plan
    return doc


def _report(plan: dict, **kw):
    inst = parse_instance(_doc(plan, **kw))
    return evaluate(inst, plan_from_spec(inst, inst.spec.plan), spec=inst.spec.plan)


def _per_layer(cp: int, kind: str, tp: int = 1, recompute: str = "full") -> float:
    """The context-parallel seconds of one layer and micro-batch, one node, pp = 1, at 1M
    tokens (where the collectives' latency is about 1% of their time)."""
    plan = {"tp": tp, "pp": 1, "dp": 8 // (cp * tp), "cp": cp, "micro_batch": 1,
            "recompute": recompute}
    rep = _report(plan, model={**LLAMA, "seq_len": 2**20}, cp_comm_type=kind)
    return rep.breakdown_s["cp_comm"] / (rep.plan.micro_batches * LLAMA["layers"])


def test_ulysses_moves_the_bytes_of_transformer_engines_tensors():
    """Transformer Engine's a2a exchanges a rank's [s / c, b, heads / t, d] queries, keys,
    values and output, 16-bit, forward, and their gradients backward; a GPU keeps 1 / c of
    each and sends the rest over NVLink here. Counted from those shapes (Llama-3-8B: 32 query
    heads and 8 key / value heads of 128), against the catalog's NVLink bandwidth; a full
    recompute re-runs the forward's (3 : 2), so does a selective one of the core (its call
    holds the exchange), and tensor parallelism 2 halves the heads."""
    inst = parse_instance(_doc(model={**LLAMA, "seq_len": 2**20}))
    s, c = 2**20, 4
    widths = 32 * 128 + 8 * 128 + 8 * 128 + 32 * 128      # q, k, v, output
    sent = 2 * (s // c) * widths * (c - 1) / c             # bytes per direction
    none = _per_layer(c, "a2a", recompute="none")
    assert none == pytest.approx(2 * sent / inst.hw.bw_intra, rel=0.01)
    assert _per_layer(c, "a2a", recompute="full") / none == pytest.approx(1.5, rel=1e-9)
    assert _per_layer(c, "a2a", recompute="selective") / none == pytest.approx(1.5, rel=1e-9)
    assert _per_layer(c, "a2a", tp=2, recompute="none") / none == pytest.approx(0.5, rel=0.01)


def test_ulysses_bytes_per_gpu_fall_as_the_context_grows_wider():
    """A GPU's all-to-all sends (c - 1) / c of its s / c tokens' tensors: from cp 2 to 4 to 8
    its time per layer falls to 3/4 and 7/16."""
    a2a = {c: _per_layer(c, "a2a") for c in (2, 4, 8)}
    assert a2a[4] / a2a[2] == pytest.approx(0.75, rel=0.01)
    # (at cp 8 the seven peers' message latencies add about 2.5%)
    assert a2a[8] / a2a[2] == pytest.approx(7 / 16, rel=0.03)
    # and they are all exposed: more than the ring's, which hides its hops behind the core
    assert all(a2a[c] > _per_layer(c, "p2p") for c in (2, 4, 8))


def test_ulysses_needs_the_heads_of_a_tensor_rank_to_split_over_the_context_ranks():
    """8 key / value heads: tp 1 x cp 8 splits them, tp 2 x cp 8 cannot (as Transformer
    Engine asserts), and the ring has no such rule."""
    ok = {"tp": 1, "pp": 1, "dp": 1, "cp": 8, "micro_batch": 1, "recompute": "full"}
    assert not _report(ok, cp_comm_type="a2a").violations
    bad = {"tp": 2, "pp": 1, "dp": 1, "cp": 8, "micro_batch": 1, "recompute": "full"}
    said = _report(bad, gpus=16, cp_comm_type="a2a").violations
    assert any("tp*cp = 2*8 must divide heads=32 and kv_heads=8" in v for v in said)
    assert not _report(bad, gpus=16).violations


def test_a_windowed_model_splits_its_sequence_only_over_ulysses():
    """A sliding window refuses the ring (rule window_cp) but runs over a2a; at 128K tokens on
    one node the search then splits the sequence, as it cannot with the ring."""
    from formulations.solve import solve
    model = {**LLAMA, "seq_len": 131072, "window_size": 4095}
    plans = {}
    for kind in ("p2p", "a2a"):
        doc = _doc(model=model, global_batch=1, cp_comm_type=kind)
        doc["constraints"] = {"max_cp": 8}
        res = solve(parse_instance(doc), solver="enumerate")
        plans[kind] = res.report.plan if res.report is not None else None
    assert plans["a2a"] is not None and plans["a2a"].cp > 1
    assert plans["p2p"] is None or plans["p2p"].cp == 1


@pytest.mark.parametrize("window", [None, 127])
def test_backends_agree_with_ulysses(window):
    """CP-SAT, HiGHS and the enumerator find the same optimum and plan with the a2a exchange
    and context parallelism free, with and without a sliding window."""
    from tests.test_solvers import _agree
    model = {**LLAMA, "layers": 8, "seq_len": 65536,
             **({"window_size": window, "window_attn_skip_freq": 2} if window else {})}
    _agree({"model": model, "training": {"global_batch": 16, "precision": "bf16",
                                         "cp_comm_type": "a2a"},
            "cluster": {"gpu": "h100-sxm", "nodes": 2},
            "constraints": {"max_cp": 8, "max_recompute_layers": 0, "optimizer_offload": False}})


def test_the_exports_carry_the_exchange():
    """Megatron-LM ``--cp-comm-type a2a``; NeMo ``cp_comm_type`` (p2p written too, so a
    recipe's own a2a does not survive); torchtitan says it cannot express it."""
    plan = {"tp": 1, "pp": 1, "dp": 4, "cp": 2, "micro_batch": 1, "recompute": "full"}
    doc = _doc(plan, cp_comm_type="a2a")
    assert parse_megatron(emitted(doc, plan, "megatron"))["--cp-comm-type"] == "a2a"
    assert parse_yaml(emitted(doc, plan, "nemo"))["model.config.cp_comm_type"] == "a2a"
    ring = _doc(plan)
    assert "--cp-comm-type" not in parse_megatron(emitted(ring, plan, "megatron"))
    assert parse_yaml(emitted(ring, plan, "nemo"))["model.config.cp_comm_type"] == "p2p"
    fsdp = {**plan, "dp_sharding": "optim_grads_params"}
    said = emitted(_doc(fsdp, cp_comm_type="a2a"), fsdp, "torchtitan").replace("\n#   ", " ")
    assert "cp_comm_type \"a2a\" (Transformer Engine's Ulysses exchange): cannot express" in said


@pytest.mark.parametrize("kind", ["a2a", "all_gather"])
@pytest.mark.parametrize("framework", ["torchtitan", "deepspeed"])
def test_ulysses_is_refused_where_the_framework_runs_its_own_exchange(framework, kind):
    doc = _doc(cp_comm_type=kind)
    doc["constraints"] = {"framework": framework}
    with pytest.raises(InputError, match=f"training.cp_comm_type: \"{kind}\" is Megatron-Core"):
        parse_instance(doc)


def test_all_gather_moves_the_bytes_of_transformer_engines_tensors():
    """Transformer Engine's all_gather exchange gathers the whole sequence's keys and values
    of the tensor rank's 8 key / value heads of 128 (16-bit) in each forward and again in the
    backward, where it reduce-scatters their gradients, the same bytes: a GPU receives (or
    sends) (c - 1) / c of [s, 8 x 128] twice per tensor each time, over NVLink here. Without
    recompute that is 3 collectives a layer; full recompute or the core's selective recompute
    gathers once more (4 : 3); its bytes per GPU grow with c, where Ulysses' fall, and it hides
    nothing, so it costs more than the ring."""
    inst = parse_instance(_doc(model={**LLAMA, "seq_len": 2**20}))
    s, c = 2**20, 4
    gathered = 2 * s * (8 * 128 + 8 * 128)                  # K and V of the whole sequence
    none = _per_layer(c, "all_gather", recompute="none")
    assert none == pytest.approx(3 * gathered * (c - 1) / c / inst.hw.bw_intra, rel=0.01)
    for mode in ("full", "selective"):
        assert _per_layer(c, "all_gather", recompute=mode) / none == pytest.approx(4 / 3,
                                                                                  rel=1e-9)
    assert _per_layer(c, "all_gather", tp=2, recompute="none") / none == pytest.approx(
        0.5, rel=0.01)
    ag = {k: _per_layer(k, "all_gather") for k in (2, 4, 8)}
    assert ag[4] / ag[2] == pytest.approx((3 / 4) / (1 / 2), rel=0.01)
    assert all(ag[k] > _per_layer(k, "p2p") for k in (2, 4, 8))


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_all_gather_holds_the_gathered_keys_and_values_while_the_core_runs(recompute):
    """The backward of the layer whose core runs holds, 16-bit, the gathered keys and values
    (k_ag, v_ag: K and V of the whole sequence), their whole-sequence gradients (dk, dv), the
    two steps' gradients, kept in lists until it returns (dk_per_step, dv_per_step: about the
    sequence again under the causal mask) and the reordered copy index_select makes of dk or
    dv beside its source: 1 + 1 + 1 + 1/2 times [s, 8 x 128] twice, one layer's worth more
    than the ring, and nothing without context parallelism."""
    plan = {"tp": 1, "pp": 1, "dp": 2, "cp": 4, "micro_batch": 1, "recompute": recompute}
    acts = {k: _report(plan, model={**LLAMA, "layers": 4}, cp_comm_type=k
                       ).memory_gib["activations"] for k in ("p2p", "all_gather")}
    k_and_v = 2 * 32768 * (8 * 128) * 2                    # [s, 8 x 128], K and V, 16-bit
    assert acts["all_gather"] - acts["p2p"] == pytest.approx(3.5 * k_and_v / 2**30, rel=1e-9)
    one = {**plan, "dp": 8, "cp": 1}
    assert _report(one, model={**LLAMA, "layers": 4}, cp_comm_type="all_gather").memory_gib \
        == _report(one, model={**LLAMA, "layers": 4}).memory_gib


def test_all_gather_across_nodes_and_of_latent_attention():
    """Across two nodes the gather's other node's half crosses the NIC (cp 16 on 2 x 8:
    slower than cp 8 inside one node, where Ulysses' bytes would fall); multi-head latent
    attention gathers its own key and value widths, 128 heads x (128 + 64) and x 128 for a
    DeepSeek-V3 shape, not the hidden size."""
    inst = parse_instance(_doc(model={**LLAMA, "seq_len": 2**20}, gpus=16))
    s = 2**20
    one = _per_layer(8, "all_gather", recompute="none")
    plan = {"tp": 1, "pp": 1, "dp": 1, "cp": 16, "micro_batch": 1, "recompute": "none"}
    rep = _report(plan, model={**LLAMA, "seq_len": s}, gpus=16, cp_comm_type="all_gather")
    two = rep.breakdown_s["cp_comm"] / (rep.plan.micro_batches * LLAMA["layers"])
    k_and_v = 2 * s * 2 * 8 * 128
    # per collective: (8 - 1) / 8 of it inside the node, then the other node's half over the NIC
    expect = 3 * (k_and_v * 7 / 8 / inst.hw.bw_intra + k_and_v / 8 / 2 / inst.hw.bw_inter)
    assert two == pytest.approx(expect, rel=0.02) and two > one
    mla = {**{k: v for k, v in LLAMA.items() if k != "kv_heads"}, "layers": 4,
           "hidden": 7168, "heads": 128, "seq_len": 2**20, "kv_lora_rank": 512,
           "q_lora_rank": 1536, "qk_head_dim": 128, "qk_pos_emb_head_dim": 64,
           "v_head_dim": 128}
    rep = _report({"tp": 1, "pp": 1, "dp": 1, "cp": 8, "micro_batch": 1, "recompute": "none"},
                  model=mla, cp_comm_type="all_gather")
    per = rep.breakdown_s["cp_comm"] / (rep.plan.micro_batches * 4)
    widths = 128 * (128 + 64) + 128 * 128
    assert per == pytest.approx(3 * 2 * s * widths * 7 / 8 / inst.hw.bw_intra, rel=0.02)


def test_a_windowed_model_splits_its_sequence_over_the_all_gather():
    """Transformer Engine runs a sliding window with the all_gather exchange, as with a2a:
    the window_cp rule leaves it free."""
    model = {**LLAMA, "layers": 8, "seq_len": 131072, "window_size": 4095}
    plan = {"tp": 1, "pp": 1, "dp": 1, "cp": 8, "micro_batch": 1, "recompute": "full"}
    assert not _report(plan, model=model, global_batch=1, cp_comm_type="all_gather").violations
    said = _report(plan, model=model, global_batch=1).violations
    assert any('"a2a" or "all_gather"' in v for v in said)


@pytest.mark.parametrize("kind, splits", [("p2p", False), ("all_gather", False),
                                          ("a2a", True)])
def test_an_attention_sink_splits_its_sequence_only_over_ulysses(kind, splits):
    """An attention sink (gpt-oss's learnable softmax offset, softmax_type) runs under context
    parallelism only with the a2a exchange (Transformer Engine asserts "Context parallelism
    only supports softmax_type=... with cp_comm_type = 'a2a'"): the rule sink_cp."""
    plan = {"tp": 1, "pp": 1, "dp": 1, "cp": 8, "micro_batch": 1, "recompute": "full"}
    model = {**LLAMA, "layers": 8, "softmax_type": "learnable"}
    said = _report(plan, model=model, global_batch=1, cp_comm_type=kind).violations
    assert (not any("attention sink" in v for v in said)) is splits
    assert not _report(plan, model={**LLAMA, "layers": 8}, global_batch=1,
                       cp_comm_type=kind).violations


def test_the_sink_is_exported():
    plan = {"tp": 1, "pp": 1, "dp": 8, "micro_batch": 1, "recompute": "full"}
    doc = _doc(plan, model={**LLAMA, "layers": 8, "softmax_type": "learnable"})
    assert parse_megatron(emitted(doc, plan, "megatron"))["--softmax-type"] == "learnable"
    assert parse_yaml(emitted(doc, plan, "nemo"))["model.config.softmax_type"] == "learnable"
    assert "--softmax-type" not in parse_megatron(emitted(_doc(plan), plan, "megatron"))


def test_backends_agree_with_the_all_gather():
    from tests.test_solvers import _agree
    model = {**LLAMA, "layers": 8, "seq_len": 65536, "window_size": 127,
             "window_attn_skip_freq": 2}
    _agree({"model": model, "training": {"global_batch": 16, "precision": "bf16",
                                         "cp_comm_type": "all_gather"},
            "cluster": {"gpu": "h100-sxm", "nodes": 2},
            "constraints": {"max_cp": 8, "max_recompute_layers": 0, "optimizer_offload": False}})


def test_the_exports_carry_the_all_gather():
    plan = {"tp": 1, "pp": 1, "dp": 4, "cp": 2, "micro_batch": 1, "recompute": "full"}
    doc = _doc(plan, cp_comm_type="all_gather")
    assert parse_megatron(emitted(doc, plan, "megatron"))["--cp-comm-type"] == "all_gather"
    assert parse_yaml(emitted(doc, plan, "nemo"))["model.config.cp_comm_type"] == "all_gather"
    fsdp = {**plan, "dp_sharding": "optim_grads_params"}
    said = emitted(_doc(fsdp, cp_comm_type="all_gather"), fsdp, "torchtitan").replace(
        "\n#   ", " ")
    assert ("cp_comm_type \"all_gather\" (Transformer Engine's key / value all-gather): "
            "cannot express") in said

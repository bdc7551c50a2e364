"""Multi-head latent attention (``[model] kv_lora_rank`` and its widths: DeepSeek-V2 / V3).

Checked against figures this project does not compute: the parameter counts the DeepSeek
reports publish, and Megatron-LM's own FLOP count of an MLA layer
(``num_floating_point_operations``, megatron/training/training.py, its
``multi_latent_attention`` branch); and against the model's own multi-head attention where the
two must agree (the same gathered width, the same tensor-parallel time)."""

from __future__ import annotations

import json

import pytest

from planner.model.errors import InputError
from planner.model.evaluate import evaluate
from planner.model.instance import parse_instance
from planner.model.plan import plan_from_spec
from planner.model.terms import step_terms
from planner.model.workload import Shape

#: DeepSeek-V2 (arXiv 2405.04434, Sec. 3.1.1 and its released config.json): 60 layers, the
#: first dense, 160 routed experts of 1536 (top-6) and 2 shared; MLA with queries compressed to
#: 1536 and keys / values to 512, 128 heads of 128 + 64 (RoPE) and values of 128; RMSNorm and no
#: linear biases
DEEPSEEK_V2 = {"layers": 60, "hidden": 5120, "heads": 128, "ffn_hidden": 12288, "gated_mlp": True,
               "vocab": 102400, "seq_len": 4096, "tied_embeddings": False,
               "position_embedding": "rope", "dropout": False,
               "normalization": "rmsnorm", "linear_bias": False,
               "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_head_dim": 128,
               "qk_pos_emb_head_dim": 64, "v_head_dim": 128,
               "experts": 160, "top_k": 6, "moe_ffn_hidden": 1536, "shared_experts": 2,
               "first_dense_layers": 1}
#: DeepSeek-V2-Lite (the same report, Appendix B): 27 layers, 16 heads, queries not compressed
DEEPSEEK_V2_LITE = {**{k: v for k, v in DEEPSEEK_V2.items() if k != "q_lora_rank"},
                    "layers": 27, "hidden": 2048, "heads": 16, "ffn_hidden": 10944,
                    "experts": 64, "moe_ffn_hidden": 1408}


def _inst(model, plan=None, precision="bf16", gpus=8, **training):
    doc = {"model": model, "training": {"global_batch": 64, "precision": precision, **training},
           "cluster": {"gpu": "h100-sxm", "gpus": gpus}}
    if plan:
        doc["plan"] = plan
    return parse_instance(doc)


def _shape(model):
    return Shape.of(_inst(model).model)


@pytest.mark.parametrize("model, total_b, active_b", [
    # DeepSeek-V3 technical report, abstract (the main model: its prediction module apart,
    # tests/test_mtp.py)
    ({"preset": "deepseek-v3", "mtp_layers": 0}, 671, 37),
    (DEEPSEEK_V2, 236, 21),                 # DeepSeek-V2 report, abstract
    (DEEPSEEK_V2_LITE, 15.7, 2.4),          # DeepSeek-V2 report, Appendix B
])
def test_parameter_counts_are_the_reports(model, total_b, active_b):
    """Total and activated parameters (the experts a token meets, without the input embedding,
    which is a lookup) within the reports' rounding. The multi-head stand-in this replaced
    counted DeepSeek-V3's attention 10% heavier (205M against 187M weights a layer) and
    V2-Lite's 22% heavier, activated 37.7B and 2.53B."""
    sh = _shape(model)
    idle = sh.n_moe * (sh.experts - sh.top_k) * sh.expert_params
    active = sh.total_params - idle - sh.V * sh.h
    assert sh.total_params / 1e9 == pytest.approx(total_b, rel=0.005)
    assert active / 1e9 == pytest.approx(active_b, rel=0.025)


def megatron_mla_linear(m):
    """Megatron-LM's token-linear MLA term per token and layer over 6 (forward + backward, 2
    FLOPs a multiply-add): the q lora (or direct query), kv lora, RoPE key and output
    projections, with the norms' ``+ 1`` per compressed element."""
    h, a = m["hidden"], m["heads"]
    qk = m["qk_head_dim"] + m["qk_pos_emb_head_dim"]
    q = (h * a * qk if m.get("q_lora_rank") is None
         else m["q_lora_rank"] * (h + a * qk + 1))
    kv = m["kv_lora_rank"] * (h + a * (m["qk_head_dim"] + m["v_head_dim"]) + 1)
    return q + kv + h * m["qk_pos_emb_head_dim"] + a * m["v_head_dim"] * h


@pytest.mark.parametrize("model", [DEEPSEEK_V2, DEEPSEEK_V2_LITE])
def test_attention_gemm_flops_are_megatrons(model):
    """The attention's GEMM FLOPs of a layer (a dense layer's GEMMs less its MLP) are
    Megatron-LM's MLA count less the norms it counts beside them."""
    sh = _shape(model)
    attention = sh.gemm_flops(1) - sh.mlp_flops(1, sh.f)
    norms = model["kv_lora_rank"] + (model.get("q_lora_rank") or 0)
    assert attention / (2 * sh.s) == megatron_mla_linear(model) - norms


def test_attention_core_flops_are_megatrons_unhalved():
    """``QK^T`` over heads of 128 + 64 and ``AV`` over values of 128: Megatron-LM's core term
    (forward and backward, halved for the causal mask) doubled, since this model counts the
    core without the causal half (as Narayanan et al. Eq. 3)."""
    sh = _shape({"preset": "deepseek-v3"})
    a, s = 128, 4096
    megatron_core = 3 * 2 * (a * (128 + 64) / 2 + a * 128 / 2) * s * s
    assert 3 * sh.attention_flops(1) == 2 * megatron_core


def test_mla_keys_come_together_and_exclude_key_value_heads():
    for partial in ({"kv_lora_rank": 512}, {"q_lora_rank": 1536, "qk_head_dim": 128}):
        model = {k: v for k, v in DEEPSEEK_V2.items()
                 if k not in ("q_lora_rank", "kv_lora_rank", "qk_head_dim",
                              "qk_pos_emb_head_dim", "v_head_dim")}
        with pytest.raises(InputError) as exc:
            _inst({**model, **partial})
        assert "multi-head latent attention" in str(exc.value)
        assert "qk_pos_emb_head_dim" in str(exc.value) and "v_head_dim" in str(exc.value)
    for extra in ({"kv_heads": 8}, {"head_dim": 128}):
        with pytest.raises(InputError) as exc:
            _inst({**DEEPSEEK_V2, **extra})
        (key,) = extra
        assert f"{key} does not apply to multi-head latent attention" in str(exc.value)


def _tp_comm(model, sp, recompute="none"):
    """Tensor-parallel seconds at TP8, every collective exposed (no asynchronous backward
    collective: what hides it is the GEMMs', which differ between the two attentions)."""
    plan = {"tp": 8, "pp": 1, "dp": 1, "micro_batch": 1, "sequence_parallel": sp,
            "recompute": recompute}
    inst = _inst(model, plan, async_tensor_model_parallel_allreduce=False)
    rep = evaluate(inst, plan_from_spec(inst, inst.spec.plan), spec=inst.spec.plan)
    return rep.breakdown_s["tp_comm"]


#: a dense MLA model and the multi-head model of the same hidden width
DENSE_MLA = {"layers": 4, "hidden": 4096, "heads": 32, "ffn_hidden": 11008, "gated_mlp": True,
             "vocab": 32000, "seq_len": 4096, "tied_embeddings": False,
             "position_embedding": "rope", "dropout": False, "kv_lora_rank": 512,
             "q_lora_rank": 1536, "qk_head_dim": 128, "qk_pos_emb_head_dim": 64,
             "v_head_dim": 128}
DENSE_MHA = {k: v for k, v in DENSE_MLA.items()
             if k not in ("kv_lora_rank", "q_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim",
                          "v_head_dim")}


@pytest.mark.parametrize("sp, recompute", [(True, "none"), (False, "none"), (True, "full")])
def test_tensor_parallel_time_follows_the_gathered_width(sp, recompute):
    """MLA's attention gathers its compressed query and key / value (and the RoPE key) over
    the tensor group, not the hidden state: with those summing to the hidden width its
    tensor-parallel time is multi-head attention's; narrower, it is less, by less than the
    attention's half of it (the hidden state is still reduced after the projection)."""
    wide = {**DENSE_MLA, "q_lora_rank": 4096 - 512 - 64}          # 3520 + 512 + 64 = 4096
    mha = _tp_comm(DENSE_MHA, sp, recompute)
    assert _tp_comm(wide, sp, recompute) == pytest.approx(mha, rel=1e-9)
    narrow = _tp_comm(DENSE_MLA, sp, recompute)                                # 1536 + 512 + 64 = 2112
    assert 0.75 * mha < narrow < mha


def test_mla_saves_more_attention_activations_than_its_hidden_width_suggests():
    """DeepSeek-V3 at TP8: every head's 192-wide query and key and 128-wide value and output
    are kept (163,840 bytes a token and layer before the split), where 56-wide heads of the
    hidden width would keep 57,344: the plan's activations are larger than the stand-in's."""
    plan = {"tp": 8, "pp": 1, "dp": 1, "micro_batch": 1, "sequence_parallel": True,
            "recompute": "none", "ep": 8}
    v3 = {"preset": "deepseek-v3", "layers": 4, "first_dense_layers": 1, "mtp_layers": 0}
    stand_in = {**v3, **{k: None for k in ("kv_lora_rank", "q_lora_rank", "qk_head_dim",
                                          "qk_pos_emb_head_dim", "v_head_dim")}}
    acts = []
    for model in (v3, stand_in):
        inst = _inst(model, plan)
        acts.append(evaluate(inst, plan_from_spec(inst, inst.spec.plan),
                             spec=inst.spec.plan).memory_gib["activations"])
    per_layer_token = (163_840 - 57_344) / 8 + (8192 - 0) / 8    # split heads, sharded lora
    extra_gib = per_layer_token * 4 * 4096 / 2**30
    assert acts[0] - acts[1] == pytest.approx(extra_gib, rel=0.02)


@pytest.mark.parametrize("pins", [{}, {"tp": 2, "precision": "fp8"}])
def test_backends_agree_on_an_mla_moe_model(pins):
    """A DeepSeek-V2-Lite-shaped model on two nodes with tensor, context and expert
    parallelism free, and with tensor parallelism pinned at 2 under FP8 (so that the optimum
    pays MLA's compressed-width collectives and casts): CP-SAT, HiGHS and the enumerator find
    the same plan. (ZeRO-1 pinned, as partial recompute and offload are: MLA's terms are in
    every sharding part alike, and the parts' agreement is tests/test_solvers.py's and
    tests/test_sharding.py's; with the four parts HiGHS took 5.2 s here, 1.5 s with one.)"""
    from tests.test_solvers import _agree
    model = {**DEEPSEEK_V2_LITE, "layers": 4, "seq_len": 8192}
    pins = dict(pins)
    precision = pins.pop("precision", "bf16")
    _agree({"model": model,
            "training": {"global_batch": 32, "precision": precision},
            "cluster": {"gpu": "h100-sxm", "nodes": 2},
            "constraints": {"max_cp": 2, "max_recompute_layers": 0, "optimizer_offload": False,
                            "dp_sharding": "optim", **pins}})


def _report(model, plan, **training):
    inst = _inst(model, plan, **training)
    return evaluate(inst, plan_from_spec(inst, inst.spec.plan), spec=inst.spec.plan)


def test_up_projection_recompute_drops_queries_keys_and_values():
    """Megatron-Core's ``mla_up_proj`` recompute module drops each layer's Q, K and V once the
    core has read them (128 heads x 192, x 192 and x 128 for DeepSeek-V3: 131,072 bytes a token
    before the tensor split) and re-materialises one layer's for its backward; the attention
    core's own recompute (core_attention) saves nothing under fused attention."""
    v3 = {"preset": "deepseek-v3", "layers": 4, "first_dense_layers": 1, "mtp_layers": 0}
    plan = {"tp": 2, "pp": 1, "dp": 4, "micro_batch": 1, "sequence_parallel": True,
            "recompute": "selective", "ep": 4}
    acts = {mode: _report(v3, plan, selective_recompute=mode).memory_gib["activations"]
            for mode in ("core_attention", "mla_up_proj")}
    none = _report(v3, {**plan, "recompute": "none"}).memory_gib["activations"]
    assert acts["core_attention"] == pytest.approx(none, rel=1e-12)
    qkv = 2 * (128 * 192 + 128 * 192 + 128 * 128)
    assert none - acts["mla_up_proj"] == pytest.approx((4 - 1) * 4096 * qkv / 2 / 2**30,
                                                        rel=1e-9)


def test_up_projection_recompute_costs_less_than_the_core_at_long_sequences():
    """Re-running the up-projections is linear in the sequence, the core's recompute
    quadratic: at 32K tokens mla_up_proj is the cheaper selective recompute, at 1K the
    dearer; both cost more than keeping everything."""
    model = {**DEEPSEEK_V2_LITE, "layers": 2, "experts": 0, "first_dense_layers": 0}
    for k in ("top_k", "moe_ffn_hidden", "shared_experts", "first_dense_layers"):
        model.pop(k, None)
    plan = {"tp": 1, "pp": 1, "dp": 8, "micro_batch": 1, "recompute": "selective"}
    for seq, up_cheaper in ((32768, True), (1024, False)):
        m = {**model, "seq_len": seq}
        step = {mode: _report(m, plan, selective_recompute=mode).step_time_s
                for mode in ("core_attention", "mla_up_proj")}
        kept = _report(m, {**plan, "recompute": "none"}).step_time_s
        assert (step["mla_up_proj"] < step["core_attention"]) is up_cheaper, (seq, step)
        assert min(step.values()) > kept


def test_up_projection_recompute_needs_mla_and_megatron_core():
    with pytest.raises(InputError) as exc:
        _inst(DENSE_MHA, selective_recompute="mla_up_proj")
    assert "model.kv_lora_rank" in str(exc.value)
    doc = {"model": DEEPSEEK_V2_LITE,
           "training": {"global_batch": 64, "selective_recompute": "mla_up_proj"},
           "cluster": {"gpu": "h100-sxm", "gpus": 8}, "constraints": {"framework": "torchtitan"}}
    with pytest.raises(InputError) as exc:
        parse_instance(doc)
    assert "Megatron-Core recompute module" in str(exc.value)


def test_up_projection_recompute_is_exported_as_its_module():
    from planner.app.emit import emit
    inst = _inst({"preset": "deepseek-v3"}, {"tp": 2, "pp": 1, "dp": 4, "micro_batch": 1,
                                             "recompute": "selective", "ep": 4},
                 selective_recompute="mla_up_proj")
    plan = plan_from_spec(inst, inst.spec.plan)
    megatron = emit(inst, plan, "megatron")
    assert "--recompute-granularity selective" in megatron
    assert "--recompute-modules mla_up_proj" in megatron
    assert "--recompute-activations" not in megatron
    nemo = emit(inst, plan, "nemo")
    assert "recompute_modules: [mla_up_proj]" in nemo


def test_backends_agree_with_up_projection_recompute():
    from tests.test_solvers import _agree
    model = {**DEEPSEEK_V2_LITE, "layers": 4, "seq_len": 8192}
    _agree({"model": model,
            "training": {"global_batch": 32, "precision": "bf16",
                         "selective_recompute": "mla_up_proj"},
            "cluster": {"gpu": "h100-sxm", "nodes": 2},
            "constraints": {"recompute": "selective", "max_recompute_layers": 0,
                            "optimizer_offload": False}})


def test_layernorm_recompute_frees_the_input_norm_of_latent_attention():
    """Megatron-Core builds multi-head latent attention's input norm apart (gpt_layer_specs.py:
    a TENorm feeding two down-projections), and an MoE layer's pre-MLP norm too, so the
    ``layernorm`` module frees, per token of the rank's sequence shard, the down-projections'
    16-bit input in every layer (``2h``) and the router's copy of the MLP input in every MoE
    layer (``2h``; in 16 bits a shared expert reads that copy: nothing more). One layer's come
    back for its backward. The peak is the stage's MoE row (each memory row costs the stage's
    layers as one kind: here the 4 layers as MoE ones). With mla_up_proj as well, both frees
    add up, as Megatron-Core applies both."""
    v3 = {"preset": "deepseek-v3", "layers": 4, "first_dense_layers": 1, "mtp_layers": 0}
    plan = {"tp": 2, "pp": 1, "dp": 4, "micro_batch": 1, "sequence_parallel": True,
            "recompute": "selective", "ep": 4}
    none = _report(v3, {**plan, "recompute": "none"}).memory_gib["activations"]
    acts = {tuple(m): _report(v3, plan, selective_recompute=m).memory_gib["activations"]
            for m in (["layernorm"], ["mla_up_proj"], ["layernorm", "mla_up_proj"])}
    tok = 4096 / 2                                   # the rank's sequence shard (SP at TP 2)
    h = 7168
    # 4 MoE layers each free 2h (the down-projections' input) and 2h (the MLP input); one
    # layer's come back
    freed = (4 - 1) * (2 * h + 2 * h) * tok / 2**30
    assert none - acts[("layernorm",)] == pytest.approx(freed, rel=1e-9)
    both = (none - acts[("layernorm",)]) + (none - acts[("mla_up_proj",)])
    assert none - acts[("layernorm", "mla_up_proj")] == pytest.approx(both, rel=1e-9)


@pytest.mark.parametrize("model, training, said", [
    (DEEPSEEK_V2_LITE, {"selective_recompute": ["layernorm", "layernorm"]}, "names a module twice"),
    (DENSE_MHA, {"selective_recompute": ["moe_act"]}, "model.experts = 0"),
    (DENSE_MHA, {"selective_recompute": ["layernorm"]}, "would recompute nothing"),
    (DEEPSEEK_V2_LITE, {"selective_recompute": ["moe_act"], "precision": "fp8",
                        "fp8_recipe": "delayed"}, "delayed scaling"),
    (DEEPSEEK_V2_LITE, {"selective_recompute": ["layernorm"], "precision": "fp8"},
     "its default recipe"),
    (DEEPSEEK_V2_LITE, {"selective_recompute": ["moe"]}, "the model does not cost"),
    ({**DEEPSEEK_V2_LITE, "first_dense_layers": 0}, {"selective_recompute": ["mlp"]},
     "every layer of this model is an MoE layer"),
    (DEEPSEEK_V2_LITE, {"selective_recompute": "layernorm"}, 'write it in a list: ["layernorm"]'),
])
def test_recompute_modules_that_cannot_run_are_input_errors(model, training, said):
    """What Megatron-Core would refuse, or what would mean nothing, is said before a plan is
    made: a module twice, moe_act without experts, layernorm where every norm is fused into
    its linear layer (it would recompute nothing), layernorm / moe_act under FP8's delayed
    scaling, Megatron-Core's default recipe, whether set or left unset (TransformerConfig
    raises), the modules the model does not cost (moe, shared_experts) by name, mlp where no
    layer is dense, and a module written without its list."""
    with pytest.raises(InputError) as exc:
        _inst(model, **training)
    assert "training.selective_recompute" in str(exc.value) and said in str(exc.value)
    doc = {"model": DEEPSEEK_V2_LITE,
           "training": {"global_batch": 64, "selective_recompute": ["core_attn"]},
           "cluster": {"gpu": "h100-sxm", "gpus": 8}, "constraints": {"framework": "torchtitan"}}
    with pytest.raises(InputError, match="Megatron-Core recompute modules"):
        parse_instance(doc)


@pytest.mark.parametrize("precision, q_lora, freed_per_h", [
    ("bf16", True, 2), ("bf16", False, 2), ("fp8", True, 2), ("fp8", False, 1)])
def test_layernorm_recompute_in_dense_latent_attention_layers(precision, q_lora, freed_per_h):
    """A dense MLA layer's input norm is apart too (its pre-MLP norm is fused into fc1):
    ``layernorm`` frees what its readers kept of its output. In 16 bits they share the
    norm's 16-bit tensor (2h a token). At FP8 (tensorwise) each down-projection kept a narrow
    copy (h each), which set_for_recompute_input_layernorm turns into the original, freed
    with it; without q_lora_rank only the key / value down-projection is set so, and the
    query projection's own copy stays: one of the two is freed."""
    model = {**DENSE_MLA, **({} if q_lora else {"q_lora_rank": None})}
    if not q_lora:
        model.pop("q_lora_rank")
    plan = {"tp": 2, "pp": 1, "dp": 4, "micro_batch": 1, "sequence_parallel": True,
            "recompute": "selective"}
    extra = {"precision": precision, **({"fp8_recipe": "tensorwise"}
                                        if precision == "fp8" else {})}
    none = _report(model, {**plan, "recompute": "none"}, **extra).memory_gib["activations"]
    norm = _report(model, plan, selective_recompute=["layernorm"],
                   **extra).memory_gib["activations"]
    tok, h = 4096 / 2, 4096
    assert none - norm == pytest.approx((4 - 1) * freed_per_h * h * tok / 2**30, rel=1e-9)


def test_core_and_up_projection_recompute_free_both_without_flash():
    """Megatron-Core applies both modules (multi_latent_attention.py): under unfused
    attention the core's recompute drops the score tensors and mla_up_proj the queries, keys
    and values, so together they free the sum of what each frees alone."""
    model = {**DEEPSEEK_V2_LITE, "layers": 4}
    plan = {"tp": 2, "pp": 1, "dp": 4, "micro_batch": 1, "sequence_parallel": True,
            "recompute": "selective", "ep": 4}
    none = _report(model, {**plan, "recompute": "none"},
                   flash_attention=False).memory_gib["activations"]
    acts = {tuple(m): _report(model, plan, selective_recompute=m,
                              flash_attention=False).memory_gib["activations"]
            for m in (["core_attn"], ["mla_up_proj"], ["core_attn", "mla_up_proj"])}
    alone = (none - acts[("core_attn",)]) + (none - acts[("mla_up_proj",)])
    assert acts[("core_attn",)] < none and acts[("mla_up_proj",)] < none
    assert none - acts[("core_attn", "mla_up_proj")] == pytest.approx(alone, rel=1e-9)


def test_recompute_modules_are_exported_in_megatron_core_s_order():
    from planner.app.emit import emit
    from tests.test_emit import parse_megatron
    inst = _inst({"preset": "deepseek-v3"}, {"tp": 2, "pp": 1, "dp": 4, "micro_batch": 1,
                                             "recompute": "selective", "ep": 4},
                 selective_recompute=["mla_up_proj", "layernorm", "core_attn", "moe_act"])
    plan = plan_from_spec(inst, inst.spec.plan)
    megatron = emit(inst, plan, "megatron")        # (a flag of several values: read as text)
    assert "--recompute-granularity selective \\\n" in megatron
    assert "--recompute-modules core_attn moe_act layernorm mla_up_proj \\\n" in megatron
    assert "--recompute-activations" not in megatron
    assert "recompute_modules: [core_attn, moe_act, layernorm, mla_up_proj]" \
        in emit(inst, plan, "nemo")
    how = json.loads(emit(inst, plan, "deepspeed"))["plan_parallelism"]["recompute_how"]
    assert "modules core_attn, moe_act, layernorm, mla_up_proj" in how and "cannot express" in how
    fsdp = plan_from_spec(inst, inst.spec.plan, dp_sharding="optim_grads_params")
    said = " ".join(ln.lstrip("# ") for ln in emit(inst, fsdp, "torchtitan").splitlines())
    assert "modules core_attn, moe_act, layernorm, mla_up_proj: cannot express" in said
    # the default module alone keeps the short flag
    inst = _inst({"preset": "deepseek-v3"}, {"tp": 2, "pp": 1, "dp": 4, "micro_batch": 1,
                                             "recompute": "selective", "ep": 4},
                 selective_recompute=["core_attn"])
    plan = plan_from_spec(inst, inst.spec.plan)
    a = parse_megatron(emit(inst, plan, "megatron"))
    assert a["--recompute-activations"] is True and "--recompute-modules" not in a
    # NeMo writes it, over a recipe's own modules (NeMo's DeepSeek-V3 recipe sets
    # ["mla_up_proj", "layernorm"])
    assert "recompute_modules: [core_attn]" in emit(inst, plan, "nemo")


def test_backends_agree_with_recompute_modules():
    from tests.test_solvers import _agree
    model = {**DEEPSEEK_V2_LITE, "layers": 4, "seq_len": 8192}
    _agree({"model": model,
            "training": {"global_batch": 32, "precision": "bf16",
                         "selective_recompute": ["layernorm", "moe_act", "mla_up_proj"]},
            "cluster": {"gpu": "h100-sxm", "nodes": 2},
            "constraints": {"recompute": "selective", "max_recompute_layers": 0,
                            "optimizer_offload": False}})


def test_the_plan_names_the_latent_attention_s_widths(tmp_path):
    """`plan evaluate` of a DeepSeek-V2-Lite-shaped model says its attention is MLA with its
    widths (no compressed query: none named), not "16 heads (16 kv)"."""
    from typer.testing import CliRunner

    from planner.app.cli import app
    import json
    lines = ["[model]"] + [f"{k} = {json.dumps(v)}"          # (TOML's spelling of these)
                           for k, v in {**DEEPSEEK_V2_LITE, "layers": 4}.items()]
    lines += ["[training]", "global_batch = 64", "[cluster]", 'gpu = "h100-sxm"', "gpus = 8",
              "[plan]", "tp = 2", "pp = 1", "dp = 4", "ep = 4", "micro_batch = 1"]
    path = tmp_path / "lite.toml"
    path.write_text("\n".join(lines) + "\n")
    result = CliRunner().invoke(app, ["evaluate", str(path)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert ("16 heads (MLA: query / key 128 + 64 RoPE wide, value 128; compressed key / value "
            "512)") in text
    assert "kv)" not in text


def test_mla_widths_written_replace_the_preset_s_key_value_heads():
    """A preset's key / value heads give way to MLA widths the instance writes (a Llama 3 8B
    made MLA: TOML cannot unset a key); a key / value head count written on DeepSeek-V3 is
    refused, naming it."""
    mla = _inst({"preset": "llama3-8b", "kv_lora_rank": 512, "qk_head_dim": 128,
                 "qk_pos_emb_head_dim": 64, "v_head_dim": 128}).model
    assert mla.mla and mla.kv_heads is None
    with pytest.raises(InputError) as exc:
        _inst({"preset": "deepseek-v3", "kv_heads": 8})
    assert "kv_heads does not apply to multi-head latent attention" in str(exc.value)


def test_uncompressed_queries_are_exported_as_such():
    """NeMo's MLATransformerConfig compresses queries unless q_lora_rank is null (its default
    is 512): the export says null for DeepSeek-V2-Lite."""
    from planner.app.emit import emit
    from tests.test_emit import parse_yaml
    inst = _inst({**DEEPSEEK_V2_LITE, "layers": 4},
                 {"tp": 2, "pp": 1, "dp": 4, "micro_batch": 1, "ep": 4})
    y = parse_yaml(emit(inst, plan_from_spec(inst, inst.spec.plan), "nemo"))
    assert "model.config.q_lora_rank" in y and y["model.config.q_lora_rank"] is None
    assert y["model.config.kv_lora_rank"] == 512


def test_every_tensor_rank_holds_the_down_projections_whole():
    """Megatron-Core builds MLA's query and key / value down-projections as Transformer Engine
    linears in ``parallel_mode = "duplicated"``: each of the t tensor ranks holds them whole,
    7168 x 1536 and 7168 x (512 + 64) with DeepSeek-V3's widths. So the t ranks together hold
    the model once plus t - 1 more copies of those, layer by layer (16-bit weights)."""
    dense_v3 = {**DENSE_MLA, "layers": 4, "hidden": 7168, "heads": 128, "ffn_hidden": 18432,
                "vocab": 129280}
    duplicated = 7168 * 1536 + 7168 * (512 + 64)
    weights = {}
    for t in (1, 2, 4):
        rep = _report(dense_v3, {"tp": t, "pp": 1, "dp": 8 // t, "micro_batch": 1,
                                 "recompute": "none"})
        weights[t] = rep.memory_gib["weights"] * 2**30
    for t in (2, 4):
        extra = (t * weights[t] - weights[1]) / 2         # bytes -> 16-bit weights
        assert extra == pytest.approx((t - 1) * 4 * duplicated, rel=1e-9)


@pytest.mark.parametrize("q_lora", [True, False])
@pytest.mark.parametrize("recipe", ["delayed", "tensorwise"])
def test_fp8_keeps_two_narrow_copies_of_the_latent_attention_input(q_lora, recipe):
    """What FP8 saves of a dense layer's stored activations, named tensor by tensor from
    Megatron-Core (Megatron-LM d98e8a64dd) and Transformer Engine (d0067d0da), per token of the
    rank's shard (TP 2 with sequence parallelism, flash attention), against bf16:

    * the attention input (the input norm's output): in bf16 one tensor, ``2h``, that both of
      MLA's readers keep (the query and the key / value down-projections, two TELinear: or
      without q_lora_rank the query projection and the key / value down-projection); at FP8
      each keeps its own narrow copy, ``2 x h``: nothing saved (a fused QKV layer, one
      reader, saves ``h``);
    * the up-projections' inputs (their fused norms' outputs): ``q_lora + kv_lora`` saved;
    * fc1's input: ``h``; fc2's input: ``f``;
    * the projection's input, the flash output, which the kernel keeps in 16 bits anyway:
      under delayed scaling the projection keeps a narrow copy beside it, ``o`` more; under
      the other recipes it keeps the original (attention.py / multi_latent_attention.py
      ``set_save_original_input(linear_proj)``): nothing."""
    model = {**DENSE_MLA}
    if not q_lora:
        model.pop("q_lora_rank")
    h, f, o = 4096, 11008, 32 * 128
    tok = 4096 / 2

    def stored(precision, **training):
        inst = _inst(model, {"tp": 2, "pp": 1, "dp": 4, "micro_batch": 1,
                             "sequence_parallel": True, "recompute": "none"},
                     precision=precision, **training)
        plan = plan_from_spec(inst, inst.spec.plan)
        return float(step_terms(inst, plan.grid.degrees(), plan.knobs).layer["stored_first"])

    saved = stored("bf16") - stored("fp8", fp8_recipe=recipe)
    lora = (1536 if q_lora else 0) + 512
    expected = lora + h + f - (o if recipe == "delayed" else 0)
    assert saved == pytest.approx(tok * expected, rel=1e-12)

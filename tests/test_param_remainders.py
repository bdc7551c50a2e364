"""Master weights stored as remainders (``[training] store_param_remainders``).

References
----------
* Apex ``DistributedFusedAdam`` (apex/contrib/optimizers/distributed_fused_adam.py,
  ``StateBucket``): with ``store_param_remainders`` the bucket holds ``param_remainders_shard``
  as ``torch.int16`` beside ``exp_avg_shard`` and ``exp_avg_sq_shard`` in the optimizer dtype
  (fp32) and no ``params_shard``: 2 + 4 + 4 bytes per shard parameter. NeMo 1
  (``megatron_base_model.setup_optimization``) passes ``store_params = False,
  store_param_remainders = True`` when the optimizer dtype is fp32 and the weights bf16.
* Megatron-Core ``distrib_optimizer.py``: the precision-aware optimizer's ``master_param``
  state is ``torch.int16`` when ``store_param_remainders`` and bf16; ``get_megatron_optimizer``
  refuses the precision-aware optimizer without the distributed optimizer.
* Without remainders, mixed-precision Adam keeps an fp32 master and two fp32 moments, 12 bytes
  per parameter (Korthikanti et al. 2022, Sec. 4).
* GPT-3 175B: L = 96, h = 12288 (Brown et al. 2020), 12 h^2 + 13 h parameters per layer
  (Narayanan et al. 2021).
"""

from __future__ import annotations

import copy

import pytest

from formulations.solve import solve
from planner.app.emit import emit
from planner.model.errors import InfeasibleError, InputError
from planner.model.evaluate import evaluate
from planner.model.instance import parse_instance
from planner.model.plan import plan_from_spec
from tests.test_emit import comment_text, emitted

GiB = 2**30
L, h, V = 96, 12288, 51200
LAYER = 12 * h * h + 13 * h
#: bytes per shard parameter, from the Apex state bucket's dtypes: int16 remainder, two fp32
#: moments; and the fp32 master and two moments without remainders
WITH_REMAINDERS, WITHOUT = 2 + 4 + 4, 4 + 4 + 4


def gpt3(remainders: bool, optimizer_dtype: str = "fp32", training=None, **plan):
    inst = parse_instance({
        "model": {"preset": "gpt3-175b"},
        "training": {"global_batch": 256, "precision": "bf16",
                     "optimizer_dtype": optimizer_dtype,
                     "store_param_remainders": remainders, **(training or {})},
        "cluster": {"gpu": "h100-sxm", "gpus": 512},
        "plan": {"tp": 4, "pp": 8, "dp": 16, "vp": 1, "micro_batch": 1, "recompute": "none",
                 "dp_sharding": "optim", **plan},
    })
    return evaluate(inst, plan_from_spec(inst, inst.spec.plan), spec=inst.spec.plan)


def test_the_last_stage_keeps_ten_bytes_of_states_per_parameter():
    """The last of 8 stages at tp = 4 holds 12 layers and the output layer (V h + 2 h for the
    final norm); the distributed optimizer shards their states over dp = 16."""
    params = (L // 8 * LAYER + V * h + 2 * h) / 4
    on, off = gpt3(True), gpt3(False)
    assert on.memory_by_stage_gib["last"]["optimizer_states"] * GiB == pytest.approx(
        params * WITH_REMAINDERS / 16, rel=1e-9)
    assert off.memory_by_stage_gib["last"]["optimizer_states"] * GiB == pytest.approx(
        params * WITHOUT / 16, rel=1e-9)
    # the weights, gradients and activations are the same, and so is the time but for the
    # Adam step, which moves 28 bytes per parameter instead of 30 (the remainder and the bf16
    # weight read and written where the fp32 master was, no separate weight write)
    for part in ("weights", "gradients", "activations", "logits"):
        assert on.memory_by_stage_gib["last"][part] == off.memory_by_stage_gib["last"][part]
    for term, seconds in off.breakdown_s.items():
        if term != "optimizer":
            assert on.breakdown_s[term] == seconds, term
    assert on.breakdown_s["optimizer"] == pytest.approx(off.breakdown_s["optimizer"] * 28 / 30,
                                                        rel=1e-12)


def test_expert_states_keep_remainders_too():
    """An MoE model's routed experts' states, sharded over the expert data-parallel group, are
    10 of 12 bytes like the rest: every stage's optimizer states scale by 10 / 12."""
    def mixtral(remainders):
        inst = parse_instance({
            "model": {"preset": "mixtral-8x7b"},
            "training": {"global_batch": 64, "precision": "bf16",
                         "store_param_remainders": remainders},
            "cluster": {"gpu": "h100-sxm", "gpus": 64},
            "plan": {"tp": 2, "pp": 4, "dp": 8, "ep": 8, "micro_batch": 1,
                     "recompute": "none", "dp_sharding": "optim"},
        })
        return evaluate(inst, plan_from_spec(inst, inst.spec.plan), spec=inst.spec.plan)
    on, off = mixtral(True), mixtral(False)
    for stage, row in off.memory_by_stage_gib.items():
        assert on.memory_by_stage_gib[stage]["optimizer_states"] == pytest.approx(
            row["optimizer_states"] * WITH_REMAINDERS / WITHOUT, rel=1e-9), stage


def test_bf16_moments_with_remainders_keep_six_bytes():
    """Megatron-Core's precision-aware optimizer with bf16 moments (Megatron-Bridge's
    DeepSeek-V3 recipes: exp_avg_dtype / exp_avg_sq_dtype bf16) keeps the int16 remainder and
    two bf16 moments: 6 bytes per shard parameter, where NeMo 1's bf16 states (no master) keep
    4. The exports write it."""
    params = (L // 8 * LAYER + V * h + 2 * h) / 4
    on, off = gpt3(True, optimizer_dtype="bf16"), gpt3(False, optimizer_dtype="bf16")
    assert on.memory_by_stage_gib["last"]["optimizer_states"] * GiB == pytest.approx(
        params * (2 + 2 + 2) / 16, rel=1e-9)
    assert off.memory_by_stage_gib["last"]["optimizer_states"] * GiB == pytest.approx(
        params * (2 + 2) / 16, rel=1e-9)
    doc = {"model": {"preset": "gpt-1.3b"},
           "training": {"global_batch": 64, "precision": "bf16", "optimizer_dtype": "bf16",
                        "store_param_remainders": True},
           "cluster": {"gpu": "h100-sxm", "gpus": 8}}
    plan = {"tp": 1, "pp": 1, "dp": 8, "micro_batch": 8, "dp_sharding": "optim"}
    megatron = emitted(doc, plan, "megatron")
    assert "--exp-avg-dtype bf16" in megatron and "--exp-avg-sq-dtype bf16" in megatron
    assert "cannot express" not in megatron
    nemo = emitted(doc, plan, "nemo")
    assert "exp_avg_dtype: torch.bfloat16" in nemo and "store_param_remainders: true" in nemo


@pytest.mark.parametrize("training, says", [
    ({"precision": "fp16"}, "not fp16"),
    ({"precision": "fp8", "fp8_param_gather": True}, "keeps them in FP8"),
])
def test_weights_that_are_not_bf16_are_input_errors(training, says):
    with pytest.raises(InputError) as exc:
        parse_instance({"model": {"preset": "gpt-1.3b"},
                        "training": {"global_batch": 64, "precision": "bf16",
                                     "store_param_remainders": True, **training},
                        "cluster": {"gpu": "h100-sxm", "gpus": 8}})
    text = str(exc.value)                  # (InputError's text lists its problems)
    assert "store_param_remainders" in text and says in text


def test_only_the_distributed_optimizer_keeps_remainders():
    """A [plan] under Megatron-FSDP is an input error; constraints or a framework that leave
    no ZeRO-1 are explained; the exports that cannot run it refuse it."""
    with pytest.raises(InputError, match="store_param_remainders = true needs dp_sharding"):
        gpt3(True, dp_sharding="optim_grads")
    base = {"model": {"preset": "gpt-1.3b"},
            "training": {"global_batch": 64, "precision": "bf16",
                         "store_param_remainders": True},
            "cluster": {"gpu": "h100-sxm", "gpus": 8}}
    for cons in ({"dp_sharding": ["optim_grads", "optim_grads_params"]},
                 {"framework": "deepspeed", "dp_sharding": ["none", "optim_grads"]},
                 {"framework": "torchtitan"}):
        with pytest.raises(InfeasibleError) as exc:
            solve(parse_instance({**base, "constraints": cons}), solver="enumerate",
                  explain=False)
        assert any("store_param_remainders" in w for w in exc.value.explanation), cons
    res = solve(parse_instance(base), solver="cpsat")
    assert res.report.plan.dp_sharding == "optim"
    inst = parse_instance(base)
    assert "--use-precision-aware-optimizer" in emit(inst, res.report.plan, "megatron")
    nemo = emit(inst, res.report.plan, "nemo")
    assert "use_precision_aware_optimizer: true" in nemo
    assert "store_param_remainders: true" in nemo
    for fmt in ("torchtitan", "deepspeed"):
        with pytest.raises(InputError) as exc:
            emit(inst, res.report.plan, fmt)
        assert any("store_param_remainders" in p for p in exc.value.problems), fmt


#: 16 Llama-like layers on one H100 node, with a reserve that leaves 37.5 GiB: the optimum
#: TP2 DP4 mb4 under ZeRO-1 needs 37.0 GiB with remainders and 37.9 GiB with fp32 masters
#: (measured with the enumerator), so without remainders the search must leave ZeRO-1
REMAINDERS_DECIDE = {
    "model": {"layers": 16, "hidden": 4096, "heads": 32, "kv_heads": 8, "vocab": 32000,
              "seq_len": 4096, "gated_mlp": True},
    "training": {"global_batch": 16, "precision": "bf16", "store_param_remainders": True},
    "cluster": {"gpu": "h100-sxm", "nodes": 1},
    "constraints": {"max_recompute_layers": 0, "optimizer_offload": False,
                    "memory_reserve_GiB": 42.1},
}


def test_backends_agree_where_the_remainders_decide():
    from tests.test_solvers import _agree
    _agree(REMAINDERS_DECIDE)
    with_r = solve(parse_instance(REMAINDERS_DECIDE), solver="cpsat").report
    doc = copy.deepcopy(REMAINDERS_DECIDE)
    doc["training"]["store_param_remainders"] = False
    without = solve(parse_instance(doc), solver="cpsat").report
    assert with_r.plan.dp_sharding == "optim" and without.plan.dp_sharding != "optim"
    assert with_r.step_time_s < without.step_time_s
    assert with_r.memory_gib["total"] <= with_r.memory_gib["limit"]


def test_exports_under_optimizer_offload_carry_no_remainders():
    """The CPU optimizer steps on whole fp32 copies (terms.keeps_remainders): neither export
    asks for the remainders the model does not cost there."""
    inst = parse_instance({
        "model": {"preset": "gpt3-175b"},
        "training": {"global_batch": 256, "precision": "bf16", "store_param_remainders": True},
        "cluster": {"gpu": "gb200", "gpus": 512},
        "plan": {"tp": 4, "pp": 8, "dp": 16, "micro_batch": 1, "dp_sharding": "optim",
                 "optimizer_offload": True},
    })
    plan = plan_from_spec(inst, inst.spec.plan)
    assert "store_param_remainders" not in emit(inst, plan, "nemo")
    assert "16-bit remainders" not in emit(inst, plan, "megatron")


# ---- bf16 moments beside a whole fp32 master (main_params_dtype) -----------------------------

#: Megatron-Core's precision-aware optimizer with exp_avg_dtype / exp_avg_sq_dtype bf16 and
#: main_params_dtype fp32 (optimizer_config.py; Megatron-Bridge's and NeMo's DeepSeek-V3
#: recipes set these): two bf16 moments and the fp32 master, 2 + 2 + 4 bytes per shard parameter
BF16_MOMENTS_FP32_MASTER = 2 + 2 + 4


@pytest.mark.parametrize("training", [{}, {"precision": "fp8", "fp8_recipe": "tensorwise"}])
def test_bf16_moments_beside_an_fp32_master_keep_eight_bytes(training):
    """The last stage's states at 8 bytes per shard parameter, in bf16 and at FP8 under current
    scaling (where Megatron-Core keeps the whole fp32 master itself); the Adam step reads the
    master, both moments and the fp32 gradient (4 + 2 + 2 + 4) and writes the master, both
    moments and the 16-bit weight (4 + 2 + 2 + 2): 22 bytes where fp32 states move 30."""
    params = (L // 8 * LAYER + V * h + 2 * h) / 4
    mixed = gpt3(False, "bf16", {"main_params_dtype": "fp32", **training})
    fp32 = gpt3(False, "fp32", training)
    assert mixed.memory_by_stage_gib["last"]["optimizer_states"] * GiB == pytest.approx(
        params * BF16_MOMENTS_FP32_MASTER / 16, rel=1e-9)
    assert mixed.breakdown_s["optimizer"] == pytest.approx(fp32.breakdown_s["optimizer"]
                                                           * 22 / 30, rel=1e-12)
    for part in ("weights", "gradients", "activations", "logits"):
        assert mixed.memory_by_stage_gib["last"][part] == fp32.memory_by_stage_gib["last"][part]


@pytest.mark.parametrize("training, plan, says", [
    ({"optimizer_dtype": "fp32"}, {}, "keeps one already"),
    ({"store_param_remainders": True}, {}, "keep one"),
    ({}, {"dp_sharding": "optim_grads"}, 'main_params_dtype = "fp32" needs dp_sharding'),
])
def test_an_fp32_master_beside_bf16_moments_runs_as_megatron_core_runs_it(training, plan, says):
    doc = {"model": {"preset": "gpt-1.3b"},
           "training": {"global_batch": 64, "precision": "bf16", "optimizer_dtype": "bf16",
                        "main_params_dtype": "fp32", **training},
           "cluster": {"gpu": "h100-sxm", "gpus": 8},
           "plan": {"tp": 1, "pp": 1, "dp": 8, "micro_batch": 8, "dp_sharding": "optim",
                    **plan}}
    with pytest.raises(InputError, match=says):
        inst = parse_instance(doc)
        plan_from_spec(inst, inst.spec.plan)


def test_an_fp32_master_beside_bf16_moments_is_written_as_it_is_costed():
    """Megatron-LM: the precision-aware optimizer's flags; for bf16 weights Megatron-Core
    hands the master to Transformer Engine's FusedAdam, which keeps remainders (its
    store_param_remainders has no flag), so the export says it cannot express the whole
    master there; under current scaling it can. NeMo writes the dtypes, and
    store_param_remainders false where FusedAdam would keep remainders (main_params_dtype at
    its default). torchtitan and
    DeepSpeed have no such optimizer: the search leaves them no mode, the exports refuse."""
    def doc(**training):
        return {"model": {"preset": "gpt-1.3b"},
                "training": {"global_batch": 64, "optimizer_dtype": "bf16",
                             "main_params_dtype": "fp32", **training},
                "cluster": {"gpu": "h100-sxm", "gpus": 8}}
    plan = {"tp": 1, "pp": 1, "dp": 8, "micro_batch": 8, "dp_sharding": "optim"}
    for training, te_master in (({"precision": "bf16"}, True),
                                ({"precision": "fp8", "fp8_recipe": "tensorwise"}, False)):
        megatron = emitted(doc(**training), plan, "megatron")
        for flag in ("--use-precision-aware-optimizer", "--main-params-dtype fp32",
                     "--exp-avg-dtype bf16", "--exp-avg-sq-dtype bf16"):
            assert flag in megatron, (training, flag)
        assert ("cannot express the whole master" in comment_text(megatron)) == te_master
        nemo = emitted(doc(**training), plan, "nemo")
        # (main_params_dtype stays OptimizerConfig's torch.float32 default: a string there
        # would compare unequal to it)
        assert "main_params_dtype" not in nemo and "exp_avg_dtype: torch.bfloat16" in nemo
        assert ("store_param_remainders: false" in nemo) == te_master
    for cons in ({"framework": "torchtitan"}, {"framework": "deepspeed"}):
        with pytest.raises(InfeasibleError) as exc:
            solve(parse_instance({**doc(precision="bf16"), "constraints": cons}),
                  solver="enumerate", explain=False)
        assert any("main_params_dtype" in w for w in exc.value.explanation), cons


def test_backends_agree_with_an_fp32_master_beside_bf16_moments():
    from tests.test_solvers import _agree
    doc = copy.deepcopy(REMAINDERS_DECIDE)
    doc["training"].update(store_param_remainders=False, optimizer_dtype="bf16",
                           main_params_dtype="fp32")
    _agree(doc)


def test_an_fp32_master_beside_bf16_moments_stays_on_the_gpu():
    """Megatron-Core's CPU optimizer (HybridDeviceOptimizer) is built without the
    precision-aware dtypes and steps on fp32 states: the optimizer offload is refused beside
    bf16 moments (a pinned offload is explained, a [plan] with it breaks a rule)."""
    doc = {"model": {"preset": "gpt-1.3b"},
           "training": {"global_batch": 64, "optimizer_dtype": "bf16",
                        "main_params_dtype": "fp32"},
           "cluster": {"gpu": "gb200", "gpus": 8}}
    with pytest.raises(InfeasibleError) as exc:
        solve(parse_instance({**doc, "constraints": {"optimizer_offload": True}}),
              solver="enumerate", explain=False)
    assert any("HybridDeviceOptimizer" in w for w in exc.value.explanation)
    inst = parse_instance({**doc, "plan": {"tp": 1, "pp": 1, "dp": 8, "micro_batch": 1,
                                           "dp_sharding": "optim", "optimizer_offload": True}})
    rep = evaluate(inst, plan_from_spec(inst, inst.spec.plan), spec=inst.spec.plan)
    assert any("main_params_dtype" in v for v in rep.violations)

"""Host offload (docs/model.md, "Host offload"): the optimizer states in host memory with the
Adam step on the CPU, and the activations of N layers offloaded in forward and reloaded in
backward. Hand computations from published figures, the plan it makes fit, the host memory
limit, the framework rules and the exports. Each solve here is a one-GPU or one-node space."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from formulations.solve import solve
from planner.app.emit import emit
from planner.model.catalog import GiB
from planner.model.errors import InfeasibleError, InputError
from planner.model.evaluate import evaluate
from planner.model.instance import parse_instance
from planner.model.plan import Plan, plan_from_spec
from planner.model.terms import step_terms

#: Llama 3 8B has 8.03 B parameters (Meta, "The Llama 3 Herd of Models", 2024, Table 3;
#: the model card: 8.03 B with its untied 128,256-token embedding and output layer)
LLAMA3_8B_PARAMS = 8.03e9


def llama8b_one_node(**constraints) -> dict:
    return {"model": {"preset": "llama3-8b"},
            "training": {"global_batch": 64, "tokens": 1e9},
            "cluster": {"gpu": "h100-sxm", "nodes": 1},
            "constraints": constraints}


def llama8b_plan(inst, **kw) -> Plan:
    spec = {"tp": 1, "pp": 1, "dp": 8, "micro_batch": 1, "dp_sharding": "optim",
            "recompute": "full", **kw}
    return plan_from_spec(inst, inst.spec.plan.model_copy(update=spec)
                          if inst.spec.plan else _spec(spec))


def _spec(fields):
    from planner.model.schema import PlanSpec
    return PlanSpec(**fields)


def test_optimizer_offload_by_hand():
    """Llama 3 8B, DP 8 with the distributed optimizer on one DGX H100: each GPU's shard is
    8.03e9 / 8 parameters. Offloaded: the optimizer states (fp32 master and two moments, 12
    bytes; bf16 training keeps fp32 gradients) leave the GPU; the host holds them and an fp32
    gradient, 16 bytes per shard parameter; the CPU
    step touches 30 bytes per parameter at the host's 614.4 GB/s shared by 8 GPUs, of which
    Megatron's CPU AdamW (torch.optim.AdamW) reaches a sixth (DeepSpeed's ZeRO-Offload
    tutorial: its DeepSpeedCPUAdam is 5-7x faster than PyTorch's); the gradients (fp32, 4
    bytes) go over PCIe Gen5 at 64 GB/s, the 16-bit parameters come back, both hidden behind
    the CPU step (Megatron's --overlap-cpu-optimizer-d2h-h2d)."""
    inst = parse_instance(llama8b_one_node())
    off = evaluate(inst, llama8b_plan(inst))
    on = evaluate(inst, llama8b_plan(inst, optimizer_offload=True))
    shard = LLAMA3_8B_PARAMS / 8
    assert off.memory_gib["optimizer_states"] * GiB == pytest.approx(12 * shard, rel=5e-3)
    assert on.memory_gib["optimizer_states"] == 0.0
    saved = (off.memory_gib["total"] - on.memory_gib["total"]) * GiB
    assert saved == pytest.approx(12 * shard, rel=5e-3)
    assert on.memory_gib["host_offload"] * GiB == pytest.approx(16 * shard, rel=5e-3)
    cpu = 30 * shard / (614.4e9 / 8 / 6)                      # 2.35 s
    assert on.breakdown_s["optimizer"] == pytest.approx(cpu, rel=5e-3)
    assert 4 * shard / 64e9 < cpu                             # the transfers hide
    assert on.breakdown_s["offload"] == 0.0
    assert on.step_time_s - off.step_time_s == pytest.approx(     # nothing else changes
        on.breakdown_s["optimizer"] - off.breakdown_s["optimizer"], rel=1e-9)
    # a host link slower than the CPU step: the longer transfer's excess is exposed
    slow = parse_instance({**llama8b_one_node(), "cluster": {
        "gpu": "h100-sxm", "nodes": 1, "host_link_bandwidth_GBps": 1.0}})
    rep = evaluate(slow, llama8b_plan(slow, optimizer_offload=True))
    assert rep.breakdown_s["offload"] == pytest.approx(4 * shard / 1e9 - cpu, rel=5e-3)
    # DeepSpeed's DeepSpeedCPUAdam is taken at the host's bandwidth: a sixth of the time
    # DeepSpeed's transfers are costed unoverlapped: both directions exposed
    ds = parse_instance(llama8b_one_node(framework="deepspeed"))
    rep = evaluate(ds, llama8b_plan(ds, optimizer_offload=True))
    assert rep.breakdown_s["optimizer"] == pytest.approx(cpu / 6, rel=5e-3)
    # (DeepSpeed reduces gradients in bf16 by default: 2 bytes down, 2 up)
    assert rep.breakdown_s["offload"] == pytest.approx((2 + 2) * shard / 64e9, rel=5e-3)


def test_activation_offload_by_hand():
    """GPT 1.3B (24 layers, h 2048, 16 heads, s 2048), TP 1, no recompute, micro-batch 1,
    fused attention: each layer stores s b (34 h + 4 a) bytes (Korthikanti et al. 2022,
    Table 2 at t = 1, plus the fp32 softmax statistics of the fused kernel). Offloading N of
    them frees N times that on the GPU and puts it on the host; on a 0.5 GB/s link each
    transfer is longer than two layers' compute, so ``2x - 3f`` per layer and micro-batch is
    exposed (docs/model.md, "Host offload")."""
    doc = {"model": {"preset": "gpt-1.3b"}, "training": {"global_batch": 8},
           "cluster": {"gpu": "h100-sxm", "nodes": 1, "host_link_bandwidth_GBps": 0.5}}
    inst = parse_instance(doc)
    base = {"tp": 1, "pp": 1, "dp": 8, "micro_batch": 1, "recompute": "none"}
    off = plan_from_spec(inst, _spec(base))
    on = plan_from_spec(inst, _spec({**base, "offload_layers": 10}))
    r_off, r_on = evaluate(inst, off), evaluate(inst, on)
    m = inst.model
    assert (m.layers, m.hidden, m.heads, m.seq_len) == (24, 2048, 16, 2048)
    stored = m.seq_len * 1 * (34 * m.hidden + 4 * m.heads)
    saved = (r_off.memory_gib["activations"] - r_on.memory_gib["activations"]) * GiB
    assert saved == pytest.approx(10 * stored, rel=1e-9)
    assert r_on.memory_gib["host_offload"] * GiB == pytest.approx(10 * stored, rel=1e-9)
    x = stored / 0.5e9
    f = step_terms(inst, on.grid.degrees(), on.knobs).layer["compute"] / 3
    assert x > 2 * f                                  # slower than the next layer's backward
    assert r_on.breakdown_s["offload"] == pytest.approx(1 * 10 * (2 * x - 3 * f), rel=1e-9)
    assert not r_on.violations


def test_offload_makes_a_plan_fit():
    """A 2.6 B GPT on one A100-40GB: 18 bytes per parameter (47 GB) do not fit in 36 GiB
    whatever the recompute; with the optimizer states on the host (6 bytes per parameter
    left on the GPU) the plan fits."""
    doc = {"model": {"layers": 32, "hidden": 2560, "heads": 32, "vocab": 51200,
                     "seq_len": 2048},
           "training": {"global_batch": 8},
           "cluster": {"gpu": "a100-40gb", "gpus": 1},
           "constraints": {"max_micro_batch": 2}}
    with pytest.raises(InfeasibleError):
        solve(parse_instance({**doc, "constraints": {"max_micro_batch": 2,
                                                     "optimizer_offload": False}}),
              solver="enumerate", explain=False)
    res = solve(parse_instance(doc), solver="enumerate")
    p = res.report.plan
    assert p.optimizer_offload and res.report.fits
    assert res.report.memory_gib["optimizer_states"] == 0.0
    assert res.report.memory_gib["total"] <= res.report.memory_gib["limit"]


def test_host_memory_limit_binds():
    """The same plan on a host of 64 GiB: a third kept free (the default reserve), 5.3 GiB
    per GPU of a DGX A100, less than the 39 GiB of optimizer states one GPU would offload:
    no plan, and an offloaded plan's report names the keys."""
    doc = {"model": {"layers": 32, "hidden": 2560, "heads": 32, "vocab": 51200,
                     "seq_len": 2048},
           "training": {"global_batch": 8},
           "cluster": {"gpu": "a100-40gb", "gpus": 1, "host_memory_GiB": 64.0},
           "constraints": {"max_micro_batch": 2}}
    inst = parse_instance(doc)
    with pytest.raises(InfeasibleError) as err:
        solve(inst, solver="enumerate")
    why = err.value.explanation[0]
    assert why.startswith("host memory binds") and "cluster.host_memory_GiB = 64" in why
    plan = plan_from_spec(inst, _spec({"micro_batch": 1, "recompute": "full",
                                       "optimizer_offload": True}))
    rep = evaluate(inst, plan)
    assert rep.memory_gib["host_limit"] == pytest.approx(64 * 2 / 3 / 8)
    bad = [v for v in rep.violations if v.startswith("host memory")]
    assert len(bad) == 1 and "cluster.host_memory_GiB = 64" in bad[0]
    assert "constraints.host_memory_reserve_GiB" in bad[0]
    # a smaller reserve does not help enough; a larger host does
    roomy = parse_instance({**doc, "cluster": {**doc["cluster"], "host_memory_GiB": 2048.0}})
    assert evaluate(roomy, plan).fits


def test_search_decides_activation_offload_within_megatron_rules():
    """A pinned layer count leaves only plans Megatron-Core runs: pp = 1, no recompute."""
    doc = llama8b_one_node(offload_layers=16)
    res = solve(parse_instance(doc), solver="enumerate")
    p = res.report.plan
    assert p.offload_layers == 16 and p.pp == 1 and p.recompute == "none"
    assert res.report.fits
    # evaluate names each rule a plan breaks
    inst = parse_instance(llama8b_one_node())
    bad = evaluate(inst, plan_from_spec(inst, _spec({
        "tp": 1, "pp": 2, "dp": 4, "recompute": "full", "offload_layers": 32}))).violations
    text = " | ".join(bad)
    assert "needs pp = 1" in text and "needs recompute = \"none\"" in text
    assert "below the model's 32 layers" in text


def test_frameworks_refuse_what_they_do_not_run():
    inst = parse_instance(llama8b_one_node(framework="torchtitan"))
    plan = plan_from_spec(inst, _spec({"dp": 8, "dp_sharding": "optim_grads_params",
                                       "optimizer_offload": True}))
    assert any("torchtitan offloads the optimizer not at all" in v
               for v in evaluate(inst, plan).violations)
    with pytest.raises(InputError) as err:
        emit(inst, plan, "torchtitan")
    assert "CPUOffloadPolicy" in " ".join(err.value.problems)
    # the search never offers it there
    res = solve(parse_instance(llama8b_one_node(framework="torchtitan", max_micro_batch=1,
                                                tp=1, pp=1)), solver="enumerate")
    assert not res.report.plan.optimizer_offload and not res.report.plan.offload_layers
    # Megatron offloads the optimizer with the distributed optimizer only
    meg = parse_instance(llama8b_one_node(framework="megatron"))
    p = plan_from_spec(meg, _spec({"dp": 8, "dp_sharding": "optim_grads_params",
                                   "optimizer_offload": True}))
    with pytest.raises(InputError) as err:
        emit(meg, p, "megatron")
    assert "dp_sharding = \"optim\"" in " ".join(err.value.problems)


@pytest.mark.parametrize("framework", ["deepspeed", "torchtitan"])
def test_pinned_activation_offload_under_a_framework_without_it_is_what_binds(framework):
    # before, the pin reached the solvers, every backend returned a plan its evaluator refused
    # (exit 4); now the search explains the pin leaves no plan (found by a fuzzer)
    inst = parse_instance({"model": {"preset": "gpt-1.3b", "layers": 4},
                           "training": {"global_batch": 1},
                           "cluster": {"gpu": "h100-sxm", "gpus": 1},
                           "constraints": {"offload_layers": 1, "framework": framework}})
    for backend in ("enumerate", "cpsat"):
        with pytest.raises(InfeasibleError) as err:
            solve(inst, solver=backend)
        text = " ".join(err.value.explanation)
        assert "constraints.offload_layers = 1" in text and framework in text


def test_exports_carry_the_offload():
    inst = parse_instance(llama8b_one_node())
    both = plan_from_spec(inst, _spec({"dp": 8, "dp_sharding": "optim", "recompute": "none",
                                       "optimizer_offload": True, "offload_layers": 8}))
    meg = emit(inst, both, "megatron")
    for flag in ("--optimizer-cpu-offload", "--overlap-cpu-optimizer-d2h-h2d",
                 "--use-precision-aware-optimizer", "--cpu-offloading-num-layers 8"):
        assert flag in meg
    assert "--cpu-offloading " not in meg       # (no such Megatron-LM flag: argparse exits)
    nemo = emit(inst, both, "nemo")
    assert "optimizer_cpu_offload: true" in nemo and "cpu_offloading_num_layers: 8" in nemo
    with pytest.raises(InputError) as err:            # DeepSpeed has no activation offload
        emit(inst, both, "deepspeed")
    assert "DeepSpeed has no activation offload" in " ".join(err.value.problems)
    ds = json.loads(emit(inst, replace(both, offload_layers=0), "deepspeed"))
    assert ds["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    plain = json.loads(emit(inst, replace(both, offload_layers=0, optimizer_offload=False),
                            "deepspeed"))
    assert "offload_optimizer" not in plain["zero_optimization"]
    assert "--optimizer-cpu-offload" not in emit(inst, replace(both, optimizer_offload=False),
                                                 "megatron")
    doc = plan_from_spec(inst, _spec({"dp": 8, "optimizer_offload": True})).to_dict()
    assert doc["optimizer_offload"] is True and doc["offload_layers"] == 0


@pytest.mark.parametrize("constraints, cluster, key", [
    ({"offload_layers": 9, "max_offload_layers": 4}, {}, "max_offload_layers"),
    ({"offload_layers": -1}, {}, "constraints.offload_layers"),
    ({"host_memory_reserve_GiB": 4096.0}, {}, "constraints.host_memory_reserve_GiB"),
    ({}, {"host_memory_GiB": 0.0}, "cluster.host_memory_GiB"),
    ({}, {"host_link_bandwidth_GBps": -2.0}, "cluster.host_link_bandwidth_GBps"),
    ({"optimizer_offload": "yes"}, {}, "constraints.optimizer_offload"),
    # Llama 3 8B has 32 layers: offloading all of them is not Megatron-Core's rule (a fuzzer
    # found it reached the solvers and failed the evaluator's check, exit 4)
    ({"offload_layers": 32}, {}, "constraints.offload_layers: 32 is not below"),
])
def test_input_errors_name_the_key(constraints, cluster, key):
    doc = llama8b_one_node(**constraints)
    doc["cluster"].update(cluster)
    with pytest.raises(InputError) as err:
        parse_instance(doc)
    assert key in str(err.value) + " ".join(err.value.problems)


def test_activation_offload_makes_a_plan_fit_under_a_cap():
    """GPT 1.3B at micro-batch 16 on one H100 without recompute needs 82.6 GiB: it does not
    fit. Under ``max_offload_layers`` the search offloads the fewest layers of its set (0,
    L/2 = 12, L - 1 = 23) that fit, 12, and every backend agrees (one-GPU space)."""
    doc = {"model": {"preset": "gpt-1.3b"}, "training": {"global_batch": 16},
           "cluster": {"gpu": "h100-sxm", "gpus": 1},
           "constraints": {"micro_batch": 16, "recompute": "none", "optimizer_offload": False}}
    with pytest.raises(InfeasibleError):
        solve(parse_instance(doc), solver="enumerate", explain=False)
    doc["constraints"]["max_offload_layers"] = 23
    inst = parse_instance(doc)
    results = [solve(inst, solver=s) for s in ("enumerate", "cpsat", "highs")]
    for res in results:
        assert res.report.plan.offload_layers == 12 and res.report.fits
        assert res.report.breakdown_s["offload"] > 0          # PCIe: the transfers show
        assert res.objective == pytest.approx(results[0].objective, rel=1e-5)


def test_offload_with_partial_recompute_keeps_its_host_bytes():
    """Megatron's block recompute of some layers mixes the stages' activations; the offloaded
    optimizer bytes on the host are the same as under full recompute."""
    inst = parse_instance(llama8b_one_node())
    part = evaluate(inst, llama8b_plan(inst, optimizer_offload=True, recompute_layers=4))
    full = evaluate(inst, llama8b_plan(inst, optimizer_offload=True))
    assert part.memory_gib["host_offload"] == pytest.approx(full.memory_gib["host_offload"])
    assert part.memory_gib["activations"] > full.memory_gib["activations"]
    assert part.memory_gib["optimizer_states"] == 0.0


def test_bf16_optimizer_states_offload_their_own_bytes():
    """With ``optimizer_dtype = "bf16"`` (two bf16 moments, a bf16 gradient shard) the host
    holds 6 bytes per shard parameter and the CPU step touches 14 (as the GPU's)."""
    doc = llama8b_one_node()
    doc["training"]["optimizer_dtype"] = "bf16"
    inst = parse_instance(doc)
    rep = evaluate(inst, llama8b_plan(inst, optimizer_offload=True))
    shard = LLAMA3_8B_PARAMS / 8
    assert rep.memory_gib["host_offload"] * GiB == pytest.approx(6 * shard, rel=5e-3)
    assert rep.breakdown_s["optimizer"] == pytest.approx(14 * shard / (614.4e9 / 8 / 6),
                                                         rel=5e-3)


@pytest.mark.parametrize("recipe, refused", [("tensorwise", True), ("delayed", False),
                                             (None, False)])
def test_optimizer_offload_takes_fp8_parameters_under_delayed_scaling_only(recipe, refused):
    """Megatron-LM's validate_args: with --fp8-param-gather the optimizer CPU offload needs
    --fp8-recipe delayed (its default). A plan breaking it is a violation and gets no export,
    a pin of it is explained, and the search leaves it out (an audit found the export
    written)."""
    doc = llama8b_one_node()
    doc["training"].update(precision="fp8", fp8_param_gather=True,
                           **({"fp8_recipe": recipe} if recipe else {}))
    inst = parse_instance(doc)
    plan = llama8b_plan(inst, optimizer_offload=True)
    broken = [v for v in evaluate(inst, plan).violations if "fp8_recipe" in v]
    assert bool(broken) == refused
    if refused:
        with pytest.raises(InputError, match="delayed"):
            emit(inst, plan, "megatron")
        with pytest.raises(InfeasibleError) as err:
            solve(parse_instance({**doc, "constraints": {"optimizer_offload": True}}),
                  solver="enumerate", explain=False)
        assert "needs fp8_recipe = \"delayed\"" in " ".join(err.value.explanation)
        free = solve(inst, solver="enumerate", explain=False).report.plan
        assert not free.optimizer_offload

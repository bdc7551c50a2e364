"""Framework rules that the export refuses and the search leaves (planner/model/frameworks.py):
a plan the named framework cannot start is an export error naming the rule, and the optimum
``plan solve FILE --emit FMT`` searches for is one the framework runs.

The torchtitan conditions are checked as torchtitan 0.2.2 states them
(distributed/parallel_dims.py): FSDP is applied when dp_shard > 1 or cp > 1, else the DDP
branch of parallelize raises beside any other mesh dimension; build_mesh needs
ep * etp to divide dp_shard * cp * tp (etp = 1 in the exports).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from formulations.solve import solve
from planner.app.emit import emit
from planner.model.errors import InputError
from planner.model.evaluate import evaluate
from planner.model.frameworks import framework_violations
from planner.model.instance import Instance, load_instance, parse_instance
from planner.model.plan import Plan, plan_from_spec
from planner.model.schema import PlanSpec

INSTANCES = Path(__file__).resolve().parent.parent / "instances"


def _inst(name: str, framework: str | None = None) -> Instance:
    inst = load_instance(INSTANCES / name)
    if framework:
        inst = inst.with_spec(constraints=inst.spec.constraints.model_copy(
            update={"framework": framework}))
    return inst


def _torchtitan_applies_fsdp_or_runs_1d(plan: Plan) -> bool:
    """torchtitan's parallelize: FSDP (dp_shard > 1 or cp > 1), or DDP / nothing on a world
    that is the data-parallel mesh alone."""
    shard = 1 if plan.dp_sharding == "none" else plan.dp_shard_size
    return shard > 1 or plan.cp > 1 or plan.dp == 1 or max(plan.tp, plan.pp) == 1


def _torchtitan_mesh_builds(plan: Plan) -> bool:
    """torchtitan's build_mesh: efsdp = dp_shard * cp * tp // ep, a whole mesh dimension."""
    shard = 1 if plan.dp_sharding == "none" else plan.dp_shard_size
    return (shard * plan.cp * plan.tp) % plan.ep == 0


def _refused(inst: Instance, plan: Plan, fmt: str, needle: str) -> None:
    with pytest.raises(InputError, match="cannot be written") as err:
        emit(inst, plan, fmt)
    assert needle in str(err.value)


# ------------------------------------------------------------------------ torchtitan: DDP branch

def test_torchtitan_refuses_a_shard_group_of_one_beside_tensor_parallelism():
    """HSDP with a shard group of one rank and no context parallelism is torchtitan's DDP,
    which raises "DDP has not supported > 1D parallelism" beside tp / pp."""
    inst = _inst("llama3.1-405b-h100.toml")
    plan = plan_from_spec(inst, inst.spec.plan, dp_sharding="optim_grads_params",
                          dp_shard_size=1, recompute_layers=0)
    assert plan.dp_replicate == plan.dp > 1 and plan.tp > 1
    assert not _torchtitan_applies_fsdp_or_runs_1d(plan)
    _refused(inst, plan, "torchtitan", "dp_shard_size = 1 without context parallelism")
    # a shard group of two is FSDP2 (HSDP): written
    two = plan_from_spec(inst, inst.spec.plan, dp_sharding="optim_grads_params",
                         dp_shard_size=2, recompute_layers=0)
    assert "data_parallel_shard_degree = 2" in emit(inst, two, "torchtitan")


def test_torchtitan_search_returns_a_plan_torchtitan_starts():
    """``plan solve instances/llama3.1-405b-h100.toml --emit torchtitan`` chose a shard group
    of one beside TP8 PP32 before the rule; the optimum under torchtitan now applies FSDP."""
    inst = _inst("llama3.1-405b-h100.toml", "torchtitan")
    plan = solve(inst, solver="enumerate").report.plan
    assert _torchtitan_applies_fsdp_or_runs_1d(plan), plan.label()
    assert framework_violations("torchtitan", plan) == []
    emit(inst, plan, "torchtitan")


def test_evaluate_under_torchtitan_without_a_sharding_mode_is_fsdp():
    """A ``[plan]`` that names no sharding mode is evaluated with the distributed optimizer,
    which torchtitan does not have; under it the plan is torchtitan's own default, FSDP2 over
    every data-parallel rank (``data_parallel_shard_degree = -1``), and runs (no violation, a
    config torchtitan starts). Named, the distributed optimizer stays a violation."""
    inst = _inst("gpt3-175b-a100.toml", "torchtitan")
    unnamed = inst.spec.plan.model_copy(update={"vp": 1})
    unnamed = PlanSpec(**{k: v for k, v in unnamed.model_dump(exclude_unset=True).items()
                          if k != "distributed_optimizer"})
    plan = plan_from_spec(inst, unnamed)
    assert plan.dp_sharding == "optim_grads_params" and plan.dp_shard_size == plan.dp
    assert framework_violations("torchtitan", plan) == []
    emit(inst, plan, "torchtitan")
    plain = _inst("gpt3-175b-a100.toml")             # no framework named: ZeRO-1, as before
    assert plain.spec.constraints.framework is None
    assert plan_from_spec(plain, unnamed).dp_sharding == "optim"
    named = plan_from_spec(inst, inst.spec.plan.model_copy(update={"vp": 1}))
    assert any('not "optim"' in v for v in framework_violations("torchtitan", named))


def test_an_export_refused_under_another_named_framework_says_how_to_get_one():
    """A plan costed under ``framework = "megatron"`` (ZeRO-1) cannot be a torchtitan launch;
    the error names the framework that costed it and the key that would give a plan torchtitan
    runs. Without a named framework the refusal stands alone."""
    megatron = _inst("gpt3-175b-a100.toml", "megatron")
    plan = plan_from_spec(megatron, megatron.spec.plan.model_copy(update={"vp": 1}))
    with pytest.raises(InputError) as named:
        emit(megatron, plan, "torchtitan")
    assert any('costed under constraints.framework = "megatron"' in d
               and 'set framework = "torchtitan"' in d for d in named.value.problems)
    plain = _inst("gpt3-175b-a100.toml")
    with pytest.raises(InputError) as unnamed:
        emit(plain, plan_from_spec(plain, plain.spec.plan.model_copy(update={"vp": 1})),
             "torchtitan")
    assert not any("costed under" in d for d in unnamed.value.problems)
    assert any('not "optim"' in d for d in unnamed.value.problems)


def test_evaluate_under_torchtitan_reports_the_shard_group_rule():
    """The search's form of the rule (memory no GPU has) and evaluate's sentence agree."""
    inst = _inst("llama3.1-405b-h100.toml", "torchtitan")
    plan = plan_from_spec(inst, inst.spec.plan, dp_sharding="optim_grads_params",
                          dp_shard_size=1, recompute_layers=0)
    report = evaluate(inst, plan)
    assert any("dp_shard_size = 1 without context parallelism" in v for v in report.violations)


# ------------------------------------------------------------------- torchtitan: expert mesh

def test_torchtitan_refuses_expert_parallelism_beyond_its_shard_cp_tp_ranks():
    """DeepSeek-V3 with EP128 over a shard group of one and TP8: efsdp = 8 // 128 = 0."""
    inst = _inst("deepseek-v3-h800.toml")
    plan = plan_from_spec(inst, inst.spec.plan, tp=8, dp=16, ep=128,
                          dp_sharding="optim_grads_params", dp_shard_size=1)
    assert not _torchtitan_mesh_builds(plan)
    _refused(inst, plan, "torchtitan", "ep = 128 must divide dp_shard_size * cp * tp")
    # the replicas are outside the expert grid: a shard group of 16 carries EP128 with TP8
    fits = plan_from_spec(inst, inst.spec.plan, tp=8, dp=16, ep=128,
                          dp_sharding="optim_grads_params", dp_shard_size=16)
    assert _torchtitan_mesh_builds(fits)
    assert "expert_parallel_degree = 128" in emit(inst, fits, "torchtitan")


def test_torchtitan_search_keeps_expert_parallelism_inside_the_shard_group():
    inst = _inst("deepseek-v3-h800.toml", "torchtitan")
    plan = solve(inst, solver="enumerate").report.plan
    assert plan.ep > 1
    assert _torchtitan_mesh_builds(plan) and _torchtitan_applies_fsdp_or_runs_1d(plan), \
        plan.label()
    emit(inst, plan, "torchtitan")


# ------------------------------------------------------------------------------------ DeepSpeed

@pytest.mark.parametrize("overrides, needle", [
    ({"vp": 3}, "vp = 3: DeepSpeed has no interleaved pipeline"),
    ({"vp": 1, "cp": 2, "dp": 8}, "cp = 2: DeepSpeed has no context parallelism"),
])
def test_deepspeed_refuses_interleaving_and_context_parallelism(overrides, needle):
    inst = _inst("gpt3-175b-a100.toml")
    plan = plan_from_spec(inst, inst.spec.plan, **overrides)
    _refused(inst, plan, "deepspeed", needle)


def test_deepspeed_search_has_no_interleaving_nor_context_parallelism():
    """``--emit deepspeed`` chose TP4 PP2 CP2 VP5 for Llama 3 70B before the rules."""
    inst = _inst("llama3-70b-h100.toml", "deepspeed")
    plan = solve(inst, solver="enumerate").report.plan
    assert plan.vp == 1 and plan.cp == 1, plan.label()
    emit(inst, plan, "deepspeed")


# ---------------------------------------------------------------- DeepSpeed: overlap_comm by stage

def _deepspeed_small(**constraints) -> Instance:
    """A 24-layer, 4096-wide GPT on four A100 nodes under DeepSpeed, with a [plan] of plain
    data parallelism (its sharding mode given by the test)."""
    return parse_instance({
        "model": {"layers": 24, "hidden": 4096, "heads": 32, "vocab": 51200,
                  "seq_len": 2048},
        "training": {"global_batch": 256},
        "cluster": {"gpu": "a100-80gb", "nodes": 4},
        "constraints": {"framework": "deepspeed", **constraints},
        "plan": {"tp": 1, "pp": 1, "dp": 32, "micro_batch": 1}}, "test")


@pytest.mark.parametrize("mode, stage, on", [("optim", 1, False), ("optim_grads", 2, False),
                                             ("optim_grads_params", 3, True)])
def test_deepspeed_overlaps_the_gradient_reduction_of_zero3_alone_by_default(mode, stage, on):
    """DeepSpeed's zero_optimization.overlap_comm left unset is ``stage == 3``
    (deepspeed/runtime/zero/config.py, DeepSpeedZeroConfig.overlap_comm_valid): a plan that
    names no overlap is costed and exported so, per sharding mode, and a pin still wins."""
    inst = _deepspeed_small()
    plan = plan_from_spec(inst, inst.spec.plan, dp_sharding=mode)
    assert plan.overlap_grad_reduce is on
    zero = json.loads(emit(inst, plan, "deepspeed"))["zero_optimization"]
    assert (zero["stage"], zero["overlap_comm"]) == (stage, on)
    pinned = _deepspeed_small(overlap_grad_reduce=False)
    assert plan_from_spec(pinned, pinned.spec.plan, dp_sharding=mode).overlap_grad_reduce is False


def test_deepspeed_search_takes_each_modes_own_overlap_and_the_backends_agree():
    """The search's combinations carry the switch of their mode (ZeRO-3 overlapped, ZeRO-2
    not), and the three backends, which see it move with the sharding mode as one categorical
    dimension, return the same optimum and plan: between ZeRO-2 and ZeRO-3 here, ZeRO-3 with
    its gradient reduction overlapped (2.78 s per step, 2.85 s with the overlap pinned off)."""
    from formulations.solve import space_of

    inst = _deepspeed_small(dp_sharding=["optim_grads", "optim_grads_params"])
    by_mode = {(k.dp_sharding, k.overlap_grad_reduce) for k in space_of(inst).combos}
    assert by_mode == {("optim_grads", False), ("optim_grads_params", True)}
    # (one model per sharding mode there; at pp = 1 the space is small enough for one joint
    # model, whose combinations without the overlap carry its maxima at zero,
    # Knobs.overlap_maxes: with the two modes, and with every mode, where ZeRO-1 wins)
    for case in (inst, _deepspeed_small(pp=1, dp_sharding=["optim_grads", "optim_grads_params"]),
                 _deepspeed_small(pp=1)):
        answers = {b: solve(case, solver=b).report for b in ("enumerate", "cpsat", "highs")}
        ref = answers["enumerate"]
        for b, rep in answers.items():
            assert rep.plan == ref.plan, b
            assert rep.step_time_s == pytest.approx(ref.step_time_s, rel=1e-6), b
        if case.spec.constraints.dp_sharding:
            assert ref.plan.dp_sharding == "optim_grads_params" and ref.plan.overlap_grad_reduce


def test_the_search_without_a_framework_keeps_interleaving():
    """The rules bind only a named framework: the GPT-3 optimum stays interleaved."""
    inst = _inst("gpt3-175b-a100.toml")
    plan = solve(inst, solver="enumerate").report.plan
    assert plan.vp > 1


# ------------------------------------------------------------- Megatron-LM: validate_args overlaps

def _megatron_p2p_off(framework: str | None) -> Instance:
    """GPT-3 175B on 4 A100 nodes, the pipeline pinned at two ranks and the p2p overlap off,
    where an interleaved plan wins when no framework rule applies."""
    return parse_instance({
        "model": {"preset": "gpt3-175b"}, "training": {"global_batch": 64},
        "cluster": {"gpu": "a100-80gb", "nodes": 4},
        "constraints": {"overlap_p2p_comm": False, "pp": 2,
                        **({"framework": framework} if framework else {})}}, "test")


def test_megatron_search_leaves_interleaving_on_two_ranks_without_p2p_overlap():
    """Megatron-LM's validate_args asserts pp > 2 for an interleaved schedule without p2p
    overlap. The rule lived in the export alone: the search proved optimal a plan the launch
    then refused. Every backend leaves it now, and agrees (an audit of 2026-12-05)."""
    free = solve(_megatron_p2p_off(None), solver="enumerate").report.plan
    assert free.vp > 1 and free.pp == 2              # (the rule binds on this instance)
    found = {}
    for backend in ("cpsat", "highs", "enumerate"):
        res = solve(_megatron_p2p_off("megatron"), solver=backend)
        assert res.status.value == "optimal"
        found[backend] = (res.report.plan.to_spec(), res.report.step_time_s)
        assert res.report.plan.vp == 1 and not res.report.violations
        emit(_megatron_p2p_off("megatron"), res.report.plan, "megatron")   # launchable
    specs = {repr(spec) for spec, _ in found.values()}
    times = [t for _, t in found.values()]
    assert len(specs) == 1 and max(times) - min(times) < 1e-9 * max(times)


def test_evaluate_under_megatron_reports_interleaving_on_two_ranks_without_p2p_overlap():
    inst = _megatron_p2p_off("megatron")
    plan = plan_from_spec(inst, PlanSpec(tp=8, pp=2, vp=4, dp=2, overlap_p2p_comm=False))
    assert any("overlap_p2p_comm = false needs pp > 2" in v for v in evaluate(inst, plan).violations)
    # NeMo builds Megatron-Core's configs without validate_args
    nemo = _megatron_p2p_off("nemo")
    assert not framework_violations("nemo", plan_from_spec(
        nemo, PlanSpec(tp=8, pp=2, vp=4, dp=2, overlap_p2p_comm=False)))


@pytest.mark.parametrize("framework, refused", [("megatron", True), ("nemo", False), (None, False)])
def test_a_param_gather_overlap_pin_without_grad_reduce_overlap_is_refused_under_megatron(
        framework, refused):
    """Megatron-LM's default leaves grad-reduce overlap off, so a pin of the parameter-gather
    overlap alone was searched as a plan validate_args refuses ('Must use
    --overlap-param-gather with --overlap-grad-reduce')."""
    inst = _inst("gpt3-175b-a100.toml")
    update = {"framework": framework, "overlap_param_gather": True}
    if refused:
        with pytest.raises(Exception, match="overlap_param_gather = true needs "
                                            "overlap_grad_reduce = true under Megatron-LM"):
            inst.spec.constraints.model_validate({**inst.spec.constraints.model_dump(), **update})
    else:
        inst.spec.constraints.model_validate({**inst.spec.constraints.model_dump(), **update})
    both = {**update, "overlap_grad_reduce": True}
    inst.spec.constraints.model_validate({**inst.spec.constraints.model_dump(), **both})


@pytest.mark.parametrize("precision, reduce, kept", [
    ("bf16", "fp32", True),     # BF16_Optimizer: 16-bit gradients beside the fp32 buffer
    ("fp8", "fp32", True),      # (bf16.enabled, the same optimizer)
    ("bf16", "bf16", False),    # accumulated in bf16: one 16-bit copy
    ("fp16", "fp32", False),    # fp16 runs DeepSpeed's ZeRO optimizer, not BF16_Optimizer
])
def test_deepspeed_bf16_optimizer_keeps_16bit_gradients(precision, reduce, kept):
    """Under DeepSpeed at ZeRO-1 a stage holds fp32 gradients (4 bytes a parameter) and, where
    BF16_Optimizer runs, the 16-bit ones beside them (2 more; deepspeed/runtime/
    bf16_optimizer.py): the same plan under Megatron-LM's rules, which accumulate straight into
    the fp32 main gradients, holds 2 bytes a parameter fewer. Hand count: the first stage's
    gradient bytes over its fp32 gradient bytes."""
    doc = {"model": {"preset": "gpt-1.3b"},
           "training": {"global_batch": 64, "precision": precision,
                        "grad_reduce_dtype": reduce},
           "cluster": {"gpu": "h100-sxm", "gpus": 8},
           "plan": {"tp": 1, "pp": 2, "dp": 4, "micro_batch": 1, "dp_sharding": "optim",
                    "recompute": "full", "sequence_parallel": False}}
    grads = {}
    for fw in ("deepspeed", "megatron"):
        inst = parse_instance({**doc, "constraints": {"framework": fw}})
        rep = evaluate(inst, plan_from_spec(inst, inst.spec.plan), spec=inst.spec.plan)
        grads[fw] = rep.memory_by_stage_gib["first"]["gradients"]
    ratio = grads["deepspeed"] / grads["megatron"]
    wire = 4 if reduce == "fp32" else 2
    assert ratio == pytest.approx((wire + 2) / wire if kept else 1.0, rel=1e-9)

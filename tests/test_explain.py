"""Infeasible instances are explained: which limit binds, by how much, the nearest change, and
exit code 3 from the CLI (never a traceback)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from formulations.solve import solve
from planner.app.cli import app
from planner.model.errors import InfeasibleError
from planner.model.instance import parse_instance


def explain(doc):
    with pytest.raises(InfeasibleError) as info:
        solve(parse_instance(doc))
    return str(info.value)


def test_batch_that_no_dp_divides():
    msg = explain({"model": {"layers": 4, "hidden": 512, "heads": 8, "vocab": 1000,
                             "seq_len": 512},
                   "training": {"global_batch": 7}, "cluster": {"gpu": "h100-sxm", "gpus": 8},
                   "constraints": {"max_tp": 1, "max_pp": 1}})
    assert "no dp x micro_batch divides the global batch 7 on 8 GPUs" in msg
    assert "nearest change: a global batch of 8" in msg


def test_weights_alone_do_not_fit_and_divisibility_restricts_pp():
    doc = {"model": {"preset": "mt-nlg-530b"}, "training": {"global_batch": [1024, 8192]},
           "cluster": {"gpu": "a100-80gb", "gpus": 5128},
           # TP may cross nodes; replicated parameters (sharded ones fit: ZeRO-3 on 5128 GPUs
           # needs 1.9 GiB per GPU for the states)
           "constraints": {"tp_within_node": False, "dp_sharding": ["none", "optim"]}}
    msg = explain(doc)
    assert "weights + gradients + optimizer states alone need" in msg
    # 105 layers on 5128 = 8 x 641 GPUs: pp = 2 only with an uneven layout (106 = 2 x 53, one
    # stage one layer short), pp = 4 with the first / last stages two short (25, 27, 27, 26:
    # the search's own shortfall, planner/model/plan.py stage_shortfall; pp = 8, four short, is
    # left out: pp = 4 is as deep within a factor of two)
    assert "pp can only be [1, 2, 4]" in msg and "105 layers" in msg
    # lifting the sharding pin lets a plan fit (every what-if is tried, schema.WHAT_IFS) ...
    assert 'nearest change: lift constraints.dp_sharding = ["none", "optim"]' in msg
    # ... and under it the nearest larger cluster is the one offered when nothing lifts
    from formulations.explain import _larger_cluster
    (bigger,) = _larger_cluster(parse_instance(doc))
    assert bigger.startswith("nearest change: 642 nodes")


def test_a_lifted_constraint_is_suggested():
    msg = explain({"model": {"preset": "gpt3-175b"}, "training": {"global_batch": 512},
                   "cluster": {"gpu": "a100-80gb", "nodes": 32},
                   "constraints": {"max_pp": 1, "max_tp": 8, "tp_within_node": False,
                                   "dp_sharding": "optim"}})
    assert "no plan fits in GPU memory" in msg
    # (a cap is raised to the least value that lets a plan fit)
    assert "nearest change: raise constraints.max_pp from 1 to 2" in msg
    assert "nearest change: raise constraints.max_tp from 8 to 16" in msg


def test_dp_cap_is_named():
    msg = explain({"model": {"layers": 2, "hidden": 64, "heads": 1, "vocab": 1000,
                             "seq_len": 512},
                   "training": {"global_batch": 1}, "cluster": {"gpu": "a100-80gb", "nodes": 1},
                   "constraints": {"max_dp": 1}})
    assert "max_dp = 1 binds" in msg


LLAMA8_16 = {"model": {"preset": "llama3-8b"}, "training": {"global_batch": 512},
             "cluster": {"gpu": "h100-sxm", "nodes": 2}}


def test_a_dp_pin_is_named_alone_with_the_nearest_allowed_value():
    msg = explain({**LLAMA8_16, "constraints": {"dp": 7}})
    assert "constraints.dp = 7 binds" in msg and "max_dp" not in msg and "None" not in msg
    assert "dp can only be one of [1, 2, 4, 8, 16]" in msg
    assert "nearest change: dp = 8" in msg


def test_a_micro_batch_pin_names_the_rule_it_breaks():
    msg = explain({**LLAMA8_16, "constraints": {"micro_batch": 1000}})
    assert "must satisfy micro_batch * dp divides the global batch (512)" in msg
    assert "nearest change: micro_batch = 512" in msg


@pytest.mark.parametrize("key, pin, near", [("micro_batch", 7, 8), ("cp", 7, 8)])
def test_a_pin_between_allowed_values_suggests_the_nearest_above_it_too(key, pin, near):
    """The cap a pin raises (max_micro_batch, max_cp) is lifted with the pin: micro_batch = 7
    listed only [1, 2, 4] and suggested 4, cp = 7 suggested 4 (an audit), where 8 solves."""
    doc = {**LLAMA8_16, "training": {"global_batch": 256}, "constraints": {key: pin}}
    msg = explain(doc)
    assert f"nearest change: {key} = {near}" in msg
    doc["constraints"] = {key: near}
    assert solve(parse_instance(doc), solver="enumerate").report is not None


def test_a_batch_split_explanation_says_when_memory_binds_too_and_names_a_dp_pin():
    """An audit applied 'a global batch of 2050' to Llama 3 405B on 40 H100 and met an
    out-of-memory answer the first message never hinted at; and a dp pin that left no batch
    split went unnamed."""
    msg = explain({"model": {"preset": "llama3-405b"}, "training": {"global_batch": 2048},
                   "cluster": {"gpu": "h100-sxm", "nodes": 5}})
    assert "nearest change: a global batch of 2050" in msg
    assert "memory binds too: with training.global_batch = 2050" in msg
    assert "lifting any one would leave a plan" not in msg
    msg = explain({**LLAMA8_16, "training": {"global_batch": 7}, "constraints": {"dp": 2}})
    assert "constraints.dp = 2 leaves dp one of [2]; lifting it allows dp in [1, 2, 4, 8, 16]" \
        in msg
    assert "or a GPU count whose data-parallel degree divides" not in msg


def test_the_suggested_min_mfu_solves_as_written():
    """The suggestion is rounded down: 'min_mfu <= 0.556' for a reach of 0.55579 failed again
    when applied (an audit)."""
    import re
    doc = {"model": {"preset": "gpt-1.3b"}, "training": {"global_batch": 64, "tokens": 26e9},
           "cluster": {"gpu": "a100-80gb", "nodes": 1}, "constraints": {"min_mfu": 0.6}}
    msg = explain(doc)
    value = float(re.search(r"nearest change: min_mfu = ([0-9.]+)", msg).group(1))
    assert value < 0.6
    doc["constraints"]["min_mfu"] = value
    assert solve(parse_instance(doc), solver="enumerate").report is not None


def test_cli_exit_code_3_without_traceback(tmp_path):
    path = tmp_path / "x.toml"
    path.write_text('[model]\npreset = "gpt3-175b"\n[training]\nglobal_batch = 7\n'
                    '[cluster]\ngpu = "a100-80gb"\nnodes = 1\n')
    result = CliRunner().invoke(app, ["solve", str(path)])
    assert result.exit_code == 3
    text = result.output + (result.stderr if result.stderr_bytes is not None else "")
    assert "Traceback" not in text
    # GPT-3 175B on one node: what binds is memory, not the batch of 7 (dp = 1 divides it),
    # and the explanation's nearest change is a second node
    assert text.startswith("error: no plan fits in GPU memory\n"), text
    assert "weights + gradients + optimizer states alone need 122.0 GiB per GPU" in text
    assert "nearest change: 2 nodes (16 GPUs)" in text


def test_the_binding_rule_is_named_from_the_rule_table():
    """The explanation names the rule (as the rule table says it) whose rows alone leave no
    plan: here only the batch rule binds; a plan exists as soon as it is lifted."""
    msg = explain({"model": {"layers": 4, "hidden": 512, "heads": 8, "vocab": 1000,
                             "seq_len": 512},
                   "training": {"global_batch": 7}, "cluster": {"gpu": "h100-sxm", "gpus": 8},
                   "constraints": {"max_tp": 1, "max_pp": 1}})
    line = next(x for x in msg.splitlines() if "rules that bind on their own" in x)
    assert "dp*micro_batch divides the global batch" in line
    assert "tp divides heads" not in line


def test_a_shard_group_size_no_dp_admits_is_named():
    """constraints.dp_shard_size must divide dp: a size no plan's dp admits is the binding pin,
    with the sizes that would do (it was explained as the placement rules)."""
    msg = explain({"model": {"layers": 4, "hidden": 512, "heads": 8, "vocab": 1000,
                             "seq_len": 512},
                   "training": {"global_batch": 64}, "cluster": {"gpu": "h100-sxm", "nodes": 2},
                   "constraints": {"dp_shard_size": 3}})
    assert "constraints.dp_shard_size = 3 binds" in msg
    assert "dp_shard_size can only be one of 1, 2, 4, 8, 16" in msg
    assert "nearest change: dp_shard_size = 2" in msg


@pytest.mark.parametrize("constraints, words", [
    ({"framework": "deepspeed", "vp": 2}, "DeepSpeed has no interleaved pipeline"),
    ({"pp": 2, "offload_layers": 2}, "offload_layers = 2 needs pp = 1"),
])
def test_a_framework_rule_that_binds_is_named_not_charged_as_memory(constraints, words):
    # the rules are charged as memory no GPU has; before, the explanation read that charge as
    # a need ("148.2 GiB per GPU ... activations and logits the other 148.1 GiB"; a fuzzer)
    text = explain({"model": {"layers": 8, "hidden": 1024, "heads": 16, "vocab": 32000,
                               "seq_len": 2048},
                     "training": {"global_batch": 64},
                     "cluster": {"gpu": "a100-80gb", "nodes": 1}, "constraints": constraints})
    assert words in text and "GiB" not in text


def test_the_larger_cluster_scan_is_skipped_only_when_no_cluster_could_hold_the_weights():
    """The scan for a larger cluster (up to 8x the nodes) is skipped when the weights alone, one
    byte per parameter over all of the largest candidate's GPUs, exceed the limit: a lower bound
    of every plan's need. Where a larger cluster fits (MT-NLG 530B, 642 nodes, above), the bound
    does not skip it; a model of 2e19 parameters on one node is skipped at once."""
    from formulations.explain import _weights_alone_exceed
    from planner.model.instance import parse_instance

    big = parse_instance({"model": {"preset": "mt-nlg-530b"}, "training": {"global_batch": 1024},
                          "cluster": {"gpu": "a100-80gb", "gpus": 5128}})
    assert not _weights_alone_exceed(big, 642 * 8)
    assert not _weights_alone_exceed(big, 8)          # 530 GB over 8 GPUs: 66 GB each, < 74 GiB
    huge = parse_instance({"model": {"preset": "gpt-1.3b", "hidden": 4194304, "heads": 16,
                                     "layers": 100000},
                           "training": {"global_batch": 512},
                           "cluster": {"gpu": "a100-80gb", "nodes": 1}})
    assert _weights_alone_exceed(huge, 8 * 8)


def test_context_parallelism_needs_twice_cp_to_divide_the_sequence():
    """Megatron-LM's validate_args: 'seq-length should be a multiple of 2 *
    context-parallel-size'. seq_len 100 with cp = 4 was accepted (4 divides 100), and the
    Megatron export then refused the plan (an audit)."""
    doc = {"model": {"preset": "gpt-1.3b", "seq_len": 100}, "training": {"global_batch": 64},
           "cluster": {"gpu": "h100-sxm", "nodes": 1}, "constraints": {"cp": 4}}
    msg = explain(doc)
    assert "2*cp divides seq_len" in msg and "nearest change: cp = 2" in msg
    doc["constraints"] = {"cp": 2}
    assert solve(parse_instance(doc), solver="enumerate").report.plan.cp == 2
    doc["model"]["seq_len"] = 99                      # odd: context parallelism is off
    doc["constraints"] = {"max_cp": 8}
    assert solve(parse_instance(doc), solver="enumerate").report.plan.cp == 1


def test_sequence_parallelism_needs_tp_times_cp_to_divide_the_sequence():
    """Megatron-Core's sequence parallelism splits a rank's s / cp tokens over tp
    (tensor_parallel/mappings.py _split_along_first_dim asserts the split is whole): at
    seq_len 1020, tp = 8 with sequence parallelism is no plan; the explanation names the rule
    and both ways out, each of which solves, and the evaluator flags such a plan."""
    from planner.model.evaluate import evaluate
    from planner.model.plan import plan_from_spec
    from planner.model.schema import PlanSpec

    doc = {"model": {"preset": "gpt-1.3b", "seq_len": 1020}, "training": {"global_batch": 64},
           "cluster": {"gpu": "a100-80gb", "nodes": 1}, "constraints": {"tp": 8}}
    msg = explain(doc)
    assert "tp*cp divides seq_len (sequence parallelism)" in msg
    assert "nearest change: tp = 4 (or lift constraints.tp, or set " \
        "constraints.sequence_parallel = false)" in msg
    assert solve(parse_instance({**doc, "constraints": {"tp": 4}}),
                 solver="enumerate").report.plan.sequence_parallel
    off = parse_instance({**doc, "constraints": {"tp": 8, "sequence_parallel": False}})
    assert solve(off, solver="enumerate").report.plan.tp == 8
    spec = PlanSpec(tp=8, pp=1, dp=1, micro_batch=1, sequence_parallel=True)
    rep = evaluate(off, plan_from_spec(off, spec), spec=spec)
    assert any("sequence parallelism splits the 1020 tokens" in v for v in rep.violations)


def _applied(doc, line):
    """The instance with a 'nearest change' applied as written (the keys these tests use)."""
    import re
    doc = {**doc, "constraints": dict(doc.get("constraints", {}))}
    if m := re.search(r"raise constraints\.(\w+) from \S+ to (\d+)", line):
        doc["constraints"][m[1]] = int(m[2])
    elif m := re.search(r"lower constraints\.memory_reserve_GiB from \S+(?: \(the default\))? "
                        r"to ([0-9.]+)", line):
        doc["constraints"]["memory_reserve_GiB"] = float(m[1])
    elif m := re.search(r"lift constraints\.(\w+) =", line):
        doc["constraints"].pop(m[1])
    elif m := re.search(r"set constraints\.(\w+) = false", line):
        doc["constraints"][m[1]] = False
    else:
        raise AssertionError(line)
    return doc


@pytest.mark.parametrize("constraints, says", [
    # a cap the user never wrote (max_cp's default 1) is raised to a value, not "lifted"
    ({"recompute": "none", "max_tp": 1, "max_pp": 1, "dp_sharding": "optim",
      "optimizer_offload": False}, "raise constraints.max_cp from 1 to 4"),
    ({"recompute": "none", "max_tp": 1, "max_pp": 1, "dp_sharding": "optim",
      "optimizer_offload": False}, "raise constraints.max_tp from 1 to 2"),
    # every what-if is tried (schema.WHAT_IFS), dp_sharding too (it once was not)
    ({"recompute": "none", "max_tp": 1, "max_pp": 1, "dp_sharding": "optim",
      "optimizer_offload": False}, "lift constraints.dp_sharding = \"optim\""),
    ({"memory_reserve_GiB": 76.0}, "lower constraints.memory_reserve_GiB from 76 to"),
    ({"tp": 8, "pp": 2, "pp_within_node": True}, "set constraints.tp_within_node = false"),
])
def test_each_suggested_change_solves_as_written(constraints, says):
    """An audit applied every 'nearest change' as written: 'lift constraints.max_cp = 1' (a
    default) changed nothing, 'raise max_tp to 8' overshot, the reserve had no target, the
    placement advice named a GPU count that already was a multiple of the node."""
    doc = {**LLAMA8_16, "training": {"global_batch": 256},
           "cluster": {"gpu": "h100-sxm", "nodes": 1 if "tp" not in constraints else 2},
           "constraints": constraints}
    msg = explain(doc)
    line = next(ln for ln in msg.splitlines() if says in ln)
    assert solve(parse_instance(_applied(doc, line)), solver="enumerate").report is not None


def test_a_vp_pin_without_a_layout_suggests_the_nearest_vp_that_has_one():
    """vp = 5 on 24 layers had no 'nearest change' (an audit): vp = 4 and 6 both have layouts;
    the nearer-smaller one is named and solves."""
    doc = {"model": {"preset": "gpt-1.3b"}, "training": {"global_batch": 512},
           "cluster": {"gpu": "a100-80gb", "nodes": 1}, "constraints": {"vp": 5}}
    msg = explain(doc)
    assert "nearest change: vp = 4 (or lift constraints.vp)" in msg
    doc["constraints"] = {"vp": 4}
    assert solve(parse_instance(doc), solver="enumerate").report.plan.vp == 4


def test_the_suggested_batches_are_the_nearest_multiples():
    """A batch of 3 on 16 data-parallel ranks: 16, 32 and 48 are the nearest splits; 32 was
    left out (an audit) when only one multiple of each dp x micro_batch was tried."""
    msg = explain({**LLAMA8_16, "training": {"global_batch": 3},
                   "constraints": {"max_tp": 1, "max_pp": 1}})
    assert "nearest change: a global batch of 16 or 32 or 48" in msg


def test_a_batch_range_with_no_split_is_widened_to_the_nearest_that_solves():
    """A range of global batches none of which dp x micro_batch divides: the answer widens it
    down or up to the nearest batch that splits, and each widened range solves."""
    doc = {"model": {"layers": 4, "hidden": 512, "heads": 8, "vocab": 1000, "seq_len": 512},
           "training": {"global_batch": [9, 15]}, "cluster": {"gpu": "h100-sxm", "gpus": 8},
           "constraints": {"max_tp": 1, "max_pp": 1}}
    msg = explain(doc)
    assert "nearest change: training.global_batch = [8, 15] or [9, 16]" in msg
    for wider in ([8, 15], [9, 16]):
        res = solve(parse_instance({**doc, "training": {"global_batch": wider}}),
                    solver="enumerate")
        assert res.report.plan.global_batch in (8, 16)


def test_a_framework_or_offload_bar_names_its_own_rules_and_a_change_that_solves():
    """DeepSpeed with context parallelism pinned is barred by the framework alone (the answer
    does not speak of host offload); activation offload pinned with pp = 2 by the offload
    rules alone; each names the pin to lift, and lifting it solves."""
    base = {"model": {"preset": "gpt-1.3b"}, "training": {"global_batch": 512},
            "cluster": {"gpu": "a100-80gb", "nodes": 1}}
    for pins, whose, lift in (({"framework": "deepspeed", "cp": 2}, "the framework", "cp"),
                              ({"offload_layers": 4, "pp": 2}, "host offload", "pp")):
        msg = explain({**base, "constraints": pins})
        assert f"the rules of {whose} leave no plan" in msg
        assert ("host offload" in msg) == (whose == "host offload")
        assert f"nearest change: lift constraints.{lift} = {pins[lift]}" in msg
        rest = {k: v for k, v in pins.items() if k != lift}
        assert solve(parse_instance({**base, "constraints": rest}), solver="enumerate").report


def test_a_sub_host_cluster_a_degree_product_and_an_account_flag_name_a_change_that_solves():
    """Found by a metamorphic audit: Llama 3 70B on cluster.gpus = 4 H100 (below a host) got no
    larger-cluster suggestion; tp = 8, pp = 2, cp = 4 on 32 GPUs no pin to change; a lone
    account_for_embedding pin no change at all. Each suggestion, applied, solves."""
    small = {"model": {"preset": "llama3-70b"}, "training": {"global_batch": 64},
             "cluster": {"gpu": "h100-sxm", "gpus": 4}}
    # (7 GPUs: pp = 7, the 80 layers split 10, 5 x 12, 10, two short at each end: the search's
    # own shortfall where pp = 7 is the only pipeline degree, planner/model/plan.py)
    assert "nearest change: cluster.gpus = 7 (1.75x) admits a plan that fits" in explain(small)
    assert solve(parse_instance({**small, "cluster": {"gpu": "h100-sxm", "gpus": 7}}),
                 solver="enumerate").report
    pins = {"model": {"preset": "llama3-8b"}, "training": {"global_batch": 128},
            "cluster": {"gpu": "h100-sxm", "nodes": 4},
            "constraints": {"tp": 8, "pp": 2, "cp": 4}}
    assert "nearest change: tp = 4 or pp = 1 or cp = 2" in explain(pins)
    for key, value in (("tp", 4), ("pp", 1), ("cp", 2)):
        doc = {**pins, "constraints": {**pins["constraints"], key: value}}
        assert getattr(solve(parse_instance(doc), solver="enumerate").report.plan, key) == value
    flag = {"model": {"preset": "gpt-1.3b"}, "training": {"global_batch": 512},
            "cluster": {"gpu": "a100-80gb", "nodes": 1},
            "constraints": {"account_for_embedding": True}}
    assert "nearest change: unpin constraints.account_for_embedding" in explain(flag)


@pytest.mark.parametrize("first, says, pins", [
    (7, "nearest change: pp = 4 (or lift constraints.pp)", {"pp": 4, "first_stage_layers": 7}),
    (5, "no pp in [1, 2, 4, 8] leaves a plan with the other constraints kept; nearest change: "
        "pp = 2 and lift constraints.first_stage_layers", {"pp": 2})])
def test_a_binding_degree_pin_suggests_a_value_the_other_pins_admit(first, says, pins):
    """pp = 3 on 8 GPUs: the domains alone point at pp = 2, which a first stage of 7 (or 5)
    of the 30 layers rules out (a stage at most one layer short of the others). The
    suggestion is now checked with the other pins kept, and names the pin to lift with it
    when none keeps them; each suggestion applied solves."""
    doc = {"model": {"layers": 30, "hidden": 1024, "heads": 16, "vocab": 32000,
                     "seq_len": 1024},
           "training": {"global_batch": 64}, "cluster": {"gpu": "h100-sxm", "nodes": 1},
           "constraints": {"pp": 3, "first_stage_layers": first}}
    assert says in explain(doc)
    res = solve(parse_instance({**doc, "constraints": pins}), solver="enumerate")
    assert res.report.plan.pp == pins["pp"]


def test_an_empty_degree_names_the_cap_the_search_applied(monkeypatch):
    """The message for a degree no value satisfies named the file's caps, not the ones the
    search applied (an audit): with sequence parallelism off an MoE model's tp is capped at 1,
    below max_tp = 8. The case is forced here (a tp of 1 always satisfies the rules): the
    domain of tp is emptied after the caps are applied."""
    from formulations import space

    real = space._domains

    def no_tp(rows, start, caps):
        dom, why = real(rows, start, caps)
        return {**dom, "T": []}, why

    monkeypatch.setattr(space, "_domains", no_tp)
    doc = {"model": {"preset": "mixtral-8x7b"}, "training": {"global_batch": 64},
           "cluster": {"gpu": "h100-sxm", "nodes": 2},
           "constraints": {"sequence_parallel": False, "max_tp": 8}}
    with pytest.raises(InfeasibleError) as info:
        space.build_space(parse_instance(doc))
    (line,) = [ln for ln in info.value.explanation if ln.startswith("no tensor-parallel degree")]
    assert line.endswith(" within tp at most 1 (MoE with tp > 1 needs sequence parallelism, "
                         "which constraints.sequence_parallel = false turns off)")
    assert "max_tp" not in line
    doc["constraints"] = {"max_tp": 8}          # a cap the file wrote is named as such
    with pytest.raises(InfeasibleError) as info:
        space.build_space(parse_instance(doc))
    (line,) = [ln for ln in info.value.explanation if ln.startswith("no tensor-parallel degree")]
    assert line.endswith(" within constraints.max_tp = 8")


@pytest.mark.parametrize("preset, gpus", [("deepseek-v3", 8), ("llama3-405b", 16)])
def test_the_least_memory_named_is_a_plan_whose_layout_holds(preset, gpus):
    """What a memory explanation quotes ("the least any allowed plan needs") is the memory of a
    plan the structural rules allow: each combination is evaluated at the (pp, vp) its pipeline
    layout allows. DeepSeek-V3's 61 layers on 8 H100 once quoted an even split at pp = 2
    (565.5 GiB), which breaks "pp*vp = 2 must divide layers=61", below the least an allowed
    plan needs (574.4 GiB)."""
    from formulations.explain import _min_memory
    from formulations.solve import decode_plan
    from formulations.space import build_space
    from planner.model.evaluate import evaluate

    inst = parse_instance({"model": {"preset": preset}, "training": {"global_batch": 64},
                           "cluster": {"gpu": "h100-sxm", "gpus": gpus}})
    space = build_space(inst)
    need, point, knobs = _min_memory(space)[:3]
    rep = evaluate(inst, decode_plan(space, point, knobs))
    assert not rep.fits
    assert all(v.startswith(("memory", "host memory")) for v in rep.violations), rep.violations

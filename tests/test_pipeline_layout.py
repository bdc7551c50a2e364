"""Megatron-Core's pipeline layout strings as ``[plan] pipeline_layout``: the grammar, the rules,
what the model costs for them, the exports, the errors (docs/model.md, "Pipeline layout")."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from planner.app.cli import app
from planner.app.emit import emit
from planner.model.errors import InputError
from planner.model.evaluate import evaluate
from planner.model.instance import parse_instance
from planner.model.pipeline_layout import layout_stages, rank_decoders, shortfalls
from planner.model.plan import plan_from_spec
from planner.model.terms import step_terms
from tests.test_overlap_sim import rank_program

#: a dense 14-layer model on 8 GPUs; pp = 2 and vp = 4 make 8 chunks
DENSE = {
    "model": {"layers": 14, "hidden": 2048, "heads": 16, "vocab": 32000, "seq_len": 2048},
    "training": {"global_batch": 64},
    "cluster": {"gpu": "h100-sxm", "gpus": 8},
    "constraints": {"memory_reserve_GiB": 2.0},
}


def _inst(plan: dict, **model):
    doc = json.loads(json.dumps(DENSE))
    doc["model"].update(model)
    doc["plan"] = {"tp": 1, "pp": 2, "micro_batch": 1, "recompute": "none", **plan}
    return parse_instance(doc)


def test_megatrons_own_examples_parse_as_megatron_parses_them():
    # megatron/core/transformer/pipeline_parallel_layer_layout.py parse_str_to_list's docstring:
    # "Ettt|(tt|)*29,m|L" is [["E","t","t","t"]] + [["t","t"]]*29 + [["m"],["L"]]
    assert layout_stages("Ettt|(tt|)*29,m|L") == ("Ettt",) + ("tt",) * 29 + ("m", "L")
    # megatron/training/arguments.py's help: "E|(t|)*3,m|m||L", an empty stage included
    assert layout_stages("E|(t|)*3,m|m||L") == ("E", "t", "t", "t", "m", "m", "", "L")
    # NVIDIA's DeepSeek-V3 recipes on GB200 / GB300 (Megatron-Bridge): 16 stages of 4 layers,
    # the last one layer with the prediction depth and the loss; (pp, vp) = (4, 4) puts the
    # short stage on rank 3 (stage i runs on rank i % pp)
    text = "Et*4|(t*4|)*14tmL"
    assert [s.count("t") for s in layout_stages(text)] == [4] * 15 + [1]
    assert rank_decoders(text, 4) == [16, 16, 16, 13]
    assert rank_decoders(text, 2) == [32, 29]
    assert shortfalls(text) == (0, 3)


def test_a_layout_of_the_account_flags_split_costs_what_the_flags_cost():
    # (14 + 2) / (2 * 4) = 2 per chunk: the account flags shorten the first chunk of rank 0 and
    # the last of rank 1 by one layer; the string says the same split
    flags = _inst({"vp": 4, "account_for_embedding": True, "account_for_loss": True})
    text = _inst({"pipeline_layout": "Et|(tt|)*6tL"})
    a = evaluate(flags, plan_from_spec(flags, flags.spec.plan))
    b = evaluate(text, plan_from_spec(text, text.spec.plan))
    assert b.plan.vp == 4 and b.plan.stage_layers == a.plan.stage_layers == [7, 7]
    assert b.step_time_s == pytest.approx(a.step_time_s, rel=1e-12)
    for stage, gib in a.memory_by_stage_gib.items():
        assert b.memory_by_stage_gib[stage] == pytest.approx(gib, rel=1e-12)


def _peak_layer_microbatches(p: int, v: int, m: int, rank: int, chunk_layers: list[int]) -> int:
    """The most decoder-layer micro-batches a rank holds at once under Megatron-Core's
    interleaved schedule (the program of tests/test_overlap_sim.py, written from its source):
    a forward of chunk c keeps its layers' activations until that micro-batch's backward of c."""
    table = [(mb, c) for lo in range(0, m, p) for c in range(v)
             for mb in range(lo, m if lo + p >= m else lo + p)]
    live = peak = 0
    for op in rank_program(p, v, m, rank, wait_send_at_once=True):
        if op[0] == "F":
            live += chunk_layers[table[op[1] % (m * v)][1]]
        elif op[0] == "B":
            live -= chunk_layers[v - 1 - table[op[1] % (m * v)][1]]
        peak = max(peak, live)
    return peak


@pytest.mark.parametrize(("p", "v", "short"), [(2, 4, 1), (2, 4, 3), (4, 2, 2), (4, 4, 3)])
def test_a_short_last_chunk_holds_what_megatrons_schedule_holds(p, v, short):
    """The last rank's peak under the interleaved schedule, simulated: a shortfall in its last
    chunk saves nothing there once the steady phase runs a second round (m > p), where the
    same shortfall spread over the rank's chunks would; the model's last stage holds the
    schedule's count."""
    c = 4
    layers = p * v * c - short
    text = "Et*4|" + "t*4|" * (p * v - 2) + f"t*{c - short}L"
    inst = _inst({"pipeline_layout": text, "pp": p, "global_batch": 64}, layers=layers)
    plan = plan_from_spec(inst, inst.spec.plan)
    terms = step_terms(inst, plan.grid.degrees(), plan.knobs)
    lay = terms.layer
    held = lay["held_last"] * plan.stage_layers[-1] + lay["chunk_last"]
    m = plan.micro_batches
    chunks = [c] * (v - 1) + [c - short]
    assert m > p
    assert held == pytest.approx(_peak_layer_microbatches(p, v, m, p - 1, chunks))
    assert held == pytest.approx(_peak_layer_microbatches(p, v, m, p - 1, [c] * v))
    # and the stored bytes are what the activations hold beyond the working set
    acts = terms.memory["last"]["activations"]
    assert acts == pytest.approx(held * lay["stored_last"] + lay["working_last"]
                                 + lay["extra_last"])


def test_the_first_stage_is_an_upper_bound_with_a_short_first_chunk():
    # the first chunk of rank 0 holds 2p - 1 micro-batches at the peak, the others p: a short
    # first chunk holds less than the even spread the model counts
    p, v, c, short = 2, 4, 4, 3
    text = f"Et*{c - short}|" + "t*4|" * (p * v - 2) + "t*4L"
    inst = _inst({"pipeline_layout": text}, layers=p * v * c - short)
    plan = plan_from_spec(inst, inst.spec.plan)
    lay = step_terms(inst, plan.grid.degrees(), plan.knobs).layer
    held = lay["held_first"] * plan.stage_layers[0]
    exact = _peak_layer_microbatches(p, v, plan.micro_batches, 0, [c - short] + [c] * (v - 1))
    assert exact < held <= exact + short * (p - 1) * (v - 1) / v + 1e-9


def test_exports_write_the_layout_string():
    inst = _inst({"pipeline_layout": "Et|(tt|)*6tL"})
    plan = plan_from_spec(inst, inst.spec.plan)
    meg = emit(inst, plan, "megatron")
    assert "--pipeline-model-parallel-layout 'Et|(tt|)*6tL'" in meg
    for flag in ("--num-virtual-stages-per-pipeline-rank", "--decoder-first-pipeline",
                 "--account-for-", "--num-layers-per-virtual-pipeline-stage"):
        assert flag not in meg        # (validate_args refuses them beside the layout)
    nemo = emit(inst, plan, "nemo")
    assert "pipeline_model_parallel_layout: Et|(tt|)*6tL" in nemo
    assert "account_for_embedding_in_pipeline_split" not in nemo
    # torchtitan shortens its first / last virtual stage, the string's short stages: the
    # ranks' layers match without a "cannot express" comment
    fsdp = _inst({"pipeline_layout": "Et|(tt|)*6tL", "dp_sharding": "optim_grads_params"})
    titan = emit(fsdp, plan_from_spec(fsdp, fsdp.spec.plan), "torchtitan")
    assert "pipeline_parallel_first_stage_less_layers = 1" in titan
    assert "pipeline_parallel_last_stage_less_layers = 1" in titan
    assert "cannot express: torchtitan splits" not in titan


@pytest.mark.parametrize(("text", "layers", "words"), [
    ("Et|(tt|)*6tX", 14, "'X' is not a layer character"),
    ("Et|(tt|)*5tL", 14, "7 stages, not a multiple of pp=2"),
    ("Et|(tt|)*6ttL", 14, "15 decoder layers (t), but the model has layers=14"),
    ("t|E(tt|)*6L", 14, "the embedding (E) comes once, first"),
    ("Et|tt|t|ttt|(tt|)*3tL", 14, "the model costs layouts whose stages hold the same number"),
    ("Et|(tt|)*999999999tL", 14, "repeats more than 100000 times"),
    ("E(t*99999|)*99999L", 14, "unrolls to more than 1000000 characters"),
    ("Et*4|(tt|)*6ttL", 18, "its first and last stages hold 4 and 2 decoder layers, the others 2"),
])
def test_a_layout_the_model_does_not_cost_is_an_input_error(text, layers, words):
    with pytest.raises(InputError) as exc:
        inst = _inst({"pipeline_layout": text}, layers=layers)
        plan_from_spec(inst, inst.spec.plan)
    assert words in " ".join([str(exc.value), *exc.value.problems])


BASE = """[model]
layers = 14
hidden = 2048
heads = 16
vocab = 32000
seq_len = 2048
[training]
global_batch = 64
[cluster]
gpu = "h100-sxm"
gpus = 8
[plan]
tp = 1
pp = 2
pipeline_layout = "Et|(tt|)*6tL"
"""


def test_the_cli_names_what_conflicts(tmp_path):
    path = tmp_path / "i.toml"
    path.write_text(BASE + "vp = 2\n")
    run = CliRunner().invoke(app, ["evaluate", str(path)])
    assert run.exit_code == 2 and "plan.vp = 2" in run.output and "vp = 4" in run.output
    # a layout flag replaces the string, with a note
    path.write_text(BASE)
    run = CliRunner().invoke(app, ["evaluate", str(path), "--account-for-loss",
                                   "--account-for-embedding", "--vp", "4"])
    assert run.exit_code == 0, run.output
    assert 'drops [plan] pipeline_layout = "Et|(tt|)*6tL"' in " ".join(run.output.split())
    path.write_text(BASE + "first_stage_layers = 6\n")
    run = CliRunner().invoke(app, ["evaluate", str(path)])
    assert run.exit_code == 2 and "cannot be combined" in run.output


def test_the_pipeline_layout_flag_replaces_the_plans_layout(tmp_path):
    """--pipeline-layout on a [plan] with the account flags and vp: the same split, the same
    report, and a note of what it replaced; beside a layout flag it is an input error."""
    flags = BASE.replace('pipeline_layout = "Et|(tt|)*6tL"\n',
                         "vp = 4\naccount_for_embedding = true\naccount_for_loss = true\n")
    path = tmp_path / "flags.toml"
    path.write_text(flags)
    a = CliRunner().invoke(app, ["evaluate", str(path), "--json"])
    b = CliRunner().invoke(app, ["evaluate", str(path), "--json",
                                 "--pipeline-layout", "Et|(tt|)*6tL"])
    assert a.exit_code == b.exit_code == 0, (a.output, b.output)
    da, db = json.loads(a.stdout), json.loads(b.stdout)
    assert db["plan"]["pipeline_layout"] == "Et|(tt|)*6tL" and db["plan"]["vp"] == 4
    assert db["step_time_s"] == pytest.approx(da["step_time_s"], rel=1e-12)
    said = CliRunner().invoke(app, ["evaluate", str(path), "--pipeline-layout", "Et|(tt|)*6tL"])
    assert "drops [plan] account_for_embedding, account_for_loss, vp" in said.output
    both = CliRunner().invoke(app, ["evaluate", str(path), "--pipeline-layout", "Et|(tt|)*6tL",
                                    "--first-stage-layers", "6"])
    assert both.exit_code == 2 and "--pipeline-layout and --first-stage-layers" in both.output


def test_the_search_chooses_nvidias_deepseek_layout_on_every_backend():
    """DeepSeek-V3 (61 layers, one prediction depth) at MXFP8 on 256 GB200 at PP4 EP64, the
    layouts up to 3 layers short: the three backends prove the same optimum and plan, at vp = 4
    with the last stage 3 layers short in its last chunk, NVIDIA's recipe layout (Megatron-
    Bridge's DeepSeek-V3 (4, 4) map), which no first / last count expresses; the evaluator
    reproduces the objective, and the plan's [plan] table evaluates to the same step."""
    from formulations.solve import solve
    doc = {"model": {"preset": "deepseek-v3", "mtp_layers": 1, "seq_len": 4096},
           "training": {"global_batch": 4096, "precision": "fp8", "fp8_recipe": "mxfp8",
                        "fp8_param_gather": True, "grad_reduce_dtype": "bf16",
                        "moe_token_dispatcher": "hybridep", "optimizer_dtype": "bf16",
                        "main_params_dtype": "fp32", "selective_recompute": "mla_up_proj"},
           "cluster": {"gpu": "gb200", "gpus": 256},
           "constraints": {"framework": "nemo", "max_stage_shortfall": 3, "pp": 4, "ep": 64,
                           "recompute": "selective"}}
    inst = parse_instance(doc)
    got = {s: solve(inst, solver=s) for s in ("cpsat", "highs", "enumerate")}
    plans = {s: r.report.plan for s, r in got.items()}
    assert plans["cpsat"] == plans["highs"] == plans["enumerate"]
    plan = plans["cpsat"]
    # (the string as NVIDIA's recipes write it)
    assert plan.vp == 4 and plan.pipeline_layout == "Et*4|(t*4|)*14tmL"
    assert plan.stage_layers == [16, 16, 16, 13]
    steps = {s: r.report.step_time_s for s, r in got.items()}
    assert steps["highs"] == pytest.approx(steps["cpsat"], rel=1e-9)
    assert steps["enumerate"] == pytest.approx(steps["cpsat"], rel=1e-9)
    again = parse_instance({**doc, "plan": plan.to_spec()})
    rep = evaluate(again, plan_from_spec(again, again.spec.plan), spec=again.spec.plan)
    assert rep.step_time_s == pytest.approx(steps["cpsat"], rel=1e-12)
    # the launch carries the string the search chose
    assert "pipeline_model_parallel_layout: Et*4|(t*4|)*14tmL" in emit(inst, plan, "nemo")
    # a pinned last stage count is Megatron's flag: the search then writes no string
    from planner.model.plan import layout_choices
    assert any(lay[4] for lay in layout_choices(inst))
    pinned = parse_instance({**doc, "constraints": {**doc["constraints"],
                                                   "last_stage_layers": 16}})
    assert not any(lay[4] for lay in layout_choices(pinned))


def test_several_stages_at_pp1_is_an_input_error():
    with pytest.raises(InputError) as exc:
        inst = _inst({"pipeline_layout": "Et*7|t*7L", "pp": 1})
        plan_from_spec(inst, inst.spec.plan)
    assert "2 stages at pp=1" in " ".join(exc.value.problems)


def test_a_partial_recompute_fits_a_strings_short_stage_on_every_backend():
    """62 layers at PP4 VP4 with full recompute of part of each virtual stage: the string with
    a last stage 2 layers short holds the count only where that stage holds it too (Megatron's
    block method recomputes the first N layers of every stage); the backends agree."""
    from formulations.solve import solve
    doc = json.loads(json.dumps(DENSE))
    doc["model"].update(layers=62, hidden=1024, heads=8)
    doc["cluster"]["gpus"] = 16
    doc["constraints"] = {"pp": 4, "vp": 4, "recompute": "full", "max_stage_shortfall": 2,
                          "tp": 1, "memory_reserve_GiB": 2.0}
    inst = parse_instance(doc)
    got = {s: solve(inst, solver=s).report for s in ("cpsat", "highs", "enumerate")}
    plans = {s: r.plan for s, r in got.items()}
    assert plans["cpsat"] == plans["highs"] == plans["enumerate"]
    plan = plans["cpsat"]
    stages = [st.count("t") for st in layout_stages(plan.pipeline_layout)] \
        if plan.pipeline_layout else []
    assert not stages or plan.recompute_layers <= min(stages)
    assert got["highs"].step_time_s == pytest.approx(got["cpsat"].step_time_s, rel=1e-9)
    assert got["enumerate"].step_time_s == pytest.approx(got["cpsat"].step_time_s, rel=1e-9)

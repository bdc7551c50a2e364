"""Pipeline layouts (Megatron-LM's first / last stage counts and account flags): the plan keys,
the rules, the per-stage model, the search and the exports (docs/model.md, "Pipeline layout")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from formulations.solve import solve
from planner.app.cli import app
from planner.app.emit import emit
from planner.model.errors import InfeasibleError
from planner.model.evaluate import evaluate
from planner.model.instance import load_instance, parse_instance
from planner.model.plan import plan_from_spec

ROOT = Path(__file__).resolve().parents[1]
LLAMA = ROOT / "instances" / "llama3.1-405b-h100.toml"

#: a 10-layer model on 8 GPUs: pp = 4 needs an uneven layout (10 + 2 = 12 = 4 x 3)
SMALL = {
    "model": {"layers": 10, "hidden": 2048, "heads": 16, "vocab": 32000, "seq_len": 2048},
    "training": {"global_batch": 16},
    "cluster": {"gpu": "a100-80gb", "gpus": 8},
    "constraints": {"pp": 4, "tp": 2, "memory_reserve_GiB": 2.0},
}


def _small(**constraints):
    doc = json.loads(json.dumps(SMALL))
    doc["constraints"].update(constraints)
    return parse_instance(doc)


def test_meta_layout_stages_and_megatron_rule():
    # Dubey et al. 2024 Sec. 3.3.2: 126 layers on PP16, the first and last stage one layer short
    inst = load_instance(LLAMA)
    plan = plan_from_spec(inst, inst.spec.plan)
    assert plan.stage_layers == [7] + [8] * 14 + [7]
    assert sum(plan.stage_layers) == inst.model.layers
    rep = evaluate(inst, plan)
    assert not rep.violations
    # a middle stage exists in the memory report; without recompute the second rank (15
    # micro-batches of 8 layers) holds more activations than the first (16 of 7)
    none = evaluate(inst, plan_from_spec(inst, inst.spec.plan, recompute="none"))
    by = none.memory_by_stage_gib
    assert by["middle"]["activations"] > by["first"]["activations"]


def test_a_chunk_of_the_embedding_alone_is_a_layout():
    """Llama 3 405B's layout (Dubey et al. 2024 Sec. 3.3.2: "the first model chunk on the first
    stage has only the embedding"): the embedding and the loss counted as layers, (126 + 2) / 16
    = 8 per rank in vp = 8 chunks of one, so the first chunk of rank 0 and the last of rank 15
    build no decoder layer, which Megatron-LM allows (get_num_layers_to_build asserts
    num_layers_to_build >= 0); a per-rank count vp does not split stays refused."""
    inst = load_instance(LLAMA)
    spec = inst.spec.plan.model_copy(update={
        "first_stage_layers": None, "last_stage_layers": None, "vp": 8,
        "account_for_embedding": True, "account_for_loss": True})
    plan = plan_from_spec(inst, spec)
    assert plan.stage_layers == [7] + [8] * 14 + [7]
    assert not [v for v in evaluate(inst, plan, spec=spec).violations
                if not v.startswith("memory")]
    bad = spec.model_copy(update={"vp": 3})
    assert any("the per-rank count 8 by vp=3" in v for v in evaluate(
        inst, plan_from_spec(inst, bad), spec=bad).violations)


def test_even_layout_numbers_do_not_move():
    # an explicit layout equal to the even split is the even plan: same step time and memory
    inst = load_instance(ROOT / "instances" / "gpt3-175b-a100.toml")
    even = evaluate(inst, plan_from_spec(inst, inst.spec.plan))
    m = inst.model.layers // inst.spec.plan.pp
    same = evaluate(inst, plan_from_spec(inst, inst.spec.plan.model_copy(
        update={"first_stage_layers": m, "last_stage_layers": m})))
    assert same.step_time_s == pytest.approx(even.step_time_s, rel=1e-12)
    assert same.memory_gib["total"] == pytest.approx(even.memory_gib["total"], rel=1e-12)


def test_the_slowest_stage_sets_the_pace():
    from planner.model.schema import PlanSpec
    doc = json.loads(json.dumps(SMALL))
    doc["model"]["vocab"] = 256000        # an output layer heavier than a decoder layer
    inst = parse_instance(doc)
    base = dict(tp=2, pp=4, dp=1, micro_batch=1)
    # 10 layers on 4 stages: 2 + 3 + 3 + 2 (both short) against 3 + 3 + 3 + 1 (last two short)
    a = evaluate(inst, plan_from_spec(inst, PlanSpec(**base, first_stage_layers=2,
                                                     last_stage_layers=2)))
    b = evaluate(inst, plan_from_spec(inst, PlanSpec(**base, first_stage_layers=3,
                                                     last_stage_layers=1)))
    assert a.plan.stage_layers == [2, 3, 3, 2] and b.plan.stage_layers == [3, 3, 3, 1]
    assert not a.violations and not b.violations
    # the output layer costs more than a decoder layer: with 2 layers and the
    # output layer the last stage of `a` is the slowest; `b`'s last stage (1 layer + output)
    # is lighter than its 3-layer middles, which set its pace
    assert b.breakdown_s["compute"] < a.breakdown_s["compute"]
    assert b.breakdown_s["bubble"] > a.breakdown_s["bubble"] * 0.999


@pytest.mark.parametrize("extra, words", [
    ({"pp": 12}, "split evenly over the 10 other pipeline stages"),
    ({"pp": 16, "vp": 2}, "divisible by vp=2"),
    ({"pp": 16, "account_for_embedding": True}, "cannot be combined"),
])
def test_bad_plan_layout_is_an_input_error(tmp_path, extra, words):
    text = LLAMA.read_text()
    for key, value in extra.items():
        line = f"{key} = {str(value).lower()}\n"
        if f"\n{key} = " in text:
            text = "\n".join(line.rstrip("\n") if ln.startswith(f"{key} = ") else ln
                             for ln in text.splitlines()) + "\n"
        else:
            text += line
    f = tmp_path / "bad.toml"
    f.write_text(text)
    res = CliRunner().invoke(app, ["evaluate", str(f), "--json"])
    assert res.exit_code == 2, res.output
    assert words in res.output


def test_two_stage_counts_must_hold_every_layer(tmp_path):
    # at pp = 2 there is no middle stage: first + last is the whole split (found by a fuzzer:
    # 1 + 1 of 8 layers was evaluated as 4 + 4 and exported as 1 / 1)
    doc = {k: dict(v) for k, v in SMALL.items() if k != "constraints"}
    lines = [f"[{sec}]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in vals.items())
             for sec, vals in doc.items()]
    for first, last, code in ((1, 1, 2), (3, 8, 2), (4, 6, 0)):
        f = tmp_path / f"p{first}{last}.toml"
        f.write_text("\n".join(lines) + f"[plan]\ntp = 4\npp = 2\nmicro_batch = 1\n"
                     f"first_stage_layers = {first}\nlast_stage_layers = {last}\n")
        res = CliRunner().invoke(app, ["evaluate", str(f), "--json"])
        assert res.exit_code == code, res.output
        if code:
            assert "there is no middle stage" in res.output and f"= {first + last}" in res.output
        else:
            assert json.loads(res.output)["plan"]["stage_layers"] == [4, 6]


def test_both_ends_counted_on_two_stages_is_explained():
    # pp = 2 with the embedding and the loss both counted is the even split relabelled; the
    # search holds it as the even layout, so the pins are explained, not "no layout fits"
    with pytest.raises(InfeasibleError) as exc:
        solve(_small(pp=2, tp=4, account_for_embedding=True, account_for_loss=True))
    assert "the even split" in " ".join(exc.value.explanation)


@pytest.mark.parametrize("pins", [{}, {"vp": 1, "micro_batch": 1, "max_stage_shortfall": 2}])
def test_search_takes_an_uneven_layout_and_backends_agree(pins):
    # (with pp, vp and the micro-batch pinned the pace's maximum is built from the other
    # degrees' symbols alone)
    inst = _small(**pins)
    results = {b: solve(inst, solver=b, explain=False) for b in ("enumerate", "cpsat", "highs")}
    ref = results["enumerate"]
    assert sum(ref.report.plan.stage_layers) == 10 and len(set(ref.report.plan.stage_layers)) > 1
    for b in ("cpsat", "highs"):
        assert results[b].objective == pytest.approx(ref.objective, rel=1e-6)
        assert results[b].report.plan == ref.report.plan


def test_pins_on_the_layout():
    first = solve(_small(first_stage_layers=2), solver="enumerate", explain=False)
    assert first.report.plan.stage_layers[0] == 2
    last = solve(_small(last_stage_layers=1, max_stage_shortfall=2), solver="cpsat",
                 explain=False)
    assert last.report.plan.stage_layers == [3, 3, 3, 1]
    with pytest.raises(InfeasibleError) as exc:
        solve(_small(max_stage_shortfall=0), solver="cpsat")
    assert "layout" in " ".join(exc.value.explanation) and "max_stage_shortfall = 0" in \
        " ".join(exc.value.explanation)


@pytest.mark.parametrize("pins", [{"first_stage_layers": 1}, {"last_stage_layers": 3},
                                  {"first_stage_layers": 2, "max_stage_shortfall": 0, "pp": 2}])
def test_a_stage_count_that_leaves_no_layout_names_changes_that_solve(pins):
    """A first / last stage pin with no layout at the pinned pp: the explanation offers the
    nearest count and the least max_stage_shortfall that keep a layout, and each, applied as
    written, solves; the layout rules it recites are the broken ones, not the whole list."""
    with pytest.raises(InfeasibleError) as exc:
        solve(_small(**pins), solver="enumerate")
    lines = exc.value.explanation
    (near,) = [ln for ln in lines if ln.startswith("nearest change")]
    assert "recompute_layers needs full recompute" not in " ".join(lines)
    changes = []
    for option in near.removeprefix("nearest change: ").split(" (or lift")[0].split(" or "):
        key, value = option.removeprefix("raise constraints.").replace(" from ", " = ").split(
            " = ")[0], int(option.rsplit(" ", 1)[-1])
        changes.append({**pins, key: value})
    assert changes
    for change in changes:
        res = solve(_small(**change), solver="enumerate", explain=False)
        assert sum(res.report.plan.stage_layers) == 10, change


def test_exports_carry_the_layout():
    inst = load_instance(LLAMA)
    plan = plan_from_spec(inst, inst.spec.plan)
    meg = emit(inst, plan, "megatron")
    assert "--decoder-first-pipeline-num-layers 7" in meg
    assert "--decoder-last-pipeline-num-layers 7" in meg
    # (torchtitan runs data parallelism as FSDP2: the same plan fully sharded)
    tt = emit(inst, plan_from_spec(inst, inst.spec.plan, dp_sharding="optim_grads_params"),
              "torchtitan")
    assert "pipeline_parallel_first_stage_less_layers = 1" in tt
    assert "pipeline_parallel_layers_per_stage = 8" in tt
    ds = json.loads(emit(inst, plan, "deepspeed"))
    assert ds["plan_parallelism"]["stage_layers"] == [7] + [8] * 14 + [7]
    assert "cannot express" in ds["plan_parallelism"]["layout_how"]
    acc = plan_from_spec(inst, inst.spec.plan.model_copy(update={
        "first_stage_layers": None, "last_stage_layers": None, "pp": 8, "vp": 8, "dp": 256,
        "account_for_embedding": True, "account_for_loss": True}))
    assert acc.stage_layers == [15] + [16] * 6 + [15]       # NeMo's 405B recipe: (126+2)/8
    meg = emit(inst, acc, "megatron")
    assert "--account-for-embedding-in-pipeline-split" in meg
    assert "--num-virtual-stages-per-pipeline-rank 8" in meg
    nemo = emit(inst, acc, "nemo")
    assert "account_for_loss_in_pipeline_split: true" in nemo


def test_partial_recompute_lies_between_none_and_full():
    inst = load_instance(LLAMA)                     # PP16, 8 layers per middle stage
    def run(mode, n=None):
        return evaluate(inst, plan_from_spec(inst, inst.spec.plan.model_copy(
            update={"recompute": mode, "recompute_layers": n})))
    none, full = run("none"), run("full")
    parts = [run("full", n) for n in (1, 4, 8)]
    assert parts[-1].step_time_s == pytest.approx(full.step_time_s, rel=1e-12)
    assert parts[-1].memory_gib["total"] == pytest.approx(full.memory_gib["total"], rel=1e-12)
    times = [none.step_time_s] + [r.step_time_s for r in parts]
    mems = [none.memory_gib["total"]] + [r.memory_gib["total"] for r in parts]
    assert times == sorted(times) and mems == sorted(mems, reverse=True)
    assert len(set(round(t, 9) for t in times)) == 4
    meg = emit(inst, parts[0].plan, "megatron")
    assert "--recompute-method block" in meg and "--recompute-num-layers 1" in meg
    fsdp = plan_from_spec(inst, inst.spec.plan.model_copy(update={
        "recompute": "full", "recompute_layers": parts[0].plan.recompute_layers}),
        dp_sharding="optim_grads_params")
    assert "cannot express" in emit(inst, fsdp, "torchtitan")
    bad = plan_from_spec(inst, inst.spec.plan.model_copy(update={"recompute_layers": 9}))
    from planner.model.plan import layout_violations
    assert any("exceeds the 8 layers" in v for v in layout_violations(inst, bad))


# ------------------------------------------------------------------------------------------
# The search's own shortfall where constraints.max_stage_shortfall is unset
# ------------------------------------------------------------------------------------------

def _megatron_least_shortfall(layers: int, pp: int) -> int | None:
    """Every split Megatron-LM's --decoder-first/last-pipeline-num-layers allows, walked: the
    middle stages hold m each, the first f and the last l, f + l + (pp - 2) m = layers with
    1 <= f, l <= m; the least max(m - f, m - l) over them (None: no split)."""
    best = None
    for m in range(1, layers + 1):
        for f in range(1, m + 1):
            last = layers - (pp - 2) * m - f
            if 1 <= last <= m:
                short = max(m - f, m - last)
                best = short if best is None else min(best, short)
    return best


@pytest.mark.parametrize("layers", [21, 61, 70, 80, 96, 105, 126, 128])
def test_least_shortfall_is_the_least_of_every_megatron_split(layers):
    from planner.model.plan import least_shortfall

    for pp in range(3, min(layers, 40) + 1):
        assert least_shortfall(layers, pp) == _megatron_least_shortfall(layers, pp), pp


def _unset(layers: int, gpus: int, **constraints):
    from planner.model.plan import stage_shortfall

    return stage_shortfall(parse_instance({
        "model": {"layers": layers, "hidden": 4096, "heads": 32, "vocab": 32000,
                  "seq_len": 2048},
        "training": {"global_batch": 1024}, "cluster": {"gpu": "h100-sxm", "gpus": gpus},
        "constraints": constraints}))


def test_an_unset_shortfall_follows_the_layer_count():
    # worked by hand from the splits (the walk above): 105 = 3 x 5 x 7 layers on 256 GPUs
    # split over 4 stages 2 short (25, 27, 27, 26), over 8 stages 4 short (10, 6 x 14, 11)
    # and over 16 stages 4 short (4, 14 x 7, 3); one short reaches pp 1 and 2 alone
    assert _unset(105, 256) == 4
    # DeepSeek-V3's 61 layers on 1,024 GPUs: 4, 8 and 16 stages each 2 short (16: 3, 14 x 4, 2)
    assert _unset(61, 1024) == 2
    # the shipped models keep 1: 96 and 126 layers reach every power-of-two depth one short
    assert _unset(96, 1024) == 1 and _unset(126, 16384) == 1
    # 80 layers on 480 GPUs: pp 6 and 12 need 2 short, but 5 and 8, one short or even, are as
    # deep within a factor of two
    assert _unset(80, 480) == 1
    # a pin or a cap on pp counts only the degrees it leaves: up to pp 8, two short reaches
    # pp 4, within a factor of two of 8 (and pp 2 of 4); pp 16 pinned needs its own 4
    assert _unset(105, 256, max_pp=8) == 2 and _unset(105, 256, max_pp=4) == 1
    assert _unset(105, 256, pp=16) == 4 and _unset(105, 256, pp=2) == 1
    # a given value always wins
    assert _unset(105, 256, max_stage_shortfall=0) == 0
    assert _unset(96, 1024, max_stage_shortfall=3) == 3


def test_an_unset_shortfall_finds_the_deep_pipeline_a_short_one_misses():
    """MT-NLG's shape (105 layers) on 256 H100: with the first / last stages at most one
    layer short the search reaches pp 1 and 2 only; unset, it reaches 8 and 16 and finds a
    faster plan, the one the search with the shortfall given as 4 finds."""
    doc = {"model": {"preset": "mt-nlg-530b"}, "training": {"global_batch": 1024},
           "cluster": {"gpu": "h100-sxm", "gpus": 256}}
    unset = solve(parse_instance(doc), solver="enumerate")
    given = solve(parse_instance({**doc, "constraints": {"max_stage_shortfall": 4}}),
                  solver="enumerate")
    short = solve(parse_instance({**doc, "constraints": {"max_stage_shortfall": 1}}),
                  solver="enumerate")
    assert unset.report.plan.pp >= 8 and short.report.plan.pp <= 2
    assert unset.objective == given.objective
    assert unset.report.plan.label() == given.report.plan.label()
    assert unset.objective < 0.8 * short.objective


def test_compare_baseline_keeps_an_unset_shortfall_the_searchs_own():
    """--compare's baseline lifts every what-if; an unset shortfall is no what-if and stays
    unset there (the search's own, 4 for 105 layers on 256 GPUs), so the baseline's space
    holds the constrained one; unconstrained_spec alone lifts a given 0 to the schema's 1."""
    from formulations.queries import unconstrained_spec
    from planner.model.plan import stage_shortfall

    doc = {"model": {"preset": "mt-nlg-530b"}, "training": {"global_batch": 1024},
           "cluster": {"gpu": "h100-sxm", "gpus": 256}, "constraints": {"max_tp": 4}}
    inst = parse_instance(doc)
    base = inst.with_spec(constraints=unconstrained_spec(inst.spec.constraints))
    assert base.spec.constraints.max_tp is None
    assert stage_shortfall(base) == stage_shortfall(inst) == 4
    even = parse_instance({**doc, "constraints": {"max_stage_shortfall": 0}})
    lifted = even.with_spec(constraints=unconstrained_spec(even.spec.constraints))
    assert stage_shortfall(even) == 0 and stage_shortfall(lifted) == 1


def test_compare_lifts_a_given_shortfall_to_the_searchs_own():
    """A given ``max_stage_shortfall`` below the search's own is a cap like any other:
    --compare's baseline lifts it as far as the instance with the key unset searches (4 for
    MT-NLG's 105 layers on 256 GPUs, not the schema's 1, which reaches pp 1 and 2 only), so
    the baseline is the unset instance's optimum and the cap is reported as binding, lifted
    to 4. Where the search's own is no larger (96 layers on 1,024 GPUs: 1), a given 0 lifts
    to 1 and a given 3 stays."""
    from formulations.queries import baseline_spec, compare

    doc = {"model": {"preset": "mt-nlg-530b"}, "training": {"global_batch": 1024},
           "cluster": {"gpu": "h100-sxm", "gpus": 256}}
    even = parse_instance({**doc, "constraints": {"max_stage_shortfall": 0}})
    res = compare(even, solver="enumerate")
    free = solve(parse_instance(doc), solver="enumerate")
    assert res.unconstrained.objective == free.objective
    assert res.unconstrained.report.plan.pp >= 8
    [binding] = res.binding
    assert binding["constraint"] == "max_stage_shortfall" and binding["lifted_to"] == 4
    assert binding["step_time_without_s"] == free.report.step_time_s
    gpt = {"model": {"layers": 96, "hidden": 12288, "heads": 96, "vocab": 51200,
                     "seq_len": 2048}, "training": {"global_batch": 1536},
           "cluster": {"gpu": "a100-80gb", "gpus": 1024}}
    for given, lifted in ((0, 1), (3, 3)):
        inst = parse_instance({**gpt, "constraints": {"max_stage_shortfall": given}})
        assert baseline_spec(inst).max_stage_shortfall == lifted


def _pp6(**constraints):
    """20 layers on 48 GPUs with pp pinned to 6: the split needs the first / last stages two
    layers short (6 x 4 - 20 = 4); the baseline with pp free goes to one short."""
    return parse_instance({
        "model": {"layers": 20, "hidden": 1024, "heads": 8, "vocab": 32000, "seq_len": 1024},
        "training": {"global_batch": 96}, "cluster": {"gpu": "h100-sxm", "gpus": 48},
        "constraints": {"pp": 6, "max_micro_batch": 2, **constraints}})


def test_a_pinned_pp_that_needs_a_deeper_shortfall_is_told_so():
    """A pp pin that no layout within the given shortfall splits: the explanation offers the
    least shortfall that keeps the pin, and that change, applied as written, solves at the
    pinned degree; --compare lifts the shortfall alone that deep (the pinned degree's need,
    not the baseline's), so the lifted solve has a plan and the key is reported binding."""
    from formulations.queries import compare

    with pytest.raises(InfeasibleError) as exc:
        solve(_pp6(max_stage_shortfall=0), solver="enumerate")
    text = " ".join(exc.value.explanation)
    assert "raise constraints.max_stage_shortfall from 0 to 2" in text
    res = solve(_pp6(max_stage_shortfall=2), solver="enumerate", explain=False)
    assert res.report.plan.pp == 6 and sum(res.report.plan.stage_layers) == 20
    cmp = compare(_pp6(max_stage_shortfall=0), solver="enumerate")
    assert cmp.constrained is None
    lifted = {b["constraint"]: b for b in cmp.binding}
    assert lifted["max_stage_shortfall"]["lifted_to"] == 2
    assert lifted["max_stage_shortfall"]["step_time_without_s"] == res.report.step_time_s


def test_the_suggested_uneven_split_is_a_lightest_megatron_layout():
    """``uneven_split`` against every Megatron layout of small counts (first and last a
    positive multiple of vp, the pp - 2 middle ranks alike, each a positive multiple of vp),
    found by trying every pair of end counts: it returns one where some exists, none where
    none does, and its fullest rank holds no more layers than any layout's; the same with
    the first or the last count given."""
    from planner.model.pipeline_layout import uneven_split

    for layers in range(2, 31):
        for pp in range(2, 9):
            for vp in range(1, 5):
                layouts = []
                for first in range(vp, layers, vp):
                    for last in range(vp, layers - first + 1, vp):
                        rest = layers - first - last
                        if pp == 2 and rest == 0:
                            layouts.append((first, 0, last))
                        elif pp > 2 and rest > 0 and rest % ((pp - 2) * vp) == 0:
                            layouts.append((first, rest // (pp - 2), last))
                got = uneven_split(layers, pp, vp)
                case = (layers, pp, vp)
                assert (got is None) == (not layouts), case
                if got:
                    assert got in layouts, case
                    assert max(got) == min(max(lay) for lay in layouts), case
                # with a first or a last count given (kept), the same against its layouts
                for end in range(1, layers):
                    for i, key in ((0, "first"), (2, "last")):
                        keep = [lay for lay in layouts if lay[i] == end]
                        got = uneven_split(layers, pp, vp, **{key: end})
                        assert (got is None) == (not keep), (*case, key, end)
                        if got:
                            assert got in keep and max(got) == min(max(x) for x in keep)


def test_an_even_split_that_fails_names_an_uneven_layout_that_evaluates(tmp_path):
    """A [plan] whose pp does not divide the layers (10 over 4 ranks) is told a layout that
    does, in [plan]'s keys; evaluated with those keys, the plan breaks no rule."""
    doc = {k: dict(v) for k, v in SMALL.items() if k != "constraints"}
    doc["plan"] = {"tp": 2, "pp": 4, "micro_batch": 1}
    f = tmp_path / "even.toml"
    f.write_text("\n".join(f"[{sec}]\n" + "".join(f"{k} = {json.dumps(v)}\n"
                                                  for k, v in vals.items())
                           for sec, vals in doc.items()))
    out = json.loads(CliRunner().invoke(app, ["evaluate", str(f), "--json"]).stdout)
    (rule,) = [v for v in out["violations"] if "must divide layers=10" in v]
    first, last = (int(rule.split(f"{key} = ")[1].split(",")[0].split(" ")[0])
                   for key in ("first_stage_layers", "last_stage_layers"))
    res = CliRunner().invoke(app, ["evaluate", str(f), "--json", "--first-stage-layers",
                                   str(first), "--last-stage-layers", str(last)])
    fixed = json.loads(res.stdout)
    assert res.exit_code == 0 and not fixed["violations"]
    assert sum(fixed["plan"]["stage_layers"]) == 10


def test_one_end_of_an_uneven_layout_alone_is_told_the_other():
    """Llama 3.1 405B's layout (7 + 14 x 8 + 7) with its last count dropped leaves 119 layers
    for 15 stages (exit 2, found by the input fuzzer, seeds 694 and 959): the message keeps
    the first count and names the last that completes it, which evaluates clean."""
    res = CliRunner().invoke(app, ["evaluate", str(LLAMA), "--last-stage-layers", "0"])
    assert res.exit_code == 2
    assert "first_stage_layers = 7, last_stage_layers = 7 (7 + 14 x 8 + 7)" in res.output
    res = CliRunner().invoke(app, ["evaluate", str(LLAMA), "--json", "--last-stage-layers", "7"])
    assert res.exit_code == 0 and not json.loads(res.stdout)["violations"]


def test_compare_where_the_constraints_leave_no_plan(tmp_path):
    """``plan solve --compare`` on constraints that leave no plan: exit 3 as without it, the
    explanation, and the comparison with its constrained side null (docs/contract.md): the
    optimum without the what-ifs and each constraint whose lifting alone gives a plan, with
    that plan's step time (the shortfall lifted to 2 solves as the instance given 2 does).
    Where no plan exists without the what-ifs either (GPT-3 175B on 8 GPUs), the error alone."""
    doc = {"model": {"layers": 20, "hidden": 1024, "heads": 8, "vocab": 32000, "seq_len": 1024},
           "training": {"global_batch": 96}, "cluster": {"gpu": "h100-sxm", "gpus": 48},
           "constraints": {"pp": 6, "max_micro_batch": 2, "max_stage_shortfall": 0}}
    f = tmp_path / "pp6.toml"
    f.write_text("\n".join(f"[{sec}]\n" + "".join(f"{k} = {json.dumps(v)}\n"
                                                  for k, v in vals.items())
                           for sec, vals in doc.items()))
    args = ["solve", str(f), "--compare", "--solver", "enumerate"]
    res = CliRunner().invoke(app, [*args, "--json"])
    assert res.exit_code == 3
    out = json.loads(res.stdout)
    assert out["exit_code"] == 3 and "leave no plan" in out["error"]
    cmp = out["compare"]
    assert cmp["constrained"] is None and cmp["unconstrained"]["solver"]["status"] == "optimal"
    lifted = {b["constraint"]: b for b in cmp["binding"]}
    given2 = solve(_pp6(max_stage_shortfall=2), solver="enumerate", explain=False)
    assert lifted["max_stage_shortfall"]["step_time_without_s"] == given2.report.step_time_s
    text = CliRunner().invoke(app, args)
    assert text.exit_code == 3 and "binds: max_stage_shortfall = 0" in text.stdout
    assert "leave no plan" in text.stderr
    big = tmp_path / "big.toml"
    big.write_text('[model]\npreset = "gpt3-175b"\n[training]\nglobal_batch = 64\n'
                   '[cluster]\ngpu = "a100-80gb"\ngpus = 8\n[constraints]\nmax_tp = 4\n')
    res = CliRunner().invoke(app, ["solve", str(big), "--compare", "--solver", "enumerate",
                                   "--json"])
    assert res.exit_code == 3 and "compare" not in json.loads(res.stdout)

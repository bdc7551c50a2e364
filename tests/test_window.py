"""Sliding-window attention (``[model] window_size``, ``window_attn_skip_freq``, Megatron-Core's
names): which layers attend within the window, what the window saves, the context-parallel
rule it brings, the backends' agreement with it, what the exports build and the input errors.

The keys' meaning is Megatron-Core's (TransformerConfig docstrings, transformer/utils.py
``is_layer_window_attention``): ``window_size = (left, 0)`` lets a query attend to itself and
the ``left`` tokens before it; an integer ``window_attn_skip_freq = N`` is "one full attention
layer after N - 1 windowed ones"; a list has a 0 or 1 per layer, 1 windowed.
tools/check_exports.py checks the exported flags with Megatron-Core's own function.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from planner.model.errors import InputError
from planner.model.evaluate import evaluate
from planner.model.instance import parse_instance
from planner.model.plan import plan_from_spec
from planner.model.schema import ModelSpec
from planner.model.workload import Shape, window_share
from tests.test_emit import emitted, parse_megatron, parse_yaml

#: a Mistral-7B-shaped model (every layer windowed at 4,096 tokens, the query's own included)
MISTRAL = {"layers": 32, "hidden": 4096, "heads": 32, "kv_heads": 8, "ffn_hidden": 14336,
           "gated_mlp": True, "vocab": 32000, "seq_len": 32768, "tied_embeddings": False,
           "position_embedding": "rope", "dropout": False, "normalization": "rmsnorm",
           "linear_bias": False, "window_size": 4095}


def _doc(model: dict, plan: dict | None = None, **training) -> dict:
    doc = {"model": model, "training": {"global_batch": 64, **training},
           "cluster": {"gpu": "h100-sxm", "gpus": 16}}
    if plan is not None:
        doc["plan"] = plan
    return doc


def _report(model: dict, plan: dict, **training):
    inst = parse_instance(_doc(model, plan, **training))
    return evaluate(inst, plan_from_spec(inst, inst.spec.plan), spec=inst.spec.plan)


@pytest.mark.parametrize("s, left", [(4096, 127), (4096, 4094), (4096, 4095), (4096, 9000),
                                     (100, 3), (8, 1), (2048, 1023)])
def test_the_window_share_counts_the_keys_of_the_mask(s, left):
    """The share is the keys a windowed layer attends to over full causal attention's, counted
    here on the mask itself: key j is seen from query i when i - left <= j <= i."""
    i, j = np.ogrid[:s, :s]
    window, causal = ((j <= i) & (j >= i - left)).sum(), (j <= i).sum()
    assert window_share(s, left) == pytest.approx(window / causal, rel=1e-12)


def test_which_layers_attend_within_the_window():
    """Megatron-Core's integer form leaves every N-th layer (counted from 1) full: gpt-oss's
    alternation from a windowed first layer is 2, Gemma 3's five local layers to one global
    is 6; without the key every layer is windowed; a list marks them one by one."""
    base = {**MISTRAL, "layers": 12}
    assert ModelSpec(**base).windowed_layers == (True,) * 12
    assert ModelSpec(**base, window_attn_skip_freq=2).windowed_layers == (True, False) * 6
    assert ModelSpec(**base, window_attn_skip_freq=6).windowed_layers == \
        (True,) * 5 + (False,) + (True,) * 5 + (False,)
    pattern = [0, 1] * 6
    assert ModelSpec(**base, window_attn_skip_freq=pattern).windowed_layers == \
        tuple(bool(x) for x in pattern)
    assert not ModelSpec(**{k: v for k, v in base.items() if k != "window_size"}).windowed


def test_a_window_shortens_the_step_by_the_attention_it_skips():
    """At 32K tokens the attention core is a large share of a 7B model's step: a 4K window
    shortens the step, a window covering the sequence changes nothing, nor does a window under
    unfused attention (Megatron-Core masks the full score matrix there). The MFU's model FLOPs
    keep Megatron-LM's count of the attention in full, so the faster plan shows a higher MFU."""
    plan = {"tp": 2, "pp": 1, "dp": 8, "micro_batch": 1, "recompute": "full"}
    full = {k: v for k, v in MISTRAL.items() if k != "window_size"}
    t_full = _report(full, plan)
    t_win = _report(MISTRAL, plan)
    assert t_win.step_time_s < 0.9 * t_full.step_time_s
    assert t_win.breakdown_s["compute"] < t_full.breakdown_s["compute"]
    assert {k: v for k, v in t_win.breakdown_s.items() if k != "compute"} == \
        pytest.approx({k: v for k, v in t_full.breakdown_s.items() if k != "compute"}, rel=1e-12)
    assert t_win.memory_gib["total"] == pytest.approx(t_full.memory_gib["total"], rel=1e-12)
    assert t_win.mfu > t_full.mfu
    covering = _report({**MISTRAL, "window_size": MISTRAL["seq_len"] - 1}, plan)
    assert covering.step_time_s == pytest.approx(t_full.step_time_s, rel=1e-12)
    unfused = [_report(m, plan, flash_attention=False).step_time_s for m in (full, MISTRAL)]
    assert unfused[0] == pytest.approx(unfused[1], rel=1e-12)


def test_half_the_layers_windowed_save_half_as_much():
    """The saving is per windowed layer: with every other layer full attention the attention
    core's time drops by half of what every layer windowed drops it by."""
    plan = {"tp": 2, "pp": 1, "dp": 8, "micro_batch": 1, "recompute": "full"}
    full = _report({k: v for k, v in MISTRAL.items() if k != "window_size"}, plan)
    every = _report(MISTRAL, plan)
    half = _report({**MISTRAL, "window_attn_skip_freq": 2}, plan)
    saved = full.breakdown_s["compute"] - every.breakdown_s["compute"]
    assert full.breakdown_s["compute"] - half.breakdown_s["compute"] == \
        pytest.approx(saved / 2, rel=1e-9)


def test_context_parallelism_is_refused_with_a_window():
    """Transformer Engine runs a sliding window under context parallelism only with its a2a
    or all_gather exchange, not the p2p ring the model costs: a plan with cp > 1 breaks a rule
    that names the window, and the search keeps cp = 1 where it would otherwise split the
    sequence."""
    plan = {"tp": 1, "pp": 1, "dp": 8, "cp": 2, "micro_batch": 1, "recompute": "full"}
    rep = _report(MISTRAL, plan)
    assert any("sliding-window attention (model.window_size)" in v for v in rep.violations)
    long = {**MISTRAL, "seq_len": 131072}
    doc = _doc(long, global_batch=16)
    doc["constraints"] = {"max_cp": 8}
    from formulations.solve import solve
    windowed = solve(parse_instance(doc), solver="enumerate").report.plan
    doc["model"] = {k: v for k, v in long.items() if k != "window_size"}
    full = solve(parse_instance(doc), solver="enumerate").report.plan
    assert windowed.cp == 1 and full.cp > 1


@pytest.mark.parametrize("skip", [None, 2])
def test_backends_agree_with_a_window(skip):
    """CP-SAT, HiGHS and the enumerator find the same optimum and plan on an MoE model with a
    window on every layer or every other one (gpt-oss's alternation), context parallelism
    allowed by the constraints and kept off by the rule."""
    from tests.test_solvers import _agree
    model = {"layers": 8, "hidden": 2880, "heads": 64, "kv_heads": 8, "head_dim": 64,
             "ffn_hidden": 2880, "gated_mlp": True, "vocab": 201088, "seq_len": 16384,
             "tied_embeddings": False, "position_embedding": "rope", "dropout": False,
             "normalization": "rmsnorm", "experts": 32, "top_k": 4, "window_size": 127,
             **({"window_attn_skip_freq": skip} if skip else {})}
    _agree({"model": model, "training": {"global_batch": 32, "precision": "bf16"},
            "cluster": {"gpu": "h100-sxm", "nodes": 2},
            "constraints": {"max_cp": 4, "max_recompute_layers": 0, "optimizer_offload": False}})


def test_the_exports_build_the_window():
    """Megatron-LM ``--window-size left,0`` and ``--window-attn-skip-freq`` (a quoted list
    expression where no integer says the pattern: Megatron-LM evaluates it), NeMo the
    TransformerConfig fields; torchtitan 0.2's gpt_oss model windows every other layer from
    the first with the query's own key counted (sliding_window_size = left + 1), which the
    export names where it fits and says cannot be expressed otherwise; DeepSpeed's JSON says
    the model code must build it."""
    plan = {"tp": 2, "pp": 2, "dp": 4, "micro_batch": 1}
    pattern = [0] * 5 + [1] * 20 + [0, 1] * 3 + [0]
    for skip, flag in ((None, None), (4, "4"), (pattern, pattern)):
        model = {**MISTRAL, **({"window_attn_skip_freq": skip} if skip else {})}
        doc = _doc(model, plan)
        a = parse_megatron(emitted(doc, plan, "megatron"))
        assert a["--window-size"] == "4095,0"
        if flag is None:
            assert "--window-attn-skip-freq" not in a
        elif isinstance(flag, str):
            assert a["--window-attn-skip-freq"] == flag
        else:       # as Megatron-LM's _eval_pattern reads it: these characters, evaluated
            assert not re.search(r"[^,\d\[\]\(\)\+\*]", a["--window-attn-skip-freq"])
            assert eval(a["--window-attn-skip-freq"]) == flag
        y = parse_yaml(emitted(doc, plan, "nemo"))        # (flow lists stay text there)
        assert json.loads(str(y["model.config.window_size"])) == [4095, 0]
        got = y.get("model.config.window_attn_skip_freq")
        assert (json.loads(str(got)) if got is not None else None) == skip
    fsdp = {"tp": 1, "pp": 1, "dp": 16, "micro_batch": 1, "dp_sharding": "optim_grads_params"}
    oss = {**MISTRAL, "experts": 16, "top_k": 4, "window_size": 127, "window_attn_skip_freq": 2}
    said = emitted(_doc(oss, fsdp), fsdp, "torchtitan").replace("\n#   ", " ")
    assert "gpt_oss model builds it (sliding_window_size 128" in said
    for other in ({**oss, "window_size": 4095}, {**MISTRAL, "window_attn_skip_freq": 2}):
        said = emitted(_doc(other, fsdp), fsdp, "torchtitan").replace("\n#   ", " ")
        assert "cannot express with torchtitan 0.2's model flavors" in said
    assert "window_how" in emitted(_doc(MISTRAL, plan), plan, "deepspeed")
    full = {k: v for k, v in MISTRAL.items() if k != "window_size"}
    assert "window" not in emitted(_doc(full, plan), plan, "megatron")


@pytest.mark.parametrize("keys, words", [
    ({"window_attn_skip_freq": 2}, "window_attn_skip_freq needs window_size"),
    ({"window_size": [4095, 1]}, "expected \\[left, 0\\]"),
    ({"window_size": 0}, "expected a whole number of tokens"),
    ({"window_size": 4095, "window_attn_skip_freq": 1}, "expected N >= 2"),
    ({"window_size": 4095, "window_attn_skip_freq": [1, 0]}, "one 0 or 1 per layer"),
    ({"window_size": 4095, "window_attn_skip_freq": [0] * 32}, "marks no layer windowed"),
    ({"window_size": 4095, "window_attn_skip_freq": [2] * 32}, "values other than 0 and 1"),
    ({"window_size": "4095"}, "expected a whole number of tokens or \\[left, 0\\] \\(got"),
    ({"window_size": 4095, "window_attn_skip_freq": [True, False]},
     "expected a whole number N or a list of 0 / 1 per layer"),
])
def test_window_keys_that_megatron_would_not_read_are_input_errors(keys, words):
    model = {k: v for k, v in MISTRAL.items() if k != "window_size"}
    with pytest.raises(InputError, match=words):
        parse_instance(_doc({**model, **keys}))


def _megatron_layout(layers: int, pp: int, vp: int, first: int = 0, last: int = 0,
                     emb: bool = False, loss: bool = False) -> list[list[int]]:
    """The decoder layers (numbered from 1) each pipeline rank builds, as Megatron-Core's
    get_transformer_layer_offset and get_num_layers_to_build place them: an uneven split
    (first / last stage counts, vp = 1), or the embedding and loss counted as layers (the
    first chunk of the first rank builds one layer fewer, the last chunk of the last rank
    too; offsets past the first chunk shift back by the embedding)."""
    if first or last:
        middle = (layers - first - last) // (pp - 2) if pp > 2 else 0
        sizes = [first] + [middle] * (pp - 2) + [last]
        starts = [sum(sizes[:r]) for r in range(pp)]
        return [list(range(starts[r] + 1, starts[r] + sizes[r] + 1)) for r in range(pp)]
    total = layers + emb + loss
    n = total // (pp * vp)
    out = []
    for r in range(pp):
        built = []
        for j in range(vp):
            start = j * (total // vp) + r * n
            count = n - (emb and r == 0 and j == 0) - (loss and r == pp - 1 and j == vp - 1)
            if emb and not (r == 0 and j == 0):
                start -= 1
            built += list(range(start + 1, start + count + 1))
        out.append(built)
    return out


#: (pp, vp, layout keys) on 36 layers: even splits, interleaved ones, the embedding and loss
#: counted as layers, and uneven first / last stages shorter and longer than a middle one
LAYOUTS = [(2, 1, {}), (4, 1, {}), (4, 3, {}), (4, 9, {}), (6, 2, {}), (3, 4, {}),
           (2, 1, {"emb": True, "loss": True}), (2, 19, {"emb": True, "loss": True}),
           (4, 1, {"first": 8, "last": 8}), (4, 1, {"first": 12, "last": 4}),
           (3, 1, {"first": 10, "last": 14})]


@pytest.mark.parametrize("skip", [2, 3, 6, [0, 1, 1, 0, 1, 1] * 6])
@pytest.mark.parametrize("pp, vp, layout", LAYOUTS)
def test_the_slowest_stage_holds_the_most_full_attention_layers(skip, pp, vp, layout):
    """The pace is the stage with the most full-attention layers: the bound the model takes
    (each of a rank's vp chunks holds at most the most full layers of any run of that many
    consecutive layers) is never below what Megatron-Core's chunk placement gives the fullest
    rank, and equals it for gpt-oss's alternation whenever a rank's chunks start in the same
    phase of it (pp times the chunk's layers even: every layout but odd pp with odd chunks)."""
    from planner.model.algebra import run_max
    spec = ModelSpec(**{**MISTRAL, "layers": 36, "window_attn_skip_freq": skip})
    sh = Shape.of(spec)
    full = [not w for w in spec.windowed_layers]
    stages = _megatron_layout(36, pp, vp, **layout)
    assert sorted(n for stage in stages for n in stage) == list(range(1, 37))
    fullest = max(sum(full[n - 1] for n in stage) for stage in stages)
    # the model's padded count and shortfalls (docs/model.md, "Pipeline layout")
    padded = 36 + layout.get("emb", 0) + layout.get("loss", 0)
    sf = sl = 0
    if layout.get("first"):
        middle = (36 - layout["first"] - layout["last"]) // (pp - 2)
        sf, sl = middle - layout["first"], middle - layout["last"]
        padded = 36 + sf + sl
    longer = min(0, sf, sl)
    bound = vp * run_max(pp * vp, padded - longer * pp, sh.full_marks)
    assert bound >= fullest
    if skip == 2 and not layout and pp * (36 // (pp * vp)) % 2 == 0:
        assert bound == fullest


def test_interleaving_one_layer_per_chunk_leaves_gpt_oss_alternation_no_saving():
    """With gpt-oss's alternation on 4 pipeline ranks and one layer per virtual chunk, ranks
    1 and 3 build only even-numbered (full-attention) layers, and the pace is theirs: the
    step costs what it costs without a window. Without interleaving each rank holds 9
    consecutive layers, at most 5 of them full: a saving, smaller than the average's."""
    model = {**MISTRAL, "layers": 36, "window_attn_skip_freq": 2}
    full = {k: v for k, v in model.items() if not k.startswith("window")}
    for vp, holds in ((9, "none"), (1, "some")):
        plan = {"tp": 1, "pp": 4, "dp": 4, "vp": vp, "micro_batch": 1, "recompute": "full"}
        t_win, t_full = _report(model, plan).step_time_s, _report(full, plan).step_time_s
        if holds == "none":
            assert t_win == pytest.approx(t_full, rel=1e-12)
        else:
            assert t_win < t_full


def test_a_window_covering_the_sequence_is_full_attention():
    """A window of seq_len - 1 keys or more, or Megatron-Core's infinite -1, attends as full
    causal attention does: no window rule (context parallelism stays open), no window in the
    exports, the same step; -1 overrides a Hugging Face config's window."""
    plan = {"tp": 1, "pp": 1, "dp": 8, "cp": 2, "micro_batch": 1, "recompute": "full"}
    full = {k: v for k, v in MISTRAL.items() if k != "window_size"}
    base = _report(full, plan)
    for w in (MISTRAL["seq_len"] - 1, 10**6, -1, [-1, 0]):
        rep = _report({**MISTRAL, "window_size": w}, plan)
        assert not rep.violations and rep.step_time_s == pytest.approx(base.step_time_s,
                                                                       rel=1e-12)
        assert "window" not in emitted(_doc({**MISTRAL, "window_size": w}, plan), plan,
                                       "megatron")

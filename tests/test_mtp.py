"""Multi-token prediction (``[model] mtp_layers``: DeepSeek-V3's MTP module, Megatron-Core's
``--mtp-num-layers``): checked against DeepSeek's published weight counts and against the
model's own pipeline rules (the depths run on the last stage)."""

from __future__ import annotations

import pytest

from planner.app.emit import emit
from planner.model.evaluate import evaluate
from planner.model.plan import plan_from_spec
from planner.model.workload import Shape
from tests.test_mla import DEEPSEEK_V2_LITE, _inst


def _report(inst):
    return evaluate(inst, plan_from_spec(inst, inst.spec.plan), spec=inst.spec.plan)


def test_deepseek_v3_weights_with_its_prediction_module_are_the_released_ones():
    """DeepSeek-V3's README: 685B on Hugging Face, "671B of the Main Model weights and 14B of
    the Multi-Token Prediction (MTP) Module weights"; README_WEIGHTS.md: the MTP module has
    "11.5B unique parameters, excluding the shared 0.9B Embedding and 0.9B output Head" (the
    checkpoint stores those two again)."""
    with_mtp = Shape.of(_inst({"preset": "deepseek-v3"}).model)
    without = Shape.of(_inst({"preset": "deepseek-v3", "mtp_layers": 0}).model)
    assert with_mtp.mtp == 1 and with_mtp.mtp_moe      # the last of the 61 layers is MoE
    unique = with_mtp.total_params - without.total_params
    assert unique / 1e9 == pytest.approx(11.5, rel=0.015)
    assert without.total_params / 1e9 == pytest.approx(671, rel=0.005)
    stored = with_mtp.total_params + 2 * with_mtp.V * with_mtp.h     # embedding and head again
    assert stored / 1e9 == pytest.approx(685, rel=0.005)


#: a 4-layer MLA MoE model on two pipeline stages, its layers even (2 + 2) or the last stage
#: two layers short (4 + 0 is no layout: 3 + 1)
PLAN = {"tp": 1, "pp": 2, "dp": 4, "ep": 4, "micro_batch": 1, "recompute": "none"}


def _lite(mtp, **plan):
    model = {**DEEPSEEK_V2_LITE, "layers": 4, "mtp_layers": mtp}
    return _report(_inst(model, {**PLAN, **plan}))


def test_the_prediction_depths_run_on_the_last_stage():
    """With the layers split evenly the last stage (its two layers, the output layer and now a
    prediction layer, its projection and a second output layer) sets the pace: the step grows.
    With the last stage one layer short, the depth takes the place of the missing layer and
    the step grows less. The first stage's memory is unchanged; the last stage's grows by at
    least the prediction layer's weights and its second logits."""
    even = {mtp: _lite(mtp) for mtp in (0, 1)}
    short = {mtp: _lite(mtp, first_stage_layers=3, last_stage_layers=1) for mtp in (0, 1)}
    grow_even = even[1].step_time_s - even[0].step_time_s
    grow_short = short[1].step_time_s - short[0].step_time_s
    assert grow_even > 0 and 0 <= grow_short < grow_even
    by_stage = {mtp: even[mtp].memory_by_stage_gib for mtp in (0, 1)}
    firsts = [k for k in by_stage[0] if k.startswith("first") and not k.endswith("_step")]
    lasts = [k for k in by_stage[0] if k.startswith("last") and not k.endswith("_step")]
    for k in firsts:
        assert by_stage[1][k]["total"] == pytest.approx(by_stage[0][k]["total"], rel=1e-12)
    sh = Shape.of(_inst({**DEEPSEEK_V2_LITE, "mtp_layers": 1}).model)
    layer_gib = sh.mtp_layer_params * 2 / 4 / 2**30      # 16-bit, its experts over ep = 4
    for k in lasts:
        assert by_stage[1][k]["weights"] - by_stage[0][k]["weights"] > 0.9 * layer_gib
        assert by_stage[1][k]["logits"] == pytest.approx(2 * by_stage[0][k]["logits"])


def test_the_prediction_depths_are_exported():
    inst = _inst({"preset": "deepseek-v3"}, {"tp": 2, "pp": 1, "dp": 4, "micro_batch": 1,
                                             "ep": 4})
    plan = plan_from_spec(inst, inst.spec.plan)
    assert "--mtp-num-layers 1" in emit(inst, plan, "megatron")
    assert "mtp_num_layers: 1" in emit(inst, plan, "nemo")
    none = _inst({"preset": "deepseek-v3", "mtp_layers": 0}, inst.spec.plan.model_dump(
        exclude_none=True))
    assert "mtp" not in emit(none, plan_from_spec(none, none.spec.plan), "megatron")


def test_backends_agree_with_a_prediction_depth():
    """Two stages, the last one free to give up layers to the depth (an even split pays the
    depth's collectives, a last stage two layers short does not): CP-SAT, HiGHS and the
    enumerator find the same plan, the short last stage. Layouts whose terms differ in the
    depth's collectives once made the search refuse the instance ("categorical choices changed
    the structure of obj"); the shipped DeepSeek-V3 instance covers the free pipeline degree
    (tests/test_one_answer.py)."""
    from tests.test_solvers import _agree, outcome
    doc = {"model": {**DEEPSEEK_V2_LITE, "layers": 6, "mtp_layers": 1},
           "training": {"global_batch": 32, "precision": "bf16"},
           "cluster": {"gpu": "h100-sxm", "nodes": 2},
           "constraints": {"pp": 2, "max_recompute_layers": 0, "optimizer_offload": False,
                           "max_stage_shortfall": 2}}
    _agree(doc)
    from planner.model.instance import parse_instance
    plan = outcome(parse_instance(doc), "enumerate").report.plan
    assert plan.to_dict()["stage_layers"] == [4, 2]


def test_prediction_depths_need_rotary_positions():
    """Megatron-LM's validate_args: "Multi-Token Prediction (MTP) is not supported with
    learned_absolute position embedding type"; the export would not start, so the input is
    refused, naming the key."""
    from planner.model.errors import InputError
    with pytest.raises(InputError) as exc:
        _inst({"preset": "gpt-1.3b", "mtp_layers": 1})
    assert 'position_embedding = "rope"' in str(exc.value) and "mtp_layers" in str(exc.value)


def test_prediction_depths_pay_their_collectives_beyond_the_last_stage_s_shortfall():
    """At pp = 1 every depth's layer adds its tensor-parallel collectives and expert
    all-to-alls (each depth the same); on two stages with the last one layer short, one depth
    adds none (the fullest stage's count already covers it)."""
    model = {**DEEPSEEK_V2_LITE, "layers": 4}
    comm = {}
    for mtp in (0, 1, 2):
        rep = _report(_inst({**model, "mtp_layers": mtp},
                            {"tp": 2, "pp": 1, "dp": 4, "ep": 4, "micro_batch": 1}))
        comm[mtp] = (rep.breakdown_s["tp_comm"], rep.breakdown_s["ep_comm"])
    for i in (0, 1):
        step1 = comm[1][i] - comm[0][i]
        assert step1 > 0 and comm[2][i] - comm[1][i] == pytest.approx(step1, rel=1e-9)
    short = {mtp: _lite(mtp, first_stage_layers=3, last_stage_layers=1) for mtp in (0, 1)}
    for term in ("tp_comm", "ep_comm"):
        assert short[1].breakdown_s[term] == pytest.approx(short[0].breakdown_s[term], rel=1e-12)

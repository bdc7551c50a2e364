"""Inputs that mean one thing (issue 13): ``[model] hf_config`` takes seq_len from the instance
(never from max_position_embeddings) and is not combined with a preset; ``plan evaluate`` and
``plan solve`` share one default for sequence parallelism and the distributed optimizer, and the
published runs state their own knobs, so the validation does not depend on that default."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from formulations.solve import solve
from planner.model import plan as plan_mod
from planner.app.runs_file import load_runs
from planner.app.validate import summary, validate_runs
from planner.model.errors import InputError
from planner.model.evaluate import evaluate
from planner.model.instance import load_instance, parse_instance
from planner.model.plan import plan_from_spec
from planner.model.schema import KNOB_DEFAULTS, PlanSpec

QWEN2_7B = {   # the public Qwen2-7B config.json values the planner reads
    "model_type": "qwen2", "num_hidden_layers": 28, "hidden_size": 3584,
    "num_attention_heads": 28, "num_key_value_heads": 4, "intermediate_size": 18944,
    "vocab_size": 152064, "max_position_embeddings": 131072, "tie_word_embeddings": False,
}


def _instance(tmp_path: Path, model: str) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(QWEN2_7B))
    path = tmp_path / "qwen.toml"
    path.write_text(f'[model]\nhf_config = "config.json"\n{model}\n[training]\n'
                    'global_batch = 64\n[cluster]\ngpu = "h100-sxm"\nnodes = 1\n')
    return path


def test_hf_config_without_seq_len_names_model_seq_len(tmp_path):
    with pytest.raises(InputError) as info:
        load_instance(_instance(tmp_path, ""))
    text = str(info.value)
    assert "model.seq_len" in text and "max_position_embeddings = 131,072" in text


def test_hf_config_seq_len_from_the_instance(tmp_path):
    inst = load_instance(_instance(tmp_path, "seq_len = 4096"))
    assert inst.model.seq_len == 4096 and inst.model.layers == 28 and inst.model.kv == 4


def test_hf_config_seq_len_beyond_the_maximum_warns(tmp_path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load_instance(_instance(tmp_path, "seq_len = 262144"))
    assert any("max_position_embeddings = 131,072" in str(w.message) for w in caught)


def test_preset_and_hf_config_together_is_an_error(tmp_path):
    with pytest.raises(InputError) as info:
        load_instance(_instance(tmp_path, 'preset = "llama3-8b"\nseq_len = 4096'))
    assert "model.preset" in str(info.value) and "model.hf_config" in str(info.value)


# ---- one set of defaults ---------------------------------------------------------------------

BASE = {"model": {"preset": "gpt-1.3b"}, "training": {"global_batch": 64},
        "cluster": {"gpu": "a100-40gb", "nodes": 1}}


def test_plan_knobs_default_to_what_solve_searches():
    inst = parse_instance({**BASE, "plan": {"tp": 2}})
    p = plan_from_spec(inst, inst.spec.plan)
    assert (p.sequence_parallel, p.distributed_optimizer) == (
        KNOB_DEFAULTS["sequence_parallel"], KNOB_DEFAULTS["distributed_optimizer"])
    pinned = parse_instance({**BASE, "plan": {"tp": 2},
                             "constraints": {"sequence_parallel": False}})
    assert plan_from_spec(pinned, pinned.spec.plan).sequence_parallel is False
    explicit = parse_instance({**BASE, "plan": {"tp": 2, "distributed_optimizer": False},
                               "constraints": {"distributed_optimizer": True}})
    assert plan_from_spec(explicit, explicit.spec.plan).distributed_optimizer is False


def test_evaluate_of_the_optimum_degrees_reproduces_solve():
    """Write solve's degrees and sharding into [plan] without sequence parallelism (its default
    is the search's): evaluate gives solve's numbers. (The sharding mode has no such default:
    the search compares every mode.)"""
    inst = parse_instance(BASE)
    best = solve(inst, solver="enumerate").report
    p = best.plan
    spec = PlanSpec(tp=p.tp, pp=p.pp, dp=p.dp, cp=p.cp, vp=p.vp, micro_batch=p.micro_batch,
                    recompute=p.recompute, dp_sharding=p.dp_sharding,
                    dp_shard_size=p.dp_shard_size, reshard_after_forward=p.reshard_after_forward)
    rep = evaluate(inst, plan_from_spec(inst, spec))
    assert rep.step_time_s == pytest.approx(best.step_time_s, rel=1e-12)
    assert rep.memory_gib["total"] == pytest.approx(best.memory_gib["total"], rel=1e-12)


def test_published_runs_state_their_knobs(monkeypatch):
    """Each run names sequence_parallel and distributed_optimizer, so flipping the default
    changes no prediction and no memory figure: the validation means what the runs ran."""
    data = load_runs()
    for run in data["runs"]:
        assert {"sequence_parallel", "distributed_optimizer"} <= set(run["plan"]), run["id"]
    before = validate_runs(data)
    flipped = {k: not x for k, x in KNOB_DEFAULTS.items()}
    monkeypatch.setattr(plan_mod, "KNOB_DEFAULTS", flipped)
    after = validate_runs(data)
    for a, b in zip(before, after):
        assert (a.predicted_s, a.report.memory_gib["total"]) == (
            b.predicted_s, b.report.memory_gib["total"]), a.id
    assert summary(before) == summary(after)


# ---- tp_within_node defaults to true ---------------------------------------------------------

def test_tensor_parallelism_stays_inside_a_node_by_default():
    """Two 8-GPU nodes, a model whose heads allow TP16: the default keeps TP within the node;
    tp_within_node = false lets it cross."""
    doc = {"model": {"layers": 4, "hidden": 2048, "heads": 16, "vocab": 32000,
                     "seq_len": 1024},
           "training": {"global_batch": 1},
           "cluster": {"gpu": "a100-80gb", "nodes": 2}}
    inst = parse_instance(doc)
    assert inst.spec.constraints.tp_within_node is True
    plan = solve(inst, solver="enumerate").report.plan
    assert plan.tp_intra == plan.tp
    free = parse_instance({**doc, "constraints": {"tp_within_node": False, "max_pp": 1}})
    crossed = solve(free, solver="enumerate").report.plan
    assert crossed.tp == 16 and crossed.tp_intra == 8        # global batch 1: only TP is left


def test_evaluate_judges_a_plan_only_by_rules_the_instance_sets():
    doc = {"model": {"layers": 4, "hidden": 2048, "heads": 16, "vocab": 32000,
                     "seq_len": 1024},
           "training": {"global_batch": 16},
           "cluster": {"gpu": "a100-80gb", "nodes": 2}, "plan": {"tp": 16}}
    inst = parse_instance(doc)
    assert evaluate(inst, plan_from_spec(inst, inst.spec.plan)).violations == []
    strict = parse_instance({**doc, "constraints": {"tp_within_node": True}})
    rep = evaluate(strict, plan_from_spec(strict, strict.spec.plan))
    assert any("constraints.tp_within_node = true" in v for v in rep.violations)

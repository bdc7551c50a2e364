"""Bad input gives clear errors that name the key (docs/contract.md, "Instance files"), and presets fill keys.

Every error is a :class:`planner.model.errors.InputError`; the checks read ``str(exc)``, which is what
the CLI prints.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from planner.model.errors import InputError
from planner.model.instance import load_instance, parse_instance, presets

ROOT = Path(__file__).resolve().parents[1]


def base() -> dict:
    return {
        "model": {"layers": 4, "hidden": 64, "heads": 4, "vocab": 128, "seq_len": 32},
        "training": {"global_batch": 8},
        "cluster": {"gpu": "a100-80gb", "nodes": 1},
    }


def error_of(data: dict, source: str = "job.toml") -> str:
    with pytest.raises(InputError) as info:
        parse_instance(data, source)
    return str(info.value)


def test_valid_base_parses():
    inst = parse_instance(base())
    assert inst.gpus == 8 and inst.model.kv == 4 and inst.model.ffn == 256


def test_unknown_key_names_the_path():
    d = base()
    d["model"]["hiden"] = 64
    msg = error_of(d)
    assert "model.hiden" in msg
    assert "unknown key" in msg
    assert msg.startswith("job.toml")             # names the file


@pytest.mark.parametrize("section, key", [("training", "tokenz"), ("cluster", "gpus_per_nod"),
                                          ("plan", "tpp"), ("constraints", "max_tpp")])
def test_unknown_key_in_each_section(section, key):
    d = base()
    d.setdefault(section, {})[key] = 1
    assert f"{section}.{key}: unknown key" in error_of(d)


def test_unknown_section():
    d = base()
    d["modle"] = {"layers": 4}
    assert "modle: unknown key" in error_of(d)


def test_heads_not_divisible_by_kv_heads():
    d = base()
    d["model"]["kv_heads"] = 3
    msg = error_of(d)
    assert "model" in msg
    assert "heads (4) must be divisible by kv_heads (3)" in msg


def test_hidden_not_divisible_by_heads():
    d = base()
    d["model"]["hidden"] = 66
    assert "hidden (66) must be divisible by heads (4)" in error_of(d)


@pytest.mark.parametrize("section, key, value", [
    ("model", "layers", 0),
    ("model", "layers", -4),
    ("model", "hidden", -64),
    ("model", "seq_len", 0),
    ("training", "tokens", -1.0),
    ("cluster", "efficiency", 0),
    ("cluster", "intra_node_bandwidth_GBps", -1),
    ("cluster", "price_per_gpu_hour", 0),
    ("plan", "tp", 0),
    ("plan", "micro_batch", -1),
    ("training", "global_batch", 0),
    ("cluster", "nodes", -2),
])
def test_non_positive_numbers(section, key, value):
    d = base()
    d.setdefault(section, {})[key] = value
    msg = error_of(d)
    assert f"{section}.{key}: " in msg                         # the exact key path, then ':'
    assert re.search(r"greater than (or equal to )?0", msg)
    assert repr(value) in msg or str(value) in msg            # the offending value
    assert "constrained-int" not in msg and "tuple[" not in msg
    assert len(msg.splitlines()) == 2                           # header + one problem


def test_fraction_out_of_range():
    d = base()
    d["training"]["bubble_ratio"] = 1.5
    assert "training.bubble_ratio: " in error_of(d)


def test_replaced_overlap_fraction_names_the_switches():
    d = base()
    d["training"]["dp_overlap"] = 0.5
    msg = error_of(d)
    assert "dp_overlap" in msg and "overlap_grad_reduce" in msg


def test_unknown_gpu_lists_known_ones():
    d = base()
    d["cluster"]["gpu"] = "a100"
    msg = error_of(d)
    assert "cluster.gpu" in msg and '"a100"' in msg
    known = sorted(p.stem for p in (ROOT / "hardware_catalog").glob("*.toml"))
    assert known
    for name in known:
        assert name in msg


def test_fp8_on_a_gpu_without_fp8():
    d = base()
    d["training"]["precision"] = "fp8"
    msg = error_of(d)
    assert "training.precision" in msg and "FP8" in msg


def test_unknown_preset_lists_known_ones():
    d = base()
    d["model"] = {"preset": "gpt-4"}
    msg = error_of(d)
    assert "model.preset" in msg and '"gpt-4"' in msg
    for name in presets():
        assert name in msg


def test_nodes_and_gpus_both_given():
    d = base()
    d["cluster"]["gpus"] = 8
    msg = error_of(d)
    assert "cluster" in msg and "nodes" in msg and "gpus" in msg
    assert "exactly one" in msg


def test_neither_nodes_nor_gpus():
    d = base()
    del d["cluster"]["nodes"]
    assert "give exactly one of nodes, node_counts or gpus" in error_of(d)


def test_gpus_that_do_not_fill_nodes():
    d = base()
    d["cluster"] = {"gpu": "a100-80gb", "gpus": 12}
    msg = error_of(d)
    assert "cluster.gpus" in msg and "12" in msg


def test_missing_section():
    d = base()
    del d["training"]
    assert "training: required key is missing" in error_of(d)


def test_bad_recompute_mode():
    d = base()
    d["plan"] = {"recompute": "sometimes"}
    msg = error_of(d)
    assert "plan.recompute" in msg and '"sometimes"' in msg


def test_bad_constraint_recompute_names_the_key_once():
    d = base()
    d["constraints"] = {"recompute": "sometimes"}
    msg = error_of(d)
    assert "constraints.recompute: " in msg and '"sometimes"' in msg
    assert "list[" not in msg
    assert len(msg.splitlines()) == 2


def test_missing_file(tmp_path):
    path = tmp_path / "nope.toml"
    with pytest.raises(InputError) as info:
        load_instance(path)
    msg = str(info.value)
    assert str(path) in msg and "no such file" in msg


def test_toml_syntax_error_names_the_line(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text('[model]\nlayers = 4\nhidden = = 64\n')
    with pytest.raises(InputError) as info:
        load_instance(path)
    msg = str(info.value)
    assert str(path) in msg
    assert "TOML syntax error" in msg
    assert "line 3" in msg


def test_load_instance_reports_key_with_file_name(tmp_path):
    path = tmp_path / "job.toml"
    path.write_text('[model]\nlayers = 4\nhiden = 64\nheads = 4\nvocab = 128\nseq_len = 32\n'
                    '[training]\nglobal_batch = 8\n[cluster]\ngpu = "a100-80gb"\nnodes = 1\n')
    with pytest.raises(InputError) as info:
        load_instance(path)
    msg = str(info.value)
    assert msg.startswith(str(path))
    assert "model.hiden" in msg
    assert "model.hidden: required key is missing" in msg


# ------------------------------------------------------------------------------------------
# presets
# ------------------------------------------------------------------------------------------


def test_preset_fills_keys():
    d = base()
    d["model"] = {"preset": "llama3-70b"}
    m = parse_instance(d).model
    assert (m.layers, m.hidden, m.heads, m.kv, m.ffn, m.vocab, m.seq_len) == (
        80, 8192, 64, 8, 28672, 128256, 8192)
    assert m.gated_mlp is True and m.tied_embeddings is False
    assert m.name == "llama3-70b"


def test_explicit_keys_override_preset():
    d = base()
    d["model"] = {"preset": "gpt3-175b", "layers": 48, "seq_len": 4096, "name": "half-gpt3"}
    m = parse_instance(d).model
    assert m.layers == 48 and m.seq_len == 4096 and m.name == "half-gpt3"
    assert m.hidden == 12288 and m.heads == 96 and m.vocab == 51200   # from the preset


def test_preset_with_a_misspelt_override_is_still_an_error():
    d = base()
    d["model"] = {"preset": "gpt3-175b", "layer": 48}
    assert "model.layer: unknown key" in error_of(d)


def test_preset_override_still_validated():
    d = base()
    d["model"] = {"preset": "gpt3-175b", "heads": 7}
    assert "must be divisible by heads (7)" in error_of(d)


def test_shipped_instances_parse():
    for path in sorted((ROOT / "instances").glob("*.toml")):
        inst = load_instance(path)
        assert inst.gpus > 0 and inst.spec.plan is not None


@pytest.mark.parametrize("section, key, value, needle", [
    ("model", "layers", True, "valid integer"),            # not 1
    ("model", "layers", "24", "valid integer"),
    ("model", "gated_mlp", "yes", "valid boolean"),
    ("training", "global_batch", "512", "global_batch"),
    ("training", "tokens", float("inf"), "finite number"),
    ("cluster", "price_per_gpu_hour", float("inf"), "finite number"),
    ("cluster", "node_counts", [], "at least 1 item"),
    ("model", "layers", 10**19, "less than or equal to 100000"),
    ("model", "hidden", 2**40, "less than or equal to"),
    ("training", "global_batch", 2**62, "less than or equal to"),
])
def test_strict_types_and_limits(section, key, value, needle):
    d = base()
    if section == "cluster" and key == "node_counts":
        d["cluster"].pop("nodes")
    d[section][key] = value
    msg = error_of(d)
    assert f"{section}.{key}" in msg and needle in msg, msg


def test_preset_must_be_a_name():
    d = base()
    d["model"]["preset"] = ["gpt-1.3b"]
    assert "model.preset: expected a preset name" in error_of(d)


@pytest.mark.parametrize("constraints, needle", [
    ({"tp": 8, "max_tp": 2}, "tp = 8 exceeds max_tp = 2"),
    ({"dp": 8, "max_dp": 2}, "dp = 8 exceeds max_dp = 2"),
    ({"cp": 4, "max_cp": 2}, "cp = 4 exceeds max_cp = 2"),
    ({"micro_batch": 64, "max_micro_batch": 32}, "micro_batch = 64 exceeds max_micro_batch = 32"),
    ({"micro_batch": 2, "min_micro_batch": 4}, "below min_micro_batch = 4"),
    ({"min_micro_batch": 8, "max_micro_batch": 4}, "min_micro_batch = 8 exceeds"),
    ({"vp": 4, "pp": 1}, "needs pp > 1"),
    ({"vp": 2, "max_pp": 1}, "max_pp = 1"),
])
def test_pins_outside_their_caps_name_both_keys(constraints, needle):
    d = base()
    d["constraints"] = constraints
    msg = error_of(d)
    assert "constraints" in msg and needle in msg, msg


def test_a_pin_raises_a_default_cap():
    """cp = 2 with the default max_cp = 1, micro_batch = 64 with the default cap 32: the pin is
    what the user asked for."""
    d = base()
    d["constraints"] = {"cp": 2, "micro_batch": 64}
    c = parse_instance(d).spec.constraints
    assert (c.max_cp, c.max_micro_batch) == (2, 64)


def test_moe_keys_on_a_dense_model_are_an_error():
    d = base()
    d["model"]["top_k"] = 4
    msg = error_of(d)
    assert "top_k given for a dense model" in msg


def test_memory_reserve_must_leave_memory():
    d = base()
    d["constraints"] = {"memory_reserve_GiB": 1000}
    msg = error_of(d)
    assert "constraints.memory_reserve_GiB" in msg and "leaves no memory" in msg


def test_a_new_cluster_section_is_resolved_as_a_file_holding_it_would_be():
    """``with_spec(cluster=...)`` looks the GPU up again (its peaks, memory, kernel figures)
    and sizes the cluster anew; it used to keep the old GPU's hardware under the new name,
    which an export's cost line (planner/app/emit/common.py, ``costed``) then evaluated at zero
    FLOP/s: NVFP4 on an H100's figures."""
    inst = load_instance(Path(__file__).resolve().parent.parent / "instances"
                         / "llama3-70b-h100.toml")
    moved = inst.with_spec(cluster=inst.spec.cluster.model_copy(update={"gpu": "b200"}))
    assert moved.hw.gpu.key == "b200" and moved.hw.peak_fp4 > 0
    assert moved.hw.hbm_bytes > inst.hw.hbm_bytes and moved.gpus == inst.gpus
    fp8 = inst.with_spec(training=inst.spec.training.model_copy(update={"precision": "fp8"}))
    with pytest.raises(InputError, match='cluster.gpu = "a100-80gb" has not'):
        fp8.with_spec(cluster=fp8.spec.cluster.model_copy(update={"gpu": "a100-80gb"}))

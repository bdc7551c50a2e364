"""Launch configurations: each format, parsed back, carries every knob of the plan."""

from __future__ import annotations

import dataclasses
import json
import shlex
import tomllib
from pathlib import Path

import pytest

from planner.app.emit import FORMATS, emit
from planner.model.frameworks import SHARDING_MODES, framework_violations
from planner.model.errors import InputError
from planner.model.instance import Instance, load_instance, parse_instance
from planner.model.plan import ORDER, Plan, default_placement, plan_from_spec
from planner.model.schema import ModelSpec

INSTANCES = Path(__file__).resolve().parent.parent / "instances"


def _inst(name: str, precision: str | None = None) -> Instance:
    inst = load_instance(INSTANCES / name)
    if precision:
        inst = inst.with_spec(training=inst.spec.training.model_copy(update={"precision": precision}))
    return inst


CASES = {
    # the published Megatron-LM run: interleaving, selective recompute, SP, distributed optimizer
    "gpt3-175b": ("gpt3-175b-a100.toml", None, {}),
    # GQA, SwiGLU, untied, rope, no dropout; context parallelism, full recompute, FP8
    "llama3-70b-cp2-full-fp8": ("llama3-70b-h100.toml", "fp8", {"cp": 2, "dp": 8, "recompute": "full"}),
    "llama3-70b": ("llama3-70b-h100.toml", None, {}),
    # data parallel only, no pipeline: torchtitan accumulates gradients
    "gpt-1.3b": ("gpt-1.3b-1node.toml", None, {}),
    # fully sharded (FSDP2), and HSDP with the shard group inside a node
    "llama3-70b-fsdp": ("llama3-70b-h100.toml", None, {"dp_sharding": "optim_grads_params"}),
    "gpt3-175b-hsdp": ("gpt3-175b-a100.toml", None,
                       {"tp": 8, "pp": 1, "dp": 128, "vp": 1, "micro_batch": 1,
                        "dp_sharding": "optim_grads_params", "dp_shard_size": 16,
                        "reshard_after_forward": False}),
    "gpt-1.3b-fp16-ddp": ("gpt-1.3b-1node.toml", "fp16",
                          {"distributed_optimizer": False, "recompute": "selective", "micro_batch": 4}),
    # a pipeline without interleaving, placement in tp-pp-dp order
    "gpt3-175b-pp16": ("gpt3-175b-a100.toml", None,
                       {"tp": 4, "pp": 16, "dp": 16, "vp": 1, "tp_intra": 4, "pp_intra": 2,
                        "dp_intra": 1, "sequence_parallel": False, "distributed_optimizer": False}),
}


def emitted(doc: dict, plan: dict, fmt: str) -> str:
    """The ``fmt`` launch configuration of the instance ``doc`` (a dict, as an instance file
    reads) run with ``plan`` as its ``[plan]``: how the tests of one knob's exports build them."""
    inst = parse_instance({**doc, "plan": plan})
    return emit(inst, plan_from_spec(inst, inst.spec.plan), fmt)


@pytest.fixture(params=sorted(CASES))
def case(request) -> tuple[Instance, Plan]:
    name, precision, overrides = CASES[request.param]
    inst = _inst(name, precision)
    return inst, plan_from_spec(inst, inst.spec.plan, **overrides)


# ------------------------------------------------------------------------------------- parsers

def parse_megatron(text: str) -> dict[str, str | bool]:
    """Flags with their values (a flag followed by another flag is a switch: True)."""
    lines = [ln for ln in text.splitlines()
             if ln.strip() and not ln.startswith(("#", "export "))]
    assert all(ln.endswith(" \\") for ln in lines[:-1]), "every argument line but the last continues"
    assert not lines[-1].endswith("\\")
    tokens = shlex.split(" ".join(ln.rstrip("\\") for ln in lines))    # as the shell reads them
    out: dict[str, str | bool] = {}
    for i, tok in enumerate(tokens):
        if tok.startswith("--"):
            nxt = tokens[i + 1] if i + 1 < len(tokens) else None
            assert tok not in out, f"{tok} given twice"
            out[tok] = nxt if nxt is not None and not nxt.startswith("--") else True
        else:
            assert tokens[i - 1].startswith("--"), f"stray value {tok}"
    return out


def _scalar(v: str):
    v = v.strip()
    if v == "null":
        return None
    if v in ("true", "false"):
        return v == "true"
    try:
        return int(v)
    except ValueError:
        return v


def parse_yaml(text: str) -> dict[str, object]:
    """Flatten nested two-space-indented ``key: value`` YAML to dotted keys."""
    out: dict[str, object] = {}
    stack: list[tuple[int, str]] = []
    for ln in text.splitlines():
        if not ln.strip() or ln.lstrip().startswith("#"):
            continue
        indent = len(ln) - len(ln.lstrip(" "))
        assert indent % 2 == 0, ln
        key, _, val = ln.strip().partition(":")
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = ".".join([k for _, k in stack] + [key])
        if val.strip():
            out[path] = _scalar(val)
        else:
            stack.append((indent, key))
    return out


def comment_text(text: str) -> str:
    """The comment lines as one unwrapped string."""
    return " ".join(ln.lstrip("#").strip() for ln in text.splitlines() if ln.startswith("#"))


# ------------------------------------------------------------------------------------- checks

def test_megatron(case):
    inst, plan = case
    if _refused(inst, plan, "megatron"):
        return
    m, prec = inst.model, inst.spec.training.precision
    a = parse_megatron(emit(inst, plan, "megatron"))
    assert a["--tensor-model-parallel-size"] == str(plan.tp)
    assert a["--pipeline-model-parallel-size"] == str(plan.pp)
    assert a["--context-parallel-size"] == str(plan.cp)
    if plan.vp > 1:
        assert int(a["--num-layers-per-virtual-pipeline-stage"]) * plan.pp * plan.vp == m.layers
    else:
        assert "--num-layers-per-virtual-pipeline-stage" not in a
    assert a["--micro-batch-size"] == str(plan.micro_batch)
    assert a["--global-batch-size"] == str(plan.global_batch)
    # never with TP1: Megatron-Core raises "Cannot use sequence parallelism without tensor
    # parallelism"
    assert a.get("--sequence-parallel", False) is (plan.sequence_parallel and plan.tp > 1)
    assert a.get("--use-distributed-optimizer", False) is plan.distributed_optimizer
    fsdp = plan.dp_sharding in ("optim_grads", "optim_grads_params")
    assert a.get("--data-parallel-sharding-strategy") == (plan.dp_sharding if fsdp else None)
    assert a.get("--use-megatron-fsdp", False) is fsdp
    assert a.get("--num-distributed-optimizer-instances") == (
        str(plan.dp_replicate) if plan.distributed_optimizer and plan.dp_replicate > 1 else None)
    # Megatron-LM validate_args: Megatron-FSDP asserts CUDA_DEVICE_MAX_CONNECTIONS != "1" and
    # --ckpt-format fsdp_dtensor; without it, tensor / context parallelism asserts it is "1"
    assert a.get("--ckpt-format") == ("fsdp_dtensor" if fsdp else None)
    text = emit(inst, plan, "megatron")
    env = "export CUDA_DEVICE_MAX_CONNECTIONS=1" in text.splitlines()
    assert env is ((plan.tp > 1 or plan.cp > 1) and not fsdp)
    assert ("CUDA_DEVICE_MAX_CONNECTIONS=1" in comment_text(text)) is env
    recompute = {"none": {}, "selective": {"--recompute-activations": True},
                 "full": {"--recompute-granularity": "full", "--recompute-method": "uniform",
                          "--recompute-num-layers": "1"}}
    for mode, flags in recompute.items():
        for flag, value in flags.items():
            assert a.get(flag) == (value if mode == plan.recompute else None), flag
    assert a.get("--bf16", False) is (prec != "fp16")
    assert a.get("--fp16", False) is (prec == "fp16")
    assert a.get("--fp8-format") == ("hybrid" if prec == "fp8" else None)
    assert a["--num-layers"] == str(m.layers)
    assert a["--hidden-size"] == str(m.hidden)
    assert a["--num-attention-heads"] == str(m.heads)
    assert a["--ffn-hidden-size"] == str(m.ffn)
    assert a["--seq-length"] == a["--max-position-embeddings"] == str(m.seq_len)
    assert a.get("--num-query-groups") == (str(m.kv) if m.kv < m.heads else None)
    assert a.get("--group-query-attention", False) is (m.kv < m.heads)
    assert a.get("--swiglu", False) is m.gated_mlp
    assert a.get("--untie-embeddings-and-output-weights", False) is (not m.tied_embeddings)
    assert a.get("--position-embedding-type") == ("rope" if m.position_embedding == "rope" else None)
    # (Megatron-LM's defaults, LayerNorm and biases on every linear layer, are the model's)
    assert a.get("--normalization") == ("RMSNorm" if m.normalization == "rmsnorm" else None)
    assert a.get("--disable-bias-linear", False) is (not m.linear_bias)
    assert "--add-qkv-bias" not in a          # (no case has a QKV bias alone)


def test_megatron_comments_size_and_rank_order(case):
    inst, plan = case
    if _refused(inst, plan, "megatron"):
        return
    text = emit(inst, plan, "megatron")
    comments = comment_text(text)
    assert f"{plan.nodes} node" in comments and f"x {inst.node_size} GPUs per node" in comments
    assert "rank order" in comments and "tp innermost, then cp, dp, pp" in comments
    degrees = {d: getattr(plan, d) for d in ORDER}
    default = default_placement(degrees, inst.node_size) == {d: getattr(plan, f"{d}_intra") for d in ORDER}
    assert ("the placement the plan assumes" in comments) is default
    assert ("--use-tp-pp-dp-mapping" in parse_megatron(text)) is (plan.pp_intra > 1)


def test_nemo(case):
    inst, plan = case
    if _refused(inst, plan, "nemo"):
        return
    m, prec = inst.model, inst.spec.training.precision
    y = parse_yaml(emit(inst, plan, "nemo"))
    assert y["trainer.num_nodes"] == plan.nodes
    assert y["trainer.num_nodes"] * y["trainer.devices"] == plan.gpus
    s = "trainer.strategy."
    assert y[s + "tensor_model_parallel_size"] == plan.tp
    assert y[s + "pipeline_model_parallel_size"] == plan.pp
    assert y[s + "virtual_pipeline_model_parallel_size"] == (plan.vp if plan.vp > 1 else None)
    assert y[s + "context_parallel_size"] == plan.cp
    assert y[s + "sequence_parallel"] is (plan.sequence_parallel and plan.tp > 1)
    want_dtype = ("torch.float16" if prec == "fp16" else "torch.bfloat16") if plan.pp > 1 else None
    assert y.get(s + "pipeline_dtype") == want_dtype
    assert y["data.micro_batch_size"] == plan.micro_batch
    assert y["data.global_batch_size"] == plan.global_batch
    assert y["data.seq_length"] == y["model.config.seq_length"] == m.seq_len
    c = "model.config."
    assert y[c + "recompute_granularity"] == (None if plan.recompute == "none" else plan.recompute)
    assert y[c + "recompute_method"] == ("uniform" if plan.recompute == "full" else None)
    assert y[c + "recompute_num_layers"] == (1 if plan.recompute == "full" else None)
    assert (y[c + "num_layers"], y[c + "hidden_size"], y[c + "ffn_hidden_size"],
            y[c + "num_attention_heads"], y[c + "num_query_groups"]) == (
        m.layers, m.hidden, m.ffn, m.heads, m.kv)
    assert (y[c + "normalization"], y[c + "add_bias_linear"]) == (
        {"rmsnorm": "RMSNorm", "layernorm": "LayerNorm"}[m.normalization], m.linear_bias)
    assert y["optim.config.use_distributed_optimizer"] is plan.distributed_optimizer
    assert y["trainer.plugins.precision"] == ("16-mixed" if prec == "fp16" else "bf16-mixed")
    assert y["trainer.plugins.fp8"] == ("hybrid" if prec == "fp8" else None)
    assert y["optim.config.bf16"] is (prec != "fp16") and y["optim.config.fp16"] is (prec == "fp16")


def _refused(inst, plan, fmt) -> bool:
    """A plan the framework cannot run: the export is an error that names the rule."""
    rules = framework_violations(fmt, plan)
    if rules:
        with pytest.raises(InputError) as err:
            emit(inst, plan, fmt)
        assert all(r in str(err.value) for r in rules)
    return bool(rules)


def test_torchtitan(case):
    inst, plan = case
    m, prec = inst.model, inst.spec.training.precision
    if _refused(inst, plan, "torchtitan"):      # ZeRO-1/2, or DDP beside other parallelism
        assert plan.dp_sharding in ("optim", "optim_grads") or max(plan.tp, plan.pp) > 1
        return
    text = emit(inst, plan, "torchtitan")
    t = tomllib.loads(text)
    p, tr = t["parallelism"], t["training"]
    assert p["data_parallel_shard_degree"] * p["data_parallel_replicate_degree"] == plan.dp
    if plan.dp_sharding == "optim_grads_params":        # the mode the model costed: FSDP2
        assert p["data_parallel_shard_degree"] == plan.dp_shard_size
        assert p["fsdp_reshard_after_forward"] == ("always" if plan.reshard_after_forward
                                                   else "never")
    else:
        assert p["data_parallel_shard_degree"] == 1
    assert p["tensor_parallel_degree"] == plan.tp
    assert p["pipeline_parallel_degree"] == plan.pp
    assert p["context_parallel_degree"] == plan.cp
    assert p["enable_async_tensor_parallel"] is False
    assert p["pipeline_parallel_microbatch_size"] == plan.micro_batch
    if plan.pp > 1:
        assert p["pipeline_parallel_schedule"] == ("Interleaved1F1B" if plan.vp > 1 else "1F1B")
        assert p["pipeline_parallel_layers_per_stage"] * plan.pp * plan.vp == m.layers
        assert p["pipeline_parallel_first_stage_less_layers"] == 0
        assert p["pipeline_parallel_last_stage_less_layers"] == 0
        assert tr["local_batch_size"] == plan.micro_batch * plan.micro_batches
    else:
        assert "pipeline_parallel_schedule" not in p
        assert tr["local_batch_size"] == plan.micro_batch
    assert tr["global_batch_size"] == plan.global_batch
    assert tr["global_batch_size"] % (tr["local_batch_size"] * plan.dp) == 0
    assert tr["seq_len"] == m.seq_len
    assert tr["mixed_precision_param"] == "bfloat16"
    assert t["activation_checkpoint"]["mode"] == plan.recompute
    if plan.recompute == "selective":
        assert t["activation_checkpoint"]["selective_ac_option"] == "op"
    fp8 = t.get("model", {}).get("converters") == ["quantize.linear.float8"]
    assert fp8 is (prec == "fp8")
    assert ("float8" in t.get("quantize", {}).get("linear", {})) is (prec == "fp8")
    comments = comment_text(text)
    assert f"dp_sharding {plan.dp_sharding}" in comments
    if plan.tp > 1:
        assert "sequence parallel: " + ("on" if plan.sequence_parallel else "off") in comments
    if prec == "fp16":
        assert "fp16" in comments


def test_deepspeed(case):
    inst, plan = case
    prec = inst.spec.training.precision
    if _refused(inst, plan, "deepspeed"):       # ZeRO-2/3 with pp > 1, or HSDP
        return
    d = json.loads(emit(inst, plan, "deepspeed"))
    assert d["train_batch_size"] == plan.global_batch
    assert d["train_micro_batch_size_per_gpu"] == plan.micro_batch
    assert d["gradient_accumulation_steps"] == plan.micro_batches
    assert d["train_batch_size"] == (d["train_micro_batch_size_per_gpu"]
                                     * d["gradient_accumulation_steps"] * plan.dp)
    assert d["bf16"]["enabled"] is (prec != "fp16")
    assert d["fp16"]["enabled"] is (prec == "fp16")
    assert d["zero_optimization"]["stage"] == SHARDING_MODES.index(plan.dp_sharding)
    # fp32 gradients under bf16 are accumulated in fp32 too (BF16_Optimizer, whose 16-bit and
    # fp32 gradients the plan's memory counts); the default accumulates in the model dtype
    fp32_grads = d["communication_data_type"] == "fp32"
    assert ("data_types" in d) is (fp32_grads and prec != "fp16")
    if "data_types" in d:
        assert d["data_types"] == {"grad_accum_dtype": "fp32"}
    # partition_activations shards checkpoints, it does not recompute: always off; the model
    # code enables recompute, and the export says how
    assert d["activation_checkpointing"]["partition_activations"] is False
    how = d["plan_parallelism"]["recompute_how"]
    assert how.startswith(plan.recompute)
    assert ("deepspeed.checkpointing.checkpoint" in how) is (plan.recompute != "none")
    pp = d["plan_parallelism"]
    assert (pp["tensor"], pp["pipeline"], pp["data"], pp["context"], pp["virtual_pipeline"]) == (
        plan.tp, plan.pp, plan.dp, plan.cp, plan.vp)
    assert pp["layers_per_virtual_stage"] * plan.pp * plan.vp == inst.model.layers
    assert pp["sequence_parallel"] is (plan.sequence_parallel and plan.tp > 1)
    assert pp["recompute"] == plan.recompute
    assert pp["precision"] == prec
    assert pp["nodes"] * pp["gpus_per_node"] == pp["gpus"] == plan.gpus and pp["nodes"] == plan.nodes
    assert pp["intra_node"] == {"tp": plan.tp_intra, "cp": plan.cp_intra, "dp": plan.dp_intra,
                                "pp": plan.pp_intra}


def test_every_format_ends_with_newline(case):
    inst, plan = case
    for fmt in FORMATS:
        if _refused(inst, plan, fmt):
            continue
        text = emit(inst, plan, fmt)
        assert text.endswith("\n") and not text.endswith("\n\n"), fmt


def test_unknown_format_names_the_known_ones():
    inst = _inst("gpt3-175b-a100.toml")
    plan = plan_from_spec(inst, inst.spec.plan)
    with pytest.raises(InputError) as err:
        emit(inst, plan, "slurm")
    assert "slurm" in str(err.value)
    assert all(f in str(err.value) for f in FORMATS)


@pytest.mark.parametrize("overrides, needle", [
    ({"global_batch": 1000}, "must divide global_batch=1000"),     # the rule table's words
    ({"vp": 5}, "pp*vp = 40 must divide layers=96"),
])
def test_unlaunchable_plan_is_an_input_error(overrides, needle):
    inst = _inst("gpt3-175b-a100.toml")
    plan = plan_from_spec(inst, inst.spec.plan, **overrides)
    with pytest.raises(InputError, match="cannot be written") as err:
        emit(inst, plan, "megatron")
    assert needle in str(err.value)


def test_example_megatron_text_for_the_published_run():
    """The published GPT-3 run, as Narayanan et al. launched it (plus SP and selective recompute)."""
    inst = _inst("gpt3-175b-a100.toml")
    a = parse_megatron(emit(inst, plan_from_spec(inst, inst.spec.plan), "megatron"))
    assert a["--num-layers-per-virtual-pipeline-stage"] == "4"        # 96 / (8 * 3)
    assert {"--sequence-parallel", "--use-distributed-optimizer", "--recompute-activations",
            "--bf16"} <= set(a)


# ------------------------------------------------------------------------- mixture of experts

def _moe_case() -> tuple[Instance, Plan]:
    if "ep" not in Plan.__dataclass_fields__ or "experts" not in ModelSpec.model_fields:
        pytest.skip("this tree has no expert parallelism")
    inst = _inst("llama3-70b-h100.toml")
    model = inst.model.model_copy(update={"experts": 16, "top_k": 2, "moe_ffn_hidden": 4096,
                                          "shared_experts": 1, "first_dense_layers": 3,
                                          "moe_layer_interval": 2})
    inst = inst.with_spec(model=model)
    return inst, plan_from_spec(inst, inst.spec.plan, ep=8)


def test_moe_megatron_flags():
    inst, plan = _moe_case()
    a = parse_megatron(emit(inst, plan, "megatron"))
    assert a["--num-experts"] == "16" and a["--moe-router-topk"] == "2"
    assert a["--moe-ffn-hidden-size"] == "4096"
    assert a["--moe-shared-expert-intermediate-size"] == "4096"
    assert a["--expert-model-parallel-size"] == str(plan.ep)
    assert a["--expert-tensor-parallel-size"] == "1"
    assert a["--moe-token-dispatcher-type"] == "alltoall"     # the model costs all-to-all
    assert a["--moe-grouped-gemm"] is True
    freq = eval(a["--moe-layer-freq"], {"__builtins__": {}})     # Megatron evaluates it too
    assert freq == [int(i >= 3 and (i - 3) % 2 == 0) for i in range(inst.model.layers)]
    assert sum(freq) == inst.model.moe_layers


def test_moe_other_formats():
    inst, plan = _moe_case()
    y = parse_yaml(emit(inst, plan, "nemo"))
    assert y["trainer.strategy.expert_model_parallel_size"] == plan.ep
    assert y["trainer.strategy.expert_tensor_parallel_size"] == 1
    assert y["model.config.num_moe_experts"] == 16 and y["model.config.moe_router_topk"] == 2
    assert y["model.config.moe_shared_expert_intermediate_size"] == 4096
    assert y["model.config.moe_token_dispatcher_type"] == "alltoall"
    assert y["model.config.moe_grouped_gemm"] is True
    assert json.loads(str(y["model.config.moe_layer_freq"])).count(1) == inst.model.moe_layers
    fsdp = dataclasses.replace(plan, dp_sharding="optim_grads_params")  # what torchtitan runs
    t = tomllib.loads(emit(inst, fsdp, "torchtitan"))
    assert t["parallelism"]["expert_parallel_degree"] == plan.ep
    assert t["parallelism"]["expert_tensor_parallel_degree"] == 1
    flat = dataclasses.replace(plan, vp=1)          # DeepSpeed runs no interleaving
    d = json.loads(emit(inst, flat, "deepspeed"))
    assert d["plan_parallelism"]["expert"] == plan.ep


def test_dense_model_has_no_expert_keys():
    inst = _inst("gpt3-175b-a100.toml")
    plan = plan_from_spec(inst, inst.spec.plan)
    runs = {"torchtitan": dataclasses.replace(plan, dp_sharding="optim_grads_params"),
            "deepspeed": dataclasses.replace(plan, vp=1)}   # what each runs
    text = "\n".join(emit(inst, runs.get(f, plan), f) for f in FORMATS)
    assert "expert" not in text.lower()


@pytest.mark.parametrize("on", [False, True])
def test_exports_carry_the_overlaps_the_model_costs(on):
    """Every export writes the overlap switches as the evaluator costs them: all four on (or
    off) for an interleaved TP/SP plan with the distributed optimizer."""
    inst = _inst("gpt3-175b-a100.toml")
    knobs = dict.fromkeys(("overlap_grad_reduce", "overlap_param_gather", "tp_comm_overlap",
                           "overlap_p2p_comm"), on)
    plan = plan_from_spec(inst, inst.spec.plan, **knobs)
    assert plan.vp > 1 and plan.tp > 1 and plan.sequence_parallel and plan.distributed_optimizer
    flags = parse_megatron(emit(inst, plan, "megatron"))
    for flag in ("--overlap-grad-reduce", "--overlap-param-gather", "--tp-comm-overlap"):
        assert (flag in flags) == on
    assert ("--no-overlap-p2p-communication" in flags) == (not on)
    nemo = parse_yaml(emit(inst, plan, "nemo"))
    assert nemo["trainer.strategy.ddp.overlap_grad_reduce"] is on
    assert nemo["trainer.strategy.ddp.overlap_param_gather"] is on
    assert nemo["model.config.tp_comm_overlap"] is on
    assert nemo["model.config.overlap_p2p_comm"] is on
    # (torchtitan runs the plan's data parallelism as FSDP2: the same plan fully sharded)
    titan = emit(inst, plan_from_spec(inst, inst.spec.plan, **knobs,
                                      dp_sharding="optim_grads_params"), "torchtitan")
    assert tomllib.loads(titan)["parallelism"]["enable_async_tensor_parallel"] is on
    assert ("overlap_p2p_comm: cannot express" in comment_text(titan)) == on
    # (DeepSpeed has no interleaving: the same plan without it, so no p2p overlap is costed)
    ds = json.loads(emit(inst, plan_from_spec(inst, inst.spec.plan, **knobs, vp=1), "deepspeed"))
    assert ds["zero_optimization"]["overlap_comm"] is on
    assert ds["plan_parallelism"]["overlap_cannot_express"] == (
        ["overlap_param_gather", "tp_comm_overlap"] if on else [])


def test_megatron_refuses_param_gather_overlap_without_grad_reduce_overlap():
    inst = _inst("gpt3-175b-a100.toml")
    plan = plan_from_spec(inst, inst.spec.plan, overlap_param_gather=True,
                          overlap_grad_reduce=False)
    with pytest.raises(InputError) as exc:
        emit(inst, plan, "megatron")
    assert "overlap_param_gather = true needs overlap_grad_reduce = true" in str(exc.value)


def test_bf16_optimizer_states_are_said_to_be_unwritable():
    """``optimizer_dtype = "bf16"`` (NeMo 1's distributed_fused_adam with optim.dtype bf16)
    has no counterpart in the four exports, which keep fp32 main parameters and moments: each
    says so, since the plan's memory counted the bf16 states."""
    inst = _inst("gpt3-175b-a100.toml")
    plans = [plan_from_spec(inst, inst.spec.plan),
             plan_from_spec(inst, inst.spec.plan, dp_sharding="optim_grads_params"),
             plan_from_spec(inst, inst.spec.plan, vp=1)]
    bf16 = inst.with_spec(training=inst.spec.training.model_copy(
        update={"optimizer_dtype": "bf16"}))
    for fmt in FORMATS:
        plan = next(p for p in plans if not framework_violations(fmt, p))
        assert "optimizer_dtype" not in emit(inst, plan, fmt), fmt
        assert "optimizer_dtype bf16: cannot express" in emit(bf16, plan, fmt), fmt


# ------------------------------------------------------------- what the frameworks assert

@pytest.mark.parametrize("mode", ["optim_grads", "optim_grads_params"])
def test_megatron_fsdp_exports_pass_megatrons_fsdp_asserts(mode):
    """Megatron-LM validate_args with --use-megatron-fsdp asserts CUDA_DEVICE_MAX_CONNECTIONS
    is not "1" and --ckpt-format fsdp_dtensor (TP8 here, where the plain export sets the env
    line); NeMo raises for another save_ckpt_format, and runs without gradient-accumulation
    fusion as the Megatron export does."""
    inst = _inst("llama3-70b-h100.toml")
    plan = plan_from_spec(inst, inst.spec.plan, pp=1, vp=1, dp=64, dp_sharding=mode)
    text = emit(inst, plan, "megatron")
    assert not any(ln.startswith("export CUDA_DEVICE_MAX_CONNECTIONS=1") for ln in text.splitlines())
    a = parse_megatron(text)
    assert a["--ckpt-format"] == "fsdp_dtensor"
    assert a["--no-gradient-accumulation-fusion"] is True
    y = parse_yaml(emit(inst, plan, "nemo"))
    assert y["trainer.strategy.fsdp"] == "megatron"
    assert y["trainer.strategy.save_ckpt_format"] == "fsdp_dtensor"
    assert y["model.config.gradient_accumulation_fusion"] is False
    # the distributed optimizer alone keeps Megatron's checkpoint format and the env line
    zero1 = plan_from_spec(inst, inst.spec.plan, pp=1, vp=1, dp=64, dp_sharding="optim")
    assert "export CUDA_DEVICE_MAX_CONNECTIONS=1" in emit(inst, zero1, "megatron").splitlines()
    assert "--ckpt-format" not in parse_megatron(emit(inst, zero1, "megatron"))
    assert "trainer.strategy.save_ckpt_format" not in parse_yaml(emit(inst, zero1, "nemo"))


def test_nemo_devices_are_the_gpus_of_a_host_not_the_nvlink_domain():
    """GB200 NVL72: 4 GPUs per host, 72 per NVLink domain; Lightning starts trainer.devices
    processes on each of trainer.num_nodes hosts."""
    from planner.model.instance import parse_instance

    inst = parse_instance({
        "model": {"preset": "llama3-70b"},
        "training": {"global_batch": 576, "tokens": 15e12},
        "cluster": {"gpu": "gb200", "nodes": 36},
        "plan": {"tp": 4, "pp": 4, "dp": 9, "micro_batch": 1, "recompute": "full"}})
    plan = plan_from_spec(inst, inst.spec.plan)
    assert plan.gpus == 144 and plan.node_size == 72
    y = parse_yaml(emit(inst, plan, "nemo"))
    assert (y["trainer.num_nodes"], y["trainer.devices"]) == (36, 4)
    assert json.loads(emit(inst, plan, "deepspeed"))["plan_parallelism"]["gpus_per_node"] == 4


def test_nemo_hsdp_replicas_are_a_strategy_argument():
    """MegatronStrategy copies its own num_distributed_optimizer_instances (default 1) into
    the ddp config, so a value under trainer.strategy.ddp is overwritten."""
    name, precision, overrides = CASES["gpt3-175b-hsdp"]
    inst = _inst(name, precision)
    plan = plan_from_spec(inst, inst.spec.plan, **overrides)
    assert plan.dp_replicate == 8
    y = parse_yaml(emit(inst, plan, "nemo"))
    assert y["trainer.strategy.num_distributed_optimizer_instances"] == 8
    assert "trainer.strategy.ddp.num_distributed_optimizer_instances" not in y


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_nemo_gradient_reduction_dtype_is_set_on_the_precision_plugin_too(dtype):
    """MegatronMixedPrecision(grad_reduce_in_fp32=True) overrides the ddp config's value in
    MegatronStrategy.connect: both carry the plan's reduction dtype."""
    inst = _inst("gpt3-175b-a100.toml")
    inst = inst.with_spec(training=inst.spec.training.model_copy(
        update={"grad_reduce_dtype": dtype}))
    y = parse_yaml(emit(inst, plan_from_spec(inst, inst.spec.plan), "nemo"))
    assert y["trainer.plugins.grad_reduce_in_fp32"] is (dtype == "fp32")
    assert y["trainer.strategy.ddp.grad_reduce_in_fp32"] is (dtype == "fp32")


def test_nemo_uses_the_tp_pp_dp_rank_order_as_megatron_does():
    name, precision, overrides = CASES["gpt3-175b-pp16"]
    inst = _inst(name, precision)
    plan = plan_from_spec(inst, inst.spec.plan, **overrides)
    assert parse_megatron(emit(inst, plan, "megatron"))["--use-tp-pp-dp-mapping"] is True
    assert parse_yaml(emit(inst, plan, "nemo"))["trainer.strategy.use_tp_pp_dp_mapping"] is True
    default = plan_from_spec(inst, inst.spec.plan)
    assert "trainer.strategy.use_tp_pp_dp_mapping" not in parse_yaml(emit(inst, default, "nemo"))


def test_megatron_refuses_interleaving_on_two_stages_without_p2p_overlap():
    """Megatron-LM validate_args: interleaved without p2p overlap needs pp > 2."""
    inst = _inst("llama3-70b-h100.toml")
    plan = plan_from_spec(inst, inst.spec.plan, pp=2, dp=32, vp=5, overlap_p2p_comm=False)
    with pytest.raises(InputError) as exc:
        emit(inst, plan, "megatron")
    assert "overlap_p2p_comm = false needs pp > 2" in str(exc.value)
    overlapped = plan_from_spec(inst, inst.spec.plan, pp=2, dp=32, vp=5, overlap_p2p_comm=True)
    assert "--no-overlap-p2p-communication" not in parse_megatron(emit(inst, overlapped, "megatron"))
    four = plan_from_spec(inst, inst.spec.plan, overlap_p2p_comm=False)       # pp = 4
    assert parse_megatron(emit(inst, four, "megatron"))["--no-overlap-p2p-communication"] is True


def test_op_level_selective_recompute_is_said_to_be_unwritable_for_megatron_code():
    """``[training] selective_recompute = "op"`` is torchtitan's policy; Megatron-Core's
    selective recompute is the attention core only: the Megatron-based exports say so."""
    inst = _inst("gpt3-175b-a100.toml")
    plan = plan_from_spec(inst, inst.spec.plan, vp=1)
    assert plan.recompute == "selective"
    op = inst.with_spec(training=inst.spec.training.model_copy(
        update={"selective_recompute": "op"}))
    for fmt in ("megatron", "nemo"):
        assert "selective recompute \"op\": cannot express" in comment_text(emit(op, plan, fmt))
        assert "selective recompute \"op\"" not in comment_text(emit(inst, plan, fmt))
    how = json.loads(emit(op, plan, "deepspeed"))["plan_parallelism"]["recompute_how"]
    assert how.startswith("selective") and "cannot express" in how
    assert "cannot express" not in json.loads(emit(inst, plan, "deepspeed"))[
        "plan_parallelism"]["recompute_how"]


def test_torchtitan_fp8_keeps_the_output_layer_16_bit_and_passes_the_converter_asserts():
    """The model costs the output layer in 16 bits (torchtitan's llama3_405b config filters it
    too); Float8LinearConverter asserts enable_fsdp_float8_all_gather is off when recipe_name
    is given (torchtitan 0.2.2 components/quantization/float8.py)."""
    inst = _inst("llama3-70b-h100.toml", "fp8")
    plan = plan_from_spec(inst, inst.spec.plan, dp_sharding="optim_grads_params")
    f8 = tomllib.loads(emit(inst, plan, "torchtitan"))["quantize"]["linear"]["float8"]
    assert f8["filter_fqns"] == ["output"]
    assert not (f8.get("recipe_name") and f8["enable_fsdp_float8_all_gather"])


def test_torchtitan_compiles_as_the_plan_costs_its_kernels():
    """torch.compile off for a plan costed on eager modules (torchtitan's default stack), on
    for one costed on fused kernels, needing async TP (which torchtitan runs compiled only) or
    running torchao's float8 casts; off for torchao's MXFP8 beside tensor parallelism, which
    refuses compile (torchtitan 0.2 components/quantization/mx.py), where async TP cannot be
    written either. Each case is said in a comment. The loss is compiled where the plan costs
    it so (frameworks.compiled_loss: the fused stack's default, or training.compiled_loss),
    alone if the layers are not."""
    base = _inst("llama3-70b-h100.toml")

    def titan(gpu="h100-sxm", **training):
        return base.with_spec(
            constraints=base.spec.constraints.model_copy(update={"framework": "torchtitan"}),
            training=base.spec.training.model_copy(update=training),
            cluster=base.spec.cluster.model_copy(update={"gpu": gpu}))

    def plan_of(inst, **knobs):
        return plan_from_spec(inst, inst.spec.plan, dp_sharding="optim_grads_params", **knobs)
    eager, mx = titan(), titan("b200", precision="fp8", fp8_recipe="mxfp8")
    both, layers = ["model", "loss"], ["model"]
    cases = [  # instance, plan, compile.enable, components, async TP written, said
        (eager, plan_of(eager, tp_comm_overlap=False), False, both, False, None),
        (titan(kernel_stack="fused"), plan_of(eager, tp_comm_overlap=False), True, both, False,
         "the plan costs fused kernels"),
        (eager, plan_of(eager, tp_comm_overlap=True), True, layers, True,
         "async tensor parallelism (tp_comm_overlap) runs compiled only"),
        (titan(precision="fp8"), plan_of(eager, tp_comm_overlap=False), True, layers, False,
         "torchao's float8 casts need it"),
        (mx, plan_of(mx, tp_comm_overlap=False), False, both, False,
         "torchao's MXFP8 refuses torch.compile with tensor parallelism"),
        (mx, plan_of(mx, tp_comm_overlap=True), False, both, False,
         "tp_comm_overlap: cannot express"),
        (titan("b200", precision="nvfp4"), plan_of(eager, tp_comm_overlap=False), True, both,
         False, "the plan costs fused kernels"),
        (titan(compiled_loss=True), plan_of(eager, tp_comm_overlap=False), True, ["loss"],
         False, "compile components: the loss alone"),
        (titan(kernel_stack="fused", compiled_loss=False), plan_of(eager, tp_comm_overlap=False),
         True, layers, False, "compile components: the layers alone"),
    ]
    # torchao's MXFP8 at tp = 1 compiles the layers, and the loss with them (its refusal is
    # of compiled layers beside tensor parallelism: torchtitan 0.2 mx.py)
    one = plan_from_spec(mx, mx.spec.plan, dp_sharding="optim_grads_params", tp=1, pp=1,
                         dp=mx.gpus, vp=1)
    assert tomllib.loads(emit(mx, one, "torchtitan"))["compile"] == {"enable": True,
                                                                    "components": both}
    for inst, p, on, components, async_tp, said in cases:
        assert p.tp > 1
        text = emit(inst, p, "torchtitan")
        t = tomllib.loads(text)
        assert t["compile"]["enable"] is on and t["compile"]["components"] == components
        assert t["parallelism"]["enable_async_tensor_parallel"] is async_tp
        comments = comment_text(text)
        if said:
            assert said in comments
        else:
            assert "compile" not in comments
        # the eager stack is offered only where it is one (not for NVFP4 / MXFP8)
        assert ("its eager modules, its default" in comments) == (
            on and inst.kernel_stack == "fused" and inst.spec.training.precision == "bf16")
        # (the export says compile is on only where the layers are: the loss alone is
        # costed as the plan's memory says)


def test_megatron_and_nemo_say_when_the_plan_costs_eager_kernels():
    """A plan costed on eager PyTorch kernels (torchtitan's default stack) exported to
    Megatron-LM or NeMo, which run Transformer Engine's fused kernels, says so; a plan costed
    on the fused stack does not."""
    base = _inst("llama3-70b-h100.toml")
    titan = base.with_spec(constraints=base.spec.constraints.model_copy(
        update={"framework": "torchtitan"}))
    plan = plan_from_spec(base, base.spec.plan)
    for fmt in ("megatron", "nemo"):
        assert "kernel_stack pytorch: the plan costs eager" in comment_text(
            emit(titan, plan, fmt))
        assert "kernel_stack pytorch" not in comment_text(emit(base, plan, fmt))


def test_torchtitan_says_it_cannot_scale_fp8_with_delay():
    """torchtitan's float8 converter scales dynamically; a plan costed with delayed scaling
    (whose torchao TP all-gathers stay 16-bit) says what the export runs instead."""
    inst = _inst("llama3-70b-h100.toml", "fp8")
    plan = plan_from_spec(inst, inst.spec.plan, dp_sharding="optim_grads_params")
    assert "fp8_recipe delayed" not in comment_text(emit(inst, plan, "torchtitan"))
    delayed = inst.with_spec(training=inst.spec.training.model_copy(
        update={"fp8_recipe": "delayed"}))
    said = comment_text(emit(delayed, plan, "torchtitan"))
    assert "fp8_recipe delayed: cannot express" in said
    # costed as Transformer Engine's (no framework): its gathers were FP8 already
    assert "tensorwise is emitted, whose" not in said
    titan = delayed.with_spec(constraints=delayed.spec.constraints.model_copy(
        update={"framework": "torchtitan"}))
    if plan.tp > 1 and plan.sequence_parallel:
        # costed as torchao's: 16-bit gathers, where the emitted tensorwise gathers FP8
        assert "tensorwise is emitted, whose tensor-parallel all-gathers move FP8 where the " \
            "plan costs 16 bits" in comment_text(emit(titan, plan, "torchtitan"))


@pytest.mark.parametrize("pp", [1, 4])
def test_torchtitan_fp8_experts_are_said_to_be_unwritable(pp):
    """Float8Linear does not convert GroupedExperts, and the grouped-GEMM FP8 prototype
    refuses pipeline parallelism: a plan costing FP8 experts says what torchtitan runs."""
    inst, plan = _moe_case()
    inst = inst.with_spec(training=inst.spec.training.model_copy(update={"precision": "fp8"}))
    plan = plan_from_spec(inst, inst.spec.plan, ep=8, pp=pp, vp=1, dp=64 // pp,
                          dp_sharding="optim_grads_params")
    comments = comment_text(emit(inst, plan, "torchtitan"))
    assert "fp8 experts: cannot express" in comments
    assert ("refuses pipeline" in comments) is (pp > 1)
    dense = _inst("llama3-70b-h100.toml", "fp8")
    dense_plan = plan_from_spec(dense, dense.spec.plan, dp_sharding="optim_grads_params")
    assert "fp8 experts" not in comment_text(emit(dense, dense_plan, "torchtitan"))


def test_torchtitan_uneven_interleaved_layout_names_the_real_key_and_split():
    """Llama 3.1 405B on PP16 VP2 with 6 / 8 layers on the first / last rank: torchtitan's
    keys cannot shorten a rank over its virtual stages; the comment names the key that can
    (job_config.py: module_fqns_per_model_part) and the split torchtitan would build."""
    inst = _inst("llama3.1-405b-h100.toml")
    plan = plan_from_spec(inst, inst.spec.plan, vp=2, first_stage_layers=6, last_stage_layers=8,
                          recompute_layers=0, dp_sharding="optim_grads_params")
    assert plan.stage_layers == [6] + [8] * 15
    comments = comment_text(emit(inst, plan, "torchtitan"))
    assert "module_fqns_per_model_part" in comments
    assert "module_fqns_per_model_stage" not in comments
    # 126 layers over 32 virtual stages of at most 4: 30 of 4, 2 of 3; ranks 14, 15 hold 7
    assert "decoder layers per rank " + ", ".join(["8"] * 14 + ["7", "7"]) in comments
    # Meta's layout (7 / 7 on PP16, one stage per rank) is what the keys give: no such comment
    meta = plan_from_spec(inst, inst.spec.plan, recompute_layers=0,
                          dp_sharding="optim_grads_params")
    assert "module_fqns_per_model_part" not in comment_text(emit(inst, meta, "torchtitan"))


def test_an_export_says_when_its_framework_runs_other_fp8_linears():
    """A plan costed with Transformer Engine's FP8 linears exported to torchtitan (torchao's),
    or with torchao's exported to Megatron-LM / NeMo (Transformer Engine's), says so; a plan
    whose FP8 linears are the framework's own does not."""
    te = _inst("llama3-70b-h100.toml", "fp8")                  # no framework: Transformer Engine
    plan = plan_from_spec(te, te.spec.plan, dp_sharding="optim_grads_params")
    ao = te.with_spec(training=te.spec.training.model_copy(update={"fp8_library": "torchao"}))
    mark = "fp8_library {}: cannot express"
    assert mark.format("transformer_engine") in comment_text(emit(te, plan, "torchtitan"))
    assert mark.format("torchao") not in comment_text(emit(ao, plan, "torchtitan"))
    assert mark.format("transformer_engine") not in comment_text(emit(ao, plan, "torchtitan"))
    zero1 = plan_from_spec(te, te.spec.plan, dp_sharding="optim")
    for fmt in ("megatron", "nemo"):
        assert mark.format("torchao") in comment_text(emit(ao, zero1, fmt))
        assert "fp8_library" not in comment_text(emit(te, zero1, fmt))


@pytest.mark.parametrize("vp, gather, expected", [(12, True, True), (1, True, None),
                                                   (12, False, None)])
def test_nemo_aligns_the_interleaved_parameter_gathers(vp, gather, expected):
    """An interleaved plan with the parameter all-gather overlapped launches it on every
    pipeline rank together (align_param_gather), as Megatron-LM's CLI and NeMo's
    MegatronCommOverlapCallback do; the ddp dataclass defaults to False, so the export says it.
    Without interleaving there is nothing to align (Megatron-LM's validate_args turns it off)."""
    inst = _inst("gpt3-175b-a100.toml")
    plan = plan_from_spec(inst, inst.spec.plan, vp=vp, overlap_grad_reduce=True,
                          overlap_param_gather=gather)
    y = parse_yaml(emit(inst, plan, "nemo"))
    assert y["trainer.strategy.ddp.overlap_param_gather"] is gather
    assert y.get("trainer.strategy.ddp.align_param_gather") is expected


def test_an_approximated_shape_is_said_in_the_caveats_and_every_export():
    """A shape that stands in for another (a Hugging Face config's sliding-window attention
    costed as full attention): the exports' model arguments build that approximation, so each
    export and the plan's caveats say so (an audit found them silent)."""
    from planner.model.evaluate import evaluate
    from planner.model.instance import load_instance
    dense = load_instance(INSTANCES / "gpt3-175b-a100.toml")
    plan = plan_from_spec(dense, dense.spec.plan)
    assert "model shape" not in emit(dense, plan, "megatron")
    words = "sliding-window attention (a window of 4096 tokens) as full causal attention"
    inst = dense.with_spec(model=dense.spec.model.model_copy(update={"approximates": words}))
    assert any(c.startswith(f"model shape: {words}") for c in evaluate(inst, plan).caveats)
    for fmt in ("megatron", "nemo"):
        text = " ".join(emit(inst, plan, fmt).replace("#", " ").split())
        assert f"model shape: {words}" in text, fmt
        assert "build the approximation, not the original" in text, fmt


def test_multi_head_latent_attention_is_exported_with_its_widths():
    """DeepSeek-V3's MLA under Megatron-LM's argument names (arguments.py _add_mla_args) and
    Megatron-Core's MLATransformerConfig fields (NeMo), with no query groups or head width
    of multi-head attention; nothing is said to be approximated any more."""
    from planner.model.instance import load_instance
    inst = load_instance(INSTANCES / "deepseek-v3-h800.toml")
    plan = plan_from_spec(inst, inst.spec.plan)
    args = parse_megatron(emit(inst, plan, "megatron"))
    assert {"--multi-latent-attention": True, "--q-lora-rank": "1536", "--kv-lora-rank": "512",
            "--qk-head-dim": "128", "--qk-pos-emb-head-dim": "64",
            "--v-head-dim": "128"}.items() <= args.items()
    assert not {"--group-query-attention", "--num-query-groups", "--kv-channels"} & set(args)
    y = parse_yaml(emit(inst, plan, "nemo"))
    assert (y["model.config.multi_latent_attention"], y["model.config.kv_lora_rank"],
            y["model.config.qk_pos_emb_head_dim"]) == (True, 512, 64)
    assert "model.config.num_query_groups" not in y
    for fmt in ("megatron", "nemo"):
        assert "model shape:" not in emit(inst, plan, fmt)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_torchtitan_reduces_in_float32_only(dtype):
    """torchtitan 0.2.x's training.mixed_precision_reduce is Literal["float32"]: a plan costed
    with bf16 reductions (llm-foundry's PURE, a pin) is written float32 and says so, rather
    than a value torchtitan's config parser rejects (an audit found "bfloat16" written)."""
    inst = _inst("gpt-1.3b-1node.toml")
    inst = inst.with_spec(training=inst.spec.training.model_copy(
        update={"grad_reduce_dtype": dtype}))
    plan = plan_from_spec(inst, inst.spec.plan, dp_sharding="optim_grads_params")
    text = emit(inst, plan, "torchtitan")
    assert 'mixed_precision_reduce = "float32"' in text and '"bfloat16"\n' not in text.split(
        "mixed_precision_reduce")[1][:20]
    assert ("grad_reduce_dtype bf16: cannot express" in " ".join(text.replace("#", " ").split())
            ) == (dtype == "bf16")


def test_torchtitan_virtual_stages_must_divide_by_the_pipeline_degree():
    """15 layers on PP2 VP3 as 9 + 6 (the last rank a virtual stage short): torchtitan's keys
    (3 layers a stage) make 5 virtual stages, which torchtitan 0.2.2 refuses ("Number of
    virtual stages ... must be divisible by" the pipeline degree) although the per-rank sums
    (9, 6) match the plan; the export says it cannot express the layout (an audit found it
    silent)."""
    doc = {"model": {"preset": "llama3-8b", "layers": 15}, "training": {"global_batch": 64},
           "cluster": {"gpu": "h100-sxm", "gpus": 16},
           "constraints": {"framework": "torchtitan"},
           "plan": {"tp": 4, "pp": 2, "dp": 2, "vp": 3, "micro_batch": 1,
                    "first_stage_layers": 9, "last_stage_layers": 6,
                    "dp_sharding": "optim_grads_params"}}
    inst = parse_instance(doc)
    text = comment_text(emit(inst, plan_from_spec(inst, inst.spec.plan), "torchtitan"))
    assert ("cannot express: these keys make 5 virtual stages, which torchtitan requires "
            "divisible by pipeline_parallel_degree 2") in text


def test_every_export_says_what_the_model_costs_the_plan():
    """Each export names the step time and per-GPU memory the model costs its plan (to set
    against the launch's own), and a plan within UNCOUNTED_PEAK_GIB of its limit is told to
    raise the reserve."""
    from planner.model.evaluate import evaluate

    inst = _inst("gpt3-175b-a100.toml")
    plan = plan_from_spec(inst, inst.spec.plan)
    rep = evaluate(inst, plan)
    said = (f"costed by the model: {rep.step_time_s:.4g} s per step, "
            f"{rep.memory_gib['total']:.2f} GiB per GPU")
    for fmt, knobs in (("megatron", {}), ("nemo", {}),
                       ("torchtitan", {"dp_sharding": "optim_grads_params"})):
        inst_f = inst.with_spec(constraints=inst.spec.constraints.model_copy(
            update={"framework": fmt}))
        plan_f = plan_from_spec(inst_f, inst.spec.plan, **knobs)
        text = emit(inst_f, plan_f, fmt)
        flat = " ".join(x.lstrip("# ").strip() for x in text.splitlines() if x.startswith("#"))
        rep_f = evaluate(inst_f, plan_f)
        assert f"costed by the model: {rep_f.step_time_s:.4g} s per step" in flat, fmt
        assert "raise constraints.memory_reserve_GiB" not in flat
    ds = inst.with_spec(constraints=inst.spec.constraints.model_copy(
        update={"framework": "deepspeed"}))
    one = plan_from_spec(ds, inst.spec.plan, vp=1)
    assert json.loads(emit(ds, one, "deepspeed"))["plan_parallelism"]["costed"].startswith(
        f"costed by the model: {evaluate(ds, one).step_time_s:.4g} s per step")
    # the same plan with the reserve that leaves it 1 GiB under its limit
    tight = inst.with_spec(constraints=inst.spec.constraints.model_copy(update={
        "memory_reserve_GiB": rep.memory_gib["capacity"] - rep.memory_gib["total"] - 1.0}))
    flat = " ".join(x.lstrip("# ").strip()
                    for x in emit(tight, plan, "megatron").splitlines() if x.startswith("#"))
    assert said in flat and "1.00 GiB under its" in flat
    assert "raise constraints.memory_reserve_GiB for room" in flat

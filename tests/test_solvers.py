"""Three-way agreement: CP-SAT == HiGHS (through Pyomo) == the enumerator on the optimum, and the
evaluator reproduces the reported objective for the returned plan (``solve`` marks a mismatch as
an ERROR status, which these tests reject).

Random small instances cover every knob the search space has: non-power-of-two degrees, GQA,
gated MLPs, FP8, recompute / sequence parallelism / distributed optimizer choices (free or
pinned), data-parallel sharding modes, reshard policy, HSDP group sizes (free: the replica
count is a base variable), frameworks and gradient-reduction dtypes, context parallelism,
global-batch ranges, overlap maxima, within-node constraints and memory limits tight enough to
bind.
"""

from __future__ import annotations

from planner.model.frameworks import FRAMEWORKS, SHARDING_MODES, framework_of

import json
import math
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from formulations.result import Status
from formulations.solve import solve
from planner.model.catalog import load_gpu
from planner.model.errors import InfeasibleError
from planner.model.instance import parse_instance

GPUS = ("a100-80gb", "a100-40gb", "h100-sxm", "b200", "mi300x")


@st.composite
def instances(draw):
    heads = draw(st.sampled_from([1, 2, 3, 4, 6, 8, 12]))
    kv = draw(st.sampled_from([d for d in range(1, heads + 1) if heads % d == 0]))
    head_dim = draw(st.sampled_from([64, 128]))
    layers = draw(st.sampled_from([2, 3, 4, 5, 6, 8, 12]))
    seq = draw(st.sampled_from([512, 1024, 2048, 4096]))
    gpu = draw(st.sampled_from(GPUS))
    precision = draw(st.sampled_from(["bf16", "fp8"] if gpu != "a100-80gb" and gpu != "a100-40gb"
                                      else ["bf16", "fp16"]))
    if draw(st.booleans()):
        cluster = {"gpu": gpu, "gpus": draw(st.sampled_from([1, 2, 3, 4, 6]))}
    else:
        cluster = {"gpu": gpu, "nodes": draw(st.sampled_from([1, 2, 3, 4, 6]))}
        # nodes of 8 GPUs, or of 4 or 2: several nodes without the 24-48 GPUs that the small
        # models and batches drawn here mostly cannot fill (tp within the heads, pp within the
        # layers, dp within the batch: infeasible draws check nothing but that)
        per_node = draw(st.sampled_from([None, 4, 2]))
        if per_node:
            cluster["gpus_per_node"] = per_node
    gpus = cluster.get("gpus") or cluster["nodes"] * cluster.get("gpus_per_node", 8)
    if draw(st.integers(0, 4)) == 0:
        lo = draw(st.integers(1, 48))
        gb = [lo, lo + draw(st.integers(0, 40))]
    else:
        gb = draw(st.sampled_from([1, 2, 4, 6, 7, 8, 12, 16, 24, 32, 36, 48, 64, 96]))
    # the memory reserve: none, a small one, or one that leaves 20, 6 or 3 GiB of the GPU,
    # tight enough to bind on every type (reserves of 60-78.5 GiB bound only the 40 and 80 GB
    # types, and where they left 1.1-1.5 GiB there was mostly no plan)
    kind, gib = draw(st.sampled_from([("reserve", 0.0), ("reserve", 2.0), ("left", 20.0),
                                      ("left", 6.0), ("left", 3.0)]))
    constraints = {
        "max_micro_batch": draw(st.sampled_from([1, 2, 4, 8])),
        "memory_reserve_GiB": gib if kind == "reserve" else load_gpu(gpu).hbm_capacity_GiB - gib,
        "max_cp": draw(st.sampled_from([1, 1, 2, 4])),
    }
    constraints["tp_within_node"] = draw(st.booleans())     # both ways (the default is true)
    if draw(st.booleans()):
        constraints["pp_within_node"] = True
    if draw(st.integers(0, 3)) == 0:
        constraints["recompute"] = draw(st.sampled_from(["none", "selective", "full",
                                                         ["selective", "full"]]))
    if draw(st.integers(0, 3)) == 0:
        constraints["sequence_parallel"] = draw(st.booleans())
    pick = draw(st.integers(0, 7))
    if pick == 0:
        constraints["distributed_optimizer"] = draw(st.booleans())
    elif pick == 1:       # data-parallel sharding: a mode, a set of modes, the reshard policy
        constraints["dp_sharding"] = draw(st.sampled_from(
            ["optim_grads", "optim_grads_params", ["none", "optim_grads_params"]]))
    elif pick == 2:
        constraints["reshard_after_forward"] = draw(st.booleans())
    elif pick == 3:       # an HSDP shard group: the replica count becomes a base variable
        size = draw(st.sampled_from([1, 2, 4]))
        constraints["dp_shard_size"] = size if gpus % size == 0 else 1
    if draw(st.integers(0, 3)) == 0:      # a framework's rules and defaults
        constraints["framework"] = draw(st.sampled_from(
            ["megatron", "nemo", "torchtitan", "deepspeed"]))
    if draw(st.integers(0, 3)) == 0:
        constraints["max_tp"] = draw(st.sampled_from([1, 2, 4]))
    if draw(st.integers(0, 4)) == 0:
        constraints["max_dp"] = draw(st.sampled_from([1, 2, 4]))
    for knob in ("overlap_grad_reduce", "overlap_param_gather", "tp_comm_overlap",
                 "overlap_p2p_comm"):
        constraints[knob] = draw(st.sampled_from([False, False, True]))
        if "framework" in constraints and knob not in \
                FRAMEWORKS[constraints["framework"]].overlaps_expressible:
            constraints[knob] = False          # (a switch the framework has not: an error)
    if not sharding_modes(constraints):
        # a sharding pin the framework does not run (torchtitan and the distributed optimizer):
        # no plan, said before any backend runs; the pin is lifted
        constraints.pop("distributed_optimizer", None)
        constraints.pop("dp_sharding", None)
    if constraints.get("sequence_parallel") is False:
        constraints["tp_comm_overlap"] = False     # (it needs sequence parallelism: an error)
    if constraints.get("distributed_optimizer") is False:
        constraints["overlap_param_gather"] = False    # (it needs a sharded mode: an error)
    if constraints.get("framework") == "megatron" and constraints["overlap_param_gather"]:
        constraints["overlap_grad_reduce"] = True      # (validate_args needs it: an error)
    if draw(st.integers(0, 5)) == 0:          # pipeline layouts (default: shortfalls up to 1)
        constraints["max_stage_shortfall"] = draw(st.sampled_from([0, 2]))
    # host offload (searched by default): a small host binds its memory row, a slow host link
    # exposes the transfers (the activation offload's maximum), pins and caps
    if draw(st.integers(0, 4)) == 0:
        cluster["host_memory_GiB"] = draw(st.sampled_from([4.0, 64.0]))
    if draw(st.integers(0, 4)) == 0:
        cluster["host_link_bandwidth_GBps"] = draw(st.sampled_from([0.05, 2.0]))
    if draw(st.integers(0, 5)) == 0:
        constraints["optimizer_offload"] = draw(st.booleans())
    if draw(st.integers(0, 4)) == 0:          # activation offload is searched under a cap
        constraints["max_offload_layers"] = draw(st.sampled_from([1, 4]))
    if draw(st.integers(0, 3)) == 0 and "full" in str(constraints.get("recompute", "full")):
        # partial recompute (shares of each virtual stage): searched by default, under a cap,
        # or a pin; off in the other draws, where it would only multiply the models to solve
        key = draw(st.sampled_from([None, "max_recompute_layers", "max_recompute_layers",
                                    "recompute_layers"]))
        if key is not None:
            constraints[key] = draw(st.sampled_from([1, 2, 4]))
    else:
        constraints["max_recompute_layers"] = 0
    moe = {}
    if draw(st.integers(0, 3)) == 0:
        experts = draw(st.sampled_from([2, 4, 6, 8]))
        moe = {"experts": experts, "top_k": draw(st.integers(1, min(2, experts))),
               "moe_ffn_hidden": draw(st.sampled_from([128, 512, 2048])),
               "shared_experts": draw(st.sampled_from([0, 0, 1])),
               "first_dense_layers": draw(st.sampled_from([0, 0, 1])) if layers > 1 else 0}
        constraints["max_ep"] = draw(st.sampled_from([None, 2, 8]))
    doc = {
        "model": {**moe, "layers": layers,
                  "hidden": heads * head_dim * draw(st.sampled_from([1, 8, 32])),
                  "heads": heads, "kv_heads": kv, "gated_mlp": draw(st.booleans()),
                  "vocab": draw(st.sampled_from([1000, 32000, 128000])), "seq_len": seq,
                  "tied_embeddings": draw(st.booleans()),
                  "dropout": draw(st.booleans())},
        "training": {"global_batch": gb, "precision": precision,
                     **({"grad_reduce_dtype": draw(st.sampled_from(["fp32", "bf16"]))}
                        if draw(st.integers(0, 3)) == 0 else {}),
                     "flash_attention": draw(st.booleans()),
                     "bubble_ratio": draw(st.sampled_from([1.0, 0.5]))},
        "cluster": cluster,
        "constraints": constraints,
    }
    # FP8 parameters, drawn last so that the draws above keep their values, where a sharding
    # mode left runs them (elsewhere no plan, said before any backend runs)
    fw = framework_of(constraints.get("framework"))
    if precision == "fp8" and draw(st.booleans()) and \
            sharding_modes(constraints) & set(fw.fp8_param_gather_modes):
        doc["training"]["fp8_param_gather"] = True
    # a head width that is not hidden / heads (Qwen3: 32 heads of 128 on a hidden of 2048),
    # drawn last as well
    if draw(st.integers(0, 3)) == 0:
        doc["model"]["head_dim"] = 2 * head_dim
    # the expert all-to-all overlap of an MoE model (Megatron-Core / NeMo only), drawn last
    if moe and constraints.get("framework") in (None, "megatron", "nemo") and draw(st.booleans()):
        constraints["overlap_moe_expert_parallel_comm"] = True
    # master weights as remainders (bf16 weights, fp32 states, ZeRO-1 only), drawn last
    if (precision != "fp16" and not doc["training"].get("fp8_param_gather")
            and constraints.get("framework") in (None, "megatron", "nemo")
            and draw(st.integers(0, 3)) == 0
            and sharding_modes(constraints) & set(fw.param_remainders_modes)):
        doc["training"]["store_param_remainders"] = True
    return doc


def sharding_modes(constraints: dict) -> set[str]:
    """The data-parallel sharding modes drawn ``[constraints]`` leave: their pin, a shard group
    (a sharded mode), their framework's modes."""
    if "distributed_optimizer" in constraints:
        modes = {"optim" if constraints["distributed_optimizer"] else "none"}
    elif "dp_sharding" in constraints:
        pin = constraints["dp_sharding"]
        modes = {pin} if isinstance(pin, str) else set(pin)
    else:
        modes = set(SHARDING_MODES)
    if "dp_shard_size" in constraints:
        modes.discard("none")
    return modes & set(framework_of(constraints.get("framework")).sharding_modes)


def outcome(inst, backend):
    try:
        return solve(inst, solver=backend, explain=False)
    except InfeasibleError:
        return None


def tolerance(res) -> float:
    # CP-SAT rounds each table entry to its quantum (half a unit each, at most a few hundred
    # lookups); HiGHS works to a relative 1e-9 gap and 1e-6 feasibility on scaled rows.
    return (res.quantum_s or 0.0) * 200 + 1e-6 * abs(res.objective)


#: Three tests of 12 examples each (derandomized: each name draws its own instances), so that
#: pytest-xdist spreads them over the cores; one test of 120 had become the suite's critical
#: path, 2 x 40 passed the suite's 3 minutes once the sharding modes were searched, of 2 x 30
#: one test took 52 s and the other 113 s (two of its draws, split into sharding-mode models,
#: cost 31 s), and 3 x 20 with host offload drawn took 54 + 24 + 12 s (tests/conftest.py runs
#: them first); 3 x 16 took 57 s of CPU in all and left the suite at 2:57-3:19 in a clean-clone
#: CI under a load of 1.4-2.8 from the host (session of 2026-12-04), so 3 x 14; with FP8
#: parameters drawn too and 28 more published runs the suite reached 3:12 in a clean-clone CI
#: under a host load of 2.2-2.4 (session of 2026-12-04, later), so 3 x 12. Of the 32 distinct
#: instances those drew, 18 had no plan, so that nothing but "every backend says infeasible" was
#: checked on them (a test audit, its finding 1): 7 set a [training] flag or a sharding
#: pin that no sharding mode left runs, 3 left 1.1-1.5 GiB of an 80 GB GPU, 8 had 16-48 GPUs
#: that no degrees fill or an HSDP group larger than the job. With those draws reworked
#: (instances() above) the same 3 x 12 draw 33 instances, 8 of them without a plan (4 the
#: all-minimal draw: a batch of 1 on a node of 8; 2 out of memory, 2 of 12-48 GPUs), at less
#: CPU: 45.4-47.1 s for this file against 47.9-49.4 s, the slowest agreement test 7.6 s
#: against 12.5 s (four paired runs on 2 cores, session of 2026-12-05).
AGREE = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow],
                 derandomize=True)


@AGREE
@given(instances())
def test_three_backends_agree(doc):
    agree(doc)


@AGREE
@given(instances())
def test_three_backends_agree_on_more_instances(doc):
    agree(doc)


@AGREE
@given(instances())
def test_three_backends_agree_on_a_third_draw(doc):
    agree(doc)


#: the instances already checked in this process: hypothesis mutates the choices of earlier
#: examples, and a mutation can build the same instance again (an unused draw changed); it
#: counts as an example, but solving it again would check nothing new. An instance joins the
#: set only once it passed, so a failing one fails again when hypothesis replays or shrinks it.
_CHECKED: set[str] = set()


def agree(doc):
    key = json.dumps(doc, sort_keys=True)
    if key in _CHECKED:
        return
    _agree(doc)
    _CHECKED.add(key)


def _agree(doc):
    inst = parse_instance(doc)
    ref = outcome(inst, "enumerate")
    for backend in ("cpsat", "highs"):
        res = outcome(inst, backend)
        if ref is None:
            assert res is None, f"{backend} found a plan the enumerator calls infeasible"
            continue
        assert res is not None, f"{backend} says infeasible, the enumerator found {ref.objective}"
        assert res.status == Status.OPTIMAL, (backend, res.status, res.note)
        # the evaluator reproduces the solver's objective (solve() checks it; double-check here)
        step = res.report.step_time_s
        value = step / res.report.plan.global_batch if res.objective_kind != "step_time" else step
        assert math.isclose(value, res.objective, rel_tol=1e-6, abs_tol=tolerance(res))
        assert res.objective == pytest.approx(ref.objective, rel=1e-6, abs=tolerance(res)), \
            (backend, res.report.plan.label(), ref.report.plan.label())
        assert not res.report.violations
        # one answer per question: ties are broken the same way in every backend
        assert res.report.plan == ref.report.plan, (backend, res.report.plan, ref.report.plan)


#: (ZeRO-1 pinned and no host offload: the batch models are the point here; the sharding-mode
#: models within each batch model are tested by
#: test_sharding_mode_models_give_the_joint_models_answer)
BATCH_RANGE = {          # (12 batch models, as GPT-3 175B on 4,096 H100 has, at half the cost)
    "model": {"preset": "gpt-1.3b"},
    "training": {"global_batch": [64, 1024]},
    "cluster": {"gpu": "h100-sxm", "gpus": 64},
    "constraints": {"dp_sharding": "optim", "optimizer_offload": False,
                    "max_recompute_layers": 0},
}


@pytest.mark.parametrize("backend", ["cpsat", "highs"])
def test_batch_range_models_prove_the_optimum_with_a_cutoff(backend):
    """A global-batch range is one fixed-batch model per reachable batch; after the first, each
    only has to beat the incumbent. The answer is the enumerator's, proven, and the note says how
    many batch models were closed by the cutoff."""
    inst = parse_instance(BATCH_RANGE)
    ref = solve(inst, solver="enumerate")
    res = solve(inst, solver=backend)
    assert res.status == Status.OPTIMAL
    assert res.objective == pytest.approx(ref.objective, rel=1e-6, abs=tolerance(res))
    assert res.bound <= res.objective * (1 + 1e-9)
    models, beaten = (int(w) for w in re.findall(r"\d+", res.note))
    assert models > 1 and 1 <= beaten < models, res.note


def test_batch_models_beside_the_leading_ones_ties_give_the_same_answer(monkeypatch):
    """Under CP-SAT the capped batch models of a range start in a second thread once the
    leading batch model's first part has its optimum (BATCHES_BESIDE_TIES), capped at that
    part's optimum rather than the leading model's: the same plan, objective and note
    (the count of batch models proven not to beat the best) as one after the other."""
    import threading

    import formulations.solve as fs

    inst = parse_instance(BATCH_RANGE)
    started = []
    real_thread = threading.Thread

    def thread(*args, **kwargs):
        started.append(kwargs.get("target"))
        return real_thread(*args, **kwargs)
    monkeypatch.setattr(fs.threading, "Thread", thread)
    beside = solve(inst, solver="cpsat")
    assert started                                  # (the batch models' thread ran)
    started.clear()
    monkeypatch.setattr(fs, "BATCHES_BESIDE_TIES", False)
    alone = solve(inst, solver="cpsat")
    assert not started                              # (this range's batch models are not split)
    assert beside.status == alone.status == Status.OPTIMAL
    assert beside.report.plan == alone.report.plan
    assert beside.objective == alone.objective and beside.note == alone.note, \
        (beside.note, alone.note)


def test_batch_range_time_limit_covers_all_batch_models():
    """The time limit is for the whole solve, not per batch model: with almost no time, the
    answer is not claimed optimal."""
    inst = parse_instance(BATCH_RANGE)
    res = solve(inst, solver="cpsat", time_limit=1e-4)
    assert res.status != Status.OPTIMAL


#: A Llama-3-405B-shaped space with pipeline p2p overlap: terms worth 1e-9 of the step sat in
#: the same rows as terms worth the whole step, and HiGHS proved TP4 PP16 DP4 VP8 optimal at
#: 2914 s while TP8 PP16 DP1 CP2 takes 2570 s (formulations/milp.py scales each split group).
WIDE_RANGE = {
    "model": {"preset": "llama3-405b", "layers": 128},
    "training": {"global_batch": 16384},
    "cluster": {"gpu": "h100-sxm", "gpus": 256, "gpus_per_node": 8},
    "constraints": {"tp_within_node": False, "max_cp": 2, "overlap_p2p_comm": True,
                    "max_recompute_layers": 0},
}


def test_backends_agree_when_terms_span_many_orders_of_magnitude():
    inst = parse_instance(WIDE_RANGE)
    ref = solve(inst, solver="enumerate")
    for backend in ("cpsat", "highs"):
        res = solve(inst, solver=backend)
        assert res.status == Status.OPTIMAL, (backend, res.status, res.note)
        assert res.objective == pytest.approx(ref.objective, rel=1e-6, abs=tolerance(res)), \
            (backend, res.report.plan.label(), ref.report.plan.label())
        assert res.report.plan == ref.report.plan


@pytest.mark.parametrize("overlap, batch, layers", [(True, 16, 4), (False, [8, 16], 4),
                                                    (False, 16, 5)])
def test_sharding_mode_models_give_the_joint_models_answer(monkeypatch, overlap, batch, layers):
    """The search splits a large space into one model per sharding mode and pipeline layout
    (formulations/solve.py); on a small one, forced to split, it returns the plan one joint
    model and the enumerator return. With both data-parallel overlaps on, plain data
    parallelism and ZeRO-2 stay in the space and tie with ZeRO-1 on some plans, so the ties
    are broken across models; a batch range splits each batch model; 5 layers have three
    pipeline layouts (even, the embedding or the loss counted as a layer), each a model of its
    own."""
    import formulations.solve as fs

    inst = parse_instance({
        "model": {"layers": layers, "hidden": 1024, "heads": 8, "vocab": 32000,
                  "seq_len": 2048},
        "training": {"global_batch": batch},
        "cluster": {"gpu": "h100-sxm", "nodes": 2},
        "constraints": {"max_micro_batch": 4, "overlap_grad_reduce": overlap,
                        "overlap_param_gather": overlap, "max_recompute_layers": 0}})
    ref = solve(inst, solver="enumerate").report.plan     # (the joint model's answer too:
    monkeypatch.setattr(fs, "SPLIT_ABOVE", 0)               # the agreement tests above)
    monkeypatch.setattr(fs, "SPLIT_LAYOUTS_ABOVE", 0)       # (and per pipeline layout)
    notes = {}
    for backend in ("cpsat", "highs"):
        res = solve(inst, solver=backend)
        assert res.status == Status.OPTIMAL
        assert res.report.plan == ref, backend
        notes[backend] = res.note
        if isinstance(batch, int):     # (a range's note counts its batch models)
            assert "sharding-mode and layout models" in res.note
    # CP-SAT solves the later parts in a thread beside the leading part's tie goals
    # (PARTS_BESIDE_TIES); in one thread it gives the same plan and the same count
    monkeypatch.setattr(fs, "PARTS_BESIDE_TIES", False)
    alone = solve(inst, solver="cpsat")
    assert alone.report.plan == ref and alone.note == notes["cpsat"]


def test_backends_agree_where_the_optimizer_step_row_decides():
    """16-bit gradients without the distributed optimizer: each stage has an optimizer-step
    memory row (the fp32 main-gradient copy, no activations; docs/model.md "Memory"). With a
    reserve that leaves 60 GiB, the plan that is best at 61 GiB fits its forward / backward
    row but not its step row: every backend must leave it for the same next-best plan."""
    doc = {"model": {"layers": 40, "hidden": 5120, "heads": 40, "vocab": 32000,
                     "seq_len": 2048},
           "training": {"global_batch": 16, "precision": "bf16", "grad_reduce_dtype": "bf16"},
           "cluster": {"gpu": "a100-80gb", "nodes": 1},
           "constraints": {"dp_sharding": "none", "recompute": "full"}}
    loose = outcome(parse_instance({**doc, "constraints": {**doc["constraints"],
                                                           "memory_reserve_GiB": 19.0}}),
                    "enumerate")
    by_stage = loose.report.memory_by_stage_gib
    limit = loose.report.memory_gib["capacity"] - 20.0
    assert max(v["total"] for k, v in by_stage.items() if not k.endswith("_step")) < limit
    assert max(v["total"] for k, v in by_stage.items() if k.endswith("_step")) > limit
    tight = {**doc, "constraints": {**doc["constraints"], "memory_reserve_GiB": 20.0}}
    _agree(tight)
    res = outcome(parse_instance(tight), "cpsat")
    assert res.report.plan != loose.report.plan and res.report.memory_gib["total"] <= limit


def test_backends_agree_with_the_flex_dispatcher():
    """DeepEP's once-per-remote-node dispatch: the expected remote nodes of a token are a
    tabulated function of the expert group's nodes (algebra.remote_nodes), searched like any
    other factor; every backend finds the same plan."""
    doc = {"model": {"layers": 8, "hidden": 4096, "heads": 32, "kv_heads": 8, "vocab": 32000,
                     "seq_len": 4096, "experts": 64, "top_k": 8, "moe_ffn_hidden": 4096},
           "training": {"global_batch": 64, "precision": "bf16",
                        "moe_token_dispatcher": "deepep"},
           "cluster": {"gpu": "h100-sxm", "nodes": 4},
           "constraints": {"tp": 1, "pp": 1, "max_recompute_layers": 0,
                           "optimizer_offload": False}}
    _agree(doc)


@pytest.mark.parametrize("pp", [1, 4])
def test_backends_agree_with_the_expert_all_to_all_overlap(pp):
    """An MoE model whose experts span two nodes, with overlap_moe_expert_parallel_comm on:
    its exposed all-to-all is a maximum of the all-to-all and the layer's compute, gated to
    the plans Megatron-Core runs it on (pp = 1 or interleaved). Pinned at pp = 1 and free
    over pipelines of 4 (interleaved or not): every backend finds the same plan."""
    doc = {"model": {"layers": 8, "hidden": 4096, "heads": 32, "kv_heads": 8, "vocab": 32000,
                     "seq_len": 4096, "experts": 64, "top_k": 8, "moe_ffn_hidden": 4096},
           "training": {"global_batch": 64, "precision": "bf16"},
           "cluster": {"gpu": "h100-sxm", "nodes": 2},
           "constraints": {"overlap_moe_expert_parallel_comm": True, "pp": pp, "tp": 1,
                           "max_recompute_layers": 0, "optimizer_offload": False}}
    _agree(doc)
    res = outcome(parse_instance(doc), "cpsat")
    assert res.report.plan.ep > 1 and res.report.breakdown_s["ep_comm"] > 0


def test_a_layout_whose_count_has_a_prime_of_its_own_is_searched_by_the_mips():
    """37 layers pinned on pp = 3 split only with the embedding and the loss counted as layers
    (39 = 3 x 13), and the interleaved optimum has vp = 13: a prime of no other size of the
    instance (GPUs, nodes, layers, heads, sequence, batch). The MIPs see degrees as exponent
    vectors over the instance's primes; before the layouts' padded counts gave their primes
    to that list, vp = 13 read as vp = 1 and CP-SAT and HiGHS both proved a plan 8.7% slower
    "optimal" (0.7770 s at vp = 1 against the enumerator's 0.7149 s). Found on 110,880 H100
    (128 layers, pp = 10: 130 = 10 x 13), where CP-SAT returned 13.719 s against 11.562 s."""
    inst = parse_instance({
        "model": {"preset": "gpt-1.3b", "layers": 37},
        "training": {"global_batch": 96, "precision": "bf16"},
        "cluster": {"gpu": "a100-80gb", "nodes": 3},
        "constraints": {"pp": 3, "max_stage_shortfall": 2}})
    ref = solve(inst, solver="enumerate")
    assert ref.status == Status.OPTIMAL and ref.report.plan.vp == 13    # the case is exercised
    for backend in ("cpsat", "highs"):
        res = solve(inst, solver=backend)
        assert res.status == Status.OPTIMAL, backend
        assert res.objective == pytest.approx(ref.objective, rel=1e-6), backend
        assert res.report.plan.label() == ref.report.plan.label(), backend


def test_reported_objective_is_the_plans_not_a_slack_maximum():
    # after the objective goal the tie goals only cap it, so a variable standing for a maximum
    # may float within the tie window; the reported objective is the decoded plan's (a
    # fuzzer's torchtitan instance: CP-SAT read 0.28637001 s for a 0.28636505 s plan, exit 4)
    from planner.model.instance import parse_instance

    inst = parse_instance({
        "model": {"layers": 2, "hidden": 256, "heads": 4, "vocab": 50257, "seq_len": 4096},
        "training": {"global_batch": 128}, "cluster": {"gpu": "a100-80gb", "gpus": 2},
        "constraints": {"framework": "torchtitan", "dp_sharding": "none"}})
    for backend in ("cpsat", "highs"):
        res = solve(inst, solver=backend, explain=False)
        assert res.status.value == "optimal", res.note
        assert res.objective == pytest.approx(res.report.step_time_s, rel=1e-9)
        assert res.bound <= res.objective * (1 + 1e-9)


def test_tiny_class_factors_are_kept_by_cp_sat():
    # a gradient bucket's share of a tiny layer (about 1e-7) is a class factor CP-SAT's
    # integer rows multiply by; rounded to a denominator of at most 1e6 it was 0, the product
    # dropped, and CP-SAT proved TP1 DP8 mb2 'optimal' at 5.6112e-05 s, below-optimum bound
    # included, against the enumerator's PP4 DP2 mb8 at 5.5119e-05 s (a fuzzer)
    from planner.model.instance import parse_instance

    inst = parse_instance({
        "model": {"layers": 3, "heads": 2, "hidden": 128, "vocab": 256, "seq_len": 128},
        "training": {"global_batch": 16}, "cluster": {"gpu": "b200", "gpus": 8},
        "constraints": {"framework": "torchtitan"}})
    ref = solve(inst, solver="enumerate", explain=False)
    res = solve(inst, solver="cpsat", explain=False)
    assert res.report.plan == ref.report.plan
    assert res.objective == pytest.approx(ref.objective, rel=1e-6)
    assert res.bound >= ref.objective * (1 - 1e-6)


def test_an_error_in_the_parts_beside_the_tie_goals_reaches_the_caller(monkeypatch):
    """(PARTS_BESIDE_TIES: the later parts run in a thread; its exception is not swallowed)"""
    import formulations.solve as fs
    from planner.model.errors import SolverError

    inst = parse_instance({
        "model": {"layers": 4, "hidden": 1024, "heads": 8, "vocab": 32000, "seq_len": 2048},
        "training": {"global_batch": 16}, "cluster": {"gpu": "h100-sxm", "nodes": 2},
        "constraints": {"max_micro_batch": 4, "max_recompute_layers": 0}})
    monkeypatch.setattr(fs, "SPLIT_ABOVE", 0)
    solve_model = fs._solve_model

    def failing(space, backend, time_limit, objective, cuts, on_optimum=None):
        if cuts.max_objective is not None and not cuts.break_ties:     # a later, capped part
            raise SolverError("a capped part failed")
        return solve_model(space, backend, time_limit, objective, cuts, on_optimum)
    monkeypatch.setattr(fs, "_solve_model", failing)
    with pytest.raises(SolverError, match="a capped part failed"):
        solve(inst, solver="cpsat")


#: benchmarks/instances/b200x24-gpt3-175b.toml with its optimum's tp, pp and micro-batch pinned
#: (dp * cp = 1: ZeRO-1 and ZeRO-2 are the same plan there)
B200X24_PINNED = {"model": {"preset": "gpt3-175b"}, "training": {"global_batch": 96},
                  "cluster": {"gpu": "b200", "gpus": 24, "gpus_per_node": 8},
                  "constraints": {"tp_within_node": False, "overlap_grad_reduce": True,
                                  "overlap_param_gather": True, "tp": 4, "pp": 6,
                                  "micro_batch": 1}}


def window_spy(monkeypatch) -> list:
    """Per tie-goal run of a solve, whether it was a window re-solve of ties across parts
    (``ties.run(window=True)``); the split into parts forced (the pins make the space small)."""
    import formulations.solve as fs
    from formulations import ties

    windows = []
    run = ties.run

    def spy(*args, **kwargs):
        windows.append(kwargs.get("window", False) or (len(args) > 4 and args[4]))
        return run(*args, **kwargs)
    monkeypatch.setattr(ties, "run", spy)
    monkeypatch.setattr(fs, "SPLIT_ABOVE", 0)
    return windows


def test_ties_held_by_two_sharding_parts_are_broken_alike(monkeypatch):
    """At dp = 1 ZeRO-1 and ZeRO-2 are the same plan, so both sharding parts hold the optimum
    and their ties are re-solved as one model that starts at the memory goal, its objective
    capped at the window the parts proved (``Cuts.window``). HiGHS must pick the copy the
    enumerator picks. The instance is benchmarks/instances/b200x24-gpt3-175b.toml with its
    optimum's tp, pp and micro-batch pinned (the split forced), so that HiGHS takes 1-2 s: a
    re-solve that loses the cap fails here. A MIP start for HiGHS's tie goals once gave another
    copy on the unpinned instance only (40 s under HiGHS, too slow for the suite;
    benchmarks/README.md, "HiGHS tie goals from a MIP start: dropped"). The MIPs now leave out
    the ZeRO-2 copies at dp * cp = 1 (formulations/one_shard.py), which removes this tie; it
    is switched off here to keep the window re-solve under test (ties across parts also arise
    elsewhere), and test_one_shard_copies_are_left_out_alike checks it on."""
    from formulations import one_shard

    monkeypatch.setattr(one_shard, "_dominated", lambda root, objective: frozenset())
    inst = parse_instance(B200X24_PINNED)
    windows = window_spy(monkeypatch)
    ref = solve(inst, solver="enumerate")
    res = solve(inst, solver="highs")
    assert res.status == Status.OPTIMAL
    assert any(windows)                            # the ties were re-solved in their window
    assert ref.report.plan.dp == 1
    assert res.report.plan == ref.report.plan


def test_one_shard_copies_are_left_out_alike(monkeypatch):
    """At dp * cp = 1 a sharding mode shards over one GPU: the MIPs leave out the plans of a
    combination whose ZeRO-1 twin the tie goals always choose first (formulations/one_shard.py),
    so the instance of test_ties_held_by_two_sharding_parts_are_broken_alike needs no re-solve
    of the ties across parts, and both MIPs still return the enumerator's optimum and plan,
    which keeps every plan. With ZeRO-3 pinned there is no twin: nothing is left out, and the
    answer is the ZeRO-3 plan at dp = 1."""
    from formulations.encoding import encode
    from formulations.one_shard import dominated_at_one_shard
    from formulations.space import build_space

    doc = B200X24_PINNED
    inst = parse_instance(doc)
    space = build_space(inst)
    left_out = dominated_at_one_shard(space, "step_time")
    assert left_out and all(k.dp_sharding != "optim" for k in left_out)
    assert encode(space).one_shard and not encode(space, prune=False).one_shard
    windows = window_spy(monkeypatch)
    ref = solve(inst, solver="enumerate")
    assert ref.report.plan.dp * ref.report.plan.cp == 1
    for backend in ("cpsat", "highs"):
        res = solve(inst, solver=backend)
        assert res.status == Status.OPTIMAL, backend
        assert res.objective == pytest.approx(ref.objective, rel=1e-6, abs=tolerance(res))
        assert res.report.plan == ref.report.plan, backend
    assert windows and not any(windows)             # no re-solve of ties across parts
    pinned = parse_instance({**doc, "constraints": {**doc["constraints"],
                                                    "dp_sharding": "optim_grads_params"}})
    assert not dominated_at_one_shard(build_space(pinned), "step_time")
    ref = solve(pinned, solver="enumerate")
    res = solve(pinned, solver="cpsat")
    assert ref.report.plan.dp_sharding == "optim_grads_params" and ref.report.plan.dp == 1
    assert res.report.plan == ref.report.plan


@pytest.mark.parametrize("batch, reserve, layers, settled", [(8, 76, 6, True), (8, 74, 5, False)])
def test_the_first_part_holding_a_plan_leads(monkeypatch, batch, reserve, layers, settled):
    """When the first parts hold no plan (here memory rules out the plans of the first
    sharding-mode and layout models), the first part solved that holds one leads: it breaks
    its own ties as it is solved, so when it alone holds the optimum its ties are not solved
    again on a rebuilt model (a window re-solve, :func:`window_spy`); where another part ties,
    they are. Either way every
    backend returns the enumerator's plan."""
    import formulations.solve as fs

    inst = parse_instance({
        "model": {"layers": layers, "hidden": 6144, "heads": 48, "vocab": 32000,
                  "seq_len": 2048},
        "training": {"global_batch": batch},
        "cluster": {"gpu": "h100-sxm", "gpus": 8},
        "constraints": {"max_tp": 2, "max_micro_batch": 2, "memory_reserve_GiB": reserve}})
    ref = solve(inst, solver="enumerate").report.plan
    windows = window_spy(monkeypatch)                   # (the split into parts forced)
    monkeypatch.setattr(fs, "SPLIT_LAYOUTS_ABOVE", 0)
    calls = []
    run = fs.run_backend

    def spy(space, backend, *args, **kwargs):
        raw, q = run(space, backend, *args, **kwargs)
        calls.append((kwargs.get("break_ties", True), kwargs.get("window", False),
                      raw.objective is not None))
        return raw, q
    monkeypatch.setattr(fs, "run_backend", spy)
    for backend in ("cpsat", "highs"):
        calls.clear()
        windows.clear()
        res = solve(inst, solver=backend)
        assert res.report.plan == ref, backend
        parts = calls[:-1]                              # (the last: the whole space's call)
        lead = next(i for i, (ties, _, found) in enumerate(parts) if found)
        assert lead > 0 and parts[lead][0], (backend, parts)
        later = [ties for ties, window, _ in parts[lead + 1:] if not window]
        assert not any(later), (backend, parts)   # (capped parts: no ties of their own)
        assert any(windows) is (not settled), (backend, parts, windows)


def test_the_one_shard_check_is_skipped_where_listing_its_points_would_cost(monkeypatch):
    """Listing the points at dp * cp = 1 of a wide range of global batches cost tens of seconds
    and gigabytes (an input fuzzer's [1, 4194304] on one node: 45 s, 1.9 GB): above
    ONE_SHARD_POINTS_LIMIT, counted not listed, no combination is left out; with nothing left
    out the MIPs still return the enumerator's optimum and plan."""
    from formulations import one_shard
    from formulations.space import build_space

    wide = parse_instance({"model": {"preset": "gpt-1.3b"},
                           "training": {"global_batch": [1, 4194304]},
                           "cluster": {"gpu": "a100-80gb", "nodes": 1}})
    assert one_shard.one_shard_points(build_space(wide)) is None
    monkeypatch.setattr(one_shard, "ONE_SHARD_POINTS_LIMIT", 0)
    inst = parse_instance(B200X24_PINNED)
    assert not one_shard.dominated_at_one_shard(build_space(inst), "step_time")
    ref = solve(inst, solver="enumerate")
    res = solve(inst, solver="cpsat")
    assert res.report.plan == ref.report.plan

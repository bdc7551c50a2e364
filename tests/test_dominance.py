"""The search space turns sequence parallelism and the distributed optimizer on unless a
constraint pins them (formulations/space.py). That is exact only if, in the model, turning them
on never costs time and never adds memory: checked here on random plans of random instances.
Sequence parallelism keeps to it with tensor parallelism inside a node; across nodes its
exposed backward all-gather can cost more than it saves (measured up to 2.8% on these
instances), so the search compares both where tensor parallelism may span nodes; the distributed
optimizer's overlapped parameter all-gather can leave up to 0.03% more exposed than the
all-reduce it replaces."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from planner.model.frameworks import OVERLAP_KNOBS
from planner.model.plan import Degrees, Knobs
from planner.model.terms import step_terms
from planner.model.instance import parse_instance

#: The distributed optimizer with overlap_param_gather hides its parameter all-gather only
#: behind the first forward, where the plain all-reduce hid behind the backward: docs/encoding.md
#: ("up to 0.03% more", measured on these plans) is why the search does not prune plain data
#: parallelism when a data-parallel overlap is on. The one tolerance of this test, and only
#: for that pair; everywhere the search prunes, the premise is checked to 1e-12.
DIST_OPT_OVERLAP_SLACK = 3e-4


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    heads=st.sampled_from([8, 16, 32]), kv=st.sampled_from([1, 2, 8]),
    gated=st.booleans(), flash=st.booleans(), dropout=st.booleans(),
    experts=st.sampled_from([0, 0, 4]),
    t_in=st.sampled_from([1, 2, 4, 8]), t_out=st.sampled_from([1, 2]),
    c_in=st.sampled_from([1, 2]), p_in=st.sampled_from([1, 2]), p_out=st.sampled_from([1, 4]),
    d_in=st.sampled_from([1, 2]), d_out=st.sampled_from([1, 3, 16]),
    b=st.sampled_from([1, 2, 4]), v=st.sampled_from([1, 2]),
    recompute=st.sampled_from(["none", "selective", "full"]),
    overlap=st.booleans(), precision=st.sampled_from(["bf16", "fp8"]),
)
def test_sequence_parallel_and_distributed_optimizer_dominate(
        heads, kv, gated, flash, dropout, experts, t_in, t_out, c_in, p_in, p_out, d_in, d_out,
        b, v, recompute, overlap, precision):
    inst = parse_instance({
        "model": {"layers": 8, "hidden": heads * 128, "heads": heads,
                  "kv_heads": min(kv, heads), "gated_mlp": gated, "vocab": 32000,
                  "seq_len": 4096, "dropout": dropout, "experts": experts},
        "training": {"global_batch": 1024, "precision": precision, "flash_attention": flash},
        "cluster": {"gpu": "h100-sxm", "nodes": 64},
    })
    deg = Degrees(t_in=t_in, t_out=t_out, c_in=c_in, c_out=1, p_in=p_in, p_out=p_out,
                  d_in=d_in, d_out=d_out, b=b, v=v, B=1024, e_in=1, e_out=2 if experts else 1,
                  ed_in=1, ed_out=2)
    settings_ = [(sp, dist) for sp in (False, True) for dist in (False, True)]
    overlaps = dict.fromkeys(OVERLAP_KNOBS, overlap)
    terms = {k: step_terms(inst, deg, Knobs(recompute, *k, **overlaps)) for k in settings_}
    for lo in settings_:          # turning either knob on never makes anything worse
        for hi in settings_:
            if hi[0] >= lo[0] and hi[1] >= lo[1]:
                on, off = terms[hi], terms[lo]
                if t_out == 1 or hi[0] == lo[0]:
                    # The search prunes on this premise and then claims a proven optimum, so
                    # it must hold exactly (float rounding aside): sequence parallelism is
                    # kept on with or without overlap, plain data parallelism is left out
                    # where no data-parallel overlap is on (formulations/space.py). Only the
                    # distributed optimizer's step with the data-parallel overlaps on gets
                    # the documented slack, and there plain data parallelism is searched.
                    slack = DIST_OPT_OVERLAP_SLACK if overlap and hi[1] != lo[1] else 1e-12
                    assert float(on.step_time) <= float(off.step_time) * (1 + slack), \
                        (lo, hi, float(on.step_time) / float(off.step_time) - 1)
                for stage in on.memory:
                    # (tp_comm_overlap's userbuffers come with sequence parallelism, which the
                    # search keeps on wherever tp_comm_overlap is (formulations/space.py,
                    # sp_needed): no choice between the two rests on them)
                    buffers = on.memory[stage].get("comm_buffers", 0.0) if hi[0] != lo[0] \
                        else 0.0
                    assert float(on.memory_total(stage)) - float(buffers) <= \
                        float(off.memory_total(stage)) * (1 + 1e-12)


def test_sequence_parallelism_is_searched_where_tensor_parallelism_spans_nodes():
    """Two H100 per node: TP4 spans two nodes, where sequence parallelism's exposed backward
    all-gather costs more than it saves; the search compares both and proves the plan without
    it faster than the best plan with it (pinned). Overlap is free here (overlap_slowdown 0):
    the hidden backward all-reduce without sequence parallelism then costs nothing, so the
    case stays clear-cut."""
    from formulations.solve import solve

    doc = {"model": {"preset": "gpt3-175b"}, "training": {"global_batch": 512},
           "cluster": {"gpu": "h100-sxm", "gpus": 256, "gpus_per_node": 2,
                       "overlap_slowdown": 0},
           "constraints": {"tp_within_node": False, "optimizer_offload": False,
                           "offload_layers": 0}}        # (host offload: test_offload.py)
    free = solve(parse_instance(doc), solver="enumerate")
    doc["constraints"]["sequence_parallel"] = True
    pinned = solve(parse_instance(doc), solver="enumerate")
    assert free.report.plan.sequence_parallel is False
    assert free.report.plan.tp > 2                    # across the 2-GPU nodes
    assert free.objective < pinned.objective
    assert free.space_plans == pinned.space_plans * 2


def test_largest_batch_dominates_in_a_batch_range():
    """With a global-batch range the search keeps, per assignment of the other variables, only
    the largest batch it admits. Checked against the full range on instances where the largest
    batch is not always reachable."""
    from formulations.enumerate import evaluate_all, feasible_points
    from formulations.space import build_space

    for gb, gpus in (([48, 200], 24), ([7, 64], 8), ([100, 1000], 48)):
        inst = parse_instance({
            "model": {"layers": 12, "hidden": 768, "heads": 12, "vocab": 32000,
                      "seq_len": 2048},
            "training": {"global_batch": gb},
            "cluster": {"gpu": "a100-80gb", "gpus": gpus},
            "constraints": {"max_micro_batch": 8},
        })
        space = build_space(inst)
        full = feasible_points(space, dominant_batch=False)
        best = feasible_points(space)
        assert len(best["T"]) < len(full["T"])
        obj_full, _ = evaluate_all(space, full, "time_per_sample")
        obj_best, _ = evaluate_all(space, best, "time_per_sample")
        assert obj_best.min() == obj_full.min()


@settings(max_examples=150, deadline=None, derandomize=True)
@given(
    heads=st.sampled_from([8, 32]), experts=st.sampled_from([0, 0, 4]),
    t_in=st.sampled_from([1, 2, 8]), t_out=st.sampled_from([1, 2]),
    p_in=st.sampled_from([1, 2]), p_out=st.sampled_from([1, 4]),
    d_in=st.sampled_from([1, 2]), d_out=st.sampled_from([1, 3, 16]),
    b=st.sampled_from([1, 4]), v=st.sampled_from([1, 2]),
    recompute=st.sampled_from(["none", "selective", "full"]),
    sp=st.booleans(), dist=st.booleans(), on=st.sampled_from(OVERLAP_KNOBS),
    framework=st.sampled_from(["megatron", "nemo", "deepspeed"]),
)
def test_each_overlap_never_costs_time_or_memory(heads, experts, t_in, t_out, p_in, p_out, d_in,
                                                 d_out, b, v, recompute, sp, dist, on, framework):
    """Why the search does not decide the overlap switches (formulations/space.py): switching
    one on, whatever the others are, never adds step time, and leaves memory unchanged but for
    tp_comm_overlap's userbuffers (with sequence parallelism and tp > 1: a cost the user or the
    framework takes on with the switch). The degrees keep interleaving's rule (micro-batches a
    multiple of pp) that the p2p rule needs."""
    inst = parse_instance({
        "model": {"layers": 8, "hidden": heads * 128, "heads": heads, "vocab": 32000,
                  "seq_len": 4096, "experts": experts},
        "training": {"global_batch": 1024},
        "cluster": {"gpu": "h100-sxm", "nodes": 64},
        "constraints": {"framework": framework},
    })
    deg = Degrees(t_in=t_in, t_out=t_out, c_in=1, c_out=1, p_in=p_in, p_out=p_out,
                  d_in=d_in, d_out=d_out, b=b, v=v, B=1024, e_in=1, e_out=2 if experts else 1,
                  ed_in=1, ed_out=2)
    for others in (False, True):
        base = dict.fromkeys(OVERLAP_KNOBS, others)
        off = step_terms(inst, deg, Knobs(recompute, sp, dist, **{**base, on: False}))
        up = step_terms(inst, deg, Knobs(recompute, sp, dist, **{**base, on: True}))
        assert float(up.step_time) <= float(off.step_time) * (1 + 1e-12)
        for terms, flags in ((off, {**base, on: False}), (up, {**base, on: True})):
            held = flags["tp_comm_overlap"] and sp and t_in * t_out > 1
            assert all((float(terms.memory[st]["comm_buffers"]) > 0) == held
                       for st in terms.memory if not st.startswith("host"))

        def rest(terms, stage):
            return {k: v for k, v in terms.memory[stage].items()
                    if k not in ("comm_buffers", "framework_rule")}
        assert all(rest(up, st) == rest(off, st) for st in up.memory)
        # the one bar a switch sets: Megatron-LM's validate_args refuses an interleaved
        # schedule without p2p overlap on two ranks or fewer (a plan the search leaves);
        # switching the overlap on never adds a bar
        barred = (framework == "megatron" and on == "overlap_p2p_comm" and v > 1
                  and p_in * p_out <= 2)

        def bar(terms):
            return max(float(terms.memory[st].get("framework_rule", 0.0)) for st in terms.memory)
        assert bar(up) <= bar(off) and (bar(off) > bar(up)) == barred

"""The search space turns sequence parallelism and the distributed optimizer on unless a
constraint pins them (formulations/space.py). That is exact only if, in the model, turning them
on never costs time and never adds memory: checked here on random plans of random instances."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from planner.evaluator import Degrees, Knobs, step_terms
from planner.instance import parse_instance


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
    overlap=st.sampled_from([0.0, 0.5, 1.0]), precision=st.sampled_from(["bf16", "fp8"]),
)
def test_sequence_parallel_and_distributed_optimizer_dominate(
        heads, kv, gated, flash, dropout, experts, t_in, t_out, c_in, p_in, p_out, d_in, d_out,
        b, v, recompute, overlap, precision):
    inst = parse_instance({
        "model": {"layers": 8, "hidden": heads * 128, "heads": heads,
                  "kv_heads": min(kv, heads), "gated_mlp": gated, "vocab": 32000,
                  "seq_len": 4096, "dropout": dropout, "experts": experts},
        "training": {"global_batch": 1024, "precision": precision, "flash_attention": flash,
                     "dp_overlap": overlap, "tp_overlap": overlap},
        "cluster": {"gpu": "h100-sxm", "nodes": 64},
    })
    deg = Degrees(t_in=t_in, t_out=t_out, c_in=c_in, c_out=1, p_in=p_in, p_out=p_out,
                  d_in=d_in, d_out=d_out, b=b, v=v, B=1024, e_in=1, e_out=2 if experts else 1,
                  ed_in=1, ed_out=2)
    settings_ = [(sp, dist) for sp in (False, True) for dist in (False, True)]
    terms = {k: step_terms(inst, deg, Knobs(recompute, *k)) for k in settings_}
    for lo in settings_:          # turning either knob on never makes anything worse
        for hi in settings_:
            if hi[0] >= lo[0] and hi[1] >= lo[1]:
                on, off = terms[hi], terms[lo]
                assert float(on.step_time) <= float(off.step_time) * (1 + 1e-12)
                for stage in on.memory:
                    assert float(on.memory_total(stage)) <= \
                        float(off.memory_total(stage)) * (1 + 1e-12)

"""The encoding reproduces the evaluator: at every structurally feasible point of random
instances, the step time and memory computed from the encoding's tables (what the MIPs
optimise) equal the evaluator's numbers."""

from __future__ import annotations

import numpy as np
import pytest

from formulations.encoding import encode, evaluate_encoding
from formulations.enumerate import degrees_of, feasible_points
from formulations.space import build_space, layout_key
from planner.model.terms import step_terms
from planner.model.instance import load_instance, parse_instance


CASES = [
    load_instance("instances/gpt3-175b-a100.toml"),
    load_instance("instances/llama3-70b-h100.toml"),
    load_instance("instances/mixtral-8x7b-h100.toml"),
    parse_instance({"model": {"layers": 6, "hidden": 768, "heads": 12, "kv_heads": 4,
                              "vocab": 32000, "seq_len": 4096, "experts": 4, "top_k": 2,
                              "first_dense_layers": 2},
                    "training": {"global_batch": 96, "flash_attention": False},
                    "cluster": {"gpu": "b200", "nodes": 3},
                    "constraints": {"max_cp": 2, "sequence_parallel": False,
                                    "distributed_optimizer": False,
                                    "overlap_grad_reduce": True}}),
    # every overlap on (NeMo's defaults plus tensor-parallel overlap), MoE with sequence
    # parallelism and the distributed optimizer
    parse_instance({"model": {"layers": 8, "hidden": 1024, "heads": 16, "vocab": 32000,
                              "seq_len": 2048, "experts": 4, "top_k": 2,
                              "first_dense_layers": 2},
                    "training": {"global_batch": 64},
                    "cluster": {"gpu": "h100-sxm", "nodes": 4},
                    "constraints": {"framework": "nemo", "tp_comm_overlap": True,
                                    "max_recompute_layers": 0}}),
    # partial recompute searched (shares of each virtual stage; mixed maxima), uneven layouts
    parse_instance({"model": {"preset": "gpt-1.3b"}, "training": {"global_batch": 16},
                    "cluster": {"gpu": "a100-80gb", "nodes": 1},
                    "constraints": {"max_recompute_layers": 8, "overlap_grad_reduce": True,
                                    "recompute": ["none", "full"], "dp_sharding": "optim",
                                    "optimizer_offload": False}}),
]


@pytest.mark.parametrize("inst", CASES, ids=["gpt3", "llama70b", "mixtral", "tiny-moe-cp", "overlaps",
                                         "partial"])
def test_tables_reproduce_the_evaluator(inst):
    space = build_space(inst)
    points = feasible_points(space)
    enc = encode(space, "step_time", prune=False)
    deg = degrees_of(space, points)
    rng = np.random.default_rng(0)
    rows = rng.choice(len(points["T"]), size=min(60, len(points["T"])), replace=False)
    for k, knobs in enumerate(enc.combos):
        terms = step_terms(inst, deg, knobs)
        step = np.broadcast_to(np.asarray(terms.step_time, float), (len(points["T"]),))
        allowed = space.layout_pairs[layout_key(knobs)]      # the plans of this layout
        for i in rows:
            choice = {name: int(col[i]) for name, col in points.items()}
            if (choice["P"], choice["V"]) not in allowed:
                continue
            got = evaluate_encoding(enc, choice, k)
            assert got["objective"] == pytest.approx(step[i], rel=1e-9)
            for stage in terms.memory_stages():
                mem = np.broadcast_to(np.asarray(terms.memory_total(stage), float),
                                      (len(points["T"]),))
                assert got[f"memory_{stage}"] == pytest.approx(mem[i], rel=1e-9)


RANGES = [
    {"model": {"preset": "gpt3-175b"}, "training": {"global_batch": [256, 16384]},
     "cluster": {"gpu": "a100-80gb", "gpus": 512}, "constraints": {"tp_within_node": False}},
    {"model": {"layers": 6, "hidden": 768, "heads": 12, "kv_heads": 4, "vocab": 32000,
               "seq_len": 4096, "experts": 4, "top_k": 2, "first_dense_layers": 2},
     "training": {"global_batch": [24, 384]}, "cluster": {"gpu": "b200", "nodes": 3},
     "constraints": {"max_cp": 2, "tp_within_node": False}},
]


@pytest.mark.parametrize("spec", RANGES, ids=["gpt3-512-range", "tiny-moe-range"])
def test_batch_models_share_the_ranges_symbolic_terms(spec):
    """A batch model of a range takes the range's terms, written once with the batch as a
    symbol, with its batch substituted (encoding._combo_terms): the same terms as running
    ``step_terms`` with the batch as a number, each coefficient equal to the last bits."""
    from formulations import encoding
    from formulations.solve import _batch_model
    from formulations.space import candidate_batches

    space = build_space(parse_instance(spec))

    def same(a, b):
        assert set(a.terms) == set(b.terms)
        for k, c in a.terms.items():
            assert c == pytest.approx(b.terms[k], rel=1e-14, abs=0)
        assert [len(m) for m in a.maxes] == [len(m) for m in b.maxes]
        for ma, mb in zip(a.maxes, b.maxes):
            for x, y in zip(ma, mb):
                same(x, y)
    for batch in candidate_batches(space)[:3]:
        model = _batch_model(space, batch)
        deg, sym = encoding.symbolic_degrees(model)
        for knobs in model.combos[:12]:
            shared = encoding._combo_terms(model, deg, sym, knobs, "time_per_sample", True)
            model.terms_cache.clear()
            try:
                encoding.SHARE_BATCH_TERMS = False
                own = encoding._combo_terms(model, deg, sym, knobs, "time_per_sample", True)
            finally:
                encoding.SHARE_BATCH_TERMS = True
            same(shared[0], own[0])
            same(shared[2], own[2])
            assert set(shared[1]) == set(own[1])
            for stage in own[1]:
                same(shared[1][stage], own[1][stage])


def test_the_cp_sat_quantum_keeps_the_largest_entry_an_integer():
    """CP-SAT's time unit is 1e-7 of a typical (median) table entry, unless the tables reach
    further than 2^50 such units: then a coarser power of ten. DeepSeek-V3 on 1,024 GB200 had a
    median entry near 1e-3 s and entries up to 1.4e6 s (degrees no plan takes), and CP-SAT, the
    default solver, refused the instance ("CP-SAT needs integer units"); with the coarser unit
    (1e-8 s) the three backends give the same plan. Here one entry of a small instance's
    objective is widened to 10^16 units (the DeepSeek case had 1.4e16): the unit grows by
    powers of ten so that it fits, and stays far finer than the optimum."""
    import dataclasses

    from formulations import cpsat
    from formulations.milp import SAFE_INT, magnitude
    from formulations.solve import solve

    inst = load_instance("instances/gpt-1.3b-1node.toml")
    enc = encode(build_space(inst), "step_time")
    q = cpsat.quantum(enc)
    assert q == 10.0 ** np.floor(np.log10(enc.scale * cpsat.RELATIVE_QUANTUM))
    u = enc.objective.usages[0]
    wide = dataclasses.replace(u, table=u.table.copy(), main_table=u.main_table.copy())
    wide.main_table.flat[0] = wide.table.flat[0] = 1e16 * q
    wider = dataclasses.replace(enc, objective=dataclasses.replace(
        enc.objective, usages=[wide, *enc.objective.usages[1:]]))
    q_wide = cpsat.quantum(wider)
    assert magnitude([wider.objective]) / q_wide <= SAFE_INT / 8 < magnitude([wider.objective]) / q
    assert q_wide == pytest.approx(10 * q)
    optimum = solve(inst, solver="enumerate").objective
    assert q_wide < 1e-6 * optimum


@pytest.mark.parametrize("spec", RANGES[1:] + [
    {"model": {"preset": "mixtral-8x7b", "layers": 8}, "training": {"global_batch": 64},
     "cluster": {"gpu": "h100-sxm", "nodes": 4}, "constraints": {"max_cp": 2}}],
    ids=["tiny-moe-range", "mixtral-cp"])
def test_combinations_compared_on_the_main_columns_as_on_the_whole_tables(spec, monkeypatch):
    """A table is its main factor's columns times an outer product shared by every
    combination, so the combinations can be compared on the columns (encoding.SCALED_DEPENDS:
    which dimensions a table depends on, which combinations dominate): the same combinations,
    copies, usages and tables as comparing the whole tables,
    on a range's batch models (the three largest batches) and a fixed-batch model."""
    from formulations import encoding
    from formulations.solve import _batch_model
    from formulations.space import candidate_batches

    space = build_space(parse_instance(spec))
    if len(space.base["B"].values) > 1:
        models, goal = [_batch_model(space, b) for b in candidate_batches(space)[:3]], \
            "time_per_sample"
    else:
        models, goal = [space], "step_time"
    assert len(models) >= 1
    for model in models:
        monkeypatch.setattr(encoding, "SCALED_DEPENDS", True)
        fast = encoding.encode(model, goal)
        monkeypatch.setattr(encoding, "SCALED_DEPENDS", False)
        whole = encoding.encode(model, goal)
        assert fast.combos == whole.combos                   # (the same ones undominated)
        assert list(fast.copies) == list(whole.copies)
        assert any(k.others for k in fast.copies)          # (secondary axes: the case at stake)
        for a, b in zip([fast.objective, *fast.memory.values()],
                        [whole.objective, *whole.memory.values()]):
            assert [u.copy for u in a.usages] == [u.copy for u in b.usages]
            for ua, ub in zip(a.usages, b.usages):
                assert np.array_equal(ua.table, ub.table)

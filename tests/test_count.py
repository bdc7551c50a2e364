"""The space is counted over the rules, never listed (formulations/space.py ``count_points``):
on instances the enumerator can walk, the counts, the per-value counts and the batches a range
can win on equal what the enumerator's list of feasible points gives."""

from __future__ import annotations

import collections
import itertools

import numpy as np
import pytest

from formulations.enumerate import feasible_points
from formulations.space import build_space, candidate_batches, count_points, layout_key, space_size
from planner.model.instance import load_instance, parse_instance

TINY_MOE = {"model": {"layers": 6, "hidden": 768, "heads": 12, "kv_heads": 4, "vocab": 32000,
                      "seq_len": 4096, "experts": 4, "top_k": 2, "first_dense_layers": 2},
            "training": {"global_batch": [24, 384]}, "cluster": {"gpu": "b200", "nodes": 3},
            "constraints": {"max_cp": 2, "max_dp": 12, "tp_within_node": False}}
CASES = [
    load_instance("instances/gpt3-175b-a100.toml"),
    load_instance("instances/mixtral-8x7b-h100.toml"),
    parse_instance(TINY_MOE),
]


@pytest.mark.parametrize("inst", [CASES[0], parse_instance(
    {**TINY_MOE, "constraints": {**TINY_MOE["constraints"], "max_offload_layers": 5}})],
    ids=["gpt3", "tiny-moe-offload"])
def test_the_count_is_the_sum_over_pinned_sharding_modes_and_sequence_parallelism(inst):
    """The space with every knob free is the disjoint union of the spaces with the sharding
    mode and sequence parallelism pinned, so its plans and knob combinations are their sums:
    also where the free search leaves modes out by dominance, where host offload exists for
    one mode only (the optimizer offload with Megatron's distributed optimizer), where partial
    recompute exists for full recompute only, and where plain data parallelism has no shard
    group (R = 1)."""
    free = space_size(build_space(inst))
    parts = {"space_combos": 0, "space_plans": 0}
    for mode, sp in itertools.product(("none", "optim", "optim_grads", "optim_grads_params"),
                                      (True, False)):
        cons = inst.spec.constraints.model_copy(update={"dp_sharding": mode,
                                                        "sequence_parallel": sp})
        size = space_size(build_space(inst.with_spec(constraints=cons)))
        for key in parts:
            parts[key] += size[key]
    assert {k: free[k] for k in parts} == parts


@pytest.mark.parametrize("inst", CASES, ids=["gpt3", "mixtral", "tiny-moe-range-dpcap"])
def test_counts_match_the_enumerated_points(inst):
    space = build_space(inst)
    every = feasible_points(space, dominant_batch=False)
    assert sum(count_points(space).values()) == len(every["T"])
    for name in ("P", "T", "B"):                       # counts per value of one variable
        by_value = {space.base[name].values[k[0]]: n
                    for k, n in count_points(space, track=(name,)).items()}
        assert by_value == dict(collections.Counter(every[name].tolist()))
    dominant = feasible_points(space)                  # a range: the largest batch of each
    assert candidate_batches(space) == sorted(set(dominant["B"].tolist()), reverse=True)


def test_plans_count_every_knob_value_and_the_moe_rule():
    """3 recompute modes x 4 sharding modes x sequence parallelism per pipeline layout (the
    values the search leaves out by dominance counted too: sequence parallelism, plain data
    parallelism and ZeRO-2 where ZeRO-1 equals it); on a MoE model sequence parallelism off is
    a plan only at tp = 1, plain data parallelism only at R = 1. Host offload and partial
    recompute pinned off, so that every mode has the same combinations; with them, see
    test_the_count_is_the_sum_over_pinned_sharding_modes_and_sequence_parallelism."""
    inst = parse_instance({**TINY_MOE, "constraints": {**TINY_MOE["constraints"],
                                                       "optimizer_offload": False,
                                                       "offload_layers": 0,
                                                       "max_recompute_layers": 0}})
    space = build_space(inst)
    every = feasible_points(space, dominant_batch=False)
    size = space_size(space)
    # per pipeline layout (each admits its own pp, vp pairs): the 3 modes x sharding x 2
    layouts = {layout_key(k) for k in space.combos}
    kept = len(space.dims["sharding_choice"])
    assert kept < 4                               # (none and ZeRO-2 are dominated here)
    assert size["space_points"] == len(every["T"])
    assert size["space_combos"] == 3 * 4 * 2 * len(layouts)
    expected = 0
    for lay in layouts:            # each: the 3 modes x 4 sharding modes x sp on / off
        pairs = space.layout_pairs[lay]
        ok = np.array([(p, v) in pairs for p, v in zip(every["P"].tolist(),
                                                       every["V"].tolist())])
        for sharded, sp in itertools.product((False, True, True, True), (True, False)):
            # plain data parallelism has no shard group: its plans are those at R = 1
            expected += 3 * int((ok & (sharded | (every["R"] == 1))
                                 & (sp | (every["T"] == 1))).sum())
    assert size["space_plans"] == expected


def test_no_plan_counts_zero():
    inst = parse_instance({"model": {"layers": 4, "hidden": 512, "heads": 8, "vocab": 1000,
                                     "seq_len": 512},
                           "training": {"global_batch": 7},
                           "cluster": {"gpu": "h100-sxm", "gpus": 8},
                           "constraints": {"max_tp": 1, "max_pp": 1}})
    space = build_space(inst)
    assert count_points(space) == {} and len(feasible_points(space)["T"]) == 0


def test_batch_models_presolve_to_their_dominant_assignments():
    """Each fixed-batch model of a range keeps the form values of the assignments whose largest
    admissible batch is its own (``SearchSpace.form_reach``): every value the enumerator's
    points at that batch take (so the presolve is exact), only values of assignments admitting
    the batch, and on some model fewer than those (the near-ties the capped models lose)."""
    from formulations.encoding import encode
    from formulations.solve import _batch_model

    space = build_space(parse_instance(TINY_MOE))
    every = feasible_points(space, dominant_batch=False)
    dominant = feasible_points(space)

    def exps(points, mono, batch):
        at = points["B"] == batch
        out = np.zeros((int(at.sum()), len(space.primes)), dtype=np.int64)
        for v, e in mono:
            vals = space.base[v].values
            table = np.array([space.base[v].exps[vals.index(x)] for x in points[v][at].tolist()],
                             dtype=np.int64).reshape(-1, len(space.primes))
            out += e * table
        return {tuple(r) for r in out.tolist()}
    narrower = 0
    # every other candidate batch, the largest first (16 here; all of them took 11-19 s of the
    # suite's CPU, half the batches check the same rule on half the models)
    for batch in candidate_batches(space)[::2]:
        model = _batch_model(space, batch)
        for mono in encode(model, "time_per_sample", ties=False).forms:
            reach = set(model.form_reach(mono))
            admitting = set(count_points(model, form=mono))    # (the layouts left out too)
            assert exps(dominant, mono, batch) <= reach <= admitting, (batch, mono)
            narrower += reach < admitting
            assert exps(every, mono, batch) <= admitting
    assert narrower


@pytest.mark.parametrize("inst", [CASES[0], CASES[2]], ids=["gpt3", "tiny-moe-range-dpcap"])
def test_form_values_read_off_the_walks_graph_equal_a_walk_per_form(inst):
    """The presolve reads every form's values and counts off one walk of the rules kept as a
    graph (``SearchSpace.form_reach``, ``_Diagram``); a walk of the rules per form
    (``_count_points`` with ``form``, as before) gives the same counts, value for value; for
    a batch range, so does one per form with the batch tracked and only each assignment's
    largest batch kept, batch by batch."""
    from formulations.encoding import encode
    from formulations.solve import _batch_model
    from formulations.space import _count_points

    space = build_space(inst)
    forms = encode(space, "step_time", ties=False).forms
    batches = candidate_batches(space) if len(space.base["B"].values) > 1 else []
    spread = 0
    for mono in forms:
        if not batches:
            got = space.form_reach(mono)
            assert got == _count_points(space, form=mono), mono
            spread += len(got) > 1
            continue
        walked = _count_points(space, track=("B",), form=mono, dominant_batch=True)
        for batch in batches:
            index = space.base["B"].values.index(batch)
            got = _batch_model(space, batch).form_reach(mono)
            assert got == {k[1:]: n for k, n in walked.items() if k[0] == index}, (batch, mono)
            spread += len(got) > 1
    assert spread           # (forms that take several values: not a check of empty dicts)

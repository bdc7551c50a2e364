"""Planning queries: the Pareto front is non-dominated and every point re-evaluates to its time;
the capacity answer is minimal; what-if constraints are honoured by all three backends; top-k
is ordered and distinct; a minimum MFU is honoured."""

from __future__ import annotations


import pytest

from formulations import progress, queries
from formulations.solve import solve
from formulations.space import build_space
from planner.model.errors import InfeasibleError, InputError
from planner.model.evaluate import evaluate
from planner.model.instance import parse_instance

BACKENDS = ("enumerate", "cpsat", "highs")


def doc(**over):
    """A small dense model on 1-4 H100 nodes. The sharding mode is pinned to ZeRO-1 (the
    distributed optimizer), the optimizer kept on the GPU and partial recompute off unless a
    test sets them: these tests are about the queries, and tests/test_solvers.py,
    tests/test_sharding.py, tests/test_offload.py and tests/test_partial_recompute.py cover
    the search over the modes, the offload and the recomputed share."""
    d = {
        "model": {"layers": 8, "hidden": 1024, "heads": 8, "kv_heads": 4, "gated_mlp": True,
                  "vocab": 32000, "seq_len": 2048, "position_embedding": "rope",
                  "tied_embeddings": False},
        "training": {"global_batch": 64, "tokens": 2e9},
        "cluster": {"gpu": "h100-sxm", "nodes": [1, 4], "price_per_gpu_hour": 2.5},
        "constraints": {"max_micro_batch": 4},
    }
    for section, values in over.items():
        d[section] = {**d.get(section, {}), **values}
    if not {"dp_sharding", "distributed_optimizer"} & set(d["constraints"]):
        d["constraints"]["dp_sharding"] = "optim"
    if "optimizer_offload" not in d["constraints"]:
        d["constraints"]["optimizer_offload"] = False
    d["constraints"].setdefault("max_recompute_layers", 0)
    return d


def test_pareto_front_is_non_dominated_and_reproducible():
    inst = parse_instance(doc())
    sizes = []                  # (the sizes it says it is on while it runs: formulations/progress)
    with progress.listen(lambda kind, i, n, *_: kind == "cluster size" and sizes.append((i, n))):
        points = queries.pareto(inst, solver="highs")
    assert [p.nodes for p in points] == [1, 2, 3, 4]
    assert sizes == [(0, 4), (1, 4), (2, 4), (3, 4)]
    feasible = [p for p in points if p.result is not None]
    front = [p for p in feasible if p.on_front]
    assert front, "a front always has a point when some size is feasible"
    for p in front:
        for q in feasible:
            a = (q.gpus, q.result.report.step_time_s, q.result.report.cost)
            b = (p.gpus, p.result.report.step_time_s, p.result.report.cost)
            assert not (all(x <= y for x, y in zip(a, b)) and a != b), "dominated point on front"
    for p in feasible:   # each point re-evaluates to its reported time
        rep = evaluate(inst.with_nodes(p.nodes), p.result.report.plan)
        assert rep.step_time_s == pytest.approx(p.result.report.step_time_s, rel=1e-12)
        assert p.result.status.value == "optimal"
    for p in feasible:   # off the front: another size is at least as fast and as cheap
        if not p.on_front:
            assert any(all(x <= y for x, y in zip(queries.front_key(q), queries.front_key(p)))
                       for q in front)


def _rendered(renderable) -> str:
    """The text a report table or panel prints (wide, so no cell wraps), not shown."""
    import io

    from rich.console import Console

    console = Console(width=400, record=True, file=io.StringIO())
    console.print(renderable)
    return console.export_text()


def _untimed(doc):
    """An answer's JSON (``to_dict``) without the solvers' wall-clock figures (the ``*_s`` keys
    of every ``solver`` object: they differ run to run)."""
    if isinstance(doc, dict):
        return {k: ({x: y for x, y in v.items() if not x.endswith("_s")} if k == "solver"
                    else _untimed(v)) for k, v in doc.items()}
    return [_untimed(x) for x in doc] if isinstance(doc, list) else doc


def test_pareto_in_a_process_pool_gives_the_answer_of_one_process():
    """Sizes solved side by side (formulations/pool.py) give each size's answer, in the
    range's order, as one process does: plans, front marks and, for 7 nodes (56 GPUs, whose
    data-parallel degree divides no split of the batch of 64), the reason and what binds."""
    inst = parse_instance(doc(cluster={"nodes": [6, 8]}))
    # (the enumerator's solves: the pool is what is checked)
    alone = queries.pareto(inst, solver="enumerate", workers=1)
    pooled = queries.pareto(inst, solver="enumerate", workers=2)
    assert [p.nodes for p in pooled] == [6, 7, 8]
    assert pooled[1].result is None and pooled[1].detail
    assert any(p.on_front for p in pooled)
    assert [_untimed(p.to_dict()) for p in pooled] == [_untimed(p.to_dict()) for p in alone]


def test_capacity_answer_is_minimal():
    inst = parse_instance(doc(cluster={"nodes": [1, 8]}))
    # the deadline sits between the 2-node and the 1-node optimum
    one = solve(inst.with_nodes(1)).report.total_days
    two = solve(inst.with_nodes(2)).report.total_days
    assert two < one
    deadline = (one + two) / 2
    sizes = []
    with progress.listen(lambda kind, i, n, *_: kind == "cluster size" and sizes.append((i, n))):
        ans = queries.capacity(inst, deadline)
    assert ans.nodes == 2
    # the sizes it waited for, in order, up to the answer (1 node may be skipped by its bound)
    assert sizes[-1] == (1, 8) and sizes in ([(0, 8), (1, 8)], [(1, 8)])
    assert ans.result.report.total_days <= deadline
    ns = ans.next_smaller   # shown too slow by its proven optimum or by the compute bound
    assert ns["nodes"] == 1 and ns.get("days", ns.get("days_lower_bound")) > deadline
    # a deadline no size meets
    impossible = queries.capacity(inst, queries.days_lower_bound(inst, 8) / 2)
    assert impossible.nodes is None


def test_capacity_in_a_process_pool_gives_the_answer_of_one_process():
    """Sizes solved ahead side by side (formulations/pool.py) and read in increasing order
    give one process's answer: 6 nodes too slow, 7 without a plan (its data-parallel degree
    divides no split of the batch), 8 the answer; the pool's solves of larger sizes are not
    read."""
    inst = parse_instance(doc(cluster={"nodes": [6, 12]}))
    # (the enumerator's solves: the pool is what is checked)
    six, eight = (solve(inst.with_nodes(n), solver="enumerate").report.total_days
                  for n in (6, 8))
    assert eight < six
    deadline = (six + eight) / 2

    def said(ans):
        return (ans.nodes, ans.checked, ans.next_smaller, ans.bound_skipped,
                ans.result.report.plan, ans.result.objective)

    alone = queries.capacity(inst, deadline, solver="enumerate", workers=1)
    pooled = queries.capacity(inst, deadline, solver="enumerate", workers=2)
    assert pooled.nodes == 8 and [c["nodes"] for c in pooled.checked] == [6, 7, 8]
    assert pooled.checked[1]["feasible"] is False and pooled.checked[1]["reason"]
    assert said(pooled) == said(alone)


def test_capacity_says_when_one_node_fewer_has_no_valid_degrees():
    """Three nodes (24 GPUs) of a model with 8 heads, 8 layers split evenly and a batch of 64
    leave no degrees: the 3 fits neither tp, pp nor dp. Capacity says that, not that the plans
    break a limit."""
    inst = parse_instance(doc(constraints={"max_stage_shortfall": 0}))
    two = solve(inst.with_nodes(2)).report.total_days
    four = solve(inst.with_nodes(4)).report.total_days
    assert four < two
    ans = queries.capacity(inst, (two + four) / 2)
    assert ans.nodes == 4
    ns = ans.next_smaller
    assert ns["nodes"] == 3 and ns["feasible"] is False
    # the documented token a script switches on, the solver's sentence beside it
    assert ns["proof"] == queries.NO_PLAN == "no plan fits"
    assert "structural rules on 24 GPUs" in ns["reason"]


def test_capacity_at_the_bottom_of_the_range_says_fewer_may_suffice():
    """A range that starts at a size meeting the deadline, where the compute bound does not
    rule out one node fewer: the answer is the fewest of the range, and the panel says so and
    how to search below it; where the range does reach below, it keeps its plain words."""
    from planner.app.report import capacity_panel

    def shown(answer):
        return _rendered(capacity_panel(answer))

    inst = parse_instance(doc(cluster={"nodes": [2, 4]}))
    ans = queries.capacity(inst, solve(inst.with_nodes(2)).report.total_days * 1.5)
    assert ans.nodes == 2 and ans.next_smaller["proof"] == queries.OUTSIDE_RANGE
    assert ans.next_smaller["days_lower_bound"] <= ans.deadline_days
    text = shown(ans)
    assert "Fewest nodes of the range meeting" in text
    assert "1 node (one fewer) is not among the instance's sizes" in text
    assert "cluster.nodes = [lo, hi]" in text
    # node_counts with a gap below the answer: one fewer is missing, not 'the range's start'
    listed = doc()
    listed["cluster"] = {"gpu": "h100-sxm", "node_counts": [1, 3], "price_per_gpu_hour": 2.5}
    gaps_inst = parse_instance(listed)
    gaps = queries.capacity(gaps_inst, solve(gaps_inst.with_nodes(3)).report.total_days * 1.01)
    assert gaps.nodes == 3 and gaps.next_smaller["proof"] == queries.OUTSIDE_RANGE
    assert "2 nodes (one fewer) is not among" in shown(gaps)
    assert "starts at" not in shown(gaps)
    wide = queries.capacity(parse_instance(doc(cluster={"nodes": [1, 4]})), ans.deadline_days)
    assert wide.nodes == 2 and wide.next_smaller["proof"] == "proven optimum"   # (1 misses)
    assert "of the range" not in shown(wide)


def test_capacity_skips_sizes_by_the_lower_bound():
    # (sizes 1-24: the 15 below the bound are skipped, the 9 from 16 up are solved, by the
    # enumerator: the skipping is the point, and the backends' agreement is tested elsewhere)
    inst = parse_instance(doc(cluster={"nodes": [1, 24]}))
    lb = queries.days_lower_bound(inst, 16)
    ans = queries.capacity(inst, lb * 1.0001, solver="enumerate")
    assert ans.nodes is None or ans.nodes >= 16
    assert all(c["nodes"] >= 16 for c in ans.checked)


def test_cheapest_plan_is_the_cheapest_of_every_larger_size():
    # the larger sizes are asked only for a cheaper plan meeting the deadline (a cap on their
    # objective); the answer must be the one solving each size to its optimum gives. A 4096-wide
    # model with a 73 GiB reserve: one node meets the deadline, two are cheaper (more memory
    # per plan, a faster split)
    inst = parse_instance(doc(cluster={"nodes": [1, 4]}, constraints={"memory_reserve_GiB": 73.0},
                              model={"hidden": 4096, "heads": 32, "kv_heads": 8}))
    deadline = solve(inst.with_nodes(1)).report.total_days * 1.001
    ans = queries.capacity(inst, deadline, budget_usd=1e9)
    assert ans.nodes == 1
    meeting = {}
    for n in range(2, 5):
        try:
            rep = solve(inst.with_nodes(n), explain=False).report
        except InfeasibleError:
            continue
        if rep.total_days <= deadline:
            meeting[n] = rep.cost
    meeting[1] = ans.result.report.cost
    cheapest = min(meeting, key=meeting.get)
    assert cheapest > 1 and ans.cheapest["nodes"] == cheapest
    assert ans.cheapest["cost"] == pytest.approx(meeting[cheapest], rel=1e-6)
    assert ans.cheapest["sizes_checked"] == 3 and ans.cheapest["within_budget"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_size_no_degrees_multiply_to_is_infeasible_before_any_backend(backend, monkeypatch):
    # 7 GPUs on a model of 8 layers and a batch of 64, TP at most 4: no tp * pp * dp = 7 keeps
    # the rules; the count proves it, no backend runs, and what binds is explained
    import formulations.solve as fs

    def never(*args, **kwargs):
        raise AssertionError("a backend ran")
    monkeypatch.setattr(fs, "run_backend", never)
    inst = parse_instance(doc(cluster={"gpus": 7, "nodes": None}, constraints={"max_tp": 4}))
    with pytest.raises(InfeasibleError) as err:
        solve(inst, solver=backend)
    assert err.value.explanation
    with pytest.raises(InputError):           # a solver name is still checked
        solve(inst, solver="no-such-solver")


#: Two bases whose free optimum (enumerator, well under a second) leaves every constraint of
#: the what-if tests below something to bind on:
#: - "big": 32 layers of hidden 8192 (31B parameters) on two H100 nodes: TP2 (inside a
#:   node) PP4 (across the two nodes) DP2, VP8, micro-batch 2, no recompute, sequence
#:   parallelism and the distributed optimizer on, 65.4 of 73.6 GiB;
#: - "spread": 4 layers of hidden 16384 on 16 H100 two per node with tensor parallelism free
#:   to cross nodes: TP2 and PP2, each across nodes (tp_intra = pp_intra = 1).
BASES = {
    "big": {"model": {"layers": 32, "hidden": 8192, "heads": 64, "kv_heads": 8},
            "cluster": {"nodes": 2}},
    "spread": {"model": {"layers": 4, "hidden": 16384, "heads": 128, "kv_heads": 8},
               "cluster": {"nodes": None, "gpus": 16, "gpus_per_node": 2},
               "constraints": {"tp_within_node": False}},
}


def base_doc(base, constraints=None):
    b = BASES[base]
    return doc(model=b["model"], cluster=b["cluster"],
               constraints={**b.get("constraints", {}), **(constraints or {})})


def broken(report, constraints):
    """The keys of ``constraints`` (a [constraints] table) that ``report``'s plan breaks, each
    checked on the plan itself, not through the search's encoding of it."""
    plan, mem = report.plan, report.memory_gib
    holds = {
        "tp": lambda v: plan.tp == v, "max_tp": lambda v: plan.tp <= v,
        "pp": lambda v: plan.pp == v, "max_pp": lambda v: plan.pp <= v,
        "max_dp": lambda v: plan.dp <= v,
        "vp": lambda v: plan.vp == v, "max_vp": lambda v: plan.vp <= v,
        "micro_batch": lambda v: plan.micro_batch == v,
        "min_micro_batch": lambda v: plan.micro_batch >= v,
        "max_micro_batch": lambda v: plan.micro_batch <= v,
        "recompute": lambda v: plan.recompute in ([v] if isinstance(v, str) else v),
        "sequence_parallel": lambda v: plan.sequence_parallel == v,
        "distributed_optimizer": lambda v: plan.distributed_optimizer == v,
        "tp_within_node": lambda v: not v or plan.tp_intra == plan.tp,
        "pp_within_node": lambda v: not v or plan.pp_intra == plan.pp,
        "memory_reserve_GiB": lambda v: mem["total"] <= mem["capacity"] - v,
    }
    return {k for k, v in constraints.items() if not holds[k](v)}


_FREE = {}


def free_optimum(base):
    if base not in _FREE:
        _FREE[base] = solve(parse_instance(base_doc(base)), solver="enumerate")
    return _FREE[base]


#: the [constraints] keys that narrow one base variable's values in the space (its variable
#: and what a value must satisfy)
DOMAIN_KEYS = {
    "tp": ("T", lambda x, v: x == v), "max_tp": ("T", lambda x, v: x <= v),
    "pp": ("P", lambda x, v: x == v), "max_pp": ("P", lambda x, v: x <= v),
    "vp": ("V", lambda x, v: x == v), "max_vp": ("V", lambda x, v: x <= v),
    "micro_batch": ("b", lambda x, v: x == v), "min_micro_batch": ("b", lambda x, v: x >= v),
    "max_micro_batch": ("b", lambda x, v: x <= v),
}


@pytest.mark.parametrize("base, constraints", [
    ("big", {"max_tp": 1}), ("big", {"tp": 4}), ("big", {"pp": 2}), ("big", {"max_pp": 1}),
    ("big", {"micro_batch": 1}), ("big", {"min_micro_batch": 4}),
    ("big", {"max_micro_batch": 1}), ("big", {"recompute": "full"}),
    ("big", {"recompute": ["selective", "full"]}), ("big", {"pp_within_node": True}),
    ("spread", {"tp_within_node": True, "pp_within_node": True}),
    ("big", {"sequence_parallel": False, "distributed_optimizer": False}),
    ("big", {"max_dp": 1}), ("big", {"memory_reserve_GiB": 20.0}), ("big", {"vp": 2}),
    ("big", {"max_vp": 1}),
])
def test_constraints_are_honoured_by_every_backend(base, constraints):
    """Each constraint set binds: the free optimum of its base breaks every key of it, so a
    backend that ignored one would return a plan that breaks it, and the constrained optimum
    is slower (measured: by 0.9% to 30%). Every backend then finds a plan (each set leaves
    one), honours every key, and reaches the enumerator's optimum.

    A pin or cap of a degree or the micro-batch narrows that variable's values in the space
    every backend is handed (checked here): the backends cannot differ on it, so HiGHS, the
    slowest, is asked only where a key reaches the rows or the knob combinations (the
    recompute modes, the sharding knobs, the dp cap on a form, placement, memory)."""
    free = free_optimum(base)
    assert broken(free.report, constraints) == set(constraints), (free.report.plan, constraints)
    inst = parse_instance(base_doc(base, constraints))
    backends = BACKENDS
    if set(constraints) <= set(DOMAIN_KEYS):
        space = build_space(inst)
        for key, value in constraints.items():
            var, holds = DOMAIN_KEYS[key]
            assert all(holds(x, value) for x in space.base[var].values), (key, space.base[var])
        backends = ("enumerate", "cpsat")
    results = {backend: solve(inst, solver=backend) for backend in backends}
    ref = results["enumerate"]
    assert ref.objective > free.objective * (1 + 1e-9)   # binding: it costs time
    for backend, res in results.items():
        plan = res.report.plan
        assert broken(res.report, constraints) == set(), (backend, plan)
        c = inst.spec.constraints                           # and the doc's own constraints
        assert c.min_micro_batch <= plan.micro_batch <= c.max_micro_batch
        assert plan.recompute in c.recompute_modes
        assert c.distributed_optimizer is not None or plan.dp_sharding == "optim"
        assert res.report.fits
        assert res.objective == pytest.approx(ref.objective, rel=1e-6,
                                              abs=(res.quantum_s or 0) * 200), backend


def test_compare_names_the_binding_constraint():
    """max_tp = 1 and max_vp = 1 each bind on their own on the "big" base (its free optimum is
    TP2 VP8; lifting either alone speeds the optimum up), max_dp = 16 cannot bind on 16 GPUs:
    --compare reports a slowdown and names exactly the two that bind."""
    caps = {"max_tp": 1, "max_vp": 1, "max_dp": 16}
    inst = parse_instance(base_doc("big", caps))
    awaited = []                # (the solves it says it waits for: the baseline, the constrained
    with progress.listen(       # optimum, one per what-if key set; formulations/progress.py)
            lambda kind, i, n, *_: kind == "comparison solve" and awaited.append((i, n))):
        cmp = queries.compare(inst)
    n = awaited[0][1]           # (and every key the instance sets apart from its default)
    assert n >= 2 + len(caps) and awaited == [(i, n) for i in range(n)]
    free = solve(inst.with_spec(constraints=inst.spec.constraints.model_copy(
        update=dict.fromkeys(caps))))
    assert broken(free.report, caps) == {"max_tp", "max_vp"}
    assert cmp.unconstrained.report.step_time_s == pytest.approx(free.report.step_time_s)
    assert broken(cmp.constrained.report, caps) == set()
    assert cmp.slowdown > 0.01
    assert cmp.slowdown == pytest.approx(
        cmp.constrained.report.step_time_s / free.report.step_time_s - 1, rel=1e-9)
    assert {b["constraint"] for b in cmp.binding} == {"max_tp", "max_vp"}
    for b in cmp.binding:
        assert b["value"] == caps[b["constraint"]] and b["lifted_to"] is None
        assert 0 < b["speedup_if_lifted"] <= cmp.slowdown * (1 + 1e-9)


def test_compare_in_a_process_pool_and_from_a_given_solve_gives_one_process_answer():
    """--compare's solves side by side (formulations/pool.py), and its constrained optimum
    taken from the caller's own solve instead of solved again: the same comparison, the
    solver clocks aside."""
    inst = parse_instance(base_doc("big", {"max_tp": 1, "max_vp": 1, "max_dp": 16}))

    # (the enumerator: how the solves are run and read is the question, not the backend)
    alone = _untimed(queries.compare(inst, solver="enumerate", workers=1).to_dict())
    assert alone["binding"]
    assert _untimed(queries.compare(inst, solver="enumerate", workers=2).to_dict()) == alone
    given = solve(inst, solver="enumerate")
    assert _untimed(queries.compare(inst, solver="enumerate", constrained=given,
                                    workers=2).to_dict()) == alone


@pytest.mark.parametrize("backend", ["cpsat", "highs"])
def test_compare_capped_at_the_given_constrained_optimum_gives_the_uncapped_answer(backend):
    """Given the constrained optimum (``plan solve --compare``), the baseline and the lifted
    solves are capped at its tie window, since its plan lies in their spaces: each MIP gives
    the same baseline plan, slowdown and binding constraints as the uncapped solves (the
    enumerator's, the oracle: the MIPs' own uncapped compare cost 10 s of the suite). On one
    node the three caps each bind (lifted alone, each gives a faster plan)."""
    inst = parse_instance(doc(cluster={"nodes": 1},
                              constraints={"max_tp": 1, "max_vp": 1, "max_dp": 4}))
    uncapped = queries.compare(inst, solver="enumerate")
    assert {b["constraint"] for b in uncapped.binding} == {"max_tp", "max_vp", "max_dp"}
    capped = queries.compare(inst, solver=backend, constrained=solve(inst, solver=backend))
    assert capped.unconstrained.report.plan == uncapped.unconstrained.report.plan
    assert capped.slowdown == pytest.approx(uncapped.slowdown, rel=1e-9, abs=1e-12)
    assert [b["constraint"] for b in capped.binding] == [b["constraint"] for b in uncapped.binding]
    assert [b["step_time_without_s"] for b in capped.binding] == \
        pytest.approx([b["step_time_without_s"] for b in uncapped.binding])
    assert capped.proven and uncapped.proven


def test_a_baseline_with_no_plan_under_the_cap_is_solved_again_without_it():
    """A given constrained plan outside the baseline's space (a recompute_layers pin on a
    count the search does not try) can be faster than any plan there: the capped baseline has
    none, and is solved again uncapped; no lifted solve then shows a constraint binding.
    Here a constrained result claiming half the true optimum stands in for such a plan."""
    from dataclasses import replace

    inst = parse_instance(base_doc("big", {"max_tp": 1, "max_vp": 1, "max_dp": 16}))
    en = "enumerate"        # (the fallback is the query's, whichever backend: the cheapest)
    true = solve(inst, solver=en)
    cmp = queries.compare(inst, solver=en, constrained=replace(true, objective=true.objective / 2))
    free = solve(inst.with_spec(constraints=queries.unconstrained_spec(inst.spec.constraints)),
                 solver=en)
    assert cmp.unconstrained.report.plan == free.report.plan
    assert cmp.binding == [] and cmp.undecided == []


def test_a_capped_lifted_solve_stopped_without_a_plan_leaves_its_constraint_undecided(
        monkeypatch):
    """Capped at the constrained optimum, a lifted solve stopped at the time limit without a
    plan found nothing faster and ruled nothing out: its constraint is undecided (it may
    bind), not a solver failure as an uncapped solve without a plan is."""
    from dataclasses import replace

    from formulations.result import Status

    inst = parse_instance(base_doc("big", {"max_tp": 1, "max_vp": 1, "max_dp": 16}))
    given = solve(inst, solver="enumerate")     # (the query's rule, whichever backend)

    def stopped_without_tp_cap(inst_, *args, **kwargs):
        res = solve(inst_, *args, **kwargs)
        if inst_.spec.constraints.max_tp is None and inst_.spec.constraints.max_vp == 1:
            return replace(res, status=Status.NO_SOLUTION_IN_LIMIT, report=None)
        return res

    monkeypatch.setattr(queries, "solve", stopped_without_tp_cap)
    cmp = queries.compare(inst, solver="enumerate", constrained=given, time_limit=30)
    assert not cmp.proven
    assert cmp.undecided == [{"constraint": "max_tp", "value": 1, "lifted_to": None,
                              "step_time_without_s": None, "status": "no_solution_in_limit"}]
    assert [b["constraint"] for b in cmp.binding] == ["max_vp"] and cmp.binding[0]["proven"]


def _stopped_with(monkeypatch, plans: list) -> None:
    """``queries.solve`` as it is, except that an instance with the ``[constraints]`` of the
    first of a pair in ``plans`` gets a solve stopped at the time limit with a plan: the
    optimum of the pair's second instance, marked ``feasible`` (no bound), as CP-SAT returns
    its incumbent at ``--time-limit`` (timing-free, unlike a tiny time limit)."""
    from dataclasses import replace

    from formulations.result import Status

    def key(inst):
        return tuple(sorted((k, v) for k, v in inst.spec.constraints.model_dump().items()))

    stopped = {key(asked): given for asked, given in plans}

    def stopping_solve(inst, *args, **kwargs):
        if key(inst) not in stopped:
            return solve(inst, *args, **kwargs)
        found = solve(stopped[key(inst)], *args, **kwargs)
        return replace(found, status=Status.FEASIBLE, bound=None)

    monkeypatch.setattr(queries, "solve", stopping_solve)


def test_compare_read_from_solves_stopped_at_the_time_limit_is_not_proven(monkeypatch):
    """Under --time-limit a solve may stop with the best plan it has, not its optimum.
    --compare then says its comparison is not proven: here the unconstrained solve stops with
    the constrained optimum (a plan of its space, slower than its optimum), the max_tp-lifted
    one with a plan no faster than the constrained optimum (whether max_tp binds is open:
    ``undecided``, not silently "does not bind"), and the max_vp-lifted one with its optimum,
    unproven (max_vp binds, as a faster plan shows, but the figure is not proven)."""
    caps = {"max_tp": 1, "max_vp": 1, "max_dp": 16}
    inst = parse_instance(base_doc("big", caps))
    # (the enumerator's solves: what is read from them is the query's, whichever backend)
    exact = queries.compare(inst, solver="enumerate")
    assert exact.proven and exact.undecided == []
    assert {b["constraint"] for b in exact.binding} == {"max_tp", "max_vp"}
    assert all(b["proven"] for b in exact.binding)
    c = inst.spec.constraints

    def lifted(**update):
        return inst.with_spec(constraints=c.model_copy(update=update))

    free = inst.with_spec(constraints=queries.unconstrained_spec(c))
    no_tp, no_vp = lifted(max_tp=None), lifted(max_vp=None)
    _stopped_with(monkeypatch, [(free, inst), (no_tp, inst), (no_vp, no_vp)])
    cmp = queries.compare(inst, solver="enumerate")
    assert not cmp.proven
    assert cmp.unconstrained.status.value == "feasible"
    assert cmp.slowdown == pytest.approx(0.0, abs=1e-12)        # the plans it compares
    assert [b["constraint"] for b in cmp.binding] == ["max_vp"]
    assert cmp.binding[0]["proven"] is False
    assert [(u["constraint"], u["status"]) for u in cmp.undecided] == [("max_tp", "feasible")]
    doc_ = cmp.to_dict()
    assert doc_["proven"] is False and doc_["undecided"][0]["lifted_to"] is None

    from planner.app.report import compare_table

    text = _rendered(compare_table(cmp))
    assert "(feasible, not proven)" in text and "undecided: max_tp = 1" in text
    assert "not proven:" in text and "raise --time-limit" in text
    assert "no single constraint binds" not in text


@pytest.mark.parametrize("backend", BACKENDS)
def test_top_k_is_ordered_and_distinct(backend):
    inst = parse_instance(doc(cluster={"nodes": 1}))
    ranked = queries.top_k(inst, 4, solver=backend)
    assert len(ranked) == 4
    objs = [r.objective for r in ranked]
    # (equal times, e.g. ZeRO-1 and ZeRO-2 reduced once per step, may differ in the last bits)
    assert all(a <= b * (1 + 1e-12) for a, b in zip(objs, objs[1:])), objs
    keys = {(tuple(sorted(r.choice.items())), r.knobs) for r in ranked}
    assert len(keys) == 4


def test_top_k_agrees_across_backends():
    inst = parse_instance(doc(cluster={"nodes": 1}))
    lists = {b: [r.objective for r in queries.top_k(inst, 3, solver=b)] for b in BACKENDS}
    for b in ("cpsat", "highs"):
        assert lists[b] == pytest.approx(lists["enumerate"], rel=1e-6, abs=1e-6)


def test_top_k_with_a_batch_range_agrees_across_backends():
    """With a global-batch range the MIPs solve one model per batch; excluded plans go to the
    model of their batch, and the list is the enumerator's."""
    inst = parse_instance(doc(cluster={"nodes": 1}, training={"global_batch": [64, 512]}))
    lists = {b: [r.objective for r in queries.top_k(inst, 4, solver=b)] for b in BACKENDS}
    assert len(lists["enumerate"]) == 4
    for b in ("cpsat", "highs"):
        assert lists[b] == pytest.approx(lists["enumerate"], rel=1e-6, abs=1e-9)


def test_minimum_mfu_is_honoured_or_explained():
    inst = parse_instance(doc(cluster={"nodes": 1}))
    best = solve(inst).report.mfu
    ok = solve(parse_instance(doc(cluster={"nodes": 1}, constraints={"min_mfu": best * 0.99})))
    assert ok.report.mfu >= best * 0.99
    with pytest.raises(InfeasibleError) as info:
        solve(parse_instance(doc(cluster={"nodes": 1},
                                 constraints={"min_mfu": min(0.99, best * 1.05)})))
    assert "min_mfu" in str(info.value)


def _stopping(monkeypatch, at: set[int]) -> None:
    """``queries.solve`` as it is, except that its calls numbered in ``at`` (from 1) return what
    a solver stopped at the time limit without a plan returns (timing-free, unlike a tiny
    ``time_limit``)."""
    from dataclasses import replace

    from formulations.result import Status

    calls = []

    def stopping_solve(*args, **kwargs):
        calls.append(None)
        res = solve(*args, **kwargs)
        if len(calls) in at:
            return replace(res, status=Status.NO_SOLUTION_IN_LIMIT, report=None, note="")
        return res

    monkeypatch.setattr(queries, "solve", stopping_solve)


@pytest.mark.parametrize("stopped, what", [(1, "without the [constraints] what-ifs"),
                                           (2, "under the [constraints]"),
                                           (3, "with constraints.max_tp lifted")])
def test_compare_without_a_plan_from_a_solve_says_to_raise_the_time_limit(
        monkeypatch, stopped, what):
    """Each of compare's solves (the unconstrained optimum, the constrained one, one per
    lifted constraint) that stops without a plan is a solver stop (exit 4) naming which one,
    not an AttributeError on the missing report."""
    from planner.model.errors import SolverError

    inst = parse_instance(doc(cluster={"nodes": 1}, constraints={"max_tp": 1, "max_pp": 1}))
    _stopping(monkeypatch, {stopped})
    with pytest.raises(SolverError, match="raise --time-limit") as exc:
        queries.compare(inst, time_limit=5)
    assert what in str(exc.value) and "(it was 5 s)" in str(exc.value)


def test_top_k_without_a_first_plan_returns_the_stopped_result(monkeypatch):
    inst = parse_instance(doc(cluster={"nodes": 1}))
    _stopping(monkeypatch, {1})
    ranked = queries.top_k(inst, 3, time_limit=5)
    assert len(ranked) == 1 and ranked[0].report is None
    assert ranked[0].status.value == "no_solution_in_limit"


def test_top_k_says_why_a_later_solve_ended_the_list(monkeypatch):
    inst = parse_instance(doc(cluster={"nodes": 1}))
    _stopping(monkeypatch, {3})
    ranked = queries.top_k(inst, 5, time_limit=5)
    assert len(ranked) == 2 and all(r.report is not None for r in ranked)
    assert "plan 3" in ranked.ended and "raise --time-limit (it was 5 s)" in ranked.ended


def test_a_top_list_with_a_solve_stopped_at_the_time_limit_says_it_is_not_proven(monkeypatch):
    """--top K under --time-limit: a solve that stops with a plan (``feasible``) leaves the
    list in the order solved, not proven best (a later plan may be faster). The table's title
    and a status column say so, and the JSON's ``top_proven``; a proven list says it is."""
    import json
    from dataclasses import replace
    from pathlib import Path

    from typer.testing import CliRunner

    from formulations.result import Status
    from planner.app.cli import app
    from planner.app.report import top_table

    def table_text(ranked) -> str:
        return _rendered(top_table(ranked))

    inst = parse_instance(doc(cluster={"nodes": 1}))
    # (the enumerator's solves: the list's wording is the query's, whichever backend)
    proven = queries.top_k(inst, 3, solver="enumerate")
    assert "each proven optimal" in table_text(proven) and "feasible" not in table_text(proven)

    def first_stopped(*args, **kwargs):       # the first solve stops with its plan, unproven
        res = solve(*args, **kwargs)
        calls.append(None)
        return replace(res, status=Status.FEASIBLE, bound=None) if len(calls) == 1 else res

    calls: list = []
    monkeypatch.setattr(queries, "solve", first_stopped)
    ranked = queries.top_k(inst, 3, solver="enumerate", time_limit=5)
    text = table_text(ranked)
    assert "not proven best" in text and "each proven optimal" not in text
    assert text.count("feasible") == 1 and text.count("optimal") == 2    # the status column

    calls.clear()
    path = Path(__file__).resolve().parents[1] / "instances" / "gpt-1.3b-1node.toml"
    r = CliRunner().invoke(app, ["solve", str(path), "--top", "3", "--time-limit", "5",
                                 "--solver", "enumerate", "--json"])
    assert r.exit_code == 0, r.stdout
    out = json.loads(r.stdout)
    assert out["top_proven"] is False
    assert [t["solver"]["status"] for t in out["top"]] == ["feasible", "optimal", "optimal"]


def test_top_k_says_when_the_space_has_fewer_plans_than_asked():
    inst = parse_instance(doc(cluster={"nodes": 1}, constraints={
        "max_tp": 1, "max_pp": 1, "recompute": ["none"], "micro_batch": 1}))
    ranked = queries.top_k(inst, 50)
    assert 0 < len(ranked) < 50 and f"only {len(ranked)} distinct plan" in ranked.ended
    assert not queries.top_k(inst, 1).ended


@pytest.mark.parametrize("gpu, seq", [("b200", 32768), ("gb200", 16384), ("h100-sxm", 32768),
                                      ("a100-80gb", 2048)])
def test_the_capacity_bound_stays_below_the_proven_optimum(gpu, seq):
    """The bound that lets capacity skip sizes must never exceed an optimum: on Blackwell the
    fused attention core runs at 0.87 of the peak, above the 0.52 GEMM asymptote, and a bound
    counting attention at the GEMM rate put 1 B200 node at 'at least 0.67 days' where its
    proven optimum is 0.61 (an audit's brute force), so capacity answered 2 nodes."""
    inst = parse_instance({"model": {"preset": "gpt-1.3b", "seq_len": seq},
                           "training": {"global_batch": 64, "tokens": 2e10},
                           "cluster": {"gpu": gpu, "nodes": [1, 2],
                                       "price_per_gpu_hour": 5.0}})
    for n in (1, 2):
        best = solve(inst.with_nodes(n), solver="enumerate", explain=False).report
        assert queries.days_lower_bound(inst, n) <= best.total_days
    if gpu == "b200":
        one = solve(inst.with_nodes(1), solver="enumerate", explain=False).report.total_days
        ans = queries.capacity(inst, one * 1.01, solver="enumerate")
        assert ans.nodes == 1


# ---- the pareto / capacity audit -------------------------------------------------------------

def _on_gpus(gpus: int, **over):
    """:func:`doc` on a fixed ``cluster.gpus`` instead of a node range."""
    d = doc(**over)
    d["cluster"] = {"gpu": "h100-sxm", "gpus": gpus, "price_per_gpu_hour": 2.5}
    return parse_instance(d)


def test_a_gpu_count_below_one_host_is_answered_for_its_own_gpus():
    """``cluster.gpus = 4`` on 8-GPU hosts is one partial node of 4 GPUs (as solve answers);
    pareto and capacity answered for a whole host of 8, and capacity called a deadline met
    that the 4 GPUs miss."""
    inst = _on_gpus(4)
    own = solve(inst).report
    assert own.plan.gpus == 4
    whole = solve(inst.with_nodes(1)).report          # the host the queries used to fill
    assert whole.plan.gpus == 8 and whole.total_days < own.total_days
    [point] = queries.pareto(inst)
    assert point.gpus == 4
    assert point.result.report.total_days == pytest.approx(own.total_days, rel=1e-9)
    between = (own.total_days + whole.total_days) / 2
    missed = queries.capacity(inst, between)
    assert missed.nodes is None and missed.partial_gpus == 4
    assert missed.fastest["days"] == pytest.approx(own.total_days, rel=1e-9)
    assert "4 GPUs" in missed.miss_reason()
    met = queries.capacity(inst, own.total_days * 1.01)
    assert met.result.report.plan.gpus == 4 and met.next_smaller is None
    # the compute lower bound is the 4 GPUs' own, and still below their optimum
    assert queries.days_lower_bound(inst, 1) > queries.days_lower_bound(inst.with_nodes(1), 1)
    assert queries.days_lower_bound(inst, 1) <= own.total_days


def test_capacity_without_an_answer_names_the_fastest_size_solved():
    """Sizes 2-3, where 3 has no degrees: the answer used to name only the largest size, and
    nothing when that size has no plan; the fastest size solved is the best the range does."""
    inst = parse_instance(doc(cluster={"nodes": [2, 3]}, constraints={"max_stage_shortfall": 0}))
    two = solve(inst.with_nodes(2)).report.total_days
    ans = queries.capacity(inst, two * 0.9)
    assert ans.nodes is None and [c["nodes"] for c in ans.checked] == [2, 3]
    assert ans.next_smaller["nodes"] == 3 and ans.next_smaller["proof"] == queries.NO_PLAN
    assert ans.fastest["nodes"] == 2
    assert ans.fastest["days"] == pytest.approx(two, rel=1e-9)
    assert ans.fastest["proof"] == "proven optimum"
    assert ans.to_dict()["fastest"] == ans.fastest
    why = ans.miss_reason()
    assert "the fastest found, 2 nodes" in why
    assert float(why.split("needs ")[1].split(" days")[0]) == pytest.approx(two, rel=1e-3)


@pytest.mark.parametrize("model, over, says, binds", [
    ({"hidden": 4096, "heads": 32, "kv_heads": 8}, {"memory_reserve_GiB": 79.0}, "GPU memory",
     "memory:"),
    ({}, {"tp": 3}, "the constraints leave no plan", "constraints.tp = 3"),
])
def test_capacity_without_any_plan_says_why_not_the_deadline(model, over, says, binds):
    """No size has a plan: the deadline is not the reason, and 'no plan satisfies the limits'
    (the solver's sentence without an explanation) did not say which limit."""
    inst = parse_instance(doc(cluster={"nodes": [1, 2]}, model=model, constraints=over))
    ans = queries.capacity(inst, 1e6)
    assert ans.nodes is None and ans.none_has_a_plan and ans.fastest is None
    for c in ans.checked:
        assert says in c["reason"] and "no plan satisfies the limits" not in c["reason"]
        assert any(binds in line for line in c["detail"])
    assert ans.next_smaller["proof"] == queries.NO_PLAN and says in ans.next_smaller["reason"]
    why = ans.miss_reason()
    assert why.startswith("no size in the range has a plan") and says in why
    assert "meets" not in why


def test_capacity_decides_a_size_by_its_optimum_not_the_tie_broken_plan(monkeypatch):
    """The tie-break goals may choose a plan up to 0.01% slower than the proven optimum
    (formulations/ties.py). A deadline between the two: the size meets it (the optimum's plan
    does), where capacity called it a miss and answered a larger size."""
    from dataclasses import replace

    slower = 5e-5

    def tie_broken(inst, **kwargs):
        res = solve(inst, **kwargs)
        if kwargs.get("max_objective") is not None or res.report is None:
            return res
        rep = replace(res.report, total_days=res.report.total_days * (1 + slower))
        return replace(res, report=rep, objective=res.objective * (1 + slower),
                       bound=res.objective)

    inst = parse_instance(doc(cluster={"nodes": [1, 2]}))
    best = solve(inst.with_nodes(1)).report.total_days
    monkeypatch.setattr(queries, "solve", tie_broken)
    ans = queries.capacity(inst, best * (1 + slower / 2))
    assert ans.nodes == 1
    assert ans.result.report.total_days <= ans.deadline_days


def test_an_unknown_solver_is_bad_input_even_when_nothing_is_solved():
    inst = parse_instance(doc())
    tiny = queries.days_lower_bound(inst, 4) / 2          # every size out by the bound
    assert queries.capacity(inst, tiny).checked == []
    with pytest.raises(InputError, match="--solver: unknown solver"):
        queries.capacity(inst, tiny, solver="foo")
    no_degrees = parse_instance(doc(constraints={"tp": 3}))  # infeasible before any backend
    with pytest.raises(InputError, match="--solver: unknown solver"):
        queries.pareto(no_degrees, solver="foo")


def test_the_cheapest_says_which_capped_solves_stopped_at_the_time_limit(monkeypatch):
    """A larger size whose capped solve stopped at the time limit was skipped silently: the
    cheapest plan and ``within_budget`` then rest on a size nobody looked at."""
    from dataclasses import replace

    from formulations.result import Status

    def capped_stop(inst, **kwargs):
        if kwargs.get("max_objective") is None:
            return solve(inst, **kwargs)
        res = solve(inst, **dict(kwargs, max_objective=None))
        return replace(res, status=Status.NO_SOLUTION_IN_LIMIT, report=None)

    inst = parse_instance(doc(cluster={"nodes": [1, 3]}))
    deadline = solve(inst.with_nodes(1)).report.total_days * 1.001
    monkeypatch.setattr(queries, "solve", capped_stop)
    ans = queries.capacity(inst, deadline, budget_usd=1e9)
    assert ans.nodes == 1 and ans.cheapest["unproven"] == [2, 3]


def test_days_read_back_on_the_deadline_s_side():
    """Days printed to one decimal read "0.0 days" (0.00724 against a 0.005-day deadline) and
    "30.0" for 29.97 against 30: the printed value must read back on the same side of the
    deadline as the value, and close to it."""
    cases = [(0.00724, 0.005), (0.0231, 0.001), (29.97, 30.0), (30.04, 30.0), (39.2, 30.0),
             (0.6104, 0.61), (0.6096, 0.61), (1234.5, 1234.0), (5.5, 4.0), (2.0000001, 2.0)]
    for days, deadline in cases:
        shown = float(queries.days_text(days, deadline).replace(",", ""))
        assert (shown > deadline) == (days > deadline), (days, deadline, shown)
        assert shown != deadline or days == deadline, (days, deadline, shown)  # (not "30.0")
        assert shown == pytest.approx(days, rel=0.01)
    for days in (0.00724, 0.0231, 0.3, 7.25, 158.8):
        assert float(queries.days_text(days)) == pytest.approx(days, rel=0.01)

"""An oracle for the search that does not go through its search space.

Every backend (CP-SAT, HiGHS and the enumerator) walks the space :mod:`formulations.space`
builds: its domains, its layout pairs and its dominance pruning (sequence parallelism forced
on, plain data parallelism and ZeRO-2 left out where another plan dominates them). A wrong
domain or prune there makes all three agree on a wrong optimum, which the three-backend
agreement tests (tests/test_solvers.py) cannot see. This module finds the optimum of a few
small instances another way: explicit loops over every knob the search decides, each plan built
through the public path of ``plan evaluate`` (:class:`~planner.model.schema.PlanSpec`,
:func:`~planner.model.plan.plan_from_spec`) and scored by
:func:`~planner.model.evaluate.evaluate`; a plan the evaluator refuses (``InputError`` /
``ValueError``) or reports violations for is not a plan. ``solve`` must return that minimum,
and a plan the loops find faster than ``solve``'s fails the test. So must, with each knob
pinned in ``[constraints]`` at each value some accepted plan has, the best plan of that value:
a value a domain lost, or a prune that drops the best plan of a value, shows there even where
it is not the free optimum. The instances are chosen so that the plans near the optimum use
tensor, pipeline (interleaved), context or expert parallelism, and so that memory binds in
one of them (the test asserts both, so that they stay exercised).

The loops (they read nothing of formulations/):

- ``tp``, ``pp``, ``cp`` over the divisors of the GPU count (``cp`` up to ``max_cp``), ``dp``
  the rest of the GPUs;
- ``vp`` from 1 up wherever ``pp * vp`` divides the layers (the even layout: each virtual
  stage holds whole layers) and, above 1, only with ``pp > 1`` (interleaving splits pipeline
  stages); the micro-batch from 1 to ``max_micro_batch`` wherever ``dp * micro_batch``
  divides the global batch: the arithmetic a plan needs to exist at all, checked here only
  to keep the loops small;
- each degree's factor inside a node (``tp_intra``, ``cp_intra``, ``pp_intra``, ``ep_intra``
  over their divisors, ``dp_intra`` the rest of the node);
- ``recompute`` none / selective / full, ``sequence_parallel`` on / off (one plan at
  ``tp = 1``, where it runs off whichever is asked), ``dp_sharding`` over the four modes and,
  for a sharded mode, ``dp_shard_size`` over the divisors of ``dp`` (the HSDP replica count,
  which the search also decides);
- ``ep`` over the divisors of the GPU count for the MoE instance.

Every other rule (heads over tp, the node placements, the interleaving micro-batch count,
HSDP's replicas across nodes, the caps, memory) is the evaluator's: a plan breaking a
structural rule is dropped by :func:`~planner.model.plan.structural_violations` before the
terms are costed (the same check :func:`evaluate` starts with), the others by ``evaluate``.

What the loops do not cover is constrained away in every instance (``FIXED``): no partial
recompute (``max_recompute_layers = 0``), no host offload (``optimizer_offload = false``,
``max_offload_layers = 0``), even pipeline layouts only (``max_stage_shortfall = 0``: no
short first / last stage, no embedding / loss counted as a layer). The defaults that steer the
search but judge a fixed plan only where an instance writes them (``max_micro_batch``,
``max_cp``, ``tp_within_node``) are written out (``WRITTEN``), so that the evaluator holds the
loops' plans to them. The overlap switches and FSDP's reshard policy are no choice of
the search (the framework's defaults); ``plan_from_spec`` applies the same defaults.

The rule table itself (planner/model/rules.py) and the cost model are shared with the search:
this oracle checks the search against the model, not the model against the world.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import pytest

from formulations.result import Status
from formulations.solve import solve
from formulations.ties import MEMORY_TOLERANCE_BYTES, objective_cap
from planner.model.catalog import GiB
from planner.model.errors import InputError
from planner.model.evaluate import evaluate
from planner.model.instance import parse_instance
from planner.model.plan import Plan, plan_from_spec, structural_violations
from planner.model.schema import PlanSpec

RECOMPUTE = ("none", "selective", "full")
SHARDING = ("none", "optim", "optim_grads", "optim_grads_params")

#: the knobs the loops do not walk, constrained away in every instance
FIXED = {"max_recompute_layers": 0, "optimizer_offload": False, "max_offload_layers": 0,
         "max_stage_shortfall": 0}


#: defaults that steer the search but judge a fixed plan only where the instance writes them
#: (planner/model/plan.py degree_pin_violations, rules.py ``judges``): written out, so that the
#: evaluator holds the loops' plans to them too
WRITTEN = {"max_cp": 1, "max_micro_batch": 32, "tp_within_node": True}


def _doc(model: dict, training: dict, cluster: dict, **constraints) -> dict:
    return {"model": model, "training": training, "cluster": cluster,
            "constraints": {**FIXED, **WRITTEN, **constraints}}


#: name -> (instance, what the plans near its optimum must show: the case is exercised)
INSTANCES = {
    # a dense GQA model with a gated MLP on two nodes of four: tensor x interleaved pipeline
    "dense_gqa": (_doc({"layers": 8, "hidden": 4096, "heads": 32, "kv_heads": 8,
                        "gated_mlp": True, "vocab": 32000, "seq_len": 2048},
                       {"global_batch": 16},
                       {"gpu": "a100-80gb", "gpus": 8, "gpus_per_node": 4},
                       max_micro_batch=4, memory_reserve_GiB=60.0),
                  lambda p: p.tp > 1 and p.pp > 1 and p.vp > 1),
    # 32K tokens on a batch of 4 sequences over 8 GPUs, context parallelism allowed up to 4
    "context_parallel": (_doc({"layers": 4, "hidden": 2048, "heads": 16, "kv_heads": 4,
                               "gated_mlp": True, "vocab": 32000, "seq_len": 32768},
                              {"global_batch": 4},
                              {"gpu": "h100-sxm", "gpus": 8, "gpus_per_node": 4},
                              max_micro_batch=2, max_cp=4, memory_reserve_GiB=20.0),
                         lambda p: p.cp > 1),
    # a mixture of experts (8 experts, top 2) on one node: expert and tensor parallelism
    "moe": (_doc({"layers": 4, "hidden": 2048, "heads": 16, "kv_heads": 4, "gated_mlp": True,
                  "vocab": 32000, "seq_len": 4096, "experts": 8, "top_k": 2,
                  "moe_ffn_hidden": 2048},
                 {"global_batch": 4}, {"gpu": "h100-sxm", "gpus": 8}, max_micro_batch=2,
                 memory_reserve_GiB=40.0),
            lambda p: p.ep > 1 and p.tp > 1),
    # memory binds: 5.2 GiB left of an A100 40GB, and without flash attention selective
    # recompute pays; tensor parallelism is free to span the two nodes, where sequence
    # parallelism is searched both ways (the best plan at dp_shard_size = 4 runs without it)
    "memory_bound": (_doc({"layers": 4, "hidden": 4096, "heads": 32, "vocab": 32000,
                           "seq_len": 2048, "tied_embeddings": False},
                          {"global_batch": 16, "flash_attention": False},
                          {"gpu": "a100-40gb", "gpus": 8, "gpus_per_node": 4},
                          max_micro_batch=2, memory_reserve_GiB=34.8, tp_within_node=False),
                     lambda p: p.recompute == "selective"),
}


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@dataclass(frozen=True)
class Walked:
    """A plan the evaluator accepts: its step time, memory per GPU (GiB, the most loaded
    stage), the plan, and the values the loops asked for (``[constraints]`` keys: at tp = 1
    the plan runs without sequence parallelism whichever was asked, and holds both)."""

    step: float
    memory: float
    plan: Plan
    asked: dict


@dataclass
class Found:
    """Every plan without violations, fastest first, and the step time of the fastest plan
    whose only violation is memory (None: no such plan)."""

    plans: list[Walked]
    over_memory: float | None

    @property
    def best(self) -> float:
        return self.plans[0].step

    def ties(self, z: float) -> list[Walked]:
        return [w for w in self.plans if w.step <= objective_cap(z)]


def brute_force(doc: dict) -> Found:
    inst = parse_instance(doc)
    c, m = doc["constraints"], doc["model"]
    gpus, node = inst.gpus, inst.node_size
    batch, layers = doc["training"]["global_batch"], m["layers"]
    eps = divisors(gpus) if m.get("experts") else [1]
    plans, over_memory = [], None
    for tp, pp, cp in itertools.product(divisors(gpus), divisors(gpus), range(1, c["max_cp"] + 1)):
        if gpus % (tp * pp * cp):
            continue
        dp = gpus // (tp * pp * cp)
        vps = [v for v in range(1, layers + 1) if layers % (pp * v) == 0 and (v == 1 or pp > 1)]
        mbs = [b for b in range(1, c["max_micro_batch"] + 1) if batch % (dp * b) == 0]
        sps = ((True, False),) if tp == 1 else ((True,), (False,))
        for vp, mb, ep in itertools.product(vps, mbs, eps):
            for ti, ci, pi, ei in itertools.product(divisors(tp), divisors(cp), divisors(pp),
                                                    divisors(ep)):
                if node % (ti * ci * pi) or dp % (node // (ti * ci * pi)):
                    continue
                intra = dict(tp_intra=ti, cp_intra=ci, pp_intra=pi, ep_intra=ei,
                             dp_intra=node // (ti * ci * pi))
                for rec, sp, mode in itertools.product(RECOMPUTE, sps, SHARDING):
                    for shard in (divisors(dp) if mode != "none" else [None]):
                        asked = dict(tp=tp, pp=pp, cp=cp, vp=vp, micro_batch=mb, ep=ep,
                                     recompute=rec, sequence_parallel=sp, dp_sharding=mode,
                                     dp_shard_size=shard)
                        try:
                            spec = PlanSpec(**{**asked, "sequence_parallel": sp[0]}, dp=dp,
                                            **intra)
                            plan = plan_from_spec(inst, spec)
                            if structural_violations(inst, plan, spec):
                                continue
                            report = evaluate(inst, plan, spec=spec)
                        except (InputError, ValueError):
                            continue
                        step = report.step_time_s
                        if not report.violations:
                            plans.append(Walked(step, report.memory_gib["total"], plan, asked))
                        elif all(v.startswith("memory:") for v in report.violations):
                            over_memory = min(step, over_memory or step)
    plans.sort(key=lambda w: w.step)
    return Found(plans, over_memory)


def tolerance(res, z: float) -> float:
    """CP-SAT's rounding (tests/test_solvers.py's ``tolerance``) plus 1e-9 of the optimum."""
    return (res.quantum_s or 0.0) * 200 + 1e-9 * abs(z)


#: the ``[constraints]`` pins of the knobs the loops walk, each tried at every value some
#: accepted plan has (a knob with one such value is the free search again)
PINS = ("tp", "pp", "cp", "vp", "micro_batch", "ep", "recompute", "sequence_parallel",
        "dp_sharding", "dp_shard_size")


def _holds(asked: dict, key: str, value) -> bool:
    v = asked[key]
    return value in v if key == "sequence_parallel" else v == value


@pytest.mark.parametrize("name", list(INSTANCES))
def test_solve_returns_the_optimum_the_loops_find(name):
    """The fastest plan the loops find is ``solve``'s objective under CP-SAT and the
    enumerator, and ``solve``'s plan is one the loops accept, among the ties of that optimum
    (formulations/ties.py's window, 0.01%) with the least memory of them (the first tie
    goal); a faster plan from the loops fails the test, naming it.

    Then each knob pinned in ``[constraints]`` at each value, one at a time, under the
    enumerator (which walks the MIPs' space; tests/test_solvers.py checks that they agree):
    its optimum is the loops' best plan of that value. A value the space lost, or a plan it
    prunes that is the best of its value, shows here even where it is not the free optimum.
    (One test per instance: the loops run once.)"""
    doc, exercised = INSTANCES[name]
    inst = parse_instance(doc)
    found = brute_force(doc)
    assert found.plans, "the loops found no plan"
    z, fastest = found.best, found.plans[0].plan
    # the case is exercised: the plans within 2% of the optimum are not all plain data
    # parallelism, and one shows what the instance is for
    near = [w.plan for w in found.plans if w.step <= 1.02 * z]
    assert any(max(p.tp, p.pp, p.vp, p.cp, p.ep) > 1 for p in near), [p.label() for p in near]
    assert any(exercised(p) for p in near), [p.label() for p in near]
    if name == "memory_bound":          # a faster plan is over the memory limit
        assert found.over_memory is not None and found.over_memory < z
    ties = found.ties(z)
    least = min(w.memory for w in ties)
    for backend in ("cpsat", "enumerate"):
        res = solve(inst, solver=backend, explain=False)
        assert res.status == Status.OPTIMAL, (backend, res.status, res.note)
        assert res.objective_kind == "step_time"
        tol = tolerance(res, z)
        assert z >= res.objective - tol, (
            f"{backend} returned {res.objective!r} s ({res.report.plan.label()}), but "
            f"{fastest.label()} ({fastest.to_spec()}) takes {z!r} s: the search misses a "
            "faster plan")
        assert res.objective <= z + tol, (
            f"{backend} returned {res.objective!r} s ({res.report.plan.label()}), below every "
            f"plan the evaluator accepts (fastest {z!r} s)")
        got = res.report.plan.to_spec()
        assert any(w.plan.to_spec() == got for w in ties), (backend, got)
        assert res.report.memory_gib["total"] <= least + MEMORY_TOLERANCE_BYTES / GiB, \
            (backend, res.report.memory_gib["total"], least)
    for key in PINS:
        values = sorted({v for w in found.plans
                         for v in (w.asked[key] if key == "sequence_parallel"
                                   else (w.asked[key],)) if v is not None})
        if len(values) < 2:
            continue
        for value in values:
            best = min(w.step for w in found.plans if _holds(w.asked, key, value))
            pinned = {**doc, "constraints": {**doc["constraints"], key: value}}
            res = solve(parse_instance(pinned), solver="enumerate", explain=False)
            assert res.status == Status.OPTIMAL, (key, value, res.status, res.note)
            assert abs(res.objective - best) <= tolerance(res, best), (
                f"{key} = {value!r}: the enumerator returned {res.objective!r} s "
                f"({res.report.plan.label()}), the loops' best plan of that value takes "
                f"{best!r} s")

"""``plan solve``: one entry point over the three backends, decoding and checking their answer.

Every backend answers in the search space's terms; :func:`solve` decodes that into a
:class:`~planner.model.plan.Plan`, evaluates it with the evaluator (the single source of truth) and
checks that the evaluator reproduces the solver's objective. A mismatch is a bug and is reported
as an ERROR, never silently.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import replace

from formulations import progress, ties
from formulations.encoding import Cuts, encode
from formulations.result import RawSolution, SolveResult, Status
from formulations.space import (SMALL_SPACE, BaseVar, SearchSpace, build_space, candidate_batches,
                                 joint_size, space_size)
from planner.model.algebra import Unencodable
from planner.model.errors import InfeasibleError, InputError, SolverError
from planner.model.evaluate import evaluate
from planner.model.frameworks import OVERLAP_KNOBS
from planner.model.instance import Instance
from planner.model.memo import IdentityCache
from planner.model.plan import Knobs, Plan, shortfall_words, stage_shortfall

BACKENDS = ("highs", "cpsat", "enumerate")


def default_objective(inst: Instance) -> str:
    """Step time for a fixed global batch; seconds per sequence when the batch is free (a
    smaller batch always has a shorter step, so step time would be the wrong question)."""
    return "step_time" if isinstance(inst.spec.training.global_batch, int) else "time_per_sample"


def decode_plan(space: SearchSpace, choice: dict[str, int], knobs) -> Plan:
    """The plan of base-variable values and knobs (a backend's answer, or a point of the
    space) on the instance's cluster."""
    inst = space.inst
    from planner.model.frameworks import framework_of
    return Plan.from_base(choice, knobs, inst.gpus, inst.nodes, inst.node_size,
                          layers=inst.model.layers, reshard_default=framework_of(
                              inst.spec.constraints.framework).reshard_after_forward,
                          mtp_layers=inst.model.mtp_layers)


def objective_value(report, kind: str) -> float:
    return report.step_time_s / (report.plan.global_batch if kind == "time_per_sample" else 1)


def check_backend(backend: str) -> None:
    """An unknown ``--solver`` name is an input error, whether or not a backend runs."""
    from formulations.pyomo_backend import SOLVER_NAMES

    if backend not in BACKENDS and backend not in SOLVER_NAMES:
        raise InputError(f"--solver: unknown solver \"{backend}\"; expected one of "
                         f"{', '.join(BACKENDS + tuple(n for n in SOLVER_NAMES if n != 'highs'))}")


def run_backend(space: SearchSpace, backend: str, time_limit: float | None, objective: str,
                max_objective: float | None = None, exclude: list | None = None,
                break_ties: bool = True, split: bool = True, on_optimum=None,
                window: bool = False) -> tuple[RawSolution, float | None]:
    """Raw answer of one backend and its objective quantum (CP-SAT), encoding included.
    ``split=False``: a fixed-batch space is solved as one model, not one per sharding mode and
    layout (:func:`_best_of_parts` for the capped batch models of a range under CP-SAT).
    ``window``: ``max_objective`` is the tie window of an optimum already proven, so only the
    tie goals are solved (:attr:`formulations.encoding.Cuts.window`)."""
    cuts = Cuts(max_objective, tuple(exclude or ()), break_ties, window)
    check_backend(backend)
    if backend == "enumerate":
        from formulations import enumerate as en

        return en.solve(space, objective, time_limit, cuts), None
    if len(space.base["B"].values) > 1:           # a batch range: the batches that can win
        batches = candidate_batches(space)
        if not batches:
            return RawSolution(Status.INFEASIBLE, None, None, None, None, 0.0, 0.0, backend,
                               note="no plan satisfies the structural rules"), None
        if len(batches) > 1:
            return _best_of_parts(space, [_batch_model(space, b) for b in batches], backend,
                                  time_limit, objective, cuts, "fixed-batch", on_optimum)
        space = _batch_model(space, batches[0])
    size = joint_size(space)
    if split and size > SPLIT_ABOVE and len(part_keys(space, size > SPLIT_LAYOUTS_ABOVE)) > 1:
        return _best_of_parts(space, sharding_parts(space, size > SPLIT_LAYOUTS_ABOVE), backend,
                              time_limit, objective, cuts, "sharding-mode and layout",
                              on_optimum)
    return _solve_model(space, backend, time_limit, objective, cuts, on_optimum)


def part_key(k: Knobs, layouts: bool = True) -> tuple:
    """What a fixed-batch space is split on: the data-parallel sharding choice and (with
    ``layouts``) the pipeline layout of a combination with its recomputed share (partial
    recompute, ``Knobs.recompute_share``: its (P, V) pairs are a layout's, and its second copy
    of the time terms' maxima leaves the parts without it)."""
    return (k.sharding_choice, (k.layout, k.recompute_share) if layouts else None)


def part_keys(space: SearchSpace, layouts: bool = True) -> list[tuple]:
    """The space's distinct :func:`part_key` values, in the order of its combinations."""
    return list(dict.fromkeys(part_key(k, layouts) for k in space.combos))


def sharding_parts(space: SearchSpace, layouts: bool = True) -> list[SearchSpace]:
    """One narrowed space per sharding choice and (with ``layouts``) pipeline layout and
    recomputed share: the distributed optimizer (ZeRO-1) first, it wins most often, and within
    it the even layout first, then no partial recompute first; the first part that holds a
    plan both sets the cap the others must beat and breaks its own ties (:func:`_best_of_parts`).
    A part of layouts without a short last stage carries no pace maximum, one without
    offloaded layers no offload maxima, one without partial recompute no second copy of the
    maxima (:func:`_narrow`): the maxima the joint model needs
    for one shape over its combinations weaken a part's relaxation for nothing."""
    keys = sorted(part_keys(space, layouts),
                  key=lambda pk: (pk[0][0] != "optim", pk[1] is not None and any(pk[1][0]),
                                  pk[1] is not None and pk[1][1] > 0))
    return [_narrow(space, (pk,), layouts) for pk in keys]


#: A fixed-batch space is solved as one model per sharding mode when its
#: :func:`~formulations.space.joint_size` passes this (below, one joint model costs less than the
#: several models' builds). Measured on the 80 instances tests/test_solvers.py's agreement
#: tests drew then (2 x 40; now 3 x 14 = 42; CP-SAT + HiGHS, CPU seconds): 112 s always joint,
#: 83 s always split, 69 s with this rule; the shipped instances are above it (Llama 3.1 405B:
#: 5.8e6) but the one-node 1.3B (7.4e4).
SPLIT_ABOVE = SMALL_SPACE
#: ... and one model per pipeline layout too when it passes this. Below it the layouts' models
#: cost more to build than they save: on the agreement tests' instances of 1.3e5 to 2.8e5
#: cells with three layouts (tests/test_solvers.py), splitting them too took 5-10% more CPU
#: over all 48 examples; on Mixtral 8x7B on 144 GB200 (1.2e7 cells, three layouts) CP-SAT
#: went from 2.9 s to 1.2 s and HiGHS from 10.1 s to 4.0 s, on Llama 3.1 405B (1.1e7 cells,
#: two layouts) from 17.8 s to 7.6 s and 110 s to 68 s (whole solve, medians of 3 under a
#: load of about 6).
SPLIT_LAYOUTS_ABOVE = 2**20
#: Under CP-SAT the batch models of a range after the first that holds a plan, each capped at
#: the best found, are solved as one model each instead of one per sharding mode and layout:
#: they are nearly always proven infeasible, and the split's Python builds (encode, rows,
#: CP-SAT proto, about 0.1 s per part) cost more than the joint proof. Measured (whole process,
#: single runs, load below 1.5; benchmarks/README.md, "Issue 10 at d8878a8"): 1.2-1.6x faster
#: on the four batch-range instances there, the same optima and plans.
CAPPED_JOINT = True
#: Under CP-SAT, the parts after the leading one of a fixed-batch space are solved in a second
#: thread while the leading part breaks its ties: they need only its optimum, and the tie goals
#: run one CP-SAT worker (formulations/cpsat.py, ``search_workers``), which leaves the second
#: core of a two-core machine idle; CP-SAT releases the GIL while it solves. Once its ties are broken
#: the first thread takes parts from the same queue. The answer is the one a single thread
#: gives: every cap is at or above the final optimum's tie window (docs/encoding.md). Measured
#: with the tie re-solve that skips the objective (``Cuts.window``), whole process, medians of
#: 3 interleaved against the commit before, 13 instances (benchmarks/README.md, "Two threads
#: on the parts"): 67.3 s -> 61.8 s in all, the same plans.
PARTS_BESIDE_TIES = True
#: ... and so are the capped batch models of a range, beside the leading batch model: they
#: start once the leading batch model's first part has its objective (the optimum of that part
#: caps them: at or above the range's optimum), while that model's other parts and tie goals
#: go on.
BATCHES_BESIDE_TIES = True


def _solve_model(space: SearchSpace, backend: str, time_limit: float | None, objective: str,
                 cuts: Cuts, on_optimum=None) -> tuple[RawSolution, float | None]:
    """One MIP of ``space``: encoded, then solved by ``backend`` (``on_optimum``: CP-SAT
    only, :func:`formulations.cpsat.solve`)."""
    t0 = time.perf_counter()
    # dominated categorical choices are pruned, except when listing distinct plans (top-k)
    try:
        enc = _encoding(space, objective, prune=not cuts.exclude, ties=cuts.break_ties)
    except Unencodable as exc:
        # the model's terms take a form the MIPs cannot hold: a planner bug, said as a solver
        # failure (exit 4) with the way around it, not a traceback
        raise SolverError(f"the MIP encoding cannot represent this instance ({exc}); this is "
                          "a bug of the planner, please report it with the instance file. "
                          "--solver enumerate solves it without the encoding") from exc
    enc_s = time.perf_counter() - t0
    missing = not_installed(backend)
    if missing:     # a solver that is not installed is a bad --solver value (exit 2), not a failure
        raise InputError(f"--solver: {missing}")
    if backend == "cpsat":
        from formulations import cpsat

        raw, q = cpsat.solve(enc, cuts, time_limit, on_optimum), cpsat.quantum(enc)
    else:
        from formulations import pyomo_backend

        raw, q = pyomo_backend.solve(enc, cuts, time_limit, _pyomo_name(backend)), None
    return replace(raw, build_s=raw.build_s + enc_s), q


def _encoding(space: SearchSpace, objective: str, prune: bool, ties: bool):
    """:func:`~formulations.encoding.encode` of ``space``, kept on its root space
    (:meth:`SearchSpace.shared`) for every later model of the same part: an encoding depends
    on the instance and on the part's knob combinations (with the maxima flags ``_narrow``
    sets, which the combinations' equality leaves out) and fixed batch, not on the query's
    cuts or on the backend. So the MIP backends solving one space (:func:`space_of`) encode
    each part once, and so do the k solves of a top-k list (which differ in their cuts).

    Measured with ``time plan solve instances/gpt3-175b-a100.toml --top 8`` and on the
    suite: see benchmarks/README.md, "One encoding per part"."""
    key = ("encoding", objective, prune, ties, tuple(sorted(space.fixed.items())),
           tuple(k.terms_key for k in space.combos))
    return space.shared(key, lambda: encode(space, objective, prune=prune, ties=ties))


#: the spaces of the last instances :func:`solve` was asked about, by the instance's identity
#: (an :class:`Instance` is frozen; the cache holds it, so its id is not reused while cached)
_SPACES = IdentityCache(maxsize=2)


def space_of(inst: Instance) -> SearchSpace:
    """``build_space(inst)``, the same space object for the same instance object while it is
    among the last two asked for: the memos a space keeps (the presolve's counts, the
    symbolic terms, the encodings of :func:`_encoding`) then serve every solve of it: the k
    solves of top-k, capacity's capped re-solve of a size, the backends of one agreement
    check. A space is never changed by a solve, only narrowed into new ones (a query on
    another instance object, such as ``compare``'s lifted constraints or another size, builds
    its own). ``build_space`` raises InfeasibleError for empty domains, and nothing is kept."""
    return _SPACES.get((inst,), None, lambda: build_space(inst))


def clear_spaces() -> None:
    """Forget the spaces :func:`space_of` keeps (the tests start each from none, so that a
    test patching the model's code cannot meet an encoding made before)."""
    _SPACES.clear()


def _pyomo_name(backend: str) -> str:
    return "highs" if backend in ("highs", "pyomo") else backend


def not_installed(backend: str) -> str | None:
    """Why the MIP ``backend`` cannot run here (its solver is not installed), or None."""
    if backend == "enumerate":
        return None
    if backend == "cpsat":
        from formulations import cpsat

        return None if cpsat.available() else \
            "OR-Tools CP-SAT is not installed (pip install ortools)"
    from formulations import pyomo_backend

    name = _pyomo_name(backend)
    return None if pyomo_backend.available(name) else (
        f"Pyomo cannot find the MILP solver \"{name}\" (not installed); install it or use "
        "cpsat, highs or enumerate")


def _best_of_parts(space: SearchSpace, parts: list[SearchSpace], backend: str,
                   time_limit: float | None, objective: str, cuts: Cuts, kind: str,
                   on_optimum=None) -> tuple[RawSolution, float | None]:
    """The optimum of ``space`` as the best of the proven optima of ``parts``, models that
    split it: every plan is in one of them, so the best of their optima is the optimum and the
    least of their bounds is a bound. One model per part is smaller and, summed, faster than
    one model carrying every part on large spaces: on the Llama 3.1 405B instance (16,384
    H100), the objective alone, CP-SAT 6.95 s for one joint model against 2.59 s for its
    sharding-mode models, HiGHS 28.44 s against 14.43 s (benchmarks/sharding_parts.py).

    - ``kind = "fixed-batch"``: a global-batch range as one fixed-batch model per batch that
      some assignment's largest admissible batch reaches (a handful, counted by
      :func:`formulations.space.candidate_batches` from the rules, without listing the
      assignments); carrying the batch inside every form makes one model many times larger.
      Ties are broken within the largest batch that holds a tie (formulations/ties.py).
    - ``kind = "sharding-mode and layout"``: one model per data-parallel sharding choice
      and pipeline layout (the terms of ZeRO-3's per-micro-batch collectives make a joint
      model hard to prove, and so do the layouts' allowed pipeline shapes and the pace
      maximum of a short last stage: Mixtral 8x7B on 144 GB200 with ZeRO-1, CP-SAT's
      objective solve 10.8 s as one model, 0.85 + 0.97 + 0.50 s as its three layouts'
      models, measured once under load). Ties are broken
      as in one model: among the plans of every part that ties with the optimum, re-solved as
      one model of those parts (usually one).

    Parts are solved in order (largest batch first: it usually wins, as the bubble and the
    per-step fixed costs shrink per sequence; the distributed optimizer first among the
    sharding modes) and every later model only has to beat the incumbent: its objective is
    capped at the best found so far, so a part that cannot win is proven infeasible, which is cheaper than
    proving its own optimum. The leading part (the first solved that holds a plan) also breaks
    its ties at once (the solves a later re-solve of it would make), so when it alone holds the
    optimum no model is built twice
    (measured on the 40 examples of tests/test_solvers.py::test_three_backends_agree: 76 s
    of CPU against 84 s when every part's ties wait for the end).
    The time limit covers all the models. Excluded plans (top-k) go to the models that hold
    them."""
    t_start = time.perf_counter()
    found, bounds, status, solve_s, build_s, q = [], [], Status.OPTIMAL, 0.0, 0.0, None

    def optimum(raw: RawSolution) -> float:       # a model's proven optimum (its plan may be a tie)
        return raw.bound if raw.status == Status.OPTIMAL and raw.bound is not None \
            else raw.objective

    def excluded(sub: SearchSpace) -> list:
        return [x for x in cuts.exclude if x[0]["B"] in sub.base["B"].values
                and x[1] in sub.combos]

    def left() -> float | None:
        return None if time_limit is None else time_limit - (time.perf_counter() - t_start)

    results: dict[int, tuple[RawSolution, float | None] | None] = {}   # None: not solved
    known: list[float] = []             # the optima (or incumbents) found so far: the caps

    def solve_part(i: int, on_optimum=None, leader: bool = False) -> None:
        sub = parts[i]
        progress.starting(kind, i, len(parts), min(known) if known else None, objective)
        cap = cuts.max_objective
        if known:                                   # beat the best so far, or tie with it
            tie = ties.objective_cap(min(known))
            cap = tie if cap is None else min(cap, tie)
        # a capped batch model of a range only has to be proven unable to beat the best:
        # CP-SAT does that on one model of it faster than on its parts, whose Python builds
        # dominate (CAPPED_JOINT)
        raw, q_b = run_backend(sub, backend, left(), objective, cap, excluded(sub),
                               break_ties=cuts.break_ties and leader,
                               split=not (CAPPED_JOINT and kind == "fixed-batch" and known
                                          and backend == "cpsat"), on_optimum=on_optimum)
        results[i] = (raw, q_b)
        if raw.status in (Status.OPTIMAL, Status.FEASIBLE) and raw.objective is not None:
            known.append(optimum(raw))

    queue = iter(range(len(parts)))                  # the parts not yet taken
    lock = threading.Lock()
    # the part that breaks its own ties as it is solved: the first one solved uncapped that
    # holds a plan (part 0 unless it has none), so that when it alone holds the optimum no
    # model is built twice
    leader: list[int] = []

    def solve_parts(on_optimum=None) -> None:
        """Take the next part and solve it, until none is left (from one or two threads).
        While nothing is known the part taken leads: it breaks its own ties, and
        ``on_optimum`` hears its optimum."""
        while True:
            with lock:
                i = next(queue, None)
            if i is None:
                return
            if time_limit is not None and left() <= 0:
                results[i] = None                   # parts left unsolved: nothing proven
                continue
            leads = not known and not leader
            solve_part(i, on_optimum if leads else None, leader=leads)
            raw = results[i][0] if results.get(i) else None
            if leads and raw is not None and raw.objective is not None:
                leader.append(i)

    # CP-SAT: once the leading part's objective is solved, the other parts (capped at it) are
    # solved in a thread while the leading part breaks its ties, and by both threads once the
    # ties are broken (PARTS_BESIDE_TIES)
    if PARTS_BESIDE_TIES and backend == "cpsat" and len(parts) > 1 and cuts.break_ties \
            and (kind != "fixed-batch" or BATCHES_BESIDE_TIES):
        thread, failure = None, None

        def rest() -> None:
            nonlocal failure
            try:
                solve_parts()
            except BaseException as exc:             # re-raised in the caller's thread
                failure = exc

        def first_solved(z: float) -> None:
            nonlocal thread
            known.append(z)
            thread = threading.Thread(target=rest, daemon=True)
            thread.start()
            if on_optimum is not None:       # (a batch model of a range: its range hears it)
                on_optimum(z)
        solve_parts(first_solved)
        if thread is not None:
            thread.join()
            if failure is not None:
                raise failure
    else:
        solve_parts(on_optimum)
    for i in range(len(parts)):
        if results.get(i) is None:                  # left unsolved at the time limit
            status = Status.FEASIBLE
            bounds.append(None)
            continue
        raw, q_b = results[i]
        q = max(q or 0.0, q_b or 0.0) or None
        solve_s += raw.solve_s
        build_s += raw.build_s
        if raw.status == Status.INFEASIBLE:
            continue
        bounds.append(raw.bound)                    # None when that model has no bound
        if raw.status not in (Status.OPTIMAL, Status.FEASIBLE) or raw.objective is None:
            status = Status.FEASIBLE                 # a part is unsolved: nothing is proven
            continue
        if raw.status != Status.OPTIMAL:
            status = Status.FEASIBLE
        found.append((i, raw))
    bound = None if (not bounds or None in bounds) else min(bounds)
    if not found:
        return RawSolution(Status.INFEASIBLE if status == Status.OPTIMAL else
                           Status.NO_SOLUTION_IN_LIMIT, None, None, None, None, solve_s,
                           build_s, backend), q
    z = min(optimum(r) for _, r in found)
    tie = ties.objective_cap(z)
    # the parts after the first that holds a plan with no plan in the optimum's tie window:
    # proven infeasible under their cap or proven worse, whichever cap their thread gave them
    # (every cap is at or above that window), so the count is the same in any order
    proven = {i: optimum(r) for i, r in found if r.status == Status.OPTIMAL}
    beaten = sum(1 for i in range(found[0][0] + 1, len(parts)) if results.get(i) is not None
                 and (results[i][0].status == Status.INFEASIBLE
                      or proven.get(i, -math.inf) > tie))
    note = f"{len(parts)} {kind} models, {beaten} proven not to beat the best"
    tied = [(i, r) for i, r in found if optimum(r) <= tie]
    i_best, best = tied[0]
    if kind == "fixed-batch":
        tied = tied[:1]                             # the largest batch that holds a tie
    # the leading part broke its ties in its own window already: when it alone holds the
    # optimum (not only a tie of another part's), that window is the one asked for
    settled = [i for i, _ in tied] == leader and optimum(best) == z
    if cuts.break_ties and not settled:
        # break the ties once, within the tied parts
        sub = parts[i_best] if len(tied) == 1 else _narrow(space, tuple(
            pk for i, _ in tied for pk in part_keys(parts[i])))   # (keys with the layout)
        cap = tie if cuts.max_objective is None else min(cuts.max_objective, tie)
        rest = None if time_limit is None else max(left(), 1e-3)
        # (the parts proved the optimum: only the tie goals are solved, in its window)
        if len(tied) == 1:
            tied_raw, _ = run_backend(sub, backend, rest, objective, cap, excluded(sub),
                                      window=True)
        else:                                       # (one model: not split again)
            tied_raw, _ = _solve_model(sub, backend, rest, objective,
                                       Cuts(cap, tuple(excluded(sub)), True, window=True))
        solve_s += tied_raw.solve_s
        build_s += tied_raw.build_s
        if tied_raw.choice is not None:
            best = replace(best, choice=tied_raw.choice, knobs=tied_raw.knobs,
                           objective=tied_raw.objective)
    return replace(best, status=status, bound=bound, solve_s=solve_s, build_s=build_s,
                   note=note), q


def _narrow(space: SearchSpace, keys: tuple, layouts: bool = True) -> SearchSpace:
    """The space with only the knob combinations of the given :func:`part_key` ``keys`` (kept
    in the space's order). The maxima every combination of the whole space carries for one
    shape (``Knobs.paced``: a short last stage somewhere; ``Knobs.offload_maxes``: offloaded
    layers somewhere; ``Knobs.recompute_maxes``: a partial recompute somewhere;
    ``Knobs.overlap_maxes``: an overlap switch on in some combinations, off in others) are
    dropped where no combination left needs them; the terms cache, shared by the parts, is
    keyed on the flags. ``layouts=False``: the keys leave the layout out (``None``)."""
    combos = [k for k in space.combos if part_key(k, layouts) in keys]
    paced = any(k.last_short for k in combos)
    offload_maxes = any(k.offload_layers for k in combos)
    recompute_maxes = any(k.recompute_share for k in combos)
    mixed = {o for o in OVERLAP_KNOBS if len({getattr(k, o) for k in combos}) > 1}
    combos = [replace(k, paced=k.paced and paced, offload_maxes=k.offload_maxes and offload_maxes,
                      recompute_maxes=k.recompute_maxes and recompute_maxes,
                      overlap_maxes=tuple(o for o in k.overlap_maxes if o in mixed))
              for k in combos]
    dims = dict(space.dims)
    for dim in ("sharding_choice", "layout", "offload", "recompute_share",
                *OVERLAP_KNOBS):                                              # (Knobs' names)
        if dim in dims:
            dims[dim] = tuple(v for v in dims[dim] if any(getattr(k, dim) == v for k in combos))
    return replace(space, combos=combos, dims=dims, parent=space, _reach={},
                   terms_cache=space.terms_cache)


def _batch_model(space: SearchSpace, batch: int) -> SearchSpace:
    """The space with the global batch fixed at ``batch``."""
    exps = space.base["B"].exps[space.base["B"].values.index(batch)]
    return replace(space, base={**space.base, "B": BaseVar("B", (batch,), (exps,))},
                   fixed={**space.fixed, "B": batch}, parent=space, _reach={},
                   terms_cache={})


def objective_cap(inst: Instance, kind: str) -> float | None:
    """A minimum MFU as a maximum objective: MFU >= x <=> step <= model FLOPs / (x N peak)."""
    from planner.model.workload import Shape

    mfu = inst.spec.constraints.min_mfu
    if not mfu:
        return None
    per_seq = Shape.of(inst.model).model_flops(1)
    per_second = mfu * inst.gpus * inst.hw.peak
    if kind == "time_per_sample":
        return per_seq / per_second
    return per_seq * inst.spec.training.global_batch / per_second


def solve(inst: Instance, solver: str = "cpsat", time_limit: float | None = None,
          objective: str | None = None, explain: bool | str = True,
          exclude: list | None = None, max_objective: float | None = None) -> SolveResult:
    """The optimal plan of an instance (fixed GPU count) under its constraints.

    Raises :class:`~planner.model.errors.InfeasibleError` (with what binds) when no plan exists;
    ``explain="brief"`` says what binds without searching for the nearest change;
    ``explain="limits"`` does so only where the structural rules admit plans (memory, a pin,
    ``min_mfu`` rule them all out), and a size they leave none keeps the count's one sentence,
    found in milliseconds (capacity meets such sizes by the dozen).
    ``exclude`` lists plans to leave out, as (base-variable values, knobs) pairs (top-k).
    ``max_objective`` admits only plans at or below it (in the objective's unit, like a
    minimum MFU): a query that needs to know whether a size can beat a plan it already has
    asks that, which a MIP proves faster than it finds the size's optimum.

    Example
    -------
    >>> from planner.model.instance import load_instance                    # doctest: +SKIP
    >>> res = solve(load_instance("instances/gpt3-175b-a100.toml"))   # doctest: +SKIP
    >>> res.status.value, res.report.plan.label()                       # doctest: +SKIP
    ('optimal', 'TP4 PP8 DP32 VP12 mb1')
    """
    t0 = time.perf_counter()
    kind = objective or default_objective(inst)
    space = space_of(inst)                       # raises InfeasibleError for empty domains
    caps = [c for c in (objective_cap(inst, kind), max_objective) if c is not None]
    cap = min(caps) if caps else None
    check_backend(solver)
    size = space_size(space)                     # counted over the rules, never listed
    size.update(stage_shortfall=stage_shortfall(inst), stage_shortfall_words=shortfall_words(inst))
    # no assignment keeps the structural rules (a GPU count no degrees multiply to, say): the
    # count proves it in milliseconds, where a backend takes about a second; capacity and
    # pareto meet such sizes by the dozen
    raw, quantum = (run_backend(space, solver, time_limit, kind, cap, exclude)
                    if size["space_plans"] else (None, None))
    wall = time.perf_counter() - t0
    if raw is None or raw.status == Status.INFEASIBLE:
        if explain and not exclude and (explain != "limits" or size["space_plans"]):
            from formulations.explain import explain_infeasible

            raise explain_infeasible(space, objective_cap(inst, kind), kind,
                                     suggest=explain not in ("brief", "limits"))
        # (without the explanation: the count tells a size no degrees fit from one whose
        # plans all break a limit, which capacity and pareto report per size)
        if not size["space_plans"]:
            raise InfeasibleError(f"no plan keeps the structural rules on {inst.gpus} GPUs "
                                  "(degrees, layers, heads, batch)")
        raise InfeasibleError("no plan satisfies the limits" + (
            f" (besides the {len(exclude)} excluded)" if exclude else ""))
    if raw.status in (Status.ERROR, Status.NO_SOLUTION_IN_LIMIT) or raw.choice is None:
        return SolveResult(raw.status, None, raw.objective, raw.bound, wall, raw.solve_s,
                           raw.build_s, raw.backend, kind, raw.note, quantum, **size)
    plan = decode_plan(space, raw.choice, raw.knobs)
    report = evaluate(inst, plan)
    value = objective_value(report, kind)
    tol = (quantum or 0.0) * 200 + 1e-6 * abs(value)
    status, note = raw.status, raw.note
    if abs(value - raw.objective) > tol or report.violations:
        status = Status.ERROR
        note = (f"the evaluator gives {value!r} for the solver's plan, the solver "
                f"{raw.objective!r}; violations: {'; '.join(report.violations) or 'none'}")
    return SolveResult(status, report, raw.objective, raw.bound, wall, raw.solve_s, raw.build_s,
                       raw.backend, kind, note, quantum, choice=raw.choice, knobs=raw.knobs, **size)

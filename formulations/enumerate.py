"""Vectorised enumeration of the search space: the test oracle and the benchmark baseline.

It walks exactly the space the MIP backends see (:func:`formulations.space.build_space`):
the cartesian product of the base variables, filtered by the same per-prime rules, then the
evaluator (:func:`planner.model.terms.step_terms`) runs once per categorical combination on numpy
arrays holding the surviving plans its pipeline layout allows (:func:`by_layout`). No encoding,
no solver: if the encoders and this disagree, one of them is wrong.
"""

from __future__ import annotations

import time

import numpy as np

from formulations.encoding import NO_CUTS, Cuts
from formulations import ties
from formulations.result import RawSolution, Status
from formulations.space import SearchSpace, smooth_in_range
from planner.model.plan import BASE_NAMES as ORDER
from planner.model.plan import Degrees, Grid
from planner.model.terms import internode_bytes, memory_limit_bytes, step_terms


def available() -> bool:
    return True


def feasible_points(space: SearchSpace, dominant_batch: bool = True) -> dict[str, np.ndarray]:
    """Every assignment of the base variables that satisfies the structural rules, as columns.

    The product is built one variable at a time and filtered as soon as a rule's variables are
    all present; rows hold value *indices* (exponents are looked up per rule), which keeps the
    intermediate arrays small.

    With a global-batch range, only the largest batch each assignment of the other variables
    admits is kept (``dominant_batch``): for fixed degrees the step time is ``m X + Y`` with
    ``X, Y >= 0`` independent of the micro-batch count ``m`` and memory does not depend on ``m``,
    so the time per sequence ``(m X + Y) / (dp b m)`` never increases with the batch
    (tests/test_dominance.py checks it). The optimum is unchanged; the space shrinks by the
    number of batch values."""
    nq = len(space.primes)
    idx: dict[str, np.ndarray] = {}          # variable -> value index per row
    tables = {name: np.array(bv.exps, dtype=np.int64).reshape(len(bv.values), nq)
              for name, bv in space.base.items()}
    values = {name: np.array(bv.values, dtype=np.int64) for name, bv in space.base.items()}
    n_rows = 1
    done: set[str] = set()
    pending = list(space.constraints)
    for name in ORDER:
        reps = len(values[name])
        if name == "B" and reps > 1 and dominant_batch:
            idx["B"], keep = _largest_batch(space, values, idx)
        else:
            idx = {k: np.repeat(c, reps) for k, c in idx.items()}
            idx[name] = np.tile(np.arange(reps, dtype=np.int32), n_rows)
            n_rows *= reps
            keep = np.ones(n_rows, dtype=bool)
        done.add(name)
        for imp in space.implications:
            if name in (imp.if_var, imp.then_var) and {imp.if_var, imp.then_var} <= done:
                keep &= ((values[imp.if_var][idx[imp.if_var]] == 1)
                         | (values[imp.then_var][idx[imp.then_var]] > 1))
        still = []
        for con in pending:
            if not {v for v, _ in con.mono} <= done:
                still.append(con)
                continue
            total = np.broadcast_to(np.array(con.const, dtype=np.int64), (n_rows, nq)).copy()
            for v, e in con.mono:
                total += e * tables[v][idx[v]]
            ok = np.all(total == 0, axis=1) if con.eq else np.all(total >= 0, axis=1)
            if con.when_v_gt1:
                ok |= values["V"][idx["V"]] == 1
            keep &= ok
        pending = still
        idx = {k: c[keep] for k, c in idx.items()}
        n_rows = int(keep.sum())
    cols = {k: values[k][c] for k, c in idx.items()}
    if space.layout_pairs:                   # (P, V) that some pipeline layout allows
        union = {p * (1 << 32) + v for ok in space.layout_pairs.values() for p, v in ok}
        keep = np.isin(cols["P"].astype(np.int64) * (1 << 32) + cols["V"], list(union))
        cols = {k: c[keep] for k, c in cols.items()}
        n_rows = int(keep.sum())
    for _name, mono, coef, lo, hi in space.form_caps:
        val = np.full(n_rows, coef, dtype=float)
        for v, e in mono:
            val = val * cols[v].astype(float) ** e
        keep = np.ones(n_rows, dtype=bool)
        if lo is not None:
            keep &= val >= lo - 1e-9
        if hi is not None:
            keep &= val <= hi + 1e-9
        cols = {k: c[keep] for k, c in cols.items()}
        n_rows = int(keep.sum())
    return cols


def _largest_batch(space: SearchSpace, values: dict, idx: dict) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the index of the largest allowed global batch that ``dp * b`` (and ``pp`` when
    interleaved) divides, and whether one exists."""
    T, C, P = (values[k][idx[k]] for k in ("T", "C", "P"))
    b, V = values["b"][idx["b"]], values["V"][idx["V"]]
    batches = values["B"]
    dp = space.inst.gpus // (T * C * P)
    step = dp * b * np.where(V > 1, P, 1)               # B must be a multiple of this
    smooth = np.array(smooth_in_range(1, int(batches.max()), space.primes), dtype=np.int64)
    target = batches.max() // np.maximum(step, 1)
    pos = np.searchsorted(smooth, target, side="right") - 1
    k = np.where(pos >= 0, smooth[np.maximum(pos, 0)], 0)
    B = step * k
    where = np.searchsorted(batches, B)
    ok = (k >= 1) & (B >= batches.min()) & (where < len(batches))
    where = np.minimum(where, len(batches) - 1)
    ok &= batches[where] == B
    return where.astype(np.int32), ok


def degrees_of(space: SearchSpace, cols: dict[str, np.ndarray]) -> Degrees:
    """The evaluator's degrees of every point at once (the one derivation, on arrays)."""
    f = {k: c.astype(float) for k, c in cols.items()}
    return Grid.from_base(f, space.inst.gpus, space.inst.node_size).degrees()


def evaluate_all(space: SearchSpace, cols: dict[str, np.ndarray], objective: str
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Objective per (combination, point), +inf where memory does not fit; and the fit mask.
    (No solver calls it: a library entry point, used by tests/test_dominance.py.)"""
    obj = evaluate_goals(space, cols, objective, internode=False)[0]
    return obj, np.isfinite(obj)


def by_layout(space: SearchSpace, cols: dict[str, np.ndarray]):
    """Per pipeline layout of the space's combinations (:func:`formulations.space.layout_key`):
    the indices of its combinations, the mask of the points whose (pp, vp) the layout allows,
    those points' columns and their degrees; layouts that allow none of the points are left
    out. Every walk that evaluates the combinations on points goes through it, so that none
    evaluates (or reports) a point under a layout that does not allow it, and none pays for
    it: the uneven layouts, the layout strings above all, allow few (pp, vp) pairs (a
    published DeepSeek-V3 space evaluated every point for every combination, three times the
    work)."""
    from formulations.space import layout_key
    pv = cols["P"].astype(np.int64) * (1 << 32) + cols["V"].astype(np.int64)
    groups: dict = {}
    for k, knobs in enumerate(space.combos):
        groups.setdefault(layout_key(knobs), []).append(k)
    for key, rows in groups.items():
        laid = np.isin(pv, [p * (1 << 32) + v for p, v in space.layout_pairs[key]])
        if laid.any():
            sub = {name: c[laid] for name, c in cols.items()}
            yield rows, laid, sub, degrees_of(space, sub)


def evaluate_goals(space: SearchSpace, cols: dict[str, np.ndarray], objective: str,
                   internode: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Per (combination, point): the objective (+inf where memory does not fit or the
    combination's pipeline layout does not allow the point's (pp, vp)), the memory of the most
    loaded stage (0 where the layout does not allow the point) and (``internode``; else None) the
    bytes sent across nodes (the goals of :mod:`formulations.ties`)."""
    inst = space.inst
    n = len(next(iter(cols.values())))
    limit = memory_limit_bytes(inst)
    shape = (len(space.combos), n)
    obj, memory = np.full(shape, np.inf), np.zeros(shape)
    for rows, laid, _, deg in by_layout(space, cols):
        m = int(laid.sum())
        for k in rows:
            t = step_terms(inst, deg, space.combos[k])
            step = np.broadcast_to(np.asarray(t.step_time, dtype=float), (m,))
            if objective == "time_per_sample":
                step = step / deg.B
            mem = np.zeros(m)
            for stage in t.memory_stages():
                mem = np.maximum(mem, np.broadcast_to(np.asarray(t.memory_total(stage), float),
                                                      (m,)))
            obj[k, laid] = np.where(mem <= limit, step, np.inf)
            memory[k, laid] = mem
    return obj, memory, (internode_goal(space, cols, range(len(space.combos)))
                         if internode else None)


def internode_goal(space: SearchSpace, cols: dict[str, np.ndarray], rows,
                   at: np.ndarray | None = None) -> np.ndarray:
    """Bytes sent across nodes per (combination, point), for the combinations ``rows`` at the
    points ``at`` (a mask; every point without it), 0 elsewhere. The tie-break reads them only
    among the plans that tie on the objective, and each combination costs a second run of the
    evaluator: :func:`solve` asks for the combinations holding a tie, at the points some tie
    holds."""
    n = len(next(iter(cols.values())))
    out = np.zeros((len(space.combos), n))
    if space.inst.segments > 1:                  # on one NVLink segment nothing crosses the NIC
        if at is not None:
            cols = {name: c[at] for name, c in cols.items()}
        deg = degrees_of(space, cols)
        m = len(next(iter(cols.values())))
        for k in rows:
            out[k, slice(None) if at is None else at] = np.broadcast_to(np.asarray(
                internode_bytes(space.inst, deg, space.combos[k]), dtype=float), (m,))
    return out


def solve(space: SearchSpace, objective: str = "step_time", time_limit: float | None = None,
          cuts: Cuts = NO_CUTS) -> RawSolution:
    t0 = time.perf_counter()
    cols = feasible_points(space)
    build_s = time.perf_counter() - t0
    n = len(next(iter(cols.values()))) if cols else 0
    if n == 0:
        return RawSolution(Status.INFEASIBLE, None, None, None, None, 0.0, build_s, "enumerate",
                           note="no plan satisfies the structural rules",
                           extra={"points": 0})
    obj, memory, _ = evaluate_goals(space, cols, objective, internode=False)
    if cuts.max_objective is not None:
        obj[obj > cuts.max_objective] = np.inf
    for choice_x, knobs_x in cuts.exclude:                          # top-k: leave these out
        if knobs_x in space.combos:
            hit = np.ones(n, dtype=bool)
            for name in ORDER:
                hit &= cols[name] == choice_x[name]
            obj[space.combos.index(knobs_x), hit] = np.inf
    z = float(np.min(obj))
    if not np.isfinite(z):
        return RawSolution(Status.INFEASIBLE, None, None, None, None,
                           time.perf_counter() - t0 - build_s, build_s, "enumerate",
                           note="no plan fits in memory", extra={"points": n * len(space.combos)})
    if len(space.base["B"].values) > 1:      # ties are broken within the batch of the optimum
        batch = cols["B"][np.any(obj <= ties.objective_cap(z), axis=0)].max()
        obj = np.where(cols["B"] == batch, obj, np.inf)
    values = {name: space.base[name].values for name in ORDER}
    keys = []
    for name, ranks in ties.lex_ranks(values, len(space.combos)):
        if name == "combo":
            keys.append(np.arange(len(space.combos))[:, None])
        else:
            rank_of = dict(zip(values[name], ranks))
            keys.append(np.array([rank_of[v] for v in cols[name].tolist()])[None, :])
    # the bytes across nodes of the combinations that hold a tie, at the points a tie holds
    # (the only ones ties.pick reads)
    near = obj <= ties.objective_cap(float(np.min(obj)))
    internode = internode_goal(space, cols, np.nonzero(np.any(near, axis=1))[0],
                               np.any(near, axis=0))
    k, i = ties.pick(obj, memory, internode, keys)
    solve_s = time.perf_counter() - t0 - build_s
    choice = {name: int(cols[name][i]) for name in ORDER}
    return RawSolution(Status.OPTIMAL, choice, space.combos[k], float(obj[k, i]), z, solve_s,
                       build_s, "enumerate", extra={"points": n * len(space.combos)})

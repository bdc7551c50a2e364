"""Sharding choices that a plan with one data-parallel shard cannot need.

Where ``dp * cp = 1`` the data-parallel shard group is one GPU: every sharding mode shards over
one rank, so ZeRO-2 and ZeRO-3 cost what the distributed optimizer (ZeRO-1) costs, or more
(ZeRO-3 still holds the gathered working set of a layer and its prefetched neighbour). Those
plans are nonetheless in the space, in a part of their own (:func:`formulations.solve.
sharding_parts`), where they tie with the ZeRO-1 plan and force the tie goals to be re-solved
across both parts: on the 8-GPU space of Korthikanti et al.'s 22B model, HiGHS spent 9.1 s and
CP-SAT 2.0 s where the enumerator took 0.09 s.

This module finds, per knob combination, whether its plans at ``dp * cp = 1`` are beaten or
matched by the same plan under ZeRO-1 (its *twin*: the same combination with ``dp_sharding =
"optim"``) on every goal of :mod:`formulations.ties`, so that the twin is always chosen first:

- an objective no larger, and memory and bytes across nodes no larger;
- and memory larger by more than the memory goal's tolerance, or bytes across nodes beyond the
  internode goal's tie, or, all goals tied, the twin earlier among the combinations (the last
  key of the lexicographic goal).

It is checked on numbers, at every point of the space with ``dp * cp = 1`` (the evaluator on
arrays, as the enumerator runs it), not argued: a combination passes only if every such point
passes. The MIPs then forbid those points under the combinations that pass
(:meth:`formulations.milp._RowBuilder.one_shard_rows`); neither the optimum nor the plan the
goals choose can change, as the enumerator, which keeps them, shows on every agreement test.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from formulations.space import BaseVar, SearchSpace, count_points, symbols
from formulations.ties import MEMORY_TOLERANCE_BYTES, internode_cap
from planner.model.plan import Knobs

#: the twin's sharding mode: ZeRO-1, the distributed optimizer
TWIN_MODE = "optim"
#: Above this many points at ``dp * cp = 1`` the check is skipped (no combination is then
#: dominated, so the MIPs keep those points: the same answer, at most slower ties). Listing
#: the points of a range of global batches is what costs: benchmarks/instances/
#: scaling-A512-range.toml (48,256 such points) spent 31 s of a 41 s solve and 4.7 GB here,
#: ``global_batch = [1, 4194304]`` on one node (an input fuzzer) 45 s and 1.9 GB; with the
#: limit 7.9 s / 0.27 GB and 2.0 s / 0.13 GB, the same answers. The shipped instances and the
#: fixed-batch benchmarks have at most 315 such points (0.1 s for the check).
ONE_SHARD_POINTS_LIMIT = 5_000


def twin_of(k: Knobs) -> Knobs:
    """The combination with ZeRO-1 in place of ``k``'s sharding mode."""
    return replace(k, dp_sharding=TWIN_MODE, reshard_after_forward=None)


def one_shard_points(space: SearchSpace) -> dict[str, np.ndarray] | None:
    """The points of ``space`` with ``dp * cp = 1``, as columns, or None if there are none:
    the context-parallel degree at 1 and the data-parallel degree capped at 1 (a cap of the
    same kind as ``[constraints] dp``)."""
    from formulations.enumerate import feasible_points

    c = space.base["C"]
    if 1 not in c.values:
        return None
    i = c.values.index(1)
    base = {**space.base, "C": BaseVar("C", (1,), (c.exps[i],))}
    if "C_in" in base and 1 in base["C_in"].values:
        ci = base["C_in"]
        base["C_in"] = BaseVar("C_in", (1,), (ci.exps[ci.values.index(1)],))
    mono, coef = symbols(space.inst).dp.single_form()
    narrowed = replace(space, base=base,
                       form_caps=[*space.form_caps, ("one shard", mono, coef, 1, 1)],
                       parent=None, _reach={})
    n = sum(count_points(narrowed).values())
    if not n or n > ONE_SHARD_POINTS_LIMIT:
        # (counted, not listed: listing walks the ranges' batches whatever it finds, 31 s for
        # none on benchmarks/instances/scaling-B131072-range.toml, where dp * cp = 1 cannot be)
        return None
    cols = feasible_points(narrowed, dominant_batch=False)
    if not cols or not len(next(iter(cols.values()))):
        return None
    return cols


def dominated_at_one_shard(space: SearchSpace, objective: str) -> frozenset[Knobs]:
    """The combinations of ``space`` whose plans at ``dp * cp = 1`` a ZeRO-1 twin of the solve's
    whole space always beats or matches first (the module docstring), checked on the root
    space's points (every batch of a range) and cached there."""
    root = space.root()         # (the space the solve started from)
    if all(k.dp_sharding == TWIN_MODE for k in space.combos):
        return frozenset()                  # (a ZeRO-1 part: nothing to check, nothing spent)
    # (keyed on what the answer reads: a copy made by dataclasses.replace shares the cache dict
    # but not, when it changes them, these fields)
    key = ("one shard", objective, id(root.base), id(root.constraints), id(root.form_caps),
           id(root.combos), id(root.implications))
    if key not in root._reach:
        root._reach[key] = _dominated(root, objective)
    return frozenset(k for k in space.combos if k in root._reach[key])


def _dominated(root: SearchSpace, objective: str) -> frozenset[Knobs]:
    from formulations.enumerate import evaluate_goals

    index = {k: i for i, k in enumerate(root.combos)}
    pairs = [(k, twin_of(k)) for k in root.combos
             if k.dp_sharding != TWIN_MODE and twin_of(k) in index]
    if not pairs:
        return frozenset()
    cols = one_shard_points(root)
    if cols is None:
        return frozenset()
    probe = replace(root, combos=[x for pair in pairs for x in pair], parent=None, _reach={})
    obj, memory, internode = evaluate_goals(probe, cols, objective)
    out = set()
    for n, (k, twin) in enumerate(pairs):
        a, b = 2 * n, 2 * n + 1                       # k's row, its twin's
        live = np.isfinite(obj[a])                    # where k is a plan that fits
        no_worse = (np.isfinite(obj[b]) & (obj[b] <= obj[a] * (1 + 1e-12))
                    & (memory[b] <= memory[a]) & (internode[b] <= internode[a]))
        first = (index[twin] < index[k]) | (memory[a] > memory[b] + MEMORY_TOLERANCE_BYTES) \
            | (internode[a] > internode_cap(internode[b]))
        if np.all(~live | (no_worse & first)):
            out.add(k)
    return frozenset(out)

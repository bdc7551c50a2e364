"""One result type for every backend (after linopy's ``Result`` / ``Status``).

A backend reports a :class:`RawSolution` in the search space's own terms (base variable values
and a categorical combination); :mod:`formulations.solve` decodes it into a
:class:`~planner.model.plan.Plan`, re-evaluates it with the evaluator and returns a
:class:`SolveResult`. "Stopped at the time limit with a plan" is FEASIBLE, never OPTIMAL.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from planner.model.evaluate import StepReport
from planner.model.plan import Knobs


class Status(str, Enum):
    OPTIMAL = "optimal"                          # proven (CP-SAT OPTIMAL; MILP gap closed)
    FEASIBLE = "feasible"                        # a plan, not proven optimal (time limit)
    INFEASIBLE = "infeasible"                    # proven: no plan satisfies the limits
    NO_SOLUTION_IN_LIMIT = "no_solution_in_limit"
    ERROR = "error"


@dataclass(frozen=True)
class RawSolution:
    """What a backend returns, before decoding."""

    status: Status
    choice: dict[str, int] | None                # base variable -> value
    knobs: Knobs | None                          # the categorical choices of the plan
    objective: float | None                      # seconds (or seconds per sample)
    bound: float | None
    solve_s: float                               # time inside the solver
    build_s: float                               # time to build the solver model
    backend: str
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SolveResult:
    status: Status
    report: StepReport | None
    objective: float | None
    bound: float | None
    wall_s: float
    solve_s: float
    build_s: float
    backend: str
    objective_kind: str
    note: str = ""
    quantum_s: float | None = None
    choice: dict[str, int] | None = None          # the solution in search-space terms
    knobs: Knobs | None = None
    space_points: int | None = None               # structurally feasible degree assignments
    space_combos: int | None = None               # categorical (knob) combinations
    space_plans: int | None = None                # plans: assignments x the combos each admits
    #: the first / last stage shortfall the layouts went up to, and its words (given, or the
    #: search's own: planner/model/plan.py stage_shortfall)
    stage_shortfall: int | None = None
    stage_shortfall_words: str | None = None

    @property
    def proven(self) -> bool:
        """A plan proven optimal, not the best one found when the solve stopped at its time
        limit (``feasible``): what the queries' answers say of themselves."""
        return self.status == Status.OPTIMAL and self.report is not None

    @property
    def gap(self) -> float | None:
        if self.objective is None or self.bound is None:
            return None
        return max(0.0, self.objective - self.bound) / max(abs(self.objective), 1e-30)

    def solver_dict(self) -> dict[str, Any]:
        return {"name": self.backend, "status": self.status.value, "objective": self.objective,
                "objective_kind": self.objective_kind, "bound": self.bound, "gap": self.gap,
                "wall_s": self.wall_s, "solve_s": self.solve_s, "build_s": self.build_s,
                "quantum_s": self.quantum_s, "note": self.note,
                "space": {"assignments": self.space_points, "knob_combinations": self.space_combos,
                          "plans": self.space_plans,
                          "max_stage_shortfall": self.stage_shortfall}}

    def to_dict(self) -> dict[str, Any]:
        out = self.report.to_dict() if self.report else {"plan": None}
        out["solver"] = self.solver_dict()
        return out

"""One domain error type per outcome, each mapped to a process exit code by the CLI.

Why a small hierarchy: the CLI must tell bad input (the user fixes a file) from an infeasible
question (the user changes the cluster or the constraints) from a solver failure, and scripts
branch on the exit code.
"""

from __future__ import annotations


class PlanError(Exception):
    """Base class of every error the CLI reports without a traceback."""

    exit_code = 1


class InputError(PlanError):
    """The instance, a flag or a data file is wrong; the message names the field and what was expected."""

    exit_code = 2

    def __init__(self, message: str, problems: list[str] | None = None):
        super().__init__(message)
        self.problems = problems or []

    def __str__(self) -> str:  # one line per problem, as the CLI prints them
        head = super().__str__()
        return head + "".join(f"\n  - {p}" for p in self.problems)


class InfeasibleError(PlanError):
    """No plan satisfies the limits; ``explanation`` says what binds and by how much."""

    exit_code = 3

    def __init__(self, message: str, explanation: list[str] | None = None):
        super().__init__(message)
        self.explanation = explanation or []

    def __str__(self) -> str:
        head = super().__str__()
        return head + "".join(f"\n  - {p}" for p in self.explanation)


class SolverError(PlanError):
    """A solver failed or is not installed."""

    exit_code = 4

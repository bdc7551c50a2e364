"""Training frameworks: what each one runs and the defaults it applies.

``[constraints] framework`` names the framework the plan will run on. It does two things, both
read from the table below and nowhere else: it restricts the search to what that framework can
run, and it sets the defaults of the settings a framework decides for the user (which overlap
switches are on, in which dtype gradients are reduced, when they are reduced, the reshard
policy of fully sharded parameters). Without it, the search may pick any plan some framework
runs, and the defaults are Megatron-LM's (its command line, not NeMo's recipes).

Each fact carries its source: the framework's argument or config name, checked in its code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

FrameworkName = Literal["megatron", "nemo", "torchtitan", "deepspeed"]
FRAMEWORK_NAMES: tuple[str, ...] = ("megatron", "nemo", "torchtitan", "deepspeed")


@dataclass(frozen=True)
class Framework:
    """One framework's capabilities and defaults (fields are added with the knobs they set)."""

    name: str
    label: str                      # as the user reads it


FRAMEWORKS: dict[str, Framework] = {
    "megatron": Framework("megatron", "Megatron-LM"),
    "nemo": Framework("nemo", "NeMo"),
    "torchtitan": Framework("torchtitan", "torchtitan"),
    "deepspeed": Framework("deepspeed", "DeepSpeed"),
}

#: the framework whose defaults apply when ``[constraints] framework`` is not given
DEFAULT_FRAMEWORK = "megatron"


def framework_of(name: str | None) -> Framework:
    """The framework an instance names, or the default one."""
    return FRAMEWORKS[name or DEFAULT_FRAMEWORK]

"""How ``plan evaluate``'s flags override the instance's ``[plan]``: the one place that turns
a ``[plan]`` and a set of flags (``--tp 8 --recompute full ...``) into the plan to evaluate.

A flag replaces its ``[plan]`` key and is checked as that key is in the file (the schema's
limits and messages, named by the flag). Where a flag makes other ``[plan]`` keys meaningless
they are dropped, each with a note the command prints: a recompute mode other than full drops
the count of fully recomputed layers, a sharding mode without parameter gathering drops FSDP's
reshard switch, a layout string drops the first / last stage counts and the account flags
(and they drop a string), as Megatron-LM refuses the two side by side. A flag that moves the
grid (a degree, ``--nodes``) without ``--dp`` lets ``dp`` and the placement follow from the GPU
count again (:func:`rederive_dp`). The command line only prints (planner/app/cli.py).
"""

from __future__ import annotations

from typing import Any

from planner.model.errors import InputError
from planner.model.words import toml_value

#: the degree flags; any of them makes a plan without a ``[plan]`` section (TP1 PP1 and DP over
#: every GPU is not a question anyone asked, so with none of them one is needed)
DEGREE_FLAGS = ("tp", "pp", "dp", "cp", "ep")


def check_flags(section, values: dict[str, Any]) -> None:
    """Check flag values (None: not given) against the schema of the ``section`` keys they
    override (``--global-batch`` is ``[plan] global_batch``), as a value in the file is checked:
    the same limits (MAX_BATCH, MAX_GPUS, ...; docs/contract.md) and messages, named by the
    flag. Past them a value reaches the model and the solvers, which fail on it (exit 3 or 4)
    or, worse, answer."""
    from pydantic import ValidationError, create_model

    from planner.model.instance import _problems

    given = {k: v for k, v in values.items() if v is not None}
    if not given:
        return
    flags = create_model("Flags", __config__=section.model_config, **{
        k: (section.model_fields[k].annotation, section.model_fields[k]) for k in given})
    try:
        flags.model_validate(given)
    except ValidationError as exc:
        problems = ["--" + key.replace("_", "-") + ":" + msg
                    for key, msg in (line.split(":", 1) for line in _problems(exc))]
        raise InputError(problems[0] if len(problems) == 1 else "invalid options",
                         problems if len(problems) > 1 else None) from None


def check_plan_flags(knobs: dict[str, Any]) -> None:
    """The flags' own values, before any file is read: the enumerated ones, the contradiction
    of ``--distributed-optimizer`` with ``--dp-sharding``, and the schema's bounds on the rest.
    ``knobs``: :func:`planner.model.plan.plan_from_spec`'s overrides, None where not given."""
    from planner.model.frameworks import SHARDING_MODES
    from planner.model.schema import RECOMPUTE_MODES, PlanSpec

    recompute, dp_sharding = knobs["recompute"], knobs["dp_sharding"]
    if recompute is not None and recompute not in RECOMPUTE_MODES:
        raise InputError(f"--recompute: expected one of {', '.join(RECOMPUTE_MODES)}, "
                         f"got \"{recompute}\"")
    if dp_sharding is not None and dp_sharding not in SHARDING_MODES:
        raise InputError(f"--dp-sharding: expected one of {', '.join(SHARDING_MODES)}, "
                         f"got \"{dp_sharding}\"")
    distributed = knobs["distributed_optimizer"]
    if (distributed is not None and dp_sharding is not None
            and (dp_sharding != "none") != distributed):
        # the same rule as [plan] (schema.PlanSpec): the two flags name one choice
        raise InputError(f"--{'' if distributed else 'no-'}distributed-optimizer "
                         f"contradicts --dp-sharding {dp_sharding} (the distributed "
                         "optimizer is any dp_sharding but none); give one of the two")
    # (0 for a stage count or the recomputed layers is the [plan] default, the key left out:
    # an even share, every layer; the schema's bounds are for the counts it names)
    counts = ("first_stage_layers", "last_stage_layers", "recompute_layers")
    check_flags(PlanSpec, {k: (knobs[k] or None) if k in counts else knobs[k]
                           for k in (*DEGREE_FLAGS, "vp", "micro_batch", "global_batch",
                                     "dp_shard_size", "offload_layers", "pipeline_layout",
                                     *counts)})


def plan_with_flags(inst, knobs: dict[str, Any], nodes: int | None = None):
    """The plan ``plan evaluate`` evaluates: the instance's ``[plan]`` with the flags
    ``knobs`` (checked by :func:`check_plan_flags`) over it. Returns ``(spec, plan, notes)``:
    the ``[plan]`` the flags left (the evaluator's ``spec``), the plan, and the notes that say
    what the flags changed beyond their own keys (a re-derived ``dp``, dropped keys). A layout
    the flags and ``[plan]`` leave broken is an input error naming the rule."""
    from planner.model.plan import layout_violations, plan_from_spec
    from planner.model.schema import PlanSpec

    knobs = dict(knobs)
    if inst.spec.plan is None and all(knobs[k] is None for k in DEGREE_FLAGS):
        raise InputError(f"{inst.source}: evaluate needs the plan to evaluate: add a [plan] "
                         "section (tp, pp, micro_batch, ...; see the README instance reference) "
                         "or give the degrees as flags (--tp, --pp, --dp, --cp), or use plan "
                         "solve for the best plan")
    spec = inst.spec.plan if inst.spec.plan is not None else PlanSpec()
    sharding_flag = f"--dp-sharding {knobs['dp_sharding']}"   # (the flag given, for notes)
    if knobs["distributed_optimizer"] is not None and knobs["dp_sharding"] is None:
        on = knobs["distributed_optimizer"]
        knobs["dp_sharding"] = "optim" if on else "none"
        sharding_flag = f"--{'' if on else 'no-'}distributed-optimizer"
    drops = []              # the [plan] keys a flag replaces, each with a note
    if (knobs["recompute"] not in (None, "full") and knobs["recompute_layers"] is None
            and spec.recompute_layers):
        # a count of fully recomputed layers means nothing under another mode: the flag
        # replaces the [plan] mode, so it replaces the count with it
        drops.append(f"--recompute {knobs['recompute']} drops [plan] recompute_layers = "
                     f"{spec.recompute_layers} (a count of layers recomputed in full)")
        knobs["recompute_layers"] = 0
    if (knobs["dp_sharding"] not in (None, "optim_grads_params")
            and knobs["reshard_after_forward"] is None and spec.reshard_after_forward):
        # likewise FSDP's reshard switch under a mode the flag sets that gathers no parameters
        drops.append(f"{sharding_flag} drops [plan] reshard_after_forward = true (FSDP's, "
                     "optim_grads_params only)")
        knobs["reshard_after_forward"] = False
    layout_flags = [f"--{k.replace('_', '-')}" for k in
                    ("first_stage_layers", "last_stage_layers", "account_for_embedding",
                     "account_for_loss") if knobs[k]]
    pipeline_layout = knobs.pop("pipeline_layout")
    if pipeline_layout is not None:
        # the string sets the whole split: it replaces [plan]'s other layout keys (and its own
        # string), as Megatron-LM refuses the two side by side
        if layout_flags:
            raise InputError(f"--pipeline-layout and {' '.join(layout_flags)}: the layout "
                             "string sets the whole split (Megatron-LM refuses the two side "
                             "by side); give one")
        keys = [k for k in ("first_stage_layers", "last_stage_layers",
                            "account_for_embedding", "account_for_loss", "vp")
                if getattr(spec, k) and k in spec.model_fields_set
                and not (k == "vp" and knobs["vp"] is not None)]
        if keys:
            drops.append(f"--pipeline-layout drops [plan] {', '.join(keys)} (the string "
                         "sets the split and the virtual stages)")
        kept = {k: v for k, v in spec.model_dump(exclude_unset=True).items()
                if k not in keys and k != "pipeline_layout"}
        spec = PlanSpec(**kept, pipeline_layout=pipeline_layout)
    elif layout_flags and spec.pipeline_layout:
        # a layout string sets the whole split: the flags replace it, as Megatron-LM refuses
        # the two side by side
        drops.append(f"{' '.join(layout_flags)} drops [plan] pipeline_layout = "
                     f"{toml_value(spec.pipeline_layout)} (the flags set the split; vp is [plan] vp "
                     "or --vp)")
        spec = spec.model_copy(update={"pipeline_layout": None})
    dropped = "; ".join(drops) or None
    spec, rederived = rederive_dp(spec, inst, {k: knobs[k] for k in ("tp", "pp", "cp", "ep")},
                                  knobs["dp"], nodes,
                                  batch_flags=(knobs["micro_batch"], knobs["global_batch"]))
    plan = plan_from_spec(inst, spec, **knobs)
    bad_layout = layout_violations(inst, plan)
    if bad_layout:
        raise InputError("[plan]: " + "; ".join(bad_layout) + " (the flags --first-stage-"
                         "layers, --last-stage-layers, --account-for-embedding, "
                         "--account-for-loss and --recompute-layers override [plan]"
                         + (f"; {dropped}" if dropped else "") + ")")
    return spec, plan, [said for said in (rederived, dropped) if said]


def rederive_dp(spec, inst, flags: dict[str, int | None], dp: int | None, nodes,
                batch_flags: tuple = ()):
    """A ``[plan]`` whose degrees a flag changes (``--tp 8``), or whose GPU count ``--nodes``
    changes, without ``--dp``: its ``dp`` and placement (``*_intra``) were the old grid's,
    so they follow from the GPU count again, as in a ``[plan]`` that leaves them out, and a
    shard group that was the whole of the old dp stays the whole of the new one. Its
    ``micro_batches`` (a check, which ``plan_spec`` carries) was the old plan's count: any
    flag that moves it (those, ``--dp``, ``--micro-batch``, ``--global-batch``) drops it.
    Returns the spec and what changed (None: nothing), for a note."""
    moved = any(v is not None for v in (*flags.values(), dp, nodes, *batch_flags))
    if moved and spec.micro_batches is not None:
        spec = spec.model_copy(update={"micro_batches": None})
    changed = [f"--{k} {v}" for k, v in flags.items()
               if v is not None and v != (getattr(spec, k) or 1) and k != "ep"]
    if nodes is not None:
        changed.append(f"--nodes {nodes}")
    if flags["ep"] is not None and flags["ep"] != (spec.ep or 1):
        # (ep is carved out of dp x cp: dp stays, the experts' placement follows the new ep)
        spec = spec.model_copy(update={"ep_intra": None})
    if not changed or dp is not None or spec.dp is None:
        return spec, None
    update: dict[str, Any] = {"dp": None, **{f"{d}_intra": None
                                           for d in ("tp", "cp", "dp", "pp", "ep")}}
    if spec.dp_shard_size in (None, spec.dp):
        update["dp_shard_size"] = None
    degrees = {k: v if v is not None else (getattr(spec, k) or 1) for k, v in flags.items()}
    model = degrees["tp"] * degrees["pp"] * degrees["cp"]
    return spec.model_copy(update=update), (
        f"{' '.join(changed)}: dp = {inst.gpus} / (tp*pp*cp) = {inst.gpus} / {model} and the "
        f"placement follow from the GPU count (the [plan] gave dp = {spec.dp}; --dp sets it)")

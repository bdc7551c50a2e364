"""Runs files: measured training runs, each a published plan with the step time it ran at.

Reading one (:func:`load_runs`) checks every key of every run first, each problem named by the
file, the run and the key as the runs file spells it (never a figure from a file with a bad
run); then takes each run as its training code ran it (:func:`as_its_code_ran`: the framework
its ``framework`` key or its ``source`` names, that code's names for the sharding modes and its
defaults where the run states none); and each run becomes the instance it describes
(:func:`run_instance`: its model, its GPU, ``gpus`` = the plan's product, the global batch from
the plan). Validation (validate.py), the calibration (calibration.py), the ranking (ranking.py),
the measured sets of alternatives (alternatives.py) and Megatron-LM's CI memory peaks
(memory_peaks.py) read runs through here, so a run means the same thing to each of them.
"""

from __future__ import annotations

import datetime
import math
import re
from importlib import resources
from pathlib import Path
from typing import Any, get_args

from planner.model.catalog import known_gpus, load_gpu
from planner.model.errors import InputError
from planner.model.frameworks import FRAMEWORKS, OVERLAP_KNOBS
from planner.model.instance import (Instance, key_path, unknown_key_words, parse_instance,
                                     presets, read_toml)
from planner.model.pipeline_layout import shortfalls
from planner.model.plan import plan_from_spec, structural_violations
from planner.model.schema import PlanSpec, Precision
from planner.model.words import toml_value


PLAN_KEYS = set(PlanSpec.model_fields)
#: what a run's ``precision`` may be: ``[training] precision``'s values
PRECISIONS = get_args(Precision)
#: a run's training code -> the framework whose rules and defaults it follows: llm-foundry trains
#: with PyTorch FSDP, the data parallelism of torchtitan (sharding over dp, reduce-scatter after
#: every backward, the fp32 master as the shard)
RUN_FRAMEWORKS = {"llm-foundry": "torchtitan"}
#: a run's training code -> the ``plan.dp_sharding`` names it uses for a mode of this model:
#: llm-foundry's PyTorch FSDP ``SHARD_GRAD_OP``, ZeRO-2 by name ("optim_grads" in a runs file),
#: "unshards [the parameters] before the forward, does not reshard them after the forward, and
#: only reshards them after the backward computation" (torch.distributed.fsdp.ShardingStrategy):
#: parameters sharded at rest and gathered once per micro-batch, FSDP2's ``reshard_after_forward
#: = false``; this model's "optim_grads" keeps whole parameters and gathers none
RUN_SHARDING_NAMES = {"llm-foundry": {"optim_grads": {"dp_sharding": "optim_grads_params",
                                                      "reshard_after_forward": False}}}
#: a run's training code -> the ``[training]`` settings it runs with where the run states none:
#: llm-foundry's MPT computes its loss with flash-attn's fused cross-entropy (``loss_fn``
#: defaults to ``fused_crossentropy``: llmfoundry/models/mpt/modeling_mpt.py @b2a43a1 and
#: @5e85bd6), and Composer's ``amp_fp8`` precision runs Transformer Engine's ``fp8_autocast``
#: over its FP8 linears (torchtitan's rules would take torchao's float8). Each setting is
#: ``(value, the run's precision it applies to, or None for every precision)``
RUN_TRAINING_DEFAULTS = {"llm-foundry": {"fused_cross_entropy": (True, None),
                                         "fp8_library": ("transformer_engine", "fp8")}}
#: llm-foundry's ``fsdp_config.mixed_precision`` (a run's ``config.fsdp_mixed_precision``) ->
#: the gradient reduction dtype: DEFAULT reduces in fp32, PURE in the 16-bit dtype
#: (Composer's FSDP utilities, ``get_mixed_precision``, which llm-foundry's trainer calls)
LLM_FOUNDRY_REDUCE_DTYPE = {"DEFAULT": "fp32", "PURE": "bf16", "FULL": "fp32"}
#: what a run's ``framework`` may name: a framework whose rules the planner applies, or training
#: code that runs under one (:data:`RUN_FRAMEWORKS`)
RUN_FRAMEWORK_NAMES = (*FRAMEWORKS, *RUN_FRAMEWORKS)


#: A run that names no ``framework`` ran the software its ``source`` names, where the source is
#: a framework's own publication: (pattern of ``source``, the training code, whether only on
#: NVIDIA GPUs). Sources, each checked: NVIDIA's performance summaries of NeMo and of its
#: successor Megatron-Bridge, and DGX Cloud's dgxc-benchmarking recipes (NeMo on Megatron-Core:
#: published_runs.toml, their sections), run NeMo's recipes; NVIDIA's MLPerf Training GPT-3
#: implementation is NeMo on Megatron-Core (mlcommons/training_results_v3.1,
#: NVIDIA/benchmarks/gpt3/implementations/pytorch/Dockerfile; v4.1's directories are named
#: ``*_nemo``), which other submitters on NVIDIA GPUs reuse; torchtitan's and llm-foundry's
#: benchmark tables are their own code's, and a source naming DeepSpeed (Megatron-DeepSpeed,
#: BigScience's logs) ran DeepSpeed's engine. Measured on ``shared/published_runs.toml``, whose 30
#: runs state no framework, overlap or gradient dtype: ``plan validate`` 6.9% mean / 24.8% max
#: error costed as Megatron-LM runs, 4.7% / 11.4% with the 11 NVIDIA-sourced runs under NeMo's
#: defaults (README, "Validation").
SOURCE_FRAMEWORKS: tuple[tuple[str, str, bool], ...] = (
    (r"\bNeMo\b|\bMegatron-Bridge\b|\bdgxc-benchmarking\b|\bDGX Cloud\b", "nemo", False),
    (r"\bMLPerf\b", "nemo", True),
    (r"\btorchtitan\b", "torchtitan", False),
    (r"\bllm-foundry\b", "llm-foundry", False),
    (r"\bDeepSpeed\b", "deepspeed", False),
)


def source_framework(run: dict[str, Any]) -> str | None:
    """The training code a run's ``source`` names (:data:`SOURCE_FRAMEWORKS`), or None."""
    source = run.get("source")
    if not isinstance(source, str):
        return None
    for pattern, code, nvidia_only in SOURCE_FRAMEWORKS:
        if re.search(pattern, source) and (not nvidia_only or _on_nvidia(run)):
            return code
    return None


def _on_nvidia(run: dict[str, Any]) -> bool:
    gpu = run.get("gpu")
    return gpu in known_gpus() and load_gpu(gpu).name.startswith("NVIDIA")


def framework_origin(run: dict[str, Any]) -> str | None:
    """Where a run's framework comes from: ``"run"`` (its ``framework`` key), ``"source"``
    (:func:`source_framework`), or None (neither: Megatron-LM's defaults)."""
    if run.get("framework") is not None:
        return "run"
    return "source" if source_framework(run) else None


def run_code(run: dict[str, Any]) -> str | None:
    """The training code a run ran: its ``framework``, else the one its source names
    (:func:`source_framework`), else None."""
    return run.get("framework") or source_framework(run)


def run_framework(run: dict[str, Any]) -> str | None:
    """The framework whose rules and defaults a run follows: its training code
    (:func:`run_code`), :data:`RUN_FRAMEWORKS` mapping code to the framework it runs under;
    None for neither or one the planner does not know (Megatron-LM's defaults)."""
    code = run_code(run)
    framework = RUN_FRAMEWORKS.get(code, code)
    return framework if framework in FRAMEWORKS else None


def default_runs_path() -> Path:
    return Path(str(resources.files("planner").joinpath("data/published_runs.toml")))


def load_runs(path: str | Path | None = None) -> dict[str, Any]:
    p = Path(path) if path else default_runs_path()
    data = read_toml(p, "runs file")
    if "runs" not in data or "models" not in data:
        raise InputError(f"{p}: expected [models.*] tables and [[runs]] entries")
    data = with_preset_models(data)
    # the keys first; then, with every key readable, each run's instance and plan (what the
    # run's keys say, checked as an instance file's are), so that no figure is computed from
    # a file with a bad run, and each problem names the file, the run and its key
    problems = run_problems(data)
    if not problems:
        data = {**data, "runs": [as_its_code_ran(run) for run in data["runs"]]}
        problems = instance_problems(data)
    if problems:
        raise InputError(f"{p}: invalid runs file", problems)
    return data


def with_preset_models(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with a ``[models.<name>]`` table ``{preset = name}`` for every preset of the
    catalog (planner/data/presets.toml) a run names as its ``model`` and the file defines no
    table for: a run may name a shipped model as an instance's ``preset`` does. A table of
    the file always wins; a file whose tables are malformed is left to :func:`run_problems`."""
    models, runs = data.get("models"), data.get("runs")
    if not isinstance(models, dict) or not isinstance(runs, list):
        return data
    named = {r["model"] for r in runs if isinstance(r, dict) and isinstance(r.get("model"), str)}
    extra = {n: {"preset": n} for n in sorted(named - set(models)) if n in presets()}
    return {**data, "models": {**models, **extra}} if extra else data


def as_its_code_ran(run: dict[str, Any]) -> dict[str, Any]:
    """``run`` as its training code ran it, in this model's keys: its plan's sharding named as
    this model names the mode (:data:`RUN_SHARDING_NAMES`: llm-foundry's SHARD_GRAD_OP, which a
    runs file may write ``dp_sharding = "optim_grads"``) unless the run says how the
    parameters are resharded itself, and the code's own settings where the run states none
    (:data:`RUN_TRAINING_DEFAULTS`; llm-foundry's gradient dtype from the run's
    ``config.fsdp_mixed_precision``). Any other run as it is; a stated key always wins."""
    code = run_code(run)
    plan = run.get("plan")
    names = RUN_SHARDING_NAMES.get(code, {})
    sharding = plan.get("dp_sharding") if isinstance(plan, dict) else None
    if isinstance(sharding, str) and sharding in names and "reshard_after_forward" not in plan:
        run = {**run, "plan": {**plan, **names[sharding]}}
    training = run.get("training", {})
    added = {}
    for key, (value, precision) in RUN_TRAINING_DEFAULTS.get(code, {}).items():
        if key not in training and precision in (None, run.get("precision")):
            added[key] = value
    mixed = run.get("config", {}).get("fsdp_mixed_precision") if code == "llm-foundry" else None
    if isinstance(mixed, str) and mixed in LLM_FOUNDRY_REDUCE_DTYPE \
            and "grad_reduce_dtype" not in training:
        added["grad_reduce_dtype"] = LLM_FOUNDRY_REDUCE_DTYPE[mixed]
    return {**run, "training": {**training, **added}} if added else run


def instance_problems(data: dict[str, Any]) -> list[str]:
    """What is wrong with the instance and the plan each run describes (:func:`run_instance`,
    :func:`plan_from_spec`), each problem as ``run <id>: <key>: ...`` in the runs file's keys,
    and a plan that breaks a structural rule (:func:`structural_violations`: no such plan
    runs, so no step time was measured on it). A plan the model says does not fit in memory
    stays a run: the measurement says it ran, and the model is what is judged."""
    out = []
    for run in data["runs"]:
        try:
            inst = run_instance(data, run)
            plan = plan_from_spec(inst, inst.spec.plan)
        except InputError as exc:
            out += [f"run {run['id']}: {p}" for p in run_error_problems(exc, run)]
            continue
        broken = structural_violations(inst, plan, inst.spec.plan)
        if broken:
            out.append(f"run {run['id']}: plan breaks "
                       f"{'a structural rule' if len(broken) == 1 else 'structural rules'} "
                       f"(no such plan can run): "
                       f"{'; '.join(in_run_words(b, run) for b in broken)}")
    return out


#: the keys of a [[runs]] entry (docs/contract.md, "Runs files"): what the planner reads, and what it
#: carries as provenance (``source``, ``reported``, ``note``, ``assumed``, ``config``)
RUN_KEYS = ("id", "model", "gpu", "precision", "plan", "measured_step_time_s", "training",
            "framework", "code_date", "held_out", "source", "reported", "note", "assumed",
            "config")


#: the keys every run must give, the ones that hold text and the ones that hold a table
RUN_REQUIRED = ("model", "gpu", "precision", "plan", "measured_step_time_s")
RUN_TEXT_KEYS = ("model", "gpu", "precision", "framework", "held_out", "source", "reported",
                 "note", "assumed")
RUN_TABLE_KEYS = ("plan", "training", "config")


def run_problems(data: dict[str, Any]) -> list[str]:
    """What is wrong with the runs of a runs file, each named by the run's id and key (the
    per-run plan and instance keys are checked when the run is evaluated)."""
    out, seen = [], set()
    if not isinstance(data["runs"], list) or not isinstance(data["models"], dict):
        return ["expected [models.*] tables and [[runs]] entries"]
    out += [f"models.{name}: expected a table of [model] keys, got {toml_value(m)}"
            for name, m in data["models"].items() if not isinstance(m, dict)]
    for i, run in enumerate(data["runs"]):
        if not isinstance(run, dict):
            out.append(f"runs[{i}]: expected a [[runs]] table, got {toml_value(run)}")
            continue
        rid = run.get("id")
        if not isinstance(rid, str) or not rid:
            out.append(f"runs[{i}].id: expected a name (a non-empty string)")
            rid = f"#{i}"
        elif rid in seen:
            out.append(f"run {rid}: id given twice (each run's id names one run)")
        seen.add(rid)
        unknown = sorted(set(run) - set(RUN_KEYS))
        if unknown:
            out.append(f"run {rid}: unknown key{'s' if len(unknown) > 1 else ''} "
                       f"{', '.join(unknown)}; expected among {', '.join(RUN_KEYS)}")
        missing = [k for k in RUN_REQUIRED if k not in run]
        if missing:
            out.append(f"run {rid}: missing {', '.join(missing)} (every run says its model, GPU, "
                       "precision, plan and measured step time)")
        wrong = [f"{k} = {toml_value(run[k])}: expected {what}"
                 for keys, what, kind in ((RUN_TEXT_KEYS, "a string", str),
                                          (RUN_TABLE_KEYS, "a table", dict))
                 for k in keys if k in run and not isinstance(run[k], kind)]
        if wrong:
            out.append(f"run {rid}: " + "; ".join(wrong))
            continue                    # (the checks below read these keys)
        # a key the run states twice, as its own and in its training table: the instance would
        # take the table's while the table of results shows the run's (never guess which)
        for own, key in (("precision", "precision"), ("plan.global_batch", "global_batch")):
            section, _, name = own.rpartition(".")
            given = run.get(section, {}) if section else run
            if name in given and key in run.get("training", {}):
                out.append(f"run {rid}: {own} = {toml_value(given[name])} and training.{key} = "
                           f"{toml_value(run['training'][key])} both set the {key.replace('_', ' ')}"
                           f"; keep {own} (drop training.{key})")
        t = run.get("measured_step_time_s")
        if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float))
                              or not math.isfinite(t) or t <= 0):
            out.append(f"run {rid}: measured_step_time_s: expected a positive number of "
                       f"seconds, got {toml_value(t)}")
        framework = run.get("framework")
        if framework is not None and framework not in RUN_FRAMEWORK_NAMES:
            # (an unknown name would be evaluated under no framework's rules, without a word)
            out.append(f"run {rid}: framework = {toml_value(framework)} is not one the planner knows; "
                       f"expected one of: {', '.join(RUN_FRAMEWORK_NAMES)}")
        bad_date = code_date_problem(run.get("code_date"))
        if bad_date:
            out.append(f"run {rid}: {bad_date}")
        precision = run.get("precision")
        if precision is not None and precision not in PRECISIONS:
            out.append(f"run {rid}: precision = {toml_value(precision)}: expected one of "
                       f"{', '.join(map(toml_value, PRECISIONS))}")
        gpu = run.get("gpu")
        if gpu is not None and gpu not in known_gpus():
            out.append(f"run {rid}: gpu = {toml_value(gpu)} is not in the catalog; expected one of: "
                       f"{', '.join(known_gpus())}")
        model = run.get("model")
        if model is not None and model not in data["models"]:
            out.append(f"run {rid}: model = {toml_value(model)} is not one of the file's [models.*] "
                       f"tables nor a shipped preset ({', '.join(sorted(presets()))})")
    return out


#: an instance key a run's own key fills (:func:`run_instance`) -> that key, as the runs file
#: writes it (``model.*`` is the run's ``[models.<name>]`` table, set per run)
RUN_WORDS = {"training.precision": "precision", "training.global_batch": "plan.global_batch",
             "cluster.gpus": "the run's GPU count (plan.tp * plan.pp * plan.dp * plan.cp)",
             "cluster.gpu": "gpu", "constraints.framework": "framework",
             # (set from the run's cp, to search context parallelism up to it)
             "constraints.max_cp": "plan.cp"}


def in_run_words(problem: str, run: dict[str, Any]) -> str:
    """A problem of the instance a run describes (:func:`run_instance`), with the instance's
    key paths put back as the runs file's own keys (:data:`RUN_WORDS`; ``model.layers`` is
    ``models.<name>.layers``; ``plan.*`` and ``training.*`` are the run's own)."""
    out = problem.removeprefix("<file>: ")
    for key, words in RUN_WORDS.items():
        out = re.sub(rf"(?<![\w.]){re.escape(key)}(?![\w])", words, out)
    models = f"models.{run.get('model')}"
    out = re.sub(r"(?<![\w.])model\.(?=[A-Za-z_\"'])", models + ".", out)
    return re.sub(r"^model(?=: )", models, out)


def run_error_problems(exc: InputError, run: dict[str, Any]) -> list[str]:
    """The problems of an :class:`InputError` raised while building a run's instance or plan,
    in the runs file's words, without the run's name (the caller puts it)."""
    rid = run.get("id", "?")
    lines = exc.problems or [str(exc.args[0]).removeprefix(f"run {rid}: ")]
    # (once in the run's words, two instance keys filled from one run key say the same thing)
    return list(dict.fromkeys(in_run_words(p, run) for p in lines))


#: the [plan] keys of an uneven pipeline layout (planner/model/schema.py PlanSpec)
LAYOUT_KEYS = {"first_stage_layers", "last_stage_layers", "account_for_embedding",
               "account_for_loss", "pipeline_layout"}


def run_instance(data: dict[str, Any], run: dict[str, Any],
                 overrides: dict[str, float] | None = None) -> Instance:
    """The instance a published run describes (``overrides`` patch ``[cluster]``, for calibration)."""
    rid = run.get("id", "?")
    try:
        model = dict(data["models"][run["model"]])
        plan = dict(run["plan"])
    except KeyError as exc:
        raise InputError(f"run {rid}: missing {exc}") from None
    # an unknown key first, as in an instance file (a misspelt tp also makes tp "missing"),
    # with the [plan] key it likely meant
    problems = [f"{key_path(('plan', k), key_last=True)}: {unknown_key_words(('plan', k))}"
                for k in sorted(set(plan) - PLAN_KEYS, key=str)]
    missing = [f"plan.{k}" for k in ("tp", "pp", "dp", "global_batch") if k not in plan]
    missing += [k for k in ("precision", "gpu", "measured_step_time_s") if k not in run]
    if missing:        # a run must say its GPU count (tp*pp*dp*cp), batch and what it measured
        problems.append("missing " + ", ".join(missing))
    problems += [f"plan.{k} = {toml_value(plan[k])}: expected a positive whole number (the "
                 "run's GPU count is tp * pp * dp * cp)" for k in ("tp", "pp", "dp", "cp")
                 if k in plan and (not isinstance(plan[k], int) or isinstance(plan[k], bool)
                                   or plan[k] <= 0)]
    if problems:
        raise InputError(f"run {rid}: invalid run", [in_run_words(p, run) for p in problems])
    gpus = plan["tp"] * plan["pp"] * plan["dp"] * plan.get("cp", 1)
    code_date(run)                       # (checked with every run, ranked or not)
    # a run on one of the frameworks the planner knows runs under its rules and defaults
    framework = run_framework(run)
    cons = {"framework": framework} if framework else {}
    inst = {
        "model": model,
        "training": {"global_batch": plan["global_batch"], "precision": run["precision"],
                     **run.get("training", {})},
        "cluster": {"gpu": run["gpu"], "gpus": gpus, **(overrides or {})},
        "constraints": cons,
        "plan": plan,
    }
    if plan.get("cp", 1) > 1:
        # a context-parallel run: its ranking searches context parallelism up to its own cp
        # (the schema's default keeps it off)
        inst["constraints"] = {**inst["constraints"], "max_cp": plan["cp"]}
    if not LAYOUT_KEYS & set(plan):
        # a run that split its layers evenly is searched with even splits: its feature set
        # (Megatron-LM gained uneven first / last stages in 2024, after most of these runs),
        # as the ranking pins its recompute mode and overlaps
        inst["constraints"] = {**inst["constraints"], "max_stage_shortfall": 0}
    try:
        parsed = parse_instance(inst, f"run {rid}")
    except InputError as exc:            # (in the runs file's keys, not the instance's)
        raise InputError(f"run {rid}: invalid run", run_error_problems(exc, run)) from None
    short = 0
    if isinstance(plan.get("pipeline_layout"), str):
        # (a layout string: its first and last virtual stages' shortfalls; one that does not
        # parse is reported with the plan's other errors)
        try:
            short = max(shortfalls(plan["pipeline_layout"]))
        except ValueError:
            short = 0
    elif plan["pp"] > 2 and {"first_stage_layers", "last_stage_layers"} <= set(plan):
        # an uneven split is searched with stages as short as the run's own (DeepSeek-V3's 61
        # layers on 16 stages: 3, 14 x 4, 2), not only the default's one layer short
        middle = (parsed.model.layers - plan["first_stage_layers"]
                  - plan["last_stage_layers"]) / (plan["pp"] - 2)
        short = max(middle - plan["first_stage_layers"], middle - plan["last_stage_layers"])
    if "max_stage_shortfall" not in inst["constraints"]:
        # (stated, not left to the search's default, which adapts to the layer count: an
        # uneven run's ranking space goes one layer short, or as short as the run's own)
        k = max(1, int(short)) if float(short).is_integer() else 1
        inst["constraints"] = {**inst["constraints"], "max_stage_shortfall": k}
        parsed = parse_instance(inst, f"run {rid}")
    return parsed


def held_out(run: dict[str, Any]) -> str | None:
    """A run's ``held_out`` reason: such a run is evaluated, predicted out of sample and ranked,
    but it is not fitted and not counted in the error bounds (its plan uses what the model
    cannot yet write; the reason says what)."""
    reason = run.get("held_out")
    if reason is not None and not (isinstance(reason, str) and reason.strip()):
        raise InputError(f"run {run.get('id', '?')}: held_out must be a reason (a string)")
    return reason


#: Settings that change a run's cost and that a run may leave unstated: the planner then takes
#: them from the run's ``framework``, or from Megatron-LM's command-line defaults when it names
#: none (the four overlaps off but the p2p one with interleaving, gradients reduced in fp32,
#: fp32 optimizer states; planner/model/frameworks.py). NVIDIA's recipes differ on all of these
#: (published_runs.toml's header), so a run written without them is costed as a Megatron-LM
#: run, and ``plan validate`` says how many runs that concerns.
UNSTATED_KEYS = ("framework", *OVERLAP_KNOBS, "grad_reduce_dtype", "optimizer_dtype")


def unstated(run: dict[str, Any]) -> list[str]:
    """The keys of :data:`UNSTATED_KEYS` a run does not state (``framework`` at the top,
    the overlaps in ``plan``, the dtypes in ``training``); the expert all-to-all overlap only
    where the plan has expert parallelism (there is nothing else for it to overlap)."""
    plan, training = run.get("plan", {}), run.get("training", {})
    return [k for k in UNSTATED_KEYS
            if k not in (run if k == "framework" else plan if k in OVERLAP_KNOBS else training)
            and (k != "overlap_moe_expert_parallel_comm" or plan.get("ep", 1) > 1)]


def source_of(run: dict[str, Any]) -> str:
    """The source a run comes from: its publication or benchmark release. ``source`` up to its
    version (``"MLPerf Training v3.1 n512"`` -> ``"MLPerf Training v3.1"``; the configuration
    after the version is one setting of one campaign), else the paper in the id prefix
    (``narayanan21-1.7b`` -> ``narayanan21``)."""
    src = run.get("source")
    if src:
        m = re.match(r"^(.*?\bv[\d.]+)", src)
        return m.group(1) if m else src
    return str(run.get("id", "?")).split("-")[0]


def code_date(run: dict[str, Any]) -> str | None:
    """The run's ``code_date`` (``YYYY-MM-DD`` or ``YYYY-MM``), None when not given (today's
    features)."""
    date = run.get("code_date")
    problem = code_date_problem(date)
    if problem:
        raise InputError(f"run {run.get('id', '?')}: {problem}")
    return date


def code_date_problem(date: Any) -> str | None:
    """What is wrong with a ``code_date`` value (None: nothing, or not given). It must be a
    calendar date: the ranking compares it as text with the feature dates, where a well-formed
    impossible one (``2023-02-30``, ``2023-13``) would pass unnoticed."""
    if date is None:
        return None
    if isinstance(date, str) and re.fullmatch(r"\d{4}-\d{2}(-\d{2})?", date):
        try:
            datetime.date.fromisoformat(date if len(date) == 10 else date + "-01")
            return None
        except ValueError:
            return f"code_date = {toml_value(date)} is not a calendar date (YYYY-MM-DD or YYYY-MM)"
    return f"code_date must be a date, YYYY-MM-DD or YYYY-MM, got {toml_value(date)}"

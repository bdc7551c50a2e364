"""Validation against measured training runs, and the per-GPU-type calibration.

The shipped set (``planner/data/published_runs.toml``) is the copy of ``shared/published_runs.toml``
with each run's source. Every run becomes an instance (its model, its GPU, ``gpus`` = the plan's
product, global batch from the plan) and its published plan is evaluated; the prediction error is
``predicted / measured - 1``.

Calibration fits one small set of physical parameters per GPU type, nothing per run: the GEMM
size curve ``eff = efficiency * M/(M + gemm_knee_tokens) * N/(N + kw) * K/(K + kw)``
(``kw = gemm_knee_width``, see :func:`planner.model.terms.step_terms`; the two knees shared by
every GPU type, the asymptote per type) by minimising the mean absolute error over the 16-bit
runs on a grid, then ``efficiency_fp8`` the same way over each type's FP8 runs. Each run is
evaluated once over the whole grid (the evaluator runs on numpy arrays), so refitting without
a source (:func:`out_of_sample`) costs a table lookup.

Out of sample: each run's error with the parameters fitted without every run of its *source*
(the publication or benchmark release, :func:`source_of`). Ranking: the published plan's
predicted step time over the model's optimum in the run's own knob space (:func:`ranking`).
"""

from __future__ import annotations

import datetime
import math
import re
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any, get_args

import numpy as np

from planner.model.catalog import known_gpus, load_gpu
from planner.model.errors import InfeasibleError, InputError
from planner.model.evaluate import StepReport, evaluate
from planner.model.frameworks import FRAMEWORKS, OVERLAP_KNOBS, kernel_stack
from planner.model.instance import (Instance, key_path, unknown_key_words, parse_instance,
                                     presets, read_toml)
from planner.model.pipeline_layout import shortfalls
from planner.model.plan import Plan, plan_from_spec, structural_violations
from planner.model.schema import PlanSpec, Precision
from planner.model.words import toml_value
from planner.model.terms import step_terms

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


@dataclass
class RunResult:
    id: str
    gpu: str
    precision: str
    gpus: int
    measured_s: float
    report: StepReport
    source: str
    #: why the run is held out of the calibration and the error bounds (None: it is in them)
    held_out: str | None = None
    #: the source of a run whose GPU type (its fit_key) the catalog fits on that source alone:
    #: fitted, but out of the error bounds (:func:`calibration_only_keys`); None: in them
    calibration_only: str | None = None
    #: the run's FP8 scaling recipe (``[training] fp8_recipe``; None: per-tensor)
    fp8_recipe: str | None = None

    @property
    def label(self) -> str:
        """The precision as the table shows it: ``mxfp8`` for an MXFP8 run."""
        return "mxfp8" if self.fp8_recipe == "mxfp8" else self.precision

    @property
    def predicted_s(self) -> float:
        return self.report.step_time_s

    @property
    def error(self) -> float:
        return self.predicted_s / self.measured_s - 1


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
                       f"seconds, got {t!r}")
        framework = run.get("framework")
        if framework is not None and framework not in RUN_FRAMEWORK_NAMES:
            # (an unknown name would be evaluated under no framework's rules, without a word)
            out.append(f"run {rid}: framework = {framework!r} is not one the planner knows; "
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
            out.append(f"run {rid}: gpu = {gpu!r} is not in the catalog; expected one of: "
                       f"{', '.join(known_gpus())}")
        model = run.get("model")
        if model is not None and model not in data["models"]:
            out.append(f"run {rid}: model = {model!r} is not one of the file's [models.*] "
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
    if short > parsed.spec.constraints.max_stage_shortfall and float(short).is_integer():
        inst["constraints"] = {**inst["constraints"], "max_stage_shortfall": int(short)}
        parsed = parse_instance(inst, f"run {rid}")
    return parsed


def validate_runs(data: dict[str, Any], overrides: dict[str, dict[str, float]] | None = None,
                  only_gpu: str | None = None, alone: dict[str, str] | None = None
                  ) -> list[RunResult]:
    """Evaluate every run's published plan; ``overrides`` maps GPU key -> cluster overrides;
    ``alone``: the calibration-only fit keys (:func:`calibration_only_keys`), none if not
    given."""
    out = []
    singles = alone or {}
    for run in data["runs"]:
        if only_gpu and run["gpu"] != only_gpu:
            continue
        inst = run_instance(data, run, (overrides or {}).get(fit_key(run)))
        plan = plan_from_spec(inst, inst.spec.plan)
        rep = evaluate(inst, plan, spec=inst.spec.plan)
        out.append(RunResult(run["id"], run["gpu"], run["precision"], plan.gpus,
                             float(run["measured_step_time_s"]), rep,
                             run.get("source", run.get("reported", "")), held_out(run),
                             singles.get(fit_key(run)) if held_out(run) is None else None,
                             run.get("training", {}).get("fp8_recipe")))
    return out


def single_source_keys(data: dict[str, Any]) -> dict[str, str]:
    """The parameter sets (:func:`fit_key`) one source alone fits, with that source: those whose
    fitted runs all come from one source, and those one of whose figures rests on one source's
    runs (a fused type's ``attention_efficiency``, fitted on its FP8 runs when some reach
    :data:`LONG_SEQ`: when those long runs come from one source, a fit without it has no
    attention figure of its own)."""
    sources: dict[str, set[str]] = {}
    long_sources: dict[str, set[str]] = {}
    for run in data["runs"]:
        if held_out(run) is None:
            key = fit_key(run)
            sources.setdefault(key, set()).add(source_of(run))
            if _fits_attention(data, run):
                long_sources.setdefault(key, set()).add(source_of(run))
    out = {k: next(iter(s)) for k, s in sources.items() if len(s) == 1}
    for k, s in long_sources.items():
        if k not in out and len(s) == 1:
            out[k] = f"its attention figure: {next(iter(s))}"
    return out


def _fits_attention(data: dict[str, Any], run: dict[str, Any]) -> bool:
    """A fitted fused FP8 run long enough (:data:`LONG_SEQ`) to fit its type's attention figure."""
    return (stack_of(run) == "fused" and run["precision"] == "fp8" and held_out(run) is None
            and seq_len(data, run) >= LONG_SEQ)


def catalog_figures(key: str) -> dict[str, float | None]:
    """The catalog's figures of a fit key: a GPU type's main ones, or ``gpu:stack``'s."""
    gpu_key, _, stack = key.partition(":")
    gpu = load_gpu(gpu_key)
    src = gpu.kernel_stacks[stack] if stack else gpu
    return {f: getattr(src, f, None) for f in ("efficiency", "efficiency_fp8",
                                                "gemm_knee_tokens", "gemm_knee_width",
                                                "attention_efficiency")}


def calibration_only_keys(data: dict[str, Any], cal: Calibrator | None = None
                          ) -> dict[str, str]:
    """The fit keys whose catalog figures are the fit of one source's runs alone, with that
    source: the keys of :func:`single_source_keys` where the catalog holds exactly what those
    runs fit (as the shipped runs' B200 and GB200 figures do). Such runs set their type's figures, so
    their in-sample error says how well the figures fit them, not how the model predicts, and a
    fit without their source leaves the type nothing of its own: no out-of-sample error. So
    :func:`summary` keeps them out of the error bounds and reports them apart. The rule follows
    from the sources and the catalog, not from a mark on chosen runs: a second source of the
    type brings them into the bounds, and a runs file the catalog was not fitted on (the same
    type, another source, another fit) keeps them in, their errors then predictions."""
    singles = single_source_keys(data)
    if not singles:
        return {}
    fitted = (cal or Calibrator(data)).fit()
    out = {}
    for key, source in singles.items():
        fit, have = fitted.get(key, {}), catalog_figures(key)
        if fit and all(have.get(f) is not None and abs(have[f] - x) <= 1e-9
                       for f, x in fit.items()):
            out[key] = source
    return out


def held_out(run: dict[str, Any]) -> str | None:
    """A run's ``held_out`` reason: such a run is evaluated, predicted out of sample and ranked,
    but it is not fitted and not counted in the error bounds (its plan uses what the model
    cannot yet write; the reason says what)."""
    reason = run.get("held_out")
    if reason is not None and not (isinstance(reason, str) and reason.strip()):
        raise InputError(f"run {run.get('id', '?')}: held_out must be a reason (a string)")
    return reason


def summary(results: list[RunResult]) -> dict[str, float | None]:
    """Mean and max |error| over the runs in the bounds: neither held out (``held_out`` counts
    them) nor calibration-only (``calibration_only``, :func:`calibration_only_keys`); the
    held-out runs' own mean and max, when there are any: never fitted, they are what the
    model predicts for runs it has not seen; and the calibration-only runs' (in sample)."""
    errs = [abs(r.error) for r in results if r.held_out is None and r.calibration_only is None]
    mean, top = mean_max(errs)
    out = {"runs": len(errs), "mean_abs_error": mean, "max_abs_error": top,
           "held_out": sum(r.held_out is not None for r in results)}
    alone = [abs(r.error) for r in results if r.calibration_only is not None]
    if alone:
        out["calibration_only"] = len(alone)
        out["mean_abs_error_calibration_only"], out["max_abs_error_calibration_only"] = \
            mean_max(alone)
    unseen = [abs(r.error) for r in results if r.held_out is not None]
    if unseen:
        out["mean_abs_error_held_out"], out["max_abs_error_held_out"] = mean_max(unseen)
    return out


def mean_max(errs: list[float]) -> tuple[float | None, float | None]:
    """The mean and the max of some |errors|, both None without any: a runs file may hold out
    every run (only predictions, nothing fitted), and then there is no error bound to state."""
    if not errs:
        return None, None
    return sum(errs) / len(errs), max(errs)


#: The calibration grid: the asymptotic GEMM efficiency and the two knees of the size curve.
EFF_GRID = np.round(np.arange(0.30, 1.0 + 1e-9, 0.0025), 4)
KNEE_TOKENS_GRID = np.arange(0.0, 1024.0 + 1, 128.0)
KNEE_WIDTH_GRID = np.arange(0.0, 2048.0 + 1, 64.0)


#: The grid of a kernel stack's figures (``[kernel_stacks.*]`` in the catalog): the two knees of
#: the GEMM size curve and the attention core's share of the peak (the asymptote is the GPU
#: type's: the best matmul the chip runs, whatever calls it).
STACK_KNEE_TOKENS_GRID = np.arange(0.0, 4096.0 + 1, 128.0)
ATTENTION_GRID = np.round(np.arange(0.20, 1.0 + 1e-9, 0.01), 4)


def stack_of(run: dict[str, Any]) -> str:
    """The run's kernel stack: its ``[training] kernel_stack``, else the default of the
    framework it runs under (:func:`planner.model.frameworks.kernel_stack`)."""
    tr = run.get("training", {})
    return kernel_stack(tr.get("kernel_stack"), run.get("precision"), tr.get("fp8_recipe"),
                        run_framework(run))


#: A sequence this long (tokens) makes the attention core most of a layer's work: Llama 3 8B at
#: 32K spends 53% of its model FLOPs there, 97.5% at 1M. A fused GPU type's fitted FP8 runs that
#: reach it let :meth:`Calibrator.fit` fit the type's ``attention_efficiency`` beside its FP8
#: asymptote; below it the attention share is too small to tell the two apart, and the core runs
#: at the 16-bit GEMM ``efficiency`` (the rule the held-out H100 long-sequence runs check).
LONG_SEQ = 32768


def seq_len(data: dict[str, Any], run: dict[str, Any]) -> int:
    """The sequence length of a run's model (its ``seq_len``, else its preset's)."""
    model = data["models"][run["model"]]
    if "seq_len" in model:
        return int(model["seq_len"])
    return int(run_instance(data, run).model.seq_len)


def fit_key(run: dict[str, Any]) -> str:
    """Whose parameters a run's error depends on: its GPU type (fused kernels, the catalog's main
    figures) or ``gpu:stack`` (the catalog's ``[kernel_stacks.stack]`` of that GPU type)."""
    stack = stack_of(run)
    return run["gpu"] if stack == "fused" else f"{run['gpu']}:{stack}"


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


def _grid_times(data: dict[str, Any], run: dict[str, Any], fit16: dict[str, float] | None,
                attention: bool = False) -> np.ndarray:
    """Predicted step times of one run over the calibration grid: indexed
    ``[efficiency, knee_tokens, knee_width]`` for a 16-bit run, ``[efficiency_fp8]`` for an FP8
    run (its 16-bit parameters fixed at ``fit16``), ``[efficiency_fp8, attention_efficiency]``
    with ``attention`` (the type's attention figure fitted too)."""
    inst = run_instance(data, run)
    plan = plan_from_spec(inst, inst.spec.plan)
    hw = inst.hw
    if stack_of(run) != "fused":
        # a kernel stack's run: [knee_tokens, knee_width, attention_efficiency] for 16-bit,
        # [efficiency_fp8] for FP8 (its 16-bit figures fixed at fit16)
        if run["precision"] == "fp8":
            f = fit16 or {}
            hw = replace(hw, efficiency_fp8=EFF_GRID,
                         knee_tokens=f.get("gemm_knee_tokens", hw.knee_tokens),
                         knee_width=f.get("gemm_knee_width", hw.knee_width),
                         attention_efficiency=f.get("attention_efficiency",
                                                    hw.attention_efficiency))
        else:
            hw = replace(hw, knee_tokens=STACK_KNEE_TOKENS_GRID[:, None, None],
                         knee_width=KNEE_WIDTH_GRID[None, :, None],
                         attention_efficiency=ATTENTION_GRID[None, None, :])
    elif run["precision"] == "fp8":
        f = fit16 or {}
        e16 = f.get("efficiency", hw.efficiency)
        hw = replace(hw, efficiency=e16,
                     efficiency_fp8=EFF_GRID[:, None] if attention else EFF_GRID,
                     attention_efficiency=(ATTENTION_GRID[None, :] if attention
                                           else hw.attention_efficiency),
                     knee_tokens=f.get("gemm_knee_tokens", hw.knee_tokens),
                     knee_width=f.get("gemm_knee_width", hw.knee_width))
    else:
        hw = replace(hw, efficiency=EFF_GRID[:, None, None],
                     knee_tokens=KNEE_TOKENS_GRID[None, :, None],
                     knee_width=KNEE_WIDTH_GRID[None, None, :])
    terms = step_terms(replace(inst, hw=hw), plan.grid.degrees(), plan.knobs)
    return np.asarray(terms.step_time, dtype=float)


class Calibrator:
    """Fits per GPU type on any subset of the runs; every run is evaluated once per grid."""

    def __init__(self, data: dict[str, Any]):
        self.data = data
        self.runs = data["runs"]
        self.measured = [float(r["measured_step_time_s"]) for r in self.runs]
        self._grid16 = {i: _grid_times(data, r, None) for i, r in enumerate(self.runs)
                        if r["precision"] in ("bf16", "fp16") and stack_of(r) == "fused"}
        self._grid8: dict[tuple, np.ndarray] = {}
        #: the fit keys whose fitted runs come from one source (on the whole file)
        self._one_source = single_source_keys(data)
        # kernel-stack runs: each 16-bit run's |error| over the stack grid (float32), and their
        # sum per GPU type and stack (a fit without a source subtracts that source's runs)
        self._stack_err = {i: np.abs(_grid_times(data, r, None) / self.measured[i] - 1)
                           .astype(np.float32) for i, r in enumerate(self.runs)
                           if r["precision"] in ("bf16", "fp16") and stack_of(r) != "fused"
                           and held_out(r) is None}
        self._stack_total: dict[str, np.ndarray] = {}
        for i, e in self._stack_err.items():
            k = fit_key(self.runs[i])
            self._stack_total[k] = self._stack_total.get(k, 0) + e.astype(np.float64)

    def fit(self, exclude_source: str | None = None) -> dict[str, dict[str, float]]:
        """The grid point minimising the mean |error| (without the runs of ``exclude_source``).

        The knees ``gemm_knee_tokens`` and ``gemm_knee_width`` are one pair for every GPU type
        (the tiling of the GEMM kernels, fitted on all 16-bit runs together: the runs of one GPU
        type, nearly all at tensor-parallel degree 4 or 8, cannot tell a width knee from the
        asymptote, and refitted without one source they could not at all); ``efficiency`` per
        GPU type; then ``efficiency_fp8`` per GPU type on its FP8 runs. A GPU left without 16-bit runs
        gets no fit (the catalog stands); without FP8 runs its FP8 GEMMs are charged the
        16-bit ``efficiency``."""
        keep = [i for i, r in enumerate(self.runs)
                if source_of(r) != exclude_source and held_out(r) is None
                and stack_of(r) == "fused"]
        gpus = sorted({r["gpu"] for r in self.runs if stack_of(r) == "fused"})
        err16 = {}
        for gpu in gpus:
            idx16 = [i for i in keep if self.runs[i]["gpu"] == gpu and i in self._grid16]
            if idx16:
                err16[gpu] = sum(np.abs(self._grid16[i] / self.measured[i] - 1) for i in idx16)
        # per pair of knees: each GPU's best efficiency; the pair with the least total error
        # over the GPU types whose fitted runs come from two sources or more wins (a type with
        # one source, as GB200's runs are, fits its asymptote at the knees the others set: its
        # runs alone cannot tell a knee from the asymptote, nor would a fit without them);
        # the voters are counted on the whole file, so leaving a source out does not change them
        voters = [g for g in err16 if g not in self._one_source] or list(err16)
        total = sum(err16[g].min(axis=0) for g in voters) if err16 else None
        kt, kw = (np.unravel_index(int(np.argmin(total)), total.shape) if total is not None
                  else (0, 0))
        out: dict[str, dict[str, float]] = {}
        for gpu in gpus:
            fit: dict[str, float] = {}
            if gpu in err16:
                e = int(np.argmin(err16[gpu][:, kt, kw]))
                fit = {"efficiency": float(EFF_GRID[e]),
                       "gemm_knee_tokens": float(KNEE_TOKENS_GRID[kt]),
                       "gemm_knee_width": float(KNEE_WIDTH_GRID[kw])}
            idx8 = [i for i in keep if self.runs[i]["gpu"] == gpu
                    and self.runs[i]["precision"] == "fp8"]
            # (FP8 runs that are fitted at all: a type whose FP8 runs are all held out keeps
            # the catalog's FP8 figure, which then comes from elsewhere)
            has_fp8 = any(r["gpu"] == gpu and r["precision"] == "fp8"
                          and stack_of(r) == "fused" and held_out(r) is None
                          for r in self.runs)
            if fit and has_fp8 and not idx8:
                # no FP8 run to fit: FP8 GEMMs are charged the 16-bit efficiency (never a
                # catalog value fitted on the runs left out)
                fit["efficiency_fp8"] = fit["efficiency"]
            if idx8:
                # with runs long enough to tell the attention core from the GEMMs, the type's
                # attention figure is fitted beside its FP8 asymptote (LONG_SEQ)
                attn = any(_fits_attention(self.data, self.runs[i]) for i in idx8)
                key = (tuple(sorted(fit.items())), attn)
                err8 = 0.0
                for i in idx8:
                    if (i, key) not in self._grid8:
                        self._grid8[(i, key)] = _grid_times(self.data, self.runs[i], fit or None,
                                                            attention=attn)
                    err8 = err8 + np.abs(self._grid8[(i, key)] / self.measured[i] - 1)
                if attn:
                    e, a = np.unravel_index(int(np.argmin(err8)), err8.shape)
                    fit["efficiency_fp8"] = float(EFF_GRID[e])
                    fit["attention_efficiency"] = float(ATTENTION_GRID[a])
                else:
                    fit["efficiency_fp8"] = float(EFF_GRID[int(np.argmin(err8))])
            if fit:
                out[gpu] = fit
        out.update(self._fit_stacks(exclude_source))
        return out

    def _fit_stacks(self, exclude_source: str | None) -> dict[str, dict[str, float]]:
        """Per GPU type and kernel stack (key ``gpu:stack``): the grid point of
        ``gemm_knee_tokens``, ``gemm_knee_width`` and ``attention_efficiency`` minimising the
        mean |error| over the stack's 16-bit runs on that GPU type, then ``efficiency_fp8``
        over its FP8 runs (none without FP8 runs to fit). The asymptote ``efficiency`` stays
        the GPU type's (the catalog's): the best matmul is the chip's, the stack sets how far
        from it GEMMs of a given size run, and what the attention kernel reaches."""
        out: dict[str, dict[str, float]] = {}
        runs = self.runs
        for key, total in sorted(self._stack_total.items()):
            err = total
            for i, e in self._stack_err.items():
                if fit_key(runs[i]) == key and source_of(runs[i]) == exclude_source:
                    err = err - e
            n = sum(1 for i in self._stack_err if fit_key(runs[i]) == key
                    and source_of(runs[i]) != exclude_source)
            if not n:
                continue
            kt, kw, a = np.unravel_index(int(np.argmin(err)), err.shape)
            fit = {"gemm_knee_tokens": float(STACK_KNEE_TOKENS_GRID[kt]),
                   "gemm_knee_width": float(KNEE_WIDTH_GRID[kw]),
                   "attention_efficiency": float(ATTENTION_GRID[a])}
            idx8 = [i for i, r in enumerate(runs) if fit_key(r) == key
                    and r["precision"] == "fp8" and held_out(r) is None
                    and source_of(r) != exclude_source]
            if idx8:
                cache = tuple(sorted(fit.items()))
                err8 = 0.0
                for i in idx8:
                    if (i, cache) not in self._grid8:
                        self._grid8[(i, cache)] = _grid_times(self.data, runs[i], fit)
                    err8 = err8 + np.abs(self._grid8[(i, cache)] / self.measured[i] - 1)
                fit["efficiency_fp8"] = float(EFF_GRID[int(np.argmin(err8))])
            out[key] = fit
        return out


def calibrate(data: dict[str, Any]) -> dict[str, dict[str, float]]:
    """The parameters per GPU type fitted on every run (what the catalog records)."""
    return Calibrator(data).fit()


def _overrides(fit: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in fit.items()}


def out_of_sample(data: dict[str, Any], cal: Calibrator | None = None,
                  alone: dict[str, str] | None = None) -> dict[str, float | None]:
    """Per run id: the error with the parameters fitted without every run of its source; None
    for a calibration-only run (:func:`calibration_only_keys`, or ``alone`` when the caller
    has them): without its source its GPU type has no fit, and the catalog's figures are the
    ones fitted on it."""
    cal = cal or Calibrator(data)
    singles = calibration_only_keys(data, cal) if alone is None else alone
    out: dict[str, float | None] = {}
    for src in sorted({source_of(r) for r in data["runs"]}):
        fitted = cal.fit(exclude_source=src)
        runs = [r for r in data["runs"] if source_of(r) == src]
        sub = {"models": data["models"], "runs": runs}
        for run, res in zip(runs, validate_runs(sub, {g: _overrides(f)
                                                      for g, f in fitted.items()})):
            only = held_out(run) is None and fit_key(run) in singles
            out[res.id] = None if only else res.error
    return out


#: Features of Megatron-LM that the ranking's knob space keeps to when a run's code predates
#: them (the run's ``code_date``, the date of the Megatron-LM code it ran; issue 12: "the same
#: feature set as the run had"). Each is the date of the Megatron-LM commit that brought it:
#: - interleaving with pp = 2: commit 3ee489d (2024-05-31, "Enable virtual pipelining ... at
#:   PP=2"); before it, megatron/arguments.py asserted "pipeline-model-parallel size should be
#:   greater than 2 with interleaved schedule" (since 182841f, 2021-03-20);
#: - an overlapped gradient reduction with pipeline parallelism: --overlap-grad-reduce, commit
#:   2d5220a (2023-08-16); before it the only overlapped reduction was PyTorch DDP's
#:   (--DDP-impl torch), which Megatron-LM ran once per step only without pipelining
#:   (megatron/schedules.py @3d718bf: model.no_sync in forward_backward_no_pipelining alone; the
#:   pipelined schedules would all-reduce after every micro-batch), so pp = 1 only.
INTERLEAVE_PP2_SINCE = "2024-05-31"
GRAD_OVERLAP_WITH_PP_SINCE = "2023-08-16"


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
            return f"code_date = {date!r} is not a calendar date (YYYY-MM-DD or YYYY-MM)"
    return f"code_date must be a date, YYYY-MM-DD or YYYY-MM, got {date!r}"


def _before(date: str | None, since: str) -> bool:
    return date is not None and date < since


def run_pins(plan: Plan) -> dict[str, Any]:
    """The ``[constraints]`` that pin a search to what a measured plan ran (the ranking's knob
    space): its recompute mode and recomputed layers, sequence parallelism, data-parallel
    sharding mode (ZeRO-1 is the distributed optimizer) and host offload (the optimizer's as
    it ran, activations up to its layer count), and its overlap switches."""
    return {"recompute": plan.recompute, "recompute_layers": plan.recompute_layers,
            "sequence_parallel": plan.sequence_parallel,
            "dp_sharding": plan.dp_sharding,
            "optimizer_offload": plan.optimizer_offload,
            **({"max_offload_layers": plan.offload_layers} if plan.offload_layers
               else {"offload_layers": 0}),
            **{o: getattr(plan, o) for o in OVERLAP_KNOBS}}


def ranking_spaces(run: dict[str, Any], pins: dict[str, Any]) -> list[dict[str, Any]]:
    """The constraint pins of the knob spaces whose union is the run's ranking space: its own
    pins, and where its code predates the overlapped reduction with pipelining
    (:data:`GRAD_OVERLAP_WITH_PP_SINCE`), PyTorch DDP's overlap at pp = 1 and none with a
    pipeline. (Interleaving at pp = 2, :data:`INTERLEAVE_PP2_SINCE`, is checked on each
    space's optimum by :func:`ranking`.)"""
    if not _before(code_date(run), GRAD_OVERLAP_WITH_PP_SINCE):
        return [pins]
    return [{**pins, "pp": 1, "overlap_grad_reduce": True},
            {**pins, "overlap_grad_reduce": False}]


#: The ranking target of issue 12: a published plan within 10% of the model's optimum.
RANKING_TARGET = 1.10
#: A term whose share of the gap is below this many seconds is left out of ``gap_by_term_s``.
GAP_FLOOR_S = 5e-4


def gap_by_term(published: dict[str, float], optimum: dict[str, float]) -> dict[str, float]:
    """Where a ranking gap lies: per step-time term, the published plan's seconds minus the
    optimum's (positive: the published plan pays more there), largest first, terms that differ
    by less than :data:`GAP_FLOOR_S` left out. The terms are the evaluator's breakdown, so
    they sum to ``published_s - optimum_s`` (up to the floor) and tell a reader which physics
    the ranking rests on (README.md, "Validation")."""
    diff = {k: published[k] - optimum[k] for k in published}
    return {k: v for k, v in sorted(diff.items(), key=lambda kv: -abs(kv[1]))
            if abs(v) >= GAP_FLOOR_S}


#: the time limit of each solve of a ranking space
RANKING_TIME_LIMIT_S = 60.0


def solve_pinned(free: Instance, update: dict[str, Any], solver: str = "cpsat",
                 time_limit: float | None = RANKING_TIME_LIMIT_S):
    """The optimum of ``free`` (an instance without a ``[plan]``) with ``update`` pinned in its
    ``[constraints]`` (:func:`run_pins`, :func:`ranking_spaces`), and None with the reason
    when no plan satisfies them: the ranking's solve, and the measured sets' optimum's."""
    from formulations.solve import solve

    cons = free.spec.constraints.model_copy(update=update)
    try:
        return solve(free.with_spec(constraints=cons), solver=solver, time_limit=time_limit,
                     explain="brief"), None
    except InfeasibleError as exc:
        return None, str(exc)


def ranking(data: dict[str, Any], solver: str = "cpsat",
            time_limit: float | None = RANKING_TIME_LIMIT_S) -> dict[str, dict[str, Any]]:
    """Per run id: the model's optimum in the run's own knob space and the published plan's
    predicted step time over it (``ratio`` >= 1; 1 = the experts' plan is the model's optimum).

    The knob space pins what the run pinned: recompute mode (and its recomputed layers per
    virtual stage, 0 for every one: partial recompute is another mode), sequence parallelism, the
    data-parallel sharding mode, optimizer offload, activation offload (searched up to the run's
    layer count, off for a run without it), the overlap switches, precision and attention kernel
    (``[training]``), the GPU count and the global batch; degrees, interleaving and
    micro-batch are free within the default caps, and within what the run's code could run
    (``code_date``: :func:`ranking_spaces`; no interleaving at pp = 2 before
    :data:`INTERLEAVE_PP2_SINCE`: a space whose optimum has it is split into vp = 1 and
    each pp >= 3)."""
    def best_of(free: Instance, updates: list[dict[str, Any]]):
        found, notes = [], []
        for upd in updates:
            res, why = solve_pinned(free, upd, solver, time_limit)
            found += [res] if res is not None else []
            notes += [why] if why is not None else []
        return found, notes

    out: dict[str, dict[str, Any]] = {}
    for run in data["runs"]:
        inst = run_instance(data, run)
        plan = plan_from_spec(inst, inst.spec.plan)
        pub_report = evaluate(inst, plan, spec=inst.spec.plan)
        published = pub_report.step_time_s
        pins = run_pins(plan)
        free = inst.with_spec(plan=None)
        found, notes = [], []
        for upd in ranking_spaces(run, pins):
            got, why = best_of(free, [upd])
            notes += why
            res = got[0] if got else None
            if (res and res.report and _before(code_date(run), INTERLEAVE_PP2_SINCE)
                    and res.report.plan.vp > 1 and res.report.plan.pp == 2):
                # interleaving at pp = 2, which the run's code refused: the space without
                # it is vp = 1 or pp >= 3 (pp dividing the GPUs, and the layers when split
                # evenly)
                even = not LAYOUT_KEYS & set(run["plan"])
                pps = [q for q in range(3, plan.gpus + 1) if plan.gpus % q == 0
                       and (not even or inst.model.layers % q == 0)]
                got, why = best_of(free, [{**upd, "vp": 1}] + [{**upd, "pp": q} for q in pps])
                notes += why
            found += got
        found = [r for r in found if r.report]
        if not found:
            out[run["id"]] = {"optimum_s": None, "ratio": None, "note": "; ".join(notes)}
            continue
        res = min(found, key=lambda r: r.report.step_time_s)
        best = res.report.step_time_s
        status = ("optimal" if all(r.proven for r in found)
                  else res.status.value)
        out[run["id"]] = {"optimum_s": best, "published_s": published,
                          "ratio": published / best if best else None,
                          "optimum_plan": res.report.plan.label(),
                          "status": status,
                          # how close each plan runs to the memory limit: an optimum that beats
                          # the experts' plan at a sliver of headroom is read with that in mind
                          "optimum_headroom_gib": res.report.memory_gib["headroom"],
                          "published_headroom_gib": pub_report.memory_gib["headroom"],
                          "gap_by_term_s": gap_by_term(pub_report.breakdown_s,
                                                       res.report.breakdown_s)}
    return out

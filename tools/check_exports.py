"""Feed every shipped instance's launch exports to the frameworks' own parsers and validators.

Not part of the default test run: it needs the frameworks installed, which the planner does
not depend on. For each ``instances/*.toml`` it takes the instance's ``[plan]`` and the proven
optimum (``--solver``, default ``enumerate``), writes the four exports with
``planner.app.emit.emit`` and checks them; then, for each format, the optimum that
``plan solve FILE --emit FMT`` searches for (``[constraints] framework = FMT``: that
framework's rules and defaults), checked in that format only. The checks:

==========================  =====================================================================
export                      checked by
==========================  =====================================================================
megatron                    Megatron-LM ``megatron/training/arguments.py``: ``parse_args`` then
                            ``validate_args`` (a Megatron-LM checkout: ``--megatron-lm PATH``;
                            Megatron-LM is not on PyPI), then the model config ``pretrain_gpt``
                            builds from them (``core_transformer_config_from_args``, whose
                            ``__post_init__`` refuses more: :func:`core_config`), and the
                            layers it windows (:func:`check_window`). The
                            environment comes only from the export's ``export`` lines, so a
                            missing ``CUDA_DEVICE_MAX_CONNECTIONS=1`` fails as it would on the
                            cluster.
nemo                        NeMo 2 ``nemo.lightning.MegatronStrategy(**trainer.strategy)`` and
                            Megatron-Core ``TransformerConfig(**model.config, **strategy)`` (the
                            strategy copies its parallel sizes into the model config;
                            ``MLATransformerConfig`` for multi-head latent attention), and
                            the layers it windows (:func:`check_window`)
torchtitan                  torchtitan 0.2 ``ConfigManager().parse_args(["--job.config_file",
                            FILE])`` (rejects unknown sections and keys), then
                            ``ParallelDims`` of the parsed degrees: its own validation, the DDP
                            branch of ``parallelize`` (no FSDP, ``fsdp_enabled`` false, beside
                            other parallelism raises "DDP has not supported > 1D parallelism")
                            and the expert mesh ``build_mesh`` unflattens (pp, dp_replicate,
                            efsdp, ep, etp) must hold the world
deepspeed                   DeepSpeed ``DeepSpeedConfig(dict, mpu)`` with the plan's
                            data-parallel size (checks the batch arithmetic and every key type)
==========================  =====================================================================

Install (CPU only; about 1.5 GB in a separate virtualenv, 5 to 10 minutes)::

    python3 -m venv /tmp/exports-venv && . /tmp/exports-venv/bin/activate
    pip install torch                      # a CPU wheel is enough
    pip install megatron-core deepspeed "torchtitan==0.2.2" triton
    pip install "nemo_toolkit==2.7.3" --no-deps lightning fiddle omegaconf hydra-core wget \
        nv-one-logger-core nv-one-logger-training-telemetry \
        nv-one-logger-pytorch-lightning-integration
    pip install "lightning<2.6" "StrEnum<0.5" "overrides>=7.7,<8" "omegaconf<2.4" \
        antlr4-python3-runtime==4.9.3 lightning-utilities torchmetrics libcst cloudpickle \
        wrapt onnx toml                    # NeMo's imports, pinned as its metadata asks
    pip install -e .                       # the planner, from this repository
    git clone https://github.com/NVIDIA/Megatron-LM /tmp/Megatron-LM
    python tools/check_exports.py --megatron-lm /tmp/Megatron-LM

(NeMo 3 removed ``nemo.lightning``'s strategies, hence 2.7.3; torchtitan 0.3 dropped the TOML
job files, hence 0.2.2.) A framework that does not import is reported as SKIP with the reason;
every other check prints ``ok`` or ``FAIL`` with the framework's own message. Exit status 1 when
any check fails.

Workarounds the script applies, each only to run a framework on a CPU machine:

* torchtitan's package ``__init__`` imports its MoE Triton kernels: ``torchtitan.config`` is
  imported without running it.
* Megatron-LM's main branch uses ``typing.override`` (Python 3.12): on 3.11 it is aliased to
  ``typing_extensions.override``.
* ``DeepSpeedConfig`` asks the rank of an initialised process group; it is answered 0, and the
  data-parallel size comes from a stand-in ``mpu`` (the plan's dp).
* ``validate_args`` asks the GPU's compute capability (``get_device_arch_version``, and
  ``torch.cuda.get_device_capability`` for ``--moe-grouped-gemm``); the script answers with the
  instance's GPU generation (A100 8, H100/H800/H200 9, B200/GB200 10).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import os
import shlex
import sys
import tempfile
import traceback
import types
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from planner.app.emit import emit  # noqa: E402
from planner.model.errors import PlanError  # noqa: E402
from planner.model.errors import InputError  # noqa: E402
from planner.model.instance import Instance, load_instance  # noqa: E402
from planner.model.plan import Plan, plan_from_spec  # noqa: E402

ARCH = {"a100": 8, "h100": 9, "h800": 9, "h200": 9, "b200": 10, "gb200": 10, "mi300": 9}


class Skip(Exception):
    """The framework is not installed or cannot run here."""


# ---------------------------------------------------------------------------------- parsing

def megatron_parts(text: str) -> tuple[dict[str, str], list[str]]:
    """The environment set by ``export`` lines and the argument list of a Megatron export."""
    env, body = {}, []
    for ln in text.splitlines():
        if ln.startswith("export "):
            key, _, value = ln.removeprefix("export ").partition("=")
            env[key] = value
        elif ln and not ln.startswith("#"):
            body.append(ln.rstrip("\\").rstrip())
    return env, shlex.split(" ".join(body))


def nemo_tree(text: str) -> dict:
    import yaml

    return yaml.safe_load(text)


def _dtype(name: str | None):
    import torch

    return None if name is None else getattr(torch, name.removeprefix("torch."))


# ----------------------------------------------------------------------------------- checks

def te_installed() -> bool:
    """Whether Transformer Engine imports here: without it the checks set aside, and name,
    what tests the environment rather than the export."""
    try:
        import transformer_engine  # noqa: F401
    except ImportError:
        return False
    return True


def check_megatron(text: str, inst: Instance, plan: Plan, mlm: Path | None) -> str:
    if mlm is None:
        raise Skip("no Megatron-LM checkout (--megatron-lm PATH): Megatron-LM is not on PyPI")
    import typing

    if not hasattr(typing, "override"):
        import typing_extensions

        typing.override = typing_extensions.override
    if str(mlm) not in sys.path:
        sys.path.insert(0, str(mlm))
    try:
        import megatron.training.arguments as margs
    except Exception as exc:        # noqa: BLE001 - report whatever stops the import
        raise Skip(f"megatron.training does not import: {exc}") from None
    env, argv = megatron_parts(text)
    arch = next((v for k, v in ARCH.items() if k in inst.hw.gpu.key), 9)
    margs.get_device_arch_version = lambda: arch
    margs.torch.cuda.get_device_capability = lambda *a, **k: (arch, 0)   # --moe-grouped-gemm
    # without Transformer Engine installed, its version checks read as the recent Transformer
    # Engine the exports ask for (--delay-wgrad-compute beside --overlap-grad-reduce asserts
    # TE >= 2.8): they test the environment, not the export
    te_aside = not te_installed() and hasattr(margs, "is_te_min_version")
    if te_aside:
        margs.is_te_min_version = lambda *a, **k: True
    # the run's other required arguments (data, tokenizer, schedule), none of which the plan sets
    extra = ["--tokenizer-type", "NullTokenizer", "--vocab-size", str(inst.model.vocab),
             "--mock-data", "--train-iters", "10", "--lr", "1e-4"]
    saved_env = {k: os.environ.get(k) for k in ("CUDA_DEVICE_MAX_CONNECTIONS", "WORLD_SIZE",
                                                 "RANK", "LOCAL_RANK")}
    saved_argv = sys.argv
    try:
        os.environ.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
        os.environ.update(env)
        os.environ.update(WORLD_SIZE=str(plan.gpus), RANK="0", LOCAL_RANK="0")
        sys.argv = ["pretrain_gpt.py", *argv, *extra]
        with contextlib.redirect_stdout(io.StringIO()):
            args = margs.parse_args()
            margs.validate_args(args, {})
    finally:
        sys.argv = saved_argv
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    built, cfg = core_config(args)
    built += check_window(cfg, inst)
    got = (args.tensor_model_parallel_size, args.pipeline_model_parallel_size,
           args.context_parallel_size, args.data_parallel_size)
    want = (plan.tp, plan.pp, plan.cp, plan.dp)
    if got != want:
        raise AssertionError(f"Megatron derived tp, pp, cp, dp = {got}, the plan has {want}")
    if args.virtual_pipeline_model_parallel_size not in (None, plan.vp) or (
            plan.vp > 1 and args.virtual_pipeline_model_parallel_size != plan.vp):
        raise AssertionError(f"virtual pipeline {args.virtual_pipeline_model_parallel_size}, "
                             f"the plan has {plan.vp}")
    return f"parse_args + validate_args + {built} (dp {args.data_parallel_size}, vp " \
           f"{args.virtual_pipeline_model_parallel_size}" \
           + ("; Transformer Engine version checks read as met" if te_aside else "") + ")"


def core_config(args) -> tuple[str, object]:
    """Megatron-Core's model config built from the validated arguments as ``pretrain_gpt``
    builds it (``core_transformer_config_from_args``): its ``__post_init__`` refuses what
    ``validate_args`` lets through (a fused bias-activation with squared ReLU, say). Without
    Transformer Engine two switches that test the environment, not the export, are set aside
    and named: the fused RoPE (``apply_rope_fusion``) and FP8 of an MoE model (which asks for
    Transformer Engine >= 1.7). Returns its description and the config."""
    from megatron.training.argument_utils import core_transformer_config_from_args

    aside = []
    if not te_installed():
        if getattr(args, "apply_rope_fusion", False):
            args.apply_rope_fusion = False
            aside.append("rope fusion")
        if getattr(args, "fp8", None) and getattr(args, "num_experts", None):
            args.fp8 = None
            aside.append("MoE FP8")
            if getattr(args, "fp8_param_gather", False):
                # (FP8 parameters need FP8: TransformerConfig refuses the one without the
                # other, "fp8_param must be used together with fp8 mode")
                args.fp8_param_gather = False
                aside.append("its FP8 parameters")
    cfg = core_transformer_config_from_args(args)
    return type(cfg).__name__ + (f" (without Transformer Engine: {', '.join(aside)} set "
                                 "aside)" if aside else ""), cfg


def check_window(cfg, inst: Instance) -> str:
    """The layers Megatron-Core's own rule (``is_layer_window_attention``) windows under the
    built config, and their window, against the model's ``windowed_layers`` and window."""
    from megatron.core.transformer.utils import is_layer_window_attention

    m = inst.model
    got = tuple(is_layer_window_attention(cfg.window_size, cfg.window_attn_skip_freq, n)
                for n in range(1, m.layers + 1))
    if got != m.windowed_layers:
        raise AssertionError(f"Megatron-Core windows layers {got}, the model "
                             f"{m.windowed_layers}")
    if m.windowed and tuple(cfg.window_size) != (m.window_left, 0):
        raise AssertionError(f"window_size {cfg.window_size}, the model ({m.window_left}, 0)")
    return f", {sum(got)} windowed layers" if m.windowed else ""


def check_nemo_strategy(text: str, inst: Instance, plan: Plan) -> str:
    try:
        from nemo.lightning.pytorch.strategies import MegatronStrategy
    except Exception as exc:        # noqa: BLE001
        raise Skip(f"nemo.lightning does not import: {exc}") from None
    strat = dict(nemo_tree(text)["trainer"]["strategy"])
    if "pipeline_dtype" in strat:
        strat["pipeline_dtype"] = _dtype(strat["pipeline_dtype"])
    if isinstance(strat.get("ddp"), dict):
        # the export's nested table is the DistributedDataParallelConfig a recipe passes as
        # MegatronStrategy(ddp=...): built here, so an unknown field fails as it would there
        from megatron.core.distributed import DistributedDataParallelConfig
        strat["ddp"] = DistributedDataParallelConfig(**strat["ddp"])
    MegatronStrategy(**strat)
    return "MegatronStrategy(**trainer.strategy)"


def check_mcore_config(text: str, inst: Instance, plan: Plan) -> str:
    try:
        from megatron.core.transformer.transformer_config import (MLATransformerConfig,
                                                                  TransformerConfig)
    except Exception as exc:        # noqa: BLE001
        raise Skip(f"megatron.core does not import: {exc}") from None
    tree = nemo_tree(text)
    cfg = dict(tree["model"]["config"])
    # (multi-head latent attention's fields are MLATransformerConfig's, the class Megatron's
    # core_transformer_config_from_args and NeMo's DeepSeek configs use)
    config_class = MLATransformerConfig if cfg.get("multi_latent_attention") else TransformerConfig
    cfg.pop("seq_length")        # a NeMo GPTConfig field, not one of TransformerConfig
    strat = dict(tree["trainer"]["strategy"])
    for key in ("tensor_model_parallel_size", "pipeline_model_parallel_size",
                "virtual_pipeline_model_parallel_size", "context_parallel_size",
                "sequence_parallel", "expert_model_parallel_size", "expert_tensor_parallel_size",
                "pipeline_dtype"):
        if key in strat:
            cfg[key] = strat[key]
    if "pipeline_dtype" in cfg:
        cfg["pipeline_dtype"] = _dtype(cfg["pipeline_dtype"])
    fp16 = tree["optim"]["config"]["fp16"]
    cfg.update(bf16=not fp16, fp16=fp16)
    built = config_class(**cfg)
    return f"{config_class.__name__}(**model.config + strategy sizes)" + check_window(built, inst)


def check_torchtitan(text: str, inst: Instance, plan: Plan) -> str:
    try:
        if "torchtitan" not in sys.modules:     # skip the package __init__ (Triton kernels)
            spec = importlib.util.find_spec("torchtitan")
            if spec is None:
                raise ImportError("torchtitan is not installed")
            pkg = types.ModuleType("torchtitan")
            pkg.__path__ = list(spec.submodule_search_locations)
            sys.modules["torchtitan"] = pkg
        from torchtitan.config import ConfigManager
    except Exception as exc:        # noqa: BLE001
        raise Skip(f"torchtitan.config does not import: {exc}") from None
    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as f:
        f.write(text)
    try:
        cfg = ConfigManager().parse_args(["--job.config_file", f.name])
    finally:
        os.unlink(f.name)
    p = cfg.parallelism
    got = (p.tensor_parallel_degree, p.pipeline_parallel_degree, p.context_parallel_degree,
           p.data_parallel_shard_degree * p.data_parallel_replicate_degree)
    if got != (plan.tp, plan.pp, plan.cp, plan.dp):
        raise AssertionError(f"torchtitan read tp, pp, cp, dp = {got}")
    return "ConfigManager.parse_args(--job.config_file), " + torchtitan_mesh(p, plan.gpus)


def torchtitan_mesh(p, world: int) -> str:
    """What torchtitan 0.2.2 does with the parsed degrees before training, without a process
    group: ``ParallelDims`` validates them; ``parallelize`` (models/*/infra/parallelize.py)
    applies FSDP when ``fsdp_enabled``, else DDP, which raises unless the world is the
    replicate mesh; ``build_mesh`` unflattens the world into (pp, dp_replicate, efsdp, ep,
    etp) with ``efsdp = dp_shard * cp * tp // (etp * ep)``."""
    from torchtitan.distributed.parallel_dims import ParallelDims

    pd = ParallelDims(dp_replicate=p.data_parallel_replicate_degree,
                      dp_shard=p.data_parallel_shard_degree, cp=p.context_parallel_degree,
                      tp=p.tensor_parallel_degree, pp=p.pipeline_parallel_degree,
                      ep=p.expert_parallel_degree, etp=p.expert_tensor_parallel_degree,
                      world_size=world)
    if not pd.fsdp_enabled and pd.dp_replicate_enabled and pd.dp_replicate != world:
        raise AssertionError("parallelize takes the DDP branch (fsdp_enabled is false) beside "
                             "other parallelism: \"DDP has not supported > 1D parallelism\"")
    efsdp = pd.dp_shard * pd.cp * pd.tp // (pd.etp * pd.ep)
    if pd.pp * pd.dp_replicate * efsdp * pd.ep * pd.etp != world:
        raise AssertionError(f"build_mesh: efsdp = dp_shard*cp*tp // (etp*ep) = {efsdp} does "
                             f"not tile the {world} ranks with ep = {pd.ep}")
    return f"ParallelDims (fsdp {pd.fsdp_enabled}, efsdp {efsdp})"


def check_deepspeed(text: str, inst: Instance, plan: Plan) -> str:
    try:
        import deepspeed.runtime.config as dsc
        from deepspeed.runtime.config import DeepSpeedConfig
    except Exception as exc:        # noqa: BLE001
        raise Skip(f"deepspeed does not import: {exc}") from None
    # without an initialised process group DeepSpeedConfig falls back to a world of 1 GPU; rank
    # 0 of a group whose data-parallel size the mpu gives is what a launched rank sees
    dsc.dist.get_rank = lambda *a, **k: 0

    class MPU:       # what DeepSpeedConfig asks of a model-parallel unit
        def get_data_parallel_world_size(self):
            return plan.dp

        def get_sequence_parallel_world_size(self):
            return 1

    cfg = DeepSpeedConfig(json.loads(text), mpu=MPU())
    if (cfg.train_batch_size, cfg.gradient_accumulation_steps) != (
            plan.global_batch, plan.micro_batches):
        raise AssertionError("DeepSpeed's batch arithmetic differs from the plan's")
    return f"DeepSpeedConfig (world {cfg.world_size}, zero stage {cfg.zero_optimization_stage})"


# ------------------------------------------------------------------------------------- main

FORMATS = ("megatron", "nemo", "torchtitan", "deepspeed")


def plans_of(inst: Instance, solver: str) -> list[tuple[str, Instance, Plan, tuple[str, ...]]]:
    """The plans to export: ``[plan]`` and the optimum in every format, then per format the
    optimum ``plan solve --emit FMT`` returns (searched under that framework's rules, written
    with its defaults: the instance it was searched on goes with it) in that format only."""
    from formulations.solve import solve

    out = []
    if inst.spec.plan is not None:
        out.append(("[plan]", inst, plan_from_spec(inst, inst.spec.plan), FORMATS))
    try:
        res = solve(inst, solver=solver)
    except PlanError:               # an infeasible instance: its [plan] alone, if any
        return out
    if res.report is not None:
        out.append((f"optimum ({solver})", inst, res.report.plan, FORMATS))
    if inst.spec.constraints.framework is not None:
        return out
    for fmt in FORMATS:
        under = inst.with_spec(constraints=inst.spec.constraints.model_copy(
            update={"framework": fmt}))
        try:
            res = solve(under, solver=solver)
        except PlanError:           # the framework's rules leave no plan
            continue
        if res.report is not None:
            out.append((f"--emit {fmt} optimum", under, res.report.plan, (fmt,)))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--megatron-lm", type=Path, help="a Megatron-LM checkout (for parse_args)")
    ap.add_argument("--solver", default="enumerate", help="solver for the optimum plans")
    ap.add_argument("instances", nargs="*", type=Path,
                    default=sorted((ROOT / "instances").glob("*.toml")))
    ns = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    checks = [
        ("megatron", "Megatron-LM", lambda t, i, p: check_megatron(t, i, p, ns.megatron_lm)),
        ("nemo", "NeMo MegatronStrategy", check_nemo_strategy),
        ("nemo", "Megatron-Core TransformerConfig", check_mcore_config),
        ("torchtitan", "torchtitan ConfigManager", check_torchtitan),
        ("deepspeed", "DeepSpeed DeepSpeedConfig", check_deepspeed),
    ]
    counts = {"ok": 0, "FAIL": 0, "SKIP": 0}
    for path in ns.instances:
        try:
            instance = load_instance(path)
        except InputError as exc:       # (an instance the planner refuses has no export)
            counts["SKIP"] += 1
            print(f"SKIP {path.name}: " + "; ".join([str(exc).splitlines()[0]] + exc.problems),
                  flush=True)
            continue
        plans = plans_of(instance, ns.solver)
        if not plans:                   # (no [plan], and the search finds none)
            counts["SKIP"] += 1
            print(f"SKIP {path.name}: no [plan] and no plan the search finds", flush=True)
        for source, inst, plan, formats in plans:
            for fmt, name, check in checks:
                if fmt not in formats:
                    continue
                label = f"{path.name} {source} {plan.label()} {fmt} -> {name}"
                try:
                    text = emit(inst, plan, fmt)
                    detail = check(text, inst, plan)
                    status = "ok"
                except Skip as exc:
                    status, detail = "SKIP", str(exc)
                except PlanError as exc:
                    status, detail = "SKIP", f"not launchable: {exc}"
                except (Exception, SystemExit) as exc:   # noqa: BLE001 - the framework's verdict
                    status = "FAIL"
                    detail = f"{type(exc).__name__}: {exc}".strip()
                    if os.environ.get("CHECK_EXPORTS_TRACE"):
                        traceback.print_exc()
                counts[status] += 1
                print(f"{status:4} {label}: {detail.splitlines()[0] if detail else ''}",
                      flush=True)
    print(f"{counts['ok']} ok, {counts['FAIL']} failed, {counts['SKIP']} skipped")
    return 1 if counts["FAIL"] else 0


if __name__ == "__main__":
    sys.exit(main())

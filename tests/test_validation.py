"""Prediction error on the shipped published runs (README "Validation"; docs/contract.md,
"Runs files"), and the calibration the catalog records.

Bounds: mean absolute step-time error <= 8%, max <= 15% over every run of
``planner/data/published_runs.toml``; out of sample (parameters fitted without the run's source)
mean <= 6% and max <= 15% (issue 12's target).
Each GPU type's parameters in ``hardware_catalog/`` must be the values ``calibrate()`` finds on
those runs (efficiencies within 0.01, knees within one grid step).
"""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path

import pytest

from planner.model.catalog import load_gpu
from planner.model.workload import Shape
from planner.app.calibration import (Calibrator, KNEE_TOKENS_GRID, KNEE_WIDTH_GRID, LONG_SEQ,
                                     calibrate, calibration_only_keys, seq_len, single_source_keys)
from planner.app.runs_file import load_runs, run_instance, source_of
from planner.app.validate import out_of_sample, summary, validate_runs

ROOT = Path(__file__).resolve().parents[1]
MEAN_BOUND, MAX_BOUND = 0.08, 0.15
OOS_MEAN_BOUND, OOS_MAX_BOUND = 0.06, 0.15


@pytest.fixture(scope="module")
def data():
    return load_runs()


@pytest.fixture(scope="module")
def results(data):
    return validate_runs(data, alone=calibration_only_keys(data))


def _table(results) -> str:
    return "\n".join(f"  {r.id:40s} measured {r.measured_s:8.3f} s  predicted "
                     f"{r.predicted_s:8.3f} s  error {100 * r.error:+6.1f}%" for r in results)


def test_every_run_is_evaluated(data, results):
    assert [r.id for r in results] == [r["id"] for r in data["runs"]]
    assert len(results) >= 20
    for r in results:
        assert r.predicted_s > 0 and r.measured_s > 0


def test_mean_abs_error_bound(results):
    s = summary(results)
    assert s["runs"] == sum(r.held_out is None and r.calibration_only is None for r in results)
    assert s["mean_abs_error"] <= MEAN_BOUND, (
        f"mean |error| {100 * s['mean_abs_error']:.1f}% > {100 * MEAN_BOUND:.0f}%\n"
        + _table(results))


def test_max_abs_error_bound(results):
    s = summary(results)
    worst = max((r for r in results if r.held_out is None and r.calibration_only is None),
                key=lambda r: abs(r.error))
    assert s["max_abs_error"] == pytest.approx(abs(worst.error))
    assert s["max_abs_error"] <= MAX_BOUND, (
        f"max |error| {100 * s['max_abs_error']:.1f}% ({worst.id}) > {100 * MAX_BOUND:.0f}%\n"
        + _table(results))


def test_summary_of_hand_made_errors(results):
    """Three runs predicted 10% slow, 20% fast and exact: mean |error| 10%, max 20%."""
    base = results[0]
    p = base.predicted_s
    made = [dataclasses.replace(base, measured_s=p / 1.1),     # predicted = 1.1 x measured
            dataclasses.replace(base, measured_s=p / 0.8),     # predicted = 0.8 x measured
            dataclasses.replace(base, measured_s=p)]
    s = summary(made)
    assert s["runs"] == 3
    assert s["mean_abs_error"] == pytest.approx(0.10, rel=1e-12)
    assert s["max_abs_error"] == pytest.approx(0.20, rel=1e-12)


@pytest.fixture(scope="module")
def fitted(data):
    return calibrate(data)


def test_calibration_covers_every_gpu_with_runs(data, fitted):
    kept = [r for r in data["runs"] if "held_out" not in r]
    assert set(fitted) == {r["gpu"] for r in kept}
    for gpu, fit in fitted.items():
        precisions = {r["precision"] for r in kept if r["gpu"] == gpu}
        assert ("efficiency" in fit) == bool(precisions - {"fp8"})
        assert ("efficiency_fp8" in fit) == ("fp8" in precisions)


def test_catalog_records_the_calibrated_efficiency(fitted):
    """The catalog file holds the values calibrate() finds (read the file, not the loader)."""
    step = {"gemm_knee_tokens": KNEE_TOKENS_GRID[1], "gemm_knee_width": KNEE_WIDTH_GRID[1]}
    for gpu, fit in fitted.items():
        catalog = tomllib.loads((ROOT / "hardware_catalog" / f"{gpu}.toml").read_text())
        for key, value in fit.items():
            assert key in catalog, f"hardware_catalog/{gpu}.toml has no {key}"
            assert abs(catalog[key] - value) <= step.get(key, 0.01), (
                f"{gpu}: calibrate() gives {key}={value}, the catalog records {catalog[key]}")
            assert key in catalog["sources"]
        assert "calibrat" in catalog["calibration"].lower()


def test_few_parameters_per_gpu_type_and_none_per_run(data, fitted):
    """One pair of knees for all GPU types, an asymptote per type (an FP8 asymptote where FP8
    runs exist; a type with FP8 runs alone, B200, gets that asymptote only), and an attention
    figure only where fitted FP8 runs reach LONG_SEQ tokens (B200's long-sequence rows; the
    H100 ones are held out): never more parameters than GPU types can carry."""
    assert len({f["gemm_knee_tokens"] for f in fitted.values() if "efficiency" in f}) == 1
    assert len({f["gemm_knee_width"] for f in fitted.values() if "efficiency" in f}) == 1
    assert set(fitted["b200"]) == {"efficiency_fp8", "attention_efficiency"}
    long_types = {r["gpu"] for r in data["runs"] if "held_out" not in r
                  and r["precision"] == "fp8" and seq_len(data, r) >= LONG_SEQ}
    assert long_types == {"b200"}
    for gpu, fit in fitted.items():
        assert set(fit) <= {"efficiency", "gemm_knee_tokens", "gemm_knee_width", "efficiency_fp8",
                            "attention_efficiency"}
        assert ("attention_efficiency" in fit) == (gpu in long_types)


#: Maximum achievable matmul FLOPS over the dense BF16 peak, measured by a search over shapes
#: (stas00/ml-engineering, compute/accelerator/README.md, "Maximum Achievable Matmul FLOPS
#: comparison table": A100 SXM 267.9 / 312, H100 SXM 792.1 / 989 TFLOPS).
MAMF = {"a100-80gb": 267.9 / 312, "h100-sxm": 792.1 / 989}


def test_calibrated_asymptote_is_a_reachable_matmul_efficiency(fitted):
    """The GEMM asymptote the runs fit is no more than the best matmul on that GPU reaches: a
    fit above it would be crediting GEMMs with speed no kernel has. Fitted on the runs as they
    ran (their overlaps on), it is 91% (A100) and 85% (H100) of it: a training step's GEMMs
    run beside the kernels of the collectives they hide and at the shapes the model gives
    them, not at the best shape a search finds. Below three quarters of it the model would be
    missing a cost that large, not describing GEMMs."""
    for gpu, mamf in MAMF.items():
        eff = fitted[gpu]["efficiency"]
        assert 0.75 * mamf <= eff <= mamf + 0.005, (gpu, fitted[gpu], mamf)


def test_held_out_runs_are_neither_fitted_nor_bounded(data, results, fitted):
    """A held-out run (a plan the model cannot yet write as it ran, or a set kept unseen)
    changes no fitted parameter and no bound, and is still evaluated: its error shows in the
    results and in the summary's own held-out figures."""
    held = [r for r in data["runs"] if "held_out" in r]
    assert held, "the shipped set holds the Llama 3 405B runs out"
    kept = {"models": data["models"], "runs": [r for r in data["runs"] if "held_out" not in r]}
    assert calibrate(kept) == fitted
    unseen = [abs(r.error) for r in results if r.held_out]
    assert summary(results) == {**summary([r for r in results if r.held_out is None]),
                                "held_out": len(held),
                                "mean_abs_error_held_out": sum(unseen) / len(unseen),
                                "max_abs_error_held_out": max(unseen)}
    assert {r.id for r in results if r.held_out} == {r["id"] for r in held}


def test_long_sequences_from_4k_to_1m_tokens_are_predicted_unseen(data, results):
    """NeMo's long-sequence table (Llama 2 7B at FP8 on H100, 4K to 1M tokens per sequence,
    context parallelism up to 32; held out, never fitted): at these lengths the attention core
    is most of the step, so its cost rule (full ``4 b s^2 h`` FLOPs at the GEMM efficiency) is
    what is tested. Measured (``plan validate``): -4.0% to +3.2%, every plan fits."""
    runs = {r["id"]: r for r in data["runs"] if r["id"].startswith("nemo2403-long-")}
    seqs = {data["models"][r["model"]]["seq_len"] for r in runs.values()}
    assert min(seqs) == 4096 and max(seqs) == 2**20 and len(runs) == 9
    assert {r["plan"]["cp"] for r in runs.values()} >= {1, 2, 4, 8, 16, 32}
    got = {r.id: r for r in results if r.id in runs}
    assert all(r.held_out for r in got.values())
    bad = {rid: round(100 * r.error, 1) for rid, r in got.items() if abs(r.error) > 0.06}
    assert not bad, f"long-sequence runs off by more than 6%: {bad}"
    assert all(r.report.fits for r in got.values()), [i for i, r in got.items() if not r.report.fits]


def test_blackwell_attention_is_fitted_on_the_long_sequences(data, results, fitted):
    """The B200 rows of the same page (Llama 3 8B at FP8, 8K to 1M tokens, NeMo 25.04.rc2) fit
    B200's attention figure beside its FP8 asymptote: one figure fits the whole range (measured
    -1.4% to +9.5%; -2.3% to +6.4% before the interleaved per-chunk gradient reduction moved
    B200's FP8 asymptote from 0.485 to 0.47), which the H100 rule (the core at the 16-bit GEMM
    efficiency, 0.52 on Blackwell) misses by +61% at 512K; the figure is a share of the
    16-bit peak that the kernel reaches on the full ``4 b s^2 h`` count (0.87: 1,958
    TFLOP/s). GB200 takes it (the
    same silicon): its held-out NeMo 25.04 rows judge it."""
    got = [r for r in results if r.id.startswith("nemo2504-long-b200-")]
    assert len(got) == 8 and all(r.calibration_only for r in got)
    assert max(abs(r.error) for r in got) <= 0.10, [(r.id, round(r.error, 3)) for r in got]
    a = fitted["b200"]["attention_efficiency"]
    assert 0.6 <= a <= 1.0
    assert load_gpu("gb200").attention_efficiency == pytest.approx(a)   # GB200 takes B200's
    tied = validate_runs({"models": data["models"],
                          "runs": [r for r in data["runs"] if r["id"] in {x.id for x in got}]},
                         {"b200": {"attention_efficiency": load_gpu("b200").efficiency}})
    assert max(r.error for r in tied) > 0.4


def _moe_ids(data) -> set[str]:
    """The runs of a mixture-of-experts model, by the model's own shape (``Shape.n_moe``)."""
    return {r["id"] for r in data["runs"] if Shape.of(run_instance(data, r).model).n_moe}


@pytest.mark.xfail(strict=True, reason="MoE (plan validate): DeepSeek-V3 on H100 -25.4%, "
                   "Qwen3-30B-A3B on H100 -65.2% (Megatron-Bridge 25.11) and -18.5% (26.04, "
                   "HybridEP), Qwen3-235B-A22B on H100 -14.1% / -11.2%, on GB200 +9.5%, "
                   "gpt-oss-120b on H100 -36.8% and GB200 -39.0% (26.04.01): "
                   "fine-grained expert GEMMs, routing and permutation cost more than the model "
                   "charges (README, 'What is validated and what is not')")
def test_moe_runs_are_predicted_unseen(data, results):
    """The MoE runs with a full plan (held out): the target is the dense runs' 15%; not met
    (strict: passes once it is)."""
    moe = _moe_ids(data)
    got = [r for r in results if r.id in moe]
    assert len(got) >= 2 and all(r.held_out for r in got)
    assert max(abs(r.error) for r in got) <= 0.15


def test_an_moe_plan_carries_the_caveat_its_validation_earns(data, results):
    """Every MoE plan's report says its MoE terms are not validated, with the measured runs'
    ratios (measured / predicted step time, as `plan validate` finds them: the caveat cannot
    go stale); a dense plan's says nothing."""
    from planner.model.evaluate import MOE_CAVEAT, evaluate
    from planner.model.instance import load_instance
    from planner.model.plan import plan_from_spec
    ids = _moe_ids(data)
    moe = [r for r in results if r.id in ids]
    ratios = sorted(r.measured_s / r.predicted_s for r in moe)
    assert f"the {len(moe)} measured MoE runs" in MOE_CAVEAT
    assert f"took {ratios[0]:.1f}x to {ratios[-1]:.1f}x" in MOE_CAVEAT, ratios
    assert f"{sum(x > 1 for x in ratios)} of them longer" in MOE_CAVEAT, ratios
    for name, expect in (("mixtral-8x7b-h100", [MOE_CAVEAT]), ("gpt3-175b-a100", [])):
        inst = load_instance(ROOT / "instances" / f"{name}.toml")
        rep = evaluate(inst, plan_from_spec(inst, inst.spec.plan), spec=inst.spec.plan)
        # (besides the newer p2p schedule's, which an interleaved plan carries whatever its
        # model: tests/test_overlap_sim.py)
        said = [c for c in rep.caveats if "#4047" not in c]
        assert said == expect and [c for c in rep.to_dict()["caveats"] if c in said] == expect


def test_the_catalog_lists_the_precisions_its_runs_were_measured_at(data):
    """``measured_precisions`` of every GPU type is what the shipped runs files hold (held-out
    runs included: they were measured); a plan at another precision carries a caveat, one at
    a measured precision none."""
    from planner.model.catalog import known_gpus
    from planner.model.evaluate import caveats
    from planner.model.instance import parse_instance
    measured: dict[str, set[str]] = {}
    for path in (None, ROOT / "planner" / "data" / "fsdp_runs.toml"):
        for run in load_runs(path)["runs"]:
            measured.setdefault(run["gpu"], set()).add(
                run["precision"] if run["precision"] in ("fp8", "nvfp4") else "16-bit")
    for gpu in known_gpus():
        assert set(load_gpu(gpu).measured_precisions) == measured.get(gpu, set()), gpu

    def says(gpu, precision):
        inst = parse_instance({"model": {"preset": "llama3-8b"},
                               "training": {"global_batch": 64, "precision": precision},
                               "cluster": {"gpu": gpu, "gpus": 8}})
        return [c for c in caveats(inst) if "no measured run" in c]
    assert says("b200", "bf16") and not says("b200", "fp8")
    assert says("h200", "bf16") and says("mi300x", "fp8")
    assert not says("h100-sxm", "fp8") and not says("a100-80gb", "fp16")


def test_source_groups():
    data = load_runs()
    groups = {source_of(r) for r in data["runs"]}
    assert {"narayanan21", "korthikanti22", "MLPerf Training v3.1",
            "NeMo 24.07 performance summary"} <= groups
    assert source_of({"source": "MLPerf Training v3.1 n512"}) == "MLPerf Training v3.1"
    assert source_of({"id": "narayanan21-1.7b"}) == "narayanan21"


@pytest.fixture(scope="module")
def oos(data):
    return out_of_sample(data)


def test_out_of_sample_excludes_the_source(data):
    """Refitting without a source changes the parameters of the GPU type it has runs on (the
    left-out runs had weight), and a GPU type left without 16-bit runs gets no 16-bit fit."""
    cal = Calibrator(data)
    full = cal.fit()
    without = cal.fit(exclude_source="narayanan21")
    assert without["a100-80gb"] != full["a100-80gb"]
    sub = {"models": data["models"],
           "runs": [r for r in data["runs"] if r["gpu"] != "h100-sxm" or r["precision"] == "fp8"]}
    left = Calibrator(sub).fit()
    # H100 with FP8 runs only: no 16-bit fit (the catalog's stands), an FP8 asymptote on top
    assert set(left["h100-sxm"]) == {"efficiency_fp8"}


def test_out_of_sample_bounds(data, oos):
    assert set(oos) == {r["id"] for r in data["runs"]}
    errs = [abs(oos[r["id"]]) for r in data["runs"]
            if "held_out" not in r and oos[r["id"]] is not None]
    mean, worst = sum(errs) / len(errs), max(errs)
    assert mean <= OOS_MEAN_BOUND, f"out-of-sample mean |error| {100 * mean:.1f}%"
    assert worst <= OOS_MAX_BOUND, f"out-of-sample max |error| {100 * worst:.1f}%"


def test_a_run_without_its_degrees_is_an_input_error(tmp_path):
    """A runs file whose plan lacks dp (or tp, pp, the batch) is a clear error, not a traceback."""
    from typer.testing import CliRunner

    from planner.app.cli import app

    path = tmp_path / "runs.toml"
    path.write_text('[models.m]\nlayers = 2\nhidden = 64\nheads = 1\nvocab = 100\nseq_len = 64\n'
                    '[[runs]]\nid = "x"\nmodel = "m"\ngpu = "a100-80gb"\nprecision = "bf16"\n'
                    'measured_step_time_s = 1.0\nplan = { tp = 1, pp = 1, global_batch = 8 }\n')
    result = CliRunner().invoke(app, ["validate", str(path), "--no-ranking"])
    assert result.exit_code == 2
    text = result.output + (result.stderr if result.stderr_bytes is not None else "")
    assert "run x: missing plan.dp" in text and "Traceback" not in text


def test_settings_a_run_leaves_unstated_are_reported(tmp_path):
    """A run that does not say its framework, overlaps or dtypes is costed with Megatron-LM's
    command-line defaults; plan validate says which settings each run left to them (JSON
    ``unstated``) and how many runs that concerns, and a run that states them is not listed."""
    import json

    from typer.testing import CliRunner

    from planner.app.cli import app

    head = ('[models.m]\nlayers = 2\nhidden = 64\nheads = 1\nvocab = 100\nseq_len = 64\n')
    bare = ('[[runs]]\nid = "bare"\nmodel = "m"\ngpu = "a100-80gb"\nprecision = "bf16"\n'
            'measured_step_time_s = 1.0\nplan = { tp = 1, pp = 1, dp = 8, global_batch = 8 }\n')
    full = ('[[runs]]\nid = "full"\nmodel = "m"\ngpu = "a100-80gb"\nprecision = "bf16"\n'
            'framework = "nemo"\nmeasured_step_time_s = 1.0\n'
            'training = { grad_reduce_dtype = "bf16", optimizer_dtype = "fp32" }\n'
            'plan = { tp = 1, pp = 1, dp = 8, global_batch = 8, overlap_grad_reduce = true, '
            'overlap_param_gather = true, tp_comm_overlap = false, overlap_p2p_comm = false }\n')
    path = tmp_path / "runs.toml"
    path.write_text(head + bare + full)
    result = CliRunner().invoke(app, ["validate", str(path), "--no-ranking", "--json"])
    assert result.exit_code == 0, result.output
    runs = {r["id"]: r["unstated"] for r in json.loads(result.stdout)["runs"]}
    assert runs == {"bare": ["framework", "overlap_grad_reduce", "overlap_param_gather",
                             "tp_comm_overlap", "overlap_p2p_comm", "grad_reduce_dtype",
                             "optimizer_dtype"], "full": []}
    text = CliRunner().invoke(app, ["validate", str(path), "--no-ranking"]).output
    assert "1 of 2 runs leave settings that change the cost unstated" in " ".join(text.split())


def test_a_run_naming_no_framework_takes_the_one_its_source_names(tmp_path):
    """A run without ``framework`` whose source is a framework's own publication (NVIDIA's NeMo
    and Megatron-Bridge summaries, dgxc-benchmarking, NVIDIA-GPU MLPerf) is costed exactly as
    the same run naming that framework: NeMo's overlaps hide the gradient reduction, so the
    step is shorter than under Megatron-LM's defaults, which a run citing another source (or
    MLPerf on an AMD GPU) keeps. A framework the run names wins over its source."""
    import json

    from typer.testing import CliRunner

    from planner.app.cli import app

    head = '[models.m]\nlayers = 8\nhidden = 2048\nheads = 16\nvocab = 32000\nseq_len = 2048\n'

    def run(rid, gpu="h100-sxm", source=None, framework=None):
        return (f'[[runs]]\nid = "{rid}"\nmodel = "m"\ngpu = "{gpu}"\nprecision = "bf16"\n'
                'measured_step_time_s = 1.0\n'
                + (f'source = "{source}"\n' if source else "")
                + (f'framework = "{framework}"\n' if framework else "")
                + 'plan = { tp = 1, pp = 1, dp = 64, micro_batch = 1, global_batch = 64, '
                'distributed_optimizer = true }\n')

    runs = [run("named", framework="nemo"), run("nemo", source="NeMo 24.07 performance summary"),
            run("bridge", source="Megatron-Bridge 26.02 performance summary"),
            run("dgxc", source="dgxc-benchmarking v25.04 (741c886)"),
            run("mlperf", source="MLPerf Training v3.1 n512"),
            run("paper", source="Some et al. 2024 Table 2"), run("none"),
            run("mlperf-amd", gpu="mi300x", source="MLPerf Training v4.1"),
            run("ds", source="BigScience Megatron-DeepSpeed logs"),
            run("stated", source="NeMo 24.07 performance summary", framework="megatron")]
    path = tmp_path / "runs.toml"
    path.write_text(head + "".join(runs))
    result = CliRunner().invoke(app, ["validate", str(path), "--no-ranking", "--json"])
    assert result.exit_code == 0, result.output
    got = {r["id"]: r for r in json.loads(result.stdout)["runs"]}
    step = {k: r["predicted_s"] for k, r in got.items()}
    for rid in ("nemo", "bridge", "dgxc", "mlperf"):
        assert (got[rid]["framework"], got[rid]["framework_from"]) == ("nemo", "source")
        assert step[rid] == step["named"]
        assert "framework" in got[rid]["unstated"]      # inferred, not stated
    for rid in ("paper", "none", "mlperf-amd"):
        assert (got[rid]["framework"], got[rid]["framework_from"]) == (None, None)
    assert step["paper"] == step["none"] > step["named"]
    assert (got["ds"]["framework"], got["ds"]["framework_from"]) == ("deepspeed", "source")
    assert (got["stated"]["framework"], got["stated"]["framework_from"]) == ("megatron", "run")
    assert step["stated"] == step["none"]
    text = " ".join(CliRunner().invoke(app, ["validate", str(path), "--no-ranking"]).output.split())
    assert "by its source: 5 runs" in text


#: Korthikanti et al. 2022 (arXiv 2205.05198), Table 4: forward + backward time of one layer of
#: the 22B model (TP8, micro-batch 4, sequence 2048, A100), ms, by recompute mode and sequence
#: parallelism. The paper ascribes the full-recompute overhead of 39% (not 33%) to the backward
#: all-reduce running beside the weight-gradient GEMM, which the recomputed forward cannot do.
TABLE4_MS = {("none", False): 19.6, ("none", True): 19.0, ("full", False): 27.2,
             ("selective", False): 20.9, ("selective", True): 20.3}


def _layer_ms(data, async_allreduce: bool) -> dict:
    from planner.model.plan import plan_from_spec
    from planner.model.terms import step_terms
    from planner.app.runs_file import run_instance

    run = next(r for r in data["runs"] if r["id"] == "korthikanti22-22b-full")
    inst = run_instance(data, run)
    tr = inst.spec.training.model_copy(
        update={"async_tensor_model_parallel_allreduce": async_allreduce})
    inst = inst.with_spec(training=tr)
    out = {}
    for (rec, sp) in TABLE4_MS:
        spec = inst.spec.plan.model_copy(update={"recompute": rec, "sequence_parallel": sp})
        plan = plan_from_spec(inst, spec)
        layer = step_terms(inst, plan.grid.degrees(), plan.knobs).layer
        out[(rec, sp)] = 1e3 * float(layer["dense_compute"] + layer["tp_comm"])
    return out


def test_layer_times_of_korthikanti_table4(data):
    """The model's layer (compute + tensor-parallel collectives) is within 10% of each measured
    row, and each row's ratio to the no-recompute baseline within 3 points of the paper's; the
    same model without the backward all-reduce overlap misses the ratios."""
    base = ("none", False)

    def ratio_misses(ms):
        return {k: round(ms[k] / ms[base] - TABLE4_MS[k] / TABLE4_MS[base], 3)
                for k in TABLE4_MS if abs(ms[k] / ms[base] - TABLE4_MS[k] / TABLE4_MS[base]) > 0.03}

    ms = _layer_ms(data, True)
    for key, measured in TABLE4_MS.items():
        assert abs(ms[key] / measured - 1) <= 0.10, (key, ms[key], measured)
    assert not ratio_misses(ms), ratio_misses(ms)
    assert ratio_misses(_layer_ms(data, False))


def test_a_gpu_type_fitted_on_one_source_is_calibration_only(data, results, oos):
    """The B200 runs (and the fitted GB200 ones) are the only ones of their GPU type, from one
    source each, and the catalog holds their fit: they set its efficiency but have no
    out-of-sample error (without their source
    the type has no fit) and stay out of the bounds, reported apart. A second source of the type
    brings them in, and so does a runs file the catalog was not fitted on (the same runs timed
    10% slower: their fit is not the catalog's, their errors are predictions): the rule follows
    from the sources and the catalog, not from a mark on chosen runs."""
    alone = {r.id for r in results if r.calibration_only}
    blackwell = {r["id"] for r in data["runs"]
                 if r["gpu"] in ("b200", "gb200") and "held_out" not in r}
    assert alone == blackwell and any(i.startswith("dgxc2505-gb200") for i in alone)
    assert all(oos[i] is None for i in alone)
    assert all(oos[r.id] is not None for r in results if r.id not in alone)
    s = summary(results)
    errs = [abs(r.error) for r in results if r.id in alone]
    assert s["calibration_only"] == len(alone)
    assert s["max_abs_error_calibration_only"] == pytest.approx(max(errs))
    # the same runs under a second source name: one short B200 run is now its own source, but
    # B200's attention figure still rests on the long-sequence rows alone; one long row under
    # that name too, and neither figure rests on one source
    runs = [dict(r) for r in data["runs"]]
    moved = next(r for r in runs if r["id"] in alone and r["gpu"] == "b200"
                 and seq_len(data, r) < LONG_SEQ)
    moved["source"] = "another B200 benchmark v1"
    two = {"models": data["models"], "runs": runs}
    assert set(calibration_only_keys(two)) == {"b200", "gb200"}
    long_one = next(r for r in runs if r["gpu"] == "b200" and seq_len(data, r) >= LONG_SEQ)
    long_one["source"] = "another B200 benchmark v1"
    assert set(calibration_only_keys(two)) == {"gb200"}
    two_oos = out_of_sample(two)
    assert all(two_oos[r["id"]] is not None for r in runs if r["id"] in alone
               and r["gpu"] == "b200")
    slower = {"models": data["models"],
              "runs": [{**r, "measured_step_time_s": 1.1 * r["measured_step_time_s"]}
                       for r in data["runs"] if r["id"] in alone]}
    assert single_source_keys(slower) and not calibration_only_keys(slower)
    assert summary(validate_runs(slower, alone=calibration_only_keys(slower)))["runs"] == \
        len(alone)


def test_blackwell_keeps_no_fp8_transpose():
    """Transformer Engine caches an FP8 copy of each GEMM weight and, where FP8 GEMMs are TN
    only (Hopper), its transpose; Blackwell runs FP8 GEMMs in any layout and keeps the copy
    alone: the FP8 weight memory on B200 is half what the Hopper rule would count, the 16-bit
    weights the same. And every Blackwell run in the set (B200, GB200, GB300), which ran, fits
    (five did not while the catalog took the Blackwell capacities from datasheet GB read as
    10^9 bytes, below what nvidia-smi reports)."""
    from dataclasses import replace

    from planner.model.evaluate import evaluate
    from planner.model.instance import parse_instance
    from planner.model.plan import plan_from_spec
    from planner.model.schema import PlanSpec

    def weights(precision, cache_bytes=None):
        inst = parse_instance({"model": {"preset": "llama3-70b"},
                               "training": {"global_batch": 64, "precision": precision},
                               "cluster": {"gpu": "b200", "gpus": 64}})
        if cache_bytes is not None:
            inst = replace(inst, hw=replace(inst.hw, fp8_weight_cache_bytes=cache_bytes))
        spec = PlanSpec(tp=4, pp=4, dp=4, micro_batch=1)
        return evaluate(inst, plan_from_spec(inst, spec), spec=spec).memory_gib["weights"]

    bf16, fp8, hopper_rule = weights("bf16"), weights("fp8"), weights("fp8", 2.0)
    assert fp8 > bf16
    assert hopper_rule - bf16 == pytest.approx(2 * (fp8 - bf16), rel=1e-12)
    data = load_runs()
    blackwell = {"models": data["models"],
                 "runs": [r for r in data["runs"] if r["gpu"] in ("b200", "gb200", "gb300")]}
    fits = {r.id: r.report.fits for r in validate_runs(blackwell)}
    assert len(fits) >= 10 and all(fits.values()), {k: f for k, f in fits.items() if not f}


def test_a_one_source_gpu_type_fits_its_asymptote_at_the_knees_the_others_set(monkeypatch):
    """The shared GEMM knees are chosen by the GPU types whose fitted runs come from two sources
    or more: a type with one source (GB200's dgxc-benchmarking runs) pulls as hard as it likes
    toward other knees and still gets the others' knees, with its own efficiency at them. The
    error surfaces are synthetic: x's runs are exact at efficiency index 10 and knees (1, 1),
    y's at index 20 and knees (3, 3), y's pull ten times x's."""
    import numpy as np

    import planner.app.calibration as cal

    shape = (len(cal.EFF_GRID), len(cal.KNEE_TOKENS_GRID), len(cal.KNEE_WIDTH_GRID))

    def surface(e, kt, kw, weight):
        i, j, k = np.indices(shape)
        return 1.0 + weight * (abs(i - e) + abs(j - kt) + abs(k - kw)) / 100

    def fake(data, run, fit16):
        return surface(10, 1, 1, 1.0) if run["gpu"] == "x" else surface(20, 3, 3, 10.0)

    monkeypatch.setattr(cal, "_grid_times", fake)
    runs = [{"id": f"{g}{n}", "gpu": g, "precision": "bf16", "measured_step_time_s": 1.0,
             "source": src}
            for n, (g, src) in enumerate([("x", "paper A"), ("x", "paper B"), ("y", "suite C"),
                                          ("y", "suite C")])]
    fit = cal.Calibrator({"runs": runs}).fit()
    assert (fit["x"]["gemm_knee_tokens"], fit["x"]["gemm_knee_width"]) == (
        cal.KNEE_TOKENS_GRID[1], cal.KNEE_WIDTH_GRID[1])
    assert fit["y"]["gemm_knee_tokens"] == fit["x"]["gemm_knee_tokens"]
    assert fit["x"]["efficiency"] == cal.EFF_GRID[10] and fit["y"]["efficiency"] == cal.EFF_GRID[20]
    # one source more for y and it votes: its pull then wins the knees
    runs[2]["source"] = "suite D"
    assert cal.Calibrator({"runs": runs}).fit()["x"]["gemm_knee_tokens"] == cal.KNEE_TOKENS_GRID[3]


def test_gb300_fp8_figure_matches_gb200_on_the_same_release(data):
    """GB300's FP8 efficiency is set so that the model misses the Megatron-Bridge 26.04 GB300
    run of Llama 3.1 405B by what it misses the GB200 run of the same release and recipe family
    (hardware_catalog/gb300.toml, calibration): the two GPUs compare as they do on one release.
    Checked on the grid of the calibration (step 0.0025): the catalog value is the closest."""
    from planner.model.evaluate import evaluate
    from planner.model.plan import plan_from_spec
    runs = {r["id"]: r for r in data["runs"]}

    def error(rid, over=None):
        run = runs[rid]
        inst = run_instance(data, run, over)
        rep = evaluate(inst, plan_from_spec(inst, inst.spec.plan), spec=inst.spec.plan)
        return rep.step_time_s / run["measured_step_time_s"] - 1

    target = error("mbridge2604-gb200-llama31-405b-fp8-256")
    eff = load_gpu("gb300").efficiency_fp8
    gaps = [abs(error("mbridge2604-gb300-llama31-405b-fp8-256", {"efficiency_fp8": e}) - target)
            for e in (eff - 0.0025, eff, eff + 0.0025)]
    assert gaps[1] < min(gaps[0], gaps[2]) and gaps[1] < 0.005, (target, gaps)
    assert eff > load_gpu("gb200").efficiency_fp8          # the newer GPU, not the newer release


#: Megatron-Bridge's performance summary, 26.04 container (docs/performance-summary-archive.md):
#: tokens/s per GPU of the DGX-B300 and DGX-B200 rows run with identical settings
B300_B200_PAIRS = {"efficiency": (15114, 13045),      # GPT-OSS 120B, BF16, 64 GPUs
                   "efficiency_fp8": (3131, 2815)}    # DeepSeek-V3, MXFP8, 256 GPUs


@pytest.mark.parametrize("figure", sorted(B300_B200_PAIRS))
def test_b300_figures_are_b200s_scaled_by_the_measured_ratio(figure):
    """B300 has no run of its own in the set: each efficiency is B200's times the throughput
    ratio of one release's identical B300 / B200 plans, on the calibration grid (step 0.0025);
    its plans say their figures are not fitted."""
    b300, b200 = load_gpu("b300"), load_gpu("b200")
    fast, slow = B300_B200_PAIRS[figure]
    assert getattr(b300, figure) == pytest.approx(getattr(b200, figure) * fast / slow, abs=0.00125)
    assert b300.measured_precisions == ()
    assert (b300.peak_tflops_bf16, b300.peak_tflops_fp8) == (b200.peak_tflops_bf16,
                                                             b200.peak_tflops_fp8)


@pytest.mark.parametrize("gpu", ["gb200", "gb300"])
def test_the_blackwell_caveat_states_what_the_2026_releases_measured(data, results, gpu):
    """The catalog ``caveat`` of GB200 / GB300 quotes how far the model sat from Megatron-Bridge's
    2026 dense Llama rows (held out); the figures it quotes are these runs' mean errors, so a
    change of the model that moves them makes the text stale and this test fail."""
    runs = {r["id"]: r for r in data["runs"]}
    moe = _moe_ids(data)
    groups: dict[str, list[float]] = {"fp8": [], "nvfp4": []}
    for r in results:
        run = runs[r.id]
        if (r.gpu == gpu and run.get("source", "").startswith("Megatron-Bridge 26")
                and r.id not in moe):
            assert r.held_out
            groups["nvfp4" if r.precision == "nvfp4" else "fp8"].append(r.error)
    text = load_gpu(gpu).caveat
    for cls, said in (("fp8", "at FP8 and MXFP8"), ("nvfp4", "at NVFP4")):
        errs = groups[cls]
        mean = round(100 * sum(errs) / len(errs))
        assert f"{mean}% above their measured step times on average {said} ({len(errs)} runs)" \
            in text or f"{mean}% {said} ({len(errs)} runs)" in text, (gpu, cls, mean, len(errs))
    # and every plan on the type carries it
    from planner.model.evaluate import caveats
    from planner.model.instance import parse_instance
    inst = parse_instance({"model": {"preset": "llama3-8b"},
                           "training": {"global_batch": 64, "precision": "fp8"},
                           "cluster": {"gpu": gpu, "gpus": 8}})
    assert any(c.startswith(f"{gpu}: ") and text in c for c in caveats(inst))


def test_a_run_may_name_a_shipped_preset_as_its_model(tmp_path):
    """A run's ``model`` may name a preset of planner/data/presets.toml with no ``[models]``
    table, as an instance's ``preset`` does: costed as the table ``{preset = name}`` is. A name
    that is neither is an error listing the presets; a table of the file wins over a preset."""
    from planner.model.errors import InputError

    def runs(model, table=""):
        return (table + '[[runs]]\nid = "r"\nmodel = "' + model + '"\ngpu = "h100-sxm"\n'
                'precision = "bf16"\nmeasured_step_time_s = 9.0\n'
                'plan = { tp = 4, pp = 4, dp = 4, vp = 5, micro_batch = 1, global_batch = 128 }\n')

    def predicted(text):
        path = tmp_path / "runs.toml"
        path.write_text(text)
        return validate_runs(load_runs(path))[0].predicted_s

    by_name = predicted(runs("llama3-70b", "[models]\n"))
    assert by_name == predicted(runs("x", '[models.x]\npreset = "llama3-70b"\n'))
    own = predicted(runs("llama3-70b", '[models.llama3-70b]\npreset = "llama3-70b"\nseq_len = 4096\n'))
    assert own < by_name                     # the file's table (half the sequence) is the one used
    with pytest.raises(InputError) as err:
        predicted(runs("llama9", "[models]\n"))
    assert "llama9" in str(err.value) and "llama3-70b" in str(err.value)

"""The ``plan`` command line through typer's CliRunner (docs/contract.md, "Commands" and "Exit codes").

``result.output`` may or may not contain stderr depending on the click version; the helpers
below read stdout alone for JSON and everything for error messages.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from planner.app.cli import app
from planner.app.runs_file import load_runs

ROOT = Path(__file__).resolve().parents[1]
INSTANCES = sorted((ROOT / "instances").glob("*.toml"))
GPT3 = ROOT / "instances" / "gpt3-175b-a100.toml"

PLAN_KEYS = {"dp", "tp", "pp", "micro_batch", "micro_batches", "global_batch", "nodes", "gpus"}
BREAKDOWN_KEYS = {"compute", "bubble", "tp_comm", "pp_comm", "dp_comm", "optimizer"}


@pytest.fixture(scope="module")
def runner():
    return CliRunner()


def stdout_of(result) -> str:
    try:
        return result.stdout
    except ValueError:          # old click without separate stdout capture
        return result.output


def all_text(result) -> str:
    text = result.output
    try:
        err = result.stderr
    except ValueError:          # stderr mixed into output (old click default)
        err = ""
    return text if err in text else text + err


def run_json(runner, args, code=0):
    result = runner.invoke(app, args)
    assert result.exit_code == code, all_text(result)
    return json.loads(stdout_of(result))


def test_there_are_instances():
    assert len(INSTANCES) >= 3


@pytest.mark.parametrize("path", INSTANCES, ids=lambda p: p.name)
def test_evaluate_each_instance(runner, path):
    result = runner.invoke(app, ["evaluate", str(path)])
    assert result.exit_code == 0, all_text(result)
    text = all_text(result)
    assert "Step time" in text
    assert "Traceback" not in text


def test_the_report_names_eager_kernels(runner, tmp_path):
    """The plan report says when a plan is costed on eager PyTorch kernels (torchtitan's
    default stack), and the step time moves with the stack; the fused default goes unsaid."""
    base = (ROOT / "instances" / "llama3-70b-h100.toml").read_text()
    out = {}
    for name, extra in (("megatron", ""), ("torchtitan", 'framework = "torchtitan"\n'),
                        ("titan-fused", 'framework = "torchtitan"\n')):
        text = base.replace("[constraints]\n", "[constraints]\n" + extra, 1)
        if name == "titan-fused":
            text = text.replace("[training]\n", '[training]\nkernel_stack = "fused"\n', 1)
        path = tmp_path / f"{name}.toml"
        path.write_text(text)
        args = ["evaluate", str(path), "--dp-sharding", "optim_grads_params"]
        result = runner.invoke(app, args)
        assert result.exit_code == 0, all_text(result)
        out[name] = ("eager PyTorch kernels" in " ".join(all_text(result).split()),
                     run_json(runner, [*args, "--json"])["step_time_s"])
    assert [said for said, _ in out.values()] == [False, True, False]
    assert out["torchtitan"][1] != out["titan-fused"][1]


def test_emit_torchtitan_solves_on_torchtitans_kernels(runner, tmp_path):
    """``plan solve --emit torchtitan`` searches under torchtitan's defaults, its kernel stack
    included: the same plan and step time as the file naming the framework (the framework set
    after loading once left the fused figures in place while the export said eager)."""
    base = (ROOT / "instances" / "llama3-70b-h100.toml").read_text()
    named = tmp_path / "titan.toml"
    named.write_text(base.replace("[constraints]\n", '[constraints]\nframework = "torchtitan"\n', 1))
    # (the enumerator: which rules the search runs under is the question, not the backend)
    emitted = run_json(runner, ["solve", str(ROOT / "instances" / "llama3-70b-h100.toml"),
                                "--emit", "torchtitan", "--emit-to", str(tmp_path / "t.toml"),
                                "--solver", "enumerate", "--json"])
    direct = run_json(runner, ["solve", str(named), "--solver", "enumerate", "--json"])
    assert emitted["step_time_s"] == direct["step_time_s"]
    assert emitted["plan_spec"] == direct["plan_spec"]
    # the JSON says whose rules and kernels costed it
    assert (emitted["framework"], emitted["kernel_stack"]) == ("torchtitan", "pytorch")
    plain = run_json(runner, ["evaluate", str(ROOT / "instances" / "llama3-70b-h100.toml"),
                              "--json"])
    assert (plain["framework"], plain["kernel_stack"]) == ("megatron", "fused")
    assert "enable = false" in (tmp_path / "t.toml").read_text().split("[compile]")[1]


@pytest.mark.parametrize("path", INSTANCES, ids=lambda p: p.name)
def test_evaluate_json_contract(runner, path):
    d = run_json(runner, ["evaluate", str(path), "--json"])
    assert PLAN_KEYS <= set(d["plan"])
    assert {"cp", "vp", "recompute", "sequence_parallel", "distributed_optimizer"} <= set(
        d["plan"])
    p = d["plan"]
    assert p["tp"] * p["pp"] * p["dp"] * p["cp"] == p["gpus"]
    assert p["global_batch"] == p["dp"] * p["micro_batch"] * p["micro_batches"]
    assert isinstance(d["step_time_s"], float) and d["step_time_s"] > 0
    assert BREAKDOWN_KEYS <= set(d["breakdown_s"])
    assert sum(d["breakdown_s"].values()) == pytest.approx(d["step_time_s"], rel=1e-9)
    assert {"total", "capacity"} <= set(d["memory_gib"])
    parts = ("weights", "gradients", "optimizer_states", "activations")
    assert set(parts) <= set(d["memory_gib"])
    assert 0 < d["memory_gib"]["total"] <= d["memory_gib"]["capacity"]
    assert 0 < d["mfu"] < 1
    assert d["total_days"] > 0
    assert d["cost"] > 0                  # every shipped instance has a price
    assert d["feasible"] is True and d["violations"] == []


@pytest.mark.parametrize("path", INSTANCES, ids=lambda p: p.name)
def test_the_plan_spec_evaluates_to_the_same_plan(runner, path, tmp_path):
    """``plan_spec`` is the plan as a [plan] table: each shipped instance's own [plan] (or,
    without one, the solved optimum) written back as ``plan_spec`` evaluates to the same plan
    and step time."""
    import tomllib
    doc = tomllib.loads(path.read_text())
    if "plan" not in doc and isinstance(doc["cluster"].get("nodes"), list):
        pytest.skip("a range of cluster sizes: no single plan to write back")
    d = run_json(runner, ["evaluate", str(path), "--json"] if "plan" in doc else
                 ["solve", str(path), "--solver", "enumerate", "--json"])
    lines = path.read_text().splitlines()
    cut = next((i for i, ln in enumerate(lines) if ln.split("#")[0].strip() == "[plan]"),
               len(lines))
    text = "\n".join(lines[:cut]) + "\n[plan]\n" + "".join(
        f"{k} = {json.dumps(v)}\n" for k, v in d["plan_spec"].items())
    assert tomllib.loads(text)["plan"] == d["plan_spec"]
    f = tmp_path / path.name
    f.write_text(text)
    back = run_json(runner, ["evaluate", str(f), "--json"])
    assert back["plan"] == d["plan"]
    assert back["step_time_s"] == d["step_time_s"]


def test_json_days_follow_narayanan_eq4_and_cost_the_gpu_hours(runner):
    """Narayanan et al. 2021 Eq. 4: training time ~ 8 T P / (n X) for T tokens, P parameters, n
    GPUs at X FLOP/s each (Eq. 3's count, recomputation included); Sec. 5.1 works it for GPT-3:
    300e9 tokens, 1024 A100s at 140 TFLOP/s: 34 days. The planner's days for the GPT-3 instance
    (300e9 tokens, 1024 GPUs, B = 1536, s = 2048) are Eq. 4's at the throughput of its own step
    time, within Eq. 4's approximation (8 B s P for Eq. 3's count: 2.4% here)."""
    assert 8 * 300e9 * 175e9 / (1024 * 140e12) / 86400 == pytest.approx(34, abs=0.5)
    d = run_json(runner, ["evaluate", str(GPT3), "--json"])
    B, s, L, h, V, n = 1536, 2048, 96, 12288, 51200, d["plan"]["gpus"]
    assert (n, d["plan"]["global_batch"]) == (1024, B)
    eq3 = 96 * B * s * L * h**2 * (1 + s / (6 * h) + V / (16 * L * h))
    x = eq3 / (d["step_time_s"] * n)
    assert d["total_days"] == pytest.approx(8 * 300e9 * 175e9 / (n * x) / 86400, rel=0.05)
    # price_per_gpu_hour = 2.0: dollars = GPU-hours x 2
    assert d["cost"] == pytest.approx(d["total_days"] * 24 * n * 2.0, rel=1e-9)


def test_flag_overrides_tp(runner):
    base = run_json(runner, ["evaluate", str(GPT3), "--json"])
    # [plan] pins dp = 16; --tp 4 alone re-derives it from the 1024 GPUs: TP4 x PP8 x DP32
    tp4 = run_json(runner, ["evaluate", str(GPT3), "--json", "--tp", "4"])
    assert base["plan"]["tp"] == 8 and (tp4["plan"]["tp"], tp4["plan"]["dp"]) == (4, 32)
    assert tp4["step_time_s"] != pytest.approx(base["step_time_s"])
    ok = run_json(runner, ["evaluate", str(GPT3), "--json", "--tp", "4", "--dp", "32"])
    assert (ok["plan"]["tp"], ok["plan"]["dp"]) == (4, 32)
    assert ok["feasible"] is True
    assert ok["step_time_s"] == pytest.approx(tp4["step_time_s"], rel=1e-12)


def test_flag_override_inconsistent_plan_is_reported_not_crashed(runner):
    # --tp 4 with --dp 16 covers 512 of the 1024 GPUs: reported as a violation
    d = run_json(runner, ["evaluate", str(GPT3), "--json", "--tp", "4", "--dp", "16"], code=3)
    assert d["feasible"] is False
    assert any("1024" in v for v in d["violations"])


@pytest.mark.parametrize("args, key, value", [
    (["--recompute", "full"], "recompute", "full"),
    (["--no-sp"], "sequence_parallel", False),
    (["--no-distributed-optimizer"], "distributed_optimizer", False),
    (["--vp", "1"], "vp", 1),
    (["--micro-batch", "2"], "micro_batch", 2),
    (["--pp", "4", "--dp", "32"], "pp", 4),
])
def test_other_flags_override(runner, args, key, value):
    d = run_json(runner, ["evaluate", str(GPT3), "--json", *args])
    assert d["plan"][key] == value


def test_nodes_flag(runner):
    d = run_json(runner, ["evaluate", str(GPT3), "--json", "--nodes", "64", "--dp", "8"])
    assert d["plan"]["nodes"] == 64 and d["plan"]["gpus"] == 512


def _bad_files(tmp: Path) -> dict[str, tuple[list[str], str]]:
    unknown = tmp / "unknown.toml"
    unknown.write_text(GPT3.read_text().replace('preset = "gpt3-175b"',
                                                'preset = "gpt3-175b"\nhiden = 12288'))
    syntax = tmp / "syntax.toml"
    syntax.write_text("[model]\npreset = \"gpt3-175b\"\nlayers = = 4\n")
    gpu = tmp / "gpu.toml"
    gpu.write_text(GPT3.read_text().replace('gpu = "a100-80gb"', 'gpu = "a100"'))
    empty_runs = tmp / "runs-empty.toml"
    empty_runs.write_text('[models.tiny]\nlayers = 2\n')
    deep = tmp / "deep.toml"
    deep.write_text("a = " + "[" * 5000 + "]" * 5000 + "\n")
    ranged = tmp / "ranged.toml"
    ranged.write_text(GPT3.read_text().replace("nodes = 128", "nodes = [64, 128]"))
    huge = tmp / "huge.toml"
    huge.write_text(GPT3.read_text().replace("nodes = 128", "nodes = [1, 1000]"))
    return {
        "missing-file": (["evaluate", str(tmp / "nope.toml")], "no such file"),
        "unknown-key": (["evaluate", str(unknown)], "model.hiden"),
        "toml-syntax": (["evaluate", str(syntax)], "line 3"),
        "unknown-gpu": (["evaluate", str(gpu)], "a100-80gb"),
        "bad-recompute": (["evaluate", str(GPT3), "--recompute", "sometimes"], "--recompute"),
        "zero-tp": (["evaluate", str(GPT3), "--tp", "0"], "--tp"),
        "missing-runs": (["validate", str(tmp / "runs.toml")], "no such file"),
        "runs-without-runs": (["validate", str(empty_runs)], "expected"),
        "directory": (["solve", str(tmp)], "is a directory"),
        "deep-nesting": (["solve", str(deep)], "nested too deeply"),
        "plot-suffix": (["pareto", str(ranged), "--plot", str(tmp / "front")], "ending in .png"),
        "plot-dir": (["pareto", str(ranged), "--plot", str(tmp / "no" / "f.png")], "does not exist"),
        "pareto-too-many": (["pareto", str(huge)], "node_counts"),
        "workers-without-compare": (["solve", str(GPT3), "--workers", "2"], "--compare"),
    }


@pytest.mark.parametrize("case", ["missing-file", "unknown-key", "toml-syntax", "unknown-gpu",
                                  "bad-recompute", "zero-tp", "missing-runs",
                                  "runs-without-runs", "directory", "deep-nesting", "plot-suffix",
                                  "plot-dir", "pareto-too-many", "workers-without-compare"])
@pytest.mark.parametrize("as_json", [False, True])
def test_bad_input_exits_2_without_traceback(runner, tmp_path, case, as_json):
    args, needle = _bad_files(tmp_path)[case]
    if as_json:
        args = [*args, "--json"]
    result = runner.invoke(app, args)
    text = all_text(result)
    assert result.exit_code == 2, text
    assert "Traceback" not in text
    assert needle in text
    # no exception escaped the command (SystemExit from typer.Exit / click usage errors only)
    assert result.exception is None or isinstance(result.exception, SystemExit)
    if as_json:     # the error is also a JSON object on stdout (README: every command)
        doc = json.loads(stdout_of(result))
        assert doc["exit_code"] == 2 and needle in doc["error"] + "".join(doc.get("details", []))


def test_validate_json_reports_all_runs(runner):
    d = run_json(runner, ["validate", "--json", "--no-ranking"])   # ranking: test_ranking.py
    runs = load_runs()["runs"]
    ids = [r["id"] for r in runs]
    assert [r["id"] for r in d["runs"]] == ids
    held = [r["id"] for r in runs if "held_out" in r]      # not in the figures, still reported
    alone = [r["id"] for r in d["runs"] if r["calibration_only"]]   # reported apart
    assert d["summary"]["runs"] == len(ids) - len(held) - len(alone)
    assert d["summary"]["held_out"] == len(held)
    assert d["summary"].get("calibration_only", 0) == len(alone)
    for r in d["runs"]:
        assert {"measured_s", "predicted_s", "error", "fits", "memory_gib", "gpu",
                "held_out"} <= set(r)
        assert r["error"] == pytest.approx(r["predicted_s"] / r["measured_s"] - 1, rel=1e-9)
        assert (r["held_out"] is not None) == (r["id"] in held)
    assert d["summary"]["max_abs_error"] == pytest.approx(
        max(abs(r["error"]) for r in d["runs"]
            if r["held_out"] is None and not r["calibration_only"]))
    assert d["calibration"] is None


def test_validate_json_has_the_measured_alternatives(runner):
    """The shipped runs come with the shipped sets of measured alternatives and the allocator
    peaks of Megatron-LM's CI (the per-run figures are what the summary says)."""
    d = run_json(runner, ["validate", "--json", "--no-ranking"])
    ci = d["megatron_ci_memory"]
    assert len(ci["runs"]) == ci["summary"]["runs"] == 79
    assert min(r["measured_gib"] / r["model_gib"] for r in ci["runs"]) == pytest.approx(
        ci["summary"]["ratio_min"])
    assert max(r["uncounted_gib"] for r in ci["runs"]) == pytest.approx(
        ci["summary"]["max_uncounted_gib"])
    a, b, *table2 = d["alternatives"]
    assert a["id"].startswith("bloom-181b") and a["optimum"] is None   # (no ranking: no solve)
    assert len(table2) == 5 and all(t["timed_plans"] == 2 for t in table2)
    assert b["timed_plans"] == 16 and b["oom_plans"] == 3
    assert a["timed_plans"] == 19 and a["oom_plans"] == 3
    assert -1 <= a["kendall_tau"] <= 1


def test_validate_with_a_users_measured_sets(runner, tmp_path):
    """A user's own measured sweep (--alternatives): judged alone beside the runs file given,
    and a bad one is an input error naming its key."""
    f = tmp_path / "mine.toml"
    f.write_text('''[[sets]]
id = "mine"
model = { layers = 24, hidden = 2048, heads = 16, vocab = 51200, seq_len = 2048 }
gpu = "a100-80gb"
precision = "bf16"
plans = [
  { tp = 1, pp = 1, dp = 8, micro_batch = 4, global_batch = 256, measured_step_time_s = 2.0 },
  { tp = 2, pp = 1, dp = 4, micro_batch = 4, global_batch = 256, measured_step_time_s = 2.2 },
  { tp = 8, pp = 1, dp = 1, micro_batch = 4, global_batch = 256, measured_step_time_s = 3.0 },
]
''')
    d = run_json(runner, ["validate", str(ROOT / "planner" / "data" / "published_runs.toml"),
                          "--alternatives", str(f), "--json", "--no-ranking"])
    (a,) = d["alternatives"]
    assert d["megatron_ci_memory"] is None          # (a runs file given: judged alone)
    assert a["id"] == "mine" and a["timed_plans"] == 3 and a["oom_plans"] == 0
    assert [p["plan"] for p in a["plans"]] == ["TP1 PP1 DP8 mb4", "TP2 PP1 DP4 mb4",
                                                "TP8 PP1 DP1 mb4"]
    f.write_text(f.read_text().replace("micro_batch = 4, global_batch = 256, measured",
                                       "micro_batch = 4, global_batch = 256, colour = 1, "
                                       "measured", 1))
    result = runner.invoke(app, ["validate", "--alternatives", str(f), "--no-ranking"])
    assert result.exit_code == 2 and "plans[0].colour: unknown key" in all_text(result)

def test_validate_human(runner):
    # the ranking is left out here (tests/test_ranking.py has it, and .ci/run
    # runs `plan validate` with it before the tests)
    result = runner.invoke(app, ["validate", "--no-ranking"])
    assert result.exit_code == 0, all_text(result)
    text = all_text(result)
    assert "mean |error|" in text and "Traceback" not in text


def test_validate_explicit_runs_file(runner):
    d = run_json(runner, ["validate", str(ROOT / "planner" / "data" / "published_runs.toml"),
                          "--json", "--no-ranking"])
    runs = load_runs()["runs"]
    assert (d["summary"]["runs"] + d["summary"]["held_out"]
            + d["summary"].get("calibration_only", 0)) == len(runs)


def test_no_args_shows_help(runner):
    result = runner.invoke(app, [])
    text = all_text(result)
    assert "evaluate" in text and "validate" in text
    assert "Traceback" not in text



def test_error_keeps_bracketed_text(runner, tmp_path):
    # InputError says "training.global_batch: [lo, hi] needs lo <= hi, got [8, 4]"; rich markup
    # would print it as "training.global_batch:  needs lo <= hi, got [8, 4]"
    path = tmp_path / "gb.toml"
    path.write_text('[model]\npreset = "gpt3-175b"\n[training]\nglobal_batch = [8, 4]\n'
                    '[cluster]\ngpu = "a100-80gb"\nnodes = 1\n')
    result = runner.invoke(app, ["evaluate", str(path)])
    assert result.exit_code == 2
    assert "[lo, hi] needs lo <= hi" in all_text(result)



def test_validate_error_keeps_bracketed_text(runner, tmp_path):
    # load_runs says "expected [models.*] tables and [[runs]] entries"; printed as
    # "expected  tables and [] entries"
    path = tmp_path / "runs.toml"
    path.write_text("[models.tiny]\nlayers = 2\n")
    result = runner.invoke(app, ["validate", str(path)])
    assert result.exit_code == 2
    assert "[[runs]]" in all_text(result)


def test_user_text_that_looks_like_markup_exits_2(runner):
    result = runner.invoke(app, ["evaluate", str(GPT3), "--recompute", "[/x]"])
    assert result.exit_code == 2
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "[/x]" in all_text(result)


def test_inconsistent_micro_batches_is_reported(runner, tmp_path):
    path = tmp_path / "mb.toml"
    # the file's plan has 1536 / (16 * 1) = 96 micro-batches
    path.write_text(GPT3.read_text().replace("micro_batch = 1\n",
                                             "micro_batch = 1\nmicro_batches = 7\n"))
    assert "micro_batches = 7" in path.read_text()
    d = run_json(runner, ["evaluate", str(path), "--json"], code=3)
    assert d["plan"]["micro_batches"] == 96
    assert any("micro_batches" in v for v in d["violations"])


# ---- solver commands: the JSON contract of docs/contract.md, "JSON: solver result" ----------

SOLVER_KEYS = {"name", "status", "objective", "bound", "wall_s"}


def check_plan_result(d):
    assert {"dp", "tp", "pp", "micro_batch", "micro_batches", "global_batch", "nodes",
            "gpus"} <= set(d["plan"])
    assert {"compute", "bubble", "tp_comm", "pp_comm", "dp_comm", "optimizer"} <= \
        set(d["breakdown_s"])
    assert {"total", "capacity"} <= set(d["memory_gib"])
    for key in ("step_time_s", "mfu", "total_days", "cost"):
        assert key in d
    assert SOLVER_KEYS <= set(d["solver"])
    assert d["solver"]["status"] == "optimal"


@pytest.mark.parametrize("solver", ["cpsat", "highs", "enumerate"])
def test_solve_json_contract(runner, solver):
    d = run_json(runner, ["solve", str(ROOT / "instances" / "gpt-1.3b-1node.toml"),
                          "--solver", solver, "--json"])
    check_plan_result(d)
    assert d["solver"]["name"] == solver


def test_solve_top_compare_emit_json(runner):
    # (the enumerator: the subject is the JSON of the three answers, not the solver)
    d = run_json(runner, ["solve", str(ROOT / "instances" / "gpt-1.3b-1node.toml"), "--top",
                          "3", "--compare", "--emit", "megatron", "--json",
                          "--solver", "enumerate"])
    assert len(d["top"]) == 3 and d["top"][0]["gap_to_optimum"] == 0
    assert [t["step_time_s"] for t in d["top"]] == sorted(t["step_time_s"] for t in d["top"])
    assert {"constrained", "unconstrained", "slowdown", "binding"} <= set(d["compare"])
    assert "--tensor-model-parallel-size" in d["launch"]["text"]


def test_pareto_and_capacity_json(runner, tmp_path):
    path = tmp_path / "range.toml"
    path.write_text('[model]\npreset = "gpt-1.3b"\n[training]\nglobal_batch = 256\n'
                    'tokens = 2e10\n[cluster]\ngpu = "h100-sxm"\nnodes = [1, 3]\n'
                    'price_per_gpu_hour = 2.0\n[constraints]\nmax_recompute_layers = 0\n')
    # (the enumerator's solves: the queries' JSON and their pool are what is checked here;
    # the backends' agreement has tests of its own)
    en = ["--solver", "enumerate"]
    front = run_json(runner, ["pareto", str(path), "--json", *en])
    assert front["points"] and all(p["on_front"] for p in front["points"])
    assert front["proven"] is True
    for p in front["points"]:
        check_plan_result(p)
    assert [p["nodes"] for p in front["all"]] == [1, 2, 3]
    # sizes solved side by side, one process each: the same answers (the solver's clocks aside)
    pooled = run_json(runner, ["pareto", str(path), "--json", "--workers", "2", *en])

    def untimed(doc):
        return [{**p, "solver": {k: v for k, v in p["solver"].items() if not k.endswith("_s")}}
                for p in doc["all"]]

    assert untimed(pooled) == untimed(front)
    best = min(p["total_days"] for p in front["points"])
    cap = run_json(runner, ["capacity", str(path), "--deadline-days", str(best * 1.01),
                            "--json", *en])
    check_plan_result(cap)
    assert cap["nodes"] in (1, 2, 3) and cap["total_days"] <= best * 1.01
    pooled = run_json(runner, ["capacity", str(path), "--deadline-days", str(best * 1.01),
                               "--json", "--workers", "2", *en])
    assert untimed({"all": [{**pooled, "wall_s": 0}]}) == untimed({"all": [{**cap, "wall_s": 0}]})


def test_solve_on_a_node_range_needs_a_size(runner, tmp_path):
    path = tmp_path / "range.toml"
    path.write_text('[model]\npreset = "gpt-1.3b"\n[training]\nglobal_batch = 256\n'
                    '[cluster]\ngpu = "h100-sxm"\nnodes = [1, 3]\n')
    result = runner.invoke(app, ["solve", str(path)])
    assert result.exit_code == 2 and "--nodes" in all_text(result)
    assert "cluster.nodes gives a range" in all_text(result)
    ok = runner.invoke(app, ["solve", str(path), "--nodes", "2", "--json"])
    assert ok.exit_code == 0
    path.write_text(path.read_text().replace("nodes = [1, 3]", "node_counts = [1, 3]"))
    result = runner.invoke(app, ["solve", str(path)])       # (named cluster.nodes once)
    assert result.exit_code == 2 and "cluster.node_counts lists several sizes" in \
        all_text(result)


def test_markup_in_a_model_name_is_printed_as_is(runner, tmp_path):
    path = tmp_path / "named.toml"
    path.write_text(GPT3.read_text().replace('preset = "gpt3-175b"',
                                             'preset = "gpt3-175b"\nname = "[bold]x[/] [/nope]"'))
    result = runner.invoke(app, ["evaluate", str(path)])
    assert result.exit_code == 0, all_text(result)
    assert "[bold]x[/] [/nope]" in stdout_of(result)


def test_a_front_drawn_from_a_solve_stopped_at_the_time_limit_says_so(runner, tmp_path,
                                                                       monkeypatch):
    """Under --time-limit a size's solve may stop with the best plan it has (``feasible``): the
    table is then not titled "Proven optimum", a note names that size, and the JSON's
    ``proven`` is false (the front is drawn from plans that may not be the sizes' optima)."""
    from dataclasses import replace

    from formulations import queries
    from formulations.result import Status

    path = tmp_path / "range.toml"
    path.write_text('[model]\npreset = "gpt-1.3b"\n[training]\nglobal_batch = 256\n'
                    'tokens = 2e10\n[cluster]\ngpu = "h100-sxm"\nnodes = [1, 2]\n'
                    'price_per_gpu_hour = 2.0\n[constraints]\nmax_recompute_layers = 0\n')
    solve = queries.solve

    def second_size_stopped(inst, *args, **kwargs):
        res = solve(inst, *args, **kwargs)
        return replace(res, status=Status.FEASIBLE, bound=None) if inst.nodes == 2 else res

    monkeypatch.setattr(queries, "solve", second_size_stopped)
    # (the enumerator's solves, stopped by the stand-in: the wording is the query's)
    front = run_json(runner, ["pareto", str(path), "--json", "--time-limit", "60",
                              "--solver", "enumerate"])
    assert front["proven"] is False
    assert [p["solver"]["status"] for p in front["all"]] == ["optimal", "feasible"]
    result = runner.invoke(app, ["pareto", str(path), "--time-limit", "60",
                                 "--solver", "enumerate"])
    assert result.exit_code == 0, all_text(result)
    text = " ".join(all_text(result).split())
    assert "Proven optimum" not in text and "Best plan found (not all proven)" in text
    assert "at 2 nodes the solver stopped at the time limit with a plan, not proven" in text
    assert "raise --time-limit (it was 60 s)" in text


def test_top_with_compare_compares_the_lists_first_plan(runner, monkeypatch, tmp_path):
    """``--top K --compare``: the comparison's constrained optimum is the list's first plan,
    the plan the report shows, not a second solve of the same space (which could break a tie
    otherwise): one solve of the constrained instance per listed plan, none more."""
    from formulations import queries

    path = tmp_path / "gpt13.toml"
    path.write_text((ROOT / "instances" / "gpt-1.3b-1node.toml").read_text()
                    + "\n[constraints]\nmax_tp = 2\n")
    solve, asked = queries.solve, []

    def counting(inst, *args, **kwargs):
        asked.append(inst.spec.constraints)
        return solve(inst, *args, **kwargs)

    monkeypatch.setattr(queries, "solve", counting)
    out = run_json(runner, ["solve", str(path), "--top", "2", "--compare", "--solver",
                            "enumerate", "--json"])
    assert out["compare"]["constrained"]["plan_spec"] == out["top"][0]["plan_spec"]
    own = [c for c in asked if c == asked[0]]
    assert len(own) == 2                    # the two listed plans' solves


def test_vs_optimum_sets_the_plan_against_the_proven_optimum(runner):
    """``evaluate --vs-optimum``: the optimum under the instance's constraints (``plan
    solve``'s), proven, and how much slower the evaluated plan is; no faster than it."""
    path = ROOT / "instances" / "gpt-1.3b-1node.toml"
    ev = run_json(runner, ["evaluate", str(path), "--vs-optimum", "--json"])
    best = run_json(runner, ["solve", str(path), "--json"])
    assert ev["optimum_proven"] is True
    assert ev["optimum"]["plan_spec"] == best["plan_spec"]
    assert ev["slower_than_optimum_by"] == pytest.approx(
        ev["step_time_s"] / best["step_time_s"] - 1)
    assert ev["slower_than_optimum_by"] >= -1e-9
    text = " ".join(all_text(runner.invoke(app, ["evaluate", str(path), "--vs-optimum"])).split())
    assert "The optimum under the same constraints is" in text


def test_vs_optimum_under_a_time_limit_says_the_optimum_is_not_proven(runner, monkeypatch):
    """With --time-limit the optimum's solve may stop with the best plan it has: the text
    calls it the best plan found, not the optimum, and the JSON's ``optimum_proven`` is false;
    --time-limit without --vs-optimum is a bad flag (nothing is solved)."""
    from dataclasses import replace

    from formulations import solve as solve_module
    from formulations.result import Status

    path = ROOT / "instances" / "gpt-1.3b-1node.toml"
    solve = solve_module.solve

    def stopped(*args, **kwargs):
        return replace(solve(*args, **kwargs), status=Status.FEASIBLE, bound=None)

    monkeypatch.setattr(solve_module, "solve", stopped)
    # (the enumerator's solve, stopped by the stand-in above: the cheapest solve to stop)
    ev = run_json(runner, ["evaluate", str(path), "--vs-optimum", "--time-limit", "9",
                           "--solver", "enumerate", "--json"])
    assert ev["optimum_proven"] is False and ev["optimum"]["solver"]["status"] == "feasible"
    text = " ".join(all_text(runner.invoke(
        app, ["evaluate", str(path), "--vs-optimum", "--time-limit", "9",
              "--solver", "enumerate"])).split())
    assert "The best plan found under the same constraints is" in text
    assert "not proven optimal; raise --time-limit (it was 9 s)" in text
    assert "The optimum under" not in text
    bad = runner.invoke(app, ["evaluate", str(path), "--time-limit", "9"])
    assert bad.exit_code == 2 and "--time-limit: only with --vs-optimum" in all_text(bad)


def test_pareto_with_no_feasible_size_exits_3(runner, tmp_path):
    path = tmp_path / "small.toml"
    path.write_text(GPT3.read_text().replace("nodes = 128", "nodes = [1, 2]")
                    # (with host offload 2 nodes fit: tests/test_offload.py)
                    .replace("[constraints]", "[constraints]\noptimizer_offload = false"))
    result = runner.invoke(app, ["pareto", str(path)])
    assert result.exit_code == 3, all_text(result)
    assert "no size in the range admits a plan" in all_text(result)
    assert "Traceback" not in all_text(result)


def test_highs_warnings_stay_off_the_json(tmp_path):
    # HiGHS writes warnings from C++ to file descriptor 1 ('HighsSparseMatrix ... at/below
    # tolerance'); a fuzzer's instance got one ahead of the JSON. Run as a process: only the
    # real descriptor shows it
    import subprocess
    import sys

    f = tmp_path / "i.toml"
    f.write_text('[model]\nlayers = 2\nheads = 1\nhidden = 8192\nvocab = 1000\nseq_len = 256\n'
                 '[training]\nglobal_batch = 2\n[cluster]\ngpu = "a100-80gb"\nnodes = 1\n'
                 'host_memory_bandwidth_GBps = 1.0\n')
    out = subprocess.run([sys.executable, "-m", "planner.app.cli", "solve", str(f), "--solver",
                          "highs", "--json"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["solver"]["status"] == "optimal"


def test_a_pasted_plan_spec_takes_a_one_flag_what_if(runner, tmp_path):
    """The README: paste plan_spec into [plan] and plan evaluate gives the same plan, "a start
    for what-if variations (--tp 8)". The pasted dp and placement were the solved grid's; a
    flag that changes tp, pp or cp (or --nodes) without --dp re-derives them from the GPU
    count, with a note, where the product used to break (tp*pp*dp != GPUs)."""
    base = ('[model]\npreset = "llama3-8b"\n[training]\nglobal_batch = 256\n'
            '[cluster]\ngpu = "h100-sxm"\nnodes = 4\n[constraints]\nmax_pp = 1\n')
    src = tmp_path / "base.toml"
    src.write_text(base)
    solved = run_json(runner, ["solve", str(src), "--json", "--solver", "enumerate"])
    spec = solved["plan_spec"]
    assert spec["tp"] != 8 and spec["dp"] == 32 // spec["tp"]
    lines = [f"{k} = {json.dumps(v)}" for k, v in spec.items()]
    pasted = tmp_path / "pasted.toml"
    pasted.write_text(base + "[plan]\n" + "\n".join(lines) + "\n")
    same = run_json(runner, ["evaluate", str(pasted), "--json"])
    assert same["step_time_s"] == pytest.approx(solved["step_time_s"], rel=1e-9)
    what_if = runner.invoke(app, ["evaluate", str(pasted), "--tp", "8"])
    assert what_if.exit_code == 0, all_text(what_if)
    assert "note: --tp 8: dp = 32 / (tp*pp*cp) = 32 / 8" in " ".join(all_text(what_if).split())
    doc = run_json(runner, ["evaluate", str(pasted), "--tp", "8", "--json"])
    assert (doc["plan"]["tp"], doc["plan"]["dp"], doc["plan"]["tp_intra"]) == (8, 4, 8)
    # --dp is the user's own: kept, and the product rule then speaks
    bad = run_json(runner, ["evaluate", str(pasted), "--tp", "8", "--dp", str(spec["dp"]),
                            "--json"], code=3)
    assert any("tp*pp*dp*cp" in v for v in bad["violations"])
    # another cluster size: dp follows it
    doc = run_json(runner, ["evaluate", str(pasted), "--nodes", "2", "--json"])
    assert doc["plan"]["dp"] == 16 // spec["tp"]


def test_evaluate_takes_the_expert_parallel_degree_as_a_flag(runner):
    path = ROOT / "instances" / "mixtral-8x7b-h100.toml"
    doc = run_json(runner, ["evaluate", str(path), "--ep", "4", "--json"])
    assert doc["plan"]["ep"] == 4 and doc["plan"]["ep_intra"] == 4
    assert doc["plan"]["dp"] == run_json(runner, ["evaluate", str(path), "--json"])["plan"]["dp"]


def _with_plan(tmp_path, path, drop=(), **keys):
    """A copy of an instance file with its [plan] keys ``keys`` set and ``drop`` removed (the
    [plan] table is the file's last: its key lines are rewritten there)."""
    from planner.model.words import toml_value

    head, plan = path.read_text().split("\n[plan]\n")
    lines = [line for line in plan.splitlines()
             if line.split("=")[0].strip() not in set(drop) | set(keys)]
    lines += [f"{k} = {toml_value(v)}" for k, v in keys.items()]
    out = tmp_path / path.name
    out.write_text(head + "\n[plan]\n" + "\n".join(lines) + "\n")
    return out


def evaluated(runner, args):
    """The JSON report of ``plan evaluate``, whether or not the plan fits (exit 0 or 3)."""
    result = runner.invoke(app, ["evaluate", *map(str, args), "--json"])
    assert result.exit_code in (0, 3), all_text(result)
    return json.loads(stdout_of(result))


def test_the_layout_flags_override_plan_as_the_file_would(runner, tmp_path):
    """``--first-stage-layers`` / ``--last-stage-layers`` (and the other layout knobs) stand
    for their [plan] keys: the same report as the file with them written in, and a layout
    that breaks the split rules names the flags that change it."""
    path = ROOT / "instances" / "llama3.1-405b-h100.toml"
    broken = runner.invoke(app, ["evaluate", str(path), "--pp", "8"])
    assert broken.exit_code == 2 and "--first-stage-layers" in all_text(broken)
    by_flag = evaluated(runner, [path, "--pp", "8", "--first-stage-layers", "15",
                                 "--last-stage-layers", "15"])
    # (the flag re-derives dp from the GPUs, as a file with pp = 8 would have to state it)
    written = evaluated(runner, [_with_plan(tmp_path, path, pp=8, dp=256, first_stage_layers=15,
                                            last_stage_layers=15)])
    assert by_flag["plan"]["stage_layers"] == [15] + [16] * 6 + [15]
    assert by_flag["step_time_s"] == written["step_time_s"]
    assert by_flag["memory_gib"] == written["memory_gib"]


def test_another_recompute_mode_drops_the_plan_s_recomputed_layer_count(runner, tmp_path):
    """The DeepSeek-V3 instance's [plan] recomputes 2 layers a stage in full; ``--recompute
    selective`` evaluates the selective plan (the count meant nothing under it) and says it
    dropped the count; ``--recompute-layers`` sets another count."""
    path = ROOT / "instances" / "deepseek-v3-h800.toml"
    result = runner.invoke(app, ["evaluate", str(path), "--recompute", "selective"])
    assert "drops [plan] recompute_layers = 2" in all_text(result)
    by_flag = evaluated(runner, [path, "--recompute", "selective"])
    written = evaluated(runner, [_with_plan(tmp_path, path, drop=("recompute_layers",),
                                            recompute="selective")])
    assert by_flag["step_time_s"] == written["step_time_s"]
    assert by_flag["memory_gib"] == written["memory_gib"]
    two = evaluated(runner, [path])
    one = evaluated(runner, [path, "--recompute-layers", "1"])
    assert one["memory_gib"]["activations"] > two["memory_gib"]["activations"]
    assert one["step_time_s"] < two["step_time_s"]


def test_zero_counts_in_plan_are_the_keys_left_out(runner, tmp_path):
    """``[plan] first_stage_layers = 0``, ``last_stage_layers = 0`` and ``recompute_layers =
    0`` read as the flags read 0 and as a result's ``plan`` writes them: an even share and
    every layer, the same plan and step time as without the keys (they were refused)."""
    base = (ROOT / "instances" / "llama3-70b-h100.toml").read_text().replace(
        'recompute = "none"', 'recompute = "full"')
    plain, zeros = tmp_path / "plain.toml", tmp_path / "zeros.toml"
    plain.write_text(base)
    zeros.write_text(base + "first_stage_layers = 0\nlast_stage_layers = 0\n"
                     "recompute_layers = 0\n")
    a = run_json(runner, ["evaluate", str(plain), "--json"])
    b = run_json(runner, ["evaluate", str(zeros), "--json"])
    assert b["plan"] == a["plan"] and b["step_time_s"] == a["step_time_s"]
    assert b["plan"]["recompute"] == "full" and b["plan"]["recompute_layers"] == 0
    bad = tmp_path / "bad.toml"
    bad.write_text(base + "recompute_layers = -1\n")
    r = runner.invoke(app, ["evaluate", str(bad)])
    assert r.exit_code == 2 and "plan.recompute_layers" in all_text(r)


def test_reshard_after_forward_flag_and_where_it_means_nothing(runner, tmp_path):
    """``evaluate --reshard-after-forward / --no-...`` sets FSDP's switch: resharding frees the
    gathered parameters after the forward (less memory) and gathers them again in the
    backward (more data-parallel traffic). Under a mode that never gathers parameters the
    switch on is an input error, in ``[plan]`` as from the flag (it was echoed false)."""
    path = tmp_path / "fsdp.toml"
    path.write_text('[model]\npreset = "llama3-8b"\n[training]\nglobal_batch = 64\n'
                    '[cluster]\ngpu = "h100-sxm"\nnodes = 2\n[constraints]\n'
                    'framework = "torchtitan"\n[plan]\ntp = 1\npp = 1\ndp = 16\n'
                    'micro_batch = 1\ndp_sharding = "optim_grads_params"\n')
    on = run_json(runner, ["evaluate", str(path), "--reshard-after-forward", "--json"])
    off = run_json(runner, ["evaluate", str(path), "--no-reshard-after-forward", "--json"])
    assert on["plan"]["reshard_after_forward"] is True
    assert off["plan"]["reshard_after_forward"] is False
    assert on["memory_gib"]["total"] < off["memory_gib"]["total"]
    assert on["breakdown_s"]["dp_comm"] > off["breakdown_s"]["dp_comm"]
    r = runner.invoke(app, ["evaluate", str(path), "--dp-sharding", "optim",
                            "--reshard-after-forward"])
    assert r.exit_code == 2 and "plan.reshard_after_forward = true" in all_text(r)
    zero1 = tmp_path / "zero1.toml"
    zero1.write_text(path.read_text().replace('"optim_grads_params"', '"optim"')
                     + "reshard_after_forward = true\n")
    r = runner.invoke(app, ["evaluate", str(zero1)])
    assert r.exit_code == 2 and "(FSDP) only" in all_text(r)
    # a sharding flag that leaves FSDP drops a [plan]'s switch with a note, as --recompute
    # drops a count of fully recomputed layers
    fsdp_on = tmp_path / "fsdp_on.toml"
    fsdp_on.write_text(path.read_text().replace('framework = "torchtitan"\n', "")
                       + "reshard_after_forward = true\n")
    flags = ["--distributed-optimizer", "--recompute", "full"]     # (full: ZeRO-1 fits then)
    done = run_json(runner, ["evaluate", str(fsdp_on), *flags, "--json"])
    assert done["plan"]["dp_sharding"] == "optim"
    assert any("drops [plan] reshard_after_forward = true" in n for n in done["notes"])
    assert "notes" not in on                     # (no key re-derived or dropped)
    r = runner.invoke(app, ["evaluate", str(fsdp_on), *flags])
    assert r.exit_code == 0, all_text(r)
    assert "--distributed-optimizer drops [plan] reshard_after_forward = true" in \
        " ".join(r.stderr.split())

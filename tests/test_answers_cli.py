"""Answers a user can use as printed (issue 13): ``--emit`` output alone and parseable,
``--emit-to``, JSON errors from every command, exit codes, ``--compare`` against the true
unconstrained optimum, the Pareto front over (time, cost), messages in the user's words.

Exports are read from the raw stdout bytes (a subprocess for one case, CliRunner's captured
stdout for the rest) and parsed with the format's own parser.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from formulations import queries
from planner.app.cli import app
from planner.app.emit import FORMATS, emit
from planner.model.instance import load_instance
from planner.model.plan import plan_from_spec
from planner.model.schema import REACHES, WHAT_IFS, ConstraintSpec

ROOT = Path(__file__).resolve().parents[1]
GPT13 = ROOT / "instances" / "gpt-1.3b-1node.toml"
GPT3 = ROOT / "instances" / "gpt3-175b-a100.toml"
LLAMA70 = ROOT / "instances" / "llama3-70b-h100.toml"
#: host offload pinned off, for tests whose point is elsewhere (offload: tests/test_offload.py)
NO_OFFLOAD = "[constraints]\noptimizer_offload = false\noffload_layers = 0"
MIXTRAL = ROOT / "instances" / "mixtral-8x7b-h100.toml"


@pytest.fixture(scope="module")
def runner():
    return CliRunner()


def _streams(result) -> tuple[str, str]:
    return result.stdout, result.stderr


def megatron_args(text: str) -> list[str]:
    """The argument list of a Megatron export: comment and ``export`` lines dropped, the
    continued lines joined, split as a shell would."""
    body = [ln for ln in text.splitlines() if ln and not ln.startswith(("#", "export "))]
    return shlex.split(" ".join(body).replace("\\ ", " "), comments=True)


def parse(fmt: str, text: str):
    """Parse an export with the format's parser; raises when it is not well formed."""
    if fmt == "deepspeed":
        return json.loads(text)
    if fmt == "torchtitan":
        return tomllib.loads(text)
    if fmt == "megatron":
        args = megatron_args(text)
        assert args and all(a.startswith("--") for a in args[::1] if a.startswith("-")), args
        return args
    try:
        import yaml
    except ImportError:          # structure check: indented `key: value` / `key:` lines
        import re

        for ln in text.splitlines():
            assert ln.startswith("#") or re.fullmatch(r"( {2})*[a-z_0-9]+:( .+)?", ln), ln
        return text
    return yaml.safe_load(text)


# ---- 1. --emit writes the configuration alone ----------------------------------------------

def test_emit_deepspeed_stdout_is_exactly_the_json_subprocess():
    """The issue's command: ``plan solve ... --emit deepspeed > ds.json`` is valid JSON."""
    proc = subprocess.run([sys.executable, "-m", "planner.app.cli", "solve", str(GPT3), "--emit",
                           "deepspeed"], capture_output=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr.decode()
    doc = json.loads(proc.stdout.decode())          # the raw bytes, not a rendered table
    assert doc["train_batch_size"] == 1536
    inst = load_instance(GPT3)
    assert "Step time" in proc.stderr.decode()      # the report went to stderr
    assert proc.stdout.decode().endswith("}\n")
    assert doc["plan_parallelism"]["tensor"] * doc["plan_parallelism"]["pipeline"] * \
        doc["plan_parallelism"]["data"] == inst.gpus


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("path", [GPT13, GPT3, MIXTRAL], ids=lambda p: p.stem)
def test_emit_solve_stdout_parses_and_equals_the_library_text(runner, fmt, path):
    # the enumerator: one plan per question until ties are broken in every backend
    result = runner.invoke(app, ["solve", str(path), "--emit", fmt, "--solver", "enumerate"])
    assert result.exit_code == 0, result.output
    stdout, stderr = _streams(result)
    parse(fmt, stdout)
    assert "Solver certificate" in stderr and "Solver certificate" not in stdout
    js = json.loads(runner.invoke(app, ["solve", str(path), "--emit", fmt, "--json",
                                        "--solver", "enumerate"]).stdout)
    assert js["launch"]["text"] == stdout            # byte for byte the same text


@pytest.mark.parametrize("fmt", FORMATS)
def test_emit_evaluate_stdout_is_the_launch_of_the_plan(runner, fmt):
    result = runner.invoke(app, ["evaluate", str(GPT3), "--emit", fmt])
    if fmt == "torchtitan":       # a ZeRO-1 plan: torchtitan has no such mode, the rule is named
        assert result.exit_code == 2
        assert "torchtitan runs dp_sharding none | optim_grads_params" in result.output
        return
    if fmt == "deepspeed":        # an interleaved plan (VP3): DeepSpeed has none, the rule is named
        assert result.exit_code == 2
        assert "vp = 3: DeepSpeed has no interleaved pipeline" in result.output
        return
    assert result.exit_code == 0, result.output
    inst = load_instance(GPT3)
    assert result.stdout == emit(inst, plan_from_spec(inst, inst.spec.plan), fmt)
    assert "Step time" in result.stderr


def test_emit_to_writes_the_file_and_keeps_the_report_on_stdout(runner, tmp_path):
    target = tmp_path / "ds.json"
    result = runner.invoke(app, ["solve", str(GPT13), "--emit", "deepspeed", "--emit-to",
                                 str(target), "--solver", "enumerate"])
    assert result.exit_code == 0, result.output
    alone = runner.invoke(app, ["solve", str(GPT13), "--emit", "deepspeed", "--solver",
                                "enumerate"]).stdout
    assert target.read_text() == alone
    json.loads(target.read_bytes())
    assert "Step time" in result.stdout and str(target) in result.stdout


@pytest.mark.parametrize("args, needle", [
    (["--emit-to", "x.json"], "--emit-to needs --emit"),
    (["--emit", "yaml"], "unknown launch format"),
    (["--emit", "nemo", "--emit-to", "/nonexistent-dir/x.yaml"], "does not exist"),
])
def test_emit_flag_errors_exit_2(runner, args, needle):
    result = runner.invoke(app, ["solve", str(GPT13), *args])
    assert result.exit_code == 2
    assert needle in result.stderr


# ---- 8. --json errors, exit codes ----------------------------------------------------------

@pytest.mark.parametrize("args", [
    ["evaluate", "nope.toml"], ["solve", "nope.toml"], ["pareto", "nope.toml"],
    ["capacity", "nope.toml", "--deadline-days", "3"], ["validate", "nope.toml"],
    ["evaluate", str(GPT13), "--tp", "0"],                      # a usage error (click)
    ["solve", str(GPT13), "--no-such-flag"],
])
def test_every_command_gives_a_json_error_object(runner, args):
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 2
    doc = json.loads(result.stdout)
    assert doc["exit_code"] == 2 and isinstance(doc["error"], str) and doc["error"]
    assert result.stderr.strip()                       # and the text on stderr


def test_json_error_from_the_installed_entry_point():
    proc = subprocess.run([sys.executable, "-c", "from planner.app.cli import main; main()",
                           "solve", "nope.toml", "--json"], capture_output=True, timeout=60)
    assert proc.returncode == 2
    assert json.loads(proc.stdout) == {"error": "nope.toml: no such file", "exit_code": 2}
    assert b"no such file" in proc.stderr


def test_infeasible_with_json_carries_error_and_exit_code(runner, tmp_path):
    path = tmp_path / "small.toml"
    path.write_text(GPT3.read_text().replace("nodes = 128", "nodes = [1, 2]")
                    # (with host offload 2 nodes fit: tests/test_offload.py)
                    .replace("[constraints]", "[constraints]\noptimizer_offload = false"))
    result = runner.invoke(app, ["pareto", str(path), "--json"])
    assert result.exit_code == 3
    doc = json.loads(result.stdout)
    assert doc["exit_code"] == 3 and "no size" in doc["error"] and len(doc["all"]) == 2


def test_a_solver_that_is_not_installed_is_a_bad_flag(runner):
    from formulations.pyomo_backend import available

    if available("gurobi"):
        pytest.skip("gurobi is installed here")
    result = runner.invoke(app, ["solve", str(GPT13), "--solver", "gurobi", "--json"])
    assert result.exit_code == 2
    assert "gurobi" in json.loads(result.stdout)["error"]
    assert "not installed" in result.stderr


# ---- 6. evaluate without [plan] -------------------------------------------------------------

def test_evaluate_without_plan_is_an_error_that_says_so(runner, tmp_path):
    path = tmp_path / "noplan.toml"
    path.write_text('[model]\npreset = "gpt-1.3b"\n[training]\nglobal_batch = 64\n'
                    '[cluster]\ngpu = "h100-sxm"\nnodes = 1\n')
    result = runner.invoke(app, ["evaluate", str(path)])
    assert result.exit_code == 2
    assert "[plan]" in result.stderr and "Traceback" not in result.output + result.stderr
    flags = runner.invoke(app, ["evaluate", str(path), "--tp", "2", "--json"])
    assert flags.exit_code == 0 and json.loads(flags.stdout)["plan"]["tp"] == 2


# ---- 3. --compare ----------------------------------------------------------------------------

def test_unconstrained_keeps_caps_the_instance_raises():
    c = ConstraintSpec(max_cp=2, max_micro_batch=64, min_micro_batch=4, tp=8, max_tp=8,
                       tp_within_node=True, recompute="full", memory_reserve_GiB=3.0)
    u = queries.unconstrained_spec(c)
    assert (u.max_cp, u.max_micro_batch, u.min_micro_batch) == (2, 64, 1)
    assert (u.tp, u.max_tp, u.tp_within_node, u.recompute) == (None, None, False, None)
    assert u.memory_reserve_GiB == 3.0
    lowered = queries.unconstrained_spec(ConstraintSpec(max_micro_batch=8, max_ep=2))
    assert (lowered.max_micro_batch, lowered.max_ep) == (32, None)
    assert lowered.tp_within_node is True      # a default placement rule stays


def test_every_constraint_key_is_a_classified_what_if_or_kept():
    """One owner says what each [constraints] key is to a what-if (schema.WHAT_IFS): a key added
    to ConstraintSpec without a kind would be kept by --compare's baseline unseen (an audit:
    dp_sharding, the layout, recompute and offload pins were)."""
    assert set(WHAT_IFS) == set(ConstraintSpec.model_fields)
    assert set(WHAT_IFS.values()) <= {"pin", "filter", "cap", "floor", "reach", "placement",
                                      "kept"}
    assert set(REACHES) == {k for k, kind in WHAT_IFS.items() if kind == "reach"}
    assert set(queries.WHATIF_KEYS) == {k for k, kind in WHAT_IFS.items() if kind != "kept"}
    # the baseline frees every pin and filter, keeps what is not a what-if
    every = ConstraintSpec(tp=2, dp_sharding="none", dp_shard_size=2, reshard_after_forward=True,
                           first_stage_layers=3, last_stage_layers=3, recompute="full",
                           recompute_layers=2, max_recompute_layers=2, optimizer_offload=False,
                           offload_layers=4, max_stage_shortfall=0, min_mfu=0.3,
                           account_for_loss=False, framework="megatron",
                           overlap_grad_reduce=True, memory_reserve_GiB=3.0)
    u = queries.unconstrained_spec(every)
    for key, kind in WHAT_IFS.items():
        if kind in ("pin", "filter"):
            assert getattr(u, key) is None, key
        elif kind == "kept":
            assert getattr(u, key) == getattr(every, key), key
    assert (u.max_recompute_layers, u.max_stage_shortfall) == (None, 1)
    assert u.max_offload_layers == 4        # the pinned count stays in the baseline's space


def test_compare_with_a_dp_sharding_pin_compares_against_the_unpinned_optimum(runner, tmp_path):
    """dp_sharding = "none" was kept by the baseline (an audit): --compare said the pin cost
    nothing. The baseline is now the optimum without it, and the pin binds."""
    path = tmp_path / "gpt13.toml"
    path.write_text(GPT13.read_text() + '\n[constraints]\ndp_sharding = "none"\n')
    free = runner.invoke(app, ["solve", str(GPT13), "--json", "--solver", "enumerate"])
    r = runner.invoke(app, ["solve", str(path), "--compare", "--json", "--solver", "enumerate"])
    assert r.exit_code == 0 and free.exit_code == 0
    cmp, free = json.loads(r.stdout)["compare"], json.loads(free.stdout)
    base = cmp["unconstrained"]
    assert base["solver"]["objective"] == pytest.approx(free["solver"]["objective"])
    assert base["plan_spec"] == free["plan_spec"] and base["plan_spec"]["dp_sharding"] != "none"
    assert cmp["constrained"]["plan_spec"]["dp_sharding"] == "none"
    assert cmp["slowdown"] > 0
    (bind,) = [b for b in cmp["binding"] if b["constraint"] == "dp_sharding"]
    assert (bind["value"], bind["lifted_to"]) == ("none", None)


def test_compare_on_llama3_70b_is_never_faster_than_the_baseline(runner):
    """The issue's instance raises max_cp to 2: today's baseline dropped it and the constrained
    plan came out 1.95% *faster* than the 'unconstrained' one."""
    inst = load_instance(LLAMA70)
    cmp = queries.compare(inst, solver="enumerate")
    assert cmp.slowdown >= -1e-9
    assert cmp.unconstrained.report.step_time_s <= cmp.constrained.report.step_time_s * (1 + 1e-9)
    result = runner.invoke(app, ["solve", str(LLAMA70), "--compare", "--solver", "enumerate"])
    assert result.exit_code == 0
    assert "[constraints]" in result.stdout
    assert "slowdown -" not in result.stdout


def test_compare_signs_read_right(runner, tmp_path):
    path = tmp_path / "l70.toml"
    path.write_text(LLAMA70.read_text().replace("max_tp = 8", "max_tp = 2")
                    .replace("[constraints]", NO_OFFLOAD))     # (the signs are the point)
    cmp = queries.compare(load_instance(path), solver="enumerate")
    assert cmp.slowdown > 0 and cmp.binding
    text = runner.invoke(app, ["solve", str(path), "--compare", "--solver", "enumerate"]).stdout
    assert f"+{100 * cmp.slowdown:.2f}% slower" in text
    for b in cmp.binding:
        assert b["step_time_change_if_lifted"] < 0 < b["speedup_if_lifted"]
        assert b["step_time_without_s"] < cmp.constrained.report.step_time_s


# ---- 4. pareto -------------------------------------------------------------------------------

def test_pareto_does_not_star_a_size_another_beats_on_days_and_cost(runner, tmp_path):
    """H100 GPT-3: 8 nodes (106 days) costs more than 16 nodes (51.6 days); the front is exactly
    the sizes no other size beats on both days and cost."""
    path = tmp_path / "g3h.toml"
    path.write_text(GPT3.read_text().replace('gpu = "a100-80gb"', 'gpu = "h100-sxm"')
                    .replace("nodes = 128", "node_counts = [8, 16, 32]")
                    .replace("[constraints]", NO_OFFLOAD))     # (as the figures were taken)
    d = json.loads(runner.invoke(app, ["pareto", str(path), "--json", "--solver",
                                       "enumerate"]).stdout)
    pts = {p["nodes"]: p for p in d["all"]}
    assert pts[16]["total_days"] < pts[8]["total_days"] and pts[16]["cost"] < pts[8]["cost"]
    assert not pts[8]["on_front"]
    for n, p in pts.items():
        beaten = any(q["total_days"] <= p["total_days"] and q["cost"] <= p["cost"]
                     and (q["total_days"], q["cost"]) != (p["total_days"], p["cost"])
                     for m, q in pts.items() if m != n)
        assert p["on_front"] == (not beaten), n
    for p in d["all"]:       # starred iff no other size is at least as good on both
        dominated = any(q["total_days"] <= p["total_days"] and q["cost"] <= p["cost"]
                        and (q["total_days"], q["cost"]) != (p["total_days"], p["cost"])
                        for q in d["all"] if q is not p)
        assert p["on_front"] == (not dominated)


def test_pareto_shows_the_chosen_batch_of_a_range(runner, tmp_path):
    path = tmp_path / "range.toml"
    path.write_text('[model]\npreset = "gpt-1.3b"\n[training]\nglobal_batch = [64, 512]\n'
                    'tokens = 2e10\n[cluster]\ngpu = "h100-sxm"\nnode_counts = [1, 2]\n')
    result = runner.invoke(app, ["pareto", str(path), "--solver", "enumerate"])
    assert result.exit_code == 0
    assert "batch" in result.stdout
    d = json.loads(runner.invoke(app, ["pareto", str(path), "--json", "--solver",
                                       "enumerate"]).stdout)
    for p in d["all"]:
        assert f"{p['plan']['global_batch']:,}" in result.stdout


def test_pareto_gives_adjacent_sizes_without_a_plan_one_row(runner, tmp_path):
    """A range of node counts mostly holds sizes the structural rules rule out (469 of the
    512 of instances/llama3-70b-capacity.toml); adjacent ones share a row, and the JSON keeps
    every size."""
    path = tmp_path / "gaps.toml"
    path.write_text('[model]\npreset = "gpt-1.3b"\n[training]\nglobal_batch = 8\n'
                    '[cluster]\ngpu = "h100-sxm"\nnodes = [9, 16]\n')
    d = json.loads(runner.invoke(app, ["pareto", str(path), "--json", "--solver",
                                       "enumerate"]).stdout)
    planless = [p["nodes"] for p in d["all"] if not p.get("plan")]
    assert len(d["all"]) == 8 and planless == [9, 11, 14, 15]
    text = runner.invoke(app, ["pareto", str(path), "--solver", "enumerate"]).stdout
    rows = [line for line in text.splitlines() if "no plan satisfies" in line]
    assert len(rows) == 3, text
    assert " 14-15 " in rows[2] and "(2 sizes)" in rows[2]
    assert "sizes)" not in rows[0] + rows[1]


def test_plot_labels_carry_every_degree():
    from planner.app.plot import plan_label

    plan = {"tp": 2, "pp": 4, "dp": 8, "cp": 2, "vp": 3, "ep": 8, "micro_batch": 1,
            "global_batch": 512}
    assert plan_label(plan) == "TP2 PP4 DP8 CP2 VP3 EP8 mb1"
    assert plan_label(plan, batch=True).endswith(" B512")


def test_plot_cost_axis_starts_at_zero(tmp_path):
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from planner.app import plot

    pts = [{"plan": {"tp": 1, "pp": 1, "dp": g, "micro_batch": 1, "gpus": g,
                     "global_batch": 64}, "step_time_s": 10.0 / g, "total_days": 100.0 / g,
            "cost": 1000.0 + g, "on_front": True} for g in (8, 16, 32)]
    seen = {}
    real_close = plt.close

    def keep(fig):
        seen["ylim"] = fig.axes[1].get_ylim()
        real_close(fig)

    plt.close = keep
    try:
        plot.plot_front(pts, tmp_path / "f.png", "t")
    finally:
        plt.close = real_close
    assert seen["ylim"][0] == 0 and seen["ylim"][1] > 1032


# ---- 8. messages ------------------------------------------------------------------------------

def test_messages_use_toml_values_and_plurals(runner, tmp_path):
    bad = tmp_path / "b.toml"
    bad.write_text('[model]\npreset = "gpt-1.3b"\n[training]\nglobal_batch = [1]\n'
                   '[cluster]\ngpu = "h100-sxm"\nnodes = 1\n')
    text = runner.invoke(app, ["solve", str(bad)]).stderr
    assert "got a list of 1: [1]" in text and "(1,)" not in text
    one = runner.invoke(app, ["evaluate", str(GPT13)]).stdout
    assert "1 node of 8" in one and "node(s)" not in one
    d = runner.invoke(app, ["evaluate", str(tmp_path)]).stderr
    assert "expected an instance file" in d
    # a table where a number goes reads as the file wrote it, not as a Python dict (a fuzzer)
    table = tmp_path / "t.toml"
    table.write_text(GPT13.read_text().replace("nodes = 1", "nodes = { a = 1 }"))
    text = " ".join(runner.invoke(app, ["solve", str(table)]).stderr.split())
    assert "(got { a = 1 })" in text and "{'a'" not in text


def test_large_numbers_in_engineering_notation(runner, tmp_path):
    path = tmp_path / "huge.toml"
    # (training.tokens is bounded at 1e18 since 1e300 overflowed the cost to Infinity: the
    # largest figures now come from the bound and a steep price)
    path.write_text(GPT13.read_text().replace("tokens = ", "tokens = 1e18 #")
                    .replace("price_per_gpu_hour = ", "price_per_gpu_hour = 1e6 #"))
    out = runner.invoke(app, ["evaluate", str(path)]).stdout
    line = next(ln for ln in out.splitlines() if ln.lstrip().startswith("cost"))
    assert "e15" in line and "000000000" not in line


def test_stage_names_in_words():
    from planner.model.words import stage_words

    assert stage_words("first_moe") == "first pipeline stage (its layers counted as MoE layers)"
    assert stage_words("last") == "last pipeline stage"


def test_json_stays_json_when_pyomo_warns_while_loading_a_solution(runner, monkeypatch):
    """Pyomo logs a warning on standard output when it loads the incumbent of a solve that the
    time limit stopped ('aborted' status, but containing a solution); `--json` must stay one
    JSON document. (Reproduced in benchmarks/solve_scaling.py at 131,072 GPUs; here the
    warning is raised on every load, which a solve at the limit does not do reliably.)"""
    import logging

    from pyomo.core.base.PyomoModel import ModelSolutions

    load = ModelSolutions.load_from

    def warn_then_load(self, *args, **kwargs):
        logging.getLogger("pyomo.core").warning("Loading a SolverResults object with an "
                                                "'aborted' status, but containing a solution")
        return load(self, *args, **kwargs)

    monkeypatch.setattr(ModelSolutions, "load_from", warn_then_load)
    result = runner.invoke(app, ["solve", str(GPT13), "--solver", "highs", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(_streams(result)[0])["solver"]["status"] == "optimal"


# ---- the pareto / capacity audit ---------------------------------------------------------------

#: the small dense model of tests/test_queries.py (a second per size at most), sharding pinned
SMALL = """[model]
layers = 8
hidden = 1024
heads = 8
kv_heads = 4
gated_mlp = true
vocab = 32000
seq_len = 2048
position_embedding = "rope"
tied_embeddings = false
[training]
global_batch = 64
tokens = {tokens}
[cluster]
gpu = "{gpu}"
{size}
price_per_gpu_hour = 2.5
[constraints]
max_micro_batch = 4
dp_sharding = "optim"
optimizer_offload = false
max_recompute_layers = 0
{constraints}
"""


def _small(tmp_path, size="nodes = [1, 2]", tokens="2e9", gpu="h100-sxm", constraints="",
           name="small.toml") -> Path:
    f = tmp_path / name
    f.write_text(SMALL.format(size=size, tokens=tokens, gpu=gpu, constraints=constraints))
    return f


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_pareto_and_capacity_answer_a_partial_host_for_its_own_gpus(runner, tmp_path):
    f = _small(tmp_path, size="gpus = 4")
    solved = json.loads(runner.invoke(app, ["solve", str(f), "--json"]).stdout)
    front = json.loads(runner.invoke(app, ["pareto", str(f), "--json"]).stdout)
    [point] = front["all"]
    assert point["plan"]["gpus"] == solved["plan"]["gpus"] == 4
    assert point["total_days"] == pytest.approx(solved["total_days"], rel=1e-9)
    days = solved["total_days"]
    met = runner.invoke(app, ["capacity", str(f), "--deadline-days", str(days * 1.01)])
    assert met.exit_code == 0, met.output
    text = _flat(met.stdout)
    assert "4 x NVIDIA H100" in text and "4 GPUs (cluster.gpus, part of one node)" in text
    assert "Fewer GPUs may suffice" in text
    missed = runner.invoke(app, ["capacity", str(f), "--deadline-days", str(days * 0.99)])
    assert missed.exit_code == 3        # (8 GPUs meet it: the queries used to fill the host)
    assert "does not meet" in _flat(missed.stderr) and "4 GPUs" in _flat(missed.stderr)


def test_capacity_without_an_answer_names_the_fastest_size_not_the_largest(runner, tmp_path):
    """Found on Llama-3-70B at 80-81 nodes and 30 days (instances/llama3-70b-capacity.toml: 81
    nodes needs 39.7 days, 80 nodes 39.2): the answer named only the largest size's days as if
    they were the range's best. The small model has the same shape at 4-5 nodes (its batch of
    64 splits worse over 40 GPUs than over 32), in a fifth of the time."""
    f = _small(tmp_path, size="nodes = [4, 5]", tokens="2e12")
    r = runner.invoke(app, ["capacity", str(f), "--deadline-days", "2", "--json"])
    assert r.exit_code == 3, r.output
    d = json.loads(r.stdout)
    days = {c["nodes"]: c["days"] for c in d["checked"]}
    assert days[4] < days[5] and f"{days[4]:.1f}" != f"{days[5]:.1f}"
    assert d["fastest"]["nodes"] == 4 and d["fastest"]["days"] == days[4]
    assert f"the fastest found, 4 nodes, needs {days[4]:.1f} days" in d["error"]
    text = runner.invoke(app, ["capacity", str(f), "--deadline-days", "2"])
    assert f"The fastest size solved, 4 nodes, needs {days[4]:.1f} days" in _flat(text.stdout)


def test_capacity_without_any_plan_says_what_binds_not_the_deadline(runner, tmp_path):
    f = _small(tmp_path, constraints="tp = 3")
    r = runner.invoke(app, ["capacity", str(f), "--deadline-days", "1000"])
    assert r.exit_code == 3
    out, errs = _flat(r.stdout), _flat(r.stderr)
    assert "No size in the range has a plan: the deadline is not what rules them out" in out
    assert "meets 1000 days" not in out + errs
    assert "error: no size in the range has a plan" in errs
    assert "constraints.tp = 3 binds" in errs and "nearest change" in errs
    d = json.loads(runner.invoke(app, ["capacity", str(f), "--deadline-days", "1000",
                                       "--json"]).stdout)
    assert d["exit_code"] == 3 and any("constraints.tp = 3 binds" in x for x in d["details"])
    assert all(c["reason"] == "the constraints leave no plan" for c in d["checked"])
    assert d["next_smaller"]["proof"] == "no plan fits"
    assert d["next_smaller"]["reason"] == "the constraints leave no plan"


def test_capacity_panel_says_a_plan_stopped_at_the_time_limit_is_not_proven(
        runner, monkeypatch, tmp_path):
    from dataclasses import replace

    from formulations.result import Status
    from formulations.solve import solve

    monkeypatch.setattr("formulations.queries.solve",
                        lambda inst, **kw: replace(solve(inst, **kw), status=Status.FEASIBLE))
    f = _small(tmp_path)
    r = runner.invoke(app, ["capacity", str(f), "--deadline-days", "1000"])
    assert r.exit_code == 0, r.output
    text = _flat(r.stdout)
    assert "proven optimal plan" not in text
    assert "plan not proven optimal: the solver stopped at the time limit" in text


def test_days_are_printed_with_their_digits_in_pareto_and_capacity(runner, tmp_path):
    """1e7 tokens train in about 0.005 days: the table and the answer printed '0.0'."""
    f = _small(tmp_path, tokens="1e7")
    d = json.loads(runner.invoke(app, ["pareto", str(f), "--json"]).stdout)
    days = {p["nodes"]: p["total_days"] for p in d["all"]}
    assert max(days.values()) < 0.05
    table = runner.invoke(app, ["pareto", str(f)]).stdout
    for n, value in days.items():
        row = next(ln for ln in table.splitlines() if re.match(rf"│ . │\s+{n} │", ln))
        cell = [c.strip() for c in row.split("│")][6]
        assert float(cell) == pytest.approx(value, rel=0.01)
    deadline = min(days.values()) * 0.995
    r = runner.invoke(app, ["capacity", str(f), "--deadline-days", f"{deadline:.6g}"])
    assert r.exit_code == 3
    shown = float(re.search(r"needs ([0-9.]+) days", _flat(r.stdout)).group(1))
    assert shown > deadline and shown == pytest.approx(min(days.values()), rel=0.01)


def test_pareto_prints_the_plan_caveats_once_under_the_table(runner, tmp_path):
    """B300 has no measured run: every plan carries the caveat, which solve prints and the
    pareto text dropped."""
    f = _small(tmp_path, gpu="b300")
    d = json.loads(runner.invoke(app, ["pareto", str(f), "--json"]).stdout)
    caveats = {c for p in d["all"] for c in p["caveats"]}
    assert caveats
    text = runner.invoke(app, ["pareto", str(f)]).stdout
    flat = _flat(text)
    for c in caveats:
        assert flat.count(_flat(c)) == 1


@pytest.mark.parametrize("size, key", [
    ("node_counts = [" + ", ".join(str(n) for n in range(1, 601)) + "]", "cluster.node_counts"),
    ("nodes = [1, 600]", "cluster.nodes"),
], ids=["node_counts", "nodes"])
def test_pareto_size_limit_names_the_key_the_file_used(runner, tmp_path, size, key):
    f = _small(tmp_path, size=size)
    r = runner.invoke(app, ["pareto", str(f)])
    assert r.exit_code == 2
    errs = _flat(r.stderr)
    assert f"{key}:" in errs and "600 sizes" in errs and "at most 512" in errs
    other = {"cluster.nodes", "cluster.node_counts"} - {key}
    assert not any(f"{k}:" in errs for k in other)


def test_capacity_checks_the_solver_name_before_the_bound_skips_every_size(runner, tmp_path):
    f = _small(tmp_path)
    r = runner.invoke(app, ["capacity", str(f), "--deadline-days", "0.00001", "--solver", "foo"])
    assert r.exit_code == 2 and '--solver: unknown solver "foo"' in r.stderr


def test_validate_checks_the_solver_name_before_any_run(runner):
    r = runner.invoke(app, ["validate", "--solver", "foo"])
    assert r.exit_code == 2 and '--solver: unknown solver "foo"' in r.stderr
    assert "Predicted vs measured" not in r.stdout
    # without the ranking no solver runs, but the name is still bad input (a typo would
    # otherwise pass unseen), as it is for evaluate without --vs-optimum
    r = runner.invoke(app, ["validate", "--solver", "foo", "--no-ranking", "--json"])
    assert r.exit_code == 2 and json.loads(r.stdout)["exit_code"] == 2
    r = runner.invoke(app, ["evaluate", str(ROOT / "instances" / "gpt-1.3b-1node.toml"),
                            "--solver", "foo"])
    assert r.exit_code == 2 and '--solver: unknown solver "foo"' in r.stderr


@pytest.mark.parametrize("as_json", [False, True])
def test_capacity_exit_3_writes_an_error_line(runner, tmp_path, as_json):
    f = _small(tmp_path)
    flags = ["--json"] if as_json else []
    r = runner.invoke(app, ["capacity", str(f), "--deadline-days", "0.00001", *flags])
    assert r.exit_code == 3 and r.stderr.startswith("error: no size in the range meets")
    d = json.loads(runner.invoke(app, ["solve", str(f), "--nodes", "1", "--json"]).stdout)
    over = runner.invoke(app, ["capacity", str(f), "--deadline-days",
                               str(d["total_days"] * 1.01), "--budget-usd", "1", *flags])
    assert over.exit_code == 3
    assert "error: the cheapest plan meeting the deadline, " in over.stderr
    assert "over the $1 budget" in _flat(over.stderr)
    if as_json:
        doc = json.loads(over.stdout)
        assert doc["exit_code"] == 3 and doc["error"] in _flat(over.stderr)


def test_capacity_over_budget_with_a_stopped_capped_solve_is_no_verdict(
        runner, monkeypatch, tmp_path):
    """A larger size whose capped solve stopped at the time limit may hold a cheaper plan:
    'over budget' is then not shown (exit 4, raise --time-limit), and within budget says the
    cheapest is not proven."""
    from dataclasses import replace

    from formulations.result import Status
    from formulations.solve import solve

    def capped_stop(inst, **kwargs):
        if kwargs.get("max_objective") is None:
            return solve(inst, **kwargs)
        res = solve(inst, **dict(kwargs, max_objective=None))
        return replace(res, status=Status.NO_SOLUTION_IN_LIMIT, report=None)

    monkeypatch.setattr("formulations.queries.solve", capped_stop)
    f = _small(tmp_path)
    d = json.loads(runner.invoke(app, ["solve", str(f), "--nodes", "1", "--json"]).stdout)
    args = ["capacity", str(f), "--deadline-days", str(d["total_days"] * 1.01)]
    over = runner.invoke(app, [*args, "--budget-usd", "0.01"])
    assert over.exit_code == 4, over.output
    assert "--time-limit" in over.stderr and "at 2 nodes" in _flat(over.stderr)
    within = runner.invoke(app, [*args, "--budget-usd", "1e9"])
    assert within.exit_code == 0
    assert "note: the cheapest plan is not proven the cheapest" in _flat(within.stderr)


def test_pareto_help_describes_the_front_the_code_computes(runner):
    text = _flat(runner.invoke(app, ["pareto", "--help"]).stdout)
    assert "GPUs, step time, days and dollars" not in text
    assert "training days and dollars" in text and "GPU-seconds per sequence" in text


def test_pareto_says_what_the_front_is_decided_on_when_days_or_cost_are_not_shown(runner,
                                                                                 tmp_path):
    """Without tokens or a price the table shows '-' for days and cost, while the front is
    decided on time and GPU-seconds per sequence: an unmarked size had nothing shown to say
    why."""
    f = _small(tmp_path, tokens="0")
    f.write_text(f.read_text().replace("tokens = 0\n", ""))
    text = _flat(runner.invoke(app, ["pareto", str(f)]).stdout)
    assert "without training.tokens, time is the time per sequence" in text
    assert "cost GPU-seconds per sequence" in text
    f.write_text(_small(tmp_path).read_text().replace("price_per_gpu_hour = 2.5\n", ""))
    text = _flat(runner.invoke(app, ["pareto", str(f)]).stdout)
    assert "without cluster.price_per_gpu_hour, cost is GPU-seconds per sequence" in text
    priced = _flat(runner.invoke(app, ["pareto", str(_small(tmp_path, name="p.toml"))]).stdout)
    assert "front: without" not in priced

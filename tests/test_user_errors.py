"""What a new user ran into (the CLI audit of 2026-12-03), each as the answer the contract
promises: a plan that cannot run is refused, not exported; a bad key, flag or runs file is an
input error (exit 2) naming it; an empty space says which pin binds and the nearest change; a
report row says what it means."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
from rich.console import Console
from typer.testing import CliRunner

from formulations.solve import not_installed
from planner.app.cli import app
from planner.app.report import top_table
from planner.model.instance import load_instance
from planner.model.plan import plan_from_spec

ROOT = Path(__file__).resolve().parents[1]
GPT13 = ROOT / "instances" / "gpt-1.3b-1node.toml"
GPT3 = ROOT / "instances" / "gpt3-175b-a100.toml"


@pytest.fixture(scope="module")
def runner():
    return CliRunner()


def _instance(tmp_path: Path, extra: str, base: Path = GPT13) -> Path:
    f = tmp_path / "i.toml"
    f.write_text(base.read_text() + "\n" + extra + "\n")
    return f


def test_a_shard_group_that_does_not_divide_dp_is_a_violation_and_gets_no_export(runner):
    """dp_shard_size 3 of dp 16 would be 5.33 replicas: the plan breaks the HSDP rule (exit 3),
    and no launch configuration is written (stdout stays empty)."""
    for size in ("3", "32"):                # 32 > dp: half a replica
        r = runner.invoke(app, ["evaluate", str(GPT3), "--dp-shard-size", size,
                                "--emit", "megatron"])
        assert r.exit_code == 3, r.output
        assert r.stdout == ""
        assert f"dp_shard_size = {size} must be a divisor of dp = 16" in r.stderr
        assert "no launch configuration (megatron) written" in r.stderr
    ok = runner.invoke(app, ["evaluate", str(GPT3), "--dp-shard-size", "8", "--json"])
    assert ok.exit_code == 0 and json.loads(ok.stdout)["plan"]["dp_replicate"] == 2


def test_a_blocked_export_to_a_file_is_not_said_written(runner, tmp_path):
    """With --emit-to, a plan that breaks a rule writes no file, and the report does not
    claim one was written (it said "written to" above "no launch configuration written")."""
    out = tmp_path / "launch.sh"
    r = runner.invoke(app, ["evaluate", str(GPT3), "--dp-shard-size", "3", "--emit", "megatron",
                            "--emit-to", str(out)])
    assert r.exit_code == 3, r.output
    assert not out.exists()
    assert "written to" not in r.output + r.stderr
    assert "no launch configuration (megatron) written" in r.stderr


def test_contradictory_sharding_flags_are_an_input_error(runner):
    r = runner.invoke(app, ["evaluate", str(GPT13), "--no-distributed-optimizer",
                            "--dp-sharding", "optim_grads"])
    assert r.exit_code == 2
    assert "--no-distributed-optimizer contradicts --dp-sharding optim_grads" in r.stderr


def test_a_budget_without_a_price_is_an_input_error(runner, tmp_path):
    f = tmp_path / "noprice.toml"
    f.write_text(GPT13.read_text().replace("price_per_gpu_hour = 2.0\n", ""))
    for extra in ([], ["--json"]):
        r = runner.invoke(app, ["capacity", str(f), "--deadline-days", "5",
                                "--budget-usd", "100", *extra])
        assert r.exit_code == 2, r.output
        assert "cluster.price_per_gpu_hour" in r.stderr and "Traceback" not in r.output


def test_terms_the_encoding_cannot_hold_are_a_solver_failure_not_a_traceback(runner, monkeypatch):
    """A model term of a form the MIPs cannot represent (planner.model.algebra.Unencodable: a
    planner bug, as prediction depths once changed the objective's shape between layouts) is
    exit 4 naming the way around it, in text and JSON, not a traceback."""
    from formulations import solve as solve_mod
    from planner.model.algebra import Unencodable

    def unencodable(*args, **kwargs):
        raise Unencodable("categorical choices changed the structure of obj")
    monkeypatch.setattr(solve_mod, "encode", unencodable)
    for extra in ([], ["--json"]):
        r = runner.invoke(app, ["solve", str(GPT13), "--solver", "cpsat", *extra])
        assert r.exit_code == 4, r.output
        assert "Traceback" not in r.output
        assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
        assert "--solver enumerate solves it" in " ".join(r.stderr.split())
    assert json.loads(r.stdout)["exit_code"] == 4
    ok = runner.invoke(app, ["solve", str(GPT13), "--solver", "enumerate"])
    assert ok.exit_code == 0, ok.output


def test_a_time_limit_without_a_plan_says_to_raise_it(runner):
    r = runner.invoke(app, ["solve", str(GPT3), "--time-limit", "0.001"])
    if r.exit_code == 0:                       # (a very fast machine found a plan in 1 ms)
        pytest.skip("a plan within 1 ms")
    assert r.exit_code == 4
    assert "error: the solver returned no usable plan" in r.stderr
    assert "raise --time-limit (it was 0.001 s)" in " ".join(r.stderr.split())


def test_a_sweep_naming_a_solver_that_is_not_installed_runs_no_point(runner, tmp_path):
    if not_installed("gurobi") is None:
        pytest.skip("gurobi is installed here")
    f = tmp_path / "s.toml"
    f.write_text(f'base = "{GPT13}"\n[sweep]\nsolver = "gurobi"\n"cluster.nodes" = [1]\n')
    r = runner.invoke(app, ["sweep", str(f)])
    assert r.exit_code == 2
    assert "sweep.solver: Pyomo cannot find the MILP solver \"gurobi\"" in r.stderr
    assert "nothing was run" in r.stderr or "invalid sweep" in r.stderr


@pytest.mark.parametrize("pin, says, near", [
    ("pp = 16", "constraints.pp = 16 binds", "nearest change: pp = 8"),
    ("tp = 3", "constraints.tp = 3 binds", "nearest change: tp = 2"),
    ("micro_batch = 3", "constraints.micro_batch = 3 binds", "nearest change: micro_batch = 2"),
])
def test_a_pin_no_value_of_the_rules_allows_is_named_with_the_nearest_change(
        runner, tmp_path, pin, says, near):
    """Such a pin empties the other degrees too; the answer names the pin alone (not the
    expert or intra-node factors it emptied) and the allowed value nearest to it."""
    r = runner.invoke(app, ["solve", str(_instance(tmp_path, f"[constraints]\n{pin}"))])
    assert r.exit_code == 3
    assert says in r.stderr and near in r.stderr
    assert "expert" not in r.stderr and "intra-node" not in r.stderr
    # (nor an expert rule among the reasons: the model is dense)
    assert "ep divides" not in r.stderr


def test_an_offloading_space_that_the_host_cannot_hold_is_not_explained_as_zero_bytes(runner):
    """Llama 3 405B on one A100 node: the plan closest to fitting offloads its optimizer states,
    so its largest memory row is the host's; the explanation says so, with the GPU's own need,
    and never that weights, gradients and states take 0.0 GiB."""
    f = ROOT / "tests" / "data" / "l405_one_node.toml"
    r = runner.invoke(app, ["solve", str(f)])
    assert r.exit_code == 3
    text = " ".join(r.stderr.split())
    assert "take 0.0 GiB" not in text
    assert "no allowed plan fits both the GPU and its share of the host" in text
    assert "offloads" in text and "share" in text


def test_a_runs_file_is_checked_key_by_key(runner, tmp_path):
    good = ('[models.m]\npreset = "gpt-1.3b"\n[[runs]]\nid = "r1"\nmodel = "m"\n'
            'gpu = "a100-80gb"\nprecision = "bf16"\nmeasured_step_time_s = 3.5\n'
            'source = "test"\nplan = { tp = 1, pp = 1, dp = 8, global_batch = 512 }\n')
    cases = {
        "id given twice": good + good[good.index("[[runs]]"):],
        "measured_step_time_s: expected a positive number": good.replace("= 3.5", "= -1"),
        'got "3.5"': good.replace("= 3.5", '= "3.5"'),
        "unknown key extra": good + 'extra = 1\n',
        'model = "zz" is not one of the file\'s [models.*] tables':
            good.replace('model = "m"', 'model = "zz"'),
        'gpu = "v100" is not in the catalog': good.replace("a100-80gb", "v100"),
        # (both were accepted once: the run evaluated under no framework's rules, the
        # impossible date compared as text with the ranking's feature dates)
        'run r1: framework = "jax" is not one the planner knows': good + 'framework = "jax"\n',
        'run r1: code_date = "2023-02-30" is not a calendar date':
            good + 'code_date = "2023-02-30"\n',
        'run r1: code_date = "2023-13" is not a calendar date': good + 'code_date = "2023-13"\n',
        # (each was a traceback once, found by a seeded mutation of the shipped runs file)
        "run r1: source = 1.5: expected a string": good.replace('source = "test"',
                                                                  "source = 1.5"),
        "run r1: missing precision": good.replace('precision = "bf16"\n', ""),
        "run r1: model = [1, 2]: expected a string": good.replace('model = "m"',
                                                                    "model = [1, 2]"),
        "run r1: plan = 3: expected a table": good.replace(
            "plan = { tp = 1, pp = 1, dp = 8, global_batch = 512 }", "plan = 3"),
        "models.m: expected a table of [model] keys": good.replace(
            '[models.m]\npreset = "gpt-1.3b"\n', 'models = { m = 1 }\n'),
        # (read as llm-foundry ran them: a list where a name belongs is the plan's error)
        "run r1: plan.dp_sharding: Input should be": good.replace(
            "global_batch = 512 }", 'global_batch = 512, dp_sharding = ["optim_grads"] }')
        + 'framework = "llm-foundry"\nconfig = { fsdp_mixed_precision = ["PURE"] }\n',
    }
    for says, text in cases.items():
        f = tmp_path / "runs.toml"
        f.write_text(text)
        r = runner.invoke(app, ["validate", str(f), "--no-ranking"])
        assert r.exit_code == 2, (says, r.output)
        assert says in r.stderr, (says, r.stderr)
    f.write_text(good)
    assert runner.invoke(app, ["validate", str(f), "--no-ranking"]).exit_code == 0


def test_an_unknown_key_is_named_as_written_with_the_key_it_likely_meant(runner, tmp_path):
    """A key with '-' (a bare TOML key) or a space (a quoted one) is named as the user wrote
    it, each on its own line, with the key of whichever section it most likely meant (a
    fuzzer found such keys reported as a bare "<file>: unknown key"); a key of another
    section is pointed there rather than to a near name in its own."""
    f = tmp_path / "i.toml"
    f.write_text('"global batch" = 16\nglobal-batch = 3\n' + GPT13.read_text()
                 + "\n[constraints]\nfp8_param_gather = true\n")
    r = runner.invoke(app, ["evaluate", str(f)])
    assert r.exit_code == 2
    lines = [ln.strip() for ln in r.stderr.splitlines()]
    for key in ('"global batch"', "global-batch"):
        assert f"- {key}: unknown key (did you mean training.global_batch? See the README's " \
               "instance reference)" in lines, lines
    # (not constraints.overlap_param_gather, the nearest name of its own section)
    assert any(ln.startswith("- constraints.fp8_param_gather: unknown key (did you mean "
                             "training.fp8_param_gather?") for ln in lines), lines


def test_messages_name_the_users_keys(runner, tmp_path):
    f = tmp_path / "i.toml"
    f.write_text(GPT13.read_text().replace("preset =", "presett ="))
    r = runner.invoke(app, ["solve", str(f)])
    first = r.stderr.splitlines()[1]
    assert r.exit_code == 2 and "model.presett: unknown key (did you mean preset?" in first
    f.write_text(GPT13.read_text().replace('preset = "gpt-1.3b"', 'hf_config = "none.json"\n'
                                           'seq_len = 2048'))
    r = runner.invoke(app, ["solve", str(f)])
    assert r.exit_code == 2 and 'model.hf_config = "none.json":' in r.stderr
    f.write_text(GPT13.read_text() + "\n[constraints]\ndp_sharding = [\"optim\", \"zero\"]\n")
    r = runner.invoke(app, ["solve", str(f)])
    assert r.exit_code == 2
    assert [ln for ln in r.stderr.splitlines() if "dp_sharding" in ln] == \
        [ln for ln in r.stderr.splitlines() if "dp_sharding[1]" in ln and '"zero"' in ln]
    f.write_text(GPT13.read_text().replace("pp = 1\ndp = 8", "pp = 2\ndp = 4\n"
                                           "first_stage_layers = 30"))
    r = runner.invoke(app, ["evaluate", str(f)])
    assert r.exit_code == 2 and "more than the model's layers=24" in r.stderr


def test_the_top_list_says_what_sets_equal_looking_plans_apart():
    """Distinct plans may differ only in a knob the table has no column for (the HSDP shard
    group): the row says which."""
    inst = load_instance(GPT3)
    p = plan_from_spec(inst, inst.spec.plan)
    q = replace(p, dp_replicate=2)
    rows = [SimpleNamespace(objective=t, report=SimpleNamespace(plan=x, step_time_s=t),
                            proven=True) for x, t in ((p, 17.8), (q, 17.9))]
    console = Console(width=200, record=True)
    console.print(top_table(rows))
    text = console.export_text()
    assert "dp_shard_size 8" in text.splitlines()[-2] and "dp_shard_size" not in \
        text.splitlines()[-3]


def test_an_absurd_price_is_refused_rather_than_printed_as_a_300_digit_cost(runner, tmp_path):
    f = tmp_path / "i.toml"
    f.write_text(GPT13.read_text().replace("price_per_gpu_hour = 2.0", "price_per_gpu_hour = 1e300"))
    r = runner.invoke(app, ["solve", str(f)])
    assert r.exit_code == 2 and "cluster.price_per_gpu_hour" in r.stderr


@pytest.mark.parametrize("n", [19, 20])
def test_recompute_layers_need_full_recompute_whatever_their_count(runner, tmp_path, n):
    """(an odd remainder of layers once slipped through the rule)"""
    f = tmp_path / "i.toml"
    f.write_text(GPT13.read_text().replace(
        "distributed_optimizer = true",
        f'distributed_optimizer = true\nrecompute = "selective"\nrecompute_layers = {n}'))
    r = runner.invoke(app, ["evaluate", str(f)])
    assert r.exit_code == 2 and 'needs recompute = "full", not "selective"' in r.stderr


def _stops_without_a_plan(*args, **kwargs):
    """A solve that stopped at its time limit before finding a plan (what CP-SAT returns for a
    tiny --time-limit, without depending on the machine's speed)."""
    from formulations.result import SolveResult, Status

    return SolveResult(Status.NO_SOLUTION_IN_LIMIT, None, None, None, 0.001, 0.001, 0.0,
                       "cpsat", "step_time", note="UNKNOWN")


@pytest.mark.parametrize("as_json", [False, True])
def test_top_k_without_a_first_plan_exits_4_saying_to_raise_the_time_limit(
        runner, monkeypatch, as_json):
    """(an IndexError on the empty list, once)"""
    monkeypatch.setattr("formulations.queries.solve", _stops_without_a_plan)
    r = runner.invoke(app, ["solve", str(GPT13), "--top", "2", "--time-limit", "0.001",
                            *(["--json"] if as_json else [])])
    assert r.exit_code == 4, r.output
    assert "raise --time-limit (it was 0.001 s)" in " ".join(r.stderr.split())
    if as_json:
        doc = json.loads(r.stdout)
        assert doc["exit_code"] == 4 and doc["plan"] is None and "top" not in doc
        assert doc["solver"]["status"] == "no_solution_in_limit"


RUN = ('[models.m]\npreset = "gpt-1.3b"\n[[runs]]\nid = "r1"\nmodel = "m"\n'
       'gpu = "a100-80gb"\nprecision = "bf16"\nmeasured_step_time_s = 3.5\n'
       'source = "test"\nplan = { tp = 1, pp = 1, dp = 8, global_batch = 512 }\n')


def test_a_runs_file_holding_out_every_run_reports_predictions_without_an_error_bound(
        runner, tmp_path):
    """Nothing fitted, nothing to bound: the summary's figures over fitted runs are null (a
    ZeroDivisionError once); the held-out runs' own figures are there."""
    f = tmp_path / "runs.toml"
    f.write_text(RUN + 'held_out = "a new kind of run"\n')
    r = runner.invoke(app, ["validate", str(f), "--no-ranking", "--json"])
    assert r.exit_code == 0, r.output
    summ = json.loads(r.stdout)["summary"]
    assert summ["runs"] == 0 and summ["held_out"] == 1
    assert summ["mean_abs_error"] is None and summ["max_abs_error_out_of_sample"] is None
    assert summ["mean_abs_error_held_out"] > 0
    r = runner.invoke(app, ["validate", str(f), "--no-ranking"])
    assert r.exit_code == 0 and "runs: 0 in the bounded figures (every run is held out" in r.stdout


def test_top_k_is_capped_with_a_message_naming_the_flag(runner, monkeypatch):
    """Each plan of the list is a solve (--top 1000 ran for minutes): past the cap it is an
    input error before any solve."""
    monkeypatch.setattr("formulations.queries.solve", _stops_without_a_plan)  # (never reached)
    for extra in ([], ["--json"]):
        r = runner.invoke(app, ["solve", str(GPT13), "--top", "101", *extra])
        assert r.exit_code == 2, r.output
        assert "--top 101: at most 100 plans" in r.stderr
        if extra:
            assert json.loads(r.stdout)["exit_code"] == 2


def test_a_bad_sweep_file_under_json_is_a_json_error_on_stdout(runner, tmp_path):
    """(stdout stayed empty once)"""
    f = tmp_path / "sweep.toml"
    f.write_text('[sweep]\nquery = "solve"\n"plan.tp" = [1, 2]\n')      # no base, no instance
    r = runner.invoke(app, ["sweep", str(f), "--json"])
    assert r.exit_code == 2, r.output
    doc = json.loads(r.stdout)
    assert doc["exit_code"] == 2 and doc["error"]


@pytest.mark.parametrize("key", ["recompute", "dp_sharding"])
def test_an_empty_list_of_modes_is_an_input_error_naming_the_key(runner, tmp_path, key):
    """An empty list allows no plan: a slip in the file (exit 2), not a question whose answer is
    an empty search space (exit 3, once)."""
    f = _instance(tmp_path, f"[constraints]\n{key} = []")
    r = runner.invoke(app, ["solve", str(f)])
    assert r.exit_code == 2, r.output
    assert f"constraints.{key}: an empty list allows no mode" in r.stderr


@pytest.mark.parametrize("args, says", [
    (["evaluate", "--global-batch", "1099511627776"], "--global-batch: Input should be less "
     "than or equal to 1073741824"),
    (["evaluate", "--tp", "1099511627776"], "--tp: Input should be less than or equal to "
     "16777216"),
    (["solve", "--nodes", "2097152"], "--nodes: Input should be less than or equal to 1048576"),
    (["solve", "--time-limit", "inf"], "'--time-limit': inf is not a finite number"),
    (["capacity", "--deadline-days", "inf"], "'--deadline-days': inf is not a finite number"),
])
def test_flags_are_held_to_the_limits_of_the_keys_they_override(runner, args, says):
    """A flag value beyond the schema's limit for its key (or not finite) is an input error
    naming the flag and the limit, as the same value in the file is; they once reached the
    solvers (exit 3 or 4) or were answered (exit 0)."""
    for extra in ([], ["--json"]):
        r = runner.invoke(app, [args[0], str(GPT13), *args[1:], *extra])
        assert r.exit_code == 2, r.output
        assert says in " ".join(r.stderr.split())
        if extra:
            assert json.loads(r.stdout)["exit_code"] == 2


@pytest.mark.parametrize("command", [["pareto"], ["capacity", "--deadline-days", "30"]])
def test_sizes_that_stopped_at_the_time_limit_are_not_reported_infeasible(
        runner, monkeypatch, tmp_path, command):
    """Every size of the range stopped at the time limit without a plan: no answer because of
    the limit (exit 4, raise --time-limit), not 'no size admits / meets' (exit 3, once)."""
    monkeypatch.setattr("formulations.queries.solve", _stops_without_a_plan)
    f = tmp_path / "range.toml"
    f.write_text(GPT13.read_text().replace("nodes = 1", "nodes = [1, 2]"))
    for extra in ([], ["--json"]):
        r = runner.invoke(app, [command[0], str(f), *command[1:], "--time-limit", "0.001",
                                *extra])
        assert r.exit_code == 4, r.output
        said = " ".join(r.stderr.split())
        assert "at 2 sizes (1, 2 nodes) the solver stopped at the time limit" in said
        assert "raise --time-limit (it was 0.001 s)" in said
        if extra:
            doc = json.loads(r.stdout)
            assert doc["exit_code"] == 4
            if command[0] == "pareto":
                assert [p["status"] for p in doc["all"]] == ["no_solution_in_limit"] * 2
            else:
                assert doc["unproven"] == [1, 2]


def test_a_sweep_whose_points_stopped_at_the_time_limit_exits_4(runner, monkeypatch, tmp_path):
    """(exit 0 once, as if the sweep had answered)"""
    monkeypatch.setattr("formulations.solve.solve", _stops_without_a_plan)
    f = tmp_path / "sweep.toml"
    f.write_text(f'base = "{GPT13}"\n[sweep]\nquery = "solve"\ntime_limit = 0.001\n'
                 '"training.global_batch" = [256, 512]\n')
    for extra in ([], ["--json"]):
        r = runner.invoke(app, ["sweep", str(f), "--workers", "1", *extra])
        assert r.exit_code == 4, r.output
        said = " ".join(r.stderr.split())
        assert "2 rows stopped at the time limit without a plan" in said
        assert "raise [sweep] time_limit (it was 0.001 s)" in said
        if extra:
            assert json.loads(r.stdout)["exit_code"] == 4


def _capacity_on_one_or_two_nodes(runner, monkeypatch, tmp_path, solve_as):
    """``plan capacity --json`` on the 1.3B instance over 1-2 nodes with 30 days and a 5 s
    limit, ``formulations.queries.solve`` replaced by ``solve_as``."""
    monkeypatch.setattr("formulations.queries.solve", solve_as)
    f = tmp_path / "range.toml"
    f.write_text(GPT13.read_text().replace("nodes = 1", "nodes = [1, 2]"))
    return runner.invoke(app, ["capacity", str(f), "--deadline-days", "30", "--time-limit", "5",
                               "--json"])


def test_a_capacity_answer_above_a_size_that_stopped_says_it_is_not_proven_the_fewest(
        runner, monkeypatch, tmp_path):
    from formulations.solve import solve

    def stops_on_one_node(inst, **kwargs):
        return _stops_without_a_plan() if inst.nodes == 1 else solve(inst, **kwargs)

    r = _capacity_on_one_or_two_nodes(runner, monkeypatch, tmp_path, stops_on_one_node)
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["unproven"] == [1]
    assert "note: 2 nodes is not proven the fewest: at 1 node the solver stopped" in \
        " ".join(r.stderr.split())


@pytest.mark.parametrize("flags, says", [
    # both were accepted and echoed, then costed as if absent (a CLI fuzzer)
    (["--dp-sharding", "none", "--dp-shard-size", "2"], "dp_sharding = \"none\" shards nothing"),
    (["--no-sp", "--tp-comm-overlap"], "tp_comm_overlap = true needs sequence parallelism"),
    (["--dp-sharding", "none", "--overlap-param-gather"],
     "overlap_param_gather = true needs a sharded data-parallel mode"),
])
def test_plan_settings_the_model_would_drop_are_input_errors(runner, flags, says):
    r = runner.invoke(app, ["evaluate", str(GPT3), *flags])
    assert r.exit_code == 2, r.output
    assert says in r.stderr


def test_pinned_tp_comm_overlap_without_sequence_parallelism_is_an_input_error(runner, tmp_path):
    f = tmp_path / "i.toml"
    f.write_text(GPT3.read_text().replace("tp_within_node = true",
                                          "tp_within_node = true\ntp_comm_overlap = true\n"
                                          "sequence_parallel = false"))
    r = runner.invoke(app, ["solve", str(f)])
    assert r.exit_code == 2, r.output
    assert "tp_comm_overlap = true needs sequence parallelism" in r.stderr


@pytest.mark.parametrize("pins", ['dp_sharding = "none"', "distributed_optimizer = false"])
def test_pinned_overlap_param_gather_without_sharding_is_an_input_error(runner, tmp_path, pins):
    f = tmp_path / "i.toml"
    f.write_text(GPT3.read_text().replace("tp_within_node = true",
                                          "tp_within_node = true\noverlap_param_gather = true\n"
                                          + pins))
    r = runner.invoke(app, ["solve", str(f)])
    assert r.exit_code == 2, r.output
    assert "overlap_param_gather = true needs a sharded data-parallel mode" in r.stderr


def test_a_capacity_answer_from_a_solve_stopped_with_a_plan_meets_the_deadline(
        runner, monkeypatch, tmp_path):
    """A plan that meets the deadline shows its size suffices even when the solver stopped at
    the time limit before proving it the fastest (it used to be passed over for a larger
    size)."""
    from dataclasses import replace

    from formulations.result import Status
    from formulations.solve import solve

    def stopped_with_a_plan(inst, **kwargs):
        return replace(solve(inst, **kwargs), status=Status.FEASIBLE)

    r = _capacity_on_one_or_two_nodes(runner, monkeypatch, tmp_path, stopped_with_a_plan)
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["nodes"] == 1 and doc["meets_deadline"] and doc["unproven"] == []
    assert doc["solver"]["status"] == "feasible"
    assert "note: the plan on 1 node meets the deadline but is not proven the fastest" in \
        " ".join(r.stderr.split())


# ---- the CLI audit of 2026-12-05 -------------------------------------------------------------

def test_a_file_with_a_byte_order_mark_reads_as_without(runner, tmp_path):
    f = tmp_path / "bom.toml"
    f.write_bytes(b"\xef\xbb\xbf" + GPT13.read_bytes())
    with_bom = runner.invoke(app, ["solve", str(f), "--json", "--solver", "enumerate"])
    plain = runner.invoke(app, ["solve", str(GPT13), "--json", "--solver", "enumerate"])
    assert with_bom.exit_code == 0, with_bom.output
    assert json.loads(with_bom.stdout)["step_time_s"] == json.loads(plain.stdout)["step_time_s"]


@pytest.mark.parametrize("key, value, says", [
    ("global_batch", "[64]", "training.global_batch: expected sequences per step (a number) or "
                             "a range [lo, hi] (two numbers), got a list of 1: [64]"),
    ("global_batch", "[64, 128, 256]", "got a list of 3: [64, 128, 256]"),
    ("nodes", "[1, 2, 4]", "cluster.nodes: expected a node count (a number) or a range [lo, hi] "
                           "(two numbers), got a list of 3: [1, 2, 4]; for a list of sizes give "
                           "node_counts = [...]"),
])
def test_a_list_that_is_no_range_says_both_forms(runner, tmp_path, key, value, says):
    section = "[training]" if key == "global_batch" else "[cluster]"
    text = GPT13.read_text()
    lines = [ln for ln in text.splitlines() if not ln.startswith(f"{key} =")]
    at = lines.index(section) + 1
    f = tmp_path / "i.toml"
    f.write_text("\n".join(lines[:at] + [f"{key} = {value}"] + lines[at:]) + "\n")
    result = runner.invoke(app, ["solve", str(f)])
    assert result.exit_code == 2
    assert says in " ".join(result.output.split())


def test_the_moe_dispatcher_on_a_dense_model_is_an_input_error(runner, tmp_path):
    f = _instance(tmp_path, "")
    f.write_text(f.read_text().replace("[training]", '[training]\nmoe_token_dispatcher = "deepep"'))
    result = runner.invoke(app, ["solve", str(f)])
    assert result.exit_code == 2
    text = " ".join(result.output.split())
    assert "training.moe_token_dispatcher: applies to mixture-of-experts models only" in text
    assert "<file>" not in text


def test_a_one_day_deadline_reads_in_the_singular(runner, tmp_path):
    f = tmp_path / "c.toml"
    f.write_text('[model]\npreset = "gpt3-175b"\n[training]\nglobal_batch = 1536\n'
                 'tokens = 3e11\n[cluster]\ngpu = "a100-80gb"\nnodes = [96, 97]\n')
    result = runner.invoke(app, ["capacity", str(f), "--deadline-days", "1"])
    assert result.exit_code == 3
    text = " ".join(result.output.split())
    assert "meets 1 day" in text and "1 days" not in text


@pytest.mark.parametrize("write, says", [
    (lambda t: t.replace("nodes = 1", "nodes = [0, 4]"),
     "cluster.nodes: in [lo, hi], lo = 0: Input should be greater than 0 (got [0, 4])"),
    (lambda t: t.replace("global_batch = 512", "global_batch = [1, 2.5]"),
     "training.global_batch: in [lo, hi], hi = 2.5: Input should be a valid integer"),
    (lambda t: t.replace("tokens = 26e9", "tokens = 1e300"),
     "training.tokens: Input should be less than or equal to"),
    (lambda t: t + "\n[training]\nseq_len = 1\n", "a key or [section] given twice"),
])
def test_input_errors_an_input_fuzzer_found_name_what_is_wrong(runner, tmp_path, write, says):
    """A [lo, hi] pair with one bad value was 'Input should be a valid integer (got [0, 4])';
    1e300 tokens gave a cost of Infinity (not JSON) and exit 0; a section given twice was
    tomllib's 'Cannot declare ... twice' alone."""
    f = tmp_path / "i.toml"
    f.write_text(write(GPT13.read_text()))
    r = runner.invoke(app, ["solve", str(f), "--json"])
    assert r.exit_code == 2, r.output
    assert says in " ".join(r.stderr.split())


def test_a_file_that_is_not_utf8_is_said_to_be_so(runner, tmp_path):
    f = tmp_path / "i.toml"
    f.write_bytes(GPT13.read_text().encode("utf-16"))
    r = runner.invoke(app, ["solve", str(f)])
    assert r.exit_code == 2 and "not UTF-8 text" in r.stderr


def test_a_pareto_range_without_any_plan_says_what_binds(runner, tmp_path):
    """Every size infeasible: the text answer named no key (only --json's rows had the
    detail); it now prints each distinct explanation with the sizes it holds for."""
    text = GPT13.read_text().replace("nodes = 1", "nodes = [1, 2]")
    f = tmp_path / "i.toml"
    f.write_text(text + "\n[constraints]\ntp = 3\n")
    r = runner.invoke(app, ["pareto", str(f)])
    assert r.exit_code == 3
    assert "at 2 sizes (1, 2 nodes):" in r.stderr
    assert "constraints.tp = 3 binds" in r.stderr and "nearest change: tp = 2" in r.stderr


def test_a_fixed_plan_is_judged_by_the_degree_pins_and_caps_the_file_writes(runner, tmp_path):
    """A what-if written in [constraints] holds for the plan evaluated under it, as
    tp_within_node did already: max_tp = 4 with --tp 8 was 'fits', exit 0 (a fuzzer). A
    default cap (max_micro_batch = 32) does not judge a given plan."""
    f = _instance(tmp_path, "[constraints]\nmax_tp = 4\nmicro_batch = 8\n")
    r = runner.invoke(app, ["evaluate", str(f), "--tp", "8", "--dp", "1", "--micro-batch", "16"])
    assert r.exit_code == 3
    text = " ".join(r.output.split())
    assert "constraints.max_tp = 4 but the plan has tp = 8" in text
    assert "constraints.micro_batch = 8 but the plan has micro_batch = 16" in text
    big = _instance(tmp_path, "")
    r = runner.invoke(app, ["evaluate", str(big), "--micro-batch", "64", "--dp", "8"])
    assert "max_micro_batch" not in r.output


@pytest.mark.parametrize("flag, value, says", [
    ("--time-limit", "nan", "nan is not a finite number"),
    ("--time-limit", "0", "0: expected a number of at least 0.001"),
])
def test_a_number_flag_is_checked_for_finiteness_before_its_range(runner, flag, value, says):
    """'--time-limit nan' was told 'Input should be greater than or equal to 0.001' (typer's
    range check ran first), where 'inf' was told it is not finite (a fuzzer)."""
    r = runner.invoke(app, ["solve", str(GPT13), flag, value])
    assert r.exit_code == 2 and says in " ".join(r.output.split())


@pytest.mark.parametrize("write, says, not_says", [
    (lambda t: t.replace("nodes = 1", "node_counts = [1, 2, 0]"),
     "cluster.node_counts[2]: Input should be greater than 0 (got 0)", "node_counts.2"),
    (lambda t: t + '\n[constraints]\nrecompute = ["none", "bogus"]\n',
     "constraints.recompute[1]: Input should be", "recompute.1"),
])
def test_a_list_element_is_named_by_its_index_in_brackets(runner, tmp_path, write, says,
                                                           not_says):
    """``cluster.node_counts.2`` reads in TOML as a dotted key (a table node_counts with a key
    "2"); the user wrote the third element of an array."""
    f = tmp_path / "i.toml"
    f.write_text(write(GPT13.read_text()))
    r = runner.invoke(app, ["solve", str(f)])
    assert r.exit_code == 2, r.output
    assert says in " ".join(r.stderr.split()) and not_says not in r.stderr

"""A runs file (``plan validate RUNS.toml``) is input: what is wrong with it is an input error
(exit 2) that names the file, the run and the key as the runs file spells it, before anything
is computed (the audit of the runs-file path, /tmp/audit_fuzz)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from planner.app.cli import app

MODEL = ('[models.m1]\nlayers = 24\nhidden = 2048\nheads = 16\nvocab = 51200\n'
         'seq_len = 2048\n\n')


def _run(plan: str = "tp = 1, pp = 1, dp = 8, micro_batch = 8, global_batch = 512",
         extra: str = "", precision: str = '"bf16"', gpu: str = '"a100-80gb"') -> str:
    return (f'[[runs]]\nid = "r1"\nmodel = "m1"\ngpu = {gpu}\nprecision = {precision}\n'
            f'plan = {{ {plan} }}\nmeasured_step_time_s = 2.0\nsource = "test"\n{extra}')


@pytest.fixture(scope="module")
def runner():
    return CliRunner()


def _validate(runner, tmp_path, text: str):
    f = tmp_path / "runs.toml"
    f.write_text(text)
    return runner.invoke(app, ["validate", str(f), "--no-ranking"]), f


def test_a_directory_is_not_called_an_instance_file(runner, tmp_path):
    r = runner.invoke(app, ["validate", str(tmp_path), "--no-ranking"])
    assert r.exit_code == 2
    assert "is a directory, expected a runs file" in r.stderr, r.stderr
    assert "instance file" not in r.stderr


def test_a_plan_key_is_named_as_written_with_the_key_it_likely_meant(runner, tmp_path):
    """An unknown plan key was a Python list (``unknown plan keys ['tpp']``) with no
    suggestion; a degree that is no positive whole number named all four keys at once."""
    r, _ = _validate(runner, tmp_path, MODEL + _run("tpp = 1, pp = 1, dp = 8, global_batch = 512"))
    assert r.exit_code == 2
    assert "plan.tpp: unknown key (did you mean tp?" in r.stderr, r.stderr
    assert "['tpp']" not in r.stderr
    r, _ = _validate(runner, tmp_path,
                     MODEL + _run('tp = 1, pp = 1, dp = 8, "micro batch" = 2, global_batch = 512'))
    assert r.exit_code == 2 and 'plan."micro batch": unknown key (did you mean micro_batch?' \
        in r.stderr, r.stderr
    for plan, says in (('tp = "1", pp = 1, dp = 8', 'plan.tp = "1": expected a positive whole'),
                       ("tp = 1, pp = 1, dp = 8, cp = 0", "plan.cp = 0: expected a positive"),
                       ("tp = 1, pp = true, dp = 8", "plan.pp = true: expected a positive")):
        r, _ = _validate(runner, tmp_path, MODEL + _run(plan + ", global_batch = 512"))
        assert r.exit_code == 2 and says in r.stderr, (plan, r.stderr)
        assert "plan.tp, plan.pp, plan.dp and plan.cp" not in r.stderr
        assert "Traceback" not in r.output


def test_a_key_set_both_by_the_run_and_its_training_table_is_refused(runner, tmp_path):
    """``precision = "bf16"`` with ``training = { precision = "fp16" }`` was evaluated as fp16
    while the table showed bf16; the plan's global batch and training.global_batch alike."""
    for extra, says in (
            ('training = { precision = "fp16" }\n',
             'run r1: precision = "bf16" and training.precision = "fp16" both set the precision'),
            ("training = { global_batch = 256 }\n",
             "run r1: plan.global_batch = 512 and training.global_batch = 256 both set the "
             "global batch")):
        r, f = _validate(runner, tmp_path, MODEL + _run(extra=extra))
        assert r.exit_code == 2, r.output
        assert f"{f}: invalid runs file" in r.stderr and says in r.stderr, r.stderr
        assert r.stdout == ""
    # a training key the run does not set itself is the run's software, as before
    r, _ = _validate(runner, tmp_path,
                     MODEL + _run(extra="training = { fused_cross_entropy = true }\n"))
    assert r.exit_code == 0, r.output


def test_a_runs_problems_name_the_file_the_run_and_the_runs_own_keys(runner, tmp_path):
    """The instance behind a run is an implementation detail: its key paths
    (``training.precision``, ``cluster.gpus``, ``model.foo``) were printed under
    ``run r1: invalid instance`` with no file; a plan rule refused while building the plan
    named neither the file nor the run."""
    cases = {
        "precision": (_run(precision='"bf61"'),
                      'run r1: precision = "bf61": expected one of "bf16", "fp16", "fp8", "nvfp4"'),
        "fp8 on a100": (_run(precision='"fp8"'),
                        'run r1: precision: "fp8" needs FP8 tensor cores, which gpu = '
                        '"a100-80gb" has not'),
        "model key": (_run(), "run r1: models.m1.foo: unknown key"),
        "gpu count": (_run("tp = 1, pp = 1, dp = 12, micro_batch = 1, global_batch = 96"),
                      "run r1: the run's GPU count (plan.tp * plan.pp * plan.dp * plan.cp): 12 "
                      "does not fill whole hosts of 8 GPUs"),
        "global batch": (_run('tp = 1, pp = 1, dp = 8, global_batch = "512"'),
                         'run r1: plan.global_batch: Input should be a valid integer (got "512")'),
        "plan rule": (_run("tp = 2, pp = 1, dp = 4, global_batch = 512, tp_comm_overlap = true, "
                           "sequence_parallel = false"),
                      "run r1: plan.tp_comm_overlap = true needs sequence parallelism"),
        "near key": (_run('tp = 1, pp = 1, dp = 8, global_batch = 512, precision = "bf16"'),
                     "run r1: plan.precision: unknown key (did you mean precision?"),
    }
    for name, (run, says) in cases.items():
        model = MODEL.replace("seq_len", "foo = 1\nseq_len") if name == "model key" else MODEL
        r, f = _validate(runner, tmp_path, model + run)
        assert r.exit_code == 2, (name, r.output)
        assert r.stderr.startswith(f"error: {f}: invalid runs file"), (name, r.stderr)
        assert says in r.stderr, (name, r.stderr)
        assert not any(w in r.stderr for w in ("training.precision", "training.global_batch",
                                               "cluster.", "model.foo", "invalid instance")), \
            (name, r.stderr)
    # the same problem, listed once (plan.global_batch fills two keys of the instance)
    r, _ = _validate(runner, tmp_path,
                     MODEL + _run('tp = 1, pp = 1, dp = 8, global_batch = "512"'))
    assert r.stderr.count("plan.global_batch") == 1, r.stderr


def test_a_plan_that_breaks_a_structural_rule_is_refused_but_one_over_memory_is_a_run(
        runner, tmp_path):
    """dp = 3 with micro-batch 8 and a global batch of 512 was evaluated (+779%), entered the
    error figures, and exited 0 with a note: no such plan runs, so the measurement cannot be of
    it. A plan the model merely finds over memory ran: it stays a run (three shipped runs are
    such), with its note."""
    for plan, rule in (
            ("tp = 1, pp = 1, dp = 3, micro_batch = 8, global_batch = 512",
             "dp*micro_batch = 24 must divide global_batch=512"),
            ("tp = 1, pp = 2, dp = 4, first_stage_layers = 30, micro_batch = 8, "
             "global_batch = 512", "30 layers on the end stages, more than the model's layers=24")):
        r, f = _validate(runner, tmp_path, MODEL + _run(plan))
        assert r.exit_code == 2, r.output
        assert r.stdout == "" and "Traceback" not in r.output
        assert r.stderr.startswith(f"error: {f}: invalid runs file"), r.stderr
        assert "run r1: plan breaks a structural rule" in r.stderr and rule in r.stderr, r.stderr
        r = runner.invoke(app, ["validate", str(f), "--no-ranking", "--json"])
        assert r.exit_code == 2 and '"error"' in r.stdout and '"runs"' not in r.stdout
    r, _ = _validate(runner, tmp_path, MODEL + _run("tp = 1, pp = 1, dp = 8, micro_batch = 64, "
                                                    "global_batch = 512"))
    assert r.exit_code == 0, r.output
    assert "r1: the model says this plan does not fit: memory" in " ".join(r.output.split())

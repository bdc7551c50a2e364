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

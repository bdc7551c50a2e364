"""``plan sweep``: grid expansion, validation before running, failure rows, resume, output files,
engines giving identical tables, figures (issue 14)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from planner.app import sweep as sw
from planner.app.sweep_output import (_csv_text, check_out_path, column_order, comparable,
                                      point_hash, read_rows, write_rows, written_column)
from planner.app.cli import app
from planner.model.errors import InputError

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = sorted((ROOT / "instances" / "sweeps").glob("*.toml"))
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

#: (ZeRO-1 pinned: these tests are about the sweeps; the search over sharding modes has its own)
SMALL = """
[model]
preset = "gpt-1.3b"
[training]
global_batch = 64
tokens = 1e9
[cluster]
gpu = "a100-80gb"
nodes = 1
price_per_gpu_hour = 2.0
[constraints]
dp_sharding = "optim"
"""


def write(tmp_path: Path, body: str, name: str = "s.toml") -> Path:
    p = tmp_path / name
    p.write_text(SMALL + body)
    return p


def stdout_of(result) -> str:
    try:
        return result.stdout
    except ValueError:
        return result.output


# ----------------------------------------------------------------------------- expansion


def test_grid_is_the_product_last_axis_fastest(tmp_path):
    p = write(tmp_path, """
[sweep]
"training.global_batch" = [32, 64, 128]
"cluster.nodes" = [1, 2]
""")
    s = sw.load_sweep(p)
    assert [pt.axes for pt in s.points] == [
        {"training.global_batch": b, "cluster.nodes": n} for b in (32, 64, 128) for n in (1, 2)]
    assert [pt.doc["training"]["global_batch"] for pt in s.points] == [32, 32, 64, 64, 128, 128]
    assert [pt.doc["cluster"]["nodes"] for pt in s.points] == [1, 2] * 3
    assert all(pt.doc["model"]["preset"] == "gpt-1.3b" for pt in s.points)   # the base stays
    assert len({pt.key for pt in s.points}) == 6


def test_zip_pairs_the_axes_and_needs_equal_lengths(tmp_path):
    p = write(tmp_path, """
[sweep]
mode = "zip"
cluster.nodes = [1, 2, 4]
training.global_batch = [64, 128, 256]
""")                                                    # unquoted dotted keys work too
    s = sw.load_sweep(p)
    assert [(pt.doc["cluster"]["nodes"], pt.doc["training"]["global_batch"])
            for pt in s.points] == [(1, 64), (2, 128), (4, 256)]
    bad = write(tmp_path, """
[sweep]
mode = "zip"
"cluster.nodes" = [1, 2, 4]
"training.global_batch" = [64, 128]
""", "bad.toml")
    with pytest.raises(InputError) as e:
        sw.load_sweep(bad)
    assert "cluster.nodes 3" in str(e.value) and "training.global_batch 2" in str(e.value)


def test_cases_are_an_axis_of_named_overrides(tmp_path):
    p = write(tmp_path, """
[sweep]
"training.global_batch" = [64, 128]
[sweep.cases]
optimum = {}
TP8 = { "constraints.tp" = 8, "constraints.pp" = 1 }
""")
    s = sw.load_sweep(p)
    assert [pt.axes["case"] for pt in s.points] == ["optimum", "TP8"] * 2
    assert s.points[0].doc["constraints"] == {"dp_sharding": "optim"}
    assert s.points[1].doc["constraints"] == {"dp_sharding": "optim", "tp": 8, "pp": 1}


def test_a_size_axis_replaces_the_other_size_keys(tmp_path):
    (tmp_path / "base.toml").write_text(SMALL.replace("nodes = 1", "gpus = 8"))
    p = tmp_path / "s.toml"
    p.write_text('base = "base.toml"\n[sweep]\n"cluster.nodes" = [1, 2]\n')
    s = sw.load_sweep(p)
    assert "gpus" not in s.points[0].doc["cluster"] and s.points[1].doc["cluster"]["nodes"] == 2


def test_hf_config_paths_are_the_sweep_files_and_inlined(tmp_path):
    import shutil

    shutil.copy(ROOT / "tests" / "data" / "hf" / "llama3-8b.config.json", tmp_path / "l.json")
    p = tmp_path / "s.toml"
    p.write_text(SMALL.replace('preset = "gpt-1.3b"', 'seq_len = 2048')
                 + '[sweep]\n"model.hf_config" = ["l.json"]\n')
    (pt,) = sw.load_sweep(p).points
    assert "hf_config" not in pt.doc["model"]           # a worker elsewhere needs no file
    assert pt.doc["model"]["layers"] == 32 and pt.doc["model"]["seq_len"] == 2048


# ----------------------------------------------------------------------------- bad axes


@pytest.mark.parametrize("axis, expected", [
    ('"cluster.gpuz" = ["a100-80gb"]', "unknown key of [cluster]"),
    ('"clusters.gpu" = ["a100-80gb"]', 'unknown section "clusters"'),
    ('"cluster.gpu" = ["a100-80gb", "h900"]', "cluster.gpu = \"h900\""),
    ('"constraints.max_tp" = [8, 0]', "constraints.max_tp"),
    ('"training.global_batch" = [64, "big"]', "training.global_batch"),
    ('"model.preset" = ["gpt-1.3b", "gpt-9"]', "unknown preset \"gpt-9\""),
    ('"plan.tp" = [1, 2]', "pin a knob with 'constraints.tp'"),
    ('"cluster.nodes" = 4', "expected a non-empty list"),
    ('"cluster.nodes" = [[1, 4]]', "needs one size"),
    ('nodes = [1, 2]', "unknown key"),
])
def test_bad_axes_are_reported_before_anything_runs(tmp_path, axis, expected):
    p = write(tmp_path, f"[sweep]\n{axis}\n")
    out = tmp_path / "r.csv"
    res = CliRunner().invoke(app, ["sweep", str(p), "--out", str(out)])
    assert res.exit_code == 2, res.output
    assert expected in res.output
    assert "Traceback" not in res.output
    assert not out.exists()                             # nothing ran


def test_every_problem_is_listed_once_with_its_point(tmp_path):
    p = write(tmp_path, """
[sweep]
"cluster.gpu" = ["a100-80gb", "h900"]
"training.global_batch" = [64, 128, 256]
""")
    with pytest.raises(InputError) as e:
        sw.load_sweep(p)
    text = str(e.value)
    assert "1 problem in its points" in text and text.count("\n  - ") == 1 and "2 more points" in text


def test_query_options_are_checked(tmp_path):
    with pytest.raises(InputError, match="deadline_days: required"):
        sw.load_sweep(write(tmp_path, '[sweep]\nquery = "capacity"\n"cluster.nodes" = [[1, 4]]\n'))
    with pytest.raises(InputError, match="sweep.solver"):
        sw.load_sweep(write(tmp_path, '[sweep]\nsolver = "magic"\n"cluster.nodes" = [1]\n'))
    with pytest.raises(InputError, match="plot.x"):
        sw.load_sweep(write(tmp_path, '[sweep]\n"cluster.nodes" = [1]\n[plot]\nx = "nodes"\n'))


@pytest.mark.parametrize("body, expected", [
    ('"cluster.nodes" = [1, 1]', 'sweep."cluster.nodes": the value 1 is given twice'),
    ('"cluster.inter_node_bandwidth_GBps" = [25, 25.0]', "the value 25.0 repeats 25"),
    ('"cluster.nodes" = [1, 2]\ncluster.nodes = [4]',
     'sweep."cluster.nodes": given twice (quoted "cluster.nodes" and dotted cluster.nodes)'),
    ('"constraints.tp" = [1, 2]\n[sweep.cases]\npin4 = {"constraints.tp" = 4}',
     'sweep.cases.pin4: "constraints.tp" is also set by the axis "constraints.tp"'),
    ('"cluster.nodes" = [1, 2]\n[sweep.cases]\nbig = {"cluster.gpus" = 32}',
     'sweep.cases.big: "cluster.gpus" is also set by the axis "cluster.nodes"'),
    # (a traceback, found by a fuzzer of sweep files: the case without a table was reported,
    # then looked up to build the points of the others)
    ('"cluster.nodes" = [1, 2]\n[sweep.cases]\nok = {}\nbad = ["bf16"]',
     'sweep.cases.bad: expected a table of dotted instance keys, got ["bf16"]'),
])
def test_a_sweep_that_would_run_a_point_twice_or_not_as_its_row_says_is_refused(
        tmp_path, body, expected):
    """(each once ran: the repeated value twice, the dotted axis in place of the quoted one, the
    case's value while the row showed the axis's)"""
    p = write(tmp_path, f"[sweep]\n{body}\n")
    out = tmp_path / "r.csv"
    res = CliRunner().invoke(app, ["sweep", str(p), "--out", str(out)])
    assert res.exit_code == 2, res.output
    assert expected in " ".join(res.output.split())
    assert "Traceback" not in res.output and not out.exists()


def test_an_unknown_key_and_a_bad_value_are_reported_together(tmp_path):
    """(only the unknown key was, once: the points were not checked after a problem in the file)"""
    p = write(tmp_path, '[sweep]\n"cluster.foo" = [1]\n"cluster.gpu" = ["a100-80gb", "h900"]\n')
    with pytest.raises(InputError) as e:
        sw.load_sweep(p)
    text = str(e.value)
    assert '"cluster.foo": unknown key of [cluster]' in text
    assert 'unknown GPU "h900"' in text and 'cluster.gpu = "h900"' in text


# ----------------------------------------------------------------------------- failure rows


def test_an_infeasible_point_is_a_row_with_its_reason(tmp_path):
    p = write(tmp_path, """
[sweep]
"model.preset" = ["gpt-1.3b", "gpt3-175b"]
""")
    run = sw.run_sweep(sw.load_sweep(p), workers=1)
    ok, bad = run.rows
    assert ok["solver.status"] == "optimal" and ok["plan_label"] and ok["step_time_s"] > 0
    assert bad["solver.status"] == "infeasible" and bad["model.preset"] == "gpt3-175b"
    # the infeasibility's headline, then its explanation (GPT-3 175B on one A100 node)
    assert bad["reason"].startswith("no plan fits in GPU memory; memory: "), bad["reason"]
    assert "weights + gradients + optimizer states alone need 122.0 GiB per GPU" in bad["reason"]
    assert bad.get("step_time_s") is None


def test_a_failing_point_is_an_error_row_not_the_end_of_the_sweep():
    task = {"index": 3, "axes": {"cluster.gpu": "x"}, "key": "k", "hash": "h",
            "doc": {"model": {"preset": "gpt-1.3b"}}, "source": "t", "query": "solve",
            "solver": "cpsat", "time_limit": None, "deadline_days": None, "budget_usd": None}
    (row,) = sw.run_point(task)
    assert row["solver.status"] == "error" and "training" in row["reason"]
    assert row["point"] == 3 and row["cluster.gpu"] == "x" and row["point_key"] == "k"


def test_a_point_stopped_at_the_time_limit_says_why_in_its_reason(monkeypatch):
    """(its reason was empty: CP-SAT's note is, and the row said nothing of the time limit)"""
    from formulations.result import SolveResult, Status

    def stops(*args, **kwargs):
        return SolveResult(Status.NO_SOLUTION_IN_LIMIT, None, None, None, 0.001, 0.001, 0.0,
                           "cpsat", "step_time")

    monkeypatch.setattr("formulations.solve.solve", stops)
    task = {"index": 0, "axes": {}, "key": "{}", "hash": "h", "doc": {}, "source": "t",
            "query": "solve", "solver": "cpsat", "time_limit": 0.001, "deadline_days": None,
            "budget_usd": None}
    monkeypatch.setattr(sw, "parse_instance", lambda doc, source: None)
    (row,) = sw.run_point(task)
    assert row["solver.status"] == "no_solution_in_limit"
    assert row["reason"] == ("the solver returned no usable plan (no_solution_in_limit); "
                             "raise [sweep] time_limit (it was 0.001 s)")


# ----------------------------------------------------------------------------- resume, Ctrl-C

GRID = """
[sweep]
solver = "enumerate"    # (the fastest backend: these tests are about the sweeps, not the solvers)
"training.global_batch" = [32, 64, 128]
{extra}
[sweep.cases]
optimum = {}
DP8 = { "constraints.tp" = 1, "constraints.pp" = 1 }
"""
PRESETS = '"model.preset" = ["gpt-1.3b", "gpt3-175b"]'


def grid(extra: str = "") -> str:
    """Three batches x two cases (x ``extra`` axes): 6 points of about 0.1 s each."""
    return GRID.replace("{extra}", extra)


def _csv_rows(path: Path) -> list[dict]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def test_resume_skips_points_already_in_the_output(tmp_path):
    s = sw.load_sweep(write(tmp_path, grid()))
    out = tmp_path / "r.csv"
    first = sw.run_sweep(s, workers=1, out=out)
    assert (first.ran, first.resumed) == (6, 0)
    rows = _csv_rows(out)
    assert [int(r["point"]) for r in rows] == list(range(6))
    # drop two points from the file, as if the run had stopped there
    kept = [r for r in rows if r["point"] not in ("2", "5")]
    with out.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(kept)
    again = sw.run_sweep(s, workers=1, out=out)
    assert (again.ran, again.resumed) == (2, 4)
    assert [int(r["point"]) for r in _csv_rows(out)] == list(range(6))
    assert comparable(again.rows) == comparable([dict(r) for r in read_rows(out)])
    text = out.read_text()
    third = sw.run_sweep(s, workers=1, out=out)
    assert (third.ran, third.resumed) == (0, 6)
    # a resume that runs nothing leaves the file as it was: a column empty in every row (reason,
    # when every point has a plan) is kept, not dropped by the rewrite (an audit saw reason and
    # cost vanish from instances/sweeps/which-gpu.toml's output)
    assert "reason" in text.splitlines()[0].split(",")
    assert out.read_text() == text


def test_hashes_and_texts_that_look_like_numbers_stay_text(tmp_path):
    rows = [{"point": 0, "point_key": "{}", "point_hash": "h1234e5678901234", "reason": "12",
             "plan_label": "7"}]
    path = tmp_path / "r.csv"
    write_rows(path, rows, list(rows[0]))
    assert read_rows(path) == rows


def test_a_parquet_output_resumes_too(tmp_path):
    pytest.importorskip("pyarrow")
    s = sw.load_sweep(write(tmp_path, '[sweep]\n"training.global_batch" = [32, 64]\n'))
    out = tmp_path / "r.parquet"

    def stop_after_one(done, total):
        if done == 1:
            raise KeyboardInterrupt

    assert sw.run_sweep(s, workers=1, out=out, progress=stop_after_one).interrupted
    assert len(read_rows(out)) == 1
    run = sw.run_sweep(s, workers=1, out=out)
    assert (run.ran, run.resumed) == (1, 1)
    assert [r["training.global_batch"] for r in read_rows(out)] == [32, 64]


def _stop_at_batch(monkeypatch, batch):
    """``solve`` stops at the time limit without a plan for the points of this global batch."""
    from formulations import solve as solve_mod
    from formulations.result import SolveResult, Status

    real = solve_mod.solve

    def solve(inst, *args, **kwargs):
        if inst.spec.training.global_batch == batch:
            return SolveResult(Status.NO_SOLUTION_IN_LIMIT, None, None, None, 0.001, 0.001,
                               0.0, "cpsat", "step_time")
        return real(inst, *args, **kwargs)
    monkeypatch.setattr(solve_mod, "solve", solve)


def test_a_larger_time_limit_runs_again_only_the_points_stopped_at_the_smaller_one(
        tmp_path, monkeypatch):
    """(exit 4 said "raise [sweep] time_limit", and the raised limit made the resume refuse
    the file as another sweep's: the limit was part of every point's hash)"""
    body = '[sweep]\ntime_limit = {}\n"training.global_batch" = [32, 64]\n'
    out = tmp_path / "r.csv"
    with monkeypatch.context() as m:
        _stop_at_batch(m, 64)
        first = sw.run_sweep(sw.load_sweep(write(tmp_path, body.format(5))), workers=1, out=out)
        assert [r["solver.status"] for r in first.rows] == ["optimal", "no_solution_in_limit"]
        # the same limit, or a smaller one, cannot prove more: nothing runs
        for limit in (5, 2):
            again = sw.run_sweep(sw.load_sweep(write(tmp_path, body.format(limit))),
                                 workers=1, out=out)
            assert (again.ran, again.resumed) == (0, 2)
    kept = read_rows(out)[0]
    raised = sw.run_sweep(sw.load_sweep(write(tmp_path, body.format(10))), workers=1, out=out)
    assert (raised.ran, raised.resumed) == (1, 1)
    assert any("1 point" in n and "run again under 10 s" in n for n in raised.notes)
    rows = read_rows(out)
    assert [r["solver.status"] for r in rows] == ["optimal", "optimal"]
    assert [r["time_limit_s"] for r in rows] == [5, 10]
    assert rows[0] == kept                       # the proven point did not run again
    # with no limit at all a point stopped at one runs again too; a proven one never
    with monkeypatch.context() as m:
        _stop_at_batch(m, 32)
        out2 = tmp_path / "r2.csv"
        sw.run_sweep(sw.load_sweep(write(tmp_path, body.format(5))), workers=1, out=out2)
    free = sw.run_sweep(sw.load_sweep(write(tmp_path, '[sweep]\n"training.global_batch" = '
                                                      '[32, 64]\n')), workers=1, out=out2)
    assert (free.ran, free.resumed) == (1, 1)
    assert [r["time_limit_s"] for r in read_rows(out2)] == [None, 5]


def test_a_file_from_before_the_time_limit_column_resumes_under_its_own_limit(tmp_path):
    """Its rows' point_hash carried the time limit (and it had no time_limit_s column)."""
    body = '[sweep]\ntime_limit = {}\n"training.global_batch" = [32, 64]\n'
    s = sw.load_sweep(write(tmp_path, body.format(30)))
    out = tmp_path / "r.csv"
    sw.run_sweep(s, workers=1, out=out)
    rows = read_rows(out)
    by_key = {p.key: p for p in s.points}
    for r in rows:
        del r["time_limit_s"]
        r["point_hash"] = point_hash(by_key[r["point_key"]], s.options(), legacy=True)
    write_rows(out, rows, list(rows[0]))
    with pytest.raises(InputError, match="different sweep"):
        sw.run_sweep(sw.load_sweep(write(tmp_path, body.format(60))), workers=1, out=out)
    run = sw.run_sweep(s, workers=1, out=out)
    assert (run.ran, run.resumed) == (0, 2)
    now = read_rows(out)                          # rewritten in today's form
    assert [r["time_limit_s"] for r in now] == [30, 30]
    assert [r["point_hash"] for r in now] == [point_hash(p, s.options()) for p in s.points]


def test_a_changed_sweep_is_not_mixed_into_an_old_output(tmp_path):
    out = tmp_path / "r.csv"
    sw.run_sweep(sw.load_sweep(write(tmp_path, '[sweep]\n"training.global_batch" = [32]\n')),
                 workers=1, out=out)
    changed = write(tmp_path, '[sweep]\n"training.global_batch" = [32]\n',
                    "s2.toml")
    changed.write_text(changed.read_text().replace("tokens = 1e9", "tokens = 2e9"))
    with pytest.raises(InputError, match="different sweep"):
        sw.run_sweep(sw.load_sweep(changed), workers=1, out=out)


@pytest.fixture(scope="module")
def done_csv(tmp_path_factory):
    """grid()'s sweep (6 points) and the text of its finished CSV output, to edit."""
    tmp = tmp_path_factory.mktemp("done")
    s = sw.load_sweep(write(tmp, grid()))
    sw.run_sweep(s, workers=1, out=tmp / "r.csv")
    return s, (tmp / "r.csv").read_text()


def _edited(tmp_path: Path, text: str | bytes) -> Path:
    out = tmp_path / "r.csv"
    (out.write_bytes if isinstance(text, bytes) else out.write_text)(text)
    return out


def _without(text: str, column: str) -> str:
    """The CSV text with one column deleted."""
    rows = list(csv.reader(text.splitlines()))
    i = rows[0].index(column)
    return _csv_text([dict(enumerate(r[:i] + r[i + 1:])) for r in rows],
                     list(range(len(rows[0]) - 1)), header=False)


def _csv_widths(path: Path) -> set[int]:
    with path.open(newline="") as f:
        return {len(line) for line in csv.reader(f)}


@pytest.mark.parametrize("cut", ["inside a cell", "inside the hash"])
def test_a_last_line_cut_short_is_dropped_and_its_point_runs_once(tmp_path, done_csv, cut):
    """A run killed while writing leaves a last line cut short. (It was kept as a half-empty
    row of another sweep and its point ran again, twice in the file; cut inside the hash, the
    resume was refused as "a different sweep".)"""
    s, text = done_csv
    *head, last = text.splitlines(keepends=True)
    last = last.rstrip("\n")
    last = last[:len(last) // 2] if cut == "inside a cell" else last[:-5]
    out = _edited(tmp_path, "".join(head) + last)
    run = sw.run_sweep(s, workers=1, out=out)
    assert (run.ran, run.resumed, run.foreign) == (1, 5, 0)
    assert any("was cut short" in n and str(out) in n for n in run.notes)
    rows = _csv_rows(out)
    assert [int(r["point"]) for r in rows] == list(range(6))
    assert [r["point_hash"] for r in rows] == [point_hash(p, s.options()) for p in s.points]


def test_a_file_without_its_final_newline_is_appended_to_on_a_new_line(tmp_path, done_csv):
    """(the first appended row was glued to the last line)"""
    s, text = done_csv
    out = _edited(tmp_path, "".join(text.splitlines(keepends=True)[:-1]).rstrip("\n"))
    width = len(text.splitlines()[0].split(","))
    seen = []

    def look(done, total):
        seen.append(_csv_widths(out))

    run = sw.run_sweep(s, workers=1, out=out, progress=look)
    assert run.ran == 1 and seen[-1] == {width}
    assert [int(r["point"]) for r in _csv_rows(out)] == list(range(6))


def test_another_sweeps_output_is_refused(tmp_path, done_csv):
    """(it was merged: its rows kept as foreign, with the same point indices as this sweep's)"""
    s, text = done_csv
    out = _edited(tmp_path, text)
    other = sw.load_sweep(write(tmp_path, '[sweep]\nsolver = "enumerate"\n'
                                          '"training.global_batch" = [16]\n', "other.toml"))
    with pytest.raises(InputError, match="holds another sweep's rows") as e:
        sw.run_sweep(other, workers=1, out=out)
    assert str(out) in str(e.value) and "none of its 6 rows" in str(e.value)
    assert out.read_text() == text


def test_resumed_rows_take_their_point_index_in_this_sweep(tmp_path):
    """A value added in front of an axis: the rows already run keep their results and are
    renumbered, so no two points share an index."""
    out = tmp_path / "r.csv"
    body = '[sweep]\nsolver = "enumerate"\n"training.global_batch" = {}\n'
    sw.run_sweep(sw.load_sweep(write(tmp_path, body.format("[32, 64]"))), workers=1, out=out)
    run = sw.run_sweep(sw.load_sweep(write(tmp_path, body.format("[16, 32, 64]"), "b.toml")),
                       workers=1, out=out)
    assert (run.ran, run.resumed) == (1, 2)
    assert [(int(r["point"]), int(r["training.global_batch"])) for r in _csv_rows(out)] == [
        (0, 16), (1, 32), (2, 64)]


@pytest.mark.parametrize("edit, expected", [
    (lambda t: t.replace(",step_time_s,", ",step_s,", 1), 'no "step_time_s" column'),
    (lambda t: t.replace(",point_hash\n", ",hash\n", 1), 'no "point_hash" column'),
    (lambda t: t.replace("case,", "Case,", 1), 'no "case" column, an axis of this sweep'),
    (lambda t: _without(t, "reason"), 'no "reason" column'),
    (lambda t: t.replace(",plan.pp,", ",plan.tp,", 1), 'the column "plan.tp" appears twice'),
    (lambda t: t.replace(",memory_gib.total,", ",total,", 1),
     'the column "total" is not one plan sweep writes'),
], ids=["renamed", "hash renamed", "axis renamed", "deleted", "duplicated", "unknown"])
def test_an_edited_header_is_refused_naming_the_column(tmp_path, done_csv, edit, expected):
    """(a KeyError traceback in the table, or rows silently misaligned)"""
    s, text = done_csv
    out = _edited(tmp_path, edit(text))
    res = CliRunner().invoke(app, ["sweep", s.source, "--out", str(out), "--workers", "1"])
    assert res.exit_code == 2, res.output
    said = " ".join(res.output.split())
    assert expected in said and str(out) in said and "Traceback" not in said
    assert out.read_text() == edit(text)                  # left as it was


@pytest.mark.parametrize("column", ["step_time_s", "mfu", "total_days", "cost",
                                    "breakdown_s.compute"])
def test_a_text_in_a_number_column_is_refused_naming_the_point(tmp_path, done_csv, column):
    """(a ValueError or TypeError later, in the table or the figure)"""
    s, text = done_csv
    rows = list(csv.reader(text.splitlines()))
    rows[3][rows[0].index(column)] = "abc"                # point 2: batch 64, optimum
    out = _edited(tmp_path, _csv_text([dict(enumerate(r)) for r in rows],
                                      list(range(len(rows[0]))), header=False))
    with pytest.raises(InputError) as e:
        sw.run_sweep(s, workers=1, out=out)
    assert (f'point 2 (case = "optimum", training.global_batch = 64): {column} = "abc" is not '
            "a number") in str(e.value)


def test_a_repeated_row_is_dropped_once_and_a_contradicting_one_refused(tmp_path, done_csv):
    """A point's row twice was kept and counted twice. The same results twice are dropped
    with a note; different results for one point are refused."""
    s, text = done_csv
    lines = text.splitlines(keepends=True)
    out = _edited(tmp_path, text + lines[3])
    run = sw.run_sweep(s, workers=1, out=out)
    assert (run.ran, run.resumed, len(run.rows)) == (0, 6, 6)
    assert run.counts() == {"optimal": 6} and any("1 repeated row" in n for n in run.notes)
    assert [int(r["point"]) for r in _csv_rows(out)] == list(range(6))
    step = _csv_rows(out)[2]["step_time_s"]
    out = _edited(tmp_path, text + lines[3].replace(step, "1.5"))
    with pytest.raises(InputError, match=r"point 2 \(.*\) has two rows with different results "
                                         r"\(lines 4 and 8\)"):
        sw.run_sweep(s, workers=1, out=out)


def test_a_file_that_is_not_utf8_text_is_not_a_sweep_output(tmp_path, done_csv):
    """(Python's 'utf-8' codec can't decode byte 0x89, as the message)"""
    s, _ = done_csv
    out = _edited(tmp_path, PNG_MAGIC + bytes(range(256)))
    res = CliRunner().invoke(app, ["sweep", s.source, "--out", str(out)])
    assert res.exit_code == 2, res.output
    assert "is not a sweep output CSV (not UTF-8 text)" in " ".join(res.output.split())
    assert "codec" not in res.output


def test_a_row_without_its_point_key_is_refused(tmp_path, done_csv):
    """(it was kept as a row of another sweep, and its point ran again: twice in the file)"""
    s, text = done_csv
    rows = list(csv.reader(text.splitlines()))
    rows[3][rows[0].index("point_key")] = ""
    out = _edited(tmp_path, _csv_text([dict(enumerate(r)) for r in rows],
                                      list(range(len(rows[0]))), header=False))
    with pytest.raises(InputError, match="line 4 has no point_key and point_hash naming its "
                                         "point"):
        sw.run_sweep(s, workers=1, out=out)


def test_a_short_first_row_is_not_a_missing_point_key_column(tmp_path, done_csv):
    """(the header was judged by the first row's keys: "no point_key column")"""
    s, text = done_csv
    lines = text.splitlines(keepends=True)
    lines[1] = ",".join(lines[1].split(",")[:5]) + "\n"
    width = len(lines[0].split(","))
    with pytest.raises(InputError, match=f"line 2 has 5 fields where the header has {width}"):
        sw.run_sweep(s, workers=1, out=_edited(tmp_path, "".join(lines)))


@pytest.mark.parametrize("workers", [1, 2])
def test_ctrl_c_leaves_a_valid_file_and_the_same_command_resumes(tmp_path, workers):
    s = sw.load_sweep(write(tmp_path, grid()))
    out = tmp_path / "r.csv"
    seen = []

    def interrupt_after_two(done, total):
        seen.append(done)
        if done == 2:
            raise KeyboardInterrupt

    run = sw.run_sweep(s, workers=workers, out=out, progress=interrupt_after_two)
    assert run.interrupted and run.ran == 2
    rows = _csv_rows(out)
    assert len(rows) == 2 and all(r["solver.status"] == "optimal" for r in rows)
    rest = sw.run_sweep(s, workers=workers, out=out)
    assert (rest.ran, rest.resumed) == (4, 2) and not rest.interrupted
    assert sorted(int(r["point"]) for r in _csv_rows(out)) == list(range(6))


# ----------------------------------------------------------------------------- outputs


@pytest.fixture(scope="module")
def grid_rows(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("grid")
    s = sw.load_sweep(write(tmp, grid(PRESETS)))
    return s, sw.run_sweep(s, workers=1).rows


DOCS = (ROOT / "docs" / "sweeps.md").read_text()


def _undocumented(rows: list[dict], axis_keys: list[str]) -> set[str]:
    """The columns of ``rows`` that docs/sweeps.md's column table does not name, by name or by
    their group (`plan.*`)."""
    table = DOCS[DOCS.index("| columns | what |"):DOCS.index("CSV cells are plain text")]
    return {c for r in rows for c in r if c not in axis_keys and f"`{c}`" not in table
            and f"`{c.split('.')[0]}.*`" not in table}


def test_rows_carry_axes_plan_times_memory_and_status(grid_rows):
    s, rows = grid_rows
    # (caveats, framework and kernel_stack were written but not in the docs' table)
    assert _undocumented(rows, s.axis_keys) == set()
    assert all(written_column(c, s.axis_keys) for r in rows for c in r)
    assert len(rows) == len(s.points) == 12
    cols = set().union(*rows)
    for c in ("training.global_batch", "case", "model.preset", "plan.tp", "plan.pp", "plan.dp",
              "plan.micro_batch", "plan.recompute", "step_time_s", "breakdown_s.compute",
              "breakdown_s.dp_comm", "memory_gib.total", "mfu", "total_days", "cost",
              "solver.status", "solver.wall_s", "reason"):
        assert c in cols, c
    solved = [r for r in rows if r["solver.status"] == "optimal"]
    for r in solved:                     # the breakdown adds up to the step time
        total = sum(v for k, v in r.items() if k.startswith("breakdown_s."))
        assert total == pytest.approx(r["step_time_s"], rel=1e-9)
        assert r["plan.tp"] * r["plan.pp"] * r["plan.dp"] * r["plan.cp"] == r["plan.gpus"]
    assert all(r["plan.tp"] == 1 and r["plan.pp"] == 1 for r in solved if r["case"] == "DP8")


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_csv_and_parquet_round_trip(tmp_path, grid_rows, suffix):
    if suffix == ".parquet":
        pytest.importorskip("pyarrow")
    s, rows = grid_rows
    path = tmp_path / f"r{suffix}"
    cols = column_order(rows, s.axis_keys)
    write_rows(path, rows, cols)
    back = read_rows(path)
    assert len(back) == len(rows)
    for a, b in zip(rows, back):
        assert {k: v for k, v in b.items() if v not in (None, "")} == {
            k: v for k, v in a.items() if v not in (None, "")}
    assert cols[:3] == s.axis_keys == ["training.global_batch", "model.preset", "case"]


def test_out_paths_are_checked(tmp_path):
    with pytest.raises(InputError, match=".csv or .parquet"):
        check_out_path(tmp_path / "r.xlsx")
    with pytest.raises(InputError, match="does not exist"):
        check_out_path(tmp_path / "no" / "r.csv")


@pytest.mark.parametrize("path", ["/proc/x.csv", "/sys/x.csv", "/sys/x.parquet"])
def test_an_out_file_that_cannot_be_written_is_refused_before_any_point_runs(tmp_path, path):
    """(the points ran, then the first write failed: exit 1, no flag named)"""
    if not Path(path).parent.is_dir():
        pytest.skip(f"no {Path(path).parent} here")
    if path.endswith(".parquet"):
        pytest.importorskip("pyarrow")
    p = write(tmp_path, '[sweep]\n"training.global_batch" = [32]\n')
    res = CliRunner().invoke(app, ["sweep", str(p), "--out", path, "--workers", "1"])
    assert res.exit_code == 2, res.output
    assert f"--out {path}: cannot write a file in {Path(path).parent}" in " ".join(
        res.output.split())
    assert "points (" not in res.output                  # nothing ran


# ----------------------------------------------------------------------------- engines


@pytest.fixture(scope="session")
def ray_session():
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    yield ray
    ray.shutdown()


def test_local_pool_and_ray_give_identical_tables(tmp_path, ray_session, grid_rows):
    s, one = grid_rows          # (one worker's table, shared with the output tests)
    pool = sw.run_sweep(s, workers=2, out=tmp_path / "pool.csv").rows
    ray_rows = sw.run_sweep(s, engine="ray", out=tmp_path / "ray.csv").rows
    assert len(pool) == len(s.points) == 12
    assert comparable(pool) == comparable(ray_rows) == comparable(one)
    assert any(r["solver.status"] == "infeasible" for r in ray_rows)
    files = [comparable(read_rows(tmp_path / f)) for f in ("pool.csv", "ray.csv")]
    assert files[0] == files[1]


def test_ray_joins_a_cluster_already_running_without_asking_for_cpus(monkeypatch):
    """With a Ray cluster running on the machine (``ray start``, or RAY_ADDRESS), ray.init()
    joins it and refuses num_cpus: "When connecting to an existing cluster, num_cpus and
    num_gpus must not be provided" was the sweep's error. (Ray stood in by a fake that does
    what Ray does: a real cluster takes seconds to start and is shared by the machine.)"""
    import sys
    import types

    inits = []
    running = ["192.0.2.2:6379"]

    class FakeRay(types.ModuleType):
        def is_initialized(self):
            return False

        def init(self, address=None, **kw):
            inits.append({"address": address, **kw})
            if address == "auto" and not running:
                raise ConnectionError("Could not find any running Ray instance.")
            if "num_cpus" in kw and running:
                raise ValueError("When connecting to an existing cluster, num_cpus and num_gpus "
                                 "must not be provided.")

        def remote(self, **opts):
            return lambda fn: types.SimpleNamespace(remote=lambda t: ("ref", t["index"]))

        def wait(self, pending, num_returns=1):
            return pending[:1], pending[1:]

        def get(self, ref):
            return [{"point": ref[1]}]

        def cancel(self, ref, force=False):
            pass

        def shutdown(self):
            inits.append("shutdown")

    monkeypatch.setitem(sys.modules, "ray", FakeRay("ray"))
    got = []
    sw.run_ray([{"index": 0}, {"index": 1}], 2, None, got.extend)
    assert got == [{"point": 0}, {"point": 1}]
    assert "num_cpus" not in inits[0] and inits[-1] == "shutdown"
    running.clear()
    inits.clear()
    sw.run_ray([{"index": 0}], 2, None, got.extend)        # none running: a Ray of 2 CPUs
    assert inits[-2]["num_cpus"] == 2


def test_engine_flags_are_checked(tmp_path):
    s = sw.load_sweep(write(tmp_path, '[sweep]\n"training.global_batch" = [32]\n'))
    with pytest.raises(InputError, match="--engine"):
        sw.run_sweep(s, engine="dask")
    with pytest.raises(InputError, match="--address"):
        sw.run_sweep(s, address="auto")


# ----------------------------------------------------------------------------- figures and CLI


def _png(path: Path) -> bool:
    return path.read_bytes()[:8] == PNG_MAGIC and path.stat().st_size > 5_000


def test_plots_lines_heatmap_and_pareto(tmp_path, grid_rows):
    pytest.importorskip("matplotlib")
    from planner.app.sweep_plot import layout, plot_sweep

    s, rows = grid_rows
    plot_sweep(rows, s, tmp_path / "lines.png")
    assert _png(tmp_path / "lines.png")
    assert layout(s)["kind"] == "lines" and layout(s)["x"] == "training.global_batch"

    heat = sw.load_sweep(write(tmp_path, """
[sweep]
solver = "enumerate"
"cluster.nodes" = [1, 2]
"training.global_batch" = [32, 64]
[plot]
kind = "heatmap"
y = "speedup"
""", "h.toml"))
    plot_sweep(sw.run_sweep(heat, workers=1).rows, heat, tmp_path / "heat.png")
    assert _png(tmp_path / "heat.png")

    front = sw.load_sweep(write(tmp_path, """
[sweep]
query = "pareto"
solver = "enumerate"
"cluster.nodes" = [[1, 2]]
"training.global_batch" = [64, 128]
""", "p.toml"))
    rows = sw.run_sweep(front, workers=1).rows
    assert len(rows) == 4 and {r["pareto.nodes"] for r in rows} == {1, 2}
    assert all(written_column(c, front.axis_keys) for r in rows for c in r)
    assert _undocumented(rows, front.axis_keys) == set()
    plot_sweep(rows, front, tmp_path / "front.png")
    assert _png(tmp_path / "front.png")


def test_a_metric_no_row_has_is_a_warning_and_an_empty_panel(tmp_path):
    """(an empty panel, silently)"""
    pytest.importorskip("matplotlib")
    p = write(tmp_path, '[sweep]\nsolver = "enumerate"\n"training.global_batch" = [32, 64]\n'
                        '[plot]\ny = "capacity.nodes"\n')
    fig = tmp_path / "f.png"
    res = CliRunner().invoke(app, ["sweep", str(p), "--plot", str(fig), "--workers", "1"])
    assert res.exit_code == 0, res.output
    assert ('warning: --plot: [plot] y = "capacity.nodes": no row has a value of it; the left '
            "panel is empty") in " ".join(res.stderr.split())
    assert _png(fig)


SPEEDUP = """
[sweep]
solver = "enumerate"
"training.global_batch" = [4, 64, 128]
[sweep.cases]
optimum = {}
DP8 = { "constraints.tp" = 1, "constraints.pp" = 1, "constraints.cp" = 1 }
[plot]
x = "training.global_batch"
y = "speedup"
"""


def test_a_speedup_is_over_the_first_x_value_or_not_drawn(tmp_path):
    """DP8 has no plan at a batch of 4: its speedups were drawn over the batch of 64 under the
    label "over the first x value". Now they are not drawn (as in the heatmap), the legend
    and a warning say why."""
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from planner.app import sweep_plot

    s = sw.load_sweep(write(tmp_path, SPEEDUP))
    rows = sw.run_sweep(s, workers=1).rows
    assert [not r.get("plan_label") for r in rows] == [False, True, False, False, False, False]
    fig, ax = plt.subplots()
    warnings = []
    sweep_plot._lines(ax, rows, s, sweep_plot.layout(s), warnings)
    (opt, dp8) = ax.get_lines()
    assert opt.get_ydata()[0] == 1.0 and 0 < opt.get_ydata()[2] < 1  # (a longer step)
    assert all(y != y for y in dp8.get_ydata())               # NaN: not drawn
    assert ax.get_legend_handles_labels()[1] == ["optimum", "DP8 (no plan at 4)"]
    assert warnings == ['--plot: [plot] y = "speedup" is over the first value of '
                        "training.global_batch (4), which has no plan for DP8: those speedups "
                        "are not drawn"]
    plt.close(fig)
    assert sweep_plot.plot_sweep(rows, s, tmp_path / "f.png") == warnings


def test_list_values_read_the_same_in_the_legend_after_a_csv_resume(tmp_path):
    """(a resumed row held the JSON text "[1, 2]", a new one the list [1, 3], drawn as (1, 3))"""
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from planner.app import sweep_plot

    s = sw.load_sweep(write(tmp_path, '[sweep]\nquery = "pareto"\nsolver = "enumerate"\n'
                                      '"cluster.nodes" = [[1, 2], [1, 4]]\n'))
    out = tmp_path / "r.csv"

    def stop_after_one(done, total):
        if done == 1:
            raise KeyboardInterrupt

    sw.run_sweep(s, workers=1, out=out, progress=stop_after_one)
    rows = sw.run_sweep(s, workers=1, out=out).rows
    assert {json.dumps(r["cluster.nodes"]) for r in rows} == {"[1, 2]", "[1, 4]"}
    fig, ax = plt.subplots()
    sweep_plot._lines(ax, rows, s, sweep_plot.layout(s), [])
    assert ax.get_legend_handles_labels()[1] == ["nodes=[1, 2]", "nodes=[1, 4]"]
    plt.close(fig)


def test_capacity_points(tmp_path):
    s = sw.load_sweep(write(tmp_path, """
[sweep]
query = "capacity"
deadline_days = 3
"cluster.nodes" = [[1, 8]]
"training.tokens" = [1e9, 1e10, 1e13]
"""))
    rows = sw.run_sweep(s, workers=1).rows
    assert all(written_column(c, s.axis_keys) for r in rows for c in r)
    assert _undocumented(rows, s.axis_keys) == set()          # (unproven was not)
    # capacity.wall_s is a wall clock: not compared across engines (it once was)
    assert all(r["capacity.wall_s"] > 0 for r in rows)
    assert not any("capacity.wall_s" in r for r in comparable(rows))
    nodes = [r.get("capacity.nodes") for r in rows]
    assert nodes[0] is not None and nodes[1] is not None and nodes[0] <= nodes[1]
    assert rows[0]["total_days"] <= 3 and rows[1]["total_days"] <= 3
    assert rows[2]["solver.status"] == "infeasible" and "3 days" in rows[2]["reason"]


def test_cli_json_out_and_plot(tmp_path):
    pytest.importorskip("matplotlib")
    p = write(tmp_path, '[sweep]\n"training.global_batch" = [32, 64]\n')
    out, fig = tmp_path / "r.csv", tmp_path / "f.png"
    res = CliRunner().invoke(app, ["sweep", str(p), "--out", str(out), "--plot", str(fig),
                                   "--json", "--workers", "1"])
    assert res.exit_code == 0, res.output
    doc = json.loads(stdout_of(res))
    assert doc["points"] == 2 and doc["ran"] == 2 and doc["status_counts"] == {"optimal": 2}
    assert [r["training.global_batch"] for r in doc["rows"]] == [32, 64]
    assert len(_csv_rows(out)) == 2 and _png(fig)
    res = CliRunner().invoke(app, ["sweep", str(p), "--out", str(out), "--json"])
    assert json.loads(stdout_of(res))["resumed"] == 2


def test_a_pareto_summary_counts_rows_as_rows(tmp_path):
    """(2 points read "2 points (...): 4 optimal", as if 4 points)"""
    p = write(tmp_path, '[sweep]\nquery = "pareto"\nsolver = "enumerate"\n'
                        '"cluster.nodes" = [[1, 2]]\n"training.global_batch" = [64, 128]\n')
    res = CliRunner().invoke(app, ["sweep", str(p), "--workers", "1"])
    assert res.exit_code == 0, res.output
    assert "2 points (2 run now, 0 already in the output), 4 rows: 4 optimal" in res.stderr


def test_an_empty_reason_is_null_in_parquet_as_every_missing_value(tmp_path):
    """A CSV cannot tell an empty text from a missing value; Parquet kept "" as the reason of a
    point with a plan and null for the plan columns of a point without one."""
    pq = pytest.importorskip("pyarrow.parquet")
    rows = [{"point": 0, "reason": "", "step_time_s": 1.5, "point_key": "{}", "point_hash": "h1"},
            {"point": 1, "reason": "too big", "step_time_s": None, "point_key": "{}",
             "point_hash": "h2"}]
    write_rows(tmp_path / "r.parquet", rows, list(rows[0]))
    back = pq.read_table(tmp_path / "r.parquet").to_pylist()
    assert [r["reason"] for r in back] == [None, "too big"]
    assert [r["step_time_s"] for r in back] == [1.5, None]


def test_the_load_sweep_example_counts_the_optical_sweeps_points():
    optical = sw.load_sweep(ROOT / "instances" / "sweeps" / "optical-bandwidth.toml", check=False)
    assert f"({len(optical.points)}, {optical.axis_keys!r})" in sw.load_sweep.__doc__


def test_a_sweep_without_any_plan_is_an_answer_with_no_figure(tmp_path):
    """Every point infeasible is a result (each row says why, exit 0); the figure is skipped
    with a note, not an error after the work is done (an audit saw exit 2 here)."""
    pytest.importorskip("matplotlib")
    p = write(tmp_path, '[sweep]\n"model.preset" = ["gpt3-175b", "mt-nlg-530b"]\n')
    fig = tmp_path / "f.png"
    res = CliRunner().invoke(app, ["sweep", str(p), "--plot", str(fig), "--workers", "1"])
    assert res.exit_code == 0, res.output
    assert "no figure written" in res.output and not fig.exists()
    res = CliRunner().invoke(app, ["sweep", str(p), "--plot", str(fig), "--workers", "1",
                                   "--json"])
    doc = json.loads(stdout_of(res))
    assert res.exit_code == 0 and doc["plot"] is None
    assert doc["status_counts"] == {"infeasible": 2}


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_shipped_sweeps_are_valid(path):
    s = sw.load_sweep(path)            # every point checked against the schema and query
    assert len(s.points) >= 10
    from planner.app.sweep_plot import layout

    assert layout(s)["x"] in s.axis_keys


def test_a_row_labels_its_plan_as_reports_do_and_the_plot_names_every_term():
    """An audit: the sweep wrote its own plan label, CP EP VP where reports (Plan.label) say
    CP VP EP, and the breakdown plot's own term labels had lost host offload."""
    from planner.app.sweep_plot import TERM_LABELS
    from planner.model.plan import plan_label
    from planner.model.terms import TIME_TERMS

    plan = {"tp": 2, "pp": 4, "dp": 8, "cp": 2, "vp": 3, "ep": 8, "micro_batch": 1,
            "recompute": "full"}
    assert sw._label(plan) == plan_label(plan) + " rc-full" == "TP2 PP4 DP8 CP2 VP3 EP8 mb1 rc-full"
    assert sw._label({**plan, "recompute": "none"}) == plan_label(plan)
    assert tuple(TERM_LABELS) == TIME_TERMS and TERM_LABELS["offload"] == "host offload"


def test_a_sweep_as_the_base_is_refused(tmp_path):
    """``base`` names an instance; a sweep file there made every point report its [sweep] and
    [plot] as unknown instance keys."""
    inner = write(tmp_path, '[sweep]\n"cluster.nodes" = [1, 2]\n', name="inner.toml")
    p = tmp_path / "outer.toml"
    p.write_text(f'base = "{inner.name}"\n[sweep]\n"training.global_batch" = [64, 128]\n')
    with pytest.raises(InputError) as e:
        sw.load_sweep(p)
    assert 'base = "inner.toml"' in str(e.value) and "is a sweep file" in str(e.value)

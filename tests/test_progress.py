"""A long solve says which of its models it is on (formulations/progress.py), and `plan solve`
shows it on a terminal only (planner/app/waiting.py)."""

from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console

from formulations import progress
from formulations.solve import solve
from planner.app.waiting import SolveStatus, status_text
from planner.model.instance import load_instance

INSTANCES = Path(__file__).resolve().parent.parent / "instances"


def test_a_split_solve_announces_each_of_its_models_with_the_best_so_far():
    heard = []
    with progress.listen(lambda *event: heard.append(event)):
        res = solve(load_instance(INSTANCES / "gpt-1.3b-1node.toml"), solver="cpsat")
    n = int(res.note.split()[0])            # "3 sharding-mode and layout models, 2 proven ..."
    assert n > 1 and len(heard) == n
    assert {(kind, total, objective) for kind, _, total, _, objective in heard} == {
        ("sharding-mode and layout", n, "step_time")}
    # (the parts after the leading one are taken by two threads, from one queue)
    assert sorted(index for _, index, _, _, _ in heard) == list(range(n))
    first = min(heard, key=lambda event: event[1])
    assert first[3] is None                 # nothing is known when the first model starts
    # an incumbent is some model's proven optimum: never better than the answer
    bests = [best for _, _, _, best, _ in heard if best is not None]
    assert bests and min(bests) >= res.report.step_time_s * (1 - 1e-9)


def test_the_status_is_shown_on_a_terminal_only():
    pipe = Console(file=io.StringIO(), force_terminal=False)
    with SolveStatus(pipe, "i.toml") as quiet:
        progress.starting("sharding-mode and layout", 0, 3, None, "step_time")
    assert quiet.levels == {} and quiet.status is None and pipe.file.getvalue() == ""
    tty = Console(file=io.StringIO(), force_terminal=True, width=200)
    with SolveStatus(tty, "i.toml") as shown:
        progress.starting("fixed-batch", 1, 16, 0.02, "time_per_sample")
        progress.starting("sharding-mode and layout", 4, 12, 0.0195, "time_per_sample")
        assert shown.best == 0.0195 and shown.status is not None
        # another cluster size (pareto, capacity) is another question: its own best
        progress.starting("cluster size", 3, 6, None, "step_time")
        assert shown.best is None and shown.levels == {"cluster size": (3, 6)}
    # the line goes with the solve; the next one starts without a listener
    progress.starting("fixed-batch", 2, 16, None, "time_per_sample")
    assert shown.levels == {"cluster size": (3, 6)}


def test_the_status_line_reads_as_counts_and_the_objectives_unit():
    line = status_text("r.toml", {"sharding-mode and layout": (4, 12), "fixed-batch": (1, 16)},
                       0.0195, "time_per_sample")
    assert line == ("solving r.toml: batch models 2 of 16, sharding / layout models 5 of 12, "
                    "best so far 0.0195 s per sequence")
    assert status_text("i.toml", {"sharding-mode and layout": (0, 105)}, None,
                       "step_time") == "solving i.toml: sharding / layout models 1 of 105"
    assert status_text("the shipped runs", {"published run": (4, 205)}, None, "step_time",
                       "ranking") == "ranking the shipped runs: published runs 5 of 205"

"""Ranking (issue 12): for every shipped run, the published plan against the model's optimum in the
same knob space (recompute mode, sequence parallelism, distributed optimizer, precision and
attention kernel pinned as the run had them; GPU count and global batch fixed).

What holds is asserted; the issue's target (every run within 10%) is a strict xfail naming
the runs that miss it, so a model change that meets it shows up."""

from __future__ import annotations

import pytest

from planner.app.validate import load_runs, ranking, run_instance
from planner.model.evaluate import evaluate
from planner.model.plan import plan_from_spec

TARGET = 1.10


@pytest.fixture(scope="module")
def data():
    return load_runs()


@pytest.fixture(scope="module")
def ranks(data):
    # the enumerator proves the same optima as the MIPs on these spaces in a twentieth of the
    # time (1.4 s against 30 s for the 31 runs, identical ratios); the MIPs' agreement on the
    # published runs' spaces is tests/test_published_space.py's subject
    return ranking(data, solver="enumerate")


def _fits(data, run) -> bool:
    inst = run_instance(data, run)
    return evaluate(inst, plan_from_spec(inst, inst.spec.plan), spec=inst.spec.plan).fits


def test_every_run_is_ranked(data, ranks):
    assert set(ranks) == {r["id"] for r in data["runs"]}


def test_the_optimum_is_no_slower_than_a_published_plan_that_fits(data, ranks):
    """The published plan lies in its own knob space: when the model says it fits, the proven
    optimum cannot be slower (ratio >= 1), and a solver optimum must be proven."""
    for run in data["runs"]:
        r = ranks[run["id"]]
        if not _fits(data, run):
            continue
        assert r["status"] == "optimal", (run["id"], r)
        assert r["ratio"] >= 1 - 1e-6, (run["id"], r)


def test_most_published_plans_are_near_the_optimum(ranks):
    """Measured: 24 of the 31 ranked runs are within 10% of the model's optimum and the
    largest ratio is 1.32 (Narayanan et al.'s 18.4B at TP8 against TP2 x PP4 VP10)."""
    ratios = [r["ratio"] for r in ranks.values() if r.get("ratio")]
    assert sum(x <= TARGET for x in ratios) >= 23
    assert max(ratios) <= 1.35


@pytest.mark.xfail(strict=True, reason="issue 12 target not met: the model prefers lower tensor "
                   "parallelism with deeper, interleaved pipelines than the A100 experts chose "
                   "(Narayanan et al. 2021 3.6B-145.6B, Korthikanti et al. 2022 22B and 175B "
                   "with full recompute)")
def test_every_published_plan_within_10_percent(ranks):
    far = {k: round(r["ratio"], 3) for k, r in ranks.items() if r.get("ratio") and r["ratio"] > TARGET}
    assert not far, far

"""Suite-wide pytest settings.

The suite runs on every core (pytest-xdist, ``-n auto`` in pyproject.toml), which hands tests
to the workers in collection order. A long test collected last keeps one worker busy after the
other has finished everything else; started first, the long tests run side by side and the
short ones fill in around them. So the tests below, measured the longest (``pytest
--durations=20`` on a quiet 2-core machine: 12-54 s each), are collected first; the order of
every other test is unchanged, and no test depends on the order."""

from __future__ import annotations

import functools

import pytest
import typer.testing

# typer's CliRunner rebuilds the click command from the app's signatures on every invoke
# (typer.main.get_command, about 7 ms: every parameter's type hints read again), and the suite
# invokes the CLI about a thousand times; the command is built once per app instead. A click
# command keeps no state between runs (each main() makes its own context), so every invoke
# still runs the CLI from the start.
if hasattr(typer.testing, "_get_command"):
    typer.testing._get_command = functools.lru_cache(maxsize=None)(typer.testing._get_command)


@pytest.fixture(autouse=True)
def _one_process_per_query(monkeypatch):
    """``plan pareto`` and ``plan capacity`` solve their sizes in a pool of one process per
    core by default (formulations/pool.py). The suite already keeps every core busy with its
    own workers, so a pool inside a test only adds its start (about a second, measured over the
    pareto tests) and competes with them: here the default is one process. Tests of the pool
    pass ``workers`` (or ``--workers``) themselves."""
    monkeypatch.setattr("formulations.pool.default_workers", lambda: 1)


@pytest.fixture(autouse=True)
def _first_objective_on_one_worker(request, monkeypatch):
    """CP-SAT's first objective solve races two workers (formulations/cpsat.py,
    ``FIRST_SEARCH``): a second thread that pays on a user's idle core but, with every core
    already running one of the suite's workers, only competes with them (measured: the suite
    took 486-490 s of CPU with the race, 453-468 s without, two runs each). Here that solve
    runs the tie goals' one worker, which proves the same optimum; the tests marked
    ``shipped_search`` run the race itself, and check that it gives the same answer."""
    from formulations import cpsat

    if request.node.get_closest_marker("shipped_search") is None:
        monkeypatch.setattr(cpsat, "FIRST_SEARCH", cpsat.SEARCH)


@pytest.fixture(autouse=True)
def _no_space_from_an_earlier_test():
    """``solve`` keeps the spaces (and their encodings) of the last instances it was given
    (formulations/solve.py, ``space_of``); a test starts without them, so that one patching the
    model or the encoding cannot be answered from an encoding made by an earlier test of the
    same worker."""
    from formulations.solve import clear_spaces

    clear_spaces()


#: node-id prefixes of the longest tests, longest first
LONGEST = (
    "tests/test_solvers.py::test_three_backends_agree",
    "tests/test_solvers.py::test_three_backends_agree_on_more_instances",
    "tests/test_solvers.py::test_three_backends_agree_on_a_third_draw",
    "tests/test_sweep.py::test_local_pool_and_ray_give_identical_tables",
    "tests/test_one_answer.py::test_backends_return_the_same_plan_on_every_shipped_instance",
    "tests/test_solvers.py::test_batch_range_models_prove_the_optimum_with_a_cutoff",
    "tests/test_rack_scale.py::test_solver_places_groups_inside_the_72_gpu_domain",
    "tests/test_count.py::test_batch_models_presolve_to_their_dominant_assignments",
    "tests/test_published_space.py::test_mip_backends_prove_the_same_optimum_on_published_instances",
    "tests/test_numeric_range.py::test_capped_memory_keeps_exactly_the_feasible_plans",
)


def pytest_collection_modifyitems(config, items):
    def rank(item) -> int:
        for i, prefix in enumerate(LONGEST):
            if item.nodeid == prefix or item.nodeid.startswith(prefix + "["):
                return i
        return len(LONGEST)

    items.sort(key=rank)          # (stable: the rest keep their order)

"""Process pools for questions that solve many independent instances: the sizes of a Pareto
front and of a capacity search (:mod:`formulations.queries`) and a sweep's points
(``planner/app/sweep.py``).

Each instance is its own proof, so they run side by side in processes, not threads: half of a
solve is Python (the encoding, the counts), which threads would run one at a time. A pool costs
about a second to start (the fork server imports the solver stack once), so a query uses one
only when it has more than one instance to solve and was given more than one worker.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from typing import Any

#: the modules the fork server imports once, so that each worker starts with the solver stack
#: loaded (a caller adds the module of its own task function)
SOLVER_STACK = ("formulations.solve", "formulations.queries", "formulations.cpsat",
                "formulations.pyomo_backend")


def default_workers() -> int:
    """The CPUs this process may run on (its affinity where the OS tells it, else the
    machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:      # not Linux
        return os.cpu_count() or 1


def workers_or_default(workers: int | None) -> int:
    """The processes a command asked for (``--workers N``), else :func:`default_workers`: the
    commands run one process per core unless told otherwise."""
    return workers or default_workers()


def _ignore_sigint() -> None:
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)   # Ctrl-C is the parent's to handle


def context(preload: Iterable[str] = ()):
    """The process start method: ``forkserver`` where there is one (workers forked from a clean
    server process that has imported the solver stack and ``preload``, not from this process,
    whose solver thread pools, e.g. HiGHS's after an in-process solve, would deadlock a forked
    child), else ``spawn``."""
    import multiprocessing as mp

    if "forkserver" in mp.get_all_start_methods():
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload([*preload, *SOLVER_STACK])
        return ctx
    return mp.get_context("spawn")


def imap(fn: Callable[[Any], Any], items: list, workers: int, ordered: bool = True,
         preload: Iterable[str] = ()) -> Iterator[Any]:
    """``fn`` over ``items``: in this process with one worker (or one item), else in a pool of
    ``min(workers, len(items))`` processes, one item at a time, yielding each result as it
    arrives (in the items' order when ``ordered``). ``fn`` must be a module-level function
    and the items picklable. Ctrl-C (or any error) terminates the pool and re-raises; a caller
    that stops reading (closes the generator: capacity at its answer) terminates it too. As with
    any non-fork multiprocessing, a script calling this needs the ``if __name__ ==
    "__main__":`` guard (the ``plan`` command has it)."""
    if workers <= 1 or len(items) <= 1:
        yield from map(fn, items)
        return
    pool = context(preload).Pool(min(workers, len(items)), initializer=_ignore_sigint)
    try:
        run = pool.imap if ordered else pool.imap_unordered
        yield from run(fn, items, chunksize=1)
        pool.close()
    except BaseException:
        pool.terminate()
        raise
    finally:
        pool.join()

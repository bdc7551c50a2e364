"""What a long solve is doing, for the application to show while the user waits.

A large space is solved as many models (formulations/solve.py, ``_best_of_parts``): one per
candidate batch of a global-batch range, one per data-parallel sharding mode and pipeline
layout of a fixed batch. On the largest instances that is a hundred models and most of a minute
(instances/deepseek-v3-h800.toml without its ``pp`` and ``vp`` pins: 105 models, about 47 s
under CP-SAT on two cores). The search says when it starts each model, and with what incumbent,
and the queries which of their many solves they await (:func:`awaited`); whoever listens
decides what to show. With no listener nothing is done, and the search knows
nothing of its listeners (model <- search <- app)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

#: called as ``listener(kind, index, total, best, objective)``: the ``index``-th (from 0) of
#: ``total`` models of ``kind`` ("fixed-batch", "sharding-mode and layout") is starting, or
#: the ``index``-th answer of a query's ``total`` is awaited ("cluster size": pareto's and
#: capacity's sizes; "comparison solve": --compare's); ``best`` is the best objective proven so
#: far among the models (None before the first, and for awaited answers), in ``objective``'s
#: unit ("step_time": seconds per step, "time_per_sample": seconds per sequence)
Listener = Callable[[str, int, int, "float | None", str], None]

_listeners: list[Listener] = []


@contextmanager
def listen(listener: Listener) -> Iterator[None]:
    """Hear every model a solve starts while the block runs (in this process: the models a
    query's worker processes solve are not heard)."""
    _listeners.append(listener)
    try:
        yield
    finally:
        _listeners.remove(listener)


def starting(kind: str, index: int, total: int, best: float | None, objective: str) -> None:
    """Tell the listeners that a model is starting (from any of the search's threads)."""
    for listener in list(_listeners):
        listener(kind, index, total, best, objective)


def awaited(results: Iterator, kind: str, total: int, objective: str = "step_time") -> Iterator:
    """``results``, answers read in order (a process pool's, :func:`formulations.pool.imap`),
    each announced as the ``kind`` awaited before it is read; closing this closes them (a pool
    stops its solves)."""
    try:
        for index in range(total):
            starting(kind, index, total, None, objective)
            try:
                item = next(results)
            except StopIteration:
                return
            yield item
    finally:
        close = getattr(results, "close", None)
        if close is not None:
            close()

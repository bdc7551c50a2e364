"""A status line on stderr while a long solve runs: which of its models the search is on and
the best plan proven so far (formulations/progress.py says why a solve is many models), and
for the queries that await many solves (pareto and capacity's sizes, --compare's what-ifs)
which one they await.

Shown only on a terminal, and only once there is something to count (a small space is one
model and solves in about a second): a pipe, a log and ``--json`` readers see nothing of it."""

from __future__ import annotations

import threading

from formulations import progress

#: what is counted, outermost first: the published runs plan validate ranks, the cluster
#: sizes of pareto and capacity and the solves of --compare (their answers awaited in order),
#: a batch range's batch models, a fixed batch's sharding mode and layout models; each of the
#: first three is a question of its own
KINDS = ("published run", "cluster size", "comparison solve", "fixed-batch",
         "sharding-mode and layout")
QUESTIONS = KINDS[:3]
#: the kinds said otherwise than the search names them (the others as named)
WORDS = {"fixed-batch": "batch model", "sharding-mode and layout": "sharding / layout model"}
UNITS = {"step_time": "s per step", "time_per_sample": "s per sequence"}


def status_text(label: str, levels: dict[str, tuple[int, int]], best: float | None,
                objective: str, verb: str = "solving") -> str:
    """The line (a spinner before it, the time elapsed after it): ``solving FILE: batch models
    3 of 12, sharding / layout models 5 of 24, best so far 0.0195 s per sequence``: of each
    kind, the latest model started (from 1) of its split's count."""
    where = ", ".join(f"{WORDS.get(k, k)}s {i + 1} of {n}" for k, (i, n) in
                      sorted(levels.items(), key=lambda kv: KINDS.index(kv[0])
                             if kv[0] in KINDS else len(KINDS)))
    so_far = "" if best is None else f", best so far {best:.6g} {UNITS.get(objective, '')}"
    return f"{verb} {label}: {where}{so_far}".rstrip()


class SolveStatus:
    """``with SolveStatus(err, "file.toml"):`` around a solve: a spinner, :func:`status_text`
    and the time since its first announcement on ``console`` (stderr) while it runs, gone when
    it ends (a transient rich progress line: the clock ticks between announcements)."""

    def __init__(self, console, label: str, verb: str = "solving"):
        self.console, self.label, self.verb = console, label, verb
        self.levels: dict[str, tuple[int, int]] = {}
        self.best: float | None = None
        self.status = None                  # the rich Progress, from the first announcement
        self._task = None
        self._listening = None
        self._lock = threading.Lock()       # (the search announces from two threads)

    def __enter__(self) -> SolveStatus:
        if self.console.is_terminal:
            self._listening = progress.listen(self.hear)
            self._listening.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._listening is not None:
            self._listening.__exit__(*exc)
        if self.status is not None:
            self.status.stop()

    def hear(self, kind: str, index: int, total: int, best: float | None,
             objective: str) -> None:
        with self._lock:
            if kind in QUESTIONS:       # another run, size or what-if: another question,
                self.levels, self.best = {}, None   # its own models and its own best
            elif best is not None:      # (one question's models minimise one objective)
                self.best = best if self.best is None else min(self.best, best)
            # (one counter per kind, not nested: a range's leading batch model goes on with its
            # sharding / layout models in one thread while the other batch models start in a
            # second, formulations/solve.py BATCHES_BESIDE_TIES)
            self.levels[kind] = (index, total)
            text = status_text(self.label, self.levels, self.best, objective, self.verb)
            if self.status is None:
                from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

                self.status = Progress(SpinnerColumn(), TextColumn("{task.description}"),
                                       TimeElapsedColumn(), console=self.console,
                                       transient=True)
                self._task = self.status.add_task(text, total=None)
                self.status.start()
            else:
                self.status.update(self._task, description=text)

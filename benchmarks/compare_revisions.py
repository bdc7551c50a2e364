#!/usr/bin/env python
"""Whole-process ``plan solve FILE --json`` times of two revisions of the code, interleaved.

Each revision is a ``git archive`` snapshot (``solve_scaling.snapshot``; ``WORKTREE`` is the
checkout as it stands), so both run the same Python and packages. Every round solves each file
once per revision, the revisions alternating, so a slow spell of the shared machine falls on
both; the table gives the median per file and revision, and whether every run of both agreed on
the objective and the plan (the degrees, micro-batch, recompute, sequence parallelism and
distributed optimizer ``solve_scaling.run_once`` reads). A change
that should only make solving faster must print ``same`` on every line.

``--extra`` appends flags to every command: ``--extra=--compare`` times ``plan solve --compare``
(the answers column then still reads the constrained plan).

Example::

    python benchmarks/compare_revisions.py HEAD~1 WORKTREE instances/*.toml --repeat 3
    python benchmarks/compare_revisions.py 44fb6ad WORKTREE instances/gpt3-175b-a100.toml \
        --extra=--compare --repeat 3
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from solve_scaling import ROOT, host_info, plan_command, run_once, snapshot


def checkout(rev: str, tmp: Path) -> tuple[dict | None, str | None, str]:
    """The environment and directory that run ``rev`` (the checkout itself for WORKTREE)."""
    if rev == "WORKTREE":
        return None, str(ROOT), "the working tree"
    return snapshot(rev, tmp / rev.replace("/", "_").replace("~", "-") / "code")


def revision_args(ap: argparse.ArgumentParser) -> None:
    """The two revisions to compare and the rounds, as every comparison script takes them."""
    ap.add_argument("base", help="git revision, or WORKTREE")
    ap.add_argument("new", help="git revision, or WORKTREE")
    ap.add_argument("--repeat", type=int, default=3, help="rounds (default 3)")


@contextlib.contextmanager
def revisions(base: str, new: str) -> Iterator[dict[str, tuple[dict | None, str, str]]]:
    """The host, then each revision's environment, directory and label (printed), for the
    duration of the comparison (the snapshots are removed after it)."""
    print(host_info(), flush=True)
    with tempfile.TemporaryDirectory() as td:
        revs = {r: checkout(r, Path(td)) for r in (base, new)}
        for rev, (_, _, label) in revs.items():
            print(f"{rev}: {label}", flush=True)
        yield revs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    revision_args(ap)
    ap.add_argument("files", nargs="+", type=Path, help="instance TOML files")
    ap.add_argument("--time-limit", type=float, default=120.0)
    ap.add_argument("--solver", default="cpsat", help="plan solve --solver (default cpsat)")
    ap.add_argument("--extra", default="", help="more plan solve flags, space-separated")
    args = ap.parse_args()
    with revisions(args.base, args.new) as revs:
        runs: dict[tuple[Path, str], list[dict]] = {}
        for _ in range(args.repeat):
            for f in args.files:
                for rev, (env, cwd, _) in revs.items():
                    cmd = plan_command() + ["solve", str(f.resolve()), "--json", "--solver",
                                            args.solver, "--time-limit", str(args.time_limit)
                                            ] + args.extra.split()
                    runs.setdefault((f, rev), []).append(
                        run_once(cmd, args.time_limit, 30.0, env=env, cwd=cwd))
    totals = dict.fromkeys(revs, 0.0)
    print(f"\n| file | {args.base} (s) | {args.new} (s) | answers |\n|---|---:|---:|---|")
    for f in args.files:
        meds, answers = [], set()
        for rev in revs:
            rs = runs[(f, rev)]
            med = statistics.median(r["wall_s"] for r in rs)
            totals[rev] += med
            meds.append(med)
            answers |= {(r["status"], r["objective"], tuple(sorted((r.get("plan") or {}).items())))
                        for r in rs}
        print(f"| {f.name} | {meds[0]:.2f} | {meds[1]:.2f} | "
              f"{'same' if len(answers) == 1 else 'DIFFER: ' + repr(sorted(answers, key=str))} |")
    print(f"| all | {totals[args.base]:.2f} | {totals[args.new]:.2f} | |")


if __name__ == "__main__":
    sys.exit(main())

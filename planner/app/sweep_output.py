"""The results file of a sweep, and how a re-run judges one it finds.

This module owns the on-disk format of ``plan sweep --out``: which columns a row has and in
what order (:func:`column_order`, :func:`written_column`), how cells are written and read back
in a CSV (floats exactly, lists as JSON, an empty cell for a value a row does not have) or a
Parquet file (one type per column, :func:`normalise`), the identity every row carries
(``point_key``, its axis values, and ``point_hash``, :func:`point_hash` of its resolved
instance and query options), appending each point's rows as it finishes and rewriting the file
sorted at the end (:class:`Sink`), and which columns are wall clocks rather than results
(:data:`TIMING_COLUMNS`, :func:`comparable`).

It also owns the resume: :func:`resume_state` reads an existing output before any point runs
and decides what it gives this run. Rows of this sweep's points are kept and their points
skipped; a last line cut short by a killed run and repeated identical rows are dropped with a
note; another sweep's file, a changed point (its hash differs), an edited header or a text in
a number column are refused with an :class:`~planner.model.errors.InputError` naming the file.

The format is kept apart from :mod:`planner.app.sweep` (the sweep file, the engines and the
run) so that writing a file and judging one read the same rules in one place, and the tests,
the CLI and the benchmark read outputs through it. Imports run one way: sweep.py imports this
module, never the reverse; a sweep and its points come in as :class:`SweepLike` and
:class:`PointLike`, the parts of :class:`planner.app.sweep.Sweep` and ``Point`` read here.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from planner.model.words import plural, toml_value
from planner.model.errors import InputError, PlanError

OUT_SUFFIXES = (".csv", ".parquet")
#: columns that change from run to run (wall clocks); every other column is a pure function of
#: the point and is identical whichever engine ran it
TIMING_COLUMNS = ("solver.wall_s", "solver.solve_s", "solver.build_s", "capacity.wall_s",
                  "point_wall_s")


# ---------------------------------------------------------------------------------------------
# A point and its rows: identity, naming, comparison
# ---------------------------------------------------------------------------------------------


class PointLike(Protocol):
    """What this module reads of a point (:class:`planner.app.sweep.Point` is one)."""

    @property
    def index(self) -> int: ...

    @property
    def axes(self) -> dict[str, Any]: ...

    @property
    def doc(self) -> dict[str, Any]: ...

    @property
    def key(self) -> str: ...


class SweepLike(Protocol):
    """What a resume reads of a sweep (:class:`planner.app.sweep.Sweep` is one)."""

    @property
    def source(self) -> str: ...

    @property
    def points(self) -> Sequence[PointLike]: ...

    @property
    def axis_keys(self) -> list[str]: ...

    def options(self) -> dict[str, Any]: ...


def point_hash(p: PointLike, options: dict[str, Any], legacy: bool = False) -> str:
    """A point's identity: its resolved instance and the query options, but not the time
    limit, which changes how long a point may run, not what it asks: a proven result stands
    under any limit, and a point stopped at one is run again under a larger one
    (:func:`resume_state`). ``legacy``: the hash files written before 2026-12-05 carry, with the
    time limit in it (such a row is this sweep's when it ran under the same limit)."""
    opts = options if legacy else {k: v for k, v in options.items() if k != "time_limit"}
    blob = json.dumps({"doc": p.doc, **opts}, sort_keys=True, default=str)
    return "h" + hashlib.sha256(blob.encode()).hexdigest()[:16]   # never read back as a number


def axes_text(axes: dict[str, Any]) -> str:
    return ", ".join(f"{k} = {json.dumps(v)}" for k, v in axes.items())


def comparable(rows: list[dict]) -> list[dict]:
    """Rows without their wall-clock columns and empty cells (a CSV cannot tell an empty text
    from a missing value): what must be identical whichever engine ran."""
    return [{k: v for k, v in r.items() if k not in TIMING_COLUMNS and v not in (None, "")}
            for r in rows]


# ---------------------------------------------------------------------------------------------
# Output files: append as points finish, resume, rewrite sorted at the end
# ---------------------------------------------------------------------------------------------

_ORDER = ("point", "pareto.nodes", "pareto.on_front", "capacity.nodes", "solver.status",
          "reason", "plan_label", "plan.", "step_time_s", "time_per_sequence_s", "breakdown_s.",
          "memory_gib.", "most_loaded_stage", "mfu", "model_tflops_per_gpu", "total_days",
          "cost", "tokens_per_step", "steps", "feasible", "capacity.", "deadline_days",
          "meets_deadline", "solver.", "time_limit_s", "point_wall_s", "point_key",
          "point_hash")


def column_order(rows: list[dict], axis_keys: list[str]) -> list[str]:
    """Axis columns first (file order), then the result columns in a fixed reading order."""
    seen: dict[str, None] = {}
    for r in rows:
        for k in r:
            seen.setdefault(k, None)
    rest = [k for k in seen if k not in axis_keys]

    def rank(k: str) -> tuple[int, int]:
        for i, pre in enumerate(_ORDER):
            if k == pre or (pre.endswith(".") and k.startswith(pre)):
                return (i, 0)
        return (_ORDER.index("point_wall_s"), 0)   # other result keys rank with point_wall_s
    # stable: first-seen order within a group, so the result keys _ORDER does not name
    # (caveats, framework, kernel_stack, ...) come after the solver block, before point_wall_s
    # (a row has them before it)
    rest.sort(key=rank)
    return [k for k in axis_keys if k in seen] + rest


def normalise(rows: list[dict], columns: list[str]) -> list[dict]:
    """One type per column (Parquet needs it): ints and floats mixed become floats; lists
    become JSON text; any other mix becomes text."""
    out = [dict(r) for r in rows]
    for c in columns:
        for r in out:
            if isinstance(r.get(c), list | tuple | dict):
                r[c] = json.dumps(r[c])
        kinds = {type(r[c]) for r in out if r.get(c) is not None}
        if kinds and kinds <= {int, float}:
            if float in kinds:
                for r in out:
                    if r.get(c) is not None:
                        r[c] = float(r[c])
        elif len(kinds) > 1:
            for r in out:
                if r.get(c) is not None:
                    r[c] = r[c] if isinstance(r[c], str) else json.dumps(r[c])
    return out


def _csv_text(rows: list[dict], columns: list[str], header: bool) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    if header:
        w.writerow(columns)
    for r in rows:
        w.writerow(["" if r.get(c) is None else _csv_cell(r[c]) for c in columns])
    return buf.getvalue()


def _csv_cell(v: Any) -> str:
    if isinstance(v, float):
        return repr(v)            # exact round trip
    return str(v)


#: columns that are text whatever they look like (a hash of digits, a reason such as "1e9")
_TEXT_COLUMNS = {"point_key", "point_hash", "reason", "plan_label", "solver.note"}


def _parse_cell(s: str) -> Any:
    if s == "":
        return None
    if s in ("True", "False"):
        return s == "True"
    try:
        return int(s)
    except ValueError:
        pass
    try:
        return float(s)
    except ValueError:
        return s


def read_rows(path: str | Path) -> list[dict]:
    """The rows of a sweep output (.csv or .parquet); a missing or empty file has none. (The
    sweep itself reads through :func:`_read_output`: a library entry point, used by
    tests/test_sweep.py.)"""
    return _read_output(Path(path)).rows


@dataclass
class _Output:
    """What an output file holds, as read: its columns, its rows and (CSV) each row's line."""

    columns: list[str] = field(default_factory=list)
    rows: list[dict] = field(default_factory=list)
    lines: list[int] = field(default_factory=list)     # CSV: the line each row ends on
    widths: list[int] = field(default_factory=list)    # CSV: the fields on each row's line
    newline: bool = True                               # CSV: the file ends with a newline


def _read_output(p: Path) -> _Output:
    """Read a .csv or .parquet output as it is; :func:`resume_state` judges it."""
    if not p.exists() or p.stat().st_size == 0:
        return _Output()
    try:
        if p.suffix.lower() == ".parquet":
            table = _pyarrow_parquet().read_table(p)
            return _Output(list(table.column_names), table.to_pylist())
        return _read_csv(p)
    except PlanError:
        raise
    except UnicodeDecodeError:
        raise InputError(f"--out {p}: exists and is not a sweep output CSV (not UTF-8 text); "
                         "choose another file") from None
    except csv.Error as exc:
        raise InputError(f"--out {p}: exists and is not a sweep output CSV ({exc}); choose "
                         "another file") from None
    except Exception as exc:
        raise InputError(f"--out {p}: cannot read the existing file to resume: {exc}") from None


def _read_csv(p: Path) -> _Output:
    with p.open("rb") as f:
        f.seek(-1, os.SEEK_END)
        newline = f.read(1) == b"\n"
    out = _Output(newline=newline)
    with p.open(newline="", encoding="utf-8") as f:
        rd = csv.reader(f)
        out.columns = next(rd, None) or []
        for line in rd:
            if not line:
                continue
            # (an empty cell is None under its column, so that a column empty in every row,
            # such as reason when every point has a plan, survives the rewrite on resume)
            out.rows.append({c: (None if v == "" else v if c in _TEXT_COLUMNS else _parse_cell(v))
                             for c, v in zip(out.columns, line)})
            out.lines.append(rd.line_num)
            out.widths.append(len(line))
    return out


def write_rows(path: str | Path, rows: list[dict], columns: list[str]) -> None:
    """Write every row atomically (a temporary file renamed over the target). A value a row
    does not have is an empty cell in a CSV and null in Parquet, whether it is missing (the
    step time of a point without a plan) or an empty text (the reason of a point with one):
    a CSV cannot tell the two apart, and so Parquet does not either."""
    p = Path(path)
    rows = normalise(rows, columns)
    tmp = p.with_name(f".{p.name}.tmp")
    if p.suffix.lower() == ".parquet":
        pa, pq = _pyarrow(), _pyarrow_parquet()
        table = pa.Table.from_pylist([{c: (None if r.get(c) == "" else r.get(c)) for c in columns}
                                      for r in rows])
        pq.write_table(table, tmp)
    else:
        tmp.write_text(_csv_text(rows, columns, header=True), encoding="utf-8")
    os.replace(tmp, p)


def _pyarrow():
    try:
        import pyarrow
    except ImportError:
        raise InputError("Parquet output needs pyarrow: pip install -e '.[sweep]' "
                         "(or write --out results.csv)") from None
    return pyarrow


def _pyarrow_parquet():
    _pyarrow()
    import pyarrow.parquet as pq

    return pq


def check_out_path(path: str | Path) -> Path:
    p = Path(path)
    if p.suffix.lower() not in OUT_SUFFIXES:
        raise InputError(f"--out {p}: expected a file name ending in .csv or .parquet, got "
                         f"{p.suffix or 'no suffix'}")
    if p.is_dir():
        raise InputError(f"--out {p}: is a directory")
    if not p.parent.is_dir():
        raise InputError(f"--out {p}: the directory {p.parent} does not exist")
    if p.suffix.lower() == ".parquet":
        _pyarrow_parquet()
    _probe_writable(p)
    return p


def _probe_writable(p: Path) -> None:
    """Fail now, naming --out, rather than when the first point has run: the file is appended
    to, and rewritten through a temporary file beside it (:func:`write_rows`), so both must be
    writable."""
    tmp = p.with_name(f".{p.name}.tmp")
    try:
        with tmp.open("w"):
            pass
        tmp.unlink()
    except OSError as exc:
        raise InputError(f"--out {p}: cannot write a file in {p.parent} "
                         f"({exc.strerror or exc})") from None
    try:
        if p.exists():
            with p.open("a"):
                pass
    except OSError as exc:
        raise InputError(f"--out {p}: cannot write to it ({exc.strerror or exc})") from None


class Sink:
    """Collects rows; with a path, appends each point's rows as it finishes (CSV: one write per
    point, a new column rewrites the file; Parquet cannot append: the whole file is rewritten
    atomically at most every ``every_s`` seconds) and rewrites the file sorted at the end.

    ``existing`` are the rows a resume keeps (:func:`resume_state`): a CSV is appended to in its
    own ``columns``; ``rewrite`` (rows were dropped from the file) rewrites it at once, and a
    file without a final ``newline`` gets one before the first appended row."""

    def __init__(self, path: Path | None, axis_keys: list[str], existing: list[dict],
                 every_s: float = 2.0, columns: list[str] | None = None,
                 rewrite: bool = False, newline: bool = True):
        self.path, self.axis_keys, self.every_s = path, axis_keys, every_s
        self.rows: list[dict] = list(existing)
        self.columns = column_order(self.rows, axis_keys) if self.rows else []
        if path is not None and path.suffix.lower() == ".csv" and self.rows and columns:
            self.columns = list(columns)      # append in the existing file's column order
        self.newline = newline
        self.last = time.monotonic()
        self.dirty = False
        if rewrite:
            self.flush()

    def add(self, rows: list[dict]) -> None:
        self.rows.extend(rows)
        if self.path is None:
            return
        new_cols = [k for r in rows for k in r if k not in self.columns]
        if self.path.suffix.lower() == ".csv" and not new_cols and self.columns:
            text = _csv_text(normalise(rows, self.columns), self.columns, header=False)
            if not self.newline:          # else the row would be glued to the last line
                text, self.newline = "\n" + text, True
            with self.path.open("a", newline="", encoding="utf-8") as f:
                f.write(text)             # one write per point: Ctrl-C lands between points
            return
        if new_cols:
            self.columns = column_order(self.rows, self.axis_keys)
        self.dirty = True
        if self.path.suffix.lower() == ".csv" or time.monotonic() - self.last >= self.every_s:
            self.flush()

    def flush(self) -> None:
        if self.path is not None and self.rows:
            write_rows(self.path, self.rows, self.columns)
            self.last, self.dirty, self.newline = time.monotonic(), False, True

    def finish(self) -> None:
        """Rewrite sorted by point (and size), so the file does not depend on finishing order."""
        self.rows.sort(key=lambda r: (_int(r.get("point")), _int(r.get("pareto.nodes"))))
        self.columns = column_order(self.rows, self.axis_keys)
        self.flush()


def _int(v: Any) -> int:
    return v if isinstance(v, int) else -1


# ---------------------------------------------------------------------------------------------
# Resuming from an existing output
# ---------------------------------------------------------------------------------------------

#: what every row plan sweep writes has besides its axes (run_point's head and tail, and a
#: status and a reason whatever the outcome)
_ROW_COLUMNS = ("point", "solver.status", "reason", "point_key", "point_hash")
#: what every row with a plan has besides those (among them what the table and figure read)
_PLAN_COLUMNS = ("plan_label", "step_time_s", "time_per_sequence_s", "mfu", "total_days", "cost")
#: the result columns _ORDER does not name (they sort with point_wall_s): result-document keys
#: ("plan" is the empty plan of a point without one; nodes and unproven are capacity's)
_OTHER_COLUMNS = ("plan", "caveats", "framework", "kernel_stack", "nodes", "unproven")
#: columns of numbers (or nothing): a text there is a hand edit the table and figure fail on
_NUMBER_COLUMNS = ("point", "pareto.nodes", "capacity.nodes", "step_time_s",
                   "time_per_sequence_s", "breakdown_s.", "memory_gib.", "mfu",
                   "model_tflops_per_gpu", "total_days", "cost", "tokens_per_step", "steps",
                   "time_limit_s", "point_wall_s")


_RESTORE = "restore it, or write to another file"


def _matches(column: str, names: Iterable[str]) -> bool:
    """``column`` is one of ``names``, or under one that ends with a dot (``breakdown_s.``)."""
    return any(column == n or (n.endswith(".") and column.startswith(n)) for n in names)


def written_column(column: str, axis_keys: Iterable[str]) -> bool:
    """Whether plan sweep writes ``column`` in the output of a sweep with these axes."""
    return column in axis_keys or _matches(column, _ORDER) or column in _OTHER_COLUMNS


@dataclass
class Resume:
    """What an existing output gives a run: the rows it keeps, the points they finish, and how
    the file is to be written on (see :class:`Sink`)."""

    rows: list[dict] = field(default_factory=list)
    columns: list[str] = field(default_factory=list)
    done: set[str] = field(default_factory=set)
    foreign: int = 0
    notes: list[str] = field(default_factory=list)
    rewrite: bool = False
    newline: bool = True


def resume_state(out: Path | None, sw: SweepLike) -> Resume:
    """Read ``out`` and judge it before any point runs. Another sweep's file, an edited header,
    a text in a number column, or one point twice with different results are refused (exit 2,
    naming the file and what is wrong) rather than mixed into this sweep's rows; a last line
    cut short (a run killed while writing) and repeated identical rows are dropped with a note
    (their points run again, or once)."""
    got = _read_output(out) if out is not None else _Output()
    if not got.columns and not got.rows:
        return Resume()
    _check_header(out, got.columns)
    notes: list[str] = []
    rows = _drop_cut_line(out, got, sw, notes)
    _check_identity(out, rows, got)
    res = Resume(rows, got.columns, notes=notes, newline=got.newline,
                 rewrite=len(rows) < len(got.rows))
    by_key = {p.key: p for p in sw.points}
    hashes = {p.key: point_hash(p, sw.options()) for p in sw.points}
    legacy = {p.key: point_hash(p, sw.options(), legacy=True) for p in sw.points}
    limit = sw.options().get("time_limit")
    for r in rows:
        k = r.get("point_key")
        if k not in by_key:
            res.foreign += 1
            continue
        if r.get("point_hash") == legacy[k] != hashes[k]:
            # a row written before the time limit left the hash: it ran under this limit
            r["point_hash"], r["time_limit_s"] = hashes[k], limit
            res.rewrite = True
        if r.get("point_hash") != hashes[k]:
            raise InputError(
                f"--out {out}: holds a result of a different sweep for the point "
                f"{axes_text(json.loads(k))} (its instance or query options changed); "
                "write to another file, or delete this one to start over")
        res.done.add(k)
    if rows and not res.done:
        raise InputError(f"--out {out}: holds another sweep's rows (none of its "
                         f"{plural(len(rows), 'row')} is a point of {sw.source}); write to "
                         "another file, or delete this one to start over")
    _check_columns(out, got.columns, rows, sw.axis_keys)
    _check_numbers(out, rows)
    res.rows = _drop_repeats(out, rows, got, notes)
    res.rewrite = res.rewrite or len(res.rows) < len(rows)
    again = _stopped_points(res.rows, limit)
    if again:
        res.rows = [r for r in res.rows if r.get("point_key") not in again]
        res.done -= again
        res.rewrite = True
        notes.append(f"{plural(len(again), 'point')} of {out} stopped at a smaller time limit "
                     "without a proven answer, run again under "
                     + (f"{limit:g} s" if limit is not None else "no time limit"))
    for r in res.rows:            # (axis values as the sweep has them: a list, not its JSON)
        p = by_key.get(r.get("point_key"))
        if p is not None:
            r.update(p.axes)
            r["point"] = p.index
    return res


#: a row's status when the solver stopped at the time limit without a proof (a plan not proven
#: optimal, or none): a larger limit may give the answer
UNPROVEN = ("feasible", "no_solution_in_limit")


def _stopped_points(rows: list[dict], limit: float | None) -> set[str]:
    """The points (``point_key``) whose rows include one the solver left unproven at a time
    limit smaller than ``limit`` (``None``: no limit), which this run may prove: every row of
    such a point is run again (a pareto point as a whole). A row without a time limit was not
    stopped by one (a row of a file from before the ``time_limit_s`` column has this run's
    limit filled in by :func:`resume_state`: its legacy hash says it ran under it)."""
    again = set()
    for r in rows:
        if r.get("solver.status") not in UNPROVEN or "time_limit_s" not in r:
            continue
        ran = r.get("time_limit_s")
        if ran is not None and (limit is None or limit > ran):
            again.add(r.get("point_key"))
    return again


def _check_header(out: Path, columns: list[str]) -> None:
    """The columns every output has, each once."""
    if "point_key" not in columns:
        raise InputError(f"--out {out}: exists and is not a sweep output (no point_key "
                         "column); choose another file")
    seen: set[str] = set()
    for c in columns:
        if c in seen:
            raise InputError(f"--out {out}: the column {toml_value(c)} appears twice in its "
                             f"header, which plan sweep never writes (edited?); {_RESTORE}")
        seen.add(c)
    for c in _ROW_COLUMNS:
        if c not in seen:
            raise InputError(f"--out {out}: no {toml_value(c)} column, which every row plan "
                             f"sweep writes has (renamed or deleted?); {_RESTORE}")


def _drop_cut_line(out: Path, got: _Output, sw: SweepLike, notes: list[str]) -> list[dict]:
    """The rows without a last line cut short. A CSV line has as many fields as the header,
    except a last line without its newline where a run stopped while writing: it has fewer
    fields, or a point_hash that is only the start of its point's."""
    rows, n = got.rows, len(got.columns)
    for i, width in enumerate(got.widths):
        if width != n and not (i == len(rows) - 1 and not got.newline and width < n):
            raise InputError(f"--out {out}: line {got.lines[i]} has {width} fields where the "
                             f"header has {n}: not a file plan sweep wrote (edited?); "
                             f"{_RESTORE}")
    if got.widths and not got.newline and (got.widths[-1] < n or _hash_cut(rows[-1], sw)):
        notes.append(f"the last line of {out} (line {got.lines[-1]}) was cut short, as by a "
                     "run stopped while writing it; dropped: its point runs again")
        return rows[:-1]
    return rows


def _check_identity(out: Path, rows: list[dict], got: _Output) -> None:
    """Every row names its point: a point_key (its axis values as a JSON table) and a
    point_hash. A row without them was not written by plan sweep, and would be kept as another
    sweep's."""
    for i, r in enumerate(rows):
        try:
            ok = isinstance(json.loads(r.get("point_key") or ""), dict) and r.get("point_hash")
        except (TypeError, ValueError):
            ok = False
        if not ok:
            where = f"line {got.lines[i]}" if got.lines else f"row {i + 1}"
            raise InputError(f"--out {out}: {where} has no point_key and point_hash naming its "
                             f"point, which every row plan sweep writes has (edited?); "
                             f"{_RESTORE}")


def _hash_cut(row: dict, sw: SweepLike) -> bool:
    """The row's point_hash is the start of its point's hash, not all of it."""
    p = next((p for p in sw.points if p.key == row.get("point_key")), None)
    if p is None:
        return False
    got = str(row.get("point_hash") or "")
    return any(got != full and full.startswith(got)
               for full in (point_hash(p, sw.options()), point_hash(p, sw.options(), True)))


def _check_columns(out: Path, columns: list[str], rows: list[dict], axis_keys: list[str]) -> None:
    """Every axis column, the plan columns when a row has a plan, and no column plan sweep does
    not write (a result column renamed is one missing and one unknown)."""
    for key in axis_keys:
        if key not in columns:
            raise InputError(f"--out {out}: no {toml_value(key)} column, an axis of this sweep "
                             f"(renamed or deleted?); {_RESTORE}")
    if any(r.get("plan_label") for r in rows):
        for c in _PLAN_COLUMNS:
            if c not in columns:
                raise InputError(f"--out {out}: no {toml_value(c)} column, which every row "
                                 f"with a plan has (renamed or deleted?); {_RESTORE}")
    for c in columns:
        if not written_column(c, axis_keys):
            raise InputError(f"--out {out}: the column {toml_value(c)} is not one plan sweep "
                             f"writes for this sweep (renamed, or added by hand?); {_RESTORE}")


def _row_name(r: dict) -> str:
    """A row as the user finds it: its point index and axis values."""
    try:
        axes = json.loads(r.get("point_key") or "")
    except (TypeError, ValueError):
        axes = None
    return f"point {r.get('point')}" + (f" ({axes_text(axes)})" if isinstance(axes, dict)
                                        else "")


def _check_numbers(out: Path, rows: list[dict]) -> None:
    """A number (or nothing) in every number column; the point index a whole number."""
    for r in rows:
        for c, v in r.items():
            if v is None or not _matches(c, _NUMBER_COLUMNS):
                continue
            ok = isinstance(v, int) if c == "point" else isinstance(v, int | float)
            if isinstance(v, bool) or not ok:
                raise InputError(f"--out {out}: {_row_name(r)}: {c} = {json.dumps(v)} is not "
                                 f"a {'point index' if c == 'point' else 'number'} (edited?); "
                                 "fix the cell, or delete the row to run its point again")


def _drop_repeats(out: Path, rows: list[dict], got: _Output, notes: list[str]) -> list[dict]:
    """One row per point (per point and size for pareto): a repeat with the same results (the
    wall clocks aside) is dropped with a note; one with other results is refused."""
    first: dict[tuple, int] = {}
    kept, dropped = [], 0
    for i, r in enumerate(rows):
        ident = (r.get("point_key"), r.get("pareto.nodes"))
        if ident not in first:
            first[ident] = i
            kept.append(r)
        elif comparable([r]) == comparable([rows[first[ident]]]):
            dropped += 1
        else:
            where = (f" (lines {got.lines[first[ident]]} and {got.lines[i]})"
                     if got.lines else "")
            raise InputError(f"--out {out}: {_row_name(r)} has two rows with different "
                             f"results{where}; delete the wrong one, or write to another file")
    if dropped:
        notes.append(f"{plural(dropped, 'repeated row')} of {out} (a point with the same results "
                     "twice) dropped")
    return kept

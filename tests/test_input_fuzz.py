"""Seeded mutation test of the project rule "bad input gets a clear, specific error and a
non-zero exit, never a traceback" (planner/app/cli.py, docs/contract.md "Exit codes").

Why: the hand-written cases (test_user_errors.py, test_schema.py, ...) cover the mistakes someone
thought of; this file guards the rule itself against the ones nobody did. Each case starts from a
shipped instance (``instances/*.toml``, read with tomllib), applies one to three random
mutations, writes the result back to TOML (a small writer below; nan / inf as TOML nan / inf) and
runs ``plan evaluate`` on it in-process (typer's CliRunner and the helpers of tests/test_cli.py),
plain and with ``--json``; about 30% of the cases add ``--emit megatron|nemo|torchtitan|
deepspeed``, and five cases run ``plan solve --solver enumerate --json`` instead.

The mutations: a leaf replaced by a wrong type (a string for a number, a list, an inline table, a
bool), by nan / inf / -inf / 0 / a negative / a huge number (1e30, 2**63, 2**70), or one item of
it made so; a key or a whole section deleted; an unknown key added (in a section or at the top);
a section renamed, or replaced by a scalar or a list; a ``[plan]`` degree or count set to one that
does not divide (3, 5, 7, 1000003, ...); a string value swapped for a nonsense one; any key the
schema knows set to anything from a mixed pool, or (the most frequent) to a value of its own
type within its bounds, which passes the schema and reaches the model's own checks.

Every case must end with exit 0 (fine), 2 (bad input), 3 (infeasible, or a plan that breaks a
rule) or 4 (solver failure), with no traceback (no "Traceback (most recent call last)", no
exception but SystemExit). At exit 2 the message is non-empty and names what the case's own
mutations touched (``names_touched``: a key by its section-qualified path, or under its section's
marker, or with its value; a whole section by its name), or the flag value at fault. Under
``--json`` stdout is JSON, and at a non-zero exit an object with ``error`` and ``exit_code``
equal to the exit code.

Seeded: case ``s<N>`` draws everything from ``random.Random(N)``, so a failure names its seed and
its mutations (in the test id and in the message, with the whole mutated TOML) and reproduces
exactly at the same commit (the draws start from the shipped instance files: editing one
reshuffles the cases). ``make_case(N)`` rebuilds any case, inside or outside this list.
"""

from __future__ import annotations

import copy
import json
import math
import random
import re
import tomllib
import traceback
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import pytest
from pydantic.fields import FieldInfo

from planner.app.cli import app
from planner.model.schema import ClusterSpec, ConstraintSpec, ModelSpec, PlanSpec, TrainingSpec
import test_cli
from test_cli import all_text, stdout_of

runner = test_cli.runner            # the CLI fixture of tests/test_cli.py (a CliRunner)

ROOT = Path(__file__).resolve().parents[1]
INSTANCES = sorted((ROOT / "instances").glob("*.toml"))
BASES = {p.stem: tomllib.loads(p.read_text()) for p in INSTANCES}
HF_DIR = ROOT / "tests" / "data" / "hf"

#: cases of plan evaluate (each runs plain and --json): seeds 0-299, 1187, which found the
#: unnamed non-identifier key (global-batch) fixed in instance.key_path, and 386, a NaN value
#: (none of 0-299 draws one since instances/bloom-176b-deepspeed.toml joined the bases), and
#: 694 and 959, one end of Llama 3.1 405B's uneven layout dropped (a message that named no
#: key the case touched, now one that completes the layout; seeds 300-1299 at 812a8df), and
#: 3818, FP8 on an A100 named by the GPU's name, not by cluster.gpu (seeds 1300-5299 at e34310d),
#: and 5480, a one-layer MoE model whose message did not say "layers" (seeds 5300-12299)
EVALUATE_SEEDS = [*range(300), 1187, 386, 694, 959, 3818, 5480]
SOLVE_SEEDS = range(10_000, 10_005)   # cases of plan solve --solver enumerate
SOLVE_BASES = ("gpt-1.3b-1node", "gpt3-175b-a100")   # enumerated in ~0.1-0.2 s
EMIT_FORMATS = ("megatron", "nemo", "torchtitan", "deepspeed")
EXIT_CODES = {0, 2, 3, 4}

#: seed -> why the case fails today (a real bug, reported, not fixed here): xfail(strict), so
#: the fix turns it into an XPASS failure and the entry is removed with it (seeds 215 and 236,
#: an uneven-layout message naming neither pp nor the model's layers, were fixed with it)
KNOWN_BUGS: dict[int, str] = {}

#: the keys the schema knows, per section (a mutation may set any of them)
SCHEMA = {"model": ModelSpec, "training": TrainingSpec, "cluster": ClusterSpec,
          "constraints": ConstraintSpec, "plan": PlanSpec}

WRONG_TYPES: list[Any] = ["8", "abc", "", "1e3", [1, 2], [], ["x"], {"x": 1}, {}, True, False,
                          1.5, 8.0]
NUMBERS: list[Any] = [math.nan, math.inf, -math.inf, 0, 0.0, -0.0, -1, -8, -0.5, 1e30, -1e30,
                      2**63, 2**70, 10**9, 1e-300, 0.999999]
NONSENSE: list[str] = ["turbo", "", " ", "BF16", "Full", "selective ", "fp4", "h100",
                       "a100-80GB", "gpt3-175B", "none;rm", "\u00e9t\u00e9", "fp8\n", "0", "true"]
GOOD_WORDS: list[str] = ["none", "selective", "full", "bf16", "fp16", "fp8", "nvfp4", "optim",
                         "optim_grads", "optim_grads_params", "rope", "learned", "fused", "pytorch",
                         "alltoall", "deepep", "hybridep", "fp32", "tensorwise", "delayed", "mxfp8",
                         "core_attention", "op", "megatron", "nemo", "torchtitan", "deepspeed",
                         "h100-sxm", "a100-80gb", "gb200", "mi300x", "llama3-8b", "mixtral-8x7b"]
POOL: list[Any] = [1, 2, 3, 4, 7, 8, 16, 64, 0.5, 0.9, True, False, [1, 4], [8, 1], [2, 2, 2],
                   *GOOD_WORDS, *WRONG_TYPES, *NUMBERS, *NONSENSE]
#: the plausible values of the free-text keys (a catalog GPU, a preset, a config.json)
NAMES = {"gpu": ["h100-sxm", "a100-40gb", "b200", "gb200", "mi300x", "h200"],
         "preset": ["gpt-1.3b", "llama3-8b", "llama3-405b", "mixtral-8x7b", "deepseek-v3"],
         "name": ["x"], "hf_config": [str(HF_DIR / "mixtral-8x7b.config.json")]}
HF_PATHS = ["missing.config.json", ".", "/", "i.toml", str(HF_DIR / "llama3-8b.config.json"),
            "../hf"]
UNKNOWN_KEYS = ["colour", "tpp", "Tp", "max_tp_size", "global-batch", "layer", "gpu_type", ""]
DEGREES = ["tp", "pp", "dp", "cp", "ep", "vp", "micro_batch", "global_batch", "dp_shard_size",
           "micro_batches", "first_stage_layers", "recompute_layers", "offload_layers"]
NONDIVIDING = [3, 5, 6, 7, 11, 13, 1000003]


# --- a small TOML writer (dicts, lists, str, int, float, bool; nan/inf as TOML nan/inf) --------

def _key(k: str) -> str:
    return k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else json.dumps(k)


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)          # a JSON string is a TOML basic string (ASCII escapes)
    if isinstance(v, list):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_key(k)} = {_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(type(v))


def dumps(doc: dict[str, Any]) -> str:
    lines = [f"{_key(k)} = {_value(v)}" for k, v in doc.items() if not isinstance(v, dict)]
    for name, table in doc.items():
        if isinstance(table, dict):
            lines += ["", f"[{_key(name)}]"]
            lines += [f"{_key(k)} = {_value(v)}" for k, v in table.items()]
    return "\n".join(lines) + "\n"


def _canon(v: Any) -> Any:
    """nan-safe comparison of parsed TOML (nan != nan)."""
    if isinstance(v, float) and math.isnan(v):
        return "<nan>"
    if isinstance(v, list):
        return [_canon(x) for x in v]
    if isinstance(v, dict):
        return {k: _canon(x) for k, x in v.items()}
    return (type(v).__name__, v)


# --- the mutations -----------------------------------------------------------------------------

def _short(v: Any) -> str:
    text = _value(v)
    return text if len(text) <= 24 else text[:21] + "..."


def _leaves(doc: dict[str, Any]) -> list[tuple[str, str]]:
    return [(s, k) for s, t in doc.items() if isinstance(t, dict) for k in t]


def _sections(doc: dict[str, Any]) -> list[str]:
    return [s for s, t in doc.items() if isinstance(t, dict)]


def _section(doc: dict[str, Any], name: str) -> dict[str, Any]:
    if not isinstance(doc.get(name), dict):
        doc[name] = {}
    return doc[name]


#: what a mutation touched: (section, key) for a key of a section, (None, key) for a key at the
#: top level, (section, None) for a whole section, and (section, "*") beside a deleted key: the
#: deletion can make other keys of its section required (del model.preset: the shape keys,
#: "model.layers: required key is missing"), named by their section-qualified paths
Target = tuple[str | None, str | None]


def mutate(rng: random.Random, doc: dict[str, Any]) -> tuple[str, tuple[Target, ...]]:
    """Apply one mutation to ``doc`` in place; return what it did (for the case's label) and
    the keys or sections it touched (for the message check)."""
    kind = rng.choice(["type", "number", "number", "del_key", "del_key", "del_section",
                       "unknown_key", "rename_section", "section_type", "nodivide", "nodivide",
                       "enum", "known_key", "list_item", *["plausible"] * 8])
    leaves, sections = _leaves(doc), _sections(doc)
    if kind in ("type", "number", "del_key", "enum", "list_item") and not leaves:
        kind = "known_key"
    if kind in ("del_section", "rename_section", "section_type") and not sections:
        kind = "known_key"
    if kind == "type":
        s, k = rng.choice(leaves)
        doc[s][k] = v = rng.choice(WRONG_TYPES)
        return f"{s}.{k}={_short(v)}", ((s, k),)
    if kind == "number":
        s, k = rng.choice(leaves)
        doc[s][k] = v = rng.choice(NUMBERS)
        return f"{s}.{k}={_short(v)}", ((s, k),)
    if kind == "del_key":
        s, k = rng.choice(leaves)
        del doc[s][k]
        return f"del {s}.{k}", ((s, k), (s, "*"))
    if kind == "del_section":
        s = rng.choice(sections)
        del doc[s]
        return f"del [{s}]", ((s, None),)
    if kind == "unknown_key":
        k = rng.choice(UNKNOWN_KEYS)
        v = rng.choice(POOL)
        if rng.random() < 0.2:
            doc[k] = v
            return f"root {k!r}={_short(v)}", ((None, k),)
        s = rng.choice(sections or ["plan"])
        _section(doc, s)[k] = v
        return f"{s}.{k!r}={_short(v)}", ((s, k),)
    if kind == "rename_section":
        s = rng.choice(sections)
        new = rng.choice([s + "s", s.upper(), s.capitalize(), "x_" + s, s.rstrip("s") or "s"])
        if new == s:
            new = s + "_"
        doc[new] = doc.pop(s)
        return f"[{s}]->[{new}]", ((s, None), (new, None))
    if kind == "section_type":
        s = rng.choice(sections)
        doc[s] = v = rng.choice(["gpt3", 8, [1, 2], [], True, [{"tp": 2}]])
        return f"[{s}]={_short(v)}", ((s, None),)
    if kind == "nodivide":
        k, v = rng.choice(DEGREES), rng.choice(NONDIVIDING)
        _section(doc, "plan")[k] = v
        return f"plan.{k}={v}", (("plan", k),)
    if kind == "enum":
        strings = [(s, k) for s, k in leaves if isinstance(doc[s][k], str)]
        s, k = rng.choice(strings or leaves)
        doc[s][k] = v = rng.choice(NONSENSE)
        return f"{s}.{k}={_short(v)}", ((s, k),)
    if kind == "list_item":
        s, k = rng.choice(leaves)
        old = doc[s][k]
        items = list(old) if isinstance(old, list) and old else [old, old]
        items[rng.randrange(len(items))] = rng.choice(NUMBERS + WRONG_TYPES)
        doc[s][k] = items
        return f"{s}.{k}={_short(items)}", ((s, k),)
    s = rng.choice(sorted(SCHEMA))
    k = rng.choice(list(SCHEMA[s].model_fields))
    if kind == "plausible":     # the right type and within the key's bounds: reaches the model
        field = SCHEMA[s].model_fields[k]
        v = rng.choice(NAMES[k]) if k in NAMES else plausible(rng, field.annotation, field.metadata)
        why = " (plausible)"
    else:                       # known_key: a key the schema knows, set to anything
        v, why = rng.choice(HF_PATHS if k == "hf_config" else POOL), ""
    _section(doc, s)[k] = v
    return f"{s}.{k}={_short(v)}{why}", ((s, k),)


def plausible(rng: random.Random, tp: Any, meta: list | tuple = ()) -> Any:
    """A value of the annotation's type within its bounds (pydantic Gt / Ge / Lt / Le)."""
    origin = get_origin(tp)
    if origin is Annotated:
        inner, *rest = get_args(tp)
        more = [m for a in rest for m in (a.metadata if isinstance(a, FieldInfo) else [a])]
        return plausible(rng, inner, [*meta, *more])
    if origin in (Union, types.UnionType):
        return plausible(rng, rng.choice([a for a in get_args(tp) if a is not type(None)]), meta)
    if origin is Literal:
        return rng.choice(get_args(tp))
    if origin is tuple:
        return [plausible(rng, a) for a in get_args(tp)]
    if origin is list:
        return [plausible(rng, get_args(tp)[0]) for _ in range(rng.randint(1, 3))]
    if tp is bool:
        return rng.choice([True, False])
    if tp is str:
        return rng.choice(GOOD_WORDS)
    lo, hi = -math.inf, math.inf
    for m in meta:
        lo = max([lo, *(getattr(m, a) for a in ("gt", "ge") if getattr(m, a, None) is not None)])
        hi = min([hi, *(getattr(m, a) for a in ("lt", "le") if getattr(m, a, None) is not None)])
    if tp is int:
        picks = [0, 1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 64, 96, 127, 128, 1024, 10**6, 2**31]
    else:
        picks = [0.0, 1e-3, 0.01, 0.1, 0.5, 0.99, 1.0, 2.0, 100.0, 1e5, 1e9]
    picks = [v for v in picks if lo < v <= hi] + ([hi] if math.isfinite(hi) else [])
    return tp(rng.choice(picks))


@dataclass(frozen=True)
class Case:
    seed: int
    base: str
    mutations: tuple[str, ...]
    touched: tuple[Target, ...]        # the keys and sections the mutations touched
    doc: dict[str, Any]
    extra: tuple[str, ...]             # --emit FMT, or ()
    command: str                       # evaluate | solve

    @property
    def label(self) -> str:
        flags = " ".join(self.extra)
        return (f"s{self.seed}-{self.base}-{self.command}"
                + (f"[{flags}]" if flags else "") + ": " + "; ".join(self.mutations))


def make_case(seed: int, command: str = "evaluate") -> Case:
    rng = random.Random(seed)
    base = rng.choice(sorted(BASES) if command == "evaluate" else SOLVE_BASES)
    doc = copy.deepcopy(BASES[base])
    done = [mutate(rng, doc) for _ in range(rng.choice([1, 1, 1, 2, 2, 3]))]
    mutations = tuple(text for text, _ in done)
    touched = tuple(t for _, targets in done for t in targets)
    extra = ("--emit", rng.choice(EMIT_FORMATS)) if rng.random() < 0.3 else ()
    return Case(seed, base, mutations, touched, doc, extra if command == "evaluate" else (),
                command)


def _param(case: Case):
    marks = ([pytest.mark.xfail(strict=True, reason=KNOWN_BUGS[case.seed])]
             if case.seed in KNOWN_BUGS else [])
    return pytest.param(case, id=case.label, marks=marks)


EVALUATE_CASES = [make_case(seed) for seed in EVALUATE_SEEDS]
SOLVE_CASES = [make_case(seed, "solve") for seed in SOLVE_SEEDS]


# --- the checks --------------------------------------------------------------------------------

def _check(runner, case: Case, args: list[str]) -> None:
    result = runner.invoke(app, args)
    text = all_text(result)
    where = f"{case.label}\n$ plan {' '.join(args)}\n--- instance ---\n{dumps(case.doc)}---"
    exc = result.exception
    if exc is not None and not isinstance(exc, SystemExit):
        tb = "".join(traceback.format_exception(*result.exc_info))
        pytest.fail(f"uncaught {type(exc).__name__}: {exc}\n{where}\n{tb}")
    assert "Traceback (most recent call last)" not in text, f"a traceback\n{where}\n{text}"
    code = result.exit_code
    assert code in EXIT_CODES, f"exit {code}\n{where}\n{text}"
    if code == 2:
        message = text.split("error:", 1)[1].strip() if "error:" in text else ""
        assert message, f"exit 2 without an error message\n{where}\n{text}"
        # specific: it names what the case's own mutations touched (names_touched), or the
        # flag value asked for (an --emit format that cannot express the plan). (Not just a
        # ':': every message starts "FILE: ...".)
        assert names_touched(message, case), \
            f"exit 2 with a message that names nothing the case touched\n{where}\n{text}"
    if "--json" in args:
        try:
            doc = json.loads(stdout_of(result))
        except json.JSONDecodeError:
            pytest.fail(f"--json, exit {code}: stdout is not JSON\n{where}\n{stdout_of(result)!r}")
        if code != 0:
            assert {"error", "exit_code"} <= set(doc), f"--json error document\n{where}\n{doc}"
            assert doc["exit_code"] == code, f"--json exit_code {doc['exit_code']}\n{where}"
            assert doc["error"], f"--json empty error\n{where}"


def _word(name: str, message: str) -> bool:
    """``name`` in ``message`` as a word (an empty key as TOML writes it, "")."""
    name = name or '""'
    return re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", message) is not None


def names_touched(message: str, case: Case) -> bool:
    """Whether an exit-2 message names one of the keys or sections the case's mutations
    touched (:data:`Target`), never just any name the schema knows:

    - a key of a section by its section-qualified path (``training.global_batch``, an empty
      key as ``training.""``); or by the section's marker (``[plan]:``, ``model:``) and the
      key's name (``model: top_k (128) cannot exceed experts``, a rule between keys of one
      section); or with its value (``layers=127``, ``tp = 16``: a rule between sections);
    - a key at the top level by its name; a whole section (deleted, renamed, made a scalar)
      by its name; beside a deleted key, any key of its section by its qualified path;
    - or the --emit format, when it cannot express the plan."""
    for section, key in case.touched:
        if section is None:
            found = _word(key, message)
        elif key is None:
            found = _word(section, message)
        elif key == "*":
            found = re.search(rf"(?<![\w.-]){re.escape(section)}\.[\w-]+", message) is not None
        else:
            marker = re.search(rf"(\[{re.escape(section)}\]|(?<![\w.-]){re.escape(section)}:)",
                               message)
            valued = re.search(rf"(?<![\w.-]){re.escape(key)} ?=", message) if key else None
            found = _word(f"{section}.{key or chr(34) * 2}", message) or \
                bool(key and marker and _word(key, message)) or valued is not None
        if found:
            return True
    return any(_word(fmt, message) for fmt in case.extra[1:])


def _write(tmp_path: Path, case: Case) -> Path:
    text = dumps(case.doc)
    assert _canon(tomllib.loads(text)) == _canon(case.doc), "the test's TOML writer round trip"
    path = tmp_path / "i.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("case", [_param(c) for c in EVALUATE_CASES])
def test_evaluate_a_mutated_instance_fails_cleanly(runner, tmp_path, case):
    path = _write(tmp_path, case)
    for json_flag in ([], ["--json"]):
        _check(runner, case, ["evaluate", str(path), *case.extra, *json_flag])


@pytest.mark.parametrize("case", [_param(c) for c in SOLVE_CASES])
def test_solve_a_mutated_instance_fails_cleanly(runner, tmp_path, case):
    path = _write(tmp_path, case)
    _check(runner, case, ["solve", str(path), "--solver", "enumerate", "--json"])


def test_the_cases_are_seeded():
    """The same seed draws the same case (the ids and the instances do not move between runs),
    and the mutations reach the kinds of mistake the docstring lists."""
    assert [make_case(s).label for s in range(20)] == [c.label for c in EVALUATE_CASES[:20]]
    assert dumps(make_case(7).doc) == dumps(EVALUATE_CASES[7].doc)
    text = " ".join(c.label for c in EVALUATE_CASES)
    for mark in ("del [", "->[", "=nan", "=inf", "plan.tp=", "--emit"):
        assert mark in text, mark

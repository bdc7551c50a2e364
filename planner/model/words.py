"""Values and counts in the user's words: TOML values (not Python reprs), plurals, numbers as
the user wrote them, counts, and large numbers in engineering notation: the formatters the
messages share. (Units are written where they are said, GiB to one decimal, seconds by their
size, and so are the words "on" / "off".)

>>> toml_value(None), toml_value(True), toml_value((1,)), toml_value("full")
('unset', 'true', '[1]', '"full"')
>>> plural(1, "node"), plural(16, "node")
('1 node', '16 nodes')
>>> number(3.76e19), number(1234.5)
('37.6e18', '1,234.5')
"""

from __future__ import annotations

import math


def toml_value(v: object) -> str:
    """A value as it is written in an instance file: ``true``, ``"full"``, ``[1, 2]``; a key
    left unset (None, which TOML cannot write) reads ``unset``."""
    if v is None:
        return "unset"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, list | tuple):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):          # an inline table, as TOML writes it
        return "{ " + ", ".join(f"{k} = {toml_value(x)}" for k, x in v.items()) + " }" if v \
            else "{}"
    if isinstance(v, float) and v.is_integer() and abs(v) < 1e15:
        return f"{v:.1f}"
    return str(v)


def pinned(constraints: object, keys: tuple[str, ...]) -> list[str]:
    """``constraints.key = value``, in the file's words, for each of ``keys`` the
    ``[constraints]`` section sets: the pins an infeasibility explanation names."""
    return [f"constraints.{k} = {toml_value(getattr(constraints, k))}" for k in keys
            if getattr(constraints, k) is not None]


def plural(n: int | float, word: str, words: str | None = None) -> str:
    """``1 node``, ``2 nodes`` (``words`` for an irregular plural)."""
    shown = f"{n:,}" if isinstance(n, int) else f"{n:g}"
    return f"{shown} {word if n == 1 else (words or word + 's')}"


def article(word: str) -> str:
    """``a plan``, ``an instance``."""
    return ("an " if word[:1].lower() in "aeiou" else "a ") + word


def as_written(x) -> str:
    """A number as the user wrote it: 32, not 32.0 (a fraction to 4 digits)."""
    x = float(x)
    return f"{int(x)}" if x.is_integer() else f"{x:.4g}"


def ordinal(n: int) -> str:
    """1st, 2nd, 3rd, 4th, ..., 11th-13th, 21st."""
    tail = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{tail}"


def count(x: float) -> str:
    """An integer as is, with thousands separators; a fraction (a plan that breaks a
    divisibility rule) to 4 digits."""
    return f"{x:,}" if isinstance(x, int) else f"{x:.4g}"


def number(x: float, digits: int = 3) -> str:
    """A number a reader can take in: thousands separators up to a million, engineering
    notation (exponent a multiple of 3, ``digits`` significant digits) beyond, and for
    non-finite values ``inf`` / ``nan``."""
    if not math.isfinite(x):
        return str(x)
    if abs(x) < 1e6:
        return f"{x:,.{max(0, digits - 2)}f}".rstrip("0").rstrip(".") if x != int(x) \
            else f"{int(x):,}"
    exp = int(math.floor(math.log10(abs(x)) / 3) * 3)
    mant = x / 10 ** exp
    if round(abs(mant), digits - len(str(int(abs(mant))))) >= 1000:   # 999.96e18 -> 1.00e21
        exp += 3
        mant /= 1000
    decimals = max(0, digits - len(str(int(abs(mant)))))
    return f"{mant:.{decimals}f}e{exp}"


def stage_words(name: str) -> str:
    """A pipeline stage key of the memory breakdown (``first``, ``last_moe``) as words: the
    stage and, for an MoE model, which layer kind its layers were counted as; ``first_step``:
    the optimizer step's peak on the first stage."""
    if name.endswith("_step"):          # the optimizer step's peak on that stage
        return f"optimizer step on the {stage_words(name[:-len('_step')])}"
    stage, _, kind = name.partition("_")
    out = f"{stage} pipeline stage"
    if kind:
        out += f" (its layers counted as {'MoE' if kind == 'moe' else kind} layers)"
    return out

"""Megatron-Core's pipeline layout strings (``--pipeline-model-parallel-layout``).

A layout string lists the virtual pipeline stages in the order the layers run, ``|`` between
stages: ``E`` the embedding, ``t`` a decoder ("transformer") layer, ``m`` a multi-token
prediction depth, ``L`` the loss (with the output layer); ``x*n`` repeats a character,
``(...)*n`` a group, commas are cosmetic. NVIDIA's DeepSeek-V3 recipes on GB200 / GB300 run
``Et*4|(t*4|)*14tmL``: 16 stages of 4 decoder layers, the first with the embedding, the last
with one layer, the prediction depth and the loss. Stage ``i`` runs on pipeline rank
``i % pp`` as its chunk ``i // pp`` (Megatron-Core PipelineParallelLayerLayout: the string is
the flattened ``layout[vpp_rank][pp_rank]``), so ``len(stages) / pp`` is the virtual pipeline
degree.

The grammar and Megatron-Core's own checks follow megatron/core/transformer/
pipeline_parallel_layer_layout.py (``parse_str_to_list``, ``validate_layer_layout``; since
Megatron-LM 77732c3628, June 2025). The model costs the layouts of one family
(:func:`check_layout`): every stage holds the same number of decoder layers but the first
(with the embedding) and the last (with the loss), which may hold fewer (never more). That is the family of
Megatron-LM's ``account_for_embedding`` / ``account_for_loss`` split, where the short stage is
one layer short, with any shortfall (docs/model.md, "Pipeline layout")."""

from __future__ import annotations

import re
from functools import lru_cache

from planner.model.words import toml_value

#: the largest repeat count read (a model has far fewer layers; a larger one is refused
#: before it is unrolled)
MAX_REPEAT = 100_000
#: the longest unrolled string read (a million stages or layers)
MAX_UNROLLED = 1_000_000

#: the layer characters of Megatron-Core's layout strings
LAYER_CHARS = {"E": "embedding", "L": "loss", "t": "decoder", "m": "mtp"}


def uneven_split(layers: int, pp: int, vp: int = 1, first: int | None = None,
                 last: int | None = None) -> tuple[int, int, int] | None:
    """A Megatron-LM layout of ``layers`` over ``pp`` stages of ``vp`` chunks, for where the
    even split (or a given first / last count) fails: ``(first, middle, last)`` decoder layers
    per rank, as ``--decoder-first/last-pipeline-num-layers`` take them (each count a positive
    multiple of ``vp``, the ``pp - 2`` middle ranks alike; the middle 0 at pp 2), with the
    ``first`` / ``last`` given kept. Of all such layouts, one whose fullest rank, which sets
    the pipeline's pace, holds the fewest layers; among those the heaviest middles (the ends
    the lighter, the first no heavier than the last). None where no layout exists (a layer
    count ``vp`` does not divide, one stage, given counts no middle completes). 80 layers over
    pp 6: (12, 14, 12); 126 over pp 16 with the first 7: (7, 8, 7)."""
    if pp < 2 or layers % vp:
        return None

    def ends_of(total: int) -> tuple[int, int]:
        if first is not None:
            return first, (total - first if last is None else last)
        if last is not None:
            return total - last, last
        half = vp * (total // (2 * vp))
        return half, total - half

    middles = range(layers // (pp - 2) // vp * vp, 0, -vp) if pp > 2 else (0,)
    best = None
    for m in middles:
        f, ll = ends_of(layers - (pp - 2) * m)
        if f + ll + (pp - 2) * m == layers and min(f, ll) >= vp and not (f % vp or ll % vp):
            if best is None or max(f, m, ll) < max(best):
                best = (f, m, ll)
    return best


@lru_cache(maxsize=256)
def layout_stages(text: str) -> tuple[str, ...]:
    """The virtual stages of a layout string, each as its layer characters, unrolled as
    Megatron-Core's ``parse_str_to_list`` unrolls them (``(...)*n`` first, then ``x*n``; commas
    dropped). Raises ValueError naming the first character that is not a layer."""
    s = text.replace(",", "")
    for pattern in (r"\(([^)]+)\)\*(\d+)", r"(.)\*(\d+)"):
        grown = len(s)
        for x in re.finditer(pattern, s):
            if int(x.group(2)) > MAX_REPEAT:
                raise ValueError(f"{x.group(0)!r} repeats more than {MAX_REPEAT} times")
            grown += len(x.group(1)) * int(x.group(2)) - len(x.group(0))
        if grown > MAX_UNROLLED:
            # (a group of repeats repeated: each count small, their product not)
            raise ValueError(f"it unrolls to more than {MAX_UNROLLED} characters")
        s = re.sub(pattern, lambda x: x.group(1) * int(x.group(2)), s)
    stages = tuple(s.split("|"))
    for st in stages:
        for ch in st:
            if ch not in LAYER_CHARS:
                raise ValueError(f"{ch!r} is not a layer character (E embedding, t decoder layer, "
                                 "m prediction depth, L loss; | between stages, x*n and (...)*n "
                                 "repeat, commas are cosmetic)")
    return stages


def stage_decoders(text: str) -> list[int]:
    """Decoder layers of each virtual stage, in the string's order."""
    return [st.count("t") for st in layout_stages(text)]


def rank_decoders(text: str, pp: int) -> list[int]:
    """Decoder layers of each pipeline rank (stage ``i`` runs on rank ``i % pp``)."""
    per = stage_decoders(text)
    return [sum(per[r::pp]) for r in range(pp)]


def shortfalls(text: str) -> tuple[int, int]:
    """``(first_short, last_short)``: how many decoder layers the first and the last stage
    hold fewer than the others (a layout :func:`check_layout` accepts)."""
    per = stage_decoders(text)
    full = _full(per)
    return full - per[0], full - per[-1]


def _full(per: list[int]) -> int:
    """The decoder layers of a stage that is neither the first nor the last (the larger end
    when there is no such stage)."""
    inner = per[1:-1]
    return inner[0] if inner else max(per)


def layout_text(layers: int, mtp_layers: int, pp: int, vp: int, first_short: int,
                last_short: int) -> str:
    """The layout string of the model's family: ``pp * vp`` stages of
    ``c = (layers + first_short + last_short) / (pp vp)`` decoder layers, the first
    ``first_short`` and the last ``last_short`` fewer, the embedding in the first and the
    prediction depths and the loss in the last (``Et*4|(t*4|)*14tmL`` for 61 layers and one
    depth at 16 stages, shortfalls 0 and 3: NVIDIA's DeepSeek-V3 layout)."""
    n = pp * vp
    c = (layers + first_short + last_short) // n
    middle = f"({_ts(c)}|)*{n - 2}" if n > 2 else ""
    return f"E{_ts(c - first_short)}|{middle}{_ts(c - last_short)}{'m' * mtp_layers}L"


def _ts(n: int) -> str:
    """``n`` decoder layers as the recipes write them: ``t*4``, ``t``, nothing."""
    return f"t*{n}" if n > 1 else "t" * n


def check_layout(text: str, pp: int, layers: int, mtp_layers: int) -> list[str]:
    """The rules a ``[plan] pipeline_layout`` breaks, as sentences naming the numbers: the
    grammar, Megatron-Core's checks (the stage count a multiple of ``pp``; the embedding first
    and the loss last, once each; the model's decoder layers and prediction depths, the depths
    after every decoder layer) and the model's family (the depths in the last stage; every
    stage but the first and the last with the same decoder layers)."""
    try:
        stages = layout_stages(text)
    except ValueError as exc:
        return [f"plan.pipeline_layout = {toml_value(text)}: {exc}"]
    said = f"plan.pipeline_layout = {toml_value(text)}"
    out: list[str] = []
    if len(stages) % pp:
        out.append(f"{said}: {len(stages)} stages, not a multiple of pp={pp} (Megatron-LM: "
                   "each pipeline rank runs the same number of virtual stages)")
    flat = "".join(stages)
    if not flat.startswith("E") or flat.count("E") != 1:
        out.append(f"{said}: the embedding (E) comes once, first (Megatron-Core)")
    if not flat.endswith("L") or flat.count("L") != 1:
        out.append(f"{said}: the loss (L) comes once, last (Megatron-Core)")
    if flat.count("t") != layers:
        out.append(f"{said}: {flat.count('t')} decoder layers (t), but the model has "
                   f"layers={layers}")
    if flat.count("m") != mtp_layers:
        out.append(f"{said}: {flat.count('m')} prediction depths (m), but the model has "
                   f"mtp_layers={mtp_layers}")
    elif mtp_layers and (flat.rfind("t") > flat.find("m")
                         or stages[-1].count("m") != mtp_layers):
        out.append(f"{said}: the prediction depths (m) must follow every decoder layer in the "
                   "last stage, beside the loss (Megatron-Core's standalone depths on another "
                   "stage are not costed)")
    if out:
        return out
    per = stage_decoders(text)
    full = _full(per)
    if any(n != full for n in per[1:-1]):
        out.append(f"{said}: its stages hold {', '.join(map(str, sorted(set(per[1:-1]))))} "
                   "decoder layers; the model costs layouts whose stages hold the same number "
                   "but the first and the last (docs/model.md, \"Pipeline layout\")")
    elif max(per[0], per[-1]) > full:
        out.append(f"{said}: its first and last stages hold {per[0]} and {per[-1]} decoder "
                   f"layers, the others {full}; the model costs end stages that hold no more "
                   "than the others (docs/model.md, \"Pipeline layout\")")
    if pp == 1 and len(stages) > 1:
        out.append(f"{said}: {len(stages)} stages at pp=1 would interleave one pipeline rank "
                   "(vp > 1 needs pp > 1); give pp, or one stage")
    return out

"""Read an instance file into a resolved :class:`Instance`: schema-checked, preset merged, catalog
figures looked up and overridden, everything the evaluator needs in SI units.

Errors name the key path and what was expected (``model.heads: must be divisible ...``) and are
raised as :class:`~planner.model.errors.InputError`; the CLI prints them without a traceback.
"""

from __future__ import annotations

import re

import tomllib
from dataclasses import dataclass, replace
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from planner.model.catalog import GPU, GiB, known_gpus, load_gpu
from planner.model.errors import InputError
from planner.model.frameworks import kernel_stack
from planner.model.schema import InstanceSpec, ModelSpec, default_reserve_GiB, replaced_attention_keys
from planner.model.words import article, toml_value


@cache
def presets() -> dict[str, dict[str, Any]]:
    """Model presets shipped in ``planner/data/presets.toml``."""
    return tomllib.loads(resources.files("planner").joinpath("data/presets.toml").read_text())


#: One per-tensor-scaled FP8 copy of a tensor: a byte per element (its one scale not counted)
FP8_COPY_BYTES = 1.0
#: One MXFP8 copy (Transformer Engine MXFP8BlockScaling): a byte per element and one E8M0
#: scale byte per 32
MXFP8_COPY_BYTES = 1 + 1 / 32
#: One NVFP4 copy (Transformer Engine NVFP4BlockScaling): E2M1 values of half a byte, each 16
#: with one E4M3 scale byte (weights share a scale over a 16 x 16 block, written per 16-value
#: row for the GEMMs), plus one fp32 scale per tensor (not counted)
NVFP4_COPY_BYTES = 0.5 + 1 / 16


def narrow_bytes(training) -> float:
    """Bytes per element of one copy of a tensor Transformer Engine quantizes for a linear
    GEMM, with its scales: 1 for per-tensor FP8, 1 + 1/32 for MXFP8, 0.5 + 1/16 for NVFP4.
    The one owner of these widths: a weight's cache (:func:`resolve`, a copy per GEMM
    direction it keeps), the input a linear layer holds for its weight gradient and the
    sequence-parallel all-gathers (:func:`planner.model.terms.step_terms`)."""
    if training.precision == "nvfp4":
        return NVFP4_COPY_BYTES
    return MXFP8_COPY_BYTES if training.fp8_recipe == "mxfp8" else FP8_COPY_BYTES


def both_directions(training, gpu: GPU) -> bool:
    """Whether Transformer Engine keeps a narrow weight twice, once per GEMM direction:
    block-scaled formats always (MXFP8, NVFP4: "the quantized tensor and its transpose are not
    numerically equivalent ... both versions are computed from the high precision input",
    MXFP8BlockScaling; rowwise and columnwise NVFP4 copies), per-tensor FP8 only where FP8
    GEMMs are TN only (GPU.fp8_weight_transpose: Hopper's transposed copy)."""
    return (training.precision == "nvfp4" or training.fp8_recipe == "mxfp8"
            or gpu.fp8_weight_transpose)


@dataclass(frozen=True)
class Hardware:
    """Catalog figures after instance overrides, in SI units (FLOP/s, bytes, B/s, s)."""

    gpu: GPU
    peak: float          # dense FLOP/s in the training precision's 16-bit format (bf16/fp16)
    peak_fp8: float      # dense FP8 FLOP/s, 0 when the GPU has none
    efficiency: float
    efficiency_fp8: float
    knee_tokens: float   # GEMM size curve knees (0 = flat efficiency), see GPU.gemm_knee_*
    knee_width: float
    hbm_bytes: float
    hbm_bw: float
    gpus_per_host: int      # the scheduling node (`nodes` counts hosts)
    nvlink_domain: int      # GPUs the intra-node links join
    bw_intra: float
    bw_inter: float
    lat_intra: float
    lat_inter: float
    #: share of the 16-bit peak the fused (flash) attention core reaches, on the model's
    #: ``4 b s^2 h`` FLOPs; None: the GEMM ``efficiency`` (see GPU.attention_efficiency)
    attention_efficiency: float | None = None
    #: how much slower compute runs beside a collective (GPU.overlap_slowdown; docs/model.md,
    #: "Overlap")
    overlap_slowdown: float = 0.0
    #: bytes per GEMM parameter of Transformer Engine's narrow weight cache: one copy of
    #: narrow_bytes per GEMM direction kept (both_directions)
    fp8_weight_cache_bytes: float = 2.0
    #: dense FP4 (NVFP4) FLOP/s, 0 when the catalog has none
    peak_fp4: float = 0.0
    #: host offload (docs/model.md, "Host offload"): the GPU <-> host link per GPU and
    #: direction (B/s), host memory per host (bytes) and its bandwidth per host (B/s); 0: the
    #: catalog has no figure (offload is then refused)
    host_bw: float = 0.0
    host_mem_bytes: float = 0.0
    host_mem_bw: float = 0.0


@dataclass(frozen=True)
class Instance:
    """A resolved instance; ``gpus`` is fixed for solve/evaluate, ``node_options`` for queries."""

    spec: InstanceSpec
    hw: Hardware
    node_options: tuple[int, ...]   # node counts the instance allows (one for a fixed size)
    gpus: int                        # GPU count of the current size
    source: str = "<memory>"

    @property
    def model(self) -> ModelSpec:
        return self.spec.model

    @property
    def kernel_stack(self) -> str:
        """The kernel stack whose figures ``hw`` holds (:func:`~planner.model.frameworks.kernel_stack`)."""
        return stack_of_spec(self.spec)

    @property
    def nodes(self) -> int:
        """Hosts (scheduling nodes) the job runs on."""
        g = self.hw.gpus_per_host
        return max(1, -(-self.gpus // g))

    @property
    def node_size(self) -> int:
        """GPUs that share the fast intra-node links: the job's NVLink segment, which every
        "node" of the model's placement is (:func:`nvlink_segment`)."""
        return nvlink_segment(self.gpus, self.hw.gpus_per_host, self.hw.nvlink_domain)

    @property
    def segments(self) -> int:
        """NVLink segments of the job (the model's nodes): ``gpus / node_size``."""
        return self.gpus // self.node_size

    def with_nodes(self, nodes: int) -> Instance:
        """The same instance on ``nodes`` whole hosts (``--nodes N``: the user's size)."""
        return replace(self, gpus=nodes * self.hw.gpus_per_host, node_options=(nodes,))

    def at_size(self, nodes: int) -> Instance:
        """The instance at ``nodes``, one of its own sizes (``node_options``), as a query
        (pareto, capacity) walks them: a one-size instance keeps its own GPU count, which is
        not always whole hosts (``cluster.gpus = 4`` on 8-GPU hosts is one partial node of 4
        GPUs, where :meth:`with_nodes` would fill the host to 8)."""
        if self.node_options == (nodes,):
            return self
        return self.with_nodes(nodes)

    @property
    def partial_host(self) -> bool:
        """Whether the instance is fewer GPUs than one host (``cluster.gpus`` below the
        host's count): its one size is not a whole node."""
        return self.gpus < self.hw.gpus_per_host

    def with_spec(self, **sections: Any) -> Instance:
        """A copy with whole sections of the spec replaced (constraints, plan, training...).
        When the kernel stack changes with them (a framework set after loading, as ``plan
        solve --emit`` does), the kernel figures in ``hw`` follow it; a new ``cluster`` is
        resolved anew (its GPU, overrides and size), as a file holding it would be."""
        spec = self.spec.model_copy(update=sections)
        if "cluster" in sections and spec.cluster != self.spec.cluster:
            return resolve(spec, self.source)
        if stack_of_spec(spec) == stack_of_spec(self.spec):
            return replace(self, spec=spec)
        return replace(self, spec=spec, hw=replace(self.hw, **stack_figures(self.hw.gpu, spec)))


def stack_of_spec(spec: InstanceSpec) -> str:
    """An instance's kernel stack: ``[training] kernel_stack`` or its framework's default."""
    tr = spec.training
    return kernel_stack(tr.kernel_stack, tr.precision, tr.fp8_recipe, spec.constraints.framework)


def stack_figures(gpu: GPU, spec: InstanceSpec) -> dict[str, Any]:
    """The :class:`Hardware` figures the kernel stack sets: the stack's where the catalog has
    them (``[kernel_stacks.NAME]``), else the main (fused-kernel) ones; ``[cluster]``
    overrides apply on top of either."""
    c = spec.cluster
    stack = gpu.kernel_stacks.get(stack_of_spec(spec))
    knee_tokens = stack.gemm_knee_tokens if stack else gpu.gemm_knee_tokens
    knee_width = stack.gemm_knee_width if stack else gpu.gemm_knee_width
    attn_eff = stack.attention_efficiency if stack else gpu.attention_efficiency
    return {
        "efficiency_fp8": (c.efficiency_fp8 or (stack.efficiency_fp8 if stack else None)
                           or gpu.efficiency_fp8 or gpu.efficiency),
        "attention_efficiency": c.attention_efficiency or attn_eff,
        "knee_tokens": knee_tokens if c.gemm_knee_tokens is None else c.gemm_knee_tokens,
        "knee_width": knee_width if c.gemm_knee_width is None else c.gemm_knee_width,
    }


def nvlink_segment(gpus: int, host: int, domain: int) -> int:
    """The GPUs of a job that one NVLink segment joins: the largest divisor of the GPU count no
    larger than the NVLink domain that is a whole number of hosts (or a part of one host), so
    the segments tile the job. A DGX job (host = domain = 8) has segments of 8; a 128-GPU job
    on GB200 NVL72 (hosts of 4, domain 72) runs as two segments of 64 GPUs, as NVIDIA's
    benchmark recipes place it (Slurm ``--segment 16`` trays); fewer GPUs than a host share
    one segment.

    >>> nvlink_segment(128, 4, 72), nvlink_segment(144, 4, 72), nvlink_segment(64, 8, 8)
    (64, 72, 8)
    """
    if gpus <= min(host, domain):
        return gpus
    fits = [d for d in range(min(gpus, domain), 0, -1)
            if gpus % d == 0 and (d % host == 0 or host % d == 0)]
    return fits[0]


#: a TOML bare key, written without quotes
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
#: pydantic's own union-member tags in an error's location (``int``, ``constrained-int``,
#: ``tuple[...]``, ``list[literal[...]]``, ``function-after[...]``), which are no user's key
_UNION_TAG = re.compile(r"(int|float|str|bool|none|constrained-[a-z]+|[a-z-]+\[.*\])")


def key_path(loc: tuple, key_last: bool = False) -> str:
    """The key path of a pydantic error, without pydantic's own union-member tags, in TOML's
    words: keys joined by dots, an array's element by its index in brackets
    (``cluster.node_counts[2]``: ``node_counts.2`` would be a dotted key, a table
    ``node_counts`` with a key "2"). ``key_last``: the last element is the user's key whatever
    it looks like (an unknown key, ``global-batch`` or a quoted ``"global batch"``), so it is
    kept as written."""
    body, last = (loc[:-1], loc[-1:]) if key_last and loc else (loc, ())
    keep = [p for p in body
            if isinstance(p, int) or (isinstance(p, str) and not _UNION_TAG.fullmatch(p))]
    keep += [p if isinstance(p, int) or _BARE_KEY.fullmatch(p) else toml_value(p)
             for p in last]
    out = ""
    for p in keep:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else p)
    return out or "<file>"


def _parent_key(key: str) -> str:
    """The key path holding ``key``: the array of an element (``a.b[2]`` -> ``a.b``), the
    table of a key (``a.b`` -> ``a``)."""
    m = re.fullmatch(r"(.*)\[\d+\]", key)
    return m.group(1) if m else key.rsplit(".", 1)[0]


def _is_element(key: str) -> bool:
    """Whether ``key`` names an array's element (``a.b[2]``)."""
    return re.fullmatch(r".*\[\d+\]", key) is not None


def _section_model(loc: tuple):
    """The pydantic model of the TOML table that holds the key at ``loc`` (None if unknown)."""
    from typing import get_args

    from pydantic import BaseModel

    def as_model(tp):
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            return tp
        return next((m for a in get_args(tp) if (m := as_model(a)) is not None), None)

    cls = InstanceSpec
    for part in loc[:-1]:
        field = cls.model_fields.get(part) if isinstance(part, str) else None
        cls = as_model(field.annotation) if field is not None else None
        if cls is None:
            return None
    return cls


def unknown_key_words(loc: tuple) -> str:
    from difflib import get_close_matches

    cls = _section_model(loc)
    here = list(cls.model_fields) if cls else []
    # the key itself; then the same key spelt with '_' for '-' or ' ' (global-batch), in this
    # section or, named with its section, in another (fp8_param_gather under [constraints]);
    # then the closest key of this section
    spelled = str(loc[-1]).replace("-", "_").replace(" ", "_")
    elsewhere = [f"{name}.{spelled}" for name in InstanceSpec.model_fields
                 if (m := _section_model((name, ""))) not in (None, cls, InstanceSpec)
                 and spelled in m.model_fields]
    near = ([spelled] if spelled in here else elsewhere[:1]
            or get_close_matches(spelled, here, n=1))
    hint = f"did you mean {near[0]}? See" if near else "check the spelling; see"
    return f"unknown key ({hint} the README's instance reference)"


def _pair_member(loc: tuple) -> bool:
    """Whether a pydantic error is about one member of a ``[lo, hi]`` pair (a ``tuple[...]``
    union member, then the member's index)."""
    return (len(loc) > 1 and isinstance(loc[-1], int) and isinstance(loc[-2], str)
            and loc[-2].startswith("tuple["))


def _problems(exc: ValidationError, prefix: str = "") -> list[str]:
    """One line per key path, unknown keys first (a misspelt key also makes its section's
    required keys "missing"); for a union (a number or a [lo, hi] pair) the first member's
    message stands for the key, and an element's message for a list."""
    out: dict[str, str] = {}
    errors = sorted(exc.errors(), key=lambda e: e["type"] != "extra_forbidden")
    # a union of a number and a [lo, hi] pair, written as a pair: the pair's own errors stand
    # for the key ("cluster.nodes = [0, 4]" is no bad integer, its first value is too small)
    pairs = {key_path(e["loc"][:-1]) for e in errors if _pair_member(e["loc"])}
    written = {}
    for err in errors:
        key = f"{prefix}{key_path(err['loc'], err['type'] == 'extra_forbidden')}"
        if isinstance(err.get("input"), (list, tuple)):
            written.setdefault(key, err["input"])
        if key.removeprefix(prefix) in pairs and isinstance(err.get("input"), (list, tuple)):
            continue                # (the number member's complaint about a pair)
        if _pair_member(err["loc"]):
            parent = _parent_key(key)
            which = ("lo", "hi")[err["loc"][-1]] if err["loc"][-1] < 2 else err["loc"][-1]
            whole = written.get(parent)
            line = (f"{which} = {toml_value(err.get('input'))}: "
                    f"{err['msg'].removeprefix('Value error, ')}")
            got = f" (got {toml_value(list(whole))})" if whole is not None else ""
            out[parent] = (f"{out[parent].removesuffix(got)}; {line}{got}" if parent in out
                           else f"in [lo, hi], {line}{got}")
            continue
        parent = _parent_key(key)
        if key in out or any(k.startswith((key + ".", key + "[")) for k in out):
            continue
        if parent in out and _is_element(key):
            if err["type"] not in ("literal_error", "enum"):
                continue            # (a pair's missing member: the whole value's line stands)
            del out[parent]         # a list's bad element says more than the list as a whole
        msg = err["msg"].removeprefix("Value error, ")
        if key.endswith("<file>") and re.match(r"[a-z_]+\.[a-z_0-9]+ ", msg):
            # a rule across sections names its key first: that key stands for the line
            key, msg = prefix + msg.split(" ", 1)[0], msg.split(" ", 1)[1]
        if err["type"] == "extra_forbidden":
            msg = unknown_key_words(tuple(p for p in err["loc"] if isinstance(p, (str, int))))
        elif err["type"] == "missing":
            msg = "required key is missing"
        elif err["type"] in ("model_type", "dict_type", "model_attributes_type"):
            # pydantic's wording names the class ("instance of ModelSpec"); the user wrote TOML
            msg = f"expected a table of keys (a [section]), got {toml_value(err.get('input'))}"
        elif "input" in err and err["type"] != "value_error":
            msg = f"{msg} (got {toml_value(err['input'])})"
        out[key] = msg
    return [f"{k}: {m}" for k, m in out.items()]


def parse_instance(data: dict[str, Any], source: str = "<memory>",
                   base_dir: Path | None = None) -> Instance:
    """Validate a parsed TOML document and resolve it (presets, catalog, overrides)."""
    data = {k: (dict(v) if isinstance(v, dict) else v) for k, v in data.items()}
    model = data.get("model")
    if isinstance(model, dict) and isinstance(model.get("hf_config"), str):
        from planner.model.hf_config import read_hf_config_with_context

        if not model["hf_config"].strip():
            raise InputError(f"{source}: invalid instance",
                             ["model.hf_config: an empty path; expected a config.json file"])
        if "preset" in model:       # two sources for every shape key: say which, never guess
            raise InputError(f"{source}: invalid instance", [
                "model.preset and model.hf_config: both give the model's shape; keep one (the "
                "keys you set explicitly in [model] override either)"])
        ref = Path(model["hf_config"])
        if not ref.is_absolute() and base_dir is not None:
            ref = base_dir / ref
        try:
            keys, context = read_hf_config_with_context(ref)
            max_context = context.max_context
        except InputError as exc:   # name the key that pointed there, and where it was looked for
            raise InputError(f"{source}: invalid instance",
                             [f"model.hf_config = {toml_value(model['hf_config'])}: {exc.args[0]}"]
                             + exc.problems) from None
        if "seq_len" not in model:
            known = (f" (its max_position_embeddings = {max_context:,} is the longest context "
                     "the model supports, not the length it trains at)" if max_context else "")
            raise InputError(f"{source}: invalid instance", [
                f"model.seq_len: required with model.hf_config: {ref.name} gives no training "
                f"sequence length{known}; set seq_len to the tokens per sequence you train "
                "with"])
        if (max_context and isinstance(model["seq_len"], int)
                and model["seq_len"] > max_context):
            import warnings

            warnings.warn(f"{source}: model.seq_len = {model['seq_len']:,} exceeds the "
                          f"max_position_embeddings = {max_context:,} of {ref.name}",
                          UserWarning, stacklevel=2)
        if (context.chunk and isinstance(model["seq_len"], int)
                and model["seq_len"] > context.chunk):
            # (said in the plan's caveats and exports, as the shape's approximation)
            keys["approximates"] = "; ".join(filter(None, [
                keys.get("approximates"),
                f"the layers that attend within chunks of {context.chunk:,} tokens "
                f"(attention_chunk_size; {context.chunked_layers} of the config's "
                f"{keys.get('layers')}) costed as full causal "
                f"attention over seq_len = {model['seq_len']:,}, an overestimate of their "
                "attention core (Megatron-Core builds no chunked attention)"]))
        from_config = set(keys) - set(model)
        keys = {k: v for k, v in keys.items() if k not in replaced_attention_keys(model)}
        data["model"] = model = {**keys, **model}
        stem = ref.stem.replace(".config", "")
        model.setdefault("name", context.label if stem == "config" else stem)
    else:
        from_config = set()
    if isinstance(model, dict) and "preset" in model:
        name = model["preset"]
        if not isinstance(name, str):
            raise InputError(f"{source}: invalid instance",
                             [f"model.preset: expected a preset name (a string), got {toml_value(name)}"])
        if name not in presets():
            raise InputError(f"{source}: invalid instance",
                             [f"model.preset: unknown preset {toml_value(name)}; expected one of: "
                              + ", ".join(sorted(presets()))])
        base = {k: v for k, v in presets()[name].items()
                if k not in replaced_attention_keys(model)}
        data["model"] = {**base, **model}
        data["model"].setdefault("name", name)
    for section in ("training", "cluster"):
        sec = data.get(section)
        if isinstance(sec, dict):   # TOML arrays arrive as lists; the schema wants [lo, hi] tuples
            for key in ("global_batch", "nodes"):
                if isinstance(sec.get(key), list):
                    sec[key] = tuple(sec[key])
    try:
        spec = InstanceSpec.model_validate(data)
    except ValidationError as exc:
        problems = _problems(exc)
        # a shape key the config gave, not the instance: say where it came from (the config's
        # own key names are in planner/model/hf_config.py)
        named = sorted(k for k in from_config if any(
            p.startswith(("model", "<model>")) and re.search(rf"\b{k}\b", p) for p in problems))
        if named:
            path = toml_value(model["hf_config"])
            problems.append(f"model.hf_config = {path} gave {', '.join(named)} (read from the "
                            "config.json); a value set in [model] overrides it")
        raise InputError(f"{source}: invalid instance", problems) from None
    return resolve(spec, source)


def resolve(spec: InstanceSpec, source: str = "<memory>") -> Instance:
    """Look up the GPU, apply overrides and fix the cluster size(s)."""
    c = spec.cluster
    gpu = load_gpu(c.gpu)
    precision = spec.training.precision
    if precision == "fp8" and gpu.peak_tflops_fp8 <= 0:
        raise InputError(f"{source}: invalid instance",
                         [f"training.precision: \"fp8\" needs FP8 tensor cores, which "
                          f"cluster.gpu = {toml_value(c.gpu)} has not; use bf16 or "
                          "fp16"])
    if precision == "nvfp4" and gpu.peak_tflops_fp4 <= 0:
        raise InputError(f"{source}: invalid instance", [
            f"training.precision: \"nvfp4\" needs FP4 tensor cores with a peak in the catalog "
            f"({', '.join(g for g in known_gpus() if load_gpu(g).peak_tflops_fp4 > 0)}); "
            f"cluster.gpu = {toml_value(c.gpu)} has none (hardware_catalog/{gpu.key}.toml "
            "peak_tflops_fp4); use fp8, bf16 or fp16"])
    if spec.training.fp8_recipe == "mxfp8" and not gpu.mxfp8:
        raise InputError(f"{source}: invalid instance", [
            f"training.fp8_recipe: \"mxfp8\" needs block-scaled FP8 tensor cores "
            f"({', '.join(g for g in known_gpus() if load_gpu(g).mxfp8)}); cluster.gpu = "
            f"{toml_value(c.gpu)} has none (Transformer Engine refuses MXFP8 below compute "
            "capability 10.0); use "
            "\"tensorwise\" or \"delayed\""])
    offload = spec.constraints.offload_layers
    if offload and offload >= spec.model.layers:
        raise InputError(f"{source}: invalid instance", [
            f"constraints.offload_layers: {offload} is not below the model's "
            f"{spec.model.layers} layers; expected at most {spec.model.layers - 1} (Megatron-Core "
            "offloads fewer layers than num_layers, TransformerConfig)"])
    reserve = spec.constraints.memory_reserve_GiB
    if reserve is None:                 # the default depends on the GPU: fix it here, once
        reserve = default_reserve_GiB(gpu.hbm_capacity_GiB, spec.training.expandable_segments,
                                      spec.constraints.framework)
        spec = spec.model_copy(update={"constraints": spec.constraints.model_copy(
            update={"memory_reserve_GiB": reserve})})
    if reserve >= gpu.hbm_capacity_GiB:
        raise InputError(f"{source}: invalid instance",
                         [f"constraints.memory_reserve_GiB: {reserve:g} GiB leaves no memory on "
                          f"{gpu.key} ({gpu.hbm_capacity_GiB:g} GiB); expected less than that"])
    host = c.gpus_per_node or c.gpus_per_host or gpu.host_size
    domain = c.gpus_per_node or c.nvlink_domain or gpu.nvlink_domain
    if domain % host and host % domain:
        # an NVLink domain joins whole hosts (a rack of trays) or part of one (a host's GPUs
        # split into NVLink islands); anything else is no machine anyone builds
        said = "cluster.nvlink_domain" if c.nvlink_domain else f"{gpu.key}'s nvlink_domain"
        by = "cluster.gpus_per_host" if c.gpus_per_host else f"{gpu.key}'s gpus_per_host"
        raise InputError(f"{source}: invalid instance",
                         [f"{said}: {domain} GPUs is neither a multiple nor a divisor of the "
                          f"host's {host} GPUs ({by}); expected a divisor or a multiple of "
                          f"{host}"])
    hw = Hardware(
        gpu=gpu,
        peak=gpu.peak_flops("fp16" if precision == "fp16" else "bf16"),
        peak_fp8=gpu.peak_flops("fp8"),
        peak_fp4=gpu.peak_flops("nvfp4"),
        efficiency=c.efficiency or gpu.efficiency,
        overlap_slowdown=(gpu.overlap_slowdown if c.overlap_slowdown is None
                          else c.overlap_slowdown),
        fp8_weight_cache_bytes=(narrow_bytes(spec.training)
                                * (2 if both_directions(spec.training, gpu) else 1)),
        **stack_figures(gpu, spec),
        hbm_bytes=gpu.hbm_capacity_GiB * GiB,
        hbm_bw=gpu.hbm_bandwidth_GBps * 1e9,
        gpus_per_host=host,
        nvlink_domain=domain,
        # collectives move data at the bus bandwidth NCCL reaches, a measured share of the
        # catalog's link rate; an instance override is taken as that achieved bandwidth itself
        bw_intra=(c.intra_node_bandwidth_GBps
                  or gpu.intra_node_bandwidth_GBps * gpu.intra_node_bus_efficiency) * 1e9,
        bw_inter=(c.inter_node_bandwidth_GBps
                  or gpu.inter_node_bandwidth_GBps * gpu.inter_node_bus_efficiency) * 1e9,
        lat_intra=gpu.intra_node_latency_us * 1e-6,
        lat_inter=gpu.inter_node_latency_us * 1e-6,
        host_bw=(c.host_link_bandwidth_GBps or gpu.host_link_bandwidth_GBps or 0.0) * 1e9,
        host_mem_bytes=(c.host_memory_GiB or gpu.host_memory_GiB or 0.0) * GiB,
        host_mem_bw=(c.host_memory_bandwidth_GBps or gpu.host_memory_bandwidth_GBps
                     or 0.0) * 1e9,
    )
    host_reserve = spec.constraints.host_memory_reserve_GiB
    if host_reserve is not None and hw.host_mem_bytes and host_reserve * GiB >= hw.host_mem_bytes:
        raise InputError(f"{source}: invalid instance", [
            f"constraints.host_memory_reserve_GiB: {host_reserve:g} GiB leaves no host memory "
            f"for offload ({hw.host_mem_bytes / GiB:g} GiB per host, cluster.host_memory_GiB or "
            f"the catalog's); expected less than that"])
    if c.gpus is not None:
        if c.gpus > host and c.gpus % host:
            raise InputError(f"{source}: invalid instance",
                             [f"cluster.gpus: {c.gpus} does not fill whole hosts of {host} GPUs; "
                              f"use a multiple of {host} or fewer than {host}"])
        return Instance(spec, hw, (max(1, c.gpus // host),), c.gpus, source)
    if c.node_counts is not None:
        options = tuple(sorted(set(c.node_counts)))
    elif isinstance(c.nodes, tuple):
        options = tuple(range(c.nodes[0], c.nodes[1] + 1))
    else:
        options = (c.nodes,)
    return Instance(spec, hw, options, options[-1] * host, source)


def read_toml(path: str | Path, what: str = "instance file") -> dict[str, Any]:
    """A TOML file as a dict; a missing file, a syntax error (with its line) or a binary file is
    an :class:`InputError` naming the file (``what`` the file was expected to be: a directory
    is not ``an instance file``, or ``a runs file``). Read as UTF-8 (TOML's encoding, whatever
    the locale), a leading byte-order mark (Windows editors write one) skipped."""
    p = Path(path)
    check_readable(p, what)
    try:
        return tomllib.loads(p.read_text(encoding="utf-8-sig"))
    except tomllib.TOMLDecodeError as exc:
        twice = ("; a key or [section] given twice" if str(exc).startswith(
            ("Cannot overwrite a value", "Cannot declare")) else "")
        raise InputError(f"{p}: TOML syntax error: {exc}{twice}") from None
    except UnicodeDecodeError:
        raise InputError(f"{p}: not UTF-8 text (TOML is UTF-8: a binary file, or text saved "
                         "as UTF-16 or Latin-1; save it as UTF-8)") from None
    except RecursionError:
        raise InputError(f"{p}: nested too deeply to read (arrays or tables inside each other "
                         "thousands of levels deep)") from None
    except OSError as exc:
        raise InputError(f"{p}: cannot read: {exc.strerror or exc}") from None


def check_readable(p: Path, what: str) -> None:
    """A regular file, or an :class:`InputError` saying what the path is instead."""
    if str(p) in ("", "."):
        raise InputError(f"{what}: an empty path")
    if not p.exists():
        raise InputError(f"{p}: no such file")
    if p.is_dir():
        raise InputError(f"{p}: is a directory, expected {article(what)}")
    if not p.is_file():
        raise InputError(f"{p}: not a regular file (a device, pipe or socket), expected "
                         f"{article(what)}")


def load_instance(path: str | Path) -> Instance:
    """Read and resolve an instance TOML file."""
    p = Path(path)
    return parse_instance(read_toml(p), str(p), p.parent)

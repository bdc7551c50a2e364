"""Load the hardware catalog (``hardware_catalog/*.toml``) into validated :class:`GPU` records.

Units are in the field names (``_GiB``, ``_GBps``, ``_us``, ``tflops``) so a figure is never read
in the wrong unit. Every file carries a ``[sources]`` table naming where each figure comes from;
the loader refuses a file whose figure has no source.
"""

from __future__ import annotations

import tomllib
from functools import cache
from importlib import resources
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from planner.model.errors import InputError

GiB = 1024**3


class KernelStack(BaseModel):
    """The compute figures of one kernel stack on one GPU type ([training] kernel_stack): the
    two knees of the GEMM size curve, the attention core's share of the peak and the FP8
    asymptote; the 16-bit asymptote is the GPU type's ``efficiency`` (the best matmul the chip
    runs). Calibrated like the main figures (``plan validate RUNS --calibrate`` on runs of
    that stack); ``calibration`` says how."""

    model_config = ConfigDict(extra="forbid")

    gemm_knee_tokens: float = Field(ge=0)
    gemm_knee_width: float = Field(ge=0)
    attention_efficiency: float = Field(gt=0, le=1)
    efficiency_fp8: float | None = Field(default=None, gt=0, le=1)
    calibration: str


class GPU(BaseModel):
    """One GPU type and the node it sits in. Bandwidths are per GPU and per direction."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    key: str = Field(description="catalog file name without .toml")
    name: str
    peak_tflops_bf16: float = Field(gt=0, description="dense BF16 tensor-core peak")
    peak_tflops_fp16: float = Field(gt=0, description="dense FP16 tensor-core peak")
    peak_tflops_fp8: float = Field(ge=0, description="dense FP8 tensor-core peak; 0 = no FP8")
    peak_tflops_fp4: float = Field(default=0.0, ge=0, description="dense FP4 (NVFP4) "
                                   "tensor-core peak; 0 = no FP4, or no figure in the catalog")
    hbm_capacity_GiB: float = Field(gt=0)
    hbm_bandwidth_GBps: float = Field(gt=0)
    gpus_per_node: int = Field(gt=0, description="GPUs per NVLink domain (the largest group the "
                               "intra-node links join: 8 on a DGX, 72 on GB200 NVL72)")
    gpus_per_host: int | None = Field(default=None, gt=0, description="GPUs per host, the "
                                      "scheduling node (4 on a GB200 compute tray); default "
                                      "gpus_per_node")
    intra_node_bandwidth_GBps: float = Field(gt=0)
    inter_node_bandwidth_GBps: float = Field(gt=0)
    intra_node_bus_efficiency: float = Field(
        default=1.0, gt=0, le=1, description="share of the NVLink rate NCCL collectives reach "
        "(nccl-tests bus bandwidth on large messages / link rate)")
    inter_node_bus_efficiency: float = Field(
        default=1.0, gt=0, le=1, description="share of the NIC rate NCCL collectives reach")
    intra_node_latency_us: float = Field(ge=0)
    inter_node_latency_us: float = Field(ge=0)
    efficiency: float = Field(gt=0, le=1, description="achieved share of peak on GEMMs, calibrated")
    efficiency_fp8: float | None = Field(default=None, gt=0, le=1)
    gemm_knee_tokens: float = Field(
        default=0.0, ge=0, description="GEMM size curve, rows: a GEMM of M tokens and a weight "
        "shard N x K runs at efficiency * M/(M+kt) * N/(N+kw) * K/(K+kw); calibrated, 0 = flat")
    gemm_knee_width: float = Field(
        default=0.0, ge=0, description="GEMM size curve, weight dimensions per tensor rank (kw)")
    attention_efficiency: float | None = Field(
        default=None, gt=0, le=1, description="share of the 16-bit peak the fused (flash) "
        "attention core reaches on the model's 4 b s^2 h FLOPs; default efficiency")
    fp8_weight_transpose: bool = Field(
        default=True, description="FP8 GEMMs need a transposed FP8 copy of each weight "
        "(Hopper runs FP8 GEMMs in the TN layout only), which Transformer Engine caches beside "
        "the FP8 copy: 2 bytes per GEMM parameter; false where FP8 GEMMs take any layout "
        "(Blackwell): 1 byte")
    mxfp8: bool = Field(
        default=False, description="the tensor cores run block-scaled FP8 GEMMs (MXFP8: an E8M0 "
        "scale per 32 elements), which [training] fp8_recipe = \"mxfp8\" needs: Blackwell "
        "(compute capability 10.x); Hopper has none")
    overlap_slowdown: float = Field(
        default=0.0, ge=0, le=1, description="how much slower compute runs while a collective "
        "runs beside it (its kernels take SMs and HBM bandwidth from the GEMMs): 0.189 = 18.9% "
        "longer; 0 = overlap is free")
    host_link_bandwidth_GBps: float | None = Field(
        default=None, gt=0, description="GPU <-> host memory link per GPU and per direction "
        "(PCIe or NVLink-C2C): host offload moves its bytes on it; None: no host offload")
    host_memory_GiB: float | None = Field(
        default=None, gt=0, description="host (CPU) memory per host, which the offloaded bytes "
        "of its GPUs share")
    host_memory_bandwidth_GBps: float | None = Field(
        default=None, gt=0, description="host memory bandwidth per host (peak), which bounds "
        "the optimizer step offloaded to the CPU")
    measured_precisions: tuple[Literal["16-bit", "fp8", "nvfp4"], ...] = Field(
        default=(), description="the precision classes of this GPU type's measured runs in the "
        "shipped runs files (planner/data): a plan at another one rests on assumed figures and "
        "says so (planner.model.evaluate.caveats)")
    caveat: str | None = Field(
        default=None, description="what every plan on this type should be read with, measured "
        "(planner.model.evaluate.caveats adds it): e.g. how far the model's step times sat "
        "from a newer software release's measured runs")
    kernel_stacks: dict[str, KernelStack] = Field(
        default_factory=dict, description="figures of other kernel stacks ([training] "
        "kernel_stack) than the fused one the main figures are calibrated for")
    calibration: str
    sources: dict[str, str]

    @property
    def nvlink_domain(self) -> int:
        return self.gpus_per_node

    @property
    def host_size(self) -> int:
        return self.gpus_per_host or self.gpus_per_node

    def peak_flops(self, precision: str) -> float:
        """Dense peak in FLOP/s for a precision name (bf16, fp16, fp8, nvfp4)."""
        return {"bf16": self.peak_tflops_bf16, "fp16": self.peak_tflops_fp16,
                "fp8": self.peak_tflops_fp8, "nvfp4": self.peak_tflops_fp4}[precision] * 1e12


_FIGURES = (
    "peak_tflops_bf16", "peak_tflops_fp16", "peak_tflops_fp8", "hbm_capacity_GiB",
    "hbm_bandwidth_GBps", "gpus_per_node", "intra_node_bandwidth_GBps",
    "inter_node_bandwidth_GBps", "intra_node_latency_us", "inter_node_latency_us", "efficiency",
)
#: Figures that need a source when the file gives them (their defaults leave the model as before).
_OPTIONAL_FIGURES = ("intra_node_bus_efficiency", "inter_node_bus_efficiency", "gemm_knee_tokens",
                     "gemm_knee_width", "attention_efficiency", "overlap_slowdown",
                     "fp8_weight_transpose", "mxfp8", "peak_tflops_fp4",
                     "host_link_bandwidth_GBps",
                     "host_memory_GiB", "host_memory_bandwidth_GBps", "measured_precisions")


def known_gpus() -> list[str]:
    """Names of the catalog files, sorted."""
    root = resources.files("hardware_catalog")
    return sorted(p.name[:-5] for p in root.iterdir() if p.name.endswith(".toml"))


@cache
def load_gpu(key: str) -> GPU:
    """Load one catalog entry by file name; an unknown name lists the known ones."""
    names = known_gpus()
    if key not in names:
        raise InputError(f"cluster.gpu: unknown GPU \"{key}\"; expected one of: {', '.join(names)}")
    text = resources.files("hardware_catalog").joinpath(f"{key}.toml").read_text()
    try:
        data = tomllib.loads(text)
        gpu = GPU(key=key, **data)
    except (tomllib.TOMLDecodeError, ValidationError) as exc:  # a broken shipped file
        raise InputError(f"hardware_catalog/{key}.toml is invalid: {exc}") from None
    missing = [f for f in _FIGURES if f not in gpu.sources]
    if gpu.gpus_per_host is not None and "gpus_per_host" not in gpu.sources:
        missing.append("gpus_per_host")
    missing += [f for f in _OPTIONAL_FIGURES if f in data and f not in gpu.sources]
    if missing:
        raise InputError(f"hardware_catalog/{key}.toml: no source for {', '.join(missing)}")
    return gpu

"""The per-GPU-type calibration: a few physical parameters per GPU type, fitted on measured runs,
nothing per run.

The GEMM size curve ``eff = efficiency * M/(M + gemm_knee_tokens) * N/(N + kw) * K/(K + kw)``
(``kw = gemm_knee_width``, see :func:`planner.model.terms.step_terms`; the two knees shared by
every GPU type, the asymptote per type) is fitted by minimising the mean absolute error over the
16-bit runs on a grid, then ``efficiency_fp8`` the same way over each type's FP8 runs (with the
attention core's figure where runs are long enough to tell it apart, :data:`LONG_SEQ`); a kernel
stack other than the fused one gets its own knees and attention figure per GPU type. Each run is
evaluated once over the whole grid (the evaluator runs on numpy arrays), so refitting without a
source (validate.py, ``out_of_sample``) costs a table lookup.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from planner.app.runs_file import held_out, run_framework, run_instance, source_of
from planner.model.catalog import load_gpu
from planner.model.frameworks import kernel_stack
from planner.model.plan import plan_from_spec
from planner.model.terms import step_terms


#: The calibration grid: the asymptotic GEMM efficiency and the two knees of the size curve.
EFF_GRID = np.round(np.arange(0.30, 1.0 + 1e-9, 0.0025), 4)
KNEE_TOKENS_GRID = np.arange(0.0, 1024.0 + 1, 128.0)
KNEE_WIDTH_GRID = np.arange(0.0, 2048.0 + 1, 64.0)


#: The grid of a kernel stack's figures (``[kernel_stacks.*]`` in the catalog): the two knees of
#: the GEMM size curve and the attention core's share of the peak (the asymptote is the GPU
#: type's: the best matmul the chip runs, whatever calls it).
STACK_KNEE_TOKENS_GRID = np.arange(0.0, 4096.0 + 1, 128.0)
ATTENTION_GRID = np.round(np.arange(0.20, 1.0 + 1e-9, 0.01), 4)


def stack_of(run: dict[str, Any]) -> str:
    """The run's kernel stack: its ``[training] kernel_stack``, else the default of the
    framework it runs under (:func:`planner.model.frameworks.kernel_stack`)."""
    tr = run.get("training", {})
    return kernel_stack(tr.get("kernel_stack"), run.get("precision"), tr.get("fp8_recipe"),
                        run_framework(run))


#: A sequence this long (tokens) makes the attention core most of a layer's work: Llama 3 8B at
#: 32K spends 53% of its model FLOPs there, 97.5% at 1M. A fused GPU type's fitted FP8 runs that
#: reach it let :meth:`Calibrator.fit` fit the type's ``attention_efficiency`` beside its FP8
#: asymptote; below it the attention share is too small to tell the two apart, and the core runs
#: at the 16-bit GEMM ``efficiency`` (the rule the held-out H100 long-sequence runs check).
LONG_SEQ = 32768


def seq_len(data: dict[str, Any], run: dict[str, Any]) -> int:
    """The sequence length of a run's model (its ``seq_len``, else its preset's)."""
    model = data["models"][run["model"]]
    if "seq_len" in model:
        return int(model["seq_len"])
    return int(run_instance(data, run).model.seq_len)


def fit_key(run: dict[str, Any]) -> str:
    """Whose parameters a run's error depends on: its GPU type (fused kernels, the catalog's main
    figures) or ``gpu:stack`` (the catalog's ``[kernel_stacks.stack]`` of that GPU type)."""
    stack = stack_of(run)
    return run["gpu"] if stack == "fused" else f"{run['gpu']}:{stack}"


def _grid_times(data: dict[str, Any], run: dict[str, Any], fit16: dict[str, float] | None,
                attention: bool = False) -> np.ndarray:
    """Predicted step times of one run over the calibration grid: indexed
    ``[efficiency, knee_tokens, knee_width]`` for a 16-bit run, ``[efficiency_fp8]`` for an FP8
    run (its 16-bit parameters fixed at ``fit16``), ``[efficiency_fp8, attention_efficiency]``
    with ``attention`` (the type's attention figure fitted too)."""
    inst = run_instance(data, run)
    plan = plan_from_spec(inst, inst.spec.plan)
    hw = inst.hw
    if stack_of(run) != "fused":
        # a kernel stack's run: [knee_tokens, knee_width, attention_efficiency] for 16-bit,
        # [efficiency_fp8] for FP8 (its 16-bit figures fixed at fit16)
        if run["precision"] == "fp8":
            f = fit16 or {}
            hw = replace(hw, efficiency_fp8=EFF_GRID,
                         knee_tokens=f.get("gemm_knee_tokens", hw.knee_tokens),
                         knee_width=f.get("gemm_knee_width", hw.knee_width),
                         attention_efficiency=f.get("attention_efficiency",
                                                    hw.attention_efficiency))
        else:
            hw = replace(hw, knee_tokens=STACK_KNEE_TOKENS_GRID[:, None, None],
                         knee_width=KNEE_WIDTH_GRID[None, :, None],
                         attention_efficiency=ATTENTION_GRID[None, None, :])
    elif run["precision"] == "fp8":
        f = fit16 or {}
        e16 = f.get("efficiency", hw.efficiency)
        hw = replace(hw, efficiency=e16,
                     efficiency_fp8=EFF_GRID[:, None] if attention else EFF_GRID,
                     attention_efficiency=(ATTENTION_GRID[None, :] if attention
                                           else hw.attention_efficiency),
                     knee_tokens=f.get("gemm_knee_tokens", hw.knee_tokens),
                     knee_width=f.get("gemm_knee_width", hw.knee_width))
    else:
        hw = replace(hw, efficiency=EFF_GRID[:, None, None],
                     knee_tokens=KNEE_TOKENS_GRID[None, :, None],
                     knee_width=KNEE_WIDTH_GRID[None, None, :])
    terms = step_terms(replace(inst, hw=hw), plan.grid.degrees(), plan.knobs)
    return np.asarray(terms.step_time, dtype=float)


class Calibrator:
    """Fits per GPU type on any subset of the runs; every run is evaluated once per grid."""

    def __init__(self, data: dict[str, Any]):
        self.data = data
        self.runs = data["runs"]
        self.measured = [float(r["measured_step_time_s"]) for r in self.runs]
        self._grid16 = {i: _grid_times(data, r, None) for i, r in enumerate(self.runs)
                        if r["precision"] in ("bf16", "fp16") and stack_of(r) == "fused"}
        self._grid8: dict[tuple, np.ndarray] = {}
        #: the fit keys whose fitted runs come from one source (on the whole file)
        self._one_source = single_source_keys(data)
        # kernel-stack runs: each 16-bit run's |error| over the stack grid (float32), and their
        # sum per GPU type and stack (a fit without a source subtracts that source's runs)
        self._stack_err = {i: np.abs(_grid_times(data, r, None) / self.measured[i] - 1)
                           .astype(np.float32) for i, r in enumerate(self.runs)
                           if r["precision"] in ("bf16", "fp16") and stack_of(r) != "fused"
                           and held_out(r) is None}
        self._stack_total: dict[str, np.ndarray] = {}
        for i, e in self._stack_err.items():
            k = fit_key(self.runs[i])
            self._stack_total[k] = self._stack_total.get(k, 0) + e.astype(np.float64)

    def fit(self, exclude_source: str | None = None) -> dict[str, dict[str, float]]:
        """The grid point minimising the mean |error| (without the runs of ``exclude_source``).

        The knees ``gemm_knee_tokens`` and ``gemm_knee_width`` are one pair for every GPU type
        (the tiling of the GEMM kernels, fitted on all 16-bit runs together: the runs of one GPU
        type, nearly all at tensor-parallel degree 4 or 8, cannot tell a width knee from the
        asymptote, and refitted without one source they could not at all); ``efficiency`` per
        GPU type; then ``efficiency_fp8`` per GPU type on its FP8 runs. A GPU left without 16-bit runs
        gets no fit (the catalog stands); without FP8 runs its FP8 GEMMs are charged the
        16-bit ``efficiency``."""
        keep = [i for i, r in enumerate(self.runs)
                if source_of(r) != exclude_source and held_out(r) is None
                and stack_of(r) == "fused"]
        gpus = sorted({r["gpu"] for r in self.runs if stack_of(r) == "fused"})
        err16 = {}
        for gpu in gpus:
            idx16 = [i for i in keep if self.runs[i]["gpu"] == gpu and i in self._grid16]
            if idx16:
                err16[gpu] = sum(np.abs(self._grid16[i] / self.measured[i] - 1) for i in idx16)
        # per pair of knees: each GPU's best efficiency; the pair with the least total error
        # over the GPU types whose fitted runs come from two sources or more wins (a type with
        # one source, as GB200's runs are, fits its asymptote at the knees the others set: its
        # runs alone cannot tell a knee from the asymptote, nor would a fit without them);
        # the voters are counted on the whole file, so leaving a source out does not change them
        voters = [g for g in err16 if g not in self._one_source] or list(err16)
        total = sum(err16[g].min(axis=0) for g in voters) if err16 else None
        kt, kw = (np.unravel_index(int(np.argmin(total)), total.shape) if total is not None
                  else (0, 0))
        out: dict[str, dict[str, float]] = {}
        for gpu in gpus:
            fit: dict[str, float] = {}
            if gpu in err16:
                e = int(np.argmin(err16[gpu][:, kt, kw]))
                fit = {"efficiency": float(EFF_GRID[e]),
                       "gemm_knee_tokens": float(KNEE_TOKENS_GRID[kt]),
                       "gemm_knee_width": float(KNEE_WIDTH_GRID[kw])}
            idx8 = [i for i in keep if self.runs[i]["gpu"] == gpu
                    and self.runs[i]["precision"] == "fp8"]
            # (FP8 runs that are fitted at all: a type whose FP8 runs are all held out keeps
            # the catalog's FP8 figure, which then comes from elsewhere)
            has_fp8 = any(r["gpu"] == gpu and r["precision"] == "fp8"
                          and stack_of(r) == "fused" and held_out(r) is None
                          for r in self.runs)
            if fit and has_fp8 and not idx8:
                # no FP8 run to fit: FP8 GEMMs are charged the 16-bit efficiency (never a
                # catalog value fitted on the runs left out)
                fit["efficiency_fp8"] = fit["efficiency"]
            if idx8:
                # with runs long enough to tell the attention core from the GEMMs, the type's
                # attention figure is fitted beside its FP8 asymptote (LONG_SEQ)
                attn = any(_fits_attention(self.data, self.runs[i]) for i in idx8)
                key = (tuple(sorted(fit.items())), attn)
                err8 = 0.0
                for i in idx8:
                    if (i, key) not in self._grid8:
                        self._grid8[(i, key)] = _grid_times(self.data, self.runs[i], fit or None,
                                                            attention=attn)
                    err8 = err8 + np.abs(self._grid8[(i, key)] / self.measured[i] - 1)
                if attn:
                    e, a = np.unravel_index(int(np.argmin(err8)), err8.shape)
                    fit["efficiency_fp8"] = float(EFF_GRID[e])
                    fit["attention_efficiency"] = float(ATTENTION_GRID[a])
                else:
                    fit["efficiency_fp8"] = float(EFF_GRID[int(np.argmin(err8))])
            if fit:
                out[gpu] = fit
        out.update(self._fit_stacks(exclude_source))
        return out

    def _fit_stacks(self, exclude_source: str | None) -> dict[str, dict[str, float]]:
        """Per GPU type and kernel stack (key ``gpu:stack``): the grid point of
        ``gemm_knee_tokens``, ``gemm_knee_width`` and ``attention_efficiency`` minimising the
        mean |error| over the stack's 16-bit runs on that GPU type, then ``efficiency_fp8``
        over its FP8 runs (none without FP8 runs to fit). The asymptote ``efficiency`` stays
        the GPU type's (the catalog's): the best matmul is the chip's, the stack sets how far
        from it GEMMs of a given size run, and what the attention kernel reaches."""
        out: dict[str, dict[str, float]] = {}
        runs = self.runs
        for key, total in sorted(self._stack_total.items()):
            err = total
            for i, e in self._stack_err.items():
                if fit_key(runs[i]) == key and source_of(runs[i]) == exclude_source:
                    err = err - e
            n = sum(1 for i in self._stack_err if fit_key(runs[i]) == key
                    and source_of(runs[i]) != exclude_source)
            if not n:
                continue
            kt, kw, a = np.unravel_index(int(np.argmin(err)), err.shape)
            fit = {"gemm_knee_tokens": float(STACK_KNEE_TOKENS_GRID[kt]),
                   "gemm_knee_width": float(KNEE_WIDTH_GRID[kw]),
                   "attention_efficiency": float(ATTENTION_GRID[a])}
            idx8 = [i for i, r in enumerate(runs) if fit_key(r) == key
                    and r["precision"] == "fp8" and held_out(r) is None
                    and source_of(r) != exclude_source]
            if idx8:
                cache = tuple(sorted(fit.items()))
                err8 = 0.0
                for i in idx8:
                    if (i, cache) not in self._grid8:
                        self._grid8[(i, cache)] = _grid_times(self.data, runs[i], fit)
                    err8 = err8 + np.abs(self._grid8[(i, cache)] / self.measured[i] - 1)
                fit["efficiency_fp8"] = float(EFF_GRID[int(np.argmin(err8))])
            out[key] = fit
        return out


def calibrate(data: dict[str, Any]) -> dict[str, dict[str, float]]:
    """The parameters per GPU type fitted on every run (what the catalog records)."""
    return Calibrator(data).fit()


def single_source_keys(data: dict[str, Any]) -> dict[str, str]:
    """The parameter sets (:func:`fit_key`) one source alone fits, with that source: those whose
    fitted runs all come from one source, and those one of whose figures rests on one source's
    runs (a fused type's ``attention_efficiency``, fitted on its FP8 runs when some reach
    :data:`LONG_SEQ`: when those long runs come from one source, a fit without it has no
    attention figure of its own)."""
    sources: dict[str, set[str]] = {}
    long_sources: dict[str, set[str]] = {}
    for run in data["runs"]:
        if held_out(run) is None:
            key = fit_key(run)
            sources.setdefault(key, set()).add(source_of(run))
            if _fits_attention(data, run):
                long_sources.setdefault(key, set()).add(source_of(run))
    out = {k: next(iter(s)) for k, s in sources.items() if len(s) == 1}
    for k, s in long_sources.items():
        if k not in out and len(s) == 1:
            out[k] = f"its attention figure: {next(iter(s))}"
    return out


def _fits_attention(data: dict[str, Any], run: dict[str, Any]) -> bool:
    """A fitted fused FP8 run long enough (:data:`LONG_SEQ`) to fit its type's attention figure."""
    return (stack_of(run) == "fused" and run["precision"] == "fp8" and held_out(run) is None
            and seq_len(data, run) >= LONG_SEQ)


def catalog_figures(key: str) -> dict[str, float | None]:
    """The catalog's figures of a fit key: a GPU type's main ones, or ``gpu:stack``'s."""
    gpu_key, _, stack = key.partition(":")
    gpu = load_gpu(gpu_key)
    src = gpu.kernel_stacks[stack] if stack else gpu
    return {f: getattr(src, f, None) for f in ("efficiency", "efficiency_fp8",
                                                "gemm_knee_tokens", "gemm_knee_width",
                                                "attention_efficiency")}


def calibration_only_keys(data: dict[str, Any], cal: Calibrator | None = None
                          ) -> dict[str, str]:
    """The fit keys whose catalog figures are the fit of one source's runs alone, with that
    source: the keys of :func:`single_source_keys` where the catalog holds exactly what those
    runs fit (as the shipped runs' B200 and GB200 figures do). Such runs set their type's
    figures, so their in-sample error says how well the figures fit them, not how the model
    predicts, and a fit without their source leaves the type nothing of its own: no
    out-of-sample error. So :func:`planner.app.validate.summary` keeps them out of the error
    bounds and reports them apart. The rule follows
    from the sources and the catalog, not from a mark on chosen runs: a second source of the
    type brings them into the bounds, and a runs file the catalog was not fitted on (the same
    type, another source, another fit) keeps them in, their errors then predictions."""
    singles = single_source_keys(data)
    if not singles:
        return {}
    fitted = (cal or Calibrator(data)).fit()
    out = {}
    for key, source in singles.items():
        fit, have = fitted.get(key, {}), catalog_figures(key)
        if fit and all(have.get(f) is not None and abs(have[f] - x) <= 1e-9
                       for f, x in fit.items()):
            out[key] = source
    return out

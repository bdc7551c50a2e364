"""Ranking (issue 12): for every shipped run, the published plan against the model's optimum in the
same knob space (recompute mode, sequence parallelism, distributed optimizer, precision and
attention kernel pinned as the run had them; GPU count and global batch fixed).

What holds is asserted; the issue's target (every run within 10%) is a strict xfail naming
the runs that miss it, so a model change that meets it shows up."""

from __future__ import annotations

import pytest

import re

from formulations import progress
from planner.app.ranking import (GAP_FLOOR_S, GRAD_OVERLAP_WITH_PP_SINCE, INTERLEAVE_PP2_SINCE,
                                 ranking, ranking_spaces)
from planner.app.runs_file import load_runs, run_instance
from planner.model.errors import InputError
from planner.model.evaluate import evaluate
from planner.model.plan import plan_from_spec
from planner.model.workload import Shape

TARGET = 1.10


@pytest.fixture(scope="module")
def data():
    return load_runs()


@pytest.fixture(scope="module")
def ranks(data):
    # the enumerator proves the same optima as the MIPs on these spaces in a twentieth of the
    # time (6.45 s against 131.87 s for CP-SAT on the 204 runs of d2ee797, identical ratios:
    # benchmarks/ranking_spaces.py), as `plan validate` does by default; the MIPs' agreement on
    # the published runs' spaces is tests/test_published_space.py's subject, and CP-SAT's on
    # six of these rankings test_cpsat_ranks_as_the_enumerator_does's
    with progress.listen(lambda kind, i, n, *_: ANNOUNCED.append((kind, i, n))):
        return ranking(data, solver="enumerate")


#: what the ranking said it was on while it ran (formulations/progress.py; plan validate's
#: status line shows it)
ANNOUNCED: list[tuple[str, int, int]] = []


def _fits(data, run) -> bool:
    inst = run_instance(data, run)
    return evaluate(inst, plan_from_spec(inst, inst.spec.plan), spec=inst.spec.plan).fits


def test_every_run_is_ranked(data, ranks):
    assert set(ranks) == {r["id"] for r in data["runs"]}
    n = len(data["runs"])
    assert ANNOUNCED == [("published run", i, n) for i in range(n)]


def test_the_optimum_is_no_slower_than_a_published_plan_that_fits(data, ranks):
    """The published plan lies in its own knob space: when the model says it fits, the proven
    optimum cannot be slower (ratio >= 1), and a solver optimum must be proven."""
    for run in data["runs"]:
        r = ranks[run["id"]]
        if not _fits(data, run):
            continue
        assert r["status"] == "optimal", (run["id"], r)
        assert r["ratio"] >= 1 - 1e-6, (run["id"], r)


#: Regression ratchets, not properties: today's output of the ranking (``plan validate``,
#: measured), so that a model change that ranks more published plans far from the optimum,
#: or a dense one farther, fails here and has to be looked at. They prove nothing about the
#: model being right; the property is the issue's target, the strict xfail
#: test_every_published_plan_within_10_percent below. Raise them when the model gets better,
#: never lower them to make a change pass without saying why.
RATCHET_WITHIN_TARGET = 149       # of the 161 ranked runs, ratio <= TARGET
RATCHET_WORST_DENSE = 1.27        # today 1.269


def test_ranking_ratchet_runs_within_target_and_worst_dense_ratio(data, ranks):
    """Regression ratchet (see RATCHET_WITHIN_TARGET): measured (`plan validate`), 149 of the
    161 ranked runs are within 10% of the model's optimum (the two Llama 3 405B runs and the
    held-out plan that does not fit under the model among them, with a ratio below 1), and the
    largest ratio of a dense run is 1.269 (Narayanan et al.'s 39.1B at TP8 x PP2 against TP2
    x PP8 VP6; 1.257 before the interleaved schedule's per-chunk gradient reduction was
    costed). (34 of 44 while the H100 runs were costed with their overlaps off: the NeMo and
    DGX Cloud plans hide collectives that the optimum's cannot, and the H100 efficiencies
    were fitted without them.)"""
    ratios = [r["ratio"] for r in ranks.values() if r.get("ratio")]
    assert len(ratios) == len(ranks)
    # (151 while the Blackwell capacities were their datasheets' GB read as 10^9 bytes: with
    # nvidia-smi's, 6-12 GiB more per GPU, Nemotron-4 340B at FP8 on 512 GB200 ranks 1.110
    # against TP4 PP2 and Qwen3-235B on 256 GB200 1.102)
    assert sum(x <= TARGET for x in ratios) >= RATCHET_WITHIN_TARGET
    # the dense runs; the MoE terms are not validated (README): expert parallelism across
    # nodes ranks 1.26-1.69 against 4- or 8-way inside a node (DeepSeek-V3, Qwen3 on H100)
    dense = [r["ratio"] for rid, r in ranks.items() if not _moe(data, rid)]
    assert max(dense) <= RATCHET_WORST_DENSE


def test_the_ranking_says_how_close_to_the_limit_each_plan_runs(data, ranks):
    """``optimum_headroom_gib`` / ``published_headroom_gib``: the optimum fits, so its headroom
    is never negative; a published plan's is negative exactly when the model says it does not
    fit (tests/test_memory_megatron.py's three misfits)."""
    short = []
    for run in data["runs"]:
        r = ranks[run["id"]]
        assert r["optimum_headroom_gib"] >= 0, (run["id"], r)
        assert (r["published_headroom_gib"] >= 0) == _fits(data, run), (run["id"], r)
        short += [run["id"]] if r["published_headroom_gib"] < 0 else []
    assert len(short) == 3, short


def test_cpsat_ranks_as_the_enumerator_does(data, ranks):
    """`plan validate` ranks with the enumerator by default (`--solver`); the MIP ranks the same
    runs the same: the same optimum plan and ratio, on a dense run split into the two spaces of
    its old code (Narayanan et al.), a small TP-only run, a NeMo interleaved plan, an MoE run,
    an NVFP4 plan and a Blackwell plan with the embedding and loss counted as layers."""
    ids = ["narayanan21-145.6b", "korthikanti22-22b-full", "nemo2407-nemotron3-22b-64",
           "mbridge2604-h100-qwen3-30b-a3b-fp8-16", "mbridge2602-gb200-llama3-70b-nvfp4-64",
           "dgxc2505-gb200-llama31-405b-fp8-128"]
    mip = ranking({**data, "runs": [r for r in data["runs"] if r["id"] in ids]}, solver="cpsat")
    assert set(mip) == set(ids)
    for rid in ids:
        assert mip[rid]["status"] == "optimal", (rid, mip[rid])
        assert mip[rid]["optimum_plan"] == ranks[rid]["optimum_plan"], rid
        assert mip[rid]["ratio"] == pytest.approx(ranks[rid]["ratio"], rel=1e-9), rid


def test_the_moe_caveat_states_how_far_the_moe_ranking_is_off(data, ranks):
    """Every MoE plan carries MOE_CAVEAT; the ranking figure it quotes is the worst ratio of
    the shipped MoE runs (published plan over the model's optimum), so a change of the model
    that moves it makes the text stale and this test fail."""
    from planner.model.evaluate import MOE_CAVEAT
    worst = max(r["ratio"] for rid, r in ranks.items() if _moe(data, rid))
    assert f"up to {worst:.1f}x faster than NVIDIA's tuned plans" in MOE_CAVEAT, worst


def _moe(data, rid: str) -> bool:
    """A run of a mixture-of-experts model, by the model's own shape (``Shape.n_moe``)."""
    run = next(r for r in data["runs"] if r["id"] == rid)
    return bool(Shape.of(run_instance(data, run).model).n_moe)


def test_nvidias_long_sequence_plans_are_near_the_optimum(data, ranks):
    """NeMo's long-sequence plans (4K to 1M tokens, context parallelism up to 32; held out)
    rank within the target: measured (``plan validate``) on H100 1.000 at 4K-32K and 1M, at
    most 1.062 (128K: CP4 against the model's CP2 at twice the data parallelism); on B200 at
    most 1.031, though the model puts their step times 12-61% too long there (README)."""
    long_runs = [r["id"] for r in data["runs"] if "-long-" in r["id"]]
    assert len(long_runs) == 17
    off = {rid: round(ranks[rid]["ratio"], 3) for rid in long_runs
           if ranks[rid]["ratio"] > TARGET}
    assert not off, off


def test_the_gap_by_term_accounts_for_the_whole_gap(ranks):
    """``gap_by_term_s`` (what `plan validate` prints under a ranking miss) splits each run's
    gap into the evaluator's step-time terms: they add up to published minus optimum, the
    largest first. Fails if the terms came from another plan than the optimum ranked, or if a
    term were missing from the breakdown."""
    for rid, r in ranks.items():
        gap = r["gap_by_term_s"]
        assert abs(sum(gap.values()) - (r["published_s"] - r["optimum_s"])) <= (
            12 * GAP_FLOOR_S + 1e-9 * r["published_s"]), (rid, r)
        sizes = [abs(x) for x in gap.values()]
        assert sizes == sorted(sizes, reverse=True), (rid, gap)
    misses = [r for r in ranks.values() if r["ratio"] > TARGET]
    assert misses and all(r["gap_by_term_s"] for r in misses)


def test_the_ranking_keeps_to_what_the_runs_code_could_run(data, ranks):
    """A run whose Megatron-LM predates interleaving at pp = 2 is not ranked against an
    optimum that interleaves two stages; before --overlap-grad-reduce, the overlapped
    reduction (PyTorch DDP's) is searched at pp = 1 only, none with a pipeline."""
    old = [r for r in data["runs"] if r.get("code_date", "9999") < INTERLEAVE_PP2_SINCE]
    assert len(old) >= 19                      # Narayanan, Korthikanti, MLPerf v3.1
    for run in old:
        label = ranks[run["id"]]["optimum_plan"]
        pp = int(re.search(r"PP(\d+)", label).group(1))
        assert not (pp == 2 and "VP" in label), (run["id"], label)
    pins = {"recompute": "full", "overlap_grad_reduce": True}
    spaces = ranking_spaces({"code_date": "2021-08"}, pins)
    assert all(s.get("pp") == 1 for s in spaces if s["overlap_grad_reduce"])
    assert any(not s["overlap_grad_reduce"] and "pp" not in s for s in spaces)
    assert all(s["recompute"] == "full" for s in spaces)
    assert ranking_spaces({"code_date": GRAD_OVERLAP_WITH_PP_SINCE}, pins) == [pins]
    assert ranking_spaces({}, pins) == [pins]
    with pytest.raises(InputError, match="code_date"):
        ranking_spaces({"id": "x", "code_date": "Aug 2021"}, pins)


@pytest.mark.xfail(strict=True, reason="issue 12 target not met (measured, plan validate): the "
                   "model prefers lower tensor parallelism (with deeper, interleaved pipelines "
                   "of one layer per chunk) than the A100 experts chose: Narayanan et al. 2021 "
                   "7.5B 1.155 (TP2 mb8 at pp 1), 18.4B 1.241, 39.1B 1.269, 145.6B 1.116, "
                   "Korthikanti et al. 2022 22B 1.168 with full recompute, in the feature set "
                   "of the runs' Megatron-LM (code_date); on H100 at FP8 (NeMo 24.07, held "
                   "out) Nemotron-3 22B 1.195 (TP2 PP4 VP10 against TP4 PP1 mb2: its 256,000-word output "
                   "layer, the FLOPs of 3 layers run in 16 bits, sits on a last stage of 10 layers, so "
                   "that stage sets the pace); and the MoE runs across nodes (held out, "
                   "the MoE terms not validated), DeepSeek-V3 on 1,024 H100 1.678 (EP64 against "
                   "EP8 inside a node, whose all-to-all the model charges 19 s less), "
                   "Qwen3-235B-A22B 1.68-1.69 and Qwen3-30B-A3B (26.04, HybridEP) 1.26 on H100, "
                   "Qwen3-235B-A22B in BF16 on 256 GB200 1.102 (EP16 PP1 against EP32 PP8 VP3); "
                   "on GB200 at FP8 Nemotron-4 340B on 512 GPUs with a global batch of 512 "
                   "1.110 (TP4 PP2 VP48 against the 128-GPU recipe's TP8 PP4 VP12, its gap "
                   "the narrower TP8 GEMM shards). Term by term "
                   "(published - optimum) the A100 gap is the TP8 all-reduces and the narrower "
                   "GEMM shards, against a larger bubble and more p2p; the model reproduces "
                   "the orderings of Narayanan et al.'s own sweeps "
                   "(test_orderings_of_narayanan_sweeps)")
def test_every_published_plan_within_10_percent(ranks):
    far = {k: round(r["ratio"], 3) for k, r in ranks.items() if r.get("ratio") and r["ratio"] > TARGET}
    assert not far, far


def _narayanan_sweep(layers, hidden, heads, batch, tp, pp, dp):
    """One point of Narayanan et al. 2021's parallel-configuration sweeps on 64 A100s
    (Megatron-LM examples/sc21/run_figure_1{3,4,5}.sh: sequence 2048, micro-batch 1,
    --checkpoint-activations, fp16, no interleaving; Megatron-LM of Aug 2021, so no fused
    attention and no asynchronous tensor-parallel all-reduce): model TFLOP/s per GPU."""
    from planner.model.instance import parse_instance
    from planner.model.schema import PlanSpec
    inst = parse_instance({
        "model": {"layers": layers, "hidden": hidden, "heads": heads, "vocab": 51200,
                  "seq_len": 2048},
        "training": {"global_batch": batch, "precision": "fp16", "flash_attention": False,
                     "async_tensor_model_parallel_allreduce": False},
        "cluster": {"gpu": "a100-80gb", "gpus": 64},
        "constraints": {"tp_within_node": False}})
    spec = PlanSpec(tp=tp, pp=pp, dp=dp, micro_batch=1, recompute="full",
                    sequence_parallel=False, distributed_optimizer=False,
                    overlap_grad_reduce=False, overlap_param_gather=False,
                    tp_comm_overlap=False, overlap_p2p_comm=False)
    rep = evaluate(inst, plan_from_spec(inst, spec), spec=spec)
    assert rep.fits, rep.violations                  # they ran
    return rep.model_tflops_per_gpu


def test_orderings_of_narayanan_sweeps():
    """The orderings Narayanan et al. 2021 measured (Sec. 5.4): Fig. 13, a 162.2B GPT (32
    layers, hidden 20480, 128 heads) at (pipeline, tensor) = (2, 32) ... (32, 2): "peak
    performance when the tensor-parallel size is equal to the number of GPUs in a single node"
    (the model: the best at batch 32, within 1% of the best at 128); Fig. 14, a 5.9B GPT (32
    layers, hidden 3840, 32 heads) at tensor 1: "the throughput decreases as the
    pipeline-parallel size increases"; Fig. 15, the same model at pipeline 1: throughput falls
    as the tensor-parallel size grows (Sec. 5.4.3). The batch sizes are the scripts'."""
    splits = [(2, 32), (4, 16), (8, 8), (16, 4), (32, 2)]
    for batch in (32, 128):
        tput = {pt: _narayanan_sweep(32, 20480, 128, batch, pt[1], pt[0], 1) for pt in splits}
        best = max(tput.values())
        assert tput[(8, 8)] >= 0.99 * best, (batch, tput)
        assert tput[(8, 8)] > max(tput[(2, 32)], tput[(32, 2)]), (batch, tput)
        if batch == 32:
            assert max(tput, key=tput.get) == (8, 8), tput
    for batch in (32, 512):
        fig14 = [_narayanan_sweep(32, 3840, 32, batch, 1, p, 64 // p) for p in (2, 4, 8, 16, 32)]
        assert all(a > b for a, b in zip(fig14, fig14[1:])), (batch, fig14)
    for batch in (32, 128, 512):
        fig15 = [_narayanan_sweep(32, 3840, 32, batch, t, 1, 64 // t) for t in (2, 4, 8, 16, 32)]
        assert all(a > b for a, b in zip(fig15, fig15[1:])), (batch, fig15)


def test_torchtitan_interleaved_schedule_gain():
    """torchtitan's December 2024 benchmark, Table 5 (planner/data/torchtitan_memory.toml, rows
    t5-*: Llama 3.1 405B on 512 H100, FSDP 8, TP 8, PP 8, 8 micro-batches of 4): 1F1B ran at
    100 tokens/s/GPU, Interleaved 1F1B (2 stages per rank) at 128, a 1.28x gain. Its H100s
    (96 GB HBM2e, 500 W) are not in the catalog, so only the ratio of the two schedules on
    the same machine is compared, costed on the catalog's H100 SXM: within 5%."""
    import test_torchtitan_memory as titan
    step, tps = {}, {}
    for row in titan.ROWS:
        if row["id"].startswith("t5-"):
            vp = row["plan"].get("vp", 1)
            step[vp], tps[vp] = titan.REPORTS[row["id"]].step_time_s, row["measured_tps"]
    assert tps[2] / tps[1] == 128 / 100              # (the table's figures)
    assert step[1] / step[2] == pytest.approx(tps[2] / tps[1], rel=0.05), step

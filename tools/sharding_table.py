"""The four data-parallel sharding modes of one plan side by side, and the exports of its HSDP
variant (issue 11's note). Run: ``python tools/sharding_table.py``.

Instance: a Llama-3-8B shape on 4 DGX H100 nodes, TP1 PP1 DP32, micro-batch 2, full recompute,
global batch 64 (one micro-batch per step), Megatron-LM's defaults (fp32 gradient reduction)."""

from __future__ import annotations

from planner.app.emit import FORMATS, emit
from planner.model.evaluate import evaluate
from planner.model.instance import parse_instance
from planner.model.plan import plan_from_spec
from planner.model.frameworks import SHARDING_MODES

DOC = {"model": {"preset": "llama3-8b"}, "training": {"global_batch": 64},
       "cluster": {"gpu": "h100-sxm", "nodes": 4},
       "plan": {"tp": 1, "pp": 1, "dp": 32, "micro_batch": 2, "recompute": "full"}}


def main() -> None:
    inst = parse_instance(DOC)
    print(f"{'dp_sharding':34s} {'memory GiB':>10s} {'dp_comm s':>10s} {'step s':>8s}  fits")
    for mode in SHARDING_MODES:
        for reshard in ((True, False) if mode == "optim_grads_params" else (None,)):
            rep = evaluate(inst, plan_from_spec(inst, inst.spec.plan, dp_sharding=mode,
                                                reshard_after_forward=reshard))
            label = mode + ("" if reshard is None else f" (reshard {'on' if reshard else 'off'})")
            print(f"{label:34s} {rep.memory_gib['total']:10.2f} {rep.breakdown_s['dp_comm']:10.4f} "
                  f"{rep.step_time_s:8.4f}  {rep.fits}")
    hsdp = plan_from_spec(inst, inst.spec.plan, dp_sharding="optim_grads_params",
                          dp_shard_size=8)
    rep = evaluate(inst, hsdp)
    print(f"\nHSDP dp_shard_size 8 x {hsdp.dp_replicate} replicas: memory "
          f"{rep.memory_gib['total']:.2f} GiB, dp_comm {rep.breakdown_s['dp_comm']:.4f} s, "
          f"step {rep.step_time_s:.4f} s")
    for fmt in FORMATS:
        print(f"\n--- --emit {fmt}")
        try:
            print(emit(inst, hsdp, fmt), end="")
        except Exception as exc:        # an export the framework cannot run names the rule
            print(f"error: {exc}")


if __name__ == "__main__":
    main()

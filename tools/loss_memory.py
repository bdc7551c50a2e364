"""Bytes per logit torchtitan's loss holds at its peak, measured on CPU with PyTorch's profiler.

The model charges ``planner.model.frameworks.logit_bytes`` per logit for the loss; under
torchtitan that is 12 bytes, 16 with tensor parallelism (its ``loss_parallel``). This script
measures both on CPU: bf16 logits from an output projection, torchtitan's
``F.cross_entropy(pred.flatten(0, 1).float(), labels)`` with ``del pred`` before the backward
(its train step), and the running total of the profiler's allocation events, in bytes per
logit, through the forward and the backward. ``--parallel`` runs the loss under DTensor's
``loss_parallel`` on a one-rank gloo mesh with vocabulary-sharded logits, as torchtitan does
under tensor parallelism.

It needs ``torch`` (not a dependency of this project): ``pip install torch`` then
``python tools/loss_memory.py [--parallel]``. Measured with torch 2.13 (CPU): eager, 4 bytes
per logit alive when the backward starts (log_softmax's saved fp32 output), a forward peak of
10 (the bf16 logits, their fp32 copy, log_softmax's output) and a backward peak of 12;
``--parallel``, a forward peak of 14 and a backward peak of 16.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile


def measure(parallel: bool, n: int = 4096, vocab: int = 8192, hidden: int = 16,
            compiled: bool = False) -> dict:
    """Bytes per logit alive at the start of the backward, and the forward and backward
    peaks, over the allocations after the inputs exist. ``compiled``: the loss under
    ``torch.compile`` (torchtitan compiles it with the model: components/loss.py
    ``build_cross_entropy_loss``), compiled and run once on the same shapes before the
    measured run."""
    import torch
    import torch.nn.functional as F
    from torch.profiler import ProfilerActivity, profile

    def loss_of(pred, y):
        return F.cross_entropy(pred.float(), y)

    loss_fn = torch.compile(loss_of) if compiled else loss_of

    torch.manual_seed(0)
    h = torch.randn(n, hidden, dtype=torch.bfloat16)
    w = torch.randn(vocab, hidden, dtype=torch.bfloat16)
    y = torch.randint(0, vocab, (n,))
    ctx = None
    if parallel:
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Replicate, Shard, distribute_tensor
        from torch.distributed.tensor.parallel import loss_parallel

        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29531")
        dist.init_process_group("gloo", rank=0, world_size=1)
        mesh = init_device_mesh("cpu", (1,))
        h = distribute_tensor(h, mesh, [Replicate()])
        w = distribute_tensor(w, mesh, [Shard(0)])          # the vocabulary over TP ranks
        y = distribute_tensor(y, mesh, [Replicate()])
        ctx = loss_parallel
    h.requires_grad_()
    w.requires_grad_()
    if compiled:                                             # compile outside the profile
        loss_fn(h @ w.t(), y).backward()
        h.grad = w.grad = None
    trace = os.path.join(tempfile.mkdtemp(), "trace.json")
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        with (ctx() if ctx else _Null()):
            pred = h @ w.t()                                 # bf16 logits
            loss = loss_fn(pred, y)
            del pred                                         # torchtitan's train step
            with torch.profiler.record_function("BACKWARD_START"):
                pass
            loss.backward()
    prof.export_chrome_trace(trace)
    if parallel:
        import torch.distributed as dist

        dist.destroy_process_group()
    events = sorted((e for e in json.load(open(trace))["traceEvents"] if "ts" in e),
                    key=lambda e: float(e["ts"]))
    logits = n * vocab
    total, at_backward, fwd, bwd, started = 0, None, 0, 0, False
    for e in events:
        if e.get("name") == "BACKWARD_START":
            started, at_backward = True, total
        if e.get("name") == "[memory]":
            total += e["args"]["Bytes"]
            if started:
                bwd = max(bwd, total)
            else:
                fwd = max(fwd, total)
    return {"at_backward_start": at_backward / logits, "forward_peak": fwd / logits,
            "backward_peak": bwd / logits}


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parallel", action="store_true",
                    help="DTensor loss_parallel (torchtitan under tensor parallelism)")
    ap.add_argument("--compiled", action="store_true",
                    help="the loss under torch.compile (torchtitan with compile on)")
    args = ap.parse_args()
    got = measure(args.parallel, compiled=args.compiled)
    kind = "loss_parallel" if args.parallel else "eager"
    print(f"{kind}{', compiled' if args.compiled else ''}: bytes per logit alive at the "
          f"backward's start {got['at_backward_start']:.2f}, forward peak "
          f"{got['forward_peak']:.2f}, backward peak {got['backward_peak']:.2f}")


if __name__ == "__main__":
    main()

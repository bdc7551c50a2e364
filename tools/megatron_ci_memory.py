"""Read the peak memory Megatron-LM's own CI measured, as rows of planner/data/megatron_ci_memory.toml.

Megatron-LM's functional tests (``tests/functional_tests/test_cases/<model>/<case>/``) each
give a ``model_config.yaml`` (the ``pretrain_gpt.py`` arguments) and golden values per
platform (``golden_values_<env>_<platform>.json``). With ``--log-memory-to-tensorboard``,
``megatron/training/training.py`` (``training_log``) records ``mem-max-allocated-bytes``,
``torch.cuda.memory_stats()["allocated_bytes.all.peak"]``: the caching allocator's peak of live
tensors since the process started, on the rank that owns the TensorBoard writer, the last one
(``global_vars._set_tensorboard_writer``: ``args.rank == world_size - 1``), so the last
pipeline stage. The value at the last logged iteration includes the optimizer states (made at
the first step). ``mem-allocated-bytes`` (``allocated_bytes.all.current``, logged after the
step) is what stays allocated between steps: the weights, gradients and optimizer states
(``measured_static_GiB``). A case whose launch sets ``PYTORCH_CUDA_ALLOC_CONF=
expandable_segments:True`` (its ``ENV_VARS``) gets ``[training] expandable_segments``.

The world size of a case on a platform is its recipe's ``nodes x gpus``
(``tests/test_utils/recipes/*/*.yaml``: one node of 8 GPUs on DGX A100 / H100; two trays of 4
on GB200, one tray for the ``*_1node`` cases). A case no recipe runs any more on that platform
(golden values kept from earlier runs) is taken to have run on the world size of its folder's
main recipe (``h100/gpt.yaml`` and ``h100/moe.yaml``: 8 GPUs on DGX A100 and H100;
``gb200/gpt.yaml``, ``gb200/moe.yaml``: 8 on GB200), an assumption the data file states.

This script prints one ``[[runs]]`` table per case and platform it can express in the planner's
keys, and says on stderr why it leaves each other case out. Kept: test type ``regular`` (the
``*resume*`` types measure a process that resumed mid-run), ``dev`` golden values on DGX A100,
H100 and GB200, bf16, fp16 or FP8 (``hybrid``: tensorwise, delayed or MXFP8) under Transformer
Engine, dense models and MoE models on the ``alltoall`` dispatcher with expert tensor
parallelism 1 (:func:`moe_keys`). Left out: arguments whose
memory the planner does not cost (a list below), and a case whose attention kernel is not
known: ``--attention-backend auto`` (the default) picks flash / cuDNN or the unfused kernel by
what the environment supports, so such a case is kept only where the score tensors the unfused
kernel would hold for one micro-batch on the last stage alone exceed the measured peak (it
cannot have run).

Argument mapping (Megatron-LM d98e8a64dd): vocabulary 50,257 for the GPT-2 BPE files, else
``--vocab-size``, padded to a multiple of ``--make-vocab-size-divisible-by`` (128) times the
tensor-parallel size (``megatron/core/tokenizers/utils/build_tokenizer.py``
``vocab_size_with_padding``); MLP width ``--ffn-hidden-size``, else ``4 h``, or ``int(8 h / 3 /
64) * 64`` with ``--swiglu`` (``arguments.py``); dropout as ``--hidden-dropout`` (default 0.1,
``transformer_config.py``); data parallelism ``world / (tp pp cp)``; MLA's ranks and head
widths, the prediction depths, the experts as given; Megatron-Core's native fused cross-entropy
holds what the unfused one does at the peak (the 16-bit logits and their fp32 copy,
``fused_cross_entropy.py``), so it is costed as the default.

Needs PyYAML and a Megatron-LM checkout (a bare mirror works)::

    python tools/megatron_ci_memory.py --megatron-lm /path/to/Megatron-LM [--rev HEAD]
"""

from __future__ import annotations

import argparse
import json
import math
import re
import subprocess
import sys

from planner.model.words import toml_value

PLATFORMS = {"dgx_a100": "a100-80gb", "dgx_h100": "h100-sxm", "dgx_gb200": "gb200"}
GPT2_BPE_VOCAB = 50257
#: arguments whose memory the planner does not cost the way Megatron-LM runs them
NOT_COSTED = ("--fp4-format", "--spec", "--hybrid-override-pattern",
              "--encoder-num-layers", "--use-torch-fsdp2", "--use-megatron-fsdp",
              "--num-distributed-optimizer-instances", "--defer-embedding-wgrad-compute",
              "--microbatch-group-size-per-virtual-pipeline-stage", "--tp-comm-overlap",
              "--cuda-graph-impl", "--external-cuda-graph", "--enable-cuda-graph",
              "--fine-grained-activation-offloading", "--cpu-offloading", "--recompute-method",
              "--recompute-modules", "--decoder-first-pipeline-num-layers",
              "--decoder-last-pipeline-num-layers", "--pipeline-model-parallel-layout",
              "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split",
              "--finetune", "--use-precision-aware-optimizer",
              "--optimizer-cpu-offload", "--overlap-moe-expert-parallel-comm",
              "--delay-wgrad-compute", "--moe-expert-capacity-factor", "--moe-use-legacy-grouped-gemm",
              "--use-transformer-engine-op-fuser", "--moe-router-fusion", "--moe-paged-stash")


def git(repo: str, *args: str) -> str:
    return subprocess.run(["git", "-C", repo, *args], capture_output=True, text=True,
                          check=True).stdout


def padded_vocab(a: dict, tp: int) -> int:
    vocab = int(a["--vocab-size"]) if a.get("--vocab-size") else GPT2_BPE_VOCAB
    multiple = int(a.get("--make-vocab-size-divisible-by", 128)) * tp
    return math.ceil(vocab / multiple) * multiple


def world_sizes(repo: str, rev: str, yaml) -> tuple[dict[tuple[str, str], int],
                                                    dict[tuple[str, str], set[int]]]:
    """(case, platform) -> GPUs, from the recipes that run the case's dev golden values; and
    (model folder, platform) -> the world size of the folder's main recipe (``<model>.yaml``)
    on that platform, which a case no recipe runs any more takes."""
    out, by_model = {}, {}
    files = git(repo, "ls-tree", "-r", "--name-only", rev, "tests/test_utils/recipes").split()
    for f in files:
        if not f.endswith(".yaml"):
            continue
        recipe = yaml.safe_load(git(repo, "show", f"{rev}:{f}")) or {}
        spec = recipe.get("spec") or {}
        if not isinstance(spec, dict) or "nodes" not in spec or "gpus" not in spec:
            continue
        default = spec.get("platforms", [])
        default = [default] if isinstance(default, str) else default
        world = int(spec["nodes"]) * int(spec["gpus"])
        named = {pl for group in recipe.get("products") or []
                 for prod in group.get("products") or []
                 for pl in prod.get("platforms", default)}
        if f.rsplit("/", 1)[-1] == f"{spec.get('model')}.yaml":   # the folder's main recipe
            for platform in named:
                by_model.setdefault((spec.get("model"), platform), set()).add(world)
        for group in recipe.get("products") or []:
            for prod in group.get("products") or []:
                if "dev" not in prod.get("environment", []):
                    continue
                for platform in prod.get("platforms", default):
                    for case in group.get("test_case", []):
                        out[(case, platform)] = world
    return out, by_model


def moe_keys(a: dict, tp: int, layers: int) -> tuple[dict | None, str]:
    """The MoE keys of a case the planner costs: the ``alltoall`` dispatcher (Megatron-Core's
    default is ``allgather``), expert tensor parallelism 1 (its default is the tensor-parallel
    size), grouped GEMM experts, dense layers only at the front. Left to the model's defaults
    (uncounted, a few hundred bytes a token at most): the router's dtype, the auxiliary loss,
    the fused permutation, the grouped top-k."""
    if a.get("--moe-token-dispatcher-type") != "alltoall":
        return None, "not costed: MoE dispatcher " + str(a.get("--moe-token-dispatcher-type",
                                                              "allgather (the default)"))
    if int(a.get("--expert-tensor-parallel-size", tp)) != 1:
        return None, "not costed: expert tensor parallelism"
    if not a.get("--moe-grouped-gemm"):
        return None, "not costed: sequential experts"
    experts, ffn = int(a["--num-experts"]), int(a.get("--moe-ffn-hidden-size")
                                                  or a.get("--ffn-hidden-size") or 0)
    keys = {"experts": experts, "top_k": int(a.get("--moe-router-topk", 2))}
    if ffn:
        keys["moe_ffn_hidden"] = ffn
    shared = int(a.get("--moe-shared-expert-intermediate-size") or 0)
    if shared:
        if not ffn or shared % ffn:
            return None, "not costed: a shared expert width that is not whole experts"
        keys["shared_experts"] = shared // ffn
    freq = str(a.get("--moe-layer-freq", "")).replace(" ", "")
    if freq:
        m = re.fullmatch(r"\(\[0\]\*(\d+)\+\[1\]\*(\d+)\)", freq)
        if not m or int(m[1]) + int(m[2]) != layers:
            return None, f"not costed: --moe-layer-freq {freq}"
        keys["first_dense_layers"] = int(m[1])
    return keys, ""


def row(case: str, platform: str, a: dict, peak: float, gpus: int, env: dict | None = None
        ) -> tuple[dict | None, str]:
    """The run table of one case, or None and why not (``env``: the case's ENV_VARS)."""
    if a.get("--transformer-impl", "transformer_engine") != "transformer_engine":
        return None, "not Transformer Engine"
    if not (a.get("--bf16") or a.get("--fp16")):
        return None, "fp32"
    hit = [k for k in NOT_COSTED if a.get(k) not in (None, False)]
    if hit:
        return None, "not costed: " + ", ".join(hit)
    if a.get("--cross-entropy-loss-fusion") and a.get("--cross-entropy-fusion-impl") == "te":
        return None, "not costed: Transformer Engine's cross-entropy"
    tp = int(a.get("--tensor-model-parallel-size", 1))
    pp = int(a.get("--pipeline-model-parallel-size") or 1)
    cp = int(a.get("--context-parallel-size", 1))
    if gpus % (tp * pp * cp):
        return None, f"degrees do not divide {gpus} GPUs"
    h, layers, heads = int(a["--hidden-size"]), int(a["--num-layers"]), int(a["--num-attention-heads"])
    seq, mb = int(a["--seq-length"]), int(a["--micro-batch-size"])
    backend = a.get("--attention-backend", "auto")
    if backend not in ("auto", "flash", "fused", "unfused"):
        return None, f"not costed: --attention-backend {backend}"
    if backend == "auto":
        # what the unfused kernel would hold on the last stage for one micro-batch: per layer
        # the softmax output (2 bytes) and, with attention dropout, its mask (1) and output (2)
        # of every score (Korthikanti et al. 2022, Sec. 4.1: 5 a s^2 b bytes)
        per_score = 5 if float(a.get("--attention-dropout", 0.1)) > 0 else 2
        scores = per_score * mb * heads / tp * (seq / cp) * seq * layers / pp
        if scores < peak:
            return None, "attention kernel not known (--attention-backend auto)"
    position = a.get("--position-embedding-type",
                     "rope" if a.get("--use-rotary-position-embeddings") else "learned_absolute")
    if position not in ("rope", "learned_absolute"):
        return None, f"not costed: --position-embedding-type {position}"
    model = {"layers": layers, "hidden": h, "heads": heads, "vocab": padded_vocab(a, tp),
             "seq_len": seq, "tied_embeddings": not a.get("--untie-embeddings-and-output-weights"),
             "position_embedding": "rope" if position == "rope" else "learned",
             "dropout": float(a.get("--hidden-dropout", 0.1)) > 0,
             "gated_mlp": bool(a.get("--swiglu"))}
    if a.get("--squared-relu") and not a.get("--swiglu"):
        model["activation"] = "squared_relu"
    # the norms and biases (TransformerConfig normalization, add_bias_linear, add_qkv_bias;
    # validate_args sets add_qkv_bias with add_bias_linear)
    if a.get("--normalization", "LayerNorm") == "RMSNorm":
        model["normalization"] = "rmsnorm"
    if a.get("--disable-bias-linear"):
        model["linear_bias"] = False
        if a.get("--add-qkv-bias") and not a.get("--multi-latent-attention"):
            model["qkv_bias"] = True
    if a.get("--qk-layernorm") and not a.get("--multi-latent-attention"):
        model["qk_norm"] = True
    if a.get("--ffn-hidden-size"):
        model["ffn_hidden"] = int(a["--ffn-hidden-size"])
    elif a.get("--swiglu"):
        model["ffn_hidden"] = int(4 * h * 2 / 3 / 64) * 64
    if a.get("--group-query-attention"):
        model["kv_heads"] = int(a["--num-query-groups"])
    if a.get("--kv-channels") and not a.get("--multi-latent-attention"):
        model["head_dim"] = int(a["--kv-channels"])
    if a.get("--multi-latent-attention"):
        for key in ("kv_lora_rank", "q_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim",
                    "v_head_dim"):
            if a.get("--" + key.replace("_", "-")):
                model[key] = int(a["--" + key.replace("_", "-")])
    if a.get("--mtp-num-layers"):
        model["mtp_layers"] = int(a["--mtp-num-layers"])
    ep = 1
    if a.get("--num-experts"):
        moe, why = moe_keys(a, tp, layers)
        if moe is None:
            return None, why
        model.update(moe)
        ep = int(a.get("--expert-model-parallel-size", 1))
    plan = {"tp": tp, "pp": pp, "dp": gpus // (tp * pp * cp), "cp": cp, "micro_batch": mb,
            "global_batch": int(a["--global-batch-size"]),
            "recompute": a.get("--recompute-granularity") or "none",
            "sequence_parallel": bool(a.get("--sequence-parallel")),
            "distributed_optimizer": bool(a.get("--use-distributed-optimizer")),
            "overlap_grad_reduce": bool(a.get("--overlap-grad-reduce")),
            "overlap_param_gather": bool(a.get("--overlap-param-gather"))}
    if ep > 1:
        plan["ep"] = ep
    if a.get("--num-layers-per-virtual-pipeline-stage"):
        plan["vp"] = layers // pp // int(a["--num-layers-per-virtual-pipeline-stage"])
    elif a.get("--num-virtual-stages-per-pipeline-rank"):
        plan["vp"] = int(a["--num-virtual-stages-per-pipeline-rank"])
    training = {"precision": "bf16" if a.get("--bf16") else "fp16",
                "flash_attention": backend != "unfused"}
    if "expandable_segments:True" in str((env or {}).get("PYTORCH_CUDA_ALLOC_CONF", "")):
        training["expandable_segments"] = True
    if a.get("--fp8-format"):
        recipe = a.get("--fp8-recipe", "delayed")
        if a["--fp8-format"] != "hybrid" or recipe not in ("tensorwise", "delayed", "mxfp8"):
            return None, f"not costed: FP8 {a['--fp8-format']} {recipe}"
        training.update(precision="fp8", fp8_recipe=recipe)
        if a.get("--fp8-param-gather"):
            training["fp8_param_gather"] = True
    return {"id": f"{case}-{platform.removeprefix('dgx_')}", "test_case": case,
            "gpu": PLATFORMS[platform], "gpus": gpus, "model": model, "plan": plan, "training": training,
            "measured_GiB": round(peak / 2**30, 4)}, ""


def last_value(golden: dict, metric: str) -> float | None:
    """A metric's value at the last iteration that logged a finite one, or None."""
    values = golden.get(metric)
    if not isinstance(values, dict) or not isinstance(values.get("values"), dict):
        return None
    finite = [(int(k), float(v)) for k, v in values["values"].items()
              if isinstance(v, (int, float)) and math.isfinite(v)]
    return max(finite)[1] if finite else None


def main() -> int:
    import yaml

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--megatron-lm", required=True, help="a Megatron-LM checkout or bare mirror")
    ap.add_argument("--rev", default="HEAD")
    args = ap.parse_args()
    repo, rev = args.megatron_lm, args.rev
    base = "tests/functional_tests/test_cases/"
    files = git(repo, "ls-tree", "-r", "--name-only", rev, base + "gpt", base + "moe").split()
    print(f"# Megatron-LM {git(repo, 'rev-parse', rev).strip()}")
    worlds, by_model = world_sizes(repo, rev, yaml)
    for cfg in sorted(f for f in files if f.endswith("/model_config.yaml")):
        folder = cfg.rsplit("/", 1)[0]
        case = folder.rsplit("/", 1)[1]
        conf = yaml.safe_load(git(repo, "show", f"{rev}:{cfg}")) or {}
        if conf.get("TEST_TYPE") != "regular":
            print(f"{case}: test type {conf.get('TEST_TYPE')}", file=sys.stderr)
            continue
        a = conf.get("MODEL_ARGS") or {}
        for platform in PLATFORMS:
            gold = f"{folder}/golden_values_dev_{platform}.json"
            if gold not in files:
                continue
            golden = json.loads(git(repo, "show", f"{rev}:{gold}"))
            peak, static = last_value(golden, "mem-max-allocated-bytes"), \
                last_value(golden, "mem-allocated-bytes")
            if peak is None:
                continue
            world = worlds.get((case, platform))
            sizes = by_model.get((folder.split("/")[-2], platform), set())
            if world is None and len(sizes) == 1:
                world = next(iter(sizes))       # the one world size of the folder's recipes
            if world is None:
                print(f"{case} ({platform}): no recipe runs it, nor does the main one name "
                      "the platform", file=sys.stderr)
                continue
            r, why = row(case, platform, a, peak, world, conf.get("ENV_VARS"))
            if r is None:
                print(f"{case} ({platform}): {why}", file=sys.stderr)
                continue
            print("\n[[runs]]")
            for key in ("id", "test_case", "gpu", "gpus", "model", "plan", "training"):
                print(f"{key} = {toml_value(r[key])}")
            print(f"measured_GiB = {r['measured_GiB']}")
            if static is not None:
                print(f"measured_static_GiB = {round(static / 2**30, 4)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Megatron-Core as an independent check of the planner's parameter counts, on CPU.

For each case of tests/data/megatron_param_counts.toml (small models covering the model keys:
norms, biases, the QK norm, squared ReLU, GQA, MoE with shared experts and dense layers,
multi-head latent attention, multi-token prediction) it builds Megatron-Core's ``GPTModel`` with
tensor, pipeline and expert parallelism 1 on a single-process gloo group, the way Megatron-LM's
``gpt_builders`` does with ``--transformer-impl local``, and compares ``sum(p.numel() for p in
model.parameters())`` with the count the file records and with the planner's
``Shape.of(ModelSpec(**keys)).total_params``. Not part of the test suite: it needs torch and a
Megatron-LM checkout (Megatron-LM is not on PyPI); the suite checks the planner against the
recorded counts (tests/test_norms_biases.py). The cases with ``refused`` are ones Megatron-Core
does not build, and must stay refused.

Run::

    python tools/megatron_params.py --megatron-lm PATH/TO/Megatron-LM [-v]

``-v`` prints Megatron's parameters per module kind. Exit status 0 when every built case agrees
with its recorded count and the planner's, to the parameter, and every refused case is refused.
"""
import os  # noqa: E402
import sys  # noqa: E402
import warnings  # noqa: E402
import tomllib  # noqa: E402
from collections import Counter  # noqa: E402
from pathlib import Path  # noqa: E402

if "--megatron-lm" not in sys.argv[:-1]:
    raise SystemExit("usage: python tools/megatron_params.py --megatron-lm PATH [-v]")
sys.path.insert(0, sys.argv[sys.argv.index("--megatron-lm") + 1])
warnings.simplefilter("ignore")
os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import torch.distributed as dist  # noqa: E402

from megatron.core import parallel_state  # noqa: E402
from megatron.core.activations import squared_relu  # noqa: E402
from megatron.core.models.gpt import GPTModel  # noqa: E402
from megatron.core.models.gpt.gpt_layer_specs import (  # noqa: E402
    get_gpt_decoder_block_spec,
    get_gpt_decoder_layer_specs,
    get_gpt_layer_local_spec,
    get_gpt_mtp_block_spec,
)
from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig  # noqa: E402

import megatron.core.models.backends as _backends  # noqa: E402
import megatron.core.models.gpt.gpt_layer_specs as _specs_mod  # noqa: E402
import megatron.core.transformer.multi_latent_attention as _mla_mod  # noqa: E402
import megatron.core.transformer.multi_token_prediction as _mtp_mod  # noqa: E402
from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding  # noqa: E402

from megatron.core.tensor_parallel.layers import ColumnParallelLinear  # noqa: E402
from megatron.core.transformer.identity_op import IdentityOp  # noqa: E402
from megatron.core.transformer.torch_norm import WrappedTorchNorm  # noqa: E402

from planner.app.emit import norm_bias_config  # noqa: E402
from planner.model.schema import ModelSpec  # noqa: E402


# Two CPU / no-Transformer-Engine workarounds; neither touches a parameter:
# 1. MLASelfAttention builds RotaryEmbedding without use_cpu_initialization
#    (multi_latent_attention.py:182), whose inv_freq (a plain tensor, no parameter) then goes to
#    torch.cuda.current_device() (rotary_pos_embedding.py:78).
class _CPURotaryEmbedding(RotaryEmbedding):
    def __init__(self, *args, **kwargs):
        kwargs["use_cpu_initialization"] = True
        super().__init__(*args, **kwargs)


_mla_mod.RotaryEmbedding = _CPURotaryEmbedding
# 2. MultiTokenPredictionLayer calls is_inference_column_parallel_linear(eh_proj)
#    (multi_token_prediction.py:1193), an isinstance against InferenceLayerNormColumnParallelLinear,
#    which without Transformer Engine is not a type (inference_layers.py:564): a local eh_proj is
#    never an inference layer, so False is its answer.
_mtp_mod.is_inference_column_parallel_linear = lambda module: False


# 3. The local spec's MLA passes k_channels / v_channels to its core attention
#    (multi_latent_attention.py:214-215), which the local DotProductAttention does not take
#    (dot_product_attention.py:42-52; TE's TEDotProductAttention does). DotProductAttention holds
#    no parameter at the default softmax_type ("vanilla": softmax_offset None,
#    dot_product_attention.py:119), so the widths are dropped for the count.
class _MLACoreAttention(_backends.DotProductAttention):
    def __init__(self, *args, k_channels=None, v_channels=None, **kwargs):
        super().__init__(*args, **kwargs)


class _LocalSpecProviderForMLA(_backends.LocalSpecProvider):
    def core_attention(self):
        return _MLACoreAttention


_specs_mod.LocalSpecProvider = _LocalSpecProviderForMLA


# Transformer Engine emulation, for MLA without q_lora_rank only ("te_mla" cases): the local
# backend has no fused norm+linear (backends.py:114-116), and MLA's Q/KV-norm resolver
# (mla_qk_norm_config.py) then refuses qk_layernorm without q_lora_rank whichever way the local
# spec is written (explicit q_layernorm: _raise_unused_q_norm; none: _require_linear(None)).
# The TE spec (gpt_layer_specs.py:301-309) passes linear_q_proj=TEColumnParallelLinear with
# q_layernorm = kv_layernorm = IdentityOp, and the resolver (_resolve_mla_qk_layernorm) swaps in
# the backend's fused TELayerNormColumnParallelLinear for linear_q_proj and linear_kv_up_proj:
# a norm of the layer's input (layer_norm_weight, + layer_norm_bias for LayerNorm) inside each.
# _NormColumnParallelLinear holds the same parameters with local modules.
class _NormColumnParallelLinear(ColumnParallelLinear):
    def __init__(self, input_size, output_size, *, config, **kwargs):
        super().__init__(input_size, output_size, config=config, **kwargs)
        self.layer_norm = WrappedTorchNorm(config=config, hidden_size=input_size)


class _TEEmulatingProvider(_LocalSpecProviderForMLA):
    def column_parallel_layer_norm_linear(self):
        return _NormColumnParallelLinear


def _te_style_mla(layer_specs):
    """The TE spec's MLA submodules (norms left to the resolver) on local modules."""
    for ls in layer_specs:
        sub = ls.submodules.self_attention.submodules
        sub.q_layernorm = IdentityOp
        sub.kv_layernorm = IdentityOp
from planner.model.workload import Shape  # noqa: E402

VERBOSE = "-v" in sys.argv


def megatron_config(m: ModelSpec):
    """TransformerConfig / MLATransformerConfig with the fields the planner's keys mean (the
    norm and bias fields are the exports' own, planner.app.emit.norm_bias_config)."""
    kw = dict(
        num_layers=m.layers,
        hidden_size=m.hidden,
        num_attention_heads=m.heads,
        ffn_hidden_size=m.ffn,
        **norm_bias_config(m),
        gated_linear_unit=m.gated_mlp,
        activation_func=(F.silu if m.gated_mlp
                         else squared_relu if m.activation == "squared_relu" else F.gelu),
        bias_activation_fusion=False,      # (CPU; no effect on parameters)
        bias_dropout_fusion=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        use_cpu_initialization=True,
        transformer_impl="local",          # (Megatron-LM --transformer-impl local)
        params_dtype=torch.float32,
    )
    # (Megatron-LM's validate_args sets add_qkv_bias whenever add_bias_linear is set)
    kw["add_qkv_bias"] = kw["add_qkv_bias"] or kw["add_bias_linear"]
    if not m.mla:
        kw["num_query_groups"] = m.kv
        if m.head_dim is not None:
            kw["kv_channels"] = m.head_dim
    if m.moe:
        d, n = m.first_dense_layers, m.moe_layer_interval
        pattern = [int(i >= d and (i - d) % n == 0) for i in range(m.layers)]
        kw.update(num_moe_experts=m.experts, moe_router_topk=m.top_k,
                  moe_ffn_hidden_size=m.moe_ffn, moe_layer_freq=pattern,
                  moe_grouped_gemm=False, moe_token_dispatcher_type="allgather")
        if m.shared_experts:
            kw["moe_shared_expert_intermediate_size"] = m.shared_experts * m.moe_ffn
    if m.mtp_layers:
        kw["mtp_num_layers"] = m.mtp_layers
    if m.mla:
        kw.update(multi_latent_attention=True, q_lora_rank=m.q_lora_rank,
                  kv_lora_rank=m.kv_lora_rank, qk_head_dim=m.qk_head_dim,
                  qk_pos_emb_head_dim=m.qk_pos_emb_head_dim, v_head_dim=m.v_head_dim,
                  rope_type="rope")
        return MLATransformerConfig(**kw)
    return TransformerConfig(**kw)


def build(m: ModelSpec, te_mla: bool = False) -> GPTModel:
    """As Megatron-LM's gpt_builders.gpt_builder does with --transformer-impl local (te_mla:
    MLA's norms placed as the Transformer Engine spec places them, see above)."""
    if te_mla:
        saved = _backends.LocalSpecProvider
        _backends.LocalSpecProvider = _TEEmulatingProvider     # (what get_backend("local") makes)
        try:
            return build(m)
        finally:
            _backends.LocalSpecProvider = saved
    cfg = megatron_config(m)
    norm = cfg.normalization
    if m.moe:
        layer_spec = get_gpt_decoder_block_spec(cfg, use_transformer_engine=False,
                                                normalization=norm)
    else:
        layer_spec = get_gpt_layer_local_spec(None, False, cfg.qk_layernorm,
                                              cfg.multi_latent_attention, normalization=norm)
    te = _backends.LocalSpecProvider is _TEEmulatingProvider
    if te:
        _te_style_mla(layer_spec.layer_specs if m.moe else [layer_spec])
    mtp_spec = None
    if m.mtp_layers:
        last = get_gpt_decoder_layer_specs(cfg, use_transformer_engine=False,
                                           normalization=norm)[-1]
        if te:
            _te_style_mla([last])
        mtp_spec = get_gpt_mtp_block_spec(cfg, last, use_transformer_engine=False)
    return GPTModel(
        config=cfg,
        transformer_layer_spec=layer_spec,
        vocab_size=m.vocab,
        max_sequence_length=m.seq_len,
        pre_process=True,
        post_process=True,
        share_embeddings_and_output_weights=m.tied_embeddings,
        position_embedding_type=("learned_absolute" if m.position_embedding == "learned" else "rope"),
        mtp_block_spec=mtp_spec,
    )


def kinds(model) -> Counter:
    """Parameters by name with layer numbers stripped (for -v)."""
    c = Counter()
    for name, p in model.named_parameters():
        parts = [x for x in name.split(".") if not x.isdigit()]
        c[".".join(parts)] += p.numel()
    return c


#: the cases and the counts recorded from this script's earlier run
CASES_FILE = Path(__file__).resolve().parent.parent / "tests" / "data" / "megatron_param_counts.toml"


def main():
    cases = tomllib.loads(CASES_FILE.read_text())["cases"]
    dist.init_process_group("gloo", rank=0, world_size=1, init_method="tcp://127.0.0.1:29533")
    parallel_state.initialize_model_parallel(1, 1)
    torch.manual_seed(0)
    rows = []
    for case in cases:
        name = case["name"]
        m = ModelSpec(**case["model"])
        planner = Shape.of(m).total_params
        try:
            model = build(m, te_mla=case.get("te_mla", False))
        except Exception as e:  # noqa: BLE001 - a refusal is reported, the next case goes on
            rows.append((case, f"refused: {type(e).__name__}: {e}".splitlines()[0][:100],
                         planner))
            continue
        count = sum(p.numel() for p in model.parameters())
        rows.append((case, count, planner))
        if VERBOSE:
            print(f"--- {name}")
            for k, v in sorted(kinds(model).items()):
                print(f"    {v:>10,}  {k}")
        del model
    w = max(len(c["name"]) for c, _, _ in rows)
    print(f"{'case':<{w}} | {'Megatron':>10} | {'recorded':>10} | {'planner':>10}")
    bad = 0
    for case, count, planner in rows:
        recorded = case.get("megatron_params")
        if isinstance(count, int):
            bad += count != recorded or planner != count
            print(f"{case['name']:<{w}} | {count:>10,} | {recorded or 0:>10,} | {planner:>10,.0f}")
        else:
            bad += "refused" not in case
            print(f"{case['name']:<{w}} | {count}")
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()
    print("every count agrees" if not bad else f"{bad} case(s) disagree")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()

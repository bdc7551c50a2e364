"""What one transformer layer costs: FLOPs, HBM traffic, parameters and stored activations.

Quantities are per GPU and per micro-batch, for ``b`` sequences of ``s / cp`` tokens on a tensor
group of ``t``. They depend on the model shape only through :class:`Shape`, and are plain
arithmetic on ``t``, ``c``, ``b`` so numbers, arrays and symbols all work.

Sources: FLOPs follow Narayanan et al. 2021 (arXiv 2104.04473) Sec. 5.1 / Eq. 3 and their
generalisation in Megatron-LM ``num_floating_point_operations`` (GQA, gated MLP); stored
activations follow Korthikanti et al. 2022 (arXiv 2205.05198) Sec. 4 and Table 2, generalised
to GQA and gated MLPs term by term. Multi-head latent attention (DeepSeek-V2 / V3) follows
Megatron-Core's ``MLASelfAttention`` module by module (docs/model.md, "Multi-head latent
attention"); its projections match Megatron-LM's ``num_floating_point_operations`` MLA branch.
All tensors are 16-bit (2 bytes) unless stated.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.model.schema import ModelSpec


def window_share(s: int, left: int | None) -> float:
    """The keys a sliding-window layer's queries attend to, over full causal attention's:
    query ``i`` (from 0) attends to keys ``max(0, i - left) .. i`` (Megatron-Core's window
    ``(left, 0)``; FlashAttention's ``window_size``), ``sum_i min(i, left) + 1`` keys against
    ``s (s + 1) / 2``; 1 without a window or when the window covers the sequence.

    >>> window_share(4096, 4095), round(window_share(4096, 127), 5)
    (1.0, 0.06152)
    """
    if left is None or left >= s - 1:
        return 1.0
    keys = left * (left + 1) / 2 + (s - left) * (left + 1)
    return keys / (s * (s + 1) / 2)


@dataclass(frozen=True)
class Shape:
    """Model shape in the notation of the papers: L layers, h hidden, a heads, k kv heads,
    f MLP width, V vocab, s sequence length."""

    L: int
    h: int
    a: int
    k: int
    f: int
    V: int
    s: int
    gated: bool
    tied: bool
    learned_pos: bool
    dropout: bool
    experts: int = 0          # routed experts per MoE layer (0 = dense)
    top_k: int = 0
    f_e: int = 0              # width of one expert
    shared: int = 0           # shared experts per MoE layer
    n_moe: int = 0            # MoE layers
    d: int = 0                # width of one attention head (0: h / a); MLA: without RoPE
    kv_lora: int = 0          # MLA: rank of the compressed keys / values (0: not MLA)
    q_lora: int = 0           # MLA: rank of the compressed queries (0: projected directly)
    d_rope: int = 0           # MLA: RoPE part of a query / key head
    d_v: int = 0              # MLA: width of a value head
    mtp: int = 0              # multi-token prediction depths (on the last pipeline stage)
    mtp_moe: bool = False     # ... each a layer of the last decoder layer's kind
    norm_w: int = 2           # parameters per element of a norm: 2 LayerNorm, 1 RMSNorm
    bias: bool = True         # biases on the linear layers (attention, MLP, experts)
    qkv_bias: bool = True     # ... on the QKV projection (alone when bias is False)
    qk_norm: bool = False     # a norm on each query and key head (Qwen3; Llama 4's L2 norm)
    qk_l2: bool = False       # ... the L2 norm: no weights
    # under a sliding window: a windowed layer's attention core relative to full causal
    # attention's (window_share), and which layers attend in full (1; empty without a window)
    window_layer_share: float = 1.0
    full_marks: tuple[int, ...] = ()

    @staticmethod
    def of(m: ModelSpec) -> Shape:
        if m.mla:
            mla = dict(d=m.qk_head_dim, kv_lora=m.kv_lora_rank, q_lora=m.q_lora_rank or 0,
                       d_rope=m.qk_pos_emb_head_dim, d_v=m.v_head_dim)
        else:
            mla = dict(d=m.head_dim or 0)
        return Shape(L=m.layers, h=m.hidden, a=m.heads, k=m.kv, f=m.ffn, V=m.vocab, s=m.seq_len,
                     gated=m.gated_mlp, tied=m.tied_embeddings,
                     learned_pos=m.position_embedding == "learned", dropout=m.dropout,
                experts=m.experts if m.moe else 0, top_k=m.top_k if m.moe else 0,
                f_e=m.moe_ffn if m.moe else 0,
                shared=m.shared_experts if m.moe else 0, n_moe=m.moe_layers,
                mtp=m.mtp_layers, mtp_moe=m.last_layer_moe,
                norm_w=2 if m.normalization == "layernorm" else 1, bias=m.linear_bias,
                qkv_bias=m.has_qkv_bias, qk_norm=m.qk_norm or m.qk_l2_norm,
                qk_l2=m.qk_l2_norm, window_layer_share=window_share(m.seq_len, m.window_left),
                full_marks=tuple(int(not w) for w in m.windowed_layers) if m.windowed else (),
                **mla)

    # sliding window --------------------------------------------------------------------------
    @property
    def full_share(self) -> float:
        """The share of the decoder layers that attend in full under a window (1 without)."""
        return sum(self.full_marks) / self.L if self.full_marks else 1.0

    @property
    def attn_share(self) -> float:
        """The fused attention core's work relative to every layer attending causally in
        full: :func:`window_share` averaged over the layers, full-attention layers at 1."""
        return self.full_share + (1 - self.full_share) * self.window_layer_share

    # attention widths ----------------------------------------------------------------------
    @property
    def mla(self) -> bool:
        return self.kv_lora > 0

    @property
    def q(self) -> float:
        """Width of the queries: ``a d``, ``h`` by default; MLA ``a (d + d_rope)``."""
        if self.mla:
            return self.a * (self.d + self.d_rope)
        return self.a * self.d if self.d else self.h

    @property
    def kv_w(self) -> float:
        """Width of the keys (and of the values) of grouped-query attention: ``k d``,
        ``h k / a`` by default (MLA: :attr:`k_w`, :attr:`v_w`)."""
        return self.k * self.d if self.d else self.h * self.k / self.a

    @property
    def k_w(self) -> float:
        """Width of the keys the attention core reads: :attr:`kv_w`; MLA ``a (d + d_rope)``
        (every head's key, up-projected from the compressed one)."""
        return self.q if self.mla else self.kv_w

    @property
    def v_w(self) -> float:
        """Width of the values: :attr:`kv_w`; MLA ``a d_v``."""
        return self.a * self.d_v if self.mla else self.kv_w

    @property
    def o_w(self) -> float:
        """Width of the attention output (the projection's input): :attr:`q`; MLA ``a d_v``."""
        return self.a * self.d_v if self.mla else self.q

    @property
    def lora_w(self) -> int:
        """MLA: the compressed widths a token carries into the up-projections (``q_lora +
        kv_lora``), each with its layer norm; 0 otherwise."""
        return self.q_lora + self.kv_lora

    @property
    def attn_gather_w(self) -> float:
        """Width of what the attention's column-parallel layers gather over the tensor group
        (sequence parallelism) or reduce in the backward: the hidden state, ``h``; MLA the
        compressed query (or the hidden state without ``q_lora``), the compressed key / value
        and the shared RoPE key, ``q_lora + kv_lora + d_rope`` (Megatron-Core
        ``MLASelfAttention``: the down-projections are duplicated on each rank's sequence
        shard)."""
        if not self.mla:
            return self.h
        return (self.q_lora or self.h) + self.kv_lora + self.d_rope

    def attn_gemms(self, tokens, t, shard) -> list[tuple]:
        """The attention's linear layers on one GPU as ``(M, N, K, count)`` (``M`` tokens,
        ``N x K`` the weight shard) for ``tokens`` tokens on a tensor group of ``t``,
        ``shard`` = ``t`` under sequence parallelism, else 1: the fused QKV and the output
        projection; MLA (in Megatron-Core's order) the query down-projection (duplicated on
        every rank, on its sequence shard), its up-projection (or the direct query
        projection), the key / value down- and up-projections and the output projection.
        The column-parallel layers whose input is gathered come first, see
        :meth:`gathering_gemms`."""
        h = self.h
        if not self.mla:
            return [(tokens, (self.q + 2 * self.kv_w) / t, h, 1), (tokens, h, self.q / t, 1)]
        kv_up = (tokens, self.a * (self.d + self.d_v) / t, self.kv_lora, 1)
        kv_down = (tokens / shard, self.kv_lora + self.d_rope, h, 1)
        if self.q_lora:
            q = [(tokens, self.q / t, self.q_lora, 1), kv_up,
                 (tokens / shard, self.q_lora, h, 1), kv_down]
        else:
            q = [(tokens, self.q / t, h, 1), kv_up, kv_down]
        return q + [(tokens, h, self.o_w / t, 1)]

    def gathering_gemms(self, tokens, t, shard) -> list[tuple]:
        """The attention's column-parallel layers whose input gradient is reduced over the
        tensor group (beside their weight-gradient GEMMs: async all-reduce / reduce-scatter):
        the QKV; MLA the two up-projections (or the query projection and the key / value
        up-projection)."""
        return self.attn_gemms(tokens, t, shard)[:1 if not self.mla else 2]

    def attn_recomputed_gemms(self, tokens, t, shard) -> list[tuple]:
        """The attention matmuls torchtitan's op-level selective recompute re-runs (every
        second one in the order they run): the key and output projections of q, k, v, o; MLA
        the two up-projections of q_a, q_b, kv_a, kv_b, o (without ``q_lora``: kv_a and o of
        q, kv_a, kv_b, o); the MLP's parity is kept as for q, k, v, o (an approximation)."""
        gemms = self.attn_gemms(tokens, t, shard)
        if not self.mla:
            return [(tokens, self.kv_w / t, self.h, 1), gemms[-1]]
        return [gemms[i] for i in self._op_recomputed]

    @property
    def _op_recomputed(self) -> tuple[int, ...]:
        """MLA: the indices in :meth:`attn_gemms` of q_b and kv_b (with ``q_lora``: q_a, q_b,
        kv_a, kv_b, o run in that order), else of kv_a and o (q, kv_a, kv_b, o)."""
        return (0, 1) if self.q_lora else (2, 3)

    def op_kept_attention_bytes(self, t, shard) -> float:
        """Bytes per token torchtitan's op-level policy keeps of the attention: the outputs of
        the matmuls it does not re-run and of the attention kernel (with its fp32 softmax
        statistics, ``4 a``): q and v, ``2 q + 2 kv``, and the kernel's ``2 q``; MLA the
        down-projections' outputs on the sequence shard, the output projection's and the
        kernel's (``2 a d_v``)."""
        stats = 4 * self.a / t
        if not self.mla:
            return (2 * self.q + 2 * self.kv_w + 2 * self.q) / t + stats
        kept = [g for i, g in enumerate(self.attn_gemms(1, t, shard))
                if i not in self._op_recomputed]
        return 2 * sum(m * n for m, n, _, _ in kept) + 2 * self.o_w / t + stats

    # parameters --------------------------------------------------------------------------
    @property
    def mlp_matrices(self) -> int:
        return 3 if self.gated else 2

    @property
    def tp_duplicated_params(self) -> float:
        """Weights of one layer that every tensor rank holds whole: MLA's down-projections
        ``h (q_lora + kv_lora + d_rope)`` (Transformer Engine ``parallel_mode =
        "duplicated"``: 15.1M of DeepSeek-V3's 187.1M attention weights); 0 otherwise."""
        return self.h * (self.q_lora + self.kv_lora + self.d_rope) if self.mla else 0.0

    def per_rank(self, params, layers, t):
        """Of ``params`` weights of ``layers`` layers, those one tensor rank of ``t`` holds:
        ``params / t``, the duplicated ones (:attr:`tp_duplicated_params`) whole."""
        dup = self.tp_duplicated_params
        return params / t if not dup else (params - layers * dup) / t + layers * dup

    @property
    def attn_matrix_params(self) -> float:
        """Weights of the attention's linear layers (:meth:`attn_gemms` on one rank): QKV
        ``h (q + 2 kv)`` and projection ``q h``; MLA ``h q_lora + q_lora a (d + d_rope)`` (or
        ``h a (d + d_rope)``), ``h (kv_lora + d_rope) + kv_lora a (d + d_v)`` and ``a d_v h``."""
        return sum(n * k * c for _, n, k, c in self.attn_gemms(1, 1, 1))

    @property
    def norm(self) -> float:
        """Weights of one norm of the hidden state: ``2h`` LayerNorm (weight and bias), ``h``
        RMSNorm (weight)."""
        return self.norm_w * self.h

    @property
    def attention_params(self) -> float:
        """The attention's weights, its norm(s) and biases in one layer: the linear layers
        (:attr:`attn_matrix_params`), the layer's two norms (:attr:`norm` each: ``4h`` for
        LayerNorm), the QKV bias ``q + 2 kv`` and the projection's ``h`` (with biases and
        LayerNorm, Narayanan et al.'s ``13h`` of GPT-3); MLA the norms of the compressed query
        and key / value too (``2 (q_lora + kv_lora)`` for LayerNorm), and no QKV bias
        (Megatron-Core builds its projections without one)."""
        h = self.h
        own = 2 * self.norm + (h if self.bias else 0) + self.qk_norm_params
        if self.mla:
            # (without q_lora, Megatron-Core's Transformer Engine spec still puts a norm over h
            # before the query projection under qk_layernorm, which MLA exports set:
            # mla_qk_norm_config.py swaps in TELayerNormColumnParallelLinear)
            return (self.attn_matrix_params + own
                    + self.norm_w * ((self.q_lora or self.h) + self.kv_lora))
        return self.attn_matrix_params + own + (self.q + 2 * self.kv_w if self.qkv_bias else 0)

    @property
    def qk_norm_params(self) -> float:
        """QK norm (Megatron-Core ``qk_layernorm``): one norm over a head's width for the
        queries and one for the keys, shared by the heads: ``2 d`` weights (RMSNorm; ``4 d``
        LayerNorm); 0 without, and for the L2 norm (Megatron-Core's L2Norm has none)."""
        return (2 * self.norm_w * (self.d or self.h / self.a) if self.qk_norm and not self.qk_l2
                else 0)

    @property
    def qk_norm_bytes(self) -> float:
        """What a QK norm reads and writes per token: the queries and keys, ``2 (q + kv)``
        bytes read and as many written (``4 (q + kv)``), split over tensor ranks; 0 without."""
        return 4 * (self.q + self.kv_w) if self.qk_norm else 0

    def mlp_bias(self, f) -> float:
        """Biases of an MLP of width ``f``: fc1's ``f`` (``2f`` gated: Megatron-Core's fc1
        is one ``h x 2f`` layer) and fc2's ``h``; none without :attr:`bias`."""
        return (self.mlp_matrices - 1) * f + self.h if self.bias else 0

    @property
    def layer_params(self) -> float:
        """Weights of one layer: the attention (:attr:`attention_params`), MLP ``(2 or 3) h
        f`` and its biases (:meth:`mlp_bias`)."""
        h, f = self.h, self.f
        return self.attention_params + self.mlp_matrices * h * f + self.mlp_bias(f)

    @property
    def n_dense(self) -> int:
        return self.L - self.n_moe

    @property
    def expert_params(self) -> float:
        """One expert's MLP: ``(2|3) h f_e`` and its biases (:meth:`mlp_bias`; Megatron-Core's
        experts take ``add_bias_linear`` as its dense MLP does)."""
        return self.mlp_matrices * self.h * self.f_e + self.mlp_bias(self.f_e)

    @property
    def moe_dense_params(self) -> float:
        """The parts of an MoE layer that are not routed experts: attention, router (h x E, and
        a bias of E under :attr:`bias`: Megatron-Core's TopKRouter) and the shared experts."""
        router = self.h * self.experts + (self.experts if self.bias else 0)
        return self.attention_params + router + self.shared * self.expert_params

    @property
    def embedding_params(self) -> float:
        return self.V * self.h + (self.s * self.h if self.learned_pos else 0)

    @property
    def mtp_extra_params(self) -> float:
        """What a multi-token prediction depth adds beside its transformer layer: the
        ``2h -> h`` projection of the normed embedding and hidden state (``eh_proj``, no
        bias) and three norms (the two inputs' and its final one, :attr:`norm` each); it
        shares the embedding and the output layer (Megatron-Core MultiTokenPredictionLayer)."""
        return 2 * self.h * self.h + 3 * self.norm

    @property
    def mtp_dense_params(self) -> float:
        """One multi-token prediction depth's weights but its routed experts: the non-expert
        weights of a layer of the last decoder layer's kind and :attr:`mtp_extra_params`."""
        layer = self.moe_dense_params if self.mtp_moe else self.layer_params
        return layer + self.mtp_extra_params

    @property
    def mtp_expert_params(self) -> float:
        """One multi-token prediction depth's routed experts (none after a dense layer)."""
        return self.experts * self.expert_params if self.mtp_moe else 0.0

    @property
    def mtp_layer_params(self) -> float:
        """One multi-token prediction depth's own weights, its experts included."""
        return self.mtp_dense_params + self.mtp_expert_params

    @property
    def total_params(self) -> float:
        """Parameters of the model (the output layer counted once when tied), its
        multi-token prediction depths included."""
        out = 0 if self.tied else self.V * self.h
        moe = self.n_moe * (self.moe_dense_params + self.experts * self.expert_params)
        return (self.n_dense * self.layer_params + moe + self.embedding_params + out + self.norm
                + self.mtp * self.mtp_layer_params)

    # FLOPs, forward, per micro-batch of b sequences, whole layer (divide by t*c per GPU) -------
    def gemm_flops(self, b) -> float:
        """Dense GEMMs of one layer forward: ``2 b s (attention weights + (2|3) h f)``, the
        attention's ``h (q + 2 kv) + q h`` (:attr:`attn_matrix_params`)."""
        return 2 * b * self.s * (self.attn_matrix_params + self.mlp_matrices * self.h * self.f)

    def attention_flops(self, b) -> float:
        """Attention core forward (``QK^T`` and ``AV``): ``2 b s^2 (q + o)``, ``4 b s^2 h`` at
        the default head width (MLA: queries / keys ``a (d + d_rope)`` wide, values ``a d_v``),
        counted without the causal half as Narayanan et al. Eq. 3 do."""
        return 2 * b * self.s * self.s * (self.q + self.o_w)

    def logits_flops(self, b) -> float:
        """Output layer forward: ``2 b s h V``."""
        return 2 * b * self.s * self.h * self.V

    def mlp_flops(self, b, width) -> float:
        """One MLP of ``width`` on b sequences, forward: ``2 b s (2|3) h width``."""
        return 2 * b * self.s * self.mlp_matrices * self.h * width

    def moe_gemm_flops(self, b) -> float:
        """An MoE layer's GEMMs, forward: attention GEMMs, router ``2 b s h E``, and
        ``top_k + shared`` expert MLPs per token (the FLOPs a token really meets)."""
        attn = self.gemm_flops(b) - self.mlp_flops(b, self.f)
        return (attn + 2 * b * self.s * self.h * self.experts
                + (self.top_k + self.shared) * self.mlp_flops(b, self.f_e))

    def model_flops(self, batch) -> float:
        """Model FLOPs of one training step (forward + backward = 3x forward, no recompute):
        the Megatron-LM / Narayanan et al. Eq. 3 convention used for MFU (MoE layers count the
        experts a token is routed to); a multi-token prediction depth counts its layer, its
        ``2h -> h`` projection and the output layer once more, as Megatron-LM's
        ``num_floating_point_operations`` does (less its norms)."""
        mtp_layer = self.moe_gemm_flops(1) if self.mtp_moe else self.gemm_flops(1)
        per_seq = (self.n_dense * self.gemm_flops(1) + self.n_moe * self.moe_gemm_flops(1)
                   + self.logits_flops(1)
                   + self.mtp * (mtp_layer + 2 * self.s * 2 * self.h * self.h
                                 + self.logits_flops(1)))
        return 3 * batch * per_seq + self.core_flops(batch)

    def core_flops(self, batch) -> float:
        """The attention core's share of :meth:`model_flops`: every layer's, the prediction
        depths' included."""
        return 3 * batch * (self.L + self.mtp) * self.attention_flops(1)

    # HBM traffic of element-wise kernels, forward, bytes per token --------------------------
    @property
    def dropout_mask_bytes(self) -> int:
        """A dropout mask costs 1 byte per element; a model trained without dropout stores none."""
        return 1 if self.dropout else 0

    @property
    def eltwise_replicated_bytes(self) -> float:
        """Layer norms (read 2h + write 2h, twice) and the two bias-dropout-add kernels (read 4h,
        write 2h + a 1-byte mask: 7h each): ``22 h`` (``20 h`` without dropout); MLA's two norms
        of the compressed query and key / value ``4 (q_lora + kv_lora)`` more; replicated on
        every tensor rank unless sequence parallelism shards them."""
        return (20 + 2 * self.dropout_mask_bytes) * self.h + 4 * self.lora_w

    @property
    def eltwise_parallel_bytes(self) -> float:
        """The MLP activation: read + write ``f`` (GeLU: ``4f`` bytes), or for a gated MLP read
        the two ``f``-wide halves and write one (``6f``), and a QK norm's traffic
        (:attr:`qk_norm_bytes`); split over tensor ranks."""
        return (6 if self.gated else 4) * self.f + self.qk_norm_bytes

    @property
    def moe_eltwise_parallel_bytes(self) -> float:
        """An MoE layer's MLP traffic per token: the activations of the ``top_k + shared``
        experts it meets, plus permuting its hidden state to and from ``top_k`` experts
        (read + write, dispatch and combine: ``8 h`` per routed copy)."""
        return ((6 if self.gated else 4) * self.f_e * (self.top_k + self.shared)
                + 8 * self.h * self.top_k + self.qk_norm_bytes)

    @property
    def score_eltwise_bytes_per_element(self) -> float:
        """Unfused attention: scale-mask-softmax (read 2, write 2) and dropout (read 2, write 2,
        mask 1) per score element: 9 bytes (4 without dropout); ``a s`` elements per token."""
        return 9.0 if self.dropout else 4.0

    # stored activations, bytes per token (Korthikanti et al. Table 2, generalised) ----------
    @property
    def act_replicated_bytes(self) -> float:
        """Layer-norm inputs (2 x 2h), QKV and MLP inputs (2 x 2h), two dropout masks (2 x h):
        ``10 h`` (``8 h`` without dropout); MLA also the compressed query and key / value, the
        inputs of their norms and of the up-projections (``4 (q_lora + kv_lora)``: on the
        rank's sequence shard, as Transformer Engine keeps a gathered input); replicated across
        tensor ranks without sequence parallelism."""
        return (8 + 2 * self.dropout_mask_bytes) * self.h + 4 * self.lora_w

    @property
    def attn_act_parallel_bytes(self) -> float:
        """The attention's tensors split over tensor ranks: Q, K, V and the projection input
        (the attention output), 2 bytes each: ``4 q + 4 kv`` (``4 h k / a`` for K and V at the
        default head width); MLA ``2 (2 a (d + d_rope) + 2 a d_v)``. A QK norm keeps its
        inputs, the queries and keys before it, ``2 (q + kv)`` more."""
        return 2 * (self.q + self.k_w + self.v_w + self.o_w) + self.qk_norm_bytes / 2

    @property
    def act_parallel_bytes(self) -> float:
        """The attention's tensors (:attr:`attn_act_parallel_bytes`), MLP: plain ``4f`` (GeLU
        input and output), gated ``6f`` (both halves of fc1's output and the product); for
        GPT-3 (k = a, f = 4h) this is Korthikanti's ``24 h``."""
        return self.attn_act_parallel_bytes + (6 if self.gated else 4) * self.f

    @property
    def moe_act_parallel_bytes(self) -> float:
        """An MoE layer stores the attention tensors of a dense layer, and per token the
        permuted hidden state (``2 h``) and the MLP activations of each of its ``top_k`` routed
        experts, plus the shared experts' (``4 f_e`` or ``6 f_e`` each)."""
        mlp = (6 if self.gated else 4) * self.f_e
        return (self.attn_act_parallel_bytes
                + self.top_k * (2 * self.h + mlp) + self.shared * mlp)

    @property
    def moe_routing_bytes(self) -> float:
        """What an MoE layer's routing keeps per token of the sequence shard, under
        Megatron-Core's defaults (Megatron-LM d98e8a64dd): the router's top-k indices (int64,
        ``8 top_k``) and top-k softmax (fp32, ``4 top_k``; ``moe_utils.py``
        ``topk_routing_with_score_function``), the permutation's two int64 index tensors (``16
        top_k``, ``moe_permute_fusion`` off: ``moe_utils.py`` ``permute``) and the permuted
        routing weights the fused weighted SwiGLU saves (the router's dtype, 16-bit by default:
        ``2 top_k``; ``fused_bias_swiglu.py`` ``WeightedSwiGLUFunction``): ``30 top_k``. Not
        counted: the auxiliary loss's fp32 softmax (``4 E``, only with
        ``--moe-aux-loss-coeff``), the fused permutation's larger map, the FP8 padding rows."""
        return 30.0 * self.top_k

    # FP8 (and NVFP4) under Transformer Engine ----------------------------------------------
    # A linear layer casts its input to the narrow format and keeps, for the weight gradient,
    # only that copy (TE module/linear.py: ``saved_inputmat_t`` / ``saved_inputmat``): ``held``
    # bytes per element, 1 for FP8, 1.03125 for MXFP8, 0.5625 for NVFP4 (instance.narrow_bytes);
    # the norms' and the activation's backward still need their 16-bit inputs.
    @property
    def attn_input_readers(self) -> int:
        """The linear layers that read the attention's input (its norm's output) and so, at a
        narrow precision, each keep their own narrow copy of it: the fused QKV layer, or
        MLA's two (Megatron-Core builds its input norm apart, a TENorm feeding the query and
        the key / value down-projections, or without ``q_lora`` the query projection and
        the key / value down-projection: multi_latent_attention.py ``_qkv_down_projection``,
        unfused unless ``mla_down_proj_fusion``, off by default); in 16 bits they all keep
        the one tensor the norm wrote."""
        return 2 if self.mla else 1

    def fp8_saved_replicated_bytes(self, held: float = 1.0) -> float:
        """The QKV and fc1 inputs (the norms' outputs), ``held`` bytes each instead of 2:
        ``2 (2 - held) h`` fewer of :attr:`act_replicated_bytes`; MLA keeps two narrow copies
        of its input (:attr:`attn_input_readers`: ``held h`` back) and also narrows the
        up-projections' inputs, ``(2 - held) (q_lora + kv_lora)``."""
        return ((2 - held) * (2 * self.h + self.lora_w)
                - (self.attn_input_readers - 1) * held * self.h)

    def moe_fp8_saved_replicated_bytes(self, held: float = 1.0,
                                       shared_copy: bool = True) -> float:
        """An MoE layer keeps only its QKV input (and MLA's up-projection inputs) narrow: the
        MLP's input, the norm output, is the router's, whose gating GEMM runs in 16 bits and
        saves it so (Megatron-LM ``moe_utils.py`` ``RouterGatingLinearFunction``); a shared
        expert's fc1 keeps its own narrow copy beside it (``held h``) where ``shared_copy``:
        under delayed scaling, Megatron-Core's default recipe (for the other recipes and NVFP4
        ``shared_experts.py`` sets ``set_save_original_input(linear_fc1)``: it reads the
        router's 16-bit tensor); MLA's input kept twice as in the dense layer."""
        return ((2 - held) * (self.h + self.lora_w)
                - (self.attn_input_readers - 1) * held * self.h - (
                    held * self.h if self.shared and shared_copy else 0.0))

    def fp8_saved_projection_bytes(self, flash: bool, held: float = 1.0,
                                   original: bool = False) -> float:
        """The projection input (``o`` wide: :attr:`o_w`) kept narrow: ``(2 - held) o`` fewer
        bytes, except under fused attention, whose backward keeps its output (the projection
        input) in 16 bits: the narrow copy is ``held o`` more. ``original``: the projection
        keeps the 16-bit input it read and quantizes it again in its backward (Megatron-Core
        sets ``set_save_original_input(linear_proj)`` under every FP8 recipe but delayed
        scaling and under NVFP4: attention.py, multi_latent_attention.py): nothing saved,
        no copy made."""
        if original:
            return 0.0
        return -held * self.o_w if flash else (2 - held) * self.o_w

    def fp8_saved_parallel_bytes(self, flash: bool, held: float = 1.0,
                                 original: bool = False) -> float:
        """Fewer bytes of :attr:`act_parallel_bytes` kept narrow: the projection input
        (:meth:`fp8_saved_projection_bytes`) and the fc2 input (the activation's output,
        ``f``)."""
        return self.fp8_saved_projection_bytes(flash, held, original) + (2 - held) * self.f

    def moe_fp8_saved_parallel_bytes(self, flash: bool, held: float = 1.0,
                                     original: bool = False) -> float:
        """An MoE layer: the projection input, and per routed copy the experts' fc1 input (the
        permuted hidden state) and fc2 input, per shared expert its fc2 input."""
        return (self.fp8_saved_projection_bytes(flash, held, original)
                + (2 - held) * (self.top_k * (self.h + self.f_e) + self.shared * self.f_e))

    @property
    def act_score_bytes_per_element(self) -> float:
        """Unfused attention stores the softmax output (2), its dropout mask (1) and dropout
        output (2) per score element: Korthikanti's ``5 a s^2 b`` (2 without dropout)."""
        return 5.0 if self.dropout else 2.0

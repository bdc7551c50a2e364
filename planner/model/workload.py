"""What one transformer layer costs: FLOPs, HBM traffic, parameters and stored activations.

Quantities are per GPU and per micro-batch, for ``b`` sequences of ``s / cp`` tokens on a tensor
group of ``t``. They depend on the model shape only through :class:`Shape`, and are plain
arithmetic on ``t``, ``c``, ``b`` so numbers, arrays and symbols all work.

Sources: FLOPs follow Narayanan et al. 2021 (arXiv 2104.04473) Sec. 5.1 / Eq. 3 and their
generalisation in Megatron-LM ``num_floating_point_operations`` (GQA, gated MLP); stored
activations follow Korthikanti et al. 2022 (arXiv 2205.05198) Sec. 4 and Table 2, generalised
to GQA and gated MLPs term by term. All tensors are 16-bit (2 bytes) unless stated.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.model.schema import ModelSpec


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
    d: int = 0                # width of one attention head (0: h / a)

    @staticmethod
    def of(m: ModelSpec) -> Shape:
        return Shape(L=m.layers, h=m.hidden, a=m.heads, k=m.kv, f=m.ffn, V=m.vocab, s=m.seq_len,
                     gated=m.gated_mlp, tied=m.tied_embeddings,
                     learned_pos=m.position_embedding == "learned", dropout=m.dropout,
                experts=m.experts if m.moe else 0, top_k=m.top_k if m.moe else 0,
                f_e=m.moe_ffn if m.moe else 0,
                shared=m.shared_experts if m.moe else 0, n_moe=m.moe_layers,
                d=m.head_dim or 0)

    # attention widths ----------------------------------------------------------------------
    @property
    def q(self) -> float:
        """Width of the queries (and of the attention output): ``a d``, ``h`` by default."""
        return self.a * self.d if self.d else self.h

    @property
    def kv_w(self) -> float:
        """Width of the keys (and of the values): ``k d``, ``h k / a`` by default."""
        return self.k * self.d if self.d else self.h * self.k / self.a

    # parameters --------------------------------------------------------------------------
    @property
    def mlp_matrices(self) -> int:
        return 3 if self.gated else 2

    @property
    def layer_params(self) -> float:
        """Weights of one layer: QKV ``h (q + 2 kv)`` (``q = a d``, ``kv = k d`` wide: ``h (h +
        2 h k / a)`` at the default ``d = h / a``), projection ``q h``, MLP ``(2 or 3) h f``,
        plus norms and biases (``13h`` for GPT-3, as Narayanan et al.)."""
        h, f = self.h, self.f
        qkv = h * (self.q + 2 * self.kv_w)
        linear = 4 * h + (self.q + 2 * self.kv_w) + h + f + h
        return qkv + self.q * h + self.mlp_matrices * h * f + linear

    @property
    def n_dense(self) -> int:
        return self.L - self.n_moe

    @property
    def attention_params(self) -> float:
        """QKV, projection, the two norms and the attention biases of one layer."""
        h = self.h
        return h * (self.q + 2 * self.kv_w) + self.q * h + 4 * h + (self.q + 2 * self.kv_w) + h

    @property
    def expert_params(self) -> float:
        """One expert's MLP (``(2|3) h f_e``)."""
        return self.mlp_matrices * self.h * self.f_e

    @property
    def moe_dense_params(self) -> float:
        """The parts of an MoE layer that are not routed experts: attention, router (h x E) and
        the shared experts."""
        return self.attention_params + self.h * self.experts + self.shared * self.expert_params

    @property
    def embedding_params(self) -> float:
        return self.V * self.h + (self.s * self.h if self.learned_pos else 0)

    @property
    def total_params(self) -> float:
        """Parameters of the model (the output layer counted once when tied)."""
        out = 0 if self.tied else self.V * self.h
        moe = self.n_moe * (self.moe_dense_params + self.experts * self.expert_params)
        return (self.n_dense * self.layer_params + moe + self.embedding_params + out + 2 * self.h)

    # FLOPs, forward, per micro-batch of b sequences, whole layer (divide by t*c per GPU) -------
    def gemm_flops(self, b) -> float:
        """Dense GEMMs of one layer forward: ``2 b s (h (q + 2 kv) + q h + (2|3) h f)``."""
        h = self.h
        return 2 * b * self.s * (h * (self.q + 2 * self.kv_w) + self.q * h
                                 + self.mlp_matrices * h * self.f)

    def attention_flops(self, b) -> float:
        """Attention core forward (``QK^T`` and ``AV``): ``4 b s^2 q`` (``4 b s^2 h`` at the
        default head width), counted without the causal half as Megatron-LM and Narayanan et
        al. Eq. 3 do."""
        return 4 * b * self.s * self.s * self.q

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
        experts a token is routed to)."""
        per_seq = (self.n_dense * self.gemm_flops(1) + self.n_moe * self.moe_gemm_flops(1)
                   + self.L * self.attention_flops(1) + self.logits_flops(1))
        return 3 * batch * per_seq

    # HBM traffic of element-wise kernels, forward, bytes per token --------------------------
    @property
    def dropout_mask_bytes(self) -> int:
        """A dropout mask costs 1 byte per element; a model trained without dropout stores none."""
        return 1 if self.dropout else 0

    @property
    def eltwise_replicated_bytes(self) -> float:
        """Layer norms (read 2h + write 2h, twice) and the two bias-dropout-add kernels (read 4h,
        write 2h + a 1-byte mask: 7h each): ``22 h`` (``20 h`` without dropout); replicated on
        every tensor rank unless sequence parallelism shards them."""
        return (20 + 2 * self.dropout_mask_bytes) * self.h

    @property
    def eltwise_parallel_bytes(self) -> float:
        """The MLP activation: read + write ``f`` (GeLU: ``4f`` bytes), or for a gated MLP read
        the two ``f``-wide halves and write one (``6f``); split over tensor ranks."""
        return (6 if self.gated else 4) * self.f

    @property
    def moe_eltwise_parallel_bytes(self) -> float:
        """An MoE layer's MLP traffic per token: the activations of the ``top_k + shared``
        experts it meets, plus permuting its hidden state to and from ``top_k`` experts
        (read + write, dispatch and combine: ``8 h`` per routed copy)."""
        return ((6 if self.gated else 4) * self.f_e * (self.top_k + self.shared)
                + 8 * self.h * self.top_k)

    @property
    def score_eltwise_bytes_per_element(self) -> float:
        """Unfused attention: scale-mask-softmax (read 2, write 2) and dropout (read 2, write 2,
        mask 1) per score element: 9 bytes (4 without dropout); ``a s`` elements per token."""
        return 9.0 if self.dropout else 4.0

    # stored activations, bytes per token (Korthikanti et al. Table 2, generalised) ----------
    @property
    def act_replicated_bytes(self) -> float:
        """Layer-norm inputs (2 x 2h), QKV and MLP inputs (2 x 2h), two dropout masks (2 x h):
        ``10 h`` (``8 h`` without dropout); replicated across tensor ranks without sequence
        parallelism."""
        return (8 + 2 * self.dropout_mask_bytes) * self.h

    @property
    def act_parallel_bytes(self) -> float:
        """Q (``2 q``), K and V (``4 kv``: ``4 h k / a`` at the default head width), projection
        input (``2 q``), MLP: plain ``4f`` (GeLU input and output), gated ``6f`` (both halves of
        fc1's output and the product); for GPT-3 (k = a, f = 4h) this is Korthikanti's
        ``24 h``."""
        return 4 * self.q + 4 * self.kv_w + (6 if self.gated else 4) * self.f

    @property
    def moe_act_parallel_bytes(self) -> float:
        """An MoE layer stores the attention tensors of a dense layer, and per token the
        permuted hidden state (``2 h``) and the MLP activations of each of its ``top_k`` routed
        experts, plus the shared experts' (``4 f_e`` or ``6 f_e`` each)."""
        mlp = (6 if self.gated else 4) * self.f_e
        return (4 * self.q + 4 * self.kv_w
                + self.top_k * (2 * self.h + mlp) + self.shared * mlp)

    # FP8 (and NVFP4) under Transformer Engine ----------------------------------------------
    # A linear layer casts its input to the narrow format and keeps, for the weight gradient,
    # only that copy (TE module/linear.py: ``saved_inputmat_t`` / ``saved_inputmat``): ``held``
    # bytes per element, 1 for FP8, 1.03125 for MXFP8, 0.5625 for NVFP4 (instance.narrow_bytes);
    # the norms' and the activation's backward still need their 16-bit inputs.
    def fp8_saved_replicated_bytes(self, held: float = 1.0) -> float:
        """The QKV and fc1 inputs (the norms' outputs), ``held`` bytes each instead of 2:
        ``2 (2 - held) h`` fewer of :attr:`act_replicated_bytes`."""
        return 2 * (2 - held) * self.h

    def fp8_saved_projection_bytes(self, flash: bool, held: float = 1.0) -> float:
        """The projection input (``q`` wide) kept narrow: ``(2 - held) q`` fewer bytes, except
        under fused attention, whose backward keeps its output (the projection input) in 16
        bits: the narrow copy is ``held q`` more."""
        return -held * self.q if flash else (2 - held) * self.q

    def fp8_saved_parallel_bytes(self, flash: bool, held: float = 1.0) -> float:
        """Fewer bytes of :attr:`act_parallel_bytes` kept narrow: the projection input
        (:meth:`fp8_saved_projection_bytes`) and the fc2 input (the activation's output,
        ``f``)."""
        return self.fp8_saved_projection_bytes(flash, held) + (2 - held) * self.f

    def moe_fp8_saved_parallel_bytes(self, flash: bool, held: float = 1.0) -> float:
        """An MoE layer: the projection input, and per routed copy the experts' fc1 input (the
        permuted hidden state) and fc2 input, per shared expert its fc2 input."""
        return (self.fp8_saved_projection_bytes(flash, held)
                + (2 - held) * (self.top_k * (self.h + self.f_e) + self.shared * self.f_e))

    @property
    def act_score_bytes_per_element(self) -> float:
        """Unfused attention stores the softmax output (2), its dropout mask (1) and dropout
        output (2) per score element: Korthikanti's ``5 a s^2 b`` (2 without dropout)."""
        return 5.0 if self.dropout else 2.0

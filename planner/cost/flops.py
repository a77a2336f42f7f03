"""FLOPs per operation, forward and backward, for one transformer.

Every GEMM of shape (tokens × k) · (k × n) costs ``2·tokens·k·n`` FLOPs forward. Its
backward splits, as the zero-bubble schedules need (Qi et al., ICLR 2024, §2), into the
input gradient B (``dX = dY·Wᵀ``, the same FLOPs) and the weight gradient W
(``dW = Xᵀ·dY``, the same FLOPs again). Attention's score and context products have no
weights: their backward is twice their forward and all of it is B. Element-wise work
(norms, softmax, activations) is left out of FLOP counts, as in PaLM Appendix B; the step
time model costs it by memory traffic instead.

Model FLOPs count each token's forward and backward once; recomputation adds forward
FLOPs to *hardware* FLOPs only (PaLM Appendix B: MFU vs HFU). ``causal`` halves the score
and context products (only the lower triangle is computed); the PaLM and Megatron formulas
are non-causal, so their checks use ``causal=False``.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from planner.spec.model import ModelSpec
from planner.spec.recompute import recompute_modules

#: Fraction of the s × s attention matrix a causal mask leaves to compute.
CAUSAL_FRACTION = 0.5


class OpFlops(BaseModel):
    """FLOPs of one operation for a batch of tokens: forward, input gradient, weight gradient."""

    model_config = ConfigDict(frozen=True)

    name: str
    forward: float
    input_grad: float
    weight_grad: float

    @property
    def total(self) -> float:
        return self.forward + self.input_grad + self.weight_grad


def gemm_op(name: str, tokens: float, k: int, n: int) -> OpFlops:
    """A weight GEMM: 2·tokens·k·n forward, the same again for B and for W."""
    forward = 2.0 * tokens * k * n
    return OpFlops(name=name, forward=forward, input_grad=forward, weight_grad=forward)


def windowed_pair_fraction(window: int, seq_len: float) -> float:
    """Share of a causal layer's (query, key) pairs a sliding window of ``window`` keys leaves:
    query i sees min(i + 1, w) keys, ``w·s − w²/2`` pairs against the causal ``s²/2``
    (Beltagy et al. 2020, Longformer §3.1: local attention costs O(s·w), not O(s²)), so
    ``2w/s − (w/s)²``, 1 once the window spans the sequence."""
    ratio = min(window / seq_len, 1.0)
    return 2 * ratio - ratio * ratio


def attention_pair_fraction(model: ModelSpec, seq_len: float) -> float:
    """The average layer's share of the (query, key) pairs full causal attention computes:
    1 without sliding-window layers, else their :func:`windowed_pair_fraction` averaged with
    the full layers' 1 (a fused kernel skips the blocks outside the window)."""
    windowed = model.num_sliding_window_layers
    if not windowed:
        return 1.0
    local = windowed_pair_fraction(model.sliding_window, seq_len)
    return (model.num_layers - windowed + windowed * local) / model.num_layers


def attention_core_ops(
    model: ModelSpec, seq_len: int, num_sequences: float, causal: bool
) -> list[OpFlops]:
    """Score (Q·Kᵀ) and context (P·V) products: 2·s²·heads·dim each per sequence, of the
    average layer (:func:`attention_pair_fraction`: sliding-window layers compute the pairs
    inside their window; ``causal=False``, the PaLM count, doubles every layer's).

    Backward recomputes nothing here; it is 2× forward (gradients of both operands), all B.
    """
    fraction = (CAUSAL_FRACTION if causal else 1.0) * attention_pair_fraction(model, seq_len)
    pairs = num_sequences * seq_len * seq_len * fraction
    heads = model.num_attention_heads
    scores = 2.0 * pairs * heads * model.head_dim
    context = 2.0 * pairs * heads * model.value_head_dim
    return [
        OpFlops(name="attention.scores", forward=scores, input_grad=2 * scores, weight_grad=0.0),
        OpFlops(name="attention.context", forward=context, input_grad=2 * context, weight_grad=0.0),
    ]


def attention_projection_ops(model: ModelSpec, tokens: float) -> list[OpFlops]:
    """Q/K/V and output projections (GQA shrinks K and V; MLA uses its low-rank paths)."""
    h, nq = model.hidden_size, model.num_attention_heads
    if model.attention_kind != "mla":
        return [
            gemm_op("attention.qkv_proj", tokens, h, model.query_width + 2 * model.kv_width),
            gemm_op("attention.out_proj", tokens, model.query_width, h),
        ]
    rope, kv_rank = model.qk_rope_head_dim, model.kv_lora_rank
    nope, v = model.head_dim - rope, model.value_head_dim
    ops = []
    if model.q_lora_rank:
        ops.append(gemm_op("attention.q_down_proj", tokens, h, model.q_lora_rank))
        ops.append(gemm_op("attention.q_up_proj", tokens, model.q_lora_rank, nq * model.head_dim))
    else:
        ops.append(gemm_op("attention.q_proj", tokens, h, nq * model.head_dim))
    ops.append(gemm_op("attention.kv_down_proj", tokens, h, kv_rank + rope))
    ops.append(gemm_op("attention.kv_up_proj", tokens, kv_rank, nq * (nope + v)))
    ops.append(gemm_op("attention.out_proj", tokens, nq * v, h))
    return ops


def mlp_ops(model: ModelSpec, tokens: float, moe_layer: bool) -> list[OpFlops]:
    """Dense MLP, or a MoE block: router, top-k routed experts per token, shared experts."""
    h, m = model.hidden_size, model.mlp_matrices
    if not moe_layer:
        return [gemm_op("mlp", tokens, h, m * model.ffn_hidden_size)]
    f = model.moe_ffn_hidden_size
    ops = [
        gemm_op("moe.router", tokens, h, model.num_routed_experts),
        gemm_op("moe.routed_experts", tokens * model.num_experts_per_token, h, m * f),
    ]
    if model.num_shared_experts:
        ops.append(gemm_op("moe.shared_experts", tokens * model.num_shared_experts, h, m * f))
    return ops


def layer_ops(
    model: ModelSpec, seq_len: int, num_sequences: float, moe_layer: bool, causal: bool = True
) -> list[OpFlops]:
    """All FLOP-bearing operations of one transformer layer for ``num_sequences`` sequences."""
    tokens = num_sequences * seq_len
    return (
        attention_projection_ops(model, tokens)
        + attention_core_ops(model, seq_len, num_sequences, causal)
        + mlp_ops(model, tokens, moe_layer)
    )


def lm_head_op(model: ModelSpec, tokens: float) -> OpFlops:
    """The output projection to the vocabulary (tied or not, it is a GEMM)."""
    return gemm_op("lm_head", tokens, model.hidden_size, model.vocab_size)


def sum_ops(ops: list[OpFlops], name: str = "total") -> OpFlops:
    return OpFlops(
        name=name,
        forward=sum(op.forward for op in ops),
        input_grad=sum(op.input_grad for op in ops),
        weight_grad=sum(op.weight_grad for op in ops),
    )


def model_ops_per_sequence(model: ModelSpec, seq_len: int, causal: bool = True) -> list[OpFlops]:
    """Every layer's operations (summed by name) plus the LM head, for one sequence."""
    dense = layer_ops(model, seq_len, 1.0, moe_layer=False, causal=causal)
    moe = layer_ops(model, seq_len, 1.0, moe_layer=True, causal=causal) if model.is_moe else []
    num_moe = model.num_moe_layers
    num_dense = model.num_layers - num_moe
    totals: dict[str, list[OpFlops]] = {}
    for op in dense:
        totals.setdefault(op.name, []).append(scaled_op(op, num_dense))
    for op in moe:
        totals.setdefault(op.name, []).append(scaled_op(op, num_moe))
    ops = [sum_ops(parts, name) for name, parts in totals.items()]
    return [*ops, lm_head_op(model, seq_len)]


def scaled_op(op: OpFlops, factor: float) -> OpFlops:
    """``op``'s FLOPs times ``factor`` (per layer → per model, per token → per sequence)."""
    return OpFlops(
        name=op.name,
        forward=op.forward * factor,
        input_grad=op.input_grad * factor,
        weight_grad=op.weight_grad * factor,
    )


def model_flops_per_token(model: ModelSpec, seq_len: int, causal: bool = True) -> float:
    """Training FLOPs (forward + backward) per token, recomputation not counted (for MFU)."""
    return sum_ops(model_ops_per_sequence(model, seq_len, causal)).total / seq_len


def recompute_flops_per_token(
    model: ModelSpec, seq_len: int, recompute: str, causal: bool = True
) -> float:
    """Extra forward FLOPs per token that recomputation runs (counted in HFU only).

    ``selective`` recomputes the attention core (Korthikanti et al. 2022, §4.2), and so does
    ``dots`` (its other recomputed work is element-wise, no matmul FLOPs);
    ``full`` recomputes every layer's forward (not the LM head); Megatron-Core's selective
    modules (:mod:`planner.spec.recompute`) the GEMMs they rerun: ``core_attn`` the attention
    core, ``mla_up_proj`` MLA's up-projections, ``mlp`` the dense layers' MLPs,
    ``shared_experts`` theirs (the norms and activations are element-wise).
    """
    if recompute == "none":
        return 0.0
    ops = model_ops_per_sequence(model, seq_len, causal)
    if recompute == "full":
        return sum(op.forward for op in ops if op.name != "lm_head") / seq_len
    modules = {"core_attn"} if recompute == "dots" else recompute_modules(recompute)
    names = {name for module in modules for name in MODULE_GEMMS.get(module, ())}
    return sum(op.forward for op in ops if op.name in names) / seq_len


#: The FLOP-bearing operations each Megatron-Core selective module reruns.
MODULE_GEMMS = {
    "core_attn": ("attention.scores", "attention.context"),
    "mla_up_proj": ("attention.q_up_proj", "attention.q_proj", "attention.kv_up_proj"),
    "mlp": ("mlp",),
    "shared_experts": ("moe.shared_experts",),
}


def six_n_flops_per_token(model: ModelSpec, seq_len: int) -> float:
    """PaLM Appendix B: ``6N + 12·L·h·s`` (non-causal), N = matmul (non-embedding) parameters."""
    return 6.0 * model.num_matmul_params() + 12.0 * model.num_layers * model.hidden_size * seq_len


def megatron_flops_per_iteration(model: ModelSpec, seq_len: int, batch_size: int) -> float:
    """Narayanan et al. 2021 / Korthikanti et al. 2022 Eq. 7 for GPT models.

    ``72·B·s·L·h²·(1 + s/(6h) + V/(12·h·L))`` (MHA, 4h GELU MLP, no recomputation).
    """
    b, s, layers = batch_size, seq_len, model.num_layers
    h, v = model.hidden_size, model.vocab_size
    return 72.0 * b * s * layers * h * h * (1 + s / (6 * h) + v / (12 * h * layers))


def mfu(
    tokens_per_s_per_gpu: float, model_flops_per_token_: float, peak_flops_per_s: float
) -> float:
    """Model FLOPs utilization (PaLM Appendix B): achieved model FLOP/s over peak FLOP/s."""
    return tokens_per_s_per_gpu * model_flops_per_token_ / peak_flops_per_s

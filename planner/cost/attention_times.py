"""Attention's core (scores, softmax, the weighted sum) on one GPU: a fused kernel at its
measured rates (FlashAttention, cuDNN; by sequence length where the catalog records it,
:mod:`hwspecs.attention`), or the unfused kernels as batched GEMMs and
memory traffic over the score matrix."""

from __future__ import annotations

from typing import TYPE_CHECKING

from planner.cost.op_time import OpTime

if TYPE_CHECKING:
    from planner.cost.compute import GpuRates

#: FlashAttention's backward recomputes the score matrix: 5 matmuls against the forward's 2,
#: so 2.5x the forward FLOPs (Dao 2023, FlashAttention-2 §3.1.2; the FLOP count behind the
#: backward TFLOP/s the FlashAttention papers report).
FLASH_BACKWARD_FLOPS_RATIO = 2.5


def attention_core_time(
    forward_flops: float, forward_bytes: float, rates: GpuRates, seq_len: float | None = None
) -> OpTime:
    """Scores, softmax and the weighted sum of one layer in a fused kernel (FlashAttention):
    forward and input gradient at the accelerator's measured attention rates for sequences
    of ``seq_len`` tokens (:meth:`planner.cost.compute.GpuRates.attention_flops_per_s`; the
    matmul rate where it records none). The backward does 2.5x the forward FLOPs (five GEMMs
    to the forward's two, the scores recomputed; the FLOPs FlashAttention's benchmarks
    count) and moves twice the forward's traffic (read Q, K, V, O, dO; write dQ, dK, dV)."""
    forward_rate, backward_rate = rates.attention_flops_per_s(seq_len)
    memory_s = forward_bytes / rates.hbm_bytes_per_s
    return OpTime(
        name="attention.core",
        forward_s=max(forward_flops / forward_rate, memory_s),
        input_grad_s=max(FLASH_BACKWARD_FLOPS_RATIO * forward_flops / backward_rate, 2 * memory_s),
        weight_grad_s=0.0,
        forward_flops=forward_flops,
        bound="compute",
    )


#: Passes over the score matrix of attention without a fused kernel, Megatron-LM's
#: ``CoreAttention`` (``baddbmm`` for Q·Kᵀ, ``FusedScaleMaskSoftmax``, ``attention_dropout``,
#: ``bmm`` for P·V), besides the one pass of each GEMM (Q·Kᵀ writes S, P·V reads P; in the
#: backward dO·Vᵀ writes dP, Pᵀ·dO reads P, dS·K and dSᵀ·Q read dS): the softmax reads and
#: writes forward, reads P and dP and writes dS backward; dropout reads and writes each way,
#: plus its one-byte mask.
UNFUSED_SOFTMAX_PASSES = (2, 3)
UNFUSED_DROPOUT_PASSES = 2


def unfused_attention_time(
    full_flops: float, qkv_bytes: float, score_elements: float, dropout: bool,
    rates: GpuRates, element_bytes: float,
) -> OpTime:  # fmt: skip
    """Attention as separate kernels, each its own roofline, one after another: the two
    batched GEMMs (Q·Kᵀ, P·V; ``full_flops`` counts every score, the causal mask's half too)
    at the matmul rate of attention's dtype and four GEMMs in the backward (2x the FLOPs),
    and the softmax, masking and dropout as memory traffic over the score matrix
    (:data:`UNFUSED_SOFTMAX_PASSES`, :data:`UNFUSED_DROPOUT_PASSES`; Korthikanti et al.
    2022 §4.1 count the same tensors: 2as²b softmax output, as²b dropout mask, 2as²b dropout
    output)."""
    rate = rates.attention_matmul_flops_per_s or rates.matmul_flops_per_s
    bandwidth = rates.hbm_bytes_per_s
    score_bytes = score_elements * element_bytes
    dropout_bytes = UNFUSED_DROPOUT_PASSES * score_bytes + score_elements if dropout else 0.0
    softmax_forward, softmax_backward = UNFUSED_SOFTMAX_PASSES
    # Each GEMM does half the forward FLOPs and one pass over the scores.
    half = full_flops / 2
    gemm_s = max(half / rate, (score_bytes + qkv_bytes / 2) / bandwidth)
    forward = 2 * gemm_s + (softmax_forward * score_bytes + dropout_bytes) / bandwidth
    backward = 4 * gemm_s + (softmax_backward * score_bytes + dropout_bytes) / bandwidth
    return OpTime(
        name="attention.core",
        forward_s=forward,
        input_grad_s=backward,
        weight_grad_s=0.0,
        forward_flops=full_flops,
        bound="compute" if half / rate >= score_bytes / bandwidth else "memory",
    )

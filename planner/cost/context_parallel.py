"""What each context-parallel algorithm costs a rank besides its collectives: the attention
block one ring step computes (the window its transfer hides behind), the step's own kernels
and online-softmax rescaling, what the block's short kernels lose to their length, and the
K/V buffers and attention working set it holds.

The algorithms (:data:`planner.spec.layout.CP_ALGORITHMS`):

* **all-gather** (Llama 3 §3.3.2; TransformerEngine ``AttnFuncWithCPAndKVAllGather``): K and
  V of the whole sequence are gathered before attention (and again in backward, whose dK, dV
  of the whole sequence are reduce-scattered).
* **ring** (Liu et al. 2023, "Ring Attention with Blockwise Transformers"; Brandon et al.
  2023, "Striped Attention"; TransformerEngine ``AttnFuncWithCPAndKVP2P``, torch's
  ``context_parallel``): each rank keeps its queries and passes K/V blocks of ``s/cp``
  tokens around the ring, cp − 1 steps per pass, computing attention on the block it holds
  while the next one arrives; the load-balanced (zig-zag) split gives every step the same
  work, ``1/cp`` of the rank's attention.
* **ulysses** (Jacobs et al. 2023, "DeepSpeed Ulysses"; TransformerEngine
  ``AttnFuncWithCPAndQKVOA2A``): all-to-alls re-shard Q, K, V from sequence to heads before
  attention and the output back after; attention runs on the whole sequence with
  ``heads/(tp·cp)`` heads.
* **hierarchical** (Megatron-Core ``--cp-comm-type a2a+p2p``): Ulysses over the ``k`` CP
  ranks of one scale-up domain, ring over the ``cp/k`` groups of them.

Attention's FLOPs per rank are the same under every algorithm (each rank computes ``1/cp``
of the causal score matrix), so the layer times of :mod:`planner.cost.compute` hold for all,
at the rate of a kernel over the whole sequence (all-gather and Ulysses run such kernels);
a ring's blocks are shorter and slower (:func:`ring_block_slowdown`).
"""

from __future__ import annotations

import numpy as np

from planner.cost.compute import GpuRates, layer_op_times
from planner.spec.model import ModelSpec
from planner.structure.linears import kv_heads_per_rank_columns

#: Index of each algorithm in the integer code columns carry (the order of CP_ALGORITHMS).
ALL_GATHER, RING, ULYSSES, HIERARCHICAL = 0, 1, 2, 3
#: Kernels one ring step adds per pass: the block's attention kernel and the two online-softmax
#: corrections of the output and its log-sum-exp (TransformerEngine's
#: ``flash_attn_fwd_out_correction`` and ``flash_attn_fwd_softmax_lse_correction``); in
#: backward the block's kernel and the dQ and dK/dV accumulations.
RING_STEP_KERNELS = 3
#: FP32 accumulators (output, dQ, dK/dV) the corrections read and write.
ACCUMULATOR_BYTES = 4


def query_and_output_widths(model: ModelSpec, tp) -> tuple[np.ndarray, np.ndarray]:
    """Elements per token of a rank's queries and attention output (heads split over TP)."""
    heads = model.num_attention_heads / np.asarray(tp, dtype=float)
    return heads * model.head_dim, heads * model.value_head_dim


def key_value_width(model: ModelSpec, tp) -> np.ndarray:
    """Elements per token of a rank's keys and values as the ring and all-to-all move them.

    GQA: ``max(1, kv_heads/tp)`` heads of K and V (replicated beyond their count); MLA: the
    up-projected per-head keys and values (TransformerEngine's CP attention works on K and
    V, not on MLA's latent)."""
    tp = np.asarray(tp)
    if model.attention_kind == "mla":
        return model.num_attention_heads / tp * (model.head_dim + model.value_head_dim)
    return 2.0 * kv_heads_per_rank_columns(model, tp) * model.head_dim


def ulysses_kv_repeats(model: ModelSpec, tp, degree, replicate: bool) -> np.ndarray:
    """Times a TP rank's K/V heads are repeated before Ulysses' all-to-all over ``degree``
    ranks: ``max(degree // kv, 1)`` where the implementation replicates them (verl's Ulysses:
    ``repeats = max(ulysses_sp_size // nheads_k, 1)``, then ``repeat_kv``), else 1
    (TransformerEngine re-shards whole heads; MLA's up-projected K, V have a head per query
    head)."""
    tp, degree = np.broadcast_arrays(np.asarray(tp), np.asarray(degree))
    if not replicate or model.attention_kind == "mla":
        return np.ones(tp.shape)
    kv = kv_heads_per_rank_columns(model, tp)
    return np.maximum(degree // kv, 1).astype(float)


def kv_block_bytes(model: ModelSpec, seq_len: int, micro_batch_size, tp, cp, element_bytes):
    """Bytes of one K/V block a ring step sends: ``b · (s/cp)`` tokens of K and V."""
    return micro_batch_size * seq_len / cp * key_value_width(model, tp) * element_bytes


def ulysses_bytes(
    model: ModelSpec, seq_len: int, micro_batch_size, tp, cp, element_bytes, kv_repeats=1.0
):
    """(Q + K + V, output) bytes of one rank's all-to-all send buffers: its ``s/cp`` tokens
    of every local head (each rank keeps ``1/cp`` and sends the rest; nccl-tests' S), the
    K/V heads ``kv_repeats`` times (:func:`ulysses_kv_repeats`)."""
    tokens = micro_batch_size * seq_len / cp
    q, o = query_and_output_widths(model, tp)
    kv = key_value_width(model, tp) * kv_repeats
    return tokens * (q + kv) * element_bytes, tokens * o * element_bytes


def rank_attention_core_s(
    model: ModelSpec, seq_len: int, micro_batch_size: int, tp: int, cp: int,
    flash_attention: bool, rates: GpuRates, element_bytes: float,
) -> tuple[float, float]:  # fmt: skip
    """(forward, backward) seconds of one layer's attention core on one rank, one micro-batch:
    the rank's ``s/cp`` queries against the keys they see (causal), heads split over TP,
    the ``attention.core`` operation of :func:`planner.cost.compute.layer_op_times`."""
    ops = layer_op_times(
        model, seq_len, micro_batch_size, tp, cp, 1, False, flash_attention, False, rates,
        element_bytes,
    )  # fmt: skip
    core = next(op for op in ops if op.name == "attention.core")
    return core.forward_s, core.input_grad_s


def ring_block_slowdown(rates: GpuRates, seq_len: float, ring: int) -> tuple[float, float]:
    """(forward, backward) factor by which a ring's block kernels — ``seq_len/ring`` keys per
    query block (ring: ``s/cp``; hierarchical's outer ring: ``k·s/cp`` after the re-shard)
    — run slower than one kernel over the whole sequence, which the layer times assume
    (:meth:`planner.cost.compute.GpuRates.attention_flops_per_s`: FlashAttention-3's causal
    forward on H100 runs 292 TFLOP/s at 512 tokens, 602 at 8K); 1 where the rates do not
    vary with length."""
    whole = rates.attention_flops_per_s(seq_len)
    block = rates.attention_flops_per_s(seq_len / ring)
    return whole[0] / block[0], whole[1] / block[1]


def ring_step_overhead_s(
    model: ModelSpec, seq_len: int, micro_batch_size: int, tp: int, cp: int,
    rates: GpuRates, element_bytes: float,
) -> tuple[float, float]:  # fmt: skip
    """(forward, backward) seconds one ring step adds beyond its share of attention: its
    :data:`RING_STEP_KERNELS` kernels' fixed cost and the rescaling traffic. Forward: the
    block's output (activation dtype) folded into the FP32 output by its log-sum-exp (read
    the block's output, read and write the accumulator); backward: dQ accumulated in FP32
    and the block's dK, dV added to the travelling ones (Liu et al. 2023 §3, Algorithm 1's
    blockwise rescaling; TransformerEngine ``AttnFuncWithCPAndKVP2P``)."""
    tokens = seq_len * micro_batch_size / cp
    q, o = (float(x) for x in query_and_output_widths(model, tp))
    kv = float(key_value_width(model, np.asarray(tp)))
    forward_bytes = tokens * o * (element_bytes + 2 * ACCUMULATOR_BYTES)
    backward_bytes = tokens * (q + kv) * 2 * ACCUMULATOR_BYTES
    kernels = RING_STEP_KERNELS * rates.op_overhead_s
    return (
        kernels + forward_bytes / rates.hbm_bytes_per_s,
        kernels + backward_bytes / rates.hbm_bytes_per_s,
    )


def cp_buffer_bytes(
    model: ModelSpec, seq_len: int, micro_batch_size, tp, cp, algorithm, element_bytes,
    replicate_kv: bool = False,
) -> np.ndarray:  # fmt: skip
    """Bytes of K/V buffers and attention working set CP adds on one rank at its peak (the
    backward of one layer), per row (numpy columns; ``algorithm``: codes of
    :data:`planner.spec.layout.CP_ALGORITHMS`).

    * all-gather: K and V of the whole sequence and, in backward, their whole-sequence
      gradients before the reduce-scatter: ``2 · b·s · kv``.
    * ring: the block being computed on and the one arriving (double buffering), and in
      backward their dK, dV travelling with them: ``4 · b·(s/cp) · kv``.
    * ulysses: the head-sharded copies of Q, K, V and of the output beside the sequence-sharded
      ones (the same bytes as the local tensors): ``b·(s/cp) · (q + kv + o)``; with the K/V
      heads repeated ``r > 1`` times (``replicate_kv``, :func:`ulysses_kv_repeats`) the
      repeated copy and its head-sharded one: ``b·(s/cp) · (q + o + 2·r·kv)``.
    * hierarchical: Ulysses' copies over the inner ranks and the outer ring's four blocks
      (the same bytes: after the re-shard a rank holds ``k·s/cp`` tokens of ``1/k`` of its
      heads).
    """
    cp = np.asarray(cp)
    tokens = micro_batch_size * seq_len / cp
    kv = key_value_width(model, tp) * element_bytes
    q, o = (w * element_bytes for w in query_and_output_widths(model, tp))
    repeats = ulysses_kv_repeats(model, tp, cp, replicate_kv)  # Ulysses alone repeats them
    whole = tokens * (q + kv + o)
    ulysses = np.where(repeats > 1, tokens * (q + o + 2 * repeats * kv), whole)
    ring = 4 * tokens * kv
    by_algorithm = np.stack(
        np.broadcast_arrays(2 * tokens * cp * kv, ring, ulysses, whole + ring),
        axis=-1,
    )
    picked = np.take_along_axis(by_algorithm, np.asarray(algorithm)[..., None], axis=-1)[..., 0]
    return np.where(cp > 1, picked, 0.0)

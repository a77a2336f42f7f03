"""The model's ends on one GPU: the LM head with its cross-entropy, and DeepSeek-V3's
multi-token-prediction modules (a projection, one more layer and the shared head), timed
with the roofline of :mod:`planner.cost.compute`."""

from __future__ import annotations

from planner.cost.compute import GpuRates, elementwise_time, gemm_time, layer_op_times
from planner.cost.op_time import OpTime
from planner.spec.model import ModelSpec


def head_op_times(
    model: ModelSpec,
    seq_len: int,
    micro_batch_size: int,
    tp: int,
    cp: int,
    rates: GpuRates,
    element_bytes: float = 2.0,
) -> list[OpTime]:
    """LM head GEMM (vocabulary split by TP) and the cross-entropy over FP32 logits."""
    tokens = seq_len * micro_batch_size / cp
    vocab = model.vocab_size / tp
    head = gemm_time("lm_head", tokens, model.hidden_size, vocab, rates, element_bytes)
    # Cross-entropy: read 16-bit logits, write and read FP32 probabilities.
    loss = elementwise_time(
        "elementwise.cross_entropy", tokens * vocab * (element_bytes + 8), rates
    )
    return [head, loss]


MTP_PREFIX = "mtp."


def mtp_op_times(
    model: ModelSpec,
    seq_len: int,
    micro_batch_size: int,
    tp: int,
    cp: int,
    ep: int,
    sequence_parallel: bool,
    flash_attention: bool,
    rates: GpuRates,
    element_bytes: float = 2.0,
    etp: int | None = None,
    layer_ops: list[OpTime] | None = None,
) -> list[OpTime]:
    """One DeepSeek-V3 multi-token-prediction module for one micro-batch on one GPU.

    arXiv 2412.19437 §2.2: the projection of the normed hidden state and the next token's
    embedding ``[h; h] → h``, one transformer layer (MoE when the model is), and the shared
    output head with its cross-entropy (§3.2.3: on the rank of the last stage). Names carry
    the ``mtp.`` prefix. ``layer_ops``: the layer's operations when the caller has them
    (:func:`planner.cost.stage_times.shape_times` passes the model's own layer, FP8
    quantization included), else :func:`layer_op_times`.
    """
    tokens = seq_len * micro_batch_size / cp
    h = model.hidden_size
    ops = [gemm_time("projection", tokens, 2 * h, h / tp, rates, element_bytes)]
    if layer_ops is None:
        layer_ops = layer_op_times(
            model, seq_len, micro_batch_size, tp, cp, ep, sequence_parallel, flash_attention,
            model.is_moe, rates, element_bytes, etp,
        )  # fmt: skip
    ops += layer_ops
    ops += head_op_times(model, seq_len, micro_batch_size, tp, cp, rates, element_bytes)
    return mtp_named(ops)


def mtp_named(ops: list[OpTime]) -> list[OpTime]:
    """``ops`` as an MTP module's, their names ``mtp.``-prefixed."""
    # Renamed by validation, which costs about half a model_copy (the search runs this once
    # per distinct shape).
    return [OpTime(**{**op.__dict__, "name": MTP_PREFIX + op.name}) for op in ops]

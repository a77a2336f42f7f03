"""Compute time per pipeline rank for one micro-batch: F, B, W and recomputation.

A rank's time is the sum over the layers it holds (its virtual stages) of each layer's
operation times (:mod:`planner.cost.compute`), plus the embedding on the rank holding the first
stage and the LM head and loss on the rank holding the last. Recomputation runs before the
backward: the attention core's forward under ``selective`` (Korthikanti et al. 2022 §4.2),
what each module reruns under Megatron-Core's selective modules, every layer's forward
under ``full``. The schedules take ``f, b, w`` per rank per
micro-batch through the rank's whole share (one direction's share for DualPipe).
"""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel, ConfigDict

from planner.cost.adapter_times import adapter_op_times, frozen
from planner.cost.compute import (
    GpuRates,
    OpTime,
    dispatch_time,
    elementwise_time,
    layer_op_times,
)
from planner.cost.head_times import head_op_times, mtp_named, mtp_op_times
from planner.cost.recipe_ops import (
    keep_in_bf16,
    measures_recompute_s,
    module_rerun_s,
    quantization_time,
)
from planner.spec.finetune import FinetuneSpec
from planner.spec.model import ModelSpec
from planner.spec.recompute import recompute_modules
from planner.structure import op_counts
from planner.structure.linears import layer_linears
from planner.structure.stages import RankStructure


class LayerTimes(BaseModel):
    """One layer's seconds for one micro-batch on one GPU (dense or MoE)."""

    model_config = ConfigDict(frozen=True)

    forward_s: float
    input_grad_s: float
    weight_grad_s: float
    #: W where the gradient buffer is accumulated into (:func:`accumulates_gradients`).
    weight_grad_accumulate_s: float
    attention_forward_s: float
    ops: list[OpTime]
    #: Forward work the job's memory measures rerun in the backward (planner.spec.measures).
    measures_recompute_s: float = 0.0

    #: The element-wise operations' forward (norms, residuals, rotary, the MLP activation).
    elementwise_forward_s: float = 0.0
    #: Forward work each Megatron-Core selective module reruns (recipe_ops.module_rerun_s).
    module_rerun_s: dict[str, float] = {}
    #: Modules whose rerun measures_recompute_s already counts (MemoryMeasures.recomputed_modules).
    measured_modules: frozenset[str] = frozenset()

    @classmethod
    def of(
        cls, ops: list[OpTime], measures_recompute_s: float = 0.0,
        module_rerun_s: dict | None = None, measured: frozenset[str] = frozenset(),
    ) -> LayerTimes:  # fmt: skip
        core = [op for op in ops if op.name == "attention.core"]
        elementwise = [op for op in ops if op.name.startswith("elementwise.")]
        return cls(
            measures_recompute_s=measures_recompute_s,
            module_rerun_s=module_rerun_s or {},
            measured_modules=measured,
            forward_s=sum(op.forward_s for op in ops),
            input_grad_s=sum(op.input_grad_s for op in ops),
            weight_grad_s=sum(op.weight_grad_s for op in ops),
            weight_grad_accumulate_s=sum(op.accumulating_weight_grad_s for op in ops),
            attention_forward_s=sum(op.forward_s for op in core),
            elementwise_forward_s=sum(op.forward_s for op in elementwise),
            ops=ops,
        )

    def recompute_s(self, recompute: str) -> float:
        """Forward work rerun before this layer's backward under ``recompute`` (plus what
        the memory measures rerun, which full recomputation already covers): ``selective``
        the attention core; ``dots`` the attention core and the element-wise operations
        (:func:`planner.cost.activations.dots_tensors`: its memory measures do not apply); a
        set of Megatron-Core modules what each reruns, once where a measure reruns it too."""
        if recompute == "full":
            return self.forward_s
        if recompute == "dots":
            return self.attention_forward_s + self.elementwise_forward_s
        if recompute == "selective":
            return self.attention_forward_s + self.measures_recompute_s
        modules = recompute_modules(recompute) - self.measured_modules
        return self.measures_recompute_s + sum(self.module_rerun_s.get(m, 0.0) for m in modules)


class ShapeTimes(BaseModel):
    """Times of the pieces a rank is built from, for one micro-batch shape on one GPU."""

    model_config = ConfigDict(frozen=True)

    dense: LayerTimes
    moe: LayerTimes | None
    embedding: OpTime
    head: list[OpTime]


def shape_times(
    model: ModelSpec,
    seq_len: int,
    micro_batch_size: int,
    tp: int,
    cp: int,
    ep: int,
    sequence_parallel: bool,
    flash_attention: bool,
    rates: GpuRates,
    element_bytes: float,
    finetune: FinetuneSpec | None = None,
    bf16_rates: GpuRates | None = None,
    measures=None,
    etp: int | None = None,
    memo: dict | None = None,
) -> ShapeTimes:
    """Per-layer, embedding and head times for one (tp, cp, ep, SP, micro-batch) shape
    (``etp``: the routed experts' TP degree, None for tp).

    Under an adapter recipe (``finetune`` training adapters) every base weight is frozen:
    its GEMMs keep their forward and input gradient but lose the weight gradient, the
    embedding's backward (a scatter-add into the frozen table) goes, and each layer gains
    its adapters' GEMMs and QLoRA's dequantization (:func:`planner.cost.adapter_times.adapter_op_times`).
    ``bf16_rates`` (under FP8 or FP4 GEMMs): the rates of the operations DeepSeek-V3 keeps in
    BF16 (:data:`planner.cost.recipe_ops.KEPT_IN_BF16`), and each layer pays the online
    quantization of its low-precision GEMMs' operands
    (:func:`planner.cost.recipe_ops.quantization_time`); ``measures``: the job's memory measures, whose
    recomputation each layer pays (:func:`planner.cost.recipe_ops.measures_recompute_s`).

    ``memo``: a dict kept over calls of one job and one set of rates (the search's shape
    table): the pieces that read fewer fields than the shape are worked out once per
    distinct value of theirs — a dense layer's operations and the output head's per (tp,
    mbs/cp, SP), neither reads ep or etp; the linear modules per (layer kind, tp).
    """
    tuned = finetune is not None and finetune.trains_adapters
    args = (
        model,
        seq_len,
        micro_batch_size,
        tp,
        cp,
        ep,
        sequence_parallel and tp > 1,
        flash_attention,
    )

    # Equal fractions mbs/cp round to the same float, and the pieces read mbs and cp only
    # through it (tests/columns/test_shape_fields.py).
    narrow = (tp, micro_batch_size / cp, sequence_parallel and tp > 1)

    def module(moe_layer: bool) -> list[OpTime]:
        """The layer's own operations (FP8 ones with their quantization): what a
        transformer layer and an MTP module's layer both run (a dense layer's once per
        ``narrow`` key with a memo)."""
        if memo is None or moe_layer:
            return _module(moe_layer)
        key = ("dense", *narrow)
        if key not in memo:
            memo[key] = _module(False)
        return memo[key]

    def _module(moe_layer: bool) -> list[OpTime]:
        ops = layer_op_times(
            *args, moe_layer=moe_layer, rates=rates, element_bytes=element_bytes, etp=etp
        )
        if bf16_rates is not None:
            at_bf16 = layer_op_times(
                *args, moe_layer=moe_layer, rates=bf16_rates, element_bytes=element_bytes, etp=etp
            )
            ops = keep_in_bf16(ops, at_bf16)
            tokens = seq_len * micro_batch_size / cp
            linears = None if memo is None else memo_linears(memo, model, moe_layer, tp)
            quantize = quantization_time(model, tokens, tp, ep, moe_layer, rates, etp, linears)
            ops = [*ops, quantize]
        return ops

    modules = {kind: module(kind) for kind in ((False, True) if model.is_moe else (False,))}

    def layer(moe_layer: bool) -> LayerTimes:
        ops = modules[moe_layer]
        own = module_rerun_s(model, ops, moe_layer, ep)
        rerun = 0.0
        if measures is not None and measures.any:
            rerun = measures_recompute_s(measures, own, ops, moe_layer)
        if rates.op_overhead_s:
            layer_ops, sharded, collectives = op_counts.layer_pass_ops(model, moe_layer), None, None
            if cp > 1:  # the parallel forms' own operations (planner.structure.op_counts)
                layer_ops = layer_ops + op_counts.CP_LAYER_OPS
            if ep > 1 and moe_layer:
                layer_ops = layer_ops + op_counts.EP_LAYER_OPS
            if tp > 1:
                tp_ops = op_counts.tensor_parallel_ops(sequence_parallel)
                layer_ops, sharded, collectives = layer_ops + tp_ops.added, *tp_ops[1:]
            ops = [*ops, dispatch_time("dispatch.layer", layer_ops, rates, sharded, collectives)]
        if tuned:
            ops = [frozen(op) for op in ops] + adapter_op_times(
                model, finetune, seq_len, micro_batch_size, tp, cp, ep, moe_layer, rates,
                element_bytes, etp,
            )  # fmt: skip
        measured = measures.recomputed_modules if measures is not None else frozenset()
        return LayerTimes.of(ops, rerun, own, measured)

    dense = layer(False)
    moe = layer(True) if model.is_moe else None
    tokens = seq_len * micro_batch_size / cp
    # Embedding lookup: write the hidden states; its backward scatter-adds the gradients.
    embedding = elementwise_time("embedding", tokens * model.hidden_size * element_bytes, rates)
    head_key = ("head", *narrow[:2])
    if memo is not None and head_key in memo:
        head = memo[head_key]
    else:
        head_args = (model, seq_len, micro_batch_size, tp, cp)
        head = head_op_times(*head_args, rates, element_bytes)
        if bf16_rates is not None:  # the output head stays BF16
            head = keep_in_bf16(head, head_op_times(*head_args, bf16_rates, element_bytes))
        if memo is not None:
            memo[head_key] = head
    if model.num_mtp_modules:  # MTP sits with the head (DeepSeek-V3 §3.2.3)
        own = modules[model.is_moe]  # its layer is one more of the model's layers
        # Its projection and head read (tp, mbs/cp) only: once per those with a memo. The
        # layer's operations are the model's own (kept in BF16 where they are already).
        ends_key = ("mtp_ends", *narrow[:2])
        ends = None if memo is None else memo.get(ends_key)
        if ends is None:
            ends = mtp_op_times(*args, rates, element_bytes, etp, layer_ops=[])
            if bf16_rates is not None:
                ends = keep_in_bf16(ends, mtp_op_times(*args, bf16_rates, element_bytes, etp, []))
            if memo is not None:
                memo[ends_key] = ends
        mtp = [ends[0], *mtp_named(own), *ends[1:]]
        head = head + mtp * model.num_mtp_modules
    if rates.op_overhead_s:
        tp_ends = op_counts.tensor_parallel_ops(sequence_parallel, ends=True) if tp > 1 else None
        embedding, head = _with_dispatch(model, embedding, head, rates, tp_ends)
    if tuned:
        embedding = embedding.model_copy(update={"input_grad_s": 0.0})
        head = [frozen(op) for op in head]
    return ShapeTimes(dense=dense, moe=moe, embedding=embedding, head=head)


def memo_linears(memo: dict, model: ModelSpec, moe_layer: bool, tp: int) -> list:
    """One layer kind's linear modules at ``tp``, built once per ``memo``."""
    key = ("linears", moe_layer, tp)
    if key not in memo:
        memo[key] = layer_linears(model, moe_layer, tp)
    return memo[key]


def _with_dispatch(
    model: ModelSpec, embedding: OpTime, head: list[OpTime], rates: GpuRates, tp_ends=None
) -> tuple[OpTime, list[OpTime]]:
    """The embedding and the head (+ MTP modules: a projection, a layer, a head each) with
    their operations' dispatch cost (:mod:`planner.structure.op_counts`); ``tp_ends``: DTensor TP's
    changes to the ends (:func:`planner.structure.op_counts.tensor_parallel_ops`), counted with the
    head."""
    first = dispatch_time("dispatch", op_counts.embedding_pass_ops(model), rates)
    mtp = op_counts.LINEAR_OPS + op_counts.layer_pass_ops(model, model.is_moe)
    last = op_counts.head_pass_ops(model) + (mtp + op_counts.head_pass_ops(model)) * (
        model.num_mtp_modules
    )
    embedding = embedding.model_copy(
        update={
            "forward_s": embedding.forward_s + first.forward_s,
            "input_grad_s": embedding.input_grad_s + first.input_grad_s + first.weight_grad_s,
        }
    )
    sharded = collectives = None
    if tp_ends is not None:
        last, sharded, collectives = last + tp_ends.added, *tp_ends[1:]
    return embedding, [*head, dispatch_time("dispatch.head", last, rates, sharded, collectives)]


class RankTimes(BaseModel):
    """Per rank, one micro-batch: forward, input-gradient (with recompute), weight-gradient."""

    forward_s: list[float]
    input_grad_s: list[float]
    weight_grad_s: list[float]
    recompute_s: list[float]


def accumulates_gradients(zero_stage):
    """Whether each rank keeps its whole gradient buffer over the micro-batches, so every
    weight-gradient GEMM accumulates into it (ZeRO 0–1: DDP's buckets, Megatron's distributed
    optimizer, which reduce-scatters once per step) rather than handing each micro-batch's
    gradient to a reduce-scatter (ZeRO 2–3; :mod:`planner.comm.terms`). Works on arrays."""
    return zero_stage <= 1


def rank_times(
    shape: ShapeTimes, structure: RankStructure, recompute: str, accumulate: bool = False
) -> RankTimes:
    """Sum layer, embedding and head times onto each rank (``accumulate``: W into a gradient
    buffer kept over the micro-batches, :func:`accumulates_gradients`)."""
    dense = np.asarray(structure.dense_layers)
    moe = np.asarray(structure.moe_layers)
    emb = np.asarray(structure.has_embedding, dtype=float)
    head = np.asarray(structure.has_head, dtype=float)
    moe_t = shape.moe or shape.dense

    def per_rank(attribute: str) -> np.ndarray:
        layer_attr = op_attr = attribute
        if accumulate and attribute == "weight_grad_s":
            layer_attr, op_attr = "weight_grad_accumulate_s", "accumulating_weight_grad_s"
        layer = dense * getattr(shape.dense, layer_attr) + moe * getattr(moe_t, layer_attr)
        extra = emb * getattr(shape.embedding, op_attr) + head * sum(
            getattr(op, op_attr) for op in shape.head
        )
        return layer + extra

    recompute_s = dense * shape.dense.recompute_s(recompute) + moe * moe_t.recompute_s(recompute)
    return RankTimes(
        forward_s=per_rank("forward_s").tolist(),
        input_grad_s=per_rank("input_grad_s").tolist(),
        weight_grad_s=per_rank("weight_grad_s").tolist(),
        recompute_s=recompute_s.tolist(),
    )

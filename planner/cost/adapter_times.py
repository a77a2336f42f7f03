"""Fine-tuning adapters timed: a frozen base operation (no weight gradient), each adapter's
GEMMs and QLoRA's dequantization of the frozen NF4 weights per pass (Hu et al. 2021 LoRA;
Dettmers et al. 2023 QLoRA; Liu et al. 2024 DoRA; Kopiczko et al. 2024 VeRA)."""

from __future__ import annotations

from planner.cost.compute import GpuRates, gemm_time
from planner.cost.op_time import OpTime, memory_op
from planner.spec.finetune import (
    FinetuneSpec,
    dequantization_bytes_per_weight,
    layer_quantized_params,
    targeted_linears,
)
from planner.spec.model import ModelSpec
from planner.structure.linears import expert_fold, token_rows


def frozen(op: OpTime) -> OpTime:
    """An operation whose weight does not train: its input gradient stays, W is 0."""
    return op.model_copy(update={"weight_grad_s": 0.0, "weight_grad_accumulate_s": None})


def adapter_op_times(
    model: ModelSpec,
    spec: FinetuneSpec,
    seq_len: int,
    micro_batch_size: int,
    tp: int,
    cp: int,
    ep: int,
    moe_layer: bool,
    rates: GpuRates,
    element_bytes: float = 2.0,
    etp: int | None = None,
) -> list[OpTime]:
    """A recipe's own work in one layer for one micro-batch on one GPU.

    Each targeted module's adapter GEMMs ``A: in → r`` and ``B: r → out`` on the module's
    local shape (column-parallel: A whole, B split; row-parallel: A split, B whole, as
    :func:`planner.spec.finetune.module_adapter_params` splits them), with their tokens as the
    base module sees them (routed experts: the local experts' share). VeRA's A and B are
    frozen (no W). DoRA forms ``B·A`` once per micro-batch for its weight norm (forward
    only: the norm is detached). QLoRA dequantizes every NF4 weight of the layer in the
    forward and again in the backward's input gradient (and in a full recomputation, which
    reruns the forward): the bytes of :func:`planner.cost.adapter_flops.dequantization_bytes_per_pass`
    for this layer, at HBM bandwidth.
    """
    tokens = seq_len * micro_batch_size / cp
    r, e = spec.lora_rank, element_bytes
    ops: list[OpTime] = []
    for linear in targeted_linears(model, spec, moe_layer, tp):
        width_in, width_out = linear.local_shape(tp, etp)
        copies = linear.local_count(ep)
        rows = token_rows(linear, model, tokens, ep, expert_fold(tp, etp)) / copies
        key = f"{spec.recipe}.{linear.path}"
        a = gemm_time(f"{key}.A", rows, width_in, r, rates, e, copies)
        b = gemm_time(f"{key}.B", rows, r, width_out, rates, e, copies)
        ops += [frozen(a), frozen(b)] if spec.recipe == "vera" else [a, b]
        if spec.recipe == "dora":
            norm_s = rates.gemm_s(width_out, width_in, r, e, copies)
            ops.append(
                OpTime(
                    name=f"{key}.weight_norm",
                    forward_s=norm_s,
                    input_grad_s=0.0,
                    weight_grad_s=0.0,
                    forward_flops=2.0 * width_out * r * width_in * copies,
                    bound="compute",
                )
            )
    if spec.quantized:
        weights = sum(layer_quantized_params(model, spec, moe_layer, tp, ep, etp))
        moved = weights * dequantization_bytes_per_weight(spec, e)
        ops.append(memory_op("qlora.dequantize", moved, moved, 0.0, rates.hbm_bytes_per_s))
    return ops

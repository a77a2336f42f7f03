"""The FLOPs a fine-tuning recipe adds and freezes (LoRA, DoRA, VeRA adapters on a frozen base;
Hu et al. 2021, arXiv 2106.09685; Liu et al. 2024, arXiv 2402.09353; Kopiczko et al. 2023,
arXiv 2310.11454) and the HBM traffic of dequantizing QLoRA's NF4 base weights (Dettmers et al.
2023, arXiv 2305.14314)."""

from __future__ import annotations

from planner.cost.flops import OpFlops, gemm_op, model_ops_per_sequence, scaled_op, sum_ops
from planner.spec.finetune import (
    FinetuneSpec,
    check_targets,
    dequantization_bytes_per_weight,
    num_quantized_params,
    targeted_linears,
)
from planner.spec.model import ModelSpec
from planner.structure.linears import Linear, layer_kinds_count


def _frozen(op: OpFlops) -> OpFlops:
    return op.model_copy(update={"weight_grad": 0.0})


def adapter_ops(
    linear: Linear, spec: FinetuneSpec, seq_len: int, micro_batch_size: int = 1
) -> list[OpFlops]:
    """One module's adapter GEMMs (all its copies) for one sequence.

    A: tokens × in → r, B: tokens × r → out, each 2·tokens·k·n per pass. Both need input
    gradients (the gradient reaches x through them). DoRA's weight norm multiplies B·A once
    per forward (2·out·r·in, shared by the micro-batch's sequences; no backward: detached).
    """
    tokens = seq_len * linear.token_share * linear.count
    r, key = spec.lora_rank, f"{spec.recipe}.{linear.path}"
    a = gemm_op(f"{key}.A", tokens, linear.in_features, r)
    b = gemm_op(f"{key}.B", tokens, r, linear.out_features)
    if spec.recipe == "vera":
        return [_frozen(a), _frozen(b)]
    ops = [a, b]
    if spec.recipe == "dora":
        norm = 2.0 * linear.out_features * r * linear.in_features * linear.count
        ops.append(
            OpFlops(
                name=f"{key}.weight_norm",
                forward=norm / micro_batch_size,
                input_grad=0.0,
                weight_grad=0.0,
            )
        )
    return ops


def finetune_ops_per_sequence(
    model: ModelSpec,
    spec: FinetuneSpec,
    seq_len: int,
    causal: bool = True,
    micro_batch_size: int = 1,
) -> list[OpFlops]:
    """:func:`planner.cost.flops.model_ops_per_sequence` for a recipe: every base GEMM (LM head
    included) frozen — W = 0, B unchanged — plus the adapters' ops summed over layers."""
    base = model_ops_per_sequence(model, seq_len, causal)
    if not spec.trains_adapters:
        return base
    check_targets(model, spec)
    adapters: dict[str, list[OpFlops]] = {}
    for moe_layer, layers in layer_kinds_count(model).items():
        for linear in targeted_linears(model, spec, moe_layer) if layers else []:
            for op in adapter_ops(linear, spec, seq_len, micro_batch_size):
                adapters.setdefault(op.name, []).append(scaled_op(op, layers))
    return [_frozen(op) for op in base] + [sum_ops(ops, name) for name, ops in adapters.items()]


def dequantization_passes(recompute: str) -> int:
    """Dequantizations of each NF4 weight per micro-batch: the forward, the backward's input
    gradient (bitsandbytes' 4-bit matmul dequantizes again) and, under full recomputation,
    the rebuilt forward."""
    return 2 + (recompute == "full")


def dequantization_bytes_per_pass(
    model: ModelSpec, spec: FinetuneSpec, element_bytes: float = 2.0
) -> float:
    """HBM bytes of dequantizing every NF4 weight once (:func:`dequantization_bytes_per_weight`)."""
    return num_quantized_params(model, spec) * dequantization_bytes_per_weight(spec, element_bytes)

"""What a fine-tuning recipe costs on a GPU: model-state bytes, activations, FLOPs, dequantization.

The recipes and their parameter counts are in :mod:`planner.spec.finetune`; this module turns
them into the quantities :mod:`planner.cost.memory` and the FLOP counts use.

* **Model states** (per rank): frozen base weights in their dtype (NF4 + constants for
  QLoRA's linears), adapter weights, and gradients / master / optimizer states for the
  adapters only — frozen weights have none.
* **Activations**: the base layer's tensors as in :mod:`planner.cost.activations` (counted as for
  full training: the adapters need the same layer inputs, and the frozen GEMMs still pass
  input gradients, so this is the usual upper bound), plus each adapter's own: A's r-wide
  output, a dropped-out input copy and its mask when ``lora_dropout > 0`` (PEFT applies
  dropout per adapter, to its input; on its output, ``lora_dropout_position="post"``, only
  the mask), DoRA's base and LoRA outputs, VeRA's B output. Under full
  recomputation (the QLoRA setup: gradient checkpointing) a layer keeps only its input and
  rebuilds the rest, adapters included, during its backward.
* **Working buffers**: QLoRA dequantizes one weight at a time into a 16-bit copy; DoRA forms
  ``W + s·B·A`` (out × in) to take its column norm (PEFT; the norm is detached, DoRA §4.3).
* **FLOPs**: frozen GEMMs keep their input gradient B but have no weight gradient W; adapters
  add their own small F/B/W (VeRA's frozen A and B: no W; its d and b scale element-wise).
  QLoRA's dequantization is memory-bound: bytes, not FLOPs.
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict

from planner.cost.activations import DROPOUT_MASK_BYTES, ActivationShape
from planner.spec.finetune import (
    NF4_BITS,
    STATE_PARTS,
    FinetuneSpec,
    adapter_states_per_param,
    check_targets,
    layer_adapter_params,
    layer_quantized_params,
    num_adapter_params,
    num_quantized_params,
    quantization_constant_bits_per_param,
    targeted_linears,
    vera_projection_params,
)
from planner.spec.model import ModelSpec
from planner.spec.precision import DTYPE_BYTES, BytesPerParam, PrecisionSpec, zero_shard_factors
from planner.structure.linears import (
    Linear,
    expert_fold,
    layer_kinds_count,
    layer_linears,
    token_rows,
)


class FinetuneStateBytes(BaseModel):
    """Model-state bytes of a fine-tuning recipe on one GPU, by part."""

    model_config = ConfigDict(frozen=True)

    base_weights: float
    quantization_constants: float
    adapter_weights: float
    adapter_gradients: float
    adapter_master_weights: float
    adapter_optimizer_states: float

    @property
    def total(self) -> float:
        return math.fsum(self.model_dump().values())

    def memory_parts(self) -> dict[str, float]:
        """The same bytes as memory.py's four model-state parts."""
        return {
            "weights": self.base_weights + self.quantization_constants + self.adapter_weights,
            "gradients": self.adapter_gradients,
            "master_weights": self.adapter_master_weights,
            "optimizer_states": self.adapter_optimizer_states,
        }


def rank_state_bytes(
    model: ModelSpec,
    spec: FinetuneSpec,
    precision: PrecisionSpec,
    base_params: tuple[float, float],
    num_layers: tuple[float, float],
    tp: int = 1,
    ep: int = 1,
    shards: tuple[BytesPerParam, BytesPerParam] | None = None,
    etp: int | None = None,
) -> FinetuneStateBytes:
    """Model states of one rank holding ``base_params`` = (dense, routed-expert) parameters.

    ``num_layers`` = (dense layers, MoE layers) on the rank; ``shards`` = the ZeRO divisors
    of (dense, expert) states (:func:`planner.spec.precision.zero_shard_factors`). Frozen weights
    shard like weights, adapter gradients like gradients, adapter masters and states like
    masters and states. VeRA's shared projections are buffers: whole on every rank with layers.
    """
    one = zero_shard_factors(0, 1)
    dense_shard, expert_shard = shards or (one, one)
    quantized = [0.0, 0.0]
    adapters = [0.0, 0.0]
    for moe_layer, layers in zip((False, True), num_layers, strict=True):
        if layers:
            q = layer_quantized_params(model, spec, moe_layer, tp, ep, etp)
            a = layer_adapter_params(model, spec, moe_layer, tp, ep, etp)
            quantized = [quantized[i] + layers * q[i] for i in (0, 1)]
            adapters = [adapters[i] + layers * a[i] for i in (0, 1)]
    base_dtype = spec.base_weight_dtype(precision)
    unquantized_bytes = DTYPE_BYTES[precision.weight_dtype if base_dtype == "nf4" else base_dtype]
    adapter_bytes = DTYPE_BYTES[spec.adapter_weight_dtype]
    states = adapter_states_per_param(model, spec, precision.optimizer)
    parts = dict.fromkeys(STATE_PARTS, 0.0)
    for i, shard in enumerate((dense_shard, expert_shard)):
        frozen = base_params[i] - quantized[i]
        parts["base_weights"] += (
            frozen * unquantized_bytes + quantized[i] * NF4_BITS / 8
        ) / shard.weights
        parts["quantization_constants"] += (
            quantized[i] * quantization_constant_bits_per_param(spec) / 8 / shard.weights
        )
        parts["adapter_weights"] += adapters[i] * adapter_bytes / shard.weights
        parts["adapter_gradients"] += adapters[i] * adapter_bytes / shard.gradients
        parts["adapter_master_weights"] += (
            adapters[i] * DTYPE_BYTES[spec.adapter_master_dtype] / shard.master_weights
        )
        parts["adapter_optimizer_states"] += (
            adapters[i] * states * DTYPE_BYTES[precision.state_dtype] / shard.optimizer_states
        )
    if sum(num_layers):
        parts["adapter_weights"] += vera_projection_params(model, spec) * adapter_bytes
    return FinetuneStateBytes(**parts)


def routed_expert_params(model: ModelSpec) -> int:
    return (
        model.num_moe_layers
        * model.num_routed_experts
        * model.mlp_params(model.moe_ffn_hidden_size)
    )


def model_state_bytes(
    model: ModelSpec,
    spec: FinetuneSpec,
    precision: PrecisionSpec,
    zero_stage: int = 0,
    dp: int = 1,
) -> FinetuneStateBytes:
    """The whole model's states on one data-parallel rank (no TP/PP/EP), ZeRO over ``dp``."""
    check_targets(model, spec)
    expert = routed_expert_params(model)
    kinds = layer_kinds_count(model)
    factors = zero_shard_factors(zero_stage, dp)
    return rank_state_bytes(
        model,
        spec,
        precision,
        (model.num_params() - expert, expert),
        (kinds.get(False, 0), kinds.get(True, 0)),
        shards=(factors, factors),
    )


def layer_weight_and_grad_bytes(
    model: ModelSpec,
    spec: FinetuneSpec,
    precision: PrecisionSpec,
    moe_layer: bool,
    tp: int = 1,
    ep: int = 1,
    etp: int | None = None,
) -> tuple[float, float]:
    """One whole layer's weights (as stored: NF4 + constants) and its adapter gradients on one
    TP/EP rank: what a ZeRO-3 gather and a ZeRO ≥ 2 gradient bucket hold for that layer."""
    from planner.structure.params import layer_params_per_rank

    layer = layer_params_per_rank(model, tp, ep, moe_layer, etp)
    layers = (0.0, 1.0) if moe_layer else (1.0, 0.0)
    states = rank_state_bytes(model, spec, precision, layer, layers, tp, ep, etp=etp)
    vera = vera_projection_params(model, spec) * DTYPE_BYTES[spec.adapter_weight_dtype]
    return states.memory_parts()["weights"] - vera, states.adapter_gradients


# ----- activations and working buffers ----------------------------------------------------


def adapter_activation_tensors(
    model: ModelSpec, spec: FinetuneSpec, shape: ActivationShape, moe_layer: bool
) -> dict[str, float]:
    """Bytes each adapter of one layer keeps for backward (one micro-batch, one rank).

    LoRA/DoRA/QLoRA: A's r-wide output (B's weight gradient needs it); A's input is the base
    module's input, already stored, unless dropout copies it. DoRA: also the base and LoRA
    outputs, which PEFT's ``(m/‖W'‖ − 1)·base + m/‖W'‖·lora·s`` keeps for the magnitude's
    gradient. VeRA: A's output (d's gradient) and B's output (b's).
    Nothing under full recomputation: see :func:`adapter_working_bytes`.
    """
    if shape.recompute == "full" or not spec.trains_adapters:
        return {}
    tokens, e, r = shape.local_tokens, shape.element_bytes, spec.lora_rank
    tensors: dict[str, float] = {}
    for linear in targeted_linears(model, spec, moe_layer, shape.tp):
        rows = token_rows(linear, model, tokens, shape.ep, expert_fold(shape.tp, shape.etp))
        width_in, width_out = linear.local_shape(shape.tp, shape.etp)
        if linear.tp_split != "row":
            width_in *= shape.replicated_share
        key = f"{spec.recipe}.{linear.path}"
        tensors[f"{key}.a_output"] = rows * r * e
        if spec.recipe == "vera":
            tensors[f"{key}.b_output"] = rows * width_out * e
        if spec.recipe == "dora":
            tensors[f"{key}.base_output"] = rows * width_out * e
            tensors[f"{key}.lora_output"] = rows * width_out * e
        if spec.lora_dropout > 0 and spec.lora_dropout_position == "pre":
            tensors[f"{key}.dropout_output"] = rows * width_in * e
            tensors[f"{key}.dropout_mask"] = rows * width_in * DROPOUT_MASK_BYTES
        elif spec.lora_dropout > 0:  # the backward of dropout on B's output needs its mask only
            tensors[f"{key}.dropout_mask"] = rows * width_out * DROPOUT_MASK_BYTES
    return tensors


def _largest_local_matrix(linears: list[Linear], tp: int, etp: int | None = None) -> float:
    return max((math.prod(linear.local_shape(tp, etp)) for linear in linears), default=0.0)


def adapter_working_bytes(
    model: ModelSpec, spec: FinetuneSpec, shape: ActivationShape, moe_layer: bool
) -> dict[str, float]:
    """Transient bytes while one layer runs: the dequantized 16-bit copy of its largest NF4
    weight (one at a time), DoRA's ``B·A`` and ``W + s·B·A`` for the largest targeted module,
    and under full recomputation the adapter tensors of the layer being rebuilt."""
    parts: dict[str, float] = {}
    e = shape.element_bytes
    if spec.quantized:
        parts["dequantized_weight"] = (
            _largest_local_matrix(layer_linears(model, moe_layer, shape.tp), shape.tp, shape.etp)
            * e
        )
    if spec.recipe == "dora":
        parts["dora_weight_norm"] = (
            2
            * _largest_local_matrix(
                targeted_linears(model, spec, moe_layer, shape.tp), shape.tp, shape.etp
            )
            * e
        )
    if shape.recompute == "full":
        whole = shape.model_copy(update={"recompute": "none"})
        parts["recomputed_adapter_tensors"] = math.fsum(
            adapter_activation_tensors(model, spec, whole, moe_layer).values()
        )
    return parts


def adapter_layer_bytes(
    model: ModelSpec, spec: FinetuneSpec | None, shape: ActivationShape
) -> dict[bool, float]:
    """{moe_layer: bytes one layer's adapters keep for backward}; 0 without a recipe."""
    return {
        moe: math.fsum(adapter_activation_tensors(model, spec, shape, moe).values())
        if spec is not None and (model.is_moe or not moe)
        else 0.0
        for moe in (False, True)
    }


def adapter_working_max(
    model: ModelSpec, spec: FinetuneSpec | None, shape: ActivationShape
) -> dict[str, float]:
    """:func:`adapter_working_bytes` of the larger of a dense and a MoE layer, part by part."""
    if spec is None:
        return {}
    kinds = (False, True) if model.is_moe else (False,)
    found = [adapter_working_bytes(model, spec, shape, moe) for moe in kinds]
    return {key: max(parts.get(key, 0.0) for parts in found) for key in found[0]}


def buffers_beside_logits(
    buffers: dict[str, float], base_working: float, logits_bytes: float
) -> dict[str, float]:
    """The adapters' working buffers as a rank holds them on top of its logits buffers: the
    loss turn hides a layer's working set up to the logits' size
    (:func:`planner.cost.activations.layer_working_beside_logits`), the base's share
    (``base_working``: rebuilt layer and activation gradients) first, then the adapters',
    each buffer scaled down alike. Unchanged where ``logits_bytes`` is 0."""
    total = math.fsum(buffers.values())
    hidden = min(max(logits_bytes - base_working, 0.0), total) if logits_bytes > 0 else 0.0
    return {k: v * (1 - hidden / total) for k, v in buffers.items()} if hidden else buffers


def recipe_breakdown(
    states: FinetuneStateBytes,
    parts: dict[str, float],
    adapter_activations: float,
    buffers: dict[str, float],
) -> dict[str, float]:
    """One rank's bytes by the recipe's parts (sums to the rank's total): memory.py's
    ``parts`` with model states split and the adapters' activations and buffers apart."""
    base_activations = parts["activations"] - adapter_activations - math.fsum(buffers.values())
    return {
        **states.model_dump(),
        "activations": base_activations,
        "adapter_activations": float(adapter_activations),
        **buffers,
        **{key: parts[key] for key in ("logits_buffers", "comm_buffers", "runtime_overhead")},
    }


# ----- explanation ------------------------------------------------------------------------


def explain_terms(
    model: ModelSpec, spec: FinetuneSpec, precision: PrecisionSpec, parts: FinetuneStateBytes
) -> list[dict]:
    """Formula and values of each recipe term, for memory's ``--explain``."""
    base = spec.base_weight_dtype(precision)
    base_formula = (
        f"NF4 linears × {NF4_BITS}/8 B + constants × {quantization_constant_bits_per_param(spec):.4g}/8 B "
        f"(blocks of {spec.quant_block_size}, double quant {spec.double_quant}); the rest × "
        f"{DTYPE_BYTES[precision.weight_dtype]:g} B"
        if spec.quantized
        else f"base params × {DTYPE_BYTES[base]:g} B ({base}), frozen"
    )
    states = adapter_states_per_param(model, spec, precision.optimizer)
    paged = " — paged: may spill to CPU RAM" if spec.pages_optimizer_states else ""
    return [
        {
            "term": "base_weights + quantization_constants",
            "formula": base_formula,
            "values": f"{num_quantized_params(model, spec):,} NF4 weights of {model.num_params():,}",
            "bytes": parts.base_weights + parts.quantization_constants,
        },
        {
            "term": "adapter weights, gradients, master",
            "formula": f"{spec.recipe} r {spec.lora_rank} on {', '.join(spec.lora_targets)} × "
            f"{DTYPE_BYTES[spec.adapter_weight_dtype]:g} B ({spec.adapter_weight_dtype}) × 2 "
            f"(+ master {spec.adapter_master_dtype})",
            "values": f"{num_adapter_params(model, spec):,} trainable in the model"
            + (
                f" + {vera_projection_params(model, spec):,} frozen shared"
                if spec.recipe == "vera"
                else ""
            ),
            "bytes": parts.adapter_weights + parts.adapter_gradients + parts.adapter_master_weights,
        },
        {
            "term": "adapter_optimizer_states",
            "formula": f"adapter params × {states:.3g} states × {DTYPE_BYTES[precision.state_dtype]:g} B"
            f"{paged}",
            "values": f"{precision.optimizer}",
            "bytes": parts.adapter_optimizer_states,
        },
    ]

"""Fine-tuning recipes: full, LoRA, QLoRA, DoRA, VeRA — parameters, model-state bytes, activations.

* **LoRA** (Hu et al. 2021, §4.1): each targeted linear ``W (out × in)`` is frozen and gains a
  trainable ``B·A`` with ``A (r × in)`` and ``B (out × r)``: ``r·(in + out)`` parameters.
* **QLoRA** (Dettmers et al. 2023, §3): LoRA over a base whose linear weights are stored in
  NF4 — 4 bits per weight plus one absmax constant per 64-weight block. Constants in FP32
  cost 32/64 = 0.5 bit per weight; double quantization stores them as 8-bit floats with one
  FP32 constant per 256 of them: 8/64 + 32/(64·256) ≈ 0.127 bit. Each use of a weight
  dequantizes it to the 16-bit compute dtype (a memory-bound pass, see
  :mod:`planner.cost.adapters`); optimizer states are *paged* (NVIDIA unified memory: they
  move to CPU RAM when the GPU runs short), which this model notes but still counts on the GPU.
  Embeddings, the LM head, norms and biases stay in 16 bits (bitsandbytes skips them).
* **DoRA** (Liu et al. 2024, §4): LoRA plus a trainable magnitude vector per output channel
  (``out`` more parameters per module, PEFT's ``lora_magnitude_vector``).
* **VeRA** (Kopiczko et al. 2024, §3): frozen random ``A (r × in)`` and ``B (out × r)`` shared
  by all layers (PEFT sizes them for the largest targeted in/out features), and per module
  trainable scaling vectors ``d (r)`` and ``b (out)``.

Targets: ``attention`` (q/k/v/o, or MLA's projections), ``mlp`` (gate/up/down — in MoE
layers every routed and shared expert's gate/up/down too, as PEFT's suffix match does; the
router is not targeted unless named), ``all`` (both: QLoRA's "all linear layers"; the LM head
is never targeted), or module names. Adapter dtype: FP32 by default (PEFT's
``autocast_adapter_dtype``), BF16 for QLoRA (the QLoRA repository casts adapters with
``--bf16``); adapter gradients in the adapter dtype; no master copy unless asked (the
optimizer updates the adapter weights in place, as PEFT and bitsandbytes' paged AdamW do).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from hwspecs.errors import PlanError
from planner.spec.model import ModelSpec
from planner.spec.precision import PrecisionSpec
from planner.structure.linears import (
    ATTENTION_MODULES,
    MLA_MODULES,
    MLP_MODULES,
    MODULE_NAMES,
    Linear,
    layer_kinds_count,
    layer_linears,
)

RecipeName = Literal["full", "lora", "qlora", "dora", "vera"]
RECIPES: tuple[str, ...] = ("full", "lora", "qlora", "dora", "vera")
TARGET_GROUPS: dict[str, tuple[str, ...]] = {
    "attention": tuple(dict.fromkeys(ATTENTION_MODULES + MLA_MODULES)),
    "mlp": MLP_MODULES,
    "all": tuple(dict.fromkeys(ATTENTION_MODULES + MLA_MODULES + MLP_MODULES)),
}

#: NF4: a 4-bit index into 16 normal-float levels per weight (QLoRA §3).
NF4_BITS = 4
#: One FP32 absmax per block: the first-level constant, and the second level's (QLoRA §3).
FP32_BITS = 32
#: Double quantization stores the first-level constants as 8-bit floats (QLoRA §3).
DOUBLE_QUANT_BITS = 8

#: The recipe's split of model-state bytes; maps onto memory.py's four model-state parts.
STATE_PARTS = (
    "base_weights",
    "quantization_constants",
    "adapter_weights",
    "adapter_gradients",
    "adapter_master_weights",
    "adapter_optimizer_states",
)


class FinetuneSpec(BaseModel):
    """A fine-tuning recipe: which weights train, at which rank, in which dtypes."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    recipe: RecipeName = "full"
    lora_rank: int = Field(8, gt=0, description="r (PEFT's LoraConfig default 8; QLoRA used 64)")
    lora_alpha: float = Field(8.0, gt=0, description="output scale alpha/r; does not change cost")
    lora_targets: tuple[str, ...] = Field(
        ("all",), description="groups (attention, mlp, all) and/or module names (q_proj, ...)"
    )
    lora_dropout: float = Field(0.0, ge=0, lt=1, description="> 0 stores a dropout mask")
    lora_dropout_position: Literal["pre", "post"] = Field(
        "pre",
        description="pre: dropout on the adapter's input, PEFT's lora_B(lora_A(dropout(x))), "
        "which keeps the dropped copy and its mask; post: on the adapter's output (NeMo "
        "AutoModel's PeftConfig default), which keeps only an output-wide mask",
    )
    adapter_dtype: Literal["fp32", "bf16", "fp16"] | None = None
    adapter_master_dtype: Literal["fp32", "none"] = "none"
    base_dtype: Literal["fp32", "bf16", "fp16", "fp8", "nf4"] | None = None
    quant_block_size: int = Field(64, gt=0, description="weights per NF4 absmax block")
    double_quant: bool = True
    double_quant_block_size: int = Field(256, gt=0, description="constants per FP32 constant")
    paged_optimizer: bool | None = Field(None, description="default: on for qlora")

    @field_validator("lora_targets", mode="before")
    @classmethod
    def _split_targets(cls, value):
        if isinstance(value, str):
            value = [part.strip() for part in value.split(",") if part.strip()]
        return tuple(value)

    @model_validator(mode="after")
    def _consistent(self) -> FinetuneSpec:
        allowed = (*TARGET_GROUPS, *MODULE_NAMES)
        unknown = [name for name in self.lora_targets if name not in allowed]
        if unknown or not self.lora_targets:
            got = f"unknown target '{unknown[0]}'" if unknown else "no targets"
            raise ValueError(f"{got}; lora targets are groups or modules: {', '.join(allowed)}")
        if self.recipe == "qlora" and self.base_dtype not in (None, "nf4"):
            raise ValueError(f"qlora stores the base in nf4, not {self.base_dtype}")
        if self.recipe != "qlora" and self.base_dtype == "nf4":
            raise ValueError("nf4 base weights are the qlora recipe; use --recipe qlora")
        return self

    @property
    def trains_adapters(self) -> bool:
        return self.recipe != "full"

    @property
    def quantized(self) -> bool:
        return self.recipe == "qlora"

    @property
    def adapter_weight_dtype(self) -> str:
        return self.adapter_dtype or ("bf16" if self.quantized else "fp32")

    @property
    def pages_optimizer_states(self) -> bool:
        return self.quantized if self.paged_optimizer is None else self.paged_optimizer

    def base_weight_dtype(self, precision: PrecisionSpec) -> str:
        """Frozen weights' dtype: NF4 for QLoRA's linears, else as asked or the recipe's."""
        return "nf4" if self.quantized else (self.base_dtype or precision.weight_dtype)


# ----- NF4 storage ------------------------------------------------------------------------


def quantization_constant_bits_per_param(spec: FinetuneSpec) -> float:
    """Bits of block-wise constants per weight (QLoRA §3, "Double Quantization").

    Without double quantization: one FP32 absmax per block, 32/64 = 0.5 bit. With it: the
    first-level constants in 8 bits (8/64) plus one FP32 per 256 of them (32/(64·256)).
    """
    block = spec.quant_block_size
    if not spec.double_quant:
        return FP32_BITS / block
    return DOUBLE_QUANT_BITS / block + FP32_BITS / (block * spec.double_quant_block_size)


def nf4_bits_per_param(spec: FinetuneSpec) -> float:
    """Storage bits per NF4 weight: the 4-bit code plus its share of the constants."""
    return NF4_BITS + quantization_constant_bits_per_param(spec)


def dequantization_bytes_per_weight(spec: FinetuneSpec, element_bytes: float = 2.0) -> float:
    """HBM bytes of dequantizing one NF4 weight: read the code and its constants, write the
    16-bit copy (the GEMM's own read of that copy is the GEMM's traffic)."""
    return nf4_bits_per_param(spec) / 8 + element_bytes


# ----- which modules, how many adapter parameters ----------------------------------------


def target_names(spec: FinetuneSpec) -> set[str]:
    names: set[str] = set()
    for target in spec.lora_targets:
        names.update(TARGET_GROUPS.get(target, (target,)))
    return names


def targeted_linears(
    model: ModelSpec, spec: FinetuneSpec, moe_layer: bool, tp: int = 1
) -> list[Linear]:
    """The linear modules of one layer that carry an adapter (none for full fine-tuning)."""
    if not spec.trains_adapters:
        return []
    names = target_names(spec)
    return [linear for linear in layer_linears(model, moe_layer, tp) if linear.name in names]


def check_targets(model: ModelSpec, spec: FinetuneSpec) -> None:
    """Every module named explicitly must exist in ``model`` (groups match what exists)."""
    present = {
        linear.name for moe in layer_kinds_count(model) for linear in layer_linears(model, moe)
    }
    for target in spec.lora_targets:
        if target not in TARGET_GROUPS and target not in present:
            raise PlanError(
                f"lora target '{target}' matches no module of {model.name}; its linear modules "
                f"are: {', '.join(sorted(present))}"
            )
    if spec.trains_adapters and not any(
        targeted_linears(model, spec, moe) for moe in layer_kinds_count(model)
    ):
        raise PlanError(f"lora targets {list(spec.lora_targets)} match no module of {model.name}")


def module_adapter_params(
    linear: Linear, spec: FinetuneSpec, tp: int = 1, ep: int = 1, etp: int | None = None
) -> float:
    """Trainable adapter parameters of one module (all its copies on one TP/EP rank).

    Under TP the adapter follows its base: column-parallel keeps A whole and splits B,
    row-parallel splits A and keeps B whole (Megatron/NeMo's parallel LoRA adapters);
    routed experts split by ``etp`` (None: tp).
    """
    rows_in, rows_out = linear.local_shape(tp, etp)
    r = spec.lora_rank
    if spec.recipe == "vera":
        per_copy = r + rows_out  # d (r) and b (out)
    else:
        per_copy = r * (rows_in + rows_out)
        if spec.recipe == "dora":
            per_copy += rows_out  # the magnitude vector, one per output channel
    return linear.local_count(ep) * per_copy


def layer_adapter_params(
    model: ModelSpec,
    spec: FinetuneSpec,
    moe_layer: bool,
    tp: int = 1,
    ep: int = 1,
    etp: int | None = None,
) -> tuple[float, float]:
    """(dense, routed-expert) trainable adapter parameters of one layer on one TP/EP rank."""
    dense = expert = 0.0
    for linear in targeted_linears(model, spec, moe_layer, tp):
        params = module_adapter_params(linear, spec, tp, ep, etp)
        if linear.routed_expert:
            expert += params
        else:
            dense += params
    return dense, expert


def num_adapter_params(model: ModelSpec, spec: FinetuneSpec) -> int:
    """Trainable adapter parameters of the whole model (what PEFT prints as trainable)."""
    total = 0.0
    for moe_layer, layers in layer_kinds_count(model).items():
        total += layers * sum(layer_adapter_params(model, spec, moe_layer))
    return round(total)


def vera_projection_params(model: ModelSpec, spec: FinetuneSpec) -> int:
    """VeRA's frozen shared A (r × max in) and B (max out × r); 0 for other recipes."""
    if spec.recipe != "vera":
        return 0
    linears = [
        linear
        for moe_layer in layer_kinds_count(model)
        for linear in targeted_linears(model, spec, moe_layer)
    ]
    widest_in = max(linear.in_features for linear in linears)
    widest_out = max(linear.out_features for linear in linears)
    return spec.lora_rank * (widest_in + widest_out)


def layer_quantized_params(
    model: ModelSpec,
    spec: FinetuneSpec,
    moe_layer: bool,
    tp: int = 1,
    ep: int = 1,
    etp: int | None = None,
) -> tuple[float, float]:
    """(dense, routed-expert) NF4 weights of one layer on one rank: every linear under QLoRA."""
    if not spec.quantized:
        return 0.0, 0.0
    dense = expert = 0.0
    for linear in layer_linears(model, moe_layer, tp):
        rows_in, rows_out = linear.local_shape(tp, etp)
        weights = linear.local_count(ep) * rows_in * rows_out
        if linear.routed_expert:
            expert += weights
        else:
            dense += weights
    return dense, expert


def num_quantized_params(model: ModelSpec, spec: FinetuneSpec) -> int:
    total = 0.0
    for moe_layer, layers in layer_kinds_count(model).items():
        total += layers * sum(layer_quantized_params(model, spec, moe_layer))
    return round(total)


def adapter_states_per_param(model: ModelSpec, spec: FinetuneSpec, optimizer: str) -> float:
    """Average optimizer state elements per trainable adapter parameter.

    AdamW 2, SGD-momentum and Lion 1, plain SGD 0. Muon: one buffer for the 2-D A and B,
    AdamW's two for the vectors (DoRA magnitude, VeRA d and b). Adafactor: row + column
    statistics per matrix, a full second moment for vectors (Shazeer & Stern 2018, Alg. 4).
    """
    fixed = {"adamw": 2, "sgd-momentum": 1, "lion": 1, "sgd": 0}
    if optimizer in fixed:
        return float(fixed[optimizer])
    r, states, params = spec.lora_rank, 0.0, 0.0
    for moe_layer, layers in layer_kinds_count(model).items():
        for linear in targeted_linears(model, spec, moe_layer):
            n_in, n_out, copies = linear.in_features, linear.out_features, layers * linear.count
            if spec.recipe == "vera":
                vectors, matrices = [r, n_out], []
            else:
                vectors = [n_out] if spec.recipe == "dora" else []
                matrices = [(r, n_in), (n_out, r)]
            for rows, cols in matrices:
                per_matrix = 1 if optimizer == "muon" else (rows + cols) / (rows * cols)
                states += copies * rows * cols * per_matrix
                params += copies * rows * cols
            states += copies * sum(vectors) * (2 if optimizer == "muon" else 1)
            params += copies * sum(vectors)
    return states / params if params else 0.0

"""Bytes per parameter: precision recipes and optimizers.

Model-state memory per parameter is the sum of four parts (ZeRO, Rajbhandari et al. 2020,
§3.1): working weights, gradients, FP32 master weights (mixed precision keeps them for the
update) and the optimizer's states. Mixed-precision AdamW with BF16 weights and gradients
is 2 + 2 + 4 + 4 + 4 = 16 bytes (ZeRO's 2Ψ + 2Ψ + KΨ with K = 12); accumulating gradients
in FP32 makes it 18 (Megatron-LM's figure). ZeRO stage 1 shards master weights and
optimizer states over the data-parallel group, stage 2 also gradients, stage 3 also the
working weights.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from hwspecs.errors import PlanError

DTYPE_BYTES: dict[str, float] = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "fp4": 0.5, "none": 0}

#: GEMM dtypes whose recipes quantize their operands online and keep some work in BF16.
LOW_PRECISION_GEMM_DTYPES = ("fp8", "fp4")

PrecisionName = Literal["bf16-mixed", "fp16-mixed", "fp32", "bf16", "fp8-mixed", "fp4-mixed"]
OptimizerName = Literal["adamw", "sgd-momentum", "lion", "adafactor", "muon", "sgd"]

#: name -> (weight dtype, default gradient dtype, master dtype, optimizer-state dtype, GEMM dtype)
PRECISION_RECIPES: dict[str, tuple[str, str, str, str, str]] = {
    # BF16 weights and gradients, FP32 master copy and FP32 states (Megatron / ZeRO default).
    "bf16-mixed": ("bf16", "bf16", "fp32", "fp32", "bf16"),
    "fp16-mixed": ("fp16", "fp16", "fp32", "fp32", "bf16"),
    # Everything in FP32 (no separate master copy).
    "fp32": ("fp32", "fp32", "none", "fp32", "tf32"),
    # Pure BF16: weights, gradients and states in BF16, no master copy.
    "bf16": ("bf16", "bf16", "none", "bf16", "bf16"),
    # DeepSeek-V3 §3.3: FP8 GEMMs, BF16 working weights, FP32 master weights and gradient
    # accumulation, BF16 AdamW moments.
    "fp8-mixed": ("bf16", "fp32", "fp32", "bf16", "fp8"),
    # NVFP4 GEMMs (TransformerEngine's NVFP4BlockScaling: E2M1 values in 16-element blocks
    # with E4M3 scales, forward and both backward GEMMs; NVIDIA, arXiv 2509.25149) on
    # Megatron-Bridge's bf16_with_nvfp4_mixed: BF16 working weights, FP32 main gradients,
    # FP32 master weights and AdamW states. Attention and the other non-linear work stay BF16.
    "fp4-mixed": ("bf16", "fp32", "fp32", "fp32", "fp4"),
}

#: optimizer -> number of per-parameter state tensors for a large 2-D weight matrix.
#: AdamW keeps m and v; SGD with momentum and Lion one buffer; Adafactor factors the second
#: moment into row and column vectors (≈ 0 per parameter for large matrices, no momentum by
#: default, Shazeer & Stern 2018); Muon keeps one momentum buffer for 2-D hidden matrices
#: (Jordan et al. 2024) and AdamW's two for embeddings, norms and the output head.
OPTIMIZER_STATES_PER_MATRIX_PARAM: dict[str, int] = {
    "adamw": 2,
    "sgd-momentum": 1,
    "lion": 1,
    "adafactor": 0,
    "muon": 1,
    "sgd": 0,
}


class BytesPerParam(BaseModel):
    """Model-state bytes per parameter on one GPU, split as ZeRO splits them."""

    model_config = ConfigDict(frozen=True)

    weights: float
    gradients: float
    master_weights: float
    optimizer_states: float

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.master_weights + self.optimizer_states


class PrecisionSpec(BaseModel):
    """A precision recipe with optional overrides of its gradient and master dtypes."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    recipe: PrecisionName = "bf16-mixed"
    optimizer: OptimizerName = "adamw"
    grad_dtype: Literal["fp32", "bf16", "fp16"] | None = None
    master_dtype: Literal["fp32", "bf16", "none"] | None = None
    optimizer_state_dtype: Literal["fp32", "bf16"] | None = None

    @property
    def weight_dtype(self) -> str:
        return PRECISION_RECIPES[self.recipe][0]

    @property
    def gradient_dtype(self) -> str:
        return self.grad_dtype or PRECISION_RECIPES[self.recipe][1]

    @property
    def master_weight_dtype(self) -> str:
        return self.master_dtype or PRECISION_RECIPES[self.recipe][2]

    @property
    def state_dtype(self) -> str:
        return self.optimizer_state_dtype or PRECISION_RECIPES[self.recipe][3]

    @property
    def gemm_dtype(self) -> str:
        """The dtype whose peak the GEMMs run at."""
        return PRECISION_RECIPES[self.recipe][4]

    @property
    def activation_bytes(self) -> float:
        """Bytes per stored activation element (FP32 training keeps FP32 activations)."""
        return 4.0 if self.recipe == "fp32" else 2.0


def unsharded_bytes_per_param(
    precision: PrecisionSpec, optimizer_states_per_param: float | None = None
) -> BytesPerParam:
    """Bytes per parameter before any ZeRO sharding.

    ``optimizer_states_per_param`` overrides the optimizer's state count (a model-averaged
    figure for Muon or Adafactor; see :func:`optimizer_states_per_param`).
    """
    states = (
        OPTIMIZER_STATES_PER_MATRIX_PARAM[precision.optimizer]
        if optimizer_states_per_param is None
        else optimizer_states_per_param
    )
    return BytesPerParam(
        weights=DTYPE_BYTES[precision.weight_dtype],
        gradients=DTYPE_BYTES[precision.gradient_dtype],
        master_weights=DTYPE_BYTES[precision.master_weight_dtype],
        optimizer_states=states * DTYPE_BYTES[precision.state_dtype],
    )


def zero_shard_factors(zero_stage: int, dp: int) -> BytesPerParam:
    """Divisors each part gets under ZeRO ``zero_stage`` over ``dp`` ranks (Rajbhandari et al. §5)."""
    if zero_stage not in (0, 1, 2, 3):
        raise PlanError(f"zero_stage must be 0, 1, 2 or 3, got {zero_stage}")
    if dp < 1:
        raise PlanError(f"dp must be a positive integer, got {dp}")
    return BytesPerParam(
        weights=dp if zero_stage >= 3 else 1,
        gradients=dp if zero_stage >= 2 else 1,
        master_weights=dp if zero_stage >= 1 else 1,
        optimizer_states=dp if zero_stage >= 1 else 1,
    )


def sharded_bytes_per_param(
    precision: PrecisionSpec,
    zero_stage: int = 0,
    dp: int = 1,
    optimizer_states_per_param: float | None = None,
) -> BytesPerParam:
    """Bytes per parameter held by one data-parallel rank under ZeRO ``zero_stage``.

    Examples (ZeRO Figure 1, K = 12): stage 0 → 16; stage 1 over 64 → 4 + 12/64;
    stage 2 → 2 + 14/64; stage 3 → 16/64.
    """
    whole = unsharded_bytes_per_param(precision, optimizer_states_per_param)
    factors = zero_shard_factors(zero_stage, dp)
    return BytesPerParam(
        weights=whole.weights / factors.weights,
        gradients=whole.gradients / factors.gradients,
        master_weights=whole.master_weights / factors.master_weights,
        optimizer_states=whole.optimizer_states / factors.optimizer_states,
    )


def optimizer_states_per_param(optimizer: str, model) -> float:
    """Average optimizer state tensors per parameter of ``model`` (a ModelSpec).

    Muon: one buffer for the 2-D hidden matrices, AdamW's two for embeddings, the output
    head and the norm vectors. Adafactor: row + column statistics per matrix, a full
    second moment for vectors (Shazeer & Stern 2018, Alg. 4). Others: their fixed count.
    """
    if optimizer not in ("muon", "adafactor"):
        return float(OPTIMIZER_STATES_PER_MATRIX_PARAM[optimizer])
    total = model.num_params()
    vectors = _norm_and_bias_params(model)
    embedding_and_head = model.embedding_params() + model.lm_head_params()
    matrices = total - vectors - embedding_and_head
    if optimizer == "muon":
        return (matrices * 1 + (vectors + embedding_and_head) * 2) / total
    # Adafactor: factored second moment of each matrix ≈ (rows + cols) per matrix.
    h = model.hidden_size
    factored = (matrices / h) * 2 + embedding_and_head / h + model.vocab_size * 2
    return (factored + vectors) / total


def _norm_and_bias_params(model) -> int:
    """Parameters in 1-D tensors (norm weights/biases, linear biases, router bias)."""
    whole = model.num_params()
    no_vectors = model.model_copy(
        update={
            "norm_kind": "rmsnorm",
            "qkv_bias": False,
            "linear_bias": False,
            "qk_norm": False,
            "router_bias": False,
        }
    )
    norms = (2 * model.num_layers + 1) * no_vectors.norm_params()
    if model.attention_kind == "mla":
        norms += model.num_layers * ((model.q_lora_rank or 0) + model.kv_lora_rank)
    return whole - no_vectors.num_params() + norms

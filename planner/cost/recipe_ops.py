"""What a training recipe adds to a layer's operations: the online FP8 quantization of every
FP8 GEMM's operands, the operations an FP8 recipe keeps in BF16, and the forward work the
memory measures rerun in the backward (DeepSeek-V3, arXiv 2412.19437 §3.2.3, §3.3.2), and
the forward work each of Megatron-Core's selective recompute modules reruns."""

from __future__ import annotations

from planner.cost.compute import NORM_PASSES, RESIDUAL_PASSES, GpuRates
from planner.cost.head_times import MTP_PREFIX
from planner.cost.op_time import OpTime, memory_op
from planner.spec.model import ModelSpec
from planner.structure.linears import expert_fold, layer_linears, token_rows

#: GEMMs DeepSeek-V3 keeps in BF16 under its FP8 recipe (arXiv 2412.19437 §3.3: "the
#: embedding module, the output head, MoE gating modules, normalization operators, and
#: attention operators"); attention's dtype is already :func:`attention_dtype`'s (in
#: :class:`GpuRates`), and the norms and the embedding are memory-bound here.
KEPT_IN_BF16 = ("moe.router", "lm_head")


def keep_in_bf16(ops: list[OpTime], ops_at_bf16: list[OpTime]) -> list[OpTime]:
    """``ops`` (timed at the FP8 rate) with the :data:`KEPT_IN_BF16` ones from ``ops_at_bf16``
    (an MTP module's copies, ``mtp.``-prefixed, too)."""
    bf16 = {op.name: op for op in ops_at_bf16}
    return [bf16[op.name] if op.name.removeprefix(MTP_PREFIX) in KEPT_IN_BF16 else op for op in ops]


def measures_recompute_s(measures, module_rerun: dict, ops: list[OpTime], moe_layer: bool) -> float:
    """Forward work DeepSeek-V3's memory measures rerun in one layer's backward, seconds.

    arXiv 2412.19437 §3.2.3: both RMSNorms and MLA's query and KV up-projections with the
    rotary embedding of their output, what Megatron-Core's ``layernorm`` and ``mla_up_proj``
    modules rerun (``module_rerun``: :func:`module_rerun_s`); §3.3.3: the MoE SwiGLU's
    output from its cached inputs, routed and shared experts' (``ops``: the layer's
    operations, :func:`planner.cost.compute.layer_op_times`).
    """
    seconds = 0.0
    if measures.recompute_norms_and_mla_up_proj:
        seconds += module_rerun["layernorm"] + module_rerun.get("mla_up_proj", 0.0)
    if measures.swiglu_input_cached and moe_layer:
        seconds += next(op.forward_s for op in ops if op.name == "elementwise.mlp_activation")
    return seconds


#: The operations whose forward MLA's up-projection module reruns (with the rotary).
MLA_UP_PROJ_OPS = ("attention.q_up_proj", "attention.q_proj", "attention.kv_up_proj")


def module_rerun_s(model: ModelSpec, ops: list[OpTime], moe_layer: bool, ep: int) -> dict:
    """Seconds of forward work each Megatron-Core selective recompute module
    (:mod:`planner.spec.recompute`) reruns in one layer's backward, from the layer's
    operations (:func:`planner.cost.compute.layer_op_times`): ``core_attn`` the attention
    core; ``layernorm`` the two norms' share of the norm and residual traffic; ``mla_up_proj``
    the query and key/value up-projections and the rotary; ``moe_act`` the routed experts'
    share of the activation; ``mlp`` (dense layers) the MLP's GEMMs and activation;
    ``shared_experts`` their GEMM and their share of the activation."""
    forward = {op.name: op.forward_s for op in ops}
    activation = forward.get("elementwise.mlp_activation", 0.0)
    norms = NORM_PASSES / (NORM_PASSES + RESIDUAL_PASSES)
    rerun = {
        "core_attn": forward.get("attention.core", 0.0),
        "layernorm": norms * forward.get("elementwise.norms_residuals", 0.0),
    }
    if model.attention_kind == "mla":
        up = sum(forward.get(name, 0.0) for name in MLA_UP_PROJ_OPS)
        rerun["mla_up_proj"] = up + forward.get("elementwise.rotary", 0.0)
    if not moe_layer:
        rerun["mlp"] = forward.get("mlp", 0.0) + activation
        return rerun
    routed = model.num_experts_per_token * model.routed_load_factor(ep)
    routed_share = routed / (routed + model.num_shared_experts)
    rerun["moe_act"] = activation * routed_share
    if model.num_shared_experts:
        shared = forward.get("moe.shared_experts", 0.0)
        rerun["shared_experts"] = shared + activation * (1 - routed_share)
    return rerun


#: Bytes moved per element to quantize a 16-bit operand to FP8 with per-tile scales: read
#: 2, write 1 (DeepSeek-V3 §3.3.2; the scales, one FP32 per 128 elements, are negligible).
QUANTIZE_BYTES = 3.0


#: Re-tiling an FP8 operand for the transposed GEMM (1×128 tiles → 128×1): read 1, write 1.
REQUANTIZE_BYTES = 2.0


def quantized_operand_elements(
    model: ModelSpec, tokens: float, tp: int, ep: int, moe_layer: bool, etp=None, linears=None
) -> tuple[float, float]:
    """(elements of the layer's GEMM inputs ``X``, of their output gradients ``dY``) on one
    rank for one micro-batch, over the GEMMs a low-precision recipe quantizes (the router and
    the output head stay BF16, :data:`KEPT_IN_BF16`). Elements per module: the rank's rows
    (tokens × token share × copies, routed experts balanced over EP) × its local in / out
    features; modules that read one tensor (Q/K/V, MLA's two down projections, gate and up)
    quantize it once. ``linears``: the layer's linear modules at this tp, when the caller
    has them."""
    inputs: dict[tuple, float] = {}  # modules reading one tensor (Q/K/V, gate/up) share it
    dy_elements = 0.0
    for linear in linears if linears is not None else layer_linears(model, moe_layer, tp):
        if linear.name in KEPT_IN_BF16 or linear.block == "router":
            continue
        width_in, width_out = linear.local_shape(tp, etp)
        rows = token_rows(linear, model, tokens, ep, expert_fold(tp, etp))
        shared = (linear.block, linear.prefix, linear.in_features)  # column-parallel siblings
        inputs[linear.path if linear.tp_split == "row" else shared] = rows * width_in
        dy_elements += rows * width_out
    return sum(inputs.values()), dy_elements


def fp8_quantization_time(x_elements: float, dy_elements: float, hbm_bytes_per_s: float) -> OpTime:
    """The online FP8 quantization around one layer's FP8 GEMMs, for one micro-batch, of
    its operands' ``x_elements`` and ``dy_elements`` (:func:`quantized_operand_elements`).

    DeepSeek-V3 §3.3.2 (fine-grained quantization, Figure 6): each FP8 GEMM reads operands
    quantized on the fly, per 1×128 activation tile. Forward quantizes the input ``X``;
    the input gradient quantizes ``dY``; the weight gradient needs both transposed: ``dY``
    quantized again along the other axis and the cached FP8 ``X`` re-tiled. Memory-bound at
    HBM rate: ``3·|X|``, ``3·|dY|`` and ``3·|dY| + 2·|X|`` bytes. Weights are quantized
    once per step (left out).
    """
    return memory_op(
        "fp8.quantize",
        QUANTIZE_BYTES * x_elements,
        QUANTIZE_BYTES * dy_elements,
        QUANTIZE_BYTES * dy_elements + REQUANTIZE_BYTES * x_elements,
        hbm_bytes_per_s,
    )


#: Bytes moved per element to quantize a 16-bit operand to NVFP4 for both of its GEMMs at
#: once: read 2; write the row-wise and the column-wise E2M1 copies, half a byte each, and
#: one E4M3 scale per 16-element block of each (2/16). TransformerEngine's NVFP4BlockScaling
#: computes both copies from the high-precision tensor in one pass (its docstring: the
#: quantized tensor and its transpose are not equivalent, so both come from the input).
NVFP4_QUANTIZE_BYTES = 2.0 + 2 * 0.5 + 2 / 16


def nvfp4_quantization_time(
    x_elements: float, dy_elements: float, hbm_bytes_per_s: float
) -> OpTime:
    """The online NVFP4 quantization around one layer's FP4 GEMMs, for one micro-batch, of
    its operands' ``x_elements`` and ``dy_elements`` (:func:`quantized_operand_elements`).

    TransformerEngine's NVFP4BlockScaling (NVIDIA, arXiv 2509.25149): the forward quantizes
    ``X`` row-wise for its GEMM and column-wise, after a 16×16 random Hadamard transform, for
    the weight gradient; the backward quantizes ``dY`` both ways (stochastic rounding), and
    the weight gradient reads the two cached copies. Memory-bound at HBM rate (the Hadamard
    transform is 32 FLOPs per element, fused): :data:`NVFP4_QUANTIZE_BYTES` per element of
    ``X`` in the forward and of ``dY`` in the input gradient. Weights are quantized once
    per step (left out).
    """
    return memory_op(
        "fp4.quantize",
        NVFP4_QUANTIZE_BYTES * x_elements,
        NVFP4_QUANTIZE_BYTES * dy_elements,
        0.0,
        hbm_bytes_per_s,
    )


def quantization_time(
    model: ModelSpec,
    tokens: float,
    tp: int,
    ep: int,
    moe_layer: bool,
    rates: GpuRates,
    etp: int | None = None,
    linears=None,
) -> OpTime:
    """The online quantization of one layer's low-precision GEMM operands, for one
    micro-batch (``linears``: the layer's linear modules at this tp, when the caller has
    them), under ``rates``' GEMM dtype (:attr:`GpuRates.gemm_dtype`): NVFP4's for FP4
    (:func:`nvfp4_quantization_time`), else FP8's (:func:`fp8_quantization_time`)."""
    elements = quantized_operand_elements(model, tokens, tp, ep, moe_layer, etp, linears)
    quantize = nvfp4_quantization_time if rates.gemm_dtype == "fp4" else fp8_quantization_time
    return quantize(*elements, rates.hbm_bytes_per_s)

"""Compute time per operation on one GPU: a roofline over FLOPs and HBM traffic.

Each operation runs for ``max(FLOPs / (peak × matmul efficiency), bytes / (HBM bandwidth ×
HBM efficiency))`` (Williams et al. 2009, the roofline model), on the shapes the GPU really
runs after the TP / CP / EP splits: GEMM FLOPs and weights split by TP, tokens by CP (and
by TP under sequence parallelism for the element-wise work), routed tokens spread over the
EP group. Element-wise operations (norms, rotary, the SwiGLU/GELU activation, residual
adds, the softmax without flash attention, cross-entropy) have no FLOPs in the model count
and cost their memory traffic. Backward element-wise work reads the saved input and the
incoming gradient and writes one gradient: twice the forward traffic.
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict

from hwspecs.attention import curve_at
from hwspecs.schema import Accelerator
from planner.cost.attention_times import attention_core_time, unfused_attention_time
from planner.cost.flops import (
    CAUSAL_FRACTION,
    attention_core_ops,
    attention_pair_fraction,
    windowed_pair_fraction,
)
from planner.cost.moe_times import moe_permutation_time
from planner.cost.op_time import OpTime, memory_op
from planner.spec.model import ModelSpec
from planner.spec.precision import DTYPE_BYTES, LOW_PRECISION_GEMM_DTYPES
from planner.structure.linears import expert_fold, kv_heads_per_rank


def attention_dtype(gemm_dtype: str) -> str:
    """The dtype attention runs in: FP8 recipes keep attention in BF16 (DeepSeek-V3 §3.3.1),
    and so does NVFP4's (TransformerEngine quantizes its linear layers only)."""
    return "bf16" if gemm_dtype in LOW_PRECISION_GEMM_DTYPES else gemm_dtype


#: Output tile of one GEMM thread block: 128 × 256, the default Hopper tile of CUTLASS 3.x
#: (``KernelTmaWarpSpecializedCooperative``, TileShape 128x256x64) — a documented default.
GEMM_TILE_M, GEMM_TILE_N = 128, 256


class GpuRates(BaseModel):
    """Achievable rates of one accelerator for one GEMM dtype."""

    model_config = ConfigDict(frozen=True)

    matmul_flops_per_s: float
    hbm_bytes_per_s: float
    compute_units: int | None = None
    #: Attention in its own dtype (:func:`attention_dtype`): fused kernels (FlashAttention)
    #: forward and backward, and unfused batched GEMMs; None: at the matmul rate.
    attention_forward_flops_per_s: float | None = None
    attention_backward_flops_per_s: float | None = None
    attention_matmul_flops_per_s: float | None = None
    #: The fused kernel's rates by sequence length (:meth:`Accelerator.attention_curve`:
    #: lengths, forward FLOP/s, backward FLOP/s); None: the rates above at every length.
    attention_curve: tuple[tuple[int, ...], tuple[float, ...], tuple[float, ...]] | None = None
    #: Fixed seconds per dispatched operation (:attr:`Accelerator.op_overhead_s`; 0 unset),
    #: per operation on a DTensor (:attr:`Accelerator.sharded_op_overhead_s`; unset: the
    #: plain figure) and per functional collective beyond its c10d cost.
    op_overhead_s: float = 0.0
    sharded_op_overhead_s: float = 0.0
    functional_collective_overhead_s: float = 0.0
    #: Bytes per element of the gradient buffer weight-gradient GEMMs accumulate into (the
    #: job's gradient dtype); None: W is timed as a plain write of its output.
    gradient_bytes: float | None = None
    #: The dtype the GEMMs run in (the recipe's :attr:`PrecisionSpec.gemm_dtype`): which
    #: online quantization its operands pay (:func:`planner.cost.recipe_ops.quantization_time`).
    gemm_dtype: str = "bf16"

    @classmethod
    def of(
        cls,
        accelerator: Accelerator,
        gemm_dtype: str,
        attention_kernel: str | None = None,
        gradient_bytes: float | None = None,
    ) -> GpuRates:
        """The rates of ``gemm_dtype`` GEMMs, with attention at ``attention_kernel``'s
        measured rates where the accelerator records them (None: its default kernel's) and
        W's accumulation at ``gradient_bytes`` per element."""
        dtype = attention_dtype(gemm_dtype)
        forward, backward = accelerator.achievable_attention_flops_per_s(dtype, attention_kernel)
        curve = accelerator.attention_curve(dtype, attention_kernel)
        return cls(
            matmul_flops_per_s=accelerator.achievable_matmul_flops_per_s(gemm_dtype),
            hbm_bytes_per_s=accelerator.hbm_bytes_per_s * accelerator.hbm_bandwidth_efficiency,
            compute_units=accelerator.num_compute_units,
            attention_forward_flops_per_s=forward,
            attention_backward_flops_per_s=backward,
            attention_matmul_flops_per_s=accelerator.achievable_matmul_flops_per_s(dtype),
            attention_curve=None if curve is None else tuple(tuple(c) for c in curve),
            op_overhead_s=accelerator.op_overhead_s or 0.0,
            sharded_op_overhead_s=(
                accelerator.sharded_op_overhead_s or accelerator.op_overhead_s or 0.0
            ),
            functional_collective_overhead_s=accelerator.functional_collective_overhead_s or 0.0,
            gradient_bytes=gradient_bytes,
            gemm_dtype=gemm_dtype,
        )

    @classmethod
    def untimed(cls) -> GpuRates:
        """Unit rates, for evaluations that read only memory (no accelerator given): the
        memory model reads no rate, the times these give mean nothing."""
        return cls(matmul_flops_per_s=1.0, hbm_bytes_per_s=1.0)

    def attention_flops_per_s(self, seq_len: float | None = None) -> tuple[float, float]:
        """(forward, backward) FLOP/s of the fused attention kernel on sequences of
        ``seq_len`` tokens (its keys per query block; :attr:`attention_curve`, interpolated
        in log2(length)), the single recorded rates where there is no curve or no length,
        the matmul rate where there are none."""
        if self.attention_curve is not None and seq_len is not None:
            return curve_at(self.attention_curve, seq_len)
        return (
            self.attention_forward_flops_per_s or self.matmul_flops_per_s,
            self.attention_backward_flops_per_s or self.matmul_flops_per_s,
        )

    def roofline_s(self, flops: float, num_bytes: float) -> float:
        return max(flops / self.matmul_flops_per_s, num_bytes / self.hbm_bytes_per_s)

    def wave_efficiency(self, m: float, n: float, count: float = 1) -> float:
        """Fraction of the GPU's SMs busy over a GEMM's waves of output tiles.

        A (m × n) output splits into ⌈m/128⌉·⌈n/256⌉ tiles, one per SM at a time; the last
        wave leaves SMs idle (wave quantization, NVIDIA's "Matrix Multiplication Background
        User's Guide"). The measured matmul efficiency is for shapes with whole waves, so
        this factor multiplies it. 1.0 when the accelerator lists no compute units (TPUs).
        """
        if not self.compute_units:
            return 1.0
        tiles = math.ceil(m / GEMM_TILE_M) * math.ceil(n / GEMM_TILE_N) * count
        waves = math.ceil(tiles / self.compute_units)
        return tiles / (waves * self.compute_units)

    def gemm_s(
        self,
        m: float,
        n: float,
        k: float,
        element_bytes: float,
        count: float = 1,
        output_bytes: float | None = None,
    ) -> float:
        """Roofline time of ``count`` (m × k)·(k × n) GEMMs with wave quantization;
        ``output_bytes``: HBM bytes per output element (None: one write of ``element_bytes``)."""
        flops = 2.0 * m * n * k * count
        out = element_bytes if output_bytes is None else output_bytes
        moved = ((m * k + k * n) * element_bytes + m * n * out) * count
        compute = flops / (self.matmul_flops_per_s * self.wave_efficiency(m, n, count))
        return max(compute, moved / self.hbm_bytes_per_s)


def job_rates(accelerator: Accelerator, job) -> tuple[GpuRates, GpuRates | None]:
    """(the rates of ``job``'s GEMM dtype, BF16 rates under FP8 or FP4 GEMMs or None), with
    W's accumulation at the job's gradient dtype (:attr:`GpuRates.gradient_bytes`)."""
    gradient_bytes = DTYPE_BYTES[job.precision.gradient_dtype]
    kernel, gemm_dtype = job.attention_kernel, job.precision.gemm_dtype
    rates = GpuRates.of(accelerator, gemm_dtype, kernel, gradient_bytes)
    low = gemm_dtype in LOW_PRECISION_GEMM_DTYPES
    bf16 = GpuRates.of(accelerator, "bf16", kernel, gradient_bytes) if low else None
    return rates, bf16


def gemm_time(
    name: str,
    tokens: float,
    k: float,
    n: float,
    rates: GpuRates,
    element_bytes: float,
    count: float = 1,
) -> OpTime:
    """``count`` GEMMs of (tokens × k)·(k × n) and their two backward GEMMs.

    Forward (tokens × n output), input gradient ``dX = dY·Wᵀ`` (tokens × k output) and weight
    gradient ``dW = Xᵀ·dY`` (k × n output) have the same FLOPs but their own output shapes,
    so their own waves. Where W accumulates into a gradient buffer kept over micro-batches,
    its epilogue reads and writes that buffer: ``2 × gradient_bytes`` per output element
    (Megatron-LM's ``--gradient-accumulation-fusion``, ``main_grad += Xᵀ·dY``; unfused,
    autograd's ``.grad`` accumulation moves at least as much): W turns memory-bound below
    about gradient_bytes·(FLOP/s)/(bytes/s) tokens (H100: ≈ 600 with BF16, 1,200 with FP32).
    Worked out once per distinct call (:data:`_GEMM_TIMES`).
    """
    key = (name, tokens, k, n, id(rates), element_bytes, count)
    known = _GEMM_TIMES.get(key)
    if known is not None and known[0] is rates:
        return known[1]
    if len(_GEMM_TIMES) >= _GEMM_TIMES_SIZE:
        _GEMM_TIMES.clear()
    found = _gemm_time(name, tokens, k, n, rates, element_bytes, count)
    _GEMM_TIMES[key] = rates, found
    return found


#: :func:`gemm_time` per distinct call, kept over calls: a search's shape table asks for
#: the same GEMMs under many shapes (DeepSeek-V3 on 2,048 GPUs: 1,686 distinct of 19,736).
#: OpTime is frozen, so one can be shared; each entry holds its rates, so an id in a key is
#: never other rates'.
_GEMM_TIMES: dict[tuple, tuple] = {}
_GEMM_TIMES_SIZE = 2**15


def _gemm_time(name, tokens, k, n, rates, element_bytes, count) -> OpTime:
    flops = 2.0 * tokens * k * n * count
    forward = rates.gemm_s(tokens, n, k, element_bytes, count)
    moved = (tokens * k + k * n + tokens * n) * element_bytes * count
    bound = (
        "compute" if flops / rates.matmul_flops_per_s >= moved / rates.hbm_bytes_per_s else "memory"
    )
    return OpTime(
        name=name,
        forward_s=forward,
        input_grad_s=rates.gemm_s(tokens, k, n, element_bytes, count),
        weight_grad_s=rates.gemm_s(k, n, tokens, element_bytes, count),
        weight_grad_accumulate_s=(
            None
            if rates.gradient_bytes is None
            else rates.gemm_s(k, n, tokens, element_bytes, count, 2 * rates.gradient_bytes)
        ),
        forward_flops=flops,
        bound=bound,
    )


def dispatch_time(name: str, ops, rates: GpuRates, sharded=None, collectives=None) -> OpTime:
    """The fixed host cost of dispatching ``ops`` (a :class:`planner.structure.op_counts.PassOps`):
    ``operations × op_overhead_s`` per pass, on top of the roofline times (an eager
    framework runs each operation after its dispatch, so the two add). ``sharded``: how
    many of ``ops`` run on DTensors, at ``sharded_op_overhead_s`` each instead;
    ``collectives``: functional collectives issued, ``functional_collective_overhead_s``
    each (their transfer is the communication model's)."""
    extra = rates.sharded_op_overhead_s - rates.op_overhead_s
    per_collective = rates.functional_collective_overhead_s
    forward, input_grad, weight_grad = (
        count * rates.op_overhead_s + on_dtensors * extra + issued * per_collective
        for count, on_dtensors, issued in zip(
            ops, sharded or (0, 0, 0), collectives or (0, 0, 0), strict=True
        )
    )
    return OpTime(
        name=name,
        forward_s=forward,
        input_grad_s=input_grad,
        weight_grad_s=weight_grad,
        forward_flops=0.0,
        bound="overhead",
    )


def elementwise_time(name: str, forward_bytes: float, rates: GpuRates) -> OpTime:
    """Memory-bound work: forward traffic once, backward twice (all of it input gradient)."""
    return memory_op(name, forward_bytes, 2 * forward_bytes, 0.0, rates.hbm_bytes_per_s)


#: Passes over ``[tokens, h]`` of a layer's two norms (each reads its input and writes its
#: output) and of its two residual additions (each reads two and writes one), the traffic of
#: ``elementwise.norms_residuals``.
NORM_PASSES = 2 * 2
RESIDUAL_PASSES = 2 * 3


def layer_op_times(
    model: ModelSpec,
    seq_len: int,
    micro_batch_size: int,
    tp: int,
    cp: int,
    ep: int,
    sequence_parallel: bool,
    flash_attention: bool,
    moe_layer: bool,
    rates: GpuRates,
    element_bytes: float = 2.0,
    etp: int | None = None,
) -> list[OpTime]:
    """Every operation of one transformer layer for one micro-batch on one GPU (``etp``:
    the routed experts' TP degree, None for tp)."""
    tokens = seq_len * micro_batch_size / cp
    h, e = model.hidden_size, element_bytes
    sp_tokens = tokens / tp if sequence_parallel and tp > 1 else tokens
    q_local = model.num_attention_heads * model.head_dim / tp
    kv_local = kv_heads_per_rank(model, tp) * model.head_dim
    ops: list[OpTime] = []
    if model.attention_kind == "mla":
        nq, rope = model.num_attention_heads / tp, model.qk_rope_head_dim
        kv_rank, v = model.kv_lora_rank, model.value_head_dim
        if model.q_lora_rank:
            ops.append(gemm_time("attention.q_down_proj", tokens, h, model.q_lora_rank, rates, e))
            ops.append(
                gemm_time(
                    "attention.q_up_proj", tokens, model.q_lora_rank, nq * model.head_dim, rates, e
                )
            )
        else:
            ops.append(gemm_time("attention.q_proj", tokens, h, nq * model.head_dim, rates, e))
        ops.append(gemm_time("attention.kv_down_proj", tokens, h, kv_rank + rope, rates, e))
        ops.append(
            gemm_time(
                "attention.kv_up_proj", tokens, kv_rank, nq * (model.head_dim - rope + v), rates, e
            )
        )
        ops.append(gemm_time("attention.out_proj", tokens, nq * v, h, rates, e))
        qkv_width = nq * (2 * model.head_dim + v)
    else:
        ops.append(gemm_time("attention.qkv_proj", tokens, h, q_local + 2 * kv_local, rates, e))
        ops.append(gemm_time("attention.out_proj", tokens, q_local, h, rates, e))
        qkv_width = q_local + 2 * kv_local
    # Attention core: each rank's local queries against all keys; heads split by TP.
    core = attention_core_ops(model, seq_len, micro_batch_size / cp, causal=True)
    # The average layer's (sliding-window layers' pairs averaged in), and a full layer's.
    core_flops = sum(op.forward for op in core) / tp
    full_layer_flops = core_flops / attention_pair_fraction(model, seq_len)
    core_bytes = tokens * (qkv_width + q_local) * e
    if flash_attention:
        ops.append(fused_attention_core_time(model, full_layer_flops, core_bytes, rates, seq_len))
    else:
        # The unfused kernels compute every score, the causal mask's half and the window's
        # outside too (they mask a full score matrix).
        every_score = full_layer_flops / CAUSAL_FRACTION
        scores = model.num_attention_heads / tp * tokens * seq_len
        ops.append(
            unfused_attention_time(every_score, core_bytes, scores, model.dropout > 0, rates, e)
        )
    ops.extend(_mlp_op_times(model, tokens, tp, ep, moe_layer, rates, e, etp))
    # Routed rows × etp/tp at width f/etp: the same elements whatever etp (expert_fold).
    ffn = _activation_width(model, moe_layer, ep) / tp
    activation_bytes = tokens * ffn * e * (3 if model.mlp_kind == "swiglu" else 2)
    norm_and_residual = sp_tokens * h * e * (NORM_PASSES + RESIDUAL_PASSES)
    rotary = 2 * tokens * (q_local + kv_local) * e if model.position_embedding == "rope" else 0.0
    ops.append(elementwise_time("elementwise.norms_residuals", norm_and_residual, rates))
    ops.append(elementwise_time("elementwise.rotary", rotary, rates))
    ops.append(elementwise_time("elementwise.mlp_activation", activation_bytes, rates))
    return ops


def fused_attention_core_time(
    model: ModelSpec, full_layer_flops: float, core_bytes: float, rates: GpuRates, seq_len: float
) -> OpTime:
    """The average layer's fused attention core, from a full-attention layer's forward FLOPs:
    full layers at the kernel's rate for ``seq_len`` keys, sliding-window layers on the pairs
    inside their window (:func:`planner.cost.flops.windowed_pair_fraction`) at its rate for
    the window's length (each query block meets that many keys), averaged over the layers.
    Without sliding-window layers, :func:`attention_core_time` at ``seq_len``."""
    windowed = model.num_sliding_window_layers
    full = attention_core_time(full_layer_flops, core_bytes, rates, seq_len)
    if not windowed or model.sliding_window >= seq_len:
        return full
    local = full_layer_flops * windowed_pair_fraction(model.sliding_window, seq_len)
    window = attention_core_time(local, core_bytes, rates, model.sliding_window)
    share = windowed / model.num_layers

    def mean(key: str) -> float:
        return (1 - share) * getattr(full, key) + share * getattr(window, key)

    return full.model_copy(
        update={key: mean(key) for key in ("forward_s", "input_grad_s", "forward_flops")}
    )


def _activation_width(model: ModelSpec, moe_layer: bool, ep: int = 1) -> float:
    """Width of the MLP activation per token (routed top-k and shared experts for MoE; the
    routed copies at the busiest EP rank's load, :meth:`ModelSpec.routed_load_factor`)."""
    if not moe_layer:
        return model.ffn_hidden_size
    routed = model.num_experts_per_token * model.routed_load_factor(ep)
    return (routed + model.num_shared_experts) * model.moe_ffn_hidden_size


def _mlp_op_times(model, tokens, tp, ep, moe_layer, rates, e, etp=None) -> list[OpTime]:
    """The dense MLP's GEMM, or the router, routed experts (grouped GEMM, width m·f/etp over
    rows tokens·k·load·etp/tp: :func:`planner.structure.linears.expert_fold`), the token
    dispatcher's permutations of their copies (:func:`moe_permutation_time`) and shared
    experts."""
    h, m = model.hidden_size, model.mlp_matrices
    if not moe_layer:
        return [gemm_time("mlp", tokens, h, m * model.ffn_hidden_size / tp, rates, e)]
    f = model.moe_ffn_hidden_size
    # The busiest EP rank's routed copies (balanced: tokens·k; ModelSpec.routed_load_factor),
    # over the TP ranks folded into EP.
    routed_tokens = (
        tokens * model.num_experts_per_token * model.routed_load_factor(ep) / expert_fold(tp, etp)
    )
    local_experts = model.num_routed_experts / ep
    # Grouped GEMM over the local experts: FLOPs follow the routed tokens, weights all local experts.
    routed = gemm_time(
        "moe.routed_experts",
        routed_tokens / local_experts,
        h,
        m * f / (tp if etp is None else etp),
        rates,
        e,
        count=local_experts,
    )
    ops = [gemm_time("moe.router", tokens, h, model.num_routed_experts, rates, e), routed]
    sent = routed_tokens / model.routed_load_factor(ep)  # the rank's own tokens' copies
    ops.append(moe_permutation_time(model, sent, routed_tokens, local_experts, rates, e))
    if model.num_shared_experts:
        ops.append(
            gemm_time(
                "moe.shared_experts", tokens, h, m * f * model.num_shared_experts / tp, rates, e
            )
        )
    return ops

"""Roofline op times: compute- vs memory-bound, wave quantization, B/W shapes."""

import pytest

from hwspecs.catalog import load_accelerator
from hwspecs.errors import PlanError
from hwspecs.schema import Accelerator
from planner.api import build_job, build_layout, estimate
from planner.cost.attention_times import attention_core_time, unfused_attention_time
from planner.cost.compute import (
    GEMM_TILE_M,
    GEMM_TILE_N,
    GpuRates,
    attention_dtype,
    gemm_time,
    layer_op_times,
)
from planner.spec.model import load_model

H100 = GpuRates.of(load_accelerator("h100-sxm"), "bf16")


def test_full_waves_run_at_the_measured_matmul_rate():
    m, n, k = GEMM_TILE_M * 12, GEMM_TILE_N * 11, 8192  # 132 tiles: one full wave on 132 SMs
    assert H100.wave_efficiency(m, n) == 1.0
    assert H100.gemm_s(m, n, k, 2) == pytest.approx(2 * m * n * k / (989.4e12 * 0.803), rel=1e-3)


def test_one_tile_past_a_wave_costs_a_second_wave():
    m, n = GEMM_TILE_M * 133, GEMM_TILE_N  # 133 tiles on 132 SMs: two waves, 133/264 busy
    assert H100.wave_efficiency(m, n) == pytest.approx(133 / 264)


def test_tpus_have_no_wave_quantization():
    rates = GpuRates.of(load_accelerator("tpu-v5p"), "bf16")
    assert rates.wave_efficiency(100, 100) == 1.0


def test_a_gemm_over_few_tokens_is_memory_bound():
    # 16 tokens through a 16384 × 16384 weight: reading 512 MiB of weights dominates.
    op = gemm_time("decode", 16, 16384, 16384, H100, 2.0)
    assert op.bound == "memory"
    assert op.forward_s == pytest.approx(
        16384 * 16384 * 2 * (1 + 32 / 16384) / (3.35e12 * 0.8), rel=1e-3
    )


def test_weight_gradient_accumulation_reads_and_writes_the_gradient_buffer():
    """W accumulating into FP32 gradients (Megatron's fused ``main_grad += Xᵀ·dY``) moves
    8 bytes per weight element: over 256 tokens a 16384 × 16384 W is memory-bound at
    (inputs + 8·k·n) bytes; over 8,192 tokens the GEMM's compute hides it."""
    fp32_grads = GpuRates.of(load_accelerator("h100-sxm"), "bf16", gradient_bytes=4)
    few = gemm_time("few", 256, 16384, 16384, fp32_grads, 2.0)
    moved = 2 * 256 * 16384 * 2 + 16384 * 16384 * 8
    assert few.weight_grad_accumulate_s == pytest.approx(moved / (3.35e12 * 0.8), rel=1e-3)
    assert few.weight_grad_s < few.weight_grad_accumulate_s / 3  # a plain BF16 write
    many = gemm_time("many", 8192, 16384, 16384, fp32_grads, 2.0)
    assert many.weight_grad_accumulate_s == many.weight_grad_s
    assert gemm_time("none", 256, 16384, 16384, H100, 2.0).weight_grad_accumulate_s is None


def test_zero_stage_decides_whether_w_accumulates():
    """ZeRO 0-1 keep the gradient buffer over micro-batches (W accumulates into it); ZeRO 2-3
    hand each micro-batch's gradient to a reduce-scatter: same layout otherwise, and the
    single-layout estimate's W is the one its column reads."""
    job = build_job("llama3-8b", 2048, global_batch_tokens=2048 * 64)  # 256 tokens per CP rank
    assert job.precision.gradient_dtype == "bf16"  # bf16-mixed: BF16 gradients
    steps = {
        zero: estimate(job, build_layout(tp=1, cp=8, pp=1, dp=1, micro_batch_size=1,
                                         zero_stage=zero), "dgx-h100", 8, profile="none")
        for zero in (1, 2)
    }  # fmt: skip
    kept, handed = (steps[zero].stage_times_s for zero in (1, 2))
    assert kept["weight_grad"] > 1.5 * handed["weight_grad"]
    assert kept["forward"] == handed["forward"]


def test_backward_gemms_use_their_own_output_shapes():
    op = gemm_time("skinny", 8192, 16384, 256, H100, 2.0)
    assert op.input_grad_s != op.forward_s  # dX is tokens × k, dY·Wᵀ


def test_tensor_parallelism_splits_the_layer_gemms():
    model = load_model("llama3-70b")
    whole = layer_op_times(model, 8192, 1, 1, 1, 1, False, True, False, H100)
    split = layer_op_times(model, 8192, 1, 8, 1, 1, True, True, False, H100)
    mlp = next(op for op in whole if op.name == "mlp").forward_s
    mlp8 = next(op for op in split if op.name == "mlp").forward_s
    assert mlp / 8 <= mlp8 < mlp / 7


def test_flash_attention_runs_at_the_measured_kernel_rates():
    # FlashAttention-3 on H100 SXM (Shah et al. 2024): 602 TFLOP/s forward (causal, d 128,
    # 8k), 559 TFLOP/s backward on 2.5x the forward FLOPs.
    flops = 1e15
    op = attention_core_time(flops, 1e6, rates=H100)
    assert op.forward_s == pytest.approx(flops / 602e12, rel=1e-3)
    assert op.input_grad_s == pytest.approx(2.5 * flops / 559e12, rel=1e-3)
    assert op.weight_grad_s == 0.0


def test_unmeasured_fused_kernels_run_at_the_matmul_rate():
    flops = 1e15
    a100 = GpuRates.of(load_accelerator("a100-sxm-80gb"), "bf16")  # no attention measurement
    fused = attention_core_time(flops, 1e6, rates=a100)
    assert fused.forward_s == pytest.approx(flops / a100.matmul_flops_per_s)
    assert fused.input_grad_s == pytest.approx(2.5 * fused.forward_s)


def test_unfused_attention_is_its_kernels_one_after_another():
    """Megatron-LM's CoreAttention: Q·Kᵀ and P·V over every score (twice the causal FLOPs)
    at the matmul rate, four GEMMs backward, and the softmax as traffic over the scores
    (forward 2 passes, backward 3), each GEMM one pass; dropout 2 more passes and a mask
    byte each way. GPT-3 175B's layer on A100, s = 2048, TP 8: 12 heads a rank."""
    a100 = GpuRates.of(load_accelerator("a100-sxm-80gb"), "bf16")
    s, heads, d = 2048, 12, 128
    scores = heads * s * s
    causal = 2 * 2 * scores * d * 0.5
    op = unfused_attention_time(2 * causal, 0.0, scores, False, a100, 2.0)
    gemm = max(causal / a100.matmul_flops_per_s, 2 * scores / a100.hbm_bytes_per_s)
    assert op.forward_s == pytest.approx(2 * gemm + 2 * 2 * scores / a100.hbm_bytes_per_s)
    assert op.input_grad_s == pytest.approx(4 * gemm + 3 * 2 * scores / a100.hbm_bytes_per_s)
    dropped = unfused_attention_time(2 * causal, 0.0, scores, True, a100, 2.0)
    extra = (2 * 2 + 1) * scores / a100.hbm_bytes_per_s
    assert dropped.forward_s == pytest.approx(op.forward_s + extra)
    assert dropped.input_grad_s == pytest.approx(op.input_grad_s + extra)
    # Slower than the same FLOPs at the matmul rate, whatever the kernel: it does the
    # masked half and moves the scores.
    assert op.forward_s > 2 * causal / a100.matmul_flops_per_s


def test_a_layer_without_flash_attention_computes_every_score():
    model = load_model("gpt3-175b")
    a100 = GpuRates.of(load_accelerator("a100-sxm-80gb"), "bf16")

    def core(flash):
        ops = layer_op_times(model, 2048, 1, 8, 1, 1, False, flash, False, a100)
        return next(op for op in ops if op.name == "attention.core")

    assert core(False).forward_flops == pytest.approx(2 * core(True).forward_flops)
    assert core(False).forward_s > core(True).forward_s


def test_fp8_recipes_keep_attention_in_bf16():
    fp8 = GpuRates.of(load_accelerator("h100-sxm"), "fp8")
    assert attention_dtype("fp8") == "bf16"
    assert fp8.attention_forward_flops_per_s == H100.attention_forward_flops_per_s
    assert fp8.matmul_flops_per_s > 1.5 * H100.matmul_flops_per_s


def test_attention_efficiency_must_be_a_fraction_of_a_listed_peak():
    spec = load_accelerator("h100-sxm").model_dump()
    spec["attention_forward_efficiency"] = {"bf16": 1.3}
    with pytest.raises(ValueError, match=r"attention_forward_efficiency\.bf16 must be in"):
        Accelerator.model_validate(spec)
    spec["attention_forward_efficiency"] = {"fp4": 0.5}
    spec["sources"]["attention_forward_efficiency.fp4"] = "test"
    with pytest.raises(ValueError, match="fp4_tflops is not"):
        Accelerator.model_validate(spec)


def test_unfused_attention_stays_in_bf16_under_fp8_gemms():
    fp8 = GpuRates.of(load_accelerator("h100-sxm"), "fp8")
    op = unfused_attention_time(1e15, 0.0, 1.0, False, fp8, 2.0)
    assert op.forward_s == pytest.approx(1e15 / H100.matmul_flops_per_s, rel=1e-6)


def test_fp8_quantization_moves_each_operand_once_per_pass():
    """Llama 3 8B layer, 4096 tokens: Q/K/V read one input, gate/up one, o and down their own
    (X = 4096·(h + q + h + f) elements); dY = every module's output."""
    from planner.cost.recipe_ops import quantization_time

    model = load_model("llama3-8b")
    h, f, q, kv = 4096, 14336, 4096, 1024
    x = 4096 * (h + q + h + f)
    dy = 4096 * (q + 2 * kv + h + 2 * f + h)
    fp8 = GpuRates.of(load_accelerator("h100-sxm"), "fp8")
    op = quantization_time(model, 4096, 1, 1, False, fp8)
    assert op.name == "fp8.quantize"
    assert op.forward_s == pytest.approx(3 * x / H100.hbm_bytes_per_s)
    assert op.input_grad_s == pytest.approx(3 * dy / H100.hbm_bytes_per_s)
    assert op.weight_grad_s == pytest.approx((3 * dy + 2 * x) / H100.hbm_bytes_per_s)


def test_nvfp4_quantization_writes_both_copies_once_per_pass():
    """The same Llama 3 8B layer under NVFP4: the forward reads X once (2 bytes) and writes
    its row-wise and column-wise E2M1 copies (½ byte each) with one E4M3 scale per 16
    elements of each; the backward does the same for dY; the weight gradient reads the
    cached copies and quantizes nothing."""
    from planner.cost.recipe_ops import quantization_time

    model = load_model("llama3-8b")
    h, f, q, kv = 4096, 14336, 4096, 1024
    x = 4096 * (h + q + h + f)
    dy = 4096 * (q + 2 * kv + h + 2 * f + h)
    per_element = 2 + 2 * 0.5 + 2 * (1 / 16)
    gb200 = GpuRates.of(load_accelerator("gb200"), "fp4")
    op = quantization_time(model, 4096, 1, 1, False, gb200)
    assert op.name == "fp4.quantize"
    assert op.forward_s == pytest.approx(per_element * x / gb200.hbm_bytes_per_s)
    assert op.input_grad_s == pytest.approx(per_element * dy / gb200.hbm_bytes_per_s)
    assert op.weight_grad_s == 0.0
    fp8 = quantization_time(model, 4096, 1, 1, False, GpuRates.of(load_accelerator("gb200"), "fp8"))
    assert fp8.name == "fp8.quantize"


def test_nvfp4_gemms_run_at_the_fp4_peak_at_fp8s_measured_share_and_attention_in_bf16():
    accelerator = load_accelerator("gb200")
    fp4, bf16 = GpuRates.of(accelerator, "fp4"), GpuRates.of(accelerator, "bf16")
    share = accelerator.matmul_efficiency["fp8"]
    assert fp4.matmul_flops_per_s == pytest.approx(10_000e12 * share)
    assert accelerator.sources["matmul_efficiency.fp4"].startswith("default:")
    assert attention_dtype("fp4") == "bf16"
    assert fp4.attention_flops_per_s(8192) == bf16.attention_flops_per_s(8192)


def test_an_nvfp4_step_is_faster_than_fp8_but_less_than_twice():
    """FP4 GEMMs at twice FP8's rate on GB200, the attention, the kept-BF16 router and head,
    the quantization and everything memory-bound as before: faster, but not 2x."""

    def compute_s(precision):
        job = build_job("llama3-70b", 8192, global_batch_size=64, precision=precision)
        layout = build_layout(tp=2, pp=4, dp=8, num_microbatches=8)
        return estimate(job, layout, "gb200-nvl72", profile="none").time_breakdown_s["compute"]

    fp8, fp4 = compute_s("fp8-mixed"), compute_s("fp4-mixed")
    assert fp8 / 2 < fp4 < fp8


def test_a_precision_without_units_on_the_accelerator_says_so():
    with pytest.raises(PlanError, match="has no fp4 units"):
        GpuRates.of(load_accelerator("h100-sxm"), "fp4")


def test_sliding_window_layers_run_at_the_kernels_rate_for_their_window():
    """GB200's cuDNN curve: full layers at 8K keys, windowed ones at 512 (their 512-key window),
    the average layer between; unfused attention masks a full score matrix (every score)."""
    from planner.cost.compute import fused_attention_core_time
    from planner.cost.flops import windowed_pair_fraction

    rates = GpuRates.of(load_accelerator("gb200"), "bf16")
    full = load_model("llama3-8b")
    local = full.model_copy(update={"sliding_window": 512, "num_sliding_window_layers": 16})
    share = windowed_pair_fraction(512, 8192)
    per_full_layer = 1e12
    average = per_full_layer * (1 + share) / 2
    op = fused_attention_core_time(local, per_full_layer, 0.0, rates, 8192)
    forward_8k, backward_8k = rates.attention_flops_per_s(8192)
    forward_512, backward_512 = rates.attention_flops_per_s(512)
    assert op.forward_s == pytest.approx(
        (per_full_layer / forward_8k + per_full_layer * share / forward_512) / 2
    )
    assert op.input_grad_s == pytest.approx(
        2.5 * (per_full_layer / backward_8k + per_full_layer * share / backward_512) / 2
    )
    assert op.forward_flops == pytest.approx(average)

    def core(model, flash):
        ops = layer_op_times(model, 8192, 1, 1, 1, 1, False, flash, False, rates, 2.0)
        return next(o for o in ops if o.name == "attention.core")

    assert core(local, True).forward_s < core(full, True).forward_s
    assert core(local, False).forward_s == pytest.approx(core(full, False).forward_s)

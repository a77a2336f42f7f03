"""Roofline op times: compute- vs memory-bound, wave quantization, B/W shapes."""

import pytest

from hwspecs.catalog import load_accelerator
from planner.compute import GEMM_TILE_M, GEMM_TILE_N, GpuRates, gemm_time, layer_op_times
from planner.model import load_model

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

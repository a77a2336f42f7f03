"""Fused attention's rate by sequence length, and what it costs a ring's short blocks.

Figures: Shah et al. 2024, FlashAttention-3 (arXiv 2407.08608), H100 80GB SXM5, BF16, head
dim 128, batch × seqlen = 16k. Fig. 5 (forward, causal) FlashAttention-3 at 512 … 16k:
292, 423, 521, 579, 602, 616 TFLOP/s; cuDNN 315 … 539; FlashAttention-2 191 … 335. Fig. 6
(backward) FlashAttention-3 316, 424, 501, 542, 559, 561."""

import math

import pytest
from pydantic import ValidationError

from hwspecs.attention import log_length_interpolation
from hwspecs.catalog import load_accelerator
from hwspecs.schema import Accelerator
from planner.api import build_job, build_layout, estimate
from planner.cost.attention_times import attention_core_time
from planner.cost.compute import GpuRates
from planner.cost.context_parallel import rank_attention_core_s, ring_block_slowdown

LENGTHS = (512, 1024, 2048, 4096, 8192, 16384)
FA3_FORWARD = (292, 423, 521, 579, 602, 616)
FA3_BACKWARD = (316, 424, 501, 542, 559, 561)
CUDNN_FORWARD = (315, 410, 484, 518, 529, 539)
FA2_FORWARD = (191, 260, 298, 319, 333, 335)


@pytest.mark.parametrize("accelerator", ["h100-sxm", "h200-sxm", "h800-sxm"])
def test_the_catalog_curves_are_the_papers_bars(accelerator):
    spec = load_accelerator(accelerator)
    for kernel, forward in (
        (None, FA3_FORWARD),
        ("flash-attention-3", FA3_FORWARD),
        ("cudnn", CUDNN_FORWARD),
        ("flash-attention-2", FA2_FORWARD),
    ):
        for length, expected in zip(LENGTHS, forward, strict=True):
            got = spec.achievable_attention_flops_per_s("bf16", kernel, length)[0]
            assert got == pytest.approx(expected * 1e12, rel=2e-3)
    backward = [spec.achievable_attention_flops_per_s("bf16", None, n)[1] for n in LENGTHS]
    assert backward == pytest.approx([x * 1e12 for x in FA3_BACKWARD], rel=2e-3)
    for name in spec.attention_curves:
        assert spec.source_of(f"attention_curves.{name}")


#: NVIDIA/cudnn-frontend @d48a60eb146e benchmark/sdpa_benchmark_training/artifacts,
#: sdpa_bf16_benchmark_results_NVIDIA_{GB200,GB300}.csv (cuDNN 9.17 through cudnn-frontend,
#: batch 1, 128 query / 8 KV heads, head dim 128, causal), 512 … 128k tokens.
BLACKWELL_LENGTHS = (512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)
CUDNN_GB200 = ((408, 733, 1069, 1386, 1584, 1668, 1681, 1573, 1467),
               (329, 527, 655, 1054, 1211, 1304, 1348, 1229, 1188))  # fmt: skip
CUDNN_GB300 = ((461, 839, 1312, 1682, 1899, 1978, 2007, 1951, 1821),
               (330, 522, 633, 1110, 1292, 1399, 1438, 1399, 1360))  # fmt: skip
TORCH_FA2_GB200_FORWARD = (163, 255, 336, 387, 414, 430, 438, 442, 444)


@pytest.mark.parametrize(
    ("accelerator", "measured_on", "curves"),
    [("gb200", "gb200", CUDNN_GB200), ("b200", "gb200", CUDNN_GB200),
     ("gb300", "gb300", CUDNN_GB300), ("b300", "gb300", CUDNN_GB300)],
)  # fmt: skip
def test_blackwell_runs_cudnn_at_cudnn_frontends_measured_rates(accelerator, measured_on, curves):
    """GB200 and GB300 at their own measurements; B200 and B300 at their die's fractions of
    the peak (rule 6), so at their own peak's share of the same rates."""
    spec, measured = load_accelerator(accelerator), load_accelerator(measured_on)
    scale = spec.bf16_tflops / measured.bf16_tflops
    assert spec.attention_default_kernel == "cudnn" and spec.attention_curves
    for kernel in (None, "cudnn"):
        for length, forward, backward in zip(BLACKWELL_LENGTHS, *curves, strict=True):
            got = spec.achievable_attention_flops_per_s("bf16", kernel, length)
            assert got == pytest.approx((forward * scale * 1e12, backward * scale * 1e12),
                                        rel=2e-3)  # fmt: skip
    if accelerator == "gb200":
        fa2 = [spec.achievable_attention_flops_per_s("bf16", "flash-attention-2", n)[0]
               for n in BLACKWELL_LENGTHS]  # fmt: skip
        assert fa2 == pytest.approx([x * 1e12 for x in TORCH_FA2_GB200_FORWARD], rel=2e-3)
    for name in spec.attention_curves:
        source = spec.source_of(f"attention_curves.{name}")
        assert "cudnn-frontend @d48a60eb146e" in source
        assert (accelerator == measured_on) == (not source.startswith("default:"))


def test_between_lengths_the_rate_is_log_interpolated_and_held_beyond():
    spec = load_accelerator("h100-sxm")
    forward = [
        spec.achievable_attention_flops_per_s("bf16", None, n)[0] for n in (2896, 256, 2**20)
    ]
    # 2896 ≈ 2^11.5: halfway (in log2) between 2k (521) and 4k (579).
    assert forward[0] == pytest.approx((521 + 0.4998 * (579 - 521)) * 1e12, rel=2e-3)
    assert forward[1:] == pytest.approx([292e12, 616e12], rel=2e-3)
    assert log_length_interpolation(2**11.5, [2**11, 2**12], [0.0, 1.0]) == pytest.approx(0.5)
    assert math.isclose(log_length_interpolation(1, [4, 8], [3.0, 5.0]), 3.0)


def test_without_a_length_or_a_curve_the_single_rate_holds():
    h100 = load_accelerator("h100-sxm")
    assert h100.achievable_attention_flops_per_s("bf16") == pytest.approx(
        (602e12, 559e12), rel=2e-3
    )
    a100 = load_accelerator("a100-sxm-80gb")  # no attention measurement: the matmul rate
    assert a100.attention_curve("bf16") is None
    assert a100.achievable_attention_flops_per_s("bf16", None, 512) == (
        a100.achievable_attention_flops_per_s("bf16")
    )


def test_a_kernel_time_follows_its_length():
    rates = GpuRates.of(load_accelerator("h100-sxm"), "bf16")
    flops = 1e12
    short = attention_core_time(flops, 0.0, rates, 512)
    long = attention_core_time(flops, 0.0, rates, 8192)
    assert short.forward_s / long.forward_s == pytest.approx(602 / 292, rel=2e-3)
    assert short.input_grad_s / long.input_grad_s == pytest.approx(559 / 316, rel=2e-3)
    assert attention_core_time(flops, 0.0, rates).forward_s == pytest.approx(long.forward_s)


def test_a_ring_block_runs_at_its_own_length():
    rates = GpuRates.of(load_accelerator("h100-sxm"), "bf16")
    # Ring attention over 16 ranks at 8K: blocks of 512 keys; hierarchical (inner 8): an
    # outer ring of 2, blocks of 4K after the re-shard.
    assert ring_block_slowdown(rates, 8192, 16) == pytest.approx((602 / 292, 559 / 316), 2e-3)
    assert ring_block_slowdown(rates, 8192, 2) == pytest.approx((602 / 579, 559 / 542), 2e-3)
    flat = GpuRates.of(load_accelerator("a100-sxm-80gb"), "bf16")
    assert ring_block_slowdown(flat, 8192, 16) == (1.0, 1.0)


def test_a_ring_at_8k_is_charged_its_short_blocks(monkeypatch):
    """8 ring blocks of 1K keys: the forward at 423 of the 602 TFLOP/s a kernel over the whole
    8K runs, the backward at 424 of 559; the ring's exposed time carries that shortfall."""
    import planner.comm.context_parallel as cp_comm

    job = build_job("llama3-8b", 8192, global_batch_tokens=2**20)
    layout = build_layout(tp=1, pp=1, dp=1, cp=8, micro_batch_size=1, cp_algorithm="ring")

    def ring():
        return estimate(job, layout, "dgx-h100", 8, profile="none")

    charged = ring()
    monkeypatch.setattr(cp_comm, "ring_block_slowdown", lambda rates, s, n: (1.0, 1.0))
    flat = ring()
    assert charged.time_breakdown_s["compute"] == flat.time_breakdown_s["compute"]
    rates = GpuRates.of(load_accelerator("h100-sxm"), "bf16")
    forward, backward = rank_attention_core_s(job.model, 8192, 1, 1, 8, True, rates, 2.0)
    lost = forward * (602 / 423 - 1) + backward * (559 / 424 - 1)
    extra = charged.time_breakdown_s["cp_exposed"] - flat.time_breakdown_s["cp_exposed"]
    # Every step's share is exposed; the longer blocks also hide a little more transfer.
    assert extra == pytest.approx(lost * job.model.num_layers * charged.num_microbatches, rel=0.05)


def test_curves_must_fit_their_lengths_and_hold_the_single_rates():
    fields = load_accelerator("h100-sxm").model_dump()
    for change, message in (
        ({"attention_curves": {**fields["attention_curves"], "cudnn": [[0.3]]}},
         r"attention_curves\.cudnn must be"),
        ({"attention_default_kernel": "flash-attention-4"}, "attention_default_kernel"),
        ({"attention_seq_lens": [8192, 512, 1024, 2048, 4096, 16384]}, "ascending"),
        ({"attention_kernels": {**fields["attention_kernels"], "cudnn": [0.5, 0.5]}},
         "not a point of its attention curve"),
    ):  # fmt: skip
        with pytest.raises(ValidationError, match=message):
            Accelerator(**{**fields, **change})


def test_a_curve_needs_a_source():
    fields = load_accelerator("h100-sxm").model_dump()
    fields["sources"] = {
        k: v for k, v in fields["sources"].items() if k != "attention_curves.cudnn"
    }
    with pytest.raises(ValidationError, match=r"attention_curves\.cudnn"):
        Accelerator(**fields)

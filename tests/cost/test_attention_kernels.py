"""The attention kernel a stack runs, timed at the accelerator's measurement of it.

Rates from Shah et al. 2024, FlashAttention-3 (arXiv 2407.08608) Figs. 5-6: H100 SXM5, BF16,
causal, head dim 128, sequence 8k — FlashAttention-2 333 / 318, cuDNN 529 / 518,
FlashAttention-3 602 / 559 TFLOP/s forward / backward. FlashAttention-1 has no Hopper
measurement: Dao 2023, FlashAttention-2 (arXiv 2307.08691) §4.1 puts FlashAttention-2 at
"around 2×" its speed, so the catalog halves FlashAttention-2's rates (hwspecs/data/README.md
rule 7)."""

import pytest
from pydantic import ValidationError

from hwspecs.catalog import load_accelerator
from hwspecs.schema import Accelerator
from planner.api import build_job, build_layout, estimate
from planner.cost.compute import GpuRates
from planner.runs.kernels import attention_kernel
from tests.cli_runner import run

PAPER = {"flash-attention-2": (333, 318), "cudnn": (529, 518), "flash-attention-3": (602, 559)}


@pytest.mark.parametrize("accelerator", ["h100-sxm", "h200-sxm", "h800-sxm"])
def test_kernel_rates_are_the_papers_and_the_default_is_flashattention_3(accelerator):
    spec = load_accelerator(accelerator)
    for kernel, (forward, backward) in PAPER.items():
        rates = spec.achievable_attention_flops_per_s("bf16", kernel)
        assert rates == pytest.approx((forward * 1e12, backward * 1e12), rel=2e-3)
        assert spec.source_of(f"attention_kernels.{kernel}")
    assert spec.achievable_attention_flops_per_s("bf16") == pytest.approx(
        spec.achievable_attention_flops_per_s("bf16", "flash-attention-3")
    )


@pytest.mark.parametrize("accelerator", ["h100-sxm", "h200-sxm", "h800-sxm"])
def test_flashattention_1_runs_at_half_flashattention_2(accelerator):
    spec = load_accelerator(accelerator)
    fa1 = spec.achievable_attention_flops_per_s("bf16", "flash-attention-1")
    forward, backward = PAPER["flash-attention-2"]
    assert fa1 == pytest.approx((forward / 2 * 1e12, backward / 2 * 1e12), rel=2e-3)
    source = spec.source_of("attention_kernels.flash-attention-1")
    assert source.startswith("default:") and "rule 7" in source and "2307.08691" in source


def test_a_kernel_the_catalog_did_not_measure_runs_at_the_default_rates():
    a100 = load_accelerator("a100-sxm-80gb")  # FlashAttention-3 is Hopper-only
    default = GpuRates.of(a100, "bf16")
    assert GpuRates.of(a100, "bf16", "flash-attention-3") == default


def test_kernel_fractions_must_be_forward_and_backward_in_0_1():
    fields = load_accelerator("h100-sxm").model_dump()
    with pytest.raises(ValidationError, match="attention_kernels"):
        Accelerator(**{**fields, "attention_kernels": {"flash-attention-2": [0.3]}})


def test_a_slower_kernel_lengthens_only_the_compute():
    job = build_job("llama3-8b", 32768, global_batch_tokens=2**20)
    layout = build_layout(tp=8, pp=1, dp=1, cp=1, micro_batch_size=1)
    steps = {}
    for kernel in ("flash-attention-1", *PAPER):
        with_kernel = job.model_copy(update={"attention_kernel": kernel})
        steps[kernel] = estimate(with_kernel, layout, "dgx-h100", 8, profile="none")
    fa1, fa2, cudnn, fa3 = steps.values()
    assert fa1.step_time_s > fa2.step_time_s > cudnn.step_time_s > fa3.step_time_s
    assert fa2.time_breakdown_s["compute"] > fa3.time_breakdown_s["compute"]
    assert fa2.comm_time_s == fa3.comm_time_s


def test_llm_foundry_rows_ran_the_attention_their_sweep_named(capsys):
    """llm-foundry's ``submit_benchmarks.py`` defaults ``--attn_impl`` to its Triton port of
    FlashAttention; only the large-scale H100 table's ``sweep.py`` (@5e85bd62d) names
    ``flash`` (FlashAttention-2), for every model but 13b and 30b."""
    from hwspecs.catalog import load_runs

    rows = load_runs()
    foundry = [row for row in rows if "llm-foundry" in (row.training.framework or "")]
    large = [row for row in foundry if "Large Scale" in (row.source_ref.table or "")]
    assert {(row.model.name, attention_kernel(row)) for row in large} == {
        ("MPT-1b", "flash-attention-2"),
        ("MPT-3b", "flash-attention-2"),
        ("MPT-7b", "flash-attention-2"),
        ("MPT-70b", "flash-attention-2"),
        ("MPT-13b", "flash-attention-1"),
        ("MPT-30b", "flash-attention-1"),
    }
    rest = [row for row in foundry if row not in large]
    assert rest and all(attention_kernel(row) == "flash-attention-1" for row in rest)
    # Megatron-Core rows run TransformerEngine's cuDNN attention where it is measured (every
    # accelerator they ran on: Hopper's FlashAttention-3-paper bars, Blackwell's cudnn-frontend).
    core = [row for row in rows if "megatron-core" in (row.training.framework or "").lower()]
    assert {attention_kernel(row) for row in core} == {"cudnn"}
    others = [row for row in rows if row not in foundry and row not in core]
    assert all(attention_kernel(row) is None for row in others)
    code, out, err = run(capsys, "estimate", "--attention-kernel", "cudnn", "--explain")
    assert code == 0, err
    assert "forward 529, backward 518 TFLOP/s" in " ".join(out.split())

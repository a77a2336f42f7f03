"""Memory per GPU: the published Llama 3 layout fits; invariants of sharding and layouts."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hwspecs.catalog import load_accelerator
from hwspecs.errors import PlanError
from planner.cost.memory import MEMORY_PARTS
from planner.memory_report import memory_report
from planner.spec.job import Job
from planner.spec.layout import Layout, layers_per_virtual_stage
from planner.spec.model import load_model
from planner.structure.params import params_per_virtual_stage
from planner.structure.stages import rank_structure

H100 = load_accelerator("h100-sxm")
LLAMA_405B = load_model("llama3-405b")
GIB = 2**30


def llama3_job(seq_len=8192, **fields):
    return Job(model=LLAMA_405B, seq_len=seq_len, global_batch_tokens=16 * 2**20, **fields)


def test_llama3_405b_published_layout_fits_in_80gb_without_recompute():
    """Llama 3 §3.3.2: TP 8, PP 16, DP 128 at 8K trained without activation checkpointing."""
    report = memory_report(llama3_job(), Layout(tp=8, pp=16, dp=128, zero_stage=1), H100)
    assert report.fits
    assert report.num_microbatches == 16  # 2,048 sequences / DP 128 / micro-batch 1
    assert 60 * GIB < report.total_bytes < H100.hbm_bytes


def test_llama3_405b_without_pipeline_does_not_fit():
    report = memory_report(llama3_job(), Layout(tp=8, pp=1, dp=2048, zero_stage=1), H100)
    assert not report.fits


def test_first_last_fewer_split_for_126_layers_on_16_stages():
    layers = layers_per_virtual_stage(126, 16)
    assert layers[0] == layers[-1] == 7 and set(layers[1:-1]) == {8} and layers.sum() == 126


def test_even_split_that_does_not_divide_is_an_error():
    with pytest.raises(PlanError, match="not divisible by pp·vpp"):
        layers_per_virtual_stage(126, 16, split="even")


def test_v_shape_puts_first_and_last_stage_on_rank_zero():
    structure = rank_structure(load_model("llama3-8b"), 4, 2, "zbv", "auto")
    assert structure.dense_layers == [8, 8, 8, 8]
    assert structure.has_embedding[0] and structure.has_head[0]
    report = memory_report(
        Job(model=load_model("llama3-8b"), seq_len=4096),
        Layout(pp=4, vpp=2, dp=2, schedule="zbv", num_microbatches=8),
    )
    assert report.per_stage[0].logits_buffers > 0
    assert all(stage.logits_buffers == 0 for stage in report.per_stage[1:])


def test_parameters_over_stages_sum_to_the_model():
    model = load_model("llama3-70b")
    dense, expert = params_per_virtual_stage(model, Layout(pp=8))
    assert dense.sum() + expert.sum() == pytest.approx(model.num_params())


def test_moe_parameters_over_stages_and_experts_sum_to_the_model():
    model = load_model("mixtral-8x7b")
    dense, expert = params_per_virtual_stage(model, Layout(pp=4, ep=8, dp=8))
    assert dense.sum() + 8 * expert.sum() == pytest.approx(model.num_params())


def test_dualpipe_holds_two_copies_of_the_parameters():
    model = load_model("llama3-8b")
    job = Job(model=model, seq_len=4096)
    one = memory_report(job, Layout(pp=4, dp=2, schedule="1f1b", num_microbatches=8))
    two = memory_report(job, Layout(pp=4, dp=2, schedule="dualpipe", num_microbatches=8))
    assert sum(s.num_params for s in two.per_stage) == pytest.approx(
        2 * sum(s.num_params for s in one.per_stage), rel=1e-9
    )


def test_breakdown_sums_to_total():
    report = memory_report(llama3_job(), Layout(tp=8, pp=16, dp=128), H100)
    assert sum(report.breakdown_bytes[p] for p in MEMORY_PARTS) == pytest.approx(report.total_bytes)


def test_one_f_one_b_in_flight_decreases_along_the_pipeline():
    report = memory_report(llama3_job(), Layout(tp=8, pp=16, dp=128), H100)
    assert [s.inflight_microbatches for s in report.per_stage] == list(range(16, 0, -1))


def test_full_recompute_uses_less_than_selective_less_than_none():
    job = Job(model=load_model("llama3-70b"), seq_len=8192, flash_attention=False)
    totals = [
        memory_report(job, Layout(tp=8, pp=4, dp=4, recompute=r, num_microbatches=8)).total_bytes
        for r in ("full", "selective", "none")
    ]
    assert totals == sorted(totals) and totals[0] < totals[1] < totals[2]


small_layouts = st.fixed_dictionaries(
    {
        "tp": st.sampled_from([1, 2, 4, 8]),
        "pp": st.sampled_from([1, 2, 4, 8]),
        "dp": st.sampled_from([1, 2, 8, 64]),
        "zero_stage": st.integers(0, 3),
    }
)


@settings(max_examples=40, deadline=None)
@given(fields=small_layouts, more_dp=st.sampled_from([2, 4, 16]))
def test_more_dp_never_raises_model_state_memory(fields, more_dp):
    job = Job(model=load_model("llama3-8b"), seq_len=2048)
    base = memory_report(job, Layout(num_microbatches=8, **fields))
    wider = memory_report(
        job, Layout(num_microbatches=8, **{**fields, "dp": fields["dp"] * more_dp})
    )
    states = ("weights", "gradients", "master_weights", "optimizer_states")
    for a, b in zip(base.per_stage, wider.per_stage, strict=True):
        assert sum(getattr(b, p) for p in states) <= sum(getattr(a, p) for p in states) * (
            1 + 1e-12
        )


@settings(max_examples=30, deadline=None)
@given(fields=small_layouts)
def test_zero_shards_of_model_states_sum_to_the_unsharded_states(fields):
    """Summed over the dp·cp ranks, ZeRO-sharded states equal the stage-0 states of one replica."""
    job = Job(model=load_model("llama3-8b"), seq_len=2048)
    sharded = memory_report(job, Layout(num_microbatches=8, **fields))
    whole = memory_report(job, Layout(num_microbatches=8, **{**fields, "zero_stage": 0}))
    dp = fields["dp"]
    stage = fields["zero_stage"]
    sharded_parts = {"weights": 3, "gradients": 2, "master_weights": 1, "optimizer_states": 1}
    for a, b in zip(sharded.per_stage, whole.per_stage, strict=True):
        for part, first in sharded_parts.items():
            copies = dp if stage >= first else 1
            assert np.isclose(getattr(a, part) * copies, getattr(b, part))


def test_fused_cross_entropy_keeps_no_fp32_probabilities():
    """A fused loss (FlashAttention's CrossEntropyLoss) frees the s·b·V·4/tp bytes of FP32
    probabilities on the last stage, and nothing else."""
    layout = Layout(tp=8, pp=16, dp=128, zero_stage=1)
    unfused = memory_report(llama3_job(), layout, H100)
    fused = memory_report(llama3_job(cross_entropy="fused"), layout, H100)
    probabilities = 8192 * 1 * LLAMA_405B.vocab_size * 4 / 8
    last = unfused.per_stage[-1].logits_buffers - fused.per_stage[-1].logits_buffers
    assert last == pytest.approx(probabilities)
    assert fused.per_stage[-1].logits_buffers == pytest.approx(probabilities)  # 2 + 2 of 8 B
    for before, after in zip(unfused.per_stage[:-1], fused.per_stage[:-1], strict=True):
        assert before.memory_per_gpu_bytes == after.memory_per_gpu_bytes


@pytest.mark.parametrize(
    ("accelerator", "job_figure", "expected"),
    [
        ("h100-sxm", None, GIB),  # a GPU: the CUDA context and workspaces, 1 GiB by default
        ("tpu-v5e", None, 0),  # XLA's reported capacity is already net of its reservation
        ("tpu-v5p", None, 0),
        ("tpu-v5e", 3 * GIB, 3 * GIB),  # the job's own figure wins
        ("h100-sxm", 0, 0),
    ],
)
def test_runtime_overhead_is_the_jobs_else_the_accelerators(accelerator, job_figure, expected):
    """A TPU holds no CUDA context; every other part of memory is the same on any chip."""
    job = Job(model=load_model("llama3-8b"), seq_len=4096, global_batch_tokens=4096 * 64,
              runtime_overhead_bytes=job_figure)  # fmt: skip
    layout = Layout(tp=1, pp=1, dp=8, zero_stage=3, recompute="full")
    report = memory_report(job, layout, load_accelerator(accelerator))
    reference = memory_report(job.model_copy(update={"runtime_overhead_bytes": 0}), layout)
    assert report.breakdown_bytes["runtime_overhead"] == expected
    assert report.memory_per_gpu_bytes == pytest.approx(reference.memory_per_gpu_bytes + expected)


def test_every_tpu_in_the_catalog_states_its_runtime_overhead():
    from hwspecs.catalog import catalog_names

    for name in catalog_names("accelerator"):
        spec = load_accelerator(name)
        if spec.kind == "tpu":
            assert spec.runtime_overhead_bytes == 0
            assert "XLA" in spec.source_of("runtime_overhead_bytes")

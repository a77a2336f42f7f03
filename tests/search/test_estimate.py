"""One-layout estimates: consistency with the search rows, the memory table and the FLOP count."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hwspecs.catalog import load_accelerator, load_cluster
from hwspecs.errors import PlanError
from planner.cost.compute import GpuRates
from planner.cost.flops import model_flops_per_token
from planner.cost.stage_times import rank_times, shape_times
from planner.estimate import estimate, layout_columns
from planner.evaluate import evaluate_columns
from planner.memory_report import memory_report
from planner.spec.job import Job
from planner.spec.layout import Layout
from planner.spec.model import load_model
from planner.structure.stages import rank_structure

DGX = load_cluster("dgx-h100")
H100 = load_accelerator("h100-sxm")
JOB = Job(model=load_model("llama3-8b"), seq_len=4096, global_batch_tokens=4096 * 256)

layouts = st.builds(
    lambda tp, pp, schedule, zero, recompute, mbs: Layout(
        tp=tp,
        pp=pp,
        dp=64 // (tp * pp),
        schedule=schedule,
        vpp={"zbv": 2, "interleaved-1f1b": 2}.get(schedule, 1),
        zero_stage=zero,
        recompute=recompute,
        micro_batch_size=mbs,
    ),
    tp=st.sampled_from([1, 2, 4, 8]),
    pp=st.sampled_from([2, 4, 8]),
    schedule=st.sampled_from(["1f1b", "gpipe", "interleaved-1f1b", "zb-h1", "zbv"]),
    zero=st.integers(0, 3),
    recompute=st.sampled_from(["none", "selective", "full"]),
    mbs=st.sampled_from([1, 2]),
)


@settings(max_examples=25, deadline=None)
@given(layout=layouts)
def test_examined_slots_hold_the_true_memory_peak(layout):
    """The vectorized model looks at a few ranks; memory_report looks at all of them."""
    m = layout.resolved_num_microbatches(JOB.global_batch_size)
    row = evaluate_columns(JOB, DGX, H100, layout_columns(layout, m))
    assert row["memory_per_gpu_bytes"][0] == pytest.approx(
        memory_report(JOB, layout, H100).total_bytes
    )


@settings(max_examples=25, deadline=None)
@given(layout=layouts)
def test_examined_slots_hold_the_busiest_rank(layout):
    rates = GpuRates.of(H100, "bf16")
    shape = shape_times(
        JOB.model, 4096, layout.micro_batch_size, layout.tp, 1, 1, layout.tp > 1, True, rates, 2.0
    )
    structure = rank_structure(JOB.model, layout.pp, layout.vpp, layout.schedule, "auto")
    times = rank_times(shape, structure, layout.recompute)
    totals = np.add.reduce(
        [times.forward_s, times.input_grad_s, times.weight_grad_s, times.recompute_s]
    )
    m = layout.resolved_num_microbatches(JOB.global_batch_size)
    row = evaluate_columns(JOB, DGX, H100, layout_columns(layout, m))
    busiest = (
        row["forward_s"][0]
        + row["input_grad_s"][0]
        + row["weight_grad_s"][0]
        + row["recompute_per_microbatch_s"][0]
    )
    assert busiest == pytest.approx(totals.max())


@settings(max_examples=25, deadline=None)
@given(layout=layouts)
def test_bubble_and_every_time_term_are_never_negative(layout):
    result = estimate(JOB, layout, DGX)
    assert all(value >= -1e-12 for value in result.time_breakdown_s.values())
    assert result.step_time_s == pytest.approx(sum(result.time_breakdown_s.values()))


@settings(max_examples=20, deadline=None)
@given(layout=layouts)
def test_model_flops_per_step_do_not_depend_on_the_layout(layout):
    """tokens/s × FLOPs/token × GPUs × step time = FLOPs of the global batch, for every layout."""
    result = estimate(JOB, layout, DGX)
    flops = result.model_tflops_per_gpu * 1e12 * result.num_gpus * result.step_time_s
    assert flops == pytest.approx(
        JOB.global_batch_tokens * model_flops_per_token(JOB.model, 4096, causal=False)
    )


def test_estimate_matches_its_search_row_and_reports_memory_per_stage():
    layout = Layout(tp=8, pp=16, dp=128, schedule="interleaved-1f1b", vpp=4)
    job = Job(model=load_model("llama3-405b"), seq_len=8192, global_batch_tokens=16 * 2**20)
    cluster = load_cluster("llama3-h100-24k")
    result = estimate(job, layout, cluster)
    row = evaluate_columns(job, cluster, H100, layout_columns(layout, 16))
    assert result.step_time_s == pytest.approx(row["step_time_s"][0])
    assert result.memory_per_gpu_bytes == pytest.approx(row["memory_per_gpu_bytes"][0])
    assert len(result.per_stage_memory) == 16
    assert result.time_breakdown_s["tp_exposed"] > 0


def test_interleaving_shrinks_the_llama3_bubble_as_narayanan_predicts():
    """Bubble (p−1)/(v·m) of the ideal time: doubling v halves it (Narayanan et al. 2021)."""
    job = Job(model=load_model("llama3-405b"), seq_len=8192, global_batch_tokens=16 * 2**20)
    cluster = load_cluster("llama3-h100-24k")
    bubbles = [
        estimate(
            job, Layout(tp=8, pp=16, dp=128, schedule="interleaved-1f1b", vpp=v), cluster
        ).time_breakdown_s["pipeline_bubble"]
        for v in (2, 4)
    ]
    assert bubbles[1] == pytest.approx(bubbles[0] / 2, rel=0.02)


def test_estimate_rejects_more_gpus_than_the_cluster():
    with pytest.raises(PlanError, match="cluster dgx-h100 has 1024"):
        estimate(JOB, Layout(tp=8, pp=8, dp=32), DGX)


MOE_JOB = Job(model=load_model("mixtral-8x7b"), seq_len=4096, global_batch_tokens=4096 * 256)
moe_layouts = st.builds(
    lambda tp, pp, ep, cp, schedule, zero, recompute: Layout(
        tp=tp, pp=pp, cp=cp, dp=64 // (tp * pp * cp), ep=ep, schedule=schedule,
        vpp={"zbv": 2, "interleaved-1f1b": 2}.get(schedule, 1), zero_stage=zero,
        recompute=recompute, cp_algorithm="ring" if cp > 1 else "all-gather",
    ),
    tp=st.sampled_from([1, 2, 4]),
    pp=st.sampled_from([2, 4]),
    ep=st.sampled_from([1, 2, 4]),
    cp=st.sampled_from([1, 2]),
    schedule=st.sampled_from(["1f1b", "interleaved-1f1b", "zbv", "dualpipev"]),
    zero=st.integers(0, 3),
    recompute=st.sampled_from(["none", "selective", "full"]),
)  # fmt: skip


@settings(max_examples=15, deadline=None)
@given(dense=st.lists(layouts, min_size=1, max_size=4), moe=st.lists(moe_layouts, max_size=4))
def test_estimates_together_are_each_alone(dense, moe):
    """A plan estimates its top rows from one evaluation of their one-row columns: each is
    the estimate of its layout alone, field for field."""
    from planner.estimate import estimates

    for job, group in ((JOB, dense), (MOE_JOB, moe)):
        valid = []
        for layout in group:
            try:
                valid.append((layout, estimate(job, layout, DGX)))
            except PlanError:  # a layout the rules reject: estimated alone or not at all
                continue
        together = estimates(job, [layout for layout, _ in valid], DGX)
        for (_, alone), found in zip(valid, together, strict=True):
            assert found.model_dump() == alone.model_dump()

"""What zero-bubble schedules keep between B and W (the zero-bubble paper's M_W)."""

import pytest

from planner.cost.activations import ActivationShape, activation_bytes_per_layer
from planner.cost.weight_pass import (
    output_gradient_bytes,
    weight_input_bytes,
    weight_pass_bytes_per_layer,
)
from planner.memory_report import memory_report
from planner.spec.job import Job
from planner.spec.layout import Layout
from planner.spec.model import load_model


def test_gpt_layer_keeps_the_papers_32_sbh_for_w():
    """Qi et al. 2023, Table 1: M_W = 32·s·b·h bytes for a GPT layer with 16-bit activations:
    inputs of QKV, projection, fc1 (h each) and fc2 (4h) = 14, their output gradients
    (3h, h, 4h, h) = 18."""
    model = load_model("gpt3-175b")
    shape = ActivationShape(seq_len=2048, micro_batch_size=2, flash_attention=False)
    sbh = 2048 * 2 * model.hidden_size
    assert weight_input_bytes(model, shape, False) == pytest.approx(14 * sbh)
    assert output_gradient_bytes(model, shape, False) == pytest.approx(18 * sbh)
    assert weight_pass_bytes_per_layer(model, shape, False) == pytest.approx(32 * sbh)


def test_torch_keeps_the_whole_graph_plus_the_output_gradients():
    model = load_model("llama3-8b")
    shape = ActivationShape(seq_len=4096, micro_batch_size=1, tp=2, sequence_parallel=True)
    graph = weight_pass_bytes_per_layer(model, shape, False, "graph")
    expected = activation_bytes_per_layer(model, shape) + output_gradient_bytes(model, shape, False)
    assert graph == pytest.approx(expected)


def test_recomputation_does_not_shrink_what_w_reads():
    model = load_model("llama3-8b")
    shape = ActivationShape(seq_len=4096, micro_batch_size=1, recompute="full")
    plain = shape.model_copy(update={"recompute": "none"})
    assert weight_pass_bytes_per_layer(model, shape, False) == weight_pass_bytes_per_layer(
        model, plain, False
    )
    assert weight_pass_bytes_per_layer(model, shape, False) > activation_bytes_per_layer(
        model, shape
    )


def test_zb_h1_ranks_past_the_first_hold_weight_pending_microbatches():
    """ZB-H1 rank r holds p − r micro-batches between F and B and r more waiting for W."""
    model = load_model("llama3-8b")
    job = Job(model=model, seq_len=4096, global_batch_tokens=4096 * 64)
    layout = Layout(tp=1, pp=4, dp=8, schedule="zb-h1", zero_stage=1)
    one_f_one_b = memory_report(job, layout.model_copy(update={"schedule": "1f1b"}))
    zero_bubble = memory_report(job, layout)
    shape = ActivationShape(seq_len=4096, micro_batch_size=1)
    ratio = weight_pass_bytes_per_layer(model, shape, False) / activation_bytes_per_layer(
        model, shape
    )
    for rank, (zb, base) in enumerate(
        zip(zero_bubble.per_stage, one_f_one_b.per_stage, strict=True)
    ):
        expected = max(4 - rank + ratio * rank, 3 - rank + ratio * (rank + 1))
        assert zb.inflight_microbatches == pytest.approx(expected)
        assert zb.activations >= base.activations


def test_dualpipe_peak_is_unchanged_while_m_w_is_at_most_twice_m_b():
    """The reason DualPipe is left out of the closed form (module docstring)."""
    from planner.pipeline.schedules import generate_schedule
    from planner.pipeline.simulate import simulate

    for pp, m in ((2, 4), (4, 8), (4, 16), (8, 16), (8, 24)):
        sim = simulate(generate_schedule("dualpipe", pp, m))
        assert sim.peak_activation_units(2.0) == pytest.approx(sim.peak_activations)
        if pp >= 4:  # beyond 2·M_B the first rank's (p − 1, 1) point overtakes p + 1
            assert max(sim.peak_activation_units(2.5)) > max(sim.peak_activations)


def test_deepseek_v3_recipe_keeps_m_w_in_fp8_below_twice_m_b():
    from planner import api

    job = api.build_job("deepseek-v3", 4096, global_batch_size=15360)
    shape = ActivationShape(
        seq_len=4096,
        micro_batch_size=1,
        measures=job.active_memory_measures,
        element_bytes=job.precision.activation_bytes,
    )
    bf16 = shape.model_copy(update={"measures": shape.measures.for_gemm_dtype("bf16")})
    for moe_layer in (False, True):
        fp8 = weight_pass_bytes_per_layer(job.model, shape, moe_layer)
        assert fp8 < 2 * activation_bytes_per_layer(job.model, shape, moe_layer)
        assert fp8 == pytest.approx(weight_pass_bytes_per_layer(job.model, bf16, moe_layer) / 2)

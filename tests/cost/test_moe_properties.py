"""Invariants of the MoE / expert-parallel model, and DeepSeek-V3's DualPipe memory."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hwspecs.catalog import load_accelerator, load_cluster
from hwspecs.errors import PlanError
from planner import api
from planner.comm.report import axis_traffic
from planner.cost.activations import ActivationShape, layer_activation_tensors
from planner.cost.adapters import routed_expert_params
from planner.cost.compute import GpuRates, layer_op_times
from planner.cost.flops import model_flops_per_token
from planner.cost.memory import dualpipe_activations
from planner.cost.optimizers import optimizer_step_cost
from planner.cost.stage_times import shape_times
from planner.estimate import layout_columns
from planner.evaluate import evaluate_columns
from planner.explain import explain_estimate
from planner.memory_report import memory_report
from planner.spec.job import Job
from planner.spec.layout import Layout
from planner.spec.model import load_model
from planner.structure.params import mtp_params_per_rank, params_per_virtual_stage

MOE_MODELS = ("mixtral-8x7b", "qwen3-235b-a22b", "deepseek-v3")
H100 = load_accelerator("h100-sxm")


@settings(max_examples=30, deadline=None)
@given(
    name=st.sampled_from(MOE_MODELS),
    ep_power=st.integers(0, 6),
    tokens=st.sampled_from([1024, 4096]),
)
def test_ep_never_changes_the_flops_a_rank_runs(name, ep_power, tokens):
    """Balanced routing: each EP rank gets tokens·k copies whatever ep is, so EP only moves FLOPs."""
    model = load_model(name)
    ep = min(2**ep_power, model.num_routed_experts)
    rates = GpuRates.of(H100, "bf16")

    def flops(ep_degree: int) -> float:
        ops = layer_op_times(model, tokens, 1, 1, 1, ep_degree, False, True, True, rates)
        return sum(op.forward_flops for op in ops)

    assert flops(ep) == pytest.approx(flops(1))


@settings(max_examples=20, deadline=None)
@given(name=st.sampled_from(MOE_MODELS), zero=st.integers(0, 3))
def test_more_ep_lowers_expert_memory_per_gpu(name, zero):
    model = load_model(name)
    job = Job(model=model, seq_len=2048, global_batch_tokens=2048 * 64)
    degrees = [ep for ep in (1, 2, 4, 8) if model.num_routed_experts % ep == 0]
    reports = [
        memory_report(job, Layout(tp=1, pp=4, dp=8, ep=ep, zero_stage=zero), H100) for ep in degrees
    ]
    experts = [max(stage.num_expert_params for stage in r.per_stage) for r in reports]
    assert all(a > b for a, b in itertools.pairwise(experts))
    totals = [r.total_bytes for r in reports]
    assert all(a >= b for a, b in itertools.pairwise(totals))


@settings(max_examples=20, deadline=None)
@given(top_k=st.integers(1, 8), hidden_blocks=st.integers(8, 48))
def test_all_to_all_bytes_scale_with_top_k_and_hidden_size(top_k, hidden_blocks):
    """Bytes per step = layers · m · 4 exchanges · tokens · top-k · h · dtype · (ep−1)/ep."""
    base = load_model("mixtral-8x7b")
    model = base.model_copy(
        update={"num_experts_per_token": top_k, "hidden_size": 128 * hidden_blocks}
    )
    job = Job(model=model, seq_len=4096, global_batch_tokens=4096 * 32)
    layout = Layout(tp=1, pp=1, dp=8, ep=8, zero_stage=1)
    ep = next(a for a in axis_traffic(job, layout, "dgx-h100").axes if a.axis == "ep")
    m = 32 // 8
    expected = model.num_layers * m * 4 * 4096 * top_k * model.hidden_size * 2 * 7 / 8
    assert ep.bytes_per_step == pytest.approx(expected)


def test_dualpipe_ranks_hold_pp_plus_one_chunks_split_between_their_two_stages():
    stage_bytes = np.array([1.0, 10.0, 10.0, 100.0])  # embedding stage … head stage
    held = dualpipe_activations(stage_bytes)
    assert held.tolist() == [1 * 4 + 100 * 1, 10 * 3 + 10 * 2, 10 * 2 + 10 * 3, 100 * 1 + 1 * 4]
    assert dualpipe_activations(np.ones(8)).tolist() == [9.0] * 8  # the README's PP + 1


def test_deepseek_v3_mtp_module_sits_on_the_last_stage_without_its_own_head():
    model = load_model("deepseek-v3")
    dense, expert = mtp_params_per_rank(model, tp=1, ep=1)
    assert dense + expert == pytest.approx(model.mtp_module_params())  # no embedding, no head
    layout = Layout(pp=16, dp=128, ep=64, schedule="dualpipe")
    without = model.model_copy(update={"num_mtp_modules": 0})
    last = [params_per_virtual_stage(m, layout) for m in (model, without)]
    assert last[0][1][-1] - last[1][1][-1] == pytest.approx(expert / 64)  # experts split by EP
    assert (last[0][0][:-1] == last[1][0][:-1]).all()  # only the last stage holds it


def test_deepseek_v3_mtp_module_runs_one_more_of_the_models_layers():
    """Under FP8 the MTP module's layer is a layer of the model: the same operations,
    its GEMM operands' online quantization included; its head is the model's head."""
    model = load_model("deepseek-v3")
    h800 = load_accelerator("h800-sxm")
    fp8, bf16 = GpuRates.of(h800, "fp8"), GpuRates.of(h800, "bf16")
    times = shape_times(model, 4096, 1, 1, 1, 64, False, True, fp8, 2.0, bf16_rates=bf16)
    mtp = {op.name.removeprefix("mtp."): op for op in times.head if op.name.startswith("mtp.")}
    for op in times.moe.ops:
        assert mtp[op.name] == op.model_copy(update={"name": "mtp." + op.name}), op.name
    assert "fp8.quantize" in mtp
    head = next(op for op in times.head if op.name == "lm_head")  # the BF16 output head
    assert mtp["lm_head"] == head.model_copy(update={"name": "mtp.lm_head"})


def test_deepseek_v3_columns_and_memory_report_agree_on_the_published_layout():
    job = api.build_job("deepseek-v3", 4096, global_batch_size=15360)
    layout = api.build_layout(tp=1, pp=16, ep=64, dp=128, schedule="dualpipe", zero_stage=1)
    h800 = load_accelerator("h800-sxm")
    m = layout.resolved_num_microbatches(job.global_batch_size)
    row = evaluate_columns(job, load_cluster("dgx-h800"), h800, layout_columns(layout, m))
    report = memory_report(job, layout, h800)
    assert row["memory_per_gpu_bytes"][0] == pytest.approx(report.total_bytes)
    assert report.fits


@pytest.mark.parametrize("ep", [1, 2, 8])
def test_zero_shards_the_expert_optimizer_step_over_the_expert_data_parallel_group(ep):
    """Under ZeRO-1 a rank steps 1/dp of the dense parameters and 1/(dp/ep) of the routed
    experts it holds (the groups the memory model shards their states over): 1/ep of them,
    so 1/dp of every parameter, whatever ep."""
    job = api.build_job("mixtral-8x7b", 4096, global_batch_size=64)
    layout = api.build_layout(tp=1, pp=1, dp=8, ep=ep, zero_stage=1)
    result = api.estimate(job, layout, "dgx-h100")
    model = job.model
    experts = routed_expert_params(model)
    per_param = optimizer_step_cost(job.precision, 1.0).bytes_moved
    rank_params = (model.num_params() - experts) / 8 + experts / ep / (8 // ep)
    hbm = GpuRates.of(H100, job.precision.gemm_dtype).hbm_bytes_per_s
    assert result.time_breakdown_s["optimizer"] == pytest.approx(rank_params * per_param / hbm)


def _with_routing(name: str, **routing):
    return load_model(name).model_validate({**load_model(name).model_dump(), **routing})


@settings(max_examples=15, deadline=None)
@given(name=st.sampled_from(MOE_MODELS), load=st.floats(1.0, 2.0), ep_power=st.integers(1, 3))
def test_routed_load_scales_the_busiest_ranks_expert_work_and_nothing_else(name, load, ep_power):
    """Dropless imbalance r: the busiest EP rank's routed-expert GEMMs, its all-to-all bytes
    and its routed activations grow r-fold; attention, shared experts and the model FLOPs
    MFU counts do not change."""
    base, skewed = load_model(name), _with_routing(name, moe_imbalance=load)
    ep = 2**ep_power
    rates = GpuRates.of(H100, "bf16")

    def ops(model) -> dict:
        found = layer_op_times(model, 4096, 1, 1, 1, ep, False, True, True, rates)
        return {op.name: op for op in found}

    balanced, busiest = ops(base), ops(skewed)
    routed = "moe.routed_experts"
    assert busiest[routed].forward_flops == pytest.approx(load * balanced[routed].forward_flops)
    for name_ in balanced.keys() - {routed, "elementwise.mlp_activation", "moe.permutation"}:
        assert busiest[name_] == balanced[name_]
    # The sort by local expert (4 passes, where a rank holds several experts) moves the busiest
    # rank's received copies, the rest of the permutations its own tokens' copies.
    extra_s = busiest["moe.permutation"].forward_s - balanced["moe.permutation"].forward_s
    several_experts = ep < base.num_routed_experts
    copies = 4096 * base.num_experts_per_token * base.hidden_size * 2.0  # BF16 elements
    sorted_s = 4 * (load - 1) * copies / rates.hbm_bytes_per_s if several_experts else 0.0
    assert extra_s == pytest.approx(sorted_s, rel=1e-9, abs=1e-15)
    job = Job(model=base, seq_len=4096, global_batch_tokens=4096 * 64)
    layout = Layout(tp=1, pp=1, dp=8, ep=ep, zero_stage=1)
    skewed_job = job.model_copy(update={"model": skewed})

    def ep_bytes(j) -> float:
        return next(a for a in axis_traffic(j, layout, "dgx-h100").axes if a.axis == "ep")

    assert ep_bytes(skewed_job).bytes_per_step == pytest.approx(load * ep_bytes(job).bytes_per_step)
    shape = ActivationShape(seq_len=4096, micro_batch_size=1, ep=ep)
    expert = ("moe.expert_input", "moe.expert_output")
    plain = layer_activation_tensors(base, shape, moe_layer=True)
    heavy = layer_activation_tensors(skewed, shape, moe_layer=True)
    for tensor in expert:
        assert heavy[tensor] == pytest.approx(load * plain[tensor])
    assert heavy["mlp.norm_input"] == plain["mlp.norm_input"]
    assert model_flops_per_token(skewed, 4096) == model_flops_per_token(base, 4096)


def test_imbalance_needs_expert_parallelism_a_capacity_factor_does_not():
    """On one rank the experts share the imbalance (the total is balanced); capacity
    buffers are computed padded whatever ep."""
    rates = GpuRates.of(H100, "bf16")

    def routed_flops(model) -> float:
        ops = layer_op_times(model, 4096, 1, 1, 1, 1, False, True, True, rates)
        return next(op.forward_flops for op in ops if op.name == "moe.routed_experts")

    base = routed_flops(load_model("mixtral-8x7b"))
    assert routed_flops(_with_routing("mixtral-8x7b", moe_imbalance=1.5)) == base
    assert routed_flops(_with_routing("mixtral-8x7b", moe_capacity_factor=1.25)) == pytest.approx(
        1.25 * base
    )


def test_routing_flags_are_checked():
    with pytest.raises(PlanError, match="not both"):
        api.build_job("deepseek-v3", 4096, global_batch_size=64, moe_imbalance=1.2,
                      moe_capacity_factor=1.5)  # fmt: skip
    with pytest.raises(PlanError, match="not a mixture-of-experts model"):
        api.build_job("llama3-8b", 4096, global_batch_size=64, moe_imbalance=1.2)
    job = api.build_job("deepseek-v3", 4096, global_batch_size=64, moe_imbalance=1.2)
    assert job.model.moe_imbalance == 1.2 and job.model.routed_load_factor(64) == 1.2


def test_estimate_explains_the_routing_load_and_what_dualpipe_hides():
    job = api.build_job("deepseek-v3", 4096, global_batch_size=15360, moe_imbalance=1.2)
    layout = api.build_layout(tp=1, pp=16, ep=64, dp=128, schedule="dualpipe", zero_stage=1)
    result = api.estimate(job, layout, "dgx-h800", 2048)
    text = " ".join(explain_estimate(result, job))
    assert "busiest EP rank at 1.2× the balanced load" in text
    assert "experts: 4 routed experts per rank, whole" in text  # 256 over ep 64, tp 1
    raw, exposed = result.comm_time_s["ep"], result.time_breakdown_s["ep_exposed"]
    assert "80.8% of the end ranks' forward chunks" in text  # 97 of 120 (DualPipe steps 4-5)
    assert f"hides {raw - exposed:.3f} s of the {raw:.3f} s" in text


def test_estimate_explains_how_many_nodes_a_token_reaches():
    """DeepSeek-V3's router keeps 4 of 8 expert groups: over EP 64 (8 nodes of dgx-h800) a
    token reaches 4 nodes, over EP 256 (32 nodes, each group over 4) up to all 8 of its
    experts' nodes; inside one node nothing crosses the scale-out network."""
    job = api.build_job("deepseek-v3", 4096, global_batch_size=15360)

    def text(ep: int, pp: int = 16) -> str:
        layout = api.build_layout(tp=1, pp=pp, ep=ep, dp=2048 // pp, schedule="dualpipe",
                                  zero_stage=1)  # fmt: skip
        return " ".join(explain_estimate(api.estimate(job, layout, "dgx-h800", 2048), job))

    assert "whole groups on each node): a token's 8 experts lie on at most 4 of the EP " \
        "group's 8 nodes" in text(64)  # fmt: skip
    assert "each group over 4 nodes): a token's 8 experts lie on at most 8 of the EP " \
        "group's 32 nodes" in text(256, pp=8)  # fmt: skip
    assert "node-limited" not in text(8)


def test_combined_1f1b_hides_the_paired_steps_all_to_alls():
    """With --ep-comm-overlap, interleaved 1F1B hides the EP all-to-alls of its paired steps
    as DualPipe's F&B pairs do (the same shared window and the all-to-all kernels' SMs);
    plain 1F1B with PP and full recomputation, which Megatron-Core refuses it, expose all."""
    from planner.comm.exposure import ep_overlap_sm_share, shared_exposure
    from planner.pipeline.closed_form import combined_1f1b_paired_share

    def run(overlap: bool, **layout):
        job = api.build_job("deepseek-v3", 4096, global_batch_size=16384, ep_comm_overlap=overlap)
        lay = api.build_layout(tp=1, pp=16, ep=64, dp=128, zero_stage=1, **layout)
        return job, api.estimate(job, lay, "dgx-h800", 2048)

    interleaved = dict(schedule="interleaved-1f1b", vpp=2, recompute="none")
    job, on = run(True, **interleaved)
    _, off = run(False, **interleaved)
    raw = on.comm_time_s["ep"]
    assert off.time_breakdown_s["ep_exposed"] == pytest.approx(raw)
    stage = on.stage_times_s
    window = on.num_microbatches * (stage["forward"] + stage["input_grad"] + stage["weight_grad"])
    paired = combined_1f1b_paired_share(16, on.num_microbatches, 2)
    sm_share = ep_overlap_sm_share(load_accelerator("h800-sxm").num_compute_units)
    expected = shared_exposure(raw, raw, window, sm_share, paired)
    assert 0 < on.time_breakdown_s["ep_exposed"] < raw
    assert on.time_breakdown_s["ep_exposed"] == pytest.approx(float(expected), rel=1e-9)
    assert "combined 1F1B" in " ".join(explain_estimate(on, job))
    for refused in (dict(schedule="1f1b", recompute="none"), {**interleaved, "recompute": "full"}):
        job, result = run(True, **refused)
        assert result.time_breakdown_s["ep_exposed"] == pytest.approx(result.comm_time_s["ep"])
        assert "not run here" in " ".join(explain_estimate(result, job))


def test_the_token_dispatcher_permutes_each_routed_copy_around_the_experts():
    """Megatron-Core's all-to-all dispatcher, Mixtral 8x7B (top-2, h 4096) on 4096 tokens:
    with several experts per rank, permutation 1 and 2 and their inverses move each copy
    read and written four times and the tokens' sum once more (7 + 1/k passes of h·2 bytes);
    with one expert per rank the sort by local expert goes (3 + 1/k). The backward moves as
    much; a dense layer has none."""
    from planner.cost.compute import GpuRates, layer_op_times
    from planner.spec.model import load_model

    model = load_model("mixtral-8x7b")
    rates = GpuRates.of(load_accelerator("h100-sxm"), "bf16")

    def permutation(ep, moe_layer=True):
        ops = layer_op_times(model, 4096, 1, 1, 1, ep, False, True, moe_layer, rates, 2.0)
        return next((op for op in ops if op.name == "moe.permutation"), None)

    copies = 4096 * 2  # balanced routing: every token's top-2
    per_pass = copies * 4096 * 2 / rates.hbm_bytes_per_s
    several, one = permutation(2), permutation(8)
    assert several.forward_s == pytest.approx(per_pass * (7 + 1 / 2))
    assert one.forward_s == pytest.approx(per_pass * (3 + 1 / 2))
    assert several.input_grad_s == several.forward_s and several.weight_grad_s == 0.0
    assert permutation(2, moe_layer=False) is None

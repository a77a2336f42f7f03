"""Fine-tuning recipes and optimizers in the step-time model, the search and `llmplan plan`."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hwspecs.catalog import load_accelerator, load_cluster
from planner.cost.adapter_flops import dequantization_bytes_per_pass, dequantization_passes
from planner.cost.compute import GpuRates
from planner.cost.optimizers import muon_matrix_shapes, optimizer_step_cost, optimizer_step_time
from planner.cost.stage_times import shape_times
from planner.estimate import estimate, layout_columns
from planner.evaluate import evaluate_columns
from planner.memory_report import memory_report
from planner.spec.finetune import FinetuneSpec
from planner.spec.job import Job
from planner.spec.layout import Layout
from planner.spec.model import load_model
from planner.spec.precision import PrecisionSpec
from tests.cli_runner import run as run_argv

DGX = load_cluster("dgx-h100")
H100 = load_accelerator("h100-sxm")
LLAMA8B = load_model("llama3-8b")
LORA = FinetuneSpec(recipe="lora", lora_rank=16)
QLORA = FinetuneSpec(recipe="qlora", lora_rank=64)


def job_with(finetune=None, optimizer="adamw", seq_len=2048, batch=64) -> Job:
    return Job(
        model=LLAMA8B,
        seq_len=seq_len,
        global_batch_tokens=seq_len * batch,
        precision=PrecisionSpec(optimizer=optimizer),
        finetune=finetune,
    )


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
    pp=st.sampled_from([1, 2, 4, 8]),
    schedule=st.sampled_from(["1f1b", "interleaved-1f1b", "zbv", "dualpipe"]),
    zero=st.integers(0, 3),
    recompute=st.sampled_from(["none", "selective", "full"]),
    mbs=st.sampled_from([1, 2]),
).filter(lambda lay: lay.pp > 1 or lay.schedule == "1f1b")


@settings(max_examples=30, deadline=None)
@given(layout=layouts, finetune=st.sampled_from([LORA, QLORA, FinetuneSpec(recipe="dora")]))
def test_examined_slots_hold_the_recipe_memory_peak(layout, finetune):
    """The columns model's memory equals memory_report's for adapter recipes too."""
    job = job_with(finetune, seq_len=4096, batch=256)
    m = layout.resolved_num_microbatches(job.global_batch_size)
    row = evaluate_columns(job, DGX, H100, layout_columns(layout, m))
    report = memory_report(job, layout, H100)
    assert row["memory_per_gpu_bytes"][0] == pytest.approx(report.total_bytes)
    for part in ("weights", "gradients", "master_weights", "optimizer_states", "activations"):
        assert row[f"memory_{part}_bytes"][0] == pytest.approx(report.breakdown_bytes[part])


@pytest.mark.parametrize("finetune", [LORA, QLORA])
def test_recipe_estimate_matches_its_search_row(finetune):
    job = job_with(finetune)
    layout = Layout(tp=2, pp=2, dp=2, zero_stage=1, recompute="full")
    result = estimate(job, layout, DGX)
    row = evaluate_columns(job, DGX, H100, layout_columns(layout, result.num_microbatches))
    assert result.step_time_s == pytest.approx(row["step_time_s"][0])
    assert result.memory_per_gpu_bytes == pytest.approx(row["memory_per_gpu_bytes"][0])


def test_lora_has_far_less_weight_gradient_time_than_full_training():
    layout = Layout(tp=1, pp=1, dp=8, zero_stage=1, micro_batch_size=2)
    full = estimate(job_with(), layout, DGX)
    lora = estimate(job_with(LORA), layout, DGX)
    assert lora.stage_times_s["weight_grad"] < 0.2 * full.stage_times_s["weight_grad"]
    # Input gradients still flow through the frozen base: B stays (plus the adapters' own).
    assert lora.stage_times_s["input_grad"] >= full.stage_times_s["input_grad"]
    assert lora.time_breakdown_s["optimizer"] < 0.05 * full.time_breakdown_s["optimizer"]


def test_qlora_dequantizes_every_nf4_weight_per_pass_at_hbm_bandwidth():
    """Per-layer dequantization × layers × passes = dequantization_bytes_per_pass × passes."""
    rates = GpuRates.of(H100, "bf16")
    tuned = shape_times(LLAMA8B, 2048, 1, 1, 1, 1, False, True, rates, 2.0, QLORA)
    (dequant,) = [op for op in tuned.dense.ops if op.name == "qlora.dequantize"]
    for recompute in ("none", "full"):
        per_pass = dequant.forward_s * LLAMA8B.num_layers
        passes = 2 + (recompute == "full")
        expected = dequantization_bytes_per_pass(LLAMA8B, QLORA) / rates.hbm_bytes_per_s
        assert per_pass * passes == pytest.approx(expected * dequantization_passes(recompute))
    assert dequant.input_grad_s == dequant.forward_s


def test_muon_adds_newton_schulz_and_a_gather_to_the_step():
    layout = Layout(tp=1, pp=1, dp=8, zero_stage=1, micro_batch_size=2)
    adamw = estimate(job_with(), layout, DGX)
    muon = estimate(job_with(optimizer="muon"), layout, DGX)
    assert muon.time_breakdown_s["optimizer"] > adamw.time_breakdown_s["optimizer"] > 0
    assert muon.time_breakdown_s["optimizer_comm"] > 0
    assert "optimizer_comm" not in adamw.time_breakdown_s
    assert muon.step_time_s == pytest.approx(sum(muon.time_breakdown_s.values()))


def test_muon_step_on_one_stage_is_optimizer_step_time():
    """With the whole model on each rank the columns model is planner.cost.optimizers' cost."""
    job = job_with(optimizer="muon")
    layout = Layout(tp=1, pp=1, dp=8, zero_stage=1, micro_batch_size=2)
    result = estimate(job, layout, DGX)
    cost = optimizer_step_cost(
        job.precision, LLAMA8B.num_params(), muon_matrix_shapes(LLAMA8B), dp=8, zero_stage=1
    )
    rates = GpuRates.of(H100, "bf16")
    time = optimizer_step_time(cost, rates.hbm_bytes_per_s, rates.matmul_flops_per_s, 1.0)
    assert result.time_breakdown_s["optimizer"] == pytest.approx(
        time.elementwise_s + time.newton_schulz_s
    )


def run(capsys, args: str):
    """``llmplan`` with its arguments in one string."""
    return run_argv(capsys, *args.split())


def test_plan_cli_plans_a_lora_job_in_far_less_memory_than_full_training(capsys):
    args = "plan --model llama3-8b --cluster dgx-h100 --gpus 8 --seq-len 2048 "
    args += "--global-batch-size 64 --recipe lora --json"
    code, out, err = run(capsys, args)
    assert code == 0, err
    found = json.loads(out)
    winner = found["results"][0]
    assert found["query"]["recipe"] == "lora"
    layout = Layout(**winner["layout"])
    full = estimate(job_with(), layout, DGX)
    # Same layout: only the adapters have gradients, master copies and optimizer states.
    trained = ("gradients", "master_weights", "optimizer_states")
    lora_states = sum(winner["memory_breakdown_bytes"][part] for part in trained)
    full_states = sum(full.memory_breakdown_bytes[part] for part in trained)
    assert lora_states < 0.02 * full_states
    assert winner["memory_per_gpu_bytes"] < full.memory_per_gpu_bytes


def test_estimate_cli_takes_the_recipe_flags(capsys):
    args = "estimate --model llama3-8b --cluster dgx-h100 --gpus 8 --tp 1 --pp 1 --dp 8 "
    args += "--seq-len 2048 --global-batch-size 64 --recipe qlora --lora-rank 64 "
    args += "--lora-targets attention --no-double-quant --json"
    code, out, err = run(capsys, args)
    assert code == 0, err
    assert json.loads(out)["stage_times_s"]["weight_grad"] > 0


def test_recipe_flags_need_an_adapter_recipe_in_plan(capsys):
    args = "plan --model llama3-8b --cluster dgx-h100 --gpus 8 --lora-rank 16 --json"
    code, out, err = run(capsys, args)
    assert code == 2
    assert "--lora-rank needs an adapter recipe" in out + err

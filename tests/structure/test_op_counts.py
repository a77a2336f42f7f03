"""Operations per pass (planner.structure.op_counts) and the per-operation cost they carry.

The closed form is checked against what PyTorch really dispatches for the reference
workloads; the cost term against its definition (0 when the accelerator records none, so
every catalog result is unchanged; ``operations × op_overhead_s`` per pass when it does),
and the search's columns against the per-rank sums with the term on.
"""

from __future__ import annotations

import numpy as np
import pytest

from hwspecs.catalog import load_accelerator, load_cluster
from planner.cost.compute import GpuRates
from planner.cost.stage_times import rank_times, shape_times
from planner.estimate import estimate, layout_columns
from planner.evaluate import evaluate_columns
from planner.spec.job import Job
from planner.spec.layout import Layout
from planner.spec.model import load_model
from planner.spec.precision import PrecisionSpec
from planner.structure import op_counts
from planner.structure.stages import rank_structure

DGX = load_cluster("dgx-h100")
H100 = load_accelerator("h100-sxm")
OVERHEAD_S = 2e-5
H100_EAGER = H100.model_copy(
    update={
        "op_overhead_s": OVERHEAD_S,
        "sources": {**H100.sources, "op_overhead_s": "test: a made-up figure"},
    }
)


def _tiny_job(workload) -> Job:
    """The workload's job in BF16 (the H100 entry records BF16 and FP8 efficiencies)."""
    return Job(
        model=workload.model_spec(),
        seq_len=workload.seq_len,
        global_batch_tokens=workload.seq_len,
        precision=PrecisionSpec(recipe="bf16-mixed", optimizer="adamw"),
        flash_attention=True,
        runtime_overhead_bytes=0,
    )


# ----- the closed form against the reference implementation --------------------------------


@pytest.mark.parametrize("name", ["TINY", "TINY_MOE"])
def test_closed_form_counts_what_torch_dispatches_for_the_reference_model(name):
    torch = pytest.importorskip("torch")
    import validate.run as runs
    from validate.host_costs import count_dispatched_ops
    from validate.workloads.data_parallel import adamw
    from validate.workloads.model import build_model, cross_entropy, synthetic_batch

    workload = getattr(runs, name)
    model_spec = workload.model_spec()
    torch.set_num_threads(1)
    model = build_model(workload)
    optimizer = adamw(model.parameters())
    tokens, labels = synthetic_batch(workload, 1, 0)
    for _ in range(2):  # gradients and optimizer states exist, as in a timed step
        cross_entropy(model(tokens), labels).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)
    losses = []
    forward = count_dispatched_ops(lambda: losses.append(cross_entropy(model(tokens), labels)))
    backward = count_dispatched_ops(lambda: losses[0].backward())
    step = count_dispatched_ops(optimizer.step)
    reset = count_dispatched_ops(lambda: optimizer.zero_grad(set_to_none=False))

    layers = [workload.is_moe_layer(i) for i in range(workload.num_layers)]
    total = sum((op_counts.layer_pass_ops(model_spec, moe) for moe in layers), op_counts.NO_OPS)
    total = total + op_counts.embedding_pass_ops(model_spec) + op_counts.head_pass_ops(model_spec)
    assert forward == total.forward
    assert backward == total.input_grad + total.weight_grad
    tensors = op_counts.rank_param_tensors(
        model_spec, None, layers.count(False), layers.count(True), 1, 1
    )
    assert tensors == len(list(model.parameters()))
    # Two record_function calls per step and per zero_grad (torch.optim's profiler markers).
    per_tensor = op_counts.optimizer_ops_per_tensor("adamw")
    assert step + reset - 4 == tensors * per_tensor


def test_model_kinds_change_the_count_by_their_pieces():
    llama = load_model("llama3-8b")
    gelu = llama.model_copy(update={"mlp_kind": "gelu"})
    difference = np.subtract(
        op_counts.layer_pass_ops(llama, False), op_counts.layer_pass_ops(gelu, False)
    )
    # One linear fewer (gate_proj) and GELU's 1 + 2 operations for SwiGLU's 2 + 9.
    assert difference.tolist() == [4 + 1, 4 + 7, 6]
    assert op_counts.layer_param_tensors(llama, False) == 9
    assert op_counts.layer_param_tensors(gelu, False) == 8


# ----- the overhead term --------------------------------------------------------------------


def test_unset_overhead_is_zero_and_adds_no_operation():
    assert H100.op_overhead_s is None
    rates = GpuRates.of(H100, "bf16")
    assert rates.op_overhead_s == 0.0
    shape = shape_times(load_model("llama3-8b"), 4096, 1, 8, 1, 1, True, True, rates, 2.0)
    assert not [op for op in shape.dense.ops + shape.head if op.bound == "overhead"]


def test_overhead_adds_operations_times_the_cost_to_each_pass_and_the_optimizer(tmp_path):
    from validate.local_specs import to_toml
    from validate.run import TINY

    job = _tiny_job(TINY)
    layout = Layout(zero_stage=0)
    accelerator = load_accelerator("h100-sxm")
    path = tmp_path / "eager.toml"
    path.write_text(to_toml(H100_EAGER.model_dump()))
    eager_cluster = DGX.model_copy(update={"accelerator": str(path)})
    plain = estimate(job, layout, DGX)
    eager = estimate(job, layout, eager_cluster)
    assert accelerator.op_overhead_s is None

    model = job.model
    ops = op_counts.layer_pass_ops(model, False) * model.num_layers
    ops = ops + op_counts.embedding_pass_ops(model) + op_counts.head_pass_ops(model)
    forward = eager.stage_times_s["forward"] - plain.stage_times_s["forward"]
    backward = (
        eager.stage_times_s["input_grad"]
        + eager.stage_times_s["weight_grad"]
        - plain.stage_times_s["input_grad"]
        - plain.stage_times_s["weight_grad"]
    )
    assert forward == pytest.approx(ops.forward * OVERHEAD_S, rel=1e-9)
    assert backward == pytest.approx((ops.input_grad + ops.weight_grad) * OVERHEAD_S, rel=1e-9)
    tensors = op_counts.rank_param_tensors(model, None, model.num_layers, 0, 1, 1)
    optimizer = eager.time_breakdown_s["optimizer"] - plain.time_breakdown_s["optimizer"]
    assert optimizer == pytest.approx(tensors * 11 * OVERHEAD_S, rel=1e-9)


@pytest.mark.parametrize(
    "layout",
    [
        Layout(tp=2, pp=4, dp=8, schedule="1f1b", zero_stage=1),
        Layout(tp=1, pp=4, dp=16, schedule="zbv", vpp=2, recompute="full"),
        Layout(tp=4, pp=2, dp=8, schedule="dualpipev", vpp=2, zero_stage=1),
    ],
)
def test_columns_with_overhead_equal_the_per_rank_sums(layout):
    job = Job(model=load_model("llama3-8b"), seq_len=4096, global_batch_tokens=4096 * 256)
    rates = GpuRates.of(H100_EAGER, "bf16")
    shape = shape_times(
        job.model, 4096, layout.micro_batch_size, layout.tp, 1, 1, layout.tp > 1, True, rates, 2.0
    )
    structure = rank_structure(job.model, layout.pp, layout.vpp, layout.schedule, "auto")
    times = rank_times(shape, structure, layout.recompute)
    m = layout.resolved_num_microbatches(job.global_batch_size)
    row = evaluate_columns(job, DGX, H100_EAGER, layout_columns(layout, m))
    busiest = sum(
        row[key][0]
        for key in ("forward_s", "input_grad_s", "weight_grad_s", "recompute_per_microbatch_s")
    )
    totals = np.add.reduce(
        [times.forward_s, times.input_grad_s, times.weight_grad_s, times.recompute_s]
    )
    if layout.zero_stage <= 1 and layout.dp * layout.cp > 1:  # DDP's hook per tensor
        tensors = op_counts.rank_param_tensors(
            job.model, None, np.asarray(structure.dense_layers),
            np.asarray(structure.moe_layers), np.asarray(structure.has_embedding, dtype=float),
            np.asarray(structure.has_head, dtype=float),
        )  # fmt: skip
        totals = totals + tensors * op_counts.DDP_BACKWARD_OPS_PER_TENSOR * OVERHEAD_S
    if layout.schedule != "dualpipev":  # DualPipe paces by the mean of its two directions
        assert busiest == pytest.approx(totals.max())
    plain = evaluate_columns(job, DGX, H100, layout_columns(layout, m))
    assert row["step_time_s"][0] > plain["step_time_s"][0]
    assert row["optimizer_s"][0] > plain["optimizer_s"][0]


# ----- torch's parallel forms: DTensor TP, FSDP2, DTensor optimizer steps -------------------

SHARDED_S, FUNCTIONAL_S = 9e-5, 1e-3
WRAPPER_S = {"fsdp_unit_forward": 3e-4, "fsdp_unit_backward": 5e-4, "ddp_forward": 7e-4,
             "ddp_backward": 2e-4}  # fmt: skip
H100_TORCH = H100_EAGER.model_copy(
    update={
        "sharded_op_overhead_s": SHARDED_S,
        "functional_collective_overhead_s": FUNCTIONAL_S,
        "data_parallel_overhead_s": WRAPPER_S,
        "sources": {
            **H100_EAGER.sources,
            "sharded_op_overhead_s": "test: a made-up figure",
            "functional_collective_overhead_s": "test: a made-up figure",
            "data_parallel_overhead_s": "test: made-up figures",
        },
    }
)


@pytest.mark.parametrize("sequence_parallel", [True, False])
def test_dtensor_tp_layer_pays_its_added_sharded_and_collective_operations(sequence_parallel):
    model = load_model("llama3-8b")
    rates = GpuRates.of(H100_TORCH, "bf16")
    shape = shape_times(model, 4096, 1, 8, 1, 1, sequence_parallel, True, rates, 2.0)
    (dispatch,) = [op for op in shape.dense.ops if op.bound == "overhead"]
    tp = op_counts.tensor_parallel_ops(sequence_parallel)
    ops = op_counts.layer_pass_ops(model, False) + tp.added
    for i, seconds in enumerate(
        (dispatch.forward_s, dispatch.input_grad_s, dispatch.weight_grad_s)
    ):
        expected = (
            ops[i] * OVERHEAD_S
            + tp.on_dtensors[i] * (SHARDED_S - OVERHEAD_S)
            + tp.collectives[i] * FUNCTIONAL_S
        )
        assert seconds == pytest.approx(expected, rel=1e-12)
    # The counts describe one layer: every operation on a DTensor is one of its operations.
    assert all(d <= n for d, n in zip(tp.on_dtensors, ops, strict=True))
    untouched = shape_times(model, 4096, 1, 1, 1, 1, False, True, rates, 2.0)
    (plain,) = [op for op in untouched.dense.ops if op.bound == "overhead"]
    assert plain.forward_s == pytest.approx(op_counts.layer_pass_ops(model, False)[0] * OVERHEAD_S)


def test_fsdp_units_and_dtensor_parameters_add_their_operations(tmp_path):
    from validate.local_specs import to_toml

    job = Job(model=load_model("llama3-8b"), seq_len=4096, global_batch_tokens=4096 * 16)
    path = tmp_path / "torch.toml"
    path.write_text(to_toml(H100_TORCH.model_dump()))
    cluster = DGX.model_copy(update={"accelerator": str(path)})
    ddp = estimate(job, Layout(dp=16, zero_stage=1), cluster)
    fsdp = estimate(job, Layout(dp=16, zero_stage=3), cluster)
    layers = job.model.num_layers
    unit, root = op_counts.FSDP_UNIT_OPS, op_counts.FSDP_ROOT_OPS
    forward = fsdp.stage_times_s["forward"] - ddp.stage_times_s["forward"]
    fsdp_forward = (layers * unit.forward + root.forward) * OVERHEAD_S + (layers + 1) * WRAPPER_S[
        "fsdp_unit_forward"
    ]  # each layer and the root
    assert forward == pytest.approx(fsdp_forward - WRAPPER_S["ddp_forward"])
    tensors_ddp = op_counts.rank_param_tensors(job.model, None, layers, 0, 1, 1)
    backward = fsdp.stage_times_s["input_grad"] - ddp.stage_times_s["input_grad"]
    fsdp_backward = (layers * unit.input_grad + root.input_grad) * OVERHEAD_S + (
        layers + 1
    ) * WRAPPER_S["fsdp_unit_backward"]
    ddp_backward = (
        tensors_ddp * op_counts.DDP_BACKWARD_OPS_PER_TENSOR * OVERHEAD_S + WRAPPER_S["ddp_backward"]
    )
    assert backward == pytest.approx(fsdp_backward - ddp_backward)
    # The optimizer steps the same tensors, now DTensors: 9 of AdamW's 11 operations each.
    tensors = op_counts.rank_param_tensors(job.model, None, layers, 0, 1, 1)
    assert op_counts.optimizer_sharded_ops_per_tensor("adamw") == 9
    optimizer = fsdp.time_breakdown_s["optimizer"] - ddp.time_breakdown_s["optimizer"]
    assert optimizer == pytest.approx(tensors * 9 * (SHARDED_S - OVERHEAD_S), rel=1e-6)


ACTIONS = {"forward": 1e-3, "backward": 2e-3, "input_grad": 3e-3, "weight_grad": 4e-3}


@pytest.mark.parametrize(
    ("layout", "chunks", "split"),
    [
        (Layout(pp=4, dp=4, schedule="1f1b"), 1, False),
        (Layout(pp=4, dp=4, schedule="interleaved-1f1b", vpp=2), 2, False),
        (Layout(pp=4, dp=4, schedule="zbv", vpp=2), 2, True),
        (Layout(pp=1, dp=16), 0, False),
    ],
)
def test_pipeline_runtime_pays_its_overhead_per_action_and_chunk(tmp_path, layout, chunks, split):
    from validate.local_specs import to_toml

    job = Job(model=load_model("llama3-8b"), seq_len=4096, global_batch_tokens=4096 * 64)
    runtime = H100.model_copy(
        update={
            "pipeline_action_overhead_s": ACTIONS,
            "sources": {**H100.sources, "pipeline_action_overhead_s": "test: made up"},
        }
    )
    path = tmp_path / "runtime.toml"
    path.write_text(to_toml(runtime.model_dump()))
    with_runtime = estimate(job, layout, DGX.model_copy(update={"accelerator": str(path)}))
    plain = estimate(job, layout, DGX)
    added = {k: with_runtime.stage_times_s[k] - plain.stage_times_s[k] for k in plain.stage_times_s}
    backward = ACTIONS["input_grad"] if split else ACTIONS["backward"]
    assert added["forward"] == pytest.approx(chunks * ACTIONS["forward"])
    assert added["input_grad"] == pytest.approx(chunks * backward)
    assert added["weight_grad"] == pytest.approx(chunks * split * ACTIONS["weight_grad"])

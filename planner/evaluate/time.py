"""Step time per row of layouts (numpy columns): the busiest examined rank's F, B
(+ recompute) and W per micro-batch through the schedule's closed form
(:mod:`planner.pipeline.closed_form`), the exposed communication per axis
(:mod:`planner.comm.traffic`), the optimizer step and the time lost where axes share a link
(:mod:`planner.comm.contention`); throughput, MFU and HFU from it. The pipeline's part is
worked out once per distinct (structure, shape, micro-batches), the optimizer's once per
(structure, ZeRO stage, group)."""

from __future__ import annotations

import numpy as np

from planner.columns.codes import Labels, distinct_rows
from planner.columns.layout import LayoutColumns
from planner.columns.tables import TIME_SHAPE_KEYS, one_value_or_column, rows_by_value
from planner.comm.contention import occupancy_excess
from planner.comm.rows import chunks_column
from planner.comm.traffic import AXES, axis_times_vectorized, exposed_floor_vectorized
from planner.cost.adapter_flops import finetune_ops_per_sequence
from planner.cost.flops import model_flops_per_token, recompute_flops_per_token, sum_ops
from planner.cost.model_states import optimizer_columns
from planner.cost.profile import apply_profile, profile_floor_s, profile_inputs
from planner.cost.stage_times import accumulates_gradients
from planner.evaluate.rows import gather, held
from planner.pipeline import closed_form
from planner.pipeline.schedules.registry import BIDIRECTIONAL_SCHEDULES, SCHEDULES
from planner.spec.job import Job
from planner.structure import op_counts

#: Structure-table entries the pipeline's compute and the optimizer step read.
PACE_STRUCT_KEYS = ("paced_dense_layers", "paced_moe_layers", "emb", "head", "param_tensors")
#: A row's data-parallel wrapper in torch's implementation (:func:`data_parallel_form`).
NO_WRAPPER, DDP, FSDP = 0, 1, 2
OPTIMIZER_STRUCT_KEYS = ("optimizer_bytes", "optimizer_expert_bytes", "newton_schulz_flops",
                         "newton_schulz_bytes", "muon_params", "param_tensors")  # fmt: skip


def data_parallel_form(zero: np.ndarray, dp_cp: np.ndarray) -> np.ndarray:
    """FSDP2 under ZeRO-2/3, DDP under ZeRO-0/1 over more than one rank, else none."""
    return np.where(zero >= 2, FSDP, np.where(dp_cp > 1, DDP, NO_WRAPPER)).astype(np.int8)


def _with_wrapper_ops(form, R: dict, accelerator, op_overhead_s: float, F, B):
    """F and B plus the data-parallel wrapper's own work per micro-batch: its operations
    (:mod:`planner.structure.op_counts`: DDP's gradient hook per parameter tensor in backward,
    FSDP2's pre/post hooks per wrapped layer and for the root module) and its host time
    beyond them (:attr:`hwspecs.schema.Accelerator.data_parallel_overhead_s`: per wrapped
    unit for FSDP, per call for DDP)."""
    form = np.asarray(form)[:, None]
    ddp, fsdp = form == DDP, form == FSDP
    host = accelerator.data_parallel_overhead_s
    layers = R["paced_dense_layers"] + held(R, "paced_moe_layers", 1.0)
    unit, root = op_counts.FSDP_UNIT_OPS, op_counts.FSDP_ROOT_OPS
    F = F + fsdp * (
        (layers * unit.forward + root.forward) * op_overhead_s
        + (layers + 1) * host.get("fsdp_unit_forward", 0.0)
    )
    B = B + fsdp * (
        (layers * unit.input_grad + root.input_grad) * op_overhead_s
        + (layers + 1) * host.get("fsdp_unit_backward", 0.0)
    )
    F = F + ddp * host.get("ddp_forward", 0.0)
    B = B + ddp * (
        R["param_tensors"] * op_counts.DDP_BACKWARD_OPS_PER_TENSOR * op_overhead_s
        + host.get("ddp_backward", 0.0)
    )
    return F, B


def _with_pipeline_actions(accelerator, schedule, pp, vpp, F, B, W):
    """F, B and W per micro-batch plus the pipeline runtime's own cost per action
    (:attr:`hwspecs.schema.Accelerator.pipeline_action_overhead_s`): a rank runs one forward
    and one backward action (or an input- and a weight-gradient one, when the schedule
    splits the backward) per model chunk it holds; none without pipeline parallelism."""
    overhead = accelerator.pipeline_action_overhead_s
    if not overhead:
        return F, B, W
    chunks = (chunks_column(schedule, vpp) * (pp > 1))[:, None]
    splits = _is_split(schedule)[:, None]
    backward = np.where(splits, overhead.get("input_grad", 0.0), overhead.get("backward", 0.0))
    return (
        F + chunks * overhead.get("forward", 0.0),
        B + chunks * backward,
        W + chunks * splits * overhead.get("weight_grad", 0.0),
    )


def _is_split(schedule: Labels) -> np.ndarray:
    """Rows whose schedule splits the backward into input- and weight-gradient passes."""
    return schedule.isin([name for name, spec in SCHEDULES.items() if spec.splits_backward])


def time_columns(
    job: Job, cluster, accelerator, c: LayoutColumns, shapes: dict, structs: dict, order,
    mfu_dtype, rates, tuned,
) -> dict[str, np.ndarray]:  # fmt: skip
    """Step time per row: the busiest examined rank's F, B (+ recompute) and W per
    micro-batch through the schedule's closed form, exposed communication per axis, the
    optimizer step; throughput and MFU from it.

    The pipeline's part depends on a row's structure, shape and micro-batch count only, the
    optimizer's on its structure, ZeRO stage and group (and the DP rate Muon gathers at):
    each is worked out on one row per distinct combination and broadcast."""
    model = job.model
    tp, cp, pp, dp, ep = c.columns("tp", "cp", "pp", "dp", "ep")
    mbs, m, zero, recompute = c.micro_batch_size, c.num_microbatches, c.zero_stage, c.recompute
    struct_inv = c.structure.codes
    f, b, w, rc, pipeline, busy = paced_columns(c, shapes, structs, accelerator, rates)

    # Communication: exposed time per axis under the overlap rules.
    comm = axis_times_vectorized(
        job, cluster, **_comm_arguments(c, order), forward_s=f, backward_s=b + rc + w
    )

    # Optimizer: the trainable parameters' update (and Muon's orthogonalization and gather).
    zero_group = c.zero_group_size
    with np.errstate(divide="ignore", invalid="ignore"):  # the DP group's achieved bus rate
        dp_rate = np.where(
            comm["dp_time_s"] > 0, comm["dp_bytes_per_step"] / comm["dp_time_s"], np.inf
        )
    dp_rate = np.nan_to_num(dp_rate, nan=np.inf)
    # The DP rate matters only where Muon gathers (no structure has Muon matrices: none).
    muon = structs["muon_params"].any()
    step_rows, step_inv = distinct_rows(c.states, *((dp_rate,) if muon else ()))
    R = gather(structs, struct_inv[step_rows], OPTIMIZER_STRUCT_KEYS)
    dispatch_s = 0.0  # per tensor, its step's operations (sharded tensors step too)
    if rates.op_overhead_s:  # DTensor parameters (FSDP2's, DTensor TP's) step as DTensors
        optimizer = job.precision.optimizer
        per_tensor = op_counts.optimizer_ops_per_tensor(optimizer) * rates.op_overhead_s
        on_dtensors = op_counts.optimizer_sharded_ops_per_tensor(optimizer) * (
            rates.sharded_op_overhead_s - rates.op_overhead_s
        )
        sharded = ((zero[step_rows] >= 2) | (tp[step_rows] > 1))[:, None]
        dispatch_s = R["param_tensors"] * (per_tensor + sharded * on_dtensors)
    optimizer_s, optimizer_comm_s = (
        column[step_inv]
        for column in optimizer_columns(
            R, zero[step_rows], zero_group[step_rows], rates.hbm_bytes_per_s,
            accelerator.achievable_matmul_flops_per_s("bf16"), dp_rate[step_rows],
            dispatch_s=dispatch_s, expert_group=c.expert_data_parallel_size[step_rows],
        )
    )  # fmt: skip

    exposed = sum(comm[f"{axis}_exposed_time_s"] for axis in AXES)
    step = pipeline + exposed + optimizer_s + optimizer_comm_s
    contention = _link_contention(comm, step)
    step = step + contention
    num_gpus = tp * cp * pp * dp
    tokens = job.global_batch_tokens if job.global_batch_tokens else dp * m * mbs * job.seq_len
    tokens_per_s_per_gpu = tokens / step / num_gpus
    flops_token = _model_flops_per_token(job, tuned, causal=False)
    flops_token_causal = _model_flops_per_token(job, tuned, causal=True)
    peak = accelerator.peak_flops_per_s(mfu_dtype)
    recompute_flops = np.array(
        [recompute_flops_per_token(model, job.seq_len, r) for r in recompute.values]
    )
    extra = recompute_flops[recompute.codes]
    out = {
        "step_time_s": step,
        "pipeline_time_s": pipeline,
        "compute_s": busy - rc * m,
        "recompute_s": rc * m,
        "pipeline_bubble_s": pipeline - busy,
        "optimizer_s": optimizer_s,
        "optimizer_comm_s": optimizer_comm_s,
        "link_contention_s": contention,
        "forward_s": f,
        "input_grad_s": b,
        "weight_grad_s": w,
        "recompute_per_microbatch_s": rc,
        "tokens_per_s_per_gpu": tokens_per_s_per_gpu,
        "model_tflops_per_gpu": tokens_per_s_per_gpu * flops_token / 1e12,
        "hardware_tflops_per_gpu": tokens_per_s_per_gpu * (flops_token + extra) / 1e12,
        "mfu": tokens_per_s_per_gpu * flops_token / peak,
        "mfu_causal": tokens_per_s_per_gpu * flops_token_causal / peak,
        "hfu": tokens_per_s_per_gpu * (flops_token + extra) / peak,
        "exposed_comm_s": exposed,
        "busiest_link_s": _busiest_link(comm["link_busy_s"], len(tp)),
        "valid": comm["valid"],
    }
    out["bubble_fraction"] = out["pipeline_bubble_s"] / step
    for axis in AXES:
        out[f"{axis}_exposed_time_s"] = comm[f"{axis}_exposed_time_s"]
        out[f"{axis}_time_s"] = comm[f"{axis}_time_s"]
        out[f"{axis}_bytes_per_step"] = comm[f"{axis}_bytes_per_step"]
    # The fitted efficiency profile's terms, in one place (planner.cost.profile).
    comm_s = sum(comm[f"{axis}_time_s"] for axis in AXES)
    inputs = profile_inputs(job, tp, c.etp, cp, pp, ep, mbs, m, num_gpus, comm_s, exposed)
    return apply_profile(out, inputs, job.efficiency_profile)


def _comm_arguments(c: LayoutColumns, order) -> dict:
    """The rows' layout as :func:`planner.comm.traffic.axis_times_vectorized` reads it."""
    return {
        "tp": c.tp,
        "cp": c.cp,
        "pp": c.pp,
        "dp": c.dp,
        "ep": c.ep,
        "etp": c.etp,
        "vpp": c.vpp,
        "micro_batch_size": c.micro_batch_size,
        "num_microbatches": c.num_microbatches,
        "zero_stage": c.zero_stage,
        "sequence_parallel": c.sequence_parallel,
        "recompute": c.recompute,
        "schedule": c.schedule,
        "pipeline_layer_split": one_value_or_column(c.pipeline_layer_split),
        "order": order or ("tp", "cp", "ep", "pp", "dp"),
        "cp_algorithm": c.cp_algorithm,
        "cp_inner": c.cp_inner,
    }


def exposed_comm_floor(job: Job, cluster, c: LayoutColumns, order) -> np.ndarray:
    """A lower bound of each row's exposed communication in :func:`time_columns`' step,
    read without its compute times (:func:`planner.comm.traffic.exposed_floor_vectorized`;
    NaN where a row cannot be placed). Where the job's stack overlaps TP communication the
    profile's TP-overlap term may take the TP exposed time back: TP is left out there."""
    skip = ("tp",) if job.tp_comm_overlap else ()
    return exposed_floor_vectorized(job, cluster, **_comm_arguments(c, order), skip_axes=skip)


def paced_columns(
    c: LayoutColumns, shapes: dict, structs: dict, accelerator, rates
) -> tuple[np.ndarray, ...]:
    """Per row: the busiest examined rank's F, B, W and recompute seconds per micro-batch, the
    pipeline's closed-form step time and the busiest rank's compute in it
    (:func:`_pipeline_columns`), worked out once per distinct (structure, shape,
    micro-batches[, data-parallel form]) and broadcast."""
    paced_rows, paced_inv = distinct_rows(c.paced)
    paced = _pipeline_columns(
        c.take(paced_rows),
        gather(shapes, c.shape.codes[paced_rows], TIME_SHAPE_KEYS),
        gather(structs, c.structure.codes[paced_rows], PACE_STRUCT_KEYS),
        accelerator,
        rates,
    )
    return tuple(column[paced_inv] for column in paced)


def step_time_floor(
    job: Job, accelerator, c: LayoutColumns, shapes: dict, structs: dict, rates
) -> np.ndarray:
    """A lower bound of each row's step time (:func:`time_columns`' ``step_time_s``) that
    prices no collective: the pipeline's closed-form time and what the profile's compute,
    kernel and synchronisation terms add to it (:func:`planner.cost.profile.profile_floor_s`).

    The step is ``pipeline + exposed + optimizer + contention`` plus the profile's terms,
    each part of the first sum at least 0, the exposed time at least the TP exposed time
    the profile's TP-overlap term can take back: so at least this."""
    tp, cp, pp, ep = c.columns("tp", "cp", "pp", "ep")
    mbs, m = c.micro_batch_size, c.num_microbatches
    _, _, _, rc, pipeline, busy = paced_columns(c, shapes, structs, accelerator, rates)
    none = np.zeros(len(c))
    inputs = profile_inputs(job, tp, c.etp, cp, pp, ep, mbs, m, tp * cp * pp * c.dp, none, none)
    ideal = {"compute_s": busy - rc * m, "recompute_s": rc * m, "pipeline_time_s": pipeline}
    return pipeline + profile_floor_s({**ideal, **inputs}, job.efficiency_profile)


def _pipeline_columns(
    c: LayoutColumns, S: dict, R: dict, accelerator, rates
) -> tuple[np.ndarray, ...]:
    """Per row (of ``c``, pp, micro-batches, vpp, schedule and DP wrapper are read): the busiest examined rank's
    forward, input gradient, weight gradient and recompute seconds per micro-batch, the
    pipeline's step time by the schedule's closed form, and the busiest rank's compute time
    in it. Where the accelerator records host costs, the data-parallel wrapper's and the
    pipeline runtime's own operations are part of them (:func:`_with_wrapper_ops`,
    :func:`_with_pipeline_actions`)."""
    n = len(c)
    pp, m, vpp, schedule = c.pp, c.num_microbatches, c.vpp, c.schedule

    # Compute per examined rank; the busiest one sets the pipeline's pace. A DualPipe rank
    # runs half its micro-batches through each of its two stages: per micro-batch it does
    # the mean of their layers, and half of the embedding and of the head (+ MTP).
    pace = np.where(schedule.isin(BIDIRECTIONAL_SCHEDULES)[:, None], 0.5, 1.0)

    def on_slots(dense_key, moe_key, emb_key=None, head_key=None):
        total = R["paced_dense_layers"] * S[dense_key][:, None] + held(
            R, "paced_moe_layers", S[moe_key][:, None]
        )
        if emb_key:
            ends = R["emb"] * S[emb_key][:, None] + R["head"] * S[head_key][:, None]
            total = total + pace * ends
        return total

    F = on_slots("fd", "fm", "f_emb", "f_head")
    B = on_slots("bd", "bm", "b_emb", "b_head")
    accumulate = accumulates_gradients(c.zero_stage)  # W into the gradient buffer
    S = {**S, **{f"{key}_row": np.where(accumulate, S[f"{key}_acc"], S[key])
                 for key in ("wd", "wm", "w_head")}}  # fmt: skip
    W = on_slots("wd_row", "wm_row", "w_emb", "w_head_row")
    if rates.op_overhead_s:
        F, B = _with_wrapper_ops(c.data_parallel_form, R, accelerator, rates.op_overhead_s, F, B)
    F, B, W = _with_pipeline_actions(accelerator, schedule, pp, vpp, F, B, W)
    Rc = on_slots("rd", "rm")
    busiest = np.argmax(F + B + W + Rc, axis=1)
    pick = np.arange(n), busiest
    f, b, w, rc = F[pick], B[pick], W[pick], Rc[pick]

    # Pipeline step time by closed form: one call per schedule on its rows' columns.
    pipeline = np.zeros(n)
    busy = np.zeros(n)
    for sch, rows in rows_by_value(schedule):
        args = (sch, pp[rows], m[rows], vpp[rows])
        backward = b[rows] + rc[rows]
        pipeline[rows] = closed_form.step_time(*args, f[rows], backward, w[rows])
        busy[rows] = closed_form.busy_time(*args, f[rows], backward, w[rows])
    return f, b, w, rc, pipeline, busy


def _link_contention(comm: dict, step_s: np.ndarray) -> np.ndarray:
    """Seconds lost where axes share a link: the larger of the sharing delay and the excess
    of the busiest link's occupancy over the step (:mod:`planner.comm.contention`)."""
    links = list(comm["link_busy_s"])
    if not links:  # no traffic leaves the GPU
        return comm["link_contention_s"]
    busy, busiest_axis = (
        np.stack([comm[key][link] for link in links], axis=-1)
        for key in ("link_busy_s", "link_busiest_axis_s")
    )
    return np.maximum(comm["link_contention_s"], occupancy_excess(busy, busiest_axis, step_s))


def _busiest_link(link_busy_s: dict, n: int) -> np.ndarray:
    """Seconds per step the rank's busiest link carries traffic (all axes)."""
    return np.max([*link_busy_s.values(), np.zeros(n)], axis=0)


def _model_flops_per_token(job: Job, tuned, causal: bool) -> float:
    """Model FLOPs per token for MFU: full training's, or the recipe's (frozen base: no W)."""
    if tuned is None:
        return model_flops_per_token(job.model, job.seq_len, causal=causal)
    ops = finetune_ops_per_sequence(job.model, tuned, job.seq_len, causal)
    return sum_ops(ops).total / job.seq_len

"""Step time, throughput and memory for many layouts at once (numpy columns, one row each).

This is the one model the search screens with and the single-layout estimate reports.
Pieces that depend only on a few layout fields are computed once per distinct value of
those fields and broadcast to the rows (:mod:`planner.codes`): per-layer times and
activation bytes per (tp, cp, ep, etp, SP, micro-batch, recompute) shape and what each pipeline
rank holds per structure (:mod:`planner.evaluate_tables`); activations and the pipeline's
compute per (structure, shape, m); model states and the optimizer step per (structure,
ZeRO stage, dp·cp); communication buffers per (tp, cp, pp, ep, etp, ZeRO stage, SP,
micro-batch); whether a row can be placed per (structure, cp, dp); collectives per
(degrees, chunks, micro-batches, SP, recompute, ZeRO stage, split)
(:mod:`planner.traffic_columns`). Per row only sums, peaks and the exposure of the
collectives that hide behind compute are taken. String columns travel as codes
(:class:`planner.codes.Labels`). No Python loop runs per row.

Per row: the busiest pipeline rank's F, B (+ recomputation) and W per micro-batch feed the
schedule's closed-form step time (:mod:`planner.schedules.closed_form`); the exposed
communication per axis (:mod:`planner.traffic_columns`), the optimizer step and the time
lost where axes share a link (:mod:`planner.contention`) are added after it. Ranks are
examined at a few slots — the first two, the last two and the first rank with the most
layers — which hold the compute and memory peaks of every schedule here (in-flight counts fall along the pipeline or are flat; the ends hold the embedding
and the head); a test checks the slots against every rank.
"""

from __future__ import annotations

import numpy as np

from hwspecs.schema import Accelerator, Cluster
from planner import activations as act
from planner import finetune_costs as ft
from planner import op_counts
from planner.codes import Labels, coded, distinct_rows, unique_rows
from planner.compute import GpuRates
from planner.contention import occupancy_excess
from planner.evaluate_states import FIRST_SHARDED_STAGE, optimizer_columns
from planner.evaluate_tables import (
    MEMORY_SHAPE_KEYS,
    NUM_SLOTS,
    TIME_SHAPE_KEYS,
    one_value_or_column,
    rows_by_value,
    shape_table,
    structure_table,
)
from planner.flops import model_flops_per_token, recompute_flops_per_token, sum_ops
from planner.job import Job
from planner.layout import expert_data_parallel_size, resolved_etp
from planner.precision import DTYPE_BYTES, optimizer_states_per_param, unsharded_bytes_per_param
from planner.schedules import closed_form
from planner.schedules.registry import SCHEDULES
from planner.traffic_columns import AXES, axis_times_vectorized, chunks_column, placeable

RECOMPUTE_CODES = ("none", "selective", "full")
#: Integer layout columns :func:`evaluate_columns` reads.
INT_COLUMNS = ("tp", "cp", "pp", "dp", "ep", "vpp", "micro_batch_size", "num_microbatches",
               "zero_stage")  # fmt: skip
#: Structure-table entries the activation memory, the pipeline's compute and the optimizer
#: step read (model states read the parameters and the recipe's state terms, if any).
MEMORY_STRUCT_KEYS = ("dense_layers", "moe_layers", "emb", "head", "slot",
                      "mirror_dense_layers", "mirror_moe_layers")  # fmt: skip
PACE_STRUCT_KEYS = ("paced_dense_layers", "paced_moe_layers", "emb", "head", "param_tensors")
OPTIMIZER_STRUCT_KEYS = ("optimizer_bytes", "optimizer_expert_bytes", "newton_schulz_flops",
                         "newton_schulz_bytes", "muon_params", "param_tensors")  # fmt: skip
#: Outputs of the memory model; every other output is timed.
MEMORY_OUTPUTS = ("memory_per_gpu_bytes", "peak_rank")


#: Structure entries that are zero in every row of a dense model: left out when they are
#: (their terms add exactly 0), read through :func:`_held`.
MOE_KEYS = ("moe_layers", "expert_params", "paced_moe_layers", "mirror_moe_layers")


def _gather(table: dict[str, np.ndarray], inverse: np.ndarray, keys) -> dict[str, np.ndarray]:
    """Rows of a per-distinct-value table (broadcast by each row's index into it)."""
    return {key: table[key][inverse] for key in keys if key not in MOE_KEYS or table[key].any()}


def _held(R: dict, key: str, factor) -> np.ndarray | float:
    """``R[key] · factor``: 0 where no row holds MoE layers or routed experts."""
    return R[key] * factor if key in R else 0.0


def evaluate_columns(
    job: Job,
    cluster: Cluster,
    accelerator: Accelerator,
    columns: dict,
    order=None,
    mfu_dtype: str = "bf16",
    memory_limit_bytes: float | None = None,
) -> dict[str, np.ndarray]:
    """Evaluate rows of layouts. ``columns``: tp, cp, pp, dp, ep, vpp, micro_batch_size,
    num_microbatches, zero_stage (ints), optionally etp (ints; None or absent: tp),
    sequence_parallel (bool), recompute, schedule,
    pipeline_layer_split (strings, or :class:`planner.codes.Labels`). Returns one array
    per quantity.

    Memory comes first, on every row. With ``memory_limit_bytes`` only the rows that fit in
    it and can be placed are timed (the search's screen); the others keep their memory and
    ``valid`` and carry NaN times. Each row's numbers do not depend on the other rows.
    """
    if memory_limit_bytes is not None:  # the screen, its timed rows spread over all rows
        memory, valid, rows, timed = screen_columns(
            job, cluster, accelerator, columns, memory_limit_bytes, order, mfu_dtype
        )
        full = {}
        for key, value in timed.items():
            full[key] = valid.copy() if key == "valid" else np.full(len(valid), np.nan)
            full[key][rows] = value
        return in_output_order(full, memory)
    c = _prepared(columns)
    rates, bf16_rates, tuned = _rates(job, accelerator)
    shapes, structs = _tables(job, c, rates, bf16_rates, tuned)
    memory = _memory_columns(job, c, shapes, structs, tuned)
    timed = _time_columns(
        job, cluster, accelerator, c, shapes, structs, order, mfu_dtype, rates, tuned
    )
    return in_output_order(timed, memory)


def screen_columns(
    job: Job,
    cluster: Cluster,
    accelerator: Accelerator,
    columns: dict,
    memory_limit_bytes: float,
    order=None,
    mfu_dtype: str = "bf16",
) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """The search's screen, as :func:`evaluate_columns` with ``memory_limit_bytes`` but
    without spreading the timed rows back over all rows: (memory outputs of every row,
    which rows can be placed, the rows timed — placeable and fitting —, the timed outputs
    of those rows only, one per row of them)."""
    c = _prepared(columns)
    rates, bf16_rates, tuned = _rates(job, accelerator)
    shapes, structs = _tables(job, c, rates, bf16_rates, tuned)
    memory = _memory_columns(job, c, shapes, structs, tuned)
    valid, rows, timed = _timed_if_fit(
        job, cluster, accelerator, c, shapes, structs, memory, memory_limit_bytes, order,
        mfu_dtype, rates, tuned,
    )  # fmt: skip
    return memory, valid, rows, timed


def _timed_if_fit(
    job, cluster, accelerator, c, shapes, structs, memory, limit, order, mfu_dtype, rates, tuned
):
    """(placeable rows, the placeable rows within ``limit`` bytes, their timed outputs)."""
    # Placeable or not depends on the structure (tp, ep, etp, pp, vpp, schedule, split), cp, dp.
    some, inverse = distinct_rows(c["structure"], c["cp"], c["dp"])
    valid = placeable(cluster, job.model.num_layers,
                      *(c[k][some] for k in ("tp", "cp", "pp", "dp", "ep")),
                      chunks_column(c["schedule"][some], c["vpp"][some]),
                      one_value_or_column(c["split"][some]), c["etp"][some])[inverse]  # fmt: skip
    rows = np.flatnonzero(valid & (memory["memory_per_gpu_bytes"] <= limit))
    sub = {key: value[rows] for key, value in c.items()}
    timed = _time_columns(
        job, cluster, accelerator, sub, shapes, structs, order, mfu_dtype, rates, tuned
    )
    return valid, rows, timed


def _prepared(columns: dict) -> dict:
    """The layout columns under the names the models read (ints as int64; SP only with TP)."""
    col = {k: np.asarray(columns[k]) for k in (*INT_COLUMNS, "sequence_parallel")}
    c = {k: col[k].astype(np.int64) for k in ("tp", "cp", "pp", "dp", "ep", "vpp")}
    c["etp"] = resolved_etp(columns.get("etp"), c["tp"])  # the routed experts' TP degree
    c["mbs"], c["m"], c["zero"] = (
        col[k].astype(np.int64) for k in ("micro_batch_size", "num_microbatches", "zero_stage")
    )
    c["sp"] = col["sequence_parallel"].astype(bool) & (c["tp"] > 1)
    c["dp_cp"] = c["dp"] * c["cp"]  # the ZeRO group
    c["edp"] = expert_data_parallel_size(c["dp"], c["cp"], c["tp"], c["ep"], c["etp"])
    # String columns as codes, hashed once (the search hands them over coded).
    c["schedule"], c["recompute"], c["split"] = (
        Labels.of(columns[k]) for k in ("schedule", "recompute", "pipeline_layer_split")
    )
    return c


def _rates(job: Job, accelerator: Accelerator) -> tuple:
    """(GPU rates of the GEMM dtype, BF16 rates under FP8 or None, the adapter recipe or None)."""
    rates = GpuRates.of(accelerator, job.precision.gemm_dtype)
    bf16_rates = GpuRates.of(accelerator, "bf16") if job.precision.gemm_dtype == "fp8" else None
    tuned = job.finetune if job.finetune is not None and job.finetune.trains_adapters else None
    return rates, bf16_rates, tuned


def _tables(job: Job, c: dict, rates, bf16_rates, tuned) -> tuple[dict, dict]:
    """The per-shape and per-structure tables. Adds to ``c`` each row's index into them
    (``shape``, ``structure``) and into the distinct (structure, shape, m) combinations —
    what activations and the pipeline's compute depend on — and (structure, ZeRO stage,
    dp·cp) ones — what model states and the optimizer step depend on (``held``,
    ``states``), all as :class:`planner.codes.Labels` of indices."""
    shapes, shape_inv = shape_table(
        job, rates, tuned, *(c[k] for k in ("tp", "cp", "ep", "etp", "sp", "mbs", "recompute")),
        bf16_rates,
    )  # fmt: skip
    structs, struct_inv = structure_table(
        job, *(c[k] for k in ("tp", "ep", "etp", "pp", "vpp", "schedule", "split"))
    )
    c["shape"] = coded(shape_inv, len(shapes["fd"]))
    c["structure"] = coded(struct_inv, len(structs["slot"]))
    # The wrapper's operations cost time only where the accelerator records host costs.
    c["form"] = data_parallel_form(c["zero"], c["dp_cp"])
    held = ("shape", "m", "form") if rates.op_overhead_s else ("shape", "m")
    for name, columns in (("held", held), ("states", ("zero", "dp_cp"))):
        chosen, inverse = distinct_rows(c["structure"], *(c[k] for k in columns))
        c[name] = coded(inverse, len(chosen))
    return shapes, structs


def in_output_order(timed: dict, memory: dict) -> dict[str, np.ndarray]:
    """Timed and memory outputs in one order: throughput, memory per GPU and peak rank,
    exposed communication and validity, the memory parts, then per-axis communication."""
    keys = list(timed)
    after_hfu, first_axis = keys.index("hfu") + 1, keys.index(f"{AXES[0]}_exposed_time_s")
    out = {key: timed[key] for key in keys[:after_hfu]}
    out.update({key: memory[key] for key in MEMORY_OUTPUTS})
    out.update({key: timed[key] for key in keys[after_hfu:first_axis]})
    out.update({key: value for key, value in memory.items() if key not in MEMORY_OUTPUTS})
    out.update({key: timed[key] for key in keys[first_axis:]})
    return out


def _memory_columns(job: Job, c: dict, shapes: dict, structs: dict, tuned) -> dict[str, np.ndarray]:
    """Memory per examined rank from the rows' shapes and structures; the peak is memory
    per GPU. Model states (ZeRO-sharded), activations of the micro-batches in flight,
    logits, communication buffers and the runtime's fixed overhead.

    Activations and logits depend on a row's structure, shape and micro-batch count only,
    model states on its structure, ZeRO stage and group: each is worked out on one row per
    distinct combination and broadcast; per row only the sum and its peak are taken."""
    n = len(c["tp"])
    shape_inv, struct_inv = c["shape"].codes, c["structure"].codes
    held_rows, held_inv = distinct_rows(c["held"])
    held = _activation_columns(
        job,
        {k: c[k][held_rows] for k in ("pp", "m", "vpp", "schedule")},
        _gather(shapes, shape_inv[held_rows], MEMORY_SHAPE_KEYS),
        _gather(structs, struct_inv[held_rows], MEMORY_STRUCT_KEYS),
    )
    zero_group = c["dp_cp"]
    state_rows, state_inv = distinct_rows(c["states"])
    state_keys = tuple(key for key in structs if key.endswith(("_fixed", "_dense", "_expert")))
    states = _state_columns(
        job,
        c["zero"][state_rows],
        zero_group[state_rows],
        c["edp"][state_rows],
        _gather(structs, struct_inv[state_rows], ("dense_params", "expert_params", *state_keys)),
        tuned,
    )
    buffer_keys = ("tp", "cp", "pp", "ep", "etp", "zero", "sp", "mbs")  # once per distinct tuple
    buffer_rows, buffer_inv = distinct_rows(*(c[k] for k in buffer_keys))
    comm_buffer = _comm_buffer_columns(
        job.model, job, *(c[k][buffer_rows] for k in buffer_keys), tuned
    )[buffer_inv]
    runtime = float(job.runtime_overhead_bytes)
    # The parts' sum in the order they are reported (so every row adds as it always did),
    # in place.
    total = np.take(sum(states.values()), state_inv, axis=0)
    part = np.take(held["activations"], held_inv, axis=0)
    total += part
    np.take(held["logits_buffers"], held_inv, axis=0, out=part)
    total += part
    total += comm_buffer[:, None]
    total += runtime
    peak_slot = np.argmax(total, axis=1)
    out = {
        "memory_per_gpu_bytes": total[np.arange(n), peak_slot],
        "peak_rank": structs["slot"][struct_inv, peak_slot].astype(np.int64),
    }
    for name, value in states.items():
        out[f"memory_{name}_bytes"] = value[state_inv, peak_slot]
    for name, value in held.items():
        out[f"memory_{name}_bytes"] = value[held_inv, peak_slot]
    out["memory_comm_buffers_bytes"] = comm_buffer
    out["checkpoint_bytes_per_rank"] = _checkpoint_columns(
        job, c, zero_group, state_rows, structs, struct_inv, state_keys, tuned
    )[state_inv]
    out["memory_runtime_overhead_bytes"] = np.full(n, runtime)
    return out


def _checkpoint_columns(job, c, zero_group, state_rows, structs, struct_inv, state_keys, tuned):
    """Bytes the busiest-writing rank saves per checkpoint, per distinct state row: its
    weights, master weights and optimizer states with every replica split over its data-
    parallel group (as ZeRO-3 shards them: a distributed checkpoint writes each replicated
    tensor once, spread over the replicas; gradients are not saved). DualPipe's two
    parameter copies (each stage on two ranks) are replicas too."""
    zero = c["zero"][state_rows]
    R = _gather(structs, struct_inv[state_rows], ("dense_params", "expert_params", *state_keys))
    parts = _state_columns(
        job, np.full_like(zero, 3), zero_group[state_rows], c["edp"][state_rows], R, tuned
    )
    saved = parts["weights"] + parts["master_weights"] + parts["optimizer_states"]
    copies = np.ones(len(state_rows))
    for schedule, rows in rows_by_value(c["schedule"][state_rows]):
        copies[rows] = closed_form.parameter_copies(schedule)
    return saved.max(axis=1) / copies


def _state_columns(
    job: Job, zero, zero_group, expert_group, R: dict, tuned
) -> dict[str, np.ndarray]:
    """Model states per examined rank (weights, gradients, master weights, optimizer
    states), ZeRO-sharded over the dp·cp group (routed experts over ``expert_group``, the
    expert-data-parallel group: :func:`planner.layout.expert_data_parallel_size`)."""
    model, precision = job.model, job.precision
    states_per_param = optimizer_states_per_param(precision.optimizer, model)
    whole = unsharded_bytes_per_param(precision, states_per_param)

    def shard(part_bytes: float, first_stage: int, group: np.ndarray) -> np.ndarray:
        return part_bytes / np.where(zero >= first_stage, group, 1)

    parts = {}
    for name, first_stage in FIRST_SHARDED_STAGE.items():
        if tuned:  # the recipe's states: unsharded + dense / divisor + expert / divisor
            parts[name] = (
                R[f"{name}_fixed"]
                + R[f"{name}_dense"] * shard(1.0, first_stage, zero_group)[:, None]
                + R[f"{name}_expert"] * shard(1.0, first_stage, expert_group)[:, None]
            )
            continue
        per_param = getattr(whole, name)
        parts[name] = R["dense_params"] * shard(per_param, first_stage, zero_group)[
            :, None
        ] + _held(R, "expert_params", shard(per_param, first_stage, expert_group)[:, None])
    return parts


def _activation_columns(job: Job, c: dict, S: dict, R: dict) -> dict[str, np.ndarray]:
    """Activations of the micro-batches in flight and the logits buffers per examined rank
    (``c``: pp, m, vpp and schedule of the rows)."""
    n = len(c["pp"])
    layer_bytes = R["dense_layers"] * S["act_dense"][:, None] + _held(
        R, "moe_layers", S["act_moe"][:, None]
    )
    weight_bytes = R["dense_layers"] * S["wpass_dense"][:, None] + _held(
        R, "moe_layers", S["wpass_moe"][:, None]
    )
    weight_ratio = np.divide(
        weight_bytes, layer_bytes, out=np.zeros_like(layer_bytes), where=layer_bytes > 0
    )
    inflight = np.zeros((n, NUM_SLOTS))  # micro-batches between F and B (the ends' tensors)
    units = np.zeros((n, NUM_SLOTS))  # … and those waiting for W, at M_W / M_B
    for sch, rows in rows_by_value(c["schedule"]):
        per_row = [c[k][rows, None] for k in ("pp", "m", "vpp")]  # against the slots' ranks
        slots = R["slot"][rows].astype(np.int64)
        inflight[rows] = closed_form.activation_microbatches_at(sch, *per_row, slots)
        units[rows] = closed_form.peak_activation_units(sch, *per_row, slots, weight_ratio[rows])
    act_layers = R["dense_layers"] + _held(R, "moe_layers", 1.0)
    activations = layer_bytes * units
    working = S["working"][:, None] + act.backward_working_beside_logits(
        S["backward"][:, None], S["logits"][:, None], R["head"]
    )
    activations = activations + working * (act_layers > 0)
    activations = activations + inflight * (
        R["emb"] * S["first_extra"][:, None] + R["head"] * S["last_extra"][:, None]
    )
    dualpipe = np.flatnonzero(c["schedule"].isin(("dualpipe",)))
    if len(dualpipe):  # rank r: pp − r own chunks, r + 1 mirrored
        d = dualpipe
        slot, p = R["slot"][d], c["pp"][d, None]
        Sd = {key: S[key][d, None] for key in ("act_dense", "act_moe", "first_extra",
                                               "last_extra", "working")}  # fmt: skip

        def stage_bytes(dense, moe, has_embedding, has_head):
            return (
                dense * Sd["act_dense"] + moe * Sd["act_moe"]
                + has_embedding * Sd["first_extra"] + has_head * Sd["last_extra"]
            )  # fmt: skip

        def on_dualpipe(key):
            return R[key][d] if key in R else 0.0

        own = stage_bytes(R["dense_layers"][d], on_dualpipe("moe_layers"), slot == 0, slot == p - 1)
        mirror = stage_bytes(R["mirror_dense_layers"][d], on_dualpipe("mirror_moe_layers"),
                             slot == p - 1, slot == 0)  # fmt: skip
        activations[d] = (
            own * (p - slot) + mirror * (slot + 1) + Sd["working"] * (act_layers[d] > 0)
        )
    return {"activations": activations, "logits_buffers": R["head"] * S["logits"][:, None]}


#: A row's data-parallel wrapper in torch's implementation (:func:`data_parallel_form`).
NO_WRAPPER, DDP, FSDP = 0, 1, 2


def data_parallel_form(zero: np.ndarray, dp_cp: np.ndarray) -> np.ndarray:
    """FSDP2 under ZeRO-2/3, DDP under ZeRO-0/1 over more than one rank, else none."""
    return np.where(zero >= 2, FSDP, np.where(dp_cp > 1, DDP, NO_WRAPPER))


def _with_wrapper_ops(form, R: dict, accelerator, op_overhead_s: float, F, B):
    """F and B plus the data-parallel wrapper's own work per micro-batch: its operations
    (:mod:`planner.op_counts`: DDP's gradient hook per parameter tensor in backward,
    FSDP2's pre/post hooks per wrapped layer and for the root module) and its host time
    beyond them (:attr:`hwspecs.schema.Accelerator.data_parallel_overhead_s`: per wrapped
    unit for FSDP, per call for DDP)."""
    form = np.asarray(form)[:, None]
    ddp, fsdp = form == DDP, form == FSDP
    host = accelerator.data_parallel_overhead_s
    layers = R["paced_dense_layers"] + _held(R, "paced_moe_layers", 1.0)
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


def _time_columns(
    job: Job, cluster, accelerator, c: dict, shapes: dict, structs: dict, order, mfu_dtype,
    rates, tuned,
) -> dict[str, np.ndarray]:  # fmt: skip
    """Step time per row: the busiest examined rank's F, B (+ recompute) and W per
    micro-batch through the schedule's closed form, exposed communication per axis, the
    optimizer step; throughput and MFU from it.

    The pipeline's part depends on a row's structure, shape and micro-batch count only, the
    optimizer's on its structure, ZeRO stage and group (and the DP rate Muon gathers at):
    each is worked out on one row per distinct combination and broadcast."""
    model = job.model
    tp, cp, pp, dp, ep, vpp = (c[k] for k in ("tp", "cp", "pp", "dp", "ep", "vpp"))
    mbs, m, zero, schedule, recompute = (c[k] for k in ("mbs", "m", "zero", "schedule",
                                                        "recompute"))  # fmt: skip
    shape_inv, struct_inv = c["shape"].codes, c["structure"].codes
    paced_rows, paced_inv = distinct_rows(c["held"])
    paced = _pipeline_columns(
        {k: c[k][paced_rows] for k in ("pp", "m", "vpp", "schedule", "form")},
        _gather(shapes, shape_inv[paced_rows], TIME_SHAPE_KEYS),
        _gather(structs, struct_inv[paced_rows], PACE_STRUCT_KEYS),
        accelerator,
        rates,
    )
    f, b, w, rc, pipeline, busy = (column[paced_inv] for column in paced)

    # Communication: exposed time per axis under the overlap rules.
    comm = axis_times_vectorized(
        job,
        cluster,
        tp=tp,
        cp=cp,
        pp=pp,
        dp=dp,
        ep=ep,
        etp=c["etp"],
        vpp=vpp,
        micro_batch_size=mbs,
        num_microbatches=m,
        zero_stage=zero,
        sequence_parallel=c["sp"],
        recompute=recompute,
        schedule=schedule,
        pipeline_layer_split=one_value_or_column(c["split"]),
        order=order or ("tp", "cp", "ep", "pp", "dp"),
        forward_s=f,
        backward_s=b + rc + w,
    )

    # Optimizer: the trainable parameters' update (and Muon's orthogonalization and gather).
    zero_group = c["dp_cp"]
    with np.errstate(divide="ignore", invalid="ignore"):  # the DP group's achieved bus rate
        dp_rate = np.where(
            comm["dp_time_s"] > 0, comm["dp_bytes_per_step"] / comm["dp_time_s"], np.inf
        )
    dp_rate = np.nan_to_num(dp_rate, nan=np.inf)
    # The DP rate matters only where Muon gathers (no structure has Muon matrices: none).
    muon = structs["muon_params"].any()
    step_rows, step_inv = distinct_rows(c["states"], *((dp_rate,) if muon else ()))
    R = _gather(structs, struct_inv[step_rows], OPTIMIZER_STRUCT_KEYS)
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
            dispatch_s=dispatch_s, expert_group=c["edp"][step_rows],
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
        [recompute_flops_per_token(model, job.seq_len, r) for r in RECOMPUTE_CODES]
    )
    extra = recompute_flops[_codes(recompute)]
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
    return out


def _pipeline_columns(c: dict, S: dict, R: dict, accelerator, rates) -> tuple[np.ndarray, ...]:
    """Per row (``c``: pp, m, vpp, schedule, data-parallel form): the busiest examined rank's
    forward, input gradient, weight gradient and recompute seconds per micro-batch, the
    pipeline's step time by the schedule's closed form, and the busiest rank's compute time
    in it. Where the accelerator records host costs, the data-parallel wrapper's and the
    pipeline runtime's own operations are part of them (:func:`_with_wrapper_ops`,
    :func:`_with_pipeline_actions`)."""
    n = len(c["pp"])
    pp, m, vpp, schedule = (c[k] for k in ("pp", "m", "vpp", "schedule"))

    # Compute per examined rank; the busiest one sets the pipeline's pace. A DualPipe rank
    # runs half its micro-batches through each of its two stages: per micro-batch it does
    # the mean of their layers, and half of the embedding and of the head (+ MTP).
    pace = np.where(schedule.isin(("dualpipe",))[:, None], 0.5, 1.0)

    def on_slots(dense_key, moe_key, emb_key=None, head_key=None):
        total = R["paced_dense_layers"] * S[dense_key][:, None] + _held(
            R, "paced_moe_layers", S[moe_key][:, None]
        )
        if emb_key:
            ends = R["emb"] * S[emb_key][:, None] + R["head"] * S[head_key][:, None]
            total = total + pace * ends
        return total

    F = on_slots("fd", "fm", "f_emb", "f_head")
    B = on_slots("bd", "bm", "b_emb", "b_head")
    W = on_slots("wd", "wm", "w_emb", "w_head")
    if rates.op_overhead_s:
        F, B = _with_wrapper_ops(c["form"], R, accelerator, rates.op_overhead_s, F, B)
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


# ----- links shared by axes (planner.contention) -----------------------------------------


def _link_contention(comm: dict, step_s: np.ndarray) -> np.ndarray:
    """Seconds lost where axes share a link: the larger of the sharing delay and the excess
    of the busiest link's occupancy over the step (:mod:`planner.contention`)."""
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


def _codes(recompute: Labels) -> np.ndarray:
    """Index of each row's recompute policy in :data:`RECOMPUTE_CODES`."""
    lookup = np.array([RECOMPUTE_CODES.index(name) for name in recompute.values], dtype=np.int64)
    return lookup[recompute.codes]


def _model_flops_per_token(job: Job, tuned, causal: bool) -> float:
    """Model FLOPs per token for MFU: full training's, or the recipe's (frozen base: no W)."""
    if tuned is None:
        return model_flops_per_token(job.model, job.seq_len, causal=causal)
    ops = ft.finetune_ops_per_sequence(job.model, tuned, job.seq_len, causal)
    return sum_ops(ops).total / job.seq_len


def _comm_buffer_columns(model, job, tp, cp, pp, ep, etp, zero, sp, mbs, tuned=None) -> np.ndarray:
    """:func:`planner.memory._comm_buffer_bytes` as column arithmetic (same terms)."""
    from planner.memory import layer_params_per_rank

    e, h = job.precision.activation_bytes, model.hidden_size
    tokens = job.seq_len * mbs / cp
    replicated = np.where(sp, 1.0 / tp, 1.0)
    total = np.where(pp > 1, 2 * tokens * h * e * replicated, 0.0)
    total = total + np.where(sp, tokens * h * e, 0.0)
    keys, inverse = unique_rows(tp, ep, etp)
    if tuned is None:
        layer = np.array(
            [sum(layer_params_per_rank(model, t, x, model.is_moe, et)) for t, x, et in keys]
        )
        weights = layer * DTYPE_BYTES[job.precision.weight_dtype]
        grads = layer * DTYPE_BYTES[job.precision.gradient_dtype]
    else:  # weights as stored (NF4 for QLoRA), gradients the adapters'
        weights, grads = np.array(
            [
                ft.layer_weight_and_grad_bytes(
                    model, tuned, job.precision, model.is_moe, t, x, None if et == t else et
                )
                for t, x, et in keys
            ]
        ).T
    total = total + np.where(zero >= 3, 2 * weights[inverse], 0.0)
    return total + np.where(zero >= 2, grads[inverse], 0.0)

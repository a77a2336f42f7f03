"""Memory per examined rank for rows of layouts (numpy columns): model states (ZeRO-sharded),
activations of the micro-batches in flight, logits, communication buffers and the
runtime's fixed overhead; the peak over the examined ranks is memory per GPU. Each part is
worked out once per distinct combination of the fields it depends on and broadcast
(:mod:`planner.columns.tables`); :func:`planner.cost.memory.memory_report` is the
every-rank view of one layout that ``tests/consistency`` holds equal to it."""

from __future__ import annotations

import numpy as np

from planner.columns.codes import distinct_rows, unique_rows
from planner.columns.tables import MEMORY_SHAPE_KEYS, rows_by_value
from planner.cost import activations as act
from planner.cost import adapters as ft
from planner.cost.model_states import FIRST_SHARDED_STAGE
from planner.evaluate.rows import gather, held
from planner.pipeline import closed_form
from planner.pipeline.schedules.registry import BIDIRECTIONAL_SCHEDULES
from planner.spec.job import Job
from planner.spec.precision import (
    DTYPE_BYTES,
    optimizer_states_per_param,
    unsharded_bytes_per_param,
)

#: Structure-table entries the activation memory reads (model states read the parameters
#: and the recipe's state terms, if any).
MEMORY_STRUCT_KEYS = ("dense_layers", "moe_layers", "emb", "head", "slot",
                      "mirror_dense_layers", "mirror_moe_layers")  # fmt: skip
#: Outputs of the memory model; every other output is timed.
MEMORY_OUTPUTS = ("memory_per_gpu_bytes", "peak_rank")


def memory_columns(job: Job, c: dict, shapes: dict, structs: dict, tuned) -> dict[str, np.ndarray]:
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
        gather(shapes, shape_inv[held_rows], MEMORY_SHAPE_KEYS),
        gather(structs, struct_inv[held_rows], MEMORY_STRUCT_KEYS),
    )
    zero_group = c["dp_cp"]
    state_rows, state_inv = distinct_rows(c["states"])
    state_keys = tuple(key for key in structs if key.endswith(("_fixed", "_dense", "_expert")))
    states = _state_columns(
        job,
        c["zero"][state_rows],
        zero_group[state_rows],
        c["edp"][state_rows],
        gather(structs, struct_inv[state_rows], ("dense_params", "expert_params", *state_keys)),
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
    out["memory_runtime_overhead_bytes"] = np.full(n, runtime)
    return out


def _state_columns(
    job: Job, zero, zero_group, expert_group, R: dict, tuned
) -> dict[str, np.ndarray]:
    """Model states per examined rank (weights, gradients, master weights, optimizer
    states), ZeRO-sharded over the dp·cp group (routed experts over ``expert_group``, the
    expert-data-parallel group: :func:`planner.spec.layout.expert_data_parallel_size`)."""
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
        parts[name] = R["dense_params"] * shard(per_param, first_stage, zero_group)[:, None] + held(
            R, "expert_params", shard(per_param, first_stage, expert_group)[:, None]
        )
    return parts


def _activation_columns(job: Job, c: dict, S: dict, R: dict) -> dict[str, np.ndarray]:
    """Activations of the micro-batches in flight and the logits buffers per examined rank
    (``c``: pp, m, vpp and schedule of the rows)."""
    n = len(c["pp"])
    layer_bytes = R["dense_layers"] * S["act_dense"][:, None] + held(
        R, "moe_layers", S["act_moe"][:, None]
    )
    weight_bytes = R["dense_layers"] * S["wpass_dense"][:, None] + held(
        R, "moe_layers", S["wpass_moe"][:, None]
    )
    weight_ratio = np.divide(
        weight_bytes, layer_bytes, out=np.zeros_like(layer_bytes), where=layer_bytes > 0
    )
    num_slots = R["slot"].shape[1]
    inflight = np.zeros((n, num_slots))  # micro-batches between F and B (the ends' tensors)
    units = np.zeros((n, num_slots))  # … and those waiting for W, at M_W / M_B
    for sch, rows in rows_by_value(c["schedule"]):
        per_row = [c[k][rows, None] for k in ("pp", "m", "vpp")]  # against the slots' ranks
        slots = R["slot"][rows].astype(np.int64)
        inflight[rows] = closed_form.activation_microbatches_at(sch, *per_row, slots)
        units[rows] = closed_form.peak_activation_units(sch, *per_row, slots, weight_ratio[rows])
    act_layers = R["dense_layers"] + held(R, "moe_layers", 1.0)
    activations = layer_bytes * units
    working = S["working"][:, None] + act.backward_working_beside_logits(
        S["backward"][:, None], S["logits"][:, None], R["head"]
    )
    activations = activations + working * (act_layers > 0)
    activations = activations + inflight * (
        R["emb"] * S["first_extra"][:, None] + R["head"] * S["last_extra"][:, None]
    )
    dualpipe = np.flatnonzero(c["schedule"].isin(BIDIRECTIONAL_SCHEDULES))
    if len(dualpipe):  # rank r: pp − r own chunks, r + 1 mirrored
        d = dualpipe
        slot, p = R["slot"][d], c["pp"][d, None]
        Sd = {key: S[key][d, None] for key in ("act_dense", "act_moe", "first_extra",
                                               "last_extra")}  # fmt: skip

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
        activations[d] = own * (p - slot) + mirror * (slot + 1) + working[d] * (act_layers[d] > 0)
    return {"activations": activations, "logits_buffers": R["head"] * S["logits"][:, None]}


def _comm_buffer_columns(model, job, tp, cp, pp, ep, etp, zero, sp, mbs, tuned=None) -> np.ndarray:
    """:func:`planner.cost.memory._comm_buffer_bytes` as column arithmetic (same terms)."""
    from planner.structure.params import layer_params_per_rank

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

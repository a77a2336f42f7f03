"""Memory per examined rank for rows of layouts (numpy columns): model states (ZeRO-sharded),
activations of the micro-batches in flight, logits, communication buffers and the
runtime's fixed overhead; the peak over the examined ranks is memory per GPU. Each part is
worked out once per distinct combination of the fields it depends on and broadcast
(:mod:`planner.columns.tables`); :func:`planner.memory_report.memory_report` is the
every-rank view of one layout that ``tests/consistency`` holds equal to it."""

from __future__ import annotations

import numpy as np

from planner.columns.codes import distinct_rows
from planner.columns.layout import LayoutColumns
from planner.columns.tables import MEMORY_SHAPE_KEYS, rows_by_value
from planner.cost.context_parallel import cp_buffer_bytes
from planner.cost.memory import (
    activation_columns,
    checkpoint_bytes_columns,
    comm_buffer_columns,
    model_state_columns,
    runtime_overhead_bytes,
)
from planner.evaluate.rows import gather
from planner.pipeline import closed_form
from planner.spec.job import Job

#: Structure-table entries the activation memory reads (model states read the parameters
#: and the recipe's state terms, if any).
MEMORY_STRUCT_KEYS = ("dense_layers", "moe_layers", "emb", "head", "slot",
                      "mirror_dense_layers", "mirror_moe_layers")  # fmt: skip
#: The fields :func:`planner.cost.memory.comm_buffer_columns` reads, in its argument order.
COMM_BUFFER_FIELDS = ("tp", "cp", "pp", "ep", "etp", "zero_stage", "sequence_parallel",
                      "micro_batch_size")  # fmt: skip
#: The layout fields a row's communication buffers read (:func:`comm_buffer_bytes`): those
#: and the CP algorithm's (its K/V buffers).
BUFFER_FIELDS = (*COMM_BUFFER_FIELDS, "cp_algorithm")
#: Outputs of the memory model; every other output is timed.
MEMORY_OUTPUTS = ("memory_per_gpu_bytes", "peak_rank")


def memory_columns(
    job: Job,
    c: LayoutColumns,
    shapes: dict,
    structs: dict,
    tuned,
    per_rank: bool = False,
    outputs: frozenset[str] | None = None,
    accelerator=None,
) -> dict[str, np.ndarray]:
    """Memory per examined rank from the rows' shapes and structures; the peak is memory
    per GPU. Model states (ZeRO-sharded), activations of the micro-batches in flight,
    logits, communication buffers and the runtime's fixed overhead. ``per_rank``: also
    every examined rank's parts (``rank_<part>_bytes``, ``rank_slot``, ``rank_units``: [row,
    slot] arrays), the view :func:`planner.memory_report.memory_report` prints.

    Activations and logits depend on a row's structure, shape and micro-batch count only,
    model states on its structure, ZeRO stage and group: each is worked out on one row per
    distinct combination and broadcast; per row only the sum and its peak are taken.
    ``outputs``: the outputs wanted (None: every one); ``memory_per_gpu_bytes`` is always
    there, and the others are left out, not computed (each is one gather per row).
    ``accelerator``: whose runtime overhead is added (:func:`runtime_overhead_bytes`)."""

    def wanted(key: str) -> bool:
        return outputs is None or key in outputs

    n = len(c)
    shape_inv, struct_inv = c.shape.codes, c.structure.codes
    held_rows, held_inv = distinct_rows(c.held)
    sub = c.take(held_rows)
    held = activation_columns(
        job,
        sub,
        gather(shapes, shape_inv[held_rows], MEMORY_SHAPE_KEYS),
        gather(structs, struct_inv[held_rows], MEMORY_STRUCT_KEYS),
        rows_by_value(sub.schedule),
    )
    units = held.pop("units")  # micro-batches' worth of activations in flight per rank
    zero_group = c.zero_group_size
    state_rows, state_inv = distinct_rows(c.states)
    state_keys = tuple(key for key in structs if key.endswith(("_fixed", "_dense", "_expert")))
    states = model_state_columns(
        job,
        c.zero_stage[state_rows],
        zero_group[state_rows],
        c.expert_data_parallel_size[state_rows],
        gather(structs, struct_inv[state_rows], ("dense_params", "expert_params", *state_keys)),
        tuned,
    )
    # Once per distinct tuple of the fields the buffers read (the rows' index into them).
    buffer_rows, buffer_inv = distinct_rows(
        *((c.buffers,) if c.buffers is not None else c.columns(*BUFFER_FIELDS))
    )
    comm_buffer = comm_buffer_bytes(job, c.take(buffer_rows), tuned)[buffer_inv]
    runtime = runtime_overhead_bytes(job, accelerator)
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
    out = {"memory_per_gpu_bytes": total[np.arange(n), peak_slot]}
    if wanted("peak_rank"):
        out["peak_rank"] = structs["slot"][struct_inv, peak_slot].astype(np.int64)
    for parts, inverse in ((states, state_inv), (held, held_inv)):
        for name, value in parts.items():
            if wanted(f"memory_{name}_bytes"):
                out[f"memory_{name}_bytes"] = value[inverse, peak_slot]
    if wanted("memory_comm_buffers_bytes"):
        out["memory_comm_buffers_bytes"] = comm_buffer
    if wanted("checkpoint_bytes_per_rank"):
        copies = np.ones(len(state_rows))  # DualPipe's two parameter copies are replicas
        for schedule, rows in rows_by_value(c.schedule[state_rows]):
            copies[rows] = closed_form.parameter_copies(schedule)
        state_R = gather(
            structs, struct_inv[state_rows], ("dense_params", "expert_params", *state_keys)
        )
        out["checkpoint_bytes_per_rank"] = checkpoint_bytes_columns(
            job, zero_group[state_rows], c.expert_data_parallel_size[state_rows], state_R, tuned,
            copies,
        )[state_inv]  # fmt: skip
    if wanted("memory_runtime_overhead_bytes"):
        out["memory_runtime_overhead_bytes"] = np.full(n, runtime)
    if per_rank:
        for name, value in states.items():
            out[f"rank_{name}_bytes"] = value[state_inv]
        for name, value in held.items():
            out[f"rank_{name}_bytes"] = value[held_inv]
        out["rank_units"] = units[held_inv]
        out["rank_slot"] = structs["slot"][struct_inv].astype(np.int64)
        out["rank_total_bytes"] = total
    return out


def comm_buffer_bytes(job: Job, c: LayoutColumns, tuned) -> np.ndarray:
    """Each row's communication buffers at their peak (:func:`planner.cost.memory.
    comm_buffer_columns`) and its CP algorithm's K/V buffers
    (:func:`planner.cost.context_parallel.cp_buffer_bytes`); reads :data:`BUFFER_FIELDS`."""
    buffer_columns = c.columns(*COMM_BUFFER_FIELDS)
    kv_buffers = cp_buffer_bytes(
        job.model, job.seq_len, c.micro_batch_size, c.tp, c.cp, c.cp_algorithm,
        job.precision.activation_bytes, job.ulysses_kv_heads == "replicate",
    )  # fmt: skip
    return comm_buffer_columns(job.model, job, *buffer_columns, tuned) + kv_buffers

"""Step time, throughput and memory for many layouts at once (numpy columns, one row each).

This is the one model the search screens with and the single-layout estimate reports.
Pieces that depend only on a few layout fields are computed once per distinct value of
those fields and broadcast to the rows (:mod:`planner.columns.codes`): per-layer times and
activation bytes per (tp, cp, ep, etp, SP, micro-batch, recompute) shape and what each pipeline
rank holds per structure (:mod:`planner.columns.tables`; each row's indices into them,
:mod:`planner.evaluate.indices`); activations and the pipeline's
compute per (structure, shape, m); model states and the optimizer step per (structure,
ZeRO stage, dp·cp); communication buffers per (tp, cp, pp, ep, etp, ZeRO stage, SP,
micro-batch); whether a row can be placed per (structure, cp, dp); collectives per
(degrees, chunks, micro-batches, SP, recompute, ZeRO stage, split)
(:mod:`planner.comm.traffic`). Per row only sums, peaks and the exposure of the
collectives that hide behind compute are taken. String columns travel as codes
(:class:`planner.columns.codes.Labels`). No Python loop runs per row.

Per row: the busiest pipeline rank's F, B (+ recomputation) and W per micro-batch feed the
schedule's closed-form step time (:mod:`planner.pipeline.closed_form`); the exposed
communication per axis (:mod:`planner.comm.traffic`), the optimizer step and the time
lost where axes share a link (:mod:`planner.comm.contention`) are added after it
(:mod:`planner.evaluate.time`); memory per examined rank and its peak come first
(:mod:`planner.evaluate.memory`). The examined ranks are the first and the last of each
distinct content a pipeline's ranks hold (:func:`planner.columns.tables.examined_ranks`),
which hold every rank's compute and memory peaks; ``tests/consistency`` checks them against
every rank."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from hwspecs.schema import Accelerator, Cluster
from planner.columns.codes import distinct_rows
from planner.columns.expanded import ExpandedRows
from planner.columns.layout import LayoutColumns
from planner.columns.tables import one_value_or_column
from planner.comm.rows import chunks_column, placeable
from planner.comm.traffic import AXES
from planner.evaluate.blocks import in_blocks
from planner.evaluate.indices import STRUCTURE_FIELDS, ShapesAhead, gpu_rates, row_tables
from planner.evaluate.memory import MEMORY_OUTPUTS, memory_columns
from planner.evaluate.time import (
    exposed_comm_floor,
    step_time_floor,
    time_columns,
)
from planner.progress import report
from planner.spec.job import Job

#: Rows timed together: the timing's intermediate columns (per axis and link) stay near
#: 10^8 bytes whatever the search's size; each row's numbers do not depend on the others.
TIMED_BLOCK_ROWS = 2**16
#: Outputs a search ranks by or re-evaluates from (the objectives, the time to train's
#: inputs, the event simulator's F, B, W and pipeline time): float64 in a compact screen,
#: where every other float output is float32 (7 significant digits, more than any figure
#: is printed with; the rows a user reads are re-evaluated in float64 by ``estimate``).
FULL_PRECISION_OUTPUTS = frozenset({
    "step_time_s", "pipeline_time_s", "forward_s", "input_grad_s", "weight_grad_s",
    "recompute_per_microbatch_s", "tokens_per_s_per_gpu", "mfu", "memory_per_gpu_bytes",
    "checkpoint_bytes_per_rank",
})  # fmt: skip


def compact_dtype(key: str, dtype: np.dtype) -> np.dtype:
    """The dtype output ``key`` is stored in by a compact screen."""
    if dtype == np.float64 and key not in FULL_PRECISION_OUTPUTS:
        return np.dtype(np.float32)
    return dtype


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
    pipeline_layer_split (strings, or :class:`planner.columns.codes.Labels`). Returns one array
    per quantity.

    Memory comes first, on every row. With ``memory_limit_bytes`` only the rows that fit in
    it and can be placed are timed (the search's screen); the others keep their memory and
    ``valid`` and carry NaN times. Each row's numbers do not depend on the other rows.
    """
    if memory_limit_bytes is not None:  # the screen, its timed rows spread over all rows
        memory, valid, rows, timed, *_ = screen_columns(
            job, cluster, accelerator, columns, memory_limit_bytes, order, mfu_dtype
        )
        full = {}
        for key, value in timed.items():
            full[key] = valid.copy() if key == "valid" else np.full(len(valid), np.nan)
            full[key][rows] = value
        return in_output_order(full, memory)
    c = LayoutColumns.of(columns)
    rates, bf16_rates, tuned = gpu_rates(job, accelerator)
    shapes, structs = row_tables(job, c, rates, bf16_rates, tuned)
    memory = memory_columns(job, c, shapes, structs, tuned, accelerator=accelerator)
    timed = time_columns(
        job, cluster, accelerator, c, shapes, structs, order, mfu_dtype, rates, tuned
    )
    return in_output_order(timed, memory)


def layout_columns(layout, num_microbatches: int) -> dict[str, np.ndarray]:
    """One layout as the one-row columns :func:`evaluate_columns` takes (``etp`` resolved)."""
    fields = layout.model_dump()
    fields["num_microbatches"] = num_microbatches
    fields["etp"] = layout.expert_tp
    return {key: np.array([value]) for key, value in fields.items()}


def memory_every_rank(
    job: Job, accelerator: Accelerator | None, columns: dict
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Memory of rows of layouts on every pipeline rank: the columns model's memory outputs
    with every rank examined (``rank_<part>_bytes``, ``rank_units``, ``rank_slot``: [row,
    rank] arrays; :func:`planner.evaluate.memory.memory_columns`), and the structure table's
    [row, rank] layers and parameters (``held_layers``, ``dense_params``, ``expert_params``).
    The single-layout memory report is this on a 1-row column."""
    c = LayoutColumns.of(columns)
    rates, bf16_rates, tuned = gpu_rates(job, accelerator)
    shapes, structs = row_tables(job, c, rates, bf16_rates, tuned, every_rank=True)
    memory = memory_columns(job, c, shapes, structs, tuned, per_rank=True, accelerator=accelerator)
    at = c.structure.codes
    held = {key: structs[key][at] for key in ("held_layers", "dense_params", "expert_params")}
    return memory, held


class Screened(NamedTuple):
    """What :func:`screen_columns` returns."""

    memory: dict[str, np.ndarray]  # the memory outputs of every row
    valid: np.ndarray  # which rows can be placed
    rows: np.ndarray  # the rows to time: placeable and fitting
    #: The timed outputs of the rows of ``rows`` at ``timed_rows``, one per row of them.
    timed: dict[str, np.ndarray]
    #: Rows to time whose step time is above this were not timed: they cannot be within
    #: reach (``screen_columns``' ``reach``); inf: all timed.
    bound_s: float
    #: Where in ``rows`` the timed rows are (ascending; None: all of them).
    timed_rows: np.ndarray | None = None


def screen_columns(
    job: Job,
    cluster: Cluster,
    accelerator: Accelerator,
    columns: dict,
    memory_limit_bytes: float,
    order=None,
    mfu_dtype: str = "bf16",
    memory_parts_of_timed_rows: bool = False,
    progress=None,
    compact: bool = False,
    outputs: frozenset[str] | None = None,
    reach: tuple[int, float] | None = None,
    shapes_ahead: ShapesAhead | None = None,
) -> Screened:
    """The search's screen, as :func:`evaluate_columns` with ``memory_limit_bytes`` but
    without spreading the timed rows back over all rows: (memory outputs of every row,
    which rows can be placed, the rows to time — placeable and fitting —, the timed outputs
    of those rows only, one per row timed, the step time beyond which rows were not timed,
    and which of them were; :class:`Screened`).

    ``memory_parts_of_timed_rows``: every memory output but ``memory_per_gpu_bytes`` is
    kept for the timed rows only (one per row of them), and the others' released before
    the timing (the search reads no other row's parts). ``progress``: see
    :mod:`planner.progress` (the memory screen, then each timed block). ``compact``: the
    outputs of the timed rows outside :data:`FULL_PRECISION_OUTPUTS` are float32 (the
    search's feasible table). ``outputs``: the outputs kept (None: all); ``valid`` and
    ``memory_per_gpu_bytes`` are always kept (the screen reads them); the memory outputs
    left out are not computed, the timed ones are (a row's numbers are the same with any
    ``outputs``). ``columns`` may be a search's
    :class:`planner.columns.expanded.ExpandedRows` (each block written out as it is
    evaluated). ``reach``: (n,
    band): only the rows whose step time can be at most ``(1 + band)`` times the n-th
    fastest row's are timed (:func:`_rows_within_reach`; ``timed_rows`` says which); the
    others are all slower than ``bound_s``. ``shapes_ahead``: the tables
    started from the grid rows of ``columns``, :class:`ExpandedRows` holding each row's grid
    codes (:func:`planner.evaluate.indices.shapes_beside`)."""
    c = columns if isinstance(columns, ExpandedRows) else LayoutColumns.of(columns)
    del columns  # the rows' table indices go with ``c`` once the rows to time are taken
    kept = None if outputs is None else outputs | {"valid", "memory_per_gpu_bytes"}
    report(progress, "memory screen", 0, len(c))
    rates, bf16_rates, tuned = gpu_rates(job, accelerator)
    valid = _placeable(job, cluster, c)  # beside the tables, where they were started ahead
    shapes, structs = row_tables(job, c, rates, bf16_rates, tuned, shapes_ahead=shapes_ahead)
    memory, rows = _memory_in_blocks(
        job, c, shapes, structs, tuned, valid, memory_limit_bytes, memory_parts_of_timed_rows,
        progress, compact, kept, accelerator,
    )  # fmt: skip
    c = c.take(rows)  # the timed rows only
    within, bound_s = None, np.inf
    if reach is not None:
        within, bound_s = _rows_within_reach(
            job, cluster, accelerator, c, shapes, structs, order, mfu_dtype, rates, tuned, *reach
        )
    timed = _timed_in_blocks(
        job, cluster, accelerator, c if within is None else c.take(within), shapes, structs,
        order, mfu_dtype, rates, tuned, progress, compact, kept,
    )  # fmt: skip
    return Screened(memory, valid, rows, timed, bound_s, within)


#: Rows timed first to find how far the fastest rows reach (:func:`_rows_within_reach`):
#: those with the lowest step-time floor, this many times the rows the caller reads. More
#: rows probed, a lower bound (the n-th fastest of more rows), fewer rows floored and timed
#: after it: a plan's 21 rows read, 8 -> 64 times (1,344 rows probed) took the searches of
#: the default plan 0.42 -> 0.36 s, DeepSeek-V3's 1.57 -> 1.48 s and Qwen3-235B's 1.51 ->
#: 1.38 s (warm, in one process as the command line sets it up, 2026-12-04, 2-core machine;
#: rows timed 61,269 -> 14,698, 6,874 -> 5,331 and 52,302 -> 11,602); the rows and their
#: values are the same with any factor.
PROBE_FACTOR = 64


def _rows_within_reach(
    job, cluster, accelerator, c, shapes, structs, order, mfu_dtype, rates, tuned, count: int,
    band: float,
) -> tuple[np.ndarray | None, float]:  # fmt: skip
    """The rows of ``c`` whose step time can be at most ``(1 + band)`` times the
    ``count``-th fastest row's, and that bound in seconds (None, inf: fewer rows than
    ``count``, all of them).

    The bound is the ``count``-th fastest step of the rows with the lowest
    :func:`planner.evaluate.time.step_time_floor` (timed in full: an upper bound of the
    ``count``-th fastest of all rows) times ``1 + band``; a row whose floor is above it is
    above it itself and is left out (a relative 10⁻⁹ kept for the floor's rounding; a row
    without a floor is timed). On the rows left the floor gains the communication no
    compute can hide (:func:`planner.evaluate.time.exposed_comm_floor`), the bound becomes
    the lower of itself and the same bound over the rows with the lowest of that floor, and
    the rows above it are left out in turn."""
    if len(c) <= count:
        return None, np.inf

    def floor_of(rows: slice) -> np.ndarray:
        return step_time_floor(job, accelerator, c.block(rows), shapes, structs, rates)

    def probed_bound(floor: np.ndarray, rows=None) -> float:
        """The ``count``-th fastest step of the rows (of ``rows``) with the lowest floor."""
        probe = np.argpartition(floor, min(PROBE_FACTOR * count, len(floor)) - 1)
        probe = np.sort(probe[: PROBE_FACTOR * count])
        probed = time_columns(
            job, cluster, accelerator, c.block(probe if rows is None else rows[probe]), shapes,
            structs, order, mfu_dtype, rates, tuned,
        )["step_time_s"]  # fmt: skip
        probed = probed[np.isfinite(probed)]
        return float(np.partition(probed, count - 1)[count - 1]) if len(probed) >= count else np.inf

    floor = np.concatenate([part for _, part in in_blocks(floor_of, len(c), TIMED_BLOCK_ROWS)])
    bound_s = probed_bound(floor) * (1 + band)
    if not np.isfinite(bound_s):
        return None, np.inf
    within = np.flatnonzero(~(floor > bound_s * (1 + 1e-9)))  # a NaN floor: timed

    def comm_floor_of(rows: slice) -> np.ndarray:
        return exposed_comm_floor(job, cluster, c.block(within[rows]), order)

    # The rows left: their floor with the communication no compute can hide, and the bound
    # again from the rows with the lowest of it (the lower of two upper bounds).
    comm = [part for _, part in in_blocks(comm_floor_of, len(within), TIMED_BLOCK_ROWS)]
    floor = floor[within] + np.concatenate(comm) if comm else floor[within]
    bound_s = min(bound_s, probed_bound(floor, within) * (1 + band))
    return within[~(floor > bound_s * (1 + 1e-9))], bound_s


def _placeable(job: Job, cluster: Cluster, c: LayoutColumns | ExpandedRows) -> np.ndarray:
    """Rows that can be placed on the cluster (:func:`planner.comm.rows.placeable`)."""
    # Placeable or not depends on the structure (tp, ep, etp, pp, vpp, schedule, split), cp, dp.
    if isinstance(c, ExpandedRows):  # all of them the grid's
        return c.per_grid_row(lambda rows: _placeable(job, cluster, rows))
    structure = c.structure  # its index, or (not indexed yet) its fields
    structure = (structure,) if structure is not None else c.columns(*STRUCTURE_FIELDS)
    some, inverse = distinct_rows(*structure, c.cp, c.dp)
    at = c.take(some)
    return placeable(cluster, job.model.num_layers, *at.columns("tp", "cp", "pp", "dp", "ep"),
                     chunks_column(at.schedule, at.vpp),
                     one_value_or_column(at.pipeline_layer_split), at.etp)[inverse]  # fmt: skip


def _memory_in_blocks(
    job, c, shapes, structs, tuned, valid, limit_bytes, parts_of_timed_rows, progress=None,
    compact=False, outputs=None, accelerator=None,
) -> tuple[dict[str, np.ndarray], np.ndarray]:  # fmt: skip
    """:func:`planner.evaluate.memory.memory_columns` of the rows of ``c``,
    :data:`TIMED_BLOCK_ROWS` at a time (its [row, examined rank] sums stay small), and the
    rows to time: placeable (``valid``) and fitting in ``limit_bytes``. With
    ``parts_of_timed_rows`` every output but ``memory_per_gpu_bytes`` is kept for those rows
    only (one per row of them); with ``outputs`` only those are kept."""
    n = len(c)
    parts: dict[str, list[np.ndarray]] = {}
    timed_rows = []

    def screened(rows: slice) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        block = memory_columns(
            job, c.block(rows), shapes, structs, tuned, outputs=outputs, accelerator=accelerator
        )
        at = np.flatnonzero(valid[rows] & (block["memory_per_gpu_bytes"] <= limit_bytes))
        kept = {}
        for key, value in block.items():
            if outputs is not None and key not in outputs:
                continue
            value = value[at] if parts_of_timed_rows and key != "memory_per_gpu_bytes" else value
            kept[key] = (
                value.astype(compact_dtype(key, value.dtype), copy=False) if compact else value
            )
        return at + rows.start, kept

    for rows, (at, kept) in in_blocks(screened, n, TIMED_BLOCK_ROWS):
        timed_rows.append(at)
        for key, value in kept.items():
            parts.setdefault(key, []).append(value)
        report(progress, "memory screen", rows.stop, n)
    memory = {key: np.concatenate(values) for key, values in parts.items()}
    return memory, np.concatenate(timed_rows)


def _timed_in_blocks(
    job, cluster, accelerator, c, shapes, structs, order, mfu_dtype, rates, tuned, progress=None,
    compact=False, outputs=None,
) -> dict[str, np.ndarray]:  # fmt: skip
    """:func:`planner.evaluate.time.time_columns` of the rows of ``c``, :data:`TIMED_BLOCK_ROWS`
    at a time, into one column per output (with ``outputs``: those only)."""
    n = len(c)
    timed: dict[str, np.ndarray] = {}
    report(progress, "timing", 0, n)

    def timed_block(rows: slice) -> dict[str, np.ndarray]:
        sub = c.block(rows)
        return time_columns(
            job, cluster, accelerator, sub, shapes, structs, order, mfu_dtype, rates, tuned
        )

    for rows, part in in_blocks(timed_block, n, TIMED_BLOCK_ROWS):
        for key, value in part.items():
            if outputs is not None and key not in outputs:
                continue
            value = np.broadcast_to(value, (rows.stop - rows.start,))
            if key not in timed:
                dtype = compact_dtype(key, value.dtype) if compact else value.dtype
                timed[key] = np.empty(n, dtype=dtype)
            timed[key][rows] = value
        report(progress, "timing", rows.stop, n)
    return timed


def in_output_order(timed: dict, memory: dict) -> dict[str, np.ndarray]:
    """Timed and memory outputs in one order: throughput, memory per GPU and peak rank,
    exposed communication and validity, the memory parts, then per-axis communication
    (any of them may be absent: a screen that kept some outputs only)."""
    keys = list(timed)
    first_axis = next((at for at, key in enumerate(keys) if key in AXIS_OUTPUTS), len(keys))
    after_hfu = keys.index("hfu") + 1 if "hfu" in keys else first_axis
    out = {key: timed[key] for key in keys[:after_hfu]}
    out.update({key: memory[key] for key in MEMORY_OUTPUTS if key in memory})
    out.update({key: timed[key] for key in keys[after_hfu:first_axis]})
    out.update({key: value for key, value in memory.items() if key not in MEMORY_OUTPUTS})
    out.update({key: timed[key] for key in keys[first_axis:]})
    return out


#: The per-axis timed outputs (:func:`planner.evaluate.time.time_columns`), last in order.
AXIS_OUTPUTS = frozenset(
    f"{axis}_{what}" for axis in AXES for what in ("exposed_time_s", "time_s", "bytes_per_step")
)

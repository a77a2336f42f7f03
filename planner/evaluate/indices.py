"""Each row's indices into the evaluation's tables, and the tables: per distinct layer
shape (:func:`planner.columns.tables.shape_table_of`) and pipeline structure
(:func:`planner.columns.tables.structure_table_of`), worked out once per distinct value,
and the distinct (structure, shape, micro-batches), (structure, ZeRO) and communication-
buffer combinations the memory and time models dedupe on. A search starts them from its
grid rows, whose codes its factored rows then read (:func:`shapes_beside`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from hwspecs.schema import Accelerator
from planner.columns.codes import Labels, coded, distinct_rows, unique_rows
from planner.columns.expanded import ExpandedRows
from planner.columns.layout import LayoutColumns
from planner.columns.tables import shape_table_of, structure_table_of
from planner.cost.compute import GpuRates, job_rates
from planner.evaluate.blocks import beside
from planner.evaluate.memory import BUFFER_FIELDS
from planner.evaluate.time import FSDP, data_parallel_form
from planner.spec.job import Job
from planner.spec.layout import resolved_etp, sequence_parallel_column, zero_group_size


def gpu_rates(job: Job, accelerator: Accelerator | None) -> tuple:
    """(GPU rates of the GEMM dtype, BF16 rates under FP8 or None, the adapter recipe or None);
    without an accelerator, untimed unit rates (memory only)."""
    tuned = job.finetune if job.finetune is not None and job.finetune.trains_adapters else None
    if accelerator is None:
        return GpuRates.untimed(), None, tuned
    return (*job_rates(accelerator, job), tuned)


class ShapesAhead(NamedTuple):
    """The tables of a search's rows started from its grid rows (:func:`shapes_beside`):
    each row of a :class:`planner.columns.expanded.ExpandedRows` reads them through its grid
    row's codes (the grid columns :data:`GRID_SHAPE` … :data:`GRID_STATES`) and its own
    ZeRO stage and recompute policy."""

    #: Waits for the shape table and the structure table (of the examined ranks) and gives
    #: them.
    tables: Callable[[], tuple[dict, dict]]
    #: Each row's index into the shape table: its grid row's shape index (the column named
    #: :data:`GRID_SHAPE`, below ``grid_shapes``) times the policies, plus its recompute
    #: policy's code.
    grid_shapes: int
    policies: int
    #: The grid rows' distinct pipeline structures (:func:`unique_rows`' values; each row's
    #: index among them in :data:`GRID_STRUCTURE`).
    structures: list[tuple]
    #: How many distinct (structure, grid shape, micro-batches) the grid rows hold
    #: (:data:`GRID_HELD`) and distinct (structure, ZeRO group) (:data:`GRID_STATES`).
    grid_held: int
    grid_states: int
    #: How many distinct communication-buffer fields but the ZeRO stage (:data:`GRID_BUFFERS`).
    grid_buffers: int


#: The grid columns that hold each grid row's codes into a :class:`ShapesAhead`: shape
#: (before the recompute policy), structure, and the (structure, shape, micro-batches) and
#: (structure, ZeRO group) combinations (before the policy and the ZeRO stage).
GRID_SHAPE, GRID_STRUCTURE, GRID_HELD, GRID_STATES, GRID_BUFFERS = (
    "grid_shape", "grid_structure", "grid_held", "grid_states", "grid_buffers",
)  # fmt: skip
#: The fields a row's shape and its pipeline structure read.
SHAPE_FIELDS = ("tp", "cp", "ep", "etp", "sequence_parallel", "micro_batch_size", "recompute")
STRUCTURE_FIELDS = ("tp", "ep", "etp", "pp", "vpp", "schedule", "pipeline_layer_split")
#: ZeRO stages are below this (:class:`planner.candidates.SearchSpace` and the layout take 0
#: to 3): a row's states index is its grid row's times it plus its stage.
ZERO_STAGES = 4


def shapes_beside(
    job: Job, accelerator: Accelerator, grid: dict, recompute: tuple, split: str
) -> tuple[ShapesAhead, dict[str, np.ndarray]]:
    """The shape table of every row that the grid rows ``grid`` (the search's columns before
    the ZeRO stage and the recompute policy; ``split``: the layer split every row takes)
    expand to under each policy of ``recompute``, worked out beside the caller
    (:func:`planner.evaluate.blocks.beside`: while it indexes the rows and works out their
    structure table), the grid rows' distinct structures, and each grid row's codes
    (:data:`GRID_SHAPE` … :data:`GRID_BUFFERS`, the narrowest integers that hold them). The
    same entries as :func:`row_tables` works out from the rows: every grid row expands to
    each ZeRO stage and policy, so the rows' shapes are these grid shapes under every
    policy, their structures these structures, and their combinations these under every
    stage and policy."""
    tp = np.asarray(grid["tp"], dtype=np.int64)
    sp = sequence_parallel_column(grid["sequence_parallel"], tp)  # as LayoutColumns reads it
    etp = resolved_etp(grid.get("etp"), tp)
    fields = (tp, grid["cp"], grid["ep"], etp, sp, grid["micro_batch_size"])
    grid_rows, grid_shape = distinct_rows(*fields)
    one_split = Labels(np.broadcast_to(np.int8(0), tp.shape), (split,))
    structures, grid_structure = unique_rows(
        tp, grid["ep"], etp, grid["pp"], grid["vpp"], grid["schedule"], one_split
    )
    held_rows, grid_held = distinct_rows(grid_structure, grid_shape, grid["num_microbatches"])
    dp, cp = (np.asarray(grid[key], dtype=np.int64) for key in ("dp", "cp"))
    state_rows, grid_states = distinct_rows(grid_structure, zero_group_size(dp, cp))
    # The buffers' fields but the ZeRO stage, as the rows' columns hold them.
    buffer_rows, grid_buffers = distinct_rows(
        tp,
        grid["cp"],
        grid["pp"],
        grid["ep"],
        etp,
        sp,
        grid["micro_batch_size"],
        grid["cp_algorithm"],
    )
    # The tables started last: a thread in Python beside this numpy would hold it up. Both
    # are Python, on one thread: the caller's numpy (the rows' indices, which rows can be
    # placed) runs beside them, not a third Python.
    count = len(recompute)
    distinct = [np.repeat(np.asarray(field)[grid_rows], count) for field in fields]
    policies = Labels(np.tile(np.arange(count, dtype=np.int64), len(grid_rows)), tuple(recompute))
    rates, bf16_rates, tuned = gpu_rates(job, accelerator)
    tables = beside(lambda: (shape_table_of(job, rates, tuned, *distinct, policies, bf16_rates),
                             structure_table_of(job, structures)))  # fmt: skip
    codes = {
        GRID_SHAPE: _smallest_ints(grid_shape, len(grid_rows)),
        GRID_STRUCTURE: _smallest_ints(grid_structure, len(structures)),
        GRID_HELD: _smallest_ints(grid_held, len(held_rows)),
        GRID_STATES: _smallest_ints(grid_states, len(state_rows)),
        GRID_BUFFERS: _smallest_ints(grid_buffers, len(buffer_rows)),
    }
    ahead = ShapesAhead(tables, len(grid_rows), count, structures, len(held_rows), len(state_rows),
                        len(buffer_rows))  # fmt: skip
    return ahead, codes


def _smallest_ints(codes: np.ndarray, count: int) -> np.ndarray:
    """Codes below ``count`` in the narrowest signed integers that hold them (a search
    expands each to every row)."""
    return codes.astype(np.min_scalar_type(-max(count, 1)), copy=False)


def _codes_from_grid(c: ExpandedRows, ahead: ShapesAhead) -> dict:
    """Each row's table indices from its grid row's codes (:func:`shapes_beside`), its
    recompute policy and its ZeRO stage: ``shape``, ``structure``, ``held``, ``paced`` (held
    with the data-parallel wrapper's code) and ``states``, as
    :meth:`LayoutColumns.index` takes them. Two rows share an index exactly where they
    share the fields it stands for, as :func:`row_tables` finds them from the rows (the
    numbering differs; every table is read through it)."""
    policy = c.recompute.codes
    shape = c.column(GRID_SHAPE).astype(np.int64) * ahead.policies + policy
    held = c.column(GRID_HELD).astype(np.int64) * ahead.policies + policy
    held_count = ahead.grid_held * ahead.policies
    # The wrapper's code (0 to FSDP) as a last digit: its host operations, and whether W
    # accumulates into a gradient buffer (planner.cost.stage_times.accumulates_gradients).
    paced = held * (FSDP + 1) + c.data_parallel_form
    states = c.column(GRID_STATES).astype(np.int64) * ZERO_STAGES + c.zero_stage
    buffers = c.column(GRID_BUFFERS).astype(np.int64) * ZERO_STAGES + c.zero_stage
    return {
        "shape": coded(shape, ahead.grid_shapes * ahead.policies),
        "structure": coded(c.column(GRID_STRUCTURE), len(ahead.structures)),
        "held": coded(held, held_count),
        "paced": coded(paced, held_count * (FSDP + 1)),
        "states": coded(states, ahead.grid_states * ZERO_STAGES),
        "buffers": coded(buffers, ahead.grid_buffers * ZERO_STAGES),
    }


def row_tables(
    job: Job,
    c: LayoutColumns | ExpandedRows,
    rates,
    bf16_rates,
    tuned,
    every_rank=False,
    shapes_ahead: ShapesAhead | None = None,
) -> tuple[dict, dict]:
    """The per-shape and per-structure tables. Records in ``c`` each row's index into them
    (``shape``, ``structure``) and into the distinct (structure, shape, micro-batches)
    combinations — what activations depend on (``held``) — those with the data-parallel
    wrapper — what the pipeline's pace depends on (``paced``: its host operations, W's
    gradient accumulation) — and (structure, ZeRO stage, ZeRO group) ones — what model
    states and the optimizer step depend on (``states``) — and into the distinct tuples of
    the communication buffers'
    fields (``buffers``, :data:`planner.evaluate.memory.BUFFER_FIELDS`), all as
    :class:`planner.columns.codes.Labels` of indices.

    Each row's indices are numpy over the rows; the tables' entries are worked out per
    distinct shape and structure in Python, while the combinations' indices are found
    beside them (:func:`planner.evaluate.blocks.beside`). ``shapes_ahead``: the tables
    started from the grid rows (:func:`shapes_beside`) of ``c``, a search's
    :class:`ExpandedRows` holding the grid codes (:data:`GRID_SHAPE` …): every index is then read
    from the codes, none found afresh."""
    # The wrapper's operations (where the accelerator records host costs) and whether W
    # accumulates into a gradient buffer kept over micro-batches follow the wrapper.
    c.index(data_parallel_form=data_parallel_form(c.zero_stage, c.zero_group_size))
    if shapes_ahead is not None:
        c.index(**_codes_from_grid(c, shapes_ahead))
        shapes, structs = shapes_ahead.tables()
        if every_rank:
            structs = structure_table_of(job, shapes_ahead.structures, every_rank)
        return shapes, structs
    shape_rows, shape_inv = distinct_rows(*c.columns(*SHAPE_FIELDS))
    distinct = [column[shape_rows] for column in c.columns(*SHAPE_FIELDS)]
    structures, struct_inv = unique_rows(*c.columns(*STRUCTURE_FIELDS))
    c.index(
        shape=coded(shape_inv, len(shape_rows)),
        structure=coded(struct_inv, len(structures)),
    )
    held = ("shape", "num_microbatches")
    paced = (*held, "data_parallel_form")

    def combinations() -> dict[str, Labels]:
        found = {}
        for name, fields in (("held", held), ("paced", paced),
                             ("states", ("zero_stage", "zero_group_size"))):  # fmt: skip
            chosen, inverse = distinct_rows(c.structure, *c.columns(*fields))
            found[name] = coded(inverse, len(chosen))
        chosen, inverse = distinct_rows(*c.columns(*BUFFER_FIELDS))
        found["buffers"] = coded(inverse, len(chosen))
        return found

    combined = beside(combinations)
    structs = structure_table_of(job, structures, every_rank)
    shapes = shape_table_of(job, rates, tuned, *distinct, bf16_rates)
    c.index(**combined())
    return shapes, structs

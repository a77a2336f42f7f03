"""Each row's indices into the evaluation's tables, and the tables: per distinct layer
shape (:func:`planner.columns.tables.shape_table_of`) and pipeline structure
(:func:`planner.columns.tables.structure_table_of`), worked out once per distinct value,
and the distinct (structure, shape, micro-batches) and (structure, ZeRO) combinations the
memory and time models dedupe on. A search may start the shape table from its grid rows
before it expands them (:func:`shapes_beside`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from hwspecs.schema import Accelerator
from planner.columns.codes import Labels, coded, distinct_rows, narrow_codes, unique_rows
from planner.columns.layout import LayoutColumns
from planner.columns.tables import shape_table_of, structure_table_of
from planner.cost.compute import GpuRates
from planner.evaluate.blocks import beside
from planner.evaluate.time import data_parallel_form
from planner.spec.job import Job
from planner.spec.layout import resolved_etp, sequence_parallel_column


def gpu_rates(job: Job, accelerator: Accelerator | None) -> tuple:
    """(GPU rates of the GEMM dtype, BF16 rates under FP8 or None, the adapter recipe or None);
    without an accelerator, untimed unit rates (memory only)."""
    tuned = job.finetune if job.finetune is not None and job.finetune.trains_adapters else None
    if accelerator is None:
        return GpuRates.untimed(), None, tuned
    rates = GpuRates.of(accelerator, job.precision.gemm_dtype, job.attention_kernel)
    bf16_rates = (
        GpuRates.of(accelerator, "bf16", job.attention_kernel)
        if job.precision.gemm_dtype == "fp8"
        else None
    )
    return rates, bf16_rates, tuned


class ShapesAhead(NamedTuple):
    """A shape table started before the rows it serves exist (:func:`shapes_beside`)."""

    table: Callable[[], dict]  # waits for the table and gives it
    #: Each row's index into the table: its grid row's shape index (the column named
    #: :data:`GRID_SHAPE`, below ``grid_shapes``) times the policies, plus its recompute
    #: policy's code.
    grid_shapes: int
    policies: int


#: The column of a search's rows that holds their grid row's index into a
#: :class:`ShapesAhead` table (before the recompute policy).
GRID_SHAPE = "grid_shape"


def shapes_beside(
    job: Job, accelerator: Accelerator, columns: dict, recompute: tuple
) -> tuple[ShapesAhead, np.ndarray]:
    """The shape table of every row that the grid rows ``columns`` (tp, cp, ep, etp,
    sequence_parallel, micro_batch_size) expand to under each policy of ``recompute``,
    worked out beside the caller (:func:`planner.evaluate.blocks.beside`: while it expands
    the rows), and each grid row's shape index (:data:`GRID_SHAPE`; the rows' index into
    the table adds their policy). The same entries as :func:`row_tables` works out from the
    rows: the rows' shapes are these grid shapes, each under every policy."""
    tp = np.asarray(columns["tp"], dtype=np.int64)
    sp = sequence_parallel_column(columns["sequence_parallel"], tp)  # as LayoutColumns reads it
    fields = (tp, columns["cp"], columns["ep"], resolved_etp(columns.get("etp"), tp), sp,
              columns["micro_batch_size"])  # fmt: skip
    grid_rows, grid_shape = distinct_rows(*fields)
    count = len(recompute)
    distinct = [np.repeat(np.asarray(field)[grid_rows], count) for field in fields]
    policies = Labels(np.tile(np.arange(count, dtype=np.int64), len(grid_rows)), tuple(recompute))
    rates, bf16_rates, tuned = gpu_rates(job, accelerator)
    table = beside(lambda: shape_table_of(job, rates, tuned, *distinct, policies, bf16_rates))
    return ShapesAhead(table, len(grid_rows), count), narrow_codes(grid_shape, len(grid_rows))


def row_tables(
    job: Job, c: LayoutColumns, rates, bf16_rates, tuned, every_rank=False, shapes_ahead=None
) -> tuple[dict, dict]:
    """The per-shape and per-structure tables. Records in ``c`` each row's index into them
    (``shape``, ``structure``) and into the distinct (structure, shape, micro-batches)
    combinations — what activations and the pipeline's compute depend on — and (structure,
    ZeRO stage, ZeRO group) ones — what model states and the optimizer step depend on
    (``held``, ``states``), all as :class:`planner.columns.codes.Labels` of indices.

    Each row's indices are numpy over the rows; the tables' entries are worked out per
    distinct shape and structure in Python, while the combinations' indices are found
    beside them (:func:`planner.evaluate.blocks.beside`). ``shapes_ahead``: (the shape
    table already started, each row's :data:`GRID_SHAPE`), :func:`shapes_beside`."""
    shape_fields = ("tp", "cp", "ep", "etp", "sequence_parallel", "micro_batch_size", "recompute")
    if shapes_ahead is None:
        shape_rows, shape_inv = distinct_rows(*c.columns(*shape_fields))
        num_shapes = len(shape_rows)
        distinct = [column[shape_rows] for column in c.columns(*shape_fields)]

        def shapes_of() -> dict:
            return shape_table_of(job, rates, tuned, *distinct, bf16_rates)

    else:  # a grid row's shape under each policy, in the policies' order
        ahead, grid_shape = shapes_ahead
        shape_inv = np.asarray(grid_shape, dtype=np.int64) * ahead.policies + c.recompute.codes
        num_shapes, shapes_of = ahead.grid_shapes * ahead.policies, ahead.table
    struct_fields = ("tp", "ep", "etp", "pp", "vpp", "schedule", "pipeline_layer_split")
    structures, struct_inv = unique_rows(*c.columns(*struct_fields))
    c.index(
        shape=coded(shape_inv, num_shapes),
        structure=coded(struct_inv, len(structures)),
        # The wrapper's operations cost time only where the accelerator records host costs.
        data_parallel_form=data_parallel_form(c.zero_stage, c.zero_group_size),
    )
    held = ("shape", "num_microbatches", "data_parallel_form")[: 3 if rates.op_overhead_s else 2]

    def combinations() -> dict[str, Labels]:
        found = {}
        for name, fields in (("held", held), ("states", ("zero_stage", "zero_group_size"))):
            chosen, inverse = distinct_rows(c.structure, *c.columns(*fields))
            found[name] = coded(inverse, len(chosen))
        return found

    combined = beside(combinations)
    structs = structure_table_of(job, structures, every_rank)
    shapes = shapes_of()
    c.index(**combined())
    return shapes, structs

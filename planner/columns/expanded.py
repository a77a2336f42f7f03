"""A search's rows factored over its grid: each row a grid row (the knobs the screening
rules read) under one ZeRO stage and one recompute policy.

The search expands each screened grid row to every ZeRO stage and recompute policy
(:func:`planner.candidates.expand_index`): 10^6-10^7 rows whose layout columns, written
out, would be a dozen integer columns of that length, each a copy of a grid column read
at the rows' grid rows. :class:`ExpandedRows` keeps the grid columns once and, per row, its
grid row, ZeRO stage and policy (narrow integers) and the evaluation's table indices; a
block of rows becomes :class:`planner.columns.layout.LayoutColumns` when it is evaluated
(:meth:`ExpandedRows.block`), so no full-length layout column is ever in memory.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from planner.columns.codes import Labels, distinct_rows
from planner.columns.layout import LayoutColumns, TableIndexed
from planner.spec.layout import zero_group_size

#: The grid's columns a row's layout reads (the ZeRO stage, the recompute policy and the
#: layer split are the row's own).
GRID_LAYOUT_FIELDS = ("tp", "cp", "pp", "dp", "ep", "etp", "vpp", "micro_batch_size",
                      "num_microbatches", "schedule", "sequence_parallel", "cp_algorithm",
                      "cp_inner")  # fmt: skip


@dataclass(eq=False)
class ExpandedRows(TableIndexed):
    """Rows of layouts as (grid row, ZeRO stage, recompute policy); one layer split for all.

    ``grid`` holds :data:`GRID_LAYOUT_FIELDS` (and any other per-grid-row column, such as
    the grid's codes into the evaluation's tables) for the grid rows; ``row`` is each row's
    index into them. The table indices (``shape`` … ``data_parallel_form``) are set by the
    evaluation, as on :class:`LayoutColumns`."""

    grid: dict
    row: np.ndarray
    zero_stage: np.ndarray
    recompute: Labels
    pipeline_layer_split: str
    shape: Labels | None = None
    structure: Labels | None = None
    held: Labels | None = None
    paced: Labels | None = None
    states: Labels | None = None
    buffers: Labels | None = None
    data_parallel_form: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.row)

    def column(self, key: str, rows=None) -> np.ndarray | Labels:
        """One layout column (or another grid column) at ``rows`` (None: every row), as
        the written-out rows would hold it (the layer split as labels)."""
        at = self.row if rows is None else self.row[rows]
        if key == "zero_stage":
            return self.zero_stage if rows is None else self.zero_stage[rows]
        if key == "recompute":
            return self.recompute if rows is None else self.recompute[rows]
        if key == "pipeline_layer_split":  # one value: a read-only view of one 0
            return Labels(np.broadcast_to(np.int8(0), at.shape), (self.pipeline_layer_split,))
        return self.grid[key][at]

    @property
    def zero_group_size(self) -> np.ndarray:
        """Each row's ZeRO group (:attr:`LayoutColumns.zero_group_size`)."""
        dp, cp = (np.asarray(self.grid[key], dtype=np.int64) for key in ("dp", "cp"))
        return zero_group_size(dp, cp)[self.row]

    def take(self, rows) -> ExpandedRows:
        """The selected rows (an index array, a slice or a boolean mask), still factored."""
        return dataclasses.replace(
            self,
            row=self.row[rows],
            zero_stage=self.zero_stage[rows],
            recompute=self.recompute[rows],
            **self.table_indices(rows),
        )

    def block(self, rows) -> LayoutColumns:
        """The selected rows written out, with their table indices: what the evaluation
        models read."""
        at = self.row[rows]  # the rows' grid rows, read once for every grid column
        written = {key: self.grid[key][at] for key in GRID_LAYOUT_FIELDS}
        written.update(zero_stage=self.zero_stage[rows], recompute=self.recompute[rows])
        written["pipeline_layer_split"] = self.column("pipeline_layer_split", rows)
        c = LayoutColumns.of(written)
        c.index(**self.table_indices(rows))
        return c

    def distinct_codes(self, keys: tuple[str, ...], rows=None) -> np.ndarray:
        """Each row's (at ``rows``; None: every row) code of its tuple of the columns
        ``keys``: two rows share a code exactly where they share those columns' values, as
        in :func:`planner.columns.codes.distinct_rows`' inverse of the written-out columns
        (numbered otherwise: below the product of the grid's distinct tuples and the
        stages' and policies' counts, not every code taken). The grid's columns are told
        apart once over the grid rows; the ZeRO stage and the policy are appended as digits."""
        at = self.row if rows is None else self.row[rows]
        grid_keys = [key for key in keys if key not in ("zero_stage", "recompute")]
        code = np.zeros(len(at), dtype=np.int64)
        if grid_keys:
            _, grid_code = distinct_rows(*(self.grid[key] for key in grid_keys))
            code = grid_code[at]
        if "zero_stage" in keys:
            stage = self.zero_stage if rows is None else self.zero_stage[rows]
            code *= int(stage.max(initial=0)) + 1
            code += stage
        if "recompute" in keys:
            code *= len(self.recompute.values)
            code += self.recompute.codes if rows is None else self.recompute.codes[rows]
        return code

    def per_grid_row(self, rows_function) -> np.ndarray:
        """``rows_function`` (of a :class:`LayoutColumns`, one value per row) of the rows,
        worked out on one row of each grid row present and read back at every row: for a
        quantity of the grid's columns (and the structure) alone."""
        present = np.zeros(len(self.grid["tp"]), dtype=bool)
        present[self.row] = True
        grid_rows = np.flatnonzero(present)
        some = np.empty(len(present), dtype=np.int64)  # a row of each grid row present
        some[self.row] = np.arange(len(self.row))
        values = np.asarray(rows_function(self.block(some[grid_rows])))
        at = np.zeros(len(present), dtype=np.int64)
        at[grid_rows] = np.arange(len(grid_rows))
        return values[at[self.row]]

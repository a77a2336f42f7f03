"""The search's rows factored over its grid (planner.columns.expanded.ExpandedRows) against
the same rows written out (planner.candidates.expand_rows): every column, every selection
and every per-grid-row quantity the same."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.candidates import (
    SearchSpace,
    expand_index,
    expand_rows,
)
from planner.columns.expanded import GRID_LAYOUT_FIELDS, ExpandedRows
from planner.columns.layout import LayoutColumns
from planner.evaluate import _placeable
from tests.columns.screened_grid import DGX, H100, MOE_JOB, screened_grid

SPACE = SearchSpace(zero_stage=[1, 3], recompute=["none", "full"], micro_batch_size=[1, 2])


def _both(split: str = "auto") -> tuple[ExpandedRows, dict]:
    grid, cells, shape = screened_grid(MOE_JOB, DGX, 64, SPACE)
    written = expand_rows(grid, cells, shape, SPACE)
    written["pipeline_layer_split"] = np.full(len(written["tp"]), split, dtype=object)
    factored = ExpandedRows(grid, *expand_index(cells, shape, SPACE), split)
    return factored, written


FACTORED, COLUMNS = _both()
WRITTEN = LayoutColumns.of(COLUMNS)


def _values(column):
    return column.strings() if hasattr(column, "strings") else np.asarray(column)


def test_every_layout_column_is_the_written_out_rows():
    assert len(FACTORED) == len(COLUMNS["tp"]) > 100
    for key in (*GRID_LAYOUT_FIELDS, "zero_stage", "recompute", "pipeline_layer_split"):
        np.testing.assert_array_equal(
            _values(FACTORED.column(key)), _values(COLUMNS[key]), err_msg=key
        )


@settings(max_examples=30, deadline=None)
@given(st.data())
def test_a_selection_written_out_is_the_written_out_rows_selected(data):
    """take (still factored) then block (written out) gives the rows LayoutColumns.take
    gives, their derived groups too; a slice and an index array alike."""
    n = len(FACTORED)
    first = data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=40))
    second = data.draw(st.lists(st.integers(0, len(first) - 1), min_size=1, max_size=20))
    start = data.draw(st.integers(0, n - 1))
    for rows, then in ((np.array(first), np.array(second)), (slice(start, n), slice(0, 7))):
        got = FACTORED.take(rows).block(then)
        want = WRITTEN.take(rows).take(then)
        for name in ("tp", "cp", "pp", "dp", "ep", "etp", "vpp", "micro_batch_size",
                     "num_microbatches", "zero_stage", "sequence_parallel", "schedule",
                     "recompute", "pipeline_layer_split", "cp_algorithm", "cp_inner",
                     "zero_group_size", "expert_data_parallel_size"):  # fmt: skip
            np.testing.assert_array_equal(
                _values(getattr(got, name)), _values(getattr(want, name)), err_msg=name
            )


@pytest.mark.parametrize("split", ["auto", "work-balanced"])
def test_a_quantity_of_the_grid_worked_out_once_per_grid_row_is_every_rows(split):
    """per_grid_row: a quantity of the grid's fields (and the structure) worked out on one
    row of each grid row, read back at every row, equals it worked out on every row; and on
    a selection that leaves some grid rows without a row."""
    from planner.evaluate.indices import gpu_rates, row_tables

    factored, columns = _both(split)
    written = LayoutColumns.of(columns)
    row_tables(MOE_JOB, written, *gpu_rates(MOE_JOB, H100))
    factored.index(structure=written.structure)
    some = np.flatnonzero(np.arange(len(factored)) % 7 == 3)

    def of_grid(c):
        return (c.tp * 1000 + c.pp) * 1000 + c.dp * 10 + c.structure.codes % 10

    for function in (of_grid, lambda c: _placeable(MOE_JOB, DGX, c)):
        expected = np.asarray(function(written))
        np.testing.assert_array_equal(factored.per_grid_row(function), expected)
        np.testing.assert_array_equal(factored.take(some).per_grid_row(function), expected[some])
    np.testing.assert_array_equal(
        _placeable(MOE_JOB, DGX, factored), _placeable(MOE_JOB, DGX, written)
    )


def _same_partition(a: np.ndarray, b: np.ndarray) -> bool:
    """Two code columns that group the rows alike (equal in one exactly where in the other)."""
    pairs = np.unique(np.stack([a, b]), axis=1)
    return len(np.unique(pairs[0])) == len(np.unique(pairs[1])) == pairs.shape[1]


#: Columns ExpandedRows.distinct_codes may group by: grid columns and per-row ones.
GROUPED = ("tp", "cp", "pp", "ep", "etp", "sequence_parallel", "zero_stage", "recompute",
           "micro_batch_size")  # fmt: skip


@settings(max_examples=30, deadline=None)
@given(
    keys=st.lists(st.sampled_from(GROUPED), min_size=1, max_size=6, unique=True),
    every=st.integers(1, 9),
)
def test_distinct_codes_group_the_rows_as_the_written_out_columns_do(keys, every):
    """ExpandedRows.distinct_codes (grid columns told apart over the grid, the ZeRO stage
    and the policy per row) groups the rows (all, or a selection) exactly as distinct_rows
    of the written-out columns does."""
    from planner.columns.codes import distinct_rows

    for rows in (None, np.flatnonzero(np.arange(len(FACTORED)) % every == 0)):
        at = slice(None) if rows is None else rows
        want = distinct_rows(*(COLUMNS[key][at] for key in keys))[1]
        assert _same_partition(FACTORED.distinct_codes(tuple(keys), rows), want), keys


def test_the_rules_groups_from_the_grid_are_the_written_out_rows():
    """planner.rank.over_every_row with its groups' codes from the grid gives what it
    finds from the written-out columns."""
    from planner.rank import SHARED_BY_GROUPS, over_every_row

    assert "cp" not in SHARED_BY_GROUPS and "pp" not in SHARED_BY_GROUPS
    from_grid = over_every_row(COLUMNS, FACTORED.distinct_codes)
    for got, want in zip(from_grid, over_every_row(COLUMNS), strict=True):
        np.testing.assert_array_equal(got, want)

"""`factorize` is pandas' `factorize` in numpy: the same codes and distinct values, in the
order they first occur, for integers of any range, floats with NaN and -0.0, strings and
objects, and 2-D columns (flattened)."""

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from planner.columns.codes import factorize


def assert_as_pandas(values: np.ndarray) -> None:
    codes, uniques = factorize(values)
    expected_codes, expected_uniques = pd.factorize(values.reshape(-1))
    assert codes.dtype == expected_codes.dtype
    np.testing.assert_array_equal(codes, expected_codes)
    assert uniques.dtype == expected_uniques.dtype
    assert len(uniques) == len(expected_uniques)
    if uniques.dtype.kind == "f":  # the first of 0.0 and -0.0 is kept: same bits
        assert uniques.tobytes() == expected_uniques.tobytes()
    else:
        assert uniques.tolist() == expected_uniques.tolist()


def _spread(draw_values):
    """Many rows over few values, and wide ranges (each of the integer paths)."""
    return st.one_of(st.integers(-3, 3), st.integers(0, 2**20), draw_values)


@settings(max_examples=150, deadline=None)
@given(
    hnp.arrays(
        st.sampled_from([np.int64, np.int32, np.int8, np.uint8, np.uint64]),
        st.integers(0, 200),
        elements=st.integers(0, 5),
    )
)
def test_small_integers_as_pandas(values):
    assert_as_pandas(values)


@settings(max_examples=150, deadline=None)
@given(
    hnp.arrays(
        np.int64,
        st.integers(1, 300),
        elements=_spread(st.integers(-(2**63), 2**63 - 1)),
    )
)
def test_integers_of_any_range_as_pandas(values):
    assert_as_pandas(values)


@settings(max_examples=100, deadline=None)
@given(hnp.arrays(np.uint64, st.integers(1, 100), elements=st.integers(2**63 - 5, 2**64 - 1)))
def test_unsigned_integers_above_the_signed_range_as_pandas(values):
    assert_as_pandas(values)


@settings(max_examples=100, deadline=None)
@given(hnp.arrays(np.bool_, st.integers(0, 100)))
def test_booleans_as_pandas(values):
    assert_as_pandas(values)


@settings(max_examples=150, deadline=None)
@given(
    hnp.arrays(
        st.sampled_from([np.float64, np.float32]),
        st.integers(0, 200),
        elements=st.one_of(
            st.sampled_from([0.0, -0.0, np.nan, 1.5, np.inf, -np.inf]),
            st.floats(-1e3, 1e3, width=32),
        ),
    )
)
def test_floats_with_nan_and_signed_zeros_as_pandas(values):
    assert_as_pandas(values)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.sampled_from(["1f1b", "zbv", "dualpipe", "", "auto"]), max_size=100))
def test_strings_as_pandas(names):
    assert_as_pandas(np.array(names, dtype=str))
    assert_as_pandas(np.array(names, dtype=object))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.one_of(st.text(max_size=3), st.none(), st.just(np.nan)), max_size=60))
def test_objects_with_missing_values_as_pandas(items):
    values = np.empty(len(items), dtype=object)
    values[:] = items
    assert_as_pandas(values)


def test_a_column_of_one_value_as_pandas():
    for value in ("auto", None, np.nan):
        values = np.empty(50, dtype=object)
        values[:] = [value] * 50
        assert_as_pandas(values)


@settings(max_examples=100, deadline=None)
@given(hnp.arrays(np.float64, hnp.array_shapes(min_dims=2, max_dims=2, max_side=12),
                  elements=st.sampled_from([0.0, -0.0, 2.0, np.nan, 3.0])))  # fmt: skip
def test_two_dimensional_columns_are_flattened_row_major(values):
    assert_as_pandas(values)


def test_many_rows_of_wide_integer_keys_as_pandas():
    """A key too wide for a table over its range (the packed sort) and one too wide for that."""
    rows = np.random.default_rng(0).integers(0, 5000, 100_000)
    for keys in (rows * 7919 + 10**9, rows * (2**50) - 2**62):
        assert_as_pandas(keys)

"""Columns as integer codes (each row's index into the column's distinct values), and the
distinct value tuples of several columns, for work done once per distinct value.

The search's string columns (schedule, recompute policy, layer split) hold a handful of
distinct values over 10^5 rows or more; hashing such a column costs more than a numpy
operation on an integer column, and the evaluation asks about each column many times.
:class:`Labels` hashes a column once (or takes the codes the search built it from) and
answers those questions — which rows hold one of these values, the rows of each value, the
value every row holds — from the codes. Its rows are the plain strings again on demand.

:func:`unique_rows` and :func:`distinct_rows` find the distinct value tuples of several
columns (small integers through a lookup table, no sort) and each row's index into them,
so that a quantity that depends on those columns only is computed once per tuple and
broadcast back to the rows by that index. Columns that no table fits are numbered by
:func:`factorize` (pandas' ``factorize`` in numpy: the search needs no pandas).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, eq=False)
class Labels:
    """A column as codes (a string column, or indices into a table's rows): ``values[codes[i]]``
    is row ``i``'s value."""

    codes: np.ndarray  # integers (int32 or int64), one per row
    values: tuple  # the distinct values (some may be held by no row after a selection)

    @classmethod
    def of(cls, column) -> Labels:
        """The column as labels (a column already coded is returned as it is)."""
        if isinstance(column, Labels):
            return column
        codes, uniques = factorize(column)
        return cls(codes.astype(np.int64), tuple(uniques.tolist()))

    def __len__(self) -> int:
        return len(self.codes)

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        """The rows' values, for numpy (``np.asarray(labels)``)."""
        values = self.strings()
        return values if dtype is None else values.astype(dtype)

    def __getitem__(self, rows):
        """One row's value (an integer index), else the selected rows as labels."""
        if isinstance(rows, (int, np.integer)):
            return self.values[self.codes[rows]]
        return Labels(self.codes[rows], self.values)

    @property
    def present(self) -> list:
        """The values some row holds, in the order of :attr:`values`."""
        held = np.bincount(self.codes, minlength=len(self.values)) > 0
        return [value for value, on in zip(self.values, held, strict=True) if on]

    def isin(self, names) -> np.ndarray:
        """Rows whose value is one of ``names``."""
        return np.array([value in names for value in self.values], dtype=bool)[self.codes]

    def groups(self) -> list[tuple[object, np.ndarray]]:
        """(value, indices of the rows holding it, ascending) for each value some row holds."""
        return [
            (value, rows)
            for code, value in enumerate(self.values)
            if len(rows := np.flatnonzero(self.codes == code))
        ]

    def strings(self) -> np.ndarray:
        """The rows' values as a numpy object array."""
        return np.array([*self.values, None], dtype=object)[:-1][self.codes]


def factorize(values) -> tuple[np.ndarray, np.ndarray]:
    """Each value's index into the distinct values in the order they first occur, and those
    values: what :func:`pandas.factorize` returns (its defaults), in numpy.

    ``values`` is flattened (row-major). Missing values (NaN; None in an object column) get
    code -1 and are not among the distinct values; 0.0 and -0.0 are one value, the first one
    seen is kept. Codes are ``np.intp``; the distinct values keep the column's dtype.
    Integers (and booleans) go through a lookup table when their range is a few times the
    row count, else a radix sort of their rows by value, then row; floats are sorted;
    strings and objects are hashed (a dict over the distinct values)."""
    values = np.asarray(values).reshape(-1)
    if values.dtype.kind in "OSU":
        return _factorize_objects(values)
    if values.dtype.kind in "fc":
        present = ~np.isnan(values)
        if not present.all():
            rows = np.flatnonzero(present)
            codes = np.full(len(values), -1, dtype=np.intp)
            codes[rows], uniques = _factorize_numbers(values[rows])
            return codes, uniques
    return _factorize_numbers(values)


def _factorize_objects(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`factorize` of strings or Python objects: hashed by a dict (equal objects, equal
    codes, as Python compares them); None and NaN are missing. A column holding one value
    (a setting every row shares) is only compared with it."""
    items = values.tolist()
    one_value = bool(items) and items.count(items[0]) == len(items)
    code_of = dict.fromkeys(items[:1] if one_value else items)  # in the order they first occur
    kept = []
    for value in code_of:  # one pass over the distinct values, not the rows
        missing = value is None or value != value  # NaN is the one value unequal to itself
        code_of[value] = -1 if missing else len(kept)
        if not missing:
            kept.append(value)
    if one_value:
        codes = np.full(len(items), code_of[items[0]], dtype=np.intp)
    else:
        codes = np.fromiter(map(code_of.__getitem__, items), dtype=np.intp, count=len(items))
    if values.dtype.kind == "O":  # fromiter: tuples stay objects (np.array would unpack them)
        return codes, np.fromiter(kept, dtype=object, count=len(kept))
    return codes, np.array(kept, dtype=values.dtype)


def _factorize_numbers(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`factorize` of numbers without NaN: each distinct value's first row and each
    row's distinct value (numbered in any order), then renumbered in the order of first rows."""
    if not len(values):
        return np.zeros(0, dtype=np.intp), values.copy()
    if values.dtype.kind in "biu":
        first, group = _first_rows_of_integers(values)
    else:  # a stable sort: the first of equal values is its first row
        _, first, group = np.unique(values, return_index=True, return_inverse=True)
    if 16 * len(first) > len(values):  # many values: first rows marked, counted, no sort
        is_first = np.zeros(len(values), dtype=bool)
        is_first[first] = True
        code_of_group = np.cumsum(is_first, dtype=np.intp)[first] - 1
        return code_of_group[group], values[is_first]
    by_first_row = np.argsort(first)
    code_of_group = np.empty(len(first), dtype=np.intp)
    code_of_group[by_first_row] = np.arange(len(first))
    return code_of_group[group], values[first[by_first_row]]


def _first_rows_of_integers(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each distinct integer's first row and each row's distinct integer (ascending): a
    table over their range when it is a few times the row count, else the rows ordered by
    value, then row (:func:`_value_then_row_order`)."""
    count = len(values)
    wide = values.astype(np.uint64 if values.dtype.kind == "u" else np.int64, copy=False)
    low = wide.min()
    span = int(wide.max()) - int(low)
    if span <= 4 * count + 1024:  # a table: no sort
        offsets = (wide - low).astype(np.intp)  # exact: the span is small
        first = np.full(span + 1, count, dtype=np.intp)
        np.minimum.at(first, offsets, np.arange(count))
        held = np.flatnonzero(first < count)
        group_of_offset = np.empty(span + 1, dtype=np.intp)
        group_of_offset[held] = np.arange(len(held))
        return first[held], group_of_offset[offsets]
    offsets = (wide - low).view(np.uint64)  # exact modulo 2**64, and below it
    rows = _value_then_row_order(offsets, span)
    ordered = offsets[rows]
    del offsets  # each temporary here is one 8-byte word per row: released when read
    starts = np.empty(count, dtype=bool)
    starts[0] = True
    np.not_equal(ordered[1:], ordered[:-1], out=starts[1:])
    del ordered
    rank = np.cumsum(starts, dtype=np.intp)
    rank -= 1
    group = np.empty(count, dtype=np.intp)
    group[rows] = rank
    del rank
    return rows[starts], group


def _value_then_row_order(offsets: np.ndarray, span: int) -> np.ndarray:
    """The rows of ``offsets`` (unsigned, at most ``span``) by value, then row: a radix sort,
    16 bits a pass from the lowest (each pass numpy's stable sort of 16-bit keys, itself a
    radix sort), so a key of up to 32 bits takes two linear passes, not a comparison sort."""
    rows = None
    shift = 0
    while rows is None or span >> shift:
        digit = ((offsets >> np.uint64(shift)) & np.uint64(0xFFFF)).astype(np.uint16)
        rows = (
            np.argsort(digit, kind="stable")
            if rows is None
            else rows[np.argsort(digit[rows], kind="stable")]
        )
        shift += 16
    return rows


def coded(index: np.ndarray, count: int) -> Labels:
    """A column of indices into ``count`` things (a table's rows) as labels, their codes
    int32 where the count allows (a search's millions of rows hold several such columns)."""
    return Labels(narrow_codes(index, count), range(count))


def code_dtype(count: int) -> np.dtype:
    """The dtype of indices below ``count``: int32 where they fit in it, else int64."""
    return np.dtype(np.int32 if count <= 2**31 - 1 else np.int64)


def narrow_codes(codes: np.ndarray, count: int) -> np.ndarray:
    """Codes below ``count`` in :func:`code_dtype` (no copy where they already are)."""
    return codes.astype(code_dtype(count), copy=False)


def _codes(column) -> tuple[np.ndarray, int]:
    """Integer codes of the rows' values (equal values, equal codes) and a bound on them.

    Labels bring their codes; small non-negative integers (and booleans) are their own
    codes; larger ones are looked up in a table as long as their range (no hashing, no
    sort); anything else is factorized (:func:`factorize`)."""
    if isinstance(column, Labels):
        return column.codes, len(column.values)
    values = np.asarray(column).reshape(-1)
    if values.dtype.kind in "biu" and len(values):
        low, high = int(values.min()), int(values.max())
        if low >= 0 and high < 64:
            return values, high + 1
        if low >= 0 and high <= 4 * len(values) + 1024:
            present = np.zeros(high + 1, dtype=bool)
            present[values] = True
            uniques = np.flatnonzero(present)
            lookup = np.zeros(high + 1, dtype=np.int64)
            lookup[uniques] = np.arange(len(uniques))
            return lookup[values], len(uniques)
    codes, uniques = factorize(values)
    return codes, len(uniques)


def _compressed(key: np.ndarray, size: int) -> tuple[np.ndarray, int]:
    """Each row's index into the distinct values of ``key`` (integers below ``size``), and
    how many there are: a lookup table when ``size`` is small, else :func:`factorize`."""
    if size <= 4 * len(key) + 1024:  # a table: no hashing, no sort
        present = np.zeros(size, dtype=bool)
        present[key] = True
        unique_keys = np.flatnonzero(present)
        del present
        # The table as narrow as its indices allow (it may hold 4× the rows' entries).
        lookup = np.zeros(size, dtype=code_dtype(len(unique_keys)))
        lookup[unique_keys] = np.arange(len(unique_keys))
        return lookup[key].astype(np.int64, copy=False), len(unique_keys)
    inverse, unique_keys = factorize(key)
    return inverse.astype(np.int64, copy=False), len(unique_keys)


def distinct_rows(*columns) -> tuple[np.ndarray, np.ndarray]:
    """One row holding each distinct value tuple of the columns, and each row's index into
    those rows (work done on them is broadcast back by it)."""
    key, size = None, 1
    for column in columns:
        codes, bound = _codes(column)
        bound = max(bound, 1)
        if key is None:
            key, size = codes.astype(np.int64, copy=False), bound
            continue
        if size * bound > 4 * len(key) + 1024:  # renumber first: keys stay table-sized
            key, size = _compressed(key, size)
        key, size = key * bound + codes, size * bound
    inverse, count = _compressed(key, size)
    chosen = np.zeros(count, dtype=np.int64)
    chosen[inverse] = np.arange(len(inverse), dtype=code_dtype(len(inverse)))
    return chosen, inverse


def unique_rows(*columns) -> tuple[list[tuple], np.ndarray]:
    """Distinct value tuples of the given columns and each row's index into them.

    Each column is turned into integer codes first, so strings cost no more than ints."""
    chosen, inverse = distinct_rows(*columns)
    values = [
        column[chosen].strings()
        if isinstance(column, Labels)
        else np.asarray(column).reshape(-1)[chosen]
        for column in columns
    ]
    return list(zip(*(v.tolist() for v in values), strict=True)), inverse

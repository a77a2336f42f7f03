"""String columns as integer codes: each row's index into the column's distinct values.

The search's string columns (schedule, recompute policy, layer split) hold a handful of
distinct values over 10^5 rows or more; hashing such a column costs more than a numpy
operation on an integer column, and the evaluation asks about each column many times.
:class:`Labels` hashes a column once (or takes the codes the search built it from) and
answers those questions — which rows hold one of these values, the rows of each value, the
value every row holds — from the codes. Its rows are the plain strings again on demand.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd


@dataclass(frozen=True, eq=False)
class Labels:
    """A string column: ``values[codes[i]]`` is row ``i``'s value."""

    codes: np.ndarray  # int64, one per row
    values: tuple  # the distinct values (some may be held by no row after a selection)

    @classmethod
    def of(cls, column) -> Labels:
        """The column as labels (a column already coded is returned as it is)."""
        if isinstance(column, Labels):
            return column
        codes, uniques = pd.factorize(np.asarray(column).reshape(-1))
        return cls(codes.astype(np.int64), tuple(uniques.tolist()))

    def __len__(self) -> int:
        return len(self.codes)

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

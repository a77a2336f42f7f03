"""Rows of layouts as typed columns under the :class:`planner.spec.layout.Layout` field names.

The search hands the evaluation a dict of columns named like the layout's fields (``tp``,
``micro_batch_size``, ``zero_stage``, …); :meth:`LayoutColumns.of` checks and converts them
once (integers as int64 without copies, sequence parallelism only with TP, string columns as
:class:`planner.columns.codes.Labels`) and adds the groups every model reads (the ZeRO group
``dp·cp``, the expert-data-parallel group). The evaluation then adds each row's index into
the distinct tables it builds (:meth:`LayoutColumns.index`), so that every model reads one
typed object whose names are the user's.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from planner.columns.codes import Labels
from planner.spec.layout import (
    cp_algorithm_codes,
    expert_data_parallel_size,
    resolved_etp,
    sequence_parallel_column,
    zero_group_size,
)

#: Integer layout fields, in :class:`planner.spec.layout.Layout` order (etp apart: it may be
#: absent, meaning tp).
INT_FIELDS = ("tp", "cp", "pp", "dp", "ep", "vpp", "micro_batch_size", "num_microbatches",
              "zero_stage")  # fmt: skip
#: String layout fields, travelling as codes.
LABEL_FIELDS = ("schedule", "recompute", "pipeline_layer_split")
#: Each row's indices into the evaluation's tables (:meth:`LayoutColumns.index`).
TABLE_INDICES = ("shape", "structure", "held", "paced", "states", "buffers",
                 "data_parallel_form")  # fmt: skip


class TableIndexed:
    """Rows that carry their indices into the evaluation's tables (:data:`TABLE_INDICES`,
    attributes None until set)."""

    def table_indices(self, rows) -> dict:
        """The selected rows' table indices (those set), as :meth:`index` takes them."""
        return {name: value[rows] for name in TABLE_INDICES
                if (value := getattr(self, name)) is not None}  # fmt: skip

    def index(self, **tables: Labels | np.ndarray) -> None:
        """Record each row's index into the evaluation's tables (``shape=…``, …)."""
        for name, value in tables.items():
            if name not in TABLE_INDICES:
                raise AttributeError(f"no table index {name!r}")
            setattr(self, name, value)


@dataclass(eq=False)
class LayoutColumns(TableIndexed):
    """One entry per row of layouts, for every layout field and the groups derived from them.

    The table indices (``shape`` … ``data_parallel_form``) are None until the evaluation
    builds its tables (:func:`planner.evaluate.indices.row_tables`)."""

    tp: np.ndarray
    cp: np.ndarray
    pp: np.ndarray
    dp: np.ndarray
    ep: np.ndarray
    etp: np.ndarray  # the routed experts' TP degree (resolved: tp where not given)
    vpp: np.ndarray
    micro_batch_size: np.ndarray
    num_microbatches: np.ndarray
    zero_stage: np.ndarray
    sequence_parallel: np.ndarray  # bool, and only where tp > 1
    schedule: Labels
    recompute: Labels
    pipeline_layer_split: Labels
    #: The context-parallel algorithm, as its index in planner.spec.layout.CP_ALGORITHMS
    #: (int8; all-gather where the columns leave it out).
    cp_algorithm: np.ndarray
    #: Hierarchical CP's inner degree (0: the CP ranks of one scale-up domain, and on the
    #: other algorithms' rows).
    cp_inner: np.ndarray
    zero_group_size: np.ndarray  # dp·cp: the ranks that shard ZeRO states and reduce gradients
    expert_data_parallel_size: np.ndarray  # the routed experts' data-parallel group
    # Each row's index into the evaluation's tables (set by it):
    shape: Labels | None = None  # per-layer times and activation bytes
    structure: Labels | None = None  # what each pipeline rank holds
    held: Labels | None = None  # distinct (structure, shape, micro-batches): activations
    paced: Labels | None = None  # held and the DP wrapper: the pipeline's pace
    states: Labels | None = None  # distinct (structure, ZeRO stage, ZeRO group)
    #: distinct communication-buffer fields (planner.evaluate.memory.BUFFER_FIELDS)
    buffers: Labels | None = None
    data_parallel_form: np.ndarray | None = None  # the DP wrapper (planner.evaluate.time)

    @classmethod
    def of(cls, columns: dict) -> LayoutColumns:
        """The layout columns a caller gives (named as :class:`Layout`'s fields; ``etp``
        optional), checked and converted once."""
        missing = [k for k in (*INT_FIELDS, "sequence_parallel", *LABEL_FIELDS) if k not in columns]
        if missing:
            raise KeyError(f"layout columns lack {', '.join(missing)}")
        # No copies of columns already int64 (the search's are): 10^7 rows cost 80 MB a column.
        ints = {k: np.asarray(columns[k]).astype(np.int64, copy=False) for k in INT_FIELDS}
        tp, cp, dp, ep = (ints[k] for k in ("tp", "cp", "dp", "ep"))
        etp = resolved_etp(columns.get("etp"), tp)
        return cls(
            **ints,
            etp=etp,
            sequence_parallel=sequence_parallel_column(columns["sequence_parallel"], tp),
            **{k: Labels.of(columns[k]) for k in LABEL_FIELDS},
            cp_algorithm=np.asarray(
                cp_algorithm_codes(columns.get("cp_algorithm"), tp.shape), dtype=np.int8
            ),
            cp_inner=_inner_column(columns.get("cp_inner"), tp.shape),
            zero_group_size=zero_group_size(dp, cp),
            expert_data_parallel_size=expert_data_parallel_size(dp, cp, tp, ep, etp),
        )

    def __len__(self) -> int:
        return len(self.tp)

    def columns(self, *names: str) -> tuple:
        """The named columns, in that order."""
        return tuple(getattr(self, name) for name in names)

    def take(self, rows) -> LayoutColumns:
        """The selected rows (an index array or a boolean mask), table indices included."""
        return dataclasses.replace(
            self,
            **{
                field.name: value[rows]
                for field in dataclasses.fields(self)
                if (value := getattr(self, field.name)) is not None
            },
        )

    def block(self, rows) -> LayoutColumns:
        """The selected rows as the evaluation's models read them (:meth:`take`; a search's
        factored rows write theirs out, :meth:`planner.columns.expanded.ExpandedRows.block`)."""
        return self.take(rows)


def _inner_column(column, shape) -> np.ndarray:
    """Hierarchical CP's inner degree per row as int64, 0 where unset (None)."""
    if column is None:
        return np.zeros(shape, dtype=np.int64)
    values = np.asarray(column)
    if values.dtype == object:
        values = np.array([0 if v is None else int(v) for v in values.ravel()]).reshape(shape)
    return np.broadcast_to(values.astype(np.int64, copy=False), shape)

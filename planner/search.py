"""Screen every layout as numpy columns, filter, evaluate all rows at once, rank.

The candidates and the rules that empty rows come from :mod:`planner.candidates`; each
rejected row is counted under the first rule it fails, and rows whose CP algorithm another
beats on the same layout are not timed (:mod:`planner.cp_search`). The survivors, each
under every ZeRO stage and recompute policy, are kept factored over them
(:class:`planner.columns.expanded.ExpandedRows`: no layout column is written out for every
row) and evaluated by :func:`planner.evaluate.screen_columns`, rows that do not fit in
``HBM × (1 − mem_headroom)`` are rejected, and the rest are ranked under the model's error,
the top rows re-timed by the event simulator (:mod:`planner.rank`, :mod:`planner.refine`).
The ranked rows are kept as columns; pandas is imported only when they are asked for as a
DataFrame (:attr:`SearchResult.table`: the CSV and the plan page), not by a plan that prints.
"""

from __future__ import annotations

import dataclasses
from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from hwspecs.schema import Cluster
from planner.candidates import (
    SearchSpace,
    expand_index,
    first_rejections,
    grid_columns,
    screening_grid,
)
from planner.columns.codes import Labels
from planner.columns.expanded import ExpandedRows
from planner.cost.memory import DEFAULT_MEM_HEADROOM, usable_memory_bytes
from planner.cp_search import (
    CP_DOMINATED,
    dominated_cp_rows,
)
from planner.evaluate import FULL_PRECISION_OUTPUTS, in_output_order, screen_columns
from planner.evaluate.indices import shapes_beside
from planner.progress import report
from planner.rank import RankSettings, over_every_row, rank_order
from planner.refine import DEFAULT_REFINE_TOP
from planner.spec.job import Job
from planner.spec.layout import Layout

if TYPE_CHECKING:
    import pandas as pd

GIB = 2**30
OBJECTIVES = ("step_time", "memory", "mfu", "time_to_train")
LAYOUT_COLUMNS = (
    "tp",
    "cp",
    "pp",
    "dp",
    "ep",
    "etp",
    "vpp",
    "micro_batch_size",
    "num_microbatches",
    "schedule",
    "zero_stage",
    "recompute",
    "sequence_parallel",
    "cp_algorithm",
    "cp_inner",
    "pipeline_layer_split",
)


class SearchResult(BaseModel):
    """Feasible rows ranked, with counts of what was screened and why rows were rejected.

    ``columns``: the ranked rows, best first, one numpy array per column (string columns and
    the ranking's ``preference`` as :class:`planner.columns.codes.Labels`); empty when no row
    was screened. A search with ``only_top`` ranks the first rows only (every row faster
    than its reach); ``feasible`` counts every row that fits all the same. :meth:`top_rows`
    and :meth:`column` read them; :attr:`table` is them as a pandas DataFrame, built (and
    pandas imported) when first read."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    candidates_evaluated: int
    feasible: int
    rejected: dict[str, int]
    columns: dict[str, Any] = Field(default_factory=dict, repr=False)
    smallest_memory: dict | None = None

    def column(self, key: str) -> np.ndarray | Labels:
        """One column of the ranked rows, in rank order."""
        return self.columns[key]

    def top_rows(self, count: int) -> list[dict]:
        """The first ``count`` ranked rows as dicts of plain Python values (strings as str),
        as ``table.head(count).to_dict("records")`` gives them."""
        head = {
            key: (value[:count].strings() if isinstance(value, Labels) else value[:count]).tolist()
            for key, value in self.columns.items()
        }
        return [dict(zip(head, row, strict=True)) for row in zip(*head.values(), strict=True)]

    @cached_property
    def table(self) -> pd.DataFrame:
        """The ranked rows as a DataFrame: labels as strings, ``preference`` a categorical of
        :data:`planner.rank.PREFERENCES` (no row screened: the layout columns, empty)."""
        import pandas as pd

        if not self.columns:
            return pd.DataFrame(columns=LAYOUT_COLUMNS)
        frame = {}
        for key, value in self.columns.items():
            if key == "preference":
                value = pd.Categorical.from_codes(value.codes, categories=value.values)
            elif isinstance(value, Labels):
                value = value.strings()
            frame[key] = value
        return pd.DataFrame(frame, copy=False)  # one block per column: no stacking copy


def search(
    job: Job,
    cluster: Cluster,
    accelerator,
    gpus: int,
    space: SearchSpace | None = None,
    objective: str = "step_time",
    mem_headroom: float = DEFAULT_MEM_HEADROOM,
    order=None,
    mfu_dtype: str = "bf16",
    progress=None,
    refine_top: int = DEFAULT_REFINE_TOP,
    training=None,
    rank_settings: RankSettings | None = None,
    every_output: bool = True,
    only_top: int | None = None,
) -> SearchResult:
    """Screen, evaluate and rank every layout of ``job`` on the first ``gpus`` of ``cluster``;
    the first ``refine_top`` rows are re-timed by the event simulator (:mod:`planner.refine`)
    and ``rank_settings`` (:class:`planner.rank.RankSettings`; None: by time) orders the rows.

    With ``training`` (a :class:`planner.cost.goodput.TrainingRun`) every row gains
    ``expected_wall_time_s`` and ``goodput`` (:func:`planner.cost.goodput.
    time_to_train_columns`), which objective ``time_to_train`` ranks by. Without
    ``every_output`` the table holds the layout, the ranking's columns and
    :data:`planner.evaluate.FULL_PRECISION_OUTPUTS` only (what the search ranks by and the
    event simulator reads: a plan that writes no table; the rows and their order are the
    same).

    ``only_top`` (the step-time objective): the caller reads the first ``only_top`` ranked
    rows only. The rows that cannot be among them, tie with the fastest or be simulated are
    then neither timed nor ranked: :func:`reach_of` says how far the ranking can reach, and
    the screen times the rows whose step-time floor is within it. The result's rows are the
    first rows of the whole ranking, with the same values (every row faster than the
    bound), and ``feasible`` still counts every row that fits."""
    space = space or SearchSpace()
    report(progress, "enumerating layouts", 0, 0)  # how many: not known before
    whole_grid = screening_grid(job, cluster, gpus, space, order)
    copies = len(space.zero_stage) * len(space.recompute)  # rows per grid cell
    total = len(whole_grid) * copies
    rejected: dict[str, int] = {}
    reasons, first = first_rejections(job, cluster, whole_grid, space)
    for reason, count in zip(reasons, np.bincount(first, minlength=len(reasons)), strict=False):
        if count:  # two rules may share a reason
            rejected[reason] = rejected.get(reason, 0) + int(count) * copies
    alive = np.flatnonzero(first == len(reasons))
    del first
    grid = grid_columns(job, whole_grid, alive)  # the rows no rule rejects, written out
    beaten = dominated_cp_rows(job, cluster, order, grid, np.ones(len(alive), dtype=bool))
    if beaten.any():  # same layout, faster CP
        rejected[CP_DOMINATED] = int(beaten.sum()) * copies
        grid = {key: value[~beaten] for key, value in grid.items()}
        alive = alive[~beaten]
    ahead = None  # the rows' tables, started from the grid (the shapes on a thread beside)
    split = space.pipeline_layer_split
    if len(alive):
        ahead, codes = shapes_beside(job, accelerator, grid, space.recompute, split)
        grid.update(codes)  # read at each row's grid row
    # The rows, factored: each a grid row under a ZeRO stage and a recompute policy.
    cells = whole_grid.cells[alive]
    cols = ExpandedRows(grid, *expand_index(cells, whole_grid.shape, space), split)
    del whole_grid, alive, cells
    report(progress, "enumerating layouts", total, total)
    usable = usable_memory_bytes(accelerator.hbm_bytes, mem_headroom)
    screened = None  # rows that do not fit are not timed
    if len(cols):
        # The screen indexes its own copy of the rows into its tables: those indices (a
        # column each, as long as the rows) go when it has taken the rows to time, not
        # at the end of the search, which reads layout columns only.
        screened = screen_columns(
            job, cluster, accelerator, dataclasses.replace(cols), usable, order, mfu_dtype,
            memory_parts_of_timed_rows=True, progress=progress, compact=True,
            outputs=None if every_output else FULL_PRECISION_OUTPUTS,
            reach=reach_of(only_top, refine_top, rank_settings) if objective == "step_time"
            and only_top is not None else None, shapes_ahead=ahead,
        )  # fmt: skip
    smallest = None  # the smallest placeable row that does not fit
    columns, feasible = {}, 0  # the ranked rows (none screened: none)
    if screened:
        memory_out, placeable, rows, timed, bound_s, timed_rows = screened
        report(progress, "ranking", 0, len(rows))
        del screened
        memory = memory_out["memory_per_gpu_bytes"]
        too_big = np.flatnonzero(placeable & (memory > usable))
        if len(too_big):
            best = _smallest(memory, too_big)
            smallest = {
                **{k: _plain(cols.column(k, [best])[0]) for k in LAYOUT_COLUMNS},
                "memory_per_gpu_bytes": float(memory[best]),
            }
        placeable = placeable.copy()  # as evaluate_columns reports it: the timed rows' own
        placeable[rows if timed_rows is None else rows[timed_rows]] = timed["valid"]
        if not placeable.all():
            rejected["cannot be placed on the cluster"] = int((~placeable).sum())
        too_big = placeable & (memory > usable)  # none of them timed
        if too_big.any():
            rejected[f"does not fit in {usable / GIB:.1f} GiB per GPU"] = int(too_big.sum())
        # Kept rows (placeable and fitting) are rows to time, those still placeable: read
        # at their place among the timed rows (``timed_at``: the timed outputs), among the
        # rows to time (``at``: the other memory outputs) and among all rows (``kept``:
        # memory per GPU and the layout columns).
        at = timed_at = np.flatnonzero(placeable[rows])
        kept = rows[at]
        feasible = len(kept)
        merged = in_output_order(timed, memory_out)

        def kept_rows(key: str, positions: tuple | None = None) -> np.ndarray:
            """A kept column in the kept rows' order, or at ``positions`` of it (the
            triple ``timed_at[p], at[p], kept[p]``)."""
            timed_at_p, at_p, kept_p = (timed_at, at, kept) if positions is None else positions
            if key == "memory_per_gpu_bytes":
                return np.take(memory_out[key], kept_p)
            if key in timed:
                return np.take(timed[key], timed_at_p)
            if key in memory_out:
                return np.take(memory_out[key], at_p)
            return cols.column(key, kept_p)  # a layout column (every other: timed or memory)

        every_feasible = kept  # every feasible row (the preference rules read layout columns)
        reached = None  # the ranked rows among them (None: all)
        if timed_rows is not None:  # only the rows within reach were timed, and are ranked
            timed_at = np.searchsorted(timed_rows, at)
            reached = timed_at < len(timed_rows)
            reached[reached] = timed_rows[timed_at[reached]] == at[reached]
            reached[reached] = timed["step_time_s"][timed_at[reached]] <= bound_s
            kept, at, timed_at = kept[reached], at[reached], timed_at[reached]

        def every_row() -> tuple:
            """:func:`planner.rank.over_every_row` of every feasible row, at the ranked; the
            rows sharing its columns found from the grid's (:meth:`ExpandedRows.distinct_codes`)."""
            feasible_rows = cols.take(every_feasible)  # each grid row read once, factored
            least_pp, least_cp, tp_max = over_every_row(
                feasible_rows.column, feasible_rows.distinct_codes
            )
            if reached is None:
                return least_pp, least_cp, tp_max
            return least_pp[reached], least_cp[reached], tp_max

        extra = {}  # the time to train of each kept row (with a token budget)
        if training is not None:
            needed = ("step_time_s", "tokens_per_s_per_gpu", "checkpoint_bytes_per_rank")
            extra = _time_to_train_columns({k: kept_rows(k) for k in needed}, gpus, job, training)
        present = (*timed, *memory_out, *merged, *LAYOUT_COLUMNS, *extra)
        ranking = _ranking(
            {k: extra[k] if k in extra else kept_rows(k) for k in RANKING_COLUMNS if k in present},
            objective,
        )
        names = tuple(dict.fromkeys((*LAYOUT_COLUMNS, *merged)))

        def records(positions: list[int]) -> list[dict]:
            """Kept rows (positions) as plain dicts, for the event simulator."""
            where = np.asarray(positions, dtype=np.int64)
            found = {
                key: kept_rows(key, (timed_at[where], at[where], kept[where])) for key in names
            }
            found.update({key: value[positions] for key, value in extra.items()})
            return [{key: _plain(value[i]) for key, value in found.items()}
                    for i in range(len(positions))]  # fmt: skip

        def column(key: str) -> np.ndarray | Labels:
            return kept_rows(key)  # string columns as codes

        report(progress, "ranking", len(rows), len(rows))
        count = min(refine_top, len(kept))
        report(progress, "simulating the top rows", 0, count)
        order, added = rank_order(
            job, accelerator, column, records, ranking, refine_top, objective, rank_settings,
            cluster.scale_up_domain_size, usable, lambda row: layout_of_row(row, job.model.is_moe),
            every_row,
        )  # fmt: skip
        report(progress, "simulating the top rows", count, count)
        # Each column taken once, in the final order, and the evaluated ones released; string
        # columns stay labels (strings only in the DataFrame).
        final = timed_at[order], at[order], kept[order]
        for key in names:
            columns[key] = kept_rows(key, final)
            for source in (timed, merged, memory_out):
                source.pop(key, None)
        columns.update({key: value[order] for key, value in extra.items()})
        del memory_out, merged, cols
        columns.update(added)
    return SearchResult(
        candidates_evaluated=total,
        feasible=feasible,
        rejected=rejected,
        columns=columns,
        smallest_memory=smallest,
    )


def reach_of(only_top: int, refine_top: int, settings: RankSettings | None) -> tuple[int, float]:
    """(n, band): a ranking whose first ``only_top`` rows are read reaches no row slower than
    ``1 + band`` times the n-th fastest closed-form step (:func:`planner.evaluate.
    screen_columns`' ``reach``).

    At most ``2·refine_top`` rows are simulated (:func:`planner.rank.rank_order`), so the
    fastest effective step is at most the ``2·refine_top + 1``-th fastest closed form and
    every tie within ``1 + band`` of it. A row read outside the ties has fewer than
    ``only_top`` rows outside them above it, and fewer than ``only_top`` ties: it is among
    the first ``2·only_top`` by time (the simulated head re-ordered among the first
    ``refine_top``), and so is a row simulated by the second pass. Rows slower than that
    bound come after all of these, in time order, whatever the ranking."""
    band = settings.band if settings is not None and settings.band is not None else 0.0
    return 2 * refine_top + 2 * only_top + 1, band


def layout_of_row(row: dict, is_moe: bool) -> Layout:
    """The :class:`Layout` of one row of the search table (etp unset on a dense model)."""
    fields = {key: row[key] for key in LAYOUT_COLUMNS}
    fields = {k: (v.item() if hasattr(v, "item") else v) for k, v in fields.items()}
    fields["num_microbatches"] = int(fields["num_microbatches"])
    if fields["cp_algorithm"] != "hierarchical":  # the inner degree of hierarchical CP only
        fields["cp_inner"] = None
    if not is_moe:  # no routed experts: etp stays unset (tp)
        fields["etp"] = None
    return Layout(**fields)


RANKING_KEYS = {  # objective: (columns, ascending), ties broken by the later columns
    "step_time": (("step_time_s", "memory_per_gpu_bytes"), (True, True)),
    "memory": (("memory_per_gpu_bytes", "step_time_s"), (True, True)),
    "mfu": (("mfu", "memory_per_gpu_bytes"), (False, True)),
    "time_to_train": (("expected_wall_time_s", "memory_per_gpu_bytes"), (True, True)),
}
#: Every column an objective reads.
RANKING_COLUMNS = tuple(dict.fromkeys(name for names, _ in RANKING_KEYS.values() for name in names))


def _ranking(columns: dict[str, np.ndarray], objective: str) -> np.ndarray:
    """Row order by the objective: a stable sort (equal rows keep their order).

    The first key is sorted alone (quicksort); rows it ties are then put in the order of
    the later keys and their own (a stable lexicographic sort of those rows only)."""
    names, ascending = RANKING_KEYS[objective]
    keys = [columns[n] if up else -columns[n] for n, up in zip(names, ascending, strict=True)]
    order = np.argsort(keys[0])
    first = keys[0][order]
    tied = (first[1:] == first[:-1]) | (np.isnan(first[1:]) & np.isnan(first[:-1]))
    if tied.any():  # positions in a run of equal first keys, and those rows, ascending
        at = np.flatnonzero(np.concatenate([tied, [False]]) | np.concatenate([[False], tied]))
        rows = np.sort(order[at])
        order[at] = rows[np.lexsort([key[rows] for key in keys[::-1]])]
    return order


def _time_to_train_columns(columns: dict, gpus: int, job: Job, training) -> dict:
    """Expected wall time of the token budget and goodput per row (failures included)."""
    from planner.cost.goodput import time_to_train_columns

    step = columns["step_time_s"]
    batch = job.global_batch_tokens or columns["tokens_per_s_per_gpu"] * gpus * step
    found = time_to_train_columns(step, columns["checkpoint_bytes_per_rank"], gpus, batch, training)
    return {"expected_wall_time_s": found["wall_time_s"], "goodput": found["goodput"]}


def _smallest(memory: np.ndarray, rows: np.ndarray) -> int:
    """The first of the rows of ``rows`` needing least memory (in the search's row order:
    a choice among equals that no sort algorithm, and so no CPU, decides)."""
    at = memory[rows]
    return int(rows[np.flatnonzero(at == at.min())[0]])


def _plain(value):
    return value.item() if hasattr(value, "item") else value

"""Where practitioners' published layouts rank when the planner chooses for their jobs.

Each published run names a job (model, accelerator, GPU count, sequence length, batch,
precision, stack) and the layout its authors chose for it. Searching the whole layout space
for that job — nothing pinned but what the job itself fixes — and finding the published
degrees in the ranking says how often the model agrees with the people who ran it: the
published layout first, inside the equivalent set (within the profile's ratio band of the
fastest), or how much slower the model predicts it. Published layouts are not proven
optimal, so a miss is a disagreement to read, not an error to fit; and the profiles were
fitted on these same runs, so this is an in-sample check of the ranking (the Llama 3 and
DeepSeek-V3 targets are the held-out one). Memory is judged as for a run that ran
(``mem_headroom`` 0, as ``runs check`` does).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from pydantic import BaseModel

from hwspecs.catalog import load_accelerator
from hwspecs.runs import RunRow
from planner.candidates import SearchSpace
from planner.rank import RankSettings, effective_step_time
from planner.runs.placement import run_cluster
from planner.runs.profiles import profile_for
from planner.runs.rows import model_spec, run_job, stack_label
from planner.runs.uncovered import Uncovered
from planner.search import search

#: The degrees compared; a degree the run does not publish matches any value.
DEGREES = ("tp", "cp", "pp", "dp", "ep")


class PublishedLayoutRank(BaseModel):
    """One job's search and where its published degrees stand in it."""

    id: str
    accelerator: str
    num_gpus: int
    #: The degrees the run publishes (None: not published, any value matches).
    published: dict[str, int | None]
    #: The first ranked row holding the published degrees (1 = the plan's choice); None
    #: when no feasible layout holds them.
    rank: int | None
    #: Whether a row holding them lies within the band of the fastest.
    equivalent_to_best: bool
    #: Their fastest row's step time over the fastest row's, minus 1.
    slower: float | None
    band: float | None
    winner: dict[str, int]
    #: The rule that placed the winner (:data:`planner.rank.PREFERENCES`).
    preference: str


def layout_job_key(row: RunRow) -> tuple:
    """What a run's authors chose a layout for: model, accelerator, GPUs, sequence, batch,
    precision as published, task and stack (rows of several releases of one job share it).
    Not :func:`planner.runs.check.job_key`, the job two layouts are compared on, which
    leaves the GPUs, batch and accelerator free."""
    t = row.training
    return (row.model.name, row.hardware.accelerator, row.hardware.num_gpus, t.seq_len,
            t.global_batch_tokens, t.precision, t.task, stack_label(row))  # fmt: skip


def one_row_per_job(rows: list[RunRow]) -> list[RunRow]:
    """The first row of each :func:`layout_job_key`, in the rows' order."""
    kept: dict[tuple, RunRow] = {}
    for row in rows:
        kept.setdefault(layout_job_key(row), row)
    return list(kept.values())


def published_layout_rank(
    row: RunRow, settings_of: Callable[..., RankSettings], use_layout_range: bool = True
) -> PublishedLayoutRank | None:
    """Search the whole layout space for ``row``'s job under its shipped profile (for its
    stack) and rank as ``plan`` does (``settings_of(accelerator, profile, seq_len)``: the
    :class:`planner.rank.RankSettings`; ``use_layout_range`` False: without rule 0). None
    when the row is not expressible or nothing fits."""
    try:
        model = model_spec(row)
        cluster, job = run_cluster(row), run_job(row, model)
    except Uncovered:
        return None
    profile = profile_for(row.hardware.accelerator, None, stack_label(row))
    job = job.model_copy(update={"efficiency_profile": profile})
    settings = settings_of(row.hardware.accelerator, profile, job.seq_len)
    if not use_layout_range:
        settings = settings.model_copy(update={"layout_range": None})
    accelerator = load_accelerator(cluster.accelerator)
    found = search(
        job, cluster, accelerator, row.hardware.num_gpus, SearchSpace(), mem_headroom=0.0,
        rank_settings=settings,
    )  # fmt: skip
    columns = found.columns
    if not columns or not len(columns["rank"]):
        return None
    published = {axis: getattr(row.training, axis) for axis in DEGREES}
    holds = np.ones(len(columns["rank"]), dtype=bool)
    for axis, degree in published.items():
        if degree is not None:
            holds &= columns[axis] == degree
    time_s = effective_step_time(columns)
    first = np.flatnonzero(holds)
    return PublishedLayoutRank(
        id=row.id,
        accelerator=row.hardware.accelerator,
        num_gpus=row.hardware.num_gpus,
        published=published,
        rank=int(columns["rank"][first[0]]) if len(first) else None,
        equivalent_to_best=bool(columns["equivalent_to_best"][holds].any()),
        slower=float(time_s[holds].min() / np.nanmin(time_s) - 1) if len(first) else None,
        band=settings.band,
        winner={axis: int(columns[axis][0]) for axis in DEGREES},
        preference=str(columns["preference"][0]),
    )


class LayoutRankSummary(BaseModel):
    """Published layouts of a set of jobs: how many the search ranks first, how many tie
    with its fastest, and how much slower the model predicts them (median, 80th
    percentile)."""

    name: str
    n: int
    first: int
    equivalent: int
    not_feasible: int
    median_slower: float | None
    p80_slower: float | None


def summarize_ranks(name: str, found: list[PublishedLayoutRank]) -> LayoutRankSummary:
    """:class:`LayoutRankSummary` of ``found``."""
    slower = np.array([f.slower for f in found if f.slower is not None])
    return LayoutRankSummary(
        name=name,
        n=len(found),
        first=sum(f.rank == 1 for f in found),
        equivalent=sum(f.equivalent_to_best for f in found),
        not_feasible=sum(f.rank is None for f in found),
        median_slower=float(np.median(slower)) if len(slower) else None,
        p80_slower=float(np.percentile(slower, 80)) if len(slower) else None,
    )

"""Published runs: ``runs check`` (predicted vs measured) and ``fit`` (a profile from them)."""

from __future__ import annotations

from pydantic import BaseModel

from hwspecs.errors import PlanError


def runs_check(
    runs: list[str] | None = None,
    source: str | None = None,
    accelerator: str | None = None,
    profile: str | None = None,
    limit: int | None = None,
    cluster: str | None = None,
):
    """Predict published runs with their layouts pinned; the error per source, accelerator
    and precision (see :mod:`planner.runs.check`).

    ``runs``: files or the shipped catalog (default: ``train``); ``source`` / ``accelerator``:
    keep rows whose source contains / accelerator is it; ``profile``: ``none`` (the ideal
    model), a profile TOML path, or ``auto`` / None for each row's accelerator's shipped
    profile for its stack; ``limit``:
    the first rows only (a quick sample); ``cluster``: the catalog cluster the rows that name
    none ran on (else each accelerator's reference cluster).
    """
    from hwspecs.catalog import load_runs
    from planner.runs.check import predict_row, summarize
    from planner.runs.profiles import profile_for
    from planner.runs.rows import stack_label

    names = runs or ["train"]
    rows = [row for name in names for row in load_runs(name)]
    if source:
        rows = [row for row in rows if source.lower() in row.source.lower()]
    if accelerator:
        rows = [row for row in rows if row.hardware.accelerator == accelerator]
    if limit:
        rows = rows[:limit]
    if not rows:
        raise PlanError("no runs match --source / --accelerator")
    if cluster:
        rows = [
            row if row.hardware.cluster else
            row.model_copy(update={"hardware": row.hardware.model_copy(update={"cluster": cluster})})
            for row in rows
        ]  # fmt: skip
    choice = None if profile in (None, "auto", "shipped") else profile
    predictions = [
        predict_row(row, profile_for(row.hardware.accelerator, choice, stack_label(row)))
        for row in rows
    ]
    return summarize(predictions, ", ".join(names), choice or "auto (each row's shipped)")


class FitReport(BaseModel):
    """``llmplan fit``: the fitted profile, its errors and the profile file's text."""

    fit: dict
    #: Rows left out because an ``exclude`` file lists them (test targets are never fitted on).
    excluded_rows: int
    uncovered: dict[str, int]
    profile_toml: str


def _fit_rows(
    runs: list[str] | None, accelerator: str, stack: str | None = None,
    left_out: set[str] = frozenset(),
) -> tuple[list, dict[str, int], int]:  # fmt: skip
    """The rows ``fit`` takes: ``accelerator``'s runs (of ``stack``) but those ``left_out``,
    predicted by the ideal model; (the covered ones, the others counted by reason, how many
    were left out). Fewer than 8 covered: an error naming the accelerator."""
    from hwspecs.catalog import load_runs
    from planner.runs.check import predict_row
    from planner.runs.rows import stack_label

    rows = [row for name in (runs or ["train"]) for row in load_runs(name)]
    rows = [row for row in rows if row.hardware.accelerator == accelerator]
    if stack:
        rows = [row for row in rows if stack_label(row) == stack]
    excluded = sum(row.id in left_out for row in rows)
    predictions = [predict_row(row) for row in rows if row.id not in left_out]
    covered = [p for p in predictions if p.covered]
    uncovered: dict[str, int] = {}
    for p in predictions:
        if not p.covered:
            uncovered[p.reason] = uncovered.get(p.reason, 0) + 1
    if len(covered) < 8:
        raise PlanError(
            f"--accelerator {accelerator}: {len(covered)} runs the model covers; a fit needs ≥ 8"
        )
    return covered, uncovered, excluded


def fit(
    runs: list[str] | None,
    accelerator: str,
    stack: str | None = None,
    command: str = "llmplan fit",
    exclude: list[str] | None = None,
) -> FitReport:
    """Fit ``accelerator``'s efficiency profile on runs (default: the shipped ``train``
    catalog). Rows listed in the ``exclude`` files (e.g. the test targets) are dropped and
    counted; the shipped catalog holds no target row."""
    import datetime

    from hwspecs.catalog import load_runs
    from planner.runs.fit import fit_profile, profile_toml

    left_out = {row.id for name in (exclude or []) for row in load_runs(name)}
    covered, uncovered, excluded = _fit_rows(runs, accelerator, stack, left_out)
    result = fit_profile(covered, accelerator, stack)
    date = datetime.date.today().isoformat()
    return FitReport(
        fit=result.model_dump(),
        excluded_rows=excluded,
        uncovered=uncovered,
        profile_toml=profile_toml(result, command, date),
    )


def extrapolation(accelerator: str, runs: list[str] | None = None) -> list:
    """How ``accelerator``'s profile error holds beyond the layouts it was fitted on, on its
    runs (default: the shipped catalog): :func:`planner.runs.extrapolation.
    extrapolation_errors` of the rows ``fit`` takes."""
    from planner.runs.extrapolation import extrapolation_errors

    covered, _, _ = _fit_rows(runs, accelerator)
    return extrapolation_errors(covered)


class LayoutRanksReport(BaseModel):
    """Where the published layouts of the runs' jobs rank (:mod:`planner.runs.layout_ranks`),
    with every preference rule and without rule 0, per accelerator and over all."""

    rows: list  # planner.runs.layout_ranks.PublishedLayoutRank
    summaries: list  # planner.runs.layout_ranks.LayoutRankSummary, "all" first
    summaries_without_rule_0: list


def published_layout_ranks(
    runs: list[str] | None = None, accelerator: str | None = None, min_gpus: int = 64,
    limit: int | None = None,
) -> LayoutRanksReport:  # fmt: skip
    """Search each job of the runs (one row per job, at least ``min_gpus`` GPUs; the first
    ``limit`` jobs) as ``plan`` would and find the published degrees in the ranking."""
    from hwspecs.catalog import load_runs
    from planner.api.search import rank_settings
    from planner.runs.layout_ranks import (
        one_row_per_job,
        published_layout_rank,
        summarize_ranks,
    )

    rows = [row for name in (runs or ["train"]) for row in load_runs(name)]
    rows = [row for row in rows if row.hardware.num_gpus >= min_gpus]
    if accelerator:
        rows = [row for row in rows if row.hardware.accelerator == accelerator]
    rows = one_row_per_job(rows)[:limit]

    def settings_of(name, profile, seq_len):
        return rank_settings("robust", name, profile, seq_len)

    reports = {}
    for with_range in (True, False):
        found = [published_layout_rank(row, settings_of, with_range) for row in rows]
        found = [f for f in found if f is not None]
        names = sorted({f.accelerator for f in found})
        reports[with_range] = (found, [summarize_ranks("all", found)] + [
            summarize_ranks(name, [f for f in found if f.accelerator == name]) for name in names
        ])  # fmt: skip
    return LayoutRanksReport(
        rows=reports[True][0],
        summaries=reports[True][1],
        summaries_without_rule_0=reports[False][1],
    )

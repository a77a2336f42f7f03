"""A pipeline timeline for the terminal, drawn the way the DualPipe README draws schedules.

One row per rank; time runs right in cells of one time unit (the shortest action); each
cell shows the micro-batch its action works on, coloured by kind. Blank cells are the
bubble. A chart wider than the terminal wraps into bands (each a window of time, all ranks)
so the order stays exact; only when the bands would run past :data:`MAX_CHART_LINES` do
cells widen to ``k`` time units, and then the chart says so: each cell shows the action that
covers most of it, the actions left without a cell are counted, and idle stretches shorter
than a cell are no longer visible. Only draws what the report holds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from rich.text import Text

if TYPE_CHECKING:
    from planner.api import ScheduleReport

#: rich styles per action kind; DualPipe's second direction is drawn reversed and a rank's
#: later chunks (interleaved, ZB-V, DualPipeV) underlined.
KIND_STYLES = {"F": "blue", "B": "green", "W": "magenta", "BW": "yellow"}
KIND_NAMES = {"F": "forward", "B": "input grad", "W": "weight grad", "BW": "full backward"}
#: Most lines the chart takes (all bands together) before cells widen past one time unit.
MAX_CHART_LINES = 100
#: Tolerance, in time units, for an action boundary to count as on the cell grid.
GRID_TOLERANCE = 1e-6


@dataclass(frozen=True)
class ChartGrid:
    """Which timeline row each cell shows (-1: idle), per rank, at ``cell_time`` per cell."""

    cells: np.ndarray  # (pp, num_cells) indices into report.timeline, -1 where idle
    cell_time: float
    base_unit: float  # the shortest action: one cell when the chart is exact
    exact: bool  # every action boundary on the grid: no cell shows two actions
    hidden_actions: int  # actions that cover no cell's majority (not shown)


def chart_grid(report: ScheduleReport, cells_per_band: int, max_bands: int) -> ChartGrid:
    """Cells of ``base_unit × k`` time, ``k`` the smallest that fits ``max_bands`` bands.

    A cell shows the action covering the largest part of it (the earliest on a tie); cells
    no action touches stay idle. Actions on one rank never overlap, so the shown actions are
    the simulator's order with some left out, never reordered.
    """
    rows = report.timeline
    starts = np.array([item.start for item in rows], dtype=float)
    ends = np.array([item.end for item in rows], dtype=float)
    ranks = np.array([item.rank for item in rows], dtype=int)
    durations = ends - starts
    base_unit = float(durations[durations > 0].min()) if (durations > 0).any() else 1.0
    base_cells = max(math.ceil(report.step_time / base_unit - GRID_TOLERANCE), 1)
    factor = max(math.ceil(base_cells / (cells_per_band * max_bands)), 1)
    cell_time = base_unit * factor
    num_cells = max(math.ceil(report.step_time / cell_time - GRID_TOLERANCE), 1)
    cells = np.full((report.pp, num_cells), -1, dtype=int)
    best = np.zeros((report.pp, num_cells))
    edges = np.arange(num_cells + 1) * cell_time
    for index in np.argsort(starts, kind="stable"):  # earliest first wins ties
        first = int(np.searchsorted(edges, starts[index], side="right")) - 1
        last = int(np.searchsorted(edges, ends[index], side="left"))
        span = np.arange(max(first, 0), min(last, num_cells))
        covered = np.minimum(ends[index], edges[span + 1]) - np.maximum(starts[index], edges[span])
        better = covered > best[ranks[index], span] + GRID_TOLERANCE * cell_time
        cells[ranks[index], span[better]] = index
        best[ranks[index], span[better]] = covered[better]
    on_grid = np.abs(np.concatenate([starts, ends]) / cell_time)
    exact = bool(np.all(np.abs(on_grid - np.round(on_grid)) < GRID_TOLERANCE * factor))
    shown = np.unique(cells[cells >= 0])
    hidden = int((durations > 0).sum() - np.isin(np.flatnonzero(durations > 0), shown).sum())
    return ChartGrid(cells, cell_time, base_unit, exact and hidden == 0, hidden)


def schedule_chart(report: ScheduleReport, max_width: int = 160) -> Text:
    """Rows of micro-batch numbers per rank, in bands of at most ``max_width`` characters."""
    cell = len(str(max(report.microbatches - 1, 0))) + 1
    label = len(f"rank {report.pp - 1} ")
    cells_per_band = max((max_width - label) // cell, 1)
    max_bands = max(MAX_CHART_LINES // (report.pp + 1), 1)
    grid = chart_grid(report, cells_per_band, max_bands)
    num_cells = grid.cells.shape[1]
    bands = math.ceil(num_cells / cells_per_band)
    styles = [_style(report, item) for item in report.timeline]
    chart = Text()
    for band in range(bands):
        window = range(band * cells_per_band, min((band + 1) * cells_per_band, num_cells))
        if bands > 1:
            chart.append(
                f"t {window.start * grid.cell_time:g}–{window.stop * grid.cell_time:g}\n",
                style="dim",
            )
        for rank in range(report.pp):
            chart.append(f"rank {rank}".ljust(label))
            for position in window:
                index = grid.cells[rank, position]
                if index < 0:
                    chart.append(" " * cell)
                    continue
                chart.append(str(report.timeline[index].microbatch).rjust(cell - 1), styles[index])
                chart.append(" ")
            chart.append("\n")
    chart.append(" " * label)
    for kind, style in KIND_STYLES.items():
        if any(item.action == kind for item in report.timeline):
            chart.append(f"{kind}", style=style)
            chart.append(f" {KIND_NAMES[kind]}  ")
    if report.schedule == "dualpipe":
        chart.append("reverse", style="bold reverse")
        chart.append(" second direction")
    elif any(item.stage_index >= report.pp for item in report.timeline):
        chart.append("underlined", style="underline")
        chart.append(" later chunk")
    chart.append("\n" + " " * label + scale_note(grid, bands))
    return chart


def scale_note(grid: ChartGrid, bands: int) -> str:
    """What one cell stands for, and what the chart had to leave out to fit."""
    wrapped = f" (wrapped into {bands} bands)" if bands > 1 else ""
    note = f"1 cell = {grid.cell_time:g} time units{wrapped}"
    if grid.exact:
        return note + "; exact"
    merged = f"{grid.hidden_actions:,} actions not shown, " if grid.hidden_actions else ""
    return (
        f"compressed: {note}; a cell shows the action covering most of it; {merged}idle "
        f"gaps under one cell not visible; --html for the exact chart"
    )


def _style(report: ScheduleReport, item) -> str:
    style = KIND_STYLES[item.action]
    if report.schedule == "dualpipe" and item.microbatch >= report.microbatches // 2:
        return f"bold {style} reverse"
    if item.stage_index >= report.pp:  # a later chunk (interleaved, V schedules)
        return f"{style} underline"
    return style


def _ranks(values: list[float], shown: int = 8) -> str:
    text = [f"{value:g}" for value in values]
    if len(text) > shown:
        text = [*text[: shown // 2], "…", *text[-shown // 2 :]]
    return " ".join(text)


def summary_line(report: ScheduleReport) -> str:
    """Step time, bubble, peak activations per rank and parameter copies on one line."""
    return (
        f"{report.schedule} pp={report.pp} m={report.microbatches} vpp={report.vpp}: "
        f"step {report.step_time:.4g}, bubble {report.bubble_time:.4g} "
        f"({report.bubble_fraction:.1%} of the step, {report.bubble_ratio:.3g}× ideal), "
        f"peak activations [{_ranks(report.peak_activations)}] micro-batches, "
        f"{report.parameter_copies}× parameters"
    )

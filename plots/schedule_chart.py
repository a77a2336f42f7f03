"""A pipeline timeline for the terminal, drawn the way the DualPipe README draws schedules.

One row per rank; time runs right in cells of one time unit (the shortest action, widened
when the chart would not fit); each cell shows the micro-batch its action works on,
coloured by kind. Blank cells are the bubble. Only draws what the report holds.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from rich.text import Text

if TYPE_CHECKING:
    from planner.api import ScheduleReport

#: rich styles per action kind; DualPipe's second direction is drawn reversed and a rank's
#: later chunks (interleaved, ZB-V, DualPipeV) underlined.
KIND_STYLES = {"F": "blue", "B": "green", "W": "magenta", "BW": "yellow"}
KIND_NAMES = {"F": "forward", "B": "input grad", "W": "weight grad", "BW": "full backward"}


def schedule_chart(report: ScheduleReport, max_width: int = 160) -> Text:
    """Rows of micro-batch numbers per rank; ``max_width`` caps the characters per row."""
    cell = len(str(max(report.microbatches - 1, 0))) + 1
    label = len(f"rank {report.pp - 1} ")
    durations = [item.end - item.start for item in report.timeline if item.end > item.start]
    unit = min(durations) if durations else 1.0
    max_cells = max((max_width - label) // cell, 1)
    if report.step_time / unit > max_cells:
        unit = report.step_time / max_cells
    num_cells = max(math.ceil(report.step_time / unit - 1e-9), 1)
    grid: list[list[tuple[str, str] | None]] = [[None] * num_cells for _ in range(report.pp)]
    second_direction = report.schedule == "dualpipe"
    for item in report.timeline:
        first = min(int(item.start / unit + 1e-9), num_cells - 1)
        last = max(first + 1, min(round(item.end / unit), num_cells))
        style = KIND_STYLES[item.action]
        if second_direction and item.microbatch >= report.microbatches // 2:
            style = f"bold {style} reverse"
        elif item.stage_index >= report.pp:  # a later chunk (interleaved, V schedules)
            style = f"{style} underline"
        for position in range(first, last):
            grid[item.rank][position] = (str(item.microbatch), style)
    chart = Text()
    for rank, cells in enumerate(grid):
        chart.append(f"rank {rank}".ljust(label))
        for entry in cells:
            if entry is None:
                chart.append(" " * cell)
            else:
                chart.append(entry[0].rjust(cell - 1), style=entry[1])
                chart.append(" ")
        chart.append("\n")
    chart.append(" " * label)
    for kind, style in KIND_STYLES.items():
        if any(item.action == kind for item in report.timeline):
            chart.append(f"{kind}", style=style)
            chart.append(f" {KIND_NAMES[kind]}  ")
    if second_direction:
        chart.append("reverse", style="bold reverse")
        chart.append(" second direction")
    elif any(item.stage_index >= report.pp for item in report.timeline):
        chart.append("underlined", style="underline")
        chart.append(" later chunk")
    return chart


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

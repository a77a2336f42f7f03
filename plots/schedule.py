"""Pipeline timelines as plotly figures: ranks down the y axis, time along x.

Each :class:`~planner.pipeline.report.ScheduleReport` becomes one panel: one horizontal bar per
action, coloured by kind (F forward, B input gradient, W weight gradient, BW full backward),
labelled with its micro-batch, with micro-batch, stage, start and end on hover and the
step time and bubble fraction in the panel title. Several reports (``--compare``) stack as
panels on one page sharing the time axis, so equal durations line up. The simulator did
all the computing; this module only draws. plotly is imported inside the functions so the
CLI starts fast.

    from planner.api import schedule_report
    from plots.schedule import schedule_figure, write_figure
    write_figure(schedule_figure([schedule_report("zbv", 4, 8)]), html_path="zbv.html")
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from hwspecs.errors import PlanError

if TYPE_CHECKING:
    import plotly.graph_objects as go

    from planner.api import ScheduleReport

#: Colour per action kind: four hues far apart (Tableau 10's blue, orange, green, red), so
#: B and W stay distinct in print and for red-green colour blindness by lightness too.
KIND_COLORS = {"F": "#4C78A8", "B": "#F58518", "W": "#54A24B", "BW": "#E45756"}
#: Bar fill pattern per chunk (a rank's later stages: interleaved, ZB-V, DualPipeV) and per
#: DualPipe direction (micro-batches fed from the last rank).
CHUNK_PATTERNS = ("", "/", "x", ".", "-", "|", "+", "\\")
SECOND_DIRECTION_PATTERN = "x"
#: Pixels per action on the busiest rank in a PNG, so in-bar labels keep their size.
PNG_PIXELS_PER_ACTION = 22
KIND_NAMES = {"F": "forward", "B": "input grad", "W": "weight grad", "BW": "full backward"}
#: Above this many bars a panel drops its in-bar labels (hover still has them).
LABELLED_BARS = 4000


def panel_title(report: ScheduleReport) -> str:
    return (
        f"{report.schedule}: pp {report.pp}, {report.microbatches} micro-batches, vpp "
        f"{report.vpp} — step {report.step_time:.4g}, bubble {report.bubble_fraction:.1%}"
    )


def schedule_figure(reports: list[ScheduleReport]) -> go.Figure:
    """One timeline panel per report, stacked, sharing the time axis."""
    from plotly.subplots import make_subplots

    if not reports:
        raise PlanError("schedule_figure needs at least one report")
    heights = [report.pp + 1.5 for report in reports]
    fig = make_subplots(
        rows=len(reports),
        cols=1,
        shared_xaxes=True,
        vertical_spacing=min(0.08, 0.3 / len(reports)),
        row_heights=heights,
        subplot_titles=[panel_title(report) for report in reports],
    )
    shown: set[tuple[str, int]] = set()
    for row, report in enumerate(reports, start=1):
        add_timeline(fig, report, row, 1, shown)
    fig.update_xaxes(title_text="time", row=len(reports), col=1)
    title = (
        panel_title(reports[0])
        if len(reports) == 1
        else "Pipeline schedules: "
        + ", ".join(f"{report.schedule} {report.bubble_fraction:.1%}" for report in reports)
    )
    fig.update_layout(
        title={"text": title},
        barmode="overlay",
        bargap=0.15,
        # Tall enough for the plot and for the legend (one line per kind and chunk).
        height=max(int(140 + 34 * sum(heights)), 180 + 30 * len(shown)),
        legend={"title": {"text": "action"}},
        template="plotly_white",
        uniformtext={"minsize": 9, "mode": "hide"},
    )
    fig.layout.meta = {"png_width": png_width(reports)}
    if len(reports) == 1:  # the figure title already says it
        fig.layout.annotations = ()
    return fig


def add_timeline(
    fig, report: ScheduleReport, row: int, col: int, shown: set, unit: str = ""
) -> None:
    """Draw ``report``'s timeline into the subplot at (``row``, ``col``): one bar per action,
    coloured by kind, hatched by chunk or direction; ``shown``: the legend entries already
    drawn (updated); ``unit``: the time unit for hover (``" ms"``)."""
    import plotly.graph_objects as go

    labelled = len(report.timeline) <= LABELLED_BARS
    for (kind, group), bars in _bar_groups(report).items():
        color = KIND_COLORS[kind]
        pattern = _pattern(report, group)
        fig.add_trace(
            go.Bar(
                orientation="h",
                y=[item.rank for item in bars],
                x=[item.end - item.start for item in bars],
                base=[item.start for item in bars],
                marker={
                    "color": color,
                    "line": {"color": "white", "width": 0.5},
                    "pattern": {"shape": pattern, "fgcolor": "white", "solidity": 0.3},
                },
                text=[str(item.microbatch) for item in bars] if labelled else None,
                textposition="inside",
                insidetextanchor="middle",
                customdata=[
                    (item.microbatch, item.stage_index, item.start, item.end) for item in bars
                ],
                hovertemplate=(
                    f"{KIND_NAMES[kind]} ({kind})<br>rank %{{y}}<br>micro-batch "
                    "%{customdata[0]}<br>stage %{customdata[1]}<br>"
                    f"%{{customdata[2]:.4g}} → %{{customdata[3]:.4g}}{unit}<extra></extra>"
                ),
                name=f"{kind}: {KIND_NAMES[kind]}{_group_name(report, group)}",
                legendgroup=kind,
                showlegend=(kind, group) not in shown,
            ),
            row=row,
            col=col,
        )
        shown.add((kind, group))
    fig.update_yaxes(
        autorange="reversed",
        tickmode="array",
        tickvals=list(range(report.pp)),
        ticktext=[f"rank {rank}" for rank in range(report.pp)],
        row=row,
        col=col,
    )


def _bar_groups(report: ScheduleReport) -> dict[tuple[str, int], list]:
    """Actions per (kind, chunk) — per (kind, direction) for DualPipe — in timeline order."""
    groups: dict[tuple[str, int], list] = {}
    for item in report.timeline:
        if report.schedule == "dualpipe":
            group = int(item.microbatch >= report.microbatches // 2)
        else:
            group = item.stage_index // report.pp
        groups.setdefault((item.action, group), []).append(item)
    order = list(KIND_COLORS)
    return dict(sorted(groups.items(), key=lambda entry: (order.index(entry[0][0]), entry[0][1])))


def _pattern(report: ScheduleReport, group: int) -> str:
    if report.schedule == "dualpipe":
        return SECOND_DIRECTION_PATTERN if group else ""
    return CHUNK_PATTERNS[group % len(CHUNK_PATTERNS)]


def _group_name(report: ScheduleReport, group: int) -> str:
    if report.schedule == "dualpipe":
        return ", from the last rank (←)" if group else ", from the first rank (→)"
    if report.vpp > 1:
        return f", chunk {group}" + (" (hatched)" if group else "")
    return ""


def png_width(reports: list[ScheduleReport]) -> int:
    """Wide enough for every in-bar label at the default font size (1,000 to 6,000 px)."""
    busiest = max(
        max(sum(1 for item in report.timeline if item.rank == rank) for rank in range(report.pp))
        for report in reports
    )
    return int(min(max(1000, 200 + PNG_PIXELS_PER_ACTION * busiest), 6000))


def write_figure(
    fig: go.Figure, html_path: str | Path | None = None, png_path: str | Path | None = None
) -> None:
    """Write ``fig`` as standalone HTML and/or PNG.

    PNG goes through kaleido, which drives a Chrome or Chromium it finds on the machine;
    without one this raises a :class:`PlanError` saying how to enable it.
    """
    if html_path is not None:
        fig.write_html(str(html_path), include_plotlyjs=True, full_html=True)
    if png_path is None:
        return
    hint = (
        "PNG export needs kaleido and a Chrome/Chromium: `pip install kaleido` and either run "
        "`plotly_get_chrome` or install chromium (Debian: apt-get install chromium) and set "
        "BROWSER_PATH=/usr/bin/chromium; --html works without it"
    )
    try:
        import kaleido  # noqa: F401
    except ImportError as error:
        raise PlanError(hint) from error
    try:
        width = (fig.layout.meta or {}).get("png_width", 1000)
        fig.write_image(str(png_path), width=width, height=fig.layout.height)
    except (RuntimeError, ValueError) as error:
        if "chrome" in str(error).lower() or "browser" in str(error).lower():
            raise PlanError(hint) from error
        raise

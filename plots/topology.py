"""Rank placement on a cluster's network hierarchy, as an interactive HTML figure.

What it shows: one panel per parallel axis. Across each panel run the cluster's devices
(x = rank, as placed by the mesh order); above them one lane per network tier, innermost
at the bottom, with the boundaries of the tier's instances (NVLink domains, racks, pods;
drawn when there are at most 256 of them). The first group of the panel's axis is
highlighted: its ranks as markers on the GPU lane, and on each tier lane the instances it
touches, filled. Which model it follows: :func:`planner.comm.topology.topology_report` (rank
placement innermost first, tiers from the cluster spec); everything is computed there and
this module only draws. Run it with
``llmplan topology --cluster llama3-h100-24k --tp 8 --pp 16 --dp 128 --html placement.html``.
"""

from __future__ import annotations

from pathlib import Path

from planner.api import TopologyReport

MAX_BOUNDARIES = 256
HIGHLIGHT = "#d62728"
LANE = "#e8e8e8"


def _runs(ranks: list[int], size: int) -> list[tuple[int, int]]:
    """Contiguous runs of the tier instances (of ``size`` devices) that ``ranks`` touch."""
    touched = sorted({rank // size for rank in ranks})
    runs: list[tuple[int, int]] = []
    for index in touched:
        if runs and runs[-1][1] == index:
            runs[-1] = (runs[-1][0], index + 1)
        else:
            runs.append((index, index + 1))
    return runs


def topology_figure(report: TopologyReport):
    """A plotly Figure of ``report``: one panel per axis, its first group highlighted."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    axes = [axis for axis in report.axes if axis.group_size > 1] or report.axes[:1]
    titles = [
        f"{a.axis} = {a.group_size}: ranks {_short(a.example_ranks)} · crosses "
        f"{', '.join(a.tiers) or 'nothing'} · bottleneck {a.bottleneck_tier} "
        f"{a.bottleneck_bytes_per_s_per_rank / 1e9:.1f} GB/s per rank"
        for a in axes
    ]
    figure = make_subplots(rows=len(axes), cols=1, shared_xaxes=True, subplot_titles=titles,
                           vertical_spacing=0.08)  # fmt: skip
    lanes = ["GPU", *(f"{t.name} ({t.link}, {t.group_size})" for t in report.tiers)]
    end = report.num_gpus
    shapes = []
    for row, axis in enumerate(axes, start=1):
        suffix = "" if row == 1 else str(row)
        lines_x, lines_y, boxes_x, boxes_y = [], [], [], []
        for lane, tier in enumerate(report.tiers, start=1):
            shapes.append({"type": "rect", "xref": f"x{suffix}", "yref": f"y{suffix}",
                           "x0": 0, "x1": end, "y0": lane - 0.4, "y1": lane + 0.4,
                           "fillcolor": LANE, "line": {"width": 0}, "layer": "below"})  # fmt: skip
            count = -(-end // tier.group_size)
            if 1 < count <= MAX_BOUNDARIES:
                for index in range(1, count):
                    x = index * tier.group_size
                    lines_x += [x, x, None]
                    lines_y += [lane - 0.4, lane + 0.4, None]
            for first, last in _runs(axis.example_ranks, tier.group_size):
                x0, x1 = first * tier.group_size, min(last * tier.group_size, end)
                boxes_x += [x0, x1, x1, x0, x0, None]
                boxes_y += [lane - 0.35, lane - 0.35, lane + 0.35, lane + 0.35, lane - 0.35, None]
        figure.add_trace(
            go.Scatter(x=lines_x, y=lines_y, mode="lines", line={"color": "#999", "width": 1},
                       hoverinfo="skip", showlegend=False),
            row=row, col=1,
        )  # fmt: skip
        figure.add_trace(
            go.Scatter(x=boxes_x, y=boxes_y, mode="lines", fill="toself", fillcolor=HIGHLIGHT,
                       opacity=0.45, line={"width": 0}, hoverinfo="skip", showlegend=False),
            row=row, col=1,
        )  # fmt: skip
        figure.add_trace(
            go.Scatter(
                x=axis.example_ranks, y=[0] * len(axis.example_ranks), mode="markers",
                marker={"color": HIGHLIGHT, "size": 9, "symbol": "line-ns-open"},
                hovertemplate="rank %{x}<extra>" + axis.axis + " group</extra>",
                showlegend=False,
            ),
            row=row, col=1,
        )  # fmt: skip
        figure.update_yaxes(tickvals=list(range(len(lanes))), ticktext=lanes, row=row, col=1,
                            range=[-0.6, len(lanes) - 0.4])  # fmt: skip
    figure.update_layout(shapes=shapes)
    figure.update_xaxes(range=[0, end], title_text="rank (device)", row=len(axes), col=1)
    figure.update_layout(
        title=f"{report.cluster}: {report.num_gpus} GPUs, order {', '.join(report.order)} "
        "(innermost first)",
        height=max(320, 230 * len(axes)), template="plotly_white",
    )  # fmt: skip
    return figure


def write_topology_html(report: TopologyReport, path: str | Path) -> Path:
    """Write :func:`topology_figure` as a standalone HTML file; returns the path."""
    path = Path(path)
    topology_figure(report).write_html(path, include_plotlyjs=True, full_html=True)
    return path


def _short(ranks: list[int], shown: int = 6) -> str:
    if len(ranks) <= shown:
        return ", ".join(map(str, ranks))
    return ", ".join(map(str, ranks[: shown - 1])) + f", …, {ranks[-1]}"

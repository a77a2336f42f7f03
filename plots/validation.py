"""Predicted vs measured pipeline timelines of a validation run, one panel per layout.

Measured actions (solid) come from the per-micro-batch timestamps each rank recorded; the
predicted ones (outlined, drawn just below) are the planner's simulator replaying its own
action list with the measured mean duration of each action kind (``validate.timelines``).
Run ``llmplan validate --html report.html``. This module only draws.
"""

from __future__ import annotations

COLOURS = {"F": "#4C78A8", "B": "#59A14F", "W": "#F28E2B", "BW": "#E15759"}


def validation_figure(report):
    """One timeline panel per pipeline layout: measured bars above predicted bars per rank."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    panels = [
        run for run in report.runs
        if run.measured.get("pipeline") and run.predicted.get("pipeline_replay")
    ]  # fmt: skip
    titles = [run.name for run in panels] or ["no pipeline layouts in this report"]
    fig = make_subplots(
        rows=max(len(panels), 1), cols=1, subplot_titles=titles, vertical_spacing=0.08
    )
    for row, run in enumerate(panels, start=1):
        for source, offset, style in (("measured", 0.0, "solid"), ("predicted", 0.4, "outline")):
            timeline = (
                run.measured["pipeline"]
                if source == "measured"
                else run.predicted["pipeline_replay"]
            )
            rows = timeline["timeline"]
            for kind in sorted({r["kind"] for r in rows}):
                items = [r for r in rows if r["kind"] == kind]
                colour = COLOURS.get(kind, "#999999")
                fig.add_trace(
                    go.Bar(
                        x=[r["end_s"] - r["start_s"] for r in items],
                        base=[r["start_s"] for r in items],
                        y=[f"rank {r['rank']} {source}" for r in items],
                        orientation="h",
                        name=f"{kind} {source}",
                        legendgroup=f"{kind}{source}",
                        showlegend=row == 1,
                        marker={
                            "color": colour if style == "solid" else "rgba(0,0,0,0)",
                            "line": {"color": colour, "width": 1.5},
                        },
                        text=[str(r["microbatch"]) for r in items],
                        hovertemplate="micro-batch %{text}<br>%{base:.4f}–%{x:.4f} s<extra>"
                        + f"{kind} {source}</extra>",
                        offset=offset - 0.4,
                        width=0.4,
                    ),
                    row=row,
                    col=1,
                )
    fig.update_layout(
        title=f"llmplan validate: predicted vs measured pipeline timelines ({report.cluster})",
        barmode="overlay",
        height=300 * max(len(panels), 1) + 150,
    )
    fig.update_xaxes(title_text="seconds from the step's first action")
    return fig

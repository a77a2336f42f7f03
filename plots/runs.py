"""`llmplan runs check --html`: predicted against measured throughput as an offline page.

One point per covered run (log-log tokens/s per GPU, one colour per accelerator), the
diagonal where prediction equals measurement and the ±20% band around it; hovering a point
names the run, its source, the layout the check predicted it with and the error. A bar
panel beside it gives the MAPE per source family. The numbers come from
:func:`planner.api.runs_check`; this module only draws them.
"""

from __future__ import annotations


def _layout_text(layout: dict | None) -> str:
    if not layout:
        return ""
    degrees = "/".join(str(layout[a]) for a in ("tp", "cp", "pp", "dp", "ep"))
    return f"tp/cp/pp/dp/ep {degrees}, {layout['schedule']}, recompute {layout['recompute']}"


def runs_figure(result):
    """Predicted vs measured tokens/s per GPU of ``result`` (a :class:`RunsCheck`)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    covered = [r for r in result.rows if r.covered]
    fig = make_subplots(
        rows=1, cols=2, column_widths=[0.62, 0.38], horizontal_spacing=0.14,
        subplot_titles=("predicted vs measured tokens/s per GPU", "MAPE per source"),
    )  # fmt: skip
    for accelerator in sorted({r.accelerator for r in covered}):
        rows = [r for r in covered if r.accelerator == accelerator]
        fig.add_trace(
            go.Scatter(
                x=[r.measured_tokens_per_s_per_gpu for r in rows],
                y=[r.predicted_tokens_per_s_per_gpu for r in rows],
                mode="markers",
                name=accelerator,
                customdata=[
                    [r.id, r.source_family, _layout_text(r.layout), 100 * r.error, r.num_gpus]
                    for r in rows
                ],
                hovertemplate="%{customdata[0]}<br>%{customdata[1]}, %{customdata[4]} GPUs"
                "<br>%{customdata[2]}<br>measured %{x:,.0f}, predicted %{y:,.0f} tokens/s/GPU"
                "<br>error %{customdata[3]:+.1f}%<extra></extra>",
            ),
            row=1,
            col=1,
        )
    values = [v for r in covered for v in (r.measured_tokens_per_s_per_gpu,
                                           r.predicted_tokens_per_s_per_gpu)]  # fmt: skip
    if values:
        low, high = min(values) / 1.5, max(values) * 1.5
        for factor, name, dash in ((1.0, "predicted = measured", "solid"),
                                   (1.2, "±20%", "dot"), (0.8, "±20%", "dot")):  # fmt: skip
            fig.add_trace(
                go.Scatter(
                    x=[low, high],
                    y=[low * factor, high * factor],
                    mode="lines",
                    name=name,
                    line={"color": "grey", "dash": dash},
                    showlegend=factor != 0.8,
                    hoverinfo="skip",
                ),
                row=1,
                col=1,
            )
    sources = sorted(result.by_source, key=lambda s: s.mape)
    fig.add_trace(
        go.Bar(
            x=[100 * s.mape for s in sources],
            y=[s.name for s in sources],
            orientation="h",
            name="MAPE per source",
            showlegend=False,
            customdata=[[s.n, 100 * s.median_signed_error] for s in sources],
            hovertemplate="%{y}: MAPE %{x:.1f}% over %{customdata[0]} rows, median "
            "%{customdata[1]:+.1f}%<extra></extra>",
        ),
        row=1,
        col=2,
    )
    fig.update_xaxes(type="log", title_text="measured tokens/s per GPU", row=1, col=1)
    fig.update_yaxes(type="log", title_text="predicted tokens/s per GPU", row=1, col=1)
    fig.update_xaxes(title_text="MAPE (%)", row=1, col=2)
    overall = result.overall
    summary = f", MAPE {100 * overall.mape:.1f}%" if overall is not None else ""
    fig.update_layout(
        title=f"runs check: {result.runs}, profile {result.profile} — {result.num_covered} of "
        f"{result.num_rows} rows covered{summary}",
        height=640,
        width=1280,
    )
    return fig

"""Search results as a plotly page: step time against memory per GPU, and the winner's parts.

The left panel draws what :func:`planner.api.plan_page_sample` chose — the Pareto front (no
layout both faster and smaller) as a line and a grid sample of the feasible cloud coloured
by schedule — with the winner starred and the memory limit (HBM × (1 − headroom)) as a
vertical line; the step-time axis runs from the best layout to :data:`STEP_AXIS_SPAN` times
it (double-click zooms out to every drawn point). Hover names every field of the layout,
rounded. The other two panels are the winner's step-time and memory breakdowns. Run
``llmplan plan --html plan.html``. The search and the sample are the planner's; this module
only draws.
"""

from __future__ import annotations

import numpy as np

GIB = 2**30
#: The step-time axis shows up to this multiple of the best step: slower layouts are not
#: contenders (the axis zooms out; every row is in --csv).
STEP_AXIS_SPAN = 3.0

_HOVER = (
    "<b>%{customdata[0]}</b> (tp/cp/pp/dp/ep)<br>%{customdata[1]}, mbs %{customdata[2]}, "
    "ZeRO %{customdata[3]}, recompute %{customdata[4]}, SP %{customdata[5]}<br>"
    "step %{y:.3f} s, MFU %{customdata[6]:.1f}%, %{customdata[7]:,.0f} tokens/s/GPU<br>"
    "memory %{x:.1f} GiB, bubble %{customdata[8]:.1f}%<extra>%{fullData.name}</extra>"
)


def _hover_data(rows) -> np.ndarray:
    degrees = (
        rows["tp"].astype(str)
        + "/"
        + rows["cp"].astype(str)
        + "/"
        + rows["pp"].astype(str)
        + "/"
        + rows["dp"].astype(str)
        + "/"
        + rows["ep"].astype(str)
    )
    schedule = rows["schedule"].where(
        rows["schedule"] != "interleaved-1f1b", "interleaved-1f1b v" + rows["vpp"].astype(str)
    )
    return np.column_stack(
        [
            degrees,
            schedule,
            rows["micro_batch_size"],
            rows["zero_stage"],
            rows["recompute"],
            np.where(rows["sequence_parallel"], "on", "off"),
            (100 * rows["mfu"]).round(1),
            rows["tokens_per_s_per_gpu"].round(0),
            (100 * rows["bubble_fraction"]).round(1),
        ]
    ).astype(object)


def plan_figure(table, result, sample):
    """The drawn sample, the front, the winner and the memory limit; the winner's breakdowns."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(
        rows=1,
        cols=3,
        column_widths=[0.6, 0.2, 0.2],
        subplot_titles=(
            "step time vs memory per GPU",
            "winner: step time (s)",
            "winner: memory per GPU (GiB)",
        ),
    )
    cloud = table.iloc[sample.cloud]
    for name in sorted(cloud["schedule"].unique()):
        rows = cloud[cloud["schedule"] == name]
        fig.add_trace(
            go.Scattergl(
                x=(rows["memory_per_gpu_bytes"] / GIB).round(2).to_numpy(np.float32),
                y=rows["step_time_s"].round(4).to_numpy(np.float32),
                mode="markers",
                name=name,
                customdata=_hover_data(rows),
                marker={"size": 5, "opacity": 0.55},
                hovertemplate=_HOVER,
            ),
            row=1,
            col=1,
        )
    front = table.iloc[sample.front]
    if not front.empty:
        fig.add_trace(
            go.Scatter(
                x=(front["memory_per_gpu_bytes"] / GIB).round(2),
                y=front["step_time_s"].round(4),
                mode="lines+markers",
                name="Pareto front",
                line={"color": "black", "shape": "hv"},
                marker={"size": 6, "color": "black"},
                customdata=_hover_data(front),
                hovertemplate=_HOVER,
            ),
            row=1,
            col=1,
        )
    if result.results:
        _winner(fig, result.results[0])
    q = result.query
    fig.update_layout(
        title={
            "text": f"llmplan plan: {q['model']} on {q['num_gpus']:,} GPUs of {q['cluster']}"
            f"<br><sub>drawn: {sample.description}</sub>"
        },
        height=680,
        template="plotly_white",
        legend={"title": {"text": "schedule"}},
    )
    fig.update_xaxes(title_text="memory per GPU (GiB)", row=1, col=1)
    fig.update_yaxes(title_text="step time (s)", type="log", row=1, col=1)
    if not table.empty:
        best = float(table["step_time_s"].min())
        top = min(
            float(table["step_time_s"].iloc[sample.front + sample.cloud].max()),
            best * STEP_AXIS_SPAN,
        )
        fig.update_yaxes(
            range=[np.log10(best * 0.97), np.log10(max(top, best * 1.05))], row=1, col=1
        )
    return fig


def _winner(fig, winner) -> None:
    import plotly.graph_objects as go

    lay = winner["layout"]
    limit_gib = winner["usable_bytes"] / GIB
    fig.add_vline(
        x=limit_gib,
        line={"color": "firebrick", "dash": "dash"},
        annotation_text=f"memory limit {limit_gib:.1f} GiB",
        annotation_position="top left",
        row=1,
        col=1,
    )
    degrees = "/".join(str(lay[axis]) for axis in ("tp", "cp", "pp", "dp", "ep"))
    fig.add_trace(
        go.Scatter(
            x=[round(winner["memory_per_gpu_bytes"] / GIB, 2)],
            y=[round(winner["step_time_s"], 4)],
            mode="markers+text",
            name="winner (simulated)",
            marker={
                "symbol": "star",
                "size": 18,
                "color": "gold",
                "line": {"color": "black", "width": 1},
            },
            text=["winner"],
            textposition="bottom center",
            hovertemplate=(
                f"<b>winner {degrees}</b> (tp/cp/pp/dp/ep)<br>{lay['schedule']} vpp {lay['vpp']}, "
                f"mbs {lay['micro_batch_size']}, ZeRO {lay['zero_stage']}, recompute "
                f"{lay['recompute']}<br>step {winner['step_time_s']:.3f} s, MFU "
                f"{100 * winner['mfu']:.1f}%, {winner['tokens_per_s_per_gpu']:,.0f} tokens/s/GPU<br>"
                f"memory {winner['memory_per_gpu_bytes'] / GIB:.1f} GiB, bubble "
                f"{100 * winner['bubble_fraction']:.1f}%<extra></extra>"
            ),
        ),
        row=1,
        col=1,
    )
    times = {k: round(v, 4) for k, v in winner["time_breakdown_s"].items() if v}
    fig.add_trace(
        go.Bar(x=list(times), y=list(times.values()), name="step time (s)", showlegend=False),
        row=1,
        col=2,
    )
    memory = {k: round(v / GIB, 2) for k, v in winner["memory_breakdown_bytes"].items() if v}
    fig.add_trace(
        go.Bar(x=list(memory), y=list(memory.values()), name="memory (GiB)", showlegend=False),
        row=1,
        col=3,
    )

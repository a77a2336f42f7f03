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
#: PNG width (px) at which the three panels keep their titles apart beside the legend.
PNG_WIDTH = 1700

_HOVER = (
    "<b>%{customdata[0]}</b> (tp/cp/pp/dp/ep/etp)<br>%{customdata[1]}, m %{customdata[2]}, "
    "mbs %{customdata[3]}, ZeRO %{customdata[4]}, recompute %{customdata[5]}, SP "
    "%{customdata[6]}<br>step %{y:.3f} s (%{customdata[7]:.3f}–%{customdata[8]:.3f} s), MFU "
    "%{customdata[9]:.1f}%, %{customdata[10]:,.0f} tokens/s/GPU<br>memory %{x:.1f} GiB, "
    "bubble %{customdata[11]:.1f}%<br>rank %{customdata[12]} (by time %{customdata[13]})"
    "<extra>%{fullData.name}</extra>"
)


def _hover_data(rows) -> np.ndarray:
    """The whole layout and its figures per drawn row (``planner.api.plan_page_rows``)."""
    etp = rows["etp"].where(rows["etp"].notna(), rows["tp"]) if "etp" in rows else rows["tp"]
    degrees = rows["tp"].astype(str)
    for axis in ("cp", "pp", "dp", "ep"):
        degrees = degrees + "/" + rows[axis].astype(str)
    degrees = degrees + "/" + etp.astype(int).astype(str)
    schedule = rows["schedule"] + " vpp " + rows["vpp"].astype(str)
    return np.column_stack(
        [
            degrees,
            schedule,
            rows["num_microbatches"],
            rows["micro_batch_size"],
            rows["zero_stage"],
            rows["recompute"],
            np.where(rows["sequence_parallel"], "on", "off"),
            rows["step_time_low_s"].round(4),
            rows["step_time_high_s"].round(4),
            (100 * rows["mfu"]).round(1),
            rows["tokens_per_s_per_gpu"].round(0),
            (100 * rows["bubble_fraction"]).round(1),
            _column(rows, "rank"),
            _column(rows, "rank_by_time"),
        ]
    ).astype(object)


def _column(rows, name: str):
    """A column of the rows, or "-" where the table has none (a table ranked elsewhere)."""
    return rows[name] if name in rows else np.full(len(rows), "-", dtype=object)


#: Marker per mark kind (the winner is the gold star).
MARK_SYMBOLS = {"published": "diamond", "named": "square"}


def plan_figure(table, result, sample, marks=()):
    """The drawn sample, the front, the winner, the published or named layouts (``marks``:
    ``planner.api.plan_page_marks``) and the memory limit; the winner's breakdowns."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from planner.api import plan_page_rows

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
    cloud = plan_page_rows(table, sample.cloud, result)
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
    front = plan_page_rows(table, sample.front, result)
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
    for mark in marks:
        _mark(
            fig, mark, plan_page_rows(table, [mark.row], result) if mark.row is not None else None
        )
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
    fig.layout.meta = {"png_width": PNG_WIDTH}  # the legend's long names beside the panels
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


def _mark(fig, mark, rows) -> None:
    """A published or named layout on its best feasible row (a note in the legend if none)."""
    import plotly.graph_objects as go

    degrees = " ".join(f"{axis} {size}" for axis, size in mark.degrees.items())
    name = f"{mark.label} ({mark.note})"
    if rows is None:  # nothing to draw: the legend says why
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=name), row=1, col=1)
        return
    fig.add_trace(
        go.Scatter(
            x=(rows["memory_per_gpu_bytes"] / GIB).round(2),
            y=rows["step_time_s"].round(4),
            mode="markers+text",
            name=name,
            marker={
                "symbol": MARK_SYMBOLS.get(mark.kind, "square"),
                "size": 15,
                "color": "white",
                "line": {"color": "black", "width": 2},
            },
            text=[mark.kind],
            textposition="top center",
            customdata=_hover_data(rows),
            hovertemplate=f"<b>{mark.label}</b>: {degrees}<br>{mark.source}<br>" + _HOVER,
        ),
        row=1,
        col=1,
    )


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
    degrees += f"/{lay.get('etp') or lay['tp']}"
    band = winner.get("step_time_interval_s")
    interval = f" ({band[0]:.3f}–{band[1]:.3f} s)" if band else ""
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
                f"<b>winner {degrees}</b> (tp/cp/pp/dp/ep/etp)<br>{lay['schedule']} vpp "
                f"{lay['vpp']}, m {lay['num_microbatches']}, mbs {lay['micro_batch_size']}, ZeRO "
                f"{lay['zero_stage']}, recompute {lay['recompute']}, SP "
                f"{'on' if lay['sequence_parallel'] else 'off'}<br>step "
                f"{winner['step_time_s']:.3f} s{interval}, MFU "
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

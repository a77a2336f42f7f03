"""Search results as a plotly page: every feasible layout's step time against its memory.

Points are coloured by schedule, the Pareto front (no layout both faster and smaller) is
drawn as a line, hovering shows the layout; a second panel shows the winner's step time and
memory breakdowns as bars. Run ``llmplan plan --html plan.html``. The numbers are computed
by the search; this module only draws them.
"""

from __future__ import annotations

GIB = 2**30


def pareto_front(table):
    """Rows not dominated in (step time, memory): sorted by step time, memory strictly falling."""
    ordered = table.sort_values(["step_time_s", "memory_per_gpu_bytes"])
    best = float("inf")
    keep = []
    for index, memory in zip(ordered.index, ordered["memory_per_gpu_bytes"], strict=True):
        if memory < best:
            keep.append(index)
            best = memory
    return ordered.loc[keep]


def plan_figure(table, result):
    """Scatter of all feasible layouts and the winner's breakdowns."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(
        rows=1,
        cols=3,
        column_widths=[0.6, 0.2, 0.2],
        subplot_titles=(
            "feasible layouts: step time vs memory per GPU",
            "winner: step time (s)",
            "winner: memory per GPU (GiB)",
        ),
    )
    hover = (
        table["tp"].astype(str)
        + "/"
        + table["cp"].astype(str)
        + "/"
        + table["pp"].astype(str)
        + "/"
        + table["dp"].astype(str)
        + " (tp/cp/pp/dp) vpp "
        + table["vpp"].astype(str)
        + " mbs "
        + table["micro_batch_size"].astype(str)
        + " ZeRO "
        + table["zero_stage"].astype(str)
        + " recompute "
        + table["recompute"].astype(str)
    )
    for name in sorted(table["schedule"].unique()):
        rows = table["schedule"] == name
        fig.add_trace(
            go.Scattergl(
                x=table.loc[rows, "memory_per_gpu_bytes"] / GIB,
                y=table.loc[rows, "step_time_s"],
                mode="markers",
                name=name,
                text=hover[rows],
                marker={"size": 5, "opacity": 0.6},
                hovertemplate="%{text}<br>%{y:.3f} s, %{x:.1f} GiB<extra>" + name + "</extra>",
            ),
            row=1,
            col=1,
        )
    if not table.empty:
        front = pareto_front(table)
        fig.add_trace(
            go.Scatter(
                x=front["memory_per_gpu_bytes"] / GIB,
                y=front["step_time_s"],
                mode="lines+markers",
                name="Pareto front",
                line={"color": "black"},
            ),
            row=1,
            col=1,
        )
    if result.results:
        winner = result.results[0]
        times = {k: v for k, v in winner["time_breakdown_s"].items() if v}
        fig.add_trace(
            go.Bar(x=list(times), y=list(times.values()), name="step time (s)"), row=1, col=2
        )
        memory = {k: v / GIB for k, v in winner["memory_breakdown_bytes"].items() if v}
        fig.add_trace(
            go.Bar(x=list(memory), y=list(memory.values()), name="memory (GiB)"), row=1, col=3
        )
    q = result.query
    fig.update_layout(
        title=f"llmplan plan: {q['model']} on {q['gpus']:,} GPUs of {q['cluster']}",
        height=650,
    )
    fig.update_xaxes(title_text="memory per GPU (GiB)", row=1, col=1)
    fig.update_yaxes(title_text="step time (s)", type="log", row=1, col=1)
    return fig

"""One layout's estimate as a plotly page: its pipeline timeline, step-time and memory parts.

The top panel is the layout's real timeline — the schedule's actions per rank with each
virtual stage's own forward, input-gradient (with recompute) and weight-gradient time per
micro-batch in ms, as the event simulator ran them (:func:`planner.api.layout_timeline`);
colours and hatching as :mod:`plots.schedule`. Below: the step time by term (s) and the
memory per GPU of every pipeline rank by part (GiB) against the usable HBM. Run
``llmplan estimate --html estimate.html``; this module only draws.
"""

from __future__ import annotations

from plots.schedule import LABELLED_BARS, add_timeline, png_width

GIB = 2**30
MEMORY_PARTS = {  # the report's parts, as the terminal's memory table groups them
    "weights": ("weights",),
    "grads": ("gradients",),
    "optim": ("master_weights", "optimizer_states"),
    "acts": ("activations",),
    "buffers": ("logits_buffers", "comm_buffers", "runtime_overhead"),
}


def headline(result) -> str:
    """The estimate in one line: layout, step (with its interval), MFU, tokens/s, memory."""
    lay = result.layout
    step = f"step {result.step_time_s:.3f} s"
    if result.step_time_interval_s is not None:
        low, high = result.step_time_interval_s
        step += f" ({low:.3f}–{high:.3f} s, profile {result.profile})"
    return (
        f"{result.model} on {result.num_gpus:,} × {result.accelerator}: tp {lay.tp} cp {lay.cp} "
        f"pp {lay.pp} dp {lay.dp} ep {lay.ep}, {lay.schedule} vpp {lay.vpp}, m "
        f"{result.num_microbatches}, mbs {lay.micro_batch_size}, ZeRO {lay.zero_stage}, "
        f"recompute {lay.recompute} — {step}, MFU {100 * result.mfu:.1f}%, "
        f"{result.tokens_per_s_per_gpu:,.0f} tokens/s/GPU, "
        f"{result.memory_per_gpu_bytes / GIB:.1f} GiB per GPU, bubble "
        f"{100 * result.bubble_fraction:.1f}%"
    )


def estimate_figure(result, timeline):
    """The page of one estimate (``planner.api.estimate``) and its timeline (ms)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(
        rows=2,
        cols=2,
        specs=[[{"colspan": 2}, None], [{}, {}]],
        row_heights=[0.6, 0.4],
        vertical_spacing=0.12,
        subplot_titles=(
            f"pipeline timeline, one step ({timeline.microbatches} micro-batches; ms): "
            f"pipeline {timeline.step_time:,.1f} ms, bubble {timeline.bubble_fraction:.1%}",
            "step time by term (s)",
            "memory per GPU by pipeline rank (GiB)",
        ),
    )
    add_timeline(fig, timeline, 1, 1, set(), unit=" ms")
    fig.update_xaxes(title_text="time (ms)", row=1, col=1)
    terms = {key: round(value, 4) for key, value in result.time_breakdown_s.items() if value}
    fig.add_trace(
        go.Bar(
            x=list(terms),
            y=list(terms.values()),
            name="step time (s)",
            showlegend=False,
            hovertemplate="%{x}: %{y:.4f} s<extra></extra>",
        ),
        row=2,
        col=1,
    )
    ranks = [f"rank {stage.rank}" for stage in result.per_stage_memory]
    below = [0.0] * len(ranks)  # stacked by hand: the figure's bars overlay (the timeline)
    for label, parts in MEMORY_PARTS.items():
        sizes = [
            round(sum(getattr(stage, part) for part in parts) / GIB, 2)
            for stage in result.per_stage_memory
        ]
        fig.add_trace(
            go.Bar(
                x=ranks,
                y=sizes,
                base=list(below),
                name=f"memory: {label}",
                legendgroup="memory",
                hovertemplate=f"%{{x}} {label}: %{{y:.2f}} GiB<extra></extra>",
            ),
            row=2,
            col=2,
        )
        below = [low + size for low, size in zip(below, sizes, strict=True)]
    usable = result.usable_bytes / GIB
    fig.add_hline(
        y=usable,
        line={"color": "firebrick", "dash": "dash"},
        annotation_text=f"memory limit {usable:.1f} GiB",
        annotation_position="top left",
        row=2,
        col=2,
    )
    height = int(max(720, 340 + 34 * timeline.pp + 320))
    fig.update_layout(
        title={
            "text": "llmplan estimate<br><sub>" + headline(result).replace(" — ", "<br>") + "</sub>"
        },
        barmode="overlay",
        height=height,
        template="plotly_white",
        legend={"title": {"text": "action / part"}},
        margin={"t": 160},
        uniformtext={"minsize": 9, "mode": "hide"},
    )
    fig.layout.meta = {
        "png_width": png_width([timeline]) if len(timeline.timeline) <= LABELLED_BARS else 1600
    }
    return fig

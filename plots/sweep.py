"""A scaling sweep as a plotly page: the plan's winner against the swept quantity.

Four panels share the x axis (GPUs or sequence length, log scale): best step time, MFU,
days to train the token budget and goodput (the last two with ``--train-tokens``). Run
``llmplan sweep --gpus 1024,2048,4096,8192,16384 --train-tokens 15T --html sweep.html``.
The numbers come from :func:`planner.api.sweep`; this module only draws them.
"""

from __future__ import annotations

LABELS = {"gpus": "GPUs", "seq_len": "sequence length"}


def sweep_figure(result):
    """Best step time, MFU, days to train and goodput per swept value."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    points = [p for p in result.points if p.step_time_s is not None]
    x = [p.value for p in points]
    timed = [p for p in points if p.time_to_train]
    panels = [
        ("best step time (s)", x, [p.step_time_s for p in points]),
        ("MFU (%)", x, [100 * p.mfu for p in points]),
        ("days to train", [p.value for p in timed],
         [p.time_to_train["wall_time_days"] for p in timed]),
        ("goodput (%)", [p.value for p in timed],
         [100 * p.time_to_train["goodput"] for p in timed]),
    ]  # fmt: skip
    fig = make_subplots(rows=2, cols=2, subplot_titles=[title for title, _, _ in panels])
    for index, (title, xs, ys) in enumerate(panels):
        row, col = divmod(index, 2)
        fig.add_trace(
            go.Scatter(x=xs, y=ys, mode="lines+markers", name=title, showlegend=False),
            row=row + 1,
            col=col + 1,
        )
        fig.update_xaxes(type="log", title_text=LABELS[result.quantity], row=row + 1, col=col + 1)
    q = result.query
    fig.update_layout(
        title=f"{q['model']} on {q['cluster']}: the best layout per {LABELS[result.quantity]}",
        height=700,
    )
    return fig

"""`llmplan schedule`: generate, simulate and draw pipeline schedules."""

from __future__ import annotations

from typing import Annotated, Any

from commands.common import JsonFlag, app, compact_table, emit_json, make_console, wrote
from commands.flags import Count, ListOf, Number, ScheduleName, option, output, png_output

# ----- pipeline schedules --------------------------------------------------------------

TIME = Number(0)


@app.command()
def schedule(
    name: Annotated[
        str, option(ScheduleName(), "the schedule", "--schedule", show_allowed=True)
    ] = "1f1b",
    pp: Annotated[int, option(Count(1), "pipeline ranks (pp)")] = 4,
    microbatches: Annotated[
        int,
        option(Count(1), "micro-batches per step", "--num-microbatches", "--microbatches"),
    ] = 8,
    vpp: Annotated[
        int | None, option(Count(1), "chunks per rank (default: the schedule's)")
    ] = None,
    f: Annotated[
        float,
        option(TIME, "forward time per rank per micro-batch (any time unit: the chart's)", "--f"),
    ] = 1.0,
    b: Annotated[float, option(TIME, "input-gradient (B) time, same unit as --f", "--b")] = 1.0,
    w: Annotated[float, option(TIME, "weight-gradient (W) time, same unit as --f", "--w")] = 1.0,
    comm: Annotated[float, option(TIME, "point-to-point time per hop, same unit as --f")] = 0.0,
    overlap_fb: Annotated[
        float, option(Number(0, 1), "DualPipe: fraction of an overlapped F&B pair hidden, 0 to 1")
    ] = 0.0,
    microbatch_group_size: Annotated[
        int | None,
        option(Count(1), "interleaved-1f1b: micro-batches per round, Llama 3's N (default pp)"),
    ] = None,
    compare: Annotated[
        Any,
        option(
            ListOf(ScheduleName()),
            "comma-separated schedules to compare, e.g. 1f1b,zb-h1,zbv,dualpipev",
            show_allowed=True,
        ),
    ] = None,
    html: output("write a plotly timeline as HTML") = None,
    png: png_output("write the timeline as PNG (needs kaleido and a Chrome/Chromium)") = None,
    as_json: JsonFlag = False,
) -> None:
    """Generate, simulate and draw a pipeline schedule (or compare several)."""
    from planner import api

    names = compare or [name]
    reports = [
        api.schedule(
            n,
            pp,
            microbatches,
            vpp if len(names) == 1 else None,
            f,
            b,
            w,
            comm,
            overlap_fb,
            microbatch_group_size if n == "interleaved-1f1b" else None,
        )
        for n in names
    ]
    if html or png:
        from commands.outputs import write_pages
        from plots.schedule import schedule_figure

        write_pages(schedule_figure(reports), html, png)
    if as_json:
        emit_json(reports[0] if len(reports) == 1 else [r.model_dump(mode="json") for r in reports])
        return
    from plots.schedule_chart import schedule_chart, summary_line

    console = make_console()
    if len(reports) > 1:
        console.print(
            f"pp {pp}, {microbatches} micro-batches, F {f} B {b} W {w}, comm {comm}; peak "
            "act.: micro-batches of activations held on rank 0; copies: parameter copies",
            markup=False,
            highlight=False,
        )
        table = compact_table(
            "schedule", "vpp", "step time", "bubble", "bubble %", "peak act.", "copies",
            wrap=("schedule",),
        )  # fmt: skip
        for report in reports:
            table.add_row(
                report.schedule,
                str(report.vpp),
                f"{report.step_time:g}",
                f"{report.bubble_time:g}",
                f"{100 * report.bubble_fraction:.1f}",
                f"{report.peak_activations[0]:g}",
                str(report.parameter_copies),
            )
        console.print(table)
    for report in reports:
        console.print(schedule_chart(report, max_width=max(console.width, 40)))
        console.print(summary_line(report))
        if report.bubble_time - report.pipelined_bubble_time > 1e-9:
            console.print(_skew_note(report), markup=False, highlight=False)
    wrote(html)
    wrote(png)


def _skew_note(report) -> str:
    """Why the step's bubble exceeds the paper's: the ranks' spans are skewed."""
    return (
        f"  the bubble above is a synchronous optimizer step's (every rank waits for the "
        f"last); per rank's own span it is {report.pipelined_bubble_time:.4g} (step "
        f"{report.pipelined_step_time:.4g}), the zero-bubble paper's measure when its "
        "post-validated optimizer step lets each rank start the next step at once (Qi et "
        "al. 2024 §4); llmplan's step times assume the synchronous step"
    )

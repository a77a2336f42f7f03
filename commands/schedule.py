"""`llmplan schedule`: generate, simulate and draw pipeline schedules."""

from __future__ import annotations

from typing import Annotated

import typer

from commands.common import (
    JsonFlag,
    app,
    emit_json,
    make_console,
)

# ----- pipeline schedules --------------------------------------------------------------


@app.command()
def schedule(
    name: Annotated[
        str,
        typer.Option(
            "--schedule",
            help="gpipe, 1f1b, interleaved-1f1b, zb-h1, zb-h2, zbv, dualpipe, dualpipev",
        ),
    ] = "1f1b",
    pp: Annotated[int, typer.Option(min=1, help="pipeline ranks")] = 4,
    microbatches: Annotated[int, typer.Option(min=1)] = 8,
    vpp: Annotated[
        int | None, typer.Option(min=1, help="chunks per rank (default: the schedule's)")
    ] = None,
    f: Annotated[float, typer.Option("--f", help="forward time per rank per micro-batch")] = 1.0,
    b: Annotated[
        float, typer.Option("--b", help="input-gradient time per rank per micro-batch")
    ] = 1.0,
    w: Annotated[
        float, typer.Option("--w", help="weight-gradient time per rank per micro-batch")
    ] = 1.0,
    comm: Annotated[float, typer.Option(help="point-to-point time per hop")] = 0.0,
    overlap_fb: Annotated[float, typer.Option(help="DualPipe F&B overlap, 0..1")] = 0.0,
    microbatch_group_size: Annotated[
        int | None, typer.Option(min=1, help="interleaved: Llama 3's N")
    ] = None,
    compare: Annotated[
        str | None,
        typer.Option(help="comma-separated schedules to compare, e.g. 1f1b,zb-h1,zbv,dualpipev"),
    ] = None,
    html: Annotated[str | None, typer.Option(help="write a plotly timeline as HTML")] = None,
    png: Annotated[
        str | None, typer.Option(help="write the timeline as PNG (needs kaleido + Chromium)")
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Generate, simulate and draw a pipeline schedule (or compare several)."""
    from planner import api

    names = [n.strip() for n in compare.split(",") if n.strip()] if compare else [name]
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
        from plots.schedule import schedule_figure, write_figure

        write_figure(schedule_figure(reports), html_path=html, png_path=png)
    if as_json:
        emit_json(reports[0] if len(reports) == 1 else [r.model_dump(mode="json") for r in reports])
        return
    from plots.schedule_chart import schedule_chart, summary_line

    console = make_console()
    if len(reports) > 1:
        from rich.table import Table

        table = Table(
            title=f"pp {pp}, {microbatches} micro-batches, F {f} B {b} W {w}, comm {comm}"
        )
        for column in (
            "schedule",
            "vpp",
            "step time",
            "bubble",
            "bubble %",
            "peak act. (rank 0)",
            "param copies",
        ):
            table.add_column(column, justify="left" if column == "schedule" else "right")
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
    for path in (html, png):
        if path:
            console.print(f"wrote {path}")

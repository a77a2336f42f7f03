"""`llmplan calibrate` and `llmplan validate`: predictions against real torch.distributed runs."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from commands.common import JsonFlag, app, emit_json, make_console, wrote
from commands.flags import Count, ListOf, Name, Number, OutputPath, option, output

# ----- validation against real torch.distributed runs ----------------------------------


def _need_torch() -> None:
    from hwspecs.errors import PlanError

    try:
        import torch  # noqa: F401
    except ImportError:
        raise PlanError(
            "validation needs torch: pip install torch==2.13.0 (the CPU wheel) or the 'validate' extra"
        ) from None


@app.command()
def calibrate(
    out: Annotated[
        str, option(OutputPath(), "write the cluster spec here (plus -accelerator/-link TOMLs)")
    ] = "local.toml",
    ranks: Annotated[
        Any, option(ListOf(Count(2)), "world sizes to fit collectives for, e.g. 2,4")
    ] = "2,4",
    as_json: JsonFlag = False,
) -> None:
    """Measure this machine (GEMM FLOP/s per rank, memory bandwidth, gloo collectives) as a cluster spec."""
    _need_torch()
    from validate.calibrate import calibrate as run_calibration

    sizes = tuple(ListOf(Count(2))(ranks))
    result = run_calibration(ranks=sizes, out_path=out)
    if as_json:
        emit_json(result)
        return
    console = make_console()
    best = {}
    for point in result.gemms:
        best[point.dtype] = max(best.get(point.dtype, 0.0), point.flops_per_s)
    console.print(f"calibrated {result.hostname} ({result.date}, torch {result.torch_version})")
    for dtype, flops in best.items():
        console.print(f"  GEMM {dtype}: {flops / 1e9:,.1f} GFLOP/s per rank (one thread)")
    console.print(f"  memory bandwidth: {result.memory_bytes_per_s / 1e9:,.2f} GB/s")
    for ranks, seconds in result.op_overhead_s.items():
        console.print(f"  per-operation overhead on {ranks} ranks: {seconds * 1e6:,.1f} us")
    for fit in result.collectives:
        console.print(
            f"  {fit.collective} over {fit.ranks} of {fit.world_size} ranks: "
            f"alpha {fit.alpha_s * 1e3:.3f} ms, "
            f"{fit.algbw_bytes_per_s / 1e9:,.2f} GB/s"
        )
    for kind, path in result.paths.items():
        console.print(f"wrote {kind}: {path}")


@app.command()
def validate(
    quick: Annotated[
        bool, typer.Option("--quick/--full", help="the quick set (CI) or every layout")
    ] = True,
    layouts: Annotated[
        Any,
        option(
            ListOf(Name("layout names (see --list)")), "comma-separated layout names (see --list)"
        ),
    ] = None,
    cluster: Annotated[
        str | None,
        option(
            Name("a calibrated cluster TOML"),
            "calibrated cluster TOML; calibrates first if omitted",
        ),
    ] = None,
    timeout_s: Annotated[
        float, option(Number(0, low_open=True), "time limit per layout, in seconds")
    ] = 180.0,
    list_layouts: Annotated[
        bool, typer.Option("--list", help="list the layout names and exit")
    ] = False,
    results: output(
        "append each layout's measured result here as it arrives (JSON lines), so an "
        "interrupted run keeps what it measured"
    ) = None,
    html: output("write predicted vs measured pipeline timelines") = None,
    out: output(
        "write the measured runs as a runs file (the train.json schema, on the calibrated "
        "cluster) that runs check and fit take"
    ) = None,
    as_json: JsonFlag = False,
) -> None:
    """Run real torch.distributed steps and print predicted vs measured side by side."""
    _need_torch()
    from validate.compare import compare
    from validate.run import FULL_LAYOUTS, QUICK_LAYOUTS, find_layouts, run_layouts

    if list_layouts:
        for spec in (*QUICK_LAYOUTS, *[s for s in FULL_LAYOUTS if s not in QUICK_LAYOUTS]):
            marker = "quick" if spec in QUICK_LAYOUTS else "full"
            make_console().print(f"{spec.name:<20} {marker}")
        return
    specs = find_layouts(layouts) if layouts else None
    if cluster is None:
        from validate.calibrate import calibrate as run_calibration

        if not as_json:
            make_console().print(
                "no --cluster given: calibrating this machine first (llmplan calibrate)"
            )
        cluster = run_calibration().paths["cluster"]
    console = make_console()

    def progress(result) -> None:
        if not as_json:
            console.print(f"  ran {result.name}: {result.status}")

    measured = run_layouts(
        specs, quick=quick, timeout_s=timeout_s, on_result=progress, jsonl_path=results
    )
    report = compare(measured, cluster)
    if out:
        import json

        from commands.outputs import write_text
        from validate.runs_out import measured_runs

        rows = [row.model_dump(mode="json") for row in measured_runs(measured, cluster)]
        write_text(out, json.dumps(rows, indent=1) + "\n")
    if html:
        from commands.outputs import write_pages
        from plots.validation import validation_figure

        write_pages(validation_figure(report), html, None)
    if as_json:
        emit_json(report)
        return
    _print_validation(report)
    wrote(html)
    wrote(results)
    wrote(out)


def _print_validation(report) -> None:
    from rich.table import Table

    table = Table(title="predicted / measured (error)", show_edge=False, padding=(0, 1))
    for column in ("layout", "status", "step ms", "memory MB", "comm MB / step"):
        left = column in ("layout", "status")
        table.add_column(column, justify="left" if left else "right", no_wrap=True)

    def cell(run, key, scale, digits):
        predicted, measured, error = (
            run.predicted.get(key),
            run.measured.get(key),
            run.error.get(key),
        )
        if predicted is None and measured is None:
            return "-"
        values = (predicted, measured)
        text = " / ".join("-" if v is None else f"{v * scale:.{digits}f}" for v in values)
        return text + ("" if error is None else f" ({100 * error:+.0f}%)")

    for run in report.runs:
        table.add_row(
            run.name,
            run.status,
            cell(run, "step_time_s", 1e3, 1),
            cell(run, "memory_bytes", 1e-6, 2),
            cell(run, "comm_bytes", 1e-6, 3),
        )
    console = make_console()
    console.print(f"llmplan validate on {report.cluster}")
    console.print(table)
    summary = report.summary
    failed = ", ".join(summary["failed"]) or "none"
    console.print(f"{summary['num_ok']} of {summary['num_runs']} layouts ran; failed: {failed}")
    for term, stats in summary["error"].items():
        if not stats.get("count"):
            continue
        verdict = ""
        if "met" in stats:
            verdict = " — target met" if stats["met"] else " — target NOT met"
        console.print(
            f"{term}: mean |error| {100 * stats['mean_abs']:.1f}%, median "
            f"{100 * stats['median_abs']:.1f}%, max {100 * stats['max_abs']:.1f}% over "
            f"{stats['count']} layouts{verdict}"
        )
    console.print(
        f"pipeline action order as simulated: {summary['pipeline_order_matches_planner']} of "
        f"{summary['pipeline_runs']} pipeline runs"
    )

"""`llmplan runs check` (predict published runs) and `llmplan fit` (fit a profile from them)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from commands.common import JsonFlag, app, emit_json, make_console
from commands.flags import Count, option, output

runs_app = typer.Typer(help="Predict published (or your own) training runs and measure the error.")
app.add_typer(runs_app, name="runs")

RunsFlag = Annotated[
    list[str] | None,
    typer.Option(
        "--runs",
        help="runs file (JSON list or flat CSV in the runs schema, e.g. the shared "
        "reference's targets.json) or the shipped catalog train; repeatable (default: train)",
    ),
]
ProfileFlag = Annotated[
    str | None,
    typer.Option(
        help="efficiency profile: auto (each row's accelerator's shipped profile for its "
        "stack, the default), none (the ideal model), a shipped profile or a TOML path"
    ),
]

ROW_FIELDS = ("id", "accelerator", "precision", "stack", "num_gpus", "measured_from",
              "measured_tokens_per_s_per_gpu", "predicted_tokens_per_s_per_gpu", "error",
              "measured_step_time_s", "predicted_step_time_s", "measured_mfu", "predicted_mfu",
              "predicted_mfu_causal", "published_mfu", "predicted_memory_gib",
              "memory_capacity_gib", "cp_algorithm", "reason")  # fmt: skip


def _write_csv(result, path: Path) -> None:
    import csv

    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(ROW_FIELDS)
        for row in result.rows:
            data = row.model_dump()
            layout = data.get("layout") or {}
            data["cp_algorithm"] = layout.get("cp_algorithm") if layout.get("cp", 1) > 1 else None
            writer.writerow(["" if data[key] is None else data[key] for key in ROW_FIELDS])


def _cp_cell(layout: dict | None) -> str:
    """A row's context parallelism: its degree and algorithm ("-" without CP)."""
    if not layout or layout.get("cp", 1) <= 1:
        return "-"
    return f"{layout['cp']} {layout.get('cp_algorithm', 'all-gather')}"


def _stats_table(title: str, stats):
    from rich.table import Table

    table = Table(title=title)
    table.add_column("", no_wrap=True, max_width=44, overflow="ellipsis")
    for name in ("n", "groups", "MAPE", "median", "±20%"):
        table.add_column(name, justify="right")
    table.add_column("worst rows", overflow="fold")
    for s in stats:
        worst = ", ".join(f"{row_id} {error:+.0%}" for row_id, error in s.worst[:2])
        table.add_row(s.name, str(s.n), str(s.num_groups), f"{s.mape:.1%}",
                      f"{s.median_signed_error:+.1%}", f"{s.within_20pct:.0%}", worst)  # fmt: skip
    return table


@runs_app.command("check")
def runs_check(
    runs: RunsFlag = None,
    source: Annotated[str | None, typer.Option(help="rows whose source contains this")] = None,
    accelerator: Annotated[str | None, typer.Option(help="rows on this accelerator")] = None,
    profile: ProfileFlag = None,
    limit: Annotated[int | None, option(Count(1), "the first N rows only")] = None,
    cluster: Annotated[
        str | None,
        typer.Option(
            help="catalog cluster the rows that name none ran on (default: each "
            "accelerator's reference cluster)"
        ),
    ] = None,
    rows: Annotated[bool, typer.Option("--rows", help="also print every row")] = False,
    csv: Annotated[Path | None, typer.Option("--csv", help="write every row to this CSV")] = None,
    html: output("write predicted vs measured throughput of every row as HTML") = None,
    as_json: JsonFlag = False,
) -> None:
    """Predict runs with every published layout field pinned (the rest searched) and print
    the throughput error per source, accelerator and precision, with coverage."""
    from planner import api

    result = api.runs_check(runs, source, accelerator, profile, limit, cluster)
    if csv is not None:
        _write_csv(result, csv)
    if html:
        from commands.outputs import write_pages
        from plots.runs import runs_figure

        write_pages(runs_figure(result), html, None)
    if as_json:
        emit_json(result)
        return
    from rich.table import Table

    console = make_console()
    console.print(
        f"runs: {result.runs}  profile: {result.profile}  covered {result.num_covered} of "
        f"{result.num_rows} rows (error = predicted / measured tokens/s − 1)"
    )
    if result.overall is not None:
        console.print(_stats_table("all covered rows", [result.overall]))
        console.print(_stats_table("per accelerator", result.by_accelerator))
        console.print(_stats_table("per accelerator and precision", result.by_precision))
        console.print(_stats_table("per source", result.by_source))
    if result.uncovered:
        table = Table(title="not covered")
        table.add_column("reason")
        table.add_column("rows", justify="right")
        for reason, count in result.uncovered.items():
            table.add_row(reason, str(count))
        console.print(table)
    short = [r for r in result.rows if not r.covered and r.memory_capacity_gib is not None]
    if short:
        table = Table(title="no layout fits: the least memory a layout needs")
        for name in ("id", "GPUs", "needs GiB", "HBM GiB"):
            table.add_column(name, justify="left" if name == "id" else "right")
        for r in short:
            table.add_row(r.id, str(r.num_gpus), f"{r.predicted_memory_gib:.1f}",
                          f"{r.memory_capacity_gib:.2f}")  # fmt: skip
        console.print(table)
    if rows:
        table = Table(title="rows")
        for name in ("id", "GPUs", "CP", "measured tok/s", "predicted", "error", "MFU meas",
                     "pred"):  # fmt: skip
            table.add_column(name, justify="left" if name in ("id", "CP") else "right")
        for r in result.rows:
            if r.covered:
                table.add_row(r.id, str(r.num_gpus), _cp_cell(r.layout),
                              f"{r.measured_tokens_per_s_per_gpu:,.0f}",
                              f"{r.predicted_tokens_per_s_per_gpu:,.0f}", f"{r.error:+.1%}",
                              f"{r.measured_mfu:.1%}", f"{r.predicted_mfu:.1%}")  # fmt: skip
        console.print(table)
    if html:
        console.print(f"wrote {html}", markup=False, highlight=False)


@app.command("fit")
def fit(
    accelerator: Annotated[str, typer.Option(help="accelerator whose runs are fitted")],
    runs: RunsFlag = None,
    stack: Annotated[
        str | None,
        typer.Option(help="only runs of this software stack (megatron, pytorch-fsdp, jax, ...)"),
    ] = None,
    exclude: Annotated[
        list[str] | None,
        typer.Option(
            help="runs files whose rows are never fitted on (e.g. the shared "
            "reference's targets.json); repeatable"
        ),
    ] = None,
    out: Annotated[Path | None, typer.Option(help="write the profile TOML here")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Fit an efficiency profile (at most 8 of 9 bounded terms) to measured runs by robust
    least squares on log throughput; report in-sample, k-fold and leave-one-source-out
    errors, each held-out fold fitted and its terms selected without its rows."""
    import shlex
    import sys

    from planner import api

    command = "llmplan " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    report = api.fit(runs, accelerator, stack, command, exclude)
    if out is not None:
        out.write_text(report.profile_toml)
    if as_json:
        emit_json(report)
        return
    from rich.table import Table

    f = report.fit
    console = make_console()

    def pct(value):
        return "-" if value is None else f"{value:.1%}"

    console.print(
        f"{accelerator}: {f['num_rows']} rows in {f['num_groups']} groups; MAPE ideal "
        f"{pct(f['ideal_mape'])} → in-sample {pct(f['in_sample_mape'])}, k-fold by "
        f"{'source' if f['loso_mape'] is not None else 'configuration group (one source)'} "
        f"{pct(f['kfold_mape'])}, leave-one-source-out {pct(f['loso_mape'])} (each fold "
        "selects its own terms)"
    )
    table = Table(title="fitted terms")
    table.add_column("term")
    table.add_column("value", justify="right")
    table.add_column("fitted")
    table.add_column("one model out", justify="right")
    spans = f.get("term_range_one_model_out") or {}
    for name, value in f["values"].items():
        span = spans.get(name)
        table.add_row(
            name,
            f"{value:.4g}",
            "yes" if name in f["fitted_terms"] else "ideal",
            "-" if span is None else f"{span[0]:.4g}–{span[1]:.4g}",
        )
    console.print(table)
    table = Table(title="per source family")
    for name in ("source", "in-sample MAPE", "left-out MAPE"):
        table.add_column(name, justify="left" if name == "source" else "right")
    for name, value in f["in_sample_mape_by_source"].items():
        table.add_row(name, pct(value), pct(f["loso_mape_by_source"].get(name)))
    console.print(table)
    if f.get("layout_range"):
        console.print(f"layouts measured: {api.describe_layout_range(f['layout_range'])}")
    if report.excluded_rows:
        console.print(f"{report.excluded_rows} rows left out (listed by --exclude)")
    if out is not None:
        console.print(f"wrote {out}")

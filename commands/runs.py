"""`llmplan runs check` (predict published runs) and `llmplan fit` (fit a profile from them)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from commands.common import JsonFlag, app, emit_json, make_console

runs_app = typer.Typer(help="Predict published (or your own) training runs and measure the error.")
app.add_typer(runs_app, name="runs")

RunsFlag = Annotated[
    list[str] | None,
    typer.Option(
        "--runs",
        help="runs file (JSON list or flat CSV in the runs schema) or a shipped catalog "
        "(train, targets); repeatable (default: train and targets)",
    ),
]
ProfileFlag = Annotated[
    str | None,
    typer.Option(
        help="efficiency profile: none (the ideal model), an accelerator's shipped profile "
        "or a profile TOML path (default: each accelerator's shipped profile)"
    ),
]

ROW_FIELDS = ("id", "accelerator", "precision", "stack", "num_gpus", "measured_from",
              "measured_tokens_per_s_per_gpu", "predicted_tokens_per_s_per_gpu", "error",
              "measured_step_time_s", "predicted_step_time_s", "measured_mfu", "predicted_mfu",
              "predicted_mfu_causal", "published_mfu", "predicted_memory_gib", "reason")  # fmt: skip


def _write_csv(result, path: Path) -> None:
    import csv

    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(ROW_FIELDS)
        for row in result.rows:
            data = row.model_dump()
            writer.writerow(["" if data[key] is None else data[key] for key in ROW_FIELDS])


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
    limit: Annotated[int | None, typer.Option(min=1, help="the first N rows only")] = None,
    rows: Annotated[bool, typer.Option("--rows", help="also print every row")] = False,
    csv: Annotated[Path | None, typer.Option("--csv", help="write every row to this CSV")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Predict runs with every published layout field pinned (the rest searched) and print
    the throughput error per source, accelerator and precision, with coverage."""
    from planner import api

    result = api.runs_check(runs, source, accelerator, profile, limit)
    if csv is not None:
        _write_csv(result, csv)
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
    if rows:
        table = Table(title="rows")
        for name in ("id", "GPUs", "measured tok/s", "predicted", "error", "MFU meas", "pred"):
            table.add_column(name, justify="left" if name == "id" else "right")
        for r in result.rows:
            if r.covered:
                table.add_row(r.id, str(r.num_gpus), f"{r.measured_tokens_per_s_per_gpu:,.0f}",
                              f"{r.predicted_tokens_per_s_per_gpu:,.0f}", f"{r.error:+.1%}",
                              f"{r.measured_mfu:.1%}", f"{r.predicted_mfu:.1%}")  # fmt: skip
        console.print(table)

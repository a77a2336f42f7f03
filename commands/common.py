"""What every command shares: the typer app, the --json flag, JSON and console output."""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer
import typer.core

CONTEXT = {"help_option_names": ["-h", "--help"]}

#: ``llmplan --help`` lists the commands in the order a user needs them: find a layout,
#: look into one, then the pieces, the hardware, and checking the model against the world.
COMMAND_ORDER = (
    "plan", "estimate", "memory", "comm", "schedule", "sweep", "topology", "collective",
    "bytes-per-param", "catalog", "runs", "fit", "calibrate", "validate",
)  # fmt: skip


class _OrderedGroup(typer.core.TyperGroup):
    def list_commands(self, ctx) -> list[str]:
        names = super().list_commands(ctx)
        known = [name for name in COMMAND_ORDER if name in names]
        return known + [name for name in names if name not in COMMAND_ORDER]


app = typer.Typer(
    cls=_OrderedGroup,
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings=CONTEXT,
    help="llmplan: plan parallel layouts for LLM training and predict step time and memory.",
)
catalog_app = typer.Typer(
    no_args_is_help=True,
    context_settings=CONTEXT,
    help="List and show catalog entries (models, accelerators, clusters, links).",
)
app.add_typer(catalog_app, name="catalog")

GIB = 2**30

JsonFlag = Annotated[bool, typer.Option("--json", help="Print the result as JSON.")]


def version() -> str:
    """llmplan's version from the installed package's metadata (else pyproject.toml)."""
    from importlib import metadata

    try:
        return metadata.version("llmplan")
    except metadata.PackageNotFoundError:
        import re
        from pathlib import Path

        text = (Path(__file__).parent.parent / "pyproject.toml").read_text()
        found = re.search(r'^version\s*=\s*"([^"]+)"', text, re.MULTILINE)
        return found.group(1) if found else "unknown"


def _print_version(flag: bool) -> None:
    if flag:
        sys.stdout.write(f"llmplan {version()}\n")
        raise typer.Exit(0)


@app.callback()
def main(
    show_version: Annotated[
        bool,
        typer.Option(
            "--version", is_eager=True, callback=_print_version, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """llmplan: plan parallel layouts for LLM training and predict step time and memory."""


def emit_json(data) -> None:
    """Print a pydantic model or plain data as JSON on stdout."""
    if hasattr(data, "model_dump"):
        data = data.model_dump(mode="json")
    sys.stdout.write(json.dumps(data, indent=2) + "\n")


def make_console():
    from rich.console import Console

    return Console()


def gib(value: float | None) -> str:
    return "-" if value is None else f"{value / GIB:,.2f}"


def wrote(path: str | None) -> None:
    """Tell the user a file was written (nothing when no path was asked for)."""
    if path:
        make_console().print(f"wrote {path}", markup=False, highlight=False, soft_wrap=True)


def fits_line(total_bytes: float, report) -> str:
    """``77.33 GiB of 75.67 usable (79.65 − 5%): does not fit`` — one wording of "fits" for
    every command (``report``: capacity_bytes, mem_headroom, usable_bytes, fits)."""
    verdict = "fits" if report.fits else "does not fit"
    return (
        f"{gib(total_bytes)} GiB of {gib(report.usable_bytes)} usable "
        f"({gib(report.capacity_bytes)} − {100 * report.mem_headroom:g}%): {verdict}"
    )


def compact_table(*columns: str, left: tuple[str, ...] = (), wrap: tuple[str, ...] = (), **kw):
    """A rich table that keeps numbers whole at 80 columns: no vertical rules or edge, one
    space between columns, numbers right-aligned and never wrapped or cut; only the
    ``wrap`` columns (names, lists) fold onto more lines. ``left``: left-aligned columns."""
    from rich import box
    from rich.table import Table

    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1, 0, 0), **kw)
    for name in columns:
        folds = name in wrap
        table.add_column(
            name,
            justify="left" if name in left or folds else "right",
            no_wrap=not folds,
            overflow="fold" if folds else "ellipsis",
        )
    return table

"""`llmplan catalog list|show`."""

from __future__ import annotations

from typing import Annotated

import typer

from commands.common import (
    JsonFlag,
    catalog_app,
    emit_json,
    make_console,
)

# ----- catalog --------------------------------------------------------------------------


@catalog_app.command("list")
def catalog_list(
    kind: Annotated[
        str | None, typer.Argument(help="models, accelerators, clusters or links (default: all)")
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """List catalog names."""
    from planner import api

    result = api.list_catalog(kind)
    if as_json:
        emit_json(result)
        return
    from rich.table import Table

    table = Table(title="llmplan catalog")
    table.add_column("kind")
    table.add_column("names")
    for name, entries in result.items():
        table.add_row(name, ", ".join(entries))
    make_console().print(table)


@catalog_app.command("show")
def catalog_show(
    name: Annotated[str, typer.Argument(help="a catalog name, e.g. llama3-405b or h100-sxm")],
    as_json: JsonFlag = False,
) -> None:
    """Show one catalog entry with its sources (models also with parameter counts)."""
    from planner import api

    result = api.show_catalog(name)
    if as_json:
        emit_json(result)
        return
    from rich.table import Table

    sources = result.pop("sources", {}) or {}
    table = Table(title=f"{result.get('kind')} {name}")
    table.add_column("field")
    table.add_column("value")
    table.add_column("source", overflow="fold")
    for key, value in result.items():
        if isinstance(value, int) and not isinstance(value, bool) and key.startswith("num_params"):
            value = f"{value:,} ({value / 1e9:.2f} B)"
        table.add_row(key, str(value), sources.get(key, ""))
    make_console().print(table)

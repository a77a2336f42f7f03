"""`llmplan catalog list|show`."""

from __future__ import annotations

from typing import Annotated

import typer

from commands.common import JsonFlag, catalog_app, compact_table, emit_json, make_console
from commands.flags import CatalogKind, Choice, option
from commands.flags import value as enum_value

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
    table = compact_table("kind", "names", left=("kind",), wrap=("names",))
    for name, entries in result.items():
        table.add_row(name, ", ".join(entries))
    make_console().print(table)


@catalog_app.command("show")
def catalog_show(
    name: Annotated[
        str,
        typer.Argument(
            help="a catalog name, e.g. llama3-405b or h100-sxm; KIND:NAME (cluster:mi300x) "
            "for a name that is more than one kind"
        ),
    ],
    kind: Annotated[
        CatalogKind | None,
        option(Choice(CatalogKind), "the kind, for a name shared by kinds (mi300x)"),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Show one catalog entry: every figure with its unit and its source."""
    import re
    import sys

    from planner import api

    kind = enum_value(kind)
    result = api.show_catalog(name, kind)
    bare = name.split(":")[-1]
    shared = api.catalog_kinds_of(bare)
    if kind is None and ":" not in name and len(shared) > 1:
        others = ", ".join(f"catalog show {other}:{bare}" for other in shared[1:])
        sys.stderr.write(f"{bare} is also a {' and a '.join(shared[1:])}: {others}\n")
    if as_json:
        emit_json(result)
        return
    sources = dict(result.pop("sources", {}) or {})
    notes = result.pop("notes", None)
    rows = list(_flatten(result))
    console = make_console()
    console.print(f"{result.get('kind')} {bare}", markup=False, highlight=False)
    table = compact_table("field", "value", "source", left=("field",), wrap=("value", "source"))
    table.columns[0].min_width = max(len(key) for key, _ in rows)
    # Figures never wrap: the longest, up to "79.65 GiB (85.5 GB)", sets the value column.
    table.columns[1].min_width = min(20, max(len(_formatted(k, v)) for k, v in rows))
    # A source of a group ("tiers.0", a link's "busbw_efficiency") goes on its first row.
    for key in list(sources):
        group = re.sub(r"\.(\d+)", r"[\1]", key)
        first = next((row for row, _ in rows if row == group or row.startswith(group)), None)
        if first is not None and first not in sources:
            sources[first] = sources.pop(key)
    for key, value in rows:
        table.add_row(key, _formatted(key, value), sources.pop(key, ""))
    for key, source in sources.items():  # sources of a group of figures (a model's shape)
        table.add_row(f"({key})", "", source)
    console.print(table)
    if notes:
        console.print(f"notes: {notes}", markup=False, highlight=False)


def _flatten(data: dict, prefix: str = ""):
    """``(dotted key, value)`` pairs: dicts open into ``a.b``, lists of dicts into ``a[0].b``."""
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            yield from _flatten(value, f"{dotted}.")
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            for index, item in enumerate(value):
                yield from _flatten(item, f"{dotted}[{index}].")
        else:
            yield dotted, value


def _formatted(key: str, value) -> str:
    """A value with its unit: bytes in GiB (and GB), rates in GB/s or TB/s, times in µs."""
    if value is None or value == {} or value == []:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list):
        return ", ".join(str(item) for item in value)
    if not isinstance(value, int | float):
        return str(value)
    leaf = key.rsplit(".", 1)[-1]
    if leaf.endswith("bytes_per_s") or "bytes_per_s_" in leaf:
        return f"{value / 1e12:,.2f} TB/s" if value >= 1e12 else f"{value / 1e9:,.1f} GB/s"
    if leaf.endswith("_bytes"):
        return f"{value / 2**30:,.2f} GiB ({value / 1e9:,.1f} GB)"
    if leaf.endswith("_tflops"):
        return f"{value:,.1f} TFLOP/s"
    if leaf.endswith("_s"):
        return f"{value * 1e6:,.3g} µs" if value < 1e-3 else f"{value:,.4g} s"
    if leaf.endswith("_w"):
        return f"{value:,.0f} W"
    if leaf.startswith("num_") and "params" in leaf and isinstance(value, int):
        return f"{value:,} ({value / 1e9:.2f} B)"
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:.4g}"

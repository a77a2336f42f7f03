"""What every command shares: the typer app, option types, JSON and console output."""

from __future__ import annotations

import json
import sys
from enum import Enum
from typing import Annotated

import typer

app = typer.Typer(
    add_completion=False,
    no_args_is_help=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    help="llmplan: plan parallel layouts for LLM training and predict step time and memory.",
)
catalog_app = typer.Typer(
    help="List and show catalog entries (models, accelerators, clusters, links)."
)
app.add_typer(catalog_app, name="catalog")

GIB = 2**30

JsonFlag = Annotated[bool, typer.Option("--json", help="Print the result as JSON.")]


class Precision(str, Enum):
    bf16_mixed = "bf16-mixed"
    fp16_mixed = "fp16-mixed"
    fp32 = "fp32"
    bf16 = "bf16"
    fp8_mixed = "fp8-mixed"


class MeasureSet(str, Enum):
    none = "none"
    deepseek_v3 = "deepseek-v3"


PrecisionFlag = Annotated[
    Precision | None,
    typer.Option(help="precision recipe (default: the model's training recipe, else bf16-mixed)"),
]


class WeightPass(str, Enum):
    inputs = "inputs"
    graph = "graph"


WeightPassFlag = Annotated[
    WeightPass,
    typer.Option(
        help="what zero-bubble schedules keep from B to W: the weight GEMMs' inputs and output "
        "gradients (inputs: zero-bubble paper, Megatron) or the whole graph (graph: torchtitan)"
    ),
]
EtpFlag = Annotated[
    int | None,
    typer.Option(
        min=1,
        help="expert tensor parallel: the routed experts' TP degree, 1 or tp (default tp); "
        "with 1 the TP ranks fold into the EP group (Megatron-Core --expert-tensor-parallel-size)",
    ),
]
MoeImbalanceFlag = Annotated[
    float | None,
    typer.Option(
        min=1.0,
        help="MoE, dropless routing: routed tokens on the busiest EP rank over the balanced "
        "share (default: the model's, 1.0)",
    ),
]
MoeCapacityFlag = Annotated[
    float | None,
    typer.Option(
        min=0.01,
        help="MoE: capacity-based routing at this capacity factor (padded buffers computed "
        "and exchanged; default: dropless)",
    ),
]
MemHeadroomFlag = Annotated[
    float,
    typer.Option(
        min=0.0,
        max=0.99,
        help="fraction of HBM kept free: a layout fits in HBM × (1 − headroom)",
    ),
]
MemoryMeasuresFlag = Annotated[
    MeasureSet | None,
    typer.Option(
        help="activation-memory measures (default: the model's training recipe, else none)"
    ),
]


class Optimizer(str, Enum):
    adamw = "adamw"
    sgd_momentum = "sgd-momentum"
    sgd = "sgd"
    lion = "lion"
    adafactor = "adafactor"
    muon = "muon"


class GradDtype(str, Enum):
    fp32 = "fp32"
    bf16 = "bf16"
    fp16 = "fp16"


class MasterDtype(str, Enum):
    fp32 = "fp32"
    bf16 = "bf16"
    none = "none"


class Recompute(str, Enum):
    none = "none"
    selective = "selective"
    full = "full"


def option_value(option):
    return option.value if isinstance(option, Enum) else option


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


def int_list(text: str | None, name: str) -> list[int] | None:
    from hwspecs.errors import PlanError

    if text is None:
        return None
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise PlanError(f"--{name} takes integers separated by commas, got '{text}'") from None
    if not values or min(values) < 1:
        raise PlanError(f"--{name} needs positive integers, got '{text}'")
    return values


def fits_line(total_bytes: float, report) -> str:
    """``77.33 GiB of 75.67 usable (79.65 − 5%): does not fit`` — one wording of "fits" for
    every command (``report``: capacity_bytes, mem_headroom, usable_bytes, fits)."""
    verdict = "fits" if report.fits else "does not fit"
    return (
        f"{gib(total_bytes)} GiB of {gib(report.usable_bytes)} usable "
        f"({gib(report.capacity_bytes)} − {100 * report.mem_headroom:g}%): {verdict}"
    )

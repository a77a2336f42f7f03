"""`llmplan collective`, `llmplan comm` and `llmplan topology`."""

from __future__ import annotations

from enum import Enum
from typing import Annotated

import typer

from commands.common import (
    EtpFlag,
    JsonFlag,
    PrecisionFlag,
    Recompute,
    app,
    emit_json,
    make_console,
    option_value,
)

# ----- communication -------------------------------------------------------------------


class CollectiveOp(str, Enum):
    all_reduce = "all-reduce"
    all_gather = "all-gather"
    reduce_scatter = "reduce-scatter"
    all_to_all = "all-to-all"
    p2p = "p2p"


def _rate(bytes_per_s: float) -> str:
    return f"{bytes_per_s / 1e9:,.1f} GB/s"


@app.command()
def collective(
    op: Annotated[CollectiveOp, typer.Option(help="the collective")],
    num_bytes: Annotated[
        str, typer.Option("--bytes", help="message size: 1GiB, 512MB, 1e9 or bytes")
    ],
    ranks: Annotated[int, typer.Option(min=1, help="group size (consecutive ranks)")],
    cluster: Annotated[str, typer.Option(help="catalog cluster or TOML path")] = "dgx-h100",
    algorithm: Annotated[
        str | None, typer.Option(help="ring, tree, hierarchical, nvls, torus, pairwise, direct")
    ] = None,
    gpus: Annotated[
        int | None, typer.Option(min=1, help="use the first N devices of the cluster")
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Time of one collective on one cluster, with algorithm and bus bandwidth."""
    from planner import api

    result = api.collective(
        option_value(op), num_bytes, ranks, cluster, algorithm=algorithm, gpus=gpus
    )
    if as_json:
        emit_json(result)
        return
    console = make_console()
    console.print(
        f"{result.op} of {result.num_bytes / 2**20:,.1f} MiB over {result.ranks} ranks on {cluster}: "
        f"{result.time_s * 1e6:,.1f} µs with {result.algorithm} ({result.tiers}); "
        f"algbw {_rate(result.algbw_bytes_per_s)}, busbw {_rate(result.busbw_bytes_per_s)}"
    )
    if len(result.alternatives) > 1:
        others = ", ".join(f"{name} {t * 1e6:,.1f} µs" for name, t in result.alternatives.items())
        console.print(f"alternatives: {others}")


@app.command()
def comm(
    model: Annotated[
        str, typer.Option(help="catalog model, model TOML or HF config.json")
    ] = "llama3-405b",
    cluster: Annotated[str, typer.Option(help="catalog cluster or TOML path")] = "llama3-h100-24k",
    tp: Annotated[int, typer.Option(min=1)] = 8,
    cp: Annotated[int, typer.Option(min=1)] = 1,
    pp: Annotated[int, typer.Option(min=1)] = 16,
    dp: Annotated[int, typer.Option(min=1)] = 128,
    ep: Annotated[int, typer.Option(min=1)] = 1,
    etp: EtpFlag = None,
    vpp: Annotated[int | None, typer.Option(min=1)] = None,
    seq_len: Annotated[int, typer.Option(min=1)] = 8192,
    global_batch_tokens: Annotated[int | None, typer.Option(min=1)] = None,
    global_batch_size: Annotated[int | None, typer.Option(min=1, help="sequences per step")] = None,
    micro_batch_size: Annotated[int, typer.Option(min=1)] = 1,
    schedule: Annotated[str, typer.Option()] = "1f1b",
    zero_stage: Annotated[int, typer.Option(min=0, max=3)] = 1,
    recompute: Annotated[Recompute, typer.Option()] = Recompute.none,
    sequence_parallel: Annotated[
        bool, typer.Option("--sequence-parallel/--no-sequence-parallel")
    ] = True,
    precision: PrecisionFlag = None,
    order: Annotated[
        str | None, typer.Option(help="mesh order innermost first, e.g. tp,cp,ep,pp,dp")
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Per-axis communication of one layout per step: bytes per GPU, tier, raw and exposed time."""
    from planner import api

    if global_batch_tokens is None and global_batch_size is None:
        global_batch_tokens = 16 * 2**20
    job = api.build_job(
        model,
        seq_len,
        global_batch_tokens=global_batch_tokens,
        global_batch_size=global_batch_size,
        precision=option_value(precision),
    )
    layout = api.build_layout(
        tp=tp,
        cp=cp,
        pp=pp,
        dp=dp,
        ep=ep,
        etp=etp,
        vpp=vpp,
        micro_batch_size=micro_batch_size,
        schedule=schedule,
        zero_stage=zero_stage,
        recompute=option_value(recompute),
        sequence_parallel=sequence_parallel,
    )
    report = api.comm(job, layout, cluster, order=order)
    if as_json:
        emit_json(report)
        return
    from rich.table import Table

    table = Table(
        title=f"{report.model} on {report.cluster} ({report.num_gpus} GPUs), per GPU per step"
    )
    for name in ("axis", "group", "tier", "collective", "GB / step", "time s", "exposed s"):
        table.add_column(
            name, justify="left" if name in ("axis", "tier", "collective") else "right"
        )
    for axis in report.axes:
        table.add_row(
            axis.axis,
            str(axis.group_size),
            axis.tier,
            axis.collective,
            f"{axis.bytes_per_step / 1e9:,.2f}",
            f"{axis.time_s:.4f}",
            f"{axis.exposed_time_s:.4f}",
        )
    console = make_console()
    console.print(table)
    for note in report.notes:
        console.print(f"note: {note}")


@app.command()
def topology(
    cluster: Annotated[str, typer.Option(help="catalog cluster or TOML path")] = "llama3-h100-24k",
    tp: Annotated[int, typer.Option(min=1)] = 1,
    cp: Annotated[int, typer.Option(min=1)] = 1,
    pp: Annotated[int, typer.Option(min=1)] = 1,
    dp: Annotated[
        int | None, typer.Option(min=1, help="default: fills --gpus or the cluster")
    ] = None,
    ep: Annotated[int, typer.Option(min=1)] = 1,
    etp: EtpFlag = None,
    gpus: Annotated[int | None, typer.Option(min=1, help="use the first N devices")] = None,
    order: Annotated[str | None, typer.Option(help="mesh order innermost first")] = None,
    html: Annotated[str | None, typer.Option(help="write the hierarchy as plotly HTML")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Rank placement: which ranks form each axis's groups and which links they cross."""
    from planner import api

    sizes = {"tp": tp, "cp": cp, "pp": pp, "ep": ep}
    if etp is not None:
        sizes["etp"] = etp
    if dp is not None:
        sizes["dp"] = dp
    report = api.topology(cluster, sizes, order=order, gpus=gpus)
    if html:
        from plots.topology import write_topology_html

        write_topology_html(report, html)
    if as_json:
        emit_json(report)
        return
    from rich.table import Table

    table = Table(
        title=f"{report.cluster}: {report.num_gpus} GPUs, order {', '.join(report.order)}"
    )
    for name in (
        "axis",
        "size",
        "groups",
        "example ranks",
        "tiers crossed",
        "bottleneck GB/s per rank",
    ):
        table.add_column(name)
    for axis in report.axes:
        ranks = ", ".join(str(r) for r in axis.example_ranks[:8]) + (
            " …" if len(axis.example_ranks) > 8 else ""
        )
        table.add_row(
            axis.axis,
            str(axis.group_size),
            str(axis.num_groups),
            ranks,
            " → ".join(axis.tiers) or "-",
            f"{axis.bottleneck_bytes_per_s_per_rank / 1e9:,.1f}"
            if axis.bottleneck_bytes_per_s_per_rank
            else "-",
        )
    console = make_console()
    console.print(table)
    for note in report.notes:
        console.print(f"note: {note}")
    if html:
        console.print(f"wrote {html}")

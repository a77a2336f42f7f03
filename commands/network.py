"""`llmplan collective`, `llmplan comm` and `llmplan topology`."""

from __future__ import annotations

from enum import Enum
from typing import Annotated

from commands.common import JsonFlag, app, compact_table, emit_json, make_console, wrote
from commands.flags import (
    CLUSTER,
    DEFAULT_LAYOUT,
    JOB,
    Choice,
    Count,
    Name,
    Parser,
    Values,
    build_job,
    build_layout,
    option,
    output,
    png_output,
    uses,
    value,
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


class ByteSize(Parser):
    """A message size: 1GiB, 512MB, 1e9 or bytes (:func:`planner.spec.units.parse_bytes`)."""

    allowed = "a size in bytes, e.g. 4096, 512MB, 1GiB, 1e9"

    def parse(self, text: str) -> float:
        from hwspecs.errors import PlanError
        from planner.api import parse_bytes

        try:
            return parse_bytes(text)
        except PlanError:
            self.fail(text)


@app.command()
@uses(cluster=CLUSTER.only("cluster", "accelerator", "gpus"))
def collective(
    op: Annotated[CollectiveOp, option(Choice(CollectiveOp), "the collective", show_allowed=True)],
    num_bytes: Annotated[
        float, option(ByteSize(), "message size: 1GiB, 512MB, 1e9 or bytes", "--bytes")
    ],
    ranks: Annotated[int, option(Count(1), "group size (consecutive ranks)")],
    cluster: Values,
    algorithm: Annotated[
        str | None,
        option(
            Name("ring, tree, hierarchical, nvls, torus, pairwise or direct"),
            "ring, tree, hierarchical, nvls, torus, pairwise, direct",
        ),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Time of one collective on one cluster, with algorithm and bus bandwidth."""
    from planner import api

    result = api.collective(
        value(op), num_bytes, ranks, cluster.cluster, algorithm=algorithm, gpus=cluster.gpus
    )
    if as_json:
        emit_json(result)
        return
    console = make_console()
    tiers = " → ".join(result.tiers) if isinstance(result.tiers, list) else result.tiers
    console.print(
        f"{result.op} of {result.num_bytes / 2**20:,.1f} MiB over {result.ranks} ranks on {cluster.cluster}: "
        f"{result.time_s * 1e6:,.1f} µs with {result.algorithm} ({tiers}); "
        f"algbw {_rate(result.algbw_bytes_per_s)}, busbw {_rate(result.busbw_bytes_per_s)}"
    )
    if len(result.alternatives) > 1:
        others = ", ".join(f"{name} {t * 1e6:,.1f} µs" for name, t in result.alternatives.items())
        console.print(f"alternatives: {others}")


@app.command()
@uses(job=JOB, cluster=CLUSTER, layout=DEFAULT_LAYOUT)
def comm(
    job: Values,
    cluster: Values,
    layout: Values,
    as_json: JsonFlag = False,
) -> None:
    """Per-axis communication of one layout per step: bytes per GPU, tier, raw and exposed time."""
    from planner import api

    report = api.comm(
        build_job(job), build_layout(layout, job), cluster.cluster, cluster.order, cluster.gpus
    )
    if as_json:
        emit_json(report)
        return
    console = make_console()
    console.print(
        f"{report.model} on {report.cluster} ({report.num_gpus:,} GPUs), per GPU per step",
        markup=False,
        highlight=False,
    )
    table = compact_table(
        "axis", "group", "tier", "collective", "GB / step", "time s", "exposed s",
        left=("axis",), wrap=("tier", "collective"),
    )  # fmt: skip
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
    console.print(table)
    for note in report.notes:
        console.print(f"note: {note}")


@app.command()
@uses(
    cluster=CLUSTER, mesh=DEFAULT_LAYOUT.only("tp", "cp", "pp", "dp", "ep", "etp").defaults(dp=None)
)
def topology(
    cluster: Values,
    mesh: Values,
    html: output("write the hierarchy as a plotly page (opens offline)") = None,
    png: png_output("write the hierarchy as PNG (needs kaleido and a Chrome/Chromium)") = None,
    as_json: JsonFlag = False,
) -> None:
    """Rank placement: which ranks form each axis's groups and which links they cross.

    The layout defaults to the other commands' (tp 8, pp 16); --dp defaults to what fills
    --gpus or the cluster.
    """
    from planner import api

    sizes = {axis: size for axis, size in mesh.items() if size is not None}
    report = api.topology(cluster.cluster, sizes, order=cluster.order, gpus=cluster.gpus)
    if html or png:
        from commands.outputs import write_pages
        from plots.topology import topology_figure

        write_pages(topology_figure(report), html, png)
    if as_json:
        emit_json(report)
        return
    console = make_console()
    console.print(
        f"{report.cluster}: {report.num_gpus:,} GPUs, order {', '.join(report.order)}; "
        "bottleneck: the slowest link's GB/s per rank",
        markup=False,
        highlight=False,
    )
    table = compact_table(
        "axis", "size", "groups", "example ranks", "tiers crossed", "GB/s",
        left=("axis",), wrap=("example ranks", "tiers crossed"),
    )  # fmt: skip
    for axis in report.axes:
        more = len(axis.example_ranks) - 8
        ranks = ", ".join(str(r) for r in axis.example_ranks[:8]) + (
            f" (+{more:,} more)" if more > 0 else ""
        )
        table.add_row(
            axis.axis,
            f"{axis.group_size:,}",
            f"{axis.num_groups:,}",
            ranks,
            " → ".join(axis.tiers) or "-",
            f"{axis.bottleneck_bytes_per_s_per_rank / 1e9:,.1f}"
            if axis.bottleneck_bytes_per_s_per_rank
            else "-",
        )
    console.print(table)
    for note in report.notes:
        console.print(f"note: {note}")
    wrote(html)
    wrote(png)

"""`llmplan plan` and `llmplan estimate`: the layout search and one layout's estimate."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from commands.common import GIB, JsonFlag, app, emit_json, make_console, wrote
from commands.flags import (
    CLUSTER,
    JOB,
    LAYOUT,
    MFU_DTYPE,
    PINS,
    Count,
    Name,
    Number,
    Values,
    build_job,
    build_layout,
    option,
    output,
    pinned,
    uses,
)
from commands.flags import (
    value as enum_value,
)

# ----- plan and estimate ---------------------------------------------------------------

ExplainFlag = Annotated[
    bool, typer.Option("--explain", help="why the winner wins, why rows were rejected")
]


@app.command()
@uses(job=JOB, cluster=CLUSTER, pins=PINS)
def plan(
    job: Values,
    cluster: Values,
    pins: Values,
    top: Annotated[int, option(Count(1), "results to show")] = 5,
    objective: Annotated[
        str, option(Name("step_time, memory or mfu"), "step_time, memory or mfu")
    ] = "step_time",
    mem_headroom: Annotated[
        float, option(Number(0, 1, high_open=True), "fraction of HBM kept free")
    ] = 0.05,
    mfu_dtype: MFU_DTYPE.annotation = MFU_DTYPE.default,
    explain: ExplainFlag = False,
    emit: Annotated[
        str | None,
        option(
            Name("torchtitan or megatron"), "print the winner's settings for: torchtitan, megatron"
        ),
    ] = None,
    csv: output("write every feasible row as CSV") = None,
    html: output("write step time vs memory of all feasible layouts as HTML") = None,
    as_json: JsonFlag = False,
) -> None:
    """Search every layout and rank them (default: Llama 3 405B on 16,384 H100s)."""
    from planner import api

    gpus = cluster.gpus
    if gpus is None and cluster.cluster == api.DEFAULT_PLAN["cluster"]:
        gpus = api.DEFAULT_PLAN["gpus"]
    query = build_job(job)
    space = api.build_search_space(**pinned(pins))
    with _progress(not as_json) as advance:
        result, table = api.plan(
            query,
            cluster.cluster,
            gpus,
            space,
            objective,
            mem_headroom,
            top,
            enum_value(mfu_dtype),
            cluster.order,
            progress=advance,
        )
    if csv:
        from commands.outputs import atomic_path

        with atomic_path(csv) as temporary:
            table.to_csv(temporary, index=False)
    if html:
        from commands.outputs import atomic_path
        from plots.plan import plan_figure

        with atomic_path(html) as temporary:
            plan_figure(table, result).write_html(temporary, include_plotlyjs=True, full_html=True)
    if as_json:
        emit_json(result)
        return
    _print_plan(result, explain)
    if emit:
        make_console().print(
            api.emit_settings(result.results[0], emit, query), markup=False, highlight=False
        )
    wrote(csv)
    wrote(html)


class _progress:
    """A rich progress bar on a terminal while the search screens (silent otherwise)."""

    def __init__(self, enabled: bool):
        self.enabled = enabled and sys.stderr.isatty()
        self.bar = None

    def __enter__(self):
        if not self.enabled:
            return None
        from rich.progress import Progress

        self.bar = Progress(transient=True)
        self.bar.start()
        task = self.bar.add_task("screening layouts", total=1.0)
        return lambda fraction: self.bar.update(task, completed=fraction)

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.stop()
        return False


def _print_plan(result, explain: bool) -> None:
    from rich.table import Table

    console = make_console()
    q = result.query
    console.print(
        f"{q['model']} on {q['gpus']:,} GPUs of {q['cluster']}, seq {q['seq_len']:,}, "
        f"{q['global_batch_tokens']:,} tokens per step: {result.candidates_evaluated:,} layouts "
        f"screened, {result.feasible:,} feasible"
    )
    table = Table(show_edge=False, padding=(0, 1))
    ep = any(entry["layout"]["ep"] > 1 for entry in result.results)
    etp = any((entry["layout"].get("etp") or entry["layout"]["tp"]) != entry["layout"]["tp"]
              for entry in result.results)  # fmt: skip
    degrees_header = "tp/cp/pp/dp" + ("/ep" if ep else "") + ("/etp" if etp else "")
    columns = (
        "#",
        degrees_header,
        "sp",
        "schedule",
        "mbs",
        "Z",
        "recomp",
        "step s",
        "MFU%",
        "GiB",
        "bub%",
    )
    for column in columns:
        left = column in (degrees_header, "schedule", "recomp")
        table.add_column(column, justify="left" if left else "right", no_wrap=True)
    short = {"interleaved-1f1b": "int-1f1b", "selective": "sel"}
    for entry in result.results:
        lay = entry["layout"]
        axes = ("tp", "cp", "pp", "dp", "ep") if ep else ("tp", "cp", "pp", "dp")
        vpp = f" v{lay['vpp']}" if lay["schedule"] == "interleaved-1f1b" else ""
        degrees = [str(lay[a]) for a in axes] + ([str(lay["etp"] or lay["tp"])] if etp else [])
        table.add_row(
            str(entry["rank"]),
            "/".join(degrees),
            "y" if lay["sequence_parallel"] and lay["tp"] > 1 else "n",
            short.get(lay["schedule"], lay["schedule"]) + vpp,
            str(lay["micro_batch_size"]),
            str(lay["zero_stage"]),
            short.get(lay["recompute"], lay["recompute"]),
            f"{entry['step_time_s']:.3f}",
            f"{100 * entry['mfu']:.1f}",
            f"{entry['memory_per_gpu_bytes'] / GIB:.1f}",
            f"{100 * entry['bubble_fraction']:.1f}",
        )
    console.print(table)
    if explain:
        for line in result.explanation:
            console.print(line)


@app.command()
@uses(job=JOB, cluster=CLUSTER, layout=LAYOUT.defaults(tp=8, pp=16, dp=128))
def estimate(
    job: Values,
    cluster: Values,
    layout: Values,
    mfu_dtype: MFU_DTYPE.annotation = MFU_DTYPE.default,
    explain: Annotated[bool, typer.Option("--explain", help="each term's formula")] = False,
    as_json: JsonFlag = False,
) -> None:
    """Predict one fully given layout: step time breakdown, MFU, memory per GPU."""
    from planner import api

    query = build_job(job)
    result = api.estimate(
        query,
        build_layout(layout, job),
        cluster.cluster,
        cluster.gpus,
        enum_value(mfu_dtype),
        order=cluster.order,
    )
    if as_json:
        emit_json(result)
        return
    from rich.table import Table

    console = make_console()
    lay = result.layout
    console.print(
        f"{result.model} on {result.num_gpus:,} × {result.accelerator} ({result.cluster}): tp {lay.tp} cp {lay.cp} "
        f"pp {lay.pp} dp {lay.dp} ep {lay.ep}{f' etp {lay.etp}' if lay.etp is not None else ''} vpp {lay.vpp}, {lay.schedule}, m {result.num_microbatches}, "
        f"mbs {lay.micro_batch_size}, ZeRO {lay.zero_stage}, recompute {lay.recompute}"
    )
    table = Table(
        title=f"step {result.step_time_s:.3f} s — MFU {100 * result.mfu:.1f}% "
        f"(causal {100 * result.mfu_causal:.1f}%), {result.model_tflops_per_gpu:.0f} TFLOP/s per GPU, "
        f"{result.tokens_per_s_per_gpu:,.0f} tokens/s per GPU"
    )
    table.add_column("term")
    table.add_column("seconds", justify="right")
    table.add_column("share", justify="right")
    for key, value in result.time_breakdown_s.items():
        if value:
            table.add_row(key, f"{value:.4f}", f"{100 * value / result.step_time_s:.1f}%")
    console.print(table)
    verdict = "fits" if result.fits else "does NOT fit"
    console.print(
        f"memory per GPU {result.memory_per_gpu_bytes / GIB:.2f} GiB of {result.capacity_bytes / GIB:.2f}: {verdict}"
    )
    if explain:
        for line in api.explain_estimate(result, query):
            console.print(line)

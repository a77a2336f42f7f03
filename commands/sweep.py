"""`llmplan sweep`: the plan at each GPU count or sequence length, winner per point."""

from __future__ import annotations

from typing import Annotated, Any

from commands.common import JsonFlag, app, compact_table, emit_json, make_console
from commands.flags import (
    CLUSTER,
    MEM_HEADROOM,
    OBJECTIVE_HELP,
    POSITIVE,
    ListOf,
    Name,
    Objective,
    ObjectiveName,
    Values,
    option,
    output,
    png_output,
    uses,
    value,
)
from commands.time_to_train import GpuHourCostFlag, TrainTokensFlag, build_training


@app.command()
@uses(cluster=CLUSTER.only("cluster", "accelerator"))
def sweep(
    cluster: Values,
    model: Annotated[
        str,
        option(
            Name("a catalog model, a model TOML or a HF config.json"),
            "catalog model, model TOML or HF config.json",
        ),
    ] = "llama3-405b",
    gpus: Annotated[
        Any,
        option(ListOf(POSITIVE), "GPU counts to sweep, e.g. 1024,2048,4096 (or one count)"),
    ] = None,
    seq_len: Annotated[
        Any,
        option(ListOf(POSITIVE), "sequence lengths to sweep, e.g. 4096,8192 (or one)"),
    ] = None,
    global_batch_tokens: Annotated[
        int | None, option(POSITIVE, "tokens per step (16Mi = 16,777,216; default 16Mi)")
    ] = None,
    objective: Annotated[Objective, option(ObjectiveName(), OBJECTIVE_HELP)] = (
        Objective.step_time
    ),
    mem_headroom: MEM_HEADROOM.annotation = MEM_HEADROOM.default,
    train_tokens: TrainTokensFlag = None,
    gpu_hour_cost: GpuHourCostFlag = None,
    html: output("write the sweep's plots as HTML") = None,
    png: png_output("write them as PNG (needs kaleido and a Chrome/Chromium)") = None,
    as_json: JsonFlag = False,
) -> None:
    """Plan at each GPU count (--gpus 1024,…) or sequence length (--seq-len …): best step
    time, MFU, days to train and goodput per point, to see where scaling stops paying."""
    from hwspecs.errors import PlanError
    from planner import api

    cluster, objective = cluster.cluster, value(objective)
    gpu_values, seq_values = gpus, seq_len
    swept = [(name, v) for name, v in (("gpus", gpu_values), ("seq_len", seq_values))
             if v is not None and len(v) > 1]  # fmt: skip
    if len(swept) != 1:
        raise PlanError("sweep one quantity: give --gpus or --seq-len a list of two or more values")
    quantity, values = swept[0]
    fixed_gpus = gpu_values[0] if gpu_values and quantity != "gpus" else None
    if fixed_gpus is None and quantity != "gpus" and cluster == api.DEFAULT_PLAN["cluster"]:
        fixed_gpus = api.DEFAULT_PLAN["gpus"]
    fixed_seq = seq_values[0] if seq_values and quantity != "seq_len" else 8192
    job_fields = {
        "model": model,
        "seq_len": fixed_seq,
        "global_batch_tokens": global_batch_tokens or api.DEFAULT_PLAN["global_batch_tokens"],
    }
    training = build_training(cluster, train_tokens, gpu_hour_cost)
    result = api.sweep(
        job_fields, cluster, quantity, values, fixed_gpus, None, objective, mem_headroom,
        training,
    )  # fmt: skip
    if html or png:
        from commands.outputs import write_pages
        from plots.sweep import sweep_figure

        write_pages(sweep_figure(result), html, png)
    if as_json:
        emit_json(result)
        return
    _print_sweep(result)
    for path in (html, png):
        if path:
            make_console().print(f"wrote {path}", markup=False, highlight=False, soft_wrap=True)


def _print_sweep(result) -> None:
    label = {"gpus": "GPUs", "seq_len": "seq"}[result.quantity]
    table = compact_table(
        label, "tp/cp/pp/dp/ep", "schedule", "step s", "MFU%", "Mtok/s", "days", "good%",
        left=("tp/cp/pp/dp/ep",), wrap=("schedule",),
    )  # fmt: skip
    for point in result.points:
        if point.layout is None:
            table.add_row(f"{point.value:,}", "no layout fits", *[""] * 6)
            continue
        lay, section = point.layout, point.time_to_train
        table.add_row(
            f"{point.value:,}",
            "/".join(str(lay[a]) for a in ("tp", "cp", "pp", "dp", "ep")),
            lay["schedule"],
            f"{point.step_time_s:.3f}",
            f"{100 * point.mfu:.1f}",
            f"{point.cluster_tokens_per_s / 1e6:.2f}",
            f"{section['wall_time_days']:.1f}" if section else "",
            f"{100 * section['goodput']:.1f}" if section else "",
        )
    make_console().print(table)

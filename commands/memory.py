"""`llmplan bytes-per-param` and `llmplan memory` (full training or fine-tuning recipes)."""

from __future__ import annotations

from typing import Annotated

import typer

from commands.common import JsonFlag, app, compact_table, emit_json, fits_line, gib, make_console
from commands.flags import (
    CLUSTER,
    DEFAULT_LAYOUT,
    JOB,
    MEM_HEADROOM,
    Choice,
    Count,
    GradDtype,
    IntIn,
    MasterDtype,
    Name,
    Optimizer,
    Precision,
    Values,
    build_finetune,
    build_job,
    build_layout,
    option,
    uses,
    value,
)

# ----- bytes per parameter --------------------------------------------------------------

#: The job flags bytes-per-param takes: the precision recipe and the adapter recipe.
RECIPE = JOB.only(
    "recipe", "lora_rank", "lora_alpha", "lora_targets", "adapter_dtype", "double_quant"
)


@app.command("bytes-per-param")
@uses(adapters=RECIPE)
def bytes_per_param(
    precision: Annotated[
        Precision, option(Choice(Precision), "precision recipe", show_allowed=True)
    ] = Precision.bf16_mixed,
    optimizer: Annotated[
        Optimizer, option(Choice(Optimizer), "optimizer", show_allowed=True)
    ] = Optimizer.adamw,
    grad_dtype: Annotated[
        GradDtype | None, option(Choice(GradDtype), "gradient dtype override", show_allowed=True)
    ] = None,
    master_dtype: Annotated[
        MasterDtype | None,
        option(Choice(MasterDtype), "master weight dtype override", show_allowed=True),
    ] = None,
    zero_stage: Annotated[int, option(IntIn(0, 3), "ZeRO stage", show_allowed=True)] = 0,
    dp: Annotated[int, option(Count(1), "data-parallel ranks ZeRO shards over")] = 1,
    model: Annotated[
        str | None,
        option(
            Name("a catalog model, a model TOML or a HF config.json"),
            "model (for totals, shape-dependent optimizers and adapter recipes)",
        ),
    ] = None,
    adapters: Values = None,
    as_json: JsonFlag = False,
) -> None:
    """Model-state bytes per parameter for a precision recipe, optimizer and ZeRO stage.

    With an adapter recipe (lora, qlora, dora, vera) the bytes are per parameter of the base
    model, and the recipe's own split (base weights, quantization constants, adapters,
    adapter optimizer states) is shown too.
    """
    from planner import api

    finetune = build_finetune(Values(adapters, lora_dropout=None, lora_dropout_position=None))
    result = api.bytes_per_param(
        precision=value(precision),
        optimizer=value(optimizer),
        grad_dtype=value(grad_dtype),
        master_dtype=value(master_dtype),
        zero_stage=zero_stage,
        dp=dp,
        model=model,
        finetune=finetune,
    )
    if as_json:
        emit_json(result)
        return
    recipe_title = ""
    if result.recipe_breakdown is not None:
        recipe_title = (
            f", {result.recipe} r {finetune.lora_rank} on {','.join(finetune.lora_targets)} "
            f"({result.num_trainable_params:,} trainable; per base-model parameter)"
        )
    console = make_console()
    console.print(
        f"bytes per parameter: {result.precision}, {result.optimizer}, grads "
        f"{result.grad_dtype}, ZeRO {result.zero_stage} over dp {result.dp}{recipe_title}",
        markup=False,
        highlight=False,
    )
    table = compact_table("part", "bytes / param", wrap=("part",))
    for part, share in result.breakdown.items():
        table.add_row(part, f"{share:.4g}")
    for part, share in (result.recipe_breakdown or {}).items():
        table.add_row(f"  of which {part}", f"{share:.4g}", style="dim")
    table.add_row("total", f"{result.bytes_per_param:.4g}", style="bold")
    if result.total_bytes is not None:
        table.add_row(
            f"{result.model} ({result.num_params / 1e9:.1f} B params)",
            f"{gib(result.total_bytes)} GiB",
        )
    console.print(table)


# ----- memory ---------------------------------------------------------------------------


@app.command()
@uses(job=JOB, cluster=CLUSTER.only("cluster", "accelerator"), layout=DEFAULT_LAYOUT)
def memory(
    job: Values,
    cluster: Values,
    layout: Values,
    mem_headroom: MEM_HEADROOM.annotation = MEM_HEADROOM.default,
    explain: Annotated[
        bool, typer.Option("--explain", help="print each term's formula with its numbers")
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Memory per GPU for one layout: model states, activations in flight, buffers, per stage.

    With an adapter recipe the base is frozen (NF4 for qlora) and only the adapters carry
    gradients and optimizer states; the recipe's own split is printed as well. The result
    is checked against the HBM of --cluster's accelerator (or --accelerator's).
    """
    from planner import api

    query = build_job(job)
    report = api.memory(query, build_layout(layout, job), None, mem_headroom, cluster.cluster)
    if as_json:
        emit_json(report)
        return
    _print_memory(report, explain)


def _print_memory(report, explain: bool) -> None:
    console = make_console()
    layout = report.layout
    title = (
        f"{report.model}: tp {layout.tp} cp {layout.cp} pp {layout.pp} dp {layout.dp} ep {layout.ep}"
        f" vpp {layout.vpp}, seq {report.seq_len}, mbs {layout.micro_batch_size}, "
        f"m {report.num_microbatches}, {layout.schedule}, ZeRO {layout.zero_stage}, "
        f"recompute {layout.recompute} — GiB per GPU (mb: micro-batches in flight; "
        f"optim: master weights + optimizer states; buffers: logits, comm, runtime)"
    )
    console.print(title, markup=False, highlight=False)
    columns = {
        "rank": None,
        "layers": None,
        "mb": "micro-batches in flight",
        "weights": ("weights",),
        "grads": ("gradients",),
        "optim": ("master_weights", "optimizer_states"),
        "acts": ("activations",),
        "buffers": ("logits_buffers", "comm_buffers", "runtime_overhead"),
        "total": ("total_bytes",),
    }
    table = compact_table(*columns)
    for stage in report.per_stage:
        style = "bold" if stage.rank == report.peak_rank else None
        sizes = [
            gib(sum(getattr(stage, part) for part in parts)) for parts in list(columns.values())[3:]
        ]
        table.add_row(
            str(stage.rank),
            str(stage.num_layers),
            f"{stage.inflight_microbatches:g}",
            *sizes,
            style=style,
        )
    console.print(table)
    if report.capacity_bytes is None:
        console.print(f"peak: {gib(report.total_bytes)} GiB on rank {report.peak_rank}")
    else:
        console.print(
            f"peak on rank {report.peak_rank}, {report.accelerator}: "
            + fits_line(report.total_bytes, report)
        )
    if report.recipe_breakdown_bytes is not None:
        parts = compact_table(
            "part", "GiB", wrap=("part",),
            title=f"rank {report.peak_rank} by the {report.recipe} recipe's parts (GiB)",
        )  # fmt: skip
        for name, value in report.recipe_breakdown_bytes.items():
            parts.add_row(name, gib(value))
        console.print(parts)
    if explain:
        terms = compact_table(
            "term", "formula", "values", "GiB", wrap=("term", "formula", "values"),
            title=f"how rank {report.peak_rank}'s memory is computed",
        )  # fmt: skip
        for term in report.explain:
            terms.add_row(term.term, term.formula, term.values, gib(term.bytes))
        console.print(terms)
        layer = compact_table(
            "tensor", "MiB", wrap=("tensor",),
            title="activation tensors of one dense layer, one micro-batch (MiB)",
        )  # fmt: skip
        for name, value in report.activation_tensors_per_layer.items():
            layer.add_row(name, f"{value / 2**20:,.1f}")
        console.print(layer)

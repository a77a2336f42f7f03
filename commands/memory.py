"""`llmplan bytes-per-param` and `llmplan memory` (full training or fine-tuning recipes)."""

from __future__ import annotations

from enum import Enum
from typing import Annotated

import typer

from commands.common import (
    EtpFlag,
    GradDtype,
    JsonFlag,
    MasterDtype,
    MemHeadroomFlag,
    MemoryMeasuresFlag,
    MoeCapacityFlag,
    MoeImbalanceFlag,
    Optimizer,
    Precision,
    PrecisionFlag,
    Recompute,
    WeightPass,
    WeightPassFlag,
    app,
    emit_json,
    fits_line,
    gib,
    make_console,
    option_value,
)

# ----- bytes per parameter --------------------------------------------------------------


class Recipe(str, Enum):
    full = "full"
    lora = "lora"
    qlora = "qlora"
    dora = "dora"
    vera = "vera"


class AdapterDtype(str, Enum):
    fp32 = "fp32"
    bf16 = "bf16"
    fp16 = "fp16"


RecipeFlag = Annotated[
    Recipe, typer.Option(help="training recipe: full, or adapters on a frozen base")
]
LoraRankFlag = Annotated[
    int | None, typer.Option(min=1, help="adapter rank r (default 8; QLoRA used 64)")
]
LoraAlphaFlag = Annotated[float | None, typer.Option(help="adapter scale alpha (no cost effect)")]
LoraTargetsFlag = Annotated[
    str | None,
    typer.Option(help="attention, mlp, all (default) or module names, e.g. q_proj,v_proj"),
]
AdapterDtypeFlag = Annotated[
    AdapterDtype | None,
    typer.Option(help="adapter weight dtype (default fp32; bf16 for qlora)"),
]
DoubleQuantFlag = Annotated[
    bool | None,
    typer.Option(
        "--double-quant/--no-double-quant", help="qlora: quantize the NF4 constants (default on)"
    ),
]


def _finetune(recipe, lora_rank, lora_alpha, lora_targets, adapter_dtype, double_quant, **extra):
    from planner import api

    return api.build_finetune(
        option_value(recipe),
        lora_rank=lora_rank,
        lora_alpha=lora_alpha,
        lora_targets=lora_targets,
        adapter_dtype=option_value(adapter_dtype),
        double_quant=double_quant,
        **extra,
    )


@app.command("bytes-per-param")
def bytes_per_param(
    precision: Annotated[Precision, typer.Option(help="precision recipe")] = Precision.bf16_mixed,
    optimizer: Annotated[Optimizer, typer.Option(help="optimizer")] = Optimizer.adamw,
    grad_dtype: Annotated[GradDtype | None, typer.Option(help="gradient dtype override")] = None,
    master_dtype: Annotated[
        MasterDtype | None, typer.Option(help="master weight dtype override")
    ] = None,
    zero_stage: Annotated[int, typer.Option(min=0, max=3, help="ZeRO stage 0-3")] = 0,
    dp: Annotated[int, typer.Option(min=1, help="data-parallel ranks ZeRO shards over")] = 1,
    model: Annotated[
        str | None,
        typer.Option(help="model (for totals, shape-dependent optimizers and adapter recipes)"),
    ] = None,
    recipe: RecipeFlag = Recipe.full,
    lora_rank: LoraRankFlag = None,
    lora_alpha: LoraAlphaFlag = None,
    lora_targets: LoraTargetsFlag = None,
    adapter_dtype: AdapterDtypeFlag = None,
    double_quant: DoubleQuantFlag = None,
    as_json: JsonFlag = False,
) -> None:
    """Model-state bytes per parameter for a precision recipe, optimizer and ZeRO stage.

    With an adapter recipe (lora, qlora, dora, vera) the bytes are per parameter of the base
    model, and the recipe's own split (base weights, quantization constants, adapters,
    adapter optimizer states) is shown too.
    """
    from planner import api

    finetune = _finetune(recipe, lora_rank, lora_alpha, lora_targets, adapter_dtype, double_quant)
    result = api.bytes_per_param(
        precision=option_value(precision),
        optimizer=option_value(optimizer),
        grad_dtype=option_value(grad_dtype),
        master_dtype=option_value(master_dtype),
        zero_stage=zero_stage,
        dp=dp,
        model=model,
        finetune=finetune,
    )
    if as_json:
        emit_json(result)
        return
    from rich.table import Table

    recipe_title = ""
    if result.recipe_breakdown is not None:
        recipe_title = (
            f", {result.recipe} r {finetune.lora_rank} on {','.join(finetune.lora_targets)} "
            f"({result.num_trainable_params:,} trainable; per base-model parameter)"
        )
    table = Table(
        title=f"bytes per parameter: {result.precision}, {result.optimizer}, "
        f"grads {result.grad_dtype}, ZeRO {result.zero_stage} over dp {result.dp}{recipe_title}"
    )
    table.add_column("part")
    table.add_column("bytes / param", justify="right")
    for part, value in result.breakdown.items():
        table.add_row(part, f"{value:.4g}")
    for part, value in (result.recipe_breakdown or {}).items():
        table.add_row(f"  of which {part}", f"{value:.4g}", style="dim")
    table.add_row("total", f"{result.bytes_per_param:.4g}", style="bold")
    if result.total_bytes is not None:
        table.add_row(
            f"{result.model} ({result.num_params / 1e9:.1f} B params)",
            f"{gib(result.total_bytes)} GiB",
        )
    make_console().print(table)


# ----- memory ---------------------------------------------------------------------------


@app.command()
def memory(
    model: Annotated[
        str, typer.Option(help="catalog model, model TOML or HF config.json")
    ] = "llama3-405b",
    tp: Annotated[int, typer.Option(min=1)] = 1,
    cp: Annotated[int, typer.Option(min=1)] = 1,
    pp: Annotated[int, typer.Option(min=1)] = 1,
    dp: Annotated[int, typer.Option(min=1)] = 1,
    ep: Annotated[int, typer.Option(min=1)] = 1,
    etp: EtpFlag = None,
    vpp: Annotated[
        int | None, typer.Option(min=1, help="chunks per rank (default: the schedule's)")
    ] = None,
    seq_len: Annotated[int, typer.Option(min=1)] = 8192,
    micro_batch_size: Annotated[int, typer.Option(min=1)] = 1,
    num_microbatches: Annotated[
        int | None, typer.Option(min=1, help="default: from the global batch, else pp")
    ] = None,
    global_batch_tokens: Annotated[int | None, typer.Option(min=1)] = None,
    global_batch_size: Annotated[int | None, typer.Option(min=1, help="sequences per step")] = None,
    zero_stage: Annotated[int, typer.Option(min=0, max=3)] = 1,
    recompute: Annotated[
        Recompute | None,
        typer.Option(help="default: full for qlora (gradient checkpointing, as QLoRA), else none"),
    ] = None,
    sequence_parallel: Annotated[
        bool, typer.Option("--sequence-parallel/--no-sequence-parallel")
    ] = True,
    schedule: Annotated[
        str, typer.Option(help="pipeline schedule (e.g. 1f1b, interleaved-1f1b, zbv)")
    ] = "1f1b",
    precision: PrecisionFlag = None,
    memory_measures: MemoryMeasuresFlag = None,
    weight_pass_memory: WeightPassFlag = WeightPass.inputs,
    moe_imbalance: MoeImbalanceFlag = None,
    moe_capacity_factor: MoeCapacityFlag = None,
    optimizer: Annotated[Optimizer, typer.Option()] = Optimizer.adamw,
    grad_dtype: Annotated[GradDtype | None, typer.Option()] = None,
    flash_attention: Annotated[bool, typer.Option("--flash-attention/--no-flash-attention")] = True,
    accelerator: Annotated[
        str | None, typer.Option(help="accelerator whose HBM the result is checked against")
    ] = "h100-sxm",
    mem_headroom: MemHeadroomFlag = 0.05,
    recipe: RecipeFlag = Recipe.full,
    lora_rank: LoraRankFlag = None,
    lora_alpha: LoraAlphaFlag = None,
    lora_targets: LoraTargetsFlag = None,
    lora_dropout: Annotated[
        float | None, typer.Option(min=0, max=0.99, help="adapter dropout (stores input copies)")
    ] = None,
    adapter_dtype: AdapterDtypeFlag = None,
    double_quant: DoubleQuantFlag = None,
    explain: Annotated[
        bool, typer.Option("--explain", help="print each term's formula with its numbers")
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Memory per GPU for one layout: model states, activations in flight, buffers, per stage.

    With an adapter recipe the base is frozen (NF4 for qlora) and only the adapters carry
    gradients and optimizer states; the recipe's own split is printed as well.
    """
    from planner import api

    finetune = _finetune(
        recipe,
        lora_rank,
        lora_alpha,
        lora_targets,
        adapter_dtype,
        double_quant,
        lora_dropout=lora_dropout,
    )
    if recompute is None:
        recompute = Recompute.full if option_value(recipe) == "qlora" else Recompute.none
    job = api.build_job(
        model,
        seq_len,
        global_batch_tokens=global_batch_tokens,
        global_batch_size=global_batch_size,
        precision=option_value(precision),
        optimizer=option_value(optimizer),
        grad_dtype=option_value(grad_dtype),
        flash_attention=flash_attention,
        finetune=finetune,
        memory_measures=option_value(memory_measures),
        weight_pass_memory=option_value(weight_pass_memory),
        moe_imbalance=moe_imbalance,
        moe_capacity_factor=moe_capacity_factor,
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
        num_microbatches=num_microbatches,
        zero_stage=zero_stage,
        recompute=option_value(recompute),
        sequence_parallel=sequence_parallel,
        schedule=schedule,
    )
    report = api.memory(job, layout, accelerator, mem_headroom)
    if as_json:
        emit_json(report)
        return
    _print_memory(report, explain)


def _print_memory(report, explain: bool) -> None:
    from rich.table import Table

    console = make_console()
    layout = report.layout
    title = (
        f"{report.model}: tp {layout.tp} cp {layout.cp} pp {layout.pp} dp {layout.dp} ep {layout.ep}"
        f" vpp {layout.vpp}, seq {report.seq_len}, mbs {layout.micro_batch_size}, "
        f"m {report.num_microbatches}, {layout.schedule}, ZeRO {layout.zero_stage}, "
        f"recompute {layout.recompute} — GiB per GPU (mb: micro-batches in flight; "
        f"optim: master weights + optimizer states; buffers: logits, comm, runtime)"
    )
    table = Table(title=title)
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
    for name in columns:
        table.add_column(name, justify="right")
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
        parts = Table(title=f"rank {report.peak_rank} by the {report.recipe} recipe's parts (GiB)")
        parts.add_column("part")
        parts.add_column("GiB", justify="right")
        for name, value in report.recipe_breakdown_bytes.items():
            parts.add_row(name, gib(value))
        console.print(parts)
    if explain:
        terms = Table(title=f"how rank {report.peak_rank}'s memory is computed")
        terms.add_column("term")
        terms.add_column("formula", overflow="fold")
        terms.add_column("values", overflow="fold")
        terms.add_column("GiB", justify="right")
        for term in report.explain:
            terms.add_row(term.term, term.formula, term.values, gib(term.bytes))
        console.print(terms)
        layer = Table(title="activation tensors of one dense layer, one micro-batch (MiB)")
        layer.add_column("tensor")
        layer.add_column("MiB", justify="right")
        for name, value in report.activation_tensors_per_layer.items():
            layer.add_row(name, f"{value / 2**20:,.1f}")
        console.print(layer)

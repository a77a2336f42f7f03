"""llmplan's command line: a thin typer app over :mod:`planner.api`.

Each command parses its flags, calls one API function and renders the result as a rich
table or, with ``--json``, as the result's JSON. Problems with the input are one line on
stderr and exit code 2. Heavy imports (pandas, plotly, the planner) happen inside the
commands so that ``llmplan --help`` starts fast.
"""

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


def _value(option):
    return option.value if isinstance(option, Enum) else option


def _emit_json(data) -> None:
    """Print a pydantic model or plain data as JSON on stdout."""
    if hasattr(data, "model_dump"):
        data = data.model_dump(mode="json")
    sys.stdout.write(json.dumps(data, indent=2) + "\n")


def _console():
    from rich.console import Console

    return Console()


def _gib(value: float | None) -> str:
    return "-" if value is None else f"{value / GIB:,.2f}"


# ----- plan and estimate ---------------------------------------------------------------


def _int_list(text: str | None, name: str) -> list[int] | None:
    from planner.errors import PlanError

    if text is None:
        return None
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise PlanError(f"--{name} takes integers separated by commas, got '{text}'") from None
    if not values or min(values) < 1:
        raise PlanError(f"--{name} needs positive integers, got '{text}'")
    return values


def _plan_job(
    model, seq_len, global_batch_tokens, global_batch_size, precision, optimizer, grad_dtype
):
    from planner import api

    if global_batch_tokens is None and global_batch_size is None:
        global_batch_tokens = api.DEFAULT_PLAN["global_batch_tokens"]
    return api.build_job(
        model,
        seq_len,
        global_batch_tokens=global_batch_tokens,
        global_batch_size=global_batch_size,
        precision=_value(precision),
        optimizer=_value(optimizer),
        grad_dtype=_value(grad_dtype),
    )


@app.command()
def plan(
    model: Annotated[
        str, typer.Option(help="catalog model, model TOML or HF config.json")
    ] = "llama3-405b",
    cluster: Annotated[str, typer.Option(help="catalog cluster or TOML path")] = "llama3-h100-24k",
    gpus: Annotated[
        int | None,
        typer.Option(
            min=1, help="GPUs to use (default 16,384 for the default query, else the whole cluster)"
        ),
    ] = None,
    seq_len: Annotated[int, typer.Option(min=1)] = 8192,
    global_batch_tokens: Annotated[
        int | None, typer.Option(min=1, help="tokens per step (default 16M)")
    ] = None,
    global_batch_size: Annotated[int | None, typer.Option(min=1, help="sequences per step")] = None,
    top: Annotated[int, typer.Option(min=1, help="results to show")] = 5,
    objective: Annotated[str, typer.Option(help="step_time, memory or mfu")] = "step_time",
    mem_headroom: Annotated[float, typer.Option(help="fraction of HBM kept free")] = 0.05,
    tp: Annotated[str | None, typer.Option(help="pin, e.g. 8 or 4,8")] = None,
    cp: Annotated[str | None, typer.Option(help="pin")] = None,
    pp: Annotated[str | None, typer.Option(help="pin")] = None,
    dp: Annotated[str | None, typer.Option(help="pin")] = None,
    ep: Annotated[str | None, typer.Option(help="pin")] = None,
    vpp: Annotated[str | None, typer.Option(help="pin")] = None,
    micro_batch_size: Annotated[str | None, typer.Option(help="pin")] = None,
    schedule: Annotated[str | None, typer.Option(help="pin, e.g. 1f1b,interleaved-1f1b")] = None,
    zero_stage: Annotated[str | None, typer.Option(help="pin, e.g. 1")] = None,
    recompute: Annotated[str | None, typer.Option(help="pin: none, selective, full")] = None,
    sequence_parallel: Annotated[
        bool | None, typer.Option("--sequence-parallel/--no-sequence-parallel", help="pin")
    ] = None,
    allow_cross_node_tp: Annotated[bool, typer.Option("--allow-cross-node-tp")] = False,
    precision: Annotated[Precision, typer.Option()] = Precision.bf16_mixed,
    optimizer: Annotated[Optimizer, typer.Option()] = Optimizer.adamw,
    grad_dtype: Annotated[GradDtype | None, typer.Option()] = None,
    mfu_dtype: Annotated[
        str, typer.Option(help="dtype whose peak MFU is measured against")
    ] = "bf16",
    order: Annotated[str | None, typer.Option(help="mesh order innermost first")] = None,
    explain: Annotated[
        bool, typer.Option("--explain", help="why the winner wins, why rows were rejected")
    ] = False,
    emit: Annotated[
        str | None, typer.Option(help="print the winner's settings for: torchtitan, megatron")
    ] = None,
    csv: Annotated[str | None, typer.Option(help="write every feasible row as CSV")] = None,
    html: Annotated[
        str | None, typer.Option(help="write step time vs memory of all feasible layouts")
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Search every layout and rank them (default: Llama 3 405B on 16,384 H100s)."""
    from planner import api
    from planner.errors import PlanError
    from planner.search import SearchSpace

    try:
        if gpus is None and cluster == api.DEFAULT_PLAN["cluster"]:
            gpus = api.DEFAULT_PLAN["gpus"]
        job = _plan_job(
            model, seq_len, global_batch_tokens, global_batch_size, precision, optimizer, grad_dtype
        )
        pins = {
            "tp": _int_list(tp, "tp"),
            "cp": _int_list(cp, "cp"),
            "pp": _int_list(pp, "pp"),
            "dp": _int_list(dp, "dp"),
            "ep": _int_list(ep, "ep"),
            "vpp": _int_list(vpp, "vpp"),
        }
        space_fields = {key: value for key, value in pins.items() if value is not None}
        if micro_batch_size:
            space_fields["micro_batch_size"] = _int_list(micro_batch_size, "micro-batch-size")
        if schedule:
            space_fields["schedule"] = _name_list(schedule, "schedule")
        if zero_stage:
            space_fields["zero_stage"] = [int(v) for v in zero_stage.split(",")]
            if any(v not in (0, 1, 2, 3) for v in space_fields["zero_stage"]):
                raise PlanError(f"--zero-stage takes 0, 1, 2 or 3, got '{zero_stage}'")
        if recompute:
            space_fields["recompute"] = _name_list(recompute, "recompute")
        if sequence_parallel is not None:
            space_fields["sequence_parallel"] = [sequence_parallel]
        space = SearchSpace(**space_fields, allow_cross_node_tp=allow_cross_node_tp)
        with _progress(not as_json) as advance:
            result, table = api.plan(
                job,
                cluster,
                gpus,
                space,
                objective,
                mem_headroom,
                top,
                mfu_dtype,
                order,
                progress=advance,
            )
        if not result.results:
            raise PlanError(_no_layout_message(result))
    except PlanError as error:
        if as_json:
            _emit_json({"error": str(error)})
            raise typer.Exit(2) from None
        raise
    if csv:
        table.to_csv(csv, index=False)
    if html:
        from plots.plan import plan_figure

        plan_figure(table, result).write_html(html, include_plotlyjs=True, full_html=True)
    if as_json:
        _emit_json(result)
        return
    _print_plan(result, explain)
    if emit:
        _console().print(
            api.emit_settings(result.results[0], emit, job), markup=False, highlight=False
        )
    for path in (csv, html):
        if path:
            _console().print(f"wrote {path}")


def _name_list(text: str, name: str) -> list[str]:
    from planner.errors import PlanError

    allowed = {"schedule": None, "recompute": ("none", "selective", "full")}[name]
    values = [part.strip() for part in text.split(",") if part.strip()]
    if name == "schedule":
        from planner.errors import unknown_name_error
        from planner.schedules import SCHEDULES

        for value in values:
            if value not in SCHEDULES:
                raise unknown_name_error("schedule", value, SCHEDULES)
    elif any(value not in allowed for value in values):
        raise PlanError(f"--{name} takes {', '.join(allowed)}; got '{text}'")
    return values


def _no_layout_message(result) -> str:
    reasons = "; ".join(f"{reason} ({count:,})" for reason, count in result.rejected.items())
    smallest = [line for line in result.explanation if line.startswith("smallest")]
    tail = f"; {smallest[0]}" if smallest else ""
    return f"no layout fits the constraints: {reasons or 'no candidates'}{tail}"


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

    console = _console()
    q = result.query
    console.print(
        f"{q['model']} on {q['gpus']:,} GPUs of {q['cluster']}, seq {q['seq_len']:,}, "
        f"{q['global_batch_tokens']:,} tokens per step: {result.candidates_evaluated:,} layouts "
        f"screened, {result.feasible:,} feasible"
    )
    table = Table(show_edge=False, padding=(0, 1))
    ep = any(entry["layout"]["ep"] > 1 for entry in result.results)
    degrees_header = "tp/cp/pp/dp" + ("/ep" if ep else "")
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
        table.add_row(
            str(entry["rank"]),
            "/".join(str(lay[a]) for a in axes),
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
def estimate(
    model: Annotated[
        str, typer.Option(help="catalog model, model TOML or HF config.json")
    ] = "llama3-405b",
    cluster: Annotated[str, typer.Option(help="catalog cluster or TOML path")] = "llama3-h100-24k",
    gpus: Annotated[int | None, typer.Option(min=1)] = None,
    tp: Annotated[int, typer.Option(min=1)] = 8,
    cp: Annotated[int, typer.Option(min=1)] = 1,
    pp: Annotated[int, typer.Option(min=1)] = 16,
    dp: Annotated[int, typer.Option(min=1)] = 128,
    ep: Annotated[int, typer.Option(min=1)] = 1,
    vpp: Annotated[int | None, typer.Option(min=1)] = None,
    seq_len: Annotated[int, typer.Option(min=1)] = 8192,
    global_batch_tokens: Annotated[int | None, typer.Option(min=1)] = None,
    global_batch_size: Annotated[int | None, typer.Option(min=1)] = None,
    micro_batch_size: Annotated[int, typer.Option(min=1)] = 1,
    schedule: Annotated[str, typer.Option()] = "1f1b",
    zero_stage: Annotated[int, typer.Option(min=0, max=3)] = 1,
    recompute: Annotated[Recompute, typer.Option()] = Recompute.none,
    sequence_parallel: Annotated[
        bool, typer.Option("--sequence-parallel/--no-sequence-parallel")
    ] = True,
    precision: Annotated[Precision, typer.Option()] = Precision.bf16_mixed,
    optimizer: Annotated[Optimizer, typer.Option()] = Optimizer.adamw,
    grad_dtype: Annotated[GradDtype | None, typer.Option()] = None,
    mfu_dtype: Annotated[str, typer.Option()] = "bf16",
    order: Annotated[str | None, typer.Option()] = None,
    explain: Annotated[bool, typer.Option("--explain")] = False,
    as_json: JsonFlag = False,
) -> None:
    """Predict one fully given layout: step time breakdown, MFU, memory per GPU."""
    from planner import api

    job = _plan_job(
        model, seq_len, global_batch_tokens, global_batch_size, precision, optimizer, grad_dtype
    )
    layout = api.build_layout(
        tp=tp,
        cp=cp,
        pp=pp,
        dp=dp,
        ep=ep,
        vpp=vpp,
        micro_batch_size=micro_batch_size,
        schedule=schedule,
        zero_stage=zero_stage,
        recompute=_value(recompute),
        sequence_parallel=sequence_parallel,
    )
    result = api.estimate(job, layout, cluster, gpus, mfu_dtype, order=order)
    if as_json:
        _emit_json(result)
        return
    from rich.table import Table

    console = _console()
    lay = result.layout
    console.print(
        f"{result.model} on {result.num_gpus:,} × {result.accelerator} ({result.cluster}): tp {lay.tp} cp {lay.cp} "
        f"pp {lay.pp} dp {lay.dp} ep {lay.ep} vpp {lay.vpp}, {lay.schedule}, m {result.num_microbatches}, "
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
        for line in api.explain_estimate(result, job):
            console.print(line)


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
        _emit_json(result)
        return
    from rich.table import Table

    table = Table(title="llmplan catalog")
    table.add_column("kind")
    table.add_column("names")
    for name, entries in result.items():
        table.add_row(name, ", ".join(entries))
    _console().print(table)


@catalog_app.command("show")
def catalog_show(
    name: Annotated[str, typer.Argument(help="a catalog name, e.g. llama3-405b or h100-sxm")],
    as_json: JsonFlag = False,
) -> None:
    """Show one catalog entry with its sources (models also with parameter counts)."""
    from planner import api

    result = api.show_catalog(name)
    if as_json:
        _emit_json(result)
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
    _console().print(table)


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
        _value(recipe),
        lora_rank=lora_rank,
        lora_alpha=lora_alpha,
        lora_targets=lora_targets,
        adapter_dtype=_value(adapter_dtype),
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
        precision=_value(precision),
        optimizer=_value(optimizer),
        grad_dtype=_value(grad_dtype),
        master_dtype=_value(master_dtype),
        zero_stage=zero_stage,
        dp=dp,
        model=model,
        finetune=finetune,
    )
    if as_json:
        _emit_json(result)
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
            f"{_gib(result.total_bytes)} GiB",
        )
    _console().print(table)


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
    precision: Annotated[Precision, typer.Option()] = Precision.bf16_mixed,
    optimizer: Annotated[Optimizer, typer.Option()] = Optimizer.adamw,
    grad_dtype: Annotated[GradDtype | None, typer.Option()] = None,
    flash_attention: Annotated[bool, typer.Option("--flash-attention/--no-flash-attention")] = True,
    accelerator: Annotated[
        str | None, typer.Option(help="accelerator whose HBM the result is checked against")
    ] = "h100-sxm",
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
        recompute = Recompute.full if _value(recipe) == "qlora" else Recompute.none
    job = api.build_job(
        model,
        seq_len,
        global_batch_tokens=global_batch_tokens,
        global_batch_size=global_batch_size,
        precision=_value(precision),
        optimizer=_value(optimizer),
        grad_dtype=_value(grad_dtype),
        flash_attention=flash_attention,
        finetune=finetune,
    )
    layout = api.build_layout(
        tp=tp,
        cp=cp,
        pp=pp,
        dp=dp,
        ep=ep,
        vpp=vpp,
        micro_batch_size=micro_batch_size,
        num_microbatches=num_microbatches,
        zero_stage=zero_stage,
        recompute=_value(recompute),
        sequence_parallel=sequence_parallel,
        schedule=schedule,
    )
    report = api.memory(job, layout, accelerator)
    if as_json:
        _emit_json(report)
        return
    _print_memory(report, explain)


def _print_memory(report, explain: bool) -> None:
    from rich.table import Table

    console = _console()
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
            _gib(sum(getattr(stage, part) for part in parts))
            for parts in list(columns.values())[3:]
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
        console.print(f"peak: {_gib(report.total_bytes)} GiB on rank {report.peak_rank}")
    else:
        verdict = "fits" if report.fits else "does NOT fit"
        console.print(
            f"peak: {_gib(report.total_bytes)} GiB on rank {report.peak_rank}; "
            f"{report.accelerator} has {_gib(report.capacity_bytes)} GiB: {verdict}"
        )
    if report.recipe_breakdown_bytes is not None:
        parts = Table(title=f"rank {report.peak_rank} by the {report.recipe} recipe's parts (GiB)")
        parts.add_column("part")
        parts.add_column("GiB", justify="right")
        for name, value in report.recipe_breakdown_bytes.items():
            parts.add_row(name, _gib(value))
        console.print(parts)
    if explain:
        terms = Table(title=f"how rank {report.peak_rank}'s memory is computed")
        terms.add_column("term")
        terms.add_column("formula", overflow="fold")
        terms.add_column("values", overflow="fold")
        terms.add_column("GiB", justify="right")
        for term in report.explain:
            terms.add_row(term.term, term.formula, term.values, _gib(term.bytes))
        console.print(terms)
        layer = Table(title="activation tensors of one dense layer, one micro-batch (MiB)")
        layer.add_column("tensor")
        layer.add_column("MiB", justify="right")
        for name, value in report.activation_tensors_per_layer.items():
            layer.add_row(name, f"{value / 2**20:,.1f}")
        console.print(layer)


# ----- pipeline schedules --------------------------------------------------------------


@app.command()
def schedule(
    name: Annotated[
        str,
        typer.Option(
            "--schedule",
            help="gpipe, 1f1b, interleaved-1f1b, zb-h1, zb-h2, zbv, dualpipe, dualpipev",
        ),
    ] = "1f1b",
    pp: Annotated[int, typer.Option(min=1, help="pipeline ranks")] = 4,
    microbatches: Annotated[int, typer.Option(min=1)] = 8,
    vpp: Annotated[
        int | None, typer.Option(min=1, help="chunks per rank (default: the schedule's)")
    ] = None,
    f: Annotated[float, typer.Option("--f", help="forward time per rank per micro-batch")] = 1.0,
    b: Annotated[
        float, typer.Option("--b", help="input-gradient time per rank per micro-batch")
    ] = 1.0,
    w: Annotated[
        float, typer.Option("--w", help="weight-gradient time per rank per micro-batch")
    ] = 1.0,
    comm: Annotated[float, typer.Option(help="point-to-point time per hop")] = 0.0,
    overlap_fb: Annotated[float, typer.Option(help="DualPipe F&B overlap, 0..1")] = 0.0,
    microbatch_group_size: Annotated[
        int | None, typer.Option(min=1, help="interleaved: Llama 3's N")
    ] = None,
    compare: Annotated[
        str | None,
        typer.Option(help="comma-separated schedules to compare, e.g. 1f1b,zb-h1,zbv,dualpipev"),
    ] = None,
    html: Annotated[str | None, typer.Option(help="write a plotly timeline as HTML")] = None,
    png: Annotated[
        str | None, typer.Option(help="write the timeline as PNG (needs kaleido + Chromium)")
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Generate, simulate and draw a pipeline schedule (or compare several)."""
    from planner import api

    names = [n.strip() for n in compare.split(",") if n.strip()] if compare else [name]
    reports = [
        api.schedule(
            n,
            pp,
            microbatches,
            vpp if len(names) == 1 else None,
            f,
            b,
            w,
            comm,
            overlap_fb,
            microbatch_group_size if n == "interleaved-1f1b" else None,
        )
        for n in names
    ]
    if html or png:
        from plots.schedule import schedule_figure, write_figure

        write_figure(schedule_figure(reports), html_path=html, png_path=png)
    if as_json:
        _emit_json(
            reports[0] if len(reports) == 1 else [r.model_dump(mode="json") for r in reports]
        )
        return
    from plots.schedule_chart import schedule_chart, summary_line

    console = _console()
    if len(reports) > 1:
        from rich.table import Table

        table = Table(
            title=f"pp {pp}, {microbatches} micro-batches, F {f} B {b} W {w}, comm {comm}"
        )
        for column in (
            "schedule",
            "vpp",
            "step time",
            "bubble",
            "bubble %",
            "peak act. (rank 0)",
            "param copies",
        ):
            table.add_column(column, justify="left" if column == "schedule" else "right")
        for report in reports:
            table.add_row(
                report.schedule,
                str(report.vpp),
                f"{report.step_time:g}",
                f"{report.bubble_time:g}",
                f"{100 * report.bubble_fraction:.1f}",
                f"{report.peak_activations[0]:g}",
                str(report.parameter_copies),
            )
        console.print(table)
    for report in reports:
        console.print(schedule_chart(report, max_width=max(console.width, 40)))
        console.print(summary_line(report))
    for path in (html, png):
        if path:
            console.print(f"wrote {path}")


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

    result = api.collective(_value(op), num_bytes, ranks, cluster, algorithm=algorithm, gpus=gpus)
    if as_json:
        _emit_json(result)
        return
    console = _console()
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
    precision: Annotated[Precision, typer.Option()] = Precision.bf16_mixed,
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
        precision=_value(precision),
    )
    layout = api.build_layout(
        tp=tp,
        cp=cp,
        pp=pp,
        dp=dp,
        ep=ep,
        vpp=vpp,
        micro_batch_size=micro_batch_size,
        schedule=schedule,
        zero_stage=zero_stage,
        recompute=_value(recompute),
        sequence_parallel=sequence_parallel,
    )
    report = api.comm(job, layout, cluster, order=order)
    if as_json:
        _emit_json(report)
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
    console = _console()
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
    gpus: Annotated[int | None, typer.Option(min=1, help="use the first N devices")] = None,
    order: Annotated[str | None, typer.Option(help="mesh order innermost first")] = None,
    html: Annotated[str | None, typer.Option(help="write the hierarchy as plotly HTML")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Rank placement: which ranks form each axis's groups and which links they cross."""
    from planner import api

    sizes = {"tp": tp, "cp": cp, "pp": pp, "ep": ep}
    if dp is not None:
        sizes["dp"] = dp
    report = api.topology(cluster, sizes, order=order, gpus=gpus)
    if html:
        from plots.topology import write_topology_html

        write_topology_html(report, html)
    if as_json:
        _emit_json(report)
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
    console = _console()
    console.print(table)
    for note in report.notes:
        console.print(f"note: {note}")
    if html:
        console.print(f"wrote {html}")


# ----- validation against real torch.distributed runs ----------------------------------


def _need_torch() -> None:
    from planner.errors import PlanError

    try:
        import torch  # noqa: F401
    except ImportError:
        raise PlanError(
            "validation needs torch: pip install torch==2.13.0 (the CPU wheel) or the 'validate' extra"
        ) from None


@app.command()
def calibrate(
    out: Annotated[
        str | None, typer.Option(help="write the cluster spec here (plus -accelerator/-link TOMLs)")
    ] = "local.toml",
    ranks: Annotated[str, typer.Option(help="world sizes to fit collectives for")] = "2,4",
    as_json: JsonFlag = False,
) -> None:
    """Measure this machine (GEMM FLOP/s per rank, memory bandwidth, gloo collectives) as a cluster spec."""
    _need_torch()
    from validate.calibrate import calibrate as run_calibration

    sizes = tuple(_int_list(ranks, "ranks"))
    result = run_calibration(ranks=sizes, out_path=out)
    if as_json:
        _emit_json(result)
        return
    console = _console()
    best = {}
    for point in result.gemms:
        best[point.dtype] = max(best.get(point.dtype, 0.0), point.flops_per_s)
    console.print(f"calibrated {result.hostname} ({result.date}, torch {result.torch_version})")
    for dtype, flops in best.items():
        console.print(f"  GEMM {dtype}: {flops / 1e9:,.1f} GFLOP/s per rank (one thread)")
    console.print(f"  memory bandwidth: {result.memory_bytes_per_s / 1e9:,.2f} GB/s")
    for fit in result.collectives:
        console.print(
            f"  {fit.collective} over {fit.world_size} ranks: alpha {fit.alpha_s * 1e3:.3f} ms, "
            f"{fit.algbw_bytes_per_s / 1e9:,.2f} GB/s"
        )
    for kind, path in result.paths.items():
        console.print(f"wrote {kind}: {path}")


@app.command()
def validate(
    quick: Annotated[
        bool, typer.Option("--quick/--full", help="the quick set (CI) or every layout")
    ] = True,
    layouts: Annotated[
        str | None, typer.Option(help="comma-separated layout names (see --list)")
    ] = None,
    cluster: Annotated[
        str | None, typer.Option(help="calibrated cluster TOML; calibrates first if omitted")
    ] = None,
    timeout_s: Annotated[float, typer.Option(help="time limit per layout")] = 180.0,
    list_layouts: Annotated[
        bool, typer.Option("--list", help="list the layout names and exit")
    ] = False,
    html: Annotated[
        str | None, typer.Option(help="write predicted vs measured pipeline timelines")
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Run real torch.distributed steps and print predicted vs measured side by side."""
    _need_torch()
    from validate.compare import compare
    from validate.run import FULL_LAYOUTS, QUICK_LAYOUTS, find_layouts, run_layouts

    if list_layouts:
        for spec in (*QUICK_LAYOUTS, *[s for s in FULL_LAYOUTS if s not in QUICK_LAYOUTS]):
            marker = "quick" if spec in QUICK_LAYOUTS else "full"
            _console().print(f"{spec.name:<20} {marker}")
        return
    specs = find_layouts(layouts.split(",")) if layouts else None
    if cluster is None:
        from validate.calibrate import calibrate as run_calibration

        if not as_json:
            _console().print(
                "no --cluster given: calibrating this machine first (llmplan calibrate)"
            )
        cluster = run_calibration().paths["cluster"]
    console = _console()

    def progress(result) -> None:
        if not as_json:
            console.print(f"  ran {result.name}: {result.status}")

    results = run_layouts(specs, quick=quick, timeout_s=timeout_s, on_result=progress)
    report = compare(results, cluster)
    if html:
        from plots.validation import validation_figure

        validation_figure(report).write_html(html, include_plotlyjs=True, full_html=True)
    if as_json:
        _emit_json(report)
        return
    _print_validation(report)
    if html:
        console.print(f"wrote {html}")


def _print_validation(report) -> None:
    from rich.table import Table

    table = Table(title="predicted / measured (error)", show_edge=False, padding=(0, 1))
    for column in ("layout", "status", "step ms", "memory MB", "comm MB / step"):
        left = column in ("layout", "status")
        table.add_column(column, justify="left" if left else "right", no_wrap=True)

    def cell(run, key, scale, digits):
        predicted, measured, error = (
            run.predicted.get(key),
            run.measured.get(key),
            run.error.get(key),
        )
        if predicted is None and measured is None:
            return "-"
        values = (predicted, measured)
        text = " / ".join("-" if v is None else f"{v * scale:.{digits}f}" for v in values)
        return text + ("" if error is None else f" ({100 * error:+.0f}%)")

    for run in report.runs:
        table.add_row(
            run.name,
            run.status,
            cell(run, "step_time_s", 1e3, 1),
            cell(run, "memory_bytes", 1e-6, 2),
            cell(run, "comm_bytes", 1e-6, 3),
        )
    console = _console()
    console.print(f"llmplan validate on {report.cluster}")
    console.print(table)
    summary = report.summary
    failed = ", ".join(summary["failed"]) or "none"
    console.print(f"{summary['num_ok']} of {summary['num_runs']} layouts ran; failed: {failed}")
    for term, stats in summary["error"].items():
        if not stats.get("count"):
            continue
        verdict = ""
        if "met" in stats:
            verdict = " — target met" if stats["met"] else " — target NOT met"
        console.print(
            f"{term}: mean |error| {100 * stats['mean_abs']:.1f}%, median "
            f"{100 * stats['median_abs']:.1f}%, max {100 * stats['max_abs']:.1f}% over "
            f"{stats['count']} layouts{verdict}"
        )
    console.print(
        f"pipeline action order as simulated: {summary['pipeline_order_matches_planner']} of "
        f"{summary['pipeline_runs']} pipeline runs"
    )


# ----- entry point ----------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; user errors are one line on stderr with exit code 2."""
    from planner.errors import PlanError

    command = typer.main.get_command(app)
    try:
        result = command.main(args=argv, prog_name="llmplan", standalone_mode=False)
    except PlanError as error:
        sys.stderr.write(f"error: {error}\n")
        return 2
    except typer.Exit as done:
        return done.exit_code
    except typer.Abort:
        sys.stderr.write("aborted\n")
        return 1
    except Exception as error:
        # Usage errors (bad option values, unknown options) from typer's click layer.
        if not hasattr(error, "format_message"):
            raise
        sys.stderr.write(f"error: {error.format_message()}\n")
        return getattr(error, "exit_code", 2) or 2
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())

"""`llmplan plan` and `llmplan estimate`: the layout search and one layout's estimate."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from commands.common import (
    GIB,
    EtpFlag,
    GradDtype,
    JsonFlag,
    MemHeadroomFlag,
    MemoryMeasuresFlag,
    MoeCapacityFlag,
    MoeImbalanceFlag,
    Optimizer,
    PrecisionFlag,
    Recompute,
    WeightPass,
    WeightPassFlag,
    app,
    emit_json,
    fits_line,
    int_list,
    make_console,
    option_value,
)
from commands.memory import (
    AdapterDtypeFlag,
    DoubleQuantFlag,
    LoraAlphaFlag,
    LoraRankFlag,
    LoraTargetsFlag,
    Recipe,
    RecipeFlag,
    _finetune,
)
from commands.time_to_train import GpuHourCostFlag, TrainTokensFlag, build_training
from commands.time_to_train import summary_line as time_to_train_line

# ----- plan and estimate ---------------------------------------------------------------


def _plan_job(
    model,
    seq_len,
    global_batch_tokens,
    global_batch_size,
    precision,
    optimizer,
    grad_dtype,
    finetune=None,
    memory_measures=None,
    weight_pass_memory=None,
    moe_imbalance=None,
    moe_capacity_factor=None,
):
    from planner import api

    if global_batch_tokens is None and global_batch_size is None:
        global_batch_tokens = api.DEFAULT_PLAN["global_batch_tokens"]
    return api.build_job(
        model,
        seq_len,
        global_batch_tokens=global_batch_tokens,
        global_batch_size=global_batch_size,
        precision=option_value(precision),
        optimizer=option_value(optimizer),
        grad_dtype=option_value(grad_dtype),
        finetune=finetune,
        memory_measures=option_value(memory_measures),
        weight_pass_memory=option_value(weight_pass_memory),
        moe_imbalance=moe_imbalance,
        moe_capacity_factor=moe_capacity_factor,
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
    objective: Annotated[
        str, typer.Option(help="step_time, memory, mfu or time-to-train (needs --train-tokens)")
    ] = "step_time",
    mem_headroom: MemHeadroomFlag = 0.05,
    tp: Annotated[str | None, typer.Option(help="pin, e.g. 8 or 4,8")] = None,
    cp: Annotated[str | None, typer.Option(help="pin")] = None,
    pp: Annotated[str | None, typer.Option(help="pin")] = None,
    dp: Annotated[str | None, typer.Option(help="pin")] = None,
    ep: Annotated[str | None, typer.Option(help="pin")] = None,
    etp: Annotated[
        str | None, typer.Option(help="pin the routed experts' TP degree: 1 or tp (e.g. 1)")
    ] = None,
    vpp: Annotated[str | None, typer.Option(help="pin")] = None,
    micro_batch_size: Annotated[str | None, typer.Option(help="pin")] = None,
    schedule: Annotated[str | None, typer.Option(help="pin, e.g. 1f1b,interleaved-1f1b")] = None,
    zero_stage: Annotated[str | None, typer.Option(help="pin, e.g. 1")] = None,
    recompute: Annotated[str | None, typer.Option(help="pin: none, selective, full")] = None,
    sequence_parallel: Annotated[
        bool | None, typer.Option("--sequence-parallel/--no-sequence-parallel", help="pin")
    ] = None,
    allow_cross_node_tp: Annotated[bool, typer.Option("--allow-cross-node-tp")] = False,
    precision: PrecisionFlag = None,
    memory_measures: MemoryMeasuresFlag = None,
    weight_pass_memory: WeightPassFlag = WeightPass.inputs,
    moe_imbalance: MoeImbalanceFlag = None,
    moe_capacity_factor: MoeCapacityFlag = None,
    optimizer: Annotated[Optimizer, typer.Option()] = Optimizer.adamw,
    grad_dtype: Annotated[GradDtype | None, typer.Option()] = None,
    recipe: RecipeFlag = Recipe.full,
    lora_rank: LoraRankFlag = None,
    lora_alpha: LoraAlphaFlag = None,
    lora_targets: LoraTargetsFlag = None,
    adapter_dtype: AdapterDtypeFlag = None,
    double_quant: DoubleQuantFlag = None,
    mfu_dtype: Annotated[
        str, typer.Option(help="dtype whose peak MFU is measured against")
    ] = "bf16",
    order: Annotated[str | None, typer.Option(help="mesh order innermost first")] = None,
    profile: Annotated[
        str,
        typer.Option(
            help="efficiency profile: none (the ideal model), shipped (the accelerator's "
            "fitted profile, or its generation's) or a profile TOML path"
        ),
    ] = "none",
    explain: Annotated[
        bool, typer.Option("--explain", help="why the winner wins, why rows were rejected")
    ] = False,
    emit: Annotated[
        str | None,
        typer.Option(
            help="the winner's settings for a trainer: megatron (arguments) or torchtitan "
            "(config overrides); the search keeps to what that trainer runs; printed alone on "
            "stdout (the table goes to stderr) unless --emit-out is given; also in --json"
        ),
    ] = None,
    emit_out: Annotated[
        str | None, typer.Option(help="write the --emit settings to this file")
    ] = None,
    csv: Annotated[str | None, typer.Option(help="write every feasible row as CSV")] = None,
    html: Annotated[
        str | None, typer.Option(help="write step time vs memory of all feasible layouts")
    ] = None,
    train_tokens: TrainTokensFlag = None,  # time to train (issue 19)
    gpu_hour_cost: GpuHourCostFlag = None,
    as_json: JsonFlag = False,
) -> None:
    """Search every layout and rank them (default: Llama 3 405B on 16,384 H100s).

    Objectives: step_time, memory, mfu, time-to-train (expected wall time of
    --train-tokens, failures and checkpoints included)."""
    from hwspecs.errors import PlanError
    from planner import api
    from planner.api import SearchSpace

    try:
        if gpus is None and cluster == api.DEFAULT_PLAN["cluster"]:
            gpus = api.DEFAULT_PLAN["gpus"]
        finetune = _finetune(
            recipe, lora_rank, lora_alpha, lora_targets, adapter_dtype, double_quant
        )
        job = _plan_job(
            model,
            seq_len,
            global_batch_tokens,
            global_batch_size,
            precision,
            optimizer,
            grad_dtype,
            finetune,
            memory_measures,
            weight_pass_memory,
            moe_imbalance,
            moe_capacity_factor,
        )
        pins = {
            "tp": int_list(tp, "tp"),
            "cp": int_list(cp, "cp"),
            "pp": int_list(pp, "pp"),
            "dp": int_list(dp, "dp"),
            "ep": int_list(ep, "ep"),
            "etp": int_list(etp, "etp"),
            "vpp": int_list(vpp, "vpp"),
        }
        space_fields = {key: value for key, value in pins.items() if value is not None}
        if micro_batch_size:
            space_fields["micro_batch_size"] = int_list(micro_batch_size, "micro-batch-size")
        if schedule:
            space_fields["schedule"] = _name_list(schedule, "schedule")
        if emit:
            space_fields["schedule"] = _trainer_space(emit, job, space_fields, as_json)
        if zero_stage:
            space_fields["zero_stage"] = [int(v) for v in zero_stage.split(",")]
            if any(v not in (0, 1, 2, 3) for v in space_fields["zero_stage"]):
                raise PlanError(f"--zero-stage takes 0, 1, 2 or 3, got '{zero_stage}'")
        if recompute:
            space_fields["recompute"] = _name_list(recompute, "recompute")
        if sequence_parallel is not None:
            space_fields["sequence_parallel"] = [sequence_parallel]
        space = SearchSpace(**space_fields, allow_cross_node_tp=allow_cross_node_tp)
        training = build_training(cluster, train_tokens, gpu_hour_cost)
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
                profile=profile,
                training=training,
            )
        if not result.results:
            raise PlanError(_no_layout_message(result))
    except PlanError as error:
        if as_json:
            emit_json({"error": str(error)})
            raise typer.Exit(2) from None
        raise
    if csv:
        table.to_csv(csv, index=False)
    if html:
        from plots.plan import plan_figure

        figure = plan_figure(table, result, api.plan_page_sample(table))
        figure.write_html(html, include_plotlyjs=True, full_html=True)
    emitted = api.emit_settings(result.results[0], emit, job) if emit else None
    if emit_out and emitted is not None:
        with open(emit_out, "w") as out:
            out.write(emitted.text + "\n")
    if as_json:
        data = result.model_dump(mode="json")
        if emitted is not None:
            data["emitted"] = emitted.model_dump(mode="json")
        emit_json(data)
        return
    # With --emit and no file, stdout carries the settings alone (redirectable as they are).
    alone = emitted is not None and not emit_out
    console = _stderr_console() if alone else make_console()
    _print_plan(result, explain, console)
    for note in emitted.notes if emitted is not None else ():
        console.print(f"note ({emit}): {note}", markup=False, highlight=False)
    if alone:
        sys.stdout.write(emitted.text + "\n")
    for path in (csv, html, emit_out):
        if path:
            console.print(f"wrote {path}")


def _stderr_console():
    from rich.console import Console

    return Console(stderr=True)


def _trainer_space(trainer: str, job, space_fields: dict, quiet: bool) -> list[str]:
    """The schedules (and, for torchtitan's MoE, the expert TP) a search for ``trainer`` keeps."""
    from hwspecs.errors import PlanError
    from planner import api
    from planner.api import TRAINER_ETP, TRAINER_NAMES

    pinned = space_fields.get("schedule")
    schedules = api.trainer_schedules(trainer, pinned)
    if job.model.is_moe and TRAINER_ETP[trainer] == "1":
        if space_fields.get("etp") not in (None, [1]) and 1 not in space_fields["etp"]:
            raise PlanError(f"--emit {trainer}: {TRAINER_NAMES[trainer]} runs etp 1 only")
        space_fields["etp"] = [1]
    if not quiet and schedules != pinned:
        sys.stderr.write(
            f"--emit {trainer}: searching the schedules {TRAINER_NAMES[trainer]} runs: "
            f"{', '.join(schedules)}\n"
        )
    return schedules


def _name_list(text: str, name: str) -> list[str]:
    from hwspecs.errors import PlanError

    allowed = {"schedule": None, "recompute": ("none", "selective", "full")}[name]
    values = [part.strip() for part in text.split(",") if part.strip()]
    if name == "schedule":
        from hwspecs.errors import unknown_name_error
        from planner.api import SCHEDULES

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


def _print_plan(result, explain: bool, console=None) -> None:
    from rich import box
    from rich.table import Table

    console = console or make_console()
    q = result.query
    console.print(
        f"{q['model']} on {q['gpus']:,} GPUs of {q['cluster']}, seq {q['seq_len']:,}, "
        f"{q['global_batch_tokens']:,} tokens per step: {result.candidates_evaluated:,} layouts "
        f"screened, {result.feasible:,} feasible"
    )
    # No vertical rules and two spaces between columns: the widest rows (DeepSeek-V3's
    # five degrees, "int-1f1b v8") fit 80 columns; only the schedule and recompute names
    # may wrap, never a number.
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, padding=(0, 1, 0, 0), pad_edge=False)
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
    timed = result.results[0].get("time_to_train") is not None
    columns += ("days", "good%") if timed else ()
    for column in columns:
        left = column in (degrees_header, "schedule", "recomp")
        wraps = column in ("schedule", "recomp")
        table.add_column(
            column,
            justify="left" if left else "right",
            no_wrap=not wraps,
            overflow="fold" if wraps else "ellipsis",
        )
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
            *_time_to_train_cells(entry.get("time_to_train")),
        )
    console.print(table)
    if timed:
        console.print("#1 " + time_to_train_line(result.results[0]["time_to_train"]))
    if explain:
        for line in result.explanation:
            console.print(line)
        if timed:
            from planner import api
            from planner.api import TimeToTrain

            section = TimeToTrain(**result.results[0]["time_to_train"])
            for line in api.explain_time_to_train(section):
                console.print(line)


def _time_to_train_cells(section: dict | None) -> tuple[str, ...]:
    if section is None:
        return ()
    return (f"{section['wall_time_days']:.1f}", f"{100 * section['goodput']:.1f}")


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
    etp: EtpFlag = None,
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
    precision: PrecisionFlag = None,
    memory_measures: MemoryMeasuresFlag = None,
    weight_pass_memory: WeightPassFlag = WeightPass.inputs,
    moe_imbalance: MoeImbalanceFlag = None,
    moe_capacity_factor: MoeCapacityFlag = None,
    optimizer: Annotated[Optimizer, typer.Option()] = Optimizer.adamw,
    grad_dtype: Annotated[GradDtype | None, typer.Option()] = None,
    recipe: RecipeFlag = Recipe.full,
    lora_rank: LoraRankFlag = None,
    lora_alpha: LoraAlphaFlag = None,
    lora_targets: LoraTargetsFlag = None,
    adapter_dtype: AdapterDtypeFlag = None,
    double_quant: DoubleQuantFlag = None,
    mfu_dtype: Annotated[str, typer.Option()] = "bf16",
    order: Annotated[str | None, typer.Option()] = None,
    mem_headroom: MemHeadroomFlag = 0.05,
    profile: Annotated[
        str,
        typer.Option(
            help="efficiency profile: none (the ideal model), shipped (the accelerator's "
            "fitted profile, or its generation's) or a profile TOML path"
        ),
    ] = "none",
    explain: Annotated[bool, typer.Option("--explain")] = False,
    train_tokens: TrainTokensFlag = None,  # time to train (issue 19)
    gpu_hour_cost: GpuHourCostFlag = None,
    as_json: JsonFlag = False,
) -> None:
    """Predict one fully given layout: step time breakdown, MFU, memory per GPU."""
    from planner import api

    finetune = _finetune(recipe, lora_rank, lora_alpha, lora_targets, adapter_dtype, double_quant)
    job = _plan_job(
        model,
        seq_len,
        global_batch_tokens,
        global_batch_size,
        precision,
        optimizer,
        grad_dtype,
        finetune,
        memory_measures,
        weight_pass_memory,
        moe_imbalance,
        moe_capacity_factor,
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
    training = build_training(cluster, train_tokens, gpu_hour_cost)
    result = api.estimate(
        job, layout, cluster, gpus, mfu_dtype, mem_headroom, order=order, profile=profile,
        training=training,
    )  # fmt: skip
    warnings = api.layout_warnings(layout, cluster)
    if as_json:
        emit_json({**result.model_dump(mode="json"), "warnings": warnings})
        return
    for warning in warnings:
        sys.stderr.write(f"warning: {warning}\n")
    from rich.table import Table

    console = make_console()
    lay = result.layout
    console.print(
        f"{result.model} on {result.num_gpus:,} × {result.accelerator} ({result.cluster}): tp {lay.tp} cp {lay.cp} "
        f"pp {lay.pp} dp {lay.dp} ep {lay.ep}{f' etp {lay.etp}' if lay.etp is not None else ''} vpp {lay.vpp}, {lay.schedule}, m {result.num_microbatches}, "
        f"mbs {lay.micro_batch_size}, ZeRO {lay.zero_stage}, recompute {lay.recompute}"
    )
    # The headline is a line of its own (a table title wraps inside the table's width).
    console.print(
        f"step {result.step_time_s:.3f} s — MFU {100 * result.mfu:.1f}% "
        f"(causal {100 * result.mfu_causal:.1f}%), {result.model_tflops_per_gpu:.0f} TFLOP/s "
        f"per GPU, {result.tokens_per_s_per_gpu:,.0f} tokens/s per GPU"
    )
    table = Table()
    table.add_column("term")
    table.add_column("seconds", justify="right")
    table.add_column("share", justify="right")
    for key, value in result.time_breakdown_s.items():
        if value:
            table.add_row(key, f"{value:.4f}", f"{100 * value / result.step_time_s:.1f}%")
    console.print(table)
    if result.step_time_interval_s is not None:
        (low, high), (mfu_low, mfu_high) = result.step_time_interval_s, result.mfu_interval
        console.print(
            f"profile {result.profile}: step {low:.3f}–{high:.3f} s, MFU "
            f"{100 * mfu_low:.1f}–{100 * mfu_high:.1f}% (cross-validated 10th–90th percentile)"
        )
    console.print("memory per GPU " + fits_line(result.memory_per_gpu_bytes, result))
    if result.time_to_train is not None:
        console.print(time_to_train_line(result.time_to_train.model_dump()))
    if explain:
        for line in api.explain_estimate(result, job):
            console.print(line)
        if result.time_to_train is not None:
            for line in api.explain_time_to_train(result.time_to_train):
                console.print(line)

"""`llmplan plan` and `llmplan estimate`: the layout search and one layout's estimate."""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer

from commands.common import GIB, JsonFlag, app, emit_json, fits_line, make_console
from commands.flags import (
    CLUSTER,
    DEFAULT_LAYOUT,
    JOB,
    MEM_HEADROOM,
    MFU_DTYPE,
    OBJECTIVE_HELP,
    PINS,
    RANK,
    Choice,
    Count,
    ListOf,
    Name,
    Objective,
    ObjectiveName,
    Trainer,
    Values,
    build_job,
    build_layout,
    option,
    output,
    pinned,
    png_output,
    uses,
)
from commands.flags import (
    value as enum_value,
)
from commands.time_to_train import GpuHourCostFlag, TrainTokensFlag, build_training
from commands.time_to_train import summary_line as time_to_train_line

# ----- plan and estimate ---------------------------------------------------------------

ExplainFlag = Annotated[
    bool, typer.Option("--explain", help="why the winner wins, why rows were rejected")
]
ProfileFlag = Annotated[
    str,
    option(
        Name("auto, none or a profile name or TOML path"),
        "efficiency profile: auto (the accelerator's fitted profile for --stack, else its "
        "all-stack one, else its generation's; the ideal model where none), none (the ideal "
        "model), a shipped profile's name or a profile TOML path",
    ),
]
StackFlag = Annotated[
    str | None,
    option(
        Name("megatron, pytorch-fsdp, jax or deepspeed"),
        "the job's software stack (megatron: Megatron-Core/NeMo; pytorch-fsdp: FSDP2, "
        "torchtitan, Composer; jax: MaxText/Pax; deepspeed): --profile auto takes the "
        "profile fitted on that stack's runs where one ships",
    ),
]


@app.command()
@uses(job=JOB, cluster=CLUSTER, pins=PINS)
def plan(
    job: Values,
    cluster: Values,
    pins: Values,
    top: Annotated[int, option(Count(1), "results to show")] = 5,
    objective: Annotated[Objective, option(ObjectiveName(), OBJECTIVE_HELP)] = (
        Objective.step_time
    ),
    mem_headroom: MEM_HEADROOM.annotation = MEM_HEADROOM.default,
    mfu_dtype: MFU_DTYPE.annotation = MFU_DTYPE.default,
    profile: ProfileFlag = "auto",
    stack: StackFlag = None,
    rank: RANK.annotation = RANK.default,
    explain: ExplainFlag = False,
    emit: Annotated[
        Trainer | None,
        option(
            Choice(Trainer),
            "the winner's settings for a trainer: megatron (arguments) or torchtitan (config "
            "overrides); the search keeps to what that trainer runs; printed alone on stdout "
            "(the table goes to stderr) unless --emit-out is given; also in --json",
        ),
    ] = None,
    emit_out: output("write the --emit settings to this file") = None,
    csv: output("write every feasible row as CSV") = None,
    html: output("write step time vs memory of the feasible layouts as a page (offline)") = None,
    png: png_output("write that page as PNG (needs kaleido and a Chrome/Chromium)") = None,
    runs: Annotated[
        Any,
        option(
            ListOf(Name("runs files (JSON or CSV in the runs schema) or the catalog train")),
            "the page marks the published layouts of these runs that trained this model at "
            "this GPU count and sequence length: runs files or the catalog train (default "
            "train), comma-separated",
        ),
    ] = None,
    mark: Annotated[
        str | None,
        option(
            Name("axis=degree pairs, e.g. tp=8,pp=16,dp=128"),
            "a layout the page marks too, by its degrees, e.g. tp=8,pp=16,dp=128",
        ),
    ] = None,
    train_tokens: TrainTokensFlag = None,  # time to train (issue 19)
    gpu_hour_cost: GpuHourCostFlag = None,
    as_json: JsonFlag = False,
) -> None:
    """Search every layout and rank them (default: Llama 3 405B on 16,384 H100s).

    Objectives: step_time, memory, mfu, time-to-train (expected wall time of
    --train-tokens, failures and checkpoints included).

    The search runs on LLMPLAN_THREADS threads (default: the CPUs this process may
    use, at most 4; 1: one block of rows after another); the results do not depend on it."""
    from planner import api

    gpus = cluster.gpus
    if gpus is None and cluster.cluster == api.DEFAULT_PLAN["cluster"]:
        gpus = api.DEFAULT_PLAN["gpus"]
    query = build_job(job)
    named = api.parse_mark(mark) if mark else None  # checked before the search runs
    space_fields = pinned(pins)
    emit = enum_value(emit)
    if emit:
        space_fields["schedule"] = _trainer_space(emit, query, space_fields, as_json)
    space = api.build_search_space(**space_fields)
    training = build_training(cluster.cluster, train_tokens, gpu_hour_cost)
    writes_table = bool(csv or html or png)  # else no DataFrame is built (nor pandas imported)
    with _progress(not as_json) as advance:
        result, table = api.plan(
            query,
            cluster.cluster,
            gpus,
            space,
            enum_value(objective),
            mem_headroom,
            top,
            enum_value(mfu_dtype),
            cluster.order,
            progress=advance,
            profile=profile,
            training=training,
            rank=enum_value(rank),
            stack=stack,
            every_output=writes_table,  # every output goes into the table written out
            with_table=writes_table,
        )
    if csv:
        from commands.outputs import atomic_path

        with atomic_path(csv) as temporary:
            table.to_csv(temporary, index=False)
    if html or png:
        from commands.outputs import write_pages
        from plots.plan import plan_figure

        marks = api.plan_page_marks(table, query, result, runs, named)
        write_pages(plan_figure(table, result, api.plan_page_sample(table), marks), html, png)
    emitted = api.emit_settings(result.results[0], emit, query) if emit else None
    if emit_out and emitted is not None:
        from commands.outputs import atomic_path

        with atomic_path(emit_out) as temporary, open(temporary, "w") as out:
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
    _print_plan(result, explain, console, profile)
    for note in emitted.notes if emitted is not None else ():
        console.print(f"note ({emit}): {note}", markup=False, highlight=False)
    if alone:
        sys.stdout.write(emitted.text + "\n")
    for path in (csv, html, png, emit_out):
        if path:
            console.print(f"wrote {path}", markup=False, highlight=False, soft_wrap=True)


class _progress:
    """A rich bar per phase of the search on a terminal (silent otherwise): each phase
    (:data:`planner.progress.PHASES`) advances per chunk of rows it evaluated, and its time
    left is estimated from that phase's own rate."""

    def __init__(self, enabled: bool):
        self.enabled = enabled and sys.stderr.isatty()
        self.bar = None
        self.tasks: dict[str, int] = {}

    def __enter__(self):
        if not self.enabled:
            return None
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self.bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[unit]}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=Console(stderr=True),
            transient=True,
        )
        self.bar.start()
        return self.advance

    def advance(self, phase: str, done: int, total: int) -> None:
        from planner.api import PROGRESS_PHASES

        if phase not in self.tasks:
            for task in self.tasks.values():  # the earlier phases are over
                self.bar.update(task, completed=self.bar.tasks[task].total)
            self.tasks[phase] = self.bar.add_task(
                phase, total=max(total, 1), unit=PROGRESS_PHASES.get(phase, "")
            )
        self.bar.update(self.tasks[phase], completed=done, total=max(total, 1))

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.stop()
        return False


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


def _cp_algorithm_line(results: list[dict]) -> str:
    """Each CP row's context-parallel algorithm, by rank ("" when no row has CP)."""
    by_name: dict[str, list[str]] = {}
    for entry in results:
        lay = entry["layout"]
        if lay["cp"] > 1:
            name = lay["cp_algorithm"]
            if name == "hierarchical" and lay.get("cp_inner"):
                name = f"hierarchical (inner {lay['cp_inner']})"
            by_name.setdefault(name, []).append(str(entry["rank"]))
    if not by_name:
        return ""
    return "cp algorithm: " + "; ".join(f"{name} #{', #'.join(ranks)}"
                                        for name, ranks in by_name.items())  # fmt: skip


def _print_plan(result, explain: bool, console=None, profile: str = "auto") -> None:
    from rich import box
    from rich.table import Table

    console = console or make_console()
    q = result.query
    console.print(
        f"{q['model']} on {q['num_gpus']:,} GPUs of {q['cluster']}, seq {q['seq_len']:,}, "
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
    recompute_header = "recomp"
    if etp:  # six degrees: two-line headers keep the row at 80 columns (no name folds)
        degrees_header, recompute_header = "tp/cp/pp/dp/\nep/etp", "re-\ncomp"
    columns = (
        "#",
        "t#",
        degrees_header,
        "sp",
        "schedule",
        "mbs",
        "Z",
        recompute_header,
        "step s",
        "MFU%",
        "GiB",
        "bub%",
    )
    timed = result.results[0].get("time_to_train") is not None
    columns += ("days", "good%") if timed else ()
    for column in columns:
        left = column in (degrees_header, "schedule", recompute_header)
        wraps = column in ("schedule", recompute_header)
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
            (TIE_MARK if entry["equivalent_to_best"] else "") + str(entry["rank_by_time"]),
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
    cp_line = _cp_algorithm_line(result.results)
    if cp_line:
        console.print(cp_line, markup=False, highlight=False)
    console.print(_rank_legend(result), markup=False, highlight=False)
    auto = profile in ("auto", "shipped")
    console.print(profile_line(result.results[0], "#1 ", auto), markup=False, highlight=False)
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


#: Marks a row within the model's ratio error of the fastest (a tie) in the plan table.
TIE_MARK = "="


def _rank_legend(result) -> str:
    """What ``#``, ``=`` and ``t#`` mean for this plan (its ranking mode and band)."""
    q = result.query
    band = q.get("ratio_error_band")
    tie = (f"{TIE_MARK}: within the model's {band:.1%} ratio error of the fastest (a tie)"
           if band is not None else "no measured ratio error: no ties")  # fmt: skip
    order = "ties first, by the preference rules" if q.get("rank") == "robust" else "by time"
    simulated = any(entry.get("simulated") for entry in result.results)
    steps = ("; step s: closed form (the ranks read the event simulator's step where it ran: "
             "--json 'simulated')") if simulated else ""  # fmt: skip
    return f"ranked {order}; t#: rank by predicted step time, {tie}{steps}"


def profile_line(entry: dict, prefix: str = "", auto: bool = False) -> str:
    """The profile an estimate used and, with one, its cross-validated band (``auto``: the
    profile was --profile auto's choice, so none found is said as such), and whether the
    stack was taken to overlap TP communication, whether the layers replay from CUDA graphs,
    and the attention kernel timed where the job or its stack names one."""
    overlap = "on" if entry.get("tp_comm_overlap") else "off"
    ep = "; EP comm overlap on (combined 1F1B)" if entry.get("ep_comm_overlap") else ""
    graphs = "; CUDA graphs" if entry.get("cuda_graphs") else ""
    kernel = entry.get("attention_kernel")
    attention = f"; attention kernel {kernel}" if kernel else ""
    outside = entry.get("outside_measured_layouts")
    beyond = f"; beyond the profile's runs: {', '.join(outside)}" if outside else ""
    return (
        f"{_profile_text(entry, prefix, auto)}; TP comm overlap {overlap}{ep}{graphs}{attention}"
        f"{beyond}"
    )


def _profile_text(entry: dict, prefix: str, auto: bool) -> str:
    if entry.get("step_time_interval_s") is None:
        if entry.get("profile"):
            return f"profile: {entry['profile']}"
        accelerator = entry.get("accelerator")
        if auto and accelerator:  # --profile auto found none to take
            return (f"profile: none (no profile ships for {accelerator} or its generation: "
                    "the ideal model)")  # fmt: skip
        return "profile: none (the ideal model)"
    (low, high), (mfu_low, mfu_high) = entry["step_time_interval_s"], entry["mfu_interval"]
    return (
        f"profile: {entry['profile']}; {prefix}step {low:.3f}–{high:.3f} s, MFU "
        f"{100 * mfu_low:.1f}–{100 * mfu_high:.1f}% (cross-validated 10th–90th percentile)"
    )


def _time_to_train_cells(section: dict | None) -> tuple[str, ...]:
    if section is None:
        return ()
    return (f"{section['wall_time_days']:.1f}", f"{100 * section['goodput']:.1f}")


@app.command()
@uses(job=JOB, cluster=CLUSTER, layout=DEFAULT_LAYOUT)
def estimate(
    job: Values,
    cluster: Values,
    layout: Values,
    mfu_dtype: MFU_DTYPE.annotation = MFU_DTYPE.default,
    mem_headroom: MEM_HEADROOM.annotation = MEM_HEADROOM.default,
    profile: ProfileFlag = "auto",
    stack: StackFlag = None,
    explain: Annotated[bool, typer.Option("--explain", help="each term's formula")] = False,
    train_tokens: TrainTokensFlag = None,  # time to train (issue 19)
    gpu_hour_cost: GpuHourCostFlag = None,
    html: output("write the layout's timeline and breakdowns as a page (offline)") = None,
    png: png_output("write that page as PNG (needs kaleido and a Chrome/Chromium)") = None,
    as_json: JsonFlag = False,
) -> None:
    """Predict one fully given layout: step time breakdown, MFU, memory per GPU; --html
    draws its pipeline timeline (each stage's F/B/W in ms) and its time and memory parts."""
    from planner import api

    query = build_job(job)
    chosen = build_layout(layout, job)
    training = build_training(cluster.cluster, train_tokens, gpu_hour_cost)
    result = api.estimate(
        query, chosen, cluster.cluster, cluster.gpus, enum_value(mfu_dtype), mem_headroom,
        order=cluster.order, profile=profile, training=training, stack=stack,
    )  # fmt: skip
    warnings = api.layout_warnings(chosen, cluster.cluster)
    if html or png:
        from commands.outputs import write_pages
        from plots.estimate import estimate_figure

        timeline = api.layout_timeline(query, chosen, cluster.cluster, result, profile, stack)
        write_pages(estimate_figure(result, timeline), html, png)
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
    auto = profile in ("auto", "shipped")
    console.print(profile_line(result.model_dump(), "", auto), markup=False, highlight=False)
    console.print("memory per GPU " + fits_line(result.memory_per_gpu_bytes, result))
    if result.time_to_train is not None:
        console.print(time_to_train_line(result.time_to_train.model_dump()))
    if explain:
        profiled = api.with_profile(query, result.accelerator, profile, stack)
        for line in api.explain_estimate(result, profiled):
            console.print(line)
        if result.time_to_train is not None:
            for line in api.explain_time_to_train(result.time_to_train):
                console.print(line)
    for path in (html, png):
        if path:
            console.print(f"wrote {path}", markup=False, highlight=False, soft_wrap=True)

"""From the user's plain values to the library's specs: the job, the layout, the
fine-tuning recipe, the search space, the efficiency profile and the training run; the
defaults every command shares."""

from __future__ import annotations

from pydantic import ValidationError

from hwspecs.errors import PlanError, unknown_name_error


def _validated(model_cls, **fields):
    """Build a pydantic model from user values; errors become one-line PlanErrors."""
    from hwspecs.errors import validation_error

    try:
        return model_cls(**fields)
    except ValidationError as error:
        raise validation_error(error) from None


def build_finetune(
    recipe: str = "full",
    lora_rank: int | None = None,
    lora_alpha: float | None = None,
    lora_targets: str | None = None,
    lora_dropout: float | None = None,
    lora_dropout_position: str | None = None,
    adapter_dtype: str | None = None,
    double_quant: bool | None = None,
):
    """A FinetuneSpec from CLI-style values; None for full training (``recipe="full"``)."""
    from planner.spec.finetune import RECIPES, FinetuneSpec

    if recipe not in RECIPES:
        raise unknown_name_error("recipe", recipe, RECIPES)
    options = {
        "lora_rank": lora_rank,
        "lora_alpha": lora_alpha,
        "lora_targets": lora_targets,
        "lora_dropout": lora_dropout,
        "lora_dropout_position": lora_dropout_position,
        "adapter_dtype": adapter_dtype,
        "double_quant": double_quant,
    }
    given = {key: value for key, value in options.items() if value is not None}
    if recipe == "full":
        if given:
            flags = ", ".join("--" + key.replace("_", "-") for key in given)
            verb = "needs" if len(given) == 1 else "need"
            raise PlanError(
                f"{flags} {verb} an adapter recipe (--recipe lora, qlora, dora or vera)"
            )
        return None
    return _validated(FinetuneSpec, recipe=recipe, **given)


def build_job(
    model: str,
    seq_len: int,
    global_batch_tokens: int | None = None,
    global_batch_size: int | None = None,
    precision: str | None = None,
    optimizer: str = "adamw",
    grad_dtype: str | None = None,
    flash_attention: bool = True,
    finetune=None,
    memory_measures: str | None = None,
    weight_pass_memory: str | None = None,
    moe_imbalance: float | None = None,
    moe_capacity_factor: float | None = None,
    ulysses_kv_heads: str | None = None,
    tp_comm_overlap: bool | None = None,
    attention_kernel: str | None = None,
    cross_entropy: str | None = None,
    ep_comm_overlap: bool = False,
    cuda_graphs: bool = False,
):
    """A Job from CLI-style values (batch as tokens or as sequences, not both).

    ``finetune``: a FinetuneSpec (:func:`build_finetune`), or None for full training.
    ``precision`` and ``memory_measures`` default to the model's published training
    recipe (``training_precision``, ``training_memory_measures``), else bf16-mixed and none.
    ``weight_pass_memory``: what zero-bubble schedules keep from B to W
    (:mod:`planner.cost.weight_pass`). ``moe_imbalance`` / ``moe_capacity_factor``: override the
    model's routing load (:meth:`planner.spec.model.ModelSpec.routed_load_factor`).
    ``ulysses_kv_heads``: ``whole`` (default) or ``replicate`` (:class:`planner.spec.job.Job`).
    ``tp_comm_overlap``: the stack overlaps TP communication (None: the stack's default,
    :func:`with_profile`). ``ep_comm_overlap``: Megatron-Core's combined 1F1B hides EP
    all-to-alls; ``cuda_graphs``: the layers replay from CUDA graphs, no per-kernel
    launch (:class:`planner.spec.job.Job`). ``attention_kernel``: the stack's fused attention kernel (None:
    the accelerator's default rates). ``cross_entropy``: ``unfused`` (default) or ``fused``,
    the loss kernel (:class:`planner.spec.job.Job`).
    """
    from planner.spec.job import Job
    from planner.spec.measures import memory_measures as measures_named
    from planner.spec.model import ModelSpec, load_model
    from planner.spec.precision import PrecisionSpec

    spec_model = load_model(model)
    routing = {
        name: value
        for name, value in (("moe_imbalance", moe_imbalance),
                            ("moe_capacity_factor", moe_capacity_factor))
        if value is not None
    }  # fmt: skip
    if routing:
        if not spec_model.is_moe:
            flags = ", ".join("--" + name.replace("_", "-") for name in routing)
            raise PlanError(f"{flags}: {spec_model.name} is not a mixture-of-experts model")
        spec_model = _validated(ModelSpec, **{**spec_model.model_dump(), **routing})
    precision = precision or spec_model.training_precision or "bf16-mixed"
    memory_measures = memory_measures or spec_model.training_memory_measures or "none"

    if global_batch_tokens is not None and global_batch_size is not None:
        raise PlanError("give the global batch as tokens or as sequences, not both")
    if global_batch_size is not None:
        if global_batch_size < 1:
            raise PlanError(f"global_batch_size must be positive, got {global_batch_size}")
        global_batch_tokens = global_batch_size * seq_len
    spec = _validated(PrecisionSpec, recipe=precision, optimizer=optimizer, grad_dtype=grad_dtype)
    return _validated(
        Job,
        model=spec_model,
        seq_len=seq_len,
        global_batch_tokens=global_batch_tokens,
        precision=spec,
        flash_attention=flash_attention,
        finetune=finetune,
        memory_measures=measures_named(memory_measures),
        weight_pass_memory=weight_pass_memory or "inputs",
        ulysses_kv_heads=ulysses_kv_heads or "whole",
        tp_comm_overlap=tp_comm_overlap,
        ep_comm_overlap=ep_comm_overlap,
        cuda_graphs=cuda_graphs,
        attention_kernel=attention_kernel,
        cross_entropy=cross_entropy or "unfused",
    )


def build_layout(**fields):
    """A Layout from CLI-style values; unknown schedules and illegal vpp are rejected here.

    ``vpp=None`` takes the schedule's default (2 for the V-shape schedules and interleaved).
    """
    from planner.pipeline.schedules import SCHEDULES
    from planner.spec.layout import Layout

    schedule = fields.get("schedule", "1f1b")
    if schedule not in SCHEDULES:
        raise unknown_name_error("schedule", schedule, SCHEDULES)
    if fields.get("vpp") is None:
        fields["vpp"] = SCHEDULES[schedule].default_vpp
    layout = _validated(Layout, **fields)
    SCHEDULES[schedule].resolve_vpp(layout.vpp)
    return layout


def _checked_headroom(mem_headroom: float | None) -> float:
    """The user's headroom, or the one default every command shares."""
    if mem_headroom is None:
        from planner.cost.memory import DEFAULT_MEM_HEADROOM

        return DEFAULT_MEM_HEADROOM
    if not 0 <= mem_headroom < 1:
        raise PlanError(f"--mem-headroom must be in [0, 1), got {mem_headroom}")
    return mem_headroom


#: `llmplan plan` with no arguments: Llama 3 405B on 16,384 H100s of Meta's RoCE cluster.
DEFAULT_PLAN = {
    "model": "llama3-405b",
    "cluster": "llama3-h100-24k",
    "gpus": 16384,
    "seq_len": 8192,
    "global_batch_tokens": 16 * 2**20,
}


def with_profile(job, accelerator: str, profile: str | None, stack: str | None = None):
    """``job`` under an efficiency profile: ``none`` / None the ideal model; ``auto`` the
    shipped profile of ``accelerator`` for ``stack`` (else its all-stack one, else the
    nearest generation's, else the ideal model); ``shipped`` the same but an error where
    there is none; else a profile name or TOML path. A job that does not say whether its
    stack overlaps TP communication (``tp_comm_overlap`` None) takes ``stack``'s default on
    ``accelerator`` (:func:`planner.spec.stack.default_tp_comm_overlap`: JAX's is on on a
    TPU), and one that names no attention kernel the one ``stack`` runs on ``accelerator``
    (:func:`planner.spec.stack.stack_attention_kernel`); its memory measures gain what the
    stack's kernels do anyway (:func:`planner.spec.stack.stack_memory_measures`)."""
    from hwspecs.catalog import load_accelerator
    from planner.runs.profiles import STACKS, profile_for
    from planner.spec.stack import (
        default_tp_comm_overlap,
        stack_attention_kernel,
        stack_memory_measures,
    )

    if stack is not None and stack not in STACKS:
        raise unknown_name_error("stack", stack, STACKS)
    measures = stack_memory_measures(stack, job.memory_measures)
    if measures != job.memory_measures:
        job = job.model_copy(update={"memory_measures": measures})
    chip = load_accelerator(accelerator)
    if job.tp_comm_overlap is None:
        overlap = default_tp_comm_overlap(stack, chip.kind)
        job = job.model_copy(update={"tp_comm_overlap": overlap})
    if job.attention_kernel is None and stack is not None:
        measured = chip.attention_kernels
        kernel = stack_attention_kernel(stack, measured)
        if kernel is not None:
            job = job.model_copy(update={"attention_kernel": kernel})
    if profile in (None, "none"):
        return job
    shipped = profile in ("auto", "shipped")
    chosen = profile_for(accelerator, None if shipped else profile, stack)
    if chosen is None and profile == "shipped":
        raise PlanError(f"--profile shipped: no profile for {accelerator} or its generation")
    return job if chosen is None else job.model_copy(update={"efficiency_profile": chosen})


def build_training(cluster: str, train_tokens, gpu_hour_cost: float | None = None):
    """A :class:`planner.cost.goodput.TrainingRun` for ``cluster``: the token budget
    (``15T``, ``2e12``), the accelerator's interruption rate per GPU-hour, the cluster's
    storage bandwidth and restart time, the PUE and TDP, each with its source; ``notes``
    names every default in use."""
    from hwspecs.catalog import load_accelerator, load_cluster, load_reliability
    from planner.cost.goodput import TrainingRun, parse_token_count

    tokens = parse_token_count(train_tokens)
    if gpu_hour_cost is not None and not (gpu_hour_cost >= 0 and gpu_hour_cost < float("inf")):
        raise PlanError(f"--gpu-hour-cost must be a non-negative number, got {gpu_hour_cost}")
    spec = load_cluster(cluster)
    accelerator = load_accelerator(spec.accelerator)
    figures = load_reliability()
    notes, sources = [], {}
    key = accelerator.id if accelerator.id in figures.interruptions else None
    if key is None:
        key = figures.default_interruptions
        notes.append(
            f"interruption rate: no published count for {accelerator.id}; using {key}'s (default)"
        )
    sources["interruptions_per_gpu_hour"] = figures.source_of(f"interruptions.{key}")
    if spec.storage_bytes_per_s is not None:
        storage = spec.storage_bytes_per_s
        sources["storage_bytes_per_s"] = spec.source_of("storage_bytes_per_s")
    else:
        storage = figures.storage_bytes_per_s_per_gpu * spec.num_gpus
        sources["storage_bytes_per_s"] = figures.source_of("storage_bytes_per_s_per_gpu")
        notes.append(
            f"storage bandwidth: {spec.id} sets none; default "
            f"{figures.storage_bytes_per_s_per_gpu / 1e6:.1f} MB/s per GPU × "
            f"{spec.num_gpus:,} GPUs"
        )
    if spec.restart_time_s is not None:
        restart = spec.restart_time_s
        sources["restart_time_s"] = spec.source_of("restart_time_s")
    else:
        restart = figures.restart_time_s
        sources["restart_time_s"] = figures.source_of("restart_time_s")
        notes.append(f"restart time: {spec.id} sets none; default {restart:.0f} s")
    sources["power_usage_effectiveness"] = figures.source_of("power_usage_effectiveness")
    if accelerator.tdp_w is not None:
        sources["tdp_w"] = accelerator.source_of("tdp_w")
    return _validated(
        TrainingRun,
        train_tokens=tokens,
        gpu_hour_cost=gpu_hour_cost,
        interruptions_per_gpu_hour=figures.interruptions[key].per_gpu_hour(),
        storage_bytes_per_s=storage,
        restart_time_s=restart,
        power_usage_effectiveness=figures.power_usage_effectiveness,
        tdp_w=accelerator.tdp_w,
        sources=sources,
        notes=notes,
    )


def build_search_space(allow_cross_node_tp: bool = False, **pins):
    """The SearchSpace of the knobs the user pinned (lists of values); the rest search all.

    ``pins``: any of ``tp cp pp dp ep etp vpp micro_batch_size schedule zero_stage recompute``
    as lists, ``sequence_parallel`` as one bool. Unknown schedules and recompute modes are
    rejected by name.
    """
    from planner.candidates import SearchSpace
    from planner.pipeline.schedules import SCHEDULES

    fields = {key: values for key, values in pins.items() if values is not None}
    for name in fields.get("schedule", []):
        if name not in SCHEDULES:
            raise unknown_name_error("schedule", name, SCHEDULES)
    if "sequence_parallel" in fields and not isinstance(fields["sequence_parallel"], list):
        fields["sequence_parallel"] = [fields["sequence_parallel"]]
    return _validated(SearchSpace, **fields, allow_cross_node_tp=allow_cross_node_tp)

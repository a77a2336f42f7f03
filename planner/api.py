"""The library API under the CLI: each command calls one function here.

Functions take plain values (names, numbers), build the pydantic specs, call the cost
model and return pydantic results whose ``model_dump()`` is the command's JSON.
"""

from __future__ import annotations

from pydantic import BaseModel, ValidationError

from hwspecs.errors import PlanError, unknown_name_error
from planner.cost.goodput import explain_time_to_train  # noqa: F401 (CLI)
from planner.explain import explain_estimate, explain_plan  # noqa: F401 (CLI)

CATALOG_KINDS = ("models", "accelerators", "clusters", "links")


def _validated(model_cls, **fields):
    """Build a pydantic model from user values; errors become one-line PlanErrors."""
    from hwspecs.errors import validation_error

    try:
        return model_cls(**fields)
    except ValidationError as error:
        raise validation_error(error) from None


# ----- catalog --------------------------------------------------------------------------


def catalog_names(kind: str) -> list[str]:
    """Catalog slugs of one kind: models, accelerators, clusters or links."""
    from hwspecs import catalog
    from planner.spec.model import catalog_model_names

    if kind == "models":
        return catalog_model_names()
    if kind in ("accelerators", "clusters", "links"):
        return catalog.catalog_names(kind.rstrip("s"))
    raise PlanError(f"unknown catalog kind '{kind}'; choose one of: {', '.join(CATALOG_KINDS)}")


def list_catalog(kind: str | None = None) -> dict[str, list[str]]:
    """``{kind: [names]}`` for one kind or all of them."""
    kinds = [kind] if kind else list(CATALOG_KINDS)
    return {name: catalog_names(name) for name in kinds}


#: ``catalog show KIND:NAME`` / ``--kind``: the singular kind names a user types.
CATALOG_KIND_NAMES = {
    "model": "models",
    "accelerator": "accelerators",
    "cluster": "clusters",
    "link": "links",
}


def catalog_kinds_of(name: str) -> list[str]:
    """The catalog kinds (singular) that hold an entry called ``name``."""
    return [kind for kind, plural in CATALOG_KIND_NAMES.items() if name in catalog_names(plural)]


def show_catalog(name: str, kind: str | None = None) -> dict:
    """One catalog entry as JSON-ready data; models gain ``num_params`` and ``num_active_params``.

    A name that is more than one kind (``mi300x``: an accelerator and a cluster) resolves to
    the first of model, accelerator, cluster, link unless ``kind`` (or ``kind:name``) says.
    """
    from hwspecs import catalog
    from planner.spec.model import load_model

    if kind is None and ":" in name:
        kind, name = name.split(":", 1)
    if kind is not None:
        if kind not in CATALOG_KIND_NAMES:
            raise PlanError(
                f"unknown catalog kind '{kind}'; choose one of: {', '.join(CATALOG_KIND_NAMES)}"
            )
        if name not in catalog_names(CATALOG_KIND_NAMES[kind]):
            raise unknown_name_error(kind, name, catalog_names(CATALOG_KIND_NAMES[kind]))
    if kind in (None, "model") and name in catalog_names("models"):
        model = load_model(name)
        return {
            "kind": "model",
            **model.model_dump(),
            "num_params": model.num_params(),
            "num_active_params": model.num_active_params(),
            "num_params_with_mtp": model.num_params(include_mtp=True),
        }
    loaders = {
        "accelerators": ("accelerator", catalog.load_accelerator),
        "clusters": ("cluster", catalog.load_cluster),
        "links": ("link", catalog.load_link),
    }
    for plural, (label, loader) in loaders.items():
        if kind in (None, plural.rstrip("s")) and name in catalog_names(plural):
            return {"kind": label, **loader(name).model_dump()}
    everything = [entry for kind in CATALOG_KINDS for entry in catalog_names(kind)]
    raise unknown_name_error("catalog entry", name, everything)


# ----- bytes per parameter --------------------------------------------------------------


class BytesPerParamReport(BaseModel):
    """Model-state bytes per parameter on one data-parallel rank.

    Under a fine-tuning recipe every figure is per parameter of the *base* model, and
    ``recipe_breakdown`` splits the same total into base weights, quantization constants and
    the adapters' weights, gradients, master weights and optimizer states (``breakdown``
    keeps its four parts: weights = base + constants + adapter weights, and so on).
    """

    bytes_per_param: float
    breakdown: dict[str, float]
    precision: str
    optimizer: str
    grad_dtype: str
    master_dtype: str
    optimizer_state_dtype: str
    zero_stage: int
    dp: int
    model: str | None = None
    num_params: int | None = None
    total_bytes: float | None = None
    recipe: str = "full"
    num_trainable_params: int | None = None
    recipe_breakdown: dict[str, float] | None = None
    finetune: dict | None = None


def build_finetune(
    recipe: str = "full",
    lora_rank: int | None = None,
    lora_alpha: float | None = None,
    lora_targets: str | None = None,
    lora_dropout: float | None = None,
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


def _recipe_bytes_per_param(spec_model, finetune, precision, zero_stage: int, dp: int) -> dict:
    """Report fields of an adapter recipe: bytes per base-model parameter, split both ways."""
    from planner.cost.adapters import model_state_bytes
    from planner.spec.finetune import num_adapter_params

    if spec_model is None:
        raise PlanError(
            f"--recipe {finetune.recipe} needs --model: adapter sizes depend on the model's shapes"
        )
    parts = model_state_bytes(spec_model, finetune, precision, zero_stage, dp)
    num_params = spec_model.num_params()
    per_param = {key: value / num_params for key, value in parts.model_dump().items()}
    return {
        "bytes_per_param": parts.total / num_params,
        "breakdown": {key: value / num_params for key, value in parts.memory_parts().items()},
        "total_bytes": parts.total,
        "recipe": finetune.recipe,
        "num_trainable_params": num_adapter_params(spec_model, finetune),
        "recipe_breakdown": per_param,
        "finetune": finetune.model_dump(),
    }


def bytes_per_param(
    precision: str = "bf16-mixed",
    optimizer: str = "adamw",
    grad_dtype: str | None = None,
    master_dtype: str | None = None,
    optimizer_state_dtype: str | None = None,
    zero_stage: int = 0,
    dp: int = 1,
    model: str | None = None,
    finetune=None,
) -> BytesPerParamReport:
    """Bytes per parameter for a recipe; with ``model``, also its total over all parameters.

    Optimizers whose state depends on tensor shapes (Muon, Adafactor) use the model's
    shapes when a model is given, else the large-matrix figure. ``finetune`` (a
    FinetuneSpec, see :func:`build_finetune`) needs ``model``: frozen base, adapters trained.
    """
    from planner.spec.model import load_model
    from planner.spec.precision import (
        PrecisionSpec,
        optimizer_states_per_param,
        sharded_bytes_per_param,
    )

    spec = _validated(
        PrecisionSpec,
        recipe=precision,
        optimizer=optimizer,
        grad_dtype=grad_dtype,
        master_dtype=master_dtype,
        optimizer_state_dtype=optimizer_state_dtype,
    )
    if dp < 1:
        raise PlanError(f"dp must be a positive integer, got {dp}")
    spec_model = load_model(model) if model else None
    states = optimizer_states_per_param(optimizer, spec_model) if spec_model else None
    parts = sharded_bytes_per_param(spec, zero_stage, dp, states)
    num_params = spec_model.num_params() if spec_model else None
    recipe = {}
    if finetune is not None and finetune.trains_adapters:
        recipe = _recipe_bytes_per_param(spec_model, finetune, spec, zero_stage, dp)
    fields = {
        "bytes_per_param": parts.total,
        "breakdown": parts.model_dump(),
        "total_bytes": parts.total * num_params if num_params else None,
        **recipe,
    }
    return BytesPerParamReport(
        **fields,
        precision=spec.recipe,
        optimizer=spec.optimizer,
        grad_dtype=spec.gradient_dtype,
        master_dtype=spec.master_weight_dtype,
        optimizer_state_dtype=spec.state_dtype,
        zero_stage=zero_stage,
        dp=dp,
        model=spec_model.name if spec_model else None,
        num_params=num_params,
    )


# ----- memory ---------------------------------------------------------------------------


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
):
    """A Job from CLI-style values (batch as tokens or as sequences, not both).

    ``finetune``: a FinetuneSpec (:func:`build_finetune`), or None for full training.
    ``precision`` and ``memory_measures`` default to the model's published training
    recipe (``training_precision``, ``training_memory_measures``), else bf16-mixed and none.
    ``weight_pass_memory``: what zero-bubble schedules keep from B to W
    (:mod:`planner.cost.weight_pass`). ``moe_imbalance`` / ``moe_capacity_factor``: override the
    model's routing load (:meth:`planner.spec.model.ModelSpec.routed_load_factor`).
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


def memory(job, layout, accelerator: str | None = None, mem_headroom: float | None = None):
    """Memory per GPU for ``job`` under ``layout`` (see :func:`planner.memory_report.memory_report`)."""
    from hwspecs.catalog import load_accelerator
    from planner.memory_report import memory_report

    spec = load_accelerator(accelerator) if accelerator else None
    return memory_report(job, layout, spec, _checked_headroom(mem_headroom))


# ----- communication and topology -------------------------------------------------------


def collective(
    op: str,
    num_bytes,
    ranks: int,
    cluster: str,
    algorithm: str | None = None,
    gpus: int | None = None,
):
    """One collective on one cluster: time, algorithm and bus bandwidth."""
    from hwspecs.catalog import load_cluster
    from planner.comm.collectives import collective_time, parse_num_bytes

    return collective_time(
        op, parse_num_bytes(num_bytes), ranks, load_cluster(cluster), algorithm=algorithm, gpus=gpus
    )


def comm(job, layout, cluster: str, order: str | None = None, gpus: int | None = None):
    """Per-axis communication of ``job`` under ``layout`` on ``cluster``: raw time, and the
    time exposed behind the compute the columns model gives this layout (the estimate's)."""
    from hwspecs.catalog import load_accelerator, load_cluster
    from planner.comm.report import ComputeTimes, axis_traffic
    from planner.comm.topology import resolve_order
    from planner.estimate import layout_columns
    from planner.evaluate import evaluate_columns
    from planner.spec.layout import DEFAULT_MESH_ORDER
    from planner.spec.rules import check_layout

    check_layout(layout, job.model, job.seq_len)
    mesh = resolve_order(order) if order else DEFAULT_MESH_ORDER
    spec = load_cluster(cluster)
    m = layout.resolved_num_microbatches(job.global_batch_size)
    row = evaluate_columns(
        job, spec, load_accelerator(spec.accelerator), layout_columns(layout, m), order=mesh
    )
    compute = ComputeTimes(  # the busiest rank's, per micro-batch, as the estimate times it
        forward_s=float(row["forward_s"][0]),
        backward_s=float(
            row["input_grad_s"][0] + row["recompute_per_microbatch_s"][0] + row["weight_grad_s"][0]
        ),
    )
    return axis_traffic(
        job, layout, spec, order=mesh, gpus=gpus or layout.num_gpus, compute=compute
    )


def topology(
    cluster: str, sizes: dict[str, int], order: str | None = None, gpus: int | None = None
):
    """Rank placement of each axis on ``cluster`` and the links each group crosses."""
    from hwspecs.catalog import load_cluster
    from planner.comm.topology import resolve_order, topology_report
    from planner.spec.layout import DEFAULT_MESH_ORDER

    mesh = resolve_order(order) if order else DEFAULT_MESH_ORDER
    return topology_report(load_cluster(cluster), sizes, order=mesh, gpus=gpus)


# ----- pipeline schedules ---------------------------------------------------------------


def schedule(
    name: str,
    pp: int,
    num_microbatches: int,
    vpp: int | None = None,
    f: float = 1.0,
    b: float = 1.0,
    w: float = 1.0,
    comm: float = 0.0,
    overlap_fb: float = 0.0,
    microbatch_group_size: int | None = None,
):
    """Generate and simulate one schedule with uniform stages (durations per rank per micro-batch)."""
    from planner.pipeline.report import schedule_report
    from planner.pipeline.schedules import SCHEDULES

    if name not in SCHEDULES:
        raise unknown_name_error("schedule", name, SCHEDULES)
    for label, value in (("f", f), ("b", b), ("w", w)):
        if value < 0:
            raise PlanError(f"--{label} must be ≥ 0, got {value}")
    if comm < 0:
        raise PlanError(f"--comm must be ≥ 0, got {comm}")
    if not 0 <= overlap_fb <= 1:
        raise PlanError(f"--overlap-fb must be in [0, 1], got {overlap_fb}")
    options = {"microbatch_group_size": microbatch_group_size} if microbatch_group_size else {}
    if options and name != "interleaved-1f1b":
        raise PlanError("--microbatch-group-size applies only to interleaved-1f1b")
    return schedule_report(name, pp, num_microbatches, vpp, f, b, w, comm, overlap_fb, **options)


# ----- estimate and plan ----------------------------------------------------------------

#: `llmplan plan` with no arguments: Llama 3 405B on 16,384 H100s of Meta's RoCE cluster.
DEFAULT_PLAN = {
    "model": "llama3-405b",
    "cluster": "llama3-h100-24k",
    "gpus": 16384,
    "seq_len": 8192,
    "global_batch_tokens": 16 * 2**20,
}


def with_profile(job, accelerator: str, profile: str | None):
    """``job`` under an efficiency profile: ``none`` / None the ideal model, ``shipped`` the
    accelerator's own (else the nearest generation's), else a profile name or TOML path."""
    from planner.runs.profiles import profile_for

    if profile in (None, "none"):
        return job
    chosen = profile_for(accelerator, None if profile == "shipped" else profile)
    if chosen is None:
        raise PlanError(f"--profile shipped: no profile for {accelerator} or its generation")
    return job.model_copy(update={"efficiency_profile": chosen})


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


def _with_time_to_train(detail, job, training):
    """``detail`` (an Estimate) with its ``time_to_train`` section for ``training``."""
    from planner.cost.goodput import time_to_train

    section = time_to_train(
        detail.step_time_s,
        detail.checkpoint_bytes_per_rank,
        detail.num_gpus,
        detail.tokens_per_s_per_gpu * detail.num_gpus * detail.step_time_s,
        training,
    )
    return detail.model_copy(update={"time_to_train": section})


def estimate(
    job,
    layout,
    cluster: str,
    gpus: int | None = None,
    mfu_dtype: str = "bf16",
    mem_headroom: float | None = None,
    order: str | None = None,
    profile: str | None = None,
    training=None,
):
    """One layout's predicted step (see :func:`planner.estimate.estimate`); ``profile``: see
    :func:`with_profile`; with ``training`` (:func:`build_training`), its time to train too."""
    mem_headroom = _checked_headroom(mem_headroom)
    from hwspecs.catalog import load_cluster
    from planner.comm.topology import resolve_order
    from planner.estimate import estimate as estimate_layout

    spec = load_cluster(cluster)
    job = with_profile(job, spec.accelerator, profile)
    mesh = resolve_order(order) if order else None
    detail = estimate_layout(job, layout, spec, gpus, mfu_dtype, mem_headroom, order=mesh)
    return detail if training is None else _with_time_to_train(detail, job, training)


def build_search_space(allow_cross_node_tp: bool = False, **pins):
    """The SearchSpace of the knobs the user pinned (lists of values); the rest search all.

    ``pins``: any of ``tp cp pp dp ep etp vpp micro_batch_size schedule zero_stage recompute``
    as lists, ``sequence_parallel`` as one bool. Unknown schedules and recompute modes are
    rejected by name.
    """
    from planner.pipeline.schedules import SCHEDULES
    from planner.search import SearchSpace

    fields = {key: values for key, values in pins.items() if values is not None}
    for name in fields.get("schedule", []):
        if name not in SCHEDULES:
            raise unknown_name_error("schedule", name, SCHEDULES)
    if "sequence_parallel" in fields and not isinstance(fields["sequence_parallel"], list):
        fields["sequence_parallel"] = [fields["sequence_parallel"]]
    return _validated(SearchSpace, **fields, allow_cross_node_tp=allow_cross_node_tp)


class PlanResult(BaseModel):
    """The ranked plan: the query, what was screened, rejections and the top results."""

    query: dict
    candidates_evaluated: int
    feasible: int
    rejected: dict[str, int]
    results: list[dict]
    explanation: list[str] = []


def _time_to_train_ranking(objective: str, results: list[dict]) -> list[str]:
    """Under objective time_to_train: the winner's and runner-up's expected wall times."""
    if objective != "time_to_train" or len(results) < 2:
        return []
    first, second = (entry["time_to_train"] for entry in results[:2])
    return [
        f"ranked by expected wall time of {first['train_tokens']:.4g} tokens, failures included: "
        f"{first['wall_time_days']:.2f} days (goodput {100 * first['goodput']:.1f}%) vs "
        f"{second['wall_time_days']:.2f} days (goodput {100 * second['goodput']:.1f}%) for the "
        f"runner-up"
    ]


def plan(
    job,
    cluster: str,
    gpus: int | None,
    space,
    objective: str = "step_time",
    mem_headroom: float | None = None,
    top: int = 5,
    mfu_dtype: str = "bf16",
    order: str | None = None,
    progress=None,
    refine_top: int | None = None,
    profile: str | None = None,
    training=None,
):
    """Search every layout and return the top ones with their full estimates; also the table.
    ``refine_top``: rows re-timed by the event simulator (default
    :data:`planner.refine.DEFAULT_REFINE_TOP`); ``profile``: see :func:`with_profile`;
    ``training`` (:func:`build_training`) adds each result's time to train and the
    ``expected_wall_time_s`` column; objective ``time_to_train`` ranks by it."""
    from hwspecs.catalog import load_accelerator, load_cluster
    from planner.comm.topology import resolve_order
    from planner.estimate import estimate as estimate_layout
    from planner.search import OBJECTIVES, layout_of_row, search

    objective = objective.replace("-", "_")
    if objective not in OBJECTIVES:
        raise PlanError(f"unknown objective '{objective}'; choose one of: {', '.join(OBJECTIVES)}")
    if objective == "time_to_train" and training is None:
        raise PlanError("--objective time-to-train needs --train-tokens (e.g. 15T or 2e12)")
    mem_headroom = _checked_headroom(mem_headroom)
    spec = load_cluster(cluster)
    gpus = gpus or spec.num_gpus
    if gpus > spec.num_gpus:
        raise PlanError(f"--gpus {gpus} exceeds cluster {spec.id}'s {spec.num_gpus} GPUs")
    accelerator = load_accelerator(spec.accelerator)
    job = with_profile(job, spec.accelerator, profile)
    mesh = resolve_order(order) if order else None
    from planner.refine import DEFAULT_REFINE_TOP

    if refine_top is not None and refine_top < 0:
        raise PlanError(f"--refine-top must be ≥ 0, got {refine_top}")
    found = search(
        job, spec, accelerator, gpus, space, objective, mem_headroom, mesh, mfu_dtype, progress,
        DEFAULT_REFINE_TOP if refine_top is None else refine_top,
        training=training,
    )  # fmt: skip
    results = []
    for rank, row in enumerate(found.table.head(top).to_dict("records"), start=1):
        layout = layout_of_row(row, job.model.is_moe)
        detail = estimate_layout(job, layout, spec, gpus, mfu_dtype, mem_headroom, order=mesh)
        if training is not None:
            detail = _with_time_to_train(detail, job, training)
        entry = detail.model_dump(mode="json")
        entry["layout"]["num_microbatches"] = layout.num_microbatches
        simulated = row["step_time_simulated_s"] == row["step_time_simulated_s"]  # not NaN
        entry["simulated"] = (  # the event simulator's pipeline, stage by stage
            {
                "pipeline_time_closed_form_s": float(row["pipeline_time_s"]),
                "pipeline_time_simulated_s": float(row["pipeline_time_simulated_s"]),
                "step_time_simulated_s": float(row["step_time_simulated_s"]),
            }
            if simulated
            else None
        )
        results.append({"rank": rank, **entry})
    query = {
        "model": job.model.name,
        "cluster": spec.id,
        "gpus": gpus,
        "seq_len": job.seq_len,
        "global_batch_tokens": job.global_batch_tokens,
        "objective": objective,
        "mem_headroom": mem_headroom,
        "precision": job.precision.recipe,
        "optimizer": job.precision.optimizer,
        "recipe": job.finetune.recipe if job.finetune is not None else "full",
        "finetune": job.finetune.model_dump() if job.finetune is not None else None,
        "space": space.model_dump() if space else None,
    }
    if training is not None:
        query["training"] = training.model_dump()
    if job.model.is_moe:  # the routing load the plan assumed
        query["moe_imbalance"] = job.model.moe_imbalance
        query["moe_capacity_factor"] = job.model.moe_capacity_factor
    if not results:
        from planner.explain import infeasible_reasons

        headline, reasons = infeasible_reasons(
            found, accelerator, mem_headroom, gpus, spec.num_gpus
        )
        error = PlanError(headline, field="gpus" if found.smallest_memory else None)
        error.reasons = reasons
        raise error
    result = PlanResult(
        query=query,
        candidates_evaluated=found.candidates_evaluated,
        feasible=found.feasible,
        rejected=found.rejected,
        results=results,
        explanation=_time_to_train_ranking(objective, results)
        + explain_plan(found, results, accelerator, mem_headroom),
    )
    return result, found.table


# ----- published runs -------------------------------------------------------------------


def runs_check(
    runs: list[str] | None = None,
    source: str | None = None,
    accelerator: str | None = None,
    profile: str | None = None,
    limit: int | None = None,
    cluster: str | None = None,
):
    """Predict published runs with their layouts pinned; the error per source, accelerator
    and precision (see :mod:`planner.runs.check`).

    ``runs``: files or the shipped catalog (default: ``train``); ``source`` / ``accelerator``:
    keep rows whose source contains / accelerator is it; ``profile``: ``none`` (the ideal
    model), a profile TOML path, or None for each accelerator's shipped profile; ``limit``:
    the first rows only (a quick sample); ``cluster``: the catalog cluster the rows that name
    none ran on (else each accelerator's reference cluster).
    """
    from hwspecs.catalog import load_runs
    from planner.runs.check import predict_row, summarize
    from planner.runs.profiles import profile_for
    from planner.runs.rows import stack_label

    names = runs or ["train"]
    rows = [row for name in names for row in load_runs(name)]
    if source:
        rows = [row for row in rows if source.lower() in row.source.lower()]
    if accelerator:
        rows = [row for row in rows if row.hardware.accelerator == accelerator]
    if limit:
        rows = rows[:limit]
    if not rows:
        raise PlanError("no runs match --source / --accelerator")
    if cluster:
        rows = [
            row if row.hardware.cluster else
            row.model_copy(update={"hardware": row.hardware.model_copy(update={"cluster": cluster})})
            for row in rows
        ]  # fmt: skip
    predictions = [
        predict_row(row, profile_for(row.hardware.accelerator, profile, stack_label(row)))
        for row in rows
    ]
    return summarize(predictions, ", ".join(names), profile or "shipped")


class FitReport(BaseModel):
    """``llmplan fit``: the fitted profile, its errors and the profile file's text."""

    fit: dict
    #: Rows left out because an ``exclude`` file lists them (test targets are never fitted on).
    excluded_rows: int
    uncovered: dict[str, int]
    profile_toml: str


def fit(
    runs: list[str] | None,
    accelerator: str,
    stack: str | None = None,
    command: str = "llmplan fit",
    exclude: list[str] | None = None,
) -> FitReport:
    """Fit ``accelerator``'s efficiency profile on runs (default: the shipped ``train``
    catalog). Rows listed in the ``exclude`` files (e.g. the test targets) are dropped and
    counted; the shipped catalog holds no target row."""
    import datetime

    from hwspecs.catalog import load_runs
    from planner.runs.check import predict_row
    from planner.runs.fit import fit_profile, profile_toml
    from planner.runs.rows import stack_label

    left_out = {row.id for name in (exclude or []) for row in load_runs(name)}
    rows = [row for name in (runs or ["train"]) for row in load_runs(name)]
    rows = [row for row in rows if row.hardware.accelerator == accelerator]
    if stack:
        rows = [row for row in rows if stack_label(row) == stack]
    excluded = sum(row.id in left_out for row in rows)
    rows = [row for row in rows if row.id not in left_out]
    predictions = [predict_row(row) for row in rows]
    covered = [p for p in predictions if p.covered]
    uncovered: dict[str, int] = {}
    for p in predictions:
        if not p.covered:
            uncovered[p.reason] = uncovered.get(p.reason, 0) + 1
    if len(covered) < 8:
        raise PlanError(
            f"--accelerator {accelerator}: {len(covered)} runs the model covers; a fit needs ≥ 8"
        )
    result = fit_profile(covered, accelerator, stack)
    date = datetime.date.today().isoformat()
    return FitReport(
        fit=result.model_dump(),
        excluded_rows=excluded,
        uncovered=uncovered,
        profile_toml=profile_toml(result, command, date),
    )


# ----- types and functions the front ends use, imported on first use -------------------

#: name → module: ``from planner.api import Layout`` imports :mod:`planner.spec.layout` then.
_EXPORTS = {
    "Job": "planner.spec.job",
    "Layout": "planner.spec.layout",
    "check_layout": "planner.spec.rules",
    "layers_per_virtual_stage": "planner.spec.layout",
    "virtual_stage_ranks": "planner.spec.layout",
    "ModelSpec": "planner.spec.model",
    "PrecisionSpec": "planner.spec.precision",
    "axis_traffic": "planner.comm.report",
    "estimate_layout": "planner.estimate",
    "memory_report": "planner.memory_report",
    "p2p_time": "planner.pipeline.simulate",
    "simulate": "planner.pipeline.simulate",
    "schedule_report": "planner.pipeline.report",
    "ScheduleReport": "planner.pipeline.report",
    "generate_schedule": "planner.pipeline.schedules.registry",
    "SCHEDULES": "planner.pipeline.schedules.registry",
    "SearchSpace": "planner.search",
    "TopologyReport": "planner.comm.topology",
    "FLASH_BACKWARD_FLOPS_RATIO": "planner.cost.compute",
    "attention_core_ops": "planner.cost.flops",
    "TimeToTrain": "planner.cost.goodput",
    "TRAINER_ETP": "planner.handoff",
    "TRAINER_NAMES": "planner.handoff",
    "COUNT_EXAMPLES": "planner.spec.units",
    "parse_count": "planner.spec.units",
    "parse_bytes": "planner.spec.units",
}


def __getattr__(name: str):
    """The front ends' types and functions (PEP 562), so the CLI starts without importing them."""
    if name not in _EXPORTS:
        raise AttributeError(f"module 'planner.api' has no attribute {name!r}")
    import importlib

    module = importlib.import_module(_EXPORTS[name])
    attribute = "estimate" if name == "estimate_layout" else name
    return getattr(module, attribute)


# ----- scaling sweep --------------------------------------------------------------------

SWEEP_QUANTITIES = ("gpus", "seq_len")


class SweepPoint(BaseModel):
    """The best layout at one value of the swept quantity (None figures: nothing fits)."""

    value: int
    gpus: int
    seq_len: int
    feasible: int
    layout: dict | None = None
    step_time_s: float | None = None
    mfu: float | None = None
    tokens_per_s_per_gpu: float | None = None
    cluster_tokens_per_s: float | None = None
    time_to_train: dict | None = None


class SweepResult(BaseModel):
    """The plan's winner at each point of a sweep of ``quantity``."""

    quantity: str
    query: dict
    points: list[SweepPoint]


def sweep(
    job_fields: dict,
    cluster: str,
    quantity: str,
    values: list[int],
    gpus: int | None = None,
    space=None,
    objective: str = "step_time",
    mem_headroom: float = 0.05,
    training=None,
) -> SweepResult:
    """Run :func:`plan` at each value of ``quantity`` (``gpus`` or ``seq_len``) and keep
    the winner: where scaling stops paying shows in step time, MFU, days and goodput.

    ``job_fields``: :func:`build_job`'s arguments (``seq_len`` is replaced when swept)."""
    from hwspecs.catalog import load_cluster
    from planner.search import SearchSpace

    if quantity not in SWEEP_QUANTITIES:
        raise unknown_name_error("sweep quantity", quantity, SWEEP_QUANTITIES)
    if not values:
        raise PlanError(f"--{quantity.replace('_', '-')}: give at least one value to sweep")
    space = space or SearchSpace()
    points = []
    for value in values:
        fields = {**job_fields, "seq_len": value} if quantity == "seq_len" else job_fields
        job = build_job(**fields)
        point_gpus = value if quantity == "gpus" else gpus
        try:
            result, _ = plan(
                job, cluster, point_gpus, space, objective, mem_headroom, top=1, training=training
            )
        except PlanError as error:  # nothing fits at this point: the sweep goes on
            if getattr(error, "reasons", None) is None:
                raise
            gpus_here = point_gpus or load_cluster(cluster).num_gpus
            points.append(SweepPoint(value=value, gpus=gpus_here, seq_len=job.seq_len, feasible=0))
            continue
        point = {
            "value": value,
            "gpus": result.query["gpus"],
            "seq_len": job.seq_len,
            "feasible": result.feasible,
        }
        if result.results:
            best = result.results[0]
            point |= {
                "layout": best["layout"],
                "step_time_s": best["step_time_s"],
                "mfu": best["mfu"],
                "tokens_per_s_per_gpu": best["tokens_per_s_per_gpu"],
                "cluster_tokens_per_s": best["tokens_per_s_per_gpu"] * best["num_gpus"],
                "time_to_train": best.get("time_to_train"),
            }
        points.append(SweepPoint(**point))
    query = {
        "model": job_fields["model"],
        "cluster": cluster,
        "objective": objective,
        "values": values,
        "training": training.model_dump() if training is not None else None,
    }
    return SweepResult(quantity=quantity, query=query, points=points)


def plan_page_sample(table):
    """The rows a plan page draws: the Pareto front and a grid sample of the feasible cloud.

    ``table`` is :func:`plan`'s table (ranked, feasible rows); see :mod:`planner.results`.
    """
    from planner.results import page_sample

    return page_sample(table["step_time_s"].to_numpy(), table["memory_per_gpu_bytes"].to_numpy())


def emit_settings(entry: dict, trainer: str, job):
    """A plan result's layout as ``trainer``'s settings (see :mod:`planner.handoff`)."""
    from planner.handoff import emit_settings as emit
    from planner.spec.layout import layers_per_virtual_stage

    lay = entry["layout"]
    split = lay.get("pipeline_layer_split", "auto")
    layers = layers_per_virtual_stage(job.model.num_layers, lay["pp"], lay["vpp"], split)
    return emit(entry, trainer, job, [int(count) for count in layers])


def trainer_schedules(trainer: str, pinned: list[str] | None) -> list[str]:
    """The schedules a search for ``trainer`` may use (see :mod:`planner.handoff`)."""
    from planner.handoff import trainer_schedules as schedules

    return schedules(trainer, pinned)


def layout_warnings(layout, cluster: str) -> list[str]:
    """What a search would have rejected in a layout a user gave by hand (it still runs).

    The same rule as the search's: TP beyond the cluster's scale-up (NVLink) domain.
    """
    from hwspecs.catalog import load_cluster

    spec = load_cluster(cluster)
    warnings = []
    if layout.tp > spec.scale_up_domain_size:
        warnings.append(
            f"tp {layout.tp} crosses the {spec.scale_up_domain_size}-GPU scale-up domain of "
            f"{spec.id}: its all-reduces run over the scale-out network (plan rejects this "
            "unless --allow-cross-node-tp)"
        )
    return warnings

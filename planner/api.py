"""The library API under the CLI: each command calls one function here.

Functions take plain values (names, numbers), build the pydantic specs, call the cost
model and return pydantic results whose ``model_dump()`` is the command's JSON.
"""

from __future__ import annotations

from pydantic import BaseModel, ValidationError

from planner.errors import PlanError, unknown_name_error
from planner.explain import emit_settings, explain_estimate, explain_plan  # noqa: F401 (CLI)

CATALOG_KINDS = ("models", "accelerators", "clusters", "links")


def _validated(model_cls, **fields):
    """Build a pydantic model from user values; errors become one-line PlanErrors."""
    from planner.errors import validation_error

    try:
        return model_cls(**fields)
    except ValidationError as error:
        raise validation_error(error) from None


# ----- catalog --------------------------------------------------------------------------


def catalog_names(kind: str) -> list[str]:
    """Catalog slugs of one kind: models, accelerators, clusters or links."""
    from hwspecs import catalog
    from planner.model import catalog_model_names

    if kind == "models":
        return catalog_model_names()
    if kind in ("accelerators", "clusters", "links"):
        return catalog.catalog_names(kind.rstrip("s"))
    raise PlanError(f"unknown catalog kind '{kind}'; choose one of: {', '.join(CATALOG_KINDS)}")


def list_catalog(kind: str | None = None) -> dict[str, list[str]]:
    """``{kind: [names]}`` for one kind or all of them."""
    kinds = [kind] if kind else list(CATALOG_KINDS)
    return {name: catalog_names(name) for name in kinds}


def show_catalog(name: str) -> dict:
    """One catalog entry as JSON-ready data; models gain ``num_params`` and ``num_active_params``."""
    from hwspecs import catalog
    from planner.model import load_model

    if name in catalog_names("models"):
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
    for kind, (label, loader) in loaders.items():
        if name in catalog_names(kind):
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
    from planner.finetune import RECIPES, FinetuneSpec

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
    from planner.finetune import num_adapter_params
    from planner.finetune_costs import model_state_bytes

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
    from planner.model import load_model
    from planner.precision import (
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
    (:mod:`planner.weight_pass`). ``moe_imbalance`` / ``moe_capacity_factor``: override the
    model's routing load (:meth:`planner.model.ModelSpec.routed_load_factor`).
    """
    from planner.job import Job
    from planner.measures import memory_measures as measures_named
    from planner.model import ModelSpec, load_model
    from planner.precision import PrecisionSpec

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
    from planner.layout import Layout
    from planner.schedules import SCHEDULES

    schedule = fields.get("schedule", "1f1b")
    if schedule not in SCHEDULES:
        raise unknown_name_error("schedule", schedule, SCHEDULES)
    if fields.get("vpp") is None:
        fields["vpp"] = SCHEDULES[schedule].default_vpp
    layout = _validated(Layout, **fields)
    SCHEDULES[schedule].resolve_vpp(layout.vpp)
    return layout


def memory(job, layout, accelerator: str | None = None):
    """Memory per GPU for ``job`` under ``layout`` (see :func:`planner.memory.memory_report`)."""
    from hwspecs.catalog import load_accelerator
    from planner.memory import memory_report

    spec = load_accelerator(accelerator) if accelerator else None
    return memory_report(job, layout, spec)


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
    from planner.comm import collective_time, parse_num_bytes

    return collective_time(
        op, parse_num_bytes(num_bytes), ranks, load_cluster(cluster), algorithm=algorithm, gpus=gpus
    )


def comm(job, layout, cluster: str, order: str | None = None, gpus: int | None = None):
    """Per-axis communication of ``job`` under ``layout`` on ``cluster`` (raw and exposed)."""
    from hwspecs.catalog import load_cluster
    from planner.layout import DEFAULT_MESH_ORDER, check_layout
    from planner.topology import resolve_order
    from planner.traffic import axis_traffic

    check_layout(layout, job.model, job.seq_len)
    mesh = resolve_order(order) if order else DEFAULT_MESH_ORDER
    return axis_traffic(
        job, layout, load_cluster(cluster), order=mesh, gpus=gpus or layout.num_gpus
    )


def topology(
    cluster: str, sizes: dict[str, int], order: str | None = None, gpus: int | None = None
):
    """Rank placement of each axis on ``cluster`` and the links each group crosses."""
    from hwspecs.catalog import load_cluster
    from planner.layout import DEFAULT_MESH_ORDER
    from planner.topology import resolve_order, topology_report

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
    from planner.pipeline import schedule_report
    from planner.schedules import SCHEDULES

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


def estimate(
    job,
    layout,
    cluster: str,
    gpus: int | None = None,
    mfu_dtype: str = "bf16",
    mem_headroom: float = 0.0,
    order: str | None = None,
):
    """One layout's predicted step (see :func:`planner.estimate.estimate`)."""
    from hwspecs.catalog import load_cluster
    from planner.estimate import estimate as estimate_layout
    from planner.topology import resolve_order

    spec = load_cluster(cluster)
    mesh = resolve_order(order) if order else None
    return estimate_layout(job, layout, spec, gpus, mfu_dtype, mem_headroom, order=mesh)


def build_search_space(allow_cross_node_tp: bool = False, **pins):
    """The SearchSpace of the knobs the user pinned (lists of values); the rest search all.

    ``pins``: any of ``tp cp pp dp ep etp vpp micro_batch_size schedule zero_stage recompute``
    as lists, ``sequence_parallel`` as one bool. Unknown schedules and recompute modes are
    rejected by name.
    """
    from planner.schedules import SCHEDULES
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


def plan(
    job,
    cluster: str,
    gpus: int | None,
    space,
    objective: str = "step_time",
    mem_headroom: float = 0.05,
    top: int = 5,
    mfu_dtype: str = "bf16",
    order: str | None = None,
    progress=None,
):
    """Search every layout and return the top ones with their full estimates; also the table."""
    from hwspecs.catalog import load_accelerator, load_cluster
    from planner.estimate import estimate as estimate_layout
    from planner.layout import Layout
    from planner.search import LAYOUT_COLUMNS, OBJECTIVES, search
    from planner.topology import resolve_order

    if objective not in OBJECTIVES:
        raise PlanError(f"unknown objective '{objective}'; choose one of: {', '.join(OBJECTIVES)}")
    if not 0 <= mem_headroom < 1:
        raise PlanError(f"mem_headroom must be in [0, 1), got {mem_headroom}")
    spec = load_cluster(cluster)
    gpus = gpus or spec.num_gpus
    if gpus > spec.num_gpus:
        raise PlanError(f"--gpus {gpus} exceeds cluster {spec.id}'s {spec.num_gpus} GPUs")
    accelerator = load_accelerator(spec.accelerator)
    mesh = resolve_order(order) if order else None
    found = search(
        job, spec, accelerator, gpus, space, objective, mem_headroom, mesh, mfu_dtype, progress
    )
    results = []
    for rank, row in enumerate(found.table.head(top).itertuples(index=False), start=1):
        fields = {key: getattr(row, key) for key in LAYOUT_COLUMNS if key != "num_microbatches"}
        fields = {
            key: (value.item() if hasattr(value, "item") else value)
            for key, value in fields.items()
        }
        if not job.model.is_moe:  # no routed experts: etp stays unset (tp)
            fields["etp"] = None
        layout = Layout(**fields, num_microbatches=int(row.num_microbatches))
        detail = estimate_layout(job, layout, spec, gpus, mfu_dtype, mem_headroom, order=mesh)
        entry = detail.model_dump(mode="json")
        entry["layout"]["num_microbatches"] = int(row.num_microbatches)
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
        explanation=explain_plan(found, results, accelerator, mem_headroom),
    )
    return result, found.table

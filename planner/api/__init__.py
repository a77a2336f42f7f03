"""The library API under the CLI: each command calls one function here.

Functions take plain values (names, numbers), build the pydantic specs, call the cost
model and return pydantic results whose ``model_dump()`` is the command's JSON.

The surface is split by what it serves (:mod:`planner.api.inputs`, ``catalog``,
``layout``, ``search``, ``runs``); everything is importable from here."""

from __future__ import annotations

from planner.api.catalog import (  # noqa: F401
    CATALOG_KIND_NAMES,
    CATALOG_KINDS,
    BytesPerParamReport,
    bytes_per_param,
    catalog_kinds_of,
    catalog_names,
    list_catalog,
    show_catalog,
)
from planner.api.inputs import (  # noqa: F401
    DEFAULT_PLAN,
    build_finetune,
    build_job,
    build_layout,
    build_search_space,
    build_training,
    with_profile,
)
from planner.api.layout import (  # noqa: F401
    collective,
    comm,
    estimate,
    layout_timeline,
    layout_warnings,
    memory,
    schedule,
    topology,
)
from planner.api.page import PageMark, parse_mark, plan_page_marks, plan_page_rows  # noqa: F401
from planner.api.runs import (  # noqa: F401
    FitReport,
    LayoutRanksReport,
    extrapolation,
    fit,
    published_layout_ranks,
    runs_check,
)
from planner.api.search import (  # noqa: F401
    SWEEP_QUANTITIES,
    PlanResult,
    SweepPoint,
    SweepResult,
    emit_settings,
    plan,
    plan_page_sample,
    sweep,
    trainer_schedules,
)
from planner.cost.goodput import explain_time_to_train  # noqa: F401 (CLI)
from planner.explain import explain_estimate, explain_plan  # noqa: F401 (CLI)

#: name → module: ``from planner.api import Layout`` imports :mod:`planner.spec.layout` then.
_EXPORTS = {
    "Job": "planner.spec.job",
    "Layout": "planner.spec.layout",
    "check_layout": "planner.spec.rules",
    "layers_per_virtual_stage": "planner.spec.layout",
    "checked_layer_split": "planner.spec.layout",
    "model_layers_per_virtual_stage": "planner.spec.layout",
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
    "SearchSpace": "planner.candidates",
    "PREFERENCE_RULES": "planner.rank",
    "describe_layout_range": "planner.layout_range",
    "TopologyReport": "planner.comm.topology",
    "FLASH_BACKWARD_FLOPS_RATIO": "planner.cost.attention_times",
    "attention_core_ops": "planner.cost.flops",
    "TimeToTrain": "planner.cost.goodput",
    "TRAINER_ETP": "planner.handoff",
    "TRAINER_NAMES": "planner.handoff",
    "PROGRESS_PHASES": "planner.progress",
    "COUNT_EXAMPLES": "planner.spec.units",
    "parse_count": "planner.spec.units",
    "parse_bytes": "planner.spec.units",
    "MEGATRON_MODULES": "planner.spec.recompute",
    "UNMODELLED_MODULES": "planner.spec.recompute",
    "WHOLE_POLICIES": "planner.spec.recompute",
    "checked_recompute": "planner.spec.recompute",
}


def __getattr__(name: str):
    """The front ends' types and functions (PEP 562), so the CLI starts without importing them."""
    if name not in _EXPORTS:
        raise AttributeError(f"module 'planner.api' has no attribute {name!r}")
    import importlib

    module = importlib.import_module(_EXPORTS[name])
    attribute = {"estimate_layout": "estimate", "PROGRESS_PHASES": "PHASES",
                 "PREFERENCE_RULES": "RULES", "describe_layout_range": "describe",
                 }.get(name, name)  # fmt: skip
    return getattr(module, attribute)

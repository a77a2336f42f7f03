"""The catalogs (models, accelerators, clusters, links) and bytes per parameter."""

from __future__ import annotations

from pydantic import BaseModel

from hwspecs.errors import PlanError, unknown_name_error
from planner.api.inputs import (
    _validated,
)

CATALOG_KINDS = ("models", "accelerators", "clusters", "links")


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

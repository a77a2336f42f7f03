"""Load hardware specs by catalog name or from a user's own TOML file.

``load_accelerator("h100-sxm")`` reads ``hwspecs/data/accelerators/h100-sxm.toml``;
``load_cluster("./my-cluster.toml")`` reads the user's file. Any problem (unknown name,
missing file, bad TOML, a field that fails validation) is a one-line
:class:`~hwspecs.errors.PlanError`.
"""

from __future__ import annotations

import difflib
import functools
import sys
import warnings
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from hwspecs.errors import PlanError, UnsourcedFigures, unknown_name_error, validation_error
from hwspecs.reliability import Reliability
from hwspecs.schema import SOURCES_OPTIONAL, Accelerator, Cluster, LinkTier

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

DATA_DIR = Path(__file__).parent / "data"

SpecT = TypeVar("SpecT", bound=BaseModel)

KIND_DIRS = {"accelerator": "accelerators", "link": "links", "cluster": "clusters"}


class _single:
    """One item of a pydantic ValidationError, as :func:`validation_error` reads one."""

    def __init__(self, error, item):
        self._item = item

    def errors(self):
        return [self._item]

    def error_count(self) -> int:
        return 1


def validation_error_line(error: ValidationError, source: str, model=None) -> str:
    """Collapse a pydantic error into one line naming every field and its problem.

    Unknown keys come first, each with a did-you-mean from the fields the same table is
    missing (a misspelt key is usually why a required one is missing) or ``model``'s fields.
    """
    errors = error.errors()
    missing = {tuple(item["loc"][:-1]): [] for item in errors if item["type"] == "missing"}
    for item in errors:
        if item["type"] == "missing":
            missing[tuple(item["loc"][:-1])].append(str(item["loc"][-1]))
    parts = []
    for item in sorted(errors, key=lambda item: item["type"] != "extra_forbidden"):
        where = ".".join(str(part) for part in item["loc"]) or "(top level)"
        message = item["msg"]
        if item["type"] == "missing":
            message = "missing (required)"
        elif item["type"] not in ("extra_forbidden",):  # a bad value: our wording of it
            message = str(validation_error(_single(error, item), None, model))
            message = message.removeprefix(f"{where}: ").removeprefix(f"{where} ")
        if item["type"] == "extra_forbidden":
            parent, key = tuple(item["loc"][:-1]), str(item["loc"][-1])
            known = _field_names(model, parent)
            close = difflib.get_close_matches(key, missing.get(parent) or known, n=1)
            close = close or difflib.get_close_matches(key, known, n=1)
            message = "unknown key" + (
                f" (did you mean '{close[0]}'?)" if close
                else f" (allowed: {', '.join(known)})" if known else ""
            )  # fmt: skip
        parts.append(f"field '{where}': {message}")
    return f"{source}: " + "; ".join(parts)


def _field_names(model, loc: tuple) -> list[str]:
    """The field names of the table at ``loc`` inside ``model`` (``("tiers", 0)``: a tier's);
    empty where it is not a model (a dict of figures) or ``model`` is None."""
    for part in loc:
        if model is None:
            return []
        if isinstance(part, int):  # an item of a list: the list's model is already found
            continue
        field = model.model_fields.get(str(part))
        if field is None:
            return []
        model = next(
            (kind for kind in (field.annotation, *_nested_args(field.annotation))
             if isinstance(kind, type) and issubclass(kind, BaseModel)),
            None,
        )  # fmt: skip
    return list(model.model_fields) if model is not None else []


def _nested_args(annotation) -> list:
    """Every type inside ``annotation`` (``list[ClusterTier] | None`` → ClusterTier, …)."""
    import typing

    found = []
    for arg in typing.get_args(annotation):
        found += [arg, *_nested_args(arg)]
    return found


def read_toml(path: Path) -> dict:
    """Read a TOML file, turning I/O and syntax errors into one-line PlanErrors."""
    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except FileNotFoundError:
        raise PlanError(f"file not found: {path}") from None
    except tomllib.TOMLDecodeError as error:
        raise PlanError(f"{path}: malformed TOML: {error}") from None
    except UnicodeDecodeError:
        raise PlanError(f"{path}: not a text file (TOML is UTF-8 text)") from None
    except OSError as error:
        raise PlanError(f"{path}: cannot read: {error.strerror}") from None


def parse_spec(data: dict, model: type[SpecT], source: str, context: dict | None = None) -> SpecT:
    """Validate ``data`` as ``model``; errors become one-line PlanErrors. ``context``:
    pydantic's validation context (:data:`hwspecs.schema.SOURCES_OPTIONAL` for a user's file)."""
    try:
        return model.model_validate(data, context=context)
    except ValidationError as error:
        first = ".".join(str(part) for part in error.errors()[0]["loc"]).split(".")[0]
        raise PlanError(validation_error_line(error, source, model), field=first or None) from None


def looks_like_path(name: str) -> bool:
    """A name with a path separator or a file suffix is a path, not a catalog slug."""
    return "/" in name or "\\" in name or name.endswith((".toml", ".json"))


def catalog_names(kind: str) -> list[str]:
    """Sorted catalog slugs of one kind: 'accelerator', 'link' or 'cluster'."""
    return sorted(path.stem for path in (DATA_DIR / KIND_DIRS[kind]).glob("*.toml"))


@functools.cache
def _load(kind: str, name: str, model: type[SpecT]) -> SpecT:
    if not looks_like_path(name):  # a catalog file: every number cites its source
        path = DATA_DIR / KIND_DIRS[kind] / f"{name}.toml"
        if not path.exists():
            raise unknown_name_error(kind, name, catalog_names(kind))
        return parse_spec(read_toml(path), model, name)
    path = Path(name).expanduser()  # a user's own file: sources optional, a warning if absent
    spec = parse_spec(read_toml(path), model, str(path), SOURCES_OPTIONAL)
    if getattr(spec, "unsourced", ()):
        warnings.warn(UnsourcedFigures(str(path), spec.unsourced), stacklevel=2)
    return spec


def load_accelerator(name: str) -> Accelerator:
    """An accelerator by catalog slug (``h100-sxm``) or TOML path."""
    return _load("accelerator", name, Accelerator)


def load_link(name: str) -> LinkTier:
    """A link tier by catalog slug (``nvlink4``, ``ib-ndr``) or TOML path."""
    return _load("link", name, LinkTier)


#: ``node:ACCELERATOR`` names one node of an accelerator (``--accelerator h100-sxm``).
ONE_NODE_PREFIX = "node:"


def one_node_name(accelerator: str) -> str:
    """The cluster name of one node (one scale-up domain) of ``accelerator``."""
    return f"{ONE_NODE_PREFIX}{accelerator}"


@functools.cache
def one_node_cluster(accelerator: str) -> Cluster:
    """One scale-up domain of ``accelerator`` as a cluster: its ``scale_up_domain_size``
    devices on its ``scale_up_link`` (8 H100 on NVLink 4), each figure cited from the
    accelerator's own sources."""
    spec = load_accelerator(accelerator)
    if spec.scale_up_link is None:
        raise PlanError(
            f"--accelerator {accelerator}: its file names no scale_up_link, so one node of it "
            "is not defined; give a cluster TOML (--cluster)",
            field="accelerator",
        )
    size = spec.scale_up_domain_size
    cited = spec.source_of("scale_up_domain_size") or f"accelerator {spec.id}"
    return Cluster(
        id=one_node_name(spec.id),
        name=f"one node of {spec.name} ({size} on {spec.scale_up_link})",
        accelerator=spec.id,
        num_gpus=size,
        gpus_per_node=size,
        scale_up_domain_size=size,
        tiers=[{"name": "scale-up", "link": spec.scale_up_link, "group_size": size}],
        notes=f"one scale-up domain of {spec.id} (--accelerator {spec.id})",
        sources={key: cited for key in ("num_gpus", "gpus_per_node", "scale_up_domain_size",
                                        "tiers.0")},
    )  # fmt: skip


def load_cluster(name: str) -> Cluster:
    """A cluster by catalog slug (``dgx-h100``), TOML path or ``node:ACCELERATOR`` (one
    scale-up domain, :func:`one_node_cluster`); its accelerator and links must exist."""
    if name.startswith(ONE_NODE_PREFIX):
        cluster = one_node_cluster(name[len(ONE_NODE_PREFIX) :])
        load_link(cluster.tiers[0].link)
        return cluster
    cluster = _load("cluster", name, Cluster)
    load_accelerator(cluster.accelerator)
    for tier in cluster.tiers:
        load_link(tier.link)
    return cluster


#: The shipped runs catalog: ``train`` (profiles are fitted on it). The test targets (Llama 3
#: Table 4, DeepSeek-V3) are not shipped: they are checked from the reference file itself.
RUN_CATALOGS = ("train",)


def _run_rows_from_csv(path: Path) -> list[dict]:
    """Flat CSV rows (dotted headers such as ``training.tp``) as nested dicts: empty cells
    are null, ``derived_fields`` / ``inferred_fields`` split on ``;``, everything else a
    string the schema converts (``"8"`` to 8 for an integer field). ``supplements`` (the
    catalog's records of launch-script settings, nested objects) has no flat form and is
    not read."""
    import csv

    rows = []
    with path.open(newline="") as handle:
        for flat in csv.DictReader(handle):
            row: dict = {}
            for key, text in flat.items():
                if key == "supplements":
                    continue
                *outer, last = key.split(".")
                into = row
                for part in outer:
                    into = into.setdefault(part, {})
                if key in ("derived_fields", "inferred_fields"):
                    into[last] = [part for part in text.split(";") if part]
                else:
                    into[last] = text if text != "" else None
            for key in ("moe", "mla"):  # an all-empty group is an absent one
                group = row.get("model", {}).get(key)
                if isinstance(group, dict) and all(v is None for v in group.values()):
                    row["model"][key] = None
            rows.append(row)
    return rows


@functools.cache
def load_runs(name: str = "train") -> tuple:
    """Published runs: the shipped catalog (``train``) or a user's JSON list / flat CSV file
    in the schema of :class:`hwspecs.runs.RunRow`; rows without ``model.mla`` (the shared
    reference format) take the MLA ranks their architecture note states. Returns a tuple of
    RunRows."""
    import json

    from hwspecs.runs import RunRow, mla_ranks, node_limit

    if name in RUN_CATALOGS:
        path, label = DATA_DIR / "runs" / f"{name}.json", f"runs catalog {name}"
    else:
        path, label = Path(name).expanduser(), name
    if not path.exists():
        raise PlanError(f"runs file not found: {name} (or a catalog: {', '.join(RUN_CATALOGS)})")
    if path.suffix == ".csv":
        data = _run_rows_from_csv(path)
    else:
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as error:
            raise PlanError(f"{label}: malformed JSON: {error}") from None
    if not isinstance(data, list):
        raise PlanError(f"{label}: expected a JSON list of runs")
    rows = []
    for index, entry in enumerate(data):
        where = entry.get("id", index) if isinstance(entry, dict) else index
        model = entry.get("model") if isinstance(entry, dict) else None
        if isinstance(model, dict) and "mla" not in model:
            model = {**model, "mla": mla_ranks(model.get("arch_notes"))}
        moe = model.get("moe") if isinstance(model, dict) else None
        if isinstance(moe, dict) and "max_nodes_per_token" not in moe:
            model = {**model, "moe": {**moe, "max_nodes_per_token": node_limit(moe.get("notes"))}}
        if isinstance(model, dict):
            entry = {**entry, "model": model}
        rows.append(parse_spec(entry, RunRow, f"{label} row {where}"))
    return tuple(rows)


def profile_names() -> list[str]:
    """Accelerators with a shipped efficiency profile."""
    return sorted(path.stem for path in (DATA_DIR / "profiles").glob("*.toml"))


@functools.cache
def load_profile(name: str):
    """An efficiency profile by accelerator slug (shipped) or TOML path."""
    from hwspecs.profile import EfficiencyProfile

    if looks_like_path(name):
        path = Path(name).expanduser()
    else:
        path = DATA_DIR / "profiles" / f"{name}.toml"
        if not path.exists():
            raise unknown_name_error("profile", name, profile_names())
    return parse_spec(read_toml(path), EfficiencyProfile, str(path))


#: Failure rates, checkpoint and facility defaults (``hwspecs/data/reliability.toml``).
RELIABILITY_FILE = DATA_DIR / "reliability.toml"


@functools.cache
def load_reliability() -> Reliability:
    """Interruption rates per GPU-hour and the checkpoint, restart and PUE defaults."""
    return parse_spec(read_toml(RELIABILITY_FILE), Reliability, "reliability.toml")

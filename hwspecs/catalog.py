"""Load hardware specs by catalog name or from a user's own TOML file.

``load_accelerator("h100-sxm")`` reads ``hwspecs/data/accelerators/h100-sxm.toml``;
``load_cluster("./my-cluster.toml")`` reads the user's file. Any problem (unknown name,
missing file, bad TOML, a field that fails validation) is a one-line
:class:`~planner.errors.PlanError`.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from hwspecs.schema import Accelerator, Cluster, LinkTier
from planner.errors import PlanError, unknown_name_error

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

DATA_DIR = Path(__file__).parent / "data"

SpecT = TypeVar("SpecT", bound=BaseModel)

KIND_DIRS = {"accelerator": "accelerators", "link": "links", "cluster": "clusters"}


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


def parse_spec(data: dict, model: type[SpecT], source: str) -> SpecT:
    """Validate ``data`` as ``model``; errors become one-line PlanErrors."""
    try:
        return model.model_validate(data)
    except ValidationError as error:
        from planner.errors import validation_error

        raise validation_error(error, source, model) from None


def looks_like_path(name: str) -> bool:
    """A name with a path separator or a file suffix is a path, not a catalog slug."""
    return "/" in name or "\\" in name or name.endswith((".toml", ".json"))


def catalog_names(kind: str) -> list[str]:
    """Sorted catalog slugs of one kind: 'accelerator', 'link' or 'cluster'."""
    return sorted(path.stem for path in (DATA_DIR / KIND_DIRS[kind]).glob("*.toml"))


@functools.cache
def _load(kind: str, name: str, model: type[SpecT]) -> SpecT:
    if looks_like_path(name):
        path = Path(name).expanduser()
    else:
        path = DATA_DIR / KIND_DIRS[kind] / f"{name}.toml"
        if not path.exists():
            raise unknown_name_error(kind, name, catalog_names(kind))
    return parse_spec(read_toml(path), model, str(path) if looks_like_path(name) else name)


def load_accelerator(name: str) -> Accelerator:
    """An accelerator by catalog slug (``h100-sxm``) or TOML path."""
    return _load("accelerator", name, Accelerator)


def load_link(name: str) -> LinkTier:
    """A link tier by catalog slug (``nvlink4``, ``ib-ndr``) or TOML path."""
    return _load("link", name, LinkTier)


def load_cluster(name: str) -> Cluster:
    """A cluster by catalog slug (``dgx-h100``) or TOML path; its accelerator and links must exist."""
    cluster = _load("cluster", name, Cluster)
    load_accelerator(cluster.accelerator)
    for tier in cluster.tiers:
        load_link(tier.link)
    return cluster

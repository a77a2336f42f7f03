"""Broadcasting per-distinct-value tables back to rows, for the evaluate modules."""

from __future__ import annotations

import numpy as np

#: Structure entries that are zero in every row of a dense model: left out when they are
#: (their terms add exactly 0), read through :func:`held`.
MOE_KEYS = ("moe_layers", "expert_params", "paced_moe_layers", "mirror_moe_layers")


def gather(table: dict[str, np.ndarray], inverse: np.ndarray, keys) -> dict[str, np.ndarray]:
    """Rows of a per-distinct-value table (broadcast by each row's index into it)."""
    return {key: table[key][inverse] for key in keys if key not in MOE_KEYS or table[key].any()}


def held(R: dict, key: str, factor) -> np.ndarray | float:
    """``R[key] · factor``: 0 where no row holds MoE layers or routed experts."""
    return R[key] * factor if key in R else 0.0

"""Per-model results kept over calls: the search times its rows in blocks, and each block
meets mostly the same keys, so what a key gives is worked out once per search."""

from __future__ import annotations

from collections.abc import Callable


def per_model(cache: dict, size: int, model, key: tuple, compute: Callable[[], object]):
    """``compute()``'s value for (``model``, ``key``), from ``cache`` when it holds it. Each
    entry holds its model, so an id in a key is never another model's; the cache is emptied
    when it outgrows ``size``."""
    known = cache.get((id(model), key))
    if known is None or known[0] is not model:
        if len(cache) > size:
            cache.clear()
        known = cache[id(model), key] = model, compute()
    return known[1]

"""A pipeline's layers given stage by stage, in Megatron-Core's layout notation.

Megatron-Core's ``--pipeline-model-parallel-layout`` (``PipelineParallelLayerLayout``)
writes each virtual pipeline stage's layers in one string: ``E`` the embedding, ``t`` a
transformer (decoder) layer, ``m`` an MTP module, ``L`` the loss (the output head), ``|``
between stages, ``x*n`` and ``(…)*n`` repeating a character or a group, commas only
cosmetic. Stages are listed in virtual-stage order (chunk c of rank r is stage c·pp + r),
the order :func:`planner.spec.layout.layers_per_virtual_stage` returns. Megatron-Bridge's
DeepSeek-V3 recipes set ``"Et*4|(t*4|)*14tmL"`` on 16 virtual stages: four layers on
each stage but the last, which holds one beside the MTP module and the head.

The planner places the embedding on the first stage and the head and any MTP module on the
last, so a layout that puts them elsewhere is refused with that reason.
"""

from __future__ import annotations

import re

import numpy as np

from hwspecs.errors import PlanError

#: The characters of the notation: layer kinds, the stage separator, repetition, commas.
LAYOUT_CHARACTERS = re.compile(r"[EtmL|()*,0-9]+")
#: A repeated group ``(…)*n`` (innermost first) and a repeated character ``x*n``.
REPEATED_GROUP = re.compile(r"\(([^()]*)\)\*(\d+)")
REPEATED_CHARACTER = re.compile(r"([EtmL|])\*(\d+)")


def is_layout_notation(text: str) -> bool:
    """Whether ``text`` is written in the layout notation (its characters only, a stage
    separator or a layer kind in it), as opposed to a named split such as ``even``."""
    return bool(LAYOUT_CHARACTERS.fullmatch(text)) and any(c in text for c in "EtmL")


def layout_stages(text: str) -> list[str]:
    """The layout's stages, each its string of layer kinds, repetitions unrolled."""
    if not is_layout_notation(text):
        raise PlanError(
            f"pipeline layout '{text}' is not in Megatron-Core's notation: E (embedding), t "
            f"(layer), m (MTP module), L (loss), '|' between stages, x*n and (…)*n repeats"
        )
    unrolled = text.replace(",", "")
    while REPEATED_GROUP.search(unrolled):
        unrolled = _unrolled(text, REPEATED_GROUP, unrolled)
    unrolled = _unrolled(text, REPEATED_CHARACTER, unrolled)
    if re.search(r"[()*0-9]", unrolled):
        raise PlanError(f"pipeline layout '{text}': a repeat is not of a character or a group")
    return unrolled.split("|")


#: The longest layout unrolled: far beyond any pipeline (a bound, not a model limit).
MAX_UNROLLED = 1_000_000


def _unrolled(text: str, pattern: re.Pattern, current: str) -> str:
    """``current`` with every repeat ``pattern`` finds unrolled, refused once the unrolled
    parts of this pass would pass :data:`MAX_UNROLLED` entries."""
    budget = [MAX_UNROLLED]

    def repeated(match: re.Match) -> str:
        part, count = match.group(1), int(match.group(2))
        budget[0] -= len(part) * count
        if budget[0] < 0:
            raise PlanError(
                f"pipeline layout '{text}' unrolls to more than {MAX_UNROLLED:,} entries"
            )
        return part * count

    return pattern.sub(repeated, current)


def layout_layers(
    text: str, num_layers: int, stages: int, num_mtp_modules: int | None = None
) -> np.ndarray:
    """Transformer layers per virtual stage of the layout ``text``, checked against the
    model's ``num_layers``, the ``stages`` (pp·vpp) and, where given, its MTP modules."""
    parts = layout_stages(text)
    if len(parts) != stages:
        raise PlanError(f"pipeline layout '{text}' has {len(parts)} stages, not pp·vpp = {stages}")
    layers = np.array([part.count("t") for part in parts], dtype=np.int64)
    if layers.sum() != num_layers:
        raise PlanError(
            f"pipeline layout '{text}' places {layers.sum()} layers, not the model's {num_layers}"
        )
    for kind, stage, count in (("E", 0, 1), ("L", stages - 1, 1), ("m", stages - 1, None)):
        where = [i for i, part in enumerate(parts) for c in part if c == kind]
        if set(where) - {stage} or (count is not None and len(where) != count):
            raise PlanError(
                f"pipeline layout '{text}': the planner places the embedding (E) once on the "
                f"first stage, the loss (L) once and any MTP module (m) on the last"
            )
    mtp = "".join(parts).count("m")
    if num_mtp_modules is not None and mtp != num_mtp_modules:
        raise PlanError(
            f"pipeline layout '{text}' places {mtp} MTP modules, not the model's {num_mtp_modules}"
        )
    return layers

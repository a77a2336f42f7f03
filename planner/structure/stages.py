"""Layers per pipeline rank: which layers of each kind, and which ends (embedding, head), each
rank holds — one home for the memory model, the compute times and the collectives' counts.

Virtual stages get their layers from :func:`planner.spec.layout.layers_per_virtual_stage`
and sit on ranks by :func:`planner.spec.layout.virtual_stage_ranks` (interleaved: stage
c·pp + r on rank r; V-shape: r and 2·pp − 1 − r). DualPipe runs both directions: its rank
r holds stages r and pp − 1 − r, and each micro-batch passes through one of them
(half the micro-batches each way), so per micro-batch a rank does their mean.
"""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel, ConfigDict

from planner.columns.codes import unique_rows
from planner.spec.layout import dense_and_moe_layers_per_virtual_stage, virtual_stage_ranks
from planner.spec.model import ModelSpec
from planner.structure.memo import per_model


class RankStructure(BaseModel):
    """What each pipeline rank holds: dense and MoE layers, embedding, head (one direction)."""

    model_config = ConfigDict(frozen=True)

    dense_layers: list[float]
    moe_layers: list[float]
    has_embedding: list[bool]
    has_head: list[bool]


def rank_structure(
    model: ModelSpec, pp: int, vpp: int, schedule: str, split: str, layers=None
) -> RankStructure:
    """Layers per rank for one direction of the pipeline (DualPipe's mirror is its copy);
    ``layers``: the virtual stages' (dense, MoE) layer counts, when the caller has them."""
    dense, moe = layers or dense_and_moe_layers_per_virtual_stage(model, pp, vpp, split, schedule)
    ranks = virtual_stage_ranks(schedule, pp, vpp)
    return RankStructure(
        dense_layers=np.bincount(ranks, weights=dense, minlength=pp).tolist(),
        moe_layers=np.bincount(ranks, weights=moe, minlength=pp).tolist(),
        has_embedding=(np.arange(pp) == ranks[0]).tolist(),
        has_head=(np.arange(pp) == ranks[-1]).tolist(),
    )


def busiest_rank_layers(model: ModelSpec, pp, chunks, v_shape, mirrored, split="auto") -> dict:
    """Per row of the columns (numpy arrays; ``chunks``: model chunks per rank, ``v_shape``:
    ZB-V / DualPipeV placement, ``mirrored``: DualPipe), what each pipeline rank does per
    micro-batch, as [row, rank] arrays padded with zeros to the largest pp: ``layers``,
    ``moe_layers``, ``embedding`` and ``head`` (DualPipe: the mean of its two stages), and
    ``held_layers`` / ``held_head`` (both of DualPipe's copies: the weights a rank holds).
    Worked out once per distinct (pp, chunks, v_shape, mirrored, split)."""
    table, inverse, shape = pipeline_rank_layers(model, pp, chunks, v_shape, mirrored, split)
    width = next(iter(table.values())).shape[-1]
    return {name: values[inverse].reshape(*shape, width) for name, values in table.items()}


def pipeline_rank_layers(
    model: ModelSpec, pp, chunks, v_shape, mirrored, split="auto"
) -> tuple[dict[str, np.ndarray], np.ndarray, tuple]:
    """:func:`busiest_rank_layers` before it is spread over the rows: the [pipeline, rank]
    arrays of each distinct (pp, chunks, v_shape, mirrored, split), each row's index into
    them (flat) and the rows' shape; a quantity of those arrays alone is worked out on them
    and read by the index (10^5 rows × 64 ranks would cost 50 MB an array)."""
    columns = np.broadcast_arrays(*(np.asarray(c) for c in (pp, chunks, v_shape, mirrored)))
    shape = columns[0].shape
    splits = np.broadcast_to(np.asarray(split, dtype=object), shape)
    keys, inverse = unique_rows(*(np.asarray(c, dtype=np.int64) for c in columns), splits)
    width = max((int(p) for p, *_ in keys), default=1)
    names = ("layers", "moe_layers", "embedding", "head", "held_layers", "held_head")
    table = {name: np.zeros((len(keys), width)) for name in names}
    for index, key in enumerate(keys):
        ranks = per_model(
            _PIPELINES, _PIPELINES_SIZE, model, key, lambda key=key: _pipeline_ranks(model, *key)
        )
        for name, values in zip(names, ranks, strict=True):
            table[name][index, : int(key[0])] = values
    return table, inverse, shape


#: :func:`_pipeline_ranks` per (model, key), kept over calls
#: (:func:`planner.structure.memo.per_model`).
_PIPELINES: dict[tuple, tuple] = {}
_PIPELINES_SIZE = 2**12


def _pipeline_ranks(model: ModelSpec, p, c, v, mirror, spl) -> tuple[np.ndarray, ...]:
    """Per rank of one pipeline: layers, MoE layers, embedding, head (DualPipe: the mean of
    its two stages), and held layers, held head (both of DualPipe's copies)."""
    schedule = "zbv" if v else ("dualpipe" if mirror else "interleaved-1f1b")
    vpp = 2 if v else int(c)
    ranks = rank_structure(model, int(p), vpp, schedule, spl)
    dense, moe = np.asarray(ranks.dense_layers), np.asarray(ranks.moe_layers)
    emb = np.asarray(ranks.has_embedding, dtype=float)
    head = np.asarray(ranks.has_head, dtype=float)
    if mirror:  # DualPipe's mirrored stage (also holds the other end)
        held, held_head = dense + moe + (dense + moe)[::-1], head + head[::-1]
        dense, moe, emb, head = ((x + x[::-1]) / 2 for x in (dense, moe, emb, head))
    else:
        held, held_head = dense + moe, head
    return dense + moe, moe, emb, head, held, held_head

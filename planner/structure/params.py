"""Parameters per rank: what one TP/EP rank of each pipeline stage holds.

A layer's weights split over TP except the norm weights and MLA's small down-projections,
which every TP rank holds whole; KV heads split while tp ≤ KV heads and are replicated
beyond; routed experts split over ep·etp and shared experts over tp (Megatron-Core's expert
tensor parallelism); the embedding on the first stage, the final norm and LM head (and any
MTP module, DeepSeek-V3 §2.2) on the last. One home for the memory model's weights and the
data-parallel traffic's gradient bytes.
"""

from __future__ import annotations

import numpy as np

from planner.columns.codes import unique_rows
from planner.pipeline.schedules.registry import BIDIRECTIONAL_SCHEDULES
from planner.spec.layout import Layout, dense_and_moe_layers_per_virtual_stage, virtual_stage_ranks
from planner.spec.model import ModelSpec
from planner.structure.linears import kv_heads_per_rank
from planner.structure.memo import per_model


def attention_params_per_rank(model: ModelSpec, tp: int) -> float:
    """Attention parameters on one TP rank: head-split projections / tp, the rest whole."""
    h, nq = model.hidden_size, model.num_attention_heads
    if model.attention_kind == "mla":
        rope, kv_rank, q_rank = model.qk_rope_head_dim, model.kv_lora_rank, model.q_lora_rank
        qk, v = model.head_dim, model.value_head_dim
        # Down projections and latent norms are small and kept whole on every TP rank.
        whole = h * (kv_rank + rope) + kv_rank + ((h * q_rank + q_rank) if q_rank else 0)
        split = kv_rank * nq * (qk - rope + v) + nq * v * h + (q_rank or h) * nq * qk
        return whole + split / tp
    kv_local = kv_heads_per_rank(model, tp) * model.head_dim
    qw = model.query_width
    weights = (h * qw + qw * h) / tp + 2 * h * kv_local
    biases = (qw / tp + 2 * kv_local) if (model.qkv_bias or model.linear_bias) else 0
    biases += h if model.linear_bias else 0
    return weights + biases + (2 * model.head_dim if model.qk_norm else 0)


def layer_params_per_rank(
    model: ModelSpec, tp: int, ep: int, moe_layer: bool, etp: int | None = None
) -> tuple[float, float]:
    """(dense, expert) parameters of one layer on one rank; routed experts split by ep·etp
    (``etp`` None: tp; Megatron-Core's expert tensor parallelism), shared experts by tp."""
    dense = 2 * model.norm_params() + attention_params_per_rank(model, tp)
    if not moe_layer:
        return dense + model.mlp_params() / tp, 0.0
    expert = model.mlp_params(model.moe_ffn_hidden_size)
    dense += model.router_params() + model.num_shared_experts * expert / tp
    return dense, model.num_routed_experts * expert / (ep * (tp if etp is None else etp))


def params_per_virtual_stage(
    model: ModelSpec, layout: Layout, layers: tuple[np.ndarray, np.ndarray] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(dense, expert) parameters per virtual stage on one of its TP/EP ranks; ``layers``:
    the stages' (dense, MoE) layer counts, when the caller has them already."""
    num_dense, num_moe = layers or dense_and_moe_layers_per_virtual_stage(
        model, layout.pp, layout.vpp, layout.pipeline_layer_split, layout.schedule
    )
    dense_layer, _ = layer_params_per_rank(model, layout.tp, layout.ep, moe_layer=False)
    moe_dense, moe_expert = layer_params_per_rank(
        model, layout.tp, layout.ep, moe_layer=True, etp=layout.etp
    )
    dense = num_dense * dense_layer + num_moe * moe_dense
    expert = num_moe * moe_expert
    dense[0] += model.embedding_params() / layout.tp
    head = model.lm_head_params() or (model.vocab_size * model.hidden_size if layout.pp > 1 else 0)
    dense[-1] += head / layout.tp + model.norm_params()
    mtp_dense, mtp_expert = mtp_params_per_rank(model, layout.tp, layout.ep, layout.etp)
    dense[-1] += mtp_dense
    expert[-1] += mtp_expert
    return dense, expert


def mtp_params_per_rank(
    model: ModelSpec, tp: int, ep: int, etp: int | None = None
) -> tuple[float, float]:
    """(dense, expert) parameters of the model's MTP modules on the last stage's rank.

    DeepSeek-V3 §2.2 / §3.2.3: each module's projection ``2h → h`` (split by TP), its
    three norms and one transformer layer; embedding and output head are the main model's.
    """
    if not model.num_mtp_modules:
        return 0.0, 0.0
    dense, expert = layer_params_per_rank(model, tp, ep, model.is_moe, etp)
    dense += 2 * model.hidden_size**2 / tp + 3 * model.norm_params()
    return model.num_mtp_modules * dense, model.num_mtp_modules * expert


def rank_sums(values: np.ndarray, layout: Layout, ranks: np.ndarray | None = None) -> np.ndarray:
    """Sum per-virtual-stage values onto pipeline ranks (DualPipe adds the mirrored stage);
    ``ranks``: the layout's :func:`planner.spec.layout.virtual_stage_ranks`, when the caller has them."""
    if ranks is None:
        ranks = virtual_stage_ranks(layout.schedule, layout.pp, layout.vpp)
    per_rank = np.bincount(ranks, weights=values, minlength=layout.pp)
    if layout.schedule in BIDIRECTIONAL_SCHEDULES:
        per_rank = per_rank + per_rank[::-1]
    return per_rank


def busiest_rank_params(model: ModelSpec, tp, pp, ep, etp, chunks, v_shape, mirrored, split="auto"):
    """(dense, expert, both) parameters of the pipeline rank holding the most, per row of the
    columns (numpy arrays or scalars; ``etp`` None: tp; ``chunks``: model chunks per rank;
    ``v_shape``: ZB-V / DualPipeV placement; ``mirrored``: DualPipe's two copies), from
    :func:`params_per_virtual_stage` and :func:`rank_sums` — the parameters the memory model
    holds — worked out once per distinct combination."""
    tp = np.asarray(tp)
    etp = tp if etp is None else np.asarray(etp)
    columns = np.broadcast_arrays(tp, pp, ep, etp, chunks, v_shape, mirrored)
    shape = columns[0].shape
    splits = np.broadcast_to(np.asarray(split, dtype=object), shape)
    keys, inverse = unique_rows(*(np.asarray(c, dtype=np.int64) for c in columns), splits)
    values = np.zeros((len(keys), 3))
    for index, key in enumerate(keys):
        values[index] = per_model(
            _BUSIEST, _BUSIEST_SIZE, model, key, lambda key=key: _busiest_of(model, *key)
        )
    return tuple(values[inverse, k].reshape(shape) for k in range(3))


#: :func:`busiest_rank_params` per (model, key), kept over calls: the search times its rows
#: in blocks and each block meets mostly the same keys (DeepSeek-V3 on 2,048 GPUs: about
#: 800 keys, 9,500 evaluations without it). Each entry holds its model, so an id in a key
#: is never another model's.
_BUSIEST: dict[tuple, tuple] = {}
_BUSIEST_SIZE = 2**14


def _busiest_of(model: ModelSpec, t, p, x, et, c, v, mirror, spl) -> tuple[float, float, float]:
    """(dense, expert, both) parameters of the rank holding the most, for one key."""
    schedule = "zbv" if v else ("dualpipe" if mirror else "interleaved-1f1b")
    layout = Layout(tp=t, pp=p, ep=x, dp=x, etp=None if et == t else et,
                    vpp=2 if v else c, schedule=schedule, pipeline_layer_split=spl)  # fmt: skip
    ranks = virtual_stage_ranks(schedule, p, layout.vpp)
    dense, expert = params_per_virtual_stage(model, layout)
    dense, expert = rank_sums(dense, layout, ranks), rank_sums(expert, layout, ranks)
    return dense.max(), expert.max(), (dense + expert).max()

"""A transformer layer's linear modules by name and shape.

Adapters (LoRA and its relatives), NF4 quantization and Muon all act on individual weight
matrices, so they need the layer as a list of ``nn.Linear`` modules rather than the fused
counts of :mod:`planner.spec.model`. Names follow Hugging Face's Llama / Mixtral-style /
DeepSeek-V3 modules (the names PEFT's ``target_modules`` matches): ``q_proj``, ``k_proj``,
``v_proj``, ``o_proj``; MLA's ``q_a_proj``, ``q_b_proj`` (or ``q_proj`` without query
compression), ``kv_a_proj_with_mqa``, ``kv_b_proj``, ``o_proj``; the MLP's ``gate_proj``,
``up_proj``, ``down_proj`` (a GELU MLP has only ``up_proj`` and ``down_proj``); the MoE
router ``router``. Routed and shared experts carry the same MLP names with ``count`` copies
per layer. Biases and norms are vectors, not listed here.

Shapes are ``in_features → out_features`` as ``nn.Linear`` stores them (weight ``out × in``).
``tp_split`` says how Megatron-style tensor parallelism cuts the module: ``column`` splits
the output features (Q/K/V, gate, up, MLA up projections), ``row`` the input features (the
output projection, down), ``none`` keeps it whole on every rank (MLA down projections and
the router, as :func:`planner.structure.params.attention_params_per_rank` does).
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict

from planner.spec.model import ModelSpec

ATTENTION_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
MLA_MODULES = ("q_proj", "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj")
MLP_MODULES = ("gate_proj", "up_proj", "down_proj")
ROUTER_MODULES = ("router",)
MODULE_NAMES = tuple(dict.fromkeys(ATTENTION_MODULES + MLA_MODULES + MLP_MODULES + ROUTER_MODULES))


def kv_heads_per_rank(model: ModelSpec, tp: int) -> int:
    """KV heads held by one TP rank: split when tp ≤ KV heads, replicated (one) beyond."""
    return max(model.num_kv_heads // tp, 1)


def kv_heads_per_rank_columns(model: ModelSpec, tp) -> np.ndarray:
    """:func:`kv_heads_per_rank` of a column of TP degrees."""
    return np.maximum(model.num_kv_heads // np.asarray(tp), 1)


class Linear(BaseModel):
    """One linear module of a layer (``count`` identical copies for experts)."""

    model_config = ConfigDict(frozen=True)

    name: str
    block: Literal["attention", "mlp", "router"]
    #: ``experts.`` or ``shared_experts.`` for MoE expert copies; names stay matchable.
    prefix: str = ""
    in_features: int
    out_features: int
    count: int = 1
    #: Tokens each copy sees per token of the batch: k/E for a routed expert, else 1.
    token_share: float = 1.0
    #: Routed expert weights (split over EP, sharded over the expert-data-parallel group
    #: dp·cp·(tp/etp)/ep under ZeRO).
    routed_expert: bool = False
    tp_split: Literal["column", "row", "none"] = "column"
    #: Output features on one TP rank when they are not simply out/tp (replicated KV heads).
    out_features_per_rank: int | None = None

    @property
    def path(self) -> str:
        return self.prefix + self.name

    @property
    def num_weights(self) -> int:
        """Weight elements of all copies."""
        return self.in_features * self.out_features * self.count

    def local_shape(self, tp: int, etp: int | None = None) -> tuple[float, float]:
        """(in, out) features of one copy on one TP rank; a routed expert is split by
        ``etp`` instead when given (expert tensor parallelism, :func:`expert_fold`)."""
        if self.routed_expert and etp is not None:
            tp = etp
        if self.tp_split == "column":
            out = self.out_features_per_rank or self.out_features / tp
            return float(self.in_features), float(out)
        if self.tp_split == "row":
            return self.in_features / tp, float(self.out_features)
        return float(self.in_features), float(self.out_features)

    def local_count(self, ep: int) -> float:
        """Copies on one EP rank (routed experts are split over EP)."""
        return self.count / ep if self.routed_expert else float(self.count)


def attention_linears(model: ModelSpec, tp: int = 1) -> list[Linear]:
    """Attention projections of one layer (``tp`` only decides replicated KV heads per rank)."""
    h, nq = model.hidden_size, model.num_attention_heads
    if model.attention_kind != "mla":
        kv_local = kv_heads_per_rank(model, tp) * model.head_dim
        return [
            Linear(name="q_proj", block="attention", in_features=h, out_features=model.query_width),
            Linear(
                name="k_proj",
                block="attention",
                in_features=h,
                out_features=model.kv_width,
                out_features_per_rank=kv_local,
            ),
            Linear(
                name="v_proj",
                block="attention",
                in_features=h,
                out_features=model.kv_width,
                out_features_per_rank=kv_local,
            ),
            Linear(
                name="o_proj",
                block="attention",
                in_features=model.query_width,
                out_features=h,
                tp_split="row",
            ),
        ]
    rope, kv_rank, q_rank = model.qk_rope_head_dim, model.kv_lora_rank, model.q_lora_rank
    qk, v = model.head_dim, model.value_head_dim
    if q_rank:
        query = [
            Linear(
                name="q_a_proj",
                block="attention",
                in_features=h,
                out_features=q_rank,
                tp_split="none",
            ),
            Linear(name="q_b_proj", block="attention", in_features=q_rank, out_features=nq * qk),
        ]
    else:
        query = [Linear(name="q_proj", block="attention", in_features=h, out_features=nq * qk)]
    return [
        *query,
        Linear(
            name="kv_a_proj_with_mqa",
            block="attention",
            in_features=h,
            out_features=kv_rank + rope,
            tp_split="none",
        ),
        Linear(
            name="kv_b_proj",
            block="attention",
            in_features=kv_rank,
            out_features=nq * (qk - rope + v),
        ),
        Linear(
            name="o_proj", block="attention", in_features=nq * v, out_features=h, tp_split="row"
        ),
    ]


def _mlp_linears(
    model: ModelSpec, ffn: int, count: int, token_share: float, prefix: str
) -> list[Linear]:
    h = model.hidden_size
    names = ("gate_proj", "up_proj") if model.mlp_kind == "swiglu" else ("up_proj",)
    common = {
        "block": "mlp",
        "prefix": prefix,
        "count": count,
        "token_share": token_share,
        "routed_expert": prefix == "experts.",
    }
    ups = [Linear(name=name, in_features=h, out_features=ffn, **common) for name in names]
    down = Linear(name="down_proj", in_features=ffn, out_features=h, tp_split="row", **common)
    return [*ups, down]


def mlp_linears(model: ModelSpec, moe_layer: bool) -> list[Linear]:
    """The dense MLP, or a MoE block's router, routed experts and shared experts."""
    if not moe_layer:
        return _mlp_linears(model, model.ffn_hidden_size, 1, 1.0, prefix="")
    f, experts = model.moe_ffn_hidden_size, model.num_routed_experts
    share = model.num_experts_per_token / experts
    linears = [
        Linear(
            name="router",
            block="router",
            in_features=model.hidden_size,
            out_features=experts,
            tp_split="none",
        ),
        *_mlp_linears(model, f, experts, share, prefix="experts."),
    ]
    if model.num_shared_experts:
        linears += _mlp_linears(model, f, model.num_shared_experts, 1.0, prefix="shared_experts.")
    return linears


def expert_fold(tp: int, etp: int | None = None) -> int:
    """TP ranks folded into the EP group: ``tp/etp`` (1 when etp is None or tp).

    Megatron-Core's MoE parallel folding: with ``etp = 1`` each TP rank sends its own
    sequence-parallel slice of the tokens through the EP all-to-all, so a routed expert's
    rows on one rank are ``etp/tp`` of what TP-split experts see, at the full width
    (:meth:`Linear.local_shape` with ``etp``); per-rank FLOPs do not change.
    """
    return 1 if etp is None else tp // etp


def token_rows(
    linear: Linear, model: ModelSpec, tokens: float, ep: int = 1, fold: int = 1
) -> float:
    """Rows all copies of ``linear`` see for ``tokens`` on one rank: the token share times
    the copies, routed experts at the busiest EP rank's load
    (:meth:`planner.spec.model.ModelSpec.routed_load_factor`) and over the ``fold`` TP ranks
    folded into EP (:func:`expert_fold`)."""
    rows = tokens * linear.token_share * linear.count
    return rows * model.routed_load_factor(ep) / fold if linear.routed_expert else rows


def layer_linears(model: ModelSpec, moe_layer: bool, tp: int = 1) -> list[Linear]:
    """Every linear module of one layer."""
    return attention_linears(model, tp) + mlp_linears(model, moe_layer)


def layer_kinds_count(model: ModelSpec) -> dict[bool, int]:
    """{moe_layer: number of such layers} for the kinds the model has (dense layers first)."""
    num_moe = model.num_moe_layers
    counts = {False: model.num_layers - num_moe, True: num_moe}
    return {kind: count for kind, count in counts.items() if count}

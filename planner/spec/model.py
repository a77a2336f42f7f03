"""Transformer shapes and parameter counts.

A :class:`ModelSpec` describes a decoder-only transformer, dense or mixture-of-experts,
with the facts that decide its FLOPs and memory: layers, hidden size, FFN size, attention
heads and KV heads (MHA / GQA / MQA) or MLA's compression ranks, vocabulary, MLP kind
(SwiGLU or GELU 4h), norms, biases and the MoE fields. Catalog entries live in
``planner/models/*.toml``; :func:`load_model` also reads a Hugging Face ``config.json``
(see :mod:`planner.spec.hf_config`).

Parameter counts follow the module shapes exactly (the same tensors as the reference
implementations), so they can be checked against the published totals.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from hwspecs.errors import PlanError, unknown_name_error
from planner.spec.measures import MEASURE_SETS
from planner.spec.precision import PrecisionName

MODELS_DIR = Path(__file__).parent / "models"


class ModelSpec(BaseModel):
    """A decoder-only transformer (dense or MoE). Sizes are element counts."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    num_layers: int = Field(gt=0)
    hidden_size: int = Field(gt=0)
    ffn_hidden_size: int = Field(gt=0, description="intermediate size of the dense MLP")
    num_attention_heads: int = Field(gt=0)
    num_kv_heads: int = Field(gt=0, description="KV heads: = heads for MHA, 1 for MQA")
    head_dim: int = Field(gt=0, description="per-head size of queries and keys")
    vocab_size: int = Field(gt=0)
    tied_embeddings: bool = False
    mlp_kind: Literal["swiglu", "gelu"] = "swiglu"
    norm_kind: Literal["rmsnorm", "layernorm"] = "rmsnorm"
    attention_kind: Literal["mha", "gqa", "mqa", "mla"]
    qkv_bias: bool = Field(False, description="biases on Q/K/V only (Qwen2)")
    linear_bias: bool = Field(False, description="biases on every linear layer (GPT-2)")
    qk_norm: bool = Field(False, description="RMSNorm on queries and keys per head (Qwen3)")
    position_embedding: Literal["rope", "learned"] = "rope"
    max_position_embeddings: int | None = Field(None, gt=0)
    dropout: float = Field(0.0, ge=0, lt=1, description="dropout probability (GPT-style)")
    # Sliding-window (local) attention on some layers (Mistral 7B: all; GPT-OSS: every other).
    sliding_window: int | None = Field(
        None, gt=0, description="keys a query of a sliding-window layer sees (itself included)"
    )
    num_sliding_window_layers: int = Field(
        0, ge=0, description="layers with sliding-window attention; the others see every key"
    )
    # MLA (DeepSeek-V2/V3): low-rank query and KV compression with decoupled rotary dims.
    q_lora_rank: int | None = Field(None, gt=0)
    kv_lora_rank: int | None = Field(None, gt=0)
    qk_rope_head_dim: int | None = Field(None, gt=0)
    v_head_dim: int | None = Field(None, gt=0)
    # Mixture of experts.
    num_routed_experts: int = Field(0, ge=0)
    num_shared_experts: int = Field(0, ge=0)
    num_experts_per_token: int = Field(0, ge=0, description="top-k routed experts per token")
    moe_ffn_hidden_size: int | None = Field(None, gt=0)
    num_dense_layers: int = Field(0, ge=0, description="first-k layers with a dense MLP")
    router_bias: bool = Field(False, description="per-expert routing bias (DeepSeek-V3)")
    max_nodes_per_token: int | None = Field(
        None,
        gt=0,
        description="node-limited routing: a token's experts lie on at most this many nodes "
        "(DeepSeek-V3 §2.1.2, M = 4), or, with num_expert_groups, this many expert groups "
        "(HF topk_group); None: unlimited",
    )
    num_expert_groups: int | None = Field(
        None,
        gt=0,
        description="the router's expert groups (HF n_group; DeepSeek-V3: 8): the limit holds "
        "per group, so where EP spans more nodes than groups a token reaches "
        "max_nodes_per_token × nodes/groups nodes; None: the limit holds per node",
    )
    num_mtp_modules: int = Field(0, ge=0, description="multi-token-prediction modules")
    moe_capacity_factor: float | None = Field(
        None,
        gt=0,
        description="expert capacity over the balanced load (GShard §2.2, Switch §2.2): each "
        "expert computes and exchanges buffers of capacity_factor·tokens·k/E rows, tokens "
        "beyond it dropped; None: dropless routing",
    )
    moe_imbalance: float = Field(
        1.0,
        ge=1.0,
        description="dropless routing: routed token copies on the busiest expert-parallel "
        "rank over the balanced share (1.0: balanced); the step waits for that rank",
    )
    # How the model was trained when published: jobs that choose nothing take these.
    training_precision: PrecisionName | None = Field(
        None, description="precision recipe of the published training run"
    )
    training_memory_measures: str | None = Field(
        None, description="activation-memory measures of the published run (planner.spec.measures)"
    )
    sources: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _fill_derived(cls, data: dict) -> dict:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        heads = data.get("num_attention_heads")
        if heads:
            data.setdefault("num_kv_heads", heads)
            if data.get("hidden_size") and "head_dim" not in data:
                data["head_dim"] = data["hidden_size"] // heads
        if "attention_kind" not in data and heads:
            if data.get("kv_lora_rank"):
                data["attention_kind"] = "mla"
            elif data["num_kv_heads"] == heads:
                data["attention_kind"] = "mha"
            elif data["num_kv_heads"] == 1:
                data["attention_kind"] = "mqa"
            else:
                data["attention_kind"] = "gqa"
        return data

    @model_validator(mode="after")
    def _consistent(self) -> ModelSpec:
        if self.num_attention_heads % self.num_kv_heads:
            raise ValueError(
                f"num_attention_heads {self.num_attention_heads} must be a multiple of "
                f"num_kv_heads {self.num_kv_heads}"
            )
        if self.attention_kind == "mla" and not (
            self.kv_lora_rank and self.qk_rope_head_dim and self.v_head_dim
        ):
            raise ValueError("MLA needs kv_lora_rank, qk_rope_head_dim and v_head_dim")
        if self.num_routed_experts:
            if not (self.num_experts_per_token and self.moe_ffn_hidden_size):
                raise ValueError("MoE needs num_experts_per_token and moe_ffn_hidden_size")
            if self.num_experts_per_token > self.num_routed_experts:
                raise ValueError("num_experts_per_token exceeds num_routed_experts")
            if self.num_dense_layers > self.num_layers:
                raise ValueError("num_dense_layers exceeds num_layers")
            if self.num_expert_groups and self.num_routed_experts % self.num_expert_groups:
                raise ValueError(
                    f"num_expert_groups {self.num_expert_groups} must divide num_routed_experts "
                    f"{self.num_routed_experts}"
                )
        if self.moe_capacity_factor is not None and self.moe_imbalance != 1.0:
            raise ValueError(
                "give moe_capacity_factor (capacity-based routing) or moe_imbalance (dropless), "
                "not both: a capacity caps the busiest expert's load"
            )
        if self.training_memory_measures not in (None, *MEASURE_SETS):
            raise ValueError(f"training_memory_measures must be one of: {', '.join(MEASURE_SETS)}")
        if bool(self.sliding_window) != bool(self.num_sliding_window_layers):
            raise ValueError("give sliding_window and num_sliding_window_layers together")
        if self.num_sliding_window_layers > self.num_layers:
            raise ValueError("num_sliding_window_layers exceeds num_layers")
        if self.position_embedding == "learned" and not self.max_position_embeddings:
            raise ValueError("learned position embeddings need max_position_embeddings")
        return self

    # ----- shapes ---------------------------------------------------------------------

    def routed_load_factor(self, ep: int | np.ndarray = 1) -> float | np.ndarray:
        """Routed token copies one expert-parallel rank computes and exchanges, over the
        balanced share ``tokens·k/ep``: the capacity factor under capacity-based routing
        (the padded buffers are computed and sent whatever ``ep``), else the imbalance
        where ``ep > 1`` (the busiest rank gates the all-to-all; on one rank the experts
        share it and the total is the balanced one). Works on numpy arrays of ``ep``."""
        if not np.ndim(ep):  # the per-shape callers: plain floats, no array round trip
            if self.moe_capacity_factor is not None:
                return self.moe_capacity_factor
            return self.moe_imbalance if ep > 1 else 1.0
        if self.moe_capacity_factor is not None:
            return np.full(np.shape(ep), self.moe_capacity_factor)
        return np.where(np.asarray(ep) > 1, self.moe_imbalance, 1.0)

    @property
    def is_moe(self) -> bool:
        return self.num_routed_experts > 0

    @property
    def num_moe_layers(self) -> int:
        return self.num_layers - self.num_dense_layers if self.is_moe else 0

    @property
    def query_width(self) -> int:
        """Width of all query heads together (nq × d_qk)."""
        return self.num_attention_heads * self.head_dim

    @property
    def kv_width(self) -> int:
        """Width of all key (or value) heads together (nkv × d) for non-MLA attention."""
        return self.num_kv_heads * self.head_dim

    @property
    def value_head_dim(self) -> int:
        return self.v_head_dim or self.head_dim

    @property
    def mlp_matrices(self) -> int:
        """Weight matrices of h × f in one MLP: 3 for SwiGLU (gate, up, down), 2 for GELU."""
        return 3 if self.mlp_kind == "swiglu" else 2

    # ----- parameter counts (elements) ------------------------------------------------

    def norm_params(self) -> int:
        """One norm over the hidden size: weight (+ bias for LayerNorm)."""
        return self.hidden_size * (2 if self.norm_kind == "layernorm" else 1)

    def attention_params(self) -> int:
        """All attention projections of one layer (Q/K/V/O or MLA's), with their biases and norms."""
        h, nq = self.hidden_size, self.num_attention_heads
        if self.attention_kind == "mla":
            rope, v, kv_rank = self.qk_rope_head_dim, self.value_head_dim, self.kv_lora_rank
            qk = self.head_dim  # full query/key head dim: nope + rope
            if self.q_lora_rank:
                q = h * self.q_lora_rank + self.q_lora_rank + self.q_lora_rank * nq * qk
            else:
                q = h * nq * qk
            kv = h * (kv_rank + rope) + kv_rank + kv_rank * nq * (qk - rope + v)
            return q + kv + nq * v * h
        qkv = h * (self.query_width + 2 * self.kv_width)
        out = self.query_width * h
        biases = 0
        if self.qkv_bias or self.linear_bias:
            biases += self.query_width + 2 * self.kv_width
        if self.linear_bias:
            biases += h
        qk_norm = 2 * self.head_dim if self.qk_norm else 0
        return qkv + out + biases + qk_norm

    def mlp_params(self, ffn_hidden_size: int | None = None) -> int:
        """One dense MLP (or one expert) of intermediate size ``ffn_hidden_size``."""
        f = ffn_hidden_size or self.ffn_hidden_size
        weights = self.mlp_matrices * self.hidden_size * f
        biases = (f * (self.mlp_matrices - 1) + self.hidden_size) if self.linear_bias else 0
        return weights + biases

    def router_params(self) -> int:
        bias = self.num_routed_experts if self.router_bias else 0
        return self.hidden_size * self.num_routed_experts + bias

    def moe_params(self, active: bool = False) -> int:
        """Experts of one MoE layer: routed (all, or top-k when ``active``) + shared + router."""
        routed = self.num_experts_per_token if active else self.num_routed_experts
        experts = (routed + self.num_shared_experts) * self.mlp_params(self.moe_ffn_hidden_size)
        return experts + self.router_params()

    def layer_params(self, moe_layer: bool, active: bool = False) -> int:
        """One transformer layer: two norms, attention, and its MLP or MoE block."""
        ffn = self.moe_params(active) if moe_layer else self.mlp_params()
        return 2 * self.norm_params() + self.attention_params() + ffn

    def embedding_params(self) -> int:
        """Input token embedding (+ learned positions)."""
        learned = 0
        if self.position_embedding == "learned":
            learned = self.max_position_embeddings * self.hidden_size
        return self.vocab_size * self.hidden_size + learned

    def lm_head_params(self) -> int:
        """Output projection (0 when tied to the input embedding)."""
        return 0 if self.tied_embeddings else self.vocab_size * self.hidden_size

    def mtp_module_params(self) -> int:
        """One DeepSeek-V3 MTP module: two norms, a 2h→h projection, one MoE layer, a norm.

        The embedding and output head are shared with the main model (DeepSeek-V3 §2.2).
        """
        return (
            2 * self.norm_params()
            + 2 * self.hidden_size**2
            + self.layer_params(moe_layer=self.is_moe)
            + self.norm_params()
        )

    def num_params(self, active: bool = False, include_mtp: bool = False) -> int:
        """Total parameters (``active``: only top-k routed experts count)."""
        dense_layers = self.num_dense_layers if self.is_moe else self.num_layers
        total = dense_layers * self.layer_params(moe_layer=False)
        total += self.num_moe_layers * self.layer_params(moe_layer=True, active=active)
        total += self.embedding_params() + self.lm_head_params() + self.norm_params()
        if include_mtp:
            total += self.num_mtp_modules * self.mtp_module_params()
        return total

    def num_active_params(self) -> int:
        """Parameters a token passes through (equal to :meth:`num_params` for dense models)."""
        return self.num_params(active=True)

    def num_matmul_params(self, active: bool = True) -> int:
        """Parameters that take part in matmuls per token: all but the input embedding lookup.

        This is the N of the ``6N`` rule (Kaplan et al. 2020; PaLM Appendix B). With tied
        embeddings the shared matrix still multiplies in the LM head, so it counts once.
        """
        n = self.num_params(active=active) - self.embedding_params()
        return n + (self.vocab_size * self.hidden_size if self.tied_embeddings else 0)


def catalog_model_names() -> list[str]:
    return sorted(path.stem for path in MODELS_DIR.glob("*.toml"))


@functools.cache
def load_model(name: str) -> ModelSpec:
    """A model by catalog slug (``llama3-405b``), a TOML file, or a HF ``config.json`` path."""
    from hwspecs.catalog import looks_like_path, parse_spec, read_toml
    from planner.spec.hf_config import model_from_hf_config

    if not looks_like_path(name) and not Path(name).is_file():
        path = MODELS_DIR / f"{name}.toml"
        if not path.exists():
            raise unknown_name_error("model", name, catalog_model_names())
        return parse_spec(read_toml(path), ModelSpec, name)
    path = Path(name).expanduser()
    if path.suffix == ".toml":
        return parse_spec(read_toml(path), ModelSpec, str(path))
    try:
        config = json.loads(path.read_text())
    except FileNotFoundError:
        raise PlanError(f"file not found: {path}") from None
    except UnicodeDecodeError:
        raise PlanError(f"{path}: not a text file (a config.json is UTF-8 JSON)") from None
    except OSError as error:
        raise PlanError(f"{path}: cannot read: {error.strerror}") from None
    except json.JSONDecodeError as error:
        raise PlanError(f"{path}: malformed JSON: {error}") from None
    if not isinstance(config, dict):
        raise PlanError(f"{path}: a config.json must hold a JSON object")
    return model_from_hf_config(config, source=str(path))

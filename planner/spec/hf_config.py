"""Read a Hugging Face ``config.json`` into a :class:`~planner.spec.model.ModelSpec`.

Field names follow the ``transformers`` configuration classes of each model type
(``LlamaConfig``, ``MixtralConfig``, ``Qwen3MoeConfig``, ``DeepseekV3Config``,
``GptOssConfig``, ``GPT2Config``, ``GPTNeoXConfig``, ...). Only the architecture facts are read; training
hyper-parameters are ignored.
"""

from __future__ import annotations

from collections.abc import Callable

from pydantic import ValidationError

from hwspecs.errors import PlanError, validation_error


def _require(config: dict, key: str, source: str):
    if key not in config:
        raise PlanError(
            f"{source}: config.json lacks '{key}' for model_type '{config['model_type']}'"
        )
    return config[key]


def _llama_like(config: dict, source: str) -> dict:
    """llama, mistral, qwen2, qwen3: RMSNorm, SwiGLU, RoPE, GQA."""
    heads = _require(config, "num_attention_heads", source)
    hidden = _require(config, "hidden_size", source)
    spec = {
        "num_layers": _require(config, "num_hidden_layers", source),
        "hidden_size": hidden,
        "ffn_hidden_size": _require(config, "intermediate_size", source),
        "num_attention_heads": heads,
        "num_kv_heads": config.get("num_key_value_heads") or heads,
        "head_dim": config.get("head_dim") or hidden // heads,
        "vocab_size": _require(config, "vocab_size", source),
        "tied_embeddings": bool(config.get("tie_word_embeddings", False)),
    }
    if config["model_type"] == "qwen2":
        spec["qkv_bias"] = True
    if config["model_type"] in ("qwen3", "qwen3_moe"):
        spec["qk_norm"] = True
    if config.get("attention_bias"):
        spec["qkv_bias"] = True
    return spec | _sliding_window(config, spec["num_layers"])


def _sliding_window(config: dict, num_layers: int) -> dict:
    """Sliding-window layers: those ``layer_types`` names ``sliding_attention`` (GPT-OSS,
    and newer ``transformers`` configurations); under Qwen2's ``use_sliding_window`` the
    layers from ``max_window_layers`` on; Mistral's ``sliding_window`` on every layer."""
    window = config.get("sliding_window")
    if not window:
        return {}
    if config.get("layer_types"):
        count = sum(kind == "sliding_attention" for kind in config["layer_types"])
    elif config["model_type"] in ("qwen2", "qwen3", "qwen3_moe"):
        used = config.get("use_sliding_window")
        count = num_layers - min(config.get("max_window_layers", num_layers), num_layers)
        count = count if used else 0
    else:
        count = num_layers if config["model_type"] in ("mistral", "mixtral") else 0
    return {"sliding_window": window, "num_sliding_window_layers": count} if count else {}


def _mixtral(config: dict, source: str) -> dict:
    spec = _llama_like(config, source)
    spec.update(
        num_routed_experts=_require(config, "num_local_experts", source),
        num_experts_per_token=_require(config, "num_experts_per_tok", source),
        moe_ffn_hidden_size=spec["ffn_hidden_size"],
    )
    return spec


def _gpt_oss(config: dict, source: str) -> dict:
    """GPT-OSS: a Mixtral-like MoE whose attention, router and expert projections all carry
    biases (``attention_bias`` and the experts' ``*_bias`` tensors)."""
    spec = _mixtral(config, source)
    spec.pop("qkv_bias", None)
    return spec | {"linear_bias": True}


def _qwen3_moe(config: dict, source: str) -> dict:
    spec = _llama_like(config, source)
    sparse_step = config.get("decoder_sparse_step", 1)
    if sparse_step != 1 or config.get("mlp_only_layers"):
        raise PlanError(f"{source}: qwen3_moe with dense layers interleaved is not supported")
    spec.update(
        num_routed_experts=_require(config, "num_experts", source),
        num_experts_per_token=_require(config, "num_experts_per_tok", source),
        moe_ffn_hidden_size=_require(config, "moe_intermediate_size", source),
    )
    return spec


def _deepseek_v3(config: dict, source: str) -> dict:
    nope = _require(config, "qk_nope_head_dim", source)
    rope = _require(config, "qk_rope_head_dim", source)
    return {
        "num_layers": _require(config, "num_hidden_layers", source),
        "hidden_size": _require(config, "hidden_size", source),
        "ffn_hidden_size": _require(config, "intermediate_size", source),
        "num_attention_heads": _require(config, "num_attention_heads", source),
        "num_kv_heads": _require(config, "num_attention_heads", source),
        "head_dim": nope + rope,
        "vocab_size": _require(config, "vocab_size", source),
        "tied_embeddings": bool(config.get("tie_word_embeddings", False)),
        "attention_kind": "mla",
        "q_lora_rank": config.get("q_lora_rank"),
        "kv_lora_rank": _require(config, "kv_lora_rank", source),
        "qk_rope_head_dim": rope,
        "v_head_dim": _require(config, "v_head_dim", source),
        "num_routed_experts": _require(config, "n_routed_experts", source),
        "num_shared_experts": config.get("n_shared_experts") or 0,
        "num_experts_per_token": _require(config, "num_experts_per_tok", source),
        "moe_ffn_hidden_size": _require(config, "moe_intermediate_size", source),
        "num_dense_layers": config.get("first_k_dense_replace", 0),
        "router_bias": config.get("topk_method") == "noaux_tc",
        # Group-limited routing: a token's experts lie in topk_group of n_group expert groups
        # (one group per node is DeepSeek-V3's node limit M, report §2.1.2); one group is none.
        **_group_limit(config),
        "num_mtp_modules": config.get("num_nextn_predict_layers", 0),
    }


def _group_limit(config: dict) -> dict:
    """The router's group limit (HF ``n_group``, ``topk_group``), where it limits anything."""
    groups, limit = config.get("n_group") or 1, config.get("topk_group")
    if groups <= 1 or not limit or limit >= groups:
        return {}
    return {"num_expert_groups": groups, "max_nodes_per_token": limit}


def _gpt2(config: dict, source: str) -> dict:
    hidden = _require(config, "n_embd", source)
    return {
        "num_layers": _require(config, "n_layer", source),
        "hidden_size": hidden,
        "ffn_hidden_size": config.get("n_inner") or 4 * hidden,
        "num_attention_heads": _require(config, "n_head", source),
        "vocab_size": _require(config, "vocab_size", source),
        "tied_embeddings": True,
        "mlp_kind": "gelu",
        "norm_kind": "layernorm",
        "linear_bias": True,
        "position_embedding": "learned",
        "max_position_embeddings": _require(config, "n_positions", source),
        "dropout": config.get("resid_pdrop", 0.1),
    }


def _gpt_neox(config: dict, source: str) -> dict:
    return {
        "num_layers": _require(config, "num_hidden_layers", source),
        "hidden_size": _require(config, "hidden_size", source),
        "ffn_hidden_size": _require(config, "intermediate_size", source),
        "num_attention_heads": _require(config, "num_attention_heads", source),
        "vocab_size": _require(config, "vocab_size", source),
        "tied_embeddings": bool(config.get("tie_word_embeddings", False)),
        "mlp_kind": "gelu",
        "norm_kind": "layernorm",
        "linear_bias": True,
    }


HF_MODEL_TYPES: dict[str, Callable[[dict, str], dict]] = {
    "llama": _llama_like,
    "mistral": _llama_like,
    "qwen2": _llama_like,
    "qwen3": _llama_like,
    "mixtral": _mixtral,
    "gpt_oss": _gpt_oss,
    "qwen3_moe": _qwen3_moe,
    "deepseek_v3": _deepseek_v3,
    "gpt2": _gpt2,
    "gpt_neox": _gpt_neox,
}


def model_from_hf_config(config: dict, source: str):
    """Build a ModelSpec from a parsed HF config.json (one-line PlanError on problems)."""
    from planner.spec.model import ModelSpec

    model_type = config.get("model_type")
    if model_type not in HF_MODEL_TYPES:
        raise PlanError(
            f"{source}: unsupported model_type '{model_type}'; supported: "
            f"{', '.join(sorted(HF_MODEL_TYPES))}"
        )
    fields = HF_MODEL_TYPES[model_type](config, source)
    fields["name"] = config.get("_name_or_path") or f"{model_type} ({source})"
    fields = {key: value for key, value in fields.items() if value is not None}
    try:
        return ModelSpec.model_validate(fields)
    except ValidationError as error:
        raise validation_error(error, source) from None

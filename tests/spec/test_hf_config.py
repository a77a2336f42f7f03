"""Hugging Face config.json loading gives the same shapes and counts as the catalog."""

import json

import pytest

from hwspecs.errors import PlanError
from planner.spec.model import load_model

# Architecture fields as published in each model's config.json on the Hugging Face hub.
HF_CONFIGS = {
    "llama3-405b": {
        "model_type": "llama",
        "hidden_size": 16384,
        "intermediate_size": 53248,
        "num_attention_heads": 128,
        "num_hidden_layers": 126,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
        "tie_word_embeddings": False,
    },
    "llama3-8b": {
        "model_type": "llama",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_attention_heads": 32,
        "num_hidden_layers": 32,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
        "tie_word_embeddings": False,
    },
    "mixtral-8x7b": {
        "model_type": "mixtral",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_attention_heads": 32,
        "num_hidden_layers": 32,
        "num_key_value_heads": 8,
        "vocab_size": 32000,
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
        "tie_word_embeddings": False,
    },
    "qwen3-235b-a22b": {
        "model_type": "qwen3_moe",
        "hidden_size": 4096,
        "intermediate_size": 12288,
        "moe_intermediate_size": 1536,
        "num_attention_heads": 64,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "num_hidden_layers": 94,
        "vocab_size": 151936,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "tie_word_embeddings": False,
    },
    "deepseek-v3": {
        "model_type": "deepseek_v3",
        "hidden_size": 7168,
        "intermediate_size": 18432,
        "moe_intermediate_size": 2048,
        "num_attention_heads": 128,
        "num_key_value_heads": 128,
        "num_hidden_layers": 61,
        "vocab_size": 129280,
        "q_lora_rank": 1536,
        "kv_lora_rank": 512,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
        "n_routed_experts": 256,
        "n_shared_experts": 1,
        "num_experts_per_tok": 8,
        "first_k_dense_replace": 3,
        "topk_method": "noaux_tc",
        "n_group": 8,
        "topk_group": 4,
        "num_nextn_predict_layers": 1,
        "tie_word_embeddings": False,
    },
}


@pytest.mark.parametrize("name", sorted(HF_CONFIGS))
def test_hf_config_matches_catalog(tmp_path, name):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(HF_CONFIGS[name]))
    loaded, catalog = load_model(str(path)), load_model(name)
    assert loaded.num_params() == catalog.num_params()
    assert loaded.num_active_params() == catalog.num_active_params()
    assert loaded.attention_kind == catalog.attention_kind


def test_group_limited_routing_reads_the_router_groups(tmp_path):
    """HF ``n_group``/``topk_group`` are the router's group limit (DeepSeek-V3: 4 of 8, as the
    catalog has it); one group (Kimi K2's n_group 1, topk_group 1) limits nothing."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(HF_CONFIGS["deepseek-v3"]))
    loaded, catalog = load_model(str(path)), load_model("deepseek-v3")
    assert (loaded.num_expert_groups, loaded.max_nodes_per_token) == (8, 4)
    assert (catalog.num_expert_groups, catalog.max_nodes_per_token) == (8, 4)
    path = tmp_path / "ungrouped" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps({**HF_CONFIGS["deepseek-v3"], "n_group": 1, "topk_group": 1}))
    ungrouped = load_model(str(path))
    assert (ungrouped.num_expert_groups, ungrouped.max_nodes_per_token) == (None, None)


def test_gpt2_small_has_124m_parameters(tmp_path):
    path = tmp_path / "config.json"
    config = {
        "model_type": "gpt2",
        "n_embd": 768,
        "n_layer": 12,
        "n_head": 12,
        "vocab_size": 50257,
        "n_positions": 1024,
    }
    path.write_text(json.dumps(config))
    # GPT-2 small: 124,439,808 parameters (tied embeddings), as transformers reports.
    assert load_model(str(path)).num_params() == 124_439_808


def test_pythia_gpt_neox_160m(tmp_path):
    path = tmp_path / "config.json"
    config = {
        "model_type": "gpt_neox",
        "hidden_size": 768,
        "intermediate_size": 3072,
        "num_attention_heads": 12,
        "num_hidden_layers": 12,
        "vocab_size": 50304,
        "tie_word_embeddings": False,
    }
    path.write_text(json.dumps(config))
    # EleutherAI/pythia-160m: 162,322,944 parameters.
    assert load_model(str(path)).num_params() == 162_322_944


def test_qwen2_has_qkv_bias(tmp_path):
    path = tmp_path / "config.json"
    config = {
        "model_type": "qwen2",
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "num_hidden_layers": 24,
        "vocab_size": 151936,
        "tie_word_embeddings": True,
    }
    path.write_text(json.dumps(config))
    # Qwen2-0.5B: 494,032,768 parameters.
    assert load_model(str(path)).num_params() == 494_032_768


def test_unknown_model_type_is_one_line_error(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(PlanError, match="unsupported model_type 'bert'") as error:
        load_model(str(path))
    assert "\n" not in str(error.value)


def test_malformed_json_is_one_line_error(tmp_path):
    path = tmp_path / "config.json"
    path.write_text("{not json")
    with pytest.raises(PlanError, match="malformed JSON"):
        load_model(str(path))


def test_missing_field_names_it(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))
    with pytest.raises(PlanError, match="lacks 'num_attention_heads'"):
        load_model(str(path))


def test_missing_file(tmp_path):
    with pytest.raises(PlanError, match="file not found"):
        load_model(str(tmp_path / "nope" / "config.json"))


# openai/gpt-oss-120b config.json's architecture fields (18 of its 36 layers attend over a
# 128-token sliding window, alternating with full attention).
GPT_OSS_120B = {
    "model_type": "gpt_oss",
    "hidden_size": 2880,
    "intermediate_size": 2880,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "num_hidden_layers": 36,
    "num_local_experts": 128,
    "num_experts_per_tok": 4,
    "vocab_size": 201088,
    "sliding_window": 128,
    "layer_types": ["sliding_attention", "full_attention"] * 18,
    "attention_bias": True,
    "tie_word_embeddings": False,
}


def test_gpt_oss_reads_its_sliding_window_layers_as_the_catalog_has_them(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(GPT_OSS_120B))
    model, catalog = load_model(str(path)), load_model("gpt-oss-120b")
    assert (model.sliding_window, model.num_sliding_window_layers) == (128, 18)
    assert model.num_params() == catalog.num_params()
    assert model.num_active_params() == catalog.num_active_params()
    assert model.linear_bias and model.attention_kind == catalog.attention_kind == "gqa"


QWEN2_WINDOWED_FROM_LAYER_16 = {
    "model_type": "qwen2",
    "sliding_window": 4096,
    "use_sliding_window": True,
    "max_window_layers": 16,
}


@pytest.mark.parametrize(
    ("extra", "windowed"),
    [
        ({"model_type": "mistral", "sliding_window": 4096}, 24),  # Mistral 7B v0.1: every layer
        ({"model_type": "mistral", "sliding_window": None}, 0),
        ({"model_type": "qwen2", "sliding_window": 4096, "use_sliding_window": False}, 0),
        (QWEN2_WINDOWED_FROM_LAYER_16, 8),
    ],
)
def test_sliding_window_layers_follow_each_model_types_fields(tmp_path, extra, windowed):
    path = tmp_path / "config.json"
    shape = {"hidden_size": 1024, "intermediate_size": 4096, "num_attention_heads": 16,
             "num_key_value_heads": 8, "num_hidden_layers": 24, "vocab_size": 32000}  # fmt: skip
    config = shape | extra
    path.write_text(json.dumps(config))
    assert load_model(str(path)).num_sliding_window_layers == windowed

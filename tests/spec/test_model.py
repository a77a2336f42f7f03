"""Parameter counts of the catalog models against their published totals."""

import pytest

from hwspecs.errors import PlanError
from planner.spec.model import catalog_model_names, load_model

# (model, published total, published active, relative tolerance). Sources: Llama 3 paper
# (405B; HF model cards 8.03B / 70.6B), GPT-3 Table 2.1 (175.0B), Mixtral paper §2.1
# (46.7B / 12.9B), Mistral AI (141B / 39B), DeepSeek-V3 report (671B / 37B without MTP),
# Qwen3 report Table 2 (235B / 22B).
PUBLISHED = [
    ("llama3-8b", 8.03e9, 8.03e9, 0.002),
    ("llama3-70b", 70.55e9, 70.55e9, 0.002),
    ("llama3-405b", 405.8e9, 405.8e9, 0.001),
    ("gpt3-175b", 175.0e9, 175.0e9, 0.005),
    ("mixtral-8x7b", 46.7e9, 12.9e9, 0.003),
    ("mixtral-8x22b", 141e9, 39e9, 0.005),
    ("deepseek-v3", 671e9, 37e9, 0.02),
    ("qwen3-235b-a22b", 235e9, 22e9, 0.01),
]


@pytest.mark.parametrize(("name", "total", "active", "tolerance"), PUBLISHED)
def test_parameter_count_matches_published(name, total, active, tolerance):
    model = load_model(name)
    assert model.num_params() == pytest.approx(total, rel=tolerance)
    assert model.num_active_params() == pytest.approx(active, rel=max(tolerance, 0.015))


def test_gpt_oss_120b_counts_as_its_model_card():
    """116.83B total and 5.13B active per token (OpenAI's gpt-oss model card, Table 1),
    whose active count leaves out the 201,088 × 2,880 embedding table (a lookup)."""
    model = load_model("gpt-oss-120b")
    assert model.num_params() == pytest.approx(116.83e9, rel=0.001)
    assert model.num_active_params() - model.embedding_params() == pytest.approx(5.13e9, rel=0.002)
    assert (model.sliding_window, model.num_sliding_window_layers) == (128, 18)


def test_every_catalog_model_is_checked():
    checked = [name for name, *_ in PUBLISHED] + ["gpt-oss-120b"]
    assert sorted(checked) == catalog_model_names()


def test_deepseek_v3_total_is_671b_without_and_about_685b_with_mtp():
    model = load_model("deepseek-v3")
    assert round(model.num_params() / 1e9) == 671
    # The released checkpoint is 685B: 671B + the 14B MTP module, whose embedding and head
    # copies (2 × 0.93B) are stored again; the shared-weight module alone is ~11.6B.
    mtp = model.num_params(include_mtp=True) - model.num_params()
    assert 11e9 < mtp < 14e9


def test_llama3_405b_is_gqa_with_head_dim_128():
    model = load_model("llama3-405b")
    assert model.attention_kind == "gqa"
    assert model.head_dim == 128
    assert model.kv_width == 1024


def test_dense_model_active_equals_total():
    model = load_model("llama3-70b")
    assert model.num_active_params() == model.num_params()


def test_unknown_model_suggests_closest():
    with pytest.raises(PlanError, match="did you mean 'llama3-405b'"):
        load_model("llama3-450b")

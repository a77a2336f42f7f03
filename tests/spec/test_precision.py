"""Bytes per parameter against ZeRO Figure 1 and Megatron-LM's figures."""

from typing import get_args

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hwspecs.errors import PlanError
from planner.spec.precision import (
    PrecisionName,
    PrecisionSpec,
    sharded_bytes_per_param,
    unsharded_bytes_per_param,
)

MIXED = PrecisionSpec()


@pytest.mark.parametrize(
    ("zero_stage", "published_gb"),
    [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.9)],
)
def test_zero_figure_1(zero_stage, published_gb):
    # Ψ = 7.5B, N_d = 64, K = 12 (mixed-precision Adam).
    per_device = sharded_bytes_per_param(MIXED, zero_stage, 64).total * 7.5e9 / 1e9
    assert per_device == pytest.approx(published_gb, abs=0.05)


def test_default_mixed_adamw_is_16_bytes():
    assert unsharded_bytes_per_param(MIXED).total == 16


def test_megatron_18_bytes_with_fp32_gradients():
    assert unsharded_bytes_per_param(PrecisionSpec(grad_dtype="fp32")).total == 18


@pytest.mark.parametrize("dp", [1, 8, 64, 512])
def test_megatron_distributed_optimizer_is_6_plus_12_over_dp(dp):
    parts = sharded_bytes_per_param(PrecisionSpec(grad_dtype="fp32"), zero_stage=1, dp=dp)
    assert parts.total == pytest.approx(6 + 12 / dp)


def test_zero1_over_64_is_4_plus_12_over_64():
    assert sharded_bytes_per_param(MIXED, 1, 64).total == pytest.approx(4 + 12 / 64)


def test_deepseek_fp8_recipe_has_fp32_master_and_grads_and_bf16_moments():
    parts = unsharded_bytes_per_param(PrecisionSpec(recipe="fp8-mixed"))
    assert (parts.weights, parts.gradients, parts.master_weights, parts.optimizer_states) == (
        2,
        4,
        4,
        4,
    )


def test_nvfp4_recipe_keeps_megatron_bridge_bf16_mixed_states():
    """Megatron-Bridge's bf16_with_nvfp4_mixed is bf16_mixed with NVFP4 GEMMs: BF16 weights,
    FP32 main gradients, master weights and AdamW moments (18 bytes)."""
    recipe = PrecisionSpec(recipe="fp4-mixed")
    parts = unsharded_bytes_per_param(recipe)
    assert (parts.weights, parts.gradients, parts.master_weights) == (2, 4, 4)
    assert parts.optimizer_states == 8 and parts.total == 18
    assert recipe.gemm_dtype == "fp4" and recipe.activation_bytes == 2


def test_optimizer_state_counts():
    def states(optimizer):
        return unsharded_bytes_per_param(PrecisionSpec(optimizer=optimizer)).optimizer_states

    assert states("adamw") == 8
    assert states("sgd-momentum") == states("lion") == states("muon") == 4


def test_bad_zero_stage():
    with pytest.raises(PlanError, match="zero_stage must be 0, 1, 2 or 3"):
        sharded_bytes_per_param(MIXED, 4, 8)


recipes = st.builds(
    PrecisionSpec,
    recipe=st.sampled_from(get_args(PrecisionName)),
    optimizer=st.sampled_from(["adamw", "sgd-momentum", "lion", "muon", "adafactor"]),
)


@given(recipe=recipes, stage=st.integers(0, 3), dp=st.integers(1, 4096))
def test_shards_over_dp_sum_to_the_whole(recipe, stage, dp):
    whole = unsharded_bytes_per_param(recipe)
    shard = sharded_bytes_per_param(recipe, stage, dp)
    factors = {"weights": 3, "gradients": 2, "master_weights": 1, "optimizer_states": 1}
    for part, first_sharded_stage in factors.items():
        copies = dp if stage >= first_sharded_stage else 1
        assert getattr(shard, part) * copies == pytest.approx(getattr(whole, part))


@given(recipe=recipes, stage=st.integers(0, 3), dp=st.integers(1, 2048), more=st.integers(1, 8))
def test_more_dp_never_raises_model_state_memory(recipe, stage, dp, more):
    assert (
        sharded_bytes_per_param(recipe, stage, dp * more).total
        <= sharded_bytes_per_param(recipe, stage, dp).total
    )

"""Optimizer step cost: Muon's one buffer vs AdamW's two, Newton–Schulz FLOPs, Muon under ZeRO."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hwspecs.errors import PlanError
from planner.cost.optimizers import (
    muon_distribution,
    muon_matrix_shapes,
    newton_schulz_flops,
    optimizer_step_cost,
    optimizer_step_time,
    update_bytes_per_param,
)
from planner.spec.model import load_model
from planner.spec.precision import (
    PrecisionSpec,
    _norm_and_bias_params,
    unsharded_bytes_per_param,
)

LLAMA3_8B = load_model("llama3-8b")
SHAPES = muon_matrix_shapes(LLAMA3_8B)
MATRIX_PARAMS = sum(rows * cols * count for rows, cols, count in SHAPES)


def test_muon_keeps_one_buffer_where_adamw_keeps_two():
    adamw = unsharded_bytes_per_param(PrecisionSpec(optimizer="adamw")).optimizer_states
    muon = unsharded_bytes_per_param(PrecisionSpec(optimizer="muon")).optimizer_states
    assert (adamw, muon) == (8, 4)  # FP32 m and v vs one FP32 momentum
    adamw_read, adamw_written = update_bytes_per_param(PrecisionSpec(optimizer="adamw"))
    muon_read, muon_written = update_bytes_per_param(PrecisionSpec(optimizer="muon"))
    assert adamw_read - muon_read == adamw_written - muon_written == 4


def test_adamw_update_moves_grad_master_and_two_moments():
    # Read BF16 grad + FP32 master, m, v; write FP32 master, m, v and the BF16 weight.
    assert update_bytes_per_param(PrecisionSpec()) == (2 + 12, 12 + 2)


def test_muon_matrices_are_everything_but_embeddings_head_and_vectors():
    vectors = _norm_and_bias_params(LLAMA3_8B)
    outside = LLAMA3_8B.embedding_params() + LLAMA3_8B.lm_head_params() + vectors
    matrices = MATRIX_PARAMS
    assert matrices == LLAMA3_8B.num_params() - outside


def test_muon_matrices_of_moe_and_mla_models_add_up_too():
    for name in ("mixtral-8x7b", "deepseek-v3"):
        model = load_model(name)
        matrices = sum(r * c * n for r, c, n in muon_matrix_shapes(model))
        outside = model.embedding_params() + model.lm_head_params() + _norm_and_bias_params(model)
        assert matrices == model.num_params() - outside


def test_newton_schulz_counts_the_three_gemms_of_the_quintic():
    # m = 1024 ≤ n = 4096: X·Xᵀ 2m²n, A·A 2m³, B·X 2m²n per iteration.
    m, n = 1024, 4096
    per_iteration = 2 * m * m * n + 2 * m**3 + 2 * m * m * n
    assert newton_schulz_flops(m, n) == 5 * per_iteration
    assert newton_schulz_flops(n, m) == newton_schulz_flops(m, n)  # tall matrices transpose
    assert newton_schulz_flops(m, n, iterations=3) == 3 * per_iteration


@given(rows=st.integers(1, 20000), cols=st.integers(1, 20000), k=st.integers(1, 10))
def test_newton_schulz_is_linear_in_iterations(rows, cols, k):
    assert newton_schulz_flops(rows, cols, k) == pytest.approx(
        k * newton_schulz_flops(rows, cols, 1)
    )


def test_non_muon_optimizers_have_no_orthogonalization_or_extra_traffic():
    for optimizer in ("adamw", "sgd-momentum", "lion", "adafactor", "sgd"):
        cost = optimizer_step_cost(
            PrecisionSpec(optimizer=optimizer), LLAMA3_8B.num_params(), SHAPES, dp=8, zero_stage=1
        )
        assert cost.newton_schulz_flops == cost.extra_comm_bytes == cost.muon_params_per_gpu == 0


def test_zero1_shards_the_update_over_dp():
    whole = optimizer_step_cost(PrecisionSpec(), 1e9, dp=8, zero_stage=0)
    shard = optimizer_step_cost(PrecisionSpec(), 1e9, dp=8, zero_stage=1)
    assert shard.bytes_moved == pytest.approx(whole.bytes_moved / 8)
    assert whole.bytes_moved == pytest.approx(1e9 * 28)


@pytest.mark.parametrize("dp", [2, 8, 64])
def test_muon_under_zero_gather_vs_owner(dp):
    def cost(scheme):
        return optimizer_step_cost(
            PrecisionSpec(optimizer="muon"),
            LLAMA3_8B.num_params(),
            SHAPES,
            dp=dp,
            zero_stage=1,
            muon_scheme=scheme,
        )

    gather, owner = cost("gather"), cost("owner")
    assert gather.extra_comm_bytes == pytest.approx((dp - 1) / dp * MATRIX_PARAMS * 2)
    assert owner.extra_comm_bytes == pytest.approx(2 * (dp - 1) / dp**2 * MATRIX_PARAMS * 2)
    assert owner.newton_schulz_flops == pytest.approx(gather.newton_schulz_flops / dp)


def test_muon_needs_no_gather_without_sharding():
    assert muon_distribution(1, 1, "gather") == (0.0, 1.0)
    assert muon_distribution(8, 0, "gather") == (0.0, 1.0)
    assert muon_distribution(8, 0, "owner") == (7 / 8, 1 / 8)  # all-gather of the updates


def test_step_time_adds_its_parts():
    cost = optimizer_step_cost(
        PrecisionSpec(optimizer="muon"), LLAMA3_8B.num_params(), SHAPES, dp=8, zero_stage=1
    )
    time = optimizer_step_time(cost, 2e12, 8e14, 3e11)
    assert time.elementwise_s == pytest.approx(cost.bytes_moved / 2e12)
    assert time.newton_schulz_s == pytest.approx(cost.newton_schulz_flops / 8e14)
    assert time.extra_comm_s == pytest.approx(cost.extra_comm_bytes / 3e11)
    assert time.total_s == pytest.approx(
        time.elementwise_s + time.newton_schulz_s + time.extra_comm_s
    )


def test_bad_scheme_is_an_error():
    with pytest.raises(PlanError, match="gather or owner"):
        muon_distribution(8, 1, "scatter")

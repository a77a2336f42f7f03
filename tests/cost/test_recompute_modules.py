"""Megatron-Core's selective recompute modules (``--recompute-modules``): what each drops
from a layer's stored tensors and what it reruns, per Megatron-Bridge's
``docs/training/activation-recomputation.md`` (NVIDIA-NeMo/Megatron-Bridge @067f987)."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hwspecs.catalog import load_accelerator
from hwspecs.errors import PlanError
from planner.cost.activations import (
    ActivationShape,
    activation_bytes_per_layer,
    layer_activation_tensors,
)
from planner.cost.compute import GpuRates
from planner.cost.flops import model_ops_per_sequence, recompute_flops_per_token
from planner.cost.stage_times import shape_times
from planner.spec.measures import MEASURE_SETS
from planner.spec.model import load_model
from planner.spec.recompute import (
    MEGATRON_MODULES,
    checked_recompute,
    model_modules,
    module_policies,
    recompute_modules,
)

SEQ, MBS = 4096, 1


def tensors(model, recompute, moe_layer=False, measures="none", tp=1):
    shape = ActivationShape(
        seq_len=SEQ, micro_batch_size=MBS, tp=tp, sequence_parallel=tp > 1,
        recompute=recompute, measures=MEASURE_SETS[measures],
    )  # fmt: skip
    return layer_activation_tensors(model, shape, moe_layer)


def test_names_are_canonical_and_core_attn_alone_is_selective():
    assert checked_recompute("moe_act+layernorm") == "layernorm+moe_act"
    assert checked_recompute("core_attn") == "selective"
    assert recompute_modules("selective") == {"core_attn"}
    assert recompute_modules("full") == recompute_modules("none") == frozenset()
    with pytest.raises(PlanError, match="'moe' is not modelled"):
        checked_recompute("moe_act+moe")
    with pytest.raises(PlanError, match="core_attn, layernorm"):
        checked_recompute("layernorm+attention")


def test_the_modules_a_model_has():
    assert model_modules(load_model("llama3-405b")) == ("core_attn", "layernorm", "mlp")
    assert model_modules(load_model("deepseek-v3")) == MEGATRON_MODULES  # MLA, 3 dense layers
    assert model_modules(load_model("mixtral-8x7b")) == ("core_attn", "layernorm", "moe_act")
    assert len(module_policies(load_model("deepseek-v3"))) == 2**6 - 1


def test_layernorm_drops_the_two_norm_outputs():
    model = load_model("llama3-70b")
    h, tokens = model.hidden_size, SEQ * MBS
    kept = activation_bytes_per_layer(model, ActivationShape(seq_len=SEQ, micro_batch_size=MBS))
    shape = ActivationShape(seq_len=SEQ, micro_batch_size=MBS, recompute="layernorm")
    assert kept - activation_bytes_per_layer(model, shape) == pytest.approx(2 * tokens * h * 2)


def test_mlp_drops_the_dense_mlp_and_its_input_and_nothing_in_moe_layers():
    model = load_model("deepseek-v3")
    f, h, tokens = model.ffn_hidden_size, model.hidden_size, SEQ * MBS
    dense = tensors(model, "none")
    rerun = tensors(model, "mlp")
    assert set(dense) - set(rerun) == {"mlp.intermediate", "mlp.up_input"}
    assert sum(dense.values()) - sum(rerun.values()) == pytest.approx((3 * f + h) * tokens * 2)
    assert tensors(model, "mlp", moe_layer=True) == tensors(model, "none", moe_layer=True)


def test_mla_up_proj_drops_queries_keys_values_and_keeps_the_latents():
    model = load_model("deepseek-v3")
    rerun = tensors(model, "mla_up_proj")
    assert "attention.query" not in rerun and "attention.key_value" not in rerun
    assert rerun["attention.latents"] == tensors(model, "none")["attention.latents"]
    llama = load_model("llama3-70b")  # no MLA: nothing to rerun
    assert tensors(llama, "mla_up_proj") == tensors(llama, "none")


@pytest.mark.parametrize(
    ("measures", "dropped"),
    [("none", 1 / 3), ("te-fp8", (1 / 2) / (2 + 1 / 2)), ("deepseek-v3", 0.0)],
)
def test_moe_act_drops_the_activation_output_as_it_is_stored(measures, dropped):
    """SwiGLU stores gate, up and their product; the product is the down projection's
    input, one byte under TE's FP8 caches, already not kept under DeepSeek-V3's."""
    model = load_model("deepseek-v3")
    kwargs = {"moe_layer": True, "measures": measures}
    before = tensors(model, "none", **kwargs)["moe.expert_intermediate"]
    after = tensors(model, "moe_act", **kwargs)["moe.expert_intermediate"]
    assert after == pytest.approx(before * (1 - dropped))


def test_shared_experts_drop_their_intermediates():
    model = load_model("deepseek-v3")
    assert "moe.shared_intermediate" not in tensors(model, "shared_experts", moe_layer=True)


@given(
    st.sets(st.sampled_from(MEGATRON_MODULES), min_size=1),
    st.booleans(),
    st.sampled_from([1, 2, 8]),
)
def test_more_modules_never_keep_more_and_full_keeps_least(modules, moe_layer, tp):
    model = load_model("deepseek-v3")
    policy = checked_recompute("+".join(sorted(modules)))
    kept = sum(tensors(model, policy, moe_layer, tp=tp).values())
    for module in modules:
        fewer = modules - {module}
        smaller = checked_recompute("+".join(sorted(fewer))) if fewer else "none"
        assert kept <= sum(tensors(model, smaller, moe_layer, tp=tp).values()) + 1e-6
    assert kept >= sum(tensors(model, "full", moe_layer, tp=tp).values())


def _times(model, measures=None):
    accelerator = load_accelerator("h100-sxm")
    rates = GpuRates.of(accelerator, "bf16")
    return shape_times(model, SEQ, MBS, 1, 1, 8, False, True, rates, 2.0, measures=measures)


def test_rerun_time_is_each_modules_forward():
    model = load_model("deepseek-v3")
    times = _times(model)
    forward = {op.name: op.forward_s for op in times.moe.ops}
    assert times.moe.recompute_s("selective") == pytest.approx(forward["attention.core"])
    both = times.moe.recompute_s("core_attn+mla_up_proj")
    up = forward["attention.q_up_proj"] + forward["attention.kv_up_proj"]
    assert both == pytest.approx(forward["attention.core"] + up + forward["elementwise.rotary"])
    dense = {op.name: op.forward_s for op in times.dense.ops}
    mlp = dense["mlp"] + dense["elementwise.mlp_activation"]
    assert times.dense.recompute_s("mlp") == pytest.approx(mlp)
    assert times.moe.recompute_s("mlp") == 0.0  # no dense MLP in a MoE layer
    assert times.moe.recompute_s("layernorm") == pytest.approx(
        0.4 * forward["elementwise.norms_residuals"]  # 2×2 of the 2×2 + 2×3 passes
    )
    every = "+".join(MEGATRON_MODULES)
    assert times.moe.recompute_s(every) < times.moe.recompute_s("full")


def test_a_module_a_measure_reruns_is_paid_once():
    model = load_model("deepseek-v3")
    measured = _times(model, MEASURE_SETS["deepseek-v3"]).moe
    assert measured.recompute_s("layernorm+mla_up_proj+moe_act") == pytest.approx(
        measured.recompute_s("none")
    )


def test_hfu_counts_the_rerun_gemms():
    model = load_model("deepseek-v3")
    ops = {op.name: op.forward for op in model_ops_per_sequence(model, SEQ)}
    mlp = recompute_flops_per_token(model, SEQ, "mlp+shared_experts")
    assert mlp * SEQ == pytest.approx(ops["mlp"] + ops["moe.shared_experts"])
    assert recompute_flops_per_token(model, SEQ, "layernorm+moe_act") == 0.0  # element-wise
    assert recompute_flops_per_token(model, SEQ, "core_attn+layernorm") == pytest.approx(
        recompute_flops_per_token(model, SEQ, "selective")
    )

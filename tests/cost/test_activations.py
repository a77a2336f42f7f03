"""Activation accounting against Korthikanti et al. 2022, Table 2 (16-bit activations)."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from planner.cost.activations import (
    ActivationShape,
    activation_bytes_per_layer,
    layer_activation_tensors,
)
from planner.spec.model import ModelSpec, load_model


def gpt_layer(hidden: int, heads: int) -> ModelSpec:
    """Korthikanti's layer: LayerNorm, MHA, 4h GELU MLP, dropout, (no flash attention)."""
    return ModelSpec(
        name="gpt",
        num_layers=1,
        hidden_size=hidden,
        ffn_hidden_size=4 * hidden,
        num_attention_heads=heads,
        vocab_size=51200,
        mlp_kind="gelu",
        norm_kind="layernorm",
        linear_bias=True,
        dropout=0.1,
    )


SHAPES = [(2048, 1, 12288, 96), (2048, 4, 4096, 32), (4096, 2, 8192, 64)]


def korthikanti(s, b, h, a, t=1, sp=False, selective=False):
    scores = 0 if selective else 5 * a * s / (h * t)
    if sp:
        return s * b * h * (34 / t + scores)
    return s * b * h * (10 + 24 / t + scores) if t > 1 else s * b * h * (34 + scores)


@pytest.mark.parametrize(("s", "b", "h", "a"), SHAPES)
@pytest.mark.parametrize("t", [1, 2, 8])
@pytest.mark.parametrize("sp", [False, True])
@pytest.mark.parametrize("recompute", ["none", "selective"])
def test_table2_exactly(s, b, h, a, t, sp, recompute):
    shape = ActivationShape(
        seq_len=s,
        micro_batch_size=b,
        tp=t,
        sequence_parallel=sp and t > 1,
        flash_attention=False,
        recompute=recompute,
    )
    expected = korthikanti(s, b, h, a, t, sp and t > 1, recompute == "selective")
    assert activation_bytes_per_layer(gpt_layer(h, a), shape) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(("s", "b", "h", "a"), SHAPES)
def test_full_recompute_keeps_2sbh(s, b, h, a):
    shape = ActivationShape(seq_len=s, micro_batch_size=b, flash_attention=False, recompute="full")
    assert activation_bytes_per_layer(gpt_layer(h, a), shape) == 2 * s * b * h


def test_flash_attention_removes_the_score_term():
    model = gpt_layer(12288, 96)
    plain = ActivationShape(seq_len=2048, micro_batch_size=1, flash_attention=False)
    flash = plain.model_copy(update={"flash_attention": True})
    s, a = 2048, 96
    # The 5as²b score tensors go; the FP32 log-sum-exp (4·a·s·b bytes) comes.
    difference = activation_bytes_per_layer(model, plain) - activation_bytes_per_layer(model, flash)
    assert difference == pytest.approx(5 * a * s * s - 4 * a * s)


def test_llama_layer_constants_are_derived_for_gqa_and_swiglu():
    """Llama 3 405B layer (s b h units): 2+2 norm inputs, 2 qkv input, 2 Q, 2·(1024/16384)·2 K/V,
    2 out-proj input, 2 up input, 3·(53248/16384)·2 SwiGLU = 33.75 sbh + the FP32 LSE."""
    model = load_model("llama3-405b")
    s, h = 8192, 16384
    shape = ActivationShape(seq_len=s, micro_batch_size=1)
    tensors = layer_activation_tensors(model, shape)
    no_lse = sum(v for k, v in tensors.items() if k != "attention.softmax_lse")
    assert no_lse / (s * h) == pytest.approx(2 + 2 + 2 + 0.25 + 2 + 2 + 2 + 19.5)
    assert tensors["attention.softmax_lse"] == 4 * 128 * s


@given(t=st.sampled_from([1, 2, 4, 8]), cp=st.sampled_from([1, 2, 4]), b=st.integers(1, 4))
def test_sequence_parallel_and_cp_split_every_tensor(t, cp, b):
    model = load_model("llama3-8b")
    whole = activation_bytes_per_layer(model, ActivationShape(seq_len=4096, micro_batch_size=b))
    split = ActivationShape(seq_len=4096, micro_batch_size=b, tp=t, cp=cp, sequence_parallel=True)
    # KV heads (8) split evenly up to tp 8, so every tensor shrinks by exactly tp·cp.
    assert activation_bytes_per_layer(model, split) * t * cp == pytest.approx(whole)


def test_backward_working_bytes_is_the_swiglu_gradients_at_its_peak():
    """Incoming gradient plus the gate and up gradients: 3·s·b·f/tp elements (SwiGLU)."""
    from planner.cost.activations import ActivationShape, backward_working_bytes
    from planner.spec.model import load_model

    model = load_model("llama3-405b")
    shape = ActivationShape(seq_len=8192, micro_batch_size=1, tp=8, element_bytes=2)
    assert backward_working_bytes(model, shape) == 3 * 8192 * 53248 * 2 / 8


def test_layer_working_beside_logits_counts_only_the_larger_on_the_head_rank():
    import numpy as np

    from planner.cost.activations import layer_working_beside_logits

    out = layer_working_beside_logits(10.0, np.array([4.0, 4.0, 30.0]), np.array([0, 1, 1]))
    assert out.tolist() == [10.0, 6.0, 0.0]


def test_dots_keeps_the_projections_outputs_the_backward_reads():
    """``dots`` (JAX's checkpoint_dots_with_no_batch_dims, MaxText's remat_policy=minimal) on
    Llama 3 405B's layer (s b h units, 16-bit): the layer input 2, Q 2, K/V 2·(1024/16384)·2,
    the output projection's output 2, SwiGLU's gate and up 2·(53248/16384)·2 = 19.25 sbh;
    norms, the activation, the attention core and its statistics are recomputed."""
    model = load_model("llama3-405b")
    s, h = 8192, 16384
    shapes = {p: ActivationShape(seq_len=s, micro_batch_size=1, recompute=p)
              for p in ("dots", "full", "selective")}  # fmt: skip
    tensors = layer_activation_tensors(model, shapes["dots"])
    assert sum(tensors.values()) / (s * h) == pytest.approx(2 + 2 + 0.25 + 2 + 13)
    assert "attention.softmax_lse" not in tensors and "attention.qkv_input" not in tensors
    # Between full recomputation (the input alone) and selective (everything but scores).
    full = activation_bytes_per_layer(model, shapes["full"])
    assert full < sum(tensors.values()) < activation_bytes_per_layer(model, shapes["selective"])


@given(t=st.sampled_from([1, 2, 4, 8]), b=st.integers(1, 4))
def test_dots_shrinks_with_sequence_parallelism_like_every_other_tensor(t, b):
    model = load_model("llama3-8b")
    whole = ActivationShape(seq_len=4096, micro_batch_size=b, recompute="dots")
    split = whole.model_copy(update={"tp": t, "sequence_parallel": True})
    assert activation_bytes_per_layer(model, split) * t == pytest.approx(
        activation_bytes_per_layer(model, whole)
    )


def test_dots_reruns_the_attention_core_and_the_element_wise_operations():
    """What ``dots`` does not keep is rerun before the backward: the attention core and the
    norms, residuals, rotary and the MLP activation; no projection."""
    from hwspecs.catalog import load_accelerator
    from planner.cost.compute import GpuRates
    from planner.cost.stage_times import shape_times

    rates = GpuRates.of(load_accelerator("h100-sxm"), "bf16")
    dense = shape_times(load_model("llama3-8b"), 4096, 1, 1, 1, 1, False, True, rates, 2.0).dense
    ops = {op.name: op.forward_s for op in dense.ops}
    rerun = ops["attention.core"] + sum(v for k, v in ops.items() if k.startswith("elementwise."))
    assert dense.recompute_s("dots") == pytest.approx(rerun)
    assert dense.recompute_s("selective") < dense.recompute_s("dots") < dense.recompute_s("full")

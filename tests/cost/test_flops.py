"""FLOP counts against the closed forms of PaLM (Appendix B) and Megatron (Eq. 7)."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from planner.cost import flops
from planner.spec.model import ModelSpec, load_model

DENSE = ["llama3-8b", "llama3-70b", "llama3-405b", "gpt3-175b"]


@pytest.mark.parametrize("name", DENSE)
@pytest.mark.parametrize("seq_len", [2048, 8192, 131072])
def test_detailed_count_agrees_with_6n_plus_attention(name, seq_len):
    model = load_model(name)
    detailed = flops.model_flops_per_token(model, seq_len, causal=False)
    assert detailed == pytest.approx(flops.six_n_flops_per_token(model, seq_len), rel=0.01)


def gpt_without_biases(**shape) -> ModelSpec:
    return ModelSpec(
        name="gpt", mlp_kind="gelu", norm_kind="layernorm", tied_embeddings=True, **shape
    )


@pytest.mark.parametrize(
    ("layers", "hidden", "heads", "vocab", "seq_len"),
    [(96, 12288, 96, 51200, 2048), (24, 2048, 16, 50257, 1024), (128, 25600, 160, 51200, 2048)],
)
def test_megatron_eq7_exactly_for_gpt_layers(layers, hidden, heads, vocab, seq_len):
    model = gpt_without_biases(
        num_layers=layers,
        hidden_size=hidden,
        ffn_hidden_size=4 * hidden,
        num_attention_heads=heads,
        vocab_size=vocab,
    )
    batch = 8
    detailed = flops.model_flops_per_token(model, seq_len, causal=False) * seq_len * batch
    assert detailed == pytest.approx(
        flops.megatron_flops_per_iteration(model, seq_len, batch), rel=1e-12
    )


def test_backward_is_twice_forward_and_w_equals_forward_for_gemms():
    model = load_model("llama3-8b")
    for op in flops.model_ops_per_sequence(model, 4096):
        if op.name.startswith("attention.s") or op.name == "attention.context":
            assert op.weight_grad == 0 and op.input_grad == 2 * op.forward
        else:
            assert op.input_grad == op.forward == op.weight_grad


def test_causal_halves_the_attention_products():
    model = load_model("llama3-8b")
    full = flops.model_flops_per_token(model, 8192, causal=False)
    causal = flops.model_flops_per_token(model, 8192, causal=True)
    attention = 12 * model.num_layers * model.hidden_size * 8192
    assert full - causal == pytest.approx(attention / 2, rel=1e-12)


def test_full_recompute_adds_one_forward_of_the_layers():
    model = load_model("llama3-70b")
    ops = flops.model_ops_per_sequence(model, 4096)
    layer_forward = sum(op.forward for op in ops if op.name != "lm_head") / 4096
    assert flops.recompute_flops_per_token(model, 4096, "full") == pytest.approx(layer_forward)
    assert flops.recompute_flops_per_token(model, 4096, "none") == 0


def test_moe_counts_only_active_experts():
    model = load_model("mixtral-8x7b")
    per_token = flops.model_flops_per_token(model, 4096, causal=False)
    six_n_active = 6 * model.num_matmul_params(active=True) + 12 * 32 * 4096 * 4096
    assert per_token == pytest.approx(six_n_active, rel=0.01)


def test_deepseek_v3_flops_follow_active_parameters():
    model = load_model("deepseek-v3")
    per_token = flops.model_flops_per_token(model, 4096, causal=False)
    linear = 6 * model.num_matmul_params(active=True)
    # MLA attention: score and context products with 192/128-dim heads over 128 heads.
    attention = 3 * model.num_layers * 2 * 4096 * 128 * (192 + 128)
    assert per_token == pytest.approx(linear + attention, rel=0.01)


@given(
    layers=st.integers(1, 8),
    heads=st.sampled_from([4, 8, 16]),
    seq=st.sampled_from([128, 1024]),
)
def test_flops_scale_linearly_with_layers_apart_from_the_head(layers, heads, seq):
    hidden = 64 * heads
    model = ModelSpec(
        name="m",
        num_layers=layers,
        hidden_size=hidden,
        ffn_hidden_size=3 * hidden,
        num_attention_heads=heads,
        vocab_size=1000,
    )
    one = model.model_copy(update={"num_layers": 1})
    head = flops.lm_head_op(model, seq).total / seq
    per_layer = flops.model_flops_per_token(one, seq) - head
    assert flops.model_flops_per_token(model, seq) == pytest.approx(head + layers * per_layer)


def test_mfu_palm_definition():
    # 400 TFLOP/s of model FLOPs on a 989.4 TFLOP/s peak is 40.4 %.
    assert flops.mfu(1000.0, 400e9, 989.4e12) == pytest.approx(0.4043, abs=1e-4)


@pytest.mark.parametrize(("window", "seq_len"), [(128, 4096), (4096, 32768), (1024, 1536)])
def test_a_sliding_window_keeps_the_pairs_inside_it(window, seq_len):
    """Query i sees min(i + 1, w) keys: summed over the sequence, against the causal count,
    the closed form 2w/s − (w/s)² (continuous, as the causal s²/2 is)."""
    pairs = sum(min(i + 1, window) for i in range(seq_len))
    causal = seq_len * (seq_len + 1) / 2
    assert flops.windowed_pair_fraction(window, seq_len) == pytest.approx(pairs / causal, rel=2e-3)
    assert flops.windowed_pair_fraction(seq_len, seq_len) == 1.0
    assert flops.windowed_pair_fraction(2 * seq_len, seq_len) == 1.0


def test_sliding_window_layers_compute_their_windows_share_of_the_scores():
    """Half the layers windowed at 128 keys: the attention products are the full layers' half
    plus the windowed layers' share; the other operations do not change."""
    full = load_model("llama3-8b")
    local = full.model_copy(update={"sliding_window": 128, "num_sliding_window_layers": 16})
    share = flops.windowed_pair_fraction(128, 8192)
    for causal in (True, False):
        ops = {op.name: op.total for op in flops.model_ops_per_sequence(local, 8192, causal)}
        ref = {op.name: op.total for op in flops.model_ops_per_sequence(full, 8192, causal)}
        for name, total in ops.items():
            factor = (
                (1 + share) / 2
                if name.startswith("attention.s") or name == "attention.context"
                else 1
            )
            assert total == pytest.approx(ref[name] * factor)
    with pytest.raises(ValueError, match="together"):
        ModelSpec(**{**full.model_dump(), "sliding_window": 128})

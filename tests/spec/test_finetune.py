"""Fine-tuning recipes against the QLoRA paper and PEFT's counts; frozen weights; the CLI."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hwspecs.errors import PlanError
from planner.cost.adapter_flops import dequantization_passes, finetune_ops_per_sequence
from planner.cost.adapters import model_state_bytes
from planner.cost.flops import model_ops_per_sequence
from planner.cost.memory import MEMORY_PARTS
from planner.memory_report import memory_report
from planner.spec.finetune import (
    FinetuneSpec,
    layer_adapter_params,
    nf4_bits_per_param,
    num_adapter_params,
    num_quantized_params,
    quantization_constant_bits_per_param,
    targeted_linears,
    vera_projection_params,
)
from planner.spec.job import Job
from planner.spec.layout import Layout
from planner.spec.model import ModelSpec, load_model
from planner.spec.precision import PrecisionSpec
from planner.structure.linears import layer_kinds_count, layer_linears
from tests.cli_runner import run, run_json

#: Llama-2-7B (HF meta-llama/Llama-2-7b-hf config.json): 32 layers, hidden 4096, MHA.
LLAMA2_7B = ModelSpec(
    name="llama2-7b",
    num_layers=32,
    hidden_size=4096,
    ffn_hidden_size=11008,
    num_attention_heads=32,
    vocab_size=32000,
)
LLAMA3_8B = load_model("llama3-8b")


def lora(**fields) -> FinetuneSpec:
    return FinetuneSpec(**{"recipe": "lora", **fields})


# ----- NF4 (QLoRA §3) ---------------------------------------------------------------------


def test_nf4_constants_without_double_quantization_are_half_a_bit():
    spec = FinetuneSpec(recipe="qlora", double_quant=False)
    assert quantization_constant_bits_per_param(spec) == 32 / 64 == 0.5
    assert nf4_bits_per_param(spec) == 4.5


def test_nf4_double_quantization_brings_constants_to_0_127_bit():
    spec = FinetuneSpec(recipe="qlora")
    assert quantization_constant_bits_per_param(spec) == pytest.approx(0.127, abs=5e-4)
    assert quantization_constant_bits_per_param(spec) == 8 / 64 + 32 / (64 * 256)
    assert nf4_bits_per_param(spec) == pytest.approx(4.127, abs=5e-4)


def test_qlora_stores_every_block_linear_in_nf4_and_the_rest_in_16_bits():
    model = load_model("llama3-70b")
    spec = FinetuneSpec(recipe="qlora", lora_rank=64)
    parts = model_state_bytes(model, spec, PrecisionSpec())
    quantized = num_quantized_params(model, spec)
    assert quantized == model.num_layers * sum(
        lin.num_weights for lin in layer_linears(model, False)
    )
    assert parts.base_weights == pytest.approx(
        quantized * 0.5 + (model.num_params() - quantized) * 2
    )
    assert parts.quantization_constants == pytest.approx(quantized * (8 / 64 + 32 / 16384) / 8)


# ----- adapter parameter counts -----------------------------------------------------------


def test_lora_r8_on_q_and_v_of_llama2_7b_is_what_peft_prints():
    # Each of q_proj and v_proj is 4096 → 4096: A is 8 × 4096, B is 4096 × 8.
    per_module = 8 * 4096 + 4096 * 8
    derived = LLAMA2_7B.num_layers * 2 * per_module
    counted = num_adapter_params(LLAMA2_7B, lora(lora_rank=8, lora_targets="q_proj,v_proj"))
    assert counted == derived == 4_194_304  # PEFT: "trainable params: 4,194,304"


def test_gqa_shrinks_k_and_v_adapters():
    spec = lora(lora_rank=8, lora_targets="k_proj")
    assert num_adapter_params(LLAMA3_8B, spec) == 32 * 8 * (4096 + 1024)


def test_dora_adds_one_magnitude_per_targeted_output_channel():
    for targets in ("q_proj,v_proj", "all", "mlp"):
        plain = num_adapter_params(LLAMA3_8B, lora(lora_targets=targets))
        dora = num_adapter_params(LLAMA3_8B, FinetuneSpec(recipe="dora", lora_targets=targets))
        outputs = sum(
            layers * lin.out_features * lin.count
            for moe, layers in layer_kinds_count(LLAMA3_8B).items()
            for lin in targeted_linears(LLAMA3_8B, lora(lora_targets=targets), moe)
        )
        assert dora - plain == outputs


def test_vera_trains_d_and_b_and_shares_frozen_projections():
    spec = FinetuneSpec(recipe="vera", lora_rank=256)
    linears = targeted_linears(LLAMA2_7B, spec, False)
    assert num_adapter_params(LLAMA2_7B, spec) == 32 * sum(
        256 + lin.out_features for lin in linears
    )
    widest = max(lin.in_features for lin in linears) + max(lin.out_features for lin in linears)
    assert vera_projection_params(LLAMA2_7B, spec) == 256 * widest


def test_moe_mlp_targets_every_expert_but_not_the_router():
    model = load_model("mixtral-8x7b")
    spec = lora(lora_targets="mlp")
    _, routed = layer_adapter_params(model, spec, moe_layer=True)
    h, f, experts = model.hidden_size, model.moe_ffn_hidden_size, model.num_routed_experts
    assert routed == experts * 3 * 8 * (h + f)
    assert all(lin.name != "router" for lin in targeted_linears(model, spec, True))


def test_linear_modules_plus_norms_are_the_layer():
    for name in ("llama3-8b", "llama3-70b", "mixtral-8x7b"):
        model = load_model(name)
        for moe, _ in layer_kinds_count(model).items():
            weights = sum(lin.num_weights for lin in layer_linears(model, moe))
            assert weights + 2 * model.norm_params() == model.layer_params(moe)


@given(rank=st.integers(1, 512), recipe=st.sampled_from(["lora", "qlora", "dora", "vera"]))
def test_adapter_params_grow_linearly_in_rank(rank, recipe):
    def count(r):
        return num_adapter_params(LLAMA3_8B, FinetuneSpec(recipe=recipe, lora_rank=r))

    slope = count(2) - count(1)
    assert count(rank) == count(1) + (rank - 1) * slope


def test_unknown_module_for_the_model_is_an_error():
    gpt3 = load_model("gpt3-175b")  # GELU MLP: up_proj and down_proj, no gate_proj
    with pytest.raises(PlanError, match="'gate_proj' matches no module"):
        model_state_bytes(gpt3, lora(lora_targets="gate_proj"), PrecisionSpec())


def test_qlora_base_is_nf4_only():
    with pytest.raises(ValueError, match="nf4"):
        FinetuneSpec(recipe="qlora", base_dtype="bf16")
    with pytest.raises(ValueError, match="qlora"):
        FinetuneSpec(recipe="lora", base_dtype="nf4")


# ----- FLOPs: frozen weights have no weight gradient --------------------------------------


def test_frozen_base_keeps_input_gradients_and_drops_weight_gradients():
    base = {op.name: op for op in model_ops_per_sequence(LLAMA3_8B, 4096)}
    tuned = finetune_ops_per_sequence(LLAMA3_8B, lora(lora_rank=16), 4096)
    for op in tuned:
        if op.name in base:
            assert op.weight_grad == 0
            assert op.input_grad == base[op.name].input_grad
            assert op.forward == base[op.name].forward
        else:
            assert op.weight_grad == op.forward > 0  # adapters train: W = F


def test_adapter_flops_are_2_tokens_r_in_plus_out_per_module():
    spec = lora(lora_rank=8, lora_targets="q_proj")
    ops = finetune_ops_per_sequence(LLAMA2_7B, spec, 2048)
    adapters = [op for op in ops if op.name.startswith("lora.")]
    assert math.fsum(op.forward for op in adapters) == 32 * 2 * 2048 * 8 * (4096 + 4096)


def test_vera_projections_are_frozen_too():
    ops = finetune_ops_per_sequence(LLAMA2_7B, FinetuneSpec(recipe="vera"), 1024)
    assert all(op.weight_grad == 0 for op in ops)


def test_full_recipe_is_full_training():
    assert finetune_ops_per_sequence(LLAMA3_8B, FinetuneSpec(), 4096) == model_ops_per_sequence(
        LLAMA3_8B, 4096
    )


def test_qlora_dequantizes_three_times_under_full_recompute():
    assert dequantization_passes("full") == 3 and dequantization_passes("none") == 2


# ----- memory -----------------------------------------------------------------------------


def test_full_recipe_memory_is_todays_memory():
    layout = Layout(tp=2, pp=2, dp=4, zero_stage=1)
    today = memory_report(Job(model=LLAMA3_8B, seq_len=4096), layout)
    full = memory_report(Job(model=LLAMA3_8B, seq_len=4096, finetune=FinetuneSpec()), layout)
    assert full == today and full.recipe_breakdown_bytes is None


def test_lora_has_gradients_and_states_only_for_adapters():
    spec = lora(lora_rank=16)
    report = memory_report(Job(model=LLAMA3_8B, seq_len=2048, finetune=spec), Layout(zero_stage=0))
    adapters = num_adapter_params(LLAMA3_8B, spec)
    parts = report.recipe_breakdown_bytes
    assert parts["adapter_gradients"] == pytest.approx(adapters * 4)  # FP32 adapters (PEFT)
    assert parts["adapter_optimizer_states"] == pytest.approx(adapters * 8)  # AdamW m and v
    assert report.breakdown_bytes["gradients"] == parts["adapter_gradients"]
    assert parts["base_weights"] == pytest.approx(LLAMA3_8B.num_params() * 2)


@pytest.mark.parametrize("position", ["pre", "post"])
def test_adapter_dropout_keeps_what_its_backward_reads(position):
    """Dropout on the adapter's input (PEFT's ``lora_B(lora_A(dropout(x)))``) keeps the
    dropped copy A's weight gradient reads and its mask, both input-wide; on the adapter's
    output (NeMo AutoModel's default) only the mask, output-wide: ``down_proj`` of Llama 3 8B
    reads 14,336 features and writes 4,096."""
    from planner.cost.activations import ActivationShape
    from planner.cost.adapters import adapter_activation_tensors

    shape = ActivationShape(seq_len=4096, micro_batch_size=2, tp=1, element_bytes=2)
    spec = lora(lora_rank=16, lora_targets="down_proj", lora_dropout=0.1,
                lora_dropout_position=position)  # fmt: skip
    kept = adapter_activation_tensors(LLAMA3_8B, spec, shape, moe_layer=False)
    tokens = 4096 * 2
    dropout = {k.rsplit(".", 1)[-1]: v for k, v in kept.items() if ".dropout_" in k}
    if position == "pre":
        assert dropout == {"dropout_output": tokens * 14336 * 2, "dropout_mask": tokens * 14336}
    else:
        assert dropout == {"dropout_mask": tokens * 4096}


def test_recipe_breakdown_sums_to_total():
    spec = FinetuneSpec(recipe="dora", lora_rank=16, lora_dropout=0.1)
    for layout in (Layout(zero_stage=3, dp=4), Layout(pp=4, tp=2, recompute="selective")):
        report = memory_report(Job(model=LLAMA3_8B, seq_len=2048, finetune=spec), layout)
        assert math.fsum(report.recipe_breakdown_bytes.values()) == pytest.approx(
            report.total_bytes
        )
        assert math.fsum(report.breakdown_bytes[p] for p in MEMORY_PARTS) == pytest.approx(
            report.total_bytes
        )


def test_qlora_70b_states_under_lora_70b_states():
    job = {"model": load_model("llama3-70b"), "seq_len": 1024}
    layout = Layout(zero_stage=0, recompute="full")
    qlora = memory_report(Job(**job, finetune=FinetuneSpec(recipe="qlora", lora_rank=64)), layout)
    plain = memory_report(Job(**job, finetune=lora(lora_rank=64)), layout)
    assert qlora.breakdown_bytes["weights"] < 0.3 * plain.breakdown_bytes["weights"]


def test_job_rejects_targets_the_model_lacks():
    with pytest.raises(ValueError, match="matches no module"):
        Job(model=load_model("gpt3-175b"), seq_len=2048, finetune=lora(lora_targets="gate_proj"))


# ----- CLI --------------------------------------------------------------------------------


def test_bytes_per_param_qlora_json_shape(capsys):
    result = run_json(
        capsys, "bytes-per-param", "--recipe", "qlora", "--lora-rank", "64", "--model", "llama3-70b"
    )
    assert set(result["breakdown"]) == {
        "weights",
        "gradients",
        "master_weights",
        "optimizer_states",
    }
    assert set(result["recipe_breakdown"]) == {
        "base_weights",
        "quantization_constants",
        "adapter_weights",
        "adapter_gradients",
        "adapter_master_weights",
        "adapter_optimizer_states",
    }
    assert sum(result["recipe_breakdown"].values()) == pytest.approx(result["bytes_per_param"])
    assert result["total_bytes"] == pytest.approx(result["bytes_per_param"] * result["num_params"])
    assert 0.5 < result["bytes_per_param"] < 1.0  # NF4 ≈ 0.52 B plus small adapters
    assert result["recipe"] == "qlora"


def test_bytes_per_param_lora_q_v_counts_trainable(capsys):
    result = run_json(
        capsys,
        "bytes-per-param",
        "--recipe",
        "lora",
        "--lora-targets",
        "q_proj,v_proj",
        "--model",
        "llama3-8b",
    )
    assert result["num_trainable_params"] == 32 * 8 * ((4096 + 4096) + (4096 + 1024))


def test_memory_qlora_json_shape_and_default_recompute(capsys):
    result = run_json(
        capsys,
        "memory",
        "--model",
        "llama3-70b",
        "--recipe",
        "qlora",
        "--lora-rank",
        "64",
        "--seq-len",
        "1024",
        "--accelerator",
        "h100-sxm",
    )
    assert set(result["breakdown_bytes"]) == set(MEMORY_PARTS)
    assert result["recipe"] == "qlora" and result["layout"]["recompute"] == "full"
    assert result["recipe_breakdown_bytes"]["quantization_constants"] > 0
    assert result["fits"] is True


def test_memory_with_dropout_after_the_adapter_keeps_less(capsys):
    """``--lora-dropout-position post`` keeps only masks: fewer activation bytes than the
    default, which also keeps each adapter's dropped input."""
    argv = ["memory", "--model", "llama3-8b", "--recipe", "lora", "--lora-dropout", "0.1",
            "--seq-len", "4096", "--accelerator", "h100-sxm", "--recompute", "none"]  # fmt: skip
    before = run_json(capsys, *argv)["breakdown_bytes"]["activations"]
    after = run_json(capsys, *argv, "--lora-dropout-position", "post")
    assert after["breakdown_bytes"]["activations"] < before


@pytest.mark.parametrize(
    ("argv", "fragments"),
    [
        (["bytes-per-param", "--recipe", "lorax"], ["--recipe", "lora"]),
        (["bytes-per-param", "--recipe", "lora", "--lora-rank", "0"], ["--lora-rank"]),
        (["bytes-per-param", "--recipe", "lora"], ["needs --model"]),
        (["bytes-per-param", "--lora-rank", "8"], ["adapter recipe"]),
        (["memory", "--model", "llama3-8b", "--lora-dropout-position", "mid"], ["pre", "post"]),
        (["memory", "--model", "llama3-8b", "--lora-dropout-position", "post"], ["adapter recipe"]),
        (["memory", "--model", "llama3-8b", "--recipe", "dora", "--lora-targets", "qq"], ["qq"]),
        (
            ["memory", "--model", "gpt3-175b", "--recipe", "lora", "--lora-targets", "gate_proj"],
            ["gate_proj", "matches no module"],
        ),
    ],
)
def test_bad_recipe_input_is_one_line_exit_2(capsys, argv, fragments):
    code, _, err = run(capsys, *argv)
    assert code == 2
    assert err.startswith("error: ") and err.count("\n") == 1, err
    for fragment in fragments:
        assert fragment in err

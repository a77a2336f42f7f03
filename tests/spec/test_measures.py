"""DeepSeek-V3's activation-memory measures (planner.spec.measures; arXiv 2412.19437 §3.2.3, §3.3.3)."""

from __future__ import annotations

import pytest

from hwspecs.errors import PlanError
from planner import api
from planner.cost.activations import ActivationShape, layer_activation_tensors
from planner.spec.measures import MEASURE_SETS, MemoryMeasures, memory_measures
from planner.spec.model import load_model

DEEPSEEK = load_model("deepseek-v3")
ALL = MEASURE_SETS["deepseek-v3"]
S, H = 4096, 7168


def tensors(measures: MemoryMeasures, moe_layer: bool = True) -> dict[str, float]:
    shape = ActivationShape(seq_len=S, micro_batch_size=1, measures=measures)
    return layer_activation_tensors(DEEPSEEK, shape, moe_layer)


def test_recomputed_norms_and_up_projections_keep_only_the_mla_latents():
    kept = tensors(MemoryMeasures(recompute_norms_and_mla_up_proj=True))
    for gone in ("attention.qkv_input", "mlp.up_input", "attention.query", "attention.key_value"):
        assert gone not in kept
    assert kept["attention.latents"] == S * (1536 + 512 + 64) * 2  # BF16 down-projections


def test_fp8_caches_the_expert_input_in_one_byte_and_the_attention_output_in_e5m6():
    base, fp8 = tensors(MemoryMeasures()), tensors(MemoryMeasures(fp8_linear_inputs=True))
    assert fp8["moe.expert_input"] == S * 8 * H * 1
    assert fp8["attention.out_proj_input"] == S * 128 * 128 * 1.5
    assert fp8["moe.expert_output"] == base["moe.expert_output"]  # not a Linear input


def test_cached_swiglu_input_is_two_fp8_widths_and_no_expert_output():
    kept = tensors(MemoryMeasures(swiglu_input_cached=True))
    assert kept["moe.expert_intermediate"] == S * 8 * 2 * 2048 * 1
    assert kept["moe.shared_intermediate"] == S * 2 * 2048 * 1
    assert "moe.expert_output" not in kept
    dense = tensors(MemoryMeasures(swiglu_input_cached=True), moe_layer=False)
    assert dense == tensors(MemoryMeasures(), moe_layer=False)  # §3.3.3 names the MoE's SwiGLU


def test_all_measures_more_than_halve_a_moe_layer():
    assert sum(tensors(ALL).values()) < 0.5 * sum(tensors(MemoryMeasures()).values())


def test_fp8_caches_need_fp8_gemms():
    assert ALL.for_gemm_dtype("bf16") == MemoryMeasures(recompute_norms_and_mla_up_proj=True)
    assert ALL.for_gemm_dtype("fp8") == ALL


def test_deepseek_v3_jobs_take_its_published_recipe_unless_told_otherwise():
    job = api.build_job("deepseek-v3", 4096, global_batch_size=15360)
    assert job.precision.recipe == "fp8-mixed" and job.memory_measures == ALL
    plain = api.build_job(
        "deepseek-v3", 4096, 15360 * 4096, None, "bf16-mixed", memory_measures="none"
    )
    assert plain.precision.recipe == "bf16-mixed" and not plain.memory_measures.any
    llama = api.build_job("llama3-8b", 8192, global_batch_size=8)
    assert llama.precision.recipe == "bf16-mixed" and not llama.memory_measures.any


def test_unknown_measure_set_is_a_one_line_error():
    with pytest.raises(PlanError, match="memory_measures must be one of"):
        memory_measures("deepseek")


def test_published_layout_fits_in_80_gb_with_the_measures_and_not_without():
    layout = api.build_layout(tp=1, pp=16, ep=64, dp=128, schedule="dualpipe", zero_stage=1)
    job = api.build_job("deepseek-v3", 4096, global_batch_size=15360)
    bare = api.build_job("deepseek-v3", 4096, global_batch_size=15360, memory_measures="none")
    assert api.estimate(job, layout, "dgx-h800", 2048).fits
    assert not api.estimate(bare, layout, "dgx-h800", 2048).fits


def test_measures_rerun_the_up_projections_norms_and_swiglu_in_the_backward():
    from hwspecs.catalog import load_accelerator
    from planner.cost.compute import GpuRates
    from planner.cost.stage_times import shape_times

    rates = GpuRates.of(load_accelerator("h800-sxm"), "fp8")
    args = (DEEPSEEK, S, 1, 1, 1, 64, False, True, rates, 2.0)
    plain = shape_times(*args)
    measured = shape_times(*args, measures=ALL)
    ops = {op.name: op for op in plain.moe.ops}
    up = ops["attention.q_up_proj"].forward_s + ops["attention.kv_up_proj"].forward_s
    assert plain.moe.recompute_s("none") == 0
    assert measured.moe.recompute_s("none") > up + ops["elementwise.mlp_activation"].forward_s
    assert measured.moe.recompute_s("full") == plain.moe.recompute_s("full")


def test_fp8_recipe_keeps_attention_router_and_head_at_the_bf16_rate():
    """§3.3: attention operators, MoE gating and the output head stay in BF16."""
    from hwspecs.catalog import load_accelerator
    from planner.cost.compute import GpuRates
    from planner.cost.stage_times import shape_times

    accelerator = load_accelerator("h800-sxm")
    fp8, bf16 = GpuRates.of(accelerator, "fp8"), GpuRates.of(accelerator, "bf16")
    args = (DEEPSEEK, S, 1, 1, 1, 64, False, True)
    mixed = shape_times(*args, fp8, 2.0, bf16_rates=bf16)
    all_bf16, all_fp8 = shape_times(*args, bf16, 2.0), shape_times(*args, fp8, 2.0)
    for name in ("attention.core", "moe.router", "moe.routed_experts"):
        kept = name != "moe.routed_experts"
        reference = all_bf16 if kept else all_fp8
        op = next(op for op in mixed.moe.ops if op.name == name)
        assert op == next(op for op in reference.moe.ops if op.name == name)
    assert mixed.head[0] == all_bf16.head[0]  # lm_head


TE = MEASURE_SETS["te-fp8"]


def test_transformer_engine_keeps_its_fp8_linear_inputs_in_one_byte():
    """TE's Linear keeps the column-wise FP8 copy of its input for the weight gradient: the
    norm outputs feeding QKV and the MLP, the routed tokens and the activation's output go
    to one byte; the activation's own inputs stay BF16; the attention output gains an FP8
    copy beside the BF16 one the fused attention keeps; what no Linear reads is unchanged."""
    llama = load_model("llama3-8b")
    shape = ActivationShape(seq_len=S, micro_batch_size=1)
    base = layer_activation_tensors(llama, shape, False)
    te = layer_activation_tensors(llama, shape.model_copy(update={"measures": TE}), False)
    for halved in ("attention.qkv_input", "mlp.up_input"):
        assert te[halved] == base[halved] / 2
    assert te["attention.out_proj_input"] == base["attention.out_proj_input"] * 1.5
    assert te["mlp.intermediate"] == S * 14336 * (2 * 2 + 1)  # gate, up BF16; product FP8
    for kept in ("attention.norm_input", "mlp.norm_input", "attention.query"):
        assert te[kept] == base[kept]
    routed = tensors(TE)
    assert routed["moe.expert_input"] == S * 8 * H * 1
    assert routed["moe.expert_intermediate"] == S * 8 * 2048 * (2 * 2 + 1)
    assert routed["moe.expert_output"] == tensors(MemoryMeasures())["moe.expert_output"]
    assert TE.for_gemm_dtype("bf16") == MemoryMeasures() and TE.for_gemm_dtype("fp8") == TE


def test_deepseek_v3s_own_fp8_caches_take_precedence_over_te_s():
    both = ALL.model_copy(update={"te_fp8_linear_inputs": True})
    assert tensors(both) == tensors(ALL)


def test_a_megatron_stack_caches_fp8_inputs_and_others_do_not():
    from planner.api.inputs import with_profile
    from planner.spec.stack import stack_memory_measures

    job = api.build_job("llama3-8b", 8192, global_batch_size=8, precision="fp8-mixed")
    megatron = with_profile(job, "h100-sxm", "none", "megatron")
    assert megatron.active_memory_measures == TE.model_copy(**PROBS)
    for stack in (None, "pytorch-fsdp", "jax", "deepspeed"):
        assert not with_profile(job, "h100-sxm", "none", stack).memory_measures.any
    assert stack_memory_measures("megatron", ALL) == ALL.model_copy(
        update={"te_fp8_linear_inputs": True, **PROBS["update"]}
    )
    bf16 = api.build_job("llama3-8b", 8192, global_batch_size=8)
    measures = with_profile(bf16, "h100-sxm", "none", "megatron").active_memory_measures
    assert measures == MemoryMeasures().model_copy(**PROBS)  # FP8's caches need FP8 GEMMs


PROBS = {"update": {"probs_in_expert_activation": True}}


def test_megatron_core_scales_the_experts_activation_and_keeps_no_expert_output():
    """Megatron-Core 0.13 on multiplies the routing probabilities into the experts'
    activation (``activation_func_with_probs``) instead of their outputs at the combine, so
    the k·h outputs per token are not kept for the probabilities' gradient; nothing else
    changes, dense layers not at all, and it holds under any GEMM dtype."""
    base, probs = tensors(MemoryMeasures()), tensors(MemoryMeasures().model_copy(**PROBS))
    assert base["moe.expert_output"] == S * 8 * H * 2
    assert probs == {name: v for name, v in base.items() if name != "moe.expert_output"}
    dense = tensors(MemoryMeasures().model_copy(**PROBS), moe_layer=False)
    assert dense == tensors(MemoryMeasures(), moe_layer=False)
    assert MemoryMeasures().model_copy(**PROBS).for_gemm_dtype("bf16").probs_in_expert_activation


def test_memory_explain_names_the_measures_in_use(capsys):
    import cli

    args = ["memory", "--model", "llama3-70b", "--precision", "fp8-mixed", "--tp", "8",
            "--pp", "4", "--dp", "4", "--explain", "--memory-measures"]  # fmt: skip
    for name in ("te-fp8", "none"):
        assert cli.main([*args, name]) == 0
        text = " ".join(capsys.readouterr().out.split())
        assert f"memory measures {name}" in text

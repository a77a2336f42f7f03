"""LoRA runs: the adapters a published LoRA row trained are read from its release's recipe
(``supplements.json``), the row is timed as that fine-tuning job, and a row whose recipe is
not readable stays uncovered, by name."""

from __future__ import annotations

import pytest

from hwspecs.catalog import load_runs
from planner.runs.check import predict_row
from planner.runs.finetune import run_finetune
from planner.runs.rows import model_spec, run_job
from planner.runs.uncovered import Uncovered

#: Megatron-Bridge 26.06's Llama 3 70B LoRA recipes (llama3_70b_peft_config: dim 16, alpha
#: 32; the performance configs override the targets to linear_qkv) and NeMo 24.07's PEFT
#: config (adapter_dim 32 on attention_qkv).
READ_FROM_RECIPES = {
    "mbridge-26.06-gb200-llama3-70b-lora-fp8-8g-main": 16,
    "mbridge-26.06-gb300-llama3-70b-lora-mxfp8-8g-main": 16,
    "mbridge-26.06-h100-llama3-70b-lora-fp8-8g-main": 16,
    "nemo2407-h100-llama2-70b-lora-8g": 32,
    "nemo2407-h100-llama2-7b-lora-8g": 32,
}


def _row(run_id: str):
    return next(row for row in load_runs("train") if row.id == run_id)


@pytest.mark.parametrize("run_id, rank", READ_FROM_RECIPES.items())
def test_a_lora_row_trains_the_adapters_its_recipe_names(run_id, rank):
    row = _row(run_id)
    assert {s.field for s in row.supplements} >= {
        "training.lora_rank",
        "training.lora_targets",
        "training.lora_dropout",
    }
    spec = run_job(row, model_spec(row)).finetune
    assert spec is not None and spec.recipe == "lora"
    assert spec.lora_rank == rank
    # the fused QKV projection (Megatron-Core's linear_qkv, NeMo's attention_qkv)
    assert set(spec.lora_targets) == {"q_proj", "k_proj", "v_proj"}
    assert spec.lora_dropout == 0.0
    # Megatron-Core keeps adapters as model parameters: 16-bit, FP32 main copies
    assert (spec.adapter_dtype, spec.adapter_master_dtype) == ("bf16", "fp32")


#: NeMo AutoModel's LoRA benchmark configs at the table's commit (NVIDIA-NeMo/Automodel
#: @36044ad ``examples/llm_benchmark``: ``dim: 16`` on ``'*_proj'``; dropout 0.1 in the Llama
#: 3.1 8B one, 0.0 set or by ``PeftConfig``'s default elsewhere).
AUTOMODEL_ROWS = {
    "automodel-h100-llama3-8b-lora-1g": 0.1,
    "automodel-h100-qwen2-5-7b-lora-1g": 0.0,
    "automodel-h100-llama3-70b-lora-8g": 0.0,
    "automodel-h100-qwen2-5-32b-2-node-lora-16g": 0.0,
}


@pytest.mark.parametrize("run_id, dropout", AUTOMODEL_ROWS.items())
def test_automodel_lora_rows_train_every_projection_with_dropout_after_the_adapter(run_id, dropout):
    spec = run_finetune(_row(run_id))
    assert spec.lora_rank == 16 and spec.lora_dropout == dropout
    projections = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    assert set(spec.lora_targets) == projections
    assert spec.lora_dropout_position == "post"  # PeftConfig's default there
    assert spec.adapter_master_dtype == "none"  # adapters as PEFT keeps them, not Megatron's


def test_a_lora_row_without_its_recipe_stays_uncovered():
    row = _row("automodel-h100-llama3-70b-lora-8g")
    bare = row.model_copy(update={"training": row.training.model_copy(update={"lora_rank": None})})
    with pytest.raises(Uncovered, match="LoRA rank and targets not published"):
        run_finetune(bare)


def test_a_lora_row_naming_an_unknown_module_is_uncovered_by_name():
    """A user's runs file may name its trainer's module (Megatron's fused ``linear_qkv``):
    the row is left out with the allowed names, not an error."""
    row = _row("nemo2407-h100-llama2-7b-lora-8g")
    named = row.model_copy(
        update={"training": row.training.model_copy(update={"lora_targets": "linear_qkv"})}
    )
    with pytest.raises(Uncovered, match=r"unknown target 'linear_qkv'.*q_proj"):
        run_finetune(named)


def test_pretraining_rows_have_no_adapters():
    assert run_finetune(_row("korthikanti22-175b-selective-sp")) is None


def test_lora_rows_are_predicted_as_frozen_base_jobs():
    """A LoRA row is faster than the same row fully fine-tuned (no weight gradients of the
    frozen base), with every published layout field pinned in both."""
    row = _row("nemo2407-h100-llama2-7b-lora-8g")
    full = row.model_copy(update={"training": row.training.model_copy(update={"task": "sft"})})
    lora, sft = predict_row(row), predict_row(full)
    assert lora.covered and sft.covered
    assert (lora.layout["tp"], lora.layout["pp"]) == (sft.layout["tp"], sft.layout["pp"]) == (1, 1)
    assert lora.predicted_tokens_per_s_per_gpu > 1.2 * sft.predicted_tokens_per_s_per_gpu

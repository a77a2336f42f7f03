"""The adapters a published fine-tuning row trained, read from its row (``training.lora_*``,
filled from the release's recipe where the table prints none: ``supplements.json``)."""

from __future__ import annotations

from pydantic import ValidationError

from hwspecs.runs import RunRow
from planner.runs.uncovered import Uncovered
from planner.spec.finetune import FinetuneSpec
from planner.spec.stack import framework_adapter_dtypes, framework_lora_dropout_position


def run_finetune(row: RunRow) -> FinetuneSpec | None:
    """A LoRA row's adapters: its rank, targets and dropout (``training.lora_*``, filled
    from the release's recipe where the table prints none, ``supplements.json``), in the
    dtypes its framework keeps them (:func:`planner.spec.stack.framework_adapter_dtypes`),
    dropping out where it does (:func:`planner.spec.stack.framework_lora_dropout_position`).
    None for full training; a LoRA row without rank or targets is not covered."""
    t = row.training
    if t.task != "lora":
        return None
    if t.lora_rank is None or t.lora_targets is None:
        raise Uncovered("LoRA rank and targets not published")
    try:
        return FinetuneSpec(
            recipe="lora",
            lora_rank=t.lora_rank,
            lora_targets=t.lora_targets,
            lora_dropout=t.lora_dropout or 0.0,
            lora_dropout_position=framework_lora_dropout_position(t.framework),
            **framework_adapter_dtypes(t.framework),
        )
    except ValidationError as error:  # a user's runs file naming an unknown target
        raise Uncovered(f"LoRA not expressible: {error.errors()[0]['msg']}") from None
